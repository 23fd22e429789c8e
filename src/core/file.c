/* file.c - file maps, whole-file reads and writes, paths. */
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/buf.h"

enum sp_status sp_map_open(const char *path, struct sp_map *m) {
    m->data = NULL;
    m->size = 0;
    m->fd = open(path, O_RDONLY | O_CLOEXEC);
    if (m->fd < 0) return sp_errorf(errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", path, strerror(errno));
    struct stat stt;
    if (fstat(m->fd, &stt) != 0) goto fail_errno;
    if (!S_ISREG(stt.st_mode)) {
        close(m->fd);
        m->fd = -1;
        return sp_errorf(SP_ERR_IO, "%s: not a regular file", path);
    }
    m->size = (size_t)stt.st_size;
    if (m->size == 0) return SP_OK;
    void *p = mmap(NULL, m->size, PROT_READ, MAP_SHARED, m->fd, 0);
    if (p == MAP_FAILED) goto fail_errno;
    m->data = p;
    return SP_OK;
fail_errno:;
    int e = errno;
    close(m->fd);
    m->fd = -1;
    return sp_errorf(SP_ERR_IO, "%s: %s", path, strerror(e));
}

void sp_map_close(struct sp_map *m) {
    if (!m) return;
    if (m->data) munmap((void *)m->data, m->size);
    if (m->fd >= 0) close(m->fd);
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

enum sp_status sp_map_populate(const struct sp_map *m) {
    if (!m->data) return SP_OK;
#ifdef MADV_HUGEPAGE
    /* What the kernel reads for the map from here on goes into 2 MiB pages
     * where the file system and THP allow; pages the page cache already
     * holds in 4 KiB pieces stay so (sp_maps_huge_bytes tells which). */
    (void)madvise((void *)m->data, m->size, MADV_HUGEPAGE);
#endif
#ifdef MADV_POPULATE_READ
    if (madvise((void *)m->data, m->size, MADV_POPULATE_READ) == 0) return SP_OK;
    if (errno != EINVAL) return sp_errorf(SP_ERR_IO, "mapping %zu bytes into memory: %s", m->size, strerror(errno));
#endif
    /* kernels before 5.14: ask for read-ahead, then touch a byte per page */
    (void)madvise((void *)m->data, m->size, MADV_WILLNEED);
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    unsigned char acc = 0;
    for (size_t o = 0; o < m->size; o += page) acc ^= ((const volatile unsigned char *)m->data)[o];
    (void)acc;
    return SP_OK;
}

size_t sp_maps_huge_bytes(void) {
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    if (!f) return 0;
    char line[256];
    unsigned long long kb = 0;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1) break;
    fclose(f);
    return (size_t)kb * 1024;
}

enum sp_status sp_read_file(const char *path, size_t max_bytes, char **out, size_t *len) {
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f) return sp_errorf(errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", path, strerror(errno));
    enum sp_status st = SP_OK;
    size_t cap = 4096, n = 0;
    char *buf = sp_malloc(cap, SP_MEM_MISC);
    if (!buf) {
        st = sp_errorf(SP_ERR_NOMEM, "%s: out of memory", path);
        goto done;
    }
    for (;;) {
        if (n + 1 >= cap) {
            if (n > max_bytes) {
                st = sp_errorf(SP_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
                goto done;
            }
            char *nb = sp_realloc(buf, cap * 2);
            if (!nb) {
                st = sp_errorf(SP_ERR_NOMEM, "%s: out of memory", path);
                goto done;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0) break;
    }
    if (ferror(f)) {
        st = sp_errorf(SP_ERR_IO, "%s: read error", path);
        goto done;
    }
    if (n > max_bytes) {
        st = sp_errorf(SP_ERR_LIMIT, "%s: larger than %zu bytes", path, max_bytes);
        goto done;
    }
    buf[n] = 0;
    *out = buf;
    buf = NULL;
    if (len) *len = n;
done:
    sp_free(buf);
    fclose(f);
    return st;
}

enum sp_status sp_write_file(const char *path, const void *data, size_t len) {
    size_t plen = strlen(path);
    char *tmp = sp_malloc(plen + 8, SP_MEM_MISC);
    if (!tmp) return sp_errorf(SP_ERR_NOMEM, "%s: out of memory", path);
    snprintf(tmp, plen + 8, "%s.tmp~", path);
    enum sp_status st = SP_OK;
    FILE *f = fopen(tmp, "wb");
    if (!f) {
        st = sp_errorf(SP_ERR_IO, "%s: %s", tmp, strerror(errno));
        goto done;
    }
    size_t w = len ? fwrite(data, 1, len, f) : 0;
    int close_err = fclose(f);
    if (w != len || close_err != 0) {
        st = sp_errorf(SP_ERR_IO, "%s: write failed: %s", tmp, strerror(errno));
        unlink(tmp);
        goto done;
    }
    if (rename(tmp, path) != 0) {
        st = sp_errorf(SP_ERR_IO, "%s: %s", path, strerror(errno));
        unlink(tmp);
    }
done:
    sp_free(tmp);
    return st;
}

enum sp_status sp_write_buf(const char *dir, const char *name, const struct sp_buf *b) {
    if (b->failed) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    char *path = sp_path_join(dir, name);
    if (!path) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    enum sp_status st = sp_write_file(path, b->data ? b->data : "", b->len);
    sp_free(path);
    return st;
}

bool sp_path_is_dir(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISDIR(s.st_mode);
}

bool sp_path_is_file(const char *path) {
    struct stat s;
    return stat(path, &s) == 0 && S_ISREG(s.st_mode);
}

char *sp_path_join(const char *dir, const char *name) {
    size_t dl = strlen(dir), nl = strlen(name);
    bool slash = dl > 0 && dir[dl - 1] != '/';
    char *p = sp_malloc(dl + nl + 2, SP_MEM_MISC);
    if (!p) return NULL;
    memcpy(p, dir, dl);
    if (slash) p[dl++] = '/';
    memcpy(p + dl, name, nl + 1);
    return p;
}

enum sp_status sp_mkdirs(const char *path) {
    char *p = sp_strdup(path, SP_MEM_MISC);
    if (!p) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    enum sp_status st = SP_OK;
    for (char *s = p + 1;; s++) {
        if (*s != '/' && *s != 0) continue;
        char c = *s;
        *s = 0;
        if (mkdir(p, 0755) != 0 && errno != EEXIST) {
            st = sp_errorf(SP_ERR_IO, "%s: %s", p, strerror(errno));
            break;
        }
        *s = c;
        if (!c) break;
    }
    if (st == SP_OK && !sp_path_is_dir(path)) st = sp_errorf(SP_ERR_IO, "%s: not a directory", path);
    sp_free(p);
    return st;
}

enum sp_status sp_copy_file(const char *src, const char *dst) {
    struct sp_map m;
    enum sp_status st = sp_map_open(src, &m);
    if (st != SP_OK) return st;
    st = sp_write_file(dst, m.data, m.size);
    sp_map_close(&m);
    return st;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* Every entry of dir but "." and "..", regular files or not (names starting
 * with a dot included: a temporary file left by sp_write_file is one). */
static enum sp_status dir_entries(const char *dir, char ***names, size_t *count) {
    *names = NULL;
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return sp_errorf(errno == ENOENT ? SP_ERR_NOT_FOUND : SP_ERR_IO, "%s: %s", dir, strerror(errno));
    size_t n = 0, cap = 0;
    char **v = NULL;
    enum sp_status st = SP_OK;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            char **nv = v ? sp_realloc(v, cap * sizeof *v) : sp_malloc(cap * sizeof *v, SP_MEM_MISC);
            if (!nv) {
                st = sp_errorf(SP_ERR_NOMEM, "out of memory");
                break;
            }
            v = nv;
        }
        if (!(v[n] = sp_strdup(e->d_name, SP_MEM_MISC))) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            break;
        }
        n++;
    }
    closedir(d);
    if (st != SP_OK) {
        sp_strv_free(v, n);
        return st;
    }
    *names = v;
    *count = n;
    return SP_OK;
}

enum sp_status sp_dir_list(const char *dir, const char *suffix, char ***names, size_t *count) {
    char **v;
    size_t all, n = 0, sl = suffix ? strlen(suffix) : 0;
    enum sp_status st = dir_entries(dir, &v, &all);
    if (st != SP_OK) return st;
    for (size_t i = 0; i < all; i++) {
        size_t l = strlen(v[i]);
        bool keep = v[i][0] != '.' && l >= sl && (!sl || strcmp(v[i] + l - sl, suffix) == 0);
        if (keep) {
            char *full = sp_path_join(dir, v[i]);
            keep = full && sp_path_is_file(full);
            sp_free(full);
        }
        if (keep) v[n++] = v[i];
        else sp_free(v[i]);
    }
    if (n) {
        qsort(v, n, sizeof *v, cmp_str);
    } else {
        sp_free(v);
        v = NULL;
    }
    *names = v;
    *count = n;
    return SP_OK;
}

void sp_strv_free(char **v, size_t count) {
    if (!v) return;
    for (size_t i = 0; i < count; i++) sp_free(v[i]);
    sp_free(v);
}

enum sp_status sp_dir_remove_files(const char *dir) {
    char **names;
    size_t n;
    enum sp_status st = dir_entries(dir, &names, &n);
    if (st != SP_OK) return st;
    /* Checked before anything is deleted: all or nothing. */
    for (size_t i = 0; i < n && st == SP_OK; i++) {
        char *full = sp_path_join(dir, names[i]);
        struct stat s;
        if (!full) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        else if (lstat(full, &s) != 0) st = sp_errorf(SP_ERR_IO, "%s: %s", full, strerror(errno));
        else if (!S_ISREG(s.st_mode)) st = sp_errorf(SP_ERR_IO, "%s: not removed: %s is not a regular file", dir, names[i]);
        sp_free(full);
    }
    for (size_t i = 0; i < n && st == SP_OK; i++) {
        char *full = sp_path_join(dir, names[i]);
        if (!full) st = sp_errorf(SP_ERR_NOMEM, "out of memory");
        else if (unlink(full) != 0) st = sp_errorf(SP_ERR_IO, "%s: %s", full, strerror(errno));
        sp_free(full);
    }
    sp_strv_free(names, n);
    if (st == SP_OK && rmdir(dir) != 0) st = sp_errorf(SP_ERR_IO, "%s: %s", dir, strerror(errno));
    return st;
}
