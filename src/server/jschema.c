/*
 * jschema.c - JSON Schema to grammar (see jschema.h).
 */
#include "server/jschema.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/json.h"

#define MAX_WS 20
#define MAX_NESTING 64           // schema nesting compiled without a $ref
#define MAX_SYMBOLS (1 << 20)    // a schema's grammar
#define MAX_REFS 256

struct sp_jschema {
    struct sp_gbuild *b;
    const cJSON *root;  // of the schema being compiled, for $ref
    char err[320];
    bool failed;
    int depth;
    int ws, chr, any_value, any_object, any_array, string, number, integer, uinteger, uint_, boolean, null_, key_sep;
    struct {
        const cJSON *node;
        int rule;
    } refs[MAX_REFS];
    int n_refs;
    cJSON *owned;  // schemas made here (allOf merges), freed with the compiler
};

static int fail(struct sp_jschema *c, const char *where, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static int fail(struct sp_jschema *c, const char *where, const char *fmt, ...) {
    if (c->failed) return -1;
    c->failed = true;
    int n = snprintf(c->err, sizeof c->err, "%s: ", where);
    va_list ap;
    va_start(ap, fmt);
    if (n > 0 && (size_t)n < sizeof c->err) vsnprintf(c->err + n, sizeof c->err - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

struct sp_jschema *sp_jschema_new(struct sp_gbuild *b) {
    if (!b) return NULL;
    struct sp_jschema *c = sp_calloc(1, sizeof *c, SP_MEM_SERVER);
    if (!c) return NULL;
    c->b = b;
    c->ws = c->chr = c->any_value = c->any_object = c->any_array = c->string = c->number = c->integer = -1;
    c->uinteger = c->uint_ = c->boolean = c->null_ = c->key_sep = -1;
    c->owned = cJSON_CreateArray();
    if (!c->owned) {
        sp_free(c);
        return NULL;
    }
    return c;
}

void sp_jschema_free(struct sp_jschema *c) {
    if (!c) return;
    cJSON_Delete(c->owned);
    sp_free(c);
}

const char *sp_jschema_error(const struct sp_jschema *c) { return c ? c->err : "out of memory"; }

/* ---- building blocks ---- */

/* A rule of one alternative: a literal. */
static int lit_rule(struct sp_jschema *c, const char *s) {
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_lit(c->b, s);
    sp_gb_end(c->b, r);
    return r;
}

static void empty_alt(struct sp_jschema *c, int r) {
    sp_gb_begin(c->b);
    sp_gb_end(c->b, r);
}

int sp_jschema_ws(struct sp_jschema *c) {
    if (c->ws >= 0) return c->ws;
    struct sp_gset w = {{0}};
    sp_gset_add(&w, ' ', ' ');
    sp_gset_add(&w, '\t', '\n');
    sp_gset_add(&w, '\r', '\r');
    int next = sp_gb_rule(c->b);
    empty_alt(c, next);
    for (int k = 0; k < MAX_WS; k++) {
        int r = sp_gb_rule(c->b);
        sp_gb_begin(c->b);
        sp_gb_set(c->b, &w);
        sp_gb_ref(c->b, next);
        sp_gb_end(c->b, r);
        empty_alt(c, r);
        next = r;
    }
    return c->ws = next;
}

/* item repeated min..max times (max < 0: no bound), with sep before every
 * item but the first (sep < 0: none). */
static int repeat(struct sp_jschema *c, int item, int sep, int64_t min, int64_t max) {
    struct sp_gbuild *b = c->b;
    if (max >= 0 && max < min) max = min;
    if (sp_gb_size(b) + (size_t)(max > min ? max - min : 0) * 4 + (size_t)min * 2 > MAX_SYMBOLS)
        return fail(c, "schema", "the repetition counts make the grammar too large");
    /* tail: up to `more` further (sep item), or any number */
    int tail = sp_gb_rule(b);
    if (max < 0) {
        sp_gb_begin(b);
        if (sep >= 0) sp_gb_ref(b, sep);
        sp_gb_ref(b, item);
        sp_gb_ref(b, tail);
        sp_gb_end(b, tail);
        empty_alt(c, tail);
    } else {
        int64_t more = max - (min > 0 ? min : 1);
        empty_alt(c, tail);
        for (int64_t k = 0; k < more; k++) {
            int r = sp_gb_rule(b);
            sp_gb_begin(b);
            if (sep >= 0) sp_gb_ref(b, sep);
            sp_gb_ref(b, item);
            sp_gb_ref(b, tail);
            sp_gb_end(b, r);
            empty_alt(c, r);
            tail = r;
        }
    }
    int r = sp_gb_rule(b);
    if (max == 0) {
        empty_alt(c, r);
        return r;
    }
    sp_gb_begin(b);
    sp_gb_ref(b, item);
    for (int64_t k = 1; k < min; k++) {
        if (sep >= 0) sp_gb_ref(b, sep);
        sp_gb_ref(b, item);
    }
    sp_gb_ref(b, tail);
    sp_gb_end(b, r);
    if (min == 0) empty_alt(c, r);
    return r;
}

/* Adds to rule r the UTF-8 characters of 2, 3 and 4 bytes (no overlong
 * forms, no surrogates) as alternatives. */
static void utf8_multibyte(struct sp_gbuild *b, int r) {
    static const unsigned char seq[][4][2] = {
        {{0xc2, 0xdf}, {0x80, 0xbf}, {0, 0}, {0, 0}},
        {{0xe0, 0xe0}, {0xa0, 0xbf}, {0x80, 0xbf}, {0, 0}},
        {{0xe1, 0xec}, {0x80, 0xbf}, {0x80, 0xbf}, {0, 0}},
        {{0xed, 0xed}, {0x80, 0x9f}, {0x80, 0xbf}, {0, 0}},
        {{0xee, 0xef}, {0x80, 0xbf}, {0x80, 0xbf}, {0, 0}},
        {{0xf0, 0xf0}, {0x90, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf1, 0xf3}, {0x80, 0xbf}, {0x80, 0xbf}, {0x80, 0xbf}},
        {{0xf4, 0xf4}, {0x80, 0x8f}, {0x80, 0xbf}, {0x80, 0xbf}},
    };
    for (size_t i = 0; i < sizeof seq / sizeof *seq; i++) {
        sp_gb_begin(b);
        for (int k = 0; k < 4 && seq[i][k][0]; k++) sp_gb_range(b, seq[i][k][0], seq[i][k][1]);
        sp_gb_end(b, r);
    }
}

static void drop_byte(struct sp_gset *s, unsigned char c) { s->w[c >> 6] &= ~(1ull << (c & 63)); }

int sp_jschema_text(struct sp_jschema *c, const char *exclude) {
    struct sp_gbuild *b = c->b;
    int ch = sp_gb_rule(b);
    struct sp_gset ascii = {{0}};
    sp_gset_add(&ascii, 0x20, 0x7f);
    sp_gset_add(&ascii, '\t', '\n');
    sp_gset_add(&ascii, '\r', '\r');
    for (const char *x = exclude; *x; x++) drop_byte(&ascii, (unsigned char)*x);
    sp_gb_begin(b);
    sp_gb_set(b, &ascii);
    sp_gb_end(b, ch);
    utf8_multibyte(b, ch);
    return repeat(c, ch, -1, 0, -1);
}

/* One character of a JSON string body: unescaped (valid UTF-8, no control
 * characters, no '"' or '\\') or an escape. */
static int string_char(struct sp_jschema *c) {
    if (c->chr >= 0) return c->chr;
    struct sp_gbuild *b = c->b;
    int r = sp_gb_rule(b);
    struct sp_gset ascii = {{0}};
    sp_gset_add(&ascii, 0x20, 0x7f);
    drop_byte(&ascii, '"');
    drop_byte(&ascii, '\\');
    sp_gb_begin(b);
    sp_gb_set(b, &ascii);
    sp_gb_end(b, r);
    /* escapes */
    struct sp_gset esc = {{0}}, hex = {{0}};
    for (const char *e = "\"\\/bfnrt"; *e; e++) sp_gset_add(&esc, (unsigned char)*e, (unsigned char)*e);
    sp_gset_add(&hex, '0', '9');
    sp_gset_add(&hex, 'a', 'f');
    sp_gset_add(&hex, 'A', 'F');
    sp_gb_begin(b);
    sp_gb_lit(b, "\\");
    sp_gb_set(b, &esc);
    sp_gb_end(b, r);
    sp_gb_begin(b);
    sp_gb_lit(b, "\\u");
    for (int i = 0; i < 4; i++) sp_gb_set(b, &hex);
    sp_gb_end(b, r);
    utf8_multibyte(b, r);
    return c->chr = r;
}

static int digits(struct sp_jschema *c, int64_t min, int64_t max) {
    int d = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_range(c->b, '0', '9');
    sp_gb_end(c->b, d);
    return repeat(c, d, -1, min, max);
}

/* A quoted string of min..max characters (max < 0: any length). */
static int string_rule(struct sp_jschema *c, int64_t min, int64_t max) {
    bool plain = min == 0 && max < 0;
    if (plain && c->string >= 0) return c->string;
    int body = repeat(c, string_char(c), -1, min, max);
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_lit(c->b, "\"");
    sp_gb_ref(c->b, body);
    sp_gb_lit(c->b, "\"");
    sp_gb_end(c->b, r);
    if (plain) c->string = r;
    return r;
}

/* Two digits, the first at most `hi` (hours, minutes, months, days). */
static void digit_pair(struct sp_gbuild *b, unsigned hi, const struct sp_gset *d) {
    sp_gb_range(b, '0', hi);
    sp_gb_set(b, d);
}

/* A string of one of the cheap formats; -1 (no error) for the others. */
static int format_rule(struct sp_jschema *c, const char *f) {
    struct sp_gbuild *b = c->b;
    struct sp_gset d = {{0}}, hex = {{0}}, sign = {{0}};
    sp_gset_add(&d, '0', '9');
    sp_gset_add(&hex, '0', '9');
    sp_gset_add(&hex, 'a', 'f');
    sp_gset_add(&hex, 'A', 'F');
    sp_gset_add(&sign, '+', '+');
    sp_gset_add(&sign, '-', '-');
    bool date = !strcmp(f, "date") || !strcmp(f, "date-time"), time = !strcmp(f, "time") || !strcmp(f, "date-time");
    if (!date && !time && strcmp(f, "uuid")) return -1;
    int r = sp_gb_rule(b);
    if (!strcmp(f, "uuid")) {
        sp_gb_begin(b);
        sp_gb_lit(b, "\"");
        static const int groups[] = {8, 4, 4, 4, 12};
        for (int g = 0; g < 5; g++) {
            if (g) sp_gb_lit(b, "-");
            for (int i = 0; i < groups[g]; i++) sp_gb_set(b, &hex);
        }
        sp_gb_lit(b, "\"");
        sp_gb_end(b, r);
        return r;
    }
    int frac = -1, zone = -1;
    if (time) {
        int fd = digits(c, 1, 9);
        frac = sp_gb_rule(b);
        sp_gb_begin(b);
        sp_gb_lit(b, ".");
        sp_gb_ref(b, fd);
        sp_gb_end(b, frac);
        empty_alt(c, frac);
        zone = sp_gb_rule(b);
        sp_gb_begin(b);
        sp_gb_lit(b, "Z");
        sp_gb_end(b, zone);
        sp_gb_begin(b);
        sp_gb_set(b, &sign);
        digit_pair(b, '2', &d);
        sp_gb_lit(b, ":");
        digit_pair(b, '5', &d);
        sp_gb_end(b, zone);
    }
    sp_gb_begin(b);
    sp_gb_lit(b, "\"");
    if (date) {
        for (int i = 0; i < 4; i++) sp_gb_set(b, &d);
        sp_gb_lit(b, "-");
        digit_pair(b, '1', &d);
        sp_gb_lit(b, "-");
        digit_pair(b, '3', &d);
    }
    if (date && time) sp_gb_lit(b, "T");
    if (time) {
        digit_pair(b, '2', &d);
        sp_gb_lit(b, ":");
        digit_pair(b, '5', &d);
        sp_gb_lit(b, ":");
        digit_pair(b, '6', &d);  // a leap second
        sp_gb_ref(b, frac);
        sp_gb_ref(b, zone);
    }
    sp_gb_lit(b, "\"");
    sp_gb_end(b, r);
    return r;
}

/* An integer: "0" or up to 16 digits without a leading zero, signed unless
 * `nonneg`. */
static int integer_rule(struct sp_jschema *c, bool nonneg) {
    int *memo = nonneg ? &c->uint_ : &c->integer;
    if (*memo >= 0) return *memo;
    struct sp_gbuild *b = c->b;
    int more = digits(c, 0, 15);
    int mag = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_lit(b, "0");
    sp_gb_end(b, mag);
    sp_gb_begin(b);
    sp_gb_range(b, '1', '9');
    sp_gb_ref(b, more);
    sp_gb_end(b, mag);
    if (nonneg) return *memo = mag;
    int r = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_ref(b, mag);
    sp_gb_end(b, r);
    sp_gb_begin(b);
    sp_gb_lit(b, "-");
    sp_gb_ref(b, mag);
    sp_gb_end(b, r);
    return *memo = r;
}

static int number_rule(struct sp_jschema *c, bool nonneg) {
    int *memo = nonneg ? &c->uinteger : &c->number;
    if (*memo >= 0) return *memo;
    struct sp_gbuild *b = c->b;
    int in = integer_rule(c, nonneg);
    int fd = digits(c, 1, 15), ed = digits(c, 1, 3);
    int frac = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_lit(b, ".");
    sp_gb_ref(b, fd);
    sp_gb_end(b, frac);
    empty_alt(c, frac);
    struct sp_gset e = {{0}}, sign = {{0}};
    sp_gset_add(&e, 'e', 'e');
    sp_gset_add(&e, 'E', 'E');
    sp_gset_add(&sign, '+', '+');
    sp_gset_add(&sign, '-', '-');
    int exp = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_set(b, &e);
    sp_gb_ref(b, ed);
    sp_gb_end(b, exp);
    sp_gb_begin(b);
    sp_gb_set(b, &e);
    sp_gb_set(b, &sign);
    sp_gb_ref(b, ed);
    sp_gb_end(b, exp);
    empty_alt(c, exp);
    int r = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_ref(b, in);
    sp_gb_ref(b, frac);
    sp_gb_ref(b, exp);
    sp_gb_end(b, r);
    return *memo = r;
}

/* "," and whitespace, between members and items. */
static int comma(struct sp_jschema *c) {
    if (c->key_sep >= 0) return c->key_sep;
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_lit(c->b, ",");
    sp_gb_ref(c->b, sp_jschema_ws(c));
    sp_gb_end(c->b, r);
    return c->key_sep = r;
}

/* A rule of `value` followed by whitespace. */
static int then_ws(struct sp_jschema *c, int value) {
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_ref(c->b, value);
    sp_gb_ref(c->b, sp_jschema_ws(c));
    sp_gb_end(c->b, r);
    return r;
}

/* A member with any key: key ws ':' ws value ws. */
static int any_member(struct sp_jschema *c, int value) {
    int ws = sp_jschema_ws(c);
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_ref(c->b, string_rule(c, 0, -1));
    sp_gb_ref(c->b, ws);
    sp_gb_lit(c->b, ":");
    sp_gb_ref(c->b, ws);
    sp_gb_ref(c->b, value);
    sp_gb_ref(c->b, ws);
    sp_gb_end(c->b, r);
    return r;
}

/* open ws items close, items separated by commas. */
static int container(struct sp_jschema *c, const char *open, int items, const char *close) {
    int r = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    sp_gb_lit(c->b, open);
    sp_gb_ref(c->b, sp_jschema_ws(c));
    sp_gb_ref(c->b, items);
    sp_gb_lit(c->b, close);
    sp_gb_end(c->b, r);
    return r;
}

static int any_value(struct sp_jschema *c);

int sp_jschema_any_object(struct sp_jschema *c) {
    if (c->any_object >= 0) return c->any_object;
    c->any_object = sp_gb_rule(c->b);  // set first: values nest objects
    int members = repeat(c, any_member(c, any_value(c)), comma(c), 0, -1);
    sp_gb_begin(c->b);
    sp_gb_ref(c->b, container(c, "{", members, "}"));
    sp_gb_end(c->b, c->any_object);
    return c->any_object;
}

static int any_array(struct sp_jschema *c) {
    if (c->any_array >= 0) return c->any_array;
    c->any_array = sp_gb_rule(c->b);
    int items = repeat(c, then_ws(c, any_value(c)), comma(c), 0, -1);
    sp_gb_begin(c->b);
    sp_gb_ref(c->b, container(c, "[", items, "]"));
    sp_gb_end(c->b, c->any_array);
    return c->any_array;
}

static int literal_alts(struct sp_jschema *c, int r, const char *const *lits, int n) {
    for (int i = 0; i < n; i++) {
        sp_gb_begin(c->b);
        sp_gb_lit(c->b, lits[i]);
        sp_gb_end(c->b, r);
    }
    return r;
}

static int any_value(struct sp_jschema *c) {
    if (c->any_value >= 0) return c->any_value;
    int r = c->any_value = sp_gb_rule(c->b);
    int parts[] = {sp_jschema_any_object(c), any_array(c), string_rule(c, 0, -1), number_rule(c, false)};
    for (size_t i = 0; i < sizeof parts / sizeof *parts; i++) {
        sp_gb_begin(c->b);
        sp_gb_ref(c->b, parts[i]);
        sp_gb_end(c->b, r);
    }
    static const char *const lits[] = {"true", "false", "null"};
    return literal_alts(c, r, lits, 3);
}

/* ---- schemas ---- */

static int schema_rule(struct sp_jschema *c, const cJSON *s, const char *where);

static const cJSON *get(const cJSON *s, const char *k) { return cJSON_GetObjectItemCaseSensitive(s, k); }

/* A JSON value written exactly as given (enum and const). */
static bool add_value_literal(struct sp_jschema *c, int r, const cJSON *v, const char *where) {
    char *text = cJSON_PrintUnformatted(v);
    if (!text) return fail(c, where, "out of memory"), false;
    sp_gb_begin(c->b);
    sp_gb_lit(c->b, text);
    sp_gb_end(c->b, r);
    cJSON_free(text);
    return true;
}

static const cJSON *resolve_ref(struct sp_jschema *c, const char *ref, const char *where) {
    if (ref[0] != '#') return fail(c, where, "only local $ref (\"#...\") are supported, not \"%s\"", ref), NULL;
    const cJSON *at = c->root;
    const char *p = ref + 1;
    while (*p == '/') {
        p++;
        char name[256];
        size_t n = 0;
        while (*p && *p != '/' && n + 1 < sizeof name) {
            if (p[0] == '~' && (p[1] == '0' || p[1] == '1')) {
                name[n++] = p[1] == '0' ? '~' : '/';
                p += 2;
            } else {
                name[n++] = *p++;
            }
        }
        name[n] = 0;
        at = cJSON_IsArray(at) ? cJSON_GetArrayItem(at, atoi(name)) : get(at, name);
        if (!at) return fail(c, where, "$ref \"%s\" points to nothing", ref), NULL;
    }
    if (*p) return fail(c, where, "$ref \"%s\" is not a JSON pointer", ref), NULL;
    return at;
}

static int ref_rule(struct sp_jschema *c, const char *ref, const char *where) {
    const cJSON *target = resolve_ref(c, ref, where);
    if (!target) return -1;
    for (int i = 0; i < c->n_refs; i++)
        if (c->refs[i].node == target) return c->refs[i].rule;
    if (c->n_refs == MAX_REFS) return fail(c, where, "more than %d distinct $ref targets", MAX_REFS);
    int r = sp_gb_rule(c->b);
    c->refs[c->n_refs].node = target;
    c->refs[c->n_refs++].rule = r;
    int body = schema_rule(c, target, ref);  // recursion through the same target stops at the memo
    if (body < 0) return -1;
    sp_gb_begin(c->b);
    sp_gb_ref(c->b, body);
    sp_gb_end(c->b, r);
    return r;
}

static bool nonnegative(const cJSON *s) {
    const cJSON *mn = get(s, "minimum"), *emn = get(s, "exclusiveMinimum");
    return (cJSON_IsNumber(mn) && mn->valuedouble >= 0) || (cJSON_IsNumber(emn) && emn->valuedouble >= 0);
}

static int64_t count_kw(const cJSON *s, const char *k, int64_t dflt) {
    const cJSON *v = get(s, k);
    if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble)) return dflt;
    return v->valuedouble > 1e9 ? 1000000000 : (int64_t)v->valuedouble;
}

static int object_rule(struct sp_jschema *c, const cJSON *s, const char *where) {
    struct sp_gbuild *b = c->b;
    const cJSON *props = get(s, "properties"), *req = get(s, "required"), *addl = get(s, "additionalProperties");
    if (props && !cJSON_IsObject(props)) return fail(c, where, "'properties' must be an object");
    if (req && !cJSON_IsArray(req)) return fail(c, where, "'required' must be an array of names");
    int n = props ? cJSON_GetArraySize(props) : 0;
    /* other keys: when additionalProperties says so, or when nothing is declared */
    int extra = -1;
    if (cJSON_IsObject(addl) || cJSON_IsTrue(addl) || (!addl && n == 0)) {
        char at[300];
        snprintf(at, sizeof at, "%s.additionalProperties", where);
        extra = cJSON_IsObject(addl) ? schema_rule(c, addl, at) : any_value(c);
        if (extra < 0) return -1;
        extra = any_member(c, extra);
    }
    for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
        if (!cJSON_IsString(r) || !get(props, r->valuestring))
            return fail(c, where, "'required' names %s, which is not in 'properties'",
                        cJSON_IsString(r) ? r->valuestring : "a non-string");
    /* members[i]: "key" ws ':' ws value ws */
    int *members = sp_malloc(((size_t)n + 1) * sizeof *members, SP_MEM_SERVER);
    bool *required = sp_calloc((size_t)n + 1, sizeof *required, SP_MEM_SERVER);
    if (!members || !required) {
        sp_free(members);
        sp_free(required);
        return fail(c, where, "out of memory");
    }
    int ws = sp_jschema_ws(c), i = 0;
    for (const cJSON *p = props ? props->child : NULL; p; p = p->next, i++) {
        for (const cJSON *r = req ? req->child : NULL; r; r = r->next)
            if (cJSON_IsString(r) && !strcmp(r->valuestring, p->string)) required[i] = true;
        char at[300];
        snprintf(at, sizeof at, "%s.properties.%s", where, p->string);
        int v = schema_rule(c, p, at);
        if (v < 0) break;
        struct sp_buf k = SP_BUF_INIT;
        sp_json_escape(&k, p->string, strlen(p->string));
        members[i] = sp_gb_rule(b);
        sp_gb_begin(b);
        sp_gb_bytes(b, k.data, k.len);
        sp_gb_ref(b, ws);
        sp_gb_lit(b, ":");
        sp_gb_ref(b, ws);
        sp_gb_ref(b, v);
        sp_gb_ref(b, ws);
        sp_gb_end(b, members[i]);
        sp_buf_free(&k);
    }
    if (c->failed) {
        sp_free(members);
        sp_free(required);
        return -1;
    }
    /* rest[first]: the members from i on, `first` when none was written yet
     * (no comma before the next); built from the end */
    int rest[2];
    for (int first = 0; first < 2; first++) {
        rest[first] = sp_gb_rule(b);
        if (extra >= 0) {
            int more = repeat(c, extra, comma(c), 1, -1);
            sp_gb_begin(b);
            if (!first) sp_gb_ref(b, comma(c));
            sp_gb_ref(b, more);
            sp_gb_end(b, rest[first]);
        }
        empty_alt(c, rest[first]);
    }
    for (i = n - 1; i >= 0; i--) {
        int next[2];
        for (int first = 0; first < 2; first++) {
            next[first] = sp_gb_rule(b);
            sp_gb_begin(b);
            if (!first) sp_gb_ref(b, comma(c));
            sp_gb_ref(b, members[i]);
            sp_gb_ref(b, rest[0]);
            sp_gb_end(b, next[first]);
            if (!required[i]) {
                sp_gb_begin(b);
                sp_gb_ref(b, rest[first]);
                sp_gb_end(b, next[first]);
            }
        }
        rest[0] = next[0];
        rest[1] = next[1];
    }
    sp_free(members);
    sp_free(required);
    return container(c, "{", rest[1], "}");
}

static int array_rule(struct sp_jschema *c, const cJSON *s, const char *where) {
    const cJSON *items = get(s, "items"), *prefix = get(s, "prefixItems");
    if (prefix && !cJSON_IsArray(prefix)) return fail(c, where, "'prefixItems' must be an array");
    int64_t min = count_kw(s, "minItems", 0), max = count_kw(s, "maxItems", -1);
    int k = prefix ? cJSON_GetArraySize(prefix) : 0;
    int item = -1;
    char at[300];
    if (!cJSON_IsFalse(items)) {
        snprintf(at, sizeof at, "%s.items", where);
        item = items && !cJSON_IsTrue(items) ? schema_rule(c, items, at) : any_value(c);
        if (item < 0) return -1;
        item = then_ws(c, item);
    }
    int tail;
    int64_t tmin = min > k ? min - k : 0, tmax = max < 0 ? -1 : (max > k ? max - k : 0);
    if (item < 0) {
        tail = sp_gb_rule(c->b);
        empty_alt(c, tail);
    } else if (k == 0) {
        tail = repeat(c, item, comma(c), tmin, tmax);
    } else {
        int sep_item = sp_gb_rule(c->b);
        sp_gb_begin(c->b);
        sp_gb_ref(c->b, comma(c));
        sp_gb_ref(c->b, item);
        sp_gb_end(c->b, sep_item);
        tail = repeat(c, sep_item, -1, tmin, tmax);
    }
    if (tail < 0) return -1;
    if (k == 0) return container(c, "[", tail, "]");
    int body = sp_gb_rule(c->b);
    sp_gb_begin(c->b);
    int i = 0;
    for (const cJSON *p = prefix->child; p; p = p->next, i++) {
        snprintf(at, sizeof at, "%s.prefixItems[%d]", where, i);
        int v = schema_rule(c, p, at);
        if (v < 0) {
            sp_gb_end(c->b, body);
            return -1;
        }
        if (i) sp_gb_ref(c->b, comma(c));
        sp_gb_ref(c->b, then_ws(c, v));
    }
    sp_gb_ref(c->b, tail);
    sp_gb_end(c->b, body);
    return container(c, "[", body, "]");
}

static int type_rule(struct sp_jschema *c, const cJSON *s, const char *type, const char *where) {
    if (!strcmp(type, "object")) return object_rule(c, s, where);
    if (!strcmp(type, "array")) return array_rule(c, s, where);
    if (!strcmp(type, "string")) {
        const cJSON *f = get(s, "format");
        int r = cJSON_IsString(f) ? format_rule(c, f->valuestring) : -1;
        return r >= 0 ? r : string_rule(c, count_kw(s, "minLength", 0), count_kw(s, "maxLength", -1));
    }
    if (!strcmp(type, "number")) return number_rule(c, nonnegative(s));
    if (!strcmp(type, "integer")) return integer_rule(c, nonnegative(s));
    if (!strcmp(type, "boolean")) {
        if (c->boolean >= 0) return c->boolean;
        static const char *const lits[] = {"true", "false"};
        return c->boolean = literal_alts(c, sp_gb_rule(c->b), lits, 2);
    }
    if (!strcmp(type, "null")) return c->null_ >= 0 ? c->null_ : (c->null_ = lit_rule(c, "null"));
    return fail(c, where, "unknown type \"%s\"", type);
}

/* allOf over object schemas: one object schema with every property and
 * requirement. */
static const cJSON *merge_all_of(struct sp_jschema *c, const cJSON *all, const char *where) {
    cJSON *m = cJSON_CreateObject(), *props = cJSON_CreateObject(), *req = cJSON_CreateArray();
    if (!m || !props || !req) {
        cJSON_Delete(m);
        cJSON_Delete(props);
        cJSON_Delete(req);
        return fail(c, where, "out of memory"), NULL;
    }
    cJSON_AddItemToArray(c->owned, m);
    cJSON_AddStringToObject(m, "type", "object");
    cJSON_AddItemToObject(m, "properties", props);
    cJSON_AddItemToObject(m, "required", req);
    for (const cJSON *part = all->child; part; part = part->next) {
        const cJSON *p = part, *ref = get(part, "$ref");
        if (cJSON_IsString(ref) && !(p = resolve_ref(c, ref->valuestring, where))) return NULL;
        const cJSON *pp = get(p, "properties"), *pr = get(p, "required"), *t = get(p, "type"), *a = get(p, "additionalProperties");
        if (!cJSON_IsObject(p) || (t && !(cJSON_IsString(t) && !strcmp(t->valuestring, "object"))) || get(p, "anyOf") ||
            get(p, "oneOf") || get(p, "allOf"))
            return fail(c, where, "allOf is supported over object schemas only"), NULL;
        for (const cJSON *q = cJSON_IsObject(pp) ? pp->child : NULL; q; q = q->next) {
            cJSON_DeleteItemFromObjectCaseSensitive(props, q->string);
            cJSON_AddItemReferenceToObject(props, q->string, (cJSON *)q);
        }
        for (const cJSON *q = cJSON_IsArray(pr) ? pr->child : NULL; q; q = q->next)
            if (cJSON_IsString(q)) cJSON_AddItemToArray(req, cJSON_CreateString(q->valuestring));
        if (a) {
            cJSON_DeleteItemFromObjectCaseSensitive(m, "additionalProperties");
            cJSON_AddItemReferenceToObject(m, "additionalProperties", (cJSON *)a);
        }
    }
    return m;
}

static int schema_body(struct sp_jschema *c, const cJSON *s, const char *where) {
    if (cJSON_IsTrue(s)) return any_value(c);
    if (cJSON_IsFalse(s)) return fail(c, where, "the schema false allows no value");
    if (!cJSON_IsObject(s)) return fail(c, where, "a schema must be an object or a boolean");
    const cJSON *ref = get(s, "$ref");
    if (ref) {
        if (!cJSON_IsString(ref)) return fail(c, where, "'$ref' must be a string");
        return ref_rule(c, ref->valuestring, where);
    }
    const cJSON *cst = get(s, "const"), *en = get(s, "enum");
    if (cst) {
        int r = sp_gb_rule(c->b);
        return add_value_literal(c, r, cst, where) ? r : -1;
    }
    if (en) {
        if (!cJSON_IsArray(en) || !en->child) return fail(c, where, "'enum' must be a non-empty array");
        int r = sp_gb_rule(c->b);
        for (const cJSON *v = en->child; v; v = v->next)
            if (!add_value_literal(c, r, v, where)) return -1;
        return r;
    }
    const cJSON *any = get(s, "anyOf");
    if (!any) any = get(s, "oneOf");
    if (any) {
        if (!cJSON_IsArray(any) || !any->child) return fail(c, where, "'anyOf' / 'oneOf' must be a non-empty array");
        int r = sp_gb_rule(c->b), i = 0;
        for (const cJSON *v = any->child; v; v = v->next, i++) {
            char at[300];
            snprintf(at, sizeof at, "%s.%s[%d]", where, any->string, i);
            int x = schema_rule(c, v, at);
            if (x < 0) return -1;
            sp_gb_begin(c->b);
            sp_gb_ref(c->b, x);
            sp_gb_end(c->b, r);
        }
        return r;
    }
    const cJSON *all = get(s, "allOf");
    if (all) {
        if (!cJSON_IsArray(all) || !all->child) return fail(c, where, "'allOf' must be a non-empty array");
        if (!all->child->next) return schema_rule(c, all->child, where);
        const cJSON *m = merge_all_of(c, all, where);
        return m ? object_rule(c, m, where) : -1;
    }
    const cJSON *type = get(s, "type");
    if (cJSON_IsString(type)) return type_rule(c, s, type->valuestring, where);
    if (cJSON_IsArray(type)) {
        if (!type->child) return fail(c, where, "'type' is an empty list");
        int r = sp_gb_rule(c->b);
        for (const cJSON *t = type->child; t; t = t->next) {
            if (!cJSON_IsString(t)) return fail(c, where, "'type' must list type names");
            int x = type_rule(c, s, t->valuestring, where);
            if (x < 0) return -1;
            sp_gb_begin(c->b);
            sp_gb_ref(c->b, x);
            sp_gb_end(c->b, r);
        }
        return r;
    }
    if (type) return fail(c, where, "'type' must be a name or a list of names");
    /* no type: from the keywords present */
    if (get(s, "properties") || get(s, "additionalProperties") || get(s, "required")) return object_rule(c, s, where);
    if (get(s, "items") || get(s, "prefixItems")) return array_rule(c, s, where);
    if (get(s, "minLength") || get(s, "maxLength") || get(s, "format") || get(s, "pattern"))
        return type_rule(c, s, "string", where);
    return any_value(c);
}

static int schema_rule(struct sp_jschema *c, const cJSON *s, const char *where) {
    if (c->failed) return -1;
    if (c->depth >= MAX_NESTING) return fail(c, where, "schema nested deeper than %d", MAX_NESTING);
    if (sp_gb_size(c->b) > MAX_SYMBOLS) return fail(c, where, "the schema makes too large a grammar");
    c->depth++;
    int r = schema_body(c, s, where);
    c->depth--;
    if (r < 0) return -1;
    const cJSON *nullable = cJSON_IsObject(s) ? get(s, "nullable") : NULL;
    if (cJSON_IsTrue(nullable)) {
        int n = sp_gb_rule(c->b);
        sp_gb_begin(c->b);
        sp_gb_ref(c->b, r);
        sp_gb_end(c->b, n);
        sp_gb_begin(c->b);
        sp_gb_lit(c->b, "null");
        sp_gb_end(c->b, n);
        r = n;
    }
    return r;
}

int sp_jschema_rule(struct sp_jschema *c, const cJSON *schema, const char *where) {
    if (!c) return -1;
    c->root = schema;
    return schema_rule(c, schema, where);
}

enum sp_status sp_jschema_grammar(const cJSON *schema, const char *where, struct sp_grammar **out) {
    *out = NULL;
    struct sp_gbuild *b = sp_gb_new();
    struct sp_jschema *c = sp_jschema_new(b);
    if (!c) {
        sp_gb_free(b);
        return SP_ERR_NOMEM;
    }
    int v = schema ? sp_jschema_rule(c, schema, where) : sp_jschema_any_object(c);
    if (v < 0) {
        enum sp_status st = sp_errorf(SP_ERR_ARG, "%s", sp_jschema_error(c));
        sp_jschema_free(c);
        sp_gb_free(b);
        return st;
    }
    int root = sp_gb_rule(b);
    sp_gb_begin(b);
    sp_gb_ref(b, sp_jschema_ws(c));
    sp_gb_ref(b, v);
    sp_gb_end(b, root);
    sp_jschema_free(c);
    return sp_gb_finish(b, root, out);
}
