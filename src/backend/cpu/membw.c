/* membw.c - RAM read bandwidth by a pool's threads (see membw.h). */
#include "backend/cpu/membw.h"

#include "core/alloc.h"
#include "core/clock.h"
#include "backend/cpu/kernels.h"

#define MEMBW_MAX_THREADS 256

struct bw_job {
    const uint64_t *buf;
    size_t words;
    int simd;
    struct {
        double cpu_s;
        uint64_t sink;
        char pad[48];
    } t[MEMBW_MAX_THREADS];
};

/* Reads the thread's share of the buffer: with eight independent integer
 * sums, or with the kernel set's float dot of the share with itself. The
 * buffer holds 1.0f everywhere, so the dot sees no denormals. */
static void bw_read(void *arg, int tid, int nth) {
    struct bw_job *j = arg;
    int64_t lo, hi;
    sp_pool_split((int64_t)(j->words / 8), tid, nth, &lo, &hi);
    double c0 = sp_thread_cpu_s();
    if (j->simd) {
        const float *f = (const float *)(const void *)(j->buf + lo * 8);
        j->t[tid].sink = (uint64_t)sp_kernels()->dot(f, f, (hi - lo) * 16);
    } else {
        uint64_t s[8] = {0};
        for (int64_t i = lo * 8; i < hi * 8; i += 8)
            for (int k = 0; k < 8; k++) s[k] += j->buf[i + k];
        j->t[tid].sink = s[0] ^ s[1] ^ s[2] ^ s[3] ^ s[4] ^ s[5] ^ s[6] ^ s[7];
    }
    j->t[tid].cpu_s = sp_thread_cpu_s() - c0;
}

enum sp_status sp_membw_measure(struct sp_pool *pool, int nth, size_t bytes, struct sp_membw *out) {
    if (nth < 1) nth = 1;
    if (nth > sp_pool_size(pool)) nth = sp_pool_size(pool);
    if (nth > MEMBW_MAX_THREADS) nth = MEMBW_MAX_THREADS;
    /* in 2 MiB pages where the kernel allows, as the weights are */
    uint64_t *buf = sp_malloc_huge(bytes, SP_MEM_MISC);
    struct bw_job *j = sp_calloc(1, sizeof *j, SP_MEM_MISC);
    if (!buf || !j) {
        sp_free_aligned(buf);
        sp_free(j);
        return sp_errorf(SP_ERR_NOMEM, "bandwidth measurement: out of memory for a %zu-byte buffer", bytes);
    }
    for (size_t i = 0; i < bytes / 8; i++) buf[i] = 0x3f8000003f800000ull;  // 1.0f pairs
    j->buf = buf;
    j->words = bytes / 8;
    *out = (struct sp_membw){.threads = nth};
    for (int rep = 0; rep < 10; rep++) {
        j->simd = rep & 1;
        double t0 = sp_now_s();
        sp_pool_run_n(pool, bw_read, j, nth);
        double wall = sp_now_s() - t0, cpu = 0;
        for (int i = 0; i < nth; i++) cpu = j->t[i].cpu_s > cpu ? j->t[i].cpu_s : cpu;
        double w = (double)bytes / wall / 1e9, c = cpu > 0 ? (double)bytes / cpu / 1e9 : 0;
        if (w > out->gbs) out->gbs = w;
        if (c > out->gbs_cpu) out->gbs_cpu = c;
    }
    sp_free_aligned(buf);
    sp_free(j);
    return SP_OK;
}
