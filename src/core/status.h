/*
 * status.h - the one status enum of sparrow and the human detail behind it.
 *
 * Fallible functions return an enum sp_status and hand results back through
 * out-pointers. The sentence that explains a failure ("shard 3: tensor X:
 * header says 4096x1408, file holds 5 MB") is recorded with sp_errorf() in a
 * thread-local slot and read back with sp_error_msg() by whoever reports it;
 * objects that outlive the call copy it if they need to keep it.
 *
 *     if (bad) return sp_errorf(SP_ERR_FORMAT, "%s: header too long", path);
 *     ...
 *     enum sp_status st = sp_st_open(path, &f);
 *     if (st != SP_OK) fprintf(stderr, "error: %s\n", sp_error_msg());
 */
#ifndef SP_CORE_STATUS_H
#define SP_CORE_STATUS_H

#include <stdio.h>
#include <stdlib.h>

#define SP_STATUS_LIST(X)                                                  \
    X(OK, "ok")                                                            \
    X(ERR_IO, "input/output error")                                        \
    X(ERR_NOMEM, "out of memory")                                          \
    X(ERR_NOT_FOUND, "not found")                                          \
    X(ERR_FORMAT, "malformed input")                                       \
    X(ERR_UNSUPPORTED, "not supported")                                    \
    X(ERR_ARG, "invalid argument")                                         \
    X(ERR_LIMIT, "limit exceeded")                                         \
    X(ERR_STATE, "invalid state")

enum sp_status {
#define SP_X(name, text) SP_##name,
    SP_STATUS_LIST(SP_X)
#undef SP_X
        SP_STATUS_COUNT
};

/* A short constant description of a status ("malformed input"). */
const char *sp_status_str(enum sp_status st);

/* Records printf-style detail for the calling thread and returns st, so a
 * failure can be reported and returned in one statement. The arguments may
 * include sp_error_msg() to wrap the detail recorded before. */
enum sp_status sp_errorf(enum sp_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

/* Prefixes the recorded detail with more context ("config.json: " + detail). */
void sp_error_prefix(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The detail recorded last on this thread; valid until the next sp_errorf.
 * Never NULL: falls back to the status text when no detail was given. */
const char *sp_error_msg(void);

/* Forgets the recorded detail. */
void sp_error_clear(void);

/* Always-on assertion for broken invariants (never for bad input). */
#define SP_ASSERT(cond)                                                      \
    do {                                                                     \
        if (!(cond)) sp_assert_fail(#cond, __FILE__, __LINE__);              \
    } while (0)

_Noreturn void sp_assert_fail(const char *expr, const char *file, int line);

#endif
