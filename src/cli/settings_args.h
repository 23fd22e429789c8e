/*
 * settings_args.h - the settings (core/settings.h) on the command line:
 * the environment read once per command, the settings' flags taken
 * between a command's own, and the values handed to the library as the
 * parameters it takes: the kernel set made current, the expert cache's and
 * the loader's params, the folders a model id and a plan look in.
 *
 *     struct sp_settings s;
 *     if ((rc = sp_cli_settings_init(&s))) return rc;        // SPARROW_* variables, folders
 *     for (int i = 1; i < argc; i++) {
 *         if (sp_cli_settings_arg(argc, argv, &i, &s, &rc)) { if (rc) return rc; continue; }
 *         ...the command's own flags...
 *     }
 *     if ((rc = sp_cli_kernels_use(&s))) return rc;           // before weights are loaded
 *     sp_cli_model_open(&s, spec, &m);
 */
#ifndef SP_CLI_SETTINGS_ARGS_H
#define SP_CLI_SETTINGS_ARGS_H

#include <stdbool.h>

#include "backend/backend.h"
#include "core/settings.h"
#include "runtime/experts.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/ranks.h"
#include "runtime/plan.h"

/* The help lines of the settings' flags (serve, run, bench). */
#define SP_CLI_SETTINGS_USAGE                                                                                   \
    "  --kernels NAME         the kernel set: portable, avx2, avx2-int16, avx2f, avxvnni, avxvnni-int16,\n"    \
    "                         avx512, avx512-int16, amx, amx-int16 (default: the fastest this CPU runs)\n"     \
    "  --precision fast|exact fast: the fastest set (default); exact: the fastest that keeps activations\n"    \
    "                         in float (avx2f, else portable; on CUDA, float instead of int8 activations\n"  \
    "                         in 4-bit products). --kernels and --precision exclude each other\n"           \
    "  --io auto|buffered|pread|mapped  how the expert cache reads: io_uring with O_DIRECT where the\n"       \
    "                         files allow (auto), io_uring through the page cache, pread, or copies out\n"   \
    "                         of the files' mappings\n"                                                     \
    "  --expert-policy arc|lru|clock  the expert cache's replacement (default arc)\n"                           \
    "  --no-prefetch          do not read (or copy to the GPU) ahead the next MoE layer's predicted experts\n" \
    "  --mmap                 keep resident weights in the files' pages (no copies, rows in order)\n"           \
    "  --row-order            keep weight matrices in row order (none interleaved for the kernels)\n"           \
    "  --device cpu|cuda      where the forward pass runs (default cpu; cuda: every weight on the GPU, in\n"    \
    "                         row order; needs a build with make CUDA=1)\n"                                      \
    "  --no-cpu-experts       with a GPU expert cache, copy in every expert the GPU lacks (default: the\n"  \
    "                         CPU computes those it would finish sooner while the others are copied in)\n" \
    "  --cuda-graphs          with --device cuda, record steps of up to 64 tokens and replay them as CUDA\n" \
    "                         graphs (default: every kernel queued as it comes)\n"                         \
    "  --no-cuda-overlap      with --device cuda, start each kernel only once the one before has ended\n"    \
    "                         (default: it starts early and waits inside, on GPUs that can)\n"             \
    "  --devices LIST         with --device cuda, the routed experts split over those GPUs (e.g. 0,1)\n"    \
    "  --expert-load FILE     split the experts so that each GPU or rank takes about as many tokens, by\n"    \
    "                         the routing counts FILE holds (--record-routing; default: as many experts)\n"  \
    "  --record-routing FILE  write how many tokens each expert of each layer took to FILE at the end\n"     \
    "                         (JSON; the routing then runs on the host)\n"                                   \
    "  Each also from SPARROW_KERNELS, SPARROW_PRECISION, SPARROW_IO, SPARROW_EXPERT_POLICY,\n"                 \
    "  SPARROW_PREFETCH=0, SPARROW_MMAP=1, SPARROW_ROW_ORDER=1, SPARROW_DEVICE, SPARROW_CPU_EXPERTS=0,\n"       \
    "  SPARROW_CUDA_GRAPHS=1, SPARROW_CUDA_OVERLAP=0, SPARROW_DEVICES, SPARROW_EXPERT_LOAD,\n"                  \
    "  SPARROW_RECORD_ROUTING; a flag overrides its variable.\n"                                              \
    "  As ranks of a launcher's processes (WORLD_SIZE, RANK, LOCAL_RANK, MASTER_ADDR,\n"                \
    "  MASTER_PORT, as torchrun sets them): the routed experts split over the processes\n"              \
    "  --quiet                warnings and errors only on stderr: no info lines, no load progress\n"

/* Settings from this process's environment; 0, or the usage exit code
 * with the error printed. */
int sp_cli_settings_init(struct sp_settings *s);
/* When argv[*i] is one of the settings' flags ("--io pread", "--io=pread",
 * "--mmap"), applies it, moves *i past its value and returns true; *rc is
 * 0, or the usage exit code with the error printed. --quiet, taken here
 * too, lowers the log level to warnings (sp_log_set_level). */
bool sp_cli_settings_arg(int argc, char **argv, int *i, struct sp_settings *s, int *rc);
/* Makes the kernel set s chooses current (sp_kernels_use); 0, or the
 * usage exit code with an error that lists the sets this CPU runs. */
int sp_cli_kernels_use(const struct sp_settings *s);
/* The device s chooses, when this build has its backend; else the usage
 * exit code with an error that says how to get one. */
int sp_cli_device(const struct sp_settings *s, enum sp_device *out);
/* Where s says this process is one rank of several (WORLD_SIZE > 1):
 * joins the others (sp_ranks_connect, for up to 120 s) and makes cp that
 * rank's (cp's model m and batch as every rank's must be); *g the group,
 * to free after the context (NULL alone). Other ranks than 0 print nothing
 * on stdout: rank 0 speaks for them. */
enum sp_status sp_cli_join_ranks(const struct sp_settings *s, const struct sp_model *m, struct sp_ctx_params *cp,
                                 struct sp_ranks **g);
/* The routing settings of s for model m: the expert load --expert-load
 * names, read into *load (owned: sp_free after the context; NULL where
 * none is named), and *count_routes where --record-routing names a file
 * (NULL: a command that refused recording before). A load where nothing
 * splits the experts (no --devices of several GPUs, no WORLD_SIZE) is
 * refused: it would place nothing; so is a recording of a model without
 * routed experts, or one rank 0 cannot write. */
enum sp_status sp_cli_routing(const struct sp_settings *s, const struct sp_model *m, double **load, bool *count_routes);
/* Writes counts (sp_ctx_route_counts) where --record-routing says, from
 * rank 0 alone; nothing where it names no file. */
enum sp_status sp_cli_routing_save(const struct sp_settings *s, const struct sp_model *m, const uint64_t *counts);
/* The parameters the library takes from s (a device other than the CPU
 * loads every matrix in row order). */
struct sp_expert_store_params sp_cli_expert_params(const struct sp_settings *s);
struct sp_plan_load_params sp_cli_load_params(const struct sp_settings *s);
/* A model folder, or a Hugging Face id looked up in s->hf_hub_cache, as
 * a folder (sp_model_resolve; owned); s NULL: the settings of this
 * process's environment (commands without settings flags). */
enum sp_status sp_cli_model_resolve(const struct sp_settings *s, const char *spec, char **dir);
/* The model sp_cli_model_resolve finds, opened. */
enum sp_status sp_cli_model_open(const struct sp_settings *s, const char *spec, struct sp_model **out);

#endif
