/*
 * grammar.c - byte-level grammars, their matcher and the token trie (see
 * grammar.h).
 *
 * Symbols are 32-bit words: 0 ends an alternative, (1 << 30 | i) is byte
 * class i, (2 << 30 | r) references rule r. A grammar position is an index
 * into the flat symbol array; a stack holds the position to match next on
 * top and return positions below it. A configuration is the sorted set of
 * stacks whose top is a byte class, plus whether some stack emptied (the
 * text so far is a sentence): configurations are interned, and each keeps a
 * 256-entry table of the configuration every byte leads to.
 */
#include "runtime/grammar.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

#define SYM_SET (1u << 30)
#define SYM_REF (2u << 30)
#define SYM_KIND(x) ((x) & (3u << 30))
#define SYM_ARG(x) ((x) & ((1u << 30) - 1))
#define MAX_OPEN 64           // alternatives open at once in a builder
#define MAX_STATES 4096       // interned configurations before the memo is flushed
#define MASKS 4               // token masks remembered, by configuration
#define UNKNOWN (-2)
#define DEAD (-1)

struct sp_grammar {
    atomic_int refs;
    uint32_t *el;          // symbols; el[0] = start rule reference, el[1] = 0
    uint32_t *alt_start;   // alternatives' first positions, grouped by rule
    uint32_t *rule_first;  // (n_rules + 1) offsets into alt_start
    struct sp_gset *sets;
    int n_rules, n_sets;
    size_t n_el;
};

/* ---- builder ---- */

struct galt {
    int rule;
    size_t off, n;  // symbols in done[off .. off + n)
};

struct vec32 {
    uint32_t *v;
    size_t n, cap;
};

static bool vec_push(struct vec32 *a, uint32_t x) {
    if (a->n == a->cap) {
        size_t cap = a->cap ? 2 * a->cap : 64;
        uint32_t *v = sp_realloc(a->v, cap * sizeof *v);
        if (!v) return false;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = x;
    return true;
}

struct sp_gbuild {
    bool failed;
    int n_rules;
    struct sp_gset *sets;
    int n_sets, cap_sets;
    int single[256];  // the class holding exactly one byte, or -1
    struct vec32 done;
    struct galt *alts;
    size_t n_alts, cap_alts;
    struct vec32 open[MAX_OPEN];
    int depth;
};

struct sp_gbuild *sp_gb_new(void) {
    struct sp_gbuild *b = sp_calloc(1, sizeof *b, SP_MEM_SERVER);
    if (b)
        for (int i = 0; i < 256; i++) b->single[i] = -1;
    return b;
}

void sp_gb_free(struct sp_gbuild *b) {
    if (!b) return;
    sp_free(b->sets);
    sp_free(b->done.v);
    sp_free(b->alts);
    for (int i = 0; i < MAX_OPEN; i++) sp_free(b->open[i].v);
    sp_free(b);
}

int sp_gb_rule(struct sp_gbuild *b) {
    if (!b) return 0;
    if (b->n_rules >= (1 << 29)) b->failed = true;
    return b->n_rules++;
}

void sp_gb_begin(struct sp_gbuild *b) {
    if (!b) return;
    if (b->depth == MAX_OPEN) {
        b->failed = true;
        return;
    }
    b->open[b->depth++].n = 0;
}

static void add_sym(struct sp_gbuild *b, uint32_t sym) {
    if (!b || b->failed) return;
    if (b->depth == 0 || !vec_push(&b->open[b->depth - 1], sym)) b->failed = true;
}

static int set_id(struct sp_gbuild *b, const struct sp_gset *s) {
    int one = -1, count = 0;
    for (int w = 0; w < 4; w++) count += __builtin_popcountll(s->w[w]);
    if (count == 1)
        for (int c = 0; c < 256 && one < 0; c++)
            if (sp_gset_has(s, (unsigned)c)) one = c;
    if (one >= 0 && b->single[one] >= 0) return b->single[one];
    if (one < 0)
        for (int i = 0; i < b->n_sets; i++)
            if (!memcmp(&b->sets[i], s, sizeof *s)) return i;
    if (b->n_sets == b->cap_sets) {
        int cap = b->cap_sets ? 2 * b->cap_sets : 64;
        struct sp_gset *v = sp_realloc(b->sets, (size_t)cap * sizeof *v);
        if (!v) return -1;
        b->sets = v;
        b->cap_sets = cap;
    }
    b->sets[b->n_sets] = *s;
    if (one >= 0) b->single[one] = b->n_sets;
    return b->n_sets++;
}

void sp_gb_set(struct sp_gbuild *b, const struct sp_gset *s) {
    if (!b || b->failed) return;
    int id = set_id(b, s);
    if (id < 0)
        b->failed = true;
    else
        add_sym(b, SYM_SET | (uint32_t)id);
}

void sp_gb_range(struct sp_gbuild *b, unsigned lo, unsigned hi) {
    struct sp_gset s = {{0}};
    sp_gset_add(&s, lo, hi);
    sp_gb_set(b, &s);
}

void sp_gb_bytes(struct sp_gbuild *b, const char *s, size_t n) {
    for (size_t i = 0; i < n; i++) sp_gb_range(b, (unsigned char)s[i], (unsigned char)s[i]);
}

void sp_gb_lit(struct sp_gbuild *b, const char *s) { sp_gb_bytes(b, s, strlen(s)); }

void sp_gb_ref(struct sp_gbuild *b, int rule) {
    if (b && (rule < 0 || rule >= b->n_rules)) b->failed = true;
    add_sym(b, SYM_REF | (uint32_t)rule);
}

void sp_gb_end(struct sp_gbuild *b, int rule) {
    if (!b) return;
    if (b->depth == 0 || rule < 0 || rule >= b->n_rules) {
        b->failed = true;
        return;
    }
    struct vec32 *a = &b->open[--b->depth];
    if (b->failed) return;
    if (b->n_alts == b->cap_alts) {
        size_t cap = b->cap_alts ? 2 * b->cap_alts : 64;
        struct galt *v = sp_realloc(b->alts, cap * sizeof *v);
        if (!v) {
            b->failed = true;
            return;
        }
        b->alts = v;
        b->cap_alts = cap;
    }
    b->alts[b->n_alts++] = (struct galt){rule, b->done.n, a->n};
    for (size_t i = 0; i < a->n; i++)
        if (!vec_push(&b->done, a->v[i])) b->failed = true;
}

size_t sp_gb_size(const struct sp_gbuild *b) { return b ? b->done.n + b->n_alts : 0; }

struct sp_grammar *sp_grammar_ref(struct sp_grammar *g) {
    if (g) atomic_fetch_add(&g->refs, 1);
    return g;
}

void sp_grammar_free(struct sp_grammar *g) {
    if (!g || atomic_fetch_sub(&g->refs, 1) > 1) return;
    sp_free(g->el);
    sp_free(g->alt_start);
    sp_free(g->rule_first);
    sp_free(g->sets);
    sp_free(g);
}

enum sp_status sp_gb_finish(struct sp_gbuild *b, int start, struct sp_grammar **out) {
    *out = NULL;
    if (!b) return SP_ERR_NOMEM;
    enum sp_status st = SP_OK;
    if (b->failed)
        st = b->depth == MAX_OPEN ? sp_errorf(SP_ERR_ARG, "grammar: alternatives nested too deep") : SP_ERR_NOMEM;
    else if (b->depth)
        st = sp_errorf(SP_ERR_ARG, "grammar: an alternative was left open");
    else if (start < 0 || start >= b->n_rules)
        st = sp_errorf(SP_ERR_ARG, "grammar: no start rule");
    else if (b->done.n + b->n_alts + 2 > SP_GRAMMAR_MAX_SYMBOLS)
        st = sp_errorf(SP_ERR_ARG, "grammar: more than %d symbols", SP_GRAMMAR_MAX_SYMBOLS);
    struct sp_grammar *g = st == SP_OK ? sp_calloc(1, sizeof *g, SP_MEM_SERVER) : NULL;
    if (st == SP_OK && !g) st = SP_ERR_NOMEM;
    if (st == SP_OK) {
        atomic_init(&g->refs, 1);
        g->n_rules = b->n_rules;
        g->n_sets = b->n_sets;
        g->n_el = b->done.n + b->n_alts + 2;
        g->el = sp_malloc(g->n_el * sizeof *g->el, SP_MEM_SERVER);
        g->alt_start = sp_malloc((b->n_alts + 1) * sizeof *g->alt_start, SP_MEM_SERVER);
        g->rule_first = sp_calloc((size_t)b->n_rules + 1, sizeof *g->rule_first, SP_MEM_SERVER);
        g->sets = sp_malloc(((size_t)b->n_sets + 1) * sizeof *g->sets, SP_MEM_SERVER);
        if (!g->el || !g->alt_start || !g->rule_first || !g->sets) st = SP_ERR_NOMEM;
    }
    if (st == SP_OK) {
        if (b->n_sets) memcpy(g->sets, b->sets, (size_t)b->n_sets * sizeof *g->sets);
        /* alternatives grouped by rule, in the order they were added */
        for (size_t i = 0; i < b->n_alts; i++) g->rule_first[b->alts[i].rule + 1]++;
        for (int r = 0; r < b->n_rules; r++) g->rule_first[r + 1] += g->rule_first[r];
        uint32_t *fill = sp_malloc(((size_t)b->n_rules + 1) * sizeof *fill, SP_MEM_SERVER);
        if (!fill) st = SP_ERR_NOMEM;
        if (fill) {
            memcpy(fill, g->rule_first, ((size_t)b->n_rules + 1) * sizeof *fill);
            g->el[0] = SYM_REF | (uint32_t)start;
            g->el[1] = 0;
            size_t pos = 2;
            for (size_t i = 0; i < b->n_alts; i++) {
                const struct galt *a = &b->alts[i];
                g->alt_start[fill[a->rule]++] = (uint32_t)pos;
                memcpy(g->el + pos, b->done.v + a->off, a->n * sizeof *g->el);
                pos += a->n;
                g->el[pos++] = 0;
            }
            sp_free(fill);
        }
    }
    sp_gb_free(b);
    if (st != SP_OK) {
        sp_grammar_free(g);
        return st;
    }
    *out = g;
    return SP_OK;
}

/* ---- token trie ---- */

struct tnode {
    int32_t child, next, tok;  // first child, next sibling, first token whose text ends here
    uint8_t byte;
};

struct sp_gtrie {
    struct tnode *n;
    int64_t n_nodes;
    int32_t *tok_next;  // further tokens with the same text
    int64_t n_tokens;
    int max_len;
};

struct tkey {
    const uint8_t *p;
    uint32_t len;
    int32_t id;
};

static int tkey_cmp(const void *a, const void *b) {
    const struct tkey *x = a, *y = b;
    uint32_t n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, n);
    if (c) return c;
    if (x->len != y->len) return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

void sp_gtrie_free(struct sp_gtrie *t) {
    if (!t) return;
    sp_free(t->n);
    sp_free(t->tok_next);
    sp_free(t);
}

enum sp_status sp_gtrie_new(const char *text, const int64_t *off, int64_t n_tokens, struct sp_gtrie **out) {
    *out = NULL;
    struct sp_gtrie *t = sp_calloc(1, sizeof *t, SP_MEM_SERVER);
    struct tkey *keys = sp_malloc(((size_t)n_tokens + 1) * sizeof *keys, SP_MEM_SERVER);
    int32_t *last = NULL, *path = NULL;
    enum sp_status st = SP_ERR_NOMEM;
    if (!t || !keys) goto done;
    t->n_tokens = n_tokens;
    t->tok_next = sp_malloc(((size_t)n_tokens + 1) * sizeof *t->tok_next, SP_MEM_SERVER);
    if (!t->tok_next) goto done;
    int64_t n_keys = 0, total = 0;
    for (int64_t i = 0; i < n_tokens; i++) {
        t->tok_next[i] = -1;
        int64_t len = off[i + 1] - off[i];
        if (len <= 0 || len > (1 << 20)) continue;
        keys[n_keys++] = (struct tkey){(const uint8_t *)text + off[i], (uint32_t)len, (int32_t)i};
        total += len;
        if (len > t->max_len) t->max_len = (int)len;
    }
    qsort(keys, (size_t)n_keys, sizeof *keys, tkey_cmp);
    t->n = sp_malloc(((size_t)total + 1) * sizeof *t->n, SP_MEM_SERVER);
    last = sp_malloc(((size_t)total + 1) * sizeof *last, SP_MEM_SERVER);
    path = sp_malloc(((size_t)t->max_len + 1) * sizeof *path, SP_MEM_SERVER);
    if (!t->n || !last || !path) goto done;
    t->n[0] = (struct tnode){-1, -1, -1, 0};
    last[0] = -1;
    t->n_nodes = 1;
    path[0] = 0;  // path[d]: the node of the current text's first d bytes
    uint32_t path_len = 0;
    const struct tkey *prev = NULL;
    for (int64_t k = 0; k < n_keys; k++) {
        const struct tkey *c = &keys[k];
        uint32_t lcp = 0;
        if (prev)
            while (lcp < c->len && lcp < prev->len && lcp < path_len && c->p[lcp] == prev->p[lcp]) lcp++;
        for (uint32_t d = lcp; d < c->len; d++) {
            int32_t parent = path[d], id = (int32_t)t->n_nodes++;
            t->n[id] = (struct tnode){-1, -1, -1, c->p[d]};
            last[id] = -1;
            if (last[parent] < 0)
                t->n[parent].child = id;
            else
                t->n[last[parent]].next = id;
            last[parent] = id;
            path[d + 1] = id;
        }
        path_len = c->len;
        struct tnode *end = &t->n[path[c->len]];
        if (end->tok < 0) {
            end->tok = c->id;
        } else {
            int32_t x = end->tok;
            while (t->tok_next[x] >= 0) x = t->tok_next[x];
            t->tok_next[x] = c->id;
        }
        prev = c;
    }
    st = SP_OK;
done:
    sp_free(keys);
    sp_free(last);
    sp_free(path);
    if (st != SP_OK) {
        sp_gtrie_free(t);
        return st;
    }
    *out = t;
    return SP_OK;
}

/* ---- matcher ---- */

struct sp_gmatch {
    const struct sp_grammar *g;
    /* interned configurations: words [accept, n_stacks, (len, positions...)...] */
    struct vec32 words;
    uint32_t *st_off;
    int32_t (*trans)[256];
    int32_t n_states, cap_states;
    int32_t *hash;  // ids + 1, open addressing
    uint32_t hcap;
    int32_t cur;
    /* working space of one step */
    struct vec32 work;     // stacks to close: [positions..., len, expansions] records
    struct vec32 found;    // closed stacks: [len, positions...] records
    struct vec32 key;      // the canonical configuration being built
    uint32_t *found_at;    // offsets of the records in found
    int n_found;
    bool accept;
    uint32_t *cur_stack;   // (SP_GRAMMAR_MAX_DEPTH + 1)
    /* depth-first walk of the trie */
    struct { int32_t child, state; } *frames;
    int cap_frames;
    /* the last masks made, by configuration: inside a string or a run of
     * whitespace the configuration repeats from token to token */
    struct {
        int32_t state;  // -1: empty
        int64_t count;
        uint8_t *ok;
    } masks[MASKS];
    const struct sp_gtrie *mask_trie;
    int next_mask;
};

static uint32_t hash_words(const uint32_t *w, size_t n) {
    uint32_t h = 2166136261u;
    for (size_t i = 0; i < n; i++) h = (h ^ w[i]) * 16777619u;
    return h ^ (h >> 15);
}

static size_t state_len(const struct sp_gmatch *m, int32_t s) {
    return (s + 1 < m->n_states ? m->st_off[s + 1] : (uint32_t)m->words.n) - m->st_off[s];
}

/* The id of the configuration in m->key, interned if new; DEAD for the
 * empty one; -3 when out of memory. */
static int32_t intern(struct sp_gmatch *m) {
    const uint32_t *k = m->key.v;
    size_t n = m->key.n;
    if (!k[0] && !k[1]) return DEAD;
    uint32_t h = hash_words(k, n);
    for (uint32_t i = h & (m->hcap - 1);; i = (i + 1) & (m->hcap - 1)) {
        int32_t id = m->hash[i] - 1;
        if (id < 0) break;
        if (state_len(m, id) == n && !memcmp(m->words.v + m->st_off[id], k, n * sizeof *k)) return id;
    }
    if (m->n_states == m->cap_states) {
        int32_t cap = m->cap_states * 2;
        uint32_t *off = sp_realloc(m->st_off, (size_t)cap * sizeof *off);
        if (off) m->st_off = off;
        int32_t (*tr)[256] = off ? sp_realloc(m->trans, (size_t)cap * sizeof *tr) : NULL;
        if (!tr) return -3;
        m->trans = tr;
        m->cap_states = cap;
    }
    if ((uint32_t)(m->n_states + 1) * 2 > m->hcap) {
        uint32_t hcap = m->hcap * 2;
        int32_t *hv = sp_calloc(hcap, sizeof *hv, SP_MEM_SERVER);
        if (!hv) return -3;
        for (int32_t s = 0; s < m->n_states; s++) {
            uint32_t j = hash_words(m->words.v + m->st_off[s], state_len(m, s)) & (hcap - 1);
            while (hv[j]) j = (j + 1) & (hcap - 1);
            hv[j] = s + 1;
        }
        sp_free(m->hash);
        m->hash = hv;
        m->hcap = hcap;
    }
    int32_t id = m->n_states;
    m->st_off[id] = (uint32_t)m->words.n;
    for (size_t i = 0; i < n; i++)
        if (!vec_push(&m->words, k[i])) return -3;
    for (int b = 0; b < 256; b++) m->trans[id][b] = UNKNOWN;
    uint32_t i = h & (m->hcap - 1);
    while (m->hash[i]) i = (i + 1) & (m->hcap - 1);
    m->hash[i] = id + 1;
    m->n_states++;
    return id;
}

/* Queues a stack to close: its positions, then its length and how many
 * expansions led to it without reading a byte. */
static bool work_push(struct sp_gmatch *m, const uint32_t *st, uint32_t len, uint32_t expand) {
    for (uint32_t i = 0; i < len; i++)
        if (!vec_push(&m->work, st[i])) return false;
    return vec_push(&m->work, len) && vec_push(&m->work, expand);
}

/* Closes every queued stack: expands references and pops finished
 * alternatives until each stack's top is a byte class (kept in m->found) or
 * the stack is empty (the text is a sentence). */
static bool close_work(struct sp_gmatch *m) {
    const struct sp_grammar *g = m->g;
    uint32_t *cur = m->cur_stack;
    while (m->work.n) {
        uint32_t expand = m->work.v[--m->work.n];
        uint32_t len = m->work.v[--m->work.n];
        m->work.n -= len;
        memcpy(cur, m->work.v + m->work.n, len * sizeof *cur);
        for (;;) {
            if (len == 0) {
                m->accept = true;
                break;
            }
            uint32_t p = cur[len - 1], sym = g->el[p];
            if (sym == 0) {  // an alternative is finished: return
                len--;
                continue;
            }
            if (SYM_KIND(sym) == SYM_SET) {
                if (m->n_found == SP_GRAMMAR_MAX_STACKS) break;
                m->found_at[m->n_found++] = (uint32_t)m->found.n;
                if (!vec_push(&m->found, len)) return false;
                for (uint32_t i = 0; i < len; i++)
                    if (!vec_push(&m->found, cur[i])) return false;
                break;
            }
            /* a reference: the return position replaces it (nothing when the
             * reference ends its alternative), then each alternative is pushed */
            if (expand >= SP_GRAMMAR_MAX_EXPAND) break;
            if (g->el[p + 1] == 0)
                len--;
            else
                cur[len - 1] = p + 1;
            if (len + 1 > SP_GRAMMAR_MAX_DEPTH) break;
            uint32_t r = SYM_ARG(sym), a0 = g->rule_first[r], a1 = g->rule_first[r + 1];
            if (a0 == a1) break;  // a rule with no alternatives matches nothing
            for (uint32_t a = a1 - 1; a > a0; a--) {
                cur[len] = g->alt_start[a];
                if (!work_push(m, cur, len + 1, expand + 1)) return false;
            }
            cur[len++] = g->alt_start[a0];
            expand++;
        }
    }
    return true;
}

static const uint32_t *found_rec(const struct sp_gmatch *m, int i) { return m->found.v + m->found_at[i]; }

static int rec_cmp(const uint32_t *a, const uint32_t *b) {
    if (a[0] != b[0]) return a[0] < b[0] ? -1 : 1;
    return memcmp(a + 1, b + 1, a[0] * sizeof *a);
}

/* The configuration of the closed stacks, in canonical order, interned. */
static int32_t intern_found(struct sp_gmatch *m) {
    /* insertion sort of the record offsets (a handful of stacks), dropping duplicates */
    int n = 0;
    for (int i = 0; i < m->n_found; i++) {
        uint32_t at = m->found_at[i];
        int j = n, c = 1;
        while (j > 0 && (c = rec_cmp(m->found.v + m->found_at[j - 1], m->found.v + at)) > 0) j--;
        if (j > 0 && c == 0) continue;
        memmove(m->found_at + j + 1, m->found_at + j, (size_t)(n - j) * sizeof *m->found_at);
        m->found_at[j] = at;
        n++;
    }
    m->n_found = n;
    m->key.n = 0;
    if (!vec_push(&m->key, m->accept) || !vec_push(&m->key, (uint32_t)n)) return -3;
    for (int i = 0; i < n; i++) {
        const uint32_t *r = found_rec(m, i);
        for (uint32_t k = 0; k <= r[0]; k++)
            if (!vec_push(&m->key, r[k])) return -3;
    }
    return intern(m);
}

static void step_begin(struct sp_gmatch *m) {
    m->work.n = m->found.n = 0;
    m->n_found = 0;
    m->accept = false;
}

/* The configuration after reading byte c in configuration s (computed and
 * remembered the first time). */
static int32_t step(struct sp_gmatch *m, int32_t s, unsigned c) {
    int32_t t = m->trans[s][c];
    if (t != UNKNOWN) return t;
    step_begin(m);
    const struct sp_grammar *g = m->g;
    uint32_t off = m->st_off[s] + 2, n = m->words.v[m->st_off[s] + 1];
    bool ok = true;
    for (uint32_t i = 0; i < n && ok; i++) {
        const uint32_t *w = m->words.v + off;  // [len, positions...]; re-read: words do not move here
        uint32_t len = w[0], top = w[len];
        off += len + 1;
        if (!sp_gset_has(&g->sets[SYM_ARG(g->el[top])], c)) continue;
        memcpy(m->cur_stack, w + 1, len * sizeof *m->cur_stack);
        m->cur_stack[len - 1] = top + 1;
        ok = work_push(m, m->cur_stack, len, 0) && close_work(m);
    }
    t = ok ? intern_found(m) : -3;
    if (t == -3) return DEAD;  // out of memory: refuse the byte, remember nothing
    m->trans[s][c] = t;
    return t;
}

static int32_t initial_state(struct sp_gmatch *m) {
    step_begin(m);
    uint32_t start = 0;  // el[0] references the start rule
    if (!work_push(m, &start, 1, 0) || !close_work(m)) return -3;
    return intern_found(m);
}

/* Drops every remembered configuration but the current one. */
static bool flush(struct sp_gmatch *m) {
    size_t n = state_len(m, m->cur);
    m->key.n = 0;
    for (size_t i = 0; i < n; i++)
        if (!vec_push(&m->key, m->words.v[m->st_off[m->cur] + i])) return false;
    m->words.n = 0;
    m->n_states = 0;
    for (int i = 0; i < MASKS; i++) m->masks[i].state = -1;
    memset(m->hash, 0, m->hcap * sizeof *m->hash);
    m->cur = intern(m);
    return m->cur >= 0;
}

void sp_gmatch_free(struct sp_gmatch *m) {
    if (!m) return;
    sp_free(m->words.v);
    sp_free(m->st_off);
    sp_free(m->trans);
    sp_free(m->hash);
    sp_free(m->work.v);
    sp_free(m->found.v);
    sp_free(m->key.v);
    sp_free(m->found_at);
    sp_free(m->cur_stack);
    sp_free(m->frames);
    for (int i = 0; i < MASKS; i++) sp_free(m->masks[i].ok);
    sp_free(m);
}

enum sp_status sp_gmatch_new(const struct sp_grammar *g, struct sp_gmatch **out) {
    *out = NULL;
    struct sp_gmatch *m = sp_calloc(1, sizeof *m, SP_MEM_SERVER);
    if (!m) return SP_ERR_NOMEM;
    m->g = g;
    for (int i = 0; i < MASKS; i++) m->masks[i].state = -1;
    m->cap_states = 64;
    m->hcap = 256;
    m->st_off = sp_malloc((size_t)m->cap_states * sizeof *m->st_off, SP_MEM_SERVER);
    m->trans = sp_malloc((size_t)m->cap_states * sizeof *m->trans, SP_MEM_SERVER);
    m->hash = sp_calloc(m->hcap, sizeof *m->hash, SP_MEM_SERVER);
    m->found_at = sp_malloc((SP_GRAMMAR_MAX_STACKS + 1) * sizeof *m->found_at, SP_MEM_SERVER);
    m->cur_stack = sp_malloc((SP_GRAMMAR_MAX_DEPTH + 1) * sizeof *m->cur_stack, SP_MEM_SERVER);
    if (!m->st_off || !m->trans || !m->hash || !m->found_at || !m->cur_stack) {
        sp_gmatch_free(m);
        return SP_ERR_NOMEM;
    }
    m->cur = initial_state(m);
    if (m->cur == -3) {
        sp_gmatch_free(m);
        return SP_ERR_NOMEM;
    }
    *out = m;
    return SP_OK;
}

enum sp_status sp_gmatch_reset(struct sp_gmatch *m) {
    if (m->n_states >= MAX_STATES && !flush(m)) return SP_ERR_NOMEM;
    m->cur = initial_state(m);
    return m->cur < 0 ? SP_ERR_NOMEM : SP_OK;
}

/* The configuration after the bytes, from the current one (DEAD: refused). */
static int32_t walk(struct sp_gmatch *m, const void *bytes, size_t n) {
    if (m->cur < 0) return DEAD;
    if (m->n_states >= MAX_STATES && !flush(m)) return DEAD;
    const unsigned char *p = bytes;
    int32_t s = m->cur;
    for (size_t i = 0; i < n && s >= 0; i++) s = step(m, s, p[i]);
    return s;
}

bool sp_gmatch_try(struct sp_gmatch *m, const void *bytes, size_t n) { return walk(m, bytes, n) >= 0; }

bool sp_gmatch_feed(struct sp_gmatch *m, const void *bytes, size_t n) {
    int32_t s = walk(m, bytes, n);
    if (s < 0) return false;
    m->cur = s;
    return true;
}

bool sp_gmatch_accepting(const struct sp_gmatch *m) { return m->cur >= 0 && m->words.v[m->st_off[m->cur]]; }

bool sp_gmatch_done(const struct sp_gmatch *m) {
    return sp_gmatch_accepting(m) && m->words.v[m->st_off[m->cur] + 1] == 0;
}

int64_t sp_gmatch_allowed(struct sp_gmatch *m, const struct sp_gtrie *t, uint8_t *ok) {
    if (m->cur < 0 || (m->n_states >= MAX_STATES && !flush(m))) {
        memset(ok, 0, (size_t)t->n_tokens);
        return 0;
    }
    if (m->mask_trie != t) {
        for (int i = 0; i < MASKS; i++) m->masks[i].state = -1;
        m->mask_trie = t;
    }
    for (int i = 0; i < MASKS; i++)
        if (m->masks[i].state == m->cur) {
            memcpy(ok, m->masks[i].ok, (size_t)t->n_tokens);
            return m->masks[i].count;
        }
    memset(ok, 0, (size_t)t->n_tokens);
    if (m->cap_frames < t->max_len + 1) {
        void *f = sp_realloc(m->frames, ((size_t)t->max_len + 1) * sizeof *m->frames);
        if (!f) return 0;
        m->frames = f;
        m->cap_frames = t->max_len + 1;
    }
    int64_t count = 0;
    int top = 0;
    m->frames[0].child = t->n[0].child;
    m->frames[0].state = m->cur;
    while (top >= 0) {
        int32_t c = m->frames[top].child;
        if (c < 0) {
            top--;
            continue;
        }
        const struct tnode *nd = &t->n[c];
        m->frames[top].child = nd->next;
        int32_t s = step(m, m->frames[top].state, nd->byte);
        if (s < 0) continue;
        for (int32_t k = nd->tok; k >= 0; k = t->tok_next[k]) {
            ok[k] = 1;
            count++;
        }
        if (nd->child >= 0) {
            top++;
            m->frames[top].child = nd->child;
            m->frames[top].state = s;
        }
    }
    /* remember it (a failed allocation only loses the memo) */
    int slot = m->next_mask;
    if (!m->masks[slot].ok) m->masks[slot].ok = sp_malloc((size_t)t->n_tokens, SP_MEM_SERVER);
    if (m->masks[slot].ok) {
        memcpy(m->masks[slot].ok, ok, (size_t)t->n_tokens);
        m->masks[slot].state = m->cur;
        m->masks[slot].count = count;
        m->next_mask = (slot + 1) % MASKS;
    }
    return count;
}
