/*
 * cmd_run.c - `sparrow run`: prefill a prompt (token ids, text, or a chat
 * message through the model's template), then generate, streaming text as
 * it comes; prints prefill and decode speed at the end.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/settings_args.h"
#include "core/alloc.h"
#include "core/clock.h"
#include "core/file.h"
#include "core/json.h"
#include "backend/cpu/kernels.h"
#include "runtime/experts.h"
#include "model/forward.h"
#include "runtime/engine.h"
#include "runtime/model_text.h"
#include "runtime/plan.h"
#include "runtime/sampler.h"
#include "template/chat.h"
#include "tokenizer/detok.h"
#include "tokenizer/tokenizer.h"

static const char usage[] =
    "usage: sparrow run --model MODEL (--tokens IDS | --prompt TEXT | --prompt-file FILE) [options]\n"
    "  --chat                 wrap the prompt as one user message in the model's chat template\n"
    "  --dump-logits FILE     write float32 logits [prompt tokens, vocab] of every prompt position\n"
    "                         (through the KV cache as --kv-type stores it: f32 to compare with float32 references)\n"
    "  --max-tokens N         tokens to generate (default 128; 0 with --dump-logits)\n"
    "  --temp T --top-k K --top-p P --min-p P   sampling (defaults 0.8, 40, 0.95, 0.05; --temp 0 is greedy)\n"
    "  --repeat-penalty R --presence-penalty P --frequency-penalty F   penalties (defaults off; R from 0.01 to 100, 1 is off)\n"
    "  --seed S               sampling seed (default 0)\n"
    "  --stop TEXT            stop when TEXT is generated (repeatable)\n"
    "  --ignore-eos           do not stop at the end-of-sequence token\n"
    "  --threads N            worker threads (default: physical cores)\n"
    "  --ctx N                context length (default: prompt + max tokens)\n"
    "  --batch N              prefill chunk (default " SP_DEFAULT_BATCH_TEXT ")\n"
    "  --kv-type f16|bf16|f32 KV cache storage (default f16)\n"
    "  --mem-limit SIZE       memory to plan for (default: cgroup limit / MemAvailable)\n"
    "  --expert-cache SIZE    routed-expert cache budget (default: from the plan)\n"
    "  --gpu-mem-limit SIZE   device memory to plan for with --device cuda (default: what is free on it)\n"
    SP_CLI_SETTINGS_USAGE;

#define MAX_STOPS 16

struct run_opts {
    const char *model, *tokens, *prompt, *prompt_file, *dump, *stops[MAX_STOPS];
    int n_stops;
    bool chat, ignore_eos;
    int64_t max_tokens, ctx, batch, threads;
    struct sp_sampler_params sp;
    enum sp_kv_type kv;
    enum sp_device device;
    struct sp_plan_inputs plan;
    struct sp_settings set;
};

static int parse(int argc, char **argv, struct run_opts *o) {
    o->sp = sp_sampler_defaults();
    o->max_tokens = -1;
    int rc = sp_cli_settings_init(&o->set);
    if (rc) return rc;
    for (int i = 1; i < argc; i++) {
        const char *v = NULL;
        int64_t n;
        double x;
#define VAL(name) (sp_arg_value(argc, argv, &i, name, &v) && (v || (exit_code = SP_EXIT_USAGE, 0)))
        int exit_code = 0;
        if (sp_arg_flag(argv[i], "--help") || sp_arg_flag(argv[i], "-h")) {
            fputs(usage, stdout);
            return -1;
        } else if (sp_cli_settings_arg(argc, argv, &i, &o->set, &rc)) {
            if (rc) return rc;
        } else if (sp_arg_flag(argv[i], "--chat")) {
            o->chat = true;
        } else if (sp_arg_flag(argv[i], "--ignore-eos")) {
            o->ignore_eos = true;
        } else if (VAL("--model")) {
            o->model = v;
        } else if (VAL("--tokens")) {
            o->tokens = v;
        } else if (VAL("--prompt")) {
            o->prompt = v;
        } else if (VAL("--prompt-file")) {
            o->prompt_file = v;
        } else if (VAL("--dump-logits")) {
            o->dump = v;
        } else if (VAL("--stop")) {
            if (o->n_stops == MAX_STOPS) {
                fprintf(stderr, "error: at most %d --stop strings\n", MAX_STOPS);
                return SP_EXIT_USAGE;
            }
            if (*v) o->stops[o->n_stops++] = v;
        } else if (VAL("--max-tokens")) {
            if (!sp_arg_int("--max-tokens", v, 0, 1 << 30, &o->max_tokens)) return SP_EXIT_USAGE;
        } else if (VAL("--ctx")) {
            if (!sp_arg_int("--ctx", v, 1, 1 << 30, &o->ctx)) return SP_EXIT_USAGE;
        } else if (VAL("--batch")) {
            if (!sp_arg_int("--batch", v, 1, 1 << 20, &o->batch)) return SP_EXIT_USAGE;
        } else if (VAL("--threads")) {
            if (!sp_arg_int("--threads", v, 1, 1024, &o->threads)) return SP_EXIT_USAGE;
        } else if (VAL("--seed")) {
            if (!sp_arg_int("--seed", v, 0, INT64_MAX, &n)) return SP_EXIT_USAGE;
            o->sp.seed = (uint64_t)n;
        } else if (VAL("--top-k")) {
            if (!sp_arg_int("--top-k", v, 0, 1 << 30, &n)) return SP_EXIT_USAGE;
            o->sp.top_k = (int32_t)n;
        } else if (VAL("--temp")) {
            if (!sp_arg_num("--temp", v, &x)) return SP_EXIT_USAGE;
            o->sp.temp = (float)x;
        } else if (VAL("--top-p")) {
            if (!sp_arg_num("--top-p", v, &x)) return SP_EXIT_USAGE;
            o->sp.top_p = (float)x;
        } else if (VAL("--min-p")) {
            if (!sp_arg_num("--min-p", v, &x)) return SP_EXIT_USAGE;
            o->sp.min_p = (float)x;
        } else if (VAL("--repeat-penalty")) {
            /* the server's repetition_penalty range: 0 would divide logits by zero */
            if (!sp_arg_range("--repeat-penalty", v, 0.01, 100, &x)) return SP_EXIT_USAGE;
            o->sp.repeat_penalty = (float)x;
        } else if (VAL("--presence-penalty")) {
            if (!sp_arg_num("--presence-penalty", v, &x)) return SP_EXIT_USAGE;
            o->sp.presence_penalty = (float)x;
        } else if (VAL("--frequency-penalty")) {
            if (!sp_arg_num("--frequency-penalty", v, &x)) return SP_EXIT_USAGE;
            o->sp.frequency_penalty = (float)x;
        } else if (VAL("--mem-limit")) {
            if (!sp_arg_size("--mem-limit", v, &o->plan.mem_limit)) return SP_EXIT_USAGE;
        } else if (VAL("--gpu-mem-limit")) {
            if (!sp_arg_size("--gpu-mem-limit", v, &o->plan.gpu_mem_limit)) return SP_EXIT_USAGE;
        } else if (VAL("--expert-cache")) {
            if (!sp_arg_size("--expert-cache", v, &o->plan.expert_cache)) return SP_EXIT_USAGE;
            o->plan.expert_cache_set = true;
        } else if (VAL("--kv-type")) {
            if (!sp_kv_type_from_name(v, &o->kv)) {
                fprintf(stderr, "error: --kv-type must be f16, bf16 or f32\n");
                return SP_EXIT_USAGE;
            }
        } else if (exit_code) {
            return exit_code;
        } else {
            return sp_arg_unknown("run", argv[i]);
        }
#undef VAL
    }
    int sources = !!o->tokens + !!o->prompt + !!o->prompt_file;
    if (!o->model || sources != 1) {
        fputs(sources > 1 ? "error: give one of --tokens, --prompt, --prompt-file\n" : usage, stderr);
        return SP_EXIT_USAGE;
    }
    if (o->max_tokens < 0) o->max_tokens = o->dump ? 0 : 128;
    o->plan.cache_dir = o->set.cache_dir;
    if ((rc = sp_cli_kernels_use(&o->set))) return rc;
    return sp_cli_device(&o->set, &o->device);
}

static enum sp_status parse_ids(const char *s, struct sp_ids *ids) {
    while (*s) {
        while (*s == ' ' || *s == ',' || *s == '\n' || *s == '\t') s++;
        if (!*s) break;
        char *end;
        long long v = strtoll(s, &end, 10);
        if (end == s || v < 0 || v > INT32_MAX) return sp_errorf(SP_ERR_ARG, "--tokens: \"%.20s\" is not a token id", s);
        enum sp_status st = sp_ids_push(ids, (int32_t)v);
        if (st != SP_OK) return st;
        s = end;
    }
    if (!ids->n) return sp_errorf(SP_ERR_ARG, "--tokens: no token ids");
    return SP_OK;
}

/* Prompt text (from --prompt or --prompt-file), wrapped in the chat template
 * with --chat, encoded with special tokens recognised in template output. */
static enum sp_status encode_prompt(const struct run_opts *o, const char *dir, const struct sp_tokenizer *tok,
                                    struct sp_ids *ids) {
    char *text = NULL, *rendered = NULL;
    size_t len;
    enum sp_status st;
    if (o->prompt_file) {
        if ((st = sp_read_file(o->prompt_file, (size_t)1 << 30, &text, &len)) != SP_OK) return st;
    } else {
        text = sp_strdup(o->prompt, SP_MEM_MISC);
        if (!text) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        len = strlen(text);
    }
    unsigned flags = 0;
    if (o->chat) {
        struct sp_chat_template *ct;
        st = sp_model_chat_template_load(dir, NULL, &ct);
        if (st == SP_OK) {
            cJSON *msgs = cJSON_CreateArray(), *msg = cJSON_CreateObject();
            cJSON_AddStringToObject(msg, "role", "user");
            cJSON_AddStringToObject(msg, "content", text);
            cJSON_AddItemToArray(msgs, msg);
            struct sp_chat_request req = {.messages = msgs, .add_generation_prompt = true};
            st = sp_chat_render(ct, &req, &rendered, &len);
            cJSON_Delete(msgs);
            sp_chat_template_free(ct);
        }
        if (st != SP_OK) goto done;
        flags = SP_TOK_PARSE_SPECIAL;
    } else {
        flags = SP_TOK_ADD_SPECIAL;
    }
    st = sp_tokenizer_encode(tok, rendered ? rendered : text, len, flags, ids);
    if (st == SP_OK && !ids->n) st = sp_errorf(SP_ERR_ARG, "the prompt encodes to no tokens");
done:
    sp_free(text);
    sp_free(rendered);
    return st;
}

/* Writes text, holding back any tail that could start a stop string.
 * Returns true when a stop string was found (text before it is written). */
static bool emit(struct sp_buf *gen, size_t *sent, const struct run_opts *o, bool final) {
    size_t upto = gen->len;
    bool stop = false;
    for (int s = 0; s < o->n_stops; s++) {
        const char *hit = memmem(gen->data, gen->len, o->stops[s], strlen(o->stops[s]));
        if (hit && (size_t)(hit - gen->data) < upto) {
            upto = (size_t)(hit - gen->data);
            stop = true;
        }
    }
    if (!stop && !final) {
        for (int s = 0; s < o->n_stops; s++) {
            size_t sl = strlen(o->stops[s]);
            for (size_t k = sl - 1; k > 0; k--) {
                if (k <= gen->len && memcmp(gen->data + gen->len - k, o->stops[s], k) == 0) {
                    if (gen->len - k < upto) upto = gen->len - k;
                    break;
                }
            }
        }
    }
    if (upto > *sent) {
        fwrite(gen->data + *sent, 1, upto - *sent, stdout);
        fflush(stdout);
        *sent = upto;
    }
    return stop;
}

int sp_cmd_run(int argc, char **argv) {
    struct run_opts o;
    memset(&o, 0, sizeof o);
    int rc = parse(argc, argv, &o);
    if (rc) return rc < 0 ? 0 : rc;

    struct sp_model *m = NULL;
    struct sp_tokenizer *tok = NULL;
    struct sp_ctx *c = NULL;
    struct sp_ranks *group = NULL;  // this process as one rank of several (WORLD_SIZE)
    struct sp_expert_store *store = NULL;  // an expert cache, where the plan keeps one
    double *load = NULL;                   // --expert-load's counts
    struct sp_expert_source source;
    struct sp_sampler *smp = NULL;
    struct sp_detok *dt = NULL;
    struct sp_ids ids = {0};
    float *logits = NULL;
    struct sp_buf gen = SP_BUF_INIT, delta = SP_BUF_INIT;
    FILE *dump = NULL;
    rc = 1;
    if (sp_cli_model_open(&o.set, o.model, &m) != SP_OK) goto fail;
    if (sp_model_has_tokenizer(m->files->dir) && sp_model_tokenizer_load(m->files->dir, &tok) != SP_OK) goto fail;
    if (o.tokens) {
        if (parse_ids(o.tokens, &ids) != SP_OK) goto fail;
    } else {
        if (!tok) {
            sp_errorf(SP_ERR_NOT_FOUND, "%s has no tokenizer.json: give the prompt as --tokens", m->files->dir);
            goto fail;
        }
        if (encode_prompt(&o, m->files->dir, tok, &ids) != SP_OK) goto fail;
    }
    int64_t V = m->arch.vocab, n = ids.n;
    for (int64_t i = 0; i < n; i++)
        if (ids.v[i] >= V) {
            sp_errorf(SP_ERR_ARG, "token %d is outside the model's vocabulary of %lld", ids.v[i], (long long)V);
            goto fail;
        }
    struct sp_ctx_params cp = {.n_ctx = o.ctx ? o.ctx : n + o.max_tokens,
                               .n_seq = 1,
                               .max_batch = o.batch ? o.batch : SP_DEFAULT_BATCH,
                               .kv_type = o.kv,
                               .device = o.device,
                               .n_threads = (int)o.threads,
                               .float_activations = o.set.precision == SP_PRECISION_EXACT,
                               .graphs = o.set.cuda_graphs,
                               .no_overlap = o.set.no_cuda_overlap};
    if (cp.n_ctx > m->arch.max_pos && !o.ctx) cp.n_ctx = m->arch.max_pos;
    if (n + o.max_tokens > cp.n_ctx) {
        sp_errorf(SP_ERR_ARG, "%lld prompt tokens + %lld to generate exceed the context of %lld", (long long)n,
                  (long long)o.max_tokens, (long long)cp.n_ctx);
        goto fail;
    }
    o.plan.ctx = cp.n_ctx;
    o.plan.parallel = 1;
    o.plan.batch = cp.max_batch;
    o.plan.kv_type = cp.kv_type;
    o.plan.device = o.device;
    o.plan.n_devices = o.set.n_devices;
    cp.n_ranks = o.set.n_devices;
    cp.gpus = o.set.n_devices ? o.set.devices : NULL;
    if (sp_cli_routing(&o.set, m, &load, &cp.count_routes) != SP_OK) goto fail;
    cp.expert_load = o.plan.expert_load = load;
    o.plan.expert_load_from = o.set.expert_load;
    struct sp_plan plan;
    if (sp_plan_make(m, &o.plan, &plan) != SP_OK) goto fail;
    if (plan.host_cache) {
        struct sp_expert_store_params ep = sp_cli_expert_params(&o.set);
        if (sp_expert_store_create(m, plan.host_cache, &ep, &store) != SP_OK) goto fail;
        source = sp_expert_store_source(store);
        cp.experts = &source;
        fprintf(stderr, "plan: expert cache of %.1f MiB (%lld experts, %.1f%% of them)\n", (double)plan.expert_cache / 1048576.0,
                (long long)plan.cached_experts, 100.0 * plan.hit_rate);
    }
    cp.device_experts = plan.gpu_expert_cache;
    cp.cpu_experts = !o.set.no_cpu_experts;
    cp.no_prefetch = o.set.no_prefetch;
    if (plan.gpu_expert_cache)
        fprintf(stderr, "plan: %s expert cache of %.1f MiB (%lld experts, %.1f%% of them)\n", sp_device_name(o.device),
                (double)plan.gpu_expert_cache / 1048576.0, (long long)plan.gpu_cached_experts, 100.0 * plan.gpu_hit_rate);
    struct sp_plan_load_params lp = sp_cli_load_params(&o.set);
    sp_plan_load(&plan, m, &lp);
    if (sp_cli_join_ranks(&o.set, m, &cp, &group) != SP_OK || sp_ctx_create(m, &cp, &c) != SP_OK) goto fail;
    int64_t B = sp_ctx_params(c)->max_batch;
    logits = sp_malloc((size_t)(o.dump ? B : 1) * (size_t)V * sizeof(float), SP_MEM_ACT);
    bool *want = sp_malloc((size_t)B * sizeof(bool), SP_MEM_ACT);
    int32_t *pos = sp_malloc((size_t)B * sizeof(int32_t), SP_MEM_ACT), *seq = sp_calloc((size_t)B, sizeof(int32_t), SP_MEM_ACT);
    if (!logits || !want || !pos || !seq) {
        sp_free(want), sp_free(pos), sp_free(seq);
        sp_errorf(SP_ERR_NOMEM, "out of memory");
        goto fail;
    }
    if (o.dump && !(dump = fopen(o.dump, "wb"))) {
        sp_free(want), sp_free(pos), sp_free(seq);
        sp_errorf(SP_ERR_IO, "%s: cannot write", o.dump);
        goto fail;
    }
    double t0 = sp_now_s();
    enum sp_status st = SP_OK;
    for (int64_t s = 0; s < n && st == SP_OK; s += B) {
        int64_t k = n - s < B ? n - s : B;
        for (int64_t i = 0; i < k; i++) {
            pos[i] = (int32_t)(s + i);
            want[i] = o.dump || s + i == n - 1;
        }
        struct sp_batch b = {.n = k, .tokens = ids.v + s, .pos = pos, .seq = seq, .want_logits = want};
        st = sp_ctx_forward(c, &b, logits);
        if (st == SP_OK && dump && fwrite(logits, sizeof(float), (size_t)(k * V), dump) != (size_t)(k * V))
            st = sp_errorf(SP_ERR_IO, "%s: write failed", o.dump);
        if (st == SP_OK && dump && s + k == n) memmove(logits, logits + (k - 1) * V, (size_t)V * sizeof(float));
    }
    sp_free(want);
    sp_free(pos);
    sp_free(seq);
    if (dump && fclose(dump) != 0 && st == SP_OK) st = sp_errorf(SP_ERR_IO, "%s: write failed", o.dump);
    dump = NULL;
    if (st != SP_OK) goto fail;
    double t1 = sp_now_s();

    int32_t eos[16];
    int n_eos = o.ignore_eos ? 0 : sp_eos_ids(m, tok, eos, 16);
    if (sp_sampler_create(&o.sp, V, &smp) != SP_OK) goto fail;
    for (int64_t i = 0; i < n; i++) sp_sampler_accept(smp, ids.v[i]);
    if (tok && sp_detok_new(tok, SP_TOK_SKIP_SPECIAL, &dt) != SP_OK) goto fail;
    size_t sent = 0;
    int64_t generated = 0;
    const char *why = "length";
    /* each step after the first asks the forward pass for its greedy
     * choice, or for the best logits a top-k draws from, not the logits */
    bool greedy = sp_sampler_greedy(smp);
    int64_t top_k = greedy ? 0 : sp_sampler_top_k_upto(smp, SP_TOP_K_MAX);
    struct sp_cand top[SP_TOP_K_MAX];
    int32_t picked = -1;
    for (int64_t i = 0; i < o.max_tokens; i++) {
        int32_t next = picked >= 0 ? picked : sp_sampler_sample(smp, logits);
        sp_sampler_accept(smp, next);
        generated++;
        bool is_eos = false;
        for (int e = 0; e < n_eos; e++) is_eos |= next == eos[e];
        if (is_eos) {
            why = "eos";
            break;
        }
        if (dt) {
            sp_buf_clear(&delta);
            if (sp_detok_push(dt, next, &delta) != SP_OK) goto fail;
            sp_buf_append(&gen, delta.data, delta.len);
            if (emit(&gen, &sent, &o, false)) {
                why = "stop";
                break;
            }
        } else {
            printf("%s%d", i ? " " : "", next);
            fflush(stdout);
        }
        if (i + 1 == o.max_tokens) break;
        int32_t p = (int32_t)(n + i), sq = 0;
        struct sp_batch b = {.n = 1, .tokens = &next, .pos = &p, .seq = &sq, .argmax = greedy ? &picked : NULL,
                             .top = top_k ? top : NULL, .top_k = top_k};
        if (sp_ctx_forward(c, &b, logits) != SP_OK) goto fail;
        if (top_k) picked = sp_sampler_sample_top(smp, top, top_k);
    }
    if (dt && strcmp(why, "stop") != 0) {
        sp_buf_clear(&delta);
        sp_detok_flush(dt, &delta);
        sp_buf_append(&gen, delta.data, delta.len);
        emit(&gen, &sent, &o, true);
    }
    if (o.max_tokens) putchar('\n');
    double t2 = sp_now_s();
    fprintf(stderr, "prefill: %lld tokens in %.3f s (%.2f tok/s); decode: %lld tokens in %.3f s (%.2f tok/s); "
            "stop: %s; threads %d; kernels %s; kv %s\n", (long long)n, t1 - t0, (double)n / (t1 - t0 > 0 ? t1 - t0 : 1e-9),
            (long long)generated, t2 - t1, generated > 1 ? (double)(generated - 1) / (t2 - t1) : 0.0, why,
            sp_ctx_params(c)->n_threads, sp_kernels()->name, sp_kv_type_name(sp_ctx_params(c)->kv_type));
    struct sp_expert_store_stats es;
    if (store) sp_expert_store_stats(store, &es);
    if (store)
        fprintf(stderr, "experts: %llu hits, %llu misses (%.1f%% hit rate), %.1f MiB read in %.3f s (%.1f MB/s)\n",
                (unsigned long long)es.hits, (unsigned long long)es.misses,
                es.hits + es.misses ? 100.0 * (double)es.hits / (double)(es.hits + es.misses) : 0.0,
                (double)es.bytes_read / 1048576.0, es.read_s, es.read_s > 0 ? (double)es.bytes_read / es.read_s / 1e6 : 0.0);
    if (sp_cli_routing_save(&o.set, m, sp_ctx_route_counts(c)) != SP_OK) goto fail;
    rc = 0;
fail:
    if (rc) sp_cli_fail();
    if (dump) fclose(dump);
    sp_buf_free(&gen);
    sp_buf_free(&delta);
    sp_detok_free(dt);
    sp_sampler_free(smp);
    sp_free(logits);
    sp_ids_free(&ids);
    sp_ctx_free(c);
    sp_ranks_free(group);
    sp_free(load);
    sp_expert_store_free(store);
    sp_tokenizer_free(tok);
    sp_model_close(m);
    return rc;
}
