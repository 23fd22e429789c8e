/*
 * args.h - small helpers shared by the subcommands for reading flags.
 *
 *     for (int i = 1; i < argc; i++) {
 *         const char *v;
 *         if (sp_arg_value(argc, argv, &i, "--model", &v)) model = v;
 *         else if (sp_arg_flag(argv[i], "--json")) json = true;
 *         else return sp_arg_unknown(argv[0], argv[i]);
 *     }
 */
#ifndef SP_CLI_ARGS_H
#define SP_CLI_ARGS_H

#include <stdbool.h>
#include <stdint.h>

/* Matches "--name VALUE" or "--name=VALUE"; advances *i past the value.
 * A missing value prints an error and leaves *out NULL (returns true). */
bool sp_arg_value(int argc, char **argv, int *i, const char *name, const char **out);
bool sp_arg_flag(const char *arg, const char *name);
/* Prints "error: <cmd>: unknown option X" and returns the usage exit code. */
int sp_arg_unknown(const char *cmd, const char *arg);
/* Parses an integer / a number; prints an error naming the flag on failure. */
bool sp_arg_int(const char *flag, const char *v, int64_t min, int64_t max, int64_t *out);
bool sp_arg_num(const char *flag, const char *v, double *out);
/* A number from lo to hi inclusive; the error names the flag and the range. */
bool sp_arg_range(const char *flag, const char *v, double lo, double hi, double *out);
/* "512M", "24G", "1.5G", "4096" (bytes); K/M/G/T are powers of 1024. */
bool sp_arg_size(const char *flag, const char *v, uint64_t *out);
/* Prints the message recorded by the library as "error: ...". */
int sp_cli_fail(void);

#define SP_EXIT_USAGE 2

#endif
