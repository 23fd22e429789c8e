/*
 * arch.h - the architecture descriptor: everything the one forward pass
 * needs to know about a model, filled from config.json. Architectures are
 * data (DESIGN.md §3): nothing downstream branches on a model name, only on
 * the fields below.
 *
 *     struct sp_arch a;
 *     if (sp_arch_from_config(config_json, &a) != SP_OK) puts(sp_error_msg());
 *     for (int64_t l = 0; l < a.n_layers; l++) if (a.layer_moe[l]) ...
 *     sp_arch_free(&a);
 */
#ifndef SP_MODEL_ARCH_H
#define SP_MODEL_ARCH_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

/* X(enum suffix, config.json model_type) */
#define SP_ARCH_LIST(X)                                                        \
    X(LLAMA, "llama")                                                          \
    X(QWEN3, "qwen3")                                                          \
    X(QWEN3_MOE, "qwen3_moe")                                                  \
    X(BAILING_MOE, "bailing_moe")                                              \
    X(GPT_OSS, "gpt_oss")                                                      \
    X(QWEN3_5_MOE, "qwen3_5_moe")                                              \
    X(BAILING_HYBRID, "bailing_hybrid")

enum sp_arch_id {
#define SP_X(e, name) SP_ARCH_##e,
    SP_ARCH_LIST(SP_X)
#undef SP_X
        SP_ARCH_COUNT
};

enum sp_router_kind {
    SP_ROUTER_NONE,
    SP_ROUTER_SOFTMAX_TOPK,        // softmax over all experts, top-k, optional renormalise
    SP_ROUTER_SIGMOID_GROUP_TOPK,  // sigmoid (+ selection bias), group-limited top-k, renormalise, scale
    SP_ROUTER_SOFTMAX_GROUP_TOPK,  // the same with softmax scores (bailing score_function "softmax")
    SP_ROUTER_TOPK_SOFTMAX,        // top-k of the logits, softmax over the chosen k
    SP_ROUTER_KIND_COUNT
};

enum sp_act_kind {
    SP_ACT_SILU,           // silu(gate) * up
    SP_ACT_SWIGLU_CLAMP,   // gpt-oss: gate <= limit, |up| <= limit, gate*sigmoid(alpha*gate)*(up+1)
    SP_ACT_KIND_COUNT
};

/* What mixes tokens in a layer: softmax attention over the KV cache,
 * Gated DeltaNet or Lightning linear attention over a recurrent state
 * (Qwen3.5, Ling 2.6), or multi-head latent attention over a cache of
 * latents (Ling 2.6). */
enum sp_layer_kind { SP_LAYER_ATTENTION, SP_LAYER_GATED_DELTA, SP_LAYER_LIGHTNING, SP_LAYER_MLA, SP_LAYER_KIND_COUNT };

/* FACTORS: each frequency divided by its own factor, as llama.cpp applies
 * a GGUF's rope_freqs.weight (Llama 3's scaling, computed by its converter):
 * "rope_scaling": {"rope_type": "factors", "factors": [rot_dims / 2 numbers]}. */
enum sp_rope_kind { SP_ROPE_NONE, SP_ROPE_LINEAR, SP_ROPE_YARN, SP_ROPE_LLAMA3, SP_ROPE_FACTORS, SP_ROPE_KIND_COUNT };

struct sp_rope {
    enum sp_rope_kind kind;
    double theta;
    double factor;
    int64_t orig_max_pos;            // yarn, llama3: original_max_position_embeddings
    double beta_fast, beta_slow;     // yarn
    bool truncate;                   // yarn: round the correction range to integers
    double attention_factor;         // yarn: cos/sin scale (0: 0.1 ln(factor) + 1)
    double low_freq_factor, high_freq_factor;  // llama3
    float *factors;                  // factors: (n_factors), owned by the arch
    int64_t n_factors;
    int64_t rot_dims;                // rotated dims per head (partial rotary), even
};

/* config.json's eos_token_id list, at most; the tokenizer may add one more. */
#define SP_ARCH_MAX_EOS 15

struct sp_arch {
    enum sp_arch_id id;
    const char *model_type;  // static string
    int64_t vocab, d_model, n_layers, n_heads, n_kv_heads, head_dim;
    int64_t d_ff;  // dense MLP width (0 when no layer is dense)
    int64_t max_pos;
    double norm_eps;
    int32_t eos[SP_ARCH_MAX_EOS];  // eos_token_id (a number or a list), each below vocab
    int n_eos;
    struct sp_rope rope;
    bool qk_norm;       // per-head RMSNorm of q and k before RoPE
    bool fused_qkv;     // one query_key_value projection
    bool qkv_bias, o_bias;
    bool attn_sinks;    // per-head sink logits in the softmax denominator
    bool attn_gate;     // q_proj gives each head's query and gate side by side; output *= sigmoid(gate)
    bool norm_offset;   // RMSNorm weights (not the linear attention's) scale by (1 + w)
    bool tie_embeddings;
    int64_t sliding_window;  // 0: none
    /* MoE */
    int64_t n_experts, n_experts_used, d_expert;
    int64_t n_shared_experts;  // 0: none
    int64_t d_shared;          // the shared experts' width together
    bool shared_gate;          // the shared expert's output times sigmoid(shared_expert_gate(x))
    enum sp_router_kind router;
    int64_t n_group, topk_group;  // group-limited routing (1, 1: none)
    double routed_scale;
    bool norm_topk_prob;
    bool router_bias;  // the router linear has a bias (gpt-oss)
    enum sp_act_kind act;
    double swiglu_limit, swiglu_alpha;
    int64_t n_mtp_layers;  // extra next-token-prediction layers after n_layers (not run)
    /* Gated DeltaNet layers: key heads of lin_k_dim, value heads of
     * lin_v_dim (a multiple of the key heads; value head j reads key head
     * j / (lin_v_heads / lin_k_heads)), a causal conv of lin_conv taps */
    int64_t lin_k_heads, lin_v_heads, lin_k_dim, lin_v_dim, lin_conv;
    /* Lightning layers (n_heads of head_dim, no GQA): each head's state
     * decays by exp(-slope_h (1 - (L - light_offset) / (n_layers - 1) +
     * 1e-5)) a token; the output norm is RMS over light_groups groups */
    int64_t light_groups, light_offset;
    /* MLA layers: q from d_model (mla_q_lora 0) or through a rank-mla_q_lora
     * bottleneck, a latent of mla_kv_lora and a shared rotary key of
     * mla_rope, per head mla_nope + mla_rope query dims and mla_v values */
    int64_t mla_q_lora, mla_kv_lora, mla_nope, mla_rope, mla_v;
    double mla_mscale;  // the softmax scale's factor (YaRN's mscale^2; 1 without)
    /* per layer, (n_layers) each; owned */
    bool *layer_moe;
    bool *layer_sliding;
    enum sp_layer_kind *layer_kind;
};

/* Whether any layer keeps a recurrent state (a sequence then continues only
 * from the position its state holds). */
bool sp_arch_recurrent(const struct sp_arch *a);
/* The floats of one sequence's recurrent state in layer L (0: none): the
 * conv's last lin_conv - 1 inputs and a [lin_k_dim, lin_v_dim] matrix per
 * value head. */
int64_t sp_arch_state_floats(const struct sp_arch *a, int64_t L);
/* The softmax attention the KV cache serves, as heads: MLA's is one
 * shared key head of latent and rotary dims (the latent cached, queries
 * absorbing the key up-projection), else the attention layers'. */
void sp_arch_attention_heads(const struct sp_arch *a, int64_t *heads, int64_t *kv_heads, int64_t *head_dim);
/* Channels of a Gated DeltaNet layer's conv: queries, keys and values. */
static inline int64_t sp_arch_conv_dim(const struct sp_arch *a) {
    return 2 * a->lin_k_heads * a->lin_k_dim + a->lin_v_heads * a->lin_v_dim;
}

const char *sp_arch_name(enum sp_arch_id id);
/* Reads a config.json object. Unknown model types are an error listing the
 * supported ones; recognised but unsupported ones say so. */
enum sp_status sp_arch_from_config(const cJSON *config, struct sp_arch *out);
void sp_arch_free(struct sp_arch *a);
/* "bailing_moe, qwen3_moe, ...": for messages and --help. */
const char *sp_arch_supported_list(void);
const char *sp_router_kind_name(enum sp_router_kind k);
const char *sp_rope_kind_name(enum sp_rope_kind k);
const char *sp_act_kind_name(enum sp_act_kind k);
const char *sp_layer_kind_name(enum sp_layer_kind k);

#endif
