/* backend.c - the backends this build has, and what every backend shares:
 * names, the KV types, and facts about weights read from their headers. */
#include "backend/backend.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/cpu.h"
#if SP_CUDA
#include "backend/cuda/cuda.h"
#endif

double sp_linear_bytes(const struct sp_linear *l) {
    return (double)sp_qtype_matrix_bytes(l->w.type, l->w.group, l->w.scale_dtype, l->w.rows, l->w.cols);
}

int sp_linear_parts(const struct sp_linear *l, const void **ptr, size_t *len) {
    const struct sp_qmat *w = &l->w;
    const struct sp_qtype_traits *tr = sp_qtype_traits(w->type);
    int n = 0;
    /* a transposed matrix (floats only) is stored (cols, rows) */
    ptr[n] = w->codes;
    len[n++] = l->transposed ? (size_t)w->cols * sp_qtype_row_bytes(w->type, w->rows)
                             : (size_t)w->rows * sp_qtype_row_bytes(w->type, w->cols);
    if (tr->mode && !tr->block_bytes) {  // a block format's scales are in its codes
        enum sp_dtype sd = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : w->scale_dtype;
        size_t s = (size_t)w->rows * (size_t)(w->cols / w->group) * sp_dtype_size(sd);
        ptr[n] = w->scales;
        len[n++] = s;
        if (tr->has_biases) {
            ptr[n] = w->biases;
            len[n++] = s;
        }
    }
    if (l->bias) {
        ptr[n] = l->bias;
        len[n++] = (size_t)w->rows * sp_dtype_size(l->bias_dtype);
    }
    return n;
}

void sp_vector_to_f32(const struct sp_vector *v, float *out) {
    for (int64_t i = 0; i < v->n; i++) out[i] = sp_dtype_load_float(v->dtype, v->data, (size_t)i);
}

static const char *const kv_names[SP_KV_TYPE_COUNT] = {"f16", "bf16", "f32"};
static const char *const device_names[SP_DEVICE_COUNT] = {"cpu", "cuda"};

/* The index of name among names[0 .. n), or -1. */
static int index_of(const char *name, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(name, names[i]) == 0) return i;
    return -1;
}

const char *sp_kv_type_name(enum sp_kv_type t) { return (unsigned)t < SP_KV_TYPE_COUNT ? kv_names[t] : "?"; }

bool sp_kv_type_from_name(const char *name, enum sp_kv_type *out) {
    int i = index_of(name, kv_names, SP_KV_TYPE_COUNT);
    if (i >= 0) *out = (enum sp_kv_type)i;
    return i >= 0;
}

enum sp_dtype sp_kv_dtype(enum sp_kv_type t) {
    return t == SP_KV_F32 ? SP_DTYPE_F32 : t == SP_KV_BF16 ? SP_DTYPE_BF16 : SP_DTYPE_F16;
}

const char *sp_device_name(enum sp_device d) { return (unsigned)d < SP_DEVICE_COUNT ? device_names[d] : "?"; }

bool sp_device_from_name(const char *name, enum sp_device *out) {
    int i = index_of(name, device_names, SP_DEVICE_COUNT);
    if (i >= 0) *out = (enum sp_device)i;
    return i >= 0;
}

const char *sp_op_name(enum sp_op op) {
    static const char *const n[SP_OP_COUNT] = {"embed", "rmsnorm", "zero", "add", "linear", "attention",
                                               "mlp", "gather", "scatter_add", "logits"};
    return (unsigned)op < SP_OP_COUNT ? n[op] : "?";
}

const struct sp_backend_ops *sp_backend_ops(enum sp_device d) {
    if (d == SP_DEVICE_CPU) return &sp_cpu_backend_ops;
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return &sp_cuda_backend_ops;
#endif
    return NULL;
}

enum sp_status sp_backend_create(enum sp_device d, const struct sp_backend_params *p, struct sp_backend **out) {
    *out = NULL;
    if (!sp_backend_ops(d))
        return sp_errorf(SP_ERR_ARG, "this build of sparrow has no %s backend (build with make CUDA=1 on a machine with nvcc)",
                         sp_device_name(d));
    if (p->max_batch <= 0 || p->n_ctx <= 0 || p->n_seq <= 0)
        return sp_errorf(SP_ERR_ARG, "backend: %lld tokens a batch, %lld positions, %d sequences (each must be positive)",
                         (long long)p->max_batch, (long long)p->n_ctx, p->n_seq);
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return sp_cuda_backend_create(p, out);
#endif
    return sp_cpu_backend_create(p, out);
}

void sp_backend_free(struct sp_backend *b) {
    if (b) b->ops->destroy(b);
}

enum sp_status sp_backend_copy_gbs(enum sp_device d, size_t bytes, double *gbs) {
    *gbs = 0;
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return sp_cuda_copy_gbs(bytes, gbs);
#endif
    return sp_errorf(SP_ERR_UNSUPPORTED, "no copy bandwidth measure for the %s device", sp_device_name(d));
}

int64_t sp_backend_state_floats(const struct sp_backend_shape *s) {
    int64_t conv = 2 * s->lin_k_heads * s->lin_k_dim + s->lin_v_heads * s->lin_v_dim;
    return (s->lin_conv - 1) * conv + s->lin_v_heads * s->lin_k_dim * s->lin_v_dim;
}

size_t sp_backend_states_bytes(const struct sp_backend_params *p) {
    if (p->shape.n_state_layers <= 0) return 0;
    return (size_t)p->shape.n_state_layers * 2 * (size_t)p->n_seq * (size_t)sp_backend_state_floats(&p->shape) *
           sizeof(float);
}

size_t sp_backend_kv_bytes(enum sp_device d, const struct sp_backend_params *p) {
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return sp_cuda_kv_bytes(p);
#endif
    return d == SP_DEVICE_CPU ? sp_cpu_kv_bytes(p) : 0;
}

enum sp_status sp_backend_mem_info(enum sp_device d, size_t *free_bytes, size_t *total_bytes) {
    *free_bytes = *total_bytes = 0;
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return sp_cuda_mem_info(free_bytes, total_bytes);
#endif
    return sp_errorf(SP_ERR_UNSUPPORTED, "no device memory to ask of the %s device", sp_device_name(d));
}

size_t sp_backend_work_bytes(enum sp_device d, const struct sp_backend_params *p, const struct sp_qmat *widest) {
#if SP_CUDA
    if (d == SP_DEVICE_CUDA) return sp_cuda_work_bytes(p);
#endif
    return d == SP_DEVICE_CPU ? sp_cpu_work_bytes(p, widest) : 0;
}

/* ---- a row's best logits ---- */

int sp_cand_cmp(const void *a, const void *b) {
    const struct sp_cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* v[i] as a candidate: NaN as -inf, -0 as +0 (equal, and one bit pattern for either) */
static struct sp_cand cand_of(const float *v, int64_t i) {
    return (struct sp_cand){isnan(v[i]) ? -INFINITY : v[i] == 0.0f ? 0.0f : v[i], (int32_t)i};
}

/* One pass with a min-heap of the k best seen (the worst at the root): a
 * later value enters only if larger than the root, as an equal one has a
 * larger index. */
void sp_top_k(const float *v, int64_t n, int64_t k, struct sp_cand *c) {
    if (k >= n) {
        for (int64_t i = 0; i < n; i++) c[i] = cand_of(v, i);
        qsort(c, (size_t)n, sizeof *c, sp_cand_cmp);
        return;
    }
    for (int64_t i = 0; i < k; i++) {  // sift up
        struct sp_cand x = cand_of(v, i);
        int64_t j = i;
        while (j > 0 && sp_cand_cmp(&c[(j - 1) / 2], &x) < 0) {
            c[j] = c[(j - 1) / 2];
            j = (j - 1) / 2;
        }
        c[j] = x;
    }
    for (int64_t i = k; i < n; i++) {
        if (!(v[i] > c[0].logit)) continue;
        struct sp_cand x = cand_of(v, i);
        int64_t j = 0;  // sift down from the root
        for (;;) {
            int64_t l = 2 * j + 1, r = l + 1, w = j;
            const struct sp_cand *wc = &x;
            if (l < k && sp_cand_cmp(&c[l], wc) > 0) w = l, wc = &c[l];
            if (r < k && sp_cand_cmp(&c[r], wc) > 0) w = r;
            if (w == j) break;
            c[j] = c[w];
            j = w;
        }
        c[j] = x;
    }
    qsort(c, (size_t)k, sizeof *c, sp_cand_cmp);
}
