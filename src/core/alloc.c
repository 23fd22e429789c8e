/*
 * alloc.c - accounting allocator. Each block carries a 16-byte header with
 * its size and class; counters are atomics, so any thread may allocate.
 */
#include "core/alloc.h"

#include <cjson/cJSON.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>

#include "core/status.h"

struct header {
    size_t size;
    uint32_t cls;
    uint32_t magic;
};
_Static_assert(sizeof(struct header) == 16, "header keeps 16-byte alignment");

#define MAGIC 0x5350a110u
#define MAGIC_FREED 0xdeadf7eeu

static atomic_size_t used[SP_MEM_CLASS_COUNT];
static atomic_size_t peak[SP_MEM_CLASS_COUNT];
static atomic_size_t used_total, peak_total;

static const char *const class_names[SP_MEM_CLASS_COUNT] = {
#define SP_X(name, text) text,
    SP_MEM_CLASS_LIST(SP_X)
#undef SP_X
};

static void raise_peak(atomic_size_t *p, size_t v) {
    size_t old = atomic_load_explicit(p, memory_order_relaxed);
    while (v > old && !atomic_compare_exchange_weak(p, &old, v)) {
    }
}

static void account_add(enum sp_mem_class cls, size_t n) {
    size_t now = atomic_fetch_add(&used[cls], n) + n;
    raise_peak(&peak[cls], now);
    size_t tot = atomic_fetch_add(&used_total, n) + n;
    raise_peak(&peak_total, tot);
}

static void account_sub(enum sp_mem_class cls, size_t n) {
    atomic_fetch_sub(&used[cls], n);
    atomic_fetch_sub(&used_total, n);
}

static struct header *header_of(void *p) {
    struct header *h = (struct header *)p - 1;
    SP_ASSERT(h->magic == MAGIC);
    return h;
}

void *sp_malloc(size_t n, enum sp_mem_class cls) {
    SP_ASSERT((unsigned)cls < SP_MEM_CLASS_COUNT);
    if (n > SIZE_MAX - sizeof(struct header)) return NULL;
    struct header *h = malloc(sizeof *h + n);
    if (!h) return NULL;
    h->size = n;
    h->cls = (uint32_t)cls;
    h->magic = MAGIC;
    account_add(cls, n);
    return h + 1;
}

void *sp_calloc(size_t count, size_t size, enum sp_mem_class cls) {
    if (size && count > SIZE_MAX / size) return NULL;
    void *p = sp_malloc(count * size, cls);
    if (p) memset(p, 0, count * size);
    return p;
}

void *sp_realloc(void *p, size_t n) {
    if (!p) return sp_malloc(n, SP_MEM_MISC);
    if (n > SIZE_MAX - sizeof(struct header)) return NULL;
    struct header *h = header_of(p);
    size_t old = h->size;
    enum sp_mem_class cls = (enum sp_mem_class)h->cls;
    struct header *nh = realloc(h, sizeof *nh + n);
    if (!nh) return NULL;
    nh->size = n;
    if (n > old)
        account_add(cls, n - old);
    else
        account_sub(cls, old - n);
    return nh + 1;
}

void sp_free(void *p) {
    if (!p) return;
    struct header *h = header_of(p);
    account_sub((enum sp_mem_class)h->cls, h->size);
    h->magic = MAGIC_FREED;
    free(h);
}

char *sp_strndup(const char *s, size_t n, enum sp_mem_class cls) {
    char *d = sp_malloc(n + 1, cls);
    if (!d) return NULL;
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

char *sp_strdup(const char *s, enum sp_mem_class cls) {
    return sp_strndup(s, strlen(s), cls);
}

/* Aligned blocks: [padding][struct aligned_header][user bytes]; the header
 * sits right before the user pointer and records where malloc's block began. */
struct aligned_header {
    void *base;
    size_t size;
    uint32_t cls;
    uint32_t magic;
};

void *sp_malloc_aligned(size_t n, size_t align, enum sp_mem_class cls) {
    SP_ASSERT(align >= 16 && (align & (align - 1)) == 0);
    SP_ASSERT((unsigned)cls < SP_MEM_CLASS_COUNT);
    size_t extra = align + sizeof(struct aligned_header);
    if (n > SIZE_MAX - extra) return NULL;
    void *base = malloc(n + extra);
    if (!base) return NULL;
    uintptr_t u = ((uintptr_t)base + sizeof(struct aligned_header) + align - 1) &
                  ~(uintptr_t)(align - 1);
    struct aligned_header *h = (struct aligned_header *)u - 1;
    h->base = base;
    h->size = n;
    h->cls = (uint32_t)cls;
    h->magic = MAGIC;
    account_add(cls, n);
    return (void *)u;
}

#define HUGE_PAGE ((size_t)2 << 20)

void *sp_malloc_huge(size_t n, enum sp_mem_class cls) {
    if (n < HUGE_PAGE) return sp_malloc_aligned(n, 64, cls);
    void *p = sp_malloc_aligned(n, HUGE_PAGE, cls);
#ifdef MADV_HUGEPAGE
    /* whole 4 KiB pages only: the block may end a few bytes past n */
    if (p) (void)madvise(p, n & ~(size_t)4095, MADV_HUGEPAGE);
#endif
    return p;
}

void sp_free_aligned(void *p) {
    if (!p) return;
    struct aligned_header *h = (struct aligned_header *)p - 1;
    SP_ASSERT(h->magic == MAGIC);
    account_sub((enum sp_mem_class)h->cls, h->size);
    h->magic = MAGIC_FREED;
    free(h->base);
}

void sp_mem_account(enum sp_mem_class cls, ptrdiff_t n) {
    if (n >= 0)
        account_add(cls, (size_t)n);
    else
        account_sub(cls, (size_t)-n);
}

size_t sp_mem_used(enum sp_mem_class cls) { return atomic_load(&used[cls]); }
size_t sp_mem_peak(enum sp_mem_class cls) { return atomic_load(&peak[cls]); }
size_t sp_mem_used_total(void) { return atomic_load(&used_total); }
size_t sp_mem_peak_total(void) { return atomic_load(&peak_total); }

const char *sp_mem_class_name(enum sp_mem_class cls) {
    if ((unsigned)cls >= SP_MEM_CLASS_COUNT) return "unknown";
    return class_names[cls];
}

static void *cjson_malloc(size_t n) { return sp_malloc(n, SP_MEM_JSON); }

void sp_mem_hook_cjson(void) {
    cJSON_Hooks hooks = {.malloc_fn = cjson_malloc, .free_fn = sp_free};
    cJSON_InitHooks(&hooks);
}
