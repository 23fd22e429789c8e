/* matvec_amx.c - the kernel sets "amx" and "amx-int16": the avx512 build
 * (matvec_avx512.c) plus AMX tiles for the int8 product by tokens
 * (amx_groups; Sapphire Rapids and later Xeons). The int16 twin is
 * avx512-int16's code under this set's name. */
#define KSET_ISA SP_KERNELS_AMX
#define KSET_INT16_ISA SP_KERNELS_AMX_INT16
#define KSET_NAME "amx"
#define KSET_ENTRY sp_kernels_amx_set
#include "backend/cpu/matvec_x86.h"
