/* linear.c - linear layers over the thread pool (the row products come
 * from the dispatched kernel set of kernels.h), RMSNorm, small vector ops. */
#include "backend/cpu/linear.h"

#include "backend/cpu/kernels.h"

#include "core/half.h"

#include <math.h>
#include <string.h>

void sp_axpy_f32(float *y, float a, const float *x, int64_t n) { sp_kernels()->axpy(y, a, x, n); }

void sp_f32_from_dt(float *y, const void *x, enum sp_dtype dt, int64_t n) { sp_kernels()->to_f32(y, x, dt, n); }

void sp_dot_cols(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols, int64_t ldc,
                 int64_t nr, int64_t n, float scale) {
    sp_kernels()->dot_cols(out, ldo, a, lda, na, cols, ldc, nr, n, scale);
}

void sp_axpy_rows(float *y, int64_t ldy, const float *w, int64_t ldw, int64_t na, const float *rows, int64_t nr,
                  int64_t n) {
    sp_kernels()->axpy_rows(y, ldy, w, ldw, na, rows, nr, n);
}

/* The sum of squares in 8 independent double sums (the compiler may
 * vectorize them; one chain would wait on each add), kept in variables:
 * as an array they went through memory, one store-to-load wait an add. */
void sp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps) {
    double s0 = 0, s1 = 0, s2 = 0, s3 = 0, s4 = 0, s5 = 0, s6 = 0, s7 = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        s0 += (double)x[i] * x[i];
        s1 += (double)x[i + 1] * x[i + 1];
        s2 += (double)x[i + 2] * x[i + 2];
        s3 += (double)x[i + 3] * x[i + 3];
        s4 += (double)x[i + 4] * x[i + 4];
        s5 += (double)x[i + 5] * x[i + 5];
        s6 += (double)x[i + 6] * x[i + 6];
        s7 += (double)x[i + 7] * x[i + 7];
    }
    double ss = ((s0 + s4) + (s1 + s5)) + ((s2 + s6) + (s3 + s7));
    for (; i < n; i++) ss += (double)x[i] * x[i];
    float scale = (float)(1.0 / sqrt(ss / (double)n + eps));
    /* 8 at a time, all read before any is written (out may be x): the
     * compiler vectorizes the blocks */
    for (i = 0; i + 8 <= n; i += 8) {
        float v[8];
        for (int k = 0; k < 8; k++) v[k] = x[i + k] * scale;
        if (w)
            for (int k = 0; k < 8; k++) v[k] *= w[i + k];
        for (int k = 0; k < 8; k++) out[i + k] = v[k];
    }
    for (; i < n; i++) out[i] = w ? w[i] * (x[i] * scale) : x[i] * scale;
}

size_t sp_linear_scratch_bytes(const struct sp_linear *l) {
    if (l->transposed) return (size_t)l->w.rows * sizeof(float) + 64;
    return sp_kernels_scratch_bytes(&l->w);
}

static float bias_at(const struct sp_linear *l, int64_t r) {
    return l->bias ? sp_dtype_load_float(l->bias_dtype, l->bias, (size_t)r) : 0.0f;
}

/* (out, in) storage: the dispatched kernel reads each row once and
 * multiplies it with every token. */
static void rows_stored(const struct sp_linear *l, int64_t lo, int64_t hi, const float *x, int64_t ldx, float *y,
                        int64_t ldy, int64_t n, void *scratch) {
    const struct sp_kernels *k = sp_kernels();
    (l->float_activations ? k->matmul_rows_float : k->matmul_rows)(&l->w, lo, hi, x, ldx, n, y, ldy, scratch);
}

/* (in, out) storage: outputs [lo, hi) by streaming the input rows. */
static void cols_stored(const struct sp_linear *l, int64_t lo, int64_t hi, const float *x, int64_t ldx, float *y,
                        int64_t ldy, int64_t n, float *buf) {
    const struct sp_qmat *w = &l->w;
    enum sp_dtype dt = w->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : w->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
    for (int64_t t = 0; t < n; t++)
        for (int64_t o = lo; o < hi; o++) y[t * ldy + o] = 0.0f;
    for (int64_t i = 0; i < w->cols; i++) {
        for (int64_t o = lo; o < hi; o++) buf[o - lo] = sp_dtype_load_float(dt, w->codes, (size_t)(i * w->rows + o));
        for (int64_t t = 0; t < n; t++) {
            float xv = x[t * ldx + i];
            float *yt = y + t * ldy;
            for (int64_t o = lo; o < hi; o++) yt[o] += xv * buf[o - lo];
        }
    }
}

void sp_linear_rows(const struct sp_linear *l, int64_t lo, int64_t hi, const float *x, int64_t ldx, float *y,
                    int64_t ldy, int64_t n, void *scratch) {
    if (lo >= hi) return;
    if (l->transposed)
        cols_stored(l, lo, hi, x, ldx, y, ldy, n, scratch);
    else
        rows_stored(l, lo, hi, x, ldx, y, ldy, n, scratch);
    if (!l->bias) return;
    for (int64_t r = lo; r < hi; r++) {
        float b = bias_at(l, r);
        for (int64_t t = 0; t < n; t++) y[t * ldy + r] += b;
    }
}

void sp_linear_rows_pair(const struct sp_linear *la, const struct sp_linear *lb, int64_t lo, int64_t hi,
                         const float *x, int64_t ldx, float *ya, float *yb, int64_t ldy, int64_t n, void *scratch) {
    if (lo >= hi) return;
    if (la->transposed || lb->transposed || la->bias || lb->bias || la->float_activations || lb->float_activations) {
        sp_linear_rows(la, lo, hi, x, ldx, ya, ldy, n, scratch);
        sp_linear_rows(lb, lo, hi, x, ldx, yb, ldy, n, scratch);
        return;
    }
    sp_kernels()->matmul_rows_pair(&la->w, &lb->w, lo, hi, x, ldx, n, ya, yb, ldy, scratch);
}

struct job {
    const struct sp_linear *l;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy;
    int64_t n;
    struct sp_pool *pool;
    int64_t chunk;      // rows taken at a time; 0: an even split
    atomic_llong next;  // the next row to take
};

int64_t sp_linear_chunk(int64_t units, double unit_bytes, int64_t n, int nth) {
    if (n > SP_LINEAR_CHUNK_MAX_TOKENS || nth <= 1) return 0;
    /* whole rounds of nth chunks; one round is the even split */
    int64_t chunks = nth * SP_LINEAR_CHUNKS, fit = (int64_t)((double)units * unit_bytes / SP_LINEAR_CHUNK_MIN_BYTES);
    if (fit < chunks) chunks = fit / nth * nth;
    if (chunks <= nth) return 0;
    int64_t chunk = (units + chunks - 1) / chunks;
    return (chunk + 7) / 8 * 8;  // whole blocks of rows for the kernels
}

/* Threads split the outputs: evenly, or in chunks taken as they come. */
static void linear_job(void *arg, int tid, int nth) {
    struct job *j = arg;
    int64_t lo, hi;
    void *scratch = sp_pool_scratch(j->pool, tid);
    if (!j->chunk) {
        sp_pool_split(j->l->w.rows, tid, nth, &lo, &hi);
        sp_linear_rows(j->l, lo, hi, j->x, j->ldx, j->y, j->ldy, j->n, scratch);
        return;
    }
    while (sp_pool_take(&j->next, j->l->w.rows, j->chunk, &lo, &hi))
        sp_linear_rows(j->l, lo, hi, j->x, j->ldx, j->y, j->ldy, j->n, scratch);
}

void sp_linear_apply(const struct sp_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                     struct sp_pool *pool) {
    int nth = (double)l->w.rows * (double)l->w.cols * (double)n < SP_LINEAR_SERIAL_MACS ? 1 : sp_pool_size(pool);
    int64_t chunk = sp_linear_chunk(l->w.rows, sp_linear_bytes(l) / (double)l->w.rows, n, nth);
    struct job j = {l, x, ldx, y, ldy, n, pool, chunk, 0};
    sp_pool_run_n(pool, linear_job, &j, nth);
}
