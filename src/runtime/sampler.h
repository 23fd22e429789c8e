/*
 * sampler.h - turns logits into the next token: repetition, presence and
 * frequency penalties, then top-k, top-p, min-p, temperature and a seeded
 * draw (greedy when the temperature is 0). Reproducible for a given seed.
 *
 *     struct sp_sampler_params sp = sp_sampler_defaults();
 *     sp.temp = 0.7f; sp.seed = 42;
 *     struct sp_sampler *s;
 *     sp_sampler_create(&sp, vocab, &s);
 *     for each prompt token: sp_sampler_accept(s, tok);
 *     int32_t next = sp_sampler_sample(s, logits);   // logits are modified
 *     sp_sampler_accept(s, next);
 *     sp_sampler_free(s);
 */
#ifndef SP_RUNTIME_SAMPLER_H
#define SP_RUNTIME_SAMPLER_H

#include <stdbool.h>
#include <stdint.h>

#include "core/rng.h"
#include "core/status.h"

struct sp_sampler_params {
    float temp;              // <= 0: greedy
    int32_t top_k;           // <= 0: off
    float top_p;             // >= 1: off
    float min_p;             // <= 0: off
    float repeat_penalty;    // 1: off (divides positive logits, multiplies negative ones)
    float presence_penalty;  // 0: off (subtracted once per seen token)
    float frequency_penalty; // 0: off (subtracted per occurrence)
    int32_t penalty_last_n;  // tokens of history the penalties look at (-1: all)
    uint64_t seed;
};

struct sp_sampler;
struct sp_cand;

struct sp_sampler_params sp_sampler_defaults(void);
enum sp_status sp_sampler_create(const struct sp_sampler_params *p, int64_t vocab, struct sp_sampler **out);
void sp_sampler_free(struct sp_sampler *s);
/* Records a token of the context (prompt or generated) for the penalties. */
void sp_sampler_accept(struct sp_sampler *s, int32_t token);
/* Forgets the history (a new request), keeping the parameters and the generator. */
void sp_sampler_reset(struct sp_sampler *s);
/* New parameters and seed, empty history: reuses the buffers for another
 * request. penalty_last_n may not exceed the one the sampler was created with
 * (larger values are clamped to it); -1 (all history) stays -1. */
void sp_sampler_configure(struct sp_sampler *s, const struct sp_sampler_params *p);
int32_t sp_sampler_sample(struct sp_sampler *s, float *logits);
/* The k where sampling draws from the k best logits alone, as they are
 * (a temperature above 0, top-k k below the vocabulary, no penalty): then
 * sp_sampler_sample_top of them is sp_sampler_sample's choice. 0 otherwise. */
int64_t sp_sampler_top_k(const struct sp_sampler *s);
/* sp_sampler_top_k where it is at most max (the most best logits a forward
 * pass hands back for a row: SP_TOP_K_MAX), 0 otherwise. */
int64_t sp_sampler_top_k_upto(const struct sp_sampler *s, int64_t max);
/* sp_sampler_sample from the n >= sp_sampler_top_k(s) best logits c (in
 * sp_top_k's order: a backend's, or the host's), not the whole vocabulary's. */
int32_t sp_sampler_sample_top(struct sp_sampler *s, const struct sp_cand *c, int64_t n);
/* Whether sample takes the largest logit as it is (greedy, no penalty):
 * then sp_argmax of the logits, or a backend's greedy choice, is its choice. */
bool sp_sampler_greedy(const struct sp_sampler *s);
/* Index of the largest logit (first on ties; NaN is passed over). */
int32_t sp_argmax(const float *logits, int64_t n);

#endif
