/*
 * alloc.h - the accounting allocator: every heap byte sparrow owns goes
 * through here, tagged with a class, so memory figures in logs and /metrics
 * are measured rather than estimated.
 *
 *     float *x = sp_malloc(n * sizeof *x, SP_MEM_ACT);
 *     ...
 *     sp_free(x);
 *     size_t now = sp_mem_used(SP_MEM_ACT), peak = sp_mem_peak(SP_MEM_ACT);
 *
 * Pointers from sp_malloc/sp_calloc/sp_realloc/sp_strdup are owned by the
 * caller and released with sp_free; those from sp_malloc_aligned with
 * sp_free_aligned. Both frees accept NULL.
 */
#ifndef SP_CORE_ALLOC_H
#define SP_CORE_ALLOC_H

#include <stddef.h>

#define SP_MEM_CLASS_LIST(X)                                                   \
    X(MISC, "misc")                                                            \
    X(JSON, "json")                                                            \
    X(MODEL, "model_tables")                                                   \
    X(WEIGHTS, "weights")                                                      \
    X(KV, "kv_cache")                                                          \
    X(ACT, "activations")                                                      \
    X(EXPERT_CACHE, "expert_cache")                                            \
    X(TOKENIZER, "tokenizer")                                                  \
    X(SERVER, "server")

enum sp_mem_class {
#define SP_X(name, text) SP_MEM_##name,
    SP_MEM_CLASS_LIST(SP_X)
#undef SP_X
        SP_MEM_CLASS_COUNT
};

void *sp_malloc(size_t n, enum sp_mem_class cls);
void *sp_calloc(size_t count, size_t size, enum sp_mem_class cls);
/* Keeps the class the block was allocated with. */
void *sp_realloc(void *p, size_t n);
void sp_free(void *p);
char *sp_strdup(const char *s, enum sp_mem_class cls);
char *sp_strndup(const char *s, size_t n, enum sp_mem_class cls);

/* Memory aligned to `align` (a power of two >= 16), e.g. 64 for SIMD rows. */
void *sp_malloc_aligned(size_t n, size_t align, enum sp_mem_class cls);
void sp_free_aligned(void *p);
/* For a large buffer read end to end (KV cache, expert cache, bandwidth
 * probes): aligned to 2 MiB and advised for transparent huge pages, so a
 * stream through it takes a TLB miss per 2 MiB instead of per 4 KiB where
 * the kernel allows them (THP "always" or "madvise"). Freed with
 * sp_free_aligned; below 2 MiB it is sp_malloc_aligned(n, 64). */
void *sp_malloc_huge(size_t n, enum sp_mem_class cls);

/* Counts n bytes (negative: releases them) that sparrow holds outside this
 * allocator, such as anonymous maps, in a class. */
void sp_mem_account(enum sp_mem_class cls, ptrdiff_t n);

size_t sp_mem_used(enum sp_mem_class cls);
size_t sp_mem_peak(enum sp_mem_class cls);
size_t sp_mem_used_total(void);
size_t sp_mem_peak_total(void);
/* "activations", ...: the name /metrics and logs use for a class. */
const char *sp_mem_class_name(enum sp_mem_class cls);

/* Routes cJSON's allocations through the accountant (class SP_MEM_JSON). */
void sp_mem_hook_cjson(void);

#endif
