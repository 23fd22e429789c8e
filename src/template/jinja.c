/*
 * jinja.c - the Jinja evaluator: scopes, statements, expressions, and the
 * filters, tests, methods and global functions chat templates call, with
 * jinja2's semantics (see jinja.h). Every render runs under limits (loop
 * iterations, call and evaluation depth, output and memory size) so that no
 * template, however hostile, can hang or crash the caller.
 */
#include "template/jinja.h"

#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <string.h>
#include <utf8proc.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "template/jinja_parse.h"
#include "template/jinja_value.h"

#define MAX_EVAL_DEPTH 1500

struct sp_jinja {
    struct sp_jarena arena; // the tree and the normalized source
    struct sp_jnode *root;
};

/* One scope: names bound by set, for, macro parameters. */
struct frame {
    struct frame *parent;
    struct fvar {
        const char *name;
        struct sp_jv val;
    } * vars;
    int64_t n, cap;
};

struct macro {
    const char *name;
    int catch;                      // MACRO_VARARGS | MACRO_KWARGS: the body uses varargs / kwargs
    struct sp_jnode *const *params; // PARAM nodes
    int64_t nparams;
    const struct sp_jnode *body;
    struct frame *closure;
    struct sp_jv caller; // the call block's body when called from one
};

struct loop {
    const struct sp_jv *items;
    int64_t n, i;
    int depth;
};

enum { MACRO_VARARGS = 1, MACRO_KWARGS = 2 };

enum builtin { BI_RANGE = 1, BI_NAMESPACE, BI_DICT, BI_RAISE, BI_STRFTIME, BI_COUNT };

struct rt {
    struct sp_jarena a;
    struct frame *top; // template-level scope
    int64_t iters, max_iters;
    int call_depth, max_calls, eval_depth, loop_depth;
    size_t max_output;
    time_t now;
    bool utc;
    int ctl; // CTL_BREAK / CTL_CONTINUE while unwinding a loop body
};

enum { CTL_NONE, CTL_BREAK, CTL_CONTINUE };

/* Positional and keyword arguments of a call, filter or test. */
struct args {
    struct sp_jv *pos;
    int64_t npos;
    const char **kwn;
    struct sp_jv *kwv;
    int64_t nkw;
    struct sp_jv caller; // SP_JV_UNDEFINED unless a call block passes one
};

/* ---- errors --------------------------------------------------------------- */

static enum sp_status fail(int line, enum sp_status st, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static enum sp_status fail(int line, enum sp_status st, const char *fmt, ...) {
    char msg[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    return sp_errorf(st, "template line %d: %s", line, msg);
}

/* An error recorded by a helper without a line number gets one. */
static enum sp_status at_line(int line, enum sp_status st) {
    if (st != SP_OK) sp_error_prefix("template line %d: ", line);
    return st;
}

/* The UndefinedError jinja2 raises when an undefined value is used. */
static enum sp_status undefined_err(int line, struct sp_jv u) {
    if (u.s.n) return fail(line, SP_ERR_ARG, "%.*s", (int)u.s.n, u.s.p);
    return fail(line, SP_ERR_ARG, "value is undefined");
}

/* An undefined value carrying the message to raise if it is misused. */
static struct sp_jv undef_msg(struct rt *rt, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static struct sp_jv undef_msg(struct rt *rt, const char *fmt, ...) {
    char msg[256];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (n < 0) n = 0;
    if ((size_t)n >= sizeof msg) n = sizeof msg - 1;
    char *s = sp_jarena_strdup(&rt->a, msg, (size_t)n);
    struct sp_jv u = sp_jv_undef();
    if (s) u.s.p = s, u.s.n = (size_t)n;
    return u;
}

/* ---- values helpers ------------------------------------------------------- */

static enum sp_status mkstr(struct rt *rt, int line, const struct sp_buf *b, struct sp_jv *out) {
    if (b->failed) return fail(line, SP_ERR_NOMEM, "out of memory");
    char *s = sp_jarena_strdup(&rt->a, b->data ? b->data : "", b->len);
    if (!s) return at_line(line, SP_ERR_LIMIT);
    *out = sp_jv_strn(s, b->len);
    return SP_OK;
}

static enum sp_status new_list(struct rt *rt, int line, int64_t n, struct sp_jv *out) {
    return at_line(line, sp_jv_new_list(&rt->a, n, out));
}

/* str(v) as a value (strings unchanged). */
static enum sp_status to_str(struct rt *rt, int line, struct sp_jv v, struct sp_jv *out) {
    if (v.t == SP_JV_STR) {
        *out = v;
        return SP_OK;
    }
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = at_line(line, sp_jv_write_str(&b, v, rt->max_output));
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static bool is_digit_char(char c) { return c >= '0' && c <= '9'; }

static bool is_int(struct sp_jv v, int64_t *out) {
    if (v.t == SP_JV_INT)
        *out = v.i;
    else if (v.t == SP_JV_BOOL)
        *out = v.b;
    else
        return false;
    return true;
}

/* The items of an iterable as Python iterates them: list items, dict keys,
 * string characters; undefined is empty. */
static enum sp_status iterate(struct rt *rt, int line, struct sp_jv v, const struct sp_jv **items, int64_t *n) {
    switch (v.t) {
    case SP_JV_UNDEFINED:
        *items = NULL;
        *n = 0;
        return SP_OK;
    case SP_JV_LIST:
        *items = v.list->v + v.list->pos;
        *n = v.list->n - v.list->pos;
        if (v.list->kind == SP_JLIST_GEN) v.list->pos = v.list->n; // a generator is used up
        return SP_OK;
    case SP_JV_DICT: {
        struct sp_jv l;
        enum sp_status st = new_list(rt, line, v.dict->n, &l);
        if (st != SP_OK) return st;
        for (int64_t i = 0; i < v.dict->n; i++) l.list->v[i] = v.dict->e[i].key;
        *items = l.list->v;
        *n = l.list->n;
        return SP_OK;
    }
    case SP_JV_STR: {
        int64_t count = sp_utf8_count(v.s.p, v.s.n);
        struct sp_jv l;
        enum sp_status st = new_list(rt, line, count, &l);
        if (st != SP_OK) return st;
        size_t off = 0;
        for (int64_t i = 0; i < count; i++) {
            int32_t cp;
            size_t len = sp_utf8_next(v.s.p + off, v.s.n - off, &cp);
            l.list->v[i] = sp_jv_strn(v.s.p + off, len);
            off += len;
        }
        *items = l.list->v;
        *n = count;
        return SP_OK;
    }
    default:
        return fail(line, SP_ERR_ARG, "'%s' object is not iterable", sp_jv_type_name(v));
    }
}

static struct sp_jv *arg(const struct args *a, int64_t i, const char *name) {
    if (i >= 0 && i < a->npos) return &a->pos[i];
    for (int64_t k = 0; k < a->nkw; k++)
        if (name && strcmp(a->kwn[k], name) == 0) return &a->kwv[k];
    return NULL;
}

static enum sp_status arg_str(int line, const struct args *a, int64_t i, const char *name, const char *fn,
                              struct sp_jv *out, bool required) {
    struct sp_jv *v = arg(a, i, name);
    if (!v || v->t == SP_JV_NONE) {
        if (required) return fail(line, SP_ERR_ARG, "%s: missing argument '%s'", fn, name);
        out->t = SP_JV_NONE;
        return SP_OK;
    }
    if (v->t != SP_JV_STR)
        return fail(line, SP_ERR_ARG, "%s: argument '%s' must be a string, not %s", fn, name, sp_jv_type_name(*v));
    *out = *v;
    return SP_OK;
}

/* ---- scopes --------------------------------------------------------------- */

static struct frame *frame_new(struct rt *rt, struct frame *parent) {
    struct frame *f = sp_jarena_alloc(&rt->a, sizeof *f);
    if (f) f->parent = parent;
    return f;
}

static enum sp_status frame_set(struct rt *rt, struct frame *f, const char *name, struct sp_jv v) {
    for (int64_t i = f->n - 1; i >= 0; i--) {
        if (strcmp(f->vars[i].name, name) == 0) {
            f->vars[i].val = v;
            return SP_OK;
        }
    }
    if (f->n == f->cap) {
        int64_t cap = f->cap ? f->cap * 2 : 4;
        struct fvar *nv = sp_jarena_alloc(&rt->a, (size_t)cap * sizeof *nv);
        if (!nv) return SP_ERR_LIMIT;
        if (f->n) memcpy(nv, f->vars, (size_t)f->n * sizeof *nv);
        f->vars = nv;
        f->cap = cap;
    }
    f->vars[f->n++] = (struct fvar){name, v};
    return SP_OK;
}

static bool frame_get(const struct frame *f, const char *name, struct sp_jv *out) {
    for (; f; f = f->parent)
        for (int64_t i = f->n - 1; i >= 0; i--)
            if (strcmp(f->vars[i].name, name) == 0) {
                *out = f->vars[i].val;
                return true;
            }
    return false;
}

static const struct {
    const char *name;
    enum builtin id;
} BUILTINS[] = {{"range", BI_RANGE},
                {"namespace", BI_NAMESPACE},
                {"dict", BI_DICT},
                {"raise_exception", BI_RAISE},
                {"strftime_now", BI_STRFTIME}};

static struct sp_jv lookup(struct rt *rt, const struct frame *f, const char *name) {
    struct sp_jv v;
    if (frame_get(f, name, &v)) return v;
    for (size_t i = 0; i < sizeof BUILTINS / sizeof BUILTINS[0]; i++)
        if (strcmp(BUILTINS[i].name, name) == 0) return (struct sp_jv){.t = SP_JV_BUILTIN, .i = BUILTINS[i].id};
    return undef_msg(rt, "'%s' is undefined", name);
}

/* ---- forward declarations ------------------------------------------------- */

static enum sp_status eval(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_jv *out);
static enum sp_status exec(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_buf *out);
static enum sp_status call_value(struct rt *rt, int line, struct sp_jv fn, struct args *a, struct sp_jv *out);
static enum sp_status apply_filter(struct rt *rt, int line, const char *name, struct sp_jv v, struct args *a,
                                   struct sp_jv *out);
static enum sp_status apply_test(struct rt *rt, int line, const char *name, struct sp_jv v, struct args *a, bool *out);
static enum sp_status call_method(struct rt *rt, int line, struct sp_jv self, const char *name, struct args *a,
                                  struct sp_jv *out);

/* ---- attribute and item access -------------------------------------------- */

static const char *const STR_METHODS[] = {
    "startswith", "endswith",   "split",        "rsplit",       "strip",   "lstrip",  "rstrip",
    "upper",      "lower",      "title",        "capitalize",   "replace", "find",    "rfind",
    "count",      "join",       "isdigit",      "isalpha",      "isalnum", "isspace", "islower",
    "isupper",    "splitlines", "removeprefix", "removesuffix", "format",  NULL};
static const char *const DICT_METHODS[] = {"get", "items", "keys", "values", NULL};
static const char *const LIST_METHODS[] = {"count", "index", NULL};

static bool in_list(const char *const *l, const char *name) {
    for (int i = 0; l[i]; i++)
        if (strcmp(l[i], name) == 0) return true;
    return false;
}

static enum sp_status bind_method(struct rt *rt, int line, struct sp_jv self, const char *const *names,
                                  const char *name, struct sp_jv *out) {
    for (int i = 0; names[i]; i++) {
        if (strcmp(names[i], name) != 0) continue;
        struct sp_jmethod *m = sp_jarena_alloc(&rt->a, sizeof *m);
        if (!m) return at_line(line, SP_ERR_LIMIT);
        m->self = self;
        m->name = names[i];
        *out = (struct sp_jv){.t = SP_JV_METHOD, .method = m};
        return SP_OK;
    }
    return SP_ERR_NOT_FOUND;
}

static enum sp_status loop_attr(struct rt *rt, int line, const struct loop *l, const char *name, struct sp_jv self,
                                struct sp_jv *out) {
    int64_t i = l->i, n = l->n;
    if (strcmp(name, "index") == 0)
        *out = sp_jv_int(i + 1);
    else if (strcmp(name, "index0") == 0)
        *out = sp_jv_int(i);
    else if (strcmp(name, "revindex") == 0)
        *out = sp_jv_int(n - i);
    else if (strcmp(name, "revindex0") == 0)
        *out = sp_jv_int(n - i - 1);
    else if (strcmp(name, "first") == 0)
        *out = sp_jv_bool(i == 0);
    else if (strcmp(name, "last") == 0)
        *out = sp_jv_bool(i == n - 1);
    else if (strcmp(name, "length") == 0)
        *out = sp_jv_int(n);
    else if (strcmp(name, "depth") == 0)
        *out = sp_jv_int(l->depth);
    else if (strcmp(name, "depth0") == 0)
        *out = sp_jv_int(l->depth - 1);
    else if (strcmp(name, "previtem") == 0)
        *out = i > 0 ? l->items[i - 1] : undef_msg(rt, "there is no previous item");
    else if (strcmp(name, "nextitem") == 0)
        *out = i + 1 < n ? l->items[i + 1] : undef_msg(rt, "there is no next item");
    else if (strcmp(name, "cycle") == 0) {
        static const char *const m[] = {"cycle", NULL};
        return bind_method(rt, line, self, m, name, out);
    } else
        *out = undef_msg(rt, "'LoopContext object' has no attribute '%s'", name);
    return SP_OK;
}

/* obj.name, as jinja2's getattr: attributes (methods) first, then items. */
static enum sp_status get_attr(struct rt *rt, int line, struct sp_jv obj, const char *name, struct sp_jv *out) {
    enum sp_status st;
    switch (obj.t) {
    case SP_JV_UNDEFINED:
        return undefined_err(line, obj);
    case SP_JV_DICT:
        if ((st = bind_method(rt, line, obj, DICT_METHODS, name, out)) != SP_ERR_NOT_FOUND) return st;
        // fall through
    case SP_JV_NAMESPACE: {
        struct sp_jv *v = sp_jdict_get_str(obj.dict, name, strlen(name));
        *out = v ? *v : undef_msg(rt, "'dict object' has no attribute '%s'", name);
        return SP_OK;
    }
    case SP_JV_STR:
        if ((st = bind_method(rt, line, obj, STR_METHODS, name, out)) != SP_ERR_NOT_FOUND) return st;
        break;
    case SP_JV_LOOP:
        return loop_attr(rt, line, obj.ptr, name, obj, out);
    case SP_JV_LIST:
        if (sp_jv_is_seq(obj) && (st = bind_method(rt, line, obj, LIST_METHODS, name, out)) != SP_ERR_NOT_FOUND)
            return st;
        break;
    default:
        break;
    }
    *out = undef_msg(rt, "'%s object' has no attribute '%s'", sp_jv_type_name(obj), name);
    return SP_OK;
}

/* obj[key], as jinja2's getitem: items first, then attributes. */
static enum sp_status get_item(struct rt *rt, int line, struct sp_jv obj, struct sp_jv key, struct sp_jv *out) {
    int64_t k;
    switch (obj.t) {
    case SP_JV_UNDEFINED:
        return undefined_err(line, obj);
    case SP_JV_LIST:
        if (obj.list->kind != SP_JLIST_LIST) break; // generators and views cannot be indexed
        if (is_int(key, &k)) {
            if (k < 0) k += obj.list->n;
            *out = (k >= 0 && k < obj.list->n) ? obj.list->v[k] : undef_msg(rt, "list index out of range");
            return SP_OK;
        }
        break;
    case SP_JV_STR:
        if (is_int(key, &k)) {
            int64_t len = sp_utf8_count(obj.s.p, obj.s.n);
            if (k < 0) k += len;
            if (k < 0 || k >= len) {
                *out = undef_msg(rt, "string index out of range");
                return SP_OK;
            }
            size_t off = sp_utf8_offset(obj.s.p, obj.s.n, k);
            int32_t cp;
            size_t l = sp_utf8_next(obj.s.p + off, obj.s.n - off, &cp);
            *out = sp_jv_strn(obj.s.p + off, l);
            return SP_OK;
        }
        break;
    case SP_JV_DICT:
    case SP_JV_NAMESPACE: {
        struct sp_jv *v = sp_jdict_get(obj.dict, key);
        if (v) {
            *out = *v;
            return SP_OK;
        }
        break;
    }
    default:
        break;
    }
    if (key.t == SP_JV_STR && obj.t != SP_JV_NONE) {
        char *name = sp_jarena_strdup(&rt->a, key.s.p, key.s.n);
        if (!name) return at_line(line, SP_ERR_LIMIT);
        if (strlen(name) == key.s.n) return get_attr(rt, line, obj, name, out);
    }
    *out = undef_msg(rt, "'%s object' has no item of that key", sp_jv_type_name(obj));
    return SP_OK;
}

/* Python's slice index adjustment: sets the first index and item count. */
static enum sp_status slice_bounds(int line, int64_t len, const struct sp_jv *sv, int64_t *start, int64_t *step,
                                   int64_t *count) {
    int64_t v[3];
    bool has[3];
    for (int i = 0; i < 3; i++) {
        has[i] = sv[i].t != SP_JV_NONE && sv[i].t != SP_JV_UNDEFINED;
        if (has[i] && !is_int(sv[i], &v[i]))
            return fail(line, SP_ERR_ARG, "slice indices must be integers or None, not %s", sp_jv_type_name(sv[i]));
    }
    int64_t st = has[2] ? v[2] : 1;
    if (st == 0) return fail(line, SP_ERR_ARG, "slice step cannot be zero");
    int64_t lo, hi;
    if (st > 0) {
        lo = 0;
        hi = len;
    } else {
        lo = len - 1;
        hi = -1;
    }
    for (int i = 0; i < 2; i++) {
        if (!has[i]) continue;
        int64_t x = v[i];
        if (x < 0) {
            x += len;
            if (x < 0) x = st < 0 ? -1 : 0;
        } else if (x >= len) {
            x = st < 0 ? len - 1 : len;
        }
        if (i == 0)
            lo = x;
        else
            hi = x;
    }
    int64_t c = 0;
    if (st > 0 && lo < hi) c = (hi - lo - 1) / st + 1;
    if (st < 0 && hi < lo) c = (lo - hi - 1) / (-st) + 1;
    *start = lo;
    *step = st;
    *count = c;
    return SP_OK;
}

static enum sp_status do_slice(struct rt *rt, int line, struct sp_jv obj, const struct sp_jv *sv, struct sp_jv *out) {
    int64_t start, step, count;
    enum sp_status st;
    if (obj.t == SP_JV_UNDEFINED) return undefined_err(line, obj);
    if (sp_jv_is_seq(obj)) {
        if ((st = slice_bounds(line, obj.list->n, sv, &start, &step, &count)) != SP_OK) return st;
        if ((st = new_list(rt, line, count, out)) != SP_OK) return st;
        out->list->tuple = obj.list->tuple;
        for (int64_t i = 0; i < count; i++) out->list->v[i] = obj.list->v[start + i * step];
        return SP_OK;
    }
    if (obj.t == SP_JV_STR) {
        const struct sp_jv *chars;
        int64_t n;
        if ((st = iterate(rt, line, obj, &chars, &n)) != SP_OK) return st;
        if ((st = slice_bounds(line, n, sv, &start, &step, &count)) != SP_OK) return st;
        struct sp_buf b = SP_BUF_INIT;
        for (int64_t i = 0; i < count; i++) sp_buf_append(&b, chars[start + i * step].s.p, chars[start + i * step].s.n);
        st = mkstr(rt, line, &b, out);
        sp_buf_free(&b);
        return st;
    }
    // Slices bypass jinja2's getitem, so Python's TypeError comes through.
    return fail(line, SP_ERR_ARG, "'%s' object is not subscriptable", sp_jv_type_name(obj));
}

/* ---- operators ------------------------------------------------------------ */

static enum sp_status check_output(int line, struct rt *rt, const struct sp_buf *b);

static enum sp_status check_defined(int line, struct sp_jv a, struct sp_jv b) {
    if (a.t == SP_JV_UNDEFINED) return undefined_err(line, a);
    if (b.t == SP_JV_UNDEFINED) return undefined_err(line, b);
    return SP_OK;
}

static const char *op_text(int op) {
    static const char *const t[SP_JOP_COUNT] = {
        [SP_JOP_ADD] = "+",       [SP_JOP_SUB] = "-", [SP_JOP_MUL] = "*",  [SP_JOP_DIV] = "/",
        [SP_JOP_FLOORDIV] = "//", [SP_JOP_MOD] = "%", [SP_JOP_POW] = "**", [SP_JOP_CONCAT] = "~",
        [SP_JOP_EQ] = "==",       [SP_JOP_NE] = "!=", [SP_JOP_LT] = "<",   [SP_JOP_LE] = "<=",
        [SP_JOP_GT] = ">",        [SP_JOP_GE] = ">=", [SP_JOP_IN] = "in",  [SP_JOP_NOTIN] = "not in"};
    return op > 0 && op < SP_JOP_COUNT ? t[op] : "?";
}

static enum sp_status repeat(struct rt *rt, int line, struct sp_jv seq, int64_t times, struct sp_jv *out) {
    if (times < 0) times = 0;
    enum sp_status st;
    if (seq.t == SP_JV_STR) {
        if (seq.s.n && (uint64_t)times > rt->max_output / seq.s.n)
            return fail(line, SP_ERR_LIMIT, "string repetition exceeds the output limit");
        struct sp_buf b = SP_BUF_INIT;
        for (int64_t i = 0; i < times; i++) sp_buf_append(&b, seq.s.p, seq.s.n);
        st = mkstr(rt, line, &b, out);
        sp_buf_free(&b);
        return st;
    }
    int64_t n = seq.list->n;
    if (n && times > rt->max_iters / n) return fail(line, SP_ERR_LIMIT, "list repetition too large");
    if ((st = new_list(rt, line, n * times, out)) != SP_OK) return st;
    out->list->tuple = seq.list->tuple;
    for (int64_t i = 0; i < times; i++)
        if (n) memcpy(out->list->v + i * n, seq.list->v, (size_t)n * sizeof *seq.list->v);
    return SP_OK;
}

static double py_fmod(double a, double b) {
    double m = fmod(a, b);
    if (m != 0 && ((m < 0) != (b < 0))) m += b;
    return m;
}

/* Python's printf-style `fmt % args`: args is a tuple of positional values,
 * a dict for %(name)s fields, or a single value. Supports the s r d i f F e
 * E g G x X o c conversions with flags, width and precision. */
static enum sp_status percent_format(struct rt *rt, int line, struct sp_jv fmt, struct sp_jv args, struct sp_jv *out) {
    const struct sp_jv *pos = &args;
    int64_t npos = 1, next = 0;
    if (args.t == SP_JV_LIST && args.list->tuple) {
        pos = args.list->v;
        npos = args.list->n;
    }
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = SP_OK;
    const char *p = fmt.s.p, *end = fmt.s.p + fmt.s.n;
    while (p < end && st == SP_OK) {
        if (*p != '%') {
            sp_buf_putc(&b, *p++);
            continue;
        }
        if (++p >= end) {
            st = fail(line, SP_ERR_ARG, "incomplete format");
            break;
        }
        const struct sp_jv *v = NULL;
        if (*p == '(') {
            const char *close = memchr(p, ')', (size_t)(end - p));
            if (!close || args.t != SP_JV_DICT) {
                st = fail(line, SP_ERR_ARG, "format requires a mapping");
                break;
            }
            v = sp_jdict_get_str(args.dict, p + 1, (size_t)(close - p - 1));
            if (!v) {
                st = fail(line, SP_ERR_ARG, "format: key '%.*s' not found", (int)(close - p - 1), p + 1);
                break;
            }
            p = close + 1;
        }
        char spec[32] = "%";
        size_t sl = 1;
        while (p < end && strchr("-+ #0", *p) && sl < 8) spec[sl++] = *p++;
        int width = 0, prec = -1;
        while (p < end && *p >= '0' && *p <= '9' && width < 10000) width = width * 10 + (*p++ - '0');
        if (p < end && *p == '.') {
            prec = 0;
            for (p++; p < end && *p >= '0' && *p <= '9' && prec < 10000;) prec = prec * 10 + (*p++ - '0');
        }
        if (p >= end) {
            st = fail(line, SP_ERR_ARG, "incomplete format");
            break;
        }
        char conv = *p++;
        if (conv == '%') {
            sp_buf_putc(&b, '%');
            continue;
        }
        if (!v) {
            if (next >= npos) {
                st = fail(line, SP_ERR_ARG, "not enough arguments for format string");
                break;
            }
            v = &pos[next++];
        }
        double d;
        int64_t k;
        switch (conv) {
        case 's':
        case 'r': {
            struct sp_buf t = SP_BUF_INIT;
            st = at_line(line, conv == 's' ? sp_jv_write_str(&t, *v, rt->max_output)
                                           : sp_jv_write_repr(&t, *v, rt->max_output));
            if (st != SP_OK) {
                sp_buf_free(&t);
                break;
            }
            size_t len = t.len;
            if (prec >= 0) len = sp_utf8_offset(t.data ? t.data : "", t.len, prec);
            int64_t chars = sp_utf8_count(t.data ? t.data : "", len);
            bool left = memchr(spec, '-', sl) != NULL;
            if (!left)
                for (int64_t i = chars; i < width; i++) sp_buf_putc(&b, ' ');
            sp_buf_append(&b, t.data ? t.data : "", len);
            if (left)
                for (int64_t i = chars; i < width; i++) sp_buf_putc(&b, ' ');
            sp_buf_free(&t);
            break;
        }
        case 'd':
        case 'i':
        case 'x':
        case 'X':
        case 'o':
        case 'c':
            if (v->t == SP_JV_FLOAT && conv != 'c' && isfinite(v->f) && fabs(v->f) < 9.2e18)
                k = (int64_t)v->f;
            else if (!is_int(*v, &k)) {
                st = fail(line, SP_ERR_ARG, "%%%c format: a number is required, not %s", conv, sp_jv_type_name(*v));
                break;
            }
            if (conv == 'c') {
                sp_utf8_put(&b, (int32_t)k);
                break;
            }
            if (prec < 0)
                snprintf(spec + sl, sizeof spec - sl, "%dll%c", width, conv == 'i' ? 'd' : conv);
            else
                snprintf(spec + sl, sizeof spec - sl, "%d.%dll%c", width, prec, conv == 'i' ? 'd' : conv);
            sp_buf_printf(&b, spec, (long long)k);
            break;
        case 'f':
        case 'F':
        case 'e':
        case 'E':
        case 'g':
        case 'G':
            if (!sp_jv_number(*v, &d)) {
                st = fail(line, SP_ERR_ARG, "must be real number, not %s", sp_jv_type_name(*v));
                break;
            }
            snprintf(spec + sl, sizeof spec - sl, "%d.%d%c", width, prec < 0 ? 6 : prec, conv);
            sp_buf_printf(&b, spec, d);
            break;
        default:
            st = fail(line, SP_ERR_ARG, "unsupported format character '%c'", conv);
        }
        if (st == SP_OK) st = check_output(line, rt, &b);
    }
    // Python skips the check for anything with __getitem__ but a tuple or str.
    bool mapping = args.t == SP_JV_DICT || (args.t == SP_JV_LIST && !args.list->tuple);
    if (st == SP_OK && next < npos && !mapping)
        st = fail(line, SP_ERR_ARG, "not all arguments converted during string formatting");
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status arith(struct rt *rt, int line, int op, struct sp_jv a, struct sp_jv b, struct sp_jv *out) {
    enum sp_status st;
    if (op == SP_JOP_CONCAT) {
        struct sp_buf buf = SP_BUF_INIT;
        st = at_line(line, sp_jv_write_str(&buf, a, rt->max_output));
        if (st == SP_OK) st = at_line(line, sp_jv_write_str(&buf, b, rt->max_output));
        if (st == SP_OK) st = mkstr(rt, line, &buf, out);
        sp_buf_free(&buf);
        return st;
    }
    if ((st = check_defined(line, a, b)) != SP_OK) return st;
    int64_t ia = 0, ib = 0;
    double da = 0, db = 0;
    bool ints = is_int(a, &ia) && is_int(b, &ib);
    bool nums = sp_jv_number(a, &da) && sp_jv_number(b, &db);
    switch (op) {
    case SP_JOP_ADD:
        if (ints) {
            int64_t r;
            if (__builtin_add_overflow(ia, ib, &r)) return fail(line, SP_ERR_ARG, "integer overflow");
            *out = sp_jv_int(r);
            return SP_OK;
        }
        if (nums) {
            *out = sp_jv_float(da + db);
            return SP_OK;
        }
        if (a.t == SP_JV_STR && b.t == SP_JV_STR) {
            if (a.s.n + b.s.n > rt->max_output) return fail(line, SP_ERR_LIMIT, "string exceeds the output limit");
            char *s = sp_jarena_alloc(&rt->a, a.s.n + b.s.n + 1);
            if (!s) return at_line(line, SP_ERR_LIMIT);
            if (a.s.n) memcpy(s, a.s.p, a.s.n);
            if (b.s.n) memcpy(s + a.s.n, b.s.p, b.s.n);
            *out = sp_jv_strn(s, a.s.n + b.s.n);
            return SP_OK;
        }
        if (sp_jv_is_seq(a) && sp_jv_is_seq(b) && a.list->tuple == b.list->tuple) {
            if ((st = new_list(rt, line, a.list->n + b.list->n, out)) != SP_OK) return st;
            out->list->tuple = a.list->tuple;
            if (a.list->n) memcpy(out->list->v, a.list->v, (size_t)a.list->n * sizeof *a.list->v);
            if (b.list->n) memcpy(out->list->v + a.list->n, b.list->v, (size_t)b.list->n * sizeof *b.list->v);
            return SP_OK;
        }
        if (a.t == SP_JV_STR)
            return fail(line, SP_ERR_ARG, "can only concatenate str (not \"%s\") to str", sp_jv_type_name(b));
        break;
    case SP_JOP_SUB:
        if (ints) {
            int64_t r;
            if (__builtin_sub_overflow(ia, ib, &r)) return fail(line, SP_ERR_ARG, "integer overflow");
            *out = sp_jv_int(r);
            return SP_OK;
        }
        if (nums) {
            *out = sp_jv_float(da - db);
            return SP_OK;
        }
        break;
    case SP_JOP_MUL:
        if (ints) {
            int64_t r;
            if (__builtin_mul_overflow(ia, ib, &r)) return fail(line, SP_ERR_ARG, "integer overflow");
            *out = sp_jv_int(r);
            return SP_OK;
        }
        if (nums) {
            *out = sp_jv_float(da * db);
            return SP_OK;
        }
        if ((a.t == SP_JV_STR || sp_jv_is_seq(a)) && is_int(b, &ib)) return repeat(rt, line, a, ib, out);
        if ((b.t == SP_JV_STR || sp_jv_is_seq(b)) && is_int(a, &ia)) return repeat(rt, line, b, ia, out);
        break;
    case SP_JOP_DIV:
        if (nums) {
            if (db == 0) return fail(line, SP_ERR_ARG, "division by zero");
            *out = sp_jv_float(da / db);
            return SP_OK;
        }
        break;
    case SP_JOP_FLOORDIV:
    case SP_JOP_MOD:
        if (op == SP_JOP_MOD && a.t == SP_JV_STR) return percent_format(rt, line, a, b, out);
        if (ints) {
            if (ib == 0) return fail(line, SP_ERR_ARG, "integer division or modulo by zero");
            if (ia == INT64_MIN && ib == -1) return fail(line, SP_ERR_ARG, "integer overflow");
            int64_t q = ia / ib, r = ia % ib;
            if (r != 0 && ((r < 0) != (ib < 0))) {
                q--;
                r += ib;
            }
            *out = sp_jv_int(op == SP_JOP_MOD ? r : q);
            return SP_OK;
        }
        if (nums) {
            if (db == 0) return fail(line, SP_ERR_ARG, "float division or modulo by zero");
            *out = sp_jv_float(op == SP_JOP_MOD ? py_fmod(da, db) : floor(da / db));
            return SP_OK;
        }
        break;
    case SP_JOP_POW:
        if (ints && ib >= 0) {
            int64_t r = 1, base = ia;
            for (int64_t e = ib; e > 0; e >>= 1) {
                if ((e & 1) && __builtin_mul_overflow(r, base, &r)) return fail(line, SP_ERR_ARG, "integer overflow");
                if (e > 1 && __builtin_mul_overflow(base, base, &base))
                    return fail(line, SP_ERR_ARG, "integer overflow");
            }
            *out = sp_jv_int(r);
            return SP_OK;
        }
        if (nums) {
            if (da == 0 && db < 0) return fail(line, SP_ERR_ARG, "0.0 cannot be raised to a negative power");
            *out = sp_jv_float(pow(da, db));
            return SP_OK;
        }
        break;
    default:
        break;
    }
    return fail(line, SP_ERR_ARG, "unsupported operand type(s) for %s: '%s' and '%s'", op_text(op), sp_jv_type_name(a),
                sp_jv_type_name(b));
}

/* Python's `item in container`. */
static enum sp_status contains(int line, struct sp_jv container, struct sp_jv item, bool *out) {
    switch (container.t) {
    case SP_JV_UNDEFINED:
        *out = false;
        return SP_OK;
    case SP_JV_STR:
        if (item.t != SP_JV_STR)
            return fail(line, SP_ERR_ARG, "'in <string>' requires string as left operand, not %s",
                        sp_jv_type_name(item));
        *out = item.s.n == 0 || memmem(container.s.p, container.s.n, item.s.p, item.s.n) != NULL;
        return SP_OK;
    case SP_JV_LIST: {
        struct sp_jlist *l = container.list;
        int64_t i = l->pos;
        *out = false;
        for (; i < l->n && !*out; i++) *out = sp_jv_equal(l->v[i], item);
        if (l->kind == SP_JLIST_GEN) l->pos = i; // a generator is consumed up to the match
        return SP_OK;
    }
    case SP_JV_DICT:
    case SP_JV_NAMESPACE:
        if (item.t == SP_JV_DICT || (item.t == SP_JV_LIST && !item.list->tuple))
            return fail(line, SP_ERR_ARG, "unhashable type: '%s'", sp_jv_type_name(item));
        *out = sp_jdict_get(container.dict, item) != NULL;
        return SP_OK;
    default:
        return fail(line, SP_ERR_ARG, "argument of type '%s' is not iterable", sp_jv_type_name(container));
    }
}

static enum sp_status compare(int line, int op, struct sp_jv a, struct sp_jv b, bool *out) {
    switch (op) {
    case SP_JOP_EQ:
        *out = sp_jv_equal(a, b);
        return SP_OK;
    case SP_JOP_NE:
        *out = !sp_jv_equal(a, b);
        return SP_OK;
    case SP_JOP_IN:
        return contains(line, b, a, out);
    case SP_JOP_NOTIN: {
        enum sp_status st = contains(line, b, a, out);
        *out = !*out;
        return st;
    }
    default:
        break;
    }
    enum sp_status st = check_defined(line, a, b);
    if (st != SP_OK) return st;
    int c;
    if (!sp_jv_compare(a, b, &c))
        return fail(line, SP_ERR_ARG, "'%s' not supported between instances of '%s' and '%s'", op_text(op),
                    sp_jv_type_name(a), sp_jv_type_name(b));
    switch (op) {
    case SP_JOP_LT:
        *out = c == -1;
        break;
    case SP_JOP_LE:
        *out = c == -1 || c == 0;
        break;
    case SP_JOP_GT:
        *out = c == 1;
        break;
    default:
        *out = c == 1 || c == 0;
        break;
    }
    return SP_OK;
}

/* ---- expressions ---------------------------------------------------------- */

/* Evaluates call arguments (KWARG nodes become keywords). */
static enum sp_status eval_args(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct args *a) {
    memset(a, 0, sizeof *a);
    int64_t nk = 0;
    for (int64_t i = 0; i < n->nkids; i++) nk += n->kids[i]->kind == SP_JN_KWARG;
    if (n->nkids) {
        a->pos = sp_jarena_alloc(&rt->a, (size_t)(n->nkids - nk) * sizeof *a->pos + 1);
        a->kwv = sp_jarena_alloc(&rt->a, (size_t)nk * sizeof *a->kwv + 1);
        a->kwn = sp_jarena_alloc(&rt->a, (size_t)nk * sizeof *a->kwn + 1);
        if (!a->pos || !a->kwv || !a->kwn) return at_line(n->line, SP_ERR_LIMIT);
    }
    enum sp_status st;
    for (int64_t i = 0; i < n->nkids; i++) {
        const struct sp_jnode *k = n->kids[i];
        if (k->kind == SP_JN_KWARG) {
            a->kwn[a->nkw] = k->str;
            if ((st = eval(rt, k->a, f, &a->kwv[a->nkw])) != SP_OK) return st;
            a->nkw++;
        } else {
            if (a->nkw) return fail(k->line, SP_ERR_ARG, "positional argument follows keyword argument");
            if ((st = eval(rt, k, f, &a->pos[a->npos])) != SP_OK) return st;
            a->npos++;
        }
    }
    return SP_OK;
}

static enum sp_status eval_call(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_jv caller,
                                struct sp_jv *out) {
    struct sp_jv fn;
    enum sp_status st;
    if ((st = eval(rt, n->a, f, &fn)) != SP_OK) return st;
    struct args a;
    if ((st = eval_args(rt, n, f, &a)) != SP_OK) return st;
    a.caller = caller;
    return call_value(rt, n->line, fn, &a, out);
}

static enum sp_status eval(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_jv *out) {
    enum sp_status st = SP_OK;
    if (++rt->eval_depth > MAX_EVAL_DEPTH) return fail(n->line, SP_ERR_LIMIT, "expression nested too deeply");
    struct sp_jv a, b;
    switch (n->kind) {
    case SP_JN_LITERAL:
        *out = n->val;
        break;
    case SP_JN_NAME:
        *out = lookup(rt, f, n->str);
        break;
    case SP_JN_ATTR:
        if ((st = eval(rt, n->a, f, &a)) != SP_OK) break;
        st = get_attr(rt, n->line, a, n->str, out);
        break;
    case SP_JN_ITEM:
        if ((st = eval(rt, n->a, f, &a)) != SP_OK || (st = eval(rt, n->b, f, &b)) != SP_OK) break;
        st = get_item(rt, n->line, a, b, out);
        break;
    case SP_JN_SLICE: {
        struct sp_jv sv[3] = {sp_jv_none(), sp_jv_none(), sp_jv_none()};
        if ((st = eval(rt, n->a, f, &a)) != SP_OK) break;
        for (int i = 0; i < 3 && st == SP_OK; i++)
            if (n->kids[i]) st = eval(rt, n->kids[i], f, &sv[i]);
        if (st == SP_OK) st = do_slice(rt, n->line, a, sv, out);
        break;
    }
    case SP_JN_CALL:
        st = eval_call(rt, n, f, sp_jv_undef(), out);
        break;
    case SP_JN_FILTER: {
        struct args args;
        if ((st = eval(rt, n->a, f, &a)) != SP_OK || (st = eval_args(rt, n, f, &args)) != SP_OK) break;
        st = apply_filter(rt, n->line, n->str, a, &args, out);
        break;
    }
    case SP_JN_TEST: {
        struct args args;
        bool r;
        if ((st = eval(rt, n->a, f, &a)) != SP_OK || (st = eval_args(rt, n, f, &args)) != SP_OK) break;
        if ((st = apply_test(rt, n->line, n->str, a, &args, &r)) != SP_OK) break;
        *out = sp_jv_bool(n->op ? !r : r);
        break;
    }
    case SP_JN_UNARY:
        if ((st = eval(rt, n->a, f, &a)) != SP_OK) break;
        if (n->op == 'n') {
            *out = sp_jv_bool(!sp_jv_truthy(a));
        } else if (a.t == SP_JV_UNDEFINED) {
            st = undefined_err(n->line, a);
        } else if (a.t == SP_JV_FLOAT) {
            *out = sp_jv_float(n->op == '-' ? -a.f : a.f);
        } else if (is_int(a, &a.i)) {
            if (n->op == '-' && a.i == INT64_MIN)
                st = fail(n->line, SP_ERR_ARG, "integer overflow");
            else
                *out = sp_jv_int(n->op == '-' ? -a.i : a.i);
        } else {
            st = fail(n->line, SP_ERR_ARG, "bad operand type for unary %c: '%s'", n->op, sp_jv_type_name(a));
        }
        break;
    case SP_JN_BINARY:
        if ((st = eval(rt, n->a, f, &a)) != SP_OK || (st = eval(rt, n->b, f, &b)) != SP_OK) break;
        st = arith(rt, n->line, n->op, a, b, out);
        break;
    case SP_JN_COMPARE: {
        if ((st = eval(rt, n->a, f, &a)) != SP_OK) break;
        bool r = true;
        for (int64_t i = 0; i < n->nkids && r; i++) {
            const struct sp_jnode *o = n->kids[i];
            if ((st = eval(rt, o->a, f, &b)) != SP_OK) break;
            if ((st = compare(o->line, o->op, a, b, &r)) != SP_OK) break;
            a = b;
        }
        *out = sp_jv_bool(r);
        break;
    }
    case SP_JN_AND:
    case SP_JN_OR:
        if ((st = eval(rt, n->a, f, &a)) != SP_OK) break;
        if (sp_jv_truthy(a) == (n->kind == SP_JN_OR))
            *out = a;
        else
            st = eval(rt, n->b, f, out);
        break;
    case SP_JN_COND:
        if ((st = eval(rt, n->b, f, &a)) != SP_OK) break;
        if (sp_jv_truthy(a))
            st = eval(rt, n->a, f, out);
        else if (n->c)
            st = eval(rt, n->c, f, out);
        else
            *out = undef_msg(rt, "the inline if-expression evaluated to false and no else section was defined");
        break;
    case SP_JN_LIST:
    case SP_JN_TUPLE:
        if ((st = new_list(rt, n->line, n->nkids, out)) != SP_OK) break;
        out->list->tuple = n->kind == SP_JN_TUPLE;
        for (int64_t i = 0; i < n->nkids && st == SP_OK; i++) st = eval(rt, n->kids[i], f, &out->list->v[i]);
        break;
    case SP_JN_DICT:
        if ((st = at_line(n->line, sp_jv_new_dict(&rt->a, SP_JV_DICT, out))) != SP_OK) break;
        for (int64_t i = 0; i < n->nkids && st == SP_OK; i++) {
            if ((st = eval(rt, n->kids[i]->a, f, &a)) != SP_OK || (st = eval(rt, n->kids[i]->b, f, &b)) != SP_OK) break;
            if (a.t == SP_JV_LIST || a.t == SP_JV_DICT || a.t == SP_JV_NAMESPACE)
                st = fail(n->line, SP_ERR_ARG, "unhashable type: '%s'", sp_jv_type_name(a));
            else
                st = at_line(n->line, sp_jdict_set(&rt->a, out->dict, a, b));
        }
        break;
    default:
        st = fail(n->line, SP_ERR_STATE, "statement used as an expression");
        break;
    }
    rt->eval_depth--;
    return st;
}

/* ---- calls ---------------------------------------------------------------- */

static enum sp_status check_output(int line, struct rt *rt, const struct sp_buf *b) {
    if (b->failed) return fail(line, SP_ERR_NOMEM, "out of memory");
    if (b->len > rt->max_output)
        return fail(line, SP_ERR_LIMIT, "output exceeds the limit of %zu bytes", rt->max_output);
    return SP_OK;
}

static enum sp_status call_macro(struct rt *rt, int line, const struct macro *m, struct args *a, struct sp_jv *out) {
    if (rt->call_depth >= rt->max_calls)
        return fail(line, SP_ERR_LIMIT, "macro calls nested deeper than %d", rt->max_calls);
    if (a->npos > m->nparams && !(m->catch & MACRO_VARARGS))
        return fail(line, SP_ERR_ARG, "macro '%s' takes not more than %lld argument(s)", m->name,
                    (long long)m->nparams);
    struct frame *mf = frame_new(rt, m->closure);
    if (!mf) return at_line(line, SP_ERR_LIMIT);
    enum sp_status st = SP_OK;
    // A body that mentions varargs / kwargs collects the extra arguments there.
    struct sp_jv varargs, kwargs;
    if ((st = new_list(rt, line, a->npos > m->nparams ? a->npos - m->nparams : 0, &varargs)) != SP_OK) return st;
    varargs.list->tuple = true;
    for (int64_t i = m->nparams; i < a->npos; i++) varargs.list->v[i - m->nparams] = a->pos[i];
    if ((st = at_line(line, sp_jv_new_dict(&rt->a, SP_JV_DICT, &kwargs))) != SP_OK) return st;
    for (int64_t k = 0; k < a->nkw; k++) {
        bool known = false;
        for (int64_t i = 0; i < m->nparams && !known; i++) known = strcmp(m->params[i]->str, a->kwn[k]) == 0;
        if (known) continue;
        if (!(m->catch & MACRO_KWARGS))
            return fail(line, SP_ERR_ARG, "macro '%s' takes no keyword argument '%s'", m->name, a->kwn[k]);
        if ((st = at_line(line, sp_jdict_set(&rt->a, kwargs.dict, sp_jv_cstr(a->kwn[k]), a->kwv[k]))) != SP_OK)
            return st;
    }
    if (m->catch & MACRO_VARARGS) st = at_line(line, frame_set(rt, mf, "varargs", varargs));
    if (st == SP_OK && (m->catch & MACRO_KWARGS)) st = at_line(line, frame_set(rt, mf, "kwargs", kwargs));
    for (int64_t i = 0; i < m->nparams && st == SP_OK; i++) {
        const struct sp_jnode *p = m->params[i];
        struct sp_jv v;
        struct sp_jv *given = i < a->npos ? &a->pos[i] : NULL;
        for (int64_t k = 0; k < a->nkw && !given; k++)
            if (strcmp(a->kwn[k], p->str) == 0) given = &a->kwv[k];
        if (given)
            v = *given;
        else if (p->a)
            st = eval(rt, p->a, mf, &v);
        else
            v = undef_msg(rt, "parameter '%s' was not provided", p->str);
        if (st == SP_OK) st = at_line(line, frame_set(rt, mf, p->str, v));
    }
    if (st == SP_OK && a->caller.t != SP_JV_UNDEFINED) st = at_line(line, frame_set(rt, mf, "caller", a->caller));
    if (st != SP_OK) return st;
    struct sp_buf b = SP_BUF_INIT;
    int saved_loops = rt->loop_depth;
    rt->loop_depth = 0;
    rt->call_depth++;
    st = exec(rt, m->body, mf, &b);
    rt->call_depth--;
    rt->loop_depth = saved_loops;
    rt->ctl = CTL_NONE;
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status builtin_strftime(struct rt *rt, int line, struct args *a, struct sp_jv *out) {
    struct sp_jv fmt;
    enum sp_status st = arg_str(line, a, 0, "format", "strftime_now", &fmt, true);
    if (st != SP_OK) return st;
    char *cfmt = sp_jarena_strdup(&rt->a, fmt.s.p, fmt.s.n);
    if (!cfmt) return at_line(line, SP_ERR_LIMIT);
    time_t now = rt->now ? rt->now : time(NULL);
    struct tm tm;
    if (rt->utc)
        gmtime_r(&now, &tm);
    else
        localtime_r(&now, &tm);
    char buf[512];
    size_t n = fmt.s.n ? strftime(buf, sizeof buf, cfmt, &tm) : 0;
    if (fmt.s.n && n == 0) return fail(line, SP_ERR_ARG, "strftime_now: format gives no text or too much");
    char *s = sp_jarena_strdup(&rt->a, buf, n);
    if (!s) return at_line(line, SP_ERR_LIMIT);
    *out = sp_jv_strn(s, n);
    return SP_OK;
}

static enum sp_status call_builtin(struct rt *rt, int line, enum builtin id, struct args *a, struct sp_jv *out) {
    enum sp_status st;
    switch (id) {
    case BI_RANGE: {
        int64_t v[3] = {0, 0, 1};
        if (a->npos < 1 || a->npos > 3) return fail(line, SP_ERR_ARG, "range expected 1 to 3 arguments");
        for (int64_t i = 0; i < a->npos; i++)
            if (!is_int(a->pos[i], &v[a->npos == 1 ? 1 : i]))
                return fail(line, SP_ERR_ARG, "range: '%s' object cannot be interpreted as an integer",
                            sp_jv_type_name(a->pos[i]));
        if (v[2] == 0) return fail(line, SP_ERR_ARG, "range() arg 3 must not be zero");
        double count = ceil(((double)v[1] - (double)v[0]) / (double)v[2]);
        if (count < 0) count = 0;
        if (count > (double)rt->max_iters)
            return fail(line, SP_ERR_LIMIT, "range of %.0f items exceeds the loop limit", count);
        if ((st = new_list(rt, line, (int64_t)count, out)) != SP_OK) return st;
        for (int64_t i = 0; i < out->list->n; i++) out->list->v[i] = sp_jv_int(v[0] + i * v[2]);
        return SP_OK;
    }
    case BI_NAMESPACE:
    case BI_DICT: {
        if ((st = at_line(line, sp_jv_new_dict(&rt->a, id == BI_DICT ? SP_JV_DICT : SP_JV_NAMESPACE, out))) != SP_OK)
            return st;
        for (int64_t i = 0; i < a->npos; i++) {
            if (a->pos[i].t != SP_JV_DICT)
                return fail(line, SP_ERR_ARG, "%s: positional argument must be a dict",
                            id == BI_DICT ? "dict" : "namespace");
            for (int64_t k = 0; k < a->pos[i].dict->n; k++)
                if ((st = at_line(line, sp_jdict_set(&rt->a, out->dict, a->pos[i].dict->e[k].key,
                                                     a->pos[i].dict->e[k].val))) != SP_OK)
                    return st;
        }
        for (int64_t k = 0; k < a->nkw; k++)
            if ((st = at_line(line, sp_jdict_set(&rt->a, out->dict, sp_jv_cstr(a->kwn[k]), a->kwv[k]))) != SP_OK)
                return st;
        return SP_OK;
    }
    case BI_RAISE: {
        struct sp_buf b = SP_BUF_INIT;
        if (a->npos) sp_jv_write_str(&b, a->pos[0], 4096); // the message; a partial one will do
        st = fail(line, SP_ERR_ARG, "raise_exception: %s", b.data ? b.data : "");
        sp_buf_free(&b);
        return st;
    }
    case BI_STRFTIME:
        return builtin_strftime(rt, line, a, out);
    default:
        return fail(line, SP_ERR_STATE, "unknown builtin");
    }
}

static enum sp_status call_value(struct rt *rt, int line, struct sp_jv fn, struct args *a, struct sp_jv *out) {
    switch (fn.t) {
    case SP_JV_MACRO:
        return call_macro(rt, line, fn.ptr, a, out);
    case SP_JV_BUILTIN:
        return call_builtin(rt, line, (enum builtin)fn.i, a, out);
    case SP_JV_METHOD:
        return call_method(rt, line, fn.method->self, fn.method->name, a, out);
    case SP_JV_UNDEFINED:
        return undefined_err(line, fn);
    default:
        return fail(line, SP_ERR_ARG, "'%s' object is not callable", sp_jv_type_name(fn));
    }
}

/* ---- string helpers ------------------------------------------------------- */

static bool in_chars(int32_t cp, const struct sp_jv *chars) {
    if (!chars || chars->t != SP_JV_STR) return sp_unicode_isspace(cp);
    size_t i = 0;
    while (i < chars->s.n) {
        int32_t c;
        i += sp_utf8_next(chars->s.p + i, chars->s.n - i, &c);
        if (c == cp) return true;
    }
    return false;
}

/* Python str.strip/lstrip/rstrip with an optional set of characters. */
static struct sp_jv strip(struct sp_jv s, const struct sp_jv *chars, bool left, bool right) {
    size_t b = 0, e = s.s.n;
    if (left) {
        while (b < e) {
            int32_t cp;
            size_t l = sp_utf8_next(s.s.p + b, e - b, &cp);
            if (!in_chars(cp, chars)) break;
            b += l;
        }
    }
    if (right) {
        while (e > b) {
            size_t k = e - 1;
            while (k > b && ((unsigned char)s.s.p[k] & 0xc0) == 0x80 && e - k < 4) k--;
            int32_t cp;
            sp_utf8_next(s.s.p + k, e - k, &cp);
            if (!in_chars(cp, chars)) break;
            e = k;
        }
    }
    return sp_jv_strn(s.s.p + b, e - b);
}

enum casing { CASE_UPPER, CASE_LOWER, CASE_TITLE, CASE_CAPITALIZE, CASE_JINJA_TITLE };

static bool is_cased(int32_t cp) {
    utf8proc_category_t c = utf8proc_category(cp);
    return c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT;
}

static enum sp_status recase(struct rt *rt, int line, struct sp_jv s, enum casing how, struct sp_jv *out) {
    struct sp_buf b = SP_BUF_INIT;
    size_t i = 0;
    bool prev_cased = false, first = true, word_start = true;
    while (i < s.s.n) {
        int32_t cp;
        i += sp_utf8_next(s.s.p + i, s.s.n - i, &cp);
        int32_t r = cp;
        switch (how) {
        case CASE_UPPER:
            r = utf8proc_toupper(cp);
            break;
        case CASE_LOWER:
            r = utf8proc_tolower(cp);
            break;
        case CASE_TITLE:
            r = prev_cased ? utf8proc_tolower(cp) : utf8proc_totitle(cp);
            prev_cased = is_cased(cp);
            break;
        case CASE_CAPITALIZE:
            r = first ? utf8proc_totitle(cp) : utf8proc_tolower(cp);
            break;
        case CASE_JINJA_TITLE: {
            // jinja2's title filter: words start after '-', whitespace or an opening bracket.
            bool sep = cp == '-' || cp == '(' || cp == '{' || cp == '[' || cp == '<' || sp_unicode_isspace(cp);
            r = sep ? cp : word_start ? utf8proc_toupper(cp) : utf8proc_tolower(cp);
            word_start = sep;
            break;
        }
        }
        first = false;
        sp_utf8_put(&b, r);
    }
    enum sp_status st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

/* Python str.split / str.rsplit. sep NONE: runs of whitespace. */
static enum sp_status split(struct rt *rt, int line, struct sp_jv s, struct sp_jv sep, int64_t maxsplit,
                            bool from_right, struct sp_jv *out) {
    struct sp_jv parts[64];
    struct sp_jv *v = parts;
    int64_t n = 0, cap = 64;
    enum sp_status st = SP_OK;
    if (sep.t == SP_JV_STR && sep.s.n == 0) return fail(line, SP_ERR_ARG, "empty separator");
#define ADD(x)                                                                                                         \
    do {                                                                                                               \
        if (n == cap) {                                                                                                \
            struct sp_jv *nv = sp_jarena_alloc(&rt->a, (size_t)cap * 2 * sizeof *nv);                                  \
            if (!nv) return at_line(line, SP_ERR_LIMIT);                                                               \
            memcpy(nv, v, (size_t)n * sizeof *v);                                                                      \
            v = nv;                                                                                                    \
            cap *= 2;                                                                                                  \
        }                                                                                                              \
        v[n++] = (x);                                                                                                  \
    } while (0)
    const char *p = s.s.p;
    size_t len = s.s.n;
    if (sep.t != SP_JV_STR) {
        if (!from_right) {
            size_t i = 0;
            for (;;) {
                while (i < len) {
                    int32_t cp;
                    size_t l = sp_utf8_next(p + i, len - i, &cp);
                    if (!sp_unicode_isspace(cp)) break;
                    i += l;
                }
                if (i >= len) break;
                if (maxsplit >= 0 && n >= maxsplit) {
                    ADD(sp_jv_strn(p + i, len - i));
                    break;
                }
                size_t j = i;
                while (j < len) {
                    int32_t cp;
                    size_t l = sp_utf8_next(p + j, len - j, &cp);
                    if (sp_unicode_isspace(cp)) break;
                    j += l;
                }
                ADD(sp_jv_strn(p + i, j - i));
                i = j;
            }
        } else {
            size_t e = len;
            for (;;) {
                struct sp_jv t = strip(sp_jv_strn(p, e), NULL, false, true);
                e = t.s.n;
                if (e == 0) break;
                if (maxsplit >= 0 && n >= maxsplit) {
                    ADD(t);
                    break;
                }
                size_t k = e;
                while (k > 0) {
                    size_t q = k - 1;
                    while (q > 0 && ((unsigned char)p[q] & 0xc0) == 0x80 && k - q < 4) q--;
                    int32_t cp;
                    sp_utf8_next(p + q, k - q, &cp);
                    if (sp_unicode_isspace(cp)) break;
                    k = q;
                }
                ADD(sp_jv_strn(p + k, e - k));
                e = k;
            }
        }
    } else if (!from_right) {
        size_t i = 0;
        for (;;) {
            const char *hit = (maxsplit < 0 || n < maxsplit) ? memmem(p + i, len - i, sep.s.p, sep.s.n) : NULL;
            if (!hit) {
                ADD(sp_jv_strn(p + i, len - i));
                break;
            }
            ADD(sp_jv_strn(p + i, (size_t)(hit - (p + i))));
            i = (size_t)(hit - p) + sep.s.n;
        }
    } else {
        size_t e = len;
        for (;;) {
            const char *hit = NULL;
            if ((maxsplit < 0 || n < maxsplit) && e >= sep.s.n) {
                for (size_t k = e - sep.s.n + 1; k-- > 0;)
                    if (memcmp(p + k, sep.s.p, sep.s.n) == 0) {
                        hit = p + k;
                        break;
                    }
            }
            if (!hit) {
                ADD(sp_jv_strn(p, e));
                break;
            }
            size_t after = (size_t)(hit - p) + sep.s.n;
            ADD(sp_jv_strn(p + after, e - after));
            e = (size_t)(hit - p);
        }
    }
#undef ADD
    if ((st = new_list(rt, line, n, out)) != SP_OK) return st;
    for (int64_t i = 0; i < n; i++) out->list->v[i] = from_right ? v[n - 1 - i] : v[i];
    return SP_OK;
}

static enum sp_status replace(struct rt *rt, int line, struct sp_jv s, struct sp_jv old, struct sp_jv new_,
                              int64_t count, struct sp_jv *out) {
    struct sp_buf b = SP_BUF_INIT;
    size_t i = 0;
    int64_t done = 0;
    if (old.s.n == 0) {
        // Python inserts the replacement around every character.
        while (count < 0 || done < count) {
            sp_buf_append(&b, new_.s.p, new_.s.n);
            done++;
            if (i >= s.s.n) break;
            int32_t cp;
            size_t l = sp_utf8_next(s.s.p + i, s.s.n - i, &cp);
            sp_buf_append(&b, s.s.p + i, l);
            i += l;
            if (b.len > rt->max_output) break;
        }
        sp_buf_append(&b, s.s.p + i, s.s.n - i);
    } else {
        while (i <= s.s.n && (count < 0 || done < count)) {
            const char *hit = memmem(s.s.p + i, s.s.n - i, old.s.p, old.s.n);
            if (!hit) break;
            sp_buf_append(&b, s.s.p + i, (size_t)(hit - (s.s.p + i)));
            sp_buf_append(&b, new_.s.p, new_.s.n);
            i = (size_t)(hit - s.s.p) + old.s.n;
            done++;
            if (b.len > rt->max_output) break;
        }
        sp_buf_append(&b, s.s.p + i, s.s.n - i);
    }
    enum sp_status st = check_output(line, rt, &b);
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

/* Python's str.startswith / endswith: prefix may be a tuple of strings. */
static enum sp_status affix(int line, struct sp_jv s, struct sp_jv x, bool end, bool *out) {
    if (x.t == SP_JV_LIST && x.list->tuple) {
        *out = false;
        for (int64_t i = 0; i < x.list->n && !*out; i++) {
            enum sp_status st = affix(line, s, x.list->v[i], end, out);
            if (st != SP_OK) return st;
        }
        return SP_OK;
    }
    if (x.t != SP_JV_STR)
        return fail(line, SP_ERR_ARG, "%s first arg must be str or a tuple of str, not %s",
                    end ? "endswith" : "startswith", sp_jv_type_name(x));
    *out = x.s.n <= s.s.n && memcmp(s.s.p + (end ? s.s.n - x.s.n : 0), x.s.p, x.s.n) == 0;
    return SP_OK;
}

static bool all_chars(struct sp_jv s, int kind) {
    if (s.s.n == 0) return false;
    bool any_cased = false;
    size_t i = 0;
    while (i < s.s.n) {
        int32_t cp;
        i += sp_utf8_next(s.s.p + i, s.s.n - i, &cp);
        utf8proc_category_t c = utf8proc_category(cp);
        bool letter = c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_LO;
        bool digit = c == UTF8PROC_CATEGORY_ND;
        switch (kind) {
        case 'd':
            if (!digit) return false;
            break;
        case 'a':
            if (!letter) return false;
            break;
        case 'n':
            if (!letter && !digit && c != UTF8PROC_CATEGORY_NL && c != UTF8PROC_CATEGORY_NO) return false;
            break;
        case 's':
            if (!sp_unicode_isspace(cp)) return false;
            break;
        case 'l':
            if (c == UTF8PROC_CATEGORY_LU || c == UTF8PROC_CATEGORY_LT) return false;
            any_cased |= c == UTF8PROC_CATEGORY_LL;
            break;
        case 'u':
            if (c == UTF8PROC_CATEGORY_LL || c == UTF8PROC_CATEGORY_LT) return false;
            any_cased |= c == UTF8PROC_CATEGORY_LU;
            break;
        }
    }
    return (kind == 'l' || kind == 'u') ? any_cased : true;
}

/* str.format with {} / {0} / {name} fields and {{ }} escapes; no format specs. */
static enum sp_status str_format(struct rt *rt, int line, struct sp_jv s, struct args *a, struct sp_jv *out) {
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = SP_OK;
    int64_t auto_idx = 0;
    for (size_t i = 0; i < s.s.n && st == SP_OK; i++) {
        char c = s.s.p[i];
        if ((c == '{' || c == '}') && i + 1 < s.s.n && s.s.p[i + 1] == c) {
            sp_buf_putc(&b, c);
            i++;
            continue;
        }
        if (c == '}') {
            st = fail(line, SP_ERR_ARG, "format: single '}' encountered in format string");
            break;
        }
        if (c != '{') {
            sp_buf_putc(&b, c);
            continue;
        }
        const char *close = memchr(s.s.p + i, '}', s.s.n - i);
        if (!close) {
            st = fail(line, SP_ERR_ARG, "format: single '{' encountered in format string");
            break;
        }
        const char *f0 = s.s.p + i + 1;
        size_t fl = (size_t)(close - f0);
        struct sp_jv *v = NULL;
        if (fl == 0) {
            v = arg(a, auto_idx++, NULL);
        } else if (f0[0] >= '0' && f0[0] <= '9') {
            v = arg(a, strtoll(f0, NULL, 10), NULL);
        } else {
            for (int64_t k = 0; k < a->nkw && !v; k++)
                if (strlen(a->kwn[k]) == fl && memcmp(a->kwn[k], f0, fl) == 0) v = &a->kwv[k];
        }
        if (!v || memchr(f0, ':', fl) || memchr(f0, '!', fl)) {
            st = fail(line, SP_ERR_ARG, "format: unsupported or missing field '{%.*s}'", (int)fl, f0);
            break;
        }
        if ((st = at_line(line, sp_jv_write_str(&b, *v, rt->max_output))) != SP_OK) break;
        i = (size_t)(close - s.s.p);
    }
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status str_method(struct rt *rt, int line, struct sp_jv s, const char *name, struct args *a,
                                 struct sp_jv *out) {
    enum sp_status st;
    struct sp_jv x, y;
    bool r;
    if (strcmp(name, "startswith") == 0 || strcmp(name, "endswith") == 0) {
        struct sp_jv *p = arg(a, 0, "prefix");
        if (!p) return fail(line, SP_ERR_ARG, "%s: missing argument", name);
        if ((st = affix(line, s, *p, name[0] == 'e', &r)) != SP_OK) return st;
        *out = sp_jv_bool(r);
        return SP_OK;
    }
    if (strcmp(name, "split") == 0 || strcmp(name, "rsplit") == 0) {
        struct sp_jv *sep = arg(a, 0, "sep"), *ms = arg(a, 1, "maxsplit");
        int64_t maxsplit = -1;
        if (ms && !is_int(*ms, &maxsplit)) return fail(line, SP_ERR_ARG, "%s: maxsplit must be an integer", name);
        if (sep && sep->t != SP_JV_STR && sep->t != SP_JV_NONE)
            return fail(line, SP_ERR_ARG, "%s: separator must be str or None", name);
        return split(rt, line, s, sep ? *sep : sp_jv_none(), maxsplit, name[0] == 'r', out);
    }
    if (strcmp(name, "strip") == 0 || strcmp(name, "lstrip") == 0 || strcmp(name, "rstrip") == 0) {
        if ((st = arg_str(line, a, 0, "chars", name, &x, false)) != SP_OK) return st;
        *out = strip(s, &x, name[0] != 'r', name[0] != 'l');
        return SP_OK;
    }
    if (strcmp(name, "upper") == 0) return recase(rt, line, s, CASE_UPPER, out);
    if (strcmp(name, "lower") == 0) return recase(rt, line, s, CASE_LOWER, out);
    if (strcmp(name, "title") == 0) return recase(rt, line, s, CASE_TITLE, out);
    if (strcmp(name, "capitalize") == 0) return recase(rt, line, s, CASE_CAPITALIZE, out);
    if (strcmp(name, "replace") == 0) {
        if ((st = arg_str(line, a, 0, "old", name, &x, true)) != SP_OK) return st;
        if ((st = arg_str(line, a, 1, "new", name, &y, true)) != SP_OK) return st;
        struct sp_jv *c = arg(a, 2, "count");
        int64_t count = -1;
        if (c && !is_int(*c, &count)) return fail(line, SP_ERR_ARG, "replace: count must be an integer");
        return replace(rt, line, s, x, y, count, out);
    }
    if (strcmp(name, "find") == 0 || strcmp(name, "rfind") == 0 || strcmp(name, "count") == 0) {
        if ((st = arg_str(line, a, 0, "sub", name, &x, true)) != SP_OK) return st;
        if (name[0] == 'c') {
            int64_t c = 0;
            if (x.s.n == 0) {
                c = sp_utf8_count(s.s.p, s.s.n) + 1;
            } else {
                for (size_t i = 0; i + x.s.n <= s.s.n;) {
                    const char *h = memmem(s.s.p + i, s.s.n - i, x.s.p, x.s.n);
                    if (!h) break;
                    c++;
                    i = (size_t)(h - s.s.p) + x.s.n;
                }
            }
            *out = sp_jv_int(c);
            return SP_OK;
        }
        const char *hit = NULL;
        if (name[0] == 'f') {
            hit = memmem(s.s.p, s.s.n, x.s.p, x.s.n);
            if (!hit && x.s.n == 0) hit = s.s.p;
        } else {
            for (size_t k = s.s.n >= x.s.n ? s.s.n - x.s.n + 1 : 0; k-- > 0;)
                if (memcmp(s.s.p + k, x.s.p, x.s.n) == 0) {
                    hit = s.s.p + k;
                    break;
                }
        }
        *out = sp_jv_int(hit ? sp_utf8_count(s.s.p, (size_t)(hit - s.s.p)) : -1);
        return SP_OK;
    }
    if (strcmp(name, "join") == 0) {
        struct sp_jv *it = arg(a, 0, "iterable");
        if (!it) return fail(line, SP_ERR_ARG, "join: missing argument");
        const struct sp_jv *items;
        int64_t n;
        if ((st = iterate(rt, line, *it, &items, &n)) != SP_OK) return st;
        struct sp_buf b = SP_BUF_INIT;
        for (int64_t i = 0; i < n; i++) {
            if (items[i].t != SP_JV_STR) {
                sp_buf_free(&b);
                return fail(line, SP_ERR_ARG, "join: sequence item %lld: expected str instance, %s found", (long long)i,
                            sp_jv_type_name(items[i]));
            }
            if (i) sp_buf_append(&b, s.s.p, s.s.n);
            sp_buf_append(&b, items[i].s.p, items[i].s.n);
        }
        st = check_output(line, rt, &b);
        if (st == SP_OK) st = mkstr(rt, line, &b, out);
        sp_buf_free(&b);
        return st;
    }
    if (strcmp(name, "isdigit") == 0 || strcmp(name, "isalpha") == 0 || strcmp(name, "isalnum") == 0 ||
        strcmp(name, "isspace") == 0 || strcmp(name, "islower") == 0 || strcmp(name, "isupper") == 0) {
        int kind = name[2] == 'd'   ? 'd'
                   : name[2] == 's' ? 's'
                   : name[2] == 'l' ? 'l'
                   : name[2] == 'u' ? 'u'
                   : name[4] == 'p' ? 'a'
                                    : 'n';
        *out = sp_jv_bool(all_chars(s, kind));
        return SP_OK;
    }
    if (strcmp(name, "splitlines") == 0) {
        struct sp_jv parts;
        if ((st = split(rt, line, s, sp_jv_cstr("\n"), -1, false, &parts)) != SP_OK) return st;
        if (parts.list->n && parts.list->v[parts.list->n - 1].s.n == 0) parts.list->n--;
        for (int64_t i = 0; i < parts.list->n; i++) {
            struct sp_jv *p = &parts.list->v[i];
            if (p->s.n && p->s.p[p->s.n - 1] == '\r') p->s.n--;
        }
        *out = parts;
        return SP_OK;
    }
    if (strcmp(name, "removeprefix") == 0 || strcmp(name, "removesuffix") == 0) {
        if ((st = arg_str(line, a, 0, "affix", name, &x, true)) != SP_OK) return st;
        bool suffix = name[6] == 's';
        if ((st = affix(line, s, x, suffix, &r)) != SP_OK) return st;
        *out = r ? sp_jv_strn(s.s.p + (suffix ? 0 : x.s.n), s.s.n - x.s.n) : s;
        return SP_OK;
    }
    if (strcmp(name, "format") == 0) return str_format(rt, line, s, a, out);
    return fail(line, SP_ERR_ARG, "'str' object has no attribute '%s'", name);
}

static enum sp_status dict_method(struct rt *rt, int line, struct sp_jv d, const char *name, struct args *a,
                                  struct sp_jv *out) {
    enum sp_status st;
    const struct sp_jdict *dict = d.dict;
    if (strcmp(name, "get") == 0) {
        struct sp_jv *k = arg(a, 0, "key"), *def = arg(a, 1, "default");
        if (!k) return fail(line, SP_ERR_ARG, "get expected at least 1 argument, got 0");
        struct sp_jv *v = sp_jdict_get(dict, *k);
        *out = v ? *v : def ? *def : sp_jv_none();
        return SP_OK;
    }
    if (strcmp(name, "keys") == 0 || strcmp(name, "values") == 0 || strcmp(name, "items") == 0) {
        if ((st = new_list(rt, line, dict->n, out)) != SP_OK) return st;
        out->list->kind = name[0] == 'k' ? SP_JLIST_KEYS : name[0] == 'v' ? SP_JLIST_VALUES : SP_JLIST_ITEMS;
        for (int64_t i = 0; i < dict->n; i++) {
            if (name[0] == 'k') {
                out->list->v[i] = dict->e[i].key;
            } else if (name[0] == 'v') {
                out->list->v[i] = dict->e[i].val;
            } else {
                struct sp_jv pair;
                if ((st = new_list(rt, line, 2, &pair)) != SP_OK) return st;
                pair.list->tuple = true;
                pair.list->v[0] = dict->e[i].key;
                pair.list->v[1] = dict->e[i].val;
                out->list->v[i] = pair;
            }
        }
        return SP_OK;
    }
    return fail(line, SP_ERR_ARG, "'dict' object has no attribute '%s'", name);
}

static enum sp_status call_method(struct rt *rt, int line, struct sp_jv self, const char *name, struct args *a,
                                  struct sp_jv *out) {
    if (self.t == SP_JV_STR) return str_method(rt, line, self, name, a, out);
    if (self.t == SP_JV_DICT) return dict_method(rt, line, self, name, a, out);
    if (self.t == SP_JV_LIST && (strcmp(name, "count") == 0 || strcmp(name, "index") == 0)) {
        struct sp_jv *x = arg(a, 0, NULL);
        if (!x) return fail(line, SP_ERR_ARG, "%s() takes exactly one argument (0 given)", name);
        int64_t count = 0;
        for (int64_t i = 0; i < self.list->n; i++) {
            if (!sp_jv_equal(self.list->v[i], *x)) continue;
            if (name[0] == 'i') {
                *out = sp_jv_int(i);
                return SP_OK;
            }
            count++;
        }
        if (name[0] == 'i') return fail(line, SP_ERR_ARG, "list.index(x): x not in list");
        *out = sp_jv_int(count);
        return SP_OK;
    }
    if (self.t == SP_JV_LOOP && strcmp(name, "cycle") == 0) {
        const struct loop *l = self.ptr;
        if (a->npos == 0) return fail(line, SP_ERR_ARG, "no items for cycling given");
        *out = a->pos[l->i % a->npos];
        return SP_OK;
    }
    return fail(line, SP_ERR_ARG, "'%s' object has no attribute '%s'", sp_jv_type_name(self), name);
}

/* ---- tests ---------------------------------------------------------------- */

static const char *const TEST_NAMES[] = {"defined",  "undefined", "none",   "boolean", "false",       "true",
                                         "integer",  "float",     "number", "string",  "mapping",     "iterable",
                                         "sequence", "callable",  "odd",    "even",    "divisibleby", "eq",
                                         "equalto",  "==",        "ne",     "!=",      "lt",          "lessthan",
                                         "<",        "le",        "<=",     "gt",      "greaterthan", ">",
                                         "ge",       ">=",        "in",     "lower",   "upper",       "sameas",
                                         "escaped",  "filter",    "test",   NULL};

static const char *const FILTER_NAMES[];

static enum sp_status apply_test(struct rt *rt, int line, const char *name, struct sp_jv v, struct args *a, bool *out) {
    struct sp_jv *x = arg(a, 0, NULL);
    int64_t i;
    enum sp_jv_type t = v.t;
    if (strcmp(name, "defined") == 0)
        *out = t != SP_JV_UNDEFINED;
    else if (strcmp(name, "undefined") == 0)
        *out = t == SP_JV_UNDEFINED;
    else if (strcmp(name, "none") == 0)
        *out = t == SP_JV_NONE;
    else if (strcmp(name, "boolean") == 0)
        *out = t == SP_JV_BOOL;
    else if (strcmp(name, "false") == 0)
        *out = t == SP_JV_BOOL && !v.b;
    else if (strcmp(name, "true") == 0)
        *out = t == SP_JV_BOOL && v.b;
    else if (strcmp(name, "integer") == 0)
        *out = t == SP_JV_INT;
    else if (strcmp(name, "float") == 0)
        *out = t == SP_JV_FLOAT;
    else if (strcmp(name, "number") == 0)
        *out = t == SP_JV_INT || t == SP_JV_FLOAT || t == SP_JV_BOOL;
    else if (strcmp(name, "string") == 0)
        *out = t == SP_JV_STR;
    else if (strcmp(name, "mapping") == 0)
        *out = t == SP_JV_DICT;
    else if (strcmp(name, "iterable") == 0)
        *out = t == SP_JV_STR || t == SP_JV_LIST || t == SP_JV_DICT || t == SP_JV_UNDEFINED || t == SP_JV_LOOP;
    else if (strcmp(name, "sequence") == 0)
        *out = t == SP_JV_STR || sp_jv_is_seq(v) || t == SP_JV_DICT || t == SP_JV_UNDEFINED;
    else if (strcmp(name, "callable") == 0) // jinja2's Undefined defines __call__ (to raise)
        *out = t == SP_JV_MACRO || t == SP_JV_BUILTIN || t == SP_JV_METHOD || t == SP_JV_UNDEFINED;
    else if (strcmp(name, "escaped") == 0)
        *out = false;
    else if (strcmp(name, "odd") == 0 || strcmp(name, "even") == 0) {
        // value % 2 == 1 (odd) or == 0 (even), with Python's modulo.
        double d;
        if (is_int(v, &i))
            *out = name[0] == 'o' ? (i % 2 != 0) : (i % 2 == 0);
        else if (sp_jv_number(v, &d))
            *out = py_fmod(d, 2.0) == (name[0] == 'o' ? 1.0 : 0.0);
        else if (t == SP_JV_STR) {
            // str % 2 is string formatting; its result never equals a number.
            struct sp_jv r;
            enum sp_status st = percent_format(rt, line, v, sp_jv_int(2), &r);
            if (st != SP_OK) return st;
            *out = false;
        } else
            return fail(line, SP_ERR_ARG, "%s test: unsupported operand type(s) for %%: '%s' and 'int'", name,
                        sp_jv_type_name(v));
    } else if (strcmp(name, "divisibleby") == 0) {
        int64_t d;
        double fv, fd;
        if (!x) return fail(line, SP_ERR_ARG, "divisibleby test needs an argument");
        if (is_int(v, &i) && is_int(*x, &d)) {
            if (d == 0) return fail(line, SP_ERR_ARG, "integer division or modulo by zero");
            *out = d == -1 || i % d == 0;
        } else if (sp_jv_number(v, &fv) && sp_jv_number(*x, &fd)) {
            if (fd == 0) return fail(line, SP_ERR_ARG, "float modulo");
            *out = py_fmod(fv, fd) == 0;
        } else {
            return fail(line, SP_ERR_ARG, "divisibleby test: unsupported operand types '%s' and '%s'",
                        sp_jv_type_name(v), sp_jv_type_name(*x));
        }
    } else if (strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0) {
        struct sp_jv sv; // str(value).islower() / isupper()
        enum sp_status st = to_str(rt, line, v, &sv);
        if (st != SP_OK) return st;
        *out = all_chars(sv, name[0] == 'l' ? 'l' : 'u');
    } else if (strcmp(name, "sameas") == 0) {
        if (!x) return fail(line, SP_ERR_ARG, "sameas test needs an argument");
        bool scalar = t == SP_JV_NONE || t == SP_JV_BOOL || t == SP_JV_UNDEFINED || t == SP_JV_INT;
        *out = x->t == t &&
               (scalar ? sp_jv_equal(v, *x) : (t == SP_JV_STR ? v.s.p == x->s.p && v.s.n == x->s.n : v.ptr == x->ptr));
    } else if (strcmp(name, "in") == 0) {
        if (!x) return fail(line, SP_ERR_ARG, "in test needs an argument");
        return contains(line, *x, v, out);
    } else if (strcmp(name, "filter") == 0 || strcmp(name, "test") == 0) {
        *out = t == SP_JV_STR && v.s.n < 64 && memchr(v.s.p, 0, v.s.n) == NULL;
        if (*out) {
            char nm[64];
            memcpy(nm, v.s.p, v.s.n);
            nm[v.s.n] = 0;
            *out = in_list(name[0] == 'f' ? FILTER_NAMES : TEST_NAMES, nm);
        }
    } else {
        static const struct {
            const char *name;
            int op;
        } cmp[] = {{"eq", SP_JOP_EQ}, {"equalto", SP_JOP_EQ}, {"==", SP_JOP_EQ},       {"ne", SP_JOP_NE},
                   {"!=", SP_JOP_NE}, {"lt", SP_JOP_LT},      {"lessthan", SP_JOP_LT}, {"<", SP_JOP_LT},
                   {"le", SP_JOP_LE}, {"<=", SP_JOP_LE},      {"gt", SP_JOP_GT},       {"greaterthan", SP_JOP_GT},
                   {">", SP_JOP_GT},  {"ge", SP_JOP_GE},      {">=", SP_JOP_GE}};
        for (size_t k = 0; k < sizeof cmp / sizeof cmp[0]; k++) {
            if (strcmp(cmp[k].name, name) != 0) continue;
            if (!x) return fail(line, SP_ERR_ARG, "%s test needs an argument", name);
            return compare(line, cmp[k].op, v, *x, out);
        }
        return fail(line, SP_ERR_ARG, "no test named '%s'", name);
    }
    return SP_OK;
}

/* ---- filters -------------------------------------------------------------- */

static const char *const FILTER_NAMES[] = {
    "abs",    "attr",       "capitalize", "count",  "default",    "d",       "escape",  "e",     "first",
    "float",  "indent",     "int",        "items",  "join",       "last",    "length",  "list",  "lower",
    "map",    "max",        "min",        "reject", "rejectattr", "replace", "reverse", "round", "safe",
    "select", "selectattr", "sort",       "string", "sum",        "title",   "tojson",  "trim",  "unique",
    "upper",  "wordcount",  "dictsort",   "batch",  "format",     NULL};

static enum sp_status length_of(int line, struct sp_jv v, int64_t *n) {
    switch (v.t) {
    case SP_JV_UNDEFINED:
        *n = 0;
        return SP_OK;
    case SP_JV_STR:
        *n = sp_utf8_count(v.s.p, v.s.n);
        return SP_OK;
    case SP_JV_LIST:
        if (v.list->kind == SP_JLIST_GEN) break;
        *n = v.list->n;
        return SP_OK;
    case SP_JV_DICT:
        *n = v.dict->n;
        return SP_OK;
    default:
        break;
    }
    return fail(line, SP_ERR_ARG, "object of type '%s' has no len()", sp_jv_type_name(v));
}

/* Resolves a dotted attribute path ("a.b", "0") on an item, as jinja2's
 * make_attrgetter does. */
static enum sp_status attr_path(struct rt *rt, int line, struct sp_jv item, struct sp_jv path, struct sp_jv *out) {
    if (path.t == SP_JV_INT) return get_item(rt, line, item, path, out);
    if (path.t != SP_JV_STR) return fail(line, SP_ERR_ARG, "attribute must be a string");
    size_t i = 0;
    *out = item;
    while (i <= path.s.n) {
        const char *dot = memchr(path.s.p + i, '.', path.s.n - i);
        size_t e = dot ? (size_t)(dot - path.s.p) : path.s.n;
        struct sp_jv key = sp_jv_strn(path.s.p + i, e - i);
        bool digits = e > i;
        for (size_t k = i; k < e; k++) digits &= is_digit_char(path.s.p[k]);
        if (digits) key = sp_jv_int(strtoll(path.s.p + i, NULL, 10));
        enum sp_status st = get_item(rt, line, *out, key, out);
        if (st != SP_OK) return st;
        if (!dot) break;
        i = e + 1;
    }
    return SP_OK;
}

/* Sort keys: the attribute (if any), lowercased when comparing strings
 * case-insensitively. */
static enum sp_status sort_key(struct rt *rt, int line, struct sp_jv item, struct sp_jv *attr, bool case_sensitive,
                               struct sp_jv *out) {
    enum sp_status st = SP_OK;
    *out = item;
    if (attr && attr->t != SP_JV_NONE && (st = attr_path(rt, line, item, *attr, out)) != SP_OK) return st;
    if (!case_sensitive && out->t == SP_JV_STR) st = recase(rt, line, *out, CASE_LOWER, out);
    return st;
}

/* Stable merge sort of items by keys; fails on keys Python cannot order. */
static enum sp_status merge_sort(int line, struct sp_jv *items, struct sp_jv *keys, int64_t n, bool reverse,
                                 struct sp_jv *tmp_i, struct sp_jv *tmp_k) {
    for (int64_t width = 1; width < n; width *= 2) {
        for (int64_t lo = 0; lo < n; lo += 2 * width) {
            int64_t mid = lo + width < n ? lo + width : n, hi = lo + 2 * width < n ? lo + 2 * width : n;
            int64_t i = lo, j = mid, o = lo;
            while (i < mid || j < hi) {
                bool take_right = false;
                if (i < mid && j < hi) {
                    int c;
                    if (!sp_jv_compare(keys[j], keys[i], &c))
                        return fail(line, SP_ERR_ARG, "'<' not supported between instances of '%s' and '%s'",
                                    sp_jv_type_name(keys[j]), sp_jv_type_name(keys[i]));
                    take_right = reverse ? c == 1 : c == -1;
                } else {
                    take_right = i >= mid;
                }
                int64_t from = take_right ? j++ : i++;
                tmp_i[o] = items[from];
                tmp_k[o++] = keys[from];
            }
        }
        memcpy(items, tmp_i, (size_t)n * sizeof *items);
        memcpy(keys, tmp_k, (size_t)n * sizeof *keys);
    }
    return SP_OK;
}

static enum sp_status filter_sort(struct rt *rt, int line, struct sp_jv v, struct args *a, bool minmax, bool is_max,
                                  struct sp_jv *out) {
    const struct sp_jv *items;
    int64_t n;
    enum sp_status st;
    if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
    struct sp_jv *rev = arg(a, minmax ? -1 : 0, "reverse"), *cs = arg(a, minmax ? 0 : 1, "case_sensitive"),
                 *attr = arg(a, minmax ? 1 : 2, "attribute");
    bool reverse = rev && sp_jv_truthy(*rev), case_sensitive = cs && sp_jv_truthy(*cs);
    struct sp_jv l;
    if ((st = new_list(rt, line, n, &l)) != SP_OK) return st;
    struct sp_jv *keys = sp_jarena_alloc(&rt->a, (size_t)n * 3 * sizeof *keys + 1);
    if (!keys) return at_line(line, SP_ERR_LIMIT);
    for (int64_t i = 0; i < n; i++) {
        l.list->v[i] = items[i];
        if ((st = sort_key(rt, line, items[i], attr, case_sensitive, &keys[i])) != SP_OK) return st;
    }
    if ((st = merge_sort(line, l.list->v, keys, n, reverse, keys + n, keys + 2 * n)) != SP_OK) return st;
    if (minmax) {
        *out = n == 0 ? undef_msg(rt, "No aggregated item, sequence was empty.") : l.list->v[is_max ? n - 1 : 0];
        if (is_max && n) {
            // max() returns the first of equal maxima, as Python does.
            int64_t k = n - 1;
            while (k > 0 && sp_jv_equal(keys[k - 1], keys[n - 1])) k--;
            *out = l.list->v[k];
        }
        return SP_OK;
    }
    *out = l;
    return SP_OK;
}

/* select / reject / selectattr / rejectattr. */
static enum sp_status filter_select(struct rt *rt, int line, struct sp_jv v, struct args *a, bool by_attr, bool keep,
                                    struct sp_jv *out) {
    const struct sp_jv *items;
    int64_t n;
    enum sp_status st;
    if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
    int64_t first = by_attr ? 1 : 0;
    if (by_attr && a->npos < 1) return fail(line, SP_ERR_ARG, "selectattr/rejectattr need an attribute");
    const char *test = NULL;
    char tname[64];
    if (a->npos > first) {
        struct sp_jv t = a->pos[first];
        if (t.t != SP_JV_STR || t.s.n >= sizeof tname) return fail(line, SP_ERR_ARG, "test name must be a string");
        memcpy(tname, t.s.p, t.s.n);
        tname[t.s.n] = 0;
        test = tname;
    }
    struct args ta = {0};
    if (a->npos > first + 1) ta = (struct args){.pos = a->pos + first + 1, .npos = a->npos - first - 1};
    struct sp_jv l;
    if ((st = new_list(rt, line, n, &l)) != SP_OK) return st;
    int64_t m = 0;
    for (int64_t i = 0; i < n; i++) {
        struct sp_jv x = items[i];
        if (by_attr && (st = attr_path(rt, line, x, a->pos[0], &x)) != SP_OK) return st;
        bool r;
        if (test) {
            if ((st = apply_test(rt, line, test, x, &ta, &r)) != SP_OK) return st;
        } else {
            r = sp_jv_truthy(x);
        }
        if (r == keep) l.list->v[m++] = items[i];
    }
    l.list->n = m;
    l.list->kind = SP_JLIST_GEN;
    *out = l;
    return SP_OK;
}

static enum sp_status filter_map(struct rt *rt, int line, struct sp_jv v, struct args *a, struct sp_jv *out) {
    const struct sp_jv *items;
    int64_t n;
    enum sp_status st;
    if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
    struct sp_jv l;
    if ((st = new_list(rt, line, n, &l)) != SP_OK) return st;
    struct sp_jv *attr = arg(a, -1, "attribute"), *def = arg(a, -1, "default");
    char fname[64] = "";
    if (!attr) {
        if (a->npos < 1 || a->pos[0].t != SP_JV_STR || a->pos[0].s.n >= sizeof fname)
            return fail(line, SP_ERR_ARG, "map needs a filter name or attribute=");
        memcpy(fname, a->pos[0].s.p, a->pos[0].s.n);
        fname[a->pos[0].s.n] = 0;
    }
    struct args fa = {0};
    if (a->npos > 1) fa = (struct args){.pos = a->pos + 1, .npos = a->npos - 1};
    for (int64_t i = 0; i < n; i++) {
        if (attr) {
            if ((st = attr_path(rt, line, items[i], *attr, &l.list->v[i])) != SP_OK) return st;
            if (def && l.list->v[i].t == SP_JV_UNDEFINED) l.list->v[i] = *def;
        } else if ((st = apply_filter(rt, line, fname, items[i], &fa, &l.list->v[i])) != SP_OK) {
            return st;
        }
    }
    l.list->kind = SP_JLIST_GEN;
    *out = l;
    return SP_OK;
}

/* transformers' tojson: json.dumps(x, ensure_ascii=False, indent=indent,
 * separators=separators, sort_keys=sort_keys). */
static enum sp_status filter_tojson(struct rt *rt, int line, struct sp_jv v, struct args *a, struct sp_jv *out) {
    struct sp_jv_json_opts o = {0};
    char ind[256];
    // transformers' signature: tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False)
    struct sp_jv *indent = arg(a, 1, "indent"), *seps = arg(a, 2, "separators"), *sk = arg(a, 3, "sort_keys");
    int64_t k;
    if (indent && indent->t != SP_JV_NONE) {
        if (is_int(*indent, &k)) {
            if (k > (int64_t)sizeof ind - 1) return fail(line, SP_ERR_LIMIT, "tojson: indent too large");
            if (k < 0) k = 0;
            memset(ind, ' ', (size_t)k);
            ind[k] = 0;
        } else if (indent->t == SP_JV_STR && indent->s.n < sizeof ind && !memchr(indent->s.p, 0, indent->s.n)) {
            memcpy(ind, indent->s.p, indent->s.n);
            ind[indent->s.n] = 0;
        } else {
            return fail(line, SP_ERR_ARG, "tojson: indent must be an integer or a string");
        }
        o.indent = ind;
    }
    char *sep_s[2] = {NULL, NULL};
    if (seps && seps->t != SP_JV_NONE) {
        if (seps->t != SP_JV_LIST || seps->list->n != 2 || seps->list->v[0].t != SP_JV_STR ||
            seps->list->v[1].t != SP_JV_STR)
            return fail(line, SP_ERR_ARG, "tojson: separators must be a pair of strings");
        for (int i = 0; i < 2; i++)
            if (!(sep_s[i] = sp_jarena_strdup(&rt->a, seps->list->v[i].s.p, seps->list->v[i].s.n)))
                return at_line(line, SP_ERR_LIMIT);
        o.item_sep = sep_s[0];
        o.key_sep = sep_s[1];
    }
    o.sort_keys = sk && sp_jv_truthy(*sk);
    o.max_len = rt->max_output;
    struct sp_jv *ea = arg(a, 0, "ensure_ascii");
    o.ensure_ascii = ea && sp_jv_truthy(*ea);
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = at_line(line, sp_jv_write_json(&b, v, &o));
    if (st == SP_OK) st = check_output(line, rt, &b);
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status filter_indent(struct rt *rt, int line, struct sp_jv v, struct args *a, struct sp_jv *out) {
    enum sp_status st;
    if (v.t != SP_JV_STR)
        return fail(line, SP_ERR_ARG, "indent: unsupported operand type(s) for +=: '%s' and 'str'", sp_jv_type_name(v));
    struct sp_jv *w = arg(a, 0, "width"), *first = arg(a, 1, "first"), *blank = arg(a, 2, "blank");
    char pad[256];
    struct sp_jv padv = sp_jv_strn("    ", 4);
    int64_t k;
    if (w && is_int(*w, &k)) {
        if (k < 0) k = 0;
        if (k >= (int64_t)sizeof pad) return fail(line, SP_ERR_LIMIT, "indent: width too large");
        memset(pad, ' ', (size_t)k);
        padv = sp_jv_strn(pad, (size_t)k);
    } else if (w && w->t == SP_JV_STR) {
        padv = *w;
    }
    struct sp_buf b = SP_BUF_INIT;
    size_t i = 0;
    bool first_line = true;
    while (i <= v.s.n) {
        const char *nl = memchr(v.s.p + i, '\n', v.s.n - i);
        size_t e = nl ? (size_t)(nl - v.s.p) : v.s.n;
        bool empty = e == i;
        if ((first_line ? (first && sp_jv_truthy(*first)) : true) && (!empty || (blank && sp_jv_truthy(*blank))))
            sp_buf_append(&b, padv.s.p, padv.s.n);
        sp_buf_append(&b, v.s.p + i, e - i);
        if (!nl) break;
        sp_buf_putc(&b, '\n');
        i = e + 1;
        first_line = false;
    }
    st = check_output(line, rt, &b);
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status filter_join(struct rt *rt, int line, struct sp_jv v, struct args *a, struct sp_jv *out) {
    const struct sp_jv *items;
    int64_t n;
    enum sp_status st;
    if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
    struct sp_jv *d = arg(a, 0, "d"), *attr = arg(a, 1, "attribute");
    struct sp_jv sep = sp_jv_strn("", 0);
    if (d && (st = to_str(rt, line, *d, &sep)) != SP_OK) return st;
    struct sp_buf b = SP_BUF_INIT;
    for (int64_t i = 0; i < n && st == SP_OK; i++) {
        struct sp_jv x = items[i];
        if (attr && attr->t != SP_JV_NONE) st = attr_path(rt, line, x, *attr, &x);
        if (i) sp_buf_append(&b, sep.s.p, sep.s.n);
        if (st == SP_OK) st = at_line(line, sp_jv_write_str(&b, x, rt->max_output));
    }
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status filter_escape(struct rt *rt, int line, struct sp_jv v, struct sp_jv *out) {
    enum sp_status st;
    if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
    struct sp_buf b = SP_BUF_INIT;
    for (size_t i = 0; i < v.s.n; i++) {
        switch (v.s.p[i]) {
        case '&':
            sp_buf_puts(&b, "&amp;");
            break;
        case '<':
            sp_buf_puts(&b, "&lt;");
            break;
        case '>':
            sp_buf_puts(&b, "&gt;");
            break;
        case '"':
            sp_buf_puts(&b, "&#34;");
            break;
        case '\'':
            sp_buf_puts(&b, "&#39;");
            break;
        default:
            sp_buf_putc(&b, v.s.p[i]);
        }
    }
    st = check_output(line, rt, &b);
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

/* Python float(str) / int(str) for the int and float filters. */
static bool parse_number(struct sp_jv s, bool want_int, int64_t base, struct sp_jv *out) {
    char buf[128];
    struct sp_jv t = strip(s, NULL, true, true);
    if (t.s.n == 0 || t.s.n >= sizeof buf) return false;
    size_t o = 0;
    for (size_t i = 0; i < t.s.n; i++)
        if (t.s.p[i] != '_') buf[o++] = t.s.p[i];
    buf[o] = 0;
    char *end;
    if (want_int) {
        errno = 0;
        long long v = strtoll(buf, &end, (int)base);
        if (*end == 0 && errno == 0) {
            *out = sp_jv_int(v);
            return true;
        }
    }
    double d = strtod(buf, &end);
    if (*end != 0 || (buf[0] == '0' && (buf[1] == 'x' || buf[1] == 'X'))) return false;
    if (want_int) {
        if (!isfinite(d) || fabs(d) > 9.2e18) return false;
        *out = sp_jv_int((int64_t)d);
    } else {
        *out = sp_jv_float(d);
    }
    return true;
}

static enum sp_status filter_basic(struct rt *rt, int line, const char *name, struct sp_jv v, struct args *a,
                                   struct sp_jv *out, bool *handled) {
    enum sp_status st = SP_OK;
    int64_t n = 0, k = 0;
    struct sp_jv x, y;
    *handled = true;
    if (strcmp(name, "abs") == 0) {
        if (v.t == SP_JV_FLOAT)
            *out = sp_jv_float(fabs(v.f));
        else if (is_int(v, &k) && k != INT64_MIN)
            *out = sp_jv_int(k < 0 ? -k : k);
        else
            return fail(line, SP_ERR_ARG, "bad operand type for abs(): '%s'", sp_jv_type_name(v));
    } else if (strcmp(name, "attr") == 0) {
        if ((st = arg_str(line, a, 0, "name", name, &x, true)) != SP_OK) return st;
        char *nm = sp_jarena_strdup(&rt->a, x.s.p, x.s.n);
        if (!nm) return at_line(line, SP_ERR_LIMIT);
        if (v.t == SP_JV_DICT && !in_list(DICT_METHODS, nm))
            *out = undef_msg(rt, "'dict object' has no attribute '%s'", nm);
        else
            return get_attr(rt, line, v, nm, out);
    } else if (strcmp(name, "capitalize") == 0 || strcmp(name, "lower") == 0 || strcmp(name, "upper") == 0 ||
               strcmp(name, "title") == 0) {
        if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
        enum casing c = name[0] == 'c'   ? CASE_CAPITALIZE
                        : name[0] == 'l' ? CASE_LOWER
                        : name[0] == 'u' ? CASE_UPPER
                                         : CASE_JINJA_TITLE;
        return recase(rt, line, v, c, out);
    } else if (strcmp(name, "length") == 0 || strcmp(name, "count") == 0) {
        if ((st = length_of(line, v, &n)) != SP_OK) return st;
        *out = sp_jv_int(n);
    } else if (strcmp(name, "default") == 0 || strcmp(name, "d") == 0) {
        struct sp_jv *def = arg(a, 0, "default_value"), *boolean = arg(a, 1, "boolean");
        bool use = v.t == SP_JV_UNDEFINED || (boolean && sp_jv_truthy(*boolean) && !sp_jv_truthy(v));
        *out = use ? (def ? *def : sp_jv_strn("", 0)) : v;
    } else if (strcmp(name, "escape") == 0 || strcmp(name, "e") == 0) {
        return filter_escape(rt, line, v, out);
    } else if ((strcmp(name, "first") == 0 || strcmp(name, "last") == 0) && v.t == SP_JV_LIST &&
               v.list->kind == SP_JLIST_GEN) {
        // next(generator) takes one item; reversed(generator) is a TypeError.
        if (name[0] == 'l') return fail(line, SP_ERR_ARG, "'generator' object is not reversible");
        *out = v.list->pos < v.list->n ? v.list->v[v.list->pos++] : undef_msg(rt, "No first item, sequence was empty.");
    } else if (strcmp(name, "first") == 0 || strcmp(name, "last") == 0) {
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        if (n == 0)
            *out = undef_msg(rt, "No %s item, sequence was empty.", name);
        else
            *out = items[name[0] == 'f' ? 0 : n - 1];
    } else if ((strcmp(name, "float") == 0 || strcmp(name, "int") == 0) && v.t == SP_JV_UNDEFINED) {
        return undefined_err(line, v); // float(Undefined) raises
    } else if (strcmp(name, "float") == 0) {
        struct sp_jv *def = arg(a, 0, "default");
        double d;
        if (v.t == SP_JV_STR && parse_number(v, false, 10, out)) return SP_OK;
        if (v.t != SP_JV_STR && sp_jv_number(v, &d))
            *out = sp_jv_float(d);
        else
            *out = def ? *def : sp_jv_float(0.0);
    } else if (strcmp(name, "int") == 0) {
        struct sp_jv *def = arg(a, 0, "default"), *base = arg(a, 1, "base");
        int64_t b = 10;
        if (base && (!is_int(*base, &b) || b < 2 || b > 36)) b = 10;
        if (v.t == SP_JV_STR && parse_number(v, true, b, out)) return SP_OK;
        if (is_int(v, &k))
            *out = sp_jv_int(k);
        else if (v.t == SP_JV_FLOAT && isfinite(v.f) && fabs(v.f) < 9.2e18)
            *out = sp_jv_int((int64_t)v.f);
        else
            *out = def ? *def : sp_jv_int(0);
    } else if (strcmp(name, "items") == 0) {
        if (v.t == SP_JV_UNDEFINED) return new_list(rt, line, 0, out);
        if (v.t != SP_JV_DICT)
            return fail(line, SP_ERR_ARG, "items: can only get item pairs from a mapping, not %s", sp_jv_type_name(v));
        struct args none = {0};
        if ((st = dict_method(rt, line, v, "items", &none, out)) != SP_OK) return st;
        out->list->kind = SP_JLIST_GEN;
    } else if (strcmp(name, "list") == 0) {
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        if ((st = new_list(rt, line, n, out)) != SP_OK) return st;
        if (n) memcpy(out->list->v, items, (size_t)n * sizeof *items);
    } else if (strcmp(name, "replace") == 0) {
        if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
        if ((st = arg_str(line, a, 0, "old", name, &x, true)) != SP_OK) return st;
        if ((st = arg_str(line, a, 1, "new", name, &y, true)) != SP_OK) return st;
        struct sp_jv *c = arg(a, 2, "count");
        int64_t count = -1;
        if (c && c->t != SP_JV_NONE && !is_int(*c, &count))
            return fail(line, SP_ERR_ARG, "replace: count must be an integer");
        return replace(rt, line, v, x, y, count, out);
    } else if (strcmp(name, "reverse") == 0) {
        if (v.t == SP_JV_STR) {
            struct sp_jv sv[3] = {sp_jv_none(), sp_jv_none(), sp_jv_int(-1)};
            return do_slice(rt, line, v, sv, out);
        }
        // reversed() of a list or view is an iterator; a generator becomes a list.
        bool gen_in = v.t == SP_JV_LIST && v.list->kind == SP_JLIST_GEN;
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        if ((st = new_list(rt, line, n, out)) != SP_OK) return st;
        for (int64_t i = 0; i < n; i++) out->list->v[i] = items[n - 1 - i];
        if (!gen_in) out->list->kind = SP_JLIST_GEN;
    } else if (strcmp(name, "round") == 0) {
        struct sp_jv *prec = arg(a, 0, "precision"), *method = arg(a, 1, "method");
        int64_t p = 0;
        double d;
        if (prec && !is_int(*prec, &p)) return fail(line, SP_ERR_ARG, "round: precision must be an integer");
        if (!sp_jv_number(v, &d)) return fail(line, SP_ERR_ARG, "round: needs a number, got %s", sp_jv_type_name(v));
        bool common = !method || (method->t == SP_JV_STR && method->s.n == 6 && memcmp(method->s.p, "common", 6) == 0);
        if (common && is_int(v, &k) && p >= 0) {
            *out = sp_jv_int(k); // round(int, ndigits) stays an int
            return SP_OK;
        }
        if (p > 300) p = 300;
        if (p < -300) p = -300;
        double m = pow(10.0, (double)p);
        double scaled = d * m;
        if (method && method->t == SP_JV_STR && method->s.n == 4 && memcmp(method->s.p, "ceil", 4) == 0)
            scaled = ceil(scaled);
        else if (method && method->t == SP_JV_STR && method->s.n == 5 && memcmp(method->s.p, "floor", 5) == 0)
            scaled = floor(scaled);
        else if (p >= 0 && isfinite(d)) {
            // Python rounds the exact binary value, halves to even: so does printf.
            char buf[720]; // 309 integer digits + 300 decimals at most
            snprintf(buf, sizeof buf, "%.*f", (int)p, d);
            *out = sp_jv_float(strtod(buf, NULL));
            return SP_OK;
        } else {
            scaled = nearbyint(scaled);
        }
        *out = sp_jv_float(isfinite(scaled / m) ? scaled / m : d);
    } else if (strcmp(name, "safe") == 0 || strcmp(name, "string") == 0) {
        return to_str(rt, line, v, out);
    } else if (strcmp(name, "sum") == 0) {
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        struct sp_jv *attr = arg(a, 0, "attribute"), *start = arg(a, 1, "start");
        struct sp_jv acc = start ? *start : sp_jv_int(0);
        for (int64_t i = 0; i < n; i++) {
            x = items[i];
            if (attr && attr->t != SP_JV_NONE && (st = attr_path(rt, line, x, *attr, &x)) != SP_OK) return st;
            if ((st = arith(rt, line, SP_JOP_ADD, acc, x, &acc)) != SP_OK) return st;
        }
        *out = acc;
    } else if (strcmp(name, "trim") == 0) {
        if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
        if ((st = arg_str(line, a, 0, "chars", name, &x, false)) != SP_OK) return st;
        *out = strip(v, &x, true, true);
    } else if (strcmp(name, "unique") == 0) {
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        struct sp_jv *cs = arg(a, 0, "case_sensitive"), *attr = arg(a, 1, "attribute");
        bool case_sensitive = cs && sp_jv_truthy(*cs);
        struct sp_jv l, *keys = sp_jarena_alloc(&rt->a, (size_t)n * sizeof *keys + 1);
        if (!keys) return at_line(line, SP_ERR_LIMIT);
        if ((st = new_list(rt, line, n, &l)) != SP_OK) return st;
        int64_t m = 0;
        for (int64_t i = 0; i < n; i++) {
            struct sp_jv key;
            if ((st = sort_key(rt, line, items[i], attr, case_sensitive, &key)) != SP_OK) return st;
            bool seen = false;
            for (int64_t j = 0; j < m && !seen; j++) seen = sp_jv_equal(keys[j], key);
            if (seen) continue;
            keys[m] = key;
            l.list->v[m++] = items[i];
        }
        l.list->n = m;
        l.list->kind = SP_JLIST_GEN;
        *out = l;
    } else if (strcmp(name, "wordcount") == 0) {
        if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
        int64_t words = 0;
        bool in_word = false;
        for (size_t i = 0; i < v.s.n;) {
            int32_t cp;
            i += sp_utf8_next(v.s.p + i, v.s.n - i, &cp);
            utf8proc_category_t c = utf8proc_category(cp);
            bool w = cp == '_' || (c >= UTF8PROC_CATEGORY_LU && c <= UTF8PROC_CATEGORY_NO);
            if (w && !in_word) words++;
            in_word = w;
        }
        *out = sp_jv_int(words);
    } else if (strcmp(name, "dictsort") == 0) {
        if (v.t != SP_JV_DICT) return fail(line, SP_ERR_ARG, "dictsort: needs a mapping, got %s", sp_jv_type_name(v));
        struct args none = {0};
        struct sp_jv pairs;
        if ((st = dict_method(rt, line, v, "items", &none, &pairs)) != SP_OK) return st;
        struct sp_jv *cs = arg(a, 0, "case_sensitive"), *by = arg(a, 1, "by"), *rev = arg(a, 2, "reverse");
        bool by_value = by && by->t == SP_JV_STR && by->s.n == 5 && memcmp(by->s.p, "value", 5) == 0;
        struct sp_jv idx = sp_jv_int(by_value ? 1 : 0);
        struct sp_jv sargs[3] = {rev ? *rev : sp_jv_bool(false), cs ? *cs : sp_jv_bool(false), idx};
        struct args sa = {.pos = sargs, .npos = 3};
        return filter_sort(rt, line, pairs, &sa, false, false, out);
    } else if (strcmp(name, "format") == 0) {
        if ((st = to_str(rt, line, v, &v)) != SP_OK) return st;
        if (a->npos && a->nkw) return fail(line, SP_ERR_ARG, "format: can't handle positional and keyword arguments");
        if (a->nkw) {
            if ((st = at_line(line, sp_jv_new_dict(&rt->a, SP_JV_DICT, &x))) != SP_OK) return st;
            for (int64_t i = 0; i < a->nkw; i++)
                if ((st = at_line(line, sp_jdict_set(&rt->a, x.dict, sp_jv_cstr(a->kwn[i]), a->kwv[i]))) != SP_OK)
                    return st;
        } else {
            if ((st = new_list(rt, line, a->npos, &x)) != SP_OK) return st;
            x.list->tuple = true;
            for (int64_t i = 0; i < a->npos; i++) x.list->v[i] = a->pos[i];
        }
        return percent_format(rt, line, v, x, out);
    } else if (strcmp(name, "batch") == 0) {
        struct sp_jv *size = arg(a, 0, "linecount"), *fill = arg(a, 1, "fill_with");
        int64_t sz;
        if (!size || !is_int(*size, &sz) || sz <= 0) return fail(line, SP_ERR_ARG, "batch: size must be positive");
        const struct sp_jv *items;
        if ((st = iterate(rt, line, v, &items, &n)) != SP_OK) return st;
        int64_t groups = (n + sz - 1) / sz;
        if ((st = new_list(rt, line, groups, out)) != SP_OK) return st;
        for (int64_t g = 0; g < groups; g++) {
            int64_t cnt = (g == groups - 1 && n % sz && !fill) ? n % sz : sz;
            struct sp_jv grp;
            if ((st = new_list(rt, line, cnt, &grp)) != SP_OK) return st;
            for (int64_t i = 0; i < cnt; i++) grp.list->v[i] = g * sz + i < n ? items[g * sz + i] : *fill;
            out->list->v[g] = grp;
        }
        out->list->kind = SP_JLIST_GEN;
    } else {
        *handled = false;
    }
    return st;
}

static enum sp_status apply_filter(struct rt *rt, int line, const char *name, struct sp_jv v, struct args *a,
                                   struct sp_jv *out) {
    bool handled;
    enum sp_status st = filter_basic(rt, line, name, v, a, out, &handled);
    if (handled) return st;
    if (strcmp(name, "join") == 0) return filter_join(rt, line, v, a, out);
    if (strcmp(name, "tojson") == 0) return filter_tojson(rt, line, v, a, out);
    if (strcmp(name, "indent") == 0) return filter_indent(rt, line, v, a, out);
    if (strcmp(name, "map") == 0) return filter_map(rt, line, v, a, out);
    if (strcmp(name, "sort") == 0) return filter_sort(rt, line, v, a, false, false, out);
    if (strcmp(name, "max") == 0 || strcmp(name, "min") == 0)
        return filter_sort(rt, line, v, a, true, name[1] == 'a', out);
    if (strcmp(name, "select") == 0) return filter_select(rt, line, v, a, false, true, out);
    if (strcmp(name, "reject") == 0) return filter_select(rt, line, v, a, false, false, out);
    if (strcmp(name, "selectattr") == 0) return filter_select(rt, line, v, a, true, true, out);
    if (strcmp(name, "rejectattr") == 0) return filter_select(rt, line, v, a, true, false, out);
    return fail(line, SP_ERR_ARG, "no filter named '%s'", name);
}

/* ---- statements ----------------------------------------------------------- */

/* Binds a for/set target (a name or a tuple of names) to a value. */
static enum sp_status assign(struct rt *rt, const struct sp_jnode *target, struct frame *f, struct sp_jv v) {
    if (target->kind == SP_JN_NAME) return at_line(target->line, frame_set(rt, f, target->str, v));
    if (target->kind == SP_JN_TUPLE) {
        const struct sp_jv *items;
        int64_t n;
        enum sp_status st = iterate(rt, target->line, v, &items, &n);
        if (st != SP_OK) return st;
        if (n != target->nkids)
            return fail(target->line, SP_ERR_ARG, "cannot unpack %lld values into %lld names", (long long)n,
                        (long long)target->nkids);
        for (int64_t i = 0; i < n; i++)
            if ((st = assign(rt, target->kids[i], f, items[i])) != SP_OK) return st;
        return SP_OK;
    }
    return fail(target->line, SP_ERR_ARG, "cannot assign to this expression");
}

static enum sp_status exec_for(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_buf *out) {
    struct sp_jv seq;
    enum sp_status st;
    if ((st = eval(rt, n->b, f, &seq)) != SP_OK) return st;
    const struct sp_jv *items;
    int64_t count;
    if ((st = iterate(rt, n->line, seq, &items, &count)) != SP_OK) return st;
    if (n->c) {
        // `for x in xs if cond`: filter first, so loop.length counts what is kept.
        struct sp_jv kept;
        if ((st = new_list(rt, n->line, count, &kept)) != SP_OK) return st;
        int64_t m = 0;
        struct frame *ff = frame_new(rt, f);
        if (!ff) return at_line(n->line, SP_ERR_LIMIT);
        for (int64_t i = 0; i < count; i++) {
            if (++rt->iters > rt->max_iters)
                return fail(n->line, SP_ERR_LIMIT, "more than %lld loop iterations", (long long)rt->max_iters);
            struct sp_jv c;
            ff->n = 0;
            if ((st = assign(rt, n->a, ff, items[i])) != SP_OK || (st = eval(rt, n->c, ff, &c)) != SP_OK) return st;
            if (sp_jv_truthy(c)) kept.list->v[m++] = items[i];
        }
        items = kept.list->v;
        count = m;
    }
    struct loop *l = sp_jarena_alloc(&rt->a, sizeof *l);
    if (!l) return at_line(n->line, SP_ERR_LIMIT);
    l->items = items;
    l->n = count;
    l->depth = 1; // only recursive loops (unsupported) go deeper in jinja2
    struct sp_jv loopv = {.t = SP_JV_LOOP, .ptr = l};
    rt->loop_depth++;
    struct frame *ff = NULL;
    for (int64_t i = 0; i < count; i++) {
        if (++rt->iters > rt->max_iters) {
            st = fail(n->line, SP_ERR_LIMIT, "more than %lld loop iterations", (long long)rt->max_iters);
            break;
        }
        l->i = i;
        // Each iteration gets its own scope, as in jinja2; a fresh one only
        // when a macro defined in the body could hold on to it.
        if (ff && n->op) {
            ff->n = 0;
        } else if (!(ff = frame_new(rt, f))) {
            st = at_line(n->line, SP_ERR_LIMIT);
            break;
        }
        if ((st = assign(rt, n->a, ff, items[i])) != SP_OK) break;
        if ((st = at_line(n->line, frame_set(rt, ff, "loop", loopv))) != SP_OK) break;
        if ((st = exec(rt, n->kids[0], ff, out)) != SP_OK) break;
        int ctl = rt->ctl;
        rt->ctl = CTL_NONE;
        if (ctl == CTL_BREAK) break;
    }
    rt->loop_depth--;
    if (st != SP_OK) return st;
    if (count == 0 && n->kids[1]) return exec(rt, n->kids[1], f, out);
    return SP_OK;
}

/* Applies a chain of FILTER nodes (block set, filter block) to a value. */
static enum sp_status filter_chain(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_jv *v) {
    for (int64_t i = 0; i < n->nkids; i++) {
        struct args a;
        enum sp_status st = eval_args(rt, n->kids[i], f, &a);
        if (st == SP_OK) st = apply_filter(rt, n->kids[i]->line, n->kids[i]->str, *v, &a, v);
        if (st != SP_OK) return st;
    }
    return SP_OK;
}

static enum sp_status render_to_value(struct rt *rt, const struct sp_jnode *body, struct frame *f, int line,
                                      struct sp_jv *out) {
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = exec(rt, body, f, &b);
    if (st == SP_OK) st = mkstr(rt, line, &b, out);
    sp_buf_free(&b);
    return st;
}

static enum sp_status exec_set(struct rt *rt, const struct sp_jnode *n, struct frame *f) {
    struct sp_jv v;
    enum sp_status st;
    if (n->b) {
        st = eval(rt, n->b, f, &v);
    } else {
        struct frame *bf = frame_new(rt, f);
        if (!bf) return at_line(n->line, SP_ERR_LIMIT);
        st = render_to_value(rt, n->c, bf, n->line, &v);
        if (st == SP_OK) st = filter_chain(rt, n, f, &v);
    }
    if (st != SP_OK) return st;
    if (n->a->kind == SP_JN_ATTR) {
        struct sp_jv ns = lookup(rt, f, n->a->a->str);
        if (ns.t != SP_JV_NAMESPACE)
            return fail(n->line, SP_ERR_ARG, "cannot assign attribute on non-namespace object '%s'", n->a->a->str);
        return at_line(n->line, sp_jdict_set(&rt->a, ns.dict, sp_jv_cstr(n->a->str), v));
    }
    return assign(rt, n->a, f, v);
}

static enum sp_status make_macro(struct rt *rt, const struct sp_jnode *n, const char *name, const struct sp_jnode *body,
                                 struct frame *f, struct sp_jv *out) {
    struct macro *m = sp_jarena_alloc(&rt->a, sizeof *m);
    if (!m) return at_line(n->line, SP_ERR_LIMIT);
    m->name = name;
    m->params = n->kids;
    m->nparams = n->nkids;
    m->body = body;
    m->closure = f;
    m->catch = n->op;
    *out = (struct sp_jv){.t = SP_JV_MACRO, .ptr = m};
    return SP_OK;
}

static enum sp_status exec(struct rt *rt, const struct sp_jnode *n, struct frame *f, struct sp_buf *out) {
    enum sp_status st = SP_OK;
    struct sp_jv v;
    if (++rt->eval_depth > MAX_EVAL_DEPTH) return fail(n->line, SP_ERR_LIMIT, "template nested too deeply");
    switch (n->kind) {
    case SP_JN_BODY:
        for (int64_t i = 0; i < n->nkids && st == SP_OK && rt->ctl == CTL_NONE; i++) st = exec(rt, n->kids[i], f, out);
        break;
    case SP_JN_TEXT:
        sp_buf_append(out, n->str, n->len);
        st = check_output(n->line, rt, out);
        break;
    case SP_JN_OUTPUT:
        if ((st = eval(rt, n->a, f, &v)) != SP_OK) break;
        if ((st = at_line(n->line, sp_jv_write_str(out, v, rt->max_output))) == SP_OK)
            st = check_output(n->line, rt, out);
        break;
    case SP_JN_IF:
        if ((st = eval(rt, n->a, f, &v)) != SP_OK) break;
        if (sp_jv_truthy(v))
            st = exec(rt, n->b, f, out);
        else if (n->c)
            st = exec(rt, n->c, f, out);
        break;
    case SP_JN_FOR:
        st = exec_for(rt, n, f, out);
        break;
    case SP_JN_SET:
        st = exec_set(rt, n, f);
        break;
    case SP_JN_MACRO:
        if ((st = make_macro(rt, n, n->str, n->a, f, &v)) == SP_OK) st = at_line(n->line, frame_set(rt, f, n->str, v));
        break;
    case SP_JN_CALLBLOCK: {
        struct sp_jv caller;
        if ((st = make_macro(rt, n, "caller", n->b, f, &caller)) != SP_OK) break;
        if ((st = eval_call(rt, n->a, f, caller, &v)) != SP_OK) break;
        if ((st = at_line(n->line, sp_jv_write_str(out, v, rt->max_output))) == SP_OK)
            st = check_output(n->line, rt, out);
        break;
    }
    case SP_JN_FILTERBLOCK:
        if ((st = render_to_value(rt, n->a, f, n->line, &v)) != SP_OK) break;
        if ((st = filter_chain(rt, n, f, &v)) != SP_OK) break;
        if ((st = at_line(n->line, sp_jv_write_str(out, v, rt->max_output))) == SP_OK)
            st = check_output(n->line, rt, out);
        break;
    case SP_JN_WITH: {
        struct frame *wf = frame_new(rt, f);
        if (!wf) {
            st = at_line(n->line, SP_ERR_LIMIT);
            break;
        }
        for (int64_t i = 0; i < n->nkids && st == SP_OK; i++) {
            if ((st = eval(rt, n->kids[i]->b, f, &v)) == SP_OK) st = assign(rt, n->kids[i]->a, wf, v);
        }
        if (st == SP_OK) st = exec(rt, n->a, wf, out);
        break;
    }
    case SP_JN_BREAK:
    case SP_JN_CONTINUE:
        if (rt->loop_depth == 0) {
            st = fail(n->line, SP_ERR_ARG, "'%s' outside of a loop", n->kind == SP_JN_BREAK ? "break" : "continue");
            break;
        }
        rt->ctl = n->kind == SP_JN_BREAK ? CTL_BREAK : CTL_CONTINUE;
        break;
    default:
        st = fail(n->line, SP_ERR_STATE, "expression used as a statement");
        break;
    }
    rt->eval_depth--;
    return st;
}

/* ---- compile-time checks -------------------------------------------------- */

/* Whether the tree under n reads the variable `name`. */
static bool mentions(const struct sp_jnode *n, const char *name) {
    if (!n) return false;
    if (n->kind == SP_JN_NAME && strcmp(n->str, name) == 0) return true;
    if (mentions(n->a, name) || mentions(n->b, name) || mentions(n->c, name)) return true;
    for (int64_t i = 0; i < n->nkids; i++)
        if (mentions(n->kids[i], name)) return true;
    return false;
}

/* Sets op of each macro and call block to the MACRO_* flags of its body. */
static void mark_macros(struct sp_jnode *n) {
    if (!n) return;
    if (n->kind == SP_JN_MACRO || n->kind == SP_JN_CALLBLOCK) {
        const struct sp_jnode *body = n->kind == SP_JN_MACRO ? n->a : n->b;
        n->op = (mentions(body, "varargs") ? MACRO_VARARGS : 0) | (mentions(body, "kwargs") ? MACRO_KWARGS : 0);
    }
    mark_macros(n->a);
    mark_macros(n->b);
    mark_macros(n->c);
    for (int64_t i = 0; i < n->nkids; i++) mark_macros(n->kids[i]);
}

/* Marks each for loop whose body defines no macro or call block (op = 1):
 * nothing can keep a reference to such a loop's scope after an iteration,
 * so one scope is reused for all iterations. Returns whether n defines one. */
static bool mark_loops(struct sp_jnode *n) {
    if (!n) return false;
    bool defines = n->kind == SP_JN_MACRO || n->kind == SP_JN_CALLBLOCK;
    defines |= mark_loops(n->a);
    defines |= mark_loops(n->b);
    defines |= mark_loops(n->c);
    for (int64_t i = 0; i < n->nkids; i++) defines |= mark_loops(n->kids[i]);
    if (n->kind == SP_JN_FOR) n->op = !defines;
    return defines;
}

/* jinja2 refuses unknown filters and tests when compiling; so do we. */
static enum sp_status check_names(const struct sp_jnode *n, int depth) {
    if (!n) return SP_OK;
    if (depth > 4 * MAX_EVAL_DEPTH) return sp_errorf(SP_ERR_LIMIT, "template line %d: nested too deeply", n->line);
    if (n->kind == SP_JN_FILTER && !in_list(FILTER_NAMES, n->str))
        return sp_errorf(SP_ERR_FORMAT, "template line %d: no filter named '%s'", n->line, n->str);
    if (n->kind == SP_JN_TEST && !in_list(TEST_NAMES, n->str))
        return sp_errorf(SP_ERR_FORMAT, "template line %d: no test named '%s'", n->line, n->str);
    enum sp_status st;
    if ((st = check_names(n->a, depth + 1)) != SP_OK || (st = check_names(n->b, depth + 1)) != SP_OK ||
        (st = check_names(n->c, depth + 1)) != SP_OK)
        return st;
    for (int64_t i = 0; i < n->nkids; i++)
        if ((st = check_names(n->kids[i], depth + 1)) != SP_OK) return st;
    return SP_OK;
}

/* ---- public API ----------------------------------------------------------- */

enum sp_status sp_jinja_compile(const char *src, size_t len, struct sp_jinja **out) {
    *out = NULL;
    struct sp_jinja *t = sp_calloc(1, sizeof *t, SP_MEM_TOKENIZER);
    if (!t) return sp_errorf(SP_ERR_NOMEM, "out of memory compiling a template");
    sp_jarena_init(&t->arena, 0);
    enum sp_status st = sp_jinja_parse(&t->arena, src, len, &t->root);
    if (st != SP_OK) {
        if (strncmp(sp_error_msg(), "template ", 9) != 0) sp_error_prefix("template ");
        goto fail;
    }
    if ((st = check_names(t->root, 0)) != SP_OK) goto fail;
    mark_loops(t->root);
    mark_macros(t->root);
    *out = t;
    return SP_OK;
fail:
    sp_jinja_free(t);
    return st;
}

static bool loops_over(const struct sp_jnode *n, const char *name) {
    if (!n) return false;
    if (n->kind == SP_JN_FOR) {
        const struct sp_jnode *it = n->b;
        while (it->kind == SP_JN_FILTER) it = it->a;
        if ((it->kind == SP_JN_NAME || it->kind == SP_JN_ATTR) && strcmp(it->str, name) == 0) return true;
        if (it->kind == SP_JN_ITEM && it->b->kind == SP_JN_LITERAL && it->b->val.t == SP_JV_STR &&
            it->b->val.s.n == strlen(name) && memcmp(it->b->val.s.p, name, it->b->val.s.n) == 0)
            return true;
    }
    if (loops_over(n->a, name) || loops_over(n->b, name) || loops_over(n->c, name)) return true;
    for (int64_t i = 0; i < n->nkids; i++)
        if (loops_over(n->kids[i], name)) return true;
    return false;
}

bool sp_jinja_loops_over(const struct sp_jinja *t, const char *name) { return loops_over(t->root, name); }

void sp_jinja_free(struct sp_jinja *t) {
    if (!t) return;
    sp_jarena_free(&t->arena);
    sp_free(t);
}

enum sp_status sp_jinja_render(const struct sp_jinja *t, const struct sp_jinja_var *vars, int64_t n_vars,
                               const struct sp_jinja_opts *opts, char **out, size_t *out_len) {
    static const struct sp_jinja_opts defaults = {0};
    if (!opts) opts = &defaults;
    *out = NULL;
    if (out_len) *out_len = 0;
    struct rt rt = {
        .max_iters = opts->max_loop_iterations > 0 ? opts->max_loop_iterations : 1000000,
        .max_calls = opts->max_call_depth > 0 ? opts->max_call_depth : 100,
        .max_output = opts->max_output ? opts->max_output : (size_t)16 << 20,
        .now = opts->now,
        .utc = opts->utc,
    };
    sp_jarena_init(&rt.a, opts->max_memory ? opts->max_memory : (size_t)256 << 20);
    struct sp_buf b = SP_BUF_INIT;
    enum sp_status st = SP_OK;
    struct frame *globals = frame_new(&rt, NULL);
    if (!globals || !(rt.top = frame_new(&rt, globals))) {
        st = SP_ERR_LIMIT;
        goto fail;
    }
    for (int64_t i = 0; i < n_vars; i++) {
        struct sp_jv v;
        if ((st = sp_jv_from_cjson(&rt.a, vars[i].value, &v)) != SP_OK) goto fail;
        if ((st = frame_set(&rt, globals, vars[i].name, v)) != SP_OK) goto fail;
    }
    int64_t work = opts->max_compare_work > 0 ? opts->max_compare_work : (int64_t)1 << 26;
    sp_jv_work_reset(work);
    st = exec(&rt, t->root, rt.top, &b);
    if (sp_jv_work_spent())
        st = sp_errorf(SP_ERR_LIMIT, "template compares values of more than %lld elements in all", (long long)work);
    sp_jv_work_reset(0);
    if (st != SP_OK) goto fail;
    if (b.failed) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory rendering a template");
        goto fail;
    }
    if (out_len) *out_len = b.len;
    *out = b.data ? sp_buf_take(&b) : sp_strdup("", SP_MEM_TOKENIZER);
    if (!*out) st = sp_errorf(SP_ERR_NOMEM, "out of memory rendering a template");
fail:
    sp_buf_free(&b);
    sp_jarena_free(&rt.a);
    return st;
}
