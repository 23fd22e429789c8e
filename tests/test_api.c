/*
 * test_api.c - the public C API (include/sparrow.h) on the tiny fixture
 * models of tests/fixtures/: greedy generation gives the ids the engine
 * gives when driven directly (and, where the margin is wide, those of the
 * reference implementation in ref.json); text, chat and stop strings on a
 * fixture given a byte-level tokenizer and a chat template; bad input
 * answered with a status and a message, never a crash.
 */
#include "helpers.h"

#include <stdbool.h>

#include "core/json.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "sparrow.h"

#define N_GEN 16

static const char *const archs[] = {"llama", "qwen3", "qwen3_moe", "gpt_oss", "bailing_moe"};

/* Every context of these tests: small, two threads, float KV. */
static const struct sparrow_context_params ctx_params = {.n_ctx = 64, .n_threads = 2, .kv_type = "f32"};

/* The first n ints of a ref.json array. */
/* An integer field of the fixture's ref.json. */
static int64_t ref_int(const char *arch, const char *key) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s/ref/ref.json", arch);
    cJSON *j;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &j), SP_OK);
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, key);
    assert_true(cJSON_IsNumber(v));
    int64_t n = (int64_t)v->valuedouble;
    cJSON_Delete(j);
    return n;
}

static int64_t ref_ints(const char *arch, const char *key, int32_t *out, int64_t cap) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s/ref/ref.json", arch);
    cJSON *j;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &j), SP_OK);
    int64_t n = 0;
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, key);
    assert_non_null(a);
    for (const cJSON *e = a->child; e && n < cap; e = e->next) out[n++] = (int32_t)e->valuedouble;
    cJSON_Delete(j);
    return n;
}

/* A failing call: the status wanted, and a message that says something
 * specific (it contains needle). */
#define EXPECT_ERROR(call, want, needle)                                                                               \
    do {                                                                                                               \
        enum sparrow_status st_ = (call);                                                                              \
        if (st_ != (want)) fail_msg("%s: got %s, want %s", #call, sparrow_status_str(st_), sparrow_status_str(want));  \
        if (!strstr(sparrow_last_error(), (needle)))                                                                   \
            fail_msg("%s: message \"%s\" does not mention \"%s\"", #call, sparrow_last_error(), (needle));             \
    } while (0)

/* What the stream callback saw. */
struct seen {
    int32_t ids[256];
    int64_t n_ids;
    struct sp_buf text;
    int calls;
    int stop_after; // > 0: return false on that call
};

static bool collect(const char *text, size_t len, const int32_t *ids, int64_t n_ids, void *user) {
    struct seen *s = user;
    assert_true(s->n_ids + n_ids <= 256);
    memcpy(s->ids + s->n_ids, ids, (size_t)n_ids * sizeof *ids);
    s->n_ids += n_ids;
    sp_buf_append(&s->text, text, len);
    s->calls++;
    return s->stop_after <= 0 || s->calls < s->stop_after;
}

/* The engine driven directly, greedy, without the API: the ids it samples. */
static int64_t engine_greedy(const char *dir, const int32_t *prompt, int64_t n, int64_t max_tokens, int32_t *out) {
    struct sp_model *m;
    if (sp_model_open(dir, &m) != SP_OK) fail_msg("%s", sp_error_msg());
    struct sp_engine_params ep = {.n_slots = 1, .n_ctx = ctx_params.n_ctx, .n_threads = 2, .kv_type = SP_KV_F32};
    struct sp_engine *e;
    if (sp_engine_create(m, NULL, &ep, &e) != SP_OK) fail_msg("%s", sp_error_msg());
    struct sp_gen_params gp = {.max_tokens = max_tokens, .ignore_eos = true, .top_logprobs = 0};
    gp.sampling = sp_sampler_defaults();
    gp.sampling.temp = 0;
    struct sp_req *r;
    assert_int_equal(sp_engine_submit(e, prompt, n, &gp, &r), SP_OK);
    struct sp_buf text = SP_BUF_INIT;
    struct sp_tok_list toks = {0};
    struct sp_req_progress p;
    do sp_req_poll(r, 100, &text, &toks, &p);
    while (!p.finished);
    assert_int_equal(p.finish, SP_FINISH_LENGTH);
    for (int64_t i = 0; i < toks.n; i++) out[i] = toks.v[i].id;
    int64_t got = toks.n;
    sp_tok_list_free(&toks);
    sp_buf_free(&text);
    sp_req_release(r);
    sp_engine_free(e);
    sp_model_close(m);
    return got;
}

static void test_greedy_ids(void **state) {
    for (size_t a = 0; a < sizeof archs / sizeof *archs; a++) {
        char dir[256];
        snprintf(dir, sizeof dir, "tests/fixtures/%s", archs[a]);
        int32_t prompt[16];
        int64_t n = ref_ints(archs[a], "tokens_a", prompt, 16);
        assert_int_equal(n, 16);

        struct sparrow_model *model;
        if (sparrow_model_open(dir, NULL, &model) != SPARROW_OK) fail_msg("%s: %s", dir, sparrow_last_error());
        struct sparrow_model_info info;
        sparrow_model_info(model, &info);
        assert_string_equal(info.architecture, archs[a]);
        assert_int_equal(info.vocab_size, ref_int(archs[a], "vocab"));
        assert_false(info.has_tokenizer);
        struct sparrow_context *ctx;
        if (sparrow_context_create(model, &ctx_params, &ctx) != SPARROW_OK) fail_msg("%s", sparrow_last_error());
        struct sparrow_gen_params gp = {.max_tokens = N_GEN, .ignore_eos = true}; // zeroed: greedy
        struct seen seen = {0};
        struct sparrow_result res;
        if (sparrow_generate_tokens(ctx, prompt, n, &gp, collect, &seen, &res) != SPARROW_OK)
            fail_msg("%s: %s", archs[a], sparrow_last_error());
        assert_int_equal(res.finish, SPARROW_FINISH_LENGTH);
        assert_int_equal(res.prompt_tokens, n);
        assert_int_equal(res.n_tokens, N_GEN);
        assert_int_equal(seen.n_ids, N_GEN);
        assert_memory_equal(seen.ids, res.ids, N_GEN * sizeof(int32_t));
        assert_non_null(res.text);
        assert_int_equal(res.text_len, 0); // no tokenizer: ids only

        int32_t want[N_GEN];
        assert_int_equal(engine_greedy(dir, prompt, n, N_GEN, want), N_GEN);
        for (int i = 0; i < N_GEN; i++)
            if (res.ids[i] != want[i])
                fail_msg("%s: greedy token %d is %d through the API, %d through the engine", archs[a], i, res.ids[i],
                         want[i]);

        /* The same prompt again on the same context: its KV is reused, the ids are the same. */
        struct sparrow_result again;
        assert_int_equal(sparrow_generate_tokens(ctx, prompt, n, &gp, NULL, NULL, &again), SPARROW_OK);
        assert_true(again.cached_tokens > 0);
        assert_memory_equal(again.ids, res.ids, N_GEN * sizeof(int32_t));
        sparrow_result_clear(&again);
        sparrow_result_clear(&res);
        assert_null(res.ids);
        sp_buf_free(&seen.text);
        sparrow_context_free(ctx);
        sparrow_model_close(model);
    }
}

/* qwen3's greedy continuation wins by a margin of 4.6 logits in the
 * reference, far beyond any kernel set's rounding: the API must give it. */
static void test_reference_continuation(void **state) {
    int32_t prompt[16], want[32];
    int64_t n = ref_ints("qwen3", "tokens_a", prompt, 16);
    assert_int_equal(ref_ints("qwen3", "greedy_a", want, 32), 32);
    struct sparrow_model *model;
    assert_int_equal(sparrow_model_open("tests/fixtures/qwen3", NULL, &model), SPARROW_OK);
    struct sparrow_context *ctx;
    assert_int_equal(sparrow_context_create(model, &ctx_params, &ctx), SPARROW_OK);
    struct sparrow_gen_params gp = {.max_tokens = 8, .ignore_eos = true};
    struct sparrow_result res;
    assert_int_equal(sparrow_generate_tokens(ctx, prompt, n, &gp, NULL, NULL, &res), SPARROW_OK);
    assert_int_equal(res.n_tokens, 8);
    for (int i = 0; i < 8; i++)
        if (res.ids[i] != want[i]) fail_msg("greedy token %d is %d, the reference's %d", i, res.ids[i], want[i]);
    sparrow_result_clear(&res);
    sparrow_context_free(ctx);
    sparrow_model_close(model);
}

/* ---- a fixture with a tokenizer and a chat template ---- */

/* Ids 0 and 1 are the special tokens, 2..255 the bytes of those values
 * (byte fallback), so every text of bytes >= 2 encodes to its bytes. */
static void write_tokenizer(const char *dir) {
    struct sp_buf b = SP_BUF_INIT;
    sp_buf_puts(&b, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<|im_start|>\", \"special\": true}, "
                    "{\"id\": 1, \"content\": \"<|im_end|>\", \"special\": true}], "
                    "\"decoder\": {\"type\": \"ByteFallback\"}, "
                    "\"model\": {\"type\": \"BPE\", \"byte_fallback\": true, \"merges\": [], "
                    "\"vocab\": {\"<|im_start|>\": 0, \"<|im_end|>\": 1");
    for (int i = 2; i < 256; i++) sp_buf_printf(&b, ", \"<0x%02X>\": %d", i, i);
    sp_buf_puts(&b, "}}}");
    assert_false(b.failed);
    th_write_str(dir, "tokenizer.json", b.data);
    sp_buf_free(&b);
    th_write_str(dir, "tokenizer_config.json", "{\"eos_token\": \"<|im_end|>\"}");
    th_write_str(dir, "chat_template.jinja",
                 "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}");
}

struct text_model {
    char *dir;
    struct sparrow_model *model;
    struct sparrow_context *ctx;
};

static void text_model_open(struct text_model *t) {
    t->dir = th_tmpdir();
    assert_int_equal(th_run("cp tests/fixtures/llama/config.json tests/fixtures/llama/model.safetensors '%s'/", t->dir),
                     0);
    write_tokenizer(t->dir);
    if (sparrow_model_open(t->dir, NULL, &t->model) != SPARROW_OK) fail_msg("%s", sparrow_last_error());
    struct sparrow_model_info info;
    sparrow_model_info(t->model, &info);
    assert_true(info.has_tokenizer);
    assert_true(info.has_chat_template);
    if (sparrow_context_create(t->model, &ctx_params, &t->ctx) != SPARROW_OK) fail_msg("%s", sparrow_last_error());
}

static void text_model_close(struct text_model *t) {
    sparrow_context_free(t->ctx);
    sparrow_model_close(t->model);
    th_rmdir(t->dir);
}

static void test_tokenize(void **state) {
    struct text_model t;
    text_model_open(&t);
    int32_t *ids;
    int64_t n;
    assert_int_equal(sparrow_tokenize(t.model, "hi<|im_end|>", 12, 0, &ids, &n), SPARROW_OK);
    assert_int_equal(n, 12); // the special token's text as plain bytes
    assert_int_equal(ids[0], 'h');
    assert_int_equal(ids[1], 'i');
    assert_int_equal(ids[2], '<');
    sparrow_free(ids);
    assert_int_equal(sparrow_tokenize(t.model, "hi<|im_end|>", 12, SPARROW_TOKENIZE_PARSE_SPECIAL, &ids, &n),
                     SPARROW_OK);
    assert_int_equal(n, 3);
    assert_int_equal(ids[2], 1);
    char *text;
    size_t len;
    assert_int_equal(sparrow_detokenize(t.model, ids, n, 0, &text, &len), SPARROW_OK);
    assert_string_equal(text, "hi<|im_end|>");
    assert_int_equal(len, 12);
    sparrow_free(text);
    assert_int_equal(sparrow_detokenize(t.model, ids, n, SPARROW_DETOKENIZE_SKIP_SPECIAL, &text, &len), SPARROW_OK);
    assert_string_equal(text, "hi");
    sparrow_free(text);
    sparrow_free(ids);

    struct sparrow_message msgs[] = {{"system", "be brief"}, {"user", "hello"}};
    char *prompt;
    assert_int_equal(sparrow_chat_render(t.model, msgs, 2, true, &prompt, &len), SPARROW_OK);
    assert_string_equal(prompt, "<|im_start|>system\nbe brief<|im_end|>\n<|im_start|>user\nhello<|im_end|>\n"
                                "<|im_start|>assistant\n");
    assert_int_equal(len, strlen(prompt));
    sparrow_free(prompt);
    struct sparrow_message no_role = {NULL, "hi"};
    EXPECT_ERROR(sparrow_chat_render(t.model, &no_role, 1, true, &prompt, &len), SPARROW_ERR_ARG, "no role");
    EXPECT_ERROR(sparrow_chat_render(t.model, msgs, 0, true, &prompt, &len), SPARROW_ERR_ARG, "no messages");
    EXPECT_ERROR(sparrow_detokenize(t.model, (int32_t[]){999}, 1, 0, &text, &len), SPARROW_ERR_ARG, "999");
    EXPECT_ERROR(sparrow_tokenize(t.model, "hi", 2, 0x80, &ids, &n), SPARROW_ERR_ARG, "flags");
    text_model_close(&t);
}

/* The result as ids, text and finish; text is the detokenized ids. */
static void check_result(struct text_model *t, const struct sparrow_result *res, int64_t max_tokens) {
    assert_int_equal(res->n_tokens, max_tokens);
    assert_int_equal(res->finish, SPARROW_FINISH_LENGTH);
    char *text;
    size_t len;
    assert_int_equal(
        sparrow_detokenize(t->model, res->ids, res->n_tokens, SPARROW_DETOKENIZE_SKIP_SPECIAL, &text, &len),
        SPARROW_OK);
    assert_int_equal(res->text_len, len);
    assert_memory_equal(res->text, text, len);
    sparrow_free(text);
}

static void test_generate_text_and_chat(void **state) {
    struct text_model t;
    text_model_open(&t);
    struct sparrow_gen_params gp = {.max_tokens = 12, .ignore_eos = true};

    /* A text prompt is the ids of its text. */
    struct seen seen = {0};
    struct sparrow_result by_text, by_ids;
    assert_int_equal(sparrow_generate(t.ctx, "the sky is", &gp, collect, &seen, &by_text), SPARROW_OK);
    check_result(&t, &by_text, 12);
    assert_int_equal(seen.text.len, by_text.text_len);
    if (seen.text.len) assert_memory_equal(seen.text.data, by_text.text, seen.text.len);
    int32_t *ids;
    int64_t n;
    assert_int_equal(sparrow_tokenize(t.model, "the sky is", 10, SPARROW_TOKENIZE_ADD_SPECIAL, &ids, &n), SPARROW_OK);
    assert_int_equal(by_text.prompt_tokens, n);
    assert_int_equal(sparrow_generate_tokens(t.ctx, ids, n, &gp, NULL, NULL, &by_ids), SPARROW_OK);
    assert_memory_equal(by_ids.ids, by_text.ids, 12 * sizeof(int32_t));
    sparrow_free(ids);
    sparrow_result_clear(&by_ids);
    sp_buf_free(&seen.text);

    /* A chat is the ids of its rendering, special tokens parsed. */
    struct sparrow_message msgs[] = {{"user", "why is the sky blue?"}};
    struct sparrow_result by_chat;
    assert_int_equal(sparrow_chat(t.ctx, msgs, 1, &gp, NULL, NULL, &by_chat), SPARROW_OK);
    check_result(&t, &by_chat, 12);
    char *prompt;
    size_t len;
    assert_int_equal(sparrow_chat_render(t.model, msgs, 1, true, &prompt, &len), SPARROW_OK);
    assert_int_equal(sparrow_tokenize(t.model, prompt, len, SPARROW_TOKENIZE_PARSE_SPECIAL, &ids, &n), SPARROW_OK);
    assert_int_equal(ids[0], 0);
    assert_int_equal(by_chat.prompt_tokens, n);
    assert_int_equal(sparrow_generate_tokens(t.ctx, ids, n, &gp, NULL, NULL, &by_ids), SPARROW_OK);
    assert_memory_equal(by_ids.ids, by_chat.ids, 12 * sizeof(int32_t));
    sparrow_free(ids);
    sparrow_free(prompt);
    sparrow_result_clear(&by_ids);
    sparrow_result_clear(&by_chat);

    /* A stop string ends the text before its first occurrence. */
    const char *full = by_text.text;
    size_t mid = by_text.text_len / 2;
    while (mid > 0 && ((unsigned char)full[mid] & 0xc0) == 0x80) mid--;
    assert_true(by_text.text_len >= 8);
    char stop[8] = {0};
    memcpy(stop, full + mid, by_text.text_len - mid < 4 ? by_text.text_len - mid : 4);
    const char *stops[] = {stop};
    struct sparrow_gen_params gs = gp;
    gs.stop = stops;
    gs.n_stop = 1;
    struct sparrow_result res;
    assert_int_equal(sparrow_generate(t.ctx, "the sky is", &gs, NULL, NULL, &res), SPARROW_OK);
    size_t cut = (size_t)(strstr(full, stop) - full);
    assert_int_equal(res.finish, SPARROW_FINISH_STOP);
    assert_int_equal(res.text_len, cut);
    assert_memory_equal(res.text, full, cut);
    sparrow_result_clear(&res);
    sparrow_result_clear(&by_text);

    /* A callback that returns false cancels: it is called no more, and the
     * result says so even where the engine had already finished (a tiny
     * model can make all 40 tokens before the first poll). */
    struct seen stopper = {.stop_after = 1};
    struct sparrow_gen_params long_gp = {.max_tokens = 40, .ignore_eos = true};
    assert_int_equal(sparrow_generate(t.ctx, "a long one", &long_gp, collect, &stopper, &res), SPARROW_OK);
    assert_int_equal(res.finish, SPARROW_FINISH_CANCELLED);
    assert_int_equal(stopper.calls, 1);
    assert_true(res.n_tokens >= stopper.n_ids && res.n_tokens <= 40);
    sparrow_result_clear(&res);
    sp_buf_free(&stopper.text);

    /* Sampling with a seed repeats itself. */
    struct sparrow_gen_params sampled = sparrow_gen_defaults();
    sampled.max_tokens = 10;
    sampled.ignore_eos = true;
    sampled.seed = 7;
    struct sparrow_result s1, s2;
    assert_int_equal(sparrow_generate(t.ctx, "seeded", &sampled, NULL, NULL, &s1), SPARROW_OK);
    assert_int_equal(sparrow_generate(t.ctx, "seeded", &sampled, NULL, NULL, &s2), SPARROW_OK);
    assert_int_equal(s1.n_tokens, 10);
    assert_memory_equal(s1.ids, s2.ids, 10 * sizeof(int32_t));
    sparrow_result_clear(&s1);
    sparrow_result_clear(&s2);
    text_model_close(&t);
}

/* ---- bad input ---- */

static void test_errors(void **state) {
    struct sparrow_model *model = (struct sparrow_model *)1;
    EXPECT_ERROR(sparrow_model_open("/nonexistent/model", NULL, &model), SPARROW_ERR_NOT_FOUND, "/nonexistent/model");
    assert_null(model);
    EXPECT_ERROR(sparrow_model_open(NULL, NULL, &model), SPARROW_ERR_ARG, "no model");
    EXPECT_ERROR(sparrow_model_open("tests/fixtures/llama", NULL, NULL), SPARROW_ERR_ARG, "out is NULL");

    assert_int_equal(sparrow_model_open("tests/fixtures/llama", NULL, &model), SPARROW_OK);
    struct sparrow_context *ctx = NULL;
    struct sparrow_context_params bad_kv = ctx_params;
    bad_kv.kv_type = "f8";
    EXPECT_ERROR(sparrow_context_create(model, &bad_kv, &ctx), SPARROW_ERR_ARG, "f8");
    assert_null(ctx);
    struct sparrow_context_params bad_dev = ctx_params;
    bad_dev.device = "tpu";
    EXPECT_ERROR(sparrow_context_create(model, &bad_dev, &ctx), SPARROW_ERR_ARG, "device \"tpu\" is not cpu or cuda");
    bad_dev.device = "cuda";  // a build without the backend says so; one with it plans the GPU (none here: an error)
    if (!sp_backend_ops(SP_DEVICE_CUDA))
        EXPECT_ERROR(sparrow_context_create(model, &bad_dev, &ctx), SPARROW_ERR_UNSUPPORTED, "no cuda backend");
    else if (!th_device_ready(SP_DEVICE_CUDA))
        assert_int_not_equal(sparrow_context_create(model, &bad_dev, &ctx), SPARROW_OK);
    assert_null(ctx);
    EXPECT_ERROR(sparrow_context_create(NULL, &ctx_params, &ctx), SPARROW_ERR_ARG, "model is NULL");
    assert_int_equal(sparrow_context_create(model, &ctx_params, &ctx), SPARROW_OK);

    /* No tokenizer: the text functions refuse and say why. */
    int32_t *ids;
    int64_t n;
    char *text;
    size_t len;
    EXPECT_ERROR(sparrow_tokenize(model, "hi", 2, 0, &ids, &n), SPARROW_ERR_STATE, "tokenizer.json");
    EXPECT_ERROR(sparrow_detokenize(model, (int32_t[]){5}, 1, 0, &text, &len), SPARROW_ERR_STATE, "tokenizer.json");
    EXPECT_ERROR(sparrow_generate(ctx, "hi", NULL, NULL, NULL, NULL), SPARROW_ERR_STATE, "tokenizer.json");
    struct sparrow_message msg = {"user", "hi"};
    EXPECT_ERROR(sparrow_chat(ctx, &msg, 1, NULL, NULL, NULL, NULL), SPARROW_ERR_STATE, "tokenizer.json");
    EXPECT_ERROR(sparrow_chat_render(model, &msg, 1, true, &text, &len), SPARROW_ERR_STATE, "chat template");

    /* Prompts the engine cannot take. */
    struct sparrow_gen_params gp = {.max_tokens = 4};
    struct sparrow_result res = {.n_tokens = 99};
    EXPECT_ERROR(sparrow_generate_tokens(ctx, (int32_t[]){1, 300}, 2, &gp, NULL, NULL, &res), SPARROW_ERR_ARG,
                 "vocabulary");
    assert_int_equal(res.n_tokens, 0);
    assert_null(res.ids);
    EXPECT_ERROR(sparrow_generate_tokens(ctx, (int32_t[]){1, -4}, 2, &gp, NULL, NULL, NULL), SPARROW_ERR_ARG, "-4");
    EXPECT_ERROR(sparrow_generate_tokens(ctx, NULL, 0, &gp, NULL, NULL, NULL), SPARROW_ERR_ARG, "empty");
    EXPECT_ERROR(sparrow_generate_tokens(ctx, NULL, 3, &gp, NULL, NULL, NULL), SPARROW_ERR_ARG, "ids is NULL");
    int32_t long_prompt[64] = {0};
    EXPECT_ERROR(sparrow_generate_tokens(ctx, long_prompt, 64, &gp, NULL, NULL, NULL), SPARROW_ERR_ARG, "context");
    EXPECT_ERROR(sparrow_generate_tokens(NULL, long_prompt, 4, &gp, NULL, NULL, NULL), SPARROW_ERR_ARG,
                 "context is NULL");
    const char *stops[SPARROW_MAX_STOP + 1] = {"a", "b", "c", "d", "e", "f", "g", "h", "i"};
    struct sparrow_gen_params many = {.max_tokens = 4, .stop = stops, .n_stop = SPARROW_MAX_STOP + 1};
    EXPECT_ERROR(sparrow_generate_tokens(ctx, long_prompt, 4, &many, NULL, NULL, NULL), SPARROW_ERR_LIMIT, "stop");
    struct sparrow_gen_params negative = {.max_tokens = -1};
    EXPECT_ERROR(sparrow_generate_tokens(ctx, long_prompt, 4, &negative, NULL, NULL, NULL), SPARROW_ERR_ARG,
                 "max_tokens");

    /* After all that the context still generates. */
    assert_int_equal(sparrow_generate_tokens(ctx, long_prompt, 4, &gp, NULL, NULL, &res), SPARROW_OK);
    assert_true(res.n_tokens >= 1 && res.n_tokens <= 4);
    sparrow_result_clear(&res);
    sparrow_result_clear(NULL);
    sparrow_context_free(ctx);
    sparrow_context_free(NULL);
    sparrow_model_close(model);
    sparrow_model_close(NULL);
    assert_string_equal(sparrow_status_str(SPARROW_ERR_LIMIT), "limit exceeded");
    assert_string_equal(sparrow_status_str((enum sparrow_status)42), "unknown status");
    assert_string_equal(sparrow_finish_str(SPARROW_FINISH_CANCELLED), "cancelled");
}

/* A tokenizer whose chat template is broken: the model opens, prompts
 * work, chat says what is wrong with the template. */
static void test_broken_template(void **state) {
    struct text_model t;
    t.dir = th_tmpdir();
    assert_int_equal(th_run("cp tests/fixtures/llama/config.json tests/fixtures/llama/model.safetensors '%s'/", t.dir),
                     0);
    write_tokenizer(t.dir);
    th_write_str(t.dir, "chat_template.jinja", "{% for m in messages %}{{ m.content ");
    assert_int_equal(sparrow_model_open(t.dir, NULL, &t.model), SPARROW_OK);
    struct sparrow_model_info info;
    sparrow_model_info(t.model, &info);
    assert_true(info.has_tokenizer);
    assert_false(info.has_chat_template);
    char *text;
    size_t len;
    struct sparrow_message msg = {"user", "hi"};
    EXPECT_ERROR(sparrow_chat_render(t.model, &msg, 1, true, &text, &len), SPARROW_ERR_STATE, t.dir);
    sparrow_model_close(t.model);
    /* A template name the folder does not have: no template either. */
    write_tokenizer(t.dir);
    struct sparrow_model_params named = {.chat_template = "tool_use"};
    assert_int_equal(sparrow_model_open(t.dir, &named, &t.model), SPARROW_OK);
    sparrow_model_info(t.model, &info);
    assert_false(info.has_chat_template);
    EXPECT_ERROR(sparrow_chat_render(t.model, &msg, 1, true, &text, &len), SPARROW_ERR_STATE, "chat template");
    sparrow_model_close(t.model);
    th_rmdir(t.dir);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy_ids), cmocka_unit_test(test_reference_continuation),
        cmocka_unit_test(test_tokenize),   cmocka_unit_test(test_generate_text_and_chat),
        cmocka_unit_test(test_errors),     cmocka_unit_test(test_broken_template),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
