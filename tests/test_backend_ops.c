/*
 * test_backend_ops.c - every op of backend.h on every backend this build
 * and machine have (on the CPU: one backend per kernel set the CPU runs)
 * against a scalar reference in double, on random inputs: linear layers in
 * every weight format x shapes x token counts, embedding, RMSNorm, zero and
 * add, attention (q / k norms, partial RoPE, sliding windows, sinks, two
 * sequences, positions cached by an earlier call, each KV type), gated
 * MLP batches (split and fused gate / up, SiLU and clamped SwiGLU), the
 * rows moved to and from experts, the final norm with the lm_head, and
 * copying a sequence's cache. Tolerances are named below; each scales with
 * how the backend rounds the activations of the product (qref.h).
 */
#include "helpers.h"
#include "qref.h"

#include "backend/backend.h"
#include "core/half.h"
#include "runtime/sampler.h"

/* A result off by more than this relative to the reference's magnitude
 * (sum of |terms|) where every input stays float: the backend sums in
 * float in another order. */
#define TOL_FLOAT 1e-5
/* Attention outputs relative to max |value| of the head: scores and
 * softmax in float against double, values summed in float. An f16 or bf16
 * cache rounds keys and values as the reference does, but a rotated key
 * the two compute a float rounding apart can round to neighbouring cached
 * values: a unit of f16's 11-bit or bf16's 8-bit significand in a score's
 * terms. A wrong position, head or sequence is off by the order of 1. */
static double tol_att(enum sp_kv_type kv) { return kv == SP_KV_F32 ? 2e-5 : kv == SP_KV_F16 ? 1e-3 : 1e-2; }

/* One backend under test. */
struct target {
    char label[64];
    enum sp_device dev;
    const struct sp_kernels *k;  // the CPU's kernel set (NULL elsewhere)
    bool float_acts;             // a device's exact path (sp_backend_params.float_activations)
};

static struct target targets[SP_KERNELS_ISA_COUNT + 2 * SP_DEVICE_COUNT];
static int n_targets;

static void find_targets(void) {
    n_targets = 0;
    for (int i = 0; i < SP_KERNELS_ISA_COUNT; i++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)i);
        if (!k) continue;
        struct target *t = &targets[n_targets++];
        snprintf(t->label, sizeof t->label, "cpu/%s", k->name);
        t->dev = SP_DEVICE_CPU;
        t->k = k;
    }
    for (int d = 0; d < SP_DEVICE_COUNT; d++) {
        if (d == SP_DEVICE_CPU) continue;
        if (!th_device_ready((enum sp_device)d)) continue;
        for (int exact = 0; exact < 2; exact++) {
            struct target *t = &targets[n_targets++];
            snprintf(t->label, sizeof t->label, "%s%s", sp_device_name((enum sp_device)d), exact ? "/exact" : "");
            t->dev = (enum sp_device)d;
            t->float_acts = exact;
        }
    }
}

/* How the target rounds the activations of products with m: a CPU as its
 * kernel set does; CUDA to int8 by blocks of 32 for 4-bit codes (within a
 * weight group, so qref's per-group allowance holds) unless exact. */
static enum acts target_acts(const struct target *t, const struct sp_qmat *m, bool float_activations) {
    if (float_activations || t->float_acts) return ACTS_FLOAT;
    if (!t->k) {
        bool four_bit = m->type == SP_QTYPE_AFFINE4 || m->type == SP_QTYPE_MXFP4;
        return four_bit && m->group % 32 == 0 ? ACTS_INT8 : ACTS_FLOAT;
    }
    return acts_of(t->k, m);
}

/* The shape the tests size backends for. */
#define D 128
#define VOCAB 96
#define HEADS 4
#define KV_HEADS 2
#define HEAD_DIM 32
#define ROT 16  // partial rotary: half of each head rotates
#define FF 96   // an expert's width: gate and up side by side are 2 FF
#define EXPERTS 4
#define LAYERS 2
#define CTX 300  // past two of the CUDA kernel's 128-position chunks
#define SEQS 3
#define BATCH 48

static float inv_freq[ROT / 2];

/* A backend for the model above with a vocabulary of vocab. */
static struct sp_backend *make_backend_vocab(const struct target *t, enum sp_kv_type kv, int64_t vocab) {
    for (int i = 0; i < ROT / 2; i++) inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)ROT);
    struct sp_backend_params p = {
        .shape = {.n_layers = LAYERS, .n_kv_layers = LAYERS, .d_model = D, .vocab = vocab, .n_heads = HEADS, .n_kv_heads = KV_HEADS,
                  .head_dim = HEAD_DIM, .mlp_width = 2 * FF, .n_experts = EXPERTS, .rot_dims = ROT,
                  .inv_freq = inv_freq, .rope_scale = 1.25f},
        .n_ctx = CTX, .n_seq = SEQS, .max_batch = BATCH, .kv_type = kv, .n_threads = 2,
        .float_activations = t->float_acts};
    if (t->k) sp_kernels_use(t->k);
    struct sp_backend *b;
    if (sp_backend_create(t->dev, &p, &b) != SP_OK) fail_msg("%s: %s", t->label, sp_error_msg());
    return b;
}

static struct sp_backend *make_backend(const struct target *t, enum sp_kv_type kv) {
    return make_backend_vocab(t, kv, VOCAB);
}

static void done_backend(struct sp_backend *b) {
    sp_backend_free(b);
    sp_kernels_use(NULL);
}

/* A tensor of rows x cols filled from host values (rows cols apart). */
static struct sp_tensor tensor_of(struct sp_backend *b, int64_t rows, int64_t cols, const float *v) {
    struct sp_tensor t;
    assert_int_equal(sp_backend_tensor(b, rows, cols, &t), SP_OK);
    b->ops->write(b, t, v);
    return t;
}

static float *randn(int64_t n, float scale, struct sp_rng *rng) {
    float *v = malloc((size_t)n * sizeof *v);
    for (int64_t i = 0; i < n; i++) v[i] = sp_rng_normal(rng) * scale;
    return v;
}

/* t's rows on the host (a copy the caller frees). */
static float *read_back(struct sp_backend *b, struct sp_tensor t) {
    float *staging = malloc((size_t)(t.rows * t.cols) * sizeof *staging + 1);
    const float *h = b->ops->host(b, t, staging);
    if (h != staging) memcpy(staging, h, (size_t)(t.rows * t.cols) * sizeof *staging);
    return staging;
}

static struct sp_linear linear_of(const struct mat *M) {
    return (struct sp_linear){.w = M->m};
}

/* ---- linear ---- */

struct fmt {
    enum sp_qtype t;
    int group;
    enum sp_dtype sdt;
};

static const struct fmt formats[] = {
    {SP_QTYPE_F32, 1, SP_DTYPE_COUNT},       {SP_QTYPE_F16, 1, SP_DTYPE_COUNT},
    {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT},      {SP_QTYPE_AFFINE2, 64, SP_DTYPE_BF16},
    {SP_QTYPE_AFFINE3, 64, SP_DTYPE_F16},    {SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16},
    {SP_QTYPE_AFFINE4, 64, SP_DTYPE_F16},    {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F32},
    {SP_QTYPE_AFFINE5, 64, SP_DTYPE_BF16},   {SP_QTYPE_AFFINE6, 64, SP_DTYPE_BF16},
    {SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16},   {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16},
    {SP_QTYPE_MXFP4, 32, SP_DTYPE_COUNT},    {SP_QTYPE_MXFP8, 32, SP_DTYPE_COUNT},
    {SP_QTYPE_NVFP4, 16, SP_DTYPE_COUNT},    {SP_QTYPE_Q2_K, 256, SP_DTYPE_COUNT},
    {SP_QTYPE_Q3_K, 256, SP_DTYPE_COUNT},    {SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT},
    {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT},    {SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT},
    {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT},   {SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT},
};

/* y = l(x) for n tokens of a rows x cols matrix of format f (with a bias
 * when `bias`), every output within the tolerance of its activations. */
static void check_linear(struct sp_backend *b, const struct target *tg, const struct fmt *f, int64_t rows,
                         int64_t cols, int64_t n, bool bias, struct sp_rng *rng) {
    struct mat M;
    mat_make(&M, f->t, f->group, f->sdt, rows, cols, rng);
    struct sp_linear l = linear_of(&M);
    float *bv = NULL;
    if (bias) {
        bv = randn(rows, 1.0f, rng);
        l.bias = bv;
        l.bias_dtype = SP_DTYPE_F32;
    }
    assert_true(b->ops->supports(b, SP_OP_LINEAR, f->t));
    assert_int_equal(b->ops->prepare(b, &l), SP_OK);
    float *x = randn(n * cols, 1.0f, rng);
    struct sp_tensor xt = tensor_of(b, n, cols, x), yt;
    assert_int_equal(sp_backend_tensor(b, n, rows, &yt), SP_OK);
    b->ops->linear(b, &l, xt, yt);
    float *y = read_back(b, yt);
    for (int64_t t = 0; bias && t < n; t++)
        for (int64_t r = 0; r < rows; r++) y[t * rows + r] -= bv[r];
    int64_t br = -1, bt = -1;
    double ratio = worst_ratio(&M.m, x, cols, n, y, rows, target_acts(tg, &M.m, false), &br, &bt);
    if (!(ratio <= 1.0))
        fail_msg("%s linear %s g%d %lldx%lld, %lld tokens%s: row %lld token %lld off by %.3g x tolerance", tg->label,
                 sp_qtype_name(f->t), f->group, (long long)rows, (long long)cols, (long long)n, bias ? ", bias" : "",
                 (long long)br, (long long)bt, ratio);
    free(y);
    free(x);
    free(bv);
    mat_free(&M);
}

static void test_linear(void **state) {
    static const int64_t tokens[] = {1, 3, 8, 17, 40};
    static const int64_t shapes[][2] = {{13, 128}, {67, 256}, {96, 640}};
    struct sp_rng rng;
    sp_rng_seed(&rng, 44);
    for (int ti = 0; ti < n_targets; ti++) {
        struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
        for (size_t fi = 0; fi < sizeof formats / sizeof *formats; fi++)
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++)
                for (size_t ni = 0; ni < sizeof tokens / sizeof *tokens; ni++) {
                    if (shapes[si][1] % formats[fi].group) continue;
                    check_linear(b, &targets[ti], &formats[fi], shapes[si][0], shapes[si][1], tokens[ni], ni == 1, &rng);
                }
        done_backend(b);
    }
}

/* A router's product keeps its activations in float whatever the set. */
static void test_linear_float_activations(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 45);
    for (int ti = 0; ti < n_targets; ti++)
        for (int four = 0; four < 2; four++) {
            struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
            struct mat M;
            mat_make(&M, four ? SP_QTYPE_AFFINE4 : SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16, EXPERTS * 8, D, &rng);
            struct sp_linear l = linear_of(&M);
            l.float_activations = true;
            assert_int_equal(b->ops->prepare(b, &l), SP_OK);
            float *x = randn(9 * D, 1.0f, &rng);
            struct sp_tensor xt = tensor_of(b, 9, D, x), yt;
            assert_int_equal(sp_backend_tensor(b, 9, M.m.rows, &yt), SP_OK);
            b->ops->linear(b, &l, xt, yt);
            float *y = read_back(b, yt);
            int64_t br, bt;
            assert_true(worst_ratio(&M.m, x, D, 9, y, M.m.rows, ACTS_FLOAT, &br, &bt) <= 1.0);
            free(y);
            free(x);
            mat_free(&M);
            done_backend(b);
        }
}

/* ---- embedding, norms, adds ---- */

static void same_bits(const char *label, const char *what, struct sp_backend *b, struct sp_tensor got,
                      struct sp_tensor want) {
    float *g = read_back(b, got), *e = read_back(b, want);
    if (memcmp(g, e, (size_t)(got.rows * got.cols) * sizeof *g) != 0) fail_msg("%s %s: not the same bits", label, what);
    free(g);
    free(e);
}

/* y = l(x) of the rows of t as the host reads them, written afresh. */
static struct sp_tensor fresh_product(struct sp_backend *b, const struct sp_linear *l, struct sp_tensor t) {
    float *h = read_back(b, t);
    struct sp_tensor x = tensor_of(b, t.rows, t.cols, h), y;
    free(h);
    assert_int_equal(sp_backend_tensor(b, t.rows, l->w.rows, &y), SP_OK);
    b->ops->linear(b, l, x, y);
    return y;
}

/* add_rmsnorm gives the bits of add, rmsnorm and zero apart; a 4-bit
 * product reading its output next gives the bits of the same rows written
 * afresh (a backend may round them to int8 as the norm writes them), and
 * so it does after another op has changed those rows. */
static void check_add_rmsnorm(struct sp_backend *b, const char *label, const float *w, int64_t n,
                              struct sp_rng *rng) {
    if (!b->ops->add_rmsnorm) return;
    float *xv = randn(n * D, 3.0f, rng), *rv = randn(n * D, 1.0f, rng);
    struct sp_tensor x1 = tensor_of(b, n, D, xv), r1 = tensor_of(b, n, D, rv), x2 = tensor_of(b, n, D, xv),
                     r2 = tensor_of(b, n, D, rv), o1, o2, y1;
    assert_int_equal(sp_backend_tensor(b, n, D, &o1), SP_OK);
    assert_int_equal(sp_backend_tensor(b, n, D, &o2), SP_OK);
    b->ops->add_rmsnorm(b, w, 1e-5f, x1, r1, true, o1);
    b->ops->add(b, x2, r2);
    b->ops->rmsnorm(b, w, 1e-5f, x2, o2);
    b->ops->zero(b, r2);
    same_bits(label, "add_rmsnorm's sums", b, x1, x2);
    same_bits(label, "add_rmsnorm's cleared rows", b, r1, r2);
    same_bits(label, "add_rmsnorm", b, o1, o2);

    struct mat M;
    mat_make(&M, SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 96, D, rng);
    struct sp_linear l = linear_of(&M);
    assert_int_equal(b->ops->prepare(b, &l), SP_OK);
    assert_int_equal(sp_backend_tensor(b, n, 96, &y1), SP_OK);
    struct sp_tensor more = tensor_of(b, n, D, rv);
    for (int pass = 0; pass < 2; pass++) {
        b->ops->add_rmsnorm(b, w, 1e-5f, x1, more, false, o1);
        if (pass) b->ops->add(b, sp_tensor_rows(o1, 1, n - 2), sp_tensor_rows(more, 0, n - 2));
        b->ops->linear(b, &l, o1, y1);
        same_bits(label, pass ? "a product after the norm's rows changed" : "a product of add_rmsnorm's rows", b, y1,
                  fresh_product(b, &l, o1));
    }
    mat_free(&M);
    free(xv);
    free(rv);
}

static void test_embed_norm_add(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 46);
    static const struct fmt emb[] = {{SP_QTYPE_F32, 1, SP_DTYPE_COUNT},
                                     {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT},
                                     {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16},
                                     {SP_QTYPE_MXFP4, 32, SP_DTYPE_COUNT}};
    for (int ti = 0; ti < n_targets; ti++) {
        const char *label = targets[ti].label;
        struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
        int64_t n = 11;
        int32_t tok[11], pos[11], seq[11];
        for (int64_t t = 0; t < n; t++) tok[t] = (int32_t)(sp_rng_next(&rng) % VOCAB), pos[t] = (int32_t)t, seq[t] = 0;
        struct sp_batch bt = {.n = n, .tokens = tok, .pos = pos, .seq = seq};
        for (size_t fi = 0; fi < sizeof emb / sizeof *emb; fi++) {
            struct mat E;
            mat_make(&E, emb[fi].t, emb[fi].group, emb[fi].sdt, VOCAB, D, &rng);
            struct sp_linear el = linear_of(&E);
            assert_true(b->ops->supports(b, SP_OP_EMBED, emb[fi].t));
            assert_int_equal(b->ops->prepare(b, &el), SP_OK);
            struct sp_tensor x;
            assert_int_equal(sp_backend_tensor(b, n, D, &x), SP_OK);
            b->ops->embed(b, &el, &bt, x);
            float *got = read_back(b, x), row[D];
            for (int64_t t = 0; t < n; t++) {
                sp_qmat_dequant_row_ref(&E.m, tok[t], row);
                for (int64_t i = 0; i < D; i++)
                    if (fabsf(got[t * D + i] - row[i]) > 1e-6f * fabsf(row[i]))
                        fail_msg("%s embed %s: token %lld element %lld: %g, reference %g", label, sp_qtype_name(emb[fi].t),
                                 (long long)t, (long long)i, got[t * D + i], row[i]);
            }
            free(got);
            mat_free(&E);
        }
        /* rmsnorm into another tensor and in place, with and without weights */
        float *xv = randn(n * D, 3.0f, &rng), *wv = randn(D, 1.0f, &rng);
        const float *w = NULL;
        struct sp_vector vw = {wv, SP_DTYPE_F32, D};
        assert_int_equal(b->ops->vector(b, &vw, &w), SP_OK);
        for (int pass = 0; pass < 2; pass++) {
            struct sp_tensor x = tensor_of(b, n, D, xv), out = x;
            if (pass == 0) assert_int_equal(sp_backend_tensor(b, n, D, &out), SP_OK);
            b->ops->rmsnorm(b, pass ? NULL : w, 1e-5f, x, out);
            float *got = read_back(b, out);
            for (int64_t t = 0; t < n; t++) {
                double ss = 0;
                for (int64_t i = 0; i < D; i++) ss += (double)xv[t * D + i] * xv[t * D + i];
                double inv = 1.0 / sqrt(ss / D + 1e-5);
                for (int64_t i = 0; i < D; i++) {
                    double ref = xv[t * D + i] * inv * (pass ? 1.0 : wv[i]);
                    if (fabs(got[t * D + i] - ref) > TOL_FLOAT * (fabs(ref) + 1e-30))
                        fail_msg("%s rmsnorm: token %lld element %lld: %g, reference %g", label, (long long)t,
                                 (long long)i, got[t * D + i], ref);
                }
            }
            free(got);
        }
        /* add and zero, on views of rows and columns */
        float *yv = randn(n * D, 1.0f, &rng);
        struct sp_tensor x = tensor_of(b, n, D, xv), y = tensor_of(b, n, D, yv);
        b->ops->add(b, sp_tensor_rows(x, 2, 5), sp_tensor_rows(y, 2, 5));
        b->ops->zero(b, sp_tensor_cols(sp_tensor_rows(y, 8, 2), 10, 20));
        float *gx = read_back(b, x), *gy = read_back(b, y);
        for (int64_t t = 0; t < n; t++)
            for (int64_t i = 0; i < D; i++) {
                float ex = t >= 2 && t < 7 ? xv[t * D + i] + yv[t * D + i] : xv[t * D + i];
                float ey = t >= 8 && t < 10 && i >= 10 && i < 30 ? 0.0f : yv[t * D + i];
                assert_true(gx[t * D + i] == ex);
                assert_true(gy[t * D + i] == ey);
            }
        free(gx);
        free(gy);
        check_add_rmsnorm(b, label, w, n, &rng);
        free(xv);
        free(yv);
        free(wv);
        done_backend(b);
    }
}

/* ---- attention ---- */

/* The reference's cache: keys and values of every (layer, seq, position,
 * kv head) as the backend's KV type rounds them. */
struct ref_kv {
    double k[LAYERS][SEQS][CTX][KV_HEADS][HEAD_DIM], v[LAYERS][SEQS][CTX][KV_HEADS][HEAD_DIM];
};

static double kv_round(enum sp_kv_type kv, float x) {
    if (kv == SP_KV_F16) return sp_f16_to_f32(sp_f32_to_f16(x));
    if (kv == SP_KV_BF16) return sp_bf16_to_f32(sp_f32_to_bf16(x));
    return x;
}

/* rmsnorm (w, eps 1e-6) then RoPE of one head in double, from float. */
static void ref_head(double *o, const float *v, const float *w, int64_t pos, float scale) {
    double ss = 0, x[HEAD_DIM];
    for (int i = 0; i < HEAD_DIM; i++) ss += (double)v[i] * v[i];
    double inv = w ? 1.0 / sqrt(ss / HEAD_DIM + 1e-6) : 1.0;
    for (int i = 0; i < HEAD_DIM; i++) x[i] = w ? v[i] * inv * w[i] : v[i];
    for (int i = 0; i < HEAD_DIM; i++) o[i] = x[i];
    for (int i = 0; i < ROT / 2; i++) {
        double ang = (double)((float)pos * inv_freq[i]), c = cos(ang) * scale, s = sin(ang) * scale;
        o[i] = x[i] * c - x[i + ROT / 2] * s;
        o[i + ROT / 2] = x[i + ROT / 2] * c + x[i] * s;
    }
}

/* One attention call on n tokens (their q / k / v rows qkv) and its check
 * against the reference, which stores their keys and values first. */
static void check_attention(struct sp_backend *b, const char *label, const struct sp_attn_layer *ly, const float *qn,
                            const float *kn, const float *sinks, enum sp_kv_type kvt, struct ref_kv *R,
                            const struct sp_batch *bt, const float *qkv) {
    int64_t n = bt->n, qd = HEADS * HEAD_DIM, kvd = KV_HEADS * HEAD_DIM, ld = qd + 2 * kvd;
    /* RoPE angles come with the embedding (any embedding will do) */
    struct mat E;
    struct sp_rng rng;
    sp_rng_seed(&rng, 7);
    mat_make(&E, SP_QTYPE_F32, 1, SP_DTYPE_COUNT, VOCAB, D, &rng);
    struct sp_linear el = linear_of(&E);
    assert_int_equal(b->ops->prepare(b, &el), SP_OK);
    struct sp_tensor x, att, qkvt = tensor_of(b, n, ld, qkv);
    assert_int_equal(sp_backend_tensor(b, n, D, &x), SP_OK);
    assert_int_equal(sp_backend_tensor(b, n, qd, &att), SP_OK);
    b->ops->embed(b, &el, bt, x);
    b->ops->attention(b, ly, bt, qkvt, att);
    float *got = read_back(b, att);
    double q[HEADS][HEAD_DIM];
    for (int64_t t = 0; t < n; t++) {
        int64_t pos = bt->pos[t], s = bt->seq[t];
        const float *row = qkv + t * ld;
        for (int h = 0; h < HEADS; h++) ref_head(q[h], row + h * HEAD_DIM, qn, pos, 1.25f);
        for (int h = 0; h < KV_HEADS; h++) {
            double k[HEAD_DIM];
            ref_head(k, row + qd + h * HEAD_DIM, kn, pos, 1.25f);
            for (int i = 0; i < HEAD_DIM; i++) {
                R->k[ly->layer][s][pos][h][i] = kv_round(kvt, (float)k[i]);
                R->v[ly->layer][s][pos][h][i] = kv_round(kvt, row[qd + kvd + h * HEAD_DIM + i]);
            }
        }
    }
    for (int64_t t = 0; t < n; t++) {
        int64_t pos = bt->pos[t], s = bt->seq[t], lo = ly->window > 0 && pos - ly->window + 1 > 0 ? pos - ly->window + 1 : 0;
        const float *row = qkv + t * ld;
        for (int h = 0; h < HEADS; h++) ref_head(q[h], row + h * HEAD_DIM, qn, pos, 1.25f);
        for (int h = 0; h < HEADS; h++) {
            int kvh = h / (HEADS / KV_HEADS);
            double sc[CTX], mx = sinks ? sinks[h] : -INFINITY, sum = 0, out[HEAD_DIM] = {0}, vmax = 0;
            for (int64_t p = lo; p <= pos; p++) {
                double d = 0;
                for (int i = 0; i < HEAD_DIM; i++) d += (double)(float)q[h][i] * R->k[ly->layer][s][p][kvh][i];
                sc[p] = d / sqrt((double)HEAD_DIM);
                mx = fmax(mx, sc[p]);
            }
            for (int64_t p = lo; p <= pos; p++) sum += exp(sc[p] - mx);
            if (sinks) sum += exp(sinks[h] - mx);
            for (int64_t p = lo; p <= pos; p++)
                for (int i = 0; i < HEAD_DIM; i++) {
                    double v = R->v[ly->layer][s][p][kvh][i];
                    out[i] += exp(sc[p] - mx) / sum * v;
                    vmax = fmax(vmax, fabs(v));
                }
            for (int i = 0; i < HEAD_DIM; i++) {
                double g = got[t * qd + h * HEAD_DIM + i];
                if (!(fabs(g - out[i]) <= tol_att(kvt) * vmax + 1e-30))
                    fail_msg("%s attention (kv %s, window %lld%s%s): token %lld (seq %lld pos %lld) head %d dim %d: %g, "
                             "reference %g",
                             label, sp_kv_type_name(kvt), (long long)ly->window, qn ? ", q/k norms" : "",
                             sinks ? ", sinks" : "", (long long)t, (long long)s, (long long)pos, h, i, g, out[i]);
            }
        }
    }
    free(got);
    mat_free(&E);
}

/* Two calls per case: a prefill of two sequences (and a third that stays
 * empty), then decode-sized and chunked continuations at later positions
 * that read what the first stored. */
static void test_attention(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 47);
    static const enum sp_kv_type kvs[] = {SP_KV_F32, SP_KV_F16, SP_KV_BF16};
    int64_t ld = HEADS * HEAD_DIM + 2 * KV_HEADS * HEAD_DIM;
    for (int ti = 0; ti < n_targets; ti++)
        for (size_t ki = 0; ki < sizeof kvs / sizeof *kvs; ki++)
            for (int variant = 0; variant < 3; variant++) {
                struct sp_backend *b = make_backend(&targets[ti], kvs[ki]);
                struct ref_kv *R = calloc(1, sizeof *R);
                float *qnv = randn(HEAD_DIM, 1.0f, &rng), *knv = randn(HEAD_DIM, 1.0f, &rng), *sv = randn(HEADS, 2.0f, &rng);
                const float *qn = NULL, *kn = NULL, *sinks = NULL;
                struct sp_vector vq = {qnv, SP_DTYPE_F32, HEAD_DIM}, vk = {knv, SP_DTYPE_F32, HEAD_DIM},
                                 vs = {sv, SP_DTYPE_F32, HEADS};
                if (variant >= 1) {
                    assert_int_equal(b->ops->vector(b, &vq, &qn), SP_OK);
                    assert_int_equal(b->ops->vector(b, &vk, &kn), SP_OK);
                }
                if (variant == 2) assert_int_equal(b->ops->vector(b, &vs, &sinks), SP_OK);
                struct sp_attn_layer ly = {.layer = variant % LAYERS, .q_norm = qn, .k_norm = kn, .sinks = sinks,
                                           .window = variant == 2 ? 5 : 0, .eps = 1e-6f};
                /* prefill: 37 tokens of sequence 1 then 4 of sequence 0 */
                int32_t tok[BATCH] = {0}, pos[BATCH], seq[BATCH];
                int64_t n = 0;
                for (int p = 0; p < 37; p++) pos[n] = p, seq[n++] = 1;
                for (int p = 0; p < 4; p++) pos[n] = p, seq[n++] = 0;
                struct sp_batch bt = {.n = n, .tokens = tok, .pos = pos, .seq = seq};
                float *qkv = randn(n * ld, 1.0f, &rng);
                check_attention(b, targets[ti].label, &ly, qn ? qnv : NULL, kn ? knv : NULL, sinks ? sv : NULL,
                                kvs[ki], R, &bt, qkv);
                free(qkv);
                /* continuations: one token of each, then 19 more of sequence 1 */
                n = 0;
                pos[n] = 37, seq[n++] = 1;
                pos[n] = 4, seq[n++] = 0;
                bt.n = n;
                qkv = randn(n * ld, 1.0f, &rng);
                check_attention(b, targets[ti].label, &ly, qn ? qnv : NULL, kn ? knv : NULL, sinks ? sv : NULL, kvs[ki],
                                R, &bt, qkv);
                free(qkv);
                n = 0;
                for (int p = 38; p < 57; p++) pos[n] = p, seq[n++] = 1;
                bt.n = n;
                qkv = randn(n * ld, 1.0f, &rng);
                check_attention(b, targets[ti].label, &ly, qn ? qnv : NULL, kn ? knv : NULL, sinks ? sv : NULL, kvs[ki],
                                R, &bt, qkv);
                free(qkv);
                /* sequence 1's cache copied to sequence 2 attends the same */
                b->ops->kv_copy_seq(b, 1, 2, 57);
                for (int64_t p = 0; p < 57; p++) {
                    memcpy(R->k[ly.layer][2][p], R->k[ly.layer][1][p], sizeof R->k[0][0][0]);
                    memcpy(R->v[ly.layer][2][p], R->v[ly.layer][1][p], sizeof R->v[0][0][0]);
                }
                n = 0;
                pos[n] = 57, seq[n++] = 2;
                bt.n = n;
                qkv = randn(n * ld, 1.0f, &rng);
                check_attention(b, targets[ti].label, &ly, qn ? qnv : NULL, kn ? knv : NULL, sinks ? sv : NULL, kvs[ki],
                                R, &bt, qkv);
                free(qkv);
                /* sequence 0 on to the context's end, BATCH tokens a call: tokens seeing several chunks */
                for (int p0 = 5; p0 < CTX; p0 += BATCH) {
                    n = 0;
                    for (int p = p0; p < CTX && p < p0 + BATCH; p++) pos[n] = p, seq[n++] = 0;
                    bt.n = n;
                    qkv = randn(n * ld, 1.0f, &rng);
                    check_attention(b, targets[ti].label, &ly, qn ? qnv : NULL, kn ? knv : NULL, sinks ? sv : NULL,
                                    kvs[ki], R, &bt, qkv);
                    free(qkv);
                }
                free(qnv);
                free(knv);
                free(sv);
                free(R);
                done_backend(b);
            }
}

/* ---- gated MLPs, and the rows moved to and from experts ---- */

/* The reference of one MLP (gate, up, down; or gate_up with its rows
 * alternating gate, up) for one row x, in double, and what each output
 * may be off by: the down product's own allowance (qref_allowed) plus what
 * its intermediate a_j moves by where gate and up are off by theirs. */
static void ref_mlp(const struct sp_qmat *gate, const struct sp_qmat *up, const struct sp_qmat *gate_up,
                    const struct sp_qmat *down, const struct sp_glu *p, enum acts ac, const float *x, double *out,
                    double *allowed) {
    float a[FF], w[FF > D ? FF : D];
    double da[FF];
    for (int64_t j = 0; j < FF; j++) {
        const struct sp_qmat *mg = gate_up ? gate_up : gate, *mu = gate_up ? gate_up : up;
        int64_t rg = gate_up ? 2 * j : j, ru = gate_up ? 2 * j + 1 : j;
        double g = sp_qmat_dot_row_ref(mg, rg, x), u = sp_qmat_dot_row_ref(mu, ru, x);
        sp_qmat_dequant_row_ref(mg, rg, w);
        double eg = qref_allowed(mg, rg, w, x, ac);
        sp_qmat_dequant_row_ref(mu, ru, w);
        double eu = qref_allowed(mu, ru, w, x, ac);
        /* clamped for sure: the products cannot reach the limit by their error */
        bool g_clamped = g - eg > p->limit, u_clamped = fabs(u) - eu > p->limit;
        g = fmin(g, p->limit);
        u = fmax(fmin(u, p->limit), -p->limit);
        double sig = 1.0 / (1.0 + exp(-p->alpha * g));
        a[j] = (float)((u + p->u_offset) * g * sig);
        /* |d a / d g| and |d a / d u| (zero where clamped), and float's exp */
        double dg = g_clamped ? 0 : fabs((u + p->u_offset) * sig * (1.0 + p->alpha * g * (1.0 - sig)));
        double du = u_clamped ? 0 : fabs(g * sig);
        da[j] = dg * eg + du * eu + TOL_MATMUL * fabs((double)a[j]);
    }
    for (int64_t r = 0; r < D; r++) {
        sp_qmat_dequant_row_ref(down, r, w);
        out[r] = sp_qmat_dot_row_ref(down, r, a);
        allowed[r] = qref_allowed(down, r, w, a, ac);
        for (int64_t j = 0; j < FF; j++) allowed[r] += fabs((double)w[j]) * da[j];
    }
}

/* Four MLPs of format f (gate and up fused into one matrix or apart), d
 * wide with ff outputs each, prepared on b: items[i] takes counts[i] rows
 * of x from row r (the items' rows one after another) and writes its
 * outputs at row r + shift. Not to be moved: the items point into it. */
struct mlps {
    struct mat g[4], u[4], gu[4], dn[4];
    struct sp_linear lg[4], lu[4], lgu[4], ld[4];
    struct sp_mlp_item items[4];
    bool fused;
};

static void mlps_make(struct mlps *m, struct sp_backend *b, const struct fmt *f, bool fused, int64_t d, int64_t ff,
                      const int64_t *counts, struct sp_tensor x, int64_t shift, struct sp_rng *rng) {
    m->fused = fused;
    int64_t row = 0;
    for (int i = 0; i < 4; i++) {
        if (fused) {
            mat_make(&m->gu[i], f->t, f->group, f->sdt, 2 * ff, d, rng);
            m->lgu[i] = linear_of(&m->gu[i]);
            m->lgu[i].interleaved = true;
            assert_int_equal(b->ops->prepare(b, &m->lgu[i]), SP_OK);
        } else {
            mat_make(&m->g[i], f->t, f->group, f->sdt, ff, d, rng);
            mat_make(&m->u[i], f->t, f->group, f->sdt, ff, d, rng);
            m->lg[i] = linear_of(&m->g[i]);
            m->lu[i] = linear_of(&m->u[i]);
            assert_int_equal(b->ops->prepare(b, &m->lg[i]), SP_OK);
            assert_int_equal(b->ops->prepare(b, &m->lu[i]), SP_OK);
        }
        mat_make(&m->dn[i], f->t, f->group, f->sdt, d, ff, rng);
        m->ld[i] = linear_of(&m->dn[i]);
        assert_int_equal(b->ops->prepare(b, &m->ld[i]), SP_OK);
        m->items[i] = (struct sp_mlp_item){fused ? NULL : &m->lg[i], fused ? NULL : &m->lu[i],
                                           fused ? &m->lgu[i] : NULL, &m->ld[i], sp_tensor_rows(x, row, counts[i]),
                                           row + shift};
        row += counts[i];
    }
}

static void mlps_free(struct mlps *m) {
    for (int i = 0; i < 4; i++) {
        if (m->fused)
            mat_free(&m->gu[i]);
        else
            mat_free(&m->g[i]), mat_free(&m->u[i]);
        mat_free(&m->dn[i]);
    }
}

static void test_mlp(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 48);
    static const struct fmt mf[] = {{SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16},
                                    {SP_QTYPE_MXFP4, 32, SP_DTYPE_COUNT},
                                    {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT},
                                    {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16}};
    static const struct sp_glu acts[] = {{1.0f, INFINITY, 0.0f}, {1.702f, 7.0f, 1.0f}};
    static const int64_t counts[] = {1, 9, 4, 20};  // tokens of each item
    for (int ti = 0; ti < n_targets; ti++)
        for (size_t fi = 0; fi < sizeof mf / sizeof *mf; fi++)
            for (int fused = 0; fused < 2; fused++) {
                struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
                const struct sp_glu *act = &acts[fused];
                struct mlps m;
                int64_t rows = 0;
                for (int i = 0; i < 4; i++) rows += counts[i];
                float *xv = randn(rows * D, 1.0f, &rng);
                struct sp_tensor x = tensor_of(b, rows, D, xv), out;
                assert_int_equal(sp_backend_tensor(b, BATCH, D, &out), SP_OK);
                float *poison = malloc(BATCH * D * sizeof *poison);
                for (int64_t i = 0; i < BATCH * D; i++) poison[i] = 12345.0f;
                b->ops->write(b, out, poison);
                /* items take their rows out of order of x: item i's outputs land 3 rows further down */
                mlps_make(&m, b, &mf[fi], fused, D, FF, counts, x, 3, &rng);
                assert_true(b->ops->supports(b, SP_OP_MLP, mf[fi].t));
                b->ops->mlp(b, m.items, 4, act, out);
                float *got = read_back(b, out);
                int64_t row = 0;
                double ref[D], allowed[D], worst = 0;
                enum acts ac = target_acts(&targets[ti], &m.dn[0].m, false);
                for (int i = 0; i < 4; i++) {
                    for (int64_t t = 0; t < counts[i]; t++) {
                        ref_mlp(fused ? NULL : &m.g[i].m, fused ? NULL : &m.u[i].m, fused ? &m.gu[i].m : NULL,
                                &m.dn[i].m, act, ac, xv + (row + t) * D, ref, allowed);
                        for (int64_t r = 0; r < D; r++) {
                            double e = fabs(got[(row + 3 + t) * D + r] - ref[r]) / (allowed[r] + DBL_MIN);
                            if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
                        }
                    }
                    row += counts[i];
                }
                for (int64_t r = 0; r < 3 * D; r++) assert_true(got[r] == 12345.0f);
                for (int64_t r = (rows + 3) * D; r < BATCH * D; r++) assert_true(got[r] == 12345.0f);
                if (!(worst <= 1.0))
                    fail_msg("%s mlp %s%s: off by %.3g x tolerance", targets[ti].label, sp_qtype_name(mf[fi].t),
                             fused ? " (gate_up fused, clamped SwiGLU)" : "", worst);
                mlps_free(&m);
                free(got);
                free(poison);
                free(xv);
                done_backend(b);
            }
}

/* ---- batches against single tokens, to the bit ---- */

/* A shape past the one above: rows of 2880 columns (90 chunks of 32: lane
 * classes of 2 and 3 chunks, and the vector kernels' split over warps) and
 * experts 1024 wide. */
#define BIG_D 2880
#define BIG_FF 1024
#define BIG_BATCH 64

static struct sp_backend *make_big_backend(const struct target *t) {
    struct sp_backend_params p = {
        .shape = {.n_layers = 1, .n_kv_layers = 1, .d_model = BIG_D, .vocab = VOCAB, .n_heads = HEADS,
                  .n_kv_heads = KV_HEADS, .head_dim = HEAD_DIM, .mlp_width = 2 * BIG_FF, .n_experts = EXPERTS,
                  .expert_ff = BIG_FF, .rot_dims = ROT, .inv_freq = inv_freq, .rope_scale = 1.0f},
        .n_ctx = 8, .n_seq = 1, .max_batch = BIG_BATCH, .kv_type = SP_KV_F16, .n_threads = 2,
        .float_activations = t->float_acts};
    struct sp_backend *b;
    if (sp_backend_create(t->dev, &p, &b) != SP_OK) fail_msg("%s: %s", t->label, sp_error_msg());
    return b;
}

/* Token t's row of a batch (cols floats) against the token alone, bit for bit. */
static void same_row_bits(const float *got, const float *want, int64_t cols, const char *what, int64_t t) {
    for (int64_t c = 0; c < cols; c++)
        if (memcmp(&got[c], &want[c], sizeof(float)) != 0)
            fail_msg("%s: token %lld, output %lld: %.9g in the batch, %.9g alone", what, (long long)t, (long long)c,
                     got[c], want[c]);
}

/* A token's products and MLPs with int8 activations give the same bits in
 * a batch as alone: a device runs batches of 16 tokens or more on tensor
 * cores and single tokens on its vector kernels, whose sums' order the
 * tensor-core kernels reproduce. Rows and tokens that are not whole tiles,
 * groups of 1 to 4 chunks, affine scales of each type, mxfp4. */
static void test_batch_bits(void **state) {
    static const struct fmt bf[] = {{SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16},
                                    {SP_QTYPE_AFFINE4, 64, SP_DTYPE_F16},
                                    {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F32},
                                    {SP_QTYPE_MXFP4, 32, SP_DTYPE_COUNT}};
    static const int64_t shapes[][2] = {{40, 256}, {133, BIG_FF}, {70, BIG_D}};
    static const int64_t counts[] = {1, 17, 33, 5};  // tokens of each MLP item
    enum { N = 37 };
    struct sp_rng rng;
    sp_rng_seed(&rng, 52);
    int ran = 0;
    char what[160];
    for (int ti = 0; ti < n_targets; ti++) {
        if (targets[ti].dev == SP_DEVICE_CPU || targets[ti].float_acts) continue;
        ran++;
        struct sp_backend *b = make_big_backend(&targets[ti]);
        for (size_t fi = 0; fi < sizeof bf / sizeof *bf; fi++) {
            for (size_t si = 0; si < sizeof shapes / sizeof *shapes; si++) {
                int64_t rows = shapes[si][0], cols = shapes[si][1];
                if (cols % bf[fi].group) continue;
                struct mat M;
                mat_make(&M, bf[fi].t, bf[fi].group, bf[fi].sdt, rows, cols, &rng);
                struct sp_linear l = linear_of(&M);
                float *bv = randn(rows, 1.0f, &rng);
                if (si == 1) l.bias = bv, l.bias_dtype = SP_DTYPE_F32;
                assert_int_equal(b->ops->prepare(b, &l), SP_OK);
                float *x = randn(N * cols, 1.0f, &rng);
                struct sp_tensor xt = tensor_of(b, N, cols, x), yt, y1;
                assert_int_equal(sp_backend_tensor(b, N, rows, &yt), SP_OK);
                assert_int_equal(sp_backend_tensor(b, 1, rows, &y1), SP_OK);
                b->ops->linear(b, &l, xt, yt);
                float *all = read_back(b, yt);
                snprintf(what, sizeof what, "%.64s linear %.16s g%d %lldx%lld", targets[ti].label,
                         sp_qtype_name(bf[fi].t), bf[fi].group, (long long)rows, (long long)cols);
                for (int64_t t = 0; t < N; t++) {
                    b->ops->linear(b, &l, sp_tensor_rows(xt, t, 1), y1);
                    float *one = read_back(b, y1);
                    same_row_bits(all + t * rows, one, rows, what, t);
                    free(one);
                }
                assert_int_equal(b->ops->error(b), SP_OK);
                free(all);
                free(x);
                free(bv);
                mat_free(&M);
            }
            for (int fused = 0; fused < 2 && BIG_D % bf[fi].group == 0; fused++) {
                const struct sp_glu act =
                    fused ? (struct sp_glu){1.702f, 7.0f, 1.0f} : (struct sp_glu){1.0f, INFINITY, 0.0f};
                struct mlps m;
                int64_t total = 0;
                for (int i = 0; i < 4; i++) total += counts[i];
                float *xv = randn(total * BIG_D, 1.0f, &rng);
                struct sp_tensor x = tensor_of(b, total, BIG_D, xv), out, out1;
                assert_int_equal(sp_backend_tensor(b, total, BIG_D, &out), SP_OK);
                assert_int_equal(sp_backend_tensor(b, 1, BIG_D, &out1), SP_OK);
                mlps_make(&m, b, &bf[fi], fused, BIG_D, BIG_FF, counts, x, 0, &rng);
                b->ops->mlp(b, m.items, 4, &act, out);
                float *all = read_back(b, out);
                snprintf(what, sizeof what, "%.64s mlp %.16s g%d%s", targets[ti].label, sp_qtype_name(bf[fi].t),
                         bf[fi].group, fused ? " (gate_up fused)" : "");
                for (int i = 0; i < 4; i++)
                    for (int64_t t = 0; t < counts[i]; t++) {
                        struct sp_mlp_item one = m.items[i];
                        one.x = sp_tensor_rows(m.items[i].x, t, 1);
                        one.row = 0;
                        b->ops->mlp(b, &one, 1, &act, out1);
                        float *got = read_back(b, out1);
                        same_row_bits(all + (m.items[i].row + t) * BIG_D, got, BIG_D, what, m.items[i].row + t);
                        free(got);
                    }
                assert_int_equal(b->ops->error(b), SP_OK);
                mlps_free(&m);
                free(all);
                free(xv);
            }
        }
        done_backend(b);
    }
    if (!ran) skip();
}

static void test_gather_scatter(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 49);
    for (int ti = 0; ti < n_targets; ti++) {
        struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
        int64_t n = 13, m = 30;
        int32_t rows[30];
        float w[30];
        for (int64_t i = 0; i < m; i++) rows[i] = (int32_t)(sp_rng_next(&rng) % n), w[i] = sp_rng_normal(&rng);
        float *hv = randn(n * D, 1.0f, &rng), *ov = randn(n * D, 1.0f, &rng);
        struct sp_tensor h = tensor_of(b, n, D, hv), out = tensor_of(b, n, D, ov), g;
        assert_int_equal(sp_backend_tensor(b, m, D, &g), SP_OK);
        b->ops->gather(b, g, h, rows);
        float *gv = read_back(b, g);
        for (int64_t i = 0; i < m; i++) assert_memory_equal(gv + i * D, hv + rows[i] * D, D * sizeof(float));
        b->ops->scatter_add(b, out, g, rows, w);
        float *got = read_back(b, out);
        for (int64_t t = 0; t < n; t++)
            for (int64_t e = 0; e < D; e++) {
                double ref = ov[t * D + e], mag = fabs(ref);
                for (int64_t i = 0; i < m; i++)
                    if (rows[i] == t) ref += (double)w[i] * gv[i * D + e], mag += fabs((double)w[i] * gv[i * D + e]);
                if (!(fabs(got[t * D + e] - ref) <= TOL_FLOAT * mag))
                    fail_msg("%s scatter_add: row %lld element %lld: %g, reference %g", targets[ti].label, (long long)t,
                             (long long)e, got[t * D + e], ref);
            }
        free(gv);
        free(got);
        free(hv);
        free(ov);
        done_backend(b);
    }
}

/* ---- the final norm and lm_head ---- */

static void test_logits(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 50);
    static const struct fmt hf[] = {{SP_QTYPE_BF16, 1, SP_DTYPE_COUNT}, {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16},
                                    {SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16}};
    for (int ti = 0; ti < n_targets; ti++)
        for (size_t fi = 0; fi < sizeof hf / sizeof *hf; fi++) {
            struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
            struct mat H;
            mat_make(&H, hf[fi].t, hf[fi].group, hf[fi].sdt, VOCAB, D, &rng);
            struct sp_linear head = linear_of(&H);
            assert_int_equal(b->ops->prepare(b, &head), SP_OK);
            int64_t n = 9;
            bool want[9] = {true, false, false, true, true, false, true, false, true};
            float *xv = randn(n * D, 2.0f, &rng), *nw = randn(D, 1.0f, &rng);
            const float *norm;
            struct sp_vector vn = {nw, SP_DTYPE_F32, D};
            assert_int_equal(b->ops->vector(b, &vn, &norm), SP_OK);
            struct sp_tensor x = tensor_of(b, n, D, xv);
            float *logits = malloc(n * VOCAB * sizeof *logits), *normed = malloc(n * D * sizeof *normed);
            assert_true(b->ops->supports(b, SP_OP_LOGITS, hf[fi].t));
            int64_t m = b->ops->logits(b, norm, 1e-5f, &head, x, want, logits);
            assert_int_equal(m, 5);
            int64_t k = 0;
            for (int64_t t = 0; t < n; t++) {
                if (!want[t]) continue;
                double ss = 0;
                for (int64_t i = 0; i < D; i++) ss += (double)xv[t * D + i] * xv[t * D + i];
                double inv = 1.0 / sqrt(ss / D + 1e-5);
                for (int64_t i = 0; i < D; i++) normed[k * D + i] = (float)(xv[t * D + i] * inv * nw[i]);
                k++;
            }
            int64_t br, bt;
            double ratio = worst_ratio(&H.m, normed, D, m, logits, VOCAB, target_acts(&targets[ti], &H.m, false), &br, &bt);
            if (!(ratio <= 1.0))
                fail_msg("%s logits %s: row %lld of token %lld off by %.3g x tolerance", targets[ti].label,
                         sp_qtype_name(hf[fi].t), (long long)br, (long long)bt, ratio);
            if (b->ops->argmax) {  /* the greedy choices of the same rows: the host's arg max of their logits */
                int32_t ids[9];
                assert_int_equal(b->ops->argmax(b, norm, 1e-5f, &head, x, want, ids), m);
                for (int64_t r = 0; r < m; r++) assert_int_equal(ids[r], sp_argmax(logits + r * VOCAB, VOCAB));
            }
            free(logits);
            free(normed);
            free(xv);
            free(nw);
            mat_free(&H);
            done_backend(b);
        }
}

/* Greedy choices among equal logits: rows 3, 10, 17, ... of the head are
 * one row u, far longer than the others, and the first half of the tokens
 * lie along u, so their largest logits are those equal ones and the choice
 * is the first of them (3), as the host's arg max chooses. */
static void test_argmax_ties(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 52);
    for (int ti = 0; ti < n_targets; ti++) {
        struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
        if (!b->ops->argmax) {
            done_backend(b);
            continue;
        }
        struct mat H;
        mat_make(&H, SP_QTYPE_F32, 1, SP_DTYPE_COUNT, VOCAB, D, &rng);
        float *u = randn(D, 1000.0f, &rng), *hw = H.codes;
        for (int64_t r = 3; r < VOCAB; r += 7) memcpy(hw + r * D, u, D * sizeof *u);
        struct sp_linear head = linear_of(&H);
        assert_int_equal(b->ops->prepare(b, &head), SP_OK);
        enum { N = 16 };
        float *xv = randn(N * D, 1.0f, &rng), *logits = malloc(N * VOCAB * sizeof *logits), ones[D];
        for (int t = 0; t < N / 2; t++)
            for (int i = 0; i < D; i++) xv[t * D + i] += u[i];
        for (int i = 0; i < D; i++) ones[i] = 1.0f;
        const float *norm;
        struct sp_vector vn = {ones, SP_DTYPE_F32, D};
        assert_int_equal(b->ops->vector(b, &vn, &norm), SP_OK);
        struct sp_tensor x = tensor_of(b, N, D, xv);
        assert_int_equal(b->ops->logits(b, norm, 1e-5f, &head, x, NULL, logits), N);
        int32_t ids[N];
        assert_int_equal(b->ops->argmax(b, norm, 1e-5f, &head, x, NULL, ids), N);
        for (int t = 0; t < N; t++) {
            assert_int_equal(ids[t], sp_argmax(logits + t * VOCAB, VOCAB));
            if (t < N / 2 && ids[t] != 3) fail_msg("%s: token %d chose %d, not the first equal largest (3)", targets[ti].label, t, ids[t]);
        }
        free(u);
        free(xv);
        free(logits);
        mat_free(&H);
        done_backend(b);
    }
}

/* A backend's own best logits (ops->top_k, sampling's candidates) are the
 * host's sp_top_k of the logits it gives: for vocabularies of one block of
 * the device's sort and of one, two and three rounds of them, k of 1, 40
 * and 64, rows left out; among the logits ties at the top (head rows
 * 3, 10, 17, ... one long row u, two tokens along it), NaN (a row of
 * +inf and -inf) and infinities (a row of one, -inf for the tokens along
 * u). */
static void test_top_k(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 53);
    static const int64_t vocabs[] = {VOCAB, 4097, 157184, 300000}, ks[] = {1, 40, SP_TOP_K_MAX};
    int tried = 0;
    for (int ti = 0; ti < n_targets; ti++)
        for (size_t vi = 0; vi < sizeof vocabs / sizeof *vocabs; vi++) {
            const int64_t V = vocabs[vi];
            struct sp_backend *b = make_backend_vocab(&targets[ti], SP_KV_F16, V);
            if (!b->ops->top_k) {
                done_backend(b);
                continue;
            }
            tried++;
            struct mat H;
            mat_make(&H, SP_QTYPE_F32, 1, SP_DTYPE_COUNT, V, D, &rng);
            float *u = randn(D, 1000.0f, &rng), *hw = H.codes;
            for (int64_t r = 3; r < V; r += 7) memcpy(hw + r * D, u, D * sizeof *u);
            for (int i = 0; i < D; i++) hw[5 * D + i] = i % 2 ? INFINITY : -INFINITY;
            memset(hw + 6 * D, 0, D * sizeof *hw);
            hw[6 * D] = u[0] > 0 ? -INFINITY : INFINITY;  // -inf for the tokens along u
            struct sp_linear head = linear_of(&H);
            assert_int_equal(b->ops->prepare(b, &head), SP_OK);
            enum { N = 5 };
            bool want[N] = {true, false, true, true, true};
            float *xv = randn(N * D, 1.0f, &rng), *logits = malloc(N * V * sizeof *logits), ones[D];
            for (int i = 0; i < D; i++) xv[i] += u[i], xv[2 * D + i] += u[i], ones[i] = 1.0f;
            const float *norm;
            struct sp_vector vn = {ones, SP_DTYPE_F32, D};
            assert_int_equal(b->ops->vector(b, &vn, &norm), SP_OK);
            struct sp_tensor x = tensor_of(b, N, D, xv);
            int64_t m = b->ops->logits(b, norm, 1e-5f, &head, x, want, logits);
            assert_int_equal(m, 4);
            struct sp_cand got[N * SP_TOP_K_MAX], want_top[SP_TOP_K_MAX];
            for (size_t ki = 0; ki < sizeof ks / sizeof *ks; ki++) {
                int64_t k = ks[ki] < V ? ks[ki] : V;
                assert_int_equal(b->ops->top_k(b, norm, 1e-5f, &head, x, want, k, got), m);
                for (int64_t r = 0; r < m; r++) {
                    sp_top_k(logits + r * V, V, k, want_top);
                    for (int64_t j = 0; j < k; j++)
                        if (memcmp(&got[r * k + j], &want_top[j], sizeof *want_top) != 0)
                            fail_msg("%s: vocabulary %lld, k %lld, row %lld: candidate %lld is %d (%g), the host's %d (%g)",
                                     targets[ti].label, (long long)V, (long long)k, (long long)r, (long long)j,
                                     got[r * k + j].id, got[r * k + j].logit, want_top[j].id, want_top[j].logit);
                }
                for (int64_t r = 0; r < 2; r++)  // tokens 0 and 2, along u
                    if (got[r * k].id != 3 || (k > 1 && got[r * k + 1].id != 10))
                        fail_msg("%s: the ties at the top, %d first, not 3 (then 10)", targets[ti].label, got[r * k].id);
            }
            free(u);
            free(xv);
            free(logits);
            mat_free(&H);
            done_backend(b);
        }
    if (!tried) print_message("no backend here has its own best logits (the host's sp_top_k serves)\n");
}

/* A device backend refuses the CPU's interleaved rows at prepare, and keeps
 * an op's failure (here a weight it was never given) for ops->error: it is
 * reported when asked, and host gives zeros after it. */
static void check_device_errors(const struct target *t) {
    struct sp_backend *b = make_backend(t, SP_KV_F16);
    assert_non_null(b->ops->error);
    struct sp_rng rng;
    sp_rng_seed(&rng, 51);
    struct mat M;
    mat_make(&M, SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 32, D, &rng);
    assert_true(sp_qmat_interleavable(&M.m));
    size_t groups = (size_t)(M.m.rows * (M.m.cols / M.m.group)) * sizeof(uint16_t);
    void *codes = malloc((size_t)M.m.rows * sp_qtype_row_bytes(M.m.type, M.m.cols)), *scales = malloc(groups),
         *biases = malloc(groups);
    struct sp_linear il = {0};
    sp_qmat_interleave(&M.m, codes, scales, biases, &il.w);
    assert_int_equal(b->ops->prepare(b, &il), SP_ERR_UNSUPPORTED);
    assert_non_null(strstr(sp_error_msg(), "row order"));
    assert_int_equal(b->ops->error(b), SP_OK);
    struct sp_linear l = linear_of(&M);
    float *x = randn(2 * D, 1.0f, &rng);
    struct sp_tensor xt = tensor_of(b, 2, D, x), yt;
    assert_int_equal(sp_backend_tensor(b, 2, M.m.rows, &yt), SP_OK);
    b->ops->linear(b, &l, xt, yt);
    assert_int_not_equal(b->ops->error(b), SP_OK);
    if (!strstr(sp_error_msg(), "prepare")) fail_msg("%s: the error says \"%s\"", t->label, sp_error_msg());
    float *y = read_back(b, yt);
    for (int64_t i = 0; i < 2 * M.m.rows; i++) assert_true(y[i] == 0.0f);
    free(y);
    free(x);
    free(codes);
    free(scales);
    free(biases);
    mat_free(&M);
    done_backend(b);
}

/* Every op is claimed for every format on the CPU; nothing past the tables is. */
static void test_supports(void **state) {
    for (int ti = 0; ti < n_targets; ti++) {
        struct sp_backend *b = make_backend(&targets[ti], SP_KV_F16);
        for (int op = 0; op < SP_OP_COUNT; op++) {
            assert_string_not_equal(sp_op_name((enum sp_op)op), "?");
            for (int f = 0; f < SP_QTYPE_COUNT && targets[ti].dev == SP_DEVICE_CPU; f++)
                assert_true(b->ops->supports(b, (enum sp_op)op, (enum sp_qtype)f));
        }
        assert_false(b->ops->supports(b, SP_OP_COUNT, SP_QTYPE_F32));
        done_backend(b);
        if (targets[ti].dev != SP_DEVICE_CPU) check_device_errors(&targets[ti]);
    }
    /* a device this build lacks is an error that says so */
    for (int d = 0; d < SP_DEVICE_COUNT; d++) {
        if (sp_backend_ops((enum sp_device)d)) continue;
        struct sp_backend_params p = {.n_ctx = 1, .n_seq = 1, .max_batch = 1};
        struct sp_backend *b;
        assert_int_not_equal(sp_backend_create((enum sp_device)d, &p, &b), SP_OK);
        assert_non_null(strstr(sp_error_msg(), sp_device_name((enum sp_device)d)));
    }
}

static int setup(void **state) {
    find_targets();
    for (int i = 0; i < n_targets; i++) print_message("[ BACKEND  ] %s\n", targets[i].label);
    return n_targets > 0 ? 0 : -1;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_supports),
        cmocka_unit_test(test_linear),
        cmocka_unit_test(test_linear_float_activations),
        cmocka_unit_test(test_embed_norm_add),
        cmocka_unit_test(test_attention),
        cmocka_unit_test(test_mlp),
        cmocka_unit_test(test_batch_bits),
        cmocka_unit_test(test_gather_scatter),
        cmocka_unit_test(test_logits),
        cmocka_unit_test(test_argmax_ties),
        cmocka_unit_test(test_top_k),
    };
    return cmocka_run_group_tests(tests, setup, NULL);
}
