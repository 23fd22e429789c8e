/* matvec_avx512.c - the kernel sets "avx512" and "avx512-int16":
 * matvec_x86.h built with AVX-512 F/BW/VL/DQ + VNNI (Ice Lake and later
 * Xeons, Zen 4 and later): 512-bit vectors for int16 x 4-bit rows of group
 * 32 or 64 (avx512-int16), 256-bit ones for the rest; with AVX512-BF16
 * (functions of their own target, used where cpuid has it) the avx512 set
 * multiplies bf16 rows by bf16 activations. */
#define KSET_ISA SP_KERNELS_AVX512
#define KSET_INT16_ISA SP_KERNELS_AVX512_INT16
#define KSET_NAME "avx512"
#define KSET_ENTRY sp_kernels_avx512_set
#include "backend/cpu/matvec_x86.h"
