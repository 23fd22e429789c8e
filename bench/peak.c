/*
 * peak.c - the compute bound of this CPU's kernel instructions: how many of
 * each multiply instruction one thread retires a nanosecond when nothing but
 * the instruction limits it (12 independent sums in flight, operands in
 * registers), and that rate in multiply-adds. Prefill-sized products are
 * compared with these figures, never with a rate measured through C code
 * (a compiler merges a loop of identical multiplies).
 *
 *     build/bench/peak
 *
 * One machine-readable line per instruction the CPU has (best of 7 passes):
 *
 *     peak op=vpmaddubsw-ymm per_ns=... gmacs=...
 *
 * The ops: vpmaddubsw (AVX2 int8 x 4-bit products, 32 multiply-adds), the
 * same followed by the vpaddw that adds its int16 sums (what the avx2 set's
 * product by tokens issues per multiply), vpmaddwd (int16 products, 16),
 * vfmadd231ps (float, 8), and with VNNI vpdpbusd (32 in a ymm register, 64
 * in a zmm one), the 512-bit FMA (16) and with AVX512-BF16 vdpbf16ps (bf16
 * pairs into float sums, 32). gmacs = per_ns x multiply-adds an
 * instruction; a thread's bound, so N threads on N cores multiply it by N.
 */
#include <stdio.h>
#include <time.h>

#if defined(__x86_64__)

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

#define ITERS 20000000L
#define REPEAT(M) M(0) M(1) M(2) M(3) M(4) M(5) M(6) M(7) M(8) M(9) M(10) M(11)
#define VEC_CLOBBERS "xmm0", "xmm1", "xmm2", "xmm3", "xmm4", "xmm5", "xmm6", "xmm7", "xmm8", "xmm9", "xmm10", "xmm11", "xmm12"

/* Each loop issues 12 of its instruction an iteration, into 12 registers,
 * from registers zeroed first (no denormal or NaN operands to slow a
 * multiply down). */
#define LOOP(NAME, BODY)                                                          \
    static void NAME(long n) {                                                    \
        __asm__ volatile("vzeroall" ::: VEC_CLOBBERS, "xmm13", "xmm14", "xmm15"); \
        for (long i = 0; i < n; i++) __asm__ volatile(BODY ::: VEC_CLOBBERS);     \
    }
#define MADDUBS(j) "vpmaddubsw %%ymm14, %%ymm15, %%ymm" #j "\n\t"
#define MADDUBS_ADD(j) "vpmaddubsw %%ymm14, %%ymm15, %%ymm12\n\tvpaddw %%ymm12, %%ymm" #j ", %%ymm" #j "\n\t"
#define MADDWD(j) "vpmaddwd %%ymm14, %%ymm15, %%ymm" #j "\n\t"
#define FMA_YMM(j) "vfmadd231ps %%ymm14, %%ymm15, %%ymm" #j "\n\t"
#define DPBUSD_YMM(j) "%{vex%} vpdpbusd %%ymm14, %%ymm15, %%ymm" #j "\n\t"
#define DPBUSD_ZMM(j) "vpdpbusd %%zmm14, %%zmm15, %%zmm" #j "\n\t"
#define FMA_ZMM(j) "vfmadd231ps %%zmm14, %%zmm15, %%zmm" #j "\n\t"
#define DPBF16_ZMM(j) "vdpbf16ps %%zmm14, %%zmm15, %%zmm" #j "\n\t"
LOOP(loop_maddubs, REPEAT(MADDUBS))
LOOP(loop_maddubs_add, REPEAT(MADDUBS_ADD))
LOOP(loop_maddwd, REPEAT(MADDWD))
LOOP(loop_fma, REPEAT(FMA_YMM))
LOOP(loop_dpbusd_ymm, REPEAT(DPBUSD_YMM))
LOOP(loop_dpbusd_zmm, REPEAT(DPBUSD_ZMM))
LOOP(loop_fma_zmm, REPEAT(FMA_ZMM))
LOOP(loop_dpbf16_zmm, REPEAT(DPBF16_ZMM))

enum feature { AVX2, AVXVNNI, AVX512VNNI, AVX512F, AVX512BF16 };

struct op {
    const char *name;
    enum feature needs;
    void (*loop)(long);
    int macs;  // multiply-adds an instruction
};

static const struct op ops[] = {
    {"vpmaddubsw-ymm", AVX2, loop_maddubs, 32},
    {"vpmaddubsw+vpaddw-ymm", AVX2, loop_maddubs_add, 32},
    {"vpmaddwd-ymm", AVX2, loop_maddwd, 16},
    {"vfmadd231ps-ymm", AVX2, loop_fma, 8},
    {"vpdpbusd-ymm", AVXVNNI, loop_dpbusd_ymm, 32},
    {"vpdpbusd-zmm", AVX512VNNI, loop_dpbusd_zmm, 64},
    {"vfmadd231ps-zmm", AVX512F, loop_fma_zmm, 16},
    {"vdpbf16ps-zmm", AVX512BF16, loop_dpbf16_zmm, 32},
};

/* (the builtin takes a literal) */
static int supports(enum feature f) {
    switch (f) {
    case AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case AVXVNNI: return __builtin_cpu_supports("avxvnni");
    case AVX512VNNI: return __builtin_cpu_supports("avx512vnni");
    case AVX512BF16: return __builtin_cpu_supports("avx512bf16");
    default: return __builtin_cpu_supports("avx512f");
    }
}

int main(void) {
    __builtin_cpu_init();
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        const struct op *o = &ops[i];
        if (!supports(o->needs)) continue;
        o->loop(ITERS / 10);  // clocks up
        double best = 0;
        for (int pass = 0; pass < 7; pass++) {
            double t0 = now_s();
            o->loop(ITERS);
            double per_ns = 12.0 * (double)ITERS / ((now_s() - t0) * 1e9);
            if (per_ns > best) best = per_ns;
        }
        printf("peak op=%s per_ns=%.2f gmacs=%.1f\n", o->name, best, best * o->macs);
    }
    return 0;
}

#else

int main(void) {
    printf("peak: x86-64 only\n");
    return 0;
}

#endif
