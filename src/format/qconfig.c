/* qconfig.c - MLX quantization parameters from config.json. */
#include "format/qconfig.h"

#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

/* Reads {group_size, bits, mode} from obj; fields absent from obj come from
 * def (per-module dicts may give only some), mode defaulting to affine. */
static enum sp_status read_params(const cJSON *obj, const struct sp_qparams *def, const char *where,
                                  struct sp_qparams *out) {
    int64_t group, bits;
    const char *mode;
    int def_bits = def && def->quantized ? sp_qtype_traits(def->type)->bits : 4;
    enum sp_status st = sp_json_get_int(obj, "group_size", def && def->quantized ? def->group : 64, &group);
    if (st == SP_OK) st = sp_json_get_int(obj, "bits", def_bits, &bits);
    if (st == SP_OK) st = sp_json_get_str(obj, "mode", "affine", &mode);
    if (st != SP_OK) return sp_errorf(st, "%s: %s", where, sp_error_msg());
    if (bits <= 0 || bits > 8) return sp_errorf(SP_ERR_UNSUPPORTED, "%s: %lld bits is not supported", where, (long long)bits);
    st = sp_qtype_from_mode(mode, (int)bits, &out->type);
    if (st != SP_OK) return sp_errorf(st, "%s: %s", where, sp_error_msg());
    if (group <= 0 || group > 1024) return sp_errorf(SP_ERR_FORMAT, "%s: group_size %lld", where, (long long)group);
    out->group = (int)group;
    out->quantized = true;
    st = sp_qtype_check_shape(out->type, out->group, out->group);
    if (st != SP_OK) return sp_errorf(st, "%s: %s", where, sp_error_msg());
    return SP_OK;
}

enum sp_status sp_qconfig_parse(const cJSON *config, struct sp_qconfig *q) {
    memset(q, 0, sizeof *q);
    sp_strmap_init(&q->by_path, SP_MEM_MODEL);
    const cJSON *sec = cJSON_GetObjectItemCaseSensitive(config, "quantization");
    if (!sec) sec = cJSON_GetObjectItemCaseSensitive(config, "quantization_config");
    if (!sec || cJSON_IsNull(sec)) return SP_OK;
    if (!cJSON_IsObject(sec))
        return sp_errorf(SP_ERR_FORMAT, "config.json: \"quantization\": expected an object, got %s", sp_json_type_name(sec));
    const cJSON *method = cJSON_GetObjectItemCaseSensitive(sec, "quant_method");
    if (cJSON_IsString(method) && !cJSON_GetObjectItemCaseSensitive(sec, "bits")) {
        /* Foreign formats (Hugging Face gpt-oss mxfp4 *_blocks, GPTQ, AWQ, fp8 ...) use other tensor layouts. */
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "config.json: quantization method \"%s\" is not supported; use an MLX-format "
                         "(mlx-community) or unquantized checkpoint, or convert with `sparrow quantize`",
                         method->valuestring);
    }
    enum sp_status st = read_params(sec, NULL, "config.json: quantization", &q->global);
    if (st != SP_OK) return st;
    q->present = true;
    int64_t n = 0;
    for (const cJSON *e = sec->child; e; e = e->next)
        if (cJSON_IsObject(e) || cJSON_IsBool(e)) n++;
    q->modules = sp_calloc((size_t)(n ? n : 1), sizeof *q->modules, SP_MEM_MODEL);
    if (!q->modules) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (const cJSON *e = sec->child; e; e = e->next) {
        struct sp_qparams p = {0};
        if (cJSON_IsObject(e)) {
            char where[300];
            snprintf(where, sizeof where, "config.json: quantization[\"%.200s\"]", e->string);
            st = read_params(e, NULL, where, &p);
            if (st != SP_OK) return st;
        } else if (cJSON_IsBool(e)) {
            p = cJSON_IsTrue(e) ? q->global : (struct sp_qparams){0};
        } else {
            continue;  // group_size, bits, mode, quant_method ...
        }
        q->modules[q->n_modules] = p;
        st = sp_strmap_put(&q->by_path, e->string, strlen(e->string), q->n_modules);
        if (st != SP_OK) return st;
        q->n_modules++;
    }
    return SP_OK;
}

void sp_qconfig_free(struct sp_qconfig *q) {
    if (!q) return;
    sp_free(q->modules);
    sp_strmap_free(&q->by_path);
    memset(q, 0, sizeof *q);
}

bool sp_qconfig_lookup(const struct sp_qconfig *q, const char *path, struct sp_qparams *out) {
    if (!q->present) return false;
    int64_t i;
    if (sp_strmap_get(&q->by_path, path, strlen(path), &i))
        *out = q->modules[i];
    else
        *out = q->global;
    return true;
}
