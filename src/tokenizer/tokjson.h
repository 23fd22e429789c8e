/*
 * tokjson.h - a fast reader for tokenizer.json.
 *
 * A 150k-token vocabulary and its merges are most of an 11 MB file; building
 * a cJSON node for each of them costs more than the whole load budget. This
 * reader scans the document itself, reads model.vocab (an object) and
 * model.merges (an array) straight into flat tables, and hands every other
 * value (normalizer, pre_tokenizer, added_tokens, ...) to cJSON, so the rest
 * of the loader works on an ordinary tree.
 *
 *     struct sp_tokjson tj;
 *     if (sp_tokjson_read(text, len, "tokenizer.json", &tj) != SP_OK) ...
 *     const cJSON *model = cJSON_GetObjectItemCaseSensitive(tj.root, "model");
 *     for (int64_t i = 0; i < tj.n_vocab; i++)
 *         use(tj.arena + tj.vocab[i].off, tj.vocab[i].len, tj.vocab[i].id);
 *     sp_tokjson_free(&tj);
 *
 * Everything is owned by the struct until sp_tokjson_free (NULL-safe).
 */
#ifndef SP_TOKENIZER_TOKJSON_H
#define SP_TOKENIZER_TOKJSON_H

#include <cjson/cJSON.h>
#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

struct sp_tokjson_str {
    uint32_t off, len;  // bytes in arena (decoded, not NUL-terminated)
};

struct sp_tokjson_vocab {
    struct sp_tokjson_str text;
    int64_t id;
};

struct sp_tokjson_merge {
    struct sp_tokjson_str a, b;
};

struct sp_tokjson {
    cJSON *root;  // the document minus model.vocab / model.merges when read here
    char *arena;  // decoded strings, back to back
    size_t arena_len, arena_cap;
    struct sp_tokjson_vocab *vocab;  // (n_vocab) in file order
    int64_t n_vocab, vocab_cap;
    struct sp_tokjson_merge *merges;  // (n_merges) in file order = rank order
    int64_t n_merges, merges_cap;
    bool has_vocab;   // model.vocab was an object and is in `vocab`
    bool has_merges;  // model.merges was an array and is in `merges`
};

/* Reads len bytes of tokenizer.json; `what` names it in errors. */
enum sp_status sp_tokjson_read(const char *text, size_t len, const char *what, struct sp_tokjson *out);
void sp_tokjson_free(struct sp_tokjson *tj);

/* A string member of a JSON object; NULL when absent or not a string. */
const char *sp_tokjson_string(const cJSON *j, const char *key);

/* Walks one pipeline component of tokenizer.json (a normalizer,
 * pre-tokenizer or decoder): objects with a "type", where a "Sequence" holds
 * its parts in the array named list_key (nested at most 32 deep). Calls
 * leaf(ctx, object, type, where) for every other part, in order, `where`
 * naming it ("decoder.decoders[1]"); stops at the first error. */
typedef enum sp_status (*sp_tokjson_leaf_fn)(void *ctx, const cJSON *j, const char *type, const char *where);
enum sp_status sp_tokjson_walk(const cJSON *j, const char *list_key, const char *where, sp_tokjson_leaf_fn leaf,
                               void *ctx);

/* Room for element n of a growing array *v of *cap elements of `size`
 * bytes (doubling); an error naming `where` when memory runs out. */
enum sp_status sp_tokjson_reserve(void **v, int64_t *cap, int64_t n, size_t size, const char *where);


#endif
