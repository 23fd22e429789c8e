/*
 * membw.h - the read bandwidth of this machine's RAM, the bound a decoded
 * token's weight reads are measured against (DESIGN.md §7).
 *
 *     struct sp_membw bw;
 *     if (sp_membw_measure(pool, 2, (size_t)1 << 30, &bw) == SP_OK) printf("%.1f GB/s\n", bw.gbs);
 *
 * A buffer of `bytes` (1 GiB for a calibration; well above the last-level
 * cache in any case) is read by nth threads of the pool, 10 passes alternating
 * eight independent integer sums (any CPU) and the dispatched kernel set's
 * SIMD dot (the widest loads); the best pass counts. gbs is by wall time;
 * gbs_cpu by the busiest thread's CPU time, which on a machine shared with
 * other work is close to what an idle machine would show.
 */
#ifndef SP_KERNELS_CPU_MEMBW_H
#define SP_KERNELS_CPU_MEMBW_H

#include "core/pool.h"
#include "core/status.h"

struct sp_membw {
    int threads;
    double gbs, gbs_cpu;
};

enum sp_status sp_membw_measure(struct sp_pool *pool, int nth, size_t bytes, struct sp_membw *out);

#endif
