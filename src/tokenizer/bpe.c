/* bpe.c - BPE vocabulary, merge table, heap-driven merge loop, word cache. */
#include "tokenizer/bpe.h"

#include <pthread.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"
#include "core/strmap.h"
#include "core/utf8.h"
#include "tokenizer/pretok.h"

#define CACHE_MAX_WORD 256
#define CACHE_SLOTS (1u << 16)  // at most half of them used: 32k words
#define CACHE_KEY_BYTES (1u << 21)
#define CACHE_IDS (1u << 19)

struct merge_slot {
    uint64_t key;  // (left id << 32) | right id; UINT64_MAX when empty
    uint32_t rank;
    int32_t new_id;
};

/* A cached word. Short words (the most) sit in the slot with their ids, so
 * a hit costs one cache line; longer ones spill into the arenas. */
#define INLINE_KEY 16
#define INLINE_IDS 2
struct cache_slot {
    uint32_t tag;  // high hash bits, never 0; 0: empty
    uint16_t key_len, ids_len;
    union {
        char key[INLINE_KEY];  // key_len <= INLINE_KEY
        uint32_t off;          // else: offset in keys
    } k;
    union {
        int32_t ids[INLINE_IDS];  // ids_len <= INLINE_IDS
        uint32_t off;             // else: offset in ids
    } v;
};
_Static_assert(sizeof(struct cache_slot) == 32, "two slots per cache line");

struct word_cache {
    bool inited;  // mu is initialized
    pthread_mutex_t mu;
    struct cache_slot *slots;  // (CACHE_SLOTS)
    uint32_t count;
    char *keys;  // (CACHE_KEY_BYTES)
    uint32_t keys_len;
    int32_t *ids;  // (CACHE_IDS)
    uint32_t ids_len;
};

/* Text -> id table, open addressing at load <= 1/2. A slot carries the
 * text's place in the arena, so a lookup touches the slot and the text only. */
struct vslot {
    uint32_t tag;  // high hash bits
    int32_t id;    // -1: empty
    uint32_t off, len;
};

struct vtab {
    struct vslot *slots;  // (mask + 1)
    size_t mask;
    const char *arena;
};

struct sp_bpe {
    char *text;                   // token texts, back to back
    uint32_t *tok_off, *tok_len;  // (vocab_end) into text; tok_len UINT32_MAX: no token
    int64_t vocab_end;
    struct vtab vocab;
    struct merge_slot *merges;  // (merge_cap) open addressing
    size_t merge_cap;
    /* Merges of two ids below SMALL, looked up directly: the first merges
     * of every word pair two one-byte tokens, which byte-level vocabularies
     * keep among their first ids. (SMALL * SMALL) */
    struct small_merge {
        int32_t rank;  // -1: no merge
        int32_t new_id;
    } *small;
    bool byte_level;
    int32_t byte_id[256];  // byte mode: the one-byte token of each byte
    char *raw_text;        // byte mode: the bytes each token stands for
    uint32_t *raw_off, *raw_len;
    struct vtab raw_vocab;  // byte mode: token bytes -> id, for ignore_merges
    int32_t fallback_id[256];    // <0xXX> tokens, -1 when absent
    int32_t unk_id;
    bool fuse_unk, byte_fallback, ignore_merges;
    char *prefix, *suffix;  // continuing_subword_prefix, end_of_word_suffix ("" when unset)
    size_t prefix_len, suffix_len;
    struct word_cache cache;
};

struct sp_bpe_sym {
    int32_t id;
    int32_t prev, next;  // -1 at the ends
};

struct sp_bpe_cand {
    uint32_t rank, pos;  // ordered by (rank, pos)
    int32_t left, right, new_id;
};

static inline uint64_t mix64(uint64_t x) {
    x ^= x >> 31;
    x *= 0x7fb5d329728ea185ull;
    x ^= x >> 27;
    x *= 0x81dadef4bc2dd44dull;
    return x ^ (x >> 33);
}

#define SMALL 256

static const struct merge_slot *merge_find(const struct sp_bpe *m, int32_t a, int32_t b) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->merge_cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        const struct merge_slot *s = &m->merges[i];
        if (s->key == key) return s;
        if (s->key == UINT64_MAX) return NULL;
    }
}

static void merge_put(struct sp_bpe *m, int32_t a, int32_t b, uint32_t rank, int32_t new_id) {
    uint64_t key = ((uint64_t)(uint32_t)a << 32) | (uint32_t)b;
    size_t mask = m->merge_cap - 1;
    for (size_t i = mix64(key) & mask;; i = (i + 1) & mask) {
        struct merge_slot *s = &m->merges[i];
        if (s->key == UINT64_MAX || s->key == key) {
            /* A repeated pair keeps its last rank, as the reference does. */
            s->key = key;
            s->rank = rank;
            s->new_id = new_id;
            return;
        }
    }
}

/* A fast hash for short keys (tokens and words are a few bytes): one
 * multiply per 8 bytes, one full mix at the end. */
static uint64_t key_hash(const char *s, size_t n) {
    uint64_t h = 0x9e3779b97f4a7c15ull ^ n;
    while (n >= 8) {
        uint64_t w;
        memcpy(&w, s, 8);
        h = (h ^ w) * 0xbf58476d1ce4e5b9ull;
        h ^= h >> 31;
        s += 8;
        n -= 8;
    }
    uint64_t w = 0;
    memcpy(&w, s, n);
    return mix64(h ^ w);
}

/* Lookup with the key's hash already computed. */
static int32_t vocab_get_h(const struct vtab *v, const char *s, size_t n, uint64_t h) {
    if (!v->slots) return -1;
    uint32_t tag = (uint32_t)(h >> 32);
    for (size_t i = (size_t)h & v->mask;; i = (i + 1) & v->mask) {
        const struct vslot *e = &v->slots[i];
        if (e->id < 0) return -1;
        if (e->tag == tag && e->len == n && memcmp(v->arena + e->off, s, n) == 0) return e->id;
    }
}

static int32_t vocab_get(const struct vtab *v, const char *s, size_t n) {
    return vocab_get_h(v, s, n, key_hash(s, n));
}

static inline void vocab_prefetch(const struct vtab *v, uint64_t h) {
    if (v->slots) __builtin_prefetch(&v->slots[(size_t)h & v->mask]);
}

/* Indexes every id with a text; a text held by two ids keeps the later one. */
static enum sp_status vtab_build(struct vtab *v, const char *arena, const uint32_t *off, const uint32_t *len, int64_t end) {
    size_t cap = 64;
    while (cap < (size_t)end * 2) cap *= 2;
    v->slots = sp_malloc(cap * sizeof *v->slots, SP_MEM_TOKENIZER);
    if (!v->slots) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for the vocabulary index");
    memset(v->slots, 0xff, cap * sizeof *v->slots);
    v->mask = cap - 1;
    v->arena = arena;
    enum { AHEAD = 16 };
    uint64_t hs[2 * AHEAD];  // ring: written AHEAD ahead of the read
    for (int64_t id = 0; id < end + AHEAD; id++) {
        /* Hash (and prefetch the slot of) the id AHEAD places on: memory
         * latency, not arithmetic, is what a 150k-entry build costs. */
        if (id < end && len[id] != UINT32_MAX) {
            hs[id % (2 * AHEAD)] = key_hash(arena + off[id], len[id]);
            __builtin_prefetch(&v->slots[(size_t)hs[id % (2 * AHEAD)] & v->mask], 1);
        }
        int64_t at = id - AHEAD;
        if (at < 0 || len[at] == UINT32_MAX) continue;
        uint64_t h = hs[at % (2 * AHEAD)];
        int64_t cur = at;
        uint32_t tag = (uint32_t)(h >> 32);
        for (size_t i = (size_t)h & v->mask;; i = (i + 1) & v->mask) {
            struct vslot *e = &v->slots[i];
            if (e->id < 0 ||
                (e->tag == tag && e->len == len[cur] && memcmp(arena + e->off, arena + off[cur], len[cur]) == 0)) {
                *e = (struct vslot){tag, (int32_t)cur, off[cur], len[cur]};
                break;
            }
        }
    }
    return SP_OK;
}

/* The cache's memory is taken on first use: a tokenizer that never encodes
 * (or only loads and fails) costs nothing here. */
static enum sp_status cache_init(struct word_cache *c) {
    memset(c, 0, sizeof *c);
    if (pthread_mutex_init(&c->mu, NULL) != 0) return sp_errorf(SP_ERR_NOMEM, "tokenizer: cannot create a mutex");
    c->inited = true;
    return SP_OK;
}

/* Allocates the tables (lock held); false when memory is short, in which
 * case the word simply is not cached. */
static bool cache_alloc_locked(struct word_cache *c) {
    if (c->slots) return true;
    c->slots = sp_calloc(CACHE_SLOTS, sizeof *c->slots, SP_MEM_TOKENIZER);
    c->keys = sp_malloc(CACHE_KEY_BYTES, SP_MEM_TOKENIZER);
    c->ids = sp_malloc(CACHE_IDS * sizeof *c->ids, SP_MEM_TOKENIZER);
    if (c->slots && c->keys && c->ids) return true;
    sp_free(c->slots);
    sp_free(c->keys);
    sp_free(c->ids);
    c->slots = NULL;
    c->keys = NULL;
    c->ids = NULL;
    return false;
}

static void cache_free(struct word_cache *c) {
    if (!c->inited) return;
    sp_free(c->slots);
    sp_free(c->keys);
    sp_free(c->ids);
    pthread_mutex_destroy(&c->mu);
}

static void cache_clear_locked(struct word_cache *c) {
    if (!c->slots) return;
    memset(c->slots, 0, CACHE_SLOTS * sizeof *c->slots);
    c->count = 0;
    c->keys_len = 0;
    c->ids_len = 0;
}

void sp_bpe_cache_clear(struct sp_bpe *m) {
    pthread_mutex_lock(&m->cache.mu);
    cache_clear_locked(&m->cache);
    pthread_mutex_unlock(&m->cache.mu);
}

static inline const char *slot_key(const struct word_cache *c, const struct cache_slot *s) {
    return s->key_len <= INLINE_KEY ? s->k.key : c->keys + s->k.off;
}

/* Finds the slot of a word (or the empty slot where it would go). */
static struct cache_slot *cache_slot(struct word_cache *c, uint64_t h, const char *w, size_t n) {
    uint32_t tag = (uint32_t)(h >> 32) | 1;
    for (uint32_t i = (uint32_t)h & (CACHE_SLOTS - 1);; i = (i + 1) & (CACHE_SLOTS - 1)) {
        struct cache_slot *s = &c->slots[i];
        if (!s->tag || (s->tag == tag && s->key_len == n && memcmp(slot_key(c, s), w, n) == 0)) return s;
    }
}

static bool cache_get(struct word_cache *c, uint64_t h, const char *w, size_t n, struct sp_ids *out,
                      enum sp_status *st) {
    bool hit = false;
    pthread_mutex_lock(&c->mu);
    struct cache_slot *s = c->slots ? cache_slot(c, h, w, n) : NULL;
    if (s && s->tag) {
        hit = true;
        *st = sp_ids_append(out, s->ids_len <= INLINE_IDS ? s->v.ids : c->ids + s->v.off, s->ids_len);
    }
    pthread_mutex_unlock(&c->mu);
    return hit;
}

static void cache_put(struct word_cache *c, uint64_t h, const char *w, size_t n, const int32_t *ids, int64_t k) {
    if (k > CACHE_MAX_WORD || n > CACHE_MAX_WORD) return;
    pthread_mutex_lock(&c->mu);
    if (!cache_alloc_locked(c)) {
        pthread_mutex_unlock(&c->mu);
        return;
    }
    if (c->count + 1 > CACHE_SLOTS / 2 || c->keys_len + n > CACHE_KEY_BYTES || c->ids_len + (uint64_t)k > CACHE_IDS)
        cache_clear_locked(c);
    struct cache_slot *s = cache_slot(c, h, w, n);
    if (!s->tag) {
        s->tag = (uint32_t)(h >> 32) | 1;
        s->key_len = (uint16_t)n;
        if (n <= INLINE_KEY) {
            memcpy(s->k.key, w, n);
        } else {
            s->k.off = c->keys_len;
            memcpy(c->keys + c->keys_len, w, n);
            c->keys_len += (uint32_t)n;
        }
        s->ids_len = (uint16_t)k;
        if (k <= INLINE_IDS) {
            if (k) memcpy(s->v.ids, ids, (size_t)k * sizeof *ids);
        } else {
            s->v.off = c->ids_len;
            memcpy(c->ids + c->ids_len, ids, (size_t)k * sizeof *ids);
            c->ids_len += (uint32_t)k;
        }
        c->count++;
    }
    pthread_mutex_unlock(&c->mu);
}

static enum sp_status get_opt_str(const cJSON *model, const char *key, char **out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    const char *s = "";
    if (v && !cJSON_IsNull(v)) {
        if (!cJSON_IsString(v)) return sp_errorf(SP_ERR_FORMAT, "model.%s must be a string or null", key);
        s = v->valuestring;
    }
    *out = sp_strdup(s, SP_MEM_TOKENIZER);
    return *out ? SP_OK : sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
}

static enum sp_status get_opt_bool(const cJSON *model, const char *key, bool *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(model, key);
    *out = false;
    if (!v || cJSON_IsNull(v)) return SP_OK;
    if (!cJSON_IsBool(v)) return sp_errorf(SP_ERR_FORMAT, "model.%s must be a boolean", key);
    *out = cJSON_IsTrue(v);
    return SP_OK;
}

enum sp_status sp_bpe_build(const struct sp_tokjson *tj, const cJSON *model, bool byte_level, struct sp_bpe **out) {
    enum sp_status st = SP_OK;
    struct sp_buf tmp = SP_BUF_INIT;
    *out = NULL;
    struct sp_bpe *m = sp_calloc(1, sizeof *m, SP_MEM_TOKENIZER);
    if (!m) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
    m->unk_id = -1;
    if ((st = cache_init(&m->cache)) != SP_OK) goto fail;
    if (!tj->has_vocab) {
        st = sp_errorf(SP_ERR_FORMAT, "model.vocab: missing or not an object");
        goto fail;
    }
    if (!tj->has_merges) {
        st = sp_errorf(SP_ERR_FORMAT, "model.merges: missing or not an array");
        goto fail;
    }
    const cJSON *dropout = cJSON_GetObjectItemCaseSensitive(model, "dropout");
    if (dropout && !cJSON_IsNull(dropout) && !(cJSON_IsNumber(dropout) && dropout->valuedouble == 0.0)) {
        st = sp_errorf(SP_ERR_UNSUPPORTED, "model: BPE dropout is not supported");
        goto fail;
    }
    if ((st = get_opt_bool(model, "fuse_unk", &m->fuse_unk)) != SP_OK) goto fail;
    if ((st = get_opt_bool(model, "byte_fallback", &m->byte_fallback)) != SP_OK) goto fail;
    if ((st = get_opt_bool(model, "ignore_merges", &m->ignore_merges)) != SP_OK) goto fail;
    if ((st = get_opt_str(model, "continuing_subword_prefix", &m->prefix)) != SP_OK) goto fail;
    if ((st = get_opt_str(model, "end_of_word_suffix", &m->suffix)) != SP_OK) goto fail;
    m->prefix_len = strlen(m->prefix);
    m->suffix_len = strlen(m->suffix);
    m->byte_level = byte_level && !m->prefix_len && !m->suffix_len;

    /* Vocabulary: texts copied into one arena, indexed by id. */
    int64_t end = 0;
    size_t bytes = 0;
    for (int64_t i = 0; i < tj->n_vocab; i++) {
        if (tj->vocab[i].id + 1 > end) end = tj->vocab[i].id + 1;
        bytes += tj->vocab[i].text.len;
    }
    m->vocab_end = end;
    m->tok_off = sp_malloc((size_t)(end ? end : 1) * sizeof *m->tok_off, SP_MEM_TOKENIZER);
    m->tok_len = sp_malloc((size_t)(end ? end : 1) * sizeof *m->tok_len, SP_MEM_TOKENIZER);
    m->text = sp_malloc(bytes + 1, SP_MEM_TOKENIZER);
    if (!m->tok_off || !m->tok_len || !m->text) {
        st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for the vocabulary");
        goto fail;
    }
    memset(m->tok_len, 0xff, (size_t)end * sizeof *m->tok_len);
    bytes = 0;
    for (int64_t i = 0; i < tj->n_vocab; i++) {
        const struct sp_tokjson_vocab *v = &tj->vocab[i];
        memcpy(m->text + bytes, tj->arena + v->text.off, v->text.len);
        m->tok_off[v->id] = (uint32_t)bytes;
        m->tok_len[v->id] = v->text.len;
        bytes += v->text.len;
    }
    if ((st = vtab_build(&m->vocab, m->text, m->tok_off, m->tok_len, end)) != SP_OK) goto fail;

    /* Merge table at load factor <= 2/3: smaller is faster here, the
     * lookups are cache misses. */
    m->merge_cap = 64;
    while (m->merge_cap < (size_t)tj->n_merges * 3 / 2) m->merge_cap *= 2;
    m->merges = sp_malloc(m->merge_cap * sizeof *m->merges, SP_MEM_TOKENIZER);
    if (!m->merges) {
        st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for merges");
        goto fail;
    }
    memset(m->merges, 0xff, m->merge_cap * sizeof *m->merges);
    /* Lookups run AHEAD merges behind the hashing, so the slots they touch
     * have been prefetched by then. */
    enum { AHEAD = 16, MAXK = 256 };
    struct {
        uint64_t ha, hb, hab;
        bool ok;
    } la[2 * AHEAD];  // ring: written AHEAD ahead of the read
    struct pending_merge {
        int32_t a, b;
        uint32_t rank;
        int32_t new_id;
    } pend[AHEAD];
    for (int64_t j = 0; j < tj->n_merges + AHEAD; j++) {
        if (j < tj->n_merges) {
            const struct sp_tokjson_merge *mg = &tj->merges[j];
            const char *a = tj->arena + mg->a.off, *b = tj->arena + mg->b.off;
            la[j % (2 * AHEAD)].ok = mg->a.len + mg->b.len <= MAXK && !m->prefix_len;
            if (la[j % (2 * AHEAD)].ok) {
                char cat[MAXK];
                memcpy(cat, a, mg->a.len);
                memcpy(cat + mg->a.len, b, mg->b.len);
                la[j % (2 * AHEAD)].ha = key_hash(a, mg->a.len);
                la[j % (2 * AHEAD)].hb = key_hash(b, mg->b.len);
                la[j % (2 * AHEAD)].hab = key_hash(cat, mg->a.len + mg->b.len);
                vocab_prefetch(&m->vocab, la[j % (2 * AHEAD)].ha);
                vocab_prefetch(&m->vocab, la[j % (2 * AHEAD)].hb);
                vocab_prefetch(&m->vocab, la[j % (2 * AHEAD)].hab);
            }
        }
        int64_t i = j - AHEAD;
        if (i < 0) continue;
        const struct sp_tokjson_merge *mg = &tj->merges[i];
        const char *a = tj->arena + mg->a.off, *b = tj->arena + mg->b.off;
        bool ok = la[i % (2 * AHEAD)].ok;
        int32_t ia = ok ? vocab_get_h(&m->vocab, a, mg->a.len, la[i % (2 * AHEAD)].ha) : vocab_get(&m->vocab, a, mg->a.len);
        int32_t ib = ok ? vocab_get_h(&m->vocab, b, mg->b.len, la[i % (2 * AHEAD)].hb) : vocab_get(&m->vocab, b, mg->b.len);
        if (ia < 0 || ib < 0) {
            const struct sp_tokjson_str *miss = ia < 0 ? &mg->a : &mg->b;
            st = sp_errorf(SP_ERR_FORMAT, "model.merges[%lld]: token \"%.*s\" is not in the vocabulary", (long long)i,
                           (int)(miss->len > 64 ? 64 : miss->len), tj->arena + miss->off);
            goto fail;
        }
        /* The merged token drops the right side's continuation prefix. */
        size_t skip = (m->prefix_len && mg->b.len >= m->prefix_len && memcmp(b, m->prefix, m->prefix_len) == 0)
                          ? m->prefix_len
                          : 0;
        sp_buf_clear(&tmp);
        sp_buf_append(&tmp, a, mg->a.len);
        if ((st = sp_buf_append(&tmp, b + skip, mg->b.len - skip)) != SP_OK) goto fail;
        int32_t inew = ok ? vocab_get_h(&m->vocab, tmp.data, tmp.len, la[i % (2 * AHEAD)].hab) : vocab_get(&m->vocab, tmp.data, tmp.len);
        if (inew < 0) {
            st = sp_errorf(SP_ERR_FORMAT, "model.merges[%lld]: merged token \"%.*s\" is not in the vocabulary",
                           (long long)i, (int)(tmp.len > 64 ? 64 : tmp.len), tmp.data);
            goto fail;
        }
        /* The insert itself waits AHEAD more merges, for its prefetch. */
        uint64_t key = ((uint64_t)(uint32_t)ia << 32) | (uint32_t)ib;
        __builtin_prefetch(&m->merges[mix64(key) & (m->merge_cap - 1)], 1);
        if (i >= AHEAD) {  // the slot's previous occupant, merge i - AHEAD
            const struct pending_merge *p = &pend[i % AHEAD];
            merge_put(m, p->a, p->b, p->rank, p->new_id);
        }
        pend[i % AHEAD] = (struct pending_merge){ia, ib, (uint32_t)i, inew};
    }
    for (int64_t i = tj->n_merges > AHEAD ? tj->n_merges - AHEAD : 0; i < tj->n_merges; i++) {
        const struct pending_merge *p = &pend[i % AHEAD];
        merge_put(m, p->a, p->b, p->rank, p->new_id);
    }

    m->small = sp_malloc(SMALL * SMALL * sizeof *m->small, SP_MEM_TOKENIZER);
    if (!m->small) {
        st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for merges");
        goto fail;
    }
    memset(m->small, 0xff, SMALL * SMALL * sizeof *m->small);
    for (size_t i = 0; i < m->merge_cap; i++) {
        const struct merge_slot *ms = &m->merges[i];
        if (ms->key == UINT64_MAX) continue;
        uint32_t a = (uint32_t)(ms->key >> 32), b = (uint32_t)ms->key;
        if (a < SMALL && b < SMALL) m->small[a * SMALL + b] = (struct small_merge){(int32_t)ms->rank, ms->new_id};
    }

    /* Unknown token, byte tokens. */
    const cJSON *unk = cJSON_GetObjectItemCaseSensitive(model, "unk_token");
    if (unk && !cJSON_IsNull(unk)) {
        if (!cJSON_IsString(unk)) {
            st = sp_errorf(SP_ERR_FORMAT, "model.unk_token must be a string or null");
            goto fail;
        }
        m->unk_id = vocab_get(&m->vocab, unk->valuestring, strlen(unk->valuestring));
    }
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        m->fallback_id[b] = vocab_get(&m->vocab, name, 6);
        char ch[4];
        int n = sp_utf8_encode(sp_bytelevel_cp((uint8_t)b), ch);
        m->byte_id[b] = vocab_get(&m->vocab, ch, (size_t)n);
    }
    if (m->byte_level && m->ignore_merges) {
        /* Byte-mode words are raw bytes: index the tokens by their bytes. */
        m->raw_off = sp_malloc((size_t)(end ? end : 1) * sizeof *m->raw_off, SP_MEM_TOKENIZER);
        m->raw_len = sp_malloc((size_t)(end ? end : 1) * sizeof *m->raw_len, SP_MEM_TOKENIZER);
        if (!m->raw_off || !m->raw_len) {
            st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        sp_buf_clear(&tmp);
        for (int64_t id = 0; id < end; id++) {
            m->raw_len[id] = UINT32_MAX;
            if (m->tok_len[id] == UINT32_MAX) continue;
            size_t at = tmp.len;
            if (!sp_bytelevel_unmap(m->text + m->tok_off[id], m->tok_len[id], &tmp)) continue;
            m->raw_off[id] = (uint32_t)at;
            m->raw_len[id] = (uint32_t)(tmp.len - at);
        }
        if (tmp.failed || sp_buf_reserve(&tmp, 0) != SP_OK) {
            st = sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
            goto fail;
        }
        m->raw_text = sp_buf_take(&tmp);
        if ((st = vtab_build(&m->raw_vocab, m->raw_text, m->raw_off, m->raw_len, end)) != SP_OK) goto fail;
    }
    sp_buf_free(&tmp);
    *out = m;
    return SP_OK;
fail:
    sp_buf_free(&tmp);
    sp_bpe_free(m);
    return st;
}

void sp_bpe_free(struct sp_bpe *m) {
    if (!m) return;
    sp_free(m->vocab.slots);
    sp_free(m->raw_vocab.slots);
    sp_free(m->text);
    sp_free(m->raw_text);
    sp_free(m->raw_off);
    sp_free(m->raw_len);
    sp_free(m->tok_off);
    sp_free(m->tok_len);
    sp_free(m->merges);
    sp_free(m->small);
    sp_free(m->prefix);
    sp_free(m->suffix);
    cache_free(&m->cache);
    sp_free(m);
}

void sp_bpe_scratch_free(struct sp_bpe_scratch *s) {
    if (!s) return;
    sp_free(s->sym);
    sp_free(s->heap);
    sp_buf_free(&s->key);
    memset(s, 0, sizeof *s);
}

int64_t sp_bpe_vocab_end(const struct sp_bpe *m) { return m->vocab_end; }

bool sp_bpe_byte_mode(const struct sp_bpe *m) { return m->byte_level; }

const char *sp_bpe_token(const struct sp_bpe *m, int32_t id, size_t *len) {
    if (id < 0 || id >= m->vocab_end || m->tok_len[id] == UINT32_MAX) return NULL;
    *len = m->tok_len[id];
    return m->text + m->tok_off[id];
}

int32_t sp_bpe_lookup(const struct sp_bpe *m, const char *text, size_t len) { return vocab_get(&m->vocab, text, len); }

int32_t sp_bpe_unk(const struct sp_bpe *m) { return m->unk_id; }

/* ---- merge loop ---- */

static bool cand_less(const struct sp_bpe_cand *a, const struct sp_bpe_cand *b) {
    return a->rank < b->rank || (a->rank == b->rank && a->pos < b->pos);
}

static void heap_push(struct sp_bpe_cand *h, int64_t *n, struct sp_bpe_cand c) {
    int64_t i = (*n)++;
    while (i > 0) {
        int64_t p = (i - 1) / 2;
        if (!cand_less(&c, &h[p])) break;
        h[i] = h[p];
        i = p;
    }
    h[i] = c;
}

static struct sp_bpe_cand heap_pop(struct sp_bpe_cand *h, int64_t *n) {
    struct sp_bpe_cand top = h[0], last = h[--(*n)];
    int64_t i = 0;
    for (;;) {
        int64_t c = 2 * i + 1;
        if (c >= *n) break;
        if (c + 1 < *n && cand_less(&h[c + 1], &h[c])) c++;
        if (!cand_less(&h[c], &last)) break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0) h[i] = last;
    return top;
}

/* Pushes the candidate merge of symbol `pos` with its right neighbour. */
static void add_cand(const struct sp_bpe *m, struct sp_bpe_scratch *s, int64_t *nh, int32_t pos) {
    int32_t r = s->sym[pos].next;
    if (r < 0) return;
    int32_t a = s->sym[pos].id, b = s->sym[r].id;
    uint32_t rank;
    int32_t new_id;
    if ((uint32_t)a < SMALL && (uint32_t)b < SMALL) {
        const struct small_merge *sm = &m->small[a * SMALL + b];
        if (sm->rank < 0) return;
        rank = (uint32_t)sm->rank;
        new_id = sm->new_id;
    } else {
        const struct merge_slot *mg = merge_find(m, a, b);
        if (!mg) return;
        rank = mg->rank;
        new_id = mg->new_id;
    }
    struct sp_bpe_cand c = {rank, (uint32_t)pos, a, b, new_id};
    heap_push(s->heap, nh, c);
}

/* Prefetches the merge-table slot of the pair at pos, ahead of add_cand. */
static inline void prefetch_cand(const struct sp_bpe *m, const struct sp_bpe_scratch *s, int32_t pos) {
    int32_t r = s->sym[pos].next;
    if (r < 0) return;
    uint32_t a = (uint32_t)s->sym[pos].id, b = (uint32_t)s->sym[r].id;
    if (a < SMALL && b < SMALL) return;
    uint64_t key = ((uint64_t)a << 32) | b;
    __builtin_prefetch(&m->merges[mix64(key) & (m->merge_cap - 1)]);
}

static enum sp_status grow_scratch(struct sp_bpe_scratch *s, int64_t n) {
    if (n <= s->sym_cap) return SP_OK;
    int64_t cap = s->sym_cap ? s->sym_cap : 64;
    while (cap < n) cap *= 2;
    struct sp_bpe_sym *ns = sp_malloc((size_t)cap * sizeof *ns, SP_MEM_TOKENIZER);
    /* Each merge adds at most two candidates: 3n bounds the heap. */
    struct sp_bpe_cand *nh = sp_malloc((size_t)cap * 3 * sizeof *nh, SP_MEM_TOKENIZER);
    if (!ns || !nh) {
        sp_free(ns);
        sp_free(nh);
        return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory for a word of %lld symbols", (long long)n);
    }
    sp_free(s->sym);
    sp_free(s->heap);
    s->sym = ns;
    s->heap = nh;
    s->sym_cap = cap;
    s->heap_cap = cap * 3;
    return SP_OK;
}

/* Appends a symbol, linking it after the previous one. */
static inline void sym_add(struct sp_bpe_scratch *s, int64_t *n, int32_t id) {
    int64_t i = (*n)++;
    s->sym[i].id = id;
    s->sym[i].prev = (int32_t)(i - 1);
    s->sym[i].next = -1;
    if (i > 0) s->sym[i - 1].next = (int32_t)i;
}

/* Char mode: the first symbols of a word. */
static enum sp_status char_symbols(const struct sp_bpe *m, const char *w, size_t len, struct sp_bpe_scratch *s,
                                   int64_t *n) {
    bool last_unk = false;
    for (size_t i = 0; i < len;) {
        size_t cl = (size_t)sp_utf8_len((unsigned char)w[i]);
        if (cl > len - i) cl = len - i;
        int32_t id;
        if (!m->prefix_len && !m->suffix_len) {
            id = vocab_get(&m->vocab, w + i, cl);
        } else {
            sp_buf_clear(&s->key);
            if (i > 0) sp_buf_append(&s->key, m->prefix, m->prefix_len);
            sp_buf_append(&s->key, w + i, cl);
            if (i + cl == len) sp_buf_append(&s->key, m->suffix, m->suffix_len);
            if (s->key.failed) return sp_errorf(SP_ERR_NOMEM, "tokenizer: out of memory");
            id = vocab_get(&m->vocab, s->key.data, s->key.len);
        }
        if (id >= 0) {
            sym_add(s, n, id);
            last_unk = false;
        } else {
            bool all = m->byte_fallback;
            for (size_t k = 0; all && k < cl; k++) all = m->fallback_id[(unsigned char)w[i + k]] >= 0;
            if (all) {
                for (size_t k = 0; k < cl; k++) sym_add(s, n, m->fallback_id[(unsigned char)w[i + k]]);
                last_unk = false;
            } else if (m->unk_id >= 0) {
                if (!(m->fuse_unk && last_unk)) sym_add(s, n, m->unk_id);
                last_unk = true;
            }
        }
        i += cl;
    }
    return SP_OK;
}

enum sp_status sp_bpe_encode_word(struct sp_bpe *m, const char *w, size_t len, struct sp_bpe_scratch *s,
                                  struct sp_ids *out) {
    if (len == 0) return SP_OK;
    if (len == 1 && m->byte_level && m->byte_id[(unsigned char)w[0]] >= 0)
        return sp_ids_push(out, m->byte_id[(unsigned char)w[0]]);  // nothing to merge, nothing to cache
    if (len > (size_t)INT32_MAX / 3)
        return sp_errorf(SP_ERR_LIMIT, "tokenizer: a word of %zu bytes (words are limited to 700 MB)", len);
    enum sp_status st = SP_OK;
    bool cacheable = len <= CACHE_MAX_WORD;
    uint64_t h = 0;
    if (cacheable) {
        h = key_hash(w, len);
        if (cache_get(&m->cache, h, w, len, out, &st)) return st;
    }
    if (m->ignore_merges) {
        int32_t id = vocab_get(m->byte_level ? &m->raw_vocab : &m->vocab, w, len);
        if (id >= 0) {
            if (cacheable) cache_put(&m->cache, h, w, len, &id, 1);
            return sp_ids_push(out, id);
        }
    }
    /* Char mode may add up to 4 byte-fallback symbols per byte... never more
     * than one per byte; byte mode exactly one per byte. */
    if ((st = grow_scratch(s, (int64_t)len)) != SP_OK) return st;
    int64_t n = 0;
    if (m->byte_level) {
        for (size_t i = 0; i < len; i++) {
            int32_t id = m->byte_id[(unsigned char)w[i]];
            if (id < 0) id = m->unk_id;
            if (id >= 0) sym_add(s, &n, id);
        }
    } else if ((st = char_symbols(m, w, len, s, &n)) != SP_OK) {
        return st;
    }
    int64_t nh = 0;
    for (int64_t i = 0; i + 1 < n; i++) prefetch_cand(m, s, (int32_t)i);
    for (int64_t i = 0; i + 1 < n; i++) add_cand(m, s, &nh, (int32_t)i);
    while (nh > 0) {
        struct sp_bpe_cand c = heap_pop(s->heap, &nh);
        struct sp_bpe_sym *l = &s->sym[c.pos];
        /* Stale if either side has changed since the candidate was pushed. */
        if (l->id != c.left || l->next < 0 || s->sym[l->next].id != c.right) continue;
        struct sp_bpe_sym *r = &s->sym[l->next];
        l->id = c.new_id;
        l->next = r->next;
        if (r->next >= 0) s->sym[r->next].prev = (int32_t)c.pos;
        r->id = -1;
        if (l->prev >= 0) prefetch_cand(m, s, l->prev);
        prefetch_cand(m, s, (int32_t)c.pos);
        if (l->prev >= 0) add_cand(m, s, &nh, l->prev);
        add_cand(m, s, &nh, (int32_t)c.pos);
    }
    int64_t first = out->n;
    for (int64_t i = n ? 0 : -1; i >= 0; i = s->sym[i].next)
        if ((st = sp_ids_push(out, s->sym[i].id)) != SP_OK) return st;
    if (cacheable) cache_put(&m->cache, h, w, len, out->n > first ? out->v + first : NULL, out->n - first);
    return SP_OK;
}
