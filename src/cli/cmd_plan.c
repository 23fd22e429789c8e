/* cmd_plan.c - `sparrow plan MODEL`: the memory plan, from tensor headers
 * alone (nothing is loaded). */
#include <stdio.h>
#include <stdlib.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/pool.h"
#include "runtime/plan.h"

static const char usage[] =
    "usage: sparrow plan MODEL [--ctx N] [--parallel N] [--kv-type f16|bf16|f32] [--mem-limit SIZE]\n"
    "                    [--expert-cache SIZE] [--device cpu|cuda] [--gpu-mem-limit SIZE] [--devices LIST]\n"
    "                    [--expert-load FILE] [--json] [--calibrate]\n"
    "  Prints what stays resident, the routed-expert cache budget, the bytes read per\n"
    "  token from memory and disk, and the expected decode speed. Sizes take K, M, G, T.\n"
    "  With --device cuda, also what the device holds: every expert, or a device expert\n"
    "  cache of what --gpu-mem-limit (default: the device's free memory) leaves; the plan\n"
    "  is made from headers alone, so it needs no GPU when --gpu-mem-limit is given.\n"
    "  --devices 0,1,... plans for those devices (--gpu-mem-limit each): each MoE layer's\n"
    "  experts split over them, the rest on each, and what each reads and sends a token;\n"
    "  --expert-load FILE places them by the routing counts FILE holds (run or serve's\n"
    "  --record-routing) and gives the busiest device's share of their tokens.\n"
    "  --calibrate measures RAM and disk read bandwidth here (reading the model's first\n"
    "  file) and stores them for later plans.\n";

int sp_cmd_plan(int argc, char **argv) {
    const char *model = NULL;
    bool json = false, calibrate = false;
    struct sp_plan_inputs in = {0};
    struct sp_settings set;
    int rc = sp_cli_settings_init(&set);
    if (rc) return rc;
    in.cache_dir = set.cache_dir;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int64_t n;
        if (sp_cli_settings_arg(argc, argv, &i, &set, &rc)) {
            if (rc) return rc;
            continue;
        }
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (sp_arg_flag(argv[i], "--json")) {
            json = true;
        } else if (sp_arg_flag(argv[i], "--calibrate")) {
            calibrate = true;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!(model = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--ctx", &v)) {
            if (!v || !sp_arg_int("--ctx", v, 1, 1 << 30, &in.ctx)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--parallel", &v)) {
            if (!v || !sp_arg_int("--parallel", v, 1, 1 << 16, &n)) return SP_EXIT_USAGE;
            in.parallel = (int)n;
        } else if (sp_arg_value(argc, argv, &i, "--kv-type", &v)) {
            if (!v || !sp_kv_type_from_name(v, &in.kv_type)) {
                fprintf(stderr, "error: --kv-type must be f16, bf16 or f32\n");
                return SP_EXIT_USAGE;
            }
        } else if (sp_arg_value(argc, argv, &i, "--mem-limit", &v)) {
            if (!v || !sp_arg_size("--mem-limit", v, &in.mem_limit)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--expert-cache", &v)) {
            if (!v || !sp_arg_size("--expert-cache", v, &in.expert_cache)) return SP_EXIT_USAGE;
            in.expert_cache_set = true;
        } else if (sp_arg_value(argc, argv, &i, "--gpu-mem-limit", &v)) {
            if (!v || !sp_arg_size("--gpu-mem-limit", v, &in.gpu_mem_limit)) return SP_EXIT_USAGE;
        } else if (argv[i][0] == '-') {
            return sp_arg_unknown(argv[0], argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            fprintf(stderr, "error: plan: unexpected argument %s\n", argv[i]);
            return SP_EXIT_USAGE;
        }
    }
    if (!model) {
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    in.n_devices = set.n_devices;
    if (set.record_routing[0]) {
        fprintf(stderr, "error: plan: --record-routing: a plan runs no tokens; record with run or serve\n");
        return SP_EXIT_USAGE;
    }
    struct sp_model *m;
    if (sp_cli_model_open(&set, model, &m) != SP_OK) return sp_cli_fail();
    double *load = NULL;
    if (sp_cli_routing(&set, m, &load, NULL) != SP_OK) {
        rc = sp_cli_fail();
        goto done;
    }
    in.expert_load = load;
    in.expert_load_from = set.expert_load;
    if (calibrate) {
        struct sp_bandwidth bw;
        if (sp_bandwidth_calibrate(m->files->shards[0]->path, set.cache_dir, &bw) != SP_OK) {
            rc = sp_cli_fail();
            goto done;
        }
        fprintf(stderr, "calibrated: RAM %.2f GB/s (%d threads), disk %.2f GB/s\n", bw.ram_gbs, sp_physical_cores(), bw.disk_gbs);
    }
    /* a plan for a device this build cannot run still comes from the headers */
    sp_device_from_name(sp_settings_device_name(set.device), &in.device);
    struct sp_plan p;
    if (sp_plan_make(m, &in, &p) != SP_OK) {
        rc = sp_cli_fail();
        goto done;
    }
    struct sp_buf out = SP_BUF_INIT;
    sp_plan_report(&p, json, &out);
    fwrite(out.data, 1, out.len, stdout);
    sp_buf_free(&out);
done:
    sp_free(load);
    sp_model_close(m);
    return rc;
}
