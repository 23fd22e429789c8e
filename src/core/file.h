/*
 * file.h - files, memory maps and paths.
 *
 *     struct sp_map m;
 *     if (sp_map_open(path, &m) != SP_OK) ...   // read-only, whole file
 *     use(m.data, m.size);
 *     sp_map_close(&m);
 *
 * sp_read_file returns a NUL-terminated heap copy owned by the caller
 * (sp_free). sp_path_join returns an owned string. sp_dir_list returns an
 * owned, sorted array of owned names (free with sp_strv_free).
 * sp_dir_remove_files deletes a folder of plain files, never recursively.
 */
#ifndef SP_CORE_FILE_H
#define SP_CORE_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

struct sp_progress;

/* Bytes [off, off + len) of a map. */
struct sp_map_range {
    size_t off, len;
};

struct sp_map {
    const unsigned char *data;  // NULL for an empty file
    size_t size;
    bool anon;  // the bytes are an anonymous copy now (sp_map_to_anon)
    int fd;  // kept open for pread-based readers of the same file
    int64_t mtime_ns;  // the file's modification time when mapped
    int guard;         // its entry in the fault guard's table plus one, or 0
    /* The ranges still read, sorted and apart (sp_map_keep); NULL: all of it */
    struct sp_map_range *live;
    size_t n_live;
    size_t anon_bytes;  // what the anonymous copy holds (counted as weights memory)
};

enum sp_status sp_map_open(const char *path, struct sp_map *m);
void sp_map_close(struct sp_map *m);
/* Narrows m to the n ranges still read (sorted by offset, apart; copied),
 * for a file whose other bytes were read once and turned into something
 * else: the pages wholly outside them leave the process now
 * (MADV_DONTNEED), and sp_map_populate and sp_map_to_anon leave them out. */
enum sp_status sp_map_keep(struct sp_map *m, const struct sp_map_range *r, size_t n);
/* The pages wholly inside bytes [off, off + len) of m leave the process
 * (MADV_DONTNEED; the file stays in the page cache, a later read maps it
 * again): for bytes read once into memory of their own. */
void sp_map_drop(const struct sp_map *m, size_t off, size_t len);
/* The bytes of m still read: its size, or its ranges' total. */
size_t sp_map_live_bytes(const struct sp_map *m);
/* Maps every page of m into the process now, reading from disk what the page
 * cache lacks, so that later reads take no page faults (for a file that is
 * to stay resident: a first touch costs a fault per 64 KiB or so, paid in
 * the middle of a forward pass otherwise). Pages read from disk for it go
 * into 2 MiB pages where the kernel allows (MADV_HUGEPAGE): a one-token
 * product streams its weights ~9% faster with a TLB miss per 2 MiB.
 * pr, where not NULL, counts the bytes as they come in (core/progress.h). */
enum sp_status sp_map_populate(const struct sp_map *m, struct sp_progress *pr);
/* Changes a copy of m's bytes (at copy, m->size of them) before they
 * replace m's pages (sp_map_to_anon). */
typedef void (*sp_map_edit_fn)(void *ctx, const struct sp_map *m, unsigned char *copy);
/* Replaces the map's pages by an anonymous copy of the file (of the pages
 * its ranges touch, sp_map_keep), at the same address (pointers into the
 * map stay valid), in 2 MiB pages where the map
 * has whole ones and the kernel allows: read end to end by a one-token
 * product, such pages take a TLB miss per 2 MiB where the page cache often
 * holds a file in 4 KiB pieces. edit, where not NULL, changes the copy
 * first; the copy is read-only after. The copy is counted as weights
 * memory (SP_MEM_WEIGHTS) and freed by sp_map_close. A map that is a copy
 * already is left as it is (edit not called); on failure the map is left
 * as it was. pr, where not NULL, counts the bytes as they are read. */
enum sp_status sp_map_to_anon(struct sp_map *m, sp_map_edit_fn edit, void *ctx, struct sp_progress *pr);
/* Bytes of m held in 2 MiB pages now (its page-cache folios mapped whole,
 * or its anonymous copy's huge pages; /proc/self/smaps, 0 where the kernel
 * does not say). */
size_t sp_map_huge_bytes(const struct sp_map *m);
/* The same for the n bytes at p (the maps wholly inside them). */
size_t sp_huge_bytes_in(const void *p, size_t n);

/* The guard against files that change under their maps. A page of a map
 * past the end of a file that shrank (truncate, or a copy rewriting it in
 * place) faults with SIGBUS, which kills the process. Once the guard is
 * installed (sp_map_guard_install, once per process; it takes SIGBUS), a
 * fault inside an open map is answered by mapping zero pages over the rest
 * of that map, so the read goes on, reading zeros, and is counted; a fault
 * anywhere else gets the default action, as without the guard. Whoever
 * computed from the map then learns of it from sp_map_faults() and
 * sp_map_changed(), and must throw that work away. */
enum sp_status sp_map_guard_install(void);
/* Faults the guard has answered, over all maps. Any thread. */
uint64_t sp_map_faults(void);
/* Whether m's file is no longer what was mapped: a read of m faulted, or
 * the file's size or modification time differ from when it was mapped (an
 * anonymous copy changes only by a fault taken before it was made). why
 * gets the reason, for a message. */
bool sp_map_changed(const struct sp_map *m, char *why, size_t cap);

/* Reads a whole file (at most max_bytes) into a NUL-terminated buffer. */
enum sp_status sp_read_file(const char *path, size_t max_bytes, char **out, size_t *len);
/* Writes a whole file through a temporary name and rename(), so readers never
 * see a half-written file. */
enum sp_status sp_write_file(const char *path, const void *data, size_t len);

/* Writes a buffer's bytes to dir/name (a failed buffer is SP_ERR_NOMEM). */
struct sp_buf;
enum sp_status sp_write_buf(const char *dir, const char *name, const struct sp_buf *b);

bool sp_path_is_dir(const char *path);
bool sp_path_is_file(const char *path);
/* What stands at path when it is not a regular file one can open, in words
 * for a message ("missing", "a directory", "a FIFO", "a symbolic link
 * loop", ...); NULL for a regular file. A static string. */
const char *sp_path_not_file(const char *path);
char *sp_path_join(const char *dir, const char *name);
/* mkdir -p. */
enum sp_status sp_mkdirs(const char *path);
/* Copies a file byte for byte. */
enum sp_status sp_copy_file(const char *src, const char *dst);

/* Regular files in dir whose names end in suffix (NULL: all), sorted. */
enum sp_status sp_dir_list(const char *dir, const char *suffix, char ***names, size_t *count);
void sp_strv_free(char **v, size_t count);

/* Removes a folder of regular files (a model folder sparrow wrote): unlinks
 * them, then the folder. Never recursive: a folder holding anything else (a
 * subfolder, a link) is left untouched and is an error. */
enum sp_status sp_dir_remove_files(const char *dir);

#endif
