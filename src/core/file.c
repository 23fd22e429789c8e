/* file.c - file maps, whole-file reads and writes, paths. */
#include "core/file.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/buf.h"
#include "core/progress.h"

#define HUGE_PAGE ((size_t)2 << 20)

/* An address range of n bytes starting on a 2 MiB boundary, reserved
 * (PROT_NONE) for a map to be placed over with MAP_FIXED; NULL on failure. */
static void *reserve_aligned(size_t n) {
    size_t len = n + HUGE_PAGE;
    char *p = mmap(NULL, len, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (p == MAP_FAILED) return NULL;
    char *a = (char *)(((uintptr_t)p + HUGE_PAGE - 1) & ~(uintptr_t)(HUGE_PAGE - 1));
    if (a > p) munmap(p, (size_t)(a - p));
    size_t tail = (size_t)(p + len - (a + n));
    if (tail) munmap(a + n, tail);
    return a;
}

/* Maps the file read-only at a 2 MiB boundary, so that file offsets and
 * addresses agree modulo 2 MiB: the kernel can then map page-cache folios
 * of 2 MiB with one entry each, and sp_map_to_anon can move whole 2 MiB
 * pages in. NULL with errno set on failure. */
static void *map_aligned(int fd, size_t size) {
    size_t n = (size + 4095) & ~(size_t)4095;
    void *a = size >= HUGE_PAGE ? reserve_aligned(n) : NULL;
    void *p = mmap(a, size, PROT_READ, MAP_SHARED | (a ? MAP_FIXED : 0), fd, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (a) munmap(a, n);
        errno = e;
        return NULL;
    }
    return p;
}

/* ---- the fault guard ---- */

/* Open maps, read by the signal handler without a lock: an entry is
 * published by storing its end, then its start, and withdrawn start first. */
#define GUARD_MAPS 4096
static struct {
    _Atomic uintptr_t start, end;
    atomic_bool faulted;
} guard_maps[GUARD_MAPS];
static pthread_mutex_t guard_mu = PTHREAD_MUTEX_INITIALIZER;
static atomic_ullong guard_faults;
static long guard_page;

/* Returns the entry's number plus one, so that a zeroed map has none. */
static int guard_add(const void *data, size_t size) {
    if (!data) return 0;
    pthread_mutex_lock(&guard_mu);
    int slot = -1;
    for (int i = 0; i < GUARD_MAPS && slot < 0; i++)
        if (!atomic_load(&guard_maps[i].start)) slot = i;
    if (slot >= 0) {
        atomic_store(&guard_maps[slot].faulted, false);
        atomic_store(&guard_maps[slot].end, (uintptr_t)data + size);
        atomic_store(&guard_maps[slot].start, (uintptr_t)data);
    }
    pthread_mutex_unlock(&guard_mu);
    return slot + 1;
}

static void guard_remove(int guard) {
    if (guard <= 0) return;
    int slot = guard - 1;
    pthread_mutex_lock(&guard_mu);
    atomic_store(&guard_maps[slot].start, 0);
    atomic_store(&guard_maps[slot].end, 0);
    pthread_mutex_unlock(&guard_mu);
}

/* Async-signal-safe: atomics, mmap and sigaction only. */
static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr, pg = (uintptr_t)guard_page;
    for (int i = 0; i < GUARD_MAPS; i++) {
        uintptr_t from = atomic_load(&guard_maps[i].start), to = atomic_load(&guard_maps[i].end);
        if (!from || a < from || a >= to) continue;
        /* the file ends before this page: everything from here to the end
         * of the map is past it, so all of it becomes zeros at once */
        uintptr_t lo = a & ~(pg - 1), hi = (to + pg - 1) & ~(pg - 1);
        if (mmap((void *)lo, hi - lo, PROT_READ, MAP_FIXED | MAP_PRIVATE | MAP_ANONYMOUS, -1, 0) == MAP_FAILED) break;
        atomic_store(&guard_maps[i].faulted, true);
        atomic_fetch_add(&guard_faults, 1);
        return;
    }
    /* not a map's: the default action, once this handler returns */
    struct sigaction dfl;
    memset(&dfl, 0, sizeof dfl);
    dfl.sa_handler = SIG_DFL;
    sigaction(sig, &dfl, NULL);
    raise(sig);
}

enum sp_status sp_map_guard_install(void) {
    guard_page = sysconf(_SC_PAGESIZE);
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGBUS, &sa, NULL) != 0) return sp_errorf(SP_ERR_IO, "cannot take SIGBUS: %s", strerror(errno));
    return SP_OK;
}

uint64_t sp_map_faults(void) { return atomic_load(&guard_faults); }

bool sp_map_changed(const struct sp_map *m, char *why, size_t cap) {
    if (m->guard > 0 && atomic_load(&guard_maps[m->guard - 1].faulted)) {
        snprintf(why, cap, "a read went past its end (the file was truncated while mapped)");
        return true;
    }
    struct stat st;
    if (m->anon || m->fd < 0 || fstat(m->fd, &st) != 0) return false;
    if ((size_t)st.st_size != m->size) {
        snprintf(why, cap, "its size changed from %zu to %lld bytes", m->size, (long long)st.st_size);
        return true;
    }
    if ((int64_t)st.st_mtim.tv_sec * 1000000000 + st.st_mtim.tv_nsec != m->mtime_ns) {
        snprintf(why, cap, "it was modified in place");
        return true;
    }
    return false;
}

/* ---- maps ---- */

enum sp_status sp_map_open(const char *path, struct sp_map *m) {
    *m = (struct sp_map){.fd = -1};
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
    m->mtime_ns = (int64_t)stt.st_mtim.tv_sec * 1000000000 + stt.st_mtim.tv_nsec;
    if (m->size == 0) return SP_OK;
    void *p = map_aligned(m->fd, m->size);
    if (!p) goto fail_errno;
    m->data = p;
    m->guard = guard_add(p, m->size);
    return SP_OK;
fail_errno:;
    int e = errno;
    close(m->fd);
    m->fd = -1;
    return sp_errorf(SP_ERR_IO, "%s: %s", path, strerror(e));
}

void sp_map_close(struct sp_map *m) {
    if (!m) return;
    guard_remove(m->guard);
    m->guard = 0;
    if (m->data) munmap((void *)m->data, m->size);
    if (m->anon) sp_mem_account(SP_MEM_WEIGHTS, -(ptrdiff_t)m->anon_bytes);
    m->anon = false;
    m->anon_bytes = 0;
    if (m->fd >= 0) close(m->fd);
    sp_free(m->live);
    m->live = NULL;
    m->n_live = 0;
    m->data = NULL;
    m->size = 0;
    m->fd = -1;
}

/* Bytes sp_map_populate and sp_map_to_anon bring in at a time: the
 * granularity of their progress. */
#define LOAD_CHUNK ((size_t)64 << 20)
#define PAGE ((size_t)4096)

/* The spans of whole pages that m's reads touch: one for the whole map,
 * else one a range (neighbours may share a page). */
static size_t map_spans(const struct sp_map *m) { return m->live ? m->n_live : 1; }
static void map_span(const struct sp_map *m, size_t i, size_t *off, size_t *len) {
    size_t a = m->live ? m->live[i].off : 0, e = m->live ? m->live[i].off + m->live[i].len : m->size;
    a &= ~(PAGE - 1);
    e = (e + PAGE - 1) & ~(PAGE - 1);
    if (e > m->size) e = m->size;
    *off = a;
    *len = e > a ? e - a : 0;
}

size_t sp_map_live_bytes(const struct sp_map *m) {
    size_t n = 0, off, len;
    for (size_t i = 0; m->data && i < map_spans(m); i++) {
        map_span(m, i, &off, &len);
        n += len;
    }
    return n;
}

enum sp_status sp_map_keep(struct sp_map *m, const struct sp_map_range *r, size_t n) {
    if (!m->data || m->anon) return SP_OK;
    struct sp_map_range *live = sp_malloc((n ? n : 1) * sizeof *live, SP_MEM_MODEL);
    if (!live) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    memcpy(live, r, n * sizeof *live);
    sp_free(m->live);
    m->live = live;
    m->n_live = n;
    /* the pages between the ranges */
    for (size_t i = 0, from = 0; i <= n; i++) {
        size_t to = i < n ? r[i].off : m->size;
        if (to > from) sp_map_drop(m, from, to - from);
        if (i < n) from = r[i].off + r[i].len;
    }
    return SP_OK;
}

void sp_map_drop(const struct sp_map *m, size_t off, size_t len) {
    size_t a = (off + PAGE - 1) & ~(PAGE - 1), e = (off + len) & ~(PAGE - 1);
    if (m->data && e > a) (void)madvise((void *)(m->data + a), e - a, MADV_DONTNEED);
}

enum sp_status sp_map_populate(const struct sp_map *m, struct sp_progress *pr) {
    if (!m->data) return SP_OK;
#ifdef MADV_HUGEPAGE
    /* What the kernel reads for the map from here on goes into 2 MiB pages
     * where the file system and THP allow; pages the page cache already
     * holds in 4 KiB pieces stay so (sp_map_huge_bytes tells which). */
    (void)madvise((void *)m->data, m->size, MADV_HUGEPAGE);
#endif
    size_t i = 0, s0, sn;
#ifdef MADV_POPULATE_READ
    for (; i < map_spans(m); i++) {
        map_span(m, i, &s0, &sn);
        for (size_t off = s0; off < s0 + sn; off += LOAD_CHUNK) {
            size_t n = s0 + sn - off < LOAD_CHUNK ? s0 + sn - off : LOAD_CHUNK;
            if (madvise((void *)(m->data + off), n, MADV_POPULATE_READ) != 0) {
                if (errno == EINVAL && i == 0 && off == s0) goto touch;  // a kernel without it: the way below
                return sp_errorf(SP_ERR_IO, "mapping %zu bytes into memory: %s", m->size, strerror(errno));
            }
            if (pr) sp_progress_add(pr, n);
        }
    }
    return SP_OK;
touch:
#endif
    /* kernels before 5.14: ask for read-ahead, then touch a byte per page */
    for (; i < map_spans(m); i++) {
        map_span(m, i, &s0, &sn);
        (void)madvise((void *)(m->data + s0), sn, MADV_WILLNEED);
        unsigned char acc = 0;
        for (size_t off = s0; off < s0 + sn; off += LOAD_CHUNK) {
            size_t n = s0 + sn - off < LOAD_CHUNK ? s0 + sn - off : LOAD_CHUNK;
            for (size_t o = off; o < off + n; o += PAGE) acc ^= ((const volatile unsigned char *)m->data)[o];
            if (pr) sp_progress_add(pr, n);
        }
        (void)acc;
    }
    return SP_OK;
}

enum sp_status sp_map_to_anon(struct sp_map *m, sp_map_edit_fn edit, void *ctx, struct sp_progress *pr) {
    if (!m->data || m->anon) return SP_OK;
    size_t n = (m->size + 4095) & ~(size_t)4095;
    /* 2 MiB pages where the map has whole ones at 2 MiB boundaries */
    bool huge = !((uintptr_t)m->data & (HUGE_PAGE - 1)) && m->size >= HUGE_PAGE;
    char *b = huge ? reserve_aligned(n) : NULL;
    char *p = huge && !b ? MAP_FAILED
                         : mmap(b, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | (b ? MAP_FIXED : 0), -1, 0);
    if (p == MAP_FAILED) {
        int e = errno;
        if (b) munmap(b, n);
        return sp_errorf(SP_ERR_NOMEM, "%zu bytes of anonymous memory: %s", n, strerror(e));
    }
    b = p;
#ifdef MADV_HUGEPAGE
    if (huge) (void)madvise(b, n, MADV_HUGEPAGE);
#endif
    /* read the file (from the page cache where it is there) into the copy:
     * the pages still read; the others stay untouched, taking no memory */
    for (size_t i = 0; i < map_spans(m); i++) {
        size_t s0, sn;
        map_span(m, i, &s0, &sn);
        for (size_t off = s0; off < s0 + sn;) {
            size_t want = s0 + sn - off < LOAD_CHUNK ? s0 + sn - off : LOAD_CHUNK;
            ssize_t got = pread(m->fd, b + off, want, (off_t)off);
            if (got <= 0) {
                int e = got < 0 ? errno : EIO;
                munmap(b, n);
                return sp_errorf(SP_ERR_IO, "reading %zu bytes at %zu: %s", want, off,
                                 got < 0 ? strerror(e) : "file shrank");
            }
            off += (size_t)got;
            if (pr) sp_progress_add(pr, (size_t)got);
        }
    }
    if (edit) edit(ctx, m, (unsigned char *)b);
    if (mprotect(b, n, PROT_READ) != 0 ||
        mremap(b, n, n, MREMAP_MAYMOVE | MREMAP_FIXED, (void *)m->data) == MAP_FAILED) {
        int e = errno;
        munmap(b, n);
        return sp_errorf(SP_ERR_IO, "moving the copy over the map: %s", strerror(e));
    }
    m->anon = true;
    m->anon_bytes = sp_map_live_bytes(m);
    sp_mem_account(SP_MEM_WEIGHTS, (ptrdiff_t)m->anon_bytes);
    return SP_OK;
}

size_t sp_map_huge_bytes(const struct sp_map *m) { return sp_huge_bytes_in(m->data, m->size); }

size_t sp_huge_bytes_in(const void *p, size_t n) {
    if (!p) return 0;
    FILE *f = fopen("/proc/self/smaps", "r");
    if (!f) return 0;
    uintptr_t lo = (uintptr_t)p, hi = lo + n;
    char line[512];
    unsigned long long a, b, kb;
    size_t total = 0;
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx ", &a, &b) == 2)  // a map's first line; field names are not hex-dash-hex
            in = (uintptr_t)a >= lo && (uintptr_t)b <= ((hi + 4095) & ~(uintptr_t)4095);
        else if (in &&
                 (sscanf(line, "AnonHugePages: %llu kB", &kb) == 1 || sscanf(line, "FilePmdMapped: %llu kB", &kb) == 1))
            total += (size_t)kb * 1024;
    }
    fclose(f);
    return total;
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

const char *sp_path_not_file(const char *path) {
    struct stat s, l;
    if (stat(path, &s) != 0) {
        switch (errno) {
        case ELOOP: return "a symbolic link loop";
        case ENOENT: return lstat(path, &l) == 0 ? "a symbolic link to nothing" : "missing";
        case EACCES: return "not reachable (permission denied)";
        case ENOTDIR: return "missing (a folder in its path is a file)";
        default: return "not reachable";
        }
    }
    if (S_ISREG(s.st_mode)) return NULL;
    if (S_ISDIR(s.st_mode)) return "a directory";
    if (S_ISFIFO(s.st_mode)) return "a FIFO (named pipe)";
    if (S_ISSOCK(s.st_mode)) return "a socket";
    if (S_ISCHR(s.st_mode) || S_ISBLK(s.st_mode)) return "a device";
    return "not a regular file";
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
