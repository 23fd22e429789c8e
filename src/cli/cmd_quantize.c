/* cmd_quantize.c - `sparrow quantize IN OUT --mode M [--bits B] [--group-size G]`. */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "model/quantize.h"

static const char usage[] =
    "usage: sparrow quantize IN OUT --mode affine|mxfp4|mxfp8|nvfp4|f32|f16|bf16 [--bits B] [--group-size G]\n"
    "                        [--shard-size SIZE] [--threads N] [--sparse]\n"
    "  Writes an MLX-layout copy of model IN to folder OUT: experts stacked, routers\n"
    "  in 8-bit affine (group 64), embeddings and lm_head quantized, norms copied,\n"
    "  config.json with a \"quantization\" section, tokenizer files copied.\n"
    "  affine: --bits 2, 3, 4, 5, 6 or 8 (default 4), --group-size 32, 64 or 128 (default 64).\n"
    "  mxfp4 / mxfp8: group 32; nvfp4: group 16. f32/f16/bf16: dequantized copy.\n"
    "  --threads N quantizes rows on N threads (default: the physical cores); the files are\n"
    "  the same for any N.\n"
    "  --sparse writes the layout only (files of holes): shape-only models for sparrow plan.\n";

int sp_cmd_quantize(int argc, char **argv) {
    const char *in = NULL, *out = NULL, *mode = NULL;
    int64_t bits = 0, group = 0, threads = 0;
    uint64_t shard = 0;
    bool sparse = false;
    for (int i = 1; i < argc; i++) {
        const char *v;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (sp_arg_value(argc, argv, &i, "--mode", &v)) {
            if (!(mode = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--bits", &v)) {
            if (!v || !sp_arg_int("--bits", v, 1, 16, &bits)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--group-size", &v)) {
            if (!v || !sp_arg_int("--group-size", v, 1, 1024, &group)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--threads", &v)) {
            if (!v || !sp_arg_int("--threads", v, 1, 1024, &threads)) return SP_EXIT_USAGE;
        } else if (sp_arg_flag(argv[i], "--sparse")) {
            sparse = true;
        } else if (sp_arg_value(argc, argv, &i, "--shard-size", &v)) {
            if (!v || !sp_arg_size("--shard-size", v, &shard)) return SP_EXIT_USAGE;
        } else if (argv[i][0] == '-') {
            return sp_arg_unknown(argv[0], argv[i]);
        } else if (!in) {
            in = argv[i];
        } else if (!out) {
            out = argv[i];
        } else {
            fprintf(stderr, "error: quantize: unexpected argument %s\n", argv[i]);
            return SP_EXIT_USAGE;
        }
    }
    if (!in || !out || !mode) {
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    struct sp_quantize_opts o = {.group = (int)group, .shard_bytes = (size_t)shard, .sparse = sparse};
    if (strcmp(mode, "affine") == 0) {
        if (sp_qtype_from_mode("affine", bits ? (int)bits : 4, &o.type) != SP_OK) return sp_cli_fail();
    } else if (strcmp(mode, "f32") == 0 || strcmp(mode, "f16") == 0 || strcmp(mode, "bf16") == 0) {
        sp_qtype_from_name(mode, &o.type);
        if (bits || group) {
            fprintf(stderr, "error: quantize: --bits and --group-size do not apply to --mode %s\n", mode);
            return SP_EXIT_USAGE;
        }
    } else {
        const struct sp_qtype_traits *tr = NULL;
        if (sp_qtype_from_name(mode, &o.type)) tr = sp_qtype_traits(o.type);
        if (!tr || !tr->mode || tr->block_bytes) {  // block formats are read from GGUF files, not written
            fprintf(stderr, "error: quantize: unknown --mode %s (affine, mxfp4, mxfp8, nvfp4, f32, f16, bf16)\n", mode);
            return SP_EXIT_USAGE;
        }
        if (bits && bits != tr->bits) {
            fprintf(stderr, "error: quantize: %s has %d bits\n", mode, tr->bits);
            return SP_EXIT_USAGE;
        }
    }
    struct sp_model *m;
    if (sp_cli_model_open(NULL, in, &m) != SP_OK) return sp_cli_fail();
    enum sp_status st = sp_pool_create((int)threads, &o.pool);
    if (st == SP_OK) st = sp_quantize_model(m, out, &o);
    sp_pool_free(o.pool);
    sp_model_close(m);
    if (st != SP_OK) return sp_cli_fail();
    return 0;
}
