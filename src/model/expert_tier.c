/* expert_tier.c - routed experts in a device backend's memory, LRU over
 * the tier below (expert_tier.h). */
#include "model/expert_tier.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/log.h"

/* Parts of an expert start at this alignment in a slot (the products'
 * widest loads). */
#define PART_ALIGN 256

struct tslot {
    int64_t key;        // L * n_experts + e, or -1
    uint64_t last_use;
    uint64_t epoch;     // the epoch of its last put: overwritten without waiting once older than the tier's
    uint64_t copy;      // the number of the copy that filled it
    bool ahead;         // copied in ahead of a lookup (a prediction) and not looked up since
    bool fetched;       // copied in for a lookup of the same window (counted as its miss)
    int pins;
    struct sp_expert_views v;  // into the slot
};

struct sp_expert_tier {
    struct sp_backend *be;
    const struct sp_expert_source *lower;  // NULL: the mapped files
    int64_t n_experts, n_layers;
    struct tslot *slots;
    int64_t n_slots;
    size_t slot_bytes;
    uint8_t *arena;  // the backend's memory
    int32_t *where;  // (n_layers * n_experts): slot or -1
    uint64_t tick;
    /* Copies the tier queued, and how many of them the ops queued since
     * wait for. An epoch ends where the copies queued after it wait for the
     * ops queued before it (ops->copies_after_ops, or a fence). */
    uint64_t copies, joined, epoch;
    int64_t pinned;  // experts handed out and not put yet
    /* experts taken from lower whose copies may still read them: put back at the next fence */
    int64_t *held;   // (n_slots) keys
    int64_t n_held;
    /* prefetch: the experts predicted that this tier lacks, and their views (n_experts each) */
    int64_t *pf_miss;
    struct sp_expert_views *pf_views;
    struct sp_expert_tier_stats st;
};

size_t sp_expert_tier_slot_bytes(const struct sp_model *m) {
    size_t best = 0;
    for (int64_t L = 0; L < m->arch.n_layers; L++) {
        if (!m->arch.layer_moe[L]) continue;
        struct sp_expert_views v = {.fused = m->fused_gate_up};
        bool ok = v.fused ? sp_model_linear(m, L, SP_ROLE_EXP_GATE_UP, 0, &v.gate_up) == SP_OK
                          : sp_model_linear(m, L, SP_ROLE_EXP_GATE, 0, &v.gate) == SP_OK &&
                                sp_model_linear(m, L, SP_ROLE_EXP_UP, 0, &v.up) == SP_OK;
        if (!ok || sp_model_linear(m, L, SP_ROLE_EXP_DOWN, 0, &v.down) != SP_OK) continue;
        size_t b = sp_expert_views_span(&v, PART_ALIGN);
        if (b > best) best = b;
    }
    return best;
}

void sp_expert_tier_free(struct sp_expert_tier *t) {
    if (!t) return;
    sp_free(t->slots);
    sp_free(t->where);
    sp_free(t->held);
    sp_free(t->pf_miss);
    sp_free(t->pf_views);
    sp_free(t);  // the arena is the backend's
}

enum sp_status sp_expert_tier_create(struct sp_backend *be, const struct sp_model *m, size_t budget,
                                     const struct sp_expert_source *lower, struct sp_expert_tier **out) {
    *out = NULL;
    if (!be->ops->arena || !be->ops->upload)
        return sp_errorf(SP_ERR_UNSUPPORTED, "the %s backend keeps no experts of its own", be->ops->name);
    size_t unit = sp_expert_tier_slot_bytes(m);
    if (!unit) return sp_errorf(SP_ERR_ARG, "a tier of experts needs a model with routed experts");
    if (budget < unit)
        return sp_errorf(SP_ERR_ARG, "a device expert cache of %zu bytes holds no expert: the minimum is %zu bytes (one "
                         "expert of the largest MoE layer)", budget, unit);
    struct sp_expert_tier *t = sp_calloc(1, sizeof *t, SP_MEM_MODEL);
    if (!t) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    t->be = be;
    t->lower = lower;
    t->n_experts = m->arch.n_experts;
    t->n_layers = m->arch.n_layers;
    t->slot_bytes = unit;
    int64_t total = t->n_experts * t->n_layers;
    t->n_slots = (int64_t)(budget / unit);
    if (t->n_slots > total) t->n_slots = total;
    t->epoch = 1;
    t->slots = sp_calloc((size_t)t->n_slots, sizeof *t->slots, SP_MEM_MODEL);
    t->where = sp_malloc((size_t)total * sizeof *t->where, SP_MEM_MODEL);
    t->held = sp_malloc((size_t)t->n_slots * sizeof *t->held, SP_MEM_MODEL);
    t->pf_miss = sp_malloc((size_t)t->n_experts * sizeof *t->pf_miss, SP_MEM_MODEL);
    t->pf_views = sp_malloc((size_t)t->n_experts * sizeof *t->pf_views, SP_MEM_MODEL);
    if (!t->slots || !t->where || !t->held || !t->pf_miss || !t->pf_views) {
        sp_expert_tier_free(t);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < total; i++) t->where[i] = -1;
    for (int64_t i = 0; i < t->n_slots; i++) t->slots[i].key = -1;
    enum sp_status st = be->ops->arena(be, (size_t)t->n_slots * unit, (void **)&t->arena);
    if (st != SP_OK) {
        sp_expert_tier_free(t);
        return st;
    }
    t->st.budget = budget;
    t->st.slot_bytes = unit;
    t->st.slots = t->n_slots;
    *out = t;
    return SP_OK;
}

/* Waits for the queued work: every slot's readers are done, and the
 * experts held from the tier below go back to it. */
static void fence(struct sp_expert_tier *t) {
    t->be->ops->sync(t->be);
    for (int64_t i = 0; i < t->n_held; i++)
        t->lower->put(t->lower->ctx, t->held[i] / t->n_experts, t->held[i] % t->n_experts);
    t->n_held = 0;
    t->epoch++;
    t->st.fences++;
}

/* The copies queued after this wait for the ops queued before it (where
 * the backend's copies run beside its ops, else a fence). */
static void new_epoch(struct sp_expert_tier *t) {
    if (!t->be->ops->copies_after_ops) {
        fence(t);
        return;
    }
    t->be->ops->copies_after_ops(t->be);
    t->epoch++;
    t->st.orders++;
}

/* A free slot, else the least recently used one nothing holds or waits to get (-1: none). */
static int64_t choose_victim(const struct sp_expert_tier *t) {
    int64_t victim = -1;
    for (int64_t i = 0; i < t->n_slots; i++) {
        const struct tslot *s = &t->slots[i];
        if (s->key < 0) return i;
        if (s->pins || s->fetched) continue;
        if (victim < 0 || s->last_use < t->slots[victim].last_use) victim = i;
    }
    return victim;
}

static void upload_part(void *ctx, void *dst, const void *src, size_t bytes) {
    struct sp_backend *be = ctx;
    be->ops->upload(be, dst, src, bytes);
}

/* Expert e of layer L copied into the least recently used slot nothing
 * holds: *slot, which nothing reads that was queued before the copy. */
static enum sp_status fill(struct sp_expert_tier *t, const struct sp_expert_views *mapped, int64_t L, int64_t e,
                           int32_t *slot) {
    int64_t key = L * t->n_experts + e, victim = choose_victim(t);
    if (victim < 0) return sp_errorf(SP_ERR_STATE, "every device expert slot is in use");
    struct tslot *s = &t->slots[victim];
    if (s->key >= 0 && s->epoch >= t->epoch) new_epoch(t);  // an op queued before may still read it
    if (t->lower && t->n_held == t->n_slots) fence(t);
    struct sp_expert_views src = *mapped;
    if (t->lower) {
        enum sp_status st = t->lower->get(t->lower->ctx, mapped, L, e, &src);
        if (st != SP_OK) return st;
    }
    if (s->key >= 0) {
        t->where[s->key] = -1;
        t->st.evictions++;
        t->st.cached--;
    }
    s->v = src;
    t->st.bytes_in += sp_expert_views_move(&s->v, t->arena + (size_t)victim * t->slot_bytes, PART_ALIGN, upload_part, t->be);
    if (t->lower) t->held[t->n_held++] = key;
    s->key = key;
    s->copy = ++t->copies;
    s->ahead = s->fetched = false;
    s->last_use = ++t->tick;
    t->where[key] = (int32_t)victim;
    t->st.cached++;
    *slot = (int32_t)victim;
    return SP_OK;
}

static enum sp_status tier_get(void *ctx, const struct sp_expert_views *mapped, int64_t L, int64_t e,
                               struct sp_expert_views *out) {
    struct sp_expert_tier *t = ctx;
    int32_t w = t->where[L * t->n_experts + e];
    if (w >= 0 && t->slots[w].fetched) {
        t->slots[w].fetched = false;  // its miss counted by tier_fetch
    } else if (w >= 0) {
        t->st.hits++;
        if (t->slots[w].ahead) t->st.prefetch_used++;
    } else {
        enum sp_status st = fill(t, mapped, L, e, &w);
        if (st != SP_OK) return st;
        t->st.misses++;
    }
    struct tslot *s = &t->slots[w];
    if (s->copy > t->joined && t->be->ops->ops_after_copies) {  // its copy may still run
        t->be->ops->ops_after_copies(t->be);
        t->joined = t->copies;
    }
    s->ahead = false;
    s->pins++;
    s->last_use = ++t->tick;
    t->pinned++;
    *out = s->v;
    return SP_OK;
}

static void tier_put(void *ctx, int64_t L, int64_t e) {
    struct sp_expert_tier *t = ctx;
    int32_t w = t->where[L * t->n_experts + e];
    if (w < 0 || t->slots[w].pins == 0) return;
    t->slots[w].pins--;
    t->slots[w].epoch = t->epoch;
    if (--t->pinned == 0 && t->n_held > 0) fence(t);
}

/* Over the mapped files, the predicted experts that the tier lacks are
 * copied in now, behind the copies queued before (up to half the slots,
 * so that a prediction does not push out the experts it predicts); over
 * an expert store, the store reads them ahead. */
static void tier_prefetch(void *ctx, int64_t L, const int64_t *experts, const struct sp_expert_views *mapped,
                          int64_t n) {
    struct sp_expert_tier *t = ctx;
    if (!t->lower) {
        /* the experts copied ahead for the layer before that it did not
         * take: evicted first, so that a wrong prediction costs its copy and
         * not an expert that would have been used */
        for (int64_t i = 0; i < t->n_slots; i++)
            if (t->slots[i].ahead && t->slots[i].key / t->n_experts != L) {
                t->slots[i].ahead = false;
                t->slots[i].last_use = 0;
            }
        int64_t room = t->n_slots / 2;
        for (int64_t i = 0; i < n && room > 0; i++) {
            int32_t w;
            if (t->where[L * t->n_experts + experts[i]] >= 0 || fill(t, &mapped[i], L, experts[i], &w) != SP_OK)
                continue;
            t->slots[w].ahead = true;
            t->st.prefetched++;
            room--;
        }
        return;
    }
    int64_t m = 0;
    for (int64_t i = 0; i < n && m < t->n_experts; i++)
        if (t->where[L * t->n_experts + experts[i]] < 0) {
            t->pf_miss[m] = experts[i];
            t->pf_views[m++] = mapped[i];
        }
    if (m) t->lower->prefetch(t->lower->ctx, L, t->pf_miss, t->pf_views, m);
}

struct range {
    uintptr_t lo, hi;
};

static int cmp_range(const void *a, const void *b) {
    uintptr_t x = ((const struct range *)a)->lo, y = ((const struct range *)b)->lo;
    return (x > y) - (x < y);
}

size_t sp_expert_tier_pin(struct sp_expert_tier *t, const struct sp_expert_views *views, int64_t n) {
    struct sp_backend *be = t->be;
    if (!be->ops->pin || n <= 0) return 0;
    struct range *r = sp_malloc((size_t)n * SP_EXPERT_MAX_PARTS * sizeof *r, SP_MEM_MISC);
    if (!r) return 0;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    int64_t m = 0;
    for (int64_t k = 0; k < n; k++) {
        const void *ptr[SP_EXPERT_MAX_PARTS];
        size_t len[SP_EXPERT_MAX_PARTS];
        int np = sp_expert_views_parts(&views[k], ptr, len);
        for (int j = 0; j < np; j++)
            r[m++] = (struct range){(uintptr_t)ptr[j] & ~(page - 1), ((uintptr_t)ptr[j] + len[j] + page - 1) & ~(page - 1)};
    }
    qsort(r, (size_t)m, sizeof *r, cmp_range);
    int64_t w = 0;
    for (int64_t k = 0; k < m; k++) {
        if (w > 0 && r[k].lo <= r[w - 1].hi) {
            if (r[k].hi > r[w - 1].hi) r[w - 1].hi = r[k].hi;
        } else {
            r[w++] = r[k];
        }
    }
    size_t pinned = 0;
    for (int64_t k = 0; k < w; k++) {
        if (be->ops->pin(be, (const void *)r[k].lo, r[k].hi - r[k].lo) != SP_OK) {
            sp_log(SP_LOG_WARN, "experts: copies to the device stay from pageable memory (slower): %s", sp_error_msg());
            break;
        }
        pinned += r[k].hi - r[k].lo;
    }
    sp_free(r);
    return pinned;
}

struct sp_expert_source sp_expert_tier_source(struct sp_expert_tier *t) {
    int64_t window = t->n_slots < t->n_experts ? t->n_slots : t->n_experts;
    if (t->lower) {
        int64_t lw = sp_expert_source_held(t->lower);
        if (lw < window) window = lw;
    }
    return (struct sp_expert_source){t, window, tier_get, tier_put,
                                     !t->lower || t->lower->prefetch ? tier_prefetch : NULL};
}

void sp_expert_tier_stats(const struct sp_expert_tier *t, struct sp_expert_tier_stats *out) { *out = t->st; }

bool sp_expert_tier_has(const struct sp_expert_tier *t, int64_t L, int64_t e) { return t->where[L * t->n_experts + e] >= 0; }

enum sp_status sp_expert_tier_fetch(struct sp_expert_tier *t, const struct sp_expert_views *mapped, int64_t L, int64_t e) {
    if (t->where[L * t->n_experts + e] >= 0) return SP_OK;
    int32_t w;
    enum sp_status st = fill(t, mapped, L, e, &w);
    if (st != SP_OK) return st;
    t->slots[w].fetched = true;
    t->st.misses++;
    return SP_OK;
}
