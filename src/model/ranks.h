/*
 * ranks.h - expert parallelism inside one process: the routed experts of
 * each MoE layer split over several ranks, each a context with a backend
 * of its own that runs the same forward pass, the ranks' MoE outputs summed
 * after each MoE layer (model/forward.h: sp_ctx_params.n_ranks).
 *
 *     struct sp_ranks *g;
 *     sp_ranks_create(2, floats, &g);
 *     sp_ranks_run(g, fn, arg);            // fn(arg, 0) here, fn(arg, 1) on rank 1's thread
 *     ... inside fn, on every rank:
 *     sp_ranks_sum(g, rank, v, n);         // v = the sum of every rank's v
 *
 * Rank 0 runs on the caller's thread, every other rank on a thread of its
 * own that lives as long as the group. The sum adds the ranks' vectors in
 * rank order, so every rank gets the same bits.
 *
 * Ranks may also be processes, one a rank, each running the same program
 * on the same input (started by a launcher that sets torchrun's RANK,
 * WORLD_SIZE, MASTER_ADDR and MASTER_PORT): sp_ranks_connect joins this
 * process's rank to the others over TCP (rank 0 listens, the others
 * connect to it), and each sum goes through rank 0, which adds the ranks'
 * vectors in rank order and sends the sum back. Equal sums keep the ranks
 * in step: each runs the whole pass and the same sampling.
 */
#ifndef SP_MODEL_RANKS_H
#define SP_MODEL_RANKS_H

#include <stdbool.h>
#include <stdint.h>

#include "core/status.h"

#define SP_RANKS_MAX 64

struct sp_ranks;

/* A group of n ranks (2 .. SP_RANKS_MAX) whose sums hold up to `floats`
 * floats a rank. */
enum sp_status sp_ranks_create(int n, int64_t floats, struct sp_ranks **out);
void sp_ranks_free(struct sp_ranks *g);

/* This process's rank `rank` of n (2 .. SP_RANKS_MAX) processes whose sums
 * hold up to `floats` floats: rank 0 listens at addr:port for the others,
 * which try to connect for up to timeout_s. Each says its rank and key (a
 * number that must be the same for all: what they run), so a process of
 * another rank count, rank taken twice or other key is refused. */
enum sp_status sp_ranks_connect(int rank, int n, const char *addr, int port, uint64_t key, int64_t floats,
                                double timeout_s, struct sp_ranks **out);

/* Ranks in processes where rank 0 leads: rank 0's len bytes at buf to
 * every other rank (sp_ranks_send), each other rank's next message into
 * buf (up to cap bytes; *len its size). False where a rank is gone or a
 * message is past cap. */
bool sp_ranks_send(struct sp_ranks *g, const void *buf, size_t len);
bool sp_ranks_recv(struct sp_ranks *g, void *buf, size_t cap, size_t *len);

/* fn(arg, r) for every rank r at once; returns when every rank's has
 * (a group of threads). */
void sp_ranks_run(struct sp_ranks *g, void (*fn)(void *arg, int rank), void *arg);

/* Inside sp_ranks_run, on every rank in the same order: v[0 .. n) (n at
 * most the group's floats) becomes the sum of every rank's v[0 .. n).
 * False, v unchanged, where a rank gave up (sp_ranks_fail) in this run. */
bool sp_ranks_sum(struct sp_ranks *g, int rank, float *v, int64_t n);

/* Ranks in threads, inside sp_ranks_run, on every rank in the same order:
 * returns once every rank has reached it; false where a rank gave up. */
bool sp_ranks_barrier(struct sp_ranks *g);

/* Rank `rank` reaches no more sums in this run: the others' return false
 * instead of waiting for it (over TCP: its connections close). */
void sp_ranks_fail(struct sp_ranks *g, int rank);

/* Experts [0, n_experts) to ranks [0, n_ranks), at most ceil(n_experts /
 * n_ranks) a rank (each rank's memory alike), so that each rank's share of
 * the load (load[e]: an expert's expected tokens; NULL: every expert
 * alike) is about the same: the heaviest expert first, each to the rank
 * with the least load so far that has room (ties: fewer experts, then the
 * lower rank). owner[e] gets its rank. */
void sp_ranks_split(const double *load, int64_t n_experts, int n_ranks, int32_t *owner);

#endif
