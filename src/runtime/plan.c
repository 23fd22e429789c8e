/* plan.c - the memory planner and bandwidth calibration. */
#include "runtime/plan.h"

#include <fcntl.h>
#include <math.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/file.h"
#include "core/json.h"
#include "core/log.h"
#include "core/pool.h"
#include "core/progress.h"
#include "backend/cpu/membw.h"
#include "model/expert_tier.h"
#include "model/ranks.h"

#define DEFAULT_RAM_GBS 10.0
#define DEFAULT_DISK_GBS 1.0
#define OVERHEAD_BYTES ((size_t)32 << 20)  // tables, server, thread stacks (the tokenizer is added apart)

const char *sp_strategy_name(enum sp_strategy s) { return s == SP_STRATEGY_RESIDENT ? "resident" : "expert-cache"; }

static uint64_t read_u64_file(const char *path) {
    char *t;
    size_t n;
    if (sp_read_file(path, 256, &t, &n) != SP_OK) {
        sp_error_clear();
        return 0;
    }
    uint64_t v = 0;
    if (strncmp(t, "max", 3) != 0) v = strtoull(t, NULL, 10);
    sp_free(t);
    return v >= ((uint64_t)1 << 60) ? 0 : v;  // "unlimited" is a huge number in v1
}

void sp_memory_limits(uint64_t *cgroup, uint64_t *available) {
    *cgroup = *available = 0;
    /* the process's own cgroup first (v2 "0::/path", v1 "N:memory:/path"), then the root files */
    FILE *f = fopen("/proc/self/cgroup", "r");
    char line[512], path[768];
    while (f && fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        uint64_t v = 0;
        if (!strncmp(line, "0::", 3)) {
            snprintf(path, sizeof path, "/sys/fs/cgroup%s/memory.max", line + 3);
            v = read_u64_file(path);
        } else if (strstr(line, ":memory:")) {
            snprintf(path, sizeof path, "/sys/fs/cgroup/memory%s/memory.limit_in_bytes", strstr(line, ":memory:") + 8);
            v = read_u64_file(path);
        }
        if (v && (!*cgroup || v < *cgroup)) *cgroup = v;
    }
    if (f) fclose(f);
    uint64_t root = read_u64_file("/sys/fs/cgroup/memory.max");
    if (!root) root = read_u64_file("/sys/fs/cgroup/memory/memory.limit_in_bytes");
    if (root && (!*cgroup || root < *cgroup)) *cgroup = root;
    f = fopen("/proc/meminfo", "r");
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f))
        if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) *available = (uint64_t)kb * 1024;
    if (f) fclose(f);
}

struct sp_bandwidth sp_bandwidth_load(const char *cache_dir) {
    struct sp_bandwidth bw = {DEFAULT_RAM_GBS, DEFAULT_DISK_GBS, false};
    char *path = cache_dir ? sp_path_join(cache_dir, "bandwidth.json") : NULL;
    cJSON *j = NULL;
    if (path && sp_path_is_file(path) && sp_json_parse_file(path, 4096, &j) == SP_OK) {
        double r, d;
        if (sp_json_get_num(j, "ram_gbs", 0, &r) == SP_OK && sp_json_get_num(j, "disk_gbs", 0, &d) == SP_OK && r > 0 &&
            d > 0) {
            bw.ram_gbs = r;
            bw.disk_gbs = d;
            bw.measured = true;
        }
    }
    sp_error_clear();
    cJSON_Delete(j);
    sp_free(path);
    return bw;
}

enum sp_status sp_bandwidth_calibrate(const char *file, const char *cache_dir, struct sp_bandwidth *out) {
    struct sp_pool *pool;
    enum sp_status st = sp_pool_create(sp_physical_cores(), &pool);
    if (st != SP_OK) return st;
    struct sp_membw bw;
    st = sp_membw_measure(pool, sp_pool_size(pool), (size_t)1 << 30, &bw);
    sp_pool_free(pool);
    if (st != SP_OK) return st;
    out->ram_gbs = bw.gbs;
    /* disk: read the file after asking the kernel to drop its cached pages */
    int fd = open(file, O_RDONLY);
    if (fd < 0) return sp_errorf(SP_ERR_IO, "calibration: cannot open %s", file);
    posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    size_t chunk = (size_t)16 << 20, total = 0;
    char *b = sp_malloc_aligned(chunk, 4096, SP_MEM_MISC);
    double t0 = sp_now_s();
    ssize_t r;
    while (b && total < ((size_t)2 << 30) && (r = pread(fd, b, chunk, (off_t)total)) > 0) total += (size_t)r;
    double dt = sp_now_s() - t0;
    close(fd);
    sp_free_aligned(b);
    if (total < ((size_t)64 << 20))
        return sp_errorf(SP_ERR_ARG, "calibration: %s holds %zu bytes; at least 64 MiB are needed to time the disk", file, total);
    out->disk_gbs = (double)total / dt / 1e9;
    out->measured = true;
    char *path = sp_path_join(cache_dir, "bandwidth.json");
    st = path ? sp_mkdirs(cache_dir) : sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) {
        char text[256];
        int n = snprintf(text, sizeof text, "{\"ram_gbs\": %.3f, \"disk_gbs\": %.3f, \"measured_at\": %lld}\n",
                         out->ram_gbs, out->disk_gbs, (long long)time(NULL));
        st = sp_write_file(path, text, (size_t)n);
    }
    sp_free(path);
    return st;
}

/* Buffers sp_ctx_create and the engine reserve, from the same shapes: the
 * context's, and the engine's logits (three rows of the vocabulary a
 * sequence). */
static size_t activation_estimate(const struct sp_arch *a, int parallel, int64_t batch, int threads) {
    return sp_ctx_work_bytes(a, batch, threads) + (size_t)(3 * parallel) * (size_t)a->vocab * sizeof(float);
}

/* Device memory kept back from the limit: the CUDA context where the limit
 * is a card's size, and slack for allocations in slabs. */
#define GPU_CONTEXT_BYTES ((uint64_t)512 << 20)
#define GPU_SLACK_FRACTION 0.03

/* The busiest of nd devices' share of the routed experts' tokens, the
 * experts of each MoE layer placed by load as the ranks place them
 * (sp_ranks_split); a layer without counts weighs its experts alike. */
static double busiest_share(const struct sp_arch *a, const double *load, int nd) {
    int64_t E = a->n_experts, layers = 0;
    if (!load || nd <= 1 || E <= 0) return 1.0 / nd;
    double dev[SP_RANKS_MAX] = {0};
    int32_t *owner = sp_malloc((size_t)E * sizeof *owner, SP_MEM_MISC);
    if (!owner) return 1.0 / nd;
    for (int64_t L = 0; L < a->n_layers; L++) {
        if (!a->layer_moe[L]) continue;
        const double *l = load + L * E;
        double sum = 0;
        for (int64_t e = 0; e < E; e++) sum += l[e];
        sp_ranks_split(sum > 0 ? l : NULL, E, nd, owner);
        for (int64_t e = 0; e < E; e++) dev[owner[e]] += sum > 0 ? l[e] / sum : 1.0 / (double)E;
        layers++;
    }
    sp_free(owner);
    double most = 0;
    for (int d = 0; d < nd; d++) most = dev[d] > most ? dev[d] : most;
    return layers ? most / (double)layers : 1.0 / nd;
}

/* The device tier of the plan (p's host tier done). */
static enum sp_status plan_device(const struct sp_model *m, const struct sp_plan_inputs *in, struct sp_plan *p,
                                  double routed_per_token) {
    const char *dev = sp_device_name(in->device);
    if (in->gpu_mem_limit) {
        p->gpu_limit = in->gpu_mem_limit;
        p->gpu_limit_source = "--gpu-mem-limit";
    } else {
        size_t free_b, total_b;
        if (sp_backend_mem_info(in->device, &free_b, &total_b) != SP_OK)
            return sp_errorf(SP_ERR_STATE, "cannot tell how much memory the %s device has (%s): give --gpu-mem-limit",
                             dev, sp_error_msg());
        p->gpu_limit = free_b;
        p->gpu_limit_source = "free device memory";
    }
    uint64_t reserve = (uint64_t)((double)p->gpu_limit * GPU_SLACK_FRACTION) + (in->gpu_mem_limit ? GPU_CONTEXT_BYTES : 0);
    p->gpu_usable = p->gpu_limit > reserve ? p->gpu_limit - reserve : 0;
    p->gpu_base_bytes = p->resident_weight_bytes +
                        sp_ctx_device_bytes(&m->arch, in->device, p->ctx, p->parallel,
                                            in->batch > 0 ? in->batch : SP_DEFAULT_BATCH, in->kv_type);
    /* device d's share of every MoE layer's experts (model/ranks.h's split: ceil(E / n) a layer at
     * most); the figures are the largest share's */
    int nd = p->n_devices;
    int64_t all_experts = p->n_experts * p->n_moe_layers;
    int64_t total_experts = (p->n_experts + nd - 1) / nd * p->n_moe_layers;
    size_t share =
        all_experts ? (size_t)((double)p->routed_expert_bytes * (double)total_experts / (double)all_experts) : 0;
    p->device_experts = total_experts;
    p->device_expert_bytes = share;
    p->device_routed_share = busiest_share(&m->arch, in->expert_load, nd);
    p->expert_load_from = nd > 1 && in->expert_load ? in->expert_load_from : NULL;
    double routed_share = routed_per_token * p->device_routed_share;
    p->device_bytes_per_token = (size_t)((double)p->bytes_per_token - routed_per_token + routed_share);
    p->link_bytes_per_token =
        nd > 1 ? (size_t)(p->n_moe_layers * m->arch.d_model) * sizeof(float) * 2 * (size_t)(nd - 1) / (size_t)nd : 0;
    if (p->gpu_base_bytes + share <= p->gpu_usable) {
        p->gpu_cached_experts = total_experts;
        p->gpu_hit_rate = 1.0;
        return SP_OK;
    }
    /* a slot holds the largest expert with its parts aligned */
    size_t slot = sp_expert_tier_slot_bytes(m);
    if (!p->n_experts || p->gpu_base_bytes + slot > p->gpu_usable)
        return sp_errorf(SP_ERR_LIMIT,
                         "the %s device's %.2f GiB usable (%s %.2f GiB less %.2f GiB kept back) do not hold what every "
                         "token needs there: %.2f GiB (weights but the routed experts %.2f GiB, KV cache and buffers "
                         "%.2f GiB)%s; lower --ctx, --parallel or --batch, or raise --gpu-mem-limit",
                         dev, (double)p->gpu_usable / 1073741824.0, p->gpu_limit_source,
                         (double)p->gpu_limit / 1073741824.0, (double)reserve / 1073741824.0,
                         (double)(p->gpu_base_bytes + (p->n_experts ? slot : 0)) / 1073741824.0,
                         (double)p->resident_weight_bytes / 1073741824.0,
                         (double)(p->gpu_base_bytes - p->resident_weight_bytes) / 1073741824.0,
                         p->n_experts ? " plus one expert" : "");
    p->gpu_expert_cache = p->gpu_usable - p->gpu_base_bytes;
    p->gpu_cached_experts = (int64_t)(p->gpu_expert_cache / slot);
    if (p->gpu_cached_experts > total_experts) p->gpu_cached_experts = total_experts;
    p->gpu_hit_rate = total_experts ? (double)p->gpu_cached_experts / (double)total_experts : 1.0;
    p->h2d_bytes_per_token = (size_t)(routed_share * (1.0 - p->gpu_hit_rate));
    return SP_OK;
}

enum sp_status sp_plan_make(const struct sp_model *m, const struct sp_plan_inputs *in, struct sp_plan *p) {
    memset(p, 0, sizeof *p);
    const struct sp_arch *a = &m->arch;
    struct sp_model_stats s;
    sp_model_stats(m, &s);
    p->model_type = a->model_type;
    p->file_bytes = s.file_bytes;
    p->tensor_bytes = s.total_bytes - s.bytes[SP_CLASS_UNUSED];
    p->routed_expert_bytes = s.bytes[SP_CLASS_ROUTED_EXPERTS];
    p->resident_weight_bytes = p->tensor_bytes - p->routed_expert_bytes + s.composed_bytes;
    p->expert_bytes = s.expert_bytes;
    p->n_experts = a->n_experts;
    p->n_experts_used = a->n_experts_used;
    p->n_moe_layers = s.n_moe_layers;
    p->ctx = in->ctx > 0 ? in->ctx : (a->max_pos < 4096 ? a->max_pos : 4096);
    p->parallel = in->parallel > 0 ? in->parallel : 1;
    p->kv_bytes = sp_kv_cache_bytes(a, p->ctx, p->parallel, in->kv_type);
    p->state_bytes = 0;
    for (int64_t L = 0; L < a->n_layers; L++)
        p->state_bytes += (size_t)sp_arch_state_floats(a, L) * sizeof(float) * 2 * (size_t)p->parallel;
    p->activation_bytes = activation_estimate(a, p->parallel, in->batch > 0 ? in->batch : SP_DEFAULT_BATCH, 2);
    /* a loaded tokenizer takes about 1.5x its tokenizer.json */
    p->overhead_bytes = OVERHEAD_BYTES;
    char *tj = sp_path_join(m->files->dir, "tokenizer.json");
    struct sp_map tm;
    if (tj && sp_path_is_file(tj) && sp_map_open(tj, &tm) == SP_OK) {
        p->overhead_bytes += tm.size + tm.size / 2;
        sp_map_close(&tm);
    }
    sp_error_clear();
    sp_free(tj);
    sp_memory_limits(&p->cgroup_limit, &p->mem_available);
    p->user_limit = in->mem_limit;
    p->limit = 0;
    p->limit_source = "none";
    if (p->cgroup_limit) p->limit = p->cgroup_limit, p->limit_source = "cgroup";
    if (p->mem_available && (!p->limit || p->mem_available < p->limit)) p->limit = p->mem_available, p->limit_source = "MemAvailable";
    if (p->user_limit) p->limit = p->user_limit, p->limit_source = "--mem-limit";
    if (!p->limit) return sp_errorf(SP_ERR_STATE, "cannot tell how much memory there is: give --mem-limit");
    p->usable = p->limit / 10 * 9;
    p->bw = sp_bandwidth_load(in->cache_dir);
    size_t runtime = p->kv_bytes + p->activation_bytes + p->overhead_bytes;
    size_t base = p->resident_weight_bytes + runtime;
    if (in->expert_cache_set && in->expert_cache < p->expert_bytes)
        return sp_errorf(SP_ERR_ARG, "--expert-cache %llu bytes holds no expert: the minimum is %zu bytes (one expert of "
                         "the largest MoE layer)", (unsigned long long)in->expert_cache, p->expert_bytes);
    bool fits = base + p->routed_expert_bytes <= p->usable;
    if (!p->n_experts || (fits && !in->expert_cache_set)) {
        p->strategy = SP_STRATEGY_RESIDENT;
        if (!fits)
            return sp_errorf(SP_ERR_LIMIT,
                             "the model needs %.2f GiB (%.2f GiB of weights + %.2f GiB KV, activations and overhead) but "
                             "%.2f GiB are usable (90%% of the %s limit %.2f GiB); it has no routed experts to stream",
                             (double)(base + p->routed_expert_bytes) / 1073741824.0,
                             (double)(p->resident_weight_bytes + p->routed_expert_bytes) / 1073741824.0,
                             (double)runtime / 1073741824.0, (double)p->usable / 1073741824.0, p->limit_source,
                             (double)p->limit / 1073741824.0);
        p->expert_cache = p->routed_expert_bytes;
    } else {
        p->strategy = SP_STRATEGY_EXPERT_CACHE;
        if (base + p->expert_bytes > p->usable)
            return sp_errorf(SP_ERR_LIMIT,
                             "what every token needs (%.2f GiB of non-expert weights + %.2f GiB KV, activations and "
                             "overhead) plus one expert exceeds the %.2f GiB usable (90%% of the %s limit %.2f GiB); "
                             "lower --ctx or --parallel, or raise --mem-limit",
                             (double)p->resident_weight_bytes / 1073741824.0, (double)runtime / 1073741824.0,
                             (double)p->usable / 1073741824.0, p->limit_source, (double)p->limit / 1073741824.0);
        p->expert_cache = in->expert_cache_set ? in->expert_cache : p->usable - base;
        if (p->expert_cache > p->routed_expert_bytes) p->expert_cache = p->routed_expert_bytes;
        if (in->expert_cache_set && base + p->expert_cache > p->usable)
            return sp_errorf(SP_ERR_LIMIT, "--expert-cache %.2f GiB does not fit: %.2f GiB are left after what every token needs",
                             (double)p->expert_cache / 1073741824.0, (double)(p->usable - base) / 1073741824.0);
    }
    int64_t total_experts = p->n_experts * p->n_moe_layers;
    p->cached_experts = p->expert_bytes ? (int64_t)(p->expert_cache / p->expert_bytes) : 0;
    if (p->cached_experts > total_experts) p->cached_experts = total_experts;
    p->hit_rate = total_experts ? (double)p->cached_experts / (double)total_experts : 1.0;
    p->bytes_per_token = s.active_bytes;
    double routed_per_token = (double)(p->n_experts_used * p->n_moe_layers) * (double)p->expert_bytes;
    p->disk_bytes_per_token = (size_t)(routed_per_token * (1.0 - p->hit_rate));
    double t = (double)p->bytes_per_token / (p->bw.ram_gbs * 1e9) + (double)p->disk_bytes_per_token / (p->bw.disk_gbs * 1e9);
    p->tokens_per_s = t > 0 ? 1.0 / t : 0.0;
    p->host_cache = p->strategy == SP_STRATEGY_EXPERT_CACHE ? p->expert_cache : 0;
    p->device = in->device;
    p->n_devices = in->n_devices > 1 ? in->n_devices : 1;
    if (in->device == SP_DEVICE_CPU) {
        if (p->n_devices > 1)
            return sp_errorf(SP_ERR_ARG, "%d devices: a plan over several devices needs a GPU device (--device cuda)",
                             p->n_devices);
        return SP_OK;
    }
    enum sp_status st = plan_device(m, in, p, routed_per_token);
    /* every expert on the device: the host's tier has nothing to serve */
    if (st == SP_OK && !p->gpu_expert_cache) p->host_cache = 0;
    return st;
}

static double gib(size_t b) { return (double)b / 1073741824.0; }

void sp_plan_write_json(const struct sp_plan *p, struct sp_jw *w) {
    sp_jw_obj(w);
#define KU(k, v) (sp_jw_key(w, k), sp_jw_uint(w, (uint64_t)(v)))
#define KN(k, v) (sp_jw_key(w, k), sp_jw_num(w, v))
#define KS(k, v) (sp_jw_key(w, k), sp_jw_str(w, v))
    KS("strategy", sp_strategy_name(p->strategy));
    KS("architecture", p->model_type);
    KU("file_bytes", p->file_bytes);
    KU("resident_weight_bytes", p->resident_weight_bytes);
    KU("routed_expert_bytes", p->routed_expert_bytes);
    KU("expert_bytes", p->expert_bytes);
    KU("ctx", p->ctx);
    KU("parallel", p->parallel);
    KU("kv_cache_bytes", p->kv_bytes);
    KU("recurrent_state_bytes", p->state_bytes);
    KU("activation_bytes", p->activation_bytes);
    KU("overhead_bytes", p->overhead_bytes);
    KU("limit_bytes", p->limit);
    KS("limit_source", p->limit_source);
    KU("cgroup_limit_bytes", p->cgroup_limit);
    KU("mem_available_bytes", p->mem_available);
    KU("usable_bytes", p->usable);
    KU("expert_cache_bytes", p->expert_cache);
    KU("cached_experts", p->cached_experts);
    KN("expected_hit_rate", p->hit_rate);
    KU("bytes_per_token", p->bytes_per_token);
    KU("disk_bytes_per_token", p->disk_bytes_per_token);
    KN("ram_gbs", p->bw.ram_gbs);
    KN("disk_gbs", p->bw.disk_gbs);
    sp_jw_key(w, "bandwidth_measured");
    sp_jw_bool(w, p->bw.measured);
    KN("expected_tokens_per_s", p->tokens_per_s);
    KU("host_expert_cache_bytes", p->host_cache);
    KS("device", sp_device_name(p->device));
    if (p->device != SP_DEVICE_CPU) {
        sp_jw_key(w, "gpu");
        sp_jw_obj(w);
        KU("limit_bytes", p->gpu_limit);
        KS("limit_source", p->gpu_limit_source);
        KU("usable_bytes", p->gpu_usable);
        KU("base_bytes", p->gpu_base_bytes);
        KS("experts", p->gpu_expert_cache ? "expert-cache" : "resident");
        KU("expert_cache_bytes", p->gpu_expert_cache);
        KU("cached_experts", p->gpu_cached_experts);
        KN("expected_hit_rate", p->gpu_hit_rate);
        KU("h2d_bytes_per_token", p->h2d_bytes_per_token);
        KU("devices", p->n_devices);
        KU("device_experts", p->device_experts);
        KU("device_expert_bytes", p->device_expert_bytes);
        KU("device_bytes_per_token", p->device_bytes_per_token);
        KN("device_routed_share", p->device_routed_share);
        if (p->expert_load_from) KS("expert_load", p->expert_load_from);
        KU("link_bytes_per_token", p->link_bytes_per_token);
        sp_jw_end(w);
    }
#undef KU
#undef KN
#undef KS
    sp_jw_end(w);
}

/* Whether anonymous memory can come in 2 MiB pages here (transparent huge
 * pages "always" or "madvise"; unknown counts as yes). */
static bool thp_allowed(void) {
    char mode[128] = "";
    FILE *f = fopen("/sys/kernel/mm/transparent_hugepage/enabled", "r");
    if (!f) return true;
    bool ok = !fgets(mode, sizeof mode, f) || !strstr(mode, "[never]");
    fclose(f);
    return ok;
}

double sp_plan_load(const struct sp_plan *p, struct sp_model *m, const struct sp_plan_load_params *lp) {
    if (p->strategy != SP_STRATEGY_RESIDENT) return 0.0;
    size_t in = sp_model_mapped_bytes(m);
    double mib = (double)in / 1048576.0, t0 = sp_now_s();
    /* anonymous 2 MiB pages stream faster than the page cache's pages, and
     * interleaved rows faster than rows in order (README: Memory) */
    bool keep = lp && lp->mmap;
    sp_interleave_fn want = keep || !lp ? NULL : lp->interleave;
    struct sp_model_copy copied = {0};
    sp_log(SP_LOG_INFO, "weights: bringing %.1f MiB into memory", mib);
    struct sp_progress pr;
    sp_progress_begin(&pr, "weights in memory", in, NULL);
    /* the copies first (read from the files, not through the map), then
     * every page of what stays mapped */
    if (!keep && sp_model_copy_in(m, thp_allowed(), want, &copied, &pr) != SP_OK)
        sp_log(SP_LOG_WARN, "weights: copying stopped, the rest stay in the page cache's pages: %s", sp_error_msg());
    if (sp_model_populate(m, &pr) != SP_OK) {
        sp_progress_end(&pr, false);
        sp_log(SP_LOG_WARN, "weights stay paged in on first use: %s", sp_error_msg());
        return sp_now_s() - t0;
    }
    sp_progress_end(&pr, true);
    if (copied.matrices)
        sp_log(SP_LOG_INFO, "weights: %lld matrices (%.1f MiB) in interleaved blocks of %d rows",
               (long long)copied.matrices, (double)copied.interleaved / 1048576.0, SP_QMAT_BLOCK_ROWS);
    double dt = sp_now_s() - t0, huge = (double)sp_model_huge_bytes(m) / 1048576.0;
    /* 4 KiB pages: THP is off, or --mmap kept files the page cache held in them */
    sp_log(SP_LOG_INFO, "weights: %.1f MiB of them copied out of the page cache, %.1f MiB in 2 MiB pages",
           (double)copied.copied / 1048576.0, huge);
    return dt;
}

/* The plan's device tier as text: over several devices, each one's. */
static void report_device(const struct sp_plan *p, struct sp_buf *out) {
    bool several = p->n_devices > 1;
    char dev[32];
    if (several) snprintf(dev, sizeof dev, "%s x%d", sp_device_name(p->device), p->n_devices);
    else snprintf(dev, sizeof dev, "%s", sp_device_name(p->device));
    const char *each = several ? " each" : "";
    sp_buf_printf(out, "%-15s memory %.2f GiB%s from %s; usable %.2f GiB; %.2f GiB every token needs (weights, KV cache, "
                       "buffers)%s\n",
                  dev, gib(p->gpu_limit), each, p->gpu_limit_source, gib(p->gpu_usable), gib(p->gpu_base_bytes),
                  several ? " on each" : "");
    if (several)
        sp_buf_printf(out, "%-15s each MoE layer's %lld experts split over the devices: at most %lld a layer on one, %lld "
                           "in all (%.2f GiB)\n",
                      dev, (long long)p->n_experts, (long long)(p->device_experts / (p->n_moe_layers ? p->n_moe_layers : 1)),
                      (long long)p->device_experts, gib(p->device_expert_bytes));
    if (!p->gpu_expert_cache)
        sp_buf_printf(out, "%-15s every routed expert on the device%s (%.2f GiB)\n", dev, several ? " holding it" : "",
                      gib(p->device_expert_bytes));
    else
        sp_buf_printf(out, "%-15s expert cache of %.2f GiB%s = %lld of %lld experts (%.1f%%); %.2f MiB a token copied in "
                           "from the host (uniform routing)\n",
                      dev, gib(p->gpu_expert_cache), each, (long long)p->gpu_cached_experts,
                      (long long)p->device_experts, 100.0 * p->gpu_hit_rate, (double)p->h2d_bytes_per_token / 1048576.0);
    if (several && p->expert_load_from)
        sp_buf_printf(out, "per device      %.2f MiB of weights read a decoded token on the busiest (%.1f%% of the "
                           "routed experts' tokens, by the routing counts of %s); %.1f KiB sent (the MoE layers' "
                           "outputs summed over the devices)\n",
                      (double)p->device_bytes_per_token / 1048576.0, 100.0 * p->device_routed_share,
                      p->expert_load_from, (double)p->link_bytes_per_token / 1024.0);
    else if (several)
        sp_buf_printf(out, "per device      %.2f MiB of weights read a decoded token (its share of the routed experts, "
                           "uniform routing); %.1f KiB sent (the MoE layers' outputs summed over the devices)\n",
                      (double)p->device_bytes_per_token / 1048576.0, (double)p->link_bytes_per_token / 1024.0);
}

void sp_plan_report(const struct sp_plan *p, bool json, struct sp_buf *out) {
    if (json) {
        struct sp_jw w;
        sp_jw_init(&w, out, 2);
        sp_plan_write_json(p, &w);
        sp_buf_putc(out, '\n');
        return;
    }
    sp_buf_printf(out, "plan            %s (%s)\n", sp_strategy_name(p->strategy), p->model_type);
    sp_buf_printf(out, "model           %.2f GiB of files: %.2f GiB every token needs, %.2f GiB of routed experts "
                       "(%lld x %lld layers, %.2f MiB each)\n",
                  gib(p->file_bytes), gib(p->resident_weight_bytes), gib(p->routed_expert_bytes), (long long)p->n_experts,
                  (long long)p->n_moe_layers, (double)p->expert_bytes / 1048576.0);
    sp_buf_printf(out,
                  "runtime         KV cache %.2f GiB (%lld positions x %d sequences), activations %.2f GiB, "
                  "overhead %.2f GiB\n",
                  gib(p->kv_bytes), (long long)p->ctx, p->parallel, gib(p->activation_bytes), gib(p->overhead_bytes));
    if (p->state_bytes)
        sp_buf_printf(out,
                      "                of the KV cache, recurrent states %.2f GiB: %.1f MiB a sequence and as much for "
                      "its prompt's snapshot (the same at any context)\n",
                      gib(p->state_bytes), (double)p->state_bytes / 2 / p->parallel / 1048576.0);
    char cg[32] = "none";
    if (p->cgroup_limit) snprintf(cg, sizeof cg, "%.2f GiB", gib(p->cgroup_limit));
    sp_buf_printf(out, "memory          limit %.2f GiB from %s (cgroup %s, MemAvailable %.2f GiB); usable 90%% = %.2f GiB\n",
                  gib(p->limit), p->limit_source, cg, gib(p->mem_available), gib(p->usable));
    if (p->strategy == SP_STRATEGY_RESIDENT)
        sp_buf_printf(out, "decision        everything resident: %.2f GiB needed of %.2f GiB usable\n",
                      gib(p->resident_weight_bytes + p->routed_expert_bytes + p->kv_bytes + p->activation_bytes + p->overhead_bytes),
                      gib(p->usable));
    else
        sp_buf_printf(out, "decision        expert cache of %.2f GiB = %lld of %lld experts (%.1f%%); the rest read from the files\n",
                      gib(p->expert_cache), (long long)p->cached_experts, (long long)(p->n_experts * p->n_moe_layers),
                      100.0 * p->hit_rate);
    sp_buf_printf(out, "per token       %.2f MiB of weights read; %.2f MiB from disk at a %.1f%% hit rate (uniform routing)\n",
                  (double)p->bytes_per_token / 1048576.0, (double)p->disk_bytes_per_token / 1048576.0, 100.0 * p->hit_rate);
    sp_buf_printf(out, "expected        %.2f tok/s decode bound at RAM %.1f GB/s, disk %.2f GB/s (%s)\n", p->tokens_per_s,
                  p->bw.ram_gbs, p->bw.disk_gbs,
                  p->bw.measured ? "measured by --calibrate" : "conservative defaults; run sparrow plan --calibrate");
    if (p->device != SP_DEVICE_CPU) report_device(p, out);
}
