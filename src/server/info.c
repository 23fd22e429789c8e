/*
 * info.c - GET /v1/sparrow/info (see info.h).
 */
#include "server/info.h"

#include <stdio.h>

#include "core/alloc.h"
#include "core/json.h"

/* The process's resident set (VmRSS) in bytes; 0 where unknown. */
static size_t resident_bytes(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

static void str_or_null(struct sp_jw *w, const char *key, const char *v) {
    sp_jw_key(w, key);
    if (v)
        sp_jw_str(w, v);
    else
        sp_jw_null(w);
}

void sp_info_json(const struct sp_info_src *src, struct sp_buf *out) {
    const struct sp_engine_params *p = sp_engine_params(src->engine);
    struct sp_engine_stats st;
    sp_engine_stats(src->engine, &st);
    struct sp_jw w;
    sp_jw_init(&w, out, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "object");
    sp_jw_str(&w, "sparrow.info");
    sp_jw_key(&w, "model_id");
    sp_jw_str(&w, src->model_id);
    str_or_null(&w, "architecture", src->info->architecture);
    str_or_null(&w, "device", src->device);
    str_or_null(&w, "kernels", src->kernels);
    sp_jw_key(&w, "context_length");
    sp_jw_int(&w, p->n_ctx);
    sp_jw_key(&w, "slots");
    sp_jw_int(&w, p->n_slots);
    sp_jw_key(&w, "threads");
    sp_jw_int(&w, p->n_threads);
    sp_jw_key(&w, "plan");
    if (src->plan)
        sp_plan_write_json(src->plan, &w);
    else
        sp_jw_null(&w);

    sp_jw_key(&w, "memory");
    sp_jw_obj(&w);
    sp_jw_key(&w, "resident_bytes");
    sp_jw_uint(&w, resident_bytes());
    sp_jw_key(&w, "allocated_bytes");
    sp_jw_uint(&w, sp_mem_used_total());
    sp_jw_key(&w, "kv_cache_bytes");
    sp_jw_uint(&w, st.kv_bytes);
    sp_jw_key(&w, "model_file_bytes");
    sp_jw_uint(&w, src->info->file_bytes);
    sp_jw_key(&w, "bytes_per_token");
    sp_jw_uint(&w, src->info->bytes_per_token);
    sp_jw_end(&w);

    sp_jw_key(&w, "model_bytes");
    sp_jw_arr(&w);
    for (int k = 0; k < src->info->n_classes; k++) {
        sp_jw_obj(&w);
        sp_jw_key(&w, "class");
        sp_jw_str(&w, src->info->classes[k].name);
        sp_jw_key(&w, "placement");
        sp_jw_str(&w, src->info->classes[k].placement);
        sp_jw_key(&w, "bytes");
        sp_jw_uint(&w, src->info->classes[k].bytes);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);

    sp_jw_key(&w, "expert_cache");
    if (st.has_experts) {
        const struct sp_expert_store_stats *x = &st.experts;
        sp_jw_obj(&w);
        sp_jw_key(&w, "budget_bytes");
        sp_jw_uint(&w, x->budget);
        sp_jw_key(&w, "cached_bytes");
        sp_jw_uint(&w, x->cached_bytes);
        sp_jw_key(&w, "hits");
        sp_jw_uint(&w, x->hits);
        sp_jw_key(&w, "misses");
        sp_jw_uint(&w, x->misses);
        sp_jw_key(&w, "read_bytes");
        sp_jw_uint(&w, x->bytes_read);
        sp_jw_end(&w);
    } else {
        sp_jw_null(&w);
    }

    sp_jw_key(&w, "gpu_expert_cache");
    if (st.has_device_experts) {
        const struct sp_expert_tier_stats *x = &st.device_experts;
        sp_jw_obj(&w);
        sp_jw_key(&w, "budget_bytes");
        sp_jw_uint(&w, x->budget);
        sp_jw_key(&w, "cached_bytes");
        sp_jw_uint(&w, (uint64_t)x->cached * x->slot_bytes);
        sp_jw_key(&w, "hits");
        sp_jw_uint(&w, x->hits);
        sp_jw_key(&w, "misses");
        sp_jw_uint(&w, x->misses);
        sp_jw_key(&w, "host_to_device_bytes");
        sp_jw_uint(&w, x->bytes_in);
        sp_jw_key(&w, "prefetched");
        sp_jw_uint(&w, x->prefetched);
        sp_jw_key(&w, "prefetch_used");
        sp_jw_uint(&w, x->prefetch_used);
        sp_jw_key(&w, "cpu_computed_experts");
        sp_jw_uint(&w, x->cpu_experts);
        sp_jw_end(&w);
    } else {
        sp_jw_null(&w);
    }

    sp_jw_key(&w, "tokens");
    sp_jw_obj(&w);
    sp_jw_key(&w, "prompt");
    sp_jw_uint(&w, st.prompt_tokens);
    sp_jw_key(&w, "cached");
    sp_jw_uint(&w, st.cached_tokens);
    sp_jw_key(&w, "generated");
    sp_jw_uint(&w, st.generated_tokens);
    sp_jw_end(&w);
    sp_jw_end(&w);
}
