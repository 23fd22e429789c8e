/*
 * test_tokenizer_detok.c - properties of the streaming detokenizer.
 *
 * For every id sequence tried, and every prefix of it: the deltas pushed so
 * far, followed by what sp_detok_peek holds back, equal the full decode of
 * that prefix; and every delta is valid UTF-8. Sequences: random ids
 * (uniform, and biased to byte tokens and special tokens), the encodings of
 * every test vector and corpus case, and texts spelled one byte token at a
 * time so that emoji and CJK characters are split across tokens. Tokenizers:
 * Qwen3 and gpt-oss (ByteLevel), Llama 3 (ByteLevel with
 * clean_up_tokenization_spaces) and Mistral (SentencePiece decoders:
 * Replace, ByteFallback, Fuse, Strip), with and without skipping specials.
 */
#include "tok_util.h"

#include "core/rng.h"
#include "core/utf8.h"
#include "tokenizer/detok.h"
#include "tokenizer/pretok.h"

static const char *const PKGS[] = {"qwen3", "llama3", "llama2", "gptoss"};
#define N_PKGS 4

static struct sp_tokenizer *toks[N_PKGS];

static int setup(void **state) {
    for (int i = 0; i < N_PKGS; i++) toks[i] = tu_load_pkg(PKGS[i]);
    return 0;
}

static int teardown(void **state) {
    for (int i = 0; i < N_PKGS; i++) sp_tokenizer_free(toks[i]);
    return 0;
}

/* Streams ids through a detokenizer and checks the property at every prefix. */
static void check_stream(struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags, const char *what) {
    struct sp_detok *d;
    assert_int_equal(sp_detok_new(t, flags, &d), SP_OK);
    struct sp_buf acc = SP_BUF_INIT, delta = SP_BUF_INIT, peek = SP_BUF_INIT, full = SP_BUF_INIT;
    sp_buf_reserve(&acc, 0);
    for (int64_t k = 0; k < n; k++) {
        sp_buf_clear(&delta);
        enum sp_status st = sp_detok_push(d, ids[k], &delta);
        if (st != SP_OK) fail_msg("%s: push of id %d at %lld: %s", what, ids[k], (long long)k, sp_error_msg());
        if (!sp_utf8_valid(delta.data ? delta.data : "", delta.len))
            fail_msg("%s: delta at %lld is not valid UTF-8", what, (long long)k);
        sp_buf_append(&acc, delta.data ? delta.data : "", delta.len);
        sp_buf_clear(&peek);
        sp_buf_append(&peek, acc.data, acc.len);
        assert_int_equal(sp_detok_peek(d, &peek), SP_OK);
        sp_buf_clear(&full);
        assert_int_equal(sp_tokenizer_decode(t, ids, k + 1, flags, &full), SP_OK);
        if (peek.len != full.len || memcmp(peek.data ? peek.data : "", full.data ? full.data : "", full.len) != 0) {
            fail_msg("%s (flags %u): after %lld ids the stream gives\n  [%s]\nthe decode gives\n  [%s]", what, flags,
                     (long long)k + 1, peek.data ? peek.data : "", full.data ? full.data : "");
        }
    }
    /* flush = peek, and restarts the text. */
    sp_buf_clear(&delta);
    assert_int_equal(sp_detok_flush(d, &delta), SP_OK);
    sp_buf_append(&acc, delta.data ? delta.data : "", delta.len);
    assert_int_equal(acc.len, full.len);
    if (n > 0) {
        sp_buf_clear(&delta);
        assert_int_equal(sp_detok_push(d, ids[0], &delta), SP_OK);
        assert_int_equal(sp_detok_flush(d, &delta), SP_OK);
        sp_buf_clear(&full);
        assert_int_equal(sp_tokenizer_decode(t, ids, 1, flags, &full), SP_OK);
        assert_int_equal(delta.len, full.len);
    }
    sp_buf_free(&acc);
    sp_buf_free(&delta);
    sp_buf_free(&peek);
    sp_buf_free(&full);
    sp_detok_free(d);
}

static void check_both(struct sp_tokenizer *t, const int32_t *ids, int64_t n, const char *what) {
    check_stream(t, ids, n, 0, what);
    check_stream(t, ids, n, SP_TOK_SKIP_SPECIAL, what);
}

/* A random id: uniform, or (one time in three) a byte token or special. */
static int32_t random_id(struct sp_tokenizer *t, struct sp_rng *r, const int32_t *bytes, const int32_t *specials,
                         int nspecial) {
    uint64_t x = sp_rng_next(r);
    int64_t v = sp_tokenizer_vocab_size(t);
    for (;;) {
        int32_t id;
        if (x % 6 == 0) id = bytes[(x >> 8) & 255];
        else if (x % 6 == 1 && nspecial) id = specials[(x >> 8) % (uint64_t)nspecial];
        else id = (int32_t)((x >> 8) % (uint64_t)v);
        size_t len;
        if (id >= 0 && sp_tokenizer_token(t, id, &len)) return id;
        x = sp_rng_next(r);
    }
}

/* The token standing for each single byte: the byte-level character, or
 * the <0xXX> byte-fallback token. */
static void byte_tokens(struct sp_tokenizer *t, int32_t out[256]) {
    for (int b = 0; b < 256; b++) {
        char s[8];
        int n = sp_utf8_encode(sp_bytelevel_cp((uint8_t)b), s);
        out[b] = sp_tokenizer_lookup(t, s, (size_t)n);
        if (out[b] < 0) {
            snprintf(s, sizeof s, "<0x%02X>", b);
            out[b] = sp_tokenizer_lookup(t, s, 6);
        }
        assert_true(out[b] >= 0);
    }
}

static void test_random_ids(void **state) {
    struct sp_rng r;
    sp_rng_seed(&r, 1234);
    for (int p = 0; p < N_PKGS; p++) {
        struct sp_tokenizer *t = toks[p];
        int32_t bytes[256], specials[64];
        int ns = 0;
        byte_tokens(t, bytes);
        for (int64_t id = 0; id < sp_tokenizer_vocab_size(t) && ns < 64; id++)
            if (sp_tokenizer_is_special(t, (int32_t)id)) specials[ns++] = (int32_t)id;
        for (int iter = 0; iter < 60; iter++) {
            int32_t ids[48];
            int n = 1 + (int)(sp_rng_next(&r) % 48);
            for (int i = 0; i < n; i++) ids[i] = random_id(t, &r, bytes, specials, ns);
            char what[64];
            snprintf(what, sizeof what, "%s random #%d", PKGS[p], iter);
            check_both(t, ids, n, what);
        }
    }
}

/* Every case of a case file, encoded with special tokens recognised. */
static void stream_cases(const char *path, const char *sep) {
    size_t len;
    char *buf = tu_read(path, &len);
    struct tcase *cs;
    int n = tu_split(buf, len, sep, &cs);
    assert_true(n > 0);
    for (int p = 0; p < N_PKGS; p++) {
        for (int i = 0; i < n; i++) {
            struct sp_ids ids = {0};
            assert_int_equal(sp_tokenizer_encode(toks[p], cs[i].s, cs[i].n, SP_TOK_PARSE_SPECIAL | SP_TOK_ADD_SPECIAL, &ids),
                             SP_OK);
            char what[300];
            snprintf(what, sizeof what, "%s %s case %d", PKGS[p], path, i);
            check_both(toks[p], ids.v, ids.n, what);
            sp_ids_free(&ids);
        }
    }
    sp_free(cs);
    sp_free(buf);
}

static void test_vectors(void **state) {
    stream_cases(tu_vector_path("qwen2.inp"), "\n__ggml_vocab_test__\n");
    stream_cases(tu_vector_path("llama-spm.inp"), "\n__ggml_vocab_test__\n");
}

static void test_corpus(void **state) { stream_cases(CORPUS_DIR "/corpus.inp", "\n__sparrow_case__\n"); }

/* Texts spelled one byte token per byte: every multi-byte character is
 * split across tokens, and the stream must hold its first bytes back. */
static void test_split_characters(void **state) {
    static const char *const texts[] = {
        "\xf0\x9f\x98\x81 emoji",
        "family \xf0\x9f\x91\xa8\xe2\x80\x8d\xf0\x9f\x91\xa9\xe2\x80\x8d\xf0\x9f\x91\xa7 and \xf0\x9f\x91\x8d\xf0\x9f\x8f\xbd",
        "\xe6\x88\x91\xe6\x83\xb3\xe5\x9c\xa8 CJK \xe3\x81\x93\xe3\x82\x93\xe3\x81\xab\xe3\x81\xa1\xe3\x81\xaf",
        " leading space, then \xc3\xa9\xc3\xa8 and \xe2\x96\x81 metaspace",
        "\xe3\x81",  // a character that never completes
    };
    for (int p = 0; p < N_PKGS; p++) {
        int32_t bytes[256];
        byte_tokens(toks[p], bytes);
        for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
            int32_t ids[256];
            size_t n = strlen(texts[k]);
            for (size_t i = 0; i < n; i++) ids[i] = bytes[(unsigned char)texts[k][i]];
            char what[64];
            snprintf(what, sizeof what, "%s bytes of text %zu", PKGS[p], k);
            check_both(toks[p], ids, (int64_t)n, what);
            /* Also mixed: whole tokens for the ASCII, bytes for the rest. */
            struct sp_ids mixed = {0};
            for (size_t i = 0; i < n; i++) {
                if ((unsigned char)texts[k][i] < 0x80)
                    assert_int_equal(sp_tokenizer_encode(toks[p], texts[k] + i, 1, 0, &mixed), SP_OK);
                else
                    sp_ids_push(&mixed, bytes[(unsigned char)texts[k][i]]);
            }
            check_both(toks[p], mixed.v, mixed.n, what);
            sp_ids_free(&mixed);
        }
    }
}

/* Deltas are what a client sees: spot-check them for Mistral, whose decoder
 * drops the space of the first token only. */
static void test_sentencepiece_spaces(void **state) {
    struct sp_tokenizer *t = toks[2];
    struct sp_ids ids = {0};
    assert_int_equal(sp_tokenizer_encode(t, "Hello world", 11, SP_TOK_ADD_SPECIAL, &ids), SP_OK);
    assert_int_equal(ids.n, 3);  // <s> ▁Hello ▁world
    struct sp_detok *d;
    assert_int_equal(sp_detok_new(t, SP_TOK_SKIP_SPECIAL, &d), SP_OK);
    struct sp_buf out = SP_BUF_INIT;
    assert_int_equal(sp_detok_push(d, ids.v[0], &out), SP_OK);
    assert_int_equal(out.len, 0);
    assert_int_equal(sp_detok_push(d, ids.v[1], &out), SP_OK);
    assert_string_equal(out.data, "Hello");
    sp_buf_clear(&out);
    assert_int_equal(sp_detok_push(d, ids.v[2], &out), SP_OK);
    assert_string_equal(out.data, " world");
    int32_t bad = (int32_t)sp_tokenizer_vocab_size(t);
    assert_int_equal(sp_detok_push(d, bad, &out), SP_ERR_ARG);
    sp_buf_free(&out);
    sp_detok_free(d);
    sp_ids_free(&ids);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_sentencepiece_spaces), cmocka_unit_test(test_split_characters),
        cmocka_unit_test(test_random_ids),           cmocka_unit_test(test_vectors),
        cmocka_unit_test(test_corpus),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
