/*
 * cpu.c - the CPU backend: each op of backend.h split over the thread pool.
 * Per-token steps split by token, products by rows, attention by tiles of
 * tokens x query heads, MLP batches in pieces of a line of rows x tokens.
 * No split changes a result: each token's outputs depend on that token
 * alone, computed in the same order whoever computes them.
 */
#include "backend/cpu/cpu.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cpu/linear.h"
#include "core/alloc.h"
#include "core/half.h"
#include "core/pool.h"

/* Cached rows converted to float at a time for all query heads of their KV
 * head (16 KiB at head_dim 128: they stay in L1 while every head uses
 * them). Keys are cached as such blocks of columns (the KV cache, below),
 * ATT_BLOCK floats per dimension once converted, so a score's 8 lanes are
 * 8 positions; the 8 floats past the block let dot_cols read a block's
 * columns from any offset rounded up to 8. */
#define ATT_BLOCK 32
#define ATT_ROWS_FLOATS(hd) (ATT_BLOCK * (hd) + 8)

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

/* An allocation the backend frees with itself. */
struct owned {
    void *p;
    bool huge;  // sp_malloc_huge (else sp_malloc)
};

struct cpu {
    struct sp_backend base;
    struct sp_backend_shape shape;
    struct sp_pool *pool;
    size_t scratch;  // per-thread scratch reserved in the pool
    /* KV cache (head-major, keys in blocks of columns: kv_head) */
    void *kv;
    size_t kv_bytes, kv_row_bytes;  // the cache and the states; one head's values of a position
    /* recurrent states (state_of): per Gated DeltaNet layer, a slot per
     * sequence and one per snapshot */
    float *states;
    int64_t state_floats;
    /* RoPE */
    float *inv_freq;  // (rot_dims / 2)
    float *rope_cs;   // (B, rot_dims): each batch token's cos, then sin, times rope_scale
    /* batch buffers, max_batch rows each */
    float *ff_a, *ff_b;   // (B, mlp_width)
    int64_t ld_ff;
    float *logit_rows;    // (B, d)
    float *scores;        // (threads, attention scratch floats)
    int32_t *att_tiles;   // (B + 1) attention tiles of the batch
    int64_t *item_ends;   // (E + 1) where the MLP items' positions end (struct mlp_job)
    struct owned *owned;
    int64_t n_owned, cap_owned;
};

static struct cpu *cpu_of(struct sp_backend *b) { return (struct cpu *)b; }

/* ---- sizes ---- */

/* The (token, head) pairs a task can hold: a tile x a KV head's query heads */
static int64_t att_pairs(const struct sp_backend_shape *s) { return ATT_TILE * (s->n_heads / s->n_kv_heads); }

/* A thread's attention scratch, in floats: per (token, head) of a task its
 * sum of exps (a double) and running max, then its scores over a chunk,
 * then a block of converted cached rows (attention_task lays them out);
 * whole cache lines. */
static size_t att_scratch_floats(const struct sp_backend_shape *s) {
    size_t floats = (size_t)att_pairs(s) * (2 + 1 + ATT_CHUNK) + (size_t)ATT_ROWS_FLOATS(s->head_dim);
    return (floats + 15) / 16 * 16;
}

/* Head-major: layer, K or V (which), sequence, KV head, then the head's
 * positions, so what one attention task reads (one KV head of one
 * sequence) lies together. Values are rows of head_dim; keys are stored as
 * the blocks attention reads: block b of a head holds positions 32b to
 * 32b + 31 as head_dim columns of ATT_BLOCK (element d of position p at
 * d * ATT_BLOCK + p % ATT_BLOCK), converted to float as they lie. A head
 * holds the context rounded up to whole blocks. */
static int64_t kv_positions(int64_t n_ctx) { return (n_ctx + ATT_BLOCK - 1) / ATT_BLOCK * ATT_BLOCK; }

size_t sp_cpu_kv_bytes(const struct sp_backend_params *p) {
    const struct sp_backend_shape *s = &p->shape;
    return (size_t)s->n_kv_layers * 2 * (size_t)p->n_seq * (size_t)s->n_kv_heads * (size_t)kv_positions(p->n_ctx) *
               (size_t)s->head_dim * sp_dtype_size(sp_kv_dtype(p->kv_type)) +
           sp_backend_states_bytes(p);
}

size_t sp_cpu_work_bytes(const struct sp_backend_params *p, const struct sp_qmat *widest) {
    const struct sp_backend_shape *s = &p->shape;
    int threads = p->n_threads > 0 ? p->n_threads : sp_physical_cores();
    size_t B = (size_t)p->max_batch, E = (size_t)(s->n_experts > 0 ? s->n_experts : 1);
    size_t floats = B * (size_t)(2 * s->mlp_width + s->d_model + (s->rot_dims > 0 ? s->rot_dims : 1)) +
                    (size_t)threads * att_scratch_floats(s);
    return floats * sizeof(float) + (B + 1) * sizeof(int32_t) + (E + 1) * sizeof(int64_t) +
           (size_t)threads * sp_kernels_scratch_bytes(widest);
}

/* ---- memory ---- */

static bool own(struct cpu *c, void *p, bool huge) {
    if (c->n_owned == c->cap_owned) {
        int64_t cap = c->cap_owned ? 2 * c->cap_owned : 64;
        struct owned *o = c->owned ? sp_realloc(c->owned, (size_t)cap * sizeof *o) : sp_malloc((size_t)cap * sizeof *o, SP_MEM_MODEL);
        if (!o) return false;
        c->owned = o;
        c->cap_owned = cap;
    }
    c->owned[c->n_owned++] = (struct owned){p, huge};
    return true;
}

/* A batch buffer, in 2 MiB pages where it spans one or more: a prefill walks
 * rows kilobytes apart (a token's q / k / v, a head's scores, an expert's
 * rows), touching many 4 KiB pages at a time; in 2 MiB pages a 512-token
 * prefill ran 1.11-1.20x faster (2 threads, Zen 5). */
static void *act_buf(struct cpu *c, size_t n, size_t size) {
    void *p = sp_malloc_huge(n * size + 64, SP_MEM_ACT);
    if (p && !own(c, p, true)) {
        sp_free_aligned(p);
        p = NULL;
    }
    return p;
}

static enum sp_status cpu_tensor(struct sp_backend *b, int64_t rows, int64_t cols, struct sp_tensor *out) {
    float *p = act_buf(cpu_of(b), (size_t)(rows * cols), sizeof(float));
    if (!p) return sp_errorf(SP_ERR_NOMEM, "out of memory for a %lld x %lld buffer", (long long)rows, (long long)cols);
    *out = (struct sp_tensor){p, rows, cols, cols};
    return SP_OK;
}

static enum sp_status cpu_vector(struct sp_backend *b, const struct sp_vector *v, const float **out) {
    float *f = sp_malloc((size_t)(v->n > 0 ? v->n : 1) * sizeof *f, SP_MEM_WEIGHTS);
    if (!f || !own(cpu_of(b), f, false)) {
        sp_free(f);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    sp_vector_to_f32(v, f);
    *out = f;
    return SP_OK;
}

/* Weights stay where the model put them (the loader lays out the matrices
 * the kernel set reads faster interleaved: sp_kernels_interleave); each
 * thread's scratch grows to what their products need. */
static enum sp_status cpu_prepare(struct sp_backend *b, struct sp_linear *l) {
    struct cpu *c = cpu_of(b);
    size_t need = sp_linear_scratch_bytes(l);
    if (need <= c->scratch) return SP_OK;
    enum sp_status st = sp_pool_reserve(c->pool, need);
    if (st == SP_OK) c->scratch = need;
    return st;
}

static float *cpu_host(struct sp_backend *b, struct sp_tensor t, float *staging) {
    if (t.ld == t.cols) return t.data;
    for (int64_t r = 0; r < t.rows; r++) memcpy(staging + r * t.cols, t.data + r * t.ld, (size_t)t.cols * sizeof(float));
    return staging;
}

static void cpu_write(struct sp_backend *b, struct sp_tensor t, const float *src) {
    for (int64_t r = 0; r < t.rows; r++) memcpy(t.data + r * t.ld, src + r * t.cols, (size_t)t.cols * sizeof(float));
}

static void cpu_sync(struct sp_backend *b) {}

static bool cpu_supports(const struct sp_backend *b, enum sp_op op, enum sp_qtype fmt) {
    return (unsigned)op < SP_OP_COUNT && (unsigned)fmt < SP_QTYPE_COUNT;
}

/* ---- KV cache ---- */

/* Position 0 of one KV head of one sequence in layer L. */
static uint8_t *kv_head(const struct cpu *c, int64_t L, int which, int64_t seq, int64_t kvh) {
    size_t idx = (((size_t)L * 2 + (size_t)which) * (size_t)c->base.p.n_seq + (size_t)seq) * (size_t)c->shape.n_kv_heads;
    return (uint8_t *)c->kv + (idx + (size_t)kvh) * (size_t)kv_positions(c->base.p.n_ctx) * c->kv_row_bytes;
}

/* The values of position pos, or the block of keys that holds it. */
static void *kv_values(const struct cpu *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos) {
    return kv_head(c, L, 1, seq, kvh) + (size_t)pos * c->kv_row_bytes;
}
static void *kv_key_block(const struct cpu *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos) {
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
static void kv_store(const struct cpu *c, int64_t L, int64_t seq, int64_t kvh, int64_t pos, const float *k,
                     const float *v) {
    enum sp_dtype dt = sp_kv_dtype(c->base.p.kv_type);
    size_t col = (size_t)(pos % ATT_BLOCK) * sp_dtype_size(dt);
    kv_put(dt, (uint8_t *)kv_key_block(c, L, seq, kvh, pos) + col, ATT_BLOCK, k, c->shape.head_dim);
    kv_put(dt, kv_values(c, L, seq, kvh, pos), 1, v, c->shape.head_dim);
}

static size_t cpu_kv_bytes(const struct sp_backend *b) { return ((const struct cpu *)b)->kv_bytes; }

static void cpu_kv_copy_seq(struct sp_backend *b, int src, int dst, int64_t n) {
    struct cpu *c = cpu_of(b);
    if (src == dst || n <= 0) return;
    for (int64_t L = 0; L < c->shape.n_kv_layers; L++)
        for (int w = 0; w < 2; w++)
            for (int64_t h = 0; h < c->shape.n_kv_heads; h++)  // keys: whole blocks
                memcpy(kv_head(c, L, w, dst, h), kv_head(c, L, w, src, h),
                       (size_t)(w ? n : kv_positions(n)) * c->kv_row_bytes);
}

/* The recurrent state of Gated DeltaNet layer L in slot `slot`. */
static float *state_of(const struct cpu *c, int64_t L, int64_t slot) {
    return c->states + ((size_t)L * 2 * (size_t)c->base.p.n_seq + (size_t)slot) * (size_t)c->state_floats;
}

static void cpu_state_copy(struct sp_backend *b, int src, int dst) {
    struct cpu *c = cpu_of(b);
    if (src == dst) return;
    for (int64_t L = 0; L < c->shape.n_state_layers; L++)
        memcpy(state_of(c, L, dst), state_of(c, L, src), (size_t)c->state_floats * sizeof(float));
}

/* ---- per-token steps, split over the pool's threads ----
 *
 * Each token's result depends on that token alone, so splitting changes no
 * bit. Below TOKENS_PER_THREAD tokens per thread the caller works alone
 * (decode: waking a worker would cost more than the work). */
#define TOKENS_PER_THREAD 4

typedef void (*token_fn)(struct cpu *c, const void *arg, int64_t t0, int64_t t1);

struct token_job {
    struct cpu *c;
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
static void for_tokens(struct cpu *c, int64_t n, token_fn fn, const void *arg) {
    int nth = sp_pool_size(c->pool);
    struct token_job j = {c, fn, arg, n};
    sp_pool_run_n(c->pool, token_job_run, &j, n >= (int64_t)nth * TOKENS_PER_THREAD ? nth : 1);
}

/* ---- RoPE ---- */

/* The cos and sin of batch token t's position (rope_cs), once per forward
 * pass: every head of every layer rotates by the same angles. */
static void rope_angles(const struct cpu *c, int64_t t, int64_t pos) {
    int64_t half = c->shape.rot_dims / 2;
    float *cs = c->rope_cs + t * 2 * half;
    for (int64_t i = 0; i < half; i++) {
        float ang = (float)pos * c->inv_freq[i];
        cs[i] = (float)cos((double)ang) * c->shape.rope_scale;
        cs[half + i] = (float)sin((double)ang) * c->shape.rope_scale;
    }
}

/* Rotates the first rot_dims of one head of batch token t (halves paired,
 * as rotate_half). */
static void rope_apply(const struct cpu *c, float *v, int64_t t) {
    int64_t half = c->shape.rot_dims / 2;
    const float *cs = c->rope_cs + t * 2 * half, *sn = cs + half;
    for (int64_t i = 0; i < half; i++) {
        float x1 = v[i], x2 = v[i + half];
        v[i] = x1 * cs[i] - x2 * sn[i];
        v[i + half] = x2 * cs[i] + x1 * sn[i];
    }
}

/* ---- embedding, norms, adds, products ---- */

struct embed_args {
    const struct sp_linear *e;
    const struct sp_batch *bt;
    struct sp_tensor x;
};

static void embed_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct embed_args *a = arg;
    for (int64_t t = t0; t < t1; t++) {
        sp_qmat_dequant_row_ref(&a->e->w, a->bt->tokens[t], a->x.data + t * a->x.ld);
        rope_angles(c, t, a->bt->pos[t]);
    }
}

static void cpu_embed(struct sp_backend *b, const struct sp_linear *e, const struct sp_batch *bt, struct sp_tensor x) {
    struct embed_args a = {e, bt, x};
    for_tokens(cpu_of(b), bt->n, embed_rows, &a);
}

struct norm_args {
    const float *w;
    float eps;
    struct sp_tensor x, out;
};

static void norm_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct norm_args *a = arg;
    for (int64_t t = t0; t < t1; t++)
        sp_rmsnorm(a->out.data + t * a->out.ld, a->x.data + t * a->x.ld, a->w, a->x.cols, a->eps);
}

static void cpu_rmsnorm(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor out) {
    struct norm_args a = {w, eps, x, out};
    for_tokens(cpu_of(b), x.rows, norm_rows, &a);
}

struct add_args {
    struct sp_tensor dst, src;
};

static void add_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct add_args *a = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *d = a->dst.data + t * a->dst.ld;
        const float *s = a->src.data + t * a->src.ld;
        for (int64_t i = 0; i < a->dst.cols; i++) d[i] += s[i];
    }
}

static void cpu_add(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src) {
    struct add_args a = {dst, src};
    for_tokens(cpu_of(b), dst.rows, add_rows, &a);
}

struct add_norm_args {
    const float *w;
    float eps;
    struct sp_tensor x, r, out;
    bool zero_r;
};

/* A row at a time while it is in cache: the add, the norm, then r cleared. */
static void add_norm_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct add_norm_args *a = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *x = a->x.data + t * a->x.ld, *r = a->r.data + t * a->r.ld;
        for (int64_t i = 0; i < a->x.cols; i++) x[i] += r[i];
        sp_rmsnorm(a->out.data + t * a->out.ld, x, a->w, a->x.cols, a->eps);
        if (a->zero_r) memset(r, 0, (size_t)a->x.cols * sizeof *r);
    }
}

static void cpu_add_rmsnorm(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor r,
                            bool zero_r, struct sp_tensor out) {
    struct add_norm_args a = {w, eps, x, r, out, zero_r};
    for_tokens(cpu_of(b), x.rows, add_norm_rows, &a);
}

static void cpu_zero(struct sp_backend *b, struct sp_tensor t) {
    if (t.ld == t.cols) {
        memset(t.data, 0, (size_t)(t.rows * t.cols) * sizeof(float));
        return;
    }
    for (int64_t r = 0; r < t.rows; r++) memset(t.data + r * t.ld, 0, (size_t)t.cols * sizeof(float));
}

static void cpu_linear(struct sp_backend *b, const struct sp_linear *l, struct sp_tensor x, struct sp_tensor y) {
    sp_linear_apply(l, x.data, x.ld, y.data, y.ld, x.rows, cpu_of(b)->pool);
}

struct move_args {
    struct sp_tensor dst, src;
    const int32_t *rows;
    const float *w;
};

static void gather_rows(struct cpu *c, const void *arg, int64_t r0, int64_t r1) {
    const struct move_args *a = arg;
    for (int64_t r = r0; r < r1; r++)
        memcpy(a->dst.data + r * a->dst.ld, a->src.data + a->rows[r] * a->src.ld, (size_t)a->dst.cols * sizeof(float));
}

static void cpu_gather(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src, const int32_t *rows) {
    struct move_args a = {dst, src, rows, NULL};
    for_tokens(cpu_of(b), dst.rows, gather_rows, &a);
}

/* The additions into rows t0 .. t1 of dst, in order of the sources. */
static void scatter_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct move_args *a = arg;
    for (int64_t r = 0; r < a->src.rows; r++) {
        int64_t t = a->rows[r];
        if (t < t0 || t >= t1) continue;
        sp_axpy_f32(a->dst.data + t * a->dst.ld, a->w[r], a->src.data + r * a->src.ld, a->dst.cols);
    }
}

static void cpu_scatter_add(struct sp_backend *b, struct sp_tensor out, struct sp_tensor src, const int32_t *rows,
                            const float *w) {
    struct move_args a = {out, src, rows, w};
    for_tokens(cpu_of(b), out.rows, scatter_rows, &a);
}

static int64_t cpu_logits(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                          struct sp_tensor x, const bool *want, float *logits) {
    struct cpu *c = cpu_of(b);
    int64_t d = x.cols, m = 0;
    for (int64_t t = 0; t < x.rows; t++) {
        if (want && !want[t]) continue;
        sp_rmsnorm(c->logit_rows + m * d, x.data + t * x.ld, norm, d, eps);
        m++;
    }
    if (m) sp_linear_apply(head, c->logit_rows, d, logits, head->w.rows, m, c->pool);
    return m;
}

/* ---- attention ---- */

struct att_job {
    struct cpu *c;
    const struct sp_attn_layer *ly;
    const struct sp_batch *bt;
    struct sp_tensor qkv, att;
    const int32_t *tiles;  // (n_tiles + 1) first batch token of each tile
    int64_t n_tiles, per;  // query heads per task
    atomic_llong next;     // the next task to take
};

/* After the QKV product: per-head q / k norms, RoPE, and the token's K and
 * V rows into the cache. */
static void qkv_tokens(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct att_job *j = arg;
    const struct sp_backend_shape *s = &c->shape;
    int64_t hd = s->head_dim, qd = s->n_heads * hd, kvd = s->n_kv_heads * hd;
    for (int64_t t = t0; t < t1; t++) {
        float *row = j->qkv.data + t * j->qkv.ld;
        for (int64_t h = 0; h < s->n_heads + s->n_kv_heads; h++) {
            float *v = row + h * hd;
            bool is_q = h < s->n_heads;
            if (j->ly->q_norm) sp_rmsnorm(v, v, is_q ? j->ly->q_norm : j->ly->k_norm, hd, j->ly->eps);
            rope_apply(c, v, t);
        }
        for (int64_t h = 0; h < s->n_kv_heads; h++)
            kv_store(c, j->ly->layer, j->bt->seq[t], h, j->bt->pos[t], row + qd + h * hd, row + qd + kvd + h * hd);
    }
}

/* Query heads of one KV head taken per attention task: all of them (each
 * cached row converted once for the group) unless that leaves fewer than
 * two tasks per thread. */
static int64_t att_heads_per_task(const struct sp_backend_shape *s, int64_t n_tiles, int nth) {
    int64_t per = s->n_heads / s->n_kv_heads;
    while (per % 2 == 0 && n_tiles * (s->n_heads / per) < 2 * nth) per /= 2;
    return per;
}

/* Visible cached positions [*lo, *hi] of batch token t. */
static void att_range(const struct att_job *j, int64_t t, int64_t *lo, int64_t *hi) {
    int64_t pos = j->bt->pos[t], w = j->ly->window;
    *lo = w > 0 && pos - w + 1 > 0 ? pos - w + 1 : 0;
    *hi = pos;
}

/* Cached positions p0 .. p0 + nb - 1 (p0 a multiple of ATT_BLOCK) of one
 * KV head as floats: values (which 1) as rows of head_dim, keys (which 0)
 * as their whole block of columns. */
static void att_rows(const struct cpu *c, int64_t L, int which, int64_t seq, int64_t kvh, int64_t p0, int64_t nb,
                     float *rows) {
    enum sp_dtype dt = sp_kv_dtype(c->base.p.kv_type);
    if (which == 1)
        sp_f32_from_dt(rows, kv_values(c, L, seq, kvh, p0), dt, nb * c->shape.head_dim);
    else
        sp_f32_from_dt(rows, kv_key_block(c, L, seq, kvh, p0), dt, ATT_BLOCK * c->shape.head_dim);
}

/* One attention task: tokens [t0, t1) of sequence seq (a tile) x query
 * heads [h0, h0 + per) of KV head kvh; cached positions first..last cover
 * what each of the tokens sees. Its scratch (att_scratch_floats): per
 * (token, head), i = token's place in the tile x per + head, the sum of
 * exps and running max, scores[i * ATT_CHUNK ...] those of the chunk from
 * the first position the token sees in it; rows a converted block. */
struct att_task {
    int64_t t0, t1, seq, h0, kvh, first, last;
    double *sum;
    float *max, *scores, *rows;
};

/* Where token t sees chunk [c0, c0 + ATT_CHUNK) ([*ca, *cb]; false: nowhere) */
static bool att_chunk_range(const struct att_job *j, int64_t t, int64_t c0, int64_t *ca, int64_t *cb) {
    int64_t lo, hi;
    att_range(j, t, &lo, &hi);
    *ca = lo > c0 ? lo : c0;
    *cb = hi < c0 + ATT_CHUNK - 1 ? hi : c0 + ATT_CHUNK - 1;
    return *ca <= *cb;
}

/* One pass of a chunk's cached rows, converted a block at a time: the
 * scores (K, which = 0) or the weighted sums of values (V, which = 1) of
 * every token and head of the task. */
static void att_pass(const struct att_job *j, const struct att_task *k, int64_t c0, int which) {
    struct cpu *c = j->c;
    int64_t hd = c->shape.head_dim, per = j->per;
    int64_t end = k->last < c0 + ATT_CHUNK - 1 ? k->last : c0 + ATT_CHUNK - 1;
    float scale = 1.0f / sqrtf((float)hd);
    for (int64_t p0 = (k->first > c0 ? k->first : c0) / ATT_BLOCK * ATT_BLOCK; p0 <= end; p0 += ATT_BLOCK) {
        int64_t nb = end - p0 + 1 < ATT_BLOCK ? end - p0 + 1 : ATT_BLOCK;
        att_rows(c, j->ly->layer, which, k->seq, k->kvh, p0, nb, k->rows);
        for (int64_t t = k->t0; t < k->t1; t++) {
            int64_t ca, cb;
            if (!att_chunk_range(j, t, c0, &ca, &cb)) continue;
            int64_t pa = ca > p0 ? ca : p0, pb = cb < p0 + nb - 1 ? cb : p0 + nb - 1;
            if (pa > pb) continue;
            /* every query head of the task at once, head g's scores at s + g * ATT_CHUNK */
            float *s = k->scores + (t - k->t0) * per * ATT_CHUNK + (pa - ca);
            if (which == 0)
                sp_dot_cols(s, ATT_CHUNK, j->qkv.data + t * j->qkv.ld + k->h0 * hd, hd, per, k->rows + (pa - p0),
                            ATT_BLOCK, pb - pa + 1, hd, scale);
            else
                sp_axpy_rows(j->att.data + t * j->att.ld + k->h0 * hd, hd, s, ATT_CHUNK, per,
                             k->rows + (pa - p0) * hd, pb - pa + 1, hd);
        }
    }
}

/* The chunk of positions from c0 for every token and head of the task:
 * scores, their exps against the running max (the sums so far scaled by
 * exp(old max - new max) where it grew), then the values. */
static void att_chunk(const struct att_job *j, const struct att_task *k, int64_t c0) {
    int64_t hd = j->c->shape.head_dim, per = j->per;
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
                float *o = j->att.data + t * j->att.ld + (k->h0 + g) * hd;
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
 * positions (with the head's sink logit, when the layer has sinks, taking
 * its share of the sum of exps), a chunk at a time (att_chunk). */
static void attention_task(const struct att_job *j, int64_t task, float *scratch) {
    const struct sp_backend_shape *s = &j->c->shape;
    int64_t hd = s->head_dim, per = j->per, parts = s->n_heads / per;
    int64_t pairs = att_pairs(s);
    struct att_task k = {.t0 = j->tiles[task / parts], .t1 = j->tiles[task / parts + 1], .h0 = task % parts * per,
                         .first = INT64_MAX, .last = -1};
    k.seq = j->bt->seq[k.t0];
    k.kvh = k.h0 / (s->n_heads / s->n_kv_heads);
    k.sum = (double *)(void *)scratch;
    k.max = scratch + 2 * pairs;
    k.scores = k.max + pairs;
    k.rows = k.scores + pairs * ATT_CHUNK;
    for (int64_t t = k.t0; t < k.t1; t++) {
        int64_t lo, hi;
        att_range(j, t, &lo, &hi);
        k.first = lo < k.first ? lo : k.first;
        k.last = hi > k.last ? hi : k.last;
        for (int64_t g = 0; g < per; g++) {
            k.sum[(t - k.t0) * per + g] = 0;
            k.max[(t - k.t0) * per + g] = -INFINITY;
            float *out = j->att.data + t * j->att.ld + (k.h0 + g) * hd;
            for (int64_t e = 0; e < hd; e++) out[e] = 0.0f;
        }
    }
    for (int64_t c0 = k.first / ATT_CHUNK * ATT_CHUNK; c0 <= k.last; c0 += ATT_CHUNK) att_chunk(j, &k, c0);
    for (int64_t t = k.t0; t < k.t1; t++)
        for (int64_t g = 0; g < per; g++) {
            int64_t i = (t - k.t0) * per + g;
            float sink = j->ly->sinks ? j->ly->sinks[k.h0 + g] : -INFINITY;
            double sum = k.sum[i] + (sink > -INFINITY ? exp((double)sink - k.max[i]) : 0.0);
            float inv = (float)(1.0 / sum), *out = j->att.data + t * j->att.ld + (k.h0 + g) * hd;
            for (int64_t e = 0; e < hd; e++) out[e] *= inv;
        }
}

/* Tasks go to whichever thread is free, the last first: later tiles see
 * more positions, and the small ones left for the end even out the
 * threads' shares. */
static void attention_job(void *arg, int tid, int nth) {
    struct att_job *j = arg;
    float *scratch = j->c->scores + (size_t)tid * att_scratch_floats(&j->c->shape);
    int64_t lo, hi, tasks = j->n_tiles * (j->c->shape.n_heads / j->per);
    while (sp_pool_take(&j->next, tasks, 1, &lo, &hi)) attention_task(j, tasks - 1 - lo, scratch);
}

/* The prologue by token, then attention in tiles of up to ATT_TILE
 * consecutive tokens of one sequence. */
static void cpu_attention(struct sp_backend *b, const struct sp_attn_layer *ly, const struct sp_batch *bt,
                          struct sp_tensor qkv, struct sp_tensor att) {
    struct cpu *c = cpu_of(b);
    struct att_job j = {c, ly, bt, qkv, att, c->att_tiles, 0, 0, 0};
    for_tokens(c, bt->n, qkv_tokens, &j);
    int64_t n_tiles = 0;
    for (int64_t t = 0; t < bt->n; t++)
        if (t == 0 || bt->seq[t] != bt->seq[t - 1] || t - c->att_tiles[n_tiles - 1] >= ATT_TILE)
            c->att_tiles[n_tiles++] = (int32_t)t;
    c->att_tiles[n_tiles] = (int32_t)bt->n;
    j.n_tiles = n_tiles;
    j.per = att_heads_per_task(&c->shape, n_tiles, sp_pool_size(c->pool));
    sp_pool_run(c->pool, attention_job, &j);
}

/* ---- gates and Gated DeltaNet ---- */

struct gate_args {
    struct sp_tensor x, g;
};

static void gate_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct gate_args *a = arg;
    for (int64_t t = t0; t < t1; t++) {
        float *x = a->x.data + t * a->x.ld;
        const float *g = a->g.data + t * a->g.ld;
        for (int64_t i = 0; i < a->x.cols; i++) x[i] *= 1.0f / (1.0f + expf(-g[a->g.cols == 1 ? 0 : i]));
    }
}

static void cpu_gate(struct sp_backend *b, struct sp_tensor x, struct sp_tensor g) {
    struct gate_args a = {x, g};
    for_tokens(cpu_of(b), x.rows, gate_rows, &a);
}

struct delta_job {
    struct cpu *c;
    const struct sp_delta_layer *ly;
    const struct sp_batch *bt;
    struct sp_tensor qkv, z, ba, out;
};

static float silu(float x) { return x / (1.0f + expf(-x)); }

/* The causal conv and SiLU of channels [c0, c1) for every token in batch
 * order, in place in qkv, each sequence's last inputs kept in its state. */
static void delta_conv(const struct delta_job *j, int64_t c0, int64_t c1) {
    const struct sp_backend_shape *s = &j->c->shape;
    int64_t C = 2 * s->lin_k_heads * s->lin_k_dim + s->lin_v_heads * s->lin_v_dim, K = s->lin_conv;
    for (int64_t t = 0; t < j->bt->n; t++) {
        float *st = state_of(j->c, j->ly->layer, j->bt->seq[t]), *x = j->qkv.data + t * j->qkv.ld;
        bool fresh = j->bt->pos[t] == 0;
        for (int64_t ch = c0; ch < c1; ch++) {
            const float *w = j->ly->conv + ch * K;
            float in = x[ch], acc = w[K - 1] * in;
            for (int64_t i = 0; i < K - 1; i++) {
                float prev = fresh ? 0.0f : st[i * C + ch];
                acc += w[i] * prev;
                st[i * C + ch] = i + 1 < K - 1 ? (fresh ? 0.0f : st[(i + 1) * C + ch]) : in;
            }
            x[ch] = silu(acc);
        }
        if (j->bt->snapshot && j->bt->snapshot[t]) {
            float *snap = state_of(j->c, j->ly->layer, j->c->base.p.n_seq + j->bt->seq[t]);
            for (int64_t i = 0; i < K - 1; i++)
                memcpy(snap + i * C + c0, st + i * C + c0, (size_t)(c1 - c0) * sizeof *st);
        }
    }
}

/* x[i] *= a for n floats, in runs of 16 the compiler vectorizes. */
static void scale_floats(float *x, float a, int64_t n) {
    int64_t i = 0;
    for (; i + 16 <= n; i += 16)
        for (int j = 0; j < 16; j++) x[i + j] *= a;
    for (; i < n; i++) x[i] *= a;
}

/* x * rsqrt(sum x^2 + 1e-6), as the reference's l2norm. */
static void l2norm(const float *x, float *out, int64_t n, float scale) {
    float ss = 0;
    for (int64_t i = 0; i < n; i++) ss += x[i] * x[i];
    float r = scale / sqrtf(ss + 1e-6f);
    for (int64_t i = 0; i < n; i++) out[i] = x[i] * r;
}

/* The delta rule of value heads [h0, h1) for every token in batch order,
 * then each head's gated norm into out. */
#define DELTA_MAX_DIM 512
static void delta_heads(const struct delta_job *j, int64_t h0, int64_t h1) {
    const struct sp_backend_shape *s = &j->c->shape;
    int64_t Hk = s->lin_k_heads, Hv = s->lin_v_heads, Dk = s->lin_k_dim, Dv = s->lin_v_dim;
    int64_t C = 2 * Hk * Dk + Hv * Dv, conv_floats = (s->lin_conv - 1) * C;
    float kq2[2 * DELTA_MAX_DIM], ko[2 * DELTA_MAX_DIM];  // k then q; S^T k then S^T q
    float *k = kq2, *q = kq2 + Dk, *kv = ko, *o = ko + Dv;
    float qscale = 1.0f / sqrtf((float)Dk);
    const struct sp_kernels *kern = sp_kernels();
    for (int64_t t = 0; t < j->bt->n; t++) {
        const float *x = j->qkv.data + t * j->qkv.ld, *ba = j->ba.data + t * j->ba.ld;
        const float *z = j->z.data + t * j->z.ld;
        float *out = j->out.data + t * j->out.ld;
        for (int64_t h = h0; h < h1; h++) {
            int64_t kh = h / (Hv / Hk);
            float *S = state_of(j->c, j->ly->layer, j->bt->seq[t]) + conv_floats + h * Dk * Dv;
            if (j->bt->pos[t] == 0) memset(S, 0, (size_t)(Dk * Dv) * sizeof *S);
            l2norm(x + kh * Dk, q, Dk, qscale);
            l2norm(x + Hk * Dk + kh * Dk, k, Dk, 1.0f);
            const float *v = x + 2 * Hk * Dk + h * Dv;
            float beta = 1.0f / (1.0f + expf(-ba[h]));
            float a = ba[Hv + h] + j->ly->dt_bias[h];
            float softplus = a > 20.0f ? a : log1pf(expf(a));
            float decay = expf(-expf(j->ly->a_log[h]) * softplus);
            /* with S the old state: u = beta (v - decay S^T k), the new
             * state decay S + k u^T, and o its S^T q = decay S^T q + u (k.q),
             * so S is read twice and written once */
            for (int64_t c = 0; c < 2 * Dv; c++) ko[c] = 0;
            kern->axpy_rows(ko, Dv, kq2, Dk, 2, S, Dk, Dv);  // S^T k and S^T q in one pass over S
            float kq = kern->dot(k, q, Dk);
            for (int64_t c = 0; c < Dv; c++) {
                kv[c] = (v[c] - decay * kv[c]) * beta;  // the update u
                o[c] = decay * o[c] + kv[c] * kq;
            }
            scale_floats(S, decay, Dk * Dv);
            kern->axpy_rows(S, Dv, k, 1, Dk, kv, 1, Dv);  // + k u^T
            sp_rmsnorm(out + h * Dv, o, j->ly->norm, Dv, j->ly->eps);
            for (int64_t c = 0; c < Dv; c++) out[h * Dv + c] *= silu(z[h * Dv + c]);
            if (j->bt->snapshot && j->bt->snapshot[t])
                memcpy(state_of(j->c, j->ly->layer, j->c->base.p.n_seq + j->bt->seq[t]) + conv_floats + h * Dk * Dv, S,
                       (size_t)(Dk * Dv) * sizeof *S);
        }
    }
}

static void delta_conv_job(void *arg, int tid, int nth) {
    const struct delta_job *j = arg;
    const struct sp_backend_shape *s = &j->c->shape;
    int64_t lo, hi;
    sp_pool_split(2 * s->lin_k_heads * s->lin_k_dim + s->lin_v_heads * s->lin_v_dim, tid, nth, &lo, &hi);
    if (lo < hi) delta_conv(j, lo, hi);
}

static void delta_heads_job(void *arg, int tid, int nth) {
    const struct delta_job *j = arg;
    int64_t lo, hi;
    sp_pool_split(j->c->shape.lin_v_heads, tid, nth, &lo, &hi);
    if (lo < hi) delta_heads(j, lo, hi);
}

/* The conv split by channels, the delta rule by value heads: each
 * channel's and head's tokens go in batch order on one thread, so no split
 * changes a result. */
static void cpu_gated_delta(struct sp_backend *b, const struct sp_delta_layer *ly, const struct sp_batch *bt,
                            struct sp_tensor qkv, struct sp_tensor z, struct sp_tensor ba, struct sp_tensor out) {
    struct cpu *c = cpu_of(b);
    struct delta_job j = {c, ly, bt, qkv, z, ba, out};
    int nth = sp_pool_size(c->pool);
    sp_pool_run_n(c->pool, delta_conv_job, &j, bt->n >= TOKENS_PER_THREAD ? nth : 1);
    sp_pool_run_n(c->pool, delta_heads_job, &j, nth);
}

/* ---- Lightning attention ---- */

struct light_job {
    struct cpu *c;
    const struct sp_lightning_layer *ly;
    const struct sp_batch *bt;
    struct sp_tensor qkv, out;
};

/* Heads [h0, h1) for every token in batch order: S = decay S + k^T v, o = q S. */
static void light_heads(const struct light_job *j, int64_t h0, int64_t h1) {
    const struct sp_lightning_layer *ly = j->ly;
    int64_t H = j->c->shape.lin_v_heads, D = j->c->shape.lin_v_dim;
    const struct sp_kernels *kern = sp_kernels();
    float q[DELTA_MAX_DIM], k[DELTA_MAX_DIM];
    float scale = 1.0f / sqrtf((float)D);
    for (int64_t t = 0; t < j->bt->n; t++) {
        const float *x = j->qkv.data + t * j->qkv.ld;
        float *out = j->out.data + t * j->out.ld;
        for (int64_t h = h0; h < h1; h++) {
            float *S = state_of(j->c, ly->layer, j->bt->seq[t]) + h * D * D;
            if (j->bt->pos[t] == 0) memset(S, 0, (size_t)(D * D) * sizeof *S);
            if (ly->q_norm) {
                sp_rmsnorm(q, x + h * D, ly->q_norm, D, ly->eps);
                sp_rmsnorm(k, x + (H + h) * D, ly->k_norm, D, ly->eps);
            } else {
                memcpy(q, x + h * D, (size_t)D * sizeof *q);
                memcpy(k, x + (H + h) * D, (size_t)D * sizeof *k);
            }
            rope_apply(j->c, q, t);
            rope_apply(j->c, k, t);
            const float *v = x + (2 * H + h) * D;
            float *o = out + h * D;
            for (int64_t c = 0; c < D; c++) o[c] = 0, q[c] *= scale;
            scale_floats(S, ly->decay[h], D * D);
            kern->axpy_rows(S, D, k, 1, D, v, 1, D);  // + k^T v
            kern->axpy_rows(o, D, q, D, 1, S, D, D);  // q S
            if (j->bt->snapshot && j->bt->snapshot[t])
                memcpy(state_of(j->c, ly->layer, j->c->base.p.n_seq + j->bt->seq[t]) + h * D * D, S,
                       (size_t)(D * D) * sizeof *S);
        }
    }
}

static void light_heads_job(void *arg, int tid, int nth) {
    const struct light_job *j = arg;
    int64_t lo, hi;
    sp_pool_split(j->c->shape.lin_v_heads, tid, nth, &lo, &hi);
    if (lo < hi) light_heads(j, lo, hi);
}

static void light_norm_rows(struct cpu *c, const void *arg, int64_t t0, int64_t t1) {
    const struct light_job *j = arg;
    int64_t n = j->out.cols, per = n / j->ly->groups;
    for (int64_t t = t0; t < t1; t++) {
        float *o = j->out.data + t * j->out.ld;
        for (int64_t g = 0; g < j->ly->groups; g++)
            sp_rmsnorm(o + g * per, o + g * per, j->ly->norm + g * per, per, j->ly->eps);
    }
}

/* The recurrence split by heads (each head's tokens in batch order on one
 * thread), then the output norm by tokens. */
static void cpu_lightning(struct sp_backend *b, const struct sp_lightning_layer *ly, const struct sp_batch *bt,
                          struct sp_tensor qkv, struct sp_tensor out) {
    struct cpu *c = cpu_of(b);
    struct light_job j = {c, ly, bt, qkv, out};
    sp_pool_run(c->pool, light_heads_job, &j);
    for_tokens(c, bt->n, light_norm_rows, &j);
}

/* ---- gated MLPs, several per pool hand-off ----
 *
 * One item is a gated MLP (a routed expert, the shared expert or a dense
 * MLP) applied to its rows of x; its intermediate rows go to rows [row,
 * row + cnt) of ff_a / ff_b and its outputs to the same rows of out. A
 * batch of items runs in two hand-offs: every gate / up row of every item,
 * activated where computed, then every down row. The work is a line of
 * positions, rows x tokens of each item in turn, which the threads take in
 * pieces as they come free: decode-sized chunks of rows, or with more
 * tokens guided pieces that keep to whole items where they can (each piece
 * that starts inside an item rounds its tokens again). Positions do not
 * all cost the same (an item's tokens past its whole blocks of 8 go by the
 * slower product by groups), nor do the machine's cores always run at one
 * speed: split evenly, a thread with the dearer share kept the other
 * waiting for 19% of the experts' time (Zen 5 VM, 2 threads, 512-token
 * prompt of 4-layer Qwen3-30B-A3B affine4); in pieces, prefill ran
 * 1.05-1.09x faster. Each output is the same product of the same rows as
 * one item at a time would compute. */
struct mlp_job {
    struct cpu *c;
    const struct sp_mlp_item *items;
    int64_t n_items;
    const struct sp_glu *act;
    struct sp_tensor out;
    bool down;          // the second hand-off
    int64_t total;      // sum over items of units x tokens
    int64_t *ends;      // (n_items) where each item's positions end
    int64_t chunk;      // taken at a time (sp_linear_chunk); 0: sp_pool_take_guided
    atomic_llong next;  // the next position to take
};

/* Units of an item: intermediate columns (first hand-off) or output rows. */
static int64_t mlp_units(const struct mlp_job *j, const struct sp_mlp_item *it) {
    return j->down ? j->out.cols : it->down->w.cols;
}

/* Weight bytes an item's hand-off reads: its down projection (second), or
 * gate_up / gate and up (first). */
static double mlp_bytes(const struct mlp_job *j, const struct sp_mlp_item *it) {
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

/* act(gate) * up into out, for n rows of width w (gate at ga, up at ub;
 * both with row stride lds, or interleaved pairs at ga when il). */
static void activate(const struct sp_glu *p, float *out, int64_t ldo, const float *ga, const float *ub, int64_t lds,
                     bool il, int64_t n, int64_t w) {
    const struct sp_kernels *k = sp_kernels();
    for (int64_t t = 0; t < n; t++) k->glu(out + t * ldo, ga + t * lds, il ? NULL : ub + t * lds, w, p);
}

/* Positions [a, b) of the weighted line. */
static void mlp_range(const struct mlp_job *j, int64_t a, int64_t b, void *scratch) {
    struct cpu *c = j->c;
    int64_t ld = c->ld_ff, start = 0;
    for (int64_t i = 0; i < j->n_items && start < b; i++) {
        const struct sp_mlp_item *it = &j->items[i];
        int64_t units = mlp_units(j, it), cnt = it->x.rows;
        int64_t r0 = unit_at(a, start, cnt, units), r1 = unit_at(b, start, cnt, units);
        start += units * cnt;
        if (r0 >= r1) continue;
        float *fa = c->ff_a + it->row * ld, *fb = c->ff_b + it->row * ld;
        if (j->down) {
            sp_linear_rows(it->down, r0, r1, fb, ld, j->out.data + it->row * j->out.ld, j->out.ld, cnt, scratch);
        } else if (it->gate_up) {
            sp_linear_rows(it->gate_up, 2 * r0, 2 * r1, it->x.data, it->x.ld, fa, ld, cnt, scratch);
            activate(j->act, fb + r0, ld, fa + 2 * r0, NULL, ld, true, cnt, r1 - r0);
        } else {
            sp_linear_rows_pair(it->gate, it->up, r0, r1, it->x.data, it->x.ld, fa, fb, ld, cnt, scratch);
            activate(j->act, fb + r0, ld, fa + r0, fb + r0, ld, false, cnt, r1 - r0);
        }
    }
}

static void mlp_job_run(void *arg, int tid, int nth) {
    struct mlp_job *j = arg;
    void *scratch = sp_pool_scratch(j->c->pool, tid);
    int64_t a, b;
    if (nth == 1) {
        mlp_range(j, 0, j->total, scratch);
        return;
    }
    while (j->chunk ? sp_pool_take(&j->next, j->total, j->chunk, &a, &b)
                    : sp_pool_take_guided(&j->next, j->ends, j->n_items, nth, &a, &b))
        mlp_range(j, a, b, scratch);
}

static void cpu_mlp(struct sp_backend *b, const struct sp_mlp_item *items, int64_t n, const struct sp_glu *act,
                    struct sp_tensor out) {
    struct cpu *c = cpu_of(b);
    int64_t most = 0;
    for (int64_t i = 0; i < n; i++) most = items[i].x.rows > most ? items[i].x.rows : most;
    /* threads when one of the three products is worth them */
    int nth = sp_mlp_macs(items, n, out.cols) / 3.0 < SP_LINEAR_SERIAL_MACS ? 1 : sp_pool_size(c->pool);
    for (int down = 0; down < 2; down++) {
        struct mlp_job j = {c, items, n, act, out, down, 0, c->item_ends, 0, 0};
        double bytes = 0;
        for (int64_t i = 0; i < n; i++) {
            j.total += mlp_units(&j, &items[i]) * items[i].x.rows;
            j.ends[i] = j.total;
            bytes += mlp_bytes(&j, &items[i]);
        }
        j.chunk = sp_linear_chunk(j.total, bytes / (double)j.total, most, nth);
        sp_pool_run_n(c->pool, mlp_job_run, &j, nth);
    }
}

/* ---- the backend ---- */

static void cpu_destroy(struct sp_backend *b) {
    struct cpu *c = cpu_of(b);
    for (int64_t i = 0; i < c->n_owned; i++) {
        if (c->owned[i].huge)
            sp_free_aligned(c->owned[i].p);
        else
            sp_free(c->owned[i].p);
    }
    sp_free(c->owned);
    sp_free_aligned(c->kv);
    sp_free(c->inv_freq);
    sp_pool_free(c->pool);
    sp_free(c);
}

enum sp_status sp_cpu_backend_create(const struct sp_backend_params *p, struct sp_backend **out) {
    *out = NULL;
    struct cpu *c = sp_calloc(1, sizeof *c, SP_MEM_MODEL);
    if (!c) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    c->base.ops = &sp_cpu_backend_ops;
    c->base.p = *p;
    c->shape = p->shape;
    const struct sp_backend_shape *s = &c->shape;
    enum sp_status st = sp_pool_create(p->n_threads, &c->pool);
    if (st != SP_OK) goto fail;
    c->base.p.n_threads = sp_pool_size(c->pool);
    int64_t half = s->rot_dims / 2, B = p->max_batch, E = s->n_experts > 0 ? s->n_experts : 1;
    c->inv_freq = sp_malloc((size_t)(half + 1) * sizeof(float), SP_MEM_MODEL);
    if (!c->inv_freq) goto nomem;
    if (half) memcpy(c->inv_freq, s->inv_freq, (size_t)half * sizeof(float));
    c->shape.inv_freq = c->inv_freq;
    c->kv_row_bytes = (size_t)s->head_dim * sp_dtype_size(sp_kv_dtype(p->kv_type));
    c->kv_bytes = sp_cpu_kv_bytes(p);
    c->kv = sp_malloc_huge(c->kv_bytes ? c->kv_bytes : 64, SP_MEM_KV);
    if (!c->kv) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory for a %zu-byte KV cache (%lld positions x %d sequences)", c->kv_bytes,
                       (long long)p->n_ctx, p->n_seq);
        goto fail;
    }
    memset(c->kv, 0, c->kv_bytes);
    if (s->n_state_layers > 0) {
        if (s->lin_k_dim > DELTA_MAX_DIM || s->lin_v_dim > DELTA_MAX_DIM || s->lin_v_heads % s->lin_k_heads) {
            st = sp_errorf(SP_ERR_UNSUPPORTED, "linear attention heads of %lld / %lld dims (at most %d, value heads "
                           "a multiple of key heads)", (long long)s->lin_k_dim, (long long)s->lin_v_dim, DELTA_MAX_DIM);
            goto fail;
        }
        c->state_floats = sp_backend_state_floats(s);
        c->states = (float *)((uint8_t *)c->kv + (c->kv_bytes - sp_backend_states_bytes(p)));
    }
    c->ld_ff = s->mlp_width;
    c->ff_a = act_buf(c, (size_t)(B * c->ld_ff), sizeof(float));
    c->ff_b = act_buf(c, (size_t)(B * c->ld_ff), sizeof(float));
    c->logit_rows = act_buf(c, (size_t)(B * s->d_model), sizeof(float));
    c->scores = act_buf(c, (size_t)c->base.p.n_threads * att_scratch_floats(s), sizeof(float));
    c->att_tiles = act_buf(c, (size_t)(B + 1), sizeof(int32_t));
    c->item_ends = act_buf(c, (size_t)(E + 1), sizeof(int64_t));
    c->rope_cs = act_buf(c, (size_t)(B * (s->rot_dims > 0 ? s->rot_dims : 1)), sizeof(float));
    if (!c->ff_a || !c->ff_b || !c->logit_rows || !c->scores || !c->att_tiles || !c->item_ends || !c->rope_cs)
        goto nomem;
    *out = &c->base;
    return SP_OK;
nomem:
    st = sp_errorf(SP_ERR_NOMEM, "out of memory");
fail:
    cpu_destroy(&c->base);
    return st;
}

/* In 2 MiB pages where it spans one or more, as the weights are. */
static void *cpu_host_alloc(size_t bytes, enum sp_mem_class cls) { return sp_malloc_huge(bytes, cls); }

/* A tier of experts in host memory is copies of the host's (useful to
 * test the tier; a device keeps one where the host's would be too slow). */
static enum sp_status cpu_arena(struct sp_backend *b, size_t bytes, void **out) {
    void *p = sp_malloc_huge(bytes ? bytes : 1, SP_MEM_EXPERT_CACHE);
    if (!p || !own(cpu_of(b), p, true)) {
        sp_free_aligned(p);
        return sp_errorf(SP_ERR_NOMEM, "out of memory for %zu bytes of experts", bytes);
    }
    *out = p;
    return SP_OK;
}

static void cpu_upload(struct sp_backend *b, void *dst, const void *src, size_t bytes) { memcpy(dst, src, bytes); }

/* sp_interleave_fn: the choice of the kernel set in use */
static bool cpu_interleave(const struct sp_qmat *w) { return sp_kernels_interleave(sp_kernels(), w); }

const struct sp_backend_ops sp_cpu_backend_ops = {
    .name = "cpu",
    .interleave = cpu_interleave,
    .host_alloc = cpu_host_alloc,
    .host_free = sp_free_aligned,
    .arena = cpu_arena,
    .upload = cpu_upload,
    .destroy = cpu_destroy,
    .supports = cpu_supports,
    .tensor = cpu_tensor,
    .vector = cpu_vector,
    .prepare = cpu_prepare,
    .write = cpu_write,
    .host = cpu_host,
    .sync = cpu_sync,
    .kv_bytes = cpu_kv_bytes,
    .kv_copy_seq = cpu_kv_copy_seq,
    .state_copy = cpu_state_copy,
    .gate = cpu_gate,
    .gated_delta = cpu_gated_delta,
    .lightning = cpu_lightning,
    .embed = cpu_embed,
    .rmsnorm = cpu_rmsnorm,
    .add_rmsnorm = cpu_add_rmsnorm,
    .zero = cpu_zero,
    .add = cpu_add,
    .linear = cpu_linear,
    .attention = cpu_attention,
    .mlp = cpu_mlp,
    .gather = cpu_gather,
    .scatter_add = cpu_scatter_add,
    .logits = cpu_logits,
};
