/*
 * weights.h - tensor roles: the file's tensor names resolved once into a
 * table keyed by (layer, role, expert), so everything downstream asks for
 * "layer 3's expert 17 gate projection" and never for a name (DESIGN.md §3).
 *
 * Both ways MoE experts are stored map to the same roles: one tensor per
 * expert (Hugging Face: mlp.experts.E.gate_proj.weight) or one stacked
 * tensor [E, out, in] (mlx-lm: mlp.switch_mlp.gate_proj.weight; gpt-oss:
 * mlp.experts.gate_up_proj [E, in, 2*ff], interleaved and transposed).
 * A vision-language wrapper's text model (model.language_model.*, mlx-lm's
 * language_model.model.*) reads as the model; its vision tower
 * (model.visual.*) and multi-token-prediction
 * weights (mtp.*, or layers past n_layers) are kept apart, never run.
 *
 *     struct sp_weights w;
 *     sp_weights_build(files, n_layers, &w);
 *     const struct sp_wslot *s = sp_weights_find(&w, 3, SP_ROLE_EXP_GATE, 17);
 *     sp_weights_free(&w);
 */
#ifndef SP_MODEL_WEIGHTS_H
#define SP_MODEL_WEIGHTS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"
#include "core/strmap.h"
#include "format/modeldir.h"

/* X(enum suffix, name, accounting class) */
#define SP_ROLE_LIST(X)                                                        \
    X(EMBED, "embedding", EMBEDDING)                                           \
    X(OUT_NORM, "output_norm", NORMS)                                          \
    X(LM_HEAD, "lm_head", LM_HEAD)                                             \
    X(ATTN_NORM, "attn_norm", NORMS)                                           \
    X(ATTN_Q, "attn_q", ATTENTION)                                             \
    X(ATTN_K, "attn_k", ATTENTION)                                             \
    X(ATTN_V, "attn_v", ATTENTION)                                             \
    X(ATTN_QKV, "attn_qkv", ATTENTION)                                         \
    X(ATTN_O, "attn_o", ATTENTION)                                             \
    X(ATTN_Q_NORM, "attn_q_norm", NORMS)                                       \
    X(ATTN_K_NORM, "attn_k_norm", NORMS)                                       \
    X(ATTN_SINKS, "attn_sinks", ATTENTION)                                     \
    X(FFN_NORM, "ffn_norm", NORMS)                                             \
    X(FFN_GATE, "ffn_gate", DENSE_MLP)                                         \
    X(FFN_UP, "ffn_up", DENSE_MLP)                                             \
    X(FFN_DOWN, "ffn_down", DENSE_MLP)                                         \
    X(ROUTER, "router", ROUTER)                                                \
    X(EXPERT_BIAS, "expert_bias", ROUTER)                                      \
    X(EXP_GATE, "expert_gate", ROUTED_EXPERTS)                                 \
    X(EXP_UP, "expert_up", ROUTED_EXPERTS)                                     \
    X(EXP_DOWN, "expert_down", ROUTED_EXPERTS)                                 \
    X(EXP_GATE_UP, "expert_gate_up", ROUTED_EXPERTS)                           \
    X(SHEXP_GATE, "shared_gate", SHARED_EXPERTS)                               \
    X(SHEXP_UP, "shared_up", SHARED_EXPERTS)                                   \
    X(SHEXP_DOWN, "shared_down", SHARED_EXPERTS)                               \
    X(SHEXP_ROUTE, "shared_route", SHARED_EXPERTS)                             \
    X(LIN_QKV, "lin_qkv", ATTENTION)                                           \
    X(LIN_Z, "lin_z", ATTENTION)                                               \
    X(LIN_B, "lin_b", ATTENTION)                                               \
    X(LIN_A, "lin_a", ATTENTION)                                               \
    X(LIN_CONV, "lin_conv", ATTENTION)                                         \
    X(LIN_A_LOG, "lin_a_log", ATTENTION)                                       \
    X(LIN_DT_BIAS, "lin_dt_bias", ATTENTION)                                   \
    X(LIN_NORM, "lin_norm", NORMS)                                             \
    X(LIN_OUT, "lin_out", ATTENTION)                                           \
    X(LIGHT_GATE, "light_gate", ATTENTION)                                     \
    X(LIGHT_NORM, "light_norm", NORMS)                                         \
    X(MLA_Q, "mla_q", ATTENTION)                                               \
    X(MLA_Q_A, "mla_q_a", ATTENTION)                                           \
    X(MLA_Q_A_NORM, "mla_q_a_norm", NORMS)                                     \
    X(MLA_Q_B, "mla_q_b", ATTENTION)                                           \
    X(MLA_KV_A, "mla_kv_a", ATTENTION)                                         \
    X(MLA_KV_A_NORM, "mla_kv_a_norm", NORMS)                                   \
    X(MLA_KV_B, "mla_kv_b", ATTENTION)                                         \
    X(VISION, "vision", UNUSED)                                                \
    X(MTP, "mtp", UNUSED)                                                      \
    X(IGNORED, "ignored", UNUSED)

enum sp_role {
#define SP_X(e, name, cls) SP_ROLE_##e,
    SP_ROLE_LIST(SP_X)
#undef SP_X
        SP_ROLE_COUNT
};

#define SP_ROLE_CLASS_LIST(X)                                                  \
    X(EMBEDDING, "embedding")                                                  \
    X(ATTENTION, "attention")                                                  \
    X(NORMS, "norms")                                                          \
    X(DENSE_MLP, "dense_mlp")                                                  \
    X(ROUTER, "router")                                                        \
    X(SHARED_EXPERTS, "shared_experts")                                        \
    X(ROUTED_EXPERTS, "routed_experts")                                        \
    X(LM_HEAD, "lm_head")                                                      \
    X(UNUSED, "unused")

enum sp_role_class {
#define SP_X(e, name) SP_CLASS_##e,
    SP_ROLE_CLASS_LIST(SP_X)
#undef SP_X
        SP_CLASS_COUNT
};

enum sp_param { SP_PARAM_WEIGHT, SP_PARAM_SCALES, SP_PARAM_BIASES, SP_PARAM_BIAS, SP_PARAM_COUNT };

/* The tensors of one (layer, role, expert). */
struct sp_wslot {
    enum sp_role role;
    int32_t layer;   // -1 for model-level roles
    int32_t expert;  // -1 unless stored one tensor per expert
    bool stacked;    // tensors hold every expert: [E, ...]
    bool transposed;  // weight stored (in, out) instead of (out, in)
    bool interleaved;  // gate_up rows alternate gate, up (gpt-oss)
    bool row_blocks;   // its matrix was put in interleaved blocks of rows (sp_model_copy_in)
    const struct sp_st_tensor *t[SP_PARAM_COUNT];  // borrowed; NULL when absent
    char *module;  // module path for quantization lookups; owned
};

struct sp_weights {
    struct sp_wslot *slots;  // (n_slots)
    int64_t n_slots, cap;
    struct sp_strmap index;  // (layer, role, expert) -> slot
    char **unknown;  // names that match no role; owned
    int64_t n_unknown;
};

const char *sp_role_name(enum sp_role r);
enum sp_role_class sp_role_class(enum sp_role r);
const char *sp_role_class_name(enum sp_role_class c);

/* Resolves every tensor of the files. Layers >= n_layers are MTP layers. */
enum sp_status sp_weights_build(const struct sp_model_files *mf, int64_t n_layers, struct sp_weights *out);
void sp_weights_free(struct sp_weights *w);
/* The slot for (layer, role, expert); expert -1 finds the stacked or
 * non-expert slot. NULL when absent. */
const struct sp_wslot *sp_weights_find(const struct sp_weights *w, int64_t layer, enum sp_role role, int64_t expert);

#endif
