/* buf.c - growable byte buffer. */
#include "core/buf.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include "core/alloc.h"

enum sp_status sp_buf_reserve(struct sp_buf *b, size_t extra) {
    if (b->failed) return SP_ERR_NOMEM;
    if (extra > SIZE_MAX / 2 - b->len) goto fail;
    size_t need = b->len + extra + 1;
    if (need <= b->cap) return SP_OK;
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need) cap *= 2;
    char *d = b->data ? sp_realloc(b->data, cap) : sp_malloc(cap, SP_MEM_MISC);
    if (!d) goto fail;
    b->data = d;
    b->cap = cap;
    return SP_OK;
fail:
    b->failed = true;
    return SP_ERR_NOMEM;
}

enum sp_status sp_buf_append(struct sp_buf *b, const void *p, size_t n) {
    if (sp_buf_reserve(b, n) != SP_OK) return SP_ERR_NOMEM;
    if (n) memcpy(b->data + b->len, p, n);
    b->len += n;
    b->data[b->len] = 0;
    return SP_OK;
}

enum sp_status sp_buf_puts(struct sp_buf *b, const char *s) { return sp_buf_append(b, s, strlen(s)); }

enum sp_status sp_buf_putc(struct sp_buf *b, char c) { return sp_buf_append(b, &c, 1); }

enum sp_status sp_buf_printf(struct sp_buf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    enum sp_status st = SP_OK;
    if (n < 0 || sp_buf_reserve(b, (size_t)n) != SP_OK) {
        st = SP_ERR_NOMEM;
    } else {
        vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap2);
        b->len += (size_t)n;
    }
    va_end(ap2);
    return st;
}

void sp_buf_clear(struct sp_buf *b) {
    b->len = 0;
    if (b->data) b->data[0] = 0;
}

void sp_buf_free(struct sp_buf *b) {
    sp_free(b->data);
    *b = (struct sp_buf)SP_BUF_INIT;
}

char *sp_buf_take(struct sp_buf *b) {
    if (!b->data && sp_buf_reserve(b, 0) != SP_OK) return NULL;
    char *d = b->data;
    *b = (struct sp_buf)SP_BUF_INIT;
    return d;
}
