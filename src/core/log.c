/* log.c - leveled logging to stderr; one locked write per line. */
#include "core/log.h"

#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>

static atomic_int current_level = SP_LOG_INFO;
static const char *const level_names[SP_LOG_LEVEL_COUNT] = {"error", "warn", "info", "debug"};

void sp_log_set_level(enum sp_log_level level) { atomic_store(&current_level, (int)level); }
enum sp_log_level sp_log_get_level(void) { return (enum sp_log_level)atomic_load(&current_level); }

void sp_log(enum sp_log_level level, const char *fmt, ...) {
    if ((int)level > atomic_load(&current_level)) return;
    char line[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    flockfile(stderr);
    fprintf(stderr, "%s: %s\n", level_names[level], line);
    funlockfile(stderr);
}
