/* gguf.c - strict GGUF parsing, typed metadata lookups and split models. */
#include "format/gguf.h"

#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"

static const struct sp_gguf_type_traits type_traits[SP_GGUF_TYPE_COUNT] = {
#define SP_X(e, id, block, bytes) [id] = {#e, block, bytes},
    SP_GGUF_TYPE_LIST(SP_X)
#undef SP_X
};

static const struct {
    const char *name;
    size_t size;
} vtypes[SP_GGUF_VTYPE_COUNT] = {
#define SP_X(e, name, size) {name, size},
    SP_GGUF_VTYPE_LIST(SP_X)
#undef SP_X
};

/* Smallest encodings, to bound counts by the bytes left: a key of one byte
 * with a one-byte value; a one-byte name with one dimension. */
#define MIN_KV_BYTES (8 + 1 + 4 + 1)
#define MIN_TENSOR_BYTES (8 + 1 + 4 + 8 + 4 + 8)

const struct sp_gguf_type_traits *sp_gguf_type_traits(uint32_t id) {
    if (id >= SP_GGUF_TYPE_COUNT || !type_traits[id].name) return NULL;
    return &type_traits[id];
}

const char *sp_gguf_type_name(uint32_t id) {
    const struct sp_gguf_type_traits *t = sp_gguf_type_traits(id);
    return t ? t->name : "?";
}

const char *sp_gguf_vtype_name(uint32_t t) { return t < SP_GGUF_VTYPE_COUNT ? vtypes[t].name : "?"; }

/* ---- reading the image ---- */

/* A cursor over the file image; `what` names the file in messages. */
struct rd {
    const unsigned char *p;
    size_t size, off;
    const char *what;
};

static uint64_t le(const unsigned char *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

static size_t left(const struct rd *r) { return r->size - r->off; }

/* Fails unless n more bytes remain; item says what was being read. */
static enum sp_status need(const struct rd *r, uint64_t n, const char *item) {
    if (n <= left(r)) return SP_OK;
    return sp_errorf(SP_ERR_FORMAT, "%s: %s needs %llu bytes at offset %zu but the file ends at %zu (truncated?)",
                     r->what, item, (unsigned long long)n, r->off, r->size);
}

static enum sp_status rd_uint(struct rd *r, int bytes, const char *item, uint64_t *v) {
    enum sp_status st = need(r, (uint64_t)bytes, item);
    if (st != SP_OK) return st;
    *v = le(r->p + r->off, bytes);
    r->off += (size_t)bytes;
    return SP_OK;
}

static enum sp_status rd_u32(struct rd *r, const char *item, uint32_t *v) {
    uint64_t x = 0;
    enum sp_status st = rd_uint(r, 4, item, &x);
    *v = (uint32_t)x;
    return st;
}

/* A key or tensor name: 1..max bytes, no NUL (they are handed out as C strings). */
static enum sp_status rd_name(struct rd *r, const char *item, size_t max, struct sp_gguf_str *s) {
    uint64_t len;
    enum sp_status st = rd_uint(r, 8, item, &len);
    if (st != SP_OK) return st;
    if (len == 0) return sp_errorf(SP_ERR_FORMAT, "%s: %s is empty", r->what, item);
    if (len > max)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s is %llu bytes long (at most %zu)", r->what, item,
                         (unsigned long long)len, max);
    if ((st = need(r, len, item)) != SP_OK) return st;
    s->data = (const char *)r->p + r->off;
    s->len = (size_t)len;
    if (memchr(s->data, 0, s->len))
        return sp_errorf(SP_ERR_FORMAT, "%s: %s \"%.*s\" holds a NUL byte", r->what, item, (int)s->len, s->data);
    r->off += s->len;
    return SP_OK;
}

/* Room for n elements of size elem in *p (capacity *cap), doubling. */
static bool grow(void **p, int64_t *cap, int64_t n, size_t elem) {
    if (n <= *cap) return true;
    int64_t c = *cap ? *cap * 2 : 16;
    if (c < n) c = n;
    void *q = *p ? sp_realloc(*p, (size_t)c * elem) : sp_malloc((size_t)c * elem, SP_MEM_MODEL);
    if (!q) return false;
    *p = q;
    *cap = c;
    return true;
}

/* ---- parsing ---- */

struct parser {
    struct rd r;
    struct sp_gguf_file *f;
    struct sp_buf names;  // keys, then tensor names, each NUL-terminated, in file order
    int64_t kv_cap, tensor_cap;
};

static enum sp_status nomem(const struct parser *ps) {
    return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", ps->r.what);
}

/* count strings back to back: each a u64 length and its bytes. */
static enum sp_status parse_strings(struct parser *ps, const char *item, uint64_t count, struct sp_gguf_kv *kv) {
    struct rd *r = &ps->r;
    if (count > left(r) / 8)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s holds %llu strings but only %zu bytes are left", r->what, item,
                         (unsigned long long)count, left(r));
    kv->str_offs = sp_malloc((size_t)(count ? count : 1) * sizeof *kv->str_offs, SP_MEM_MODEL);
    if (!kv->str_offs) return nomem(ps);
    size_t start = r->off;
    for (uint64_t j = 0; j < count; j++) {
        kv->str_offs[j] = r->off - start;
        uint64_t len = left(r) >= 8 ? le(r->p + r->off, 8) : UINT64_MAX;
        if (left(r) < 8 || len > left(r) - 8)
            return sp_errorf(SP_ERR_FORMAT, "%s: %s: string %llu runs past the end of the file (truncated?)", r->what,
                             item, (unsigned long long)j);
        r->off += 8 + (size_t)len;
    }
    kv->nbytes = r->off - start;
    return SP_OK;
}

/* count values of type elem (not an array), as a single value or an array's elements. */
static enum sp_status parse_values(struct parser *ps, const char *item, enum sp_gguf_vtype elem, uint64_t count,
                                   struct sp_gguf_kv *kv) {
    struct rd *r = &ps->r;
    kv->data = r->p + r->off;
    kv->count = (int64_t)count;
    if (elem == SP_GGUF_VTYPE_STRING) return parse_strings(ps, item, count, kv);
    size_t sz = vtypes[elem].size;
    if (count > left(r) / sz)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s holds %llu %s values but only %zu bytes are left (truncated?)",
                         r->what, item, (unsigned long long)count, vtypes[elem].name, left(r));
    kv->nbytes = (size_t)count * sz;
    for (size_t j = 0; elem == SP_GGUF_VTYPE_BOOL && j < kv->nbytes; j++)
        if (kv->data[j] > 1)
            return sp_errorf(SP_ERR_FORMAT, "%s: %s: bool %zu is %u, not 0 or 1", r->what, item, j, kv->data[j]);
    r->off += kv->nbytes;
    return SP_OK;
}

static enum sp_status check_vtype(const struct rd *r, const char *item, uint32_t t) {
    if (t < SP_GGUF_VTYPE_COUNT) return SP_OK;
    return sp_errorf(SP_ERR_FORMAT, "%s: %s has unknown value type %u", r->what, item, t);
}

static enum sp_status parse_value(struct parser *ps, const char *item, struct sp_gguf_kv *kv) {
    struct rd *r = &ps->r;
    uint32_t t, elem;
    uint64_t count;
    enum sp_status st = rd_u32(r, item, &t);
    if (st == SP_OK) st = check_vtype(r, item, t);
    if (st != SP_OK) return st;
    kv->type = kv->elem = (enum sp_gguf_vtype)t;
    if (t != SP_GGUF_VTYPE_ARRAY) return parse_values(ps, item, kv->type, 1, kv);
    if ((st = rd_u32(r, item, &elem)) != SP_OK || (st = check_vtype(r, item, elem)) != SP_OK) return st;
    /* llama.cpp reads no arrays of arrays, and no model key uses them. */
    if (elem == SP_GGUF_VTYPE_ARRAY)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: %s is an array of arrays (not supported)", r->what, item);
    if ((st = rd_uint(r, 8, item, &count)) != SP_OK) return st;
    kv->elem = (enum sp_gguf_vtype)elem;
    return parse_values(ps, item, kv->elem, count, kv);
}

static enum sp_status parse_kv(struct parser *ps, int64_t i) {
    struct sp_gguf_file *f = ps->f;
    char item[256];
    snprintf(item, sizeof item, "key %lld", (long long)i);
    struct sp_gguf_str k;
    enum sp_status st = rd_name(&ps->r, item, SP_GGUF_MAX_KEY, &k);
    if (st != SP_OK) return st;
    snprintf(item, sizeof item, "key %.*s", k.len > 200 ? 200 : (int)k.len, k.data);
    if (sp_strmap_has(&f->kv_by_key, k.data, k.len))
        return sp_errorf(SP_ERR_FORMAT, "%s: %s appears twice", ps->r.what, item);
    if (!grow((void **)&f->kvs, &ps->kv_cap, i + 1, sizeof *f->kvs)) return nomem(ps);
    struct sp_gguf_kv *kv = &f->kvs[i];
    memset(kv, 0, sizeof *kv);
    f->n_kvs = i + 1;  // so that close frees kv->str_offs
    if (sp_buf_append(&ps->names, k.data, k.len) != SP_OK || sp_buf_putc(&ps->names, 0) != SP_OK ||
        sp_strmap_put(&f->kv_by_key, k.data, k.len, i) != SP_OK)
        return nomem(ps);
    return parse_value(ps, item, kv);
}

/* general.alignment: a uint32 power of two where present. */
static enum sp_status read_alignment(struct parser *ps) {
    const struct sp_gguf_kv *kv = sp_gguf_find_kv(ps->f, "general.alignment");
    ps->f->alignment = SP_GGUF_DEFAULT_ALIGN;
    if (!kv) return SP_OK;
    if (kv->type != SP_GGUF_VTYPE_UINT32)
        return sp_errorf(SP_ERR_FORMAT, "%s: key general.alignment is %s%s, must be uint32", ps->r.what,
                         kv->type == SP_GGUF_VTYPE_ARRAY ? "an array of " : "", vtypes[kv->elem].name);
    uint64_t a = le(kv->data, 4);
    if (a == 0 || (a & (a - 1)))
        return sp_errorf(SP_ERR_FORMAT, "%s: key general.alignment is %llu, not a power of two", ps->r.what,
                         (unsigned long long)a);
    ps->f->alignment = (size_t)a;
    return SP_OK;
}

static enum sp_status parse_dims(struct rd *r, const char *item, struct sp_gguf_tensor *t) {
    uint32_t nd;
    enum sp_status st = rd_u32(r, item, &nd);
    if (st != SP_OK) return st;
    if (nd < 1 || nd > SP_GGUF_MAX_DIMS)
        return sp_errorf(SP_ERR_FORMAT, "%s: %s has %u dimensions (1 to %d allowed)", r->what, item, nd,
                         SP_GGUF_MAX_DIMS);
    t->n_dims = (int)nd;
    for (int d = 0; d < SP_GGUF_MAX_DIMS; d++) t->dims[d] = 1;
    for (int d = 0; d < t->n_dims; d++) {
        uint64_t v;
        if ((st = rd_uint(r, 8, item, &v)) != SP_OK) return st;
        if (v < 1 || v > INT64_MAX)
            return sp_errorf(SP_ERR_FORMAT, "%s: %s: dims[%d] is %llu (must be 1 to 2^63-1)", r->what, item, d,
                             (unsigned long long)v);
        t->dims[d] = (int64_t)v;
    }
    return SP_OK;
}

/* A tensor info: name, dims, type, offset (relative to the data section, kept in t->offset until placed). */
static enum sp_status parse_tensor_info(struct parser *ps, int64_t i) {
    struct sp_gguf_file *f = ps->f;
    struct rd *r = &ps->r;
    char item[128];
    snprintf(item, sizeof item, "tensor %lld", (long long)i);
    struct sp_gguf_str n;
    enum sp_status st = rd_name(r, item, SP_GGUF_MAX_NAME, &n);
    if (st != SP_OK) return st;
    snprintf(item, sizeof item, "tensor %.*s", (int)n.len, n.data);
    if (sp_strmap_has(&f->tensor_by_name, n.data, n.len))
        return sp_errorf(SP_ERR_FORMAT, "%s: %s appears twice", r->what, item);
    if (!grow((void **)&f->tensors, &ps->tensor_cap, i + 1, sizeof *f->tensors)) return nomem(ps);
    struct sp_gguf_tensor *t = &f->tensors[i];
    memset(t, 0, sizeof *t);
    if (sp_buf_append(&ps->names, n.data, n.len) != SP_OK || sp_buf_putc(&ps->names, 0) != SP_OK ||
        sp_strmap_put(&f->tensor_by_name, n.data, n.len, i) != SP_OK)
        return nomem(ps);
    f->n_tensors = i + 1;
    uint32_t type;
    uint64_t off;
    if ((st = parse_dims(r, item, t)) != SP_OK || (st = rd_u32(r, item, &type)) != SP_OK) return st;
    if (!sp_gguf_type_traits(type))
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: %s has unknown ggml type %u", r->what, item, type);
    t->type = (enum sp_gguf_type)type;
    if ((st = rd_uint(r, 8, item, &off)) != SP_OK) return st;
    t->offset = (size_t)off;
    return SP_OK;
}

/* Checks t's size and (relative) offset against the data section and makes the offset absolute. */
static enum sp_status place_tensor(const struct parser *ps, struct sp_gguf_tensor *t) {
    const struct sp_gguf_file *f = ps->f;
    const char *what = ps->r.what;
    const struct sp_gguf_type_traits *tr = sp_gguf_type_traits(t->type);
    if (t->dims[0] % tr->block)
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: dims[0] is %lld, not a multiple of %s's block of %d", what,
                         t->name, (long long)t->dims[0], tr->name, tr->block);
    int64_t numel = 1;
    uint64_t nbytes;
    bool overflow = __builtin_mul_overflow((uint64_t)(t->dims[0] / tr->block), (uint64_t)tr->block_bytes, &nbytes);
    for (int d = 0; d < SP_GGUF_MAX_DIMS; d++) {
        overflow |= __builtin_mul_overflow(numel, t->dims[d], &numel);
        if (d > 0) overflow |= __builtin_mul_overflow(nbytes, (uint64_t)t->dims[d], &nbytes);
    }
    if (overflow || nbytes > SIZE_MAX)
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: %lldx%lldx%lldx%lld %s is too large", what, t->name,
                         (long long)t->dims[0], (long long)t->dims[1], (long long)t->dims[2], (long long)t->dims[3],
                         tr->name);
    size_t off = t->offset;
    if (off % f->alignment)
        return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s: offset %zu is not a multiple of the alignment %zu", what,
                         t->name, off, f->alignment);
    if (off > f->data_size || nbytes > f->data_size - off)
        return sp_errorf(SP_ERR_FORMAT,
                         "%s: tensor %s: data [%zu, %llu) runs past the data section's %zu bytes (truncated?)", what,
                         t->name, off, (unsigned long long)off + nbytes, f->data_size);
    t->nbytes = (size_t)nbytes;
    t->offset = f->data_offset + off;
    t->data = ps->r.p + t->offset;
    return SP_OK;
}

/* Sorting tensors by offset to check overlaps. */
static int cmp_offset(const void *a, const void *b) {
    const struct sp_gguf_tensor *x = *(const struct sp_gguf_tensor *const *)a;
    const struct sp_gguf_tensor *y = *(const struct sp_gguf_tensor *const *)b;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return 0;
}

static enum sp_status check_overlaps(const struct parser *ps) {
    const struct sp_gguf_file *f = ps->f;
    if (f->n_tensors < 2) return SP_OK;
    const struct sp_gguf_tensor **by_off = sp_malloc((size_t)f->n_tensors * sizeof *by_off, SP_MEM_MODEL);
    if (!by_off) return nomem(ps);
    for (int64_t i = 0; i < f->n_tensors; i++) by_off[i] = &f->tensors[i];
    qsort(by_off, (size_t)f->n_tensors, sizeof *by_off, cmp_offset);
    enum sp_status st = SP_OK;
    for (int64_t i = 1; i < f->n_tensors && st == SP_OK; i++)
        if (by_off[i]->offset < by_off[i - 1]->offset + by_off[i - 1]->nbytes)
            st = sp_errorf(SP_ERR_FORMAT, "%s: tensor %s overlaps tensor %s", ps->r.what, by_off[i]->name,
                           by_off[i - 1]->name);
    sp_free(by_off);
    return st;
}

static enum sp_status parse_header(struct parser *ps, uint64_t *n_tensors, uint64_t *n_kvs) {
    struct rd *r = &ps->r;
    if (r->size < 4 || memcmp(r->p, "GGUF", 4) != 0)
        return sp_errorf(SP_ERR_FORMAT, "%s: not a GGUF file (it does not start with \"GGUF\")", r->what);
    r->off = 4;
    uint32_t v;
    enum sp_status st = rd_u32(r, "the version", &v);
    if (st != SP_OK) return st;
    if (v == 1)
        return sp_errorf(SP_ERR_UNSUPPORTED,
                         "%s: GGUF version 1 is not supported (its counts are 32-bit; convert the model again)",
                         r->what);
    if (v == 0x02000000 || v == 0x03000000)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: a big-endian GGUF file (not supported)", r->what);
    if (v != 2 && v != 3)
        return sp_errorf(SP_ERR_UNSUPPORTED, "%s: GGUF version %u is not supported (2 and 3 are)", r->what, v);
    ps->f->version = v;
    if ((st = rd_uint(r, 8, "the tensor count", n_tensors)) != SP_OK ||
        (st = rd_uint(r, 8, "the metadata count", n_kvs)) != SP_OK)
        return st;
    if (*n_kvs > left(r) / MIN_KV_BYTES || *n_tensors > (left(r) - *n_kvs * MIN_KV_BYTES) / MIN_TENSOR_BYTES)
        return sp_errorf(SP_ERR_FORMAT, "%s: %llu metadata entries and %llu tensors cannot fit in the %zu bytes left",
                         r->what, (unsigned long long)*n_kvs, (unsigned long long)*n_tensors, left(r));
    return SP_OK;
}

/* Points keys and tensor names into the arena, in the order they were appended. */
static void fix_names(struct sp_gguf_file *f) {
    char *p = f->names;
    for (int64_t i = 0; i < f->n_kvs; i++, p += strlen(p) + 1) f->kvs[i].key = p;
    for (int64_t i = 0; i < f->n_tensors; i++, p += strlen(p) + 1) f->tensors[i].name = p;
}

static enum sp_status parse_all(struct parser *ps) {
    struct sp_gguf_file *f = ps->f;
    uint64_t n_tensors = 0, n_kvs = 0;
    enum sp_status st = parse_header(ps, &n_tensors, &n_kvs);
    for (uint64_t i = 0; st == SP_OK && i < n_kvs; i++) st = parse_kv(ps, (int64_t)i);
    if (st == SP_OK) st = read_alignment(ps);
    for (uint64_t i = 0; st == SP_OK && i < n_tensors; i++) st = parse_tensor_info(ps, (int64_t)i);
    if (st != SP_OK) return st;
    if (!(f->names = sp_buf_take(&ps->names))) return nomem(ps);
    fix_names(f);
    size_t pad = (f->alignment - ps->r.off % f->alignment) % f->alignment;
    f->data_offset = ps->r.off + pad;
    f->data_size = pad <= left(&ps->r) ? left(&ps->r) - pad : 0;
    for (int64_t i = 0; st == SP_OK && i < f->n_tensors; i++) st = place_tensor(ps, &f->tensors[i]);
    return st == SP_OK ? check_overlaps(ps) : st;
}

enum sp_status sp_gguf_parse(const unsigned char *data, size_t size, const char *what, struct sp_gguf_file **out) {
    *out = NULL;
    struct sp_gguf_file *f = sp_calloc(1, sizeof *f, SP_MEM_MODEL);
    if (!f) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", what);
    f->map.fd = -1;
    sp_strmap_init(&f->kv_by_key, SP_MEM_MODEL);
    sp_strmap_init(&f->tensor_by_name, SP_MEM_MODEL);
    struct parser ps = {.r = {data, size, 0, what}, .f = f, .names = SP_BUF_INIT};
    enum sp_status st = parse_all(&ps);
    if (st == SP_OK && !(f->path = sp_strdup(what, SP_MEM_MODEL))) st = nomem(&ps);
    sp_buf_free(&ps.names);
    if (st != SP_OK) {
        sp_gguf_close(f);
        return st;
    }
    *out = f;
    return SP_OK;
}

enum sp_status sp_gguf_open(const char *path, struct sp_gguf_file **out) {
    struct sp_map m;
    *out = NULL;
    enum sp_status st = sp_map_open(path, &m);
    if (st != SP_OK) return st;
    st = sp_gguf_parse(m.data, m.size, path, out);
    if (st != SP_OK) {
        sp_map_close(&m);
        return st;
    }
    (*out)->map = m;
    return SP_OK;
}

void sp_gguf_close(struct sp_gguf_file *f) {
    if (!f) return;
    sp_map_close(&f->map);
    for (int64_t i = 0; i < f->n_kvs; i++) sp_free(f->kvs[i].str_offs);
    sp_free(f->kvs);
    sp_free(f->tensors);
    sp_strmap_free(&f->kv_by_key);
    sp_strmap_free(&f->tensor_by_name);
    sp_free(f->names);
    sp_free(f->path);
    sp_free(f);
}

/* ---- lookups ---- */

const struct sp_gguf_tensor *sp_gguf_find(const struct sp_gguf_file *f, const char *name) {
    int64_t i;
    if (!sp_strmap_get(&f->tensor_by_name, name, strlen(name), &i)) return NULL;
    return &f->tensors[i];
}

int64_t sp_gguf_numel(const struct sp_gguf_tensor *t) {
    int64_t n = 1;
    for (int i = 0; i < t->n_dims; i++) n *= t->dims[i];
    return n;
}

const struct sp_gguf_kv *sp_gguf_find_kv(const struct sp_gguf_file *f, const char *key) {
    int64_t i;
    if (!sp_strmap_get(&f->kv_by_key, key, strlen(key), &i)) return NULL;
    return &f->kvs[i];
}

static bool is_int(enum sp_gguf_vtype t) {
    return t <= SP_GGUF_VTYPE_INT32 || t == SP_GGUF_VTYPE_UINT64 || t == SP_GGUF_VTYPE_INT64;
}

static bool is_float(enum sp_gguf_vtype t) { return t == SP_GGUF_VTYPE_FLOAT32 || t == SP_GGUF_VTYPE_FLOAT64; }

/* Whether a value of type have serves a request for kind want (see sp_gguf_get_arr). */
static bool kind_matches(enum sp_gguf_vtype have, enum sp_gguf_vtype want) {
    if (is_int(want)) return is_int(have);
    if (is_float(want)) return is_float(have);
    return have == want;
}

/* "an integer", "floats", ...: what a getter of kind want expects. */
static const char *kind_name(enum sp_gguf_vtype want, bool array) {
    if (is_int(want)) return array ? "integers" : "an integer";
    if (is_float(want)) return array ? "floats" : "a float";
    if (want == SP_GGUF_VTYPE_STRING) return array ? "strings" : "a string";
    return array ? "bools" : "a bool";
}

/* The entry called key: an array (or a single value) of kind want. */
static enum sp_status lookup(const struct sp_gguf_file *f, const char *key, enum sp_gguf_vtype want, bool array,
                             const struct sp_gguf_kv **out) {
    const struct sp_gguf_kv *kv = sp_gguf_find_kv(f, key);
    *out = kv;
    if (!kv) return sp_errorf(SP_ERR_NOT_FOUND, "%s: metadata key %s missing", f->path, key);
    bool is_array = kv->type == SP_GGUF_VTYPE_ARRAY;
    if (is_array == array && kind_matches(kv->elem, want)) return SP_OK;
    return sp_errorf(SP_ERR_FORMAT, "%s: key %s is %s%s, expected %s%s", f->path, key, is_array ? "an array of " : "",
                     vtypes[kv->elem].name, array ? "an array of " : "", kind_name(want, array));
}

enum sp_status sp_gguf_get_str(const struct sp_gguf_file *f, const char *key, struct sp_gguf_str *out) {
    const struct sp_gguf_kv *kv;
    enum sp_status st = lookup(f, key, SP_GGUF_VTYPE_STRING, false, &kv);
    if (st == SP_OK) *out = sp_gguf_arr_str(kv, 0);
    return st;
}

enum sp_status sp_gguf_get_int(const struct sp_gguf_file *f, const char *key, int64_t min, int64_t max, int64_t *out) {
    const struct sp_gguf_kv *kv;
    enum sp_status st = lookup(f, key, SP_GGUF_VTYPE_INT64, false, &kv);
    if (st != SP_OK) return st;
    int64_t v;
    if (!sp_gguf_arr_int(kv, 0, &v))
        return sp_errorf(SP_ERR_FORMAT, "%s: key %s is %llu, out of range [%lld, %lld]", f->path, key,
                         (unsigned long long)le(kv->data, 8), (long long)min, (long long)max);
    if (v < min || v > max)
        return sp_errorf(SP_ERR_FORMAT, "%s: key %s is %lld, out of range [%lld, %lld]", f->path, key, (long long)v,
                         (long long)min, (long long)max);
    *out = v;
    return SP_OK;
}

enum sp_status sp_gguf_get_float(const struct sp_gguf_file *f, const char *key, double *out) {
    const struct sp_gguf_kv *kv;
    enum sp_status st = lookup(f, key, SP_GGUF_VTYPE_FLOAT64, false, &kv);
    if (st == SP_OK) *out = sp_gguf_arr_float(kv, 0);
    return st;
}

enum sp_status sp_gguf_get_bool(const struct sp_gguf_file *f, const char *key, bool *out) {
    const struct sp_gguf_kv *kv;
    enum sp_status st = lookup(f, key, SP_GGUF_VTYPE_BOOL, false, &kv);
    if (st == SP_OK) *out = sp_gguf_arr_bool(kv, 0);
    return st;
}

enum sp_status sp_gguf_get_arr(const struct sp_gguf_file *f, const char *key, enum sp_gguf_vtype elem,
                               const struct sp_gguf_kv **out) {
    SP_ASSERT(elem < SP_GGUF_VTYPE_COUNT && elem != SP_GGUF_VTYPE_ARRAY);
    const struct sp_gguf_kv *kv;
    enum sp_status st = lookup(f, key, elem, true, &kv);
    *out = st == SP_OK ? kv : NULL;
    return st;
}

/* Element i of kv, checked against its count and kind. */
static const unsigned char *elem_at(const struct sp_gguf_kv *kv, int64_t i, enum sp_gguf_vtype want) {
    SP_ASSERT(i >= 0 && i < kv->count && kind_matches(kv->elem, want));
    if (kv->elem == SP_GGUF_VTYPE_STRING) return kv->data + kv->str_offs[i];
    return kv->data + (size_t)i * vtypes[kv->elem].size;
}

struct sp_gguf_str sp_gguf_arr_str(const struct sp_gguf_kv *kv, int64_t i) {
    const unsigned char *p = elem_at(kv, i, SP_GGUF_VTYPE_STRING);
    return (struct sp_gguf_str){(const char *)p + 8, (size_t)le(p, 8)};
}

double sp_gguf_arr_float(const struct sp_gguf_kv *kv, int64_t i) {
    const unsigned char *p = elem_at(kv, i, SP_GGUF_VTYPE_FLOAT64);
    if (kv->elem == SP_GGUF_VTYPE_FLOAT64) {
        uint64_t b = le(p, 8);
        double d;
        memcpy(&d, &b, sizeof d);
        return d;
    }
    uint32_t b = (uint32_t)le(p, 4);
    float x;
    memcpy(&x, &b, sizeof x);
    return x;
}

bool sp_gguf_arr_bool(const struct sp_gguf_kv *kv, int64_t i) { return *elem_at(kv, i, SP_GGUF_VTYPE_BOOL) != 0; }

bool sp_gguf_arr_int(const struct sp_gguf_kv *kv, int64_t i, int64_t *out) {
    const unsigned char *p = elem_at(kv, i, SP_GGUF_VTYPE_INT64);
    int bytes = (int)vtypes[kv->elem].size;
    uint64_t u = le(p, bytes);
    bool is_signed = kv->elem == SP_GGUF_VTYPE_INT8 || kv->elem == SP_GGUF_VTYPE_INT16 ||
                     kv->elem == SP_GGUF_VTYPE_INT32 || kv->elem == SP_GGUF_VTYPE_INT64;
    if (is_signed && bytes < 8 && (u >> (8 * bytes - 1)) & 1) u |= UINT64_MAX << (8 * bytes);  // sign-extend
    if (!is_signed && u > INT64_MAX) return false;
    *out = (int64_t)u;
    return true;
}

/* ---- split models ---- */

#define SPLIT_SUFFIX_LEN 20  // strlen("-00001-of-00003.gguf")

static bool digits5(const char *s, int *v) {
    *v = 0;
    for (int i = 0; i < 5; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        *v = *v * 10 + (s[i] - '0');
    }
    return true;
}

/* The 1-based shard number and the count of a name ending in -NNNNN-of-MMMMM.gguf (llama.cpp's %05d). */
static bool split_name(const char *path, int *no, int *count) {
    size_t n = strlen(path);
    if (n < SPLIT_SUFFIX_LEN) return false;
    const char *s = path + n - SPLIT_SUFFIX_LEN;
    return s[0] == '-' && digits5(s + 1, no) && memcmp(s + 6, "-of-", 4) == 0 && digits5(s + 10, count) &&
           strcmp(s + 15, ".gguf") == 0 && *no >= 1 && *no <= *count;
}

/* The path of shard i (0-based) of count beside first. Owned by the caller. */
static char *shard_path(const char *first, int i, int count) {
    size_t prefix = strlen(first) - SPLIT_SUFFIX_LEN;
    char *p = sp_malloc(prefix + SPLIT_SUFFIX_LEN + 1, SP_MEM_MODEL);
    if (p) snprintf(p, prefix + SPLIT_SUFFIX_LEN + 1, "%.*s-%05d-of-%05d.gguf", (int)prefix, first, i + 1, count);
    return p;
}

/* split.count and split.no of shard i (0-based) of count; optional in a file that is not split. */
static enum sp_status check_shard(const struct sp_gguf_file *f, int i, int count, bool named) {
    int64_t v;
    if (!named && !sp_gguf_find_kv(f, "split.count")) return SP_OK;
    enum sp_status st = sp_gguf_get_int(f, "split.count", 1, 65535, &v);
    if (st != SP_OK) return st;
    if (v != count)
        return sp_errorf(SP_ERR_FORMAT, "%s: split.count is %lld but the file name %s", f->path, (long long)v,
                         named ? "says otherwise" : "has no -00001-of-NNNNN.gguf");
    if ((st = sp_gguf_get_int(f, "split.no", 0, 65535, &v)) != SP_OK) return st;
    if (v != i)
        return sp_errorf(SP_ERR_FORMAT, "%s: split.no is %lld but the file name says shard %d (split.no %d)", f->path,
                         (long long)v, i + 1, i);
    return SP_OK;
}

static enum sp_status open_shard(struct sp_gguf_split *s, const char *first, int i, int count, bool named) {
    char *p = i ? shard_path(first, i, count) : NULL;
    if (i && !p) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", first);
    enum sp_status st = sp_gguf_open(p ? p : first, &s->shards[i]);
    sp_free(p);
    if (st != SP_OK) {
        if (count > 1) sp_error_prefix("shard %d of %d: ", i + 1, count);
        return st;
    }
    s->n_shards = i + 1;
    return check_shard(s->shards[i], i, count, named);
}

/* Indexes every shard's tensors by name, refusing a name held twice. */
static enum sp_status index_tensors(struct sp_gguf_split *s) {
    int64_t n = 0;
    for (int i = 0; i < s->n_shards; i++) n += s->shards[i]->n_tensors;
    s->tensors = sp_malloc((size_t)(n ? n : 1) * sizeof *s->tensors, SP_MEM_MODEL);
    s->shard_of = sp_malloc((size_t)(n ? n : 1) * sizeof *s->shard_of, SP_MEM_MODEL);
    if (!s->tensors || !s->shard_of) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", s->shards[0]->path);
    for (int i = 0; i < s->n_shards; i++) {
        for (int64_t j = 0; j < s->shards[i]->n_tensors; j++) {
            const struct sp_gguf_tensor *t = &s->shards[i]->tensors[j];
            int64_t k;
            if (sp_strmap_get(&s->by_name, t->name, strlen(t->name), &k))
                return sp_errorf(SP_ERR_FORMAT, "%s: tensor %s is also in %s", s->shards[i]->path, t->name,
                                 s->shards[s->shard_of[k]]->path);
            if (sp_strmap_put(&s->by_name, t->name, strlen(t->name), s->n_tensors) != SP_OK)
                return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", s->shards[i]->path);
            s->tensors[s->n_tensors] = t;
            s->shard_of[s->n_tensors++] = i;
        }
    }
    return SP_OK;
}

static enum sp_status check_tensor_count(const struct sp_gguf_split *s) {
    const struct sp_gguf_file *f = s->shards[0];
    int64_t v;
    if (!sp_gguf_find_kv(f, "split.tensors.count")) return SP_OK;
    enum sp_status st = sp_gguf_get_int(f, "split.tensors.count", 0, INT64_MAX, &v);
    if (st == SP_OK && v != s->n_tensors)
        st = sp_errorf(SP_ERR_FORMAT, "%s: split.tensors.count is %lld but the %d shards hold %lld tensors", f->path,
                       (long long)v, s->n_shards, (long long)s->n_tensors);
    return st;
}

enum sp_status sp_gguf_split_open(const char *path, struct sp_gguf_split **out) {
    *out = NULL;
    int no = 1, count = 1;
    bool named = split_name(path, &no, &count);
    if (named && no != 1)
        return sp_errorf(SP_ERR_ARG, "%s is shard %d of %d: open the first, %.*s-00001-of-%05d.gguf", path, no, count,
                         (int)(strlen(path) - SPLIT_SUFFIX_LEN), path, count);
    struct sp_gguf_split *s = sp_calloc(1, sizeof *s, SP_MEM_MODEL);
    if (s) s->shards = sp_calloc((size_t)count, sizeof *s->shards, SP_MEM_MODEL);
    if (!s || !s->shards) {
        sp_free(s);
        return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", path);
    }
    sp_strmap_init(&s->by_name, SP_MEM_MODEL);
    enum sp_status st = SP_OK;
    for (int i = 0; i < count && st == SP_OK; i++) st = open_shard(s, path, i, count, named);
    if (st == SP_OK) st = index_tensors(s);
    if (st == SP_OK) st = check_tensor_count(s);
    if (st != SP_OK) {
        sp_gguf_split_close(s);
        return st;
    }
    *out = s;
    return SP_OK;
}

void sp_gguf_split_close(struct sp_gguf_split *s) {
    if (!s) return;
    for (int i = 0; i < s->n_shards; i++) sp_gguf_close(s->shards[i]);
    sp_free(s->shards);
    sp_free(s->tensors);
    sp_free(s->shard_of);
    sp_strmap_free(&s->by_name);
    sp_free(s);
}

const struct sp_gguf_tensor *sp_gguf_split_find(const struct sp_gguf_split *s, const char *name, int *shard) {
    int64_t i;
    if (!sp_strmap_get(&s->by_name, name, strlen(name), &i)) return NULL;
    if (shard) *shard = s->shard_of[i];
    return s->tensors[i];
}
