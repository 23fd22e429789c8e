/*
 * test_engine.c - the scheduler (runtime/engine.h) on the tiny qwen3_moe
 * fixture: a group of requests for one prompt (sp_engine_submit_group)
 * prefills it once, its followers copying the leader's KV, and each of
 * them then generates exactly what the same request submitted alone
 * generates (greedy, and with its own seed); a leader cancelled before its
 * prefill ends leaves the followers to finish it; groups larger than the
 * slots are refused; a next turn reuses what the slot holds. Each on an
 * attention model and on a recurrent one (qwen3_5_moe).
 */
#include "helpers.h"

#include "model/model.h"
#include "runtime/engine.h"

/* Each test runs on both: attention's KV cache, and a recurrent state
 * (Gated DeltaNet) that goes on only from its position or its snapshot. */
#define FIXTURE "tests/fixtures/qwen3_moe"
#define FIXTURE_RECURRENT "tests/fixtures/qwen3_5_moe"
#define N_PROMPT 21  // three prefill chunks of 8
#define N_GEN 12
#define MAX_SEQ 4

static struct sp_model *model;

static int setup(void **state) {
    if (sp_model_open(FIXTURE, &model) != SP_OK) fail_msg("%s", sp_error_msg());
    return 0;
}

static int setup_recurrent(void **state) {
    if (sp_model_open(FIXTURE_RECURRENT, &model) != SP_OK) fail_msg("%s", sp_error_msg());
    return 0;
}

static int teardown(void **state) {
    sp_model_close(model);
    return 0;
}

static struct sp_engine *engine(int n_slots) {
    struct sp_engine_params ep = {.n_slots = n_slots, .n_ctx = 64, .batch_tokens = 8, .n_threads = 2};
    struct sp_engine *e;
    if (sp_engine_create(model, NULL, &ep, &e) != SP_OK) fail_msg("%s", sp_error_msg());
    return e;
}

static void prompt_of(int32_t *p, int salt) {
    for (int i = 0; i < N_PROMPT; i++) p[i] = (int32_t)((i * 37 + salt * 11 + 5) % 200 + 1);
}

static struct sp_gen_params params(float temp, uint64_t seed) {
    struct sp_gen_params gp = {.max_tokens = N_GEN, .ignore_eos = true, .top_logprobs = 0};
    gp.sampling = sp_sampler_defaults();
    gp.sampling.temp = temp;
    gp.sampling.seed = seed;
    return gp;
}

/* Waits for r to finish; its ids into ids (N_GEN of them), its progress into *p. */
static void collect(struct sp_req *r, int32_t *ids, struct sp_req_progress *p) {
    struct sp_buf text = SP_BUF_INIT;
    struct sp_tok_list toks = {0};
    do sp_req_poll(r, 100, &text, &toks, p);
    while (!p->finished);
    if (p->finish != SP_FINISH_CANCELLED) {
        assert_int_equal(p->finish, SP_FINISH_LENGTH);
        assert_int_equal(toks.n, N_GEN);
        for (int64_t i = 0; i < toks.n; i++) ids[i] = toks.v[i].id;
    }
    sp_tok_list_free(&toks);
    sp_buf_free(&text);
    sp_req_release(r);
}

/* What prompt (n tokens) with gp gives submitted alone, on a fresh one-slot engine. */
static void solo_n(const int32_t *prompt, int64_t n, const struct sp_gen_params *gp, int32_t *ids) {
    struct sp_engine *e = engine(1);
    struct sp_req *r;
    assert_int_equal(sp_engine_submit(e, prompt, n, gp, &r), SP_OK);
    struct sp_req_progress p;
    collect(r, ids, &p);
    assert_int_equal(p.cached_tokens, 0);
    sp_engine_free(e);
}

static void solo(const int32_t *prompt, const struct sp_gen_params *gp, int32_t *ids) {
    solo_n(prompt, N_PROMPT, gp, ids);
}

static uint64_t prefilled(struct sp_engine *e) {
    struct sp_engine_stats st;
    sp_engine_stats(e, &st);
    return st.prefill_tokens;
}

/* Greedy: every member gives the solo ids; the prompt is computed once
 * (plus its last token by each follower), and the followers count the
 * rest as cached. */
static void test_group_greedy(void **state) {
    int32_t prompt[N_PROMPT], want[N_GEN];
    prompt_of(prompt, 1);
    struct sp_gen_params gp = params(0, 0);
    solo(prompt, &gp, want);
    for (int k = 1; k <= MAX_SEQ; k++) {
        struct sp_engine *e = engine(MAX_SEQ);
        struct sp_gen_params gps[MAX_SEQ];
        for (int i = 0; i < k; i++) gps[i] = gp;
        struct sp_req *r[MAX_SEQ];
        assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, k, r), SP_OK);
        for (int i = 0; i < k; i++) {
            int32_t got[N_GEN];
            struct sp_req_progress p;
            collect(r[i], got, &p);
            assert_memory_equal(got, want, sizeof want);
            assert_int_equal(p.prompt_tokens, N_PROMPT);
            assert_int_equal(p.cached_tokens, i == 0 ? 0 : N_PROMPT - 1);
        }
        assert_int_equal(prefilled(e), N_PROMPT + (k - 1));
        struct sp_engine_stats st;
        sp_engine_stats(e, &st);
        assert_int_equal(st.prompt_tokens, (uint64_t)(k * N_PROMPT));
        assert_int_equal(st.cached_tokens, (uint64_t)((k - 1) * (N_PROMPT - 1)));
        sp_engine_free(e);
    }
}

/* Sampled: member i gives what its own seed gives alone, and the seeds
 * make the members differ. */
static void test_group_seeds(void **state) {
    int32_t prompt[N_PROMPT];
    prompt_of(prompt, 2);
    struct sp_gen_params gps[3] = {params(1.0f, 11), params(1.0f, 12), params(1.0f, 13)};
    int32_t want[3][N_GEN], got[3][N_GEN];
    for (int i = 0; i < 3; i++) solo(prompt, &gps[i], want[i]);
    struct sp_engine *e = engine(MAX_SEQ);
    struct sp_req *r[3];
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 3, r), SP_OK);
    struct sp_req_progress p;
    for (int i = 0; i < 3; i++) collect(r[i], got[i], &p);
    for (int i = 0; i < 3; i++) assert_memory_equal(got[i], want[i], sizeof want[i]);
    assert_true(memcmp(got[0], got[1], sizeof got[0]) || memcmp(got[1], got[2], sizeof got[1]));
    assert_int_equal(prefilled(e), N_PROMPT + 2);
    sp_engine_free(e);
}

/* A group whose prompt is in the prompt cache: the leader reuses it, the
 * followers copy it at once: one token computed by each. Another group
 * waits for its slots behind a request that holds one. */
static void test_group_cached_and_waiting(void **state) {
    int32_t prompt[N_PROMPT], want[N_GEN], got[N_GEN];
    prompt_of(prompt, 3);
    struct sp_gen_params gp = params(0, 0);
    solo(prompt, &gp, want);
    struct sp_engine *e = engine(3);
    struct sp_req *r[3];
    struct sp_req_progress p;
    assert_int_equal(sp_engine_submit(e, prompt, N_PROMPT, &gp, &r[0]), SP_OK);
    collect(r[0], got, &p);
    uint64_t before = prefilled(e);
    struct sp_gen_params gps[3] = {gp, gp, gp};
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 3, r), SP_OK);
    for (int i = 0; i < 3; i++) {
        collect(r[i], got, &p);
        assert_memory_equal(got, want, sizeof want);
        assert_int_equal(p.cached_tokens, N_PROMPT - 1);
    }
    assert_int_equal(prefilled(e) - before, 3);

    /* one slot taken by a long request: a group of 3 waits for it, then runs */
    int32_t other[N_PROMPT];
    prompt_of(other, 4);
    struct sp_gen_params lg = gp;
    lg.max_tokens = 40;
    struct sp_req *busy;
    assert_int_equal(sp_engine_submit(e, other, N_PROMPT, &lg, &busy), SP_OK);
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 3, r), SP_OK);
    for (int i = 0; i < 3; i++) {
        collect(r[i], got, &p);
        assert_memory_equal(got, want, sizeof want);
        assert_true(p.queue_s > 0);
    }
    struct sp_buf text = SP_BUF_INIT;
    do sp_req_poll(busy, 100, &text, NULL, &p);
    while (!p.finished);
    sp_buf_free(&text);
    assert_int_equal(p.completion_tokens, 40);
    sp_req_release(busy);
    sp_engine_free(e);
}

/* The leader cancelled before its prefill is done: the followers prefill
 * what it did not and still give the solo ids. */
static void test_group_leader_cancelled(void **state) {
    int32_t prompt[N_PROMPT], want[N_GEN];
    prompt_of(prompt, 5);
    struct sp_gen_params gp = params(0, 0);
    solo(prompt, &gp, want);
    struct sp_engine *e = engine(MAX_SEQ);
    struct sp_gen_params gps[3] = {gp, gp, gp};
    struct sp_req *r[3];
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 3, r), SP_OK);
    sp_req_cancel(r[0]);
    struct sp_req_progress p;
    int32_t got[N_GEN];
    collect(r[0], got, &p);
    assert_int_equal(p.finish, SP_FINISH_CANCELLED);
    for (int i = 1; i < 3; i++) {
        collect(r[i], got, &p);
        assert_memory_equal(got, want, sizeof want);
    }
    sp_engine_free(e);
}

/* A next turn on the same slot: the prompt goes on from the whole first
 * turn (its last generated token is the one not run yet), and reuses all
 * of it; a prompt that leaves the first turn after its prompt reuses the
 * prompt (a recurrent model: its snapshot, all but the last prompt token).
 * Each gives what it gives cold. */
static void test_next_turn(void **state) {
    int32_t prompt[N_PROMPT + N_GEN + 5], first[N_GEN], want[N_GEN], got[N_GEN];
    prompt_of(prompt, 7);
    struct sp_gen_params gp = params(0, 0);
    bool recurrent = sp_arch_recurrent(&model->arch);
    for (int variant = 0; variant < 2; variant++) {
        struct sp_engine *e = engine(1);
        struct sp_req *r;
        struct sp_req_progress p;
        assert_int_equal(sp_engine_submit(e, prompt, N_PROMPT, &gp, &r), SP_OK);
        collect(r, first, &p);
        int64_t n = N_PROMPT;
        if (variant == 0)
            for (int i = 0; i < N_GEN; i++) prompt[n++] = first[i];
        for (int i = 0; i < 5; i++) prompt[n++] = (int32_t)(3 + 7 * i);
        solo_n(prompt, n, &gp, want);
        uint64_t before = prefilled(e);
        assert_int_equal(sp_engine_submit(e, prompt, n, &gp, &r), SP_OK);
        collect(r, got, &p);
        assert_memory_equal(got, want, sizeof want);
        int64_t reused = variant == 0 ? N_PROMPT + N_GEN - 1 : recurrent ? N_PROMPT - 1 : N_PROMPT;
        assert_int_equal(p.cached_tokens, reused);
        assert_int_equal(prefilled(e) - before, (uint64_t)(n - reused));
        sp_engine_free(e);
    }
}

static void test_group_limits(void **state) {
    struct sp_engine *e = engine(2);
    int32_t prompt[N_PROMPT];
    prompt_of(prompt, 6);
    struct sp_gen_params gps[3] = {params(0, 0), params(0, 0), params(0, 0)};
    struct sp_req *r[3] = {(struct sp_req *)1, (struct sp_req *)1, (struct sp_req *)1};
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 3, r), SP_ERR_ARG);
    assert_non_null(strstr(sp_error_msg(), "at most 2"));
    for (int i = 0; i < 3; i++) assert_null(r[i]);
    assert_int_equal(sp_engine_submit_group(e, prompt, N_PROMPT, gps, 0, r), SP_ERR_ARG);
    assert_int_equal(sp_engine_submit_group(e, prompt, 0, gps, 2, r), SP_ERR_ARG);
    struct sp_engine_stats st;
    sp_engine_stats(e, &st);
    assert_int_equal(st.requests, 0);
    sp_engine_free(e);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_group_greedy),
        cmocka_unit_test(test_group_seeds),
        cmocka_unit_test(test_group_cached_and_waiting),
        cmocka_unit_test(test_group_leader_cancelled),
        cmocka_unit_test(test_group_limits),
        cmocka_unit_test(test_next_turn),
    };
    int failed = cmocka_run_group_tests_name("attention", tests, setup, teardown);
    return failed + cmocka_run_group_tests_name("recurrent", tests, setup_recurrent, teardown);
}
