/* cmd_inspect.c - `sparrow inspect MODEL [--json]`. */
#include <stdio.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/buf.h"
#include "model/inspect.h"

static const char usage[] =
    "usage: sparrow inspect MODEL [--json]\n"
    "  Prints the architecture, layer and expert counts, parameters and bytes by\n"
    "  tensor role and by format, and the parameters active per token. MODEL is a\n"
    "  folder or a Hugging Face id (org/name) in the Hugging Face cache.\n";

int sp_cmd_inspect(int argc, char **argv) {
    const char *model = NULL;
    bool json = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (sp_arg_flag(argv[i], "--json")) {
            json = true;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!v) return SP_EXIT_USAGE;
            model = v;
        } else if (argv[i][0] == '-') {
            return sp_arg_unknown(argv[0], argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            fprintf(stderr, "error: inspect: unexpected argument %s\n", argv[i]);
            return SP_EXIT_USAGE;
        }
    }
    if (!model) {
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    struct sp_model *m;
    if (sp_cli_model_open(NULL, model, &m) != SP_OK) return sp_cli_fail();
    struct sp_model_stats s;
    sp_model_stats(m, &s);
    struct sp_buf out = SP_BUF_INIT;
    sp_model_report(m, &s, json, &out);
    fwrite(out.data, 1, out.len, stdout);
    sp_buf_free(&out);
    sp_model_close(m);
    return 0;
}
