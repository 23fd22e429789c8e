/*
 * st_writer.h - writes a model's tensors as safetensors, split into shards
 * of a bounded size, with model.safetensors.index.json when there is more
 * than one shard. Tensors are declared first (so headers and the index can
 * be written up front), then their bytes are streamed in declaration order:
 * nothing needs the whole model in memory.
 *
 *     struct sp_st_writer w;
 *     sp_st_writer_init(&w, "out_dir", 5ull << 30);
 *     sp_st_writer_declare(&w, "lm_head.weight", SP_DTYPE_BF16, 2, (int64_t[]){V, D});
 *     ...
 *     sp_st_writer_begin(&w);
 *     sp_st_writer_write(&w, bytes, nbytes);   // the tensors' bytes in order, in any pieces
 *     sp_st_writer_finish(&w);
 *     sp_st_writer_free(&w);
 *
 * Headers list names in sorted order and are padded with spaces to a
 * multiple of 8 bytes, so tensor data starts 8-byte aligned.
 */
#ifndef SP_FORMAT_ST_WRITER_H
#define SP_FORMAT_ST_WRITER_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>

#include "core/status.h"
#include "format/safetensors.h"

struct sp_st_out {
    char *name;  // owned
    enum sp_dtype dtype;
    int ndim;
    int64_t shape[SP_ST_MAX_DIMS];
    size_t nbytes;
    int shard;
    size_t offset;  // within the shard's data section
};

struct sp_st_writer {
    char *dir;  // owned
    size_t shard_limit;
    struct sp_st_out *tensors;  // (n, cap)
    int64_t n, cap;
    int n_shards;
    int64_t next;  // tensor being written
    size_t written;  // bytes of it written so far
    FILE *fp;      // the shard being written
    int fp_shard;
    bool sparse;   // bytes were skipped: shards are extended to size on close
};

void sp_st_writer_init(struct sp_st_writer *w, const char *dir, size_t shard_limit);
enum sp_status sp_st_writer_declare(struct sp_st_writer *w, const char *name, enum sp_dtype dtype, int ndim,
                                    const int64_t *shape);
enum sp_status sp_st_writer_begin(struct sp_st_writer *w);
/* Appends bytes to the tensors in declaration order; a call may cover part
 * of a tensor or run across several. */
enum sp_status sp_st_writer_write(struct sp_st_writer *w, const void *data, size_t nbytes);
/* Leaves the next nbytes unwritten: the files get holes that read as zeros
 * and take no disk space (shape-only models for planning). */
enum sp_status sp_st_writer_skip(struct sp_st_writer *w, size_t nbytes);
enum sp_status sp_st_writer_finish(struct sp_st_writer *w);
void sp_st_writer_free(struct sp_st_writer *w);

#endif
