/* linear.c - portable CPU kernels (the reference structure the SIMD
 * variants follow). */
#include "kernels/cpu/linear.h"

#include "core/half.h"

#include <math.h>
#include <string.h>

float sp_dot_f32(const float *a, const float *b, int64_t n) {
    float s[8] = {0};
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        for (int k = 0; k < 8; k++) s[k] += a[i + k] * b[i + k];
    float r = ((s[0] + s[4]) + (s[1] + s[5])) + ((s[2] + s[6]) + (s[3] + s[7]));
    for (; i < n; i++) r += a[i] * b[i];
    return r;
}

void sp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double ss = 0.0;
    for (int64_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    for (int64_t i = 0; i < n; i++) out[i] = w ? w[i] * (x[i] * scale) : x[i] * scale;
}

void sp_vector_to_f32(const struct sp_vector *v, float *out) {
    for (int64_t i = 0; i < v->n; i++) out[i] = sp_dtype_load_float(v->dtype, v->data, (size_t)i);
}

size_t sp_linear_scratch_bytes(const struct sp_linear *l) {
    int64_t n = l->transposed ? l->w.rows : l->w.cols;
    return (size_t)n * sizeof(float) + 64;
}

struct job {
    const struct sp_linear *l;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    int64_t n;
    struct sp_pool *pool;
};

static float bias_at(const struct sp_linear *l, int64_t r) {
    return l->bias ? sp_dtype_load_float(l->bias_dtype, l->bias, (size_t)r) : 0.0f;
}

/* Dequantizes one row into floats: tight loops for the common formats, the
 * reference for the rest (same values either way: the same float ops). */
static void dequant_row(const struct sp_qmat *w, int64_t r, float *out) {
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

/* (out, in) storage: threads take rows; each row is dequantized once and
 * dotted with every token. */
static void rows_job(void *arg, int tid, int nth) {
    const struct job *j = arg;
    const struct sp_qmat *w = &j->l->w;
    float *row = sp_pool_scratch(j->pool, tid);
    int64_t lo, hi;
    sp_pool_split(w->rows, tid, nth, &lo, &hi);
    for (int64_t r = lo; r < hi; r++) {
        dequant_row(w, r, row);
        float b = bias_at(j->l, r);
        for (int64_t t = 0; t < j->n; t++) j->y[t * j->ldy + r] = sp_dot_f32(row, j->x + t * j->ldx, w->cols) + b;
    }
}

/* (in, out) storage: threads take output columns and stream the input rows. */
static void cols_job(void *arg, int tid, int nth) {
    const struct job *j = arg;
    const struct sp_qmat *w = &j->l->w;
    float *buf = sp_pool_scratch(j->pool, tid);
    enum sp_dtype dt = w->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : w->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
    int64_t lo, hi;
    sp_pool_split(w->rows, tid, nth, &lo, &hi);
    if (lo == hi) return;
    for (int64_t t = 0; t < j->n; t++)
        for (int64_t o = lo; o < hi; o++) j->y[t * j->ldy + o] = 0.0f;
    for (int64_t i = 0; i < w->cols; i++) {
        for (int64_t o = lo; o < hi; o++) buf[o - lo] = sp_dtype_load_float(dt, w->codes, (size_t)(i * w->rows + o));
        for (int64_t t = 0; t < j->n; t++) {
            float xv = j->x[t * j->ldx + i];
            float *yt = j->y + t * j->ldy;
            for (int64_t o = lo; o < hi; o++) yt[o] += xv * buf[o - lo];
        }
    }
    for (int64_t t = 0; t < j->n; t++)
        for (int64_t o = lo; o < hi; o++) j->y[t * j->ldy + o] += bias_at(j->l, o);
}

void sp_linear_apply(const struct sp_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                     struct sp_pool *pool) {
    struct job j = {l, x, ldx, y, ldy, n, pool};
    /* Below ~64K multiply-adds a hand-off to other threads costs more than it saves. */
    int nth = (double)l->w.rows * (double)l->w.cols * (double)n < 65536.0 ? 1 : sp_pool_size(pool);
    sp_pool_run_n(pool, l->transposed ? cols_job : rows_job, &j, nth);
}
