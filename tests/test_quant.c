/* test_quant.c - the weight-format table: packing layouts from the spec,
 * hand-computed vectors, mlx rounding rules, round trips and edge cases. */
#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

#include "core/half.h"
#include "core/rng.h"
#include "quant/qtype.h"

static uint32_t word(const uint8_t *p, int i) {
    uint32_t w;
    memcpy(&w, p + 4 * i, 4);
    return w;
}

/* Packs codes with the affine quantizer's bit writer by quantizing values
 * that land exactly on the given codes (scale 1, bias 0 after rounding). */
static void pack_codes(int bits, const uint32_t *codes, int n, uint8_t *out) {
    memset(out, 0, (size_t)n * bits / 8);
    for (int i = 0; i < n; i++)
        for (int k = 0; k < bits; k++)
            if ((codes[i] >> k) & 1) out[(i * bits + k) / 8] |= (uint8_t)(1u << ((i * bits + k) % 8));
}

static void test_spec_packing_vectors(void **state) {
    uint8_t buf[64];
    uint32_t c4[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    pack_codes(4, c4, 8, buf);
    assert_int_equal(word(buf, 0), 0x76543210u);
    for (int i = 0; i < 8; i++) assert_int_equal(sp_unpack_bits(buf, i, 4), c4[i]);

    uint32_t c2[16];
    for (int i = 0; i < 16; i++) c2[i] = (uint32_t[]){1, 2, 3, 0}[i % 4];
    pack_codes(2, c2, 16, buf);
    assert_int_equal(word(buf, 0), 0x39393939u);

    uint32_t c8[4] = {0x11, 0x22, 0x33, 0x44};
    pack_codes(8, c8, 4, buf);
    assert_int_equal(word(buf, 0), 0x44332211u);

    uint32_t c3[32] = {0};
    c3[10] = 5;
    pack_codes(3, c3, 32, buf);
    assert_int_equal(word(buf, 0), 0x40000000u);
    assert_int_equal(word(buf, 1), 0x1u);
    assert_int_equal(word(buf, 2), 0x0u);
    assert_int_equal(sp_unpack_bits(buf, 10, 3), 5);

    uint32_t c6[16] = {0};
    c6[5] = 63;
    pack_codes(6, c6, 16, buf);
    assert_int_equal(word(buf, 0), 0xC0000000u);
    assert_int_equal(word(buf, 1), 0xFu);
    assert_int_equal(word(buf, 2), 0x0u);
    assert_int_equal(sp_unpack_bits(buf, 5, 6), 63);
}

/* The quantizer's own packing agrees with the spec's stream layout for every
 * width, including the codes that straddle words for 3, 5 and 6 bits. */
static void test_quantizer_packs_lsb_first(void **state) {
    int widths[] = {2, 3, 4, 5, 6, 8};
    for (size_t wi = 0; wi < sizeof widths / sizeof *widths; wi++) {
        int b = widths[wi];
        int n = 64, maxq = (1 << b) - 1;
        float x[64];
        uint32_t want[64];
        /* Values 0..maxq and one group: min 0 -> |min| <= |max|, so the scale
         * is negative and codes count down from the max: q = maxq - v. */
        for (int i = 0; i < n; i++) {
            int v = (i * 7) % (maxq + 1);
            if (i == 0) v = 0;
            if (i == 1) v = maxq;
            x[i] = (float)v;
            want[i] = (uint32_t)(maxq - v);
        }
        uint8_t codes[64], expect[64];
        float scale, bias;
        sp_qtype_quantize_row_ref(SP_QTYPE_AFFINE2 + (enum sp_qtype)(b == 8 ? 5 : b - 2), x, n, 64, codes, &scale,
                                  &bias, SP_DTYPE_F32);
        pack_codes(b, want, n, expect);
        assert_memory_equal(codes, expect, (size_t)n * b / 8);
        assert_float_equal(scale, -1.0f, 0.0f);
        assert_float_equal(bias, (float)maxq, 0.0f);
    }
}

static void test_affine_dequant_hand_vector(void **state) {
    /* 4-bit, group 32, two groups; scales/biases in BF16. */
    uint32_t q[64];
    for (int i = 0; i < 64; i++) q[i] = (uint32_t)(i % 16);
    uint8_t codes[32];
    pack_codes(4, q, 64, codes);
    uint16_t scales[2] = {sp_f32_to_bf16(0.5f), sp_f32_to_bf16(-0.25f)};
    uint16_t biases[2] = {sp_f32_to_bf16(-1.0f), sp_f32_to_bf16(2.0f)};
    struct sp_qmat m = {SP_QTYPE_AFFINE4, 32, 1, 64, codes, scales, biases, SP_DTYPE_BF16, false};
    float out[64];
    sp_qmat_dequant_row_ref(&m, 0, out);
    for (int i = 0; i < 64; i++) {
        float want = i < 32 ? 0.5f * (float)q[i] - 1.0f : -0.25f * (float)q[i] + 2.0f;
        assert_float_equal(out[i], want, 0.0f);
    }
    float x[64];
    double dot = 0;
    for (int i = 0; i < 64; i++) {
        x[i] = (float)(i % 5) - 2.0f;
        dot += (double)x[i] * out[i];
    }
    assert_float_equal(sp_qmat_dot_row_ref(&m, 0, x), (float)dot, 1e-6);
}

static void test_affine_rounding_rules(void **state) {
    /* |min| > |max|: positive scale, bias = min, stored exactly. */
    float x[32];
    for (int i = 0; i < 32; i++) x[i] = -3.0f + 0.1f * (float)i;  // min -3, max 0.1
    uint8_t codes[16];
    float s, b;
    sp_qtype_quantize_row_ref(SP_QTYPE_AFFINE4, x, 32, 32, codes, &s, &b, SP_DTYPE_F32);
    assert_true(s > 0);
    assert_float_equal(b, -3.0f, 0.0f);
    assert_int_equal(sp_unpack_bits(codes, 0, 4), 0);
    /* |max| >= |min|: negative scale, bias = max, the max has code 0. */
    for (int i = 0; i < 32; i++) x[i] = 3.0f - 0.1f * (float)i;
    sp_qtype_quantize_row_ref(SP_QTYPE_AFFINE4, x, 32, 32, codes, &s, &b, SP_DTYPE_F32);
    assert_true(s < 0);
    assert_float_equal(b, 3.0f, 0.0f);
    assert_int_equal(sp_unpack_bits(codes, 0, 4), 0);
    /* Zero is on the grid: the scale is edge / round(edge / scale). */
    struct sp_qmat m = {SP_QTYPE_AFFINE4, 32, 1, 32, codes, &s, &b, SP_DTYPE_F32, false};
    x[5] = 0.0f;
    sp_qtype_quantize_row_ref(SP_QTYPE_AFFINE4, x, 32, 32, codes, &s, &b, SP_DTYPE_F32);
    float out[32];
    sp_qmat_dequant_row_ref(&m, 0, out);
    assert_float_equal(out[5], 0.0f, 1e-6);
}

static void test_affine_all_zero_group(void **state) {
    float x[64] = {0};
    uint8_t codes[64];
    uint16_t s[2], b[2];
    for (int bits = 2; bits <= 8; bits++) {
        if (bits == 7) continue;
        enum sp_qtype t = bits == 8 ? SP_QTYPE_AFFINE8 : SP_QTYPE_AFFINE2 + (enum sp_qtype)(bits - 2);
        sp_qtype_quantize_row_ref(t, x, 64, 32, codes, s, b, SP_DTYPE_F16);
        struct sp_qmat m = {t, 32, 1, 64, codes, s, b, SP_DTYPE_F16, false};
        float out[64];
        sp_qmat_dequant_row_ref(&m, 0, out);
        for (int i = 0; i < 64; i++) assert_true(out[i] == 0.0f);
    }
}

static void test_affine_round_trip_bound(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 7);
    enum sp_qtype types[] = {SP_QTYPE_AFFINE2, SP_QTYPE_AFFINE3, SP_QTYPE_AFFINE4,
                             SP_QTYPE_AFFINE5, SP_QTYPE_AFFINE6, SP_QTYPE_AFFINE8};
    int groups[] = {32, 64, 128};
    enum { N = 384 };  // 3 groups of 128: an odd group count
    float x[N], out[N];
    uint8_t codes[N];
    float s[N / 32], b[N / 32];
    for (size_t ti = 0; ti < 6; ti++) {
        for (size_t gi = 0; gi < 3; gi++) {
            int g = groups[gi];
            for (int i = 0; i < N; i++) x[i] = sp_rng_normal(&r) * 0.02f;
            sp_qtype_quantize_row_ref(types[ti], x, N, g, codes, s, b, SP_DTYPE_F32);
            struct sp_qmat m = {types[ti], g, 1, N, codes, s, b, SP_DTYPE_F32, false};
            sp_qmat_dequant_row_ref(&m, 0, out);
            for (int i = 0; i < N; i++) {
                float sc = fabsf(s[i / g]);
                assert_true(fabsf(out[i] - x[i]) <= sc * 1.0001f);
            }
        }
    }
}

static void test_mxfp4_exact_round_trip(void **state) {
    /* E2M1 values times 2^k with a 6 in every group come back exactly (mlx's test). */
    float x[64], out[64];
    for (int i = 0; i < 64; i++) {
        float v = sp_e2m1_values[i % 16];
        x[i] = ldexpf(v, i < 32 ? -3 : 5);
    }
    x[7] = ldexpf(6.0f, -3);
    x[39] = ldexpf(-6.0f, 5);
    uint8_t codes[32], scales[2];
    sp_qtype_quantize_row_ref(SP_QTYPE_MXFP4, x, 64, 32, codes, scales, NULL, SP_DTYPE_U8);
    assert_int_equal(scales[0], 127 - 3);
    assert_int_equal(scales[1], 127 + 5);
    struct sp_qmat m = {SP_QTYPE_MXFP4, 32, 1, 64, codes, scales, NULL, SP_DTYPE_U8, false};
    sp_qmat_dequant_row_ref(&m, 0, out);
    for (int i = 0; i < 64; i++) assert_true(out[i] == x[i]);
}

static void test_mxfp4_codes_and_scales(void **state) {
    /* Low nibble first; code 8 is -0; scale 2^(s-127); s = 0 is 2^-127. */
    uint8_t codes[16] = {0x87, 0xf1};  // elements: 7 (6.0), 8 (-0), 1 (0.5), 15 (-6)
    uint8_t scales[1] = {128};
    struct sp_qmat m = {SP_QTYPE_MXFP4, 32, 1, 32, codes, scales, NULL, SP_DTYPE_U8, false};
    float out[32];
    sp_qmat_dequant_row_ref(&m, 0, out);
    assert_float_equal(out[0], 12.0f, 0);
    assert_true(out[1] == 0.0f && signbit(out[1]));
    assert_float_equal(out[2], 1.0f, 0);
    assert_float_equal(out[3], -12.0f, 0);
    assert_true(sp_e8m0_to_float(0) == ldexpf(1.0f, -127));
    assert_true(isinf(sp_e8m0_to_float(255)));
    /* Nearest-code thresholds: ties go to the even code. */
    float ties[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f, 5.01f, 100.0f};
    uint8_t want[] = {0, 2, 2, 4, 4, 6, 6, 7, 7};
    for (size_t i = 0; i < sizeof ties / sizeof *ties; i++) {
        assert_int_equal(sp_float_to_e2m1(ties[i]), want[i]);
        assert_int_equal(sp_float_to_e2m1(-ties[i]), want[i] | 8);
    }
    assert_int_equal(sp_float_to_e2m1(-0.1f), 8);  // small negatives keep their sign bit
    /* All-zero group: scale 127, codes 0. */
    float z[32] = {0};
    uint8_t c[16], s;
    sp_qtype_quantize_row_ref(SP_QTYPE_MXFP4, z, 32, 32, c, &s, NULL, SP_DTYPE_U8);
    assert_int_equal(s, 127);
    for (int i = 0; i < 16; i++) assert_int_equal(c[i], 0);
    /* The scale is 2^round(log2(amax / 6)), not the OCP floor rule: amax 9
     * gives log2(1.5) = 0.58 -> 2^1, and 9 / 2 = 4.5 takes code 6 (4.0);
     * amax 11.9 gives 2^1 too, and 5.95 clips to 6 (code 7). */
    float big[32] = {9.0f, 11.9f};
    sp_qtype_quantize_row_ref(SP_QTYPE_MXFP4, big, 32, 32, c, &s, NULL, SP_DTYPE_U8);
    assert_int_equal(s, 127 + 1);
    assert_int_equal(c[0] & 0xf, 6);
    assert_int_equal(c[0] >> 4, 7);
}

static void test_e4m3_all_codes(void **state) {
    for (int x = 0; x < 256; x++) {
        if ((x & 0x7f) == 0x7f) continue;  // NaN in OCP (mlx decodes 480)
        float v = sp_e4m3_to_float((uint8_t)x);
        assert_int_equal(sp_float_to_e4m3(v), x);
    }
    assert_float_equal(sp_e4m3_to_float(0x7e), 448.0f, 0);
    assert_float_equal(sp_e4m3_to_float(0x7f), 480.0f, 0);
    assert_int_equal(sp_float_to_e4m3(1e6f), 0x7e);
    assert_int_equal(sp_float_to_e4m3(-1e6f), 0xfe);
    assert_float_equal(sp_e4m3_to_float(0x01), ldexpf(1.0f, -9), 0);
}

static void test_mxfp8_nvfp4_round_trip(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 3);
    float x[64], out[64];
    for (int i = 0; i < 64; i++) x[i] = sp_rng_normal(&r);
    uint8_t codes[64], scales[4];
    sp_qtype_quantize_row_ref(SP_QTYPE_MXFP8, x, 64, 32, codes, scales, NULL, SP_DTYPE_U8);
    struct sp_qmat m8 = {SP_QTYPE_MXFP8, 32, 1, 64, codes, scales, NULL, SP_DTYPE_U8, false};
    sp_qmat_dequant_row_ref(&m8, 0, out);
    /* Three mantissa bits: half a step is 1/16 relative, or 2^-10 of the scale
     * for values in E4M3's subnormal range. mlx rounds the scale exponent to
     * nearest, so values above 448 scale units occur and clip to 448. */
    int clipped = 0;
    for (int i = 0; i < 64; i++) {
        float sc = sp_e8m0_to_float(scales[i / 32]);
        if (fabsf(x[i]) / sc > 448.0f) {
            assert_true(out[i] == copysignf(448.0f * sc, x[i]));
            clipped++;
        } else {
            assert_true(fabsf(out[i] - x[i]) <= fabsf(x[i]) / 16.0f + sc / 1024.0f);
        }
    }
    assert_true(clipped > 0);  // this seed exercises the clipping
    sp_qtype_quantize_row_ref(SP_QTYPE_NVFP4, x, 64, 16, codes, scales, NULL, SP_DTYPE_U8);
    struct sp_qmat m4 = {SP_QTYPE_NVFP4, 16, 1, 64, codes, scales, NULL, SP_DTYPE_U8, false};
    sp_qmat_dequant_row_ref(&m4, 0, out);
    for (int g = 0; g < 4; g++) {
        float amax = 0;
        for (int i = 0; i < 16; i++) amax = fmaxf(amax, fabsf(x[g * 16 + i]));
        for (int i = 0; i < 16; i++) assert_true(fabsf(out[g * 16 + i] - x[g * 16 + i]) <= amax / 6.0f * 1.07f);
    }
}

/* Q6_K: each value rounded within half its 16's step (d x scale), or, at
 * the ends of the code range, clamped; a block's bytes where ggml puts
 * them (element l + 32 k of each 128: low bits in ql[l + 32 (k % 2)]'s
 * low nibble for k < 2, high for k >= 2, high bits at bit 2 k of qh[l]);
 * and its sizes. */
static void test_q6_k(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 6);
    float x[512], out[512];
    for (int i = 0; i < 512; i++) x[i] = sp_rng_normal(&r) * (i < 256 ? 1.0f : 1e-3f);
    uint8_t b[2 * 210];
    sp_qtype_quantize_row_ref(SP_QTYPE_Q6_K, x, 512, 256, b, NULL, NULL, SP_DTYPE_COUNT);
    struct sp_qmat m = {SP_QTYPE_Q6_K, 256, 1, 512, b, NULL, NULL, SP_DTYPE_COUNT, false};
    sp_qmat_dequant_row_ref(&m, 0, out);
    for (int i = 0; i < 512; i++) {
        const uint8_t *blk = b + i / 256 * 210;
        uint16_t dh;
        memcpy(&dh, blk + 208, 2);
        float step = sp_f16_to_f32(dh) * (float)(int8_t)blk[192 + i % 256 / 16];
        int e = i % 256, h = e / 128, k = e % 128 / 32, l = e % 32;
        int lo = blk[64 * h + l + 32 * (k % 2)] >> (4 * (k / 2)) & 15, hi = blk[128 + 32 * h + l] >> (2 * k) & 3;
        assert_true(out[i] == step * (float)((lo | hi << 4) - 32));
        float q = x[i] / step;
        if (q > -32.0f && q < 31.0f) assert_true(fabsf(out[i] - x[i]) <= 0.5f * step * 1.0001f);
        else assert_true(fabsf(out[i]) <= fabsf(x[i]) + 0.5f * step);
    }
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_Q6_K, 512), 420);
    assert_int_equal(sp_qtype_matrix_bytes(SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT, 3, 512), 3 * 420);
    assert_int_equal(sp_qtype_check_shape(SP_QTYPE_Q6_K, 256, 512), SP_OK);
    assert_int_not_equal(sp_qtype_check_shape(SP_QTYPE_Q6_K, 256, 384), SP_OK);
    assert_int_not_equal(sp_qtype_check_shape(SP_QTYPE_Q6_K, 64, 512), SP_OK);
}

/* ggml's own dequantizers' floats for random blocks
 * (tests/fixtures/ggml_blocks/README.md): the reference gives each bit for bit. */
static void test_k_quants_against_ggml(void **state) {
    static const struct {
        const char *file;
        enum sp_qtype t;
    } cases[] = {{"q2_k", SP_QTYPE_Q2_K},
                 {"q3_k", SP_QTYPE_Q3_K},
                 {"q4_k", SP_QTYPE_Q4_K},
                 {"q5_k", SP_QTYPE_Q5_K},
                 {"q6_k", SP_QTYPE_Q6_K},
                 {"iq4_nl", SP_QTYPE_IQ4_NL},
                 {"iq4_xs", SP_QTYPE_IQ4_XS}};
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        char path[96];
        snprintf(path, sizeof path, "tests/fixtures/ggml_blocks/%s.bin", cases[c].file);
        FILE *f = fopen(path, "rb");
        assert_non_null(f);
        const struct sp_qtype_traits *tr = sp_qtype_traits(cases[c].t);
        size_t bb = (size_t)tr->block_bytes, be = (size_t)tr->group, nb = 8;
        uint8_t *blocks = malloc(nb * bb);
        float *want = malloc(nb * be * sizeof *want), *got = malloc(nb * be * sizeof *got);
        assert_int_equal(fread(blocks, bb, nb, f), nb);
        assert_int_equal(fread(want, sizeof *want, nb * be, f), nb * be);
        assert_int_equal(fgetc(f), EOF);
        fclose(f);
        /* as one row of 8 blocks, and as 2 rows of 4 read from the middle */
        struct sp_qmat m = {cases[c].t, tr->group, 1, (int64_t)(nb * be), blocks, NULL, NULL, SP_DTYPE_COUNT, false};
        sp_qmat_dequant_row_ref(&m, 0, got);
        assert_memory_equal(got, want, nb * be * sizeof *got);
        m.rows = 2, m.cols = (int64_t)(4 * be);
        sp_qmat_dequant_cols_ref(&m, 1, (int64_t)be, (int64_t)(2 * be), got);
        assert_memory_equal(got, want + 5 * be, 2 * be * sizeof *got);
        free(blocks);
        free(want);
        free(got);
    }
}

/* IQ4_NL and IQ4_XS round trips: each value within a share of its 32's
 * largest (the table's widest gap, its top at 113 of 127, and IQ4_XS's
 * scales rounded to 31 steps of the block's largest). */
static void test_iq4(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 8);
    float x[256], out[256];
    uint8_t b[8 * 18];
    for (int i = 0; i < 256; i++) x[i] = sp_rng_normal(&r) * (i < 128 ? 1.0f : 0.25f);
    for (int t = 0; t < 2; t++) {
        enum sp_qtype q = t ? SP_QTYPE_IQ4_XS : SP_QTYPE_IQ4_NL;
        sp_qtype_quantize_row_ref(q, x, 256, sp_qtype_traits(q)->group, b, NULL, NULL, SP_DTYPE_COUNT);
        struct sp_qmat m = {q, sp_qtype_traits(q)->group, 1, 256, b, NULL, NULL, SP_DTYPE_COUNT, false};
        sp_qmat_dequant_row_ref(&m, 0, out);
        for (int j = 0; j < 8; j++) {
            float amax = 0.0f;
            for (int i = 0; i < 32; i++) amax = fmaxf(amax, fabsf(x[32 * j + i]));
            for (int i = 0; i < 32; i++)
                assert_true(fabsf(out[32 * j + i] - x[32 * j + i]) <= amax * (t ? 0.2f : 0.12f));
        }
    }
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_IQ4_NL, 512), 288);
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_IQ4_XS, 512), 272);
}

/* Q2_K and Q3_K round trips: within a step of each 16's range. */
static void test_q2_q3_k(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 7);
    float x[256], out[256];
    uint8_t b[110];
    for (int i = 0; i < 256; i++) x[i] = sp_rng_normal(&r);
    for (int t = 0; t < 2; t++) {
        enum sp_qtype q = t ? SP_QTYPE_Q3_K : SP_QTYPE_Q2_K;
        sp_qtype_quantize_row_ref(q, x, 256, 256, b, NULL, NULL, SP_DTYPE_COUNT);
        struct sp_qmat m = {q, 256, 1, 256, b, NULL, NULL, SP_DTYPE_COUNT, false};
        sp_qmat_dequant_row_ref(&m, 0, out);
        for (int j = 0; j < 16; j++) {
            float lo = x[16 * j], hi = x[16 * j];
            for (int i = 1; i < 16; i++) lo = fminf(lo, x[16 * j + i]), hi = fmaxf(hi, x[16 * j + i]);
            float range = fmaxf(hi, 0.0f) - fminf(lo, 0.0f);
            for (int i = 0; i < 16; i++)
                assert_true(fabsf(out[16 * j + i] - x[16 * j + i]) <= range * (t ? 0.35f : 0.5f));
        }
    }
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_Q2_K, 512), 168);
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_Q3_K, 512), 220);
}

/* Q4_K and Q5_K round trips: each value within half a step (its 32's
 * range over 15 / 31) of itself, give or take the rounding of the steps
 * and mins to 63 steps of the block's largest (a 32 of values far below
 * the block's largest may round to nothing). */
static void test_q4_q5_k(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 9);
    float x[512], out[512], range[16], top_range[2] = {0.0f, 0.0f};
    uint8_t b[2 * 176];
    for (int i = 0; i < 512; i++) x[i] = sp_rng_normal(&r) * (i < 256 ? 1.0f : 1e-3f) + (i % 64 < 32 ? 0.5f : 0.0f);
    for (int j = 0; j < 16; j++) {
        float lo = x[32 * j], hi = x[32 * j];
        for (int i = 1; i < 32; i++) lo = fminf(lo, x[32 * j + i]), hi = fmaxf(hi, x[32 * j + i]);
        range[j] = hi - fminf(lo, 0.0f);
        top_range[j / 8] = fmaxf(top_range[j / 8], range[j]);
    }
    for (int t = 0; t < 2; t++) {
        enum sp_qtype q = t ? SP_QTYPE_Q5_K : SP_QTYPE_Q4_K;
        float steps = t ? 31.0f : 15.0f;
        sp_qtype_quantize_row_ref(q, x, 512, 256, b, NULL, NULL, SP_DTYPE_COUNT);
        struct sp_qmat m = {q, 256, 1, 512, b, NULL, NULL, SP_DTYPE_COUNT, false};
        sp_qmat_dequant_row_ref(&m, 0, out);
        for (int i = 0; i < 512; i++)
            assert_true(fabsf(out[i] - x[i]) <= range[i / 32] * 0.5f / steps + top_range[i / 256] / 63.0f);
    }
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_Q4_K, 512), 288);
    assert_int_equal(sp_qtype_row_bytes(SP_QTYPE_Q5_K, 512), 352);
}

static void test_float_formats(void **state) {
    float x[8] = {1.0f, -2.5f, 3.1415926f, 0.0f, -0.0f, 65504.0f, 1e-8f, -7.75f};
    uint16_t h[8], bf[8];
    float out[8];
    sp_qtype_quantize_row_ref(SP_QTYPE_F16, x, 8, 1, h, NULL, NULL, SP_DTYPE_COUNT);
    struct sp_qmat m = {SP_QTYPE_F16, 1, 1, 8, h, NULL, NULL, SP_DTYPE_COUNT, false};
    sp_qmat_dequant_row_ref(&m, 0, out);
    for (int i = 0; i < 8; i++) assert_float_equal(out[i], x[i], fabsf(x[i]) * 1e-3f + 6e-8f);
    assert_int_equal(sp_f32_to_f16(65520.0f), 0x7c00);  // rounds to inf
    assert_int_equal(sp_f32_to_f16(5.960464477539063e-08f), 0x0001);  // smallest subnormal
    sp_qtype_quantize_row_ref(SP_QTYPE_BF16, x, 8, 1, bf, NULL, NULL, SP_DTYPE_COUNT);
    m.type = SP_QTYPE_BF16;
    m.codes = bf;
    sp_qmat_dequant_row_ref(&m, 0, out);
    for (int i = 0; i < 8; i++) assert_float_equal(out[i], x[i], fabsf(x[i]) * 4e-3f);
    assert_int_equal(sp_f32_to_bf16(1.00390625f), 0x3f80);  // tie to even (down)
    assert_int_equal(sp_f32_to_bf16(1.01171875f), 0x3f82);  // tie to even (up)
}

static void test_shapes_and_sizes(void **state) {
    assert_int_equal(sp_qtype_check_shape(SP_QTYPE_AFFINE4, 64, 4096), SP_OK);
    assert_int_equal(sp_qtype_check_shape(SP_QTYPE_AFFINE4, 48, 4096), SP_ERR_UNSUPPORTED);
    assert_int_equal(sp_qtype_check_shape(SP_QTYPE_AFFINE4, 128, 64), SP_ERR_FORMAT);
    assert_int_equal(sp_qtype_check_shape(SP_QTYPE_MXFP4, 64, 4096), SP_ERR_UNSUPPORTED);
    /* 4096x4096 affine4 g64 with bf16 scales: 8 MiB codes + 2 x 512 KiB. */
    assert_int_equal(sp_qtype_matrix_bytes(SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16, 4096, 4096), 8388608 + 2 * 524288);
    assert_int_equal(sp_qtype_matrix_bytes(SP_QTYPE_MXFP4, 32, SP_DTYPE_U8, 4096, 4096), 8388608 + 524288);
    assert_int_equal(sp_qtype_matrix_bytes(SP_QTYPE_AFFINE3, 32, SP_DTYPE_F16, 2, 96), 2 * 36 + 2 * 2 * 3 * 2);
    enum sp_qtype t;
    assert_int_equal(sp_qtype_from_mode("affine", 5, &t), SP_OK);
    assert_int_equal(t, SP_QTYPE_AFFINE5);
    assert_int_equal(sp_qtype_from_mode("mxfp4", 4, &t), SP_OK);
    assert_int_equal(t, SP_QTYPE_MXFP4);
    assert_int_equal(sp_qtype_from_mode("affine", 7, &t), SP_ERR_UNSUPPORTED);
    assert_int_equal(sp_qtype_from_mode("mxfp4", 8, &t), SP_ERR_UNSUPPORTED);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_spec_packing_vectors),   cmocka_unit_test(test_quantizer_packs_lsb_first),
        cmocka_unit_test(test_affine_dequant_hand_vector), cmocka_unit_test(test_affine_rounding_rules),
        cmocka_unit_test(test_affine_all_zero_group),  cmocka_unit_test(test_affine_round_trip_bound),
        cmocka_unit_test(test_mxfp4_exact_round_trip), cmocka_unit_test(test_mxfp4_codes_and_scales),
        cmocka_unit_test(test_e4m3_all_codes),         cmocka_unit_test(test_mxfp8_nvfp4_round_trip),
        cmocka_unit_test(test_float_formats),          cmocka_unit_test(test_shapes_and_sizes),
        cmocka_unit_test(test_q6_k),                   cmocka_unit_test(test_k_quants_against_ggml),
        cmocka_unit_test(test_q2_q3_k),                cmocka_unit_test(test_iq4),
        cmocka_unit_test(test_q4_q5_k),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
