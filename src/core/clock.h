/*
 * clock.h - seconds as doubles, for durations and rates.
 *
 *     double t0 = sp_now_s();
 *     ... work ...
 *     double tok_s = n / (sp_now_s() - t0);
 */
#ifndef SP_CORE_CLOCK_H
#define SP_CORE_CLOCK_H

#include <time.h>

static inline double sp_clock_s(clockid_t id) {
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Monotonic wall-clock seconds. */
static inline double sp_now_s(void) { return sp_clock_s(CLOCK_MONOTONIC); }

/* CPU seconds of the calling thread: on a shared machine wall time also
 * counts the time other processes held the core. */
static inline double sp_thread_cpu_s(void) { return sp_clock_s(CLOCK_THREAD_CPUTIME_ID); }

#endif
