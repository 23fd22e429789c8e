/*
 * pretok.h - the text stages that run before the model: normalizers
 * (NFC/NFD/NFKC/NFKD, Prepend, Replace, Lowercase, Strip, Sequence) and
 * pre-tokenizers (Split, ByteLevel, Digits, Metaspace, Whitespace,
 * WhitespaceSplit, Sequence), read from tokenizer.json, plus the GPT-2
 * byte <-> character mapping and the PCRE2 patterns they share.
 *
 *     struct sp_normalizer *nz;  struct sp_pretok *pt;
 *     sp_normalizer_parse(cJSON_GetObjectItem(root, "normalizer"), "normalizer", &nz);
 *     sp_pretok_parse(cJSON_GetObjectItem(root, "pre_tokenizer"), "pre_tokenizer", &pt);
 *     struct sp_rx rx;  sp_rx_init(&rx);            // per call / per thread
 *     sp_normalize(nz, &text, &rx);                   // in place
 *     struct sp_splits w = {0}, tmp = {0};
 *     sp_splits_set(&w, text.data, text.len, true);
 *     sp_pretok_run(pt, &w, &tmp, &rx, false);        // w now holds the words
 *
 * Sequences are flattened at parse time. Every parsed object is owned by the
 * caller and freed with its _free (NULL-safe). Regexes are compiled with
 * PCRE2_UTF | PCRE2_UCP and JIT; text given to the stages must be valid UTF-8.
 */
#ifndef SP_TOKENIZER_PRETOK_H
#define SP_TOKENIZER_PRETOK_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "core/buf.h"
#include "core/status.h"

/* ---- GPT-2 byte-level alphabet ---- */

/* The character that stands for byte b. */
uint32_t sp_bytelevel_cp(uint8_t b);
/* The byte a character stands for, or -1 outside the alphabet. */
int sp_bytelevel_byte(uint32_t cp);
/* Appends the byte-level characters of s[0..n). */
enum sp_status sp_bytelevel_map(const char *s, size_t n, struct sp_buf *out);
/* Appends the bytes that byte-level text s[0..n) stands for; false (out
 * unchanged in length) if a character is outside the alphabet. */
bool sp_bytelevel_unmap(const char *s, size_t n, struct sp_buf *out);

/* Unicode White_Space, as Rust's char::is_whitespace. */
bool sp_is_space(uint32_t cp);

/* ---- patterns ---- */

/* Per-call match state for patterns (PCRE2 match data, JIT stack). */
struct sp_rx {
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
};
enum sp_status sp_rx_init(struct sp_rx *rx);
void sp_rx_free(struct sp_rx *rx);

/* A tokenizer.json pattern: {"String": s} or {"Regex": r}. */
struct sp_pattern {
    char *lit;  // the literal (String), owned
    size_t lit_len;
    pcre2_code *re;  // the compiled Regex, or NULL
    bool jit;
};

/* Compiles a regex (PCRE2_UTF | PCRE2_UCP, JIT when available); `where`
 * names it in errors. */
enum sp_status sp_pattern_regex(const char *re, const char *where, struct sp_pattern *out);
enum sp_status sp_pattern_parse(const cJSON *pat, const char *where, struct sp_pattern *out);
/* Finds the first match in s[0..n) at or after `from`: true with [*ms, *me).
 * Errors (JIT stack exhausted, ...) are returned through *st. */
bool sp_pattern_find(const struct sp_pattern *p, const char *s, size_t n, size_t from, struct sp_rx *rx, size_t *ms,
                     size_t *me, enum sp_status *st);
void sp_pattern_free(struct sp_pattern *p);
/* Appends s with every match of p replaced by `with`. */
enum sp_status sp_pattern_replace(const struct sp_pattern *p, const char *s, size_t n, const char *with,
                                  size_t with_len, struct sp_rx *rx, struct sp_buf *out);

/* ---- normalizers ---- */

struct sp_normalizer;
/* j may be NULL or JSON null: *out is then NULL (no normalizer). */
enum sp_status sp_normalizer_parse(const cJSON *j, const char *where, struct sp_normalizer **out);
/* Normalizes text in place (text stays NUL-terminated). */
enum sp_status sp_normalize(const struct sp_normalizer *nz, struct sp_buf *text, struct sp_rx *rx);
void sp_normalizer_free(struct sp_normalizer *nz);

/* ---- pre-tokenizers ---- */

struct sp_range {
    size_t off, len;
    bool origin;  // starts at the very beginning of the input text
};

/* Words: ranges over one text buffer. */
struct sp_splits {
    struct sp_buf text;
    struct sp_range *r;  // (n)
    int64_t n, cap;
};

/* Makes s one range holding the whole text. */
enum sp_status sp_splits_set(struct sp_splits *s, const char *text, size_t len, bool origin);
enum sp_status sp_splits_add(struct sp_splits *s, const char *p, size_t len, bool origin);
void sp_splits_free(struct sp_splits *s);

struct sp_pretok;
enum sp_status sp_pretok_parse(const cJSON *j, const char *where, struct sp_pretok **out);
/* True when the last stage is ByteLevel: its byte mapping can then be left to
 * a byte-mode model (sp_pretok_run with defer_bytelevel). */
bool sp_pretok_ends_with_bytelevel(const struct sp_pretok *pt);
/* Runs every stage on w (tmp is scratch). With defer_bytelevel, a final
 * ByteLevel stage splits but leaves the bytes unmapped. */
enum sp_status sp_pretok_run(const struct sp_pretok *pt, struct sp_splits *w, struct sp_splits *tmp, struct sp_rx *rx,
                             bool defer_bytelevel);
void sp_pretok_free(struct sp_pretok *pt);

#endif
