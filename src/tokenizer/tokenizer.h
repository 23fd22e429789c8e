/*
 * tokenizer.h - Hugging Face tokenizer.json tokenizers: load from a model
 * folder, encode text to token ids, decode ids to text.
 *
 * Supported: BPE models (byte-level, with ignore_merges / byte_fallback /
 * fuse_unk, and the SentencePiece-style BPE of Llama 2 vocabularies); added
 * tokens (special or not, lstrip / rstrip / single_word / normalized);
 * normalizers, pre-tokenizers and decoders as listed in pretok.h and
 * decoder.h; post-processors TemplateProcessing, ByteLevel, Bert/Roberta and
 * Sequence. A component of another type is refused with an error naming it.
 * Streaming decode lives in detok.h.
 *
 *     struct sp_tokenizer *tok;
 *     if (sp_tokenizer_load("models/Qwen3-0.6B", &tok) != SP_OK)
 *         fprintf(stderr, "error: %s\n", sp_error_msg());
 *     struct sp_ids ids = {0};
 *     sp_tokenizer_encode(tok, text, len, SP_TOK_PARSE_SPECIAL, &ids);
 *     struct sp_buf out = SP_BUF_INIT;
 *     sp_tokenizer_decode(tok, ids.v, ids.n, SP_TOK_SKIP_SPECIAL, &out);
 *     sp_ids_free(&ids); sp_buf_free(&out); sp_tokenizer_free(tok);
 *
 * Text given to encode may hold invalid UTF-8: each maximal invalid subpart
 * is encoded as U+FFFD, as the reference (which reads text through
 * TextDecoder) does. Decoded text is always valid UTF-8.
 *
 * tokenizer_config.json: bos_token / eos_token name the bos/eos ids;
 * add_bos_token / add_eos_token apply when tokenizer.json has no
 * post-processor that adds tokens (a TemplateProcessing wins);
 * clean_up_tokenization_spaces applies to decode when true (absent means
 * false, as in current transformers; @lenml/tokenizers assumes true);
 * additional_special_tokens are skipped by SP_TOK_SKIP_SPECIAL; entries of
 * added_tokens_decoder missing from tokenizer.json are added.
 *
 * A loaded tokenizer is immutable apart from an internal, locked word cache:
 * any number of threads may encode and decode with it at once.
 */
#ifndef SP_TOKENIZER_TOKENIZER_H
#define SP_TOKENIZER_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"

/* A growable array of token ids; zero-initialize, free with sp_ids_free. */
struct sp_ids {
    int32_t *v;  // (n), owned
    int64_t n, cap;
};

enum sp_status sp_ids_push(struct sp_ids *a, int32_t id);
enum sp_status sp_ids_append(struct sp_ids *a, const int32_t *ids, int64_t n);
void sp_ids_free(struct sp_ids *a);

enum sp_tok_flags {
    /* Encode: recognise special added tokens written in the text. Without
     * it, "<|im_start|>" typed by a user is encoded as plain text (what
     * Hugging Face calls split_special_tokens=True). Non-special added
     * tokens are always recognised. */
    SP_TOK_PARSE_SPECIAL = 1u << 0,
    /* Encode: add the special tokens of the post-processor (bos/eos). */
    SP_TOK_ADD_SPECIAL = 1u << 1,
    /* Decode: leave special tokens out of the text. */
    SP_TOK_SKIP_SPECIAL = 1u << 2,
};

struct sp_tokenizer;

/* Loads `path`: a folder with tokenizer.json (and optionally
 * tokenizer_config.json), or a tokenizer.json file (its folder's
 * tokenizer_config.json is read when present). Owned by the caller. */
enum sp_status sp_tokenizer_load(const char *path, struct sp_tokenizer **out);
/* The same from memory; config may be NULL. */
enum sp_status sp_tokenizer_load_mem(const char *json, size_t json_len, const char *config, size_t config_len,
                                     struct sp_tokenizer **out);
void sp_tokenizer_free(struct sp_tokenizer *t);

/* Appends the ids of text[0..len) to out. */
enum sp_status sp_tokenizer_encode(const struct sp_tokenizer *t, const char *text, size_t len, unsigned flags,
                                   struct sp_ids *out);
/* The same, stopping with SP_ERR_LIMIT as soon as more than max_new ids
 * would be appended (max_new < 0: no limit); out then holds some of them. */
enum sp_status sp_tokenizer_encode_max(const struct sp_tokenizer *t, const char *text, size_t len, unsigned flags,
                                       int64_t max_new, struct sp_ids *out);
/* Appends the text of ids to out (valid UTF-8). Ids outside the vocabulary
 * are an error (SP_ERR_ARG). */
enum sp_status sp_tokenizer_decode(const struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                                   struct sp_buf *out);

/* One past the largest token id (added tokens included). */
int64_t sp_tokenizer_vocab_size(const struct sp_tokenizer *t);
/* The stored text of a token (byte-level characters and all; borrowed,
 * valid while t lives, not NUL-terminated), or NULL for an unused id. */
const char *sp_tokenizer_token(const struct sp_tokenizer *t, int32_t id, size_t *len);
/* The id whose stored text is exactly text[0..len), or -1. */
int32_t sp_tokenizer_lookup(const struct sp_tokenizer *t, const char *text, size_t len);
bool sp_tokenizer_is_special(const struct sp_tokenizer *t, int32_t id);
/* bos/eos from tokenizer_config.json; -1 when not set. */
int32_t sp_tokenizer_bos(const struct sp_tokenizer *t);
int32_t sp_tokenizer_eos(const struct sp_tokenizer *t);

/* Empties the word cache (memory back to a minimum; cold-cache benchmarks). */
void sp_tokenizer_clear_cache(const struct sp_tokenizer *t);

/* For detok.c: appends the decoder's raw bytes for ids (before UTF-8 repair
 * and the space cleanup); at_start as in sp_decoder_run; w is reused
 * working memory (decoder.h). */
struct sp_dec_work;
enum sp_status sp_tokenizer_decode_raw(const struct sp_tokenizer *t, const int32_t *ids, int64_t n, unsigned flags,
                                       bool at_start, struct sp_dec_work *w, struct sp_buf *out);
/* Whether decode applies clean_up_tokenization_spaces. */
bool sp_tokenizer_cleans_spaces(const struct sp_tokenizer *t);
/* Whether the decoder chain can be run on a window of tokens. */
bool sp_tokenizer_windowable(const struct sp_tokenizer *t);

#endif
