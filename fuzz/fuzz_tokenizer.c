/*
 * fuzz_tokenizer.c - libFuzzer target for tokenizer.json loading and for
 * encoding / decoding arbitrary bytes.
 *
 * The first input byte picks what the rest is:
 *   0..63    a tokenizer.json document: loaded; when it loads, it encodes and
 *            decodes a fixed text and its own bytes
 *   64..191  text for two small built-in tokenizers (byte-level with regex
 *            split, NFC, Replace, added tokens with lstrip/rstrip/
 *            single_word; and SentencePiece-style with byte fallback):
 *            encoded with every flag combination, decoded, and streamed, and
 *            the stream must equal the decode (abort otherwise)
 *   192..255 int32 ids for the same tokenizers: decoded and streamed
 *
 *     make fuzz && build/fuzz/fuzz_tokenizer -max_total_time=300 fuzz/corpus/tokenizer
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/buf.h"
#include "tokenizer/detok.h"
#include "tokenizer/tokenizer.h"

static const char BYTELEVEL_JSON[] =
    "{\"added_tokens\": ["
    "{\"id\": 300, \"content\": \"<|s|>\", \"special\": true, \"lstrip\": false, \"rstrip\": false, \"single_word\": false, "
    "\"normalized\": false},"
    "{\"id\": 301, \"content\": \"<m>\", \"special\": false, \"lstrip\": true, \"rstrip\": true, \"single_word\": false, "
    "\"normalized\": false},"
    "{\"id\": 302, \"content\": \"ab\", \"special\": false, \"lstrip\": false, \"rstrip\": false, \"single_word\": true, "
    "\"normalized\": true}],"
    "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, "
    "{\"type\": \"Replace\", \"pattern\": {\"Regex\": \"x+\"}, \"content\": \"x\"}]},"
    "\"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(?i:'s|'t)|[^\\\\r\\\\n\\\\p{L}\\\\p{N}]?\\\\p{L}+|\\\\p{N}| "
    "?[^\\\\s\\\\p{L}\\\\p{N}]+[\\\\r\\\\n]*|\\\\s*[\\\\r\\\\n]+|\\\\s+(?!\\\\S)|\\\\s+\"}, \"behavior\": \"Isolated\", "
    "\"invert\": false},"
    "{\"type\": \"Digits\", \"individual_digits\": false},"
    "{\"type\": \"ByteLevel\", \"add_prefix_space\": false, \"use_regex\": false}]},"
    "\"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<|s|>\", "
    "\"type_id\": 0}}, {\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<|s|>\": {\"id\": "
    "\"<|s|>\", \"ids\": [300], \"tokens\": [\"<|s|>\"]}}},"
    "\"decoder\": {\"type\": \"ByteLevel\"},"
    "\"model\": {\"type\": \"BPE\", \"ignore_merges\": true, \"vocab\": {VOCAB}, \"merges\": [MERGES]}}";

static struct sp_tokenizer *bytelevel, *spm;

/* Builds the byte-level tokenizer: the 256 byte characters plus merges of a
 * few common pairs. */
static struct sp_tokenizer *make_bytelevel(void) {
    struct sp_buf vocab = SP_BUF_INIT, merges = SP_BUF_INIT, json = SP_BUF_INIT;
    /* GPT-2 byte characters in id order = byte order. */
    uint32_t next = 0x100;
    for (int b = 0; b < 256; b++) {
        bool printable = (b >= 0x21 && b <= 0x7e) || (b >= 0xa1 && b <= 0xac) || (b >= 0xae);
        uint32_t cp = printable ? (uint32_t)b : next++;
        char enc[8];
        if (cp < 0x80) snprintf(enc, sizeof enc, "%s", (char[]){(char)cp, 0});
        else snprintf(enc, sizeof enc, "%c%c", (char)(0xc0 | (cp >> 6)), (char)(0x80 | (cp & 0x3f)));
        if (cp == '"' || cp == '\\') sp_buf_printf(&vocab, "%s\"\\%s\": %d", b ? "," : "", enc, b);
        else sp_buf_printf(&vocab, "%s\"%s\": %d", b ? "," : "", enc, b);
    }
    static const char *const pairs[][2] = {{"t", "h"}, {"h", "e"}, {"th", "e"}, {"\xc4\xa0", "t"},
                                           {"\xc4\xa0t", "he"}, {"i", "n"}, {"a", "b"}};
    int id = 256;
    for (size_t i = 0; i < sizeof pairs / sizeof pairs[0]; i++) {
        sp_buf_printf(&vocab, ",\"%s%s\": %d", pairs[i][0], pairs[i][1], id++);
        sp_buf_printf(&merges, "%s[\"%s\", \"%s\"]", i ? "," : "", pairs[i][0], pairs[i][1]);
    }
    const char *t = BYTELEVEL_JSON;
    const char *v = strstr(t, "VOCAB"), *m = strstr(t, "MERGES");
    sp_buf_append(&json, t, (size_t)(v - t));
    sp_buf_append(&json, vocab.data, vocab.len);
    sp_buf_append(&json, v + 5, (size_t)(m - v - 5));
    sp_buf_append(&json, merges.data, merges.len);
    sp_buf_puts(&json, m + 6);
    struct sp_tokenizer *tok = NULL;
    if (sp_tokenizer_load_mem(json.data, json.len, NULL, 0, &tok) != SP_OK) {
        fprintf(stderr, "fuzz_tokenizer: built-in tokenizer: %s\n", sp_error_msg());
        abort();
    }
    sp_buf_free(&vocab);
    sp_buf_free(&merges);
    sp_buf_free(&json);
    return tok;
}

/* A SentencePiece-style tokenizer (Llama 2 layout) with byte fallback. */
static struct sp_tokenizer *make_spm(void) {
    struct sp_buf json = SP_BUF_INIT;
    sp_buf_puts(&json, "{\"added_tokens\": [{\"id\": 0, \"content\": \"<unk>\", \"special\": true}, {\"id\": 1, \"content\": "
                       "\"<s>\", \"special\": true}],"
                       "\"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"Prepend\", \"prepend\": "
                       "\"\\u2581\"}, {\"type\": \"Replace\", \"pattern\": {\"String\": \" \"}, \"content\": \"\\u2581\"}]},"
                       "\"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Replace\", \"pattern\": {\"String\": "
                       "\"\\u2581\"}, \"content\": \" \"}, {\"type\": \"ByteFallback\"}, {\"type\": \"Fuse\"}, {\"type\": "
                       "\"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 0}]},"
                       "\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true, \"byte_fallback\": true, "
                       "\"vocab\": {\"<unk>\": 0, \"<s>\": 1");
    for (int b = 0; b < 256; b++) sp_buf_printf(&json, ", \"<0x%02X>\": %d", b, 2 + b);
    static const char *const pieces[] = {"\xe2\x96\x81", "a", "b", "c", "\xe2\x96\x81" "a", "ab", "\xe2\x96\x81" "ab", "\xc3\xa9"};
    for (size_t i = 0; i < sizeof pieces / sizeof pieces[0]; i++) sp_buf_printf(&json, ", \"%s\": %zu", pieces[i], 258 + i);
    sp_buf_puts(&json, "}, \"merges\": [\"\xe2\x96\x81 a\", \"a b\", \"\xe2\x96\x81" "a b\"]}}");
    struct sp_tokenizer *tok = NULL;
    if (sp_tokenizer_load_mem(json.data, json.len, NULL, 0, &tok) != SP_OK) {
        fprintf(stderr, "fuzz_tokenizer: built-in tokenizer: %s\n", sp_error_msg());
        abort();
    }
    sp_buf_free(&json);
    return tok;
}

/* Streams ids and aborts unless the stream equals the full decode. */
static void check_stream(struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags) {
    struct sp_buf full = SP_BUF_INIT, acc = SP_BUF_INIT;
    if (sp_tokenizer_decode(t, ids, n, flags, &full) != SP_OK) goto done;  // an id outside the vocabulary
    struct sp_detok *d;
    if (sp_detok_new(t, flags, &d) != SP_OK) abort();
    for (int64_t i = 0; i < n; i++)
        if (sp_detok_push(d, ids[i], &acc) != SP_OK) {
            fprintf(stderr, "detok push failed: %s\n", sp_error_msg());
            abort();
        }
    if (sp_detok_flush(d, &acc) != SP_OK) abort();
    if (acc.len != full.len || memcmp(acc.data ? acc.data : "", full.data ? full.data : "", full.len) != 0) {
        fprintf(stderr, "stream [%.*s] != decode [%.*s]\n", (int)acc.len, acc.data, (int)full.len, full.data);
        abort();
    }
    sp_detok_free(d);
done:
    sp_buf_free(&full);
    sp_buf_free(&acc);
}

static void exercise_text(struct sp_tokenizer *t, const char *s, size_t n) {
    for (unsigned flags = 0; flags < 4; flags++) {
        struct sp_ids ids = {0};
        if (sp_tokenizer_encode(t, s, n, flags, &ids) == SP_OK) {
            check_stream(t, ids.v, ids.n, 0);
            check_stream(t, ids.v, ids.n, SP_TOK_SKIP_SPECIAL);
        }
        sp_ids_free(&ids);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!bytelevel) {
        bytelevel = make_bytelevel();
        spm = make_spm();
    }
    if (size == 0) return 0;
    uint8_t mode = data[0];
    const char *s = (const char *)data + 1;
    size_t n = size - 1;
    if (mode < 64) {
        struct sp_tokenizer *t = NULL;
        if (sp_tokenizer_load_mem(s, n, NULL, 0, &t) == SP_OK) {
            exercise_text(t, "Hello, world! 123 \xe3\x81\x82 \xf0\x9f\x98\x81\xff", 22);
            exercise_text(t, s, n < 256 ? n : 256);
            sp_tokenizer_free(t);
        }
    } else if (mode < 192) {
        exercise_text(mode & 1 ? spm : bytelevel, s, n);
    } else {
        struct sp_tokenizer *t = mode & 1 ? spm : bytelevel;
        int64_t k = (int64_t)(n / 2);
        int32_t *ids = malloc((size_t)(k ? k : 1) * sizeof *ids);
        int64_t vs = sp_tokenizer_vocab_size(t);
        for (int64_t i = 0; i < k; i++) ids[i] = (int32_t)(((uint16_t)data[1 + 2 * i] | (uint16_t)data[2 + 2 * i] << 8) % (vs + 2));
        check_stream(t, ids, k, 0);
        check_stream(t, ids, k, SP_TOK_SKIP_SPECIAL);
        free(ids);
    }
    return 0;
}
