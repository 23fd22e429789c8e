/*
 * expert_tier.h - routed experts in a device backend's memory as a cache
 * over the host's (DESIGN.md §5): the GPU tier of the expert cache, for
 * models whose experts do not all fit on the device. Slots of one expert
 * each live in the backend's arena (ops->arena); a miss takes the expert
 * from the tier below (the host's expert store, or the mapped files) and
 * queues its copy into the least recently used free slot (ops->upload), and
 * the ops queued after the lookup wait for it (ops->ops_after_copies). The
 * views handed out point into the slot and hold exactly the bytes of the
 * files: every token computes the same whatever the budget.
 *
 *     struct sp_expert_tier *t;
 *     sp_expert_tier_create(be, model, 4ull << 30, &host_store_source, &t);  // or NULL: the mapped files
 *     struct sp_expert_source src = sp_expert_tier_source(t);               // what the forward pass takes
 *     ...
 *     sp_expert_tier_free(t);
 *
 * A slot that an op queued before may still read is not overwritten: a
 * victim used since the last epoch begins a new one, whose copies wait for
 * the ops queued before (ops->copies_after_ops; without it, ops->sync: a
 * fence). Over the mapped files, the source's prefetch copies the experts
 * predicted for a later layer in at once, so that their copies run while
 * the device computes; over an expert store, the store reads them ahead.
 * Experts taken from the tier below are handed back to it at the next
 * fence, once their copies are done (its memory may be pinned and read
 * after upload returns); the tier fences when the last expert held is put.
 */
#ifndef SP_MODEL_EXPERT_TIER_H
#define SP_MODEL_EXPERT_TIER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/forward.h"
#include "model/model.h"

struct sp_expert_tier_stats {
    size_t budget, slot_bytes;
    int64_t slots, cached;
    uint64_t hits, misses, evictions;
    uint64_t fences;    // waits for the queued work (to reuse a slot, or hand experts back to the tier below)
    uint64_t orders;    // copies made to wait for the queued ops on the device instead (a slot reused)
    uint64_t prefetched, prefetch_used;  // experts copied in ahead of their lookups, and those looked up then
    uint64_t bytes_in;  // copied from the host into the slots
    uint64_t cpu_experts;  // (expert, step) pairs the CPU computed instead (the forward pass's count)
};

struct sp_expert_tier;

/* Bytes of one slot for m's largest expert (the smallest budget). */
size_t sp_expert_tier_slot_bytes(const struct sp_model *m);
/* A tier of `budget` bytes of be's memory over lower (borrowed; NULL: the
 * mapped files). A backend without arena / upload, or a budget smaller
 * than the experts one token takes from a layer, is an error that says so. */
enum sp_status sp_expert_tier_create(struct sp_backend *be, const struct sp_model *m, size_t budget,
                                     const struct sp_expert_source *lower, struct sp_expert_tier **out);
void sp_expert_tier_free(struct sp_expert_tier *t);
/* The tier as the forward pass's expert source, valid as long as t. */
struct sp_expert_source sp_expert_tier_source(struct sp_expert_tier *t);
void sp_expert_tier_stats(const struct sp_expert_tier *t, struct sp_expert_tier_stats *out);
/* Whether expert e of layer L is in the tier now. */
bool sp_expert_tier_has(const struct sp_expert_tier *t, int64_t L, int64_t e);
/* Where the tier lacks expert e of layer L: its copy queued now (a miss).
 * The ops queued meanwhile do not wait for it, and its
 * slot is not reused before its get, which makes the ops queued after it
 * wait as a miss's would: a window's experts that the tier holds are
 * computed while the others copy in. */
enum sp_status sp_expert_tier_fetch(struct sp_expert_tier *t, const struct sp_expert_views *mapped, int64_t L, int64_t e);
/* Where the tier copies from the mapped files (lower NULL): makes the host
 * memory of views[0..n) fast to copy from (ops->pin: the whole pages they
 * span, merged into ranges), as long as the backend lives. Returns the
 * bytes pinned; a backend without pin, or memory it cannot pin, leaves the
 * copies as they were (slower) and says so once in the log. */
size_t sp_expert_tier_pin(struct sp_expert_tier *t, const struct sp_expert_views *views, int64_t n);

#endif
