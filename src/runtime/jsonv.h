/*
 * jsonv.h - an incremental JSON validator for constrained sampling
 * (response_format {"type": "json_object"}): a pushdown automaton over bytes
 * that says whether the text so far is a valid prefix of one JSON object, and
 * whether it is a complete one.
 *
 * The grammar is RFC 8259 with two restrictions: the top-level value must be
 * an object, and containers nest at most SP_JSONV_MAX_DEPTH deep (the
 * top-level object is depth 1). Strings must be valid UTF-8 (no overlong
 * forms, no surrogates encoded in UTF-8, nothing above U+10FFFF), control
 * characters below 0x20 must be escaped, \u escapes of surrogates must come
 * in high-low pairs. Whitespace (space, tab, CR, LF) may surround every
 * token, including before and after the object; nothing else may follow it.
 * A state made for sampling (sp_jsonv_init_sampling) takes whitespace in
 * runs of at most SP_JSONV_MAX_WS bytes, as llama.cpp's JSON grammar caps
 * them: a sampler that may always add whitespace can keep a model in it
 * until max_tokens.
 *
 *     struct sp_jsonv v;
 *     sp_jsonv_init_sampling(&v);
 *     for each candidate token t:
 *         struct sp_jsonv c = v;                       // a plain copy
 *         bool ok = sp_jsonv_feed(&c, text(t), len(t)); // false: mask t out
 *     ... after sampling token s:
 *     sp_jsonv_feed(&v, text(s), len(s));
 *     bool may_stop = sp_jsonv_complete(&v);           // allow EOS only then
 *
 * The state is a small struct with no pointers: copy it by assignment, keep
 * it anywhere. Feeding allocates nothing and costs a few ns per byte (string
 * bodies take a tight loop). After sp_jsonv_feed returns false the state is
 * unspecified; keep feeding copies, or re-initialize.
 *
 * A number at the end of the text is an open token: "{\"a\":1" stays a valid
 * prefix whether or not more digits follow. The number is only known to have
 * ended when the next byte (',', '}', ']' or whitespace) arrives.
 */
#ifndef SP_RUNTIME_JSONV_H
#define SP_RUNTIME_JSONV_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define SP_JSONV_MAX_DEPTH 64
/* Whitespace bytes in a row between two tokens: a newline and indentation
 * to depth 16 at 4 spaces, or 32 at 2, fits. */
#define SP_JSONV_MAX_WS 65

struct sp_jsonv {
    uint64_t stack; // bit d-1 set: the container at depth d is an array
    uint32_t cp;    // \u escape: code point being read (high surrogate in bits 16..)
    uint8_t depth;  // open containers, 0..SP_JSONV_MAX_DEPTH
    uint8_t state;  // an internal state (see jsonv.c)
    uint8_t left;   // bytes or hex digits still expected by the current state
    uint8_t lo, hi; // UTF-8: allowed range of the next continuation byte
    uint8_t lit;    // true/false/null: which literal is being read
    uint8_t ws;     // whitespace bytes in a row so far (counted when max_ws is set)
    uint8_t max_ws; // the cap on them; 0: none
    bool key;       // the string being read is an object key
};

/* A fresh state: nothing read yet. */
void sp_jsonv_init(struct sp_jsonv *v);
/* The same with whitespace runs capped at SP_JSONV_MAX_WS bytes, for
 * constrained sampling. */
void sp_jsonv_init_sampling(struct sp_jsonv *v);

/* Reads n more bytes. Returns true when everything read so far is a valid
 * prefix of a JSON object document, false (state unspecified) otherwise. */
bool sp_jsonv_feed(struct sp_jsonv *v, const void *bytes, size_t n);

/* True when everything read so far is one complete JSON object, possibly
 * followed by whitespace. */
bool sp_jsonv_complete(const struct sp_jsonv *v);

/* Open containers right now (0 before the object and after it closes). */
static inline int sp_jsonv_depth(const struct sp_jsonv *v) { return v->depth; }

#endif
