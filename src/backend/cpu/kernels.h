/*
 * kernels.h - the CPU kernel sets and their run-time dispatch. A kernel set
 * is a table of function pointers for the hot loops of the forward pass:
 * products of packed weight rows with a batch of activation vectors, the
 * float dot / axpy and softmax exponentials of attention, and the MLPs'
 * gated activation. The portable set (plain C, any x86-64 or
 * other CPU) is the reference structure; the x86 sets (matvec_x86.h) are
 * chosen by what the CPU has: "amx" (avx512 plus AMX-INT8 tiles, which the
 * OS lets the process use), else "avx512" (AVX-512 F/BW/VL/DQ + VNNI), else
 * "avxvnni" (AVX2 + AVX-VNNI), else "avx2" (AVX2, FMA, F16C). The four give
 * bit-identical results; the VNNI ones take fewer instructions per
 * multiply-add, amx fewer still. Each has a twin "NAME-int16" that rounds
 * the activations of 4- and 8-bit rows to int16 instead of int8 (slower,
 * closer to float), and avx2 one with float activations, "avx2f". The CLI's
 * --kernels and --precision make another set current (sp_kernels_use).
 *
 *     const struct sp_kernels *k = sp_kernels();      // the set in use
 *     // y[t * ldy + r] = (row r of w) . x[t * ldx ...] for r in [r0, r1), t < n
 *     k->matmul_rows(&w, r0, r1, x, ldx, n, y, ldy, scratch);
 *     float s = k->dot(a, b, 128);
 *
 * scratch is a per-thread buffer of at least sp_kernels_scratch_bytes(&w)
 * bytes, 64-byte aligned (the thread pool's scratch); kernels allocate
 * nothing. The returned tables are static and live for the whole process.
 *
 * Numerics: the portable and avx2f sets compute the same products in float
 * with a different summation order (and FMA rounding). avx2, avxvnni and
 * avx512 round activations with one scale per weight group (32 to 128
 * columns): to int8 in the products of 4- and 8-bit formats (error <= 1/254
 * of the group's largest value per element, a sixteenth of the 4-bit
 * weights' own rounding step), to int16 in those of MLX's 2, 3, 5 and 6-bit
 * formats (1/65534); their -int16 twins use int16 for all. ggml's block formats (GGUF's K-quants
 * and IQ4s) take int8 activations with one scale per block (256 columns,
 * IQ4_NL's 32), as ggml's own kernels do, in those sets (and amx), and float
 * activations in the others. matmul_rows_float keeps activations in
 * float. tests/test_kernels.c holds each set to the scalar reference of
 * quant/qtype.h with named tolerances (relative to sum |w_i x_i|, plus the
 * standard deviation of int8 rounding); bench/act_precision.sh measures
 * what the rounding costs a trained model's perplexity: on stories260K,
 * int8 adds 0.1-1.2% to the 11-28% that 4-bit weights cost and 0.4% to the
 * 0.07% of 8-bit ones, int16 nothing measurable (tests/cli/stories.sh holds the int8 cost under 3% of the
 * log-likelihood).
 */
#ifndef SP_KERNELS_CPU_KERNELS_H
#define SP_KERNELS_CPU_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "quant/qtype.h"

enum sp_kernels_isa {
    SP_KERNELS_PORTABLE,
    SP_KERNELS_AVX2,         // products of 4- and 8-bit codes with int8 activations, 2, 3, 5, 6-bit with int16
    SP_KERNELS_AVX2_INT16,   // int16 activations for 4- and 8-bit codes too
    SP_KERNELS_AVX2F,        // the same instructions, float activations throughout
    SP_KERNELS_AVXVNNI,      // avx2's products with AVX-VNNI multiply-adds
    SP_KERNELS_AVXVNNI_INT16,
    SP_KERNELS_AVX512,       // the same with AVX-512 VNNI
    SP_KERNELS_AVX512_INT16, // 512 bits wide for int16 x 4-bit rows
    SP_KERNELS_AMX,          // avx512 with AMX tiles for the int8 product by tokens
    SP_KERNELS_AMX_INT16,    // avx512-int16 under the amx set's name
    SP_KERNELS_ISA_COUNT
};

struct sp_kernels {
    enum sp_kernels_isa isa;
    const char *name;  // "portable", "avx2", "avx2-int16", "avx2f", "avxvnni", ...
    /* Interleaved 4-bit rows (sp_qmat.interleaved) go through loops of the
     * set's own; in the other sets each block of them is put back in row
     * order for every product (the same results, slower). */
    bool interleaved_rows;
    /* bf16 rows multiply activations rounded to bf16 (vdpbf16ps: the
     * avx512 and amx sets on CPUs with AVX512-BF16), not floats */
    bool bf16_rows;
    /* y[t * ldy + r] = dot(row r of w, x + t * ldx) for r in [r0, r1) and
     * t in [0, n): every weight row is read from memory once per call. Works
     * for every format of the traits table (formats a set has no fast path
     * for go through its blocked float product, or the portable code). */
    void (*matmul_rows)(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx, int64_t n,
                        float *y, int64_t ldy, void *scratch);
    /* matmul_rows of two matrices with the same x (an MLP's gate and up):
     * ya, yb get what matmul_rows gives wa, wb, to the bit; where the two
     * share a format, a group and a width, x is rounded once for both. */
    void (*matmul_rows_pair)(const struct sp_qmat *wa, const struct sp_qmat *wb, int64_t r0, int64_t r1,
                             const float *x, int64_t ldx, int64_t n, float *ya, float *yb, int64_t ldy, void *scratch);
    /* The same with the activations kept in float (no int8/int16 rounding), for
     * products whose small errors matter more than their speed (routers). */
    void (*matmul_rows_float)(const struct sp_qmat *w, int64_t r0, int64_t r1, const float *x, int64_t ldx,
                              int64_t n, float *y, int64_t ldy, void *scratch);
    /* sum of a[i] * b[i] over n floats */
    float (*dot)(const float *a, const float *b, int64_t n);
    /* y[i] += a * x[i] over n floats */
    void (*axpy)(float *y, float a, const float *x, int64_t n);
    /* y[i] = x[i] as float over n values of dtype dt (F32, F16 or BF16;
     * exact): a KV cache row of any type, converted once for attention. */
    void (*to_f32)(float *y, const void *x, enum sp_dtype dt, int64_t n);
    /* Attention's blocks of cached keys (as columns) and values (as rows).
     * out[q * ldo + r] = scale x the sum over k < n of a[q * lda + k] *
     * cols[k * ldc + r], for q < na, r < nr, k in order. A result depends
     * on its query and column alone (not on na, nr or where the column
     * sits). It may read cols[k * ldc + r] for r up to nr rounded up to 8;
     * what those hold (NaN included) reaches no result. */
    void (*dot_cols)(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols, int64_t ldc,
                     int64_t nr, int64_t n, float scale);
    /* For q < na: axpy(y + q * ldy, w[q * ldw + r], rows + r * n, n) for
     * r = 0 .. nr - 1 in turn, exactly, with y kept in registers across the
     * rows */
    void (*axpy_rows)(float *y, int64_t ldy, const float *w, int64_t ldw, int64_t na, const float *rows, int64_t nr,
                      int64_t n);
    /* out[i] = the gated activation p of g[i] and u[i] for i < n (u NULL:
     * g holds the pairs interleaved, g[2i] and g[2i + 1]). An element's
     * result depends on its inputs alone, not on n or its place. The
     * portable set computes with expf, the x86 sets with a polynomial
     * exp (within a few float roundings of it). */
    void (*glu)(float *out, const float *g, const float *u, int64_t n, const struct sp_glu *p);
    /* The index of the largest of v[0 .. n) (the first of equals; NaN is
     * passed over; 0 when every value is NaN or n is 0). */
    int64_t (*argmax)(const float *v, int64_t n);
    /* The sum of exp(v[i] - m) over v[0 .. n), in double, exp as softmax
     * computes it (m: at least the largest v[i], so that none overflows):
     * the normalizer of a log-softmax. */
    double (*sum_exp)(const float *v, int64_t n, float m);
    /* One chunk of an online softmax (attention's scores, a chunk of
     * positions at a time): m' = the larger of *m (-INFINITY: none yet)
     * and the largest of v[0 .. n) (NaN passed over), v[i] = exp(v[i] -
     * m') in place, *m = m'; returns the exps' sum in double. exp as glu
     * computes it; the result depends on v and *m alone. */
    double (*softmax_chunk)(float *v, int64_t n, float *m);
};

/* The set this process uses: the one sp_kernels_use made current, else
 * the best the CPU runs (sp_kernels_best). Thread-safe. */
const struct sp_kernels *sp_kernels(void);
/* Makes k the set sp_kernels() returns from now on (NULL: the best again)
 * and returns the one used before: once at startup (the CLI's --kernels
 * and --precision), or in tests and benchmarks that compare sets within
 * one process, between forward passes (never while one runs). */
const struct sp_kernels *sp_kernels_use(const struct sp_kernels *k);
/* The set of one instruction set, or NULL when this CPU cannot run it. */
const struct sp_kernels *sp_kernels_of(enum sp_kernels_isa isa);
/* The set of that name ("portable", "avx2", "avx2-int16", "avx2f",
 * "avxvnni", "avxvnni-int16", "avx512", "avx512-int16", "amx",
 * "amx-int16"), or NULL when there is none or this CPU cannot run it. */
const struct sp_kernels *sp_kernels_by_name(const char *name);
/* The fastest set this CPU runs: amx, else avx512, else avxvnni, else
 * avx2, else portable. */
const struct sp_kernels *sp_kernels_best(void);
/* The fastest set that keeps activations in float throughout: avx2f,
 * else portable. */
const struct sp_kernels *sp_kernels_float(void);
/* The x86 blocked (prefill) float product dequantizes 4 rows x 512
 * columns at a time; up to SP_KERNELS_DECODE_MAX_TOKENS tokens go through
 * the fused float product instead. The int16- and int8-activation products
 * keep rounded copies of SP_KERNELS_Q16_TOKENS and SP_KERNELS_Q8_TOKENS
 * tokens at a time, the bf16-activation one of SP_KERNELS_BF16_TOKENS. */
#define SP_KERNELS_BLOCK_ROWS 4
#define SP_KERNELS_BLOCK_COLS 512
#define SP_KERNELS_DECODE_MAX_TOKENS 7
#define SP_KERNELS_Q16_TOKENS 16
#define SP_KERNELS_Q8_TOKENS 64
#define SP_KERNELS_BF16_TOKENS 96
/* Whether a weight matrix w (row order) is to be interleaved for set k:
 * where k has loops of its own for such rows and they were measured faster
 * on w's format (sp_qmat_interleavable). */
bool sp_kernels_interleave(const struct sp_kernels *k, const struct sp_qmat *w);
/* Per-thread scratch bytes that matmul_rows of any set needs for w. */
size_t sp_kernels_scratch_bytes(const struct sp_qmat *w);
/* Where in a scratch of sp_kernels_scratch_bytes(w) the rows of a block of
 * an interleaved w can be put in row order (sp_qmat_block_rows). */
void *sp_kernels_block_scratch(const struct sp_qmat *w, void *scratch);

/* The x86 sets; only call when the CPU has the instructions (kernels.c).
 * bf16: the CPU has AVX512-BF16 (the avx512 and amx sets then multiply bf16
 * rows by bf16 activations; the others ignore it). */
const struct sp_kernels *sp_kernels_avx2_set(enum sp_kernels_isa isa, bool bf16);
const struct sp_kernels *sp_kernels_avxvnni_set(enum sp_kernels_isa isa, bool bf16);
const struct sp_kernels *sp_kernels_avx512_set(enum sp_kernels_isa isa, bool bf16);
const struct sp_kernels *sp_kernels_amx_set(enum sp_kernels_isa isa, bool bf16);

#endif
