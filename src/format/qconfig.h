/*
 * qconfig.h - the "quantization" (or "quantization_config") section of an
 * MLX model's config.json: global {group_size, bits, mode} plus per-module
 * entries, as mlx-lm writes them (../shared/specs/mlx-quant-format.md §6).
 *
 *     struct sp_qconfig q;
 *     sp_qconfig_parse(config, &q);
 *     struct sp_qparams p;
 *     if (sp_qconfig_lookup(&q, "model.layers.1.mlp.gate.gate_proj", &p) && p.quantized) ...
 *     sp_qconfig_free(&q);
 *
 * Rules: a per-module dict gives that module its own parameters, and its
 * missing "mode" means affine even in an mxfp4 model; `true` means the global
 * parameters, `false` means not quantized (older mlx-lm files). A missing
 * global "mode" means affine.
 */
#ifndef SP_FORMAT_QCONFIG_H
#define SP_FORMAT_QCONFIG_H

#include <cjson/cJSON.h>
#include <stdbool.h>

#include "core/status.h"
#include "core/strmap.h"
#include "quant/qtype.h"

struct sp_qparams {
    bool quantized;
    enum sp_qtype type;  // when quantized
    int group;
};

struct sp_qconfig {
    bool present;  // the config has a quantization section
    struct sp_qparams global;
    struct sp_qparams *modules;  // (n_modules), indexed by the map's values
    int64_t n_modules;
    struct sp_strmap by_path;  // module path -> index in modules
};

enum sp_status sp_qconfig_parse(const cJSON *config, struct sp_qconfig *out);
void sp_qconfig_free(struct sp_qconfig *q);
/* Parameters for a module path: its own entry, else the global ones.
 * Returns false when the config has no quantization section at all. */
bool sp_qconfig_lookup(const struct sp_qconfig *q, const char *path, struct sp_qparams *out);

#endif
