/* inspect.c - parameter and byte accounting by role class and format. */
#include "model/inspect.h"

#include "model/forward.h"

#include <stdio.h>
#include <string.h>

#include "core/json.h"

/* Format of a slot's weight: quantized type from the config, else the dtype. */
static void slot_format(const struct sp_model *m, const struct sp_wslot *s, char *name, size_t cap, int64_t *params) {
    const struct sp_st_tensor *w = s->t[SP_PARAM_WEIGHT];
    int64_t numel = w ? sp_st_numel(w) : 0;
    struct sp_qparams p;
    *params = numel;
    snprintf(name, cap, "%s", w ? sp_dtype_name(w->dtype) : "?");
    if (sp_model_slot_blocks(m, s, &p)) {  // whole blocks
        const struct sp_qtype_traits *tr = sp_qtype_traits(p.type);
        *params = numel / tr->block_bytes * tr->group;
        snprintf(name, cap, "%s", tr->name);
    } else if (w && s->t[SP_PARAM_SCALES] && sp_qconfig_lookup(&m->qcfg, s->module, &p) && p.quantized) {
        const struct sp_qtype_traits *tr = sp_qtype_traits(p.type);
        *params = (int64_t)((uint64_t)numel * sp_dtype_size(w->dtype) * 8 / (uint64_t)tr->bits);
        if (tr->has_biases)
            snprintf(name, cap, "%s-g%d/%s", tr->name, p.group, sp_dtype_name(s->t[SP_PARAM_SCALES]->dtype));
        else
            snprintf(name, cap, "%s", tr->name);
    }
    for (char *c = name; *c; c++)
        if (*c >= 'A' && *c <= 'Z') *c = (char)(*c - 'A' + 'a');
}

static struct sp_format_stats *format_entry(struct sp_model_stats *s, const char *name) {
    for (int i = 0; i < s->n_formats; i++)
        if (strcmp(s->formats[i].name, name) == 0) return &s->formats[i];
    if (s->n_formats == SP_STATS_MAX_FORMATS) return &s->formats[SP_STATS_MAX_FORMATS - 1];
    struct sp_format_stats *f = &s->formats[s->n_formats++];
    snprintf(f->name, sizeof f->name, "%s", name);
    return f;
}

void sp_model_stats(const struct sp_model *m, struct sp_model_stats *s) {
    memset(s, 0, sizeof *s);
    const struct sp_arch *a = &m->arch;
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (a->layer_moe[L])
            s->n_moe_layers++;
        else
            s->n_dense_layers++;
    }
    int64_t routed_params = 0;
    size_t routed_bytes = 0;
    for (int64_t i = 0; i < m->weights.n_slots; i++) {
        const struct sp_wslot *sl = &m->weights.slots[i];
        enum sp_role_class cls = sp_role_class(sl->role);
        size_t bytes = 0;
        for (int p = 0; p < SP_PARAM_COUNT; p++)
            if (sl->t[p]) bytes += sl->t[p]->nbytes;
        char fname[32];
        int64_t params;
        slot_format(m, sl, fname, sizeof fname, &params);
        if (sl->t[SP_PARAM_BIAS]) params += sp_st_numel(sl->t[SP_PARAM_BIAS]);
        s->params[cls] += params;
        s->bytes[cls] += bytes;
        s->total_params += params;
        s->total_bytes += bytes;
        struct sp_format_stats *f = format_entry(s, fname);
        f->tensors++;
        f->params += params;
        f->bytes += bytes;
        if (cls == SP_CLASS_ROUTED_EXPERTS) {
            routed_params += params;
            routed_bytes += bytes;
        }
    }
    /* One expert of the largest MoE layer: its share of that layer's routed bytes. */
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (!a->layer_moe[L]) continue;
        size_t layer_bytes = 0;
        for (int64_t i = 0; i < m->weights.n_slots; i++) {
            const struct sp_wslot *sl = &m->weights.slots[i];
            if (sl->layer != L || sp_role_class(sl->role) != SP_CLASS_ROUTED_EXPERTS) continue;
            for (int p = 0; p < SP_PARAM_COUNT; p++)
                if (sl->t[p]) layer_bytes += sl->t[p]->nbytes;
        }
        size_t per = a->n_experts ? layer_bytes / (size_t)a->n_experts : 0;
        if (per > s->expert_bytes) s->expert_bytes = per;
    }
    int64_t unused = s->params[SP_CLASS_UNUSED];
    double frac = a->n_experts ? (double)a->n_experts_used / (double)a->n_experts : 0.0;
    s->active_params = s->total_params - unused - routed_params + (int64_t)((double)routed_params * frac + 0.5);
    s->active_params_non_embedding =
        s->active_params - s->params[SP_CLASS_EMBEDDING] - s->params[SP_CLASS_LM_HEAD];
    /* A token reads one embedding row, not the table; with tied embeddings the
     * table is read whole as the output projection. */
    size_t embed_row = a->vocab ? s->bytes[SP_CLASS_EMBEDDING] / (size_t)a->vocab : 0;
    size_t embed_read = m->has_lm_head ? embed_row : s->bytes[SP_CLASS_EMBEDDING];
    s->active_bytes = s->total_bytes - s->bytes[SP_CLASS_UNUSED] - s->bytes[SP_CLASS_EMBEDDING] + embed_read -
                      routed_bytes + (size_t)((double)routed_bytes * frac + 0.5);
    size_t replaced;
    sp_model_composed(m, &s->composed_bytes, &replaced);
    s->active_bytes += s->composed_bytes - replaced;
    s->file_bytes = m->files->total_bytes;
}

static void human_count(char *buf, size_t cap, int64_t n) {
    if (n >= 1000000000)
        snprintf(buf, cap, "%.2fB", (double)n / 1e9);
    else if (n >= 1000000)
        snprintf(buf, cap, "%.2fM", (double)n / 1e6);
    else if (n >= 1000)
        snprintf(buf, cap, "%.2fK", (double)n / 1e3);
    else
        snprintf(buf, cap, "%lld", (long long)n);
}

static void human_bytes(char *buf, size_t cap, size_t n) {
    if (n >= ((size_t)1 << 30))
        snprintf(buf, cap, "%.2f GiB", (double)n / (double)(1u << 30));
    else if (n >= ((size_t)1 << 20))
        snprintf(buf, cap, "%.2f MiB", (double)n / (double)(1u << 20));
    else if (n >= 1024)
        snprintf(buf, cap, "%.2f KiB", (double)n / 1024.0);
    else
        snprintf(buf, cap, "%zu B", n);
}

static void report_json(const struct sp_model *m, const struct sp_model_stats *s, struct sp_buf *out) {
    const struct sp_arch *a = &m->arch;
    struct sp_jw w;
    sp_jw_init(&w, out, 2);
    sp_jw_obj(&w);
    sp_jw_key(&w, "model");
    sp_jw_str(&w, m->files->dir);
    sp_jw_key(&w, "architecture");
    sp_jw_str(&w, a->model_type);
    sp_jw_key(&w, "layers");
    sp_jw_int(&w, a->n_layers);
    sp_jw_key(&w, "moe_layers");
    sp_jw_int(&w, s->n_moe_layers);
    sp_jw_key(&w, "dense_layers");
    sp_jw_int(&w, s->n_dense_layers);
    sp_jw_key(&w, "mtp_layers");
    sp_jw_int(&w, a->n_mtp_layers);
    sp_jw_key(&w, "hidden_size");
    sp_jw_int(&w, a->d_model);
    sp_jw_key(&w, "vocab_size");
    sp_jw_int(&w, a->vocab);
    sp_jw_key(&w, "attention");
    sp_jw_obj(&w);
    sp_jw_key(&w, "heads");
    sp_jw_int(&w, a->n_heads);
    sp_jw_key(&w, "kv_heads");
    sp_jw_int(&w, a->n_kv_heads);
    sp_jw_key(&w, "head_dim");
    sp_jw_int(&w, a->head_dim);
    sp_jw_key(&w, "rotary_dims");
    sp_jw_int(&w, a->rope.rot_dims);
    sp_jw_key(&w, "rope_scaling");
    sp_jw_str(&w, sp_rope_kind_name(a->rope.kind));
    sp_jw_key(&w, "qk_norm");
    sp_jw_bool(&w, a->qk_norm);
    sp_jw_key(&w, "sinks");
    sp_jw_bool(&w, a->attn_sinks);
    sp_jw_key(&w, "sliding_window");
    sp_jw_int(&w, a->sliding_window);
    sp_jw_end(&w);
    if (s->n_moe_layers) {
        sp_jw_key(&w, "moe");
        sp_jw_obj(&w);
        sp_jw_key(&w, "experts");
        sp_jw_int(&w, a->n_experts);
        sp_jw_key(&w, "experts_per_token");
        sp_jw_int(&w, a->n_experts_used);
        sp_jw_key(&w, "shared_experts");
        sp_jw_int(&w, a->n_shared_experts);
        sp_jw_key(&w, "expert_intermediate_size");
        sp_jw_int(&w, a->d_expert);
        sp_jw_key(&w, "router");
        sp_jw_str(&w, sp_router_kind_name(a->router));
        sp_jw_key(&w, "groups");
        sp_jw_int(&w, a->n_group);
        sp_jw_key(&w, "topk_groups");
        sp_jw_int(&w, a->topk_group);
        sp_jw_key(&w, "expert_bias");
        sp_jw_bool(&w, m->has_expert_bias);
        sp_jw_key(&w, "expert_bytes");
        sp_jw_uint(&w, s->expert_bytes);
        sp_jw_end(&w);
    }
    sp_jw_key(&w, "params");
    sp_jw_obj(&w);
    sp_jw_key(&w, "total");
    sp_jw_int(&w, s->total_params);
    sp_jw_key(&w, "active");
    sp_jw_int(&w, s->active_params);
    sp_jw_key(&w, "active_non_embedding");
    sp_jw_int(&w, s->active_params_non_embedding);
    for (int c = 0; c < SP_CLASS_COUNT; c++) {
        sp_jw_key(&w, sp_role_class_name((enum sp_role_class)c));
        sp_jw_int(&w, s->params[c]);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "bytes");
    sp_jw_obj(&w);
    sp_jw_key(&w, "total");
    sp_jw_uint(&w, s->total_bytes);
    sp_jw_key(&w, "files");
    sp_jw_uint(&w, s->file_bytes);
    sp_jw_key(&w, "per_token");
    sp_jw_uint(&w, s->active_bytes);
    for (int c = 0; c < SP_CLASS_COUNT; c++) {
        sp_jw_key(&w, sp_role_class_name((enum sp_role_class)c));
        sp_jw_uint(&w, s->bytes[c]);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "formats");
    sp_jw_arr(&w);
    for (int i = 0; i < s->n_formats; i++) {
        sp_jw_obj(&w);
        sp_jw_key(&w, "format");
        sp_jw_str(&w, s->formats[i].name);
        sp_jw_key(&w, "tensors");
        sp_jw_int(&w, s->formats[i].tensors);
        sp_jw_key(&w, "params");
        sp_jw_int(&w, s->formats[i].params);
        sp_jw_key(&w, "bytes");
        sp_jw_uint(&w, s->formats[i].bytes);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "unrecognised_tensors");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < m->weights.n_unknown; i++) sp_jw_str(&w, m->weights.unknown[i]);
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_buf_putc(out, '\n');
}

void sp_model_report(const struct sp_model *m, const struct sp_model_stats *s, bool json, struct sp_buf *out) {
    if (json) {
        report_json(m, s, out);
        return;
    }
    const struct sp_arch *a = &m->arch;
    char n1[32], n2[32], n3[32], b1[32];
    sp_buf_printf(out, "model         %s\n", m->files->dir);
    sp_buf_printf(out, "architecture  %s: %lld layers (%lld MoE, %lld dense", a->model_type, (long long)a->n_layers,
                  (long long)s->n_moe_layers, (long long)s->n_dense_layers);
    if (a->n_mtp_layers) sp_buf_printf(out, ", %lld MTP not run", (long long)a->n_mtp_layers);
    sp_buf_printf(out, "), hidden %lld, vocab %lld\n", (long long)a->d_model, (long long)a->vocab);
    sp_buf_printf(out, "attention     %lld heads / %lld kv heads x %lld, rotary %lld dims (%s)%s%s", (long long)a->n_heads,
                  (long long)a->n_kv_heads, (long long)a->head_dim, (long long)a->rope.rot_dims,
                  sp_rope_kind_name(a->rope.kind), a->qk_norm ? ", qk-norm" : "", a->attn_sinks ? ", sinks" : "");
    if (a->sliding_window) sp_buf_printf(out, ", sliding window %lld", (long long)a->sliding_window);
    if (a->attn_gate) sp_buf_puts(out, ", output gate");
    sp_buf_puts(out, "\n");
    int64_t n_delta = 0, n_light = 0, n_mla = 0;
    for (int64_t L = 0; L < a->n_layers; L++) {
        n_delta += a->layer_kind[L] == SP_LAYER_GATED_DELTA;
        n_light += a->layer_kind[L] == SP_LAYER_LIGHTNING;
        n_mla += a->layer_kind[L] == SP_LAYER_MLA;
    }
    if (n_light || n_mla)
        sp_buf_printf(out,
                      "linear attn   %lld of %lld layers Lightning (%lld output norm groups), %lld MLA: q rank %lld, "
                      "kv rank %lld, %lld + %lld query dims, %lld value dims a head\n",
                      (long long)n_light, (long long)a->n_layers, (long long)a->light_groups, (long long)n_mla,
                      (long long)a->mla_q_lora, (long long)a->mla_kv_lora, (long long)a->mla_nope,
                      (long long)a->mla_rope, (long long)a->mla_v);
    if (n_delta)
        sp_buf_printf(out,
                      "linear attn   %lld of %lld layers Gated DeltaNet: %lld key heads x %lld, %lld value heads x "
                      "%lld, conv %lld; the rest attention\n",
                      (long long)n_delta, (long long)a->n_layers, (long long)a->lin_k_heads, (long long)a->lin_k_dim,
                      (long long)a->lin_v_heads, (long long)a->lin_v_dim, (long long)a->lin_conv);
    if (s->n_moe_layers) {
        human_bytes(b1, sizeof b1, s->expert_bytes);
        sp_buf_printf(out, "moe           %lld experts, top-%lld, %lld shared%s, width %lld, router %s",
                      (long long)a->n_experts, (long long)a->n_experts_used, (long long)a->n_shared_experts,
                      a->shared_gate ? " (gated)" : "", (long long)a->d_expert, sp_router_kind_name(a->router));
        if (a->n_group > 1) sp_buf_printf(out, " (%lld groups, keep %lld)", (long long)a->n_group, (long long)a->topk_group);
        sp_buf_printf(out, "%s; one expert = %s\n", m->has_expert_bias ? ", expert bias" : "", b1);
    }
    human_count(n1, sizeof n1, s->total_params);
    human_count(n2, sizeof n2, s->active_params);
    human_count(n3, sizeof n3, s->active_params_non_embedding);
    sp_buf_printf(out, "params        %s total, %s active per token (%s without embeddings)\n", n1, n2, n3);
    human_bytes(b1, sizeof b1, s->total_bytes);
    char b2[32], b3[32];
    human_bytes(b2, sizeof b2, s->file_bytes);
    human_bytes(b3, sizeof b3, s->active_bytes);
    sp_buf_printf(out, "bytes         %s of tensors in %s of files; %s read per decoded token", b1, b2, b3);
    if (s->composed_bytes) {
        human_bytes(b1, sizeof b1, s->composed_bytes);
        sp_buf_printf(out, " (with %s composed at load)", b1);
    }
    sp_buf_puts(out, "\n\n");
    sp_buf_printf(out, "%-16s %16s %14s\n", "role", "params", "bytes");
    for (int c = 0; c < SP_CLASS_COUNT; c++) {
        if (!s->params[c] && !s->bytes[c]) continue;
        human_bytes(b1, sizeof b1, s->bytes[c]);
        sp_buf_printf(out, "%-16s %16lld %14s\n", sp_role_class_name((enum sp_role_class)c), (long long)s->params[c], b1);
    }
    sp_buf_printf(out, "\n%-22s %8s %16s %14s\n", "format", "tensors", "params", "bytes");
    for (int i = 0; i < s->n_formats; i++) {
        human_bytes(b1, sizeof b1, s->formats[i].bytes);
        sp_buf_printf(out, "%-22s %8lld %16lld %14s\n", s->formats[i].name, (long long)s->formats[i].tensors,
                      (long long)s->formats[i].params, b1);
    }
    if (m->weights.n_unknown) {
        sp_buf_printf(out, "\n%lld unrecognised tensors (not used):", (long long)m->weights.n_unknown);
        for (int64_t i = 0; i < m->weights.n_unknown && i < 8; i++) sp_buf_printf(out, " %s", m->weights.unknown[i]);
        sp_buf_puts(out, m->weights.n_unknown > 8 ? " ...\n" : "\n");
    }
}
