/*
 * synth.c - random-weight model folders in the Hugging Face layout of each
 * architecture. The names written here are the ones each architecture's
 * reference implementation saves with save_pretrained.
 */
#include "model/synth.h"

#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/json.h"
#include "core/pool.h"
#include "core/rng.h"
#include "format/st_writer.h"
#include "model/arch.h"

/* INIT_EMBED: as INIT_NORMAL, std 1 for balanced routing; INIT_ROUTER_BIAS:
 * as INIT_SMALL, zero for balanced routing (synth.h). */
enum init { INIT_NORMAL, INIT_EMBED, INIT_ONES, INIT_SMALL, INIT_ROUTER_BIAS };

struct planned {
    char name[160];
    int ndim;
    int64_t shape[3];
    enum init init;
    enum sp_dtype dtype;
};

struct plan {
    struct planned *v;
    int64_t n, cap;
    enum sp_dtype dtype;
    enum sp_status st;
};

static void add(struct plan *p, enum init init, int ndim, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...)
    __attribute__((format(printf, 7, 8)));

static void add(struct plan *p, enum init init, int ndim, int64_t d0, int64_t d1, int64_t d2, const char *fmt, ...) {
    if (p->st != SP_OK) return;
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 256;
        size_t bytes = (size_t)cap * sizeof *p->v;
        struct planned *v = p->v ? sp_realloc(p->v, bytes) : sp_malloc(bytes, SP_MEM_MISC);
        if (!v) {
            p->st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            return;
        }
        p->v = v;
        p->cap = cap;
    }
    struct planned *t = &p->v[p->n++];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(t->name, sizeof t->name, fmt, ap);
    va_end(ap);
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->shape[2] = d2;
    t->init = init;
    t->dtype = p->dtype;
}

#define VEC(init, n, ...) add(p, init, 1, n, 0, 0, __VA_ARGS__)
#define MAT(r, c, ...) add(p, INIT_NORMAL, 2, r, c, 0, __VA_ARGS__)

/* The tensors of one architecture, in the Hugging Face layout. */
static void plan_model(struct plan *p, const struct sp_arch *a) {
    bool bailing = a->id == SP_ARCH_BAILING_MOE || a->id == SP_ARCH_BAILING_HYBRID, gpt_oss = a->id == SP_ARCH_GPT_OSS;
    bool wrapped = a->id == SP_ARCH_QWEN3_5_MOE;  // a vision-language wrapper's text model
    int64_t d = a->d_model, hd = a->head_dim, q = a->n_heads * hd, kv = a->n_kv_heads * hd;
    enum init norm = a->norm_offset ? INIT_SMALL : INIT_ONES;  // (1 + w) norms: w near 0
    const char *top = wrapped ? "model.language_model." : "model.";
    add(p, INIT_EMBED, 2, a->vocab, d, 0, bailing ? "model.word_embeddings.weight" : "%sembed_tokens.weight", top);
    for (int64_t L = 0; L < a->n_layers; L++) {
        const char *pre = wrapped ? "model.language_model.layers." : "model.layers.";
        VEC(norm, d, "%s%lld.input_layernorm.weight", pre, (long long)L);
        VEC(norm, d, "%s%lld.post_attention_layernorm.weight", pre, (long long)L);
        if (a->layer_kind[L] == SP_LAYER_GATED_DELTA) {
            int64_t conv = sp_arch_conv_dim(a), vd = a->lin_v_heads * a->lin_v_dim;
            MAT(conv, d, "%s%lld.linear_attn.in_proj_qkv.weight", pre, (long long)L);
            MAT(vd, d, "%s%lld.linear_attn.in_proj_z.weight", pre, (long long)L);
            MAT(a->lin_v_heads, d, "%s%lld.linear_attn.in_proj_b.weight", pre, (long long)L);
            MAT(a->lin_v_heads, d, "%s%lld.linear_attn.in_proj_a.weight", pre, (long long)L);
            add(p, INIT_SMALL, 3, conv, 1, a->lin_conv, "%s%lld.linear_attn.conv1d.weight", pre, (long long)L);
            VEC(INIT_SMALL, a->lin_v_heads, "%s%lld.linear_attn.A_log", pre, (long long)L);
            VEC(INIT_SMALL, a->lin_v_heads, "%s%lld.linear_attn.dt_bias", pre, (long long)L);
            VEC(INIT_ONES, a->lin_v_dim, "%s%lld.linear_attn.norm.weight", pre, (long long)L);
            MAT(d, vd, "%s%lld.linear_attn.out_proj.weight", pre, (long long)L);
        } else if (a->layer_kind[L] == SP_LAYER_MLA) {
            int64_t H = a->n_heads, qk = a->mla_nope + a->mla_rope, kvl = a->mla_kv_lora;
            if (a->mla_q_lora) {
                MAT(a->mla_q_lora, d, "%s%lld.attention.q_a_proj.weight", pre, (long long)L);
                VEC(INIT_ONES, a->mla_q_lora, "%s%lld.attention.q_a_layernorm.weight", pre, (long long)L);
                MAT(H * qk, a->mla_q_lora, "%s%lld.attention.q_b_proj.weight", pre, (long long)L);
            } else {
                MAT(H * qk, d, "%s%lld.attention.q_proj.weight", pre, (long long)L);
            }
            MAT(kvl + a->mla_rope, d, "%s%lld.attention.kv_a_proj_with_mqa.weight", pre, (long long)L);
            VEC(INIT_ONES, kvl, "%s%lld.attention.kv_a_layernorm.weight", pre, (long long)L);
            MAT(H * (a->mla_nope + a->mla_v), kvl, "%s%lld.attention.kv_b_proj.weight", pre, (long long)L);
            MAT(d, H * a->mla_v, "%s%lld.attention.dense.weight", pre, (long long)L);
        } else if (bailing) {
            MAT(q + 2 * kv, d, "%s%lld.attention.query_key_value.weight", pre, (long long)L);
            if (a->qkv_bias) VEC(INIT_SMALL, q + 2 * kv, "%s%lld.attention.query_key_value.bias", pre, (long long)L);
            MAT(d, q, "%s%lld.attention.dense.weight", pre, (long long)L);
            if (a->o_bias) VEC(INIT_SMALL, d, "%s%lld.attention.dense.bias", pre, (long long)L);
            if (a->qk_norm) {
                VEC(INIT_ONES, hd, "%s%lld.attention.query_layernorm.weight", pre, (long long)L);
                VEC(INIT_ONES, hd, "%s%lld.attention.key_layernorm.weight", pre, (long long)L);
            }
            if (a->layer_kind[L] == SP_LAYER_LIGHTNING) {
                MAT(q, d, "%s%lld.attention.g_proj.weight", pre, (long long)L);
                VEC(INIT_ONES, q, "%s%lld.attention.g_norm.weight", pre, (long long)L);
            }
        } else {
            static const char *const qkv[3] = {"q", "k", "v"};
            for (int i = 0; i < 3; i++) {
                int64_t rows = i == 0 ? (a->attn_gate ? 2 * q : q) : kv;
                MAT(rows, d, "%s%lld.self_attn.%s_proj.weight", pre, (long long)L, qkv[i]);
                if (a->qkv_bias) VEC(INIT_SMALL, rows, "%s%lld.self_attn.%s_proj.bias", pre, (long long)L, qkv[i]);
            }
            MAT(d, q, "%s%lld.self_attn.o_proj.weight", pre, (long long)L);
            if (a->o_bias) VEC(INIT_SMALL, d, "%s%lld.self_attn.o_proj.bias", pre, (long long)L);
            if (a->qk_norm) {
                VEC(norm, hd, "%s%lld.self_attn.q_norm.weight", pre, (long long)L);
                VEC(norm, hd, "%s%lld.self_attn.k_norm.weight", pre, (long long)L);
            }
            if (a->attn_sinks) VEC(INIT_SMALL, a->n_heads, "%s%lld.self_attn.sinks", pre, (long long)L);
        }
        if (!a->layer_moe[L]) {
            MAT(a->d_ff, d, "%s%lld.mlp.gate_proj.weight", pre, (long long)L);
            MAT(a->d_ff, d, "%s%lld.mlp.up_proj.weight", pre, (long long)L);
            MAT(d, a->d_ff, "%s%lld.mlp.down_proj.weight", pre, (long long)L);
            continue;
        }
        int64_t E = a->n_experts, ff = a->d_expert;
        if (gpt_oss) {
            MAT(E, d, "%s%lld.mlp.router.weight", pre, (long long)L);
            VEC(INIT_ROUTER_BIAS, E, "%s%lld.mlp.router.bias", pre, (long long)L);
            add(p, INIT_NORMAL, 3, E, d, 2 * ff, "%s%lld.mlp.experts.gate_up_proj", pre, (long long)L);
            add(p, INIT_SMALL, 2, E, 2 * ff, 0, "%s%lld.mlp.experts.gate_up_proj_bias", pre, (long long)L);
            add(p, INIT_NORMAL, 3, E, ff, d, "%s%lld.mlp.experts.down_proj", pre, (long long)L);
            add(p, INIT_SMALL, 2, E, d, 0, "%s%lld.mlp.experts.down_proj_bias", pre, (long long)L);
            continue;
        }
        MAT(E, d, "%s%lld.mlp.gate.weight", pre, (long long)L);
        if (bailing) {
            enum sp_dtype keep = p->dtype;
            p->dtype = SP_DTYPE_F32;  // the reference keeps expert_bias in float32
            VEC(INIT_ROUTER_BIAS, E, "%s%lld.mlp.gate.expert_bias", pre, (long long)L);
            p->dtype = keep;
        }
        for (int64_t e = 0; e < E; e++) {
            MAT(ff, d, "%s%lld.mlp.experts.%lld.gate_proj.weight", pre, (long long)L, (long long)e);
            MAT(ff, d, "%s%lld.mlp.experts.%lld.up_proj.weight", pre, (long long)L, (long long)e);
            MAT(d, ff, "%s%lld.mlp.experts.%lld.down_proj.weight", pre, (long long)L, (long long)e);
        }
        if (a->n_shared_experts > 0) {
            int64_t sh = a->d_shared;
            const char *mod = a->shared_gate ? "shared_expert" : "shared_experts";
            MAT(sh, d, "%s%lld.mlp.%s.gate_proj.weight", pre, (long long)L, mod);
            MAT(sh, d, "%s%lld.mlp.%s.up_proj.weight", pre, (long long)L, mod);
            MAT(d, sh, "%s%lld.mlp.%s.down_proj.weight", pre, (long long)L, mod);
            if (a->shared_gate) MAT(1, d, "%s%lld.mlp.shared_expert_gate.weight", pre, (long long)L);
        }
    }
    VEC(norm, d, "%snorm.weight", top);
    if (!a->tie_embeddings) MAT(a->vocab, d, "lm_head.weight");
}

#undef VEC
#undef MAT

static enum sp_status write_config(const cJSON *config, const char *dir, int64_t layers) {
    cJSON *copy = cJSON_Duplicate(config, true);
    if (!copy) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (layers > 0) {
        /* a vision-language wrapper's text model has its own */
        cJSON *text = cJSON_GetObjectItemCaseSensitive(copy, "text_config"), *at = cJSON_IsObject(text) ? text : copy;
        cJSON *n = cJSON_CreateNumber((double)layers);
        if (!n || !cJSON_ReplaceItemInObjectCaseSensitive(at, "num_hidden_layers", n)) {
            cJSON_Delete(n);
            cJSON_Delete(copy);
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
        }
        /* Per-layer lists must shrink with the layer count. */
        cJSON *lt = cJSON_GetObjectItemCaseSensitive(at, "layer_types");
        while (cJSON_IsArray(lt) && cJSON_GetArraySize(lt) > layers) cJSON_DeleteItemFromArray(lt, cJSON_GetArraySize(lt) - 1);
    }
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 2);
    sp_jw_cjson(&w, copy);
    sp_buf_putc(&b, '\n');
    cJSON_Delete(copy);
    enum sp_status st = sp_write_buf(dir, "config.json", &b);
    sp_buf_free(&b);
    return st;
}

/* Values are made FILL_CHUNK at a time, each chunk by its own generator
 * seeded from (seed, tensor, chunk), so a file is the same whatever the
 * number of threads; a round of chunks is made in parallel, then written. */
#define FILL_CHUNK ((int64_t)1 << 18)
#define FILL_ROUND_MAX 32

struct fill_job {
    struct sp_pool *pool;
    uint64_t seed;
    float std;
    bool balanced;  // balanced routing (synth.h)
    const struct planned *t;
    int64_t tensor, numel;
    int64_t first, n_chunks;  // the round: chunks first .. first + n_chunks - 1
    void *out;                // the round's values, in the tensor's dtype
};

/* Two independent N(0, 1) values (Box-Muller, both of its outputs). */
static inline void normal_pair(struct sp_rng *r, float *a, float *b) {
    float u1 = ((float)(sp_rng_next(r) >> 40) + 1.0f) * (1.0f / 16777216.0f);  // (0, 1]
    float u2 = sp_rng_uniform(r);
    float m = sqrtf(-2.0f * logf(u1)), s, c;
    sincosf(6.2831853f * u2, &s, &c);
    *a = m * c;
    *b = m * s;
}

/* A tensor's value from a N(0, 1) draw g. */
static float init_value(enum init init, float g, float std, bool balanced) {
    switch (init) {
    case INIT_ONES: return 1.0f + 0.1f * g;
    case INIT_SMALL: return 0.1f * g;
    case INIT_ROUTER_BIAS: return balanced ? 0.0f : 0.1f * g;
    case INIT_EMBED: return balanced ? g : g * std;
    case INIT_NORMAL: break;
    }
    return g * std;
}

static void fill_chunks(void *arg, int tid, int nth) {
    const struct fill_job *j = arg;
    const struct planned *t = j->t;
    for (int64_t k = tid; k < j->n_chunks; k += nth) {
        int64_t c = j->first + k, start = c * FILL_CHUNK;
        int64_t n = j->numel - start < FILL_CHUNK ? j->numel - start : FILL_CHUNK;
        struct sp_rng rng;
        sp_rng_seed(&rng, j->seed ^ ((uint64_t)j->tensor << 40) ^ (uint64_t)c);
        for (int64_t v = 0; v < n; v += 2) {
            float g[2];
            normal_pair(&rng, &g[0], &g[1]);
            for (int h = 0; h < 2 && v + h < n; h++) {
                float x = init_value(t->init, g[h], j->std, j->balanced);
                sp_dtype_store_float(t->dtype, j->out, (size_t)(k * FILL_CHUNK + v + h), x);
            }
        }
    }
}

enum sp_status sp_synth_write(const cJSON *config, const char *dir, const struct sp_synth_opts *opts) {
    if (!sp_dtype_is_float(opts->dtype)) return sp_errorf(SP_ERR_ARG, "synthetic weights must be F32, F16 or BF16");
    enum sp_status st = sp_mkdirs(dir);
    if (st != SP_OK) return st;
    st = write_config(config, dir, opts->layers);
    if (st != SP_OK) return st;
    char *cfg_path = sp_path_join(dir, "config.json");
    cJSON *cfg = NULL;
    st = cfg_path ? sp_json_parse_file(cfg_path, 16 << 20, &cfg) : sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_free(cfg_path);
    if (st != SP_OK) return st;
    struct sp_arch a;
    st = sp_arch_from_config(cfg, &a);
    cJSON_Delete(cfg);
    if (st != SP_OK) return st;

    struct plan p = {.dtype = opts->dtype};
    plan_model(&p, &a);
    sp_arch_free(&a);
    struct sp_st_writer w;
    sp_st_writer_init(&w, dir, opts->shard_bytes);
    st = p.st;
    for (int64_t i = 0; i < p.n && st == SP_OK; i++)
        st = sp_st_writer_declare(&w, p.v[i].name, p.v[i].dtype, p.v[i].ndim, p.v[i].shape);
    if (st == SP_OK) st = sp_st_writer_begin(&w);
    struct sp_pool *own_pool = NULL;
    if (st == SP_OK && !opts->pool && !opts->sparse) st = sp_pool_create(1, &own_pool);
    struct fill_job j = {.pool = opts->pool ? opts->pool : own_pool, .seed = opts->seed,
                         .std = opts->init_std > 0 ? opts->init_std : 0.02f, .balanced = opts->balanced_routing};
    int64_t round = 0;
    if (st == SP_OK && !opts->sparse) {
        round = 2 * (int64_t)sp_pool_size(j.pool);
        round = round < FILL_ROUND_MAX ? round : FILL_ROUND_MAX;
        j.out = sp_malloc((size_t)round * FILL_CHUNK * sizeof(float), SP_MEM_MISC);
        if (!j.out) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    for (int64_t i = 0; i < p.n && st == SP_OK; i++) {
        const struct planned *t = &p.v[i];
        int64_t numel = 1;
        for (int d = 0; d < t->ndim; d++) numel *= t->shape[d];
        size_t esz = sp_dtype_size(t->dtype);
        if (opts->sparse) {
            st = sp_st_writer_skip(&w, (size_t)numel * esz);
            continue;
        }
        j.t = t;
        j.tensor = i;
        j.numel = numel;
        int64_t chunks = (numel + FILL_CHUNK - 1) / FILL_CHUNK;
        for (j.first = 0; j.first < chunks && st == SP_OK; j.first += round) {
            j.n_chunks = chunks - j.first < round ? chunks - j.first : round;
            sp_pool_run(j.pool, fill_chunks, &j);
            int64_t left = numel - j.first * FILL_CHUNK, n = left < j.n_chunks * FILL_CHUNK ? left : j.n_chunks * FILL_CHUNK;
            st = sp_st_writer_write(&w, j.out, (size_t)n * esz);
        }
    }
    if (st == SP_OK) st = sp_st_writer_finish(&w);
    sp_st_writer_free(&w);
    sp_pool_free(own_pool);
    sp_free(j.out);
    sp_free(p.v);
    return st;
}
