/*
 * experts.h - the expert store (DESIGN.md §5): routed experts as a cache of
 * a fixed byte budget over the model files. The forward pass asks for an
 * expert's weight views right before computing it and hands them back right
 * after; a miss reads the expert (all its tensors: codes, scales, biases of
 * gate, up and down) from the files into a cache slot. Eviction follows
 * ARC, keyed by (layer, expert): experts used once since they came in (T1)
 * and those used again (T2) are each kept in recency order, and the target
 * size of T1 adapts to misses on recently evicted experts (or, by
 * params.policy, LRU: least recently used; clock: a generalized clock
 * where each hit adds a count, up to 3, and the sweeping hand takes one
 * away). An expert being computed is never evicted. The views point into
 * the slot and hold exactly the bytes of the files, so every computed token
 * is identical whatever the budget.
 *
 *     struct sp_expert_store *s;
 *     struct sp_expert_store_params ep = {0};          // ARC, io_uring, prefetch on
 *     sp_expert_store_create(model, 512 << 20, &ep, &s);   // a 512 MiB cache
 *     struct sp_expert_views v;
 *     sp_expert_store_get(s, &mapped_views, layer, e, &v);  // valid until put
 *     ... compute with v.gate, v.up, v.down (or v.gate_up) ...
 *     sp_expert_store_put(s, layer, e);
 *
 * One forward pass uses it at a time; a reader thread of its own serves
 * prefetches (the forward pass predicts the next MoE layer's experts and
 * asks for them early). The counters are what /metrics and the benchmarks
 * report.
 */
#ifndef SP_RUNTIME_EXPERTS_H
#define SP_RUNTIME_EXPERTS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"
#include "model/forward.h"
#include "model/model.h"

/* How a store reads and keeps experts; zero is the default of each. */
struct sp_expert_store_params {
    enum sp_expert_policy policy;  // replacement: ARC, LRU or clock
    enum sp_io_method io;          // io_uring with O_DIRECT where the files allow it; buffered; pread
    bool no_prefetch;              // no reader thread reading the next layer's experts ahead
    sp_interleave_fn interleave;   // the backend's layout: matrices the slots hold interleaved (NULL: as the files lay them out)
    /* the slots' memory, the backend's host memory (sp_backend_ops.host_alloc;
     * NULL: the CPU's, 2 MiB pages) */
    void *(*slot_alloc)(size_t bytes, enum sp_mem_class cls);
    void (*slot_free)(void *p);
};

#define SP_EXPERT_LAT_BUCKETS 8

struct sp_expert_store_stats {
    size_t budget, slot_bytes, cached_bytes;
    int64_t slots, cached;
    uint64_t hits, misses, reads, bytes_read, evictions;
    uint64_t prefetch_issued, prefetch_hits, prefetch_waste;  // read ahead; used before eviction; evicted unused
    double read_s;
    bool io_uring;  // reads go through io_uring (else pread)
    bool direct_io; // O_DIRECT reads (no page cache) where the files allow
    enum sp_expert_policy policy;
    uint64_t lat_bucket[SP_EXPERT_LAT_BUCKETS];  // expert read latency: <= 0.1, 0.5, 1, 5, 10, 50, 100 ms, more
    const uint64_t *layer_hits, *layer_misses;   // (n_layers), borrowed from the store
};

extern const double sp_expert_lat_bounds_ms[SP_EXPERT_LAT_BUCKETS - 1];

struct sp_expert_store;

/* Sets p's layout and slot memory to those of the backend on device d
 * (row_order: every matrix as the files lay it out). */
void sp_expert_store_params_for(struct sp_expert_store_params *p, enum sp_device d, bool row_order);

/* The store as the forward pass's expert source (sp_ctx_params.experts),
 * valid as long as s; prefetch set where the store prefetches (a cache of
 * two or more slots, and not params.no_prefetch). */
struct sp_expert_source sp_expert_store_source(struct sp_expert_store *s);

/* A cache of `budget` bytes; a budget smaller than one expert is an error
 * that names the minimum. params: NULL for the defaults. */
enum sp_status sp_expert_store_create(const struct sp_model *m, size_t budget,
                                      const struct sp_expert_store_params *params, struct sp_expert_store **out);
void sp_expert_store_free(struct sp_expert_store *s);
/* Bytes of the largest expert unit (the smallest usable budget). */
size_t sp_expert_store_min_budget(const struct sp_model *m);
/* Views of expert e of layer L, read from the files on a miss; `mapped`
 * are its views into the mapped files (where the bytes come from). */
enum sp_status sp_expert_store_get(struct sp_expert_store *s, const struct sp_expert_views *mapped, int64_t L,
                                   int64_t e, struct sp_expert_views *out);
void sp_expert_store_put(struct sp_expert_store *s, int64_t L, int64_t e);
/* Starts reading experts[0..n) of layer L in the background (those not
 * cached yet; at most half the cache at a time). mapped[i] are their views
 * into the files. A later get waits for a read still under way. */
void sp_expert_store_prefetch(struct sp_expert_store *s, int64_t L, const int64_t *experts,
                              const struct sp_expert_views *mapped, int64_t n);
void sp_expert_store_stats(const struct sp_expert_store *s, struct sp_expert_store_stats *out);

#endif
