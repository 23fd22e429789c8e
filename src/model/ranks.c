#include "model/ranks.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/alloc.h"

struct worker {
    struct sp_ranks *g;
    int rank;
    pthread_t thread;
};

struct sp_ranks {
    int n;
    int64_t floats;
    float *slots;  // (n, floats) each rank's vector of the sum under way
    pthread_mutex_t mu;
    pthread_cond_t cv;
    /* the run: its function, its number (workers start it when it moves)
     * and the ranks still in it; quit ends the workers */
    void (*fn)(void *arg, int rank);
    void *arg;
    uint64_t run;
    int running;
    bool quit;
    /* the barrier inside a run: ranks arrived, its passes, a rank gone */
    int arrived;
    uint64_t passes;
    bool failed;
    struct worker *workers;  // (n - 1) ranks 1 ..
    int started;
};

static void *worker_main(void *p) {
    struct worker *w = p;
    struct sp_ranks *g = w->g;
    uint64_t seen = 0;
    pthread_mutex_lock(&g->mu);
    for (;;) {
        while (!g->quit && g->run == seen) pthread_cond_wait(&g->cv, &g->mu);
        if (g->quit) break;
        seen = g->run;
        pthread_mutex_unlock(&g->mu);
        g->fn(g->arg, w->rank);
        pthread_mutex_lock(&g->mu);
        if (--g->running == 0) pthread_cond_broadcast(&g->cv);
    }
    pthread_mutex_unlock(&g->mu);
    return NULL;
}

enum sp_status sp_ranks_create(int n, int64_t floats, struct sp_ranks **out) {
    *out = NULL;
    if (n < 2 || n > SP_RANKS_MAX || floats < 1)
        return sp_errorf(SP_ERR_ARG, "%d ranks of %lld floats: from 2 to %d ranks of at least one", n, (long long)floats,
                         SP_RANKS_MAX);
    struct sp_ranks *g = sp_calloc(1, sizeof *g, SP_MEM_ACT);
    if (!g) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    g->n = n;
    g->floats = floats;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    g->slots = sp_malloc((size_t)n * (size_t)floats * sizeof *g->slots, SP_MEM_ACT);
    g->workers = sp_calloc((size_t)(n - 1), sizeof *g->workers, SP_MEM_ACT);
    if (!g->slots || !g->workers) {
        sp_ranks_free(g);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    for (int r = 1; r < n; r++) {
        struct worker *w = &g->workers[r - 1];
        *w = (struct worker){g, r, 0};
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            sp_ranks_free(g);
            return sp_errorf(SP_ERR_IO, "cannot start the thread of rank %d", r);
        }
        g->started++;
    }
    *out = g;
    return SP_OK;
}

void sp_ranks_free(struct sp_ranks *g) {
    if (!g) return;
    pthread_mutex_lock(&g->mu);
    g->quit = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    for (int i = 0; i < g->started; i++) pthread_join(g->workers[i].thread, NULL);
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
    sp_free(g->workers);
    sp_free(g->slots);
    sp_free(g);
}

void sp_ranks_run(struct sp_ranks *g, void (*fn)(void *arg, int rank), void *arg) {
    pthread_mutex_lock(&g->mu);
    g->fn = fn;
    g->arg = arg;
    g->running = g->n - 1;
    g->arrived = 0;
    g->failed = false;
    g->run++;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
    fn(arg, 0);
    pthread_mutex_lock(&g->mu);
    while (g->running > 0) pthread_cond_wait(&g->cv, &g->mu);
    pthread_mutex_unlock(&g->mu);
}

/* Every rank of the run here, or false where one gave up. */
static bool barrier(struct sp_ranks *g) {
    pthread_mutex_lock(&g->mu);
    bool ok = !g->failed;
    if (ok && ++g->arrived == g->n) {
        g->arrived = 0;
        g->passes++;
        pthread_cond_broadcast(&g->cv);
    } else if (ok) {
        uint64_t pass = g->passes;
        while (g->passes == pass && !g->failed) pthread_cond_wait(&g->cv, &g->mu);
        ok = g->passes != pass;
    }
    pthread_mutex_unlock(&g->mu);
    return ok;
}

bool sp_ranks_sum(struct sp_ranks *g, int rank, float *v, int64_t n) {
    SP_ASSERT(rank >= 0 && rank < g->n && n >= 0 && n <= g->floats);
    memcpy(g->slots + (size_t)rank * (size_t)g->floats, v, (size_t)n * sizeof *v);
    if (!barrier(g)) return false;
    for (int64_t i = 0; i < n; i++) {
        float s = g->slots[i];
        for (int r = 1; r < g->n; r++) s += g->slots[(size_t)r * (size_t)g->floats + (size_t)i];
        v[i] = s;
    }
    /* no rank writes its slot again before every rank has read them all */
    return barrier(g);
}

void sp_ranks_fail(struct sp_ranks *g, int rank) {
    (void)rank;
    pthread_mutex_lock(&g->mu);
    g->failed = true;
    pthread_cond_broadcast(&g->cv);
    pthread_mutex_unlock(&g->mu);
}

struct by_load {
    const double *load;
    int64_t e;
};

static int heavier_first(const void *pa, const void *pb) {
    const struct by_load *a = pa, *b = pb;
    double la = a->load ? a->load[a->e] : 1.0, lb = b->load ? b->load[b->e] : 1.0;
    if (la != lb) return la > lb ? -1 : 1;
    return (a->e > b->e) - (a->e < b->e);
}

void sp_ranks_split(const double *load, int64_t n_experts, int n_ranks, int32_t *owner) {
    struct by_load *order = malloc((size_t)n_experts * sizeof *order);
    double sum[SP_RANKS_MAX] = {0};
    int64_t count[SP_RANKS_MAX] = {0};
    SP_ASSERT(order && n_ranks >= 1 && n_ranks <= SP_RANKS_MAX);
    for (int64_t e = 0; e < n_experts; e++) order[e] = (struct by_load){load, e};
    qsort(order, (size_t)n_experts, sizeof *order, heavier_first);
    for (int64_t i = 0; i < n_experts; i++) {
        int best = 0;
        for (int r = 1; r < n_ranks; r++)
            if (sum[r] < sum[best] || (sum[r] == sum[best] && count[r] < count[best])) best = r;
        int64_t e = order[i].e;
        owner[e] = best;
        sum[best] += load ? load[e] : 1.0;
        count[best]++;
    }
    free(order);
}
