/*
 * jinja.h - a Jinja template interpreter for chat templates: compile once,
 * render many times with variables given as cJSON trees.
 *
 * It implements the part of jinja2 that model chat templates use, with the
 * semantics Hugging Face transformers renders them with (jinja2's
 * ImmutableSandboxedEnvironment, trim_blocks and lstrip_blocks on, loop
 * controls, transformers' `tojson`, `raise_exception` and `strftime_now`):
 * if/elif/else, for (loop.*, `else`, filtered and unpacking loops, break and
 * continue), set (names, tuples, `ns.attr`, block sets), macros and call
 * blocks, with, filter blocks, raw, comments and whitespace control, and the
 * usual filters, tests and str/dict methods. Values print as Python prints
 * them. Anything unsupported is a clear error, never a guess.
 *
 *     struct sp_jinja *t;
 *     if (sp_jinja_compile(src, strlen(src), &t) != SP_OK) {
 *         fprintf(stderr, "error: %s\n", sp_error_msg());  // "template line 3: ..."
 *         ...
 *     }
 *     struct sp_jinja_var vars[] = {{"messages", messages_json}, {"add_generation_prompt", yes}};
 *     char *text;
 *     size_t len;
 *     if (sp_jinja_render(t, vars, 2, NULL, &text, &len) == SP_OK) { ... sp_free(text); }
 *     sp_jinja_free(t);
 *
 * Errors: compile errors are SP_ERR_FORMAT; errors while rendering (a type
 * error, an undefined value used where jinja2 raises, `raise_exception`) are
 * SP_ERR_ARG; a render that passes a limit (loop iterations, call depth,
 * output or memory size) is SP_ERR_LIMIT. The detail, with the template line,
 * is recorded with sp_errorf. A compiled template is immutable: several
 * threads may render it at once.
 */
#ifndef SP_TEMPLATE_JINJA_H
#define SP_TEMPLATE_JINJA_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <time.h>

#include "core/status.h"

struct sp_jinja;

/* One template variable. The cJSON value is borrowed for the render. */
struct sp_jinja_var {
    const char *name;
    const cJSON *value;
};

struct sp_jinja_opts {
    int64_t max_loop_iterations; // all loops of one render together; 0: 1,000,000
    int max_call_depth;          // nested macro calls; 0: 100
    size_t max_output;           // bytes of rendered text; 0: 16 MiB
    size_t max_memory;           // bytes of values made while rendering; 0: 256 MiB
    int64_t max_compare_work;    // values visited by ==, in, sort... in all; 0: 64M
    time_t now;                  // what strftime_now() formats; 0: the current time
    bool utc;                    // strftime_now in UTC rather than local time
};

/* Compiles len bytes of template text. *out is owned by the caller
 * (sp_jinja_free). The source is copied. */
enum sp_status sp_jinja_compile(const char *src, size_t len, struct sp_jinja **out);
void sp_jinja_free(struct sp_jinja *t);

/* Whether some `for` loop of the template iterates over a variable,
 * attribute or item called `name` (filters applied to it aside): true for
 * `for p in message.content`, `for p in content | list`. Chat code uses it
 * to tell templates that take message content as a list of parts. */
bool sp_jinja_loops_over(const struct sp_jinja *t, const char *name);

/* Renders with the given variables (names may repeat; the last wins). opts
 * may be NULL. *out is a NUL-terminated string owned by the caller (sp_free);
 * *out_len (may be NULL) its length. On failure *out is NULL. */
enum sp_status sp_jinja_render(const struct sp_jinja *t, const struct sp_jinja_var *vars, int64_t n_vars,
                               const struct sp_jinja_opts *opts, char **out, size_t *out_len);

#endif
