/*
 * utf8.h - UTF-8 decoding with the WHATWG "maximal subpart" replacement
 * rule, which is what TextDecoder (and so the reference tokenizers) apply to
 * bytes that are not valid UTF-8: each maximal invalid subsequence becomes one
 * U+FFFD.
 *
 *     struct sp_buf clean = SP_BUF_INIT;
 *     sp_utf8_sanitize(text, len, &clean);        // appends valid UTF-8
 *     size_t held = sp_utf8_incomplete_tail(b, n); // bytes that may still
 *                                                  // become a character
 */
#ifndef SP_CORE_UTF8_H
#define SP_CORE_UTF8_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/buf.h"

/* Decodes the sequence at s[0..n) (n >= 1). Returns its length (1..4) with the
 * code point in *cp, or minus the length of the maximal invalid subpart
 * (-1..-3) that one U+FFFD replaces; a valid but truncated sequence at the end
 * of the input also counts as invalid here. */
int sp_utf8_decode(const unsigned char *s, size_t n, uint32_t *cp);

/* True when s[0..n) is entirely valid UTF-8. */
bool sp_utf8_valid(const char *s, size_t n);

/* Appends s[0..n) to out, each maximal invalid subpart replaced by U+FFFD. */
enum sp_status sp_utf8_sanitize(const char *s, size_t n, struct sp_buf *out);

/* The number of bytes at the end of s[0..n) that form a valid but incomplete
 * sequence (one that later bytes could still complete); 0 when none. */
size_t sp_utf8_incomplete_tail(const char *s, size_t n);

/* Writes cp as UTF-8 into out (4 bytes of room) and returns its length. */
int sp_utf8_encode(uint32_t cp, char *out);

/* Length of the sequence a lead byte announces (1 for ASCII and for bytes
 * that cannot lead, so that a scan always advances). */
static inline int sp_utf8_len(unsigned char c) {
    return c < 0xc0 ? 1 : c < 0xe0 ? 2 : c < 0xf0 ? 3 : c < 0xf8 ? 4 : 1;
}

/* Lenient decoding for text that is shown back as it came (templates):
 * the code point at s[0..n) (n > 0) and its length, an invalid byte decoding
 * as itself, one byte long. */
size_t sp_utf8_next(const char *s, size_t n, int32_t *cp);
/* Number of code points in s[0..n), counted as sp_utf8_next steps. */
int64_t sp_utf8_count(const char *s, size_t n);
/* Byte offset of code point index i (clamped to n). */
size_t sp_utf8_offset(const char *s, size_t n, int64_t i);
/* Appends cp as UTF-8; a value that is no Unicode scalar (a surrogate, or
 * past U+10FFFF) is appended as the single byte it came from. */
enum sp_status sp_utf8_put(struct sp_buf *b, int32_t cp);

#endif
