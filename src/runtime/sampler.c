/* sampler.c - logits -> token. */
#include "runtime/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"
#include "kernels/cpu/kernels.h"

struct cand {
    float logit;
    int32_t id;
};

struct sp_sampler {
    struct sp_sampler_params p;
    int64_t vocab;
    struct sp_rng rng;
    int32_t *count;  // (vocab) occurrences in the penalty window
    int32_t *hist;   // ring of the last penalty_last_n tokens (when bounded)
    int64_t hist_len, hist_pos;
    int32_t cap_last_n;  // capacity of hist
    struct cand *c;  // (vocab)
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
    int64_t hn = p->penalty_last_n > 0 ? p->penalty_last_n : 1;
    s->cap_last_n = (int32_t)hn;
    s->hist = sp_malloc((size_t)hn * sizeof *s->hist, SP_MEM_ACT);
    if (!s->count || !s->c || !s->hist) {
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

static int cmp_cand(const void *a, const void *b) {
    const struct cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Keeps the k best candidates of c[0..n) at the front, sorted (a bounded
 * min-heap, so a 150k vocabulary with k = 40 costs one pass). */
static int64_t keep_top_k(struct cand *c, int64_t n, int64_t k) {
    if (k >= n) {
        qsort(c, (size_t)n, sizeof *c, cmp_cand);
        return n;
    }
    /* heap of the k best seen so far, worst at the root */
    for (int64_t i = 0; i < n; i++) {
        struct cand x = c[i];
        int64_t size = i < k ? i : k;
        if (size == k) {
            if (cmp_cand(&x, &c[0]) >= 0) continue;  // not better than the worst kept
            int64_t j = 0;  // sift down from the root
            for (;;) {
                int64_t l = 2 * j + 1, r = l + 1, w = j;
                const struct cand *wc = &x;
                if (l < k && cmp_cand(&c[l], wc) > 0) w = l, wc = &c[l];
                if (r < k && cmp_cand(&c[r], wc) > 0) w = r;
                if (w == j) break;
                c[j] = c[w];
                j = w;
            }
            c[j] = x;
        } else {
            int64_t j = size;  // sift up
            while (j > 0 && cmp_cand(&c[(j - 1) / 2], &x) < 0) {
                c[j] = c[(j - 1) / 2];
                j = (j - 1) / 2;
            }
            c[j] = x;
        }
    }
    qsort(c, (size_t)k, sizeof *c, cmp_cand);
    return k;
}

int32_t sp_sampler_sample(struct sp_sampler *s, float *logits) {
    const struct sp_sampler_params *p = &s->p;
    int64_t V = s->vocab;
    if (p->repeat_penalty != 1.0f || p->presence_penalty != 0.0f || p->frequency_penalty != 0.0f) {
        for (int64_t i = 0; i < V; i++) {
            int32_t n = s->count[i];
            if (!n) continue;
            float l = logits[i];
            if (p->repeat_penalty != 1.0f) l = l > 0 ? l / p->repeat_penalty : l * p->repeat_penalty;
            logits[i] = l - p->presence_penalty - p->frequency_penalty * (float)n;
        }
    }
    if (p->temp <= 0.0f) return sp_argmax(logits, V);
    for (int64_t i = 0; i < V; i++) s->c[i] = (struct cand){logits[i], (int32_t)i};
    int64_t n = keep_top_k(s->c, V, p->top_k > 0 ? p->top_k : V);
    /* probabilities at temperature 1 for the top-p / min-p cuts, as llama.cpp orders them */
    double mx = s->c[0].logit, sum = 0;
    for (int64_t i = 0; i < n; i++) sum += exp((double)s->c[i].logit - mx);
    if (p->top_p < 1.0f) {
        double cum = 0;
        for (int64_t i = 0; i < n; i++) {
            cum += exp((double)s->c[i].logit - mx) / sum;
            if (cum >= p->top_p) {
                n = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) {
        double cut = mx + log((double)p->min_p);
        int64_t k = 1;
        while (k < n && s->c[k].logit >= cut) k++;
        n = k;
    }
    double total = 0;
    for (int64_t i = 0; i < n; i++) total += exp(((double)s->c[i].logit - mx) / p->temp);
    double r = (double)(sp_rng_next(&s->rng) >> 11) * (1.0 / 9007199254740992.0) * total;
    for (int64_t i = 0; i < n; i++) {
        r -= exp(((double)s->c[i].logit - mx) / p->temp);
        if (r <= 0) return s->c[i].id;
    }
    return s->c[n - 1].id;
}
