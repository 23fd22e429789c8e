/* strmap.c - string -> int64 hash map. */
#include "core/strmap.h"

#include <string.h>

uint64_t sp_hash_bytes(const void *p, size_t len) {
    /* FNV-1a with a final avalanche; fast enough for short keys (tensor
     * names, BPE tokens), and never returns 0, the empty-slot mark. */
    const unsigned char *s = p;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < len; i++) {
        h ^= s[i];
        h *= 0x100000001b3ull;
    }
    h ^= h >> 33;
    h *= 0xff51afd7ed558ccdull;
    h ^= h >> 33;
    return h ? h : 1;
}

void sp_strmap_init(struct sp_strmap *m, enum sp_mem_class cls) {
    memset(m, 0, sizeof *m);
    m->cls = cls;
}

void sp_strmap_free(struct sp_strmap *m) {
    if (!m) return;
    sp_free(m->slots);
    sp_free(m->arena);
    sp_strmap_init(m, m->cls);
}

static struct sp_strmap_slot *find(const struct sp_strmap *m, uint64_t h, const char *key, size_t len) {
    size_t mask = m->cap - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
        struct sp_strmap_slot *s = &m->slots[i];
        if (s->hash == 0) return s;
        /* An empty key may sit in a map whose arena was never allocated. */
        if (s->hash == h && s->key_len == len && (len == 0 || memcmp(m->arena + s->key_off, key, len) == 0)) return s;
    }
}

static enum sp_status grow(struct sp_strmap *m) {
    size_t ncap = m->cap ? m->cap * 2 : 64;
    struct sp_strmap_slot *ns = sp_calloc(ncap, sizeof *ns, m->cls);
    if (!ns) return sp_errorf(SP_ERR_NOMEM, "hash map: out of memory growing to %zu slots", ncap);
    struct sp_strmap_slot *old = m->slots;
    size_t ocap = m->cap;
    m->slots = ns;
    m->cap = ncap;
    for (size_t i = 0; i < ocap; i++) {
        if (!old[i].hash) continue;
        size_t j = old[i].hash & (ncap - 1);
        while (ns[j].hash) j = (j + 1) & (ncap - 1);
        ns[j] = old[i];
    }
    sp_free(old);
    return SP_OK;
}

enum sp_status sp_strmap_put(struct sp_strmap *m, const char *key, size_t len, int64_t value) {
    if (len > UINT32_MAX) return sp_errorf(SP_ERR_LIMIT, "hash map: key of %zu bytes", len);
    if ((m->count + 1) * 4 > m->cap * 3) {
        enum sp_status st = grow(m);
        if (st != SP_OK) return st;
    }
    uint64_t h = sp_hash_bytes(key, len);
    struct sp_strmap_slot *s = find(m, h, key, len);
    if (s->hash) {
        s->value = value;
        return SP_OK;
    }
    if (m->arena_len + len > UINT32_MAX) return sp_errorf(SP_ERR_LIMIT, "hash map: keys exceed 4 GiB");
    if (m->arena_len + len > m->arena_cap) {
        size_t ncap = m->arena_cap ? m->arena_cap : 1024;
        while (ncap < m->arena_len + len) ncap *= 2;
        char *na = m->arena ? sp_realloc(m->arena, ncap) : sp_malloc(ncap, m->cls);
        if (!na) return sp_errorf(SP_ERR_NOMEM, "hash map: out of memory for keys");
        m->arena = na;
        m->arena_cap = ncap;
    }
    if (len) memcpy(m->arena + m->arena_len, key, len);
    s->hash = h;
    s->key_off = (uint32_t)m->arena_len;
    s->key_len = (uint32_t)len;
    s->value = value;
    m->arena_len += len;
    m->count++;
    return SP_OK;
}

bool sp_strmap_get(const struct sp_strmap *m, const char *key, size_t len, int64_t *value) {
    if (!m->cap) return false;
    const struct sp_strmap_slot *s = find(m, sp_hash_bytes(key, len), key, len);
    if (!s->hash) return false;
    if (value) *value = s->value;
    return true;
}
