/*
 * test_kernels.c - every CPU kernel set this machine can run (portable,
 * avx2, avx2-int16, avx2f, avxvnni, avx512 and their -int16 twins) against
 * the scalar reference of quant/qtype.h: each format x
 * shapes (odd row counts, one-group rows, rows longer than a blocked
 * slice) x batch sizes (fused and blocked paths) on random inputs, plus the
 * float dot / axpy, the gated activation, softmax numerators, the run-time
 * choice of a set, and sp_linear_apply over two threads.
 */
#include "helpers.h"
#include "qref.h"

#include <float.h>
#include <math.h>

#include "core/half.h"
#include "core/pool.h"
#include "core/rng.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear.h"

static double worst_seen[SP_KERNELS_ISA_COUNT][ACTS_COUNT];  // [set][enum acts]: worst error / tolerance

/* Runs k->matmul_rows on m for n tokens the way the pool does (two row
 * ranges), checks every output against the reference and that nothing
 * outside the outputs was written. */
static void check_matmul_on(const struct sp_kernels *k, const struct mat *M, int64_t n, const float *x, int64_t ldx) {
    const struct sp_qmat *m = &M->m;
    int64_t ldy = m->rows + 5;
    float *y = malloc((size_t)(n * ldy) * sizeof *y);
    for (int64_t i = 0; i < n * ldy; i++) y[i] = 12345.0f;
    void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(m), 64, SP_MEM_MISC);
    int64_t half = m->rows / 2;
    k->matmul_rows(m, 0, half, x, ldx, n, y, ldy, scratch);
    k->matmul_rows(m, half, m->rows, x, ldx, n, y, ldy, scratch);
    sp_free_aligned(scratch);
    for (int64_t t = 0; t < n; t++)
        for (int64_t r = m->rows; r < ldy; r++) assert_true(y[t * ldy + r] == 12345.0f);
    int64_t br = -1, bt = -1;
    enum acts acts = acts_of(k, m);
    double ratio = worst_ratio(m, x, ldx, n, y, ldy, acts, &br, &bt);
    if (ratio > 1.0)
        print_error("%s %s g%d scales %s: %lldx%lld batch %lld: row %lld token %lld off by %.3g x tolerance\n", k->name,
                    sp_qtype_name(m->type), m->group, m->scale_dtype < SP_DTYPE_COUNT ? sp_dtype_name(m->scale_dtype) : "-",
                    (long long)m->rows, (long long)m->cols, (long long)n, (long long)br, (long long)bt, ratio);
    assert_true(ratio <= 1.0);
    double *ws = &worst_seen[k->isa][acts];
    if (ratio > *ws) *ws = ratio;
    free(y);
}

/* check_matmul_on random Gaussian activations. */
static void check_matmul(const struct sp_kernels *k, const struct mat *M, int64_t n, struct sp_rng *rng) {
    int64_t ldx = M->m.cols + 3;
    float *x = malloc((size_t)(n * ldx) * sizeof *x);
    for (int64_t i = 0; i < n * ldx; i++) x[i] = sp_rng_normal(rng);
    check_matmul_on(k, M, n, x, ldx);
    free(x);
}

/* 14 and 23: part blocks and (avx512) a pass with a block of zeros */
static const int64_t batches[] = {1, 2, 3, 4, 5, 7, 8, 14, 17, 23, 40};

/* A matrix format and a row length, for the tests that compare sets or
 * batch sizes with each other. */
struct fmt_case {
    enum sp_qtype t;
    int group;
    enum sp_dtype sdt;
    int64_t cols;
};
static const int64_t row_counts[] = {1, 13, 67};

/* Every available set x rows x batch on one (type, group, scale dtype) for
 * each column count in cols[]. */
static void check_format(enum sp_qtype t, int group, enum sp_dtype sdt, const int64_t *cols, int ncols) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 1000u + (uint64_t)t * 31u + (uint64_t)group * 7u + (uint64_t)sdt);
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (int c = 0; c < ncols; c++)
            for (size_t ri = 0; ri < sizeof row_counts / sizeof *row_counts; ri++) {
                struct mat M;
                mat_make(&M, t, group, sdt, row_counts[ri], cols[c], &rng);
                for (size_t b = 0; b < sizeof batches / sizeof *batches; b++) check_matmul(k, &M, batches[b], &rng);
                /* a prefill-sized batch over a long row: several column slices,
                 * and more tokens than the int8 and bf16 products round at a time */
                if (ri == 1 && cols[c] >= 512) check_matmul(k, &M, 100, &rng);
                mat_free(&M);
            }
    }
}

static void test_plain_formats(void **state) {
    /* any column count: tails of 1..31 columns after the 32-wide steps */
    const int64_t cols[] = {1, 7, 8, 33, 100, 517};
    check_format(SP_QTYPE_F32, 1, SP_DTYPE_COUNT, cols, 6);
    check_format(SP_QTYPE_BF16, 1, SP_DTYPE_COUNT, cols, 6);
    check_format(SP_QTYPE_F16, 1, SP_DTYPE_COUNT, cols, 6);
}

static void check_affine(enum sp_qtype t) {
    const int groups[] = {32, 64, 128};
    const enum sp_dtype sdts[] = {SP_DTYPE_F32, SP_DTYPE_BF16, SP_DTYPE_F16};
    for (int g = 0; g < 3; g++)
        for (int s = 0; s < 3; s++) {
            /* one group, three groups, 640 = one 512-column slice + 128, and
             * nine groups (the int8 product by groups takes 8 at a time) */
            const int64_t cols[] = {groups[g], 3 * groups[g], 640, 9 * groups[g]};
            check_format(t, groups[g], sdts[s], cols, 4);
        }
}

static void test_affine4(void **state) { check_affine(SP_QTYPE_AFFINE4); }
static void test_affine8(void **state) { check_affine(SP_QTYPE_AFFINE8); }
/* MLX's 2, 3, 5 and 6 bits: codes that straddle bytes and words */
static void test_affine_packed(void **state) {
    check_affine(SP_QTYPE_AFFINE2);
    check_affine(SP_QTYPE_AFFINE3);
    check_affine(SP_QTYPE_AFFINE5);
    check_affine(SP_QTYPE_AFFINE6);
}

static void test_mxfp4(void **state) {
    const int64_t cols[] = {32, 96, 288, 640};
    check_format(SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, cols, 4);
}

/* Formats without a SIMD fast path must still be right in every set. */
static void test_other_formats(void **state) {
    const int64_t cols[] = {128, 256};
    check_format(SP_QTYPE_MXFP8, 32, SP_DTYPE_U8, cols, 2);
    check_format(SP_QTYPE_NVFP4, 16, SP_DTYPE_U8, cols, 2);
    const int64_t blocks[] = {256, 768};  // ggml's blocks of 256
    check_format(SP_QTYPE_Q2_K, 256, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_Q3_K, 256, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, blocks, 2);
    check_format(SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT, blocks, 2);
}

/* ggml's block formats go through every set's float product, decoded by
 * SIMD code of the set's own: one-hot tokens (token c is 1 at column c)
 * read each decoded value back exactly, which must be the reference's. */
static void test_block_decoders_exact(void **state) {
    static const enum sp_qtype types[] = {SP_QTYPE_Q2_K, SP_QTYPE_Q3_K, SP_QTYPE_Q4_K, SP_QTYPE_Q5_K, SP_QTYPE_Q6_K, SP_QTYPE_IQ4_NL,
                                          SP_QTYPE_IQ4_XS};
    const int64_t rows = 3, cols = 768;
    struct sp_rng rng;
    sp_rng_seed(&rng, 31);
    float *x = calloc((size_t)(cols * cols), sizeof *x), *y = malloc((size_t)(cols * rows) * sizeof *y);
    float *ref = malloc((size_t)cols * sizeof *ref);
    for (int64_t c = 0; c < cols; c++) x[c * cols + c] = 1.0f;
    for (size_t ti = 0; ti < sizeof types / sizeof *types; ti++) {
        struct mat M;
        mat_make(&M, types[ti], sp_qtype_traits(types[ti])->group, SP_DTYPE_COUNT, rows, cols, &rng);
        void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(&M.m), 64, SP_MEM_MISC);
        for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
            const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
            if (!k) continue;
            k->matmul_rows_float(&M.m, 0, rows, x, cols, cols, y, rows, scratch);
            for (int64_t r = 0; r < rows; r++) {
                sp_qmat_dequant_row_ref(&M.m, r, ref);
                for (int64_t c = 0; c < cols; c++)
                    if (y[c * rows + r] != ref[c])
                        fail_msg("%s %s row %lld col %lld: %g, the reference %g", k->name, sp_qtype_name(types[ti]),
                                 (long long)r, (long long)c, (double)y[c * rows + r], (double)ref[c]);
            }
        }
        sp_free_aligned(scratch);
        mat_free(&M);
    }
    free(x);
    free(y);
    free(ref);
}

/* The int8 products add code x activation products in int16 before they
 * widen them; at the largest codes (affine4 15, mxfp4 +6: 2 x 6 + 12 = 24,
 * and -6: 0; affine8 255 and 0, which AVX2 takes as 127 and -128) times
 * activations that all round to +127 or all to -127 the sums must stay
 * exact, in every set, by groups and by tokens. */
static void test_int8_extremes(void **state) {
    const struct {
        struct fmt_case f;
        uint8_t code_byte;  // both nibbles
    } cases[] = {{{SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16, 1056}, 0xff}, {{SP_QTYPE_AFFINE4, 64, SP_DTYPE_F16, 768}, 0xff},
                 {{SP_QTYPE_AFFINE4, 128, SP_DTYPE_F32, 1152}, 0xff}, {{SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056}, 0x77},
                 {{SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056}, 0xff},     {{SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 1056}, 0x00},
                 {{SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 2880}, 0xff},  {{SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16, 768}, 0x00}};
    const int64_t rows = 13, sizes[] = {1, 4, 8, 17};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const struct fmt_case *f = &cases[c].f;
        int64_t ng = f->cols / f->group;
        size_t rb = sp_qtype_row_bytes(f->t, f->cols), sb = (size_t)ng * sp_dtype_size(f->sdt);
        struct mat M = {.codes = malloc(rows * rb), .scales = malloc(rows * sb)};
        memset(M.codes, cases[c].code_byte, rows * rb);
        if (f->t == SP_QTYPE_MXFP4) {
            memset(M.scales, 127, rows * sb);  // E8M0 2^0
        } else {
            M.biases = calloc(rows, sb);
            for (size_t g = 0; g < (size_t)(rows * ng); g++) sp_dtype_store_float(f->sdt, M.scales, g, 1.0f);
        }
        M.m = (struct sp_qmat){.type = f->t, .group = f->group, .rows = rows, .cols = f->cols, .codes = M.codes,
                               .scales = M.scales, .biases = M.biases, .scale_dtype = f->sdt};
        float *x = malloc((size_t)(17 * f->cols) * sizeof *x);
        for (int64_t t = 0; t < 17; t++)
            for (int64_t i = 0; i < f->cols; i++) x[t * f->cols + i] = t % 2 ? -3.0f : 0.5f;
        for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
            const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
            for (size_t b = 0; k && b < sizeof sizes / sizeof *sizes; b++) check_matmul_on(k, &M, sizes[b], x, f->cols);
        }
        free(x);
        mat_free(&M);
    }
}

/* ggml's block formats at their largest codes and integer sub-scales
 * (every byte 0xff: Q6_K codes 63 with scales -1, Q4_K / Q5_K codes 15 / 31
 * with scales and mins 63, Q2_K 3 with 15 and 15, Q3_K 7 with 31, IQ4's
 * +113 with 31) and the f16 scales 1, times activations that round to
 * +-127 (and a mix): the int8 products' int16 pair sums and int32 block
 * sums must stay exact in every set, by rows (up to 7 tokens) and by
 * tokens. */
static void test_block_int8_extremes(void **state) {
    static const struct {
        enum sp_qtype t;
        int f16_at[2];  // where the block's f16 scales are (-1: none)
    } cases[] = {{SP_QTYPE_Q2_K, {80, 82}}, {SP_QTYPE_Q3_K, {108, -1}}, {SP_QTYPE_Q4_K, {0, 2}},
                 {SP_QTYPE_Q5_K, {0, 2}},   {SP_QTYPE_Q6_K, {208, -1}}, {SP_QTYPE_IQ4_NL, {0, -1}},
                 {SP_QTYPE_IQ4_XS, {0, -1}}};
    const int64_t rows = 5, cols = 768, sizes[] = {1, 3, 4, 9, 20};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        const struct sp_qtype_traits *tr = sp_qtype_traits(cases[c].t);
        size_t rb = sp_qtype_row_bytes(cases[c].t, cols);
        struct mat M = {.codes = malloc(rows * rb)};
        memset(M.codes, 0xff, rows * rb);
        for (size_t b = 0; b < rows * rb; b += (size_t)tr->block_bytes)
            for (int i = 0; i < 2; i++)
                if (cases[c].f16_at[i] >= 0) memcpy((uint8_t *)M.codes + b + cases[c].f16_at[i], &(uint16_t){0x3c00}, 2);
        M.m = (struct sp_qmat){.type = cases[c].t, .group = tr->group, .rows = rows, .cols = cols, .codes = M.codes,
                               .scale_dtype = SP_DTYPE_COUNT};
        float *x = malloc((size_t)(20 * cols) * sizeof *x);
        for (int64_t t = 0; t < 20; t++)
            for (int64_t i = 0; i < cols; i++) x[t * cols + i] = t % 3 == 0 ? 2.0f : t % 3 == 1 ? -2.0f : (i % 5 ? 2.0f : -2.0f);
        for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
            const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
            for (size_t b = 0; k && b < sizeof sizes / sizeof *sizes; b++) check_matmul_on(k, &M, sizes[b], x, cols);
        }
        free(x);
        mat_free(&M);
    }
}

/* The AVX2 product by tokens adds a whole mxfp4 group in int16 when its
 * activations allow (columns c with c % 8 < 4 share a lane, the others the
 * other lane; each lane's 16 |int8| must sum to at most 1365, 24 x 1365 =
 * 32760). At code +6 (24) and integer activations with amax 127, tokens 0 -
 * 23 sum to 1365 in both lanes (exact in int16), 24 - 31 to 1366 (32784,
 * which would wrap): blocks 0 - 2 of 8 tokens may go whole, block 3 (and
 * the pair it belongs to) must not. Even tokens positive, odd ones
 * negative. */
static void test_mx4_wide_runs(void **state) {
    const int64_t rows = 13, cols = 1056, ng = cols / 32, sizes[] = {8, 16, 24, 32, 27};
    struct mat M = {.codes = malloc((size_t)(rows * cols / 2)), .scales = malloc((size_t)(rows * ng))};
    memset(M.codes, 0x77, (size_t)(rows * cols / 2));
    memset(M.scales, 127, (size_t)(rows * ng));  // E8M0 2^0
    M.m = (struct sp_qmat){.type = SP_QTYPE_MXFP4, .group = 32, .rows = rows, .cols = cols, .codes = M.codes,
                           .scales = M.scales, .scale_dtype = SP_DTYPE_U8};
    float *x = malloc((size_t)(32 * cols) * sizeof *x);
    for (int64_t t = 0; t < 32; t++) {
        int big = t >= 24 ? 9 : 8;  // lane entries 1..big are 83, the rest 82, entry 0 is 127
        for (int64_t c = 0; c < cols; c++) {
            int64_t i = (c % 32) / 8 * 4 + c % 4;  // the column's entry in its lane, 0..15
            float v = i == 0 ? 127.0f : i <= big ? 83.0f : 82.0f;
            x[t * cols + c] = t % 2 ? -v : v;
        }
    }
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        for (size_t b = 0; k && b < sizeof sizes / sizeof *sizes; b++) check_matmul_on(k, &M, sizes[b], x, cols);
    }
    free(x);
    mat_free(&M);
}

/* A token's outputs are bit-identical whatever else is in its batch: the
 * server relies on chunked prefill = one batch = token by token. */
static void test_batch_invariance(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 3);
    const struct fmt_case cases[] = {
        {SP_QTYPE_F32, 1, SP_DTYPE_COUNT, 517},   {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT, 1030},
        {SP_QTYPE_F16, 1, SP_DTYPE_COUNT, 100},   {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 640},
        {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 96}, {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1024},
        /* int8 products: groups in eights plus a rest, a lone 32-column block;
         * 57 groups, whose per-group rows round up to 64 and are padded (q8_ldg) */
        {SP_QTYPE_AFFINE4, 32, SP_DTYPE_F32, 608}, {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F16, 1152},
        {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056},   {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1824},
        /* 8-bit rows, by groups for every batch size: GGUF's Q8_0 as read
         * (gpt-oss's 90 groups), and group 128 */
        {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 2880}, {SP_QTYPE_AFFINE8, 128, SP_DTYPE_BF16, 1152},
        /* ggml's block formats (int8 products of their own: the K-quants,
         * and IQ4_XS with VNNI, by tokens from 8 tokens on, the rest and
         * the others 4 a pass) */
        {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 512}, {SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, 768},
        {SP_QTYPE_Q2_K, 256, SP_DTYPE_COUNT, 256}, {SP_QTYPE_Q3_K, 256, SP_DTYPE_COUNT, 512},
        {SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT, 256}, {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 96},
        {SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT, 512},
        /* blocks added eight at a time: an eight and a part, two and a part */
        {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 2304}, {SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, 4352},
        {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 608},
        /* MLX's packed 3, 5 and 6 bits (GGUF's Q5_0 and Q5_1 become affine 5-bit) */
        {SP_QTYPE_AFFINE3, 64, SP_DTYPE_BF16, 320}, {SP_QTYPE_AFFINE5, 32, SP_DTYPE_F16, 2880},
        {SP_QTYPE_AFFINE6, 128, SP_DTYPE_F32, 384}};
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            struct mat M;
            mat_make(&M, cases[c].t, cases[c].group, cases[c].sdt, 13, cases[c].cols, &rng);
            int64_t cols = cases[c].cols, n = 200;
            float *x = malloc((size_t)(n * cols) * sizeof *x), *y = malloc((size_t)(n * 13) * sizeof *y);
            float one[13];
            for (int64_t i = 0; i < n * cols; i++) x[i] = sp_rng_normal(&rng);
            void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(&M.m), 64, SP_MEM_MISC);
            /* 80: two rounds of the int8 products (SP_KERNELS_Q8_TOKENS); 200:
             * three blocks of tokens of the blocked float product, the last
             * a part one */
            const int64_t sizes[] = {200, 80, 40, 23, 17, 14, 9, 7, 5, 3};
            for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
                k->matmul_rows(&M.m, 0, 13, x, cols, sizes[b], y, 13, scratch);
                for (int64_t t = 0; t < sizes[b]; t++) {
                    k->matmul_rows(&M.m, 0, 13, x + t * cols, cols, 1, one, 13, scratch);
                    if (memcmp(one, y + t * 13, sizeof one) != 0)
                        print_error("%s %s: token %lld of %lld differs from the token alone\n", k->name,
                                    sp_qtype_name(M.m.type), (long long)t, (long long)sizes[b]);
                    assert_memory_equal(one, y + t * 13, sizeof one);
                }
            }
            sp_free_aligned(scratch);
            free(x);
            free(y);
            mat_free(&M);
        }
    }
}

/* argmax: the first of the largest values, NaN passed over, against a
 * plain loop: random values, the largest twice (the first counts), NaN at
 * the front and in the middle, all -inf, all NaN but one. */
static int64_t argmax_ref(const float *v, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isnan(v[i]) && (best < 0 || v[i] > v[best])) best = i;
    return best < 0 ? 0 : best;
}

static void check_argmax(const struct sp_kernels *k, float *v, int64_t n, struct sp_rng *rng) {
    for (int kind = 0; kind < 6; kind++) {
        for (int64_t i = 0; i < n; i++) v[i] = sp_rng_normal(rng);
        if (n > 1 && kind == 1) {
            int64_t a = (int64_t)(sp_rng_next(rng) % (uint64_t)n), b = (int64_t)(sp_rng_next(rng) % (uint64_t)n);
            v[a] = v[b] = 9.0f;
        }
        if (n > 0 && kind == 2) v[0] = NAN;
        if (n > 2 && kind == 3) v[n / 2] = NAN, v[n - 1] = 50.0f;
        if (kind == 4)
            for (int64_t i = 0; i < n; i++) v[i] = -INFINITY;
        if (kind == 5)
            for (int64_t i = 0; i < n; i++) v[i] = i == n / 3 ? -1.0f : NAN;
        int64_t got = k->argmax(v, n), want = argmax_ref(v, n);
        if (got != want)
            print_error("%s argmax: %lld values (case %d): %lld, not %lld\n", k->name, (long long)n, kind,
                        (long long)got, (long long)want);
        assert_int_equal(got, want);
    }
}

/* sum_exp against a double loop of exp, values down to 100 below m
 * (underflowing terms), within the error of the sets' float exp (a few
 * roundings a term, the sum in double). */
static void check_sum_exp(const struct sp_kernels *k, float *v, int64_t n, struct sp_rng *rng) {
    const float m = 3.0f;
    for (int64_t i = 0; i < n; i++) v[i] = m - 100.0f * sp_rng_uniform(rng) * sp_rng_uniform(rng);
    double want = 0;
    for (int64_t i = 0; i < n; i++) want += exp((double)v[i] - m);
    double got = k->sum_exp(v, n, m);
    if (!(fabs(got - want) <= 1e-6 * want + 1e-30))
        print_error("%s sum_exp: %lld values: %.9g, not %.9g\n", k->name, (long long)n, got, want);
    assert_true(fabs(got - want) <= 1e-6 * want + 1e-30);
}

/* The reductions over a vocabulary of logits (argmax, sum_exp), every set,
 * lengths around the vector widths up to a real vocabulary. */
static void test_vocab_reductions(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 13);
    const int64_t lens[] = {0, 1, 2, 7, 8, 9, 31, 32, 33, 63, 100, 4099, 151936};
    float *v = malloc(151936 * sizeof *v);
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t li = 0; li < sizeof lens / sizeof *lens; li++) {
            check_argmax(k, v, lens[li], &rng);
            check_sum_exp(k, v, lens[li], &rng);
        }
    }
    free(v);
}

/* matmul_rows_pair gives each matrix what matmul_rows gives it, to the bit,
 * over a range of rows and leaves every other output alone: two matrices
 * of one format (the activations rounded once for both), ggml's block
 * formats of one rounding unit (rounded once, the K-quants' tokens laid
 * side by side once, the other format taking them by rows) and, as the
 * fallback, of two formats. */
static void test_matmul_pair(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 11);
    const struct fmt_case cases[][2] = {
        {{SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 640}, {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 640}},
        {{SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056}, {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056}},
        {{SP_QTYPE_AFFINE4, 128, SP_DTYPE_F16, 1152}, {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F16, 1152}},
        {{SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 96}, {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 96}},
        {{SP_QTYPE_BF16, 1, SP_DTYPE_COUNT, 1030}, {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT, 1030}},
        {{SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 640}, {SP_QTYPE_AFFINE4, 32, SP_DTYPE_F32, 640}},
        {{SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16, 640}, {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 640}},
        {{SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 512}, {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 512}},
        {{SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 768}, {SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, 768}},
        {{SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT, 512}, {SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT, 512}},
        {{SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 96}, {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 96}}};
    const int64_t rows = 21, r0 = 3, r1 = 19, ldy = rows + 2, sizes[] = {1, 4, 5, 12, 13, 33, 40};
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            struct mat A, B;
            int64_t cols = cases[c][0].cols, n = 40;
            mat_make(&A, cases[c][0].t, cases[c][0].group, cases[c][0].sdt, rows, cols, &rng);
            mat_make(&B, cases[c][1].t, cases[c][1].group, cases[c][1].sdt, rows, cols, &rng);
            size_t ny = (size_t)(n * ldy);
            float *x = malloc((size_t)(n * cols) * sizeof *x), *y[4];
            for (int i = 0; i < 4; i++) y[i] = malloc(ny * sizeof *y[i]);
            for (int64_t i = 0; i < n * cols; i++) x[i] = sp_rng_normal(&rng);
            size_t sa = sp_kernels_scratch_bytes(&A.m), sb = sp_kernels_scratch_bytes(&B.m);
            void *scratch = sp_malloc_aligned(sa > sb ? sa : sb, 64, SP_MEM_MISC);
            for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++) {
                for (int i = 0; i < 4; i++)
                    for (size_t j = 0; j < ny; j++) y[i][j] = 12345.0f;
                k->matmul_rows(&A.m, r0, r1, x, cols, sizes[b], y[0], ldy, scratch);
                k->matmul_rows(&B.m, r0, r1, x, cols, sizes[b], y[1], ldy, scratch);
                k->matmul_rows_pair(&A.m, &B.m, r0, r1, x, cols, sizes[b], y[2], y[3], ldy, scratch);
                for (int i = 0; i < 2; i++) {
                    if (memcmp(y[i], y[2 + i], ny * sizeof *y[i]) != 0)
                        print_error("%s %s / %s: %lld tokens: matrix %d of the pair differs from it alone\n", k->name,
                                    sp_qtype_name(A.m.type), sp_qtype_name(B.m.type), (long long)sizes[b], i);
                    assert_memory_equal(y[i], y[2 + i], ny * sizeof *y[i]);
                }
                assert_true(y[2][r0 - 1] == 12345.0f && y[3][r1] == 12345.0f && y[2][r0] != 12345.0f);
            }
            sp_free_aligned(scratch);
            free(x);
            for (int i = 0; i < 4; i++) free(y[i]);
            mat_free(&A);
            mat_free(&B);
        }
    }
}

/* The VNNI sets multiply-add with vpdpwssd / vpdpbusd where avx2 uses
 * vpmaddwd / vpmaddubsw and adds (amx: with tdpbusd, for mxfp4 tdpbssd, on
 * tiles of 16 rows, which the 29 rows here fill once and leave 13 of the
 * next); the int32 sums are exact either way, so their products must be
 * bit-identical to avx2's (and their -int16 sets to avx2-int16's) for
 * every format, group and batch size. Runs on CPUs
 * that have a VNNI set (the test reports which it compared). */
static void test_vnni_sets_match_avx2(void **state) {
    const struct {
        enum sp_kernels_isa set, base;
        const char *name;
    } pairs[] = {{SP_KERNELS_AVXVNNI, SP_KERNELS_AVX2, "avxvnni"},
                 {SP_KERNELS_AVX512, SP_KERNELS_AVX2, "avx512"},
                 {SP_KERNELS_AMX, SP_KERNELS_AVX2, "amx"},
                 {SP_KERNELS_AVXVNNI_INT16, SP_KERNELS_AVX2_INT16, "avxvnni-int16"},
                 {SP_KERNELS_AVX512_INT16, SP_KERNELS_AVX2_INT16, "avx512-int16"},
                 {SP_KERNELS_AMX_INT16, SP_KERNELS_AVX2_INT16, "amx-int16"}};
    struct sp_rng rng;
    sp_rng_seed(&rng, 17);
    /* 4-bit rows of whole unit pairs, a last unpaired unit (576 columns of
     * group 64, 2880 of mxfp4: gpt-oss), a unit and a lone block (608) and a
     * lone block alone (1056) at the end; steps of 8 groups and less; 57
     * groups, whose per-group rows are padded (1824, q8_ldg) */
    const struct fmt_case cases[] = {
        {SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16, 608}, {SP_QTYPE_AFFINE4, 64, SP_DTYPE_F16, 640},
        {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 576}, {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F32, 384},
        {SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16, 320}, {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056},
        {SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16, 2880}, {SP_QTYPE_AFFINE8, 128, SP_DTYPE_F32, 1152},
        {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 2880},    {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1824},
        {SP_QTYPE_BF16, 1, SP_DTYPE_COUNT, 520},    {SP_QTYPE_Q2_K, 256, SP_DTYPE_COUNT, 512},
        {SP_QTYPE_Q3_K, 256, SP_DTYPE_COUNT, 256},  {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 512},
        {SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT, 768},  {SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, 256},
        {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 160}, {SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT, 512},
        {SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT, 2304}, {SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT, 608},
        {SP_QTYPE_AFFINE2, 32, SP_DTYPE_BF16, 256}, {SP_QTYPE_AFFINE3, 64, SP_DTYPE_F16, 320},
        {SP_QTYPE_AFFINE5, 32, SP_DTYPE_F16, 2880}, {SP_QTYPE_AFFINE6, 128, SP_DTYPE_F32, 384}};
    for (size_t v = 0; v < sizeof pairs / sizeof *pairs; v++) {
        const struct sp_kernels *k = sp_kernels_of(pairs[v].set), *avx2 = sp_kernels_of(pairs[v].base);
        if (!k || !avx2) {
            /* said aloud: on such a CPU this test compares nothing */
            printf("# %s: not run by this CPU, its identity with avx2 is not checked here\n", pairs[v].name);
            continue;
        }
        printf("# %s matches %s bit for bit:", k->name, avx2->name);
        for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
            /* bf16 rows with bf16 activations are another product */
            if (cases[c].t == SP_QTYPE_BF16 && k->bf16_rows) continue;
            struct mat M;
            mat_make(&M, cases[c].t, cases[c].group, cases[c].sdt, 29, cases[c].cols, &rng);
            int64_t cols = cases[c].cols;
            float *x = malloc((size_t)(80 * cols) * sizeof *x), *ya = malloc(80 * 29 * sizeof *ya),
                  *yb = malloc(80 * 29 * sizeof *yb);
            for (int64_t i = 0; i < 80 * cols; i++) x[i] = sp_rng_normal(&rng);
            void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(&M.m), 64, SP_MEM_MISC);
            const size_t nb = sizeof batches / sizeof *batches;
            for (size_t b = 0; b <= nb; b++) {
                int64_t n = b < nb ? batches[b] : 80;  // 80: two rounds of the int8 products
                avx2->matmul_rows(&M.m, 0, 29, x, cols, n, ya, 29, scratch);
                k->matmul_rows(&M.m, 0, 29, x, cols, n, yb, 29, scratch);
                if (memcmp(ya, yb, (size_t)(n * 29) * sizeof *ya) != 0)
                    print_error("%s %s g%d: batch %lld differs from %s\n", k->name, sp_qtype_name(M.m.type),
                                M.m.group, (long long)n, avx2->name);
                assert_memory_equal(ya, yb, (size_t)(n * 29) * sizeof *ya);
            }
            printf(" %s-g%d", sp_qtype_name(M.m.type), M.m.group);
            sp_free_aligned(scratch);
            free(x);
            free(ya);
            free(yb);
            mat_free(&M);
        }
        printf("\n");
    }
}

/* Interleaved matrices (sp_qmat_interleave): the reference reads the same
 * weights, a block taken back into row order is the rows' bytes, and every
 * set's products (int8, int16 and float activations, pairs) give the same
 * bits as on the rows in row order, over ranges of rows that start and end
 * inside blocks, writing nothing else. */
static void check_interleaved(const struct sp_kernels *k, const struct mat *M, const struct sp_qmat *iw,
                              const float *x, int64_t cols) {
    const struct sp_qmat *m = &M->m;
    const int64_t rows = m->rows, ldy = rows + 3;
    const int64_t ranges[][2] = {{0, rows}, {5, rows - 11}, {16, 32}, {3, 4}, {17, 18}};
    const int64_t sizes[] = {1, 2, 3, 4, 5, 7, 8, 14, 17, 23, 40, 80};
    float *ya = malloc((size_t)(80 * ldy) * sizeof *ya), *yb = malloc((size_t)(80 * ldy) * sizeof *yb);
    float *pa = malloc((size_t)(80 * ldy) * sizeof *pa), *pb = malloc((size_t)(80 * ldy) * sizeof *pb);
    void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(iw), 64, SP_MEM_MISC);
    for (size_t r = 0; r < sizeof ranges / sizeof *ranges; r++)
        for (size_t b = 0; b < sizeof sizes / sizeof *sizes; b++)
            for (int kind = 0; kind < 3; kind++) {
                int64_t r0 = ranges[r][0], r1 = ranges[r][1], n = sizes[b];
                for (int64_t i = 0; i < 80 * ldy; i++) ya[i] = yb[i] = pa[i] = pb[i] = 777.0f;
                if (kind == 0) {
                    k->matmul_rows(m, r0, r1, x, cols, n, ya, ldy, scratch);
                    k->matmul_rows(iw, r0, r1, x, cols, n, yb, ldy, scratch);
                } else if (kind == 1) {
                    k->matmul_rows_float(m, r0, r1, x, cols, n, ya, ldy, scratch);
                    k->matmul_rows_float(iw, r0, r1, x, cols, n, yb, ldy, scratch);
                } else {
                    k->matmul_rows_pair(m, m, r0, r1, x, cols, n, ya, pa, ldy, scratch);
                    k->matmul_rows_pair(iw, iw, r0, r1, x, cols, n, yb, pb, ldy, scratch);
                }
                bool same = memcmp(ya, yb, (size_t)(80 * ldy) * sizeof *ya) == 0 &&
                            memcmp(pa, pb, (size_t)(80 * ldy) * sizeof *pa) == 0;
                if (!same)
                    print_error("%s %s g%d %lld cols: rows %lld-%lld, %lld tokens (%s): interleaved differs\n", k->name,
                                sp_qtype_name(m->type), m->group, (long long)cols, (long long)r0, (long long)r1,
                                (long long)n, kind == 0 ? "matmul_rows" : kind == 1 ? "float" : "pair");
                assert_true(same);
                for (int64_t t = 0; t < n; t++) assert_true(ya[t * ldy + r0] != 777.0f && ya[t * ldy + r1 - 1] != 777.0f);
            }
    sp_free_aligned(scratch);
    free(ya);
    free(yb);
    free(pa);
    free(pb);
}

static void test_interleaved_rows(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 29);
    /* a lone last block (608), steps of 8 groups and a rest, fewer than 8
     * groups (256), every scale dtype, mxfp4 with a lone unit (2880) */
    const struct fmt_case cases[] = {
        {SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16, 608}, {SP_QTYPE_AFFINE4, 64, SP_DTYPE_F16, 640},
        {SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 256}, {SP_QTYPE_AFFINE4, 128, SP_DTYPE_F32, 1152},
        {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 1056},    {SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 2880}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        struct mat M;
        int64_t rows = 48, cols = cases[c].cols;
        mat_make(&M, cases[c].t, cases[c].group, cases[c].sdt, rows, cols, &rng);
        struct mat odd;
        mat_make(&odd, cases[c].t, cases[c].group, cases[c].sdt, 40 + 3, cols, &rng);
        assert_true(sp_qmat_interleavable(&M.m));
        assert_false(sp_qmat_interleavable(&odd.m));  // not whole blocks of rows
        mat_free(&odd);
        size_t cb = (size_t)rows * sp_qtype_row_bytes(M.m.type, cols);
        size_t sb = (size_t)(rows * (cols / M.m.group)) * sp_dtype_size(M.m.scale_dtype);
        void *codes = malloc(cb), *scales = malloc(sb), *biases = M.m.biases ? malloc(sb) : NULL;
        struct sp_qmat iw;
        sp_qmat_interleave(&M.m, codes, scales, biases, &iw);
        assert_true(iw.interleaved);
        assert_false(sp_qmat_interleavable(&iw));
        /* the reference reads the same weights; each block comes back whole */
        float *wa = malloc((size_t)cols * sizeof *wa), *wb = malloc((size_t)cols * sizeof *wb);
        for (int64_t r = 0; r < rows; r++) {
            sp_qmat_dequant_row_ref(&M.m, r, wa);
            sp_qmat_dequant_row_ref(&iw, r, wb);
            assert_memory_equal(wa, wb, (size_t)cols * sizeof *wa);
        }
        uint8_t *buf = malloc(sp_qmat_block_bytes(&iw));
        size_t rcb = cb / 3, rsb = sb / 3;  // one block of 16 rows
        for (int64_t b = 0; b < rows / SP_QMAT_BLOCK_ROWS; b++) {
            struct sp_qmat blk;
            sp_qmat_block_rows(&iw, b, buf, buf + rcb, buf + rcb + rsb, &blk);
            assert_false(blk.interleaved);
            assert_int_equal(blk.rows, SP_QMAT_BLOCK_ROWS);
            assert_memory_equal(blk.codes, (const uint8_t *)M.m.codes + b * rcb, rcb);
            assert_memory_equal(blk.scales, (const uint8_t *)M.m.scales + b * rsb, rsb);
            if (M.m.biases) assert_memory_equal(blk.biases, (const uint8_t *)M.m.biases + b * rsb, rsb);
        }
        float *x = malloc((size_t)(80 * cols) * sizeof *x);
        for (int64_t i = 0; i < 80 * cols; i++) x[i] = sp_rng_normal(&rng);
        for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
            const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
            if (k) check_interleaved(k, &M, &iw, x, cols);
        }
        free(x);
        free(buf);
        free(wa);
        free(wb);
        free(codes);
        free(scales);
        free(biases);
        mat_free(&M);
    }
}

/* The checker itself: a result off by 10x the tolerance must be flagged. */
static void test_checker_catches_errors(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 7);
    struct mat M;
    mat_make(&M, SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 3, 128, &rng);
    float x[128], y[3], w[128];
    for (int i = 0; i < 128; i++) x[i] = sp_rng_normal(&rng);
    for (int r = 0; r < 3; r++) y[r] = sp_qmat_dot_row_ref(&M.m, r, x);
    int64_t br, bt;
    assert_true(worst_ratio(&M.m, x, 128, 1, y, 3, ACTS_FLOAT, &br, &bt) <= 1.0);
    sp_qmat_dequant_row_ref(&M.m, 1, w);
    double mag = 0;
    for (int i = 0; i < 128; i++) mag += fabs((double)w[i] * x[i]);
    y[1] += (float)(10 * TOL_MATMUL * mag);
    assert_true(worst_ratio(&M.m, x, 128, 1, y, 3, ACTS_FLOAT, &br, &bt) > 1.0);
    assert_int_equal(br, 1);
    y[1] = NAN;
    assert_true(worst_ratio(&M.m, x, 128, 1, y, 3, ACTS_FLOAT, &br, &bt) > 1.0);
    mat_free(&M);
    /* the int8 allowance: the int8 products pass; the same with every
     * multiplier 4% off (a wrong scale) does not */
    const struct sp_kernels *k = sp_kernels_of(SP_KERNELS_AVX2);
    if (!k) k = sp_kernels_of(SP_KERNELS_PORTABLE);
    mat_make(&M, SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 64, 512, &rng);
    float *xs = malloc(4 * 512 * sizeof *xs), *ys = malloc(4 * 64 * sizeof *ys);
    for (int i = 0; i < 4 * 512; i++) xs[i] = sp_rng_normal(&rng);
    void *scratch = sp_malloc_aligned(sp_kernels_scratch_bytes(&M.m), 64, SP_MEM_MISC);
    k->matmul_rows(&M.m, 0, 64, xs, 512, 4, ys, 64, scratch);
    assert_true(worst_ratio(&M.m, xs, 512, 4, ys, 64, ACTS_INT8, &br, &bt) <= 1.0);
    for (int r = 0; r < 64; r++)
        for (int t = 0; t < 4; t++) {
            /* the bias term is exact; only the rest is scaled */
            float b = 0;
            for (int g = 0; g < 8; g++) {
                float bg = sp_dtype_load_float(SP_DTYPE_BF16, M.m.biases, (size_t)(r * 8 + g)), sx = 0;
                for (int i = 0; i < 64; i++) sx += xs[t * 512 + g * 64 + i];
                b += bg * sx;
            }
            ys[t * 64 + r] = b + (ys[t * 64 + r] - b) * 1.04f;
        }
    double off = worst_ratio(&M.m, xs, 512, 4, ys, 64, ACTS_INT8, &br, &bt);
    printf("# a 4%% scale error: %.2f x the int8 allowance\n", off);
    assert_true(off > 1.0);
    sp_free_aligned(scratch);
    free(xs);
    free(ys);
    mat_free(&M);
}

static void test_dot_axpy(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 11);
    const int64_t ns[] = {0, 1, 7, 8, 9, 31, 32, 33, 64, 128, 1000};
    float a[1000], b[1000], y[1000], y0[1000];
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
            int64_t n = ns[c];
            double ref = 0, mag = 0;
            for (int64_t i = 0; i < n; i++) {
                a[i] = sp_rng_normal(&rng);
                b[i] = sp_rng_normal(&rng);
                ref += (double)a[i] * b[i];
                mag += fabs((double)a[i] * b[i]);
            }
            assert_true(fabs(k->dot(a, b, n) - ref) <= TOL_DOT * mag + DBL_MIN);
            float s = sp_rng_normal(&rng);
            for (int64_t i = 0; i < n + 1 && i < 1000; i++) y[i] = y0[i] = sp_rng_normal(&rng);
            k->axpy(y, s, b, n);
            /* one product and one sum per element: FMA or not, within 1 ulp-ish */
            for (int64_t i = 0; i < n; i++) {
                double want = (double)y0[i] + (double)s * b[i];
                assert_true(fabs(y[i] - want) <= 2 * FLT_EPSILON * (fabs((double)y0[i]) + fabs((double)s * b[i])));
            }
            if (n < 1000) assert_true(y[n] == y0[n]);  // writes nothing past n
            /* b stored as F16 / BF16 (a KV cache row), converted exactly */
            const enum sp_dtype halves[] = {SP_DTYPE_F16, SP_DTYPE_BF16};
            for (int h = 0; h < 2; h++) {
                uint16_t bh[1000];
                float conv[1001];
                for (int64_t i = 0; i < n; i++)
                    bh[i] = halves[h] == SP_DTYPE_F16 ? sp_f32_to_f16(b[i]) : sp_f32_to_bf16(b[i]);
                conv[n] = 12345.0f;
                k->to_f32(conv, bh, halves[h], n);
                assert_true(conv[n] == 12345.0f);
                for (int64_t i = 0; i < n; i++)
                    assert_true(conv[i] == (halves[h] == SP_DTYPE_F16 ? sp_f16_to_f32(bh[i]) : sp_bf16_to_f32(bh[i])));
            }
        }
    }
}

/* Attention's blocks of cached rows: 1 to 7 heads' scores (the blocks of
 * 4, 3, 2 and 1 heads) against a double reference and each the same as
 * computed alone at any offset (columns past the real ones hold NaN, as a
 * block of cached keys holds whatever its later positions held: they must
 * not reach a real score), nothing written past them; values added exactly
 * as axpy row by row (1 to 7 heads). */
static void test_attention_blocks(void **state) {
    (void)state;
    struct sp_rng rng;
    sp_rng_seed(&rng, 29);
    enum { NQ = 7, MAXR = 40, LDC = 48, MAXN = 136, LDO = 41 };
    const int64_t ns[] = {1, 7, 8, 9, 64, 128, 136};
    const int64_t nrs[] = {1, 5, 8, 13, 20, 32, 40};
    static float a[NQ * MAXN], rows[MAXR * MAXN], conv[MAXR * MAXN], cols[MAXN * LDC + 1], out[NQ * LDO];
    static float w[NQ * MAXR], y[NQ * MAXN], yb[NQ * MAXN], alone[NQ][MAXR];
    static double ref[NQ][MAXR], mag[NQ][MAXR];
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t ci = 0; ci < sizeof ns / sizeof *ns; ci++)
            for (size_t ri = 0; ri < sizeof nrs / sizeof *nrs; ri++) {
                int64_t n = ns[ci], nr = nrs[ri];
                for (int64_t i = 0; i < NQ * MAXN; i++) a[i] = sp_rng_normal(&rng);
                for (int64_t i = 0; i < nr * n; i++) rows[i] = sp_rng_normal(&rng);
                /* the keys as a bf16 cache holds them, laid out as columns */
                for (int64_t i = 0; i < MAXN * LDC + 1; i++) cols[i] = NAN;
                for (int64_t r = 0; r < nr; r++)
                    for (int64_t i = 0; i < n; i++)
                        cols[i * LDC + r] = conv[r * n + i] = sp_bf16_to_f32(sp_f32_to_bf16(rows[r * n + i]));
                const float scale = 0.125f + (float)ci;
                /* each score's reference, and the score of its head and column alone */
                for (int64_t q = 0; q < NQ; q++)
                    for (int64_t r = 0; r < nr; r++) {
                        ref[q][r] = mag[q][r] = 0;
                        for (int64_t i = 0; i < n; i++) {
                            ref[q][r] += (double)a[q * MAXN + i] * conv[r * n + i];
                            mag[q][r] += fabs((double)a[q * MAXN + i] * conv[r * n + i]);
                        }
                        k->dot_cols(&alone[q][r], 1, a + q * MAXN, MAXN, 1, cols + r, LDC, 1, n, scale);
                    }
                for (int64_t na = 1; na <= NQ; na++) {
                    for (int64_t i = 0; i < NQ * LDO; i++) out[i] = 555.0f;
                    k->dot_cols(out, LDO, a, MAXN, na, cols, LDC, nr, n, scale);
                    for (int64_t q = 0; q < NQ; q++) {
                        for (int64_t r = 0; r < nr && q < na; r++) {
                            float o = out[q * LDO + r];
                            double tol = (double)(n + 1) * FLT_EPSILON * scale * mag[q][r] + DBL_MIN;
                            assert_true(fabs(o - scale * ref[q][r]) <= tol);
                            assert_true(alone[q][r] == o);
                        }
                        for (int64_t r = q < na ? nr : 0; r < LDO; r++) assert_true(out[q * LDO + r] == 555.0f);
                    }
                    for (int64_t i = 0; i < NQ * MAXR; i++) w[i] = sp_rng_normal(&rng);
                    for (int64_t i = 0; i < NQ * MAXN; i++) y[i] = yb[i] = sp_rng_normal(&rng);
                    k->axpy_rows(y, MAXN, w, MAXR, na, rows, nr, n);
                    for (int64_t q = 0; q < na; q++)
                        for (int64_t r = 0; r < nr; r++) k->axpy(yb + q * MAXN, w[q * MAXR + r], rows + r * n, n);
                    for (int64_t i = 0; i < NQ * MAXN; i++) assert_true(y[i] == yb[i]);
                }
            }
    }
}

/* The gated activation against a double reference (SiLU, and gpt-oss's
 * clamped form past its limit), over the exp's whole range; interleaved
 * pairs give what separate rows give, an element what it gives alone, and
 * every x86 set what avx2 gives. */
static void test_glu(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 23);
    const struct sp_glu acts[] = {{1.0f, INFINITY, 0.0f}, {1.702f, 7.0f, 1.0f}};
    const int64_t ns[] = {0, 1, 7, 8, 9, 33, 200};
    enum { N = 200 };
    float g[N], u[N], pairs[2 * N], y[N + 1], yp[N], yr[N], one;
    const struct sp_kernels *avx2 = sp_kernels_of(SP_KERNELS_AVX2);
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t a = 0; a < sizeof acts / sizeof *acts; a++) {
            const struct sp_glu *p = &acts[a];
            for (size_t c = 0; c < sizeof ns / sizeof *ns; c++) {
                int64_t n = ns[c];
                for (int64_t i = 0; i < n; i++) {
                    /* scales from 0.1 to 100: exp's arguments to well past its range */
                    double scale = pow(10.0, (double)(i % 4) - 1.0);
                    g[i] = (float)(sp_rng_normal(&rng) * scale);
                    u[i] = (float)(sp_rng_normal(&rng) * scale);
                    pairs[2 * i] = g[i];
                    pairs[2 * i + 1] = u[i];
                }
                y[n] = 12345.0f;
                k->glu(y, g, u, n, p);
                assert_true(y[n] == 12345.0f);
                k->glu(yp, pairs, NULL, n, p);
                /* the x86 sets share one polynomial, 8 or 16 lanes at a time */
                if (avx2 && isa != SP_KERNELS_PORTABLE) {
                    avx2->glu(yr, g, u, n, p);
                    assert_memory_equal(y, yr, (size_t)n * sizeof *y);
                }
                for (int64_t i = 0; i < n; i++) {
                    double gi = g[i] > p->limit ? p->limit : g[i];
                    double ui = u[i] > p->limit ? p->limit : u[i] < -p->limit ? -p->limit : u[i];
                    double want = (ui + p->u_offset) * gi / (1.0 + exp(-gi * p->alpha));
                    /* a few roundings, and alpha * g rounded to float: exp
                     * turns its error into |alpha g| roundings */
                    double tol = (8.0 + fabs(gi * p->alpha)) * FLT_EPSILON * fabs(want) + 1e-30;
                    if (!(fabs(y[i] - want) <= tol))
                        print_error("%s glu(%g, %g) = %.9g, want %.9g\n", k->name, g[i], u[i], y[i], want);
                    assert_true(fabs(y[i] - want) <= tol);
                    assert_true(yp[i] == y[i]);
                    k->glu(&one, g + i, u + i, 1, p);
                    assert_true(one == y[i]);
                }
            }
        }
    }
}

/* Chunks of an online softmax against a double reference, over exp's
 * range, with no max yet, a max below the chunk's and one above it:
 * nothing written past n, the new max, the exps, their sum, NaN passed
 * over by the max, a row's values the same wherever it sits, and every
 * x86 set's bits those of avx2. */
static void test_softmax_chunk(void **state) {
    (void)state;
    struct sp_rng rng;
    sp_rng_seed(&rng, 29);
    const int64_t ns[] = {1, 7, 8, 9, 33, 200};
    enum { N = 200 };
    float v[N + 9], x[N];
    const struct sp_kernels *avx2 = sp_kernels_of(SP_KERNELS_AVX2);
    for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
        if (!k) continue;
        for (size_t c = 0; c < sizeof ns / sizeof *ns; c++)
            for (int before = 0; before < 3; before++) {
                int64_t n = ns[c];
                float top = (float)(sp_rng_normal(&rng) * 4.0);
                for (int64_t i = 0; i < n; i++) v[i] = x[i] = top - (float)fabs(sp_rng_normal(&rng) * (i % 3 ? 3.0 : 30.0));
                /* the max so far: none, below the chunk's top, above it */
                float m0 = before == 0 ? -INFINITY : before == 1 ? top - 5.0f : top + 3.0f, m = m0;
                v[n] = 12345.0f;
                double sum = k->softmax_chunk(v, n, &m);
                assert_true(v[n] == 12345.0f);
                if (avx2 && isa != SP_KERNELS_PORTABLE) {  // one polynomial and one order of sums on x86
                    float r[N], mr = m0;
                    memcpy(r, x, (size_t)n * sizeof *r);
                    assert_true(avx2->softmax_chunk(r, n, &mr) == sum && mr == m);
                    assert_memory_equal(r, v, (size_t)n * sizeof *r);
                }
                float want_m = m0;
                for (int64_t i = 0; i < n; i++) want_m = x[i] > want_m ? x[i] : want_m;
                assert_true(m == want_m);
                double total = 0;
                for (int64_t i = 0; i < n; i++) {
                    float arg = x[i] - m;  // rounded to float, as the kernels take it
                    double want = exp((double)arg);
                    assert_true(fabs(v[i] - want) <= (16.0 + fabs(arg)) * FLT_EPSILON * want + 1e-37);
                    total += v[i];
                }
                assert_true(fabs(sum - total) <= 1e-12 * total);
                /* the same row at another offset, and with a NaN beside it that the max passes over */
                for (int64_t i = 0; i < n; i++) v[3 + i] = x[i];
                float first = v[0], m2 = m0;
                k->softmax_chunk(v + 3, n, &m2);
                assert_true(v[0] == first && m2 == m);
                float again[N + 1];
                for (int64_t i = 0; i < n; i++) again[i] = x[i];
                float m3 = m0;
                k->softmax_chunk(again, n, &m3);
                for (int64_t i = 0; i < n; i++) assert_true(v[3 + i] == again[i]);
                again[n] = NAN;
                for (int64_t i = 0; i < n; i++) again[i] = x[i];
                m3 = m0;
                k->softmax_chunk(again, n + 1, &m3);
                assert_true(m3 == m);
                for (int64_t i = 0; i < n; i++) assert_true(again[i] == v[3 + i]);
            }
    }
}

/* Whether a /proc/cpuinfo flags line lists flag as a whole word. */
static bool has_flag(const char *line, const char *flag) {
    size_t n = strlen(flag);
    for (const char *p = strstr(line, flag); p; p = strstr(p + 1, flag))
        if (p[-1] == ' ' && (p[n] == ' ' || p[n] == '\n' || p[n] == 0)) return true;
    return false;
}

/* The flags line of /proc/cpuinfo, or "" when there is none. */
static void cpuinfo_flags(char *line, size_t size) {
    line[0] = 0;
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f) return;
    while (fgets(line, (int)size, f))
        if (strncmp(line, "flags", 5) == 0) break;
    if (strncmp(line, "flags", 5) != 0) line[0] = 0;
    fclose(f);
}

static void test_dispatch(void **state) {
    const struct sp_kernels *portable = sp_kernels_of(SP_KERNELS_PORTABLE);
    const struct sp_kernels *avx2 = sp_kernels_of(SP_KERNELS_AVX2);
    const struct sp_kernels *avx2f = sp_kernels_of(SP_KERNELS_AVX2F);
    const struct sp_kernels *avxvnni = sp_kernels_of(SP_KERNELS_AVXVNNI);
    const struct sp_kernels *avx512 = sp_kernels_of(SP_KERNELS_AVX512);
    const struct sp_kernels *amx = sp_kernels_of(SP_KERNELS_AMX);
    const struct sp_kernels *int16[] = {sp_kernels_of(SP_KERNELS_AVX2_INT16), sp_kernels_of(SP_KERNELS_AVXVNNI_INT16),
                                        sp_kernels_of(SP_KERNELS_AVX512_INT16), sp_kernels_of(SP_KERNELS_AMX_INT16)};
    assert_non_null(portable);
    assert_string_equal(portable->name, "portable");
    assert_int_equal(avx2f != NULL, avx2 != NULL);
    if (avxvnni || avx512) assert_non_null(avx2);  // both build on the avx2 code
    if (amx) assert_non_null(avx512);             // and amx on the avx512 code
    /* each x86 set comes with its -int16 variant */
    assert_int_equal(int16[0] != NULL, avx2 != NULL);
    assert_int_equal(int16[1] != NULL, avxvnni != NULL);
    assert_int_equal(int16[2] != NULL, avx512 != NULL);
    assert_int_equal(int16[3] != NULL, amx != NULL);
    const struct sp_kernels *best = amx ? amx : avx512 ? avx512 : avxvnni ? avxvnni : avx2 ? avx2 : portable;
    /* a set by name when this CPU runs it, else none */
    const struct {
        const char *name;
        const struct sp_kernels *set;
    } named[] = {{"portable", portable},           {"avx2", avx2},       {"avx2f", avx2f},
                 {"avxvnni", avxvnni},             {"avx512", avx512},   {"avx2-int16", int16[0]},
                 {"avxvnni-int16", int16[1]},      {"avx512-int16", int16[2]},
                 {"amx", amx},                     {"amx-int16", int16[3]}};
    for (size_t i = 0; i < sizeof named / sizeof *named; i++) {
        assert_ptr_equal(sp_kernels_by_name(named[i].name), named[i].set);
        if (named[i].set) assert_string_equal(named[i].set->name, named[i].name);
    }
    assert_null(sp_kernels_by_name(NULL));
    assert_null(sp_kernels_by_name(""));
    assert_null(sp_kernels_by_name("sse9"));
    assert_ptr_equal(sp_kernels_best(), best);
    assert_ptr_equal(sp_kernels_float(), avx2f ? avx2f : portable);
    /* the best unless told otherwise, whatever the environment says */
    assert_ptr_equal(sp_kernels(), best);
    assert_ptr_equal(sp_kernels_use(portable), best);
    assert_ptr_equal(sp_kernels(), portable);
    assert_ptr_equal(sp_kernels_use(NULL), portable);
    assert_ptr_equal(sp_kernels(), best);
    /* /proc/cpuinfo is an independent witness of what cpuid says */
    char line[8192];
    cpuinfo_flags(line, sizeof line);
    if (line[0]) {
        bool has_avx2 = has_flag(line, "avx2") && has_flag(line, "fma") && has_flag(line, "f16c");
        assert_int_equal(avx2 != NULL, has_avx2);
        assert_int_equal(avxvnni != NULL, has_avx2 && has_flag(line, "avx_vnni"));
        bool has_avx512 = has_flag(line, "avx512f") && has_flag(line, "avx512dq") && has_flag(line, "avx512bw") &&
                          has_flag(line, "avx512vl") && has_flag(line, "avx512_vnni");
        assert_int_equal(avx512 != NULL, has_avx2 && has_avx512);
        /* the OS may still refuse tiles: amx needs the flags, not the reverse */
        if (amx) assert_true(has_avx512 && has_flag(line, "amx_tile") && has_flag(line, "amx_int8"));
        printf("# amx: %s\n", amx ? "used" : has_avx512 && has_flag(line, "amx_int8") ? "refused by the OS" : "not on this CPU");
    }
}

/* The linear layer over a 2-thread pool with a bias, whichever set runs:
 * a small matrix (split evenly) and one of 4 x SP_LINEAR_CHUNK_MIN_BYTES
 * or more (taken in chunks by up to 4 tokens). */
static void test_linear_apply(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 5);
    struct sp_pool *pool;
    assert_int_equal(sp_pool_create(2, &pool), SP_OK);
    const int64_t ns[] = {1, 3, 17}, shapes[][2] = {{301, 256}, {4099, 1024}};
    for (int fmt = 0; fmt < 2; fmt++)
        for (int sh = 0; sh < 2; sh++) {
            int64_t rows = shapes[sh][0], cols = shapes[sh][1];
            struct mat M;
            mat_make(&M, fmt ? SP_QTYPE_MXFP4 : SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16, rows, cols, &rng);
            float *bias = malloc((size_t)rows * sizeof *bias);
            for (int64_t r = 0; r < rows; r++) bias[r] = sp_rng_normal(&rng);
            struct sp_linear l = {.w = M.m, .bias = bias, .bias_dtype = SP_DTYPE_F32};
            assert_true(sh == 0 || sp_linear_bytes(&l) >= 4 * SP_LINEAR_CHUNK_MIN_BYTES);
            assert_int_equal(sp_pool_reserve(pool, sp_linear_scratch_bytes(&l)), SP_OK);
            for (size_t c = 0; c < 3; c++) {
                int64_t n = ns[c];
                float *x = malloc((size_t)(n * cols) * sizeof *x), *y = malloc((size_t)(n * rows) * sizeof *y);
                for (int64_t i = 0; i < n * cols; i++) x[i] = sp_rng_normal(&rng);
                sp_linear_apply(&l, x, cols, y, rows, n, pool);
                for (int64_t t = 0; t < n; t++)
                    for (int64_t r = 0; r < rows; r++) y[t * rows + r] -= bias[r];
                int64_t br, bt;
                assert_true(worst_ratio(&M.m, x, cols, n, y, rows, acts_of(sp_kernels(), &M.m), &br, &bt) <= 1.0);
                free(x);
                free(y);
            }
            free(bias);
            mat_free(&M);
        }
    sp_pool_free(pool);
}

/* Chunks: whole rounds of nth, each of SP_LINEAR_CHUNK_MIN_BYTES or more,
 * at most SP_LINEAR_CHUNKS per thread, a multiple of 8 rows; 0 (an even
 * split) for one thread, more than SP_LINEAR_CHUNK_MAX_TOKENS tokens or
 * too few bytes for two rounds. */
static void test_linear_chunk(void **state) {
    const double row = 1152.0;  // affine4-g64 bf16, 2048 columns
    assert_int_equal(sp_linear_chunk(512, row, 1, 2), 0);          // 0.6 MB: one round
    assert_int_equal(sp_linear_chunk(4096, row, 1, 2), 512);       // 4.7 MB: 8 chunks
    assert_int_equal(sp_linear_chunk(151936, row, 1, 2), 9496);    // 16, the most for 2 threads
    assert_int_equal(sp_linear_chunk(151936, row, 4, 4), 4752);    // 32 for 4 threads
    assert_int_equal(sp_linear_chunk(151936, row, 5, 2), 0);       // more tokens
    assert_int_equal(sp_linear_chunk(151936, row, 1, 1), 0);       // one thread
    for (int64_t units = 8; units < 200000; units = units * 3 + 5)
        for (int nth = 2; nth <= 8; nth *= 2) {
            int64_t chunk = sp_linear_chunk(units, row, 1, nth);
            if (!chunk) continue;
            int64_t chunks = (units + chunk - 1) / chunk;
            assert_true(chunk % 8 == 0 && chunks >= nth && chunks <= nth * SP_LINEAR_CHUNKS);
            assert_true((double)chunk * row >= SP_LINEAR_CHUNK_MIN_BYTES);
        }
}

static int report(void **state) {
    for (int i = 0; i < SP_KERNELS_ISA_COUNT; i++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)i);
        if (!k) continue;
        printf("# %s: worst error %.3g x TOL_MATMUL (%g)", k->name, worst_seen[i][ACTS_FLOAT], TOL_MATMUL);
        if (worst_seen[i][ACTS_INT16] > 0)
            printf(", int16-activation products %.3g x TOL_Q16 (%g)", worst_seen[i][ACTS_INT16], TOL_Q16);
        if (worst_seen[i][ACTS_INT8] > 0)
            printf(", int8-activation products %.3g x the allowed (%g sigma)", worst_seen[i][ACTS_INT8], Q8_SIGMAS);
        if (worst_seen[i][ACTS_BF16] > 0)
            printf(", bf16-activation products %.3g x the allowed (%g sigma)", worst_seen[i][ACTS_BF16], Q8_SIGMAS);
        printf("\n");
    }
    printf("# active set: %s\n", sp_kernels()->name);
    return 0;
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_checker_catches_errors),
        cmocka_unit_test(test_dispatch),
        cmocka_unit_test(test_dot_axpy),
        cmocka_unit_test(test_attention_blocks),
        cmocka_unit_test(test_glu),
        cmocka_unit_test(test_softmax_chunk),
        cmocka_unit_test(test_plain_formats),
        cmocka_unit_test(test_affine4),
        cmocka_unit_test(test_affine8),
        cmocka_unit_test(test_affine_packed),
        cmocka_unit_test(test_mxfp4),
        cmocka_unit_test(test_other_formats),
        cmocka_unit_test(test_block_decoders_exact),
        cmocka_unit_test(test_linear_apply),
        cmocka_unit_test(test_linear_chunk),
        cmocka_unit_test(test_int8_extremes),
        cmocka_unit_test(test_block_int8_extremes),
        cmocka_unit_test(test_mx4_wide_runs),
        cmocka_unit_test(test_batch_invariance),
        cmocka_unit_test(test_matmul_pair),
        cmocka_unit_test(test_vocab_reductions),
        cmocka_unit_test(test_vnni_sets_match_avx2),
        cmocka_unit_test(test_interleaved_rows),
    };
    return cmocka_run_group_tests(tests, NULL, report);
}
