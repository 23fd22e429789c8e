/*
 * test_forward.c - the forward pass of every architecture against the
 * reference implementations' logits (tests/fixtures/, made by
 * tools/fixtures/make_fixtures.py): every position of two sequences, the
 * 32-token greedy continuation, and the invariances the server relies on
 * (chunked prefill = one batch = token by token; sequences in one batch do
 * not affect each other).
 */
#include "helpers.h"

#include <math.h>

#include "core/json.h"
#include "backend/cpu/kernels.h"
#include "model/expert_tier.h"
#include "model/forward.h"
#include "runtime/experts.h"
#include "runtime/routing.h"
#include "model/inspect.h"
#include "model/quantize.h"
#include "model/ranks.h"
#include "model/synth.h"
#include "runtime/sampler.h"

static const char *const archs[] = {"llama", "qwen3", "qwen3_moe", "gpt_oss", "bailing_moe", "qwen3_5_moe",
                                    "bailing_hybrid"};

/* At most: sequence a, sequence b (gpt-oss's: 224 tokens, 14 of its
 * 16-token sliding windows) and the greedy continuation of a. */
#define REF_A 16
#define REF_B 256
#define REF_GREEDY 32

/* The device the contexts of the checks below run on (the test_cuda_* tests
 * switch it for their run). */
static enum sp_device device = SP_DEVICE_CPU;
/* Whether a device's products keep activations in float (the exact path). */
static bool float_acts;

struct ref {
    int32_t a[REF_A], b[REF_B], greedy[REF_GREEDY];
    int64_t na, nb, ng, vocab;
    float *la, *lb;
};

static void read_ints(const cJSON *arr, int32_t *out, int64_t *n, int64_t cap) {
    *n = 0;
    for (const cJSON *e = arr ? arr->child : NULL; e; e = e->next) {
        assert_true(*n < cap);
        out[(*n)++] = (int32_t)e->valuedouble;
    }
}

static float *read_f32(const char *path, size_t want) {
    char *data;
    size_t len;
    assert_int_equal(sp_read_file(path, 64 << 20, &data, &len), SP_OK);
    assert_int_equal(len, want * sizeof(float));
    float *f = malloc(len);
    memcpy(f, data, len);
    sp_free(data);
    return f;
}

static void load_ref(const char *arch, struct ref *r) {
    char path[256];
    snprintf(path, sizeof path, "tests/fixtures/%s/ref/ref.json", arch);
    cJSON *j;
    assert_int_equal(sp_json_parse_file(path, 1 << 20, &j), SP_OK);
    read_ints(cJSON_GetObjectItem(j, "tokens_a"), r->a, &r->na, REF_A);
    read_ints(cJSON_GetObjectItem(j, "tokens_b"), r->b, &r->nb, REF_B);
    read_ints(cJSON_GetObjectItem(j, "greedy_a"), r->greedy, &r->ng, REF_GREEDY);
    r->vocab = (int64_t)cJSON_GetObjectItem(j, "vocab")->valuedouble;
    cJSON_Delete(j);
    snprintf(path, sizeof path, "tests/fixtures/%s/ref/logits_a.f32", arch);
    r->la = read_f32(path, (size_t)(r->na * r->vocab));
    snprintf(path, sizeof path, "tests/fixtures/%s/ref/logits_b.f32", arch);
    r->lb = read_f32(path, (size_t)(r->nb * r->vocab));
}

/* tests/fixtures/<arch> opened into *m, its reference into *r. */
static void open_fixture(const char *arch, struct sp_model **m, struct ref *r) {
    char dir[256];
    snprintf(dir, sizeof dir, "tests/fixtures/%s", arch);
    if (sp_model_open(dir, m) != SP_OK) fail_msg("%s: %s", dir, sp_error_msg());
    load_ref(arch, r);
}

/* Runs tokens [0, n) of one sequence in batches of `chunk`, logits for all. */
static void run_seq(struct sp_ctx *c, const int32_t *tok, int64_t n, int64_t chunk, int seq, float *logits, int64_t vocab) {
    int32_t pos[256], sq[256];
    for (int64_t s = 0; s < n; s += chunk) {
        int64_t m = n - s < chunk ? n - s : chunk;
        for (int64_t i = 0; i < m; i++) {
            pos[i] = (int32_t)(s + i);
            sq[i] = seq;
        }
        struct sp_batch b = {.n = m, .tokens = tok + s, .pos = pos, .seq = sq};
        if (sp_ctx_forward(c, &b, logits + s * vocab) != SP_OK) fail_msg("%s", sp_error_msg());
    }
}

/* Whether compare() holds rounded activations to the median position
 * (compare_rounded) instead of every position. */
static bool rounded_acts;
/* The int8-activation paths' tolerance (test_cuda_int8_activations says why). */
#define TOL_INT8_LOGITS 0.1
/* ... on a recurrent model, whose state carries every token's rounding on to
 * all later ones: the median position of qwen3_5_moe's 4-bit variants moved
 * by 0.018-0.064 of the largest logit with the CPU's int8 sets (avx512) and
 * by 0.018-0.107 on the H200 (a broken product moves it by about 1). */
#define TOL_INT8_RECURRENT 0.3

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* For int8 activations on the tiny random fixtures: their routers' top
 * experts are often near-ties that the rounding swaps, and a swapped
 * expert moves that position's logits by tens of percent, so the
 * positions are held as a whole: the median position's max |ours - ref|
 * <= tol * max |ref|, and the argmax equal at 9 positions of 10 or more
 * that are not near-ties (as compare() has them). */
static void compare_rounded(const char *what, const float *ours, const float *ref, int64_t n, int64_t vocab,
                            double tol) {
    double max_ref = 0, *pos = malloc((size_t)n * sizeof *pos);
    for (int64_t i = 0; i < n * vocab; i++) max_ref = fmax(max_ref, fabs(ref[i]));
    int64_t flips = 0;
    for (int64_t t = 0; t < n; t++) {
        pos[t] = 0;
        for (int64_t i = 0; i < vocab; i++) pos[t] = fmax(pos[t], fabs((double)ours[t * vocab + i] - ref[t * vocab + i]));
        int32_t a = sp_argmax(ours + t * vocab, vocab), b = sp_argmax(ref + t * vocab, vocab);
        flips += a != b && fabs(ref[t * vocab + a] - ref[t * vocab + b]) > 2 * pos[t];
        pos[t] /= max_ref;
    }
    qsort(pos, (size_t)n, sizeof *pos, cmp_double);
    double median = pos[n / 2], worst = pos[n - 1];
    free(pos);
    print_message("%s: median position max|diff| %.3g, worst %.3g of max|ref| %.3g; %lld argmax differences "
                  "of %lld positions\n",
                  what, median, worst, max_ref, (long long)flips, (long long)n);
    if (!(median <= tol) || 10 * flips > n)
        fail_msg("%s: median position off by %.3g of max|ref|, %lld argmax differences of %lld positions", what,
                 median, (long long)flips, (long long)n);
}

/* max |ours - ref| <= tol * max |ref| everywhere, and the same argmax at
 * every position except near-ties: where the reference's top two are within
 * twice that position's largest difference (or 1e-5), which the difference
 * alone can swap (int16-activation products round x, so a tie closer than
 * their error may go either way). */
static void compare(const char *what, const float *ours, const float *ref, int64_t n, int64_t vocab, double tol) {
    if (rounded_acts) {
        compare_rounded(what, ours, ref, n, vocab, tol);
        return;
    }
    double max_ref = 0, max_diff = 0;
    for (int64_t i = 0; i < n * vocab; i++) {
        max_ref = fmax(max_ref, fabs(ref[i]));
        max_diff = fmax(max_diff, fabs((double)ours[i] - ref[i]));
    }
    int flips = 0;
    for (int64_t t = 0; t < n; t++) {
        int32_t a = sp_argmax(ours + t * vocab, vocab), b = sp_argmax(ref + t * vocab, vocab);
        if (a == b) continue;
        double pos_diff = 0;
        for (int64_t i = 0; i < vocab; i++) pos_diff = fmax(pos_diff, fabs((double)ours[t * vocab + i] - ref[t * vocab + i]));
        double gap = fabs(ref[t * vocab + a] - ref[t * vocab + b]);
        if (gap > fmax(1e-5, 2 * pos_diff)) flips++;
        else print_message("%s: position %lld: argmax %d vs %d is a near-tie (gap %.3g)\n", what, (long long)t, a, b, gap);
    }
    print_message("%s: max|diff| %.3g = %.3g of max|ref| %.3g\n", what, max_diff, max_diff / max_ref, max_ref);
    if (max_diff > tol * max_ref || flips) fail_msg("%s: max|diff| %g (%.3g of max|ref|), %d argmax differences", what, max_diff, max_diff / max_ref, flips);
}

/* Runs both sequences (b in chunks, on another sequence slot) and, when
 * asked, the greedy continuation, against the given reference logits. */
static void check_model(const char *label, struct sp_model *m, const struct ref *r, const float *la, const float *lb,
                        enum sp_kv_type kv, double tol, bool greedy) {
    assert_int_equal(m->arch.vocab, r->vocab);
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 2, .max_batch = 64, .kv_type = kv, .device = device, .n_threads = 2,
                              .float_activations = float_acts};
    if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s: %s", label, sp_error_msg());
    float *out = malloc((size_t)(r->nb * r->vocab) * sizeof(float));
    char what[160];
    const char *dev = device == SP_DEVICE_CPU ? "" : sp_device_name(device);
    snprintf(what, sizeof what, "%s%s%s (kv %s) sequence a", dev, *dev ? " " : "", label, sp_kv_type_name(kv));
    run_seq(c, r->a, r->na, r->na, 0, out, r->vocab);
    compare(what, out, la, r->na, r->vocab, tol);
    snprintf(what, sizeof what, "%s%s%s (kv %s) sequence b", dev, *dev ? " " : "", label, sp_kv_type_name(kv));
    run_seq(c, r->b, r->nb, 64, 1, out, r->vocab);  // chunked prefill, longer than the sliding window
    compare(what, out, lb, r->nb, r->vocab, tol);
    if (greedy) {
        /* greedy continuation of a, one token per step on sequence 0 */
        float *lg = malloc((size_t)r->vocab * sizeof(float));
        int32_t pos, seq = 0;
        run_seq(c, r->a, r->na, r->na, 0, out, r->vocab);
        int32_t tok = sp_argmax(out + (r->na - 1) * r->vocab, r->vocab);
        for (int64_t i = 0; i < r->ng; i++) {
            if (tok != r->greedy[i])
                fail_msg("%s%s%s: greedy token %lld is %d, reference %d", dev, *dev ? " " : "", label, (long long)i,
                         tok, r->greedy[i]);
            pos = (int32_t)(r->na + i);
            struct sp_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
            assert_int_equal(sp_ctx_forward(c, &b, lg), SP_OK);
            tok = sp_argmax(lg, r->vocab);
        }
        free(lg);
    }
    free(out);
    sp_ctx_free(c);
}

static void check_arch(const char *arch, enum sp_kv_type kv, double tol) {
    struct sp_model *m;
    struct ref r;
    open_fixture(arch, &m, &r);
    check_model(arch, m, &r, r.la, r.lb, kv, tol, true);
    free(r.la);
    free(r.lb);
    sp_model_close(m);
}

/* The set that computes what the active one does, but with activations of
 * 4-bit rows rounded to int16 instead of int8 and those of bf16 rows kept
 * in float (the active one itself when it rounds neither). */
static const struct sp_kernels *int16_twin(const struct sp_kernels *k) {
    switch (k->isa) {
    case SP_KERNELS_AVX2:
        return sp_kernels_of(SP_KERNELS_AVX2_INT16);
    case SP_KERNELS_AVXVNNI:
        return sp_kernels_of(SP_KERNELS_AVXVNNI_INT16);
    case SP_KERNELS_AVX512:
        return sp_kernels_of(SP_KERNELS_AVX512_INT16);
    case SP_KERNELS_AMX:
        return sp_kernels_of(SP_KERNELS_AMX_INT16);
    default:
        return k;
    }
}

/* The fixtures quantized by sparrow against the reference run on the same
 * weights dequantized (tools/fixtures/quantized_variants.sh, ref_dequant.py),
 * with activations rounded to int16 at most: the int8 rounding of 4-bit
 * products moves these random-weight models' logits by percents
 * (tests/test_kernels.c holds those products to their error bound;
 * bench/act_precision.sh measures what they cost a trained model). */
static void check_quantized_variants(double tol) {
    const struct sp_kernels *before = sp_kernels_use(int16_twin(sp_kernels()));
    const struct {
        const char *name;
        enum sp_qtype type;
        int group;
    } variants[] = {{"affine4", SP_QTYPE_AFFINE4, 64}, {"affine8", SP_QTYPE_AFFINE8, 64}, {"mxfp4", SP_QTYPE_MXFP4, 32}};
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
        char dir[256], path[300];
        snprintf(dir, sizeof dir, "tests/fixtures/%s", archs[i]);
        struct sp_model *src;
        assert_int_equal(sp_model_open(dir, &src), SP_OK);
        /* a router's near-tie that int16 rounding swaps moves every later
         * position of a recurrent model (its state carries it on; affine8's
         * sequence b swaps one at position 30): those run on floats */
        const struct sp_kernels *twin = sp_kernels();
        if (sp_arch_recurrent(&src->arch)) sp_kernels_use(sp_kernels_of(SP_KERNELS_PORTABLE));
        struct ref r;
        load_ref(archs[i], &r);
        for (size_t k = 0; k < sizeof variants / sizeof *variants; k++) {
            char *qdir = th_tmpdir();
            struct sp_quantize_opts o = {.type = variants[k].type, .group = variants[k].group};
            assert_int_equal(sp_quantize_model(src, qdir, &o), SP_OK);
            struct sp_model *q;
            assert_int_equal(sp_model_open(qdir, &q), SP_OK);
            snprintf(path, sizeof path, "%s/ref/%s_a.f32", dir, variants[k].name);
            float *la = read_f32(path, (size_t)(r.na * r.vocab));
            snprintf(path, sizeof path, "%s/ref/%s_b.f32", dir, variants[k].name);
            float *lb = read_f32(path, (size_t)(r.nb * r.vocab));
            char label[64];
            snprintf(label, sizeof label, "%s %s", archs[i], variants[k].name);
            check_model(label, q, &r, la, lb, SP_KV_F32,
                        rounded_acts && sp_arch_recurrent(&q->arch) ? TOL_INT8_RECURRENT : tol, false);
            free(la);
            free(lb);
            sp_model_close(q);
            th_rmdir(qdir);
        }
        free(r.la);
        free(r.lb);
        sp_model_close(src);
        sp_kernels_use(twin);
    }
    sp_kernels_use(before);
}

static void test_quantized_variants(void **state) { check_quantized_variants(1e-3); }

/* Every fixture against its reference, through the active set's int16
 * twin: floats for the fixtures' bf16 rows. Rounding their activations to
 * bf16 (the avx512 and amx sets on CPUs with AVX512-BF16) moves these
 * random-weight models' logits by 0.4-22% of the largest, as int8 rounding
 * moves them by percents (test_quantized_variants); tests/test_kernels.c
 * holds those products to their error bound (bench/act_precision.sh: on a
 * trained model, perplexity +0.01%). */
static void check_reference_logits(enum sp_kv_type kv) {
    const struct sp_kernels *before = sp_kernels_use(int16_twin(sp_kernels()));
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) check_arch(archs[i], kv, 1e-3);
    sp_kernels_use(before);
}

static void test_reference_logits_f32_kv(void **state) { check_reference_logits(SP_KV_F32); }

static void test_reference_logits_f16_kv(void **state) { check_reference_logits(SP_KV_F16); }

/* Chunked, whole and token-by-token prefill give bit-identical logits, and
 * two sequences interleaved in one batch do not disturb each other; the
 * same for a sequence longer than a tile of attention. */
static void check_batch_invariance(struct sp_model *m, const struct ref *r) {
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 2, .max_batch = 32, .device = device, .n_threads = 2,
                              .float_activations = float_acts};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    int64_t V = r->vocab, n = r->na;
    float *whole = malloc((size_t)(n * V) * sizeof(float)), *one = malloc((size_t)(n * V) * sizeof(float));
    float *mixed = malloc((size_t)(2 * n * V) * sizeof(float));
    run_seq(c, r->a, n, n, 0, whole, V);
    run_seq(c, r->a, n, 1, 1, one, V);
    assert_memory_equal(whole, one, (size_t)(n * V) * sizeof(float));
    run_seq(c, r->a, n, 5, 0, one, V);
    assert_memory_equal(whole, one, (size_t)(n * V) * sizeof(float));
    /* a and b interleaved: a on sequence 0, b on sequence 1 */
    int32_t tok[32], pos[32], seq[32];
    for (int64_t i = 0; i < n; i++) {
        tok[2 * i] = r->a[i], pos[2 * i] = (int32_t)i, seq[2 * i] = 0;
        tok[2 * i + 1] = r->b[i], pos[2 * i + 1] = (int32_t)i, seq[2 * i + 1] = 1;
    }
    struct sp_batch b = {.n = 2 * n, .tokens = tok, .pos = pos, .seq = seq};
    assert_int_equal(sp_ctx_forward(c, &b, mixed), SP_OK);
    for (int64_t i = 0; i < n; i++) assert_memory_equal(mixed + 2 * i * V, whole + i * V, (size_t)V * sizeof(float));
    /* the same batch again, asking for its greedy choices: the host's arg max of those logits */
    int32_t want_ids[32], ids[32];
    for (int64_t i = 0; i < 2 * n; i++) want_ids[i] = sp_argmax(mixed + i * V, V);
    b.argmax = ids;
    assert_int_equal(sp_ctx_forward(c, &b, mixed), SP_OK);
    assert_memory_equal(ids, want_ids, (size_t)(2 * n) * sizeof *ids);
    /* and for each row's best logits: the host's sp_top_k of those logits */
    b.argmax = NULL;
    assert_int_equal(sp_ctx_forward(c, &b, mixed), SP_OK);
    int64_t ks[] = {1, 7, V < SP_TOP_K_MAX ? V : SP_TOP_K_MAX};
    struct sp_cand *top = malloc((size_t)(2 * n * SP_TOP_K_MAX) * sizeof *top), want_top[SP_TOP_K_MAX];
    for (size_t j = 0; j < sizeof ks / sizeof *ks; j++) {
        b.top = top;
        b.top_k = ks[j];
        float *scratch = malloc((size_t)(2 * n * V) * sizeof(float));
        assert_int_equal(sp_ctx_forward(c, &b, scratch), SP_OK);
        free(scratch);
        for (int64_t i = 0; i < 2 * n; i++) {
            sp_top_k(mixed + i * V, V, ks[j], want_top);
            assert_memory_equal(top + i * ks[j], want_top, (size_t)ks[j] * sizeof *top);
        }
    }
    b.top_k = SP_TOP_K_MAX + 1;
    assert_int_equal(sp_ctx_forward(c, &b, mixed), SP_ERR_ARG);
    b.top = NULL;
    free(top);
    /* bad input is an error, not a crash */
    int32_t bad = (int32_t)V, zero = 0, big = 64;
    struct sp_batch bb = {.n = 1, .tokens = &bad, .pos = &zero, .seq = &zero};
    assert_int_equal(sp_ctx_forward(c, &bb, mixed), SP_ERR_ARG);
    bb.tokens = &zero;
    bb.pos = &big;
    assert_int_equal(sp_ctx_forward(c, &bb, mixed), SP_ERR_ARG);
    sp_ctx_free(c);
    /* the longer sequence in chunks of 64 (attention tiles of 16 tokens over
     * several blocks of cached positions): the same bits as token by token */
    p.n_ctx = 256;
    p.max_batch = 64;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    size_t nbv = (size_t)(r->nb * V) * sizeof(float);
    float *wb = malloc(nbv), *ob = malloc(nbv);
    run_seq(c, r->b, r->nb, 64, 0, wb, V);
    run_seq(c, r->b, r->nb, 1, 1, ob, V);
    assert_memory_equal(wb, ob, nbv);
    free(wb);
    free(ob);
    free(whole);
    free(one);
    free(mixed);
    sp_ctx_free(c);
}

/* On the bf16 fixture, and on its 4-bit copies (int8 activations in the
 * default x86 sets: each token rounded on its own, so the same holds). */
static void test_batch_invariance(void **state) {
    struct sp_model *m;
    assert_int_equal(sp_model_open("tests/fixtures/bailing_moe", &m), SP_OK);
    struct ref r;
    load_ref("bailing_moe", &r);
    check_batch_invariance(m, &r);
    const struct sp_quantize_opts quants[] = {{.type = SP_QTYPE_AFFINE4, .group = 64},
                                              {.type = SP_QTYPE_MXFP4, .group = 32}};
    for (size_t k = 0; k < 2; k++) {
        char *qdir = th_tmpdir();
        assert_int_equal(sp_quantize_model(m, qdir, &quants[k]), SP_OK);
        struct sp_model *q;
        assert_int_equal(sp_model_open(qdir, &q), SP_OK);
        check_batch_invariance(q, &r);
        sp_model_close(q);
        th_rmdir(qdir);
    }
    free(r.la);
    free(r.lb);
    sp_model_close(m);
}

/* Chunked, whole and token-by-token prefill and interleaved sequences on a
 * recurrent model too; its sequences go on only from the position their
 * state or snapshot holds: a gap is an error, a snapshot taken mid-batch
 * is resumed and copied to another sequence with the same bits. */
static void check_recurrent_states(const char *arch) {
    struct sp_model *m;
    struct ref r;
    open_fixture(arch, &m, &r);
    check_batch_invariance(m, &r);
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 2, .max_batch = 32, .device = device, .n_threads = 2,
                              .float_activations = float_acts};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    int64_t V = r.vocab, n = r.na, half = n / 2;
    size_t bytes = (size_t)(n * V) * sizeof(float);
    float *whole = malloc(bytes), *got = malloc(bytes);
    run_seq(c, r.a, n, n, 0, whole, V);
    /* a position past what the state holds */
    int32_t tok = r.a[0], pos = (int32_t)n + 3, seq = 0;
    struct sp_batch gap = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
    assert_int_equal(sp_ctx_forward(c, &gap, got), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "recurrent state holds 16 positions"));
    /* the first half with a snapshot after it, in one batch with the second */
    int32_t ps[REF_A], sq[REF_A];
    bool snap[REF_A] = {false};
    for (int64_t i = 0; i < n; i++) ps[i] = (int32_t)i, sq[i] = 0;
    snap[half - 1] = true;
    struct sp_batch b = {.n = n, .tokens = r.a, .pos = ps, .seq = sq, .snapshot = snap};
    assert_int_equal(sp_ctx_forward(c, &b, got), SP_OK);
    assert_memory_equal(got, whole, bytes);
    assert_int_equal(sp_ctx_seq_resumable(c, 0, n), n);
    assert_int_equal(sp_ctx_seq_resumable(c, 0, n - 1), half);
    assert_int_equal(sp_ctx_seq_resumable(c, 0, half - 1), 0);
    /* back to the snapshot, and the second half again */
    sp_ctx_seq_resume(c, 0, half);
    struct sp_batch second = {.n = n - half, .tokens = r.a + half, .pos = ps + half, .seq = sq};
    assert_int_equal(sp_ctx_forward(c, &second, got), SP_OK);
    assert_memory_equal(got, whole + half * V, (size_t)((n - half) * V) * sizeof(float));
    /* the snapshot copied to sequence 1, which goes on from it */
    sp_ctx_copy_seq(c, 0, 1, half);
    for (int64_t i = 0; i < n; i++) sq[i] = 1;
    assert_int_equal(sp_ctx_forward(c, &second, got), SP_OK);
    assert_memory_equal(got, whole + half * V, (size_t)((n - half) * V) * sizeof(float));
    free(whole);
    free(got);
    free(r.la);
    free(r.lb);
    sp_ctx_free(c);
    sp_model_close(m);
}

/* Gated DeltaNet (qwen3_5_moe), Lightning and MLA (bailing_hybrid). */
static void test_recurrent_states(void **state) {
    check_recurrent_states("qwen3_5_moe");
    check_recurrent_states("bailing_hybrid");
}

/* Every matrix that can be: the loader's choice made for any kernel set */
static bool any_interleavable(const struct sp_qmat *w) { return sp_qmat_interleavable(w); }

/* Logits of sequence a at once, b in chunks of 64 and 3 decoded tokens */
static float *interleave_logits(struct sp_model *m, const struct ref *r) {
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 2, .max_batch = 64, .kv_type = SP_KV_F32, .n_threads = 2};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    int64_t n = r->na + r->nb + 3;
    float *out = malloc((size_t)(n * r->vocab) * sizeof(float));
    run_seq(c, r->a, r->na, r->na, 0, out, r->vocab);
    run_seq(c, r->b, r->nb, 64, 1, out + r->na * r->vocab, r->vocab);
    int32_t tok = r->b[0], seq = 1;
    for (int64_t i = 0; i < 3; i++) {
        int32_t pos = (int32_t)(r->nb + i);
        struct sp_batch b = {.n = 1, .tokens = &tok, .pos = &pos, .seq = &seq};
        assert_int_equal(sp_ctx_forward(c, &b, out + (r->na + r->nb + i) * r->vocab), SP_OK);
    }
    sp_ctx_free(c);
    return out;
}

/* Weights interleaved as the loader copies them in (sp_model_copy_in) give
 * the logits of the same weights in row order, to the bit, for every
 * architecture in affine4 and mxfp4: the views say which matrices were
 * interleaved, and the kernels read them so. */
static void test_interleaved_weights(void **state) {
    const struct sp_quantize_opts quants[] = {{.type = SP_QTYPE_AFFINE4, .group = 64},
                                              {.type = SP_QTYPE_MXFP4, .group = 32}};
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
        struct sp_model *src;
        struct ref r;
        open_fixture(archs[i], &src, &r);
        for (size_t k = 0; k < 2; k++) {
            char *qdir = th_tmpdir();
            assert_int_equal(sp_quantize_model(src, qdir, &quants[k]), SP_OK);
            struct sp_model *rows, *il;
            assert_int_equal(sp_model_open(qdir, &rows), SP_OK);
            assert_int_equal(sp_model_open(qdir, &il), SP_OK);
            struct sp_model_copy copy;
            assert_int_equal(sp_model_copy_in(il, false, any_interleavable, &copy, NULL), SP_OK);
            int64_t flagged = 0, seen = 0;
            for (int64_t s = 0; s < il->weights.n_slots; s++) {
                const struct sp_wslot *slot = &il->weights.slots[s];
                flagged += slot->row_blocks;
                struct sp_linear l;
                if (!slot->t[SP_PARAM_SCALES] ||
                    sp_model_linear(il, slot->layer, slot->role, slot->stacked ? 0 : slot->expert, &l) != SP_OK)
                    continue;
                assert_int_equal(l.w.interleaved, slot->row_blocks);
                seen++;
            }
            print_message("%s %s: %lld of %lld quantized matrices interleaved (%zu bytes), %zu bytes copied\n",
                          archs[i], sp_qtype_traits(quants[k].type)->name, (long long)copy.matrices, (long long)seen,
                          copy.interleaved, copy.copied);
            assert_true(copy.matrices > 0 && copy.copied > 0);
            assert_int_equal(flagged, copy.matrices);
            float *a = interleave_logits(rows, &r), *b = interleave_logits(il, &r);
            size_t n = (size_t)((r.na + r.nb + 3) * r.vocab);
            if (memcmp(a, b, n * sizeof *a) != 0) fail_msg("%s %s: logits differ interleaved", archs[i], sp_qtype_traits(quants[k].type)->name);
            free(a);
            free(b);
            sp_model_close(rows);
            sp_model_close(il);
            th_rmdir(qdir);
        }
        free(r.la);
        free(r.lb);
        sp_model_close(src);
    }
}

/* Logits with the expert cache at any budget - one expert, a few, all of
 * them - and whatever reads the files are bit-identical to reading experts
 * from the mapping, and the counters add up: every miss reads one whole
 * expert. */
static void check_expert_cache(struct sp_model *m, const struct ref *r, const char *label, bool prefetch,
                               enum sp_expert_policy policy, enum sp_io_method io) {
    struct sp_model_stats ms;
    sp_model_stats(m, &ms);
    size_t unit = sp_expert_store_min_budget(m);
    assert_true(unit >= ms.expert_bytes);
    size_t V = (size_t)r->vocab, n = (size_t)r->nb;
    float *want = malloc(n * V * sizeof(float)), *got = malloc(n * V * sizeof(float));
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 1, .max_batch = 64, .kv_type = SP_KV_F32, .n_threads = 2};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    run_seq(c, r->b, r->nb, 64, 0, want, r->vocab);
    sp_ctx_free(c);
    size_t budgets[] = {unit, 3 * unit + unit / 2, (size_t)(m->arch.n_experts * m->arch.n_layers) * unit};
    struct sp_expert_store_params ep = {.policy = policy, .io = io, .no_prefetch = !prefetch};
    sp_expert_store_params_for(&ep, SP_DEVICE_CPU, false);
    for (size_t k = 0; k < 3; k++) {
        struct sp_expert_store *s;
        assert_int_equal(sp_expert_store_create(m, budgets[k], &ep, &s), SP_OK);
        struct sp_expert_source src = sp_expert_store_source(s);
        p.experts = &src;
        assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
        run_seq(c, r->b, r->nb, 64, 0, got, r->vocab);
        if (memcmp(got, want, n * V * sizeof(float)) != 0) fail_msg("%s: expert cache of %zu bytes changed the logits", label, budgets[k]);
        sp_ctx_free(c);
        struct sp_expert_store_stats st;
        sp_expert_store_stats(s, &st);
        assert_int_equal(st.policy, policy);
        assert_true(st.misses + st.prefetch_issued > 0);
        /* every read is one whole expert: a miss, or a read ahead (some may still be in flight) */
        assert_int_equal(st.bytes_read % ms.expert_bytes, 0);
        assert_true(st.bytes_read >= st.misses * ms.expert_bytes);
        assert_true(st.bytes_read <= (st.misses + st.prefetch_issued) * ms.expert_bytes);
        assert_true(st.prefetch_hits + st.prefetch_waste <= st.prefetch_issued);
        if (k == 1 && prefetch) assert_true(st.prefetch_issued > 0 && st.prefetch_hits > 0);
        if (!prefetch) assert_int_equal(st.prefetch_issued, 0);
        assert_true(st.cached_bytes <= st.budget && st.budget <= budgets[k]);
        if (k == 0) assert_true(st.evictions > 0);                     // one slot: every new expert evicts
        if (k == 2) assert_true(st.evictions == 0 && st.hits > 0);     // all of them: later chunks hit
        uint64_t lat = 0;
        for (int b = 0; b < SP_EXPERT_LAT_BUCKETS; b++) lat += st.lat_bucket[b];
        assert_true(lat >= st.misses && lat <= st.misses + st.prefetch_issued);
        print_message("%s%s: cache %zu bytes (%lld slots): %llu hits, %llu misses, %llu prefetched (%llu used, %llu wasted), "
                      "%llu bytes read\n", label, prefetch ? "" : " (no prefetch)", budgets[k], (long long)st.slots,
                      (unsigned long long)st.hits, (unsigned long long)st.misses, (unsigned long long)st.prefetch_issued,
                      (unsigned long long)st.prefetch_hits, (unsigned long long)st.prefetch_waste,
                      (unsigned long long)st.bytes_read);
        sp_expert_store_free(s);
    }
    struct sp_expert_store *s;
    assert_int_equal(sp_expert_store_create(m, unit - 1, &ep, &s), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "the minimum is"));
    free(want);
    free(got);
}

/* fn on each MoE fixture (opened) with its reference logits. */
static void each_moe_fixture(void (*fn)(struct sp_model *m, const struct ref *r, const char *arch)) {
    const char *moe_archs[] = {"qwen3_moe", "gpt_oss", "bailing_moe", "qwen3_5_moe", "bailing_hybrid"};
    for (size_t i = 0; i < sizeof moe_archs / sizeof *moe_archs; i++) {
        struct sp_model *m;
        struct ref r;
        open_fixture(moe_archs[i], &m, &r);
        fn(m, &r, moe_archs[i]);
        free(r.la);
        free(r.lb);
        sp_model_close(m);
    }
}

static void expert_cache_checks(struct sp_model *m, const struct ref *r, const char *arch) {
    check_expert_cache(m, r, arch, true, SP_EXPERT_POLICY_ARC, SP_IO_AUTO);
    check_expert_cache(m, r, arch, false, SP_EXPERT_POLICY_ARC, SP_IO_AUTO);
    /* the other ways of reading the files (io_uring with O_DIRECT is the default) */
    for (int io = SP_IO_BUFFERED; io < SP_IO_COUNT; io++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", arch, sp_io_method_name((enum sp_io_method)io));
        check_expert_cache(m, r, label, true, SP_EXPERT_POLICY_ARC, (enum sp_io_method)io);
    }
    /* the other replacement policies (ARC is the default) */
    const enum sp_expert_policy policies[] = {SP_EXPERT_POLICY_LRU, SP_EXPERT_POLICY_CLOCK};
    for (size_t k = 0; k < 2; k++) {
        char label[64];
        snprintf(label, sizeof label, "%s %s", arch, sp_expert_policy_name(policies[k]));
        check_expert_cache(m, r, label, true, policies[k], SP_IO_AUTO);
    }
    const struct {
        enum sp_qtype t;
        int g;
        const char *name;
    } q[] = {{SP_QTYPE_AFFINE4, 64, "affine4"}, {SP_QTYPE_MXFP4, 32, "mxfp4"}};
    for (size_t k = 0; k < 2; k++) {
        char *qdir = th_tmpdir();
        struct sp_quantize_opts o = {.type = q[k].t, .group = q[k].g};
        assert_int_equal(sp_quantize_model(m, qdir, &o), SP_OK);
        struct sp_model *qm;
        assert_int_equal(sp_model_open(qdir, &qm), SP_OK);
        char label[64];
        snprintf(label, sizeof label, "%s %s", arch, q[k].name);
        check_expert_cache(qm, r, label, true, SP_EXPERT_POLICY_ARC, SP_IO_AUTO);
        sp_model_close(qm);
        th_rmdir(qdir);
    }
}

static void test_expert_cache(void **state) { each_moe_fixture(expert_cache_checks); }

/* A device's tier of experts (model/expert_tier.h) at any budget - one
 * slot, a few, all of them - over the mapped files or over a host expert
 * cache of a few slots gives the same logits bit for bit, and its counters
 * add up: every miss copies one whole expert. On the CPU the tier is
 * copies in host memory (ops->arena) and its logits are those of no tier,
 * bit for bit; a backend that routes on the device without a tier
 * (ops->moe) computes the routing weights with its own exp, so there the
 * two are held to the exact path's tolerance (with float activations). */
static void check_expert_tier(struct sp_model *m, const struct ref *r, const char *label, bool quantized) {
    struct sp_model_stats ms;
    sp_model_stats(m, &ms);
    size_t unit = sp_expert_tier_slot_bytes(m);
    assert_true(unit >= ms.expert_bytes);
    size_t V = (size_t)r->vocab, n = (size_t)r->nb;
    float *want = malloc(n * V * sizeof(float)), *got = malloc(n * V * sizeof(float));
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 1, .max_batch = 64, .kv_type = SP_KV_F32, .n_threads = 2,
                              .device = device, .float_activations = float_acts};
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    run_seq(c, r->b, r->nb, 64, 0, got, r->vocab);
    struct sp_expert_tier_stats ts;
    assert_false(sp_ctx_tier_stats(c, &ts));
    sp_ctx_free(c);
    size_t budgets[] = {(size_t)(m->arch.n_experts * m->arch.n_layers) * unit, unit, 3 * unit + unit / 2};
    struct sp_expert_store_params ep = {0};
    sp_expert_store_params_for(&ep, device, device != SP_DEVICE_CPU);
    for (int below = 0; below < 2; below++) {
        for (size_t k = 0; k < 3; k++) {
            struct sp_expert_store *s = NULL;
            struct sp_expert_source src;
            if (below) {
                assert_int_equal(sp_expert_store_create(m, 4 * sp_expert_store_min_budget(m), &ep, &s), SP_OK);
                src = sp_expert_store_source(s);
                p.experts = &src;
            }
            p.device_experts = budgets[k];
            assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
            bool first = !below && k == 0;
            run_seq(c, r->b, r->nb, 64, 0, first ? want : got, r->vocab);
            if (first) {
                char what[96];
                snprintf(what, sizeof what, "%s: every expert in the device tier", label);
                if (device == SP_DEVICE_CPU && memcmp(got, want, n * V * sizeof(float)) != 0)
                    fail_msg("%s: changed the logits", what);
                if (device != SP_DEVICE_CPU && float_acts) compare(what, want, got, (int64_t)n, r->vocab, 1e-3);
            } else if (memcmp(got, want, n * V * sizeof(float)) != 0) {
                fail_msg("%s: a device expert cache of %zu bytes%s changed the logits", label, budgets[k],
                         below ? " over a host cache" : "");
            }
            assert_true(sp_ctx_tier_stats(c, &ts));
            sp_ctx_free(c);
            print_message("%s: device tier %zu bytes (%lld slots)%s: %llu hits, %llu misses, %llu copied ahead (%llu "
                          "used), %llu evictions, %llu fences, %llu orders, %llu bytes in\n", label, budgets[k],
                          (long long)ts.slots, below ? " over a host cache" : "", (unsigned long long)ts.hits,
                          (unsigned long long)ts.misses, (unsigned long long)ts.prefetched,
                          (unsigned long long)ts.prefetch_used, (unsigned long long)ts.evictions,
                          (unsigned long long)ts.fences, (unsigned long long)ts.orders, (unsigned long long)ts.bytes_in);
            assert_true(ts.misses > 0);
            assert_int_equal(ts.bytes_in, (ts.misses + ts.prefetched) * ms.expert_bytes);
            assert_int_equal(ts.cached, (int64_t)(ts.misses + ts.prefetched - ts.evictions));
            assert_true(ts.cached <= ts.slots && (size_t)ts.slots * ts.slot_bytes <= budgets[k]);
            assert_true(ts.prefetch_used <= ts.prefetched && ts.prefetch_used <= ts.hits);
            if (below) assert_int_equal(ts.prefetched, 0);  // the store below reads ahead instead
            if (k == 0) assert_true(ts.evictions == 0 && ts.hits > 0);  // all of them: later chunks hit
            if (k == 1) assert_true(ts.evictions > 0 && ts.fences + ts.orders > 0);  // one slot: every new expert evicts
            if (k == 1) assert_int_equal(ts.prefetched, 0);  // no room beside the expert it predicts for
            if (below) {
                struct sp_expert_store_stats st;
                sp_expert_store_stats(s, &st);
                assert_true(st.hits + st.misses >= ts.misses);  // every miss of the tier went to the store
                assert_true(ts.fences > 0);                     // which got its experts back
            }
            p.experts = NULL;
            sp_expert_store_free(s);
        }
    }
    /* steps of 16 tokens, where each MoE layer's routing predicts the next
     * layer's experts (the tier over the mapped files copies them in ahead):
     * the logits of the same steps without it, bit for bit */
    p.device_experts = budgets[2];
    float *ahead = malloc(n * V * sizeof(float));
    for (int pf = 0; pf < 2; pf++) {
        p.no_prefetch = !pf;
        assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
        run_seq(c, r->b, r->nb, 16, 0, pf ? ahead : got, r->vocab);
        assert_true(sp_ctx_tier_stats(c, &ts));
        sp_ctx_free(c);
        print_message("%s: 16 tokens a step, %s: %llu hits, %llu misses, %llu copied ahead (%llu used)\n", label,
                      pf ? "predicted experts copied ahead" : "--no-prefetch", (unsigned long long)ts.hits,
                      (unsigned long long)ts.misses, (unsigned long long)ts.prefetched,
                      (unsigned long long)ts.prefetch_used);
        if (!pf) assert_int_equal(ts.prefetched, 0);
        if (pf) assert_true(ts.prefetched > 0 && ts.prefetch_used > 0);
        assert_int_equal(ts.bytes_in, (ts.misses + ts.prefetched) * ms.expert_bytes);
    }
    p.no_prefetch = false;
    if (memcmp(got, ahead, n * V * sizeof(float)) != 0) fail_msg("%s: experts copied in ahead changed the logits", label);
    free(ahead);
    /* experts the tier lacks computed by the CPU meanwhile: the same
     * products (on a device, the CPU's kernels: the exact path's tolerance),
     * their sum added after the device's, so within rounding of the sums'
     * order, which can swap a router's near-tie in a later layer
     * (held as compare_rounded holds positions); a step decoded one token
     * at a time, as the CPU takes experts of few tokens */
    p.device_experts = unit + unit / 2;
    p.cpu_experts = true;
    p.cpu_expert_gbs = p.copy_gbs = 1;  // equal rates: the misses of a step alternate, the first to the CPU
    /* bf16 weights beside a device's float products: the CPU's int16 twin
     * keeps their activations in float too (the fast sets round them to
     * bf16 where the CPU has AVX512-BF16) */
    bool exact = !quantized;
    const struct sp_kernels *before = exact && device != SP_DEVICE_CPU ? sp_kernels_use(int16_twin(sp_kernels())) : NULL;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    run_seq(c, r->b, r->nb, 1, 0, got, r->vocab);
    assert_true(sp_ctx_tier_stats(c, &ts));
    sp_ctx_free(c);
    char what[96];
    snprintf(what, sizeof what, "%s: experts on the CPU (%llu of %llu)", label, (unsigned long long)ts.cpu_experts,
             (unsigned long long)(ts.cpu_experts + ts.hits + ts.misses));
    /* the CPU's kernel set (the fast one here) rounds the activations of quantized products */
    bool was = rounded_acts;
    rounded_acts = true;
    compare(what, got, want, (int64_t)n, r->vocab, exact ? 1e-3 : TOL_INT8_LOGITS);
    rounded_acts = was;
    if (before) sp_kernels_use(before);
    assert_true(ts.cpu_experts > 0);
    p.cpu_experts = false;
    p.device_experts = unit - 1;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "the minimum is"));
    free(want);
    free(got);
}

static void expert_tier_checks(struct sp_model *m, const struct ref *r, const char *arch) {
    check_expert_tier(m, r, arch, false);
    /* a quantized model: codes, scales and biases in their own parts */
    char *qdir = th_tmpdir();
    struct sp_quantize_opts o = {.type = SP_QTYPE_AFFINE4, .group = 64};
    assert_int_equal(sp_quantize_model(m, qdir, &o), SP_OK);
    struct sp_model *qm;
    assert_int_equal(sp_model_open(qdir, &qm), SP_OK);
    char label[64];
    snprintf(label, sizeof label, "%s affine4", arch);
    check_expert_tier(qm, r, label, true);
    sp_model_close(qm);
    th_rmdir(qdir);
}

static void test_expert_tier(void **state) { each_moe_fixture(expert_tier_checks); }

/* max |a - b| over max |b| of n rows of vocab logits; and how many rows'
 * argmax differ where b's best two are not within that distance. */
static double logits_distance(const float *a, const float *b, int64_t n, int64_t vocab, int64_t *flips) {
    double top = 0, diff = 0;
    for (int64_t i = 0; i < n * vocab; i++) {
        top = fmax(top, fabs(b[i]));
        diff = fmax(diff, fabs((double)a[i] - b[i]));
    }
    *flips = 0;
    for (int64_t t = 0; t < n; t++) {
        int32_t x = sp_argmax(a + t * vocab, vocab), y = sp_argmax(b + t * vocab, vocab);
        *flips += x != y && fabs(b[t * vocab + x] - b[t * vocab + y]) > 2 * diff;
    }
    return top > 0 ? diff / top : diff;
}

/* Routing counts (count_routes): each MoE layer's counts add up to its
 * tokens times the experts a token takes, and a dense layer's are zeros;
 * experts placed over 2 ranks by those counts (expert_load) give the
 * logits of one context (want) and count the same. */
static void route_count_checks(struct sp_model *m, const struct ref *r, const char *arch,
                               const struct sp_ctx_params *base, const float *want, double tol) {
    const struct sp_arch *a = &m->arch;
    const int64_t V = r->vocab, n = r->nb, E = a->n_experts, LE = a->n_layers * E;
    float *got = malloc((size_t)(n * V) * sizeof(float));
    uint64_t *one = malloc((size_t)LE * sizeof *one);
    double *load = malloc((size_t)LE * sizeof *load);
    struct sp_ctx_params p = *base;
    p.count_routes = true;
    struct sp_ctx *c;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    run_seq(c, r->b, n, 16, 0, got, V);
    int64_t flips;
    assert_true(logits_distance(got, want, n, V, &flips) < tol);  // on a GPU the routing moved to the host
    assert_int_equal(flips, 0);
    memcpy(one, sp_ctx_route_counts(c), (size_t)LE * sizeof *one);
    sp_ctx_free(c);
    for (int64_t L = 0; L < a->n_layers; L++) {
        uint64_t sum = 0;
        for (int64_t e = 0; e < E; e++) sum += one[L * E + e];
        assert_int_equal(sum, a->layer_moe[L] ? (uint64_t)(n * a->n_experts_used) : 0);
    }
    for (int64_t i = 0; i < LE; i++) load[i] = (double)one[i];
    p.n_ranks = 2;
    p.expert_load = load;
    if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s, 2 ranks by load: %s", arch, sp_error_msg());
    run_seq(c, r->b, n, 16, 0, got, V);
    double dist = logits_distance(got, want, n, V, &flips);
    print_message("%s, 2 ranks placed by the routing counts: max|diff| %.3g of max|logit|, %lld argmax flips\n", arch,
                  dist, (long long)flips);
    assert_true(dist < tol);
    assert_int_equal(flips, 0);
    assert_memory_equal(sp_ctx_route_counts(c), one, (size_t)LE * sizeof *one);
    sp_ctx_free(c);
    p.count_routes = false;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    assert_null(sp_ctx_route_counts(c));
    sp_ctx_free(c);
    free(load);
    free(one);
    free(got);
}

/* GPU numbers for ranks that all run on the first GPU. */
static const int first_gpu[SP_RANKS_MAX];

/* Expert parallelism in one process (model/ranks.h): each MoE layer's
 * experts split over 2, 3 and as many ranks as there are experts, each rank
 * a context of its own, give the logits of one context but for the order
 * the ranks' sums are added in (on a GPU also the routing weights: the
 * ranks route on the host, one context on the device, with its own exp):
 * prefill in chunks, decode a token a pass, and a sequence copied from
 * another (every rank copies its own cache); so do 2 ranks each with an
 * expert cache of its own on its device. */
static void expert_ranks_checks(struct sp_model *m, const struct ref *r, const char *arch) {
    const int64_t V = r->vocab, n = r->nb, half = n / 2;
    const double tol = device == SP_DEVICE_CPU ? 1e-5 : 1e-4;
    float *want = malloc((size_t)(n * V) * sizeof(float)), *got = malloc((size_t)(n * V) * sizeof(float));
    struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 2, .max_batch = 128, .kv_type = SP_KV_F32, .n_threads = 1,
                              .device = device, .float_activations = float_acts, .gpus = first_gpu};
    struct sp_ctx *c;
    assert_true(n - half <= p.max_batch);
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
    run_seq(c, r->b, n, 16, 0, want, V);
    sp_ctx_free(c);
    route_count_checks(m, r, arch, &p, want, tol);
    const int ranks[] = {2, 3, (int)m->arch.n_experts};
    for (size_t k = 0; k < sizeof ranks / sizeof *ranks; k++) {
        p.n_ranks = ranks[k];
        if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s, %d ranks: %s", arch, ranks[k], sp_error_msg());
        assert_int_equal(sp_ctx_sums_on_devices(c), device == SP_DEVICE_CUDA);  // one GPU: every rank's memory
        int64_t flips;
        for (int chunk = 16; chunk >= 1; chunk -= 15) {  // a prompt's chunks, then a token a pass
            run_seq(c, r->b, n, chunk, chunk == 16 ? 0 : 1, got, V);
            double dist = logits_distance(got, want, n, V, &flips);
            print_message("%s, %d ranks, %d tokens a pass: max|diff| %.3g of max|logit|, %lld argmax flips\n", arch,
                          ranks[k], chunk, dist, (long long)flips);
            assert_true(dist < tol);
            assert_int_equal(flips, 0);
        }
        /* the second half after a copy of the first: the copy reached every rank's cache (and state) */
        run_seq(c, r->b, half, 16, 0, got, V);
        sp_ctx_copy_seq(c, 0, 1, half);
        int32_t pos[128], seq[128];
        for (int64_t i = half; i < n; i++) pos[i - half] = (int32_t)i, seq[i - half] = 1;
        struct sp_batch b = {.n = n - half, .tokens = r->b + half, .pos = pos, .seq = seq};
        if (sp_ctx_forward(c, &b, got) != SP_OK) fail_msg("%s, %d ranks: %s", arch, ranks[k], sp_error_msg());
        assert_true(logits_distance(got, want + half * V, n - half, V, &flips) < tol);
        assert_int_equal(flips, 0);
        /* a batch that every rank refuses: an error naming the rank, and the ranks go on */
        int32_t bad = (int32_t)V;
        struct sp_batch wrong = {.n = 1, .tokens = &bad, .pos = pos, .seq = seq};
        assert_int_equal(sp_ctx_forward(c, &wrong, got), SP_ERR_ARG);
        assert_non_null(strstr(sp_error_msg(), "rank 0: "));
        sp_ctx_copy_seq(c, 0, 1, half);  // a recurrent state goes on only from where it is
        assert_int_equal(sp_ctx_forward(c, &b, got), SP_OK);
        assert_true(logits_distance(got, want + half * V, n - half, V, &flips) < tol);
        sp_ctx_free(c);
    }
    /* more ranks than experts: refused, saying why */
    p.n_ranks = (int)m->arch.n_experts + 1;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "routed experts a layer"));
    p.n_ranks = 2;
    /* ranks in threads over one host expert cache of 6 experts (3 held at once: one a rank), read into by both
     * ranks at once (on a GPU, under each rank's device cache of 3.5 slots); one of 2 holds too few */
    size_t unit = sp_expert_store_min_budget(m), tslot = sp_expert_tier_slot_bytes(m);
    struct sp_expert_store_params ep = {0};
    sp_expert_store_params_for(&ep, device, false);
    struct sp_expert_store *store;
    assert_int_equal(sp_expert_store_create(m, 2 * unit, &ep, &store), SP_OK);
    struct sp_expert_source host = sp_expert_store_source(store);
    p.experts = &host;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "each rank needs one"));
    sp_expert_store_free(store);
    assert_int_equal(sp_expert_store_create(m, 6 * unit, &ep, &store), SP_OK);
    host = sp_expert_store_source(store);
    p.device_experts = device == SP_DEVICE_CPU ? 0 : 3 * tslot + tslot / 2;
    if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s, 2 ranks over a host cache: %s", arch, sp_error_msg());
    run_seq(c, r->b, n, 16, 0, got, V);
    int64_t flips;
    double dist = logits_distance(got, want, n, V, &flips);
    struct sp_expert_store_stats hs;
    sp_expert_store_stats(store, &hs);
    print_message("%s, 2 ranks over a host expert cache of 6 experts: max|diff| %.3g of max|logit|, %lld argmax "
                  "flips, %llu misses\n", arch, dist, (long long)flips, (unsigned long long)hs.misses);
    assert_true(dist < tol);
    assert_int_equal(flips, 0);
    assert_true(hs.misses > 0);
    sp_ctx_free(c);
    sp_expert_store_free(store);
    p.experts = NULL;
    /* each rank's device expert cache of a few slots over the mapped files: its own experts copied in as used */
    p.device_experts = 3 * tslot + tslot / 2;
    if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s, 2 ranks' expert caches: %s", arch, sp_error_msg());
    run_seq(c, r->b, n, 16, 0, got, V);
    dist = logits_distance(got, want, n, V, &flips);
    struct sp_expert_tier_stats ts;
    assert_true(sp_ctx_tier_stats(c, &ts));
    print_message("%s, 2 ranks, an expert cache of 3.5 slots each: max|diff| %.3g of max|logit|, %lld argmax flips, "
                  "%llu misses, %llu hits\n", arch, dist, (long long)flips, (unsigned long long)ts.misses,
                  (unsigned long long)ts.hits);
    assert_true(dist < tol);
    assert_int_equal(flips, 0);
    assert_int_equal(ts.slots, 6);  // both ranks'
    assert_true(ts.misses > 0);
    sp_ctx_free(c);
    free(want);
    free(got);
}

/* Rank r's part of ranks_sum_run: v = (r + 1) / 3, ..., summed; rank
 * `quitter` gives up before its second sum. */
struct ranks_job {
    struct sp_ranks *g;
    int quitter;
    float v[3][4];
    bool ok[3][2];
};

static void ranks_sum_run(void *arg, int r) {
    struct ranks_job *j = arg;
    for (int i = 0; i < 4; i++) j->v[r][i] = (float)(r + 1) / 3.0f + (float)i;
    j->ok[r][0] = sp_ranks_sum(j->g, r, j->v[r], 4);
    if (r == j->quitter) {
        sp_ranks_fail(j->g, r);
        return;
    }
    j->ok[r][1] = sp_ranks_sum(j->g, r, j->v[r], 4);
}

/* The routing counts file (runtime/routing.h): what is written is read
 * back; a file of another shape or kind is refused, naming what is wrong. */
static void routing_file_checks(void) {
    struct sp_model *m;
    struct ref r;
    open_fixture("qwen3_moe", &m, &r);
    const struct sp_arch *a = &m->arch;
    int64_t LE = a->n_layers * a->n_experts;
    uint64_t *counts = calloc((size_t)LE, sizeof *counts);
    for (int64_t L = 0; L < a->n_layers; L++)
        for (int64_t e = 0; a->layer_moe[L] && e < a->n_experts; e++) counts[L * a->n_experts + e] = (uint64_t)(e * 3 + L);
    char *dir = th_tmpdir(), path[4200];
    snprintf(path, sizeof path, "%s/routing.json", dir);
    assert_int_equal(sp_routing_write(path, m, counts), SP_OK);
    double *load;
    assert_int_equal(sp_routing_read(path, m, &load), SP_OK);
    for (int64_t i = 0; i < LE; i++) assert_true(load[i] == (double)counts[i]);
    sp_free(load);
    /* a MoE layer between two dense ones (the fixture: layer 1 dense) */
    assert_true(a->n_layers == 3 && a->layer_moe[0] && !a->layer_moe[1] && a->n_experts == 16);
    const char *zeros = "[0,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]";
    struct {
        const char *text, *says;
    } bad[] = {
        {"[1, 2]", "expected a JSON object"},
        {"{\"layers\": 3, \"experts\": 16", "invalid JSON"},
        {"{\"experts\": 16}", "no \"layers\""},
        {"{\"layers\": 4, \"experts\": 16}", "the model has 3"},
        {"{\"layers\": 3, \"experts\": 8}", "the model has 16"},
        {"{\"layers\": 3, \"experts\": 16}", "\"counts\" is nothing"},
        {"{\"layers\": 3, \"experts\": 16, \"counts\": [null, null]}", "2 rows for 3 layers"},
        {"{\"layers\": 3, \"experts\": 16, \"counts\": [null, null, null]}", "layer 0: expected an array of 16"},
        {"{\"layers\": 3, \"experts\": 16, \"counts\": [[1, 2], null, null]}", "layer 0: expected an array of 16"},
        {NULL, "layer 1, which has no routed experts"},
        {NULL, "layer 2, expert 3: expected a whole number"},
        {NULL, "layer 2, expert 0: expected a whole number"},
    };
    char text[512];
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *t = bad[i].text;
        if (!t) {
            const char *rows[] = {"%s, %s, %s", "%s, null, [0,0,0,\"x\",0,0,0,0,0,0,0,0,0,0,0,0]",
                                  "%s, null, [-1,0,0,0,0,0,0,0,0,0,0,0,0,0,0,0]"};
            char body[400];
            snprintf(body, sizeof body, rows[i - 9], zeros, zeros, zeros);
            snprintf(text, sizeof text, "{\"layers\": 3, \"experts\": 16, \"counts\": [%s]}", body);
            t = text;
        }
        th_write_str(dir, "bad.json", t);
        snprintf(path, sizeof path, "%s/bad.json", dir);
        assert_int_not_equal(sp_routing_read(path, m, &load), SP_OK);
        assert_null(load);
        if (!strstr(sp_error_msg(), bad[i].says) || !strstr(sp_error_msg(), "bad.json"))
            fail_msg("case %zu: \"%s\" does not say \"%s\"", i, sp_error_msg(), bad[i].says);
    }
    th_rmdir(dir);
    free(counts);
    free(r.la);
    free(r.lb);
    sp_model_close(m);
}

static void test_expert_ranks(void **state) {
    /* the group: sums in rank order, the same bits on every rank; a rank
     * that gives up lets the others go; the group runs again after it */
    struct sp_ranks *g;
    assert_int_equal(sp_ranks_create(1, 4, &g), SP_ERR_ARG);
    assert_int_equal(sp_ranks_create(3, 4, &g), SP_OK);
    for (int quitter = -1; quitter < 3; quitter++) {
        struct ranks_job j = {.g = g, .quitter = quitter};
        sp_ranks_run(g, ranks_sum_run, &j);
        for (int r = 0; r < 3; r++) {
            assert_true(j.ok[r][0]);
            assert_int_equal(j.ok[r][1], quitter < 0);
            float want = 1.0f / 3.0f + 2.0f / 3.0f + 1.0f;  // rank order
            if (quitter < 0) want *= 3.0f;
            if (r != quitter) assert_true(memcmp(&j.v[r][0], &want, sizeof want) == 0);
        }
    }
    sp_ranks_free(g);

    each_moe_fixture(expert_ranks_checks);
    /* a dense model has no experts to split */
    struct sp_model *m;
    struct ref r;
    open_fixture("llama", &m, &r);
    struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 1, .max_batch = 16, .kv_type = SP_KV_F32, .n_threads = 1, .n_ranks = 2};
    struct sp_ctx *c;
    assert_int_equal(sp_ctx_create(m, &p, &c), SP_ERR_ARG);
    free(r.la);
    free(r.lb);
    sp_model_close(m);
    /* the split: as many experts a rank where they weigh alike, else the load balanced */
    int32_t owner[8];
    int64_t count[3] = {0};
    sp_ranks_split(NULL, 8, 3, owner);
    for (int e = 0; e < 8; e++) count[owner[e]]++;
    assert_true(count[0] == 3 && count[1] == 3 && count[2] == 2);
    /* as many experts a rank however they weigh: the heaviest, then each to the lightest rank with room */
    const double load[6] = {1, 5, 1, 1, 1, 1};
    sp_ranks_split(load, 6, 2, owner);
    const int32_t want[6] = {1, 0, 1, 1, 0, 0};
    assert_memory_equal(owner, want, sizeof want);
    const double two[6] = {1, 1, 4, 1, 4, 1};  // the two heavy ones apart
    sp_ranks_split(two, 6, 2, owner);
    assert_int_not_equal(owner[2], owner[4]);
    routing_file_checks();
}

/* Looks expert e of layer 0 up in the store and hands it back: whether it was
 * a hit. */
static bool lookup(const struct sp_model *m, struct sp_expert_store *s, int64_t e) {
    struct sp_expert_views v = {.fused = m->fused_gate_up}, got;
    if (v.fused) {
        assert_int_equal(sp_model_linear(m, 0, SP_ROLE_EXP_GATE_UP, e, &v.gate_up), SP_OK);
    } else {
        assert_int_equal(sp_model_linear(m, 0, SP_ROLE_EXP_GATE, e, &v.gate), SP_OK);
        assert_int_equal(sp_model_linear(m, 0, SP_ROLE_EXP_UP, e, &v.up), SP_OK);
    }
    assert_int_equal(sp_model_linear(m, 0, SP_ROLE_EXP_DOWN, e, &v.down), SP_OK);
    struct sp_expert_store_stats before, after;
    sp_expert_store_stats(s, &before);
    assert_int_equal(sp_expert_store_get(s, &v, 0, e, &got), SP_OK);
    sp_expert_store_put(s, 0, e);
    sp_expert_store_stats(s, &after);
    assert_true(after.hits + after.misses == before.hits + before.misses + 1);
    return after.hits > before.hits;
}

/* Replacement policies on a cache of four slots: an expert used twice
 * survives a scan of experts used once under ARC (the default: the scan
 * stays in T1) and not under LRU; under ARC an expert evicted recently from
 * T1 (a ghost in B1) comes back into T2 and outlives a longer scan. */
static void test_expert_policy(void **state) {
    struct sp_model *m;
    assert_int_equal(sp_model_open("tests/fixtures/qwen3_moe", &m), SP_OK);
    assert_true(m->arch.layer_moe[0] && m->arch.n_experts >= 12);
    const struct sp_expert_store_params params[] = {{.no_prefetch = true},
                                                    {.policy = SP_EXPERT_POLICY_ARC, .no_prefetch = true},
                                                    {.policy = SP_EXPERT_POLICY_LRU, .no_prefetch = true}};
    for (int k = 0; k < 3; k++) {
        bool lru = params[k].policy == SP_EXPERT_POLICY_LRU;
        struct sp_expert_store *s;
        assert_int_equal(sp_expert_store_create(m, 4 * sp_expert_store_min_budget(m), &params[k], &s), SP_OK);
        assert_false(lookup(m, s, 0));
        assert_true(lookup(m, s, 0));
        for (int64_t e = 1; e <= 8; e++) assert_false(lookup(m, s, e));
        assert_int_equal(lookup(m, s, 0), !lru);
        if (!lru) {
            assert_false(lookup(m, s, 5));  // evicted from T1 four evictions ago: a ghost
            for (int64_t e = 9; e <= 11; e++) assert_false(lookup(m, s, e));
            assert_true(lookup(m, s, 5));
            assert_true(lookup(m, s, 0));
        }
        struct sp_expert_store_stats st;
        sp_expert_store_stats(s, &st);
        assert_int_equal(st.slots, 4);
        assert_int_equal(st.cached, 4);
        assert_true(st.cached_bytes <= st.budget);
        assert_int_equal(st.evictions, st.misses - 4);
        assert_int_equal(st.prefetch_issued, 0);
        sp_expert_store_free(s);
    }
    sp_model_close(m);
}

/* ---- the same on the GPU, where this build and machine have one ----
 *
 * With float activations (the exact path) the CUDA backend is held to the
 * exact path's tolerance, 1e-3 of the largest reference logit, and to the
 * reference's greedy tokens (the CPU's: test_reference_logits holds it to
 * them); its products sum each token alone, so batching changes no bit.
 * Its default rounds the activations of 4-bit products to int8 by blocks
 * of 32 (a step of max|x| / 127), held as compare_rounded holds them: the
 * median position of the quantized fixtures moves by up to 4.5% of the
 * largest logit under the CPU's int8 sets (affine4; mxfp4 up to 1.3%),
 * TOL_INT8_LOGITS twice that; batching still changes no bit. */

static bool use_cuda(void) {
    if (!th_device_ready(SP_DEVICE_CUDA)) return false;
    device = SP_DEVICE_CUDA;
    float_acts = true;
    return true;
}

static int back_to_cpu(void **state) {
    device = SP_DEVICE_CPU;
    float_acts = rounded_acts = false;
    return 0;
}

static void test_cuda_reference_logits(void **state) {
    if (!use_cuda()) skip();
    check_reference_logits(SP_KV_F32);
    check_reference_logits(SP_KV_F16);
}

static void test_cuda_quantized_variants(void **state) {
    if (!use_cuda()) skip();
    test_quantized_variants(state);
}

static void test_cuda_batch_invariance(void **state) {
    if (!use_cuda()) skip();
    test_batch_invariance(state);
    float_acts = false;
    test_batch_invariance(state);
}

static void test_cuda_recurrent_states(void **state) {
    if (!use_cuda()) skip();
    test_recurrent_states(state);
    float_acts = false;
    test_recurrent_states(state);
}

static void test_cuda_expert_tier(void **state) {
    if (!use_cuda()) skip();
    test_expert_tier(state);
    float_acts = false;
    test_expert_tier(state);
}

static void test_cuda_expert_ranks(void **state) {
    if (!use_cuda()) skip();
    each_moe_fixture(expert_ranks_checks);
}

static void test_cuda_int8_activations(void **state) {
    if (!use_cuda()) skip();
    float_acts = false;
    rounded_acts = true;
    check_quantized_variants(TOL_INT8_LOGITS);
}

/* GRAPH_STEPS steps after a prompt of each sequence: sequence 0 alone, then
 * both sequences a token each (steps 8 to 15), then sequence 0 again, with
 * the CUDA backend's step graphs on or off; every
 * step's logits into out (two rows a step), its graph counts into counts. */
#define GRAPH_STEPS 24
static void graph_steps(struct sp_model *m, const struct ref *r, bool graphs, float *out, int64_t counts[2]) {
    struct sp_ctx *c;
    struct sp_ctx_params p = {.n_ctx = 128, .n_seq = 2, .max_batch = 64, .device = device, .n_threads = 2,
                              .float_activations = float_acts, .graphs = graphs};
    if (sp_ctx_create(m, &p, &c) != SP_OK) fail_msg("%s", sp_error_msg());
    int64_t V = r->vocab, np = r->na < 16 ? r->na : 16;
    float *prompt = malloc((size_t)(np * V) * sizeof(float));
    run_seq(c, r->a, np, np, 0, prompt, V);
    run_seq(c, r->b, np, 5, 1, prompt, V);
    for (int64_t i = 0; i < GRAPH_STEPS; i++) {
        bool both = i >= 8 && i < 16;
        int32_t tok[2] = {r->b[(np + i) % r->nb], r->a[i % r->na]};
        int32_t pos[2] = {(int32_t)(np + i), (int32_t)(np + i - 8)}, seq[2] = {0, 1};
        struct sp_batch b = {.n = both ? 2 : 1, .tokens = tok, .pos = pos, .seq = seq};
        if (sp_ctx_forward(c, &b, out + 2 * i * V) != SP_OK) fail_msg("%s", sp_error_msg());
    }
    free(prompt);
    sp_ctx_graph_counts(c, &counts[0], &counts[1]);
    sp_ctx_free(c);
}

/* Steps replayed as CUDA graphs (updated with each step's tokens and
 * positions, a graph a batch size) give the logits of the same steps
 * queued op by op, bit for bit, and do replay: every step of at most 64
 * tokens here. */
static void test_cuda_graphs(void **state) {
    if (!use_cuda()) skip();
    for (int acts = 0; acts < 2; acts++) {
        float_acts = acts == 0;
        for (size_t i = 0; i < sizeof archs / sizeof *archs; i++) {
            struct sp_model *m;
            struct ref r;
            open_fixture(archs[i], &m, &r);
            size_t bytes = (size_t)(2 * GRAPH_STEPS * r.vocab) * sizeof(float);
            float *off = calloc(1, bytes), *on = calloc(1, bytes);
            int64_t c_off[2], c_on[2];
            graph_steps(m, &r, false, off, c_off);
            graph_steps(m, &r, true, on, c_on);
            print_message("%s (%s activations): %lld replays, %lld graphs built\n", archs[i],
                          float_acts ? "float" : "int8", (long long)c_on[0], (long long)c_on[1]);
            assert_int_equal(c_off[0], 0);
            /* the prompts' steps (1 + 4) and every decode step */
            assert_true(c_on[0] >= 5 + GRAPH_STEPS);
            assert_true(c_on[1] < c_on[0]);
            assert_memory_equal(off, on, bytes);
            free(off);
            free(on);
            free(r.la);
            free(r.lb);
            sp_model_close(m);
        }
    }
}

/* A synthetic model of cfg (deleted) in a new folder *dir, and it
 * quantized as qo in another, *qdir: both open, in *m and *q. */
static void synth_and_quantize(cJSON *cfg, const struct sp_synth_opts *o, const struct sp_quantize_opts *qo,
                               char **dir, char **qdir, struct sp_model **m, struct sp_model **q) {
    *dir = th_tmpdir(), *qdir = th_tmpdir();
    if (sp_synth_write(cfg, *dir, o) != SP_OK) fail_msg("synth: %s", sp_error_msg());
    cJSON_Delete(cfg);
    assert_int_equal(sp_model_open(*dir, m), SP_OK);
    assert_int_equal(sp_quantize_model(*m, *qdir, qo), SP_OK);
    assert_int_equal(sp_model_open(*qdir, q), SP_OK);
}

/* A router of 256 experts over 2048 columns (Ling-flash-2.0's), whose
 * one-token product is split over a block's warps (a matrix of few rows)
 * before the group-limited routing: token by token, the bits of the whole
 * prompt at once (routing, weights and all), bf16 with float activations
 * and mxfp4 with float and int8 ones. */
static void test_cuda_wide_router(void **state) {
    if (!use_cuda()) skip();
    cJSON *cfg;
    assert_int_equal(sp_json_parse_file("tools/tiny/bailing_moe.json", 1 << 20, &cfg), SP_OK);
    static const struct {
        const char *key;
        double v;
    } set[] = {{"hidden_size", 2048},         {"num_experts", 256}, {"num_experts_per_tok", 8},
               {"n_group", 8},                {"topk_group", 4},    {"moe_intermediate_size", 32},
               {"first_k_dense_replace", 0}, {"num_hidden_layers", 1}};
    for (size_t i = 0; i < sizeof set / sizeof *set; i++)
        cJSON_ReplaceItemInObject(cfg, set[i].key, cJSON_CreateNumber(set[i].v));
    char *dir, *qdir;
    struct sp_model *m, *q;
    const struct sp_synth_opts o = {.dtype = SP_DTYPE_BF16, .seed = 11, .balanced_routing = true};
    const struct sp_quantize_opts mx = {.type = SP_QTYPE_MXFP4, .group = 32};
    synth_and_quantize(cfg, &o, &mx, &dir, &qdir, &m, &q);
    enum { N = 24 };
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 37 + 5) % 512);
    const int64_t V = 512;
    float *whole = malloc((size_t)(N * V) * sizeof(float)), *one = malloc((size_t)(N * V) * sizeof(float));
    for (int k = 0; k < 3; k++) {
        float_acts = k < 2;
        struct sp_ctx *c;
        struct sp_ctx_params p = {.n_ctx = 64, .n_seq = 2, .max_batch = 32, .device = device, .n_threads = 2,
                                  .float_activations = float_acts};
        assert_int_equal(sp_ctx_create(k == 0 ? m : q, &p, &c), SP_OK);
        run_seq(c, tok, N, N, 0, whole, V);
        run_seq(c, tok, N, 1, 1, one, V);
        assert_memory_equal(whole, one, (size_t)(N * V) * sizeof(float));
        sp_ctx_free(c);
    }
    free(whole);
    free(one);
    sp_model_close(q);
    sp_model_close(m);
    th_rmdir(qdir);
    th_rmdir(dir);
}

/* Heads of 64 and 128 dimensions (gpt-oss's and Qwen3's), whose attention
 * runs on tensor cores, a prompt's 16 tokens a block over its chunk's rows
 * read once into shared memory: a 200-token prompt in steps of 64, and of
 * 40 (blocks of fewer than 16 tokens), the later steps seeing the earlier
 * ones' positions (gpt-oss's window of 40 moving across them), gives the
 * bits of the same prompt token by token (a block a token, reading the
 * cache alone), with f16 and bf16 caches, and the CPU's logits within 1e-3
 * of the largest; with int8 activations on affine4 weights, the bits of
 * token by token too. */
static void test_cuda_wide_heads(void **state) {
    if (!use_cuda()) skip();
    enum { N = 200, V = 512 };
    static const struct {
        const char *config;
        int head_dim, window;
    } shapes[] = {{"tools/tiny/qwen3_moe.json", 64, 0}, {"tools/tiny/qwen3_moe.json", 128, 0}, {"tools/tiny/gpt_oss.json", 64, 40}};
    int32_t tok[N];
    for (int i = 0; i < N; i++) tok[i] = (int32_t)((i * 53 + 7) % V);
    float *ref = malloc((size_t)(N * V) * sizeof(float)), *whole = malloc((size_t)(N * V) * sizeof(float)),
          *one = malloc((size_t)(N * V) * sizeof(float)), *part = malloc((size_t)(N * V) * sizeof(float));
    for (size_t sh = 0; sh < sizeof shapes / sizeof *shapes; sh++) {
        cJSON *cfg;
        assert_int_equal(sp_json_parse_file(shapes[sh].config, 1 << 20, &cfg), SP_OK);
        cJSON_ReplaceItemInObject(cfg, "head_dim", cJSON_CreateNumber(shapes[sh].head_dim));
        if (shapes[sh].window) cJSON_ReplaceItemInObject(cfg, "sliding_window", cJSON_CreateNumber(shapes[sh].window));
        assert_int_equal(cJSON_GetObjectItem(cfg, "vocab_size")->valueint, V);
        char *dir, *qdir;
        struct sp_model *m, *q;
        const struct sp_synth_opts o = {.dtype = SP_DTYPE_F32, .seed = 5};
        const struct sp_quantize_opts a4 = {.type = SP_QTYPE_AFFINE4, .group = 64};
        synth_and_quantize(cfg, &o, &a4, &dir, &qdir, &m, &q);
        for (int k = 0; k < 3; k++) {
            enum sp_kv_type kv = k == 1 ? SP_KV_BF16 : SP_KV_F16;
            struct sp_ctx_params p = {.n_ctx = 256, .n_seq = 1, .max_batch = 64, .kv_type = kv, .n_threads = 2,
                                      .float_activations = k < 2};
            struct sp_ctx *c;
            if (k < 2) {
                p.device = SP_DEVICE_CPU;
                assert_int_equal(sp_ctx_create(m, &p, &c), SP_OK);
                run_seq(c, tok, N, 64, 0, ref, V);
                sp_ctx_free(c);
            }
            p.device = SP_DEVICE_CUDA;
            assert_int_equal(sp_ctx_create(k < 2 ? m : q, &p, &c), SP_OK);
            run_seq(c, tok, N, 64, 0, whole, V);
            sp_ctx_free(c);
            assert_int_equal(sp_ctx_create(k < 2 ? m : q, &p, &c), SP_OK);
            run_seq(c, tok, N, 1, 0, one, V);
            sp_ctx_free(c);
            assert_int_equal(sp_ctx_create(k < 2 ? m : q, &p, &c), SP_OK);
            run_seq(c, tok, N, 40, 0, part, V);  // blocks of 16 tokens and one of 8 a step
            sp_ctx_free(c);
            char what[128];
            snprintf(what, sizeof what, "%s, head_dim %d, kv %s, %s", shapes[sh].config, shapes[sh].head_dim,
                     sp_kv_type_name(kv), k < 2 ? "float activations" : "affine4, int8 activations");
            if (k < 2) compare(what, whole, ref, N, V, 1e-3);
            assert_memory_equal(whole, one, (size_t)(N * V) * sizeof(float));
            assert_memory_equal(part, one, (size_t)(N * V) * sizeof(float));
            print_message("%s: the prompt in steps of 64 and of 40 = token by token\n", what);
        }
        sp_model_close(q);
        sp_model_close(m);
        th_rmdir(qdir);
        th_rmdir(dir);
    }
    free(ref);
    free(whole);
    free(one);
    free(part);
}

/* argv[1], when given, picks the tests to run by name ("test_cuda_*"). */
int main(int argc, char **argv) {
    if (argc > 1) cmocka_set_test_filter(argv[1]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_reference_logits_f32_kv),
        cmocka_unit_test(test_reference_logits_f16_kv),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_quantized_variants),
        cmocka_unit_test(test_interleaved_weights),
        cmocka_unit_test(test_recurrent_states),
        cmocka_unit_test(test_expert_cache),
        cmocka_unit_test(test_expert_policy),
        cmocka_unit_test(test_expert_tier),
        cmocka_unit_test(test_expert_ranks),
        cmocka_unit_test_teardown(test_cuda_reference_logits, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_quantized_variants, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_batch_invariance, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_int8_activations, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_expert_tier, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_expert_ranks, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_recurrent_states, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_graphs, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_wide_router, back_to_cpu),
        cmocka_unit_test_teardown(test_cuda_wide_heads, back_to_cpu),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
