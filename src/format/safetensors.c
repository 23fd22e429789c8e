/* safetensors.c - strict safetensors header parsing. */
#include "format/safetensors.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/json.h"

/* Sorting spans to check overlaps and coverage. */
struct span {
    size_t begin, end;
    int64_t index;
};

static int cmp_span(const void *a, const void *b) {
    const struct span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return 0;
}

/* Reads a JSON number that must be a non-negative integer <= 2^53. */
static bool get_u64(const cJSON *it, uint64_t *out) {
    int64_t v;
    if (!sp_json_is_int(it, &v) || v < 0) return false;
    *out = (uint64_t)v;
    return true;
}

static enum sp_status parse_entry(struct sp_st_file *f, const char *what, const cJSON *e, struct sp_st_tensor *t,
                                  size_t data_len) {
    const char *name = e->string;
    if (!cJSON_IsObject(e))
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: expected an object, got %s", what, name,
                         sp_json_type_name(e));
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(e, "dtype");
    const cJSON *shape = cJSON_GetObjectItemCaseSensitive(e, "shape");
    const cJSON *offs = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
    if (!cJSON_IsString(dt)) return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: \"dtype\" missing or not a string", what, name);
    if (!sp_dtype_from_name(dt->valuestring, &t->dtype))
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s: unknown dtype \"%s\" (known: %s)", what, name,
                         dt->valuestring, sp_dtype_all_names());
    if (!cJSON_IsArray(shape)) return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: \"shape\" missing or not an array", what, name);
    int nd = cJSON_GetArraySize(shape);
    if (nd > SP_ST_MAX_DIMS)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: tensor %s: %d dimensions (at most %d supported)", what, name, nd,
                         SP_ST_MAX_DIMS);
    t->ndim = nd;
    uint64_t numel = 1;
    bool overflow = false;
    int i = 0;
    for (const cJSON *d = shape->child; d; d = d->next, i++) {
        uint64_t v;
        if (!get_u64(d, &v))
            return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: shape[%d] is not a non-negative integer", what, name, i);
        t->shape[i] = (int64_t)v;
        if (v && numel > UINT64_MAX / v) overflow = true;
        numel *= v;
    }
    size_t esz = sp_dtype_size(t->dtype);
    if (overflow || numel > SIZE_MAX / esz)
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: shape is too large", what, name);
    uint64_t begin, end;
    if (!cJSON_IsArray(offs) || cJSON_GetArraySize(offs) != 2 || !get_u64(offs->child, &begin) ||
        !get_u64(offs->child->next, &end))
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: \"data_offsets\" must be [begin, end] of non-negative integers",
                         what, name);
    if (end < begin) return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: data_offsets end %llu before begin %llu", what, name,
                                      (unsigned long long)end, (unsigned long long)begin);
    if (end > data_len)
        return sp_errorf(SP_ERR_FORMAT,
                         "%s: tensor %s: data ends at byte %llu of the data section, which holds %zu bytes "
                         "(file truncated?)",
                         what, name, (unsigned long long)end, data_len);
    if (end - begin != numel * esz) {
        char dims[160] = "";
        size_t n = 0;
        for (int k = 0; k < nd && n < sizeof dims - 24; k++)
            n += (size_t)snprintf(dims + n, sizeof dims - n, "%s%lld", k ? "x" : "", (long long)t->shape[k]);
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: header says %s %s (%llu bytes), data_offsets span %llu bytes",
                         what, name, nd ? dims : "scalar", dt->valuestring, (unsigned long long)(numel * esz),
                         (unsigned long long)(end - begin));
    }
    t->offset = (size_t)begin;
    t->nbytes = (size_t)(end - begin);
    (void)f;
    return SP_OK;
}

enum sp_status sp_st_parse(const unsigned char *data, size_t size, const char *what, struct sp_st_file **out) {
    *out = NULL;
    if (size < 8) return sp_errorf(SP_ERR_FORMAT, "%s: %zu bytes is too short for a safetensors file", what, size);
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = (hlen << 8) | data[i];
    if (hlen > SP_ST_MAX_HEADER)
        return sp_errorf(SP_ERR_FORMAT, "%s: header length %llu exceeds the %zu-byte limit (not a safetensors file?)",
                         what, (unsigned long long)hlen, SP_ST_MAX_HEADER);
    if (hlen > size - 8)
        return sp_errorf(SP_ERR_FORMAT, "%s: header length %llu runs past the end of the %zu-byte file", what,
                         (unsigned long long)hlen, size);
    if (hlen < 2 || data[8] != '{')
        return sp_errorf(SP_ERR_FORMAT, "%s: header does not start with '{' (not a safetensors file?)", what);

    enum sp_status st;
    struct span *spans = NULL;
    cJSON *root = NULL;
    struct sp_st_file *f = sp_calloc(1, sizeof *f, SP_MEM_MODEL);
    if (!f) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", what);
    f->map.fd = -1;
    sp_strmap_init(&f->by_name, SP_MEM_MODEL);
    f->header_len = (size_t)hlen;

    /* The header may be padded with trailing spaces; the JSON parser accepts those. */
    st = sp_json_parse((const char *)data + 8, (size_t)hlen, what, &root);
    if (st != SP_OK) goto fail;
    if (!cJSON_IsObject(root)) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: header is %s, not an object", what, sp_json_type_name(root));
        goto fail;
    }
    size_t data_start = 8 + (size_t)hlen, data_len = size - data_start;
    int64_t n = 0;
    size_t names_len = 0;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) continue;
        n++;
        names_len += strlen(e->string) + 1;
    }
    f->tensors = sp_calloc((size_t)(n ? n : 1), sizeof *f->tensors, SP_MEM_MODEL);
    f->names = sp_malloc(names_len + 1, SP_MEM_MODEL);
    spans = sp_malloc((size_t)(n ? n : 1) * sizeof *spans, SP_MEM_MODEL);
    if (!f->tensors || !f->names || !spans) {
        st = sp_errorf(SP_ERR_NOMEM, "%s: out of memory for %lld tensors", what, (long long)n);
        goto fail;
    }
    size_t name_off = 0;
    bool seen_meta = false;
    for (const cJSON *e = root->child; e; e = e->next) {
        if (strcmp(e->string, "__metadata__") == 0) {
            if (seen_meta || !cJSON_IsObject(e)) {
                st = sp_errorf(SP_ERR_FORMAT, "%s: \"__metadata__\" must appear once, as an object of strings", what);
                goto fail;
            }
            seen_meta = true;
            for (const cJSON *m = e->child; m; m = m->next) {
                if (!cJSON_IsString(m)) {
                    st = sp_errorf(SP_ERR_FORMAT, "%s: __metadata__.%s is %s, not a string", what, m->string,
                                   sp_json_type_name(m));
                    goto fail;
                }
                if (strcmp(m->string, "format") == 0 && !f->format) {
                    f->format = sp_strdup(m->valuestring, SP_MEM_MODEL);
                    if (!f->format) {
                        st = sp_errorf(SP_ERR_NOMEM, "%s: out of memory", what);
                        goto fail;
                    }
                }
            }
            continue;
        }
        struct sp_st_tensor *t = &f->tensors[f->n_tensors];
        size_t l = strlen(e->string);
        memcpy(f->names + name_off, e->string, l + 1);
        t->name = f->names + name_off;
        name_off += l + 1;
        if (sp_strmap_has(&f->by_name, t->name, l)) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s appears twice in the header", what, t->name);
            goto fail;
        }
        st = parse_entry(f, what, e, t, data_len);
        if (st != SP_OK) goto fail;
        st = sp_strmap_put(&f->by_name, t->name, l, f->n_tensors);
        if (st != SP_OK) goto fail;
        spans[f->n_tensors] = (struct span){t->offset, t->offset + t->nbytes, f->n_tensors};
        t->offset += data_start;
        t->data = t->nbytes ? data + t->offset : NULL;
        f->n_tensors++;
    }

    qsort(spans, (size_t)f->n_tensors, sizeof *spans, cmp_span);
    size_t covered = 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        if (spans[i].begin < covered) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s overlaps tensor %s", what, f->tensors[spans[i].index].name,
                           f->tensors[spans[i - 1].index].name);
            goto fail;
        }
        if (spans[i].begin > covered) {
            st = sp_errorf(SP_ERR_FORMAT, "%s: %zu bytes before tensor %s belong to no tensor", what,
                           spans[i].begin - covered, f->tensors[spans[i].index].name);
            goto fail;
        }
        covered = spans[i].end;
    }
    if (covered != data_len) {
        st = sp_errorf(SP_ERR_FORMAT, "%s: the tensors cover %zu bytes but the data section holds %zu", what, covered,
                       data_len);
        goto fail;
    }
    sp_free(spans);
    cJSON_Delete(root);
    *out = f;
    return SP_OK;
fail:
    sp_free(spans);
    cJSON_Delete(root);
    sp_st_close(f);
    return st;
}

enum sp_status sp_st_open(const char *path, struct sp_st_file **out) {
    struct sp_map m;
    *out = NULL;
    enum sp_status st = sp_map_open(path, &m);
    if (st != SP_OK) return st;
    st = sp_st_parse(m.data, m.size, path, out);
    if (st != SP_OK) {
        sp_map_close(&m);
        return st;
    }
    (*out)->map = m;
    (*out)->path = sp_strdup(path, SP_MEM_MODEL);
    if (!(*out)->path) {
        sp_st_close(*out);
        *out = NULL;
        return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", path);
    }
    return SP_OK;
}

void sp_st_close(struct sp_st_file *f) {
    if (!f) return;
    sp_map_close(&f->map);
    sp_strmap_free(&f->by_name);
    sp_free(f->tensors);
    sp_free(f->names);
    sp_free(f->format);
    sp_free_aligned(f->owned);
    sp_free(f->path);
    sp_free(f);
}

const struct sp_st_tensor *sp_st_find(const struct sp_st_file *f, const char *name) {
    int64_t i;
    if (!sp_strmap_get(&f->by_name, name, strlen(name), &i)) return NULL;
    return &f->tensors[i];
}

int64_t sp_st_numel(const struct sp_st_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->ndim; i++) n *= t->shape[i];
    return n;
}
