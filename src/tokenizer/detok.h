/*
 * detok.h - streaming detokenization: feed generated ids one at a time, get
 * back the text they complete.
 *
 * Guarantees, for any id sequence: every delta is valid UTF-8 and never ends
 * inside a character (bytes of a character split across tokens are held
 * until it is complete); and the deltas so far followed by
 * sp_detok_peek() equal sp_tokenizer_decode() of the ids so far, flags
 * included. So the stream neither drops nor adds a space: SentencePiece
 * decoders remove the leading space only at the very start of the text, and
 * clean_up_tokenization_spaces holds back text a later token could change.
 *
 *     struct sp_detok *d;
 *     sp_detok_new(tok, SP_TOK_SKIP_SPECIAL, &d);
 *     for each generated id:
 *         sp_buf_clear(&delta);
 *         sp_detok_push(d, id, &delta);      // delta.len may be 0
 *         send(delta.data, delta.len);
 *     sp_buf_clear(&delta);
 *     sp_detok_flush(d, &delta);            // the rest; the stream restarts
 *     sp_detok_free(d);
 *
 * How: the ids since the last emitted cut form a window that is decoded
 * again on each push (a few tokens, so the cost is small and constant); the
 * window's new bytes are emitted up to any incomplete UTF-8 tail, and once
 * the window's text is complete the window is dropped and later windows are
 * decoded as continuations (see sp_decoder_run's at_start). Decoder chains
 * that cannot be decoded by window keep the whole sequence instead.
 *
 * The state is owned by the caller and used by one thread at a time; the
 * tokenizer must outlive it.
 */
#ifndef SP_TOKENIZER_DETOK_H
#define SP_TOKENIZER_DETOK_H

#include <stdint.h>

#include "core/buf.h"
#include "core/status.h"
#include "tokenizer/tokenizer.h"

struct sp_detok;

/* flags: SP_TOK_SKIP_SPECIAL or 0. */
enum sp_status sp_detok_new(const struct sp_tokenizer *t, unsigned flags, struct sp_detok **out);
void sp_detok_free(struct sp_detok *d);

/* Feeds one id and appends the text it completes (possibly nothing). An id
 * outside the vocabulary is refused (SP_ERR_ARG) and leaves the state as it
 * was. */
enum sp_status sp_detok_push(struct sp_detok *d, int32_t id, struct sp_buf *out);
/* Appends the text held back so far, as the full decode would end now
 * (an unfinished character becomes U+FFFD); the state is unchanged. */
enum sp_status sp_detok_peek(struct sp_detok *d, struct sp_buf *out);
/* sp_detok_peek, then starts a new text. */
enum sp_status sp_detok_flush(struct sp_detok *d, struct sp_buf *out);
/* Forgets everything: the next id starts a new text. */
void sp_detok_reset(struct sp_detok *d);

#endif
