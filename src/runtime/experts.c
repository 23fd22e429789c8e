/* experts.c - the expert cache (ARC, LRU or clock replacement) over the
 * model files, read through a storage implementation (storage.h). */
#include "runtime/experts.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "runtime/storage.h"

const double sp_expert_lat_bounds_ms[SP_EXPERT_LAT_BUCKETS - 1] = {0.1, 0.5, 1, 5, 10, 50, 100};

#define CLOCK_MAX 3

struct slot {
    int64_t key;  // L * n_experts + e, or -1
    int64_t layer;
    uint64_t last_use;
    int pins;
    bool loading;     // a read into mem is under way (never a victim)
    uint8_t count;    // clock policy: hits remembered (0..CLOCK_MAX)
    bool prefetched;  // read ahead and not used yet
    bool t2;          // arc policy: used at least twice since it came in (else in T1)
    uint8_t *mem;
};

/* How one thread reads experts: its storage reader, and room for a block
 * of rows to interleave (interleave_unit). */
struct reader_io {
    struct sp_storage_reader *rd;
    uint8_t *block;
    size_t block_bytes;
};

/* Demand reads at once at most (threads that get experts together: ranks
 * in threads over one store), each with a reader of its own. */
#define DEMAND_READERS 64

/* A read the prefetch thread owes: which slot, and where the bytes are. */
struct job {
    int64_t slot;
    struct sp_expert_views mapped;
};

struct sp_expert_store {
    const struct sp_model *m;
    int64_t n_experts, n_layers;
    size_t budget, slot_bytes;
    struct slot *slots;  // (n_slots)
    int64_t n_slots;
    int32_t *where;  // (n_layers * n_experts): slot index or -1
    uint8_t *arena;  // the slots' memory, from slot_alloc
    void (*arena_free)(void *p);
    uint64_t tick;
    enum sp_expert_policy policy;
    int64_t hand;       // clock: where the sweep resumes
    int64_t arc_p;      // arc: the target number of slots in T1
    uint64_t out[2];    // arc: evictions from T1, from T2 so far
    uint64_t *gone;     // arc: (n_layers * n_experts) out[k] << 1 | k when last evicted from T(k+1), else 0
    struct sp_expert_store_stats st;
    /* prefetch: one reader thread fed by a ring of jobs; mu guards every
     * field of the store that both threads touch */
    bool prefetch;
    sp_interleave_fn interleave;  // the backend's choice of matrices the slots hold interleaved (NULL: none)
    pthread_t reader;
    bool reader_started, stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct job *jobs;  // (n_slots) ring
    int64_t j_head, j_len;
    /* the files, read by the demand reads (the threads that get experts,
     * each through a reader it takes while it reads: the first made with
     * the store, the others when first needed) and the reads ahead (reader
     * thread) */
    struct sp_storage *storage;
    struct reader_io io_demand[DEMAND_READERS], io_ahead;
    bool demand_busy[DEMAND_READERS];
    uint64_t *layer_hits, *layer_misses;  // (n_layers)
};

static const struct sp_linear *view_at(const struct sp_expert_views *v, int i) {
    const struct sp_linear *ls[4] = {&v->gate, &v->up, &v->down, &v->gate_up};
    return ls[i];
}

static bool view_used(const struct sp_expert_views *v, int i) {
    return v->fused ? (i == 2 || i == 3) : i < 3;
}

/* Maps a pointer into the model's mappings to (fd, file offset). */
static bool file_of(const struct sp_model *m, const void *p, int *shard, uint64_t *off) {
    for (int i = 0; i < m->files->n_shards; i++) {
        const struct sp_map *mp = &m->files->shards[i]->map;
        const uint8_t *b = mp->data;
        if (b && (const uint8_t *)p >= b && (const uint8_t *)p < b + mp->size) {
            *shard = i;
            *off = (uint64_t)((const uint8_t *)p - b);
            return true;
        }
    }
    return false;
}

/* Where a slot's parts start: at multiples of this. */
#define UNIT_ALIGN 64

static enum sp_status mapped_views(const struct sp_model *m, int64_t L, int64_t e, struct sp_expert_views *v) {
    memset(v, 0, sizeof *v);
    v->fused = m->fused_gate_up;
    enum sp_status st;
    if (v->fused) {
        if ((st = sp_model_linear(m, L, SP_ROLE_EXP_GATE_UP, e, &v->gate_up)) != SP_OK) return st;
    } else {
        if ((st = sp_model_linear(m, L, SP_ROLE_EXP_GATE, e, &v->gate)) != SP_OK) return st;
        if ((st = sp_model_linear(m, L, SP_ROLE_EXP_UP, e, &v->up)) != SP_OK) return st;
    }
    return sp_model_linear(m, L, SP_ROLE_EXP_DOWN, e, &v->down);
}

static void *reader_main(void *arg);

size_t sp_expert_store_min_budget(const struct sp_model *m) {
    size_t best = 0;
    for (int64_t L = 0; L < m->arch.n_layers; L++) {
        if (!m->arch.layer_moe[L]) continue;
        struct sp_expert_views v;
        if (mapped_views(m, L, 0, &v) != SP_OK) continue;
        size_t b = sp_expert_views_span(&v, UNIT_ALIGN);
        if (b > best) best = b;
    }
    return best;
}

void sp_expert_store_free(struct sp_expert_store *s) {
    if (!s) return;
    if (s->reader_started) {
        pthread_mutex_lock(&s->mu);
        s->stop = true;
        pthread_cond_broadcast(&s->cv);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->reader, NULL);
    }
    pthread_mutex_destroy(&s->mu);
    pthread_cond_destroy(&s->cv);
    for (int i = 0; i < DEMAND_READERS; i++) {
        sp_storage_reader_close(s->io_demand[i].rd);
        sp_free(s->io_demand[i].block);
    }
    sp_storage_reader_close(s->io_ahead.rd);
    sp_storage_close(s->storage);
    sp_free(s->io_ahead.block);
    sp_free(s->jobs);
    if (s->arena) s->arena_free(s->arena);
    sp_free(s->slots);
    sp_free(s->where);
    sp_free(s->layer_hits);
    sp_free(s->layer_misses);
    sp_free(s->gone);
    sp_free(s);
}

enum sp_status sp_expert_store_create(const struct sp_model *m, size_t budget,
                                      const struct sp_expert_store_params *params, struct sp_expert_store **out) {
    *out = NULL;
    const struct sp_expert_store_params defaults = {0}, *p = params ? params : &defaults;
    if ((unsigned)p->policy >= SP_EXPERT_POLICY_COUNT || (unsigned)p->io >= SP_IO_COUNT)
        return sp_errorf(SP_ERR_ARG, "unknown expert cache policy or read method");
    size_t unit = sp_expert_store_min_budget(m);
    if (!unit) return sp_errorf(SP_ERR_ARG, "an expert cache needs a model with routed experts");
    if (budget < unit)
        return sp_errorf(SP_ERR_ARG, "expert cache of %zu bytes holds no expert: the minimum is %zu bytes (one expert of "
                         "the largest MoE layer)", budget, unit);
    struct sp_expert_store *s = sp_calloc(1, sizeof *s, SP_MEM_MODEL);
    if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->cv, NULL);
    s->m = m;
    s->interleave = p->interleave;
    s->n_experts = m->arch.n_experts;
    s->n_layers = m->arch.n_layers;
    s->slot_bytes = unit;
    s->n_slots = (int64_t)(budget / unit);
    int64_t all = s->n_experts * s->n_layers;
    if (s->n_slots > all) s->n_slots = all;
    s->budget = (size_t)s->n_slots * unit;
    s->slots = sp_calloc((size_t)s->n_slots, sizeof *s->slots, SP_MEM_MODEL);
    s->where = sp_malloc((size_t)all * sizeof *s->where, SP_MEM_MODEL);
    s->layer_hits = sp_calloc((size_t)s->n_layers, sizeof *s->layer_hits, SP_MEM_MODEL);
    s->layer_misses = sp_calloc((size_t)s->n_layers, sizeof *s->layer_misses, SP_MEM_MODEL);
    s->arena_free = p->slot_alloc && p->slot_free ? p->slot_free : sp_free_aligned;
    s->arena = p->slot_alloc && p->slot_free ? p->slot_alloc(s->budget, SP_MEM_EXPERT_CACHE)
                                             : sp_malloc_huge(s->budget, SP_MEM_EXPERT_CACHE);
    s->gone = sp_calloc((size_t)all, sizeof *s->gone, SP_MEM_MODEL);
    /* ARC by default. Measured on Ling-shaped bailing_moe models (8 layers,
     * 64 experts, top-8), 2 threads, prefetch on, hit rate and MiB read:
     * skewed routing (affine4, 40 MiB cache, prompt 32, gen 96) ARC 94.2%
     * 719, LRU 90.5% 851, clock 91.4% 743; uniform routing (bf16, 115 MiB,
     * prompt 64, gen 32) ARC 87.4% 1785, LRU 86.2% 1833, clock 79.4% 2205.
     * Prefetch off: skewed ARC 88.7% 266, LRU 88.2% 276, clock 88.3% 274;
     * uniform ARC 69.9% 909, LRU 62.8% 1124, clock 68.3% 956. Skewed at 80
     * MiB: ARC 98.3% 198, LRU 98.3% 205, clock 98.5% 195; uniform at 60 MiB:
     * ARC 68.4% 3644, LRU and clock 68.0% 3864. */
    s->policy = s->st.policy = p->policy;
    if (!s->slots || !s->where || !s->arena || !s->layer_hits || !s->layer_misses || !s->gone) {
        sp_expert_store_free(s);
        return sp_errorf(SP_ERR_NOMEM, "out of memory for a %zu-byte expert cache", budget);
    }
    for (int64_t i = 0; i < all; i++) s->where[i] = -1;
    for (int64_t i = 0; i < s->n_slots; i++) {
        s->slots[i].key = -1;
        s->slots[i].mem = s->arena + (size_t)i * unit;
    }
    s->st.budget = s->budget;
    s->st.slot_bytes = unit;
    s->st.slots = s->n_slots;
    enum sp_status st = sp_storage_open(m->files, p->io, unit, &s->storage);
    if (st == SP_OK) st = sp_storage_reader_open(s->storage, &s->io_demand[0].rd);
    if (st == SP_OK) st = sp_storage_reader_open(s->storage, &s->io_ahead.rd);
    if (st != SP_OK) {
        sp_expert_store_free(s);
        return st;
    }
    s->st.io_uring = sp_storage_uring(s->storage);
    s->st.direct_io = sp_storage_direct(s->storage);
    s->prefetch = s->n_slots >= 2 && !p->no_prefetch;
    if (s->prefetch) {
        s->jobs = sp_malloc((size_t)s->n_slots * sizeof *s->jobs, SP_MEM_MODEL);
        if (!s->jobs || pthread_create(&s->reader, NULL, reader_main, s) != 0) {
            sp_expert_store_free(s);
            return sp_errorf(SP_ERR_NOMEM, "cannot start the expert prefetch thread");
        }
        s->reader_started = true;
    }
    *out = s;
    return SP_OK;
}

/* Whether the slots hold view i of `mapped` interleaved (the choice of the
 * set the store was made with, so that it cannot change under them) */
static bool slot_interleaved(const struct sp_expert_store *s, const struct sp_expert_views *mapped, int i) {
    const struct sp_linear *l = view_at(mapped, i);
    return s->interleave && !l->transposed && s->interleave(&l->w);
}

/* Copies `mapped` with every pointer moved into slot memory at the offsets
 * the parts were read to, the matrices interleaved where the slots hold
 * them so. */
static void rebase(const struct sp_expert_store *s, const struct sp_expert_views *mapped, uint8_t *mem,
                   struct sp_expert_views *out) {
    *out = *mapped;
    sp_expert_views_move(out, mem, UNIT_ALIGN, NULL, NULL);
    for (int i = 0; i < 4; i++)
        if (view_used(mapped, i) && slot_interleaved(s, mapped, i))
            ((struct sp_linear *)view_at(out, i))->w.interleaved = true;
}

/* The matrices of an expert just read into mem (row order, as in the
 * files) interleaved where the slots hold them so; io->block grows to a
 * block's bytes. */
static enum sp_status interleave_unit(const struct sp_expert_store *s, struct reader_io *io,
                                      const struct sp_expert_views *mapped, uint8_t *mem) {
    struct sp_expert_views v;
    rebase(s, mapped, mem, &v);
    for (int i = 0; i < 4; i++) {
        if (!view_used(mapped, i)) continue;
        struct sp_qmat w = view_at(&v, i)->w, done;
        /* rebase marked those the slots hold interleaved; the bytes just read are in row order */
        if (!w.interleaved) continue;
        w.interleaved = false;
        size_t need = sp_qmat_block_bytes(&w);
        if (need > io->block_bytes) {
            uint8_t *b = sp_malloc(need, SP_MEM_EXPERT_CACHE);
            if (!b) return sp_errorf(SP_ERR_NOMEM, "out of memory for a block of an expert's rows");
            sp_free(io->block);
            io->block = b;
            io->block_bytes = need;
        }
        sp_qmat_interleave_in_place(&w, io->block, &done);
    }
    return SP_OK;
}

/* The file ranges of one expert, each landing in mem at 64-byte aligned
 * offsets in the order rebase expects. */
static int unit_parts(const struct sp_model *m, const struct sp_expert_views *mapped, uint8_t *mem,
                      struct sp_storage_part *parts, enum sp_status *st) {
    const void *ptr[SP_EXPERT_MAX_PARTS];
    size_t len[SP_EXPERT_MAX_PARTS], off = 0;
    int np = sp_expert_views_parts(mapped, ptr, len);
    *st = SP_OK;
    SP_ASSERT(np <= SP_STORAGE_MAX_PARTS);
    for (int k = 0; k < np; k++) {
        if (!file_of(m, ptr[k], &parts[k].shard, &parts[k].off)) {
            *st = sp_errorf(SP_ERR_UNSUPPORTED,
                            "expert tensor bytes are outside the model's files (a GGUF's quantized experts are "
                            "repacked into memory when it opens, and are not streamed from disk: load it "
                            "without an expert cache)");
            return 0;
        }
        parts[k].len = len[k];
        parts[k].dst = mem + off;
        off += (len[k] + UNIT_ALIGN - 1) / UNIT_ALIGN * UNIT_ALIGN;
    }
    return np;
}

/* Reads one expert into mem (no lock needed: the slot is reserved); adds
 * to *reads and *bytes. */
static enum sp_status read_unit(const struct sp_model *m, const struct reader_io *io,
                                const struct sp_expert_views *mapped, uint8_t *mem, uint64_t *reads, uint64_t *bytes) {
    struct sp_storage_part parts[SP_STORAGE_MAX_PARTS];
    enum sp_status st;
    int np = unit_parts(m, mapped, mem, parts, &st);
    if (st == SP_OK) st = sp_storage_read(io->rd, parts, np, bytes);
    if (st == SP_OK) *reads += (uint64_t)np;
    return st;
}

static void record_read(struct sp_expert_store *s, double dt, uint64_t reads, uint64_t bytes) {
    s->st.read_s += dt;
    s->st.reads += reads;
    s->st.bytes_read += bytes;
    int b = 0;
    while (b < SP_EXPERT_LAT_BUCKETS - 1 && dt * 1000.0 > sp_expert_lat_bounds_ms[b]) b++;
    s->st.lat_bucket[b]++;
}

/* Empties a slot (under mu). */
static void evict(struct sp_expert_store *s, struct slot *sl) {
    if (sl->key < 0) return;
    if (s->policy == SP_EXPERT_POLICY_ARC && !sl->prefetched) {
        /* remember the key in ghost list B1 or B2 (a read ahead never used was no access) */
        s->out[sl->t2]++;
        s->gone[sl->key] = s->out[sl->t2] << 1 | sl->t2;
    }
    s->where[sl->key] = -1;
    s->st.evictions++;
    s->st.cached--;
    if (sl->prefetched) s->st.prefetch_waste++;
    sl->prefetched = false;
    sl->key = -1;
}

/* The prefetch thread: reads queued experts into their reserved slots. */
static void *reader_main(void *arg) {
    struct sp_expert_store *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        while (!s->j_len && !s->stop) pthread_cond_wait(&s->cv, &s->mu);
        if (s->stop) break;
        struct job j = s->jobs[s->j_head];
        s->j_head = (s->j_head + 1) % s->n_slots;
        s->j_len--;
        pthread_mutex_unlock(&s->mu);
        uint64_t reads = 0, bytes = 0;
        double t0 = sp_now_s();
        enum sp_status st = read_unit(s->m, &s->io_ahead, &j.mapped, s->slots[j.slot].mem, &reads, &bytes);
        if (st == SP_OK) st = interleave_unit(s, &s->io_ahead, &j.mapped, s->slots[j.slot].mem);
        double dt = sp_now_s() - t0;
        pthread_mutex_lock(&s->mu);
        struct slot *sl = &s->slots[j.slot];
        sl->loading = false;
        if (st == SP_OK) {
            record_read(s, dt, reads, bytes);
        } else {
            sl->prefetched = false;  // a failed read ahead: forget it, the owner reads again
            evict(s, sl);
            s->st.evictions--;
        }
        pthread_cond_broadcast(&s->cv);
    }
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ARC, on a first use (a miss, or the first use of a read ahead): whether the
 * key is a ghost, evicted from T1 (B1) or T2 (B2) within the last n_slots
 * evictions from that list. A ghost moves the target size of T1 towards the
 * list it was evicted from, by the ratio of the ghost lists' sizes, and comes
 * back into T2. */
static bool arc_seen(struct sp_expert_store *s, int64_t key) {
    uint64_t g = s->gone[key];
    int k = (int)(g & 1);
    s->gone[key] = 0;
    if (!g || s->out[k] - (g >> 1) >= (uint64_t)s->n_slots) return false;
    int64_t b1 = s->out[0] < (uint64_t)s->n_slots ? (int64_t)s->out[0] : s->n_slots;
    int64_t b2 = s->out[1] < (uint64_t)s->n_slots ? (int64_t)s->out[1] : s->n_slots;
    if (k == 0) {
        int64_t step = b1 && b2 > b1 ? b2 / b1 : 1;
        s->arc_p = s->arc_p + step < s->n_slots ? s->arc_p + step : s->n_slots;
    } else {
        int64_t step = b2 && b1 > b2 ? b1 / b2 : 1;
        s->arc_p = s->arc_p > step ? s->arc_p - step : 0;
    }
    return true;
}

/* The slot to reuse for an expert of layer L: a free one, else by the
 * policy, never one pinned or being read into. ARC and clock take a read
 * ahead for layer L (the layer being computed) only as a last resort. */
static int64_t choose_victim(struct sp_expert_store *s, int64_t L) {
    int64_t victim = -1;
    for (int64_t i = 0; i < s->n_slots && victim < 0; i++)
        if (s->slots[i].key < 0) victim = i;
    if (victim >= 0) return victim;
    if (s->policy == SP_EXPERT_POLICY_ARC) {
        /* the least recently used slot of T1 while T1 holds more than its
         * target, else of T2 (either where the other has none) */
        int64_t n1 = 0;
        for (int64_t i = 0; i < s->n_slots; i++) n1 += !s->slots[i].t2;
        for (int pass = 0; pass < 2; pass++) {
            int64_t lru[2] = {-1, -1};
            for (int64_t i = 0; i < s->n_slots; i++) {
                const struct slot *sl = &s->slots[i];
                if (sl->pins || sl->loading) continue;
                /* read ahead for the layer being computed: taken only as a last resort */
                if (pass == 0 && sl->prefetched && sl->layer == L) continue;
                if (lru[sl->t2] < 0 || sl->last_use < s->slots[lru[sl->t2]].last_use) lru[sl->t2] = i;
            }
            if (lru[0] >= 0 && (n1 > s->arc_p || lru[1] < 0)) return lru[0];
            if (lru[1] >= 0) return lru[1];
        }
        return -1;
    }
    if (s->policy == SP_EXPERT_POLICY_CLOCK) {
        /* sweep: a slot used since the hand last passed loses one count and
         * stays; the first slot at zero goes (two full turns at most) */
        for (int64_t step = 0; step < (CLOCK_MAX + 2) * s->n_slots; step++) {
            struct slot *sl = &s->slots[s->hand];
            int64_t i = s->hand;
            s->hand = (s->hand + 1) % s->n_slots;
            if (sl->pins || sl->loading) continue;
            if (sl->prefetched && sl->layer == L) continue;
            if (sl->count > 0) {
                sl->count--;
                continue;
            }
            return i;
        }
        /* nothing reached zero: fall through to LRU among what may go */
    }
    for (int64_t i = 0; i < s->n_slots; i++) {
        if (s->slots[i].pins || s->slots[i].loading) continue;
        if (victim < 0 || s->slots[i].last_use < s->slots[victim].last_use) victim = i;
    }
    return victim;
}

/* *r: a demand reader no thread is reading with, taken (under mu), or -1
 * where every one is busy. */
static enum sp_status take_reader(struct sp_expert_store *s, int *r) {
    *r = -1;
    for (int i = 0; i < DEMAND_READERS; i++) {
        if (s->demand_busy[i]) continue;
        enum sp_status st = s->io_demand[i].rd ? SP_OK : sp_storage_reader_open(s->storage, &s->io_demand[i].rd);
        if (st != SP_OK) return st;
        s->demand_busy[i] = true;
        *r = i;
        break;
    }
    return SP_OK;
}

enum sp_status sp_expert_store_get(struct sp_expert_store *s, const struct sp_expert_views *mapped, int64_t L,
                                   int64_t e, struct sp_expert_views *out) {
    int64_t key = L * s->n_experts + e;
    pthread_mutex_lock(&s->mu);
    int32_t w;
    int r = -1;  // a miss's reader
    for (;;) {
        w = s->where[key];
        if (w >= 0) {
            /* a read ahead, or another thread's read, still under way counts as a hit once it lands */
            while (s->slots[w].loading) pthread_cond_wait(&s->cv, &s->mu);
            w = s->where[key];
        }
        if (w >= 0) break;
        enum sp_status st = take_reader(s, &r);
        if (st != SP_OK) {
            pthread_mutex_unlock(&s->mu);
            return st;
        }
        if (r >= 0) break;
        pthread_cond_wait(&s->cv, &s->mu);  // every reader busy: wait for a read to end
    }
    if (w >= 0) {
        s->st.hits++;
        s->layer_hits[L]++;
        if (s->slots[w].count < CLOCK_MAX) s->slots[w].count++;
        if (s->slots[w].prefetched) {
            s->slots[w].prefetched = false;
            s->st.prefetch_hits++;
            s->slots[w].t2 = s->policy == SP_EXPERT_POLICY_ARC && arc_seen(s, key);
        } else {
            s->slots[w].t2 = true;
        }
    } else {
        bool again = s->policy == SP_EXPERT_POLICY_ARC && arc_seen(s, key);
        int64_t victim = choose_victim(s, L);
        while (victim < 0) {
            /* every slot is being read into or computed with: wait for a read to land */
            bool loading = false;
            for (int64_t i = 0; i < s->n_slots; i++) loading |= s->slots[i].loading;
            if (!loading) break;
            pthread_cond_wait(&s->cv, &s->mu);
            victim = choose_victim(s, L);
        }
        if (victim < 0) {
            s->demand_busy[r] = false;
            pthread_mutex_unlock(&s->mu);
            return sp_errorf(SP_ERR_STATE, "every expert cache slot is in use");
        }
        struct slot *sl = &s->slots[victim];
        evict(s, sl);
        sl->key = key;
        sl->layer = L;
        sl->loading = true;
        sl->count = 0;
        sl->t2 = again;
        s->where[key] = (int32_t)victim;
        s->st.misses++;
        s->st.cached++;
        s->layer_misses[L]++;
        pthread_mutex_unlock(&s->mu);
        uint64_t reads = 0, bytes = 0;
        double t0 = sp_now_s();
        enum sp_status st = read_unit(s->m, &s->io_demand[r], mapped, sl->mem, &reads, &bytes);
        if (st == SP_OK) st = interleave_unit(s, &s->io_demand[r], mapped, sl->mem);
        double dt = sp_now_s() - t0;
        pthread_mutex_lock(&s->mu);
        s->demand_busy[r] = false;
        sl->loading = false;
        pthread_cond_broadcast(&s->cv);
        if (st != SP_OK) {
            evict(s, sl);
            s->st.evictions--;
            pthread_mutex_unlock(&s->mu);
            return st;
        }
        record_read(s, dt, reads, bytes);
        w = (int32_t)victim;
    }
    struct slot *sl = &s->slots[w];
    sl->pins++;
    sl->last_use = ++s->tick;
    pthread_mutex_unlock(&s->mu);
    rebase(s, mapped, sl->mem, out);
    return SP_OK;
}

void sp_expert_store_prefetch(struct sp_expert_store *s, int64_t L, const int64_t *experts,
                              const struct sp_expert_views *mapped, int64_t n) {
    if (!s->prefetch) return;
    pthread_mutex_lock(&s->mu);
    /* at most half the cache in flight, so demand reads always find room */
    for (int64_t i = 0; i < n && s->j_len < s->n_slots / 2; i++) {
        int64_t key = L * s->n_experts + experts[i];
        if (s->where[key] >= 0) {
            /* arc: an expert predicted for the next layer moves to the MRU end of its list */
            if (s->policy == SP_EXPERT_POLICY_ARC) s->slots[s->where[key]].last_use = ++s->tick;
            continue;
        }
        int64_t victim = choose_victim(s, L);
        if (victim < 0) break;
        struct slot *sl = &s->slots[victim];
        evict(s, sl);
        sl->key = key;
        sl->layer = L;
        sl->loading = true;
        sl->prefetched = true;
        sl->count = 0;
        sl->t2 = false;
        sl->last_use = ++s->tick;
        s->where[key] = (int32_t)victim;
        s->st.cached++;
        s->st.prefetch_issued++;
        s->jobs[(s->j_head + s->j_len) % s->n_slots] = (struct job){victim, mapped[i]};
        s->j_len++;
    }
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sp_expert_store_put(struct sp_expert_store *s, int64_t L, int64_t e) {
    pthread_mutex_lock(&s->mu);
    int32_t w = s->where[L * s->n_experts + e];
    if (w >= 0 && s->slots[w].pins > 0) s->slots[w].pins--;
    pthread_cond_broadcast(&s->cv);
    pthread_mutex_unlock(&s->mu);
}

void sp_expert_store_stats(const struct sp_expert_store *s, struct sp_expert_store_stats *out) {
    pthread_mutex_lock((pthread_mutex_t *)&s->mu);
    *out = s->st;
    pthread_mutex_unlock((pthread_mutex_t *)&s->mu);
    out->cached_bytes = (size_t)s->st.cached * s->slot_bytes;
    out->layer_hits = s->layer_hits;
    out->layer_misses = s->layer_misses;
}

static enum sp_status source_get(void *ctx, const struct sp_expert_views *mapped, int64_t L, int64_t e,
                                 struct sp_expert_views *out) {
    return sp_expert_store_get(ctx, mapped, L, e, out);
}
static void source_put(void *ctx, int64_t L, int64_t e) { sp_expert_store_put(ctx, L, e); }
static void source_prefetch(void *ctx, int64_t L, const int64_t *experts, const struct sp_expert_views *mapped,
                            int64_t n) {
    sp_expert_store_prefetch(ctx, L, experts, mapped, n);
}

struct sp_expert_source sp_expert_store_source(struct sp_expert_store *s) {
    /* half the slots held at once, the other half for reads ahead */
    int64_t window = s->n_slots / 2 > 1 ? s->n_slots / 2 : 1;
    return (struct sp_expert_source){s, window, source_get, source_put, s->prefetch ? source_prefetch : NULL};
}

void sp_expert_store_params_for(struct sp_expert_store_params *p, enum sp_device d, bool row_order) {
    const struct sp_backend_ops *ops = sp_backend_ops(d);
    p->interleave = ops && !row_order ? ops->interleave : NULL;
    p->slot_alloc = ops ? ops->host_alloc : NULL;
    p->slot_free = ops ? ops->host_free : NULL;
}
