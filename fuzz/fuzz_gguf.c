/* fuzz_gguf.c - libFuzzer target: arbitrary bytes as a GGUF file image.
 * Parsing must succeed or fail cleanly; every accepted tensor lies inside
 * the image and every metadata value can be read back. */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "core/status.h"
#include "format/gguf.h"

static void read_values(const struct sp_gguf_kv *kv) {
    for (int64_t j = 0; j < kv->count; j++) {
        int64_t v;
        volatile size_t sink = 0;
        switch (kv->elem) {
        case SP_GGUF_VTYPE_STRING: {
            struct sp_gguf_str s = sp_gguf_arr_str(kv, j);
            SP_ASSERT(s.data >= (const char *)kv->data && s.data + s.len <= (const char *)kv->data + kv->nbytes);
            if (s.len) sink += (unsigned char)s.data[s.len - 1];
            break;
        }
        case SP_GGUF_VTYPE_FLOAT32:
        case SP_GGUF_VTYPE_FLOAT64: sink += sp_gguf_arr_float(kv, j) > 0; break;
        case SP_GGUF_VTYPE_BOOL: sink += sp_gguf_arr_bool(kv, j); break;
        default: sink += sp_gguf_arr_int(kv, j, &v); break;
        }
        (void)sink;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct sp_gguf_file *f;
    if (sp_gguf_parse(data, size, "fuzz", &f) != SP_OK) return 0;
    for (int64_t i = 0; i < f->n_kvs; i++) {
        SP_ASSERT(sp_gguf_find_kv(f, f->kvs[i].key) == &f->kvs[i]);
        read_values(&f->kvs[i]);
    }
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct sp_gguf_tensor *t = &f->tensors[i];
        SP_ASSERT(t->offset + t->nbytes <= size && t->nbytes > 0);
        SP_ASSERT(t->offset % f->alignment == 0);
        SP_ASSERT(sp_gguf_find(f, t->name) == t);
        volatile uint8_t last = ((const uint8_t *)t->data)[t->nbytes - 1];
        (void)last;
    }
    sp_gguf_close(f);
    return 0;
}
