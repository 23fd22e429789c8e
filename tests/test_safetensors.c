/* test_safetensors.c - strict safetensors parsing: valid files as mlx and
 * torch write them, every malformed-header case with its message, offsets
 * beyond 2^31, and sharded model folders. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include "core/rng.h"
#include "format/modeldir.h"
#include "format/safetensors.h"

static void expect_fail(const char *header, size_t data_len, enum sp_status want, const char *needle) {
    size_t size;
    unsigned char *b = th_safetensors(header, data_len, &size);
    struct sp_st_file *f = (void *)1;
    enum sp_status st = sp_st_parse(b, size, "x.safetensors", &f);
    if (st != want || !strstr(sp_error_msg(), needle))
        fail_msg("header %s: got status %d message \"%s\", wanted %d with \"%s\"", header, st, sp_error_msg(), want,
                 needle);
    assert_null(f);
    free(b);
}

static void test_valid(void **state) {
    /* mlx style: compact, keys sorted, no padding, data not in key order. */
    const char *h = "{\"__metadata__\":{\"format\":\"mlx\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[8,32]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[0,8]},"
                    "\"c\":{\"dtype\":\"U32\",\"shape\":[],\"data_offsets\":[32,36]},"
                    "\"d\":{\"dtype\":\"I8\",\"shape\":[0,5],\"data_offsets\":[36,36]}}";
    size_t size;
    unsigned char *b = th_safetensors(h, 36, &size);
    struct sp_st_file *f;
    assert_int_equal(sp_st_parse(b, size, "x", &f), SP_OK);
    assert_int_equal(f->n_tensors, 4);
    assert_string_equal(f->format, "mlx");
    const struct sp_st_tensor *a = sp_st_find(f, "a");
    assert_non_null(a);
    assert_int_equal(a->dtype, SP_DTYPE_F32);
    assert_int_equal(a->ndim, 2);
    assert_int_equal(a->shape[1], 3);
    assert_int_equal(a->nbytes, 24);
    assert_ptr_equal(a->data, b + 8 + strlen(h) + 8);
    assert_int_equal(sp_st_numel(a), 6);
    assert_int_equal(sp_st_numel(sp_st_find(f, "c")), 1);
    assert_null(sp_st_find(f, "d")->data);
    assert_null(sp_st_find(f, "missing"));
    sp_st_close(f);
    free(b);
    /* torch style: header padded with spaces to 8 bytes. */
    const char *h2 = "{\"w\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,4]}}      ";
    b = th_safetensors(h2, 4, &size);
    assert_int_equal(sp_st_parse(b, size, "x", &f), SP_OK);
    assert_null(f->format);
    sp_st_close(f);
    free(b);
}

/* A tensor named "" (found by the fuzzer: an empty key in a fresh map). */
static void test_empty_name(void **state) {
    size_t size;
    unsigned char *b = th_safetensors("{\"\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}", 2, &size);
    struct sp_st_file *f;
    assert_int_equal(sp_st_parse(b, size, "x", &f), SP_OK);
    assert_non_null(sp_st_find(f, ""));
    sp_st_close(f);
    free(b);
}

static void test_every_dtype(void **state) {
    static const char *names[] = {"F64", "F32", "F16", "BF16", "I64", "I32", "I16", "I8", "U8", "U32", "BOOL", "F8_E4M3", "F8_E5M2", "U16", "U64"};
    static const size_t sizes[] = {8, 4, 2, 2, 8, 4, 2, 1, 1, 4, 1, 1, 1, 2, 8};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) {
        char h[200];
        snprintf(h, sizeof h, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}", names[i], 3 * sizes[i]);
        size_t size;
        unsigned char *b = th_safetensors(h, 3 * sizes[i], &size);
        struct sp_st_file *f;
        assert_int_equal(sp_st_parse(b, size, "x", &f), SP_OK);
        assert_string_equal(sp_dtype_name(f->tensors[0].dtype), names[i]);
        sp_st_close(f);
        free(b);
    }
}

static void test_bad_headers(void **state) {
    expect_fail("{\"a\":", 0, SP_ERR_FORMAT, "invalid JSON at line 1, column");
    expect_fail("{", 0, SP_ERR_FORMAT, "does not start with");
    expect_fail("[1,2]", 0, SP_ERR_FORMAT, "does not start with '{'");
    expect_fail("{\"a\":1}", 0, SP_ERR_FORMAT, "tensor a: expected an object");
    expect_fail("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, SP_ERR_FORMAT, "\"dtype\" missing");
    expect_fail("{\"a\":{\"dtype\":\"F4\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1, SP_ERR_UNSUPPORTED, "unknown dtype \"F4\"");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[-1],\"data_offsets\":[0,4]}}", 4, SP_ERR_FORMAT, "shape[0] is not a non-negative integer");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, SP_ERR_FORMAT, "shape[0]");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":\"2\",\"data_offsets\":[0,4]}}", 4, SP_ERR_FORMAT, "\"shape\" missing or not an array");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, SP_ERR_UNSUPPORTED, "9 dimensions");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0]}}", 4, SP_ERR_FORMAT, "\"data_offsets\" must be");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,0]}}", 4, SP_ERR_FORMAT, "before begin");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,20]}}", 20, SP_ERR_FORMAT,
                "header says 2x3 F32 (24 bytes), data_offsets span 20 bytes");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]}}", 10, SP_ERR_FORMAT, "file truncated");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                12, SP_ERR_FORMAT, "overlaps");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}", 8, SP_ERR_FORMAT, "4 bytes before tensor a");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 9, SP_ERR_FORMAT, "cover 4 bytes but the data section holds 9");
    expect_fail("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                8, SP_ERR_FORMAT, "appears twice");
    expect_fail("{\"__metadata__\":{\"format\":1}}", 0, SP_ERR_FORMAT, "__metadata__.format");
    expect_fail("{\"a\":{\"dtype\":\"U8\",\"shape\":[4294967296,4294967296,4294967296],\"data_offsets\":[0,1]}}", 1,
                SP_ERR_FORMAT, "too large");
    expect_fail("{} garbage", 0, SP_ERR_FORMAT, "unexpected data after the value");
}

static void test_bad_lengths(void **state) {
    struct sp_st_file *f;
    unsigned char tiny[4] = {0};
    assert_int_equal(sp_st_parse(tiny, 4, "x", &f), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "too short"));
    unsigned char big[16] = {0x00, 0x00, 0x00, 0x10, 0, 0, 0, 0, '{', '}'};  // 256 MiB header
    assert_int_equal(sp_st_parse(big, 16, "x", &f), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "exceeds the"));
    unsigned char past[16] = {100, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
    assert_int_equal(sp_st_parse(past, 16, "x", &f), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "runs past the end"));
    assert_int_equal(sp_st_open("/nonexistent/x.safetensors", &f), SP_ERR_NOT_FOUND);
}

/* Random byte flips of a valid file must parse or fail cleanly. */
static void test_mutations(void **state) {
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},\"a\":{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24]},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[4],\"data_offsets\":[24,32]}}";
    size_t size;
    unsigned char *orig = th_safetensors(h, 32, &size);
    unsigned char *b = malloc(size);
    struct sp_rng r;
    sp_rng_seed(&r, 11);
    for (int it = 0; it < 3000; it++) {
        memcpy(b, orig, size);
        int flips = 1 + (int)(sp_rng_next(&r) % 4);
        for (int k = 0; k < flips; k++) b[sp_rng_next(&r) % size] = (unsigned char)sp_rng_next(&r);
        struct sp_st_file *f = NULL;
        if (sp_st_parse(b, size, "m", &f) == SP_OK) {
            for (int64_t i = 0; i < f->n_tensors; i++)
                assert_true(f->tensors[i].offset + f->tensors[i].nbytes <= size);
            sp_st_close(f);
        } else {
            assert_null(f);
        }
    }
    free(b);
    free(orig);
}

/* A sparse file whose tensor data ends past 2^31 bytes. */
static void test_offsets_beyond_2g(void **state) {
    char *dir = th_tmpdir();
    const uint64_t n = (1ull << 31) + 64;
    char h[200];
    snprintf(h, sizeof h, "{\"small\":{\"dtype\":\"U8\",\"shape\":[64],\"data_offsets\":[%llu,%llu]},"
             "\"big\":{\"dtype\":\"U8\",\"shape\":[%llu],\"data_offsets\":[0,%llu]}}",
             (unsigned long long)(n - 64), (unsigned long long)n, (unsigned long long)(n - 64), (unsigned long long)(n - 64));
    char *path = sp_path_join(dir, "big.safetensors");
    int fd = open(path, O_CREAT | O_WRONLY | O_TRUNC, 0644);
    assert_true(fd >= 0);
    uint64_t hl = strlen(h);
    unsigned char len8[8];
    for (int i = 0; i < 8; i++) len8[i] = (unsigned char)(hl >> (8 * i));
    assert_int_equal(write(fd, len8, 8), 8);
    assert_int_equal(write(fd, h, hl), (ssize_t)hl);
    unsigned char tail = 0x5a;
    assert_int_equal(pwrite(fd, &tail, 1, (off_t)(8 + hl + n - 1)), 1);
    close(fd);
    struct sp_st_file *f;
    assert_int_equal(sp_st_open(path, &f), SP_OK);
    const struct sp_st_tensor *s = sp_st_find(f, "small");
    assert_int_equal(s->offset, 8 + hl + n - 64);
    assert_int_equal(((const unsigned char *)s->data)[63], 0x5a);
    assert_int_equal(sp_st_find(f, "big")->nbytes, n - 64);
    sp_st_close(f);
    sp_free(path);
    th_rmdir(dir);
}

static void write_st(const char *dir, const char *name, const char *header, size_t data_len) {
    size_t size;
    unsigned char *b = th_safetensors(header, data_len, &size);
    th_write(dir, name, b, size);
    free(b);
}

#define ONE(nm, off) "\"" nm "\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[" #off ",4]}"

static void test_sharded_folder(void **state) {
    char *dir = th_tmpdir();
    th_write_str(dir, "config.json", "{\"model_type\":\"llama\"}");
    write_st(dir, "model-00001-of-00002.safetensors", "{" ONE("a", 0) "}", 4);
    write_st(dir, "model-00002-of-00002.safetensors", "{" ONE("b", 0) "}", 4);
    th_write_str(dir, "model.safetensors.index.json",
                 "{\"metadata\":{\"total_size\":8},\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\","
                 "\"b\":\"model-00002-of-00002.safetensors\"}}");
    struct sp_model_files *mf;
    assert_int_equal(sp_model_files_open(dir, &mf), SP_OK);
    assert_int_equal(mf->n_shards, 2);
    assert_int_equal(mf->n_tensors, 2);
    assert_non_null(sp_model_files_find(mf, "b"));
    sp_model_files_close(mf);

    /* the index names a tensor that its shard lacks */
    th_write_str(dir, "model.safetensors.index.json",
                 "{\"weight_map\":{\"a\":\"model-00001-of-00002.safetensors\",\"b\":\"model-00001-of-00002.safetensors\"}}");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "tensor b should be in model-00001-of-00002.safetensors"));
    /* a missing shard */
    th_write_str(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"model-00009-of-00009.safetensors\"}}");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "shard model-00009-of-00009.safetensors (holding tensor a) is missing"));
    /* a shard name that leaves the folder */
    th_write_str(dir, "model.safetensors.index.json", "{\"weight_map\":{\"a\":\"../x.safetensors\"}}");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    /* invalid index JSON */
    th_write_str(dir, "model.safetensors.index.json", "{\"weight_map\":");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "model.safetensors.index.json: invalid JSON"));
    /* no index: every .safetensors file; a tensor in two files is an error */
    char *idx = sp_path_join(dir, "model.safetensors.index.json");
    unlink(idx);
    sp_free(idx);
    assert_int_equal(sp_model_files_open(dir, &mf), SP_OK);
    sp_model_files_close(mf);
    write_st(dir, "model-00002-of-00002.safetensors", "{" ONE("a", 0) "}", 4);
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "tensor a is in both"));
    /* a truncated shard names the file and the tensor */
    write_st(dir, "model-00002-of-00002.safetensors", "{" ONE("b", 0) "}", 2);
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "model-00002-of-00002.safetensors: tensor b: data ends at byte 4"));
    th_rmdir(dir);
}

static void test_folder_errors(void **state) {
    char *dir = th_tmpdir();
    struct sp_model_files *mf;
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "no config.json"));
    /* something else where config.json should be says what it is; a FIFO is not opened (that would block) */
    char *cfg = sp_path_join(dir, "config.json");
    static const struct {
        int kind;  // 0 directory, 1 FIFO, 2 symlink loop, 3 dangling symlink
        const char *says;
    } cases[] = {{0, "config.json is a directory, not a file"}, {1, "config.json is a FIFO (named pipe), not a file"},
                 {2, "config.json is a symbolic link loop, not a file"}, {3, "config.json is a symbolic link to nothing"}};
    for (size_t i = 0; i < sizeof cases / sizeof *cases; i++) {
        switch (cases[i].kind) {
        case 0: assert_int_equal(mkdir(cfg, 0755), 0); break;
        case 1: assert_int_equal(mkfifo(cfg, 0644), 0); break;
        case 2: assert_int_equal(symlink("config.json", cfg), 0); break;
        case 3: assert_int_equal(symlink("other.json", cfg), 0); break;
        }
        assert_int_not_equal(sp_model_files_open(dir, &mf), SP_OK);
        if (!strstr(sp_error_msg(), cases[i].says)) fail_msg("got \"%s\", wanted \"%s\"", sp_error_msg(), cases[i].says);
        assert_int_equal(cases[i].kind == 0 ? rmdir(cfg) : unlink(cfg), 0);
    }
    sp_free(cfg);
    th_write_str(dir, "config.json", "{\"model_type\": ");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    assert_non_null(strstr(sp_error_msg(), "config.json: invalid JSON at line 1"));
    th_write_str(dir, "config.json", "[]");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_FORMAT);
    th_write_str(dir, "config.json", "{}");
    assert_int_equal(sp_model_files_open(dir, &mf), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "no .safetensors files"));
    th_rmdir(dir);
}

/* Page faults this thread took while reading one byte of every page of m. */
static long faults_reading(const struct sp_map *m) {
    struct rusage a, b;
    long page = sysconf(_SC_PAGESIZE);
    unsigned acc = 0;
    getrusage(RUSAGE_THREAD, &a);
    for (size_t o = 0; o < m->size; o += (size_t)page) acc += ((const volatile unsigned char *)m->data)[o];
    getrusage(RUSAGE_THREAD, &b);
    assert_int_equal(acc, 0);
    return (b.ru_minflt - a.ru_minflt) + (b.ru_majflt - a.ru_majflt);
}

/* A populated map is read without the page faults a plain one takes. */
static void test_map_populate(void **state) {
    (void)state;
    char *dir = th_tmpdir();
    size_t size = (size_t)8 << 20;
    unsigned char *zeros = calloc(1, size);
    assert_non_null(zeros);
    th_write(dir, "w.bin", zeros, size);
    free(zeros);
    char *path = sp_path_join(dir, "w.bin");
    struct sp_map plain, populated;
    assert_int_equal(sp_map_open(path, &plain), SP_OK);
    long before = faults_reading(&plain);
    assert_int_equal(sp_map_open(path, &populated), SP_OK);
    assert_int_equal(sp_map_populate(&populated, NULL), SP_OK);
    long after = faults_reading(&populated);
    print_message("faults reading 8 MiB: %ld plain, %ld populated\n", before, after);
    /* the difference: under AddressSanitizer both reads also fault in the
     * shadow pages of the mapping (one per 32 KiB read) */
    assert_true(before - after >= 16);
    sp_map_close(&plain);
    sp_map_close(&populated);
    struct sp_map empty;
    th_write(dir, "empty.bin", "", 0);
    char *epath = sp_path_join(dir, "empty.bin");
    assert_int_equal(sp_map_open(epath, &empty), SP_OK);
    assert_int_equal(sp_map_populate(&empty, NULL), SP_OK);
    sp_map_close(&empty);
    sp_free(epath);
    sp_free(path);
    th_rmdir(dir);
}

/* Bytes of a kB field ("FilePmdMapped:") of the map starting at `at`. */
static size_t smaps_field(const void *at, const char *field) {
    FILE *f = fopen("/proc/self/smaps", "r");
    assert_non_null(f);
    char line[512];
    size_t total = 0, n = strlen(field);
    unsigned long long kb, lo, hi;
    bool in = false;
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "%llx-%llx ", &lo, &hi) == 2)  // a map's first line; field names are not hex-dash-hex
            in = (uintptr_t)lo == (uintptr_t)at;
        else if (in && strncmp(line, field, n) == 0 && sscanf(line + n, "%llu kB", &kb) == 1)
            total += (size_t)kb * 1024;
    }
    fclose(f);
    return total;
}
/* A file of `mib` MiB of ones in dir, not in the page cache (written out,
 * then dropped), so that a map reads it afresh under its advice. */
static char *uncached_file(const char *dir, const char *name, size_t mib) {
    size_t size = mib << 20;
    unsigned char *ones = malloc(size);
    assert_non_null(ones);
    memset(ones, 1, size);
    th_write(dir, name, ones, size);
    free(ones);
    char *path = sp_path_join(dir, name);
    int fd = open(path, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(fdatasync(fd), 0);
    (void)posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    close(fd);
    return path;
}

/* Populating asks for 2 MiB pages: where the kernel gives them to a file
 * map advised by hand, a populated map has them too, and sp_map_huge_bytes
 * says so as the kernel does. Buffers from sp_malloc_huge are aligned to 2
 * MiB, accounted and whole. */
static void test_huge_pages(void **state) {
    (void)state;
    char *dir = th_tmpdir();
    char *probe_path = uncached_file(dir, "probe.bin", 8), *path = uncached_file(dir, "w.bin", 8);
    struct sp_map probe, m;
    assert_int_equal(sp_map_open(probe_path, &probe), SP_OK);
    (void)madvise((void *)probe.data, probe.size, MADV_HUGEPAGE);
    for (size_t o = 0; o < probe.size; o += 4096) assert_int_equal(probe.data[o], 1);
    assert_int_equal(sp_map_open(path, &m), SP_OK);
    assert_int_equal(sp_map_populate(&m, NULL), SP_OK);
    size_t kernel_gives = smaps_field(probe.data, "FilePmdMapped:"), got = smaps_field(m.data, "FilePmdMapped:");
    print_message("8 MiB files read afresh: %zu bytes in 2 MiB pages advised by hand, %zu populated\n", kernel_gives, got);
    if (kernel_gives) assert_true(got >= (size_t)4 << 20);  // all but a partial first and last 2 MiB
    assert_int_equal(sp_map_huge_bytes(&m), got);
    for (size_t o = 0; o < m.size; o += 4096) assert_int_equal(m.data[o], 1);
    sp_map_close(&probe);
    sp_map_close(&m);
    sp_free(probe_path);
    sp_free(path);
    th_rmdir(dir);

    size_t before = sp_mem_used(SP_MEM_KV), n = ((size_t)3 << 20) + 5;
    unsigned char *b = sp_malloc_huge(n, SP_MEM_KV);
    assert_non_null(b);
    assert_true((uintptr_t)b % ((uintptr_t)2 << 20) == 0);
    assert_int_equal(sp_mem_used(SP_MEM_KV), before + n);
    memset(b, 7, n);
    assert_int_equal(b[n - 1], 7);
    sp_free_aligned(b);
    unsigned char *small = sp_malloc_huge(100, SP_MEM_KV);
    assert_non_null(small);
    assert_true((uintptr_t)small % 64 == 0);
    sp_free_aligned(small);
    assert_int_equal(sp_mem_used(SP_MEM_KV), before);
}

/* sp_map_edit_fn for test_map_to_anon: flips the first byte, notes what it got */
struct edit_seen {
    const struct sp_map *map;
    size_t size;
};
static void flip_first(void *ctx, const struct sp_map *m, unsigned char *copy) {
    struct edit_seen *e = ctx;
    e->map = m;
    e->size = m->size;
    copy[0] = (unsigned char)~copy[0];
}

/* A map of 2 MiB or more starts on a 2 MiB boundary; sp_map_to_anon puts
 * the same bytes at the same address in anonymous memory (edited first
 * where asked), counted as weights until the map is closed. */
/* A file that shrinks under its map: with the guard, reading past the new
 * end gives zeros instead of SIGBUS, and the map says it changed. */
static void test_map_guard(void **state) {
    char *dir = th_tmpdir();
    char *path = sp_path_join(dir, "shrinks.bin");
    size_t size = 256 << 10;
    unsigned char *bytes = malloc(size);
    for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 7 + 1);
    th_write(dir, "shrinks.bin", bytes, size);
    assert_int_equal(sp_map_guard_install(), SP_OK);
    struct sp_map m;
    assert_int_equal(sp_map_open(path, &m), SP_OK);
    char why[200];
    assert_false(sp_map_changed(&m, why, sizeof why));
    assert_int_equal(m.data[size - 1], bytes[size - 1]);
    assert_int_equal(truncate(path, 8192), 0);
    /* the size moved: said before any read faults */
    assert_true(sp_map_changed(&m, why, sizeof why));
    assert_non_null(strstr(why, "its size changed from 262144 to 8192 bytes"));
    uint64_t faults = sp_map_faults();
    unsigned sum = 0;
    for (size_t i = 0; i < size; i += 4096) sum += m.data[i];
    assert_int_equal(sp_map_faults(), faults + 1);  // one fault: the rest of the map became zeros at once
    assert_int_equal(sum, bytes[0] + bytes[4096]);  // the two pages left in the file, then zeros
    assert_true(sp_map_changed(&m, why, sizeof why));
    assert_non_null(strstr(why, "a read went past its end"));
    sp_map_close(&m);
    /* a new map of the file is a new entry: not faulted, not changed */
    assert_int_equal(sp_map_open(path, &m), SP_OK);
    assert_false(sp_map_changed(&m, why, sizeof why));
    sp_map_close(&m);
    free(bytes);
    sp_free(path);
    th_rmdir(dir);
}

static void test_map_to_anon(void **state) {
    (void)state;
    char *dir = th_tmpdir();
    size_t size = ((size_t)5 << 20) + 123;
    unsigned char *bytes = malloc(size);
    assert_non_null(bytes);
    for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 2654435761u >> 13);
    th_write(dir, "w.bin", bytes, size);
    th_write(dir, "small.bin", bytes, 4096);
    char *path = sp_path_join(dir, "w.bin"), *small_path = sp_path_join(dir, "small.bin");
    struct sp_map m, small;
    assert_int_equal(sp_map_open(path, &m), SP_OK);
    assert_true((uintptr_t)m.data % ((uintptr_t)2 << 20) == 0);
    const unsigned char *at = m.data;
    size_t before = sp_mem_used(SP_MEM_WEIGHTS);
    assert_int_equal(sp_map_to_anon(&m, NULL, NULL, NULL), SP_OK);
    assert_true(m.anon);
    assert_ptr_equal(m.data, at);
    assert_int_equal(m.size, size);
    assert_memory_equal(m.data, bytes, size);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before + size);
    assert_true(smaps_field(m.data, "Anonymous:") >= (size & ~(size_t)4095));
    size_t huge = sp_map_huge_bytes(&m);
    print_message("5 MiB copied: %zu bytes in 2 MiB pages\n", huge);
    assert_int_equal(huge, smaps_field(m.data, "AnonHugePages:"));
    assert_int_equal(sp_map_to_anon(&m, NULL, NULL, NULL), SP_OK);  // a copy already: nothing to do
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before + size);
    sp_map_close(&m);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before);

    /* a small map is copied too (in 4 KiB pages), through an edit */
    assert_int_equal(sp_map_open(small_path, &small), SP_OK);
    at = small.data;
    struct edit_seen seen = {0};
    assert_int_equal(sp_map_to_anon(&small, flip_first, &seen, NULL), SP_OK);
    assert_true(small.anon);
    assert_ptr_equal(small.data, at);
    assert_ptr_equal(seen.map, &small);
    assert_int_equal(seen.size, 4096);
    assert_int_equal(small.data[0], (unsigned char)~bytes[0]);
    assert_memory_equal(small.data + 1, bytes + 1, 4095);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before + 4096);
    sp_map_close(&small);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before);
    free(bytes);
    sp_free(path);
    sp_free(small_path);
    th_rmdir(dir);
}

/* A map narrowed to some ranges (sp_map_keep) reads them as before; its
 * copy holds the pages they touch and no others (the rest read as zeros),
 * and counts those pages as weights memory; populate touches them only. */
static void test_map_keep(void **state) {
    (void)state;
    char *dir = th_tmpdir();
    size_t size = ((size_t)6 << 20) + 321;
    unsigned char *bytes = malloc(size);
    assert_non_null(bytes);
    for (size_t i = 0; i < size; i++) bytes[i] = (unsigned char)(i * 2654435761u >> 13) | 1;  // no zeros
    th_write(dir, "w.bin", bytes, size);
    char *path = sp_path_join(dir, "w.bin");
    struct sp_map m;
    assert_int_equal(sp_map_open(path, &m), SP_OK);
    assert_int_equal(sp_map_live_bytes(&m), size);
    (void)m.data[(size_t)3 << 20];  // a page of the part dropped, read once
    const struct sp_map_range keep[] = {{100, 200}, {(size_t)4 << 20, 10000}, {size - 21, 21}};
    assert_int_equal(sp_map_keep(&m, keep, 3), SP_OK);
    size_t pages = 4096 + 12288 + (size - ((size - 21) & ~(size_t)4095));
    assert_int_equal(sp_map_live_bytes(&m), pages);
    for (int k = 0; k < 3; k++) assert_memory_equal(m.data + keep[k].off, bytes + keep[k].off, keep[k].len);
    assert_int_equal(sp_map_populate(&m, NULL), SP_OK);
    size_t before = sp_mem_used(SP_MEM_WEIGHTS);
    assert_int_equal(sp_map_to_anon(&m, NULL, NULL, NULL), SP_OK);
    assert_int_equal(m.anon_bytes, pages);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before + pages);
    for (int k = 0; k < 3; k++) assert_memory_equal(m.data + keep[k].off, bytes + keep[k].off, keep[k].len);
    assert_int_equal(m.data[(size_t)1 << 20], 0);  // never copied
    assert_int_equal(m.data[(size_t)3 << 20], 0);
    assert_int_equal(sp_map_populate(&m, NULL), SP_OK);
    assert_true(smaps_field(m.data, "Rss:") <= ((size_t)4 << 20) + 65536);  // two 2 MiB pages at most, not 6 MiB
    sp_map_close(&m);
    assert_int_equal(sp_mem_used(SP_MEM_WEIGHTS), before);
    free(bytes);
    sp_free(path);
    th_rmdir(dir);
}

static void test_hf_cache(void **state) {
    char *root = th_tmpdir();
    char path[1024], hub[1024];
    snprintf(path, sizeof path, "%s/hub/models--org--name/snapshots/abc123", root);
    assert_int_equal(sp_mkdirs(path), SP_OK);
    snprintf(path, sizeof path, "%s/hub/models--org--name/refs", root);
    assert_int_equal(sp_mkdirs(path), SP_OK);
    th_write_str(path, "main", "abc123\n");
    snprintf(hub, sizeof hub, "%s/hub", root);
    char *dir;
    /* refs/main names the snapshot */
    assert_int_equal(sp_model_resolve("org/name", hub, &dir), SP_OK);
    snprintf(path, sizeof path, "%s/hub/models--org--name/snapshots/abc123", root);
    assert_string_equal(dir, path);
    sp_free(dir);
    /* a commit given directly */
    assert_int_equal(sp_model_resolve("org/name@abc123", hub, &dir), SP_OK);
    sp_free(dir);
    /* a folder is itself, whatever the cache */
    assert_int_equal(sp_model_resolve(path, NULL, &dir), SP_OK);
    assert_string_equal(dir, path);
    sp_free(dir);
    /* without a cache an id is not looked up */
    assert_int_equal(sp_model_resolve("org/name", NULL, &dir), SP_ERR_NOT_FOUND);
    assert_null(strstr(sp_error_msg(), "Hugging Face"));
    /* another cache: says where it looked */
    snprintf(path, sizeof path, "%s/elsewhere", root);
    assert_int_equal(sp_model_resolve("org/name", path, &dir), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), path));
    assert_non_null(strstr(sp_error_msg(), "no folder for this repository"));
    /* refs pointing at a missing snapshot */
    snprintf(path, sizeof path, "%s/hub/models--org--name/refs", root);
    th_write_str(path, "main", "deadbeef");
    assert_int_equal(sp_model_resolve("org/name", hub, &dir), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "the snapshot that refs points to is missing"));
    /* not an id and not a folder */
    assert_int_equal(sp_model_resolve("no/such/thing", hub, &dir), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "not a Hugging Face id"));
    th_rmdir(root);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_valid),          cmocka_unit_test(test_empty_name),
        cmocka_unit_test(test_every_dtype),
        cmocka_unit_test(test_bad_headers),    cmocka_unit_test(test_bad_lengths),
        cmocka_unit_test(test_mutations),      cmocka_unit_test(test_offsets_beyond_2g),
        cmocka_unit_test(test_sharded_folder), cmocka_unit_test(test_folder_errors),
        cmocka_unit_test(test_hf_cache),       cmocka_unit_test(test_map_populate),
        cmocka_unit_test(test_huge_pages),
        cmocka_unit_test(test_map_guard),
        cmocka_unit_test(test_map_to_anon),
        cmocka_unit_test(test_map_keep),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
