/* fuzz_safetensors.c - libFuzzer target: arbitrary bytes as a safetensors
 * file image. Parsing must succeed or fail cleanly; every accepted tensor
 * lies inside the image. */
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"
#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    struct sp_st_file *f;
    if (sp_st_parse(data, size, "fuzz", &f) != SP_OK) return 0;
    for (int64_t i = 0; i < f->n_tensors; i++) {
        const struct sp_st_tensor *t = &f->tensors[i];
        SP_ASSERT(t->offset + t->nbytes <= size);
        SP_ASSERT(sp_st_find(f, t->name) == t);
        if (t->nbytes) {
            volatile uint8_t last = ((const uint8_t *)t->data)[t->nbytes - 1];
            (void)last;
        }
    }
    sp_st_close(f);
    return 0;
}
