/* json.c - checked cJSON getters and the JSON writer. */
#include "core/json.h"

#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "core/file.h"

static pthread_once_t hook_once = PTHREAD_ONCE_INIT;

static void line_col(const char *text, size_t off, int *line, int *col) {
    *line = 1;
    *col = 1;
    for (size_t i = 0; i < off; i++) {
        if (text[i] == '\n') {
            (*line)++;
            *col = 1;
        } else {
            (*col)++;
        }
    }
}

cJSON *sp_json_object(void) {
    pthread_once(&hook_once, sp_mem_hook_cjson);
    return cJSON_CreateObject();
}

enum sp_status sp_json_parse(const char *text, size_t len, const char *what, cJSON **out) {
    pthread_once(&hook_once, sp_mem_hook_cjson);
    const char *end = NULL;
    *out = cJSON_ParseWithLengthOpts(text, len, &end, false);
    if (*out) {
        /* cJSON stops after the first value; anything but whitespace after it is an error. */
        size_t off = (size_t)(end - text);
        while (off < len && strchr(" \t\r\n", text[off]) && text[off]) off++;
        if (off == len) return SP_OK;
        cJSON_Delete(*out);
        *out = NULL;
        int line, col;
        line_col(text, off, &line, &col);
        return sp_errorf(SP_ERR_FORMAT, "%s: invalid JSON: unexpected data after the value at line %d, column %d", what, line, col);
    }
    if (!end || end < text || (size_t)(end - text) > len) end = text;
    int line, col;
    line_col(text, (size_t)(end - text), &line, &col);
    if (len == 0) return sp_errorf(SP_ERR_FORMAT, "%s: invalid JSON: empty input", what);
    return sp_errorf(SP_ERR_FORMAT, "%s: invalid JSON at line %d, column %d", what, line, col);
}

enum sp_status sp_json_parse_file(const char *path, size_t max_bytes, cJSON **out) {
    char *text;
    size_t len;
    *out = NULL;
    enum sp_status st = sp_read_file(path, max_bytes, &text, &len);
    if (st != SP_OK) return st;
    st = sp_json_parse(text, len, path, out);
    sp_free(text);
    return st;
}

const char *sp_json_type_name(const cJSON *item) {
    if (!item) return "nothing";
    if (cJSON_IsString(item)) return "a string";
    if (cJSON_IsNumber(item)) return "a number";
    if (cJSON_IsBool(item)) return "a boolean";
    if (cJSON_IsNull(item)) return "null";
    if (cJSON_IsArray(item)) return "an array";
    if (cJSON_IsObject(item)) return "an object";
    return "an invalid value";
}

bool sp_json_is_int(const cJSON *item, int64_t *out) {
    if (!cJSON_IsNumber(item)) return false;
    double d = item->valuedouble;
    if (!(fabs(d) <= 9007199254740992.0) || d != floor(d)) return false;
    if (out) *out = (int64_t)d;
    return true;
}

static enum sp_status type_error(const cJSON *item, const char *key, const char *want) {
    return sp_errorf(SP_ERR_FORMAT, "\"%s\": expected %s, got %s", key, want, sp_json_type_name(item));
}

enum sp_status sp_json_get_int(const cJSON *obj, const char *key, int64_t def, int64_t *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = def;
    if (!it || cJSON_IsNull(it)) return SP_OK;
    if (!sp_json_is_int(it, out)) return type_error(it, key, "an integer");
    return SP_OK;
}

enum sp_status sp_json_get_num(const cJSON *obj, const char *key, double def, double *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = def;
    if (!it || cJSON_IsNull(it)) return SP_OK;
    if (!cJSON_IsNumber(it)) return type_error(it, key, "a number");
    *out = it->valuedouble;
    return SP_OK;
}

enum sp_status sp_json_get_bool(const cJSON *obj, const char *key, bool def, bool *out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = def;
    if (!it || cJSON_IsNull(it)) return SP_OK;
    if (!cJSON_IsBool(it)) return type_error(it, key, "a boolean");
    *out = cJSON_IsTrue(it);
    return SP_OK;
}

enum sp_status sp_json_get_str(const cJSON *obj, const char *key, const char *def, const char **out) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *out = def;
    if (!it || cJSON_IsNull(it)) return SP_OK;
    if (!cJSON_IsString(it)) return type_error(it, key, "a string");
    *out = it->valuestring;
    return SP_OK;
}

/* ---- writer ---- */

void sp_jw_init(struct sp_jw *w, struct sp_buf *out, int indent) {
    memset(w, 0, sizeof *w);
    w->out = out;
    w->indent = indent;
    w->first[0] = true;
}

static void newline(struct sp_jw *w) {
    if (!w->indent) return;
    sp_buf_putc(w->out, '\n');
    for (int i = 0; i < w->depth * w->indent; i++) sp_buf_putc(w->out, ' ');
}

/* Separator before a value or a key. */
static void before_value(struct sp_jw *w) {
    if (w->after_key) {
        w->after_key = false;
        return;
    }
    if (w->depth > 0) {
        if (!w->first[w->depth]) sp_buf_putc(w->out, ',');
        newline(w);
    }
    w->first[w->depth] = false;
}

static void open_container(struct sp_jw *w, char c) {
    before_value(w);
    sp_buf_putc(w->out, c);
    SP_ASSERT(w->depth + 1 < SP_JW_DEPTH);
    w->depth++;
    w->first[w->depth] = true;
    w->is_arr[w->depth] = c == '[';
}

void sp_jw_obj(struct sp_jw *w) { open_container(w, '{'); }
void sp_jw_arr(struct sp_jw *w) { open_container(w, '['); }

void sp_jw_end(struct sp_jw *w) {
    SP_ASSERT(w->depth > 0 && !w->after_key);
    char c = w->is_arr[w->depth] ? ']' : '}';
    bool empty = w->first[w->depth];
    w->depth--;
    if (!empty) newline(w);
    sp_buf_putc(w->out, c);
}

static size_t utf8_valid_len(const unsigned char *s, size_t n) {
    /* Length of the valid UTF-8 sequence at s, or 0 if it is not one. */
    unsigned c = s[0];
    size_t len;
    unsigned min;
    if (c < 0x80) return 1;
    if (c >= 0xc2 && c <= 0xdf) { len = 2; min = 0x80; }
    else if (c >= 0xe0 && c <= 0xef) { len = 3; min = 0x800; }
    else if (c >= 0xf0 && c <= 0xf4) { len = 4; min = 0x10000; }
    else return 0;
    if (n < len) return 0;
    unsigned cp = c & (0x7f >> len);
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xc0) != 0x80) return 0;
        cp = (cp << 6) | (s[i] & 0x3f);
    }
    if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
    return len;
}

void sp_json_escape(struct sp_buf *b, const char *str, size_t n) {
    const unsigned char *s = (const unsigned char *)str;
    sp_buf_reserve(b, n + 2);
    sp_buf_putc(b, '"');
    size_t i = 0;
    while (i < n) {
        unsigned c = s[i];
        if (c >= 0x80) {
            size_t l = utf8_valid_len(s + i, n - i);
            if (l) {
                sp_buf_append(b, s + i, l);
                i += l;
            } else {
                sp_buf_puts(b, "\xef\xbf\xbd");
                i++;
            }
            continue;
        }
        switch (c) {
        case '"': sp_buf_puts(b, "\\\""); break;
        case '\\': sp_buf_puts(b, "\\\\"); break;
        case '\n': sp_buf_puts(b, "\\n"); break;
        case '\r': sp_buf_puts(b, "\\r"); break;
        case '\t': sp_buf_puts(b, "\\t"); break;
        case '\b': sp_buf_puts(b, "\\b"); break;
        case '\f': sp_buf_puts(b, "\\f"); break;
        default:
            if (c < 0x20 || c == 0x7f)
                sp_buf_printf(b, "\\u%04x", c);
            else
                sp_buf_putc(b, (char)c);
        }
        i++;
    }
    sp_buf_putc(b, '"');
}

void sp_json_format_double(char out[32], double d) {
    if (!isfinite(d)) {
        strcpy(out, "null");
        return;
    }
    if (d == floor(d) && fabs(d) < 1e15) {
        snprintf(out, 32, "%.0f", d);
        if (strcmp(out, "-0") == 0) strcpy(out, "-0.0");
        return;
    }
    for (int prec = 6; prec <= 17; prec++) {
        snprintf(out, 32, "%.*g", prec, d);
        if (strtod(out, NULL) == d) return;
    }
}

void sp_jw_key(struct sp_jw *w, const char *key) {
    SP_ASSERT(w->depth > 0 && !w->is_arr[w->depth] && !w->after_key);
    before_value(w);
    sp_json_escape(w->out, key, strlen(key));
    sp_buf_puts(w->out, w->indent ? ": " : ":");
    w->after_key = true;
}

void sp_jw_strn(struct sp_jw *w, const char *s, size_t n) {
    before_value(w);
    sp_json_escape(w->out, s, n);
}

void sp_jw_str(struct sp_jw *w, const char *s) {
    if (!s) {
        sp_jw_null(w);
        return;
    }
    sp_jw_strn(w, s, strlen(s));
}

void sp_jw_int(struct sp_jw *w, int64_t v) {
    before_value(w);
    sp_buf_printf(w->out, "%lld", (long long)v);
}

void sp_jw_uint(struct sp_jw *w, uint64_t v) {
    before_value(w);
    sp_buf_printf(w->out, "%llu", (unsigned long long)v);
}

void sp_jw_num(struct sp_jw *w, double v) {
    char tmp[32];
    sp_json_format_double(tmp, v);
    before_value(w);
    sp_buf_puts(w->out, tmp);
}

void sp_jw_bool(struct sp_jw *w, bool v) {
    before_value(w);
    sp_buf_puts(w->out, v ? "true" : "false");
}

void sp_jw_null(struct sp_jw *w) {
    before_value(w);
    sp_buf_puts(w->out, "null");
}

void sp_jw_cjson(struct sp_jw *w, const cJSON *item) {
    int64_t iv;
    if (cJSON_IsObject(item)) {
        sp_jw_obj(w);
        for (const cJSON *c = item->child; c; c = c->next) {
            sp_jw_key(w, c->string ? c->string : "");
            sp_jw_cjson(w, c);
        }
        sp_jw_end(w);
    } else if (cJSON_IsArray(item)) {
        sp_jw_arr(w);
        for (const cJSON *c = item->child; c; c = c->next) sp_jw_cjson(w, c);
        sp_jw_end(w);
    } else if (cJSON_IsString(item)) {
        sp_jw_str(w, item->valuestring);
    } else if (sp_json_is_int(item, &iv)) {
        sp_jw_int(w, iv);
    } else if (cJSON_IsNumber(item)) {
        sp_jw_num(w, item->valuedouble);
    } else if (cJSON_IsBool(item)) {
        sp_jw_bool(w, cJSON_IsTrue(item));
    } else {
        sp_jw_null(w);
    }
}
