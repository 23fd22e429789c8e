/* routing.c - the routing counts file (runtime/routing.h). */
#include "runtime/routing.h"

#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "core/json.h"
#include "model/model.h"

#define ROUTING_MAX_BYTES ((size_t)256 << 20)

enum sp_status sp_routing_write(const char *path, const struct sp_model *m, const uint64_t *counts) {
    const struct sp_arch *a = &m->arch;
    int64_t E = a->n_experts, k = a->n_experts_used > 0 ? a->n_experts_used : 1;
    uint64_t tokens = 0;
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (!a->layer_moe[L]) continue;
        for (int64_t e = 0; e < E; e++) tokens += counts[L * E + e];
        break;
    }
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "model_type");
    sp_jw_str(&w, a->model_type);
    sp_jw_key(&w, "layers");
    sp_jw_int(&w, a->n_layers);
    sp_jw_key(&w, "experts");
    sp_jw_int(&w, E);
    sp_jw_key(&w, "experts_per_token");
    sp_jw_int(&w, a->n_experts_used);
    sp_jw_key(&w, "tokens");
    sp_jw_uint(&w, tokens / (uint64_t)k);
    sp_jw_key(&w, "counts");
    sp_jw_arr(&w);
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (!a->layer_moe[L]) {
            sp_jw_null(&w);
            continue;
        }
        sp_jw_arr(&w);
        for (int64_t e = 0; e < E; e++) sp_jw_uint(&w, counts[L * E + e]);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_buf_putc(&b, '\n');
    enum sp_status st = b.failed ? sp_errorf(SP_ERR_NOMEM, "out of memory") : sp_write_file(path, b.data, b.len);
    sp_buf_free(&b);
    return st;
}

/* The file's number key, which must equal want. */
static enum sp_status expect(const char *path, const cJSON *root, const char *key, int64_t want, const char *what) {
    int64_t v;
    enum sp_status st = sp_json_get_int(root, key, -1, &v);
    if (st != SP_OK) return sp_errorf(SP_ERR_FORMAT, "%s: %s", path, sp_error_msg());
    if (v < 0) return sp_errorf(SP_ERR_FORMAT, "%s: no \"%s\" (a whole number: the %s)", path, key, what);
    if (v != want)
        return sp_errorf(SP_ERR_ARG, "%s: counts of %lld %s (\"%s\"), the model has %lld", path, (long long)v, what, key,
                         (long long)want);
    return SP_OK;
}

static enum sp_status read_counts(const char *path, const cJSON *root, const struct sp_arch *a, double *load) {
    int64_t E = a->n_experts;
    const cJSON *rows = cJSON_GetObjectItemCaseSensitive(root, "counts");
    if (!cJSON_IsArray(rows))
        return sp_errorf(SP_ERR_FORMAT, "%s: \"counts\" is %s, expected an array of a row a layer", path,
                         sp_json_type_name(rows));
    if (cJSON_GetArraySize(rows) != a->n_layers)
        return sp_errorf(SP_ERR_FORMAT, "%s: \"counts\" has %d rows for %lld layers", path, cJSON_GetArraySize(rows),
                         (long long)a->n_layers);
    int64_t L = 0;
    for (const cJSON *row = rows->child; row; row = row->next, L++) {
        if (!a->layer_moe[L]) {
            if (!cJSON_IsNull(row))
                return sp_errorf(SP_ERR_FORMAT, "%s: counts of layer %lld, which has no routed experts: expected null",
                                 path, (long long)L);
            continue;
        }
        if (!cJSON_IsArray(row) || cJSON_GetArraySize(row) != E)
            return sp_errorf(SP_ERR_FORMAT, "%s: counts of layer %lld: expected an array of %lld numbers, got %s", path,
                             (long long)L, (long long)E, sp_json_type_name(row));
        int64_t e = 0;
        for (const cJSON *c = row->child; c; c = c->next, e++) {
            int64_t v;
            if (!sp_json_is_int(c, &v) || v < 0)
                return sp_errorf(SP_ERR_FORMAT, "%s: counts of layer %lld, expert %lld: expected a whole number of "
                                 "tokens, at least 0", path, (long long)L, (long long)e);
            load[L * E + e] = (double)v;
        }
    }
    return SP_OK;
}

enum sp_status sp_routing_read(const char *path, const struct sp_model *m, double **load) {
    const struct sp_arch *a = &m->arch;
    *load = NULL;
    if (a->n_experts <= 0) return sp_errorf(SP_ERR_ARG, "%s: an expert load for a model without routed experts", path);
    cJSON *root;
    enum sp_status st = sp_json_parse_file(path, ROUTING_MAX_BYTES, &root);
    if (st != SP_OK) return st;
    if (!cJSON_IsObject(root)) st = sp_errorf(SP_ERR_FORMAT, "%s: expected a JSON object of routing counts", path);
    if (st == SP_OK) st = expect(path, root, "layers", a->n_layers, "layers");
    if (st == SP_OK) st = expect(path, root, "experts", a->n_experts, "routed experts a layer");
    double *l = NULL;
    if (st == SP_OK && !(l = sp_calloc((size_t)(a->n_layers * a->n_experts), sizeof *l, SP_MEM_MODEL)))
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) st = read_counts(path, root, a, l);
    cJSON_Delete(root);
    if (st != SP_OK) {
        sp_free(l);
        return st;
    }
    *load = l;
    return SP_OK;
}
