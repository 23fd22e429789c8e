/*
 * strmap.h - a hash map from byte strings to int64 values (open addressing,
 * linear probing, keys copied into the map's own arena).
 *
 *     struct sp_strmap m;
 *     sp_strmap_init(&m, SP_MEM_TOKENIZER);
 *     sp_strmap_put(&m, "hello", 5, 42);
 *     int64_t v;
 *     if (sp_strmap_get(&m, "hello", 5, &v)) ...
 *     sp_strmap_free(&m);
 *
 * Keys may hold any bytes, NUL included. Key pointers returned by
 * sp_strmap_key() are owned by the map and valid until sp_strmap_free().
 */
#ifndef SP_CORE_STRMAP_H
#define SP_CORE_STRMAP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/alloc.h"
#include "core/status.h"

struct sp_strmap_slot {
    uint64_t hash;  // 0 marks an empty slot
    uint32_t key_off;
    uint32_t key_len;
    int64_t value;
};

struct sp_strmap {
    struct sp_strmap_slot *slots;  // (cap)
    size_t cap;                    // power of two
    size_t count;
    char *arena;  // keys, back to back
    size_t arena_len, arena_cap;
    enum sp_mem_class cls;
};

void sp_strmap_init(struct sp_strmap *m, enum sp_mem_class cls);
void sp_strmap_free(struct sp_strmap *m);

/* Inserts or overwrites. Keys longer than 4 GiB are refused (SP_ERR_LIMIT). */
enum sp_status sp_strmap_put(struct sp_strmap *m, const char *key, size_t len, int64_t value);
bool sp_strmap_get(const struct sp_strmap *m, const char *key, size_t len, int64_t *value);
static inline bool sp_strmap_has(const struct sp_strmap *m, const char *key, size_t len) {
    return sp_strmap_get(m, key, len, NULL);
}

uint64_t sp_hash_bytes(const void *p, size_t len);

#endif
