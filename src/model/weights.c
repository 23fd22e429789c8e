/* weights.c - tensor names -> roles. */
#include "model/weights.h"

#include <ctype.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"

static const struct {
    const char *name;
    enum sp_role_class cls;
} roles[SP_ROLE_COUNT] = {
#define SP_X(e, name, cls) {name, SP_CLASS_##cls},
    SP_ROLE_LIST(SP_X)
#undef SP_X
};

static const char *const class_names[SP_CLASS_COUNT] = {
#define SP_X(e, name) name,
    SP_ROLE_CLASS_LIST(SP_X)
#undef SP_X
};

const char *sp_role_name(enum sp_role r) { return (unsigned)r < SP_ROLE_COUNT ? roles[r].name : "?"; }
enum sp_role_class sp_role_class(enum sp_role r) { return roles[r].cls; }
const char *sp_role_class_name(enum sp_role_class c) { return (unsigned)c < SP_CLASS_COUNT ? class_names[c] : "?"; }

/* How a name is spelled: a module followed by .weight/.bias/.scales/.biases,
 * or a bare parameter whose full name is given. */
enum form { MODULE, BARE };

struct name_rule {
    const char *module;  // after "model.layers.N." for layer rules; "*" marks the expert index
    enum form form;
    enum sp_param param;  // for BARE names
    enum sp_role role;
    bool stacked, transposed, interleaved;
};

static const struct name_rule model_rules[] = {
    {"model.embed_tokens", MODULE, 0, SP_ROLE_EMBED, 0, 0, 0},
    {"model.word_embeddings", MODULE, 0, SP_ROLE_EMBED, 0, 0, 0},
    {"model.norm", MODULE, 0, SP_ROLE_OUT_NORM, 0, 0, 0},
    {"lm_head", MODULE, 0, SP_ROLE_LM_HEAD, 0, 0, 0},
};

static const struct name_rule layer_rules[] = {
    {"input_layernorm", MODULE, 0, SP_ROLE_ATTN_NORM, 0, 0, 0},
    {"post_attention_layernorm", MODULE, 0, SP_ROLE_FFN_NORM, 0, 0, 0},
    /* llama / qwen3 / gpt-oss attention */
    {"self_attn.q_proj", MODULE, 0, SP_ROLE_ATTN_Q, 0, 0, 0},
    {"self_attn.k_proj", MODULE, 0, SP_ROLE_ATTN_K, 0, 0, 0},
    {"self_attn.v_proj", MODULE, 0, SP_ROLE_ATTN_V, 0, 0, 0},
    {"self_attn.o_proj", MODULE, 0, SP_ROLE_ATTN_O, 0, 0, 0},
    {"self_attn.q_norm", MODULE, 0, SP_ROLE_ATTN_Q_NORM, 0, 0, 0},
    {"self_attn.k_norm", MODULE, 0, SP_ROLE_ATTN_K_NORM, 0, 0, 0},
    {"self_attn.sinks", BARE, SP_PARAM_WEIGHT, SP_ROLE_ATTN_SINKS, 0, 0, 0},
    {"self_attn.rotary_emb.inv_freq", BARE, SP_PARAM_WEIGHT, SP_ROLE_IGNORED, 0, 0, 0},
    /* bailing_moe attention */
    {"attention.query_key_value", MODULE, 0, SP_ROLE_ATTN_QKV, 0, 0, 0},
    {"attention.dense", MODULE, 0, SP_ROLE_ATTN_O, 0, 0, 0},
    {"attention.query_layernorm", MODULE, 0, SP_ROLE_ATTN_Q_NORM, 0, 0, 0},
    {"attention.key_layernorm", MODULE, 0, SP_ROLE_ATTN_K_NORM, 0, 0, 0},
    /* Ling 2.6: Lightning's output gate and norm; MLA */
    {"attention.g_proj", MODULE, 0, SP_ROLE_LIGHT_GATE, 0, 0, 0},
    {"attention.g_norm", MODULE, 0, SP_ROLE_LIGHT_NORM, 0, 0, 0},
    {"attention.q_proj", MODULE, 0, SP_ROLE_MLA_Q, 0, 0, 0},
    {"attention.q_a_proj", MODULE, 0, SP_ROLE_MLA_Q_A, 0, 0, 0},
    {"attention.q_a_layernorm", MODULE, 0, SP_ROLE_MLA_Q_A_NORM, 0, 0, 0},
    {"attention.q_b_proj", MODULE, 0, SP_ROLE_MLA_Q_B, 0, 0, 0},
    {"attention.kv_a_proj_with_mqa", MODULE, 0, SP_ROLE_MLA_KV_A, 0, 0, 0},
    {"attention.kv_a_layernorm", MODULE, 0, SP_ROLE_MLA_KV_A_NORM, 0, 0, 0},
    {"attention.kv_b_proj", MODULE, 0, SP_ROLE_MLA_KV_B, 0, 0, 0},
    /* dense MLP */
    {"mlp.gate_proj", MODULE, 0, SP_ROLE_FFN_GATE, 0, 0, 0},
    {"mlp.up_proj", MODULE, 0, SP_ROLE_FFN_UP, 0, 0, 0},
    {"mlp.down_proj", MODULE, 0, SP_ROLE_FFN_DOWN, 0, 0, 0},
    /* routers: HF bailing / qwen3_moe, mlx bailing, gpt-oss */
    {"mlp.gate", MODULE, 0, SP_ROLE_ROUTER, 0, 0, 0},
    {"mlp.gate.gate_proj", MODULE, 0, SP_ROLE_ROUTER, 0, 0, 0},
    {"mlp.router", MODULE, 0, SP_ROLE_ROUTER, 0, 0, 0},
    {"mlp.gate.expert_bias", BARE, SP_PARAM_WEIGHT, SP_ROLE_EXPERT_BIAS, 0, 0, 0},
    /* experts, one tensor per expert (HF) */
    {"mlp.experts.*.gate_proj", MODULE, 0, SP_ROLE_EXP_GATE, 0, 0, 0},
    {"mlp.experts.*.up_proj", MODULE, 0, SP_ROLE_EXP_UP, 0, 0, 0},
    {"mlp.experts.*.down_proj", MODULE, 0, SP_ROLE_EXP_DOWN, 0, 0, 0},
    /* experts stacked [E, out, in] (mlx-lm SwitchGLU) */
    {"mlp.switch_mlp.gate_proj", MODULE, 0, SP_ROLE_EXP_GATE, 1, 0, 0},
    {"mlp.switch_mlp.up_proj", MODULE, 0, SP_ROLE_EXP_UP, 1, 0, 0},
    {"mlp.switch_mlp.down_proj", MODULE, 0, SP_ROLE_EXP_DOWN, 1, 0, 0},
    {"mlp.experts.gate_proj", MODULE, 0, SP_ROLE_EXP_GATE, 1, 0, 0},
    {"mlp.experts.up_proj", MODULE, 0, SP_ROLE_EXP_UP, 1, 0, 0},
    {"mlp.experts.down_proj", MODULE, 0, SP_ROLE_EXP_DOWN, 1, 0, 0},
    /* gpt-oss, Hugging Face layout: [E, in, out], gate and up interleaved */
    {"mlp.experts.gate_up_proj", BARE, SP_PARAM_WEIGHT, SP_ROLE_EXP_GATE_UP, 1, 1, 1},
    {"mlp.experts.gate_up_proj_bias", BARE, SP_PARAM_BIAS, SP_ROLE_EXP_GATE_UP, 1, 1, 1},
    {"mlp.experts.down_proj", BARE, SP_PARAM_WEIGHT, SP_ROLE_EXP_DOWN, 1, 1, 0},
    {"mlp.experts.down_proj_bias", BARE, SP_PARAM_BIAS, SP_ROLE_EXP_DOWN, 1, 1, 0},
    /* Gated DeltaNet (Qwen3.5) */
    {"linear_attn.in_proj_qkv", MODULE, 0, SP_ROLE_LIN_QKV, 0, 0, 0},
    {"linear_attn.in_proj_z", MODULE, 0, SP_ROLE_LIN_Z, 0, 0, 0},
    {"linear_attn.in_proj_b", MODULE, 0, SP_ROLE_LIN_B, 0, 0, 0},
    {"linear_attn.in_proj_a", MODULE, 0, SP_ROLE_LIN_A, 0, 0, 0},
    {"linear_attn.conv1d", MODULE, 0, SP_ROLE_LIN_CONV, 0, 0, 0},
    {"linear_attn.A_log", BARE, SP_PARAM_WEIGHT, SP_ROLE_LIN_A_LOG, 0, 0, 0},
    {"linear_attn.dt_bias", BARE, SP_PARAM_WEIGHT, SP_ROLE_LIN_DT_BIAS, 0, 0, 0},
    {"linear_attn.norm", MODULE, 0, SP_ROLE_LIN_NORM, 0, 0, 0},
    {"linear_attn.out_proj", MODULE, 0, SP_ROLE_LIN_OUT, 0, 0, 0},
    /* shared experts: bailing's, Qwen3.5's (one, gated) */
    {"mlp.shared_expert.gate_proj", MODULE, 0, SP_ROLE_SHEXP_GATE, 0, 0, 0},
    {"mlp.shared_expert.up_proj", MODULE, 0, SP_ROLE_SHEXP_UP, 0, 0, 0},
    {"mlp.shared_expert.down_proj", MODULE, 0, SP_ROLE_SHEXP_DOWN, 0, 0, 0},
    {"mlp.shared_expert_gate", MODULE, 0, SP_ROLE_SHEXP_ROUTE, 0, 0, 0},
    {"mlp.shared_experts.gate_proj", MODULE, 0, SP_ROLE_SHEXP_GATE, 0, 0, 0},
    {"mlp.shared_experts.up_proj", MODULE, 0, SP_ROLE_SHEXP_UP, 0, 0, 0},
    {"mlp.shared_experts.down_proj", MODULE, 0, SP_ROLE_SHEXP_DOWN, 0, 0, 0},
};

struct slot_key {
    int32_t layer, role, expert;
};

static enum sp_status add_unknown(struct sp_weights *w, const char *name) {
    char **v = w->unknown ? sp_realloc(w->unknown, (size_t)(w->n_unknown + 1) * sizeof *v)
                          : sp_malloc(sizeof *v, SP_MEM_MODEL);
    if (!v) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    w->unknown = v;
    if (!(v[w->n_unknown] = sp_strdup(name, SP_MEM_MODEL))) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    w->n_unknown++;
    return SP_OK;
}

static enum sp_status get_slot(struct sp_weights *w, const struct slot_key *k, struct sp_wslot **out) {
    int64_t i;
    if (sp_strmap_get(&w->index, (const char *)k, sizeof *k, &i)) {
        *out = &w->slots[i];
        return SP_OK;
    }
    if (w->n_slots == w->cap) {
        int64_t cap = w->cap ? w->cap * 2 : 256;
        size_t bytes = (size_t)cap * sizeof *w->slots;
        struct sp_wslot *s = w->slots ? sp_realloc(w->slots, bytes) : sp_malloc(bytes, SP_MEM_MODEL);
        if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        w->slots = s;
        w->cap = cap;
    }
    struct sp_wslot *s = &w->slots[w->n_slots];
    memset(s, 0, sizeof *s);
    s->layer = k->layer;
    s->role = (enum sp_role)k->role;
    s->expert = k->expert;
    enum sp_status st = sp_strmap_put(&w->index, (const char *)k, sizeof *k, w->n_slots);
    if (st != SP_OK) return st;
    w->n_slots++;
    *out = s;
    return SP_OK;
}

/* Parses a leading decimal index ("17." -> 17); -1 if there is none. */
static int64_t parse_index(const char *s, const char **end) {
    if (!isdigit((unsigned char)*s)) return -1;
    int64_t v = 0;
    while (isdigit((unsigned char)*s)) {
        v = v * 10 + (*s - '0');
        if (v > 1000000000) return -1;
        s++;
    }
    if (*s != '.') return -1;
    *end = s + 1;
    return v;
}

static bool param_suffix(const char *name, size_t len, enum sp_param *p, size_t *module_len) {
    static const struct {
        const char *s;
        enum sp_param p;
    } sfx[] = {{".weight", SP_PARAM_WEIGHT}, {".scales", SP_PARAM_SCALES}, {".biases", SP_PARAM_BIASES}, {".bias", SP_PARAM_BIAS}};
    for (size_t i = 0; i < sizeof sfx / sizeof *sfx; i++) {
        size_t l = strlen(sfx[i].s);
        if (len > l && memcmp(name + len - l, sfx[i].s, l) == 0) {
            *p = sfx[i].p;
            *module_len = len - l;
            return true;
        }
    }
    return false;
}

/* Matches `rest` (the name after the layer prefix, or the whole name) against
 * the rules; an expert index in ".experts.N." is lifted out into *expert. */
static const struct name_rule *match(const struct name_rule *rules, size_t n_rules, const char *rest,
                                     enum sp_param *param, int64_t *expert, char *canon, size_t canon_cap) {
    size_t len = strlen(rest);
    if (len + 2 > canon_cap) return NULL;
    /* Canonical form: "mlp.experts.17.gate_proj.weight" -> "mlp.experts.*.gate_proj.weight". */
    *expert = -1;
    const char *e = strstr(rest, "experts.");
    size_t ci = 0;
    if (e && (e == rest || e[-1] == '.')) {
        const char *after;
        int64_t idx = parse_index(e + 8, &after);
        if (idx >= 0) {
            size_t head = (size_t)(e + 8 - rest);
            memcpy(canon, rest, head);
            canon[head] = '*';
            canon[head + 1] = '.';
            ci = head + 2;
            size_t tail = strlen(after);
            memcpy(canon + ci, after, tail + 1);
            *expert = idx;
        }
    }
    if (*expert < 0) memcpy(canon, rest, len + 1);
    size_t clen = strlen(canon), mlen;
    enum sp_param p;
    bool has_sfx = param_suffix(canon, clen, &p, &mlen);
    for (size_t i = 0; i < n_rules; i++) {
        const struct name_rule *r = &rules[i];
        if (r->form == BARE && strcmp(canon, r->module) == 0) {
            *param = r->param;
            return r;
        }
        if (r->form == MODULE && has_sfx && strlen(r->module) == mlen && memcmp(canon, r->module, mlen) == 0) {
            *param = p;
            return r;
        }
    }
    return NULL;
}

enum sp_status sp_weights_build(const struct sp_model_files *mf, int64_t n_layers, struct sp_weights *w) {
    memset(w, 0, sizeof *w);
    sp_strmap_init(&w->index, SP_MEM_MODEL);
    enum sp_status st = SP_OK;
    char canon[512];
    for (int s = 0; s < mf->n_shards && st == SP_OK; s++) {
        const struct sp_st_file *f = mf->shards[s];
        for (int64_t i = 0; i < f->n_tensors && st == SP_OK; i++) {
            const struct sp_st_tensor *t = &f->tensors[i];
            const char *name = t->name, *rest = name;
            int64_t layer = -1, expert = -1;
            enum sp_param param = SP_PARAM_WEIGHT;
            const struct name_rule *rule = NULL;
            /* a vision-language wrapper's text model reads as the model:
             * model.language_model.* (Hugging Face), language_model.model.*
             * and language_model.lm_head (mlx-lm) */
            static const char *const wrapped[][2] = {{"model.language_model.", "model."},
                                                     {"language_model.model.", "model."},
                                                     {"language_model.lm_head.", "lm_head."}};
            char unwrapped[512];
            for (size_t k = 0; k < sizeof wrapped / sizeof *wrapped; k++) {
                size_t pl = strlen(wrapped[k][0]);
                if (strncmp(name, wrapped[k][0], pl) == 0 && strlen(name) < sizeof unwrapped - 8) {
                    snprintf(unwrapped, sizeof unwrapped, "%s%s", wrapped[k][1], name + pl);
                    name = rest = unwrapped;
                    break;
                }
            }
            static const struct name_rule vision = {"", BARE, SP_PARAM_WEIGHT, SP_ROLE_VISION, 0, 0, 0},
                                          mtp = {"", BARE, SP_PARAM_WEIGHT, SP_ROLE_MTP, 0, 0, 0};
            if (strncmp(name, "model.visual.", 13) == 0 || strncmp(name, "visual.", 7) == 0 ||
                strncmp(name, "vision_tower.", 13) == 0) {
                rule = &vision;
            } else if (strncmp(name, "mtp.", 4) == 0) {
                rule = &mtp;
            } else if (strncmp(name, "model.layers.", 13) == 0) {
                layer = parse_index(name + 13, &rest);
                if (layer < 0) {
                    st = add_unknown(w, name);
                    continue;
                }
                if (layer >= n_layers) {
                    rule = &mtp;  // next-token-prediction layers: stored, never run
                } else {
                    rule = match(layer_rules, sizeof layer_rules / sizeof *layer_rules, rest, &param, &expert, canon,
                                 sizeof canon);
                }
            } else {
                rule = match(model_rules, sizeof model_rules / sizeof *model_rules, name, &param, &expert, canon,
                             sizeof canon);
            }
            if (!rule) {
                st = add_unknown(w, name);
                continue;
            }
            /* unused tensors each get a slot of their own (keyed by position) */
            struct slot_key k = {(int32_t)layer, rule->role, (int32_t)expert};
            if (sp_role_class(rule->role) == SP_CLASS_UNUSED) k.expert = (int32_t)(s * 1000000 + i);
            struct sp_wslot *slot = NULL;
            st = get_slot(w, &k, &slot);
            if (st != SP_OK) break;
            if (slot->t[param]) {
                st = sp_errorf(SP_ERR_FORMAT, "tensors %s and %s both give %s of layer %lld", slot->t[param]->name, name,
                               sp_role_name(rule->role), (long long)layer);
                break;
            }
            slot->t[param] = t;
            slot->stacked = rule->stacked;
            slot->transposed = rule->transposed;
            slot->interleaved = rule->interleaved;
            if (!slot->module) {
                size_t ml = strlen(t->name);  // the file's own spelling, as quantization configs name it
                enum sp_param dummy;
                if (rule->form == MODULE) param_suffix(t->name, strlen(t->name), &dummy, &ml);
                slot->module = sp_strndup(t->name, ml, SP_MEM_MODEL);
                if (!slot->module) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            }
        }
    }
    /* A layer cannot mix stacked and per-expert storage of one role. */
    for (int64_t i = 0; i < w->n_slots && st == SP_OK; i++) {
        const struct sp_wslot *s = &w->slots[i];
        if (s->expert >= 0 && sp_role_class(s->role) != SP_CLASS_UNUSED && sp_weights_find(w, s->layer, s->role, -1))
            st = sp_errorf(SP_ERR_FORMAT, "layer %d: %s is stored both stacked and per expert", s->layer,
                           sp_role_name(s->role));
    }
    if (st != SP_OK) sp_weights_free(w);
    return st;
}

void sp_weights_free(struct sp_weights *w) {
    if (!w) return;
    for (int64_t i = 0; i < w->n_slots; i++) sp_free(w->slots[i].module);
    sp_free(w->slots);
    sp_strmap_free(&w->index);
    for (int64_t i = 0; i < w->n_unknown; i++) sp_free(w->unknown[i]);
    sp_free(w->unknown);
    memset(w, 0, sizeof *w);
}

const struct sp_wslot *sp_weights_find(const struct sp_weights *w, int64_t layer, enum sp_role role, int64_t expert) {
    struct slot_key k = {(int32_t)layer, (int32_t)role, (int32_t)expert};
    int64_t i;
    if (!sp_strmap_get(&w->index, (const char *)&k, sizeof k, &i)) return NULL;
    return &w->slots[i];
}
