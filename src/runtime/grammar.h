/*
 * grammar.h - byte-level context-free grammars for constrained sampling
 * (JSON schemas, tool calls), and a matcher that says which tokens may come
 * next.
 *
 * A grammar is a list of rules; a rule is a list of alternatives; an
 * alternative is a sequence of symbols, each a byte class (a set of bytes)
 * or a reference to a rule. Grammars come from a builder:
 *
 *     struct sp_gbuild *b = sp_gb_new();
 *     int digits = sp_gb_rule(b);                 // digits ::= [0-9] digits | [0-9]
 *     sp_gb_begin(b); sp_gb_range(b, '0', '9'); sp_gb_ref(b, digits); sp_gb_end(b, digits);
 *     sp_gb_begin(b); sp_gb_range(b, '0', '9'); sp_gb_end(b, digits);
 *     int root = sp_gb_rule(b);                   // root ::= "n=" digits
 *     sp_gb_begin(b); sp_gb_lit(b, "n="); sp_gb_ref(b, digits); sp_gb_end(b, root);
 *     struct sp_grammar *g;
 *     sp_gb_finish(b, root, &g);                  // frees the builder
 *
 * Alternatives may be begun while another is open (a rule built on the way
 * is referenced from the outer one). Grammars must not be left-recursive: an
 * expansion that reaches the same place again without reading a byte is cut
 * after SP_GRAMMAR_MAX_EXPAND steps. Right recursion costs no stack: a
 * reference in last place is a tail call.
 *
 * The matcher runs the grammar as a pushdown automaton whose configuration
 * is a set of stacks of grammar positions, at most SP_GRAMMAR_MAX_STACKS of
 * at most SP_GRAMMAR_MAX_DEPTH positions (deeper or more is dropped: the
 * constraint gets stricter, never looser). It memoises configurations and
 * their byte transitions (a lazy DFA), so once text like the body of a
 * string has been seen, each further byte is a table lookup, and a mask over
 * the whole vocabulary walks a trie of the token texts with lookups only.
 *
 *     struct sp_gmatch *m;
 *     sp_gmatch_new(g, &m);
 *     sp_gmatch_try(m, text, len);     // would this token fit? (no change)
 *     sp_gmatch_feed(m, text, len);    // take it
 *     sp_gmatch_allowed(m, trie, ok);  // every token that fits, at once
 *     sp_gmatch_accepting(m);          // the text so far is a whole sentence
 *     sp_gmatch_done(m);               // ... and nothing may follow it
 */
#ifndef SP_RUNTIME_GRAMMAR_H
#define SP_RUNTIME_GRAMMAR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/status.h"

#define SP_GRAMMAR_MAX_STACKS 64
#define SP_GRAMMAR_MAX_DEPTH 192
#define SP_GRAMMAR_MAX_EXPAND 64
#define SP_GRAMMAR_MAX_SYMBOLS (1 << 22)

/* A set of bytes. */
struct sp_gset {
    uint64_t w[4];
};
static inline void sp_gset_add(struct sp_gset *s, unsigned lo, unsigned hi) {
    for (unsigned c = lo; c <= hi && c < 256; c++) s->w[c >> 6] |= 1ull << (c & 63);
}
static inline bool sp_gset_has(const struct sp_gset *s, unsigned c) { return (s->w[c >> 6] >> (c & 63)) & 1; }

struct sp_grammar;
struct sp_gbuild;

/* A builder; NULL when out of memory (every sp_gb_ call accepts NULL and
 * sp_gb_finish then fails). */
struct sp_gbuild *sp_gb_new(void);
/* A new rule, with no alternatives yet; returns its id. */
int sp_gb_rule(struct sp_gbuild *b);
/* Opens an alternative; symbols go to the innermost open one. */
void sp_gb_begin(struct sp_gbuild *b);
void sp_gb_set(struct sp_gbuild *b, const struct sp_gset *s);
void sp_gb_range(struct sp_gbuild *b, unsigned lo, unsigned hi);
void sp_gb_bytes(struct sp_gbuild *b, const char *s, size_t n);  // a literal
void sp_gb_lit(struct sp_gbuild *b, const char *s);
void sp_gb_ref(struct sp_gbuild *b, int rule);
/* Closes the innermost alternative and adds it to `rule`. */
void sp_gb_end(struct sp_gbuild *b, int rule);
/* Symbols so far (to bound what a schema may cost). */
size_t sp_gb_size(const struct sp_gbuild *b);
/* Makes the grammar whose sentences are those of `start`; frees the builder
 * in every case. SP_ERR_NOMEM, or SP_ERR_ARG (message set) for an open
 * alternative, a bad rule id or a grammar over SP_GRAMMAR_MAX_SYMBOLS. */
enum sp_status sp_gb_finish(struct sp_gbuild *b, int start, struct sp_grammar **out);
void sp_gb_free(struct sp_gbuild *b);

/* One more owner of g (it is shared, read-only, by the requests of a group);
 * returns g. sp_grammar_free drops one, and frees it with the last. */
struct sp_grammar *sp_grammar_ref(struct sp_grammar *g);
void sp_grammar_free(struct sp_grammar *g);

/* The token texts as a trie, for sp_gmatch_allowed: text[off[i] .. off[i+1])
 * is token i's text; tokens with empty text are left out. */
struct sp_gtrie;
enum sp_status sp_gtrie_new(const char *text, const int64_t *off, int64_t n_tokens, struct sp_gtrie **out);
void sp_gtrie_free(struct sp_gtrie *t);

struct sp_gmatch;
/* A matcher at the start of `g` (which must outlive it). */
enum sp_status sp_gmatch_new(const struct sp_grammar *g, struct sp_gmatch **out);
void sp_gmatch_free(struct sp_gmatch *m);
/* Back to the start, keeping what the memo learned. */
enum sp_status sp_gmatch_reset(struct sp_gmatch *m);
/* Whether the bytes would be accepted next; the matcher does not change. */
bool sp_gmatch_try(struct sp_gmatch *m, const void *bytes, size_t n);
/* Takes the bytes if they are accepted next (true); else changes nothing. */
bool sp_gmatch_feed(struct sp_gmatch *m, const void *bytes, size_t n);
/* Sets ok[i] to 1 for every token of the trie whose text may come next, to
 * 0 for the others (ok has the trie's n_tokens entries); returns how many
 * may. */
int64_t sp_gmatch_allowed(struct sp_gmatch *m, const struct sp_gtrie *t, uint8_t *ok);
/* The text fed so far is a sentence of the grammar. */
bool sp_gmatch_accepting(const struct sp_gmatch *m);
/* ... and no byte may follow it. */
bool sp_gmatch_done(const struct sp_gmatch *m);

#endif
