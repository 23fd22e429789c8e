/* gguf_model.c - GGUF models as Hugging Face folders (gguf_model.h). */
#include "format/gguf_model.h"

#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

#include "core/alloc.h"
#include "core/file.h"
#include "core/half.h"
#include "core/json.h"
#include "core/pool.h"
#include "format/gguf.h"
#include "format/modeldir.h"

bool sp_gguf_model_path(const char *path) {
    size_t n = strlen(path);
    return n > 5 && !strcasecmp(path + n - 5, ".gguf");
}

bool sp_gguf_model_file(const char *path) { return sp_gguf_model_path(path) && sp_path_is_file(path); }

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
/* What an architecture's GGUF holds besides the common keys. */
enum gguf_family {
    FAMILY_DENSE,
    FAMILY_QWEN3MOE,  // layers without a router are dense (mlp_only_layers)
    FAMILY_GPT_OSS,   // biases, sinks, sliding layers, YaRN, every layer MoE
    FAMILY_BAILING,   // shared experts, group routing, partial rotary, MTP blocks past the model's
};

struct gguf_arch {
    const char *name, *hf_class, *model_type;
    enum gguf_family family;
    bool reorder_qk;  // llama.cpp's converter interleaves each head's q / k rotary pairs
    bool moe;         // expert keys and tensors
    double eps, theta;  // defaults of the RMSNorm epsilon and the RoPE base
};

static const struct gguf_arch archs[] = {
    {"llama", "LlamaForCausalLM", "llama", FAMILY_DENSE, true, false, 1e-5, 10000.0},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", FAMILY_DENSE, false, false, 1e-6, 1000000.0},
    {"qwen3moe", "Qwen3MoeForCausalLM", "qwen3_moe", FAMILY_QWEN3MOE, false, true, 1e-6, 1000000.0},
    {"gpt-oss", "GptOssForCausalLM", "gpt_oss", FAMILY_GPT_OSS, false, true, 1e-5, 150000.0},
    {"bailingmoe2", "BailingMoeV2ForCausalLM", "bailing_moe", FAMILY_BAILING, false, true, 1e-6, 10000.0},
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

/* A tensor read into the config rather than the weights. */
#define ROPE_FREQS "rope_freqs.weight"

/* rope_freqs.weight (llama.cpp's per-frequency divisors: Llama 3's
 * scaling) as the config's "factors" RoPE scaling. */
static enum sp_status put_rope_freqs(const struct sp_gguf_split *s, cJSON *config) {
    const struct sp_gguf_tensor *t = sp_gguf_split_find(s, ROPE_FREQS, NULL);
    if (!t) return SP_OK;
    if (t->type != SP_GGUF_TYPE_F32 || t->n_dims != 1)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s: expected a vector of F32, not %s in %d dimensions",
                         s->shards[0]->path, ROPE_FREQS, sp_gguf_type_name(t->type), t->n_dims);
    cJSON *sc = cJSON_AddObjectToObject(config, "rope_scaling"), *arr;
    if (!sc || !cJSON_AddStringToObject(sc, "rope_type", "factors") || !(arr = cJSON_AddArrayToObject(sc, "factors")))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < t->dims[0]; i++) {
        float v;
        memcpy(&v, (const unsigned char *)t->data + 4 * i, 4);
        if (!cJSON_AddItemToArray(arr, cJSON_CreateNumber(v))) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    return SP_OK;
}

/* gpt-oss's keys: its attention biases, its sliding window on every other
 * layer from the first (llama.cpp's pattern for it), and YaRN (with the
 * beta defaults and the untruncated correction range of its configs). */
static enum sp_status gpt_oss_config(const struct sp_gguf_file *f, int64_t n_layers, cJSON *config) {
    enum sp_status st;
    if ((st = put_int(f, config, "sliding_window", "gpt-oss.attention.sliding_window", 128, NULL)) != SP_OK) return st;
    cJSON *types = cJSON_AddArrayToObject(config, "layer_types");
    if (!types || !cJSON_AddBoolToObject(config, "attention_bias", true)) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t L = 0; L < n_layers; L++)
        if (!cJSON_AddItemToArray(types, cJSON_CreateString(L % 2 == 0 ? "sliding_attention" : "full_attention")))
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
    struct sp_gguf_str type;
    st = sp_gguf_get_str(f, "gpt-oss.rope.scaling.type", &type);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        return SP_OK;
    }
    if (st != SP_OK) return st;
    if (!(type.len == 4 && !memcmp(type.data, "yarn", 4))) return SP_OK;  // arch_config refuses it by name
    cJSON *sc = cJSON_AddObjectToObject(config, "rope_scaling");
    if (!sc || !cJSON_AddStringToObject(sc, "rope_type", "yarn") || !cJSON_AddNumberToObject(sc, "beta_fast", 32.0) ||
        !cJSON_AddNumberToObject(sc, "beta_slow", 1.0) || !cJSON_AddBoolToObject(sc, "truncate", false))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if ((st = put_float(f, sc, "factor", "gpt-oss.rope.scaling.factor", 1.0)) != SP_OK ||
        (st = put_int(f, sc, "original_max_position_embeddings", "gpt-oss.rope.scaling.original_context_length", -1,
                      NULL)) != SP_OK)
        return st;
    return SP_OK;
}

/* Tensor name exists in s. */
static bool has_tensor(const struct sp_gguf_split *s, const char *name) { return sp_gguf_split_find(s, name, NULL) != NULL; }

/* bailingmoe2's keys (Ling 2.0): its MTP blocks past the model's (left
 * out: *kept_layers), leading dense layers, shared experts, routing
 * (gating function 1 softmax, 2 sigmoid; groups; scale) and the rotated
 * share of a head; its optional parts from the tensors blk.0 has. */
static enum sp_status bailing_config(const struct sp_gguf_split *s, int64_t hd, int64_t rot, cJSON *config,
                                     int64_t *kept_layers) {
    const struct sp_gguf_file *f = s->shards[0];
    int64_t nextn, gating, groups;
    enum sp_status st;
    if ((st = put_int(f, config, "num_nextn_predict_layers", "bailingmoe2.nextn_predict_layers", 0, &nextn)) != SP_OK)
        return st;
    if (nextn >= *kept_layers)
        return sp_errorf(SP_ERR_FORMAT, "%s: bailingmoe2.nextn_predict_layers %lld leaves none of the %lld blocks",
                         f->path, (long long)nextn, (long long)*kept_layers);
    *kept_layers -= nextn;
    cJSON_SetIntValue(cJSON_GetObjectItem(config, "num_hidden_layers"), (int)*kept_layers);
    cJSON_SetIntValue(cJSON_GetObjectItem(config, "num_nextn_predict_layers"), 0);
    if ((st = put_int(f, config, "first_k_dense_replace", "bailingmoe2.leading_dense_block_count", 0, NULL)) ||
        (st = put_int(f, config, "num_shared_experts", "bailingmoe2.expert_shared_count", 0, NULL)) ||
        (st = put_float(f, config, "routed_scaling_factor", "bailingmoe2.expert_weights_scale", 1.0)) ||
        (st = put_int(f, config, "n_group", "bailingmoe2.expert_group_count", 1, &groups)) ||
        (st = put_int(f, config, "topk_group", "bailingmoe2.expert_group_used_count", groups, NULL)))
        return st;
    st = sp_gguf_get_int(f, "bailingmoe2.expert_gating_func", 0, INT32_MAX, &gating);
    if (st == SP_ERR_NOT_FOUND) {
        sp_error_clear();
        gating = 2;
    } else if (st != SP_OK) {
        return st;
    }
    if (gating != 1 && gating != 2)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: bailingmoe2.expert_gating_func %lld (read: 1 softmax, 2 sigmoid)",
                         f->path, (long long)gating);
    if (rot <= 0 || rot > hd || rot % 2)
        return sp_errorf(SP_ERR_FORMAT, "%s: bailingmoe2.rope.dimension_count %lld is not an even part of the head's "
                         "%lld dimensions", f->path, (long long)rot, (long long)hd);
    if (!cJSON_AddStringToObject(config, "score_function", gating == 1 ? "softmax" : "sigmoid") ||
        !cJSON_AddNumberToObject(config, "partial_rotary_factor", (double)rot / (double)hd) ||
        !cJSON_AddBoolToObject(config, "norm_topk_prob", true) ||
        !cJSON_AddBoolToObject(config, "use_qk_norm", has_tensor(s, "blk.0.attn_q_norm.weight")) ||
        !cJSON_AddBoolToObject(config, "use_qkv_bias", has_tensor(s, "blk.0.attn_qkv.bias")) ||
        !cJSON_AddBoolToObject(config, "use_bias", has_tensor(s, "blk.0.attn_output.bias")))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    return SP_OK;
}

/* The keys llama.cpp's converter writes for A, as the Hugging Face config. */
static enum sp_status arch_config(const struct gguf_arch *A, const struct sp_gguf_split *s, int64_t vocab, bool tied,
                                  cJSON *config, int64_t *n_head, int64_t *n_kv, int64_t *kept_layers) {
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
    *kept_layers = n_layers;
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
        /* gpt-oss calls an expert's width intermediate_size */
        if ((st = put_int(f, config, "num_experts", arch_key(k, sizeof k, an, "expert_count"), -1, NULL)) ||
            (st = put_int(f, config, "num_experts_per_tok", arch_key(k, sizeof k, an, "expert_used_count"), -1,
                          NULL)) ||
            (st = put_int(f, config, A->family == FAMILY_GPT_OSS ? "intermediate_size" : "moe_intermediate_size",
                          arch_key(k, sizeof k, an, "expert_feed_forward_length"), -1, NULL)))
            return st;
    }
    if (A->family == FAMILY_QWEN3MOE) {
        /* llama.cpp normalizes Qwen3-MoE's top-k weights, as its configs ask */
        if ((st = put_dense_layers(s, n_layers, config)) != SP_OK) return st;
        if (!cJSON_AddBoolToObject(config, "norm_topk_prob", true) ||
            !cJSON_AddNumberToObject(config, "decoder_sparse_step", 1))
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    if (A->family == FAMILY_GPT_OSS && (st = gpt_oss_config(f, n_layers, config)) != SP_OK) return st;
    /* partial rotary (but Ling's) and rope scaling (but gpt-oss's YaRN) are not mapped: refused rather than run wrong */
    st = sp_gguf_get_int(f, arch_key(k, sizeof k, an, "rope.dimension_count"), 0, INT32_MAX, &rot);
    if (st == SP_ERR_NOT_FOUND) rot = hd;
    if (A->family == FAMILY_BAILING && (st == SP_OK || st == SP_ERR_NOT_FOUND)) {
        sp_error_clear();
        if ((st = bailing_config(s, hd, rot, config, kept_layers)) != SP_OK) return st;
    } else if (st == SP_OK && rot != hd)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "%s: %s is %lld, not the head's %lld dimensions (partial rotary in a GGUF is not read yet)",
                         f->path, k, (long long)rot, (long long)hd);
    if (st != SP_OK && st != SP_ERR_NOT_FOUND) return st;
    sp_error_clear();
    struct sp_gguf_str type;
    st = sp_gguf_get_str(f, arch_key(k, sizeof k, an, "rope.scaling.type"), &type);
    if (st == SP_OK && A->family == FAMILY_GPT_OSS && type.len == 4 && !memcmp(type.data, "yarn", 4))
        st = SP_ERR_NOT_FOUND;  // read above
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
/* Per-layer parts: GGUF's name, Hugging Face's module, and for a bare
 * parameter (no ".weight" in Hugging Face's name) the GGUF suffix it has. */
static const struct {
    const char *gguf, *hf, *bare;
} layer_names[] = {
    {"attn_norm", "input_layernorm", NULL},
    {"attn_q", "self_attn.q_proj", NULL},
    {"attn_k", "self_attn.k_proj", NULL},
    {"attn_v", "self_attn.v_proj", NULL},
    {"attn_output", "self_attn.o_proj", NULL},
    {"ffn_norm", "post_attention_layernorm", NULL},
    {"ffn_gate", "mlp.gate_proj", NULL},
    {"ffn_up", "mlp.up_proj", NULL},
    {"ffn_down", "mlp.down_proj", NULL},
    {"attn_q_norm", "self_attn.q_norm", NULL},
    {"attn_k_norm", "self_attn.k_norm", NULL},
    {"ffn_gate_inp", "mlp.gate", NULL},
    {"ffn_gate_exps", "mlp.switch_mlp.gate_proj", NULL},
    {"ffn_up_exps", "mlp.switch_mlp.up_proj", NULL},
    {"ffn_down_exps", "mlp.switch_mlp.down_proj", NULL},
    /* gpt-oss */
    {"post_attention_norm", "post_attention_layernorm", NULL},
    {"attn_sinks", "self_attn.sinks", ".weight"},
    /* bailingmoe2 */
    {"attn_qkv", "attention.query_key_value", NULL},
    {"ffn_gate_shexp", "mlp.shared_experts.gate_proj", NULL},
    {"ffn_up_shexp", "mlp.shared_experts.up_proj", NULL},
    {"ffn_down_shexp", "mlp.shared_experts.down_proj", NULL},
    {"exp_probs_b", "mlp.gate.expert_bias", ".bias"},
};

/* The rotary reorder a tensor needs: 0 none, 1 q heads, 2 k heads. */
enum { REORDER_NONE, REORDER_Q, REORDER_K };

/* name's Hugging Face module (or bare parameter) into stem (cap bytes),
 * its parameter's suffix (".weight", ".bias" or "" for a bare one) and its
 * reorder; false for a name outside the table. */
static bool hf_name(const char *name, char *stem, size_t cap, const char **suffix, int *reorder) {
    *reorder = REORDER_NONE;
    *suffix = ".weight";
    for (size_t i = 0; i < sizeof global_names / sizeof *global_names; i++)
        if (!strcmp(name, global_names[i][0])) {
            snprintf(stem, cap, "%.*s", (int)(strlen(global_names[i][1]) - strlen(".weight")), global_names[i][1]);
            return true;
        }
    unsigned layer;
    int at = 0;
    if (sscanf(name, "blk.%u.%n", &layer, &at) != 1 || !at) return false;
    const char *part = name + at, *dot = strrchr(part, '.');
    if (!dot || (strcmp(dot, ".weight") && strcmp(dot, ".bias"))) return false;
    size_t plen = (size_t)(dot - part);
    for (size_t i = 0; i < sizeof layer_names / sizeof *layer_names; i++)
        if (strlen(layer_names[i].gguf) == plen && !memcmp(part, layer_names[i].gguf, plen)) {
            const char *bare = layer_names[i].bare;
            if (bare && strcmp(dot, bare)) return false;
            snprintf(stem, cap, "model.layers.%u.%s", layer, layer_names[i].hf);
            *suffix = bare ? "" : !strcmp(dot, ".bias") ? ".bias" : ".weight";
            if (!strcmp(dot, ".weight"))
                *reorder = !strcmp(layer_names[i].gguf, "attn_q")   ? REORDER_Q
                           : !strcmp(layer_names[i].gguf, "attn_k") ? REORDER_K
                                                                    : REORDER_NONE;
            return true;
        }
    return false;
}

/* How a GGUF tensor type is read: as floats, as blocks of a format of
 * sparrow's own (the same bytes: Q2_K .. Q6_K, IQ4_NL, IQ4_XS), or repacked, block by block and
 * exactly, into the MLX format whose products compute the same values
 * (Q8_0: d q = d u - 128 d for the code u = q + 128, affine 8-bit; Q4_0:
 * d (q - 8), affine 4-bit with bias -8 d; Q4_1: d q + m; Q5_0: d (q - 16),
 * affine 5-bit with bias -16 d; Q5_1: d q + m; MXFP4: the same E2M1 codes
 * and E8M0 scale). ggml's 4-bit blocks hold element j in the low nibble of
 * byte j and element j + 16 in its high nibble (its 5-bit ones the fifth
 * bit of element j in bit j of a 32-bit qh); MLX packs element k in nibble
 * k, wider codes LSB first. */
struct gguf_read {
    enum sp_gguf_type type;
    enum sp_dtype dtype;  // float types: the tensor's dtype
    const char *mode;     // block types: the mode ("affine", "mxfp4", "q6_k"), bits and scale dtype
    int bits;
    enum sp_dtype scale_dtype;
    bool biases;
    bool native;          // the blocks as they are (a format whose blocks hold their scales)
};

static const struct gguf_read reads[] = {
    {SP_GGUF_TYPE_F32, SP_DTYPE_F32, NULL, 0, SP_DTYPE_COUNT, false, false},
    {SP_GGUF_TYPE_F16, SP_DTYPE_F16, NULL, 0, SP_DTYPE_COUNT, false, false},
    {SP_GGUF_TYPE_BF16, SP_DTYPE_BF16, NULL, 0, SP_DTYPE_COUNT, false, false},
    {SP_GGUF_TYPE_Q8_0, SP_DTYPE_U8, "affine", 8, SP_DTYPE_F16, true, false},
    {SP_GGUF_TYPE_Q4_0, SP_DTYPE_U8, "affine", 4, SP_DTYPE_F16, true, false},
    {SP_GGUF_TYPE_Q4_1, SP_DTYPE_U8, "affine", 4, SP_DTYPE_F16, true, false},
    {SP_GGUF_TYPE_Q5_0, SP_DTYPE_U8, "affine", 5, SP_DTYPE_F16, true, false},
    {SP_GGUF_TYPE_Q5_1, SP_DTYPE_U8, "affine", 5, SP_DTYPE_F16, true, false},
    {SP_GGUF_TYPE_MXFP4, SP_DTYPE_U8, "mxfp4", 4, SP_DTYPE_U8, false, false},
    /* K-quants: super-blocks of 256 with 6-bit scales (and mins) a 32 or 16 inside */
    {SP_GGUF_TYPE_Q2_K, SP_DTYPE_U8, "q2_k", 2, SP_DTYPE_COUNT, false, true},
    {SP_GGUF_TYPE_Q3_K, SP_DTYPE_U8, "q3_k", 3, SP_DTYPE_COUNT, false, true},
    {SP_GGUF_TYPE_Q4_K, SP_DTYPE_U8, "q4_k", 4, SP_DTYPE_COUNT, false, true},
    {SP_GGUF_TYPE_Q5_K, SP_DTYPE_U8, "q5_k", 5, SP_DTYPE_COUNT, false, true},
    {SP_GGUF_TYPE_Q6_K, SP_DTYPE_U8, "q6_k", 6, SP_DTYPE_COUNT, false, true},
    /* codes into a table of 16 non-uniform values */
    {SP_GGUF_TYPE_IQ4_NL, SP_DTYPE_U8, "iq4_nl", 4, SP_DTYPE_COUNT, false, true},
    {SP_GGUF_TYPE_IQ4_XS, SP_DTYPE_U8, "iq4_xs", 4, SP_DTYPE_COUNT, false, true},
};
#define BLOCK 32  // elements of a block of every repacked type

static const struct gguf_read *read_of(enum sp_gguf_type t) {
    for (size_t i = 0; i < sizeof reads / sizeof *reads; i++)
        if (reads[i].type == t) return &reads[i];
    return NULL;
}

static uint16_t rd16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }

/* 4-bit block codes (16 bytes, element j and j + 16 in byte j) in MLX's order into out (16 bytes). */
static void nibbles(const unsigned char *qs, unsigned char *out) {
#ifdef __SSE2__
    /* elements 0-15 (low nibbles) and 16-31 (high ones) a byte each; each
     * 16-bit lane's two (even, odd) become even | odd << 4 in its low byte */
    const __m128i low4 = _mm_set1_epi8(15), low8 = _mm_set1_epi16(0xff);
    __m128i v = _mm_loadu_si128((const __m128i *)(const void *)qs);
    __m128i lo = _mm_and_si128(v, low4), hi = _mm_and_si128(_mm_srli_epi16(v, 4), low4);
    lo = _mm_and_si128(_mm_or_si128(lo, _mm_srli_epi16(lo, 4)), low8);
    hi = _mm_and_si128(_mm_or_si128(hi, _mm_srli_epi16(hi, 4)), low8);
    _mm_storeu_si128((__m128i *)(void *)out, _mm_packus_epi16(lo, hi));
    return;
#endif
    for (int b = 0; b < 16; b++) {
        int e0 = 2 * b, e1 = 2 * b + 1;
        unsigned c0 = e0 < 16 ? qs[e0] & 15u : qs[e0 - 16] >> 4, c1 = e1 < 16 ? qs[e1] & 15u : qs[e1 - 16] >> 4;
        out[b] = (unsigned char)(c0 | c1 << 4);
    }
}

/* 5-bit block codes (element j's low four bits as nibbles() reads them,
 * its fifth bit j of qh) packed LSB first into out (20 bytes). */
static void fives(const unsigned char *qh, const unsigned char *qs, unsigned char *out) {
    uint32_t h = (uint32_t)qh[0] | (uint32_t)qh[1] << 8 | (uint32_t)qh[2] << 16 | (uint32_t)qh[3] << 24;
    memset(out, 0, 20);
    for (int j = 0; j < BLOCK; j++) {
        unsigned q = (j < 16 ? qs[j] & 15u : qs[j - 16] >> 4) | ((h >> j) & 1u) << 4, bit = 5u * (unsigned)j;
        out[bit >> 3] |= (unsigned char)(q << (bit & 7));
        if ((bit & 7) > 3) out[(bit >> 3) + 1] |= (unsigned char)(q >> (8 - (bit & 7)));
    }
}

/* One block of src (type t) into its codes, scale and bias; false where a
 * bias does not fit f16. */
static bool repack_block(enum sp_gguf_type t, const unsigned char *src, unsigned char *codes, unsigned char *scale,
                         unsigned char *bias) {
    uint16_t d = 0, b = 0;
    switch (t) {
    case SP_GGUF_TYPE_Q8_0:
        d = rd16(src);
        for (int k = 0; k < BLOCK; k++) codes[k] = (unsigned char)((int)(int8_t)src[2 + k] + 128);
        b = sp_f32_to_f16(-128.0f * sp_f16_to_f32(d));
        break;
    case SP_GGUF_TYPE_Q4_0:
        d = rd16(src);
        nibbles(src + 2, codes);
        b = sp_f32_to_f16(-8.0f * sp_f16_to_f32(d));
        break;
    case SP_GGUF_TYPE_Q4_1:
        d = rd16(src);
        b = rd16(src + 2);
        nibbles(src + 4, codes);
        break;
    case SP_GGUF_TYPE_Q5_0:
        d = rd16(src);
        fives(src + 2, src + 6, codes);
        b = sp_f32_to_f16(-16.0f * sp_f16_to_f32(d));
        break;
    case SP_GGUF_TYPE_Q5_1:
        d = rd16(src);
        b = rd16(src + 2);
        fives(src + 4, src + 8, codes);
        break;
    default:  // MXFP4
        scale[0] = src[0];
        nibbles(src + 1, codes);
        return true;
    }
    memcpy(scale, &d, 2);
    memcpy(bias, &b, 2);
    return isfinite(sp_f16_to_f32(b)) || !isfinite(sp_f16_to_f32(d));
}

/* Rows of src (heads of d rows) in GGUF's order, row h d + 2 b + a, hold
 * Hugging Face's row h d + a d / 2 + b: the GGUF row of output row o. */
static int64_t src_row(int64_t o, int64_t d) {
    int64_t h = o / d, r = o % d, a = r / (d / 2), b = r % (d / 2);
    return h * d + 2 * b + a;
}

/* Each tensor made in a file's owned memory starts a multiple of this
 * many bytes from its (malloc-aligned) start: an MXFP4 tensor's 17 bytes a
 * block would leave the next one's floats unaligned. */
#define OWNED_ALIGN 64

/* What shard_file makes of one GGUF tensor. */
struct plan {
    const struct sp_gguf_tensor *t;
    const struct gguf_read *rd;
    char hf[96];   // its Hugging Face module, or a bare parameter's name
    const char *suffix;  // the parameter's: ".weight", ".bias" or "" (bare)
    int64_t d;     // rows of a head to reorder, or 0
    int64_t rows;  // product of the dims past the first
    size_t owned;  // bytes it takes in f->owned (a multiple of OWNED_ALIGN)
    unsigned char *dst;  // its place in f->owned, or NULL
    atomic_llong bad;    // a block (its offset in the tensor) whose bias does not fit f16, or -1
};

/* The module's parameters in the quantization section. */
static enum sp_status put_module(cJSON *quant, const struct plan *pl) {
    cJSON *o = cJSON_CreateObject();
    int group = pl->rd->native ? (int)sp_gguf_type_traits(pl->t->type)->block : BLOCK;
    if (!o || !cJSON_AddItemToObject(quant, pl->hf, o) || !cJSON_AddNumberToObject(o, "group_size", group) ||
        !cJSON_AddNumberToObject(o, "bits", pl->rd->bits) || !cJSON_AddStringToObject(o, "mode", pl->rd->mode))
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    return SP_OK;
}

/* Adds tensor name (dtype, shape: the plan's leading dims then last) over data. */
static enum sp_status add_tensor(struct sp_st_file *f, const struct plan *pl, const char *suffix, enum sp_dtype dt,
                                 int64_t last, const void *data, size_t nbytes) {
    struct sp_st_tensor *o = &f->tensors[f->n_tensors];
    char *name = f->names + f->n_tensors * 96;
    snprintf(name, 96, "%s%s", pl->hf, suffix);
    const struct sp_gguf_tensor *t = pl->t;
    o->name = name;
    o->dtype = dt;
    o->ndim = t->n_dims;
    for (int k = 0; k < t->n_dims; k++) o->shape[k] = t->dims[t->n_dims - 1 - k];  // ggml lists a row first
    o->shape[t->n_dims - 1] = last;
    o->offset = t->offset;
    o->nbytes = nbytes;
    o->data = data;
    size_t l = strlen(name);
    int64_t prev;
    if (sp_strmap_get(&f->by_name, name, l, &prev)) return sp_errorf(SP_ERR_FORMAT, "%s: two tensors are %s", f->path, name);
    enum sp_status st = sp_strmap_put(&f->by_name, name, l, f->n_tensors);
    if (st == SP_OK) f->n_tensors++;
    return st;
}

/* Where pl's codes, scales and biases go in its part of f->owned (pl->dst). */
static void repacked_arrays(const struct plan *pl, unsigned char **codes, unsigned char **scales,
                            unsigned char **biases) {
    int64_t blocks = pl->t->dims[0] / BLOCK;
    size_t cb = (size_t)pl->rd->bits * BLOCK / 8, sb = sp_dtype_size(pl->rd->scale_dtype);
    *codes = pl->dst;
    *scales = *codes + (size_t)(pl->rows * blocks) * cb;
    *biases = *scales + (size_t)(pl->rows * blocks) * sb;
}

/* Rows [r0, r1) of pl's tensor (mapped by map) into pl->dst: reordered
 * (floats and native blocks), or repacked block by block (a block whose
 * bias does not fit f16 goes to pl->bad); then the mapped pages they came
 * from let go, so that a file repacked whole is not held twice while it
 * opens. */
static void fill_rows(const struct sp_map *map, struct plan *pl, int64_t r0, int64_t r1) {
    const struct sp_gguf_tensor *t = pl->t;
    const unsigned char *src = t->data;
    size_t srb = t->nbytes / (size_t)pl->rows;  // bytes of a source row
    if (!pl->rd->mode || pl->rd->native) {
        for (int64_t o = r0; o < r1; o++) memcpy(pl->dst + (size_t)o * srb, src + (size_t)src_row(o, pl->d) * srb, srb);
    } else {
        int64_t blocks = t->dims[0] / BLOCK;
        size_t cb = (size_t)pl->rd->bits * BLOCK / 8, sb = sp_dtype_size(pl->rd->scale_dtype);
        size_t bb = sp_gguf_type_traits(t->type)->block_bytes;
        unsigned char *codes, *scales, *biases;
        repacked_arrays(pl, &codes, &scales, &biases);
        for (int64_t o = r0; o < r1; o++) {
            const unsigned char *row = src + (size_t)(pl->d ? src_row(o, pl->d) : o) * srb;
            for (int64_t k = 0; k < blocks; k++) {
                size_t i = (size_t)(o * blocks + k);
                if (!repack_block(t->type, row + (size_t)k * bb, codes + i * cb, scales + i * sb, biases + i * sb))
                    atomic_store(&pl->bad, (long long)((size_t)(row - src) + (size_t)k * bb));
            }
        }
    }
    /* a chunk holds whole heads, so its rows come from the same rows */
    sp_map_drop(map, (size_t)(src - map->data) + (size_t)r0 * srb, (size_t)(r1 - r0) * srb);
}

/* Pieces of the planned tensors' rows (whole heads where rows are
 * reordered, about FILL_BYTES of the file each) for the threads to take. */
#define FILL_BYTES ((size_t)8 << 20)
struct fill_item {
    struct plan *pl;
    int64_t r0, r1;
};
struct fill_job {
    const struct sp_map *map;
    struct fill_item *items;
    int64_t n;
    atomic_llong next;
};

static void fill_job_run(void *ctx, int tid, int nth) {
    struct fill_job *j = ctx;
    int64_t lo, hi;
    while (sp_pool_take(&j->next, j->n, 1, &lo, &hi))
        for (int64_t i = lo; i < hi; i++) fill_rows(j->map, j->items[i].pl, j->items[i].r0, j->items[i].r1);
}

/* Every plan with rows to move into f->owned (repacked or reordered), on
 * every core: opening a file repacked whole is bound by these copies. */
static enum sp_status fill_all(const struct sp_map *map, struct plan *plans, int64_t np) {
    int64_t n = 0;
    for (int pass = 0; pass < 2; pass++) {
        struct fill_job j = {.map = map, .n = 0};
        if (pass) {
            j.items = sp_malloc((size_t)(n ? n : 1) * sizeof *j.items, SP_MEM_MISC);
            if (!j.items) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        }
        for (int64_t p = 0; p < np; p++) {
            struct plan *pl = &plans[p];
            if (!pl->dst) continue;
            size_t srb = pl->t->nbytes / (size_t)pl->rows;
            int64_t unit = pl->d ? pl->d : 1, per = (int64_t)(FILL_BYTES / (srb ? srb : 1)) / unit * unit;
            if (per < unit) per = unit;
            for (int64_t r = 0; r < pl->rows; r += per) {
                if (pass) j.items[j.n] = (struct fill_item){pl, r, r + per < pl->rows ? r + per : pl->rows};
                j.n++;
            }
        }
        if (!pass) {
            n = j.n;
            continue;
        }
        struct sp_pool *pool = NULL;
        enum sp_status st = sp_pool_create(0, &pool);
        if (st == SP_OK) {
            sp_pool_run(pool, fill_job_run, &j);
            sp_pool_free(pool);
        }
        sp_free(j.items);
        return st;
    }
    return SP_OK;
}

/* Plan pl's tensor into f: floats and native blocks in place, or what
 * fill_all put in its place in f->owned. */
static enum sp_status make_tensor(struct sp_st_file *f, const struct plan *pl) {
    const struct sp_gguf_tensor *t = pl->t;
    int64_t cols = t->dims[0], rows = pl->rows;
    if (!pl->rd->mode || pl->rd->native) {
        int64_t last = pl->rd->native ? (int64_t)(t->nbytes / (size_t)rows) : cols;
        return add_tensor(f, pl, pl->suffix, pl->rd->dtype, last, pl->dst ? pl->dst : t->data, t->nbytes);
    }
    long long bad = atomic_load(&pl->bad);
    if (bad >= 0)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s: a block scale of %g does not fit the f16 bias of its "
                         "affine form", f->path, t->name, (double)sp_f16_to_f32(rd16((const unsigned char *)t->data + bad)));
    int64_t blocks = cols / BLOCK;
    size_t cb = (size_t)pl->rd->bits * BLOCK / 8, sb = sp_dtype_size(pl->rd->scale_dtype);
    unsigned char *codes, *scales, *biases;
    repacked_arrays(pl, &codes, &scales, &biases);
    enum sp_status st = add_tensor(f, pl, ".weight", SP_DTYPE_U8, blocks * (int64_t)cb, codes, (size_t)(rows * blocks) * cb);
    if (st == SP_OK) st = add_tensor(f, pl, ".scales", pl->rd->scale_dtype, blocks, scales, (size_t)(rows * blocks) * sb);
    if (st == SP_OK && pl->rd->biases)
        st = add_tensor(f, pl, ".biases", pl->rd->scale_dtype, blocks, biases, (size_t)(rows * blocks) * sb);
    return st;
}

static int cmp_map_range(const void *a, const void *b) {
    size_t x = ((const struct sp_map_range *)a)->off, y = ((const struct sp_map_range *)b)->off;
    return (x > y) - (x < y);
}

/* The mapping narrowed to its header (the metadata the tokenizer and chat
 * template are read from) and the tensors of f that still point into it:
 * the blocks repacked or reordered into f->owned are not read again, and
 * would otherwise stay in memory twice (mapped, and in the copy the load
 * makes of the mapping). */
static enum sp_status keep_mapped(const struct sp_st_file *f, const struct sp_gguf_file *g, struct sp_map *map) {
    struct sp_map_range *r = sp_malloc((size_t)(f->n_tensors + 1) * sizeof *r, SP_MEM_MISC);
    if (!r) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    size_t n = 0;
    r[n++] = (struct sp_map_range){0, g->data_offset};
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const unsigned char *p = f->tensors[i].data;
        if (p && p >= map->data && p < map->data + map->size)
            r[n++] = (struct sp_map_range){(size_t)(p - map->data), f->tensors[i].nbytes};
    }
    qsort(r, n, sizeof *r, cmp_map_range);
    size_t w = 0;  // overlapping or touching ranges merged
    for (size_t i = 0; i < n; i++) {
        if (w && r[i].off <= r[w - 1].off + r[w - 1].len) {
            size_t end = r[i].off + r[i].len;
            if (end > r[w - 1].off + r[w - 1].len) r[w - 1].len = end - r[w - 1].off;
        } else {
            r[w++] = r[i];
        }
    }
    enum sp_status st = sp_map_keep(map, r, w);
    sp_free(r);
    return st;
}

/* Whether tensor name belongs to a block at or past n_layers (Ling's MTP blocks). */
static bool past_layers(const char *name, int64_t n_layers) {
    unsigned layer;
    return sscanf(name, "blk.%u.", &layer) == 1 && (int64_t)layer >= n_layers;
}

/* Shard si of s as a safetensors-like file: its mapping moved over, its
 * tensors under Hugging Face names, reordered rows and repacked blocks in
 * f->owned; quantized modules added to quant. */

static enum sp_status shard_file(const struct gguf_arch *A, struct sp_gguf_split *s, int si, int64_t n_head,
                                 int64_t n_kv, int64_t n_layers, cJSON *quant, struct sp_st_file **out) {
    struct sp_gguf_file *g = s->shards[si];
    struct sp_st_file *f = sp_calloc(1, sizeof *f, SP_MEM_MODEL);
    if (!f) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    sp_strmap_init(&f->by_name, SP_MEM_MODEL);
    f->map = (struct sp_map){.fd = -1};
    *out = f;
    int64_t n = 0, n_out = 0;
    for (int64_t i = 0; i < s->n_tensors; i++) n += s->shard_of[i] == si;
    struct plan *plans = sp_calloc((size_t)(n ? n : 1), sizeof *plans, SP_MEM_MISC);
    f->path = sp_strdup(g->path, SP_MEM_MODEL);
    if (!plans || !f->path) {
        sp_free(plans);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    enum sp_status st = SP_OK;
    size_t owned = 0;
    int64_t np = 0;
    for (int64_t i = 0; i < s->n_tensors && st == SP_OK; i++) {
        if (s->shard_of[i] != si || !strcmp(s->tensors[i]->name, ROPE_FREQS) || past_layers(s->tensors[i]->name, n_layers))
            continue;
        struct plan *pl = &plans[np++];
        const struct sp_gguf_tensor *t = pl->t = s->tensors[i];
        int reorder;
        pl->rows = sp_gguf_numel(t) / t->dims[0];
        if (!hf_name(t->name, pl->hf, sizeof pl->hf, &pl->suffix, &reorder)) {
            st = sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s has no place in a %s model", g->path, t->name, A->name);
            break;
        }
        if (!(pl->rd = read_of(t->type))) {
            st = sp_errorf(SP_ERR_UNSUPPORTED,
                           "%s: tensor %s is %s: the GGUF types read so far are F32, F16, BF16, Q8_0, Q4_0, Q4_1, "
                           "Q5_0, Q5_1, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ4_NL, IQ4_XS and MXFP4", g->path, t->name,
                           sp_gguf_type_name(t->type));
            break;
        }
        if (A->reorder_qk && reorder != REORDER_NONE) {
            int64_t heads = reorder == REORDER_Q ? n_head : n_kv;
            if (t->n_dims != 2 || pl->rows % heads || (pl->rows / heads) % 2) {
                st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: %lld rows are not %lld heads of an even size", g->path,
                               t->name, (long long)pl->rows, (long long)heads);
                break;
            }
            pl->d = pl->rows / heads;
        }
        int64_t be = sp_gguf_type_traits(t->type)->block;
        if (pl->rd->mode && t->dims[0] % be) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: rows of %lld are not whole blocks of %lld", g->path, t->name,
                           (long long)t->dims[0], (long long)be);
            break;
        }
        if (pl->rd->mode && strcmp(pl->suffix, ".weight")) {
            st = sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s is %s: only weight matrices are read quantized", g->path,
                           t->name, sp_gguf_type_name(t->type));
            break;
        }
        if (pl->rd->native) {
            pl->owned = pl->d ? t->nbytes : 0;
            n_out++;
            st = put_module(quant, pl);
        } else if (pl->rd->mode) {
            if (t->dims[0] % BLOCK) {
                st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: rows of %lld are not whole blocks", g->path, t->name,
                               (long long)t->dims[0]);
                break;
            }
            size_t blocks = (size_t)(pl->rows * (t->dims[0] / BLOCK));
            pl->owned = blocks * ((size_t)pl->rd->bits * BLOCK / 8 +
                                  sp_dtype_size(pl->rd->scale_dtype) * (pl->rd->biases ? 2 : 1));
            n_out += pl->rd->biases ? 3 : 2;
            st = put_module(quant, pl);
        } else {
            pl->owned = pl->d ? t->nbytes : 0;
            n_out++;
        }
        pl->owned = (pl->owned + OWNED_ALIGN - 1) / OWNED_ALIGN * OWNED_ALIGN;
        owned += pl->owned;
    }
    f->tensors = sp_calloc((size_t)(n_out ? n_out : 1), sizeof *f->tensors, SP_MEM_MODEL);
    f->names = sp_malloc((size_t)(n_out ? n_out : 1) * 96, SP_MEM_MODEL);
    if (st == SP_OK && (!f->tensors || !f->names)) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK && owned && !(f->owned = sp_malloc_huge(owned, SP_MEM_WEIGHTS)))
        st = sp_errorf(SP_ERR_NOMEM, "%zu bytes for the reordered and repacked tensors", owned);
    f->owned_bytes = f->owned ? owned : 0;
    unsigned char *at = f->owned;
    for (int64_t i = 0; i < np && st == SP_OK; i++) {
        plans[i].dst = plans[i].owned ? at : NULL;
        atomic_init(&plans[i].bad, -1);
        at += plans[i].owned;
    }
    if (st == SP_OK && owned) st = fill_all(&g->map, plans, np);
    for (int64_t i = 0; i < np && st == SP_OK; i++) st = make_tensor(f, &plans[i]);
    sp_free(plans);
    if (st == SP_OK && owned) st = keep_mapped(f, g, &g->map);
    if (st != SP_OK) return st;
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
    int64_t n_head = 0, n_kv = 0, n_layers = 0;
    const struct sp_gguf_tensor *embd = sp_gguf_split_find(s, "token_embd.weight", NULL);
    if ((st = sp_gguf_get_str(f, "general.architecture", &arch)) != SP_OK) goto done;
    const struct gguf_arch *A = arch_of(arch);
    if (!A) {
        st = sp_errorf(SP_ERR_UNSUPPORTED,
                       "%s: general.architecture \"%.*s\": the GGUF architectures read so far are llama, qwen3, "
                       "qwen3moe, gpt-oss and bailingmoe2",
                       path, (int)arch.len, arch.data);
        goto done;
    }
    if (!embd || embd->n_dims != 2) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: no 2-D token_embd.weight", path);
        goto done;
    }
    mf->config = sp_json_object();
    if (!mf->config) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    bool tied = !sp_gguf_split_find(s, "output.weight", NULL);
    if ((st = arch_config(A, s, embd->dims[1], tied, mf->config, &n_head, &n_kv, &n_layers)) != SP_OK ||
        (st = put_rope_freqs(s, mf->config)) != SP_OK)
        goto done;
    /* a module each (the global parameters are never looked up), in the config if any */
    cJSON *quant = sp_json_object();
    if (!quant || !cJSON_AddNumberToObject(quant, "group_size", BLOCK) || !cJSON_AddNumberToObject(quant, "bits", 4)) {
        cJSON_Delete(quant);
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int i = 0; i < s->n_shards && st == SP_OK; i++) {
        struct sp_st_file *sf = NULL;
        st = shard_file(A, s, i, n_head, n_kv, n_layers, quant, &sf);
        if (st == SP_OK) {
            st = sp_model_files_add(mf, sf);
        } else {
            sp_st_close(sf);
        }
    }
    if (cJSON_GetArraySize(quant) > 2) {
        if (!cJSON_AddItemToObject(mf->config, "quantization", quant)) {
            cJSON_Delete(quant);
            if (st == SP_OK) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        }
    } else {
        cJSON_Delete(quant);
    }
done:
    sp_gguf_split_close(s);
    return st;
}
