/*
 * pool.h - a fixed set of worker threads that run one function on every
 * thread at once and return when all are done (a fork-join barrier). Built
 * for the forward pass: many short parallel steps, so idle workers spin
 * briefly before sleeping.
 *
 *     struct sp_pool *p;
 *     sp_pool_create(2, &p);
 *     sp_pool_run(p, work, &args);   // work(&args, tid, nth) on each thread
 *     sp_pool_free(p);
 *
 * The calling thread takes part as tid 0. Each thread also owns a scratch
 * buffer reserved up front (sp_pool_reserve), so kernels allocate nothing.
 */
#ifndef SP_CORE_POOL_H
#define SP_CORE_POOL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct sp_pool;

typedef void (*sp_pool_fn)(void *ctx, int tid, int nth);

/* n_threads <= 0 picks the number of physical cores. */
enum sp_status sp_pool_create(int n_threads, struct sp_pool **out);
void sp_pool_free(struct sp_pool *p);
int sp_pool_size(const struct sp_pool *p);
void sp_pool_run(struct sp_pool *p, sp_pool_fn fn, void *ctx);
/* The same with a hint: nth < the pool size runs fn on the caller alone
 * (work too small to pay for waking the workers). */
void sp_pool_run_n(struct sp_pool *p, sp_pool_fn fn, void *ctx, int nth);
/* Grows every thread's scratch buffer to at least `bytes` (64-byte aligned). */
enum sp_status sp_pool_reserve(struct sp_pool *p, size_t bytes);
/* Thread tid's scratch buffer (valid until the next sp_pool_reserve). */
void *sp_pool_scratch(struct sp_pool *p, int tid);
/* Splits [0, n) into nth near-equal ranges; range tid is [*lo, *hi). */
void sp_pool_split(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi);
/* Work taken in chunks by whichever thread is free, for steps where a
 * static split would leave one thread waiting on a slower one: every
 * thread calls sp_pool_take until it returns false. Zero the counter
 * (one per run) before handing the job to the pool.
 *
 *     while (sp_pool_take(&job->next, n, chunk, &lo, &hi)) work(lo, hi);
 */
bool sp_pool_take(atomic_llong *next, int64_t n, int64_t chunk, int64_t *lo, int64_t *hi);
/* The same over a line of segments (segment i ends at ends[i], ends[n - 1]
 * the line's length; empty segments allowed) for nth threads, where a
 * piece that starts inside a segment costs extra (it rounds the segment's
 * inputs again, say): guided pieces, a share of what is left (large ones
 * first, small ones to even out the end), each ended at the start of the
 * segment it would cut into; a segment larger than that share goes in
 * pieces of at least 1/nth of it, so it is cut no more often than an even
 * split would cut it. Every piece is non-empty; together they cover the
 * line once, in order. */
bool sp_pool_take_guided(atomic_llong *next, const int64_t *ends, int64_t n, int nth, int64_t *lo, int64_t *hi);
/* Physical cores of this machine (falls back to online CPUs). */
int sp_physical_cores(void);

#endif
