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
 * pairs into float sums, 32). With AMX (and Linux's leave to use it),
 * the tile products on 16 x 16 sums, 4 tiles of sums in flight: tdpbusd
 * with 64 bytes of k (16384 multiply-adds), tdpbusd with 32 (a 32-column
 * weight group: mxfp4, affine group 32; 8192), tdpbf16ps (32 bf16 pairs
 * of k, 8192); and tilestored of a tile of 16 x 16 int32 sums (1 KiB, no
 * multiply-adds: gmacs 0), which a product whose groups are 32 columns
 * issues once per tdpbusd. gmacs = per_ns x multiply-adds an instruction; a
 * thread's bound, so N threads on N cores multiply it by N.
 */
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <sys/syscall.h>
#include <unistd.h>

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

/* AMX: tiles 0-3 hold 16 x 16 sums, tile 4 16 rows of kbytes of the first
 * operand, tile 5 kbytes / 4 rows of 64 bytes of the second (zeros). */
static void amx_begin(int kbytes) {
    struct {
        uint8_t palette, start_row, reserved[14];
        uint16_t bytes[16];
        uint8_t rows[16];
    } c __attribute__((aligned(64)));
    memset(&c, 0, sizeof c);
    c.palette = 1;
    for (int t = 0; t < 6; t++) {
        c.rows[t] = (uint8_t)(t == 5 ? kbytes / 4 : 16);
        c.bytes[t] = (uint16_t)(t == 4 ? kbytes : 64);
    }
    __asm__ volatile("ldtilecfg %0\n\ttilezero %%tmm0\n\ttilezero %%tmm1\n\ttilezero %%tmm2\n\t"
                     "tilezero %%tmm3\n\ttilezero %%tmm4\n\ttilezero %%tmm5" ::"m"(c));
}
static void amx_end(void) { __asm__ volatile("tilerelease"); }
#define AMX_LOOP(NAME, KBYTES, BODY)                                    \
    static void NAME(long n) {                                          \
        amx_begin(KBYTES);                                              \
        for (long i = 0; i < n; i++) __asm__ volatile(BODY ::: "memory"); \
        amx_end();                                                      \
    }
#define TDP4(OP) OP " %%tmm5, %%tmm4, %%tmm0\n\t" OP " %%tmm5, %%tmm4, %%tmm1\n\t" \
                 OP " %%tmm5, %%tmm4, %%tmm2\n\t" OP " %%tmm5, %%tmm4, %%tmm3\n\t"
static int32_t tile_out[4][256] __attribute__((aligned(64)));
AMX_LOOP(loop_tdpbusd64, 64, TDP4("tdpbusd"))
AMX_LOOP(loop_tdpbusd32, 32, TDP4("tdpbusd"))
AMX_LOOP(loop_tdpbf16ps, 64, TDP4("tdpbf16ps"))
static void loop_tilestored(long n) {
    amx_begin(64);
    for (long i = 0; i < n; i++)
        for (int j = 0; j < 4; j++) __asm__ volatile("tilestored %%tmm0, (%0,%1,1)" ::"r"(tile_out[j]), "r"(64L) : "memory");
    amx_end();
}

enum feature { AVX2, AVXVNNI, AVX512VNNI, AVX512F, AVX512BF16, AMX_INT8, AMX_BF16 };

struct op {
    const char *name;
    enum feature needs;
    void (*loop)(long);
    int macs;     // multiply-adds an instruction
    int per_it;   // instructions an iteration
    long iters;   // iterations a pass
};

#define VEC(NAME, NEEDS, LOOP, MACS) {NAME, NEEDS, LOOP, MACS, 12, ITERS}
#define TILE(NAME, NEEDS, LOOP, MACS) {NAME, NEEDS, LOOP, MACS, 4, ITERS / 40}
static const struct op ops[] = {
    VEC("vpmaddubsw-ymm", AVX2, loop_maddubs, 32),
    VEC("vpmaddubsw+vpaddw-ymm", AVX2, loop_maddubs_add, 32),
    VEC("vpmaddwd-ymm", AVX2, loop_maddwd, 16),
    VEC("vfmadd231ps-ymm", AVX2, loop_fma, 8),
    VEC("vpdpbusd-ymm", AVXVNNI, loop_dpbusd_ymm, 32),
    VEC("vpdpbusd-zmm", AVX512VNNI, loop_dpbusd_zmm, 64),
    VEC("vfmadd231ps-zmm", AVX512F, loop_fma_zmm, 16),
    VEC("vdpbf16ps-zmm", AVX512BF16, loop_dpbf16_zmm, 32),
    TILE("tdpbusd-k64", AMX_INT8, loop_tdpbusd64, 16 * 16 * 64),
    TILE("tdpbusd-k32", AMX_INT8, loop_tdpbusd32, 16 * 16 * 32),
    TILE("tdpbf16ps", AMX_BF16, loop_tdpbf16ps, 16 * 16 * 32),
    TILE("tilestored-1k", AMX_INT8, loop_tilestored, 0),
};

/* AMX-TILE with AMX-INT8 (bit 25) or AMX-BF16 (bit 22) in cpuid leaf 7,
 * the OS saving tile state (XCR0 bits 17 and 18), and Linux's leave for
 * this process to use it (arch_prctl ARCH_REQ_XCOMP_PERM). */
static int amx_supports(int bit) {
    unsigned a, b, c, d;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(0), "c"(0));
    if (a < 7) return 0;
    __asm__("cpuid" : "=a"(a), "=b"(b), "=c"(c), "=d"(d) : "a"(7), "c"(0));
    if (!(d & (1u << 24)) || !(d & (1u << bit))) return 0;
    unsigned lo, hi;
    __asm__("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    if ((lo & 0x60000) != 0x60000) return 0;
    return syscall(SYS_arch_prctl, 0x1023 /* ARCH_REQ_XCOMP_PERM */, 18 /* XTILEDATA */) == 0;
}

/* (the builtin takes a literal) */
static int supports(enum feature f) {
    switch (f) {
    case AVX2: return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case AVXVNNI: return __builtin_cpu_supports("avxvnni");
    case AVX512VNNI: return __builtin_cpu_supports("avx512vnni");
    case AVX512BF16: return __builtin_cpu_supports("avx512bf16");
    case AMX_INT8: return amx_supports(25);
    case AMX_BF16: return amx_supports(22);
    default: return __builtin_cpu_supports("avx512f");
    }
}

int main(void) {
    __builtin_cpu_init();
    for (size_t i = 0; i < sizeof ops / sizeof *ops; i++) {
        const struct op *o = &ops[i];
        if (!supports(o->needs)) continue;
        o->loop(o->iters / 10);  // clocks up
        double best = 0;
        for (int pass = 0; pass < 7; pass++) {
            double t0 = now_s();
            o->loop(o->iters);
            double per_ns = (double)o->per_it * (double)o->iters / ((now_s() - t0) * 1e9);
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
