/*
 * test_sampler.c - the sampler's draws against the distribution it defines
 * (runtime/sampler.h): top-k, then top-p and min-p on the temperature-1
 * probabilities, then the draw at the temperature. Each test fixes its
 * seed, so the frequency checks (within 5 binomial standard deviations)
 * give the same result on every run. Vocabularies of a few thousand
 * tokens take the paths a real one does: candidates sorted only as far as
 * a cut or the draw needs.
 */
#include "helpers.h"

#include <math.h>

#include "backend/backend.h"
#include "core/rng.h"
#include "runtime/sampler.h"

#define VOCAB 3000

static struct sp_sampler *make(int32_t top_k, float top_p, float min_p, float temp, uint64_t seed) {
    struct sp_sampler_params p = sp_sampler_defaults();
    p.top_k = top_k;
    p.top_p = top_p;
    p.min_p = min_p;
    p.temp = temp;
    p.seed = seed;
    struct sp_sampler *s;
    assert_int_equal(sp_sampler_create(&p, VOCAB, &s), SP_OK);
    return s;
}

/* Draws `draws` tokens from logits (a fresh copy each time) into count. */
static void draw(struct sp_sampler *s, const float *logits, int draws, int64_t *count) {
    float *l = malloc(VOCAB * sizeof *l);
    memset(count, 0, VOCAB * sizeof *count);
    for (int i = 0; i < draws; i++) {
        memcpy(l, logits, VOCAB * sizeof *l);
        int32_t t = sp_sampler_sample(s, l);
        assert_true(t >= 0 && t < VOCAB);
        count[t]++;
    }
    free(l);
}

/* The reference order (highest logit first, ties by id) and the
 * probabilities at temperature temp of the first n of it, renormalized. */
static int cmp_desc(const void *a, const void *b, void *arg) {
    const float *l = arg;
    int32_t x = *(const int32_t *)a, y = *(const int32_t *)b;
    if (l[x] != l[y]) return l[x] > l[y] ? -1 : 1;
    return x < y ? -1 : 1;
}
static int32_t *ref_order(const float *l) {
    int32_t *o = malloc(VOCAB * sizeof *o);
    for (int32_t i = 0; i < VOCAB; i++) o[i] = i;
    qsort_r(o, VOCAB, sizeof *o, cmp_desc, (void *)l);
    return o;
}

/* The frequencies of `draws` draws against want[] (a distribution over
 * the vocabulary): none drawn where want is 0, and within 5 standard
 * deviations (binomial) for each run of consecutive ids expected 50 times
 * or more (single tokens where they are; the flat rest in runs, where the
 * normal approximation holds). */
static void check_freq(const int64_t *count, int draws, const double *want) {
    double p = 0;
    int64_t c = 0, from = 0;
    for (int64_t i = 0; i < VOCAB; i++) {
        if (want[i] == 0.0) assert_int_equal(count[i], 0);
        p += want[i];
        c += count[i];
        if (p * draws < 50 && i < VOCAB - 1) continue;
        double f = (double)c / draws, sd = sqrt(p * (1 - p) / draws);
        if (fabs(f - p) > 5 * sd + 1e-9)
            print_error("tokens %lld-%lld: frequency %.5f, probability %.5f\n", (long long)from, (long long)i, f, p);
        assert_true(fabs(f - p) <= 5 * sd + 1e-9);
        p = 0;
        c = 0;
        from = i + 1;
    }
}

/* want = softmax(l / temp) over the first n tokens of the reference order. */
static void ref_dist(const float *l, const int32_t *o, int64_t n, float temp, double *want) {
    double mx = l[o[0]], sum = 0;
    memset(want, 0, VOCAB * sizeof *want);
    for (int64_t i = 0; i < n; i++) sum += exp(((double)l[o[i]] - mx) / temp);
    for (int64_t i = 0; i < n; i++) want[o[i]] = exp(((double)l[o[i]] - mx) / temp) / sum;
}

/* Three tokens well above a flat rest (the shape of real logits): 40% of
 * the mass is in the rest, past any first sorting. */
#define BEST 2345
static void peaked(float *l) {
    for (int64_t i = 0; i < VOCAB; i++) l[i] = 0.0f;
    l[BEST] = 8.0f;
    l[7] = 7.0f;
    l[1500] = 6.0f;
}

static void test_greedy(void **state) {
    float l[VOCAB];
    peaked(l);
    struct sp_sampler *s = make(40, 0.95f, 0.05f, 0.0f, 1);
    assert_int_equal(sp_sampler_sample(s, l), BEST);
    sp_sampler_free(s);
    /* a repeat penalty of 4 on the seen best (8 -> 2) leaves token 7 first */
    struct sp_sampler_params p = sp_sampler_defaults();
    p.temp = 0.0f;
    p.repeat_penalty = 4.0f;
    assert_int_equal(sp_sampler_create(&p, VOCAB, &s), SP_OK);
    sp_sampler_accept(s, BEST);
    peaked(l);
    assert_int_equal(sp_sampler_sample(s, l), 7);
    sp_sampler_free(s);
}

/* The penalties change the logits of the tokens in the window once each
 * (count times for the frequency one), with a window of 3 that has wrapped
 * and with the whole history. */
static void test_penalties(void **state) {
    const int32_t seen[] = {5, 5, 9, 5, 12};
    const int32_t lasts[] = {3, -1};
    const float want5[] = {-0.25f, -0.75f};
    for (int w = 0; w < 2; w++) {
        struct sp_sampler_params p = sp_sampler_defaults();
        p.temp = 0.0f;
        p.repeat_penalty = 2.0f;
        p.presence_penalty = 0.5f;
        p.frequency_penalty = 0.25f;
        p.penalty_last_n = lasts[w];
        struct sp_sampler *s;
        assert_int_equal(sp_sampler_create(&p, VOCAB, &s), SP_OK);
        for (int i = 0; i < 5; i++) sp_sampler_accept(s, seen[i]);
        float *l = malloc(VOCAB * sizeof *l);
        for (int64_t r = 0; r < 2; r++) {  // twice: the counts are left as they were
            for (int64_t i = 0; i < VOCAB; i++) l[i] = i == 9 ? -1.0f : 1.0f;
            assert_int_equal(sp_sampler_sample(s, l), 0);
            for (int64_t i = 0; i < VOCAB; i++) {
                float want = i == 5 ? want5[w] : i == 9 ? -2.75f : i == 12 ? -0.25f : 1.0f;
                assert_true(l[i] == want);
            }
        }
        free(l);
        sp_sampler_free(s);
    }
}

/* No cut: every token at its softmax probability, temperatures 1 and 0.7. */
static void test_whole_vocabulary(void **state) {
    float *l = malloc(VOCAB * sizeof *l);
    double *want = malloc(VOCAB * sizeof *want);
    int64_t *count = malloc(VOCAB * sizeof *count);
    peaked(l);
    int32_t *o = ref_order(l);
    const float temps[] = {1.0f, 0.7f};
    for (int t = 0; t < 2; t++) {
        struct sp_sampler *s = make(0, 1.0f, 0.0f, temps[t], 2);
        draw(s, l, 20000, count);
        ref_dist(l, o, VOCAB, temps[t], want);
        check_freq(count, 20000, want);
        sp_sampler_free(s);
    }
    free(o);
    free(l);
    free(want);
    free(count);
}

/* top-p: a nucleus of 0.9 holds the three peaks and about 2250 of the
 * flat rest, in id order (past the first sorted candidates), one of 0.61
 * about 90 of them, one of 0.633 exactly the 256 sorted first (ties go by
 * id there too: the last of them is id 253), one of 0.4 two peaks. */
static void test_top_p(void **state) {
    float *l = malloc(VOCAB * sizeof *l);
    double *want = malloc(VOCAB * sizeof *want), *p1 = malloc(VOCAB * sizeof *p1);
    int64_t *count = malloc(VOCAB * sizeof *count);
    peaked(l);
    int32_t *o = ref_order(l);
    ref_dist(l, o, VOCAB, 1.0f, p1);
    const float tops[] = {0.9f, 0.4f, 0.61f, 0.633f};
    for (int t = 0; t < 4; t++) {
        int64_t n = 0;
        double cum = 0;
        while (n < VOCAB && cum < tops[t]) cum += p1[o[n++]];
        struct sp_sampler *s = make(0, tops[t], 0.0f, 1.0f, 3);
        draw(s, l, 5000, count);
        ref_dist(l, o, n, 1.0f, want);
        check_freq(count, 5000, want);
        sp_sampler_free(s);
        if (t == 0) assert_true(n > 2000);
        if (t == 1) assert_int_equal(n, 2);
        if (t == 2) assert_true(n > 50 && n < 200);
        if (t == 3) assert_true(n == 256 && o[n - 1] == 253);
    }
    /* top-k 256 of the flat rest, nearly uniform at temperature 50: the
     * ties taken are the lowest ids */
    struct sp_sampler *s = make(256, 1.0f, 0.0f, 50.0f, 12);
    draw(s, l, 5000, count);
    ref_dist(l, o, 256, 50.0f, want);
    check_freq(count, 5000, want);
    sp_sampler_free(s);
    free(o);
    free(l);
    free(want);
    free(p1);
    free(count);
}

/* min-p with top-k off (a cut within the first sorted candidates and one
 * past them), top-p over spread logits, and top-k with the rest. */
static void test_min_p_and_top_k(void **state) {
    struct sp_rng rng;
    sp_rng_seed(&rng, 4);
    float *l = malloc(VOCAB * sizeof *l);
    double *want = malloc(VOCAB * sizeof *want);
    int64_t *count = malloc(VOCAB * sizeof *count);
    for (int64_t i = 0; i < VOCAB; i++) l[i] = sp_rng_normal(&rng) * 2.0f;
    int32_t *o = ref_order(l);
    /* min-p 0.2: the tokens within log(5) of the best */
    int64_t n = 1;
    while (n < VOCAB && l[o[n]] >= l[o[0]] + log(0.2)) n++;
    struct sp_sampler *s = make(0, 1.0f, 0.2f, 0.8f, 5);
    draw(s, l, 20000, count);
    ref_dist(l, o, n, 0.8f, want);
    check_freq(count, 20000, want);
    sp_sampler_free(s);
    free(o);
    /* min-p past the first sorted candidates: the rest at 0 (even ids) and
     * -2 (odd ids), the cut at -1 keeping the peaks and the even ids */
    peaked(l);
    for (int64_t i = 0; i < VOCAB; i++)
        if (l[i] == 0.0f && i % 2) l[i] = -2.0f;
    o = ref_order(l);
    const float min_p = expf(-9.0f);
    for (n = 1; n < VOCAB && l[o[n]] >= l[o[0]] + log(min_p);) n++;
    assert_int_equal(n, 3 + (VOCAB - 2) / 2);
    s = make(0, 1.0f, min_p, 1.0f, 13);
    draw(s, l, 20000, count);
    ref_dist(l, o, n, 1.0f, want);
    check_freq(count, 20000, want);
    sp_sampler_free(s);
    free(o);
    for (int64_t i = 0; i < VOCAB; i++) l[i] = sp_rng_normal(&rng) * 2.0f;
    o = ref_order(l);
    /* top-p 0.9 over these spread logits: a nucleus of ~1000, located past
     * the first sorted candidates in a histogram of the rest */
    double *p1 = malloc(VOCAB * sizeof *p1), cum = 0;
    ref_dist(l, o, VOCAB, 1.0f, p1);
    for (n = 0; n < VOCAB && cum < 0.9;) cum += p1[o[n++]];
    assert_true(n > 500);
    s = make(0, 0.9f, 0.0f, 1.0f, 14);
    draw(s, l, 20000, count);
    ref_dist(l, o, n, 1.0f, want);
    check_freq(count, 20000, want);
    sp_sampler_free(s);
    free(p1);
    /* top-k 40 at temperature 1.5 */
    s = make(40, 1.0f, 0.0f, 1.5f, 6);
    draw(s, l, 20000, count);
    ref_dist(l, o, 40, 1.5f, want);
    check_freq(count, 20000, want);
    sp_sampler_free(s);
    /* top-k 1: the best, whatever the temperature */
    s = make(1, 1.0f, 0.0f, 5.0f, 7);
    draw(s, l, 1000, count);
    assert_int_equal(count[o[0]], 1000);
    sp_sampler_free(s);
    free(o);
    free(l);
    free(want);
    free(count);
}

/* The same seed gives the same tokens, another seed others; NaN logits
 * are never drawn; all NaN gives a token, not a crash. */
static void test_seeds_and_nan(void **state) {
    float *l = malloc(VOCAB * sizeof *l), *base = malloc(VOCAB * sizeof *base);
    peaked(base);
    int32_t a[50], b[50], c[50];
    for (int run = 0; run < 3; run++) {
        struct sp_sampler *s = make(0, 1.0f, 0.0f, 1.0f, run == 2 ? 9 : 8);
        int32_t *out = run == 0 ? a : run == 1 ? b : c;
        for (int i = 0; i < 50; i++) {
            memcpy(l, base, VOCAB * sizeof *l);
            out[i] = sp_sampler_sample(s, l);
        }
        sp_sampler_free(s);
    }
    assert_memory_equal(a, b, sizeof a);
    assert_memory_not_equal(a, c, sizeof a);
    for (int64_t i = 0; i < VOCAB; i++) base[i] = i % 2 ? NAN : 0.0f;
    base[BEST] = NAN;
    int64_t *count = malloc(VOCAB * sizeof *count);
    struct sp_sampler *s = make(0, 0.99f, 0.0f, 1.0f, 10);
    draw(s, base, 2000, count);
    for (int64_t i = 1; i < VOCAB; i += 2) assert_int_equal(count[i], 0);
    sp_sampler_free(s);
    for (int64_t i = 0; i < VOCAB; i++) l[i] = NAN;
    s = make(40, 0.95f, 0.05f, 0.8f, 11);
    int32_t t = sp_sampler_sample(s, l);
    assert_true(t >= 0 && t < VOCAB);
    sp_sampler_free(s);
    free(count);
    free(l);
    free(base);
}

/* Sampling with a top-k from the k best logits alone (a backend's
 * candidates, here the host's sp_top_k) draws what sampling from the
 * whole vocabulary draws, draw for draw with one seed: on random logits
 * with ties, -0, NaN and -inf among them, at several top-k, top-p, min-p
 * and temperatures, from more candidates than the top-k too. Where the
 * draw needs more than the best logits (top-k off, a penalty, greedy),
 * sp_sampler_top_k says 0. */
static void test_from_best_logits(void **state) {
    float *l = malloc(VOCAB * sizeof *l), *scratch = malloc(VOCAB * sizeof *scratch);
    struct sp_cand top[SP_TOP_K_MAX];
    struct sp_rng rng;
    sp_rng_seed(&rng, 5);
    const struct {
        int32_t k;
        float top_p, min_p, temp;
    } cases[] = {{40, 0.95f, 0.05f, 0.8f}, {1, 1.0f, 0.0f, 1.0f}, {64, 1.0f, 0.0f, 1.5f}, {10, 0.5f, 0.0f, 0.7f},
                 {64, 0.9f, 0.2f, 0.3f}, {5, 1.0f, 0.5f, 2.0f}};
    for (size_t ci = 0; ci < sizeof cases / sizeof *cases; ci++) {
        for (int trial = 0; trial < 20; trial++) {
            for (int64_t i = 0; i < VOCAB; i++) {
                uint64_t r = sp_rng_next(&rng);
                /* a few distinct values on a spread: ties among the best too */
                l[i] = (float)(r % 97) * 0.125f - (float)(r >> 60);
                if (r % 211 == 0) l[i] = NAN;
                if (r % 223 == 0) l[i] = -INFINITY;
                if (r % 227 == 0) l[i] = -0.0f;
            }
            struct sp_sampler *full = make(cases[ci].k, cases[ci].top_p, cases[ci].min_p, cases[ci].temp, 100 + trial);
            struct sp_sampler *best = make(cases[ci].k, cases[ci].top_p, cases[ci].min_p, cases[ci].temp, 100 + trial);
            assert_int_equal(sp_sampler_top_k(best), cases[ci].k);
            assert_int_equal(sp_sampler_top_k_upto(best, SP_TOP_K_MAX), cases[ci].k);
            assert_int_equal(sp_sampler_top_k_upto(best, cases[ci].k - 1), 0);  // more than a pass hands back
            int64_t n = trial % 2 ? SP_TOP_K_MAX : cases[ci].k;  // exactly k candidates, or more
            sp_top_k(l, VOCAB, n, top);
            for (int d = 0; d < 30; d++) {
                memcpy(scratch, l, VOCAB * sizeof *l);
                int32_t want = sp_sampler_sample(full, scratch), got = sp_sampler_sample_top(best, top, n);
                if (want != got) fail_msg("case %zu trial %d draw %d: %d from the best logits, %d from all", ci, trial, d, got, want);
            }
            sp_sampler_free(full);
            sp_sampler_free(best);
        }
    }
    struct sp_sampler *s = make(0, 0.9f, 0.0f, 1.0f, 1);
    assert_int_equal(sp_sampler_top_k(s), 0);  // top-k off
    sp_sampler_free(s);
    s = make(40, 1.0f, 0.0f, 0.0f, 1);
    assert_int_equal(sp_sampler_top_k(s), 0);  // greedy
    sp_sampler_free(s);
    s = make(VOCAB, 1.0f, 0.0f, 1.0f, 1);
    assert_int_equal(sp_sampler_top_k(s), 0);  // the whole vocabulary
    sp_sampler_free(s);
    struct sp_sampler_params p = sp_sampler_defaults();
    p.repeat_penalty = 1.1f;
    assert_int_equal(sp_sampler_create(&p, VOCAB, &s), SP_OK);
    assert_int_equal(sp_sampler_top_k(s), 0);  // a penalty moves logits first
    sp_sampler_free(s);
    free(scratch);
    free(l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_greedy),
        cmocka_unit_test(test_penalties),
        cmocka_unit_test(test_whole_vocabulary),
        cmocka_unit_test(test_top_p),
        cmocka_unit_test(test_min_p_and_top_k),
        cmocka_unit_test(test_seeds_and_nan),
        cmocka_unit_test(test_from_best_logits),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
