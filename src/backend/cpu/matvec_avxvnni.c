/* matvec_avxvnni.c - the kernel sets "avxvnni" and "avxvnni-int16":
 * matvec_x86.h built with AVX2 + FMA + F16C + AVX-VNNI (the VEX-encoded
 * vpdpbusd / vpdpwssd of CPUs without AVX-512, e.g. Alder Lake). */
#define KSET_ISA SP_KERNELS_AVXVNNI
#define KSET_INT16_ISA SP_KERNELS_AVXVNNI_INT16
#define KSET_NAME "avxvnni"
#define KSET_ENTRY sp_kernels_avxvnni_set
#include "backend/cpu/matvec_x86.h"
