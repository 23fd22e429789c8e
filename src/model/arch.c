/*
 * arch.c - config.json -> architecture descriptor. The per-architecture
 * knowledge lives here, as key spellings and defaults taken from each
 * reference implementation's config class; the rest of sparrow reads only
 * the descriptor.
 */
#include "model/arch.h"

#include <math.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

static const char *const arch_names[SP_ARCH_COUNT] = {
#define SP_X(e, name) name,
    SP_ARCH_LIST(SP_X)
#undef SP_X
};

/* model_type spellings that are known but not runnable yet, with why. */
static const struct {
    const char *model_type;
    const char *why;
} recognised_unsupported[] = {
    {"qwen3_next", "its fused in_proj_qkvz / in_proj_ba layout is not read yet (Qwen3.5's split one is)"},
    {"bailing_moe_linear", "hybrid linear attention is not implemented yet"},
};

const char *sp_arch_name(enum sp_arch_id id) { return (unsigned)id < SP_ARCH_COUNT ? arch_names[id] : "?"; }

const char *sp_arch_supported_list(void) {
    return "bailing_moe, bailing_hybrid, qwen3_moe, qwen3_5_moe, gpt_oss, qwen3, llama";
}

const char *sp_router_kind_name(enum sp_router_kind k) {
    static const char *const n[SP_ROUTER_KIND_COUNT] = {"none", "softmax-topk", "sigmoid-group-topk",
                                                        "softmax-group-topk", "topk-softmax"};
    return (unsigned)k < SP_ROUTER_KIND_COUNT ? n[k] : "?";
}

const char *sp_rope_kind_name(enum sp_rope_kind k) {
    static const char *const n[SP_ROPE_KIND_COUNT] = {"none", "linear", "yarn", "llama3", "factors"};
    return (unsigned)k < SP_ROPE_KIND_COUNT ? n[k] : "?";
}

const char *sp_act_kind_name(enum sp_act_kind k) {
    static const char *const n[SP_ACT_KIND_COUNT] = {"silu", "swiglu-clamp"};
    return (unsigned)k < SP_ACT_KIND_COUNT ? n[k] : "?";
}

const char *sp_layer_kind_name(enum sp_layer_kind k) {
    static const char *const n[SP_LAYER_KIND_COUNT] = {"attention", "gated-deltanet", "lightning", "mla"};
    return (unsigned)k < SP_LAYER_KIND_COUNT ? n[k] : "?";
}

bool sp_arch_recurrent(const struct sp_arch *a) {
    for (int64_t L = 0; L < a->n_layers; L++)
        if (a->layer_kind[L] == SP_LAYER_GATED_DELTA || a->layer_kind[L] == SP_LAYER_LIGHTNING) return true;
    return false;
}

int64_t sp_arch_state_floats(const struct sp_arch *a, int64_t L) {
    if (a->layer_kind[L] == SP_LAYER_LIGHTNING) return a->n_heads * a->head_dim * a->head_dim;
    if (a->layer_kind[L] != SP_LAYER_GATED_DELTA) return 0;
    return (a->lin_conv - 1) * sp_arch_conv_dim(a) + a->lin_v_heads * a->lin_k_dim * a->lin_v_dim;
}

void sp_arch_attention_heads(const struct sp_arch *a, int64_t *heads, int64_t *kv_heads, int64_t *head_dim) {
    *heads = a->n_heads;
    *kv_heads = a->n_kv_heads;
    *head_dim = a->head_dim;
    if (a->mla_kv_lora > 0) {
        *kv_heads = 1;
        *head_dim = a->mla_rope + a->mla_kv_lora;
    }
}

void sp_arch_free(struct sp_arch *a) {
    if (!a) return;
    sp_free(a->layer_moe);
    sp_free(a->layer_sliding);
    sp_free(a->layer_kind);
    sp_free(a->rope.factors);
    a->layer_moe = NULL;
    a->layer_sliding = NULL;
    a->layer_kind = NULL;
    a->rope.factors = NULL;
}

/* Reads keys, keeping the first error; a failed read returns the default. */
struct reader {
    const cJSON *cfg;
    enum sp_status st;
};

static const cJSON *rd_item(const struct reader *r, const char *key) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(r->cfg, key);
    return it && !cJSON_IsNull(it) ? it : NULL;
}

static int64_t rd_int(struct reader *r, const char *key, int64_t def) {
    int64_t v;
    enum sp_status st = sp_json_get_int(r->cfg, key, def, &v);
    if (st != SP_OK && r->st == SP_OK) r->st = st;
    return st == SP_OK ? v : def;
}

/* The first present of two spellings (transformers 5 renamed some keys). */
static int64_t rd_int2(struct reader *r, const char *key, const char *alt, int64_t def) {
    return rd_item(r, key) ? rd_int(r, key, def) : rd_int(r, alt, def);
}

static double rd_num(struct reader *r, const char *key, double def) {
    double v;
    enum sp_status st = sp_json_get_num(r->cfg, key, def, &v);
    if (st != SP_OK && r->st == SP_OK) r->st = st;
    return st == SP_OK ? v : def;
}

static bool rd_bool(struct reader *r, const char *key, bool def) {
    bool v;
    enum sp_status st = sp_json_get_bool(r->cfg, key, def, &v);
    if (st != SP_OK && r->st == SP_OK) r->st = st;
    return st == SP_OK ? v : def;
}

static const char *rd_str(struct reader *r, const char *key, const char *def) {
    const char *v;
    enum sp_status st = sp_json_get_str(r->cfg, key, def, &v);
    if (st != SP_OK && r->st == SP_OK) r->st = st;
    return st == SP_OK ? v : def;
}

/* rope_theta and rope_scaling, or transformers 5's rope_parameters. */
static enum sp_status read_rope(struct reader *r, struct sp_rope *rope, double default_theta) {
    const cJSON *params = rd_item(r, "rope_parameters");
    const cJSON *scaling = rd_item(r, "rope_scaling");
    if (params && !cJSON_IsObject(params))
        return sp_errorf(SP_ERR_FORMAT, "\"rope_parameters\": expected an object, got %s", sp_json_type_name(params));
    if (scaling && !cJSON_IsObject(scaling))
        return sp_errorf(SP_ERR_FORMAT, "\"rope_scaling\": expected an object, got %s", sp_json_type_name(scaling));
    rope->theta = rd_num(r, "rope_theta", default_theta);
    const cJSON *src = scaling ? scaling : params;
    if (params) {
        struct reader pr = {params, SP_OK};
        rope->theta = rd_num(&pr, "rope_theta", rope->theta);
        if (pr.st != SP_OK) return pr.st;
    }
    if (r->st != SP_OK) return r->st;
    /* inf arrives as a number too (cJSON reads 1e999); every frequency would be 0 or NaN */
    if (!(rope->theta > 0 && isfinite(rope->theta)))
        return sp_errorf(SP_ERR_FORMAT, "\"rope_theta\": %g must be positive and finite", rope->theta);
    rope->kind = SP_ROPE_NONE;
    rope->factor = 1.0;
    if (!src) return r->st;
    struct reader sr = {src, SP_OK};
    const char *type = rd_str(&sr, "rope_type", NULL);
    if (!type) type = rd_str(&sr, "type", "default");
    if (sr.st != SP_OK) return sr.st;
    rope->factor = rd_num(&sr, "factor", 1.0);
    if (strcmp(type, "default") == 0) {
        rope->kind = SP_ROPE_NONE;
    } else if (strcmp(type, "linear") == 0) {
        rope->kind = SP_ROPE_LINEAR;
    } else if (strcmp(type, "yarn") == 0) {
        rope->kind = SP_ROPE_YARN;
        rope->beta_fast = rd_num(&sr, "beta_fast", 32.0);
        rope->beta_slow = rd_num(&sr, "beta_slow", 1.0);
        rope->truncate = rd_bool(&sr, "truncate", true);
        rope->attention_factor = rd_num(&sr, "attention_factor", 0.0);
        rope->orig_max_pos = rd_int(&sr, "original_max_position_embeddings", 0);
    } else if (strcmp(type, "llama3") == 0) {
        rope->kind = SP_ROPE_LLAMA3;
        rope->low_freq_factor = rd_num(&sr, "low_freq_factor", 1.0);
        rope->high_freq_factor = rd_num(&sr, "high_freq_factor", 4.0);
        rope->orig_max_pos = rd_int(&sr, "original_max_position_embeddings", 8192);
    } else if (strcmp(type, "factors") == 0) {
        rope->kind = SP_ROPE_FACTORS;
        const cJSON *f = rd_item(&sr, "factors");
        int64_t n = cJSON_IsArray(f) ? cJSON_GetArraySize(f) : 0;
        if (n <= 0) return sp_errorf(SP_ERR_FORMAT, "rope scaling \"factors\": expected a non-empty array of numbers");
        if (!(rope->factors = sp_malloc((size_t)n * sizeof *rope->factors, SP_MEM_MODEL)))
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
        rope->n_factors = 0;
        for (const cJSON *e = f->child; e; e = e->next) {
            if (!cJSON_IsNumber(e) || !(e->valuedouble > 0 && isfinite(e->valuedouble)))
                return sp_errorf(SP_ERR_FORMAT, "rope scaling \"factors\"[%lld]: expected a positive number",
                                 (long long)rope->n_factors);
            rope->factors[rope->n_factors++] = (float)e->valuedouble;
        }
    } else {
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "rope scaling type \"%s\" is not supported (none, linear, yarn, llama3, factors)", type);
    }
    if (sr.st != SP_OK) return sr.st;
    if (!(rope->factor > 0 && isfinite(rope->factor)))
        return sp_errorf(SP_ERR_FORMAT, "rope scaling factor %g must be positive and finite", rope->factor);
    if (rope->kind == SP_ROPE_YARN && rope->orig_max_pos <= 0)
        rope->orig_max_pos = rd_int(r, "max_position_embeddings", 0);
    return r->st;
}

/* "layer_types" of gpt-oss style configs: sliding_attention / full_attention. */
static enum sp_status read_layer_types(struct reader *r, struct sp_arch *a, bool default_alternate) {
    const cJSON *lt = rd_item(r, "layer_types");
    if (!lt) {
        for (int64_t l = 0; l < a->n_layers; l++) a->layer_sliding[l] = default_alternate && (l % 2 == 0);
        return SP_OK;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != a->n_layers)
        return sp_errorf(SP_ERR_FORMAT, "\"layer_types\": expected an array of %lld strings", (long long)a->n_layers);
    int64_t l = 0;
    for (const cJSON *e = lt->child; e; e = e->next, l++) {
        if (cJSON_IsString(e) && strcmp(e->valuestring, "sliding_attention") == 0)
            a->layer_sliding[l] = true;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0)
            a->layer_sliding[l] = false;
        else
            return sp_errorf(SP_ERR_UNSUPPORTED, "\"layer_types\"[%lld]: expected \"sliding_attention\" or "
                             "\"full_attention\"", (long long)l);
    }
    return SP_OK;
}

/* Layers listed in qwen3_moe's "mlp_only_layers" are dense. */
static enum sp_status read_mlp_only_layers(struct reader *r, struct sp_arch *a) {
    const cJSON *m = rd_item(r, "mlp_only_layers");
    if (!m) return SP_OK;
    if (!cJSON_IsArray(m)) return sp_errorf(SP_ERR_FORMAT, "\"mlp_only_layers\": expected an array of layer indices");
    for (const cJSON *e = m->child; e; e = e->next) {
        int64_t l;
        if (!sp_json_is_int(e, &l) || l < 0 || l >= a->n_layers)
            return sp_errorf(SP_ERR_FORMAT, "\"mlp_only_layers\": %s is not a layer index below %lld",
                             sp_json_type_name(e), (long long)a->n_layers);
        a->layer_moe[l] = false;
    }
    return SP_OK;
}

static enum sp_status read_bailing(struct reader *r, struct sp_arch *a) {
    a->fused_qkv = true;
    a->qk_norm = rd_bool(r, "use_qk_norm", true);
    a->qkv_bias = rd_bool(r, "use_qkv_bias", false);
    a->o_bias = rd_bool(r, "use_bias", false);
    a->n_experts = rd_int(r, "num_experts", 0);
    a->n_experts_used = rd_int(r, "num_experts_per_tok", 0);
    a->d_expert = rd_int(r, "moe_intermediate_size", 0);
    a->n_shared_experts = rd_int(r, "num_shared_experts", 0);
    a->d_shared = a->n_shared_experts * a->d_expert;
    a->n_group = rd_int(r, "n_group", 1);
    a->topk_group = rd_int(r, "topk_group", 1);
    if (a->n_group <= 0) a->n_group = 1;
    if (a->topk_group <= 0) a->topk_group = a->n_group;
    a->routed_scale = rd_num(r, "routed_scaling_factor", 1.0);
    /* The reference always renormalises the top-k weights. */
    a->norm_topk_prob = true;
    const char *score = rd_str(r, "score_function", "sigmoid");
    if (strcmp(score, "sigmoid") == 0) {
        a->router = SP_ROUTER_SIGMOID_GROUP_TOPK;
    } else if (strcmp(score, "softmax") == 0) {
        a->router = SP_ROUTER_SOFTMAX_GROUP_TOPK;
    } else {
        return sp_errorf(SP_ERR_UNSUPPORTED, "\"score_function\": \"%s\" (supported: sigmoid, softmax)", score);
    }
    a->n_mtp_layers = rd_int(r, "num_nextn_predict_layers", 0);
    int64_t first_dense = rd_int(r, "first_k_dense_replace", 1);
    if (first_dense < 0 || first_dense > a->n_layers)
        return sp_errorf(SP_ERR_FORMAT, "\"first_k_dense_replace\": %lld is outside 0..%lld", (long long)first_dense,
                         (long long)a->n_layers);
    for (int64_t l = 0; l < a->n_layers; l++) a->layer_moe[l] = l >= first_dense;
    double partial = rd_num(r, "partial_rotary_factor", 1.0);
    if (!(partial > 0 && partial <= 1))
        return sp_errorf(SP_ERR_FORMAT, "\"partial_rotary_factor\": %g is outside (0, 1]", partial);
    a->rope.rot_dims = (int64_t)((double)a->head_dim * partial);
    return r->st;
}

static enum sp_status read_qwen3_moe(struct reader *r, struct sp_arch *a) {
    a->qk_norm = true;
    a->qkv_bias = a->o_bias = rd_bool(r, "attention_bias", false);
    a->n_experts = rd_int2(r, "num_experts", "num_local_experts", 0);
    a->n_experts_used = rd_int(r, "num_experts_per_tok", 0);
    a->d_expert = rd_int(r, "moe_intermediate_size", 0);
    a->norm_topk_prob = rd_bool(r, "norm_topk_prob", false);
    a->router = SP_ROUTER_SOFTMAX_TOPK;
    a->routed_scale = 1.0;
    int64_t step = rd_int(r, "decoder_sparse_step", 1);
    if (step <= 0) return sp_errorf(SP_ERR_FORMAT, "\"decoder_sparse_step\": %lld must be positive", (long long)step);
    for (int64_t l = 0; l < a->n_layers; l++) a->layer_moe[l] = a->n_experts > 0 && (l + 1) % step == 0;
    enum sp_status st = read_mlp_only_layers(r, a);
    return st != SP_OK ? st : r->st;
}

/* Qwen3.5 / 3.6 MoE (the text model of the vision-language wrapper): Gated
 * DeltaNet layers with a gated full-attention layer every
 * full_attention_interval, (1 + w) norms, every layer MoE with a gated
 * shared expert. */
static enum sp_status read_qwen3_5_moe(struct reader *r, struct sp_arch *a) {
    a->qk_norm = a->attn_gate = a->norm_offset = true;
    a->qkv_bias = a->o_bias = rd_bool(r, "attention_bias", false);
    a->n_experts = rd_int(r, "num_experts", 0);
    a->n_experts_used = rd_int(r, "num_experts_per_tok", 0);
    a->d_expert = rd_int(r, "moe_intermediate_size", 0);
    a->d_shared = rd_int(r, "shared_expert_intermediate_size", 0);
    a->n_shared_experts = a->d_shared > 0;
    a->shared_gate = true;
    a->norm_topk_prob = true;  // the reference always renormalises the top-k weights
    a->router = SP_ROUTER_SOFTMAX_TOPK;
    a->lin_k_heads = rd_int(r, "linear_num_key_heads", 16);
    a->lin_v_heads = rd_int(r, "linear_num_value_heads", 32);
    a->lin_k_dim = rd_int(r, "linear_key_head_dim", 128);
    a->lin_v_dim = rd_int(r, "linear_value_head_dim", 128);
    a->lin_conv = rd_int(r, "linear_conv_kernel_dim", 4);
    if (r->st != SP_OK) return r->st;
    if (a->lin_k_heads <= 0 || a->lin_v_heads <= 0 || a->lin_k_dim <= 0 || a->lin_v_dim <= 0 || a->lin_conv <= 0 ||
        a->lin_conv > 64 || a->lin_v_heads % a->lin_k_heads)
        return sp_errorf(SP_ERR_FORMAT, "linear attention: %lld key heads of %lld, %lld value heads of %lld and a "
                         "conv of %lld taps (positive, value heads a multiple of key heads, at most 64 taps)",
                         (long long)a->lin_k_heads, (long long)a->lin_k_dim, (long long)a->lin_v_heads,
                         (long long)a->lin_v_dim, (long long)a->lin_conv);
    for (int64_t l = 0; l < a->n_layers; l++) a->layer_moe[l] = true;
    /* partial_rotary_factor: in rope_parameters (transformers 5) or beside it */
    const cJSON *rp = rd_item(r, "rope_parameters");
    struct reader pr = {cJSON_IsObject(rp) ? rp : r->cfg, SP_OK};
    double partial = rd_num(&pr, "partial_rotary_factor", rd_num(r, "partial_rotary_factor", 0.25));
    if (pr.st != SP_OK) return pr.st;
    if (!(partial > 0 && partial <= 1))
        return sp_errorf(SP_ERR_FORMAT, "\"partial_rotary_factor\": %g is outside (0, 1]", partial);
    a->rope.rot_dims = (int64_t)((double)a->head_dim * partial);
    const cJSON *lt = rd_item(r, "layer_types");
    if (!lt) {
        int64_t every = rd_int(r, "full_attention_interval", 4);
        if (every <= 0)
            return sp_errorf(SP_ERR_FORMAT, "\"full_attention_interval\": %lld must be positive", (long long)every);
        for (int64_t l = 0; l < a->n_layers; l++)
            a->layer_kind[l] = (l + 1) % every ? SP_LAYER_GATED_DELTA : SP_LAYER_ATTENTION;
        return r->st;
    }
    if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != a->n_layers)
        return sp_errorf(SP_ERR_FORMAT, "\"layer_types\": expected an array of %lld strings", (long long)a->n_layers);
    int64_t l = 0;
    for (const cJSON *e = lt->child; e; e = e->next, l++) {
        if (cJSON_IsString(e) && strcmp(e->valuestring, "linear_attention") == 0)
            a->layer_kind[l] = SP_LAYER_GATED_DELTA;
        else if (cJSON_IsString(e) && strcmp(e->valuestring, "full_attention") == 0)
            a->layer_kind[l] = SP_LAYER_ATTENTION;
        else
            return sp_errorf(SP_ERR_UNSUPPORTED, "\"layer_types\"[%lld]: expected \"linear_attention\" or "
                             "\"full_attention\"", (long long)l);
    }
    return r->st;
}

/* Ling 2.6 (bailing_hybrid): Ling 2.0's MoE, with Lightning attention in
 * every layer but the last of each layer_group_size (and any past the last
 * whole group), which are MLA. */
static enum sp_status read_bailing_hybrid(struct reader *r, struct sp_arch *a) {
    enum sp_status st = read_bailing(r, a);
    if (st != SP_OK) return st;
    a->n_kv_heads = a->n_heads;  // Lightning's keys and values: a head each
    int64_t group = rd_int(r, "layer_group_size", 8);
    a->light_groups = rd_int(r, "group_norm_size", 1);
    a->light_offset = 1;  // the reference's (layer_idx - 1); vLLM's and mlx-lm's would be 0
    a->mla_q_lora = rd_int(r, "q_lora_rank", 0);
    a->mla_kv_lora = rd_int(r, "kv_lora_rank", 512);
    a->mla_nope = rd_int(r, "qk_nope_head_dim", 128);
    a->mla_rope = rd_int(r, "qk_rope_head_dim", 64);
    a->mla_v = rd_int(r, "v_head_dim", 128);
    a->mla_mscale = 1.0;
    const cJSON *rs = rd_item(r, "rope_scaling");
    if (cJSON_IsObject(rs)) {  // YaRN's mscale_all_dim scales MLA's softmax by mscale^2
        struct reader sr = {rs, SP_OK};
        double all = rd_num(&sr, "mscale_all_dim", 0), factor = rd_num(&sr, "factor", 1);
        if (sr.st != SP_OK) return sr.st;
        double m = all != 0 && factor > 1 ? 0.1 * all * log(factor) + 1.0 : 1.0;
        a->mla_mscale = m * m;
    }
    bool interleave = rd_bool(r, "rope_interleave", true);
    if (r->st != SP_OK) return r->st;
    if (group <= 0 || a->light_groups <= 0 || (a->n_heads * a->head_dim) % a->light_groups)
        return sp_errorf(SP_ERR_FORMAT, "\"layer_group_size\" %lld and \"group_norm_size\" %lld must be positive, "
                         "the latter dividing the %lld attention outputs", (long long)group, (long long)a->light_groups,
                         (long long)(a->n_heads * a->head_dim));
    if (a->mla_q_lora < 0 || a->mla_kv_lora <= 0 || a->mla_nope <= 0 || a->mla_v <= 0 ||
        a->mla_rope != a->rope.rot_dims)
        return sp_errorf(SP_ERR_FORMAT,
                         "MLA: q_lora_rank %lld, kv_lora_rank %lld, qk_nope_head_dim %lld, v_head_dim "
                         "%lld, qk_rope_head_dim %lld (which the rotary dims %lld must equal)",
                         (long long)a->mla_q_lora, (long long)a->mla_kv_lora, (long long)a->mla_nope,
                         (long long)a->mla_v, (long long)a->mla_rope, (long long)a->rope.rot_dims);
    if (a->mla_v != a->head_dim)
        return sp_errorf(SP_ERR_UNSUPPORTED, "MLA: v_head_dim %lld differs from head_dim %lld (one output projection "
                         "shape for both layer kinds)", (long long)a->mla_v, (long long)a->head_dim);
    if (!interleave)
        return sp_errorf(SP_ERR_UNSUPPORTED, "\"rope_interleave\": false (the reference fails on it too)");
    for (int64_t l = 0; l < a->n_layers; l++)
        a->layer_kind[l] = (l + 1) % group == 0 || l >= a->n_layers / group * group ? SP_LAYER_MLA : SP_LAYER_LIGHTNING;
    return SP_OK;
}

static enum sp_status read_gpt_oss(struct reader *r, struct sp_arch *a) {
    a->qkv_bias = a->o_bias = rd_bool(r, "attention_bias", true);
    a->attn_sinks = true;
    a->n_experts = rd_int2(r, "num_local_experts", "num_experts", 0);
    a->n_experts_used = rd_int2(r, "num_experts_per_tok", "experts_per_token", 0);
    a->d_expert = a->d_ff;
    a->d_ff = 0;
    a->router = SP_ROUTER_TOPK_SOFTMAX;
    a->router_bias = true;
    a->routed_scale = 1.0;
    a->act = SP_ACT_SWIGLU_CLAMP;
    a->swiglu_limit = rd_num(r, "swiglu_limit", 7.0);
    a->swiglu_alpha = 1.702;
    a->sliding_window = rd_int(r, "sliding_window", 128);
    for (int64_t l = 0; l < a->n_layers; l++) a->layer_moe[l] = true;
    enum sp_status st = read_layer_types(r, a, true);
    return st != SP_OK ? st : r->st;
}

static enum sp_status read_dense(struct reader *r, struct sp_arch *a) {
    if (a->id == SP_ARCH_QWEN3) {
        a->qk_norm = true;
        a->qkv_bias = a->o_bias = rd_bool(r, "attention_bias", false);
    } else {
        a->qkv_bias = a->o_bias = rd_bool(r, "attention_bias", false);
    }
    return r->st;
}

/* eos_token_id: absent, null, one id or a list of ids, each a row of the
 * vocabulary (an id past it could never be sampled, so generation would run
 * to the length limit every time). */
static enum sp_status read_eos(struct reader *r, struct sp_arch *a) {
    const cJSON *e = rd_item(r, "eos_token_id");
    if (!e) return SP_OK;
    if (!cJSON_IsArray(e) && !cJSON_IsNumber(e))
        return sp_errorf(SP_ERR_FORMAT, "\"eos_token_id\": expected a token id or a list of them, got %s",
                         sp_json_type_name(e));
    const cJSON *first = cJSON_IsArray(e) ? e->child : e;
    for (const cJSON *x = first; x; x = cJSON_IsArray(e) ? x->next : NULL) {
        int64_t v;
        if (!sp_json_is_int(x, &v))
            return sp_errorf(SP_ERR_FORMAT, "\"eos_token_id\": expected integer token ids, got %s", sp_json_type_name(x));
        if (v < 0 || v >= a->vocab)
            return sp_errorf(SP_ERR_FORMAT, "\"eos_token_id\": %lld is outside the vocabulary (vocab_size %lld)",
                             (long long)v, (long long)a->vocab);
        if (a->n_eos == SP_ARCH_MAX_EOS)
            return sp_errorf(SP_ERR_UNSUPPORTED, "\"eos_token_id\": more than %d ids", SP_ARCH_MAX_EOS);
        a->eos[a->n_eos++] = (int32_t)v;
    }
    return SP_OK;
}

static enum sp_status validate(const struct sp_arch *a) {
#define NEED_POS(v, key)                                                                                            \
    if ((v) <= 0) return sp_errorf(SP_ERR_FORMAT, "\"%s\": %lld must be positive", key, (long long)(v));
    NEED_POS(a->vocab, "vocab_size");
    NEED_POS(a->d_model, "hidden_size");
    NEED_POS(a->n_layers, "num_hidden_layers");
    NEED_POS(a->n_heads, "num_attention_heads");
    NEED_POS(a->n_kv_heads, "num_key_value_heads");
    NEED_POS(a->head_dim, "head_dim");
    NEED_POS(a->max_pos, "max_position_embeddings");
    if (a->n_heads % a->n_kv_heads != 0)
        return sp_errorf(SP_ERR_FORMAT, "num_attention_heads %lld is not a multiple of num_key_value_heads %lld",
                         (long long)a->n_heads, (long long)a->n_kv_heads);
    if (a->rope.rot_dims <= 0 || a->rope.rot_dims > a->head_dim || a->rope.rot_dims % 2)
        return sp_errorf(SP_ERR_FORMAT, "rotary dimensions %lld must be even and within head_dim %lld",
                         (long long)a->rope.rot_dims, (long long)a->head_dim);
    if (a->rope.kind == SP_ROPE_FACTORS && a->rope.n_factors != a->rope.rot_dims / 2)
        return sp_errorf(SP_ERR_FORMAT, "rope scaling \"factors\": %lld numbers for %lld rotary frequencies",
                         (long long)a->rope.n_factors, (long long)(a->rope.rot_dims / 2));
    bool any_moe = false, any_dense = false;
    for (int64_t l = 0; l < a->n_layers; l++) {
        any_moe |= a->layer_moe[l];
        any_dense |= !a->layer_moe[l];
    }
    if (any_dense) NEED_POS(a->d_ff, "intermediate_size");
    if (any_moe) {
        NEED_POS(a->n_experts, "num_experts");
        NEED_POS(a->n_experts_used, "num_experts_per_tok");
        NEED_POS(a->d_expert, "moe_intermediate_size");
        if (a->n_experts_used > a->n_experts)
            return sp_errorf(SP_ERR_FORMAT, "num_experts_per_tok %lld exceeds num_experts %lld",
                             (long long)a->n_experts_used, (long long)a->n_experts);
        if (a->n_experts % a->n_group != 0 || a->topk_group > a->n_group)
            return sp_errorf(SP_ERR_FORMAT, "n_group %lld / topk_group %lld do not divide num_experts %lld",
                             (long long)a->n_group, (long long)a->topk_group, (long long)a->n_experts);
        if (a->n_group > 1 && a->n_experts_used > a->topk_group * (a->n_experts / a->n_group))
            return sp_errorf(SP_ERR_FORMAT, "num_experts_per_tok %lld exceeds the %lld experts of topk_group groups",
                             (long long)a->n_experts_used, (long long)(a->topk_group * (a->n_experts / a->n_group)));
        if (a->n_shared_experts < 0 || a->d_shared < 0)
            return sp_errorf(SP_ERR_FORMAT, "the shared experts' count or width is negative");
    }
    if (a->sliding_window < 0) return sp_errorf(SP_ERR_FORMAT, "\"sliding_window\" is negative");
    if (!(a->norm_eps > 0 && isfinite(a->norm_eps)))
        return sp_errorf(SP_ERR_FORMAT, "\"rms_norm_eps\": %g must be positive and finite", a->norm_eps);
#undef NEED_POS
    return SP_OK;
}

enum sp_status sp_arch_from_config(const cJSON *config, struct sp_arch *a) {
    memset(a, 0, sizeof *a);
    if (!cJSON_IsObject(config)) return sp_errorf(SP_ERR_FORMAT, "config.json: expected a JSON object");
    struct reader r = {config, SP_OK};
    const char *mt = rd_str(&r, "model_type", NULL);
    if (r.st != SP_OK) return sp_errorf(r.st, "config.json: %s", sp_error_msg());
    if (!mt) return sp_errorf(SP_ERR_FORMAT, "config.json: no \"model_type\" (supported: %s)", sp_arch_supported_list());
    int id = -1;
    for (int i = 0; i < SP_ARCH_COUNT; i++)
        if (strcmp(mt, arch_names[i]) == 0) id = i;
    if (strcmp(mt, "bailing_moe_v2") == 0) id = SP_ARCH_BAILING_MOE;
    if (strcmp(mt, "qwen3_5_moe_text") == 0) id = SP_ARCH_QWEN3_5_MOE;
    if (strcmp(mt, "bailing_moe_v2_5") == 0) id = SP_ARCH_BAILING_HYBRID;
    if (id < 0) {
        for (size_t i = 0; i < sizeof recognised_unsupported / sizeof *recognised_unsupported; i++)
            if (strcmp(mt, recognised_unsupported[i].model_type) == 0)
                return sp_errorf(SP_ERR_UNSUPPORTED, "config.json: model_type \"%s\" is recognised but not supported "
                                 "yet: %s (supported: %s)", mt, recognised_unsupported[i].why, sp_arch_supported_list());
        return sp_errorf(SP_ERR_UNSUPPORTED, "config.json: unknown model_type \"%s\" (supported: %s)", mt,
                         sp_arch_supported_list());
    }
    a->id = (enum sp_arch_id)id;
    a->model_type = arch_names[id];
    /* a vision-language wrapper: the text model's fields in text_config */
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(config, "text_config");
    if (a->id == SP_ARCH_QWEN3_5_MOE && cJSON_IsObject(text)) r.cfg = text;
    a->vocab = rd_int(&r, "vocab_size", 0);
    a->d_model = rd_int(&r, "hidden_size", 0);
    a->n_layers = rd_int(&r, "num_hidden_layers", 0);
    a->n_heads = rd_int(&r, "num_attention_heads", 0);
    a->n_kv_heads = rd_int(&r, "num_key_value_heads", a->n_heads);
    if (a->n_kv_heads == 0) a->n_kv_heads = a->n_heads;
    /* Ling's config class defaults head_dim to 128; the others derive it. */
    int64_t def_head = a->n_heads > 0 ? a->d_model / a->n_heads : 0;
    if ((a->id == SP_ARCH_BAILING_MOE || a->id == SP_ARCH_BAILING_HYBRID) && !rd_item(&r, "head_dim")) def_head = 128;
    if (a->id == SP_ARCH_QWEN3_5_MOE && !rd_item(&r, "head_dim")) def_head = 256;
    a->head_dim = rd_int(&r, "head_dim", def_head);
    a->d_ff = rd_int(&r, "intermediate_size", 0);
    a->max_pos = rd_int(&r, "max_position_embeddings", 4096);
    a->norm_eps = rd_num(&r, "rms_norm_eps", 1e-6);
    a->tie_embeddings = rd_bool(&r, "tie_word_embeddings", a->id == SP_ARCH_QWEN3);
    a->n_group = a->topk_group = 1;
    a->routed_scale = 1.0;
    a->act = SP_ACT_SILU;
    if (r.st != SP_OK) return sp_errorf(r.st, "config.json: %s", sp_error_msg());
    if (a->n_layers <= 0 || a->n_layers > 100000)
        return sp_errorf(SP_ERR_FORMAT, "config.json: \"num_hidden_layers\": %lld is not a plausible layer count",
                         (long long)a->n_layers);
    a->layer_moe = sp_calloc((size_t)a->n_layers, sizeof *a->layer_moe, SP_MEM_MODEL);
    a->layer_sliding = sp_calloc((size_t)a->n_layers, sizeof *a->layer_sliding, SP_MEM_MODEL);
    a->layer_kind = sp_calloc((size_t)a->n_layers, sizeof *a->layer_kind, SP_MEM_MODEL);
    if (!a->layer_moe || !a->layer_sliding || !a->layer_kind) {
        sp_arch_free(a);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    a->rope.rot_dims = a->head_dim;
    enum sp_status st = read_rope(&r, &a->rope, a->id == SP_ARCH_GPT_OSS ? 150000.0 : 10000.0);
    if (st == SP_OK) {
        switch (a->id) {
        case SP_ARCH_BAILING_MOE: st = read_bailing(&r, a); break;
        case SP_ARCH_QWEN3_MOE: st = read_qwen3_moe(&r, a); break;
        case SP_ARCH_GPT_OSS: st = read_gpt_oss(&r, a); break;
        case SP_ARCH_QWEN3_5_MOE: st = read_qwen3_5_moe(&r, a); break;
        case SP_ARCH_BAILING_HYBRID: st = read_bailing_hybrid(&r, a); break;
        default: st = read_dense(&r, a); break;
        }
    }
    if (st == SP_OK) st = validate(a);
    if (st == SP_OK) st = read_eos(&r, a);
    if (st == SP_OK && r.cfg != config && !a->n_eos) {  // the wrapper's, where the text model has none
        struct reader top = {config, SP_OK};
        st = read_eos(&top, a);
    }
    if (st != SP_OK) {
        sp_error_prefix("config.json (%s): ", a->model_type);
        sp_arch_free(a);
    }
    return st;
}
