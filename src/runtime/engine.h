/*
 * engine.h - the scheduler: `n_slots` sequences decode together through one
 * forward pass per step (continuous batching); new requests prefill in
 * chunks between steps; a bounded queue holds what does not fit yet; each
 * slot keeps the tokens whose KV it holds, so a request sharing a prefix
 * with an earlier one (the next turn of a chat) skips prefilling it, when
 * both were submitted in the same cache scope (sp_gen_params.cache_scope).
 * Requests submitted as a group (sp_engine_submit_group: n choices of one
 * prompt) prefill their prompt once.
 *
 *     struct sp_engine *e;
 *     struct sp_engine_params ep = {.n_slots = 4, .n_ctx = 4096};
 *     sp_engine_create(model, tokenizer, &ep, &e);      // starts the scheduler thread
 *     struct sp_req *r;
 *     sp_engine_submit(e, prompt_ids, n, &gen_params, &r);
 *     struct sp_buf text = SP_BUF_INIT;
 *     struct sp_req_progress p;
 *     while (sp_req_poll(r, 100, &text, NULL, &p), !p.finished) { send(text); sp_buf_clear(&text); }
 *     sp_req_release(r);
 *     sp_engine_free(e);
 *
 * A request is shared by the engine and its submitter and freed when both
 * have let go (sp_req_release by the submitter). sp_req_cancel may be called
 * from any thread; the generation stops within one step.
 */
#ifndef SP_RUNTIME_ENGINE_H
#define SP_RUNTIME_ENGINE_H

#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "model/expert_tier.h"
#include "runtime/experts.h"
#include "runtime/grammar.h"
#include "model/forward.h"
#include "runtime/sampler.h"
#include "tokenizer/tokenizer.h"

struct sp_engine_params {
    int n_slots;            // sequences decoded together (0: 1)
    int64_t n_ctx;          // positions per slot (0: the model's, capped at 4096)
    int64_t batch_tokens;   // tokens per forward step, decode and prefill chunks together (0: SP_DEFAULT_BATCH)
    int queue_max;          // requests waiting for a slot (0: 64)
    int n_threads;          // 0: physical cores
    enum sp_kv_type kv_type;
    enum sp_device device;  // where the forward pass runs (zero: the CPU)
    bool float_activations; // a device backend's products keep activations in float (--precision exact)
    bool graphs;            // a device backend replays small steps as graphs (--cuda-graphs)
    bool no_overlap;        // a device backend starts no kernel before the one before it ends (--no-cuda-overlap)
    int n_ranks;            // the routed experts split over this many GPUs (sp_ctx_params.n_ranks), numbered
    const int *gpus;        // gpus[0 ..) (NULL: 0 ..)
    struct sp_ranks *group; // or this process's rank `rank` of n_ranks processes: rank 0 runs the engine and
    int rank;               // leads, the others follow it (sp_engine_follow)
    const double *expert_load;  // with ranks: the experts placed by this load (sp_ctx_params.expert_load)
    bool count_routes;          // count the tokens routed to each expert (sp_engine_route_counts)
    size_t expert_cache;    // 0: experts through the mapping; else the expert cache budget in bytes
    size_t device_experts;  // a device backend's expert cache in its memory, over the host's (0: every expert on it)
    bool cpu_experts;       // with it: the CPU may compute experts it lacks (sp_ctx_params.cpu_experts)
    struct sp_expert_store_params expert_params;  // how that cache reads and evicts
};

#define SP_MAX_STOPS 8
#define SP_MAX_CACHE_SCOPE 320  // bytes of a cache scope, its terminating zero included
#define SP_MAX_TOP_LOGPROBS 20

struct sp_gen_params {
    struct sp_sampler_params sampling;
    int64_t max_tokens;     // 0: until the context is full
    const char *stops[SP_MAX_STOPS];  // copied at submit
    int n_stops;
    bool ignore_eos;
    int top_logprobs;       // -1: no logprobs; 0..20: chosen token plus that many alternatives
    unsigned detok_flags;   // SP_TOK_SKIP_SPECIAL or 0 (formats that parse control tokens)
    struct sp_grammar *grammar;  // NULL, or the output must be a sentence of it (runtime/grammar.h):
                                 // sp_engine_submit takes it, and frees it with the request
    const char *cache_scope;  // copied at submit: the prompt cache reuses only tokens cached under the
                              // same scope, so cached_tokens and timing say nothing of other scopes'
                              // prompts (NULL or "": the shared scope; shorter than SP_MAX_CACHE_SCOPE)
};

enum sp_finish { SP_FINISH_NONE, SP_FINISH_STOP, SP_FINISH_LENGTH, SP_FINISH_CANCELLED, SP_FINISH_ERROR };
const char *sp_finish_name(enum sp_finish f);  // "stop", "length", "cancelled", "error"

/* One generated token, for logprobs. */
struct sp_tok_info {
    int32_t id;
    float logprob;
    int n_top;
    int32_t top_id[SP_MAX_TOP_LOGPROBS];
    float top_logprob[SP_MAX_TOP_LOGPROBS];
};

struct sp_tok_list {
    struct sp_tok_info *v;
    int64_t n, cap;
};
void sp_tok_list_free(struct sp_tok_list *l);

struct sp_req_progress {
    bool finished;
    enum sp_finish finish;
    bool stopped_by_eos;  // finish STOP because of an end-of-sequence token (not a stop string)
    int stop_index;       // once finished: the stop string that ended it (index into gp.stops), or -1
    int64_t prompt_tokens, cached_tokens, completion_tokens;
    double queue_s, ttft_s;  // waiting for a slot; submit to first token
    double prefill_s, decode_s;
    char error[256];
};

struct sp_engine_stats {
    int n_slots, active_slots, queue_depth;  // queue_depth: submissions waiting (a group is one)
    int64_t n_ctx, kv_tokens_used;   // positions held over all slots (prompt cache included)
    size_t kv_bytes;
    uint64_t requests, prompt_tokens, cached_tokens, generated_tokens;
    double prefill_s, decode_s;      // forward time spent on prefill / decode tokens
    uint64_t prefill_tokens, decode_tokens;
    uint64_t ttft_bucket[12];        // counts of time to first token <= 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, +Inf s
    double ttft_sum;
    uint64_t steps;
    bool has_experts;                      // an expert cache is in use
    struct sp_expert_store_stats experts;  // its counters (layer_hits / layer_misses are NULL here:
                                           // sp_engine_expert_layers copies them)
    bool has_device_experts;                      // a device expert cache is in use
    struct sp_expert_tier_stats device_experts;   // its counters
    int64_t n_layers;
};

extern const double sp_ttft_bounds[11];

struct sp_engine;
struct sp_req;

enum sp_status sp_engine_create(const struct sp_model *m, const struct sp_tokenizer *tok,
                                const struct sp_engine_params *p, struct sp_engine **out);
/* Stops the scheduler (unfinished requests end as cancelled) and frees it. */
void sp_engine_free(struct sp_engine *e);
const struct sp_engine_params *sp_engine_params(const struct sp_engine *e);
/* The defaults filled in where p leaves them (0), as the engine takes them. */
void sp_engine_params_resolve(struct sp_engine_params *p, const struct sp_model *m);
/* A rank other than 0 of an engine's processes (p->group): its context,
 * following rank 0's engine until rank 0's is freed (SP_OK) or a rank is
 * gone (model/forward.h: sp_ctx_follow). */
enum sp_status sp_engine_follow(const struct sp_model *m, const struct sp_engine_params *p);
/* Queues a request. SP_ERR_LIMIT: the queue is full; SP_ERR_ARG: the prompt
 * is empty, has ids outside the vocabulary, or leaves no room in the context;
 * SP_ERR_STATE: the engine has failed (sp_engine_failed). */
enum sp_status sp_engine_submit(struct sp_engine *e, const int32_t *prompt, int64_t n, const struct sp_gen_params *gp,
                                struct sp_req **out);
/* Queues n_seq requests for one prompt (the choices of a request with n >
 * 1), request i with gps[i], into out[0 .. n_seq): one submission for the
 * queue's bound, admitted together once n_seq slots are free. The prompt
 * is prefilled once, by the first: the others copy its KV (sp_ctx_copy_seq)
 * for every prompt position but the last, which each computes for its own
 * logits, so they count the rest as cached_tokens. Each request is then on
 * its own (sampling, stops, cancellation, release). The statuses of
 * sp_engine_submit, and SP_ERR_ARG for n_seq outside 1 .. n_slots; on
 * failure no request is queued and out[] is NULL. Each gps[i].grammar is
 * taken as sp_engine_submit takes it (a shared one needs a reference per
 * request: sp_grammar_ref). */
enum sp_status sp_engine_submit_group(struct sp_engine *e, const int32_t *prompt, int64_t n,
                                      const struct sp_gen_params *gps, int n_seq, struct sp_req **out);
void sp_engine_stats(struct sp_engine *e, struct sp_engine_stats *s);
/* Whether the engine has stopped for good because the model's files
 * changed while in use (see sp_map_guard_install): every request then
 * fails, and submit says why (SP_ERR_STATE). msg (may be NULL) gets the
 * reason, naming the file. Any thread. */
bool sp_engine_failed(struct sp_engine *e, char *msg, size_t cap);
/* Copies the expert cache's per-layer hits and misses (n_layers each). */
void sp_engine_expert_layers(struct sp_engine *e, uint64_t *hits, uint64_t *misses);
/* Stops the engine's thread: no step runs after it returns; requests
 * still queued or running end with sp_engine_free. */
void sp_engine_stop(struct sp_engine *e);
/* With count_routes: the tokens routed to each expert of each MoE layer
 * (sp_ctx_route_counts), to read after sp_engine_stop. NULL without. */
const uint64_t *sp_engine_route_counts(const struct sp_engine *e);

/* Waits up to timeout_ms for news, then appends the new text (final: stop
 * strings already removed) and, if toks is not NULL, the new token records;
 * fills *p. Returns true when there was news or the request is finished. */
bool sp_req_poll(struct sp_req *r, int timeout_ms, struct sp_buf *text, struct sp_tok_list *toks,
                 struct sp_req_progress *p);
void sp_req_cancel(struct sp_req *r);
/* End-of-sequence ids: config.json's eos_token_id (a number or a list) and
 * the tokenizer's eos (tok may be NULL). Returns how many were written. */
int sp_eos_ids(const struct sp_model *m, const struct sp_tokenizer *tok, int32_t *eos, int cap);
void sp_req_release(struct sp_req *r);

/* What the layers above the runtime (the server, the public API) may know
 * about the model an engine runs, so that none of them reads struct
 * sp_model or the architecture descriptor. Strings and arrays borrow from
 * the engine's model: valid until sp_engine_free. */
#define SP_ENGINE_MAX_EOS     16
#define SP_ENGINE_MAX_CLASSES 16

struct sp_engine_class_bytes {
    const char *name;       // tensor role class: "embedding", "attention", ..., "routed_experts"
    size_t bytes;           // tensor bytes of the class
    const char *placement;  // "mapped", or "expert_cache" for routed experts an expert cache serves
};

struct sp_engine_info {
    const char *architecture;  // config.json's model_type ("qwen3_moe", ...)
    const char *model_dir;     // the folder the model was read from
    int64_t vocab;             // logits per position; token ids are below it
    int64_t n_ctx;             // positions per slot (sp_engine_params' n_ctx)
    int64_t n_ctx_train;       // config.json's max_position_embeddings
    int64_t n_layers;
    const bool *layer_moe;     // (n_layers) the layer routes tokens to experts
    int32_t eos[SP_ENGINE_MAX_EOS];  // ids that end a generation (sp_eos_ids)
    int n_eos;
    size_t file_bytes;         // the model's safetensors files
    size_t tensor_bytes;       // the tensors in them (headers excluded)
    size_t bytes_per_token;    // weight bytes a decoded token reads
    struct sp_engine_class_bytes classes[SP_ENGINE_MAX_CLASSES];  // role classes holding any bytes, in table order
    int n_classes;
};

/* Fills *out. Sums tensor headers: call it once (e.g. when the engine is
 * attached to a server), not per request. Any thread. */
void sp_engine_info(const struct sp_engine *e, struct sp_engine_info *out);

#endif
