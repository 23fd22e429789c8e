/*
 * qtype.c - the weight-format traits table and the scalar reference
 * dequantize / dot / quantize for each format. Rules follow mlx exactly;
 * ../shared/specs/mlx-quant-format.md cites the lines they come from.
 */
#include "quant/qtype.h"

#include <math.h>
#include <string.h>

#include "core/half.h"

/* ---- element codecs ---- */

const float sp_e2m1_values[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                  -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};

float sp_e8m0_to_float(uint8_t s) {
    if (s == 255) return INFINITY;
    return ldexpf(1.0f, (int)s - 127);
}

float sp_e4m3_to_float(uint8_t x) {
    int exp = (x >> 3) & 0xf, man = x & 7;
    float v = exp ? ldexpf(1.0f + (float)man / 8.0f, exp - 7) : ldexpf((float)man / 8.0f, -6);
    return (x & 0x80) ? -v : v;
}

uint8_t sp_float_to_e4m3(float v) {
    uint8_t sign = signbit(v) ? 0x80 : 0;
    float a = fabsf(v);
    if (isnan(v)) return 0x7f;
    if (a >= 448.0f) return sign | 0x7e;
    int e;
    frexpf(a, &e);  // a = f * 2^e, f in [0.5, 1)
    int E = e - 1;
    if (a == 0.0f) return sign;
    if (E < -6) {
        /* subnormal: steps of 2^-9; 8 steps is the smallest normal (0x08) */
        float q = nearbyintf(ldexpf(a, 9));
        return sign | (uint8_t)q;
    }
    float m = ldexpf(a, -E);  // [1, 2)
    int mq = (int)nearbyintf((m - 1.0f) * 8.0f);
    if (mq == 8) {
        mq = 0;
        E++;
    }
    int bits = ((E + 7) << 3) | mq;
    if (bits > 0x7e) bits = 0x7e;
    return sign | (uint8_t)bits;
}

uint8_t sp_float_to_e2m1(float y) {
    float a = fabsf(y);
    /* Nearest E2M1 value with ties to the even code, as mlx's kernels do:
     * the count of midpoints below a, a midpoint counted when a reaches it
     * where it rounds up to an even code (0.75, 1.75, 3.5) and when a passes
     * it where it rounds down to one; NaN gives the largest code. Branch-free
     * (random weights mispredict a chain of branches). */
    int code = (a > 0.25f) + (a >= 0.75f) + (a > 1.25f) + (a >= 1.75f) + (a > 2.5f) + (a >= 3.5f) + (a > 5.0f);
    code += 7 * (a != a);
    return (uint8_t)(signbit(y) ? code | 8 : code);
}

uint8_t sp_float_to_e8m0(float x) {
    if (!(x > 0.0f)) return 127;
    float l = nearbyintf(log2f(x));
    if (l < -127.0f) l = -127.0f;
    if (l > 127.0f) l = 127.0f;
    return (uint8_t)((int)l + 127);
}

/* ---- where an element is ---- */

/* Byte `byte` of row `row`'s codes. */
static const uint8_t *code_at(const struct sp_qmat *m, int64_t row, int64_t byte) {
    size_t rb = sp_qtype_row_bytes(m->type, m->cols);
    if (!m->interleaved) return (const uint8_t *)m->codes + (size_t)row * rb + (size_t)byte;
    int64_t b = row / SP_QMAT_BLOCK_ROWS, i = row % SP_QMAT_BLOCK_ROWS;
    return (const uint8_t *)m->codes + (size_t)b * SP_QMAT_BLOCK_ROWS * rb + (size_t)(byte / 4 * 64 + i * 4 + byte % 4);
}

/* Element index of group g of row `row` in scales (and biases). */
static size_t group_at(const struct sp_qmat *m, int64_t row, int64_t g) {
    int64_t ng = m->cols / m->group;
    if (!m->interleaved) return (size_t)(row * ng + g);
    int64_t b = row / SP_QMAT_BLOCK_ROWS, i = row % SP_QMAT_BLOCK_ROWS;
    return (size_t)((b * ng + g) * SP_QMAT_BLOCK_ROWS + i);
}

/* ---- plain floats ---- */

static void dequant_float(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    enum sp_dtype dt = m->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : m->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
    const uint8_t *r = (const uint8_t *)m->codes + (size_t)row * sp_qtype_row_bytes(m->type, m->cols);
    for (int64_t i = 0; i < n; i++) out[i] = sp_dtype_load_float(dt, r, (size_t)(c0 + i));
}

static void quantize_float(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                           enum sp_dtype sdt, enum sp_dtype dt) {
    for (int64_t i = 0; i < n; i++) sp_dtype_store_float(dt, codes, (size_t)i, x[i]);
}

static void quantize_f32(const float *x, int64_t n, int group, void *c, void *s, void *b, enum sp_dtype sdt) {
    quantize_float(x, n, group, c, s, b, sdt, SP_DTYPE_F32);
}
static void quantize_f16(const float *x, int64_t n, int group, void *c, void *s, void *b, enum sp_dtype sdt) {
    quantize_float(x, n, group, c, s, b, sdt, SP_DTYPE_F16);
}
static void quantize_bf16(const float *x, int64_t n, int group, void *c, void *s, void *b, enum sp_dtype sdt) {
    quantize_float(x, n, group, c, s, b, sdt, SP_DTYPE_BF16);
}

/* ---- MLX affine ---- */

static void dequant_affine(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    int bits = sp_qtype_traits(m->type)->bits;
    for (int64_t i = c0; i < c0 + n; i++) {
        size_t g = group_at(m, row, i / m->group);
        float s = sp_dtype_load_float(m->scale_dtype, m->scales, g);
        float b = sp_dtype_load_float(m->scale_dtype, m->biases, g);
        /* 4-bit codes by their byte (any layout), wider ones from the row */
        uint32_t q = bits == 4 ? (uint32_t)(*code_at(m, row, i >> 1) >> ((i & 1) * 4)) & 0xfu
                               : sp_unpack_bits(code_at(m, row, 0), i, bits);
        out[i - c0] = s * (float)q + b;
    }
}

/* Writes code q of element i into an LSB-first bit stream. */
static void pack_bits(uint8_t *row, int64_t i, int b, uint32_t q) {
    for (int k = 0; k < b; k++) {
        uint64_t bit = (uint64_t)i * (uint64_t)b + (uint64_t)k;
        row[bit >> 3] |= (uint8_t)(((q >> k) & 1u) << (bit & 7));  // no branch on random bits
    }
}

static void quantize_affine_bits(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                                 enum sp_dtype sdt, int bits) {
    const float n_bins = (float)((1 << bits) - 1), eps = 1e-7f;
    memset(codes, 0, (size_t)(n * bits / 8));
    for (int64_t g = 0; g < n / group; g++) {
        const float *w = x + g * group;
        float w_max = w[0], w_min = w[0];
        for (int i = 1; i < group; i++) {
            if (w[i] > w_max) w_max = w[i];
            if (w[i] < w_min) w_min = w[i];
        }
        bool side = fabsf(w_min) > fabsf(w_max);
        float scale = fmaxf((w_max - w_min) / n_bins, eps);
        scale = side ? scale : -scale;
        float edge = side ? w_min : w_max;
        float q0 = nearbyintf(edge / scale);
        float bias = 0.0f;
        if (q0 != 0.0f) {
            scale = edge / q0;
            bias = edge;
        }
        for (int i = 0; i < group; i++) {
            float q = nearbyintf((w[i] - bias) / scale);
            q = q > 0.0f ? q : 0.0f;  // fmaxf and fminf's answers, NaN to 0
            q = q < n_bins ? q : n_bins;
            pack_bits(codes, g * group + i, bits, (uint32_t)q);
        }
        sp_dtype_store_float(sdt, scales, (size_t)g, scale);
        sp_dtype_store_float(sdt, biases, (size_t)g, bias);
    }
}

#define AFFINE_QUANTIZER(B)                                                                                    \
    static void quantize_affine##B(const float *x, int64_t n, int group, void *c, void *s, void *b,           \
                                   enum sp_dtype sdt) {                                                        \
        quantize_affine_bits(x, n, group, c, s, b, sdt, B);                                                   \
    }
AFFINE_QUANTIZER(2)
AFFINE_QUANTIZER(3)
AFFINE_QUANTIZER(4)
AFFINE_QUANTIZER(5)
AFFINE_QUANTIZER(6)
AFFINE_QUANTIZER(8)

/* ---- microscaling: mxfp4, mxfp8, nvfp4 ---- */

static float fp_scale(const struct sp_qmat *m, int64_t row, int64_t g) {
    uint8_t s = ((const uint8_t *)m->scales)[group_at(m, row, g)];
    return m->type == SP_QTYPE_NVFP4 ? sp_e4m3_to_float(s) : sp_e8m0_to_float(s);
}

static void dequant_fp4(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    for (int64_t i = c0; i < c0 + n; i++) {
        uint8_t q = (*code_at(m, row, i >> 1) >> ((i & 1) * 4)) & 0xf;
        out[i - c0] = sp_e2m1_values[q] * fp_scale(m, row, i / m->group);
    }
}

static void dequant_fp8(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    const uint8_t *r = (const uint8_t *)m->codes + (size_t)row * sp_qtype_row_bytes(m->type, m->cols);
    for (int64_t i = c0; i < c0 + n; i++) out[i - c0] = sp_e4m3_to_float(r[i]) * fp_scale(m, row, i / m->group);
}

/* ---- ggml's block formats ---- */

/* For each of `runs` runs of len values of x, its max |x| / per into
 * sub[]; returns the largest of those (a block's scales of scales). */
static float run_scales(const float *x, int runs, int len, float per, float *sub) {
    float top = 0.0f;
    for (int i = 0; i < runs; i++) {
        float amax = 0.0f;
        for (int j = 0; j < len; j++) amax = fmaxf(amax, fabsf(x[len * i + j]));
        sub[i] = amax / per;
        top = fmaxf(top, sub[i]);
    }
    return top;
}

/* Q6_K, a block of 256: ql[128] (each code's low 4 bits), qh[64] (its high
 * 2), int8 scales[16] (one a 16 elements), f16 d; code u of element e
 * stands for d x scale[e / 16] x (u - 32), computed in that order as ggml's
 * reference does. Each 128 elements take 64 bytes of ql and 32 of qh:
 * element l + 32 k (l < 32, k < 4) has its low bits in the low (k < 2) or
 * high (k >= 2) nibble of ql[l + 32 (k % 2)] and its high bits at bit 2 k
 * of qh[l]. */
#define Q6K_BYTES 210

static void q6_k_block(const uint8_t *restrict b, float *restrict y) {
    uint16_t dh;
    memcpy(&dh, b + 208, 2);
    float d = sp_f16_to_f32(dh), ds[16];
    for (int j = 0; j < 16; j++) ds[j] = d * (float)(int8_t)b[192 + j];
    for (int h = 0; h < 2; h++, y += 128) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        const float *s = ds + 8 * h;
        for (int l0 = 0; l0 < 32; l0 += 16)  // runs of 16 share their scales
            for (int l = l0; l < l0 + 16; l++) {
                int j = l0 / 16;
                y[l] = s[j] * (float)((int)((ql[l] & 15u) | (qh[l] & 3u) << 4) - 32);
                y[l + 32] = s[j + 2] * (float)((int)((ql[l + 32] & 15u) | (qh[l] >> 2 & 3u) << 4) - 32);
                y[l + 64] = s[j + 4] * (float)((int)((ql[l] >> 4) | (qh[l] >> 4 & 3u) << 4) - 32);
                y[l + 96] = s[j + 6] * (float)((int)((ql[l + 32] >> 4) | (qh[l] >> 6 & 3u) << 4) - 32);
            }
    }
}

/* Q2_K, a block of 256: 16 bytes of 4-bit scales (low nibble) and mins
 * (high), qs[64] (2-bit codes), f16 d and dmin; element e has scale byte
 * e / 16 and its code in bits 2 k of qs[32 (e / 128) + e % 32] (k = e %
 * 128 / 32), and stands for d sc q - dmin m, computed as (d sc) q - dmin m
 * as ggml's reference does. */
static void q2_k_block(const uint8_t *restrict b, float *restrict y) {
    uint16_t dh, mh;
    memcpy(&dh, b + 80, 2);
    memcpy(&mh, b + 82, 2);
    float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh);
    for (int e = 0; e < 256; e++) {
        uint8_t sc = b[e / 16];
        int q = b[16 + 32 * (e / 128) + e % 32] >> (2 * (e % 128 / 32)) & 3;
        y[e] = d * (float)(sc & 15u) * (float)q - dmin * (float)(sc >> 4);
    }
}

/* Q3_K, a block of 256: hmask[32] (each code's high bit), qs[64] (its low
 * 2 bits), 12 bytes of 6-bit scales, f16 d; element e (k = e % 128 / 32)
 * has its low bits as Q2_K's, its high bit at bit 4 (e / 128) + k of
 * hmask[e % 32], and scale e / 16: code q stands for d (s - 32) (q - 4),
 * or (q - 0) where the high bit is set. Scale j's low 4 bits are the low
 * (j < 8) or high nibble of byte j % 8, its high 2 bits bits 2 (j / 4) of
 * byte 8 + j % 4. */
static int q3_k_scale(const uint8_t *block, int j) {
    const uint8_t *s = block + 96;
    int lo = j < 8 ? s[j] & 15 : s[j - 8] >> 4, hi = s[8 + j % 4] >> (2 * (j / 4)) & 3;
    return (lo | hi << 4) - 32;
}

static void q3_k_block(const uint8_t *restrict b, float *restrict y) {
    uint16_t dh;
    memcpy(&dh, b + 108, 2);
    float d = sp_f16_to_f32(dh);
    for (int e = 0; e < 256; e++) {
        int k = e % 128 / 32, q = b[32 + 32 * (e / 128) + e % 32] >> (2 * k) & 3;
        bool high = b[e % 32] >> (4 * (e / 128) + k) & 1;
        y[e] = d * (float)q3_k_scale(b, e / 16) * (float)(q - (high ? 0 : 4));
    }
}

/* Q4_K, a block of 256: f16 d and dmin, 12 bytes of 6-bit scales and
 * mins (k4_scale_min), qs[128]; element e is in group g = e / 32, its
 * code the low (g even) or high nibble of qs[32 (g / 2) + e % 32], and
 * stands for (d sc) q - (dmin m), in that order as ggml's reference
 * computes it. Q5_K, a block of 256: the same with qh[32] before qs, bit g
 * of qh[e % 32] the code's fifth bit. Scale and min j (0..7): for j < 4
 * the low 6 bits of bytes j and j + 4; else the low and high nibbles of
 * byte j + 4 with bits 6-7 of bytes j - 4 and j as their high 2 bits. */
static void k4_scale_min(const uint8_t *block, int j, int *sc, int *m) {
    const uint8_t *q = block + 4;
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 15) | (q[j - 4] >> 6) << 4;
        *m = (q[j + 4] >> 4) | (q[j] >> 6) << 4;
    }
}

static void k4_block(const uint8_t *restrict b, bool five, float *restrict y) {
    uint16_t dh, mh;
    memcpy(&dh, b, 2);
    memcpy(&mh, b + 2, 2);
    float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh);
    const uint8_t *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int g = 0; g < 8; g++) {
        int sc, m;
        k4_scale_min(b, g, &sc, &m);
        float d1 = d * (float)sc, m1 = dmin * (float)m;
        const uint8_t *q = qs + 32 * (g / 2);
        for (int l = 0; l < 32; l++) {
            int v = g % 2 ? q[l] >> 4 : q[l] & 15;
            if (five) v += (qh[l] >> g & 1) << 4;
            y[32 * g + l] = d1 * (float)v - m1;
        }
    }
}

static void q4_k_block(const uint8_t *restrict b, float *restrict y) { k4_block(b, false, y); }
static void q5_k_block(const uint8_t *restrict b, float *restrict y) { k4_block(b, true, y); }

/* IQ4_NL, a block of 32: f16 d, then 16 bytes of 4-bit codes (element j
 * in the low nibble of byte j, j + 16 in its high one) into a table of 16
 * values: d x value. IQ4_XS, a block of 256: f16 d, 2 bytes of the high
 * and 4 of the low bits of 8 6-bit scales (scale i: its low 4 bits in
 * nibble i % 2 of byte i / 2, its high 2 at bits 2 i of the 16), then 8
 * runs of 32 codes as IQ4_NL's: (d x (scale - 32)) x value. */
const int8_t sp_iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

static void iq4_codes(const uint8_t *restrict qs, float dl, float *restrict y) {
    for (int j = 0; j < 16; j++) {
        y[j] = dl * (float)sp_iq4_values[qs[j] & 15u];
        y[j + 16] = dl * (float)sp_iq4_values[qs[j] >> 4];
    }
}

static void iq4_nl_block(const uint8_t *restrict b, float *restrict y) {
    uint16_t dh;
    memcpy(&dh, b, 2);
    iq4_codes(b + 2, sp_f16_to_f32(dh), y);
}

static int iq4_xs_scale(const uint8_t *block, int i) {
    uint16_t h;
    memcpy(&h, block + 2, 2);
    return ((block[4 + i / 2] >> (4 * (i % 2)) & 15) | (h >> (2 * i) & 3) << 4) - 32;
}

static void iq4_xs_block(const uint8_t *restrict b, float *restrict y) {
    uint16_t dh;
    memcpy(&dh, b, 2);
    float d = sp_f16_to_f32(dh);
    for (int i = 0; i < 8; i++) iq4_codes(b + 8 + 16 * i, d * (float)iq4_xs_scale(b, i), y + 32 * i);
}

/* Columns [c0, c0 + n) of a row of blocks (c0 a block's start), through each block's decoder. */
static void dequant_blocks(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out,
                           void (*block)(const uint8_t *restrict, float *restrict)) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(m->type);
    size_t bb = (size_t)tr->block_bytes;
    int64_t be = tr->group;
    const uint8_t *r = (const uint8_t *)m->codes + (size_t)row * sp_qtype_row_bytes(m->type, m->cols);
    float y[256];
    for (int64_t b = c0 / be; b * be < c0 + n; b++) {
        block(r + (size_t)b * bb, y);
        int64_t from = b * be > c0 ? b * be : c0, to = (b + 1) * be < c0 + n ? (b + 1) * be : c0 + n;
        memcpy(out + (from - c0), y + (from - b * be), (size_t)(to - from) * sizeof *y);
    }
}

static void dequant_q2_k(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, q2_k_block);
}
static void dequant_q3_k(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, q3_k_block);
}
static void dequant_q4_k(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, q4_k_block);
}
static void dequant_q5_k(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, q5_k_block);
}
static void dequant_q6_k(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, q6_k_block);
}
static void dequant_iq4_nl(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, iq4_nl_block);
}
static void dequant_iq4_xs(const struct sp_qmat *m, int64_t row, int64_t c0, int64_t n, float *out) {
    dequant_blocks(m, row, c0, n, out, iq4_xs_block);
}

/* The code of the table value nearest v (ties to the lower). */
static uint8_t iq4_nearest(float v) {
    int best = 0;
    for (int i = 1; i < 16; i++)
        if (fabsf(v - (float)sp_iq4_values[i]) < fabsf(v - (float)sp_iq4_values[best])) best = i;
    return (uint8_t)best;
}

/* 32 values at step dl into IQ4_NL's 16 bytes of codes. */
static void iq4_pack(const float *x, float dl, uint8_t *qs) {
    for (int j = 0; j < 16; j++) {
        uint8_t lo = dl != 0.0f ? iq4_nearest(x[j] / dl) : 8, hi = dl != 0.0f ? iq4_nearest(x[j + 16] / dl) : 8;
        qs[j] = (uint8_t)(lo | hi << 4);
    }
}

/* Plain roundings into IQ4_NL and IQ4_XS (not ggml's searched ones), for
 * tests: a block's (IQ4_XS: each 32's) step max |x| / 127; IQ4_XS's 32s in
 * 31 steps of the largest. */
static void quantize_iq4_nl(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                            enum sp_dtype sdt) {
    for (int64_t b0 = 0; b0 < n; b0 += 32, x += 32) {
        uint8_t *b = (uint8_t *)codes + (size_t)(b0 / 32) * 18;
        float amax = 0.0f;
        for (int j = 0; j < 32; j++) amax = fmaxf(amax, fabsf(x[j]));
        uint16_t dh = sp_f32_to_f16(amax / 127.0f);
        memcpy(b, &dh, 2);
        iq4_pack(x, sp_f16_to_f32(dh), b + 2);
    }
}

static void quantize_iq4_xs(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                            enum sp_dtype sdt) {
    for (int64_t b0 = 0; b0 < n; b0 += 256, x += 256) {
        uint8_t *b = (uint8_t *)codes + (size_t)(b0 / 256) * 136;
        float sub[8], top = run_scales(x, 8, 32, 127.0f, sub);
        uint16_t dh = sp_f32_to_f16(top / 31.0f), h = 0;
        float d = sp_f16_to_f32(dh);
        memset(b, 0, 8);
        memcpy(b, &dh, 2);
        for (int i = 0; i < 8; i++) {
            int s = d > 0.0f ? (int)fminf(31.0f, rintf(sub[i] / d)) : 0, u = s + 32;
            b[4 + i / 2] |= (uint8_t)((u & 15) << (4 * (i % 2)));
            h |= (uint16_t)((u >> 4) << (2 * i));
            iq4_pack(x + 32 * i, d * (float)s, b + 8 + 16 * i);
        }
        memcpy(b + 2, &h, 2);
    }
}

/* Plain roundings into Q2_K and Q3_K (not ggml's searched ones), for
 * tests: Q2_K each 16's min and range over 3 steps, scales and mins in 15
 * steps of the block's largest; Q3_K a symmetric scale a 16 (max |x| / 4,
 * codes -4 .. 3), in 31 steps of the block's largest. */
static void quantize_q2_k(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                          enum sp_dtype sdt) {
    for (int64_t b0 = 0; b0 < n; b0 += 256, x += 256) {
        uint8_t *b = (uint8_t *)codes + (size_t)(b0 / 256) * 84;
        float step[16], lo[16], smax = 0.0f, mmax = 0.0f;
        for (int j = 0; j < 16; j++) {
            float mn = x[16 * j], mx = x[16 * j];
            for (int i = 1; i < 16; i++) mn = fminf(mn, x[16 * j + i]), mx = fmaxf(mx, x[16 * j + i]);
            lo[j] = fminf(mn, 0.0f);
            step[j] = (mx - lo[j]) / 3.0f;
            smax = fmaxf(smax, step[j]);
            mmax = fmaxf(mmax, -lo[j]);
        }
        uint16_t dh = sp_f32_to_f16(smax / 15.0f), mh = sp_f32_to_f16(mmax / 15.0f);
        float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh);
        memset(b + 16, 0, 64);
        for (int j = 0; j < 16; j++) {
            int sc = d > 0.0f ? (int)fminf(15.0f, rintf(step[j] / d)) : 0;
            int mi = dmin > 0.0f ? (int)fminf(15.0f, rintf(-lo[j] / dmin)) : 0;
            b[j] = (uint8_t)(sc | mi << 4);
            float dl = d * (float)sc, ml = dmin * (float)mi;
            for (int i = 0; i < 16; i++) {
                int e = 16 * j + i;
                float q = dl > 0.0f ? rintf((x[e] + ml) / dl) : 0.0f;
                int qi = q < 0.0f ? 0 : q > 3.0f ? 3 : (int)q;
                b[16 + 32 * (e / 128) + e % 32] |= (uint8_t)(qi << (2 * (e % 128 / 32)));
            }
        }
        memcpy(b + 80, &dh, 2);
        memcpy(b + 82, &mh, 2);
    }
}

static void quantize_q3_k(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                          enum sp_dtype sdt) {
    for (int64_t b0 = 0; b0 < n; b0 += 256, x += 256) {
        uint8_t *b = (uint8_t *)codes + (size_t)(b0 / 256) * 110;
        float sub[16], top = run_scales(x, 16, 16, 4.0f, sub);
        uint16_t dh = sp_f32_to_f16(top / 31.0f);
        float d = sp_f16_to_f32(dh);
        memset(b, 0, 108);
        for (int j = 0; j < 16; j++) {
            int s = d > 0.0f ? (int)fminf(31.0f, rintf(sub[j] / d)) : 0, u = s + 32;  // 6 bits
            b[96 + j % 8] |= (uint8_t)((u & 15) << (j < 8 ? 0 : 4));
            b[104 + j % 4] |= (uint8_t)((u >> 4) << (2 * (j / 4)));
            float dl = d * (float)s;
            for (int i = 0; i < 16; i++) {
                int e = 16 * j + i, k = e % 128 / 32;
                float q = dl > 0.0f ? rintf(x[e] / dl) : 0.0f;
                int qi = (q < -4.0f ? -4 : q > 3.0f ? 3 : (int)q) + 4;  // 0 .. 7: high bit set for q >= 0
                b[32 + 32 * (e / 128) + e % 32] |= (uint8_t)((qi & 3) << (2 * k));
                b[e % 32] |= (uint8_t)((qi >> 2) << (4 * (e / 128) + k));
            }
        }
        memcpy(b + 108, &dh, 2);
    }
}

/* Plain roundings into Q4_K and Q5_K (not ggml's searched ones), for
 * tests: each 32's min (at most 0) and range over 15 / 31 steps, the
 * steps and mins in 63 steps of the block's largest. */
static void quantize_k4(const float *x, int64_t n, bool five, uint8_t *codes) {
    int top = five ? 31 : 15, bytes = five ? 176 : 144;
    for (int64_t b0 = 0; b0 < n; b0 += 256, x += 256) {
        uint8_t *b = codes + (size_t)(b0 / 256) * (size_t)bytes, *qh = b + 16, *qs = b + (five ? 48 : 16);
        float step[8], lo[8], smax = 0.0f, mmax = 0.0f;
        for (int g = 0; g < 8; g++) {
            float mn = x[32 * g], mx = x[32 * g];
            for (int i = 1; i < 32; i++) mn = fminf(mn, x[32 * g + i]), mx = fmaxf(mx, x[32 * g + i]);
            lo[g] = fminf(mn, 0.0f);
            step[g] = (mx - lo[g]) / (float)top;
            smax = fmaxf(smax, step[g]);
            mmax = fmaxf(mmax, -lo[g]);
        }
        uint16_t dh = sp_f32_to_f16(smax / 63.0f), mh = sp_f32_to_f16(mmax / 63.0f);
        float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh);
        memset(b, 0, (size_t)bytes);
        memcpy(b, &dh, 2);
        memcpy(b + 2, &mh, 2);
        uint8_t *s12 = b + 4;
        for (int g = 0; g < 8; g++) {
            int sc = d > 0.0f ? (int)fminf(63.0f, rintf(step[g] / d)) : 0;
            int mi = dmin > 0.0f ? (int)fminf(63.0f, rintf(-lo[g] / dmin)) : 0;
            if (g < 4) {
                s12[g] |= (uint8_t)sc;
                s12[g + 4] |= (uint8_t)mi;
            } else {
                s12[g + 4] |= (uint8_t)((sc & 15) | (mi & 15) << 4);
                s12[g - 4] |= (uint8_t)((sc >> 4) << 6);
                s12[g] |= (uint8_t)((mi >> 4) << 6);
            }
            float d1 = d * (float)sc, m1 = dmin * (float)mi;
            for (int l = 0; l < 32; l++) {
                float q = d1 > 0.0f ? rintf((x[32 * g + l] + m1) / d1) : 0.0f;
                int v = q < 0.0f ? 0 : q > (float)top ? top : (int)q;
                qs[32 * (g / 2) + l] |= (uint8_t)((v & 15) << (4 * (g % 2)));
                if (five) qh[l] |= (uint8_t)((v >> 4) << g);
            }
        }
    }
}

static void quantize_q4_k(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                          enum sp_dtype sdt) {
    quantize_k4(x, n, false, codes);
}
static void quantize_q5_k(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                          enum sp_dtype sdt) {
    quantize_k4(x, n, true, codes);
}

/* A plain rounding into Q6_K (not ggml's searched one): each 16 elements'
 * scale max |x| / 31, the block's d the largest of those / 127. */
static void quantize_q6_k(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                          enum sp_dtype sdt) {
    for (int64_t b0 = 0; b0 < n; b0 += 256, x += 256) {
        uint8_t *b = (uint8_t *)codes + (size_t)(b0 / 256) * Q6K_BYTES, u[256];
        float sub[16], top = run_scales(x, 16, 16, 31.0f, sub);
        uint16_t dh = sp_f32_to_f16(top / 127.0f);
        float d = sp_f16_to_f32(dh);
        int8_t *sc = (int8_t *)(b + 192);
        for (int j = 0; j < 16; j++) {
            float s = d > 0.0f ? rintf(sub[j] / d) : 0.0f;
            sc[j] = (int8_t)(s > 127.0f ? 127.0f : s);
            float step = d * (float)sc[j];
            for (int i = 0; i < 16; i++) {
                float q = step > 0.0f ? rintf(x[16 * j + i] / step) : 0.0f;
                q = q < -32.0f ? -32.0f : q > 31.0f ? 31.0f : q;
                u[16 * j + i] = (uint8_t)((int)q + 32);
            }
        }
        memset(b, 0, 192);
        for (int h = 0; h < 2; h++)
            for (int l = 0; l < 32; l++)
                for (int k = 0; k < 4; k++) {
                    uint8_t v = u[128 * h + l + 32 * k];
                    b[64 * h + l + 32 * (k % 2)] |= (uint8_t)((v & 15u) << (4 * (k / 2)));
                    b[128 + 32 * h + l] |= (uint8_t)((v >> 4) << (2 * k));
                }
        memcpy(b + 208, &dh, 2);
    }
}

static float group_amax(const float *w, int group) {
    float a = 0.0f;
    for (int i = 0; i < group; i++) a = fabsf(w[i]) > a ? fabsf(w[i]) : a;  // fmaxf's answer, NaN passed over
    return a;
}

static void quantize_mxfp4(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                           enum sp_dtype sdt) {
    uint8_t *c = codes, *s = scales;
    memset(c, 0, (size_t)n / 2);
    for (int64_t g = 0; g < n / group; g++) {
        uint8_t e = sp_float_to_e8m0(group_amax(x + g * group, group) / 6.0f);
        s[g] = e;
        float inv = ldexpf(1.0f, 127 - (int)e);  // exact: a power of two
        for (int i = 0; i < group; i++) {
            int64_t k = g * group + i;
            c[k >> 1] |= (uint8_t)(sp_float_to_e2m1(x[k] * inv) << ((k & 1) * 4));
        }
    }
}

static void quantize_nvfp4(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                           enum sp_dtype sdt) {
    uint8_t *c = codes, *s = scales;
    memset(c, 0, (size_t)n / 2);
    for (int64_t g = 0; g < n / group; g++) {
        uint8_t e = sp_float_to_e4m3(group_amax(x + g * group, group) / 6.0f);
        s[g] = e;
        float sc = sp_e4m3_to_float(e);
        for (int i = 0; i < group; i++) {
            int64_t k = g * group + i;
            uint8_t q = sc > 0.0f ? sp_float_to_e2m1(x[k] / sc) : 0;
            c[k >> 1] |= (uint8_t)(q << ((k & 1) * 4));
        }
    }
}

static void quantize_mxfp8(const float *x, int64_t n, int group, void *codes, void *scales, void *biases,
                           enum sp_dtype sdt) {
    uint8_t *c = codes, *s = scales;
    for (int64_t g = 0; g < n / group; g++) {
        uint8_t e = sp_float_to_e8m0(group_amax(x + g * group, group) / 448.0f);
        s[g] = e;
        float inv = ldexpf(1.0f, 127 - (int)e);
        for (int i = 0; i < group; i++) c[g * group + i] = sp_float_to_e4m3(x[g * group + i] * inv);
    }
}

/* ---- the table ---- */

#define DEQ_F32 dequant_float
#define DEQ_F16 dequant_float
#define DEQ_BF16 dequant_float
#define DEQ_AFFINE2 dequant_affine
#define DEQ_AFFINE3 dequant_affine
#define DEQ_AFFINE4 dequant_affine
#define DEQ_AFFINE5 dequant_affine
#define DEQ_AFFINE6 dequant_affine
#define DEQ_AFFINE8 dequant_affine
#define DEQ_MXFP4 dequant_fp4
#define DEQ_MXFP8 dequant_fp8
#define DEQ_NVFP4 dequant_fp4
#define DEQ_Q2_K dequant_q2_k
#define DEQ_Q3_K dequant_q3_k
#define DEQ_Q4_K dequant_q4_k
#define DEQ_Q5_K dequant_q5_k
#define DEQ_Q6_K dequant_q6_k
#define DEQ_IQ4_NL dequant_iq4_nl
#define DEQ_IQ4_XS dequant_iq4_xs
#define QUANT_F32 quantize_f32
#define QUANT_F16 quantize_f16
#define QUANT_BF16 quantize_bf16
#define QUANT_AFFINE2 quantize_affine2
#define QUANT_AFFINE3 quantize_affine3
#define QUANT_AFFINE4 quantize_affine4
#define QUANT_AFFINE5 quantize_affine5
#define QUANT_AFFINE6 quantize_affine6
#define QUANT_AFFINE8 quantize_affine8
#define QUANT_MXFP4 quantize_mxfp4
#define QUANT_MXFP8 quantize_mxfp8
#define QUANT_NVFP4 quantize_nvfp4
#define QUANT_Q2_K quantize_q2_k
#define QUANT_Q3_K quantize_q3_k
#define QUANT_Q4_K quantize_q4_k
#define QUANT_Q5_K quantize_q5_k
#define QUANT_Q6_K quantize_q6_k
#define QUANT_IQ4_NL quantize_iq4_nl
#define QUANT_IQ4_XS quantize_iq4_xs
#define SCALE_F32 SP_DTYPE_COUNT
#define SCALE_F16 SP_DTYPE_COUNT
#define SCALE_BF16 SP_DTYPE_COUNT
#define SCALE_AFFINE2 SP_DTYPE_COUNT
#define SCALE_AFFINE3 SP_DTYPE_COUNT
#define SCALE_AFFINE4 SP_DTYPE_COUNT
#define SCALE_AFFINE5 SP_DTYPE_COUNT
#define SCALE_AFFINE6 SP_DTYPE_COUNT
#define SCALE_AFFINE8 SP_DTYPE_COUNT
#define SCALE_MXFP4 SP_DTYPE_U8
#define SCALE_MXFP8 SP_DTYPE_U8
#define SCALE_NVFP4 SP_DTYPE_U8
#define SCALE_Q2_K SP_DTYPE_COUNT
#define SCALE_Q3_K SP_DTYPE_COUNT
#define SCALE_Q4_K SP_DTYPE_COUNT
#define SCALE_Q5_K SP_DTYPE_COUNT
#define SCALE_Q6_K SP_DTYPE_COUNT
#define SCALE_IQ4_NL SP_DTYPE_COUNT
#define SCALE_IQ4_XS SP_DTYPE_COUNT

static const struct sp_qtype_traits traits[SP_QTYPE_COUNT] = {
#define SP_X(e, nm, md, b, g, hb, bb) {nm, md, b, g, hb, bb, SCALE_##e, DEQ_##e, QUANT_##e},
    SP_QTYPE_LIST(SP_X)
#undef SP_X
};

const struct sp_qtype_traits *sp_qtype_traits(enum sp_qtype t) {
    SP_ASSERT((unsigned)t < SP_QTYPE_COUNT);
    return &traits[t];
}

const char *sp_qtype_name(enum sp_qtype t) { return (unsigned)t < SP_QTYPE_COUNT ? traits[t].name : "?"; }

bool sp_qtype_from_name(const char *name, enum sp_qtype *out) {
    for (int i = 0; i < SP_QTYPE_COUNT; i++) {
        if (strcmp(traits[i].name, name) == 0) {
            *out = (enum sp_qtype)i;
            return true;
        }
    }
    return false;
}

enum sp_status sp_qtype_from_mode(const char *mode, int bits, enum sp_qtype *out) {
    for (int i = 0; i < SP_QTYPE_COUNT; i++) {
        if (traits[i].mode && strcmp(traits[i].mode, mode) == 0 && traits[i].bits == bits) {
            *out = (enum sp_qtype)i;
            return SP_OK;
        }
    }
    return sp_errorf(SP_ERR_UNSUPPORTED,
                     "quantization mode \"%s\" with %d bits is not supported (affine: 2, 3, 4, 5, 6, 8 bits; "
                     "mxfp4: 4; mxfp8: 8; nvfp4: 4; q2_k: 2; q3_k: 3; q4_k: 4; q5_k: 5; q6_k: 6; iq4_nl: 4; iq4_xs: 4)",
                     mode, bits);
}

bool sp_qtype_is_quantized(enum sp_qtype t) { return sp_qtype_traits(t)->mode != NULL; }

size_t sp_qtype_row_bytes(enum sp_qtype t, int64_t cols) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(t);
    if (tr->block_bytes) return (size_t)(cols / tr->group) * (size_t)tr->block_bytes;
    return (size_t)cols * (size_t)tr->bits / 8;
}

size_t sp_qtype_matrix_bytes(enum sp_qtype t, int group, enum sp_dtype scale_dtype, int64_t rows, int64_t cols) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(t);
    size_t bytes = (size_t)rows * sp_qtype_row_bytes(t, cols);
    if (tr->mode && !tr->block_bytes) {
        size_t per = (size_t)(cols / group) * sp_dtype_size(tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : scale_dtype);
        bytes += (size_t)rows * per * (tr->has_biases ? 2 : 1);
    }
    return bytes;
}

enum sp_status sp_qtype_check_shape(enum sp_qtype t, int group, int64_t cols) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(t);
    if (!tr->mode) return SP_OK;
    if (tr->group == 0 && group != 32 && group != 64 && group != 128)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: group size %d (supported: 32, 64, 128)", tr->name, group);
    if (tr->group != 0 && group != tr->group)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: group size %d (the format requires %d)", tr->name, group, tr->group);
    if (cols % group != 0)
        return sp_errorf(SP_ERR_FORMAT, "%s: %lld columns are not a whole number of %d-element groups", tr->name,
                         (long long)cols, group);
    return SP_OK;
}

void sp_qmat_dequant_row_ref(const struct sp_qmat *m, int64_t row, float *out) {
    sp_qtype_traits(m->type)->dequant(m, row, 0, m->cols, out);
}

void sp_qmat_dequant_cols_ref(const struct sp_qmat *m, int64_t row, int64_t col0, int64_t n, float *out) {
    sp_qtype_traits(m->type)->dequant(m, row, col0, n, out);
}

float sp_qmat_dot_row_ref(const struct sp_qmat *m, int64_t row, const float *x) {
    /* Chunks of 256 columns hold whole groups (groups are 16 to 128 wide),
     * so the reference needs no row-sized buffer. */
    float buf[256];
    double acc = 0.0;
    for (int64_t c0 = 0; c0 < m->cols; c0 += 256) {
        int64_t n = m->cols - c0 < 256 ? m->cols - c0 : 256;
        sp_qmat_dequant_cols_ref(m, row, c0, n, buf);
        for (int64_t i = 0; i < n; i++) acc += (double)buf[i] * (double)x[c0 + i];
    }
    return (float)acc;
}

bool sp_qmat_interleavable(const struct sp_qmat *m) {
    bool affine4 = m->type == SP_QTYPE_AFFINE4 && m->biases &&
                   (m->scale_dtype == SP_DTYPE_BF16 || m->scale_dtype == SP_DTYPE_F16 || m->scale_dtype == SP_DTYPE_F32);
    bool mxfp4 = m->type == SP_QTYPE_MXFP4 && m->group == 32;
    return !m->interleaved && (affine4 || mxfp4) && m->rows > 0 && m->rows % SP_QMAT_BLOCK_ROWS == 0 &&
           m->group >= 32 && m->cols % m->group == 0;
}

/* One block's rows from row order into the interleaved order (to_block),
 * or back: codes 4 bytes at a time, scales and biases an element (of
 * `size` bytes) at a time. */
static inline void block_move_units(const uint8_t *src, uint8_t *dst, int64_t per_row, size_t unit, bool to_block) {
    for (int64_t i = 0; i < SP_QMAT_BLOCK_ROWS; i++)
        for (int64_t k = 0; k < per_row; k++) {
            size_t in_rows = (size_t)(i * per_row + k) * unit, in_block = (size_t)(k * SP_QMAT_BLOCK_ROWS + i) * unit;
            memcpy(dst + (to_block ? in_block : in_rows), src + (to_block ? in_rows : in_block), unit);
        }
}

static void block_move(const struct sp_qmat *m, const uint8_t *src, uint8_t *dst, size_t size, bool codes,
                       bool to_block) {
    int64_t per_row = codes ? (int64_t)sp_qtype_row_bytes(m->type, m->cols) / 4 : m->cols / m->group;
    /* copies of a size the compiler knows (a call to memcpy each, else) */
    size_t unit = codes ? 4 : size;
    if (unit == 1) block_move_units(src, dst, per_row, 1, to_block);
    else if (unit == 2) block_move_units(src, dst, per_row, 2, to_block);
    else block_move_units(src, dst, per_row, 4, to_block);
}

/* Bytes of one block of rows in codes and in scales (= biases). */
static void block_sizes(const struct sp_qmat *m, size_t *codes, size_t *scales) {
    *codes = SP_QMAT_BLOCK_ROWS * sp_qtype_row_bytes(m->type, m->cols);
    *scales = (size_t)(SP_QMAT_BLOCK_ROWS * (m->cols / m->group)) * sp_dtype_size(m->scale_dtype);
}

void sp_qmat_interleave(const struct sp_qmat *m, void *codes, void *scales, void *biases, struct sp_qmat *out) {
    size_t cb, sb, ss = sp_dtype_size(m->scale_dtype);
    block_sizes(m, &cb, &sb);
    for (int64_t b = 0; b < m->rows / SP_QMAT_BLOCK_ROWS; b++) {
        size_t c = (size_t)b * cb, s = (size_t)b * sb;
        block_move(m, (const uint8_t *)m->codes + c, (uint8_t *)codes + c, 4, true, true);
        block_move(m, (const uint8_t *)m->scales + s, (uint8_t *)scales + s, ss, false, true);
        if (m->biases) block_move(m, (const uint8_t *)m->biases + s, (uint8_t *)biases + s, ss, false, true);
    }
    *out = *m;
    out->codes = codes;
    out->scales = scales;
    out->biases = m->biases ? biases : NULL;
    out->interleaved = true;
}

void sp_qmat_interleave_in_place(const struct sp_qmat *m, void *tmp, struct sp_qmat *out) {
    size_t cb, sb, ss = sp_dtype_size(m->scale_dtype);
    block_sizes(m, &cb, &sb);
    uint8_t *t = tmp;
    for (int64_t b = 0; b < m->rows / SP_QMAT_BLOCK_ROWS; b++) {
        uint8_t *c = (uint8_t *)(uintptr_t)m->codes + (size_t)b * cb;
        uint8_t *s = (uint8_t *)(uintptr_t)m->scales + (size_t)b * sb;
        block_move(m, c, t, 4, true, true);
        memcpy(c, t, cb);
        block_move(m, s, t, ss, false, true);
        memcpy(s, t, sb);
        if (m->biases) {
            uint8_t *bi = (uint8_t *)(uintptr_t)m->biases + (size_t)b * sb;
            block_move(m, bi, t, ss, false, true);
            memcpy(bi, t, sb);
        }
    }
    *out = *m;
    out->interleaved = true;
}

void sp_qmat_block_groups(const struct sp_qmat *m, int64_t b, void *scales, void *biases, struct sp_qmat *out) {
    size_t cb, sb, ss = sp_dtype_size(m->scale_dtype);
    block_sizes(m, &cb, &sb);
    block_move(m, (const uint8_t *)m->scales + (size_t)b * sb, scales, ss, false, false);
    if (m->biases) block_move(m, (const uint8_t *)m->biases + (size_t)b * sb, biases, ss, false, false);
    *out = *m;
    out->rows = SP_QMAT_BLOCK_ROWS;
    out->codes = NULL;
    out->scales = scales;
    out->biases = m->biases ? biases : NULL;
    out->interleaved = false;
}

void sp_qmat_block_rows(const struct sp_qmat *m, int64_t b, void *codes, void *scales, void *biases,
                        struct sp_qmat *out) {
    size_t cb, sb;
    block_sizes(m, &cb, &sb);
    block_move(m, (const uint8_t *)m->codes + (size_t)b * cb, codes, 4, true, false);
    sp_qmat_block_groups(m, b, scales, biases, out);
    out->codes = codes;
}

size_t sp_qmat_block_bytes(const struct sp_qmat *m) {
    size_t cb, sb;
    block_sizes(m, &cb, &sb);
    return cb + 2 * sb;
}

void sp_qtype_quantize_row_ref(enum sp_qtype t, const float *x, int64_t n, int group, void *codes, void *scales,
                               void *biases, enum sp_dtype scale_dtype) {
    sp_qtype_traits(t)->quantize_row(x, n, group, codes, scales, biases, scale_dtype);
}
