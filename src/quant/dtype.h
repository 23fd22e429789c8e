/*
 * dtype.h - storage element types, as safetensors names them.
 *
 *     enum sp_dtype t;
 *     if (sp_dtype_from_name("BF16", &t)) size_t sz = sp_dtype_size(t);
 */
#ifndef SP_QUANT_DTYPE_H
#define SP_QUANT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>

/* X(enum suffix, safetensors name, bytes per element) */
#define SP_DTYPE_LIST(X)                                                       \
    X(F64, "F64", 8)                                                           \
    X(F32, "F32", 4)                                                           \
    X(F16, "F16", 2)                                                           \
    X(BF16, "BF16", 2)                                                         \
    X(I64, "I64", 8)                                                           \
    X(I32, "I32", 4)                                                           \
    X(I16, "I16", 2)                                                           \
    X(I8, "I8", 1)                                                             \
    X(U64, "U64", 8)                                                           \
    X(U32, "U32", 4)                                                           \
    X(U16, "U16", 2)                                                           \
    X(U8, "U8", 1)                                                             \
    X(BOOL, "BOOL", 1)                                                         \
    X(F8_E4M3, "F8_E4M3", 1)                                                   \
    X(F8_E5M2, "F8_E5M2", 1)

enum sp_dtype {
#define SP_X(e, name, size) SP_DTYPE_##e,
    SP_DTYPE_LIST(SP_X)
#undef SP_X
        SP_DTYPE_COUNT
};

const char *sp_dtype_name(enum sp_dtype t);
size_t sp_dtype_size(enum sp_dtype t);
/* Case-sensitive, as the safetensors format spells them. */
bool sp_dtype_from_name(const char *name, enum sp_dtype *out);
/* A comma-separated list of every name, for error messages. */
const char *sp_dtype_all_names(void);
/* F32, F16 and BF16: the types weights are computed on directly. */
bool sp_dtype_is_float(enum sp_dtype t);

/* Reads element i of a F32/F16/BF16 array as float. */
float sp_dtype_load_float(enum sp_dtype t, const void *base, size_t i);
/* Stores v as element i of a F32/F16/BF16 array (round to nearest even). */
void sp_dtype_store_float(enum sp_dtype t, void *base, size_t i, float v);

#endif
