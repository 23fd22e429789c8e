/*
 * test_storage.c - every way the expert store reads the model files
 * (runtime/storage.h) reads the bytes the files hold: ranges at any offset
 * and length, up to the file's last byte (where an O_DIRECT read stops
 * short of its aligned span), many ranges in one read, and a range past the
 * end is an error that says so.
 */
#include "helpers.h"

#include "core/rng.h"
#include "format/modeldir.h"
#include "runtime/storage.h"

static void check_method(const struct sp_model_files *mf, enum sp_io_method io) {
    const struct sp_map *map = &mf->shards[0]->map;
    struct sp_storage *s;
    assert_int_equal(sp_storage_open(mf, io, 64 << 10, &s), SP_OK);
    struct sp_storage_reader *r;
    assert_int_equal(sp_storage_reader_open(s, &r), SP_OK);
    struct sp_rng rng;
    sp_rng_seed(&rng, 51 + (uint64_t)io);
    uint8_t *buf = malloc((size_t)SP_STORAGE_MAX_PARTS * 4096 + 1);
    for (int round = 0; round < 200; round++) {
        struct sp_storage_part p[SP_STORAGE_MAX_PARTS];
        int n = 1 + (int)(sp_rng_next(&rng) % SP_STORAGE_MAX_PARTS);
        size_t at = 0;
        for (int k = 0; k < n; k++) {
            size_t len = 1 + (size_t)(sp_rng_next(&rng) % 4096);
            if (len > map->size) len = map->size;
            uint64_t off = sp_rng_next(&rng) % (map->size - len + 1);
            if (round % 10 == 0 && k == 0) off = map->size - len;  // the file's last bytes
            p[k] = (struct sp_storage_part){.shard = 0, .off = off, .len = len, .dst = buf + at};
            at += len;
        }
        memset(buf, 0xa5, at);
        uint64_t bytes = 0;
        assert_int_equal(sp_storage_read(r, p, n, &bytes), SP_OK);
        assert_int_equal(bytes, at);
        for (int k = 0; k < n; k++)
            if (memcmp(p[k].dst, map->data + p[k].off, p[k].len) != 0)
                fail_msg("%s (%s): range %d of %d (%zu bytes at %llu) differs from the file", sp_io_method_name(io),
                         sp_storage_name(s), k, n, p[k].len, (unsigned long long)p[k].off);
    }
    struct sp_storage_part past = {.shard = 0, .off = map->size - 8, .len = 64, .dst = buf};
    uint64_t bytes = 0;
    assert_int_not_equal(sp_storage_read(r, &past, 1, &bytes), SP_OK);
    assert_non_null(strstr(sp_error_msg(), "end of file"));
    print_message("%s: read through %s%s\n", sp_io_method_name(io), sp_storage_name(s),
                  sp_storage_direct(s) ? ", O_DIRECT" : "");
    free(buf);
    sp_storage_reader_close(r);
    sp_storage_close(s);
}

static void test_methods(void **state) {
    struct sp_model_files *mf;
    assert_int_equal(sp_model_files_open("tests/fixtures/qwen3_moe", &mf), SP_OK);
    for (int io = 0; io < SP_IO_COUNT; io++) check_method(mf, (enum sp_io_method)io);
    sp_model_files_close(mf);
}

static void test_names(void **state) {
    struct sp_model_files *mf;
    assert_int_equal(sp_model_files_open("tests/fixtures/qwen3_moe", &mf), SP_OK);
    const char *want[SP_IO_COUNT] = {"uring", "uring", "pread", "mapped"};
    for (int io = 0; io < SP_IO_COUNT; io++) {
        struct sp_storage *s;
        assert_int_equal(sp_storage_open(mf, (enum sp_io_method)io, 4096, &s), SP_OK);
        /* uring falls back to pread where the kernel refuses io_uring */
        if (strcmp(want[io], "uring") != 0 || sp_storage_uring(s)) assert_string_equal(sp_storage_name(s), want[io]);
        assert_true(io == SP_IO_AUTO || !sp_storage_direct(s));
        sp_storage_close(s);
    }
    struct sp_storage *s;
    assert_int_not_equal(sp_storage_open(mf, SP_IO_COUNT, 4096, &s), SP_OK);
    sp_model_files_close(mf);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_methods),
        cmocka_unit_test(test_names),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
