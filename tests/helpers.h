/*
 * helpers.h - shared by the cmocka test programs: temporary folders, files
 * from bytes, safetensors images from a header string, and the path of the
 * repository's shared/ data. Header-only; every test is one .c file.
 */
#ifndef SP_TESTS_HELPERS_H
#define SP_TESTS_HELPERS_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "backend/backend.h"
#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"

/* A fresh folder under $TMPDIR; removed by th_rmdir. Owned by the caller. */
static inline char *th_tmpdir(void) {
    const char *base = getenv("TMPDIR");
    char tmpl[512];
    snprintf(tmpl, sizeof tmpl, "%s/sparrow-test-XXXXXX", base && *base ? base : "/tmp");
    char *d = mkdtemp(tmpl);
    assert_non_null(d);
    return strdup(d);
}

static inline void th_rmdir(char *dir) {
    char cmd[1024];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    assert_int_equal(system(cmd), 0);
    free(dir);
}

static inline void th_write(const char *dir, const char *name, const void *data, size_t len) {
    char *p = sp_path_join(dir, name);
    FILE *f = fopen(p, "wb");
    assert_non_null(f);
    if (len) assert_int_equal(fwrite(data, 1, len, f), len);
    fclose(f);
    sp_free(p);
}

static inline void th_write_str(const char *dir, const char *name, const char *text) {
    th_write(dir, name, text, strlen(text));
}

/* A safetensors image: 8-byte length, the header text, then data_len bytes
 * (value i & 0xff). Owned by the caller (free). */
static inline unsigned char *th_safetensors(const char *header, size_t data_len, size_t *size) {
    size_t hl = strlen(header);
    *size = 8 + hl + data_len;
    unsigned char *b = malloc(*size);
    assert_non_null(b);
    for (int i = 0; i < 8; i++) b[i] = (unsigned char)((uint64_t)hl >> (8 * i));
    memcpy(b + 8, header, hl);
    for (size_t i = 0; i < data_len; i++) b[8 + hl + i] = (unsigned char)i;
    return b;
}

/* ../shared relative to the repository root (the tests run from there). */
static inline const char *th_shared(void) {
    const char *s = getenv("SPARROW_SHARED");
    return s && *s ? s : "../shared";
}

static inline int th_run(const char *fmt, ...) {
    char cmd[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(cmd, sizeof cmd, fmt, ap);
    va_end(ap);
    int rc = system(cmd);
    return WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
}

/* Whether a backend on device d can be made here: the build has it and
 * the machine has the device. When not, prints that tests on it were
 * skipped and why ("no CUDA device: ..."). */
static inline bool th_device_ready(enum sp_device d) {
    if (!sp_backend_ops(d)) {
        print_message("[ SKIPPED  ] %s backend: not in this build\n", sp_device_name(d));
        return false;
    }
    float inv_freq[1] = {1.0f};
    struct sp_backend_params p = {.shape = {.n_layers = 1, .d_model = 8, .vocab = 8, .n_heads = 1, .n_kv_heads = 1,
                                            .head_dim = 8, .mlp_width = 8, .rot_dims = 2, .inv_freq = inv_freq,
                                            .rope_scale = 1.0f},
                                  .n_ctx = 1, .n_seq = 1, .max_batch = 1};
    struct sp_backend *b;
    if (sp_backend_create(d, &p, &b) != SP_OK) {
        print_message("[ SKIPPED  ] %s backend: %s\n", sp_device_name(d), sp_error_msg());
        return false;
    }
    sp_backend_free(b);
    return true;
}

#endif
