#include "model/ranks.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/alloc.h"
#include "core/clock.h"

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
    /* ranks in processes (sp_ranks_connect): this one's rank, its
     * connections (rank 0: fd[r] to rank r; the others: fd[0] to rank 0),
     * and the sums so far, which every rank counts alike */
    bool net;
    int self;
    int fd[SP_RANKS_MAX];
    uint64_t sums;
};

/* ---- ranks in processes ---- */

#define HELLO_MAGIC 0x73707268u  // "sprh"

struct hello {  // a rank's first words to rank 0
    uint32_t magic;
    int32_t rank, n;
    uint32_t pad;
    uint64_t key;
};

struct sum_head {  // before each of a rank's sums
    uint64_t seq;
    int64_t n;
};

/* The whole of buf to fd / from fd; false on an error or a closed peer. */
static bool send_all(int fd, const void *buf, size_t len) {
    const uint8_t *p = buf;
    while (len) {
        ssize_t k = send(fd, p, len, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k, len -= (size_t)k;
    }
    return true;
}

static bool recv_all(int fd, void *buf, size_t len) {
    uint8_t *p = buf;
    while (len) {
        ssize_t k = recv(fd, p, len, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return false;
        p += k, len -= (size_t)k;
    }
    return true;
}

static void close_all(struct sp_ranks *g) {
    for (int r = 0; r < SP_RANKS_MAX; r++)
        if (g->fd[r] >= 0) close(g->fd[r]), g->fd[r] = -1;
}

static void no_delay(int fd) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
}

/* Rank 0: the others' connections, each checked, until timeout_s. */
static enum sp_status accept_ranks(struct sp_ranks *g, int port, uint64_t key, double timeout_s) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM, .ai_flags = AI_PASSIVE}, *ai;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    if (getaddrinfo(NULL, ports, &hints, &ai) != 0) return sp_errorf(SP_ERR_IO, "rank 0: port %d: no address", port);
    int ls = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol), one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool bound = ls >= 0 && bind(ls, ai->ai_addr, ai->ai_addrlen) == 0 && listen(ls, SP_RANKS_MAX) == 0;
    freeaddrinfo(ai);
    if (!bound) {
        enum sp_status st = sp_errorf(SP_ERR_IO, "rank 0: cannot listen on port %d: %s", port, strerror(errno));
        if (ls >= 0) close(ls);
        return st;
    }
    double end = sp_now_s() + timeout_s;
    enum sp_status st = SP_OK;
    for (int joined = 1; joined < g->n && st == SP_OK;) {
        struct pollfd pf = {.fd = ls, .events = POLLIN};
        int left_ms = (int)((end - sp_now_s()) * 1000.0);
        if (left_ms <= 0 || poll(&pf, 1, left_ms) <= 0) {
            st = sp_errorf(SP_ERR_IO, "rank 0: %d of %d ranks joined in %.0f s on port %d", joined, g->n, timeout_s, port);
            break;
        }
        int fd = accept(ls, NULL, NULL);
        if (fd < 0) continue;
        struct hello h;
        if (!recv_all(fd, &h, sizeof h) || h.magic != HELLO_MAGIC) {
            close(fd);  // not a rank of ours
            continue;
        }
        if (h.n != g->n || h.key != key || h.rank < 1 || h.rank >= g->n || g->fd[h.rank] >= 0) {
            st = sp_errorf(SP_ERR_ARG, "rank 0: a rank %d of %d %s", h.rank, h.n,
                           h.n != g->n ? "ranks joined (this one has another count)"
                           : h.key != key ? "runs another command or model than this one"
                                          : "is out of range or taken twice");
            uint8_t no = 0;
            send_all(fd, &no, 1);
            close(fd);
            break;
        }
        no_delay(fd);
        g->fd[h.rank] = fd;
        joined++;
    }
    close(ls);
    uint8_t yes = 1, no = 0;
    for (int r = 1; r < g->n; r++)
        if (g->fd[r] >= 0) send_all(g->fd[r], st == SP_OK ? &yes : &no, 1);
    return st;
}

/* Rank r > 0: its connection to rank 0, tried until timeout_s. */
static enum sp_status join_rank0(struct sp_ranks *g, const char *addr, int port, uint64_t key, double timeout_s) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *ai = NULL;
    char ports[16];
    snprintf(ports, sizeof ports, "%d", port);
    if (getaddrinfo(addr, ports, &hints, &ai) != 0)
        return sp_errorf(SP_ERR_IO, "rank %d: cannot resolve %s (MASTER_ADDR)", g->self, addr);
    double end = sp_now_s() + timeout_s;
    int fd = -1;
    while (fd < 0) {
        fd = socket(ai->ai_family, ai->ai_socktype, ai->ai_protocol);
        if (fd >= 0 && connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) break;
        if (fd >= 0) close(fd), fd = -1;
        if (sp_now_s() > end) break;
        usleep(100 * 1000);
    }
    freeaddrinfo(ai);
    if (fd < 0) return sp_errorf(SP_ERR_IO, "rank %d: no rank 0 at %s:%d in %.0f s", g->self, addr, port, timeout_s);
    no_delay(fd);
    g->fd[0] = fd;
    struct hello h = {HELLO_MAGIC, g->self, g->n, 0, key};
    uint8_t ok = 0;
    if (!send_all(fd, &h, sizeof h) || !recv_all(fd, &ok, 1) || !ok)
        return sp_errorf(SP_ERR_IO, "rank %d: rank 0 at %s:%d refused it or another rank (see rank 0's error)", g->self,
                         addr, port);
    return SP_OK;
}

enum sp_status sp_ranks_connect(int rank, int n, const char *addr, int port, uint64_t key, int64_t floats,
                                double timeout_s, struct sp_ranks **out) {
    *out = NULL;
    if (n < 2 || n > SP_RANKS_MAX || rank < 0 || rank >= n || floats < 1 || port < 1 || port > 65535)
        return sp_errorf(SP_ERR_ARG, "rank %d of %d on port %d: ranks 0 to n - 1 of 2 to %d, a port 1 to 65535", rank, n,
                         port, SP_RANKS_MAX);
    struct sp_ranks *g = sp_calloc(1, sizeof *g, SP_MEM_ACT);
    if (!g) return sp_errorf(SP_ERR_NOMEM, "out of memory");
    g->n = n;
    g->floats = floats;
    g->net = true;
    g->self = rank;
    for (int r = 0; r < SP_RANKS_MAX; r++) g->fd[r] = -1;
    pthread_mutex_init(&g->mu, NULL);
    pthread_cond_init(&g->cv, NULL);
    enum sp_status st = SP_OK;
    if (rank == 0 && !(g->slots = sp_malloc((size_t)n * (size_t)floats * sizeof *g->slots, SP_MEM_ACT)))
        st = sp_errorf(SP_ERR_NOMEM, "out of memory");
    if (st == SP_OK) st = rank == 0 ? accept_ranks(g, port, key, timeout_s) : join_rank0(g, addr, port, key, timeout_s);
    if (st != SP_OK) {
        sp_ranks_free(g);
        return st;
    }
    *out = g;
    return SP_OK;
}

#define MSG_SEQ UINT64_MAX  // a message's head, where a sum's has its count

bool sp_ranks_send(struct sp_ranks *g, const void *buf, size_t len) {
    SP_ASSERT(g->net && g->self == 0);
    struct sum_head h = {MSG_SEQ, (int64_t)len};
    for (int r = 1; r < g->n; r++)
        if (g->fd[r] < 0 || !send_all(g->fd[r], &h, sizeof h) || !send_all(g->fd[r], buf, len)) {
            close_all(g);
            return false;
        }
    return true;
}

bool sp_ranks_recv(struct sp_ranks *g, void *buf, size_t cap, size_t *len) {
    SP_ASSERT(g->net && g->self > 0);
    struct sum_head h;
    if (g->fd[0] < 0 || !recv_all(g->fd[0], &h, sizeof h) || h.seq != MSG_SEQ || h.n < 0 || (size_t)h.n > cap ||
        !recv_all(g->fd[0], buf, (size_t)h.n)) {
        close_all(g);
        return false;
    }
    *len = (size_t)h.n;
    return true;
}

/* v[0 .. n) = first[i] + the slots of ranks 1 .. in rank order (the one order of every sum). */
static void add_slots(const struct sp_ranks *g, const float *first, float *v, int64_t n) {
    for (int64_t i = 0; i < n; i++) {
        float s = first[i];
        for (int r = 1; r < g->n; r++) s += g->slots[(size_t)r * (size_t)g->floats + (size_t)i];
        v[i] = s;
    }
}

/* A sum through rank 0 (every rank's n the same, at the same count of sums). */
static bool net_sum(struct sp_ranks *g, float *v, int64_t n) {
    struct sum_head h = {g->sums++, n};
    size_t bytes = (size_t)n * sizeof *v;
    if (g->self) return send_all(g->fd[0], &h, sizeof h) && send_all(g->fd[0], v, bytes) && recv_all(g->fd[0], v, bytes);
    for (int r = 1; r < g->n; r++) {
        struct sum_head o;
        float *s = g->slots + (size_t)r * (size_t)g->floats;
        if (g->fd[r] < 0 || !recv_all(g->fd[r], &o, sizeof o) || o.seq != h.seq || o.n != n || !recv_all(g->fd[r], s, bytes)) {
            close_all(g);  // the others stop at their next read
            return false;
        }
    }
    add_slots(g, v, v, n);
    for (int r = 1; r < g->n; r++)
        if (!send_all(g->fd[r], v, bytes)) {
            close_all(g);
            return false;
        }
    return true;
}

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
    if (g->net) close_all(g);
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
    if (g->net) return net_sum(g, v, n);
    memcpy(g->slots + (size_t)rank * (size_t)g->floats, v, (size_t)n * sizeof *v);
    if (!barrier(g)) return false;
    add_slots(g, g->slots, v, n);
    /* no rank writes its slot again before every rank has read them all */
    return barrier(g);
}

bool sp_ranks_barrier(struct sp_ranks *g) {
    SP_ASSERT(!g->net);
    return barrier(g);
}

void sp_ranks_fail(struct sp_ranks *g, int rank) {
    (void)rank;
    if (g->net) {
        close_all(g);
        return;
    }
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
    int64_t cap = (n_experts + n_ranks - 1) / n_ranks;  // as many experts a rank: their memory alike
    for (int64_t i = 0; i < n_experts; i++) {
        int best = -1;
        for (int r = 0; r < n_ranks; r++)
            if (count[r] < cap &&
                (best < 0 || sum[r] < sum[best] || (sum[r] == sum[best] && count[r] < count[best])))
                best = r;
        int64_t e = order[i].e;
        owner[e] = best;
        sum[best] += load ? load[e] : 1.0;
        count[best]++;
    }
    free(order);
}
