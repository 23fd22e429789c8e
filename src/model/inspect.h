/*
 * inspect.h - what a model holds: parameters and bytes by tensor role class
 * and by format, and the parameters active per token. Computed from tensor
 * headers alone.
 *
 *     struct sp_model_stats s;
 *     sp_model_stats(model, &s);
 *     printf("%lld params, %lld active\n", s.total_params, s.active_params);
 *     sp_model_stats_json(model, &s, &buf);   // the same, as JSON
 */
#ifndef SP_MODEL_INSPECT_H
#define SP_MODEL_INSPECT_H

#include "core/buf.h"
#include "model/model.h"

#define SP_STATS_MAX_FORMATS 32

struct sp_format_stats {
    char name[32];  // "affine4-g64 (bf16 scales)", "mxfp4", "bf16", ...
    int64_t tensors;
    int64_t params;
    size_t bytes;
};

struct sp_model_stats {
    int64_t params[SP_CLASS_COUNT];
    size_t bytes[SP_CLASS_COUNT];
    struct sp_format_stats formats[SP_STATS_MAX_FORMATS];
    int n_formats;
    int64_t total_params;
    size_t total_bytes;  // tensor bytes (excluding headers)
    int64_t active_params;  // per token: everything but routed experts, plus k/E of them
    int64_t active_params_non_embedding;  // the same without embedding and lm_head
    size_t active_bytes;  // bytes a decoded token reads under that count (composed weights counted for theirs)
    size_t composed_bytes;  // weights a context composes at load and holds besides the files (sp_model_composed)
    int64_t n_moe_layers, n_dense_layers;
    size_t expert_bytes;  // one routed expert of one layer (all its tensors), largest layer
    size_t file_bytes;
};

void sp_model_stats(const struct sp_model *m, struct sp_model_stats *s);
/* Human-readable report (text) or JSON (json = true) appended to out. */
void sp_model_report(const struct sp_model *m, const struct sp_model_stats *s, bool json, struct sp_buf *out);

#endif
