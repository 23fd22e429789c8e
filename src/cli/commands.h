/*
 * commands.h - the subcommands of the `sparrow` binary. Each takes the
 * arguments after the program name (argv[0] is the subcommand's own name)
 * and returns the process exit code; errors go to stderr as "error: ...".
 */
#ifndef SP_CLI_COMMANDS_H
#define SP_CLI_COMMANDS_H

int sp_cmd_inspect(int argc, char **argv);
int sp_cmd_run(int argc, char **argv);
int sp_cmd_serve(int argc, char **argv);
int sp_cmd_bench(int argc, char **argv);
int sp_cmd_plan(int argc, char **argv);
int sp_cmd_quantize(int argc, char **argv);
int sp_cmd_tokenize(int argc, char **argv);
int sp_cmd_detokenize(int argc, char **argv);
int sp_cmd_template(int argc, char **argv);

#endif
