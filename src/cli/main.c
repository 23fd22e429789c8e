/*
 * main.c - the `sparrow` binary: dispatches to one subcommand per file.
 */
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "core/alloc.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"serve", sp_cmd_serve, "the OpenAI-compatible server"},
    {"run", sp_cmd_run, "generate from a prompt on the command line"},
    {"plan", sp_cmd_plan, "the memory plan: what stays resident, the expert cache, expected speed"},
    {"inspect", sp_cmd_inspect, "architecture, parameters and bytes by role and format"},
    {"bench", sp_cmd_bench, "prefill and decode speed, bytes per token, bandwidth efficiency"},
    {"quantize", sp_cmd_quantize, "write an MLX-layout quantized copy of a model"},
    {"tokenize", sp_cmd_tokenize, "print the token ids of a text"},
    {"detokenize", sp_cmd_detokenize, "print the text of token ids"},
    {"template", sp_cmd_template, "render a chat template"},
};

static void usage(FILE *f) {
    fputs("usage: sparrow COMMAND [options]   (sparrow COMMAND --help for details)\n\ncommands:\n", f);
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv) {
    /* every cJSON object, parsed or built, goes through the accounting allocator */
    sp_mem_hook_cjson();
    if (argc < 2) {
        usage(stderr);
        return SP_EXIT_USAGE;
    }
    if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
        usage(stdout);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (strcmp(argv[1], commands[i].name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "error: unknown command \"%s\"\n", argv[1]);
    usage(stderr);
    return SP_EXIT_USAGE;
}
