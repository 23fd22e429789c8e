/* dtype.c - the storage dtype table. */
#include "quant/dtype.h"

#include <stdint.h>
#include <string.h>

#include "core/half.h"
#include "core/status.h"

static const struct {
    const char *name;
    size_t size;
} dtypes[SP_DTYPE_COUNT] = {
#define SP_X(e, name, size) {name, size},
    SP_DTYPE_LIST(SP_X)
#undef SP_X
};

const char *sp_dtype_name(enum sp_dtype t) { return (unsigned)t < SP_DTYPE_COUNT ? dtypes[t].name : "?"; }
size_t sp_dtype_size(enum sp_dtype t) { return (unsigned)t < SP_DTYPE_COUNT ? dtypes[t].size : 0; }

bool sp_dtype_from_name(const char *name, enum sp_dtype *out) {
    for (int i = 0; i < SP_DTYPE_COUNT; i++) {
        if (strcmp(name, dtypes[i].name) == 0) {
            *out = (enum sp_dtype)i;
            return true;
        }
    }
    return false;
}

const char *sp_dtype_all_names(void) {
    return
#define SP_X(e, name, size) name " "
        SP_DTYPE_LIST(SP_X)
#undef SP_X
        ;
}

bool sp_dtype_is_float(enum sp_dtype t) { return t == SP_DTYPE_F32 || t == SP_DTYPE_F16 || t == SP_DTYPE_BF16; }

float sp_dtype_load_float(enum sp_dtype t, const void *base, size_t i) {
    const unsigned char *p = base;
    switch (t) {
    case SP_DTYPE_F32: {
        float f;
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    case SP_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return sp_f16_to_f32(h);
    }
    case SP_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, p + 2 * i, 2);
        return sp_bf16_to_f32(h);
    }
    default:
        SP_ASSERT(!"load_float on a non-float dtype");
    }
}

void sp_dtype_store_float(enum sp_dtype t, void *base, size_t i, float v) {
    unsigned char *p = base;
    uint16_t h;
    switch (t) {
    case SP_DTYPE_F32:
        memcpy(p + 4 * i, &v, 4);
        return;
    case SP_DTYPE_F16:
        h = sp_f32_to_f16(v);
        memcpy(p + 2 * i, &h, 2);
        return;
    case SP_DTYPE_BF16:
        h = sp_f32_to_bf16(v);
        memcpy(p + 2 * i, &h, 2);
        return;
    default:
        SP_ASSERT(!"store_float on a non-float dtype");
    }
}
