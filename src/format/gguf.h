/*
 * gguf.h - one GGUF file (v2 or v3, little-endian), as llama.cpp and Ollama
 * write them: typed metadata and tensor infos parsed with strict
 * validation, tensor data mapped read-only. Split models
 * (name-00001-of-0000N.gguf) open as one set of shards.
 *
 *     struct sp_gguf_file *f;
 *     if (sp_gguf_open("model.gguf", &f) != SP_OK) puts(sp_error_msg());
 *     int64_t n_layer;
 *     if (sp_gguf_get_int(f, "llama.block_count", 1, 4096, &n_layer) != SP_OK) ...
 *     const struct sp_gguf_kv *tok;
 *     if (sp_gguf_get_arr(f, "tokenizer.ggml.tokens", SP_GGUF_VTYPE_STRING, &tok) != SP_OK) ...
 *     struct sp_gguf_str s0 = sp_gguf_arr_str(tok, 0);  // bytes in the mapping, no NUL
 *     const struct sp_gguf_tensor *t = sp_gguf_find(f, "token_embd.weight");
 *     // t->data points into the mapping: valid until sp_gguf_close(f)
 *     sp_gguf_close(f);
 *
 * Everything a file hands out (keys, names, string values, tensor data) is
 * borrowed from it until sp_gguf_close.
 *
 * Validation (every failure names the file and the key or tensor): magic
 * "GGUF"; version 2 or 3 (v1's 32-bit counts are refused); every count and
 * length checked against the bytes left before anything is read or
 * allocated; keys 1..65535 bytes and tensor names 1..64 bytes without NUL,
 * each unique; known value types; bools 0 or 1; arrays of any value type but
 * arrays (arrays of arrays are refused: llama.cpp does not read them either);
 * general.alignment, where present, a uint32 power of two (default 32);
 * tensors of a known ggml type, 1..4 dimensions each >= 1, the first a
 * multiple of the type's block, the byte size without overflow, the offset
 * aligned, the data inside the data section and no two tensors overlapping.
 * Unlike safetensors, gaps between tensors are allowed (alignment padding).
 * String values are not checked for UTF-8 (token pieces may be partial).
 */
#ifndef SP_FORMAT_GGUF_H
#define SP_FORMAT_GGUF_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/file.h"
#include "core/status.h"
#include "core/strmap.h"

#define SP_GGUF_MAX_DIMS 4
#define SP_GGUF_MAX_NAME 64      // bytes of a tensor name (GGML_MAX_NAME)
#define SP_GGUF_MAX_KEY 65535    // bytes of a metadata key (the spec's limit)
#define SP_GGUF_DEFAULT_ALIGN 32

/* Metadata value types in id order: X(enum suffix, name, bytes; 0 = variable). */
#define SP_GGUF_VTYPE_LIST(X)                                                  \
    X(UINT8, "uint8", 1)                                                       \
    X(INT8, "int8", 1)                                                         \
    X(UINT16, "uint16", 2)                                                     \
    X(INT16, "int16", 2)                                                       \
    X(UINT32, "uint32", 4)                                                     \
    X(INT32, "int32", 4)                                                       \
    X(FLOAT32, "float32", 4)                                                   \
    X(BOOL, "bool", 1)                                                         \
    X(STRING, "string", 0)                                                     \
    X(ARRAY, "array", 0)                                                       \
    X(UINT64, "uint64", 8)                                                     \
    X(INT64, "int64", 8)                                                       \
    X(FLOAT64, "float64", 8)

enum sp_gguf_vtype {
#define SP_X(e, name, size) SP_GGUF_VTYPE_##e,
    SP_GGUF_VTYPE_LIST(SP_X)
#undef SP_X
        SP_GGUF_VTYPE_COUNT
};

/* ggml tensor types GGUF files hold: X(enum suffix, id, elements per block,
 * bytes per block), from ggml's type traits. Ids missing here (4, 5, 31-33,
 * 36-38: removed from ggml; 41 and up: newer than this table) are refused. */
#define SP_GGUF_TYPE_LIST(X)                                                   \
    X(F32, 0, 1, 4)                                                            \
    X(F16, 1, 1, 2)                                                            \
    X(Q4_0, 2, 32, 18)                                                         \
    X(Q4_1, 3, 32, 20)                                                         \
    X(Q5_0, 6, 32, 22)                                                         \
    X(Q5_1, 7, 32, 24)                                                         \
    X(Q8_0, 8, 32, 34)                                                         \
    X(Q8_1, 9, 32, 36)                                                         \
    X(Q2_K, 10, 256, 84)                                                       \
    X(Q3_K, 11, 256, 110)                                                      \
    X(Q4_K, 12, 256, 144)                                                      \
    X(Q5_K, 13, 256, 176)                                                      \
    X(Q6_K, 14, 256, 210)                                                      \
    X(Q8_K, 15, 256, 292)                                                      \
    X(IQ2_XXS, 16, 256, 66)                                                    \
    X(IQ2_XS, 17, 256, 74)                                                     \
    X(IQ3_XXS, 18, 256, 98)                                                    \
    X(IQ1_S, 19, 256, 50)                                                      \
    X(IQ4_NL, 20, 32, 18)                                                      \
    X(IQ3_S, 21, 256, 110)                                                     \
    X(IQ2_S, 22, 256, 82)                                                      \
    X(IQ4_XS, 23, 256, 136)                                                    \
    X(I8, 24, 1, 1)                                                            \
    X(I16, 25, 1, 2)                                                           \
    X(I32, 26, 1, 4)                                                           \
    X(I64, 27, 1, 8)                                                           \
    X(F64, 28, 1, 8)                                                           \
    X(IQ1_M, 29, 256, 56)                                                      \
    X(BF16, 30, 1, 2)                                                          \
    X(TQ1_0, 34, 256, 54)                                                      \
    X(TQ2_0, 35, 256, 66)                                                      \
    X(MXFP4, 39, 32, 17)                                                       \
    X(NVFP4, 40, 64, 36)

enum sp_gguf_type {
#define SP_X(e, id, block, bytes) SP_GGUF_TYPE_##e = id,
    SP_GGUF_TYPE_LIST(SP_X)
#undef SP_X
        SP_GGUF_TYPE_COUNT = 41  // one past the largest id; some ids below it are unused
};

struct sp_gguf_type_traits {
    const char *name;    // "Q4_K"
    int block;           // elements per block
    size_t block_bytes;  // bytes per block
};

/* The traits of ggml type id, or NULL for an id this table does not know. */
const struct sp_gguf_type_traits *sp_gguf_type_traits(uint32_t id);
/* "Q4_K"; "?" for an unknown id. */
const char *sp_gguf_type_name(uint32_t id);
const char *sp_gguf_vtype_name(uint32_t t);

/* A string in the mapping: not NUL-terminated, may hold any bytes. */
struct sp_gguf_str {
    const char *data;
    size_t len;
};

struct sp_gguf_kv {
    const char *key;           // NUL-terminated; owned by the file
    enum sp_gguf_vtype type;   // SP_GGUF_VTYPE_ARRAY for arrays
    enum sp_gguf_vtype elem;   // an array's element type; == type for a single value
    int64_t count;             // an array's length; 1 for a single value
    const unsigned char *data; // the value (an array's first element) in the mapping
    size_t nbytes;             // of the value (all of an array's elements)
    size_t *str_offs;          // (count) offsets into data of each string's length; strings only, owned
};

struct sp_gguf_tensor {
    const char *name;  // owned by the file
    enum sp_gguf_type type;
    int n_dims;
    int64_t dims[SP_GGUF_MAX_DIMS];  // ggml order: dims[0] varies fastest (a row); unused dims are 1
    size_t offset;                   // from the start of the file (aligned)
    size_t nbytes;
    const void *data;  // into the mapping
};

struct sp_gguf_file {
    char *path;  // the file, or parse's `what`; owned
    struct sp_map map;  // fd -1 and no data for sp_gguf_parse
    uint32_t version;
    size_t alignment;
    size_t data_offset;  // start of the data section in the file
    size_t data_size;    // bytes from data_offset to the end of the file
    struct sp_gguf_kv *kvs;  // (n_kvs), in file order
    int64_t n_kvs;
    struct sp_gguf_tensor *tensors;  // (n_tensors), in file order
    int64_t n_tensors;
    struct sp_strmap kv_by_key;       // key -> index in kvs
    struct sp_strmap tensor_by_name;  // name -> index in tensors
    char *names;  // arena holding keys and tensor names
};

/* Maps and validates a file. *out is owned by the caller (sp_gguf_close). */
enum sp_status sp_gguf_open(const char *path, struct sp_gguf_file **out);
/* Validates a whole file image already in memory (data must outlive *out);
 * `what` names it in messages. Used by sp_gguf_open and by the fuzzer. */
enum sp_status sp_gguf_parse(const unsigned char *data, size_t size, const char *what, struct sp_gguf_file **out);
void sp_gguf_close(struct sp_gguf_file *f);

/* The tensor called name, or NULL. Borrowed from f. */
const struct sp_gguf_tensor *sp_gguf_find(const struct sp_gguf_file *f, const char *name);
/* Number of elements (product of the dims). */
int64_t sp_gguf_numel(const struct sp_gguf_tensor *t);

/* The metadata entry called key, or NULL. Borrowed from f. */
const struct sp_gguf_kv *sp_gguf_find_kv(const struct sp_gguf_file *f, const char *key);

/* Typed getters: SP_ERR_NOT_FOUND for a missing key, SP_ERR_FORMAT for a
 * value of another type or out of range, with a message naming file and key.
 * get_int takes any integer type and checks min <= value <= max; get_float
 * takes float32 or float64. */
enum sp_status sp_gguf_get_str(const struct sp_gguf_file *f, const char *key, struct sp_gguf_str *out);
enum sp_status sp_gguf_get_int(const struct sp_gguf_file *f, const char *key, int64_t min, int64_t max, int64_t *out);
enum sp_status sp_gguf_get_float(const struct sp_gguf_file *f, const char *key, double *out);
enum sp_status sp_gguf_get_bool(const struct sp_gguf_file *f, const char *key, bool *out);
/* An array whose elements are of kind elem: an integer type accepts arrays
 * of every integer type, FLOAT32 or FLOAT64 either float type, STRING and
 * BOOL only themselves. Read the elements with sp_gguf_arr_*. */
enum sp_status sp_gguf_get_arr(const struct sp_gguf_file *f, const char *key, enum sp_gguf_vtype elem,
                               const struct sp_gguf_kv **out);

/* Element i of an array entry (or of a single value, i = 0) of the matching
 * kind; i out of range or the wrong kind is a broken invariant. */
struct sp_gguf_str sp_gguf_arr_str(const struct sp_gguf_kv *kv, int64_t i);
double sp_gguf_arr_float(const struct sp_gguf_kv *kv, int64_t i);
bool sp_gguf_arr_bool(const struct sp_gguf_kv *kv, int64_t i);
/* False for a uint64 beyond INT64_MAX. */
bool sp_gguf_arr_int(const struct sp_gguf_kv *kv, int64_t i, int64_t *out);

/* A model in one file or split over shards name-00001-of-0000N.gguf. */
struct sp_gguf_split {
    struct sp_gguf_file **shards;  // (n_shards), owned; shards[0] holds the model's metadata
    int n_shards;
    const struct sp_gguf_tensor **tensors;  // (n_tensors) over all shards in shard order; borrowed from them
    int *shard_of;  // (n_tensors): the shard holding each tensor
    int64_t n_tensors;
    struct sp_strmap by_name;  // name -> index in tensors
};

/* Opens path and, where its name ends in -00001-of-0000N.gguf, the other
 * N - 1 shards beside it. Each shard's split.no (0-based) and split.count
 * must match its name, split.tensors.count (where given) the total, and
 * tensor names be unique over the set. A file with another name is a set of
 * one (and must not say split.count > 1). *out is owned (sp_gguf_split_close). */
enum sp_status sp_gguf_split_open(const char *path, struct sp_gguf_split **out);
void sp_gguf_split_close(struct sp_gguf_split *s);
/* The tensor called name over all shards, or NULL; *shard (may be NULL)
 * gets the shard holding it. Borrowed from s. */
const struct sp_gguf_tensor *sp_gguf_split_find(const struct sp_gguf_split *s, const char *name, int *shard);

#endif
