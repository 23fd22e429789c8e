/*
 * test_pool.c - guided pieces over a line of segments (core/pool.h,
 * sp_pool_take_guided): taken one after another as the threads of a run
 * would take them, and by a pool's threads at once.
 */
#include "helpers.h"

#include "core/pool.h"
#include "core/rng.h"

/* Pieces of ends[0..n) taken one after another as nth threads would take
 * them; checks that they are non-empty, in order and cover the line, and
 * that no segment has more than nth - 1 piece boundaries inside it.
 * Returns how many pieces there were; *inside counts the boundaries that
 * fell inside a segment. */
static int64_t take_all(const int64_t *ends, int64_t n, int nth, int64_t *inside) {
    atomic_llong next = 0;
    int64_t lo, hi, at = 0, pieces = 0, total = n ? ends[n - 1] : 0;
    int64_t *cuts = calloc((size_t)(n ? n : 1), sizeof *cuts);
    *inside = 0;
    while (sp_pool_take_guided(&next, ends, n, nth, &lo, &hi)) {
        assert_int_equal(lo, at);
        assert_true(hi > lo);
        assert_true(hi <= total);
        at = hi;
        pieces++;
        if (hi == total) continue;
        int64_t i = 0;
        while (ends[i] <= hi) i++;
        int64_t start = i ? ends[i - 1] : 0;
        if (hi > start) {
            cuts[i]++;
            (*inside)++;
        }
    }
    assert_int_equal(at, total);
    for (int64_t i = 0; i < n; i++) assert_true(cuts[i] <= nth - 1);
    free(cuts);
    return pieces;
}

/* Segments much smaller than a piece: every piece ends at a segment's end,
 * and the pieces shrink towards the end of the line. */
static void test_guided_whole_segments(void **state) {
    (void)state;
    int64_t ends[200];
    for (int i = 0; i < 200; i++) ends[i] = 10 * (i + 1);
    atomic_llong next = 0;
    int64_t lo, hi, first = -1, last = -1, inside;
    while (sp_pool_take_guided(&next, ends, 200, 2, &lo, &hi)) {
        assert_int_equal(lo % 10, 0);
        assert_int_equal(hi % 10, 0);
        if (first < 0) first = hi - lo;
        last = hi - lo;
    }
    assert_int_equal(first, 500);  // a quarter of what is left with 2 threads
    assert_true(last < first / 4);
    assert_true(take_all(ends, 200, 2, &inside) > 8);
    assert_int_equal(inside, 0);
}

/* One segment (a dense MLP's rows): cut at most nth - 1 times, as an even
 * split would cut it. */
static void test_guided_one_segment(void **state) {
    (void)state;
    int64_t end = 768 * 512, inside;
    for (int nth = 1; nth <= 16; nth++) {
        int64_t pieces = take_all(&end, 1, nth, &inside);
        assert_true(pieces <= nth);
        assert_int_equal(inside, pieces - 1);
    }
}

/* Random lines, empty segments among them, from 1 to 300 threads: pieces
 * always cover the line, also where a share rounds down to nothing. */
static void test_guided_random_lines(void **state) {
    (void)state;
    struct sp_rng rng;
    sp_rng_seed(&rng, 7);
    int64_t ends[64];
    for (int trial = 0; trial < 2000; trial++) {
        int64_t n = 1 + (int64_t)(sp_rng_next(&rng) % 64), at = 0, inside;
        for (int64_t i = 0; i < n; i++) {
            uint64_t r = sp_rng_next(&rng);
            at += r % 4 == 0 ? 0 : (int64_t)(r >> 8) % (r % 3 == 0 ? 5 : 5000);
            ends[i] = at;
        }
        if (ends[n - 1] == 0) ends[n - 1] = 1;
        int nth = 1 + (int)(sp_rng_next(&rng) % 300);
        take_all(ends, n, nth, &inside);
    }
}

/* Several threads taking pieces at once: each position taken exactly once. */
struct guided_job {
    const int64_t *ends;
    int64_t n;
    atomic_int *hits;
};

static atomic_llong shared_next;

static void guided_take(void *arg, int tid, int nth) {
    (void)tid;
    struct guided_job *j = arg;
    int64_t lo, hi;
    while (sp_pool_take_guided(&shared_next, j->ends, j->n, nth, &lo, &hi))
        for (int64_t p = lo; p < hi; p++) atomic_fetch_add(&j->hits[p], 1);
}

static void test_guided_threads(void **state) {
    (void)state;
    struct sp_pool *pool;
    assert_int_equal(sp_pool_create(4, &pool), SP_OK);
    int64_t ends[129];
    for (int i = 0; i < 128; i++) ends[i] = 96 * (i + 1) + (i % 7) * 32 * i;
    for (int i = 1; i < 128; i++)
        if (ends[i] < ends[i - 1]) ends[i] = ends[i - 1];
    ends[128] = ends[127] + 2048 * 64;  // a shared expert's rows after the routed ones
    int64_t total = ends[128];
    atomic_int *hits = calloc((size_t)total, sizeof *hits);
    struct guided_job j = {ends, 129, hits};
    for (int round = 0; round < 20; round++) {
        atomic_store(&shared_next, 0);
        sp_pool_run(pool, guided_take, &j);
    }
    for (int64_t p = 0; p < total; p++) assert_int_equal(atomic_load(&hits[p]), 20);
    free(hits);
    sp_pool_free(pool);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_guided_whole_segments),
        cmocka_unit_test(test_guided_one_segment),
        cmocka_unit_test(test_guided_random_lines),
        cmocka_unit_test(test_guided_threads),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
