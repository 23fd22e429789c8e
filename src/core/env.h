/*
 * env.h - on/off switches read from the environment.
 *
 *     if (sp_env_on("SPARROW_MMAP")) ...   // set, and not "0"
 */
#ifndef SP_CORE_ENV_H
#define SP_CORE_ENV_H

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

/* Whether environment variable name is set to other than "" or "0". */
static inline bool sp_env_on(const char *name) {
    const char *v = getenv(name);
    return v && *v && strcmp(v, "0") != 0;
}

#endif
