/*
 * cmd_serve.c - `sparrow serve`: the OpenAI-compatible server. Listens
 * first (/health says 503 while loading), loads the model, prints what it
 * holds and one JSON line {"event":"ready", ...}, then serves until SIGINT
 * or SIGTERM, and shuts down gracefully: no new requests, those in flight
 * finish within --shutdown-timeout, the rest end with an error, exit 0.
 * If the model's files change under it, requests in flight fail with a
 * message naming the file and the server stops the same way, exit 1.
 */
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>
#include <stdio.h>
#include <string.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/file.h"
#include "core/json.h"
#include "core/log.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"
#include "model/forward.h"
#include "model/inspect.h"
#include "runtime/engine.h"
#include "runtime/model_text.h"
#include "runtime/plan.h"
#include "server/server.h"
#include "template/chat.h"
#include "tokenizer/tokenizer.h"

#define MAX_API_KEYS 64
#define SP_STR_(x) #x
#define SP_STR(x) SP_STR_(x)

static const char usage[] =
    "usage: sparrow serve --model MODEL [options]\n"
    "  --host ADDR            address to listen on (default 127.0.0.1; 0.0.0.0 or :: for all)\n"
    "  --port N               port (default 5413)\n"
    "  --parallel N           sequences decoded together (default 1)\n"
    "  --ctx N                context per sequence (default: the model's, at most 4096)\n"
    "  --batch N              tokens per forward step, prefill chunks included (default " SP_DEFAULT_BATCH_TEXT ")\n"
    "  --queue N              requests that may wait for a free sequence (default 64)\n"
    "  --api-key KEY          require Authorization: Bearer KEY; give it again to accept more keys\n"
    "                         (each key has a prompt cache of its own)\n"
    "  --cors ORIGIN          send Access-Control-Allow-Origin: ORIGIN\n"
    "  --max-tokens N         tokens generated for a request that gives no max_tokens (default: up to the end of its context)\n"
    "  --temp T --top-p P --top-k K --min-p P   default sampling (0.8, 0.95, 40, 0.05)\n"
    "  --threads N            worker threads (default: physical cores)\n"
    "  --kv-type f16|bf16|f32 KV cache storage (default f16)\n"
    "  --model-id NAME        the model name clients see (default: the folder name)\n"
    "  --max-body SIZE        largest request body (default 8M)\n"
    "  --shutdown-timeout S   on SIGTERM / SIGINT, seconds that requests in flight may take to finish (default 5)\n"
    "  --max-connections N    open connections; more are closed at once (default 1024)\n"
    "  --max-connections-per-ip N   open connections from one address (default 128; 0: no limit)\n"
    "  --request-timeout S    seconds a connection has to send a whole request, then it is closed (default 10)\n"
    "  --max-tokenizing N     prompts rendered and tokenized at once; more wait their turn (default 4)\n"
    "  --mem-limit SIZE       memory to plan for (default: cgroup limit / MemAvailable)\n"
    "  --expert-cache SIZE    bytes for routed experts when they do not all fit (see sparrow plan)\n"
    "  --gpu-mem-limit SIZE   device memory to plan for with --device cuda (default: what is free on it)\n"
    SP_CLI_SETTINGS_USAGE;

/* The engine's plan (memory, caches) made and its weights loaded; ep's
 * caches, devices and routing (sp_cli_routing; *load owned) as the
 * plan says. */
static enum sp_status plan_engine(const struct sp_settings *set, struct sp_model *m, struct sp_engine_params *ep,
                                  struct sp_plan_inputs *pin, struct sp_plan *plan, double **load) {
    enum sp_status st = sp_cli_routing(set, m, load, &ep->count_routes);
    if (st != SP_OK) return st;
    ep->expert_load = pin->expert_load = *load;
    pin->expert_load_from = set->expert_load;
    sp_engine_params_resolve(ep, m);
    pin->ctx = ep->n_ctx;
    pin->parallel = ep->n_slots;
    pin->batch = ep->batch_tokens;
    pin->kv_type = ep->kv_type;
    pin->device = ep->device;
    pin->n_devices = set->n_devices;
    ep->n_ranks = set->n_devices;
    ep->gpus = set->n_devices ? set->devices : NULL;
    st = sp_plan_make(m, pin, plan);
    if (st != SP_OK) return st;
    ep->expert_cache = plan->host_cache;
    ep->device_experts = plan->gpu_expert_cache;
    ep->cpu_experts = !set->no_cpu_experts;
    struct sp_plan_load_params lp = sp_cli_load_params(set);
    sp_plan_load(plan, m, &lp);
    return SP_OK;
}

/* Where this process is one rank of several (WORLD_SIZE > 1): joined to
 * the others, ep that rank's. */
static enum sp_status join_ranks(const struct sp_settings *set, const struct sp_model *m, struct sp_engine_params *ep) {
    struct sp_ctx_params cp = {.max_batch = ep->batch_tokens, .device = ep->device, .n_ranks = ep->n_ranks,
                               .gpus = ep->gpus, .expert_load = ep->expert_load};
    struct sp_ranks *g;
    enum sp_status st = sp_cli_join_ranks(set, m, &cp, &g);
    if (st != SP_OK || !g) return st;
    ep->group = g;
    ep->rank = cp.rank;
    ep->n_ranks = cp.n_ranks;
    ep->gpus = cp.gpus;
    return SP_OK;
}

/* A rank other than 0 of a server's processes: no HTTP, its share of rank
 * 0's engine until rank 0 stops. */
static int follow_rank(const struct sp_settings *set, const char *model, struct sp_engine_params *ep,
                       struct sp_plan_inputs *pin) {
    struct sp_model *m = NULL;
    struct sp_plan plan;
    double *load = NULL;
    enum sp_status st = sp_cli_model_open(set, model, &m);
    if (st == SP_OK) st = plan_engine(set, m, ep, pin, &plan, &load);
    if (st == SP_OK) st = join_ranks(set, m, ep);
    if (st == SP_OK) {
        sp_log(SP_LOG_INFO, "rank %d of %d: following rank 0's engine", set->rank, set->world_size);
        st = sp_engine_follow(m, ep);
    }
    if (st != SP_OK) sp_cli_fail();
    sp_ranks_free(ep->group);
    sp_free(load);
    sp_model_close(m);
    return st == SP_OK ? 0 : 1;
}

int sp_cmd_serve(int argc, char **argv) {
    struct sp_server_opts so = {.host = "127.0.0.1", .port = 5413, .defaults = sp_sampler_defaults(),
                                .max_connections = 1024, .max_connections_per_ip = 128, .request_timeout = 10};
    struct sp_engine_params ep = {.n_slots = 1};
    const char *model = NULL;
    const char *keys[MAX_API_KEYS];
    int n_keys = 0;
    double shutdown_timeout = 5;
    struct sp_plan_inputs pin = {0};
    struct sp_settings set;
    int rc = sp_cli_settings_init(&set);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int64_t n;
        double x;
        uint64_t sz;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return 0;
        }
        if (sp_cli_settings_arg(argc, argv, &i, &set, &rc)) {
            if (rc) return rc;
            continue;
        }
#define VAL(name) sp_arg_value(argc, argv, &i, name, &v)
#define NEED() \
    if (!v) return SP_EXIT_USAGE
        if (VAL("--model")) {
            NEED();
            model = v;
        } else if (VAL("--host")) {
            NEED();
            so.host = v;
        } else if (VAL("--port")) {
            NEED();
            if (!sp_arg_int("--port", v, 0, 65535, &n)) return SP_EXIT_USAGE;
            so.port = (int)n;
        } else if (VAL("--parallel")) {
            NEED();
            if (!sp_arg_int("--parallel", v, 1, 1024, &n)) return SP_EXIT_USAGE;
            ep.n_slots = (int)n;
        } else if (VAL("--ctx")) {
            NEED();
            if (!sp_arg_int("--ctx", v, 16, 1 << 24, &ep.n_ctx)) return SP_EXIT_USAGE;
        } else if (VAL("--batch")) {
            NEED();
            if (!sp_arg_int("--batch", v, 1, 1 << 16, &ep.batch_tokens)) return SP_EXIT_USAGE;
        } else if (VAL("--queue")) {
            NEED();
            if (!sp_arg_int("--queue", v, 1, 1 << 20, &n)) return SP_EXIT_USAGE;
            ep.queue_max = (int)n;
        } else if (VAL("--threads")) {
            NEED();
            if (!sp_arg_int("--threads", v, 1, 1024, &n)) return SP_EXIT_USAGE;
            ep.n_threads = (int)n;
        } else if (VAL("--api-key")) {
            NEED();
            if (!*v || n_keys == MAX_API_KEYS) {
                fprintf(stderr, "error: --api-key: %s\n", *v ? "at most " SP_STR(MAX_API_KEYS) " keys" : "a key cannot be empty");
                return SP_EXIT_USAGE;
            }
            keys[n_keys++] = v;
            so.api_keys = keys;
            so.n_api_keys = n_keys;
        } else if (VAL("--cors")) {
            NEED();
            so.cors = v;
        } else if (VAL("--model-id")) {
            NEED();
            so.model_id = v;
        } else if (VAL("--max-tokens")) {
            NEED();
            if (!sp_arg_int("--max-tokens", v, 1, 1 << 30, &so.default_max_tokens)) return SP_EXIT_USAGE;
        } else if (VAL("--shutdown-timeout")) {
            NEED();
            if (!sp_arg_range("--shutdown-timeout", v, 0, 86400, &shutdown_timeout)) return SP_EXIT_USAGE;
        } else if (VAL("--max-connections")) {
            NEED();
            if (!sp_arg_int("--max-connections", v, 1, 1 << 20, &n)) return SP_EXIT_USAGE;
            so.max_connections = (int)n;
        } else if (VAL("--max-connections-per-ip")) {
            NEED();
            if (!sp_arg_int("--max-connections-per-ip", v, 0, 1 << 20, &n)) return SP_EXIT_USAGE;
            so.max_connections_per_ip = (int)n;
        } else if (VAL("--max-tokenizing")) {
            NEED();
            if (!sp_arg_int("--max-tokenizing", v, 1, 1024, &n)) return SP_EXIT_USAGE;
            so.max_tokenizing = (int)n;
        } else if (VAL("--request-timeout")) {
            NEED();
            if (!sp_arg_range("--request-timeout", v, 0.1, 86400, &so.request_timeout)) return SP_EXIT_USAGE;
        } else if (VAL("--max-body")) {
            NEED();
            if (!sp_arg_size("--max-body", v, &sz)) return SP_EXIT_USAGE;
            so.max_body = (size_t)sz;
        } else if (VAL("--mem-limit")) {
            NEED();
            if (!sp_arg_size("--mem-limit", v, &pin.mem_limit)) return SP_EXIT_USAGE;
        } else if (VAL("--expert-cache")) {
            NEED();
            if (!sp_arg_size("--expert-cache", v, &pin.expert_cache)) return SP_EXIT_USAGE;
            pin.expert_cache_set = true;
        } else if (VAL("--gpu-mem-limit")) {
            if (!sp_arg_size("--gpu-mem-limit", v, &pin.gpu_mem_limit)) return SP_EXIT_USAGE;
        } else if (VAL("--temp")) {
            NEED();
            if (!sp_arg_num("--temp", v, &x)) return SP_EXIT_USAGE;
            so.defaults.temp = (float)x;
        } else if (VAL("--top-p")) {
            NEED();
            if (!sp_arg_num("--top-p", v, &x)) return SP_EXIT_USAGE;
            so.defaults.top_p = (float)x;
        } else if (VAL("--min-p")) {
            NEED();
            if (!sp_arg_num("--min-p", v, &x)) return SP_EXIT_USAGE;
            so.defaults.min_p = (float)x;
        } else if (VAL("--top-k")) {
            NEED();
            if (!sp_arg_int("--top-k", v, 0, 1 << 30, &n)) return SP_EXIT_USAGE;
            so.defaults.top_k = (int32_t)n;
        } else if (VAL("--kv-type")) {
            NEED();
            if (!sp_kv_type_from_name(v, &ep.kv_type)) {
                fprintf(stderr, "error: --kv-type must be f16, bf16 or f32\n");
                return SP_EXIT_USAGE;
            }
        } else {
            return sp_arg_unknown("serve", argv[i]);
        }
#undef VAL
#undef NEED
    }
    if (!model) {
        fputs(usage, stderr);
        return SP_EXIT_USAGE;
    }
    if ((rc = sp_cli_kernels_use(&set)) || (rc = sp_cli_device(&set, &ep.device))) return rc;
    ep.expert_params = sp_cli_expert_params(&set);
    ep.float_activations = set.precision == SP_PRECISION_EXACT;
    ep.graphs = set.cuda_graphs;
    ep.no_overlap = set.no_cuda_overlap;
    pin.cache_dir = set.cache_dir;
    if (set.world_size > 1 && set.rank > 0) return follow_rank(&set, model, &ep, &pin);
    /* Signals are taken synchronously by the main thread; every thread
     * started from here on inherits the blocked mask. */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGINT);
    sigaddset(&sigs, SIGTERM);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);
    /* every connection is a descriptor: allow as many as the hard limit does */
    struct rlimit nofile;
    if (getrlimit(RLIMIT_NOFILE, &nofile) == 0 && nofile.rlim_cur < nofile.rlim_max) {
        nofile.rlim_cur = nofile.rlim_max;
        setrlimit(RLIMIT_NOFILE, &nofile);
    }

    /* a model file that shrinks under its map faults reads with SIGBUS:
     * the guard turns that into a failed engine and a clean stop */
    if (sp_map_guard_install() != SP_OK) return sp_cli_fail();
    struct sp_model *m = NULL;
    struct sp_tokenizer *tok = NULL;
    struct sp_chat_template *ct = NULL;
    struct sp_engine *eng = NULL;
    struct sp_server *srv = NULL;
    double *load = NULL;  // --expert-load's counts
    char id_buf[256];
    rc = 1;
    if (!so.model_id) {
        const char *base = strrchr(model, '/');
        snprintf(id_buf, sizeof id_buf, "%s", base && base[1] ? base + 1 : model);
        so.model_id = id_buf;
    }
    if (sp_server_start(&so, &srv) != SP_OK) goto fail;
    sp_log(SP_LOG_INFO, "listening on %s:%d; loading %s", so.host, sp_server_port(srv), model);
    if (sp_cli_model_open(&set, model, &m) != SP_OK) goto fail;
    if (sp_model_tokenizer_load(m->files->dir, &tok) != SP_OK) goto fail;
    if (sp_model_chat_template_load(m->files->dir, NULL, &ct) != SP_OK) {
        sp_log(SP_LOG_WARN, "no chat template (%s): /v1/chat/completions will answer 400", sp_error_msg());
        ct = NULL;
    }
    struct sp_plan plan;
    if (plan_engine(&set, m, &ep, &pin, &plan, &load) != SP_OK) goto fail;
    struct sp_buf pl = SP_BUF_INIT;
    sp_plan_report(&plan, false, &pl);
    fputs(pl.data ? pl.data : "", stderr);
    sp_buf_free(&pl);
    if (join_ranks(&set, m, &ep) != SP_OK) goto fail;
    struct sp_model_stats stats;
    sp_model_stats(m, &stats);
    struct sp_buf rep = SP_BUF_INIT;
    sp_model_report(m, &stats, false, &rep);
    fputs(rep.data ? rep.data : "", stderr);
    sp_buf_free(&rep);
    if (sp_engine_create(m, tok, &ep, &eng) != SP_OK) goto fail;
    const struct sp_engine_params *p = sp_engine_params(eng);
    sp_server_set_plan(srv, &plan, sp_device_name(p->device), sp_kernels()->name);
    sp_server_attach(srv, eng, tok, ct);

    struct sp_buf ready = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &ready, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "event");
    sp_jw_str(&w, "ready");
    sp_jw_key(&w, "model");
    sp_jw_str(&w, m->files->dir);
    sp_jw_key(&w, "model_id");
    sp_jw_str(&w, so.model_id);
    sp_jw_key(&w, "architecture");
    sp_jw_str(&w, m->arch.model_type);
    sp_jw_key(&w, "host");
    sp_jw_str(&w, so.host);
    sp_jw_key(&w, "port");
    sp_jw_int(&w, sp_server_port(srv));
    sp_jw_key(&w, "ctx");
    sp_jw_int(&w, p->n_ctx);
    sp_jw_key(&w, "slots");
    sp_jw_int(&w, p->n_slots);
    sp_jw_key(&w, "threads");
    sp_jw_int(&w, p->n_threads);
    sp_jw_key(&w, "kv_type");
    sp_jw_str(&w, sp_kv_type_name(p->kv_type));
    sp_jw_key(&w, "kernels");
    sp_jw_str(&w, sp_kernels()->name);
    sp_jw_key(&w, "plan");
    sp_plan_write_json(&plan, &w);
    sp_jw_key(&w, "memory");
    sp_jw_obj(&w);
    sp_jw_key(&w, "model_file_bytes");
    sp_jw_uint(&w, m->files->total_bytes);
    sp_jw_key(&w, "bytes_per_token");
    sp_jw_uint(&w, stats.active_bytes);
    struct sp_engine_stats es;
    sp_engine_stats(eng, &es);
    sp_jw_key(&w, "kv_cache_bytes");
    sp_jw_uint(&w, es.kv_bytes);
    for (int i = 0; i < SP_MEM_CLASS_COUNT; i++) {
        char key[64];
        snprintf(key, sizeof key, "allocated_%s_bytes", sp_mem_class_name((enum sp_mem_class)i));
        sp_jw_key(&w, key);
        sp_jw_uint(&w, sp_mem_used((enum sp_mem_class)i));
    }
    sp_jw_end(&w);
    sp_jw_end(&w);
    printf("%s\n", ready.data);
    fflush(stdout);
    sp_buf_free(&ready);

    /* until a signal, or the model's files change under the engine (then
     * the requests in flight have failed already, and a restart is what
     * loads the files again) */
    int sig = 0;
    char why[512];
    const struct timespec watch = {0, 250 * 1000 * 1000};
    bool failed = false;
    while ((sig = sigtimedwait(&sigs, NULL, &watch)) <= 0)
        if ((failed = sp_engine_failed(eng, why, sizeof why))) break;
    /* graceful: no new work; what runs may finish until the timeout or a
     * second signal; then sp_server_stop ends the rest with an error */
    sp_server_drain(srv);
    int busy = sp_server_in_flight(srv);
    sp_log(SP_LOG_INFO, "%s: shutting down; %d request%s in flight, waiting up to %g s",
           failed ? "model files changed" : strsignal(sig), busy, busy == 1 ? "" : "s", shutdown_timeout);
    double until = sp_now_s() + shutdown_timeout;
    const struct timespec tick = {0, 50 * 1000 * 1000};
    while ((busy = sp_server_in_flight(srv)) > 0 && sp_now_s() < until) {
        if (sigtimedwait(&sigs, NULL, &tick) > 0) {
            sp_log(SP_LOG_INFO, "second signal: not waiting any longer");
            break;
        }
    }
    if (busy > 0) sp_log(SP_LOG_INFO, "ending %d request%s still in flight", busy, busy == 1 ? "" : "s");
    rc = 0;
    if (failed) {
        sp_errorf(SP_ERR_STATE, "%s", why);
        rc = 1;
    }
fail:
    if (rc) sp_cli_fail();
    sp_server_stop(srv);
    sp_engine_stop(eng);
    if (eng && sp_cli_routing_save(&set, m, sp_engine_route_counts(eng)) != SP_OK) {
        sp_cli_fail();
        rc = 1;
    }
    sp_engine_free(eng);  // the other ranks' follow ends with it
    sp_free(load);
    sp_ranks_free(ep.group);
    sp_chat_template_free(ct);
    sp_tokenizer_free(tok);
    sp_model_close(m);
    return rc;
}
