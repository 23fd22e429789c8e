/* fuzz_config.c - libFuzzer target: arbitrary bytes as config.json, through
 * the JSON parser, the architecture descriptor and the quantization config. */
#include <stddef.h>
#include <stdint.h>

#include "core/json.h"
#include "format/qconfig.h"
#include "model/arch.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    cJSON *c;
    if (sp_json_parse((const char *)data, size, "config.json", &c) != SP_OK) return 0;
    struct sp_arch a;
    if (sp_arch_from_config(c, &a) == SP_OK) {
        for (int64_t l = 0; l < a.n_layers; l++) SP_ASSERT(a.layer_moe[l] || a.d_ff > 0);
        sp_arch_free(&a);
    }
    struct sp_qconfig q;
    if (sp_qconfig_parse(c, &q) == SP_OK) {
        struct sp_qparams p;
        sp_qconfig_lookup(&q, "model.layers.0.mlp.gate", &p);
    }
    sp_qconfig_free(&q);
    cJSON_Delete(c);
    return 0;
}
