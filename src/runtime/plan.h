/*
 * plan.h - the memory planner (DESIGN.md §5): from tensor headers alone,
 * decides what stays resident and how much memory routed experts may use as
 * a cache over the model files, and says what speed that should give.
 *
 *     struct sp_plan_inputs in = {.ctx = 4096, .parallel = 1};
 *     struct sp_plan p;
 *     if (sp_plan_make(model, &in, &p) != SP_OK) puts(sp_error_msg());
 *     sp_plan_report(&p, false, &buf);     // text; true: JSON
 *
 * Memory available is the smallest of: the cgroup limit (v2 memory.max, v1
 * memory.limit_in_bytes), MemAvailable from /proc/meminfo, and --mem-limit.
 * Strategy "resident": the whole model fits (file pages of every tensor, KV,
 * activations, runtime overhead, inside 90% of the limit). Otherwise
 * "expert-cache": everything a token needs is resident, routed experts live
 * in a cache of `expert_cache` bytes (default: what is left inside the 90%),
 * and the rest is read from the files on demand.
 *
 * On a device other than the CPU (--device cuda) the plan has a second
 * tier: device memory (--gpu-mem-limit, else what is free on the device,
 * less a reserve) holds what every token needs, the KV cache and the
 * backend's buffers first; the routed experts all go on it where they fit,
 * else into a device expert cache of what is left (model/expert_tier.h),
 * over the host's tier as above. Over several devices (n_devices > 1,
 * expert parallelism), each holds what every token needs and its share of
 * each MoE layer's routed experts (at most ceil(experts / n_devices) a
 * layer), reads that share of a token's experts (uniform routing), and
 * sends the MoE layers' outputs for a sum over the devices (a ring
 * all-reduce of float32 rows: 2 (n - 1) / n of a row a layer).
 *
 * The expected speed assumes uniform routing (hit rate = the fraction of
 * experts the cache holds) and bandwidths that --calibrate measures and
 * stores in bandwidth.json of sparrow's cache folder (cache_dir:
 * ~/.cache/sparrow by the settings' convention); without it, conservative
 * defaults are used and the report says so.
 */
#ifndef SP_RUNTIME_PLAN_H
#define SP_RUNTIME_PLAN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/json.h"
#include "model/forward.h"
#include "model/inspect.h"

struct sp_plan_inputs {
    int64_t ctx;            // positions per sequence (0: the model's, capped at 4096)
    int parallel;           // sequences (0: 1)
    int64_t batch;          // tokens per step (0: 256)
    enum sp_kv_type kv_type;
    uint64_t mem_limit;     // 0: from the cgroup and /proc/meminfo
    uint64_t expert_cache;  // 0: automatic
    bool expert_cache_set;  // --expert-cache was given (0 is then an error)
    const char *cache_dir;  // the folder of bandwidth.json (NULL: the default bandwidths)
    enum sp_device device;  // where the forward pass runs
    uint64_t gpu_mem_limit; // device memory to use (0: what is free on it now), on each device
    int n_devices;          // devices of that kind the routed experts are split over (0, 1: one)
    const double *expert_load;     // those experts placed by this load (sp_ctx_params.expert_load; NULL: alike)
    const char *expert_load_from;  // where it came from, for the report (a file's name)
};

/* How sp_plan_load brings weights in; zero is the default of each. */
struct sp_plan_load_params {
    bool mmap;       // keep the files' pages: no copies into anonymous memory (nor interleaving)
    sp_interleave_fn interleave;  // the backend's layout: matrices the copies interleave (NULL: every one in row order)
};

enum sp_strategy { SP_STRATEGY_RESIDENT, SP_STRATEGY_EXPERT_CACHE };

struct sp_bandwidth {
    double ram_gbs, disk_gbs;
    bool measured;  // false: defaults
};

struct sp_plan {
    enum sp_strategy strategy;
    const char *model_type;
    /* what the model holds */
    size_t file_bytes, tensor_bytes;
    size_t resident_weight_bytes;  // every tensor except routed experts
    size_t routed_expert_bytes;    // all routed experts
    size_t expert_bytes;           // one expert (largest MoE layer)
    int64_t n_experts, n_experts_used, n_moe_layers;
    /* runtime memory */
    int64_t ctx;
    int parallel;
    size_t kv_bytes, activation_bytes, overhead_bytes;
    size_t state_bytes;  // of kv_bytes: the recurrent layers' states (a sequence's and its snapshot's)
    /* the limit */
    uint64_t limit;                // the smallest of the sources below
    uint64_t cgroup_limit, mem_available, user_limit;  // 0: none
    const char *limit_source;      // "cgroup", "MemAvailable", "--mem-limit"
    uint64_t usable;               // 90% of the limit
    /* the decision */
    uint64_t expert_cache;         // bytes for routed experts (all of them when resident)
    int64_t cached_experts;        // whole experts the cache holds (all layers together)
    double hit_rate;               // expected, uniform routing
    size_t bytes_per_token;        // weights a decoded token reads
    size_t disk_bytes_per_token;   // expected reads from the files per token
    struct sp_bandwidth bw;
    double tokens_per_s;           // expected decode speed bound
    /* the host's expert cache to make: expert_cache bytes where the
     * strategy is expert-cache and the experts do not all live on the
     * device, else 0 */
    uint64_t host_cache;
    /* the device tier (device other than the CPU); over several devices
     * the gpu_ figures are each device's (the one holding the most experts) */
    enum sp_device device;
    int n_devices;                 // 1, or the devices the routed experts are split over
    int64_t device_experts;        // routed experts (all layers) the device holds or caches from
    size_t device_expert_bytes;    // their bytes
    size_t device_bytes_per_token; // weights a device reads a decoded token (its share of the routed experts)
    double device_routed_share;    // the busiest device's share of the routed experts' tokens
    const char *expert_load_from;  // what that share comes from (NULL: every expert alike)
    size_t link_bytes_per_token;   // what a device sends a decoded token (0 for one device)
    uint64_t gpu_limit;            // device memory to use
    const char *gpu_limit_source;  // "--gpu-mem-limit" or "free device memory"
    uint64_t gpu_usable;           // the limit less the reserve (the CUDA context's and allocations' slack)
    size_t gpu_base_bytes;         // on the device whatever the routing: non-expert weights, KV cache, buffers
    uint64_t gpu_expert_cache;     // 0: every routed expert on the device; else the device expert cache's bytes
    int64_t gpu_cached_experts;    // whole experts on the device
    double gpu_hit_rate;           // expected, uniform routing
    size_t h2d_bytes_per_token;    // expected copies into device memory per decoded token
};

/* Plans for an opened model (only headers are read). */
enum sp_status sp_plan_make(const struct sp_model *m, const struct sp_plan_inputs *in, struct sp_plan *out);
void sp_plan_report(const struct sp_plan *p, bool json, struct sp_buf *out);
/* Brings in what the plan keeps in memory: under "resident", every weight
 * file (sp_model_populate), so that no page fault lands in a forward pass;
 * each of 2 MiB or more copied into anonymous 2 MiB pages where
 * transparent huge pages are on, and one holding matrices that
 * lp->interleave takes (the backend's layout: sp_ctx_interleave) copied
 * with them interleaved (sp_model_copy_in), unless lp says mmap (no
 * copies; lp NULL: copies, rows in order); under "expert-cache"
 * nothing (the cache fills as experts are used). A failure is only logged
 * (the weights stay readable through the mapping). Returns the seconds it
 * took. */
double sp_plan_load(const struct sp_plan *p, struct sp_model *m, const struct sp_plan_load_params *lp);
/* Writes the plan as a JSON object value into an open writer. */
void sp_plan_write_json(const struct sp_plan *p, struct sp_jw *w);
const char *sp_strategy_name(enum sp_strategy s);

/* The bandwidths stored in cache_dir, or conservative defaults (measured
 * = false; also for cache_dir NULL). */
struct sp_bandwidth sp_bandwidth_load(const char *cache_dir);
/* Measures RAM read bandwidth (one thread per physical core, membw.h) and
 * the read bandwidth of `file` (page cache dropped first when possible)
 * and stores both in cache_dir (made if missing). */
enum sp_status sp_bandwidth_calibrate(const char *file, const char *cache_dir, struct sp_bandwidth *out);
/* The memory limit of this process: cgroup and MemAvailable (0: unknown). */
void sp_memory_limits(uint64_t *cgroup, uint64_t *available);

#endif
