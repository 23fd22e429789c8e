/*
 * linear.h - CPU kernels of the forward pass: linear layers on weights in
 * any format of the traits table (computed on the packed form, one row at a
 * time, never dequantizing a whole matrix), RMSNorm, and small vector ops.
 *
 *     // y[t] = W x[t] + b for t < n; rows of x are ldx floats apart
 *     sp_linear_apply(&lin, x, ldx, y, ldy, n, pool);
 *
 * Threads split the output rows; each weight row is read once per call
 * whatever n is, so a batch of tokens shares the weight reads. The pool's
 * scratch must hold sp_linear_scratch_bytes(lin) per thread.
 */
#ifndef SP_KERNELS_CPU_LINEAR_H
#define SP_KERNELS_CPU_LINEAR_H

#include <stddef.h>
#include <stdint.h>

#include "core/pool.h"
#include "model/model.h"

size_t sp_linear_scratch_bytes(const struct sp_linear *l);
void sp_linear_apply(const struct sp_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                     struct sp_pool *pool);

/* Dot product of n floats, and y += a * x over n floats, with the
 * dispatched kernel set (kernels.h). */
float sp_dot_f32(const float *a, const float *b, int64_t n);
void sp_axpy_f32(float *y, float a, const float *x, int64_t n);
/* The same with b / x stored as dtype dt (F32, F16 or BF16), e.g. a row of
 * the KV cache, converted on the fly. */
float sp_dot_f32_dt(const float *a, const void *b, enum sp_dtype dt, int64_t n);
void sp_axpy_f32_dt(float *y, float a, const void *x, enum sp_dtype dt, int64_t n);
/* out = x / rms(x) * w over n floats (w NULL: no weight). */
void sp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);
/* Converts a 1-D parameter to floats. */
void sp_vector_to_f32(const struct sp_vector *v, float *out);

#endif
