/* model.c - opening a model and typed, validated views of its weights. */
#include "model/model.h"

#include <string.h>

#include "core/alloc.h"
#include "core/log.h"

void sp_model_expected_shape(const struct sp_arch *a, enum sp_role role, int64_t *rows, int64_t *cols) {
    int64_t d = a->d_model, hd = a->head_dim, q = a->n_heads * hd, kv = a->n_kv_heads * hd;
    int64_t sh = a->d_shared, conv = sp_arch_conv_dim(a), vd = a->lin_v_heads * a->lin_v_dim;
    *rows = *cols = 0;
    switch (role) {
    case SP_ROLE_EMBED:
    case SP_ROLE_LM_HEAD: *rows = a->vocab, *cols = d; break;
    case SP_ROLE_OUT_NORM:
    case SP_ROLE_ATTN_NORM:
    case SP_ROLE_FFN_NORM: *rows = d; break;
    case SP_ROLE_ATTN_Q: *rows = a->attn_gate ? 2 * q : q, *cols = d; break;
    case SP_ROLE_ATTN_K:
    case SP_ROLE_ATTN_V: *rows = kv, *cols = d; break;
    case SP_ROLE_ATTN_QKV: *rows = q + 2 * kv, *cols = d; break;
    case SP_ROLE_ATTN_O: *rows = d, *cols = q; break;
    case SP_ROLE_ATTN_Q_NORM:
    case SP_ROLE_ATTN_K_NORM: *rows = hd; break;
    case SP_ROLE_ATTN_SINKS: *rows = a->n_heads; break;
    case SP_ROLE_FFN_GATE:
    case SP_ROLE_FFN_UP: *rows = a->d_ff, *cols = d; break;
    case SP_ROLE_FFN_DOWN: *rows = d, *cols = a->d_ff; break;
    case SP_ROLE_ROUTER: *rows = a->n_experts, *cols = d; break;
    case SP_ROLE_EXPERT_BIAS: *rows = a->n_experts; break;
    case SP_ROLE_EXP_GATE:
    case SP_ROLE_EXP_UP: *rows = a->d_expert, *cols = d; break;
    case SP_ROLE_EXP_DOWN: *rows = d, *cols = a->d_expert; break;
    case SP_ROLE_EXP_GATE_UP: *rows = 2 * a->d_expert, *cols = d; break;
    case SP_ROLE_SHEXP_GATE:
    case SP_ROLE_SHEXP_UP: *rows = sh, *cols = d; break;
    case SP_ROLE_SHEXP_DOWN: *rows = d, *cols = sh; break;
    case SP_ROLE_SHEXP_ROUTE: *rows = 1, *cols = d; break;
    case SP_ROLE_LIN_QKV: *rows = conv, *cols = d; break;
    case SP_ROLE_LIN_Z: *rows = vd, *cols = d; break;
    case SP_ROLE_LIN_B:
    case SP_ROLE_LIN_A: *rows = a->lin_v_heads, *cols = d; break;
    case SP_ROLE_LIN_OUT: *rows = d, *cols = vd; break;
    case SP_ROLE_LIN_CONV: *rows = conv * a->lin_conv; break;  // [channels, 1, taps] as one vector
    case SP_ROLE_LIN_A_LOG:
    case SP_ROLE_LIN_DT_BIAS: *rows = a->lin_v_heads; break;
    case SP_ROLE_LIN_NORM: *rows = a->lin_v_dim; break;
    case SP_ROLE_LIGHT_GATE: *rows = q, *cols = d; break;
    case SP_ROLE_LIGHT_NORM: *rows = q; break;
    case SP_ROLE_MLA_Q: *rows = a->n_heads * (a->mla_nope + a->mla_rope), *cols = d; break;
    case SP_ROLE_MLA_Q_A: *rows = a->mla_q_lora, *cols = d; break;
    case SP_ROLE_MLA_Q_A_NORM: *rows = a->mla_q_lora; break;
    case SP_ROLE_MLA_Q_B: *rows = a->n_heads * (a->mla_nope + a->mla_rope), *cols = a->mla_q_lora; break;
    case SP_ROLE_MLA_KV_A: *rows = a->mla_kv_lora + a->mla_rope, *cols = d; break;
    case SP_ROLE_MLA_KV_A_NORM: *rows = a->mla_kv_lora; break;
    case SP_ROLE_MLA_KV_B: *rows = a->n_heads * (a->mla_nope + a->mla_v), *cols = a->mla_kv_lora; break;
    default: break;
    }
}

static const char *shard_of(const struct sp_model *m, const struct sp_st_tensor *t) {
    for (int i = 0; i < m->files->n_shards; i++) {
        const struct sp_st_file *f = m->files->shards[i];
        if (t >= f->tensors && t < f->tensors + f->n_tensors) {
            const char *slash = strrchr(f->path, '/');
            return slash ? slash + 1 : f->path;
        }
    }
    return "?";
}

static enum sp_status tensor_error(const struct sp_model *m, const struct sp_st_tensor *t, const char *fmt,
                                   const char *detail) {
    return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: %s%s", shard_of(m, t), t->name, fmt, detail ? detail : "");
}

static void shape_str(const struct sp_st_tensor *t, char *buf, size_t cap) {
    size_t n = 0;
    buf[0] = 0;
    for (int i = 0; i < t->ndim && n + 24 < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%lld", i ? "x" : "", (long long)t->shape[i]);
    if (!t->ndim) snprintf(buf, cap, "scalar");
}

/* Checks that t has `lead` leading dims (the expert dim when stacked) equal
 * to n_experts, then (rows, last) with last as given; returns the last dim. */
static enum sp_status check_dims(const struct sp_model *m, const struct sp_st_tensor *t, bool stacked, int64_t rows,
                                 int64_t last, const char *what) {
    int want = stacked ? 3 : 2;
    bool ok = t->ndim == want && (!stacked || t->shape[0] == m->arch.n_experts) && t->shape[want - 2] == rows &&
              t->shape[want - 1] == last;
    if (ok) return SP_OK;
    char got[128], msg[512];
    shape_str(t, got, sizeof got);
    if (stacked)
        snprintf(msg, sizeof msg, "%s should be %lldx%lldx%lld but the header says %s", what,
                 (long long)m->arch.n_experts, (long long)rows, (long long)last, got);
    else
        snprintf(msg, sizeof msg, "%s should be %lldx%lld but the header says %s", what, (long long)rows,
                 (long long)last, got);
    return tensor_error(m, t, msg, NULL);
}

/* A quantized weight's codes: row order, U32 or U8, of the shape its format gives. */
static enum sp_status check_codes(const struct sp_model *m, const struct sp_wslot *s, const struct sp_qparams *p,
                                  int64_t rows, int64_t cols, const char *what) {
    const struct sp_st_tensor *w = s->t[SP_PARAM_WEIGHT];
    if (s->transposed) return tensor_error(m, w, "quantized weights in the transposed layout are not supported", NULL);
    if (w->dtype != SP_DTYPE_U32 && w->dtype != SP_DTYPE_U8)
        return tensor_error(m, w, "quantized codes must be U32 or U8, not ", sp_dtype_name(w->dtype));
    enum sp_status st = sp_qtype_check_shape(p->type, p->group, cols);
    if (st != SP_OK) return tensor_error(m, w, sp_error_msg(), NULL);
    int64_t packed = (int64_t)sp_qtype_row_bytes(p->type, cols) / (int64_t)sp_dtype_size(w->dtype);
    return check_dims(m, w, s->stacked, rows, packed, what);
}

bool sp_model_slot_blocks(const struct sp_model *m, const struct sp_wslot *s, struct sp_qparams *p) {
    const struct sp_st_tensor *w = s->t[SP_PARAM_WEIGHT];
    return w && !s->t[SP_PARAM_SCALES] && w->dtype == SP_DTYPE_U8 && sp_qconfig_lookup(&m->qcfg, s->module, p) &&
           p->quantized && sp_qtype_traits(p->type)->block_bytes;
}

enum sp_status sp_model_linear(const struct sp_model *m, int64_t layer, enum sp_role role, int64_t expert,
                               struct sp_linear *out) {
    memset(out, 0, sizeof *out);
    const struct sp_wslot *s = expert >= 0 ? sp_weights_find(&m->weights, layer, role, expert) : NULL;
    if (!s) s = sp_weights_find(&m->weights, layer, role, -1);
    if (!s || !s->t[SP_PARAM_WEIGHT]) {
        if (expert >= 0)
            return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: no %s weight for expert %lld", (long long)layer,
                             sp_role_name(role), (long long)expert);
        if (layer >= 0)
            return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: no %s weight", (long long)layer, sp_role_name(role));
        return sp_errorf(SP_ERR_NOT_FOUND, "no %s weight", sp_role_name(role));
    }
    bool stacked = s->stacked;
    if (stacked && (expert < 0 || expert >= m->arch.n_experts))
        return sp_errorf(SP_ERR_ARG, "layer %lld: %s is stacked; expert %lld is out of range", (long long)layer,
                         sp_role_name(role), (long long)expert);
    int64_t slice = stacked ? expert : 0;
    const struct sp_st_tensor *w = s->t[SP_PARAM_WEIGHT], *sc = s->t[SP_PARAM_SCALES], *qb = s->t[SP_PARAM_BIASES];
    int64_t rows, cols;
    sp_model_expected_shape(&m->arch, role, &rows, &cols);
    char what[96];
    if (layer >= 0)
        snprintf(what, sizeof what, "%s of layer %lld", sp_role_name(role), (long long)layer);
    else
        snprintf(what, sizeof what, "%s", sp_role_name(role));
    struct sp_qmat *q = &out->w;
    q->rows = rows;
    q->cols = cols;
    out->slot = s;
    out->transposed = s->transposed;
    out->interleaved = s->interleaved;
    q->interleaved = s->row_blocks;
    enum sp_status st;
    struct sp_qparams p;
    if (sp_model_slot_blocks(m, s, &p)) {  // its scales are in its blocks
        if ((st = check_codes(m, s, &p, rows, cols, what)) != SP_OK) return st;
        if (qb) return tensor_error(m, qb, "a .biases tensor, but the format has none: ", sp_qtype_name(p.type));
        q->type = p.type;
        q->group = p.group;
        q->scale_dtype = SP_DTYPE_COUNT;
        q->codes = (const uint8_t *)w->data + (size_t)slice * (size_t)rows * sp_qtype_row_bytes(p.type, cols);
    } else if (sc) {
        if (!sp_qconfig_lookup(&m->qcfg, s->module, &p))
            return tensor_error(m, sc, "quantization scales, but config.json has no \"quantization\" section", NULL);
        if (!p.quantized)
            return tensor_error(m, sc, "quantization scales, but config.json says this module is not quantized", NULL);
        const struct sp_qtype_traits *tr = sp_qtype_traits(p.type);
        if (tr->block_bytes)
            return tensor_error(m, sc, "a .scales tensor, but the format keeps its scales in its blocks: ", tr->name);
        if ((st = check_codes(m, s, &p, rows, cols, what)) != SP_OK) return st;
        int64_t groups = cols / p.group;
        st = check_dims(m, sc, stacked, rows, groups, "its scales");
        if (st != SP_OK) return st;
        enum sp_dtype sdt = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : sc->dtype;
        if (sc->dtype != sdt || (tr->scale_dtype == SP_DTYPE_COUNT && !sp_dtype_is_float(sdt)))
            return tensor_error(m, sc, "unexpected dtype for the scales of a ",
                                tr->name);
        if (tr->has_biases) {
            if (!qb) return tensor_error(m, w, "affine-quantized weight without a .biases tensor", NULL);
            st = check_dims(m, qb, stacked, rows, groups, "its biases");
            if (st != SP_OK) return st;
            if (qb->dtype != sc->dtype) return tensor_error(m, qb, "biases and scales differ in dtype", NULL);
        } else if (qb) {
            return tensor_error(m, qb, "a .biases tensor, but the format has none: ", tr->name);
        }
        size_t row_bytes = sp_qtype_row_bytes(p.type, cols), srow = (size_t)groups * sp_dtype_size(sdt);
        q->type = p.type;
        q->group = p.group;
        q->scale_dtype = sdt;
        q->codes = (const uint8_t *)w->data + (size_t)slice * (size_t)rows * row_bytes;
        q->scales = (const uint8_t *)sc->data + (size_t)slice * (size_t)rows * srow;
        q->biases = qb ? (const uint8_t *)qb->data + (size_t)slice * (size_t)rows * srow : NULL;
    } else {
        if (!sp_dtype_is_float(w->dtype))
            return tensor_error(m, w, "unquantized weights must be F32, F16 or BF16, not ", sp_dtype_name(w->dtype));
        if (qb) return tensor_error(m, qb, "quantization biases without scales", NULL);
        st = s->transposed ? check_dims(m, w, stacked, cols, rows, what) : check_dims(m, w, stacked, rows, cols, what);
        if (st != SP_OK) return st;
        q->type = w->dtype == SP_DTYPE_F32 ? SP_QTYPE_F32 : w->dtype == SP_DTYPE_F16 ? SP_QTYPE_F16 : SP_QTYPE_BF16;
        q->group = 1;
        q->scale_dtype = SP_DTYPE_COUNT;
        q->codes = (const uint8_t *)w->data + (size_t)slice * (size_t)rows * (size_t)cols * sp_dtype_size(w->dtype);
    }
    const struct sp_st_tensor *b = s->t[SP_PARAM_BIAS];
    if (b) {
        bool ok = sp_dtype_is_float(b->dtype) && b->ndim == (stacked ? 2 : 1) &&
                  (!stacked || b->shape[0] == m->arch.n_experts) && b->shape[b->ndim - 1] == rows;
        if (!ok) {
            char got[128], msg[512];
            shape_str(b, got, sizeof got);
            snprintf(msg, sizeof msg, "bias of %s should hold %lld floats per %s, header says %s %s", what,
                     (long long)rows, stacked ? "expert" : "layer", sp_dtype_name(b->dtype), got);
            return tensor_error(m, b, msg, NULL);
        }
        out->bias = (const uint8_t *)b->data + (size_t)slice * (size_t)rows * sp_dtype_size(b->dtype);
        out->bias_dtype = b->dtype;
    }
    return SP_OK;
}

enum sp_status sp_model_vector(const struct sp_model *m, int64_t layer, enum sp_role role, struct sp_vector *out) {
    memset(out, 0, sizeof *out);
    const struct sp_wslot *s = sp_weights_find(&m->weights, layer, role, -1);
    if (!s || !s->t[SP_PARAM_WEIGHT]) {
        if (layer >= 0)
            return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: no %s tensor", (long long)layer, sp_role_name(role));
        return sp_errorf(SP_ERR_NOT_FOUND, "no %s tensor", sp_role_name(role));
    }
    const struct sp_st_tensor *t = s->t[SP_PARAM_WEIGHT];
    int64_t n, unused;
    sp_model_expected_shape(&m->arch, role, &n, &unused);
    bool shape_ok = t->ndim == 1 && t->shape[0] == n;
    if (role == SP_ROLE_LIN_CONV) {
        /* the conv's taps per channel: [C, 1, K] (Hugging Face), [C, K, 1] (MLX) or [C, K] */
        int64_t C = sp_arch_conv_dim(&m->arch), K = m->arch.lin_conv;
        shape_ok = (t->ndim == 3 && t->shape[0] == C &&
                    ((t->shape[1] == 1 && t->shape[2] == K) || (t->shape[1] == K && t->shape[2] == 1))) ||
                   (t->ndim == 2 && t->shape[0] == C && t->shape[1] == K);
    }
    if (!sp_dtype_is_float(t->dtype) || !shape_ok) {
        char got[128], msg[512];
        shape_str(t, got, sizeof got);
        snprintf(msg, sizeof msg, "%s should be %lld floats, header says %s %s", sp_role_name(role), (long long)n,
                 sp_dtype_name(t->dtype), got);
        return tensor_error(m, t, msg, NULL);
    }
    out->data = t->data;
    out->dtype = t->dtype;
    out->n = n;
    return SP_OK;
}

/* Every tensor the descriptor needs, checked once at open. */
static enum sp_status validate(struct sp_model *m) {
    const struct sp_arch *a = &m->arch;
    struct sp_linear l;
    struct sp_vector v;
    enum sp_status st;
#define CHECK(expr)                                                                                                 \
    if ((st = (expr)) != SP_OK) return st;
    CHECK(sp_model_linear(m, -1, SP_ROLE_EMBED, -1, &l));
    CHECK(sp_model_vector(m, -1, SP_ROLE_OUT_NORM, &v));
    m->has_lm_head = sp_weights_find(&m->weights, -1, SP_ROLE_LM_HEAD, -1) != NULL;
    if (m->has_lm_head) {
        CHECK(sp_model_linear(m, -1, SP_ROLE_LM_HEAD, -1, &l));
    } else if (!a->tie_embeddings) {
        return sp_errorf(SP_ERR_NOT_FOUND, "no lm_head weight, and config.json does not tie the embeddings");
    }
    /* mlx-lm stores Qwen3.5's norms as 1 + w when it moves conv1d to [C, K, 1] */
    m->norm_plus_one = a->norm_offset;
    for (int64_t L = 0; L < a->n_layers && a->norm_offset; L++) {
        const struct sp_wslot *s = sp_weights_find(&m->weights, L, SP_ROLE_LIN_CONV, -1);
        const struct sp_st_tensor *t = s ? s->t[SP_PARAM_WEIGHT] : NULL;
        if (t && t->ndim == 3 && t->shape[2] == 1 && t->shape[1] > 1) m->norm_plus_one = false;
    }
    for (int64_t L = 0; L < a->n_layers; L++) {
        CHECK(sp_model_vector(m, L, SP_ROLE_ATTN_NORM, &v));
        CHECK(sp_model_vector(m, L, SP_ROLE_FFN_NORM, &v));
        if (a->layer_kind[L] == SP_LAYER_GATED_DELTA) {
            static const enum sp_role lins[] = {SP_ROLE_LIN_QKV, SP_ROLE_LIN_Z, SP_ROLE_LIN_B, SP_ROLE_LIN_A,
                                                SP_ROLE_LIN_OUT};
            static const enum sp_role vecs[] = {SP_ROLE_LIN_CONV, SP_ROLE_LIN_A_LOG, SP_ROLE_LIN_DT_BIAS,
                                                SP_ROLE_LIN_NORM};
            for (size_t i = 0; i < sizeof lins / sizeof *lins; i++) CHECK(sp_model_linear(m, L, lins[i], -1, &l));
            for (size_t i = 0; i < sizeof vecs / sizeof *vecs; i++) CHECK(sp_model_vector(m, L, vecs[i], &v));
        } else if (a->layer_kind[L] == SP_LAYER_MLA) {
            if (a->mla_q_lora) {
                CHECK(sp_model_linear(m, L, SP_ROLE_MLA_Q_A, -1, &l));
                CHECK(sp_model_vector(m, L, SP_ROLE_MLA_Q_A_NORM, &v));
                CHECK(sp_model_linear(m, L, SP_ROLE_MLA_Q_B, -1, &l));
            } else {
                CHECK(sp_model_linear(m, L, SP_ROLE_MLA_Q, -1, &l));
            }
            CHECK(sp_model_linear(m, L, SP_ROLE_MLA_KV_A, -1, &l));
            CHECK(sp_model_vector(m, L, SP_ROLE_MLA_KV_A_NORM, &v));
            CHECK(sp_model_linear(m, L, SP_ROLE_MLA_KV_B, -1, &l));
            CHECK(sp_model_linear(m, L, SP_ROLE_ATTN_O, -1, &l));
        } else if (a->fused_qkv) {
            CHECK(sp_model_linear(m, L, SP_ROLE_ATTN_QKV, -1, &l));
            if (a->qkv_bias && !l.bias) return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: use_qkv_bias is set but query_key_value has no bias", (long long)L);
        } else {
            enum sp_role r3[3] = {SP_ROLE_ATTN_Q, SP_ROLE_ATTN_K, SP_ROLE_ATTN_V};
            for (int i = 0; i < 3; i++) {
                CHECK(sp_model_linear(m, L, r3[i], -1, &l));
                if (a->qkv_bias && !l.bias)
                    return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: attention bias is set but %s has no bias", (long long)L, sp_role_name(r3[i]));
            }
        }
        bool softmax = a->layer_kind[L] == SP_LAYER_ATTENTION, lightning = a->layer_kind[L] == SP_LAYER_LIGHTNING;
        if (lightning) {
            CHECK(sp_model_linear(m, L, SP_ROLE_LIGHT_GATE, -1, &l));
            CHECK(sp_model_vector(m, L, SP_ROLE_LIGHT_NORM, &v));
        }
        if (softmax || lightning) CHECK(sp_model_linear(m, L, SP_ROLE_ATTN_O, -1, &l));
        if ((softmax || lightning) && a->o_bias && !l.bias)
            return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: the output projection has no bias", (long long)L);
        if (a->qk_norm && (softmax || lightning)) {
            CHECK(sp_model_vector(m, L, SP_ROLE_ATTN_Q_NORM, &v));
            CHECK(sp_model_vector(m, L, SP_ROLE_ATTN_K_NORM, &v));
        }
        if (a->attn_sinks) CHECK(sp_model_vector(m, L, SP_ROLE_ATTN_SINKS, &v));
        if (!a->layer_moe[L]) {
            CHECK(sp_model_linear(m, L, SP_ROLE_FFN_GATE, -1, &l));
            CHECK(sp_model_linear(m, L, SP_ROLE_FFN_UP, -1, &l));
            CHECK(sp_model_linear(m, L, SP_ROLE_FFN_DOWN, -1, &l));
            continue;
        }
        CHECK(sp_model_linear(m, L, SP_ROLE_ROUTER, -1, &l));
        if (a->router_bias && !l.bias) return sp_errorf(SP_ERR_NOT_FOUND, "layer %lld: the router has no bias", (long long)L);
        if (sp_weights_find(&m->weights, L, SP_ROLE_EXPERT_BIAS, -1)) {
            CHECK(sp_model_vector(m, L, SP_ROLE_EXPERT_BIAS, &v));
            m->has_expert_bias = true;
        }
        bool fused = sp_weights_find(&m->weights, L, SP_ROLE_EXP_GATE_UP, -1) != NULL;
        m->fused_gate_up = fused;
        for (int64_t e = 0; e < a->n_experts; e++) {
            if (fused) {
                CHECK(sp_model_linear(m, L, SP_ROLE_EXP_GATE_UP, e, &l));
            } else {
                CHECK(sp_model_linear(m, L, SP_ROLE_EXP_GATE, e, &l));
                CHECK(sp_model_linear(m, L, SP_ROLE_EXP_UP, e, &l));
            }
            CHECK(sp_model_linear(m, L, SP_ROLE_EXP_DOWN, e, &l));
        }
        if (a->n_shared_experts > 0) {
            CHECK(sp_model_linear(m, L, SP_ROLE_SHEXP_GATE, -1, &l));
            CHECK(sp_model_linear(m, L, SP_ROLE_SHEXP_UP, -1, &l));
            CHECK(sp_model_linear(m, L, SP_ROLE_SHEXP_DOWN, -1, &l));
            if (a->shared_gate) CHECK(sp_model_linear(m, L, SP_ROLE_SHEXP_ROUTE, -1, &l));
        }
    }
#undef CHECK
    return SP_OK;
}

enum sp_status sp_model_open(const char *dir, struct sp_model **out) {
    *out = NULL;
    struct sp_model *m = sp_calloc(1, sizeof *m, SP_MEM_MODEL);
    if (!m) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    enum sp_status st = sp_model_files_open(dir, &m->files);
    if (st == SP_OK) st = sp_arch_from_config(m->files->config, &m->arch);
    if (st == SP_OK) st = sp_qconfig_parse(m->files->config, &m->qcfg);
    if (st == SP_OK) st = sp_weights_build(m->files, m->arch.n_layers, &m->weights);
    if (st == SP_OK) st = validate(m);
    if (st == SP_OK) {
        int64_t vision = 0, mtp = 0;
        for (int64_t i = 0; i < m->weights.n_slots; i++) {
            vision += m->weights.slots[i].role == SP_ROLE_VISION;
            mtp += m->weights.slots[i].role == SP_ROLE_MTP;
        }
        if (vision || mtp)
            sp_log(SP_LOG_INFO, "%s: %lld vision-tower and %lld multi-token-prediction tensors are not used (text "
                   "generation only)", dir, (long long)vision, (long long)mtp);
    }
    if (st != SP_OK) {
        if (m->files) sp_error_prefix("%s: ", m->files->dir);
        sp_model_close(m);
        return st;
    }
    *out = m;
    return SP_OK;
}

enum sp_status sp_model_populate(const struct sp_model *m, struct sp_progress *pr) {
    for (int i = 0; i < m->files->n_shards; i++) {
        const struct sp_st_file *f = m->files->shards[i];
        enum sp_status st = sp_map_populate(&f->map, f->map.anon ? NULL : pr);
        if (st != SP_OK) {
            sp_error_prefix("%s: ", f->path);
            return st;
        }
    }
    return SP_OK;
}

/* Slot s's whole matrix (every expert of a stacked one) as a view, where
 * it is a valid quantized one. */
static bool slot_matrix(const struct sp_model *m, const struct sp_wslot *s, struct sp_qmat *out) {
    if (!s->t[SP_PARAM_WEIGHT] || !s->t[SP_PARAM_SCALES]) return false;
    struct sp_linear lin;
    if (sp_model_linear(m, s->layer, s->role, s->stacked ? 0 : s->expert, &lin) != SP_OK || lin.slot != s ||
        lin.transposed)
        return false;
    *out = lin.w;
    if (s->stacked) out->rows *= m->arch.n_experts;
    return true;
}

/* Whether n bytes at p lie in the size bytes at base */
static bool in_bytes(const void *base, size_t size, const void *p, size_t n) {
    const unsigned char *b = p, *lo = base;
    return b && lo && b >= lo && b + n <= lo + size;
}

/* The matrices sp_model_copy_in interleaves in a file's copy */
struct interleave {
    struct sp_model *m;
    sp_interleave_fn want;
    size_t bytes, tmp_cap;
    int64_t matrices;
    void *tmp;
};

/* Slot s's matrix, where `want` takes it and all its arrays lie in the
 * size bytes at base (a file's map, or what it made when opened; else
 * false): *in_copy views it at the same offsets in copy. */
static bool to_interleave(const struct interleave *il, const struct sp_wslot *s, const void *base, size_t size,
                          const unsigned char *copy, struct sp_qmat *in_copy) {
    struct sp_qmat w;
    const struct sp_arch *a = &il->m->arch;
    if (s->role == SP_ROLE_ATTN_Q && a->attn_gate) return false;  // the forward pass reorders its rows
    /* or reads MLA's q, kv_a and kv_b row by row */
    if (s->role == SP_ROLE_MLA_Q || s->role == SP_ROLE_MLA_Q_B || s->role == SP_ROLE_MLA_KV_A ||
        s->role == SP_ROLE_MLA_KV_B)
        return false;
    if (!slot_matrix(il->m, s, &w) || !sp_qmat_interleavable(&w) || !il->want(&w)) return false;
    size_t codes = (size_t)w.rows * sp_qtype_row_bytes(w.type, w.cols);
    size_t groups = (size_t)w.rows * (size_t)(w.cols / w.group) * sp_dtype_size(w.scale_dtype);
    if (!in_bytes(base, size, w.codes, codes) || !in_bytes(base, size, w.scales, groups) ||
        (w.biases && !in_bytes(base, size, w.biases, groups)))
        return false;
    const unsigned char *b = base;
    *in_copy = w;
    in_copy->codes = copy + ((const unsigned char *)w.codes - b);
    in_copy->scales = copy + ((const unsigned char *)w.scales - b);
    if (w.biases) in_copy->biases = copy + ((const unsigned char *)w.biases - b);
    return true;
}

/* sp_map_edit_fn: interleaves the matrices of the file in its copy */
static void interleave_copy(void *ctx, const struct sp_map *f, unsigned char *copy) {
    struct interleave *il = ctx;
    for (int64_t i = 0; i < il->m->weights.n_slots; i++) {
        struct sp_wslot *s = &il->m->weights.slots[i];
        struct sp_qmat w, done;
        if (s->row_blocks || !to_interleave(il, s, f->data, f->size, copy, &w)) continue;
        size_t need = sp_qmat_block_bytes(&w);
        if (need > il->tmp_cap) {
            void *t = sp_malloc(need, SP_MEM_MISC);
            if (!t) continue;  // this one stays in row order
            sp_free(il->tmp);
            il->tmp = t;
            il->tmp_cap = need;
        }
        sp_qmat_interleave_in_place(&w, il->tmp, &done);
        s->row_blocks = true;
        il->bytes += sp_qtype_matrix_bytes(w.type, w.group, w.scale_dtype, w.rows, w.cols);
        il->matrices++;
    }
}

/* Whether a file holds a matrix to interleave */
static bool file_to_interleave(const struct interleave *il, const struct sp_map *f) {
    for (int64_t i = 0; i < il->m->weights.n_slots; i++) {
        struct sp_qmat w;
        if (to_interleave(il, &il->m->weights.slots[i], f->data, f->size, f->data, &w)) return true;
    }
    return false;
}

enum sp_status sp_model_copy_in(struct sp_model *m, bool huge_pages, sp_interleave_fn want,
                                struct sp_model_copy *out, struct sp_progress *pr) {
    memset(out, 0, sizeof *out);
    struct interleave il = {.m = m, .want = want};
    enum sp_status st = SP_OK;
    for (int i = 0; i < m->files->n_shards && st == SP_OK; i++) {
        struct sp_st_file *f = m->files->shards[i];
        /* for anonymous 2 MiB pages: every file big enough for one, also
         * one the page cache holds in 2 MiB folios (README: Memory) */
        bool pages = huge_pages && f->map.size >= ((size_t)2 << 20);
        /* what a file made when opened (a GGUF's repacked blocks) stays in
         * row order: Q4_0 as affine4 group 32 with f16 scales decoded
         * 1.05-1.07x as fast in row order as interleaved (Zen 5 VM, avx512, 2 threads,
         * 8-layer Qwen3-30B-A3B, three pairs of runs) */
        bool edit = want && file_to_interleave(&il, &f->map);
        if (f->map.anon || !(pages || edit)) continue;
        st = sp_map_to_anon(&f->map, edit ? interleave_copy : NULL, &il, pr);
        if (st != SP_OK)
            sp_error_prefix("%s: ", f->path);
        else
            out->copied += f->map.anon_bytes;
    }
    sp_free(il.tmp);
    out->interleaved = il.bytes;
    out->matrices = il.matrices;
    return st;
}

size_t sp_model_huge_bytes(const struct sp_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->files->n_shards; i++) {
        const struct sp_st_file *f = m->files->shards[i];
        size_t owned = sp_huge_bytes_in(f->owned, f->owned_bytes);  // its map may end in a part page
        n += sp_map_huge_bytes(&f->map) + (owned < f->owned_bytes ? owned : f->owned_bytes);
    }
    return n;
}

size_t sp_model_copied_bytes(const struct sp_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->files->n_shards; i++) {
        const struct sp_st_file *f = m->files->shards[i];
        n += (f->map.anon ? f->map.anon_bytes : 0) + f->owned_bytes;
    }
    return n;
}

size_t sp_model_mapped_bytes(const struct sp_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->files->n_shards; i++) n += sp_map_live_bytes(&m->files->shards[i]->map);
    return n;
}

void sp_model_close(struct sp_model *m) {
    if (!m) return;
    sp_weights_free(&m->weights);
    sp_qconfig_free(&m->qcfg);
    sp_arch_free(&m->arch);
    sp_model_files_close(m->files);
    sp_free(m);
}
