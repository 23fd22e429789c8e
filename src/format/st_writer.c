/* st_writer.c - sharded safetensors writer. */
#include "format/st_writer.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/file.h"
#include "core/json.h"

void sp_st_writer_init(struct sp_st_writer *w, const char *dir, size_t shard_limit) {
    memset(w, 0, sizeof *w);
    w->dir = sp_strdup(dir, SP_MEM_MISC);
    w->shard_limit = shard_limit ? shard_limit : SIZE_MAX;
    w->fp_shard = -1;
}

void sp_st_writer_free(struct sp_st_writer *w) {
    if (!w) return;
    if (w->fp) fclose(w->fp);
    for (int64_t i = 0; i < w->n; i++) sp_free(w->tensors[i].name);
    sp_free(w->tensors);
    sp_free(w->dir);
    memset(w, 0, sizeof *w);
}

enum sp_status sp_st_writer_declare(struct sp_st_writer *w, const char *name, enum sp_dtype dtype, int ndim,
                                    const int64_t *shape) {
    if (!w->dir) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (ndim > SP_ST_MAX_DIMS) return sp_errorf(SP_ERR_ARG, "%s: %d dimensions", name, ndim);
    if (w->n == w->cap) {
        int64_t cap = w->cap ? w->cap * 2 : 64;
        size_t bytes = (size_t)cap * sizeof(struct sp_st_out);
        struct sp_st_out *t = w->tensors ? sp_realloc(w->tensors, bytes) : sp_malloc(bytes, SP_MEM_MISC);
        if (!t) return sp_errorf(SP_ERR_NOMEM, "out of memory");
        w->tensors = t;
        w->cap = cap;
    }
    struct sp_st_out *t = &w->tensors[w->n];
    memset(t, 0, sizeof *t);
    t->name = sp_strdup(name, SP_MEM_MISC);
    if (!t->name) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    t->dtype = dtype;
    t->ndim = ndim;
    size_t n = sp_dtype_size(dtype);
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        n *= (size_t)shape[i];
    }
    t->nbytes = n;
    w->n++;
    return SP_OK;
}

static char *shard_name(const struct sp_st_writer *w, int shard) {
    char name[64];
    if (w->n_shards == 1)
        snprintf(name, sizeof name, "model.safetensors");
    else
        snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", shard + 1, w->n_shards);
    return sp_strdup(name, SP_MEM_MISC);
}

static int cmp_out_name(const void *a, const void *b) {
    const struct sp_st_out *x = *(const struct sp_st_out *const *)a, *y = *(const struct sp_st_out *const *)b;
    return strcmp(x->name, y->name);
}

/* The JSON header of one shard, names sorted, padded to a multiple of 8. */
static enum sp_status shard_header(const struct sp_st_writer *w, int shard, struct sp_buf *out) {
    int64_t n = 0;
    for (int64_t i = 0; i < w->n; i++) n += w->tensors[i].shard == shard;
    const struct sp_st_out **v = sp_malloc((size_t)(n ? n : 1) * sizeof *v, SP_MEM_MISC);
    if (!v) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    n = 0;
    for (int64_t i = 0; i < w->n; i++)
        if (w->tensors[i].shard == shard) v[n++] = &w->tensors[i];
    qsort(v, (size_t)n, sizeof *v, cmp_out_name);
    struct sp_jw j;
    sp_jw_init(&j, out, 0);
    sp_jw_obj(&j);
    sp_jw_key(&j, "__metadata__");
    sp_jw_obj(&j);
    sp_jw_key(&j, "format");
    sp_jw_str(&j, "pt");
    sp_jw_end(&j);
    for (int64_t i = 0; i < n; i++) {
        sp_jw_key(&j, v[i]->name);
        sp_jw_obj(&j);
        sp_jw_key(&j, "dtype");
        sp_jw_str(&j, sp_dtype_name(v[i]->dtype));
        sp_jw_key(&j, "shape");
        sp_jw_arr(&j);
        for (int d = 0; d < v[i]->ndim; d++) sp_jw_int(&j, v[i]->shape[d]);
        sp_jw_end(&j);
        sp_jw_key(&j, "data_offsets");
        sp_jw_arr(&j);
        sp_jw_uint(&j, v[i]->offset);
        sp_jw_uint(&j, v[i]->offset + v[i]->nbytes);
        sp_jw_end(&j);
        sp_jw_end(&j);
    }
    sp_jw_end(&j);
    sp_free(v);
    while (out->len % 8) sp_buf_putc(out, ' ');
    return out->failed ? sp_errorf(SP_ERR_NOMEM, "out of memory") : SP_OK;
}

static enum sp_status write_index(const struct sp_st_writer *w) {
    struct sp_buf b = SP_BUF_INIT;
    struct sp_jw j;
    size_t total = 0;
    for (int64_t i = 0; i < w->n; i++) total += w->tensors[i].nbytes;
    const struct sp_st_out **v = sp_malloc((size_t)(w->n ? w->n : 1) * sizeof *v, SP_MEM_MISC);
    if (!v) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    for (int64_t i = 0; i < w->n; i++) v[i] = &w->tensors[i];
    qsort(v, (size_t)w->n, sizeof *v, cmp_out_name);
    sp_jw_init(&j, &b, 4);
    sp_jw_obj(&j);
    sp_jw_key(&j, "metadata");
    sp_jw_obj(&j);
    sp_jw_key(&j, "total_size");
    sp_jw_uint(&j, total);
    sp_jw_end(&j);
    sp_jw_key(&j, "weight_map");
    sp_jw_obj(&j);
    enum sp_status st = SP_OK;
    for (int64_t i = 0; i < w->n; i++) {
        char *s = shard_name(w, v[i]->shard);
        if (!s) {
            st = sp_errorf(SP_ERR_NOMEM, "out of memory");
            break;
        }
        sp_jw_key(&j, v[i]->name);
        sp_jw_str(&j, s);
        sp_free(s);
    }
    sp_jw_end(&j);
    sp_jw_end(&j);
    sp_buf_putc(&b, '\n');
    sp_free(v);
    if (st == SP_OK) st = sp_write_buf(w->dir, "model.safetensors.index.json", &b);
    sp_buf_free(&b);
    return st;
}

enum sp_status sp_st_writer_begin(struct sp_st_writer *w) {
    if (!w->dir) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    enum sp_status st = sp_mkdirs(w->dir);
    if (st != SP_OK) return st;
    /* Fill shards in declaration order; a tensor larger than the limit gets a shard of its own. */
    int shard = 0;
    size_t used = 0;
    for (int64_t i = 0; i < w->n; i++) {
        struct sp_st_out *t = &w->tensors[i];
        if (used > 0 && used + t->nbytes > w->shard_limit) {
            shard++;
            used = 0;
        }
        t->shard = shard;
        t->offset = used;
        used += t->nbytes;
    }
    w->n_shards = shard + 1;
    w->next = 0;
    if (w->n_shards > 1) return write_index(w);
    return SP_OK;
}

/* A shard that ends in skipped bytes is extended to its full size (a hole). */
static int close_shard(struct sp_st_writer *w) {
    if (!w->fp) return 0;
    int rc = 0;
    if (w->sparse) {
        off_t end = ftello(w->fp);
        rc = fflush(w->fp) != 0 || (end >= 0 && ftruncate(fileno(w->fp), end) != 0);
    }
    rc |= fclose(w->fp) != 0;
    w->fp = NULL;
    return rc;
}

static enum sp_status open_shard(struct sp_st_writer *w, int shard) {
    if (close_shard(w) != 0) return sp_errorf(SP_ERR_IO, "%s: write failed: %s", w->dir, strerror(errno));
    char *name = shard_name(w, shard);
    char *path = name ? sp_path_join(w->dir, name) : NULL;
    struct sp_buf hdr = SP_BUF_INIT;
    enum sp_status st = path ? shard_header(w, shard, &hdr) : sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) {
        w->fp = fopen(path, "wb");
        if (!w->fp) st = sp_errorf(SP_ERR_IO, "%s: %s", path, strerror(errno));
    }
    if (st == SP_OK) {
        unsigned char len8[8];
        uint64_t hl = hdr.len;
        for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hl >> (8 * i));
        if (fwrite(len8, 1, 8, w->fp) != 8 || fwrite(hdr.data, 1, hdr.len, w->fp) != hdr.len)
            st = sp_errorf(SP_ERR_IO, "%s: write failed: %s", path, strerror(errno));
    }
    w->fp_shard = shard;
    sp_buf_free(&hdr);
    sp_free(path);
    sp_free(name);
    return st;
}

enum sp_status sp_st_writer_write(struct sp_st_writer *w, const void *data, size_t nbytes) {
    const unsigned char *p = data;
    for (;;) {
        if (w->next >= w->n) {
            if (nbytes == 0) return SP_OK;
            return sp_errorf(SP_ERR_STATE, "safetensors writer: more bytes written than declared");
        }
        struct sp_st_out *t = &w->tensors[w->next];
        if (!w->fp || w->fp_shard != t->shard) {
            enum sp_status st = open_shard(w, t->shard);
            if (st != SP_OK) return st;
        }
        size_t take = t->nbytes - w->written < nbytes ? t->nbytes - w->written : nbytes;
        if (take && fwrite(p, 1, take, w->fp) != take)
            return sp_errorf(SP_ERR_IO, "%s: writing tensor %s: %s", w->dir, t->name, strerror(errno));
        p += take;
        nbytes -= take;
        w->written += take;
        if (w->written == t->nbytes) {
            w->next++;
            w->written = 0;
        }
        if (nbytes == 0) return SP_OK;
    }
}

enum sp_status sp_st_writer_skip(struct sp_st_writer *w, size_t nbytes) {
    while (nbytes) {
        if (w->next >= w->n) return sp_errorf(SP_ERR_STATE, "safetensors writer: more bytes skipped than declared");
        struct sp_st_out *t = &w->tensors[w->next];
        if (!w->fp || w->fp_shard != t->shard) {
            enum sp_status st = open_shard(w, t->shard);
            if (st != SP_OK) return st;
        }
        size_t take = t->nbytes - w->written < nbytes ? t->nbytes - w->written : nbytes;
        if (take && fseeko(w->fp, (off_t)take, SEEK_CUR) != 0)
            return sp_errorf(SP_ERR_IO, "%s: seeking past tensor %s: %s", w->dir, t->name, strerror(errno));
        w->sparse = true;
        nbytes -= take;
        w->written += take;
        if (w->written == t->nbytes) {
            w->next++;
            w->written = 0;
        }
        while (w->next < w->n && w->tensors[w->next].nbytes == 0) w->next++;
    }
    return SP_OK;
}

enum sp_status sp_st_writer_finish(struct sp_st_writer *w) {
    /* Zero-byte tensors at the end are complete without a write. */
    while (w->next < w->n && w->tensors[w->next].nbytes == 0) w->next++;
    if (w->next != w->n)
        return sp_errorf(SP_ERR_STATE, "safetensors writer: %lld of %lld tensors written", (long long)w->next,
                         (long long)w->n);
    if (w->n == 0) {
        enum sp_status st = open_shard(w, 0);
        if (st != SP_OK) return st;
    }
    if (close_shard(w) != 0) return sp_errorf(SP_ERR_IO, "%s: write failed: %s", w->dir, strerror(errno));
    return SP_OK;
}
