/*
 * matvec_avx2.c - the AVX2 + FMA + F16C kernel set (see kernels.h). Built
 * with -mavx2 -mfma -mf16c (the Makefile gives those flags to *_avx2.c files
 * only) and called only after cpuid said yes.
 *
 * Two products of packed weight rows with a batch of n activation vectors:
 *
 * - fused (decode, n < BLOCK_MIN_TOKENS): each 8-element piece of a row is
 *   decoded from its packed form straight into a register and multiplied
 *   into the accumulators of up to 4 tokens, so a row is read from memory
 *   once and decoded once per 4 tokens, with no float copy of the row.
 *   Memory-bound: the goal is to decode faster than DRAM delivers.
 * - blocked (prefill, n >= BLOCK_MIN_TOKENS): 4 rows x 512 columns are
 *   decoded into a small float buffer (L1), then a 4-row x 3-token register
 *   micro-kernel runs over every token. 12 FMAs per 7 loads keeps it
 *   compute-bound; each weight element is decoded once per call, and the
 *   512-column slice of the activations stays in L2 across row blocks.
 *
 * Formats with a fast path: F32, BF16, F16, affine 4 and 8 bit (any group,
 * scales and biases in F32, BF16 or F16) and mxfp4. Others use the portable
 * product. Activations stay in float (no int8 quantization), so results
 * differ from the reference only by summation order and FMA rounding.
 */
#include "kernels/cpu/kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <string.h>

#include "core/half.h"

#define ALWAYS static inline __attribute__((always_inline))

/* At or above this many tokens the blocked product is faster than
 * re-decoding each row per 4 tokens (measured with bench/kernels). */
#define BLOCK_MIN_TOKENS 8
#define MR SP_KERNELS_BLOCK_ROWS
#define KC SP_KERNELS_BLOCK_COLS
#define NR 3
/* Rows decoded together in the fused product when n > 4: their packed
 * bytes stay in L1/L2 while each group of 4 tokens passes over them. */
#define FUSED_ROW_CHUNK 8

enum fmt { FMT_F32, FMT_BF16, FMT_F16, FMT_A4, FMT_A8, FMT_MX4 };

ALWAYS bool fmt_grouped(int fmt) { return fmt >= FMT_A4; }

ALWAYS float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* Scale (or bias) g of a row, as a float, in any of the three dtypes. */
ALWAYS float load_scale(int sdt, const uint8_t *p, int64_t g) {
    if (sdt == SP_DTYPE_F32) {
        float f;
        memcpy(&f, p + 4 * g, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * g, 2);
    return sdt == SP_DTYPE_BF16 ? sp_bf16_to_f32(h) : _cvtsh_ss(h);
}

/* E8M0 scale byte -> 2^(s-127) by building the float's bits: the exponent
 * field is s itself; s = 0 is the subnormal 2^-127 and s = 255 gives +inf,
 * as sp_e8m0_to_float does. */
ALWAYS float e8m0(uint8_t s) { return sp_bits_f32(s ? (uint32_t)s << 23 : 0x00400000u); }

/* Per-group multipliers: affine w = q * s + b, mxfp4 w = e2m1(q) * s. */
ALWAYS void group_params(int fmt, int sdt, const uint8_t *sc, const uint8_t *bi, int64_t g, __m256 *s, __m256 *b) {
    if (fmt == FMT_MX4) {
        *s = _mm256_set1_ps(e8m0(sc[g]));
    } else if (fmt == FMT_A4 || fmt == FMT_A8) {
        *s = _mm256_set1_ps(load_scale(sdt, sc, g));
        *b = _mm256_set1_ps(load_scale(sdt, bi, g));
    }
}

/* Decodes the 8 weights of a row starting at element k (k a multiple of 8)
 * into one register of floats. */
ALWAYS __m256 decode8(int fmt, const uint8_t *c, int64_t k, __m256 s, __m256 b) {
    /* 4-bit codes: 8 of them are one little-endian 32-bit word, element i in
     * bits 4i..4i+3. Broadcasting the word and shifting lane i right by 4i
     * (vpsrlvd) puts code i at the bottom of lane i. */
    const __m256i shift4 = _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28);
    switch (fmt) {
    case FMT_F32:
        return _mm256_loadu_ps((const float *)(const void *)(c + 4 * k));
    case FMT_BF16: {
        /* bf16 is the top half of an f32: widen to 32 bits and shift up */
        __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(c + 2 * k));
        return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
    case FMT_F16:
        return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(const void *)(c + 2 * k)));
    case FMT_A4: {
        uint32_t u;
        memcpy(&u, c + k / 2, 4);
        __m256i q = _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32((int)u), shift4), _mm256_set1_epi32(0xf));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b);
    }
    case FMT_A8: {
        __m128i v = _mm_loadl_epi64((const __m128i *)(const void *)(c + k));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(v)), s, b);
    }
    default: {  // FMT_MX4
        /* E2M1 magnitudes by the low 3 bits of the code (vpermps reads only
         * bits 0-2 of each index, so the shifted word needs no mask); the
         * code's bit 3 is the sign, moved to bit 31 by a left shift of 28. */
        const __m256 mag = _mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f);
        uint32_t u;
        memcpy(&u, c + k / 2, 4);
        __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32((int)u), shift4);
        __m256i sign = _mm256_and_si256(_mm256_slli_epi32(idx, 28), _mm256_set1_epi32((int)0x80000000u));
        __m256 v = _mm256_xor_ps(_mm256_permutevar8x32_ps(mag, idx), _mm256_castsi256_ps(sign));
        return _mm256_mul_ps(v, s);
    }
    }
}

/* One weight of a plain-float row (tails of rows whose length is not a
 * multiple of 8). */
ALWAYS float load_plain(int fmt, const uint8_t *c, int64_t k) {
    if (fmt == FMT_F32) {
        float f;
        memcpy(&f, c + 4 * k, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, c + 2 * k, 2);
    return fmt == FMT_BF16 ? sp_bf16_to_f32(h) : _cvtsh_ss(h);
}

struct rowfmt {
    size_t row_bytes, scale_row_bytes;  // codes; scales (= biases) of one row
    int64_t cols, group, ng;
};

ALWAYS struct rowfmt rowfmt_of(const struct sp_qmat *w, int fmt, int sdt) {
    struct rowfmt f;
    f.cols = w->cols;
    f.row_bytes = sp_qtype_row_bytes(w->type, w->cols);
    f.group = fmt_grouped(fmt) ? w->group : w->cols;
    f.ng = fmt_grouped(fmt) ? w->cols / w->group : 1;
    f.scale_row_bytes = fmt == FMT_MX4 ? (size_t)f.ng : fmt_grouped(fmt) ? (size_t)f.ng * sp_dtype_size(sdt) : 0;
    return f;
}

/* ---- fused product: rows [r0, r1) with NT tokens (1 to 4) ---- */

/* Multiplies 4 decoded registers (32 weights at column k) into token t's
 * accumulators: 4 independent chains per token when NT <= 2 (FMA latency
 * would otherwise bound a single token), 2 chains for 3 or 4 tokens. */
ALWAYS void fma4(__m256 acc[4][4], int t, int nt, const __m256 wv[4], const float *xt) {
    const int A = nt <= 2 ? 4 : 2;
#pragma GCC unroll 4
    for (int j = 0; j < 4; j++) acc[t][j % A] = _mm256_fmadd_ps(wv[j], _mm256_loadu_ps(xt + 8 * j), acc[t][j % A]);
}

ALWAYS void fused_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int fmt, int sdt, int nt) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)r * f.row_bytes;
        const uint8_t *sc = fmt_grouped(fmt) ? (const uint8_t *)w->scales + (size_t)r * f.scale_row_bytes : NULL;
        const uint8_t *bi = fmt == FMT_A4 || fmt == FMT_A8 ? (const uint8_t *)w->biases + (size_t)r * f.scale_row_bytes : NULL;
        __m256 acc[4][4];
        float tail[4] = {0};
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++)
#pragma GCC unroll 4
            for (int j = 0; j < 4; j++) acc[t][j] = _mm256_setzero_ps();
        __m256 s = _mm256_setzero_ps(), b = _mm256_setzero_ps();
        int64_t k = 0;
        for (int64_t g = 0; g < f.ng; g++) {
            group_params(fmt, sdt, sc, bi, g, &s, &b);
            /* quantized groups are whole multiples of 32; a plain row is one
             * "group" whose last < 32 columns are handled below */
            int64_t end = fmt_grouped(fmt) ? k + f.group : f.cols - 31;
            for (; k < end; k += 32) {
                __m256 wv[4];
#pragma GCC unroll 4
                for (int j = 0; j < 4; j++) wv[j] = decode8(fmt, c, k + 8 * j, s, b);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) fma4(acc, t, nt, wv, x + t * ldx + k);
            }
        }
        if (!fmt_grouped(fmt)) {
            for (; k + 8 <= f.cols; k += 8) {
                __m256 wv = decode8(fmt, c, k, s, b);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) acc[t][0] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * ldx + k), acc[t][0]);
            }
            for (; k < f.cols; k++) {
                float wk = load_plain(fmt, c, k);
#pragma GCC unroll 4
                for (int t = 0; t < nt; t++) tail[t] += wk * x[t * ldx + k];
            }
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256 sum = _mm256_add_ps(_mm256_add_ps(acc[t][0], acc[t][1]), _mm256_add_ps(acc[t][2], acc[t][3]));
            y[t * ldy + r] = hsum(sum) + tail[t];
        }
    }
}

/* ---- blocked product ---- */

/* Decodes columns [k0, k0 + kn) of row r into out (k0 a multiple of the
 * group; kn a whole number of groups for quantized formats). */
ALWAYS void dequant_cols(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out, int fmt, int sdt) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)r * f.row_bytes;
    __m256 s = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    int64_t k = k0, end = k0 + kn;
    if (fmt_grouped(fmt)) {
        const uint8_t *sc = (const uint8_t *)w->scales + (size_t)r * f.scale_row_bytes;
        const uint8_t *bi = fmt == FMT_MX4 ? NULL : (const uint8_t *)w->biases + (size_t)r * f.scale_row_bytes;
        for (; k < end;) {
            group_params(fmt, sdt, sc, bi, k / f.group, &s, &b);
            for (int64_t ge = k + f.group; k < ge; k += 8) _mm256_storeu_ps(out + (k - k0), decode8(fmt, c, k, s, b));
        }
        return;
    }
    for (; k + 8 <= end; k += 8) _mm256_storeu_ps(out + (k - k0), decode8(fmt, c, k, s, b));
    for (; k < end; k++) out[k - k0] = load_plain(fmt, c, k);
}

/* y[j * ldy + i] += (row i of wb) . (x + j * ldx) over kn columns, for
 * i < mr rows of the decoded block (KC floats apart) and j < nr tokens. */
ALWAYS void micro(const float *wb, const float *x, int64_t ldx, int64_t kn, float *y, int64_t ldy, int mr, int nr) {
    __m256 acc[MR][NR];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
    int64_t k = 0;
    for (; k + 8 <= kn; k += 8) {
        __m256 xv[NR];
#pragma GCC unroll 4
        for (int j = 0; j < nr; j++) xv[j] = _mm256_loadu_ps(x + j * ldx + k);
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++) {
            __m256 wv = _mm256_loadu_ps(wb + i * KC + k);
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) acc[i][j] = _mm256_fmadd_ps(wv, xv[j], acc[i][j]);
        }
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) {
            float sum = hsum(acc[i][j]);
            for (int64_t kk = k; kk < kn; kk++) sum += wb[i * KC + kk] * x[j * ldx + kk];
            y[j * ldy + i] += sum;
        }
}

typedef void (*micro_fn)(const float *wb, const float *x, int64_t ldx, int64_t kn, float *y, int64_t ldy);
#define MICRO(M, N)                                                                                            \
    static void micro_##M##x##N(const float *wb, const float *x, int64_t ldx, int64_t kn, float *y, int64_t ldy) { \
        micro(wb, x, ldx, kn, y, ldy, M, N);                                                                   \
    }
MICRO(1, 1)
MICRO(1, 2)
MICRO(1, 3)
MICRO(2, 1)
MICRO(2, 2)
MICRO(2, 3)
MICRO(3, 1)
MICRO(3, 2)
MICRO(3, 3)
MICRO(4, 1)
MICRO(4, 2)
MICRO(4, 3)
static const micro_fn micros[MR][NR] = {
    {micro_1x1, micro_1x2, micro_1x3},
    {micro_2x1, micro_2x2, micro_2x3},
    {micro_3x1, micro_3x2, micro_3x3},
    {micro_4x1, micro_4x2, micro_4x3},
};

typedef void (*dequant_fn)(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out);

/* Column slices outermost: the KC-wide slice of every token's activations
 * is reused by all row blocks while it sits in L2. */
static void blocked_rows(const struct sp_qmat *w, dequant_fn dq, int64_t r0, int64_t r1, const float *x,
                         int64_t ldx, int64_t n, float *y, int64_t ldy, float *buf) {
    for (int64_t t = 0; t < n; t++) memset(y + t * ldy + r0, 0, (size_t)(r1 - r0) * sizeof(float));
    for (int64_t k0 = 0; k0 < w->cols; k0 += KC) {
        int64_t kn = w->cols - k0 < KC ? w->cols - k0 : KC;
        for (int64_t rb = r0; rb < r1; rb += MR) {
            int mr = r1 - rb < MR ? (int)(r1 - rb) : MR;
            for (int i = 0; i < mr; i++) dq(w, rb + i, k0, kn, buf + i * KC);
            for (int64_t t = 0; t < n; t += NR) {
                int nr = n - t < NR ? (int)(n - t) : NR;
                micros[mr - 1][nr - 1](buf, x + t * ldx + k0, ldx, kn, y + t * ldy + rb, ldy);
            }
        }
    }
}

/* ---- one instantiation per (format, scale dtype) ---- */

typedef void (*fused_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y,
                         int64_t ldy);
struct impl {
    fused_fn fused[4];  // 1 to 4 tokens
    dequant_fn dequant;
};

#define IMPL(ID, FMT, SDT)                                                                                        \
    static void fused1_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y, \
                            int64_t ldy) {                                                                      \
        fused_rows(w, r0, r1, x, ldx, y, ldy, FMT, SDT, 1);                                                     \
    }                                                                                                           \
    static void fused2_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y, \
                            int64_t ldy) {                                                                      \
        fused_rows(w, r0, r1, x, ldx, y, ldy, FMT, SDT, 2);                                                     \
    }                                                                                                           \
    static void fused3_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y, \
                            int64_t ldy) {                                                                      \
        fused_rows(w, r0, r1, x, ldx, y, ldy, FMT, SDT, 3);                                                     \
    }                                                                                                           \
    static void fused4_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y, \
                            int64_t ldy) {                                                                      \
        fused_rows(w, r0, r1, x, ldx, y, ldy, FMT, SDT, 4);                                                     \
    }                                                                                                           \
    static void dequant_##ID(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {          \
        dequant_cols(w, r, k0, kn, out, FMT, SDT);                                                              \
    }                                                                                                           \
    static const struct impl impl_##ID = {{fused1_##ID, fused2_##ID, fused3_##ID, fused4_##ID}, dequant_##ID};

IMPL(f32, FMT_F32, SP_DTYPE_F32)
IMPL(bf16, FMT_BF16, SP_DTYPE_F32)
IMPL(f16, FMT_F16, SP_DTYPE_F32)
IMPL(a4_f32, FMT_A4, SP_DTYPE_F32)
IMPL(a4_bf16, FMT_A4, SP_DTYPE_BF16)
IMPL(a4_f16, FMT_A4, SP_DTYPE_F16)
IMPL(a8_f32, FMT_A8, SP_DTYPE_F32)
IMPL(a8_bf16, FMT_A8, SP_DTYPE_BF16)
IMPL(a8_f16, FMT_A8, SP_DTYPE_F16)
IMPL(mx4, FMT_MX4, SP_DTYPE_U8)

/* The fast path for w, or NULL when the portable product must serve. */
static const struct impl *impl_for(const struct sp_qmat *w) {
    const struct impl *const affine4[] = {&impl_a4_f32, &impl_a4_bf16, &impl_a4_f16};
    const struct impl *const affine8[] = {&impl_a8_f32, &impl_a8_bf16, &impl_a8_f16};
    int si = w->scale_dtype == SP_DTYPE_F32 ? 0 : w->scale_dtype == SP_DTYPE_BF16 ? 1 : w->scale_dtype == SP_DTYPE_F16 ? 2 : -1;
    switch (w->type) {
    case SP_QTYPE_F32:
        return &impl_f32;
    case SP_QTYPE_BF16:
        return &impl_bf16;
    case SP_QTYPE_F16:
        return &impl_f16;
    case SP_QTYPE_AFFINE4:
        return si >= 0 && w->group % 32 == 0 ? affine4[si] : NULL;
    case SP_QTYPE_AFFINE8:
        return si >= 0 && w->group % 32 == 0 ? affine8[si] : NULL;
    case SP_QTYPE_MXFP4:
        return w->group == 32 ? &impl_mx4 : NULL;
    default:
        return NULL;
    }
}

static void matmul_rows_avx2(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx,
                             int64_t n, float *y, int64_t ldy, void *scratch) {
    const struct impl *im = impl_for(w);
    if (!im) {
        sp_matmul_rows_portable(w, r0, r1, x, ldx, n, y, ldy, scratch);
        return;
    }
    if (n >= BLOCK_MIN_TOKENS) {
        blocked_rows(w, im->dequant, r0, r1, x, ldx, n, y, ldy, scratch);
        return;
    }
    if (n <= 4) {
        if (n > 0) im->fused[n - 1](w, r0, r1, x, ldx, y, ldy);
        return;
    }
    /* 5 to 7 tokens: groups of 4 pass over a few rows while they are cached */
    for (int64_t r = r0; r < r1; r += FUSED_ROW_CHUNK) {
        int64_t re = r1 - r < FUSED_ROW_CHUNK ? r1 : r + FUSED_ROW_CHUNK;
        for (int64_t t = 0; t < n; t += 4) {
            int64_t nt = n - t < 4 ? n - t : 4;
            im->fused[nt - 1](w, r, re, x + t * ldx, ldx, y + t * ldy, ldy);
        }
    }
}

static float dot_avx2(const float *a, const float *b, int64_t n) {
    __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps(), s2 = _mm256_setzero_ps(), s3 = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 32 <= n; i += 32) {
        s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
        s1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), s1);
        s2 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 16), _mm256_loadu_ps(b + i + 16), s2);
        s3 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 24), _mm256_loadu_ps(b + i + 24), s3);
    }
    for (; i + 8 <= n; i += 8) s0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), s0);
    float r = hsum(_mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3)));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static void axpy_avx2(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static const struct sp_kernels avx2 = {
    .isa = SP_KERNELS_AVX2,
    .name = "avx2",
    .matmul_rows = matmul_rows_avx2,
    .dot = dot_avx2,
    .axpy = axpy_avx2,
};

const struct sp_kernels *sp_kernels_avx2_set(void) { return &avx2; }

#endif
