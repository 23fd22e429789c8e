/*
 * matvec_x86.h - the x86 kernel code, compiled once per instruction set by
 * the files that include it (the Makefile gives each file the flags its
 * name says, and kernels.c calls a set only after cpuid said yes):
 *
 *   matvec_avx2.c     AVX2 + FMA + F16C: the sets "avx2" and "avx2f"
 *   matvec_avxvnni.c  the same plus AVX-VNNI: "avxvnni"
 *   matvec_avx512.c   the same plus AVX-512 F/BW/VL/DQ and VNNI: "avx512"
 *   matvec_amx.c      the same plus AMX-TILE and AMX-INT8: "amx"
 *
 * Before including it a file defines KSET_ISA and KSET_NAME (the default
 * set: int8 activations for 4- and 8-bit rows, int16 for MLX's 2, 3, 5
 * and 6-bit rows), KSET_INT16_ISA (its twin "NAME-int16", int16 activations
 * for 4- and 8-bit rows too), optionally KSET_FLOAT_ISA and KSET_FLOAT_NAME (a set with float
 * activations throughout), and KSET_ENTRY, the name of the function that
 * returns a set by its enum value (and whether the CPU has AVX512-BF16,
 * which kernels.c reads from cpuid). The VNNI builds differ in two places:
 * vpdpwssd / vpdpbusd multiply and add into the int32 sums in one
 * instruction where AVX2 needs vpmaddwd / vpmaddubsw and adds; and the
 * avx512 build takes two 64-column units of 4-bit rows per 512-bit
 * instruction in two products: int16 activations, group 32 or 64, whose
 * halves are exactly the two 256-bit accumulator chains of the other builds
 * (zmm_pairs), and int8 activations by groups, whose exact group sums are
 * the same integers however they are added (zmm_group_sums); in the int8
 * product by tokens two blocks of 8 tokens share one vector and a pass
 * takes two such pairs of 8 rows (zmm_block_group_add, zmm_quad_steps); and
 * attention's blocks are 16 lanes wide; the amx build is the avx512 one
 * whose int8 product by tokens takes its integer sums from AMX tiles
 * (amx_groups). Integer sums
 * are exact and every float operation happens in the same order, so the
 * four builds' twin sets give bit-identical results. Measured on a Sapphire Rapids host, 2 threads,
 * 2048 x 2048 (bench/kernels): int16 x 4-bit products of 64 tokens
 * 1.7-1.9x avx2's, decode of mxfp4 rows from DRAM about 1.4x. On a Zen 5
 * (one thread, from cache): one token by groups against avx2's, affine4-g64
 * 768 x 2048 at 1.6x, 2048 x 768 1.3x, mxfp4 1.4-1.5x; 32 tokens by
 * tokens, one pair a pass against the former 256-bit product 1.14-1.35x,
 * two pairs a pass against one 1.2-1.5x; attention's blocks 3.1-3.5x.
 * Everything else stays 256 bits wide.
 *
 * Products of packed weight rows with a batch of n activation vectors:
 *
 * - int8 activations (4- and 8-bit rows: affine4, mxfp4 and affine8, any
 *   n, the default sets): each token is rounded to int8 with one scale per
 *   weight group; codes stay bytes and vpmaddubsw (vpdpbusd) multiplies 32
 *   pairs per instruction with exact sums. Blocks of 8 tokens of 4-bit rows
 *   go by tokens (q8_block_rows: 8 tokens per vector, rows unpacked to
 *   bytes once per 32 tokens), the few left over, and every token of 8-bit
 *   rows, by groups (q8_rows: 8 groups' sums per vector); one summation
 *   order, so the same bits either way.
 * - int16 activations (affine 2, 3, 5 and 6-bit; 4- and 8-bit rows in the
 *   -int16 sets; any n):
 *   each token is rounded to int16 with one scale per weight group, codes
 *   are widened to int16 and vpmaddwd (vpdpwssd) does 16 multiply-adds per
 *   instruction with exact int32 sums; a row is read once and decoded once
 *   per 4 tokens.
 * - fused float (plain floats, and every format in avx2f, n <= 7): each
 *   8-element piece of a row is decoded straight into a register and
 *   multiplied into the accumulators of up to 4 tokens; no float copy of
 *   the row.
 * - blocked float (same formats, n >= 8): 4 rows x 512 columns are decoded
 *   into a small buffer (L1), then a 4-row x 3-token register micro-kernel
 *   (12 FMAs per 7 loads) runs over every token; the 512-column slice of
 *   the activations stays in L2 across row blocks.
 *
 * Every path gives a token the same result whatever else is in the batch.
 * Formats without a fast path here (affine 2/3/5/6, mxfp8, nvfp4, ggml's
 * block formats) go through the blocked float product for any n, their
 * rows decoded with AVX2 (ggml's blocks) or by the scalar reference.
 */
#include "backend/cpu/kernels.h"

#if defined(__x86_64__)

#include <immintrin.h>
#include <math.h>
#include <string.h>

#include "core/half.h"

#define ALWAYS static inline __attribute__((always_inline))

/* madd_acc: acc + the int32 sums of adjacent products of int16 w and x:
 * exact (the products here never reach the one case, -32768 * -32768
 * twice, that vpmaddwd saturates).
 * unit_part: the products of unsigned bytes u0, u1 and signed bytes x0,
 * x1 in partial sums: on AVX2 int16 lane i sums bytes 2i, 2i + 1 of both
 * (4 products), with VNNI int32 lane i bytes 4i..4i + 3 of both (8);
 * exact, as |u| <= 24 and |x| <= 127. add_part adds two such vectors,
 * halves4 takes them on to int32 sums.
 * u8_acc: acc + the products of unsigned bytes u and signed bytes x, in
 * int16 pair sums on AVX2 (exact while few enough are added, see
 * block_group) and int32 sums of 4 with VNNI; u8_widen: such sums as
 * int32 (lane i: bytes 4i..4i+3). */
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
#define HAVE_DPWSSD 1
ALWAYS __m256i madd_acc(__m256i acc, __m256i w, __m256i x) { return _mm256_dpwssd_epi32(acc, w, x); }
ALWAYS __m256i unit_part(__m256i u0, __m256i x0, __m256i u1, __m256i x1) {
    return _mm256_dpbusd_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), u0, x0), u1, x1);
}
ALWAYS __m256i u8_acc(__m256i acc, __m256i u, __m256i x) { return _mm256_dpbusd_epi32(acc, u, x); }
ALWAYS __m256i u8_widen(__m256i s) { return s; }
#elif defined(__AVXVNNI__)
#define HAVE_DPWSSD 1
ALWAYS __m256i madd_acc(__m256i acc, __m256i w, __m256i x) { return _mm256_dpwssd_avx_epi32(acc, w, x); }
ALWAYS __m256i unit_part(__m256i u0, __m256i x0, __m256i u1, __m256i x1) {
    return _mm256_dpbusd_avx_epi32(_mm256_dpbusd_avx_epi32(_mm256_setzero_si256(), u0, x0), u1, x1);
}
ALWAYS __m256i u8_acc(__m256i acc, __m256i u, __m256i x) { return _mm256_dpbusd_avx_epi32(acc, u, x); }
ALWAYS __m256i u8_widen(__m256i s) { return s; }
#else
#define HAVE_DPWSSD 0
ALWAYS __m256i madd_acc(__m256i acc, __m256i w, __m256i x) { return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x)); }
ALWAYS __m256i unit_part(__m256i u0, __m256i x0, __m256i u1, __m256i x1) {
    return _mm256_add_epi16(_mm256_maddubs_epi16(u0, x0), _mm256_maddubs_epi16(u1, x1));
}
ALWAYS __m256i u8_acc(__m256i acc, __m256i u, __m256i x) { return _mm256_add_epi16(acc, _mm256_maddubs_epi16(u, x)); }
ALWAYS __m256i u8_widen(__m256i s) { return _mm256_madd_epi16(s, _mm256_set1_epi16(1)); }
#endif
ALWAYS __m256i add_part(__m256i a, __m256i b) { return HAVE_DPWSSD ? _mm256_add_epi32(a, b) : _mm256_add_epi16(a, b); }

/* The avx512 build also multiplies 4-bit rows of group 32 or 64 two units
 * (128 columns) per 512-bit instruction (zmm_pairs). */
#if HAVE_DPWSSD && defined(__AVX512BW__) && defined(__AVX512DQ__)
#define HAVE_ZMM 1
#else
#define HAVE_ZMM 0
#endif
/* The amx build also computes the int8 product by tokens with AMX tiles
 * (amx_groups). */
#if HAVE_ZMM && defined(__AMX_TILE__) && defined(__AMX_INT8__)
#define HAVE_AMX 1
#else
#define HAVE_AMX 0
#endif

/* Above SP_KERNELS_DECODE_MAX_TOKENS tokens the blocked product is faster
 * than decoding each row once per 4 tokens. */
#define BLOCK_MIN_TOKENS (SP_KERNELS_DECODE_MAX_TOKENS + 1)
#define MR SP_KERNELS_BLOCK_ROWS
#define KC SP_KERNELS_BLOCK_COLS
#define NR 3
/* Rows decoded together in the fused product when n > 4: their packed
 * bytes stay in L1/L2 while each group of 4 tokens passes over them. */
#define FUSED_ROW_CHUNK 8
/* Decode products read their rows as one stream per thread; asking for the
 * bytes ahead of the decoder keeps more reads in flight than the hardware
 * prefetcher alone (measured +7-20% of DRAM throughput on 4- and 8-bit
 * rows, 2 threads). The distance is the one that measured best per kind of
 * row: 4-bit units decode fastest per byte and gain from more (on a Zen 3,
 * 2 KiB +10-20% over 1 KiB; on a Zen 5 VM reading 50-80 GB/s, 8 KiB over
 * 2: decode of 4-layer Qwen3-30B-A3B and Ling-mini-2.0 shapes, 2 threads,
 * median 1.11x the tokens a second in 9 paired runs, 0.93-2.0x, an lm_head's
 * 151936 x 2048 affine4 rows alone 1.05-1.38x; on a Sapphire Rapids Xeon
 * 0.99-1.18x), float and 8-bit rows lose with more than 1 KiB. bf16
 * rows by vdpbf16ps gain from 4 KiB on a Sapphire Rapids VM (the amx set):
 * decode of a 4-layer Qwen3-30B-A3B bf16, 2 threads, 1.03-1.22x the tokens
 * a second in 6 paired runs against 1 KiB (median 1.15x; 2 KiB 1.08x, 8 KiB
 * as 4); the avx512 set, which Zen 4 takes, keeps 1 KiB. */
#define PREFETCH_AHEAD 1024
#define PREFETCH_AHEAD_4BIT 8192

/* FMT_A2 .. FMT_A6: affine codes of 2, 3, 5 or 6 bits, packed as MLX
 * packs them (one LSB-first bit stream a row; GGUF's Q5_0 and Q5_1 are
 * read into affine 5-bit). */
enum fmt { FMT_F32, FMT_BF16, FMT_F16, FMT_A4, FMT_A8, FMT_MX4, FMT_A2, FMT_A3, FMT_A5, FMT_A6 };

ALWAYS bool fmt_grouped(int fmt) { return fmt >= FMT_A4; }
ALWAYS bool fmt_packed(int fmt) { return fmt >= FMT_A2; }
ALWAYS bool fmt_affine(int fmt) { return fmt == FMT_A4 || fmt == FMT_A8 || fmt_packed(fmt); }
ALWAYS int packed_bits(int fmt) { return fmt == FMT_A2 ? 2 : fmt == FMT_A3 ? 3 : fmt == FMT_A5 ? 5 : 6; }

/* Packed codes as integers. A code of b bits starting at stream bit i b
 * lies within the 16 bits from byte i b / 8 on (i b % 8 + b <= 13). */
#define PK_WIN(B, i) (uint8_t)((i) * (B) / 8), (uint8_t)((i) * (B) / 8 + 1)
#define PK_WINS(B)                                                                                            \
    {PK_WIN(B, 0), PK_WIN(B, 1), PK_WIN(B, 2),  PK_WIN(B, 3),  PK_WIN(B, 4),  PK_WIN(B, 5),  PK_WIN(B, 6),  \
     PK_WIN(B, 7), PK_WIN(B, 8), PK_WIN(B, 9), PK_WIN(B, 10), PK_WIN(B, 11), PK_WIN(B, 12), PK_WIN(B, 13), \
     PK_WIN(B, 14), PK_WIN(B, 15)}
/* vpshufb masks: int16 lane i of 16 codes gets the two bytes holding code i */
static const uint8_t pk_windows[4][32] __attribute__((aligned(32))) = {PK_WINS(2), PK_WINS(3), PK_WINS(5), PK_WINS(6)};
#if HAVE_ZMM
#define PK_SHIFT(B, i) (int16_t)((i) * (B) % 8)
#else  // a left shift by 8 - s as a product, then 8 right
#define PK_SHIFT(B, i) (int16_t)(1 << (8 - (i) * (B) % 8))
#endif
#define PK_SHIFTS(B)                                                                                          \
    {PK_SHIFT(B, 0), PK_SHIFT(B, 1), PK_SHIFT(B, 2),   PK_SHIFT(B, 3),   PK_SHIFT(B, 4),   PK_SHIFT(B, 5),   \
     PK_SHIFT(B, 6), PK_SHIFT(B, 7), PK_SHIFT(B, 8),   PK_SHIFT(B, 9),   PK_SHIFT(B, 10),  PK_SHIFT(B, 11),  \
     PK_SHIFT(B, 12), PK_SHIFT(B, 13), PK_SHIFT(B, 14), PK_SHIFT(B, 15)}
static const int16_t pk_shifts[4][16] __attribute__((aligned(32))) = {PK_SHIFTS(2), PK_SHIFTS(3), PK_SHIFTS(5), PK_SHIFTS(6)};
#undef PK_SHIFTS
#undef PK_SHIFT
#undef PK_WINS
#undef PK_WIN
ALWAYS int packed_index(int bits) { return bits == 2 ? 0 : bits == 3 ? 1 : bits == 5 ? 2 : 3; }

/* 16 codes of `bits` bits from the first 2 bits bytes of v, as int16. */
ALWAYS __m256i packed16(int bits, __m128i v) {
    const int i = packed_index(bits);
    __m256i w = _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(v), _mm256_load_si256((const __m256i *)(const void *)pk_windows[i]));
    __m256i k = _mm256_load_si256((const __m256i *)(const void *)pk_shifts[i]);
#if HAVE_ZMM
    w = _mm256_srlv_epi16(w, k);
#else
    w = _mm256_srli_epi16(_mm256_mullo_epi16(w, k), 8);
#endif
    return _mm256_and_si256(w, _mm256_set1_epi16((int16_t)((1 << bits) - 1)));
}

/* The 32 codes (4 bits bytes) at p as two vectors of 16 int16, reading no
 * byte past them. */
ALWAYS void packed32(int bits, const uint8_t *p, __m256i *w0, __m256i *w1) {
    uint32_t u;
    __m128i lo, hi;
    switch (bits) {
    case 2:
        lo = _mm_loadl_epi64((const __m128i *)(const void *)p);
        *w0 = packed16(2, lo);
        *w1 = packed16(2, _mm_srli_si128(lo, 4));
        return;
    case 3:
        memcpy(&u, p + 8, 4);
        lo = _mm_insert_epi32(_mm_loadl_epi64((const __m128i *)(const void *)p), (int)u, 2);
        *w0 = packed16(3, lo);
        *w1 = packed16(3, _mm_srli_si128(lo, 6));
        return;
    case 5:
        memcpy(&u, p + 16, 4);
        lo = _mm_loadu_si128((const __m128i *)(const void *)p);
        hi = _mm_cvtsi32_si128((int)u);
        *w0 = packed16(5, lo);
        *w1 = packed16(5, _mm_alignr_epi8(hi, lo, 10));
        return;
    default:
        lo = _mm_loadu_si128((const __m128i *)(const void *)p);
        hi = _mm_loadl_epi64((const __m128i *)(const void *)(p + 16));
        *w0 = packed16(6, lo);
        *w1 = packed16(6, _mm_alignr_epi8(hi, lo, 12));
        return;
    }
}

ALWAYS float hsum(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* The largest of v's 8 lanes (none NaN). */
ALWAYS float hmax(__m256 v) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
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
    } else if (fmt_affine(fmt)) {
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
    if (fmt_packed(fmt)) {
        /* the 8 codes are `bits` bytes: qword j from code 2j on, lane 2j + h code 2j + h */
        const int bits = packed_bits(fmt);
        uint64_t u = 0;
        memcpy(&u, c + k * bits / 8, (size_t)bits);
        __m256i q = _mm256_srlv_epi64(_mm256_set1_epi64x((long long)u), _mm256_setr_epi64x(0, 2 * bits, 4 * bits, 6 * bits));
        q = _mm256_srlv_epi32(_mm256_shuffle_epi32(q, 0xa0), _mm256_setr_epi32(0, bits, 0, bits, 0, bits, 0, bits));
        q = _mm256_and_si256(q, _mm256_set1_epi32((1 << bits) - 1));
        return _mm256_fmadd_ps(_mm256_cvtepi32_ps(q), s, b);
    }
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

/* Byte offset of column k in a row of codes. */
ALWAYS int64_t code_offset(int fmt, int64_t k) {
    if (fmt_packed(fmt)) return k * packed_bits(fmt) / 8;  // k a multiple of 8
    switch (fmt) {
    case FMT_F32:
        return 4 * k;
    case FMT_BF16:
    case FMT_F16:
        return 2 * k;
    case FMT_A8:
        return k;
    default:  // 4-bit codes
        return k / 2;
    }
}

/* One weight of a plain-float row (tails of rows whose length is not a
 * multiple of 8). */
ALWAYS float load_plain(int fmt, const uint8_t *c, int64_t k) {
    return load_scale(fmt == FMT_F32 ? SP_DTYPE_F32 : fmt == FMT_BF16 ? SP_DTYPE_BF16 : SP_DTYPE_F16, c, k);
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

/* ---- float products: one summation order per token ----
 *
 * The server needs a token's logits to be bit-identical whatever else is in
 * its batch (chunked prefill = one batch = token by token), so the fused
 * and the blocked float products sum in the same order: for each KC-column
 * slice, CH chains of 8 lanes, chain c taking the 8-column pieces that
 * start at k with (k / 8) % CH == c in column order; the slice sum is
 * hsum((c0 + c1) + (c2 + c3)) plus the < 8 leftover columns one by one, and
 * the slice sums are added to the output in slice order starting from 0.
 * Four chains hide the FMA latency (4 cycles) of a single token. */
#define CH 4

/* Sum of one slice's chains and its leftover columns. */
ALWAYS float slice_sum(const __m256 acc[CH], const float *w, const float *x, int64_t n_left) {
    float sum = hsum(_mm256_add_ps(_mm256_add_ps(acc[0], acc[1]), _mm256_add_ps(acc[2], acc[3])));
    for (int64_t k = 0; k < n_left; k++) sum += w[k] * x[k];
    return sum;
}

/* ---- fused product: rows [r0, r1) with NT tokens (1 to 4) ---- */

/* Chains [c0, c0 + nc) of the slice at column k0 (k8 whole pieces) of one
 * row, for nt tokens: acc[t][c]. */
ALWAYS void fused_chains(int fmt, int sdt, int64_t group, const uint8_t *c, const uint8_t *sc, const uint8_t *bi,
                         int64_t k0, int64_t k8, const float *x, int64_t ldx, int nt, int c0, int nc,
                         __m256 acc[4][CH]) {
    __m256 s = _mm256_setzero_ps(), b = _mm256_setzero_ps();
    for (int64_t k = 0; k < k8; k += 8 * CH) {
        /* quantized slices start on a group boundary; groups are >= 32 wide,
         * so a round of CH pieces never straddles two */
        if (fmt_grouped(fmt) && (k & (group - 1)) == 0) group_params(fmt, sdt, sc, bi, (k0 + k) / group, &s, &b);
        _mm_prefetch((const char *)c + code_offset(fmt, k0 + k) + PREFETCH_AHEAD, _MM_HINT_T0);
#pragma GCC unroll 4
        for (int ci = c0; ci < c0 + nc; ci++) {
            int64_t kk = k + 8 * ci;
            if (kk >= k8) break;
            __m256 wv = decode8(fmt, c, k0 + kk, s, b);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) acc[t][ci] = _mm256_fmadd_ps(wv, _mm256_loadu_ps(x + t * ldx + k0 + kk), acc[t][ci]);
        }
    }
}

ALWAYS void fused_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y,
                       int64_t ldy, int fmt, int sdt, int nt) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)r * f.row_bytes;
        const uint8_t *sc = fmt_grouped(fmt) ? (const uint8_t *)w->scales + (size_t)r * f.scale_row_bytes : NULL;
        const uint8_t *bi = fmt_affine(fmt) ? (const uint8_t *)w->biases + (size_t)r * f.scale_row_bytes : NULL;
        float tot[4] = {0};
        for (int64_t k0 = 0; k0 < f.cols; k0 += KC) {
            int64_t kn = f.cols - k0 < KC ? f.cols - k0 : KC, k8 = kn & ~(int64_t)7;
            __m256 acc[4][CH];
#pragma GCC unroll 4
            for (int t = 0; t < 4; t++)
#pragma GCC unroll 4
                for (int ci = 0; ci < CH; ci++) acc[t][ci] = _mm256_setzero_ps();
            /* up to 8 accumulators live at once: 1-2 tokens take all chains
             * in one pass over the slice, 3-4 tokens two chains per pass */
            if (nt <= 2) {
                fused_chains(fmt, sdt, f.group, c, sc, bi, k0, k8, x, ldx, nt, 0, CH, acc);
            } else {
                fused_chains(fmt, sdt, f.group, c, sc, bi, k0, k8, x, ldx, nt, 0, CH / 2, acc);
                fused_chains(fmt, sdt, f.group, c, sc, bi, k0, k8, x, ldx, nt, CH / 2, CH / 2, acc);
            }
            /* leftover columns of a plain row, as floats (like the blocked buffer) */
            float wt[8];
            for (int64_t i = k8; i < kn; i++) wt[i - k8] = load_plain(fmt, c, k0 + i);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) tot[t] += slice_sum(acc[t], wt, x + t * ldx + k0 + k8, kn - k8);
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) y[t * ldy + r] = tot[t];
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
 * i < mr rows of the decoded block (KC floats apart) and j < nr tokens:
 * one chain at a time over the whole slice (the fused product's order). */
ALWAYS void micro(const float *wb, const float *x, int64_t ldx, int64_t kn, float *y, int64_t ldy, int mr, int nr) {
    __m256 part[MR][NR][CH];
    int64_t k8 = kn & ~(int64_t)7;
#pragma GCC unroll 4
    for (int ci = 0; ci < CH; ci++) {
        __m256 acc[MR][NR];
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) acc[i][j] = _mm256_setzero_ps();
        for (int64_t k = 8 * ci; k < k8; k += 8 * CH) {
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
#pragma GCC unroll 4
        for (int i = 0; i < mr; i++)
#pragma GCC unroll 4
            for (int j = 0; j < nr; j++) part[i][j][ci] = acc[i][j];
    }
    for (int i = 0; i < mr; i++)
        for (int j = 0; j < nr; j++) y[j * ldy + i] += slice_sum(part[i][j], wb + i * KC + k8, x + j * ldx + k8, kn - k8);
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

/* 32 int8 values times a scale for the first 16 and another for the last
 * 16, as floats into out[0 .. 32). */
ALWAYS void scaled_bytes(__m256i q, __m256 s0, __m256 s1, float *out) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    _mm256_storeu_ps(out, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo))));
    _mm256_storeu_ps(out + 8, _mm256_mul_ps(s0, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(lo, 8)))));
    _mm256_storeu_ps(out + 16, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi))));
    _mm256_storeu_ps(out + 24, _mm256_mul_ps(s1, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(hi, 8)))));
}

/* The same for 32 values each s x q - m (Q2_K's two roundings: the product, then the min). */
ALWAYS void scaled_min_bytes(__m256i q, __m256 s0, __m256 m0, __m256 s1, __m256 m1, float *out) {
    __m128i lo = _mm256_castsi256_si128(q), hi = _mm256_extracti128_si256(q, 1);
    __m128i part[4] = {lo, _mm_srli_si128(lo, 8), hi, _mm_srli_si128(hi, 8)};
    for (int i = 0; i < 4; i++) {
        __m256 v = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(part[i]));
        _mm256_storeu_ps(out + 8 * i, _mm256_sub_ps(_mm256_mul_ps(i < 2 ? s0 : s1, v), i < 2 ? m0 : m1));
    }
}

/* 16 int8 scales times d into ds[0 .. 16). */
ALWAYS void times_d(__m128i sc, float d, float *ds) {
    __m256 vd = _mm256_set1_ps(d);
    _mm256_storeu_ps(ds, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(sc))));
    _mm256_storeu_ps(ds + 8, _mm256_mul_ps(vd, _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(sc, 8)))));
}

/* Bits 2 k .. 2 k + 1 of each byte of v (k < 4). */
ALWAYS __m256i bit_pair(__m256i v, int k) {
    return _mm256_and_si256(_mm256_srl_epi16(v, _mm_cvtsi32_si128(2 * k)), _mm256_set1_epi8(3));
}

/* The codes and scales of ggml's blocks as bytes, for the float decoders
 * below and the int8 products (bq_*): each layout written once. */

/* Q3_K's codes of run k (0..3) of half h as unsigned bytes 0..7 (the
 * value's q + 4): the low bits from qs (that half's 32 bytes), the high bit
 * at bit 4 h + k of hmask hm. */
ALWAYS __m256i q3_k_codes(__m256i qs, __m256i hm, int h, int k) {
    __m256i high = _mm256_and_si256(_mm256_srl_epi16(hm, _mm_cvtsi32_si128(4 * h + k)), _mm256_set1_epi8(1));
    return _mm256_or_si256(bit_pair(qs, k), _mm256_slli_epi16(high, 2));
}

/* Q3_K's 16 6-bit scales less 32 (quant/qtype.c's q3_k_scale) as int8: the low nibbles
 * of bytes 96..103, then their high nibbles, bits 2 (j / 4) of byte 104 + j
 * % 4 on top. */
ALWAYS __m128i q3_k_scales(const uint8_t *b) {
    uint64_t lo;
    uint32_t hi;
    memcpy(&lo, b + 96, 8);
    memcpy(&hi, b + 104, 4);
    __m128i l4 = _mm_set_epi64x((long long)(lo >> 4 & 0x0f0f0f0f0f0f0f0fu), (long long)(lo & 0x0f0f0f0f0f0f0f0fu));
    __m128i h2 = _mm_setr_epi32((int)(hi & 0x03030303u), (int)(hi >> 2 & 0x03030303u), (int)(hi >> 4 & 0x03030303u),
                                (int)(hi >> 6 & 0x03030303u));
    return _mm_sub_epi8(_mm_or_si128(l4, _mm_slli_epi16(h2, 4)), _mm_set1_epi8(32));
}

/* Q4_K / Q5_K's codes of the 32 g: nibble g % 2 of qs[32 (g / 2) ..] (qs
 * the block's codes), Q5_K's fifth bit at bit g of qh. */
ALWAYS __m256i k4_codes(const uint8_t *qs, __m256i qh, bool five, int g) {
    __m256i c = _mm256_loadu_si256((const __m256i *)(const void *)(qs + 32 * (g / 2)));
    __m256i q = _mm256_and_si256(g % 2 ? _mm256_srli_epi16(c, 4) : c, _mm256_set1_epi8(15));
    if (five)
        q = _mm256_or_si256(q, _mm256_slli_epi16(_mm256_and_si256(_mm256_srl_epi16(qh, _mm_cvtsi32_si128(g)),
                                                                  _mm256_set1_epi8(1)), 4));
    return q;
}

/* Q4_K / Q5_K's 8 6-bit scales (*sc) and mins (*mn) as bytes 0..7
 * (quant/qtype.c's k4_scale_min), from the 12 bytes at b + 4, 4 to a word. */
ALWAYS void k4_scales_mins(const uint8_t *b, __m128i *sc, __m128i *mn) {
    uint32_t w0, w1, w2;  // three words (not an array, which went through the stack)
    memcpy(&w0, b + 4, 4);
    memcpy(&w1, b + 8, 4);
    memcpy(&w2, b + 12, 4);
    uint32_t s_lo = w0 & 0x3f3f3f3fu, s_hi = (w2 & 0x0f0f0f0fu) | (w0 >> 6 & 0x03030303u) << 4;
    uint32_t m_lo = w1 & 0x3f3f3f3fu, m_hi = (w2 >> 4 & 0x0f0f0f0fu) | (w1 >> 6 & 0x03030303u) << 4;
    *sc = _mm_setr_epi32((int)s_lo, (int)s_hi, 0, 0);
    *mn = _mm_setr_epi32((int)m_lo, (int)m_hi, 0, 0);
}

/* Q6_K's codes (0..63, the value's q + 32) of runs 0..3 of half h:
 * element l + 32 k has its low bits in a nibble of ql[l + 32 (k % 2)] (the
 * high one for k >= 2) and its high bits at bit 2 k of qh[l]. */
ALWAYS void q6_k_codes(const uint8_t *b, int h, __m256i q[4]) {
    const __m256i m4 = _mm256_set1_epi8(15);
    const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
    __m256i la = _mm256_loadu_si256((const __m256i *)(const void *)ql);
    __m256i lb = _mm256_loadu_si256((const __m256i *)(const void *)(ql + 32));
    __m256i hb = _mm256_loadu_si256((const __m256i *)(const void *)qh);
    q[0] = _mm256_or_si256(_mm256_and_si256(la, m4), _mm256_slli_epi16(bit_pair(hb, 0), 4));
    q[1] = _mm256_or_si256(_mm256_and_si256(lb, m4), _mm256_slli_epi16(bit_pair(hb, 1), 4));
    q[2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(la, 4), m4), _mm256_slli_epi16(bit_pair(hb, 2), 4));
    q[3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(lb, 4), m4), _mm256_slli_epi16(bit_pair(hb, 3), 4));
}

/* 16 bytes of IQ4 codes (element j: low nibble of byte j, j + 16 high) as
 * 32 signed table values. */
ALWAYS __m256i iq4_values(const uint8_t *qs) {
    const __m128i table = _mm_loadu_si128((const __m128i *)(const void *)sp_iq4_values), m4 = _mm_set1_epi8(15);
    __m128i c = _mm_loadu_si128((const __m128i *)(const void *)qs);
    return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_shuffle_epi8(table, _mm_and_si128(c, m4))),
                                   _mm_shuffle_epi8(table, _mm_and_si128(_mm_srli_epi16(c, 4), m4)), 1);
}

/* IQ4_XS's 8 6-bit scales less 32 (quant/qtype.c's iq4_xs_scale) as int8: nibble i % 2
 * of byte 4 + i / 2, bits 2 i of the 16 at byte 2 on top. */
ALWAYS __m128i iq4_xs_scales(const uint8_t *b) {
    uint32_t lo;
    uint16_t hi;
    memcpy(&lo, b + 4, 4);
    memcpy(&hi, b + 2, 2);
    uint64_t h2 = 0;
    for (int i = 0; i < 8; i++) h2 |= (uint64_t)(hi >> (2 * i) & 3u) << (8 * i + 4);
    __m128i l4 = _mm_unpacklo_epi8(_mm_cvtsi32_si128((int)(lo & 0x0f0f0f0fu)), _mm_cvtsi32_si128((int)(lo >> 4 & 0x0f0f0f0fu)));
    return _mm_sub_epi8(_mm_or_si128(l4, _mm_cvtsi64_si128((long long)h2)), _mm_set1_epi8(32));
}

/* Q2_K and Q3_K as quant/qtype.c's references decode them (element l + 32 k
 * of each 128: bits 2 k of qs[l]; Q3_K's high bit at bit 4 h + k of
 * hmask[l]), 32 codes a step, for columns [k0, k0 + kn) of row r. */
static void dequant_q2_k(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 256) * 84;
    for (int64_t e = 0; e < kn; e += 256, b += 84, out += 256) {
        uint16_t dh, mh;
        memcpy(&dh, b + 80, 2);
        memcpy(&mh, b + 82, 2);
        float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh), dl[16], ml[16];
        for (int j = 0; j < 16; j++) dl[j] = d * (float)(b[j] & 15u), ml[j] = dmin * (float)(b[j] >> 4);
        for (int h = 0; h < 2; h++) {
            __m256i qs = _mm256_loadu_si256((const __m256i *)(const void *)(b + 16 + 32 * h));
            for (int k = 0; k < 4; k++) {
                int j = 8 * h + 2 * k;
                scaled_min_bytes(bit_pair(qs, k), _mm256_set1_ps(dl[j]), _mm256_set1_ps(ml[j]),
                                 _mm256_set1_ps(dl[j + 1]), _mm256_set1_ps(ml[j + 1]), out + 128 * h + 32 * k);
            }
        }
    }
}

static void dequant_q3_k(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 256) * 110;
    const __m256i four = _mm256_set1_epi8(4);
    for (int64_t e = 0; e < kn; e += 256, b += 110, out += 256) {
        uint16_t dh;
        memcpy(&dh, b + 108, 2);
        float ds[16];
        times_d(q3_k_scales(b), sp_f16_to_f32(dh), ds);
        __m256i hm = _mm256_loadu_si256((const __m256i *)(const void *)b);
        for (int h = 0; h < 2; h++) {
            __m256i qs = _mm256_loadu_si256((const __m256i *)(const void *)(b + 32 + 32 * h));
            for (int k = 0; k < 4; k++) {
                __m256i q = _mm256_sub_epi8(q3_k_codes(qs, hm, h, k), four);
                scaled_bytes(q, _mm256_set1_ps(ds[8 * h + 2 * k]), _mm256_set1_ps(ds[8 * h + 2 * k + 1]),
                             out + 128 * h + 32 * k);
            }
        }
    }
}

/* 16 bytes of IQ4 codes as 32 table values, times dl. */
ALWAYS void iq4_run(const uint8_t *qs, float dl, float *out) {
    __m256 s = _mm256_set1_ps(dl);
    scaled_bytes(iq4_values(qs), s, s, out);
}

static void dequant_iq4_nl(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 32) * 18;
    for (int64_t e = 0; e < kn; e += 32, b += 18, out += 32) {
        uint16_t dh;
        memcpy(&dh, b, 2);
        iq4_run(b + 2, sp_f16_to_f32(dh), out);
    }
}

static void dequant_iq4_xs(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 256) * 136;
    for (int64_t e = 0; e < kn; e += 256, b += 136, out += 256) {
        uint16_t dh;
        memcpy(&dh, b, 2);
        float d = sp_f16_to_f32(dh);
        int8_t sc[16];
        _mm_storeu_si128((__m128i *)(void *)sc, iq4_xs_scales(b));
        for (int i = 0; i < 8; i++) iq4_run(b + 8 + 16 * i, d * (float)sc[i], out + 32 * i);
    }
}

/* Q4_K and Q5_K as the reference decodes them ((d sc) q - (dmin m) a
 * 32), 64 codes a step: each 32 bytes of qs hold two 32s, the first in
 * their low nibbles; Q5_K's fifth bit of 32 g at bit g of qh[l]. */
static void dequant_k4(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out, bool five) {
    const size_t bb = five ? 176 : 144;
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 256) * bb;
    for (int64_t e = 0; e < kn; e += 256, b += bb, out += 256) {
        uint16_t dh, mh;
        memcpy(&dh, b, 2);
        memcpy(&mh, b + 2, 2);
        float d = sp_f16_to_f32(dh), dmin = sp_f16_to_f32(mh);
        __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(const void *)(b + 16)) : _mm256_setzero_si256();
        const uint8_t *qs = b + (five ? 48 : 16);
        __m128i scv, mnv;
        k4_scales_mins(b, &scv, &mnv);
        uint8_t sc[16], mn[16];
        _mm_storeu_si128((__m128i *)(void *)sc, scv);
        _mm_storeu_si128((__m128i *)(void *)mn, mnv);
        for (int g = 0; g < 8; g++) {
            __m256 vs = _mm256_set1_ps(d * (float)sc[g]), vm = _mm256_set1_ps(dmin * (float)mn[g]);
            scaled_min_bytes(k4_codes(qs, qh, five, g), vs, vm, vs, vm, out + 32 * g);
        }
    }
}
static void dequant_q4_k(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    dequant_k4(w, r, k0, kn, out, false);
}
static void dequant_q5_k(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    dequant_k4(w, r, k0, kn, out, true);
}

/* Columns [k0, k0 + kn) of row r of a Q6_K matrix (whole blocks), the
 * values quant/qtype.c's reference gives ((d x scale) x (code - 32)),
 * 32 codes a step: element l + 32 k of each 128 has its low bits in a
 * nibble of ql[l + 32 (k % 2)] (the high one for k >= 2) and its high bits
 * at bit 2 k of qh[l]. */
static void dequant_q6_k(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols) +
                       (size_t)(k0 / 256) * 210;
    const __m256i c32 = _mm256_set1_epi8(32);
    for (int64_t e = 0; e < kn; e += 256, b += 210, out += 256) {
        uint16_t dh;
        memcpy(&dh, b + 208, 2);
        float ds[16];
        times_d(_mm_loadu_si128((const __m128i *)(const void *)(b + 192)), sp_f16_to_f32(dh), ds);
        for (int h = 0; h < 2; h++) {
            __m256i q[4];
            q6_k_codes(b, h, q);
            for (int k = 0; k < 4; k++)
                scaled_bytes(_mm256_sub_epi8(q[k], c32), _mm256_set1_ps(ds[8 * h + 2 * k]),
                             _mm256_set1_ps(ds[8 * h + 2 * k + 1]), out + 128 * h + 32 * k);
        }
    }
}

/* Asks for the packed bytes of columns [k0, k0 + kn) of rows [r, r1) (a
 * row block's slice, about to be decoded) to be brought into the cache. */
static void prefetch_block(const struct sp_qmat *w, int64_t r, int64_t r1, int64_t k0, int64_t kn) {
    size_t rb = sp_qtype_row_bytes(w->type, w->cols);
    size_t lo = (size_t)k0 * rb / (size_t)w->cols, hi = (size_t)(k0 + kn) * rb / (size_t)w->cols;
    for (; r < r1; r++)
        for (size_t o = lo; o < hi; o += 64) _mm_prefetch((const char *)w->codes + (size_t)r * rb + o, _MM_HINT_T0);
}

/* Tokens per pass of the row blocks over a column slice: their slice of
 * activations (TB x KC floats, 192 KiB) fits in L2. */
#define TB 96

/* Column slices outermost, then blocks of TB tokens, whose slice of
 * activations every row block of the range reuses while it sits in L2 (a
 * row block is decoded again for each token block; with all tokens at
 * once, a 512-token slice of 1 MiB came from L3 for every row block: Zen
 * 3, one thread, a 128 x 2048 affine8 router times 512 tokens, 1.15x
 * faster in the median of 12 paired runs, 0.88-1.57). The next row block's
 * bytes are requested while the current one is multiplied, so that
 * decoding it does not wait for memory. Each output sums in the same order
 * as before. */
static void blocked_rows(const struct sp_qmat *w, dequant_fn dq, int64_t r0, int64_t r1, const float *x,
                         int64_t ldx, int64_t n, float *y, int64_t ldy, float *buf) {
    _Static_assert(TB % NR == 0, "whole micro-kernel calls per token block");
    for (int64_t t = 0; t < n; t++) memset(y + t * ldy + r0, 0, (size_t)(r1 - r0) * sizeof(float));
    for (int64_t k0 = 0; k0 < w->cols; k0 += KC) {
        int64_t kn = w->cols - k0 < KC ? w->cols - k0 : KC;
        for (int64_t t0 = 0; t0 < n; t0 += TB) {
            int64_t t1 = n - t0 < TB ? n : t0 + TB;
            for (int64_t rb = r0; rb < r1; rb += MR) {
                int mr = r1 - rb < MR ? (int)(r1 - rb) : MR;
                for (int i = 0; i < mr; i++) dq(w, rb + i, k0, kn, buf + i * KC);
                prefetch_block(w, rb + MR, r1 - rb - MR < MR ? r1 : rb + 2 * MR, k0, kn);
                for (int64_t t = t0; t < t1; t += NR) {
                    int nr = t1 - t < NR ? (int)(t1 - t) : NR;
                    micros[mr - 1][nr - 1](buf, x + t * ldx + k0, ldx, kn, y + t * ldy + rb, ldy);
                }
            }
        }
    }
}

/* ---- decode product with int16 activations (4- and 8-bit codes) ---- */

/* For 4- and 8-bit codes the float product spends most of its time turning
 * codes into floats. Instead each token's activations are quantized once
 * per call to int16 with one float scale dx per weight group (affine: 32,
 * 64 or 128 columns; mxfp4: 32), dx = amax / 32767 (error <= dx / 2 per
 * element, ~1.5e-5 of the group's largest value); codes are widened to
 * int16 and vpmaddwd multiplies 16 pairs and adds adjacent products into 8
 * int32 in one instruction. A group's int32 sums are exact, so a group
 * costs one conversion and one FMA per token, with a multiplier ds =
 * (weight scale) x dx made for each row beforehand, 8 groups per vector op.
 * The only new error is the rounding of x. The affine bias term
 * b * sum(x) uses the float activations.
 *
 * 4-bit codes: byte j of a row holds elements 2j (low nibble) and 2j + 1
 * (high nibble), so 16-bit word k holds elements 4k .. 4k + 3 at bits 0, 4,
 * 8 and 12. A 32-byte load covers 64 columns (a "unit"); "& 0xf" after
 * shifts of 0, 4, 8 and 12 bits gives four vectors of 16 int16 codes,
 * vector j holding elements 4k + j, with no widening step. The int16
 * activations of each unit are stored in that order (j * 16 + k holds
 * column 4k + j), and the int32 sums of a unit hold columns 0..31 in lanes
 * 0-3 and 32..63 in lanes 4-7. A last 32-column block (cols / 32 odd) is
 * widened from 16 bytes: "& 0xf" and ">> 4" give its even and odd
 * elements, and its activations are stored evens first, then odds. */

#define QB 32  // columns decoded at a time: two vectors of 16 int16
#define MX4_CODE_SCALE (1.0f / 512.0f)  // mxfp4 codes as int16 are 512 * e2m1
#define Q16_TOKENS SP_KERNELS_Q16_TOKENS  // tokens rounded to int16 at a time

/* A batch of tokens rounded to int16 (q16_prepare). */
struct qacts {
    const void *xq;     // (n, cols) int16, in the order the product reads them
    const float *dx;    // (n, ng): scale of each group of x
    const float *xsum;  // (n, ng): float sum of x over each group
    float *ds;          // (4, ng): one row's multipliers for up to 4 tokens
    int64_t cols, ng;
    bool paired;        // int16: 4-bit units stored in pairs (unit_at)
};

/* Token t's int16 activations. */
ALWAYS const int16_t *xq16(const struct qacts *q, int t) { return (const int16_t *)q->xq + t * q->cols; }

/* The largest |x| of a group of x (group a multiple of 8); *sum (unless
 * NULL) gets the float sum of the group. */
ALWAYS float group_amax(const float *xg, int64_t group, float *sum) {
    const __m256 absmask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
    __m256 m = _mm256_setzero_ps(), s = _mm256_setzero_ps();
    for (int64_t k = 0; k < group; k += 8) {
        __m256 v = _mm256_loadu_ps(xg + k);
        m = _mm256_max_ps(m, _mm256_and_ps(v, absmask));
        if (sum) s = _mm256_add_ps(s, v);
    }
    if (sum) *sum = hsum(s);
    return hmax(m);
}

/* Where vector j (16 int16, j < 4) of 4-bit unit u's activations starts in
 * a token's row: unit by unit (u * 64 + j * 16), or, where the product
 * takes two units per 512-bit load (q->paired), units 2p and 2p + 1
 * interleaved 16 int16 at a time (p * 128 + j * 32 + (u & 1) * 16) and a
 * last odd unit as usual. The stride between a unit's vectors goes to *js. */
ALWAYS int64_t unit_at(bool paired, int64_t cols, int64_t u, int64_t *js) {
    bool in_pair = HAVE_ZMM && paired && (u | 1) < cols / 64;
    *js = in_pair ? 32 : 16;
    return in_pair ? (u / 2) * 128 + (u & 1) * 16 : u * 64;
}

/* Splits 32 int16 (a = elements 0..15, b = 16..31) into evens and odds. */
ALWAYS void deinterleave16(__m256i a, __m256i b, __m256i *ev, __m256i *od) {
    /* within each 128-bit lane: words 0,2,4,6 to the low 8 bytes, 1,3,5,7 high */
    const __m256i sh = _mm256_setr_epi8(0, 1, 4, 5, 8, 9, 12, 13, 2, 3, 6, 7, 10, 11, 14, 15, 0, 1, 4, 5, 8, 9, 12,
                                        13, 2, 3, 6, 7, 10, 11, 14, 15);
    a = _mm256_shuffle_epi8(a, sh);
    b = _mm256_shuffle_epi8(b, sh);
    /* lanes now hold [e0 o0 | e1 o1] and [e2 o2 | e3 o3] (64-bit halves);
     * unpack pairs the halves across a and b, the permute restores order */
    *ev = _mm256_permute4x64_epi64(_mm256_unpacklo_epi64(a, b), 0xD8);
    *od = _mm256_permute4x64_epi64(_mm256_unpackhi_epi64(a, b), 0xD8);
}

/* 4 x 4 transpose of floats within each 128-bit lane. */
ALWAYS void transpose4_lanes(__m256 r[4]) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    r[0] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
    r[1] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t0), _mm256_castps_pd(t2)));
    r[2] = _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
    r[3] = _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(t1), _mm256_castps_pd(t3)));
}

/* 32 floats (4k + j for k < 8) as int32, one vector per j: the columns of a
 * half unit in quad order. */
ALWAYS void quad_quantize(const float *x, __m256 inv, __m256i out[4]) {
    __m256 f0 = _mm256_loadu_ps(x), f1 = _mm256_loadu_ps(x + 8), f2 = _mm256_loadu_ps(x + 16),
           f3 = _mm256_loadu_ps(x + 24);
    /* rows of 4 (k = 0..3 in the low lanes, 4..7 in the high lanes), then columns */
    __m256 r[4] = {_mm256_permute2f128_ps(f0, f2, 0x20), _mm256_permute2f128_ps(f0, f2, 0x31),
                   _mm256_permute2f128_ps(f1, f3, 0x20), _mm256_permute2f128_ps(f1, f3, 0x31)};
    transpose4_lanes(r);
    for (int j = 0; j < 4; j++) out[j] = _mm256_cvtps_epi32(_mm256_mul_ps(r[j], inv));  // nearest even
}

/* Quantizes n tokens of x into scratch as int16 (struct qacts; group 32,
 * 64 or 128 columns per scale; 4-bit codes: units in quad order). */
static void q16_prepare(const float *x, int64_t ldx, int64_t n, int64_t cols, int64_t group, bool four_bit,
                        void *scratch, struct qacts *q) {
    int64_t ng = cols / group, units = four_bit ? cols / 64 : 0;
    bool paired = HAVE_ZMM && group <= 64 && units >= 2;
    int16_t *xq = scratch;
    float *dx = (float *)(void *)(xq + n * cols), *xsum = dx + n * ng, *ds = xsum + n * ng;
    float *inv = ds;  // per token, until the rows make their multipliers there
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * ldx;
        int16_t *ot = xq + t * cols;
        for (int64_t g = 0; g < ng; g++) {
            float amax = group_amax(xt + g * group, group, xsum + t * ng + g);
            dx[t * ng + g] = amax / 32767.0f;
            inv[g] = amax > 0.0f ? 32767.0f / amax : 0.0f;
        }
        for (int64_t u = 0; u < units; u++) {
            __m256i lo[4], hi[4];
            quad_quantize(xt + u * 64, _mm256_set1_ps(inv[u * 64 / group]), lo);
            quad_quantize(xt + u * 64 + 32, _mm256_set1_ps(inv[(u * 64 + 32) / group]), hi);
            /* packs works per 128-bit lane; the permute puts words in order */
            int64_t js, at = unit_at(paired, cols, u, &js);
            for (int j = 0; j < 4; j++)
                _mm256_storeu_si256((__m256i *)(void *)(ot + at + j * js),
                                    _mm256_permute4x64_epi64(_mm256_packs_epi32(lo[j], hi[j]), 0xD8));
        }
        for (int64_t b = units * 64; b < cols; b += QB) {
            __m256 iv = _mm256_set1_ps(inv[b / group]);
            __m256i i32[4];
            for (int j = 0; j < 4; j++) i32[j] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xt + b + 8 * j), iv));
            __m256i lo = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[0], i32[1]), 0xD8);
            __m256i hi = _mm256_permute4x64_epi64(_mm256_packs_epi32(i32[2], i32[3]), 0xD8);
            if (four_bit) deinterleave16(lo, hi, &lo, &hi);
            _mm256_storeu_si256((__m256i *)(void *)(ot + b), lo);
            _mm256_storeu_si256((__m256i *)(void *)(ot + b + 16), hi);
        }
    }
    *q = (struct qacts){xq, dx, xsum, ds, cols, ng, paired};
}

/* 32 codes of block b as two vectors of 16 int16, in the order the
 * activations were stored: natural for 8-bit codes; evens, odds for the
 * last block of a 4-bit row with an odd number of blocks (the others go by
 * units, quad_codes). For mxfp4 the values are 256 * 2 * e2m1 (whole
 * numbers -12..12 by table lookup, in the high byte as quad_codes has
 * them); 1/512 goes into the scale. */
ALWAYS void q16_codes(int fmt, const uint8_t *c, int64_t b, __m256i *w0, __m256i *w1) {
    if (fmt_packed(fmt)) {
        packed32(packed_bits(fmt), c + b * 4 * packed_bits(fmt), w0, w1);
        return;
    }
    if (fmt == FMT_A8) {
        *w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(c + b * 32)));
        *w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const __m128i *)(const void *)(c + b * 32 + 16)));
        return;
    }
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)(c + b * 16));
    if (fmt == FMT_A4) {
        __m256i v16 = _mm256_cvtepu8_epi16(v);
        *w0 = _mm256_and_si256(v16, _mm256_set1_epi16(0xf));
        *w1 = _mm256_srli_epi16(v16, 4);  // a byte >> 4 is its high nibble
        return;
    }
    const __m128i twice_e2m1 = _mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
    const __m128i low4 = _mm_set1_epi8(0xf);
    __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    *w0 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(twice_e2m1, lo)), 8);
    *w1 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_shuffle_epi8(twice_e2m1, hi)), 8);
}

/* Scales (or biases) g..g+7 of a row as floats; for mxfp4 the E8M0 scales
 * times 1/512 (the codes are 256 * 2 * e2m1), exactly as load1_scale. */
ALWAYS __m256 load8_scales(int sdt, const uint8_t *p, int64_t g) {
    if (sdt == SP_DTYPE_U8) {
        __m256i e = _mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(const void *)(p + g)));
        __m256i bits = _mm256_blendv_epi8(_mm256_slli_epi32(e, 23), _mm256_set1_epi32(0x00400000),
                                          _mm256_cmpeq_epi32(e, _mm256_setzero_si256()));
        return _mm256_mul_ps(_mm256_castsi256_ps(bits), _mm256_set1_ps(MX4_CODE_SCALE));
    }
    if (sdt == SP_DTYPE_F32) return _mm256_loadu_ps((const float *)(const void *)(p + 4 * g));
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)(p + 2 * g));
    if (sdt == SP_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

ALWAYS float load1_scale(int sdt, const uint8_t *p, int64_t g) {
    return sdt == SP_DTYPE_U8 ? e8m0(p[g]) * MX4_CODE_SCALE : load_scale(sdt, p, g);
}

/* The row's multipliers: ds[t * ng + g] = (scale of group g) * dx of
 * token t, the scale times code_scale (a power of two: exact). */
ALWAYS void row_ds(int sdt, const uint8_t *sc, const struct qacts *q, int nt, float code_scale) {
    const __m256 cs = _mm256_set1_ps(code_scale);
    int64_t g = 0, ng = q->ng;
    for (; g + 8 <= ng; g += 8) {
        __m256 s = _mm256_mul_ps(load8_scales(sdt, sc, g), cs);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) _mm256_storeu_ps(q->ds + t * ng + g, _mm256_mul_ps(s, _mm256_loadu_ps(q->dx + t * ng + g)));
    }
    for (; g < ng; g++) {
        float s = load1_scale(sdt, sc, g) * code_scale;
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) q->ds[t * ng + g] = s * q->dx[t * ng + g];
    }
}

/* out[t] = the sum over groups g of b_g * xsum[t][g] for nt tokens, b the
 * row's biases bi (the affine bias term). */
ALWAYS void group_terms(int sdt, const uint8_t *bi, const struct qacts *q, int nt, float out[4]) {
    int64_t g = 0, ng = q->ng;
    __m256 acc[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) acc[t] = _mm256_setzero_ps();
    for (; g + 8 <= ng; g += 8) {
        __m256 bv = load8_scales(sdt, bi, g);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) acc[t] = _mm256_fmadd_ps(bv, _mm256_loadu_ps(q->xsum + t * ng + g), acc[t]);
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) out[t] = hsum(acc[t]);
    for (; g < ng; g++) {
        float bg = load_scale(sdt, bi, g);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) out[t] += bg * q->xsum[t * ng + g];
    }
}

/* acc[t][chain] += (the int32 sums p[t] of group g) x the group's
 * multiplier, for nt tokens. */
ALWAYS void add_scaled(__m256 acc[4][2], int chain, const __m256i p[4], const struct qacts *q, int64_t g, int nt) {
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++)
        acc[t][chain] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p[t]), _mm256_broadcast_ss(q->ds + t * q->ng + g), acc[t][chain]);
}

/* The multipliers of groups g and g + 1 of token t for a unit's int32
 * sums (lanes 0-3 the first 32 columns, 4-7 the next). */
ALWAYS __m256 pair_ds(const struct qacts *q, int t, int64_t g) {
    __m128 d2 = _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)(q->ds + t * q->ng + g)));
    return _mm256_permutevar8x32_ps(_mm256_castps128_ps256(d2), _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1));
}

/* Group g (PER blocks of 32) of a row into chain `chain` of each token. */
ALWAYS void q16_group(int fmt, const uint8_t *c, const struct qacts *q, int64_t g, int per, int nt, __m256 acc[4][2],
                      int chain) {
    __m256i p[4];
#pragma GCC unroll 4
    for (int b = 0; b < per; b++) {
        int64_t blk = g * per + b;
        __m256i w0, w1;
        _mm_prefetch((const char *)c + code_offset(fmt, blk * QB) + PREFETCH_AHEAD, _MM_HINT_T0);
        q16_codes(fmt, c, blk, &w0, &w1);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256i *xq = (const __m256i *)(const void *)(xq16(q, t) + blk * QB);
            __m256i s = b ? madd_acc(p[t], w0, _mm256_loadu_si256(xq)) : _mm256_madd_epi16(w0, _mm256_loadu_si256(xq));
            p[t] = madd_acc(s, w1, _mm256_loadu_si256(xq + 1));
        }
    }
    add_scaled(acc, chain, p, q, g, nt);
}

/* ---- 4-bit codes a unit (64 columns) at a time ---- */

/* Unit u of a row as four vectors of 16 int16 codes in quad order: affine
 * codes as they are; mxfp4 values (2 * e2m1 by table lookup, signed) in the
 * high byte, i.e. 256 x the value with no sign extension needed. */
ALWAYS void quad_codes(int fmt, const uint8_t *c, int64_t u, __m256i w[4]) {
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)(c + u * 32));
    if (fmt == FMT_MX4) {
        const __m256i twice_e2m1 = _mm256_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12, 0, 1, 2, 3,
                                                    4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12);
        const __m256i low4 = _mm256_set1_epi8(0xf), high_byte = _mm256_set1_epi16((short)0xff00);
        /* bytes of ev: elements 4k (low byte of word k), 4k + 2 (high); od: 4k + 1, 4k + 3 */
        __m256i ev = _mm256_shuffle_epi8(twice_e2m1, _mm256_and_si256(v, low4));
        __m256i od = _mm256_shuffle_epi8(twice_e2m1, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
        w[0] = _mm256_slli_epi16(ev, 8), w[1] = _mm256_slli_epi16(od, 8);
        w[2] = _mm256_and_si256(ev, high_byte), w[3] = _mm256_and_si256(od, high_byte);
        return;
    }
    const __m256i low4 = _mm256_set1_epi16(0xf);
    w[0] = _mm256_and_si256(v, low4);
    w[1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
    w[2] = _mm256_and_si256(_mm256_srli_epi16(v, 8), low4);
    w[3] = _mm256_srli_epi16(v, 12);
}

/* A unit's exact int32 sums with one token's activations, added to acc
 * unless first: two chains of two multiply-adds (one chain of four
 * dependent vpdpwssd measured up to 2x slower at batch 64). */
ALWAYS __m256i quad_dot(__m256i acc, bool first, const __m256i w[4], const int16_t *xq, int64_t js) {
#define XV(j) _mm256_loadu_si256((const __m256i *)(const void *)(xq + (j) * js))
    __m256i a = madd_acc(_mm256_madd_epi16(w[0], XV(0)), w[1], XV(1));
    __m256i b = madd_acc(_mm256_madd_epi16(w[2], XV(2)), w[3], XV(3));
#undef XV
    __m256i s = _mm256_add_epi32(a, b);
    return first ? s : _mm256_add_epi32(acc, s);
}

/* Group g of `units` units (affine4, group 64 or 128) into chain `chain`. */
ALWAYS void q16_group_quad(int fmt, const uint8_t *c, const struct qacts *q, int64_t g, int units, int nt,
                           __m256 acc[4][2], int chain) {
    __m256i p[4] = {0};
#pragma GCC unroll 2
    for (int i = 0; i < units; i++) {
        int64_t u = g * units + i;
        __m256i w[4];
        _mm_prefetch((const char *)c + u * 32 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
        quad_codes(fmt, c, u, w);
        int64_t js, at = unit_at(q->paired, q->cols, u, &js);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) p[t] = quad_dot(p[t], i == 0, w, xq16(q, t) + at, js);
    }
    add_scaled(acc, chain, p, q, g, nt);
}

/* Groups g and g + 1 of 32 columns (mxfp4, affine4 group 32), one unit,
 * into chain `chain`: each half with its own multiplier. */
ALWAYS void q16_group_pair(int fmt, const uint8_t *c, const struct qacts *q, int64_t g, int nt, __m256 acc[4][2],
                           int chain) {
    __m256i w[4];
    _mm_prefetch((const char *)c + g * 16 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
    quad_codes(fmt, c, g / 2, w);
    int64_t js, at = unit_at(q->paired, q->cols, g / 2, &js);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        __m256i p = quad_dot(_mm256_setzero_si256(), true, w, xq16(q, t) + at, js);
        __m256 d = pair_ds(q, t, g);
        acc[t][chain] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(p), d, acc[t][chain]);
    }
}

#if HAVE_ZMM
/* The paired units of a row (4-bit, group 32 or 64), two per 512-bit
 * step: the low half of every vector is unit 2p, the high half unit
 * 2p + 1, so the float accumulator's halves are exactly chains 0 and 1 of
 * the 256-bit code (even / odd units), which take over from here: acc must
 * be zero, and the group to go on from is returned. */
ALWAYS int64_t zmm_pairs(int fmt, const uint8_t *c, const struct qacts *q, int per, int nt, __m256 acc[4][2]) {
    /* per == 2: one group per unit, multipliers [ds_2p x 8 | ds_2p+1 x 8];
     * per == 1: two per unit, [ds_4p x 4 | ds_4p+1 x 4 | ds_4p+2 x 4 | ds_4p+3 x 4] */
    const __m512i spread = per == 2 ? _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1)
                                    : _mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3);
    int64_t pairs = q->cols / 128, groups = per == 2 ? 2 : 4;
    __m512 a[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; t++) a[t] = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; p++) {
        _mm_prefetch((const char *)c + p * 64 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512((const void *)(c + p * 64)), w[4];
        if (fmt == FMT_MX4) {
            const __m512i twice_e2m1 =
                _mm512_broadcast_i32x4(_mm_setr_epi8(0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12));
            const __m512i low4 = _mm512_set1_epi8(0xf), high_byte = _mm512_set1_epi16((short)0xff00);
            __m512i ev = _mm512_shuffle_epi8(twice_e2m1, _mm512_and_si512(v, low4));
            __m512i od = _mm512_shuffle_epi8(twice_e2m1, _mm512_and_si512(_mm512_srli_epi16(v, 4), low4));
            w[0] = _mm512_slli_epi16(ev, 8), w[1] = _mm512_slli_epi16(od, 8);
            w[2] = _mm512_and_si512(ev, high_byte), w[3] = _mm512_and_si512(od, high_byte);
        } else {
            const __m512i low4 = _mm512_set1_epi16(0xf);
            w[0] = _mm512_and_si512(v, low4);
            w[1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
            w[2] = _mm512_and_si512(_mm512_srli_epi16(v, 8), low4);
            w[3] = _mm512_srli_epi16(v, 12);
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const int16_t *xq = xq16(q, t) + p * 128;
#define XV(j) _mm512_loadu_si512((const void *)(xq + (j) * 32))
            __m512i lo = _mm512_dpwssd_epi32(_mm512_madd_epi16(w[0], XV(0)), w[1], XV(1));
            __m512i hi = _mm512_dpwssd_epi32(_mm512_madd_epi16(w[2], XV(2)), w[3], XV(3));
#undef XV
            const float *ds = q->ds + t * q->ng + p * groups;
            __m128 dg = per == 2 ? _mm_castsi128_ps(_mm_loadl_epi64((const __m128i *)(const void *)ds))
                                 : _mm_loadu_ps(ds);
            __m512 d = _mm512_permutexvar_ps(spread, _mm512_castps128_ps512(dg));
            a[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), d, a[t]);
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        acc[t][0] = _mm512_castps512_ps256(a[t]);
        acc[t][1] = _mm512_extractf32x8_ps(a[t], 1);
    }
    return pairs * groups;
}
#endif

ALWAYS void q16_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct qacts *q, float *y, int64_t ldy,
                     int fmt, int sdt, int nt, int per) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)r * f.row_bytes;
        row_ds(sdt, (const uint8_t *)w->scales + (size_t)r * f.scale_row_bytes, q, nt, 1.0f);
        __m256 acc[4][2];
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[t][0] = acc[t][1] = _mm256_setzero_ps();
        /* two chains (even / odd groups or pairs) hide the FMA latency */
        int64_t g = 0;
        bool four_bit = fmt == FMT_A4 || fmt == FMT_MX4;
#if HAVE_ZMM
        if (four_bit && q->paired) g = zmm_pairs(fmt, c, q, per, nt, acc);
#endif
        if (four_bit && per == 1) {
            for (; g + 4 <= f.ng; g += 4) {
                q16_group_pair(fmt, c, q, g, nt, acc, 0);
                q16_group_pair(fmt, c, q, g + 2, nt, acc, 1);
            }
            if (g + 2 <= f.ng) {
                q16_group_pair(fmt, c, q, g, nt, acc, 0);
                g += 2;
            }
        } else if (four_bit) {
            for (; g + 2 <= f.ng; g += 2) {
                q16_group_quad(fmt, c, q, g, per / 2, nt, acc, 0);
                q16_group_quad(fmt, c, q, g + 1, per / 2, nt, acc, 1);
            }
            if (g < f.ng) q16_group_quad(fmt, c, q, g++, per / 2, nt, acc, 0);
        }
        /* 8-bit codes, and the last 32 columns of 4-bit codes when cols / 32 is odd */
        for (; g + 2 <= f.ng; g += 2) {
            q16_group(fmt, c, q, g, per, nt, acc, 0);
            q16_group(fmt, c, q, g + 1, per, nt, acc, 1);
        }
        if (g < f.ng) q16_group(fmt, c, q, g, per, nt, acc, 0);
        /* affine bias term: sum over groups of b_g * sum(x over group g) */
        float bias[4] = {0};
        if (fmt != FMT_MX4) group_terms(sdt, (const uint8_t *)w->biases + (size_t)r * f.scale_row_bytes, q, nt, bias);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) y[t * ldy + r] = hsum(_mm256_add_ps(acc[t][0], acc[t][1])) + bias[t];
    }
}

/* ---- 4-bit products with int8 activations ----
 *
 * Multiplying 4-bit codes by int16 activations needs the codes widened to
 * 16 bits (6 operations per 64 codes) and 4 multiply-adds per 64 columns.
 * Kept as bytes, the codes multiply int8 activations directly: vpmaddubsw
 * takes unsigned bytes times signed bytes, 32 products per instruction
 * (vpdpbusd in the VNNI builds adds them into int32 too).
 *
 * Each token's activations are rounded to int8 with one scale per weight
 * group, dx = amax / 127 (error <= dx / 2 per element, 1/254 of the
 * group's largest value: a sixteenth of the rounding step of the 4-bit
 * weights themselves, which is 1/15 of their group's range). A unit's
 * activations are stored as its 32 even columns, then its 32 odd ones: byte
 * j of the codes holds columns 2j (low nibble) and 2j + 1 (high nibble),
 * so "& 0xf" and ">> 4 & 0xf" line up with them with no shuffle. mxfp4
 * codes become 2 * e2m1 + 12 (0..24, unsigned) by table lookup; the group's
 * exact integer sum then loses 12 * sum(xq) again before it meets a float.
 *
 * One summation order serves every batch size. For a row and a token, group
 * g's exact int32 sum S_g (over its columns: code x rounded activation) is
 * scaled by ds_g = (weight scale x code scale) x dx_g, rounded once, and
 * added by one FMA to chain g % 8; affine rows add their bias term
 * b_g x (float sum of x over g) to the same chain by a second FMA. The
 * eight chains are summed as hsum does: ((c0 + c4) + (c2 + c6)) + ((c1 + c5)
 * + (c3 + c7)). Two products compute exactly that:
 *
 * - by groups (q8_rows, 1 to 4 tokens at a time: decode, and the tokens a
 *   batch has past its blocks of 8): the int32 sums of 8
 *   groups are folded into one vector (lane = chain), so the float work is
 *   one conversion and one or two FMAs per 8 groups;
 * - by tokens (q8_block_rows, blocks of 8): lanes are 8 tokens. Four rows'
 *   codes are unpacked once into bytes; 4 bytes of a row (vpbroadcastd,
 *   one for two blocks, in the avx512 build for four) times 4 columns of 8
 *   tokens (one load; a 64-byte load for a pair of blocks) accumulate
 *   16-bit sums that are widened to int32 every 8 steps (4 for mxfp4, whose
 *   products are larger), and each group ends in one or two FMAs per row
 *   and 8 tokens, into chains kept in a small buffer. Measured on a Zen 3,
 *   one thread, affine4-g64 and mxfp4, 512 x 2048 and 2048 x 512 from
 *   cache: 16 tokens at 1.2-1.7x the speed of the product by groups. The
 *   avx512 build reads the same unpacked copy (one broadcast load per row
 *   and quad, one vpdpbusd per pair of blocks). Reading the packed codes
 *   instead, each 16 bytes a row broadcast, split into nibbles and each
 *   dword spread by an in-block shuffle, was 1.08-1.12x faster on a Zen 5
 *   (affine4 768 x 2048, 32 tokens, one thread), but on a Sapphire Rapids
 *   Xeon, whose shuffles all go to one port that vpdpbusd also needs, the
 *   copy is faster: one thread from cache, 2048 x 2048 x 256 tokens 0.86x
 *   the time (affine4) and 0.82x (mxfp4), 512 x 2048 x 16-32 tokens
 *   0.78-0.87x; a 512-token prefill on 2 threads 1.04-1.12x the tokens a
 *   second. The amx build takes the sums from AMX tiles instead
 *   (amx_groups): tdpbusd of 16 unpacked rows x a pair of blocks, whose
 *   side-by-side layout is already AMX's second operand; the sums are
 *   stored and taken on by the same float work. A 512-token prefill on 2
 *   threads (4-layer synthetic models, medians of 3, two rounds), against
 *   avx512's tokens a second: affine4 Qwen3 1.44-1.47x, Ling-mini 1.0-1.2x.
 *   mxfp4's groups of 32 columns take one tdpbusd of 32 (group_order);
 *   taken as two of 16 in unit order, they ran a Qwen3 prefill at 0.70-0.74x
 *   the tokens a second and its q / k / v products at 0.55-0.6x. The product alone, one thread, affine4-g64 from L3 (64
 *   copies of the matrix), means of 3 rounds against avx512: 768 x 2048 at
 *   32 tokens 1.03-1.29x, 2048 x 768 0.99-1.22x, 16 tokens 1.06-1.6x, 4096
 *   x 2048 at 64 tokens 1.5-1.9x. The
 *   multiply-adds are not what bounds it: a 16 x 2048 block at 32 tokens
 *   runs its tiles alone at ~550 G a second, its float work alone at
 *   ~650, both at ~280, and with the unpacking of its rows at ~160-220. */

#define MX4_OFFSET 12  // mxfp4 codes as int8 are 2 * e2m1 + 12
#define A8_OFFSET 128  // 8-bit codes as int8 on AVX2 are c - 128 (a8_acc)
#define Q8_CHAINS 8
#define Q8_BLOCK_TOKENS 8  // tokens per vector in the product by tokens
#define Q8_BLOCK_ROWS 4    // rows a vector product takes at a time there
/* Rows the avx512 build's product by tokens takes at a time, and the int32
 * sums it keeps in flight (rows x pairs x runs). 8 rows against 4 (Zen 5,
 * one thread, from cache, both builds at once on the two cores, swapped):
 * 768 x 2048 at 32 tokens 1.01x (affine4) and 1.03x (mxfp4), at 16 tokens
 * 1.09x both, 2048 x 768 at 32 tokens 1.08x: a load of a pair's
 * activations serves twice the rows. */
#define ZMM_ROWS 8
#define ZMM_SUMS 16
/* Rows unpacked at a time: Q8_BLOCK_ROWS, ZMM_ROWS in the avx512 build, or
 * a tile's 16 in the amx build */
#if HAVE_AMX
#define Q8_UNPACK_ROWS 16
#elif HAVE_ZMM
#define Q8_UNPACK_ROWS ZMM_ROWS
#else
#define Q8_UNPACK_ROWS Q8_BLOCK_ROWS
#endif
/* Token blocks that share each broadcast of a row's codes (measured on a
 * Zen 3: 1.02-1.09x one block at a time); the activations of a pair of
 * blocks sit side by side, 64 bytes per quad (quad_at) */
#define Q8_PAIR 2
/* Token blocks of one pass in the avx512 build (two pairs): chains are kept
 * for this many in every build */
#define Q8_PASS 4
#define Q8_TOKENS SP_KERNELS_Q8_TOKENS  // tokens rounded to int8 at a time
/* The product by tokens on AVX2 adds a group's mxfp4 products in int16
 * lanes, each lane the codes (at most 24) times 16 of the group's 32
 * activations: exact over the whole group when those activations' |int8|
 * sum to at most this (24 x 1365 = 32760), else in two runs of 8 columns a
 * lane, each widened to int32 (q8acts.xw says which, per block of tokens:
 * a branch per group costs more than the widening it saves). Zen 3, one
 * thread, from cache, 16 and 32 tokens of 512 x 2048 to 2048 x 768 rows:
 * 0.90-0.98x the time of two runs a group (median 0.955). */
#define MX4_WIDE_SUM (32767 / (2 * MX4_OFFSET))

/* A batch of up to Q8_TOKENS tokens rounded to int8 (q8_prepare), and the
 * buffers the products use, all in the caller's scratch. Per-group arrays
 * have ldg >= ng entries per token, zero past ng. */
struct q8acts {
    const int8_t *xq;     // (n, cols) in unit order
    const int8_t *xp;     // the same in unit-pair order (avx512 build only; see zmm_group_sums)
    const float *dx;      // (n, ldg) scale of each group of x
    const float *xsum;    // affine: (n, ldg) float sum of x over each group (mxfp4: unset)
    const int32_t *xoff;  // mxfp4: (n, ldg) 12 x the sum of xq over each group (affine: unset)
    float *srow, *brow;   // (Q8_UNPACK_ROWS, ldg) rows' scales x code scale, biases
    /* product by tokens: xt (pairs of blocks of 8 tokens: cols / 4 quads x
     * 2 blocks x 8 tokens x 4 bytes), dxt, xst, xot (blocks: ldg x 8), ub
     * (Q8_UNPACK_ROWS, cols) unpacked codes,
     * chains (Q8_UNPACK_ROWS, Q8_CHAINS, Q8_PASS, 8) */
    int8_t *xt;
    uint8_t *ub;
    float *dxt, *xst, *chains;
    int32_t *xot;
    /* mxfp4 without VNNI: per block of 8 tokens, 1 where every group of
     * every token stays within MX4_WIDE_SUM in both lanes (mx4_group_fits) */
    uint8_t *xw;
    int64_t n, cols, ng, ldg;
    bool mx4;  // which of xsum / xoff the rows read
};

ALWAYS const int8_t *xq8(const struct q8acts *q, int64_t t) { return q->xq + t * q->cols; }

/* q's tokens from t on, nt of them (views into q's buffers) */
ALWAYS struct q8acts q8_from(const struct q8acts *q, int64_t t, int64_t nt) {
    struct q8acts qt = *q;
    int64_t at = t * q->ldg;
    qt.xq += t * q->cols;
    qt.xp += t * q->cols;
    qt.dx += at;
    qt.xsum += at;
    qt.xoff += at;
    qt.n = nt;
    return qt;
}

/* 32 int8 in natural order (a token's quantized columns) -> the 16 even
 * ones, then the 16 odd ones, of each 32-column half. */
ALWAYS __m256i evens_odds(__m256i v) {
    const __m256i sh = _mm256_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15, 0, 2, 4, 6, 8, 10, 12,
                                        14, 1, 3, 5, 7, 9, 11, 13, 15);
    return _mm256_permute4x64_epi64(_mm256_shuffle_epi8(v, sh), 0xD8);
}

/* 32 floats times inv, rounded to int8 (nearest even) in natural order;
 * *isum gets the int32 sums of the rounded values (8 lanes). */
ALWAYS __m256i quantize32(const float *x, __m256 inv, __m256i *isum) {
    __m256i i[4];
    for (int k = 0; k < 4; k++) i[k] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(x + 8 * k), inv));
    *isum = _mm256_add_epi32(_mm256_add_epi32(i[0], i[1]), _mm256_add_epi32(i[2], i[3]));
    /* packs work per 128-bit lane: dwords come out as 0 4 1 5 2 6 3 7 */
    __m256i b = _mm256_packs_epi16(_mm256_packs_epi32(i[0], i[1]), _mm256_packs_epi32(i[2], i[3]));
    return _mm256_permutevar8x32_epi32(b, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

ALWAYS int32_t hsum_epi32(__m256i v) {
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4E));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xB1));
    return _mm_cvtsi128_si32(s);
}

/* Floats per row of per-group values (dx, sums, offsets, scales): the
 * groups in whole steps of Q8_CHAINS, and 8 more where the token blocks'
 * rows of them (32 x ldg bytes apart) would sit a multiple of 2 KiB apart,
 * in the same few sets of the L1 cache as each other and as the rows of
 * codes (Zen 5, mxfp4, 768 x 4096 at 32 tokens: 149 G multiply-adds a
 * second, against 183 and 192 for 3968 and 4224 columns). */
ALWAYS int64_t q8_ldg(int64_t ng) {
    int64_t ldg = (ng + Q8_CHAINS - 1) / Q8_CHAINS * Q8_CHAINS;
    return ldg % 64 ? ldg : ldg + 8;
}

/* Carves the q8acts buffers out of scratch (sp_kernels_scratch_bytes
 * counts them) for up to Q8_TOKENS tokens. */
static void q8_layout(void *scratch, int64_t cols, int64_t ng, struct q8acts *q) {
    _Static_assert(Q8_TOKENS % (Q8_PAIR * Q8_BLOCK_TOKENS) == 0, "whole pairs of blocks of tokens");
    int64_t ldg = q8_ldg(ng), nt = Q8_TOKENS;
    int8_t *xq = scratch, *xp = xq + nt * cols, *xt = xp + nt * cols;
    uint8_t *ub = (uint8_t *)(xt + nt * cols);
    float *f = (float *)(void *)(ub + Q8_UNPACK_ROWS * cols);  // cols is a multiple of 32
    float *dx = f, *xsum = dx + nt * ldg, *srow = xsum + nt * ldg, *brow = srow + Q8_UNPACK_ROWS * ldg;
    float *dxt = brow + Q8_UNPACK_ROWS * ldg, *xst = dxt + nt * ldg, *chains = xst + nt * ldg;
    int32_t *xoff = (int32_t *)(void *)(chains + Q8_PASS * Q8_UNPACK_ROWS * Q8_CHAINS * Q8_BLOCK_TOKENS);
    int32_t *xot = xoff + nt * ldg;
    uint8_t *xw = (uint8_t *)(xot + nt * ldg);
    *q = (struct q8acts){xq, xp, dx, xsum, xoff, srow, brow, xt, ub, dxt, xst, chains, xot, xw, 0, cols, ng, ldg, false};
}

/* Where unit u's 32 even and 32 odd columns sit in the unit-pair order
 * (xp): units 2p and 2p + 1, when both are whole 64-column units, as the
 * evens of both, then the odds of both (one 512-bit vector each, the order
 * of a 64-byte load of their codes' low and high nibbles); a last unit
 * without a partner, and a lone 32-column block, as in unit order. */
ALWAYS int64_t pair_evens(int64_t u, int64_t cols) {
    int64_t p = u & ~(int64_t)1;
    return (p + 2) * 64 <= cols ? p * 64 + (u & 1) * 32 : u * 64;
}
ALWAYS int64_t pair_odds(int64_t u, int64_t cols) {
    int64_t p = u & ~(int64_t)1;
    return (p + 2) * 64 <= cols ? p * 64 + 64 + (u & 1) * 32 : u * 64 + 32;
}

/* Whether a 32-column group's int8 activations (eo: its 16 even columns,
 * then its 16 odd ones, as q8_prepare stores them) keep the product by
 * tokens' int16 lanes exact over the whole group: a lane takes bytes 0 and
 * 1, or 2 and 3, of each 4-byte quad, and each of those two sets of 16 must
 * have |x| summing to at most MX4_WIDE_SUM. */
ALWAYS bool mx4_group_fits(__m256i eo) {
    /* int16 lanes of |x| pair sums (<= 254): the dwords' sum holds the even
     * lanes' total (<= 8 x 254, no carry) in its low 16 bits, the odd
     * lanes' in its high 16 */
    uint32_t both = (uint32_t)hsum_epi32(_mm256_maddubs_epi16(_mm256_abs_epi8(eo), _mm256_set1_epi8(1)));
    return (both & 0xffff) <= MX4_WIDE_SUM && both >> 16 <= MX4_WIDE_SUM;
}

/* Group g (group columns at xg) of token t rounded to int8 into q's
 * buffers: its scale, its codes in unit order (xq, ot: t's row) and, in
 * 512-bit builds, in unit-pair order (xp, op), or for 8-bit rows in column
 * order (xq alone), its offset (mxfp4) or its float sum (affine); the
 * block's wide flag cleared where the group does not fit (check_wide). */
ALWAYS void q8_group(const struct q8acts *q, const float *xg, int64_t t, int64_t g, int64_t group, bool mx4,
                     bool natural, bool check_wide, int8_t *ot, int8_t *op) {
    float sum = 0.0f, amax = group_amax(xg, group, mx4 ? NULL : &sum);
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
    ((float *)q->dx)[t * q->ldg + g] = amax / 127.0f;
    /* a group is a whole number of 32-column halves of units */
    __m256i isum = _mm256_setzero_si256();
    for (int64_t k = 0; k < group; k += 32) {
        __m256i s32;
        __m256i v = quantize32(xg + k, inv, &s32);
        isum = _mm256_add_epi32(isum, s32);
        if (natural) {
            _mm256_storeu_si256((__m256i *)(void *)(ot + g * group + k), v);
            continue;
        }
        /* units: evens of both halves, then odds; a last lone 32-column
         * block: its evens, then its odds */
        int64_t col = g * group + k, u0 = col & ~(int64_t)63;
        __m256i eo = evens_odds(v);
        if (check_wide && q->xw[t / Q8_BLOCK_TOKENS] && !mx4_group_fits(eo)) q->xw[t / Q8_BLOCK_TOKENS] = 0;
        if (u0 + 64 <= q->cols) {
            int64_t half = (col - u0) / 2;  // 0 or 16
            _mm_storeu_si128((__m128i *)(void *)(ot + u0 + half), _mm256_castsi256_si128(eo));
            _mm_storeu_si128((__m128i *)(void *)(ot + u0 + 32 + half), _mm256_extracti128_si256(eo, 1));
            if (HAVE_ZMM) {
                _mm_storeu_si128((__m128i *)(void *)(op + pair_evens(u0 / 64, q->cols) + half),
                                 _mm256_castsi256_si128(eo));
                _mm_storeu_si128((__m128i *)(void *)(op + pair_odds(u0 / 64, q->cols) + half),
                                 _mm256_extracti128_si256(eo, 1));
            }
        } else {
            _mm256_storeu_si256((__m256i *)(void *)(ot + col), eo);
            if (HAVE_ZMM) _mm256_storeu_si256((__m256i *)(void *)(op + col), eo);
        }
    }
    if (mx4) {
        ((int32_t *)q->xoff)[t * q->ldg + g] = MX4_OFFSET * hsum_epi32(isum);
    } else {
        ((float *)q->xsum)[t * q->ldg + g] = sum;
        if (natural && !HAVE_DPWSSD) ((int32_t *)q->xoff)[t * q->ldg + g] = A8_OFFSET * hsum_epi32(isum);
    }
}

#if HAVE_ZMM
/* Lane j of the result: the largest (add: the int32 sum) of v[j]'s 16
 * lanes, for j < 16. Halves of vectors meet pairwise: blocks of 128 bits,
 * then pairs of lanes, then lanes, leaving lane 4k + i for vector 4i + k,
 * put in order at the end. Either is exact in any order. */
ALWAYS __m512 across16(const __m512 *v, bool add) {
#define ACROSS_(a, b)                                                                                           \
    (add ? _mm512_castsi512_ps(_mm512_add_epi32(_mm512_castps_si512(a), _mm512_castps_si512(b)))                \
         : _mm512_max_ps(a, b))
    __m512 h[8], q4[4], p2[2];
#pragma GCC unroll 8
    for (int i = 0; i < 8; i++)
        h[i] = ACROSS_(_mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0x44),
                       _mm512_shuffle_f32x4(v[2 * i], v[2 * i + 1], 0xEE));
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
        q4[i] = ACROSS_(_mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0x88),
                        _mm512_shuffle_f32x4(h[2 * i], h[2 * i + 1], 0xDD));
#pragma GCC unroll 2
    for (int i = 0; i < 2; i++)
        p2[i] = ACROSS_(_mm512_shuffle_ps(q4[2 * i], q4[2 * i + 1], _MM_SHUFFLE(1, 0, 1, 0)),
                        _mm512_shuffle_ps(q4[2 * i], q4[2 * i + 1], _MM_SHUFFLE(3, 2, 3, 2)));
    __m512 r = ACROSS_(_mm512_shuffle_ps(p2[0], p2[1], _MM_SHUFFLE(2, 0, 2, 0)),
                       _mm512_shuffle_ps(p2[0], p2[1], _MM_SHUFFLE(3, 1, 3, 1)));
#undef ACROSS_
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), r);
}

/* Int32 lanes of one unit, groups a (a0: columns 0..15, a1: 16..31) and
 * b, as the 64 int8 of its place in xq: a's 16 even columns, b's, a's 16
 * odd ones, b's (saturated as quantize32 does). The packs leave 128-bit
 * lane L holding a's columns 4L..4L+3, 16+4L.., then b's; the shuffle
 * pairs each lane's even (odd) bytes into words, the permute sets the
 * words in place. */
ALWAYS __m512i unit_evens_odds(__m512i a0, __m512i a1, __m512i b0, __m512i b1) {
    __m512i p = _mm512_packs_epi16(_mm512_packs_epi32(a0, a1), _mm512_packs_epi32(b0, b1));
    const __m512i pairs = _mm512_broadcast_i32x4(_mm_setr_epi8(0, 2, 4, 6, 8, 10, 12, 14, 1, 3, 5, 7, 9, 11, 13, 15));
    /* word w: section w / 8 (a evens, b evens, a odds, b odds), from lane
     * w % 4, the first or second word pair of that section's bytes there */
    const __m512i place = _mm512_set_epi16(31, 23, 15, 7, 30, 22, 14, 6, 29, 21, 13, 5, 28, 20, 12, 4, 27, 19, 11, 3,
                                           26, 18, 10, 2, 25, 17, 9, 1, 24, 16, 8, 0);
    return _mm512_permutexvar_epi16(place, _mm512_shuffle_epi8(p, pairs));
}

/* mxfp4 activations of token t (row xt) for its whole units, 16 groups
 * of 32 at a time: each group's largest |x| found across the 16 at once,
 * one division for all their scales, a unit's two groups rounded and
 * stored with 512-bit vectors, the offsets summed across the 16. The
 * same values as q8_group. Returns the groups done (a last lone group is
 * left). */
ALWAYS int64_t mx4_units_zmm(const struct q8acts *q, const float *xt, int64_t t, int8_t *ot, int8_t *op) {
    const int64_t cols = q->cols, whole = cols / 64 * 2;
    float *dx = (float *)q->dx + t * q->ldg;
    int32_t *xoff = (int32_t *)q->xoff + t * q->ldg;
    for (int64_t g0 = 0; g0 < whole; g0 += 16) {
        const int nw = whole - g0 < 16 ? (int)(whole - g0) : 16;
        const __mmask16 live = (__mmask16)((1u << nw) - 1);
        __m512 m[16];
#pragma GCC unroll 16
        for (int j = 0; j < 16; j++) {
            const float *xg = xt + (g0 + j) * 32;
            /* |x| the larger of each pair, sign cleared (vrangeps) */
            m[j] = j < nw ? _mm512_range_ps(_mm512_loadu_ps(xg), _mm512_loadu_ps(xg + 16), 0x0B) : _mm512_setzero_ps();
        }
        const __m512 amax = across16(m, false), c127 = _mm512_set1_ps(127.0f);
        const __m512 inv = _mm512_maskz_div_ps(_mm512_cmp_ps_mask(amax, _mm512_setzero_ps(), _CMP_GT_OQ), c127, amax);
        _mm512_mask_storeu_ps(dx + g0, live, _mm512_div_ps(amax, c127));
        __m512 sums[16];
        __m512i unit[2];
        for (int j = 0; j < nw; j += 2) {
            __m512i r[4];
#pragma GCC unroll 4
            for (int h = 0; h < 4; h++) {
                __m512 s = _mm512_permutexvar_ps(_mm512_set1_epi32(j + h / 2), inv);
                r[h] = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(xt + (g0 + j) * 32 + 16 * h), s));
            }
            sums[j] = _mm512_castsi512_ps(_mm512_add_epi32(r[0], r[1]));
            sums[j + 1] = _mm512_castsi512_ps(_mm512_add_epi32(r[2], r[3]));
            int64_t u = (g0 + j) / 2;
            unit[u & 1] = unit_evens_odds(r[0], r[1], r[2], r[3]);
            _mm512_storeu_si512((void *)(ot + u * 64), unit[u & 1]);
            /* unit-pair order: both units' evens, then both units' odds (a
             * last unit without a partner as in unit order) */
            if ((u | 1) >= cols / 64)
                _mm512_storeu_si512((void *)(op + u * 64), unit[u & 1]);
            else if (u & 1) {
                _mm512_storeu_si512((void *)(op + (u - 1) * 64), _mm512_shuffle_i64x2(unit[0], unit[1], 0x44));
                _mm512_storeu_si512((void *)(op + (u - 1) * 64 + 64), _mm512_shuffle_i64x2(unit[0], unit[1], 0xEE));
            }
        }
        for (int j = nw; j < 16; j++) sums[j] = _mm512_setzero_ps();
        const __m512i off =
            _mm512_mullo_epi32(_mm512_castps_si512(across16(sums, true)), _mm512_set1_epi32(MX4_OFFSET));
        _mm512_mask_storeu_epi32(xoff + g0, live, off);
    }
    return whole;
}
#endif

/* q8_prepare (below) compiled for mxfp4 or for affine rows. */
ALWAYS void q8_prepare_fmt(const float *x, int64_t ldx, int64_t n, int64_t by_tokens, int64_t group, bool mx4,
                           bool natural, struct q8acts *q) {
    int64_t ng = q->ng, ldg = q->ldg;
    float *dx = (float *)q->dx, *xsum = (float *)q->xsum;
    int32_t *xoff = (int32_t *)q->xoff;
    q->n = n;
    q->mx4 = mx4;
    const bool wide_flags = mx4 && !HAVE_DPWSSD;  // the products by tokens read q->xw
    if (wide_flags) memset(q->xw, 1, (size_t)((by_tokens + Q8_BLOCK_TOKENS - 1) / Q8_BLOCK_TOKENS));
    for (int64_t t = 0; t < n; t++) {
        const float *xt = x + t * ldx;
        const bool check_wide = wide_flags && t < by_tokens;
        int8_t *ot = (int8_t *)q->xq + t * q->cols, *op = (int8_t *)q->xp + t * q->cols;
        int64_t g = 0;
#if HAVE_ZMM
        if (mx4 && group == 32) g = mx4_units_zmm(q, xt, t, ot, op);
#endif
        for (; g < ng; g++) q8_group(q, xt + g * group, t, g, group, mx4, natural, check_wide, ot, op);
        for (g = ng; g < ldg; g++) {
            dx[t * ldg + g] = 0.0f;
            xoff[t * ldg + g] = 0;
            if (!mx4) xsum[t * ldg + g] = 0.0f;
        }
    }
}

/* Quantizes n <= Q8_TOKENS tokens of x into q's buffers for rows of type
 * t (one scale per weight group of 32, 64 or 128 columns); the first
 * by_tokens of them will go by tokens (their blocks get q->xw). */
static void q8_prepare(const float *x, int64_t ldx, int64_t n, int64_t by_tokens, int64_t group, enum sp_qtype t,
                       struct q8acts *q) {
    if (t == SP_QTYPE_MXFP4)
        q8_prepare_fmt(x, ldx, n, by_tokens, group, true, false, q);
    else if (t == SP_QTYPE_AFFINE8)
        q8_prepare_fmt(x, ldx, n, by_tokens, group, false, true, q);
    else
        q8_prepare_fmt(x, ldx, n, by_tokens, group, false, false, q);
}

/* A row's scales times code_scale (or its biases, code_scale 1) as floats
 * into out[0 .. ldg), zero past ng; the same values for both products. */
ALWAYS void row_floats(int sdt, const uint8_t *p, int64_t ng, int64_t ldg, float code_scale, float *out) {
    const __m256 cs = _mm256_set1_ps(code_scale);
    int64_t g = 0;
    for (; g + 8 <= ng; g += 8) _mm256_storeu_ps(out + g, _mm256_mul_ps(load8_scales(sdt, p, g), cs));
    for (; g < ng; g++) out[g] = load1_scale(sdt, p, g) * code_scale;
    for (; g < ldg; g++) out[g] = 0.0f;
}

/* mxfp4 codes 0..15 as the unsigned bytes that multiply int8 activations:
 * 2 * e2m1 + 12 (a table for vpshufb, repeated in each 128-bit lane). */
ALWAYS __m128i mx4_u8_table(void) { return _mm_setr_epi8(12, 13, 14, 15, 16, 18, 20, 24, 12, 11, 10, 9, 8, 6, 4, 0); }

/* 4-bit codes (one per byte) as the unsigned bytes that multiply int8
 * activations: affine codes as they are, mxfp4 codes by mx4_u8_table. */
ALWAYS __m256i u8_values(int fmt, __m256i nibbles) {
    return fmt == FMT_MX4 ? _mm256_shuffle_epi8(_mm256_broadcastsi128_si256(mx4_u8_table()), nibbles) : nibbles;
}

/* Codes of 64 columns (32 bytes at c) as unsigned bytes (u8_values): lo
 * holds the even columns, hi the odd ones. */
ALWAYS void u8_codes(int fmt, const uint8_t *c, __m256i *lo, __m256i *hi) {
    const __m256i low4 = _mm256_set1_epi8(0xf);
    __m256i v = _mm256_loadu_si256((const __m256i *)(const void *)c);
    *lo = u8_values(fmt, _mm256_and_si256(v, low4));
    *hi = u8_values(fmt, _mm256_and_si256(_mm256_srli_epi16(v, 4), low4));
}

/* A lone last 32-column block (16 bytes at c) as [even columns | odd
 * columns], the order of its activations. */
ALWAYS __m256i u8_lone_codes(int fmt, const uint8_t *c) {
    const __m128i low4 = _mm_set1_epi8(0xf);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)c);
    return u8_values(fmt, _mm256_setr_m128i(_mm_and_si128(v, low4), _mm_and_si128(_mm_srli_epi16(v, 4), low4)));
}

/* ---- the product by groups ---- */

/* Lane i < 4: the int32 sum of the lower 128 bits of p[i], lane 4 + i: of
 * its upper 128 bits (p[i] unit_part vectors). On AVX2 the first level of adds
 * is in int16 (8 products a lane), and for affine codes the second too
 * (16 x 15 x 127 < 32768; mxfp4's 16 x 24 x 127 is not), so fewer
 * vpmaddwd widen them. */
ALWAYS __m256i halves4(int fmt, const __m256i p[4]) {
    __m256i s01 = add_part(_mm256_unpacklo_epi32(p[0], p[1]), _mm256_unpackhi_epi32(p[0], p[1]));
    __m256i s23 = add_part(_mm256_unpacklo_epi32(p[2], p[3]), _mm256_unpackhi_epi32(p[2], p[3]));
    if (!HAVE_DPWSSD && fmt != FMT_MX4)
        return u8_widen(_mm256_add_epi16(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23)));
    if (!HAVE_DPWSSD) s01 = u8_widen(s01), s23 = u8_widen(s23);
    return _mm256_add_epi32(_mm256_unpacklo_epi64(s01, s23), _mm256_unpackhi_epi64(s01, s23));
}

/* Two halves4 results of units 0-3 and 4-7 -> the 8 units' totals. */
ALWAYS __m256i unit_totals(__m256i a, __m256i b) {
    return _mm256_add_epi32(_mm256_permute2x128_si256(a, b, 0x20), _mm256_permute2x128_si256(a, b, 0x31));
}

/* The sums of a lone last 32-column block (16 bytes of codes at c, its 32
 * activations at x): lanes 0-3 partial sums of the block, 4-7 zero. */
ALWAYS __m256i lone_part(int fmt, const uint8_t *c, const int8_t *x) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i xv = _mm256_loadu_si256((const __m256i *)(const void *)x);
    __m256i s = unit_part(u8_lone_codes(fmt, c), xv, zero, xv);  // low half even columns, high half odd
    s = add_part(s, _mm256_permute2x128_si256(s, s, 0x81));
    return _mm256_blend_epi32(s, zero, 0xF0);
}

/* halves4 of units u0 .. u0 + nu - 1 (nu <= 4; zero past nu) for tokens
 * t < nt; with lone, the last of them is a lone 32-column block, its whole
 * sum in the first half. */
ALWAYS void unit_halves(int fmt, const uint8_t *c, const struct q8acts *q, int64_t u0, int nu, bool lone, int nt,
                        __m256i out[4]) {
    const __m256i zero = _mm256_setzero_si256();
    __m256i p[4][4];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++) {
        int64_t u = u0 + i;
        if (i >= nu) {
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) p[t][i] = zero;
        } else if (lone && i == nu - 1) {
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) p[t][i] = lone_part(fmt, c + u * 32, xq8(q, t) + u * 64);
        } else {
            __m256i lo, hi;
            _mm_prefetch((const char *)c + u * 32 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
            u8_codes(fmt, c + u * 32, &lo, &hi);
#pragma GCC unroll 4
            for (int t = 0; t < nt; t++) {
                const __m256i *xq = (const __m256i *)(const void *)(xq8(q, t) + u * 64);
                p[t][i] = unit_part(lo, _mm256_loadu_si256(xq), hi, _mm256_loadu_si256(xq + 1));
            }
        }
    }
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) out[t] = halves4(fmt, p[t]);
}

/* The exact int32 sums of groups g0 .. g0 + gn - 1 (gn <= 8; zero past gn)
 * for tokens t < nt, group g0 + i in lane i. per: 32-column blocks per
 * group (1, 2 or 4); a row with an odd number of 32-column groups ends in
 * a lone block. */
ALWAYS void group_sums(int fmt, int per, const uint8_t *c, const struct q8acts *q, int64_t g0, int gn, int nt,
                       __m256i s[4]) {
    __m256i a[4], b[4], d[4], e[4];
    if (per == 1) {
        /* [g0 g2 g4 g6 | g1 g3 g5 g7] -> natural order */
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        unit_halves(fmt, c, q, g0 / 2, (gn + 1) / 2, gn & 1, nt, a);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) s[t] = _mm256_permutevar8x32_epi32(a[t], order);
    } else if (per == 2) {
        unit_halves(fmt, c, q, g0, gn < 4 ? gn : 4, false, nt, a);
        unit_halves(fmt, c, q, g0 + 4, gn > 4 ? gn - 4 : 0, false, nt, b);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) s[t] = unit_totals(a[t], b[t]);
    } else {
        /* units 2g, 2g + 1 per group: totals of 16 units, then pairs of them */
        int nu = 2 * gn;
        unit_halves(fmt, c, q, 2 * g0, nu < 4 ? nu : 4, false, nt, a);
        unit_halves(fmt, c, q, 2 * g0 + 4, nu < 4 ? 0 : nu < 8 ? nu - 4 : 4, false, nt, b);
        unit_halves(fmt, c, q, 2 * g0 + 8, nu < 8 ? 0 : nu < 12 ? nu - 8 : 4, false, nt, d);
        unit_halves(fmt, c, q, 2 * g0 + 12, nu < 12 ? 0 : nu - 12, false, nt, e);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            /* hadd gives [G0 G1 G4 G5 | G2 G3 G6 G7] */
            __m256i h = _mm256_hadd_epi32(unit_totals(a[t], b[t]), unit_totals(d[t], e[t]));
            s[t] = _mm256_permute4x64_epi64(h, 0xD8);
        }
    }
}

#if HAVE_ZMM
/* The products by groups again, 512 bits wide: one 64-byte load takes the
 * codes of units 2p and 2p + 1, and their low and high nibbles meet the
 * unit-pair order of the activations (xp) as they come, so one vpdpbusd
 * per 128 columns and token takes what two 256-bit ones take in
 * unit_halves. The int32 sums are exact whatever the order, so
 * zmm_group_sums returns what group_sums does, to the bit, in fewer
 * instructions. */

/* The 64 bytes of codes v as unsigned bytes (u8_values): lo holds the even
 * columns of both units, hi the odd ones. */
ALWAYS void zmm_u8_codes(int fmt, __m512i v, __m512i *lo, __m512i *hi) {
    const __m512i low4 = _mm512_set1_epi8(0xf);
    *lo = _mm512_and_si512(v, low4);
    *hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low4);
    if (fmt == FMT_MX4) {
        const __m512i e2m1 = _mm512_broadcast_i32x4(mx4_u8_table());
        *lo = _mm512_shuffle_epi8(e2m1, *lo);
        *hi = _mm512_shuffle_epi8(e2m1, *hi);
    }
}

/* What a slot of two units holds in a step of 8 groups. */
enum slot { SLOT_NONE, SLOT_PAIR, SLOT_ONE, SLOT_ONE_LONE, SLOT_LONE };

/* Partial sums of units u and u + 1 for tokens t < nt: lanes 0-7 unit u,
 * 8-15 unit u + 1 (each as unit_part sums it: per == 1, lanes 0-3 and 4-7
 * of a unit are its two groups); nothing present, zero. */
ALWAYS void slot_parts(int fmt, int kind, const uint8_t *c, const struct q8acts *q, int64_t u, int nt,
                       __m512i out[4]) {
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) out[t] = _mm512_setzero_si512();
    if (kind == SLOT_PAIR) {
        __m512i lo, hi;
        _mm_prefetch((const char *)c + u * 32 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
        zmm_u8_codes(fmt, _mm512_loadu_si512((const void *)(c + u * 32)), &lo, &hi);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const int8_t *x = q->xp + t * q->cols + u * 64;
            out[t] = _mm512_dpbusd_epi32(_mm512_dpbusd_epi32(out[t], lo, _mm512_loadu_si512((const void *)x)), hi,
                                         _mm512_loadu_si512((const void *)(x + 64)));
        }
        return;
    }
    if (kind == SLOT_ONE || kind == SLOT_ONE_LONE) {
        __m256i lo, hi;
        u8_codes(fmt, c + u * 32, &lo, &hi);
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            const __m256i *x = (const __m256i *)(const void *)(q->xp + t * q->cols + u * 64);
            out[t] = _mm512_zextsi256_si512(unit_part(lo, _mm256_loadu_si256(x), hi, _mm256_loadu_si256(x + 1)));
        }
    }
    if (kind == SLOT_ONE_LONE || kind == SLOT_LONE) {
        int64_t ul = kind == SLOT_LONE ? u : u + 1;
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) {
            __m256i s = lone_part(fmt, c + ul * 32, q->xp + t * q->cols + ul * 64);
            out[t] = kind == SLOT_LONE ? _mm512_zextsi256_si512(s) : _mm512_inserti64x4(out[t], s, 1);
        }
    }
}

/* For each 128-bit block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3], then
 * [p0 + p2, p1 + p3, r0 + r2, r1 + r3]: two levels of a sum tree. */
ALWAYS __m512i fold32(__m512i a, __m512i b) {
    return _mm512_add_epi32(_mm512_unpacklo_epi32(a, b), _mm512_unpackhi_epi32(a, b));
}
ALWAYS __m512i fold64(__m512i p, __m512i r) {
    return _mm512_add_epi32(_mm512_unpacklo_epi64(p, r), _mm512_unpackhi_epi64(p, r));
}
/* Blocks 0 + 1 and 2 + 3 of v, in blocks 0 and 2. */
ALWAYS __m512i fold_blocks(__m512i v) {
    return _mm512_add_epi32(v, _mm512_shuffle_i64x2(v, v, _MM_SHUFFLE(2, 3, 0, 1)));
}
/* Lanes idx[i] of v as a 256-bit vector. */
ALWAYS __m256i pick8(__m512i v, __m512i idx) { return _mm512_castsi512_si256(_mm512_permutexvar_epi32(idx, v)); }

/* group_sums, 512 bits wide (same arguments, same results). */
ALWAYS void zmm_group_sums(int fmt, int per, const uint8_t *c, const struct q8acts *q, int64_t g0, int gn, int nt,
                           __m256i s[4]) {
    /* the step's units (per == 4: 2 per group, per == 1: half a group each,
     * a lone last block counting as one) in slots of two */
    int64_t u0 = per == 1 ? g0 / 2 : per == 2 ? g0 : 2 * g0;
    int units = per == 1 ? (gn + 1) / 2 : per == 2 ? gn : 2 * gn, whole = per == 1 ? gn / 2 : units;
    int kind[8];
    for (int j = 0; j < 8; j++) {
        int a = 2 * j, b = 2 * j + 1;
        kind[j] = b < whole ? SLOT_PAIR : a < whole ? (b < units ? SLOT_ONE_LONE : SLOT_ONE)
                : a < units ? SLOT_LONE : SLOT_NONE;
    }
    __m512i v[8][4];
    const int slots = 2 * per;
#pragma GCC unroll 8
    for (int j = 0; j < slots; j++) slot_parts(fmt, kind[j], c, q, u0 + 2 * j, nt, v[j]);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        if (per == 1) {
            /* block k of slot 0 is group g0 + k, of slot 1 g0 + 4 + k */
            __m512i f = fold32(v[0][t], v[1][t]);
            s[t] = pick8(fold64(f, f), _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 0, 0, 0, 0, 0, 0, 0, 0));
        } else if (per == 2) {
            /* blocks 0-1 of slot j are group g0 + 2j, blocks 2-3 g0 + 2j + 1 */
            __m512i f = fold_blocks(fold64(fold32(v[0][t], v[1][t]), fold32(v[2][t], v[3][t])));
            s[t] = pick8(f, _mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 0, 0, 0, 0, 0, 0, 0, 0));
        } else {
            /* slot j is group g0 + j */
            __m512i a = fold64(fold32(v[0][t], v[1][t]), fold32(v[2][t], v[3][t]));
            __m512i b = fold64(fold32(v[4][t], v[5][t]), fold32(v[6][t], v[7][t]));
            __m512i f = fold_blocks(_mm512_add_epi32(_mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                                                     _mm512_shuffle_i64x2(a, b, _MM_SHUFFLE(3, 2, 3, 2))));
            s[t] = pick8(f, _mm512_setr_epi32(0, 1, 2, 3, 8, 9, 10, 11, 0, 0, 0, 0, 0, 0, 0, 0));
        }
    }
}
#endif

/* Adds groups g0 .. g0 + 7 (their sums s[t]; sc, bi the row's scales times
 * the code scale and biases of those groups) to each token's chains. */
ALWAYS void add_groups(int fmt, const struct q8acts *q, int64_t g0, int nt, const __m256i s[4], __m256 sc, __m256 bi,
                       __m256 acc[4]) {
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        int64_t at = t * q->ldg + g0;
        __m256i st = s[t];
        if (fmt == FMT_MX4) st = _mm256_sub_epi32(st, _mm256_loadu_si256((const __m256i *)(const void *)(q->xoff + at)));
        __m256 ds = _mm256_mul_ps(sc, _mm256_loadu_ps(q->dx + at));
        acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st), ds, acc[t]);
        if (fmt != FMT_MX4) acc[t] = _mm256_fmadd_ps(bi, _mm256_loadu_ps(q->xsum + at), acc[t]);
    }
}

/* mxfp4 codes here are 2 * e2m1 (+ 12): their scales times 1/2 */
ALWAYS float code_scale_of(int fmt) { return fmt == FMT_MX4 ? 0.5f / MX4_CODE_SCALE : 1.0f; }

/* A row's scales (times the code scale) and, for affine rows, biases into
 * srow / brow + i * ldg (mxfp4 rows leave brow alone). */
ALWAYS void row_params(int fmt, int sdt, const struct sp_qmat *w, const struct rowfmt *f, const struct q8acts *q,
                       int64_t r, int i) {
    size_t at = (size_t)r * f->scale_row_bytes;
    row_floats(sdt, (const uint8_t *)w->scales + at, f->ng, q->ldg, code_scale_of(fmt), q->srow + i * q->ldg);
    if (fmt != FMT_MX4) row_floats(sdt, (const uint8_t *)w->biases + at, f->ng, q->ldg, 1.0f, q->brow + i * q->ldg);
}

/* Scales (or biases) g0 .. ng - 1 of a row of ng >= 8 groups, gn = ng - g0
 * <= 8 of them, as load8_scales gives them in lanes 0 .. gn - 1 and zero
 * past them (as row_floats stages them): the row's last 8, moved down, so
 * that nothing outside the row is read. */
ALWAYS __m256 last_scales(int sdt, const uint8_t *p, int64_t ng, int gn) {
    const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 v = load8_scales(sdt, p, ng - 8);
    v = _mm256_permutevar8x32_ps(v, _mm256_add_epi32(lane, _mm256_set1_epi32(8 - gn)));
    return _mm256_and_ps(v, _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(gn), lane)));
}

/* 8-bit codes (affine8) multiply the activations as bytes in column order
 * (q8_prepare). With VNNI, vpdpbusd adds four products of an unsigned code
 * and a signed activation into an int32 lane (at most 4 x 255 x 127).
 * AVX2's vpmaddubsw would saturate pairs of them (2 x 255 x 127 > 32767),
 * so there the codes go less 128: |c - 128| as unsigned bytes times x
 * with the sign of c - 128, pairs of at most 2 x 128 x 127, and the
 * group's 128 x its sum of x (q->xoff, A8_OFFSET) added back. Either way
 * a group's int32 sum is exact, so every set gives the same bits. Six
 * instructions a 32 codes where widening both to int16 took ten: one
 * token through 16384 x 2944 affine8-g32 1.3-1.4x as fast (2-core AVX2
 * EPYC, 2 threads), near the memory's speed. */
/* acc + 32 codes c (less A8_OFFSET without VNNI) times 32 activations x, in int32 lanes. */
ALWAYS __m256i a8_acc(__m256i acc, __m256i c, __m256i x) {
#if HAVE_DPWSSD
    return u8_acc(acc, c, x);
#else
    __m256i cs = _mm256_xor_si256(c, _mm256_set1_epi8((char)0x80));  // c - 128 as a signed byte
    __m256i pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(cs), _mm256_sign_epi8(x, cs));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(pairs, _mm256_set1_epi16(1)));
#endif
}

/* Lane i: the sum of v[i]'s 8 lanes. */
ALWAYS __m256i lane_totals8(const __m256i v[8]) {
    __m256i a = _mm256_hadd_epi32(v[0], v[1]), b = _mm256_hadd_epi32(v[2], v[3]);
    __m256i c = _mm256_hadd_epi32(v[4], v[5]), d = _mm256_hadd_epi32(v[6], v[7]);
    /* each 128-bit half: v[0..3] (v[4..7]) summed over that half's lanes */
    __m256i ab = _mm256_hadd_epi32(a, b), cd = _mm256_hadd_epi32(c, d);
    return _mm256_add_epi32(_mm256_permute2x128_si256(ab, cd, 0x20), _mm256_permute2x128_si256(ab, cd, 0x31));
}

/* group_sums for a row of 8-bit codes c: the exact int32 sums of groups
 * g0 .. g0 + gn - 1 (gn <= 8; zero past gn) for tokens t < nt, group g0 + i
 * in lane i; per: 32-column blocks per group. Token after token: the
 * codes of the step come from L1 after the first. */
ALWAYS void a8_group_sums(int per, const uint8_t *c, const struct q8acts *q, int64_t g0, int gn, int nt,
                          __m256i s[4]) {
    const int64_t col0 = g0 * 32 * per;
    for (int64_t k = 0; k < (int64_t)gn * 32 * per; k += 64)
        _mm_prefetch((const char *)c + col0 + k + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
#pragma GCC unroll 4
    for (int t = 0; t < nt; t++) {
        const int8_t *x = xq8(q, t) + col0;
        __m256i v[8];
#pragma GCC unroll 8
        for (int j = 0; j < 8; j++) {
            v[j] = _mm256_setzero_si256();
            if (j >= gn) continue;
            for (int b = 0; b < per; b++) {
                int64_t k = (int64_t)(j * per + b) * 32;
                v[j] = a8_acc(v[j], _mm256_loadu_si256((const __m256i *)(const void *)(c + col0 + k)),
                              _mm256_loadu_si256((const __m256i *)(const void *)(x + k)));
            }
        }
        s[t] = lane_totals8(v);
#if !HAVE_DPWSSD
        /* past the row's groups the offsets are zero, as MX4's (q8_prepare_fmt pads to ldg) */
        s[t] = _mm256_add_epi32(s[t], _mm256_loadu_si256((const __m256i *)(const void *)(q->xoff + t * q->ldg + g0)));
#endif
    }
}

/* The sums of a step of groups, as wide as the build goes. */
ALWAYS void step_sums(int fmt, int per, const uint8_t *c, const struct q8acts *q, int64_t g0, int gn, int nt,
                      __m256i s[4]) {
    if (fmt == FMT_A8) {
        a8_group_sums(per, c, q, g0, gn, nt, s);
        return;
    }
#if HAVE_ZMM
    zmm_group_sums(fmt, per, c, q, g0, gn, nt, s);
#else
    group_sums(fmt, per, c, q, g0, gn, nt, s);
#endif
}

/* Rows of 8 groups or more read their scales and biases in place, as
 * row_params would compute them (the same rounding); shorter rows stage
 * theirs in srow / brow once. */
ALWAYS void q8_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y, int64_t ldy,
                    int fmt, int sdt, int nt, int per) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    const bool staged = f.ng < Q8_CHAINS;
    const __m256 cs = _mm256_set1_ps(code_scale_of(fmt)), zero = _mm256_setzero_ps();
    for (int64_t r = r0; r < r1; r++) {
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)r * f.row_bytes;
        const uint8_t *sp = (const uint8_t *)w->scales + (size_t)r * f.scale_row_bytes;
        const uint8_t *bp = fmt == FMT_MX4 ? NULL : (const uint8_t *)w->biases + (size_t)r * f.scale_row_bytes;
        if (staged) row_params(fmt, sdt, w, &f, q, r, 0);
        __m256 acc[4];
        __m256i s[4];
#pragma GCC unroll 4
        for (int t = 0; t < 4; t++) acc[t] = _mm256_setzero_ps();
        int64_t g0 = 0;
        for (; g0 + Q8_CHAINS <= f.ng; g0 += Q8_CHAINS) {
            step_sums(fmt, per, c, q, g0, Q8_CHAINS, nt, s);
            __m256 sc = _mm256_mul_ps(load8_scales(sdt, sp, g0), cs);
            __m256 bi = fmt == FMT_MX4 ? zero : load8_scales(sdt, bp, g0);
            add_groups(fmt, q, g0, nt, s, sc, bi, acc);
        }
        if (g0 < f.ng) {
            int gn = (int)(f.ng - g0);
            step_sums(fmt, per, c, q, g0, gn, nt, s);
            __m256 sc = staged ? _mm256_loadu_ps(q->srow + g0) : _mm256_mul_ps(last_scales(sdt, sp, f.ng, gn), cs);
            __m256 bi = fmt == FMT_MX4 ? zero : staged ? _mm256_loadu_ps(q->brow + g0) : last_scales(sdt, bp, f.ng, gn);
            add_groups(fmt, q, g0, nt, s, sc, bi, acc);
        }
#pragma GCC unroll 4
        for (int t = 0; t < nt; t++) y[t * ldy + r] = hsum(acc[t]);
    }
}

#if HAVE_ZMM
/* ---- interleaved rows: lanes are rows ----
 *
 * A block of 16 interleaved rows (sp_qmat) gives, per 64 bytes, 4 bytes of
 * codes of each row: after the nibble split, the even and odd columns of 8
 * columns, which meet two dwords of a token's activations broadcast to
 * every lane. A group's sums then come out in the lanes of its rows, whole
 * (no folding across lanes), and one conversion and one or two FMAs a
 * group serve 16 rows. The sums, scales and chains are q8_rows' (so are the
 * results, to the bit); the codes are read as one stream. Zen 5 VM, one
 * token, against q8_rows on the same matrices in row order, both in one
 * process taking turns (medians of 16-30 passes each): affine4-g64 from L2
 * (512 x 2048, one thread) 1.33x the bytes a second, from DRAM on 2 threads
 * 1.36x (4096 x 4096, 56 GB/s), 1.25x (768 x 2048), 1.15x (2048 x 768),
 * 1.45x (151936 x 2048, 65 GB/s); mxfp4 from L2 1.38x, from DRAM 0.89-1.04x
 * (its groups of 32 columns give a block 4 chunks of codes for each round
 * of scale work). A first version of the loop on a Sapphire Rapids Xeon:
 * from DRAM the same speed (its cores outrun its memory either way), from
 * L2 1.4x. */

/* Scales (or biases) of a group of a block's 16 rows at p, as load8_scales
 * gives them. */
ALWAYS __m512 load16_scales(int sdt, const uint8_t *p) {
    if (sdt == SP_DTYPE_U8) {
        __m512i e = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(const void *)p));
        __m512i bits = _mm512_mask_blend_epi32(_mm512_cmpeq_epi32_mask(e, _mm512_setzero_si512()),
                                               _mm512_slli_epi32(e, 23), _mm512_set1_epi32(0x00400000));
        return _mm512_mul_ps(_mm512_castsi512_ps(bits), _mm512_set1_ps(MX4_CODE_SCALE));
    }
    if (sdt == SP_DTYPE_F32) return _mm512_loadu_ps((const float *)(const void *)p);
    __m256i h = _mm256_loadu_si256((const __m256i *)(const void *)p);
    if (sdt == SP_DTYPE_F16) return _mm512_cvtph_ps(h);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* The dword at p as every lane */
ALWAYS __m512i dword16(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return _mm512_set1_epi32(v);
}

/* a + the products of u8 and the dword at p in every lane, the dword read
 * by the vpdpbusd itself (an embedded broadcast, which the compiler does
 * not make of _mm512_set1_epi32: there it is a vpbroadcastd of its own) */
ALWAYS __m512i dpbusd_dword(__m512i a, __m512i u8, const int8_t *p) {
    __asm__("vpdpbusd %2%{1to16%}, %1, %0" : "+v"(a) : "v"(u8), "m"(*(const int32_t *)(const void *)p));
    return a;
}

/* Tokens a pass of the loop on interleaved rows takes at most: 16 int32
 * sums in flight (two a token), the codes of a chunk unpacked once for all
 * of them. */
#define R16_TOKENS 8

/* Group g's sums (codes at c) for nt <= R16_TOKENS tokens: s[t] lane i the
 * int32 sum of row i's group and token t, as group_sums gives it. */
ALWAYS void r16_group_sums(int fmt, int per, int64_t ng, const uint8_t *c, const struct q8acts *q, int64_t g, int nt,
                           __m512i s[R16_TOKENS]) {
    /* the group's columns in the unit order of the activations: its even
     * ones from here on, 4 bytes a chunk of 8 columns, its odd ones `gap`
     * further (16 in a lone last block of 32 columns) */
    const int64_t col = g * 32 * per;
    const int8_t *x = q->xq + col / 64 * 64 + col % 64 / 2;
    const int64_t gap = per == 1 && g == ng - 1 && ng % 2 ? 16 : 32;
    /* chains a token: even and odd columns, and for one token even and odd
     * chunks too */
    __m512i a[R16_TOKENS][4];
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++)
#pragma GCC unroll 4
        for (int m = 0; m < 4; m++) a[t][m] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int k = 0; k < 4 * per; k++) {
        _mm_prefetch((const char *)c + k * 64 + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
        __m512i v = _mm512_loadu_si512((const void *)(c + k * 64));
        __m512i lo, hi;
        zmm_u8_codes(fmt, v, &lo, &hi);
        const int m = nt == 1 ? (k & 1) * 2 : 0;
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) {
            /* 8 chunks to a unit of 64 columns */
            const int8_t *xt = x + t * q->cols + (k / 8) * 64 + (k % 8) * 4;
            a[t][m] = _mm512_dpbusd_epi32(a[t][m], lo, dword16(xt));
            a[t][m + 1] = _mm512_dpbusd_epi32(a[t][m + 1], hi, dword16(xt + gap));
        }
    }
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        s[t] = _mm512_add_epi32(a[t][0], a[t][1]);
        if (nt == 1) s[t] = _mm512_add_epi32(s[t], _mm512_add_epi32(a[t][2], a[t][3]));
    }
}

/* Group g of a block (codes at c, scales and biases at sp and bp) for nt
 * tokens, added to chain j of each token (acc[t][j]; first: it starts
 * here), as q8_rows and the product by tokens add it. */
ALWAYS void r16_group(int fmt, int sdt, int per, int64_t ng, const uint8_t *c, const uint8_t *sp, const uint8_t *bp,
                      const struct q8acts *q, int64_t g, int nt, int j, bool first,
                      __m512 acc[R16_TOKENS][Q8_CHAINS]) {
    const size_t group_scales = SP_QMAT_BLOCK_ROWS * sp_dtype_size(sdt), group_codes = (size_t)(32 * per) / 8 * 64;
    const int64_t ldg = q->ldg;
    __m512i s[R16_TOKENS];
    r16_group_sums(fmt, per, ng, c + (size_t)g * group_codes, q, g, nt, s);
    __m512 sc = _mm512_mul_ps(load16_scales(sdt, sp + (size_t)g * group_scales), _mm512_set1_ps(code_scale_of(fmt)));
    __m512 bi = fmt == FMT_MX4 ? sc : load16_scales(sdt, bp + (size_t)g * group_scales);
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m512i st = s[t];
        if (fmt == FMT_MX4) st = _mm512_sub_epi32(st, _mm512_set1_epi32(q->xoff[t * ldg + g]));
        __m512 ds = _mm512_mul_ps(sc, _mm512_set1_ps(q->dx[t * ldg + g]));
        __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), ds, first ? _mm512_setzero_ps() : acc[t][j]);
        if (fmt != FMT_MX4) v = _mm512_fmadd_ps(bi, _mm512_set1_ps(q->xsum[t * ldg + g]), v);
        acc[t][j] = v;
    }
}

/* Block b of interleaved w times nt <= R16_TOKENS tokens of q, its rows
 * `keep` stored at y (row 0 of the block): every group into Q8_CHAINS
 * chains a token, summed as hsum sums lanes. For one or two tokens the
 * chains stay in registers (the groups unrolled by 8); more keep them in
 * memory, a group at a time. */
ALWAYS void r16_block(const struct sp_qmat *w, int64_t b, const struct q8acts *q, float *y, int64_t ldy,
                      __mmask16 keep, int fmt, int sdt, int nt, int per) {
    const int64_t ng = w->cols / w->group;
    const size_t block_codes = SP_QMAT_BLOCK_ROWS * sp_qtype_row_bytes(w->type, w->cols);
    const size_t at = (size_t)(b * ng * SP_QMAT_BLOCK_ROWS) * sp_dtype_size(sdt);
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)b * block_codes;
    const uint8_t *sp = (const uint8_t *)w->scales + at;
    const uint8_t *bp = fmt == FMT_MX4 ? NULL : (const uint8_t *)w->biases + at;
    __m512 acc[R16_TOKENS][Q8_CHAINS];
    if (nt <= 2) {
        for (int64_t g0 = 0; g0 < ng; g0 += Q8_CHAINS)
#pragma GCC unroll 8
            for (int j = 0; j < Q8_CHAINS; j++) {
                if (g0 + j >= ng) break;
                r16_group(fmt, sdt, per, ng, c, sp, bp, q, g0 + j, nt, j, g0 == 0, acc);
            }
    } else {
        for (int64_t g = 0; g < ng; g++)
            r16_group(fmt, sdt, per, ng, c, sp, bp, q, g, nt, (int)(g % Q8_CHAINS), g < Q8_CHAINS, acc);
    }
    /* chains past ng are zero */
    for (int64_t j = ng; j < Q8_CHAINS; j++)
#pragma GCC unroll 8
        for (int t = 0; t < nt; t++) acc[t][j] = _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int t = 0; t < nt; t++) {
        __m512 *a = acc[t];
        __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                   _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
        _mm512_mask_storeu_ps(y + t * ldy, keep, sum);
    }
}

/* q8_rows and the product by tokens for interleaved w and any number of
 * q's tokens: the blocks holding rows [r0, r1) one at a time (every lane
 * computed, the rows in range stored), each taking its tokens in passes of
 * R16_TOKENS, then 4, 2 and 1, while its codes stay cached. */
ALWAYS void r16_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y, int64_t ldy,
                     int fmt, int sdt, int per) {
    for (int64_t b = r0 / SP_QMAT_BLOCK_ROWS; b * SP_QMAT_BLOCK_ROWS < r1; b++) {
        int64_t first = b * SP_QMAT_BLOCK_ROWS, lo = r0 > first ? r0 - first : 0;
        int64_t hi = r1 < first + SP_QMAT_BLOCK_ROWS ? r1 - first : SP_QMAT_BLOCK_ROWS;
        __mmask16 keep = (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
        int64_t t = 0;
        for (; t + R16_TOKENS <= q->n; t += R16_TOKENS) {
            const struct q8acts qt = q8_from(q, t, R16_TOKENS);
            r16_block(w, b, &qt, y + t * ldy + first, ldy, keep, fmt, sdt, R16_TOKENS, per);
        }
        for (int nt = R16_TOKENS / 2; nt >= 1; nt /= 2) {
            if (q->n - t < nt) continue;
            const struct q8acts qt = q8_from(q, t, nt);
            if (nt == 4) r16_block(w, b, &qt, y + t * ldy + first, ldy, keep, fmt, sdt, 4, per);
            if (nt == 2) r16_block(w, b, &qt, y + t * ldy + first, ldy, keep, fmt, sdt, 2, per);
            if (nt == 1) r16_block(w, b, &qt, y + t * ldy + first, ldy, keep, fmt, sdt, 1, per);
            t += nt;
        }
    }
}
#endif

/* ---- the product by tokens ---- */

/* Where quad k of a pair of token blocks starts in the pair's activations
 * (xt + 16 * cols per pair): the first block's 8 tokens in bytes 0-31, the
 * second's in 32-63. */
ALWAYS int64_t quad_at(int64_t k) { return k * Q8_PAIR * 32; }

/* s[i][j] += quads q .. q + steps - 1 of row i's unpacked codes times the
 * same quads of token block j < nb of the pair at xb: a row's code bytes
 * are broadcast once for the nb blocks. */
ALWAYS void quad_steps(const uint8_t *ub, int64_t cols, const int8_t *xb, int nb, int64_t q, int steps,
                       __m256i s[Q8_BLOCK_ROWS][Q8_PAIR]) {
#pragma GCC unroll 8
    for (int k = 0; k < steps; k++) {
        __m256i x[Q8_PAIR];
#pragma GCC unroll 2
        for (int j = 0; j < nb; j++)
            x[j] = _mm256_loadu_si256((const __m256i *)(const void *)(xb + quad_at(q + k) + j * 32));
#pragma GCC unroll 4
        for (int i = 0; i < Q8_BLOCK_ROWS; i++) {
            int32_t u;
            memcpy(&u, ub + i * cols + (q + k) * 4, 4);
            __m256i uv = _mm256_set1_epi32(u);
#pragma GCC unroll 2
            for (int j = 0; j < nb; j++) {
                s[i][j] = u8_acc(s[i][j], uv, x[j]);
                /* keeps the sums one chain each: regrouped into trees (integer
                 * adds may be) they need more registers than there are */
                __asm__("" : "+x"(s[i][j]));
            }
        }
    }
}

/* The exact int32 sums of group g of Q8_BLOCK_ROWS rows for token blocks j
 * < nb (lane = token). 16-bit sums of pairs stay exact over 8 steps for
 * affine codes (8 x 2 x 15 x 127 < 32768), 4 for mxfp4 (4 x 2 x 24 x 127),
 * or the whole mxfp4 group where the blocks' activations allow (wide:
 * mx4_group_fits; with VNNI the sums are int32 throughout). */
ALWAYS void block_group(int fmt, int per, const uint8_t *ub, int64_t cols, const int8_t *xb, int nb, int64_t g,
                        bool lone, bool wide, __m256i sum[Q8_BLOCK_ROWS][Q8_PAIR]) {
    const int run = fmt == FMT_MX4 ? 4 : 8;
    __m256i s[Q8_BLOCK_ROWS][Q8_PAIR];
#define EACH_SUM(...)                                               \
    _Pragma("GCC unroll 4") for (int i = 0; i < Q8_BLOCK_ROWS; i++) \
        _Pragma("GCC unroll 2") for (int j = 0; j < nb; j++) { __VA_ARGS__ }
    EACH_SUM(sum[i][j] = s[i][j] = _mm256_setzero_si256();)
    if (per == 1) {
        /* the group's even columns are quads 4h .. 4h + 3 of its unit, the odd
         * ones 8 further (a lone block: right after) */
        int64_t qa = (g / 2) * 16 + (g & 1) * 4, qb = qa + (lone ? 4 : 8);
        quad_steps(ub, cols, xb, nb, qa, 4, s);
        if (run == 4 && !wide) EACH_SUM(sum[i][j] = u8_widen(s[i][j]), s[i][j] = _mm256_setzero_si256();)
        quad_steps(ub, cols, xb, nb, qb, 4, s);
        EACH_SUM(sum[i][j] = _mm256_add_epi32(sum[i][j], u8_widen(s[i][j]));)
        return;
    }
    const int runs = 16 * (per / 2) / run;
#pragma GCC unroll 4
    for (int k = 0; k < runs; k++) {
        quad_steps(ub, cols, xb, nb, g * 16 * (per / 2) + k * run, run, s);
        EACH_SUM(sum[i][j] = _mm256_add_epi32(sum[i][j], u8_widen(s[i][j])), s[i][j] = _mm256_setzero_si256();)
    }
#undef EACH_SUM
}

/* Whether the amx build lays out the unpacked codes and the token blocks
 * (ub, xt) of rows with groups of 32 columns in group order: each group's
 * 16 even columns, then its 16 odd ones, so that its 8 quads are one run of
 * a tile (unit order has them 4 and 4, 8 quads apart). */
ALWAYS bool group_order(int64_t group) { return HAVE_AMX && group == 32; }

/* The amx build multiplies mxfp4 codes as signed bytes, 2 * e2m1
 * (tdpbssd), so a group's tile sum lacks the offset that the vector
 * products subtract (MX4_OFFSET x the sum of its activations): the same
 * integer, one subtraction fewer per row, token and group (the product
 * alone, Xeon, one thread, from cache, 768 x 2048 and 2048 x 768 at 32
 * tokens: median 1.05x the unsigned codes' speed in 10 paired runs,
 * 0.71-1.15). */
ALWAYS __m256i amx_codes(int fmt, __m256i u8) {
    return HAVE_AMX && fmt == FMT_MX4 ? _mm256_sub_epi8(u8, _mm256_set1_epi8(MX4_OFFSET)) : u8;
}

/* Rows r .. r + nr - 1 as bytes in ub (unsigned, or as amx_codes leaves
 * them; unit order, or group order where group_order says so; a lone last
 * block as its 16 even then 16 odd columns) and their scales and biases;
 * rows past nr repeat the first (computed, never stored). */
ALWAYS void unpack_rows(int fmt, int sdt, const struct sp_qmat *w, const struct rowfmt *f, const struct q8acts *q,
                        int64_t r, int nr) {
    int64_t units = f->cols / 64;
    for (int i = 0; i < Q8_UNPACK_ROWS; i++) {
        int64_t ri = r + (i < nr ? i : 0);
        const uint8_t *c = (const uint8_t *)w->codes + (size_t)ri * f->row_bytes;
        uint8_t *o = q->ub + i * f->cols;
        for (int64_t u = 0; u < units; u++) {
            __m256i lo, hi;
            /* the same bytes of the rows two passes on (measured against one
             * and four on: 1.03-1.04x and 1.02x in a 512-token prefill) */
            if (!(u & 1)) _mm_prefetch((const char *)c + 2 * Q8_UNPACK_ROWS * f->row_bytes + u * 32, _MM_HINT_T0);
            u8_codes(fmt, c + u * 32, &lo, &hi);
            if (group_order(f->group)) {
                __m256i ga = _mm256_permute2x128_si256(lo, hi, 0x20), gb = _mm256_permute2x128_si256(lo, hi, 0x31);
                lo = ga;
                hi = gb;
            }
            _mm256_storeu_si256((__m256i *)(void *)(o + u * 64), amx_codes(fmt, lo));
            _mm256_storeu_si256((__m256i *)(void *)(o + u * 64 + 32), amx_codes(fmt, hi));
        }
        if (units * 64 < f->cols)
            _mm256_storeu_si256((__m256i *)(void *)(o + units * 64), amx_codes(fmt, u8_lone_codes(fmt, c + units * 32)));
        row_params(fmt, sdt, w, f, q, ri, i);
    }
}

/* r[0..7] (8 rows of 8 floats) transposed in place: r[k] holds element k
 * of every row. */
ALWAYS void transpose8_ps(__m256 r[8]) {
    /* pairs of rows interleaved, then quads: a[4h + i] holds elements i and
     * i + 4 of rows 4h .. 4h + 3 */
    __m256 a[8];
    for (int h = 0; h < 2; h++) {
        __m256 lo01 = _mm256_unpacklo_ps(r[4 * h], r[4 * h + 1]), hi01 = _mm256_unpackhi_ps(r[4 * h], r[4 * h + 1]);
        __m256 lo23 = _mm256_unpacklo_ps(r[4 * h + 2], r[4 * h + 3]), hi23 = _mm256_unpackhi_ps(r[4 * h + 2], r[4 * h + 3]);
        a[4 * h] = _mm256_shuffle_ps(lo01, lo23, 0x44);
        a[4 * h + 1] = _mm256_shuffle_ps(lo01, lo23, 0xEE);
        a[4 * h + 2] = _mm256_shuffle_ps(hi01, hi23, 0x44);
        a[4 * h + 3] = _mm256_shuffle_ps(hi01, hi23, 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        r[i] = _mm256_permute2f128_ps(a[i], a[4 + i], 0x20);
        r[4 + i] = _mm256_permute2f128_ps(a[i], a[4 + i], 0x31);
    }
}

/* The 8 dwords at byte `at` of 8 rows (src[t], NULL: zeros) as 8 x 8
 * transposed, ld dwords apart: dwords 0-3 of row t at lo[k * ld + t] (k <
 * 4), dwords 4-7 at hi[(k - 4) * ld + t]. */
ALWAYS void transpose8x8_split(const void *const src[8], int64_t at, void *lo, void *hi, int64_t ld) {
    __m256 r[8];
    for (int t = 0; t < 8; t++)
        r[t] = src[t] ? _mm256_loadu_ps((const float *)(const void *)((const char *)src[t] + at)) : _mm256_setzero_ps();
    transpose8_ps(r);
    for (int k = 0; k < 4; k++) {
        _mm256_storeu_ps((float *)lo + ld * k, r[k]);
        _mm256_storeu_ps((float *)hi + ld * k, r[4 + k]);
    }
}

/* transpose8x8_split into one place: dst[k * ld + t] = dword k of row t. */
ALWAYS void transpose8x8(const void *const src[8], int64_t at, void *dst, int64_t ld) {
    transpose8x8_split(src, at, dst, (float *)dst + 4 * ld, ld);
}

/* Tokens b * 8 .. b * 8 + 7 (zero past n) side by side: xt quads of 8
 * tokens (half of each 64-byte quad of the block's pair), and their
 * per-group dx and sums (xst, or xot for mxfp4) 8 per group. */
static void block_tokens(const struct q8acts *q, int64_t b) {
    int64_t ldg = q->ldg;
    int8_t *xt = q->xt + (b / Q8_PAIR) * q->cols * Q8_PAIR * Q8_BLOCK_TOKENS + (b % Q8_PAIR) * 32;
    size_t at = (size_t)(b * ldg * Q8_BLOCK_TOKENS);
    /* the rows read the float sums (affine) or the integer offsets (mxfp4) */
    void *sums = q->mx4 ? (void *)(q->xot + at) : (void *)(q->xst + at);
    const void *x[Q8_BLOCK_TOKENS], *dx[Q8_BLOCK_TOKENS], *xs[Q8_BLOCK_TOKENS];
    for (int t = 0; t < Q8_BLOCK_TOKENS; t++) {
        int64_t tg = b * Q8_BLOCK_TOKENS + t;
        bool real = tg < q->n;
        x[t] = real ? xq8(q, tg) : NULL;
        dx[t] = real ? q->dx + tg * ldg : NULL;
        xs[t] = !real ? NULL : q->mx4 ? (const void *)(q->xoff + tg * ldg) : (const void *)(q->xsum + tg * ldg);
    }
    /* cols is a multiple of 32 (8 quads), ldg of 8; sums are 4-byte values.
     * In group order (as unpack_rows lays out the codes) the 4 odd quads of
     * a unit's first group trade places with the 4 even ones of its second. */
    int64_t k = 0;
    if (group_order(q->cols / q->ng)) {
        for (; k + 64 <= q->cols; k += 64) {
            int8_t *o = xt + quad_at(k / 4);
            transpose8x8_split(x, k, o, o + quad_at(8), Q8_PAIR * 8);
            transpose8x8_split(x, k + 32, o + quad_at(4), o + quad_at(12), Q8_PAIR * 8);
        }
    }
    for (; k < q->cols; k += 32) transpose8x8(x, k, xt + quad_at(k / 4), Q8_PAIR * 8);
    for (int64_t g = 0; g < ldg; g += 8) {
        transpose8x8(dx, g * 4, q->dxt + at + g * Q8_BLOCK_TOKENS, 8);
        transpose8x8(xs, g * 4, (char *)sums + g * Q8_BLOCK_TOKENS * 4, 8);
    }
}

/* The blocks of n tokens the products by tokens compute: the avx512 build
 * takes whole pairs, so a last odd block gets a partner of zeros (computed,
 * not stored). */
ALWAYS int64_t blocks_computed(int64_t n) {
    int64_t nb = (n + Q8_BLOCK_TOKENS - 1) / Q8_BLOCK_TOKENS;
    return HAVE_ZMM ? (nb + Q8_PAIR - 1) / Q8_PAIR * Q8_PAIR : nb;
}

/* Every block of q's tokens side by side (block_tokens), before the
 * products by tokens. */
static void q8_block_tokens(const struct q8acts *q) {
    for (int64_t b = 0, nb = blocks_computed(q->n); b < nb; b++) block_tokens(q, b);
}

/* Where chain c of row i for token block j (of a pass) starts in
 * q->chains: the pass's blocks side by side, so that the avx512 build
 * updates a pair of them with one 512-bit vector. */
ALWAYS int64_t chain_at(int i, int64_t c, int j) {
    return ((i * Q8_CHAINS + c) * Q8_PASS + j) * Q8_BLOCK_TOKENS;
}

/* Group g of the unpacked rows times token blocks b .. b + nb - 1 (from
 * xb), added to the rows' chains g % 8 (first: the chains start here). */
ALWAYS void block_group_add(int fmt, int per, const struct q8acts *q, const int8_t *xb, int nb, int64_t b, int64_t g,
                            bool lone, bool wide, bool first) {
    __m256i sum[Q8_BLOCK_ROWS][Q8_PAIR];
    block_group(fmt, per, q->ub, q->cols, xb, nb, g, lone, wide, sum);
    /* loaded before the chains are stored (which could alias them) */
    __m256 dx[Q8_PAIR], xs[Q8_PAIR];
    __m256i xo[Q8_PAIR];
#pragma GCC unroll 2
    for (int j = 0; j < nb; j++) {
        size_t at = (size_t)(((b + j) * q->ldg + g) * Q8_BLOCK_TOKENS);
        dx[j] = _mm256_loadu_ps(q->dxt + at);
        if (fmt == FMT_MX4)
            xo[j] = _mm256_loadu_si256((const __m256i *)(const void *)(q->xot + at));
        else
            xs[j] = _mm256_loadu_ps(q->xst + at);
    }
#pragma GCC unroll 4
    for (int i = 0; i < Q8_BLOCK_ROWS; i++) {
        __m256 sr = _mm256_broadcast_ss(q->srow + i * q->ldg + g);
        __m256 br = fmt == FMT_MX4 ? sr : _mm256_broadcast_ss(q->brow + i * q->ldg + g);
#pragma GCC unroll 2
        for (int j = 0; j < nb; j++) {
            float *a = q->chains + chain_at(i, g % Q8_CHAINS, j);
            __m256i st = fmt == FMT_MX4 ? _mm256_sub_epi32(sum[i][j], xo[j]) : sum[i][j];
            __m256 ds = _mm256_mul_ps(sr, dx[j]);
            __m256 v = _mm256_fmadd_ps(_mm256_cvtepi32_ps(st), ds, first ? _mm256_setzero_ps() : _mm256_loadu_ps(a));
            if (fmt != FMT_MX4) v = _mm256_fmadd_ps(br, xs[j], v);
            _mm256_storeu_ps(a, v);
        }
    }
}

#if HAVE_ZMM
/* A pair of token blocks in one 512-bit vector: lanes 0-7 block b's 8
 * tokens, 8-15 block b + 1's; a pass takes one or two pairs (np). The sums
 * are block_group's integers, the float work block_group_add's operations
 * lane for lane, so the results are the same bits; each quad of codes takes
 * one vpdpbusd per row and pair. */
ALWAYS __m512 pair_ps(const float *a, const float *b) {
    return _mm512_insertf32x8(_mm512_castps256_ps512(_mm256_loadu_ps(a)), _mm256_loadu_ps(b), 1);
}

/* Runs of quads per row and pair whose sums add up at the end of a group:
 * ZMM_SUMS chains of vpdpbusd in flight in all. */
ALWAYS int zmm_runs(int np) { return ZMM_SUMS / (ZMM_ROWS * np); }

/* s[i][p][m] += quads q .. q + steps - 1 of row i's unpacked codes (ub, as
 * quad_steps reads them) times the same quads of pair p: one broadcast of
 * a code dword per row and quad, one vpdpbusd per pair (m: the quad's
 * place in a run of zmm_runs(np)). */
ALWAYS void zmm_quad_steps(const uint8_t *ub, int64_t cols, const int8_t *xb, int np, int64_t q, int steps,
                           __m512i s[ZMM_ROWS][Q8_PASS / Q8_PAIR][ZMM_SUMS / ZMM_ROWS]) {
    const int par = zmm_runs(np);
    /* the rows' and pairs' first quads: the steps read at fixed offsets from them */
    const uint8_t *row[ZMM_ROWS];
    const int8_t *pair[Q8_PASS / Q8_PAIR];
#pragma GCC unroll 8
    for (int i = 0; i < ZMM_ROWS; i++) row[i] = ub + i * cols + q * 4;
#pragma GCC unroll 2
    for (int p = 0; p < np; p++) pair[p] = xb + p * Q8_PAIR * Q8_BLOCK_TOKENS * cols + quad_at(q);
#pragma GCC unroll 32
    for (int k = 0; k < steps; k++) {
        __m512i x[Q8_PASS / Q8_PAIR];
#pragma GCC unroll 2
        for (int p = 0; p < np; p++) {
            x[p] = _mm512_loadu_si512(pair[p] + quad_at(k));
            __asm__("" : "+v"(x[p]));  // one load for all the rows, not one folded into each
        }
#pragma GCC unroll 8
        for (int i = 0; i < ZMM_ROWS; i++) {
            int32_t u;
            memcpy(&u, row[i] + k * 4, 4);
            __m512i c = _mm512_set1_epi32(u);
#pragma GCC unroll 2
            for (int p = 0; p < np; p++) {
                int m = k % par;
                s[i][p][m] = _mm512_dpbusd_epi32(s[i][p][m], c, x[p]);
                __asm__("" : "+v"(s[i][p][m]));
            }
        }
    }
}

/* block_group_add for the np pairs of blocks from b on. */
ALWAYS void zmm_block_group_add(int fmt, int per, const struct q8acts *q, const int8_t *xb, int np, int64_t b,
                                int64_t g, bool lone, bool first) {
    const int par = zmm_runs(np);
    __m512i s[ZMM_ROWS][Q8_PASS / Q8_PAIR][ZMM_SUMS / ZMM_ROWS];
#pragma GCC unroll 8
    for (int i = 0; i < ZMM_ROWS; i++)
#pragma GCC unroll 2
        for (int p = 0; p < np; p++)
#pragma GCC unroll 4
            for (int m = 0; m < par; m++) s[i][p][m] = _mm512_setzero_si512();
    /* the group's quads as block_group takes them */
    if (per == 1) {
        int64_t qa = (g / 2) * 16 + (g & 1) * 4;
        zmm_quad_steps(q->ub, q->cols, xb, np, qa, 4, s);
        zmm_quad_steps(q->ub, q->cols, xb, np, qa + (lone ? 4 : 8), 4, s);
    } else {
        zmm_quad_steps(q->ub, q->cols, xb, np, g * 16 * (per / 2), 16 * (per / 2), s);
    }
    /* q's fields in locals: the chains' stores may alias any memory
     * (-fno-strict-aliasing), which would have each one reloaded */
    const int64_t ldg = q->ldg;
    const float *dxt = q->dxt, *xst = q->xst, *srow = q->srow, *brow = q->brow;
    const int32_t *xot = q->xot;
    float *chains = q->chains;
    __m512 dx[Q8_PASS / Q8_PAIR], xs[Q8_PASS / Q8_PAIR];
    __m512i xo[Q8_PASS / Q8_PAIR];
#pragma GCC unroll 2
    for (int p = 0; p < np; p++) {
        size_t at0 = (size_t)(((b + Q8_PAIR * p) * ldg + g) * Q8_BLOCK_TOKENS);
        size_t at1 = at0 + (size_t)(ldg * Q8_BLOCK_TOKENS);
        dx[p] = pair_ps(dxt + at0, dxt + at1);
        xs[p] = _mm512_setzero_ps();
        xo[p] = _mm512_setzero_si512();
        if (fmt == FMT_MX4)
            xo[p] = _mm512_castps_si512(
                pair_ps((const float *)(const void *)(xot + at0), (const float *)(const void *)(xot + at1)));
        else
            xs[p] = pair_ps(xst + at0, xst + at1);
    }
#pragma GCC unroll 8
    for (int i = 0; i < ZMM_ROWS; i++) {
        __m512 sr = _mm512_set1_ps(srow[i * ldg + g]);
#pragma GCC unroll 2
        for (int p = 0; p < np; p++) {
            float *a = chains + chain_at(i, g % Q8_CHAINS, Q8_PAIR * p);
            __m512i st = s[i][p][0];
#pragma GCC unroll 3
            for (int m = 1; m < par; m++) st = _mm512_add_epi32(st, s[i][p][m]);
            if (fmt == FMT_MX4) st = _mm512_sub_epi32(st, xo[p]);
            __m512 prev = first ? _mm512_setzero_ps() : _mm512_loadu_ps(a);
            __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(sr, dx[p]), prev);
            if (fmt != FMT_MX4) v = _mm512_fmadd_ps(_mm512_set1_ps(brow[i * ldg + g]), xs[p], v);
            _mm512_storeu_ps(a, v);
        }
    }
}
#endif

#if HAVE_ZMM
/* The product by tokens on interleaved rows: lanes are rows, as in
 * r16_rows, and the tokens come from their blocks (xt, as block_tokens
 * sets them side by side), whose dwords of a quad lie in one place, each
 * token's at a fixed offset; the codes of a chunk are unpacked once for all
 * the tokens of a pass and need no copy. A pass takes two blocks of rows
 * and a block of 8 tokens (each broadcast dword of activations multiplies
 * both), or a last block of rows and a pair of token blocks (each dword
 * broadcast by the vpdpbusd itself): 16 int32 sums in flight either way.
 * The sums, scales and chains are the product by tokens' (so are the
 * results, to the bit). Zen 5 VM, one thread, from cache, against the
 * product by tokens on the same rows in row order, in one process taking
 * turns (medians of 15 passes): affine4-g64 768 x 2048 at 16 tokens
 * 1.35-1.4x, at 32 1.15x, at 64 1.11x, 2048 x 768 at 64 1.38x; mxfp4 768 x
 * 2048 at 16 tokens 1.38x, at 64 1.04x. Those at 64 tokens are 1.08-1.18x
 * the speed of passes of one block of rows and 16 tokens (which the amx
 * build keeps: on the Xeon below two blocks of rows measured 0.65-0.72x the
 * speed of AMX tiles in row order at 64 tokens, where one block had
 * measured 0.95-0.98x; separate machines). With the int
 * sums alone (no float work) the loop runs at most 1.1x faster: about 65%
 * of the vpdpbusd the core retires (bench/peak: 6.5 a nanosecond). On a
 * Sapphire Rapids Xeon (bench/kernels, 2 threads, 4096 x 4096 affine4-g64,
 * 64 tokens, passes of one block of rows): 871 G multiply-adds a second,
 * against 410 for avx512 in row order and 837 for AMX tiles in row order
 * (544 on tiles through a row-order copy of each block), so the amx build
 * takes this loop too, except for groups of 32 columns, whose token blocks
 * it lays out in group order (group_order). */
#define R16_PAIR_TOKENS (Q8_PAIR * Q8_BLOCK_TOKENS)

/* Group g's sums for nrb (1 or 2) blocks of rows, the first's group codes
 * at c, the next's block_codes further, and the tokens at xb (a pair of
 * token blocks for one block of rows, one token block for two): s[r][t]
 * lane i the int32 sum of row i of block r's group and token t. Two blocks
 * of rows take each broadcast dword of activations twice. */
ALWAYS void r16_pass_sums(int fmt, int per, int64_t ng, const uint8_t *c, size_t block_codes, const int8_t *xb,
                          int64_t g, int nrb, __m512i s[2][R16_PAIR_TOKENS]) {
    const int nt = R16_PAIR_TOKENS / nrb;
    /* the quads of the group's even columns from here on (r16_group_sums'
     * offsets, a quad to 4 bytes), its odd ones gap quads further */
    const int64_t col = g * 32 * per, quad = (col / 64 * 64 + col % 64 / 2) / 4;
    const int64_t gap = per == 1 && g == ng - 1 && ng % 2 ? 4 : 8;
#pragma GCC unroll 2
    for (int r = 0; r < nrb; r++)
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) s[r][t] = _mm512_setzero_si512();
#pragma GCC unroll 16
    for (int k = 0; k < 4 * per; k++) {
        __m512i lo[2], hi[2];
#pragma GCC unroll 2
        for (int r = 0; r < nrb; r++) {
            const uint8_t *cr = c + r * block_codes + k * 64;
            _mm_prefetch((const char *)cr + PREFETCH_AHEAD_4BIT, _MM_HINT_T0);
            zmm_u8_codes(fmt, _mm512_loadu_si512((const void *)cr), &lo[r], &hi[r]);
        }
        /* 8 chunks to a unit of 16 quads; token t's dword at 4t */
        const int8_t *xe = xb + quad_at(quad + (k / 8) * 16 + k % 8), *xo = xe + quad_at(gap);
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            if (nrb == 1) {
                s[0][t] = dpbusd_dword(s[0][t], lo[0], xe + 4 * t);
                s[0][t] = dpbusd_dword(s[0][t], hi[0], xo + 4 * t);
                continue;
            }
            __m512i e = dword16(xe + 4 * t), o = dword16(xo + 4 * t);
#pragma GCC unroll 2
            for (int r = 0; r < nrb; r++) {
                s[r][t] = _mm512_dpbusd_epi32(s[r][t], lo[r], e);
                s[r][t] = _mm512_dpbusd_epi32(s[r][t], hi[r], o);
            }
        }
    }
}

/* nrb blocks of rows of interleaved w from rb on (1: with token blocks b
 * and b + 1 of q; 2: with token block b), the rows keep[r] of tokens
 * before q->n stored at y (row 0 of block rb, token 0 of block b). */
ALWAYS void r16_pass(const struct sp_qmat *w, int64_t rb, int nrb, const struct q8acts *q, int64_t b, float *y,
                     int64_t ldy, const __mmask16 keep[2], int fmt, int sdt, int per) {
    const int nt = R16_PAIR_TOKENS / nrb;
    const int64_t ng = w->cols / w->group, ldg = q->ldg;
    const size_t group_scales = SP_QMAT_BLOCK_ROWS * sp_dtype_size(sdt), group_codes = (size_t)(32 * per) / 8 * 64;
    const size_t block_codes = SP_QMAT_BLOCK_ROWS * sp_qtype_row_bytes(w->type, w->cols);
    const size_t at = (size_t)(rb * ng) * group_scales, block_groups = (size_t)ng * group_scales;
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)rb * block_codes;
    const uint8_t *sp = (const uint8_t *)w->scales + at;
    const uint8_t *bp = fmt == FMT_MX4 ? NULL : (const uint8_t *)w->biases + at;
    /* block b of its pair (block_tokens' layout) */
    const int8_t *xb = q->xt + (b / Q8_PAIR) * q->cols * Q8_PAIR * Q8_BLOCK_TOKENS + (b % Q8_PAIR) * 32;
    const __m512 cs = _mm512_set1_ps(code_scale_of(fmt));
    __m512 acc[2][R16_PAIR_TOKENS][Q8_CHAINS];
    for (int64_t g = 0; g < ng; g++) {
        __m512i s[2][R16_PAIR_TOKENS];
        r16_pass_sums(fmt, per, ng, c + (size_t)g * group_codes, block_codes, xb, g, nrb, s);
        __m512 sc[2], bi[2];
#pragma GCC unroll 2
        for (int r = 0; r < nrb; r++) {
            size_t o = r * block_groups + (size_t)g * group_scales;
            sc[r] = _mm512_mul_ps(load16_scales(sdt, sp + o), cs);
            bi[r] = fmt == FMT_MX4 ? sc[r] : load16_scales(sdt, bp + o);
        }
        const int j = (int)(g % Q8_CHAINS);
#pragma GCC unroll 16
        for (int t = 0; t < nt; t++) {
            /* token t's per-group values in its block's rows of them */
            size_t tg = (size_t)(((b + t / Q8_BLOCK_TOKENS) * ldg + g) * Q8_BLOCK_TOKENS + t % Q8_BLOCK_TOKENS);
            const __m512 dx = _mm512_set1_ps(q->dxt[tg]);
#pragma GCC unroll 2
            for (int r = 0; r < nrb; r++) {
                __m512i st = s[r][t];
                if (fmt == FMT_MX4) st = _mm512_sub_epi32(st, _mm512_set1_epi32(q->xot[tg]));
                __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(sc[r], dx),
                                           g < Q8_CHAINS ? _mm512_setzero_ps() : acc[r][t][j]);
                if (fmt != FMT_MX4) v = _mm512_fmadd_ps(bi[r], _mm512_set1_ps(q->xst[tg]), v);
                acc[r][t][j] = v;
            }
        }
    }
    for (int r = 0; r < nrb; r++) {
        /* chains past ng are zero */
        for (int64_t j = ng; j < Q8_CHAINS; j++)
            for (int t = 0; t < nt; t++) acc[r][t][j] = _mm512_setzero_ps();
        for (int t = 0; t < nt && b * Q8_BLOCK_TOKENS + t < q->n; t++) {
            __m512 *a = acc[r][t];
            __m512 sum = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a[0], a[4]), _mm512_add_ps(a[2], a[6])),
                                       _mm512_add_ps(_mm512_add_ps(a[1], a[5]), _mm512_add_ps(a[3], a[7])));
            _mm512_mask_storeu_ps(y + t * ldy + r * SP_QMAT_BLOCK_ROWS, keep[r], sum);
        }
    }
}

/* The rows of block rb in [r0, r1) as a mask of its lanes (none for a
 * block past r1) */
ALWAYS __mmask16 block_keep(int64_t rb, int64_t r0, int64_t r1) {
    int64_t first = rb * SP_QMAT_BLOCK_ROWS, lo = r0 > first ? r0 - first : 0;
    int64_t hi = r1 < first + SP_QMAT_BLOCK_ROWS ? r1 - first : SP_QMAT_BLOCK_ROWS;
    if (hi <= lo) return 0;
    return (__mmask16)(((1u << hi) - 1) & ~((1u << lo) - 1));
}

/* Rows [r0, r1) of interleaved w by tokens, q's blocks set side by side
 * (q8_block_tokens): two blocks of rows at a time with each token block
 * (not in the amx build), or one with each pair of them, the codes cached
 * while every token block passes over them. */
ALWAYS void r16_block_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y,
                           int64_t ldy, int fmt, int sdt, int per) {
    const int64_t nb = (q->n + Q8_BLOCK_TOKENS - 1) / Q8_BLOCK_TOKENS, pairs = blocks_computed(q->n);
    for (int64_t rb = r0 / SP_QMAT_BLOCK_ROWS; rb * SP_QMAT_BLOCK_ROWS < r1;) {
        const __mmask16 keep[2] = {block_keep(rb, r0, r1), block_keep(rb + 1, r0, r1)};
        float *yb = y + rb * SP_QMAT_BLOCK_ROWS;
        if (!HAVE_AMX && (rb + 1) * SP_QMAT_BLOCK_ROWS < r1) {
            for (int64_t b = 0; b < nb; b++)
                r16_pass(w, rb, 2, q, b, yb + b * Q8_BLOCK_TOKENS * ldy, ldy, keep, fmt, sdt, per);
            rb += 2;
        } else {
            for (int64_t b = 0; b < pairs; b += Q8_PAIR)
                r16_pass(w, rb, 1, q, b, yb + b * Q8_BLOCK_TOKENS * ldy, ldy, keep, fmt, sdt, per);
            rb++;
        }
    }
}
#endif

#if HAVE_AMX
/* The product by tokens on AMX tiles: a tile of codes holds a run of 16
 * quads (64 columns in unit order; for groups of 32 columns 8 quads, a
 * group in group order) of the 16 unpacked rows, a tile of activations the
 * same quads of a pair of token blocks, which xt already lays out as AMX
 * wants its second operand (a row per quad, a dword per token); tdpbusd
 * (tdpbssd for mxfp4) adds their products into a tile of sums, one per
 * pair: row i, lane t is the int32 sum of row i and token t, the integers
 * zmm_block_group_add computes, lane for lane. Even
 * groups use tiles 0-3, odd ones 4-7, and store their sums into buffers of
 * their own, so that a group's tile work overlaps the float work of the
 * group before and waits on no tile of it. */
/* tiles of the even groups' set; the odd groups' are these + 4 */
#define TILE_SUM0 0
#define TILE_SUM1 1
#define TILE_CODES 2
#define TILE_ACTS 3

struct tile_config {
    uint8_t palette, start_row, reserved[14];
    uint16_t bytes[16];  // per tile row
    uint8_t rows[16];
};

/* Loads the tile shapes for rows of groups of 32 x per columns; a thread
 * does so before its first tile instruction, each thread having tile state
 * of its own. Sums: 16 rows x 16 tokens. Codes and activations: a run of
 * 16 quads (codes 16 rows of 64 bytes, activations 16 rows of 64 bytes)
 * for groups of 64 and 128 columns; for groups of 32, runs of 8 quads
 * (codes 16 rows x 32 bytes, activations 8 rows x 64 bytes), one a
 * group. */
static void amx_rows_begin(int per) {
    struct tile_config c __attribute__((aligned(64))) = {.palette = 1};
    const int quads = per == 1 ? 8 : 16;
    for (int t = 0; t < 8; t++) {
        bool codes = t % 4 == TILE_CODES, acts = t % 4 == TILE_ACTS;
        c.rows[t] = (uint8_t)(acts ? quads : 16);
        c.bytes[t] = (uint16_t)(codes ? 4 * quads : 64);
    }
    /* not _tile_loadconfig: GCC 12's tells the compiler it reads 8 bytes of
     * the config, and once this function was inlined the stores of later
     * tiles' widths went as dead (a #GP from ldtilecfg) */
    __asm__ volatile("ldtilecfg %0" : : "m"(c));
}

/* Releases the tiles (the OS then saves no tile state for the thread). */
static void amx_rows_end(void) { _tile_release(); }

/* The int32 sums of a pass's pairs and one group: [pair][row][token] */
typedef int32_t amx_sums[Q8_PASS / Q8_PAIR][Q8_UNPACK_ROWS][16];

/* S += C x A: signed mxfp4 codes (amx_codes) by tdpbssd, else unsigned
 * codes by tdpbusd */
#define AMX_DOT(fmt, S, C, A)         \
    do {                              \
        if ((fmt) == FMT_MX4)         \
            _tile_dpbssd(S, C, A);    \
        else                          \
            _tile_dpbusd(S, C, A);    \
    } while (0)

/* A run of quads from qd (16, or 8 for groups of 32 columns: the shapes
 * amx_rows_begin set) of the rows times the same quads of np pairs, added
 * to sum tiles S0, S1 through tiles C (codes) and A (activations): tile
 * numbers as literals, which GCC's tile intrinsics need */
#define AMX_RUN(fmt, S0, S1, C, A, q, xb, np, qd)                                                \
    do {                                                                                         \
        const int8_t *acts_ = (xb) + quad_at(qd);                                                \
        _tile_loadd(C, (q)->ub + (qd) * 4, (q)->cols);                                           \
        _tile_loadd(A, acts_, 64);                                                               \
        AMX_DOT(fmt, S0, C, A);                                                                  \
        if ((np) > 1) {                                                                          \
            _tile_loadd(A, acts_ + Q8_PAIR * Q8_BLOCK_TOKENS * (q)->cols, 64);                   \
            AMX_DOT(fmt, S1, C, A);                                                              \
        }                                                                                        \
    } while (0)

/* Group g's sums into out, through tiles S0, S1, C, A: its per / 2 runs
 * of 16 quads, or for groups of 32 columns (per 1, in group order) its one
 * run of 8 */
#define AMX_GROUP_SUMS(fmt, S0, S1, C, A, per, q, xb, np, g, out)                                           \
    do {                                                                                                    \
        _tile_zero(S0);                                                                                     \
        if ((np) > 1) _tile_zero(S1);                                                                       \
        if ((per) == 1)                                                                                     \
            AMX_RUN(fmt, S0, S1, C, A, q, xb, np, (g) * 8);                                                 \
        else                                                                                                \
            for (int k_ = 0; k_ < (per) / 2; k_++)                                                          \
                AMX_RUN(fmt, S0, S1, C, A, q, xb, np, ((g) * (per) / 2 + k_) * 16);                         \
        _tile_stored(S0, (out)[0], 64);                                                                     \
        if ((np) > 1) _tile_stored(S1, (out)[1], 64);                                                       \
    } while (0)

ALWAYS void amx_group_sums(int fmt, int per, const struct q8acts *q, const int8_t *xb, int np, int64_t g,
                           amx_sums out) {
    _Static_assert(TILE_SUM0 == 0 && TILE_SUM1 == 1 && TILE_CODES == 2 && TILE_ACTS == 3, "the literals below");
    if (g & 1)
        AMX_GROUP_SUMS(fmt, 4, 5, 6, 7, per, q, xb, np, g, out);
    else
        AMX_GROUP_SUMS(fmt, 0, 1, 2, 3, per, q, xb, np, g, out);
}

/* What the float work of a pass reads, taken out of q once: the float
 * stores into the chains could otherwise alias q's fields (the build has
 * no strict aliasing) and make every row reload them. Per pair p: the dx
 * and (affine) the float sums of x of its two blocks, ldg x 8 floats
 * each. */
struct amx_pass {
    const float *srow, *brow;
    float *chains;
    const float *dx[Q8_PASS / Q8_PAIR][Q8_PAIR];
    const float *xs[Q8_PASS / Q8_PAIR][Q8_PAIR];
    int64_t ldg;
};

/* zmm_block_group_add's float work for all Q8_UNPACK_ROWS rows, the sums
 * of group g from s (mxfp4: without the code offset already, amx_codes);
 * first: the chains start here (g < Q8_CHAINS). */
ALWAYS void amx_group_floats(int fmt, const struct amx_pass *a, int np, int64_t g, bool first, const amx_sums s) {
    const int64_t ldg = a->ldg;
#pragma GCC unroll 2
    for (int p = 0; p < np; p++) {
        __m512 dx = pair_ps(a->dx[p][0] + g * 8, a->dx[p][1] + g * 8);
        __m512 xs = fmt == FMT_MX4 ? _mm512_setzero_ps() : pair_ps(a->xs[p][0] + g * 8, a->xs[p][1] + g * 8);
        float *ch = a->chains + chain_at(0, g % Q8_CHAINS, Q8_PAIR * p);
        const float *sr = a->srow + g, *br = a->brow + g;
#pragma GCC unroll 4
        for (int i = 0; i < Q8_UNPACK_ROWS; i++) {
            float *c = ch + chain_at(i, 0, 0);
            __m512i st = _mm512_load_si512(s[p][i]);
            __m512 v = _mm512_fmadd_ps(_mm512_cvtepi32_ps(st), _mm512_mul_ps(_mm512_set1_ps(sr[i * ldg]), dx),
                                       first ? _mm512_setzero_ps() : _mm512_loadu_ps(c));
            if (fmt != FMT_MX4) v = _mm512_fmadd_ps(_mm512_set1_ps(br[i * ldg]), xs, v);
            _mm512_storeu_ps(c, v);
        }
    }
}

/* Every group of the unpacked rows times the nb blocks of a pass from b
 * into the chains, as vector_groups leaves them: group g's tiles, then
 * group g - 1's floats. */
ALWAYS void amx_groups(int fmt, int per, const struct rowfmt *f, const struct q8acts *q, const int8_t *xb, int nb,
                       int64_t b) {
    amx_sums sums[2] __attribute__((aligned(64)));
    const int np = nb / Q8_PAIR;
    struct amx_pass a = {q->srow, q->brow, q->chains, {{0}}, {{0}}, q->ldg};
    for (int p = 0; p < np; p++)
        for (int h = 0; h < Q8_PAIR; h++) {
            size_t at = (size_t)((b + Q8_PAIR * p + h) * q->ldg * Q8_BLOCK_TOKENS);
            a.dx[p][h] = q->dxt + at;
            a.xs[p][h] = fmt == FMT_MX4 ? NULL : q->xst + at;  // mxfp4 needs no sums (amx_codes)
        }
    const int64_t ng = f->ng, first = ng < Q8_CHAINS ? ng : Q8_CHAINS;
    amx_group_sums(fmt, per, q, xb, np, 0, sums[0]);
    int64_t g = 1;
    for (; g <= first; g++) {
        if (g < ng) amx_group_sums(fmt, per, q, xb, np, g, sums[g & 1]);
        amx_group_floats(fmt, &a, np, g - 1, true, sums[(g - 1) & 1]);
    }
    for (; g <= ng; g++) {
        if (g < ng) amx_group_sums(fmt, per, q, xb, np, g, sums[g & 1]);
        amx_group_floats(fmt, &a, np, g - 1, false, sums[(g - 1) & 1]);
    }
}
#else
static void amx_rows_begin(int per) { (void)per; }
static void amx_rows_end(void) {}
#endif

/* block_group_add for the nb blocks of a pass: whole pairs of them in the
 * avx512 build. */
ALWAYS void group_add(int fmt, int per, const struct q8acts *q, const int8_t *xb, int nb, int64_t b, int64_t g,
                      bool lone, bool wide, bool first) {
#if HAVE_ZMM
    zmm_block_group_add(fmt, per, q, xb, nb / Q8_PAIR, b, g, lone, first);
#else
    block_group_add(fmt, per, q, xb, nb, b, g, lone, wide, first);
#endif
}

/* Rows i < nr of v (lane t: token t) into y[t * ldy + i] for tokens t <
 * nt: 4 rows of a token in one store when there are 4. */
ALWAYS void block_store(const __m256 v[Q8_BLOCK_ROWS], int nr, int64_t nt, float *y, int64_t ldy) {
    _Static_assert(Q8_BLOCK_ROWS == 4 && Q8_BLOCK_TOKENS == 8, "a 4 x 8 transpose");
    if (nr < Q8_BLOCK_ROWS) {
        for (int i = 0; i < nr; i++) {
            float out[Q8_BLOCK_TOKENS];
            _mm256_storeu_ps(out, v[i]);
            for (int64_t t = 0; t < Q8_BLOCK_TOKENS && t < nt; t++) y[t * ldy + i] = out[t];
        }
        return;
    }
    /* tokens t and t + 4 of the 4 rows in the halves of tr[t] */
    __m256 lo01 = _mm256_unpacklo_ps(v[0], v[1]), hi01 = _mm256_unpackhi_ps(v[0], v[1]);
    __m256 lo23 = _mm256_unpacklo_ps(v[2], v[3]), hi23 = _mm256_unpackhi_ps(v[2], v[3]);
    __m256 tr[4] = {
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(lo01), _mm256_castps_pd(lo23))),
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(lo01), _mm256_castps_pd(lo23))),
        _mm256_castpd_ps(_mm256_unpacklo_pd(_mm256_castps_pd(hi01), _mm256_castps_pd(hi23))),
        _mm256_castpd_ps(_mm256_unpackhi_pd(_mm256_castps_pd(hi01), _mm256_castps_pd(hi23))),
    };
    for (int t = 0; t < 4; t++) {
        if (t < nt) _mm_storeu_ps(y + t * ldy, _mm256_castps256_ps128(tr[t]));
        if (t + 4 < nt) _mm_storeu_ps(y + (t + 4) * ldy, _mm256_extractf128_ps(tr[t], 1));
    }
}

/* Every group of Q8_BLOCK_ROWS unpacked rows times token blocks b .. b +
 * nb - 1 (from xb) into their chains. */
ALWAYS void vector_groups(int fmt, int per, const struct rowfmt *f, const struct q8acts *q, const int8_t *xb, int nb,
                          int64_t b, bool wide) {
    /* groups before a lone last 32-column block, and whether there is one */
    const bool lone = per == 1 && (f->ng & 1);
    const int64_t ngw = f->ng - lone, first = ngw < Q8_CHAINS ? ngw : Q8_CHAINS;
    int64_t g = 0;
    for (; g < first; g++) group_add(fmt, per, q, xb, nb, b, g, false, wide, true);
    for (; g < ngw; g++) group_add(fmt, per, q, xb, nb, b, g, false, wide, false);
    if (lone) group_add(fmt, per, q, xb, nb, b, g, true, wide, g < Q8_CHAINS);
}

/* Token blocks b .. b + nb - 1 (b even) of the unpacked rows: every
 * group (by vectors, 4 rows at a time; the amx build: by tiles, 16 rows),
 * then each block's chains summed as hsum sums lanes (chains past ng are
 * zero) and stored (tokens past n are not). */
ALWAYS void block_rows_pass(int fmt, int per, const struct rowfmt *f, const struct q8acts *q, int nb, int64_t b,
                            int nr, bool wide, float *y, int64_t ldy) {
    const int8_t *xb = q->xt + b * f->cols * Q8_BLOCK_TOKENS;  // pair b / 2
#if HAVE_AMX
    (void)wide;
    amx_groups(fmt, per, f, q, xb, nb, b);
#else
    vector_groups(fmt, per, f, q, xb, nb, b, wide);
#endif
    for (int j = 0; j < nb && (b + j) * Q8_BLOCK_TOKENS < q->n; j++) {
        int64_t t0 = (b + j) * Q8_BLOCK_TOKENS;
        for (int i0 = 0; i0 < nr; i0 += Q8_BLOCK_ROWS) {
            __m256 v[Q8_BLOCK_ROWS];
            for (int k = 0; k < Q8_BLOCK_ROWS; k++) {
#define CH_(c) ((c) < f->ng ? _mm256_loadu_ps(q->chains + chain_at(i0 + k, c, j)) : _mm256_setzero_ps())
                v[k] = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(CH_(0), CH_(4)), _mm256_add_ps(CH_(2), CH_(6))),
                                     _mm256_add_ps(_mm256_add_ps(CH_(1), CH_(5)), _mm256_add_ps(CH_(3), CH_(7))));
#undef CH_
            }
            block_store(v, nr - i0 < Q8_BLOCK_ROWS ? nr - i0 : Q8_BLOCK_ROWS, q->n - t0, y + t0 * ldy + i0, ldy);
        }
    }
}

/* block_rows_pass, the mxfp4 sums in int16 over whole groups where the
 * blocks' activations allow (a copy of the pass each way) */
ALWAYS void unpacked_pass(int fmt, int per, const struct rowfmt *f, const struct q8acts *q, int nb, int64_t b, int nr,
                          float *y, int64_t ldy) {
    if (fmt == FMT_MX4 && !HAVE_DPWSSD && !(q->xw[b] && (nb < 2 || q->xw[b + 1])))
        block_rows_pass(fmt, per, f, q, nb, b, nr, false, y, ldy);
    else
        block_rows_pass(fmt, per, f, q, nb, b, nr, true, y, ldy);
}

/* Rows [r0, r1) by tokens, q's blocks set side by side (q8_block_tokens). */
ALWAYS void q8_block_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y,
                          int64_t ldy, int fmt, int sdt, int per) {
    const struct rowfmt f = rowfmt_of(w, fmt, sdt);
    const int64_t nb = blocks_computed(q->n);
    for (int64_t r = r0; r < r1; r += Q8_UNPACK_ROWS) {
        int nr = r1 - r < Q8_UNPACK_ROWS ? (int)(r1 - r) : Q8_UNPACK_ROWS;
        int64_t b = 0;
        unpack_rows(fmt, sdt, w, &f, q, r, nr);
        if (HAVE_ZMM) {
            /* two pairs a pass, one pair for what is left */
            for (; b + Q8_PASS <= nb; b += Q8_PASS) unpacked_pass(fmt, per, &f, q, Q8_PASS, b, nr, y + r, ldy);
            if (b < nb) unpacked_pass(fmt, per, &f, q, Q8_PAIR, b, nr, y + r, ldy);
            continue;
        }
        for (; b + Q8_PAIR <= nb; b += Q8_PAIR) unpacked_pass(fmt, per, &f, q, Q8_PAIR, b, nr, y + r, ldy);
        for (; b < nb; b++) unpacked_pass(fmt, per, &f, q, 1, b, nr, y + r, ldy);
    }
}

#if HAVE_ZMM
/* ---- bf16 rows times bf16 activations (AVX512-BF16) ----
 *
 * vdpbf16ps multiplies 16 pairs of bf16 and adds both products of a pair
 * to a float lane: 32 multiply-adds an instruction where the float FMA
 * does 16, on the rows as stored (no widening). Zen 4 VM (bench/peak): 117
 * G multiply-adds a second a thread, against 58.6 for vfmadd231ps zmm. On
 * CPUs that have it, the avx512 and amx sets round the activations of bf16
 * rows to bf16 (nearest even; the weights' own precision), as they round
 * those of 4-bit rows to int8, and as llama.cpp's bf16 products do; their
 * -int16 twins and routers (matmul_rows_float) keep floats. On the test
 * fixtures' random-weight models this moves logits by 0.4-22% of the
 * largest (int8 activations move them by percents).
 *
 * One order for every number of tokens: a row's columns in slices of KC,
 * each slice one 16-lane sum over its 32-column steps in order (a last
 * step of fewer columns reads zeros past them), added up by
 * _mm512_reduce_add_ps; the slice sums are added to the output in slice
 * order from 0. A tile of up to B16_ROWS rows x B16_TILE tokens keeps its
 * sums in registers. Decode-sized batches take one row at a time through
 * all its slices: one stream of reads, which from DRAM ran 1.5-1.7x as
 * fast as four rows side by side (2048 x 768) and 1.6x as fast as two
 * (32768 x 2048; Zen 4 VM, 2 threads, one token); larger
 * batches take all blocks of rows per slice, whose tokens' activations stay
 * cached. */
#define B16 __attribute__((target("avx512bf16")))
#define B16_ROWS 4
#define B16_TILE 6
#define B16_AHEAD (HAVE_AMX ? 4096 : PREFETCH_AHEAD)
_Static_assert(SP_KERNELS_BF16_TOKENS % B16_TILE == 0, "whole tiles per batch of rounded tokens");

/* n tokens of x (ldx apart) rounded to bf16 into xb (ldb apart, cols
 * rounded up to 32, zeros past cols). */
B16 static void b16_round(const float *x, int64_t ldx, int64_t n, int64_t cols, uint16_t *xb, int64_t ldb) {
    for (int64_t t = 0; t < n; t++)
        for (int64_t k = 0; k < cols; k += 32) {
            int64_t left = cols - k;
            __mmask16 m0 = left >= 16 ? 0xFFFF : (__mmask16)((1u << left) - 1);
            __mmask16 m1 = left >= 32 ? 0xFFFF : left <= 16 ? 0 : (__mmask16)((1u << (left - 16)) - 1);
            __m512 a = _mm512_maskz_loadu_ps(m0, x + t * ldx + k), b = _mm512_maskz_loadu_ps(m1, x + t * ldx + k + 16);
            _mm512_storeu_si512((void *)(xb + t * ldb + k), (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
}

/* One 32-column step (mask: the columns there are) of mr rows at w (rb
 * bytes apart) and nt tokens at xb (ldb apart) into acc. */
B16 ALWAYS void b16_step(const uint8_t *w, size_t rb, const uint16_t *xb, int64_t ldb, __mmask32 mask, int mr,
                         int nt, __m512 acc[B16_ROWS][B16_TILE]) {
    __m512i xv[B16_TILE];
#pragma GCC unroll 6
    for (int j = 0; j < nt; j++) xv[j] = _mm512_maskz_loadu_epi16(mask, xb + j * ldb);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++) {
        _mm_prefetch((const char *)w + i * rb + B16_AHEAD, _MM_HINT_T0);
        __m512bh wv = (__m512bh)_mm512_maskz_loadu_epi16(mask, w + i * rb);
#pragma GCC unroll 6
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_dpbf16_ps(acc[i][j], wv, (__m512bh)xv[j]);
    }
}

/* y[j * ldy + i] += the slice sum of row i (at w, rb bytes apart) and token
 * j (at xb, ldb apart) over kn columns, for i < mr, j < nt. */
B16 ALWAYS void b16_tile(const uint8_t *w, size_t rb, const uint16_t *xb, int64_t ldb, int64_t kn, float *y,
                         int64_t ldy, int mr, int nt) {
    __m512 acc[B16_ROWS][B16_TILE];
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 6
        for (int j = 0; j < nt; j++) acc[i][j] = _mm512_setzero_ps();
    int64_t k = 0;
    for (; k + 32 <= kn; k += 32) b16_step(w + 2 * k, rb, xb + k, ldb, 0xFFFFFFFFu, mr, nt, acc);
    if (k < kn) b16_step(w + 2 * k, rb, xb + k, ldb, (__mmask32)((1u << (kn - k)) - 1), mr, nt, acc);
#pragma GCC unroll 4
    for (int i = 0; i < mr; i++)
#pragma GCC unroll 6
        for (int j = 0; j < nt; j++) y[j * ldy + i] += _mm512_reduce_add_ps(acc[i][j]);
}

typedef void (*b16_tile_fn)(const uint8_t *w, size_t rb, const uint16_t *xb, int64_t ldb, int64_t kn, float *y,
                            int64_t ldy);
#define B16_TILE_FN(M, N)                                                                                    \
    B16 static void b16_tile_##M##x##N(const uint8_t *w, size_t rb, const uint16_t *xb, int64_t ldb, int64_t kn, \
                                       float *y, int64_t ldy) {                                                \
        b16_tile(w, rb, xb, ldb, kn, y, ldy, M, N);                                                          \
    }
#define B16_TILE_ROW(M) \
    B16_TILE_FN(M, 1) B16_TILE_FN(M, 2) B16_TILE_FN(M, 3) B16_TILE_FN(M, 4) B16_TILE_FN(M, 5) B16_TILE_FN(M, 6)
B16_TILE_ROW(1)
B16_TILE_ROW(2)
B16_TILE_ROW(3)
B16_TILE_ROW(4)
#define B16_TILES_OF(M)                                                                                   \
    {b16_tile_##M##x1, b16_tile_##M##x2, b16_tile_##M##x3, b16_tile_##M##x4, b16_tile_##M##x5, b16_tile_##M##x6}
static const b16_tile_fn b16_tiles[B16_ROWS][B16_TILE] = {B16_TILES_OF(1), B16_TILES_OF(2), B16_TILES_OF(3), B16_TILES_OF(4)};

/* Tokens [0, n) of the rounded batch xb times rows [rb0, rb0 + mr) over
 * columns [k0, k0 + kn), in tiles of B16_TILE tokens. */
static void b16_block(const struct sp_qmat *w, int64_t rb0, int mr, int64_t k0, int64_t kn, const uint16_t *xb,
                      int64_t ldb, int64_t n, float *y, int64_t ldy) {
    const size_t rb = (size_t)w->cols * 2;
    const uint8_t *c = (const uint8_t *)w->codes + (size_t)rb0 * rb + (size_t)k0 * 2;
    for (int64_t t = 0; t < n; t += B16_TILE) {
        int nt = n - t < B16_TILE ? (int)(n - t) : B16_TILE;
        b16_tiles[mr - 1][nt - 1](c, rb, xb + t * ldb + k0, ldb, kn, y + t * ldy + rb0, ldy);
    }
}

/* Rows [r0, r1) of bf16 w times n tokens of x rounded to bf16,
 * SP_KERNELS_BF16_TOKENS at a time into scratch. */
static void b16_rows(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, int64_t n,
                     float *y, int64_t ldy, void *scratch) {
    const int64_t ldb = (w->cols + 31) / 32 * 32;
    uint16_t *xb = scratch;
    for (int64_t t = 0; t < n; t++) memset(y + t * ldy + r0, 0, (size_t)(r1 - r0) * sizeof(float));
    for (int64_t t0 = 0; t0 < n; t0 += SP_KERNELS_BF16_TOKENS) {
        int64_t nb = n - t0 < SP_KERNELS_BF16_TOKENS ? n - t0 : SP_KERNELS_BF16_TOKENS;
        float *yt = y + t0 * ldy;
        b16_round(x + t0 * ldx, ldx, nb, w->cols, xb, ldb);
        if (nb < BLOCK_MIN_TOKENS) {
            for (int64_t r = r0; r < r1; r++)
                for (int64_t k0 = 0; k0 < w->cols; k0 += KC)
                    b16_block(w, r, 1, k0, w->cols - k0 < KC ? w->cols - k0 : KC, xb, ldb, nb, yt, ldy);
            continue;
        }
        for (int64_t k0 = 0; k0 < w->cols; k0 += KC) {
            int64_t kn = w->cols - k0 < KC ? w->cols - k0 : KC;
            for (int64_t r = r0; r < r1; r += B16_ROWS) {
                prefetch_block(w, r + B16_ROWS, r1 - r - B16_ROWS < B16_ROWS ? r1 : r + 2 * B16_ROWS, k0, kn);
                b16_block(w, r, r1 - r < B16_ROWS ? (int)(r1 - r) : B16_ROWS, k0, kn, xb, ldb, nb, yt, ldy);
            }
        }
    }
}
#endif

/* ---- one instantiation per (format, scale dtype) ---- */

typedef void (*fused_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, float *y,
                         int64_t ldy);
typedef void (*qacts_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct qacts *q, float *y,
                         int64_t ldy);
typedef void (*q8acts_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y,
                          int64_t ldy);
struct impl {
    fused_fn fused[4];  // 1 to 4 tokens, float activations
    dequant_fn dequant;
    qacts_fn q16[4];    // 1 to 4 tokens, int16 activations; NULL for plain floats
    q8acts_fn q8[4];    // 1 to 4 tokens, int8 activations, by groups; 4- and 8-bit codes only
    q8acts_fn q8_block; // any tokens, int8 activations, by tokens; 4-bit codes only
    q8acts_fn r16;      // any tokens, int8 activations, interleaved rows, by groups (avx512 builds; else NULL)
    q8acts_fn r16_block; // the same by tokens (avx512 builds; else NULL)
    bool four_bit;      // activations in the 4-bit order (q16_prepare)
};

/* one function per token count */
#define FUSED(ID, FMT, SDT, NT)                                                                                   \
    static void fused##NT##_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx,   \
                                 float *y, int64_t ldy) {                                                       \
        fused_rows(w, r0, r1, x, ldx, y, ldy, FMT, SDT, NT);                                                    \
    }
#define IMPL(ID, FMT, SDT)                                                                                        \
    FUSED(ID, FMT, SDT, 1) FUSED(ID, FMT, SDT, 2) FUSED(ID, FMT, SDT, 3) FUSED(ID, FMT, SDT, 4)                   \
    static void dequant_##ID(const struct sp_qmat *w, int64_t r, int64_t k0, int64_t kn, float *out) {          \
        dequant_cols(w, r, k0, kn, out, FMT, SDT);                                                              \
    }

#define IMPL_FLOAT(ID, FMT, SDT)                                                                                  \
    IMPL(ID, FMT, SDT)                                                                                            \
    static const struct impl impl_##ID = {{fused1_##ID, fused2_##ID, fused3_##ID, fused4_##ID}, dequant_##ID, {0}, {0}, 0, 0, 0, 0};

/* one function per token count (q16_NT_ID, q8_NT_ID) and q8_block_ID; the
 * group size picks 32-column blocks per group (per: 1, 2 or 4) */
#define BY_PER(CALL, ...)                                                                                         \
    if (w->group == 32)                                                                                           \
        CALL(__VA_ARGS__, 1);                                                                                     \
    else if (w->group == 64)                                                                                      \
        CALL(__VA_ARGS__, 2);                                                                                     \
    else                                                                                                          \
        CALL(__VA_ARGS__, 4);
#define QROWS(KIND, ACTS, ID, FMT, SDT, NT)                                                                       \
    static void KIND##_##NT##_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct ACTS *q, float *y, \
                                   int64_t ldy) {                                                               \
        BY_PER(KIND##_rows, w, r0, r1, q, y, ldy, FMT, SDT, NT)                                                  \
    }
/* one function for any number of tokens, NAME_ID, calling ROWS */
#define ANY_TOKENS(NAME, ROWS, ID, FMT, SDT)                                                                      \
    static void NAME##_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q, float *y,    \
                            int64_t ldy) {                                                                      \
        BY_PER(ROWS, w, r0, r1, q, y, ldy, FMT, SDT)                                                           \
    }
#if HAVE_ZMM
#define R16(ID, FMT, SDT) ANY_TOKENS(r16, r16_rows, ID, FMT, SDT) ANY_TOKENS(r16_block, r16_block_rows, ID, FMT, SDT)
#define R16_FNS(ID) r16_##ID, r16_block_##ID
#else
#define R16(ID, FMT, SDT)
#define R16_FNS(ID) 0, 0
#endif
#define Q16(ID, FMT, SDT, NT) QROWS(q16, qacts, ID, FMT, SDT, NT)
#define Q8(ID, FMT, SDT, NT) QROWS(q8, q8acts, ID, FMT, SDT, NT)
#define Q8_BLOCK(ID, FMT, SDT) ANY_TOKENS(q8_block, q8_block_rows, ID, FMT, SDT)
#define IMPL_QUANT(ID, FMT, SDT)                                                                                  \
    IMPL(ID, FMT, SDT)                                                                                            \
    Q16(ID, FMT, SDT, 1) Q16(ID, FMT, SDT, 2) Q16(ID, FMT, SDT, 3) Q16(ID, FMT, SDT, 4)                           \
    static const struct impl impl_##ID = {{fused1_##ID, fused2_##ID, fused3_##ID, fused4_##ID}, dequant_##ID,     \
                                          {q16_1_##ID, q16_2_##ID, q16_3_##ID, q16_4_##ID}, {0}, 0, 0, 0, false};
/* 8-bit codes: the same plus the int8-activation product by groups (for
 * every batch size: no product by tokens) */
#define IMPL_QUANT8(ID, FMT, SDT)                                                                                 \
    IMPL(ID, FMT, SDT)                                                                                            \
    Q16(ID, FMT, SDT, 1) Q16(ID, FMT, SDT, 2) Q16(ID, FMT, SDT, 3) Q16(ID, FMT, SDT, 4)                           \
    Q8(ID, FMT, SDT, 1) Q8(ID, FMT, SDT, 2) Q8(ID, FMT, SDT, 3) Q8(ID, FMT, SDT, 4)                               \
    static const struct impl impl_##ID = {{fused1_##ID, fused2_##ID, fused3_##ID, fused4_##ID}, dequant_##ID,     \
                                          {q16_1_##ID, q16_2_##ID, q16_3_##ID, q16_4_##ID},                       \
                                          {q8_1_##ID, q8_2_##ID, q8_3_##ID, q8_4_##ID}, 0, 0, 0, false};
/* 4-bit formats: the same plus the int8-activation product by tokens */
#define IMPL_QUANT4(ID, FMT, SDT)                                                                                 \
    IMPL(ID, FMT, SDT)                                                                                            \
    Q16(ID, FMT, SDT, 1) Q16(ID, FMT, SDT, 2) Q16(ID, FMT, SDT, 3) Q16(ID, FMT, SDT, 4)                           \
    Q8(ID, FMT, SDT, 1) Q8(ID, FMT, SDT, 2) Q8(ID, FMT, SDT, 3) Q8(ID, FMT, SDT, 4) Q8_BLOCK(ID, FMT, SDT)        \
    R16(ID, FMT, SDT)                                                                                             \
    static const struct impl impl_##ID = {{fused1_##ID, fused2_##ID, fused3_##ID, fused4_##ID}, dequant_##ID,     \
                                          {q16_1_##ID, q16_2_##ID, q16_3_##ID, q16_4_##ID},                       \
                                          {q8_1_##ID, q8_2_##ID, q8_3_##ID, q8_4_##ID}, q8_block_##ID,            \
                                          R16_FNS(ID), true};

IMPL_FLOAT(f32, FMT_F32, SP_DTYPE_F32)
IMPL_FLOAT(bf16, FMT_BF16, SP_DTYPE_F32)
IMPL_FLOAT(f16, FMT_F16, SP_DTYPE_F32)
IMPL_QUANT4(a4_f32, FMT_A4, SP_DTYPE_F32)
IMPL_QUANT4(a4_bf16, FMT_A4, SP_DTYPE_BF16)
IMPL_QUANT4(a4_f16, FMT_A4, SP_DTYPE_F16)
IMPL_QUANT8(a8_f32, FMT_A8, SP_DTYPE_F32)
IMPL_QUANT8(a8_bf16, FMT_A8, SP_DTYPE_BF16)
IMPL_QUANT8(a8_f16, FMT_A8, SP_DTYPE_F16)
IMPL_QUANT4(mx4, FMT_MX4, SP_DTYPE_U8)
IMPL_QUANT(a2_f32, FMT_A2, SP_DTYPE_F32)
IMPL_QUANT(a2_bf16, FMT_A2, SP_DTYPE_BF16)
IMPL_QUANT(a2_f16, FMT_A2, SP_DTYPE_F16)
IMPL_QUANT(a3_f32, FMT_A3, SP_DTYPE_F32)
IMPL_QUANT(a3_bf16, FMT_A3, SP_DTYPE_BF16)
IMPL_QUANT(a3_f16, FMT_A3, SP_DTYPE_F16)
IMPL_QUANT(a5_f32, FMT_A5, SP_DTYPE_F32)
IMPL_QUANT(a5_bf16, FMT_A5, SP_DTYPE_BF16)
IMPL_QUANT(a5_f16, FMT_A5, SP_DTYPE_F16)
IMPL_QUANT(a6_f32, FMT_A6, SP_DTYPE_F32)
IMPL_QUANT(a6_bf16, FMT_A6, SP_DTYPE_BF16)
IMPL_QUANT(a6_f16, FMT_A6, SP_DTYPE_F16)

/* The fast path for w, or NULL when the portable product must serve. */
static const struct impl *impl_for(const struct sp_qmat *w) {
    const struct impl *const affine4[] = {&impl_a4_f32, &impl_a4_bf16, &impl_a4_f16};
    const struct impl *const affine8[] = {&impl_a8_f32, &impl_a8_bf16, &impl_a8_f16};
    const struct impl *const packed[4][3] = {{&impl_a2_f32, &impl_a2_bf16, &impl_a2_f16},
                                             {&impl_a3_f32, &impl_a3_bf16, &impl_a3_f16},
                                             {&impl_a5_f32, &impl_a5_bf16, &impl_a5_f16},
                                             {&impl_a6_f32, &impl_a6_bf16, &impl_a6_f16}};
    bool groups = w->group == 32 || w->group == 64 || w->group == 128;
    int si = w->scale_dtype == SP_DTYPE_F32 ? 0 : w->scale_dtype == SP_DTYPE_BF16 ? 1 : w->scale_dtype == SP_DTYPE_F16 ? 2 : -1;
    switch (w->type) {
    case SP_QTYPE_F32:
        return &impl_f32;
    case SP_QTYPE_BF16:
        return &impl_bf16;
    case SP_QTYPE_F16:
        return &impl_f16;
    case SP_QTYPE_AFFINE4:
        return si >= 0 && groups ? affine4[si] : NULL;
    case SP_QTYPE_AFFINE8:
        return si >= 0 && groups ? affine8[si] : NULL;
    case SP_QTYPE_AFFINE2:
    case SP_QTYPE_AFFINE3:
    case SP_QTYPE_AFFINE5:
    case SP_QTYPE_AFFINE6:
        return si >= 0 && groups ? packed[packed_index(sp_qtype_traits(w->type)->bits)][si] : NULL;
    case SP_QTYPE_MXFP4:
        return w->group == 32 ? &impl_mx4 : NULL;
    default:
        return NULL;
    }
}

/* How blocked_rows decodes a format without a fast path: ggml's blocks
 * with AVX2, the others by the scalar reference. */
static dequant_fn block_decoder(const struct sp_qmat *w) {
    switch (w->type) {
    case SP_QTYPE_Q2_K: return dequant_q2_k;
    case SP_QTYPE_Q3_K: return dequant_q3_k;
    case SP_QTYPE_Q4_K: return dequant_q4_k;
    case SP_QTYPE_Q5_K: return dequant_q5_k;
    case SP_QTYPE_Q6_K: return dequant_q6_k;
    case SP_QTYPE_IQ4_NL: return dequant_iq4_nl;
    case SP_QTYPE_IQ4_XS: return dequant_iq4_xs;
    default: return sp_qmat_dequant_cols_ref;
    }
}

/* ---- ggml's block formats with int8 activations ---- */

/* The float product of a block format spends its time turning codes into
 * floats (2-5 GB/s of codes a thread against the 20 the memory gives).
 * Here, as in ggml's own kernels, codes stay bytes: each token's
 * activations are rounded to int8 with one scale dx = amax / 127 per
 * block of the format (256 elements; IQ4_NL's 32), and vpmaddubsw
 * multiplies 32 unsigned codes by 32 activations into int16 pair sums,
 * which vpmaddwd multiplies by the block's integer sub-scales (a 16's or a
 * 32's) into int32: one block's sum is exact, then one conversion and FMA
 * by d dx. Each value is d k u - dmin m, u the unsigned code, k and m small
 * integers a 16 (Q4_K / Q5_K: their scale and min a 32; Q2_K the same a
 * 16; Q6_K k (u - 32) with m = 32 k; Q3_K m = 4 k); the offsets take the
 * activations' int16 sums a 16 (dmin dx sum m xsum). IQ4's table values
 * are signed: their magnitudes multiply the activations with the values'
 * signs. So a product is the exact dot of the row with the rounded
 * activations, summed in float a block at a time: the only new error is
 * the rounding of x, and a token's result does not depend on the others.
 * The codes of a block are unpacked once for up to 4 tokens. */

/* A batch of tokens rounded for the block formats (bq8_prepare). */
struct bq8acts {
    const int8_t *xq;   // (n, cols) int8
    const float *dx;    // (n, cols / unit): each unit's scale
    const int16_t *bs;  // (n, cols / 16): the sums of each 16's int8 values
    int64_t cols, unit;
};

/* bytes (rounded up to whole cache lines) taken from *p */
ALWAYS void *carve(uint8_t **p, size_t bytes) {
    void *r = *p;
    *p += (bytes + 63) / 64 * 64;
    return r;
}

/* Where n tokens' rounded activations lie from *p on (*p moved past them). */
static void bq8_carve(uint8_t **p, int64_t n, int64_t cols, int64_t unit, int8_t **xq, float **dx, int16_t **bs) {
    *xq = carve(p, (size_t)(n * cols));
    *dx = carve(p, (size_t)(n * (cols / unit)) * sizeof(float) + (size_t)(n * (cols / 16)) * sizeof(int16_t));
    *bs = (int16_t *)(*dx + n * (cols / unit));
}

/* n tokens' activations (x, rows ldx apart) rounded a unit (32 or 256) at a time into scratch. */
static void bq8_prepare(const float *x, int64_t ldx, int64_t n, int64_t cols, int64_t unit, void *scratch,
                        struct bq8acts *q) {
    uint8_t *p = scratch;
    int8_t *xq;
    float *dx;
    int16_t *bs;
    bq8_carve(&p, n, cols, unit, &xq, &dx, &bs);
    const __m256 sign = _mm256_set1_ps(-0.0f);
    const __m128i ones8 = _mm_set1_epi8(1), ones16 = _mm_set1_epi16(1);
    for (int64_t t = 0; t < n; t++)
        for (int64_t u0 = 0; u0 < cols; u0 += unit) {
            const float *xu = x + t * ldx + u0;
            __m256 m = _mm256_setzero_ps();
            for (int64_t i = 0; i < unit; i += 8) m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(xu + i)));
            float amax = hmax(m);
            __m256 inv = _mm256_set1_ps(amax > 0.0f ? 127.0f / amax : 0.0f);
            dx[t * (cols / unit) + u0 / unit] = amax / 127.0f;
            for (int64_t c = 0; c < unit; c += 32) {
                __m256i i32[4];
                for (int i = 0; i < 4; i++) i32[i] = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xu + c + 8 * i), inv));
                /* the packs work within 128-bit lanes: put the 8 dwords back in order */
                __m256i b8 = _mm256_permutevar8x32_epi32(
                    _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3])),
                    _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
                _mm256_storeu_si256((__m256i *)(void *)(xq + t * cols + u0 + c), b8);
                for (int h = 0; h < 2; h++) {
                    __m128i half = h ? _mm256_extracti128_si256(b8, 1) : _mm256_castsi256_si128(b8);
                    __m128i s = _mm_madd_epi16(_mm_maddubs_epi16(ones8, half), ones16);
                    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
                    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
                    bs[t * (cols / 16) + (u0 + c) / 16 + h] = (int16_t)_mm_cvtsi128_si32(s);
                }
            }
        }
    *q = (struct bq8acts){xq, dx, bs, cols, unit};
}

/* vpshufb masks over 8 int16 sub-scales held in both 128-bit lanes:
 * bq_pair[k] puts scale 2k in every int16 of the low lane and 2k + 1 in
 * the high one (a 32 of two 16s); bq_same[g] scale g in both (a 32 of one). */
#define BQ_W(i) (2 * (i)), (2 * (i) + 1)
#define BQ_8(i) BQ_W(i), BQ_W(i), BQ_W(i), BQ_W(i), BQ_W(i), BQ_W(i), BQ_W(i), BQ_W(i)
static const uint8_t bq_pair[4][32] __attribute__((aligned(32))) = {
    {BQ_8(0), BQ_8(1)}, {BQ_8(2), BQ_8(3)}, {BQ_8(4), BQ_8(5)}, {BQ_8(6), BQ_8(7)}};
static const uint8_t bq_same[8][32] __attribute__((aligned(32))) = {
    {BQ_8(0), BQ_8(0)}, {BQ_8(1), BQ_8(1)}, {BQ_8(2), BQ_8(2)}, {BQ_8(3), BQ_8(3)},
    {BQ_8(4), BQ_8(4)}, {BQ_8(5), BQ_8(5)}, {BQ_8(6), BQ_8(6)}, {BQ_8(7), BQ_8(7)}};
#undef BQ_8
#undef BQ_W

ALWAYS __m256i bq_scales(__m256i s8x2, const uint8_t *mask) {
    return _mm256_shuffle_epi8(s8x2, _mm256_load_si256((const __m256i *)(const void *)mask));
}
/* 8 small signed (or unsigned) bytes as int16 in both 128-bit lanes */
ALWAYS __m256i bq_i16x2(__m128i b, bool is_signed) {
    return _mm256_broadcastsi128_si256(is_signed ? _mm_cvtepi8_epi16(b) : _mm_cvtepu8_epi16(b));
}
ALWAYS __m256i bq_load(const void *p) { return _mm256_loadu_si256((const __m256i *)p); }
ALWAYS float bq_f16(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(h)));
}
#define BQ_UNROLL _Pragma("GCC unroll 8")

/* How a block's offsets scale: none (IQ4), by dmin (Q2_K, Q4_K, Q5_K), or
 * by d like the codes (Q3_K, Q6_K: one integer, one product). */
enum bq_offsets { BQ_NO_OFFSETS, BQ_BY_DMIN, BQ_BY_D };

ALWAYS uint16_t bq_h(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return h;
}

/* A block's value for each token (a lane): (d dx) S less (dmin dx) O, S
 * the block's exact int32 sum of codes x sub-scales x activations and O
 * its offsets' (mins x the activations' sums; formats whose offsets scale
 * by d take them off S in integers and pass O = 0, dmin = 0). A row's
 * blocks are added 8 at a time, ((v0 + v1) + (v2 + v3)) + ((v4 + v5) +
 * (v6 + v7)) with +0 past its last block, and the eights in row order
 * from 0. Both products (by rows and by tokens) do exactly these
 * operations, so a token's result has the same bits whichever computes it;
 * the product by rows of one token holds 8 blocks' integer sums and adds
 * them up together, where one tree a block cost it a fifth of its
 * instructions. */
#define BQ_VALUE(P, S, O, d, dmin, dx) BQ_VALUE_(P, S, O, d, dmin, dx)
#define BQ_VALUE_(P, S, O, d, dmin, dx)                                                                       \
    P##_fnmadd_ps(P##_cvtepi32_ps(O), P##_mul_ps(P##_set1_ps(dmin), dx),                                      \
                  P##_mul_ps(P##_cvtepi32_ps(S), P##_mul_ps(P##_set1_ps(d), dx)))
#define BQ_EIGHT(add, v) add(add(add((v)[0], (v)[1]), add((v)[2], (v)[3])), add(add((v)[4], (v)[5]), add((v)[6], (v)[7])))

/* What an eight of blocks keeps until it ends (bq_eight_end). */
struct bq_eight {
    __m256i so[8];  // one token: block j's S and O lanes added in pairs
    __m128 v[8];    // more tokens: block j's values
};
/* The running state of a row's product for nt <= 4 tokens: their
 * activations at the current block, the block's int32 sums (8 lanes a
 * token), the current eight and the float totals (lane t: token t). */
struct bq_toks {
    const int8_t *x[4];
    const int16_t *bs[4];
    const float *dx[4];
    __m256i isum[4];
    int j;               // blocks of the current eight so far
    const float *dx8;    // one token: the eight's first scale
    const uint8_t *b8;   // one token: the eight's first block
    int64_t bb;          // bytes a block
    int doff;            // where a block's d is (f16; dmin after it for BQ_BY_DMIN)
    enum bq_offsets kind;
    struct bq_eight *e;  // apart, so that the rest stays in registers
    __m128 acc;
};

/* isum[t] += (u x codes) . (token t's 32 activations at x offset e) x k (int16 pair-sum multipliers) */
ALWAYS void bq_chunk(struct bq_toks *s, int nt, __m256i u, __m256i k, int64_t e) {
    BQ_UNROLL for (int t = 0; t < nt; t++)
        s->isum[t] = _mm256_add_epi32(s->isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, bq_load(s->x[t] + e)), k));
}
/* the same with signed values v (|v| x the activations with v's signs) */
ALWAYS void bq_chunk_signed(struct bq_toks *s, int nt, __m256i v, __m256i k, int64_t e) {
    __m256i u = _mm256_abs_epi8(v);
    BQ_UNROLL for (int t = 0; t < nt; t++)
        s->isum[t] = _mm256_add_epi32(
            s->isum[t], _mm256_madd_epi16(_mm256_maddubs_epi16(u, _mm256_sign_epi8(bq_load(s->x[t] + e), v)), k));
}

/* Lane t < nt: the sum of v[t]'s 8 int32 lanes (zero past nt). */
ALWAYS __m128i bq_hsum4(const __m256i v[4], int nt) {
    __m256i z = _mm256_setzero_si256();
    __m256i a = _mm256_hadd_epi32(v[0], nt > 1 ? v[1] : z), b = nt > 2 ? _mm256_hadd_epi32(v[2], nt > 3 ? v[3] : z) : z;
    __m256i c = _mm256_hadd_epi32(a, b);
    return _mm_add_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
}

/* The eight (or the row's last blocks) ends: acc += its sum (BQ_VALUE). */
ALWAYS void bq_eight_end(struct bq_toks *s, int nt) {
    struct bq_eight *e = s->e;
    const int n = s->j;
    if (nt == 1) {
        uint32_t w[8];  // d and dmin of each block, read again from the blocks
        for (int k = 0; k < 8; k++) {
            w[k] = 0;
            if (k >= n)
                e->so[k] = _mm256_setzero_si256();
            else if (s->kind == BQ_BY_DMIN)
                memcpy(&w[k], s->b8 + k * s->bb + s->doff, 4);
            else
                w[k] = bq_h(s->b8 + k * s->bb + s->doff);
        }
        /* lanes S0 O0 S1 O1 | S2 O2 S3 O3 (X) and blocks 4-7 (Y), exact */
        __m256i a0 = _mm256_hadd_epi32(e->so[0], e->so[1]), a1 = _mm256_hadd_epi32(e->so[2], e->so[3]);
        __m256i a2 = _mm256_hadd_epi32(e->so[4], e->so[5]), a3 = _mm256_hadd_epi32(e->so[6], e->so[7]);
        __m256 fx = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_permute2x128_si256(a0, a1, 0x20), _mm256_permute2x128_si256(a0, a1, 0x31)));
        __m256 fy = _mm256_cvtepi32_ps(_mm256_add_epi32(_mm256_permute2x128_si256(a2, a3, 0x20), _mm256_permute2x128_si256(a2, a3, 0x31)));
        __m256i dd = _mm256_setr_epi32((int)w[0], (int)w[1], (int)w[2], (int)w[3], (int)w[4], (int)w[5], (int)w[6], (int)w[7]);
        __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
        __m256 dx = _mm256_maskload_ps(s->dx8, keep);  // 0 past the row's blocks
        /* (d dx, dmin dx) a block, in the lanes of its S and O */
        __m256 px = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_castsi256_si128(dd)),
                                  _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3)));
        __m256 py = _mm256_mul_ps(_mm256_cvtph_ps(_mm256_extracti128_si256(dd, 1)),
                                  _mm256_permutevar8x32_ps(dx, _mm256_setr_epi32(4, 4, 5, 5, 6, 6, 7, 7)));
        /* odd lanes: block values v0 .. v3 (vx), v4 .. v7 (vy) */
        __m256 vx = _mm256_fnmadd_ps(fx, px, _mm256_moveldup_ps(_mm256_mul_ps(fx, px)));
        __m256 vy = _mm256_fnmadd_ps(fy, py, _mm256_moveldup_ps(_mm256_mul_ps(fy, py)));
        vx = _mm256_add_ps(vx, _mm256_shuffle_ps(vx, vx, 0x4e));  // lane 1: v0 + v1, lane 5: v2 + v3
        vy = _mm256_add_ps(vy, _mm256_shuffle_ps(vy, vy, 0x4e));
        __m256 q = _mm256_add_ps(_mm256_permute2f128_ps(vx, vy, 0x20), _mm256_permute2f128_ps(vx, vy, 0x31));
        __m128 g = _mm_add_ss(_mm_movehdup_ps(_mm256_castps256_ps128(q)), _mm_movehdup_ps(_mm256_extractf128_ps(q, 1)));
        s->acc = _mm_add_ss(s->acc, g);
    } else {
        for (int k = n; k < 8; k++) e->v[k] = _mm_setzero_ps();
        s->acc = _mm_add_ps(s->acc, BQ_EIGHT(_mm_add_ps, e->v));
    }
    s->j = 0;
    s->dx8 = s->dx[0];
    s->b8 += 8 * s->bb;
}

/* Block b ends, m its 16 int16 offsets (one a 16 of columns): its value
 * (BQ_VALUE) kept for its eight, and the next block's state. */
ALWAYS void bq_block_end(struct bq_toks *s, int nt, const uint8_t *b, __m256i m, int64_t elems) {
    const enum bq_offsets kind = s->kind;
    const uint16_t dh = bq_h(b + s->doff), mh = kind == BQ_BY_DMIN ? bq_h(b + s->doff + 2) : 0;
    __m256i o[4];
    BQ_UNROLL for (int t = 0; t < nt; t++) {
        o[t] = kind == BQ_NO_OFFSETS ? _mm256_setzero_si256() : _mm256_madd_epi16(m, bq_load(s->bs[t]));
        if (kind != BQ_BY_DMIN) {
            s->isum[t] = _mm256_sub_epi32(s->isum[t], o[t]);
            o[t] = _mm256_setzero_si256();
        }
    }
    struct bq_eight *e = s->e;
    if (elems == 32) {
        /* IQ4_NL's blocks of 32, which only this product takes: each added
         * as it ends (an eight's bookkeeping cost more than it saved) */
        __m128 dx = _mm_setr_ps(*s->dx[0], nt > 1 ? *s->dx[1] : 0.0f, nt > 2 ? *s->dx[2] : 0.0f, nt > 3 ? *s->dx[3] : 0.0f);
        __m128i S;
        if (nt == 1) {
            __m128i l = _mm_add_epi32(_mm256_castsi256_si128(s->isum[0]), _mm256_extracti128_si256(s->isum[0], 1));
            l = _mm_add_epi32(l, _mm_shuffle_epi32(l, 0x4e));
            S = _mm_add_epi32(l, _mm_shuffle_epi32(l, 0xb1));
        } else {
            S = bq_hsum4(s->isum, nt);
        }
        __m128 d = _mm_broadcastss_ps(_mm_cvtph_ps(_mm_cvtsi32_si128(dh)));
        s->acc = _mm_fmadd_ps(_mm_cvtepi32_ps(S), _mm_mul_ps(d, dx), s->acc);
    } else if (nt == 1) {
        e->so[s->j] = _mm256_hadd_epi32(s->isum[0], o[0]);
    } else {
        __m128 dx = _mm_setr_ps(*s->dx[0], *s->dx[1], nt > 2 ? *s->dx[2] : 0.0f, nt > 3 ? *s->dx[3] : 0.0f);
        __m128i S = bq_hsum4(s->isum, nt), O = kind == BQ_BY_DMIN ? bq_hsum4(o, nt) : _mm_setzero_si128();
        __m128 dm = _mm_cvtph_ps(_mm_setr_epi16((short)dh, (short)mh, 0, 0, 0, 0, 0, 0));
        e->v[s->j] = BQ_VALUE(_mm, S, O, _mm_cvtss_f32(dm), _mm_cvtss_f32(_mm_movehdup_ps(dm)), dx);
    }
    BQ_UNROLL for (int t = 0; t < nt; t++) {
        s->isum[t] = _mm256_setzero_si256();
        s->x[t] += elems;
        s->bs[t] += elems / 16;
        s->dx[t] += 1;
    }
    if (elems != 32 && ++s->j == 8) bq_eight_end(s, nt);
}

/* One block of each format (b its bytes) into s for nt tokens. */
ALWAYS void bq_q4_k(const uint8_t *b, bool five, struct bq_toks *s, int nt) {
    __m128i sc8, mn;
    k4_scales_mins(b, &sc8, &mn);
    __m256i sc = bq_i16x2(sc8, false);
    __m256i m = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mn, mn));  // a 32's min for each of its 16s
    __m256i qh = five ? bq_load(b + 16) : _mm256_setzero_si256();
    const uint8_t *qs = b + (five ? 48 : 16);
    BQ_UNROLL for (int g = 0; g < 8; g++) bq_chunk(s, nt, k4_codes(qs, qh, five, g), bq_scales(sc, bq_same[g]), 32 * g);
    bq_block_end(s, nt, b, m, 256);
}

ALWAYS void bq_q6_k(const uint8_t *b, struct bq_toks *s, int nt) {
    __m128i sc8 = _mm_loadu_si128((const __m128i *)(const void *)(b + 192));
    __m256i sc[2] = {bq_i16x2(sc8, true), bq_i16x2(_mm_srli_si128(sc8, 8), true)};
    __m256i m = _mm256_slli_epi16(_mm256_cvtepi8_epi16(sc8), 5);  // 32 k
    BQ_UNROLL for (int h = 0; h < 2; h++) {
        __m256i q[4];
        q6_k_codes(b, h, q);
        BQ_UNROLL for (int k = 0; k < 4; k++) bq_chunk(s, nt, q[k], bq_scales(sc[h], bq_pair[k]), 128 * h + 32 * k);
    }
    bq_block_end(s, nt, b, m, 256);
}

ALWAYS void bq_q2_q3_k(const uint8_t *b, bool three, struct bq_toks *s, int nt) {
    __m128i k8, m8;
    if (three) {
        k8 = m8 = q3_k_scales(b);
    } else {
        __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)b);
        k8 = _mm_and_si128(sb, _mm_set1_epi8(15));
        m8 = _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15));
    }
    __m256i sc[2] = {bq_i16x2(k8, three), bq_i16x2(_mm_srli_si128(k8, 8), three)};
    __m256i m = three ? _mm256_slli_epi16(_mm256_cvtepi8_epi16(m8), 2) : _mm256_cvtepu8_epi16(m8);  // Q3_K: 4 k
    __m256i hm = three ? bq_load(b) : _mm256_setzero_si256();
    BQ_UNROLL for (int h = 0; h < 2; h++) {
        __m256i qs = bq_load(b + (three ? 32 : 16) + 32 * h);
        BQ_UNROLL for (int k = 0; k < 4; k++) {
            __m256i u = three ? q3_k_codes(qs, hm, h, k) : bit_pair(qs, k);
            bq_chunk(s, nt, u, bq_scales(sc[h], bq_pair[k]), 128 * h + 32 * k);
        }
    }
    bq_block_end(s, nt, b, m, 256);
}

ALWAYS void bq_iq4_xs(const uint8_t *b, struct bq_toks *s, int nt) {
    __m256i sc = bq_i16x2(iq4_xs_scales(b), true);
    BQ_UNROLL for (int i = 0; i < 8; i++)
        bq_chunk_signed(s, nt, iq4_values(b + 8 + 16 * i), bq_scales(sc, bq_same[i]), 32 * i);
    bq_block_end(s, nt, b, _mm256_setzero_si256(), 256);
}

ALWAYS void bq_iq4_nl(const uint8_t *b, struct bq_toks *s, int nt) {
    bq_chunk_signed(s, nt, iq4_values(b + 2), _mm256_set1_epi16(1), 0);
    bq_block_end(s, nt, b, _mm256_setzero_si256(), 32);
}

/* A block format's elements and bytes a block, as constants where T is
 * (the traits table's values; its loop of prefetches then unrolls). */
ALWAYS int64_t bq_group(enum sp_qtype T) {
#define SP_X(e, name, mode, bits, group, biases, block) T == SP_QTYPE_##e ? (group) :
    return SP_QTYPE_LIST(SP_X) 0;
#undef SP_X
}
ALWAYS int64_t bq_block_bytes(enum sp_qtype T) {
#define SP_X(e, name, mode, bits, group, biases, block) T == SP_QTYPE_##e ? (block) :
    return SP_QTYPE_LIST(SP_X) 0;
#undef SP_X
}

/* Where a block keeps d (and dmin after it), and how its offsets scale. */
ALWAYS int bq_d_at(enum sp_qtype T) { return T == SP_QTYPE_Q6_K ? 208 : T == SP_QTYPE_Q3_K ? 108 : T == SP_QTYPE_Q2_K ? 80 : 0; }
ALWAYS enum bq_offsets bq_kind(enum sp_qtype T) {
    return T == SP_QTYPE_Q6_K || T == SP_QTYPE_Q3_K                                ? BQ_BY_D
           : T == SP_QTYPE_IQ4_XS || T == SP_QTYPE_IQ4_NL                          ? BQ_NO_OFFSETS
                                                                                   : BQ_BY_DMIN;
}

/* Row r of w (format T) times nt tokens of q from token t0, into y[t * ldy];
 * ahead: asking for the bytes PREFETCH_AHEAD_4BIT ahead block by block. */
ALWAYS void bq_row(enum sp_qtype T, const struct sp_qmat *w, int64_t r, const struct bq8acts *q, int64_t t0, int nt,
                   bool ahead, float *y, int64_t ldy) {
    const int64_t nb = w->cols / bq_group(T), bb = bq_block_bytes(T);
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * (size_t)(nb * bb);
    struct bq_toks s;
    struct bq_eight eight;
    s.e = &eight;
    for (int t = 0; t < nt; t++) {
        s.x[t] = q->xq + (t0 + t) * q->cols;
        s.bs[t] = q->bs + (t0 + t) * (q->cols / 16);
        s.dx[t] = q->dx + (t0 + t) * (q->cols / q->unit);
        s.isum[t] = _mm256_setzero_si256();
    }
    s.j = 0;
    s.dx8 = s.dx[0];
    s.b8 = b;
    s.bb = bb;
    s.doff = bq_d_at(T);
    s.kind = bq_kind(T);
    s.acc = _mm_setzero_ps();
    for (int64_t i = 0; i < nb; i++, b += bb) {
        if (ahead)
            for (int64_t o = 0; o < bb; o += 64) _mm_prefetch((const char *)b + PREFETCH_AHEAD_4BIT + o, _MM_HINT_T0);
        switch (T) {
        case SP_QTYPE_Q4_K: bq_q4_k(b, false, &s, nt); break;
        case SP_QTYPE_Q5_K: bq_q4_k(b, true, &s, nt); break;
        case SP_QTYPE_Q6_K: bq_q6_k(b, &s, nt); break;
        case SP_QTYPE_Q2_K: bq_q2_q3_k(b, false, &s, nt); break;
        case SP_QTYPE_Q3_K: bq_q2_q3_k(b, true, &s, nt); break;
        case SP_QTYPE_IQ4_XS: bq_iq4_xs(b, &s, nt); break;
        case SP_QTYPE_IQ4_NL: bq_iq4_nl(b, &s, nt); break;
        default: break;
        }
    }
    if (s.j) bq_eight_end(&s, nt);
    float out[4];
    _mm_storeu_ps(out, s.acc);
    for (int t = 0; t < nt; t++) y[t * ldy] = out[t];
}

/* Rows [r0, r1) of a matrix of format T times the tokens of q: up to 4
 * tokens in one pass over each row, asking for the bytes ahead (2-core
 * EPYC VM, avx2, 8 layers of Qwen3-30B-A3B Q4_K_M: decode 1.2-1.3x the
 * tokens a second; a row asked for whole before its pass, 1.07x); more 4
 * at a time, rows read again from the cache (IQ4 in prefill, and the few
 * tokens the product by tokens leaves). */
#define BQ_ROWS(ID, T)                                                                                            \
    static void bq_rows_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct bq8acts *q, int64_t n, \
                             float *y, int64_t ldy) {                                                            \
        for (int64_t r = r0; r < r1; r++) {                                                                     \
            switch (n) {                                                                                        \
            case 1: bq_row(T, w, r, q, 0, 1, true, y + r, ldy); continue;                                       \
            case 2: bq_row(T, w, r, q, 0, 2, true, y + r, ldy); continue;                                       \
            case 3: bq_row(T, w, r, q, 0, 3, true, y + r, ldy); continue;                                       \
            case 4: bq_row(T, w, r, q, 0, 4, true, y + r, ldy); continue;                                       \
            default: break;                                                                                     \
            }                                                                                                   \
            int64_t t = 0;                                                                                      \
            for (; t + 4 <= n; t += 4) bq_row(T, w, r, q, t, 4, false, y + t * ldy + r, ldy);                   \
            switch (n - t) {                                                                                    \
            case 3: bq_row(T, w, r, q, t, 3, false, y + t * ldy + r, ldy); break;                               \
            case 2: bq_row(T, w, r, q, t, 2, false, y + t * ldy + r, ldy); break;                               \
            case 1: bq_row(T, w, r, q, t, 1, false, y + t * ldy + r, ldy); break;                               \
            default: break;                                                                                     \
            }                                                                                                   \
        }                                                                                                       \
    }
BQ_ROWS(q2_k, SP_QTYPE_Q2_K)
BQ_ROWS(q3_k, SP_QTYPE_Q3_K)
BQ_ROWS(q4_k, SP_QTYPE_Q4_K)
BQ_ROWS(q5_k, SP_QTYPE_Q5_K)
BQ_ROWS(q6_k, SP_QTYPE_Q6_K)
BQ_ROWS(iq4_nl, SP_QTYPE_IQ4_NL)
BQ_ROWS(iq4_xs, SP_QTYPE_IQ4_XS)
#undef BQ_ROWS

typedef void (*bq_rows_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct bq8acts *q, int64_t n,
                           float *y, int64_t ldy);
/* The int8 product of a block format, or NULL for the other formats. */
static bq_rows_fn bq_rows_for(enum sp_qtype t) {
    switch (t) {
    case SP_QTYPE_Q2_K: return bq_rows_q2_k;
    case SP_QTYPE_Q3_K: return bq_rows_q3_k;
    case SP_QTYPE_Q4_K: return bq_rows_q4_k;
    case SP_QTYPE_Q5_K: return bq_rows_q5_k;
    case SP_QTYPE_Q6_K: return bq_rows_q6_k;
    case SP_QTYPE_IQ4_NL: return bq_rows_iq4_nl;
    case SP_QTYPE_IQ4_XS: return bq_rows_iq4_xs;
    default: return NULL;
    }
}

/* ---- ggml's K-quants (and, with VNNI, IQ4_XS) by tokens ----
 *
 * The product above unpacks a row's codes again for every 4 tokens. Here,
 * for prefill, the codes of BT_ROWS rows are unpacked once into bytes (in
 * column order, with each row's integer sub-scales and offsets), and the
 * tokens sit side by side, BT_TOKENS to a vector (lane t: token t, 4
 * activations a dword), so that a broadcast dword of a row's codes
 * multiplies 4 columns of every token of the vector at once (vpdpbusd,
 * or vpmaddubsw into int16 on AVX2, widened before a sum could overflow).
 * Each 16 or 32 columns' sums are multiplied by their sub-scale in int32,
 * the offsets come from the activations' sums a 16 (vpmaddwd by pairs of
 * offsets), and each block's value (BQ_VALUE) is added 8 at a time as in
 * the product by rows: a token's result has the same bits either way. */
#if HAVE_ZMM
#define BT_TOKENS 16
#define BT_P _mm512
#define BT_SI si512
typedef __m512i bt_i;
typedef __m512 bt_f;
ALWAYS bt_i bt_dot(bt_i acc, bt_i u, bt_i x) { return _mm512_dpbusd_epi32(acc, u, x); }
ALWAYS bt_i bt_widen(bt_i s) { return s; }
#else
#define BT_TOKENS 8
#define BT_P _mm256
#define BT_SI si256
typedef __m256i bt_i;
typedef __m256 bt_f;
ALWAYS bt_i bt_dot(bt_i acc, bt_i u, bt_i x) { return u8_acc(acc, u, x); }
ALWAYS bt_i bt_widen(bt_i s) { return u8_widen(s); }
#endif
/* BT_OP(_add_epi32): _mm512_add_epi32 or _mm256_add_epi32 */
#define BT_CAT_(a, b) a##b
#define BT_CAT(a, b) BT_CAT_(a, b)
#define BT_OP(op) BT_CAT(BT_P, op)
ALWAYS bt_i bt_load(const void *p) { return BT_OP(BT_CAT(_loadu_, BT_SI))(p); }
ALWAYS bt_i bt_bcast(const void *p) {
    int32_t v;
    memcpy(&v, p, 4);
    return BT_OP(_set1_epi32)(v);
}
ALWAYS bt_i bt_add(bt_i a, bt_i b) { return BT_OP(_add_epi32)(a, b); }
ALWAYS bt_i bt_mul(bt_i a, bt_i b) { return BT_OP(_mullo_epi32)(a, b); }
ALWAYS bt_i bt_madd(bt_i a, bt_i b) { return BT_OP(_madd_epi16)(a, b); }
ALWAYS bt_i bt_zero(void) { return BT_OP(BT_CAT(_setzero_, BT_SI))(); }
ALWAYS bt_f bt_zerof(void) { return BT_OP(_setzero_ps)(); }
ALWAYS bt_f bt_loadf(const float *p) { return BT_OP(_loadu_ps)(p); }
ALWAYS void bt_storef(float *p, bt_f v) { BT_OP(_storeu_ps)(p, v); }
#define BT_ROWS 4
#define BT_EACH_ROW _Pragma("GCC unroll 8")

/* Columns a sub-scale covers, how the offsets scale, and (AVX2 without
 * VNNI) how many 4-column steps of int16 pair sums stay exact: each is at
 * most 2 x 127 x the largest code (Q2_K 3, Q3_K 7, Q4_K 15, Q5_K 31, Q6_K 63). */
ALWAYS int bt_sub(enum sp_qtype T) { return T == SP_QTYPE_Q4_K || T == SP_QTYPE_Q5_K || T == SP_QTYPE_IQ4_XS ? 32 : 16; }
ALWAYS enum bq_offsets bt_kind(enum sp_qtype T) {
    return T == SP_QTYPE_Q6_K || T == SP_QTYPE_Q3_K || T == SP_QTYPE_IQ4_XS ? BQ_BY_D : BQ_BY_DMIN;
}
ALWAYS int bt_exact_steps(enum sp_qtype T) {
    if (HAVE_DPWSSD) return 8;  // int32 sums
    return T == SP_QTYPE_Q6_K ? 2 : T == SP_QTYPE_Q5_K ? 4 : 8;
}

/* The tokens side by side and the unpacked rows, carved out of scratch
 * after bq8_prepare's buffers (sp_kernels_scratch_bytes counts them). */
struct bt_work {
    int8_t *xt;     // (blocks, cols / 4, BT_TOKENS) dwords of 4 activations
    int32_t *bst;   // (blocks, cols / 32, BT_TOKENS) the activations' int16 sums of two 16s
    float *dxt;     // (blocks, cols / 256, BT_TOKENS)
    uint8_t *ub;    // (BT_ROWS, cols) codes as bytes, column order
    int32_t *ks;    // (BT_ROWS, cols / 16) sub-scales
    int32_t *mp;    // (BT_ROWS, cols / 32) offsets of two 16s as int16 pairs
    float *d, *dm;  // (BT_ROWS, cols / 256) each block's d and dmin
};

static void bt_layout(void *scratch, int64_t cols, struct bt_work *wk) {
    const int64_t nt = Q8_TOKENS, nb = cols / 256;
    uint8_t *p = scratch;
    int8_t *xq;
    float *dx;
    int16_t *bs;
    bq8_carve(&p, nt, cols, 256, &xq, &dx, &bs);  // bq8_prepare's, kept
    wk->xt = carve(&p, (size_t)(nt * cols));
    wk->bst = carve(&p, (size_t)(nt * (cols / 32)) * sizeof(int32_t));
    wk->dxt = carve(&p, (size_t)(nt * nb) * sizeof(float));
    wk->ub = carve(&p, (size_t)(BT_ROWS * cols));
    wk->ks = carve(&p, (size_t)(BT_ROWS * (cols / 16)) * sizeof(int32_t));
    wk->mp = carve(&p, (size_t)(BT_ROWS * (cols / 32)) * sizeof(int32_t));
    wk->d = carve(&p, (size_t)(BT_ROWS * nb) * sizeof(float));
    wk->dm = carve(&p, (size_t)(BT_ROWS * nb) * sizeof(float));
}

/* q's n tokens side by side, BT_TOKENS a block (zero past n). */
static void bt_tokens(const struct bq8acts *q, int64_t n, const struct bt_work *wk) {
    const int64_t cols = q->cols, nb = cols / 256;
    for (int64_t b = 0; b * BT_TOKENS < n; b++) {
        float *xt = (float *)(void *)(wk->xt + b * cols * BT_TOKENS);
        float *bst = (float *)(void *)(wk->bst + b * (cols / 32) * BT_TOKENS);
        for (int h = 0; h < BT_TOKENS / 8; h++) {
            const void *x[8], *bs[8];
            for (int t = 0; t < 8; t++) {
                int64_t tg = b * BT_TOKENS + 8 * h + t;
                x[t] = tg < n ? (const void *)(q->xq + tg * cols) : NULL;
                bs[t] = tg < n ? (const void *)(q->bs + tg * (cols / 16)) : NULL;
            }
            for (int64_t k = 0; k < cols; k += 32) transpose8x8(x, k, xt + (k / 4) * BT_TOKENS + 8 * h, BT_TOKENS);
            for (int64_t k = 0; k < cols / 8; k += 32) transpose8x8(bs, k, bst + (k / 4) * BT_TOKENS + 8 * h, BT_TOKENS);
        }
        for (int64_t j = 0; j < nb; j++)
            for (int t = 0; t < BT_TOKENS; t++) {
                int64_t tg = b * BT_TOKENS + t;
                wk->dxt[(b * nb + j) * BT_TOKENS + t] = tg < n ? q->dx[tg * nb + j] : 0.0f;
            }
    }
}

ALWAYS int32_t bt_pair(int a, int b) { return (int32_t)((uint32_t)(uint16_t)(int16_t)a | (uint32_t)(uint16_t)(int16_t)b << 16); }

/* Row r of w into slot i of wk: codes, sub-scales, offsets, d and dmin. */
ALWAYS void bt_unpack(enum sp_qtype T, const struct sp_qmat *w, int64_t r, int i, const struct bt_work *wk) {
    const int64_t cols = w->cols, nb = cols / 256, bb = bq_block_bytes(T);
    const uint8_t *b = (const uint8_t *)w->codes + (size_t)r * (size_t)(nb * bb);
    uint8_t *ub = wk->ub + i * cols;
    int32_t *ks = wk->ks + i * (cols / 16), *mp = wk->mp + i * (cols / 32);
    for (int64_t j = 0; j < nb; j++, b += bb, ub += 256, ks += 16, mp += 8) {
        int8_t k8[16], m8[16] = {0};
        if (T == SP_QTYPE_Q4_K || T == SP_QTYPE_Q5_K) {
            bool five = T == SP_QTYPE_Q5_K;
            __m128i sc, mn;
            k4_scales_mins(b, &sc, &mn);
            _mm_storeu_si128((__m128i *)(void *)k8, sc);
            _mm_storeu_si128((__m128i *)(void *)m8, mn);
            __m256i qh = five ? bq_load(b + 16) : _mm256_setzero_si256();
            for (int g = 0; g < 8; g++) {
                _mm256_storeu_si256((__m256i *)(void *)(ub + 32 * g), k4_codes(b + (five ? 48 : 16), qh, five, g));
                ks[g] = (uint8_t)k8[g];
                mp[g] = bt_pair((uint8_t)m8[g], (uint8_t)m8[g]);
            }
            wk->d[i * nb + j] = bq_f16(b);
            wk->dm[i * nb + j] = bq_f16(b + 2);
            continue;
        }
        if (T == SP_QTYPE_IQ4_XS) {  // table value + 128 (1 .. 241), offsets 128 x the sub-scale
            _mm_storeu_si128((__m128i *)(void *)k8, iq4_xs_scales(b));
            for (int g = 0; g < 8; g++) {
                _mm256_storeu_si256((__m256i *)(void *)(ub + 32 * g),
                                    _mm256_add_epi8(iq4_values(b + 8 + 16 * g), _mm256_set1_epi8(-128)));
                ks[g] = k8[g];
                mp[g] = bt_pair(128 * k8[g], 128 * k8[g]);
            }
            wk->d[i * nb + j] = wk->dm[i * nb + j] = bq_f16(b);
            continue;
        }
        if (T == SP_QTYPE_Q6_K) {
            for (int h = 0; h < 2; h++) {
                __m256i q[4];
                q6_k_codes(b, h, q);
                for (int k = 0; k < 4; k++) _mm256_storeu_si256((__m256i *)(void *)(ub + 128 * h + 32 * k), q[k]);
            }
            memcpy(k8, b + 192, 16);
            for (int s = 0; s < 16; s++) ks[s] = k8[s];
            for (int p = 0; p < 8; p++) mp[p] = bt_pair(32 * k8[2 * p], 32 * k8[2 * p + 1]);
            wk->d[i * nb + j] = wk->dm[i * nb + j] = bq_f16(b + 208);
            continue;
        }
        /* Q2_K, Q3_K */
        bool three = T == SP_QTYPE_Q3_K;
        if (three) {
            _mm_storeu_si128((__m128i *)(void *)k8, q3_k_scales(b));
        } else {
            __m128i sb = _mm_loadu_si128((const __m128i *)(const void *)b);
            _mm_storeu_si128((__m128i *)(void *)k8, _mm_and_si128(sb, _mm_set1_epi8(15)));
            _mm_storeu_si128((__m128i *)(void *)m8, _mm_and_si128(_mm_srli_epi16(sb, 4), _mm_set1_epi8(15)));
        }
        __m256i hm = three ? bq_load(b) : _mm256_setzero_si256();
        for (int h = 0; h < 2; h++) {
            __m256i qs = bq_load(b + (three ? 32 : 16) + 32 * h);
            for (int k = 0; k < 4; k++)
                _mm256_storeu_si256((__m256i *)(void *)(ub + 128 * h + 32 * k),
                                    three ? q3_k_codes(qs, hm, h, k) : bit_pair(qs, k));
        }
        for (int s = 0; s < 16; s++) ks[s] = three ? k8[s] : (uint8_t)k8[s];
        for (int p = 0; p < 8; p++)
            mp[p] = three ? bt_pair(4 * k8[2 * p], 4 * k8[2 * p + 1]) : bt_pair((uint8_t)m8[2 * p], (uint8_t)m8[2 * p + 1]);
        float d = bq_f16(b + (three ? 108 : 80));
        wk->d[i * nb + j] = d;
        wk->dm[i * nb + j] = three ? d : bq_f16(b + 82);
    }
}

/* The BT_ROWS unpacked rows times token block tb: out[i * BT_TOKENS + t]. */
ALWAYS void bt_pass(enum sp_qtype T, const struct bt_work *wk, int64_t cols, int64_t tb, float *out) {
    const int sub = bt_sub(T), qps = sub / 4, steps = bt_exact_steps(T), nsub = 256 / sub;
    const enum bq_offsets kind = bt_kind(T);
    const int64_t nb = cols / 256;
    const int8_t *xt = wk->xt + tb * cols * BT_TOKENS;
    const int32_t *bst = wk->bst + tb * (cols / 32) * BT_TOKENS;
    const float *dxt = wk->dxt + tb * nb * BT_TOKENS;
    bt_f acc[BT_ROWS], v[BT_ROWS][8];
    BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) acc[i] = bt_zerof();
    for (int64_t j = 0; j < nb; j++) {
        bt_i S[BT_ROWS], O[BT_ROWS];
        BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) S[i] = O[i] = bt_zero();
        BQ_UNROLL for (int s = 0; s < nsub; s++) {
            const int64_t c0 = j * 256 + s * sub;
            bt_i part[BT_ROWS], sum[BT_ROWS];
            BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) part[i] = sum[i] = bt_zero();
            BQ_UNROLL for (int k = 0; k < qps; k++) {
                bt_i x = bt_load(xt + (c0 / 4 + k) * 4 * BT_TOKENS);
                BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) part[i] = bt_dot(part[i], bt_bcast(wk->ub + i * cols + c0 + 4 * k), x);
                if ((k + 1) % steps == 0 || k + 1 == qps)
                    BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) sum[i] = bt_add(sum[i], bt_widen(part[i])), part[i] = bt_zero();
            }
            BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++)
                S[i] = bt_add(S[i], bt_mul(sum[i], bt_bcast(wk->ks + i * (cols / 16) + j * 16 + s)));
        }
        for (int p = 0; p < 8; p++) {
            bt_i xs = bt_load(bst + (j * 8 + p) * BT_TOKENS);
            BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) O[i] = bt_add(O[i], bt_madd(bt_bcast(wk->mp + i * (cols / 32) + j * 8 + p), xs));
        }
        bt_f dx = bt_loadf(dxt + j * BT_TOKENS);
        BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) {
            if (kind != BQ_BY_DMIN) {
                S[i] = BT_OP(_sub_epi32)(S[i], O[i]);
                O[i] = bt_zero();
            }
            v[i][j % 8] = BQ_VALUE(BT_P, S[i], O[i], wk->d[i * nb + j], kind == BQ_BY_DMIN ? wk->dm[i * nb + j] : 0.0f, dx);
        }
        if (j % 8 == 7 || j == nb - 1)
            BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) {
                for (int64_t k = j % 8 + 1; k < 8; k++) v[i][k] = bt_zerof();
                acc[i] = BT_OP(_add_ps)(acc[i], BQ_EIGHT(BT_OP(_add_ps), v[i]));
            }
    }
    BT_EACH_ROW for (int i = 0; i < BT_ROWS; i++) bt_storef(out + i * BT_TOKENS, acc[i]);
}

/* Rows [r0, r1) of a matrix whose format goes by tokens (the K-quants; IQ4_XS
 * where VNNI sums in int32) times the n tokens laid out in wk (bt_tokens). */
ALWAYS void bt_rows(enum sp_qtype T, const struct sp_qmat *w, int64_t r0, int64_t r1, const struct bt_work *wk,
                    int64_t n, float *y, int64_t ldy) {
    const size_t row_bytes = (size_t)(w->cols / 256) * (size_t)bq_block_bytes(T);
    float out[BT_ROWS * BT_TOKENS];
    for (int64_t r = r0; r < r1; r += BT_ROWS) {
        int nr = r1 - r < BT_ROWS ? (int)(r1 - r) : BT_ROWS;
        for (int i = 0; i < BT_ROWS; i++) {
            /* the next rows' bytes on their way meanwhile */
            const char *ahead = (const char *)w->codes + (size_t)(r + BT_ROWS + i) * row_bytes;
            if (r + BT_ROWS + i < r1)
                for (size_t o = 0; o < row_bytes; o += 64) _mm_prefetch(ahead + o, _MM_HINT_T0);
            bt_unpack(T, w, i < nr ? r + i : r, i, wk);
        }
        for (int64_t tb = 0; tb * BT_TOKENS < n; tb++) {
            bt_pass(T, wk, w->cols, tb, out);
            int nt = n - tb * BT_TOKENS < BT_TOKENS ? (int)(n - tb * BT_TOKENS) : BT_TOKENS;
            for (int t = 0; t < nt; t++)
                for (int i = 0; i < nr; i++) y[(tb * BT_TOKENS + t) * ldy + r + i] = out[i * BT_TOKENS + t];
        }
    }
}

#define BT_ROWS_FN(ID, T)                                                                                         \
    static void bt_rows_##ID(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct bt_work *wk, int64_t n, \
                             float *y, int64_t ldy) {                                                             \
        bt_rows(T, w, r0, r1, wk, n, y, ldy);                                                                     \
    }
BT_ROWS_FN(q2_k, SP_QTYPE_Q2_K)
BT_ROWS_FN(q3_k, SP_QTYPE_Q3_K)
BT_ROWS_FN(q4_k, SP_QTYPE_Q4_K)
BT_ROWS_FN(q5_k, SP_QTYPE_Q5_K)
BT_ROWS_FN(q6_k, SP_QTYPE_Q6_K)
BT_ROWS_FN(iq4_xs, SP_QTYPE_IQ4_XS)
#undef BT_ROWS_FN

typedef void (*bt_rows_fn)(const struct sp_qmat *w, int64_t r0, int64_t r1, const struct bt_work *wk, int64_t n,
                           float *y, int64_t ldy);
static bt_rows_fn bt_rows_for(enum sp_qtype t) {
    switch (t) {
    case SP_QTYPE_Q2_K: return bt_rows_q2_k;
    case SP_QTYPE_Q3_K: return bt_rows_q3_k;
    case SP_QTYPE_Q4_K: return bt_rows_q4_k;
    case SP_QTYPE_Q5_K: return bt_rows_q5_k;
    case SP_QTYPE_Q6_K: return bt_rows_q6_k;
    /* IQ4_XS's codes + 128 reach 241: pairs of their products overflow
     * vpmaddubsw's int16, so only where vpdpbusd sums them in int32 */
    case SP_QTYPE_IQ4_XS: return HAVE_DPWSSD ? bt_rows_iq4_xs : NULL;
    default: return NULL;
    }
}

/* Tokens of a batch of nq that go by tokens: whole vectors, and a last
 * part one if it fills half of one (the rest go 4 at a time by rows). */
ALWAYS int64_t bt_blocked(int64_t nq) {
    if (nq <= SP_KERNELS_DECODE_MAX_TOKENS) return 0;
    int64_t whole = nq / BT_TOKENS * BT_TOKENS;
    return nq - whole >= BT_TOKENS / 2 ? nq : whole;
}

/* The matrices a product takes with the same activations: one, or two of
 * one format, group and width (an MLP's gate and up), with their outputs. */
struct shared_x {
    const struct sp_qmat *w[2];
    float *y[2];
    int n;
};

/* The rounding unit of a block format: its block (IQ4_NL's 32), else 256. */
ALWAYS int64_t bq8_unit(const struct sp_qmat *w) { return w->type == SP_QTYPE_IQ4_NL ? 32 : 256; }

/* Rows [r0, r1) of m's matrices (block formats with a bq_rows, one
 * width and rounding unit) times x's n tokens, rounded Q8_TOKENS at a
 * time into scratch once for all of them (and laid out side by side once
 * where bt_blocked says): the K-quants by tokens there, the rest 4 tokens
 * a pass by rows. */
static void bq8_rows_all(const struct shared_x *m, int64_t r0, int64_t r1, const float *x, int64_t ldx, int64_t n,
                         int64_t ldy, void *scratch) {
    const struct sp_qmat *w0 = m->w[0];
    bool any_by_tokens = false;
    for (int i = 0; i < m->n; i++) any_by_tokens = any_by_tokens || bt_rows_for(m->w[i]->type);
    for (int64_t t0 = 0; t0 < n; t0 += Q8_TOKENS) {
        int64_t nq = n - t0 < Q8_TOKENS ? n - t0 : Q8_TOKENS;
        struct bq8acts q;
        bq8_prepare(x + t0 * ldx, ldx, nq, w0->cols, bq8_unit(w0), scratch, &q);
        int64_t blocked = any_by_tokens ? bt_blocked(nq) : 0;
        struct bt_work wk;
        if (blocked) {
            bt_layout(scratch, w0->cols, &wk);
            bt_tokens(&q, blocked, &wk);
        }
        for (int i = 0; i < m->n; i++) {
            const bt_rows_fn by_tokens = bt_rows_for(m->w[i]->type);
            float *y = m->y[i] + t0 * ldy;
            int64_t done = by_tokens ? blocked : 0;
            if (done) by_tokens(m->w[i], r0, r1, &wk, done, y, ldy);
            if (done == nq) continue;
            struct bq8acts rest = q;
            rest.xq += done * q.cols;
            rest.dx += done * (q.cols / q.unit);
            rest.bs += done * (q.cols / 16);
            bq_rows_for(m->w[i]->type)(m->w[i], r0, r1, &rest, nq - done, y + done * ldy, ldy);
        }
    }
}

/* ---- interleaved matrices through the products on rows in row order ---- */

/* A product on rows [r0, r1) of w (y at w's row 0), ctx its other arguments */
typedef void (*rows_fn)(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y);

/* sp_qmat_block_rows into buf (codes, scales, biases), its codes moved by
 * 8 x 8 transposes of dwords (16 rows' 4-byte chunks, 8 chunks at a time).
 * Zen 5, 768 x 2048 affine4 at 64 tokens from cache, one thread, the
 * product through these copies against the rows in row order: 0.77-0.79x
 * the speed (a fifth of the time in the copies; moved a dword at a time,
 * 0.35x). */
static void block_rows_x86(const struct sp_qmat *w, int64_t b, uint8_t *buf, struct sp_qmat *out) {
    const size_t rb = sp_qtype_row_bytes(w->type, w->cols);
    const int64_t chunks = (int64_t)rb / 4, whole = chunks / 8 * 8;
    const size_t codes = SP_QMAT_BLOCK_ROWS * rb;
    const size_t scales = (size_t)(SP_QMAT_BLOCK_ROWS * (w->cols / w->group)) * sp_dtype_size(w->scale_dtype);
    const uint8_t *src = (const uint8_t *)w->codes + (size_t)b * codes;
    for (int64_t k0 = 0; k0 < whole; k0 += 8)
        for (int i0 = 0; i0 < SP_QMAT_BLOCK_ROWS; i0 += 8) {
            /* chunk k0 + t of rows i0 .. i0 + 7 -> dword k0 + t of each row */
            const void *in[8];
            for (int t = 0; t < 8; t++) in[t] = src + (k0 + t) * 64 + i0 * 4;
            transpose8x8(in, 0, buf + (size_t)i0 * rb + (size_t)k0 * 4, chunks);
        }
    for (int64_t k = whole; k < chunks; k++)
        for (int i = 0; i < SP_QMAT_BLOCK_ROWS; i++) memcpy(buf + (size_t)i * rb + (size_t)k * 4, src + k * 64 + i * 4, 4);
    sp_qmat_block_groups(w, b, buf + codes, buf + codes + scales, out);
    out->codes = buf;
}

/* fn on rows [r0, r1) of w: w itself, or for an interleaved w each block
 * of its rows in turn, put in row order in the scratch's block buffer (a
 * copy of 16 rows for each product: the kernels without a loop of their
 * own for interleaved rows). */
static void in_row_order(const struct sp_qmat *w, int64_t r0, int64_t r1, float *y, void *scratch, rows_fn fn,
                         const void *ctx) {
    if (!w->interleaved) {
        fn(ctx, w, r0, r1, y);
        return;
    }
    uint8_t *buf = sp_kernels_block_scratch(w, scratch);
    for (int64_t b = r0 / SP_QMAT_BLOCK_ROWS; b * SP_QMAT_BLOCK_ROWS < r1; b++) {
        struct sp_qmat rows;
        block_rows_x86(w, b, buf, &rows);
        int64_t first = b * SP_QMAT_BLOCK_ROWS, lo = r0 > first ? r0 - first : 0;
        int64_t hi = r1 < first + SP_QMAT_BLOCK_ROWS ? r1 - first : SP_QMAT_BLOCK_ROWS;
        fn(ctx, &rows, lo, hi, y + first);
    }
}

/* The kernels' own calls, as rows_fn */
struct acts_call {
    const struct impl *im;
    const void *q;  // struct q8acts or qacts
    int nt;         // tokens (by groups)
    int64_t ldy;
};
static void q8_block_call(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y) {
    const struct acts_call *a = ctx;
    a->im->q8_block(w, r0, r1, a->q, y, a->ldy);
}
static void q8_groups_call(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y) {
    const struct acts_call *a = ctx;
    a->im->q8[a->nt - 1](w, r0, r1, a->q, y, a->ldy);
}
static void q16_call(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y) {
    const struct acts_call *a = ctx;
    a->im->q16[a->nt - 1](w, r0, r1, a->q, y, a->ldy);
}

/* im->q8[nt - 1] on rows [r0, r1) of w in any layout: interleaved rows by
 * their own loop where the set has one. */
static void q8_groups(const struct impl *im, const struct sp_qmat *w, int64_t r0, int64_t r1, const struct q8acts *q,
                      int nt, float *y, int64_t ldy, void *scratch) {
    if (w->interleaved && im->r16) {
        im->r16(w, r0, r1, q, y, ldy);
        return;
    }
    const struct acts_call a = {im, q, nt, ldy};
    in_row_order(w, r0, r1, y, scratch, q8_groups_call, &a);
}

/* Float activations: up to SP_KERNELS_DECODE_MAX_TOKENS tokens decode each
 * row into registers (groups of 4 tokens pass over a few rows while they
 * are cached); more go through the blocked product. Same sums either way. */
struct float_call {
    const struct impl *im;
    const float *x;
    int64_t ldx, n, ldy;
    void *scratch;
};
static void float_call_rows(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y);

static void float_rows(const struct impl *im, const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x,
                       int64_t ldx, int64_t n, float *y, int64_t ldy, void *scratch) {
    if (w->interleaved) {
        const struct float_call f = {im, x, ldx, n, ldy, scratch};
        in_row_order(w, r0, r1, y, scratch, float_call_rows, &f);
        return;
    }
    if (n >= BLOCK_MIN_TOKENS) {
        blocked_rows(w, im->dequant, r0, r1, x, ldx, n, y, ldy, scratch);
        return;
    }
    int64_t chunk = n <= 4 ? r1 - r0 : FUSED_ROW_CHUNK;
    for (int64_t r = r0; r < r1; r += chunk) {
        int64_t re = r1 - r < chunk ? r1 : r + chunk;
        for (int64_t t = 0; t < n; t += 4) {
            int64_t nt = n - t < 4 ? n - t : 4;
            im->fused[nt - 1](w, r, re, x + t * ldx, ldx, y + t * ldy, ldy);
        }
    }
}

static void float_call_rows(const void *ctx, const struct sp_qmat *w, int64_t r0, int64_t r1, float *y) {
    const struct float_call *f = ctx;
    float_rows(f->im, w, r0, r1, f->x, f->ldx, f->n, y, f->ldy, f->scratch);
}

/* int16 activations, for any n: tokens are rounded Q16_TOKENS at a time
 * into scratch, and groups of 4 of them pass over a few rows at a time. A
 * token's sums do not depend on the others (batch invariance). */
static void q16_rows_all(const struct impl *im, const struct shared_x *m, int64_t r0, int64_t r1, const float *x,
                         int64_t ldx, int64_t n, int64_t ldy, void *scratch) {
    const struct sp_qmat *w0 = m->w[0];
    for (int64_t t0 = 0; t0 < n; t0 += Q16_TOKENS) {
        int64_t nq = n - t0 < Q16_TOKENS ? n - t0 : Q16_TOKENS;
        struct qacts q;
        q16_prepare(x + t0 * ldx, ldx, nq, w0->cols, w0->group, im->four_bit, scratch, &q);
        int64_t chunk = nq <= 4 ? r1 - r0 : FUSED_ROW_CHUNK;
        for (int i = 0; i < m->n; i++) {
            for (int64_t r = r0; r < r1; r += chunk) {
                int64_t re = r1 - r < chunk ? r1 : r + chunk;
                for (int64_t t = 0; t < nq; t += 4) {
                    int64_t nt = nq - t < 4 ? nq - t : 4;
                    struct qacts qt = q;
                    qt.xq = (const int16_t *)q.xq + t * q.cols;
                    qt.dx += t * q.ng;
                    qt.xsum += t * q.ng;
                    const struct acts_call a = {im, &qt, (int)nt, ldy};
                    in_row_order(m->w[i], r, re, m->y[i] + (t0 + t) * ldy, scratch, q16_call, &a);
                }
            }
        }
    }
}

/* How many of nq <= Q8_TOKENS tokens go by tokens, the rest going by
 * groups (4 at a time), as measured faster. The avx512 build computes
 * whole pairs of blocks, two pairs a pass for little more than the time of
 * one (Zen 5, 768 x 2048 affine4 from DRAM, one thread: 16 tokens in one
 * pass 165 us, 17-32 in one 220 us, 16 + 1 to 4 by groups 185-205 us, 4
 * tokens by groups 41 us): there a part pair goes by tokens from 5 tokens
 * when it completes a pass of two pairs, from 13 alone. The other builds
 * take whole blocks of 8 and a last part block, padded with zeros, of 4 or
 * more tokens where it completes a pair (Zen 3, one thread, from cache,
 * 512 x 2048 to 2048 x 768 rows: 12 tokens 0.90-1.03x the time of 8 + 4 by
 * groups, 13 tokens 0.77-0.88x, 28 0.94-0.99x; 11 tokens 1.04-1.06x), of 6
 * or more alone. With AMX tiles, mxfp4's product by groups costs far more
 * than a pass (Sapphire Rapids VM, one thread from cache, 768 x 2048: 32
 * tokens 386 us by tiles, 48 in three pairs 518, 32 + 8 by groups 614, 32 +
 * 12 735): there a part pair of 5 tokens or more always goes by tokens
 * (32 + 5 to 12 tokens 0.70-0.88x the time, 2048 x 768 0.70-0.87x; 32 + 4
 * the same either way). */
static int64_t q8_blocked(int64_t nq, bool mx4) {
#if HAVE_ZMM
    const int64_t pair = Q8_PAIR * Q8_BLOCK_TOKENS;
    int64_t whole = nq / pair * pair, rest = nq - whole;
    return rest >= ((whole / pair) % 2 || (HAVE_AMX && mx4) ? 5 : 13) ? nq : whole;
#else
    (void)mx4;
    int64_t rest = nq % Q8_BLOCK_TOKENS;
    return rest >= ((nq / Q8_BLOCK_TOKENS) % 2 ? 4 : 6) ? nq : nq - rest;
#endif
}

/* int8 activations (4- and 8-bit codes), for any n: tokens are rounded
 * Q8_TOKENS at a time (and, for the product by tokens, set side by side in
 * blocks) once for every matrix of m; q8_blocked of them go by tokens where
 * the set has that product, the rest by groups, 4 at a time over a few
 * rows. Both give a token the same bits. */
static void q8_rows_all(const struct impl *im, const struct shared_x *m, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int64_t n, int64_t ldy, void *scratch) {
    const struct sp_qmat *w0 = m->w[0];
    const bool mx4 = w0->type == SP_QTYPE_MXFP4;
    struct q8acts q;
    q8_layout(scratch, w0->cols, w0->cols / w0->group, &q);
    /* interleaved rows, all of them, by their own loops where the set has them */
    bool r16 = im->r16 != NULL;
    for (int i = 0; i < m->n; i++) r16 = r16 && m->w[i]->interleaved;
    for (int64_t t0 = 0; t0 < n; t0 += Q8_TOKENS) {
        int64_t nq = n - t0 < Q8_TOKENS ? n - t0 : Q8_TOKENS;
        int64_t blocked = im->q8_block ? q8_blocked(nq, mx4) : 0;
        q8_prepare(x + t0 * ldx, ldx, nq, blocked, w0->group, w0->type, &q);
        if (blocked) {
            struct q8acts qb = q;
            qb.n = blocked;
            q8_block_tokens(&qb);
            amx_rows_begin((int)(w0->group / 32));
            const struct acts_call a = {im, &qb, 0, ldy};
            for (int i = 0; i < m->n; i++) {
                if (r16 && im->r16_block && !group_order(w0->group))
                    im->r16_block(m->w[i], r0, r1, &qb, m->y[i] + t0 * ldy, ldy);
                else
                    in_row_order(m->w[i], r0, r1, m->y[i] + t0 * ldy, scratch, q8_block_call, &a);
            }
            amx_rows_end();
        }
        if (r16) {
            const struct q8acts qr = q8_from(&q, blocked, nq - blocked);
            for (int i = 0; i < m->n && blocked < nq; i++)
                im->r16(m->w[i], r0, r1, &qr, m->y[i] + (t0 + blocked) * ldy, ldy);
            continue;
        }
        /* interleaved rows a block at a time (pieces ending where blocks end) */
        bool by_blocks = nq - blocked > 4 && w0->interleaved;
        int64_t chunk = nq - blocked <= 4 ? r1 - r0 : by_blocks ? SP_QMAT_BLOCK_ROWS : FUSED_ROW_CHUNK;
        for (int i = 0; i < m->n; i++)
            for (int64_t r = r0, re; r < r1; r = re) {
                re = by_blocks ? (r / chunk + 1) * chunk : r + chunk;
                re = re < r1 ? re : r1;
                for (int64_t t = blocked; t < nq; t += 4) {
                    int64_t nt = nq - t < 4 ? nq - t : 4;
                    const struct q8acts qt = q8_from(&q, t, nt);
                    q8_groups(im, m->w[i], r, re, &qt, (int)nt, m->y[i] + (t0 + t) * ldy, ldy, scratch);
                }
            }
    }
}

/* How a set treats the activations of quantized rows. */
enum acts { ACTS_FLOAT, ACTS_INT16, ACTS_INT8 };

/* The products of m's matrices with x: the int8 or int16 ones rounding x
 * once for all of them where a set has them for the format, else one
 * product each (bf16 rows by b16_rows where bf16 is set). */
static void shared_rows(enum acts acts, bool bf16, const struct impl *im, const struct shared_x *m, int64_t r0,
                        int64_t r1, const float *x, int64_t ldx, int64_t n, int64_t ldy, void *scratch) {
    if (im && acts != ACTS_FLOAT && im->q16[0]) {
        (acts == ACTS_INT8 && im->q8[0] ? q8_rows_all : q16_rows_all)(im, m, r0, r1, x, ldx, n, ldy, scratch);
        return;
    }
    bool blocks = !im && acts == ACTS_INT8;
    for (int i = 0; i < m->n; i++) blocks = blocks && bq_rows_for(m->w[i]->type) && bq8_unit(m->w[i]) == bq8_unit(m->w[0]);
    if (blocks) {
        bq8_rows_all(m, r0, r1, x, ldx, n, ldy, scratch);
        return;
    }
    for (int i = 0; i < m->n; i++) {
#if HAVE_ZMM
        if (bf16 && im == &impl_bf16) {
            b16_rows(m->w[i], r0, r1, x, ldx, n, m->y[i], ldy, scratch);
            continue;
        }
#endif
        if (im) {
            float_rows(im, m->w[i], r0, r1, x, ldx, n, m->y[i], ldy, scratch);
        } else if (acts == ACTS_INT8 && bq_rows_for(m->w[i]->type)) {
            const struct shared_x one = {{m->w[i]}, {m->y[i]}, 1};
            bq8_rows_all(&one, r0, r1, x, ldx, n, ldy, scratch);
        } else {  // decoded a block at a time, whatever n: one summation order
            blocked_rows(m->w[i], block_decoder(m->w[i]), r0, r1, x, ldx, n, m->y[i], ldy, scratch);
        }
    }
}

static void matmul_rows(enum acts acts, bool bf16, const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x,
                        int64_t ldx, int64_t n, float *y, int64_t ldy, void *scratch) {
    const struct shared_x one = {{w}, {y}, 1};
    shared_rows(acts, bf16, impl_for(w), &one, r0, r1, x, ldx, n, ldy, scratch);
}

/* matmul_rows of two matrices with the same x: where they share a format,
 * a group and a width, the activations are rounded once for both. */
static void matmul_rows_pair(enum acts acts, bool bf16, const struct sp_qmat *wa, const struct sp_qmat *wb,
                             int64_t r0, int64_t r1, const float *x, int64_t ldx, int64_t n, float *ya, float *yb,
                             int64_t ldy, void *scratch) {
    const struct impl *im = impl_for(wa);
    if (impl_for(wb) == im && wb->group == wa->group && wb->cols == wa->cols) {
        const struct shared_x two = {{wa, wb}, {ya, yb}, 2};
        shared_rows(acts, bf16, im, &two, r0, r1, x, ldx, n, ldy, scratch);
        return;
    }
    matmul_rows(acts, bf16, wa, r0, r1, x, ldx, n, ya, ldy, scratch);
    matmul_rows(acts, bf16, wb, r0, r1, x, ldx, n, yb, ldy, scratch);
}

/* A set's matmul_rows and matmul_rows_pair (matmul_rows_SUFFIX, pair_SUFFIX):
 * ACTS, and BF16 (bf16 activations for bf16 rows) or not. */
#define ENTRY_POINTS(SUFFIX, ACTS, BF16)                                                                        \
    __attribute__((unused)) static void matmul_rows_##SUFFIX(const struct sp_qmat *w, int64_t r0, int64_t r1,   \
                                                             const float *x, int64_t ldx, int64_t n, float *y,  \
                                                             int64_t ldy, void *scratch) {                     \
        matmul_rows(ACTS, BF16, w, r0, r1, x, ldx, n, y, ldy, scratch);                                       \
    }                                                                                                         \
    __attribute__((unused)) static void pair_##SUFFIX(const struct sp_qmat *wa, const struct sp_qmat *wb,      \
                                                      int64_t r0, int64_t r1, const float *x, int64_t ldx,     \
                                                      int64_t n, float *ya, float *yb, int64_t ldy,            \
                                                      void *scratch) {                                         \
        matmul_rows_pair(ACTS, BF16, wa, wb, r0, r1, x, ldx, n, ya, yb, ldy, scratch);                        \
    }
ENTRY_POINTS(q8, ACTS_INT8, false)
ENTRY_POINTS(q16, ACTS_INT16, false)
ENTRY_POINTS(float, ACTS_FLOAT, false)
#if HAVE_ZMM
ENTRY_POINTS(q8_b16, ACTS_INT8, true)
#endif

/* 8 values of dtype dt at b + i as floats */
ALWAYS __m256 load8_dt(enum sp_dtype dt, const void *b, int64_t i) {
    if (dt == SP_DTYPE_F32) return _mm256_loadu_ps((const float *)b + i);
    __m128i h = _mm_loadu_si128((const __m128i *)(const void *)((const uint8_t *)b + 2 * i));
    if (dt == SP_DTYPE_F16) return _mm256_cvtph_ps(h);
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

/* Four chains of 8 lanes, then one chain for the last multiple of 8. */
static float dot_x86(const float *a, const float *b, int64_t n) {
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

static void axpy_x86(float *y, float a, const float *x, int64_t n) {
    __m256 av = _mm256_set1_ps(a);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, _mm256_fmadd_ps(av, _mm256_loadu_ps(x + i), _mm256_loadu_ps(y + i)));
    for (; i < n; i++) y[i] += a * x[i];
}

static void to_f32_x86(float *y, const void *x, enum sp_dtype dt, int64_t n) {
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, load8_dt(dt, x, i));
    for (; i < n; i++) y[i] = sp_dtype_load_float(dt, x, (size_t)i);
}

#if HAVE_ZMM
/* nq <= 4 queries x nv <= 2 vectors of 16 columns (nr of them real): each
 * lane one chain of FMAs over k, the same as the other builds' 8-column
 * blocks (dot_cols_block) compute. */
ALWAYS void dot_cols_block16(float *out, int64_t ldo, const float *a, int64_t lda, int nq, const float *cols,
                             int64_t ldc, int nv, int64_t nr, int64_t n, float scale) {
    __m512 s[4][2];
    __mmask16 real[2];  // the columns read: only the nr real ones
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++)
        real[v] = nr - 16 * v >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (nr - 16 * v)) - 1);
#pragma GCC unroll 8
    for (int i = 0; i < nq * nv; i++) s[i / nv][i % nv] = _mm512_setzero_ps();
    for (int64_t k = 0; k < n; k++) {
        __m512 c[2];
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) c[v] = _mm512_maskz_loadu_ps(real[v], cols + k * ldc + 16 * v);
#pragma GCC unroll 8
        for (int i = 0; i < nq * nv; i++)
            s[i / nv][i % nv] = _mm512_fmadd_ps(_mm512_set1_ps(a[i / nv * lda + k]), c[i % nv], s[i / nv][i % nv]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < nq * nv; i++) {
        int q = i / nv, v = i % nv;
        _mm512_mask_storeu_ps(out + q * ldo + 16 * v, real[v], _mm512_mul_ps(s[q][v], _mm512_set1_ps(scale)));
    }
}

/* Four queries x up to 32 columns at a time: a column vector loaded once
 * serves the four, and 8 chains are in flight. */
static void dot_cols_x86(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols,
                         int64_t ldc, int64_t nr, int64_t n, float scale) {
    for (int64_t r = 0; r < nr; r += 32) {
        int64_t m = nr - r < 32 ? nr - r : 32;
        for (int64_t q = 0; q < na; q += 4) {
            int nq = na - q < 4 ? (int)(na - q) : 4;
            float *o = out + q * ldo + r;
            const float *aq = a + q * lda, *c = cols + r;
#define DOT_COLS_(NQ) \
    (m > 16 ? dot_cols_block16(o, ldo, aq, lda, NQ, c, ldc, 2, m, n, scale) \
            : dot_cols_block16(o, ldo, aq, lda, NQ, c, ldc, 1, m, n, scale))
            if (nq == 4) DOT_COLS_(4);
            else if (nq == 3) DOT_COLS_(3);
            else if (nq == 2) DOT_COLS_(2);
            else DOT_COLS_(1);
#undef DOT_COLS_
        }
    }
}
#else
/* nq queries x nv vectors of 8 columns (nr of them real, nq x nv <= 8):
 * each lane one chain of FMAs over k, the same whatever the block. */
ALWAYS void dot_cols_block(float *out, int64_t ldo, const float *a, int64_t lda, int nq, const float *cols,
                           int64_t ldc, int nv, int64_t nr, int64_t n, float scale) {
    __m256 s[4][4];
#pragma GCC unroll 8
    for (int i = 0; i < nq * nv; i++) s[i / nv][i % nv] = _mm256_setzero_ps();
    for (int64_t k = 0; k < n; k++) {
        __m256 c[4];
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) {
            c[v] = _mm256_loadu_ps(cols + k * ldc + 8 * v);
            /* in a register for all the queries (folded into each FMA it
             * would be loaded once per query) */
            if (nq > 1) __asm__("" : "+x"(c[v]));
        }
#pragma GCC unroll 8
        for (int i = 0; i < nq * nv; i++)
            s[i / nv][i % nv] = _mm256_fmadd_ps(_mm256_broadcast_ss(a + i / nv * lda + k), c[i % nv], s[i / nv][i % nv]);
    }
#pragma GCC unroll 8
    for (int i = 0; i < nq * nv; i++) {
        int q = i / nv, v = i % nv;
        float *o = out + q * ldo + 8 * v;
        __m256 r = _mm256_mul_ps(s[q][v], _mm256_set1_ps(scale));
        if (8 * v + 8 <= nr) {
            _mm256_storeu_ps(o, r);
        } else {
            float t[8];
            _mm256_storeu_ps(t, r);
            for (int64_t j = 0; j < nr - 8 * v; j++) o[j] = t[j];
        }
    }
}

/* Queries x columns at a time: 4 x 16, 3 x 16, or 2 (or 1) x 32, so that
 * a column vector loaded once serves every query of the block and up to 8
 * chains are in flight (Zen 3, one thread, 8 queries x 32 columns x 128:
 * 0.53-0.61x the time of 2 x 32 blocks whose loads were folded into the
 * FMAs, ~45 of the ~50 G multiply-adds a second FMA peak). */
ALWAYS void dot_cols_queries(float *out, int64_t ldo, const float *a, int64_t lda, int nq, const float *cols,
                             int64_t ldc, int64_t nr, int64_t n, float scale) {
    const int wide = nq > 2 ? 2 : 4;  // vectors of 8 columns per block
    for (int64_t r = 0; r < nr; r += 8 * wide) {
        int64_t m = nr - r < 8 * wide ? nr - r : 8 * wide;
        int nv = (int)((m + 7) / 8);
        float *o = out + r;
        const float *c = cols + r;
        if (nv == 4) dot_cols_block(o, ldo, a, lda, nq, c, ldc, 4, m, n, scale);
        else if (nv == 3) dot_cols_block(o, ldo, a, lda, nq, c, ldc, 3, m, n, scale);
        else if (nv == 2) dot_cols_block(o, ldo, a, lda, nq, c, ldc, 2, m, n, scale);
        else dot_cols_block(o, ldo, a, lda, nq, c, ldc, 1, m, n, scale);
    }
}

static void dot_cols_x86(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols,
                         int64_t ldc, int64_t nr, int64_t n, float scale) {
    int64_t q = 0;
    for (; q + 4 <= na; q += 4) dot_cols_queries(out + q * ldo, ldo, a + q * lda, lda, 4, cols, ldc, nr, n, scale);
    if (na - q == 3) dot_cols_queries(out + q * ldo, ldo, a + q * lda, lda, 3, cols, ldc, nr, n, scale);
    else if (na - q == 2) dot_cols_queries(out + q * ldo, ldo, a + q * lda, lda, 2, cols, ldc, nr, n, scale);
    else if (na - q == 1) dot_cols_queries(out + q * ldo, ldo, a + q * lda, lda, 1, cols, ldc, nr, n, scale);
}
#endif

/* axpy_x86's operations per element (an FMA per row in the vector part,
 * a product then a sum in the tail), rows in turn, for nq outputs: a row's
 * vector loaded once serves them all. */
ALWAYS void axpy_rows_q(float *y, int64_t ldy, const float *w, int64_t ldw, int nq, const float *rows, int64_t nr,
                        int64_t n) {
    int64_t i = 0;
#if HAVE_ZMM
    /* 32 elements as two 512-bit vectors, up to 4 outputs */
    for (; i + 32 <= n; i += 32) {
        __m512 acc[4][2];
#pragma GCC unroll 8
        for (int j = 0; j < 2 * nq; j++) acc[j / 2][j % 2] = _mm512_loadu_ps(y + j / 2 * ldy + i + 16 * (j % 2));
        for (int64_t r = 0; r < nr; r++) {
            const float *x = rows + r * n + i;
            __m512 xv[2] = {_mm512_loadu_ps(x), _mm512_loadu_ps(x + 16)};
            /* in registers for all the outputs (a Xeon, 2 and 3 outputs:
             * 0.55-0.65x the time of loads folded into each FMA) */
            if (nq > 1) __asm__("" : "+v"(xv[0]), "+v"(xv[1]));
#pragma GCC unroll 8
            for (int j = 0; j < 2 * nq; j++)
                acc[j / 2][j % 2] = _mm512_fmadd_ps(_mm512_set1_ps(w[j / 2 * ldw + r]), xv[j % 2], acc[j / 2][j % 2]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < 2 * nq; j++) _mm512_storeu_ps(y + j / 2 * ldy + i + 16 * (j % 2), acc[j / 2][j % 2]);
    }
#else
    /* 3 or 4 outputs x 16 elements (two vectors), or 1 or 2 x 32 (four):
     * up to 8 chains, a row's vectors loaded once for all the outputs (8
     * outputs x 32 rows x 128, as dot_cols_queries: 0.57-0.64x the time) */
    const int nv = nq > 2 ? 2 : 4;
    for (; i + 8 * nv <= n; i += 8 * nv) {
        __m256 acc[4][4];
#pragma GCC unroll 8
        for (int j = 0; j < nv * nq; j++) acc[j / nv][j % nv] = _mm256_loadu_ps(y + j / nv * ldy + i + 8 * (j % nv));
        for (int64_t r = 0; r < nr; r++) {
            const float *x = rows + r * n + i;
            __m256 xv[4];
#pragma GCC unroll 4
            for (int v = 0; v < nv; v++) {
                xv[v] = _mm256_loadu_ps(x + 8 * v);
                if (nq > 1) __asm__("" : "+x"(xv[v]));  // as in dot_cols_block
            }
#pragma GCC unroll 8
            for (int j = 0; j < nv * nq; j++)
                acc[j / nv][j % nv] = _mm256_fmadd_ps(_mm256_broadcast_ss(w + j / nv * ldw + r), xv[j % nv], acc[j / nv][j % nv]);
        }
#pragma GCC unroll 8
        for (int j = 0; j < nv * nq; j++) _mm256_storeu_ps(y + j / nv * ldy + i + 8 * (j % nv), acc[j / nv][j % nv]);
    }
#endif
    for (int q = 0; q < nq; q++) {
        float *yq = y + q * ldy;
        const float *wq = w + q * ldw;
        int64_t e = i;
        for (; e + 8 <= n; e += 8) {
            __m256 yv = _mm256_loadu_ps(yq + e);
            for (int64_t r = 0; r < nr; r++) yv = _mm256_fmadd_ps(_mm256_set1_ps(wq[r]), _mm256_loadu_ps(rows + r * n + e), yv);
            _mm256_storeu_ps(yq + e, yv);
        }
        for (; e < n; e++)
            for (int64_t r = 0; r < nr; r++) yq[e] += wq[r] * rows[r * n + e];
    }
}

static void axpy_rows_x86(float *y, int64_t ldy, const float *w, int64_t ldw, int64_t na, const float *rows,
                          int64_t nr, int64_t n) {
    int64_t q = 0;
    for (; q + 4 <= na; q += 4) axpy_rows_q(y + q * ldy, ldy, w + q * ldw, ldw, 4, rows, nr, n);
    if (na - q == 3) {
        axpy_rows_q(y + q * ldy, ldy, w + q * ldw, ldw, 3, rows, nr, n);
        return;
    }
    for (; q + 2 <= na; q += 2) axpy_rows_q(y + q * ldy, ldy, w + q * ldw, ldw, 2, rows, nr, n);
    if (q < na) axpy_rows_q(y + q * ldy, ldy, w + q * ldw, ldw, 1, rows, nr, n);
}

/* exp(x) for x in [-87, 88] (clamped there): x = n ln 2 + r, |r| <= ln 2 / 2,
 * exp(r) by the Cephes polynomial, 2^n put in the exponent; within ~2
 * float roundings of expf. One body for 8 lanes (exp8) and, in the 512-bit
 * builds, 16 (exp16): the same operations lane by lane, so the same bits.
 * P: the intrinsics' prefix, V: the vector type, ROUND: to the nearest
 * integer as a float, CAST: int32 lanes as float bits. */
#define EXP_BODY(P, V, ROUND, CAST)                                                                               \
    x = P##_min_ps(P##_max_ps(x, P##_set1_ps(-87.0f)), P##_set1_ps(88.0f));                                       \
    V n = ROUND(P##_mul_ps(x, P##_set1_ps(1.44269504088896341f)), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); \
    /* ln 2 in two parts, the first exact in few bits */                                                          \
    V r = P##_fnmadd_ps(n, P##_set1_ps(0.693359375f), x);                                                         \
    r = P##_fnmadd_ps(n, P##_set1_ps(-2.12194440e-4f), r);                                                        \
    V p = P##_set1_ps(1.9875691500e-4f);                                                                          \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.3981999507e-3f));                                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(8.3334519073e-3f));                                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(4.1665795894e-2f));                                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(1.6666665459e-1f));                                                        \
    p = P##_fmadd_ps(p, r, P##_set1_ps(5.0000001201e-1f));                                                        \
    p = P##_fmadd_ps(p, P##_mul_ps(r, r), P##_add_ps(r, P##_set1_ps(1.0f)));                                      \
    return P##_mul_ps(p, CAST(P##_slli_epi32(P##_add_epi32(P##_cvtps_epi32(n), P##_set1_epi32(127)), 23)));
/* act(g) * (u + u_offset), lanes clamped to the limit as sp_glu says (EXP:
 * exp8 or exp16) */
#define GLU_BODY(P, V, EXP)                                                                                       \
    const V lim = P##_set1_ps(p->limit);                                                                          \
    g = P##_min_ps(g, lim);                                                                                       \
    u = P##_max_ps(P##_min_ps(u, lim), P##_sub_ps(P##_setzero_ps(), lim));                                        \
    V e = EXP(P##_mul_ps(P##_sub_ps(P##_setzero_ps(), g), P##_set1_ps(p->alpha)));                                \
    V glu = P##_div_ps(g, P##_add_ps(P##_set1_ps(1.0f), e));                                                      \
    return P##_mul_ps(P##_add_ps(u, P##_set1_ps(p->u_offset)), glu);

ALWAYS __m256 exp8(__m256 x) { EXP_BODY(_mm256, __m256, _mm256_round_ps, _mm256_castsi256_ps) }
ALWAYS __m256 glu8(__m256 g, __m256 u, const struct sp_glu *p) { GLU_BODY(_mm256, __m256, exp8) }
#if HAVE_ZMM
ALWAYS __m512 exp16(__m512 x) { EXP_BODY(_mm512, __m512, _mm512_roundscale_ps, _mm512_castsi512_ps) }
ALWAYS __m512 glu16(__m512 g, __m512 u, const struct sp_glu *p) { GLU_BODY(_mm512, __m512, exp16) }

/* 16 pairs interleaved at g -> the first and second of each pair */
ALWAYS void split_pairs16(const float *g, __m512 *first, __m512 *second) {
    const __m512 a = _mm512_loadu_ps(g), b = _mm512_loadu_ps(g + 16);
    const __m512i evens = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    *first = _mm512_permutex2var_ps(a, evens, b);
    *second = _mm512_permutex2var_ps(a, _mm512_add_epi32(evens, _mm512_set1_epi32(1)), b);
}
#endif
#undef EXP_BODY
#undef GLU_BODY

/* 8 pairs interleaved at g -> the first and second of each pair */
ALWAYS void split_pairs(const float *g, __m256 *first, __m256 *second) {
    __m256 a = _mm256_loadu_ps(g), b = _mm256_loadu_ps(g + 8);
    /* per 128-bit lane: [a0 a2 b0 b2 | a4 a6 b4 b6], then the 64-bit quarters in order */
    *first = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0x88)), 0xD8));
    *second = _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(_mm256_shuffle_ps(a, b, 0xDD)), 0xD8));
}

/* 16 at a time in 512-bit builds, then 8; the last n % 8 elements go
 * through the same vector code, padded. */
static void glu_x86(float *out, const float *g, const float *u, int64_t n, const struct sp_glu *p) {
    int64_t i = 0;
#if HAVE_ZMM
    for (; i + 16 <= n; i += 16) {
        __m512 gv, uv;
        if (u)
            gv = _mm512_loadu_ps(g + i), uv = _mm512_loadu_ps(u + i);
        else
            split_pairs16(g + 2 * i, &gv, &uv);
        _mm512_storeu_ps(out + i, glu16(gv, uv, p));
    }
#endif
    for (; i + 8 <= n; i += 8) {
        __m256 gv, uv;
        if (u)
            gv = _mm256_loadu_ps(g + i), uv = _mm256_loadu_ps(u + i);
        else
            split_pairs(g + 2 * i, &gv, &uv);
        _mm256_storeu_ps(out + i, glu8(gv, uv, p));
    }
    if (i == n) return;
    float gt[8] = {0}, ut[8] = {0}, ot[8];
    for (int64_t k = 0; k < n - i; k++) {
        gt[k] = u ? g[i + k] : g[2 * (i + k)];
        ut[k] = u ? u[i + k] : g[2 * (i + k) + 1];
    }
    _mm256_storeu_ps(ot, glu8(_mm256_loadu_ps(gt), _mm256_loadu_ps(ut), p));
    memcpy(out + i, ot, (size_t)(n - i) * sizeof *ot);
}

/* The largest of init and v[0 .. n) (vmaxps keeps its second operand where
 * the first is NaN, so NaN never enters the running maxima). */
ALWAYS float max_of(const float *v, int64_t n, float init) {
    __m256 m[4];
    for (int c = 0; c < 4; c++) m[c] = _mm256_set1_ps(init);
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
        for (int c = 0; c < 4; c++) m[c] = _mm256_max_ps(_mm256_loadu_ps(v + i + 8 * c), m[c]);
    float best = hmax(_mm256_max_ps(_mm256_max_ps(m[0], m[1]), _mm256_max_ps(m[2], m[3])));
    for (; i < n; i++) best = v[i] > best ? v[i] : best;
    return best;
}

/* The largest value first (max_of), then the first place that holds it. */
static int64_t argmax_x86(const float *v, int64_t n) {
    const float best = max_of(v, n, -INFINITY);
    const __m256 b8 = _mm256_set1_ps(best);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int hit = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(v + i), b8, _CMP_EQ_OQ));
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    for (; i < n; i++)
        if (v[i] == best) return i;
    return 0;  // every value NaN
}

/* exp(v[i] - m) for i < n into out (unless NULL; out may be v), and their
 * sum in double. */
ALWAYS double exps(float *out, const float *v, int64_t n, float m) {
    const __m256 sh = _mm256_set1_ps(m);
    __m256d s0 = _mm256_setzero_pd(), s1 = _mm256_setzero_pd();
    int64_t i = 0;
#if HAVE_ZMM
    /* two groups of 8 at a time: the first 4 of each into s0's lanes (the
     * low half of s), the last 4 into s1's, in the same order */
    __m512d s = _mm512_setzero_pd();
    for (; i + 16 <= n; i += 16) {
        __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(v + i), _mm512_set1_ps(m)));
        if (out) _mm512_storeu_ps(out + i, e);
        s = _mm512_add_pd(s, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
        s = _mm512_add_pd(s, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
    }
    s0 = _mm512_castpd512_pd256(s);
    s1 = _mm512_extractf64x4_pd(s, 1);
#endif
    for (; i + 8 <= n; i += 8) {
        __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(v + i), sh));
        if (out) _mm256_storeu_ps(out + i, e);
        s0 = _mm256_add_pd(s0, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
        s1 = _mm256_add_pd(s1, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
    }
    double lanes[4], sum;
    _mm256_storeu_pd(lanes, _mm256_add_pd(s0, s1));
    sum = (lanes[0] + lanes[2]) + (lanes[1] + lanes[3]);
    if (i < n) {
        float t[8] = {0};
        memcpy(t, v + i, (size_t)(n - i) * sizeof *t);
        _mm256_storeu_ps(t, exp8(_mm256_sub_ps(_mm256_loadu_ps(t), sh)));
        for (int64_t k = 0; k < n - i; k++) sum += t[k];
        if (out) memcpy(out + i, t, (size_t)(n - i) * sizeof *t);
    }
    return sum;
}

static double sum_exp_x86(const float *v, int64_t n, float m) { return exps(NULL, v, n, m); }

/* The max, then the exps 8 at a time (16 in 512-bit builds, the same
 * sums), summed in 8 double lanes (4 x 2) added at the end, the last n % 8
 * through the same code, padded (exps). */
static double softmax_chunk_x86(float *v, int64_t n, float *m) {
    *m = max_of(v, n, *m);
    return exps(v, v, n, *m);
}

#define KSET_TABLE(ISA, NAME, MATMUL, PAIR, IL, BF16) \
    {                                                 \
        .isa = ISA,                                   \
        .name = NAME,                                 \
        .interleaved_rows = IL,                       \
        .bf16_rows = BF16,                            \
        .matmul_rows = MATMUL,                        \
        .matmul_rows_pair = PAIR,                     \
        .matmul_rows_float = matmul_rows_float,       \
        .dot = dot_x86,                               \
        .axpy = axpy_x86,                             \
        .to_f32 = to_f32_x86,                         \
        .dot_cols = dot_cols_x86,                     \
        .axpy_rows = axpy_rows_x86,                   \
        .glu = glu_x86,                               \
        .softmax_chunk = softmax_chunk_x86,           \
        .argmax = argmax_x86,                         \
        .sum_exp = sum_exp_x86,                       \
    }

static const struct sp_kernels kset = KSET_TABLE(KSET_ISA, KSET_NAME, matmul_rows_q8, pair_q8, HAVE_ZMM, false);
static const struct sp_kernels kset_int16 =
    KSET_TABLE(KSET_INT16_ISA, KSET_NAME "-int16", matmul_rows_q16, pair_q16, false, false);
#ifdef KSET_FLOAT_ISA
static const struct sp_kernels kset_float =
    KSET_TABLE(KSET_FLOAT_ISA, KSET_FLOAT_NAME, matmul_rows_float, pair_float, false, false);
#endif
#if HAVE_ZMM
/* the int8 set where the CPU has AVX512-BF16 (its int16 twin keeps the
 * activations of bf16 rows in float) */
static const struct sp_kernels kset_b16 = KSET_TABLE(KSET_ISA, KSET_NAME, matmul_rows_q8_b16, pair_q8_b16, true, true);
#endif

const struct sp_kernels *KSET_ENTRY(enum sp_kernels_isa isa, bool bf16) {
#ifdef KSET_FLOAT_ISA
    if (isa == KSET_FLOAT_ISA) return &kset_float;
#endif
#if HAVE_ZMM
    if (isa == KSET_ISA && bf16) return &kset_b16;
#endif
    return isa == KSET_INT16_ISA ? &kset_int16 : &kset;
}

#endif
