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
#include "backend/backend.h"

size_t sp_linear_scratch_bytes(const struct sp_linear *l);
void sp_linear_apply(const struct sp_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                     struct sp_pool *pool);
/* Outputs [lo, hi) of the same for n tokens, on the calling thread: for
 * callers that split several linears over the pool's threads themselves.
 * scratch: sp_linear_scratch_bytes(l) bytes (a pool thread's scratch). */
void sp_linear_rows(const struct sp_linear *l, int64_t lo, int64_t hi, const float *x, int64_t ldx, float *y,
                    int64_t ldy, int64_t n, void *scratch);
/* sp_linear_rows of two linears with the same x and outputs [lo, hi) of
 * each (an MLP's gate and up; the same results): the kernels round x once
 * for both where they can. scratch as for either (their shapes match). */
void sp_linear_rows_pair(const struct sp_linear *la, const struct sp_linear *lb, int64_t lo, int64_t hi,
                         const float *x, int64_t ldx, float *ya, float *yb, int64_t ldy, int64_t n, void *scratch);
/* Below this many multiply-adds a hand-off to other threads costs more than it saves. */
#define SP_LINEAR_SERIAL_MACS 65536.0
/* Up to this many tokens the threads take rows in chunks as they come
 * (up to SP_LINEAR_CHUNKS per thread), so a thread held up by the machine
 * does not keep the others waiting; with more tokens each call quantizes
 * all of them once per chunk, and an even split costs less. A chunk holds
 * SP_LINEAR_CHUNK_MIN_BYTES of weights or more: each one rounds the
 * activations again and starts a new run of rows, which fewer bytes do not
 * repay (on a Zen 3, 2 threads, one token: a 0.9 MB 768 x 2048 affine4
 * matrix from cache in 26 us split evenly, 38 us in 16 chunks). */
#define SP_LINEAR_CHUNK_MAX_TOKENS 4
#define SP_LINEAR_CHUNKS 8
#define SP_LINEAR_CHUNK_MIN_BYTES (512.0 * 1024.0)
/* The chunk for `units` rows of unit_bytes weight bytes each and n tokens
 * on nth threads (a multiple of 8 rows), or 0 for an even split. */
int64_t sp_linear_chunk(int64_t units, double unit_bytes, int64_t n, int nth);

/* y += a * x over n floats, with the dispatched kernel set (kernels.h). */
void sp_axpy_f32(float *y, float a, const float *x, int64_t n);
/* y = x as floats over n values of dtype dt (exact). */
void sp_f32_from_dt(float *y, const void *x, enum sp_dtype dt, int64_t n);
/* The kernel set's dot_cols and axpy_rows (kernels.h): attention's blocks
 * of cached rows against several query heads. */
void sp_dot_cols(float *out, int64_t ldo, const float *a, int64_t lda, int64_t na, const float *cols, int64_t ldc,
                 int64_t nr, int64_t n, float scale);
void sp_axpy_rows(float *y, int64_t ldy, const float *w, int64_t ldw, int64_t na, const float *rows, int64_t nr,
                  int64_t n);
/* out = x / rms(x) * w over n floats (w NULL: no weight). */
void sp_rmsnorm(float *out, const float *x, const float *w, int64_t n, float eps);

#endif
