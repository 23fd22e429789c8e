/*
 * cuda.c - the CUDA backend: device memory (tensors, the KV cache, copies
 * of the weights), the ops of backend.h queued on one stream through the
 * launchers of kernels.h, and the first failure kept for ops->error. Built
 * only with `make CUDA=1`.
 */
#include "backend/cuda/cuda.h"

#include <cuda_runtime_api.h>
#include <stdio.h>
#include <string.h>

#include "backend/cuda/kernels.h"
#include "core/alloc.h"

_Static_assert((int)SP_CUDA_ROUTE_SOFTMAX_TOPK == (int)SP_ROUTE_SOFTMAX_TOPK &&
                   (int)SP_CUDA_ROUTE_TOPK_SOFTMAX == (int)SP_ROUTE_TOPK_SOFTMAX &&
                   (int)SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK == (int)SP_ROUTE_SIGMOID_GROUP_TOPK &&
                   (int)SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK == (int)SP_ROUTE_SOFTMAX_GROUP_TOPK,
               "the kernels' routing kinds are backend.h's");

/* Weights are copied into slabs of device memory (one cudaMalloc per
 * matrix would be tens of thousands for a MoE); a matrix of a quarter slab
 * or more gets its own allocation. */
#define SLAB_BYTES ((size_t)256 << 20)
#define DEV_ALIGN 256
/* Rows of logits computed per pass (a device buffer of that many x vocab). */
#define LOGIT_ROWS 64
/* Bytes compared at a time where a host pointer prepared before comes again. */
#define COMPARE_BYTES ((size_t)64 << 20)
/* Steps of up to GRAPH_TOKENS tokens (decode steps, continuous batches)
 * may run as CUDA graphs (p.graphs). Recording and updating a step costs
 * the host 27-93 us that it cannot overlap with the GPU, more than the
 * launches save where the host keeps ahead of the GPU (an H100 decoding
 * the large MoE shapes): off by default. Uploads while recording go
 * through GRAPH_STAGE_BYTES of pinned memory. */
#define GRAPH_TOKENS 64
#define GRAPH_STAGE_BYTES ((size_t)256 << 10)

/* A weight array copied to the device, found by its host address (a tied
 * embedding is the lm_head too) or by its device address (a linear
 * prepared twice). */
struct wcopy {
    const void *host;
    size_t bytes;
    void *dev;
};

/* Open addressing over the copies: slot values are index + 1, 0 empty. */
struct wmap {
    int64_t *slots;
    size_t cap;  // a power of two
};

/* Consecutive items of an MLP call whose gates (and ups) share a format
 * and whose downs share one: one launch of each kernel. */
struct mlp_run {
    int64_t first, count, max_n, blocks_gate_up, blocks_down;
    int64_t row_begin, row_end;  // the items' rows: from the first to past the last
    struct sp_cuda_weight gate, down;
    bool fused, xvec;
    bool q;           // int8 activations
};

/* A MoE layer's experts as the batched MLP kernels take them (ops->moe):
 * an item a expert, weights and ff filled in, in device memory; built at
 * the layer's first call. */
struct moe_table {
    bool built, ok;  // ok: every expert's gate (or gate_up), up and down are read by the batched kernels
    bool fused;
    bool shared;                       // the shared expert is item n_experts: formats and ff as the experts'
    struct sp_cuda_weight gate, down;  // the formats every expert shares
    struct sp_cuda_mlp_item *d;        // (n_experts + shared)
    const uint8_t *own;                // (n_experts) after d: 1 where the expert is this rank's; NULL: every expert
};

/* What qa holds: the int8 rows of n rows of cols floats at src (ld apart);
 * src NULL: nothing known. A product of the same rows reads them as they
 * are; any op that writes those floats forgets them. */
struct qtag {
    const float *src;
    int64_t ld, n, cols;
};

struct cuda {
    struct sp_backend base;
    struct sp_backend_shape shape;
    cudaStream_t stream;
    bool has_stream;
    /* ops->upload's queue beside the stream (made with the first arena), and
     * the events that order the two (ops->copies_after_ops, ops_after_copies) */
    cudaStream_t copy_stream;
    cudaEvent_t ops_done, copies_done;
    bool has_copy_stream;
    enum sp_status err;  // the first failure of queued work (ops->error)
    char err_msg[384];
    /* every cudaMalloc, freed with the backend */
    void **allocs;
    int64_t n_allocs, cap_allocs;
    char *slab;  // the slab weights are placed in
    size_t slab_used, slab_size;
    struct wcopy *copies;
    int64_t n_copies, cap_copies;
    struct wmap by_host, by_dev;
    /* ops->arena: regions weight views may point into unprepared (an expert tier's slots) */
    struct { const char *base; size_t bytes; } arenas[4];
    int n_arenas;
    /* ops->pin: host ranges registered with the driver, unregistered with the backend */
    void **pinned;
    int64_t n_pinned, cap_pinned;
    /* KV cache: sp_cuda_kv's layout; then the recurrent states (per Gated
     * DeltaNet layer, a slot per sequence, then one per snapshot) */
    void *kv;
    size_t kv_bytes;
    float *states;
    int64_t state_floats;
    uint8_t *d_snap;  // (B) the batch's snapshot flags
    bool has_snap;
    enum sp_cuda_float kv_dt;
    /* device buffers, max_batch rows unless said */
    float *inv_freq;               // (rot / 2)
    float *rope_cs;                // (B, rot)
    float *att_part;               // (att_part_floats): attention's chunks
    int64_t att_part_floats;
    unsigned *att_done;            // (att_done_count): (token, head)s' chunks done
    unsigned *heads_done;          // (max_batch x heads) sp_cuda_linear_heads' blocks done
    float *ff_a, *ff_b;            // (B, mlp_width)
    /* int8 activations of the 4-bit products (unless float_acts): rows of
     * q_cols codes, max(B, moe_pairs) of them; qa for x, qb for the MLPs' h */
    bool float_acts;
    struct sp_cuda_qx qa, qb;
    int64_t q_rows, q_cols;
    struct qtag qa_holds;
    float *logit_rows, *logit_out; // (LOGIT_ROWS, d), (LOGIT_ROWS, vocab)
    float *logit_host;             // (LOGIT_ROWS, vocab), pinned host memory
    uint64_t *d_best;              // (LOGIT_ROWS) greedy choices, packed (sp_cuda_argmax)
    uint64_t *d_top, *d_top_work;  // (LOGIT_ROWS, SP_TOP_K_MAX) best logits, packed, and their scratch
    uint64_t *h_top;               // (LOGIT_ROWS, SP_TOP_K_MAX) those on the host
    int64_t logit_cap;             // rows of those
    int32_t *d_tok, *d_pos, *d_seq;
    int32_t *d_idx;                // gather rows, scatter offsets and lists, logits rows
    float *d_w;                    // scatter weights
    int64_t idx_cap, w_cap;
    /* host staging for the index arrays built here */
    int32_t *h_idx;
    int64_t h_idx_cap;
    /* an MLP call's items for the batched kernels: host staging, device copy, runs */
    struct sp_cuda_mlp_item *h_items, *d_items;
    struct mlp_run *runs;
    int64_t items_cap;
    /* ops->moe: its tables (a MoE layer each), then its buffers for P =
     * moe_pairs routed pairs (token, expert) at a time */
    struct moe_table *moe;         // (n_layers)
    int64_t moe_pairs;
    float *moe_logits;             // (P, n_experts)
    int32_t *moe_sel, *moe_rows, *moe_toff, *moe_tlist;  // (P), (P), (P + 1), (P)
    float *moe_w, *moe_ew;         // (P) each
    float *moe_x, *moe_y;          // (P, d): the pairs' rows in, the experts' results out
    /* ops->part_share: this rank's parts of sums, two taking turns (a part
     * is read by the other ranks until the share after next), each with
     * the event of its copy */
    struct part {
        float *data;
        int64_t cap;
        cudaEvent_t copied;
        bool has_event;
    } parts[2];
    int part_turn;
    float *moe_h;                  // (P, expert_ff): the experts' activations
    struct sp_cuda_mlp_item *moe_items;  // (n_experts + 1)
    /* ops->mark: events recorded on the stream, created as needed */
    cudaEvent_t *marks;
    int n_marks, cap_marks, made_marks;
    /* A step of n <= GRAPH_TOKENS tokens is recorded from ops->embed to its
     * first wait on the device (normally the logits' read-back), then
     * replayed through graph[n]: the recording updated into it where only
     * parameters changed, built anew where the launches did. */
    bool graphs;      // steps are recorded (p.graphs)
    bool recording;   // the stream is being captured
    bool replay_unwaited;  // a replay launched since the last wait may still read stage
    int64_t graph_n;  // the recorded step's tokens
    cudaGraphExec_t graph[GRAPH_TOKENS + 1];
    int64_t replayed, built;
    char *stage;  // (GRAPH_STAGE_BYTES) pinned: the recorded step's uploads, read when it is replayed
    size_t stage_used;
};

static struct cuda *cuda_of(struct sp_backend *b) { return (struct cuda *)b; }

/* Floats [p, p + rows x ld) are about to be written: qa no longer holds them. */
static void touched(struct cuda *c, const float *p, int64_t rows, int64_t ld) {
    const struct qtag *t = &c->qa_holds;
    if (t->src && rows > 0 && p < t->src + t->n * t->ld && t->src < p + rows * ld) c->qa_holds.src = NULL;
}

static void touched_t(struct cuda *c, struct sp_tensor t) { touched(c, t.data, t.rows, t.ld); }

/* ---- failures ---- */

static enum sp_status status_of(cudaError_t e) {
    return e == cudaErrorMemoryAllocation ? SP_ERR_NOMEM : SP_ERR_IO;
}

/* Keeps the first failure of queued work; whether e is success. */
static bool check(struct cuda *c, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return true;
    if (c->err == SP_OK) {
        c->err = status_of(e);
        snprintf(c->err_msg, sizeof c->err_msg, "cuda: %s: %s", what, cudaGetErrorString(e));
    }
    return false;
}

/* A failure of the backend's own making (a weight it was not given, a
 * batch past its buffers), kept the same way. */
static void fail(struct cuda *c, enum sp_status st, const char *msg) {
    if (c->err != SP_OK) return;
    c->err = st;
    snprintf(c->err_msg, sizeof c->err_msg, "%s", msg);
}

static void end_recording(struct cuda *c);

static enum sp_status cuda_error(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    end_recording(c);
    /* a kernel that faulted shows in its stream's state (not ready: still running) */
    cudaError_t q = c->err == SP_OK ? cudaStreamQuery(c->stream) : cudaSuccess;
    if (q != cudaErrorNotReady) check(c, q, "queued work");
    q = c->err == SP_OK && c->has_copy_stream ? cudaStreamQuery(c->copy_stream) : cudaSuccess;
    if (q != cudaErrorNotReady) check(c, q, "copies to the device");
    return c->err == SP_OK ? SP_OK : sp_errorf(c->err, "%s", c->err_msg);
}

/* ---- device memory ---- */

static enum sp_status dev_alloc(struct cuda *c, size_t bytes, void **out) {
    *out = NULL;
    if (c->n_allocs == c->cap_allocs) {
        int64_t cap = c->cap_allocs ? 2 * c->cap_allocs : 64;
        void **a = sp_realloc(c->allocs, (size_t)cap * sizeof *a);
        if (!a) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        c->allocs = a;
        c->cap_allocs = cap;
    }
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        *out = NULL;
        return sp_errorf(status_of(e), "cuda: %zu bytes of device memory: %s", bytes, cudaGetErrorString(e));
    }
    c->allocs[c->n_allocs++] = *out;
    return SP_OK;
}

/* n zeroed floats of device memory (cleared in stream order, as every
 * copy and memset here is: the stream does not wait for the default one). */
static enum sp_status dev_floats(struct cuda *c, int64_t n, float **out) {
    size_t bytes = (size_t)(n > 0 ? n : 1) * sizeof(float);
    enum sp_status st = dev_alloc(c, bytes, (void **)out);
    cudaError_t e = st == SP_OK ? cudaMemsetAsync(*out, 0, bytes, c->stream) : cudaSuccess;
    if (e != cudaSuccess) st = sp_errorf(status_of(e), "cuda: clearing a buffer: %s", cudaGetErrorString(e));
    return st;
}

/* Device room for a weight array. */
static enum sp_status weight_alloc(struct cuda *c, size_t bytes, void **out) {
    if (bytes >= SLAB_BYTES / 4) return dev_alloc(c, bytes, out);
    size_t at = (c->slab_used + DEV_ALIGN - 1) / DEV_ALIGN * DEV_ALIGN;
    if (!c->slab || at + bytes > c->slab_size) {
        void *s;
        enum sp_status st = dev_alloc(c, SLAB_BYTES, &s);
        if (st != SP_OK) return st;
        c->slab = s;
        c->slab_size = SLAB_BYTES;
        at = 0;
    }
    *out = c->slab + at;
    c->slab_used = at + bytes;
    return SP_OK;
}

/* Grows a device index buffer to n elements of size bytes (rarely: the
 * buffers start at what a batch needs). */
static bool dev_reserve(struct cuda *c, void **buf, int64_t *cap, int64_t n, size_t size) {
    if (n <= *cap) return true;
    /* what is queued may still read the old buffer, which stays allocated */
    void *p;
    enum sp_status st = dev_alloc(c, (size_t)n * size, &p);
    if (st != SP_OK) {
        fail(c, st, sp_error_msg());
        return false;
    }
    *buf = p;
    *cap = n;
    return true;
}

/* ---- steps as graphs ---- */

/* Ends a recording: the step so far replayed through its graph (updated in
 * place, or built anew where the launches differ from the last step of as
 * many tokens). Every wait on the device and every copy from pageable
 * memory comes after it; the rest of the step runs as it is queued. */
static void end_recording(struct cuda *c) {
    if (!c->recording) return;
    c->recording = false;
    cudaGraph_t g = NULL;
    cudaError_t e = cudaStreamEndCapture(c->stream, &g);
    if (!check(c, e, "recording a step") || c->err) {  // a failed op: nothing of the step runs
        if (g) cudaGraphDestroy(g);
        return;
    }
    cudaGraphExec_t *x = &c->graph[c->graph_n];
    if (*x) {
        cudaGraphExecUpdateResultInfo info;
        if (cudaGraphExecUpdate(*x, g, &info) != cudaSuccess) {
            cudaGetLastError();
            cudaGraphExecDestroy(*x);
            *x = NULL;
        }
    }
    if (!*x && check(c, cudaGraphInstantiate(x, g, 0), "building a step's graph")) c->built++;
    cudaGraphDestroy(g);
    if (*x && check(c, cudaGraphLaunch(*x, c->stream), "replaying a step")) {
        c->replayed++;
        c->replay_unwaited = true;
    }
}

/* A recording dropped, nothing of it run (a step that failed before its
 * end, or the backend freed). */
static void drop_recording(struct cuda *c) {
    if (!c->recording) return;
    c->recording = false;
    cudaGraph_t g = NULL;
    if (cudaStreamEndCapture(c->stream, &g) != cudaSuccess) cudaGetLastError();
    if (g) cudaGraphDestroy(g);
}

/* Waits for queued work (a recording ended first). */
static bool wait_queue(struct cuda *c) {
    end_recording(c);
    bool ok = check(c, cudaStreamSynchronize(c->stream), "queued work");
    if (ok) c->replay_unwaited = false;
    return ok;
}

/* A step of n tokens begins: recorded where graphs are on and the step is
 * small. */
static void begin_recording(struct cuda *c, int64_t n) {
    drop_recording(c);
    if (!c->graphs || c->err || n > GRAPH_TOKENS || c->n_marks) return;  // marks time ops one by one
    if (c->replay_unwaited && !wait_queue(c)) return;  // stage is reused
    if (!check(c, cudaStreamBeginCapture(c->stream, cudaStreamCaptureModeRelaxed), "recording a step")) return;
    c->recording = true;
    c->graph_n = n;
    c->stage_used = 0;
}

/* bytes of host memory at src copied into dev in stream order, src free to
 * change once the call returns: from pageable memory the driver stages
 * the copy before returning; while recording, the bytes go to stage, which
 * the replay reads (a recording without room left there ends first). */
static bool upload(struct cuda *c, void *dev, const void *src, size_t bytes, const char *what) {
    if (bytes == 0) return true;
    size_t at = (c->stage_used + 15) & ~(size_t)15;
    if (c->recording && at + bytes <= GRAPH_STAGE_BYTES) {
        memcpy(c->stage + at, src, bytes);
        c->stage_used = at + bytes;
        src = c->stage + at;
    } else {
        end_recording(c);
    }
    return check(c, cudaMemcpyAsync(dev, src, bytes, cudaMemcpyHostToDevice, c->stream), what);
}

static bool host_reserve(struct cuda *c, int64_t n) {
    if (n <= c->h_idx_cap) return true;
    int32_t *p = sp_realloc(c->h_idx, (size_t)n * sizeof *p);
    if (!p) {
        fail(c, SP_ERR_NOMEM, "cuda: out of host memory for an index list");
        return false;
    }
    c->h_idx = p;
    c->h_idx_cap = n;
    return true;
}

/* ---- the map of weight copies ---- */

static size_t hash_ptr(const void *p) {
    uint64_t x = (uint64_t)(uintptr_t)p;
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return (size_t)x;
}

static const void *key_of(const struct cuda *c, const struct wmap *m, int64_t i) {
    return m == &c->by_host ? c->copies[i].host : c->copies[i].dev;
}

/* The copy whose key (host or device address) is p, or -1. */
static int64_t map_find(const struct cuda *c, const struct wmap *m, const void *p) {
    if (!m->cap) return -1;
    for (size_t h = hash_ptr(p) & (m->cap - 1);; h = (h + 1) & (m->cap - 1)) {
        int64_t v = m->slots[h];
        if (!v) return -1;
        if (key_of(c, m, v - 1) == p) return v - 1;
    }
}

static void map_put_slot(const struct cuda *c, struct wmap *m, int64_t i) {
    const void *p = key_of(c, m, i);
    size_t h = hash_ptr(p) & (m->cap - 1);
    while (m->slots[h] && key_of(c, m, m->slots[h] - 1) != p) h = (h + 1) & (m->cap - 1);
    m->slots[h] = i + 1;
}

/* Makes copy i findable by its key in m (replacing an entry of the same key). */
static enum sp_status map_put(struct cuda *c, struct wmap *m, int64_t i) {
    if ((size_t)(c->n_copies + 1) * 2 > m->cap) {
        size_t cap = m->cap ? 2 * m->cap : 1024;
        int64_t *s = sp_calloc(cap, sizeof *s, SP_MEM_MODEL), *old = m->slots;
        if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        size_t old_cap = m->cap;
        m->slots = s;
        m->cap = cap;
        for (size_t k = 0; k < old_cap; k++)
            if (old[k]) map_put_slot(c, m, old[k] - 1);
        sp_free(old);
    }
    map_put_slot(c, m, i);
    return SP_OK;
}

/* Whether dev holds the same bytes as host (read back in pieces). */
static enum sp_status same_bytes(struct cuda *c, const void *host, const void *dev, size_t bytes, bool *same) {
    *same = true;
    end_recording(c);
    size_t piece = bytes < COMPARE_BYTES ? bytes : COMPARE_BYTES;
    char *buf = sp_malloc(piece ? piece : 1, SP_MEM_MISC);
    if (!buf) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    enum sp_status st = SP_OK;
    for (size_t at = 0; at < bytes && *same; at += piece) {
        size_t n = bytes - at < piece ? bytes - at : piece;
        /* to pageable memory: done when the call returns */
        cudaError_t e = cudaMemcpyAsync(buf, (const char *)dev + at, n, cudaMemcpyDeviceToHost, c->stream);
        if (e != cudaSuccess) {
            st = sp_errorf(status_of(e), "cuda: reading back a weight: %s", cudaGetErrorString(e));
            break;
        }
        *same = memcmp(buf, (const char *)host + at, n) == 0;
    }
    sp_free(buf);
    return st;
}

/* The device copy of `bytes` at host (made now unless made before with the
 * same bytes); host already a copy of ours is itself. */
static enum sp_status device_copy(struct cuda *c, const void *host, size_t bytes, const void **out) {
    *out = NULL;
    if (!host) return SP_OK;
    int64_t i = map_find(c, &c->by_dev, host);
    if (i >= 0) {
        *out = host;
        return SP_OK;
    }
    enum sp_status st;
    i = map_find(c, &c->by_host, host);
    if (i >= 0 && c->copies[i].bytes == bytes) {
        /* the same address may hold other bytes since (a freed matrix's memory reused) */
        bool same;
        if ((st = same_bytes(c, host, c->copies[i].dev, bytes, &same)) != SP_OK) return st;
        if (same) {
            *out = c->copies[i].dev;
            return SP_OK;
        }
    }
    void *dev;
    if ((st = weight_alloc(c, bytes, &dev)) != SP_OK) return st;
    /* from pageable memory: staged before the call returns */
    end_recording(c);
    cudaError_t e = cudaMemcpyAsync(dev, host, bytes, cudaMemcpyHostToDevice, c->stream);
    if (e != cudaSuccess)
        return sp_errorf(status_of(e), "cuda: copying a weight to the device: %s", cudaGetErrorString(e));
    if (c->n_copies == c->cap_copies) {
        int64_t cap = c->cap_copies ? 2 * c->cap_copies : 256;
        struct wcopy *w = sp_realloc(c->copies, (size_t)cap * sizeof *w);
        if (!w) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        c->copies = w;
        c->cap_copies = cap;
    }
    int64_t k = c->n_copies++;
    c->copies[k] = (struct wcopy){host, bytes, dev};
    if ((st = map_put(c, &c->by_host, k)) != SP_OK || (st = map_put(c, &c->by_dev, k)) != SP_OK) return st;
    *out = dev;
    return SP_OK;
}

/* ---- weights as the kernels take them ---- */

static bool float_of(enum sp_dtype d, enum sp_cuda_float *out) {
    switch (d) {
    case SP_DTYPE_F32: *out = SP_CUDA_F32; return true;
    case SP_DTYPE_F16: *out = SP_CUDA_F16; return true;
    case SP_DTYPE_BF16: *out = SP_CUDA_BF16; return true;
    default: return false;
    }
}

/* The scale type a format stores (its fixed one, else the matrix's). */
static enum sp_dtype scale_dtype(const struct sp_qmat *w) {
    enum sp_dtype fixed = sp_qtype_traits(w->type)->scale_dtype;
    return fixed != SP_DTYPE_COUNT ? fixed : w->scale_dtype;
}

/* Whether p is device memory holding a weight: a prepared copy, or in an arena. */
static bool weight_memory(const struct cuda *c, const void *p) {
    for (int i = 0; i < c->n_arenas; i++)
        if ((const char *)p >= c->arenas[i].base && (const char *)p < c->arenas[i].base + c->arenas[i].bytes) return true;
    return map_find(c, &c->by_dev, p) >= 0;
}

/* l as the kernels read it; false (a failure kept) when l's arrays are
 * not copies of ours: a weight that was not prepared. */
static bool weight_of(struct cuda *c, const struct sp_linear *l, struct sp_cuda_weight *w) {
    const struct sp_qmat *m = &l->w;
    *w = (struct sp_cuda_weight){.bits = sp_qtype_traits(m->type)->bits, .group = m->group, .transposed = l->transposed,
                                 .rows = m->rows, .cols = m->cols, .codes = m->codes, .scales = m->scales,
                                 .biases = m->biases, .bias = l->bias};
    switch (m->type) {
    case SP_QTYPE_F32: w->elem = SP_CUDA_F32; break;
    case SP_QTYPE_F16: w->elem = SP_CUDA_F16; break;
    case SP_QTYPE_BF16: w->elem = SP_CUDA_BF16; break;
    case SP_QTYPE_MXFP4: w->fmt = SP_CUDA_FMT_MXFP4; break;
    case SP_QTYPE_NVFP4: w->fmt = SP_CUDA_FMT_NVFP4; break;
    case SP_QTYPE_MXFP8: w->fmt = SP_CUDA_FMT_MXFP8; break;
    case SP_QTYPE_Q2_K: w->fmt = SP_CUDA_FMT_Q2_K; break;
    case SP_QTYPE_Q3_K: w->fmt = SP_CUDA_FMT_Q3_K; break;
    case SP_QTYPE_Q4_K: w->fmt = SP_CUDA_FMT_Q4_K; break;
    case SP_QTYPE_Q5_K: w->fmt = SP_CUDA_FMT_Q5_K; break;
    case SP_QTYPE_Q6_K: w->fmt = SP_CUDA_FMT_Q6_K; break;
    case SP_QTYPE_IQ4_NL: w->fmt = SP_CUDA_FMT_IQ4_NL; break;
    case SP_QTYPE_IQ4_XS: w->fmt = SP_CUDA_FMT_IQ4_XS; break;
    default:
        w->fmt = SP_CUDA_FMT_AFFINE;
        float_of(m->scale_dtype, &w->scale_dt);
        break;
    }
    if (l->bias) float_of(l->bias_dtype, &w->bias_dt);
    if (!weight_memory(c, m->codes) || (m->scales && !weight_memory(c, m->scales)) ||
        (l->bias && !weight_memory(c, l->bias))) {
        fail(c, SP_ERR_STATE, "cuda: a weight in host memory reached an op (every linear goes through ops->prepare)");
        return false;
    }
    return true;
}

/* Copies l's arrays to the device once and points l at them. */
static enum sp_status cuda_prepare(struct sp_backend *b, struct sp_linear *l) {
    struct cuda *c = cuda_of(b);
    struct sp_qmat *m = &l->w;
    const struct sp_qtype_traits *tr = sp_qtype_traits(m->type);
    const char *name = tr->name;
    if (m->interleaved)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "cuda: a %lld x %lld %s matrix is in the CPU kernels' interleaved blocks of rows; load the "
                         "weights in row order (--row-order)",
                         (long long)m->rows, (long long)m->cols, name);
    if (l->transposed && tr->mode)
        return sp_errorf(SP_ERR_UNSUPPORTED, "cuda: a transposed %s matrix (only f32, f16 and bf16 can be)", name);
    enum sp_status st = sp_qtype_check_shape(m->type, m->group, m->cols);
    if (st != SP_OK) return st;
    enum sp_cuda_float f;
    if (tr->mode && tr->has_biases && (!float_of(m->scale_dtype, &f) || !m->biases))
        return sp_errorf(SP_ERR_UNSUPPORTED, "cuda: %s scales of type %s", name, sp_dtype_name(m->scale_dtype));
    if (l->bias && !float_of(l->bias_dtype, &f))
        return sp_errorf(SP_ERR_UNSUPPORTED, "cuda: a bias of type %s", sp_dtype_name(l->bias_dtype));
    size_t codes = (size_t)m->rows * sp_qtype_row_bytes(m->type, m->cols);
    size_t groups = tr->mode ? (size_t)m->rows * (size_t)(m->cols / m->group) * sp_dtype_size(scale_dtype(m)) : 0;
    const void *dc, *ds = NULL, *db = NULL, *dbias = NULL;
    if ((st = device_copy(c, m->codes, codes, &dc)) != SP_OK ||
        (tr->mode && (st = device_copy(c, m->scales, groups, &ds)) != SP_OK) ||
        (tr->has_biases && (st = device_copy(c, m->biases, groups, &db)) != SP_OK) ||
        (l->bias && (st = device_copy(c, l->bias, (size_t)m->rows * sp_dtype_size(l->bias_dtype), &dbias)) != SP_OK))
        return st;
    m->codes = dc;
    m->scales = ds;
    m->biases = db;
    l->bias = dbias;
    return SP_OK;
}

/* ---- memory ops ---- */

static enum sp_status cuda_arena(struct sp_backend *b, size_t bytes, void **out) {
    struct cuda *c = cuda_of(b);
    *out = NULL;
    if (c->n_arenas == (int)(sizeof c->arenas / sizeof *c->arenas))
        return sp_errorf(SP_ERR_STATE, "cuda: no room for another arena");
    if (!c->has_copy_stream) {
        cudaError_t e = cudaStreamCreateWithFlags(&c->copy_stream, cudaStreamNonBlocking);
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&c->ops_done, cudaEventDisableTiming)) != cudaSuccess)
            cudaStreamDestroy(c->copy_stream);
        if (e == cudaSuccess && (e = cudaEventCreateWithFlags(&c->copies_done, cudaEventDisableTiming)) != cudaSuccess) {
            cudaEventDestroy(c->ops_done);
            cudaStreamDestroy(c->copy_stream);
        }
        if (e != cudaSuccess) return sp_errorf(status_of(e), "cuda: a stream for copies: %s", cudaGetErrorString(e));
        c->has_copy_stream = true;
    }
    enum sp_status st = dev_alloc(c, bytes, out);
    if (st != SP_OK) return st;
    c->arenas[c->n_arenas].base = *out;
    c->arenas[c->n_arenas++].bytes = bytes;
    return SP_OK;
}

static enum sp_status cuda_pin(struct sp_backend *b, const void *p, size_t bytes) {
    struct cuda *c = cuda_of(b);
    if (c->n_pinned == c->cap_pinned) {
        int64_t cap = c->cap_pinned ? 2 * c->cap_pinned : 64;
        void **a = sp_realloc(c->pinned, (size_t)cap * sizeof *a);
        if (!a) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        c->pinned = a;
        c->cap_pinned = cap;
    }
    /* a file's read-only mapping registers only as read-only */
    cudaError_t e = cudaHostRegister((void *)p, bytes, cudaHostRegisterPortable);
    if (e != cudaSuccess) {
        cudaGetLastError();
        e = cudaHostRegister((void *)p, bytes, cudaHostRegisterPortable | cudaHostRegisterReadOnly);
    }
    if (e != cudaSuccess) {
        cudaGetLastError();
        return sp_errorf(status_of(e), "cuda: pinning %zu bytes of host memory: %s", bytes, cudaGetErrorString(e));
    }
    c->pinned[c->n_pinned++] = (void *)p;
    return SP_OK;
}

/* Host memory for the host's expert cache: 2 MiB pages, pinned so its copies to the device run at the link's speed. */
static void *cuda_host_alloc(size_t bytes, enum sp_mem_class cls) {
    void *p = sp_malloc_huge(bytes, cls);
    if (p && cudaHostRegister(p, bytes, cudaHostRegisterPortable) != cudaSuccess) {
        cudaGetLastError();  // pageable, then: slower copies, the same bytes
    }
    return p;
}

static void cuda_host_free(void *p) {
    if (!p) return;
    if (cudaHostUnregister(p) != cudaSuccess) cudaGetLastError();
    sp_free_aligned(p);
}

/* Into an arena, on the copy stream (not recorded: a step's graph
 * holds the stream's launches alone). */
static void cuda_upload(struct sp_backend *b, void *dst, const void *src, size_t bytes) {
    struct cuda *c = cuda_of(b);
    if (c->err || !bytes) return;
    end_recording(c);
    check(c, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, c->copy_stream), "copying an expert to the device");
}

/* What `later` queues from now on waits for what `first` holds now (ev marks it). */
static void wait_for(struct cuda *c, cudaStream_t later, cudaStream_t first, cudaEvent_t ev, const char *what) {
    if (c->err) return;
    end_recording(c);
    if (check(c, cudaEventRecord(ev, first), what)) check(c, cudaStreamWaitEvent(later, ev, 0), what);
}

static void cuda_copies_after_ops(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    wait_for(c, c->copy_stream, c->stream, c->ops_done, "ordering copies after the queued work");
}

static void cuda_ops_after_copies(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    wait_for(c, c->stream, c->copy_stream, c->copies_done, "ordering work after the queued copies");
}

static enum sp_status cuda_tensor(struct sp_backend *b, int64_t rows, int64_t cols, struct sp_tensor *out) {
    float *p;
    enum sp_status st = dev_floats(cuda_of(b), rows * cols, &p);
    if (st != SP_OK) return st;
    *out = (struct sp_tensor){p, rows, cols, cols};
    return SP_OK;
}

static enum sp_status cuda_vector(struct sp_backend *b, const struct sp_vector *v, const float **out) {
    struct cuda *c = cuda_of(b);
    float *h = sp_malloc((size_t)(v->n > 0 ? v->n : 1) * sizeof *h, SP_MEM_MISC), *d;
    if (!h) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_vector_to_f32(v, h);
    enum sp_status st = dev_floats(c, v->n, &d);
    if (st == SP_OK) {
        end_recording(c);
        cudaError_t e = cudaMemcpyAsync(d, h, (size_t)v->n * sizeof *h, cudaMemcpyHostToDevice, c->stream);
        if (e != cudaSuccess) st = sp_errorf(status_of(e), "cuda: copying a vector: %s", cudaGetErrorString(e));
    }
    sp_free(h);
    if (st == SP_OK) *out = d;
    return st;
}

static void cuda_write(struct sp_backend *b, struct sp_tensor t, const float *src) {
    struct cuda *c = cuda_of(b);
    if (c->err || t.rows <= 0 || t.cols <= 0) return;
    touched_t(c, t);
    end_recording(c);  // from pageable memory
    check(c, cudaMemcpy2DAsync(t.data, (size_t)t.ld * sizeof(float), src, (size_t)t.cols * sizeof(float),
                               (size_t)t.cols * sizeof(float), (size_t)t.rows, cudaMemcpyHostToDevice, c->stream),
          "write");
}

static float *cuda_host(struct sp_backend *b, struct sp_tensor t, float *staging) {
    struct cuda *c = cuda_of(b);
    size_t bytes = (size_t)(t.rows * t.cols) * sizeof(float);
    if (!c->err && t.rows > 0 && t.cols > 0) {
        end_recording(c);  // to pageable memory
        check(c, cudaMemcpy2DAsync(staging, (size_t)t.cols * sizeof(float), t.data, (size_t)t.ld * sizeof(float),
                                   (size_t)t.cols * sizeof(float), (size_t)t.rows, cudaMemcpyDeviceToHost, c->stream),
              "reading a tensor back");
        wait_queue(c);
    }
    if (c->err && bytes) memset(staging, 0, bytes);
    return staging;
}

static void cuda_sync(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    if (c->has_copy_stream) check(c, cudaStreamSynchronize(c->copy_stream), "copies to the device");
    wait_queue(c);
}

/* ---- sums over ranks ---- */

static bool cuda_parts_link(struct sp_backend *const *bs, int n) {
    if (n < 1 || n > SP_CUDA_PARTS_MAX) return false;
    for (int i = 0; i < n; i++)
        if (bs[i]->ops != &sp_cuda_backend_ops) return false;
    int was;
    if (cudaGetDevice(&was) != cudaSuccess) return false;
    bool ok = true;
    for (int i = 0; i < n && ok; i++)
        for (int j = 0; j < n && ok; j++) {
            int a = bs[i]->p.gpu, z = bs[j]->p.gpu, can = 0;
            if (a == z) continue;
            ok = cudaDeviceCanAccessPeer(&can, a, z) == cudaSuccess && can && cudaSetDevice(a) == cudaSuccess;
            cudaError_t e = ok ? cudaDeviceEnablePeerAccess(z, 0) : cudaSuccess;
            if (e == cudaErrorPeerAccessAlreadyEnabled) e = cudaSuccess;
            ok = ok && e == cudaSuccess;
        }
    cudaGetLastError();
    cudaSetDevice(was);
    return ok;
}

static const void *cuda_part_share(struct sp_backend *b, struct sp_tensor t) {
    struct cuda *c = cuda_of(b);
    struct part *p = &c->parts[c->part_turn];
    if (c->err) return NULL;
    end_recording(c);  // the other ranks wait for the part's event: the step goes on unrecorded
    if (!p->has_event) {
        if (!check(c, cudaEventCreateWithFlags(&p->copied, cudaEventDisableTiming), "an event for the ranks' sums"))
            return NULL;
        p->has_event = true;
    }
    if (!dev_reserve(c, (void **)&p->data, &p->cap, t.rows * t.cols, sizeof(float)) ||
        !check(c,
               cudaMemcpy2DAsync(p->data, (size_t)t.cols * sizeof(float), t.data, (size_t)t.ld * sizeof(float),
                                 (size_t)t.cols * sizeof(float), (size_t)t.rows, cudaMemcpyDeviceToDevice, c->stream),
               "a rank's part of a sum") ||
        !check(c, cudaEventRecord(p->copied, c->stream), "a rank's part of a sum"))
        return NULL;
    c->part_turn ^= 1;
    return p;
}

static void cuda_parts_add(struct sp_backend *b, struct sp_tensor t, const void *const *parts, int n) {
    struct cuda *c = cuda_of(b);
    if (c->err) return;
    if (n < 1 || n > SP_CUDA_PARTS_MAX) {
        fail(c, SP_ERR_ARG, "cuda: a sum of more ranks than it takes");
        return;
    }
    touched_t(c, t);
    struct sp_cuda_parts q = {.n = n};
    for (int j = 0; j < n; j++) {
        const struct part *p = parts[j];
        if (!check(c, cudaStreamWaitEvent(c->stream, p->copied, 0), "waiting for a rank's part of a sum")) return;
        q.part[j] = p->data;
    }
    check(c, (cudaError_t)sp_cuda_sum_parts(t.data, t.ld, &q, t.rows, t.cols, c->stream), "the ranks' sum");
}

static bool cuda_supports(const struct sp_backend *b, enum sp_op op, enum sp_qtype fmt) {
    return (unsigned)op < SP_OP_COUNT && (unsigned)fmt < SP_QTYPE_COUNT;
}

/* ---- KV cache ---- */

/* Bytes of one sequence's keys (or values) of one layer: n_ctx positions of
 * every KV head. */
static size_t kv_seq_bytes(const struct sp_backend_params *p) {
    const struct sp_backend_shape *s = &p->shape;
    return (size_t)p->n_ctx * (size_t)s->n_kv_heads * (size_t)s->head_dim * sp_dtype_size(sp_kv_dtype(p->kv_type));
}

size_t sp_cuda_kv_bytes(const struct sp_backend_params *p) {
    return (size_t)p->shape.n_kv_layers * 2 * (size_t)p->n_seq * kv_seq_bytes(p) + sp_backend_states_bytes(p);
}

/* Layer L's recurrent state in slot `slot`. */
static float *state_of(const struct cuda *c, int64_t L, int64_t slot) {
    return c->states + ((size_t)L * 2 * (size_t)c->base.p.n_seq + (size_t)slot) * (size_t)c->state_floats;
}

static void cuda_state_copy(struct sp_backend *b, int src, int dst) {
    struct cuda *c = cuda_of(b);
    if (c->err || src == dst) return;
    end_recording(c);  // between steps: a step that failed before its end is run as far as it got
    for (int64_t L = 0; L < c->shape.n_state_layers; L++)
        if (!check(c, cudaMemcpyAsync(state_of(c, L, dst), state_of(c, L, src), (size_t)c->state_floats * sizeof(float),
                                      cudaMemcpyDeviceToDevice, c->stream),
                   "copying a recurrent state"))
            return;
}

static size_t cuda_kv_bytes(const struct sp_backend *b) { return ((const struct cuda *)b)->kv_bytes; }

/* Positions are the outer index of a sequence's block, so its first n are
 * one run of bytes per layer and K / V. */
static void cuda_kv_copy_seq(struct sp_backend *b, int src, int dst, int64_t n) {
    struct cuda *c = cuda_of(b);
    if (c->err || src == dst || n <= 0) return;
    end_recording(c);  // as in cuda_state_copy
    size_t per = kv_seq_bytes(&c->base.p), row = per / (size_t)c->base.p.n_ctx;
    for (int64_t L = 0; L < c->shape.n_kv_layers * 2; L++) {
        char *base = (char *)c->kv + (size_t)L * (size_t)c->base.p.n_seq * per;
        if (!check(c, cudaMemcpyAsync(base + (size_t)dst * per, base + (size_t)src * per, (size_t)n * row,
                                      cudaMemcpyDeviceToDevice, c->stream),
                   "copying a sequence's cache"))
            return;
    }
}

/* ---- ops ---- */

/* The batch of bt fits the backend's buffers. */
static bool batch_fits(struct cuda *c, int64_t n) {
    if (n <= c->base.p.max_batch) return true;
    char msg[128];
    snprintf(msg, sizeof msg, "cuda: a batch of %lld rows (the backend was made for %lld)", (long long)n,
             (long long)c->base.p.max_batch);
    fail(c, SP_ERR_ARG, msg);
    return false;
}

static void cuda_embed(struct sp_backend *b, const struct sp_linear *e, const struct sp_batch *bt, struct sp_tensor x) {
    struct cuda *c = cuda_of(b);
    struct sp_cuda_weight w;
    int64_t n = bt->n;
    if (c->err || n <= 0 || !batch_fits(c, n) || !weight_of(c, e, &w)) return;
    begin_recording(c, n);
    touched_t(c, x);
    if (!upload(c, c->d_tok, bt->tokens, (size_t)n * sizeof(int32_t), "tokens") ||
        !upload(c, c->d_pos, bt->pos, (size_t)n * sizeof(int32_t), "positions") ||
        !upload(c, c->d_seq, bt->seq, (size_t)n * sizeof(int32_t), "sequences"))
        return;
    c->has_snap = bt->snapshot && c->d_snap;
    if (c->has_snap && !upload(c, c->d_snap, bt->snapshot, (size_t)n, "snapshot flags")) return;
    if (!check(c, (cudaError_t)sp_cuda_embed(&w, c->d_tok, n, x.data, x.ld, c->stream), "embed")) return;
    check(c, (cudaError_t)sp_cuda_rope_table(c->d_pos, n, c->inv_freq, c->shape.rot_dims, c->shape.rope_scale,
                                             c->rope_cs, c->stream),
          "RoPE angles");
}

/* Where a norm's (or attention's merge's) n rows of cols outputs are
 * rounded to int8 as they are written (qa, for the products that read them
 * next), or NULL: products with int8 activations read nearly every normed
 * row (attention's, routers' and experts' inputs) and attention's output,
 * and the rounding costs the kernel one more pass over a row it holds. */
static const struct sp_cuda_qx *norm_q(const struct cuda *c, int64_t n, int64_t cols) {
    return !c->float_acts && cols % SP_CUDA_QBLOCK == 0 && cols <= c->q_cols && n <= c->q_rows ? &c->qa : NULL;
}

/* qa now holds the n rows of out (where q is qa). */
static void norm_holds(struct cuda *c, const struct sp_cuda_qx *q, const float *out, int64_t ld, int64_t n,
                       int64_t cols) {
    if (q) c->qa_holds = (struct qtag){out, ld, n, cols};
}

static void cuda_rmsnorm(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor out) {
    struct cuda *c = cuda_of(b);
    if (c->err) return;
    touched_t(c, out);
    const struct sp_cuda_qx *q = norm_q(c, x.rows, x.cols);
    if (check(c, (cudaError_t)sp_cuda_rmsnorm(x.data, x.ld, NULL, w, eps, out.data, out.ld, x.rows, x.cols, q,
                                              c->stream),
              "rmsnorm"))
        norm_holds(c, q, out.data, out.ld, x.rows, x.cols);
}

static void cuda_add_rmsnorm(struct sp_backend *b, const float *w, float eps, struct sp_tensor x, struct sp_tensor r,
                             bool zero_r, struct sp_tensor out) {
    struct cuda *c = cuda_of(b);
    if (c->err) return;
    touched_t(c, x);
    touched_t(c, out);
    if (zero_r) touched_t(c, r);
    const struct sp_cuda_qx *q = norm_q(c, x.rows, x.cols);
    if (check(c, (cudaError_t)sp_cuda_add_rmsnorm(x.data, x.ld, r.data, r.ld, zero_r, w, eps, out.data, out.ld, x.rows,
                                                  x.cols, q, c->stream),
              "rmsnorm"))
        norm_holds(c, q, out.data, out.ld, x.rows, x.cols);
}

static void cuda_zero(struct sp_backend *b, struct sp_tensor t) {
    struct cuda *c = cuda_of(b);
    if (c->err || t.rows <= 0 || t.cols <= 0) return;
    touched_t(c, t);
    check(c, cudaMemset2DAsync(t.data, (size_t)t.ld * sizeof(float), 0, (size_t)t.cols * sizeof(float), (size_t)t.rows,
                               c->stream),
          "zero");
}

static void cuda_add(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src) {
    struct cuda *c = cuda_of(b);
    if (c->err) return;
    touched_t(c, dst);
    check(c, (cudaError_t)sp_cuda_add(dst.data, dst.ld, src.data, src.ld, dst.rows, dst.cols, c->stream), "add");
}

/* Whether products with w round their activations to int8: 4-bit codes
 * the int8 kernels read, unless the backend or the layer keeps them float. */
static bool int8_acts(const struct cuda *c, const struct sp_cuda_weight *w, bool float_activations) {
    return !c->float_acts && !float_activations && sp_cuda_q_ok(w) && w->cols <= c->q_cols;
}

/* q's rows from row r on. */
static struct sp_cuda_qx qx_rows(struct sp_cuda_qx q, int64_t r) {
    q.q += r * q.ldq;
    q.d += 2 * r * q.ldd;
    return q;
}

/* n rows of x (cols, ld apart) into q's rows from row r on. */
static bool quantize(struct cuda *c, const float *x, int64_t ldx, int64_t n, int64_t cols, const struct sp_cuda_qx *q,
                     int64_t r) {
    struct sp_cuda_qx at = qx_rows(*q, r);
    if (q == &c->qa) c->qa_holds = r == 0 ? (struct qtag){x, ldx, n, cols} : (struct qtag){0};
    return check(c, (cudaError_t)sp_cuda_quantize(x, ldx, n, cols, &at, c->stream), "int8 activations");
}

/* Whether qa holds the n rows of cols floats at x (ld apart). */
static bool qa_holds(const struct cuda *c, const float *x, int64_t ld, int64_t n, int64_t cols) {
    const struct qtag *t = &c->qa_holds;
    return t->src == x && t->ld == ld && n <= t->n && t->cols == cols;
}

/* y = l(x) on n rows of x (ld apart) into rows of y. */
static bool product(struct cuda *c, const struct sp_linear *l, const float *x, int64_t ldx, float *y, int64_t ldy,
                    int64_t n) {
    struct sp_cuda_weight w;
    if (!weight_of(c, l, &w)) return false;
    touched(c, y, n, ldy);
    if (!int8_acts(c, &w, l->float_activations))
        return check(c, (cudaError_t)sp_cuda_linear(&w, x, ldx, y, ldy, n, c->stream), "linear");
    if (qa_holds(c, x, ldx, n, w.cols))
        return check(c, (cudaError_t)sp_cuda_linear_q(&w, &c->qa, y, ldy, n, c->stream), "linear");
    for (int64_t t0 = 0; t0 < n; t0 += c->q_rows) {
        int64_t m = n - t0 < c->q_rows ? n - t0 : c->q_rows;
        if (!quantize(c, x + t0 * ldx, ldx, m, w.cols, &c->qa, 0) ||
            !check(c, (cudaError_t)sp_cuda_linear_q(&w, &c->qa, y + t0 * ldy, ldy, m, c->stream), "linear"))
            return false;
    }
    return true;
}

static void cuda_linear(struct sp_backend *b, const struct sp_linear *l, struct sp_tensor x, struct sp_tensor y) {
    struct cuda *c = cuda_of(b);
    if (!c->err) product(c, l, x.data, x.ld, y.data, y.ld, x.rows);
}

/* The attention kernels' view of layer ly and of the cache (the batch's
 * positions and sequences came with ops->embed). */
static void attn_of(const struct cuda *c, const struct sp_attn_layer *ly, struct sp_cuda_attn *a, struct sp_cuda_kv *kv) {
    const struct sp_backend_shape *s = &c->shape;
    *a = (struct sp_cuda_attn){.layer = ly->layer, .n_heads = s->n_heads, .n_kv_heads = s->n_kv_heads,
                               .head_dim = s->head_dim, .rot = s->rot_dims, .q_norm = ly->q_norm, .k_norm = ly->k_norm,
                               .sinks = ly->sinks, .window = ly->window, .eps = ly->eps, .rope_cs = c->rope_cs,
                               .pos = c->d_pos, .seq = c->d_seq};
    *kv = (struct sp_cuda_kv){c->kv, c->kv_dt, c->base.p.n_seq, c->base.p.n_ctx};
}

/* Attention after its first step (the heads normed, rotated and stored). */
static void attend(struct cuda *c, const struct sp_attn_layer *ly, const struct sp_batch *bt, struct sp_tensor qkv,
                   struct sp_tensor att, const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv) {
    const struct sp_backend_shape *s = &c->shape;
    int64_t n = bt->n, visible = 0;
    bool one_run = true;  // consecutive positions of one sequence
    for (int64_t t = 0; t < n; t++) {
        int64_t v = bt->pos[t] + 1;
        if (ly->window > 0 && v > ly->window) v = ly->window;
        if (v > visible) visible = v;
        one_run = one_run && bt->seq[t] == bt->seq[0] && bt->pos[t] == bt->pos[0] + t;
    }
    /* rounded to int8 as the heads are merged, for the output product */
    int64_t cols = s->n_heads * s->head_dim;
    const struct sp_cuda_qx *q = s->head_dim % SP_CUDA_QBLOCK == 0 ? norm_q(c, n, cols) : NULL;
    if (check(c, (cudaError_t)sp_cuda_attention(a, kv, qkv.data, qkv.ld, att.data, att.ld, n, visible, c->att_part,
                                                c->att_part_floats, c->att_done, q, one_run, c->stream),
              "attention"))
        norm_holds(c, q, att.data, att.ld, n, cols);
}

static void cuda_attention(struct sp_backend *b, const struct sp_attn_layer *ly, const struct sp_batch *bt,
                           struct sp_tensor qkv, struct sp_tensor att) {
    struct cuda *c = cuda_of(b);
    int64_t n = bt->n;
    if (c->err || n <= 0 || !batch_fits(c, n)) return;
    touched_t(c, qkv);
    touched_t(c, att);
    struct sp_cuda_attn a;
    struct sp_cuda_kv kv;
    attn_of(c, ly, &a, &kv);
    if (check(c, (cudaError_t)sp_cuda_attn_prologue(&a, &kv, qkv.data, qkv.ld, n, c->stream), "attention prologue"))
        attend(c, ly, bt, qkv, att, &a, &kv);
}

/* The products and the heads' first step in one launch where
 * sp_cuda_linear_heads takes them (a few tokens: the vector kernels),
 * h rounded into qa first where they read int8 and qa does not hold it;
 * else the products, then cuda_attention. */
static void cuda_linear_attention(struct sp_backend *b, const struct sp_linear *lq, const struct sp_linear *lk,
                                  const struct sp_linear *lv, struct sp_tensor h, const struct sp_attn_layer *ly,
                                  const struct sp_batch *bt, struct sp_tensor qkv, struct sp_tensor att) {
    struct cuda *c = cuda_of(b);
    int64_t n = bt->n, parts = lk ? 3 : 1;
    if (c->err || n <= 0 || !batch_fits(c, n)) return;
    const struct sp_linear *l[3] = {lq, lk, lv};
    struct sp_cuda_weight w[3];
    bool q = true, floats = true;  // every part reads int8 activations, or none does
    for (int64_t i = 0; i < parts; i++) {
        if (!weight_of(c, l[i], &w[i])) return;
        bool qi = int8_acts(c, &w[i], l[i]->float_activations);
        q = q && qi;
        floats = floats && !qi;
    }
    struct sp_cuda_attn a;
    struct sp_cuda_kv kv;
    attn_of(c, ly, &a, &kv);
    if ((q || floats) && sp_cuda_linear_heads_ok(w, (int)parts, q, &a, n)) {
        touched_t(c, qkv);
        touched_t(c, att);
        if (q && !qa_holds(c, h.data, h.ld, n, w[0].cols) && !quantize(c, h.data, h.ld, n, w[0].cols, &c->qa, 0)) return;
        if (check(c, (cudaError_t)sp_cuda_linear_heads(w, (int)parts, h.data, h.ld, q ? &c->qa : NULL, qkv.data,
                                                       qkv.ld, n, &a, &kv, c->heads_done, c->stream),
                  "attention's products"))
            attend(c, ly, bt, qkv, att, &a, &kv);
        return;
    }
    int64_t off = 0;
    for (int64_t i = 0; i < parts; i++) {
        if (!product(c, l[i], h.data, h.ld, qkv.data + off, qkv.ld, n)) return;
        off += w[i].rows;
    }
    cuda_attention(b, ly, bt, qkv, att);
}

static void cuda_gate(struct sp_backend *b, struct sp_tensor x, struct sp_tensor g) {
    struct cuda *c = cuda_of(b);
    if (c->err) return;
    touched_t(c, x);
    check(c, (cudaError_t)sp_cuda_gate(x.data, x.ld, g.data, g.ld, x.rows, x.cols, g.cols == 1, c->stream), "gate");
}

/* Recurrent layer L's states and the batch's positions, sequences and
 * snapshot flags (which came with ops->embed). */
static struct sp_cuda_states states_of(const struct cuda *c, int64_t L) {
    return (struct sp_cuda_states){.state = state_of(c, L, 0), .state_floats = c->state_floats,
                                   .n_seq = c->base.p.n_seq, .pos = c->d_pos, .seq = c->d_seq,
                                   .snapshot = c->has_snap ? c->d_snap : NULL};
}

static void cuda_gated_delta(struct sp_backend *b, const struct sp_delta_layer *ly, const struct sp_batch *bt,
                             struct sp_tensor qkv, struct sp_tensor z, struct sp_tensor ba, struct sp_tensor out) {
    struct cuda *c = cuda_of(b);
    const struct sp_backend_shape *s = &c->shape;
    int64_t n = bt->n;
    if (c->err || n <= 0 || !batch_fits(c, n)) return;
    touched_t(c, qkv);
    touched_t(c, out);
    struct sp_cuda_delta d = {.k_heads = s->lin_k_heads, .v_heads = s->lin_v_heads, .k_dim = s->lin_k_dim,
                              .v_dim = s->lin_v_dim, .conv = s->lin_conv, .conv_w = ly->conv, .a_log = ly->a_log,
                              .dt_bias = ly->dt_bias, .norm = ly->norm, .eps = ly->eps, .st = states_of(c, ly->layer)};
    check(c, (cudaError_t)sp_cuda_gated_delta(&d, qkv.data, qkv.ld, z.data, z.ld, ba.data, ba.ld, out.data, out.ld, n,
                                              c->stream),
          "Gated DeltaNet");
}

static void cuda_lightning(struct sp_backend *b, const struct sp_lightning_layer *ly, const struct sp_batch *bt,
                           struct sp_tensor qkv, struct sp_tensor out) {
    struct cuda *c = cuda_of(b);
    const struct sp_backend_shape *s = &c->shape;
    int64_t n = bt->n;
    if (c->err || n <= 0 || !batch_fits(c, n)) return;
    touched_t(c, qkv);
    touched_t(c, out);
    /* the batch's RoPE angles came with ops->embed */
    struct sp_cuda_lightning l = {.heads = s->lin_v_heads, .dim = s->lin_v_dim, .rot = s->rot_dims,
                                  .groups = ly->groups, .rope_cs = c->rope_cs, .q_norm = ly->q_norm,
                                  .k_norm = ly->k_norm, .decay = ly->decay, .norm = ly->norm, .eps = ly->eps,
                                  .st = states_of(c, ly->layer)};
    check(c, (cudaError_t)sp_cuda_lightning(&l, qkv.data, qkv.ld, out.data, out.ld, n, c->stream),
          "Lightning attention");
}

/* Item it one kernel at a time: gate and up (or gate_up) into its rows of
 * ff_a / ff_b, the activation into ff_b, then down into its rows of out. */
static void mlp_item(struct cuda *c, const struct sp_mlp_item *it, const struct sp_glu *act, struct sp_tensor out) {
    int64_t ld = c->shape.mlp_width, cnt = it->x.rows, ff = it->down->w.cols;
    float *fa = c->ff_a + it->row * ld, *fb = c->ff_b + it->row * ld;
    if (it->gate_up) {
        if (!product(c, it->gate_up, it->x.data, it->x.ld, fa, ld, cnt) ||
            !check(c, (cudaError_t)sp_cuda_glu(fb, ld, fa, NULL, ld, cnt, ff, act->alpha, act->limit, act->u_offset,
                                               c->stream),
                   "activation"))
            return;
    } else {
        if (!product(c, it->gate, it->x.data, it->x.ld, fa, ld, cnt) ||
            !product(c, it->up, it->x.data, it->x.ld, fb, ld, cnt) ||
            !check(c, (cudaError_t)sp_cuda_glu(fb, ld, fa, fb, ld, cnt, ff, act->alpha, act->limit, act->u_offset,
                                               c->stream),
                   "activation"))
            return;
    }
    product(c, it->down, fb, ld, out.data + it->row * out.ld, out.ld, cnt);
}

/* it's gate (or gate_up), up and down into w; whether the batched MLP
 * kernels take them. */
static bool vec_item(struct cuda *c, const struct sp_mlp_item *it, struct sp_cuda_weight w[3]) {
    if (it->gate_up) {
        if (!weight_of(c, it->gate_up, &w[0])) return false;
        w[1] = w[0];
    } else if (!weight_of(c, it->gate, &w[0]) || !weight_of(c, it->up, &w[1])) {
        return false;
    }
    if (!weight_of(c, it->down, &w[2])) return false;
    int64_t ff = w[2].cols;
    return sp_cuda_vec_ok(&w[0]) && sp_cuda_vec_ok(&w[1]) && sp_cuda_vec_ok(&w[2]) &&
           sp_cuda_same_format(&w[0], &w[1]) && w[0].rows == (it->gate_up ? 2 * ff : ff) && w[1].rows == w[0].rows;
}

/* The weights of an item of the batched kernels (w as vec_item fills it),
 * its rows still to set. */
static struct sp_cuda_mlp_item item_weights(const struct sp_cuda_weight w[3], bool fused) {
    return (struct sp_cuda_mlp_item){.codes = {w[0].codes, fused ? NULL : w[1].codes, w[2].codes},
                                     .scales = {w[0].scales, fused ? NULL : w[1].scales, w[2].scales},
                                     .biases = {w[0].biases, fused ? NULL : w[1].biases, w[2].biases},
                                     .bias = {w[0].bias, fused ? NULL : w[1].bias, w[2].bias},
                                     .ff = w[2].cols};
}

/* Tokens a block of r's kernels takes. */
static int mlp_tokens(const struct mlp_run *r) {
    return sp_cuda_mlp_tokens(r->max_n, r->q && sp_cuda_mma_ok(&r->gate) && sp_cuda_mma_ok(&r->down));
}

/* A run's activations as int8: each item's x into its rows of qa, then
 * (after gate and up) the rows of ff_b they wrote into qb. */
static bool quantize_items(struct cuda *c, const struct mlp_run *r) {
    for (int64_t i = r->first; i < r->first + r->count; i++) {
        const struct sp_cuda_mlp_item *d = &c->h_items[i];
        if (d->row == 0 && qa_holds(c, d->x, d->ldx, d->n, r->gate.cols)) continue;  // a norm's rows, rounded
        if (!quantize(c, d->x, d->ldx, d->n, r->gate.cols, &c->qa, d->row)) return false;
    }
    return true;
}

/* The items the batched kernels take are listed (consecutive ones of the
 * same formats in a run), uploaded in one copy, then each run is two
 * launches: gate, up and the activation into ff_b, then down into out
 * (with int8 activations, each preceded by their rounding). Other items
 * run one kernel at a time. */
static void cuda_mlp(struct sp_backend *b, const struct sp_mlp_item *items, int64_t n, const struct sp_glu *act,
                     struct sp_tensor out) {
    struct cuda *c = cuda_of(b);
    int64_t ld = c->shape.mlp_width, nv = 0, nr = 0;
    touched_t(c, out);
    for (int64_t i = 0; i < n && !c->err; i++) {
        const struct sp_mlp_item *it = &items[i];
        int64_t cnt = it->x.rows;
        if (cnt <= 0) continue;
        if (!batch_fits(c, it->row + cnt)) return;
        struct sp_cuda_weight w[3];
        if (nv == c->items_cap || !vec_item(c, it, w)) {
            if (!c->err) mlp_item(c, it, act, out);
            continue;
        }
        struct mlp_run *r = nr ? &c->runs[nr - 1] : NULL;
        bool fused = it->gate_up != NULL;
        if (!r || r->fused != fused || !sp_cuda_same_format(&r->gate, &w[0]) || !sp_cuda_same_format(&r->down, &w[2]) ||
            r->down.rows != w[2].rows) {
            r = &c->runs[nr++];
            *r = (struct mlp_run){.first = nv, .gate = w[0], .down = w[2], .fused = fused, .xvec = true,
                                  .q = int8_acts(c, &w[0], false) && int8_acts(c, &w[2], false)};
        }
        if (r->count == 0 || it->row < r->row_begin) r->row_begin = it->row;
        if (it->row + cnt > r->row_end) r->row_end = it->row + cnt;
        r->count++;
        r->max_n = cnt > r->max_n ? cnt : r->max_n;
        r->xvec = r->xvec && ((uintptr_t)it->x.data & 15) == 0 && it->x.ld % 4 == 0;
        struct sp_cuda_mlp_item *d = &c->h_items[nv++];
        *d = item_weights(w, fused);
        d->x = it->x.data, d->ldx = it->x.ld, d->n = cnt, d->row = d->xrow = it->row;
    }
    if (c->err || nv == 0) return;
    for (int64_t k = 0; k < nr; k++) {
        struct mlp_run *r = &c->runs[k];
        int nt = mlp_tokens(r);
        for (int64_t i = r->first; i < r->first + r->count; i++) {
            struct sp_cuda_mlp_item *d = &c->h_items[i];
            d->blk_gate_up = r->blocks_gate_up;
            d->blk_down = r->blocks_down;
            r->blocks_gate_up += sp_cuda_mlp_blocks(false, d->ff, d->n, nt);
            r->blocks_down += sp_cuda_mlp_blocks(true, r->down.rows, d->n, nt);
        }
    }
    if (!upload(c, c->d_items, c->h_items, (size_t)nv * sizeof *c->h_items, "MLP items")) return;
    for (int64_t k = 0; k < nr && !c->err; k++) {
        struct mlp_run *r = &c->runs[k];
        int nt = mlp_tokens(r);
        if (r->q && !quantize_items(c, r)) break;
        if (!check(c, (cudaError_t)sp_cuda_mlp_gate_up(&r->gate, r->fused, c->d_items + r->first, (int)r->count,
                                                        r->blocks_gate_up, nt, r->xvec, r->q ? &c->qa : NULL, c->ff_b,
                                                        ld, act->alpha, act->limit, act->u_offset, c->stream),
                   "MLP gate and up"))
            break;
        /* rows between the items' are quantized too, unread */
        if (r->q && !quantize(c, c->ff_b + r->row_begin * ld, ld, r->row_end - r->row_begin, r->down.cols, &c->qb,
                              r->row_begin))
            break;
        check(c, (cudaError_t)sp_cuda_mlp_down(&r->down, c->d_items + r->first, (int)r->count, r->blocks_down, nt,
                                               c->ff_b, ld, r->q ? &c->qb : NULL, out.data, out.ld, c->stream),
              "MLP down");
    }
}

static void cuda_gather(struct sp_backend *b, struct sp_tensor dst, struct sp_tensor src, const int32_t *rows) {
    struct cuda *c = cuda_of(b);
    if (c->err || dst.rows <= 0) return;
    touched_t(c, dst);
    if (!dev_reserve(c, (void **)&c->d_idx, &c->idx_cap, dst.rows, sizeof(int32_t)) ||
        !upload(c, c->d_idx, rows, (size_t)dst.rows * sizeof(int32_t), "gather rows"))
        return;
    check(c, (cudaError_t)sp_cuda_gather(dst.data, dst.ld, src.data, src.ld, c->d_idx, dst.rows, dst.cols, c->stream),
          "gather");
}

/* m's experts as items of the batched kernels, uploaded once; false (and
 * the table marked so) where some expert's weights are not all read by
 * those kernels or do not share the formats of the first (of this rank's). */
static struct moe_table *moe_table(struct cuda *c, const struct sp_moe *m) {
    struct moe_table *t = &c->moe[m->layer];
    if (t->built) return t->ok ? t : NULL;
    t->built = true;
    int64_t E = m->n_experts;
    struct sp_cuda_mlp_item *h = sp_calloc((size_t)E + 1, sizeof *h, SP_MEM_MISC);
    if (!h) return NULL;
    t->fused = m->gate_up != NULL;
    bool ok = true;
    for (int64_t e = 0; e < E && ok; e++) {
        if (m->owner && m->owner[e] != m->rank) continue;  // another rank's: never read here
        struct sp_mlp_item it = {t->fused ? NULL : &m->gate[e], t->fused ? NULL : &m->up[e],
                                 t->fused ? &m->gate_up[e] : NULL, &m->down[e], {0}, 0};
        struct sp_cuda_weight w[3];
        ok = vec_item(c, &it, w);
        ok = ok && (!t->gate.codes || (sp_cuda_same_format(&t->gate, &w[0]) &&
                                       sp_cuda_same_format(&t->down, &w[2]) && t->down.rows == w[2].rows &&
                                       !t->gate.bias == !w[1].bias));
        if (ok && !t->gate.codes) t->gate = w[0], t->down = w[2];
        h[e] = item_weights(w, t->fused);
    }
    ok = ok && t->gate.codes;  // no expert of the layer here: the host's path
    if (ok && m->shared_gate) {  // the shared expert rides along where the experts' kernels read it as they are
        struct sp_mlp_item it = {m->shared_gate, m->shared_up, NULL, m->shared_down, {0}, 0};
        struct sp_cuda_weight w[3];
        t->shared = !t->fused && vec_item(c, &it, w) && sp_cuda_same_format(&t->gate, &w[0]) &&
                    sp_cuda_same_format(&t->down, &w[2]) && t->down.rows == w[2].rows && !t->gate.bias == !w[1].bias;
        if (t->shared) h[E] = item_weights(w, false);
    }
    size_t bytes = (size_t)(E + t->shared) * sizeof *h, own_bytes = m->owner ? (size_t)E : 0;
    uint8_t *own = own_bytes ? sp_malloc(own_bytes, SP_MEM_MISC) : NULL;
    if (own_bytes && !own) ok = false;
    for (int64_t e = 0; own && e < E; e++) own[e] = m->owner[e] == m->rank;
    if (ok && dev_alloc(c, bytes + own_bytes, (void **)&t->d) != SP_OK) ok = false;
    if (ok) ok = upload(c, t->d, h, bytes, "expert table");
    if (ok && own) {
        t->own = (const uint8_t *)t->d + bytes;
        ok = upload(c, (void *)t->own, own, own_bytes, "the rank's experts");
    }
    sp_free(own);
    sp_free(h);
    t->ok = ok;
    return ok ? t : NULL;
}

/* Routing and the routed experts without the host: the router's product,
 * k_route, the pairs grouped by expert (k_moe_group; the shared expert,
 * where the table has it, as one more item of every token's row), their
 * rows gathered (as int8 rows straight from qa where a norm left h there),
 * the batched MLP kernels over a grid sized for the most items there can
 * be, then each token's results added in expert order, the shared
 * expert's last; moe_pairs rows (whole tokens) at a time. */
static bool cuda_moe(struct sp_backend *b, const struct sp_moe *m, struct sp_tensor h, const struct sp_glu *act,
                     struct sp_tensor out, bool *shared_done) {
    struct cuda *c = cuda_of(b);
    int64_t n = h.rows, d = h.cols, E = m->n_experts, K = m->k;
    bool group = m->route == SP_ROUTE_SIGMOID_GROUP_TOPK || m->route == SP_ROUTE_SOFTMAX_GROUP_TOPK;
    *shared_done = false;
    if (E > SP_CUDA_ROUTE_MAX_EXPERTS || E > c->shape.n_experts || K <= 0 || K > SP_CUDA_ROUTE_MAX_K || K > E ||
        K + 1 > c->moe_pairs || d != c->shape.d_model || m->router->w.rows != E || m->layer < 0 ||
        m->layer >= c->shape.n_layers ||
        (group && m->n_group > 1 && (E % m->n_group || m->topk_group * (E / m->n_group) < K)))
        return false;
    struct moe_table *t = moe_table(c, m);
    if (!t || t->down.cols > c->shape.expert_ff) return false;
    *shared_done = t->shared;
    touched_t(c, out);
    struct sp_cuda_route r = {.kind = (enum sp_cuda_route_kind)m->route, .n_experts = E, .k = K,
                              .n_group = m->n_group, .topk_group = m->topk_group, .norm_topk = m->norm_topk,
                              .routed_scale = m->routed_scale, .bias = m->bias};
    int64_t ff = t->down.cols, S = K + t->shared, slice = c->moe_pairs / S;
    bool q = int8_acts(c, &t->gate, false) && int8_acts(c, &t->down, false);
    bool mma = q && sp_cuda_mma_ok(&t->gate) && sp_cuda_mma_ok(&t->down);
    for (int64_t t0 = 0; t0 < n && !c->err; t0 += slice) {
        int64_t nt0 = n - t0 < slice ? n - t0 : slice, nk = nt0 * K, rows = nt0 * S;
        const float *x = h.data + t0 * h.ld;
        /* experts of half a tensor-core block of tokens on average or more: there, an expert's
         * weights are read once where the vector kernels' blocks of 8 tokens read them twice or
         * more (measured faster from there on the Ling-flash-2.0, gpt-oss and Qwen3 shapes) */
        int64_t avg = (nk + E - 1) / E;
        int nt = mma && 2 * avg >= SP_CUDA_MMA_TOKENS ? SP_CUDA_MMA_TOKENS : sp_cuda_mlp_tokens(avg, false);
        int64_t jblocks = sp_cuda_mlp_blocks(false, ff, 1, nt), rblocks = sp_cuda_mlp_blocks(true, t->down.rows, 1, nt);
        /* at most one item an expert used and a block of tokens more than an even share;
         * one token: a block an item, every item reading its row where it is (rounded into qa) */
        bool one = nt0 == 1;
        int64_t items = nk < E ? nk : E, token_blocks = items + (nk + nt - 1) / nt;
        if (t->shared) items++, token_blocks += (nt0 + nt - 1) / nt;
        if (one) token_blocks = items;
        bool from_qa = q && qa_holds(c, x, h.ld, nt0, d);
        const struct sp_cuda_qx *xq = !q ? NULL : from_qa && !one ? &c->qb : &c->qa;
        if (!product(c, m->router, x, h.ld, c->moe_logits, E, nt0) ||
            !check(c, (cudaError_t)sp_cuda_moe_group(&r, c->moe_logits, E, c->moe_sel, c->moe_w, nt0, t->d, t->own,
                                                      t->shared, one ? x : c->moe_x, one ? h.ld : d, one, nt, jblocks,
                                                      rblocks, items, c->moe_items, c->moe_rows, c->moe_ew,
                                                      c->moe_toff, c->moe_tlist, c->stream),
                   "routing and grouping by expert"))
            break;
        bool placed;  // the activations where the items read them
        if (one)
            placed = !q || from_qa || quantize(c, x, h.ld, 1, d, &c->qa, 0);
        else if (from_qa)
            placed = check(c, (cudaError_t)sp_cuda_gather_q(&c->qb, &c->qa, c->moe_rows, rows, d, c->stream),
                           "rows to experts");
        else
            placed = check(c, (cudaError_t)sp_cuda_gather(c->moe_x, d, x, h.ld, c->moe_rows, rows, d, c->stream),
                           "rows to experts") &&
                     (!q || quantize(c, c->moe_x, d, rows, d, &c->qa, 0));
        if (!placed) break;
        if (!check(c, (cudaError_t)sp_cuda_mlp_gate_up(&t->gate, t->fused, c->moe_items, (int)items,
                                                        jblocks * token_blocks, nt,
                                                        d % 4 == 0 && (!one || ((uintptr_t)x & 15) == 0), xq, c->moe_h, ff,
                                                        act->alpha, act->limit, act->u_offset, c->stream),
                   "experts' gate and up") ||
            (q && !quantize(c, c->moe_h, ff, rows, ff, &c->qb, 0)) ||
            !check(c, (cudaError_t)sp_cuda_mlp_down(&t->down, c->moe_items, (int)items, rblocks * token_blocks, nt,
                                                     c->moe_h, ff, q ? &c->qb : NULL, c->moe_y, d, c->stream),
                   "experts' down"))
            break;
        check(c, (cudaError_t)sp_cuda_scatter_add(out.data + t0 * out.ld, out.ld, c->moe_y, d, c->moe_toff,
                                                  c->moe_tlist, c->moe_ew, nt0, d, c->stream),
              "experts' results");
    }
    return true;
}

/* The sources of each row of out listed by row, in increasing order of
 * source (a counting sort), so each row takes its additions in order. */
static void cuda_scatter_add(struct sp_backend *b, struct sp_tensor out, struct sp_tensor src, const int32_t *rows,
                             const float *w) {
    struct cuda *c = cuda_of(b);
    int64_t m = src.rows, n = out.rows;
    if (c->err || m <= 0 || n <= 0) return;
    touched_t(c, out);
    if (!host_reserve(c, n + 1 + m) || !dev_reserve(c, (void **)&c->d_idx, &c->idx_cap, n + 1 + m, sizeof(int32_t)) ||
        !dev_reserve(c, (void **)&c->d_w, &c->w_cap, m, sizeof(float)))
        return;
    int32_t *off = c->h_idx, *list = c->h_idx + n + 1;
    memset(off, 0, (size_t)(n + 1) * sizeof *off);
    for (int64_t i = 0; i < m; i++) {
        if (rows[i] < 0 || rows[i] >= n) {
            fail(c, SP_ERR_ARG, "cuda: scatter_add: a row outside the output");
            return;
        }
        off[rows[i] + 1]++;
    }
    for (int64_t t = 0; t < n; t++) off[t + 1] += off[t];
    for (int64_t i = 0; i < m; i++) list[off[rows[i]]++] = (int32_t)i;
    for (int64_t t = n; t > 0; t--) off[t] = off[t - 1];  // back to where each row starts
    off[0] = 0;
    if (!upload(c, c->d_idx, c->h_idx, (size_t)(n + 1 + m) * sizeof(int32_t), "scatter rows") ||
        !upload(c, c->d_w, w, (size_t)m * sizeof(float), "scatter weights"))
        return;
    check(c, (cudaError_t)sp_cuda_scatter_add(out.data, out.ld, src.data, src.ld, c->d_idx, c->d_idx + n + 1, c->d_w, n,
                                              out.cols, c->stream),
          "scatter_add");
}

_Static_assert(SP_TOP_K_MAX == SP_CUDA_TOP_K_MAX, "the backend's best logits a row are the batch's");

/* The wanted rows LOGIT_ROWS at a time: normed into logit_rows, through
 * the head, then to the host: their logits, or where ids is set only each
 * row's greedy choice, or where top is, its k best logits (a few bytes a
 * row instead of the vocabulary's floats, and no pass over them on the
 * host). */
static int64_t head_rows(struct cuda *c, const float *norm, float eps, const struct sp_linear *head,
                         struct sp_tensor x, const bool *want, float *logits, int32_t *ids, int64_t kt,
                         struct sp_cand *top) {
    int64_t d = x.cols, V = head->w.rows, m = 0;
    if (V > c->shape.vocab) {
        fail(c, SP_ERR_ARG, "cuda: an lm_head wider than the vocabulary the backend was made for");
        return 0;
    }
    if (!host_reserve(c, x.rows)) return 0;
    for (int64_t t = 0; t < x.rows; t++)
        if (!want || want[t]) c->h_idx[m++] = (int32_t)t;
    if (!c->err && dev_reserve(c, (void **)&c->d_idx, &c->idx_cap, m, sizeof(int32_t)))
        upload(c, c->d_idx, c->h_idx, (size_t)m * sizeof(int32_t), "logits rows");
    /* through pinned memory: a copy to pageable memory runs at a fraction of the link's speed */
    uint64_t *best = (uint64_t *)(void *)c->logit_host;
    for (int64_t j0 = 0; j0 < m && !c->err; j0 += c->logit_cap) {
        int64_t k = m - j0 < c->logit_cap ? m - j0 : c->logit_cap;
        const struct sp_cuda_qx *q = norm_q(c, k, d);
        touched(c, c->logit_rows, k, d);
        if (!check(c, (cudaError_t)sp_cuda_rmsnorm(x.data, x.ld, c->d_idx + j0, norm, eps, c->logit_rows, d, k, d, q,
                                                   c->stream),
                   "final norm"))
            break;
        norm_holds(c, q, c->logit_rows, d, k, d);
        if (!product(c, head, c->logit_rows, d, c->logit_out, V, k)) break;
        if (ids) {
            if (check(c, (cudaError_t)sp_cuda_argmax(c->logit_out, V, k, V, c->d_best, c->stream), "greedy choice") &&
                check(c, cudaMemcpyAsync(best, c->d_best, (size_t)k * sizeof *best, cudaMemcpyDeviceToHost, c->stream),
                      "reading greedy choices back") &&
                wait_queue(c))
                for (int64_t i = 0; i < k; i++) ids[j0 + i] = sp_cuda_best_index(best[i]);
        } else if (top) {
            if (check(c, (cudaError_t)sp_cuda_top_k(c->logit_out, V, k, V, (int)kt, c->d_top_work, c->d_top, c->stream),
                      "best logits") &&
                check(c, cudaMemcpyAsync(c->h_top, c->d_top, (size_t)(k * kt) * sizeof *c->h_top,
                                         cudaMemcpyDeviceToHost, c->stream),
                      "reading best logits back") &&
                wait_queue(c))
                for (int64_t i = 0; i < k * kt; i++)
                    top[j0 * kt + i] = (struct sp_cand){sp_cuda_top_value(c->h_top[i]), sp_cuda_best_index(c->h_top[i])};
        } else if (check(c, cudaMemcpyAsync(c->logit_host, c->logit_out, (size_t)(k * V) * sizeof(float),
                                            cudaMemcpyDeviceToHost, c->stream),
                         "reading logits back") &&
                   wait_queue(c)) {
            memcpy(logits + j0 * V, c->logit_host, (size_t)(k * V) * sizeof(float));
        }
    }
    wait_queue(c);
    if (c->err && ids) memset(ids, 0, (size_t)m * sizeof *ids);
    else if (c->err && top) memset(top, 0, (size_t)(m * kt) * sizeof *top);
    else if (c->err) memset(logits, 0, (size_t)(m * V) * sizeof(float));
    return m;
}

static int64_t cuda_logits(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                           struct sp_tensor x, const bool *want, float *logits) {
    return head_rows(cuda_of(b), norm, eps, head, x, want, logits, NULL, 0, NULL);
}

static int64_t cuda_argmax(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                           struct sp_tensor x, const bool *want, int32_t *ids) {
    return head_rows(cuda_of(b), norm, eps, head, x, want, NULL, ids, 0, NULL);
}

static int64_t cuda_top_k(struct sp_backend *b, const float *norm, float eps, const struct sp_linear *head,
                          struct sp_tensor x, const bool *want, int64_t k, struct sp_cand *top) {
    return head_rows(cuda_of(b), norm, eps, head, x, want, NULL, NULL, k, top);
}

/* ---- bandwidth ---- */

enum sp_status sp_cuda_mem_info(size_t *free_bytes, size_t *total_bytes) {
    cudaError_t e = cudaMemGetInfo(free_bytes, total_bytes);
    if (e != cudaSuccess) return sp_errorf(status_of(e), "cuda: device memory: %s", cudaGetErrorString(e));
    return SP_OK;
}

/* The best of five device-to-device copies of bytes (after one to warm up). */
enum sp_status sp_cuda_copy_gbs(size_t bytes, double *gbs) {
    void *a = NULL, *b = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    cudaError_t e = cudaMalloc(&a, bytes);
    if (e == cudaSuccess) e = cudaMalloc(&b, bytes);
    if (e == cudaSuccess) e = cudaEventCreate(&e0);
    if (e == cudaSuccess) e = cudaEventCreate(&e1);
    float best = 0;
    for (int i = 0; i < 6 && e == cudaSuccess; i++) {
        float ms = 0;
        if ((e = cudaEventRecord(e0, 0)) != cudaSuccess || (e = cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, 0)) != cudaSuccess ||
            (e = cudaEventRecord(e1, 0)) != cudaSuccess || (e = cudaEventSynchronize(e1)) != cudaSuccess ||
            (e = cudaEventElapsedTime(&ms, e0, e1)) != cudaSuccess)
            break;
        if (i > 0 && (best == 0 || ms < best)) best = ms;
    }
    if (e0) cudaEventDestroy(e0);
    if (e1) cudaEventDestroy(e1);
    cudaFree(a);
    cudaFree(b);
    if (e != cudaSuccess) return sp_errorf(status_of(e), "cuda: measuring the copy bandwidth: %s", cudaGetErrorString(e));
    *gbs = best > 0 ? 2.0 * (double)bytes / (best / 1e3) / 1e9 : 0;
    return SP_OK;
}

/* ---- marks ---- */

#define MARKS 8192

static int cuda_mark(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    end_recording(c);  // times between ops are the queue's
    if (c->n_marks == MARKS) return -1;
    if (!c->marks && !(c->marks = sp_calloc(MARKS, sizeof *c->marks, SP_MEM_MISC))) return -1;
    if (c->n_marks == c->made_marks) {
        if (cudaEventCreate(&c->marks[c->n_marks]) != cudaSuccess) return -1;
        c->made_marks++;
    }
    if (cudaEventRecord(c->marks[c->n_marks], c->stream) != cudaSuccess) return -1;
    return c->n_marks++;
}

static double cuda_mark_seconds(struct sp_backend *b, int from, int to) {
    struct cuda *c = cuda_of(b);
    float ms = 0;
    if (from < 0 || to >= c->n_marks || cudaEventElapsedTime(&ms, c->marks[from], c->marks[to]) != cudaSuccess)
        return 0;
    return ms / 1e3;
}

static void cuda_marks_clear(struct sp_backend *b) { cuda_of(b)->n_marks = 0; }

static void cuda_graph_counts(const struct sp_backend *b, int64_t *replayed, int64_t *built) {
    const struct cuda *c = (const struct cuda *)b;
    *replayed = c->replayed;
    *built = c->built;
}

/* ---- the backend ---- */

static void cuda_destroy(struct sp_backend *b) {
    struct cuda *c = cuda_of(b);
    drop_recording(c);
    if (c->has_stream) {
        cudaStreamSynchronize(c->stream);
        cudaStreamDestroy(c->stream);
    }
    if (c->has_copy_stream) {
        cudaStreamSynchronize(c->copy_stream);
        cudaStreamDestroy(c->copy_stream);
        cudaEventDestroy(c->ops_done);
        cudaEventDestroy(c->copies_done);
    }
    for (int64_t n = 0; n <= GRAPH_TOKENS; n++)
        if (c->graph[n]) cudaGraphExecDestroy(c->graph[n]);
    if (c->stage) cudaFreeHost(c->stage);
    for (int i = 0; i < 2; i++)
        if (c->parts[i].has_event) cudaEventDestroy(c->parts[i].copied);
    for (int64_t i = 0; i < c->n_allocs; i++) cudaFree(c->allocs[i]);
    for (int64_t i = 0; i < c->n_pinned; i++) cudaHostUnregister(c->pinned[i]);
    sp_free(c->pinned);
    if (c->logit_host) cudaFreeHost(c->logit_host);
    sp_free(c->h_top);
    for (int i = 0; i < c->made_marks; i++) cudaEventDestroy(c->marks[i]);
    sp_free(c->marks);
    sp_free(c->allocs);
    sp_free(c->copies);
    sp_free(c->by_host.slots);
    sp_free(c->by_dev.slots);
    sp_free(c->h_idx);
    sp_free(c->h_items);
    sp_free(c->runs);
    sp_free(c->moe);
    sp_free(c);
}

/* Rows ops->moe takes at a time: a whole batch's routed pairs and a
 * shared expert's row a token, up to what the grouping kernel takes. */
static int64_t moe_pairs(const struct sp_backend_params *p) {
    int64_t k = p->shape.n_experts_used > 0 ? p->shape.n_experts_used : 1, pairs = p->max_batch * (k + 1);
    return pairs < SP_CUDA_MOE_MAX_PAIRS ? pairs : SP_CUDA_MOE_MAX_PAIRS;
}

/* Attention's scratch: ATT_PART_FLOATS, or one token's chunks at the
 * whole context where that is more. */
#define ATT_PART_FLOATS ((int64_t)8 << 20)
static int64_t att_part_floats(const struct sp_backend_params *p) {
    int64_t one = p->shape.n_heads * sp_cuda_attn_chunks(p->n_ctx) * (p->shape.head_dim + 2);
    return one > ATT_PART_FLOATS ? one : ATT_PART_FLOATS;
}

/* ... and its counters, one a chunk it can hold (sp_cuda_attention). */
static int64_t att_done_count(const struct sp_backend_params *p) {
    return att_part_floats(p) / (p->shape.head_dim + 2);
}

/* The int8 activation buffers: rows for a batch or ops->moe's pairs, of
 * the widest input a product has. */
static int64_t q_rows(const struct sp_backend_params *p) {
    int64_t P = p->shape.n_experts > 0 ? moe_pairs(p) : 0;
    return p->max_batch > P ? p->max_batch : P;
}

static int64_t q_cols(const struct sp_backend_params *p) {
    const struct sp_backend_shape *s = &p->shape;
    int64_t w = s->d_model;
    if (s->n_heads * s->head_dim > w) w = s->n_heads * s->head_dim;
    if (s->mlp_width > w) w = s->mlp_width;
    if (s->expert_ff > w) w = s->expert_ff;
    return (w + SP_CUDA_QBLOCK - 1) / SP_CUDA_QBLOCK * SP_CUDA_QBLOCK;
}

size_t sp_cuda_work_bytes(const struct sp_backend_params *p) {
    const struct sp_backend_shape *s = &p->shape;
    size_t B = (size_t)p->max_batch, L = B < LOGIT_ROWS ? B : LOGIT_ROWS;
    size_t floats = (size_t)(s->rot_dims / 2 + 1) + B * (size_t)(s->rot_dims > 0 ? s->rot_dims : 1) +
                    (size_t)att_part_floats(p) + (size_t)att_done_count(p) +
                    B * (size_t)(s->n_heads + s->n_kv_heads) +
                    2 * B * (size_t)s->mlp_width + L * (size_t)(s->d_model + s->vocab) + B;
    size_t moe = 0, P = (size_t)moe_pairs(p);
    if (s->n_experts > 0)  /* ops->moe's buffers and tables */
        moe = P * (size_t)(s->n_experts + 2 + 2 * s->d_model + s->expert_ff) * sizeof(float) +
              (4 * P + 1) * sizeof(int32_t) +
              (size_t)(s->n_layers + 1) * (size_t)(s->n_experts + 1) * sizeof(struct sp_cuda_mlp_item);
    size_t q = p->float_activations ? 0 : 2 * (size_t)(q_rows(p) * q_cols(p)) * (1 + 2 * sizeof(float) / SP_CUDA_QBLOCK);
    size_t top = L * (SP_TOP_K_MAX + (size_t)sp_cuda_top_k_scratch(s->vocab)) * sizeof(uint64_t);
    return floats * sizeof(float) + q + (5 * B + 2) * sizeof(int32_t) + L * sizeof(uint64_t) + top +
           (size_t)(s->n_experts + 2) * sizeof(struct sp_cuda_mlp_item) + moe;
}

enum sp_status sp_cuda_backend_create(const struct sp_backend_params *p, struct sp_backend **out) {
    *out = NULL;
    const struct sp_backend_shape *s = &p->shape;
    int devices = 0;
    cudaError_t e = cudaGetDeviceCount(&devices);
    if (e != cudaSuccess || devices == 0)
        return sp_errorf(SP_ERR_UNSUPPORTED, "no CUDA device: %s",
                         e != cudaSuccess ? cudaGetErrorString(e) : "the driver lists none");
    if (p->gpu < 0 || p->gpu >= devices)
        return sp_errorf(SP_ERR_ARG, "GPU %d: the CUDA driver lists %d (0 to %d)", p->gpu, devices, devices - 1);
    if ((e = cudaSetDevice(p->gpu)) != cudaSuccess)
        return sp_errorf(status_of(e), "cuda: GPU %d: %s", p->gpu, cudaGetErrorString(e));
    if (s->head_dim > SP_CUDA_MAX_HEAD_DIM || s->n_kv_heads <= 0 || s->n_heads % s->n_kv_heads != 0)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "cuda: %lld heads of %lld dimensions over %lld KV heads (at most %d dimensions, query heads a "
                         "multiple of KV heads)",
                         (long long)s->n_heads, (long long)s->head_dim, (long long)s->n_kv_heads, SP_CUDA_MAX_HEAD_DIM);
    struct cuda *c = sp_calloc(1, sizeof *c, SP_MEM_MODEL);
    if (!c) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    c->base.ops = &sp_cuda_backend_ops;
    c->base.p = *p;
    c->base.p.n_threads = 1;  // the host's share (routing, index lists) runs on the calling thread
    c->shape = *s;
    c->shape.inv_freq = NULL;
    c->kv_dt = p->kv_type == SP_KV_F32 ? SP_CUDA_F32 : p->kv_type == SP_KV_BF16 ? SP_CUDA_BF16 : SP_CUDA_F16;
    enum sp_status st = SP_OK;
    if ((e = cudaStreamCreateWithFlags(&c->stream, cudaStreamNonBlocking)) != cudaSuccess) {
        st = sp_errorf(status_of(e), "cuda: a stream: %s", cudaGetErrorString(e));
        goto fail;
    }
    c->has_stream = true;
    int64_t B = p->max_batch, half = s->rot_dims / 2;
    c->kv_bytes = sp_cuda_kv_bytes(p);
    if ((st = dev_alloc(c, c->kv_bytes, &c->kv)) != SP_OK) {
        sp_error_prefix("the KV cache (%lld positions x %d sequences): ", (long long)p->n_ctx, p->n_seq);
        goto fail;
    }
    if ((e = cudaMemsetAsync(c->kv, 0, c->kv_bytes ? c->kv_bytes : 1, c->stream)) != cudaSuccess) {
        st = sp_errorf(status_of(e), "cuda: clearing the KV cache: %s", cudaGetErrorString(e));
        goto fail;
    }
    if (s->n_state_layers > 0) {
        if (s->lin_k_dim > 1024 || s->lin_v_dim > 1024 || s->lin_v_heads % s->lin_k_heads) {
            st = sp_errorf(SP_ERR_UNSUPPORTED, "cuda: linear attention heads of %lld / %lld dims (at most 1024, value "
                           "heads a multiple of key heads)", (long long)s->lin_k_dim, (long long)s->lin_v_dim);
            goto fail;
        }
        c->state_floats = sp_backend_state_floats(s);
        c->states = (float *)((char *)c->kv + (c->kv_bytes - sp_backend_states_bytes(p)));
        if ((st = dev_alloc(c, (size_t)B, (void **)&c->d_snap)) != SP_OK) goto fail;
    }
    c->logit_cap = B < LOGIT_ROWS ? B : LOGIT_ROWS;
    c->att_part_floats = att_part_floats(p);
    c->idx_cap = 2 * B + 2;
    c->w_cap = B;
    if ((st = dev_floats(c, half, &c->inv_freq)) != SP_OK ||
        (st = dev_floats(c, B * s->rot_dims, &c->rope_cs)) != SP_OK ||
        (st = dev_floats(c, c->att_part_floats, &c->att_part)) != SP_OK ||
        (st = dev_floats(c, att_done_count(p), (float **)&c->att_done)) != SP_OK ||
        (st = dev_floats(c, B * (s->n_heads + s->n_kv_heads), (float **)&c->heads_done)) != SP_OK ||
        (st = dev_floats(c, B * s->mlp_width, &c->ff_a)) != SP_OK ||
        (st = dev_floats(c, B * s->mlp_width, &c->ff_b)) != SP_OK ||
        (st = dev_floats(c, c->logit_cap * s->d_model, &c->logit_rows)) != SP_OK ||
        (st = dev_floats(c, c->logit_cap * s->vocab, &c->logit_out)) != SP_OK ||
        (st = dev_alloc(c, (size_t)c->logit_cap * sizeof(uint64_t), (void **)&c->d_best)) != SP_OK ||
        (st = dev_alloc(c, (size_t)(c->logit_cap * SP_TOP_K_MAX) * sizeof(uint64_t), (void **)&c->d_top)) != SP_OK ||
        (st = dev_alloc(c, (size_t)(c->logit_cap * sp_cuda_top_k_scratch(s->vocab)) * sizeof(uint64_t),
                        (void **)&c->d_top_work)) != SP_OK ||
        (st = dev_floats(c, c->w_cap, &c->d_w)) != SP_OK ||
        (st = dev_alloc(c, (size_t)B * sizeof(int32_t), (void **)&c->d_tok)) != SP_OK ||
        (st = dev_alloc(c, (size_t)B * sizeof(int32_t), (void **)&c->d_pos)) != SP_OK ||
        (st = dev_alloc(c, (size_t)B * sizeof(int32_t), (void **)&c->d_seq)) != SP_OK ||
        (st = dev_alloc(c, (size_t)c->idx_cap * sizeof(int32_t), (void **)&c->d_idx)) != SP_OK)
        goto fail;
    c->float_acts = p->float_activations;
    c->q_rows = q_rows(p);
    c->q_cols = q_cols(p);
    for (int i = 0; i < 2 && !c->float_acts; i++) {
        struct sp_cuda_qx *q = i ? &c->qb : &c->qa;
        q->ldq = c->q_cols, q->ldd = c->q_cols / SP_CUDA_QBLOCK;
        if ((st = dev_alloc(c, (size_t)(c->q_rows * c->q_cols), (void **)&q->q)) != SP_OK ||
            (st = dev_floats(c, 2 * c->q_rows * q->ldd, &q->d)) != SP_OK)
            goto fail;
    }
    if (s->n_experts > 0) {
        int64_t E = s->n_experts, P = c->moe_pairs = moe_pairs(p);
        c->moe = sp_calloc((size_t)s->n_layers, sizeof *c->moe, SP_MEM_MISC);
        if (!c->moe) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            goto fail;
        }
        if ((st = dev_floats(c, P * E, &c->moe_logits)) != SP_OK || (st = dev_floats(c, P, &c->moe_w)) != SP_OK ||
            (st = dev_floats(c, P, &c->moe_ew)) != SP_OK || (st = dev_floats(c, P * s->d_model, &c->moe_x)) != SP_OK ||
            (st = dev_floats(c, P * s->d_model, &c->moe_y)) != SP_OK ||
            (st = dev_floats(c, P * s->expert_ff, &c->moe_h)) != SP_OK ||
            (st = dev_alloc(c, (size_t)(4 * P + 1) * sizeof(int32_t), (void **)&c->moe_sel)) != SP_OK ||
            (st = dev_alloc(c, (size_t)(E + 1) * sizeof *c->moe_items, (void **)&c->moe_items)) != SP_OK)
            goto fail;
        c->moe_rows = c->moe_sel + P;
        c->moe_tlist = c->moe_rows + P;
        c->moe_toff = c->moe_tlist + P;
    }
    c->h_top = sp_malloc((size_t)(c->logit_cap * SP_TOP_K_MAX) * sizeof *c->h_top, SP_MEM_MISC);
    if (!c->h_top) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((e = cudaMallocHost((void **)&c->logit_host, (size_t)(c->logit_cap * s->vocab) * sizeof(float))) !=
        cudaSuccess) {
        c->logit_host = NULL;
        st = sp_errorf(status_of(e), "cuda: %lld bytes of pinned memory for logits: %s",
                       (long long)(c->logit_cap * s->vocab * (int64_t)sizeof(float)), cudaGetErrorString(e));
        goto fail;
    }
    {  /* kernels overlap their predecessors' ends, products run on tensor cores, where the device can */
        int dev = 0, major = 0;
        if (cudaGetDevice(&dev) != cudaSuccess ||
            cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != cudaSuccess)
            major = 0;
        cudaGetLastError();
        sp_cuda_set_device(major, !p->no_overlap);
    }
    c->graphs = p->graphs;
    if (c->graphs && cudaMallocHost((void **)&c->stage, GRAPH_STAGE_BYTES) != cudaSuccess) {
        cudaGetLastError();  // steps run as they are queued
        c->stage = NULL;
        c->graphs = false;
    }
    c->items_cap = s->n_experts + 2;
    c->h_items = sp_calloc((size_t)c->items_cap, sizeof *c->h_items, SP_MEM_MISC);
    c->runs = sp_calloc((size_t)c->items_cap, sizeof *c->runs, SP_MEM_MISC);
    if (!c->h_items || !c->runs) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if ((st = dev_alloc(c, (size_t)c->items_cap * sizeof *c->d_items, (void **)&c->d_items)) != SP_OK) goto fail;
    if (half && (e = cudaMemcpyAsync(c->inv_freq, s->inv_freq, (size_t)half * sizeof(float), cudaMemcpyHostToDevice,
                                     c->stream)) != cudaSuccess) {
        st = sp_errorf(status_of(e), "cuda: RoPE frequencies: %s", cudaGetErrorString(e));
        goto fail;
    }
    *out = &c->base;
    return SP_OK;
fail:
    cuda_destroy(&c->base);
    return st;
}

static void cuda_bind(struct sp_backend *b) { cudaSetDevice(b->p.gpu); }

const struct sp_backend_ops sp_cuda_backend_ops = {
    .name = "cuda",
    .destroy = cuda_destroy,
    .bind = cuda_bind,
    .supports = cuda_supports,
    .tensor = cuda_tensor,
    .vector = cuda_vector,
    .prepare = cuda_prepare,
    .host_alloc = cuda_host_alloc,
    .host_free = cuda_host_free,
    .arena = cuda_arena,
    .pin = cuda_pin,
    .upload = cuda_upload,
    .copies_after_ops = cuda_copies_after_ops,
    .ops_after_copies = cuda_ops_after_copies,
    .write = cuda_write,
    .host = cuda_host,
    .sync = cuda_sync,
    .parts_link = cuda_parts_link,
    .part_share = cuda_part_share,
    .parts_add = cuda_parts_add,
    .error = cuda_error,
    .mark = cuda_mark,
    .mark_seconds = cuda_mark_seconds,
    .marks_clear = cuda_marks_clear,
    .graph_counts = cuda_graph_counts,
    .kv_bytes = cuda_kv_bytes,
    .kv_copy_seq = cuda_kv_copy_seq,
    .state_copy = cuda_state_copy,
    .gate = cuda_gate,
    .gated_delta = cuda_gated_delta,
    .lightning = cuda_lightning,
    .embed = cuda_embed,
    .rmsnorm = cuda_rmsnorm,
    .add_rmsnorm = cuda_add_rmsnorm,
    .zero = cuda_zero,
    .add = cuda_add,
    .linear = cuda_linear,
    .attention = cuda_attention,
    .linear_attention = cuda_linear_attention,
    .mlp = cuda_mlp,
    .gather = cuda_gather,
    .scatter_add = cuda_scatter_add,
    .moe = cuda_moe,
    .logits = cuda_logits,
    .argmax = cuda_argmax,
    .top_k = cuda_top_k,
};
