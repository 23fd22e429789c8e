/* status.c - status names and the thread-local error detail. */
#include "core/status.h"

#include <stdarg.h>
#include <string.h>

static const char *const status_text[SP_STATUS_COUNT] = {
#define SP_X(name, text) text,
    SP_STATUS_LIST(SP_X)
#undef SP_X
};

static _Thread_local char err_msg[1024];
static _Thread_local enum sp_status err_status;

const char *sp_status_str(enum sp_status st) {
    if ((unsigned)st >= SP_STATUS_COUNT) return "unknown status";
    return status_text[st];
}

enum sp_status sp_errorf(enum sp_status st, const char *fmt, ...) {
    /* Format into a copy: the arguments may include sp_error_msg() itself. */
    char msg[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    memcpy(err_msg, msg, sizeof msg);
    err_status = st;
    return st;
}

void sp_error_prefix(const char *fmt, ...) {
    char prefix[512], old[sizeof err_msg];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(old, err_msg, sizeof old);
    size_t pl = strlen(prefix), ol = strlen(old);
    if (pl > sizeof err_msg - 1) pl = sizeof err_msg - 1;
    if (ol > sizeof err_msg - 1 - pl) ol = sizeof err_msg - 1 - pl;
    memcpy(err_msg, prefix, pl);
    memcpy(err_msg + pl, old, ol);
    err_msg[pl + ol] = 0;
}

const char *sp_error_msg(void) {
    if (err_msg[0]) return err_msg;
    return sp_status_str(err_status);
}

void sp_error_clear(void) {
    err_msg[0] = 0;
    err_status = SP_OK;
}

void sp_assert_fail(const char *expr, const char *file, int line) {
    fprintf(stderr, "sparrow: assertion failed: %s (%s:%d)\n", expr, file, line);
    abort();
}
