/*
 * Grammars, their matcher and JSON Schema compiled to them: documents in and
 * out of a schema, the token mask against one check per token, and random
 * walks (a random model's choices) that must end in schema-valid JSON.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <cjson/cJSON.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/rng.h"
#include "runtime/grammar.h"
#include "server/constrain.h"
#include "server/jschema.h"

static struct sp_grammar *schema_grammar(const char *schema_json) {
    cJSON *s = cJSON_Parse(schema_json);
    assert_non_null(s);
    struct sp_grammar *g = NULL;
    enum sp_status st = sp_jschema_grammar(s, "schema", &g);
    if (st != SP_OK) fail_msg("schema rejected: %s", sp_error_msg());
    cJSON_Delete(s);
    return g;
}

/* Whether the whole text is a sentence of g. */
static bool accepts(const struct sp_grammar *g, const char *text) {
    struct sp_gmatch *m;
    assert_int_equal(sp_gmatch_new(g, &m), SP_OK);
    bool ok = sp_gmatch_feed(m, text, strlen(text)) && sp_gmatch_accepting(m);
    sp_gmatch_free(m);
    return ok;
}

static void test_builder(void **state) {
    (void)state;
    struct sp_gbuild *b = sp_gb_new();
    int digits = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_range(b, '0', '9');
    sp_gb_ref(b, digits);
    sp_gb_end(b, digits);
    sp_gb_begin(b);
    sp_gb_range(b, '0', '9');
    sp_gb_end(b, digits);
    int root = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_lit(b, "n=");
    sp_gb_ref(b, digits);
    sp_gb_end(b, root);
    struct sp_grammar *g;
    assert_int_equal(sp_gb_finish(b, root, &g), SP_OK);
    struct sp_gmatch *m;
    assert_int_equal(sp_gmatch_new(g, &m), SP_OK);
    assert_false(sp_gmatch_accepting(m));
    assert_true(sp_gmatch_try(m, "n=1", 3));
    assert_false(sp_gmatch_try(m, "n=x", 3));
    assert_false(sp_gmatch_feed(m, "m", 1));  // refused: nothing changes
    assert_true(sp_gmatch_feed(m, "n=", 2));
    assert_false(sp_gmatch_accepting(m));
    assert_true(sp_gmatch_feed(m, "42", 2));
    assert_true(sp_gmatch_accepting(m));
    assert_false(sp_gmatch_done(m));  // more digits may follow
    assert_true(sp_gmatch_feed(m, "7", 1));
    assert_false(sp_gmatch_try(m, "a", 1));
    sp_gmatch_free(m);
    /* a long right-recursive run costs no stack */
    assert_int_equal(sp_gmatch_new(g, &m), SP_OK);
    assert_true(sp_gmatch_feed(m, "n=", 2));
    for (int i = 0; i < 100000; i++) assert_true(sp_gmatch_feed(m, "5", 1));
    assert_true(sp_gmatch_accepting(m));
    sp_gmatch_free(m);
    sp_grammar_free(g);
    /* an alternative left open is an error */
    b = sp_gb_new();
    root = sp_gb_rule(b);
    sp_gb_begin(b);
    assert_int_equal(sp_gb_finish(b, root, &g), SP_ERR_ARG);
}

static void test_left_recursion_is_cut(void **state) {
    (void)state;
    struct sp_gbuild *b = sp_gb_new();
    int r = sp_gb_rule(b);  // r ::= r "a" | "b"
    sp_gb_begin(b);
    sp_gb_ref(b, r);
    sp_gb_lit(b, "a");
    sp_gb_end(b, r);
    sp_gb_begin(b);
    sp_gb_lit(b, "b");
    sp_gb_end(b, r);
    struct sp_grammar *g;
    assert_int_equal(sp_gb_finish(b, r, &g), SP_OK);
    assert_true(accepts(g, "b"));  // terminates; the recursion is cut, not looped
    sp_grammar_free(g);
}

static void test_schema_documents(void **state) {
    (void)state;
    struct sp_grammar *g = schema_grammar(
        "{\"type\":\"object\",\"properties\":{"
        "\"name\":{\"type\":\"string\",\"minLength\":1,\"maxLength\":5},"
        "\"age\":{\"type\":\"integer\",\"minimum\":0},"
        "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"},\"maxItems\":2},"
        "\"kind\":{\"enum\":[\"cat\",\"dog\",null,3]},"
        "\"ok\":{\"type\":[\"boolean\",\"null\"]}},"
        "\"required\":[\"name\",\"age\"],\"additionalProperties\":false}");
    static const char *const good[] = {
        "{\"name\":\"ab\",\"age\":3}",
        " {\n  \"name\": \"\\u00e9t\\\"\",\n  \"age\": 0,\n  \"tags\": [\"x\", \"y\"]\n}",
        "{\"name\":\"\xc3\xa9t\xc3\xa9\",\"age\":12,\"kind\":\"dog\",\"ok\":null}",
        "{\"name\":\"a\",\"age\":1,\"tags\":[],\"kind\":3,\"ok\":true}",
        "{\"name\":\"a\",\"age\":1,\"kind\":null}",
    };
    static const char *const bad[] = {
        "{\"age\":3}",                                  // name is required
        "{\"name\":\"\",\"age\":3}",                    // minLength
        "{\"name\":\"abcdef\",\"age\":3}",              // maxLength
        "{\"name\":\"a\",\"age\":-3}",                  // minimum 0: no sign
        "{\"name\":\"a\",\"age\":3.5}",                 // an integer
        "{\"name\":\"a\",\"age\":03}",                  // no leading zero
        "{\"name\":\"a\",\"age\":1,\"tags\":[\"a\",\"b\",\"c\"]}",  // maxItems
        "{\"name\":\"a\",\"age\":1,\"kind\":\"bird\"}",  // enum
        "{\"name\":\"a\",\"age\":1,\"extra\":1}",       // additionalProperties false
        "{\"age\":1,\"name\":\"a\"}",                   // properties come in order
        "{\"name\":\"a\",\"age\":1,}",                  // trailing comma
        "{\"name\":\"\xc0\xaf\",\"age\":1}",            // overlong UTF-8
        "{\"name\":\"a\nb\",\"age\":1}",                // raw control character
        "{\"name\":\"a\",\"age\":1} x",                 // nothing may follow
    };
    for (size_t i = 0; i < sizeof good / sizeof *good; i++)
        if (!accepts(g, good[i])) fail_msg("refused %s", good[i]);
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        if (accepts(g, bad[i])) fail_msg("accepted %s", bad[i]);
    sp_grammar_free(g);
}

static void test_schema_refs_and_unions(void **state) {
    (void)state;
    /* a recursive tree through $defs, a union of objects and formats */
    struct sp_grammar *g = schema_grammar(
        "{\"$defs\":{\"node\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
        "\"kids\":{\"type\":\"array\",\"items\":{\"$ref\":\"#/$defs/node\"}}},\"required\":[\"v\"],"
        "\"additionalProperties\":false}},"
        "\"type\":\"object\",\"properties\":{\"root\":{\"$ref\":\"#/$defs/node\"},"
        "\"pet\":{\"anyOf\":[{\"type\":\"object\",\"properties\":{\"cat\":{\"const\":true}},\"required\":[\"cat\"],"
        "\"additionalProperties\":false},{\"type\":\"object\",\"properties\":{\"dog\":{\"type\":\"string\"}},"
        "\"required\":[\"dog\"],\"additionalProperties\":false}]},"
        "\"when\":{\"type\":\"string\",\"format\":\"date-time\"},"
        "\"id\":{\"type\":\"string\",\"format\":\"uuid\"}},"
        "\"required\":[\"root\",\"pet\"],\"additionalProperties\":false}");
    assert_true(accepts(g, "{\"root\":{\"v\":1,\"kids\":[{\"v\":-2.5e3,\"kids\":[]},{\"v\":0}]},\"pet\":{\"cat\":true}}"));
    assert_true(accepts(g, "{\"root\":{\"v\":1},\"pet\":{\"dog\":\"rex\"},\"when\":\"2026-12-04T07:37:01.5Z\","
                           "\"id\":\"123e4567-e89b-12d3-a456-426614174000\"}"));
    assert_false(accepts(g, "{\"root\":{\"kids\":[]},\"pet\":{\"cat\":true}}"));
    assert_false(accepts(g, "{\"root\":{\"v\":1},\"pet\":{\"cat\":false}}"));
    assert_false(accepts(g, "{\"root\":{\"v\":1},\"pet\":{\"cat\":true,\"dog\":\"x\"}}"));
    assert_false(accepts(g, "{\"root\":{\"v\":1},\"pet\":{\"dog\":\"x\"},\"when\":\"yesterday\"}"));
    sp_grammar_free(g);
    /* allOf merges objects; an object without properties takes any keys */
    g = schema_grammar("{\"allOf\":[{\"properties\":{\"a\":{\"type\":\"integer\"}},\"required\":[\"a\"]},"
                       "{\"properties\":{\"b\":{\"type\":\"object\"}},\"required\":[\"b\"]}]}");
    assert_true(accepts(g, "{\"a\":1,\"b\":{\"x\":[1,{\"y\":null}],\"z\":\"w\"}}"));
    assert_false(accepts(g, "{\"a\":1}"));
    sp_grammar_free(g);
}

static void test_schema_errors(void **state) {
    (void)state;
    static const char *const bad[] = {
        "{\"$ref\":\"#/$defs/missing\"}",
        "{\"$ref\":\"http://example.com/schema\"}",
        "{\"type\":\"complex\"}",
        "{\"type\":\"object\",\"properties\":{\"a\":{}},\"required\":[\"b\"]}",
        "{\"enum\":[]}",
        "{\"allOf\":[{\"type\":\"string\"},{\"type\":\"integer\"}]}",
        "{\"type\":\"object\",\"properties\":{\"a\":false},\"required\":[\"a\"]}",
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cJSON *s = cJSON_Parse(bad[i]);
        struct sp_grammar *g = NULL;
        if (sp_jschema_grammar(s, "response_format.json_schema.schema", &g) != SP_ERR_ARG)
            fail_msg("accepted the schema %s", bad[i]);
        assert_non_null(strstr(sp_error_msg(), "response_format.json_schema.schema"));
        cJSON_Delete(s);
    }
    /* response_format's own fields */
    char msg[320];
    struct sp_grammar *g = NULL;
    cJSON *rf = cJSON_Parse("{\"type\":\"json_schema\"}");
    assert_false(sp_response_format_grammar(rf, &g, msg, sizeof msg));
    assert_non_null(strstr(msg, "json_schema"));
    cJSON_Delete(rf);
    rf = cJSON_Parse("{\"type\":\"xml\"}");
    assert_false(sp_response_format_grammar(rf, &g, msg, sizeof msg));
    cJSON_Delete(rf);
    rf = cJSON_Parse("{\"type\":\"text\"}");
    assert_true(sp_response_format_grammar(rf, &g, msg, sizeof msg));
    assert_null(g);
    cJSON_Delete(rf);
}

/* ---- token masks and random walks over a small vocabulary ---- */

struct vocab {
    struct sp_buf text;
    int64_t off[600];
    int64_t n;
};

static void vocab_add(struct vocab *v, const char *s, size_t n) {
    v->off[v->n] = (int64_t)v->text.len;
    sp_buf_append(&v->text, s, n);
    v->off[++v->n] = (int64_t)v->text.len;
}

/* Closers and short structure first (walks prefer low ids), then every
 * byte, then longer pieces. */
static void make_vocab(struct vocab *v) {
    memset(v, 0, sizeof *v);
    static const char *const pieces[] = {"\"", "}", "]", ",", ":", "0", "1", "true", "null", "false", "{\"", "\":",
                                         "\": ", ", \"", "[", "{", "\n  ", " ", "ab", "\\n", "\\u00e9", "-", ".5",
                                         "e+3", "\xc3\xa9", "\xe2\x82\xac", "cat", "dog", "rex", "\"name\"", "12"};
    for (size_t i = 0; i < sizeof pieces / sizeof *pieces; i++) vocab_add(v, pieces[i], strlen(pieces[i]));
    for (int c = 1; c < 256; c++) {
        char b = (char)c;
        vocab_add(v, &b, 1);
    }
}

static void test_mask_matches_checks(void **state) {
    (void)state;
    struct vocab v;
    make_vocab(&v);
    struct sp_gtrie *t;
    assert_int_equal(sp_gtrie_new(v.text.data, v.off, v.n, &t), SP_OK);
    struct sp_grammar *g = schema_grammar("{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"},"
                                          "\"n\":{\"type\":\"array\",\"items\":{\"type\":\"number\"}}}}");
    struct sp_gmatch *m;
    assert_int_equal(sp_gmatch_new(g, &m), SP_OK);
    static const char *const steps[] = {"{", "\"name\"", ": ", "\"a", "\xc3\xa9", "\\n", "\"", ",", "\"n\":", "[", "1", ".5", ","};
    uint8_t ok[600];
    for (size_t k = 0; k <= sizeof steps / sizeof *steps; k++) {
        int64_t count = sp_gmatch_allowed(m, t, ok), n = 0;
        for (int64_t i = 0; i < v.n; i++) {
            bool one = sp_gmatch_try(m, v.text.data + v.off[i], (size_t)(v.off[i + 1] - v.off[i]));
            if (one != (ok[i] != 0)) fail_msg("step %zu: token %lld: mask %d, check %d", k, (long long)i, ok[i], one);
            n += one;
        }
        assert_int_equal(count, n);
        assert_true(n > 0);
        if (k < sizeof steps / sizeof *steps) assert_true(sp_gmatch_feed(m, steps[k], strlen(steps[k])));
    }
    sp_gmatch_free(m);
    sp_grammar_free(g);
    sp_gtrie_free(t);
    sp_buf_free(&v.text);
}

/* A minimal validator for the schemas of the walks below. */
static bool valid(const cJSON *x, const cJSON *s, const cJSON *root) {
    const cJSON *ref = cJSON_GetObjectItem(s, "$ref");
    if (ref) return valid(x, cJSON_GetObjectItem(cJSON_GetObjectItem(root, "$defs"), strrchr(ref->valuestring, '/') + 1), root);
    const cJSON *en = cJSON_GetObjectItem(s, "enum");
    if (en) {
        for (const cJSON *e = en->child; e; e = e->next)
            if (cJSON_Compare(e, x, true)) return true;
        return false;
    }
    const cJSON *any = cJSON_GetObjectItem(s, "anyOf");
    if (any) {
        for (const cJSON *a = any->child; a; a = a->next)
            if (valid(x, a, root)) return true;
        return false;
    }
    const char *type = cJSON_GetStringValue(cJSON_GetObjectItem(s, "type"));
    if (!type) return true;
    if (!strcmp(type, "string")) {
        if (!cJSON_IsString(x)) return false;
        const cJSON *mx = cJSON_GetObjectItem(s, "maxLength");
        size_t chars = 0;
        for (const unsigned char *p = (const unsigned char *)x->valuestring; *p; p++) chars += (*p & 0xc0) != 0x80;
        return !mx || chars <= (size_t)mx->valueint;
    }
    if (!strcmp(type, "integer")) return cJSON_IsNumber(x) && x->valuedouble == (double)(int64_t)x->valuedouble;
    if (!strcmp(type, "number")) return cJSON_IsNumber(x);
    if (!strcmp(type, "boolean")) return cJSON_IsBool(x);
    if (!strcmp(type, "array")) {
        if (!cJSON_IsArray(x)) return false;
        const cJSON *mn = cJSON_GetObjectItem(s, "minItems"), *mx = cJSON_GetObjectItem(s, "maxItems");
        int n = cJSON_GetArraySize(x);
        if ((mn && n < mn->valueint) || (mx && n > mx->valueint)) return false;
        for (const cJSON *e = x->child; e; e = e->next)
            if (!valid(e, cJSON_GetObjectItem(s, "items"), root)) return false;
        return true;
    }
    if (!cJSON_IsObject(x)) return false;
    const cJSON *props = cJSON_GetObjectItem(s, "properties");
    for (const cJSON *r = cJSON_GetObjectItem(s, "required")->child; r; r = r->next)
        if (!cJSON_GetObjectItem(x, r->valuestring)) return false;
    for (const cJSON *e = x->child; e; e = e->next) {
        const cJSON *ps = cJSON_GetObjectItem(props, e->string);
        if (!ps || !valid(e, ps, root)) return false;
    }
    return true;
}

static void test_random_walks_are_valid(void **state) {
    (void)state;
    struct vocab v;
    make_vocab(&v);
    struct sp_gtrie *t;
    assert_int_equal(sp_gtrie_new(v.text.data, v.off, v.n, &t), SP_OK);
    static const char *const schemas[] = {
        "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\",\"maxLength\":6},"
        "\"age\":{\"type\":\"integer\"},\"pets\":{\"type\":\"array\",\"minItems\":1,\"maxItems\":3,"
        "\"items\":{\"enum\":[\"cat\",\"dog\",null]}},\"ok\":{\"type\":\"boolean\"}},"
        "\"required\":[\"name\",\"age\",\"pets\"],\"additionalProperties\":false}",
        "{\"$defs\":{\"n\":{\"type\":\"object\",\"properties\":{\"v\":{\"type\":\"number\"},"
        "\"k\":{\"type\":\"array\",\"maxItems\":2,\"items\":{\"$ref\":\"#/$defs/n\"}}},\"required\":[\"v\"],"
        "\"additionalProperties\":false}},\"type\":\"object\",\"properties\":{\"t\":{\"$ref\":\"#/$defs/n\"},"
        "\"u\":{\"anyOf\":[{\"type\":\"string\",\"maxLength\":3},{\"type\":\"integer\"}]}},"
        "\"required\":[\"t\",\"u\"],\"additionalProperties\":false}",
    };
    uint8_t ok[600];
    int64_t allowed[600];
    for (size_t si = 0; si < sizeof schemas / sizeof *schemas; si++) {
        cJSON *schema = cJSON_Parse(schemas[si]);
        struct sp_grammar *g = schema_grammar(schemas[si]);
        struct sp_rng rng;
        sp_rng_seed(&rng, 7 + si);
        for (int walk = 0; walk < 50; walk++) {
            struct sp_gmatch *m;
            assert_int_equal(sp_gmatch_new(g, &m), SP_OK);
            struct sp_buf out = SP_BUF_INIT;
            int steps = 0;
            while (!sp_gmatch_done(m) && steps++ < 3000) {
                if (sp_gmatch_accepting(m) && (uint32_t)sp_rng_next(&rng) % 4 == 0) break;  // the end of sequence
                int64_t n = 0;
                sp_gmatch_allowed(m, t, ok);
                for (int64_t i = 0; i < v.n; i++)
                    if (ok[i]) allowed[n++] = i;
                assert_true(n > 0);  // a sentence can always be finished
                /* lean towards closing: half the time the lowest id */
                int64_t pick = (uint32_t)sp_rng_next(&rng) % 2 ? allowed[0] : allowed[(uint32_t)sp_rng_next(&rng) % (uint32_t)n];
                size_t len = (size_t)(v.off[pick + 1] - v.off[pick]);
                assert_true(sp_gmatch_feed(m, v.text.data + v.off[pick], len));
                sp_buf_append(&out, v.text.data + v.off[pick], len);
            }
            assert_true(sp_gmatch_accepting(m));
            sp_buf_putc(&out, 0);
            cJSON *doc = cJSON_Parse(out.data);
            if (!doc || !valid(doc, schema, schema)) fail_msg("schema %zu, walk %d: not valid: %s", si, walk, out.data);
            cJSON_Delete(doc);
            sp_buf_free(&out);
            sp_gmatch_free(m);
        }
        sp_grammar_free(g);
        cJSON_Delete(schema);
    }
    sp_gtrie_free(t);
    sp_buf_free(&v.text);
}

static void test_tool_call_grammars(void **state) {
    (void)state;
    cJSON *tools = cJSON_Parse(
        "[{\"type\":\"function\",\"function\":{\"name\":\"get_weather\",\"parameters\":{\"type\":\"object\","
        "\"properties\":{\"city\":{\"type\":\"string\"},\"days\":{\"type\":\"integer\"}},\"required\":[\"city\"]}}},"
        "{\"type\":\"function\",\"function\":{\"name\":\"ping\"}}]");
    char msg[320];
    struct sp_grammar *g;
    /* Hermes, no name: one of the names, then that tool's arguments */
    assert_true(sp_tool_call_grammar(SP_CHAT_FORMAT_HERMES, tools, NULL, &g, msg, sizeof msg));
    assert_true(accepts(g, "get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 3}"));
    assert_true(accepts(g, "ping\", \"arguments\": {}"));
    assert_false(accepts(g, "pong\", \"arguments\": {}"));
    assert_false(accepts(g, "get_weather\", \"arguments\": {\"days\": 3}"));
    sp_grammar_free(g);
    /* named: the arguments only */
    assert_true(sp_tool_call_grammar(SP_CHAT_FORMAT_HARMONY, tools, "get_weather", &g, msg, sizeof msg));
    assert_true(accepts(g, "{\"city\":\"Oslo\"}"));
    assert_false(accepts(g, "{\"town\":\"Oslo\"}"));
    sp_grammar_free(g);
    assert_true(sp_tool_call_grammar(SP_CHAT_FORMAT_HARMONY, tools, NULL, &g, msg, sizeof msg));
    assert_true(accepts(g, "get_weather <|constrain|>json<|message|>{\"city\":\"Oslo\"}"));
    sp_grammar_free(g);
    /* Qwen3-Coder: XML parameters, raw text for strings */
    assert_true(sp_tool_call_grammar(SP_CHAT_FORMAT_QWEN3_CODER, tools, NULL, &g, msg, sizeof msg));
    assert_true(accepts(g, "get_weather>\n<parameter=city>\nNew York\n</parameter>\n<parameter=days>\n2\n</parameter>\n"));
    assert_false(accepts(g, "get_weather>\n<parameter=days>\n2\n</parameter>\n"));
    assert_false(accepts(g, "get_weather>\n<parameter=city>\nX\n</parameter>\n<parameter=days>\ntwo\n</parameter>\n"));
    sp_grammar_free(g);
    assert_false(sp_tool_call_grammar(SP_CHAT_FORMAT_PLAIN, tools, NULL, &g, msg, sizeof msg));
    cJSON_Delete(tools);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_builder),
        cmocka_unit_test(test_left_recursion_is_cut),
        cmocka_unit_test(test_schema_documents),
        cmocka_unit_test(test_schema_refs_and_unions),
        cmocka_unit_test(test_schema_errors),
        cmocka_unit_test(test_mask_matches_checks),
        cmocka_unit_test(test_random_walks_are_valid),
        cmocka_unit_test(test_tool_call_grammars),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
