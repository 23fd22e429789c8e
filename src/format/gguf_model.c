/* gguf_model.c - GGUF models as Hugging Face folders (gguf_model.h). */
#include "format/gguf_model.h"

#include <stdio.h>
#include <string.h>
#include <strings.h>

#include "core/alloc.h"
#include "format/gguf.h"
#include "format/modeldir.h"

bool sp_gguf_model_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".gguf");
}

/* ---- metadata to config.json ---- */

/* key "<arch>.<suffix>" */
static const char *arch_key(char *buf, size_t cap, const char *arch, const char *suffix) {
    snprintf(buf, cap, "%s.%s", arch, suffix);
    return buf;
}

/* config[name] = the integer at key; a missing key gives def, or (def < 0) an error. */
static enum sp_status put_int(const struct sp_gguf_file *f, cJSON *config, const char *name, const char *key,
                              int64_t def, int64_t *out) {
    int64_t v;
    enum sp_status st = sp_gguf_get_int(f, key, 0, INT32_MAX, &v);
    if (st == SP_ERR_NOT_FOUND && def >= 0) {
        sp_error_clear();
        v = def;
    } else if (st != SP_OK) {
        return st;
    }
    if (!cJSON_AddNumberToObject(config, name, (double)v)) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (out) *out = v;
    return SP_OK;
}

static enum sp_status put_float(const struct sp_gguf_file *f, cJSON *config, const char *name, const char *key,
                                double def) {
    double v;
    enum sp_status st = sp_gguf_get_float(f, key, &v);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        v = def;
    } else if (st != SP_OK) {
        return st;
    }
    return cJSON_AddNumberToObject(config, name, v) ? SP_OK : sp_errorf(SP_ERR_NOMEM, "out of memory");
}

/* The architectures read: GGUF's name, the Hugging Face class and
 * model_type it stands for, and what their GGUFs do differently. */
struct gguf_arch {
    const char *name, *hf_class, *model_type;
    bool reorder_qk;  // llama.cpp's converter interleaves each head's q / k rotary pairs
    bool moe;         // expert keys and tensors; layers without a router are dense (mlp_only_layers)
    double eps, theta;  // defaults of the RMSNorm epsilon and the RoPE base
};

static const struct gguf_arch archs[] = {
    {"llama", "LlamaForCausalLM", "llama", true, false, 1e-5, 10000.0},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false, false, 1e-6, 1000000.0},
    {"qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe", false, true, 1e-6, 1000000.0},
};

static const struct gguf_arch *arch_of(struct sp_gguf_str name) {
    for (size_t i = 0; i < sizeof archs / sizeof *archs; i++)
        if (strlen(archs[i].name) == name.len && !memcmp(archs[i].name, name.data, name.len)) return &archs[i];
    return NULL;
}

/* config.token_id = the GGUF's, where it has one. */
static enum sp_status put_token(const struct sp_gguf_file *f, cJSON *config, const char *name, const char *key) {
    int64_t v;
    enum sp_status st = sp_gguf_get_int(f, key, 0, INT32_MAX, &v);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        return SP_OK;
    }
    if (st != SP_OK) return st;
    return cJSON_AddNumberToObject(config, name, (double)v) ? SP_OK : sp_errorf(SP_ERR_NOMEM, "out of memory");
}

/* Layers without a router, as qwen3_moe's mlp_only_layers. */
static enum sp_status put_dense_layers(const struct sp_gguf_split *s, int64_t n_layers, cJSON *config) {
    cJSON *arr = cJSON_AddArrayToObject(config, "mlp_only_layers");
    if (!arr) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t L = 0; L < n_layers; L++) {
        char name[64];
        snprintf(name, sizeof name, "blk.%lld.ffn_gate_inp.weight", (long long)L);
        if (!sp_gguf_split_find(s, name, NULL) && !cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)L)))
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    return SP_OK;
}

/* The keys llama.cpp's converter writes for A, as the Hugging Face config. */
static enum sp_status arch_config(const struct gguf_arch *A, const struct sp_gguf_split *s, int64_t vocab, bool tied,
                                  cJSON *config, int64_t *n_head, int64_t *n_kv) {
    const struct sp_gguf_file *f = s->shards[0];
    const char *an = A->name;
    char k[96];
    int64_t hidden, rot, n_layers;
    enum sp_status st;
    cJSON *arr = cJSON_AddArrayToObject(config, "architectures");
    if (!arr || !cJSON_AddItemToArray(arr, cJSON_CreateString(A->hf_class)) ||
        !cJSON_AddStringToObject(config, "model_type", A->model_type) ||
        !cJSON_AddStringToObject(config, "hidden_act", "silu") ||
        !cJSON_AddBoolToObject(config, "tie_word_embeddings", tied) ||
        !cJSON_AddNumberToObject(config, "vocab_size", (double)vocab))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if ((st = put_int(f, config, "hidden_size", arch_key(k, sizeof k, an, "embedding_length"), -1, &hidden)) ||
        (st = put_int(f, config, "intermediate_size", arch_key(k, sizeof k, an, "feed_forward_length"), A->moe ? 0 : -1,
                      NULL)) ||
        (st = put_int(f, config, "num_hidden_layers", arch_key(k, sizeof k, an, "block_count"), -1, &n_layers)) ||
        (st = put_int(f, config, "num_attention_heads", arch_key(k, sizeof k, an, "attention.head_count"), -1,
                      n_head)))
        return st;
    if (*n_head <= 0 || hidden % *n_head)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s.attention.head_count %lld does not divide %s.embedding_length %lld",
                         f->path, an, (long long)*n_head, an, (long long)hidden);
    int64_t hd = hidden / *n_head;
    if ((st = put_int(f, config, "num_key_value_heads", arch_key(k, sizeof k, an, "attention.head_count_kv"), *n_head,
                      n_kv)) ||
        (st = put_int(f, config, "head_dim", arch_key(k, sizeof k, an, "attention.key_length"), hd, &hd)) ||
        (st = put_int(f, config, "max_position_embeddings", arch_key(k, sizeof k, an, "context_length"), 2048,
                      NULL)) ||
        (st = put_float(f, config, "rms_norm_eps", arch_key(k, sizeof k, an, "attention.layer_norm_rms_epsilon"),
                        A->eps)) ||
        (st = put_float(f, config, "rope_theta", arch_key(k, sizeof k, an, "rope.freq_base"), A->theta)) ||
        (st = put_token(f, config, "bos_token_id", "tokenizer.ggml.bos_token_id")) ||
        (st = put_token(f, config, "eos_token_id", "tokenizer.ggml.eos_token_id")))
        return st;
    if (*n_kv <= 0 || *n_head % *n_kv)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s.attention.head_count_kv %lld does not divide the %lld heads", f->path,
                         an, (long long)*n_kv, (long long)*n_head);
    if (A->moe) {
        if ((st = put_int(f, config, "num_experts", arch_key(k, sizeof k, an, "expert_count"), -1, NULL)) ||
            (st = put_int(f, config, "num_experts_per_tok", arch_key(k, sizeof k, an, "expert_used_count"), -1,
                          NULL)) ||
            (st = put_int(f, config, "moe_intermediate_size", arch_key(k, sizeof k, an, "expert_feed_forward_length"),
                          -1, NULL)) ||
            (st = put_dense_layers(s, n_layers, config)))
            return st;
        /* llama.cpp normalizes Qwen3-MoE's top-k weights, as its configs ask */
        if (!cJSON_AddBoolToObject(config, "norm_topk_prob", true) ||
            !cJSON_AddNumberToObject(config, "decoder_sparse_step", 1))
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    /* partial rotary and rope scaling are not mapped yet: refused rather than run wrong */
    st = sp_gguf_get_int(f, arch_key(k, sizeof k, an, "rope.dimension_count"), 0, INT32_MAX, &rot);
    if (st == SP_OK && rot != hd)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "%s: %s is %lld, not the head's %lld dimensions (partial rotary in a GGUF is not read yet)",
                         f->path, k, (long long)rot, (long long)hd);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) return st;
    sp_error_clear();
    struct sp_gguf_str type;
    st = sp_gguf_get_str(f, arch_key(k, sizeof k, an, "rope.scaling.type"), &type);
    if (st == SP_OK && !(type.len == 4 && !memcmp(type.data, "none", 4)))
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: %s \"%.*s\": RoPE scaling in a GGUF is not read yet", f->path, k,
                         (int)type.len, type.data);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) return st;
    sp_error_clear();
    return SP_OK;
}

/* ---- tensors ---- */

/* GGUF names to Hugging Face's: whole names, then per-layer parts
 * (stacked experts as mlx-lm's SwitchGLU stores them, [E, out, in]). */
static const char *const global_names[][2] = {
    {"token_embd.weight", "model.embed_tokens.weight"},
    {"output_norm.weight", "model.norm.weight"},
    {"output.weight", "lm_head.weight"},
};
static const char *const layer_names[][2] = {
    {"attn_norm", "input_layernorm"}, {"attn_q", "self_attn.q_proj"},      {"attn_k", "self_attn.k_proj"},
    {"attn_v", "self_attn.v_proj"},   {"attn_output", "self_attn.o_proj"}, {"ffn_norm", "post_attention_layernorm"},
    {"ffn_gate", "mlp.gate_proj"},    {"ffn_up", "mlp.up_proj"},           {"ffn_down", "mlp.down_proj"},
    {"attn_q_norm", "self_attn.q_norm"}, {"attn_k_norm", "self_attn.k_norm"}, {"ffn_gate_inp", "mlp.gate"},
    {"ffn_gate_exps", "mlp.switch_mlp.gate_proj"}, {"ffn_up_exps", "mlp.switch_mlp.up_proj"},
    {"ffn_down_exps", "mlp.switch_mlp.down_proj"},
};

/* The rotary reorder a tensor needs: 0 none, 1 q heads, 2 k heads. */
enum { REORDER_NONE, REORDER_Q, REORDER_K };

/* name's Hugging Face name into hf (cap bytes) and its reorder; false for a name outside the table. */
static bool hf_name(const char *name, char *hf, size_t cap, int *reorder) {
    *reorder = REORDER_NONE;
    for (size_t i = 0; i < sizeof global_names / sizeof *global_names; i++)
        if (!strcmp(name, global_names[i][0])) {
            snprintf(hf, cap, "%s", global_names[i][1]);
            return true;
        }
    unsigned layer;
    int at = 0;
    if (sscanf(name, "blk.%u.%n", &layer, &at) != 1 || !at) return false;
    const char *part = name + at, *dot = strrchr(part, '.');
    if (!dot || strcmp(dot, ".weight")) return false;
    size_t plen = (size_t)(dot - part);
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (strlen(layer_names[i][0]) == plen && !memcmp(part, layer_names[i][0], plen)) {
            snprintf(hf, cap, "model.layers.%u.%s.weight", layer, layer_names[i][1]);
            *reorder = !strcmp(layer_names[i][0], "attn_q")   ? REORDER_Q
                       : !strcmp(layer_names[i][0], "attn_k") ? REORDER_K
                                                              : REORDER_NONE;
            return true;
        }
    return false;
}

static bool dtype_of(enum sp_gguf_type t, enum sp_dtype *out) {
    switch (t) {
    case SP_GGUF_TYPE_F32:
        *out = SP_DTYPE_F32;
        return true;
    case SP_GGUF_TYPE_F16:
        *out = SP_DTYPE_F16;
        return true;
    case SP_GGUF_TYPE_BF16:
        *out = SP_DTYPE_BF16;
        return true;
    default:
        return false;
    }
}

/* Rows of src (heads of d rows, row bytes rb) from GGUF's order, row h d +
 * 2 b + a, to Hugging Face's, row h d + a d / 2 + b. */
static void unpermute_rows(const unsigned char *src, unsigned char *dst, int64_t rows, int64_t heads, size_t rb) {
    int64_t d = rows / heads;
    for (int64_t h = 0; h < heads; h++)
        for (int64_t b = 0; b < d / 2; b++)
            for (int64_t a = 0; a < 2; a++)
                memcpy(dst + (size_t)(h * d + a * (d / 2) + b) * rb, src + (size_t)(h * d + 2 * b + a) * rb, rb);
}

/* Shard si of s as a safetensors-like file: its mapping moved over, its
 * tensors under Hugging Face names, reordered q / k rows in f->owned. */
static enum sp_status shard_file(const struct gguf_arch *A, struct sp_gguf_split *s, int si, int64_t n_head,
                                 int64_t n_kv, struct sp_st_file **out) {
    struct sp_gguf_file *g = s->shards[si];
    struct sp_st_file *f = sp_calloc(1, sizeof *f, SP_MEM_MODEL);
    if (!f) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_strmap_init(&f->by_name, SP_MEM_MODEL);
    f->map = (struct sp_map){.fd = -1};
    *out = f;
    int64_t n = 0;
    size_t owned = 0;
    for (int64_t i = 0; i < s->n_tensors; i++) n += s->shard_of[i] == si;
    f->path = sp_strdup(g->path, SP_MEM_MODEL);
    f->tensors = sp_calloc((size_t)(n ? n : 1), sizeof *f->tensors, SP_MEM_MODEL);
    f->names = sp_malloc((size_t)(n ? n : 1) * 96, SP_MEM_MODEL);
    if (!f->path || !f->tensors || !f->names) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < s->n_tensors; i++) {
        if (s->shard_of[i] != si) continue;
        const struct sp_gguf_tensor *t = s->tensors[i];
        struct sp_st_tensor *o = &f->tensors[f->n_tensors];
        char *hf = f->names + f->n_tensors * 96;
        int reorder;
        if (!hf_name(t->name, hf, 96, &reorder))
            return sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s has no place in a %s model", g->path, t->name, A->name);
        if (!A->reorder_qk) reorder = REORDER_NONE;
        if (!dtype_of(t->type, &o->dtype))
            return sp_errorf(SP_ERR_UNSUPPORTED,
                             "%s: tensor %s is %s: GGUF's quantized types are not read yet (F32, "
                             "F16 and BF16 are)",
                             g->path, t->name, sp_gguf_type_name(t->type));
        o->name = hf;
        o->ndim = t->n_dims;
        for (int d = 0; d < t->n_dims; d++) o->shape[d] = t->dims[t->n_dims - 1 - d]; // ggml lists a row first
        o->offset = t->offset;
        o->nbytes = t->nbytes;
        o->data = t->data;
        if (reorder != REORDER_NONE) {
            int64_t heads = reorder == REORDER_Q ? n_head : n_kv, rows = t->n_dims == 2 ? t->dims[1] : 0;
            if (rows <= 0 || rows % heads || (rows / heads) % 2)
                return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: %lld rows are not %lld heads of an even size", g->path,
                                 t->name, (long long)rows, (long long)heads);
            owned += t->nbytes;
        }
        size_t l = strlen(hf);
        int64_t prev;
        if (sp_strmap_get(&f->by_name, hf, l, &prev))
            return sp_errorf(SP_ERR_FORMAT, "%s: two tensors are %s", g->path, hf);
        enum sp_status st = sp_strmap_put(&f->by_name, hf, l, f->n_tensors);
        if (st != SP_OK) return st;
        f->n_tensors++;
    }
    if (owned) {
        unsigned char *p = f->owned = sp_malloc(owned, SP_MEM_WEIGHTS);
        if (!p) return sp_errorf(SP_ERR_NOMEM, "%zu bytes for the reordered q and k rows", owned);
        for (int64_t i = 0; i < f->n_tensors; i++) {
            struct sp_st_tensor *o = &f->tensors[i];
            bool q = strstr(o->name, ".q_proj.") != NULL, k = strstr(o->name, ".k_proj.") != NULL;
            if (!q && !k) continue;
            unpermute_rows(o->data, p, o->shape[0], q ? n_head : n_kv, o->nbytes / (size_t)o->shape[0]);
            o->data = p;
            p += o->nbytes;
        }
    }
    /* the mapping now belongs to this file: tensor data points into it */
    f->map = g->map;
    g->map = (struct sp_map){.fd = -1};
    return SP_OK;
}

enum sp_status sp_gguf_model_open(const char *path, struct sp_model_files *mf) {
    struct sp_gguf_split *s;
    enum sp_status st = sp_gguf_split_open(path, &s);
    if (st != SP_OK) return st;
    const struct sp_gguf_file *f = s->shards[0];
    struct sp_gguf_str arch;
    int64_t n_head = 0, n_kv = 0;
    const struct sp_gguf_tensor *embd = sp_gguf_split_find(s, "token_embd.weight", NULL);
    if ((st = sp_gguf_get_str(f, "general.architecture", &arch)) != SP_OK) goto done;
    const struct gguf_arch *A = arch_of(arch);
    if (!A) {
        st = sp_errorf(SP_ERR_UNSUPPORTED,
                       "%s: general.architecture \"%.*s\": the GGUF architectures read so far are llama, qwen3 and "
                       "qwen3moe",
                       path, (int)arch.len, arch.data);
        goto done;
    }
    if (!embd || embd->n_dims != 2) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: no 2-D token_embd.weight", path);
        goto done;
    }
    mf->config = cJSON_CreateObject();
    if (!mf->config) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    bool tied = !sp_gguf_split_find(s, "output.weight", NULL);
    if ((st = arch_config(A, s, embd->dims[1], tied, mf->config, &n_head, &n_kv)) != SP_OK) goto done;
    for (int i = 0; i < s->n_shards && st == SP_OK; i++) {
        struct sp_st_file *sf = NULL;
        st = shard_file(A, s, i, n_head, n_kv, &sf);
        if (st == SP_OK) {
            st = sp_model_files_add(mf, sf);
        } else {
            sp_st_close(sf);
        }
    }
done:
    sp_gguf_split_close(s);
    return st;
}
