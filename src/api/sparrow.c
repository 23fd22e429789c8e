/*
 * sparrow.c - the public C API (include/sparrow.h): a thin layer over the
 * model, its tokenizer and chat template, the memory planner and the
 * engine (runtime/engine.h), which does the generating.
 */
#include "sparrow.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/settings.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/log.h"
#include "core/status.h"
#include "model/model.h"
#include "runtime/engine.h"
#include "runtime/model_text.h"
#include "runtime/plan.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

#define SP_X(name, text) _Static_assert((int)SPARROW_##name == (int)SP_##name, "sparrow_status mirrors sp_status");
SP_STATUS_LIST(SP_X)
#undef SP_X
_Static_assert((int)SPARROW_STATUS_COUNT == (int)SP_STATUS_COUNT, "sparrow_status mirrors sp_status");
_Static_assert((int)SPARROW_LOG_ERROR == (int)SP_LOG_ERROR && (int)SPARROW_LOG_WARN == (int)SP_LOG_WARN &&
                   (int)SPARROW_LOG_INFO == (int)SP_LOG_INFO && (int)SPARROW_LOG_DEBUG == (int)SP_LOG_DEBUG,
               "sparrow_log_level mirrors sp_log_level");
_Static_assert(SPARROW_MAX_STOP <= SP_MAX_STOPS, "the engine takes every stop string");

/* How long a generation waits for news before looking again (ms). */
#define POLL_MS 100

struct sparrow_model {
    struct sp_model *m;
    struct sp_tokenizer *tok;    // NULL: the folder has no tokenizer.json
    struct sp_chat_template *ct; // NULL: no chat template; why in no_template
    char no_template[256];
    pthread_mutex_t mu; // guards loaded
    bool loaded;        // a context brought in the weights its plan keeps resident
    atomic_int n_contexts;
};

struct sparrow_context {
    struct sparrow_model *model;
    struct sp_engine *engine;
};

/* The detail of the last failing call on this thread (sparrow_last_error). */
static _Thread_local char last_error[1024];

/* Keeps the detail recorded for st (sp_errorf) as this thread's last error. */
static enum sparrow_status api_error(enum sp_status st) {
    snprintf(last_error, sizeof last_error, "%s", sp_error_msg());
    return (enum sparrow_status)st;
}

const char *sparrow_status_str(enum sparrow_status st) {
    if ((int)st < 0 || st >= SPARROW_STATUS_COUNT) return "unknown status";
    return sp_status_str((enum sp_status)st);
}

const char *sparrow_last_error(void) { return last_error[0] ? last_error : "no error"; }

void sparrow_set_log_level(enum sparrow_log_level level) {
    if ((int)level >= SPARROW_LOG_ERROR && level <= SPARROW_LOG_DEBUG) sp_log_set_level((enum sp_log_level)level);
}

void sparrow_free(void *p) { sp_free(p); }

/* ---- models ---- */

enum sparrow_status sparrow_model_open(const char *path_or_id, const struct sparrow_model_params *p,
                                       struct sparrow_model **out) {
    if (!out) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_model_open: out is NULL"));
    *out = NULL;
    if (!path_or_id || !*path_or_id) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_model_open: no model path or id"));
    enum sp_status st;
    char *found = NULL;
    struct sparrow_model *sm = sp_calloc(1, sizeof *sm, SP_MEM_MISC);
    if (!sm) return api_error(sp_errorf(SP_ERR_NOMEM, "out of memory"));
    pthread_mutex_init(&sm->mu, NULL);
    struct sp_settings set;
    const char *hub = p && p->hf_hub_cache ? p->hf_hub_cache : NULL;
    if (!hub) {
        if ((st = sp_settings_from_env(&set)) != SP_OK) goto fail;
        hub = set.hf_hub_cache;
    }
    if ((st = sp_model_resolve(path_or_id, hub, &found)) != SP_OK) goto fail;
    st = sp_model_open(found, &sm->m);
    sp_free(found);
    if (st != SP_OK) goto fail;
    const char *dir = sm->m->files->dir;
    if (sp_model_has_tokenizer(dir)) {
        if ((st = sp_model_tokenizer_load(dir, &sm->tok)) != SP_OK) goto fail;
        // a model without a chat template still serves prompts; sparrow_chat says why it cannot
        if (sp_model_chat_template_load(dir, p ? p->chat_template : NULL, &sm->ct) != SP_OK)
            snprintf(sm->no_template, sizeof sm->no_template, "%s", sp_error_msg());
    } else {
        snprintf(sm->no_template, sizeof sm->no_template, "%s has no tokenizer.json", dir);
    }
    *out = sm;
    return SPARROW_OK;
fail:
    sparrow_model_close(sm);
    return api_error(st);
}

void sparrow_model_close(struct sparrow_model *sm) {
    if (!sm) return;
    // contexts borrow the model; closing under them would free what they read
    SP_ASSERT(atomic_load(&sm->n_contexts) == 0);
    sp_chat_template_free(sm->ct);
    sp_tokenizer_free(sm->tok);
    sp_model_close(sm->m);
    pthread_mutex_destroy(&sm->mu);
    sp_free(sm);
}

void sparrow_model_info(const struct sparrow_model *sm, struct sparrow_model_info *out) {
    if (!out) return;
    memset(out, 0, sizeof *out);
    if (!sm) return;
    out->architecture = sm->m->arch.model_type;
    out->path = sm->m->files->dir;
    out->vocab_size = sm->m->arch.vocab;
    out->n_ctx_train = sm->m->arch.max_pos;
    out->n_layers = sm->m->arch.n_layers;
    out->has_tokenizer = sm->tok != NULL;
    out->has_chat_template = sm->ct != NULL;
}

/* ---- text and token ids ---- */

static enum sp_status need_tokenizer(const struct sparrow_model *sm, const char *what) {
    if (!sm) return sp_errorf(SP_ERR_ARG, "%s: the model is NULL", what);
    if (!sm->tok)
        return sp_errorf(SP_ERR_STATE, "%s: %s has no tokenizer.json; only token ids can be used", what,
                         sm->m->files->dir);
    return SP_OK;
}

/* Encodes text with the tokenizer's flags; ids->v is owned by the caller. */
static enum sp_status encode(const struct sparrow_model *sm, const char *text, size_t len, unsigned tok_flags,
                             struct sp_ids *ids) {
    enum sp_status st = sp_tokenizer_encode(sm->tok, text, len, tok_flags, ids);
    if (st != SP_OK) sp_ids_free(ids);
    return st;
}

enum sparrow_status sparrow_tokenize(const struct sparrow_model *sm, const char *text, size_t len, unsigned flags,
                                     int32_t **ids, int64_t *n_ids) {
    if (!ids || !n_ids) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_tokenize: ids or n_ids is NULL"));
    *ids = NULL;
    *n_ids = 0;
    enum sp_status st = need_tokenizer(sm, "sparrow_tokenize");
    if (st != SP_OK) return api_error(st);
    if (!text && len) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_tokenize: text is NULL"));
    if (flags & ~(unsigned)(SPARROW_TOKENIZE_ADD_SPECIAL | SPARROW_TOKENIZE_PARSE_SPECIAL))
        return api_error(sp_errorf(SP_ERR_ARG, "sparrow_tokenize: unknown flags 0x%x", flags));
    unsigned tf = (flags & SPARROW_TOKENIZE_ADD_SPECIAL ? SP_TOK_ADD_SPECIAL : 0) |
                  (flags & SPARROW_TOKENIZE_PARSE_SPECIAL ? SP_TOK_PARSE_SPECIAL : 0);
    struct sp_ids v = {0};
    if ((st = encode(sm, text ? text : "", len, tf, &v)) != SP_OK) return api_error(st);
    *ids = v.v;
    *n_ids = v.n;
    return SPARROW_OK;
}

enum sparrow_status sparrow_detokenize(const struct sparrow_model *sm, const int32_t *ids, int64_t n_ids,
                                       unsigned flags, char **text, size_t *len) {
    if (!text) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_detokenize: text is NULL"));
    *text = NULL;
    if (len) *len = 0;
    enum sp_status st = need_tokenizer(sm, "sparrow_detokenize");
    if (st != SP_OK) return api_error(st);
    if (n_ids < 0 || (!ids && n_ids))
        return api_error(
            sp_errorf(SP_ERR_ARG, "sparrow_detokenize: %lld ids at %p", (long long)n_ids, (const void *)ids));
    if (flags & ~(unsigned)SPARROW_DETOKENIZE_SKIP_SPECIAL)
        return api_error(sp_errorf(SP_ERR_ARG, "sparrow_detokenize: unknown flags 0x%x", flags));
    struct sp_buf b = SP_BUF_INIT;
    if ((st = sp_buf_reserve(&b, 1)) != SP_OK ||
        (st = sp_tokenizer_decode(sm->tok, ids, n_ids,
                                  flags & SPARROW_DETOKENIZE_SKIP_SPECIAL ? SP_TOK_SKIP_SPECIAL : 0, &b)) != SP_OK) {
        sp_buf_free(&b);
        return api_error(st);
    }
    if (len) *len = b.len;
    *text = sp_buf_take(&b);
    return SPARROW_OK;
}

/* Renders messages through the model's template; *out is owned by the caller. */
static enum sp_status render(const struct sparrow_model *sm, const struct sparrow_message *msgs, int64_t n,
                             bool add_generation_prompt, char **out, size_t *len) {
    *out = NULL;
    if (!sm) return sp_errorf(SP_ERR_ARG, "chat: the model is NULL");
    if (!sm->ct) return sp_errorf(SP_ERR_STATE, "chat: the model has no chat template (%s)", sm->no_template);
    if (n <= 0 || !msgs) return sp_errorf(SP_ERR_ARG, "chat: no messages");
    for (int64_t i = 0; i < n; i++)
        if (!msgs[i].role || !*msgs[i].role)
            return sp_errorf(SP_ERR_ARG, "chat: message %lld has no role", (long long)i);
    enum sp_status st = SP_OK;
    cJSON *arr = cJSON_CreateArray();
    for (int64_t i = 0; arr && i < n; i++) {
        cJSON *msg = cJSON_CreateObject();
        bool ok = msg && cJSON_AddStringToObject(msg, "role", msgs[i].role) &&
                  cJSON_AddStringToObject(msg, "content", msgs[i].content ? msgs[i].content : "");
        if (!ok || !cJSON_AddItemToArray(arr, msg)) {
            cJSON_Delete(msg);
            cJSON_Delete(arr);
            arr = NULL;
        }
    }
    if (!arr) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    struct sp_chat_request req = {.messages = arr, .add_generation_prompt = add_generation_prompt};
    size_t l = 0;
    st = sp_chat_render(sm->ct, &req, out, &l);
    cJSON_Delete(arr);
    if (len) *len = l;
    return st;
}

enum sparrow_status sparrow_chat_render(const struct sparrow_model *sm, const struct sparrow_message *msgs,
                                        int64_t n_msgs, bool add_generation_prompt, char **prompt, size_t *len) {
    if (!prompt) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_chat_render: prompt is NULL"));
    if (len) *len = 0;
    enum sp_status st = render(sm, msgs, n_msgs, add_generation_prompt, prompt, len);
    return st == SP_OK ? SPARROW_OK : api_error(st);
}

/* ---- contexts ---- */

enum sparrow_status sparrow_context_create(struct sparrow_model *sm, const struct sparrow_context_params *p,
                                           struct sparrow_context **out) {
    if (!out) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_context_create: out is NULL"));
    *out = NULL;
    if (!sm) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_context_create: the model is NULL"));
    static const struct sparrow_context_params defaults = {0};
    if (!p) p = &defaults;
    if (p->n_ctx < 0 || p->n_seq < 0 || p->n_batch < 0 || p->n_threads < 0)
        return api_error(sp_errorf(SP_ERR_ARG, "sparrow_context_create: negative n_ctx, n_seq, n_batch or n_threads"));
    struct sp_engine_params ep = {
        .n_slots = p->n_seq, .n_ctx = p->n_ctx, .batch_tokens = p->n_batch, .n_threads = p->n_threads};
    if (p->kv_type && !sp_kv_type_from_name(p->kv_type, &ep.kv_type))
        return api_error(
            sp_errorf(SP_ERR_ARG, "sparrow_context_create: kv_type \"%s\" is not f16, bf16 or f32", p->kv_type));
    if (p->device && !sp_device_from_name(p->device, &ep.device))
        return api_error(sp_errorf(SP_ERR_ARG, "sparrow_context_create: device \"%s\" is not cpu or cuda", p->device));
    if (!sp_backend_ops(ep.device))
        return api_error(sp_errorf(SP_ERR_UNSUPPORTED,
                                   "sparrow_context_create: this build of sparrow has no %s backend (build with make "
                                   "CUDA=1 on a machine with nvcc)",
                                   sp_device_name(ep.device)));
    struct sp_plan_inputs in = {.ctx = ep.n_ctx,
                                .parallel = ep.n_slots,
                                .batch = ep.batch_tokens,
                                .kv_type = ep.kv_type,
                                .mem_limit = p->mem_limit,
                                .expert_cache = p->expert_cache,
                                .expert_cache_set = p->expert_cache > 0,
                                .device = ep.device,
                                .gpu_mem_limit = p->gpu_mem_limit};
    struct sp_plan plan;
    enum sp_status st = sp_plan_make(sm->m, &in, &plan);
    if (st != SP_OK) return api_error(st);
    /* the backend's layout for the copies and the expert cache (a device's: rows in order) */
    sp_interleave_fn layout = sp_ctx_interleave(ep.device);
    ep.expert_cache = plan.host_cache;
    ep.device_experts = plan.gpu_expert_cache;
    sp_expert_store_params_for(&ep.expert_params, ep.device, ep.device != SP_DEVICE_CPU);
    struct sparrow_context *c = sp_calloc(1, sizeof *c, SP_MEM_MISC);
    if (!c) return api_error(sp_errorf(SP_ERR_NOMEM, "out of memory"));
    // the weights are brought in once per model, before any engine reads them
    pthread_mutex_lock(&sm->mu);
    if (!sm->loaded) {
        struct sp_plan_load_params lp = {.interleave = layout};
        sp_plan_load(&plan, sm->m, &lp);
        sm->loaded = true;
    }
    pthread_mutex_unlock(&sm->mu);
    if ((st = sp_engine_create(sm->m, sm->tok, &ep, &c->engine)) != SP_OK) {
        sp_free(c);
        return api_error(st);
    }
    c->model = sm;
    atomic_fetch_add(&sm->n_contexts, 1);
    *out = c;
    return SPARROW_OK;
}

void sparrow_context_free(struct sparrow_context *c) {
    if (!c) return;
    sp_engine_free(c->engine);
    atomic_fetch_sub(&c->model->n_contexts, 1);
    sp_free(c);
}

/* ---- generation ---- */

struct sparrow_gen_params sparrow_gen_defaults(void) {
    struct sp_sampler_params d = sp_sampler_defaults();
    return (struct sparrow_gen_params){.max_tokens = 256,
                                       .temperature = d.temp,
                                       .top_k = d.top_k,
                                       .top_p = d.top_p,
                                       .min_p = d.min_p,
                                       .repeat_penalty = d.repeat_penalty,
                                       .presence_penalty = d.presence_penalty,
                                       .frequency_penalty = d.frequency_penalty,
                                       .seed = d.seed};
}

const char *sparrow_finish_str(enum sparrow_finish f) {
    switch (f) {
    case SPARROW_FINISH_STOP:
        return "stop";
    case SPARROW_FINISH_LENGTH:
        return "length";
    case SPARROW_FINISH_CANCELLED:
        return "cancelled";
    default:
        return "none";
    }
}

void sparrow_result_clear(struct sparrow_result *r) {
    if (!r) return;
    sp_free(r->text);
    sp_free(r->ids);
    memset(r, 0, sizeof *r);
}

/* The engine's request parameters for gp; the API's zeros mean "off". */
static enum sp_status gen_params(const struct sparrow_gen_params *gp, struct sp_gen_params *out) {
    memset(out, 0, sizeof *out);
    if (gp->max_tokens < 0) return sp_errorf(SP_ERR_ARG, "max_tokens is negative");
    if (gp->n_stop < 0 || gp->n_stop > SPARROW_MAX_STOP)
        return sp_errorf(SP_ERR_LIMIT, "%d stop strings; at most %d", gp->n_stop, SPARROW_MAX_STOP);
    if (gp->n_stop && !gp->stop) return sp_errorf(SP_ERR_ARG, "n_stop is %d but stop is NULL", gp->n_stop);
    struct sp_sampler_params *s = &out->sampling;
    *s = sp_sampler_defaults();
    s->temp = gp->temperature;
    s->top_k = gp->top_k;
    s->top_p = gp->top_p > 0 ? gp->top_p : 1.0f;
    s->min_p = gp->min_p;
    s->repeat_penalty = gp->repeat_penalty > 0 ? gp->repeat_penalty : 1.0f;
    s->presence_penalty = gp->presence_penalty;
    s->frequency_penalty = gp->frequency_penalty;
    s->seed = gp->seed;
    out->max_tokens = gp->max_tokens;
    for (int i = 0; i < gp->n_stop; i++) {
        if (!gp->stop[i] || !*gp->stop[i]) return sp_errorf(SP_ERR_ARG, "stop string %d is empty", i);
        out->stops[out->n_stops++] = gp->stop[i];
    }
    out->ignore_eos = gp->ignore_eos;
    out->top_logprobs = 0; // token records carry the sampled ids
    out->detok_flags = SP_TOK_SKIP_SPECIAL;
    return SP_OK;
}

static enum sparrow_finish finish_of(enum sp_finish f) {
    switch (f) {
    case SP_FINISH_STOP:
        return SPARROW_FINISH_STOP;
    case SP_FINISH_LENGTH:
        return SPARROW_FINISH_LENGTH;
    case SP_FINISH_CANCELLED:
        return SPARROW_FINISH_CANCELLED;
    default:
        return SPARROW_FINISH_NONE;
    }
}

/* Submits ids and follows the request to its end, handing news to cb. */
static enum sp_status run(struct sparrow_context *c, const int32_t *ids, int64_t n, const struct sparrow_gen_params *gp,
                          sparrow_stream_fn cb, void *user, struct sparrow_result *res) {
    struct sparrow_gen_params defaults = sparrow_gen_defaults();
    struct sp_gen_params g;
    enum sp_status st = gen_params(gp ? gp : &defaults, &g);
    if (st != SP_OK) return st;
    struct sp_req *r = NULL;
    if ((st = sp_engine_submit(c->engine, ids, n, &g, &r)) != SP_OK) return st;
    struct sp_buf text = SP_BUF_INIT, all = SP_BUF_INIT;
    struct sp_tok_list toks = {0};
    int32_t *got = NULL; // every sampled id
    int64_t n_got = 0, cap = 0;
    int32_t *news = NULL; // the ids of one poll
    struct sp_req_progress p;
    bool cancelled = false;
    do {
        if (!sp_req_poll(r, POLL_MS, &text, &toks, &p)) continue;
        if (toks.n > cap - n_got) {
            int64_t want = (n_got + toks.n) * 2;
            int32_t *v =
                got ? sp_realloc(got, (size_t)want * sizeof *v) : sp_malloc((size_t)want * sizeof *v, SP_MEM_MISC);
            int32_t *w =
                news ? sp_realloc(news, (size_t)want * sizeof *w) : sp_malloc((size_t)want * sizeof *w, SP_MEM_MISC);
            if (v) got = v;
            if (w) news = w;
            if (!v || !w) {
                st = sp_errorf(SP_ERR_NOMEM, "out of memory");
                break;
            }
            cap = want;
        }
        for (int64_t i = 0; i < toks.n; i++) got[n_got + i] = news[i] = toks.v[i].id;
        n_got += toks.n;
        if (text.len && sp_buf_append(&all, text.data, text.len) != SP_OK) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            break;
        }
        if (cb && !cancelled && (text.len || toks.n) && !cb(text.data ? text.data : "", text.len, news, toks.n, user)) {
            sp_req_cancel(r);
            cancelled = true;
        }
        sp_buf_clear(&text);
        toks.n = 0;
    } while (!p.finished);
    if (st != SP_OK) {
        sp_req_cancel(r);
    } else if (p.finish == SP_FINISH_ERROR) {
        st = sp_errorf(SP_ERR_STATE, "the generation failed: %s", p.error);
    } else if (res) {
        res->text = all.data ? sp_buf_take(&all) : sp_strdup("", SP_MEM_MISC);
        if (!res->text) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        } else {
            res->text_len = strlen(res->text);
            res->ids = got;
            got = NULL;
            res->n_tokens = n_got;
            /* a callback's stop stands even where the engine finished first (the poll that
             * delivered the last tokens can be the one it declined) */
            res->finish = cancelled ? SPARROW_FINISH_CANCELLED : finish_of(p.finish);
            res->prompt_tokens = p.prompt_tokens;
            res->cached_tokens = p.cached_tokens;
            res->prefill_s = p.prefill_s;
            res->decode_s = p.decode_s;
        }
    }
    sp_req_release(r);
    sp_free(got);
    sp_free(news);
    sp_tok_list_free(&toks);
    sp_buf_free(&text);
    sp_buf_free(&all);
    if (st != SP_OK) sparrow_result_clear(res);
    return st;
}

enum sparrow_status sparrow_generate_tokens(struct sparrow_context *c, const int32_t *ids, int64_t n_ids,
                                            const struct sparrow_gen_params *gp, sparrow_stream_fn cb, void *user,
                                            struct sparrow_result *res) {
    if (res) memset(res, 0, sizeof *res);
    if (!c) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_generate_tokens: the context is NULL"));
    if (n_ids > 0 && !ids) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_generate_tokens: ids is NULL"));
    enum sp_status st = run(c, ids, n_ids, gp, cb, user, res);
    return st == SP_OK ? SPARROW_OK : api_error(st);
}

enum sparrow_status sparrow_generate(struct sparrow_context *c, const char *prompt, const struct sparrow_gen_params *gp,
                                     sparrow_stream_fn cb, void *user, struct sparrow_result *res) {
    if (res) memset(res, 0, sizeof *res);
    if (!c) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_generate: the context is NULL"));
    if (!prompt) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_generate: the prompt is NULL"));
    enum sp_status st = need_tokenizer(c->model, "sparrow_generate");
    if (st != SP_OK) return api_error(st);
    struct sp_ids ids = {0};
    if ((st = encode(c->model, prompt, strlen(prompt), SP_TOK_ADD_SPECIAL, &ids)) != SP_OK) return api_error(st);
    st = run(c, ids.v, ids.n, gp, cb, user, res);
    sp_ids_free(&ids);
    return st == SP_OK ? SPARROW_OK : api_error(st);
}

enum sparrow_status sparrow_chat(struct sparrow_context *c, const struct sparrow_message *msgs, int64_t n_msgs,
                                 const struct sparrow_gen_params *gp, sparrow_stream_fn cb, void *user,
                                 struct sparrow_result *res) {
    if (res) memset(res, 0, sizeof *res);
    if (!c) return api_error(sp_errorf(SP_ERR_ARG, "sparrow_chat: the context is NULL"));
    char *prompt = NULL;
    size_t len = 0;
    struct sp_ids ids = {0};
    enum sp_status st = need_tokenizer(c->model, "sparrow_chat");
    if (st == SP_OK) st = render(c->model, msgs, n_msgs, true, &prompt, &len);
    // the template writes the special tokens as text; they must become their ids
    if (st == SP_OK) st = encode(c->model, prompt, len, SP_TOK_PARSE_SPECIAL, &ids);
    if (st == SP_OK) st = run(c, ids.v, ids.n, gp, cb, user, res);
    sp_ids_free(&ids);
    sp_free(prompt);
    return st == SP_OK ? SPARROW_OK : api_error(st);
}
