/*
 * jinja_render.c - renders one Jinja template with the members of a JSON
 * object as its variables, for comparing sparrow's interpreter with Python's
 * jinja2 (tools/jinja_diff.py).
 *
 *   build/tools/jinja_render TEMPLATE_FILE [CONTEXT.json]
 *
 * Prints the rendered text exactly, or "ERROR: <detail>" and exits 1.
 * strftime_now() prints 2026-01-15 (UTC), like the other reference tools.
 */
#include <stdio.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"
#include "template/jinja.h"

int main(int argc, char **argv) {
    if (argc < 2 || argc > 3) {
        fputs("usage: jinja_render TEMPLATE_FILE [CONTEXT.json]\n", stderr);
        return 2;
    }
    sp_mem_hook_cjson();
    int rc = 1;
    char *src = NULL, *out = NULL;
    size_t len, out_len;
    cJSON *ctx = NULL;
    struct sp_jinja *t = NULL;
    struct sp_jinja_var vars[256];
    int64_t n = 0;
    if (sp_read_file(argv[1], (size_t)1 << 24, &src, &len) != SP_OK) goto fail;
    if (argc == 3 && sp_json_parse_file(argv[2], (size_t)1 << 26, &ctx) != SP_OK) goto fail;
    if (ctx && !cJSON_IsObject(ctx)) {
        sp_errorf(SP_ERR_ARG, "%s: the context must be a JSON object", argv[2]);
        goto fail;
    }
    for (const cJSON *c = ctx ? ctx->child : NULL; c && n < 256; c = c->next)
        vars[n++] = (struct sp_jinja_var){c->string, c};
    if (sp_jinja_compile(src, len, &t) != SP_OK) goto fail;
    struct sp_jinja_opts o = {.now = 1768435200, .utc = true};
    if (sp_jinja_render(t, vars, n, &o, &out, &out_len) != SP_OK) goto fail;
    fwrite(out, 1, out_len, stdout);
    rc = 0;
fail:
    if (rc) printf("ERROR: %s", sp_error_msg());
    sp_free(out);
    sp_jinja_free(t);
    cJSON_Delete(ctx);
    sp_free(src);
    return rc;
}
