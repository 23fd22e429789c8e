/*
 * qref.h - reference products for the kernel and backend tests: random
 * matrices in any format (quantized by the reference quantizer), and the
 * worst error of computed products against sp_qmat_dot_row_ref relative to
 * named tolerances, which depend on how the activations were rounded.
 * Header-only, for tests/test_*.c.
 */
#ifndef SP_TESTS_QREF_H
#define SP_TESTS_QREF_H

#include <float.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/rng.h"
#include "quant/qtype.h"

/* Allowed |kernel - reference| relative to sum_i |w_i x_i| (the reference
 * sums in double). The sets sum in float in another order and decode affine
 * weights with one FMA (s*q+b rounded once): for rows of up to ~1000
 * columns that stays near 1e-6; a wrong code, scale or column is >= 1e-3. */
#define TOL_MATMUL 1e-5
#define TOL_DOT 1e-5
/* The int16-activation products (MLX's 2, 3, 5 and 6-bit codes in avx2,
 * avxvnni, avx512; every affine and mxfp4 format in their -int16 sets) round activations to int16
 * per weight group: element i is off by at most amax_group / 65534, so the
 * error relative to sum |w_i x_i| is about (amax / mean |x|) / 65534 in the
 * worst case, ~5e-5 for Gaussian activations in 32-column rows, much less on
 * average. */
#define TOL_Q16 2e-4
/* The int8-activation products (4- and 8-bit codes in avx2, avxvnni, avx512)
 * round x_i to a multiple of dx = amax_group / 127: independent errors
 * uniform in +-dx/2 multiplied by c_i, the part of w_i that multiplies the
 * rounded activations (affine: s * q = w - b, the bias term taking the
 * float sum of x; mxfp4: w), so the error of a product has standard
 * deviation sqrt(sum_i c_i^2 dx_i^2 / 12); allowed: Q8_SIGMAS of those plus
 * TOL_MATMUL. A wrong code, scale, column or offset is off by far more. */
#define Q8_SIGMAS 6.0
/* The bf16-activation products (bf16 rows in the avx512 and amx sets on
 * CPUs with AVX512-BF16) round x_i to bf16, nearest even: off by at most half
 * a unit of its 8-bit significand, a relative error within +-2^-8, taken
 * as uniform over +-2^-8, so the error of a product has standard deviation
 * sqrt(sum_i (w_i x_i)^2 / 12) x 2^-7; allowed: Q8_SIGMAS of those plus
 * TOL_MATMUL (a wrong weight or column is ~ |w_i x_i|, several times more
 * in rows of a thousand columns). */

enum acts { ACTS_FLOAT, ACTS_INT16, ACTS_INT8, ACTS_BF16, ACTS_COUNT };

/* How set k rounds the activations of its product with m. */
static inline enum acts acts_of(const struct sp_kernels *k, const struct sp_qmat *m) {
    if (m->type == SP_QTYPE_BF16 && k->bf16_rows) return ACTS_BF16;
    if (!sp_qtype_is_quantized(m->type)) return ACTS_FLOAT;
    /* ggml's block formats: int8 (one scale a block) in the int8 sets, float in the others */
    bool blocks = sp_qtype_traits(m->type)->block_bytes != 0;
    bool bytes = m->type == SP_QTYPE_AFFINE4 || m->type == SP_QTYPE_MXFP4 || m->type == SP_QTYPE_AFFINE8;
    switch (k->isa) {
    case SP_KERNELS_AVX2:
    case SP_KERNELS_AVXVNNI:
    case SP_KERNELS_AVX512:
    case SP_KERNELS_AMX:
        return bytes || blocks ? ACTS_INT8 : ACTS_INT16;
    case SP_KERNELS_AVX2_INT16:
    case SP_KERNELS_AVXVNNI_INT16:
    case SP_KERNELS_AVX512_INT16:
    case SP_KERNELS_AMX_INT16:
        return blocks ? ACTS_FLOAT : ACTS_INT16;
    default:
        return ACTS_FLOAT;
    }
}

struct mat {
    struct sp_qmat m;
    void *codes, *scales, *biases;
};

/* A random rows x cols matrix of type t, quantized by the reference
 * quantizer. Row magnitudes vary over 2^-8..2^8 so scales vary too. */
static inline void mat_make(struct mat *o, enum sp_qtype t, int group, enum sp_dtype sdt, int64_t rows, int64_t cols,
                     struct sp_rng *rng) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(t);
    memset(o, 0, sizeof *o);
    if (!tr->mode) group = 1;
    bool arrays = tr->mode && !tr->block_bytes;  // scales apart from the codes
    enum sp_dtype s_dt = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : sdt;
    size_t rb = sp_qtype_row_bytes(t, cols);
    int64_t ng = cols / group;
    size_t sb = arrays ? (size_t)ng * sp_dtype_size(s_dt) : 0;
    o->codes = calloc((size_t)rows, rb + 1);
    if (arrays) o->scales = calloc((size_t)rows, sb);
    if (tr->has_biases) o->biases = calloc((size_t)rows, sb);
    float *x = malloc((size_t)cols * sizeof *x);
    for (int64_t r = 0; r < rows; r++) {
        float mag = ldexpf(1.0f, (int)(sp_rng_next(rng) % 17) - 8);
        /* a per-row offset makes affine biases matter */
        float off = (sp_rng_uniform(rng) - 0.5f) * mag;
        for (int64_t i = 0; i < cols; i++) x[i] = sp_rng_normal(rng) * mag + off;
        sp_qtype_quantize_row_ref(t, x, cols, group, (uint8_t *)o->codes + (size_t)r * rb,
                                  o->scales ? (uint8_t *)o->scales + (size_t)r * sb : NULL,
                                  o->biases ? (uint8_t *)o->biases + (size_t)r * sb : NULL, s_dt);
    }
    free(x);
    o->m = (struct sp_qmat){.type = t, .group = group, .rows = rows, .cols = cols, .codes = o->codes,
                            .scales = o->scales, .biases = o->biases,
                            .scale_dtype = arrays ? s_dt : SP_DTYPE_COUNT};
}

static inline void mat_free(struct mat *o) {
    free(o->codes);
    free(o->scales);
    free(o->biases);
}

/* What a product of row r of m (dequantized: w) with x may be off by:
 * TOL_MATMUL (TOL_Q16 for int16 activations) x sum |w x|, plus for int8,
 * int16 and bf16 activations Q8_SIGMAS standard deviations of their
 * rounding (TOL_Q16 covers Gaussian activations; a group whose largest
 * value dwarfs the rest, as an MLP's intermediates can, needs the second). */
static inline double qref_allowed(const struct sp_qmat *m, int64_t r, const float *w, const float *xt, enum acts acts) {
    double tol = acts == ACTS_INT16 ? TOL_Q16 : TOL_MATMUL;
    double mag = 0.0, var = 0.0;
    for (int64_t i = 0; i < m->cols; i++) {
        mag += fabs((double)w[i] * xt[i]);
        if (acts == ACTS_BF16) var += (double)w[i] * xt[i] * w[i] * xt[i] * ldexp(1.0, -14) / 12;
    }
    /* int8 (int16) activations: x_i rounded to a multiple of amax / 127
     * (32767) of its group, the error multiplying w_i less the group's bias */
    double steps = acts == ACTS_INT8 ? 127 : 32767;
    for (int64_t g0 = 0; (acts == ACTS_INT8 || acts == ACTS_INT16) && g0 < m->cols; g0 += m->group) {
        size_t gi = (size_t)(r * (m->cols / m->group) + g0 / m->group);
        double b = m->biases ? sp_dtype_load_float(m->scale_dtype, m->biases, gi) : 0.0;
        double amax = 0.0, c2 = 0.0;
        for (int64_t i = g0; i < g0 + m->group; i++) {
            amax = fmax(amax, fabs(xt[i]));
            c2 += ((double)w[i] - b) * ((double)w[i] - b);
        }
        var += c2 * (amax / steps) * (amax / steps) / 12;
    }
    return tol * mag + Q8_SIGMAS * sqrt(var);
}

/* Worst |got - ref| / allowed (qref_allowed) over outputs; > 1 is a failure. */
static inline double worst_ratio(const struct sp_qmat *m, const float *x, int64_t ldx, int64_t n, const float *y,
                                 int64_t ldy, enum acts acts, int64_t *bad_r, int64_t *bad_t) {
    float *w = malloc((size_t)m->cols * sizeof *w);
    double worst = 0.0;
    for (int64_t r = 0; r < m->rows; r++) {
        sp_qmat_dequant_row_ref(m, r, w);
        for (int64_t t = 0; t < n; t++) {
            const float *xt = x + t * ldx;
            double ref = sp_qmat_dot_row_ref(m, r, xt), got = y[t * ldy + r];
            double ratio = fabs(got - ref) / (qref_allowed(m, r, w, xt, acts) + DBL_MIN);
            if (!(ratio <= worst)) {  // also catches NaN
                worst = isnan(ratio) ? INFINITY : ratio;
                *bad_r = r;
                *bad_t = t;
            }
        }
    }
    free(w);
    return worst;
}

#endif
