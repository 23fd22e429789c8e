/*
 * buf.h - a growable byte buffer, always NUL-terminated.
 *
 *     struct sp_buf b = SP_BUF_INIT;
 *     sp_buf_printf(&b, "%d tensors", n);
 *     puts(b.data);
 *     sp_buf_free(&b);
 *
 * b.data is owned by the buffer and moves when it grows. After an allocation
 * failure the buffer keeps its old contents and `failed` is set; the append
 * functions then return SP_ERR_NOMEM.
 */
#ifndef SP_CORE_BUF_H
#define SP_CORE_BUF_H

#include <stdbool.h>
#include <stddef.h>

#include "core/status.h"

struct sp_buf {
    char *data;
    size_t len;
    size_t cap;
    bool failed;
};

#define SP_BUF_INIT {0}

enum sp_status sp_buf_reserve(struct sp_buf *b, size_t extra);
enum sp_status sp_buf_append(struct sp_buf *b, const void *p, size_t n);
enum sp_status sp_buf_puts(struct sp_buf *b, const char *s);
enum sp_status sp_buf_putc(struct sp_buf *b, char c);
enum sp_status sp_buf_printf(struct sp_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void sp_buf_clear(struct sp_buf *b);
void sp_buf_free(struct sp_buf *b);
/* Hands the bytes to the caller (free with sp_free) and resets the buffer. */
char *sp_buf_take(struct sp_buf *b);

#endif
