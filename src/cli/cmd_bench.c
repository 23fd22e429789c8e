/*
 * cmd_bench.c - `sparrow bench`: prefill and decode speed of a model on this
 * machine, with the bytes each decoded token reads and the efficiency
 * against the measured memory bandwidth; with an expert cache, its hit rate
 * and disk throughput, optionally against plain mmap in the same run, and
 * the share of the machine's CPU time a hypervisor kept meanwhile (steal:
 * in a VM whose host is busy the figures move with it). One human line and
 * one JSON line per run.
 *
 * With --synthetic CONFIG.json the model is generated first: random weights
 * of the config's exact shapes, written in bf16 or quantized to the --quant
 * format, into --out DIR (kept) or a temporary folder deleted afterwards.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/file.h"
#include "core/json.h"
#include "core/rng.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/membw.h"
#include "runtime/experts.h"
#include "model/expert_tier.h"
#include "model/forward.h"
#include "model/inspect.h"
#include "model/quantize.h"
#include "model/synth.h"
#include "runtime/plan.h"

static const char usage[] =
    "usage: sparrow bench --model MODEL [--prompt N] [--gen N] [--batch N] [--threads N] [--kv-type T]\n"
    "                     [--mem-limit SIZE] [--expert-cache SIZE] [--gpu-mem-limit SIZE] [--cold]\n"
    "                     [--compare-mmap] [--repeat N] [--warmup N]\n"
    "                     [--steps]\n"
    "       sparrow bench --synthetic CONFIG.json --quant affine4|affine8|mxfp4|bf16 [--layers N]\n"
    "                     [--out DIR] [same flags as with --model]\n"
    "  --synthetic C     benchmark random weights of the exact shapes of config.json C (no download),\n"
    "                    routing tokens over the experts as a trained model does\n"
    "  --quant F         their format; --layers N keeps the first N layers (default: all)\n"
    "  --out DIR         write the model to DIR (new or empty) and keep it; default: a temporary\n"
    "                    folder in $TMPDIR, deleted afterwards\n"
    "  --prompt N        prompt tokens to prefill (default 512; random ids, fixed seed)\n"
    "  --gen N           tokens to decode greedily (default 64)\n"
    "  --seqs N          decode N sequences together, each with its own prompt (default 1); decode\n"
    "                    tok/s counts every sequence's tokens; bandwidth is computed for N = 1 only\n"
    "  --batch N         prefill chunk, in tokens (default " SP_DEFAULT_BATCH_TEXT ", as run and serve)\n"
    "  --expert-cache S  routed experts in a cache of S bytes (default: from the plan)\n"
    "  --gpu-mem-limit S device memory to plan for with --device cuda (default: what is free on it);\n"
    "                    routed experts that do not fit go into a device expert cache\n"
    "  --cold            drop the model files from the page cache first (real disk reads)\n"
    "  --compare-mmap    also run with experts read through the mapping, and print the ratio\n"
    "  --repeat N        N runs, each followed by its own bandwidth measurement, then a summary line:\n"
    "                    medians and bests (a shared machine's noise shows in their spread)\n"
    "  --warmup N        N runs first, not counted, of the same prompt and 2 decoded tokens (default 1;\n"
    "                    0: none): a process's first run also pays one-time costs (loading the GPU's\n"
    "                    kernels, first touches of memory)\n"
    "  --steps           also time each step of the forward pass (products, attention, routing,\n"
    "                    experts, ...): its share of prefill and of decode, and the multiply-adds\n"
    "                    a second of the products, and how many tokens each routed expert took on\n"
    "                    average; a line and a JSON line per phase\n"
    SP_CLI_SETTINGS_USAGE;

static void drop_cache(const struct sp_model *m) {
    for (int i = 0; i < m->files->n_shards; i++) posix_fadvise(m->files->shards[i]->map.fd, 0, 0, POSIX_FADV_DONTNEED);
}

struct result {
    double load_s;  // bringing resident weights into memory, before the run (sp_plan_load)
    double prefill_s, decode_s;
    int64_t prompt, gen;  // tokens over all sequences
    int seqs;
    bool has_experts;
    struct sp_expert_store_stats es;
    bool has_tier;                        // a device expert cache: its counters after prefill and at the end
    struct sp_expert_tier_stats tier[2];
    bool has_graphs;                      // a backend that replays recorded steps: its counts after prefill and at the end
    int64_t replayed[2], built[2];
    size_t rss_anon, rss_file, rss_peak;  // measured at the end of the run, context still alive
    size_t weights_huge;                  // bytes of the weight files in 2 MiB pages (mapped or copied)
    bool has_steps;                       // --steps: the forward pass's steps, timed
    struct sp_step_times steps[2];        // prefill, decode
    double steal_pct;                     // the machine's CPU time the hypervisor kept during the run (< 0: unknown)
};

/* Resident memory now, from /proc/self/status: anonymous, file-backed, peak. */
static void rss_now(size_t *anon, size_t *file, size_t *peak) {
    *anon = *file = *peak = 0;
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    unsigned long long kb;
    while (f && fgets(line, sizeof line, f)) {
        if (sscanf(line, "RssAnon: %llu kB", &kb) == 1) *anon = (size_t)kb * 1024;
        if (sscanf(line, "RssFile: %llu kB", &kb) == 1) *file = (size_t)kb * 1024;
        if (sscanf(line, "VmHWM: %llu kB", &kb) == 1) *peak = (size_t)kb * 1024;
    }
    if (f) fclose(f);
}

/* The machine's CPU time so far in clock ticks, from the first line of
 * /proc/stat: all of it, and the part a hypervisor gave to other guests
 * while this one had work to run (steal). False without that line. */
static bool cpu_ticks(unsigned long long *steal, unsigned long long *total) {
    unsigned long long v[8];  // user nice system idle iowait irq softirq steal
    FILE *f = fopen("/proc/stat", "r");
    int got = f ? fscanf(f, "cpu %llu %llu %llu %llu %llu %llu %llu %llu", &v[0], &v[1], &v[2], &v[3], &v[4], &v[5],
                         &v[6], &v[7])
                : 0;
    if (f) fclose(f);
    if (got != 8) return false;
    *steal = v[7];
    *total = 0;
    for (int i = 0; i < 8; i++) *total += v[i];
    return true;
}

/* One run on a fresh context, with a fresh expert cache of expert_cache
 * bytes (0: none). */
static enum sp_status run_once(const struct sp_model *m, const struct sp_ctx_params *params, size_t expert_cache,
                               const struct sp_expert_store_params *ep, int64_t prompt, int64_t gen, bool cold,
                               struct result *r) {
    int ns = params->n_seq > 0 ? params->n_seq : 1;
    memset(r, 0, sizeof *r);
    if (cold) drop_cache(m);
    struct sp_ctx *c = NULL;
    struct sp_expert_store *store = NULL;
    struct sp_expert_source source;
    struct sp_ctx_params with = *params;
    const struct sp_ctx_params *cp = &with;
    enum sp_status st = SP_OK;
    if (expert_cache) {
        if ((st = sp_expert_store_create(m, expert_cache, ep, &store)) != SP_OK) return st;
        source = sp_expert_store_source(store);
        with.experts = &source;
    }
    if ((st = sp_ctx_create(m, cp, &c)) != SP_OK) {
        sp_expert_store_free(store);
        return st;
    }
    int64_t V = m->arch.vocab, B = cp->max_batch;
    int64_t B2 = B > ns ? B : ns;
    int32_t *tok = sp_malloc((size_t)(prompt * ns + ns) * sizeof(int32_t), SP_MEM_ACT);
    int32_t *pos = sp_malloc((size_t)B2 * sizeof(int32_t), SP_MEM_ACT), *seq = sp_calloc((size_t)B2, sizeof(int32_t), SP_MEM_ACT);
    bool *want = sp_calloc((size_t)B2, sizeof(bool), SP_MEM_ACT);
    float *logits = sp_malloc((size_t)V * (size_t)ns * sizeof(float), SP_MEM_ACT);
    if (!tok || !pos || !seq || !want || !logits) {
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    struct sp_rng rng;
    sp_rng_seed(&rng, 1234);
    for (int64_t i = 0; i < prompt * ns; i++) tok[i] = (int32_t)(sp_rng_next(&rng) % (uint64_t)V);
    unsigned long long steal0, total0, steal1, total1;
    bool ticks = cpu_ticks(&steal0, &total0);
    double t0 = sp_now_s();
    /* each sequence's prompt in chunks; its last token's greedy choice is
     * its first decoded token (the logits stay where they were computed,
     * as a server's greedy requests leave them) */
    int32_t *next = tok + prompt * ns;
    for (int q = 0; q < ns && st == SP_OK; q++)
        for (int64_t s = 0; s < prompt && st == SP_OK; s += B) {
            int64_t k = prompt - s < B ? prompt - s : B;
            for (int64_t i = 0; i < k; i++) {
                pos[i] = (int32_t)(s + i);
                seq[i] = q;
                want[i] = s + i == prompt - 1;
            }
            struct sp_batch b = {.n = k, .tokens = tok + q * prompt + s, .pos = pos, .seq = seq, .want_logits = want,
                                 .argmax = next + q};
            st = sp_ctx_forward(c, &b, logits);
        }
    double t1 = sp_now_s();
    r->has_tier = sp_ctx_tier_stats(c, &r->tier[0]);
    r->has_graphs = sp_ctx_graph_counts(c, &r->replayed[0], &r->built[0]);
    r->has_steps = cp->time_steps;
    sp_ctx_step_times(c, &r->steps[0], true);
    for (int q = 0; q < ns; q++) {
        seq[q] = q;
        want[q] = true;
    }
    for (int64_t i = 0; i < gen && st == SP_OK; i++) {
        for (int q = 0; q < ns; q++) pos[q] = (int32_t)(prompt + i);
        struct sp_batch b = {.n = ns, .tokens = next, .pos = pos, .seq = seq, .want_logits = want, .argmax = next};
        st = sp_ctx_forward(c, &b, logits);
    }
    double t2 = sp_now_s();
    ticks = ticks && cpu_ticks(&steal1, &total1) && total1 > total0 && steal1 >= steal0;
    r->steal_pct = ticks ? 100.0 * (double)(steal1 - steal0) / (double)(total1 - total0) : -1;
    sp_ctx_step_times(c, &r->steps[1], true);
    r->prefill_s = t1 - t0;
    r->decode_s = t2 - t1;
    r->prompt = prompt * ns;
    r->gen = gen * ns;
    r->seqs = ns;
    r->has_experts = store != NULL;
    if (store) sp_expert_store_stats(store, &r->es);
    sp_ctx_tier_stats(c, &r->tier[1]);
    sp_ctx_graph_counts(c, &r->replayed[1], &r->built[1]);
    rss_now(&r->rss_anon, &r->rss_file, &r->rss_peak);
    r->weights_huge = sp_model_huge_bytes(m);
done:
    sp_free(tok);
    sp_free(pos);
    sp_free(seq);
    sp_free(want);
    sp_free(logits);
    sp_ctx_free(c);
    sp_expert_store_free(store);
    return st;
}

static const char *main_format(const struct sp_model_stats *s) {
    int best = 0;
    for (int i = 1; i < s->n_formats; i++)
        if (s->formats[i].bytes > s->formats[best].bytes) best = i;
    return s->n_formats ? s->formats[best].name : "?";
}

/* The machine's RAM read bandwidth now, by the bench's thread count (a
 * 256 MiB buffer: 8x the largest last-level caches, small enough to fit
 * beside a model under a memory limit); the stored or default figure if
 * that cannot be measured. */
static double machine_gbs(const struct sp_plan *pl, int nth, enum sp_device dev, bool *measured) {
    struct sp_pool *pool;
    struct sp_membw bw = {0};
    *measured = false;
    if (dev != SP_DEVICE_CPU) {  /* the device's own memory, 1 GiB copied within it */
        double gbs = 0;
        *measured = sp_backend_copy_gbs(dev, (size_t)1 << 30, &gbs) == SP_OK && gbs > 0;
        return gbs;
    }
    if (sp_pool_create(nth, &pool) != SP_OK) return pl->bw.ram_gbs;
    *measured = sp_membw_measure(pool, nth, (size_t)256 << 20, &bw) == SP_OK && bw.gbs > 0;
    sp_pool_free(pool);
    return *measured ? bw.gbs : pl->bw.ram_gbs;
}

/* Most runs --repeat takes. */
#define REPEAT_MAX 1000

/* The figures of one run that a summary of repeated runs compares. */
enum { RS_PREFILL, RS_DECODE, RS_MACHINE_GBS, RS_EFFICIENCY, RS_DECODE_GBS, RS_STEAL, RS_COUNT };
struct run_stats {
    /* tok/s, tok/s, bandwidth measured after the run, % of it the decode
     * read, decode GB/s, steal % (< 0: unknown) */
    double v[RS_COUNT];
};

static struct run_stats run_stats_of(const struct sp_model_stats *ms, const struct result *r, double ram_gbs) {
    struct run_stats s = {{0}};
    s.v[RS_PREFILL] = r->prefill_s > 0 ? (double)r->prompt / r->prefill_s : 0;
    s.v[RS_DECODE] = r->decode_s > 0 ? (double)r->gen / r->decode_s : 0;
    s.v[RS_MACHINE_GBS] = ram_gbs;
    /* one sequence: every decoded token reads the active bytes; more share some of them */
    s.v[RS_DECODE_GBS] = r->seqs > 1 ? 0 : (double)ms->active_bytes * s.v[RS_DECODE] / 1e9;
    s.v[RS_EFFICIENCY] = ram_gbs > 0 ? 100.0 * s.v[RS_DECODE_GBS] / ram_gbs : 0;
    s.v[RS_STEAL] = r->steal_pct;
    return s;
}

/* --steps: for prefill and for decode, a human line (each step's share of
 * the phase, and the multiply-adds a second of the products) and a JSON
 * line (each step's seconds and multiply-adds). */
static void report_steps(const struct result *r) {
    static const char *const phases[2] = {"prefill", "decode"};
    const double wall[2] = {r->prefill_s, r->decode_s};
    const int64_t tokens[2] = {r->prompt, r->gen};
    for (int ph = 0; ph < 2; ph++) {
        const struct sp_step_times *t = &r->steps[ph];
        printf("steps, %s (%% of %.3f s; G multiply-adds a second):", phases[ph], wall[ph]);
        for (int s = 0; s < SP_STEP_COUNT; s++) {
            printf(" %s %.1f%%", sp_step_name(s), wall[ph] > 0 ? 100.0 * t->seconds[s] / wall[ph] : 0.0);
            if (t->macs[s] > 0 && t->seconds[s] > 0) printf(" (%.1f)", t->macs[s] / t->seconds[s] / 1e9);
            printf(s + 1 < SP_STEP_COUNT ? "," : "");
        }
        /* how many tokens each routed expert's weights were read for */
        if (t->experts_run > 0) printf("; routed experts: %.1f tokens each", t->routed / t->experts_run);
        printf("\n");
        struct sp_buf b = SP_BUF_INIT;
        struct sp_jw w;
        sp_jw_init(&w, &b, 0);
        sp_jw_obj(&w);
        sp_jw_key(&w, "bench"); sp_jw_str(&w, "steps");
        sp_jw_key(&w, "phase"); sp_jw_str(&w, phases[ph]);
        sp_jw_key(&w, "tokens"); sp_jw_int(&w, tokens[ph]);
        sp_jw_key(&w, "wall_s"); sp_jw_num(&w, wall[ph]);
        sp_jw_key(&w, "routed"); sp_jw_num(&w, t->routed);
        sp_jw_key(&w, "experts_run"); sp_jw_num(&w, t->experts_run);
        for (int s = 0; s < SP_STEP_COUNT; s++) {
            sp_jw_key(&w, sp_step_name(s));
            sp_jw_obj(&w);
            sp_jw_key(&w, "s"); sp_jw_num(&w, t->seconds[s]);
            sp_jw_key(&w, "macs"); sp_jw_num(&w, t->macs[s]);
            sp_jw_end(&w);
        }
        sp_jw_end(&w);
        printf("%s\n", b.data);
        sp_buf_free(&b);
    }
}

/* One human and one JSON line for a run; its figures, for a summary. */
static struct run_stats report(const struct sp_model *m, const struct sp_model_stats *ms, const struct sp_plan *pl,
                               const char *mode, int threads, enum sp_device dev, double ram_gbs, bool ram_measured,
                               const char *synthetic, const struct result *r) {
    struct run_stats st = run_stats_of(ms, r, ram_gbs);
    double pre = st.v[RS_PREFILL], dec = st.v[RS_DECODE], gbs = st.v[RS_DECODE_GBS], eff = st.v[RS_EFFICIENCY];
    double hit = r->has_experts && r->es.hits + r->es.misses ? (double)r->es.hits / (double)(r->es.hits + r->es.misses) : 1.0;
    double disk = r->has_experts && r->es.read_s > 0 ? (double)r->es.bytes_read / r->es.read_s / 1e6 : 0;
    const struct sp_arch *a = &m->arch;
    char where[64];
    if (dev == SP_DEVICE_CPU)
        snprintf(where, sizeof where, "%d threads (%s kernels)", threads, sp_kernels()->name);
    else
        snprintf(where, sizeof where, "device %s", sp_device_name(dev));
    char seqs[48] = "";
    if (r->seqs > 1) snprintf(seqs, sizeof seqs, " (%d sequences)", r->seqs);
    /* the weights held: the files' maps still read, and what a file made when opened */
    size_t weights = sp_model_mapped_bytes(m);
    for (int i = 0; i < m->files->n_shards; i++) weights += m->files->shards[i]->owned_bytes;
    printf("%s: %s %lldL d%lld %lldx top-%lld %s, %s: load %.2f s, prefill %lld tokens "
           "%.1f tok/s, decode %.2f tok/s%s, %.1f MiB/token, %.2f GB/s = %.0f%% of %.1f GB/s%s; weights %.0f%% in "
           "2 MiB pages",
           mode, a->model_type, (long long)a->n_layers, (long long)a->d_model, (long long)a->n_experts,
           (long long)a->n_experts_used, main_format(ms), where, r->load_s, (long long)r->prompt, pre, dec, seqs,
           (double)ms->active_bytes / 1048576.0, gbs, eff, ram_gbs,
           dev != SP_DEVICE_CPU ? (ram_measured ? " (device copy, measured now)" : " (device copy not measured)")
           : ram_measured      ? " (measured now)"
           : pl->bw.measured   ? " (calibrated)"
                               : " (default)",
           weights ? 100.0 * (double)(r->weights_huge < weights ? r->weights_huge : weights) / (double)weights : 0.0);
    if (r->has_experts)
        printf("; expert cache %.1f MiB: hit rate %.1f%%, %.1f MiB read, %.1f MB/s, prefetch %llu (%llu used, %llu wasted)",
               (double)r->es.budget / 1048576.0, 100.0 * hit, (double)r->es.bytes_read / 1048576.0, disk,
               (unsigned long long)r->es.prefetch_issued, (unsigned long long)r->es.prefetch_hits,
               (unsigned long long)r->es.prefetch_waste);
    /* the device tier while decoding */
    const struct sp_expert_tier_stats *t0 = &r->tier[0], *t1 = &r->tier[1];
    uint64_t d_hits = t1->hits - t0->hits, d_miss = t1->misses - t0->misses, d_bytes = t1->bytes_in - t0->bytes_in;
    double d_hit = d_hits + d_miss ? (double)d_hits / (double)(d_hits + d_miss) : 1.0;
    double h2d_tok = r->gen ? (double)d_bytes / (double)r->gen : 0.0;
    if (r->has_tier)
        printf("; %s expert cache %.1f MiB (%lld experts): decode hit rate %.1f%%, %.2f MiB a token copied in, %.2f GB/s, "
               "%llu experts copied ahead (%llu of them used)",
               sp_device_name(dev), (double)t1->budget / 1048576.0, (long long)t1->slots, 100.0 * d_hit,
               h2d_tok / 1048576.0, r->decode_s > 0 ? (double)d_bytes / r->decode_s / 1e9 : 0.0,
               (unsigned long long)(t1->prefetched - t0->prefetched),
               (unsigned long long)(t1->prefetch_used - t0->prefetch_used));
    if (r->has_graphs)
        printf("; decode steps replayed as graphs: %lld of %lld (%lld built)",
               (long long)(r->replayed[1] - r->replayed[0]), (long long)(r->gen / (r->seqs > 0 ? r->seqs : 1)),
               (long long)(r->built[1] - r->built[0]));
    if (r->steal_pct >= 0.5) printf("; the hypervisor kept %.0f%% of the CPU time (steal)", r->steal_pct);
    printf("\n");
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "bench"); sp_jw_str(&w, mode);
    sp_jw_key(&w, "model"); sp_jw_str(&w, m->files->dir);
    if (synthetic) {
        sp_jw_key(&w, "synthetic"); sp_jw_str(&w, synthetic);
    }
    sp_jw_key(&w, "architecture"); sp_jw_str(&w, a->model_type);
    sp_jw_key(&w, "layers"); sp_jw_int(&w, a->n_layers);
    sp_jw_key(&w, "hidden"); sp_jw_int(&w, a->d_model);
    sp_jw_key(&w, "experts"); sp_jw_int(&w, a->n_experts);
    sp_jw_key(&w, "experts_per_token"); sp_jw_int(&w, a->n_experts_used);
    sp_jw_key(&w, "format"); sp_jw_str(&w, main_format(ms));
    sp_jw_key(&w, "device"); sp_jw_str(&w, sp_device_name(dev));
    sp_jw_key(&w, "threads"); sp_jw_int(&w, threads);
    sp_jw_key(&w, "kernels"); sp_jw_str(&w, dev == SP_DEVICE_CPU ? sp_kernels()->name : sp_device_name(dev));
    sp_jw_key(&w, "load_s"); sp_jw_num(&w, r->load_s);
    sp_jw_key(&w, "prompt_tokens"); sp_jw_int(&w, r->prompt);
    sp_jw_key(&w, "prefill_tok_s"); sp_jw_num(&w, pre);
    sp_jw_key(&w, "sequences"); sp_jw_int(&w, r->seqs);
    sp_jw_key(&w, "decode_tokens"); sp_jw_int(&w, r->gen);
    sp_jw_key(&w, "decode_tok_s"); sp_jw_num(&w, dec);
    sp_jw_key(&w, "bytes_per_token"); sp_jw_uint(&w, ms->active_bytes);
    sp_jw_key(&w, "achieved_gbs"); sp_jw_num(&w, gbs);
    sp_jw_key(&w, "machine_gbs"); sp_jw_num(&w, ram_gbs);
    sp_jw_key(&w, "bandwidth_measured"); sp_jw_bool(&w, ram_measured || pl->bw.measured);
    sp_jw_key(&w, "efficiency_pct"); sp_jw_num(&w, eff);
    if (r->steal_pct >= 0) {
        sp_jw_key(&w, "steal_pct"); sp_jw_num(&w, r->steal_pct);
    }
    if (r->has_graphs) {
        sp_jw_key(&w, "decode_graph_replays"); sp_jw_int(&w, r->replayed[1] - r->replayed[0]);
        sp_jw_key(&w, "decode_graphs_built"); sp_jw_int(&w, r->built[1] - r->built[0]);
    }
    sp_jw_key(&w, "rss_anon_bytes"); sp_jw_uint(&w, r->rss_anon);
    sp_jw_key(&w, "rss_file_bytes"); sp_jw_uint(&w, r->rss_file);
    sp_jw_key(&w, "rss_peak_bytes"); sp_jw_uint(&w, r->rss_peak);
    sp_jw_key(&w, "weights_huge_bytes"); sp_jw_uint(&w, r->weights_huge);
    /* the plan's resident weights, less what the load copied out of the page cache */
    size_t copied = sp_model_copied_bytes(m);
    size_t mapped = r->has_experts ? pl->resident_weight_bytes : pl->resident_weight_bytes + pl->routed_expert_bytes;
    sp_jw_key(&w, "plan_anon_bytes");
    sp_jw_uint(&w, (r->has_experts ? r->es.budget : 0) + pl->kv_bytes + pl->activation_bytes + pl->overhead_bytes + copied);
    sp_jw_key(&w, "plan_file_bytes");
    sp_jw_uint(&w, mapped > copied ? mapped - copied : 0);
    if (r->has_experts) {
        sp_jw_key(&w, "expert_cache_bytes"); sp_jw_uint(&w, r->es.budget);
        sp_jw_key(&w, "expert_misses"); sp_jw_uint(&w, r->es.misses);
        sp_jw_key(&w, "io"); sp_jw_str(&w, r->es.io_uring ? (r->es.direct_io ? "io_uring+O_DIRECT" : "io_uring") : "pread");
        sp_jw_key(&w, "expert_policy"); sp_jw_str(&w, sp_expert_policy_name(r->es.policy));
        sp_jw_key(&w, "prefetch_issued"); sp_jw_uint(&w, r->es.prefetch_issued);
        sp_jw_key(&w, "prefetch_hits"); sp_jw_uint(&w, r->es.prefetch_hits);
        sp_jw_key(&w, "prefetch_waste"); sp_jw_uint(&w, r->es.prefetch_waste);
        sp_jw_key(&w, "expert_bytes"); sp_jw_uint(&w, pl->expert_bytes);
        sp_jw_key(&w, "hit_rate"); sp_jw_num(&w, hit);
        sp_jw_key(&w, "expert_bytes_read"); sp_jw_uint(&w, r->es.bytes_read);
        sp_jw_key(&w, "disk_mb_s"); sp_jw_num(&w, disk);
        sp_jw_key(&w, "plan_tok_s"); sp_jw_num(&w, pl->tokens_per_s);
    }
    if (r->has_tier) {
        sp_jw_key(&w, "gpu_expert_cache_bytes"); sp_jw_uint(&w, t1->budget);
        sp_jw_key(&w, "gpu_cached_experts"); sp_jw_uint(&w, (uint64_t)t1->slots);
        sp_jw_key(&w, "gpu_decode_hit_rate"); sp_jw_num(&w, d_hit);
        sp_jw_key(&w, "gpu_plan_hit_rate"); sp_jw_num(&w, pl->gpu_hit_rate);
        sp_jw_key(&w, "h2d_bytes_per_token"); sp_jw_num(&w, h2d_tok);
        sp_jw_key(&w, "h2d_bytes"); sp_jw_uint(&w, t1->bytes_in);
        sp_jw_key(&w, "gpu_fences"); sp_jw_uint(&w, t1->fences);
        sp_jw_key(&w, "gpu_prefetched"); sp_jw_uint(&w, t1->prefetched);
        sp_jw_key(&w, "gpu_prefetch_used"); sp_jw_uint(&w, t1->prefetch_used);
        sp_jw_key(&w, "cpu_computed_experts"); sp_jw_uint(&w, t1->cpu_experts);
    }
    sp_jw_end(&w);
    printf("%s\n", b.data);
    sp_buf_free(&b);
    if (r->has_steps) report_steps(r);
    return st;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* Median and largest of figure k over n runs. */
static void median_best(const struct run_stats *s, int64_t n, int k, double *median, double *best) {
    double v[REPEAT_MAX];
    for (int64_t i = 0; i < n; i++) v[i] = s[i].v[k];
    qsort(v, (size_t)n, sizeof *v, cmp_double);
    *median = n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
    *best = v[n - 1];
}

/* One human and one JSON line over n runs: the median and the best of each
 * figure; the efficiency's median is that of the runs' own ratios, and
 * "best" compares the fastest decode with the fastest bandwidth seen. Where
 * every run knew its steal, its median and the most of it. */
static void summarize(const struct run_stats *s, int64_t n) {
    static const char *const keys[RS_DECODE_GBS] = {"prefill_tok_s", "decode_tok_s", "machine_gbs", "efficiency_pct"};
    double med[RS_COUNT], best[RS_COUNT];
    for (int k = 0; k < RS_COUNT; k++) median_best(s, n, k, &med[k], &best[k]);
    /* not the best of the runs' ratios: the fastest decode over the fastest bandwidth */
    best[RS_EFFICIENCY] = best[RS_MACHINE_GBS] > 0 ? 100.0 * best[RS_DECODE_GBS] / best[RS_MACHINE_GBS] : 0;
    printf("summary of %lld runs: prefill %.1f tok/s (best %.1f), decode %.2f tok/s (best %.2f), bandwidth %.1f GB/s "
           "(best %.1f), efficiency %.0f%% (best decode over best bandwidth: %.0f%%)",
           (long long)n, med[RS_PREFILL], best[RS_PREFILL], med[RS_DECODE], best[RS_DECODE], med[RS_MACHINE_GBS],
           best[RS_MACHINE_GBS], med[RS_EFFICIENCY], best[RS_EFFICIENCY]);
    bool steal = true;
    for (int64_t i = 0; i < n; i++) steal = steal && s[i].v[RS_STEAL] >= 0;
    if (steal) printf(", steal %.1f%% of the CPU time (most %.1f%%)", med[RS_STEAL], best[RS_STEAL]);
    printf("\n");
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &b, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "bench"); sp_jw_str(&w, "summary");
    sp_jw_key(&w, "runs"); sp_jw_int(&w, n);
    for (int k = 0; k < RS_DECODE_GBS; k++) {
        char key[64];
        snprintf(key, sizeof key, "%s_median", keys[k]);
        sp_jw_key(&w, key); sp_jw_num(&w, med[k]);
        snprintf(key, sizeof key, "%s_best", keys[k]);
        sp_jw_key(&w, key); sp_jw_num(&w, best[k]);
    }
    if (steal) {
        sp_jw_key(&w, "steal_pct_median"); sp_jw_num(&w, med[RS_STEAL]);
        sp_jw_key(&w, "steal_pct_most"); sp_jw_num(&w, best[RS_STEAL]);
    }
    sp_jw_end(&w);
    printf("%s\n", b.data);
    sp_buf_free(&b);
}

/* --synthetic: the generated model and the folders to delete afterwards. */
struct synth {
    const char *config, *out;
    const char *quant;  // its name, as given
    const char *tmp_dir;  // where temporary folders go
    enum sp_qtype type;
    int64_t layers;     // 0: the config's
    char *dir;          // the folder benchmarked (owned)
    char *bf16;         // the bf16 model a quantized one is made from, while it exists (owned)
    bool remove_dir;    // dir is deleted afterwards: a temporary folder, or --out that failed
    bool generated;
};

static const struct {
    const char *name;
    enum sp_qtype type;
} synth_formats[] = {
    {"affine4", SP_QTYPE_AFFINE4}, {"affine8", SP_QTYPE_AFFINE8}, {"mxfp4", SP_QTYPE_MXFP4}, {"bf16", SP_QTYPE_BF16}};

/* A fresh folder sparrow-synth-XXXXXX in tmp_dir; owned path. */
static enum sp_status make_tmp_dir(const char *tmp_dir, char **out) {
    char *p = sp_path_join(tmp_dir, "sparrow-synth-XXXXXX");
    if (!p) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (!mkdtemp(p)) {
        enum sp_status st = sp_errorf(SP_ERR_IO, "%s: %s", p, strerror(errno));
        sp_free(p);
        return st;
    }
    *out = p;
    return SP_OK;
}

/* Whether dir holds nothing but "." and "..". */
static bool dir_is_empty(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return false;
    struct dirent *e;
    bool empty = true;
    while (empty && (e = readdir(d))) empty = strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0;
    closedir(d);
    return empty;
}

/* Writes the model into s->dir: bf16 straight there; a quantized format
 * through a bf16 copy in a temporary folder, deleted once quantized. */
static enum sp_status synth_build(struct synth *s) {
    cJSON *cfg;
    enum sp_status st = sp_json_parse_file(s->config, 16 << 20, &cfg);
    if (st != SP_OK) return st;
    if (s->out) {
        if (sp_path_is_dir(s->out) && !dir_is_empty(s->out))
            st = sp_errorf(SP_ERR_ARG, "--out %s: not an empty folder (give a new or empty one)", s->out);
        else if (!(s->dir = sp_strdup(s->out, SP_MEM_MISC)))
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        s->remove_dir = !sp_path_is_dir(s->out);
    } else {
        st = make_tmp_dir(s->tmp_dir, &s->dir);
        s->remove_dir = true;
    }
    if (st != SP_OK) {
        cJSON_Delete(cfg);
        return st;
    }
    int64_t layers = s->layers;
    if (!layers && sp_json_get_int(cfg, "num_hidden_layers", 0, &layers) != SP_OK) layers = 0;
    fprintf(stderr, "bench: generating %s: %lld layer%s, %s, random weights, in %s\n", s->config, (long long)layers,
            layers == 1 ? "" : "s", s->quant, s->dir);
    double t0 = sp_now_s();
    /* made on every core, whatever --threads the benchmark runs on; routed
     * as a trained model routes (synth.h) */
    struct sp_synth_opts so = {.dtype = SP_DTYPE_BF16, .seed = 1, .layers = s->layers, .balanced_routing = true};
    st = sp_pool_create(0, &so.pool);
    if (st == SP_OK && s->type == SP_QTYPE_BF16) {
        st = sp_synth_write(cfg, s->dir, &so);
    } else if (st == SP_OK) {
        struct sp_model *m = NULL;
        st = make_tmp_dir(s->tmp_dir, &s->bf16);
        if (st == SP_OK) st = sp_synth_write(cfg, s->bf16, &so);
        if (st == SP_OK) st = sp_model_open(s->bf16, &m);
        // group: the format's (affine 64, mxfp4 32)
        struct sp_quantize_opts qo = {.type = s->type, .pool = so.pool};
        if (st == SP_OK) st = sp_quantize_model(m, s->dir, &qo);
        if (m) sp_model_close(m);
        if (st == SP_OK && (st = sp_dir_remove_files(s->bf16)) == SP_OK) {
            sp_free(s->bf16);
            s->bf16 = NULL;
        }
    }
    sp_pool_free(so.pool);
    cJSON_Delete(cfg);
    if (st != SP_OK) return st;
    s->generated = true;
    if (s->out) s->remove_dir = false;
    fprintf(stderr, "bench: generated in %.1f s\n", sp_now_s() - t0);
    return SP_OK;
}

/* Deletes what synth_build left to delete; false (said on stderr) if that failed. */
static bool synth_cleanup(struct synth *s) {
    bool ok = true;
    if (s->bf16 && sp_path_is_dir(s->bf16) && sp_dir_remove_files(s->bf16) != SP_OK) {
        sp_cli_fail();
        ok = false;
    }
    if (s->dir && s->remove_dir && sp_path_is_dir(s->dir) && sp_dir_remove_files(s->dir) != SP_OK) {
        sp_cli_fail();
        ok = false;
    }
    if (s->generated && !s->remove_dir) fprintf(stderr, "bench: the synthetic model is kept in %s (a loadable model folder)\n", s->dir);
    sp_free(s->bf16);
    sp_free(s->dir);
    return ok;
}

struct bench_opts {
    int64_t prompt, gen, batch, threads, repeat, warmup, seqs;
    bool cold, compare, steps;
    struct sp_plan_inputs pin;
    struct sp_settings set;
    enum sp_device device;
    const char *synthetic;  // the config of a --synthetic model, for the JSON line
};

/* The runs on one model folder; the process exit code. */
static int bench_model(const char *model, struct bench_opts *o) {
    struct sp_model *m;
    if (sp_cli_model_open(&o->set, model, &m) != SP_OK) return sp_cli_fail();
    int rc = 1;
    struct sp_ranks *group = NULL;  // this process as one rank of several (WORLD_SIZE)
    double *load = NULL;            // --expert-load's counts
    int64_t prompt = o->prompt, gen = o->gen, threads = o->threads;
    struct sp_plan_inputs pin = o->pin;
    pin.ctx = prompt + gen;
    pin.parallel = (int)o->seqs;
    pin.batch = o->batch;
    pin.device = o->device;
    pin.n_devices = o->set.n_devices;
    struct sp_plan pl;
    struct sp_model_stats ms;
    sp_model_stats(m, &ms);
    if (o->set.record_routing[0]) {
        sp_errorf(SP_ERR_ARG, "--record-routing: bench's prompts are random tokens; record with run or serve");
        goto done;
    }
    if (sp_cli_routing(&o->set, m, &load, NULL) != SP_OK) goto done;
    pin.expert_load = load;
    pin.expert_load_from = o->set.expert_load;
    if (sp_plan_make(m, &pin, &pl) != SP_OK) goto done;
    struct sp_ctx_params cp = {.n_ctx = prompt + gen, .n_seq = (int)o->seqs, .max_batch = o->batch, .kv_type = pin.kv_type,
                               .device = o->device, .n_threads = (int)threads, .time_steps = o->steps,
                               .float_activations = o->set.precision == SP_PRECISION_EXACT,
                               .device_experts = pl.gpu_expert_cache, .cpu_experts = !o->set.no_cpu_experts,
                               .no_prefetch = o->set.no_prefetch, .graphs = o->set.cuda_graphs,
                               .no_overlap = o->set.no_cuda_overlap, .n_ranks = o->set.n_devices,
                               .gpus = o->set.n_devices ? o->set.devices : NULL};
    struct sp_expert_store_params ep = sp_cli_expert_params(&o->set);
    size_t expert_cache = pl.host_cache;
    cp.expert_load = load;
    if (sp_cli_join_ranks(&o->set, m, &cp, &group) != SP_OK) goto done;
    /* --cold measures reads from disk inside the run: nothing is brought in before it */
    struct sp_plan_load_params lp = sp_cli_load_params(&o->set);
    double load_s = o->cold ? 0.0 : sp_plan_load(&pl, m, &lp);
    int nth = threads ? (int)threads : sp_physical_cores();
    bool ram_measured = false;
    double ram_gbs = 0;
    struct run_stats *stats = sp_calloc((size_t)o->repeat, sizeof *stats, SP_MEM_MISC);
    if (!stats) {
        sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto done;
    }
    for (int64_t i = 0; i < o->warmup; i++) {
        struct result r;
        if (run_once(m, &cp, expert_cache, &ep, prompt, gen < 2 ? gen : 2, o->cold, &r) != SP_OK) {
            sp_free(stats);
            goto done;
        }
    }
    if (o->warmup) fprintf(stderr, "bench: %lld warm-up run%s done (not counted)\n", (long long)o->warmup, o->warmup == 1 ? "" : "s");
    for (int64_t i = 0; i < o->repeat; i++) {
        struct result r;
        if (run_once(m, &cp, expert_cache, &ep, prompt, gen, o->cold, &r) != SP_OK) {
            sp_free(stats);
            goto done;
        }
        r.load_s = i == 0 ? load_s : 0.0;
        ram_gbs = machine_gbs(&pl, nth, o->device, &ram_measured);
        stats[i] = report(m, &ms, &pl, expert_cache ? "expert-cache" : "resident", nth, o->device, ram_gbs, ram_measured,
                          o->synthetic, &r);
    }
    if (o->repeat > 1) summarize(stats, o->repeat);
    double last_decode = stats[o->repeat - 1].v[RS_DECODE];
    sp_free(stats);
    if (o->compare && expert_cache) {
        struct result base;
        if (run_once(m, &cp, 0, &ep, prompt, gen, o->cold, &base) != SP_OK) goto done;
        double b = report(m, &ms, &pl, "mmap", nth, o->device, ram_gbs, ram_measured, o->synthetic, &base).v[RS_DECODE];
        printf("{\"bench\":\"ratio\",\"decode_expert_cache_over_mmap\":%.3f}\n", b > 0 ? last_decode / b : 0.0);
    }
    rc = 0;
done:
    if (rc) sp_cli_fail();
    sp_ranks_free(group);
    sp_free(load);
    sp_model_close(m);
    return rc;
}

int sp_cmd_bench(int argc, char **argv) {
    const char *model = NULL;
    struct bench_opts o = {.prompt = 512, .gen = 64, .batch = SP_DEFAULT_BATCH, .repeat = 1, .warmup = 1, .seqs = 1};
    struct synth syn = {0};
    int rc = sp_cli_settings_init(&o.set);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        } else if (sp_cli_settings_arg(argc, argv, &i, &o.set, &rc)) {
            if (rc) return rc;
        } else if (sp_arg_flag(argv[i], "--cold")) {
            o.cold = true;
        } else if (sp_arg_flag(argv[i], "--compare-mmap")) {
            o.compare = true;
        } else if (sp_arg_flag(argv[i], "--steps")) {
            o.steps = true;
        } else if (sp_arg_value(argc, argv, &i, "--model", &v)) {
            if (!(model = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--synthetic", &v)) {
            if (!(syn.config = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--quant", &v)) {
            if (!(syn.quant = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--layers", &v)) {
            if (!v || !sp_arg_int("--layers", v, 1, 100000, &syn.layers)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--out", &v)) {
            if (!(syn.out = v)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--prompt", &v)) {
            if (!v || !sp_arg_int("--prompt", v, 1, 1 << 20, &o.prompt)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--gen", &v)) {
            if (!v || !sp_arg_int("--gen", v, 1, 1 << 20, &o.gen)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--seqs", &v)) {
            if (!v || !sp_arg_int("--seqs", v, 1, 256, &o.seqs)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--batch", &v)) {
            if (!v || !sp_arg_int("--batch", v, 1, 1 << 16, &o.batch)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--repeat", &v)) {
            if (!v || !sp_arg_int("--repeat", v, 1, REPEAT_MAX, &o.repeat)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--warmup", &v)) {
            if (!v || !sp_arg_int("--warmup", v, 0, REPEAT_MAX, &o.warmup)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--threads", &v)) {
            if (!v || !sp_arg_int("--threads", v, 1, 1024, &o.threads)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--kv-type", &v)) {
            if (!v || !sp_kv_type_from_name(v, &o.pin.kv_type)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--mem-limit", &v)) {
            if (!v || !sp_arg_size("--mem-limit", v, &o.pin.mem_limit)) return SP_EXIT_USAGE;
        } else if (sp_arg_value(argc, argv, &i, "--expert-cache", &v)) {
            if (!v || !sp_arg_size("--expert-cache", v, &o.pin.expert_cache)) return SP_EXIT_USAGE;
            o.pin.expert_cache_set = true;
        } else if (sp_arg_value(argc, argv, &i, "--gpu-mem-limit", &v)) {
            if (!v || !sp_arg_size("--gpu-mem-limit", v, &o.pin.gpu_mem_limit)) return SP_EXIT_USAGE;
        } else {
            return sp_arg_unknown("bench", argv[i]);
        }
    }
    if ((rc = sp_cli_kernels_use(&o.set)) || (rc = sp_cli_device(&o.set, &o.device))) return rc;
    o.pin.cache_dir = o.set.cache_dir;
    syn.tmp_dir = o.set.tmp_dir;
    if (model && syn.config) {
        fprintf(stderr, "error: bench: --model and --synthetic exclude each other: give one\n");
        return SP_EXIT_USAGE;
    }
    if (!model && !syn.config) {
        fprintf(stderr, "error: bench: give --model MODEL or --synthetic CONFIG.json\n");
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    if (model) {
        const char *only = syn.quant ? "--quant" : syn.layers ? "--layers" : syn.out ? "--out" : NULL;
        if (only) {
            fprintf(stderr, "error: bench: %s applies only to --synthetic, not to --model\n", only);
            return SP_EXIT_USAGE;
        }
        return bench_model(model, &o);
    }
    if (!syn.quant) {
        fprintf(stderr, "error: bench: --synthetic needs --quant (affine4, affine8, mxfp4 or bf16)\n");
        return SP_EXIT_USAGE;
    }
    size_t k = 0, nf = sizeof synth_formats / sizeof synth_formats[0];
    while (k < nf && strcmp(synth_formats[k].name, syn.quant) != 0) k++;
    if (k == nf) {
        fprintf(stderr, "error: bench: unknown --quant %s (affine4, affine8, mxfp4 or bf16)\n", syn.quant);
        return SP_EXIT_USAGE;
    }
    syn.type = synth_formats[k].type;
    if (synth_build(&syn) != SP_OK) {
        rc = sp_cli_fail();
    } else {
        o.synthetic = syn.config;
        rc = bench_model(syn.dir, &o);
    }
    if (!synth_cleanup(&syn) && !rc) rc = 1;
    return rc;
}
