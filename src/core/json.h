/*
 * json.h - reading JSON through cJSON with typed, checked getters, and a
 * small streaming writer for everything sparrow prints.
 *
 * Reading:
 *     cJSON *root;
 *     if (sp_json_parse(text, len, "config.json", &root) != SP_OK) ...
 *     int64_t n;
 *     st = sp_json_get_int(root, "num_experts", 0, &n);   // absent -> 0
 *     cJSON_Delete(root);
 *
 * A getter returns SP_OK when the key is absent (the default is stored) or
 * holds the right type, and SP_ERR_FORMAT naming the key otherwise. Strings
 * from sp_json_get_str are borrowed from the tree.
 *
 * Writing:
 *     struct sp_jw w;
 *     sp_jw_init(&w, &buf, 0);            // 0: compact; 4: indent by 4
 *     sp_jw_obj(&w);
 *     sp_jw_key(&w, "event"); sp_jw_str(&w, "ready");
 *     sp_jw_end(&w);
 *
 * The writer escapes strings, replaces invalid UTF-8 with U+FFFD, prints
 * floats in the shortest form that reads back to the same double and
 * non-finite numbers as null.
 */
#ifndef SP_CORE_JSON_H
#define SP_CORE_JSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"

/* Parses len bytes; `what` names the input in error messages. The tree is
 * owned by the caller (cJSON_Delete). */
enum sp_status sp_json_parse(const char *text, size_t len, const char *what, cJSON **out);
/* Reads and parses a file of at most max_bytes. */
enum sp_status sp_json_parse_file(const char *path, size_t max_bytes, cJSON **out);

enum sp_status sp_json_get_int(const cJSON *obj, const char *key, int64_t def, int64_t *out);
enum sp_status sp_json_get_num(const cJSON *obj, const char *key, double def, double *out);
enum sp_status sp_json_get_bool(const cJSON *obj, const char *key, bool def, bool *out);
enum sp_status sp_json_get_str(const cJSON *obj, const char *key, const char *def, const char **out);
/* The value of a hexadecimal digit (either case), or -1: for JSON's \\u
 * escapes and the other hex text a model's files hold. */
static inline int sp_hex_digit(int c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

/* A JSON number that is an integer (no fraction, |x| <= 2^53). */
bool sp_json_is_int(const cJSON *item, int64_t *out);
/* "string", "number", ...: for error messages. */
const char *sp_json_type_name(const cJSON *item);

#define SP_JW_DEPTH 64

struct sp_jw {
    struct sp_buf *out;
    int indent;  // spaces per level; 0 writes compact JSON
    int depth;
    bool first[SP_JW_DEPTH];  // no element written yet at this depth
    bool is_arr[SP_JW_DEPTH];  // the container at this depth is an array
    bool after_key;
};

void sp_jw_init(struct sp_jw *w, struct sp_buf *out, int indent);
void sp_jw_obj(struct sp_jw *w);
void sp_jw_arr(struct sp_jw *w);
void sp_jw_end(struct sp_jw *w);
void sp_jw_key(struct sp_jw *w, const char *key);
void sp_jw_str(struct sp_jw *w, const char *s);
void sp_jw_strn(struct sp_jw *w, const char *s, size_t n);
void sp_jw_int(struct sp_jw *w, int64_t v);
void sp_jw_uint(struct sp_jw *w, uint64_t v);
void sp_jw_num(struct sp_jw *w, double v);
void sp_jw_bool(struct sp_jw *w, bool v);
void sp_jw_null(struct sp_jw *w);
/* Writes a parsed cJSON value (numbers that are integers print as such). */
void sp_jw_cjson(struct sp_jw *w, const cJSON *item);
/* Appends s as a JSON string literal (quotes included) to b. */
void sp_json_escape(struct sp_buf *b, const char *s, size_t n);
/* A new empty object, cJSON's allocator hooked to sp_malloc first (as
 * sp_json_parse does): every node a process frees must come from the one
 * allocator. NULL when out of memory. */
cJSON *sp_json_object(void);
/* Shortest decimal form of d that reads back exactly; "null" if not finite. */
void sp_json_format_double(char out[32], double d);

#endif
