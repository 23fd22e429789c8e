/*
 * kernels.h - the CUDA backend's kernels (kernels.cu) as plain-C launchers:
 * products of packed weights with a batch of float activations in every
 * weight format, the embedding rows, RMSNorm, residual adds, the gated
 * activation, rows moved to and from experts, and attention (its
 * prologue, then an online softmax over the cached positions). cuda.c
 * calls them; nothing here includes a CUDA header.
 *
 *     struct sp_cuda_weight w = {.fmt = SP_CUDA_FMT_AFFINE, .bits = 4, .group = 64, .rows = R, .cols = C,
 *                                .codes = dev_codes, .scales = dev_s, .biases = dev_b, .scale_dt = SP_CUDA_BF16};
 *     int err = sp_cuda_linear(&w, x, C, y, R, n, stream);   // y[t * R + r] = row r of w . x[t * C ..]
 *
 * Every pointer is device memory, except where a launcher says host.
 * Launchers queue work on `stream` (a cudaStream_t) and return the CUDA
 * error of the launch (0: none). Each token's outputs are computed in the
 * same order whatever else the batch holds, so results do not depend on
 * the batch.
 */
#ifndef SP_BACKEND_CUDA_KERNELS_H
#define SP_BACKEND_CUDA_KERNELS_H

#include <stdbool.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Float element types of weights, scales, biases and the KV cache. */
enum sp_cuda_float { SP_CUDA_F32, SP_CUDA_F16, SP_CUDA_BF16, SP_CUDA_FLOAT_COUNT };

/* Weight formats as the kernels tell them apart (quant/qtype.h). */
enum sp_cuda_fmt {
    SP_CUDA_FMT_FLOAT,   // plain f32 / f16 / bf16 (elem)
    SP_CUDA_FMT_AFFINE,  // mlx affine, `bits` 2-8: w = scale * q + bias per group
    SP_CUDA_FMT_MXFP4,   // E2M1 codes, E8M0 scale per 32
    SP_CUDA_FMT_NVFP4,   // E2M1 codes, E4M3 scale per 16
    SP_CUDA_FMT_MXFP8,   // E4M3 codes, E8M0 scale per 32
    SP_CUDA_FMT_Q2_K,    // ggml's K-quant blocks of 256 (quant/qtype.c), scales inside
    SP_CUDA_FMT_Q3_K,
    SP_CUDA_FMT_Q4_K,
    SP_CUDA_FMT_Q5_K,
    SP_CUDA_FMT_Q6_K,
    SP_CUDA_FMT_IQ4_NL,
    SP_CUDA_FMT_IQ4_XS,
    SP_CUDA_FMT_COUNT
};

/* A weight matrix of `rows` outputs by `cols` inputs in device memory:
 * rows of codes (transposed: an (cols, rows) float matrix), a scale (and
 * for affine a bias) per `group` elements of a row, and an optional
 * output bias. */
struct sp_cuda_weight {
    enum sp_cuda_fmt fmt;
    enum sp_cuda_float elem;      // FLOAT: the element type
    enum sp_cuda_float scale_dt;  // AFFINE: the scales' and biases' type
    int bits, group;
    bool transposed;              // FLOAT only
    int64_t rows, cols;
    const void *codes, *scales, *biases;
    const void *bias;             // (rows) of bias_dt, or NULL
    enum sp_cuda_float bias_dt;
};

/* y[t * ldy + r] = row r of w . x[t * ldx ...] (+ bias[r]) for r < rows, t < n. */
int sp_cuda_linear(const struct sp_cuda_weight *w, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n,
                   void *stream);
/* Activations rounded to int8 for the products of 4-bit codes (the fast
 * path; the exact one keeps them float): blocks of SP_CUDA_QBLOCK values
 * of a row, each with a scale d (max |x| / 127) and codes rint(x / d).
 * Row t's codes at q + t * ldq (ldq a multiple of 16), its blocks' pairs
 * {d, the sum of the block's values} at d + 2 * (t * ldd + block). */
#define SP_CUDA_QBLOCK 32
struct sp_cuda_qx {
    int8_t *q;
    float *d;
    int64_t ldq, ldd;
};
/* n rows of cols (a multiple of SP_CUDA_QBLOCK) of x into q's rows. */
int sp_cuda_quantize(const float *x, int64_t ldx, int64_t n, int64_t cols, const struct sp_cuda_qx *q, void *stream);
/* Whether the int8 products take w (mxfp4 and affine 4-bit that sp_cuda_vec_ok takes). */
bool sp_cuda_q_ok(const struct sp_cuda_weight *w);
/* Tokens a block of the tensor-core products takes: int8 products of
 * SP_CUDA_MMA_TOKENS tokens or more run on tensor cores where the device
 * has them (sp_cuda_mma_ok), with the vector kernels' results to the bit. */
#define SP_CUDA_MMA_TOKENS 16
bool sp_cuda_mma_ok(const struct sp_cuda_weight *w);
/* sp_cuda_linear from the int8 rows x (of w's columns). */
int sp_cuda_linear_q(const struct sp_cuda_weight *w, const struct sp_cuda_qx *x, float *y, int64_t ldy, int64_t n,
                     void *stream);
/* Whether the products read w 16 bytes of codes at a time (affine 4- and
 * 8-bit, mxfp4, f16 and bf16, rows in row order of whole 16-byte chunks,
 * groups of whole chunks): sp_cuda_linear does so where it can, and the
 * batched MLP launchers below take only such weights. */
bool sp_cuda_vec_ok(const struct sp_cuda_weight *w);
/* Whether a and b are read by the same instantiation of a kernel, with
 * the same columns. */
bool sp_cuda_same_format(const struct sp_cuda_weight *a, const struct sp_cuda_weight *b);

/* One gated MLP of a batch as the MLP launchers take it (an array of them
 * in device memory): the arrays of gate (or of the fused gate_up, outputs
 * alternating gate, up), up (unused when fused) and down, with their
 * output biases (or NULL), applied to n rows of x (or of the int8 rows
 * from xrow); the activation goes to rows [row, row + n) of h and the
 * result to those rows of out. */
struct sp_cuda_mlp_item {
    const void *codes[3], *scales[3], *biases[3];
    const void *bias[3];
    const float *x;
    int64_t ldx, n, row, xrow;
    int64_t ff;                      // outputs of gate (columns of down)
    int64_t blk_gate_up, blk_down;   // the item's first block in each launch (sp_cuda_mlp_blocks)
};
/* Tokens per block (1, 2, 4 or 8) for items of at most n tokens; with mma
 * (int8 activations and weights sp_cuda_mma_ok takes), SP_CUDA_MMA_TOKENS
 * (the tensor-core kernels) where n is that many or more. */
int sp_cuda_mlp_tokens(int64_t n, bool mma);
/* Blocks of an item of n tokens with `outputs` outputs (gate's, or
 * down's rows), nt tokens per block. */
int64_t sp_cuda_mlp_blocks(bool down, int64_t outputs, int64_t n, int nt);
/* For items[0 .. n_items) (blocks in all, nt tokens per block): gate and
 * up of each, then the activation into its rows of h (rows ldh apart);
 * w gives the format, group, bias type and columns that every item's
 * gate and up share. The activations: each item's x (xvec: every x is
 * 16-byte aligned with ldx a multiple of 4), or where xq is not NULL its
 * rows [xrow, xrow + n) of xq (w as sp_cuda_q_ok takes). */
int sp_cuda_mlp_gate_up(const struct sp_cuda_weight *w, bool fused, const struct sp_cuda_mlp_item *items,
                        int n_items, int64_t blocks, int nt, bool xvec, const struct sp_cuda_qx *xq, float *h,
                        int64_t ldh, float alpha, float limit, float u_offset, void *stream);
/* Then down of each from its rows of h (or where hq is not NULL, of hq)
 * into its rows of out; w gives the downs' format, group, bias type and
 * rows. */
int sp_cuda_mlp_down(const struct sp_cuda_weight *w, const struct sp_cuda_mlp_item *items, int n_items,
                     int64_t blocks, int nt, const float *h, int64_t ldh, const struct sp_cuda_qx *hq, float *out,
                     int64_t ldo, void *stream);
/* The greedy choice of each of n rows of cols floats (row t at x + t *
 * ldx): the index of its largest value, the first of equal ones, NaN
 * passed over; packed into best[t] (device memory), which
 * sp_cuda_best_index turns into the index (0 where every value is NaN). */
int sp_cuda_argmax(const float *x, int64_t ldx, int64_t n, int64_t cols, uint64_t *best, void *stream);
static inline int32_t sp_cuda_best_index(uint64_t best) {
    return best ? (int32_t)(0xffffffffu - (uint32_t)best) : 0;
}
/* The k <= SP_CUDA_TOP_K_MAX best values of each of n rows of cols floats
 * (k <= cols; row t at x + t * ldx): the larger value first, the lower
 * index of equal ones, NaN as -inf; packed as sp_cuda_argmax packs them,
 * into best[t k .. t k + k) (device memory), which sp_cuda_top_value and
 * sp_cuda_best_index turn back. scratch: device memory of n x
 * sp_cuda_top_k_scratch(cols) words. */
#define SP_CUDA_TOP_K_MAX 64
int64_t sp_cuda_top_k_scratch(int64_t cols);
int sp_cuda_top_k(const float *x, int64_t ldx, int64_t n, int64_t cols, int k, uint64_t *scratch, uint64_t *best,
                  void *stream);
static inline float sp_cuda_top_value(uint64_t best) {
    uint32_t h = (uint32_t)(best >> 32), u = h & 0x80000000u ? h & 0x7fffffffu : ~h;
    float v;
    memcpy(&v, &u, sizeof v);
    return v;
}
/* Routing on the device (backend.h's enum sp_route, in the same order). */
enum sp_cuda_route_kind {
    SP_CUDA_ROUTE_SOFTMAX_TOPK,
    SP_CUDA_ROUTE_TOPK_SOFTMAX,
    SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK,
    SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK
};
/* Most experts, and most chosen a token, that the routing kernels take. */
#define SP_CUDA_ROUTE_MAX_EXPERTS 1024
#define SP_CUDA_ROUTE_MAX_K 32
struct sp_cuda_route {
    enum sp_cuda_route_kind kind;
    int64_t n_experts, k, n_group, topk_group;
    bool norm_topk;
    float routed_scale;
    const float *bias;  // (n_experts) or NULL
};
/* Routes n tokens, token t's k experts (sel, best first) and weights
 * (w), rows of k, from its router logits (logits + t * ldl); then lists
 * the n x k routed pairs by expert for the batched MLP kernels: items[0
 * ..) one an expert chosen, in increasing order, from table[e] (its
 * weights and ff) with n its pairs' tokens, x its first row of gath (rows
 * ldx apart), row and xrow that row, and its blocks for nt tokens a block
 * (jblocks and rblocks: gate_up's and down's blocks a token block); where
 * one_row (a batch of one token), x is gath and xrow 0 for every item, so
 * the token's row needs no gathering; items up to max_items past those are
 * never a block's. rows[i] is the token of pair i in that order
 * (sp_cuda_gather's rows), ew[i] its weight; toff (n + 1) and tlist (n x
 * k) list each token's pairs in increasing expert order
 * (sp_cuda_scatter_add's off and list). With shared, table[n_experts] is a
 * shared expert of the experts' formats and ff: one more item after the
 * others, on rows n k + t of gath (rows[n k + t] = t, weight 1), last in
 * each token's list (then k + 1 long). Where own is not NULL (experts
 * split over ranks: own[e] nonzero where expert e is this rank's), only
 * this rank's pairs become items; another rank's pair is -1 in tlist (a
 * one-token list holds only this rank's). n x (k + shared) at most
 * SP_CUDA_MOE_MAX_PAIRS. */
#define SP_CUDA_MOE_MAX_PAIRS 4608  // a 512-token chunk of top-8 routing with a shared expert at once
int sp_cuda_moe_group(const struct sp_cuda_route *r, const float *logits, int64_t ldl, int32_t *sel, float *w,
                      int64_t n, const struct sp_cuda_mlp_item *table, const uint8_t *own, bool shared,
                      const float *gath, int64_t ldx, bool one_row, int nt, int64_t jblocks, int64_t rblocks,
                      int64_t max_items, struct sp_cuda_mlp_item *items, int32_t *rows, float *ew, int32_t *toff,
                      int32_t *tlist, void *stream);
/* Row tokens[t] of w (dequantized) into x[t * ldx ...] for t < n. */
int sp_cuda_embed(const struct sp_cuda_weight *w, const int32_t *tokens, int64_t n, float *x, int64_t ldx,
                  void *stream);
/* cs[t * rot + i] = cos, cs[t * rot + rot / 2 + i] = sin of pos[t] * inv_freq[i], times scale. */
int sp_cuda_rope_table(const int32_t *pos, int64_t n, const float *inv_freq, int64_t rot, float scale, float *cs,
                       void *stream);
/* out row i = x row (rows ? rows[i] : i) / rms * w (w NULL: none), for i < n rows of cols;
 * where q is not NULL, each out row also rounded into q's rows as sp_cuda_quantize rounds it. */
int sp_cuda_rmsnorm(const float *x, int64_t ldx, const int32_t *rows, const float *w, float eps, float *out,
                    int64_t ldo, int64_t n, int64_t cols, const struct sp_cuda_qx *q, void *stream);
/* x += r (then r = 0 where zero_r), then sp_cuda_rmsnorm of x's rows: the same values as those steps apart. */
int sp_cuda_add_rmsnorm(float *x, int64_t ldx, float *r, int64_t ldr, bool zero_r, const float *w, float eps,
                        float *out, int64_t ldo, int64_t n, int64_t cols, const struct sp_cuda_qx *q, void *stream);
/* dst += src over n rows of cols. */
int sp_cuda_add(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t cols, void *stream);
/* Ranks' parts of a sum (n rows of cols each, dense; another GPU's where
 * peer access allows): out row r = their rows r added in part order. */
#define SP_CUDA_PARTS_MAX 64
struct sp_cuda_parts {
    const float *part[SP_CUDA_PARTS_MAX];
    int n;
};
int sp_cuda_sum_parts(float *out, int64_t ldo, const struct sp_cuda_parts *p, int64_t n, int64_t cols, void *stream);
/* out = (u + u_offset) * g / (1 + exp(-alpha g)), g clamped to <= limit, u to [-limit, limit]; g and u
 * rows lds apart (u NULL: pairs g[2j], g[2j + 1]), n rows of w outputs. */
int sp_cuda_glu(float *out, int64_t ldo, const float *g, const float *u, int64_t lds, int64_t n, int64_t w,
                float alpha, float limit, float u_offset, void *stream);
/* Row i of dst = row rows[i] of src, for i < n rows of cols. */
int sp_cuda_gather(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int64_t n,
                   int64_t cols, void *stream);
/* The same for int8 rows (codes and block pairs) of cols (a multiple of SP_CUDA_QBLOCK). */
int sp_cuda_gather_q(const struct sp_cuda_qx *dst, const struct sp_cuda_qx *src, const int32_t *rows, int64_t n,
                     int64_t cols, void *stream);
/* Row t of out += w[k] x row k of src for k in list[off[t] .. off[t + 1]) in that order (k < 0: none), t < n. */
int sp_cuda_scatter_add(float *out, int64_t ldo, const float *src, int64_t lds, const int32_t *off,
                        const int32_t *list, const float *w, int64_t n, int64_t cols, void *stream);

/* The KV cache as the attention kernels see it: element e of KV head h of
 * position p of sequence s of layer L, keys (which 0) or values (1), at
 * ((((L * 2 + which) * n_seq + s) * n_ctx + p) * n_kv_heads + h) * head_dim + e. */
struct sp_cuda_kv {
    void *data;
    enum sp_cuda_float dt;
    int64_t n_seq, n_ctx;
};

/* One attention call's shapes and parameters. */
struct sp_cuda_attn {
    int64_t layer, n_heads, n_kv_heads, head_dim, rot;
    const float *q_norm, *k_norm;  // (head_dim) each, or NULL
    const float *sinks;            // (n_heads) or NULL
    int64_t window;                // 0: every cached position
    float eps;
    const float *rope_cs;          // (n, rot) of sp_cuda_rope_table
    const int32_t *pos, *seq;      // (n)
};

/* Largest head_dim the attention kernels take (576: MLA's latent and rotary key of Ling 2.6). */
#define SP_CUDA_MAX_HEAD_DIM 576

/* q / k norms and RoPE of the q and k heads of qkv (in place), then each
 * token's k and v heads into the cache. */
int sp_cuda_attn_prologue(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, float *qkv, int64_t ldq,
                          int64_t n, void *stream);
/* Whether sp_cuda_linear_heads takes w[0 .. parts) (attention's q, k and
 * v rows: one fused matrix, or q, k and v of one format and width) for n
 * tokens (int8: with int8 activations): the vector kernels' formats,
 * products they split over a block's warps, fewer tokens than a
 * tensor-core tile, heads of at most 256 dimensions. */
bool sp_cuda_linear_heads_ok(const struct sp_cuda_weight *w, int parts, bool int8, const struct sp_cuda_attn *a,
                             int64_t n);
/* qkv = w(x) for n rows of x (or where xq is set, of its int8 rows) as
 * sp_cuda_linear (sp_cuda_linear_q) computes each part, side by side,
 * then sp_cuda_attn_prologue on it, in one launch: the same bits. done:
 * n x (n_heads + n_kv_heads) counts in device memory, 0 between launches. */
int sp_cuda_linear_heads(const struct sp_cuda_weight *w, int parts, const float *x, int64_t ldx,
                         const struct sp_cuda_qx *xq, float *qkv, int64_t ldq, int64_t n, const struct sp_cuda_attn *a,
                         const struct sp_cuda_kv *kv, unsigned *done, void *stream);
/* Chunks of cached positions that attention scores apart (and merges in
 * order) for a token seeing `positions` of them: each takes head_dim + 2
 * floats of the scratch for each query head. */
int64_t sp_cuda_attn_chunks(int64_t positions);
/* The device's compute capability (major) and whether kernels are launched
 * to overlap the end of the kernel before them in the stream (programmatic
 * dependent launch, 9.0 on); tensor-core products need 8.0 on. For the
 * process: the last backend created sets it. */
void sp_cuda_set_device(int major, bool overlap);
/* att row t, head h = softmax over token t's visible cached positions of
 * its q head's scores (with its sink logit's share) times the values;
 * max_visible: the most positions a token of the n sees. part: scratch of
 * part_floats floats, at least n_heads x sp_cuda_attn_chunks(max_visible)
 * x (head_dim + 2) (tokens go in slices that fit); done: part_floats /
 * (head_dim + 2) counters, zero, left zero. With q (head_dim a multiple
 * of SP_CUDA_QBLOCK), att's rows also into q's rows, as sp_cuda_quantize
 * rounds them. one_run: the n tokens are one run of consecutive
 * positions of one sequence (a prompt), so that tokens side by side share
 * the cache's reads (the same sums). */
int sp_cuda_attention(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, const float *qkv, int64_t ldq,
                      float *att, int64_t lda, int64_t n, int64_t max_visible, float *part, int64_t part_floats,
                      unsigned *done, const struct sp_cuda_qx *q, bool one_run, void *stream);

/* x *= sigmoid(g) elementwise (n rows of cols), g of one column a row where `one`. */
int sp_cuda_gate(float *x, int64_t ldx, const float *g, int64_t ldg, int64_t n, int64_t cols, bool one, void *stream);

/* A recurrent layer's states (a slot of state_floats per sequence, then
 * one per snapshot) and the batch's positions, sequences and snapshot
 * flags (NULL: none). */
struct sp_cuda_states {
    float *state;
    int64_t state_floats;
    int n_seq;
    const int32_t *pos, *seq;
    const uint8_t *snapshot;
};

/* One Gated DeltaNet layer (backend.h: ops->gated_delta) over n tokens:
 * its shapes, parameters and states. */
struct sp_cuda_delta {
    int64_t k_heads, v_heads, k_dim, v_dim, conv;
    const float *conv_w, *a_log, *dt_bias, *norm;
    float eps;
    struct sp_cuda_states st;
};
/* qkv is overwritten with the conv's outputs. */
int sp_cuda_gated_delta(const struct sp_cuda_delta *d, float *qkv, int64_t ldq, const float *z, int64_t ldz,
                        const float *ba, int64_t ldba, float *out, int64_t ldo, int64_t n, void *stream);

/* One Lightning layer (backend.h: ops->lightning) over n tokens: heads of
 * dim, the first rot dims rotated by rope_cs (each token's cos then sin),
 * its q / k norms (or NULL), decays, output norm and states. */
struct sp_cuda_lightning {
    int64_t heads, dim, rot, groups;
    const float *rope_cs, *q_norm, *k_norm, *decay, *norm;
    float eps;
    struct sp_cuda_states st;
};
int sp_cuda_lightning(const struct sp_cuda_lightning *l, const float *qkv, int64_t ldq, float *out, int64_t ldo,
                      int64_t n, void *stream);

#ifdef __cplusplus
}
#endif

#endif
