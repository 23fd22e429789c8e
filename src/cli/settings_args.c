/* settings_args.c - the settings' flags, and their values handed to the library. */
#include "cli/settings_args.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/args.h"
#include "core/alloc.h"
#include "core/file.h"
#include "core/log.h"
#include "core/strmap.h"
#include "backend/cpu/kernels.h"
#include "runtime/routing.h"

int sp_cli_settings_init(struct sp_settings *s) {
    if (sp_settings_from_env(s) == SP_OK) return 0;
    sp_cli_fail();
    return SP_EXIT_USAGE;
}

bool sp_cli_settings_arg(int argc, char **argv, int *i, struct sp_settings *s, int *rc) {
    *rc = 0;
    const char *arg = argv[*i], *eq = strchr(arg, '=');
    if (!strcmp(arg, "--quiet")) {
        sp_log_set_level(SP_LOG_WARN);  // no info lines, no load progress
        return true;
    }
    char flag[64];
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n >= sizeof flag) return false;
    memcpy(flag, arg, n);
    flag[n] = 0;
    bool takes_value;
    if (!sp_settings_is_flag(flag, &takes_value)) return false;
    const char *value = eq ? eq + 1 : NULL;
    if (takes_value && !eq) {
        if (*i + 1 >= argc) {
            fprintf(stderr, "error: %s needs a value\n", flag);
            *rc = SP_EXIT_USAGE;
            return true;
        }
        value = argv[++*i];
    }
    if (sp_settings_set(s, flag, value) != SP_OK) {
        sp_cli_fail();
        *rc = SP_EXIT_USAGE;
    }
    return true;
}

int sp_cli_kernels_use(const struct sp_settings *s) {
    const struct sp_kernels *k = NULL;  // the best this CPU runs
    if (s->kernels[0]) {
        if (!(k = sp_kernels_by_name(s->kernels))) {
            fprintf(stderr, "error: %s%s: not a kernel set this CPU runs; it runs",
                    s->kernels_from == SP_ORIGIN_FLAG ? "--kernels " : "SPARROW_KERNELS=", s->kernels);
            for (int i = 0, first = 1; i < SP_KERNELS_ISA_COUNT; i++) {
                const struct sp_kernels *o = sp_kernels_of((enum sp_kernels_isa)i);
                if (o) fprintf(stderr, "%s %s", first ? "" : ",", o->name), first = 0;
            }
            fputc('\n', stderr);
            return SP_EXIT_USAGE;
        }
    } else if (s->precision == SP_PRECISION_EXACT) {
        k = sp_kernels_float();
    }
    sp_kernels_use(k);
    return 0;
}

int sp_cli_device(const struct sp_settings *s, enum sp_device *out) {
    *out = SP_DEVICE_CPU;
    const char *name = sp_settings_device_name(s->device);
    enum sp_device d;
    if (!sp_device_from_name(name, &d)) {
        fprintf(stderr, "error: unknown device \"%s\"\n", name);
        return SP_EXIT_USAGE;
    }
    if (!sp_backend_ops(d)) {
        fprintf(stderr, "error: --device %s: this build of sparrow has no %s backend (build it with make CUDA=1 where "
                        "nvcc is installed)\n", name, name);
        return SP_EXIT_USAGE;
    }
    *out = d;
    return 0;
}

/* The kernels of devices other than the CPU read rows in order */
struct sp_expert_store_params sp_cli_expert_params(const struct sp_settings *s) {
    struct sp_expert_store_params p = {.policy = s->expert_policy, .io = s->io, .no_prefetch = s->no_prefetch};
    sp_expert_store_params_for(&p, s->device, s->row_order);
    return p;
}

struct sp_plan_load_params sp_cli_load_params(const struct sp_settings *s) {
    return (struct sp_plan_load_params){.mmap = s->mmap, .interleave = s->row_order ? NULL : sp_ctx_interleave(s->device)};
}

enum sp_status sp_cli_model_resolve(const struct sp_settings *s, const char *spec, char **dir) {
    *dir = NULL;
    struct sp_settings env;
    if (!s) {
        enum sp_status st = sp_settings_from_env(&env);
        if (st != SP_OK) return st;
        s = &env;
    }
    return sp_model_resolve(spec, s->hf_hub_cache, dir);
}

enum sp_status sp_cli_model_open(const struct sp_settings *s, const char *spec, struct sp_model **out) {
    *out = NULL;
    char *dir;
    enum sp_status st = sp_cli_model_resolve(s, spec, &dir);
    if (st != SP_OK) return st;
    st = sp_model_open(dir, out);
    sp_free(dir);
    return st;
}

/* A hash of this process's arguments past the program's name (/proc/self/cmdline; 0 where unreadable). */
static uint64_t args_hash(void) {
    char *cmd;
    size_t len;
    if (sp_read_file("/proc/self/cmdline", (size_t)1 << 20, &cmd, &len) != SP_OK) {
        sp_error_clear();
        return 0;
    }
    size_t name = strnlen(cmd, len);  // the arguments after its terminating 0
    uint64_t h = name < len ? sp_hash_bytes(cmd + name + 1, len - name - 1) : 0;
    sp_free(cmd);
    return h;
}

enum sp_status sp_cli_join_ranks(const struct sp_settings *s, const struct sp_model *m, struct sp_ctx_params *cp,
                                 struct sp_ranks **g) {
    *g = NULL;
    if (s->world_size <= 1) return SP_OK;
    if (cp->n_ranks > 1)
        return sp_errorf(SP_ERR_ARG, "--devices and WORLD_SIZE both split the experts: give one of them");
    const struct sp_arch *a = &m->arch;
    enum sp_status st = sp_ctx_ranks_check(m, cp, s->world_size, true);  // before any rank waits for the others
    if (st != SP_OK) return st;
    int64_t B = cp->max_batch > 0 ? cp->max_batch : SP_DEFAULT_BATCH;
    /* what every rank must run alike: the command, the model's shape, the batch, the ranks, the device */
    /* the load the experts are placed by: its file's name is among the arguments, this is what it held */
    uint64_t load = cp->expert_load ? sp_hash_bytes(cp->expert_load, (size_t)(a->n_layers * a->n_experts) *
                                                                         sizeof *cp->expert_load)
                                    : 0;
    const int64_t what[] = {(int64_t)args_hash(), a->n_layers, a->d_model,    a->vocab,   a->n_experts,
                            a->n_experts_used,     B,           s->world_size, cp->device, (int64_t)load};
    uint64_t key = sp_hash_bytes(what, sizeof what);
    st = sp_ranks_connect(s->rank, s->world_size, s->master_addr, s->master_port, key, B * a->d_model,
                                         120.0, g);
    if (st != SP_OK) return st;
    cp->group = *g;
    cp->rank = s->rank;
    cp->n_ranks = s->world_size;
    if (!cp->gpus) cp->gpus = &s->local_rank;  // a GPU: --devices N, else LOCAL_RANK
    if (s->rank > 0 && !freopen("/dev/null", "w", stdout)) return sp_errorf(SP_ERR_IO, "rank %d: /dev/null", s->rank);
    return SP_OK;
}

enum sp_status sp_cli_routing(const struct sp_settings *s, const struct sp_model *m, double **load, bool *count_routes) {
    *load = NULL;
    bool counts = s->record_routing[0] != 0;
    if (count_routes) *count_routes = counts;
    if (counts) {
        if (m->arch.n_experts <= 0)
            return sp_errorf(SP_ERR_ARG, "--record-routing: the model has no routed experts to count");
        /* a recording that cannot be written is known now, not after the run (rank 0 writes it) */
        char dir[SP_SETTINGS_PATH_MAX];
        const char *slash = strrchr(s->record_routing, '/');
        snprintf(dir, sizeof dir, "%.*s", slash ? (int)(slash - s->record_routing) + 1 : 1, slash ? s->record_routing : ".");
        if (s->rank == 0 && access(dir, W_OK) != 0)
            return sp_errorf(SP_ERR_IO, "--record-routing %s: cannot write in %s: %s", s->record_routing, dir,
                             strerror(errno));
    }
    if (!s->expert_load[0]) return SP_OK;
    if (s->n_devices <= 1 && s->world_size <= 1)
        return sp_errorf(SP_ERR_ARG, "--expert-load places the routed experts over ranks: give --devices with several "
                         "GPUs, or run as ranks of a launcher (WORLD_SIZE)");
    return sp_routing_read(s->expert_load, m, load);
}

enum sp_status sp_cli_routing_save(const struct sp_settings *s, const struct sp_model *m, const uint64_t *counts) {
    if (!s->record_routing[0] || s->rank != 0) return SP_OK;
    if (!counts) return sp_errorf(SP_ERR_STATE, "%s: no routing was counted", s->record_routing);
    enum sp_status st = sp_routing_write(s->record_routing, m, counts);
    if (st == SP_OK) sp_log(SP_LOG_INFO, "routing counts written to %s", s->record_routing);
    return st;
}
