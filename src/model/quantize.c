/* quantize.c - MLX-layout quantized (or dequantized) copies of a model. */
#include "model/quantize.h"

#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/json.h"
#include "core/pool.h"
#include "format/gguf.h"
#include "format/gguf_model.h"
#include "format/gguf_vocab.h"
#include "format/st_writer.h"

/* One output tensor group: a linear layer (weight [+ scales, biases] [+ bias])
 * or a copied 1-D tensor. */
struct out_item {
    char module[200];  // output module path (without .weight)
    bool copy;         // copy `src` verbatim under `module`
    const struct sp_st_tensor *src;
    int64_t layer;
    enum sp_role role;       // role to read (EXP_GATE_UP for de-interleaved gpt-oss experts)
    int half;                // -1: whole matrix; 0/1: even/odd rows of an interleaved gate_up
    bool experts;            // stacked over all experts
    enum sp_qtype type;
    int group;
    enum sp_dtype float_dtype;  // dtype of scales/biases, or of the weight when unquantized
    bool has_bias;
    enum sp_dtype bias_dtype;
    bool router;  // recorded as a per-module quantization entry
};

struct out_plan {
    struct out_item *v;
    int64_t n, cap;
};

static enum sp_status push(struct out_plan *p, const struct out_item *it) {
    if (p->n == p->cap) {
        int64_t cap = p->cap ? p->cap * 2 : 128;
        size_t bytes = (size_t)cap * sizeof *p->v;
        struct out_item *v = p->v ? sp_realloc(p->v, bytes) : sp_malloc(bytes, SP_MEM_MISC);
        if (!v) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        p->v = v;
        p->cap = cap;
    }
    p->v[p->n++] = *it;
    return SP_OK;
}

static bool is_matrix_role(enum sp_role r) {
    switch (r) {
    case SP_ROLE_EMBED: case SP_ROLE_LM_HEAD: case SP_ROLE_ATTN_Q: case SP_ROLE_ATTN_K: case SP_ROLE_ATTN_V:
    case SP_ROLE_ATTN_QKV: case SP_ROLE_ATTN_O: case SP_ROLE_FFN_GATE: case SP_ROLE_FFN_UP: case SP_ROLE_FFN_DOWN:
    case SP_ROLE_ROUTER: case SP_ROLE_EXP_GATE: case SP_ROLE_EXP_UP: case SP_ROLE_EXP_DOWN: case SP_ROLE_EXP_GATE_UP:
    case SP_ROLE_SHEXP_GATE: case SP_ROLE_SHEXP_UP: case SP_ROLE_SHEXP_DOWN: case SP_ROLE_SHEXP_ROUTE:
    case SP_ROLE_LIN_QKV: case SP_ROLE_LIN_Z: case SP_ROLE_LIN_B: case SP_ROLE_LIN_A: case SP_ROLE_LIN_OUT:
    case SP_ROLE_LIGHT_GATE: case SP_ROLE_MLA_Q: case SP_ROLE_MLA_Q_A: case SP_ROLE_MLA_Q_B: case SP_ROLE_MLA_KV_A:
    case SP_ROLE_MLA_KV_B:
        return true;
    default:
        return false;
    }
}

/* The float dtype of a slot's values: the weight's if float, else its scales'. */
static enum sp_dtype value_dtype(const struct sp_wslot *s) {
    const struct sp_st_tensor *w = s->t[SP_PARAM_WEIGHT];
    if (w && sp_dtype_is_float(w->dtype)) return w->dtype;
    const struct sp_st_tensor *sc = s->t[SP_PARAM_SCALES];
    if (sc && sp_dtype_is_float(sc->dtype)) return sc->dtype;
    return SP_DTYPE_BF16;
}

static void choose_format(struct out_item *it, const struct sp_quantize_opts *o, int64_t cols) {
    bool target_float = !sp_qtype_is_quantized(o->type);
    if (target_float) {
        it->type = o->type;
        it->group = 1;
        it->float_dtype = o->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : o->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
        return;
    }
    enum sp_qtype t = it->router ? SP_QTYPE_AFFINE8 : o->type;
    int g = it->router ? 64 : o->group;
    if (cols % g != 0) {
        /* Left unquantized, as mlx-lm does for widths the group does not divide. */
        it->type = it->float_dtype == SP_DTYPE_F32 ? SP_QTYPE_F32 : it->float_dtype == SP_DTYPE_F16 ? SP_QTYPE_F16 : SP_QTYPE_BF16;
        it->group = 1;
        it->router = false;
        return;
    }
    it->type = t;
    it->group = g;
}

static enum sp_status plan_outputs(const struct sp_model *m, const struct sp_quantize_opts *o, struct out_plan *p) {
    const struct sp_arch *a = &m->arch;
    enum sp_status st = SP_OK;
    for (int64_t i = 0; i < m->weights.n_slots && st == SP_OK; i++) {
        const struct sp_wslot *s = &m->weights.slots[i];
        if (sp_role_class(s->role) == SP_CLASS_UNUSED) continue;  // MTP, a vision tower: text models only
        if (sp_role_class(s->role) == SP_CLASS_ROUTED_EXPERTS) continue;  // below, per layer
        struct out_item it = {0};
        it.layer = s->layer;
        it.role = s->role;
        it.half = -1;
        if (!is_matrix_role(s->role)) {
            it.copy = true;
            it.src = s->t[SP_PARAM_WEIGHT];
            snprintf(it.module, sizeof it.module, "%s", it.src->name);
            st = push(p, &it);
            continue;
        }
        it.router = s->role == SP_ROLE_ROUTER || s->role == SP_ROLE_SHEXP_ROUTE;  // 8-bit, as mlx-lm keeps gates
        /* mlx-lm names Ling's router mlp.gate.gate_proj. */
        if (it.router && (a->id == SP_ARCH_BAILING_MOE || a->id == SP_ARCH_BAILING_HYBRID) &&
            !strstr(s->module, "gate.gate_proj"))
            snprintf(it.module, sizeof it.module, "%s.gate_proj", s->module);
        else
            snprintf(it.module, sizeof it.module, "%s", s->module);
        it.float_dtype = value_dtype(s);
        it.has_bias = s->t[SP_PARAM_BIAS] != NULL;
        if (it.has_bias) it.bias_dtype = s->t[SP_PARAM_BIAS]->dtype;
        int64_t rows, cols;
        sp_model_expected_shape(a, s->role, &rows, &cols);
        choose_format(&it, o, cols);
        st = push(p, &it);
    }
    for (int64_t L = 0; L < a->n_layers && st == SP_OK; L++) {
        if (!a->layer_moe[L]) continue;
        static const char *const names[3] = {"gate_proj", "up_proj", "down_proj"};
        enum sp_role roles[3] = {SP_ROLE_EXP_GATE, SP_ROLE_EXP_UP, SP_ROLE_EXP_DOWN};
        for (int k = 0; k < 3 && st == SP_OK; k++) {
            struct out_item it = {0};
            it.layer = L;
            it.experts = true;
            it.role = roles[k];
            it.half = -1;
            if (m->fused_gate_up && k < 2) {
                it.role = SP_ROLE_EXP_GATE_UP;
                it.half = k;
            }
            struct sp_linear l;
            st = sp_model_linear(m, L, it.role, 0, &l);
            if (st != SP_OK) break;
            /* the layer's own prefix (a wrapper's model.language_model.layers.N) */
            char layer[128];
            const char *mlp = l.slot->module ? strstr(l.slot->module, ".mlp.") : NULL;
            if (mlp && (size_t)(mlp - l.slot->module) < sizeof layer)
                snprintf(layer, sizeof layer, "%.*s", (int)(mlp - l.slot->module), l.slot->module);
            else
                snprintf(layer, sizeof layer, "model.layers.%lld", (long long)L);
            snprintf(it.module, sizeof it.module, "%s.mlp.%s.%s", layer,
                     a->id == SP_ARCH_GPT_OSS ? "experts" : "switch_mlp", names[k]);
            it.float_dtype = value_dtype(l.slot);
            it.has_bias = l.bias != NULL;
            it.bias_dtype = l.bias_dtype;
            int64_t rows, cols;
            sp_model_expected_shape(a, roles[k], &rows, &cols);
            choose_format(&it, o, cols);
            st = push(p, &it);
        }
    }
    return st;
}

/* Logical (out, in) shape of an item. */
static void item_shape(const struct sp_model *m, const struct out_item *it, int64_t *rows, int64_t *cols) {
    enum sp_role r = it->role;
    if (it->half >= 0) r = it->half == 0 ? SP_ROLE_EXP_GATE : SP_ROLE_EXP_UP;
    sp_model_expected_shape(&m->arch, r, rows, cols);
}

static enum sp_status declare_item(struct sp_st_writer *w, const struct sp_model *m, const struct out_item *it) {
    char name[256];
    if (it->copy) {
        snprintf(name, sizeof name, "%s", it->module);
        return sp_st_writer_declare(w, name, it->src->dtype, it->src->ndim, it->src->shape);
    }
    int64_t rows, cols;
    item_shape(m, it, &rows, &cols);
    const struct sp_qtype_traits *tr = sp_qtype_traits(it->type);
    int64_t E = it->experts ? m->arch.n_experts : 0;
    int nd = it->experts ? 3 : 2;
    int64_t shape[3];
    enum sp_status st;
#define SHAPE(last) (it->experts ? (shape[0] = E, shape[1] = rows, shape[2] = (last)) : (shape[0] = rows, shape[1] = (last)))
    snprintf(name, sizeof name, "%s.weight", it->module);
    if (tr->mode) {
        SHAPE((int64_t)sp_qtype_row_bytes(it->type, cols) / 4);
        if ((st = sp_st_writer_declare(w, name, SP_DTYPE_U32, nd, shape)) != SP_OK) return st;
        SHAPE(cols / it->group);
        enum sp_dtype sdt = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : it->float_dtype;
        snprintf(name, sizeof name, "%s.scales", it->module);
        if ((st = sp_st_writer_declare(w, name, sdt, nd, shape)) != SP_OK) return st;
        if (tr->has_biases) {
            snprintf(name, sizeof name, "%s.biases", it->module);
            if ((st = sp_st_writer_declare(w, name, sdt, nd, shape)) != SP_OK) return st;
        }
    } else {
        SHAPE(cols);
        enum sp_dtype dt = it->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : it->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
        if ((st = sp_st_writer_declare(w, name, dt, nd, shape)) != SP_OK) return st;
    }
#undef SHAPE
    if (it->has_bias) {
        snprintf(name, sizeof name, "%s.bias", it->module);
        int64_t bshape[2] = {E, rows};
        if (!it->experts) bshape[0] = rows;
        if ((st = sp_st_writer_declare(w, name, it->bias_dtype, it->experts ? 2 : 1, bshape)) != SP_OK) return st;
    }
    return SP_OK;
}

/* Reads logical row `row` of a linear view as floats. Transposed (in, out)
 * storage reads a column; an interleaved gate_up picks every other row. */
static void read_row(const struct sp_linear *l, int half, int64_t row, float *out) {
    int64_t r = half >= 0 ? 2 * row + half : row;
    if (!l->transposed) {
        sp_qmat_dequant_row_ref(&l->w, r, out);
        return;
    }
    /* Stored (in, out): element (r, i) is at i * out + r. */
    const struct sp_qmat *q = &l->w;
    enum sp_dtype dt = q->type == SP_QTYPE_F32 ? SP_DTYPE_F32 : q->type == SP_QTYPE_F16 ? SP_DTYPE_F16 : SP_DTYPE_BF16;
    for (int64_t i = 0; i < q->cols; i++) out[i] = sp_dtype_load_float(dt, q->codes, (size_t)(i * q->rows + r));
}

/* Rows are quantized QUANT_BLOCK_ROWS at a time, split among the pool's
 * threads, then written in order: the output is the same whatever the
 * number of threads. */
#define QUANT_BLOCK_ROWS 256

struct bufs {
    struct sp_pool *pool;
    uint8_t *codes, *scales, *biases;  // QUANT_BLOCK_ROWS rows of each
    struct sp_buf acc_scales, acc_biases, acc_bias;
};

/* Rows [r0, r0 + n) of a matrix into a block of codes, scales and biases
 * (each row's scales and biases sbytes apart). */
struct row_block {
    const struct sp_linear *l;
    const struct out_item *it;
    int64_t r0, n, cols;
    size_t code_bytes, sbytes;
    enum sp_dtype sdt;
    const struct bufs *b;
};

static void quantize_rows(void *arg, int tid, int nth) {
    const struct row_block *k = arg;
    float *row = sp_pool_scratch(k->b->pool, tid);
    int64_t lo, hi;
    sp_pool_split(k->n, tid, nth, &lo, &hi);
    for (int64_t i = lo; i < hi; i++) {
        read_row(k->l, k->it->half, k->r0 + i, row);
        sp_qtype_quantize_row_ref(k->it->type, row, k->cols, k->it->group, k->b->codes + (size_t)i * k->code_bytes,
                                  k->b->scales + (size_t)i * k->sbytes, k->b->biases + (size_t)i * k->sbytes, k->sdt);
    }
}

/* Writes one expert's (or the only) matrix of an item: codes stream out at
 * once; scales, biases and the linear bias are collected for later. */
static enum sp_status write_matrix(struct sp_st_writer *w, const struct sp_model *m, const struct out_item *it,
                                   int64_t expert, struct bufs *b) {
    struct sp_linear l;
    enum sp_status st = sp_model_linear(m, it->layer, it->role, expert, &l);
    if (st != SP_OK) return st;
    int64_t rows, cols;
    item_shape(m, it, &rows, &cols);
    const struct sp_qtype_traits *tr = sp_qtype_traits(it->type);
    enum sp_dtype sdt = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : it->float_dtype;
    size_t code_bytes = sp_qtype_row_bytes(it->type, cols);
    size_t sbytes = tr->mode ? (size_t)(cols / it->group) * sp_dtype_size(sdt) : 0;
    for (int64_t r = 0; r < rows; r += QUANT_BLOCK_ROWS) {
        struct row_block k = {&l, it, r, rows - r < QUANT_BLOCK_ROWS ? rows - r : QUANT_BLOCK_ROWS, cols,
                              code_bytes, sbytes, sdt, b};
        sp_pool_run(b->pool, quantize_rows, &k);
        if ((st = sp_st_writer_write(w, b->codes, (size_t)k.n * code_bytes)) != SP_OK) return st;
        if (tr->mode) {
            sp_buf_append(&b->acc_scales, b->scales, (size_t)k.n * sbytes);
            if (tr->has_biases) sp_buf_append(&b->acc_biases, b->biases, (size_t)k.n * sbytes);
        }
    }
    if (it->has_bias) {
        size_t esz = sp_dtype_size(it->bias_dtype);
        for (int64_t r = 0; r < rows; r++) {
            int64_t src = it->half >= 0 ? 2 * r + it->half : r;
            sp_buf_append(&b->acc_bias, (const uint8_t *)l.bias + (size_t)src * esz, esz);
        }
    }
    if (b->acc_scales.failed || b->acc_biases.failed || b->acc_bias.failed) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    return SP_OK;
}

static enum sp_status write_item(struct sp_st_writer *w, const struct sp_model *m, const struct out_item *it,
                                 struct bufs *b, bool sparse) {
    if (sparse) {
        /* the declared sizes of this item's tensors, in declaration order */
        int64_t k = w->next;
        size_t bytes = 0;
        int parts = it->copy ? 1 : 1 + (sp_qtype_traits(it->type)->mode ? 1 + sp_qtype_traits(it->type)->has_biases : 0) + it->has_bias;
        for (int i = 0; i < parts; i++) bytes += w->tensors[k + i].nbytes;
        return sp_st_writer_skip(w, bytes);
    }
    if (it->copy) return sp_st_writer_write(w, it->src->data, it->src->nbytes);
    sp_buf_clear(&b->acc_scales);
    sp_buf_clear(&b->acc_biases);
    sp_buf_clear(&b->acc_bias);
    enum sp_status st = SP_OK;
    int64_t n = it->experts ? m->arch.n_experts : 1;
    for (int64_t e = 0; e < n && st == SP_OK; e++) st = write_matrix(w, m, it, it->experts ? e : -1, b);
    if (st == SP_OK && b->acc_scales.len) st = sp_st_writer_write(w, b->acc_scales.data, b->acc_scales.len);
    if (st == SP_OK && b->acc_biases.len) st = sp_st_writer_write(w, b->acc_biases.data, b->acc_biases.len);
    if (st == SP_OK && b->acc_bias.len) st = sp_st_writer_write(w, b->acc_bias.data, b->acc_bias.len);
    return st;
}

static enum sp_status write_config(const struct sp_model *m, const struct sp_quantize_opts *o, const struct out_plan *p,
                                   const char *dir) {
    cJSON *cfg = cJSON_Duplicate(m->files->config, true);
    if (!cfg) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization");
    cJSON_DeleteItemFromObjectCaseSensitive(cfg, "quantization_config");
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 4);
    sp_jw_obj(&w);
    for (const cJSON *c = cfg->child; c; c = c->next) {
        sp_jw_key(&w, c->string);
        sp_jw_cjson(&w, c);
    }
    const struct sp_qtype_traits *tr = sp_qtype_traits(o->type);
    for (int k = 0; tr->mode && k < 2; k++) {
        sp_jw_key(&w, k == 0 ? "quantization" : "quantization_config");
        sp_jw_obj(&w);
        sp_jw_key(&w, "group_size");
        sp_jw_int(&w, o->group);
        sp_jw_key(&w, "bits");
        sp_jw_int(&w, tr->bits);
        sp_jw_key(&w, "mode");
        sp_jw_str(&w, tr->mode);
        for (int64_t i = 0; i < p->n; i++) {
            if (!p->v[i].router) continue;
            sp_jw_key(&w, p->v[i].module);
            sp_jw_obj(&w);
            sp_jw_key(&w, "group_size");
            sp_jw_int(&w, p->v[i].group);
            sp_jw_key(&w, "bits");
            sp_jw_int(&w, sp_qtype_traits(p->v[i].type)->bits);
            sp_jw_end(&w);
        }
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_buf_putc(&b, '\n');
    cJSON_Delete(cfg);
    enum sp_status st = sp_write_buf(dir, "config.json", &b);
    sp_buf_free(&b);
    return st;
}

/* A GGUF source's tokenizer as tokenizer.json and tokenizer_config.json
 * (with its chat template), so that the copy is a whole model folder. */
static enum sp_status gguf_side_files(const char *path, const char *dst_dir) {
    struct sp_gguf_file *f;
    enum sp_status st = sp_gguf_open(path, &f);
    if (st != SP_OK) return st;
    char *text[2] = {NULL, NULL}, *out = NULL;
    size_t len[2];
    static const char *const names[2] = {"tokenizer.json", "tokenizer_config.json"};
    /* no vocabulary: ids only, as the source */
    if (sp_gguf_find_kv(f, "tokenizer.ggml.tokens")) st = sp_gguf_tokenizer_json(f, &text[0], &len[0], &text[1], &len[1]);
    for (int i = 0; i < 2 && st == SP_OK && text[i]; i++) {
        sp_free(out);
        if (!(out = sp_path_join(dst_dir, names[i]))) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        else st = sp_write_file(out, text[i], len[i]);
    }
    sp_free(out);
    sp_free(text[0]);
    sp_free(text[1]);
    sp_gguf_close(f);
    return st;
}

/* Tokenizer and generation files travel with the weights. */
static enum sp_status copy_side_files(const char *src_dir, const char *dst_dir) {
    if (sp_gguf_model_file(src_dir)) return gguf_side_files(src_dir, dst_dir);
    char **names;
    size_t n;
    enum sp_status st = sp_dir_list(src_dir, NULL, &names, &n);
    if (st != SP_OK) return st;
    for (size_t i = 0; i < n && st == SP_OK; i++) {
        const char *f = names[i];
        size_t l = strlen(f);
        if (strcmp(f, "config.json") == 0 || strcmp(f, "model.safetensors.index.json") == 0 ||
            (l > 12 && strcmp(f + l - 12, ".safetensors") == 0))
            continue;
        char *s = sp_path_join(src_dir, f), *d = sp_path_join(dst_dir, f);
        st = s && d ? sp_copy_file(s, d) : sp_errorf(SP_ERR_NOMEM, "out of memory");
        sp_free(s);
        sp_free(d);
    }
    sp_strv_free(names, n);
    return st;
}

enum sp_status sp_quantize_model(const struct sp_model *m, const char *out_dir, const struct sp_quantize_opts *opts) {
    struct sp_quantize_opts o = *opts;
    const struct sp_qtype_traits *tr = sp_qtype_traits(o.type);
    if (!o.group) o.group = tr->mode ? (tr->group ? tr->group : 64) : 1;
    if (tr->mode) {
        enum sp_status st = sp_qtype_check_shape(o.type, o.group, o.group);
        if (st != SP_OK) return st;
    }
    if (!o.shard_bytes) o.shard_bytes = (size_t)5 << 30;
    struct out_plan p = {0};
    struct sp_st_writer w;
    struct bufs b = {.acc_scales = SP_BUF_INIT, .acc_biases = SP_BUF_INIT, .acc_bias = SP_BUF_INIT};
    struct sp_pool *own_pool = NULL;
    sp_st_writer_init(&w, out_dir, o.shard_bytes);
    enum sp_status st = plan_outputs(m, &o, &p);
    for (int64_t i = 0; i < p.n && st == SP_OK; i++) st = declare_item(&w, m, &p.v[i]);
    if (st == SP_OK) st = sp_st_writer_begin(&w);
    int64_t maxc = m->arch.d_model;
    const int64_t widths[] = {m->arch.d_ff, m->arch.d_expert * (m->arch.n_shared_experts > 1 ? m->arch.n_shared_experts : 1),
                              m->arch.n_heads * m->arch.head_dim};
    for (size_t i = 0; i < sizeof widths / sizeof *widths; i++)
        if (widths[i] > maxc) maxc = widths[i];
    /* a row: at most 4 bytes a value in codes, scales or biases */
    size_t block = (size_t)QUANT_BLOCK_ROWS * (size_t)maxc * 4;
    b.codes = sp_malloc(block, SP_MEM_MISC);
    b.scales = sp_malloc(block, SP_MEM_MISC);
    b.biases = sp_malloc(block, SP_MEM_MISC);
    if (st == SP_OK && (!b.codes || !b.scales || !b.biases)) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) st = o.pool ? SP_OK : sp_pool_create(1, &own_pool);
    b.pool = o.pool ? o.pool : own_pool;
    if (st == SP_OK) st = sp_pool_reserve(b.pool, (size_t)maxc * sizeof(float));
    for (int64_t i = 0; i < p.n && st == SP_OK; i++) {
        st = write_item(&w, m, &p.v[i], &b, o.sparse);
        if (st != SP_OK) sp_error_prefix("%s: ", p.v[i].module);
    }
    if (st == SP_OK) st = sp_st_writer_finish(&w);
    if (st == SP_OK) st = write_config(m, &o, &p, out_dir);
    if (st == SP_OK) st = copy_side_files(m->files->dir, out_dir);
    sp_st_writer_free(&w);
    sp_buf_free(&b.acc_scales);
    sp_buf_free(&b.acc_biases);
    sp_buf_free(&b.acc_bias);
    sp_pool_free(own_pool);
    sp_free(b.codes);
    sp_free(b.scales);
    sp_free(b.biases);
    sp_free(p.v);
    return st;
}
