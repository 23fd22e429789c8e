/*
 * forward.c - the generic forward pass. Every architecture runs through the
 * same layer loop; the descriptor (struct sp_arch) decides attention
 * details, MLP kind per layer, routing and activation, and a backend
 * (backend/backend.h) runs each step where its memory is.
 */
#include "model/forward.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/progress.h"
#include "model/expert_tier.h"
#include "model/inspect.h"
#include "model/ranks.h"

/* Weight views (prepared by the backend) and the backend's float copies of
 * the small parameters of one layer. */
struct layer {
    enum sp_layer_kind kind;
    struct sp_linear qkv, q, k, v, o;
    struct sp_linear qgate;             // attn_gate: the gates' rows of q_proj
    uint8_t *q_rows;                    // attn_gate: q_proj's rows, queries then gates (q and qgate view them)
    const float *attn_norm, *ffn_norm;  // (d)
    struct sp_attn_layer att;           // q / k norms, sinks, window
    /* Gated DeltaNet */
    struct sp_linear lqkv, lz, lb, la, lout;
    struct sp_delta_layer delta;
    /* Lightning: qkv, q / k norms in att, o; the output gate */
    struct sp_linear lgate;
    struct sp_lightning_layer light;
    /* MLA: q's bottleneck and its norm, q with the key up-projection
     * absorbed, kv_a with its rows in the attention's order, each head's
     * value up-projection (views of kv_b's rows); the output projection is o */
    struct sp_linear mq_a, mq, mkv, *muv;
    const float *mq_norm, *mkv_norm;
    uint8_t *mla_mem[2];
    /* dense MLP, or the shared expert of a MoE layer */
    struct sp_linear gate, up, down;
    bool has_mlp;
    struct sp_linear sgate;  // shared_gate: the shared expert's gate (one output)
    bool has_sgate;
    /* MoE */
    struct sp_linear router;
    float *expert_bias;  // (E) or NULL; host memory (routing on the host)
    struct sp_linear *egate, *eup, *edown, *egate_up;  // (E) each; egate_up when fused
    struct sp_moe moe;   // the same for a backend that routes on its own (ops->moe)
};

struct sp_ctx {
    const struct sp_model *m;
    const struct sp_arch *a;
    struct sp_ctx_params p;
    struct sp_step_times steps;  // p.time_steps: what each step took so far
    struct step_mark *marks;     // (STEP_MARKS) steps timed by the backend's marks in this pass
    int n_marks;
    struct sp_backend *be;
    struct layer *layers;  // (n_layers)
    struct sp_linear embed, lm_head;
    const float *out_norm;  // (d)
    struct sp_glu act;      // the MLPs' activation
    const struct sp_expert_source *experts;  // NULL: experts read through the mapping
    struct sp_expert_tier *tier;      // p.device_experts: the device's tier of experts (experts is its source)
    struct sp_expert_source tier_source;
    /* experts the tier lacks that the CPU computes meanwhile, instead of
     * copying them (p.cpu_experts, a tier over the mapped files) */
    struct sp_backend *cpu;
    struct sp_tensor ch, cgath, cgout, cout;  // (B, d) each, in host memory
    float *cpu_io;                    // ch's and cout's memory where the device's host_alloc gave it (pinned)
    bool *on_cpu;                     // (E) this layer's choice
    int32_t *ctok;                    // (B * k) the CPU's pairs: token, weight
    float *cw;
    double cpu_gbs, link_gbs;         // measured at creation: the CPU's expert bytes a second, the copies'
    double cpu_call_s;                // and the CPU's time a call beyond its bytes (waking its threads)
    uint64_t cpu_experts;
    int64_t *pf_experts;              // (n_experts) experts predicted for the next MoE layer
    struct sp_expert_views *pf_views; // (n_experts) their views into the files
    /* A device tier over the mapped files predicts the next MoE layer's
     * experts at each MoE layer's routing in steps of several tokens (its
     * copies then run while the layer computes): that layer's norm and
     * router applied to the hidden state there, into pf_h and pf_logits.
     * Else after each layer, into h. */
    bool pf_at_routing;
    struct sp_tensor pf_h, pf_logits;  // (B, d), (B, E)
    float *pf_host;                    // (B, E) staging for pf_logits
    /* batch tensors in the backend's memory, max_batch rows each */
    struct sp_tensor x, h, tmp;   // (B, d)
    struct sp_tensor qkv;         // (B, q + 2 kv): q, k, v side by side
    struct sp_tensor att;         // (B, q)
    struct sp_tensor router_out;  // (B, E)
    struct sp_tensor gath, gout;  // (B, d): rows gathered for experts, the MLPs' outputs
    struct sp_tensor qgate;       // (B, q) attn_gate: the attention output's gates
    struct sp_tensor sgate;       // (B, 1) shared_gate: the shared expert's gate logits
    struct sp_tensor lqkv, lz, lba, lout;  // linear attention's: inputs, gates, b and a, outputs
    struct sp_tensor mq;          // (B, q_lora) MLA's query bottleneck
    /* recurrent layers: the positions each sequence's state holds, and its
     * snapshot's (-1: none); a pass that failed leaves a sequence's -1 */
    int64_t *seq_len, *snap_len;  // (n_seq) each
    /* routing, on the host */
    float *router_host;  // (B, E) staging for router_out where the host cannot read it
    int32_t *sel;        // (B, k)
    float *sel_w;        // (B, k)
    int32_t *etok;       // (B * k) token of each (expert, slot)
    float *ew;           // (B * k) its weight
    int64_t *ecount;     // (E + 1) offsets
    struct sp_mlp_item *items;        // (E + 1) gated MLPs run together
    struct sp_expert_views *eviews;   // (E) the views of their experts
    int64_t *item_expert;             // (E) and the experts' numbers
    struct sp_progress *load;         // sp_ctx_create on a device: the weights' copies to it, counted
    /* expert parallelism (p.n_ranks > 1): this context's rank, the group,
     * each routed expert's rank, a MoE layer's output on the host for the
     * sum; rank 0's context holds every rank's (peers[0] is itself) */
    int rank;
    struct sp_ranks *ranks;
    const int32_t *owner;  // (n_layers * E)
    float *rank_buf;       // (B, d), where the backend copies fastest (its host_alloc: pinned, for a GPU)
    uint8_t *follow_buf;   // ranks in processes that rank 0 leads: a call's message (FOLLOW_BYTES)
    bool *follow_snap;     // (B) a followed batch's snapshot flags
    struct sp_ctx **peers;
    /* ranks in threads whose backends read each other's memory: the ranks'
     * parts of the sum under way (two rounds taking turns, n_ranks each;
     * rank 0's allocation), summed on the devices */
    const void **parts;
    int parts_turn;
    /* ranks in threads over one host expert cache: p.experts, each rank
     * holding its share of the experts one may hold at once */
    struct sp_expert_source rank_source;
    uint64_t *routes;      // p.count_routes: (n_layers * E) tokens routed to each expert (sp_ctx_route_counts)
};

/* What rank 0 of processes that it leads sends the others before each
 * call they follow: FOLLOW_HEAD int64 words (the call, its numbers), then
 * for a pass the batch's tokens, positions and sequences (int32) and its
 * snapshot flags (a byte each). */
enum { FOLLOW_FORWARD = 1, FOLLOW_COPY, FOLLOW_RESUME, FOLLOW_QUIT, FOLLOW_HEAD = 4 };
#define FOLLOW_BYTES(n) (FOLLOW_HEAD * sizeof(int64_t) + (size_t)(n) * (3 * sizeof(int32_t) + 1))

/* A step timed by backend marks, its seconds read once the pass is done. */
struct step_mark {
    int step, from, to;
};
#define STEP_MARKS 4096

/* Where a timed step begins: a backend mark (-1: none, or no room). */
static int step_begin(struct sp_ctx *c) {
    struct sp_backend *be = c->be;
    return be->ops->mark && c->n_marks < STEP_MARKS ? be->ops->mark(be) : -1;
}

/* Where step s, begun at mark m0 and host time t0, ends: its marks kept
 * for read_marks, or else the host's time to run it and wait for it. */
static void step_end(struct sp_ctx *c, enum sp_step s, int m0, double t0, double macs) {
    struct sp_backend *be = c->be;
    int m1 = m0 >= 0 ? be->ops->mark(be) : -1;
    if (m1 >= 0) {
        c->marks[c->n_marks++] = (struct step_mark){s, m0, m1};
    } else {
        be->ops->sync(be);
        c->steps.seconds[s] += sp_now_s() - t0;
    }
    c->steps.macs[s] += macs;
}

/* Runs the statement after m, adding its time and m multiply-adds to step
 * s of c when c keeps step times (m is not evaluated otherwise): the
 * device's time between marks where the backend has them, else the host's
 * time to run the step and wait for it. */
#define STEP(c, s, m, ...)                                                    \
    do {                                                                      \
        bool step_timed_ = (c)->p.time_steps;                                 \
        int step_m0_ = step_timed_ ? step_begin(c) : -1;                      \
        double step_t0_ = step_timed_ ? sp_now_s() : 0;                       \
        __VA_ARGS__;                                                          \
        if (step_timed_) step_end((c), (s), step_m0_, step_t0_, (m));         \
    } while (0)

/* The marked steps' device times, once the pass's work is done. */
static void read_marks(struct sp_ctx *c) {
    struct sp_backend *be = c->be;
    if (!c->n_marks) return;
    be->ops->sync(be);
    for (int i = 0; i < c->n_marks; i++)
        c->steps.seconds[c->marks[i].step] += be->ops->mark_seconds(be, c->marks[i].from, c->marks[i].to);
    c->n_marks = 0;
    be->ops->marks_clear(be);
}

const char *sp_step_name(enum sp_step s) {
    static const char *const names[SP_STEP_COUNT] = {"embed", "norms", "qkv", "attention", "o", "router",
                                                     "route", "experts", "move", "mlp", "lm_head"};
    return s >= 0 && s < SP_STEP_COUNT ? names[s] : "?";
}

void sp_ctx_step_times(struct sp_ctx *c, struct sp_step_times *out, bool reset) {
    *out = c->steps;
    if (reset) memset(&c->steps, 0, sizeof c->steps);
}

const uint64_t *sp_ctx_route_counts(const struct sp_ctx *c) { return c->routes; }

/* Floats per token of the MLP buffers: the widest of the dense MLP, a
 * routed expert's gate and up side by side, and the shared experts. */
static int64_t mlp_width(const struct sp_arch *a) {
    int64_t ff = a->d_ff;
    if (a->d_expert * 2 > ff) ff = a->d_expert * 2;
    if (a->d_shared > ff) ff = a->d_shared;
    return ff;
}

static bool has_kind(const struct sp_arch *a, enum sp_layer_kind k) {
    for (int64_t L = 0; L < a->n_layers; L++)
        if (a->layer_kind[L] == k) return true;
    return false;
}

/* Floats per batch token of the context's tensors. */
struct widths {
    int64_t q, kv, att, gate;        // softmax attention's (MLA's: absorbed), the output gates
    int64_t lqkv, lz, lba, lout, mq; // linear attention's, MLA's query bottleneck
};

static struct widths widths_of(const struct sp_arch *a) {
    int64_t heads, kv_heads, hd;
    sp_arch_attention_heads(a, &heads, &kv_heads, &hd);
    struct widths w = {.q = heads * hd, .kv = kv_heads * hd, .att = heads * hd, .mq = a->mla_q_lora};
    if (a->attn_gate) w.gate = w.q;
    if (has_kind(a, SP_LAYER_GATED_DELTA)) {
        w.lqkv = sp_arch_conv_dim(a);
        w.lz = w.lout = a->lin_v_heads * a->lin_v_dim;
        w.lba = 2 * a->lin_v_heads;
    }
    if (has_kind(a, SP_LAYER_MLA) && a->n_heads * a->mla_v > w.lz)  // MLA's heads' value outputs
        w.lz = a->n_heads * a->mla_v;
    if (has_kind(a, SP_LAYER_LIGHTNING)) {
        int64_t hd2 = a->n_heads * a->head_dim;
        w.lqkv = w.lqkv > 3 * hd2 ? w.lqkv : 3 * hd2;
        w.lz = w.lz > hd2 ? w.lz : hd2;
        w.lout = w.lout > hd2 ? w.lout : hd2;
    }
    return w;
}

/* The backend's parameters for a context of p (defaults filled in). */
static struct sp_backend_params backend_params(const struct sp_arch *a, const struct sp_ctx_params *p) {
    int64_t heads, kv_heads, hd;
    sp_arch_attention_heads(a, &heads, &kv_heads, &hd);
    struct sp_backend_params bp = {
        .shape = {.n_layers = a->n_layers, .d_model = a->d_model, .vocab = a->vocab, .n_heads = heads,
                  .n_kv_heads = kv_heads, .head_dim = hd, .mlp_width = mlp_width(a),
                  .n_experts = a->n_experts, .n_experts_used = a->n_experts > 0 ? a->n_experts_used : 0,
                  .expert_ff = a->n_experts > 0 ? a->d_expert : 0, .rot_dims = a->rope.rot_dims, .rope_scale = 1.0f,
                  .lin_k_heads = a->lin_k_heads, .lin_v_heads = a->lin_v_heads, .lin_k_dim = a->lin_k_dim,
                  .lin_v_dim = a->lin_v_dim, .lin_conv = a->lin_conv},
        .n_ctx = p->n_ctx, .n_seq = p->n_seq, .max_batch = p->max_batch, .kv_type = p->kv_type,
        .n_threads = p->n_threads, .float_activations = p->float_activations, .graphs = p->graphs,
        .no_overlap = p->no_overlap};
    for (int64_t L = 0; L < a->n_layers; L++) {
        enum sp_layer_kind k = a->layer_kind[L];
        bp.shape.n_kv_layers += k == SP_LAYER_ATTENTION || k == SP_LAYER_MLA;
        bp.shape.n_state_layers += k == SP_LAYER_GATED_DELTA || k == SP_LAYER_LIGHTNING;
    }
    if (has_kind(a, SP_LAYER_LIGHTNING)) {  // a state of head_dim x head_dim a head, no conv
        bp.shape.lin_k_heads = bp.shape.lin_v_heads = a->n_heads;
        bp.shape.lin_k_dim = bp.shape.lin_v_dim = a->head_dim;
        bp.shape.lin_conv = 1;
    }
    return bp;
}

size_t sp_kv_cache_bytes(const struct sp_arch *a, int64_t n_ctx, int64_t n_seq, enum sp_kv_type t) {
    struct sp_ctx_params p = {.n_ctx = n_ctx, .n_seq = (int)n_seq, .kv_type = t};
    struct sp_backend_params bp = backend_params(a, &p);
    return sp_backend_kv_bytes(SP_DEVICE_CPU, &bp);
}

/* Floats of the context's own tensors per batch token (sp_ctx_create). */
static int64_t tensor_floats(const struct sp_arch *a) {
    struct widths w = widths_of(a);
    int64_t E = a->n_experts > 0 ? a->n_experts : 1, shared_gate = a->shared_gate ? 1 : 0;
    return 5 * a->d_model + w.q + 2 * w.kv + w.att + E + w.gate + shared_gate + w.lqkv + w.lz + w.lba + w.lout + w.mq;
}

/* Bytes of the routing tables for batches of B tokens. */
static size_t routing_bytes(const struct sp_arch *a, int64_t B) {
    size_t E = (size_t)(a->n_experts > 0 ? a->n_experts : 1), K = (size_t)(a->n_experts_used > 0 ? a->n_experts_used : 1);
    return (size_t)B * (E * sizeof(float) + K * (2 * sizeof(int32_t) + 2 * sizeof(float))) + (E + 1) * sizeof(int64_t) +
           (E + 1) * sizeof(struct sp_mlp_item) + E * (sizeof(struct sp_expert_views) + sizeof(int64_t));
}

size_t sp_ctx_work_bytes(const struct sp_arch *a, int64_t max_batch, int n_threads) {
    struct sp_ctx_params p = {.n_ctx = 1, .n_seq = 1, .max_batch = max_batch, .n_threads = n_threads};
    struct sp_backend_params bp = backend_params(a, &p);
    int64_t widest = a->d_model;
    if (a->n_heads * a->head_dim > widest) widest = a->n_heads * a->head_dim;
    if (bp.shape.mlp_width > widest) widest = bp.shape.mlp_width;
    /* each thread's product scratch, sized for the widest rows */
    struct sp_qmat w = {.type = SP_QTYPE_AFFINE4, .group = 32, .rows = 1, .cols = widest};
    return (size_t)(max_batch * tensor_floats(a)) * sizeof(float) + routing_bytes(a, max_batch) +
           sp_backend_work_bytes(SP_DEVICE_CPU, &bp, &w);
}

size_t sp_ctx_device_bytes(const struct sp_arch *a, enum sp_device d, int64_t n_ctx, int n_seq, int64_t max_batch,
                           enum sp_kv_type t) {
    struct sp_ctx_params p = {.n_ctx = n_ctx, .n_seq = n_seq, .max_batch = max_batch, .kv_type = t};
    struct sp_backend_params bp = backend_params(a, &p);
    size_t tensors = (size_t)(max_batch * tensor_floats(a)) * sizeof(float);
    if (!sp_backend_ops(d)) return tensors + sp_kv_cache_bytes(a, n_ctx, n_seq, t);  // a build without it: the CPU's layout
    return tensors + sp_backend_kv_bytes(d, &bp) + sp_backend_work_bytes(d, &bp, NULL);
}

/* RoPE frequencies (as the reference implementations compute them) into
 * inv_freq (rot_dims / 2); returns the factor cos and sin are scaled by. */
static float rope_init(const struct sp_rope *r, float *inv_freq) {
    int64_t dim = r->rot_dims, half = dim / 2;
    float scale = 1.0f;
    for (int64_t i = 0; i < half; i++) {
        /* inv_freq = 1 / base^(2i/dim), in float32 like the references */
        float expo = (float)(2 * i) / (float)dim;
        float pos_freq = powf((float)r->theta, expo);
        inv_freq[i] = 1.0f / pos_freq;
    }
    if (r->kind == SP_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++) inv_freq[i] /= (float)r->factor;
    } else if (r->kind == SP_ROPE_FACTORS) {
        for (int64_t i = 0; i < half; i++) inv_freq[i] /= r->factors[i];
    } else if (r->kind == SP_ROPE_LLAMA3) {
        double old_len = (double)r->orig_max_pos;
        double low_wavelen = old_len / r->low_freq_factor, high_wavelen = old_len / r->high_freq_factor;
        for (int64_t i = 0; i < half; i++) {
            float inv = inv_freq[i];
            double wavelen = 2.0 * M_PI / inv;
            if (wavelen > low_wavelen) {
                inv_freq[i] = inv / (float)r->factor;
            } else if (wavelen >= high_wavelen) {
                float smooth = (float)((old_len / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor));
                inv_freq[i] = (1.0f - smooth) * inv / (float)r->factor + smooth * inv;
            }
        }
    } else if (r->kind == SP_ROPE_YARN) {
        double base = r->theta, f = r->factor;
        double maxp = (double)r->orig_max_pos;
        double low = (double)dim * log(maxp / (r->beta_fast * 2.0 * M_PI)) / (2.0 * log(base));
        double high = (double)dim * log(maxp / (r->beta_slow * 2.0 * M_PI)) / (2.0 * log(base));
        if (r->truncate) {
            low = floor(low);
            high = ceil(high);
        }
        if (low < 0) low = 0;
        if (high > (double)(dim - 1)) high = (double)(dim - 1);
        if (low == high) high += 0.001;
        for (int64_t i = 0; i < half; i++) {
            float pos_freq = powf((float)base, (float)(2 * i) / (float)dim);
            float extrap = 1.0f / pos_freq, interp = 1.0f / ((float)f * pos_freq);
            float ramp = (float)(((double)i - low) / (high - low));
            ramp = ramp < 0 ? 0 : ramp > 1 ? 1 : ramp;
            float extrap_factor = 1.0f - ramp;
            inv_freq[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
        }
        double af = r->attention_factor;
        if (af <= 0) af = f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;
        scale = (float)af;
    }
    return scale;
}

/* ---- setup ---- */

/* A 1-D parameter as floats in the backend's memory; an RMSNorm's weight
 * w as 1 + w where the model scales by that (sp_model.norm_plus_one). */
static const float *vec(struct sp_ctx *c, int64_t layer, enum sp_role role, enum sp_status *st) {
    struct sp_vector v;
    const float *f = NULL;
    if (*st != SP_OK) return NULL;
    *st = sp_model_vector(c->m, layer, role, &v);
    if (*st != SP_OK) return NULL;
    bool plus_one = c->m->norm_plus_one && (role == SP_ROLE_ATTN_NORM || role == SP_ROLE_FFN_NORM ||
                                           role == SP_ROLE_OUT_NORM || role == SP_ROLE_ATTN_Q_NORM ||
                                           role == SP_ROLE_ATTN_K_NORM);
    float *shifted = NULL;
    if (plus_one) {
        if (!(shifted = sp_malloc((size_t)v.n * sizeof *shifted, SP_MEM_MISC))) {
            *st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            return NULL;
        }
        sp_vector_to_f32(&v, shifted);
        for (int64_t i = 0; i < v.n; i++) shifted[i] += 1.0f;  // in float32, as the reference adds it
        v = (struct sp_vector){shifted, SP_DTYPE_F32, v.n};
    }
    *st = c->be->ops->vector(c->be, &v, &f);
    sp_free(shifted);
    return f;
}

/* A 1-D parameter as floats on the host. */
static float *host_vec(const struct sp_model *m, int64_t layer, enum sp_role role, enum sp_status *st) {
    struct sp_vector v;
    if (*st != SP_OK) return NULL;
    *st = sp_model_vector(m, layer, role, &v);
    if (*st != SP_OK) return NULL;
    float *f = sp_malloc((size_t)v.n * sizeof *f, SP_MEM_WEIGHTS);
    if (!f) {
        *st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        return NULL;
    }
    sp_vector_to_f32(&v, f);
    return f;
}

/* The linear of (L, r, e), made ready by the backend. */
/* Prepares l for the backend, its bytes counted in the load. */
static enum sp_status prepared(struct sp_ctx *c, struct sp_linear *l, double bytes) {
    enum sp_status st = c->be->ops->prepare(c->be, l);
    if (st == SP_OK && c->load) sp_progress_add(c->load, (uint64_t)bytes);
    return st;
}

static enum sp_status lin(struct sp_ctx *c, int64_t L, enum sp_role r, int64_t e, struct sp_linear *out) {
    enum sp_status st = sp_model_linear(c->m, L, r, e, out);
    return st != SP_OK ? st : prepared(c, out, sp_linear_bytes(out));
}

/* A gate's linear (a router, the shared expert's gate), made ready with its
 * activations kept in float: a rounding must not change what it chooses. */
static enum sp_status gate_lin(struct sp_ctx *c, int64_t L, enum sp_role r, struct sp_linear *out) {
    enum sp_status st = sp_model_linear(c->m, L, r, -1, out);
    if (st != SP_OK) return st;
    out->float_activations = true;
    return c->be->ops->prepare(c->be, out);
}

/* A routed expert's linear: made ready by the backend, or (prepare false)
 * the view into the files. */
static enum sp_status expert_lin(struct sp_ctx *c, int64_t L, enum sp_role r, int64_t e, bool prepare,
                                 struct sp_linear *out) {
    return prepare ? lin(c, L, r, e, out) : sp_model_linear(c->m, L, r, e, out);
}

static enum sp_route route_kind(enum sp_router_kind k) {
    switch (k) {
    case SP_ROUTER_TOPK_SOFTMAX: return SP_ROUTE_TOPK_SOFTMAX;
    case SP_ROUTER_SIGMOID_GROUP_TOPK: return SP_ROUTE_SIGMOID_GROUP_TOPK;
    case SP_ROUTER_SOFTMAX_GROUP_TOPK: return SP_ROUTE_SOFTMAX_GROUP_TOPK;
    default: return SP_ROUTE_SOFTMAX_TOPK;
    }
}

/* Rows [r0, r0 + n) of l (stored in row order). */
static struct sp_linear linear_rows(const struct sp_linear *l, int64_t r0, int64_t n) {
    struct sp_linear out = *l;
    const void *ptr[4];
    size_t len[4];
    int parts = sp_linear_parts(l, ptr, len);
    const void **fields[4] = {&out.w.codes, &out.w.scales, &out.w.biases, &out.bias};
    for (int k = 0, fi = 0; k < parts; k++) {
        while (*fields[fi] != ptr[k]) fi++;  // parts come in the order codes, scales, [biases], [bias]
        *fields[fi] = (const uint8_t *)ptr[k] + (size_t)r0 * (len[k] / (size_t)l->w.rows);
    }
    out.w.rows = n;
    return out;
}

/* A copy of l's rows in a new order (row r of the copy is row from[r] of
 * l, n rows) into *mem (owned by the caller), *out viewing it. */
static enum sp_status reorder_rows(const struct sp_linear *l, const int64_t *from, int64_t n, uint8_t **mem,
                                   struct sp_linear *out) {
    if (l->transposed || l->w.interleaved)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: rows to reorder must be stored in row order",
                         l->slot && l->slot->module ? l->slot->module : "a weight");
    const void *ptr[4];
    size_t len[4], total = 0;
    int parts = sp_linear_parts(l, ptr, len);
    for (int k = 0; k < parts; k++) total += (len[k] / (size_t)l->w.rows * (size_t)n + 63) / 64 * 64;
    if (!(*mem = sp_malloc_huge(total ? total : 64, SP_MEM_WEIGHTS))) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    *out = *l;
    const void **fields[4] = {&out->w.codes, &out->w.scales, &out->w.biases, &out->bias};
    size_t off = 0;
    for (int k = 0, fi = 0; k < parts; k++) {
        while (*fields[fi] != ptr[k]) fi++;  // parts come in the order codes, scales, [biases], [bias]
        size_t row = len[k] / (size_t)l->w.rows;
        for (int64_t r = 0; r < n; r++)
            memcpy(*mem + off + (size_t)r * row, (const uint8_t *)ptr[k] + (size_t)from[r] * row, row);
        *fields[fi] = *mem + off;
        off += (row * (size_t)n + 63) / 64 * 64;
    }
    out->w.rows = n;
    return SP_OK;
}

/* A gated attention's q_proj gives each head's query rows then its gate
 * rows: a copy of its rows with every head's queries first, then every
 * head's gates, viewed as q and qgate (a few MiB a layer, so the queries
 * land beside the keys and values as attention takes them). */
static enum sp_status ungate_queries(struct sp_ctx *c, int64_t L, struct layer *ly) {
    const struct sp_arch *a = c->a;
    struct sp_linear qg, moved;
    enum sp_status st = sp_model_linear(c->m, L, SP_ROLE_ATTN_Q, -1, &qg);
    if (st != SP_OK) return st;
    int64_t hd = a->head_dim, q = a->n_heads * hd, rows = qg.w.rows;
    int64_t *from = sp_malloc((size_t)rows * sizeof *from, SP_MEM_MISC);
    if (!from) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t r = 0; r < rows; r++) {
        int64_t h = r / (2 * hd), i = r % (2 * hd);
        from[i < hd ? h * hd + i : q + h * hd + (i - hd)] = r;
    }
    st = reorder_rows(&qg, from, rows, &ly->q_rows, &moved);
    sp_free(from);
    if (st != SP_OK) return st;
    ly->q = linear_rows(&moved, 0, q);
    ly->qgate = linear_rows(&moved, q, q);
    if ((st = prepared(c, &ly->q, sp_linear_bytes(&ly->q))) != SP_OK) return st;
    return prepared(c, &ly->qgate, sp_linear_bytes(&ly->qgate));
}

/* MLA's rotary dims come interleaved (pairs 2i, 2i + 1); attention rotates
 * halves (i, i + rot / 2): the same scores once queries and keys both take
 * the dims in the order 0, 2, 4, ..., 1, 3, 5, ... */
static int64_t halves_of_pairs(int64_t i, int64_t rot) { return i < rot / 2 ? 2 * i : 2 * (i - rot / 2) + 1; }

/* y += a x (n floats). */
static void axpy(float *restrict y, float a, const float *restrict x, int64_t n) {
    for (int64_t i = 0; i < n; i++) y[i] += a * x[i];
}

/* A float32 matrix of rows x cols in mem (owned by the caller) as a linear. */
static struct sp_linear f32_linear(float *mem, int64_t rows, int64_t cols) {
    struct sp_linear l = {.w = {.type = SP_QTYPE_F32, .group = 1, .rows = rows, .cols = cols,
                                .scale_dtype = SP_DTYPE_COUNT, .codes = (const uint8_t *)mem}};
    return l;
}

/* An MLA layer as softmax attention over a cache of latents: keys [k_rope,
 * c] and values [k_rope, c] of one shared head (c the normed latent), each
 * head's query [q_rope, W_uk^T q_nope] scaled so attention's
 * (rope + kv_lora)^-1/2 gives the reference's (nope + rope)^-1/2 (times
 * YaRN's mscale^2), then each head's latent output through its W_uv (its
 * rows of kv_b, as stored) and the output projection. The query's matrix
 * is float32, composed here from the weights (for Ling-2.6-flash 108 MiB a
 * layer). */
static enum sp_status load_mla(struct sp_ctx *c, int64_t L, struct layer *ly) {
    const struct sp_arch *a = c->a;
    int64_t H = a->n_heads, nope = a->mla_nope, rope = a->mla_rope, kvl = a->mla_kv_lora, vd = a->mla_v;
    int64_t Dq = rope + kvl;
    enum sp_status st = SP_OK;
    struct sp_linear qb, kvb, kva;
    if (a->mla_q_lora) {
        ly->mq_norm = vec(c, L, SP_ROLE_MLA_Q_A_NORM, &st);
        if (st != SP_OK || (st = lin(c, L, SP_ROLE_MLA_Q_A, -1, &ly->mq_a)) != SP_OK) return st;
    }
    ly->mkv_norm = vec(c, L, SP_ROLE_MLA_KV_A_NORM, &st);
    if (st != SP_OK ||
        (st = sp_model_linear(c->m, L, a->mla_q_lora ? SP_ROLE_MLA_Q_B : SP_ROLE_MLA_Q, -1, &qb)) != SP_OK ||
        (st = sp_model_linear(c->m, L, SP_ROLE_MLA_KV_B, -1, &kvb)) != SP_OK ||
        (st = sp_model_linear(c->m, L, SP_ROLE_MLA_KV_A, -1, &kva)) != SP_OK ||
        (st = lin(c, L, SP_ROLE_ATTN_O, -1, &ly->o)) != SP_OK)
        return st;
    if (qb.transposed || qb.w.interleaved || kvb.transposed || kvb.w.interleaved)
        return sp_errorf(SP_ERR_UNSUPPORTED, "layer %lld: MLA's q and kv_b weights must be in row order", (long long)L);
    /* kv_a's rows: the rotary key (as halves), then the latent */
    int64_t from[4096];
    if (Dq > 4096)
        return sp_errorf(SP_ERR_UNSUPPORTED, "layer %lld: an MLA latent of %lld dims", (long long)L, (long long)Dq);
    for (int64_t i = 0; i < rope; i++) from[i] = kvl + halves_of_pairs(i, rope);
    for (int64_t j = 0; j < kvl; j++) from[rope + j] = j;
    if ((st = reorder_rows(&kva, from, Dq, &ly->mla_mem[0], &ly->mkv)) != SP_OK ||
        (st = prepared(c, &ly->mkv, sp_linear_bytes(&kva))) != SP_OK)
        return st;
    /* each head's W_uv, as stored */
    if (!(ly->muv = sp_calloc((size_t)H, sizeof *ly->muv, SP_MEM_MODEL)))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t h = 0; h < H; h++) {
        ly->muv[h] = linear_rows(&kvb, h * (nope + vd) + nope, vd);
        if ((st = prepared(c, &ly->muv[h], sp_linear_bytes(&ly->muv[h]))) != SP_OK) return st;
    }
    /* W_uk rows of every head, as floats */
    int64_t qc = qb.w.cols;
    float *wk = sp_malloc((size_t)(H * nope * kvl) * sizeof *wk, SP_MEM_MISC);
    float *row = sp_malloc((size_t)qc * sizeof *row, SP_MEM_MISC);
    float *qm = sp_malloc_huge((size_t)(H * Dq * qc) * sizeof *qm, SP_MEM_WEIGHTS);
    ly->mla_mem[1] = (uint8_t *)qm;
    if (!wk || !row || !qm) {
        sp_free(wk);
        sp_free(row);
        return sp_errorf(SP_ERR_NOMEM, "out of memory for layer %lld's MLA matrices", (long long)L);
    }
    for (int64_t h = 0; h < H; h++)
        for (int64_t i = 0; i < nope; i++)
            sp_qmat_dequant_row_ref(&kvb.w, h * (nope + vd) + i, wk + (h * nope + i) * kvl);
    float scale = sqrtf((float)Dq) / sqrtf((float)(nope + rope)) * (float)a->mla_mscale;
    memset(qm, 0, (size_t)(H * Dq * qc) * sizeof *qm);
    for (int64_t h = 0; h < H; h++) {
        float *qh = qm + h * Dq * qc;
        for (int64_t i = 0; i < rope; i++) {
            sp_qmat_dequant_row_ref(&qb.w, h * (nope + rope) + nope + halves_of_pairs(i, rope), row);
            for (int64_t x = 0; x < qc; x++) qh[i * qc + x] = scale * row[x];
        }
        for (int64_t i = 0; i < nope; i++) {  // q_lat[j] = sum_i W_uk[i][j] q_nope[i]
            sp_qmat_dequant_row_ref(&qb.w, h * (nope + rope) + i, row);
            const float *uk = wk + (h * nope + i) * kvl;
            for (int64_t j = 0; j < kvl; j++) axpy(qh + (rope + j) * qc, scale * uk[j], row, qc);
        }
    }
    sp_free(wk);
    sp_free(row);
    ly->mq = f32_linear(qm, H * Dq, qc);
    if ((st = prepared(c, &ly->mq, sp_linear_bytes(&qb))) != SP_OK) return st;
    ly->att = (struct sp_attn_layer){.layer = ly->att.layer, .eps = (float)a->norm_eps};
    return SP_OK;
}

void sp_model_composed(const struct sp_model *m, size_t *held, size_t *replaced) {
    const struct sp_arch *a = &m->arch;
    *held = *replaced = 0;
    for (int64_t L = 0; L < a->n_layers; L++) {
        struct sp_linear l;
        if (a->attn_gate && a->layer_kind[L] == SP_LAYER_ATTENTION &&
            sp_model_linear(m, L, SP_ROLE_ATTN_Q, -1, &l) == SP_OK) {
            *held += (size_t)sp_linear_bytes(&l);
            *replaced += (size_t)sp_linear_bytes(&l);
        }
        if (a->layer_kind[L] != SP_LAYER_MLA) continue;
        int64_t H = a->n_heads, Dq = a->mla_rope + a->mla_kv_lora, qc = a->mla_q_lora ? a->mla_q_lora : a->d_model;
        *held += (size_t)(H * Dq * qc) * sizeof(float);
        /* the query's matrix stands for q_b and kv_b's key rows; kv_a's reordered copy for kv_a */
        if (sp_model_linear(m, L, a->mla_q_lora ? SP_ROLE_MLA_Q_B : SP_ROLE_MLA_Q, -1, &l) == SP_OK)
            *replaced += (size_t)sp_linear_bytes(&l);
        if (sp_model_linear(m, L, SP_ROLE_MLA_KV_B, -1, &l) == SP_OK)
            *replaced += (size_t)(sp_linear_bytes(&l) * (double)a->mla_nope / (double)(a->mla_nope + a->mla_v));
        if (sp_model_linear(m, L, SP_ROLE_MLA_KV_A, -1, &l) == SP_OK) {
            *held += (size_t)sp_linear_bytes(&l);
            *replaced += (size_t)sp_linear_bytes(&l);
        }
    }
    sp_error_clear();
}

/* A Lightning layer's parameters (its projections load as attention's):
 * each head's decay from its ALiBi-style slope and the layer's depth. */
static enum sp_status load_lightning(struct sp_ctx *c, int64_t L, int64_t state, struct layer *ly) {
    const struct sp_arch *a = c->a;
    enum sp_status st = SP_OK;
    int64_t H = a->n_heads;
    ly->light = (struct sp_lightning_layer){.layer = state, .groups = a->light_groups, .eps = (float)a->norm_eps};
    ly->light.norm = vec(c, L, SP_ROLE_LIGHT_NORM, &st);
    if (st != SP_OK || (st = lin(c, L, SP_ROLE_LIGHT_GATE, -1, &ly->lgate)) != SP_OK) return st;
    /* slopes 2^(-8 (h + 1) / n) for n a power of two; otherwise the nearest
     * power's, then every other of twice it (as the reference builds them) */
    float decay[1024];
    if (H > 1024) return sp_errorf(SP_ERR_UNSUPPORTED, "%lld Lightning heads", (long long)H);
    int64_t p2 = 1;
    while (p2 * 2 <= H) p2 *= 2;
    double depth =
        a->n_layers > 1 ? 1.0 - (double)(L - a->light_offset) / (double)(a->n_layers - 1) + 1e-5 : 1.0 + 1e-5;
    for (int64_t h = 0; h < H; h++) {
        double slope = h < p2 ? pow(2.0, -8.0 * (double)(h + 1) / (double)p2)
                              : pow(2.0, -8.0 * (double)(2 * (h - p2) + 1) / (double)(2 * p2));
        decay[h] = expf((float)(-(double)(float)slope * depth));
    }
    struct sp_vector dv = {decay, SP_DTYPE_F32, H};
    if ((st = c->be->ops->vector(c->be, &dv, &ly->light.decay)) != SP_OK) return st;
    ly->light.q_norm = ly->att.q_norm;
    ly->light.k_norm = ly->att.k_norm;
    return SP_OK;
}

/* A Gated DeltaNet layer's projections and parameters. */
static enum sp_status load_delta(struct sp_ctx *c, int64_t L, int64_t state, struct layer *ly) {
    enum sp_status st = SP_OK;
    ly->delta = (struct sp_delta_layer){.layer = state, .eps = (float)c->a->norm_eps};
    ly->delta.conv = vec(c, L, SP_ROLE_LIN_CONV, &st);
    ly->delta.a_log = vec(c, L, SP_ROLE_LIN_A_LOG, &st);
    ly->delta.dt_bias = vec(c, L, SP_ROLE_LIN_DT_BIAS, &st);
    ly->delta.norm = vec(c, L, SP_ROLE_LIN_NORM, &st);
    if (st != SP_OK) return st;
    const enum sp_role roles[] = {SP_ROLE_LIN_QKV, SP_ROLE_LIN_Z, SP_ROLE_LIN_B, SP_ROLE_LIN_A, SP_ROLE_LIN_OUT};
    struct sp_linear *lins[] = {&ly->lqkv, &ly->lz, &ly->lb, &ly->la, &ly->lout};
    for (int i = 0; i < 5 && st == SP_OK; i++) st = lin(c, L, roles[i], -1, lins[i]);
    return st;
}

/* Whether this context is a rank of ranks in threads (rank 0's context holding the others'). */
static bool rank_in_threads(const struct sp_ctx *c) { return c->owner && !c->p.group; }

/* Whether this context's rank computes routed expert e of layer L. */
static bool owns(const struct sp_ctx *c, int64_t L, int64_t e) {
    return !c->owner || c->owner[L * c->a->n_experts + e] == c->rank;
}

static enum sp_status load_layer(struct sp_ctx *c, int64_t L, int64_t *kv_layers, int64_t *state_layers) {
    const struct sp_model *m = c->m;
    const struct sp_arch *a = c->a;
    struct layer *ly = &c->layers[L];
    enum sp_status st = SP_OK;
    ly->kind = a->layer_kind[L];
    ly->attn_norm = vec(c, L, SP_ROLE_ATTN_NORM, &st);
    ly->ffn_norm = vec(c, L, SP_ROLE_FFN_NORM, &st);
    if (st == SP_OK && ly->kind == SP_LAYER_GATED_DELTA) st = load_delta(c, L, (*state_layers)++, ly);
    if (st != SP_OK) return st;
    if (ly->kind == SP_LAYER_GATED_DELTA) goto mlp;
    if (ly->kind == SP_LAYER_MLA) {
        ly->att.layer = (*kv_layers)++;
        if ((st = load_mla(c, L, ly)) != SP_OK) return st;
        goto mlp;
    }
    ly->att = (struct sp_attn_layer){.layer = ly->kind == SP_LAYER_LIGHTNING ? -1 : (*kv_layers)++,
                                     .eps = (float)a->norm_eps};
    if (a->qk_norm) {
        ly->att.q_norm = vec(c, L, SP_ROLE_ATTN_Q_NORM, &st);
        ly->att.k_norm = vec(c, L, SP_ROLE_ATTN_K_NORM, &st);
    }
    if (a->attn_sinks) ly->att.sinks = vec(c, L, SP_ROLE_ATTN_SINKS, &st);
    if (a->layer_sliding[L] && a->sliding_window > 0) ly->att.window = a->sliding_window;
    if (st != SP_OK) return st;
    if (a->fused_qkv) {
        if ((st = lin(c, L, SP_ROLE_ATTN_QKV, -1, &ly->qkv)) != SP_OK) return st;
    } else {
        if ((st = a->attn_gate ? ungate_queries(c, L, ly) : lin(c, L, SP_ROLE_ATTN_Q, -1, &ly->q)) != SP_OK) return st;
        if ((st = lin(c, L, SP_ROLE_ATTN_K, -1, &ly->k)) != SP_OK) return st;
        if ((st = lin(c, L, SP_ROLE_ATTN_V, -1, &ly->v)) != SP_OK) return st;
    }
    if ((st = lin(c, L, SP_ROLE_ATTN_O, -1, &ly->o)) != SP_OK) return st;
    if (ly->kind == SP_LAYER_LIGHTNING && (st = load_lightning(c, L, (*state_layers)++, ly)) != SP_OK) return st;
mlp:
    if (!a->layer_moe[L] || a->n_shared_experts > 0) {
        enum sp_role g = a->layer_moe[L] ? SP_ROLE_SHEXP_GATE : SP_ROLE_FFN_GATE;
        enum sp_role u = a->layer_moe[L] ? SP_ROLE_SHEXP_UP : SP_ROLE_FFN_UP;
        enum sp_role d = a->layer_moe[L] ? SP_ROLE_SHEXP_DOWN : SP_ROLE_FFN_DOWN;
        if ((st = lin(c, L, g, -1, &ly->gate)) != SP_OK) return st;
        if ((st = lin(c, L, u, -1, &ly->up)) != SP_OK) return st;
        if ((st = lin(c, L, d, -1, &ly->down)) != SP_OK) return st;
        ly->has_mlp = true;
        if (a->layer_moe[L] && a->shared_gate) {
            if ((st = gate_lin(c, L, SP_ROLE_SHEXP_ROUTE, &ly->sgate)) != SP_OK) return st;
            ly->has_sgate = true;
        }
    }
    if (!a->layer_moe[L]) return SP_OK;
    if ((st = gate_lin(c, L, SP_ROLE_ROUTER, &ly->router)) != SP_OK) return st;
    if (sp_weights_find(&m->weights, L, SP_ROLE_EXPERT_BIAS, -1)) {
        ly->expert_bias = host_vec(m, L, SP_ROLE_EXPERT_BIAS, &st);
        if (st != SP_OK) return st;
    }
    size_t n = (size_t)a->n_experts;
    ly->edown = sp_calloc(n, sizeof *ly->edown, SP_MEM_MODEL);
    if (m->fused_gate_up)
        ly->egate_up = sp_calloc(n, sizeof *ly->egate_up, SP_MEM_MODEL);
    else {
        ly->egate = sp_calloc(n, sizeof *ly->egate, SP_MEM_MODEL);
        ly->eup = sp_calloc(n, sizeof *ly->eup, SP_MEM_MODEL);
    }
    if (!ly->edown || (m->fused_gate_up ? !ly->egate_up : (!ly->egate || !ly->eup)))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    /* with a device tier the experts stay views into the files: the tier copies them in as they are used */
    bool prepare = !c->p.device_experts;
    for (int64_t e = 0; e < a->n_experts; e++) {
        bool mine = prepare && owns(c, L, e);  // another rank's expert stays a view, never read here
        if (m->fused_gate_up) {
            if ((st = expert_lin(c, L, SP_ROLE_EXP_GATE_UP, e, mine, &ly->egate_up[e])) != SP_OK) return st;
        } else {
            if ((st = expert_lin(c, L, SP_ROLE_EXP_GATE, e, mine, &ly->egate[e])) != SP_OK ||
                (st = expert_lin(c, L, SP_ROLE_EXP_UP, e, mine, &ly->eup[e])) != SP_OK)
                return st;
        }
        if ((st = expert_lin(c, L, SP_ROLE_EXP_DOWN, e, mine, &ly->edown[e])) != SP_OK) return st;
    }
    if (c->be->ops->moe && prepare) {
        ly->moe = (struct sp_moe){.layer = L, .router = &ly->router, .route = route_kind(a->router),
                                  .n_experts = a->n_experts, .k = a->n_experts_used, .n_group = a->n_group,
                                  .topk_group = a->topk_group, .norm_topk = a->norm_topk_prob,
                                  .routed_scale = (float)a->routed_scale, .gate = ly->egate, .up = ly->eup,
                                  .gate_up = ly->egate_up, .down = ly->edown,
                                  .owner = c->owner ? c->owner + L * a->n_experts : NULL, .rank = c->rank};
        if (ly->has_mlp && !ly->has_sgate && c->rank == 0)  // of split experts, rank 0's
            ly->moe.shared_gate = &ly->gate, ly->moe.shared_up = &ly->up, ly->moe.shared_down = &ly->down;
        if (ly->expert_bias) ly->moe.bias = vec(c, L, SP_ROLE_EXPERT_BIAS, &st);
    }
    return st;
}

/* ---- expert views ---- */

static struct sp_linear *view_at(struct sp_expert_views *v, int i) {
    struct sp_linear *ls[4] = {&v->gate, &v->up, &v->down, &v->gate_up};
    return ls[i];
}

static bool view_used(const struct sp_expert_views *v, int i) { return v->fused ? (i == 2 || i == 3) : i < 3; }

static size_t align_up(size_t n, size_t align) { return (n + align - 1) / align * align; }

size_t sp_expert_views_move(struct sp_expert_views *v, uint8_t *mem, size_t align,
                            void (*copy)(void *ctx, void *dst, const void *src, size_t bytes), void *ctx) {
    size_t off = 0, bytes = 0;
    for (int i = 0; i < 4; i++) {
        if (!view_used(v, i)) continue;
        struct sp_linear *l = view_at(v, i);
        const void *ptr[4];
        size_t len[4];
        int n = sp_linear_parts(l, ptr, len);
        /* parts come in the order codes, scales, [biases], [bias] */
        const void **fields[4] = {&l->w.codes, &l->w.scales, &l->w.biases, &l->bias};
        int fi = 0;
        for (int k = 0; k < n; k++) {
            while (fi < 4 && ptr[k] != *fields[fi]) fi++;
            SP_ASSERT(fi < 4);
            if (copy) copy(ctx, mem + off, ptr[k], len[k]);
            *fields[fi] = mem + off;
            off += align_up(len[k], align);
            bytes += len[k];
        }
    }
    return bytes;
}

int sp_expert_views_parts(const struct sp_expert_views *v, const void **ptr, size_t *len) {
    int n = 0;
    for (int i = 0; i < 4; i++)
        if (view_used(v, i)) n += sp_linear_parts(view_at((struct sp_expert_views *)v, i), ptr + n, len + n);
    return n;
}

size_t sp_expert_views_span(const struct sp_expert_views *v, size_t align) {
    const void *ptr[SP_EXPERT_MAX_PARTS];
    size_t len[SP_EXPERT_MAX_PARTS], total = 0;
    int n = sp_expert_views_parts(v, ptr, len);
    for (int k = 0; k < n; k++) total += align_up(len[k], align);
    return total;
}

/* Expert e of a layer as views into the mapped files. */
static struct sp_expert_views mapped_expert(const struct layer *ly, int64_t e) {
    struct sp_expert_views v = {.fused = ly->egate_up != NULL, .down = ly->edown[e]};
    if (v.fused)
        v.gate_up = ly->egate_up[e];
    else
        v.gate = ly->egate[e], v.up = ly->eup[e];
    return v;
}

/* Makes the mapped experts the device tier copies from fast to copy (where
 * it cannot, the copies stay slower: nothing fails): a process's rank its
 * own, any other context every expert. Called once the context's weights are
 * on the device: a copy from a page registered only in part is refused. */
static void pin_experts(struct sp_ctx *c) {
    const struct sp_arch *a = c->a;
    struct sp_expert_views *v = sp_malloc((size_t)(a->n_layers * a->n_experts) * sizeof *v, SP_MEM_MISC);
    if (!v) return;
    int64_t n = 0;
    for (int64_t L = 0; L < a->n_layers; L++)
        for (int64_t e = 0; a->layer_moe[L] && e < a->n_experts; e++)
            if (!c->p.group || owns(c, L, e)) v[n++] = mapped_expert(&c->layers[L], e);
    double t0 = sp_now_s();
    size_t pinned = sp_expert_tier_pin(c->tier, v, n);
    if (pinned)
        sp_log(SP_LOG_INFO, "experts: %.1f MiB of host memory pinned for copies to the device in %.2f s",
               (double)pinned / 1048576.0, sp_now_s() - t0);
    sp_free(v);
}

/* Bytes of expert e's weights a product reads. */
static double expert_bytes(const struct layer *ly, int64_t e) {
    struct sp_expert_views v = mapped_expert(ly, e);
    return v.fused ? sp_linear_bytes(&v.gate_up) + sp_linear_bytes(&v.down)
                   : sp_linear_bytes(&v.gate) + sp_linear_bytes(&v.up) + sp_linear_bytes(&v.down);
}

/* An MLP item of expert views v on rows x. */
static struct sp_mlp_item expert_item(const struct sp_expert_views *v, struct sp_tensor x, int64_t row) {
    return (struct sp_mlp_item){v->fused ? NULL : &v->gate, v->fused ? NULL : &v->up, v->fused ? &v->gate_up : NULL,
                                &v->down, x, row};
}

/* Experts a device tier lacks may be computed by the CPU while the device
 * copies others in: a CPU backend for them with the threads asked for (the
 * device's own backend runs one), and both rates measured once - the CPU's
 * on one token's products through one expert a call and through several in
 * one call (a call's fixed time and a byte's), the copies' on the tier's
 * first slots (which stay filled) - for moe()'s choice. */
static enum sp_status cpu_experts_init(struct sp_ctx *c, const struct sp_backend_params *dev, int threads) {
    const struct sp_arch *a = c->a;
    struct sp_backend_params bp = *dev;
    bp.n_ctx = 1;
    bp.n_seq = 1;
    bp.n_threads = threads;
    bp.float_activations = false;
    enum sp_status st = sp_backend_create(SP_DEVICE_CPU, &bp, &c->cpu);
    int64_t B = c->p.max_batch, d = a->d_model, K = a->n_experts_used;
    /* the hidden state's way to the CPU and its sum's way back in memory
     * the device copies from and to at the link's speed (pinned: a
     * 512-token chunk's 8 MiB each way at 9 GB/s from pageable memory cost
     * prefill 5% on Ling-flash-2.0 shapes) */
    if (st == SP_OK && c->be->ops->host_alloc) {
        c->cpu_io = c->be->ops->host_alloc((size_t)(2 * B * d) * sizeof(float), SP_MEM_ACT);
        if (!c->cpu_io) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        c->ch = (struct sp_tensor){c->cpu_io, B, d, d};
        c->cout = (struct sp_tensor){c->cpu_io + B * d, B, d, d};
    }
    if (st != SP_OK || (!c->cpu_io && (st = sp_backend_tensor(c->cpu, B, d, &c->ch)) != SP_OK) ||
        (st = sp_backend_tensor(c->cpu, B, d, &c->cgath)) != SP_OK ||
        (st = sp_backend_tensor(c->cpu, B, d, &c->cgout)) != SP_OK ||
        (!c->cpu_io && (st = sp_backend_tensor(c->cpu, B, d, &c->cout)) != SP_OK))
        return st;
    c->on_cpu = sp_calloc((size_t)a->n_experts, sizeof *c->on_cpu, SP_MEM_ACT);
    c->ctok = sp_malloc((size_t)(B * K) * sizeof *c->ctok, SP_MEM_ACT);
    c->cw = sp_malloc((size_t)(B * K) * sizeof *c->cw, SP_MEM_ACT);
    if (!c->on_cpu || !c->ctok || !c->cw) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    int64_t L0 = -1;
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (!a->layer_moe[L]) continue;
        if (L0 < 0) L0 = L;
        struct sp_expert_views v = mapped_expert(&c->layers[L], 0);
        for (int i = 0; i < 4; i++)  // the products' scratch
            if (view_used(&v, i) && (st = c->cpu->ops->prepare(c->cpu, view_at(&v, i))) != SP_OK) return st;
    }
    /* the CPU: one token through distinct experts as a decode step finds
     * them (read before, their pages mapped, but no longer in the cache: a
     * first pass over more experts than the measured ones, these first),
     * after one that wakes its threads: 4 calls of one expert, then one of
     * up to K */
    int64_t most = K < 8 ? K : 8, e = 0, many = 0;
    if (most > B) most = B;
    for (int64_t r = 0; r < d * most; r++) c->cgath.data[r] = 0.01f * (float)(r % 7);
    for (int64_t f = 0, passed = 0; f < a->n_experts && f < 5 + 4 * most; f += passed) {
        for (passed = 0; passed < most && f + passed < a->n_experts; passed++) {
            c->eviews[passed] = mapped_expert(&c->layers[L0], f + passed);
            c->items[passed] = expert_item(&c->eviews[passed], sp_tensor_rows(c->cgath, passed, 1), passed);
        }
        c->cpu->ops->mlp(c->cpu, c->items, passed, &c->act, c->cgout);
    }
    double b1 = 0, t1 = 0, bk = 0, tk = 0;
    for (; e < a->n_experts && e < 5; e++) {
        c->eviews[0] = mapped_expert(&c->layers[L0], e);
        c->items[0] = expert_item(&c->eviews[0], sp_tensor_rows(c->cgath, 0, 1), 0);
        double t0 = sp_now_s();
        c->cpu->ops->mlp(c->cpu, c->items, 1, &c->act, c->cgout);
        if (e == 0) continue;
        t1 += sp_now_s() - t0;
        b1 += expert_bytes(&c->layers[L0], e);
    }
    int64_t ones = e > 1 ? e - 1 : 0;
    for (; e < a->n_experts && many < most; e++, many++) {
        c->eviews[many] = mapped_expert(&c->layers[L0], e);
        c->items[many] = expert_item(&c->eviews[many], sp_tensor_rows(c->cgath, many, 1), many);
        bk += expert_bytes(&c->layers[L0], e);
    }
    if (many > 1) {
        double t0 = sp_now_s();
        c->cpu->ops->mlp(c->cpu, c->items, many, &c->act, c->cgout);
        tk = sp_now_s() - t0;
    }
    double per = ones > 0 ? b1 / (double)ones : 0, one_t = ones > 0 ? t1 / (double)ones : 0;
    /* t = call + bytes / rate through (per, one_t) and (bk, tk) */
    double rate = many > 1 && tk > one_t && bk > per ? (bk - per) / (tk - one_t) : one_t > 0 ? per / one_t : 1e9;
    c->cpu_gbs = c->p.cpu_expert_gbs > 0 ? c->p.cpu_expert_gbs : rate / 1e9;
    c->cpu_call_s = c->p.cpu_expert_gbs > 0 || one_t <= per / rate ? 0 : one_t - per / rate;
    /* the copies: the first experts into the tier, in layer order */
    struct sp_expert_tier_stats s0, s1;
    sp_expert_tier_stats(c->tier, &s0);
    double t0 = sp_now_s();
    int64_t filled = 0, want = 16;
    for (int64_t L = L0; L < a->n_layers && filled < want && filled < c->experts->window; L++)
        for (int64_t f = 0; a->layer_moe[L] && f < a->n_experts && filled < want && filled < c->experts->window; f++) {
            if (!owns(c, L, f)) continue;
            struct sp_expert_views v = mapped_expert(&c->layers[L], f), got;
            if ((st = c->experts->get(c->experts->ctx, &v, L, f, &got)) != SP_OK) return st;
            c->experts->put(c->experts->ctx, L, f);
            filled++;
        }
    c->be->ops->sync(c->be);
    double dt = sp_now_s() - t0;
    sp_expert_tier_stats(c->tier, &s1);
    c->link_gbs = c->p.copy_gbs > 0                             ? c->p.copy_gbs
                  : dt > 0 && s1.bytes_in > s0.bytes_in ? (double)(s1.bytes_in - s0.bytes_in) / dt / 1e9
                                                        : 1.0;
    sp_log(SP_LOG_INFO, "experts: the CPU computes some of those the %s device lacks while it copies others in "
           "(CPU %.1f GB/s and %.0f us a call: one expert in %.0f us, %lld in one call in %.0f us, %d threads; "
           "copies %.1f GB/s)",
           sp_device_name(c->p.device), c->cpu_gbs, c->cpu_call_s * 1e6, one_t * 1e6, (long long)many, tk * 1e6,
           c->cpu->p.n_threads, c->link_gbs);
    return SP_OK;
}

/* Whether c is rank 0 of processes that it leads. */
static bool leading(const struct sp_ctx *c) { return c->p.group && c->p.lead && c->rank == 0; }

/* Rank 0 leading: the call (cmd, its numbers a0 .. a2; b for a pass) to
 * the other ranks. */
static bool lead_send(struct sp_ctx *c, int64_t cmd, int64_t a0, int64_t a1, int64_t a2, const struct sp_batch *b) {
    int64_t head[FOLLOW_HEAD] = {cmd, a0, a1, a2};
    uint8_t *p = c->follow_buf;
    memcpy(p, head, sizeof head);
    size_t len = sizeof head;
    if (b) {
        size_t ints = (size_t)b->n * sizeof(int32_t);
        memcpy(p + len, b->tokens, ints);
        memcpy(p + len + ints, b->pos, ints);
        memcpy(p + len + 2 * ints, b->seq, ints);
        for (int64_t t = 0; t < b->n; t++) p[len + 3 * ints + (size_t)t] = b->snapshot && b->snapshot[t];
        len += 3 * ints + (size_t)b->n;
    }
    return sp_ranks_send(c->ranks, p, len);
}

/* The calling thread's calls to c's backend go to its device (the GPU
 * its rank was given, on a machine of several). */
static void bind_rank(struct sp_ctx *c) {
    if (c->be && c->be->ops->bind) c->be->ops->bind(c->be);
}

void sp_ctx_free(struct sp_ctx *c) {
    if (!c) return;
    if (c->peers) {  // rank 0's: the other ranks' contexts, their threads first
        sp_ranks_free(c->ranks);
        for (int r = 1; r < c->p.n_ranks; r++) sp_ctx_free(c->peers[r]);
        sp_free(c->peers);
        sp_free(c->parts);
    }
    if (c->peers || c->p.group) sp_free((void *)c->owner);  // rank 0 of threads, or a process's rank
    sp_free(c->routes);
    bind_rank(c);
    if (leading(c) && c->follow_buf) lead_send(c, FOLLOW_QUIT, 0, 0, 0, NULL);
    sp_free(c->follow_buf);
    sp_free(c->follow_snap);
    if (c->rank_buf && c->be->ops->host_alloc)
        c->be->ops->host_free(c->rank_buf);
    else
        sp_free(c->rank_buf);
    if (c->layers) {
        for (int64_t L = 0; L < c->a->n_layers; L++) {
            struct layer *ly = &c->layers[L];
            sp_free(ly->expert_bias);
            sp_free(ly->egate);
            sp_free(ly->eup);
            sp_free(ly->edown);
            sp_free(ly->egate_up);
            sp_free_aligned(ly->q_rows);
            for (int i = 0; i < 2; i++) sp_free_aligned(ly->mla_mem[i]);
            sp_free(ly->muv);
        }
    }
    sp_free(c->layers);
    sp_expert_tier_free(c->tier);
    sp_backend_free(c->cpu);
    if (c->cpu_io) c->be->ops->host_free(c->cpu_io);
    sp_free(c->on_cpu);
    sp_free(c->ctok);
    sp_free(c->cw);
    void *host[] = {c->marks, c->router_host, c->sel,   c->sel_w,  c->etok,        c->ew,
                    c->ecount,      c->items, c->eviews, c->item_expert, c->pf_experts, c->pf_views,
                    c->pf_host,     c->seq_len, c->snap_len};
    for (size_t i = 0; i < sizeof host / sizeof *host; i++) sp_free(host[i]);
    sp_backend_free(c->be);
    sp_free(c);
}

/* n elements of size bytes on the host, counted among the activations. */
static void *host_buf(size_t n, size_t size, bool *ok) {
    void *p = sp_malloc(n * size + 64, SP_MEM_ACT);
    if (!p) *ok = false;
    return p;
}

/* The context of rank `rank` of group g (NULL: no ranks), its routed
 * experts those that owner gives it. */
static enum sp_status ctx_create(const struct sp_model *m, const struct sp_ctx_params *params, int rank,
                                 struct sp_ranks *g, const int32_t *owner, struct sp_ctx **out) {
    *out = NULL;
    const struct sp_arch *a = &m->arch;
    struct sp_ctx *c = sp_calloc(1, sizeof *c, SP_MEM_MODEL);
    if (!c) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    c->m = m;
    c->a = a;
    c->p = *params;
    c->rank = rank;
    c->ranks = g;
    c->owner = owner;
    if (c->p.n_ctx <= 0) c->p.n_ctx = a->max_pos < 4096 ? a->max_pos : 4096;
    if (c->p.n_seq <= 0) c->p.n_seq = 1;
    if (c->p.max_batch <= 0) c->p.max_batch = SP_DEFAULT_BATCH;
    enum sp_status st = SP_OK;
    float *inv_freq = NULL;
    if ((unsigned)c->p.kv_type >= SP_KV_TYPE_COUNT) {
        st = sp_errorf(SP_ERR_ARG, "unknown KV cache type");
        goto fail;
    }
    if (c->p.experts && c->p.device != SP_DEVICE_CPU && !c->p.device_experts) {
        /* the store hands out experts in host memory: a device reads them through a tier of its own */
        st = sp_errorf(SP_ERR_ARG, "an expert cache in host memory for the %s device needs a device expert cache over "
                       "it (sp_ctx_params.device_experts)", sp_device_name(c->p.device));
        goto fail;
    }
    if (c->p.device_experts && a->n_experts <= 0) c->p.device_experts = 0;  // nothing to cache
    struct sp_backend_params bp = backend_params(a, &c->p);
    int at = c->p.group ? 0 : rank;  // a process's rank: its one GPU
    bp.gpu = c->p.gpus ? c->p.gpus[at] : at;
    inv_freq = sp_malloc((size_t)(a->rope.rot_dims / 2 + 1) * sizeof(float), SP_MEM_MODEL);
    if (!inv_freq) goto nomem;
    bp.shape.rope_scale = rope_init(&a->rope, inv_freq);
    bp.shape.inv_freq = inv_freq;
    if ((st = sp_backend_create(c->p.device, &bp, &c->be)) != SP_OK) goto fail;
    if (c->p.time_steps && c->be->ops->mark && !(c->marks = sp_malloc(STEP_MARKS * sizeof *c->marks, SP_MEM_MODEL)))
        goto nomem;
    int threads_asked = c->p.n_threads;  // for the CPU beside a device (cpu_experts_init)
    c->p.n_threads = c->be->p.n_threads;
    c->act = (struct sp_glu){1.0f, INFINITY, 0.0f};
    if (a->act == SP_ACT_SWIGLU_CLAMP) c->act = (struct sp_glu){(float)a->swiglu_alpha, (float)a->swiglu_limit, 1.0f};

    c->layers = sp_calloc((size_t)a->n_layers, sizeof *c->layers, SP_MEM_MODEL);
    if (!c->layers) goto nomem;
    if (c->p.count_routes && rank == 0 && a->n_experts > 0 &&
        !(c->routes = sp_calloc((size_t)(a->n_layers * a->n_experts), sizeof *c->routes, SP_MEM_MODEL)))
        goto nomem;
    /* a device other than the CPU copies every weight into its memory as
     * it prepares it: that is the load to show (the CPU computes on the
     * host's copies, prepared in no time) */
    struct sp_progress load;
    if (c->p.device != SP_DEVICE_CPU) {
        struct sp_model_stats ms;
        sp_model_stats(m, &ms);
        char what[48];
        snprintf(what, sizeof what, "weights to %s", sp_device_name(c->p.device));
        uint64_t total = ms.total_bytes;
        if (c->p.device_experts) total -= ms.bytes[SP_CLASS_ROUTED_EXPERTS];  // copied in as used
        sp_progress_begin(&load, what, total, NULL);
        c->load = &load;
    }
    if ((st = lin(c, -1, SP_ROLE_EMBED, -1, &c->embed)) != SP_OK) goto fail;
    if ((st = lin(c, -1, m->has_lm_head ? SP_ROLE_LM_HEAD : SP_ROLE_EMBED, -1, &c->lm_head)) != SP_OK) goto fail;
    c->out_norm = vec(c, -1, SP_ROLE_OUT_NORM, &st);
    if (st != SP_OK) goto fail;
    if ((has_kind(a, SP_LAYER_GATED_DELTA) && !c->be->ops->gated_delta) ||
        (has_kind(a, SP_LAYER_LIGHTNING) && !c->be->ops->lightning) ||
        (sp_arch_recurrent(a) && (!c->be->ops->state_copy || !c->be->ops->gate))) {
        st = sp_errorf(SP_ERR_UNSUPPORTED, "the %s backend does not run %s layers yet (--device cpu does)",
                       c->be->ops->name, has_kind(a, SP_LAYER_LIGHTNING) ? "Lightning attention" : "Gated DeltaNet");
        goto fail;
    }
    if ((a->attn_gate || a->shared_gate) && !c->be->ops->gate) {
        st = sp_errorf(SP_ERR_UNSUPPORTED, "the %s backend does not run gated attention or shared experts yet",
                       c->be->ops->name);
        goto fail;
    }
    int64_t kv_layers = 0, state_layers = 0;
    for (int64_t L = 0; L < a->n_layers; L++)
        if ((st = load_layer(c, L, &kv_layers, &state_layers)) != SP_OK) goto fail;
    if (c->load) {
        c->be->ops->sync(c->be);  // the copies are done, not just queued
        sp_progress_end(c->load, false);
        c->load = NULL;
    }
    c->experts = c->p.experts;
    if (c->experts && rank_in_threads(c)) {
        c->rank_source = *c->experts;
        c->rank_source.window = sp_expert_source_held(c->experts) / c->p.n_ranks;  // >= 1 (sp_ctx_ranks_check)
        c->experts = &c->rank_source;
    }
    if (c->p.device_experts) {
        if ((st = sp_expert_tier_create(c->be, m, c->p.device_experts, c->experts, &c->tier)) != SP_OK) goto fail;
        c->tier_source = sp_expert_tier_source(c->tier);
        c->experts = &c->tier_source;
        /* ranks in threads: rank 0 pins every rank's experts (for every GPU) once all have
         * their weights, so no page is registered twice or under a later weight's copy */
        if (!c->p.experts && !rank_in_threads(c)) pin_experts(c);
    }
    if (c->experts && c->experts->prefetch && !c->p.no_prefetch) {
        c->pf_experts = sp_malloc((size_t)a->n_experts * sizeof *c->pf_experts, SP_MEM_MODEL);
        c->pf_views = sp_malloc((size_t)a->n_experts * sizeof *c->pf_views, SP_MEM_MODEL);
        if (!c->pf_experts || !c->pf_views) goto nomem;
        c->pf_at_routing = c->tier && !c->p.experts;
    }

    int64_t d = a->d_model, B = c->p.max_batch;
    int64_t E = a->n_experts > 0 ? a->n_experts : 1, K = a->n_experts_used > 0 ? a->n_experts_used : 1;
    struct widths w = widths_of(a);
    struct sp_backend *be = c->be;
    if ((st = sp_backend_tensor(be, B, d, &c->x)) != SP_OK || (st = sp_backend_tensor(be, B, d, &c->h)) != SP_OK ||
        (st = sp_backend_tensor(be, B, d, &c->tmp)) != SP_OK ||
        (st = sp_backend_tensor(be, B, w.q + 2 * w.kv, &c->qkv)) != SP_OK ||
        (st = sp_backend_tensor(be, B, w.att, &c->att)) != SP_OK ||
        (st = sp_backend_tensor(be, B, E, &c->router_out)) != SP_OK ||
        (st = sp_backend_tensor(be, B, d, &c->gath)) != SP_OK || (st = sp_backend_tensor(be, B, d, &c->gout)) != SP_OK)
        goto fail;
    if (w.gate && (st = sp_backend_tensor(be, B, w.gate, &c->qgate)) != SP_OK) goto fail;
    if (a->shared_gate && (st = sp_backend_tensor(be, B, 1, &c->sgate)) != SP_OK) goto fail;
    if (c->pf_at_routing &&
        ((st = sp_backend_tensor(be, B, d, &c->pf_h)) != SP_OK || (st = sp_backend_tensor(be, B, E, &c->pf_logits)) != SP_OK))
        goto fail;
    if (w.mq && (st = sp_backend_tensor(be, B, w.mq, &c->mq)) != SP_OK) goto fail;
    if ((w.lqkv && (st = sp_backend_tensor(be, B, w.lqkv, &c->lqkv)) != SP_OK) ||
        (w.lz && (st = sp_backend_tensor(be, B, w.lz, &c->lz)) != SP_OK) ||
        (w.lba && (st = sp_backend_tensor(be, B, w.lba, &c->lba)) != SP_OK) ||
        (w.lout && (st = sp_backend_tensor(be, B, w.lout, &c->lout)) != SP_OK))
        goto fail;
    if (sp_arch_recurrent(a)) {
        c->seq_len = sp_malloc((size_t)c->p.n_seq * sizeof *c->seq_len, SP_MEM_MODEL);
        c->snap_len = sp_malloc((size_t)c->p.n_seq * sizeof *c->snap_len, SP_MEM_MODEL);
        if (!c->seq_len || !c->snap_len) goto nomem;
        for (int i = 0; i < c->p.n_seq; i++) c->seq_len[i] = 0, c->snap_len[i] = -1;
    }
    bool ok = true;
    c->router_host = host_buf((size_t)(B * E), sizeof(float), &ok);
    c->sel = host_buf((size_t)(B * K), sizeof(int32_t), &ok);
    c->sel_w = host_buf((size_t)(B * K), sizeof(float), &ok);
    c->etok = host_buf((size_t)(B * K), sizeof(int32_t), &ok);
    c->ew = host_buf((size_t)(B * K), sizeof(float), &ok);
    c->ecount = host_buf((size_t)(E + 1), sizeof(int64_t), &ok);
    c->items = host_buf((size_t)(E + 1), sizeof *c->items, &ok);
    c->eviews = host_buf((size_t)E, sizeof *c->eviews, &ok);
    c->item_expert = host_buf((size_t)E, sizeof *c->item_expert, &ok);
    if (c->pf_at_routing) c->pf_host = host_buf((size_t)(B * E), sizeof(float), &ok);
    if (c->p.group && c->p.lead) {
        c->follow_buf = host_buf(FOLLOW_BYTES(B), 1, &ok);
        c->follow_snap = host_buf((size_t)B, sizeof(bool), &ok);
    }
    if (g && be->ops->host_alloc) {
        if (!(c->rank_buf = be->ops->host_alloc((size_t)(B * d) * sizeof(float), SP_MEM_ACT))) ok = false;
    } else if (g) {
        c->rank_buf = host_buf((size_t)(B * d), sizeof(float), &ok);
    }
    if (!ok) goto nomem;
    if (c->tier && !c->p.experts && c->p.cpu_experts && (st = cpu_experts_init(c, &bp, threads_asked)) != SP_OK)
        goto fail;
    sp_free(inv_freq);
    *out = c;
    return SP_OK;
nomem:
    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
fail:
    if (c->load) sp_progress_end(c->load, false);  // clears a line left on a terminal
    sp_free(inv_freq);
    sp_ctx_free(c);
    return st;
}

enum sp_status sp_ctx_ranks_check(const struct sp_model *m, const struct sp_ctx_params *p, int n, bool processes) {
    if (n > SP_RANKS_MAX) return sp_errorf(SP_ERR_ARG, "%d ranks: at most %d", n, SP_RANKS_MAX);
    int64_t held = p->experts ? sp_expert_source_held(p->experts) : 0;
    if (p->experts && !processes && held < n)
        return sp_errorf(SP_ERR_ARG, "a host expert cache that holds %lld experts at once, shared by %d ranks: each "
                         "rank needs one (a cache of %d experts at least)", (long long)held, n, 2 * n);
    if (m->arch.n_experts < n)
        return sp_errorf(SP_ERR_ARG, "%d ranks for %lld routed experts a layer: the ranks split the experts, at least "
                         "one each", n, (long long)m->arch.n_experts);
    return SP_OK;
}

/* Each routed expert's rank over n ranks (every layer's split alike), or
 * why the model or the parameters take no ranks. */
static enum sp_status split_experts(const struct sp_model *m, const struct sp_ctx_params *p, int n, int32_t **owner) {
    const struct sp_arch *a = &m->arch;
    int64_t E = a->n_experts;
    *owner = NULL;
    enum sp_status st = sp_ctx_ranks_check(m, p, n, p->group != NULL);
    if (st != SP_OK) return st;
    if (!(*owner = sp_calloc((size_t)(a->n_layers * E), sizeof **owner, SP_MEM_MODEL)))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t L = 0; L < a->n_layers; L++)
        if (a->layer_moe[L]) sp_ranks_split(p->expert_load ? p->expert_load + L * E : NULL, E, n, *owner + L * E);
    return SP_OK;
}

/* This process's rank of a group of processes: a context of its own, over
 * the group p->group. */
static enum sp_status process_rank_create(const struct sp_model *m, const struct sp_ctx_params *p, struct sp_ctx **out) {
    int32_t *owner;
    enum sp_status st = split_experts(m, p, p->n_ranks, &owner);
    if (st == SP_OK && (p->rank < 0 || p->rank >= p->n_ranks))
        st = sp_errorf(SP_ERR_ARG, "rank %d of %d", p->rank, p->n_ranks);
    if (st == SP_OK) st = ctx_create(m, p, p->rank, p->group, owner, out);
    if (st != SP_OK) sp_free(owner);
    return st;
}

/* The ranks' sums on their devices where each rank's backend reads the
 * others' memory (else through the host). */
static void link_parts(struct sp_ctx **peers, int n) {
    struct sp_backend *bs[SP_RANKS_MAX];
    for (int r = 0; r < n; r++) bs[r] = peers[r]->be;
    const struct sp_backend_ops *ops = bs[0]->ops;
    if (!ops->parts_link || !ops->parts_link(bs, n)) return;
    const void **parts = sp_calloc((size_t)(2 * n), sizeof *parts, SP_MEM_MODEL);
    for (int r = 0; parts && r < n; r++) peers[r]->parts = parts;
    if (parts) sp_log(SP_LOG_INFO, "ranks: %d, their sums on the devices (each reads the others' memory)", n);
}

bool sp_ctx_sums_on_devices(const struct sp_ctx *c) { return c->parts != NULL; }

/* Rank 0's context of ranks in threads, holding every rank's. */
static enum sp_status ranks_create(const struct sp_model *m, const struct sp_ctx_params *p, struct sp_ctx **out) {
    const struct sp_arch *a = &m->arch;
    int n = p->n_ranks;
    int64_t B = p->max_batch > 0 ? p->max_batch : SP_DEFAULT_BATCH;
    int32_t *owner;
    enum sp_status st = split_experts(m, p, n, &owner);
    if (st != SP_OK) return st;
    struct sp_ctx **peers = sp_calloc((size_t)n, sizeof *peers, SP_MEM_MODEL);
    struct sp_ranks *g = NULL;
    st = !peers ? sp_errorf(SP_ERR_NOMEM, "out of memory") : sp_ranks_create(n, B * a->d_model, &g);
    /* ranks on the CPU share its threads */
    struct sp_ctx_params rp = *p;
    if (p->device == SP_DEVICE_CPU) {
        int threads = p->n_threads > 0 ? p->n_threads : sp_physical_cores();
        rp.n_threads = threads / n > 1 ? threads / n : 1;
    }
    for (int r = 0; st == SP_OK && r < n; r++) st = ctx_create(m, &rp, r, g, owner, &peers[r]);
    if (st != SP_OK) {
        for (int r = 0; peers && r < n; r++) sp_ctx_free(peers[r]);
        sp_ranks_free(g);
        sp_free(peers);
        sp_free(owner);
        return st;
    }
    peers[0]->peers = peers;
    if (peers[0]->tier && !p->experts) pin_experts(peers[0]);
    link_parts(peers, n);
    bind_rank(peers[0]);  // the caller's thread is rank 0's
    *out = peers[0];
    return SP_OK;
}

enum sp_status sp_ctx_create(const struct sp_model *m, const struct sp_ctx_params *p, struct sp_ctx **out) {
    *out = NULL;
    if (p->group) return process_rank_create(m, p, out);
    return p->n_ranks > 1 ? ranks_create(m, p, out) : ctx_create(m, p, 0, NULL, NULL, out);
}

const struct sp_ctx_params *sp_ctx_params(const struct sp_ctx *c) { return &c->p; }

sp_interleave_fn sp_ctx_interleave(enum sp_device d) {
    const struct sp_backend_ops *ops = sp_backend_ops(d);
    return ops ? ops->interleave : NULL;
}
size_t sp_ctx_kv_bytes(const struct sp_ctx *c) { return c->be->ops->kv_bytes(c->be); }

bool sp_ctx_tier_stats(const struct sp_ctx *c, struct sp_expert_tier_stats *out) {
    if (!c->tier) return false;
    sp_expert_tier_stats(c->tier, out);
    out->cpu_experts = c->cpu_experts;
    for (int r = 1; c->peers && r < c->p.n_ranks; r++) {  // ranks in threads: every rank's tier
        struct sp_expert_tier_stats s;
        sp_expert_tier_stats(c->peers[r]->tier, &s);
        out->budget += s.budget;
        out->slots += s.slots;
        out->cached += s.cached;
        out->hits += s.hits;
        out->misses += s.misses;
        out->evictions += s.evictions;
        out->fences += s.fences;
        out->orders += s.orders;
        out->prefetched += s.prefetched;
        out->prefetch_used += s.prefetch_used;
        out->bytes_in += s.bytes_in;
        out->cpu_experts += c->peers[r]->cpu_experts;
    }
    return true;
}

bool sp_ctx_graph_counts(const struct sp_ctx *c, int64_t *replayed, int64_t *built) {
    *replayed = *built = 0;
    if (!c->be->ops->graph_counts) return false;
    c->be->ops->graph_counts(c->be, replayed, built);
    return true;
}

void sp_ctx_copy_seq(struct sp_ctx *c, int src, int dst, int64_t n) {
    for (int r = 1; c->peers && r < c->p.n_ranks; r++) sp_ctx_copy_seq(c->peers[r], src, dst, n);
    if (leading(c)) lead_send(c, FOLLOW_COPY, src, dst, n, NULL);  // a rank gone fails the next pass
    bind_rank(c);
    c->be->ops->kv_copy_seq(c->be, src, dst, n);
    if (!c->seq_len || src == dst) return;
    SP_ASSERT(sp_ctx_seq_resumable(c, src, n) == n);
    if (n > 0) c->be->ops->state_copy(c->be, n == c->seq_len[src] ? src : c->p.n_seq + src, dst);
    c->seq_len[dst] = n;
    c->snap_len[dst] = -1;
}

/* Multiply-adds of a layer's attention for batch b: per token and query
 * head, head_dim for each visible position's score and again for its
 * value. */
static double attention_macs(const struct sp_ctx *c, const struct sp_batch *b, int64_t window) {
    double positions = 0;
    for (int64_t t = 0; t < b->n; t++) {
        int64_t pos = b->pos[t];
        positions += (double)(window > 0 && pos + 1 > window ? window : pos + 1);
    }
    return 2.0 * positions * (double)c->a->n_heads * (double)c->a->head_dim;
}

/* ---- MLP ---- */

/* Rows [r0, r0 + n) of gout, the shared expert's outputs for the n rows of
 * h, times sigmoid of its gate where the model gates it. */
static void shared_gate(struct sp_ctx *c, const struct layer *ly, int64_t r0, int64_t n) {
    if (!ly->has_sgate) return;
    struct sp_backend *be = c->be;
    struct sp_tensor g = sp_tensor_rows(c->sgate, 0, n);
    be->ops->linear(be, &ly->sgate, sp_tensor_rows(c->h, 0, n), g);
    be->ops->gate(be, sp_tensor_rows(c->gout, r0, n), g);
}

/* x += r, h = rmsnorm(x) * w, r = 0: one op where the backend fuses them. */
static void add_rmsnorm(struct sp_ctx *c, const float *w, struct sp_tensor x, struct sp_tensor r, struct sp_tensor h) {
    struct sp_backend *be = c->be;
    float eps = (float)c->a->norm_eps;
    if (be->ops->add_rmsnorm) {
        be->ops->add_rmsnorm(be, w, eps, x, r, true, h);
        return;
    }
    be->ops->add(be, x, r);
    be->ops->rmsnorm(be, w, eps, x, h);
    be->ops->zero(be, r);
}

/* out (n, d) += down(act(gate h, up h)) for the layer's dense or shared MLP. */
static void layer_mlp_add(struct sp_ctx *c, const struct layer *ly, int64_t n, struct sp_tensor out) {
    struct sp_mlp_item it = {&ly->gate, &ly->up, NULL, &ly->down, sp_tensor_rows(c->h, 0, n), 0};
    struct sp_backend *be = c->be;
    STEP(c, SP_STEP_MLP, sp_mlp_macs(&it, 1, c->a->d_model), be->ops->mlp(be, &it, 1, &c->act, c->gout);
         shared_gate(c, ly, 0, n); be->ops->add(be, out, sp_tensor_rows(c->gout, 0, n)));
}

static void softmax_inplace(float *v, int64_t n) {
    float mx = -INFINITY;
    for (int64_t i = 0; i < n; i++) mx = v[i] > mx ? v[i] : mx;
    double s = 0;
    for (int64_t i = 0; i < n; i++) {
        v[i] = expf(v[i] - mx);
        s += v[i];
    }
    for (int64_t i = 0; i < n; i++) v[i] = (float)(v[i] / s);
}

/* Indices of the k largest of v[0..n) (masked entries skipped), largest
 * first, ties to the lower index; -1 past the entries there are. One pass
 * that keeps the best so far in order (an entry enters when it beats the
 * last kept), as choosing the largest k times would order them. */
static void top_k(const float *v, const bool *mask, int64_t n, int64_t k, int32_t *idx) {
    int64_t kept = 0;
    for (int64_t i = 0; i < n && k > 0; i++) {
        if (mask && !mask[i]) continue;
        if (kept == k && !(v[i] > v[idx[k - 1]])) continue;
        int64_t at = kept < k ? kept++ : k - 1;
        for (; at > 0 && v[i] > v[idx[at - 1]]; at--) idx[at] = idx[at - 1];
        idx[at] = (int32_t)i;
    }
    for (int64_t j = kept; j < k; j++) idx[j] = -1;
}

/* Chooses k experts and their weights for one token from its router logits. */
static void route(const struct sp_arch *a, const struct layer *ly, float *logits, int32_t *sel, float *w) {
    int64_t E = a->n_experts, K = a->n_experts_used;
    switch (a->router) {
    case SP_ROUTER_SOFTMAX_TOPK: {
        softmax_inplace(logits, E);
        top_k(logits, NULL, E, K, sel);
        double s = 0;
        for (int64_t j = 0; j < K; j++) s += logits[sel[j]];
        for (int64_t j = 0; j < K; j++) w[j] = a->norm_topk_prob ? (float)(logits[sel[j]] / s) : logits[sel[j]];
        break;
    }
    case SP_ROUTER_TOPK_SOFTMAX: {
        top_k(logits, NULL, E, K, sel);
        float v[256];
        SP_ASSERT(K <= 256);
        for (int64_t j = 0; j < K; j++) v[j] = logits[sel[j]];
        softmax_inplace(v, K);
        for (int64_t j = 0; j < K; j++) w[j] = v[j];
        break;
    }
    case SP_ROUTER_SIGMOID_GROUP_TOPK:
    case SP_ROUTER_SOFTMAX_GROUP_TOPK: {
        float scores[1024], biased[1024];
        bool keep[1024];
        SP_ASSERT(E <= 1024);
        for (int64_t e = 0; e < E; e++) scores[e] = logits[e];
        if (a->router == SP_ROUTER_SOFTMAX_GROUP_TOPK)
            softmax_inplace(scores, E);
        else
            for (int64_t e = 0; e < E; e++) scores[e] = 1.0f / (1.0f + expf(-scores[e]));
        for (int64_t e = 0; e < E; e++) biased[e] = scores[e] + (ly->expert_bias ? ly->expert_bias[e] : 0.0f);
        int64_t G = a->n_group, per = E / G;
        for (int64_t e = 0; e < E; e++) keep[e] = true;
        if (G > 1) {
            /* group score: sum of its two best biased scores; keep topk_group groups */
            float gs[1024];
            bool gkeep[1024];
            for (int64_t g = 0; g < G; g++) {
                int32_t two[2];
                top_k(biased + g * per, NULL, per, per >= 2 ? 2 : 1, two);
                gs[g] = biased[g * per + two[0]] + (per >= 2 ? biased[g * per + two[1]] : 0.0f);
            }
            int32_t gsel[1024];
            top_k(gs, NULL, G, a->topk_group, gsel);
            for (int64_t g = 0; g < G; g++) gkeep[g] = false;
            for (int64_t j = 0; j < a->topk_group; j++) gkeep[gsel[j]] = true;
            for (int64_t e = 0; e < E; e++) keep[e] = gkeep[e / per];
        }
        top_k(biased, keep, E, K, sel);
        double s = 0;
        for (int64_t j = 0; j < K; j++) s += scores[sel[j]];
        for (int64_t j = 0; j < K; j++) {
            float v = K > 1 ? (float)(scores[sel[j]] / (s + 1e-20)) : scores[sel[j]];
            w[j] = v * (float)a->routed_scale;
        }
        break;
    }
    default:
        SP_ASSERT(!"unknown router kind");
    }
}

/* The router logits of n tokens of h, readable on the host. */
static float *router_logits(struct sp_ctx *c, const struct layer *ly, int64_t n) {
    struct sp_tensor r = sp_tensor_rows(c->router_out, 0, n);
    c->be->ops->linear(c->be, &ly->router, sp_tensor_rows(c->h, 0, n), r);
    return c->be->ops->host(c->be, r, c->router_host);
}

/* Routes n tokens by their router logits and lists them by expert: expert
 * e's pairs (token, weight) at etok / ew [ecount[e], ecount[e + 1]), in
 * token order. */
static void group_by_expert(struct sp_ctx *c, const struct layer *ly, float *logits, int64_t n) {
    int64_t E = c->a->n_experts, K = c->a->n_experts_used, *off = c->ecount;
    for (int64_t t = 0; t < n; t++) route(c->a, ly, logits + t * E, c->sel + t * K, c->sel_w + t * K);
    for (int64_t e = 0; e <= E; e++) off[e] = 0;
    for (int64_t i = 0; i < n * K; i++) off[c->sel[i] + 1]++;
    for (int64_t e = 0; e < E; e++) off[e + 1] += off[e];
    /* fill in token order so each expert's list is sorted by token */
    int64_t fill[1024];
    SP_ASSERT(E <= 1024);
    for (int64_t e = 0; e < E; e++) fill[e] = off[e];
    for (int64_t t = 0; t < n; t++)
        for (int64_t j = 0; j < K; j++) {
            int32_t e = c->sel[t * K + j];
            c->etok[fill[e]] = (int32_t)t;
            c->ew[fill[e]] = c->sel_w[t * K + j];
            fill[e]++;
        }
}

/* The next MoE layer after L (-1: none). */
static int64_t next_moe_layer(const struct sp_ctx *c, int64_t L) {
    for (int64_t L2 = L + 1; L2 < c->a->n_layers; L2++)
        if (c->a->layer_moe[L2]) return L2;
    return -1;
}

/* Asks the expert source early for the experts that n tokens' router
 * logits of MoE layer L2 choose. */
static void prefetch_routed(struct sp_ctx *c, int64_t L2, float *logits, int64_t n) {
    const struct sp_arch *a = c->a;
    const struct layer *ly = &c->layers[L2];
    int64_t E = a->n_experts, K = a->n_experts_used;
    int32_t sel[256];
    float w[256];
    SP_ASSERT(K <= 256 && E <= 1024);
    bool seen[1024] = {false};
    int64_t m = 0;
    for (int64_t t = 0; t < n; t++) {
        route(a, ly, logits + t * E, sel, w);
        for (int64_t j = 0; j < K; j++) {
            int32_t e = sel[j];
            if (seen[e] || !owns(c, L2, e)) continue;
            seen[e] = true;
            c->pf_views[m] = mapped_expert(ly, e);
            c->pf_experts[m++] = e;
        }
    }
    c->experts->prefetch(c->experts->ctx, L2, c->pf_experts, c->pf_views, m);
}

/* MoE layer L2's norm and router applied to n tokens of the hidden state
 * (c->x), queued: into rows of h and of logits. */
static void queue_router_of(struct sp_ctx *c, int64_t L2, int64_t n, struct sp_tensor h, struct sp_tensor logits) {
    const struct layer *ly = &c->layers[L2];
    struct sp_backend *be = c->be;
    be->ops->rmsnorm(be, ly->ffn_norm, (float)c->a->norm_eps, sp_tensor_rows(c->x, 0, n), sp_tensor_rows(h, 0, n));
    be->ops->linear(be, &ly->router, sp_tensor_rows(h, 0, n), sp_tensor_rows(logits, 0, n));
}

/* Predicts the experts the next MoE layer after L will use, by applying its
 * norm and router to the hidden state as it leaves layer L, and starts
 * reading the ones the cache lacks while that layer's attention runs. */
static void prefetch_next(struct sp_ctx *c, int64_t L, int64_t n) {
    int64_t L2 = next_moe_layer(c, L);
    if (L2 < 0) return;
    queue_router_of(c, L2, n, c->h, c->router_out);
    prefetch_routed(c, L2, c->be->ops->host(c->be, sp_tensor_rows(c->router_out, 0, n), c->router_host), n);
}

/* At MoE layer L's routing, the next MoE layer's norm and router applied
 * to the hidden state of n tokens (c->x), queued before L's own router so
 * that one wait serves both. Returns that layer (-1: none). Only in steps
 * of PREDICT_MIN_TOKENS or more: a decode step's wrong predictions (a
 * quarter of them on synthetic Ling-flash-2.0 shapes) cost the link more
 * than the right ones gain by overlapping their copies with the kernels
 * (docs/performance.md, larger than the GPU's memory). */
#define PREDICT_MIN_TOKENS 16
static int64_t predict_queue(struct sp_ctx *c, int64_t L, int64_t n) {
    int64_t L2 = next_moe_layer(c, L);
    if (L2 >= 0) queue_router_of(c, L2, n, c->pf_h, c->pf_logits);
    return L2;
}

/* Experts of a step of n tokens that the CPU takes instead of a copy to
 * the device: those the device tier lacks, of few tokens (the CPU's
 * products of more run below its bandwidth), each to whichever of the CPU
 * and the copies would finish its share sooner at the rates measured at
 * creation; none where the copies they save take less time than moving the
 * step's hidden state to the CPU and its sum back, which the device waits
 * for (a prompt's chunk, whose experts mostly have many tokens).
 * Returns how many. */
#define CPU_EXPERT_ROWS 4
static int64_t choose_cpu_experts(struct sp_ctx *c, const struct layer *ly, int64_t n, const int64_t *off) {
    int64_t L = ly - c->layers, k = 0;
    double cpu_t = c->cpu_call_s, copy_t = 0, saved = 0;
    for (int64_t e = 0; e < c->a->n_experts; e++) {
        c->on_cpu[e] = false;
        int64_t cnt = off[e + 1] - off[e];
        if (!cnt || cnt > CPU_EXPERT_ROWS || sp_expert_tier_has(c->tier, L, e)) continue;
        double bytes = expert_bytes(ly, e), tc = bytes / (c->cpu_gbs * 1e9), tl = bytes / (c->link_gbs * 1e9);
        if (cpu_t + tc <= copy_t + tl) {
            c->on_cpu[e] = true;
            cpu_t += tc;
            saved += tl;
            k++;
        } else {
            copy_t += tl;
        }
    }
    double moved = 2.0 * (double)(n * c->a->d_model) * sizeof(float) / (c->link_gbs * 1e9);
    if (k && saved <= moved) {
        memset(c->on_cpu, 0, (size_t)c->a->n_experts * sizeof *c->on_cpu);
        k = 0;
    }
    return k;
}

/* Whether the device's window loop passes expert e by: no tokens, or the CPU's. */
static bool not_on_device(const struct sp_ctx *c, const int64_t *off, int64_t e) {
    return off[e + 1] == off[e] || (c->cpu && c->on_cpu[e]);
}

/* The experts choose_cpu_experts gave the CPU, for the n tokens whose rows
 * of h are in c->ch: their sum for each token (in ascending expert order)
 * added into out after what the device added. */
static void cpu_experts_add(struct sp_ctx *c, const struct layer *ly, int64_t n, const int64_t *off,
                            struct sp_tensor out) {
    struct sp_backend *cpu = c->cpu, *be = c->be;
    int64_t rows = 0, m = 0;
    for (int64_t e = 0; e < c->a->n_experts; e++) {
        if (!c->on_cpu[e]) continue;
        int64_t cnt = off[e + 1] - off[e];
        memcpy(c->ctok + rows, c->etok + off[e], (size_t)cnt * sizeof *c->ctok);
        memcpy(c->cw + rows, c->ew + off[e], (size_t)cnt * sizeof *c->cw);
        c->eviews[m] = mapped_expert(ly, e);
        c->items[m] = expert_item(&c->eviews[m], sp_tensor_rows(c->cgath, rows, cnt), rows);
        m++;
        rows += cnt;
    }
    cpu->ops->gather(cpu, sp_tensor_rows(c->cgath, 0, rows), c->ch, c->ctok);
    cpu->ops->mlp(cpu, c->items, m, &c->act, c->cgout);
    cpu->ops->zero(cpu, sp_tensor_rows(c->cout, 0, n));
    cpu->ops->scatter_add(cpu, sp_tensor_rows(c->cout, 0, n), sp_tensor_rows(c->cgout, 0, rows), c->ctok, c->cw);
    /* in order after the device's own work on gath; a copy from pinned
     * memory reads cout as it runs: the next layer's routing waits for it
     * before cout is written again */
    be->ops->write(be, sp_tensor_rows(c->gath, 0, n), c->cout.data);
    be->ops->add(be, out, sp_tensor_rows(c->gath, 0, n));
    c->cpu_experts += (uint64_t)m;
}

/* Item i's weights: expert c->item_expert[i] of layer ly, from the expert
 * source (its views kept in c->eviews[i]) or the mapped files. */
static bool window_take(struct sp_ctx *c, const struct layer *ly, int64_t i) {
    struct sp_expert_views v = mapped_expert(ly, c->item_expert[i]), *use = &c->eviews[i];
    if (!c->experts)
        *use = v;
    else if (c->experts->get(c->experts->ctx, &v, ly - c->layers, c->item_expert[i], use) != SP_OK)
        return false;
    c->items[i] = expert_item(use, c->items[i].x, c->items[i].row);
    return true;
}

/* The weights of a window's m items. Through a device tier, the experts it
 * lacks move to the front, [0, *later), with their copies queued at once,
 * and only the others are taken now (window_take takes the rest once the
 * others' products are queued, so that those run while the copies do). */
static bool window_lookup(struct sp_ctx *c, const struct layer *ly, int64_t m, int64_t *later) {
    int64_t L = ly - c->layers, k = 0;
    for (int64_t i = 0; c->tier && i < m; i++) {
        if (sp_expert_tier_has(c->tier, L, c->item_expert[i])) continue;
        struct sp_mlp_item it = c->items[i];  // to the front, the order kept
        int64_t ex = c->item_expert[i];
        memmove(c->items + k + 1, c->items + k, (size_t)(i - k) * sizeof *c->items);
        memmove(c->item_expert + k + 1, c->item_expert + k, (size_t)(i - k) * sizeof *c->item_expert);
        c->items[k] = it;
        c->item_expert[k++] = ex;
    }
    for (int64_t i = k; i < m; i++)  // held before any copy may choose their slots
        if (!window_take(c, ly, i)) return false;
    for (int64_t i = 0; i < k; i++) {
        struct sp_expert_views v = mapped_expert(ly, c->item_expert[i]);
        if (sp_expert_tier_fetch(c->tier, &v, L, c->item_expert[i]) != SP_OK) return false;
    }
    *later = k;
    return true;
}

/* Where the experts are split over ranks: this rank's (token, weight)
 * pairs of layer L alone, in expert order, the other ranks' experts left
 * with none (so that windows of consecutive experts hold consecutive
 * pairs). */
static void keep_own(struct sp_ctx *c, int64_t L) {
    int64_t *off = c->ecount, kept = 0, start = off[0];
    for (int64_t e = 0; e < c->a->n_experts; e++) {
        int64_t end = off[e + 1];
        off[e] = kept;
        if (owns(c, L, e)) {
            memmove(c->etok + kept, c->etok + start, (size_t)(end - start) * sizeof *c->etok);
            memmove(c->ew + kept, c->ew + start, (size_t)(end - start) * sizeof *c->ew);
            kept += end - start;
        }
        start = end;
    }
    off[c->a->n_experts] = kept;
}

/* Routed experts for n tokens of h, added into out (n, d). Tokens are
 * grouped by expert so each expert's weights are read once per batch; each
 * token sums its experts in ascending expert order whatever the batch holds
 * (those the CPU computes instead of a device tier's copy: after the
 * device's, as one sum). */
static bool moe(struct sp_ctx *c, const struct layer *ly, int64_t n, struct sp_tensor out) {
    const struct sp_arch *a = c->a;
    struct sp_backend *be = c->be;
    int64_t E = a->n_experts, d = a->d_model, L = ly - c->layers;
    if (!c->experts && be->ops->moe && !c->routes) {
        /* the backend routes on its own (and keeps a rank's own experts): no round trip through the host */
        bool done = false, shared_done = false;
        double macs = 3.0 * (double)n * (double)a->n_experts_used * (double)d * (double)a->d_expert;
        STEP(c, SP_STEP_EXPERTS, macs,
             done = be->ops->moe(be, &ly->moe, sp_tensor_rows(c->h, 0, n), &c->act, out, &shared_done));
        if (done) {
            if (ly->has_mlp && !shared_done && c->rank == 0) layer_mlp_add(c, ly, n, out);
            return true;
        }
    }
    float *logits = NULL, *predicted = NULL;
    int64_t L2 = -1;
    bool predict = c->pf_at_routing && n >= PREDICT_MIN_TOKENS;
    STEP(c, SP_STEP_ROUTER, (double)n * (double)d * (double)E * (predict ? 2 : 1), {
        if (predict) L2 = predict_queue(c, ly - c->layers, n);
        logits = router_logits(c, ly, n);
        if (L2 >= 0) predicted = be->ops->host(be, sp_tensor_rows(c->pf_logits, 0, n), c->pf_host);
    });
    int64_t *off = c->ecount;
    STEP(c, SP_STEP_ROUTE, 0, group_by_expert(c, ly, logits, n));
    if (c->p.time_steps) {
        c->steps.routed += (double)off[E];
        for (int64_t i = 0; i < E; i++) c->steps.experts_run += off[i + 1] > off[i];
    }
    if (c->routes)
        for (int64_t i = 0; i < E; i++) c->routes[L * E + i] += (uint64_t)(off[i + 1] - off[i]);
    if (c->owner) keep_own(c, L);
    int64_t n_cpu = c->cpu ? choose_cpu_experts(c, ly, n, off) : 0;
    if (n_cpu) {
        /* h for the CPU, before the device's work is queued (host waits for it) */
        float *hh = be->ops->host(be, sp_tensor_rows(c->h, 0, n), c->ch.data);
        if (hh != c->ch.data) memcpy(c->ch.data, hh, (size_t)(n * d) * sizeof(float));
    }
    /* Windows of consecutive experts whose rows fit the batch buffers run
     * together; through an expert source as many as it lets one hold. The
     * shared expert joins the last window where it fits. Each token sums
     * its experts in ascending order, then the shared expert: one scatter a
     * window, whatever order its products ran in. */
    int64_t B = c->p.max_batch, per_window = !c->experts ? E : sp_expert_source_held(c->experts), e = 0;
    bool shared_left = ly->has_mlp && c->rank == 0;  // rank 0's alone where the experts are split
    while (e < E || shared_left) {
        while (e < E && not_on_device(c, off, e)) e++;
        int64_t m = 0, rows = 0, p0 = off[e];
        for (; e < E && m < per_window; e++) {
            int64_t cnt = off[e + 1] - off[e];
            if (!cnt) continue;
            if (rows + cnt > B || (c->cpu && c->on_cpu[e])) break;
            c->item_expert[m] = e;
            c->items[m++] = (struct sp_mlp_item){.x = sp_tensor_rows(c->gath, rows, cnt), .row = rows};
            rows += cnt;
        }
        while (e < E && not_on_device(c, off, e)) e++;
        bool shared_now = shared_left && e == E && rows + n <= B;
        if (m == 0 && !shared_now) break;
        int64_t later = 0;  // items [0, later): copies the device tier queued, taken after the others run
        if (!window_lookup(c, ly, m, &later)) return false;
        if (shared_now)
            c->items[m] = (struct sp_mlp_item){&ly->gate, &ly->up, NULL, &ly->down, sp_tensor_rows(c->h, 0, n), rows};
        STEP(c, SP_STEP_MOVE, 0, be->ops->gather(be, sp_tensor_rows(c->gath, 0, rows), c->h, c->etok + p0));
        struct sp_mlp_item *now = c->items + later;
        int64_t n_now = m - later + shared_now;
        if (n_now) STEP(c, SP_STEP_EXPERTS, sp_mlp_macs(now, n_now, d), be->ops->mlp(be, now, n_now, &c->act, c->gout));
        if (later) {
            for (int64_t i = 0; i < later; i++)
                if (!window_take(c, ly, i)) return false;
            STEP(c, SP_STEP_EXPERTS, sp_mlp_macs(c->items, later, d),
                 be->ops->mlp(be, c->items, later, &c->act, c->gout));
        }
        if (c->experts)
            for (int64_t i = 0; i < m; i++) c->experts->put(c->experts->ctx, ly - c->layers, c->item_expert[i]);
        STEP(c, SP_STEP_MOVE, 0,
             be->ops->scatter_add(be, out, sp_tensor_rows(c->gout, 0, rows), c->etok + p0, c->ew + p0));
        if (shared_now) {
            STEP(c, SP_STEP_MLP, 0, shared_gate(c, ly, rows, n));
            STEP(c, SP_STEP_MOVE, 0, be->ops->add(be, out, sp_tensor_rows(c->gout, rows, n)));
            shared_left = false;
        }
    }
    /* the next layer's copies queued behind this one's */
    if (predicted) STEP(c, SP_STEP_ROUTE, 0, prefetch_routed(c, L2, predicted, n));
    if (shared_left) layer_mlp_add(c, ly, n, out);
    if (n_cpu) cpu_experts_add(c, ly, n, off, out);
    return true;
}

/* ---- the forward pass ---- */

/* The final norm and lm_head on the rows of x that want logits: their
 * logits, greedy choices (b->argmax) or best candidates (b->top), by the
 * backend's own op where it has one, else from the logits on the host
 * (logits then serves as scratch). Returns how many rows. */
static int64_t lm_head(struct sp_ctx *c, const struct sp_batch *b, struct sp_tensor x, float *logits) {
    struct sp_backend *be = c->be;
    const float eps = (float)c->a->norm_eps;
    const int64_t V = c->a->vocab;
    const bool top = b->top && !b->argmax;
    if (b->argmax && be->ops->argmax) return be->ops->argmax(be, c->out_norm, eps, &c->lm_head, x, b->want_logits, b->argmax);
    if (top && be->ops->top_k)
        return be->ops->top_k(be, c->out_norm, eps, &c->lm_head, x, b->want_logits, b->top_k, b->top);
    int64_t m = be->ops->logits(be, c->out_norm, eps, &c->lm_head, x, b->want_logits, logits);
    for (int64_t r = 0; r < m && (b->argmax || top); r++) {
        if (b->argmax) b->argmax[r] = (int32_t)sp_kernels()->argmax(logits + r * V, V);
        else sp_top_k(logits + r * V, V, b->top_k, b->top + r * b->top_k);
    }
    return m;
}

static enum sp_status check_batch(const struct sp_ctx *c, const struct sp_batch *b) {
    if (b->n <= 0 || b->n > c->p.max_batch)
        return sp_errorf(SP_ERR_ARG, "batch of %lld tokens (1 to %lld allowed)", (long long)b->n, (long long)c->p.max_batch);
    if (b->top && !b->argmax && (b->top_k < 1 || b->top_k > SP_TOP_K_MAX || b->top_k > c->a->vocab))
        return sp_errorf(SP_ERR_ARG, "%lld best logits a row asked for (1 to %d allowed)", (long long)b->top_k,
                         SP_TOP_K_MAX);
    for (int64_t t = 0; t < b->n; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->a->vocab)
            return sp_errorf(SP_ERR_ARG, "token %d is outside the vocabulary of %lld", b->tokens[t], (long long)c->a->vocab);
        if (b->seq[t] < 0 || b->seq[t] >= c->p.n_seq)
            return sp_errorf(SP_ERR_ARG, "sequence %d is outside 0..%d", b->seq[t], c->p.n_seq - 1);
        if (b->pos[t] < 0 || b->pos[t] >= c->p.n_ctx)
            return sp_errorf(SP_ERR_ARG, "position %d is outside the context of %lld", b->pos[t], (long long)c->p.n_ctx);
    }
    if (!c->seq_len) return SP_OK;
    /* a recurrent state goes on only from the position it holds (or restarts at 0) */
    int64_t *next = c->seq_len;
    for (int64_t t = 0; t < b->n; t++) {
        int s = b->seq[t];
        int64_t at = next[s];
        for (int64_t u = t - 1; u >= 0; u--)
            if (b->seq[u] == s) {
                at = b->pos[u] + 1;
                break;
            }
        if (b->pos[t] != 0 && b->pos[t] != at)
            return sp_errorf(SP_ERR_ARG, "sequence %d: its recurrent state holds %lld positions, so position %d "
                             "cannot come next (a linear-attention model goes on from where a sequence stopped, "
                             "or starts again at 0)", s, (long long)(at < 0 ? 0 : at), b->pos[t]);
    }
    return SP_OK;
}

/* After a pass over b: the positions the batch's sequences' states hold,
 * and their snapshots' (a failed pass: unknown, until position 0). */
static void track_states(struct sp_ctx *c, const struct sp_batch *b, bool ok) {
    if (!c->seq_len) return;
    for (int64_t t = 0; t < b->n; t++) {
        int s = b->seq[t];
        c->seq_len[s] = ok ? b->pos[t] + 1 : -1;
        if (b->pos[t] == 0) c->snap_len[s] = -1;
        if (b->snapshot && b->snapshot[t]) c->snap_len[s] = ok ? b->pos[t] + 1 : -1;
    }
}

int64_t sp_ctx_seq_resumable(const struct sp_ctx *c, int seq, int64_t n) {
    if (!c->seq_len || n <= 0) return n > 0 ? n : 0;
    if (c->seq_len[seq] == n) return n;
    return c->snap_len[seq] >= 0 && c->snap_len[seq] <= n ? c->snap_len[seq] : 0;
}

void sp_ctx_seq_resume(struct sp_ctx *c, int seq, int64_t n) {
    for (int r = 1; c->peers && r < c->p.n_ranks; r++) sp_ctx_seq_resume(c->peers[r], seq, n);
    if (leading(c)) lead_send(c, FOLLOW_RESUME, seq, n, 0, NULL);
    if (!c->seq_len) return;
    bind_rank(c);
    SP_ASSERT(sp_ctx_seq_resumable(c, seq, n) == n);
    if (n == c->seq_len[seq]) return;
    if (n > 0) c->be->ops->state_copy(c->be, c->p.n_seq + seq, seq);
    c->seq_len[seq] = n;  // 0: the next pass starts it at position 0
}

/* q, k and v of the n rows of h, side by side in qkv. */
static void qkv_products(struct sp_ctx *c, const struct layer *ly, int64_t n) {
    struct sp_backend *be = c->be;
    int64_t qd = c->a->n_heads * c->a->head_dim, kvd = c->a->n_kv_heads * c->a->head_dim;
    struct sp_tensor h = sp_tensor_rows(c->h, 0, n), qkv = sp_tensor_rows(c->qkv, 0, n);
    if (c->a->fused_qkv) {
        be->ops->linear(be, &ly->qkv, h, qkv);
        return;
    }
    be->ops->linear(be, &ly->q, h, sp_tensor_cols(qkv, 0, qd));
    if (c->a->attn_gate) be->ops->linear(be, &ly->qgate, h, sp_tensor_rows(c->qgate, 0, n));
    be->ops->linear(be, &ly->k, h, sp_tensor_cols(qkv, qd, kvd));
    be->ops->linear(be, &ly->v, h, sp_tensor_cols(qkv, qd + kvd, kvd));
}

/* A Gated DeltaNet layer on the n rows of h, its output into out. */
static void gated_delta(struct sp_ctx *c, const struct layer *ly, const struct sp_batch *b, struct sp_tensor out) {
    const struct sp_arch *a = c->a;
    struct sp_backend *be = c->be;
    int64_t n = b->n, d = a->d_model, Hv = a->lin_v_heads, vd = Hv * a->lin_v_dim, conv = sp_arch_conv_dim(a);
    struct sp_tensor h = sp_tensor_rows(c->h, 0, n), qkv = sp_tensor_rows(c->lqkv, 0, n),
                     z = sp_tensor_rows(c->lz, 0, n);
    struct sp_tensor ba = sp_tensor_rows(c->lba, 0, n), o = sp_tensor_rows(c->lout, 0, n);
    STEP(c, SP_STEP_QKV, (double)n * (double)d * (double)(conv + vd + 2 * Hv), be->ops->linear(be, &ly->lqkv, h, qkv);
         be->ops->linear(be, &ly->lz, h, z); be->ops->linear(be, &ly->lb, h, sp_tensor_cols(ba, 0, Hv));
         be->ops->linear(be, &ly->la, h, sp_tensor_cols(ba, Hv, Hv)));
    STEP(c, SP_STEP_ATTENTION, 2.0 * (double)n * (double)vd * (double)a->lin_k_dim,
         be->ops->gated_delta(be, &ly->delta, b, qkv, z, ba, o));
    STEP(c, SP_STEP_O, (double)n * (double)vd * (double)d, be->ops->linear(be, &ly->lout, o, out));
}

/* A Lightning layer on the n rows of h, its output into out. */
static void lightning(struct sp_ctx *c, const struct layer *ly, const struct sp_batch *b, struct sp_tensor out) {
    struct sp_backend *be = c->be;
    int64_t n = b->n, d = c->a->d_model, hd = c->a->n_heads * c->a->head_dim;
    struct sp_tensor h = sp_tensor_rows(c->h, 0, n), qkv = sp_tensor_cols(sp_tensor_rows(c->lqkv, 0, n), 0, 3 * hd);
    struct sp_tensor g = sp_tensor_cols(sp_tensor_rows(c->lz, 0, n), 0, hd);
    struct sp_tensor o = sp_tensor_cols(sp_tensor_rows(c->lout, 0, n), 0, hd);
    STEP(c, SP_STEP_QKV, (double)n * (double)d * (double)(4 * hd), be->ops->linear(be, &ly->qkv, h, qkv);
         be->ops->linear(be, &ly->lgate, h, g));
    STEP(c, SP_STEP_ATTENTION, 2.0 * (double)n * (double)hd * (double)c->a->head_dim,
         be->ops->lightning(be, &ly->light, b, qkv, o); be->ops->gate(be, o, g));
    STEP(c, SP_STEP_O, (double)n * (double)hd * (double)d, be->ops->linear(be, &ly->o, o, out));
}

/* The q / k norms of MLA's query bottleneck and latent (the reference's
 * default epsilon). */
#define MLA_NORM_EPS 1e-6f

/* An MLA layer on the n rows of h (load_mla), its output into out. */
static void mla(struct sp_ctx *c, const struct layer *ly, const struct sp_batch *b, struct sp_tensor out) {
    const struct sp_arch *a = c->a;
    struct sp_backend *be = c->be;
    int64_t n = b->n, d = a->d_model, H = a->n_heads, rope = a->mla_rope, kvl = a->mla_kv_lora, Dq = rope + kvl;
    struct sp_tensor h = sp_tensor_rows(c->h, 0, n), qkv = sp_tensor_rows(c->qkv, 0, n);
    struct sp_tensor q = sp_tensor_cols(qkv, 0, H * Dq), att = sp_tensor_rows(c->att, 0, n);
    double macs = (double)n * (double)(ly->mq.w.rows * ly->mq.w.cols + Dq * d);
    if (a->mla_q_lora) macs += (double)n * (double)(a->mla_q_lora * d);
    STEP(c, SP_STEP_QKV, macs, {
        if (a->mla_q_lora) {
            struct sp_tensor mq = sp_tensor_rows(c->mq, 0, n);
            be->ops->linear(be, &ly->mq_a, h, mq);
            be->ops->rmsnorm(be, ly->mq_norm, MLA_NORM_EPS, mq, mq);
            be->ops->linear(be, &ly->mq, mq, q);
        } else {
            be->ops->linear(be, &ly->mq, h, q);
        }
        struct sp_tensor k = sp_tensor_cols(qkv, H * Dq, Dq), v = sp_tensor_cols(qkv, H * Dq + Dq, Dq);
        be->ops->linear(be, &ly->mkv, h, k);
        be->ops->rmsnorm(be, ly->mkv_norm, MLA_NORM_EPS, sp_tensor_cols(k, rope, kvl), sp_tensor_cols(k, rope, kvl));
        be->ops->zero(be, v);  // the value is the key, unrotated
        be->ops->add(be, v, k);
    });
    STEP(c, SP_STEP_ATTENTION, attention_macs(c, b, 0) * (double)Dq / (double)a->head_dim,
         be->ops->attention(be, &ly->att, b, sp_tensor_cols(qkv, 0, H * Dq + 2 * Dq), att));
    struct sp_tensor vo = sp_tensor_cols(sp_tensor_rows(c->lz, 0, n), 0, H * a->mla_v);
    STEP(c, SP_STEP_O, (double)n * (double)H * (double)a->mla_v * (double)(kvl + d), {
        for (int64_t hh = 0; hh < H; hh++)
            be->ops->linear(be, &ly->muv[hh], sp_tensor_cols(att, hh * Dq + rope, kvl),
                            sp_tensor_cols(vo, hh * a->mla_v, a->mla_v));
        be->ops->linear(be, &ly->o, vo, out);
    });
}

/* Where the experts are split over ranks: the n rows of out, this rank's
 * share of a MoE layer's output, become the sum of every rank's. */
static bool sum_ranks(struct sp_ctx *c, struct sp_tensor out) {
    struct sp_backend *be = c->be;
    if (c->parts) {  // on the devices, the host waiting for none of them
        const void **parts = c->parts + c->parts_turn * c->p.n_ranks;
        c->parts_turn ^= 1;
        parts[c->rank] = be->ops->part_share(be, out);
        if (!sp_ranks_barrier(c->ranks)) return false;
        for (int r = 0; r < c->p.n_ranks; r++)
            if (!parts[r]) return false;
        be->ops->parts_add(be, out, parts, c->p.n_ranks);
        return true;
    }
    int64_t n = out.rows, d = out.cols;
    const float *hv = be->ops->host(be, out, c->rank_buf);
    if (hv != c->rank_buf)
        for (int64_t r = 0; r < n; r++) memcpy(c->rank_buf + r * d, hv + r * out.ld, (size_t)d * sizeof *hv);
    if (!sp_ranks_sum(c->ranks, c->rank, c->rank_buf, n * d)) return false;
    be->ops->write(be, out, c->rank_buf);
    return true;
}

/* One rank's pass (the only one's without ranks), to the lm_head where
 * head (the caller's context, not another thread's rank). */
static enum sp_status forward_rank(struct sp_ctx *c, const struct sp_batch *b, float *logits, bool head) {
    enum sp_status st = check_batch(c, b);
    if (st != SP_OK) return st;
    bind_rank(c);
    c->parts_turn = 0;  // every rank's first sum of the pass in the same round, whatever ended the last pass
    const struct sp_arch *a = c->a;
    struct sp_backend *be = c->be;
    int64_t n = b->n, d = a->d_model, qd = a->n_heads * a->head_dim, kvd = a->n_kv_heads * a->head_dim;
    float eps = (float)a->norm_eps;
    struct sp_tensor x = sp_tensor_rows(c->x, 0, n), h = sp_tensor_rows(c->h, 0, n), tmp = sp_tensor_rows(c->tmp, 0, n);
    if (c->n_marks) {  // a pass that failed left its marks
        c->n_marks = 0;
        be->ops->marks_clear(be);
    }
    STEP(c, SP_STEP_EMBED, 0, be->ops->embed(be, &c->embed, b, x));

    bool pending = false;  // the last layer's output, in tmp, still to be added into x (by the next norm)
    for (int64_t L = 0; L < a->n_layers; L++) {
        const struct layer *ly = &c->layers[L];
        if (pending) STEP(c, SP_STEP_NORMS, 0, be->ops->add_rmsnorm(be, ly->attn_norm, eps, x, tmp, false, h));
        else STEP(c, SP_STEP_NORMS, 0, be->ops->rmsnorm(be, ly->attn_norm, eps, x, h));
        if (ly->kind == SP_LAYER_GATED_DELTA) {
            gated_delta(c, ly, b, tmp);
        } else if (ly->kind == SP_LAYER_LIGHTNING) {
            lightning(c, ly, b, tmp);
        } else if (ly->kind == SP_LAYER_MLA) {
            mla(c, ly, b, tmp);
        } else {
            struct sp_tensor att = sp_tensor_rows(c->att, 0, n), qkv = sp_tensor_rows(c->qkv, 0, n);
            /* one op where the backend has it, but for --steps, which times the products apart */
            if (!a->attn_gate && be->ops->linear_attention && !c->p.time_steps) {
                bool f = a->fused_qkv;
                be->ops->linear_attention(be, f ? &ly->qkv : &ly->q, f ? NULL : &ly->k, f ? NULL : &ly->v, h, &ly->att,
                                          b, qkv, att);
            } else {
                double q_macs = (double)n * (double)d * (double)((a->attn_gate ? 2 : 1) * qd + 2 * kvd);
                STEP(c, SP_STEP_QKV, q_macs, qkv_products(c, ly, n));
                STEP(c, SP_STEP_ATTENTION, attention_macs(c, b, ly->att.window),
                     be->ops->attention(be, &ly->att, b, qkv, att);
                     if (a->attn_gate) be->ops->gate(be, att, sp_tensor_rows(c->qgate, 0, n)));
            }
            STEP(c, SP_STEP_O, (double)n * (double)qd * (double)d, be->ops->linear(be, &ly->o, att, tmp));
        }
        STEP(c, SP_STEP_NORMS, 0, add_rmsnorm(c, ly->ffn_norm, x, tmp, h));
        if (a->layer_moe[L]) {
            if (!moe(c, ly, n, tmp)) {
                track_states(c, b, false);
                return sp_errorf(SP_ERR_IO, "layer %lld: %s", (long long)L, sp_error_msg());
            }
            if (c->ranks && !sum_ranks(c, tmp)) {
                track_states(c, b, false);
                st = be->ops->error ? be->ops->error(be) : SP_OK;  // this rank's own failure first
                return st != SP_OK ? st : sp_errorf(SP_ERR_STATE, "layer %lld: another rank failed", (long long)L);
            }
        } else if (ly->has_mlp) {
            layer_mlp_add(c, ly, n, tmp);
        }
        /* prefetch_next reads x whole */
        bool pf_next = c->pf_experts && !c->pf_at_routing;
        pending = be->ops->add_rmsnorm && !pf_next && L + 1 < a->n_layers;
        if (!pending) STEP(c, SP_STEP_NORMS, 0, be->ops->add(be, x, tmp));
        if (pf_next) STEP(c, SP_STEP_EMBED, 0, prefetch_next(c, L, n));
    }

    int64_t m = 0;  // set inside the step, before STEP adds its multiply-adds
    if (head) STEP(c, SP_STEP_LM_HEAD, (double)m * (double)d * (double)a->vocab, m = lm_head(c, b, x, logits));
    if (c->p.time_steps) read_marks(c);
    st = be->ops->error ? be->ops->error(be) : SP_OK;
    track_states(c, b, st == SP_OK);
    return st;
}

/* A pass over every rank: each one's status and error (SP_ERR_STATE where
 * it stopped at a sum that another rank's failure left unfinished). */
struct rank_pass {
    struct sp_ctx **ctx;
    const struct sp_batch *b;
    float *logits;
    enum sp_status st[SP_RANKS_MAX];
    char why[SP_RANKS_MAX][256];
};

static void rank_pass_run(void *arg, int r) {
    struct rank_pass *p = arg;
    p->st[r] = forward_rank(p->ctx[r], p->b, p->logits, r == 0);
    if (p->st[r] == SP_OK) return;
    snprintf(p->why[r], sizeof p->why[r], "%s", sp_error_msg());
    sp_ranks_fail(p->ctx[0]->ranks, r);
}

enum sp_status sp_ctx_forward(struct sp_ctx *c, const struct sp_batch *b, float *logits) {
    if (leading(c)) {
        enum sp_status st = check_batch(c, b);  // a batch every rank would refuse is not sent
        if (st != SP_OK) return st;
        if (!lead_send(c, FOLLOW_FORWARD, b->n, 0, 0, b))
            return sp_errorf(SP_ERR_IO, "rank 0: another rank is gone (its connection closed)");
    }
    if (!c->peers) return forward_rank(c, b, logits, true);
    struct rank_pass p = {.ctx = c->peers, .b = b, .logits = logits};
    sp_ranks_run(c->ranks, rank_pass_run, &p);
    int first = -1;  // the first rank that failed on its own, else the first that failed
    for (int r = c->p.n_ranks - 1; r >= 0; r--)
        if (p.st[r] != SP_OK && (first < 0 || p.st[first] == SP_ERR_STATE || p.st[r] != SP_ERR_STATE)) first = r;
    return first < 0 ? SP_OK : sp_errorf(p.st[first], "rank %d: %s", first, p.why[first]);
}

enum sp_status sp_ctx_follow(struct sp_ctx *c) {
    if (!c->p.group || !c->p.lead || c->rank == 0)
        return sp_errorf(SP_ERR_STATE, "sp_ctx_follow: the context is not a rank that follows rank 0");
    const int64_t B = c->p.max_batch;
    for (;;) {
        size_t len;
        int64_t head[FOLLOW_HEAD];
        if (!sp_ranks_recv(c->ranks, c->follow_buf, FOLLOW_BYTES(B), &len) || len < sizeof head)
            return sp_errorf(SP_ERR_IO, "rank %d: rank 0 is gone (its connection closed)", c->rank);
        memcpy(head, c->follow_buf, sizeof head);
        const uint8_t *p = c->follow_buf + sizeof head;
        switch (head[0]) {
        case FOLLOW_FORWARD: {
            int64_t n = head[1];
            if (n < 1 || n > B || len != FOLLOW_BYTES(n))
                return sp_errorf(SP_ERR_FORMAT, "rank %d: a pass of %lld tokens in %zu bytes from rank 0", c->rank,
                                 (long long)n, len);
            size_t ints = (size_t)n * sizeof(int32_t);
            for (int64_t t = 0; t < n; t++) c->follow_snap[t] = p[3 * ints + (size_t)t] != 0;
            struct sp_batch b = {.n = n, .tokens = (const int32_t *)(const void *)p,
                                 .pos = (const int32_t *)(const void *)(p + ints),
                                 .seq = (const int32_t *)(const void *)(p + 2 * ints), .snapshot = c->follow_snap};
            enum sp_status st = forward_rank(c, &b, NULL, false);
            if (st != SP_OK) {  // rank 0's sums then fail too
                sp_ranks_fail(c->ranks, c->rank);
                return sp_errorf(st, "rank %d: %s", c->rank, sp_error_msg());
            }
            break;
        }
        case FOLLOW_COPY:
            if (head[1] < 0 || head[1] >= c->p.n_seq || head[2] < 0 || head[2] >= c->p.n_seq || head[3] < 0)
                return sp_errorf(SP_ERR_FORMAT, "rank %d: a copy of sequence %lld to %lld from rank 0", c->rank,
                                 (long long)head[1], (long long)head[2]);
            sp_ctx_copy_seq(c, (int)head[1], (int)head[2], head[3]);
            break;
        case FOLLOW_RESUME:
            if (head[1] < 0 || head[1] >= c->p.n_seq || head[2] < 0)
                return sp_errorf(SP_ERR_FORMAT, "rank %d: a resume of sequence %lld from rank 0", c->rank,
                                 (long long)head[1]);
            sp_ctx_seq_resume(c, (int)head[1], head[2]);
            break;
        case FOLLOW_QUIT: return SP_OK;
        default: return sp_errorf(SP_ERR_FORMAT, "rank %d: call %lld from rank 0", c->rank, (long long)head[0]);
        }
    }
}
