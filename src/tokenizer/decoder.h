/*
 * decoder.h - the decoders of tokenizer.json (ByteLevel, Metaspace,
 * ByteFallback, Fuse, Strip, Replace, Sequence) and the optional
 * clean_up_tokenization_spaces pass of tokenizer_config.json.
 *
 * A decoder chain maps the list of token texts of a decode to a list of
 * pieces; the pieces are then concatenated. Pieces hold raw bytes: ByteLevel
 * and ByteFallback output is kept as bytes, not yet checked for UTF-8, and
 * the caller makes it valid once at the end (sp_utf8_sanitize). Replacing
 * invalid bytes once over the whole output is what lets a streaming decoder
 * cut the output anywhere that is not inside a character.
 *
 *     struct sp_decoder *d;
 *     sp_decoder_parse(cJSON_GetObjectItem(root, "decoder"), "decoder", &d);
 *     struct sp_dec_work w;
 *     sp_dec_work_init(&w);
 *     sp_pieces_add(&w.p, "\xc4\xa0hi", 4, false);   // "Ġhi"
 *     sp_decoder_run(d, &w, true, &bytes);           // appends " hi"
 *     sp_dec_work_free(&w);
 *
 * The chain and piece lists are owned by the caller (_free, NULL-safe).
 */
#ifndef SP_TOKENIZER_DECODER_H
#define SP_TOKENIZER_DECODER_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "tokenizer/pretok.h"

struct sp_piece {
    size_t off, len;
    bool added;  // an added token: ByteLevel passes it through verbatim
};

struct sp_pieces {
    struct sp_buf text;
    struct sp_piece *v;  // (n)
    int64_t n, cap;
};

enum sp_status sp_pieces_add(struct sp_pieces *p, const char *s, size_t len, bool added);
void sp_pieces_clear(struct sp_pieces *p);
void sp_pieces_free(struct sp_pieces *p);

/* The working memory of decoding, kept between calls so that a streaming
 * decoder allocates nothing once its buffers have grown to size. */
struct sp_dec_work {
    struct sp_pieces p;      // the input pieces; scratch after a run
    struct sp_pieces other;  // scratch
    struct sp_buf tmp;       // scratch
    struct sp_rx rx;
};

enum sp_status sp_dec_work_init(struct sp_dec_work *w);
void sp_dec_work_free(struct sp_dec_work *w);

struct sp_decoder;
/* j may be NULL or JSON null: *out is then NULL, and decoding joins the
 * token texts with single spaces, as the reference does. */
enum sp_status sp_decoder_parse(const cJSON *j, const char *where, struct sp_decoder **out);
void sp_decoder_free(struct sp_decoder *d);

/* Runs the chain over w->p (consumed: its contents are scratch afterwards)
 * and appends the bytes to out. at_start says whether p's first token begins the
 * text: only then do Metaspace and a Strip after Fuse remove the leading
 * space, so a window of later tokens decodes to exactly its share of the
 * whole text. */
enum sp_status sp_decoder_run(const struct sp_decoder *d, struct sp_dec_work *w, bool at_start, struct sp_buf *out);

/* True when decoding a window of tokens, with at_start false, gives the same
 * bytes as the whole text has there; false for chains whose steps look
 * across token boundaries in ways a window cannot see (a Strip of trailing
 * characters, a Replace after Fuse). */
bool sp_decoder_windowable(const struct sp_decoder *d);

/* clean_up_tokenization_spaces: appends s with " ." " ?" " !" " ," " ' "
 * " n't" " 'm" " 's" " 've" " 're" turned into their space-less forms, each
 * pattern replaced over the whole text in that order (the reference's
 * sequence of replaceAll calls). */
enum sp_status sp_cleanup_spaces(const char *s, size_t n, struct sp_buf *out);

/* The longest prefix of s[0..n) that later text cannot change under
 * sp_cleanup_spaces: cleanup(s[0..k)) + cleanup(rest) == cleanup(s + rest)
 * for any rest. */
size_t sp_cleanup_safe_prefix(const char *s, size_t n);

#endif
