/*
 * test_chat_parse.c - generated text into content, reasoning and tool calls:
 * realistic outputs of every format, each parsed at once and streamed one
 * byte, two bytes, three bytes at a time and at random cut points (the
 * gathered deltas must equal the one-shot parse); how little is held back
 * while streaming; malformed outputs; UTF-8; random tag soup; format
 * detection on the real templates in shared/testdata/templates.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"
#include "core/rng.h"
#include "server/chat_parse.h"

struct call {
    const char *name, *args;
};

struct tcase {
    const char *label;
    enum sp_chat_format fmt;
    bool in_reasoning;
    const char *text;
    const char *content;   // NULL: no content at all
    const char *reasoning; // NULL: no reasoning at all
    struct call calls[4];  // up to the first NULL name
};

#define HERMES   SP_CHAT_FORMAT_HERMES
#define CODER    SP_CHAT_FORMAT_QWEN3_CODER
#define HARMONY  SP_CHAT_FORMAT_HARMONY
#define DEEPSEEK SP_CHAT_FORMAT_DEEPSEEK_V3
#define PLAIN    SP_CHAT_FORMAT_PLAIN

// One case per paragraph reads better than one field per line.
// clang-format off
static const struct tcase cases[] = {
    // ---- think + <tool_call> JSON (Qwen3, Ling 2.0, DeepSeek-style think)
    {"qwen3 thinking, then a tool call", HERMES, false,
     "<think>\nThe user wants the weather in Paris. I should call get_weather.\n</think>\n\n"
     "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"unit\": \"celsius\"}}\n</tool_call>",
     NULL, "The user wants the weather in Paris. I should call get_weather.",
     {{"get_weather", "{\"city\":\"Paris\",\"unit\":\"celsius\"}"}}},
    {"qwen3 thinking, then an answer", HERMES, false,
     "<think>\nSimple arithmetic: 2 + 2.\n\nThat is 4.\n</think>\n\n2 + 2 = **4**.\n\nAnything else?",
     "2 + 2 = **4**.\n\nAnything else?", "Simple arithmetic: 2 + 2.\n\nThat is 4.", {{0}}},
    {"qwen3 with enable_thinking false", HERMES, false, "The capital of France is Paris.",
     "The capital of France is Paris.", NULL, {{0}}},
    {"qwen3 empty think block", HERMES, false, "<think>\n\n</think>\n\nHello!", "Hello!", NULL, {{0}}},
    {"content then two tool calls with CJK and emoji", HERMES, false,
     "I'll check both cities.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n"
     "</tool_call>\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"\xe6\x9d\xb1\xe4\xba\xac\", "
     "\"note\": \"rain \xf0\x9f\x8c\xa7\xef\xb8\x8f or \\\"sun\\\"\", \"days\": [1, 2.5e1, -3], \"hourly\": false}}\n</tool_call>",
     "I'll check both cities.", NULL,
     {{"get_weather", "{\"city\":\"Paris\"}"},
      {"get_weather", "{\"city\":\"\xe6\x9d\xb1\xe4\xba\xac\",\"note\":\"rain \xf0\x9f\x8c\xa7\xef\xb8\x8f or \\\"sun\\\"\","
                      "\"days\":[1,2.5e1,-3],\"hourly\":false}"}}},
    {"ling 2.0 tool call without thinking", HERMES, false,
     "<tool_call>\n{\"name\": \"search\", \"arguments\": {\"query\": \"\xe5\x8c\x97\xe4\xba\xac \xe5\xa4\xa9\xe6\xb0\x94\", "
     "\"top_k\": 5, \"filters\": {\"lang\": [\"zh\", \"en\"], \"safe\": null}}}\n</tool_call>",
     NULL, NULL, {{"search", "{\"query\":\"\xe5\x8c\x97\xe4\xba\xac \xe5\xa4\xa9\xe6\xb0\x94\",\"top_k\":5,"
                             "\"filters\":{\"lang\":[\"zh\",\"en\"],\"safe\":null}}"}}},
    {"prompt opened <think> (qwen3.5-style), then answer", HERMES, true,
     "Let me think about primes.\n2, 3, 5, 7.\n</think>\n\nThe first four primes are 2, 3, 5 and 7.",
     "The first four primes are 2, 3, 5 and 7.", "Let me think about primes.\n2, 3, 5, 7.", {{0}}},
    {"prompt opened <think> and the model repeats it", HERMES, true, "<think>\nHmm.\n</think>\n\nYes.", "Yes.",
     "Hmm.", {{0}}},
    {"deepseek v3.1 think without newlines", HERMES, true, "Compute 6*7.</think>The answer is 42.", "The answer is 42.",
     "Compute 6*7.", {{0}}},
    {"thinking, content, then a call, then more content", HERMES, false,
     "<think>\nok\n</think>\n\nChecking now.\n\n<tool_call>\n{\"name\":\"now\",\"arguments\":{}}\n</tool_call>\nDone \xf0\x9f\x98\x80",
     "Checking now.Done \xf0\x9f\x98\x80", "ok", {{"now", "{}"}}},
    {"tags inside reasoning stay reasoning", HERMES, false,
     "<think>\nShould I emit <tool_call>? Not yet. <think> is fine too.\n</think>\n\nNo call.",
     "No call.", "Should I emit <tool_call>? Not yet. <think> is fine too.", {{0}}},
    {"<think> later in content is text", HERMES, false, "Use the <think> tag like this: <think>x</think>.",
     "Use the <think> tag like this: <think>x</think>.", NULL, {{0}}},
    {"hermes call with arguments key first", HERMES, false,
     "<tool_call>\n{\"arguments\": {\"x\": 1, \"y\": \"\xc3\xa9\"}, \"name\": \"plot\"}\n</tool_call>", NULL, NULL,
     {{"plot", "{\"x\":1,\"y\":\"\xc3\xa9\"}"}}},
    {"hermes call with string arguments and no arguments", HERMES, false,
     "<tool_call>\n{\"name\": \"a\", \"arguments\": \"{\\\"k\\\": 1}\"}\n</tool_call>\n"
     "<tool_call>\n{\"name\": \"b\"}\n</tool_call>",
     NULL, NULL, {{"a", "{\"k\": 1}"}, {"b", "{}"}}},
    {"hermes call, arguments streamed then cut off", HERMES, false,
     "Sure.\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": [1, 2", "Sure.", NULL, {{"f", "{\"a\":[1,2"}}},
    {"hermes call without the closing tag", HERMES, false,
     "<tool_call>\n{\"name\": \"f\", \"arguments\": {\"a\": 1}}\n", NULL, NULL, {{"f", "{\"a\":1}"}}},
    {"malformed: unclosed tool call with a partial object", HERMES, false,
     "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu", "Sure.\n<tool_call>\n{\"name\": \"f\", \"argu", NULL, {{0}}},
    {"malformed: invalid JSON in a closed tool call", HERMES, false,
     "Calling.\n\n<tool_call>\nnot json at all\n</tool_call>\nAfter.",
     "Calling.\n\n<tool_call>\nnot json at all\n</tool_call>\nAfter.", NULL, {{0}}},
    {"malformed: JSON object without a name", HERMES, false, "<tool_call>{\"arguments\": {}}</tool_call>",
     "<tool_call>{\"arguments\": {}}</tool_call>", NULL, {{0}}},
    {"malformed: think never closed", HERMES, false, "<think>\nStill thinking about \xe6\x97\xa5\xe6\x9c\xac\n",
     NULL, "Still thinking about \xe6\x97\xa5\xe6\x9c\xac\n", {{0}}},
    {"malformed: partial tag at the end", HERMES, false, "The answer is <tool_ca", "The answer is <tool_ca", NULL, {{0}}},
    {"trailing newlines at the end are kept", HERMES, false, "Line one.\n\n", "Line one.\n\n", NULL, {{0}}},

    // ---- Qwen3-Coder / Qwen3.5 XML calls
    {"qwen3.5 reasoning then an XML call", CODER, true,
     "The user asks for a 3-day forecast.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n"
     "</parameter>\n<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>",
     NULL, "The user asks for a 3-day forecast.", {{"get_weather", "{\"city\":\"Paris\",\"days\":3}"}}},
    {"qwen3-coder multi-line code and a JSON object value", CODER, false,
     "I'll write the file.\n\n<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/a.py\n</parameter>\n"
     "<parameter=content>\ndef f():\n    return {\"a\": 1}  # \xe2\x9c\x93\n\n</parameter>\n<parameter=options>\n"
     "{\"mode\": \"w\", \"flags\": [true, null]}\n</parameter>\n</function>\n</tool_call>",
     "I'll write the file.", NULL,
     {{"write_file", "{\"path\":\"/tmp/a.py\",\"content\":\"def f():\\n    return {\\\"a\\\": 1}  # \xe2\x9c\x93\\n\","
                     "\"options\":{\"mode\":\"w\",\"flags\":[true,null]}}"}}},
    {"qwen3-coder two calls, no parameters in one", CODER, false,
     "<tool_call>\n<function=list_files>\n</function>\n</tool_call>\n<tool_call>\n<function=read>\n<parameter=n>\n"
     "-1.5e3\n</parameter>\n<parameter=s>\n\xf0\x9f\x8e\x89 party, \"quoted\"\n</parameter>\n</function>\n</tool_call>",
     NULL, NULL, {{"list_files", "{}"}, {"read", "{\"n\":-1.5e3,\"s\":\"\xf0\x9f\x8e\x89 party, \\\"quoted\\\"\"}"}}},
    {"qwen3-coder value that looks like two values is a string", CODER, false,
     "<tool_call>\n<function=f>\n<parameter=a>\n1, \"b\": 2\n</parameter>\n</function>\n</tool_call>", NULL, NULL,
     {{"f", "{\"a\":\"1, \\\"b\\\": 2\"}"}}},
    {"qwen3-coder missing </parameter> and </function>", CODER, false,
     "<tool_call>\n<function=f>\n<parameter=a>\nx\n<parameter=b>\ntrue\n</tool_call>", NULL, NULL,
     {{"f", "{\"a\":\"x\",\"b\":true}"}}},
    {"malformed: qwen3-coder cut inside a value", CODER, false,
     "<tool_call>\n<function=f>\n<parameter=a>\nhello wor", NULL, NULL, {{"f", "{\"a\":\"hello wor\"}"}}},
    {"malformed: qwen3-coder body without <function=", CODER, false, "<tool_call>\nhello\n</tool_call> bye",
     "<tool_call>\nhello\n</tool_call> bye", NULL, {{0}}},
    {"malformed: qwen3-coder cut inside the function name", CODER, false, "Ok.\n<tool_call>\n<function=get_w",
     "Ok.\n<tool_call>\n<function=get_w", NULL, {{0}}},

    // ---- DeepSeek V3.1
    {"deepseek v3.1 thinking, content, two calls", DEEPSEEK, true,
     "The user wants the weather and the time.</think>Let me check both.\n\n<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>"
     "get_weather<｜tool▁sep｜>{\"location\": \"æ±äº¬\"}<｜tool▁call▁end｜><｜tool▁call▁begin｜>get_time"
     "<｜tool▁sep｜>{\"tz\": \"JST\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜><｜end▁of▁sentence｜>",
     "Let me check both.", "The user wants the weather and the time.",
     {{"get_weather", "{\"location\": \"æ±äº¬\"}"}, {"get_time", "{\"tz\": \"JST\"}"}}},
    {"deepseek v3.1 answer without thinking", DEEPSEEK, false,
     "Hello ä¸ç ð<｜end▁of▁sentence｜>", "Hello ä¸ç ð",
     NULL, {{0}}},
    {"deepseek v3.1 call without the block token, cut in its arguments", DEEPSEEK, false,
     "<｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": [1, ", NULL, NULL, {{"f", "{\"a\": [1, "}}},
    {"malformed: deepseek v3.1 call cut in its name", DEEPSEEK, false,
     "Ok.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_w", "Ok.", NULL, {{0}}},
    {"deepseek v3.1 reasoning cut by end of sentence", DEEPSEEK, true, "Hmm<｜end▁of▁sentence｜>", NULL, "Hmm",
     {{0}}},

    // ---- gpt-oss harmony
    {"harmony analysis then a tool call", HARMONY, false,
     "<|channel|>analysis<|message|>User asks weather in SF. Use get_weather.<|end|><|start|>assistant<|channel|>"
     "commentary to=functions.get_weather <|constrain|>json<|message|>{\"location\":\"San Francisco, CA\"}<|call|>",
     NULL, "User asks weather in SF. Use get_weather.", {{"get_weather", "{\"location\":\"San Francisco, CA\"}"}}},
    {"harmony analysis then final", HARMONY, false,
     "<|channel|>analysis<|message|>Greet back.<|end|><|start|>assistant<|channel|>final<|message|>"
     "Hello! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b<|return|>",
     "Hello! \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x91\x8b", "Greet back.", {{0}}},
    {"harmony recipient before the channel", HARMONY, false,
     "<|channel|>analysis<|message|>Need a lookup.<|end|><|start|>assistant to=functions.lookup<|channel|>"
     "commentary json<|message|>{\"q\": \"\xe6\x97\xa5\xe6\x9c\xac\"}<|call|>",
     NULL, "Need a lookup.", {{"lookup", "{\"q\": \"\xe6\x97\xa5\xe6\x9c\xac\"}"}}},
    {"harmony final without <|return|>", HARMONY, false, "<|channel|>final<|message|>Hi there", "Hi there", NULL, {{0}}},
    {"harmony preamble on commentary, then two calls", HARMONY, false,
     "<|channel|>commentary<|message|>Checking two things.<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.a <|constrain|>json<|message|>{}<|call|><|start|>assistant<|channel|>commentary to=functions.b "
     "<|constrain|>json<|message|>{\"x\":[1,2]}<|call|>",
     "Checking two things.", NULL, {{"a", "{}"}, {"b", "{\"x\":[1,2]}"}}},
    {"harmony header cut short", HARMONY, false,
     "<|channel|>analysis<|message|>abc<|end|><|start|>assistant<|channel|>fin", NULL, "abc", {{0}}},
    {"harmony: plain text with no tokens", HARMONY, false, "Just text.", "Just text.", NULL, {{0}}},
    {"harmony: text mentioning < and | is kept", HARMONY, false,
     "<|channel|>final<|message|>a <| b |> c <|en d<|return|>", "a <| b |> c <|en d", NULL, {{0}}},

    // ---- plain
    {"plain keeps everything", PLAIN, false, "\n<think>x</think>\n<tool_call>{}</tool_call>\n",
     "\n<think>x</think>\n<tool_call>{}</tool_call>\n", NULL, {{0}}},
};
// clang-format on

/* ---- helpers ------------------------------------------------------------ */

static struct sp_chat_parse_opts opts_of(const struct tcase *c) {
    return (struct sp_chat_parse_opts){.format = c->fmt, .in_reasoning = c->in_reasoning, .id_seed = 1234};
}

static void check_part(const char *label, const char *what, const struct sp_buf *got, const char *want) {
    if (!want) {
        if (got->data) fail_msg("%s: unexpected %s: [%.*s]", label, what, (int)got->len, got->data);
        return;
    }
    if (!got->data || got->len != strlen(want) || memcmp(got->data, want, got->len) != 0)
        fail_msg("%s: %s\n  got  [%.*s]\n  want [%s]", label, what, (int)got->len, got->data ? got->data : "", want);
}

static void check_want(const struct tcase *c, const struct sp_chat_result *r) {
    check_part(c->label, "content", &r->content, c->content);
    check_part(c->label, "reasoning", &r->reasoning, c->reasoning);
    size_t n = 0;
    while (n < 4 && c->calls[n].name) n++;
    if (r->n_tool_calls != n) fail_msg("%s: %zu tool calls, want %zu", c->label, r->n_tool_calls, n);
    for (size_t i = 0; i < n; i++) {
        assert_string_equal(r->tool_calls[i].name, c->calls[i].name);
        check_part(c->label, "arguments", &r->tool_calls[i].arguments, c->calls[i].args);
        assert_int_equal(strncmp(r->tool_calls[i].id, "call_", 5), 0);
        assert_int_equal(strlen(r->tool_calls[i].id), 29);
    }
}

static bool same_buf(const struct sp_buf *a, const struct sp_buf *b) {
    if (!a->data || !b->data) return !a->data && !b->data;
    return a->len == b->len && memcmp(a->data, b->data, a->len) == 0;
}

static void check_same(const char *label, const struct sp_chat_result *a, const struct sp_chat_result *b,
                       const char *how) {
    if (!same_buf(&a->content, &b->content))
        fail_msg("%s (%s): content [%.*s] vs [%.*s]", label, how, (int)a->content.len,
                 a->content.data ? a->content.data : "", (int)b->content.len, b->content.data ? b->content.data : "");
    if (!same_buf(&a->reasoning, &b->reasoning))
        fail_msg("%s (%s): reasoning [%.*s] vs [%.*s]", label, how, (int)a->reasoning.len,
                 a->reasoning.data ? a->reasoning.data : "", (int)b->reasoning.len,
                 b->reasoning.data ? b->reasoning.data : "");
    if (a->n_tool_calls != b->n_tool_calls)
        fail_msg("%s (%s): %zu vs %zu tool calls", label, how, a->n_tool_calls, b->n_tool_calls);
    for (size_t i = 0; i < a->n_tool_calls; i++) {
        assert_string_equal(a->tool_calls[i].name, b->tool_calls[i].name);
        assert_string_equal(a->tool_calls[i].id, b->tool_calls[i].id);
        if (!same_buf(&a->tool_calls[i].arguments, &b->tool_calls[i].arguments))
            fail_msg("%s (%s): arguments of call %zu differ", label, how, i);
    }
}

/* Feeds text in the pieces given by cuts (increasing offsets) and gathers
 * the events; checks what every event batch promises. */
static void stream(const struct sp_chat_parse_opts *o, const char *text, size_t len, const size_t *cuts, size_t n_cuts,
                   struct sp_chat_result *out, int *tool_calls) {
    struct sp_chat_parser *p;
    assert_int_equal(sp_chat_parser_new(o, &p), SP_OK);
    *out = (struct sp_chat_result){0};
    size_t prev = 0;
    for (size_t k = 0; k <= n_cuts + 1; k++) {
        // pieces between the cuts, then finish
        if (k <= n_cuts) {
            size_t end = k < n_cuts ? cuts[k] : len;
            assert_int_equal(sp_chat_parser_push(p, text + prev, end - prev), SP_OK);
            prev = end;
        } else {
            assert_int_equal(sp_chat_parser_finish(p), SP_OK);
        }
        size_t n;
        const struct sp_chat_event *ev = sp_chat_parser_events(p, &n);
        for (size_t i = 0; i < n; i++) {
            if (ev[i].kind == SP_CHAT_EV_TOOL_BEGIN) {
                assert_non_null(ev[i].id);
            } else {
                assert_true(ev[i].len > 0);
                assert_null(ev[i].id);
            }
            // merged: no two neighbours of the same kind and call
            if (i && ev[i].kind != SP_CHAT_EV_TOOL_BEGIN)
                assert_false(ev[i - 1].kind == ev[i].kind && ev[i - 1].tool_index == ev[i].tool_index);
        }
        assert_int_equal(sp_chat_result_add(out, ev, n), SP_OK);
    }
    assert_int_equal(sp_chat_parser_push(p, "x", 1), SP_ERR_STATE);
    *tool_calls = sp_chat_parser_tool_calls(p);
    sp_chat_parser_free(p);
}

/* One-shot parse, then streams in pieces of 1, 2 and 3 bytes and at random
 * cuts: all must agree. Returns the one-shot result. */
static void parse_every_way(const char *label, const struct sp_chat_parse_opts *o, const char *text, size_t len,
                            struct sp_rng *rng, int random_splits, struct sp_chat_result *one) {
    assert_int_equal(sp_chat_parse(o, text, len, one), SP_OK);
    size_t *cuts = malloc((len + 1) * sizeof *cuts);
    assert_non_null(cuts);
    for (int mode = 0; mode < 3 + random_splits; mode++) {
        size_t n_cuts = 0;
        if (mode < 3) {
            for (size_t c = (size_t)mode + 1; c < len; c += (size_t)mode + 1) cuts[n_cuts++] = c;
        } else {
            for (size_t c = 1; c < len; c++)
                if (sp_rng_next(rng) % 4 == 0) cuts[n_cuts++] = c;
        }
        struct sp_chat_result r;
        int tools;
        stream(o, text, len, cuts, n_cuts, &r, &tools);
        char how[32];
        snprintf(how, sizeof how, mode < 3 ? "%d-byte pieces" : "random cuts %d", mode < 3 ? mode + 1 : mode);
        check_same(label, one, &r, how);
        assert_int_equal((size_t)tools, one->n_tool_calls);
        sp_chat_result_free(&r);
    }
    free(cuts);
}

/* ---- tests -------------------------------------------------------------- */

static void test_cases_every_split(void **state) {
    (void)state;
    struct sp_rng rng;
    sp_rng_seed(&rng, 99);
    size_t mem0 = sp_mem_used_total();
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        const struct tcase *c = &cases[i];
        struct sp_chat_parse_opts o = opts_of(c);
        struct sp_chat_result one;
        parse_every_way(c->label, &o, c->text, strlen(c->text), &rng, 60, &one);
        check_want(c, &one);
        sp_chat_result_free(&one);
    }
    assert_int_equal(sp_mem_used_total(), mem0);
}

/* Events as they come: text that cannot start a tag goes out at once. */
struct seen {
    char text[512];
};

static const char *push_seen(struct sp_chat_parser *p, const char *piece, struct seen *s) {
    assert_int_equal(sp_chat_parser_push(p, piece, strlen(piece)), SP_OK);
    size_t n, used = 0;
    const struct sp_chat_event *ev = sp_chat_parser_events(p, &n);
    s->text[0] = '\0';
    static const char kinds[] = "CRBA";
    for (size_t i = 0; i < n; i++)
        used += (size_t)snprintf(s->text + used, sizeof s->text - used, "%c[%.*s]", kinds[ev[i].kind], (int)ev[i].len,
                                 ev[i].text);
    return s->text;
}

static void test_holds_back_only_tag_starts(void **state) {
    (void)state;
    struct seen s;
    struct sp_chat_parser *p;
    struct sp_chat_parse_opts o = {.format = HERMES};
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "<thi", &s), ""); // could be <think>
    assert_string_equal(push_seen(p, "nk>\nPlan", &s), "R[Plan]");
    assert_string_equal(push_seen(p, " it\n", &s), "R[ it]"); // the newline may belong to </think>
    assert_string_equal(push_seen(p, "more</th", &s), "R[\nmore]");
    assert_string_equal(push_seen(p, "ink>\n\nHello wor", &s), "C[Hello wor]");
    assert_string_equal(push_seen(p, "ld a<b <", &s), "C[ld a<b ]");
    assert_string_equal(push_seen(p, "i>\n\n", &s), "C[<i>]"); // newlines may precede <tool_call>
    assert_string_equal(push_seen(p, "x <tool_c", &s), "C[\n\nx ]");
    assert_string_equal(push_seen(p, "all>\n{\"name\": \"f\", ", &s), "");
    assert_string_equal(push_seen(p, "\"arguments\": {", &s), "B[f]A[{]");
    assert_string_equal(push_seen(p, "\"a\": [1, ", &s), "A[\"a\":[1,]");
    assert_string_equal(push_seen(p, "\"x y\"]}}\n</tool", &s), "A[\"x y\"]}]");
    assert_string_equal(push_seen(p, "_call>\n\nok", &s), "C[ok]");
    assert_int_equal(sp_chat_parser_tool_calls(p), 1);
    assert_int_equal(sp_chat_parser_finish(p), SP_OK);
    sp_chat_parser_free(p);

    o.format = CODER;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "<tool_call>\n<function=run", &s), "");
    assert_string_equal(push_seen(p, ">\n<parameter=cmd>\nls -la", &s), "B[run]A[{]");
    assert_string_equal(push_seen(p, "\n</parameter>\n<parameter=n>\n2\n</parameter>\n", &s),
                        "A[\"cmd\":\"ls -la\",\"n\":2]");
    assert_string_equal(push_seen(p, "</function>\n</tool_call>", &s), "A[}]");
    sp_chat_parser_free(p);

    o.format = HARMONY;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "<|channel|>anal", &s), "");
    assert_string_equal(push_seen(p, "ysis<|message|>Think", &s), "R[Think]");
    assert_string_equal(push_seen(p, "ing <|", &s), "R[ing ]");
    assert_string_equal(push_seen(p, "end|><|start|>assistant<|channel|>final<|message|>Hi", &s), "C[Hi]");
    assert_string_equal(push_seen(p, " there<|return|>", &s), "C[ there]");
    sp_chat_parser_free(p);

    o.format = HARMONY;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "<|channel|>commentary to=functions.f <|constrain|>json<|message|>{\"a\"", &s),
                        "B[f]A[{\"a\"]");
    assert_string_equal(push_seen(p, ": 1}<|call|>", &s), "A[: 1}]");
    assert_int_equal(sp_chat_parser_tool_calls(p), 1);
    sp_chat_parser_free(p);

    o.format = DEEPSEEK;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "Sure <｜tool▁ca", &s), "C[Sure ]");
    assert_string_equal(push_seen(p, "lls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"x\"", &s), "B[f]A[{\"x\"]");
    assert_string_equal(push_seen(p, ": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", &s), "A[: 1}]");
    assert_string_equal(push_seen(p, "<｜end▁of▁sentence｜>", &s), "");
    sp_chat_parser_free(p);

    o.format = PLAIN;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_string_equal(push_seen(p, "<tool_call", &s), "C[<tool_call]");
    sp_chat_parser_free(p);
}

/* Ids depend on the seed and the call's index only. */
static void test_ids(void **state) {
    (void)state;
    const char *text = "<tool_call>\n{\"name\": \"a\", \"arguments\": {}}\n</tool_call>\n"
                       "<tool_call>\n{\"name\": \"b\", \"arguments\": {}}\n</tool_call>";
    struct sp_chat_parse_opts o = {.format = HERMES, .id_seed = 1};
    struct sp_chat_result r1, r2, r3;
    assert_int_equal(sp_chat_parse(&o, text, strlen(text), &r1), SP_OK);
    assert_int_equal(sp_chat_parse(&o, text, strlen(text), &r2), SP_OK);
    o.id_seed = 2;
    assert_int_equal(sp_chat_parse(&o, text, strlen(text), &r3), SP_OK);
    assert_int_equal(r1.n_tool_calls, 2);
    assert_string_equal(r1.tool_calls[0].id, r2.tool_calls[0].id);
    assert_string_not_equal(r1.tool_calls[0].id, r1.tool_calls[1].id);
    assert_string_not_equal(r1.tool_calls[0].id, r3.tool_calls[0].id);
    for (const char *c = r1.tool_calls[0].id + 5; *c; c++)
        assert_true(strchr("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789", *c));
    sp_chat_result_free(&r1);
    sp_chat_result_free(&r2);
    sp_chat_result_free(&r3);
}

/* Qwen3-Coder values follow the request's schema: "string" parameters stay
 * strings even when they read as JSON. */
static void test_coder_schema(void **state) {
    (void)state;
    const char *tools_json =
        "[{\"type\": \"function\", \"function\": {\"name\": \"set\", \"parameters\": {\"type\": \"object\", "
        "\"properties\": {\"key\": {\"type\": \"string\"}, \"value\": {\"type\": \"integer\"}, "
        "\"flag\": {\"type\": \"boolean\"}, \"off\": {\"type\": \"boolean\"}, \"none\": {\"type\": \"string\"}, "
        "\"list\": {\"type\": \"array\"}, \"bad\": {\"type\": \"number\"}, \"e\": {\"type\": \"enum\"}}}}}]";
    cJSON *tools;
    assert_int_equal(sp_json_parse(tools_json, strlen(tools_json), "tools", &tools), SP_OK);
    const char *text = "<tool_call>\n<function=set>\n<parameter=key>\n123\n</parameter>\n<parameter=value>\n123\n"
                       "</parameter>\n<parameter=flag>\nTrue\n</parameter>\n<parameter=off>\nno\n</parameter>\n"
                       "<parameter=none>\nNULL\n</parameter>\n<parameter=list>\n[1, \"a\"]\n</parameter>\n"
                       "<parameter=bad>\n12 apples\n</parameter>\n<parameter=e>\n7\n</parameter>\n"
                       "<parameter=extra>\n{\"k\": null}\n</parameter>\n</function>\n</tool_call>";
    struct sp_chat_parse_opts o = {.format = CODER, .tools = tools};
    struct sp_chat_result r;
    struct sp_rng rng;
    sp_rng_seed(&rng, 5);
    parse_every_way("schema", &o, text, strlen(text), &rng, 20, &r);
    assert_int_equal(r.n_tool_calls, 1);
    assert_string_equal(r.tool_calls[0].arguments.data,
                        "{\"key\":\"123\",\"value\":123,\"flag\":true,\"off\":false,\"none\":null,\"list\":[1,\"a\"],"
                        "\"bad\":\"12 apples\",\"e\":\"7\",\"extra\":{\"k\":null}}");
    sp_chat_result_free(&r);
    // without the schema, valid JSON is taken as JSON
    o.tools = NULL;
    assert_int_equal(sp_chat_parse(&o, text, strlen(text), &r), SP_OK);
    assert_string_equal(r.tool_calls[0].arguments.data,
                        "{\"key\":123,\"value\":123,\"flag\":\"True\",\"off\":\"no\",\"none\":null,\"list\":[1,\"a\"],"
                        "\"bad\":\"12 apples\",\"e\":7,\"extra\":{\"k\":null}}");
    sp_chat_result_free(&r);
    cJSON_Delete(tools);
}

static const char *harmony_tokens[] = {"<|start|>", "<|end|>",    "<|message|>",     "<|channel|>",  "<|constrain|>",
                                       "<|call|>",  "<|return|>", "<|startoftext|>", "<|endoftext|>"};

static bool has_token(const struct sp_buf *b) {
    if (!b->data) return false;
    for (size_t t = 0; t < sizeof harmony_tokens / sizeof *harmony_tokens; t++)
        if (strstr(b->data, harmony_tokens[t])) return true;
    return false;
}

/* Random sequences of tag pieces and text: every format gives the same
 * result whatever the cuts, never fails, and harmony never leaks a token. */
static void test_tag_soup(void **state) {
    (void)state;
    static const char *pieces[] = {
        "<think>",
        "</think>",
        "<tool_call>",
        "</tool_call>",
        "\n",
        "\n\n",
        " ",
        "{",
        "}",
        "[",
        "]",
        "\"",
        ":",
        ",",
        "\"name\"",
        "\"arguments\"",
        "\"f\"",
        "1",
        "true",
        "<function=f>",
        "<function=",
        "</function>",
        "<parameter=p>",
        "</parameter>",
        "<|channel|>",
        "analysis",
        "final",
        "commentary",
        "<|message|>",
        "<|end|>",
        "<|start|>",
        "assistant",
        " to=functions.g",
        "<|constrain|>",
        "json",
        "<|call|>",
        "<|return|>",
        "hello",
        "\xe4\xbd\xa0\xe5\xa5\xbd",
        "\xf0\x9f\x98\x80",
        "\\",
        "<",
        "|",
        ">",
        "/",
        "<tool_",
        "<|en",
        "<｜tool▁calls▁begin｜>",
        "<｜tool▁call▁begin｜>",
        "<｜tool▁sep｜>",
        "<｜tool▁call▁end｜>",
        "<｜tool▁calls▁end｜>",
        "<｜end▁of▁sentence｜>",
        "<｜tool▁",
    };
    size_t n_pieces = sizeof pieces / sizeof *pieces;
    struct sp_rng rng;
    sp_rng_seed(&rng, 31337);
    char text[1024];
    size_t mem0 = sp_mem_used_total();
    for (int trial = 0; trial < 1500; trial++) {
        size_t len = 0;
        int n = 1 + (int)(sp_rng_next(&rng) % 40);
        // harmony's no-leak promise is about whole tokens: keep '<' '|' '>' out of some texts
        bool whole_tokens = trial % 2 == 0;
        for (int k = 0; k < n; k++) {
            const char *pc = pieces[sp_rng_next(&rng) % n_pieces];
            size_t l = strlen(pc);
            if (whole_tokens && strpbrk(pc, "<|>") && !(pc[0] == '<' && pc[l - 1] == '>')) continue;
            if (len + l >= sizeof text) break;
            memcpy(text + len, pc, l);
            len += l;
        }
        text[len] = '\0';
        for (int f = 0; f < SP_CHAT_FORMAT_COUNT; f++) {
            struct sp_chat_parse_opts o = {.format = (enum sp_chat_format)f, .in_reasoning = trial % 3 == 0};
            struct sp_chat_result one;
            char label[64];
            snprintf(label, sizeof label, "soup %d %s", trial, sp_chat_format_name(o.format));
            parse_every_way(label, &o, text, len, &rng, 2, &one);
            if (f == HARMONY && whole_tokens && (has_token(&one.content) || has_token(&one.reasoning)))
                fail_msg("%s: a token leaked from [%s]", label, text);
            sp_chat_result_free(&one);
        }
    }
    assert_int_equal(sp_mem_used_total(), mem0);
}

static char *read_template(const char *name) {
    char path[512];
    snprintf(path, sizeof path, "%s/testdata/templates/%s",
             getenv("SPARROW_SHARED") && *getenv("SPARROW_SHARED") ? getenv("SPARROW_SHARED") : "../shared", name);
    char *s = NULL;
    size_t len;
    if (sp_read_file(path, 1 << 22, &s, &len) != SP_OK) fail_msg("cannot read %s: %s", path, sp_error_msg());
    return s;
}

static void test_detect(void **state) {
    (void)state;
    static const struct {
        const char *file;
        enum sp_chat_format want;
    } files[] = {
        {"Qwen-Qwen3-0.6B.jinja", HERMES},      {"Qwen3.5-4B.jinja", CODER},
        {"Qwen3-Coder.jinja", CODER},           {"deepseek-ai-DeepSeek-V3.1.jinja", DEEPSEEK},
        {"openai-gpt-oss-120b.jinja", HARMONY}, {"meta-llama-Llama-3.1-8B-Instruct.jinja", PLAIN},
    };
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char *t = read_template(files[i].file);
        if (sp_chat_format_detect(t, NULL) != files[i].want)
            fail_msg("%s: detected %s", files[i].file, sp_chat_format_name(sp_chat_format_detect(t, NULL)));
        sp_free(t);
    }
    // Ling 2.0 keeps its template in tokenizer_config.json
    char *cfg = read_template("Ling-2.0.tokenizer_config.json");
    cJSON *root;
    assert_int_equal(sp_json_parse(cfg, strlen(cfg), "tokenizer_config", &root), SP_OK);
    const char *tmpl;
    assert_int_equal(sp_json_get_str(root, "chat_template", NULL, &tmpl), SP_OK);
    assert_int_equal(sp_chat_format_detect(tmpl, "bailing_moe"), HERMES);
    cJSON_Delete(root);
    sp_free(cfg);
    // the model type decides when there is no template
    assert_int_equal(sp_chat_format_detect(NULL, "gpt_oss"), HARMONY);
    assert_int_equal(sp_chat_format_detect("", "qwen3_moe"), HERMES);
    assert_int_equal(sp_chat_format_detect(NULL, "bailing_moe"), HERMES);
    assert_int_equal(sp_chat_format_detect(NULL, "deepseek_v3"), DEEPSEEK);
    assert_int_equal(sp_chat_format_detect(NULL, "llama"), PLAIN);
    assert_int_equal(sp_chat_format_detect(NULL, NULL), PLAIN);
    assert_string_equal(sp_chat_format_name(HARMONY), "harmony");
}

static void test_prompt_in_reasoning(void **state) {
    (void)state;
    static const struct {
        const char *prompt;
        bool want;
    } cases_[] = {
        {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n", false},                        // qwen3, thinking on
        {"<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n", false}, // thinking off
        {"<|im_start|>assistant\n<think>\nold\n</think>\n\nx<|im_end|>\n<|im_start|>assistant\n<think>\n",
         true}, // qwen3.5
        {"<\xef\xbd\x9c"
         "Assistant\xef\xbd\x9c><think>",
         true}, // deepseek v3.1 thinking
        {"<\xef\xbd\x9c"
         "Assistant\xef\xbd\x9c><think></think>",
         false},
        {"", false},
    };
    for (size_t i = 0; i < sizeof cases_ / sizeof *cases_; i++) {
        const char *pr = cases_[i].prompt;
        assert_int_equal(sp_chat_prompt_in_reasoning(HERMES, pr, strlen(pr)), cases_[i].want);
    }
    assert_false(sp_chat_prompt_in_reasoning(HARMONY, "<think>", 7));
    assert_false(sp_chat_prompt_in_reasoning(PLAIN, "<think>", 7));
    assert_true(sp_chat_prompt_in_reasoning(CODER, "<think>\n", 8));
}

static void test_misuse(void **state) {
    (void)state;
    struct sp_chat_parser *p;
    struct sp_chat_parse_opts o = {.format = SP_CHAT_FORMAT_COUNT};
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_ERR_ARG);
    assert_null(p);
    o.format = HERMES;
    assert_int_equal(sp_chat_parser_new(&o, &p), SP_OK);
    assert_int_equal(sp_chat_parser_finish(p), SP_OK);
    assert_int_equal(sp_chat_parser_finish(p), SP_ERR_STATE);
    sp_chat_parser_free(p);
    sp_chat_parser_free(NULL);
    sp_chat_result_free(NULL);
    // empty text
    struct sp_chat_result r;
    assert_int_equal(sp_chat_parse(&o, "", 0, &r), SP_OK);
    assert_null(r.content.data);
    assert_int_equal(r.n_tool_calls, 0);
    sp_chat_result_free(&r);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_cases_every_split),
        cmocka_unit_test(test_holds_back_only_tag_starts),
        cmocka_unit_test(test_ids),
        cmocka_unit_test(test_coder_schema),
        cmocka_unit_test(test_tag_soup),
        cmocka_unit_test(test_detect),
        cmocka_unit_test(test_prompt_in_reasoning),
        cmocka_unit_test(test_misuse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
