/*
 * settings.h - the switches that choose how sparrow runs (kernel set,
 * precision, how the expert cache reads and evicts, how weights are
 * loaded) and the folders it uses, in one struct. This module is the one
 * place that reads the environment: SPARROW_* variables give values that a
 * benchmark script can set without changing command lines, and the
 * command line's flags override them. Library modules never consult the
 * settings: the CLI passes each value down as a parameter
 * (sp_expert_store_params, sp_plan_load_params, sp_plan_inputs.cache_dir,
 * sp_model_resolve's hub, sp_kernels_use).
 *
 *     struct sp_settings s;
 *     if (sp_settings_from_env(&s) != SP_OK) puts(sp_error_msg());  // "SPARROW_IO: expected ..."
 *     if (sp_settings_set(&s, "--io", "pread") != SP_OK) ...             // a flag, over the environment
 *     struct sp_expert_store_params ep = {.policy = s.expert_policy, .io = s.io, ...};
 *
 * Flag          variable               values
 * --kernels     SPARROW_KERNELS        a kernel set's name (checked by the CLI against the CPU)
 * --precision   SPARROW_PRECISION      fast | exact
 * --io          SPARROW_IO             auto | buffered | pread | mapped
 * --expert-policy SPARROW_EXPERT_POLICY arc | lru | clock
 * --no-prefetch SPARROW_PREFETCH=0
 * --mmap        SPARROW_MMAP           on when set to other than "" or "0"
 * --row-order   SPARROW_ROW_ORDER      on when set to other than "" or "0"
 * --device      SPARROW_DEVICE         cpu | cuda (checked by the CLI against the build)
 * --no-cpu-experts SPARROW_CPU_EXPERTS=0 (--cpu-experts: the default)
 * --cuda-graphs SPARROW_CUDA_GRAPHS    on when set to other than "" or "0"
 * --no-cuda-overlap SPARROW_CUDA_OVERLAP=0
 * --devices     SPARROW_DEVICES        GPU numbers (0 .. 63), distinct, separated by commas:
 *                                      the routed experts split over those GPUs
 *
 * --kernels and --precision both choose the kernel set: given together at
 * the same level (two flags, or two variables) they are an error; a flag
 * overrides the other's variable.
 *
 * Ranks in processes (model/ranks.h), read as torchrun's launcher sets
 * them: WORLD_SIZE (processes, 1 to SP_SETTINGS_DEVICES_MAX; unset: 1),
 * RANK (this one's, 0 to WORLD_SIZE - 1), LOCAL_RANK (its number on its
 * machine, the GPU it takes; default RANK), MASTER_ADDR (rank 0's host;
 * default 127.0.0.1) and MASTER_PORT (default 29500).
 *
 * The folders follow the conventions of the tools that share them:
 * hf_hub_cache is $HF_HUB_CACHE, else $HF_HOME/hub, else
 * $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub;
 * cache_dir (sparrow's stored bandwidths) is $XDG_CACHE_HOME/sparrow, else
 * ~/.cache/sparrow; tmp_dir is $TMPDIR, else /tmp.
 */
#ifndef SP_CORE_SETTINGS_H
#define SP_CORE_SETTINGS_H

#include <stdbool.h>

#include "core/status.h"

/* Which kernel set runs when none is named: the fastest the CPU has, or
 * the fastest that keeps activations in float (avx2f, else portable). */
enum sp_precision { SP_PRECISION_FAST, SP_PRECISION_EXACT, SP_PRECISION_COUNT };

/* How the expert cache reads the files (runtime/storage.h): io_uring with
 * O_DIRECT where the files allow it (auto), io_uring through the page
 * cache (buffered), pread through the page cache, or copies out of the
 * files' mappings (mapped). */
enum sp_io_method { SP_IO_AUTO, SP_IO_BUFFERED, SP_IO_PREAD, SP_IO_MAPPED, SP_IO_COUNT };

/* The expert cache's replacement policy (experts.h). */
enum sp_expert_policy { SP_EXPERT_POLICY_ARC, SP_EXPERT_POLICY_LRU, SP_EXPERT_POLICY_CLOCK, SP_EXPERT_POLICY_COUNT };

/* Where a setting's value came from. */
enum sp_origin { SP_ORIGIN_DEFAULT, SP_ORIGIN_ENV, SP_ORIGIN_FLAG };

#define SP_SETTINGS_NAME_MAX 32
#define SP_SETTINGS_PATH_MAX 4096
#define SP_SETTINGS_DEVICES_MAX 64

struct sp_settings {
    char kernels[SP_SETTINGS_NAME_MAX];  // a kernel set's name ("avx2f"); "": chosen by precision
    enum sp_precision precision;
    enum sp_io_method io;
    enum sp_expert_policy expert_policy;
    bool no_prefetch;  // the expert cache does not read the next layer's experts ahead
    bool mmap;         // weights stay in the files' pages: no copies into anonymous memory
    bool row_order;    // weight matrices stay in row order: none interleaved for the kernels
    int device;        // where the forward pass runs: an index of sp_settings_device_name (backend.h's sp_device order)
    bool no_cpu_experts;  // the CPU does not compute experts a device's expert cache lacks (it copies them all in)
    bool cuda_graphs;  // the CUDA backend records small steps and replays them as CUDA graphs
    bool no_cuda_overlap;  // the CUDA backend's kernels wait for the one before to end before they start
    int n_devices;         // --devices: that many GPUs (0: none given), their numbers in devices
    int devices[SP_SETTINGS_DEVICES_MAX];
    int world_size, rank;  // this process's rank of world_size (WORLD_SIZE, RANK; 1 and 0 alone)
    int local_rank;        // and on its machine (LOCAL_RANK)
    char expert_load[SP_SETTINGS_PATH_MAX];     // --expert-load: routing counts to place experts over ranks by ("": none)
    char record_routing[SP_SETTINGS_PATH_MAX];  // --record-routing: where to write the run's routing counts ("": nowhere)
    int master_port;
    char master_addr[256];
    enum sp_origin kernels_from, precision_from;
    char hf_hub_cache[SP_SETTINGS_PATH_MAX];  // the Hugging Face hub cache folder
    char cache_dir[SP_SETTINGS_PATH_MAX];     // sparrow's cache folder
    char tmp_dir[SP_SETTINGS_PATH_MAX];       // where temporary folders go
};

/* The defaults with the variables of env over them; env is an array of
 * "NAME=value" strings ending in NULL (environ). A value that is not one
 * of a setting's choices, or a folder longer than SP_SETTINGS_PATH_MAX, is
 * SP_ERR_ARG naming the variable. s holds no pointers: it may be copied
 * and needs no freeing. */
enum sp_status sp_settings_load(struct sp_settings *s, char *const *env);
/* sp_settings_load of this process's environment. */
enum sp_status sp_settings_from_env(struct sp_settings *s);
/* Whether flag ("--io") is one of the settings' flags; *takes_value:
 * whether a value follows it. */
bool sp_settings_is_flag(const char *flag, bool *takes_value);
/* Sets what flag says (value: its value; NULL for a flag that takes none)
 * over what the environment said. A bad value, or a flag that excludes
 * one given before, is SP_ERR_ARG naming the flag. */
enum sp_status sp_settings_set(struct sp_settings *s, const char *flag, const char *value);

const char *sp_precision_name(enum sp_precision p);
const char *sp_io_method_name(enum sp_io_method m);
const char *sp_expert_policy_name(enum sp_expert_policy p);
/* The device names --device takes, in the order of backend.h's enum sp_device ("cpu", "cuda"); "?" past them. */
const char *sp_settings_device_name(int device);

#endif
