/* kernels.c - the portable kernel set (plain C, the structure SIMD sets
 * follow) and the run-time choice of a set (cpuid, or a set the caller names). */
#include "backend/cpu/kernels.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#endif
#if defined(__linux__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include <math.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/half.h"

/* Dequantizes one row into floats: tight loops for the common formats, the
 * reference for the rest (same values either way: the same float ops). */
static void dequant_row(const struct sp_qmat *w, int64_t r, float *out) {
    if (w->interleaved) {
        sp_qmat_dequant_row_ref(w, r, out);
        return;
    }
    const uint8_t *row = (const uint8_t *)w->codes + (size_t)r * sp_qtype_row_bytes(w->type, w->cols);
    int64_t n = w->cols, ng = w->cols / w->group;
    switch (w->type) {
    case SP_QTYPE_F32:
        memcpy(out, row, (size_t)n * sizeof(float));
        return;
    case SP_QTYPE_BF16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            out[i] = sp_bf16_to_f32(h);
        }
        return;
    case SP_QTYPE_F16:
        for (int64_t i = 0; i < n; i++) {
            uint16_t h;
            memcpy(&h, row + 2 * i, 2);
            out[i] = sp_f16_to_f32(h);
        }
        return;
    case SP_QTYPE_AFFINE4:
    case SP_QTYPE_AFFINE8: {
        int bits = sp_qtype_traits(w->type)->bits;
        for (int64_t g = 0; g < ng; g++) {
            float s = sp_dtype_load_float(w->scale_dtype, w->scales, (size_t)(r * ng + g));
            float b = sp_dtype_load_float(w->scale_dtype, w->biases, (size_t)(r * ng + g));
            const uint8_t *c = row + (size_t)(g * w->group * bits / 8);
            float *o = out + g * w->group;
            if (bits == 4)
                for (int64_t i = 0; i < w->group / 2; i++) {
                    o[2 * i] = s * (float)(c[i] & 0xf) + b;
                    o[2 * i + 1] = s * (float)(c[i] >> 4) + b;
                }
            else
                for (int64_t i = 0; i < w->group; i++) o[i] = s * (float)c[i] + b;
        }
        return;
    }
    case SP_QTYPE_MXFP4: {
        const uint8_t *sc = (const uint8_t *)w->scales + (size_t)(r * ng);
        for (int64_t g = 0; g < ng; g++) {
            float s = sp_e8m0_to_float(sc[g]);
            const uint8_t *c = row + (size_t)(g * 16);
            float *o = out + g * 32;
            for (int i = 0; i < 16; i++) {
                o[2 * i] = sp_e2m1_values[c[i] & 0xf] * s;
                o[2 * i + 1] = sp_e2m1_values[c[i] >> 4] * s;
            }
        }
        return;
    }
    default:
        sp_qmat_dequant_row_ref(w, r, out);
    }
}

/* Eight independent partial sums: the compiler may vectorize them, and the
 * order does not depend on the instruction set. */
static float dot_portable(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

static void axpy_portable(float *y, float a, const float *x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

static void to_f32_portable(float *y, const void *x, enum sp_dtype dt, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] = sp_dtype_load_float(dt, x, (size_t)i);
}

static void dot_cols_portable(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols,
                              int64_t ldc, int64_t nr, int64_t n, float scale) {
    for (int64_t q = 0; q < na; q++)
        for (int64_t r = 0; r < nr; r++) {
            float s = 0.0f;
            for (int64_t k = 0; k < n; k++) s += a[q * lda + k] * cols[k * ldc + r];
            out[q * ldo + r] = s * scale;
        }
}

static void axpy_rows_portable(float *y, int64_t ldy, const float *w, int64_t ldw, int64_t na, const float *rows,
                               int64_t nr, int64_t n) {
    for (int64_t q = 0; q < na; q++)
        for (int64_t r = 0; r < nr; r++) axpy_portable(y + q * ldy, w[q * ldw + r], rows + r * n, n);
}

static void glu_portable(float *out, const float *g, const float *u, int64_t n, const struct sp_glu *p) {
    for (int64_t i = 0; i < n; i++) {
        float gi = u ? g[i] : g[2 * i], ui = u ? u[i] : g[2 * i + 1];
        gi = gi > p->limit ? p->limit : gi;
        ui = ui > p->limit ? p->limit : ui < -p->limit ? -p->limit : ui;
        out[i] = (ui + p->u_offset) * (gi / (1.0f + expf(-gi * p->alpha)));
    }
}

static int64_t argmax_portable(const float *v, int64_t n) {
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (best < 0 ? v[i] == v[i] : v[i] > v[best]) best = i;
    return best < 0 ? 0 : best;
}

static double sum_exp_portable(const float *v, int64_t n, float m) {
    double sum = 0;
    for (int64_t i = 0; i < n; i++) sum += expf(v[i] - m);
    return sum;
}

static double softmax_chunk_portable(float *v, int64_t n, float *m) {
    float top = *m;
    for (int64_t i = 0; i < n; i++) top = v[i] > top ? v[i] : top;
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - top);
        sum += v[i];
    }
    *m = top;
    return sum;
}

/* Each row is dequantized once into scratch and dotted with every token. */
static void matmul_rows_portable(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx,
                                 int64_t n, float *y, int64_t ldy, void *scratch) {
    float *row = scratch;
    for (int64_t r = r0; r < r1; r++) {
        dequant_row(w, r, row);
        for (int64_t t = 0; t < n; t++) y[t * ldy + r] = dot_portable(row, x + t * ldx, w->cols);
    }
}

static void matmul_rows_pair_portable(const struct sp_qmat *wa, const struct sp_qmat *wb, int64_t r0, int64_t r1,
                                      const float *x, int64_t ldx, int64_t n, float *ya, float *yb, int64_t ldy,
                                      void *scratch) {
    matmul_rows_portable(wa, r0, r1, x, ldx, n, ya, ldy, scratch);
    matmul_rows_portable(wb, r0, r1, x, ldx, n, yb, ldy, scratch);
}

static const struct sp_kernels portable = {
    .isa = SP_KERNELS_PORTABLE,
    .name = "portable",
    .matmul_rows = matmul_rows_portable,
    .matmul_rows_pair = matmul_rows_pair_portable,
    .matmul_rows_float = matmul_rows_portable,
    .dot = dot_portable,
    .axpy = axpy_portable,
    .to_f32 = to_f32_portable,
    .dot_cols = dot_cols_portable,
    .axpy_rows = axpy_rows_portable,
    .glu = glu_portable,
    .argmax = argmax_portable,
    .sum_exp = sum_exp_portable,
    .softmax_chunk = softmax_chunk_portable,
};

/* What the x86 sets need, read from cpuid directly (not every compiler's
 * __builtin_cpu_supports knows f16c or the VNNI flags), together with the
 * OS's consent to save the registers (xgetbv). */
struct x86_features {
    bool avx2;     // AVX2, FMA, F16C; XMM and YMM state saved
    bool avxvnni;  // avx2 and AVX-VNNI
    bool avx512;   // avx2 and AVX-512 F, DQ, BW, VL, VNNI; opmask and ZMM state saved
    bool amx;      // avx512 and AMX-TILE, AMX-INT8; tile state saved, its use granted (amx_granted)
    bool bf16;     // avx512 and AVX512-BF16
};

/* Linux saves a thread's AMX tile data only for a process that asked
 * (arch_prctl ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA); without it the
 * first tile instruction kills the process. Asking again is harmless. */
static bool amx_granted(void) {
#if defined(__linux__) && defined(__x86_64__)
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XFEATURE_XTILEDATA */) == 0;
#else
    return false;
#endif
}

static struct x86_features x86_features(void) {
    struct x86_features f = {0};
#if defined(__x86_64__)
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return f;
    bool fma = c & (1u << 12), osxsave = c & (1u << 27), avx = c & (1u << 28), f16c = c & (1u << 29);
    if (!(fma && osxsave && avx && f16c)) return f;
    unsigned xlo, xhi;
    __asm__ volatile("xgetbv" : "=a"(xlo), "=d"(xhi) : "c"(0));
    if ((xlo & 6) != 6) return f;
    if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(b & (1u << 5))) return f;
    f.avx2 = true;
    bool avx512 = (b & (1u << 16)) && (b & (1u << 17)) && (b & (1u << 30)) && (b & (1u << 31));
    f.avx512 = avx512 && (c & (1u << 11)) && (xlo & 0xe0) == 0xe0;  // VNNI; opmask, ZMM 0-15 high, ZMM 16-31
    /* AMX-TILE and AMX-INT8; XTILECFG and XTILEDATA state */
    bool amx = (d & (1u << 24)) && (d & (1u << 25)) && (xlo & 0x60000) == 0x60000;
    f.amx = f.avx512 && amx && amx_granted();
    if (__get_cpuid_count(7, 1, &a, &b, &c, &d)) {
        f.avxvnni = a & (1u << 4);
        f.bf16 = f.avx512 && (a & (1u << 5));
    }
#endif
    return f;
}

const struct sp_kernels *sp_kernels_of(enum sp_kernels_isa isa) {
    if (isa == SP_KERNELS_PORTABLE) return &portable;
#if defined(__x86_64__)
    struct x86_features f = x86_features();
    switch (isa) {
    case SP_KERNELS_AVX2:
    case SP_KERNELS_AVX2_INT16:
    case SP_KERNELS_AVX2F:
        return f.avx2 ? sp_kernels_avx2_set(isa, f.bf16) : NULL;
    case SP_KERNELS_AVXVNNI:
    case SP_KERNELS_AVXVNNI_INT16:
        return f.avxvnni ? sp_kernels_avxvnni_set(isa, f.bf16) : NULL;
    case SP_KERNELS_AVX512:
    case SP_KERNELS_AVX512_INT16:
        return f.avx512 ? sp_kernels_avx512_set(isa, f.bf16) : NULL;
    case SP_KERNELS_AMX:
    case SP_KERNELS_AMX_INT16:
        return f.amx ? sp_kernels_amx_set(isa, f.bf16) : NULL;
    default:
        return NULL;
    }
#else
    return NULL;
#endif
}

const struct sp_kernels *sp_kernels_by_name(const char *name) {
    for (int i = 0; name && i < SP_KERNELS_ISA_COUNT; i++) {
        const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)i);
        if (k && strcmp(name, k->name) == 0) return k;
    }
    return NULL;
}

const struct sp_kernels *sp_kernels_best(void) {
    const enum sp_kernels_isa best_first[] = {SP_KERNELS_AMX, SP_KERNELS_AVX512, SP_KERNELS_AVXVNNI, SP_KERNELS_AVX2};
    for (size_t i = 0; i < sizeof best_first / sizeof best_first[0]; i++) {
        const struct sp_kernels *k = sp_kernels_of(best_first[i]);
        if (k) return k;
    }
    return &portable;
}

const struct sp_kernels *sp_kernels_float(void) {
    const struct sp_kernels *k = sp_kernels_of(SP_KERNELS_AVX2F);
    return k ? k : &portable;
}

/* The set in use; NULL until the first call chooses one. */
static _Atomic(const struct sp_kernels *) chosen;

const struct sp_kernels *sp_kernels(void) {
    /* Racing first calls compute the same answer; the atomic keeps it defined. */
    const struct sp_kernels *k = atomic_load_explicit(&chosen, memory_order_acquire);
    if (!k) {
        k = sp_kernels_best();
        atomic_store_explicit(&chosen, k, memory_order_release);
    }
    return k;
}

const struct sp_kernels *sp_kernels_use(const struct sp_kernels *k) {
    const struct sp_kernels *before = sp_kernels();
    atomic_store_explicit(&chosen, k, memory_order_release);
    return before;
}

/* affine4 only. Zen 5 VM, avx512, 2 threads: a one-token product from DRAM
 * 1.15-1.45x the bytes a second of row order, by tokens 1.0-1.2x
 * (matvec_x86.h); 4-layer models end to end (medians of 3 runs, rounds
 * taking turns), decode Ling-mini-2.0 1.41-1.57x, Qwen3-30B-A3B
 * 1.02-1.56x, prefill 0.94-1.21x. mxfp4 was not kept: its one-token product from DRAM
 * 0.87-1.04x, by tokens 0.85-0.88x; end to end, decode Qwen3 1.12x but
 * Ling-mini 0.96-0.97x, prefill 0.93-1.08x. On a Sapphire Rapids Xeon
 * (amx) a one-token product runs at DRAM speed either way, and the affine4
 * Qwen3 prefills 1.07-1.15x as fast interleaved. */
bool sp_kernels_interleave(const struct sp_kernels *k, const struct sp_qmat *w) {
    return k->interleaved_rows && w->type == SP_QTYPE_AFFINE4 && sp_qmat_interleavable(w);
}

/* The scratch every product of w needs, less the block of rows that an
 * interleaved w adds (sp_kernels_block_scratch). The portable product
 * dequantizes a whole row; the x86 blocked one a block of rows x columns;
 * the x86 int16 one keeps int16 activations plus two floats per group (at
 * least 32 columns) per token, and one row's multipliers for 4 tokens (the
 * int8 one the same with int8). */
static size_t products_scratch(const struct sp_qmat *w) {
    size_t row = (size_t)w->cols * sizeof(float), block = SP_KERNELS_BLOCK_ROWS * SP_KERNELS_BLOCK_COLS * sizeof(float);
    size_t groups = (size_t)(w->cols / 32 + 1);
    size_t q16 = SP_KERNELS_Q16_TOKENS * ((size_t)w->cols * sizeof(int16_t) + 2 * groups * sizeof(float)) + 4 * groups * sizeof(float);
    /* int8 (matvec_x86.h, q8_layout): the tokens three times (as rounded,
     * in unit-pair order, and side by side 8 at a time), up to 16 rows of
     * codes as bytes (the amx set's tile of rows; avx512 takes 8, the
     * others 4), and per group up to 16 more (q8_ldg): 6 arrays of a token
     * each and 2 of 16 rows, plus 4096 floats of chains (4 blocks x 16 rows
     * x 8 chains x 8 tokens) and a byte per block of 8 tokens */
    size_t ldg = groups + 16;
    size_t q8 = (3 * SP_KERNELS_Q8_TOKENS + 16) * (size_t)w->cols +
                (6 * SP_KERNELS_Q8_TOKENS + 32) * ldg * sizeof(float) + 4096 * sizeof(float) +
                SP_KERNELS_Q8_TOKENS / 8;
    /* bf16 activations (b16_rows): a batch of tokens, rows padded to 32 */
    size_t b16 = SP_KERNELS_BF16_TOKENS * (size_t)((w->cols + 31) / 32 * 32) * sizeof(uint16_t);
    size_t m = row > block ? row : block;
    if (q8 > m) m = q8;
    if (b16 > m) m = b16;
    size_t most = m > q16 ? m : q16;
    return (most + 63) / 64 * 64 + 64;  // whole cache lines: what follows stays aligned
}

size_t sp_kernels_scratch_bytes(const struct sp_qmat *w) {
    return products_scratch(w) + (w->interleaved ? sp_qmat_block_bytes(w) : 0);
}

void *sp_kernels_block_scratch(const struct sp_qmat *w, void *scratch) {
    return (char *)scratch + products_scratch(w);
}
