/* storage.c - reading byte ranges of the model files: io_uring, pread or the
 * mappings (storage.h). */
#include "runtime/storage.h"

#include <errno.h>
#include <fcntl.h>
#include <liburing.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"

#define DIO_ALIGN 4096

struct sp_storage {
    const struct sp_storage_ops *ops;
    const struct sp_model_files *mf;
    bool direct;    // O_DIRECT descriptors for reads that bypass the page cache
    int *dfd;       // (n_shards) those descriptors, -1 where refused
    size_t bounce;  // bytes of each reader's bounce buffer (direct reads)
};

struct sp_storage_reader {
    struct sp_storage *s;
    struct io_uring ring;
    bool has_ring;
    uint8_t *bounce;  // DIO_ALIGN-aligned, s->bounce bytes (direct reads)
};

static int shard_fd(const struct sp_storage *s, int shard) { return s->mf->shards[shard]->map.fd; }

static enum sp_status pread_full(int fd, uint8_t *dst, size_t len, uint64_t off) {
    size_t done = 0;
    while (done < len) {
        ssize_t r = pread(fd, dst + done, len - done, (off_t)(off + done));
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0)
            return sp_errorf(SP_ERR_IO, "reading an expert from the model files: %s",
                             r < 0 ? strerror(errno) : "unexpected end of file");
        done += (size_t)r;
    }
    return SP_OK;
}

/* Where each direct part's aligned span lies in the file (a0, span) and in
 * the bounce buffer (boff); false where a part goes buffered. */
struct spans {
    uint64_t a0[SP_STORAGE_MAX_PARTS];
    size_t span[SP_STORAGE_MAX_PARTS], boff[SP_STORAGE_MAX_PARTS];
    bool direct[SP_STORAGE_MAX_PARTS];
};

static void plan_spans(const struct sp_storage_reader *r, const struct sp_storage_part *p, int n, struct spans *sp) {
    size_t used = 0;
    for (int k = 0; k < n; k++) {
        sp->a0[k] = p[k].off & ~(uint64_t)(DIO_ALIGN - 1);
        sp->span[k] = (size_t)(((p[k].off + p[k].len + DIO_ALIGN - 1) & ~(uint64_t)(DIO_ALIGN - 1)) - sp->a0[k]);
        sp->direct[k] = r->s->direct && r->s->dfd[p[k].shard] >= 0 && r->bounce && used + sp->span[k] <= r->s->bounce;
        sp->boff[k] = used;
        if (sp->direct[k]) used += sp->span[k];
    }
}

/* A direct read ends at the end of the file, which may be past the part. */
static bool direct_done(const struct spans *sp, const struct sp_storage_part *p, int k, ssize_t got) {
    return got >= 0 && (size_t)got >= (size_t)(p[k].off - sp->a0[k]) + p[k].len;
}

/* What a read did with each part (how[k]). */
enum { NOT_READ, READ_BUFFERED, READ_DIRECT };

static void copy_out(const struct sp_storage_reader *r, const struct spans *sp, const struct sp_storage_part *p, int k) {
    memcpy(p[k].dst, r->bounce + sp->boff[k] + (p[k].off - sp->a0[k]), p[k].len);
}

/* ---- uring ---- */

static enum sp_status uring_reader_open(struct sp_storage *s, struct sp_storage_reader *r) {
    r->has_ring = io_uring_queue_init(SP_STORAGE_MAX_PARTS, &r->ring, 0) == 0;
    return SP_OK;
}

static void uring_reader_close(struct sp_storage_reader *r) {
    if (r->has_ring) io_uring_queue_exit(&r->ring);
}

static void pread_read(struct sp_storage_reader *r, const struct sp_storage_part *p, int n, uint8_t *how);

static void uring_read(struct sp_storage_reader *r, const struct sp_storage_part *p, int n, uint8_t *how) {
    if (!r->has_ring) {
        pread_read(r, p, n, how);
        return;
    }
    struct spans sp;
    plan_spans(r, p, n, &sp);
    int queued = 0;
    for (int k = 0; k < n; k++) {
        struct io_uring_sqe *sqe = io_uring_get_sqe(&r->ring);
        if (!sqe) break;
        if (sp.direct[k])
            io_uring_prep_read(sqe, r->s->dfd[p[k].shard], r->bounce + sp.boff[k], (unsigned)sp.span[k], sp.a0[k]);
        else
            io_uring_prep_read(sqe, shard_fd(r->s, p[k].shard), p[k].dst, (unsigned)p[k].len, p[k].off);
        io_uring_sqe_set_data64(sqe, (uint64_t)k);
        queued++;
    }
    if (!queued || io_uring_submit_and_wait(&r->ring, (unsigned)queued) < 0) return;
    for (int c = 0; c < queued; c++) {
        struct io_uring_cqe *cqe;
        if (io_uring_wait_cqe(&r->ring, &cqe) != 0) break;
        int k = (int)io_uring_cqe_get_data64(cqe);
        if (k >= 0 && k < n) {
            if (sp.direct[k] && direct_done(&sp, p, k, cqe->res)) {
                copy_out(r, &sp, p, k);
                how[k] = READ_DIRECT;
            } else if (!sp.direct[k] && cqe->res >= 0 && (size_t)cqe->res >= p[k].len) {
                how[k] = READ_BUFFERED;
            }
        }
        io_uring_cqe_seen(&r->ring, cqe);
    }
}

/* ---- pread ---- */

static enum sp_status pread_reader_open(struct sp_storage *s, struct sp_storage_reader *r) { return SP_OK; }
static void pread_reader_close(struct sp_storage_reader *r) {}

/* Direct parts only: the rest go through sp_storage_read's plain pread. */
static void pread_read(struct sp_storage_reader *r, const struct sp_storage_part *p, int n, uint8_t *how) {
    struct spans sp;
    plan_spans(r, p, n, &sp);
    for (int k = 0; k < n; k++) {
        if (!sp.direct[k]) continue;
        ssize_t got = pread(r->s->dfd[p[k].shard], r->bounce + sp.boff[k], sp.span[k], (off_t)sp.a0[k]);
        if (!direct_done(&sp, p, k, got)) continue;
        copy_out(r, &sp, p, k);
        how[k] = READ_DIRECT;
    }
}

/* ---- mapped ---- */

static void mapped_read(struct sp_storage_reader *r, const struct sp_storage_part *p, int n, uint8_t *how) {
    for (int k = 0; k < n; k++) {
        const struct sp_map *m = &r->s->mf->shards[p[k].shard]->map;
        if (!m->data || p[k].off > m->size || p[k].len > m->size - p[k].off) continue;
        memcpy(p[k].dst, m->data + p[k].off, p[k].len);
        how[k] = READ_BUFFERED;
    }
}

static const struct sp_storage_ops storage_ops[SP_STORAGE_KIND_COUNT] = {
    [SP_STORAGE_URING] = {"uring", uring_reader_open, uring_reader_close, uring_read},
    [SP_STORAGE_PREAD] = {"pread", pread_reader_open, pread_reader_close, pread_read},
    [SP_STORAGE_MAPPED] = {"mapped", pread_reader_open, pread_reader_close, mapped_read},
};

/* ---- the interface ---- */

void sp_storage_close(struct sp_storage *s) {
    if (!s) return;
    for (int i = 0; s->dfd && i < s->mf->n_shards; i++)
        if (s->dfd[i] >= 0) close(s->dfd[i]);
    sp_free(s->dfd);
    sp_free(s);
}

enum sp_status sp_storage_open(const struct sp_model_files *mf, enum sp_io_method io, size_t max_read,
                               struct sp_storage **out) {
    *out = NULL;
    if ((unsigned)io >= SP_IO_COUNT) return sp_errorf(SP_ERR_ARG, "unknown read method");
    struct sp_storage *s = sp_calloc(1, sizeof *s, SP_MEM_MODEL);
    if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    s->mf = mf;
    enum sp_storage_kind kind = io == SP_IO_PREAD ? SP_STORAGE_PREAD : io == SP_IO_MAPPED ? SP_STORAGE_MAPPED : SP_STORAGE_URING;
    /* whether the kernel grants io_uring at all: else pread */
    if (kind == SP_STORAGE_URING) {
        struct io_uring probe;
        if (io_uring_queue_init(1, &probe, 0) == 0)
            io_uring_queue_exit(&probe);
        else
            kind = SP_STORAGE_PREAD;
    }
    s->ops = &storage_ops[kind];
    if (io == SP_IO_AUTO) {
        s->dfd = sp_malloc((size_t)mf->n_shards * sizeof *s->dfd, SP_MEM_MODEL);
        if (!s->dfd) {
            sp_storage_close(s);
            return sp_errorf(SP_ERR_NOMEM, "out of memory");
        }
        for (int i = 0; i < mf->n_shards; i++) {
            s->dfd[i] = open(mf->shards[i]->path, O_RDONLY | O_DIRECT | O_CLOEXEC);
            s->direct |= s->dfd[i] >= 0;
        }
        s->bounce = max_read + (size_t)SP_STORAGE_MAX_PARTS * 2 * DIO_ALIGN;
    }
    *out = s;
    return SP_OK;
}

enum sp_status sp_storage_reader_open(struct sp_storage *s, struct sp_storage_reader **out) {
    *out = NULL;
    struct sp_storage_reader *r = sp_calloc(1, sizeof *r, SP_MEM_MODEL);
    if (!r) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    r->s = s;
    if (s->direct && !(r->bounce = sp_malloc_aligned(s->bounce, DIO_ALIGN, SP_MEM_EXPERT_CACHE))) {
        sp_free(r);
        return sp_errorf(SP_ERR_NOMEM, "out of memory for the expert reader buffers");
    }
    enum sp_status st = s->ops->reader_open(s, r);
    if (st != SP_OK) {
        sp_free_aligned(r->bounce);
        sp_free(r);
        return st;
    }
    *out = r;
    return SP_OK;
}

void sp_storage_reader_close(struct sp_storage_reader *r) {
    if (!r) return;
    r->s->ops->reader_close(r);
    sp_free_aligned(r->bounce);
    sp_free(r);
}

enum sp_status sp_storage_read(struct sp_storage_reader *r, const struct sp_storage_part *parts, int n,
                               uint64_t *bytes) {
    SP_ASSERT(n <= SP_STORAGE_MAX_PARTS);
    uint8_t how[SP_STORAGE_MAX_PARTS] = {NOT_READ};
    r->s->ops->read(r, parts, n, how);
    bool mapped = r->s->ops == &storage_ops[SP_STORAGE_MAPPED];
    for (int k = 0; k < n; k++) {
        int fd = shard_fd(r->s, parts[k].shard);
        if (how[k] == NOT_READ) {
            enum sp_status st = pread_full(fd, parts[k].dst, parts[k].len, parts[k].off);
            if (st != SP_OK) return st;
        }
        if (how[k] != READ_DIRECT && !mapped) posix_fadvise(fd, (off_t)parts[k].off, (off_t)parts[k].len, POSIX_FADV_DONTNEED);
        *bytes += parts[k].len;
    }
    return SP_OK;
}

const char *sp_storage_name(const struct sp_storage *s) { return s->ops->name; }
bool sp_storage_uring(const struct sp_storage *s) { return s->ops == &storage_ops[SP_STORAGE_URING]; }
bool sp_storage_direct(const struct sp_storage *s) { return s->direct; }
