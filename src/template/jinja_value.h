/*
 * jinja_value.h - the values a Jinja template computes with, the arena they
 * live in, and their Python-compatible text forms (str(), repr(), json.dumps).
 *
 * Chat templates are written for Python's jinja2, so a value prints the way
 * Python prints it: `{{ true }}` is "True", `{{ [1, 'a'] }}` is "[1, 'a']",
 * `{{ 1.0 }}` is "1.0", and `x | tojson` is json.dumps(x, ensure_ascii=False).
 *
 *     struct sp_jarena a;
 *     sp_jarena_init(&a, 64 << 20);            // refuse to grow past 64 MiB
 *     struct sp_jv v;
 *     if (sp_jv_from_cjson(&a, json, &v) != SP_OK) ...
 *     struct sp_buf b = SP_BUF_INIT;
 *     sp_jv_write_str(&b, v);                  // Python str(v)
 *     sp_jarena_free(&a);                      // every value dies with it
 *
 * Every pointer inside a value (strings, lists, dicts) is owned by an arena
 * (or borrowed from a cJSON tree or template source that outlives it); values
 * are plain structs copied freely and never freed one by one. Lists and dicts
 * are immutable once built, except namespaces, whose attributes `set` writes.
 */
#ifndef SP_TEMPLATE_JINJA_VALUE_H
#define SP_TEMPLATE_JINJA_VALUE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "core/utf8.h"

/* ---- arena ---------------------------------------------------------------- */

struct sp_jarena_chunk;

struct sp_jarena {
    struct sp_jarena_chunk *head;
    size_t used;  // bytes handed out, all chunks
    size_t limit; // 0: unlimited
};

void sp_jarena_init(struct sp_jarena *a, size_t limit);
void sp_jarena_free(struct sp_jarena *a);
/* Zeroed memory aligned for any value; NULL when the limit (or the system)
 * refuses, with detail recorded by sp_errorf. */
void *sp_jarena_alloc(struct sp_jarena *a, size_t n);
/* A NUL-terminated copy of n bytes. */
char *sp_jarena_strdup(struct sp_jarena *a, const char *s, size_t n);

/* ---- values --------------------------------------------------------------- */

enum sp_jv_type {
    SP_JV_UNDEFINED,
    SP_JV_NONE,
    SP_JV_BOOL,
    SP_JV_INT,
    SP_JV_FLOAT,
    SP_JV_STR,
    SP_JV_LIST, // list, or tuple when list->tuple is set
    SP_JV_DICT,
    SP_JV_NAMESPACE, // jinja2 namespace(): a dict whose attributes can be set
    SP_JV_MACRO,     // ptr: the evaluator's macro object
    SP_JV_BUILTIN,   // i: the evaluator's builtin-function id
    SP_JV_METHOD,    // method: a method name bound to a receiver
    SP_JV_LOOP,      // ptr: the evaluator's loop state
    SP_JV_TYPE_COUNT
};

struct sp_jlist;
struct sp_jdict;
struct sp_jmethod;

struct sp_jv {
    enum sp_jv_type t;
    union {
        bool b;
        int64_t i;
        double f;
        struct {
            const char *p; // not NUL-terminated in general
            size_t n;
        } s; // SP_JV_STR; for SP_JV_UNDEFINED, the name that was missing (may be empty)
        struct sp_jlist *list;
        struct sp_jdict *dict;
        struct sp_jmethod *method;
        void *ptr;
    };
};

/* What Python object a sequence stands for. Filters such as select and map
 * return one-shot generators in jinja2 and dict.items() returns a view; a
 * template can tell them from lists (a generator is always true, has no
 * len(), cannot be indexed, and is used up by iterating it). */
enum sp_jlist_kind {
    SP_JLIST_LIST,   // list, or tuple when `tuple` is set
    SP_JLIST_GEN,    // generator / iterator: items from `pos` on remain
    SP_JLIST_ITEMS,  // dict_items view (of (key, value) tuples)
    SP_JLIST_KEYS,   // dict_keys view
    SP_JLIST_VALUES, // dict_values view
    SP_JLIST_KIND_COUNT
};

struct sp_jlist {
    struct sp_jv *v; // (n)
    int64_t n;
    bool tuple; // prints as (a, b) rather than [a, b]
    enum sp_jlist_kind kind;
    int64_t pos; // SP_JLIST_GEN: items already consumed
};

/* A real list or tuple (not a generator or dict view). */
static inline bool sp_jv_is_seq(struct sp_jv v) { return v.t == SP_JV_LIST && v.list->kind == SP_JLIST_LIST; }

struct sp_jdict_entry {
    struct sp_jv key;
    struct sp_jv val;
};

struct sp_jdict {
    struct sp_jdict_entry *e; // (n), insertion order
    int64_t n, cap;
    int64_t *slots; // (nslots) hash index of the string keys: entry index + 1, 0 = empty;
    int64_t nslots; // NULL while the dict is small enough to scan
};

struct sp_jmethod {
    struct sp_jv self;
    const char *name; // NUL-terminated, static or arena
};

static inline struct sp_jv sp_jv_undef(void) { return (struct sp_jv){.t = SP_JV_UNDEFINED}; }
static inline struct sp_jv sp_jv_none(void) { return (struct sp_jv){.t = SP_JV_NONE}; }
static inline struct sp_jv sp_jv_bool(bool b) { return (struct sp_jv){.t = SP_JV_BOOL, .b = b}; }
static inline struct sp_jv sp_jv_int(int64_t i) { return (struct sp_jv){.t = SP_JV_INT, .i = i}; }
static inline struct sp_jv sp_jv_float(double f) { return (struct sp_jv){.t = SP_JV_FLOAT, .f = f}; }
static inline struct sp_jv sp_jv_strn(const char *p, size_t n) { return (struct sp_jv){.t = SP_JV_STR, .s = {p, n}}; }
/* A borrowed C string. */
struct sp_jv sp_jv_cstr(const char *p);

/* A list of n undefined items (filled by the caller); NULL list on failure. */
enum sp_status sp_jv_new_list(struct sp_jarena *a, int64_t n, struct sp_jv *out);
enum sp_status sp_jv_new_dict(struct sp_jarena *a, enum sp_jv_type t, struct sp_jv *out);
/* Inserts or replaces key in a dict or namespace. */
enum sp_status sp_jdict_set(struct sp_jarena *a, struct sp_jdict *d, struct sp_jv key, struct sp_jv val);
/* The value stored under key, or NULL. */
struct sp_jv *sp_jdict_get(const struct sp_jdict *d, struct sp_jv key);
struct sp_jv *sp_jdict_get_str(const struct sp_jdict *d, const char *key, size_t n);

/* Converts a cJSON tree. Strings are borrowed from the tree, which must
 * outlive the values. Integral numbers with |x| <= 2^53 become ints. */
enum sp_status sp_jv_from_cjson(struct sp_jarena *a, const cJSON *j, struct sp_jv *out);

/* "str", "dict", ...: Python's name for the type, for error messages. */
const char *sp_jv_type_name(struct sp_jv v);

/* Python truthiness (undefined is false). */
bool sp_jv_truthy(struct sp_jv v);
/* Python ==, with 1 == 1.0 == True and deep comparison of containers.
 * Containers nested deeper than 1000 levels compare unequal rather than
 * exhaust the stack; see also sp_jv_work_reset. */
bool sp_jv_equal(struct sp_jv a, struct sp_jv b);
/* Python ordering of two numbers or two strings (or two lists of those):
 * sets *cmp to -1, 0 or 1, or returns false when Python would raise. */
bool sp_jv_compare(struct sp_jv a, struct sp_jv b, int *cmp);
/* A budget, for the calling thread, of values sp_jv_equal and
 * sp_jv_compare may visit (budget <= 0: unlimited, the default), so that
 * comparing values that share structure exponentially cannot run for ever.
 * Once spent they answer "unequal" / "not comparable" and sp_jv_work_spent()
 * is true until the next reset. */
void sp_jv_work_reset(int64_t budget);
bool sp_jv_work_spent(void);
/* A number (bool, int or float) as a double. */
bool sp_jv_number(struct sp_jv v, double *out);

/* Appends Python's str(v): what `{{ v }}` prints. Fails with SP_ERR_LIMIT
 * (detail recorded) once b holds more than max_len bytes (0: no limit) or
 * for containers nested more than 1000 deep. */
enum sp_status sp_jv_write_str(struct sp_buf *b, struct sp_jv v, size_t max_len);
/* Appends Python's repr(v), with the same limits. */
enum sp_status sp_jv_write_repr(struct sp_buf *b, struct sp_jv v, size_t max_len);
/* Python's repr of a float ("1.0", "1e-05", "inf") into out. */
void sp_jv_format_float(char out[40], double f);

/* Appends json.dumps(v, ensure_ascii=..., indent=indent, separators=...,
 * sort_keys=...). indent NULL means compact; item_sep/key_sep NULL mean
 * Python's defaults for that indent. Fails (SP_ERR_ARG, detail recorded) on
 * values JSON cannot hold. */
struct sp_jv_json_opts {
    const char *indent; // NULL: one line; else the string one level indents by
    const char *item_sep, *key_sep;
    bool sort_keys;
    bool ensure_ascii; // escape every non-ASCII character as \uXXXX
    size_t max_len;    // fail (SP_ERR_LIMIT) once the buffer is longer; 0: no limit
};
enum sp_status sp_jv_write_json(struct sp_buf *b, struct sp_jv v, const struct sp_jv_json_opts *o);

/* Python str.isspace() for one code point. */
bool sp_unicode_isspace(int32_t cp);

#endif
