/* pool.c - fork-join thread pool with spinning then sleeping workers. */
#include "core/pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "core/alloc.h"

/* Spins before yielding, and yields before sleeping: a worker that spins
 * while the machine is oversubscribed would take the core its peers need. */
#define SPIN_ITERS 2000
#define YIELD_ITERS 200

struct worker {
    struct sp_pool *pool;
    pthread_t thread;
    int tid;
};

struct sp_pool {
    int n;
    struct worker *workers;  // (n - 1): tid 1..n-1
    void **scratch;          // (n)
    size_t scratch_bytes;
    sp_pool_fn fn;
    void *ctx;
    atomic_uint generation;  // bumped for each run
    atomic_int pending;      // workers still running the current job
    atomic_bool stop;
    pthread_mutex_t mu;
    pthread_cond_t cv;
};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static void *worker_main(void *arg) {
    struct worker *w = arg;
    struct sp_pool *p = w->pool;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        int spins = 0;
        while ((g = atomic_load_explicit(&p->generation, memory_order_acquire)) == seen &&
               !atomic_load(&p->stop)) {
            if (++spins < SPIN_ITERS) {
                cpu_relax();
                continue;
            }
            if (spins < SPIN_ITERS + YIELD_ITERS) {
                sched_yield();
                continue;
            }
            pthread_mutex_lock(&p->mu);
            while (atomic_load(&p->generation) == seen && !atomic_load(&p->stop)) pthread_cond_wait(&p->cv, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = g;
        p->fn(p->ctx, w->tid, p->n);
        atomic_fetch_sub_explicit(&p->pending, 1, memory_order_release);
    }
}

int sp_physical_cores(void) {
    /* Count distinct (physical id, core id) pairs in /proc/cpuinfo. */
    FILE *f = fopen("/proc/cpuinfo", "r");
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    if (!f) return online > 0 ? (int)online : 1;
    char line[256];
    int phys = -1, core = -1, n = 0;
    int seen[1024][2];
    while (fgets(line, sizeof line, f)) {
        if (sscanf(line, "physical id : %d", &phys) == 1) continue;
        if (sscanf(line, "core id : %d", &core) == 1) {
            bool dup = false;
            for (int i = 0; i < n; i++) dup |= seen[i][0] == phys && seen[i][1] == core;
            if (!dup && n < 1024) {
                seen[n][0] = phys;
                seen[n][1] = core;
                n++;
            }
        }
    }
    fclose(f);
    if (n <= 0) n = online > 0 ? (int)online : 1;
    return n;
}

enum sp_status sp_pool_create(int n_threads, struct sp_pool **out) {
    *out = NULL;
    if (n_threads <= 0) n_threads = sp_physical_cores();
    if (n_threads > 1024) n_threads = 1024;
    struct sp_pool *p = sp_calloc(1, sizeof *p, SP_MEM_MISC);
    if (!p) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv, NULL);
    p->scratch = sp_calloc((size_t)n_threads, sizeof *p->scratch, SP_MEM_MISC);
    p->workers = sp_calloc((size_t)n_threads, sizeof *p->workers, SP_MEM_MISC);
    if (!p->scratch || !p->workers) {
        sp_pool_free(p);
        return sp_errorf(SP_ERR_NOMEM, "out of memory");
    }
    for (int i = 1; i < n_threads; i++) {
        struct worker *w = &p->workers[i];
        w->pool = p;
        w->tid = i;
        if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
            p->n = i;  // threads 1..i-1 exist
            sp_pool_free(p);
            return sp_errorf(SP_ERR_STATE, "could not start thread %d of %d", i, n_threads);
        }
    }
    *out = p;
    return SP_OK;
}

void sp_pool_free(struct sp_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->stop, true);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    for (int i = 1; i < p->n && p->workers; i++) pthread_join(p->workers[i].thread, NULL);
    for (int i = 0; i < p->n && p->scratch; i++) sp_free_aligned(p->scratch[i]);
    sp_free(p->scratch);
    sp_free(p->workers);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv);
    sp_free(p);
}

int sp_pool_size(const struct sp_pool *p) { return p->n; }

void sp_pool_run(struct sp_pool *p, sp_pool_fn fn, void *ctx) {
    sp_pool_run_n(p, fn, ctx, p->n);
}

void sp_pool_run_n(struct sp_pool *p, sp_pool_fn fn, void *ctx, int nth) {
    if (nth < p->n) {
        /* Small jobs: the caller alone, no hand-off (threads > 1 but < n
         * would still wake everyone, so fall back to one). */
        fn(ctx, 0, 1);
        return;
    }
    if (p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    p->fn = fn;
    p->ctx = ctx;
    atomic_store_explicit(&p->pending, p->n - 1, memory_order_relaxed);
    pthread_mutex_lock(&p->mu);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    for (int spins = 0; atomic_load_explicit(&p->pending, memory_order_acquire) > 0; spins++) {
        if (spins < SPIN_ITERS)
            cpu_relax();
        else
            sched_yield();
    }
}

enum sp_status sp_pool_reserve(struct sp_pool *p, size_t bytes) {
    if (bytes <= p->scratch_bytes) return SP_OK;
    for (int i = 0; i < p->n; i++) {
        void *b = sp_malloc_aligned(bytes, 64, SP_MEM_ACT);
        if (!b) return sp_errorf(SP_ERR_NOMEM, "out of memory for %zu bytes of thread scratch", bytes);
        sp_free_aligned(p->scratch[i]);
        p->scratch[i] = b;
    }
    p->scratch_bytes = bytes;
    return SP_OK;
}

void *sp_pool_scratch(struct sp_pool *p, int tid) { return p->scratch[tid]; }

bool sp_pool_take(atomic_llong *next, int64_t n, int64_t chunk, int64_t *lo, int64_t *hi) {
    int64_t at = atomic_fetch_add_explicit(next, chunk, memory_order_relaxed);
    if (at >= n) return false;
    *lo = at;
    *hi = at + chunk < n ? at + chunk : n;
    return true;
}

bool sp_pool_take_guided(atomic_llong *next, const int64_t *ends, int64_t n, int nth, int64_t *lo, int64_t *hi) {
    int64_t total = n > 0 ? ends[n - 1] : 0;
    long long at = atomic_load_explicit(next, memory_order_relaxed);
    if (nth < 1) nth = 1;
    for (;;) {
        if (at >= total) return false;
        int64_t least = total / (16 * nth) + 1, want = (total - at) / (2 * nth);
        int64_t e = at + (want > least ? want : least);
        /* segment i holds at; segment k would be cut at e */
        int64_t i = 0, k;
        while (ends[i] <= at) i++;
        for (k = i; k < n && ends[k] < e; k++) continue;
        if (k >= n) {
            e = total;
        } else if (ends[k] > e) {
            int64_t start = k > 0 ? ends[k - 1] : 0;
            if (start > at) {
                e = start;  // whole segments
            } else {
                int64_t len = ends[i] - start, share = (len + nth - 1) / nth;
                e = at + (e - at > share ? e - at : share);
                if (e + share / 2 >= ends[i]) e = ends[i];
            }
        }
        if (atomic_compare_exchange_weak_explicit(next, &at, e, memory_order_relaxed, memory_order_relaxed)) {
            *lo = at;
            *hi = e;
            return true;
        }
    }
}

void sp_pool_split(int64_t n, int tid, int nth, int64_t *lo, int64_t *hi) {
    int64_t base = n / nth, rem = n % nth;
    *lo = tid * base + (tid < rem ? tid : rem);
    *hi = *lo + base + (tid < rem ? 1 : 0);
}
