/*
 * bpe.h - the BPE model of tokenizer.json: vocabulary, ranked merges, and the
 * merge loop that turns one pre-tokenized word into token ids.
 *
 * Two flavours share the code. Byte-level vocabularies (GPT-2, Qwen, Llama 3,
 * o200k) run in byte mode: the word arrives as raw bytes and its first
 * symbols come from a 256-entry table, so the ByteLevel character mapping is
 * never materialized. SentencePiece-style vocabularies (Llama 2) run in char
 * mode: the first symbols are the word's UTF-8 characters, with
 * `byte_fallback` (<0xXX> tokens) or the unknown token for characters the
 * vocabulary lacks (`fuse_unk` joins runs of them).
 *
 * Merging uses a linked list over the symbols and a binary heap of candidate
 * pairs ordered by (merge rank, position), so a word of n symbols costs
 * O(n log n). Results for words up to 256 bytes are kept in a bounded cache
 * (cleared when full), guarded by a mutex so several threads may encode.
 *
 *     struct sp_bpe *m;
 *     sp_bpe_build(&tj, model_json, true, &m);     // byte mode
 *     struct sp_bpe_scratch s = {0};
 *     struct sp_ids ids = {0};
 *     sp_bpe_encode_word(m, "hello", 5, &s, &ids);
 *     sp_bpe_scratch_free(&s);
 *     sp_bpe_free(m);
 */
#ifndef SP_TOKENIZER_BPE_H
#define SP_TOKENIZER_BPE_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/tokjson.h"

struct sp_bpe;

/* Per-call working memory of the merge loop; zero-initialize, reuse across
 * words, free with sp_bpe_scratch_free. */
struct sp_bpe_scratch {
    struct sp_bpe_sym *sym;
    int64_t sym_cap;
    struct sp_bpe_cand *heap;
    int64_t heap_cap;
    struct sp_buf key;  // char-mode lookup keys (prefix/suffix forms)
};

/* Builds the model from the scanned vocab/merges and the rest of "model".
 * byte_level selects byte mode (the words given later are raw bytes); it is
 * refused when continuing_subword_prefix / end_of_word_suffix are set.
 * The model is owned by the caller (sp_bpe_free). */
enum sp_status sp_bpe_build(const struct sp_tokjson *tj, const cJSON *model, bool byte_level, struct sp_bpe **out);
void sp_bpe_free(struct sp_bpe *m);

/* Appends the ids of one word to out. Thread-safe for concurrent callers with
 * separate scratch. */
enum sp_status sp_bpe_encode_word(struct sp_bpe *m, const char *word, size_t len, struct sp_bpe_scratch *s,
                                  struct sp_ids *out);
void sp_bpe_scratch_free(struct sp_bpe_scratch *s);

/* True when the model takes raw bytes (byte mode). */
bool sp_bpe_byte_mode(const struct sp_bpe *m);
/* One past the largest id of the model vocabulary. */
int64_t sp_bpe_vocab_end(const struct sp_bpe *m);
/* The text of id (borrowed, valid while the model lives; not NUL-terminated),
 * or NULL for an id the vocabulary does not hold. */
const char *sp_bpe_token(const struct sp_bpe *m, int32_t id, size_t *len);
/* The id of a token's exact text, or -1. */
int32_t sp_bpe_lookup(const struct sp_bpe *m, const char *text, size_t len);
/* The id of the unknown token, or -1. */
int32_t sp_bpe_unk(const struct sp_bpe *m);
/* Drops every cached word (used by benchmarks to measure cold encodes). */
void sp_bpe_cache_clear(struct sp_bpe *m);

#endif
