/* sampler.c - logits -> token. */
#include "runtime/sampler.h"

#include <math.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "backend/backend.h"
#include "backend/cpu/kernels.h"

struct sp_sampler {
    struct sp_sampler_params p;
    int64_t vocab;
    struct sp_rng rng;
    int32_t *count;  // (vocab) occurrences in the penalty window
    int32_t *hist;   // ring of the last penalty_last_n tokens (when bounded)
    int64_t hist_len, hist_pos;
    int32_t cap_last_n;  // capacity of hist
    struct sp_cand *c;  // (vocab) the candidates sorted first, in order; past them, nucleus_end's scratch
    float *w;        // (vocab) the vocabulary's probabilities, when top-k is off
};

struct sp_sampler_params sp_sampler_defaults(void) {
    return (struct sp_sampler_params){.temp = 0.8f, .top_k = 40, .top_p = 0.95f, .min_p = 0.05f,
                                      .repeat_penalty = 1.0f, .presence_penalty = 0.0f, .frequency_penalty = 0.0f,
                                      .penalty_last_n = 64, .seed = 0};
}

enum sp_status sp_sampler_create(const struct sp_sampler_params *p, int64_t vocab, struct sp_sampler **out) {
    *out = NULL;
    struct sp_sampler *s = sp_calloc(1, sizeof *s, SP_MEM_ACT);
    if (!s) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    s->p = *p;
    s->vocab = vocab;
    sp_rng_seed(&s->rng, p->seed);
    s->count = sp_calloc((size_t)vocab, sizeof *s->count, SP_MEM_ACT);
    s->c = sp_malloc((size_t)vocab * sizeof *s->c, SP_MEM_ACT);
    s->w = sp_malloc((size_t)vocab * sizeof *s->w, SP_MEM_ACT);
    int64_t hn = p->penalty_last_n > 0 ? p->penalty_last_n : 1;
    s->cap_last_n = (int32_t)hn;
    s->hist = sp_malloc((size_t)hn * sizeof *s->hist, SP_MEM_ACT);
    if (!s->count || !s->c || !s->w || !s->hist) {
        sp_sampler_free(s);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    *out = s;
    return SP_OK;
}

void sp_sampler_free(struct sp_sampler *s) {
    if (!s) return;
    sp_free(s->count);
    sp_free(s->hist);
    sp_free(s->c);
    sp_free(s->w);
    sp_free(s);
}

void sp_sampler_reset(struct sp_sampler *s) {
    memset(s->count, 0, (size_t)s->vocab * sizeof *s->count);
    s->hist_len = s->hist_pos = 0;
}

void sp_sampler_configure(struct sp_sampler *s, const struct sp_sampler_params *p) {
    int32_t cap = s->cap_last_n;
    s->p = *p;
    if (s->p.penalty_last_n > cap) s->p.penalty_last_n = cap;
    sp_rng_seed(&s->rng, p->seed);
    sp_sampler_reset(s);
}

void sp_sampler_accept(struct sp_sampler *s, int32_t tok) {
    if (tok < 0 || tok >= s->vocab || s->p.penalty_last_n == 0) return;
    if (s->p.penalty_last_n > 0) {
        if (s->hist_len == s->p.penalty_last_n) {
            s->count[s->hist[s->hist_pos]]--;
        } else {
            s->hist_len++;
        }
        s->hist[s->hist_pos] = tok;
        s->hist_pos = (s->hist_pos + 1) % s->p.penalty_last_n;
    }
    s->count[tok]++;
}

int32_t sp_argmax(const float *v, int64_t n) { return (int32_t)sp_kernels()->argmax(v, n); }

/* Past the sorted candidates (top-k off), sets are bounded by rank: a
 * candidate is in when it ranks below the last sorted one (c[sorted - 1])
 * and at or above `bound` (highest logit first, then the lower id; NaN and
 * -inf are never in). */
static bool ranks_at_or_above(float l, int64_t id, struct sp_cand b) {
    return l > b.logit || (l == b.logit && id <= b.id);
}
static bool past_sorted(float l, int64_t i, struct sp_cand last) {
    return l > -INFINITY && !ranks_at_or_above(l, i, last);
}

/* Buckets of logits that locate a nucleus past the sorted candidates. */
#define NUCLEUS_BUCKETS 1024
static int bucket_of(float f) { return f >= NUCLEUS_BUCKETS - 1 ? NUCLEUS_BUCKETS - 1 : f >= 0 ? (int)f : 0; }

/* The last candidate of the top-p nucleus when it reaches past the sorted
 * ones, which hold probability mass cum (s->w: the probabilities at
 * temperature 1): a histogram of the others' mass over their logits finds
 * the bucket where the mass reaches top_p, and only that bucket is sorted.
 * A bound of -inf: the nucleus is every candidate. */
static struct sp_cand nucleus_end(struct sp_sampler *s, const float *logits, int64_t sorted, double cum, double top_p) {
    const int64_t V = s->vocab;
    const struct sp_cand last = s->c[sorted - 1];
    float hi = last.logit, lo = hi;
    for (int64_t i = 0; i < V; i++) lo = past_sorted(logits[i], i, last) && logits[i] < lo ? logits[i] : lo;
    /* higher logits in lower buckets, equal ones in one; others go to
     * bucket 0 with no mass (NaN from a degenerate scale too) */
    const float scale = hi > lo ? (float)(NUCLEUS_BUCKETS - 1) / (hi - lo) : 0.0f;
#define BUCKET(i) (past_sorted(logits[i], i, last) ? bucket_of((hi - logits[i]) * scale) : 0)
    double mass[NUCLEUS_BUCKETS] = {0};
    for (int64_t i = 0; i < V; i++) mass[BUCKET(i)] += past_sorted(logits[i], i, last) ? s->w[i] : 0.0f;
    int b = 0;
    for (; b < NUCLEUS_BUCKETS && cum + mass[b] < top_p; b++) cum += mass[b];
    if (b == NUCLEUS_BUCKETS) return (struct sp_cand){-INFINITY, INT32_MAX};
    struct sp_cand *m = s->c + sorted;  // the bucket's candidates, after the sorted ones
    int64_t nm = 0;
    for (int64_t i = 0; i < V; i++)
        if (BUCKET(i) == b && past_sorted(logits[i], i, last)) m[nm++] = (struct sp_cand){logits[i], (int32_t)i};
#undef BUCKET
    qsort(m, (size_t)nm, sizeof *m, sp_cand_cmp);
    for (int64_t j = 0; j < nm; j++) {
        cum += s->w[m[j].id];
        if (cum >= top_p) return m[j];
    }
    return m[nm - 1];
}

/* s->w = the softmax of the whole vocabulary's logits / temp (NaN as
 * -inf), for cuts and draws that see past the sorted candidates. */
static void vocab_softmax(struct sp_sampler *s, const float *logits, float temp) {
    const float inv = 1.0f / temp;
    for (int64_t i = 0; i < s->vocab; i++) s->w[i] = isnan(logits[i]) ? -INFINITY : logits[i] * inv;
    float m = -INFINITY;
    const float share = (float)(1.0 / sp_kernels()->softmax_chunk(s->w, s->vocab, &m));
    for (int64_t i = 0; i < s->vocab; i++) s->w[i] *= share;
}

/* The repetition, presence and frequency penalties of a token seen n
 * times in the window. */
static void penalize(const struct sp_sampler_params *p, float *logits, int64_t t, int32_t n) {
    float l = logits[t];
    if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
    logits[t] = l - p->presence_penalty - p->frequency_penalty * (float)n;
}

/* Candidates sorted at first: top_k of them, or enough for most
 * distributions' top-p mass without it. */
#define SORTED_FIRST 256

/* Whether any of the penalties is on. */
static bool penalized(const struct sp_sampler_params *p) {
    return p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f;
}

bool sp_sampler_greedy(const struct sp_sampler *s) { return s->p.temp <= 0.0f && !penalized(&s->p); }

/* The draw from the candidates s->c[0 .. sorted), the best of the
 * vocabulary's logits in order, of which the first K (the top-k; the
 * vocabulary when off) are in the running. Where sorted == K (top-k on)
 * that is all it reads, and logits may be NULL. */
static int32_t draw(struct sp_sampler *s, const float *logits, int64_t K, int64_t sorted) {
    const struct sp_sampler_params *p = &s->p;
    const int64_t V = s->vocab;
    const struct sp_cand *c = s->c;
    double mx = c[0].logit;
    if (mx == -INFINITY) return c[0].id;
    /* top-p on the probabilities at temperature 1 over the top_k, as
     * llama.cpp orders the cuts: those of the sorted candidates, or (top-k
     * off, 256 sorted) of the whole vocabulary, the nucleus then reaching
     * past the sorted ones as far as nucleus_end finds */
    int64_t n = K;
    struct sp_cand bound = {-INFINITY, INT32_MAX};
    float w_temp = 0.0f;  // the temperature of the softmax in s->w (0: none)
    if (p->top_p < 1.0f) {
        const bool all_sorted = sorted == K;
        double sum = 0, cum = 0;
        if (all_sorted) {
            for (int64_t i = 0; i < K; i++) sum += exp((double)c[i].logit - mx);
        } else {
            w_temp = 1.0f;
            vocab_softmax(s, logits, w_temp);
        }
        int64_t i = 0;
        for (; i < sorted; i++) {
            cum += all_sorted ? exp((double)c[i].logit - mx) / sum : (double)s->w[c[i].id];
            if (cum >= p->top_p) break;
        }
        if (i < sorted)
            n = i + 1;
        else if (!all_sorted)
            bound = nucleus_end(s, logits, sorted, cum, p->top_p);
    }
    /* min-p: as far as the candidates are sorted; a cut past them is left
     * to the draw (the set is then every candidate at or above it) */
    double cut = p->min_p > 0.0f ? mx + log((double)p->min_p) : -INFINITY;
    if (p->min_p > 0.0f) {
        int64_t k = 1;
        while (k < n && k < sorted && c[k].logit >= cut) k++;
        if (k < sorted || k == n) n = k;
    }
    /* the draw at the temperature, over the first n in order */
    double r = (double)(sp_rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0);
    if (n <= sorted) {
        double total = 0;
        for (int64_t i = 0; i < n; i++) total += exp(((double)c[i].logit - mx) / p->temp);
        r *= total;
        for (int64_t i = 0; i < n; i++) {
            r -= exp(((double)c[i].logit - mx) / p->temp);
            if (r <= 0) return c[i].id;
        }
        return c[n - 1].id;
    }
    /* past the sorted candidates (top-k off, no cut among them): the set
     * is those, then every other candidate within the nucleus' bound and at
     * or above the min-p cut, in id order (any fixed order draws the same
     * distribution; this one needs no further sorting), weighted by the
     * vocabulary's softmax at the temperature */
    if (w_temp != p->temp) vocab_softmax(s, logits, p->temp);
    const struct sp_cand last = c[sorted - 1];
#define REST(i) (past_sorted(logits[i], i, last) && logits[i] >= cut && ranks_at_or_above(logits[i], i, bound))
    double total = 0;
    for (int64_t i = 0; i < sorted; i++) total += s->w[c[i].id];
    for (int64_t i = 0; i < V; i++)
        if (REST(i)) total += s->w[i];
    r *= total;
    for (int64_t i = 0; i < sorted; i++) {
        r -= s->w[c[i].id];
        if (r <= 0) return c[i].id;
    }
    int32_t chosen = c[sorted - 1].id;
    for (int64_t i = 0; i < V; i++) {
        if (!REST(i)) continue;
        chosen = (int32_t)i;
        r -= s->w[i];
        if (r <= 0) break;
    }
#undef REST
    return chosen;  // (or the last of the set, r past the rounded total)
}

int32_t sp_sampler_sample(struct sp_sampler *s, float *logits) {
    const struct sp_sampler_params *p = &s->p;
    int64_t V = s->vocab;
    if (penalized(p)) {
        if (p->penalty_last_n > 0) {
            /* the tokens of the window, each once: its count is negated when
             * done, then restored */
            for (int64_t i = 0; i < s->hist_len; i++) {
                int32_t t = s->hist[i];
                if (s->count[t] > 0) penalize(p, logits, t, s->count[t]), s->count[t] = -s->count[t];
            }
            for (int64_t i = 0; i < s->hist_len; i++)
                if (s->count[s->hist[i]] < 0) s->count[s->hist[i]] = -s->count[s->hist[i]];
        } else {
            for (int64_t i = 0; i < V; i++)
                if (s->count[i]) penalize(p, logits, i, s->count[i]);
        }
    }
    if (p->temp <= 0.0f) return sp_argmax(logits, V);
    const int64_t K = p->top_k > 0 && p->top_k < V ? p->top_k : V;  // the vocabulary when top-k is off
    const int64_t sorted = K < V ? K : V < SORTED_FIRST ? V : SORTED_FIRST;
    sp_top_k(logits, V, sorted, s->c);
    return draw(s, logits, K, sorted);
}

int64_t sp_sampler_top_k(const struct sp_sampler *s) {
    const struct sp_sampler_params *p = &s->p;
    return p->temp > 0.0f && !penalized(p) && p->top_k > 0 && p->top_k < s->vocab ? p->top_k : 0;
}

int64_t sp_sampler_top_k_upto(const struct sp_sampler *s, int64_t max) {
    int64_t k = sp_sampler_top_k(s);
    return k <= max ? k : 0;
}

int32_t sp_sampler_sample_top(struct sp_sampler *s, const struct sp_cand *c, int64_t n) {
    int64_t K = sp_sampler_top_k(s);
    if (K <= 0 || K > n) K = n;
    memcpy(s->c, c, (size_t)K * sizeof *c);
    return draw(s, NULL, K, K);
}
