/* matvec_avx2.c - the kernel sets "avx2" (int8 activations for 4- and 8-bit
 * rows), "avx2-int16" (int16 for both) and "avx2f" (float
 * activations): matvec_x86.h built with AVX2 + FMA + F16C. */
#define KSET_ISA SP_KERNELS_AVX2
#define KSET_INT16_ISA SP_KERNELS_AVX2_INT16
#define KSET_NAME "avx2"
#define KSET_FLOAT_ISA SP_KERNELS_AVX2F
#define KSET_FLOAT_NAME "avx2f"
#define KSET_ENTRY sp_kernels_avx2_set
#include "backend/cpu/matvec_x86.h"
