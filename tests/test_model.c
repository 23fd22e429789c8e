/*
 * test_model.c - models of every architecture generated from the tiny
 * configs: the role table, `inspect` sizes checked against sizes computed
 * here from the config alone, the MLX-layout quantizer checked row by row
 * against the reference quantizer, the same files from any number of
 * threads, models whose files disagree with their config, and the routing
 * of the synthetic models benchmarks use.
 */
#include "helpers.h"

#include <math.h>

#include "core/file.h"
#include "core/json.h"
#include "core/rng.h"
#include "model/forward.h"
#include "model/inspect.h"
#include "model/quantize.h"
#include "model/synth.h"

static const char *const archs[] = {"bailing_moe", "qwen3_moe", "gpt_oss", "qwen3", "llama"};
#define N_ARCHS (sizeof archs / sizeof *archs)

static cJSON *load_config(const char *arch) {
    char path[256];
    snprintf(path, sizeof path, "tools/tiny/%s.json", arch);
    cJSON *c;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &c), SP_OK);
    return c;
}

static char *make_model(const char *arch, enum sp_dtype dt) {
    char *dir = th_tmpdir();
    cJSON *c = load_config(arch);
    struct sp_synth_opts o = {.dtype = dt, .seed = 5};
    if (sp_synth_write(c, dir, &o) != SP_OK) fail_msg("synth %s: %s", arch, sp_error_msg());
    cJSON_Delete(c);
    return dir;
}

static struct sp_model *open_ok(const char *dir) {
    struct sp_model *m;
    if (sp_model_open(dir, &m) != SP_OK) fail_msg("open %s: %s", dir, sp_error_msg());
    return m;
}

/* Bytes of a (rows x cols) matrix: plain floats of `fsize` bytes, or
 * quantized with `bits`, `group` and scales of `ssize` bytes (+ biases). */
struct fmt {
    int bits, group;  // bits 0: plain floats
    size_t fsize;     // bytes of a float value (weights, scales, biases, norms)
    bool biases;
};

static size_t mat_bytes(const struct fmt *f, int64_t rows, int64_t cols, bool router) {
    struct fmt r8 = {8, 64, f->fsize, true};
    if (router && f->bits) f = &r8;
    if (!f->bits || cols % f->group) return (size_t)rows * (size_t)cols * f->fsize;
    size_t ssize = f->biases ? f->fsize : 1;
    return (size_t)rows * (size_t)cols * (size_t)f->bits / 8 +
           (size_t)rows * (size_t)(cols / f->group) * ssize * (f->biases ? 2 : 1);
}

/* Expected bytes by role class, from the config alone. */
static void expected_bytes(const struct sp_arch *a, const struct fmt *f, bool bailing_bias_f32, size_t *cls) {
    memset(cls, 0, SP_CLASS_COUNT * sizeof *cls);
    int64_t d = a->d_model, hd = a->head_dim, q = a->n_heads * hd, kv = a->n_kv_heads * hd, E = a->n_experts;
    int64_t ff = a->d_expert, V = a->vocab;
    size_t fs = f->fsize;
    cls[SP_CLASS_EMBEDDING] = mat_bytes(f, V, d, false);
    if (!a->tie_embeddings) cls[SP_CLASS_LM_HEAD] = mat_bytes(f, V, d, false);
    cls[SP_CLASS_NORMS] = (size_t)d * fs;
    for (int64_t L = 0; L < a->n_layers; L++) {
        cls[SP_CLASS_NORMS] += (size_t)(2 * d + (a->qk_norm ? 2 * hd : 0)) * fs;
        if (a->fused_qkv)
            cls[SP_CLASS_ATTENTION] += mat_bytes(f, q + 2 * kv, d, false);
        else
            cls[SP_CLASS_ATTENTION] += mat_bytes(f, q, d, false) + 2 * mat_bytes(f, kv, d, false);
        cls[SP_CLASS_ATTENTION] += mat_bytes(f, d, q, false);
        if (a->qkv_bias) cls[SP_CLASS_ATTENTION] += (size_t)(q + 2 * kv) * fs;
        if (a->o_bias) cls[SP_CLASS_ATTENTION] += (size_t)d * fs;
        if (a->attn_sinks) cls[SP_CLASS_ATTENTION] += (size_t)a->n_heads * fs;
        if (!a->layer_moe[L]) {
            cls[SP_CLASS_DENSE_MLP] += 2 * mat_bytes(f, a->d_ff, d, false) + mat_bytes(f, d, a->d_ff, false);
            continue;
        }
        cls[SP_CLASS_ROUTER] += mat_bytes(f, E, d, true);
        if (a->router_bias) cls[SP_CLASS_ROUTER] += (size_t)E * fs;
        if (bailing_bias_f32) cls[SP_CLASS_ROUTER] += (size_t)E * 4;
        cls[SP_CLASS_ROUTED_EXPERTS] += (size_t)E * (2 * mat_bytes(f, ff, d, false) + mat_bytes(f, d, ff, false));
        if (a->act == SP_ACT_SWIGLU_CLAMP) cls[SP_CLASS_ROUTED_EXPERTS] += (size_t)E * (size_t)(2 * ff + d) * fs;
        int64_t sh = a->n_shared_experts * ff;
        if (sh) cls[SP_CLASS_SHARED_EXPERTS] += 2 * mat_bytes(f, sh, d, false) + mat_bytes(f, d, sh, false);
    }
}

static void check_stats(const struct sp_model *m, const struct fmt *f) {
    struct sp_model_stats s;
    sp_model_stats(m, &s);
    size_t want[SP_CLASS_COUNT];
    expected_bytes(&m->arch, f, m->arch.id == SP_ARCH_BAILING_MOE, want);
    size_t total = 0;
    for (int c = 0; c < SP_CLASS_COUNT; c++) {
        if (s.bytes[c] != want[c])
            fail_msg("%s bits %d: %s bytes %zu, expected %zu", m->arch.model_type, f->bits,
                     sp_role_class_name((enum sp_role_class)c), s.bytes[c], want[c]);
        total += want[c];
    }
    assert_int_equal(s.total_bytes, total);
    assert_true(s.file_bytes > s.total_bytes);
    assert_int_equal(m->weights.n_unknown, 0);
    /* Parameters are the same whatever the format. */
    int64_t routed = s.params[SP_CLASS_ROUTED_EXPERTS];
    if (m->arch.n_experts) {
        int64_t want_active = s.total_params - routed + routed * m->arch.n_experts_used / m->arch.n_experts;
        assert_true(llabs(s.active_params - want_active) <= 1);
    } else {
        assert_int_equal(s.active_params, s.total_params);
    }
    struct sp_buf out = SP_BUF_INIT;
    sp_model_report(m, &s, true, &out);
    cJSON *j;
    assert_int_equal(sp_json_parse(out.data, out.len, "report", &j), SP_OK);
    int64_t tp;
    assert_int_equal(sp_json_get_int(cJSON_GetObjectItem(j, "params"), "total", -1, &tp), SP_OK);
    assert_int_equal(tp, s.total_params);
    cJSON_Delete(j);
    sp_buf_clear(&out);
    sp_model_report(m, &s, false, &out);
    assert_non_null(strstr(out.data, m->arch.model_type));
    sp_buf_free(&out);
}

static void test_unquantized_models(void **state) {
    enum sp_dtype dts[] = {SP_DTYPE_F32, SP_DTYPE_BF16, SP_DTYPE_F16};
    for (size_t i = 0; i < N_ARCHS; i++) {
        for (size_t k = 0; k < 3; k++) {
            char *dir = make_model(archs[i], dts[k]);
            struct sp_model *m = open_ok(dir);
            struct fmt f = {0, 0, sp_dtype_size(dts[k]), false};
            check_stats(m, &f);
            assert_true(m->has_lm_head == !m->arch.tie_embeddings);
            assert_true(m->has_expert_bias == (m->arch.id == SP_ARCH_BAILING_MOE));
            sp_model_close(m);
            th_rmdir(dir);
        }
    }
}

/* Row `r` of the logical (out, in) source matrix, read straight from the
 * Hugging Face layout: gpt-oss experts are [E, in, 2*ff] with gate and up
 * interleaved, everything else (out, in). */
static void source_row(const struct sp_model *src, int64_t L, enum sp_role role, int64_t e, int64_t r, float *out) {
    struct sp_linear l;
    if (src->fused_gate_up && (role == SP_ROLE_EXP_GATE || role == SP_ROLE_EXP_UP)) {
        assert_int_equal(sp_model_linear(src, L, SP_ROLE_EXP_GATE_UP, e, &l), SP_OK);
        int64_t col = 2 * r + (role == SP_ROLE_EXP_UP);
        for (int64_t i = 0; i < src->arch.d_model; i++)
            out[i] = sp_dtype_load_float(SP_DTYPE_F32, l.w.codes, (size_t)(i * 2 * src->arch.d_expert + col));
        return;
    }
    assert_int_equal(sp_model_linear(src, L, role, e, &l), SP_OK);
    if (l.transposed) {
        for (int64_t i = 0; i < l.w.cols; i++) out[i] = sp_dtype_load_float(SP_DTYPE_F32, l.w.codes, (size_t)(i * l.w.rows + r));
        return;
    }
    sp_qmat_dequant_row_ref(&l.w, r, out);
}

/* Every row of a quantized linear equals the reference quantization of the source row. */
static void check_linear(const struct sp_model *src, const struct sp_model *q, int64_t L, enum sp_role role, int64_t e) {
    struct sp_linear l;
    if (sp_model_linear(q, L, role, e, &l) != SP_OK) fail_msg("%s", sp_error_msg());
    float row[512];
    uint8_t codes[2048], scales[512], biases[512];
    const struct sp_qtype_traits *tr = sp_qtype_traits(l.w.type);
    size_t cb = sp_qtype_row_bytes(l.w.type, l.w.cols);
    size_t sb = tr->mode ? (size_t)(l.w.cols / l.w.group) * sp_dtype_size(l.w.scale_dtype) : 0;
    for (int64_t r = 0; r < l.w.rows; r++) {
        source_row(src, L, role, e, r, row);
        sp_qtype_quantize_row_ref(l.w.type, row, l.w.cols, l.w.group, codes, scales, biases, l.w.scale_dtype);
        if (memcmp(codes, (const uint8_t *)l.w.codes + r * cb, cb) != 0)
            fail_msg("%s layer %lld %s expert %lld row %lld: codes differ", q->arch.model_type, (long long)L,
                     sp_role_name(role), (long long)e, (long long)r);
        if (sb) assert_memory_equal(scales, (const uint8_t *)l.w.scales + r * sb, sb);
        if (sb && tr->has_biases) assert_memory_equal(biases, (const uint8_t *)l.w.biases + r * sb, sb);
    }
}

static void check_quantized_layout(const struct sp_model *src, const struct sp_model *q) {
    const struct sp_arch *a = &src->arch;
    check_linear(src, q, -1, SP_ROLE_EMBED, -1);
    if (q->has_lm_head) check_linear(src, q, -1, SP_ROLE_LM_HEAD, -1);
    for (int64_t L = 0; L < a->n_layers; L++) {
        check_linear(src, q, L, SP_ROLE_ATTN_O, -1);
        check_linear(src, q, L, a->fused_qkv ? SP_ROLE_ATTN_QKV : SP_ROLE_ATTN_K, -1);
        if (!a->layer_moe[L]) {
            check_linear(src, q, L, SP_ROLE_FFN_DOWN, -1);
            continue;
        }
        check_linear(src, q, L, SP_ROLE_ROUTER, -1);
        for (int64_t e = 0; e < a->n_experts; e++) {
            check_linear(src, q, L, SP_ROLE_EXP_GATE, e);
            check_linear(src, q, L, SP_ROLE_EXP_UP, e);
            check_linear(src, q, L, SP_ROLE_EXP_DOWN, e);
        }
        if (a->n_shared_experts) check_linear(src, q, L, SP_ROLE_SHEXP_UP, -1);
        if (src->fused_gate_up) {
            /* gpt-oss biases de-interleave with their rows */
            struct sp_linear s, g;
            assert_int_equal(sp_model_linear(src, L, SP_ROLE_EXP_GATE_UP, 3, &s), SP_OK);
            assert_int_equal(sp_model_linear(q, L, SP_ROLE_EXP_UP, 3, &g), SP_OK);
            for (int64_t r = 0; r < a->d_expert; r++)
                assert_true(((const float *)g.bias)[r] == ((const float *)s.bias)[2 * r + 1]);
        }
    }
}

static void test_quantized_models(void **state) {
    const struct {
        enum sp_qtype t;
        int group;
        struct fmt f;
    } cases[] = {
        {SP_QTYPE_AFFINE4, 64, {4, 64, 4, true}},
        {SP_QTYPE_AFFINE8, 64, {8, 64, 4, true}},
        {SP_QTYPE_MXFP4, 32, {4, 32, 4, false}},
        {SP_QTYPE_AFFINE3, 32, {3, 32, 4, true}},
        {SP_QTYPE_AFFINE5, 128, {5, 128, 4, true}},  // 64-wide expert down_proj stays f32
        {SP_QTYPE_NVFP4, 16, {4, 16, 4, false}},
    };
    for (size_t i = 0; i < N_ARCHS; i++) {
        char *src_dir = make_model(archs[i], SP_DTYPE_F32);
        struct sp_model *src = open_ok(src_dir);
        for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
            char *dir = th_tmpdir();
            struct sp_quantize_opts o = {.type = cases[k].t, .group = cases[k].group};
            if (sp_quantize_model(src, dir, &o) != SP_OK) fail_msg("quantize %s: %s", archs[i], sp_error_msg());
            struct sp_model *q = open_ok(dir);
            assert_true(q->qcfg.present);
            check_stats(q, &cases[k].f);
            check_quantized_layout(src, q);
            sp_model_close(q);
            th_rmdir(dir);
        }
        sp_model_close(src);
        th_rmdir(src_dir);
    }
}

/* The file at dir/name, read whole (owned). */
static char *read_model_file(const char *dir, const char *name, size_t *len) {
    char *p = sp_path_join(dir, name), *data;
    if (sp_read_file(p, (size_t)1 << 30, &data, len) != SP_OK) fail_msg("%s: %s", p, sp_error_msg());
    sp_free(p);
    return data;
}

static void assert_same_weights(const char *a, const char *b) {
    size_t la, lb;
    char *da = read_model_file(a, "model.safetensors", &la), *db = read_model_file(b, "model.safetensors", &lb);
    assert_int_equal(la, lb);
    assert_memory_equal(da, db, la);
    sp_free(da);
    sp_free(db);
}

/* Synthetic weights and quantized copies are the same files whatever the
 * number of threads that make them; a vocabulary of 65536 x 32 values
 * spans several rounds of generated chunks and many blocks of quantized
 * rows. The generated values have the asked standard deviation. */
static void test_threads_same_files(void **state) {
    cJSON *c = load_config("bailing_moe");
    cJSON_ReplaceItemInObjectCaseSensitive(c, "vocab_size", cJSON_CreateNumber(65536));
    struct sp_pool *pool;
    assert_int_equal(sp_pool_create(3, &pool), SP_OK);
    char *dirs[2];
    for (int k = 0; k < 2; k++) {
        dirs[k] = th_tmpdir();
        struct sp_synth_opts o = {.dtype = SP_DTYPE_F32, .seed = 9, .pool = k ? pool : NULL};
        if (sp_synth_write(c, dirs[k], &o) != SP_OK) fail_msg("synth: %s", sp_error_msg());
    }
    cJSON_Delete(c);
    assert_same_weights(dirs[0], dirs[1]);

    struct sp_model *src = open_ok(dirs[0]);
    struct sp_linear e;
    assert_int_equal(sp_model_linear(src, -1, SP_ROLE_EMBED, -1, &e), SP_OK);
    const float *v = e.w.codes;
    double sum = 0, sq = 0;
    int64_t n = e.w.rows * e.w.cols;
    for (int64_t i = 0; i < n; i++) {
        sum += v[i];
        sq += (double)v[i] * v[i];
    }
    double mean = sum / (double)n, sd = sqrt(sq / (double)n - mean * mean);
    if (fabs(mean) > 1e-4 || fabs(sd - 0.02) > 2e-4) fail_msg("embedding mean %g, sd %g (want 0, 0.02)", mean, sd);

    const enum sp_qtype types[] = {SP_QTYPE_AFFINE4, SP_QTYPE_MXFP4};
    for (size_t t = 0; t < sizeof types / sizeof *types; t++) {
        char *q[2];
        for (int k = 0; k < 2; k++) {
            q[k] = th_tmpdir();
            struct sp_quantize_opts o = {.type = types[t], .pool = k ? pool : NULL};
            if (sp_quantize_model(src, q[k], &o) != SP_OK) fail_msg("quantize: %s", sp_error_msg());
        }
        assert_same_weights(q[0], q[1]);
        for (int k = 0; k < 2; k++) th_rmdir(q[k]);
    }
    sp_model_close(src);
    sp_pool_free(pool);
    for (int k = 0; k < 2; k++) th_rmdir(dirs[k]);
}

/* Dequantizing to f32 gives back the quantized values exactly. */
static void test_dequantized_copy(void **state) {
    char *src_dir = make_model("bailing_moe", SP_DTYPE_BF16);
    struct sp_model *src = open_ok(src_dir);
    char *qdir = th_tmpdir(), *ddir = th_tmpdir();
    struct sp_quantize_opts o = {.type = SP_QTYPE_MXFP4};
    assert_int_equal(sp_quantize_model(src, qdir, &o), SP_OK);
    struct sp_model *q = open_ok(qdir);
    struct sp_quantize_opts f = {.type = SP_QTYPE_F32};
    assert_int_equal(sp_quantize_model(q, ddir, &f), SP_OK);
    struct sp_model *d = open_ok(ddir);
    assert_false(d->qcfg.present);
    struct sp_linear a, b;
    float ra[256], rb[256];
    assert_int_equal(sp_model_linear(q, 2, SP_ROLE_EXP_DOWN, 7, &a), SP_OK);
    assert_int_equal(sp_model_linear(d, 2, SP_ROLE_EXP_DOWN, 7, &b), SP_OK);
    assert_int_equal(b.w.type, SP_QTYPE_F32);
    for (int64_t r = 0; r < a.w.rows; r++) {
        sp_qmat_dequant_row_ref(&a.w, r, ra);
        sp_qmat_dequant_row_ref(&b.w, r, rb);
        assert_memory_equal(ra, rb, (size_t)a.w.cols * sizeof(float));
    }
    sp_model_close(d);
    sp_model_close(q);
    sp_model_close(src);
    th_rmdir(ddir);
    th_rmdir(qdir);
    th_rmdir(src_dir);
}

static void set_config_key(const char *dir, const char *key, cJSON *value) {
    char *p = sp_path_join(dir, "config.json");
    cJSON *c;
    assert_int_equal(sp_json_parse_file(p, 1 << 20, &c), SP_OK);
    cJSON_DeleteItemFromObject(c, key);
    if (value) cJSON_AddItemToObject(c, key, value);
    char *text = cJSON_Print(c);
    th_write_str(dir, "config.json", text);
    cJSON_free(text);
    cJSON_Delete(c);
    sp_free(p);
}

static void expect_open_error(const char *dir, const char *needle) {
    struct sp_model *m;
    enum sp_status st = sp_model_open(dir, &m);
    if (st == SP_OK || !strstr(sp_error_msg(), needle)) fail_msg("wanted an error with \"%s\", got \"%s\"", needle, sp_error_msg());
}

static void test_mismatched_models(void **state) {
    char *dir = make_model("llama", SP_DTYPE_F32);
    set_config_key(dir, "intermediate_size", cJSON_CreateNumber(512));
    expect_open_error(dir, "model.safetensors: tensor model.layers.0.mlp.gate_proj.weight: ffn_gate of layer 0 should be 512x128 but the header says 256x128");
    set_config_key(dir, "intermediate_size", cJSON_CreateNumber(256));
    set_config_key(dir, "num_hidden_layers", cJSON_CreateNumber(3));
    expect_open_error(dir, "layer 2: no attn_norm tensor");
    set_config_key(dir, "num_hidden_layers", cJSON_CreateNumber(2));
    set_config_key(dir, "model_type", cJSON_CreateString("mamba2"));
    expect_open_error(dir, "unknown model_type \"mamba2\"");
    th_rmdir(dir);

    char *src_dir = make_model("qwen3_moe", SP_DTYPE_F32);
    struct sp_model *src = open_ok(src_dir);
    char *qdir = th_tmpdir();
    struct sp_quantize_opts o = {.type = SP_QTYPE_AFFINE4, .group = 64};
    assert_int_equal(sp_quantize_model(src, qdir, &o), SP_OK);
    sp_model_close(src);
    /* bits in the config that do not match the codes */
    cJSON *qc = cJSON_Parse("{\"group_size\":64,\"bits\":8,\"mode\":\"affine\"}");
    set_config_key(qdir, "quantization", qc);
    set_config_key(qdir, "quantization_config", NULL);
    expect_open_error(qdir, "tensor model.embed_tokens.weight: embedding should be 512x32 but the header says 512x16");
    /* scales without any quantization section */
    set_config_key(qdir, "quantization", NULL);
    expect_open_error(qdir, "quantization scales, but config.json has no \"quantization\" section");
    /* an unsupported bit width */
    set_config_key(qdir, "quantization", cJSON_Parse("{\"group_size\":64,\"bits\":7}"));
    expect_open_error(qdir, "with 7 bits is not supported");
    th_rmdir(qdir);
    th_rmdir(src_dir);
}

/* A benchmark's synthetic model routes as a trained one does: every
 * expert takes some of 64 tokens in every layer (64 x top-k over E experts
 * is 16 or more tokens an expert on average, so uniform routing leaves
 * E (1 - k / E)^64, well under one, idle). Without balanced_routing the
 * tiny Ling and gpt-oss models send their tokens to half of their experts
 * or fewer. */
static void check_balanced_routing(const char *arch) {
    char *dir = th_tmpdir();
    cJSON *cfg = load_config(arch);
    struct sp_synth_opts o = {.dtype = SP_DTYPE_F32, .seed = 5, .balanced_routing = true};
    if (sp_synth_write(cfg, dir, &o) != SP_OK) fail_msg("synth %s: %s", arch, sp_error_msg());
    cJSON_Delete(cfg);
    struct sp_model *m = open_ok(dir);
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 64, .max_batch = 64, .n_threads = 1, .time_steps = true};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    int32_t tok[64], pos[64], seq[64] = {0};
    struct sp_rng rng;
    sp_rng_seed(&rng, 11);
    for (int i = 0; i < 64; i++) {
        tok[i] = (int32_t)(sp_rng_next(&rng) % (uint64_t)m->arch.vocab);
        pos[i] = i;
    }
    bool want[64] = {false};
    want[63] = true;
    float *logits = malloc((size_t)m->arch.vocab * sizeof(float));
    struct sp_batch b = {.n = 64, .tokens = tok, .pos = pos, .seq = seq, .want_logits = want};
    assert_int_equal(sp_ctx_forward(c, &b, logits), SP_OK);
    struct sp_step_times t;
    sp_ctx_step_times(c, &t, false);
    int64_t moe_layers = 0;
    for (int64_t L = 0; L < m->arch.n_layers; L++) moe_layers += m->arch.layer_moe[L];
    assert_true(moe_layers > 0);
    assert_true(t.routed == (double)(64 * moe_layers * m->arch.n_experts_used));
    double run = t.experts_run / (double)moe_layers;
    if (run < (double)m->arch.n_experts - 0.5)
        fail_msg("%s: %.2f of %lld experts run a layer", arch, run, (long long)m->arch.n_experts);
    free(logits);
    sp_ctx_free(c);
    sp_model_close(m);
    th_rmdir(dir);
}

static void test_synthetic_routing(void **state) {
    (void)state;
    check_balanced_routing("qwen3_moe");
    check_balanced_routing("bailing_moe");
    check_balanced_routing("gpt_oss");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_unquantized_models),
        cmocka_unit_test(test_quantized_models),
        cmocka_unit_test(test_dequantized_copy),
        cmocka_unit_test(test_threads_same_files),
        cmocka_unit_test(test_mismatched_models),
        cmocka_unit_test(test_synthetic_routing),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
