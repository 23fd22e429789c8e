/*
 * safetensors.h - one safetensors file: header parsed with strict
 * validation, tensor data mapped read-only.
 *
 *     struct sp_st_file *f;
 *     if (sp_st_open("model.safetensors", &f) != SP_OK) puts(sp_error_msg());
 *     const struct sp_st_tensor *t = sp_st_find(f, "lm_head.weight");
 *     // t->data points into the mapping: valid until sp_st_close(f)
 *     sp_st_close(f);
 *
 * Validation (every failure names the file and the tensor): 8-byte header
 * length within SP_ST_MAX_HEADER and the file; the header a JSON object whose
 * entries are {dtype, shape, data_offsets} objects (plus an optional
 * "__metadata__" object of strings); a known dtype; non-negative integer
 * dimensions and offsets (64-bit, beyond 2^31 fine); shape x dtype size equal
 * to the byte span; no duplicate names; spans inside the data section, not
 * overlapping, and together covering it exactly (as the reference reader
 * requires). Data may be unaligned (mlx writes no padding): read it with
 * memcpy or unaligned loads.
 */
#ifndef SP_FORMAT_SAFETENSORS_H
#define SP_FORMAT_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#include "core/file.h"
#include "core/status.h"
#include "core/strmap.h"
#include "quant/dtype.h"

#define SP_ST_MAX_HEADER ((size_t)100 * 1000 * 1000)
#define SP_ST_MAX_DIMS 8

struct sp_st_tensor {
    const char *name;  // owned by the file
    enum sp_dtype dtype;
    int ndim;
    int64_t shape[SP_ST_MAX_DIMS];
    size_t offset;  // from the start of the file
    size_t nbytes;
    const void *data;  // into the mapping (NULL when nbytes == 0)
};

struct sp_st_file {
    char *path;  // owned
    struct sp_map map;
    size_t header_len;
    struct sp_st_tensor *tensors;  // (n_tensors), in header order
    int64_t n_tensors;
    char *format;  // __metadata__.format ("pt", "mlx", ...) or NULL; owned
    struct sp_strmap by_name;  // name -> index in tensors
    char *names;  // arena holding the tensor names
    /* tensor data made when opened rather than mapped (gguf_model.c), or
     * NULL: owned_bytes of them, in 2 MiB pages where the kernel allows */
    void *owned;
    size_t owned_bytes;
};

/* Maps and validates a file. *out is owned by the caller (sp_st_close). */
enum sp_status sp_st_open(const char *path, struct sp_st_file **out);
/* Validates a whole file image already in memory (data must outlive *out);
 * `what` names it in messages. Used by sp_st_open and by the fuzzer. */
enum sp_status sp_st_parse(const unsigned char *data, size_t size, const char *what, struct sp_st_file **out);
void sp_st_close(struct sp_st_file *f);

/* The tensor called name, or NULL. Borrowed from f. */
const struct sp_st_tensor *sp_st_find(const struct sp_st_file *f, const char *name);
/* Number of elements (product of the shape). */
int64_t sp_st_numel(const struct sp_st_tensor *t);

#endif
