/*
 * backend.h - the seam between the one forward pass (model/forward.c) and
 * the hardware it runs on (DESIGN.md §2). A backend owns its memory (the
 * batch buffers, the KV cache and its layout, float copies of small
 * parameters), puts weights into the layout it computes on, and runs the
 * steps of a forward pass: embedding, RMSNorm, residual adds, linear
 * layers over a batch of tokens, attention with its prologue (q / k norms,
 * RoPE, KV store), batches of gated MLPs (a MoE layer's experts in one
 * call), the rows moved to and from experts, and the final norm with the
 * lm_head. The forward pass keeps the layer loop and routing; it knows the
 * backend only through this table, so a backend drops in without a fork.
 *
 *     struct sp_backend *be;
 *     struct sp_backend_params p = {.shape = shape, .n_ctx = 4096, .n_seq = 1, .max_batch = 512};
 *     sp_backend_create(SP_DEVICE_CPU, &p, &be);
 *     struct sp_tensor x, h;
 *     sp_backend_tensor(be, 512, shape.d_model, &x);   // lives as long as be
 *     sp_backend_tensor(be, 512, shape.d_model, &h);
 *     be->ops->embed(be, &embedding, &batch, x);
 *     be->ops->rmsnorm(be, norm_w, eps, x, h);
 *     ...
 *     sp_backend_free(be);
 *
 * Tensors are rows of floats in the backend's memory (host memory for the
 * CPU, device memory for a GPU): the forward pass makes views of them
 * (sp_tensor_rows, sp_tensor_cols) but reads them only through
 * ops->host. Index and weight arrays passed to ops (token ids, positions,
 * the rows moved to experts) are host memory, valid for the call. Ops run
 * in call order; a backend that queues work finishes it before ops->host
 * returns and in ops->sync.
 *
 * Every op computes what the scalar reference computes (quant/qtype.h for
 * products; tests/test_backend_ops.c holds each backend to it with named
 * tolerances), and a token's result never depends on what else is in the
 * batch.
 */
#ifndef SP_BACKEND_BACKEND_H
#define SP_BACKEND_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"
#include "quant/qtype.h"

/* ---- weights as the ops take them ---- */

struct sp_wslot;  // the model's record of where a weight came from (model/weights.h)

/* A linear layer y = W x (+ b). */
struct sp_linear {
    struct sp_qmat w;  // (out, in); when transposed the stored matrix is (in, out)
    bool transposed;
    bool interleaved;  // fused gate_up whose outputs alternate gate, up
    bool float_activations;  // products keep x in float (routers: a rounding must not change the experts chosen)
    const void *bias;  // (out) or NULL
    enum sp_dtype bias_dtype;
    const struct sp_wslot *slot;  // where it came from (names for messages); never read by a backend
};

/* A 1-D parameter (norm weight, sinks, expert bias). */
struct sp_vector {
    const void *data;
    enum sp_dtype dtype;  // F32, F16 or BF16
    int64_t n;
};

/* The bytes of l's weights (codes, scales and biases) that a product reads. */
double sp_linear_bytes(const struct sp_linear *l);
/* The byte ranges of l's arrays, in the order codes, scales, [biases],
 * [bias] (those l has): their addresses into ptr, sizes into len (4 at
 * most); returns how many. */
int sp_linear_parts(const struct sp_linear *l, const void **ptr, size_t *len);
/* v's values as floats into out (v->n of them, exact). */
void sp_vector_to_f32(const struct sp_vector *v, float *out);

/* A gated activation (the MLPs' SwiGLU): out = (u + u_offset) * g /
 * (1 + exp(-alpha * g)), g first clamped to <= limit and u to [-limit,
 * limit]. SiLU: alpha 1, limit infinity, u_offset 0; gpt-oss's clamped
 * SwiGLU: its alpha and limit, u_offset 1. */
struct sp_glu {
    float alpha, limit, u_offset;
};

/* A backend's choice of the weight matrices it reads faster in
 * interleaved blocks of rows (sp_qmat.interleaved): the loader and the
 * expert cache lay those out so (NULL: none). */
typedef bool (*sp_interleave_fn)(const struct sp_qmat *w);

/* ---- activations ---- */

/* rows x cols floats, row r at data + r * ld, in the backend's memory. */
struct sp_tensor {
    float *data;
    int64_t rows, cols, ld;
};

/* Rows [r0, r0 + n) of t. */
static inline struct sp_tensor sp_tensor_rows(struct sp_tensor t, int64_t r0, int64_t n) {
    return (struct sp_tensor){t.data + r0 * t.ld, n, t.cols, t.ld};
}
/* Columns [c0, c0 + n) of every row of t. */
static inline struct sp_tensor sp_tensor_cols(struct sp_tensor t, int64_t c0, int64_t n) {
    return (struct sp_tensor){t.data + c0, t.rows, n, t.ld};
}

/* Storage of cached keys and values (zero, the default, is f16). */
enum sp_kv_type { SP_KV_F16, SP_KV_BF16, SP_KV_F32, SP_KV_TYPE_COUNT };
const char *sp_kv_type_name(enum sp_kv_type t);
bool sp_kv_type_from_name(const char *name, enum sp_kv_type *out);
enum sp_dtype sp_kv_dtype(enum sp_kv_type t);

/* A logit and its token: a candidate of a step's sampling. */
struct sp_cand {
    float logit;  // NaN as -inf
    int32_t id;
};
/* The most candidates a row a batch may ask for (sp_batch.top_k): sampling
 * with a top-k up to it draws from them, not from the whole vocabulary. */
#define SP_TOP_K_MAX 64
/* c[0 .. k) = the k best of v[0 .. n) (k <= n): the highest first, the
 * lower index of equal ones, NaN as -inf (and -0 as +0). */
void sp_top_k(const float *v, int64_t n, int64_t k, struct sp_cand *c);
/* That order as qsort's comparison. */
int sp_cand_cmp(const void *a, const void *b);

/* A batch of tokens from any of the context's sequences. Tokens of one
 * sequence come in increasing position order. */
struct sp_batch {
    int64_t n;
    const int32_t *tokens;      // (n)
    const int32_t *pos;         // (n)
    const int32_t *seq;         // (n)
    const bool *want_logits;    // (n) or NULL: logits for every token
    const bool *snapshot;       // (n) or NULL: after these tokens, their sequence's recurrent state is
                                // copied to its snapshot slot (ops->state_copy)
    int32_t *argmax;            // NULL, or (rows wanting logits): each such row's greedy choice, in
                                // order, instead of its logits (ops->argmax); may be tokens
    struct sp_cand *top;        // without argmax: NULL, or (rows wanting logits, top_k): each such
    int64_t top_k;              // row's top_k best logits (sp_top_k's order) instead of its logits
};


/* ---- what a backend is sized and set up for ---- */

/* The model's shapes, as numbers (a backend knows no architecture). */
struct sp_backend_shape {
    int64_t n_layers, d_model, vocab;
    int64_t n_kv_layers;  // layers with a KV cache (attention ops' ly->layer: 0 .. n_kv_layers - 1)
    /* Gated DeltaNet layers (ops->gated_delta; 0: none), each keeping a
     * recurrent state per sequence: the conv's last lin_conv - 1 inputs and
     * a [lin_k_dim, lin_v_dim] float matrix per value head */
    int64_t n_state_layers, lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    int64_t n_heads, n_kv_heads, head_dim;
    int64_t mlp_width;  // floats per token of the MLP buffers (the widest gate and up side by side)
    int64_t n_experts;  // routed experts per MoE layer (0: none): the most MLPs one call takes, plus a shared one
    int64_t n_experts_used, expert_ff;  // experts a token takes, and each one's gate outputs (ops->moe's buffers)
    /* RoPE: the first rot_dims of each head rotate (halves paired, as
     * rotate_half) by position x inv_freq[i]; cos and sin are scaled by
     * rope_scale (YaRN's attention factor). inv_freq: (rot_dims / 2),
     * borrowed for sp_backend_create. */
    int64_t rot_dims;
    const float *inv_freq;
    float rope_scale;
};

/* Devices a backend can run on (built in or not: sp_backend_ops). */
enum sp_device { SP_DEVICE_CPU, SP_DEVICE_CUDA, SP_DEVICE_COUNT };
const char *sp_device_name(enum sp_device d);
bool sp_device_from_name(const char *name, enum sp_device *out);

struct sp_backend_params {
    struct sp_backend_shape shape;
    int64_t n_ctx;      // positions per sequence of the KV cache
    int n_seq;          // sequences of the KV cache
    int64_t max_batch;  // tokens per forward call
    enum sp_kv_type kv_type;
    int n_threads;      // CPU threads (0: physical cores); the CPU backend writes back what it took
    bool float_activations;  // products keep activations in float (--precision exact) where a backend
                             // would round them (CUDA: int8 for 4-bit codes); the CPU's kernel set decides there
    bool graphs;        // steps of few tokens recorded and replayed (CUDA graphs); else queued op by op
    bool no_overlap;    // no kernel starts before the one before it ends (CUDA: programmatic dependent launch off)
    int gpu;            // which of the machine's GPUs (CUDA's device number; 0: the first)
};

/* Ops, for supports(). */
enum sp_op {
    SP_OP_EMBED,
    SP_OP_RMSNORM,
    SP_OP_ZERO,
    SP_OP_ADD,
    SP_OP_LINEAR,
    SP_OP_ATTENTION,
    SP_OP_MLP,
    SP_OP_GATHER,
    SP_OP_SCATTER_ADD,
    SP_OP_LOGITS,
    SP_OP_COUNT
};
const char *sp_op_name(enum sp_op op);

/* One layer's attention: its index (for the KV cache), the float copies
 * of its parameters (ops->vector), and its window. */
struct sp_attn_layer {
    int64_t layer;
    const float *q_norm, *k_norm;  // (head_dim) each, or NULL: no q / k norms
    const float *sinks;            // (n_heads) or NULL: no sink logits
    int64_t window;                // 0: every cached position; else the last `window` positions
    float eps;                     // of the q / k norms
};

/* One Gated DeltaNet layer: the index of its recurrent state (0 ..
 * n_state_layers - 1) and the float copies of its parameters (ops->vector). */
struct sp_delta_layer {
    int64_t layer;
    const float *conv;             // (conv channels x lin_conv) each channel's taps, oldest input first
    const float *a_log, *dt_bias;  // (lin_v_heads)
    const float *norm;             // (lin_v_dim) the gated output norm's weight
    float eps;
};

/* One Lightning layer: the index of its recurrent state, the float copies
 * of its q / k norms (head_dim each, or NULL), each head's decay a token
 * (n_heads) and its output norm's weight (n_heads x head_dim, RMS over
 * `groups` runs of it). */
struct sp_lightning_layer {
    int64_t layer;
    const float *q_norm, *k_norm, *decay, *norm;
    int64_t groups;
    float eps;
};

/* One gated MLP (a routed expert, a shared expert or a dense MLP) applied
 * to the rows of x: down(act(gate x) * up x) into rows [row, row +
 * x.rows) of the op's output. gate_up (outputs alternating gate, up)
 * stands for gate and up where the model fuses them. */
struct sp_mlp_item {
    const struct sp_linear *gate, *up, *gate_up, *down;
    struct sp_tensor x;
    int64_t row;
};

/* Multiply-adds of a batch of gated MLPs with d outputs: gate, up and
 * down of each. */
static inline double sp_mlp_macs(const struct sp_mlp_item *items, int64_t n, int64_t d) {
    double macs = 0;
    for (int64_t i = 0; i < n; i++) macs += 3.0 * (double)items[i].x.rows * (double)items[i].down->w.cols * (double)d;
    return macs;
}

/* How a MoE layer's router chooses k experts from a token's router logits
 * (what model/forward.c's route() computes on the host):
 * SOFTMAX_TOPK: the k largest softmax probabilities, renormalized where
 *   norm_topk; TOPK_SOFTMAX: the k largest logits, softmax over those;
 * *_GROUP_TOPK: sigmoid or softmax scores, plus the bias to choose (the
 *   best topk_group of n_group groups by their two best, then the k best
 *   in those), weights the chosen scores over their sum (k > 1) times
 *   routed_scale. The k largest: ties to the lower expert. */
enum sp_route { SP_ROUTE_SOFTMAX_TOPK, SP_ROUTE_TOPK_SOFTMAX, SP_ROUTE_SIGMOID_GROUP_TOPK, SP_ROUTE_SOFTMAX_GROUP_TOPK };

/* A MoE layer's routed experts, for backends that route on their own
 * (ops->moe). */
struct sp_moe {
    int64_t layer;
    const struct sp_linear *router;  // (n_experts, d)
    enum sp_route route;
    int64_t n_experts, k, n_group, topk_group;
    bool norm_topk;
    float routed_scale;
    const float *bias;  // (n_experts) in the backend's memory (ops->vector), or NULL
    /* (n_experts) each: gate and up, or gate_up (outputs alternating gate, up) with gate and up NULL */
    const struct sp_linear *gate, *up, *gate_up, *down;
    /* The layer's ungated shared expert (NULL: none), which ops->moe may
     * add too, after each row's routed experts. */
    const struct sp_linear *shared_gate, *shared_up, *shared_down;
    /* Experts split over ranks: only the experts e with owner[e] == rank
     * are this context's to compute (the others' weights are views never
     * read) and added into out; owner NULL: every expert. */
    const int32_t *owner;
    int32_t rank;
};

struct sp_backend;

struct sp_backend_ops {
    const char *name;
    /* The matrices this backend reads faster interleaved (in row order
     * where NULL); it takes every other matrix in row order. */
    sp_interleave_fn interleave;
    /* Host memory for weights the backend reads or copies in (an expert
     * cache's slots), counted in class cls: where its copies to the device
     * go fastest (pinned, for a GPU). Freed with host_free. */
    void *(*host_alloc)(size_t bytes, enum sp_mem_class cls);
    void (*host_free)(void *p);
    void (*destroy)(struct sp_backend *b);
    /* Sends the calling thread's further calls to b's device, where a
     * process drives several (NULL: nothing to choose). A backend's ops,
     * made on one thread, are made on another after bind. */
    void (*bind)(struct sp_backend *b);
    /* Whether op runs on weights of format fmt (ops without weights ignore fmt). */
    bool (*supports)(const struct sp_backend *b, enum sp_op op, enum sp_qtype fmt);

    /* ---- memory ---- */
    /* A rows x cols tensor in the backend's memory, freed with the backend. */
    enum sp_status (*tensor)(struct sp_backend *b, int64_t rows, int64_t cols, struct sp_tensor *out);
    /* v as floats in the backend's memory (*out valid as long as b). */
    enum sp_status (*vector)(struct sp_backend *b, const struct sp_vector *v, const float **out);
    /* Makes l ready for the ops: into the backend's memory and layout
     * where it keeps its own (l is rewritten to view it), and counted for
     * the scratch its products need. Every linear an op will take,
     * experts of an expert cache included (the same shapes as theirs),
     * goes through here once. */
    enum sp_status (*prepare)(struct sp_backend *b, struct sp_linear *l);
    /* t = the host's rows src (t.rows x t.cols floats, rows t.cols apart). */
    void (*write)(struct sp_backend *b, struct sp_tensor t, const float *src);
    /* Rows of t readable by the host: t's own memory where the host can
     * read it, else a copy in staging (t.rows x t.cols floats, rows
     * t.cols apart; the caller may write them). */
    float *(*host)(struct sp_backend *b, struct sp_tensor t, float *staging);
    /* Waits for queued work. */
    void (*sync)(struct sp_backend *b);
    /* Optional (NULL: sums through the host): sums over ranks in threads,
     * each rank a backend of this kind, without the host waiting.
     * parts_link says whether each of the n backends bs can read the
     * others' memory (and lets it). part_share queues a copy of t, this
     * rank's part of a sum, for the others to read, and returns it (NULL
     * after a failure); once every rank's part_share has returned,
     * parts_add makes t the sum of the n ranks' parts, added in rank order
     * as the host adds them. A part stays readable until this backend's
     * part_share after next. */
    bool (*parts_link)(struct sp_backend *const *bs, int n);
    const void *(*part_share)(struct sp_backend *b, struct sp_tensor t);
    void (*parts_add)(struct sp_backend *b, struct sp_tensor t, const void *const *parts, int n);
    /* The first failure of work that ops queued (a launch or a copy that
     * failed: ops that return nothing keep it), SP_OK while there is none;
     * the failure's message is set again for the caller (sp_errorf). Once
     * one happened the ops do nothing, host gives zeros and logits zero
     * rows. NULL: the backend's ops cannot fail so (the CPU). */
    enum sp_status (*error)(struct sp_backend *b);

    /* Optional, for step times without a wait after each step: mark
     * records the queue's position and returns its number (-1: no room
     * left); once the work is done (sync), mark_seconds gives the device's
     * seconds from mark `from` to mark `to`; marks_clear forgets them. */
    int (*mark)(struct sp_backend *b);
    double (*mark_seconds)(struct sp_backend *b, int from, int to);
    void (*marks_clear)(struct sp_backend *b);
    /* Optional, for backends that record steps and replay them (CUDA
     * graphs): how many replays ran, and how many of their recordings were
     * built anew rather than updated into the step before's. */
    void (*graph_counts)(const struct sp_backend *b, int64_t *replayed, int64_t *built);

    /* Optional, for a tier of experts in the backend's memory
     * (model/expert_tier.h): arena gives `bytes` of it (freed with the
     * backend) that weight views may point into without ops->prepare, and
     * upload queues a copy from the host into it. A source in memory from
     * host_alloc (or given to pin) may be read after upload returns: it
     * must stay as it is until ops->sync; any other source is read before
     * upload returns. Without the two calls below the copies are in order
     * with the ops; with them, copies run on a queue of their own, beside
     * the ops: copies_after_ops makes the copies queued after it wait for
     * the ops queued before it (a slot that they read may be overwritten
     * then), and ops_after_copies makes the ops queued after it wait for
     * the copies queued before it (they may read those slots then);
     * ops->sync waits for both queues. */
    enum sp_status (*arena)(struct sp_backend *b, size_t bytes, void **out);
    void (*upload)(struct sp_backend *b, void *dst, const void *src, size_t bytes);
    void (*copies_after_ops)(struct sp_backend *b);
    void (*ops_after_copies)(struct sp_backend *b);
    /* Optional: host memory that upload will read often (the weights'),
     * made as fast to copy from as host_alloc's until the backend is freed
     * (pinned, for a GPU). */
    enum sp_status (*pin)(struct sp_backend *b, const void *p, size_t bytes);

    /* ---- KV cache and recurrent states ---- */
    /* Bytes of both. */
    size_t (*kv_bytes)(const struct sp_backend *b);
    /* Cached positions [0, n) of sequence src copied to sequence dst. */
    void (*kv_copy_seq)(struct sp_backend *b, int src, int dst, int64_t n);
    /* Every recurrent state of slot src copied to slot dst: slots 0 ..
     * n_seq - 1 are the sequences', n_seq .. 2 n_seq - 1 a snapshot of each
     * (NULL where the backend has no Gated DeltaNet ops). */
    void (*state_copy)(struct sp_backend *b, int src, int dst);

    /* ---- ops ---- */
    /* Rows of the embedding for the batch's tokens into x; the batch's
     * positions and sequences (and the RoPE angles of its positions) are
     * kept for the attention ops that follow, which take the same batch. */
    void (*embed)(struct sp_backend *b, const struct sp_linear *embedding, const struct sp_batch *bt,
                  struct sp_tensor x);
    /* out = x / rms(x) * w, row by row (out may be x). */
    void (*rmsnorm)(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor out);
    /* Optional (NULL: add, rmsnorm, then zero): x += r, then out =
     * x / rms(x) * w row by row, then r = 0 where zero_r; the same values
     * as those three ops. */
    void (*add_rmsnorm)(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor r,
                        bool zero_r, struct sp_tensor out);
    /* t = 0. */
    void (*zero)(struct sp_backend *b, struct sp_tensor t);
    /* dst += src. */
    void (*add)(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src);
    /* y = l(x), row by row. */
    void (*linear)(struct sp_backend *b, const struct sp_linear *l, struct sp_tensor x, struct sp_tensor y);
    /* qkv holds each token's q heads, k heads and v heads side by side:
     * the q and k heads are normed (where ly has norms) and rotated in
     * place, each token's k and v are stored in the cache at its sequence
     * and position, then att gets each query head's attention over the
     * token's visible cached positions (its sink logit taking a share of
     * the softmax's sum where ly has sinks). */
    void (*attention)(struct sp_backend *b, const struct sp_attn_layer *ly, const struct sp_batch *bt,
                      struct sp_tensor qkv, struct sp_tensor att);
    /* Optional (NULL: linear, then attention): qkv = q(h), or where k and
     * v are set q(h), k(h) and v(h) side by side, then attention as
     * above, whose first steps (norms, rotations, cache stores) may run
     * inside the products' kernel; the same values. */
    void (*linear_attention)(struct sp_backend *b, const struct sp_linear *q, const struct sp_linear *k,
                             const struct sp_linear *v, struct sp_tensor h, const struct sp_attn_layer *ly,
                             const struct sp_batch *bt, struct sp_tensor qkv, struct sp_tensor att);
    /* x *= sigmoid(g) elementwise, g of x's shape or of one column (one
     * gate a row). NULL where the backend lacks it. */
    void (*gate)(struct sp_backend *b, struct sp_tensor x, struct sp_tensor g);
    /* A Gated DeltaNet layer for the batch's tokens (NULL where the backend
     * lacks it): qkv holds each token's in_proj_qkv outputs (queries, keys,
     * values), z its in_proj_z outputs, ba its in_proj_b outputs then its
     * in_proj_a outputs. Each token, in batch order, goes through its
     * sequence's state (a zero state at position 0): the causal conv and
     * SiLU over qkv, L2-normed queries (times lin_k_dim^-1/2) and keys,
     * beta = sigmoid(b), decay exp(-exp(a_log) softplus(a + dt_bias)), the
     * delta rule S = decay S + k (beta (v - S^T k))^T, o = S^T q; out gets
     * rmsnorm(o) * norm * silu(z) per value head. qkv is overwritten. */
    void (*gated_delta)(struct sp_backend *b, const struct sp_delta_layer *ly, const struct sp_batch *bt,
                        struct sp_tensor qkv, struct sp_tensor z, struct sp_tensor ba, struct sp_tensor out);
    /* A Lightning layer for the batch's tokens (NULL where the backend
     * lacks it; its heads and dims are the shape's lin_v_heads and
     * lin_v_dim): qkv holds each token's query, key and value heads. Per
     * token in batch order and head: q and k RMS-normed (where ly has
     * norms) and rotated as attention rotates them, S = decay S + k^T v in
     * its sequence's state (a zero state at position 0), o = head_dim^-1/2
     * q S; out gets o, RMS-normed over each of ly->groups runs of a token's
     * outputs, times ly->norm. */
    void (*lightning)(struct sp_backend *b, const struct sp_lightning_layer *ly, const struct sp_batch *bt,
                      struct sp_tensor qkv, struct sp_tensor out);
    /* items[0 .. n) (struct sp_mlp_item) with the activation act into out. */
    void (*mlp)(struct sp_backend *b, const struct sp_mlp_item *items, int64_t n, const struct sp_glu *act,
                struct sp_tensor out);
    /* Row i of dst = row rows[i] of src, for i < dst.rows. */
    void (*gather)(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src, const int32_t *rows);
    /* Row rows[i] of out += w[i] x row i of src for i < src.rows, each row
     * of out taking its additions in increasing i. */
    void (*scatter_add)(struct sp_backend *b, struct sp_tensor out, struct sp_tensor src, const int32_t *rows,
                        const float *w);
    /* Optional (NULL: the forward pass routes on the host, then gathers,
     * runs mlp and scatter_adds): m's routed experts for the rows of h,
     * routing included, added into out, each row taking its experts in
     * increasing expert order as scatter_add would, then (where it sets
     * *shared_done) m's shared expert. False, with nothing done, where the
     * backend does not run m so (the host's way then): that answer, and
     * *shared_done, depend on m alone, never on the batch. */
    bool (*moe)(struct sp_backend *b, const struct sp_moe *m, struct sp_tensor h, const struct sp_glu *act,
                struct sp_tensor out, bool *shared_done);
    /* For the rows of x whose want is set (want NULL: all), in order:
     * rmsnorm with norm, then head, into consecutive rows of vocab floats
     * of the host's logits. Returns how many rows. */
    int64_t (*logits)(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                      struct sp_tensor x, const bool *want, float *logits);
    /* Optional (NULL: logits, then the host's arg max): the same rows'
     * greedy choices into ids: the index of the largest logit, the first
     * of equal ones, NaN passed over (0 where every logit is NaN). Returns
     * how many rows. */
    int64_t (*argmax)(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                      struct sp_tensor x, const bool *want, int32_t *ids);
    /* Optional (NULL: logits, then sp_top_k on the host): the same rows'
     * k <= SP_TOP_K_MAX best logits each, in sp_top_k's order, into top (k
     * a row). Returns how many rows. */
    int64_t (*top_k)(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                     struct sp_tensor x, const bool *want, int64_t k, struct sp_cand *top);
};

/* The instance every backend's state begins with. */
struct sp_backend {
    const struct sp_backend_ops *ops;
    struct sp_backend_params p;  // as created (the CPU backend's n_threads as taken)
};

/* The ops of a device's backend, or NULL when this build has none. */
const struct sp_backend_ops *sp_backend_ops(enum sp_device d);
/* A backend on device d for p; a device this build lacks is an error that
 * says so. */
enum sp_status sp_backend_create(enum sp_device d, const struct sp_backend_params *p, struct sp_backend **out);
void sp_backend_free(struct sp_backend *b);
static inline enum sp_status sp_backend_tensor(struct sp_backend *b, int64_t rows, int64_t cols,
                                               struct sp_tensor *out) {
    return b->ops->tensor(b, rows, cols, out);
}

/* Memory a backend on device d would take for p, from shapes alone (the
 * planner's figures): the KV cache, and everything else it reserves for
 * batches (buffers, per-thread scratch for products of weights up to
 * widest, tables). */
size_t sp_backend_kv_bytes(enum sp_device d, const struct sp_backend_params *p);
/* Floats of one recurrent state of p's shape (the conv's last lin_conv - 1
 * inputs, then a [lin_k_dim, lin_v_dim] matrix per value head), and the
 * bytes of every state layer's slots (a sequence's and its snapshot's):
 * the part of a backend's kv_bytes that is not keys and values. */
int64_t sp_backend_state_floats(const struct sp_backend_shape *s);
size_t sp_backend_states_bytes(const struct sp_backend_params *p);
/* The memory bandwidth of a GPU device d now: bytes copied within it, each
 * read once and written once, counted both ways (the bound a product
 * streaming its weights works against). The CPU's is backend/cpu/membw.h's. */
enum sp_status sp_backend_copy_gbs(enum sp_device d, size_t bytes, double *gbs);
size_t sp_backend_work_bytes(enum sp_device d, const struct sp_backend_params *p, const struct sp_qmat *widest);
/* The free and total memory of a GPU device d now (an error without one). */
enum sp_status sp_backend_mem_info(enum sp_device d, size_t *free_bytes, size_t *total_bytes);

#endif
