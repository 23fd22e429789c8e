/*
 * forward.h - the one forward pass (DESIGN.md §3): a context holds the KV
 * cache of `n_seq` sequences and the buffers for batches of up to
 * `max_batch` tokens; sp_ctx_forward runs a batch of tokens from any of those
 * sequences at any positions through every layer, reading only the
 * architecture descriptor and the weight views.
 *
 *     struct sp_ctx *c;
 *     struct sp_ctx_params p = {.n_ctx = 4096, .n_seq = 1};
 *     sp_ctx_create(model, &p, &c);
 *     int32_t tok[3] = {1, 2, 3}, pos[3] = {0, 1, 2}, seq[3] = {0, 0, 0};
 *     struct sp_batch b = {.n = 3, .tokens = tok, .pos = pos, .seq = seq};
 *     float *logits = ...;                 // [n tokens wanting logits][vocab]
 *     sp_ctx_forward(c, &b, logits);
 *     sp_ctx_free(c);
 *
 * Tokens of one sequence must come in increasing position order; a token
 * attends to every cached position of its sequence up to its own (or the
 * sliding window). A token's result does not depend on what else is in the
 * batch: prefill in chunks and decode one by one give the same logits.
 */
#ifndef SP_MODEL_FORWARD_H
#define SP_MODEL_FORWARD_H

#include <stdbool.h>
#include <stdint.h>

#include "backend/backend.h"
#include "model/model.h"

/* Tokens per forward call unless told: the prefill chunk of run, serve and
 * bench, and what the planner counts buffers for. A chunk gives each routed
 * expert about chunk x top-k / experts tokens per read of its weights: 32
 * for Qwen3-30B-A3B (128 experts, top-8) and 16 for Ling-mini-2.0 (256) at
 * 512, where the products by tokens run well (a pass of the avx512 set
 * takes 32 tokens, of the avx2 set 16). 512-token prefills of those shapes
 * (4 layers, 2 threads, routing as trained) ran 1.10-1.28x faster at 512
 * than at 256 on a Xeon (AVX-512), 0.9-1.4x on Zen 3 (AVX2, noisy); a
 * decode step that shares a forward call with a prefill chunk waits for it,
 * twice as long as at 256. */
#define SP_DEFAULT_BATCH 512
/* The same as text, for help messages (a literal: the preprocessor spells it) */
#define SP_DEFAULT_BATCH_TEXT SP_TEXT_OF(SP_DEFAULT_BATCH)
#define SP_TEXT_OF(x) SP_TEXT_OF_(x)
#define SP_TEXT_OF_(x) #x

/* One routed expert's weights: gate, up and down, or gate_up (outputs
 * alternating gate, up) and down where the model fuses them. */
struct sp_expert_views {
    struct sp_linear gate, up, down, gate_up;
    bool fused;
};

/* Lays v's arrays out from mem - the linears it uses (gate, up, down, or
 * gate_up, down), each one's parts in sp_linear_parts's order, each at the
 * next multiple of align - and points v at them there, each part first
 * copied by copy(ctx, dst, src, bytes) unless copy is NULL. Returns the
 * bytes of the parts (without the alignment). */
size_t sp_expert_views_move(struct sp_expert_views *v, uint8_t *mem, size_t align,
                            void (*copy)(void *ctx, void *dst, const void *src, size_t bytes), void *ctx);
/* The bytes v's parts take laid out so. */
size_t sp_expert_views_span(const struct sp_expert_views *v, size_t align);
/* v's parts in that order: addresses into ptr, sizes into len (at most
 * SP_EXPERT_MAX_PARTS); returns how many. */
#define SP_EXPERT_MAX_PARTS 12
int sp_expert_views_parts(const struct sp_expert_views *v, const void **ptr, size_t *len);

/* Where the forward pass takes routed experts from when not through the
 * model's mapping (an expert cache: runtime/experts.h; a device's tier
 * over it: model/expert_tier.h). get: expert e of layer L, valid until put
 * (`mapped`: its views into the files); one forward pass calls them at a
 * time (ranks in threads over one cache: each rank's), holding at most
 * `window` experts at once (0: one; sp_expert_source_held). prefetch
 * (NULL: none): experts the next MoE layer L is predicted to take, asked
 * for early. */
struct sp_expert_source {
    void *ctx;
    int64_t window;
    enum sp_status (*get)(void *ctx, const struct sp_expert_views *mapped, int64_t L, int64_t e,
                          struct sp_expert_views *out);
    void (*put)(void *ctx, int64_t L, int64_t e);
    void (*prefetch)(void *ctx, int64_t L, const int64_t *experts, const struct sp_expert_views *mapped, int64_t n);
};

/* The experts a caller of s may hold at once. */
static inline int64_t sp_expert_source_held(const struct sp_expert_source *s) {
    return s->window > 0 ? s->window : 1;
}

struct sp_ranks;

struct sp_ctx_params {
    int64_t n_ctx;         // positions per sequence (0: the model's, capped at 4096)
    int n_seq;             // sequences (0: 1)
    int64_t max_batch;     // tokens per forward call (0: SP_DEFAULT_BATCH)
    enum sp_kv_type kv_type;
    enum sp_device device; // the backend that runs it (zero: the CPU)
    int n_threads;         // CPU threads (0: physical cores)
    const struct sp_expert_source *experts;  // NULL: routed experts read through the mapped files; else
                                             // borrowed, valid while the context is
    /* A device backend's tier of routed experts (model/expert_tier.h) of
     * this many bytes of its memory, over `experts` (or the mapped files);
     * 0: every routed expert copied to the device at creation. */
    size_t device_experts;
    bool cpu_experts;      // with device_experts over the mapped files: the CPU may compute experts the tier lacks
    bool no_prefetch;      // no experts predicted for the next MoE layer and asked for early
    double cpu_expert_gbs, copy_gbs;  // the rates that choose between the two (0: measured at creation)
    bool time_steps;       // keep the time of each step of the forward pass (sp_ctx_step_times)
    bool float_activations;  // products keep activations in float on a device backend (--precision exact)
    bool graphs;             // a device backend records small steps and replays them as graphs (--cuda-graphs)
    bool no_overlap;         // a device backend starts no kernel before the one before it ends (--no-cuda-overlap)
    /* Expert parallelism (model/ranks.h): the routed experts of each MoE
     * layer split over this many ranks (0, 1: none), each a context with a
     * backend of its own that runs the same pass on its share and the
     * shared expert on rank 0, the ranks' MoE outputs summed after each MoE
     * layer; on a GPU, rank r on GPU gpus[r] (NULL: GPU r; one context on
     * GPU gpus[0]), on the CPU n_threads shared among them. With
     * device_experts, each rank's device holds an expert cache of that
     * many bytes of its own experts; not over a host expert cache
     * (`experts`) yet. */
    int n_ranks;
    const int *gpus;
    /* Or this process's rank `rank` of n_ranks processes, joined by group
     * (sp_ranks_connect), each running the same passes and sampling: the
     * context is that rank alone (on a GPU, GPU gpus[0], NULL: 0). */
    struct sp_ranks *group;
    int rank;
    bool lead;  // with group: rank 0 leads, the other ranks follow its calls (sp_ctx_follow) instead of making their own
    /* With ranks: each MoE layer's tokens routed to each routed expert
     * (n_layers x n_experts, layer-major; sp_ctx_route_counts of an earlier
     * run), by which the experts are placed so that the ranks' shares are
     * about the same (sp_ranks_split); NULL: every expert alike. Read at
     * creation. */
    const double *expert_load;
    bool count_routes;  // count them (sp_ctx_route_counts); the routing then runs on the host
};

/* Steps of the forward pass, as a context with time_steps times them:
 * together they cover sp_ctx_forward. */
enum sp_step {
    SP_STEP_EMBED,      // embedding rows, RoPE angles, reading ahead the next layer's experts
    SP_STEP_NORMS,      // RMS norms before attention and MLP, residual adds
    SP_STEP_QKV,        // q / k / v products
    SP_STEP_ATTENTION,  // q / k norms, RoPE, KV stores, scores, softmax, weighted values
    SP_STEP_O,          // the attention output product
    SP_STEP_ROUTER,     // the routers' products
    SP_STEP_ROUTE,      // top-k and the tokens grouped by expert
    SP_STEP_EXPERTS,    // routed experts (with a shared expert that runs beside them)
    SP_STEP_MOVE,       // tokens gathered for experts, their outputs added back
    SP_STEP_MLP,        // dense MLPs, and shared experts that run alone
    SP_STEP_LM_HEAD,    // the final norm and lm_head
    SP_STEP_COUNT
};
struct sp_step_times {
    double seconds[SP_STEP_COUNT];
    double macs[SP_STEP_COUNT];  // multiply-adds the step's products (or attention's) did
    double routed;               // (token, routed expert) pairs of the MoE layers
    double experts_run;          // routed experts that had tokens, over layers and batches
};
/* A step's name in reports ("qkv", "experts", ...). */
const char *sp_step_name(enum sp_step s);

struct sp_ctx;

enum sp_status sp_ctx_create(const struct sp_model *m, const struct sp_ctx_params *p, struct sp_ctx **out);
void sp_ctx_free(struct sp_ctx *c);
/* Runs a batch; logits of the tokens that want them, in batch order,
 * [count][vocab] floats (where b->argmax is set, their greedy choices go
 * there instead, or where b->top is, their b->top_k best logits; logits,
 * as large, may then serve as scratch). Bad tokens/positions/sequences,
 * and a top_k outside 1 .. SP_TOP_K_MAX, are SP_ERR_ARG. */
enum sp_status sp_ctx_forward(struct sp_ctx *c, const struct sp_batch *b, float *logits);
/* Why n ranks (sp_ctx_params.n_ranks; in processes, one a rank, where
 * processes) cannot split m's experts under p, or SP_OK: too many ranks,
 * more than the experts of a layer, a host expert cache shared by ranks in
 * threads that cannot hold an expert of each at once (a process's rank
 * has a host expert cache of its own). */
enum sp_status sp_ctx_ranks_check(const struct sp_model *m, const struct sp_ctx_params *p, int n, bool processes);
/* A rank other than 0 of processes that rank 0 leads (sp_ctx_params.lead):
 * takes rank 0's passes, sequence copies and resumes as they come and does
 * its share of each, until rank 0's context is freed (SP_OK) or a rank is
 * gone (an error; the others' passes then fail). */
enum sp_status sp_ctx_follow(struct sp_ctx *c);
/* The parameters as the context took them (defaults filled in, the
 * backend's thread count). */
const struct sp_ctx_params *sp_ctx_params(const struct sp_ctx *c);
/* Bytes of the KV cache. */
size_t sp_ctx_kv_bytes(const struct sp_ctx *c);
/* Bytes of a CPU KV cache of n_ctx positions for n_seq sequences. */
size_t sp_kv_cache_bytes(const struct sp_arch *a, int64_t n_ctx, int64_t n_seq, enum sp_kv_type t);
/* Bytes a CPU context reserves for batches of max_batch tokens on
 * n_threads threads besides its KV cache: its tensors, the backend's
 * buffers and per-thread scratch, the routing tables (the planner counts
 * them among the activations). */
size_t sp_ctx_work_bytes(const struct sp_arch *a, int64_t max_batch, int n_threads);
/* Bytes a context on device d (other than the CPU) takes of the device's
 * memory besides the weights: its KV cache, tensors and the backend's
 * buffers (a build without that backend: the CPU's KV layout and the
 * tensors). */
size_t sp_ctx_device_bytes(const struct sp_arch *a, enum sp_device d, int64_t n_ctx, int n_seq, int64_t max_batch,
                           enum sp_kv_type t);
/* Weights a context composes at load besides the files' (a gated q_proj's
 * reordered rows, MLA's absorbed float32 matrices): the bytes it holds,
 * and the bytes of the files' tensors those replace in a forward pass. */
void sp_model_composed(const struct sp_model *m, size_t *held, size_t *replaced);
/* The backend's choice of weight layout for a device (sp_backend_ops:
 * interleave): what the loader and an expert cache lay out for it. */
sp_interleave_fn sp_ctx_interleave(enum sp_device d);
/* Copies the cached positions [0, n) of sequence src to sequence dst
 * (a model with recurrent layers: n must be resumable from src, below). */
void sp_ctx_copy_seq(struct sp_ctx *c, int src, int dst, int64_t n);
/* A model with recurrent layers (Gated DeltaNet) keeps, per sequence, one
 * state of the positions it has run and a snapshot taken where a batch
 * asked (sp_batch.snapshot): a sequence goes on only from one of those, or
 * from 0. The longest prefix of at most n positions sequence seq can go on
 * from (n for a model without recurrent layers). */
int64_t sp_ctx_seq_resumable(const struct sp_ctx *c, int seq, int64_t n);
/* Makes sequence seq go on from position n, resumable as above. */
void sp_ctx_seq_resume(struct sp_ctx *c, int seq, int64_t n);
/* The steps' times since the context was made or last reset (zero unless
 * made with time_steps); reset: start again from zero. */
void sp_ctx_step_times(struct sp_ctx *c, struct sp_step_times *out, bool reset);
/* With count_routes: the tokens routed to each routed expert of each MoE
 * layer since creation (n_layers x n_experts, layer-major; a dense layer's
 * row zeros); NULL without. Over ranks, rank 0's context counts them all. */
const uint64_t *sp_ctx_route_counts(const struct sp_ctx *c);
struct sp_expert_tier_stats;
/* The counters of the context's device expert tier (false: it has none). */
bool sp_ctx_tier_stats(const struct sp_ctx *c, struct sp_expert_tier_stats *out);
/* How many steps (or their first parts) the backend replayed as recorded
 * graphs, and how many recordings it built anew (false: it records none). */
bool sp_ctx_graph_counts(const struct sp_ctx *c, int64_t *replayed, int64_t *built);
/* Whether the ranks' sums after each MoE layer run on their devices, which
 * read each other's memory (ranks in threads on GPUs with peer access, or
 * on one GPU), rather than through the host. */
bool sp_ctx_sums_on_devices(const struct sp_ctx *c);

#endif
