/*
 * jinja_value.c - Jinja values: arena, construction from cJSON, comparison,
 * and the Python-compatible str() / repr() / json.dumps() text forms.
 */
#include "template/jinja_value.h"

#include <math.h>
#include <stdalign.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/strmap.h"

/* ---- arena ---------------------------------------------------------------- */

struct sp_jarena_chunk {
    struct sp_jarena_chunk *next;
    size_t cap, used;
    alignas(max_align_t) unsigned char data[];
};

#define SP_JARENA_CHUNK (64 * 1024)

void sp_jarena_init(struct sp_jarena *a, size_t limit) {
    a->head = NULL;
    a->used = 0;
    a->limit = limit;
}

void sp_jarena_free(struct sp_jarena *a) {
    if (!a) return;
    struct sp_jarena_chunk *c = a->head;
    while (c) {
        struct sp_jarena_chunk *next = c->next;
        sp_free(c);
        c = next;
    }
    a->head = NULL;
    a->used = 0;
}

void *sp_jarena_alloc(struct sp_jarena *a, size_t n) {
    const size_t align = alignof(max_align_t);
    if (n > ((size_t)1 << 40)) {
        sp_errorf(SP_ERR_LIMIT, "template needs more than %zu bytes of memory", a->limit);
        return NULL;
    }
    n = (n + align - 1) & ~(align - 1);
    if (n == 0) n = align;
    if (a->limit && a->used + n > a->limit) {
        sp_errorf(SP_ERR_LIMIT, "template needs more than %zu bytes of memory", a->limit);
        return NULL;
    }
    struct sp_jarena_chunk *c = a->head;
    if (!c || c->cap - c->used < n) {
        size_t cap = n > SP_JARENA_CHUNK ? n : SP_JARENA_CHUNK;
        c = sp_malloc(sizeof *c + cap, SP_MEM_TOKENIZER);
        if (!c) {
            sp_errorf(SP_ERR_NOMEM, "out of memory rendering a template");
            return NULL;
        }
        c->cap = cap;
        c->used = 0;
        // A big one-off block goes behind the current chunk so the space left
        // in the current chunk stays usable.
        if (a->head && cap == n && a->head->cap - a->head->used > 1024) {
            c->next = a->head->next;
            a->head->next = c;
        } else {
            c->next = a->head;
            a->head = c;
        }
    }
    void *p = c->data + c->used;
    c->used += n;
    a->used += n;
    memset(p, 0, n);
    return p;
}

char *sp_jarena_strdup(struct sp_jarena *a, const char *s, size_t n) {
    char *p = sp_jarena_alloc(a, n + 1);
    if (!p) return NULL;
    if (n) memcpy(p, s, n);
    p[n] = 0;
    return p;
}

/* ---- construction --------------------------------------------------------- */

struct sp_jv sp_jv_cstr(const char *p) {
    return sp_jv_strn(p, strlen(p));
}

enum sp_status sp_jv_new_list(struct sp_jarena *a, int64_t n, struct sp_jv *out) {
    if (n < 0 || (uint64_t)n > SIZE_MAX / sizeof(struct sp_jv) / 2)
        return sp_errorf(SP_ERR_LIMIT, "list of %lld items is too long", (long long)n);
    struct sp_jlist *l = sp_jarena_alloc(a, sizeof *l);
    struct sp_jv *v = l ? sp_jarena_alloc(a, (size_t)n * sizeof *v) : NULL;
    if (!v) return SP_ERR_LIMIT;
    // sp_jarena_alloc zeroes memory, and zero is SP_JV_UNDEFINED.
    l->v = v;
    l->n = n;
    *out = (struct sp_jv){.t = SP_JV_LIST, .list = l};
    return SP_OK;
}

enum sp_status sp_jv_new_dict(struct sp_jarena *a, enum sp_jv_type t, struct sp_jv *out) {
    SP_ASSERT(t == SP_JV_DICT || t == SP_JV_NAMESPACE);
    struct sp_jdict *d = sp_jarena_alloc(a, sizeof *d);
    if (!d) return SP_ERR_LIMIT;
    *out = (struct sp_jv){.t = t, .dict = d};
    return SP_OK;
}

/* Dicts up to this size are scanned; larger ones get a hash index, so
 * that a request with a huge tool schema cannot make lookups quadratic. */
#define DICT_INDEX_FROM 16

struct sp_jv *sp_jdict_get(const struct sp_jdict *d, struct sp_jv key) {
    if (key.t == SP_JV_STR) return sp_jdict_get_str(d, key.s.p, key.s.n);
    for (int64_t i = 0; i < d->n; i++)
        if (sp_jv_equal(d->e[i].key, key)) return &d->e[i].val;
    return NULL;
}

static bool key_is(const struct sp_jv *k, const char *key, size_t n) {
    return k->t == SP_JV_STR && k->s.n == n && (n == 0 || memcmp(k->s.p, key, n) == 0);
}

struct sp_jv *sp_jdict_get_str(const struct sp_jdict *d, const char *key, size_t n) {
    if (d->slots) {
        uint64_t mask = (uint64_t)d->nslots - 1;
        for (uint64_t h = sp_hash_bytes(key, n) & mask;; h = (h + 1) & mask) {
            int64_t s = d->slots[h];
            if (!s) return NULL;
            if (key_is(&d->e[s - 1].key, key, n)) return &d->e[s - 1].val;
        }
    }
    for (int64_t i = 0; i < d->n; i++)
        if (key_is(&d->e[i].key, key, n)) return &d->e[i].val;
    return NULL;
}

static void index_entry(struct sp_jdict *d, int64_t i) {
    const struct sp_jv *k = &d->e[i].key;
    if (k->t != SP_JV_STR) return;
    uint64_t mask = (uint64_t)d->nslots - 1;
    uint64_t h = sp_hash_bytes(k->s.p, k->s.n) & mask;
    while (d->slots[h]) h = (h + 1) & mask;
    d->slots[h] = i + 1;
}

/* (Re)builds the hash index at a quarter load. */
static enum sp_status reindex(struct sp_jarena *a, struct sp_jdict *d) {
    int64_t nslots = 64;
    while (nslots < 4 * d->n) nslots *= 2;
    int64_t *slots = sp_jarena_alloc(a, (size_t)nslots * sizeof *slots);
    if (!slots) return SP_ERR_LIMIT;
    d->slots = slots;
    d->nslots = nslots;
    for (int64_t i = 0; i < d->n; i++) index_entry(d, i);
    return SP_OK;
}

enum sp_status sp_jdict_set(struct sp_jarena *a, struct sp_jdict *d, struct sp_jv key, struct sp_jv val) {
    struct sp_jv *slot = sp_jdict_get(d, key);
    if (slot) {
        *slot = val;
        return SP_OK;
    }
    if (d->n == d->cap) {
        int64_t cap = d->cap ? d->cap * 2 : 8;
        struct sp_jdict_entry *e = sp_jarena_alloc(a, (size_t)cap * sizeof *e);
        if (!e) return SP_ERR_LIMIT;
        if (d->n) memcpy(e, d->e, (size_t)d->n * sizeof *e);
        d->e = e;
        d->cap = cap;
    }
    d->e[d->n++] = (struct sp_jdict_entry){key, val};
    if (d->slots && 2 * d->n <= d->nslots) {
        index_entry(d, d->n - 1);
        return SP_OK;
    }
    return d->n > DICT_INDEX_FROM ? reindex(a, d) : SP_OK;
}

enum sp_status sp_jv_from_cjson(struct sp_jarena *a, const cJSON *j, struct sp_jv *out) {
    enum sp_status st;
    if (!j || cJSON_IsNull(j) || cJSON_IsInvalid(j)) {
        *out = sp_jv_none();
    } else if (cJSON_IsBool(j)) {
        *out = sp_jv_bool(cJSON_IsTrue(j));
    } else if (cJSON_IsNumber(j)) {
        double d = j->valuedouble;
        if (d == floor(d) && fabs(d) <= 9007199254740992.0)
            *out = sp_jv_int((int64_t)d);
        else
            *out = sp_jv_float(d);
    } else if (cJSON_IsString(j) || cJSON_IsRaw(j)) {
        *out = sp_jv_cstr(j->valuestring ? j->valuestring : "");
    } else if (cJSON_IsArray(j)) {
        int64_t n = cJSON_GetArraySize(j);
        if ((st = sp_jv_new_list(a, n, out)) != SP_OK) return st;
        int64_t i = 0;
        for (const cJSON *c = j->child; c && i < n; c = c->next, i++)
            if ((st = sp_jv_from_cjson(a, c, &out->list->v[i])) != SP_OK) return st;
    } else if (cJSON_IsObject(j)) {
        if ((st = sp_jv_new_dict(a, SP_JV_DICT, out)) != SP_OK) return st;
        for (const cJSON *c = j->child; c; c = c->next) {
            struct sp_jv v;
            if ((st = sp_jv_from_cjson(a, c, &v)) != SP_OK) return st;
            if ((st = sp_jdict_set(a, out->dict, sp_jv_cstr(c->string ? c->string : ""), v)) != SP_OK) return st;
        }
    } else {
        *out = sp_jv_none();
    }
    return SP_OK;
}

/* ---- inspection ----------------------------------------------------------- */

const char *sp_jv_type_name(struct sp_jv v) {
    switch (v.t) {
    case SP_JV_UNDEFINED:
        return "Undefined";
    case SP_JV_NONE:
        return "NoneType";
    case SP_JV_BOOL:
        return "bool";
    case SP_JV_INT:
        return "int";
    case SP_JV_FLOAT:
        return "float";
    case SP_JV_STR:
        return "str";
    case SP_JV_LIST:
        switch (v.list->kind) {
        case SP_JLIST_GEN:
            return "generator";
        case SP_JLIST_ITEMS:
            return "dict_items";
        case SP_JLIST_KEYS:
            return "dict_keys";
        case SP_JLIST_VALUES:
            return "dict_values";
        default:
            return v.list->tuple ? "tuple" : "list";
        }
    case SP_JV_DICT:
        return "dict";
    case SP_JV_NAMESPACE:
        return "Namespace";
    case SP_JV_MACRO:
        return "Macro";
    case SP_JV_BUILTIN:
        return "builtin_function_or_method";
    case SP_JV_METHOD:
        return "builtin_function_or_method";
    case SP_JV_LOOP:
        return "LoopContext";
    default:
        return "object";
    }
}

bool sp_jv_truthy(struct sp_jv v) {
    switch (v.t) {
    case SP_JV_UNDEFINED:
    case SP_JV_NONE:
        return false;
    case SP_JV_BOOL:
        return v.b;
    case SP_JV_INT:
        return v.i != 0;
    case SP_JV_FLOAT:
        return v.f != 0.0;
    case SP_JV_STR:
        return v.s.n != 0;
    case SP_JV_LIST:
        return v.list->kind == SP_JLIST_GEN || v.list->n != 0;
    case SP_JV_DICT:
        return v.dict->n != 0;
    default:
        return true;
    }
}

bool sp_jv_number(struct sp_jv v, double *out) {
    switch (v.t) {
    case SP_JV_BOOL:
        *out = v.b ? 1.0 : 0.0;
        return true;
    case SP_JV_INT:
        *out = (double)v.i;
        return true;
    case SP_JV_FLOAT:
        *out = v.f;
        return true;
    default:
        return false;
    }
}

static bool is_intlike(struct sp_jv v, int64_t *out) {
    if (v.t == SP_JV_INT)
        *out = v.i;
    else if (v.t == SP_JV_BOOL)
        *out = v.b;
    else
        return false;
    return true;
}

#define MAX_NESTING 1000

static _Thread_local int64_t work_left = -1; // < 0: unlimited
static _Thread_local bool work_spent;

void sp_jv_work_reset(int64_t budget) {
    work_left = budget > 0 ? budget : -1;
    work_spent = false;
}

bool sp_jv_work_spent(void) { return work_spent; }

/* Charges one visited value; false when the budget is spent. */
static bool work(void) {
    if (work_left < 0) return true;
    if (work_left == 0) {
        work_spent = true;
        return false;
    }
    work_left--;
    return true;
}

static bool equal_at(struct sp_jv a, struct sp_jv b, int depth) {
    if (!work() || depth > MAX_NESTING) return false;
    int64_t ia, ib;
    if (is_intlike(a, &ia) && is_intlike(b, &ib)) return ia == ib;
    double da, db;
    if (sp_jv_number(a, &da) && sp_jv_number(b, &db)) return da == db;
    if (a.t != b.t) return false;
    switch (a.t) {
    case SP_JV_UNDEFINED:
    case SP_JV_NONE:
        return true;
    case SP_JV_STR:
        return a.s.n == b.s.n && (a.s.n == 0 || memcmp(a.s.p, b.s.p, a.s.n) == 0);
    case SP_JV_LIST:
        if (a.list == b.list) return true; // Python compares by identity first
        if (a.list->kind != SP_JLIST_LIST || b.list->kind != SP_JLIST_LIST) return false;
        if (a.list->tuple != b.list->tuple || a.list->n != b.list->n) return false;
        for (int64_t i = 0; i < a.list->n; i++)
            if (!equal_at(a.list->v[i], b.list->v[i], depth + 1)) return false;
        return true;
    case SP_JV_DICT:
        if (a.dict == b.dict) return true;
        if (a.dict->n != b.dict->n) return false;
        for (int64_t i = 0; i < a.dict->n; i++) {
            struct sp_jv *o = sp_jdict_get(b.dict, a.dict->e[i].key);
            if (!o || !equal_at(a.dict->e[i].val, *o, depth + 1)) return false;
        }
        return true;
    case SP_JV_BUILTIN:
        return a.i == b.i;
    default:
        return a.ptr == b.ptr;
    }
}

bool sp_jv_equal(struct sp_jv a, struct sp_jv b) { return equal_at(a, b, 0); }

static bool compare_at(struct sp_jv a, struct sp_jv b, int *cmp, int depth) {
    if (!work() || depth > MAX_NESTING) return false;
    int64_t ia, ib;
    if (is_intlike(a, &ia) && is_intlike(b, &ib)) {
        *cmp = (ia > ib) - (ia < ib);
        return true;
    }
    double da, db;
    if (sp_jv_number(a, &da) && sp_jv_number(b, &db)) {
        if (isnan(da) || isnan(db)) {
            *cmp = 2; // every ordering test is false
            return true;
        }
        *cmp = (da > db) - (da < db);
        return true;
    }
    if (a.t == SP_JV_STR && b.t == SP_JV_STR) {
        // Byte order of UTF-8 is code point order, which is Python's.
        size_t n = a.s.n < b.s.n ? a.s.n : b.s.n;
        int c = n ? memcmp(a.s.p, b.s.p, n) : 0;
        if (c == 0) c = (a.s.n > b.s.n) - (a.s.n < b.s.n);
        *cmp = (c > 0) - (c < 0);
        return true;
    }
    if (sp_jv_is_seq(a) && sp_jv_is_seq(b) && a.list->tuple == b.list->tuple) {
        int64_t n = a.list->n < b.list->n ? a.list->n : b.list->n;
        for (int64_t i = 0; i < n; i++) {
            if (equal_at(a.list->v[i], b.list->v[i], depth + 1)) continue;
            return compare_at(a.list->v[i], b.list->v[i], cmp, depth + 1);
        }
        *cmp = (a.list->n > b.list->n) - (a.list->n < b.list->n);
        return true;
    }
    return false;
}

bool sp_jv_compare(struct sp_jv a, struct sp_jv b, int *cmp) { return compare_at(a, b, cmp, 0); }

/* ---- Unicode ------------------------------------------------------------ */

bool sp_unicode_isspace(int32_t c) {
    if (c == ' ' || (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x1f)) return true;
    if (c < 0x85) return false;
    return c == 0x85 || c == 0xa0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 ||
           c == 0x202f || c == 0x205f || c == 0x3000;
}

/* ---- text forms ----------------------------------------------------------- */

void sp_jv_format_float(char out[40], double f) {
    if (isnan(f)) {
        strcpy(out, "nan");
        return;
    }
    if (isinf(f)) {
        strcpy(out, f > 0 ? "inf" : "-inf");
        return;
    }
    // Shortest digits that read back to the same double, as Python's repr.
    char e[40];
    int prec;
    for (prec = 0; prec < 17; prec++) {
        snprintf(e, sizeof e, "%.*e", prec, f);
        if (strtod(e, NULL) == f) break;
    }
    snprintf(e, sizeof e, "%.*e", prec, f);
    // e looks like "-d.ddde+XX": split into sign, digits and exponent.
    const char *p = e;
    bool neg = false;
    if (*p == '-') {
        neg = true;
        p++;
    }
    char digits[24];
    int nd = 0;
    for (; *p && *p != 'e'; p++)
        if (*p != '.' && nd < 23) digits[nd++] = *p;
    digits[nd] = 0;
    int exp10 = atoi(p + 1);
    while (nd > 1 && digits[nd - 1] == '0') digits[--nd] = 0;
    int decpt = exp10 + 1; // value = 0.digits * 10^decpt
    char *o = out;
    if (neg) *o++ = '-';
    if (decpt > -4 && decpt <= 16) {
        if (decpt <= 0) {
            *o++ = '0';
            *o++ = '.';
            for (int i = 0; i < -decpt; i++) *o++ = '0';
            for (int i = 0; i < nd; i++) *o++ = digits[i];
        } else {
            for (int i = 0; i < decpt; i++) *o++ = i < nd ? digits[i] : '0';
            *o++ = '.';
            if (nd > decpt)
                for (int i = decpt; i < nd; i++) *o++ = digits[i];
            else
                *o++ = '0';
        }
        *o = 0;
    } else {
        *o++ = digits[0];
        if (nd > 1) {
            *o++ = '.';
            for (int i = 1; i < nd; i++) *o++ = digits[i];
        }
        int ae = exp10 < 0 ? -exp10 : exp10;
        *o++ = 'e';
        *o++ = exp10 < 0 ? '-' : '+';
        if (ae >= 100) *o++ = (char)('0' + ae / 100);
        *o++ = (char)('0' + ae / 10 % 10);
        *o++ = (char)('0' + ae % 10);
        *o = 0;
    }
}

/* Python's str.isprintable() for one code point (space counts as printable). */
static bool py_printable(int32_t cp) {
    if (cp == ' ') return true;
    if (cp < 0x20 || cp == 0x7f) return false;
    if (cp < 0x7f) return true;
    utf8proc_category_t c = utf8proc_category(cp);
    switch (c) {
    case UTF8PROC_CATEGORY_CC:
    case UTF8PROC_CATEGORY_CF:
    case UTF8PROC_CATEGORY_CS:
    case UTF8PROC_CATEGORY_CO:
    case UTF8PROC_CATEGORY_CN:
    case UTF8PROC_CATEGORY_ZL:
    case UTF8PROC_CATEGORY_ZP:
    case UTF8PROC_CATEGORY_ZS:
        return false;
    default:
        return true;
    }
}

static enum sp_status write_str_repr(struct sp_buf *b, const char *s, size_t n) {
    bool has_sq = memchr(s, '\'', n) != NULL, has_dq = memchr(s, '"', n) != NULL;
    char q = (has_sq && !has_dq) ? '"' : '\'';
    sp_buf_putc(b, q);
    size_t i = 0;
    while (i < n) {
        int32_t cp;
        size_t l = sp_utf8_next(s + i, n - i, &cp);
        if (cp == q || cp == '\\') {
            sp_buf_putc(b, '\\');
            sp_buf_putc(b, (char)cp);
        } else if (cp == '\n') {
            sp_buf_puts(b, "\\n");
        } else if (cp == '\r') {
            sp_buf_puts(b, "\\r");
        } else if (cp == '\t') {
            sp_buf_puts(b, "\\t");
        } else if (py_printable(cp)) {
            sp_buf_append(b, s + i, l);
        } else if (cp < 0x100) {
            sp_buf_printf(b, "\\x%02x", (unsigned)cp);
        } else if (cp < 0x10000) {
            sp_buf_printf(b, "\\u%04x", (unsigned)cp);
        } else {
            sp_buf_printf(b, "\\U%08x", (unsigned)cp);
        }
        i += l;
    }
    return sp_buf_putc(b, q);
}

/* Where str() / repr() write, and the limits they write under. */
struct writer {
    struct sp_buf *b;
    size_t max_len;
    int depth;
};

static enum sp_status write_text(struct writer *w, struct sp_jv v, bool repr);

static enum sp_status write_seq(struct writer *w, struct sp_jv v) {
    struct sp_buf *b = w->b;
    enum sp_status st;
    if (v.list->kind == SP_JLIST_GEN) return sp_buf_puts(b, "<generator object>");
    if (v.list->kind != SP_JLIST_LIST) {
        // dict_items([('a', 1)])
        sp_buf_puts(b, sp_jv_type_name(v));
        sp_buf_putc(b, '(');
        struct sp_jlist plain = *v.list;
        plain.kind = SP_JLIST_LIST;
        plain.tuple = false;
        if ((st = write_seq(w, (struct sp_jv){.t = SP_JV_LIST, .list = &plain})) != SP_OK) return st;
        return sp_buf_putc(b, ')');
    }
    bool tuple = v.list->tuple;
    sp_buf_putc(b, tuple ? '(' : '[');
    for (int64_t i = 0; i < v.list->n; i++) {
        if (i) sp_buf_puts(b, ", ");
        if ((st = write_text(w, v.list->v[i], true)) != SP_OK) return st;
    }
    if (tuple && v.list->n == 1) sp_buf_putc(b, ',');
    return sp_buf_putc(b, tuple ? ')' : ']');
}

static enum sp_status write_dict(struct writer *w, const struct sp_jdict *d) {
    enum sp_status st;
    sp_buf_putc(w->b, '{');
    for (int64_t i = 0; i < d->n; i++) {
        if (i) sp_buf_puts(w->b, ", ");
        if ((st = write_text(w, d->e[i].key, true)) != SP_OK) return st;
        sp_buf_puts(w->b, ": ");
        if ((st = write_text(w, d->e[i].val, true)) != SP_OK) return st;
    }
    return sp_buf_putc(w->b, '}');
}

static enum sp_status write_value(struct writer *w, struct sp_jv v, bool repr) {
    struct sp_buf *b = w->b;
    char num[40];
    enum sp_status st;
    switch (v.t) {
    case SP_JV_UNDEFINED:
        return repr ? sp_buf_puts(b, "Undefined") : SP_OK;
    case SP_JV_NONE:
        return sp_buf_puts(b, "None");
    case SP_JV_BOOL:
        return sp_buf_puts(b, v.b ? "True" : "False");
    case SP_JV_INT:
        return sp_buf_printf(b, "%lld", (long long)v.i);
    case SP_JV_FLOAT:
        sp_jv_format_float(num, v.f);
        return sp_buf_puts(b, num);
    case SP_JV_STR:
        return repr ? write_str_repr(b, v.s.p, v.s.n) : sp_buf_append(b, v.s.p, v.s.n);
    case SP_JV_LIST:
        return write_seq(w, v);
    case SP_JV_DICT:
        return write_dict(w, v.dict);
    case SP_JV_NAMESPACE:
        sp_buf_puts(b, "<Namespace ");
        if ((st = write_dict(w, v.dict)) != SP_OK) return st;
        return sp_buf_putc(b, '>');
    case SP_JV_METHOD:
        return sp_buf_printf(b, "<built-in method %s of %s object>", v.method->name, sp_jv_type_name(v.method->self));
    default:
        return sp_buf_printf(b, "<%s object>", sp_jv_type_name(v));
    }
}

static enum sp_status write_text(struct writer *w, struct sp_jv v, bool repr) {
    if (w->depth >= MAX_NESTING) return sp_errorf(SP_ERR_LIMIT, "value nested too deeply to print");
    if (w->max_len && w->b->len > w->max_len)
        return sp_errorf(SP_ERR_LIMIT, "text of a value exceeds %zu bytes", w->max_len);
    w->depth++;
    enum sp_status st = write_value(w, v, repr);
    w->depth--;
    if (st == SP_OK && w->b->failed) st = sp_errorf(SP_ERR_NOMEM, "out of memory printing a value");
    if (st == SP_OK && w->max_len && w->b->len > w->max_len)
        st = sp_errorf(SP_ERR_LIMIT, "text of a value exceeds %zu bytes", w->max_len);
    return st;
}

enum sp_status sp_jv_write_str(struct sp_buf *b, struct sp_jv v, size_t max_len) {
    struct writer w = {b, max_len, 0};
    return write_text(&w, v, false);
}

enum sp_status sp_jv_write_repr(struct sp_buf *b, struct sp_jv v, size_t max_len) {
    struct writer w = {b, max_len, 0};
    return write_text(&w, v, true);
}

/* ---- json.dumps ----------------------------------------------------------- */

/* json.dumps string escaping. */
static void json_str(struct sp_buf *b, const char *s, size_t n, bool ascii) {
    sp_buf_reserve(b, n + 2);
    sp_buf_putc(b, '"');
    size_t run = 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        const char *esc = NULL;
        char tmp[16];
        if (ascii && c == 0x7f) {
            esc = "\\u007f";
        } else if (ascii && c >= 0x80) {
            int32_t cp;
            size_t l = sp_utf8_next(s + i, n - i, &cp);
            sp_buf_append(b, s + run, i - run);
            if (cp >= 0x10000) {
                cp -= 0x10000;
                snprintf(tmp, sizeof tmp, "\\u%04x\\u%04x", (unsigned)(0xd800 + (cp >> 10)),
                         (unsigned)(0xdc00 + (cp & 0x3ff)));
            } else {
                snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)cp);
            }
            sp_buf_puts(b, tmp);
            i += l - 1;
            run = i + 1;
            continue;
        }
        switch (c) {
        case '"':
            esc = "\\\"";
            break;
        case '\\':
            esc = "\\\\";
            break;
        case '\n':
            esc = "\\n";
            break;
        case '\r':
            esc = "\\r";
            break;
        case '\t':
            esc = "\\t";
            break;
        case '\b':
            esc = "\\b";
            break;
        case '\f':
            esc = "\\f";
            break;
        default:
            if (c < 0x20) {
                snprintf(tmp, sizeof tmp, "\\u%04x", (unsigned)c & 0xffu);
                esc = tmp;
            }
        }
        if (!esc) continue;
        sp_buf_append(b, s + run, i - run);
        sp_buf_puts(b, esc);
        run = i + 1;
    }
    sp_buf_append(b, s + run, n - run);
    sp_buf_putc(b, '"');
}

static void json_newline(struct sp_buf *b, const struct sp_jv_json_opts *o, int depth) {
    sp_buf_putc(b, '\n');
    for (int i = 0; i < depth; i++) sp_buf_puts(b, o->indent);
}

/* A dict key as json.dumps converts it; false for keys it refuses. */
static bool json_key(struct sp_buf *b, struct sp_jv k, bool ascii) {
    char num[40];
    switch (k.t) {
    case SP_JV_STR:
        json_str(b, k.s.p, k.s.n, ascii);
        return true;
    case SP_JV_INT:
        sp_buf_printf(b, "\"%lld\"", (long long)k.i);
        return true;
    case SP_JV_BOOL:
        sp_buf_puts(b, k.b ? "\"true\"" : "\"false\"");
        return true;
    case SP_JV_NONE:
        sp_buf_puts(b, "\"null\"");
        return true;
    case SP_JV_FLOAT:
        if (isnan(k.f))
            strcpy(num, "NaN");
        else if (isinf(k.f))
            strcpy(num, k.f > 0 ? "Infinity" : "-Infinity");
        else
            sp_jv_format_float(num, k.f);
        sp_buf_printf(b, "\"%s\"", num);
        return true;
    default:
        return false;
    }
}

static int cmp_keys(const void *pa, const void *pb) {
    const struct sp_jdict_entry *a = *(const struct sp_jdict_entry *const *)pa;
    const struct sp_jdict_entry *b = *(const struct sp_jdict_entry *const *)pb;
    int c = 0;
    sp_jv_compare(a->key, b->key, &c);
    return c;
}

static enum sp_status json_value(struct sp_buf *b, struct sp_jv v, const struct sp_jv_json_opts *o, int depth) {
    char num[40];
    if (depth > 512) return sp_errorf(SP_ERR_LIMIT, "tojson: value nested too deeply");
    if (o->max_len && b->len > o->max_len) return sp_errorf(SP_ERR_LIMIT, "tojson: text exceeds %zu bytes", o->max_len);
    const char *isep = o->item_sep ? o->item_sep : (o->indent ? "," : ", ");
    const char *ksep = o->key_sep ? o->key_sep : ": ";
    enum sp_status st;
    switch (v.t) {
    case SP_JV_NONE:
        sp_buf_puts(b, "null");
        break;
    case SP_JV_BOOL:
        sp_buf_puts(b, v.b ? "true" : "false");
        break;
    case SP_JV_INT:
        sp_buf_printf(b, "%lld", (long long)v.i);
        break;
    case SP_JV_FLOAT:
        if (isnan(v.f))
            strcpy(num, "NaN");
        else if (isinf(v.f))
            strcpy(num, v.f > 0 ? "Infinity" : "-Infinity");
        else
            sp_jv_format_float(num, v.f);
        sp_buf_puts(b, num);
        break;
    case SP_JV_STR:
        json_str(b, v.s.p, v.s.n, o->ensure_ascii);
        break;
    case SP_JV_LIST:
        if (v.list->kind != SP_JLIST_LIST)
            return sp_errorf(SP_ERR_ARG, "tojson: Object of type %s is not JSON serializable", sp_jv_type_name(v));
        if (v.list->n == 0) {
            sp_buf_puts(b, "[]");
            break;
        }
        sp_buf_putc(b, '[');
        for (int64_t i = 0; i < v.list->n; i++) {
            if (i) sp_buf_puts(b, isep);
            if (o->indent) json_newline(b, o, depth + 1);
            if ((st = json_value(b, v.list->v[i], o, depth + 1)) != SP_OK) return st;
        }
        if (o->indent) json_newline(b, o, depth);
        sp_buf_putc(b, ']');
        break;
    case SP_JV_DICT:
    case SP_JV_NAMESPACE: {
        if (v.t == SP_JV_NAMESPACE)
            return sp_errorf(SP_ERR_ARG, "tojson: Object of type Namespace is not JSON serializable");
        const struct sp_jdict *d = v.dict;
        if (d->n == 0) {
            sp_buf_puts(b, "{}");
            break;
        }
        const struct sp_jdict_entry **order = NULL;
        if (o->sort_keys) {
            order = sp_malloc((size_t)d->n * sizeof *order, SP_MEM_TOKENIZER);
            if (!order) return sp_errorf(SP_ERR_NOMEM, "tojson: out of memory");
            for (int64_t i = 0; i < d->n; i++) order[i] = &d->e[i];
            qsort(order, (size_t)d->n, sizeof *order, cmp_keys);
        }
        sp_buf_putc(b, '{');
        st = SP_OK;
        for (int64_t i = 0; i < d->n && st == SP_OK; i++) {
            const struct sp_jdict_entry *e = order ? order[i] : &d->e[i];
            if (i) sp_buf_puts(b, isep);
            if (o->indent) json_newline(b, o, depth + 1);
            if (!json_key(b, e->key, o->ensure_ascii)) {
                st = sp_errorf(SP_ERR_ARG, "tojson: keys must be str, int, float, bool or None, not %s",
                               sp_jv_type_name(e->key));
                break;
            }
            sp_buf_puts(b, ksep);
            st = json_value(b, e->val, o, depth + 1);
        }
        sp_free(order);
        if (st != SP_OK) return st;
        if (o->indent) json_newline(b, o, depth);
        sp_buf_putc(b, '}');
        break;
    }
    default:
        return sp_errorf(SP_ERR_ARG, "tojson: Object of type %s is not JSON serializable", sp_jv_type_name(v));
    }
    return b->failed ? sp_errorf(SP_ERR_NOMEM, "tojson: out of memory") : SP_OK;
}

enum sp_status sp_jv_write_json(struct sp_buf *b, struct sp_jv v, const struct sp_jv_json_opts *o) {
    static const struct sp_jv_json_opts defaults = {0};
    return json_value(b, v, o ? o : &defaults, 0);
}
