/*
 * kernels.c - speed of the CPU linear kernels against the machine's
 * measured memory bandwidth (DESIGN.md §7: decode is memory-bound, so the
 * figure that matters is weight bytes per second as a share of what DRAM
 * delivers).
 *
 *     build/bench/kernels [--quick] [--threads N] [--isa SET] [--fmt NAME] [--mb N] [--shape RxC]
 *                         [--batch N] [--interleaved]
 *
 * First the read bandwidth of this machine: a 1 GiB buffer read by 1 and by
 * N threads (best of 5 passes of an integer sum and 5 of a SIMD dot); the
 * N-thread figure is the bound. Then every kernel set this CPU runs (or
 * only --isa SET: portable, avx2, avx2-int16, avx2f, avxvnni(-int16),
 * avx512(-int16), amx(-int16)) x format x shape (shapes of real MoE models) x batch
 * (1: decode, 64 or --batch N: prefill / batched decode) through sp_linear_apply on an
 * N-thread pool. Each result cycles through enough copies of the matrix
 * (--mb, default 256 MiB) that weights come from DRAM, never from cache;
 * with --interleaved, 4-bit matrices in blocks of 16 rows (the layout of
 * sp_qmat_interleave, read by their own loop in the avx512 and amx sets).
 * One machine-readable line per result:
 *
 *     membw threads=2 gbps=... gbps_cpu=...
 *     kernel isa=avx2 fmt=affine4-g64 layout=rows rows=2048 cols=2048 batch=1 threads=2 bytes=... us=... gbps=...
 *            gflops=... pct_bw=... us_cpu=... gbps_cpu=... gflops_cpu=... pct_bw_cpu=... us_min=...
 *
 * gbps is by wall time; gbps_cpu by the CPU time of the busiest thread,
 * which on a machine shared with other work is close to what an idle
 * machine would show (pct_bw_cpu compares it with the bandwidth measured
 * the same way). us_min is the fastest single product: with --mb small
 * enough for the copies to stay in cache, the figure that moves least
 * from run to run on a machine whose speed wanders (a Zen 5 VM, 768 x 2048
 * affine4 at 32 tokens from cache, three runs in a minute: us 260-410,
 * us_min 194-205). Compare ratios from one run.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/alloc.h"
#include "core/clock.h"
#include "core/half.h"
#include "core/pool.h"
#include "core/rng.h"
#include "backend/cpu/kernels.h"
#include "backend/cpu/linear.h"
#include "backend/cpu/membw.h"

/* Per-thread CPU seconds spent inside timed work (padded to a cache line). */
static struct {
    double s;
    char pad[56];
} cpu_busy[64];

static void cpu_reset(void) { memset(cpu_busy, 0, sizeof cpu_busy); }
/* The busiest thread's CPU time: what the parallel step would take alone. */
static double cpu_max(int nth) {
    double m = 0;
    for (int i = 0; i < nth; i++) m = cpu_busy[i].s > m ? cpu_busy[i].s : m;
    return m;
}

/* ---- weight matrices ---- */

struct fmtdef {
    const char *name;
    enum sp_qtype type;
    int group;
    enum sp_dtype sdt;
};

static const struct fmtdef fmts[] = {
    {"f32", SP_QTYPE_F32, 1, SP_DTYPE_COUNT},
    {"bf16", SP_QTYPE_BF16, 1, SP_DTYPE_COUNT},
    {"f16", SP_QTYPE_F16, 1, SP_DTYPE_COUNT},
    {"affine4-g32", SP_QTYPE_AFFINE4, 32, SP_DTYPE_BF16},
    {"affine4-g64", SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16},
    {"affine4-g128", SP_QTYPE_AFFINE4, 128, SP_DTYPE_BF16},
    {"affine8-g32", SP_QTYPE_AFFINE8, 32, SP_DTYPE_F16},  // GGUF's Q8_0 as read
    {"affine8-g64", SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16},
    {"affine2-g64", SP_QTYPE_AFFINE2, 64, SP_DTYPE_BF16},
    {"affine3-g64", SP_QTYPE_AFFINE3, 64, SP_DTYPE_BF16},
    {"affine5-g32", SP_QTYPE_AFFINE5, 32, SP_DTYPE_F16},  // GGUF's Q5_0 and Q5_1 as read
    {"affine6-g64", SP_QTYPE_AFFINE6, 64, SP_DTYPE_BF16},
    {"mxfp4", SP_QTYPE_MXFP4, 32, SP_DTYPE_U8},
    {"q2_k", SP_QTYPE_Q2_K, 256, SP_DTYPE_COUNT},
    {"q3_k", SP_QTYPE_Q3_K, 256, SP_DTYPE_COUNT},
    {"q4_k", SP_QTYPE_Q4_K, 256, SP_DTYPE_COUNT},
    {"q5_k", SP_QTYPE_Q5_K, 256, SP_DTYPE_COUNT},
    {"q6_k", SP_QTYPE_Q6_K, 256, SP_DTYPE_COUNT},
    {"iq4_nl", SP_QTYPE_IQ4_NL, 32, SP_DTYPE_COUNT},
    {"iq4_xs", SP_QTYPE_IQ4_XS, 256, SP_DTYPE_COUNT},
};

/* Where a ggml block keeps its f16 scales (byte offsets; -1 past the last). */
static const int *f16_scales(enum sp_qtype t) {
    static const int q2[] = {80, 82, -1}, q3[] = {108, -1}, q6[] = {208, -1}, iq4[] = {0, -1}, k4[] = {0, 2, -1},
                     none[] = {-1};
    return t == SP_QTYPE_Q2_K   ? q2
           : t == SP_QTYPE_Q4_K || t == SP_QTYPE_Q5_K ? k4
           : t == SP_QTYPE_Q3_K ? q3
           : t == SP_QTYPE_Q6_K ? q6
           : t == SP_QTYPE_IQ4_NL || t == SP_QTYPE_IQ4_XS ? iq4
                                                           : none;
}

/* (rows, cols) = (out, in): dense / attention 2048 and 4096 squares, expert
 * gate/up (512 x 2048) and down (2048 x 512), a 1024 x 4096 projection. */
static const int64_t shapes[][2] = {{2048, 2048}, {512, 2048}, {2048, 512}, {4096, 4096}, {1024, 4096}};

/* n_copies matrices in one buffer each, filled with valid random data:
 * random codes, scales near 1/64 (e8m0 near 2^-6), plain floats ~N(0, 0.02). */
struct mats {
    struct sp_qmat *m;
    uint8_t *codes, *scales, *biases;
    int n;
};

static void mats_make(struct mats *o, const struct fmtdef *f, int64_t rows, int64_t cols, size_t budget,
                      struct sp_rng *rng) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(f->type);
    bool quant = sp_qtype_is_quantized(f->type) && !tr->block_bytes;  // scales in arrays of their own
    size_t cb = (size_t)rows * sp_qtype_row_bytes(f->type, cols);
    size_t ng = quant ? (size_t)(cols / f->group) : 0, sb = (size_t)rows * ng * (quant ? sp_dtype_size(f->sdt) : 0);
    size_t one = sp_qtype_matrix_bytes(f->type, f->group, f->sdt, rows, cols);
    o->n = (int)((budget + one - 1) / one);
    if (o->n < 2) o->n = 2;
    o->m = calloc((size_t)o->n, sizeof *o->m);
    o->codes = sp_malloc_aligned(cb * (size_t)o->n, 64, SP_MEM_MISC);
    o->scales = sb ? sp_malloc_aligned(sb * (size_t)o->n, 64, SP_MEM_MISC) : NULL;
    o->biases = sb && f->type != SP_QTYPE_MXFP4 ? sp_malloc_aligned(sb * (size_t)o->n, 64, SP_MEM_MISC) : NULL;
    if (!o->m || !o->codes || (sb && !o->scales)) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    size_t nel = (size_t)rows * (size_t)cols * (size_t)o->n;
    if (f->type == SP_QTYPE_F32)
        for (size_t i = 0; i < nel; i++) ((float *)(void *)o->codes)[i] = sp_rng_normal(rng) * 0.02f;
    else if (f->type == SP_QTYPE_BF16 || f->type == SP_QTYPE_F16)
        for (size_t i = 0; i < nel; i++) {
            float v = sp_rng_normal(rng) * 0.02f;
            uint16_t h = f->type == SP_QTYPE_BF16 ? sp_f32_to_bf16(v) : sp_f32_to_f16(v);
            memcpy(o->codes + 2 * i, &h, 2);
        }
    else
        for (size_t i = 0; i < cb * (size_t)o->n; i += 8) {
            uint64_t r = sp_rng_next(rng);
            memcpy(o->codes + i, &r, 8);
        }
    for (size_t i = 0; tr->block_bytes && i < cb * (size_t)o->n; i += (size_t)tr->block_bytes)
        for (const int *at = f16_scales(f->type); *at >= 0; at++) {  // finite scales, not random bits
            uint16_t d = sp_f32_to_f16(1.0f / 4096.0f);
            memcpy(o->codes + i + *at, &d, 2);
        }
    for (size_t i = 0; sb && i < rows * ng * (size_t)o->n; i++) {
        if (f->type == SP_QTYPE_MXFP4) {
            o->scales[i] = (uint8_t)(121 + sp_rng_next(rng) % 4);
        } else {
            sp_dtype_store_float(f->sdt, o->scales, i, (1.0f + sp_rng_uniform(rng)) / 64.0f);
            sp_dtype_store_float(f->sdt, o->biases, i, -(1.0f + sp_rng_uniform(rng)) / 8.0f);
        }
    }
    for (int c = 0; c < o->n; c++)
        o->m[c] = (struct sp_qmat){.type = f->type, .group = f->group, .rows = rows, .cols = cols,
                                   .codes = o->codes + cb * (size_t)c,
                                   .scales = sb ? o->scales + sb * (size_t)c : NULL,
                                   .biases = o->biases ? o->biases + sb * (size_t)c : NULL,
                                   .scale_dtype = quant ? f->sdt : SP_DTYPE_COUNT};
}

/* Each copy interleaved in blocks of 16 rows (sp_qmat_interleave), the
 * row-order buffers given back; nothing where the format has no such form. */
static void mats_interleave(struct mats *o) {
    if (!sp_qmat_interleavable(&o->m[0])) return;
    const struct sp_qmat *m = &o->m[0];
    size_t cb = (size_t)m->rows * sp_qtype_row_bytes(m->type, m->cols);
    size_t sb = (size_t)(m->rows * (m->cols / m->group)) * sp_dtype_size(m->scale_dtype);
    uint8_t *codes = sp_malloc_aligned(cb * (size_t)o->n, 64, SP_MEM_MISC);
    uint8_t *scales = sp_malloc_aligned(sb * (size_t)o->n, 64, SP_MEM_MISC);
    uint8_t *biases = o->biases ? sp_malloc_aligned(sb * (size_t)o->n, 64, SP_MEM_MISC) : NULL;
    if (!codes || !scales || (o->biases && !biases)) {
        fprintf(stderr, "out of memory\n");
        exit(2);
    }
    for (int c = 0; c < o->n; c++) {
        size_t at = sb * (size_t)c;
        sp_qmat_interleave(&o->m[c], codes + cb * (size_t)c, scales + at, biases ? biases + at : NULL, &o->m[c]);
    }
    sp_free_aligned(o->codes);
    sp_free_aligned(o->scales);
    sp_free_aligned(o->biases);
    o->codes = codes;
    o->scales = scales;
    o->biases = biases;
}

static void mats_free(struct mats *o) {
    free(o->m);
    sp_free_aligned(o->codes);
    sp_free_aligned(o->scales);
    sp_free_aligned(o->biases);
}

/* The active kernel set is chosen once per process; the bench swaps it by
 * calling the set's matmul_rows through the pool itself, like rows_job. */
struct mm_job {
    const struct sp_kernels *k;
    const struct sp_qmat *w;
    const float *x;
    float *y;
    int64_t n;
    struct sp_pool *pool;
};

static void mm_rows(void *arg, int tid, int nth) {
    struct mm_job *j = arg;
    int64_t lo, hi;
    sp_pool_split(j->w->rows, tid, nth, &lo, &hi);
    double c0 = sp_thread_cpu_s();
    if (lo < hi) j->k->matmul_rows(j->w, lo, hi, j->x, j->w->cols, j->n, j->y, j->w->rows, sp_pool_scratch(j->pool, tid));
    cpu_busy[tid].s += sp_thread_cpu_s() - c0;
}

int main(int argc, char **argv) {
    int threads = 2;
    bool quick = false, interleaved = false;
    const char *only_isa = NULL, *only_fmt = NULL;
    size_t budget = 256u << 20;
    int64_t one_shape[1][2] = {{0, 0}};  // --shape: only this (rows, cols), e.g. an lm_head's 151936x2048
    int64_t batches[] = {1, 64};         // --batch N: the second
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--quick")) quick = true;
        else if (!strcmp(argv[i], "--interleaved")) interleaved = true;
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--isa") && i + 1 < argc) only_isa = argv[++i];
        else if (!strcmp(argv[i], "--fmt") && i + 1 < argc) only_fmt = argv[++i];
        else if (!strcmp(argv[i], "--mb") && i + 1 < argc) budget = (size_t)atol(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--shape") && i + 1 < argc &&
                 sscanf(argv[++i], "%" SCNd64 "x%" SCNd64, &one_shape[0][0], &one_shape[0][1]) == 2 &&
                 one_shape[0][0] > 0 && one_shape[0][1] > 0 && one_shape[0][1] % 128 == 0)
            continue;
        else if (!strcmp(argv[i], "--batch") && i + 1 < argc && atoi(argv[i + 1]) >= 1 && atoi(argv[i + 1]) <= 64)
            batches[1] = atoi(argv[++i]);
        else {
            fprintf(stderr,
                    "usage: %s [--quick] [--threads N] [--isa SET] [--fmt NAME] [--mb N] [--shape RxC] [--batch N]\n"
                    "          [--interleaved]\n"
                    "  --shape RxC   only R rows x C columns (C a multiple of 128)\n"
                    "  --batch N     the second batch size, 1 to 64 (default 64; the first is 1)\n"
                    "  --interleaved 4-bit matrices in blocks of 16 rows (sp_qmat_interleave)\n",
                    argv[0]);
            return 2;
        }
    }
    struct sp_pool *pool;
    if (sp_pool_create(threads, &pool) != SP_OK) return 2;

    struct sp_membw bw1, bwn;
    if (sp_membw_measure(pool, 1, (size_t)1 << 30, &bw1) != SP_OK ||
        sp_membw_measure(pool, threads, (size_t)1 << 30, &bwn) != SP_OK)
        return 2;
    printf("membw threads=1 gbps=%.2f gbps_cpu=%.2f\n", bw1.gbs, bw1.gbs_cpu);
    printf("membw threads=%d gbps=%.2f gbps_cpu=%.2f\n", threads, bwn.gbs, bwn.gbs_cpu);
    fflush(stdout);

    struct sp_rng rng;
    sp_rng_seed(&rng, 1);
    const int64_t(*shape)[2] = one_shape[0][0] ? (const int64_t(*)[2])one_shape : shapes;
    int nshapes = one_shape[0][0] ? 1 : quick ? 2 : (int)(sizeof shapes / sizeof *shapes);
    int64_t max_rows = 0, max_cols = 0;
    for (int si = 0; si < nshapes; si++) {
        max_rows = shape[si][0] > max_rows ? shape[si][0] : max_rows;
        max_cols = shape[si][1] > max_cols ? shape[si][1] : max_cols;
    }
    float *x = sp_malloc_aligned((size_t)(64 * max_cols) * sizeof(float), 64, SP_MEM_MISC);
    float *y = sp_malloc_aligned((size_t)(64 * max_rows) * sizeof(float), 64, SP_MEM_MISC);
    for (int64_t i = 0; i < 64 * max_cols; i++) x[i] = sp_rng_normal(&rng);
    for (size_t fi = 0; fi < sizeof fmts / sizeof *fmts; fi++) {
        const struct fmtdef *f = &fmts[fi];
        if (only_fmt && strcmp(only_fmt, f->name)) continue;
        for (int si = 0; si < nshapes; si++) {
            int64_t rows = shape[si][0], cols = shape[si][1];
            struct mats M;
            mats_make(&M, f, rows, cols, budget, &rng);
            if (interleaved) mats_interleave(&M);
            size_t bytes = sp_qtype_matrix_bytes(f->type, f->group, f->sdt, rows, cols);
            if (sp_pool_reserve(pool, sp_kernels_scratch_bytes(&M.m[0])) != SP_OK) return 2;
            for (int isa = 0; isa < SP_KERNELS_ISA_COUNT; isa++) {
                const struct sp_kernels *k = sp_kernels_of((enum sp_kernels_isa)isa);
                if (!k || (only_isa && strcmp(only_isa, k->name))) continue;
                for (int bi = 0; bi < 2; bi++) {
                    int64_t n = batches[bi];
                    struct mm_job j = {k, NULL, x, y, n, pool};
                    /* one warm-up pass over every copy, then passes for >= 0.3 s */
                    for (int c = 0; c < M.n; c++) {
                        j.w = &M.m[c];
                        sp_pool_run(pool, mm_rows, &j);
                    }
                    int64_t calls = 0;
                    cpu_reset();
                    /* one clock read a product: each ends the last one's time and starts the next's */
                    double t0 = sp_now_s(), t = t0, fastest = INFINITY;
                    do {
                        for (int c = 0; c < M.n; c++, calls++) {
                            j.w = &M.m[c];
                            sp_pool_run(pool, mm_rows, &j);
                            double now = sp_now_s();
                            if (now - t < fastest) fastest = now - t;
                            t = now;
                        }
                    } while (t - t0 < (quick ? 0.15 : 0.3));
                    double us = (t - t0) / (double)calls * 1e6;
                    double gbps = (double)bytes / (us * 1e-6) / 1e9;
                    double gflops = 2.0 * (double)rows * (double)cols * (double)n / (us * 1e-6) / 1e9;
                    double us_cpu = cpu_max(threads) / (double)calls * 1e6;
                    double gbps_cpu = (double)bytes / (us_cpu * 1e-6) / 1e9;
                    double gflops_cpu = 2.0 * (double)rows * (double)cols * (double)n / (us_cpu * 1e-6) / 1e9;
                    printf("kernel isa=%s fmt=%s layout=%s rows=%lld cols=%lld batch=%lld threads=%d bytes=%zu us=%.1f "
                           "gbps=%.2f gflops=%.2f pct_bw=%.1f us_cpu=%.1f gbps_cpu=%.2f gflops_cpu=%.2f pct_bw_cpu=%.1f "
                           "us_min=%.1f\n",
                           k->name, f->name, M.m[0].interleaved ? "interleaved" : "rows", (long long)rows, (long long)cols,
                           (long long)n, threads, bytes, us, gbps,
                           gflops, 100.0 * gbps / bwn.gbs, us_cpu, gbps_cpu, gflops_cpu, 100.0 * gbps_cpu / bwn.gbs_cpu,
                           fastest * 1e6);
                    fflush(stdout);
                }
            }
            mats_free(&M);
        }
    }
    sp_free_aligned(x);
    sp_free_aligned(y);
    sp_pool_free(pool);
    return 0;
}
