/*
 * test_server_api.c - the Responses and Anthropic APIs over the chat path
 * (src/server/api.h): requests translated into chat-completions bodies, and
 * the output writers fed parser events in orders a random model does not
 * produce (reasoning, then content, then a tool call, then content again),
 * streamed and whole: the streamed events must be well formed, numbered in
 * order, and end in the same output as the whole body.
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
#include "core/json.h"
#include "server/api.h"

static cJSON *parse(const char *text) {
    cJSON *v = cJSON_Parse(text);
    assert_non_null(v);
    return v;
}

/* The value at a path of keys and [indexes], e.g. "messages[2].tool_calls[0].id". */
static const cJSON *at(const cJSON *v, const char *path) {
    char key[64];
    const char *p = path;
    while (v && *p) {
        if (*p == '.') p++;
        if (*p == '[') {
            v = cJSON_GetArrayItem(v, atoi(p + 1));
            p = strchr(p, ']') + 1;
            continue;
        }
        size_t n = strcspn(p, ".[");
        snprintf(key, sizeof key, "%.*s", (int)n, p);
        v = cJSON_GetObjectItemCaseSensitive(v, key);
        p += n;
    }
    return v;
}

static void assert_str_at(const cJSON *v, const char *path, const char *want) {
    const cJSON *x = at(v, path);
    if (!cJSON_IsString(x)) fail_msg("%s: not a string", path);
    assert_string_equal(x->valuestring, want);
}

static const char *TEMPLATE_THINKS = "{% if enable_thinking is defined %}{% endif %}";

static void test_responses_translate(void **state) {
    cJSON *body = parse("{\"model\": \"m\", \"instructions\": \"be brief\", \"max_output_tokens\": 50, \"seed\": 3,"
                        " \"input\": ["
                        "  {\"role\": \"user\", \"content\": [{\"type\": \"input_text\", \"text\": \"weather?\"}]},"
                        "  {\"type\": \"reasoning\", \"id\": \"rs_1\", \"summary\": []},"
                        "  {\"type\": \"message\", \"role\": \"assistant\", \"content\": [{\"type\": \"output_text\", \"text\": \"looking\"}]},"
                        "  {\"type\": \"function_call\", \"call_id\": \"call_1\", \"name\": \"get_weather\", \"arguments\": \"{\\\"city\\\":\\\"Paris\\\"}\"},"
                        "  {\"type\": \"function_call\", \"call_id\": \"call_2\", \"name\": \"get_time\", \"arguments\": \"{}\"},"
                        "  {\"type\": \"function_call_output\", \"call_id\": \"call_1\", \"output\": \"21 C\"},"
                        "  {\"role\": \"developer\", \"content\": \"use metric\"}],"
                        " \"tools\": [{\"type\": \"function\", \"name\": \"get_weather\", \"parameters\": {\"type\": \"object\"}, \"strict\": true}],"
                        " \"tool_choice\": {\"type\": \"function\", \"name\": \"get_weather\"},"
                        " \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"w\", \"schema\": {\"type\": \"object\"}, \"strict\": true}},"
                        " \"reasoning\": {\"effort\": \"none\"}, \"store\": true, \"metadata\": {\"a\": \"b\"}}");
    cJSON *chat;
    struct sp_api_err e;
    assert_true(sp_api_responses_to_chat(body, TEMPLATE_THINKS, &chat, &e));
    assert_str_at(chat, "messages[0].role", "system");
    assert_str_at(chat, "messages[0].content", "be brief");
    assert_str_at(chat, "messages[1].role", "user");
    assert_str_at(chat, "messages[1].content[0].text", "weather?");
    assert_str_at(chat, "messages[2].role", "assistant");
    assert_str_at(chat, "messages[2].content[0].text", "looking");
    assert_str_at(chat, "messages[2].tool_calls[0].id", "call_1");
    assert_str_at(chat, "messages[2].tool_calls[0].function.name", "get_weather");
    assert_str_at(chat, "messages[2].tool_calls[0].function.arguments", "{\"city\":\"Paris\"}");
    assert_str_at(chat, "messages[2].tool_calls[1].id", "call_2");
    assert_str_at(chat, "messages[3].role", "tool");
    assert_str_at(chat, "messages[3].tool_call_id", "call_1");
    assert_str_at(chat, "messages[3].content", "21 C");
    assert_str_at(chat, "messages[4].role", "system");
    assert_int_equal(cJSON_GetArraySize(at(chat, "messages")), 5);
    assert_str_at(chat, "tools[0].type", "function");
    assert_str_at(chat, "tools[0].function.name", "get_weather");
    assert_true(cJSON_IsTrue(at(chat, "tools[0].function.strict")));
    assert_str_at(chat, "tool_choice.function.name", "get_weather");
    assert_str_at(chat, "response_format.type", "json_schema");
    assert_str_at(chat, "response_format.json_schema.name", "w");
    assert_true(cJSON_IsObject(at(chat, "response_format.json_schema.schema")));
    assert_int_equal(at(chat, "max_tokens")->valueint, 50);
    assert_int_equal(at(chat, "seed")->valueint, 3);
    assert_true(cJSON_IsFalse(at(chat, "chat_template_kwargs.enable_thinking")));
    assert_null(at(chat, "reasoning_effort"));
    cJSON_Delete(chat);
    /* without a thinking switch, the effort goes to the template as reasoning_effort */
    assert_true(sp_api_responses_to_chat(body, "{{ messages }}", &chat, &e));
    assert_str_at(chat, "reasoning_effort", "none");
    assert_null(at(chat, "chat_template_kwargs"));
    cJSON_Delete(chat);
    cJSON_Delete(body);
    body = parse("{\"input\": \"hi\", \"stream\": true, \"text\": {\"format\": {\"type\": \"json_object\"}}}");
    assert_true(sp_api_responses_to_chat(body, NULL, &chat, &e));
    assert_str_at(chat, "messages[0].role", "user");
    assert_str_at(chat, "messages[0].content", "hi");
    assert_true(cJSON_IsTrue(at(chat, "stream")));
    assert_str_at(chat, "response_format.type", "json_object");
    cJSON_Delete(chat);
    cJSON_Delete(body);
}

static void test_responses_errors(void **state) {
    static const struct {
        const char *body, *param, *msg;
    } cases[] = {
        {"{\"input\": \"x\", \"previous_response_id\": \"resp_1\"}", "previous_response_id", "not stored"},
        {"{\"input\": \"x\", \"conversation\": \"c\"}", "conversation", "not stored"},
        {"{}", "input", "'input' must be"},
        {"{\"input\": 5}", "input", "'input' must be"},
        {"{\"input\": [{\"role\": \"tool\", \"content\": \"x\"}]}", "input", "input[0].role 'tool'"},
        {"{\"input\": [{\"role\": \"user\", \"content\": [{\"type\": \"input_file\"}]}]}", "input", "input[0].content[0]"},
        {"{\"input\": [{\"type\": \"function_call\", \"name\": \"f\"}]}", "input", "call_id"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"file_search\"}]}", "tools", "file_search"},
        {"{\"input\": \"x\", \"tools\": [{\"type\": \"function\"}]}", "tools", "name"},
        {"{\"input\": \"x\", \"tool_choice\": \"sometimes\"}", "tool_choice", "tool_choice"},
        {"{\"input\": \"x\", \"text\": {\"format\": {\"type\": \"json_schema\", \"name\": \"n\"}}}", "text.format.schema", "schema"},
        {"{\"input\": \"x\", \"max_output_tokens\": 1.5}", "max_output_tokens", "integer"},
        {"{\"input\": \"x\", \"background\": true}", "background", "background"},
        {"{\"input\": \"x\", \"instructions\": [1]}", "instructions", "string"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        cJSON *body = parse(cases[i].body);
        cJSON *chat = (cJSON *)1;
        struct sp_api_err e;
        assert_false(sp_api_responses_to_chat(body, NULL, &chat, &e));
        assert_null(chat);
        assert_string_equal(e.param, cases[i].param);
        if (!strstr(e.msg, cases[i].msg)) fail_msg("%s: %s", cases[i].body, e.msg);
        cJSON_Delete(body);
    }
}

static void test_anthropic_translate(void **state) {
    cJSON *body = parse("{\"model\": \"m\", \"max_tokens\": 64, \"system\": [{\"type\": \"text\", \"text\": \"a\"}, {\"type\": \"text\", \"text\": \"b\"}],"
                        " \"messages\": ["
                        "  {\"role\": \"user\", \"content\": \"weather?\"},"
                        "  {\"role\": \"assistant\", \"content\": [{\"type\": \"thinking\", \"thinking\": \"hm\", \"signature\": \"s\"},"
                        "     {\"type\": \"text\", \"text\": \"looking\"},"
                        "     {\"type\": \"tool_use\", \"id\": \"toolu_1\", \"name\": \"get_weather\", \"input\": {\"city\": \"Paris\"}}]},"
                        "  {\"role\": \"user\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"toolu_1\", \"is_error\": true,"
                        "     \"content\": [{\"type\": \"text\", \"text\": \"timeout\"}]}, {\"type\": \"text\", \"text\": \"again\"}]}],"
                        " \"tools\": [{\"name\": \"get_weather\", \"description\": \"d\", \"input_schema\": {\"type\": \"object\"}}],"
                        " \"tool_choice\": {\"type\": \"any\"}, \"stop_sequences\": [\"END\"], \"top_k\": 5,"
                        " \"thinking\": {\"type\": \"disabled\"}, \"metadata\": {\"user_id\": \"u\"}}");
    cJSON *chat;
    struct sp_api_err e;
    assert_true(sp_api_anthropic_to_chat(body, TEMPLATE_THINKS, false, &chat, &e));
    assert_str_at(chat, "messages[0].role", "system");
    assert_str_at(chat, "messages[0].content", "a\nb");
    assert_str_at(chat, "messages[1].content", "weather?");
    assert_str_at(chat, "messages[2].role", "assistant");
    assert_str_at(chat, "messages[2].content[0].text", "looking");
    assert_int_equal(cJSON_GetArraySize(at(chat, "messages[2].content")), 1);
    assert_str_at(chat, "messages[2].tool_calls[0].id", "toolu_1");
    assert_str_at(chat, "messages[2].tool_calls[0].function.arguments", "{\"city\":\"Paris\"}");
    assert_str_at(chat, "messages[3].role", "tool");
    assert_str_at(chat, "messages[3].tool_call_id", "toolu_1");
    assert_str_at(chat, "messages[3].content", "Error: timeout");
    assert_str_at(chat, "messages[4].role", "user");
    assert_str_at(chat, "messages[4].content[0].text", "again");
    assert_int_equal(cJSON_GetArraySize(at(chat, "messages")), 5);
    assert_str_at(chat, "tools[0].function.name", "get_weather");
    assert_str_at(chat, "tools[0].function.description", "d");
    assert_true(cJSON_IsObject(at(chat, "tools[0].function.parameters")));
    assert_str_at(chat, "tool_choice", "required");
    assert_str_at(chat, "stop[0]", "END");
    assert_int_equal(at(chat, "max_tokens")->valueint, 64);
    assert_int_equal(at(chat, "top_k")->valueint, 5);
    assert_true(cJSON_IsFalse(at(chat, "chat_template_kwargs.enable_thinking")));
    cJSON_Delete(chat);
    cJSON_Delete(body);

    static const struct {
        const char *tc, *want;
    } choices[] = {{"{\"type\": \"auto\"}", "auto"}, {"{\"type\": \"none\"}", "none"}, {"{\"type\": \"tool\", \"name\": \"f\"}", NULL}};
    for (size_t i = 0; i < sizeof choices / sizeof *choices; i++) {
        char text[256];
        snprintf(text, sizeof text, "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tool_choice\": %s}",
                 choices[i].tc);
        body = parse(text);
        assert_true(sp_api_anthropic_to_chat(body, NULL, false, &chat, &e));
        if (choices[i].want)
            assert_str_at(chat, "tool_choice", choices[i].want);
        else
            assert_str_at(chat, "tool_choice.function.name", "f");
        cJSON_Delete(chat);
        cJSON_Delete(body);
    }
    /* count_tokens has no max_tokens; messages does */
    body = parse("{\"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stream\": true}");
    assert_true(sp_api_anthropic_to_chat(body, NULL, true, &chat, &e));
    assert_null(at(chat, "stream"));
    cJSON_Delete(chat);
    assert_false(sp_api_anthropic_to_chat(body, NULL, false, &chat, &e));
    assert_string_equal(e.param, "max_tokens");
    cJSON_Delete(body);
    static const char *const bad[] = {
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"image\"}]}]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": [{\"type\": \"text\", \"text\": \"a\"}, "
        "{\"type\": \"tool_result\", \"tool_use_id\": \"t\"}]}]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"assistant\", \"content\": [{\"type\": \"tool_result\", \"tool_use_id\": \"t\"}]}]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"system\": [{\"type\": \"image\"}]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"tools\": [{\"name\": \"f\"}]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"stop_sequences\": [1]}",
        "{\"max_tokens\": 1, \"messages\": [{\"role\": \"user\", \"content\": \"x\"}], \"thinking\": {\"type\": \"enabled\", \"budget_tokens\": -1}}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        body = parse(bad[i]);
        if (sp_api_anthropic_to_chat(body, NULL, false, &chat, &e)) fail_msg("accepted: %s", bad[i]);
        assert_true(e.msg[0] != 0);
        cJSON_Delete(body);
    }
}

static void test_params(void **state) {
    assert_string_equal(sp_api_param(SP_API_RESPONSES, "messages"), "input");
    assert_string_equal(sp_api_param(SP_API_RESPONSES, "max_tokens"), "max_output_tokens");
    assert_string_equal(sp_api_param(SP_API_RESPONSES, "response_format"), "text.format");
    assert_string_equal(sp_api_param(SP_API_RESPONSES, "temperature"), "temperature");
    assert_string_equal(sp_api_param(SP_API_ANTHROPIC, "stop"), "stop_sequences");
    assert_string_equal(sp_api_param(SP_API_CHAT, "messages"), "messages");
    assert_null(sp_api_param(SP_API_RESPONSES, NULL));
}

/* ---- writers ---- */

#define EV(k, t) {.kind = SP_CHAT_EV_##k, .text = t, .len = sizeof t - 1}

/* reasoning, content, a tool call in two argument pieces, content again,
 * in three pushes */
static const struct sp_chat_event push1[] = {EV(REASONING, "let me"), EV(REASONING, " think"), EV(CONTENT, "Hello")};
static const struct sp_chat_event push2[] = {
    EV(CONTENT, " there"),
    {.kind = SP_CHAT_EV_TOOL_BEGIN, .text = "get_weather", .len = 11, .id = "call_abc123"},
    {.kind = SP_CHAT_EV_TOOL_ARGS, .text = "{\"city\":", .len = 8},
};
static const struct sp_chat_event push3[] = {{.kind = SP_CHAT_EV_TOOL_ARGS, .text = "\"Paris\"}", .len = 8},
                                             EV(CONTENT, "Bye")};

static struct sp_api_out *writer(enum sp_api api, const char *request) {
    cJSON *req = parse(request);
    struct sp_api_out_info oi = {.api = api, .request = req, .id = api == SP_API_RESPONSES ? "resp_0123abcd" : "msg_0123abcd",
                                 .model = "tiny", .created = 1700000000, .prompt_tokens = 20};
    struct sp_api_out *o;
    assert_int_equal(sp_api_out_new(&oi, &o), SP_OK);
    cJSON_Delete(req);  // the writer keeps copies
    return o;
}

static void feed(struct sp_api_out *o, struct sp_buf *sse) {
    sp_api_out_events(o, push1, sizeof push1 / sizeof *push1, sse);
    sp_api_out_events(o, push2, sizeof push2 / sizeof *push2, sse);
    sp_api_out_events(o, push3, sizeof push3 / sizeof *push3, sse);
}

/* The events of an SSE text: each "event: NAME" line names its data's type. */
static cJSON *sse_events(const struct sp_buf *sse) {
    cJSON *all = cJSON_CreateArray();
    const char *p = sse->data;
    while (p && *p) {
        assert_memory_equal(p, "event: ", 7);
        const char *nl = strchr(p, '\n');
        char name[64];
        snprintf(name, sizeof name, "%.*s", (int)(nl - p - 7), p + 7);
        assert_memory_equal(nl + 1, "data: ", 6);
        const char *end = strstr(nl + 1, "\n\n");
        assert_non_null(end);
        cJSON *d = cJSON_ParseWithLength(nl + 7, (size_t)(end - nl - 7));
        assert_non_null(d);
        assert_str_at(d, "type", name);
        cJSON_AddItemToArray(all, d);
        p = end + 2;
    }
    return all;
}

static void test_responses_writer(void **state) {
    const char *req = "{\"input\": \"x\", \"instructions\": \"be brief\", \"tool_choice\": \"auto\", \"max_output_tokens\": 99}";
    struct sp_api_out *o = writer(SP_API_RESPONSES, req);
    struct sp_buf sse = SP_BUF_INIT;
    sp_api_out_begin(o, &sse);
    feed(o, &sse);
    struct sp_req_progress p = {.finished = true, .finish = SP_FINISH_STOP, .prompt_tokens = 20, .cached_tokens = 4,
                                .completion_tokens = 9, .stop_index = -1};
    sp_api_out_end(o, &p, &sse);
    cJSON *ev = sse_events(&sse);
    int n = cJSON_GetArraySize(ev);
    for (int i = 0; i < n; i++) assert_int_equal(at(cJSON_GetArrayItem(ev, i), "sequence_number")->valueint, i);
    /* the order of the events, by type */
    static const char *const want[] = {
        "response.created", "response.in_progress",
        "response.output_item.added", "response.content_part.added", "response.reasoning_text.delta",
        "response.reasoning_text.delta", "response.reasoning_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.delta", "response.output_text.done", "response.content_part.done",
        "response.output_item.done",
        "response.output_item.added", "response.function_call_arguments.delta",
        "response.function_call_arguments.delta", "response.function_call_arguments.done", "response.output_item.done",
        "response.output_item.added", "response.content_part.added", "response.output_text.delta",
        "response.output_text.done", "response.content_part.done", "response.output_item.done",
        "response.completed"};
    assert_int_equal(n, (int)(sizeof want / sizeof *want));
    for (int i = 0; i < n; i++) assert_str_at(cJSON_GetArrayItem(ev, i), "type", want[i]);
    const cJSON *done = cJSON_GetArrayItem(ev, n - 1);
    assert_str_at(done, "response.status", "completed");
    assert_str_at(done, "response.output[0].type", "reasoning");
    assert_str_at(done, "response.output[0].content[0].text", "let me think");
    assert_str_at(done, "response.output[1].content[0].text", "Hello there");
    assert_str_at(done, "response.output[2].type", "function_call");
    assert_str_at(done, "response.output[2].call_id", "call_abc123");
    assert_str_at(done, "response.output[2].id", "fc_abc123");
    assert_str_at(done, "response.output[2].arguments", "{\"city\":\"Paris\"}");
    assert_str_at(done, "response.output[3].content[0].text", "Bye");
    assert_str_at(done, "response.instructions", "be brief");
    assert_int_equal(at(done, "response.max_output_tokens")->valueint, 99);
    assert_int_equal(at(done, "response.usage.input_tokens_details.cached_tokens")->valueint, 4);
    assert_int_equal(at(done, "response.usage.total_tokens")->valueint, 29);
    assert_true(cJSON_IsFalse(at(done, "response.store")));
    /* item ids stay the same from added to done, and differ between items */
    assert_string_equal(at(cJSON_GetArrayItem(ev, 2), "item.id")->valuestring, at(done, "response.output[0].id")->valuestring);
    assert_string_not_equal(at(done, "response.output[1].id")->valuestring, at(done, "response.output[3].id")->valuestring);

    /* the whole body from the same events has the same output */
    struct sp_api_out *o2 = writer(SP_API_RESPONSES, req);
    feed(o2, NULL);
    struct sp_buf body = SP_BUF_INIT;
    sp_api_out_body(o2, &p, &body);
    cJSON *b = cJSON_ParseWithLength(body.data, body.len);
    assert_non_null(b);
    assert_true(cJSON_Compare(at(b, "output"), at(done, "response.output"), true));
    assert_str_at(b, "object", "response");
    cJSON_Delete(b);
    sp_buf_free(&body);

    /* the length limit: incomplete, and so is the open item */
    p.finish = SP_FINISH_LENGTH;
    struct sp_api_out *o3 = writer(SP_API_RESPONSES, req);
    sp_api_out_events(o3, push1, sizeof push1 / sizeof *push1, NULL);
    sp_api_out_body(o3, &p, &body);
    b = cJSON_ParseWithLength(body.data, body.len);
    assert_str_at(b, "status", "incomplete");
    assert_str_at(b, "incomplete_details.reason", "max_output_tokens");
    assert_str_at(b, "output[0].status", "completed");
    assert_str_at(b, "output[1].status", "incomplete");
    cJSON_Delete(b);
    sp_buf_free(&body);

    /* a failure: response.failed with the message */
    sp_buf_clear(&sse);
    sp_api_out_fail(o3, "server_shutdown", "going away", &p, &sse);
    cJSON *f = sse_events(&sse);
    assert_str_at(f, "[0].response.status", "failed");
    assert_str_at(f, "[0].response.error.message", "going away");
    cJSON_Delete(f);

    cJSON_Delete(ev);
    sp_buf_free(&sse);
    sp_api_out_free(o);
    sp_api_out_free(o2);
    sp_api_out_free(o3);
    sp_api_out_free(NULL);
}

static void test_anthropic_writer(void **state) {
    const char *req = "{\"max_tokens\": 9, \"messages\": [], \"stop_sequences\": [\"\", \"END\", \"STOP\"]}";
    struct sp_api_out *o = writer(SP_API_ANTHROPIC, req);
    struct sp_buf sse = SP_BUF_INIT;
    sp_api_out_begin(o, &sse);
    feed(o, &sse);
    struct sp_req_progress p = {.finished = true, .finish = SP_FINISH_STOP, .prompt_tokens = 20, .cached_tokens = 4,
                                .completion_tokens = 9, .stop_index = -1};
    sp_api_out_end(o, &p, &sse);
    cJSON *ev = sse_events(&sse);
    int n = cJSON_GetArraySize(ev);
    static const char *const want[] = {
        "message_start", "ping",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_stop",
        "message_delta", "message_stop"};
    assert_int_equal(n, (int)(sizeof want / sizeof *want));
    for (int i = 0; i < n; i++) assert_str_at(cJSON_GetArrayItem(ev, i), "type", want[i]);
    assert_int_equal(at(ev, "[0].message.usage.input_tokens")->valueint, 20);
    assert_str_at(ev, "[2].content_block.type", "thinking");
    assert_str_at(ev, "[3].delta.type", "thinking_delta");
    assert_str_at(ev, "[6].content_block.type", "text");
    assert_str_at(ev, "[7].delta.text", "Hello");
    assert_str_at(ev, "[10].content_block.type", "tool_use");
    assert_str_at(ev, "[10].content_block.id", "toolu_abc123");
    assert_true(cJSON_IsObject(at(ev, "[10].content_block.input")));
    assert_str_at(ev, "[11].delta.type", "input_json_delta");
    assert_str_at(ev, "[11].delta.partial_json", "{\"city\":");
    assert_int_equal(at(ev, "[14].index")->valueint, 3);
    assert_str_at(ev, "[17].delta.stop_reason", "tool_use");
    assert_int_equal(at(ev, "[17].usage.input_tokens")->valueint, 16);
    assert_int_equal(at(ev, "[17].usage.cache_read_input_tokens")->valueint, 4);
    assert_int_equal(at(ev, "[17].usage.output_tokens")->valueint, 9);

    struct sp_api_out *o2 = writer(SP_API_ANTHROPIC, req);
    feed(o2, NULL);
    struct sp_buf body = SP_BUF_INIT;
    sp_api_out_body(o2, &p, &body);
    cJSON *b = cJSON_ParseWithLength(body.data, body.len);
    assert_str_at(b, "type", "message");
    assert_str_at(b, "content[0].thinking", "let me think");
    assert_str_at(b, "content[1].text", "Hello there");
    assert_str_at(b, "content[2].input.city", "Paris");
    assert_str_at(b, "content[3].text", "Bye");
    assert_str_at(b, "stop_reason", "tool_use");
    cJSON_Delete(b);
    sp_buf_free(&body);

    /* stop sequences: the index is into the non-empty ones, as the chat path keeps them */
    struct sp_api_out *o3 = writer(SP_API_ANTHROPIC, req);
    sp_api_out_events(o3, push1, sizeof push1 / sizeof *push1, NULL);
    p.stop_index = 1;
    sp_api_out_body(o3, &p, &body);
    b = cJSON_ParseWithLength(body.data, body.len);
    assert_str_at(b, "stop_reason", "stop_sequence");
    assert_str_at(b, "stop_sequence", "STOP");
    cJSON_Delete(b);
    sp_buf_clear(&body);
    p.stop_index = -1;
    p.stopped_by_eos = true;
    struct sp_api_out *o4 = writer(SP_API_ANTHROPIC, req);
    sp_api_out_body(o4, &p, &body);
    b = cJSON_ParseWithLength(body.data, body.len);
    assert_str_at(b, "stop_reason", "end_turn");
    assert_true(cJSON_IsNull(at(b, "stop_sequence")));
    assert_int_equal(cJSON_GetArraySize(at(b, "content")), 0);
    cJSON_Delete(b);
    sp_buf_free(&body);

    /* errors in Anthropic's shape */
    sp_buf_clear(&sse);
    sp_api_out_fail(o4, "server_shutdown", "going away", &p, &sse);
    cJSON *f = sse_events(&sse);
    assert_str_at(f, "[0].error.type", "overloaded_error");
    cJSON_Delete(f);
    sp_api_anthropic_error(&body, 401, "no key");
    b = cJSON_ParseWithLength(body.data, body.len);
    assert_str_at(b, "error.type", "authentication_error");
    assert_str_at(b, "error.message", "no key");
    cJSON_Delete(b);
    sp_buf_free(&body);

    cJSON_Delete(ev);
    sp_buf_free(&sse);
    sp_api_out_free(o);
    sp_api_out_free(o2);
    sp_api_out_free(o3);
    sp_api_out_free(o4);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_responses_translate), cmocka_unit_test(test_responses_errors),
        cmocka_unit_test(test_anthropic_translate), cmocka_unit_test(test_params),
        cmocka_unit_test(test_responses_writer),    cmocka_unit_test(test_anthropic_writer),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
