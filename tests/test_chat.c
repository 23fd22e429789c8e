/*
 * test_chat.c - chat templates of real models rendered byte for byte.
 *
 * Every conversation in tests/data/templates/conversations/ is rendered with
 * every model folder in tests/data/templates/models/ and compared with the
 * reference in tests/data/templates/expected/<model>/: <name>.txt (or
 * <name>.error.txt when the reference refused) made by @huggingface/jinja
 * (tools/template_refs.mjs), overridden by <name>.jinja2[.error].txt where
 * Python's jinja2 - what transformers uses - disagrees with it
 * (tools/template_refs.py). Also covers how a model folder's template and
 * special tokens are found.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"
#include "template/chat.h"

#define DATA      "tests/data/templates"
#define FIXED_NOW 1768435200 // 2026-01-15T00:00:00Z, the date the references were made with

static char *read_opt(const char *path, size_t *len) {
    char *s = NULL;
    if (!sp_path_is_file(path)) return NULL;
    if (sp_read_file(path, 1 << 24, &s, len) != SP_OK) return NULL;
    return s;
}

/* Renders every conversation with one model; returns the number of mismatches. */
static int check_model(const char *model) {
    char dir[512], path[1024];
    snprintf(dir, sizeof dir, DATA "/models/%s", model);
    struct sp_chat_template *ct;
    if (sp_chat_template_load(dir, NULL, &ct) != SP_OK) {
        print_error("%s: %s\n", model, sp_error_msg());
        return 1;
    }
    ct->opts.now = FIXED_NOW;
    ct->opts.utc = true;
    char **convs;
    size_t n_convs;
    assert_int_equal(sp_dir_list(DATA "/conversations", ".json", &convs, &n_convs), SP_OK);
    assert_true(n_convs >= 20);
    int bad = 0, checked = 0;
    for (size_t i = 0; i < n_convs; i++) {
        snprintf(path, sizeof path, DATA "/conversations/%s", convs[i]);
        cJSON *conv;
        assert_int_equal(sp_json_parse_file(path, 1 << 24, &conv), SP_OK);
        const cJSON *agp = cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt");
        struct sp_chat_request req = {
            .messages = cJSON_GetObjectItemCaseSensitive(conv, "messages"),
            .tools = cJSON_GetObjectItemCaseSensitive(conv, "tools"),
            .add_generation_prompt = !agp || cJSON_IsTrue(agp),
            .kwargs = cJSON_GetObjectItemCaseSensitive(conv, "kwargs"),
        };
        char base[900];
        snprintf(base, sizeof base, DATA "/expected/%s/%.*s", model, (int)(strlen(convs[i]) - 5), convs[i]);
        size_t exp_len = 0;
        char *expected = NULL, *expected_err = NULL;
        snprintf(path, sizeof path, "%s.jinja2.txt", base);
        expected = read_opt(path, &exp_len);
        if (!expected) {
            snprintf(path, sizeof path, "%s.jinja2.error.txt", base);
            expected_err = read_opt(path, &exp_len);
        }
        if (!expected && !expected_err) {
            snprintf(path, sizeof path, "%s.txt", base);
            expected = read_opt(path, &exp_len);
        }
        if (!expected && !expected_err) {
            snprintf(path, sizeof path, "%s.error.txt", base);
            expected_err = read_opt(path, &exp_len);
        }
        if (!expected && !expected_err) {
            print_error("%s: no reference for %s\n", model, convs[i]);
            bad++;
            cJSON_Delete(conv);
            continue;
        }
        char *out = NULL;
        size_t len = 0;
        enum sp_status st = sp_chat_render(ct, &req, &out, &len);
        checked++;
        if (expected) {
            if (st != SP_OK) {
                print_error("%s / %s: render failed: %s\n", model, convs[i], sp_error_msg());
                bad++;
            } else if (len != exp_len || memcmp(out, expected, len) != 0) {
                size_t at = 0;
                while (at < len && at < exp_len && out[at] == expected[at]) at++;
                print_error("%s / %s: differs at byte %zu (got %zu bytes, want %zu)\n  got:  %.60s\n  want: %.60s\n",
                            model, convs[i], at, len, exp_len, out + at, expected + at);
                bad++;
            }
        } else if (st == SP_OK) {
            print_error("%s / %s: rendered, but the reference refused: %s", model, convs[i], expected_err);
            bad++;
        } else if (strstr(sp_error_msg(), "raise_exception: ")) {
            // The template raised on purpose: the same message must come through.
            char *nl = strchr(expected_err, '\n');
            if (nl) *nl = 0;
            if (!strstr(sp_error_msg(), expected_err)) {
                print_error("%s / %s: error '%s', want '%s'\n", model, convs[i], sp_error_msg(), expected_err);
                bad++;
            }
        }
        sp_free(out);
        sp_free(expected);
        sp_free(expected_err);
        cJSON_Delete(conv);
    }
    assert_int_equal(checked, (int)n_convs);
    sp_strv_free(convs, n_convs);
    sp_chat_template_free(ct);
    return bad;
}

#define MODEL_TEST(fn, name)                                                                                           \
    static void fn(void **state) {                                                                                     \
        (void)state;                                                                                                   \
        assert_int_equal(check_model(name), 0);                                                                        \
    }
MODEL_TEST(test_qwen3, "Qwen3-0.6B")
MODEL_TEST(test_qwen35, "Qwen3.5-4B")
MODEL_TEST(test_qwen3_coder, "Qwen3-Coder")
MODEL_TEST(test_gpt_oss, "gpt-oss-120b")
MODEL_TEST(test_llama31, "Llama-3.1-8B-Instruct")
MODEL_TEST(test_deepseek_v31, "DeepSeek-V3.1")
MODEL_TEST(test_ling2, "Ling-2.0")

/* Every model folder under models/ has a test above. */
static void test_all_models_covered(void **state) {
    (void)state;
    static const char *const known[] = {
        "Qwen3-0.6B",    "Qwen3.5-4B", "Qwen3-Coder", "gpt-oss-120b", "Llama-3.1-8B-Instruct",
        "DeepSeek-V3.1", "Ling-2.0"};
    for (size_t i = 0; i < sizeof known / sizeof known[0]; i++) {
        char p[512];
        snprintf(p, sizeof p, DATA "/models/%s", known[i]);
        assert_true(sp_path_is_dir(p));
    }
}

static void test_special_tokens(void **state) {
    (void)state;
    struct sp_chat_template *ct;
    assert_int_equal(sp_chat_template_load(DATA "/models/DeepSeek-V3.1", NULL, &ct), SP_OK);
    assert_string_equal(ct->bos_token, "<｜begin▁of▁sentence｜>"); // {"content": ...} form
    assert_string_equal(ct->eos_token, "<｜end▁of▁sentence｜>");
    sp_chat_template_free(ct);
    assert_int_equal(sp_chat_template_load(DATA "/models/Qwen3-0.6B", NULL, &ct), SP_OK);
    assert_null(ct->bos_token); // null in the config
    assert_string_equal(ct->eos_token, "<|im_end|>");
    sp_chat_template_free(ct);
    assert_int_equal(sp_chat_template_load(DATA "/models/Ling-2.0", NULL, &ct), SP_OK);
    assert_string_equal(ct->bos_token, "<|startoftext|>");
    assert_non_null(strstr(ct->source, "detailed thinking")); // from tokenizer_config.json
    sp_chat_template_free(ct);
}

/* A temporary model folder holding one file. */
static void write_model(char *dir, size_t dir_size, const char *file, const char *text) {
    snprintf(dir, dir_size, "/tmp/sp_test_chat_%d", (int)getpid());
    assert_int_equal(sp_mkdirs(dir), SP_OK);
    char *p = sp_path_join(dir, file);
    assert_int_equal(sp_write_file(p, text, strlen(text)), SP_OK);
    sp_free(p);
}

static void remove_model(const char *dir, const char *file) {
    char *p = sp_path_join(dir, file);
    unlink(p);
    sp_free(p);
    rmdir(dir);
}

static void test_named_templates(void **state) {
    (void)state;
    char dir[256];
    write_model(dir, sizeof dir, "tokenizer_config.json",
                "{\"chat_template\": [{\"name\": \"default\", \"template\": \"D{{ messages|length }}\"},"
                " {\"name\": \"tool_use\", \"template\": \"T{{ tools|length }}\"}], \"eos_token\": \"</s>\"}");
    struct sp_chat_template *ct;
    cJSON *msgs = cJSON_Parse("[{\"role\":\"user\",\"content\":\"x\"}]");
    cJSON *tools = cJSON_Parse("[{\"type\":\"function\"},{\"type\":\"function\"}]");
    struct sp_chat_request req = {.messages = msgs, .tools = tools};
    char *out;
    assert_int_equal(sp_chat_template_load(dir, NULL, &ct), SP_OK);
    assert_string_equal(ct->name, "default");
    assert_int_equal(sp_chat_render(ct, &req, &out, NULL), SP_OK);
    assert_string_equal(out, "D1");
    sp_free(out);
    sp_chat_template_free(ct);
    assert_int_equal(sp_chat_template_load(dir, "tool_use", &ct), SP_OK);
    assert_string_equal(ct->name, "tool_use");
    assert_int_equal(sp_chat_render(ct, &req, &out, NULL), SP_OK);
    assert_string_equal(out, "T2");
    sp_free(out);
    sp_chat_template_free(ct);
    assert_int_equal(sp_chat_template_load(dir, "rag", &ct), SP_ERR_NOT_FOUND);
    assert_null(ct);
    remove_model(dir, "tokenizer_config.json");
    cJSON_Delete(msgs);
    cJSON_Delete(tools);
}

static void test_missing_and_broken(void **state) {
    (void)state;
    char dir[256];
    struct sp_chat_template *ct;
    write_model(dir, sizeof dir, "tokenizer_config.json", "{\"eos_token\": \"</s>\"}");
    assert_int_equal(sp_chat_template_load(dir, NULL, &ct), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "no chat_template"));
    remove_model(dir, "tokenizer_config.json");
    write_model(dir, sizeof dir, "chat_template.jinja", "{% for m in messages %}{{ m.content }}");
    assert_int_equal(sp_chat_template_load(dir, NULL, &ct), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "endfor"));
    remove_model(dir, "chat_template.jinja");
}

/* kwargs reach the template as variables; messages must be an array. */
static void test_render_variables(void **state) {
    (void)state;
    const char *src = "{{ bos_token }}|{{ tools is none }}|{{ add_generation_prompt }}|{{ enable_thinking }}";
    struct sp_chat_template *ct;
    assert_int_equal(sp_chat_template_from_string(src, strlen(src), "<s>", NULL, &ct), SP_OK);
    cJSON *msgs = cJSON_Parse("[]"), *kw = cJSON_Parse("{\"enable_thinking\": false}");
    struct sp_chat_request req = {.messages = msgs, .add_generation_prompt = true, .kwargs = kw};
    char *out;
    size_t len;
    assert_int_equal(sp_chat_render(ct, &req, &out, &len), SP_OK);
    assert_string_equal(out, "<s>|True|True|False");
    assert_int_equal(len, strlen(out));
    sp_free(out);
    req.messages = kw;
    assert_int_equal(sp_chat_render(ct, &req, &out, &len), SP_ERR_ARG);
    assert_null(out);
    sp_chat_template_free(ct);
    cJSON_Delete(msgs);
    cJSON_Delete(kw);
}

/* The "function" object of the first tool call of message i. */
static cJSON *call_function(cJSON *conv, int i) {
    cJSON *msg = cJSON_GetArrayItem(cJSON_GetObjectItem(conv, "messages"), i);
    return cJSON_GetObjectItem(cJSON_GetArrayItem(cJSON_GetObjectItem(msg, "tool_calls"), 0), "function");
}

/* With parse_tool_arguments, arguments sent as JSON text render as the
 * object they hold: templates that iterate them (Qwen3-Coder) then work. */
static void test_parse_tool_arguments(void **state) {
    (void)state;
    struct sp_chat_template *ct;
    assert_int_equal(sp_chat_template_load(DATA "/models/Qwen3-Coder", NULL, &ct), SP_OK);
    cJSON *as_text;
    assert_int_equal(sp_json_parse_file(DATA "/conversations/14_tool_call_string_args.json", 1 << 20, &as_text), SP_OK);
    cJSON *as_object = cJSON_Duplicate(as_text, true);
    const cJSON *text_args = cJSON_GetObjectItem(call_function(as_text, 1), "arguments");
    assert_true(cJSON_IsString(text_args));
    cJSON_ReplaceItemInObject(call_function(as_object, 1), "arguments", cJSON_Parse(text_args->valuestring));
    struct sp_chat_request req = {.messages = cJSON_GetObjectItem(as_text, "messages"),
                                  .tools = cJSON_GetObjectItem(as_text, "tools"),
                                  .add_generation_prompt = true};
    char *a, *b;
    assert_int_equal(sp_chat_render(ct, &req, &a, NULL), SP_ERR_ARG); // `arguments|items` on text, as in transformers
    req.parse_tool_arguments = true;
    assert_int_equal(sp_chat_render(ct, &req, &a, NULL), SP_OK);
    assert_non_null(strstr(a, "<parameter=city>\nOslo\n</parameter>"));
    req.messages = cJSON_GetObjectItem(as_object, "messages");
    req.parse_tool_arguments = false;
    assert_int_equal(sp_chat_render(ct, &req, &b, NULL), SP_OK);
    assert_string_equal(a, b);
    assert_true(cJSON_IsString(cJSON_GetObjectItem(call_function(as_text, 1), "arguments"))); // caller's tree untouched
    sp_free(a);
    sp_free(b);
    cJSON_Delete(as_text);
    cJSON_Delete(as_object);
    sp_chat_template_free(ct);
}

/* Renders a conversation file with a model and the given normalizations. */
static enum sp_status render_file(const char *model, const char *conv, bool nulls, bool parts, char **out) {
    char dir[256], path[256];
    snprintf(dir, sizeof dir, DATA "/models/%s", model);
    snprintf(path, sizeof path, DATA "/conversations/%s.json", conv);
    struct sp_chat_template *ct;
    assert_int_equal(sp_chat_template_load(dir, NULL, &ct), SP_OK);
    cJSON *c;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &c), SP_OK);
    struct sp_chat_request req = {.messages = cJSON_GetObjectItem(c, "messages"),
                                  .tools = cJSON_GetObjectItem(c, "tools"),
                                  .add_generation_prompt =
                                      cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")),
                                  .null_content_as_empty = nulls,
                                  .flatten_content_parts = parts};
    enum sp_status st = sp_chat_render(ct, &req, out, NULL);
    cJSON_Delete(c);
    sp_chat_template_free(ct);
    return st;
}

/* Which templates take content as a list of parts, and the two content
 * normalizations an OpenAI server applies for the others. */
static void test_content_normalization(void **state) {
    (void)state;
    static const struct {
        const char *model;
        bool parts;
    } kinds[] = {{"Qwen3-0.6B", false},           {"Qwen3.5-4B", true},     {"Qwen3-Coder", false},
                 {"gpt-oss-120b", false},         {"DeepSeek-V3.1", false}, {"Ling-2.0", false},
                 {"Llama-3.1-8B-Instruct", false}};
    for (size_t i = 0; i < sizeof kinds / sizeof kinds[0]; i++) {
        char dir[256];
        snprintf(dir, sizeof dir, DATA "/models/%s", kinds[i].model);
        struct sp_chat_template *ct;
        assert_int_equal(sp_chat_template_load(dir, NULL, &ct), SP_OK);
        if (ct->content_parts != kinds[i].parts) fail_msg("%s: content_parts %d", kinds[i].model, ct->content_parts);
        sp_chat_template_free(ct);
    }
    char *out = NULL;
    // Text parts joined for Qwen3, which concatenates content as a string.
    assert_int_equal(render_file("Qwen3-0.6B", "17_content_parts", false, false, &out), SP_ERR_ARG);
    assert_int_equal(render_file("Qwen3-0.6B", "17_content_parts", false, true, &out), SP_OK);
    assert_string_equal(out, "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nDescribe \na cat.<|im_end|>\n"
                             "<|im_start|>assistant\n");
    sp_free(out);
    // Qwen3.5 handles parts itself: flattening leaves its reference output.
    size_t len;
    char *want;
    assert_int_equal(sp_read_file(DATA "/expected/Qwen3.5-4B/17_content_parts.txt", 1 << 20, &want, &len), SP_OK);
    assert_int_equal(render_file("Qwen3.5-4B", "17_content_parts", false, true, &out), SP_OK);
    assert_string_equal(out, want);
    sp_free(out);
    sp_free(want);
    // A null content beside tool calls.
    assert_int_equal(render_file("Qwen3-0.6B", "32_assistant_null_content", false, false, &out), SP_ERR_ARG);
    assert_int_equal(render_file("Qwen3-0.6B", "32_assistant_null_content", true, false, &out), SP_OK);
    assert_non_null(strstr(out, "<|im_start|>assistant\n<tool_call>\n{\"name\": \"get_time\""));
    sp_free(out);
}

int main(void) {
    sp_mem_hook_cjson();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_qwen3),
        cmocka_unit_test(test_qwen35),
        cmocka_unit_test(test_qwen3_coder),
        cmocka_unit_test(test_gpt_oss),
        cmocka_unit_test(test_llama31),
        cmocka_unit_test(test_deepseek_v31),
        cmocka_unit_test(test_ling2),
        cmocka_unit_test(test_all_models_covered),
        cmocka_unit_test(test_special_tokens),
        cmocka_unit_test(test_named_templates),
        cmocka_unit_test(test_missing_and_broken),
        cmocka_unit_test(test_render_variables),
        cmocka_unit_test(test_parse_tool_arguments),
        cmocka_unit_test(test_content_normalization),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
