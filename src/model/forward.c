/*
 * forward.c - the generic forward pass. Every architecture runs through the
 * same layer loop; the descriptor (struct sp_arch) decides attention
 * details, MLP kind per layer, routing and activation.
 */
#include "model/forward.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/half.h"
#include "kernels/cpu/kernels.h"
#include "kernels/cpu/linear.h"
#include "model/experts.h"

/* Weight views and float copies of the small parameters of one layer. */
struct layer {
    struct sp_linear qkv, q, k, v, o;
    float *attn_norm, *ffn_norm;  // (d)
    float *q_norm, *k_norm;       // (head_dim) or NULL
    float *sinks;                 // (n_heads) or NULL
    /* dense MLP, or the shared expert of a MoE layer */
    struct sp_linear gate, up, down;
    bool has_mlp;
    /* MoE */
    struct sp_linear router;
    float *expert_bias;  // (E) or NULL
    struct sp_linear *egate, *eup, *edown, *egate_up;  // (E) each; egate_up when fused
};

/* A gated MLP applied to cnt rows of x, its rows in the batch buffers from
 * `row` on (see ffn_items). */
struct ffn_item {
    const struct sp_linear *gate, *up, *gate_up, *down;  // gate_up (interleaved) instead of gate and up
    const float *x;
    int64_t ldx, row, cnt;
};

struct sp_ctx {
    const struct sp_model *m;
    const struct sp_arch *a;
    struct sp_ctx_params p;
    struct sp_step_times steps;  // p.time_steps: what each step took so far
    struct sp_pool *pool;
    struct layer *layers;  // (n_layers)
    struct sp_linear embed, lm_head;
    struct sp_expert_store *experts;  // NULL: experts read through the mapping
    int64_t *pf_experts;              // (n_experts) experts predicted for the next MoE layer
    struct sp_expert_views *pf_views; // (n_experts) their views into the files
    float *out_norm;  // (d)
    /* RoPE */
    float *inv_freq;  // (rot_dims / 2)
    float rope_scale;  // multiplies cos and sin (YaRN attention factor)
    float *rope_cs;    // (B, rot_dims): each batch token's cos, then sin, times rope_scale
    /* KV cache (head-major, keys in blocks of columns: kv_head) */
    void *kv;
    size_t kv_bytes, kv_row_bytes;  // the cache; one head's values of a position
    int64_t kv_row;  // kv_heads * head_dim
    /* batch buffers, max_batch rows each */
    float *x, *h, *qkv, *att, *tmp;  // x, h, tmp: (B, d); qkv: (B, q + 2kv); att: (B, q)
    int64_t ld_qkv;
    float *ff_a, *ff_b;  // (B, max MLP width * 2)
    int64_t ld_ff;
    float *router_out;   // (B, E)
    int32_t *sel;        // (B, k)
    float *sel_w;        // (B, k)
    int32_t *etok;       // (B * k) token of each (expert, slot)
    float *ew;           // (B * k) its weight
    int64_t *ecount;     // (E + 1) offsets
    float *gath, *gout;  // (B, d)
    struct ffn_item *items;           // (E + 1) gated MLPs run together
    int64_t *item_ends;               // (E + 1) where their positions end (struct ffn_job)
    struct sp_expert_views *eviews;   // (E) the views of their experts
    int64_t *item_expert;             // (E) and the experts' numbers
    float *scores;       // (threads, sp_attention_scratch_floats)
    int32_t *att_tiles;  // (B + 1) attention tiles of the batch
    float *logit_rows;   // (B, d)
};

/* Cached rows converted to float at a time for all query heads of their KV
 * head (16 KiB at head_dim 128: they stay in L1 while every head uses
 * them). Keys are cached as such blocks of columns (the KV cache, below),
 * ATT_BLOCK floats per dimension once converted, so a score's 8 lanes are
 * 8 positions; the 8 floats past the block let dot_cols read a block's
 * columns from any offset rounded up to 8. */
#define ATT_BLOCK 32
#define ATT_ROWS_FLOATS(hd) (ATT_BLOCK * (hd) + 8)

/* Runs the statement after m, adding its time and m multiply-adds to step
 * s of c when c keeps step times (m is not evaluated otherwise). */
#define STEP(c, s, m, ...)                                   \
    do {                                                     \
        double step_t0_ = (c)->p.time_steps ? sp_now_s() : 0; \
        __VA_ARGS__;                                         \
        if ((c)->p.time_steps) {                             \
            (c)->steps.seconds[s] += sp_now_s() - step_t0_;  \
            (c)->steps.macs[s] += (m);                       \
        }                                                    \
    } while (0)

const char *sp_step_name(enum sp_step s) {
    static const char *const names[SP_STEP_COUNT] = {"embed", "norms", "qkv", "attention", "o", "router",
                                                     "route", "experts", "move", "mlp", "lm_head"};
    return s >= 0 && s < SP_STEP_COUNT ? names[s] : "?";
}

void sp_ctx_step_times(struct sp_ctx *c, struct sp_step_times *out, bool reset) {
    *out = c->steps;
    if (reset) memset(&c->steps, 0, sizeof c->steps);
}

/* Attention is an online softmax (flash-style): a task (a tile of up to
 * ATT_TILE query tokens of one sequence x query heads of one KV head)
 * takes the cached positions a chunk of ATT_CHUNK at a time, chunks counted
 * from position 0. Per chunk it converts each block of cached keys once for
 * all its tokens and heads and scores them, takes the exps of the scores
 * against the running max (rescaling the sums so far where the max grew),
 * then converts each block of values and adds them in, weighted by the
 * exps; at the end each (token, head) divides by its sum of exps. A
 * (token, head) goes through the same chunks and operations in the same
 * order whatever its tile, so no tiling changes a result; its scratch does
 * not grow with the context. */
#define ATT_TILE 16
#define ATT_CHUNK 128

/* The (token, head) pairs a task can hold: a tile x a KV head's query heads */
static int64_t att_pairs(const struct sp_arch *a) { return ATT_TILE * (a->n_heads / a->n_kv_heads); }

/* A thread's attention scratch, in floats: per (token, head) of a task its
 * sum of exps (a double) and running max, then its scores over a chunk,
 * then a block of converted cached rows (attention_task lays them out);
 * whole cache lines. */
size_t sp_attention_scratch_floats(const struct sp_arch *a) {
    size_t floats = (size_t)att_pairs(a) * (2 + 1 + ATT_CHUNK) + (size_t)ATT_ROWS_FLOATS(a->head_dim);
    return (floats + 15) / 16 * 16;
}

int64_t sp_mlp_width(const struct sp_arch *a) {
    int64_t ff = a->d_ff;
    if (a->d_expert * 2 > ff) ff = a->d_expert * 2;
    if (a->d_expert * a->n_shared_experts > ff) ff = a->d_expert * a->n_shared_experts;
    return ff;
}

size_t sp_expert_tables_bytes(const struct sp_arch *a) {
    size_t E = a->n_experts > 0 ? (size_t)a->n_experts : 1;
    return (E + 1) * (sizeof(struct ffn_item) + sizeof(int64_t)) +
           E * (sizeof(struct sp_expert_views) + sizeof(int64_t));
}

const char *sp_kv_type_name(enum sp_kv_type t) {
    static const char *const n[SP_KV_TYPE_COUNT] = {"f16", "bf16", "f32"};
    return (unsigned)t < SP_KV_TYPE_COUNT ? n[t] : "?";
}

bool sp_kv_type_from_name(const char *name, enum sp_kv_type *out) {
    for (int i = 0; i < SP_KV_TYPE_COUNT; i++)
        if (strcmp(name, sp_kv_type_name((enum sp_kv_type)i)) == 0) {
            *out = (enum sp_kv_type)i;
            return true;
        }
    return false;
}

static enum sp_dtype kv_dtype(enum sp_kv_type t) {
    return t == SP_KV_F32 ? SP_DTYPE_F32 : t == SP_KV_BF16 ? SP_DTYPE_BF16 : SP_DTYPE_F16;
}

/* ---- RoPE frequencies (as the reference implementations compute them) ---- */

static void rope_init(struct sp_ctx *c) {
    const struct sp_rope *r = &c->a->rope;
    int64_t dim = r->rot_dims, half = dim / 2;
    c->rope_scale = 1.0f;
    for (int64_t i = 0; i < half; i++) {
        /* inv_freq = 1 / base^(2i/dim), in float32 like the references */
        float expo = (float)(2 * i) / (float)dim;
        float pos_freq = powf((float)r->theta, expo);
        c->inv_freq[i] = 1.0f / pos_freq;
    }
    if (r->kind == SP_ROPE_LINEAR) {
        for (int64_t i = 0; i < half; i++) c->inv_freq[i] /= (float)r->factor;
    } else if (r->kind == SP_ROPE_LLAMA3) {
        double old_len = (double)r->orig_max_pos;
        double low_wavelen = old_len / r->low_freq_factor, high_wavelen = old_len / r->high_freq_factor;
        for (int64_t i = 0; i < half; i++) {
            float inv = c->inv_freq[i];
            double wavelen = 2.0 * M_PI / inv;
            if (wavelen > low_wavelen) {
                c->inv_freq[i] = inv / (float)r->factor;
            } else if (wavelen >= high_wavelen) {
                float smooth = (float)((old_len / wavelen - r->low_freq_factor) / (r->high_freq_factor - r->low_freq_factor));
                c->inv_freq[i] = (1.0f - smooth) * inv / (float)r->factor + smooth * inv;
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
            c->inv_freq[i] = interp * (1.0f - extrap_factor) + extrap * extrap_factor;
        }
        double af = r->attention_factor;
        if (af <= 0) af = f <= 1 ? 1.0 : 0.1 * log(f) + 1.0;
        c->rope_scale = (float)af;
    }
}

/* The cos and sin of batch token t's position (rope_cs), once per forward
 * pass: every head of every layer rotates by the same angles. */
static void rope_angles(const struct sp_ctx *c, int64_t t, int64_t pos) {
    int64_t half = c->a->rope.rot_dims / 2;
    float *cs = c->rope_cs + t * 2 * half;
    for (int64_t i = 0; i < half; i++) {
        float ang = (float)pos * c->inv_freq[i];
        cs[i] = (float)cos((double)ang) * c->rope_scale;
        cs[half + i] = (float)sin((double)ang) * c->rope_scale;
    }
}

/* Rotates the first rot_dims of one head of batch token t (halves paired,
 * as rotate_half). */
static void rope_apply(const struct sp_ctx *c, float *v, int64_t t) {
    int64_t half = c->a->rope.rot_dims / 2;
    const float *cs = c->rope_cs + t * 2 * half, *sn = cs + half;
    for (int64_t i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs[i] - x2 * sn[i];
        v[i + half] = x2 * cs[i] + x1 * sn[i];
    }
}

/* ---- setup ---- */

static float *vec_f32(const struct sp_model *m, int64_t layer, enum sp_role role, enum sp_status *st) {
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

static enum sp_status lin(const struct sp_model *m, int64_t L, enum sp_role r, int64_t e, struct sp_linear *out,
                          size_t *scratch) {
    enum sp_status st = sp_model_linear(m, L, r, e, out);
    if (st == SP_OK && sp_linear_scratch_bytes(out) > *scratch) *scratch = sp_linear_scratch_bytes(out);
    return st;
}

static enum sp_status load_layer(struct sp_ctx *c, int64_t L, size_t *scratch) {
    const struct sp_model *m = c->m;
    const struct sp_arch *a = c->a;
    struct layer *ly = &c->layers[L];
    enum sp_status st = SP_OK;
    ly->attn_norm = vec_f32(m, L, SP_ROLE_ATTN_NORM, &st);
    ly->ffn_norm = vec_f32(m, L, SP_ROLE_FFN_NORM, &st);
    if (a->qk_norm) {
        ly->q_norm = vec_f32(m, L, SP_ROLE_ATTN_Q_NORM, &st);
        ly->k_norm = vec_f32(m, L, SP_ROLE_ATTN_K_NORM, &st);
    }
    if (a->attn_sinks) ly->sinks = vec_f32(m, L, SP_ROLE_ATTN_SINKS, &st);
    if (st != SP_OK) return st;
    if (a->fused_qkv) {
        if ((st = lin(m, L, SP_ROLE_ATTN_QKV, -1, &ly->qkv, scratch)) != SP_OK) return st;
    } else {
        if ((st = lin(m, L, SP_ROLE_ATTN_Q, -1, &ly->q, scratch)) != SP_OK) return st;
        if ((st = lin(m, L, SP_ROLE_ATTN_K, -1, &ly->k, scratch)) != SP_OK) return st;
        if ((st = lin(m, L, SP_ROLE_ATTN_V, -1, &ly->v, scratch)) != SP_OK) return st;
    }
    if ((st = lin(m, L, SP_ROLE_ATTN_O, -1, &ly->o, scratch)) != SP_OK) return st;
    if (!a->layer_moe[L] || a->n_shared_experts > 0) {
        enum sp_role g = a->layer_moe[L] ? SP_ROLE_SHEXP_GATE : SP_ROLE_FFN_GATE;
        enum sp_role u = a->layer_moe[L] ? SP_ROLE_SHEXP_UP : SP_ROLE_FFN_UP;
        enum sp_role d = a->layer_moe[L] ? SP_ROLE_SHEXP_DOWN : SP_ROLE_FFN_DOWN;
        if ((st = lin(m, L, g, -1, &ly->gate, scratch)) != SP_OK) return st;
        if ((st = lin(m, L, u, -1, &ly->up, scratch)) != SP_OK) return st;
        if ((st = lin(m, L, d, -1, &ly->down, scratch)) != SP_OK) return st;
        ly->has_mlp = true;
    }
    if (!a->layer_moe[L]) return SP_OK;
    if ((st = lin(m, L, SP_ROLE_ROUTER, -1, &ly->router, scratch)) != SP_OK) return st;
    ly->router.float_activations = true;
    if (sp_weights_find(&m->weights, L, SP_ROLE_EXPERT_BIAS, -1)) {
        ly->expert_bias = vec_f32(m, L, SP_ROLE_EXPERT_BIAS, &st);
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
    for (int64_t e = 0; e < a->n_experts; e++) {
        if (m->fused_gate_up) {
            if ((st = lin(m, L, SP_ROLE_EXP_GATE_UP, e, &ly->egate_up[e], scratch)) != SP_OK) return st;
        } else {
            if ((st = lin(m, L, SP_ROLE_EXP_GATE, e, &ly->egate[e], scratch)) != SP_OK) return st;
            if ((st = lin(m, L, SP_ROLE_EXP_UP, e, &ly->eup[e], scratch)) != SP_OK) return st;
        }
        if ((st = lin(m, L, SP_ROLE_EXP_DOWN, e, &ly->edown[e], scratch)) != SP_OK) return st;
    }
    return SP_OK;
}

void sp_ctx_free(struct sp_ctx *c) {
    if (!c) return;
    if (c->layers) {
        for (int64_t L = 0; L < c->a->n_layers; L++) {
            struct layer *ly = &c->layers[L];
            sp_free(ly->attn_norm);
            sp_free(ly->ffn_norm);
            sp_free(ly->q_norm);
            sp_free(ly->k_norm);
            sp_free(ly->sinks);
            sp_free(ly->expert_bias);
            sp_free(ly->egate);
            sp_free(ly->eup);
            sp_free(ly->edown);
            sp_free(ly->egate_up);
        }
    }
    sp_free(c->layers);
    sp_free(c->out_norm);
    sp_free(c->inv_freq);
    sp_free_aligned(c->kv);
    float *bufs[] = {c->x,     c->h,  c->qkv,  c->att,  c->tmp,    c->ff_a,       c->ff_b,  c->router_out,
                     c->sel_w, c->ew, c->gath, c->gout, c->scores, c->logit_rows, c->rope_cs};
    for (size_t i = 0; i < sizeof bufs / sizeof *bufs; i++) sp_free_aligned(bufs[i]);
    sp_free_aligned(c->sel);
    sp_free_aligned(c->etok);
    sp_free_aligned(c->ecount);
    sp_free_aligned(c->items);
    sp_free_aligned(c->item_ends);
    sp_free_aligned(c->att_tiles);
    sp_free_aligned(c->eviews);
    sp_free_aligned(c->item_expert);
    sp_pool_free(c->pool);
    sp_expert_store_free(c->experts);
    sp_free(c->pf_experts);
    sp_free(c->pf_views);
    sp_free(c);
}

/* A batch buffer, in 2 MiB pages where it spans one or more: a prefill walks
 * rows kilobytes apart (a token's q / k / v, a head's scores, an expert's
 * rows), touching many 4 KiB pages at a time; in 2 MiB pages a 512-token
 * prefill ran 1.11-1.20x faster (2 threads, Zen 5, 4 layers of
 * Qwen3-30B-A3B and Ling-mini-2.0 mxfp4). */
static void *act_buf(size_t n, size_t size, bool *ok) {
    void *p = sp_malloc_huge(n * size + 64, SP_MEM_ACT);
    if (!p) *ok = false;
    return p;
}

enum sp_status sp_ctx_create(const struct sp_model *m, const struct sp_ctx_params *params, struct sp_ctx **out) {
    *out = NULL;
    const struct sp_arch *a = &m->arch;
    struct sp_ctx *c = sp_calloc(1, sizeof *c, SP_MEM_MODEL);
    if (!c) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    c->m = m;
    c->a = a;
    c->p = *params;
    if (c->p.n_ctx <= 0) c->p.n_ctx = a->max_pos < 4096 ? a->max_pos : 4096;
    if (c->p.n_seq <= 0) c->p.n_seq = 1;
    if (c->p.max_batch <= 0) c->p.max_batch = SP_DEFAULT_BATCH;
    enum sp_status st = SP_OK;
    if ((unsigned)c->p.kv_type >= SP_KV_TYPE_COUNT) {
        st = sp_errorf(SP_ERR_ARG, "unknown KV cache type");
        goto fail;
    }
    if ((st = sp_pool_create(c->p.n_threads, &c->pool)) != SP_OK) goto fail;
    c->p.n_threads = sp_pool_size(c->pool);

    size_t scratch = 0;
    c->layers = sp_calloc((size_t)a->n_layers, sizeof *c->layers, SP_MEM_MODEL);
    c->inv_freq = sp_malloc((size_t)(a->rope.rot_dims / 2 + 1) * sizeof(float), SP_MEM_MODEL);
    if (!c->layers || !c->inv_freq) goto nomem;
    rope_init(c);
    if ((st = lin(m, -1, SP_ROLE_EMBED, -1, &c->embed, &scratch)) != SP_OK) goto fail;
    if ((st = lin(m, -1, m->has_lm_head ? SP_ROLE_LM_HEAD : SP_ROLE_EMBED, -1, &c->lm_head, &scratch)) != SP_OK) goto fail;
    c->out_norm = vec_f32(m, -1, SP_ROLE_OUT_NORM, &st);
    if (st != SP_OK) goto fail;
    for (int64_t L = 0; L < a->n_layers; L++)
        if ((st = load_layer(c, L, &scratch)) != SP_OK) goto fail;
    if ((st = sp_pool_reserve(c->pool, scratch)) != SP_OK) goto fail;
    if (c->p.expert_cache && (st = sp_expert_store_create(m, c->p.expert_cache, &c->p.expert_params, &c->experts)) != SP_OK) goto fail;
    if (c->experts && sp_expert_store_prefetching(c->experts)) {
        c->pf_experts = sp_malloc((size_t)a->n_experts * sizeof *c->pf_experts, SP_MEM_MODEL);
        c->pf_views = sp_malloc((size_t)a->n_experts * sizeof *c->pf_views, SP_MEM_MODEL);
        if (!c->pf_experts || !c->pf_views) goto nomem;
    }

    int64_t d = a->d_model, qd = a->n_heads * a->head_dim, B = c->p.max_batch;
    c->kv_row = a->n_kv_heads * a->head_dim;
    c->kv_row_bytes = (size_t)a->head_dim * sp_dtype_size(kv_dtype(c->p.kv_type));
    c->kv_bytes = sp_kv_cache_bytes(a, c->p.n_ctx, c->p.n_seq, c->p.kv_type);
    c->kv = sp_malloc_huge(c->kv_bytes ? c->kv_bytes : 64, SP_MEM_KV);
    if (!c->kv) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory for a %zu-byte KV cache (%lld positions x %d sequences)", c->kv_bytes,
                       (long long)c->p.n_ctx, c->p.n_seq);
        goto fail;
    }
    memset(c->kv, 0, c->kv_bytes);
    int64_t ff = sp_mlp_width(a);
    c->ld_qkv = qd + 2 * c->kv_row;
    c->ld_ff = ff;
    int64_t E = a->n_experts > 0 ? a->n_experts : 1, K = a->n_experts_used > 0 ? a->n_experts_used : 1;
    bool ok = true;
    c->x = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->h = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->tmp = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->qkv = act_buf((size_t)(B * c->ld_qkv), sizeof(float), &ok);
    c->att = act_buf((size_t)(B * qd), sizeof(float), &ok);
    c->ff_a = act_buf((size_t)(B * ff), sizeof(float), &ok);
    c->ff_b = act_buf((size_t)(B * ff), sizeof(float), &ok);
    c->router_out = act_buf((size_t)(B * E), sizeof(float), &ok);
    c->sel = act_buf((size_t)(B * K), sizeof(int32_t), &ok);
    c->sel_w = act_buf((size_t)(B * K), sizeof(float), &ok);
    c->etok = act_buf((size_t)(B * K), sizeof(int32_t), &ok);
    c->ew = act_buf((size_t)(B * K), sizeof(float), &ok);
    c->ecount = act_buf((size_t)(E + 1), sizeof(int64_t), &ok);
    c->gath = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->gout = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->items = act_buf((size_t)(E + 1), sizeof *c->items, &ok);
    c->item_ends = act_buf((size_t)(E + 1), sizeof *c->item_ends, &ok);
    c->eviews = act_buf((size_t)E, sizeof *c->eviews, &ok);
    c->item_expert = act_buf((size_t)E, sizeof *c->item_expert, &ok);
    c->att_tiles = act_buf((size_t)(B + 1), sizeof(int32_t), &ok);
    c->scores = act_buf((size_t)c->p.n_threads * sp_attention_scratch_floats(a), sizeof(float), &ok);
    c->logit_rows = act_buf((size_t)(B * d), sizeof(float), &ok);
    c->rope_cs = act_buf((size_t)(B * (a->rope.rot_dims > 0 ? a->rope.rot_dims : 1)), sizeof(float), &ok);
    if (!ok) goto nomem;
    *out = c;
    return SP_OK;
nomem:
    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
fail:
    sp_ctx_free(c);
    return st;
}

const struct sp_ctx_params *sp_ctx_params(const struct sp_ctx *c) { return &c->p; }

bool sp_ctx_expert_stats(const struct sp_ctx *c, struct sp_expert_store_stats *out) {
    if (!c->experts) return false;
    sp_expert_store_stats(c->experts, out);
    return true;
}
struct sp_pool *sp_ctx_pool(struct sp_ctx *c) { return c->pool; }
size_t sp_ctx_kv_bytes(const struct sp_ctx *c) { return c->kv_bytes; }

/* ---- KV cache ---- */

/* Head-major: layer, K or V (which), sequence, KV head, then the head's
 * positions, so what one attention task reads (one KV head of one
 * sequence) lies together. Values are rows of head_dim; keys are stored as
 * the blocks attention reads: block b of a head holds positions 32b to
 * 32b + 31 as head_dim columns of ATT_BLOCK (element d of position p at
 * d * ATT_BLOCK + p % ATT_BLOCK), converted to float as they lie. A head
 * holds the context rounded up to whole blocks. */
static int64_t kv_positions(int64_t n_ctx) { return (n_ctx + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK; }

size_t sp_kv_cache_bytes(const struct sp_arch *a, int64_t n_ctx, int64_t n_seq, enum sp_kv_type t) {
    return (size_t)a->n_layers * 2 * (size_t)n_seq * (size_t)a->n_kv_heads * (size_t)kv_positions(n_ctx) *
           (size_t)a->head_dim * sp_dtype_size(kv_dtype(t));
}

/* Position 0 of one KV head of one sequence in layer L. */
static uint8_t *kv_head(const struct sp_ctx *c, int64_t L, int which, int64_t seq, int64_t kvh) {
    size_t idx = (((size_t)L * 2 + (size_t)which) * (size_t)c->p.n_seq + (size_t)seq) * (size_t)c->a->n_kv_heads;
    return (uint8_t *)c->kv + (idx + (size_t)kvh) * (size_t)kv_positions(c->p.n_ctx) * c->kv_row_bytes;
}

/* The values of position pos, or the block of keys that holds it. */
static void *kv_values(const struct sp_ctx *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos) {
    return kv_head(c, L, 1, seq, kvh) + (size_t)pos * c->kv_row_bytes;
}
static void *kv_key_block(const struct sp_ctx *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos) {
    return kv_head(c, L, 0, seq, kvh) + (size_t)(pos / ATT_BLOCK * ATT_BLOCK) * c->kv_row_bytes;
}

/* n floats as dtype dt (as sp_dtype_store_float rounds them), element i
 * at element i * step of dst. The conversions are inlined rather than
 * sp_dtype_store_float called per element: a prefill stores every token's
 * keys and values of every layer through here. */
static void kv_put(enum sp_dtype dt, void *dst, int64_t step, const float *src, int64_t n) {
    if (dt == SP_DTYPE_F32) {
        for (int64_t i = 0; i < n; i++) ((float *)dst)[i * step] = src[i];
        return;
    }
    uint16_t *o = dst;
    if (dt == SP_DTYPE_F16)
        for (int64_t i = 0; i < n; i++) o[i * step] = sp_f32_to_f16(src[i]);
    else
        for (int64_t i = 0; i < n; i++) o[i * step] = sp_f32_to_bf16(src[i]);
}

/* One KV head's key k and values v of position pos. */
static void kv_store(const struct sp_ctx *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos, const float *k,
                     const float *v) {
    enum sp_dtype dt = kv_dtype(c->p.kv_type);
    size_t col = (size_t)(pos % ATT_BLOCK) * sp_dtype_size(dt);
    kv_put(dt, (uint8_t *)kv_key_block(c, L, seq, kvh, pos) + col, ATT_BLOCK, k, c->a->head_dim);
    kv_put(dt, kv_values(c, L, seq, kvh, pos), 1, v, c->a->head_dim);
}

void sp_ctx_copy_seq(struct sp_ctx *c, int src, int dst, int64_t n) {
    if (src == dst || n <= 0) return;
    for (int64_t L = 0; L < c->a->n_layers; L++)
        for (int w = 0; w < 2; w++)
            for (int64_t h = 0; h < c->a->n_kv_heads; h++)  // keys: whole blocks
                memcpy(kv_head(c, L, w, dst, h), kv_head(c, L, w, src, h),
                       (size_t)(w ? n : kv_positions(n)) * c->kv_row_bytes);
}

/* ---- attention ---- */

struct att_job {
    struct sp_ctx *c;
    const struct sp_batch *b;
    int64_t L;
    const int32_t *tiles;  // (n_tiles + 1) first batch token of each tile
    int64_t n_tiles, per;  // query heads per task
    atomic_llong next;     // the next task to take
};

/* ---- per-token steps, split over the pool's threads ----
 *
 * Each token's result depends on that token alone, so splitting changes no
 * bit. Below TOKENS_PER_THREAD tokens per thread the caller works alone
 * (decode: waking a worker would cost more than the work). */
#define TOKENS_PER_THREAD 4

typedef void (*token_fn)(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1);

struct token_job {
    struct sp_ctx *c;
    token_fn fn;
    const void *arg;
    int64_t n;
};

static void token_job_run(void *p, int tid, int nth) {
    struct token_job *j = p;
    int64_t lo, hi;
    sp_pool_split(j->n, tid, nth, &lo, &hi);
    if (lo < hi) j->fn(j->c, j->arg, lo, hi);
}

/* fn over tokens (or rows) [0, n). */
static void for_tokens(struct sp_ctx *c, int64_t n, token_fn fn, const void *arg) {
    int nth = sp_pool_size(c->pool);
    struct token_job j = {c, fn, arg, n};
    sp_pool_run_n(c->pool, token_job_run, &j, n >= (int64_t)nth * TOKENS_PER_THREAD ? nth : 1);
}

/* h = rmsnorm(x) with the weights `arg`. */
static void norm_tokens(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    int64_t d = c->a->d_model;
    for (int64_t t = t0; t < t1; t++) sp_rmsnorm(c->h + t * d, c->x + t * d, arg, d, (float)c->a->norm_eps);
}

/* dst += src, rows of d floats. */
struct row_add {
    float *dst;
    const float *src;
};

static void add_rows(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    const struct row_add *r = arg;
    int64_t d = c->a->d_model;
    for (int64_t i = t0 * d; i < t1 * d; i++) r->dst[i] += r->src[i];
}

/* What the per-token steps of one layer need besides the context. */
struct layer_step {
    const struct sp_batch *b;
    const struct layer *ly;
    int64_t L;
};

/* After the QKV product: per-head q / k norms, RoPE, and the token's K and
 * V rows into the cache. */
static void qkv_tokens(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    const struct layer_step *s = arg;
    const struct sp_arch *a = c->a;
    int64_t hd = a->head_dim, qd = a->n_heads * hd, kvd = c->kv_row;
    for (int64_t t = t0; t < t1; t++) {
        float *row = c->qkv + t * c->ld_qkv;
        for (int64_t h = 0; h < a->n_heads + a->n_kv_heads; h++) {
            float *v = row + h * hd;
            bool is_q = h < a->n_heads;
            if (s->ly->q_norm) sp_rmsnorm(v, v, is_q ? s->ly->q_norm : s->ly->k_norm, hd, (float)a->norm_eps);
            rope_apply(c, v, t);
        }
        for (int64_t h = 0; h < a->n_kv_heads; h++)
            kv_store(c, s->L, s->b->seq[t], h, s->b->pos[t], row + qd + h * hd, row + qd + kvd + h * hd);
    }
}

/* Query heads of one KV head taken per attention task: all of them (each
 * cached row converted once for the group) unless that leaves fewer than
 * two tasks per thread. */
static int64_t att_heads_per_task(const struct sp_arch *a, int64_t n_tiles, int nth) {
    int64_t per = a->n_heads / a->n_kv_heads;
    while (per % 2 == 0 && n_tiles * (a->n_heads / per) < 2 * nth) per /= 2;
    return per;
}

/* Visible cached positions [*lo, *hi] of batch token t in layer L. */
static void att_range(const struct sp_ctx *c, const struct sp_batch *b, int64_t L, int64_t t, int64_t *lo,
                      int64_t *hi) {
    const struct sp_arch *a = c->a;
    bool sliding = a->layer_sliding[L] && a->sliding_window > 0;
    int64_t pos = b->pos[t];
    *lo = sliding && pos - a->sliding_window + 1 > 0 ? pos - a->sliding_window + 1 : 0;
    *hi = pos;
}

/* Cached positions p0 .. p0 + nb - 1 (p0 a multiple of ATT_BLOCK) of one
 * KV head as floats: values (which 1) as rows of head_dim, keys (which 0)
 * as their whole block of columns. */
static void att_rows(const struct sp_ctx *c, int64_t L, int which, int64_t seq, int64_t kvh, int64_t p0, int64_t nb,
                     float *rows) {
    enum sp_dtype dt = kv_dtype(c->p.kv_type);
    if (which == 1)
        sp_f32_from_dt(rows, kv_values(c, L, seq, kvh, p0), dt, nb * c->a->head_dim);
    else
        sp_f32_from_dt(rows, kv_key_block(c, L, seq, kvh, p0), dt, ATT_BLOCK * c->a->head_dim);
}

/* One attention task: tokens [t0, t1) of sequence seq (a tile) x query
 * heads [h0, h0 + per) of KV head kvh; cached positions first..last cover
 * what each of the tokens sees. Its scratch (sp_attention_scratch_floats):
 * per (token, head), i = token's place in the tile x per + head, the sum
 * of exps and running max, scores[i * ATT_CHUNK ...] those of the chunk
 * from the first position the token sees in it; rows a converted block. */
struct att_task {
    int64_t t0, t1, seq, h0, kvh, first, last;
    double *sum;
    float *max, *scores, *rows;
};

/* Where token t sees chunk [c0, c0 + ATT_CHUNK) ([*ca, *cb]; false: nowhere) */
static bool att_chunk_range(const struct att_job *j, int64_t t, int64_t c0, int64_t *ca, int64_t *cb) {
    int64_t lo, hi;
    att_range(j->c, j->b, j->L, t, &lo, &hi);
    *ca = lo > c0 ? lo : c0;
    *cb = hi < c0 + ATT_CHUNK - 1 ? hi : c0 + ATT_CHUNK - 1;
    return *ca <= *cb;
}

/* One pass of a chunk's cached rows, converted a block at a time: the
 * scores (K, which = 0) or the weighted sums of values (V, which = 1) of
 * every token and head of the task. */
static void att_pass(const struct att_job *j, const struct att_task *k, int64_t c0, int which) {
    struct sp_ctx *c = j->c;
    int64_t hd = c->a->head_dim, qd = c->a->n_heads * hd, per = j->per;
    int64_t end = k->last < c0 + ATT_CHUNK - 1 ? k->last : c0 + ATT_CHUNK - 1;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t p0 = (k->first > c0 ? k->first : c0) / ATT_BLOCK * ATT_BLOCK; p0 <= end; p0 += ATT_BLOCK) {
        int64_t nb = end - p0 + 1 < ATT_BLOCK ? end - p0 + 1 : ATT_BLOCK;
        att_rows(c, j->L, which, k->seq, k->kvh, p0, nb, k->rows);
        for (int64_t t = k->t0; t < k->t1; t++) {
            int64_t ca, cb;
            if (!att_chunk_range(j, t, c0, &ca, &cb)) continue;
            int64_t pa = ca > p0 ? ca : p0, pb = cb < p0 + nb - 1 ? cb : p0 + nb - 1;
            if (pa > pb) continue;
            /* every query head of the task at once, head g's scores at s + g * ATT_CHUNK */
            float *s = k->scores + (t - k->t0) * per * ATT_CHUNK + (pa - ca);
            if (which == 0)
                sp_dot_cols(s, ATT_CHUNK, c->qkv + t * c->ld_qkv + k->h0 * hd, hd, per, k->rows + (pa - p0),
                            ATT_BLOCK, pb - pa + 1, hd, scale);
            else
                sp_axpy_rows(c->att + t * qd + k->h0 * hd, hd, s, ATT_CHUNK, per, k->rows + (pa - p0) * hd,
                             pb - pa + 1, hd);
        }
    }
}

/* The chunk of positions from c0 for every token and head of the task:
 * scores, their exps against the running max (the sums so far scaled by
 * exp(old max - new max) where it grew), then the values. */
static void att_chunk(const struct att_job *j, const struct att_task *k, int64_t c0) {
    int64_t hd = j->c->a->head_dim, qd = j->c->a->n_heads * hd, per = j->per;
    att_pass(j, k, c0, 0);
    for (int64_t t = k->t0; t < k->t1; t++) {
        int64_t ca, cb;
        if (!att_chunk_range(j, t, c0, &ca, &cb)) continue;
        for (int64_t g = 0; g < per; g++) {
            int64_t i = (t - k->t0) * per + g;
            float m = k->max[i];
            double sum = sp_kernels()->softmax_chunk(k->scores + i * ATT_CHUNK, cb - ca + 1, &m);
            if (m > k->max[i]) {
                float f = expf(k->max[i] - m);  // 0 for the first chunk (max -INFINITY)
                float *o = j->c->att + t * qd + (k->h0 + g) * hd;
                for (int64_t e = 0; e < hd; e++) o[e] *= f;
                k->sum[i] *= f;
                k->max[i] = m;
            }
            k->sum[i] += sum;
        }
    }
    att_pass(j, k, c0, 1);
}

/* One task (struct att_task): each head of each token over its visible
 * positions (with the head's sink logit, when the model has sinks, taking
 * its share of the sum of exps), a chunk at a time (att_chunk). */
static void attention_task(const struct att_job *j, int64_t task, float *scratch) {
    struct sp_ctx *c = j->c;
    const struct sp_arch *a = c->a;
    const struct layer *ly = &c->layers[j->L];
    int64_t hd = a->head_dim, qd = a->n_heads * hd, per = j->per, parts = a->n_heads / per;
    int64_t pairs = att_pairs(a);
    struct att_task k = {.t0 = j->tiles[task / parts], .t1 = j->tiles[task / parts + 1], .h0 = task % parts * per,
                         .first = INT64_MAX, .last = -1};
    k.seq = j->b->seq[k.t0];
    k.kvh = k.h0 / (a->n_heads / a->n_kv_heads);
    k.sum = (double *)(void *)scratch;
    k.max = scratch + 2 * pairs;
    k.scores = k.max + pairs;
    k.rows = k.scores + pairs * ATT_CHUNK;
    for (int64_t t = k.t0; t < k.t1; t++) {
        int64_t lo, hi;
        att_range(c, j->b, j->L, t, &lo, &hi);
        k.first = lo < k.first ? lo : k.first;
        k.last = hi > k.last ? hi : k.last;
        for (int64_t g = 0; g < per; g++) {
            k.sum[(t - k.t0) * per + g] = 0;
            k.max[(t - k.t0) * per + g] = -INFINITY;
            float *out = c->att + t * qd + (k.h0 + g) * hd;
            for (int64_t e = 0; e < hd; e++) out[e] = 0.0f;
        }
    }
    for (int64_t c0 = k.first / ATT_CHUNK * ATT_CHUNK; c0 <= k.last; c0 += ATT_CHUNK) att_chunk(j, &k, c0);
    for (int64_t t = k.t0; t < k.t1; t++)
        for (int64_t g = 0; g < per; g++) {
            int64_t i = (t - k.t0) * per + g;
            float sink = ly->sinks ? ly->sinks[k.h0 + g] : -INFINITY;
            double sum = k.sum[i] + (sink > -INFINITY ? exp((double)sink - k.max[i]) : 0.0);
            float inv = (float)(1.0 / sum), *out = c->att + t * qd + (k.h0 + g) * hd;
            for (int64_t e = 0; e < hd; e++) out[e] *= inv;
        }
}

/* Tasks go to whichever thread is free, the last first: later tiles see
 * more positions, and the small ones left for the end even out the
 * threads' shares. */
static void attention_job(void *arg, int tid, int nth) {
    struct att_job *j = arg;
    float *scratch = j->c->scores + (size_t)tid * sp_attention_scratch_floats(j->c->a);
    int64_t lo, hi, tasks = j->n_tiles * (j->c->a->n_heads / j->per);
    while (sp_pool_take(&j->next, tasks, 1, &lo, &hi)) attention_task(j, tasks - 1 - lo, scratch);
}

/* Attention for the batch: tiles of up to ATT_TILE consecutive tokens of
 * one sequence. */
static void attention(struct sp_ctx *c, const struct sp_batch *b, int64_t L) {
    int64_t n_tiles = 0;
    for (int64_t t = 0; t < b->n; t++)
        if (t == 0 || b->seq[t] != b->seq[t - 1] || t - c->att_tiles[n_tiles - 1] >= ATT_TILE) c->att_tiles[n_tiles++] = (int32_t)t;
    c->att_tiles[n_tiles] = (int32_t)b->n;
    struct att_job j = {c, b, L, c->att_tiles, n_tiles, att_heads_per_task(c->a, n_tiles, sp_pool_size(c->pool)), 0};
    sp_pool_run(c->pool, attention_job, &j);
}

/* Multiply-adds of a layer's attention for batch b: per token and query
 * head, head_dim for each visible position's score and again for its
 * value. */
static double attention_macs(const struct sp_ctx *c, const struct sp_batch *b, int64_t L) {
    double positions = 0;
    for (int64_t t = 0; t < b->n; t++) {
        int64_t lo, hi;
        att_range(c, b, L, t, &lo, &hi);
        positions += (double)(hi - lo + 1);
    }
    return 2.0 * positions * (double)c->a->n_heads * (double)c->a->head_dim;
}

/* ---- MLP ---- */

/* act(gate) * up into out, for n rows of width w (gate at ga, up at ub;
 * both with row stride lds, or interleaved pairs at ga when il). */
static void activate(const struct sp_arch *a, float *out, int64_t ldo, const float *ga, const float *ub, int64_t lds,
                     bool il, int64_t n, int64_t w) {
    struct sp_glu p = {1.0f, INFINITY, 0.0f};
    if (a->act == SP_ACT_SWIGLU_CLAMP) p = (struct sp_glu){(float)a->swiglu_alpha, (float)a->swiglu_limit, 1.0f};
    const struct sp_kernels *k = sp_kernels();
    for (int64_t t = 0; t < n; t++) k->glu(out + t * ldo, ga + t * lds, il ? NULL : ub + t * lds, w, &p);
}

/* ---- gated MLPs, several per pool hand-off ----
 *
 * One item is a gated MLP (a routed expert, the shared expert or a dense
 * MLP) applied to cnt rows of x; its intermediate rows go to rows
 * [row, row + cnt) of ff_a / ff_b and its outputs to the same rows of gout.
 * A batch of items runs in two hand-offs: every gate / up row of every item,
 * activated where computed, then every down row. The work is a line of
 * positions, rows x tokens of each item in turn, which the threads take in
 * pieces as they come free: decode-sized chunks of rows, or with more
 * tokens guided pieces that keep to whole items where they can (each piece
 * that starts inside an item rounds its tokens again). Positions do not
 * all cost the same (an item's tokens past its whole blocks of 8 go by the
 * slower product by groups), nor do the machine's cores always run at one
 * speed: split evenly, a thread with the dearer share kept the other
 * waiting for 19% of the experts' time (Zen 5 VM, 2 threads, a 512-token
 * prompt of 4-layer Qwen3-30B-A3B affine4); in pieces, prefill ran 1.06x
 * the tokens a second there, 1.05x on Ling-mini-2.0 affine4, 1.09x on
 * Qwen3 mxfp4 (medians of 3-5 paired runs). Each output is the same
 * product of the same rows as one item at a time would compute (struct
 * ffn_item, above). */
struct ffn_job {
    struct sp_ctx *c;
    const struct ffn_item *items;
    int64_t n_items;
    bool down;          // the second hand-off
    int64_t total;      // sum over items of units x tokens
    int64_t *ends;      // (n_items) where each item's positions end
    int64_t chunk;      // taken at a time (sp_linear_chunk); 0: sp_pool_take_guided
    atomic_llong next;  // the next position to take
};

/* Units of an item: intermediate columns (first hand-off) or output rows. */
static int64_t ffn_units(const struct ffn_job *j, const struct ffn_item *it) {
    return j->down ? j->c->a->d_model : it->down->w.cols;
}

/* Weight bytes an item's hand-off reads: its down projection (second), or
 * gate_up / gate and up (first). */
static double ffn_bytes(const struct ffn_job *j, const struct ffn_item *it) {
    if (j->down) return sp_linear_bytes(it->down);
    return it->gate_up ? sp_linear_bytes(it->gate_up) : sp_linear_bytes(it->gate) + sp_linear_bytes(it->up);
}

/* The first unit of an item (its units start at `start` of the weighted
 * line, each `wt` long) at or after position pos. */
static int64_t unit_at(int64_t pos, int64_t start, int64_t wt, int64_t units) {
    if (pos <= start) return 0;
    int64_t u = (pos - start + wt - 1) / wt;
    return u < units ? u : units;
}

/* Positions [a, b) of the weighted line. */
static void ffn_range(const struct ffn_job *j, int64_t a, int64_t b, void *scratch) {
    struct sp_ctx *c = j->c;
    int64_t d = c->a->d_model, ld = c->ld_ff, start = 0;
    for (int64_t i = 0; i < j->n_items && start < b; i++) {
        const struct ffn_item *it = &j->items[i];
        int64_t units = ffn_units(j, it);
        int64_t r0 = unit_at(a, start, it->cnt, units), r1 = unit_at(b, start, it->cnt, units);
        start += units * it->cnt;
        if (r0 >= r1) continue;
        float *fa = c->ff_a + it->row * ld, *fb = c->ff_b + it->row * ld;
        if (j->down) {
            sp_linear_rows(it->down, r0, r1, fb, ld, c->gout + it->row * d, d, it->cnt, scratch);
        } else if (it->gate_up) {
            sp_linear_rows(it->gate_up, 2 * r0, 2 * r1, it->x, it->ldx, fa, ld, it->cnt, scratch);
            activate(c->a, fb + r0, ld, fa + 2 * r0, NULL, ld, true, it->cnt, r1 - r0);
        } else {
            sp_linear_rows_pair(it->gate, it->up, r0, r1, it->x, it->ldx, fa, fb, ld, it->cnt, scratch);
            activate(c->a, fb + r0, ld, fa + r0, fb + r0, ld, false, it->cnt, r1 - r0);
        }
    }
}

static void ffn_job_run(void *arg, int tid, int nth) {
    struct ffn_job *j = arg;
    void *scratch = sp_pool_scratch(j->c->pool, tid);
    int64_t a, b;
    if (nth == 1) {
        ffn_range(j, 0, j->total, scratch);
        return;
    }
    while (j->chunk ? sp_pool_take(&j->next, j->total, j->chunk, &a, &b)
                    : sp_pool_take_guided(&j->next, j->ends, j->n_items, nth, &a, &b))
        ffn_range(j, a, b, scratch);
}

/* Multiply-adds of a batch of gated MLPs: gate, up and down of each. */
static double items_macs(const struct sp_ctx *c, const struct ffn_item *items, int64_t n) {
    double macs = 0;
    for (int64_t i = 0; i < n; i++) macs += 3.0 * (double)items[i].cnt * (double)items[i].down->w.cols * (double)c->a->d_model;
    return macs;
}

/* Runs items[0..n) (their rows within the batch buffers); outputs in gout. */
static void ffn_items(struct sp_ctx *c, const struct ffn_item *items, int64_t n) {
    int64_t most = 0;
    for (int64_t i = 0; i < n; i++) most = items[i].cnt > most ? items[i].cnt : most;
    /* threads when one of the three products is worth them */
    int nth = items_macs(c, items, n) / 3.0 < SP_LINEAR_SERIAL_MACS ? 1 : sp_pool_size(c->pool);
    for (int down = 0; down < 2; down++) {
        struct ffn_job j = {c, items, n, down, 0, c->item_ends, 0, 0};
        double bytes = 0;
        for (int64_t i = 0; i < n; i++) {
            j.total += ffn_units(&j, &items[i]) * items[i].cnt;
            j.ends[i] = j.total;
            bytes += ffn_bytes(&j, &items[i]);
        }
        j.chunk = sp_linear_chunk(j.total, bytes / (double)j.total, most, nth);
        sp_pool_run_n(c->pool, ffn_job_run, &j, nth);
    }
}

/* out (n, d) += down(act(gate h, up h)) for the layer's dense or shared MLP. */
static void layer_mlp_add(struct sp_ctx *c, const struct layer *ly, int64_t n, float *out) {
    struct ffn_item it = {&ly->gate, &ly->up, NULL, &ly->down, c->h, c->a->d_model, 0, n};
    STEP(c, SP_STEP_MLP, items_macs(c, &it, 1), ffn_items(c, &it, 1);
         for (int64_t i = 0; i < n * c->a->d_model; i++) out[i] += c->gout[i]);
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

/* Expert e of a layer as views into the mapped files. */
static struct sp_expert_views mapped_expert(const struct layer *ly, int64_t e) {
    struct sp_expert_views v = {.fused = ly->egate_up != NULL, .down = ly->edown[e]};
    if (v.fused)
        v.gate_up = ly->egate_up[e];
    else
        v.gate = ly->egate[e], v.up = ly->eup[e];
    return v;
}

/* Router choices of tokens t0..t1 from their router logits. */
static void route_tokens(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    int64_t E = c->a->n_experts, K = c->a->n_experts_used;
    for (int64_t t = t0; t < t1; t++) route(c->a, arg, c->router_out + t * E, c->sel + t * K, c->sel_w + t * K);
}

/* The (expert, token) pairs of one window of experts: pairs [p0, p0 + rows)
 * of etok / ew, row i of the batch buffers holding pair p0 + i. */
struct expert_window {
    int64_t p0, rows;
    float *out;
};

/* Rows of the window gathered from h. */
static void gather_rows(struct sp_ctx *c, const void *arg, int64_t r0, int64_t r1) {
    const struct expert_window *w = arg;
    int64_t d = c->a->d_model;
    for (int64_t r = r0; r < r1; r++)
        memcpy(c->gath + r * d, c->h + c->etok[w->p0 + r] * d, (size_t)d * sizeof(float));
}

/* out += weight x expert output for the window's pairs whose token is in
 * t0..t1: each token gets its experts in ascending order. */
static void scatter_tokens(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    const struct expert_window *w = arg;
    int64_t d = c->a->d_model;
    for (int64_t r = 0; r < w->rows; r++) {
        int64_t t = c->etok[w->p0 + r];
        if (t < t0 || t >= t1) continue;
        sp_axpy_f32(w->out + t * d, c->ew[w->p0 + r], c->gout + r * d, d);
    }
}

/* Routes n tokens of h and lists them by expert: expert e's pairs (token,
 * weight) at etok / ew [ecount[e], ecount[e + 1]), in token order. */
static void group_by_expert(struct sp_ctx *c, const struct layer *ly, int64_t n) {
    int64_t E = c->a->n_experts, K = c->a->n_experts_used, *off = c->ecount;
    for_tokens(c, n, route_tokens, ly);
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

/* Routed experts for n tokens of h, added into out (n, d). Tokens are
 * grouped by expert so each expert's weights are read once per batch; each
 * token sums its experts in ascending expert order whatever the batch holds. */
static bool moe(struct sp_ctx *c, const struct layer *ly, int64_t n, float *out) {
    const struct sp_arch *a = c->a;
    int64_t E = a->n_experts, d = a->d_model;
    STEP(c, SP_STEP_ROUTER, (double)n * (double)d * (double)E,
         sp_linear_apply(&ly->router, c->h, d, c->router_out, E, n, c->pool));
    int64_t *off = c->ecount;
    STEP(c, SP_STEP_ROUTE, 0, group_by_expert(c, ly, n));
    if (c->p.time_steps) {
        c->steps.routed += (double)off[E];
        for (int64_t i = 0; i < E; i++) c->steps.experts_run += off[i + 1] > off[i];
    }
    /* Windows of consecutive experts whose rows fit the batch buffers run
     * together; through the expert store one at a time (a window would pin
     * all its experts at once). The shared expert joins the last window
     * where it fits. Each token sums its experts in ascending order, then
     * the shared expert. */
    int64_t B = c->p.max_batch, per_window = c->experts ? 1 : E, e = 0;
    bool shared_left = ly->has_mlp;
    while (e < E || shared_left) {
        int64_t m = 0, rows = 0;
        struct expert_window win = {off[e], 0, out};
        for (; e < E && m < per_window; e++) {
            int64_t cnt = off[e + 1] - off[e];
            if (!cnt) continue;
            if (rows + cnt > B) break;
            struct sp_expert_views v = mapped_expert(ly, e), *use = &c->eviews[m];
            if (!c->experts)
                *use = v;
            else if (sp_expert_store_get(c->experts, &v, ly - c->layers, e, use) != SP_OK)
                return false;
            c->items[m] = (struct ffn_item){use->fused ? NULL : &use->gate, use->fused ? NULL : &use->up,
                                            use->fused ? &use->gate_up : NULL, &use->down, c->gath + rows * d, d, rows, cnt};
            c->item_expert[m++] = e;
            rows += cnt;
        }
        while (e < E && off[e + 1] == off[e]) e++;
        bool shared_now = shared_left && e == E && rows + n <= B;
        if (shared_now)
            c->items[m] = (struct ffn_item){&ly->gate, &ly->up, NULL, &ly->down, c->h, d, rows, n};
        if (m == 0 && !shared_now) break;
        win.rows = rows;
        STEP(c, SP_STEP_MOVE, 0, for_tokens(c, rows, gather_rows, &win));
        STEP(c, SP_STEP_EXPERTS, items_macs(c, c->items, m + shared_now), ffn_items(c, c->items, m + shared_now));
        if (c->experts)
            for (int64_t i = 0; i < m; i++) sp_expert_store_put(c->experts, ly - c->layers, c->item_expert[i]);
        STEP(c, SP_STEP_MOVE, 0, for_tokens(c, n, scatter_tokens, &win));
        if (shared_now) {
            struct row_add shared = {out, c->gout + rows * d};
            STEP(c, SP_STEP_MOVE, 0, for_tokens(c, n, add_rows, &shared));
            shared_left = false;
        }
    }
    if (shared_left) layer_mlp_add(c, ly, n, out);
    return true;
}

/* Predicts the experts the next MoE layer after L will use, by applying its
 * norm and router to the hidden state as it leaves layer L, and starts
 * reading the ones the cache lacks while that layer's attention runs. */
static void prefetch_next(struct sp_ctx *c, int64_t L, int64_t n) {
    const struct sp_arch *a = c->a;
    int64_t L2 = L + 1;
    while (L2 < a->n_layers && !a->layer_moe[L2]) L2++;
    if (L2 >= a->n_layers) return;
    const struct layer *ly = &c->layers[L2];
    int64_t E = a->n_experts, K = a->n_experts_used, d = a->d_model;
    for (int64_t t = 0; t < n; t++) sp_rmsnorm(c->h + t * d, c->x + t * d, ly->ffn_norm, d, (float)a->norm_eps);
    sp_linear_apply(&ly->router, c->h, d, c->router_out, E, n, c->pool);
    bool seen[1024] = {false};
    int64_t m = 0;
    for (int64_t t = 0; t < n; t++) {
        route(a, ly, c->router_out + t * E, c->sel + t * K, c->sel_w + t * K);
        for (int64_t j = 0; j < K; j++) {
            int32_t e = c->sel[t * K + j];
            if (seen[e]) continue;
            seen[e] = true;
            c->pf_views[m] = mapped_expert(ly, e);
            c->pf_experts[m++] = e;
        }
    }
    sp_expert_store_prefetch(c->experts, L2, c->pf_experts, c->pf_views, m);
}

/* ---- the forward pass ---- */

static enum sp_status check_batch(const struct sp_ctx *c, const struct sp_batch *b) {
    if (b->n <= 0 || b->n > c->p.max_batch)
        return sp_errorf(SP_ERR_ARG, "batch of %lld tokens (1 to %lld allowed)", (long long)b->n, (long long)c->p.max_batch);
    for (int64_t t = 0; t < b->n; t++) {
        if (b->tokens[t] < 0 || b->tokens[t] >= c->a->vocab)
            return sp_errorf(SP_ERR_ARG, "token %d is outside the vocabulary of %lld", b->tokens[t], (long long)c->a->vocab);
        if (b->seq[t] < 0 || b->seq[t] >= c->p.n_seq)
            return sp_errorf(SP_ERR_ARG, "sequence %d is outside 0..%d", b->seq[t], c->p.n_seq - 1);
        if (b->pos[t] < 0 || b->pos[t] >= c->p.n_ctx)
            return sp_errorf(SP_ERR_ARG, "position %d is outside the context of %lld", b->pos[t], (long long)c->p.n_ctx);
    }
    return SP_OK;
}

/* Tokens t0 .. t1 - 1 of the batch `arg`: their embedding rows into x, and
 * their RoPE angles. */
static void embed_rows(struct sp_ctx *c, const void *arg, int64_t t0, int64_t t1) {
    const struct sp_batch *b = arg;
    for (int64_t t = t0; t < t1; t++) {
        sp_qmat_dequant_row_ref(&c->embed.w, b->tokens[t], c->x + t * c->a->d_model);
        rope_angles(c, t, b->pos[t]);
    }
}

static void embed_tokens(struct sp_ctx *c, const struct sp_batch *b) { for_tokens(c, b->n, embed_rows, b); }

/* q, k and v of the n rows of h, side by side in qkv. */
static void qkv_products(struct sp_ctx *c, const struct layer *ly, int64_t n) {
    int64_t d = c->a->d_model, qd = c->a->n_heads * c->a->head_dim;
    if (c->a->fused_qkv) {
        sp_linear_apply(&ly->qkv, c->h, d, c->qkv, c->ld_qkv, n, c->pool);
        return;
    }
    sp_linear_apply(&ly->q, c->h, d, c->qkv, c->ld_qkv, n, c->pool);
    sp_linear_apply(&ly->k, c->h, d, c->qkv + qd, c->ld_qkv, n, c->pool);
    sp_linear_apply(&ly->v, c->h, d, c->qkv + qd + c->kv_row, c->ld_qkv, n, c->pool);
}

/* Logits of the tokens that want them (their count): the final norm, then
 * lm_head. */
static int64_t final_logits(struct sp_ctx *c, const struct sp_batch *b, float *logits) {
    int64_t d = c->a->d_model, m = 0;
    for (int64_t t = 0; t < b->n; t++) {
        if (b->want_logits && !b->want_logits[t]) continue;
        sp_rmsnorm(c->logit_rows + m * d, c->x + t * d, c->out_norm, d, (float)c->a->norm_eps);
        m++;
    }
    if (m) sp_linear_apply(&c->lm_head, c->logit_rows, d, logits, c->a->vocab, m, c->pool);
    return m;
}

enum sp_status sp_ctx_forward(struct sp_ctx *c, const struct sp_batch *b, float *logits) {
    enum sp_status st = check_batch(c, b);
    if (st != SP_OK) return st;
    const struct sp_arch *a = c->a;
    int64_t n = b->n, d = a->d_model, qd = a->n_heads * a->head_dim, kvd = c->kv_row;
    STEP(c, SP_STEP_EMBED, 0, embed_tokens(c, b));

    for (int64_t L = 0; L < a->n_layers; L++) {
        const struct layer *ly = &c->layers[L];
        struct layer_step step = {b, ly, L};
        STEP(c, SP_STEP_NORMS, 0, for_tokens(c, n, norm_tokens, ly->attn_norm));
        STEP(c, SP_STEP_QKV, (double)n * (double)d * (double)(qd + 2 * kvd), qkv_products(c, ly, n));
        STEP(c, SP_STEP_ATTENTION, attention_macs(c, b, L), for_tokens(c, n, qkv_tokens, &step); attention(c, b, L));
        STEP(c, SP_STEP_O, (double)n * (double)qd * (double)d, sp_linear_apply(&ly->o, c->att, qd, c->tmp, d, n, c->pool));
        struct row_add residual = {c->x, c->tmp};
        STEP(c, SP_STEP_NORMS, 0, for_tokens(c, n, add_rows, &residual); for_tokens(c, n, norm_tokens, ly->ffn_norm);
             memset(c->tmp, 0, (size_t)(n * d) * sizeof(float)));
        if (a->layer_moe[L]) {
            if (!moe(c, ly, n, c->tmp)) return sp_errorf(SP_ERR_IO, "layer %lld: %s", (long long)L, sp_error_msg());
        } else if (ly->has_mlp) {
            layer_mlp_add(c, ly, n, c->tmp);
        }
        STEP(c, SP_STEP_NORMS, 0, for_tokens(c, n, add_rows, &residual));
        if (c->pf_experts) STEP(c, SP_STEP_EMBED, 0, prefetch_next(c, L, n));
    }

    int64_t m = 0;  // set inside the step, before STEP adds its multiply-adds
    STEP(c, SP_STEP_LM_HEAD, (double)m * (double)d * (double)a->vocab, m = final_logits(c, b, logits));
    return SP_OK;
}
