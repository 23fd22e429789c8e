/* settings.c - the settings from the environment and from flags; the one reader of the environment. */
#include "core/settings.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/buf.h"

static const char *const precision_names[] = {"fast", "exact", NULL};
static const char *const io_names[] = {"auto", "buffered", "pread", "mapped", NULL};
static const char *const policy_names[] = {"arc", "lru", "clock", NULL};
static const char *const device_names[] = {"cpu", "cuda", NULL};

const char *sp_precision_name(enum sp_precision p) {
    return (unsigned)p < SP_PRECISION_COUNT ? precision_names[p] : "?";
}
const char *sp_io_method_name(enum sp_io_method m) { return (unsigned)m < SP_IO_COUNT ? io_names[m] : "?"; }
const char *sp_expert_policy_name(enum sp_expert_policy p) {
    return (unsigned)p < SP_EXPERT_POLICY_COUNT ? policy_names[p] : "?";
}
const char *sp_settings_device_name(int device) {
    return device >= 0 && device < (int)(sizeof device_names / sizeof *device_names) - 1 ? device_names[device] : "?";
}

enum id {
    KERNELS, PRECISION, IO, POLICY, PREFETCH, MMAP, ROW_ORDER, DEVICE, CPU_EXPERTS, GRAPHS, OVERLAP, DEVICES,
    EXPERT_LOAD, RECORD_ROUTING, ID_COUNT
};

/* NAME: any name (a value follows the flag); PATH: a file's name (a
 * value follows the flag); CHOICE: one of `choices`;
 * ON: the flag turns it on, the variable when set to other than "" or
 * "0"; OFF: the flag turns it off, the variable when set to "0"; LIST:
 * numbers separated by commas (a value follows the flag). */
enum kind { NAME, PATH, CHOICE, ON, OFF, LIST };

static const struct def {
    enum id id;
    const char *flag, *env;
    enum kind kind;
    const char *const *choices;
} defs[] = {
    {KERNELS, "--kernels", "SPARROW_KERNELS", NAME, NULL},
    {PRECISION, "--precision", "SPARROW_PRECISION", CHOICE, precision_names},
    {IO, "--io", "SPARROW_IO", CHOICE, io_names},
    {POLICY, "--expert-policy", "SPARROW_EXPERT_POLICY", CHOICE, policy_names},
    {PREFETCH, "--no-prefetch", "SPARROW_PREFETCH", OFF, NULL},
    {MMAP, "--mmap", "SPARROW_MMAP", ON, NULL},
    {ROW_ORDER, "--row-order", "SPARROW_ROW_ORDER", ON, NULL},
    {DEVICE, "--device", "SPARROW_DEVICE", CHOICE, device_names},
    {CPU_EXPERTS, "--no-cpu-experts", "SPARROW_CPU_EXPERTS", OFF, NULL},
    {CPU_EXPERTS, "--cpu-experts", NULL, ON, NULL},  // the default, still taken
    {GRAPHS, "--cuda-graphs", "SPARROW_CUDA_GRAPHS", ON, NULL},
    {OVERLAP, "--no-cuda-overlap", "SPARROW_CUDA_OVERLAP", OFF, NULL},
    {DEVICES, "--devices", "SPARROW_DEVICES", LIST, NULL},
    {EXPERT_LOAD, "--expert-load", "SPARROW_EXPERT_LOAD", PATH, NULL},
    {RECORD_ROUTING, "--record-routing", "SPARROW_RECORD_ROUTING", PATH, NULL},
};
#define N_DEFS (sizeof defs / sizeof defs[0])

static bool has_value(const struct def *d) { return d->kind != ON && d->kind != OFF; }

static const struct def *def_of_flag(const char *flag) {
    for (size_t i = 0; i < N_DEFS; i++)
        if (strcmp(defs[i].flag, flag) == 0) return &defs[i];
    return NULL;
}

/* "auto, buffered, pread or mapped" */
static void list_choices(struct sp_buf *b, const char *const *choices) {
    for (int i = 0; choices[i]; i++)
        sp_buf_printf(b, "%s%s", i == 0 ? "" : choices[i + 1] ? ", " : " or ", choices[i]);
}

/* --devices: distinct GPU numbers (0 .. SP_SETTINGS_DEVICES_MAX - 1)
 * separated by commas. */
static enum sp_status devices(struct sp_settings *s, const char *v, const char *what) {
    uint64_t seen = 0;
    int n = 0;
    for (const char *p = v;; p++) {
        if (*p < '0' || *p > '9') break;
        char *end;
        long d = strtol(p, &end, 10);
        if (d >= SP_SETTINGS_DEVICES_MAX)
            return sp_errorf(SP_ERR_ARG, "%s: GPU %ld is past %d", what, d, SP_SETTINGS_DEVICES_MAX - 1);
        if (seen >> d & 1) return sp_errorf(SP_ERR_ARG, "%s: GPU %ld given twice", what, d);
        seen |= 1ull << d;
        s->devices[n++] = (int)d;
        p = end;
        if (!*p) {
            s->n_devices = n;
            return SP_OK;
        }
        if (*p != ',') break;
    }
    return sp_errorf(SP_ERR_ARG, "%s: expected GPU numbers separated by commas (e.g. 0,1), got \"%s\"", what, v);
}

/* A file's name into dst (SP_SETTINGS_PATH_MAX bytes). */
static enum sp_status path_store(char *dst, const char *name, const char *what) {
    if (strlen(name) >= SP_SETTINGS_PATH_MAX)
        return sp_errorf(SP_ERR_ARG, "%s: a file name of more than %d bytes", what, SP_SETTINGS_PATH_MAX - 1);
    strcpy(dst, name);
    return SP_OK;
}

/* Stores a value parsed for d: v (CHOICE: the index; ON, OFF: 1), or name
 * (NAME, PATH, LIST). `what` names the source in messages ("--io", "SPARROW_IO"). */
static enum sp_status store(struct sp_settings *s, const struct def *d, int v, const char *name, enum sp_origin from,
                            const char *what) {
    switch (d->id) {
    case KERNELS:
        if (strlen(name) >= sizeof s->kernels)
            return sp_errorf(SP_ERR_ARG, "%s: no kernel set is called \"%.40s...\"", what, name);
        strcpy(s->kernels, name);
        s->kernels_from = from;
        break;
    case PRECISION:
        s->precision = (enum sp_precision)v;
        s->precision_from = from;
        break;
    case IO: s->io = (enum sp_io_method)v; break;
    case POLICY: s->expert_policy = (enum sp_expert_policy)v; break;
    case PREFETCH: s->no_prefetch = v; break;
    case MMAP: s->mmap = v; break;
    case ROW_ORDER: s->row_order = v; break;
    case DEVICE: s->device = v; break;
    case CPU_EXPERTS: s->no_cpu_experts = d->kind == OFF ? v : !v; break;
    case GRAPHS: s->cuda_graphs = v; break;
    case OVERLAP: s->no_cuda_overlap = v; break;
    case DEVICES: return devices(s, name, what);
    case EXPERT_LOAD: return path_store(s->expert_load, name, what);
    case RECORD_ROUTING: return path_store(s->record_routing, name, what);
    case ID_COUNT: break;
    }
    return SP_OK;
}

/* Parses value for d and stores it; an empty variable of a setting that
 * takes a value counts as unset. */
static enum sp_status parse(struct sp_settings *s, const struct def *d, const char *value, enum sp_origin from,
                            const char *what) {
    if (!*value && from == SP_ORIGIN_ENV && has_value(d)) return SP_OK;
    switch (d->kind) {
    case LIST: return store(s, d, 0, value, from, what);
    case PATH:
        if (!*value) return sp_errorf(SP_ERR_ARG, "%s needs a file's name", what);
        return store(s, d, 0, value, from, what);
    case NAME:
        if (!*value) return sp_errorf(SP_ERR_ARG, "%s needs a kernel set's name", what);
        return store(s, d, 0, value, from, what);
    case CHOICE:
        for (int i = 0; d->choices[i]; i++)
            if (strcmp(value, d->choices[i]) == 0) return store(s, d, i, NULL, from, what);
        struct sp_buf b = SP_BUF_INIT;
        list_choices(&b, d->choices);
        enum sp_status st = sp_errorf(SP_ERR_ARG, "%s: expected %s, got \"%s\"", what, b.data ? b.data : "?", value);
        sp_buf_free(&b);
        return st;
    case ON: return store(s, d, from == SP_ORIGIN_FLAG || (*value && strcmp(value, "0") != 0), NULL, from, what);
    case OFF: return store(s, d, from == SP_ORIGIN_FLAG || strcmp(value, "0") == 0, NULL, from, what);
    }
    return SP_OK;
}

/* The value of variable name in env, or NULL. */
static const char *env_get(char *const *env, const char *name) {
    size_t n = strlen(name);
    for (size_t i = 0; env && env[i]; i++)
        if (strncmp(env[i], name, n) == 0 && env[i][n] == '=') return env[i] + n + 1;
    return NULL;
}

/* The variable's value when set and not empty. */
static const char *env_nonempty(char *const *env, const char *name) {
    const char *v = env_get(env, name);
    return v && *v ? v : NULL;
}

/* dst = a joined with b (b NULL: a alone); false when it does not fit. */
static bool path_set(char *dst, const char *a, const char *b) {
    int n = b ? snprintf(dst, SP_SETTINGS_PATH_MAX, "%s/%s", a, b) : snprintf(dst, SP_SETTINGS_PATH_MAX, "%s", a);
    return n >= 0 && n < SP_SETTINGS_PATH_MAX;
}

static enum sp_status folders(struct sp_settings *s, char *const *env) {
    const char *hub = env_nonempty(env, "HF_HUB_CACHE"), *hf_home = env_nonempty(env, "HF_HOME");
    const char *xdg = env_nonempty(env, "XDG_CACHE_HOME"), *home = env_nonempty(env, "HOME");
    const char *tmp = env_nonempty(env, "TMPDIR");
    bool ok = hub       ? path_set(s->hf_hub_cache, hub, NULL)
              : hf_home ? path_set(s->hf_hub_cache, hf_home, "hub")
              : xdg     ? path_set(s->hf_hub_cache, xdg, "huggingface/hub")
                        : path_set(s->hf_hub_cache, home ? home : "", ".cache/huggingface/hub");
    /* without HOME, a folder any user may write rather than none */
    ok = ok && (xdg ? path_set(s->cache_dir, xdg, "sparrow")
                    : path_set(s->cache_dir, home ? home : "/tmp", ".cache/sparrow"));
    ok = ok && path_set(s->tmp_dir, tmp ? tmp : "/tmp", NULL);
    if (!ok)
        return sp_errorf(SP_ERR_ARG,
                         "HF_HUB_CACHE, HF_HOME, XDG_CACHE_HOME, HOME or TMPDIR names a folder of more than %d bytes",
                         SP_SETTINGS_PATH_MAX - 1);
    return SP_OK;
}

/* A whole number of variable name in [lo, hi], or def where it is unset or empty. */
static enum sp_status env_int(char *const *env, const char *name, long lo, long hi, long def, int *out) {
    const char *v = env_nonempty(env, name);
    char *end;
    long x = v ? strtol(v, &end, 10) : def;
    if (v && (*end || x < lo || x > hi))
        return sp_errorf(SP_ERR_ARG, "%s: expected a whole number from %ld to %ld, got \"%.40s\"", name, lo, hi, v);
    *out = (int)x;
    return SP_OK;
}

/* The launcher's variables of ranks in processes. */
static enum sp_status ranks(struct sp_settings *s, char *const *env) {
    enum sp_status st = env_int(env, "WORLD_SIZE", 1, SP_SETTINGS_DEVICES_MAX, 1, &s->world_size);
    if (st == SP_OK) st = env_int(env, "RANK", 0, s->world_size - 1, 0, &s->rank);
    if (st == SP_OK) st = env_int(env, "LOCAL_RANK", 0, SP_SETTINGS_DEVICES_MAX - 1, s->rank, &s->local_rank);
    if (st == SP_OK) st = env_int(env, "MASTER_PORT", 1, 65535, 29500, &s->master_port);
    const char *addr = env_nonempty(env, "MASTER_ADDR");
    if (st == SP_OK && addr && strlen(addr) >= sizeof s->master_addr)
        st = sp_errorf(SP_ERR_ARG, "MASTER_ADDR: a host name of at most %zu bytes", sizeof s->master_addr - 1);
    if (st == SP_OK) snprintf(s->master_addr, sizeof s->master_addr, "%s", addr ? addr : "127.0.0.1");
    return st;
}

enum sp_status sp_settings_load(struct sp_settings *s, char *const *env) {
    memset(s, 0, sizeof *s);
    enum sp_status st = folders(s, env);
    if (st == SP_OK) st = ranks(s, env);
    for (size_t i = 0; i < N_DEFS && st == SP_OK; i++) {
        const char *v = defs[i].env ? env_get(env, defs[i].env) : NULL;
        if (!v) continue;
        st = parse(s, &defs[i], v, SP_ORIGIN_ENV, defs[i].env);
    }
    if (st == SP_OK && s->kernels_from == SP_ORIGIN_ENV && s->precision_from == SP_ORIGIN_ENV)
        st = sp_errorf(SP_ERR_ARG, "SPARROW_KERNELS and SPARROW_PRECISION both choose the kernel set: set one");
    return st;
}

enum sp_status sp_settings_from_env(struct sp_settings *s) { return sp_settings_load(s, environ); }

bool sp_settings_is_flag(const char *flag, bool *takes_value) {
    const struct def *d = def_of_flag(flag);
    if (d && takes_value) *takes_value = has_value(d);
    return d != NULL;
}

enum sp_status sp_settings_set(struct sp_settings *s, const char *flag, const char *value) {
    const struct def *d = def_of_flag(flag);
    if (!d) return sp_errorf(SP_ERR_ARG, "%s is not a setting", flag);
    bool wants = has_value(d);
    if (wants && !value) return sp_errorf(SP_ERR_ARG, "%s needs a value", flag);
    if (!wants && value) return sp_errorf(SP_ERR_ARG, "%s takes no value", flag);
    /* the kernel set by name or by precision: one flag, which overrides the other's variable */
    bool rival = (d->id == KERNELS && s->precision_from == SP_ORIGIN_FLAG) ||
                 (d->id == PRECISION && s->kernels_from == SP_ORIGIN_FLAG);
    if (rival) return sp_errorf(SP_ERR_ARG, "--kernels and --precision both choose the kernel set: give one");
    enum sp_status st = parse(s, d, value ? value : "", SP_ORIGIN_FLAG, flag);
    if (st != SP_OK) return st;
    if (d->id == KERNELS) {
        s->precision = SP_PRECISION_FAST;
        s->precision_from = SP_ORIGIN_DEFAULT;
    } else if (d->id == PRECISION) {
        s->kernels[0] = 0;
        s->kernels_from = SP_ORIGIN_DEFAULT;
    }
    return SP_OK;
}
