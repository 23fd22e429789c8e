/*
 * engine.c - continuous batching over the forward pass: one scheduler
 * thread owns the context; submitters talk to it through requests, each
 * with its own lock and condition variable.
 */
#include "runtime/engine.h"

#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/file.h"
#include "core/log.h"
#include "backend/cpu/kernels.h"
#include "model/inspect.h"
#include "runtime/grammar.h"
#include "tokenizer/detok.h"

const double sp_ttft_bounds[11] = {0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120};

struct sp_req {
    int32_t *prompt;  // (n_prompt)
    int64_t n_prompt;
    struct sp_gen_params gp;
    char *stops[SP_MAX_STOPS];  // owned copies
    char *scope;                // owned copy of gp.cache_scope ("" when none)
    uint64_t group;             // the requests of one sp_engine_submit_group share it (0: submitted alone)
    int group_size;             // how many (1: alone); the first of them prefills the prompt for all
    atomic_int refs;
    atomic_bool cancelled;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* under mu */
    struct sp_buf text;       // released text the submitter has not taken yet
    struct sp_tok_list toks;  // token records not taken yet
    struct sp_req_progress prog;
    double t_submit, t_start;
};

struct slot {
    struct sp_req *req;  // NULL: free
    int32_t *cache;      // (n_ctx) tokens whose KV this slot holds
    int64_t n_cache;
    char scope[SP_MAX_CACHE_SCOPE];  // the cache scope those tokens were computed for ("": shared)
    int64_t prompt_pos;  // next prompt token to prefill
    bool decoding;
    int32_t pending;     // sampled, to be fed next step
    int64_t n_gen;
    struct sp_sampler *smp;
    struct sp_detok *dt;  // created per request (flags differ)
    struct sp_buf held;   // detokenized text held back for stop strings
    int stop_hit;         // the stop string release_text last found, or -1
    uint64_t last_used;
    struct sp_gmatch *gm; // constrained requests: the grammar matcher, made on first use
    int lead;             // >= 0: a group's follower, waiting for slot `lead` to prefill the shared prompt
};

struct sp_engine {
    const struct sp_model *m;
    const struct sp_tokenizer *tok;
    struct sp_engine_params p;
    struct sp_ctx *ctx;
    struct sp_expert_store *experts;  // NULL: routed experts read through the mapping
    struct sp_expert_source source;   // the store as the context's expert source
    int64_t vocab;
    struct slot *slots;
    int32_t eos[16];
    int n_eos;
    /* step buffers, sized up front */
    int32_t *b_tok, *b_pos, *b_seq;
    bool *b_want;
    bool *b_snap;  // recurrent models: a prompt's state snapshot after this token
    int *b_slot_of_row;  // logits row -> slot
    int32_t *b_pick;     // (n_slots) each row's greedy choice, where the whole step samples greedily
    struct sp_cand *b_top;  // (n_slots, SP_TOP_K_MAX) each row's best logits, where every row samples from them
    float *logits;       // (n_slots, vocab)
    float *scratch;      // (vocab) for logprobs
    float *scratch2;     // (vocab) for constrained sampling
    char *tok_text;      // every token's text back to back (constraints), built on first use
    int64_t *tok_off;    // (vocab + 1) offsets into tok_text
    uint8_t *tok_special; // (vocab) 1: a special token, with tok_text
    struct sp_gtrie *trie;  // the token texts as a trie, with tok_text
    uint8_t *allowed;    // (vocab) tokens a constraint allows
    /* queue and stats, under mu */
    pthread_mutex_t mu;
    pthread_cond_t cv;
    struct sp_req **queue;  // (q_cap) a ring; a group's requests one after another
    int q_head, q_len, q_cap;
    int q_subs;             // submissions waiting (a group is one): at most queue_max
    uint64_t next_group;
    bool stop;
    struct sp_engine_stats st;
    uint64_t tick;
    uint64_t *layer_hits, *layer_misses;  // (n_layers) snapshot of the expert cache's, under mu
    pthread_t thread;
    bool thread_started;
    /* the model's files changed under it: every request fails from then on */
    atomic_bool failed;
    char fail_msg[512];  // written once, before failed is set
    double next_check;   // when to look at the files again (scheduler thread)
};

/* How often the scheduler looks at the model's files between faults. */
#define FILE_CHECK_S 0.25

const char *sp_finish_name(enum sp_finish f) {
    switch (f) {
    case SP_FINISH_STOP: return "stop";
    case SP_FINISH_LENGTH: return "length";
    case SP_FINISH_CANCELLED: return "cancelled";
    case SP_FINISH_ERROR: return "error";
    default: return "none";
    }
}

void sp_tok_list_free(struct sp_tok_list *l) {
    sp_free(l->v);
    memset(l, 0, sizeof *l);
}

static bool tok_list_push(struct sp_tok_list *l, const struct sp_tok_info *t) {
    if (l->n == l->cap) {
        int64_t cap = l->cap ? l->cap * 2 : 16;
        size_t bytes = (size_t)cap * sizeof *l->v;
        struct sp_tok_info *v = l->v ? sp_realloc(l->v, bytes) : sp_malloc(bytes, SP_MEM_SERVER);
        if (!v) return false;
        l->v = v;
        l->cap = cap;
    }
    l->v[l->n++] = *t;
    return true;
}

/* ---- requests ---- */

static void req_free(struct sp_req *r) {
    sp_grammar_free(r->gp.grammar);
    sp_free(r->prompt);
    sp_free(r->scope);
    for (int i = 0; i < SP_MAX_STOPS; i++) sp_free(r->stops[i]);
    sp_buf_free(&r->text);
    sp_tok_list_free(&r->toks);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->cv);
    sp_free(r);
}

void sp_req_release(struct sp_req *r) {
    if (r && atomic_fetch_sub(&r->refs, 1) == 1) req_free(r);
}

void sp_req_cancel(struct sp_req *r) { atomic_store(&r->cancelled, true); }

bool sp_req_poll(struct sp_req *r, int timeout_ms, struct sp_buf *text, struct sp_tok_list *toks,
                 struct sp_req_progress *p) {
    pthread_mutex_lock(&r->mu);
    if (!r->text.len && !r->toks.n && !r->prog.finished && timeout_ms > 0) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        ts.tv_sec += timeout_ms / 1000;
        ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
        pthread_cond_timedwait(&r->cv, &r->mu, &ts);
    }
    bool news = r->text.len || r->toks.n || r->prog.finished;
    if (r->text.len) sp_buf_append(text, r->text.data, r->text.len);
    sp_buf_clear(&r->text);
    if (toks)
        for (int64_t i = 0; i < r->toks.n; i++) tok_list_push(toks, &r->toks.v[i]);
    r->toks.n = 0;
    *p = r->prog;
    pthread_mutex_unlock(&r->mu);
    return news;
}

/* ---- engine ---- */

int sp_eos_ids(const struct sp_model *m, const struct sp_tokenizer *tok, int32_t *eos, int cap) {
    int n = 0;
    for (int i = 0; i < m->arch.n_eos && n < cap; i++) eos[n++] = m->arch.eos[i];
    if (tok && sp_tokenizer_eos(tok) >= 0 && n < cap) eos[n++] = sp_tokenizer_eos(tok);
    return n;
}

static void *engine_main(void *arg);

void sp_engine_stop(struct sp_engine *e) {
    if (!e || !e->thread_started) return;
    pthread_mutex_lock(&e->mu);
    e->stop = true;
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
    pthread_join(e->thread, NULL);
    e->thread_started = false;
}

const uint64_t *sp_engine_route_counts(const struct sp_engine *e) { return sp_ctx_route_counts(e->ctx); }

void sp_engine_free(struct sp_engine *e) {
    if (!e) return;
    sp_engine_stop(e);
    for (int i = 0; e->queue && i < e->q_len; i++) {
        struct sp_req *r = e->queue[(e->q_head + i) % e->q_cap];
        pthread_mutex_lock(&r->mu);
        r->prog.finished = true;
        r->prog.finish = SP_FINISH_CANCELLED;
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        sp_req_release(r);
    }
    for (int i = 0; e->slots && i < e->p.n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (s->req) {
            pthread_mutex_lock(&s->req->mu);
            s->req->prog.finished = true;
            s->req->prog.finish = SP_FINISH_CANCELLED;
            pthread_cond_broadcast(&s->req->cv);
            pthread_mutex_unlock(&s->req->mu);
            sp_req_release(s->req);
        }
        sp_free(s->cache);
        sp_sampler_free(s->smp);
        sp_detok_free(s->dt);
        sp_gmatch_free(s->gm);
        sp_buf_free(&s->held);
    }
    sp_free(e->slots);
    sp_free(e->queue);
    sp_free(e->b_tok);
    sp_free(e->b_pos);
    sp_free(e->b_seq);
    sp_free(e->b_want);
    sp_free(e->b_snap);
    sp_free(e->b_slot_of_row);
    sp_free(e->b_pick);
    sp_free(e->b_top);
    sp_free(e->logits);
    sp_free(e->scratch);
    sp_free(e->scratch2);
    sp_free(e->layer_hits);
    sp_free(e->layer_misses);
    sp_free(e->tok_text);
    sp_free(e->tok_off);
    sp_free(e->tok_special);
    sp_gtrie_free(e->trie);
    sp_free(e->allowed);
    sp_ctx_free(e->ctx);
    sp_expert_store_free(e->experts);
    pthread_mutex_destroy(&e->mu);
    pthread_cond_destroy(&e->cv);
    sp_free(e);
}

void sp_engine_params_resolve(struct sp_engine_params *p, const struct sp_model *m) {
    if (p->n_slots <= 0) p->n_slots = 1;
    if (p->batch_tokens <= 0) p->batch_tokens = SP_DEFAULT_BATCH;
    if (p->batch_tokens < p->n_slots) p->batch_tokens = p->n_slots;
    if (p->queue_max <= 0) p->queue_max = 64;
    if (p->n_ctx <= 0) p->n_ctx = m->arch.max_pos < 4096 ? m->arch.max_pos : 4096;
}

/* The context an engine of (resolved) parameters p runs on. */
static struct sp_ctx_params ctx_params(const struct sp_engine_params *p) {
    return (struct sp_ctx_params){.n_ctx = p->n_ctx, .n_seq = p->n_slots, .max_batch = p->batch_tokens,
                                  .kv_type = p->kv_type, .device = p->device, .n_threads = p->n_threads,
                                  .float_activations = p->float_activations, .device_experts = p->device_experts,
                                  .cpu_experts = p->cpu_experts, .no_prefetch = p->expert_params.no_prefetch,
                                  .graphs = p->graphs, .no_overlap = p->no_overlap, .n_ranks = p->n_ranks,
                                  .gpus = p->gpus, .group = p->group, .rank = p->rank, .lead = p->group != NULL,
                                  .expert_load = p->expert_load, .count_routes = p->count_routes};
}

enum sp_status sp_engine_follow(const struct sp_model *m, const struct sp_engine_params *params) {
    struct sp_engine_params p = *params;
    sp_engine_params_resolve(&p, m);
    struct sp_ctx_params cp = ctx_params(&p);
    struct sp_ctx *c;
    enum sp_status st = sp_ctx_create(m, &cp, &c);
    if (st == SP_OK) st = sp_ctx_follow(c);
    sp_ctx_free(c);
    return st;
}

enum sp_status sp_engine_create(const struct sp_model *m, const struct sp_tokenizer *tok,
                                const struct sp_engine_params *params, struct sp_engine **out) {
    *out = NULL;
    struct sp_engine *e = sp_calloc(1, sizeof *e, SP_MEM_SERVER);
    if (!e) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    e->m = m;
    e->tok = tok;
    e->p = *params;
    sp_engine_params_resolve(&e->p, m);
    e->vocab = m->arch.vocab;
    struct sp_ctx_params cp = ctx_params(&e->p);
    enum sp_status st = SP_OK;
    if (e->p.expert_cache) {
        if ((st = sp_expert_store_create(m, e->p.expert_cache, &e->p.expert_params, &e->experts)) != SP_OK) goto fail;
        e->source = sp_expert_store_source(e->experts);
        cp.experts = &e->source;
    }
    st = sp_ctx_create(m, &cp, &e->ctx);
    if (st != SP_OK) goto fail;
    e->p.n_threads = sp_ctx_params(e->ctx)->n_threads;
    int S = e->p.n_slots;
    int64_t B = e->p.batch_tokens;
    e->slots = sp_calloc((size_t)S, sizeof *e->slots, SP_MEM_SERVER);
    e->q_cap = e->p.queue_max * e->p.n_slots;  // every waiting submission a group of n_slots
    e->queue = sp_calloc((size_t)e->q_cap, sizeof *e->queue, SP_MEM_SERVER);
    e->b_tok = sp_malloc((size_t)B * sizeof(int32_t), SP_MEM_SERVER);
    e->b_pos = sp_malloc((size_t)B * sizeof(int32_t), SP_MEM_SERVER);
    e->b_seq = sp_malloc((size_t)B * sizeof(int32_t), SP_MEM_SERVER);
    e->b_want = sp_malloc((size_t)B * sizeof(bool), SP_MEM_SERVER);
    e->b_snap = sp_malloc((size_t)B * sizeof(bool), SP_MEM_SERVER);
    e->b_slot_of_row = sp_malloc((size_t)S * sizeof(int), SP_MEM_SERVER);
    e->b_pick = sp_malloc((size_t)S * sizeof(int32_t), SP_MEM_SERVER);
    e->b_top = sp_malloc((size_t)S * SP_TOP_K_MAX * sizeof *e->b_top, SP_MEM_SERVER);
    e->logits = sp_malloc((size_t)S * (size_t)e->vocab * sizeof(float), SP_MEM_SERVER);
    e->scratch = sp_malloc((size_t)e->vocab * sizeof(float), SP_MEM_SERVER);
    e->scratch2 = sp_malloc((size_t)e->vocab * sizeof(float), SP_MEM_SERVER);
    e->layer_hits = sp_calloc((size_t)m->arch.n_layers, sizeof(uint64_t), SP_MEM_SERVER);
    e->layer_misses = sp_calloc((size_t)m->arch.n_layers, sizeof(uint64_t), SP_MEM_SERVER);
    e->st.n_layers = m->arch.n_layers;
    if (!e->layer_hits || !e->layer_misses) goto nomem;
    if (!e->scratch2 || !e->slots || !e->queue || !e->b_tok || !e->b_pos || !e->b_seq || !e->b_want || !e->b_snap ||
        !e->b_slot_of_row || !e->b_pick || !e->b_top || !e->logits || !e->scratch)
        goto nomem;
    struct sp_sampler_params sp = sp_sampler_defaults();
    sp.penalty_last_n = 4096;
    for (int i = 0; i < S; i++) {
        e->slots[i].lead = -1;
        e->slots[i].cache = sp_malloc((size_t)e->p.n_ctx * sizeof(int32_t), SP_MEM_SERVER);
        if (!e->slots[i].cache) goto nomem;
        if ((st = sp_sampler_create(&sp, e->vocab, &e->slots[i].smp)) != SP_OK) goto fail;
    }
    e->n_eos = sp_eos_ids(m, tok, e->eos, 16);
    e->st.n_slots = S;
    e->st.n_ctx = e->p.n_ctx;
    e->st.kv_bytes = sp_ctx_kv_bytes(e->ctx);
    if (pthread_create(&e->thread, NULL, engine_main, e) != 0) {
        st = sp_errorf(SP_ERR_STATE, "could not start the scheduler thread");
        goto fail;
    }
    e->thread_started = true;
    *out = e;
    return SP_OK;
nomem:
    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
fail:
    sp_engine_free(e);
    return st;
}

const struct sp_engine_params *sp_engine_params(const struct sp_engine *e) { return &e->p; }

/* A request for prompt[0 .. n) with gp, not queued yet (the prompt checked by the caller). */
static enum sp_status req_new(const int32_t *prompt, int64_t n, const struct sp_gen_params *gp, struct sp_req **out) {
    *out = NULL;
    struct sp_req *r = sp_calloc(1, sizeof *r, SP_MEM_SERVER);
    if (!r) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    atomic_init(&r->refs, 2);  // the submitter's and the engine's
    r->group_size = 1;
    r->prompt = sp_malloc((size_t)n * sizeof(int32_t), SP_MEM_SERVER);
    if (!r->prompt) {
        req_free(r);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    memcpy(r->prompt, prompt, (size_t)n * sizeof(int32_t));
    r->n_prompt = n;
    r->gp = *gp;
    r->gp.grammar = NULL;  // the request owns it once queued
    if (r->gp.n_stops > SP_MAX_STOPS) r->gp.n_stops = SP_MAX_STOPS;
    for (int i = 0; i < r->gp.n_stops; i++) {
        r->stops[i] = sp_strdup(gp->stops[i], SP_MEM_SERVER);
        if (!r->stops[i]) {
            req_free(r);
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
        }
        r->gp.stops[i] = r->stops[i];
    }
    if (r->gp.top_logprobs > SP_MAX_TOP_LOGPROBS) r->gp.top_logprobs = SP_MAX_TOP_LOGPROBS;
    if (!(r->scope = sp_strdup(gp->cache_scope ? gp->cache_scope : "", SP_MEM_SERVER))) {
        req_free(r);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    r->gp.cache_scope = r->scope;
    r->prog.prompt_tokens = n;
    r->t_submit = sp_now_s();
    *out = r;
    return SP_OK;
}

static enum sp_status submit_group(struct sp_engine *e, const int32_t *prompt, int64_t n,
                                   const struct sp_gen_params *gps, int n_seq, struct sp_req **out) {
    if (atomic_load(&e->failed)) return sp_errorf(SP_ERR_STATE, "%s", e->fail_msg);
    if (n_seq < 1 || n_seq > e->p.n_slots)
        return sp_errorf(SP_ERR_ARG, "a group of %d sequences (the engine decodes at most %d together)", n_seq,
                         e->p.n_slots);
    if (n <= 0) return sp_errorf(SP_ERR_ARG, "the prompt is empty");
    for (int i = 0; i < n_seq; i++)
        if (gps[i].cache_scope && strlen(gps[i].cache_scope) >= SP_MAX_CACHE_SCOPE)
            return sp_errorf(SP_ERR_ARG, "the cache scope is longer than %d bytes", SP_MAX_CACHE_SCOPE - 1);
    if (n >= e->p.n_ctx)
        return sp_errorf(SP_ERR_ARG, "the prompt has %lld tokens; the context holds %lld", (long long)n,
                         (long long)e->p.n_ctx);
    for (int64_t i = 0; i < n; i++)
        if (prompt[i] < 0 || prompt[i] >= e->vocab)
            return sp_errorf(SP_ERR_ARG, "token %d is outside the vocabulary of %lld", prompt[i], (long long)e->vocab);
    enum sp_status st = SP_OK;
    for (int i = 0; i < n_seq && st == SP_OK; i++) {
        st = req_new(prompt, n, &gps[i], &out[i]);
        if (st == SP_OK) out[i]->group_size = n_seq;
    }
    pthread_mutex_lock(&e->mu);
    if (st == SP_OK && e->q_subs == e->p.queue_max)
        st = sp_errorf(SP_ERR_LIMIT, "the server is busy: %d requests are already waiting", e->p.queue_max);
    if (st != SP_OK) {
        pthread_mutex_unlock(&e->mu);
        for (int i = 0; i < n_seq; i++) {
            if (out[i]) req_free(out[i]);
            out[i] = NULL;
        }
        return st;
    }
    uint64_t group = n_seq > 1 ? ++e->next_group : 0;
    for (int i = 0; i < n_seq; i++) {
        out[i]->group = group;
        out[i]->gp.grammar = gps[i].grammar;  // the request owns it from here
        e->queue[(e->q_head + e->q_len) % e->q_cap] = out[i];
        e->q_len++;
    }
    e->q_subs++;
    e->st.requests += (uint64_t)n_seq;
    pthread_cond_signal(&e->cv);
    pthread_mutex_unlock(&e->mu);
    return SP_OK;
}

enum sp_status sp_engine_submit_group(struct sp_engine *e, const int32_t *prompt, int64_t n,
                                      const struct sp_gen_params *gps, int n_seq, struct sp_req **out) {
    for (int i = 0; i < n_seq; i++) out[i] = NULL;
    enum sp_status st = submit_group(e, prompt, n, gps, n_seq, out);
    if (st != SP_OK)
        for (int i = 0; i < n_seq; i++) sp_grammar_free(gps[i].grammar);
    return st;
}

enum sp_status sp_engine_submit(struct sp_engine *e, const int32_t *prompt, int64_t n, const struct sp_gen_params *gp,
                                struct sp_req **out) {
    return sp_engine_submit_group(e, prompt, n, gp, 1, out);
}

void sp_engine_expert_layers(struct sp_engine *e, uint64_t *hits, uint64_t *misses) {
    pthread_mutex_lock(&e->mu);
    memcpy(hits, e->layer_hits, (size_t)e->st.n_layers * sizeof *hits);
    memcpy(misses, e->layer_misses, (size_t)e->st.n_layers * sizeof *misses);
    pthread_mutex_unlock(&e->mu);
}

void sp_engine_stats(struct sp_engine *e, struct sp_engine_stats *s) {
    pthread_mutex_lock(&e->mu);
    *s = e->st;
    s->queue_depth = e->q_subs;
    pthread_mutex_unlock(&e->mu);
}

/* ---- the scheduler ---- */

static int64_t common_prefix(const int32_t *a, int64_t na, const int32_t *b, int64_t nb) {
    int64_t n = na < nb ? na : nb, i = 0;
    while (i < n && a[i] == b[i]) i++;
    return i;
}

/* Moves queued requests into free slots, each into the slot whose cached
 * tokens share the longest prefix with its prompt (least recently used on
 * ties). Tokens cached for another scope count as no prefix at all: were
 * they reused, cached_tokens and the time to the first token would tell a
 * client how much of its prompt another client had sent. A group's
 * requests are admitted together, once as many slots are free: the first
 * prefills the prompt, the others wait for it (slot.lead) and then copy its
 * KV (start_followers). */
static void admit(struct sp_engine *e) {
    pthread_mutex_lock(&e->mu);
    while (e->q_len) {
        int k = e->queue[e->q_head]->group_size, n_free = 0;
        for (int i = 0; i < e->p.n_slots; i++) n_free += !e->slots[i].req;
        if (n_free < k) break;
        int lead = -1;
        for (int g = 0; g < k; g++) {
            int best = -1;
            int64_t best_common = -1;
            struct sp_req *r = e->queue[e->q_head];
            for (int i = 0; i < e->p.n_slots; i++) {
                struct slot *s = &e->slots[i];
                if (s->req) continue;
                int64_t c = !strcmp(s->scope, r->scope) ? common_prefix(s->cache, s->n_cache, r->prompt, r->n_prompt) : 0;
                /* at least the last prompt token is computed again: its logits start generation; a
                 * recurrent model's slot goes on only from its state's or its snapshot's position */
                if (c >= r->n_prompt) c = r->n_prompt - 1;
                c = sp_ctx_seq_resumable(e->ctx, i, c);
                if (c > best_common || (c == best_common && s->last_used < e->slots[best].last_used)) {
                    best = i;
                    best_common = c;
                }
            }
            SP_ASSERT(best >= 0);
            e->q_head = (e->q_head + 1) % e->q_cap;
            e->q_len--;
            struct slot *s = &e->slots[best];
            sp_ctx_seq_resume(e->ctx, best, best_common);
            s->req = r;
            s->lead = lead;
            if (g == 0) lead = best;
            memcpy(s->scope, r->scope, strlen(r->scope) + 1);
            s->n_cache = best_common;
            s->prompt_pos = best_common;
            s->decoding = false;
            s->n_gen = 0;
            s->stop_hit = -1;
            sp_buf_clear(&s->held);
            sp_sampler_configure(s->smp, &r->gp.sampling);
            for (int64_t i = 0; i < r->n_prompt; i++) sp_sampler_accept(s->smp, r->prompt[i]);
            sp_detok_free(s->dt);
            s->dt = NULL;
            if (e->tok && sp_detok_new(e->tok, r->gp.detok_flags, &s->dt) != SP_OK) s->dt = NULL;
            sp_gmatch_free(s->gm);
            s->gm = NULL;
            e->st.prompt_tokens += (uint64_t)r->n_prompt;
            if (s->lead < 0) e->st.cached_tokens += (uint64_t)best_common;  // a follower's: when it starts
            pthread_mutex_lock(&r->mu);
            r->prog.cached_tokens = best_common;
            r->t_start = sp_now_s();
            r->prog.queue_s = r->t_start - r->t_submit;
            pthread_mutex_unlock(&r->mu);
        }
        e->q_subs--;
    }
    pthread_mutex_unlock(&e->mu);
}

/* Starts a group's followers once their leader has prefilled the prompt:
 * each copies the KV of the prompt's positions but the last from the
 * leader's sequence and computes only that last token (its logits start
 * its own generation). A leader that ended before its prefill did (a
 * cancellation) leaves what it computed, and the followers prefill the rest
 * themselves. The leader's slot is read as it is now: its cached tokens
 * (in its scope) are what its KV holds, whoever holds the slot since. */
static void start_followers(struct sp_engine *e) {
    for (int i = 0; i < e->p.n_slots; i++) {
        struct slot *f = &e->slots[i];
        if (!f->req || f->lead < 0) continue;
        struct sp_req *r = f->req;
        const struct slot *l = &e->slots[f->lead];
        int64_t want = r->n_prompt - 1;
        int64_t c = !strcmp(l->scope, f->scope) ? common_prefix(l->cache, l->n_cache, r->prompt, want) : 0;
        bool prefilling = l->req && l->req->group == r->group && !l->decoding && l->prompt_pos < l->req->n_prompt;
        if (c < want && prefilling) continue;
        c = sp_ctx_seq_resumable(e->ctx, f->lead, c);  // the leader's snapshot, for a recurrent model
        if (c > f->n_cache) {
            sp_ctx_copy_seq(e->ctx, f->lead, i, c);
            memcpy(f->cache, r->prompt, (size_t)c * sizeof *f->cache);
            f->n_cache = c;
        }
        f->prompt_pos = f->n_cache;
        f->lead = -1;
        pthread_mutex_lock(&e->mu);
        e->st.cached_tokens += (uint64_t)f->n_cache;
        pthread_mutex_unlock(&e->mu);
        pthread_mutex_lock(&r->mu);
        r->prog.cached_tokens = f->n_cache;
        pthread_mutex_unlock(&r->mu);
    }
}

static void finish(struct sp_engine *e, struct slot *s, enum sp_finish why, bool by_eos, const char *err) {
    struct sp_req *r = s->req;
    pthread_mutex_lock(&r->mu);
    r->prog.finished = true;
    r->prog.finish = why;
    r->prog.stopped_by_eos = by_eos;
    r->prog.stop_index = why == SP_FINISH_STOP ? s->stop_hit : -1;
    r->prog.completion_tokens = s->n_gen;
    if (err) snprintf(r->prog.error, sizeof r->prog.error, "%s", err);
    pthread_cond_broadcast(&r->cv);
    pthread_mutex_unlock(&r->mu);
    s->req = NULL;
    s->lead = -1;
    s->last_used = ++e->tick;
    sp_gmatch_free(s->gm);  // it points into the request's grammar
    s->gm = NULL;
    sp_req_release(r);
}

/* Releases held text up to a stop string (true: found) or up to the longest
 * tail that could still begin one. */
static bool release_text(struct slot *s, bool final) {
    struct sp_req *r = s->req;
    size_t upto = s->held.len;
    bool stop = false;
    s->stop_hit = -1;
    for (int i = 0; i < r->gp.n_stops; i++) {
        const char *hit = memmem(s->held.data ? s->held.data : "", s->held.len, r->stops[i], strlen(r->stops[i]));
        if (hit && (size_t)(hit - s->held.data) < upto) {
            upto = (size_t)(hit - s->held.data);
            stop = true;
            s->stop_hit = i;
        }
    }
    if (!stop && !final) {
        for (int i = 0; i < r->gp.n_stops; i++) {
            size_t sl = strlen(r->stops[i]);
            for (size_t k = sl - 1 < s->held.len ? sl - 1 : s->held.len; k > 0; k--) {
                if (memcmp(s->held.data + s->held.len - k, r->stops[i], k) == 0) {
                    if (s->held.len - k < upto) upto = s->held.len - k;
                    break;
                }
            }
        }
    }
    if (upto) {
        pthread_mutex_lock(&r->mu);
        sp_buf_append(&r->text, s->held.data, upto);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        memmove(s->held.data, s->held.data + upto, s->held.len - upto);
        s->held.len -= upto;
        s->held.data[s->held.len] = 0;
    }
    if (stop) sp_buf_clear(&s->held);
    return stop;
}

/* log-softmax of the raw logits for the chosen token and the n_top best
 * (highest first, the lower id on ties, NaN passed over), in one pass over
 * the vocabulary that keeps the best found in order. */
static void token_info(struct sp_engine *e, const float *logits, int32_t id, int n_top, struct sp_tok_info *ti) {
    const struct sp_kernels *k = sp_kernels();
    float mx = logits[k->argmax(logits, e->vocab)];
    float lse = mx + (float)log(k->sum_exp(logits, e->vocab, mx));
    memset(ti, 0, sizeof *ti);
    ti->id = id;
    ti->logprob = logits[id] - lse;
    int found = 0;
    float lowest = -INFINITY;  // the last kept, once n_top are
    for (int64_t i = 0; n_top > 0 && i < e->vocab; i++) {
        float l = logits[i];
        if (found == n_top ? !(l > lowest) : isnan(l)) continue;
        int q = found < n_top ? found++ : n_top - 1;
        for (; q > 0 && l > logits[ti->top_id[q - 1]]; q--) ti->top_id[q] = ti->top_id[q - 1];
        ti->top_id[q] = (int32_t)i;
        if (found == n_top) lowest = logits[ti->top_id[n_top - 1]];
    }
    ti->n_top = found;
    for (int q = 0; q < found; q++) ti->top_logprob[q] = logits[ti->top_id[q]] - lse;
}

/* Every token's text, for checking candidates against the JSON constraint. */
static bool ensure_token_texts(struct sp_engine *e) {
    if (e->tok_off) return true;
    if (!e->tok) return false;
    struct sp_buf all = SP_BUF_INIT, one = SP_BUF_INIT;
    int64_t *off = sp_malloc((size_t)(e->vocab + 1) * sizeof *off, SP_MEM_SERVER);
    if (!off) return false;
    for (int64_t i = 0; i < e->vocab; i++) {
        off[i] = (int64_t)all.len;
        int32_t id = (int32_t)i;
        sp_buf_clear(&one);
        if (id < sp_tokenizer_vocab_size(e->tok) && sp_tokenizer_decode(e->tok, &id, 1, 0, &one) == SP_OK)
            sp_buf_append(&all, one.data, one.len);
    }
    off[e->vocab] = (int64_t)all.len;
    sp_buf_free(&one);
    if (all.failed) {
        sp_free(off);
        sp_buf_free(&all);
        return false;
    }
    e->tok_text = sp_buf_take(&all);
    e->tok_off = off;
    return true;
}

static bool is_eos(const struct sp_engine *e, int32_t tok) {
    for (int i = 0; i < e->n_eos; i++)
        if (tok == e->eos[i]) return true;
    return false;
}

/* Whether a constrained request may take token t next: the end of
 * sequence once the text is a sentence of its grammar; special tokens only
 * where their text is kept in the output. */
static bool constraint_allows(struct sp_engine *e, const struct slot *s, int32_t t) {
    if (is_eos(e, t)) return sp_gmatch_accepting(s->gm);
    if (e->tok_off[t + 1] == e->tok_off[t]) return false;
    if ((s->req->gp.detok_flags & SP_TOK_SKIP_SPECIAL) && e->tok_special[t]) return false;
    return sp_gmatch_try(s->gm, e->tok_text + e->tok_off[t], (size_t)(e->tok_off[t + 1] - e->tok_off[t]));
}

/* Samples a token the request's grammar allows: draw, and if the draw does
 * not fit, mask it and draw again (one check per token for a model that
 * follows the format); after a few misses, mask every token that does not
 * fit at once (a walk of the token trie) and draw from what is left.
 * Returns -1 when no token fits. */
static int32_t sample_constrained(struct sp_engine *e, struct slot *s, float *row) {
    for (int attempt = 0; attempt < 8; attempt++) {
        memcpy(e->scratch2, row, (size_t)e->vocab * sizeof(float));
        int32_t t = sp_sampler_sample(s->smp, e->scratch2);
        if (t < 0 || t >= e->vocab) break;
        if (constraint_allows(e, s, t)) return t;
        row[t] = -INFINITY;
    }
    sp_gmatch_allowed(s->gm, e->trie, e->allowed);
    float eos_logit[16];
    for (int k = 0; k < e->n_eos; k++) eos_logit[k] = row[e->eos[k]];
    bool skip_special = s->req->gp.detok_flags & SP_TOK_SKIP_SPECIAL, any = false;
    for (int64_t i = 0; i < e->vocab; i++) {
        if (!e->allowed[i] || (skip_special && e->tok_special[i])) row[i] = -INFINITY;
        any |= row[i] > -INFINITY;
    }
    bool accepting = sp_gmatch_accepting(s->gm);
    for (int k = 0; k < e->n_eos; k++) {
        row[e->eos[k]] = accepting ? eos_logit[k] : -INFINITY;
        any |= accepting && eos_logit[k] > -INFINITY;
    }
    if (!any) return -1;
    int32_t t = sp_sampler_sample(s->smp, row);
    return t >= 0 && t < e->vocab && constraint_allows(e, s, t) ? t : -1;
}

/* The matcher and token tables a constrained request needs; false when they
 * cannot be made. */
static bool constraint_ready(struct sp_engine *e, struct slot *s) {
    if (!ensure_token_texts(e)) return false;
    if (!e->trie && sp_gtrie_new(e->tok_text, e->tok_off, e->vocab, &e->trie) != SP_OK) return false;
    if (!e->allowed && !(e->allowed = sp_malloc((size_t)e->vocab, SP_MEM_SERVER))) return false;
    if (!e->tok_special) {
        if (!(e->tok_special = sp_malloc((size_t)e->vocab, SP_MEM_SERVER))) return false;
        for (int64_t i = 0; i < e->vocab; i++) e->tok_special[i] = sp_tokenizer_is_special(e->tok, (int32_t)i);
    }
    return s->gm || sp_gmatch_new(s->req->gp.grammar, &s->gm) == SP_OK;
}

/* Whether s's next token is the arg max of its logits as they are (a
 * choice the forward pass can make where it computed them). */
static bool greedy_only(const struct slot *s) {
    return !s->req->gp.grammar && s->req->gp.top_logprobs < 0 && sp_sampler_greedy(s->smp);
}

/* The k of s's sampling from its k best logits alone (sp_sampler_top_k, up
 * to SP_TOP_K_MAX and with no constraint or log-probabilities to report):
 * then the forward pass hands those back instead of the vocabulary's
 * logits. 0 otherwise. */
static int64_t top_only(const struct slot *s) {
    return s->req->gp.grammar || s->req->gp.top_logprobs >= 0 ? 0 : sp_sampler_top_k_upto(s->smp, SP_TOP_K_MAX);
}

/* After a forward pass: s's next token sampled from its logits row, or
 * where picked >= 0 (greedy_only, or drawn from its best logits) that one. */
static void after_logits(struct sp_engine *e, struct slot *s, float *row, int32_t picked) {
    struct sp_req *r = s->req;
    struct sp_tok_info ti;
    bool want_info = r->gp.top_logprobs >= 0;
    if (want_info) memcpy(e->scratch, row, (size_t)e->vocab * sizeof(float));
    int32_t tok;
    if (picked >= 0) {
        tok = picked;
    } else if (r->gp.grammar) {
        if (!constraint_ready(e, s)) {
            finish(e, s, SP_FINISH_ERROR, false, "the output constraint needs the tokenizer's token texts and memory");
            return;
        }
        tok = sample_constrained(e, s, row);
        if (tok < 0) {
            finish(e, s, SP_FINISH_STOP, false, NULL);
            return;
        }
        if (!is_eos(e, tok)) sp_gmatch_feed(s->gm, e->tok_text + e->tok_off[tok], (size_t)(e->tok_off[tok + 1] - e->tok_off[tok]));
    } else {
        tok = sp_sampler_sample(s->smp, row);
    }
    sp_sampler_accept(s->smp, tok);
    s->n_gen++;
    if (want_info) token_info(e, e->scratch, tok, r->gp.top_logprobs, &ti);
    double t = sp_now_s();
    pthread_mutex_lock(&r->mu);
    if (s->n_gen == 1) {
        r->prog.ttft_s = t - r->t_submit;
        r->prog.prefill_s = t - r->t_start;
        pthread_mutex_lock(&e->mu);
        int b = 0;
        while (b < 11 && r->prog.ttft_s > sp_ttft_bounds[b]) b++;
        e->st.ttft_bucket[b]++;
        e->st.ttft_sum += r->prog.ttft_s;
        pthread_mutex_unlock(&e->mu);
    } else {
        r->prog.decode_s = t - r->t_start - r->prog.prefill_s;
    }
    r->prog.completion_tokens = s->n_gen;
    if (want_info) tok_list_push(&r->toks, &ti);
    pthread_mutex_unlock(&r->mu);
    pthread_mutex_lock(&e->mu);
    e->st.generated_tokens++;
    pthread_mutex_unlock(&e->mu);

    bool eos = false;
    for (int i = 0; i < e->n_eos && !r->gp.ignore_eos; i++) eos |= tok == e->eos[i];
    if (eos) {
        if (s->dt) {
            struct sp_buf tail = SP_BUF_INIT;
            sp_detok_flush(s->dt, &tail);
            sp_buf_append(&s->held, tail.data, tail.len);
            sp_buf_free(&tail);
        }
        bool stop = release_text(s, true);
        finish(e, s, SP_FINISH_STOP, !stop, NULL);
        return;
    }
    if (s->dt) {
        size_t before = s->held.len;
        if (sp_detok_push(s->dt, tok, &s->held) != SP_OK) s->held.len = before;
    }
    if (release_text(s, false)) {
        finish(e, s, SP_FINISH_STOP, false, NULL);
        return;
    }
    bool full = s->n_cache + 1 >= e->p.n_ctx;
    bool constraint_done = r->gp.grammar && sp_gmatch_done(s->gm);
    if ((r->gp.max_tokens > 0 && s->n_gen >= r->gp.max_tokens) || full || constraint_done) {
        if (s->dt) {
            struct sp_buf tail = SP_BUF_INIT;
            sp_detok_flush(s->dt, &tail);
            sp_buf_append(&s->held, tail.data, tail.len);
            sp_buf_free(&tail);
        }
        bool stop = release_text(s, true) || constraint_done;
        finish(e, s, stop ? SP_FINISH_STOP : SP_FINISH_LENGTH, false, NULL);
        return;
    }
    s->pending = tok;
    s->decoding = true;
}

/* Ends every request, running or queued, with an error. */
static void fail_all(struct sp_engine *e, const char *msg) {
    for (int i = 0; i < e->p.n_slots; i++)
        if (e->slots[i].req) {
            e->slots[i].n_cache = 0;
            finish(e, &e->slots[i], SP_FINISH_ERROR, false, msg);
        }
    pthread_mutex_lock(&e->mu);
    while (e->q_len) {
        struct sp_req *r = e->queue[e->q_head];
        e->q_head = (e->q_head + 1) % e->q_cap;
        e->q_len--;
        pthread_mutex_lock(&r->mu);
        r->prog.finished = true;
        r->prog.finish = SP_FINISH_ERROR;
        snprintf(r->prog.error, sizeof r->prog.error, "%s", msg);
        pthread_cond_broadcast(&r->cv);
        pthread_mutex_unlock(&r->mu);
        sp_req_release(r);
    }
    e->q_subs = 0;
    pthread_mutex_unlock(&e->mu);
}

/* Whether the model's files changed under the engine (a read past a
 * truncated file's end, answered with zeros by the fault guard, or a size
 * or time that moved). Then nothing computed from them can be trusted:
 * every request fails, now and from now on, with a message naming the
 * file, and sp_engine_failed tells the owner, who should stop or reload. */
static bool check_files(struct sp_engine *e) {
    if (atomic_load(&e->failed)) return true;
    char why[400];
    if (!sp_model_files_changed(e->m->files, why, sizeof why)) return false;
    snprintf(e->fail_msg, sizeof e->fail_msg, "the model's files changed while in use (%s); restart to load them again",
             why);
    atomic_store(&e->failed, true);
    sp_log(SP_LOG_ERROR, "%s", e->fail_msg);
    fail_all(e, e->fail_msg);
    return true;
}

bool sp_engine_failed(struct sp_engine *e, char *msg, size_t cap) {
    if (!atomic_load(&e->failed)) return false;
    if (msg && cap) snprintf(msg, cap, "%s", e->fail_msg);
    return true;
}

/* One step: cancellations, admissions, a batch of decode tokens and prefill
 * chunks, one forward pass, sampling. Returns false when there was nothing to do. */
static bool step(struct sp_engine *e) {
    for (int i = 0; i < e->p.n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (s->req && atomic_load(&s->req->cancelled)) finish(e, s, SP_FINISH_CANCELLED, false, NULL);
    }
    admit(e);
    start_followers(e);
    int64_t n = 0, B = e->p.batch_tokens, n_decode = 0, n_prefill = 0;
    int rows = 0;
    /* decoding slots first: one token each keeps every stream moving */
    for (int i = 0; i < e->p.n_slots; i++) {
        struct slot *s = &e->slots[i];
        if (!s->req || !s->decoding) continue;
        e->b_tok[n] = s->pending;
        e->b_pos[n] = (int32_t)s->n_cache;
        e->b_seq[n] = i;
        e->b_want[n] = true;
        e->b_snap[n] = false;
        e->b_slot_of_row[rows++] = i;
        s->cache[s->n_cache++] = s->pending;
        n++;
        n_decode++;
    }
    /* then prefill chunks, oldest requests first, in what is left of the budget */
    for (int i = 0; i < e->p.n_slots && n < B; i++) {
        struct slot *s = &e->slots[i];
        if (!s->req || s->decoding || s->lead >= 0) continue;
        struct sp_req *r = s->req;
        int64_t k = r->n_prompt - s->prompt_pos;
        if (k > B - n) k = B - n;
        for (int64_t j = 0; j < k; j++) {
            e->b_tok[n] = r->prompt[s->prompt_pos];
            e->b_pos[n] = (int32_t)s->n_cache;
            e->b_seq[n] = i;
            e->b_want[n] = s->prompt_pos == r->n_prompt - 1;
            /* the state of all but the last prompt token: what the same prompt, a follower or a
             * next turn goes on from (the last token's logits are computed again) */
            e->b_snap[n] = s->prompt_pos == r->n_prompt - 2;
            if (e->b_want[n]) e->b_slot_of_row[rows++] = i;
            s->cache[s->n_cache++] = r->prompt[s->prompt_pos];
            s->prompt_pos++;
            n++;
            n_prefill++;
        }
    }
    if (!n) return false;
    bool greedy = rows > 0;
    for (int k = 0; k < rows && greedy; k++) greedy = greedy_only(&e->slots[e->b_slot_of_row[k]]);
    /* or each row greedy or sampling from its best logits: as many of
     * those as the widest top-k (a greedy row takes the first) */
    int64_t top_k = 0;
    for (int k = 0; k < rows && !greedy; k++) {
        const struct slot *s = &e->slots[e->b_slot_of_row[k]];
        int64_t sk = greedy_only(s) ? 1 : top_only(s);
        top_k = sk && (k == 0 || top_k) ? (sk > top_k ? sk : top_k) : 0;
        if (!top_k) break;
    }
    double t0 = sp_now_s();
    struct sp_batch b = {.n = n, .tokens = e->b_tok, .pos = e->b_pos, .seq = e->b_seq, .want_logits = e->b_want,
                         .snapshot = e->b_snap, .argmax = greedy ? e->b_pick : NULL, .top = top_k ? e->b_top : NULL,
                         .top_k = top_k};
    uint64_t faults = sp_map_faults();
    enum sp_status st = sp_ctx_forward(e->ctx, &b, e->logits);
    /* a fault during the pass read zeros for weights: no token of it may go out */
    if (sp_map_faults() != faults && check_files(e)) return true;
    double dt = sp_now_s() - t0;
    pthread_mutex_lock(&e->mu);
    e->st.steps++;
    e->st.decode_tokens += (uint64_t)n_decode;
    e->st.prefill_tokens += (uint64_t)n_prefill;
    /* split the step's time by token share */
    e->st.decode_s += dt * (double)n_decode / (double)n;
    e->st.prefill_s += dt * (double)n_prefill / (double)n;
    struct sp_expert_store_stats es;
    if (e->experts) {
        sp_expert_store_stats(e->experts, &es);
        memcpy(e->layer_hits, es.layer_hits, (size_t)e->st.n_layers * sizeof(uint64_t));
        memcpy(e->layer_misses, es.layer_misses, (size_t)e->st.n_layers * sizeof(uint64_t));
        es.layer_hits = es.layer_misses = NULL;
        e->st.experts = es;
        e->st.has_experts = true;
    }
    e->st.has_device_experts = sp_ctx_tier_stats(e->ctx, &e->st.device_experts);
    pthread_mutex_unlock(&e->mu);
    if (st != SP_OK) {
        /* an expert read that ran into the end of a truncated file: the
         * change is what to report, and it fails the engine for good */
        if (check_files(e)) return true;
        char msg[256];
        snprintf(msg, sizeof msg, "%s", sp_error_msg());
        sp_log(SP_LOG_ERROR, "forward pass failed: %s", msg);
        for (int i = 0; i < e->p.n_slots; i++)
            if (e->slots[i].req) {
                e->slots[i].n_cache = 0;
                finish(e, &e->slots[i], SP_FINISH_ERROR, false, msg);
            }
        return true;
    }
    for (int k = 0; k < rows; k++) {
        struct slot *s = &e->slots[e->b_slot_of_row[k]];
        if (!s->req) continue;
        int32_t picked = greedy ? e->b_pick[k] : -1;
        const struct sp_cand *top = e->b_top + k * top_k;
        if (top_k) picked = greedy_only(s) ? top[0].id : sp_sampler_sample_top(s->smp, top, top_k);
        after_logits(e, s, e->logits + (size_t)k * (size_t)e->vocab, picked);
    }
    return true;
}

static void *engine_main(void *arg) {
    struct sp_engine *e = arg;
    for (;;) {
        pthread_mutex_lock(&e->mu);
        bool stop = e->stop;
        pthread_mutex_unlock(&e->mu);
        if (stop) break;
        if (!atomic_load(&e->failed) && sp_now_s() >= e->next_check) {
            check_files(e);
            e->next_check = sp_now_s() + FILE_CHECK_S;
        }
        if (atomic_load(&e->failed)) fail_all(e, e->fail_msg);
        bool worked = !atomic_load(&e->failed) && step(e);
        int active = 0;
        int64_t used = 0;
        for (int i = 0; i < e->p.n_slots; i++) {
            active += e->slots[i].req != NULL;
            used += e->slots[i].n_cache;
        }
        pthread_mutex_lock(&e->mu);
        e->st.active_slots = active;
        e->st.kv_tokens_used = used;
        if (!worked && !e->stop && (e->q_len == 0 || active == e->p.n_slots)) {
            struct timespec ts;
            clock_gettime(CLOCK_REALTIME, &ts);
            ts.tv_nsec += 50 * 1000000L;  // wake up to notice cancellations
            if (ts.tv_nsec >= 1000000000L) ts.tv_sec++, ts.tv_nsec -= 1000000000L;
            pthread_cond_timedwait(&e->cv, &e->mu, &ts);
        }
        pthread_mutex_unlock(&e->mu);
    }
    return NULL;
}

/* ---- what the model is, for the layers above ---- */

_Static_assert(SP_CLASS_COUNT <= SP_ENGINE_MAX_CLASSES, "sp_engine_info holds every role class");
_Static_assert(sizeof((struct sp_engine){0}.eos) <= sizeof((struct sp_engine_info){0}.eos), "sp_engine_info holds every eos id");

void sp_engine_info(const struct sp_engine *e, struct sp_engine_info *out) {
    const struct sp_model *m = e->m;
    memset(out, 0, sizeof *out);
    out->architecture = m->arch.model_type;
    out->model_dir = m->files->dir;
    out->vocab = m->arch.vocab;
    out->n_ctx = e->p.n_ctx;
    out->n_ctx_train = m->arch.max_pos;
    out->n_layers = m->arch.n_layers;
    out->layer_moe = m->arch.layer_moe;
    out->n_eos = e->n_eos;
    memcpy(out->eos, e->eos, (size_t)e->n_eos * sizeof *e->eos);
    out->file_bytes = m->files->total_bytes;
    struct sp_model_stats st;
    sp_model_stats(m, &st);
    out->tensor_bytes = st.total_bytes;
    out->bytes_per_token = st.active_bytes;
    for (int k = 0; k < SP_CLASS_COUNT; k++) {
        if (!st.bytes[k]) continue;
        // an expert cache given to the context serves every routed expert (sp_ctx_create)
        bool routed = k == SP_CLASS_ROUTED_EXPERTS;
        const char *placement = routed && e->p.device_experts ? "device_expert_cache"
                                : routed && e->p.expert_cache ? "expert_cache"
                                : e->p.device != SP_DEVICE_CPU ? "device"
                                                               : "mapped";
        out->classes[out->n_classes++] = (struct sp_engine_class_bytes){
            .name = sp_role_class_name((enum sp_role_class)k), .bytes = st.bytes[k], .placement = placement};
    }
}
