/*
 * storage.h - how the expert store reads byte ranges of the model files:
 * an interface with implementations chosen by a parameter, as SQLite's VFS
 * chooses how a database file is read.
 *
 *   uring     io_uring, every range of a read submitted at once; with
 *             `direct`, through O_DIRECT descriptors and an aligned bounce
 *             buffer, so nothing stays in the page cache
 *   pread     one pread a range (O_DIRECT where `direct`)
 *   mapped    copies out of the files' mappings (the page cache serves it)
 *
 *     struct sp_storage *s;
 *     sp_storage_open(model->files, SP_IO_AUTO, 64 << 20, &s);
 *     struct sp_storage_reader *r;
 *     sp_storage_reader_open(s, &r);          // one per reading thread
 *     struct sp_storage_part p = {.shard = 0, .off = 4096, .len = 1 << 20, .dst = buf};
 *     sp_storage_read(r, &p, 1, &bytes);
 *     sp_storage_reader_close(r);
 *     sp_storage_close(s);
 *
 * A range that a method cannot read (O_DIRECT refused, a short read) is
 * read again with plain pread; a buffered range's pages are then dropped
 * from the page cache, so that a store holding its own copy holds the
 * bytes once and its misses really reach the disk.
 */
#ifndef SP_RUNTIME_STORAGE_H
#define SP_RUNTIME_STORAGE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"
#include "format/modeldir.h"

/* One range of a shard of the model files, and where its bytes go. */
struct sp_storage_part {
    int shard;
    uint64_t off;
    size_t len;
    uint8_t *dst;
};

/* The most ranges one read takes. */
#define SP_STORAGE_MAX_PARTS 16

enum sp_storage_kind { SP_STORAGE_URING, SP_STORAGE_PREAD, SP_STORAGE_MAPPED, SP_STORAGE_KIND_COUNT };

struct sp_storage;
struct sp_storage_reader;

/* What an implementation provides; a reader is one thread's state. */
struct sp_storage_ops {
    const char *name;
    enum sp_status (*reader_open)(struct sp_storage *s, struct sp_storage_reader *r);
    void (*reader_close)(struct sp_storage_reader *r);
    /* Reads parts[0 .. n) into their dst; how[k] says what became of part
     * k: 0 not read (sp_storage_read reads it with pread), 1 read through
     * the page cache, 2 read around it. */
    void (*read)(struct sp_storage_reader *r, const struct sp_storage_part *parts, int n, uint8_t *how);
};

/* Opens the files of mf for reads of up to max_read bytes at a time (the
 * direct reads' bounce buffer): io AUTO is uring with direct where the
 * kernel and the files allow, BUFFERED uring without, PREAD pread, MAPPED
 * the mappings; uring falls back to pread where the kernel refuses it. */
enum sp_status sp_storage_open(const struct sp_model_files *mf, enum sp_io_method io, size_t max_read,
                               struct sp_storage **out);
void sp_storage_close(struct sp_storage *s);
enum sp_status sp_storage_reader_open(struct sp_storage *s, struct sp_storage_reader **out);
void sp_storage_reader_close(struct sp_storage_reader *r);
/* Reads parts[0 .. n) (n <= SP_STORAGE_MAX_PARTS); adds the bytes read to
 * *bytes. */
enum sp_status sp_storage_read(struct sp_storage_reader *r, const struct sp_storage_part *parts, int n,
                               uint64_t *bytes);
/* The implementation in use ("uring", "pread", "mapped"), and whether its
 * reads bypass the page cache. */
const char *sp_storage_name(const struct sp_storage *s);
bool sp_storage_uring(const struct sp_storage *s);
bool sp_storage_direct(const struct sp_storage *s);

#endif
