/*
 * synth.c - writes a model folder with random weights of the exact shapes a
 * config.json describes (see src/model/synth.h). The tests and the demo use
 * it with the tiny configs in tools/tiny/.
 *
 *   build/tools/synth CONFIG.json OUT_DIR [--dtype f32|f16|bf16] [--seed N]
 *                     [--layers N] [--shard-size SIZE] [--init-std X] [--balanced-routing] [--sparse]
 *
 * --balanced-routing spreads tokens over the experts as a trained router does
 * (what `sparrow bench --synthetic` makes; src/model/synth.h says how).
 * --sparse writes files of the right size made of holes: real shapes for
 * `sparrow plan` and `quantize --sparse` without the data.
 */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "core/json.h"
#include "model/synth.h"

int main(int argc, char **argv) {
    const char *config = NULL, *out = NULL;
    struct sp_synth_opts o = {.dtype = SP_DTYPE_F32, .seed = 1};
    for (int i = 1; i < argc; i++) {
        const char *v;
        int64_t n;
        uint64_t sz;
        if (sp_arg_value(argc, argv, &i, "--dtype", &v)) {
            if (!v) return 2;
            if (strcmp(v, "f32") == 0) o.dtype = SP_DTYPE_F32;
            else if (strcmp(v, "f16") == 0) o.dtype = SP_DTYPE_F16;
            else if (strcmp(v, "bf16") == 0) o.dtype = SP_DTYPE_BF16;
            else {
                fprintf(stderr, "error: --dtype must be f32, f16 or bf16\n");
                return 2;
            }
        } else if (sp_arg_value(argc, argv, &i, "--seed", &v)) {
            if (!v || !sp_arg_int("--seed", v, 0, INT64_MAX, &n)) return 2;
            o.seed = (uint64_t)n;
        } else if (sp_arg_value(argc, argv, &i, "--layers", &v)) {
            if (!v || !sp_arg_int("--layers", v, 1, 100000, &o.layers)) return 2;
        } else if (sp_arg_flag(argv[i], "--balanced-routing")) {
            o.balanced_routing = true;
        } else if (sp_arg_flag(argv[i], "--sparse")) {
            o.sparse = true;
        } else if (sp_arg_value(argc, argv, &i, "--init-std", &v)) {
            double x;
            if (!v || !sp_arg_num("--init-std", v, &x) || x <= 0) return 2;
            o.init_std = (float)x;
        } else if (sp_arg_value(argc, argv, &i, "--shard-size", &v)) {
            if (!v || !sp_arg_size("--shard-size", v, &sz)) return 2;
            o.shard_bytes = (size_t)sz;
        } else if (argv[i][0] == '-') {
            return sp_arg_unknown("synth", argv[i]);
        } else if (!config) {
            config = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "error: unexpected argument %s\n", argv[i]);
            return 2;
        }
    }
    if (!config || !out) {
        fprintf(stderr, "usage: synth CONFIG.json OUT_DIR [--dtype f32|f16|bf16] [--seed N] [--layers N] "
                        "[--shard-size SIZE] [--init-std X] [--balanced-routing] [--sparse]\n");
        return 2;
    }
    cJSON *cfg;
    if (sp_json_parse_file(config, 16 << 20, &cfg) != SP_OK) return sp_cli_fail();
    enum sp_status st = sp_pool_create(0, &o.pool);  // every core; the files are the same on any number
    if (st == SP_OK) st = sp_synth_write(cfg, out, &o);
    sp_pool_free(o.pool);
    cJSON_Delete(cfg);
    return st == SP_OK ? 0 : sp_cli_fail();
}
