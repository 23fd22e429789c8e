/*
 * kernels.cu - the CUDA backend's kernels (kernels.h). Products decode
 * weights 8 elements at a time (every format's groups are whole multiples
 * of 8 elements, and 8 b-bit codes fill b whole bytes): a warp takes a
 * row, its lanes take units of 8 columns in turn, and up to TOKENS tokens
 * of the batch share each decoded unit. The common formats (affine 4- and
 * 8-bit, mxfp4, f16, bf16) take a faster path: 16-byte loads of codes,
 * several rows a warp sharing each load of the activations, and the
 * batched MLP kernels (all of a call's gates and ups in one launch, the
 * activation fused, then all its downs in one); batches with int8
 * activations run on tensor cores, adding as the vector kernels add.
 * Every sum is spelled out (fmaf, __fadd_rn, __fmul_rn) so that the
 * compiler's contractions cannot make one instantiation round differently
 * from another: a token's result is the same in any batch. Decoding
 * follows quant/qtype.c's reference exactly, scale x code rounded before
 * the bias is added.
 */
#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include <atomic>
#include <cub/block/block_scan.cuh>
#include <type_traits>

namespace {

constexpr int WARP = 32;
constexpr int TOKENS = 8;     // tokens sharing each decoded unit of a product
constexpr int ROW_WARPS = 4;  // rows (a warp each) per block of a product
constexpr int COL_THREADS = 128;
constexpr int ATT_WARPS = 4;  // warps of an attention block, 32 cached positions each
constexpr int MAX_GRID_Y = 65535;
constexpr int ATT_CHUNK = 128;  // cached positions a block of attention takes (32 a warp)

/* Programmatic dependent launch (sm_90 on; sp_cuda_set_device): a
 * kernel's blocks may start while the kernel before it in the stream
 * still runs. Every block of every kernel waits for it (dep_wait: the
 * kernels before it ended, their writes seen) before it touches anything
 * but weights, so that a kernel's end implies its predecessors' ends;
 * then lets the next kernel's blocks start (dep_launch), which may read
 * their weights while this one works (and what the kernels two or more
 * before them wrote: the one before them has passed its wait). Both are
 * no-ops for a kernel launched without the attribute. */
__device__ __forceinline__ void dep_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

__device__ __forceinline__ void dep_launch() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

__device__ __forceinline__ void dep_start() {
    dep_wait();
    dep_launch();
}

/* Chunks of each of its rows a lane of k_vrows brings to L2 before it waits, past those it loads (PRE). */
constexpr uint32_t PREFETCH_CHUNKS = 2;

/* Brings the 128-byte line at p into L2, without waiting for it. */
__device__ __forceinline__ void prefetch_l2(const void *p) { asm volatile("prefetch.global.L2 [%0];" ::"l"(p)); }

bool overlap = false;  // kernels launched with programmatic dependent launch (sp_cuda_set_device)

/* k<<<grid, block, smem, s>>>(args...), with programmatic dependent launch where overlap is on. */
template <class... P, class... A>
int launch_smem(void (*k)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t s, A &&...args) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = s;
    cudaLaunchAttribute at[1];
    at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    at[0].val.programmaticStreamSerializationAllowed = 1;
    cfg.attrs = at;
    cfg.numAttrs = overlap ? 1 : 0;
    return (int)cudaLaunchKernelEx(&cfg, k, static_cast<P>(args)...);
}

template <class... P, class... A>
int launch(void (*k)(P...), dim3 grid, dim3 block, cudaStream_t s, A &&...args) {
    return launch_smem(k, grid, block, 0, s, static_cast<A &&>(args)...);
}

/* What a product's kernel decodes: plain floats of one type, affine codes,
 * or one of the microscaling formats. */
enum kind { K_F32, K_F16, K_BF16, K_AFFINE, K_MXFP4, K_NVFP4, K_MXFP8, K_Q2K, K_Q3K, K_Q4K, K_Q5K, K_Q6K, K_IQ4NL, K_IQ4XS };

/* IQ4_NL / IQ4_XS code -> value (quant/qtype.h's sp_iq4_values) */
__constant__ int8_t iq4_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

template <int DT>
__device__ __forceinline__ float ldf(const void *p, int64_t i) {
    if constexpr (DT == SP_CUDA_F32) return static_cast<const float *>(p)[i];
    else if constexpr (DT == SP_CUDA_F16) return __half2float(static_cast<const __half *>(p)[i]);
    else return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
}

/* A float of run-time type dt (biases, rarely read). */
__device__ __forceinline__ float ldf_rt(int dt, const void *p, int64_t i) {
    return dt == SP_CUDA_F32   ? ldf<SP_CUDA_F32>(p, i)
           : dt == SP_CUDA_F16 ? ldf<SP_CUDA_F16>(p, i)
                               : ldf<SP_CUDA_BF16>(p, i);
}

template <int DT>
__device__ __forceinline__ void stf(void *p, int64_t i, float v) {
    if constexpr (DT == SP_CUDA_F32) static_cast<float *>(p)[i] = v;
    else if constexpr (DT == SP_CUDA_F16) static_cast<__half *>(p)[i] = __float2half_rn(v);
    else static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn(v);
}

/* E8M0: 2^(s - 127); 255 is +inf as mlx has it. */
__device__ __forceinline__ float e8m0(uint32_t s) {
    return s == 255 ? __int_as_float(0x7f800000) : s == 0 ? __int_as_float(0x00400000) : __int_as_float((int)(s << 23));
}

/* E4M3FN as sp_e4m3_to_float decodes it (0x7f is 480). */
__device__ __forceinline__ float e4m3(uint32_t x) {
    int e = (x >> 3) & 0xf, m = x & 7;
    float v = e ? ldexpf(1.0f + (float)m / 8.0f, e - 7) : ldexpf((float)m / 8.0f, -6);
    return (x & 0x80) ? -v : v;
}

/* E2M1 code c (sign in bit 3) as a float, from its bits: no table to
 * index with a different value in every lane. */
__device__ __forceinline__ float e2m1(uint32_t c) {
    uint32_t mag = c & 7, e = mag >> 1, m = mag & 1;
    uint32_t bits = e ? ((e + 126) << 23) | (m << 22) : (m ? 0x3f000000u : 0u);
    return __uint_as_float(bits | ((c & 8) << 28));
}

/* Elements 8u .. 8u + 7 of row r of w (K a quantized kind, or a float
 * kind with 8u + 8 <= cols). */
template <int K, int BITS, int SDT>
__device__ __forceinline__ void decode8(const sp_cuda_weight &w, int64_t r, int64_t u, float *o) {
    if constexpr (K == K_F32 || K == K_F16 || K == K_BF16) {
        constexpr int DT = K == K_F32 ? SP_CUDA_F32 : K == K_F16 ? SP_CUDA_F16 : SP_CUDA_BF16;
        int64_t base = r * w.cols + u * 8;
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = ldf<DT>(w.codes, base + k);
    } else if constexpr (K == K_AFFINE) {
        const uint8_t *p = static_cast<const uint8_t *>(w.codes) + r * (w.cols * BITS / 8) + u * BITS;
        uint64_t v;
        if constexpr (BITS == 2) v = *reinterpret_cast<const uint16_t *>(p);
        else if constexpr (BITS == 4) v = *reinterpret_cast<const uint32_t *>(p);
        else if constexpr (BITS == 8) v = *reinterpret_cast<const uint64_t *>(p);
        else {
            v = 0;
#pragma unroll
            for (int b = 0; b < BITS; b++) v |= (uint64_t)p[b] << (8 * b);
        }
        int64_t g = r * (w.cols / w.group) + u * 8 / w.group;
        float s = ldf<SDT>(w.scales, g), b = ldf<SDT>(w.biases, g);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fadd_rn(__fmul_rn(s, (float)((v >> (k * BITS)) & ((1u << BITS) - 1))), b);
    } else if constexpr (K == K_MXFP4 || K == K_NVFP4) {
        const uint8_t *p = static_cast<const uint8_t *>(w.codes) + r * (w.cols / 2) + u * 4;
        uint32_t v = *reinterpret_cast<const uint32_t *>(p);
        uint32_t sb = static_cast<const uint8_t *>(w.scales)[r * (w.cols / w.group) + u * 8 / w.group];
        float s = K == K_MXFP4 ? e8m0(sb) : e4m3(sb);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fmul_rn(e2m1((v >> (4 * k)) & 0xf), s);
    } else if constexpr (K == K_Q2K || K == K_Q3K) {
        /* unit u is elements l .. l + 7 of run k of half h of block u / 32 (quant/qtype.c's layouts) */
        constexpr int BB = K == K_Q2K ? 84 : 110;
        const uint8_t *b = static_cast<const uint8_t *>(w.codes) + r * (w.cols / 256 * BB) + u / 32 * BB;
        int e = (int)(u % 32) * 8, h = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t *qs = b + (K == K_Q2K ? 16 : 32) + 32 * h + l;
        if constexpr (K == K_Q2K) {
            uint8_t sc = b[e / 16];
            float dl = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(b + 80)), (float)(sc & 15u));
            float ml = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(b + 82)), (float)(sc >> 4));
#pragma unroll
            for (int j = 0; j < 8; j++) o[j] = __fsub_rn(__fmul_rn(dl, (float)(qs[j] >> (2 * k) & 3u)), ml);
        } else {
            const uint8_t *s = b + 96;
            int j16 = e / 16, lo = j16 < 8 ? s[j16] & 15 : s[j16 - 8] >> 4, hi = s[8 + j16 % 4] >> (2 * (j16 / 4)) & 3;
            float d = __half2float(*reinterpret_cast<const __half *>(b + 108));
            float dl = __fmul_rn(d, (float)((lo | hi << 4) - 32));
#pragma unroll
            for (int j = 0; j < 8; j++) {
                int q = (int)(qs[j] >> (2 * k) & 3u) - (b[l + j] >> (4 * h + k) & 1u ? 0 : 4);
                o[j] = __fmul_rn(dl, (float)q);
            }
        }
    } else if constexpr (K == K_IQ4NL || K == K_IQ4XS) {
        /* unit u is elements e .. e + 7 of a run of 32 (quant/qtype.c's layouts) */
        constexpr bool XS = K == K_IQ4XS;
        constexpr int BB = XS ? 136 : 18, BE = XS ? 256 : 32;
        const uint8_t *b = static_cast<const uint8_t *>(w.codes) + r * (w.cols / BE * BB) + u / (BE / 8) * BB;
        int e = (int)(u % (BE / 8)) * 8, run = e / 32, j0 = e % 32;
        float dl = __half2float(*reinterpret_cast<const __half *>(b));
        if constexpr (XS) {
            int lo = b[4 + run / 2] >> (4 * (run % 2)) & 15, hi = (b[2] | b[3] << 8) >> (2 * run) & 3;
            dl = __fmul_rn(dl, (float)((lo | hi << 4) - 32));
        }
        const uint8_t *qs = b + (XS ? 8 + 16 * run : 2);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            int jj = j0 + j;
            uint32_t c = jj < 16 ? qs[jj] & 15u : qs[jj - 16] >> 4;
            o[j] = __fmul_rn(dl, (float)iq4_values[c]);
        }
    } else if constexpr (K == K_Q4K || K == K_Q5K) {
        /* unit u is elements l .. l + 7 of the 32 g of block u / 32 (quant/qtype.c's layouts) */
        constexpr bool FIVE = K == K_Q5K;
        constexpr int BB = FIVE ? 176 : 144;
        const uint8_t *b = static_cast<const uint8_t *>(w.codes) + r * (w.cols / 256 * BB) + u / 32 * BB;
        int e = (int)(u % 32) * 8, g = e / 32, l = e % 32;
        const uint8_t *sm = b + 4, *q = b + (FIVE ? 48 : 16) + 32 * (g / 2) + l, *qh = b + 16 + l;
        uint32_t sc, m;
        if (g < 4) {
            sc = sm[g] & 63u;
            m = sm[g + 4] & 63u;
        } else {
            sc = (sm[g + 4] & 15u) | (uint32_t)(sm[g - 4] >> 6) << 4;
            m = (uint32_t)(sm[g + 4] >> 4) | (uint32_t)(sm[g] >> 6) << 4;
        }
        float d1 = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(b)), (float)sc);
        float m1 = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(b + 2)), (float)m);
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t v = g % 2 ? q[j] >> 4 : q[j] & 15u;
            if constexpr (FIVE) v |= (uint32_t)(qh[j] >> g & 1u) << 4;
            o[j] = __fsub_rn(__fmul_rn(d1, (float)v), m1);
        }
    } else if constexpr (K == K_Q6K) {
        /* unit u is elements l .. l + 7 of run k of half h of block u / 32 (quant/qtype.c's layout) */
        const uint8_t *b = static_cast<const uint8_t *>(w.codes) + r * (w.cols / 256 * 210) + u / 32 * 210;
        int e = (int)(u % 32) * 8, h = e / 128, k = e % 128 / 32, l = e % 32;
        const uint8_t *ql = b + 64 * h + 32 * (k % 2) + l, *qh = b + 128 + 32 * h + l;
        float ds = __fmul_rn(__half2float(*reinterpret_cast<const __half *>(b + 208)),
                             (float)static_cast<int8_t>(b[192 + 8 * h + e % 128 / 16]));
#pragma unroll
        for (int j = 0; j < 8; j++) {
            uint32_t lo = k / 2 ? ql[j] >> 4 : ql[j] & 15u;
            o[j] = __fmul_rn(ds, (float)((int)(lo | ((uint32_t)(qh[j] >> (2 * k)) & 3u) << 4) - 32));
        }
    } else {
        uint2 v = *reinterpret_cast<const uint2 *>(static_cast<const uint8_t *>(w.codes) + r * w.cols + u * 8);
        float s = e8m0(static_cast<const uint8_t *>(w.scales)[r * (w.cols / w.group) + u * 8 / w.group]);
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[k] = __fmul_rn(e4m3((v.x >> (8 * k)) & 0xff), s);
            o[k + 4] = __fmul_rn(e4m3((v.y >> (8 * k)) & 0xff), s);
        }
    }
}

/* Element c of row r of a float kind (the columns past the last whole unit). */
template <int K>
__device__ __forceinline__ float float_elem(const sp_cuda_weight &w, int64_t r, int64_t c) {
    constexpr int DT = K == K_F32 ? SP_CUDA_F32 : K == K_F16 ? SP_CUDA_F16 : SP_CUDA_BF16;
    return ldf<DT>(w.codes, r * w.cols + c);
}

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) v = __fadd_rn(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* ---- products ---- */

/* y rows of w by a warp each, for the block's tokens [t0, t0 + TOKENS). */
template <int K, int BITS, int SDT>
__global__ void __launch_bounds__(ROW_WARPS * WARP)
    k_rows(sp_cuda_weight w, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n) {
    dep_start();
    int lane = threadIdx.x % WARP;
    int64_t r = (int64_t)blockIdx.x * ROW_WARPS + threadIdx.x / WARP, t0 = (int64_t)blockIdx.y * TOKENS;
    if (r >= w.rows) return;
    int nt = n - t0 < TOKENS ? (int)(n - t0) : TOKENS;
    float acc[TOKENS];
#pragma unroll
    for (int t = 0; t < TOKENS; t++) acc[t] = 0.0f;
    const float *xb = x + t0 * ldx;
    int64_t units = w.cols / 8;
    for (int64_t u = lane; u < units; u += WARP) {
        float wv[8];
        decode8<K, BITS, SDT>(w, r, u, wv);
#pragma unroll
        for (int t = 0; t < TOKENS; t++) {
            if (t >= nt) break;
            const float *xp = xb + t * ldx + u * 8;
            float s = 0.0f;
#pragma unroll
            for (int k = 0; k < 8; k++) s = fmaf(wv[k], xp[k], s);
            acc[t] = __fadd_rn(acc[t], s);
        }
    }
    if constexpr (K == K_F32 || K == K_F16 || K == K_BF16) {
        for (int64_t c = units * 8 + lane; c < w.cols; c += WARP) {
            float wv = float_elem<K>(w, r, c);
#pragma unroll
            for (int t = 0; t < TOKENS; t++)
                if (t < nt) acc[t] = fmaf(wv, xb[t * ldx + c], acc[t]);
        }
    }
    float b = w.bias ? ldf_rt(w.bias_dt, w.bias, r) : 0.0f;
#pragma unroll
    for (int t = 0; t < TOKENS; t++) {
        float s = warp_sum(acc[t]);
        if (lane == 0 && t < nt) y[(t0 + t) * ldy + r] = w.bias ? __fadd_rn(s, b) : s;
    }
}

/* A transposed float matrix ((cols, rows) in memory): an output per
 * thread, reading a stored row of outputs at a time. */
template <int DT>
__global__ void __launch_bounds__(COL_THREADS)
    k_cols(sp_cuda_weight w, const float *x, int64_t ldx, float *y, int64_t ldy, int64_t n) {
    dep_start();
    int64_t o = (int64_t)blockIdx.x * COL_THREADS + threadIdx.x, t0 = (int64_t)blockIdx.y * TOKENS;
    if (o >= w.rows) return;
    int nt = n - t0 < TOKENS ? (int)(n - t0) : TOKENS;
    float acc[TOKENS];
#pragma unroll
    for (int t = 0; t < TOKENS; t++) acc[t] = 0.0f;
    const float *xb = x + t0 * ldx;
    for (int64_t i = 0; i < w.cols; i++) {
        float wv = ldf<DT>(w.codes, i * w.rows + o);
#pragma unroll
        for (int t = 0; t < TOKENS; t++)
            if (t < nt) acc[t] = fmaf(xb[t * ldx + i], wv, acc[t]);
    }
    float b = w.bias ? ldf_rt(w.bias_dt, w.bias, o) : 0.0f;
#pragma unroll
    for (int t = 0; t < TOKENS; t++)
        if (t < nt) y[(t0 + t) * ldy + o] = w.bias ? __fadd_rn(acc[t], b) : acc[t];
}

/* Rows tokens[t] of w into x, a block a token. */
template <int K, int BITS, int SDT>
__global__ void k_embed(sp_cuda_weight w, const int32_t *tokens, float *x, int64_t ldx) {
    dep_start();
    int64_t r = tokens[blockIdx.x];
    float *xr = x + (int64_t)blockIdx.x * ldx;
    if constexpr (K == K_F32 || K == K_F16 || K == K_BF16) {
        if (w.transposed) {
            constexpr int DT = K == K_F32 ? SP_CUDA_F32 : K == K_F16 ? SP_CUDA_F16 : SP_CUDA_BF16;
            for (int64_t c = threadIdx.x; c < w.cols; c += blockDim.x) xr[c] = ldf<DT>(w.codes, c * w.rows + r);
            return;
        }
        for (int64_t c = w.cols / 8 * 8 + threadIdx.x; c < w.cols; c += blockDim.x) xr[c] = float_elem<K>(w, r, c);
    }
    for (int64_t u = threadIdx.x; u < w.cols / 8; u += blockDim.x) {
        float v[8];
        decode8<K, BITS, SDT>(w, r, u, v);
#pragma unroll
        for (int k = 0; k < 8; k++) xr[u * 8 + k] = v[k];
    }
}

/* Calls l.template go<K, BITS, SDT>() for w's format. */
template <class L>
int dispatch(const sp_cuda_weight &w, const L &l) {
    switch (w.fmt) {
    case SP_CUDA_FMT_FLOAT:
        if (w.elem == SP_CUDA_F32) return l.template go<K_F32, 32, 0>();
        if (w.elem == SP_CUDA_F16) return l.template go<K_F16, 16, 0>();
        return l.template go<K_BF16, 16, 0>();
    case SP_CUDA_FMT_MXFP4: return l.template go<K_MXFP4, 4, 0>();
    case SP_CUDA_FMT_NVFP4: return l.template go<K_NVFP4, 4, 0>();
    case SP_CUDA_FMT_MXFP8: return l.template go<K_MXFP8, 8, 0>();
    case SP_CUDA_FMT_Q2_K: return l.template go<K_Q2K, 2, 0>();
    case SP_CUDA_FMT_Q3_K: return l.template go<K_Q3K, 3, 0>();
    case SP_CUDA_FMT_Q4_K: return l.template go<K_Q4K, 4, 0>();
    case SP_CUDA_FMT_Q5_K: return l.template go<K_Q5K, 5, 0>();
    case SP_CUDA_FMT_Q6_K: return l.template go<K_Q6K, 6, 0>();
    case SP_CUDA_FMT_IQ4_NL: return l.template go<K_IQ4NL, 4, 0>();
    case SP_CUDA_FMT_IQ4_XS: return l.template go<K_IQ4XS, 4, 0>();
    case SP_CUDA_FMT_AFFINE: break;
    default: return (int)cudaErrorInvalidValue;
    }
#define SP_AFFINE_CASE(B)                                                             \
    case B:                                                                           \
        if (w.scale_dt == SP_CUDA_F32) return l.template go<K_AFFINE, B, SP_CUDA_F32>(); \
        if (w.scale_dt == SP_CUDA_F16) return l.template go<K_AFFINE, B, SP_CUDA_F16>(); \
        return l.template go<K_AFFINE, B, SP_CUDA_BF16>();
    switch (w.bits) {
        SP_AFFINE_CASE(2)
        SP_AFFINE_CASE(3)
        SP_AFFINE_CASE(4)
        SP_AFFINE_CASE(5)
        SP_AFFINE_CASE(6)
        SP_AFFINE_CASE(8)
    default: return (int)cudaErrorInvalidValue;
    }
#undef SP_AFFINE_CASE
}

struct rows_launch {
    const sp_cuda_weight *w;
    const float *x;
    int64_t ldx;
    float *y;
    int64_t ldy, n;
    cudaStream_t s;
    template <int K, int BITS, int SDT>
    int go() const {
        dim3 grid((unsigned)((w->rows + ROW_WARPS - 1) / ROW_WARPS), (unsigned)((n + TOKENS - 1) / TOKENS));
        launch(k_rows<K, BITS, SDT>, grid, ROW_WARPS * WARP, s, *w, x, ldx, y, ldy, n);
        return (int)cudaGetLastError();
    }
};

struct embed_launch {
    const sp_cuda_weight *w;
    const int32_t *tokens;
    int64_t n;
    float *x;
    int64_t ldx;
    cudaStream_t s;
    template <int K, int BITS, int SDT>
    int go() const {
        launch(k_embed<K, BITS, SDT>, (unsigned)n, 128, s, *w, tokens, x, ldx);
        return (int)cudaGetLastError();
    }
};

/* ---- products that read 16 bytes of codes at a time ----
 * For affine 4- and 8-bit, mxfp4, f16 and bf16 matrices whose rows are
 * whole 16-byte chunks (and whose groups are whole chunks): each lane of
 * a warp loads one chunk of each of VR rows at a time, decodes it unit by
 * unit and multiplies it with the tokens' activations, which VR rows then
 * share. Every row's sums run over the lane's chunks, units and elements
 * in that order for any token count: a token's result is the same in any
 * batch. */

constexpr int VR = 4;      // rows a warp computes together
constexpr int VWARPS = 4;  // warps per block

/* Elements of one 16-byte chunk of codes. */
template <int K, int BITS>
__host__ __device__ constexpr int vec_elems() {
    return K == K_F16 || K == K_BF16 ? 8 : 128 / BITS;
}

__device__ __forceinline__ uint32_t word_of(const uint4 &q, int i) {
    return i == 0 ? q.x : i == 1 ? q.y : i == 2 ? q.z : q.w;
}

/* Twice the E2M1 values of the 8 codes of v, exactly (whole numbers from
 * -12 to 12), in three byte permutes and two float ops for four: table
 * bytes 12 + 2|value| and 12 - 2|value| chosen by each code's magnitude,
 * one of the two by its sign, then each byte placed under 2^23's exponent
 * and the bias taken off. */
__device__ __forceinline__ void mx2_unit(uint32_t v, float *o) {
    constexpr uint32_t POS0 = 0x0f0e0d0cu, POS1 = 0x18141210u;  // 12 + {0, 1, 2, 3}, 12 + {4, 6, 8, 12}
    constexpr uint32_t NEG0 = 0x090a0b0cu, NEG1 = 0x00040608u;  // 12 - the same
#pragma unroll
    for (int h = 0; h < 2; h++) {
        uint32_t c = v >> (16 * h), mag = c & 0x7777u, side = 0x3210u | ((c & 0x8888u) >> 1);
        uint32_t bytes = __byte_perm(__byte_perm(POS0, POS1, mag), __byte_perm(NEG0, NEG1, mag), side);
#pragma unroll
        for (int k = 0; k < 4; k++)
            o[4 * h + k] = __fsub_rn(__uint_as_float(__byte_perm(bytes, 0x4b000000u, 0x7650u | (uint32_t)k)), 8388620.0f);
    }
}

/* Unit u (elements 8u .. 8u + 7) of a chunk q, its group's scale s and bias b. */
template <int K, int BITS>
__device__ __forceinline__ void vdecode(const uint4 &q, int u, float s, float b, float *o) {
    if constexpr (K == K_AFFINE && BITS == 4) {
        uint32_t v = word_of(q, u);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fadd_rn(__fmul_rn(s, (float)((v >> (4 * k)) & 15u)), b);
    } else if constexpr (K == K_AFFINE) {
        uint32_t lo = word_of(q, 2 * u), hi = word_of(q, 2 * u + 1);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fadd_rn(__fmul_rn(s, (float)(((k < 4 ? lo : hi) >> (8 * (k % 4))) & 255u)), b);
    } else if constexpr (K == K_MXFP4) {
        uint32_t v = word_of(q, u);
#pragma unroll
        for (int k = 0; k < 8; k++) o[k] = __fmul_rn(e2m1((v >> (4 * k)) & 0xfu), s);
    } else if constexpr (K == K_BF16) {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = word_of(q, i);
            o[2 * i] = __uint_as_float(v << 16);
            o[2 * i + 1] = __uint_as_float(v & 0xffff0000u);
        }
    } else {
#pragma unroll
        for (int i = 0; i < 4; i++) {
            uint32_t v = word_of(q, i);
            o[2 * i] = __half2float(__ushort_as_half((unsigned short)(v & 0xffffu)));
            o[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(v >> 16)));
        }
    }
}

/* Activations as the vector products read them: float rows (ld floats
 * apart; vec: 16-byte aligned with ld a multiple of 4) ... */
struct facts {
    const float *x;
    int64_t ld;
    bool vec;
    __device__ facts rows(int64_t t) const { return {x + t * ld, ld, vec}; }
};

/* ... or rows rounded to int8 (the 4-bit products' fast path): QB values
 * a block, each block's {d, the sum of its values} beside. */
constexpr int QB = SP_CUDA_QBLOCK;
struct qacts {
    const int8_t *q;  // rows ldq bytes apart
    const float2 *d;  // rows ldd blocks apart
    int64_t ldq, ldd;
    __device__ qacts rows(int64_t t) const { return {q + t * ldq, d + t * ldd, ldq, ldd}; }
};

/* Twice the E2M1 values of the 4 codes in c's low 16 bits as int8 bytes,
 * in code order: table bytes of the magnitudes and of their negatives,
 * one of the two chosen by each code's sign. */
__device__ __forceinline__ int32_t mx2_bytes(uint32_t c) {
    constexpr uint32_t POS0 = 0x03020100u, POS1 = 0x0c080604u;  // 0, 1, 2, 3 | 4, 6, 8, 12
    constexpr uint32_t NEG0 = 0xfdfeff00u, NEG1 = 0xf4f8fafcu;  // their negatives
    uint32_t mag = c & 0x7777u, side = 0x3210u | ((c & 0x8888u) >> 1);
    return (int32_t)__byte_perm(__byte_perm(POS0, POS1, mag), __byte_perm(NEG0, NEG1, mag), side);
}

/* A byte permute in its default mode: a selector nibble's low 3 bits
 * pick a byte of {hi, lo}, and its top bit set gives that byte's sign
 * (0x00 or 0xff) instead of the byte. */
__device__ __forceinline__ uint32_t prmt(uint32_t lo, uint32_t hi, uint32_t sel) {
    uint32_t d;
    asm("prmt.b32 %0, %1, %2, %3;" : "=r"(d) : "r"(lo), "r"(hi), "r"(sel));
    return d;
}

/* mxfp4's 32 codes of a chunk as twice their values, apart by sign, as
 * int8 in element order: p the positive codes' (0 where negative), n the
 * negative codes' magnitudes (0 where positive); the chunk's dot product
 * is p's less n's. A permute whose selector nibble is the code itself
 * copies its magnitude's byte where the sign bit is clear and gives that
 * byte's sign (0) where it is set; with the sign bits flipped, the
 * reverse. 7 integer ops for 8 codes, where mx2_bytes's one signed table
 * takes 13, for two more dp4a: a one-token mxfp4 product is bound by
 * integer issue, and this takes a large one from 59% to 68% of an H200's
 * copy bandwidth. */
__device__ __forceinline__ void mx2_split(const uint4 &q, int32_t (&p)[8], int32_t (&n)[8]) {
    constexpr uint32_t M0 = 0x03020100u, M1 = 0x0c080604u;  // 0, 1, 2, 3 | 4, 6, 8, 12
#pragma unroll
    for (int u = 0; u < 4; u++) {
        uint32_t v = word_of(q, u), f = v ^ 0x88888888u;
        p[2 * u] = (int32_t)prmt(M0, M1, v);
        p[2 * u + 1] = (int32_t)prmt(M0, M1, v >> 16);
        n[2 * u] = (int32_t)prmt(M0, M1, f);
        n[2 * u + 1] = (int32_t)prmt(M0, M1, f >> 16);
    }
}

/* The 32 codes of a chunk as 8 words of 4 int8 in element order: mxfp4
 * twice its values, affine 4-bit its codes (0 .. 15). */
template <int K>
__device__ __forceinline__ void qdecode(const uint4 &q, int32_t (&o)[8]) {
#pragma unroll
    for (int u = 0; u < 4; u++) {
        uint32_t v = word_of(q, u);
        if constexpr (K == K_MXFP4) {
            o[2 * u] = mx2_bytes(v);
            o[2 * u + 1] = mx2_bytes(v >> 16);
        } else {
            uint32_t lo = v & 0x0f0f0f0fu, hi = (v >> 4) & 0x0f0f0f0fu;  // elements 0, 2, 4, 6 and 1, 3, 5, 7
            o[2 * u] = (int32_t)__byte_perm(lo, hi, 0x5140u);
            o[2 * u + 1] = (int32_t)__byte_perm(lo, hi, 0x7362u);
        }
    }
}

/* Where one row's codes and group parameters start. */
struct vrow {
    const uint4 *q;
    const char *s, *b;
};

template <int K, int SDT>
__device__ __forceinline__ vrow vrow_of(const void *codes, const void *scales, const void *biases, int64_t r,
                                        int64_t cols, int group, int64_t row_bytes) {
    vrow v;
    v.q = reinterpret_cast<const uint4 *>(static_cast<const char *>(codes) + r * row_bytes);
    v.s = v.b = nullptr;
    if constexpr (K == K_AFFINE) {
        constexpr int64_t ss = SDT == SP_CUDA_F32 ? 4 : 2;
        v.s = static_cast<const char *>(scales) + r * (cols / group) * ss;
        v.b = static_cast<const char *>(biases) + r * (cols / group) * ss;
    } else if constexpr (K == K_MXFP4) {
        v.s = static_cast<const char *>(scales) + r * (cols / group);
    }
    return v;
}

/* Chunks a group of w's rows (1 for floats, which have no groups). */
template <int K, int BITS>
__device__ __forceinline__ uint32_t chunks_per_group(const sp_cuda_weight &w) {
    return K == K_AFFINE || K == K_MXFP4 ? (uint32_t)(w.group / vec_elems<K, BITS>()) : 1u;
}

/* One chunk of VR rows as loaded: the codes, and each row's group scale
 * and bias (affine; mxfp4 its power of two, no bias; floats neither). */
struct vchunk {
    uint4 q[VR];
    float s[VR], b[VR];
};

/* One row's scale and bias of group g as the float products use them:
 * affine its group's, mxfp4 its power of two and no bias, floats none. */
template <int K, int SDT>
__device__ __forceinline__ void group_params(const vrow &rw, uint32_t g, float &s, float &b) {
    s = b = 0.0f;
    if constexpr (K == K_AFFINE) {
        s = ldf<SDT>(rw.s, g);
        b = ldf<SDT>(rw.b, g);
    } else if constexpr (K == K_MXFP4) {
        s = e8m0(static_cast<uint8_t>(rw.s[g]));
    }
}

/* ... and the scale as the int8 products use it: mxfp4's halved (their
 * codes are twice their values). */
template <int K>
__device__ __forceinline__ float int8_scale(float s) {
    return K == K_MXFP4 ? __fmul_rn(0.5f, s) : s;
}

template <int K, int SDT>
__device__ __forceinline__ void vload(const vrow (&rw)[VR], uint32_t c, uint32_t cpg, vchunk &o) {
#pragma unroll
    for (int r = 0; r < VR; r++) o.q[r] = __ldg(rw[r].q + c);
#pragma unroll
    for (int r = 0; r < VR; r++) group_params<K, SDT>(rw[r], c / cpg, o.s[r], o.b[r]);
}

/* A lane's first PRE chunks (first, first + step, ...), loaded before the
 * kernel waits for the one before it: weights depend on no earlier
 * kernel, so a short row's product has its codes at hand when its
 * activations come (one chunk a lane is the whole row of the attention
 * products split over a block, and of a 1024-column down). */
constexpr int PRE = 1;
struct vpre {
    vchunk c[PRE];
};

template <int K, int SDT>
__device__ __forceinline__ void vpreload(const vrow (&rw)[VR], uint32_t chunks, uint32_t cpg, uint32_t first,
                                         uint32_t step, vpre &p) {
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (first + k * step < chunks) vload<K, SDT>(rw, first + k * step, cpg, p.c[k]);
}

/* Runs body(chunk, c) over a lane's chunks in order: the preloaded ones,
 * then the rest loaded as they come. */
template <int K, int SDT, class F>
__device__ __forceinline__ void vchunks(const vrow (&rw)[VR], uint32_t chunks, uint32_t cpg, uint32_t first,
                                        uint32_t step, const vpre &p, F &&body) {
#pragma unroll
    for (int k = 0; k < PRE; k++)
        if (first + k * step < chunks) body(p.c[k], first + k * step);
#pragma unroll 2
    for (uint32_t c = first + PRE * step; c < chunks; c += step) {
        vchunk ch;
        vload<K, SDT>(rw, c, cpg, ch);
        body(ch, c);
    }
}

/* acc[r][t] += row r . token t's activations over `chunks` chunks, the
 * lane's share (chunks first, first + step, ...: the lane's own, and with
 * several warps on the rows, its warp's), summed over the warp; cpg:
 * chunks per group; p: the lane's preloaded chunks (vpreload). */
template <int K, int BITS, int SDT, int NT>
__device__ __forceinline__ void vdot(const vrow (&rw)[VR], uint32_t chunks, uint32_t cpg, const facts &a, int nt,
                                     uint32_t first, uint32_t step, const vpre &p, float (&acc)[VR][NT], float *) {
    constexpr int EC = vec_elems<K, BITS>(), UPC = EC / 8;
    const float *x = a.x;
    int64_t ldx = a.ld;
    bool xvec = a.vec;
    vchunks<K, SDT>(rw, chunks, cpg, first, step, p, [&](const vchunk &ch, uint32_t c) {
        const uint4 *q = ch.q;
        const float *s = ch.s, *b = ch.b;
        /* mxfp4: twice each code's value, a whole number, by byte permutes
         * (mx2_unit); the chunk (in one group) summed apart, then scaled by
         * its power of two, halved */
        constexpr bool MX = K == K_MXFP4;
        float part[MX ? VR : 1][MX ? NT : 1];
        if constexpr (MX) {
#pragma unroll
            for (int r = 0; r < VR; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) part[r][t] = 0.0f;
        }
#pragma unroll
        for (int u = 0; u < UPC; u++) {
            float wv[VR][8];
#pragma unroll
            for (int r = 0; r < VR; r++) {
                if constexpr (MX) mx2_unit(word_of(q[r], u), wv[r]);
                else vdecode<K, BITS>(q[r], u, s[r], b[r], wv[r]);
            }
            const float *xp = x + (int64_t)c * EC + u * 8;
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                float xv[8];
                if (xvec) {
                    float4 a = __ldg(reinterpret_cast<const float4 *>(xp + t * ldx));
                    float4 d = __ldg(reinterpret_cast<const float4 *>(xp + t * ldx + 4));
                    xv[0] = a.x, xv[1] = a.y, xv[2] = a.z, xv[3] = a.w;
                    xv[4] = d.x, xv[5] = d.y, xv[6] = d.z, xv[7] = d.w;
                } else {
#pragma unroll
                    for (int k = 0; k < 8; k++) xv[k] = xp[t * ldx + k];
                }
#pragma unroll
                for (int r = 0; r < VR; r++)
#pragma unroll
                    for (int k = 0; k < 8; k++) {
                        if constexpr (MX) part[r][t] = fmaf(wv[r][k], xv[k], part[r][t]);
                        else acc[r][t] = fmaf(wv[r][k], xv[k], acc[r][t]);
                    }
            }
        }
        if constexpr (MX) {
#pragma unroll
            for (int r = 0; r < VR; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) acc[r][t] = fmaf(part[r][t], __fmul_rn(0.5f, s[r]), acc[r][t]);
        }
    });
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = warp_sum(acc[r][t]);
}

/* One row's scale and bias of group g with int8 activations. */
template <int K, int SDT>
__device__ __forceinline__ void group_scale(const vrow &rw, uint32_t g, float &s, float &b) {
    group_params<K, SDT>(rw, g, s, b);
    s = int8_scale<K>(s);
}

/* Floats of a warp's buffer for warp_fold of NT tokens: a row of VR NT
 * (odd: a lane's row on its own banks) a lane, then the VR NT sums. */
template <int NT>
__host__ __device__ constexpr int fold_floats() {
    return WARP * (VR * NT + 1) + VR * NT;
}

/* The lanes' sums acc added in lane order, lanes 0 .. n (those with
 * chunks; the rest hold zeros and are left out), into every lane's acc as
 * warp_sum leaves them: the order the tensor-core products keep too
 * (mma_tile), where a butterfly's would cost them a stack of partial sums.
 * Lane r NT + t adds row r's sums for token t; buf: the warp's
 * fold_floats<NT>(), in shared memory. */
template <int NT>
__device__ __forceinline__ void warp_fold(float (&acc)[VR][NT], int n, float *buf) {
    constexpr int N = VR * NT, LD = N + 1;
    int lane = threadIdx.x % WARP;
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) buf[lane * LD + r * NT + t] = acc[r][t];
    __syncwarp();
    if (lane < N) {
        float s = buf[lane];
#pragma unroll 8
        for (int i = 1; i < n; i++) s = __fadd_rn(s, buf[i * LD + lane]);
        buf[WARP * LD + lane] = s;
    }
    __syncwarp();
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = buf[WARP * LD + r * NT + t];
    __syncwarp();
}

/* The same with int8 activations (mxfp4 and affine 4-bit; a chunk is a
 * block of QB): each chunk's codes as int8 (qdecode; one token's
 * mxfp4 mx2_split, its positive and negative codes apart), four products
 * a dp4a, the chunk's integer sum scaled once: mxfp4 by half its scale
 * times d, affine by scale x d plus bias x the float sum of the block
 * (so that only s x q meets the rounding of x, as on the CPU); the
 * lanes' sums added in lane order (warp_fold, in the warp's buffer of
 * the kernel's fold: fold_buf_floats). Integer sums are exact, so a
 * token's result is the same in any batch. */
template <int K, int BITS, int SDT, int NT>
__device__ __forceinline__ void vdot(const vrow (&rw)[VR], uint32_t chunks, uint32_t cpg, const qacts &a, int nt,
                                     uint32_t first, uint32_t step, const vpre &p, float (&acc)[VR][NT], float *fold) {
    static_assert(K == K_MXFP4 || (K == K_AFFINE && BITS == 4), "int8 activations: 4-bit codes only");
    vchunks<K, SDT>(rw, chunks, cpg, first, step, p, [&](const vchunk &ch, uint32_t c) {
        float s[VR];
        const float *b = ch.b;
#pragma unroll
        for (int r = 0; r < VR; r++) s[r] = int8_scale<K>(ch.s[r]);
        auto dot = [](const int32_t(&w)[8], const uint4 &x0, const uint4 &x1) {
            int32_t sum = __dp4a(w[0], (int32_t)x0.x, 0);
            sum = __dp4a(w[1], (int32_t)x0.y, sum);
            sum = __dp4a(w[2], (int32_t)x0.z, sum);
            sum = __dp4a(w[3], (int32_t)x0.w, sum);
            sum = __dp4a(w[4], (int32_t)x1.x, sum);
            sum = __dp4a(w[5], (int32_t)x1.y, sum);
            sum = __dp4a(w[6], (int32_t)x1.z, sum);
            return __dp4a(w[7], (int32_t)x1.w, sum);
        };
        auto add = [&](int r, int t, int32_t sum, float2 d) {
            float v = K == K_AFFINE ? fmaf(b[r], d.y, acc[r][t]) : acc[r][t];
            acc[r][t] = fmaf((float)sum, __fmul_rn(s[r], d.x), v);
        };
        if constexpr (K == K_MXFP4 && NT == 1) {
            /* one token: a row's codes split by sign (mx2_split) and used at once, a row at a
             * time, so that the registers stay those of the batches' decoding */
            const uint4 *xp = reinterpret_cast<const uint4 *>(a.q) + 2 * c;
            uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
            float2 d = __ldg(a.d + c);
#pragma unroll
            for (int r = 0; r < VR; r++) {
                int32_t wp[8], wn[8];
                mx2_split(ch.q[r], wp, wn);
                add(r, 0, dot(wp, x0, x1) - dot(wn, x0, x1), d);
            }
        } else {
            int32_t wv[VR][8];
#pragma unroll
            for (int r = 0; r < VR; r++) qdecode<K>(ch.q[r], wv[r]);
#pragma unroll
            for (int t = 0; t < NT; t++) {
                if (t >= nt) break;
                const uint4 *xp = reinterpret_cast<const uint4 *>(a.q + t * a.ldq) + 2 * c;
                uint4 x0 = __ldg(xp), x1 = __ldg(xp + 1);
                float2 d = __ldg(a.d + t * a.ldd + c);
#pragma unroll
                for (int r = 0; r < VR; r++) add(r, t, dot(wv[r], x0, x1), d);
            }
        }
    });
    uint32_t base = first - threadIdx.x % WARP;  // the warp's first lane's chunk
    warp_fold(acc, chunks <= base ? 0 : chunks - base < WARP ? (int)(chunks - base) : WARP,
              fold + threadIdx.x / WARP * fold_floats<NT>());
}

/* A kernel's warp_fold buffers (VWARPS of them; none where A is float). */
template <class A, int NT>
__host__ __device__ constexpr int fold_buf_floats() {
    return std::is_same<A, qacts>::value ? VWARPS * fold_floats<NT>() : 1;
}

/* Rows [r0, r0 + VR) of w by a warp, for tokens [t0, t0 + NT); SPLIT:
 * by VWARPS warps (wid: this one's place among them; part: their sums in
 * shared memory), each a share of the chunks, their sums added in warp
 * order (for matrices of few rows, so that their products keep enough
 * loads in flight; chosen by the shape alone, so a token's result still
 * does not depend on the batch). */
template <int K, int BITS, int SDT, int NT, class A, bool SPLIT>
__device__ __forceinline__ void vrows(const sp_cuda_weight &w, const A &a, float *y, int64_t ldy, int64_t n, int64_t r0,
                                      int64_t t0, int wid, float (*part)[VR][NT], float *fold) {
    constexpr int EC = vec_elems<K, BITS>();
    int lane = threadIdx.x % WARP;
    int64_t row_bytes = w.cols / EC * 16;
    vrow rw[VR];
#pragma unroll
    for (int r = 0; r < VR; r++)
        rw[r] = vrow_of<K, SDT>(w.codes, w.scales, w.biases, r0 + r < w.rows ? r0 + r : w.rows - 1, w.cols, w.group,
                                row_bytes);
    uint32_t chunks = (uint32_t)(w.cols / EC), cpg = chunks_per_group<K, BITS>(w);
    uint32_t first = SPLIT ? lane + WARP * wid : lane, step = SPLIT ? WARP * VWARPS : WARP;
    /* while the kernel before still runs: the lane's first chunks of its rows loaded, the next on
     * their way to L2 */
    vpre pre;
    if (r0 < w.rows) {
        vpreload<K, SDT>(rw, chunks, cpg, first, step, pre);
#pragma unroll
        for (int r = 0; r < VR; r++)
            for (uint32_t c = first + PRE * step, k = 0; c < chunks && k < PREFETCH_CHUNKS; c += step, k++) {
                prefetch_l2(rw[r].q + c);
                if constexpr (K == K_AFFINE || K == K_MXFP4) {  // the chunk's group: its scale (and bias)
                    constexpr int SB = K == K_MXFP4 ? 1 : SDT == SP_CUDA_F32 ? 4 : 2;
                    uint32_t g = c / cpg;
                    prefetch_l2(rw[r].s + g * SB);
                    if constexpr (K == K_AFFINE) prefetch_l2(rw[r].b + g * SB);
                }
            }
    }
    dep_start();
    if (r0 >= w.rows) return;
    int nt = n - t0 < NT ? (int)(n - t0) : NT;
    float acc[VR][NT];
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    if constexpr (SPLIT) {
        vdot<K, BITS, SDT, NT>(rw, chunks, cpg, a.rows(t0), nt, first, step, pre, acc, fold);
        if (lane == 0)
#pragma unroll
            for (int r = 0; r < VR; r++)
#pragma unroll
                for (int t = 0; t < NT; t++) part[wid][r][t] = acc[r][t];
        __syncthreads();
        if (wid != 0) return;
        uint32_t vn = (chunks + WARP - 1) / WARP;  // the warps with chunks, their sums added in warp order
#pragma unroll
        for (int r = 0; r < VR; r++)
#pragma unroll
            for (int t = 0; t < NT; t++) {
                float v = part[0][r][t];
#pragma unroll
                for (int k = 1; k < VWARPS; k++)
                    if (k < vn) v = __fadd_rn(v, part[k][r][t]);
                acc[r][t] = v;
            }
    } else {
        vdot<K, BITS, SDT, NT>(rw, chunks, cpg, a.rows(t0), nt, first, step, pre, acc, fold);
    }
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == r * NT + t && r0 + r < w.rows && t < nt) {
                float s = acc[r][t];
                y[(t0 + t) * ldy + r0 + r] = w.bias ? __fadd_rn(s, ldf_rt(w.bias_dt, w.bias, r0 + r)) : s;
            }
}

/* SPLIT: part holds the warps' sums (every warp of the block has the
 * same rows, so the block leaves vrows together). */
template <int K, int BITS, int SDT, int NT, class A, bool SPLIT>
__global__ void __launch_bounds__(VWARPS * WARP)
    k_vrows(sp_cuda_weight w, A a, float *y, int64_t ldy, int64_t n) {
    __shared__ float part[SPLIT ? VWARPS : 1][VR][NT];
    __shared__ float fold[fold_buf_floats<A, NT>()];
    int wid = threadIdx.x / WARP;
    int64_t r0 = (SPLIT ? (int64_t)blockIdx.x : (int64_t)blockIdx.x * VWARPS + wid) * VR;
    vrows<K, BITS, SDT, NT, A, SPLIT>(w, a, y, ldy, n, r0, (int64_t)blockIdx.y * NT, wid, part, fold);
}

/* An item's activations: its own float rows, or its rows of the int8 rows. */
__device__ __forceinline__ facts item_acts(const facts &a, const sp_cuda_mlp_item &it) { return {it.x, it.ldx, a.vec}; }
__device__ __forceinline__ qacts item_acts(const qacts &a, const sp_cuda_mlp_item &it) { return a.rows(it.xrow); }

/* The item whose blocks include block b: the last of items[0 .. n) with
 * blk <= b (items' first blocks increase), found by the whole warp 32
 * items at a time, so that a block waits for one round of loads. */
__device__ __forceinline__ const sp_cuda_mlp_item &item_of(const sp_cuda_mlp_item *items, int n, int64_t b,
                                                            bool down) {
    int lane = threadIdx.x % WARP, best = 0;
    for (int i0 = 0; i0 < n; i0 += WARP) {
        int i = i0 + lane;
        bool le = i < n && (down ? items[i].blk_down : items[i].blk_gate_up) <= b;
        unsigned m = __ballot_sync(0xffffffffu, le);
        if (m) best = i0 + 31 - __clz((int)m);
        if (m != 0xffffffffu) break;
    }
    return items[best];
}

/* Output j of an item's activation from its gate and up sums gi and ui:
 * their biases added (rows 2 j and 2 j + 1 of a fused gate_up's), then as
 * k_glu. */
__device__ __forceinline__ float glu_out(const sp_cuda_weight &w, const sp_cuda_mlp_item &it, bool fused, int64_t j,
                                         float gi, float ui, float alpha, float limit, float u_offset) {
    if (fused) {
        if (it.bias[0]) {
            gi = __fadd_rn(gi, ldf_rt(w.bias_dt, it.bias[0], 2 * j));
            ui = __fadd_rn(ui, ldf_rt(w.bias_dt, it.bias[0], 2 * j + 1));
        }
    } else {
        if (it.bias[0]) gi = __fadd_rn(gi, ldf_rt(w.bias_dt, it.bias[0], j));
        if (it.bias[1]) ui = __fadd_rn(ui, ldf_rt(w.bias_dt, it.bias[1], j));
    }
    gi = gi > limit ? limit : gi;
    ui = ui > limit ? limit : ui < -limit ? -limit : ui;
    float sig = __fdiv_rn(gi, __fadd_rn(1.0f, expf(__fmul_rn(-gi, alpha))));
    return __fmul_rn(__fadd_rn(ui, u_offset), sig);
}

/* Gate and up of a batch of MLPs, the activation into h: a warp takes
 * outputs j0 and j0 + 1 of an item (rows 2 j .. 2 j + 1 of a fused
 * gate_up, or row j of gate and of up) for the tokens [t0, t0 + NT). w:
 * the gate's (or gate_up's) format and columns. */
template <int K, int BITS, int SDT, int NT, class A>
__global__ void __launch_bounds__(VWARPS * WARP)
    k_mlp_gate_up(sp_cuda_weight w, const sp_cuda_mlp_item *items, int n_items, bool fused, A a, float *h,
                  int64_t ldh, float alpha, float limit, float u_offset) {
    dep_start();
    constexpr int EC = vec_elems<K, BITS>(), J = VR / 2;
    const sp_cuda_mlp_item &it = item_of(items, n_items, blockIdx.x, false);
    int lane = threadIdx.x % WARP;
    int64_t ff = it.ff, b = (int64_t)blockIdx.x - it.blk_gate_up;
    int64_t jblocks = (ff + J * VWARPS - 1) / (J * VWARPS);
    int64_t j0 = ((b % jblocks) * VWARPS + threadIdx.x / WARP) * J, t0 = b / jblocks * NT;
    if (j0 >= ff || t0 >= it.n) return;  // past the item's blocks: a grid sized for the most items could be
    int nt = it.n - t0 < NT ? (int)(it.n - t0) : NT;
    int64_t row_bytes = w.cols / EC * 16;
    /* row 2 jj + 0 is gate's output j0 + jj, row 2 jj + 1 up's */
    vrow rw[VR];
#pragma unroll
    for (int jj = 0; jj < J; jj++) {
        int64_t j = j0 + jj < ff ? j0 + jj : ff - 1;
#pragma unroll
        for (int side = 0; side < 2; side++) {
            int m = fused ? 0 : side;
            int64_t r = fused ? 2 * j + side : j;
            rw[2 * jj + side] =
                vrow_of<K, SDT>(it.codes[m], it.scales[m], it.biases[m], r, w.cols, w.group, row_bytes);
        }
    }
    float acc[VR][NT];
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    uint32_t chunks = (uint32_t)(w.cols / EC), cpg = chunks_per_group<K, BITS>(w);
    vpre pre;  // loaded after the wait: the items were written by the kernel before
    vpreload<K, SDT>(rw, chunks, cpg, lane, WARP, pre);
    __shared__ float fold[fold_buf_floats<A, NT>()];
    vdot<K, BITS, SDT, NT>(rw, chunks, cpg, item_acts(a, it).rows(t0), nt, lane, WARP, pre, acc, fold);
#pragma unroll
    for (int jj = 0; jj < J; jj++)
#pragma unroll
        for (int t = 0; t < NT; t++) {
            int64_t j = j0 + jj;
            if (lane != jj * NT + t || j >= ff || t >= nt) continue;
            h[(it.row + t0 + t) * ldh + j] =
                glu_out(w, it, fused, j, acc[2 * jj][t], acc[2 * jj + 1][t], alpha, limit, u_offset);
        }
}

/* Down of a batch of MLPs: a warp takes rows [r0, r0 + VR) of an item's
 * down for the tokens [t0, t0 + NT), reading the item's rows of h. w: the
 * downs' format and rows (each item has its own columns, ff). The items
 * were written two kernels before at the latest (the kernel before is the
 * gate and up, or the rounding of its results, which began only once the
 * items were written), so the lane's first chunks are loaded before the
 * wait. */
template <int K, int BITS, int SDT, int NT, class A>
__global__ void __launch_bounds__(VWARPS * WARP)
    k_mlp_down(sp_cuda_weight w, const sp_cuda_mlp_item *items, int n_items, A h, float *out, int64_t ldo) {
    constexpr int EC = vec_elems<K, BITS>();
    const sp_cuda_mlp_item &it = item_of(items, n_items, blockIdx.x, true);
    int lane = threadIdx.x % WARP;
    int64_t b = (int64_t)blockIdx.x - it.blk_down, rblocks = (w.rows + VR * VWARPS - 1) / (VR * VWARPS);
    int64_t r0 = ((b % rblocks) * VWARPS + threadIdx.x / WARP) * VR, t0 = b / rblocks * NT;
    bool in = r0 < w.rows && t0 < it.n;
    int64_t cols = it.ff, row_bytes = cols / EC * 16;
    uint32_t chunks = (uint32_t)(cols / EC), cpg = chunks_per_group<K, BITS>(w);
    vrow rw[VR];
#pragma unroll
    for (int r = 0; r < VR; r++)
        rw[r] = vrow_of<K, SDT>(it.codes[2], it.scales[2], it.biases[2], r0 + r < w.rows ? r0 + r : w.rows - 1, cols,
                                w.group, row_bytes);
    vpre pre;
    if (in) vpreload<K, SDT>(rw, chunks, cpg, lane, WARP, pre);
    dep_start();
    if (!in) return;
    int nt = it.n - t0 < NT ? (int)(it.n - t0) : NT;
    float acc[VR][NT];
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++) acc[r][t] = 0.0f;
    __shared__ float fold[fold_buf_floats<A, NT>()];
    vdot<K, BITS, SDT, NT>(rw, chunks, cpg, h.rows(it.row + t0), nt, lane, WARP, pre, acc, fold);
#pragma unroll
    for (int r = 0; r < VR; r++)
#pragma unroll
        for (int t = 0; t < NT; t++)
            if (lane == r * NT + t && r0 + r < w.rows && t < nt) {
                float s = acc[r][t];
                out[(it.row + t0 + t) * ldo + r0 + r] =
                    it.bias[2] ? __fadd_rn(s, ldf_rt(w.bias_dt, it.bias[2], r0 + r)) : s;
            }
}

/* ---- tensor-core products: int8 activations, 4-bit codes ----
 *
 * Batches of MMA_TOKENS tokens a block: mma.sync m16n8k32 (s8 x s8 into
 * s32), a chunk (QB elements) a k step, a block 64 rows (16 a warp, the A
 * tile) by 16 tokens (two n8 tiles), which its warps share through shared
 * memory. The integer sums are exact, so only their scaling and adding
 * could differ from vdot's, and they run as vdot runs them: lane class
 * l's chunks (l, l + 32, ...; where the vector kernel splits the chunks
 * over the block's warps, class 32 w + l of warp w, step 128) in one
 * chain, the classes added in lane order (warp_fold), then the warps'
 * sums in warp order. A token's result is the vector kernels' to the bit,
 * in any batch. */
constexpr int MMA_TOKENS = SP_CUDA_MMA_TOKENS;
constexpr int MMA_WARPS = 4;  // warps of a block, 16 rows of its tile each

bool tensor_cores = false;  // the device runs mma.sync on int8 (compute capability 8.0 on)

__device__ __forceinline__ void mma_s8(int32_t (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};"
        : "=r"(c[0]), "=r"(c[1]), "=r"(c[2]), "=r"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1), "r"(0));
#else
    __trap();
#endif
}

/* The 4 codes in half h of word v as int8 bytes in element order: mxfp4
 * twice their values (mx2_bytes), affine 4-bit the codes. */
template <int K>
__device__ __forceinline__ uint32_t qbytes4(uint32_t v, int h) {
    if constexpr (K == K_MXFP4) return (uint32_t)mx2_bytes(v >> (16 * h));
    else return __byte_perm(v & 0x0f0f0f0fu, (v >> 4) & 0x0f0f0f0fu, h ? 0x7362u : 0x5140u);
}

/* A block's tile goes through shared memory in stages, MMA_STAGES deep
 * (cp.async; the scales through registers, loaded a stage ahead). A stage
 * holds MMA_SLOTS chunks of the tile's 64 rows and of its tokens: the
 * next positions of the order in which the sums are added (mma_tile). */
constexpr int MMA_ROWS = 16 * MMA_WARPS;  // rows of a block's tile
constexpr int MMA_SLOTS = 8;              // chunks of a row (or token) in a stage
constexpr int MMA_STAGES = 2;  // 38.4 KB a block at most: 5 blocks an SM (with 3 stages, 3)
/* Bytes of a row's, a token's codes in a stage: padded by 16 so that the
 * 8 rows (tokens) a load instruction reads start 4 banks apart. */
constexpr int MMA_W_LD = MMA_SLOTS * 16 + 16, MMA_X_LD = MMA_SLOTS * 32 + 16;
constexpr int MMA_S_LD = MMA_SLOTS + 1;  // scale entries of a row (odd: rows on different banks)

template <int K>
struct mma_sizes {
    static constexpr bool AFF = K == K_AFFINE;
    static constexpr int W = MMA_ROWS * MMA_W_LD, X = MMA_TOKENS * MMA_X_LD, D = MMA_TOKENS * MMA_SLOTS * 8,
                         S = MMA_ROWS * MMA_S_LD * (AFF ? 8 : 4);
    static constexpr int STAGE = W + X + D + S, ALL = MMA_STAGES * STAGE;
};

__device__ __forceinline__ void cp_async16(void *dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async8(void *dst, const void *src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;" ::"r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src)
                 : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
}

/* The block's tile: rows row_of(0 .. MMA_ROWS) of a matrix of `chunks`
 * chunks (cpg a group) times tokens 0 .. nt of a (the rest not read).
 * Warp w ends with res for its rows 16 w + lane / 4 (res[.][0, 1]) and
 * 16 w + lane / 4 + 8 (res[.][2, 3]), tokens n * 8 + 2 (lane % 4) + e % 2.
 * Each chunk's integer sum is exact and is scaled and added as vdot adds
 * it: class c's chunks (c, c + 32 W, ...: those of lane c % 32 of the
 * vector kernel's warp c / 32, where it splits the chunks over W warps)
 * in one chain, the classes of a vector warp added in order (warp_fold),
 * then (W == VWARPS) the vector warps' sums in order. A stage holds the
 * next MMA_SLOTS positions of that order, class by class (M positions a
 * class, its chunks in order; a class's last positions may hold none), so
 * a chain, the warp's sum so far and the sum of the warps before are all
 * a tile keeps. Every thread of the block calls it. */
template <int K, int SDT, int W, class R>
__device__ __forceinline__ void mma_tile(const R &row_of, uint32_t chunks, uint32_t cpg, const qacts &a, int nt,
                                         float (&res)[2][4]) {
    using Z = mma_sizes<K>;
    constexpr bool AFF = Z::AFF;
    constexpr uint32_t STEP = WARP * W;
    extern __shared__ __align__(16) char mma_smem[];
    int t = threadIdx.x, lane = t % WARP, wid = t / WARP, g = lane >> 2, tq = lane & 3;
    uint32_t nc = chunks < STEP ? chunks : STEP, M = (chunks + STEP - 1) / STEP, npos = nc * M;
    uint32_t stages = (npos + MMA_SLOTS - 1) / MMA_SLOTS;
    /* position p's class p / M as __umulhi(p, minv) (exact while p M < 2^32), its chunk (chunks: none) */
    uint32_t minv = M == 1 ? 0u : 0xffffffffu / M + 1u;
    auto class_of = [&](uint32_t p) { return M == 1 ? p : __umulhi(p, minv); };
    auto chunk_at = [&](uint32_t p) {
        uint32_t c = class_of(p), k = c + STEP * (p - c * M);
        return p < npos && k < chunks ? k : chunks;
    };
    int gsh = __ffs((int)cpg) - 1;  // chunks a group: 1, 2 or 4 (groups of 32, 64, 128)
    bool gpow2 = (cpg & (cpg - 1)) == 0;
    /* loads: thread t the codes and scales of row t / 2's slots 4 (t % 2) .., and token t / 8's slot t % 8 */
    int lr = t >> 1, lk = t & 1, lu = t >> 3, ls = t & 7;
    vrow mine = row_of(lr);
    const int8_t *xrow = a.q + (lu < nt ? lu : 0) * a.ldq;  // token lu's int8 row and block sums
    const float2 *drow = a.d + (lu < nt ? lu : 0) * a.ldd;
    auto stage_at = [&](uint32_t s) { return mma_smem + (s % MMA_STAGES) * Z::STAGE; };
    auto issue = [&](bool on, uint32_t s) {
        if (on) {
            char *base = stage_at(s);
            uint32_t p0 = s * MMA_SLOTS;
#pragma unroll
            for (int j = 0; j < 4; j++) {
                uint32_t c = chunk_at(p0 + lk * 4 + j);
                if (c < chunks) cp_async16(base + lr * MMA_W_LD + (lk * 4 + j) * 16, mine.q + c);
            }
            uint32_t c = chunk_at(p0 + ls);
            if (c < chunks && lu < nt) {
                const int8_t *xq = xrow + 32 * c;
                char *xs = base + Z::W + lu * MMA_X_LD + ls * 32;
                cp_async16(xs, xq);
                cp_async16(xs + 16, xq + 16);
                cp_async8(base + Z::W + Z::X + (ls * MMA_TOKENS + lu) * 8, drow + c);
            }
        }
        cp_async_commit();
    };
    auto scales_load = [&](uint32_t s, float (&sv)[4][2]) {
#pragma unroll
        for (int j = 0; j < 4; j++) {
            uint32_t c = chunk_at(s * MMA_SLOTS + lk * 4 + j);
            sv[j][0] = sv[j][1] = 0.0f;
            if (c < chunks) group_scale<K, SDT>(mine, gpow2 ? c >> gsh : c / cpg, sv[j][0], sv[j][1]);
        }
    };
    auto scales_store = [&](uint32_t s, const float (&sv)[4][2]) {
        char *sb = stage_at(s) + Z::W + Z::X + Z::D;
#pragma unroll
        for (int j = 0; j < 4; j++) {
            int e = lr * MMA_S_LD + lk * 4 + j;
            if constexpr (AFF) reinterpret_cast<float2 *>(sb)[e] = make_float2(sv[j][0], sv[j][1]);
            else reinterpret_cast<float *>(sb)[e] = sv[j][0];
        }
    };
    for (uint32_t s = 0; s < MMA_STAGES - 1; s++) {
        bool on = s < stages;
        if (on) {
            float sv[4][2];
            scales_load(s, sv);
            scales_store(s, sv);
        }
        issue(on, s);
    }
    int wa = tq >> 1, h = tq & 1;  // the words and half of a chunk this lane's A bytes are in
    int rlo = 16 * wid + g, rhi = rlo + 8;
    float ch[2][4], ws[2][4];  // the class's chain, the vector warp's classes so far
#pragma unroll
    for (int n = 0; n < 2; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) ch[n][e] = ws[n][e] = 0.0f;
    for (uint32_t s = 0; s < stages; s++) {
        float sv[4][2];
        uint32_t sa = s + MMA_STAGES - 1;
        bool ahead = sa < stages;
        if (ahead) scales_load(sa, sv);
        /* the stage's positions (lane j < MMA_SLOTS: slot j's): bit j of live where it holds a
         * chunk, of ends where it is its class's last, first where that class is its vector
         * warp's first, warp where its warp's last, warp0 where that warp is the first */
        uint32_t pj = s * MMA_SLOTS + lane, cj = class_of(pj), kj = chunk_at(pj);
        bool lv = lane < MMA_SLOTS && kj < chunks, end = lv && kj + STEP >= chunks;
        bool wend = end && (cj % WARP == WARP - 1 || cj + 1 == nc);
        constexpr unsigned ALL = 0xffffffffu;
        unsigned live = __ballot_sync(ALL, lv), ends = __ballot_sync(ALL, end),
                 first = __ballot_sync(ALL, end && cj % WARP == 0), warp = __ballot_sync(ALL, wend),
                 warp0 = __ballot_sync(ALL, wend && cj < WARP);
        cp_async_wait<MMA_STAGES - 2>();
        __syncthreads();
        issue(ahead, sa);
        const char *base = stage_at(s);
        const char *wsm = base, *xs = base + Z::W, *ds = base + Z::W + Z::X, *ss = ds + Z::D;
#pragma unroll
        for (int sl = 0; sl < MMA_SLOTS; sl++) {
            if (!(live >> sl & 1)) continue;
            const uint32_t *lo = reinterpret_cast<const uint32_t *>(wsm + rlo * MMA_W_LD + sl * 16);
            const uint32_t *hi = reinterpret_cast<const uint32_t *>(wsm + rhi * MMA_W_LD + sl * 16);
            uint32_t af[4] = {qbytes4<K>(lo[wa], h), qbytes4<K>(hi[wa], h), qbytes4<K>(lo[2 + wa], h),
                              qbytes4<K>(hi[2 + wa], h)};
            float s0, b0 = 0.0f, s1, b1 = 0.0f;
            if constexpr (AFF) {
                float2 p0 = reinterpret_cast<const float2 *>(ss)[rlo * MMA_S_LD + sl];
                float2 p1 = reinterpret_cast<const float2 *>(ss)[rhi * MMA_S_LD + sl];
                s0 = p0.x, b0 = p0.y, s1 = p1.x, b1 = p1.y;
            } else {
                s0 = reinterpret_cast<const float *>(ss)[rlo * MMA_S_LD + sl];
                s1 = reinterpret_cast<const float *>(ss)[rhi * MMA_S_LD + sl];
            }
#pragma unroll
            for (int n = 0; n < 2; n++) {
                const uint32_t *xp = reinterpret_cast<const uint32_t *>(xs + (n * 8 + g) * MMA_X_LD + sl * 32);
                int32_t cc[4];
                mma_s8(cc, af, xp[tq], xp[4 + tq]);
                float4 dd = reinterpret_cast<const float4 *>(ds)[(sl * MMA_TOKENS + n * 8 + 2 * tq) / 2];
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float dx = e & 1 ? dd.z : dd.x, dy = e & 1 ? dd.w : dd.y;
                    float sc = e < 2 ? s0 : s1, bc = e < 2 ? b0 : b1;
                    float v = AFF ? fmaf(bc, dy, ch[n][e]) : ch[n][e];
                    ch[n][e] = fmaf((float)cc[e], __fmul_rn(sc, dx), v);
                }
            }
            if (!(ends >> sl & 1)) continue;
            /* the class ends: into its warp's sum, and at the warp's last class that into res */
            bool f = first >> sl & 1, wl = W > 1 && (warp >> sl & 1), w0 = warp0 >> sl & 1;
#pragma unroll
            for (int n = 0; n < 2; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    ws[n][e] = f ? ch[n][e] : __fadd_rn(ws[n][e], ch[n][e]);
                    ch[n][e] = 0.0f;
                    if (wl) res[n][e] = w0 ? ws[n][e] : __fadd_rn(res[n][e], ws[n][e]);
                }
        }
        if (ahead) scales_store(sa, sv);
    }
    if constexpr (W == 1)
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) res[n][e] = ws[n][e];
    cp_async_wait<0>();
}

/* A tile's results (mma_tile's res) into rows ra and rb (this lane's, of
 * `rows`) of the tile's first nt tokens' rows of y (ldy apart), each plus
 * its bias where there is one. */
__device__ __forceinline__ void mma_store(const float (&res)[2][4], int64_t ra, int64_t rb, int64_t rows, int nt,
                                          float *y, int64_t ldy, int bias_dt, const void *bias) {
    int tq = threadIdx.x % WARP & 3;
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            int64_t r = e < 2 ? ra : rb;
            int t = k * 8 + 2 * tq + (e & 1);
            if (r >= rows || t >= nt) continue;
            float v = res[k][e];
            y[t * ldy + r] = bias ? __fadd_rn(v, ldf_rt(bias_dt, bias, r)) : v;
        }
}

/* k_vrows on tensor cores: a block rows [r0, r0 + MMA_ROWS) for
 * MMA_TOKENS tokens; the blocks of a row block's token blocks run one
 * after another (x), so its rows are read from L2 after the first.
 * Like k_mma_gate_up and k_mma_down, declared for one block an SM at
 * least, which leaves the registers to ptxas: 78-94 a thread, still 5
 * blocks an SM (without it, 64-80, measured 2% slower). */
template <int K, int SDT, int W>
__global__ void __launch_bounds__(MMA_WARPS * WARP, 1)
    k_mma_rows(sp_cuda_weight w, qacts a, float *y, int64_t ldy, int64_t n) {
    dep_start();
    int64_t r0 = (int64_t)blockIdx.y * MMA_ROWS, t0 = (int64_t)blockIdx.x * MMA_TOKENS;
    if (r0 >= w.rows) return;
    int nt = n - t0 < MMA_TOKENS ? (int)(n - t0) : MMA_TOKENS;
    int64_t row_bytes = w.cols / QB * 16;
    auto row_of = [&](int i) {
        int64_t r = r0 + i < w.rows ? r0 + i : w.rows - 1;
        return vrow_of<K, SDT>(w.codes, w.scales, w.biases, r, w.cols, w.group, row_bytes);
    };
    float res[2][4];
    mma_tile<K, SDT, W>(row_of, (uint32_t)(w.cols / QB), (uint32_t)(w.group / QB), a.rows(t0), nt, res);
    int64_t ra = r0 + 16 * (threadIdx.x / WARP) + (threadIdx.x % WARP >> 2);
    mma_store(res, ra, ra + 8, w.rows, nt, y + t0 * ldy, ldy, w.bias_dt, w.bias);
}

/* k_mlp_gate_up on tensor cores: a block takes outputs [j0, j0 +
 * MMA_ROWS / 2) of an item for MMA_TOKENS tokens, warp w outputs j0 + 8 w
 * .. (its tile rows 0-7 their gate rows, 8-15 their up rows); an item's
 * token blocks of the same outputs are neighbours, as in k_mma_rows. */
template <int K, int SDT>
__global__ void __launch_bounds__(MMA_WARPS * WARP, 1)
    k_mma_gate_up(sp_cuda_weight w, const sp_cuda_mlp_item *items, int n_items, bool fused, qacts a, float *h,
                  int64_t ldh, float alpha, float limit, float u_offset) {
    dep_start();
    const sp_cuda_mlp_item &it = item_of(items, n_items, blockIdx.x, false);
    int lane = threadIdx.x % WARP, tq = lane & 3;
    int64_t ff = it.ff, b = (int64_t)blockIdx.x - it.blk_gate_up;
    int64_t tblocks = (it.n + MMA_TOKENS - 1) / MMA_TOKENS + !it.n;  // an item of no tokens: one, which returns
    int64_t j0 = b / tblocks * (MMA_ROWS / 2), t0 = b % tblocks * MMA_TOKENS;
    if (j0 >= ff || t0 >= it.n) return;  // past the item's blocks: a grid sized for the most items could be
    int nt = it.n - t0 < MMA_TOKENS ? (int)(it.n - t0) : MMA_TOKENS;
    int64_t row_bytes = w.cols / QB * 16;
    auto row_of = [&](int i) {
        int64_t j = j0 + i / 16 * 8 + i % 8;
        j = j < ff ? j : ff - 1;
        bool up = i % 16 >= 8;
        if (fused)
            return vrow_of<K, SDT>(it.codes[0], it.scales[0], it.biases[0], 2 * j + up, w.cols, w.group, row_bytes);
        return vrow_of<K, SDT>(it.codes[up], it.scales[up], it.biases[up], j, w.cols, w.group, row_bytes);
    };
    float res[2][4];
    mma_tile<K, SDT, 1>(row_of, (uint32_t)(w.cols / QB), (uint32_t)(w.group / QB), item_acts(a, it).rows(t0), nt, res);
    int64_t j = j0 + threadIdx.x / WARP * 8 + (lane >> 2);
    if (j >= ff) return;
#pragma unroll
    for (int k = 0; k < 2; k++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            int t = k * 8 + 2 * tq + e;
            if (t >= nt) continue;
            h[(it.row + t0 + t) * ldh + j] = glu_out(w, it, fused, j, res[k][e], res[k][2 + e], alpha, limit, u_offset);
        }
}

/* k_mlp_down on tensor cores: a block rows [r0, r0 + MMA_ROWS) of an
 * item's down for MMA_TOKENS tokens. */
template <int K, int SDT>
__global__ void __launch_bounds__(MMA_WARPS * WARP, 1)
    k_mma_down(sp_cuda_weight w, const sp_cuda_mlp_item *items, int n_items, qacts hq, float *out, int64_t ldo) {
    dep_start();
    const sp_cuda_mlp_item &it = item_of(items, n_items, blockIdx.x, true);
    int64_t b = (int64_t)blockIdx.x - it.blk_down, tblocks = (it.n + MMA_TOKENS - 1) / MMA_TOKENS + !it.n;
    int64_t r0 = b / tblocks * MMA_ROWS, t0 = b % tblocks * MMA_TOKENS;
    if (r0 >= w.rows || t0 >= it.n) return;
    int nt = it.n - t0 < MMA_TOKENS ? (int)(it.n - t0) : MMA_TOKENS;
    int64_t cols = it.ff, row_bytes = cols / QB * 16;
    auto row_of = [&](int i) {
        int64_t r = r0 + i < w.rows ? r0 + i : w.rows - 1;
        return vrow_of<K, SDT>(it.codes[2], it.scales[2], it.biases[2], r, cols, w.group, row_bytes);
    };
    float res[2][4];
    mma_tile<K, SDT, 1>(row_of, (uint32_t)(cols / QB), (uint32_t)(w.group / QB), hq.rows(it.row + t0), nt, res);
    int64_t ra = r0 + 16 * (threadIdx.x / WARP) + (threadIdx.x % WARP >> 2);
    mma_store(res, ra, ra + 8, w.rows, nt, out + (it.row + t0) * ldo, ldo, w.bias_dt, it.bias[2]);
}

/* Calls l.template go<K, BITS, SDT, NT>() for w's format (one the vector
 * kernels take) and a token count of nt (1, 2, 4 or 8; MMA_TOKENS: the
 * tensor-core kernels). */
template <int K, int BITS, int SDT, class L>
int vdispatch_nt(int nt, const L &l) {
    if (nt <= 1) return l.template go<K, BITS, SDT, 1>();
    if (nt <= 2) return l.template go<K, BITS, SDT, 2>();
    if (nt <= 4) return l.template go<K, BITS, SDT, 4>();
    if (nt == MMA_TOKENS) return l.template go<K, BITS, SDT, MMA_TOKENS>();
    return l.template go<K, BITS, SDT, 8>();
}

template <class L>
int vdispatch(const sp_cuda_weight &w, int nt, const L &l) {
    switch (w.fmt) {
    case SP_CUDA_FMT_FLOAT:
        if (w.elem == SP_CUDA_F16) return vdispatch_nt<K_F16, 16, 0>(nt, l);
        return vdispatch_nt<K_BF16, 16, 0>(nt, l);
    case SP_CUDA_FMT_MXFP4: return vdispatch_nt<K_MXFP4, 4, 0>(nt, l);
    default: break;
    }
#define SP_VEC_CASE(B)                                                                      \
    if (w.bits == B) {                                                                      \
        if (w.scale_dt == SP_CUDA_F32) return vdispatch_nt<K_AFFINE, B, SP_CUDA_F32>(nt, l); \
        if (w.scale_dt == SP_CUDA_F16) return vdispatch_nt<K_AFFINE, B, SP_CUDA_F16>(nt, l); \
        return vdispatch_nt<K_AFFINE, B, SP_CUDA_BF16>(nt, l);                              \
    }
    SP_VEC_CASE(4)
    SP_VEC_CASE(8)
#undef SP_VEC_CASE
    return (int)cudaErrorInvalidValue;
}

/* Tokens per block for n tokens: the fewest of 1, 2, 4, 8 that hold them (8 past 8). */
int vec_tokens(int64_t n) { return n <= 1 ? 1 : n <= 2 ? 2 : n <= 4 ? 4 : 8; }

/* Whether the vector kernels of format K read activations A: float ones
 * always, int8 ones for 4-bit codes. */
template <int K, int BITS, class A>
constexpr bool reads() {
    return std::is_same<A, facts>::value || K == K_MXFP4 || (K == K_AFFINE && BITS == 4);
}

/* ... and the tensor-core kernels: int8 activations of 4-bit codes. */
template <int K, int BITS, class A>
constexpr bool mma_reads() {
    return std::is_same<A, qacts>::value && (K == K_MXFP4 || (K == K_AFFINE && BITS == 4));
}

/* Whether k_vrows splits w's chunks over a block's warps: a matrix of
 * fewer rows than SPLIT_ROWS with at least half a chunk a lane when split
 * (the router, attention's products), whose blocks would otherwise be
 * too few to keep the memory busy. */
constexpr int64_t SPLIT_ROWS = 16384;

template <int K, int BITS>
bool vsplit(const sp_cuda_weight &w) {
    return w.rows < SPLIT_ROWS && w.cols / vec_elems<K, BITS>() >= WARP * VWARPS / 2;
}

/* Kernel KERN's limit of dynamic shared memory raised to bytes (past the
 * default) on the current device, the first time. */
template <auto KERN>
int raise_smem(size_t bytes) {
    static std::atomic<uint64_t> raised;  // a bit a device (several devices' threads may launch at once)
    int dev = 0;
    cudaGetDevice(&dev);
    if (raised.load() >> (dev & 63) & 1) return 0;
    int e = (int)cudaFuncSetAttribute(KERN, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)bytes);
    if (!e) raised.fetch_or(1ull << (dev & 63));
    return e;
}

/* Tensor-core kernel KERN of format K, whose shared memory is past the
 * default limit. */
template <int K, auto KERN, class... A>
int mma_launch(dim3 grid, cudaStream_t s, A &&...args) {
    constexpr int bytes = mma_sizes<K>::ALL;
    if (int e = raise_smem<KERN>(bytes)) return e;
    launch_smem(KERN, grid, MMA_WARPS * WARP, bytes, s, static_cast<A &&>(args)...);
    return (int)cudaGetLastError();
}

template <class A>
struct vrows_launch {
    const sp_cuda_weight *w;
    A a;
    float *y;
    int64_t ldy, n;
    cudaStream_t s;
    template <int K, int BITS, int SDT, int NT>
    int go() const {
        if constexpr (NT == MMA_TOKENS) {
            if constexpr (!mma_reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
            else {
                dim3 grid((unsigned)((n + MMA_TOKENS - 1) / MMA_TOKENS), (unsigned)((w->rows + MMA_ROWS - 1) / MMA_ROWS));
                if (vsplit<K, BITS>(*w))
                    return mma_launch<K, k_mma_rows<K, SDT, VWARPS>>(grid, s, *w, a, y, ldy, n);
                return mma_launch<K, k_mma_rows<K, SDT, 1>>(grid, s, *w, a, y, ldy, n);
            }
        } else if constexpr (!reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
        else {
            unsigned ty = (unsigned)((n + NT - 1) / NT);
            if (vsplit<K, BITS>(*w)) {
                dim3 grid((unsigned)((w->rows + VR - 1) / VR), ty);
                launch(k_vrows<K, BITS, SDT, NT, A, true>, grid, VWARPS * WARP, s, *w, a, y, ldy, n);
            } else {
                dim3 grid((unsigned)((w->rows + VR * VWARPS - 1) / (VR * VWARPS)), ty);
                launch(k_vrows<K, BITS, SDT, NT, A, false>, grid, VWARPS * WARP, s, *w, a, y, ldy, n);
            }
            return (int)cudaGetLastError();
        }
    }
};

template <class A>
struct gate_up_launch {
    const sp_cuda_weight *w;
    const sp_cuda_mlp_item *items;
    int n_items;
    int64_t blocks;
    bool fused;
    A a;
    float *h;
    int64_t ldh;
    float alpha, limit, u_offset;
    cudaStream_t s;
    template <int K, int BITS, int SDT, int NT>
    int go() const {
        if constexpr (NT == MMA_TOKENS) {
            if constexpr (!mma_reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
            else {
                return mma_launch<K, k_mma_gate_up<K, SDT>>((unsigned)blocks, s, *w, items, n_items, fused, a, h,
                                                                 ldh, alpha, limit, u_offset);
            }
        } else if constexpr (!reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
        else {
            launch(k_mlp_gate_up<K, BITS, SDT, NT, A>, (unsigned)blocks, VWARPS * WARP, s, *w, items, n_items, fused, a,
                   h, ldh, alpha, limit, u_offset);
            return (int)cudaGetLastError();
        }
    }
};

template <class A>
struct down_launch {
    const sp_cuda_weight *w;
    const sp_cuda_mlp_item *items;
    int n_items;
    int64_t blocks;
    A h;
    float *out;
    int64_t ldo;
    cudaStream_t s;
    template <int K, int BITS, int SDT, int NT>
    int go() const {
        if constexpr (NT == MMA_TOKENS) {
            if constexpr (!mma_reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
            else {
                return mma_launch<K, k_mma_down<K, SDT>>((unsigned)blocks, s, *w, items, n_items, h, out, ldo);
            }
        } else if constexpr (!reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
        else {
            launch(k_mlp_down<K, BITS, SDT, NT, A>, (unsigned)blocks, VWARPS * WARP, s, *w, items, n_items, h, out,
                   ldo);
            return (int)cudaGetLastError();
        }
    }
};

/* x's rows rounded to int8 blocks of QB: d = max |x| / 127, codes
 * rint(x / d). */
constexpr int QUANT_WARPS = 8;

/* A block of QB values is QLANES lanes' 4 consecutive values each (a
 * warp takes 4 blocks, lanes 8m .. 8m + 7 the m-th). */
constexpr int QLANES = QB / 4;

/* One block: this lane's 4 values v (the block's values 4 (lane % QLANES)
 * onwards); its codes into q (the block's first) and {d, sum} into *qd
 * where `write` (every lane of the warp takes part in the shuffles). */
__device__ __forceinline__ void quantize4(float4 v, bool write, int8_t *q, float2 *qd) {
    float amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
    float sum = __fadd_rn(__fadd_rn(v.x, v.y), __fadd_rn(v.z, v.w));
#pragma unroll
    for (int o = 1; o < QLANES; o *= 2) {
        amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, o));
    }
    if (!write) return;
    float d = __fdiv_rn(amax, 127.0f);
    auto code = [&](float x) {
        int c = amax > 0.0f ? __float2int_rn(__fdiv_rn(x, d)) : 0;
        return (signed char)(c > 127 ? 127 : c < -127 ? -127 : c);
    };
    int part = threadIdx.x % QLANES;
    *reinterpret_cast<char4 *>(q + 4 * part) = make_char4(code(v.x), code(v.y), code(v.z), code(v.w));
    if (part == 0) *qd = make_float2(d, sum);
}

/* 4 values from p (any alignment). */
__device__ __forceinline__ float4 load4(const float *p) { return make_float4(p[0], p[1], p[2], p[3]); }

__global__ void __launch_bounds__(QUANT_WARPS * WARP)
    k_quantize(const float *x, int64_t ldx, int64_t n, int64_t cols, int8_t *q, float2 *qd, int64_t ldq, int64_t ldd) {
    dep_start();
    int64_t per_row = cols / QB, blk = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / QLANES;
    bool in = blk < n * per_row;
    int64_t t = in ? blk / per_row : 0, b = in ? blk % per_row : 0;
    float4 v = in ? load4(x + t * ldx + b * QB + 4 * (threadIdx.x % QLANES)) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    quantize4(v, in, q + t * ldq + b * QB, qd + t * ldd + b);
}

/* Row i of dst's int8 rows (codes and block pairs) = row rows[i] of src's, a block a row. */
__global__ void k_gather_q(sp_cuda_qx dst, sp_cuda_qx src, const int32_t *rows, int64_t cols) {
    dep_start();
    int64_t r = rows[blockIdx.x], i = blockIdx.x;
    const uint4 *sq = reinterpret_cast<const uint4 *>(src.q + r * src.ldq);
    uint4 *dq = reinterpret_cast<uint4 *>(dst.q + i * dst.ldq);
    for (int64_t k = threadIdx.x; k < cols / 16; k += blockDim.x) dq[k] = sq[k];
    const float2 *sd = reinterpret_cast<const float2 *>(src.d) + r * src.ldd;
    float2 *dd = reinterpret_cast<float2 *>(dst.d) + i * dst.ldd;
    for (int64_t k = threadIdx.x; k < cols / QB; k += blockDim.x) dd[k] = sd[k];
}

qacts qacts_of(const sp_cuda_qx &x) {
    return {x.q, reinterpret_cast<const float2 *>(x.d), x.ldq, x.ldd};
}

bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* ---- per-token steps ---- */

__global__ void k_rope_table(const int32_t *pos, int64_t n, const float *inv_freq, int64_t half, float scale,
                             float *cs) {
    dep_start();
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * half) return;
    int64_t t = k / half, i = k % half;
    float ang = __fmul_rn((float)pos[t], inv_freq[i]);
    cs[t * 2 * half + i] = __fmul_rn((float)cos((double)ang), scale);
    cs[t * 2 * half + half + i] = __fmul_rn((float)sin((double)ang), scale);
}

/* A block a row. A thread keeps up to NORM_VEC float4s of its row in
 * registers (rows of up to 4096 columns in one pass of loads: a norm of one
 * row waits on memory once, not once a step); longer rows, or rows not
 * 16-byte aligned, are read again from memory. */
constexpr int NORM_THREADS = 256, NORM_VEC = 4;

/* Sum over the block (NORM_THREADS) in a fixed order; every thread gets it. */
__device__ double block_sum_d(double v, double *red) {
    v = warp_sum_d(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < NORM_THREADS / WARP; i++) s += red[i];
    return s;
}

__device__ __forceinline__ float4 add4(float4 a, float4 b) {
    return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z), __fadd_rn(a.w, b.w));
}

__device__ __forceinline__ double squares4(float4 v) {
    double s = (double)v.x * (double)v.x;
    s += (double)v.y * (double)v.y;
    s += (double)v.z * (double)v.z;
    return s + (double)v.w * (double)v.w;
}

/* v / rms times g (where has_g), as the scalar path rounds it. */
__device__ __forceinline__ float4 norm4(float4 v, float scale, bool has_g, float4 g) {
    float4 o = make_float4(__fmul_rn(v.x, scale), __fmul_rn(v.y, scale), __fmul_rn(v.z, scale), __fmul_rn(v.w, scale));
    if (!has_g) return o;
    return make_float4(__fmul_rn(o.x, g.x), __fmul_rn(o.y, g.y), __fmul_rn(o.z, g.z), __fmul_rn(o.w, g.w));
}

/* Row r of x (x[rows[r]] where rows is set) into row r of out as
 * x / rms(x) * w, a block a row; with r (rows ldr apart) first x += r (and
 * r = 0 where zero_r); with q, the normed row also rounded to int8 blocks
 * as k_quantize rounds them (the same operations: the same codes and sums). */
__global__ void __launch_bounds__(NORM_THREADS)
    k_rmsnorm(float *x, int64_t ldx, const int32_t *rows, float *res, int64_t ldr, bool zero_r, const float *w,
              float eps, float *out, int64_t ldo, int64_t cols, sp_cuda_qx q) {
    dep_start();
    __shared__ double red[NORM_THREADS / WARP];
    float *xr = x + (rows ? (int64_t)rows[blockIdx.x] : (int64_t)blockIdx.x) * ldx;
    float *rr = res ? res + (int64_t)blockIdx.x * ldr : nullptr;
    float *o = out + (int64_t)blockIdx.x * ldo;
    int8_t *qr = q.q ? q.q + (int64_t)blockIdx.x * q.ldq : nullptr;
    float2 *dr = q.q ? reinterpret_cast<float2 *>(q.d) + (int64_t)blockIdx.x * q.ldd : nullptr;
    auto al = [](const void *p) { return ((uintptr_t)p & 15) == 0; };
    double ss = 0;
    if (cols % 4 == 0 && cols <= 4 * NORM_THREADS * NORM_VEC && al(xr) && (!rr || al(rr)) && al(o) && (!w || al(w))) {
        float4 v[NORM_VEC], a[NORM_VEC], g[NORM_VEC];
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {  // every load first
            int64_t c = 4 * (threadIdx.x + k * NORM_THREADS);
            if (c >= cols) continue;
            v[k] = *reinterpret_cast<const float4 *>(xr + c);
            if (rr) a[k] = *reinterpret_cast<const float4 *>(rr + c);
            g[k] = w ? *reinterpret_cast<const float4 *>(w + c) : make_float4(1.0f, 1.0f, 1.0f, 1.0f);
        }
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            int64_t c = 4 * (threadIdx.x + k * NORM_THREADS);
            if (c >= cols) continue;
            if (rr) {
                v[k] = add4(v[k], a[k]);
                *reinterpret_cast<float4 *>(xr + c) = v[k];
                if (zero_r) *reinterpret_cast<float4 *>(rr + c) = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            }
            ss += squares4(v[k]);
        }
        ss = block_sum_d(ss, red);
        float scale = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
#pragma unroll
        for (int k = 0; k < NORM_VEC; k++) {
            int64_t c = 4 * (threadIdx.x + k * NORM_THREADS);
            if (k * NORM_THREADS * 4 >= cols) break;  // the whole block past the row: no shuffle is waited on
            bool in = c < cols;
            float4 y = in ? norm4(v[k], scale, w, g[k]) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            if (in) *reinterpret_cast<float4 *>(o + c) = y;
            /* the QLANES lanes of a block hold its values in order (cols a multiple of QB) */
            if (qr) quantize4(y, in, qr + c / QB * QB, dr + c / QB);
        }
        return;
    }
    for (int64_t c = threadIdx.x; c < cols; c += NORM_THREADS) {
        float v = xr[c];
        if (rr) {
            v = __fadd_rn(v, rr[c]);
            xr[c] = v;
            if (zero_r) rr[c] = 0.0f;
        }
        ss += (double)v * (double)v;
    }
    ss = block_sum_d(ss, red);  // its barrier also makes the sums written above seen by the block
    float scale = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
    for (int64_t c = threadIdx.x; c < cols; c += NORM_THREADS) {
        float v = __fmul_rn(xr[c], scale);
        o[c] = w ? __fmul_rn(v, w[c]) : v;
    }
    if (!qr) return;
    __syncthreads();
    for (int64_t c0 = 0; c0 < cols; c0 += 4 * NORM_THREADS) {  // the same blocks a pass as above
        int64_t c = c0 + 4 * threadIdx.x;
        bool in = c < cols;
        quantize4(in ? load4(o + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f), in, qr + c / QB * QB, dr + c / QB);
    }
}

__global__ void k_add(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t cols) {
    dep_start();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c < cols) dst[r * ldd + c] = __fadd_rn(dst[r * ldd + c], src[r * lds + c]);
}

__global__ void k_sum_parts(float *out, int64_t ldo, sp_cuda_parts p, int64_t cols) {
    dep_start();
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c >= cols) return;
    float s = p.part[0][r * cols + c];
    for (int j = 1; j < p.n; j++) s = __fadd_rn(s, p.part[j][r * cols + c]);
    out[r * ldo + c] = s;
}

__global__ void k_glu(float *out, int64_t ldo, const float *g, const float *u, int64_t lds, int64_t w, float alpha,
                      float limit, float u_offset) {
    dep_start();
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (j >= w) return;
    float gi = u ? g[t * lds + j] : g[t * lds + 2 * j], ui = u ? u[t * lds + j] : g[t * lds + 2 * j + 1];
    gi = gi > limit ? limit : gi;
    ui = ui > limit ? limit : ui < -limit ? -limit : ui;
    float sig = __fdiv_rn(gi, __fadd_rn(1.0f, expf(__fmul_rn(-gi, alpha))));
    out[t * ldo + j] = __fmul_rn(__fadd_rn(ui, u_offset), sig);
}

/* A block a (row, MOVE_THREADS columns): a column a thread. */
constexpr int MOVE_THREADS = 256;

__global__ void k_gather(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int64_t cols) {
    dep_start();
    int64_t c = (int64_t)blockIdx.y * MOVE_THREADS + threadIdx.x;
    if (c < cols) dst[(int64_t)blockIdx.x * ldd + c] = src[(int64_t)rows[blockIdx.x] * lds + c];
}

__global__ void k_scatter_add(float *out, int64_t ldo, const float *src, int64_t lds, const int32_t *off,
                              const int32_t *list, const float *w, int64_t cols) {
    dep_start();
    int32_t a = off[blockIdx.x], b = off[blockIdx.x + 1];
    int64_t c = (int64_t)blockIdx.y * MOVE_THREADS + threadIdx.x;
    if (a == b || c >= cols) return;
    float *o = out + (int64_t)blockIdx.x * ldo + c;
    float v = *o;
    for (int32_t k = a; k < b; k++) {
        int32_t g = list[k];
        if (g >= 0) v = fmaf(w[g], src[(int64_t)g * lds + c], v);  // < 0: another rank's pair
    }
    *o = v;
}

/* ---- greedy choice ---- */

/* A block takes ARGMAX_SPAN values of a row, each candidate as one 64-bit
 * word ordered as the choice ranks them; the row's best by atomicMax. */
constexpr int ARGMAX_THREADS = 256, ARGMAX_SPAN = 8192;

/* Value v (not NaN) at index i as a word: the larger word the better (the
 * larger value, -0 equal to +0; of equal values the lower index); 0 is
 * below every candidate. */
__device__ __forceinline__ unsigned long long pack_best(float v, int64_t i) {
    uint32_t b = __float_as_uint(v == 0.0f ? 0.0f : v);
    b = (b & 0x80000000u) ? ~b : b | 0x80000000u;
    return (unsigned long long)b << 32 | (0xffffffffu - (uint32_t)i);
}

__global__ void __launch_bounds__(ARGMAX_THREADS)
    k_argmax(const float *x, int64_t ldx, int64_t cols, unsigned long long *best) {
    dep_start();
    __shared__ unsigned long long red[ARGMAX_THREADS / WARP];
    const float *row = x + (int64_t)blockIdx.y * ldx;
    int64_t c0 = (int64_t)blockIdx.x * ARGMAX_SPAN, c1 = c0 + ARGMAX_SPAN < cols ? c0 + ARGMAX_SPAN : cols;
    unsigned long long b = 0;
#pragma unroll 8
    for (int64_t c = c0 + threadIdx.x; c < c1; c += ARGMAX_THREADS) {
        float v = row[c];
        if (v == v) b = max(b, pack_best(v, c));
    }
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) b = max(b, __shfl_xor_sync(0xffffffffu, b, o));
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = b;
    __syncthreads();
    if (threadIdx.x) return;
    for (int i = 0; i < ARGMAX_THREADS / WARP; i++) b = max(b, red[i]);
    if (b) atomicMax(best + blockIdx.y, b);
}

/* ---- a row's best logits (sampling's candidates) ----
 *
 * Each value a key as pack_best makes it, NaN taken as -inf: the larger
 * key the better candidate (the larger value, then the lower index), no
 * two alike, 0 below them all (padding, never a candidate). A block finds
 * the k best of up to TOPK_SPAN keys in shared memory by radix selection
 * (block_best_k) and sorts those k: of TOPK_SPAN values of a row
 * (k_topk_span), or of lists of k from blocks before (k_topk_merge,
 * TOPK_SPAN / k lists a block), until one list of a row is left. A row of
 * 157,184 logits takes two rounds of blocks. */
constexpr int TOPK_THREADS = 512, TOPK_SPAN = 4096, TOPK_BINS = 256;

/* keys[0 .. n) in descending order; n a power of 2, at most TOPK_SPAN. */
__device__ __forceinline__ void block_sort_desc(unsigned long long *keys, int n) {
    for (int size = 2; size <= n; size *= 2)
        for (int stride = size / 2; stride > 0; stride /= 2) {
            __syncthreads();
            for (int i = threadIdx.x; i < n / 2; i += TOPK_THREADS) {
                int lo = 2 * i - (i & (stride - 1)), hi = lo + stride;
                bool desc = (lo & size) == 0;  // this run's direction: the last run is descending
                unsigned long long a = keys[lo], b = keys[hi];
                if ((a < b) == desc) keys[lo] = b, keys[hi] = a;
            }
        }
    __syncthreads();
}

/* The smallest power of 2 at least n (n <= TOPK_SPAN). */
__device__ __forceinline__ int pow2_at_least(int n) {
    int p = 2;
    while (p < n) p *= 2;
    return p;
}

/* The k best of keys[0 .. n) (zeros skipped; fewer where fewer are not 0)
 * to o[0 .. k) in descending order, zeros after them. The k-th best key is
 * found a byte at a time from the top: a histogram of the byte of the keys
 * that share the bytes above it finds the byte of the k-th best, until the
 * keys that share the bytes found are all taken (8 rounds at most, a few
 * for logits, which differ in their top bits). */
__device__ void block_best_k(const unsigned long long *keys, int n, int k, unsigned long long *o) {
    __shared__ unsigned hist[TOPK_BINS];
    __shared__ unsigned long long sel[SP_CUDA_TOP_K_MAX];
    __shared__ int s_bin, s_above, s_in, s_count;
    const int lane = threadIdx.x % WARP;
    unsigned long long prefix = 0, mask = 0;  // the bytes of the k-th best found so far
    int need = k;                             // of the keys that share them
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < TOPK_BINS; i += TOPK_THREADS) hist[i] = 0;
        __syncthreads();
        for (int i0 = 0; i0 < n; i0 += TOPK_THREADS) {  // uniform trips: the warp's match needs every lane
            int i = i0 + threadIdx.x;
            unsigned long long key = i < n ? keys[i] : 0;
            int bin = key && (key & mask) == prefix ? (int)(key >> shift & 0xff) : -1;
            unsigned peers = __match_any_sync(0xffffffffu, bin);  // lanes of one bin add once
            if (bin >= 0 && lane == __ffs(peers) - 1) atomicAdd(&hist[bin], (unsigned)__popc(peers));
        }
        __syncthreads();
        if (threadIdx.x < WARP) {  // lane l: bins 255 - 8 l down to 248 - 8 l
            unsigned c[TOPK_BINS / WARP], t = 0;
            for (int j = 0; j < TOPK_BINS / WARP; j++) t += c[j] = hist[TOPK_BINS - 1 - (TOPK_BINS / WARP) * lane - j];
            unsigned incl = t;
            for (int d = 1; d < WARP; d *= 2) {
                unsigned u = __shfl_up_sync(0xffffffffu, incl, d);
                if (lane >= d) incl += u;
            }
            unsigned run = incl - t, total = __shfl_sync(0xffffffffu, incl, WARP - 1);
            if (total <= (unsigned)need) {  // first round only: k or fewer keys, all taken
                if (lane == 0) s_bin = -1;
            } else
                for (int j = 0; j < TOPK_BINS / WARP; j++) {
                    if (run < (unsigned)need && (unsigned)need <= run + c[j])
                        s_bin = TOPK_BINS - 1 - (TOPK_BINS / WARP) * lane - j, s_above = (int)run, s_in = (int)c[j];
                    run += c[j];
                }
        }
        __syncthreads();
        if (s_bin < 0) break;
        prefix |= (unsigned long long)s_bin << shift, mask |= 0xffull << shift;
        need -= s_above;
        if (s_in == need) break;  // the keys that share the bytes found are the rest of the k
    }
    /* the k best: every key at least prefix (whose bytes below those found are 0) */
    for (int i = threadIdx.x; i < SP_CUDA_TOP_K_MAX; i += TOPK_THREADS) sel[i] = 0;
    if (threadIdx.x == 0) s_count = 0;
    __syncthreads();
    for (int i = threadIdx.x; i < n; i += TOPK_THREADS) {
        unsigned long long key = keys[i];
        if (key && key >= prefix) sel[atomicAdd(&s_count, 1)] = key;
    }
    block_sort_desc(sel, pow2_at_least(k));
    for (int i = threadIdx.x; i < k; i += TOPK_THREADS) o[i] = sel[i];
}

/* Block (s, t): values [s TOPK_SPAN, (s + 1) TOPK_SPAN) of row t, its k
 * best keys into out + (t gridDim.x + s) k. */
__global__ void __launch_bounds__(TOPK_THREADS)
    k_topk_span(const float *x, int64_t ldx, int64_t cols, int k, unsigned long long *out) {
    dep_start();
    __shared__ unsigned long long keys[TOPK_SPAN];
    const float *row = x + (int64_t)blockIdx.y * ldx;
    int64_t c0 = (int64_t)blockIdx.x * TOPK_SPAN;
    int n = cols - c0 < TOPK_SPAN ? (int)(cols - c0) : TOPK_SPAN;
    for (int i = threadIdx.x; i < n; i += TOPK_THREADS) {
        float v = row[c0 + i];
        keys[i] = pack_best(v == v ? v : -INFINITY, c0 + i);
    }
    __syncthreads();
    block_best_k(keys, n, k, out + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * k);
}

/* Block (g, t): lists [g per, (g + 1) per) of the `lists` of k keys of
 * row t in `in`, their k best into out + (t gridDim.x + g) k. */
__global__ void __launch_bounds__(TOPK_THREADS)
    k_topk_merge(const unsigned long long *in, int lists, int per, int k, unsigned long long *out) {
    dep_start();
    __shared__ unsigned long long keys[TOPK_SPAN];
    int l0 = blockIdx.x * per, nl = lists - l0 < per ? lists - l0 : per, n = nl * k;
    const unsigned long long *src = in + ((int64_t)blockIdx.y * lists + l0) * k;
    for (int i = threadIdx.x; i < n; i += TOPK_THREADS) keys[i] = src[i];
    __syncthreads();
    block_best_k(keys, n, k, out + ((int64_t)blockIdx.y * gridDim.x + blockIdx.x) * k);
}

/* ---- routing ---- */

/* Routing: a warp a token, lane l holding experts l, l + 32, l + 64, ...
 * (V of them, 32 V >= the experts) in registers. Each choice is a warp-wide
 * arg max over the candidates left (the largest score, ties to the lower
 * index, NaN lowest): the same choices as the host's repeated arg max,
 * with no barrier between them. */
constexpr int ROUTE_WARPS = 4;

/* A score as the choices compare it: NaN below everything. */
__device__ __forceinline__ float rank_key(float v) { return v != v ? -INFINITY : v; }

/* Whether candidate (k, i) beats (bk, bi); bi < 0: no candidate yet. */
__device__ __forceinline__ bool beats(float k, int i, float bk, int bi) {
    return i >= 0 && (bi < 0 || k > bk || (k == bk && i < bi));
}

/* The best of the lane's candidates (bit j of alive: key[j], index
 * j * WARP + lane), then the best over the warp: every lane gets its index,
 * -1 where no lane has a candidate. */
template <int V>
__device__ __forceinline__ int warp_argmax(const float (&key)[V], uint32_t alive) {
    int lane = threadIdx.x % WARP, idx = -1;
    float k = -INFINITY;
#pragma unroll
    for (int j = 0; j < V; j++)
        if ((alive >> j & 1u) && beats(key[j], j * WARP + lane, k, idx)) k = key[j], idx = j * WARP + lane;
#pragma unroll
    for (int o = WARP / 2; o > 0; o /= 2) {
        float ok = __shfl_xor_sync(0xffffffffu, k, o);
        int oi = __shfl_xor_sync(0xffffffffu, idx, o);
        if (beats(ok, oi, k, idx)) k = ok, idx = oi;
    }
    return idx;
}

/* v[e / WARP] of the lane holding expert e, on every lane. */
template <int V>
__device__ __forceinline__ float warp_pick(const float (&v)[V], int e) {
    float mine = 0.0f;
#pragma unroll
    for (int j = 0; j < V; j++)
        if (j == e / WARP) mine = v[j];
    return __shfl_sync(0xffffffffu, mine, e % WARP);
}

/* The weights of a token's K choices, lane c holding choice c (expert
 * my_e, score my_s), as the host sums them, in its order; lane c writes
 * choice c into so and wo. */
__device__ __forceinline__ void route_weights(const struct sp_cuda_route &r, bool group, int my_e, float my_s,
                                              int32_t *so, float *wo) {
    int lane = threadIdx.x % WARP, K = (int)r.k;
    double s = 0;
    if (r.kind == SP_CUDA_ROUTE_TOPK_SOFTMAX) {
        float mx = -INFINITY;
        for (int c = 0; c < K; c++) mx = fmaxf(mx, __shfl_sync(0xffffffffu, my_s, c));
        float ex = expf(__fsub_rn(my_s, mx));
        for (int c = 0; c < K; c++) s += (double)__shfl_sync(0xffffffffu, ex, c);
        if (lane < K) so[lane] = my_e, wo[lane] = (float)((double)ex / s);
        return;
    }
    for (int c = 0; c < K; c++) s += __shfl_sync(0xffffffffu, my_s, c);
    if (lane >= K) return;
    so[lane] = my_e;
    if (!group) wo[lane] = r.norm_topk ? (float)((double)my_s / s) : my_s;
    else wo[lane] = __fmul_rn(K > 1 ? (float)((double)my_s / (s + 1e-20)) : my_s, r.routed_scale);
}

/* Token t routed by the whole warp: scores (softmax or sigmoid of its
 * logits lg), the groups kept (ranked by the sum of their two best biased
 * scores, in expert order; bz: the warp's V x WARP floats of shared
 * memory), the k best kept experts by biased score, then their weights
 * (the host's sums, in its order): lane j writes choice j. */
template <int V>
__device__ void route_token(const struct sp_cuda_route &r, const float *lg, int64_t t, int32_t *sel, float *wout,
                            float *bz) {
    int lane = threadIdx.x % WARP;
    int E = (int)r.n_experts, K = (int)r.k;
    bool group = r.kind == SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK || r.kind == SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK;
    float v[V], key[V];
    uint32_t in = 0;
#pragma unroll
    for (int j = 0; j < V; j++) {
        int e = j * WARP + lane;
        v[j] = e < E ? lg[e] : -INFINITY;
        if (e < E) in |= 1u << j;
    }
    if (r.kind == SP_CUDA_ROUTE_SOFTMAX_TOPK || r.kind == SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK) {
        float mx = -INFINITY;
#pragma unroll
        for (int j = 0; j < V; j++) mx = fmaxf(mx, v[j]);
        mx = warp_max(mx);
        double s = 0;
#pragma unroll
        for (int j = 0; j < V; j++) {
            v[j] = (in >> j & 1u) ? expf(__fsub_rn(v[j], mx)) : 0.0f;
            s += (double)v[j];
        }
        s = warp_sum_d(s);
#pragma unroll
        for (int j = 0; j < V; j++) v[j] = (float)((double)v[j] / s);
    } else if (r.kind == SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK) {
#pragma unroll
        for (int j = 0; j < V; j++)
            if (in >> j & 1u) v[j] = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v[j])));
    }
#pragma unroll
    for (int j = 0; j < V; j++) {
        int e = j * WARP + lane;
        key[j] = rank_key(group && (in >> j & 1u) ? __fadd_rn(v[j], r.bias ? r.bias[e] : 0.0f) : v[j]);
    }
    uint32_t alive = in;  // candidates still
    int G = (int)r.n_group;
    if (group && G > 1) {
        int per = E / G;
#pragma unroll
        for (int j = 0; j < V; j++)
            if (in >> j & 1u) bz[j * WARP + lane] = key[j];
        __syncwarp();
        float gk[V];  // group j * WARP + lane's score: the sum of its two best
        uint32_t galive = 0;
#pragma unroll
        for (int j = 0; j < V; j++) {
            int g = j * WARP + lane;
            gk[j] = -INFINITY;
            if (g >= G) continue;
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int x = g * per; x < (g + 1) * per; x++) {
                float b = bz[x];
                if (b > m1) m2 = m1, m1 = b;
                else if (b > m2) m2 = b;
            }
            gk[j] = rank_key(per >= 2 ? __fadd_rn(m1, m2) : m1);
            galive |= 1u << j;
        }
        alive = 0;
        for (int p = 0; p < r.topk_group; p++) {
            int g = warp_argmax(gk, galive);
            if (g < 0) break;
            if (g % WARP == lane) galive &= ~(1u << (g / WARP));
#pragma unroll
            for (int j = 0; j < V; j++)
                if ((in >> j & 1u) && (j * WARP + lane) / per == g) alive |= 1u << j;
        }
    }
    int my_e = 0;
    float my_s = 0.0f;
    for (int c = 0; c < K; c++) {
        int e = warp_argmax(key, alive);
        e = e < 0 ? 0 : e;
        float s = warp_pick(v, e);
        if (e % WARP == lane) alive &= ~(1u << (e / WARP));
        if (lane == c) my_e = e, my_s = s;
    }
    route_weights(r, group, my_e, my_s, sel + t * K, wout + t * K);
}

/* Routing apart from grouping: a warp a token. */
template <int V>
__global__ void __launch_bounds__(ROUTE_WARPS * WARP)
    k_route(struct sp_cuda_route r, const float *logits, int64_t ldl, int64_t n, int32_t *sel, float *wout) {
    dep_start();
    __shared__ float bz[ROUTE_WARPS][V * WARP];
    int64_t t = (int64_t)blockIdx.x * ROUTE_WARPS + threadIdx.x / WARP;
    if (t < n) route_token<V>(r, logits + t * ldl, t, sel, wout, bz[threadIdx.x / WARP]);
}

constexpr int GROUP_THREADS = 1024, GROUP_PER = SP_CUDA_ROUTE_MAX_EXPERTS / GROUP_THREADS;
/* Routing inside the grouping's block (a launch fewer) for batches of up
 * to GROUP_ROUTE_MAX tokens: a warp a token, as many warps as ROUTE_FLOATS
 * of shared scratch hold. */
constexpr int GROUP_ROUTE_MAX = 64, ROUTE_FLOATS = 8192;
/* ... where a lane holds at most GROUP_ROUTE_V experts: with more, routing
 * spills to local memory under a 1024-thread block's register budget
 * (k_route's smaller blocks keep them in registers). */
constexpr int GROUP_ROUTE_V = 2;

/* One block: experts' counts, then their offsets, item numbers and first
 * blocks by scans over the experts; each pair's place in its expert's
 * list (token order) by a warp an expert at a time, counting the earlier
 * pairs that chose it 32 at a time; then each token's pairs sorted by
 * expert. With shared, table[E] (the shared expert) is one more item,
 * after the experts': token t's row n K + t, weight 1, last in its list. */
template <int V>
__global__ void __launch_bounds__(GROUP_THREADS)
    k_moe_group(struct sp_cuda_route r, const float *logits, int64_t ldl, bool route_here, int32_t *sel, float *w,
                int n, const sp_cuda_mlp_item *table, const uint8_t *own, bool shared, const float *gath, int64_t ldx,
                bool one_row, int nt, int64_t jblocks, int64_t rblocks, int max_items, sp_cuda_mlp_item *items,
                int32_t *rows, float *ew, int32_t *toff, int32_t *tlist) {
    dep_start();
    using scan = cub::BlockScan<int, GROUP_THREADS>;
    __shared__ typename scan::TempStorage tmp;
    __shared__ int cnt[SP_CUDA_ROUTE_MAX_EXPERTS], off[SP_CUDA_ROUTE_MAX_EXPERTS];
    __shared__ int n_items;
    __shared__ float bz[ROUTE_FLOATS];
    int tid = threadIdx.x, lane = tid % WARP, K = (int)r.k, E = (int)r.n_experts;
    int nk = n * K, S = K + (shared ? 1 : 0);  // S: a token's list
    if (V <= GROUP_ROUTE_V && route_here) {  /* sel and w, seen by the block after the barrier below */
        constexpr int W = ROUTE_FLOATS / (V * WARP) < GROUP_THREADS / WARP ? ROUTE_FLOATS / (V * WARP)
                                                                           : GROUP_THREADS / WARP;
        if (tid / WARP < W)
            for (int t = tid / WARP; t < n; t += W) route_token<V>(r, logits + t * ldl, t, sel, w, bz + tid / WARP * V * WARP);
    }
    for (int e = tid; e < SP_CUDA_ROUTE_MAX_EXPERTS; e += GROUP_THREADS) cnt[e] = 0;
    __syncthreads();
    for (int i = tid; i < nk; i += GROUP_THREADS)
        if (!own || own[sel[i]]) atomicAdd(&cnt[sel[i]], 1);
    __syncthreads();
    int c[GROUP_PER], o[GROUP_PER], used[GROUP_PER], io[GROUP_PER], tb[GROUP_PER], to[GROUP_PER], total, tb_total,
        pairs;
#pragma unroll
    for (int j = 0; j < GROUP_PER; j++) {
        int e = tid * GROUP_PER + j;
        c[j] = e < E ? cnt[e] : 0;
        used[j] = c[j] > 0;
        tb[j] = (c[j] + nt - 1) / nt;
    }
    scan(tmp).ExclusiveSum(c, o, pairs);
    __syncthreads();
    scan(tmp).ExclusiveSum(used, io, total);
    __syncthreads();
    scan(tmp).ExclusiveSum(tb, to, tb_total);
    if (tid == 0) n_items = total;
    if (shared && tid == 0) {
        sp_cuda_mlp_item it = table[E];
        it.x = one_row ? gath : gath + (int64_t)nk * ldx;
        it.ldx = ldx;
        it.n = n;
        it.row = nk;
        it.xrow = one_row ? 0 : nk;
        it.blk_gate_up = (int64_t)tb_total * jblocks;
        it.blk_down = (int64_t)tb_total * rblocks;
        items[total] = it;
    }
#pragma unroll
    for (int j = 0; j < GROUP_PER; j++) {
        int e = tid * GROUP_PER + j;
        if (e >= E) break;
        off[e] = o[j];
        if (!c[j]) continue;
        sp_cuda_mlp_item it = table[e];
        it.x = one_row ? gath : gath + (int64_t)o[j] * ldx;
        it.ldx = ldx;
        it.n = c[j];
        it.row = o[j];
        it.xrow = one_row ? 0 : o[j];
        it.blk_gate_up = (int64_t)to[j] * jblocks;
        it.blk_down = (int64_t)to[j] * rblocks;
        items[io[j]] = it;
    }
    __syncthreads();
    for (int m = n_items + (shared ? 1 : 0) + tid; m < max_items; m += GROUP_THREADS) {
        items[m].n = 0;
        items[m].blk_gate_up = items[m].blk_down = INT64_MAX;
    }
    for (int g = pairs + tid; g < nk; g += GROUP_THREADS) rows[g] = 0;  // other ranks' pairs: rows gathered unread
    for (int e = tid / WARP; e < E; e += GROUP_THREADS / WARP) {
        if (!cnt[e]) continue;
        int at = off[e];
        for (int i0 = 0; i0 < nk; i0 += WARP) {
            int i = i0 + lane;
            bool mine = i < nk && sel[i] == e;
            unsigned ball = __ballot_sync(0xffffffffu, mine);
            if (mine) {
                int g = at + __popc(ball & ((1u << lane) - 1u));
                rows[g] = i / K;
                ew[g] = w[i];
                tlist[i / K * S + i % K] = g;
            }
            at += __popc(ball);
        }
    }
    __syncthreads();
    for (int t = tid; t < n; t += GROUP_THREADS) {
        int ex[SP_CUDA_ROUTE_MAX_K], gp[SP_CUDA_ROUTE_MAX_K];
        for (int j = 0; j < K; j++) {
            int e = sel[t * K + j], g = own && !own[e] ? -1 : tlist[t * S + j], at = j;
            for (; at > 0 && ex[at - 1] > e; at--) ex[at] = ex[at - 1], gp[at] = gp[at - 1];
            ex[at] = e, gp[at] = g;
        }
        for (int j = 0; j < K; j++) tlist[t * S + j] = gp[j];
        if (shared) {
            rows[nk + t] = t;
            ew[nk + t] = 1.0f;
            tlist[t * S + K] = nk + t;
        }
        toff[t] = t * S;
    }
    if (tid == 0) toff[n] = n * S;
}

/* k_moe_group's work for one token (a decode step of one sequence) by one
 * block, an expert a thread, so that no choice waits on the one before:
 * the scores as route_token computes them (the softmax's sum in its
 * order), each group's two best, then each candidate's rank among the
 * groups' and among the experts' candidates as a count of the better ones
 * (pack_best's order is warp_argmax's); warp 0 weighs the choices as
 * route_token does and lays out the items, rows, weights and lists as
 * k_moe_group does (the items in expert order; the shared expert, where
 * there is one, is item K). */
__global__ void __launch_bounds__(SP_CUDA_ROUTE_MAX_EXPERTS)
    k_moe_one(struct sp_cuda_route r, const float *logits, int32_t *sel, float *w, const sp_cuda_mlp_item *table,
              const uint8_t *own, bool shared, const float *x, int64_t ldx, int64_t jblocks, int64_t rblocks,
              int max_items, sp_cuda_mlp_item *items, int32_t *rows, float *ew, int32_t *toff, int32_t *tlist) {
    dep_start();
    __shared__ float val[SP_CUDA_ROUTE_MAX_EXPERTS];
    __shared__ __align__(16) unsigned long long word[SP_CUDA_ROUTE_MAX_EXPERTS];  // candidates; 0: none
    __shared__ int pick[SP_CUDA_ROUTE_MAX_K];
    __shared__ float score[SP_CUDA_ROUTE_MAX_K];
    __shared__ float top;
    __shared__ double total;
    int e = threadIdx.x, lane = e % WARP, warps = blockDim.x / WARP;
    int E = (int)r.n_experts, K = (int)r.k, S = K + (shared ? 1 : 0), G = (int)r.n_group;
    bool in = e < E, group = r.kind == SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK || r.kind == SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK;
    float v = in ? logits[e] : -INFINITY, bias = group && in && r.bias ? r.bias[e] : 0.0f;
    if (e < K) pick[e] = 0, score[e] = 0.0f;
    if (r.kind == SP_CUDA_ROUTE_SOFTMAX_TOPK || r.kind == SP_CUDA_ROUTE_SOFTMAX_GROUP_TOPK) {
        float mx = warp_max(v);
        if (lane == 0) val[e / WARP] = mx;
        __syncthreads();
        if (e < WARP) {
            mx = warp_max(lane < warps ? val[lane] : -INFINITY);
            if (lane == 0) top = mx;
        }
        __syncthreads();
        v = in ? expf(__fsub_rn(v, top)) : 0.0f;
        val[e] = v;
        __syncthreads();
        if (e < WARP) {  /* lane l's experts in route_token's order, then its butterfly */
            double s = 0;
            for (int j = 0; j < warps; j++) s += (double)val[j * WARP + lane];
            s = warp_sum_d(s);
            if (lane == 0) total = s;
        }
        __syncthreads();
        v = (float)((double)v / total);
    } else if (r.kind == SP_CUDA_ROUTE_SIGMOID_GROUP_TOPK && in) {
        v = __fdiv_rn(1.0f, __fadd_rn(1.0f, expf(-v)));
    }
    float key = rank_key(group && in ? __fadd_rn(v, bias) : v);
    bool alive = in;
    if (group && G > 1) {
        int per = E / G;
        val[e] = key;
        __syncthreads();
        if (e < G) {  /* group e's score: the sum of its two best */
            float m1 = -INFINITY, m2 = -INFINITY;
            for (int i = e * per; i < (e + 1) * per; i++) {
                float b = val[i];
                if (b > m1) m2 = m1, m1 = b;
                else if (b > m2) m2 = b;
            }
            word[e] = pack_best(rank_key(per >= 2 ? __fadd_rn(m1, m2) : m1), e);
        }
        __syncthreads();
        if (in) {
            unsigned long long mine = word[e / per];
            int better = 0;
            for (int g = 0; g < G; g++) better += word[g] > mine;
            alive = better < r.topk_group;
        }
        __syncthreads();
    }
    unsigned long long mine = alive ? pack_best(key, e) : 0ull;
    word[e] = mine;
    __syncthreads();
    if (alive) {
        const ulonglong2 *w2 = reinterpret_cast<const ulonglong2 *>(word);
        int better = 0;
#pragma unroll 8
        for (int i = 0; i < (int)blockDim.x / 2; i++) {
            ulonglong2 p = w2[i];
            better += (p.x > mine) + (p.y > mine);
        }
        if (better < K) pick[better] = e, score[better] = v;
    }
    __syncthreads();
    for (int m = S + e; m < max_items; m += blockDim.x) {
        items[m].n = 0;
        items[m].blk_gate_up = items[m].blk_down = INT64_MAX;
    }
    if (e >= WARP) return;
    int my_e = lane < K ? pick[lane] : 0, g = 0;
    route_weights(r, group, my_e, lane < K ? score[lane] : 0.0f, sel, w);
    bool ours = lane < K && (!own || own[my_e]);
    unsigned ours_mask = __ballot_sync(0xffffffffu, ours);
    int kept = __popc(ours_mask), used = kept + (shared ? 1 : 0);
    for (int j = 0; j < K; j++) {  /* the choice's place in expert order among the kept */
        int ej = __shfl_sync(0xffffffffu, my_e, j);
        g += (ours_mask >> j & 1u) && (ej < my_e || (ej == my_e && j < lane));
    }
    auto place = [&](const sp_cuda_mlp_item &from, int at) {
        sp_cuda_mlp_item it = from;
        it.x = x;
        it.ldx = ldx;
        it.n = 1;
        it.row = at;
        it.xrow = 0;
        it.blk_gate_up = (int64_t)at * jblocks;
        it.blk_down = (int64_t)at * rblocks;
        items[at] = it;
        rows[at] = 0;
        tlist[at] = at;
    };
    if (ours) {
        place(table[my_e], g);
        ew[g] = w[lane];
    }
    if (shared && lane == 0) {
        place(table[E], kept);
        ew[kept] = 1.0f;
    }
    for (int m = used + lane; m < S; m += WARP) {  // other ranks' choices: no item
        items[m].n = 0;
        items[m].blk_gate_up = items[m].blk_down = INT64_MAX;
    }
    if (lane == 0) toff[0] = 0, toff[1] = used;
}

/* ---- attention ---- */

/* Element 0 of KV head h of position p of sequence s, keys or values. */
__device__ __forceinline__ int64_t kv_at(const sp_cuda_kv &kv, const sp_cuda_attn &a, int which, int64_t s, int64_t p,
                                         int64_t h) {
    return ((((a.layer * 2 + which) * kv.n_seq + s) * kv.n_ctx + p) * a.n_kv_heads + h) * a.head_dim;
}

constexpr int PRO_WARPS = 4;

/* Head h of token t of qkv by warp wid of PRO_WARPS, kept in shared
 * memory (HD floats a warp) from one round of loads (the head, the norm's
 * weights and the rotation's cos and sin are loaded together; the head
 * past L1, as other blocks may have written it): norm, then rotate (each
 * lane a pair of elements, once the norm's writes are seen: __syncwarp),
 * then store the head back and, for a k head, it and its v head into the
 * cache. */
template <int DT, int HD>
__device__ __forceinline__ void prologue_head(const sp_cuda_attn &a, const sp_cuda_kv &kv, float *qkv, int64_t ldq,
                                              int64_t t, int64_t h, int wid) {
    __shared__ float head[PRO_WARPS][HD], gain[PRO_WARPS][HD], angles[PRO_WARPS][HD];
    int64_t hd = a.head_dim, half = a.rot / 2;
    int lane = threadIdx.x % WARP;
    float *row = qkv + t * ldq, *v = row + h * hd, *sv = head[wid], *sg = gain[wid], *cs = angles[wid];
    const float *nw = !a.q_norm ? nullptr : h < a.n_heads ? a.q_norm : a.k_norm;
    double ss = 0;
    for (int64_t i = lane; i < hd; i += WARP) {
        float x = __ldcg(v + i);
        sv[i] = x;
        if (nw) sg[i] = nw[i], ss += (double)x * (double)x;
    }
    for (int64_t i = lane; i < 2 * half; i += WARP) cs[i] = a.rope_cs[t * a.rot + i];
    __syncwarp();
    if (nw) {
        ss = warp_sum_d(ss);
        float scale = (float)(1.0 / sqrt(ss / (double)hd + (double)a.eps));
        for (int64_t i = lane; i < hd; i += WARP) sv[i] = __fmul_rn(__fmul_rn(sv[i], scale), sg[i]);
        __syncwarp();
    }
    for (int64_t i = lane; i < half; i += WARP) {
        float x1 = sv[i], x2 = sv[i + half], c = cs[i], s = cs[half + i];
        sv[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
        sv[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
    }
    __syncwarp();
    for (int64_t i = lane; i < hd; i += WARP) v[i] = sv[i];
    if (h < a.n_heads) return;
    int64_t kvh = h - a.n_heads, s = a.seq[t], p = a.pos[t];
    const float *vv = row + (a.n_heads + a.n_kv_heads + kvh) * hd;
    int64_t ko = kv_at(kv, a, 0, s, p, kvh), vo = kv_at(kv, a, 1, s, p, kvh);
    for (int64_t i = lane; i < hd; i += WARP) {
        stf<DT>(kv.data, ko + i, sv[i]);
        stf<DT>(kv.data, vo + i, __ldcg(vv + i));
    }
}

/* A block a (token, PRO_WARPS heads), a warp a head. */
template <int DT>
__global__ void __launch_bounds__(PRO_WARPS * WARP) k_prologue(sp_cuda_attn a, sp_cuda_kv kv, float *qkv, int64_t ldq) {
    dep_start();
    int wid = threadIdx.x / WARP;
    int64_t h = (int64_t)blockIdx.y * PRO_WARPS + wid;
    if (h < a.n_heads + a.n_kv_heads) prologue_head<DT, SP_CUDA_MAX_HEAD_DIM>(a, kv, qkv, ldq, blockIdx.x, h, wid);
}

/* Heads of at most this many dimensions have their first step in the
 * product's kernel (k_vrows_heads): its shared memory stays small. */
constexpr int HEADS_MAX_DIM = 256;

/* Attention's q, k and v products as one matrix of q's rows, then k's,
 * then v's: parts 1 (one fused matrix, part 0) or 3, each part's arrays
 * in w's format and columns. */
struct qkv_parts {
    const void *codes[3], *scales[3], *biases[3], *bias[3];
    int64_t rows[3];
    int n;
};

/* Element i of a part's array, selected rather than indexed (a kernel
 * parameter indexed at run time is copied to local memory). */
template <class T>
__device__ __forceinline__ T qkv_part(const T (&v)[3], int i) {
    return i == 0 ? v[0] : i == 1 ? v[1] : v[2];
}

/* k_vrows (split over the block's warps) on attention's q, k and v rows,
 * then each head's first step (prologue_head) in the same launch, by the
 * last of the head's blocks for a block of tokens to finish (a count a
 * (token block, head) in done, reset by it; a v head's blocks count with
 * its k head's): fewer launches a layer, the same bits. */
template <int K, int BITS, int SDT, int NT, class A, int DT>
__global__ void __launch_bounds__(VWARPS * WARP)
    k_vrows_heads(sp_cuda_weight w, qkv_parts qp, A a, float *y, int64_t ldy, int64_t n, sp_cuda_attn at,
                  sp_cuda_kv kv, unsigned *done) {
    static_assert(PRO_WARPS == VWARPS, "a warp a head");
    __shared__ float part[VWARPS][VR][NT];
    __shared__ float fold[fold_buf_floats<A, NT>()];
    int wid = threadIdx.x / WARP;
    int64_t r0 = (int64_t)blockIdx.x * VR, t0 = (int64_t)blockIdx.y * NT;
    int i = qp.n == 1 || r0 < qp.rows[0] ? 0 : r0 < qp.rows[0] + qp.rows[1] ? 1 : 2;
    int64_t first = i == 0 ? 0 : i == 1 ? qp.rows[0] : qp.rows[0] + qp.rows[1];
    sp_cuda_weight wi = w;
    wi.codes = qkv_part(qp.codes, i), wi.scales = qkv_part(qp.scales, i), wi.biases = qkv_part(qp.biases, i);
    wi.bias = qkv_part(qp.bias, i), wi.rows = qkv_part(qp.rows, i);
    vrows<K, BITS, SDT, NT, A, true>(wi, a, y + first, ldy, n, r0 - first, t0, wid, part, fold);
    int64_t hd = at.head_dim, qrows = at.n_heads * hd, heads = at.n_heads + at.n_kv_heads;
    int64_t h = r0 < qrows ? r0 / hd : at.n_heads + (r0 - qrows) % (at.n_kv_heads * hd) / hd;
    unsigned per = (unsigned)((h < at.n_heads ? 1 : 2) * hd / VR);
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *c = done + blockIdx.y * heads + h;
        last = atomicAdd(c, 1u) == per - 1;
        if (last) *c = 0u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    int64_t nt = n - t0 < NT ? n - t0 : NT;
    for (int64_t t = wid; t < nt; t += VWARPS) prologue_head<DT, HEADS_MAX_DIM>(at, kv, y, ldy, t0 + t, h, wid);
}

/* 16-bit cache elements (f16 or bf16) as floats: 8 of a uint4, or DPL of
 * a lane's share of a row (a word, two or four). */
template <int DT>
__device__ __forceinline__ float half_of(uint32_t w, int hi) {
    if constexpr (DT == SP_CUDA_BF16) return __uint_as_float(hi ? w & 0xffff0000u : w << 16);
    else return __half2float(__ushort_as_half((unsigned short)(hi ? w >> 16 : w & 0xffffu)));
}

template <int DT>
__device__ __forceinline__ void unpack8(const uint4 &q, float *v) {
    uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
    for (int i = 0; i < 4; i++) v[2 * i] = half_of<DT>(w[i], 0), v[2 * i + 1] = half_of<DT>(w[i], 1);
}

template <int DT, int DPL>
__device__ __forceinline__ void unpack(uint32_t w, float *v) { v[0] = half_of<DT>(w, 0), v[1] = half_of<DT>(w, 1); }
template <int DT, int DPL>
__device__ __forceinline__ void unpack(const uint2 &w, float *v) {
    unpack<DT, 2>(w.x, v);
    unpack<DT, 2>(w.y, v + 2);
}
template <int DT, int DPL>
__device__ __forceinline__ void unpack(const uint4 &w, float *v) { unpack8<DT>(w, v); }

/* Elements [e, e + 8) of the cache from element offset o (o and e whole
 * eights: 16-byte aligned rows). */
template <int DT>
__device__ __forceinline__ void kv_load8(const void *p, int64_t o, float *v) {
    if constexpr (DT == SP_CUDA_F32) {
        float4 a = __ldg(reinterpret_cast<const float4 *>(static_cast<const float *>(p) + o));
        float4 b = __ldg(reinterpret_cast<const float4 *>(static_cast<const float *>(p) + o + 4));
        v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
    } else {
        uint4 q = __ldg(reinterpret_cast<const uint4 *>(static_cast<const uint16_t *>(p) + o));
        uint32_t w[4] = {q.x, q.y, q.z, q.w};
#pragma unroll
        for (int i = 0; i < 4; i++) {
            if constexpr (DT == SP_CUDA_BF16) {
                v[2 * i] = __uint_as_float(w[i] << 16);
                v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
            } else {
                v[2 * i] = __half2float(__ushort_as_half((unsigned short)(w[i] & 0xffffu)));
                v[2 * i + 1] = __half2float(__ushort_as_half((unsigned short)(w[i] >> 16)));
            }
        }
    }
}

/* Where attention's blocks put their work: each chunk's part (zmax chunks
 * a row), a count of a (token, head)'s chunks done (0 between launches),
 * and the merged heads (and their int8 rounding where q is set). */
struct attn_out {
    float *part;
    unsigned *done;
    float *att;
    int64_t lda;
    sp_cuda_qx q;
};

__device__ void attn_merge(const sp_cuda_attn &a, const float *pp, int64_t t, int64_t h, int64_t S, const attn_out &o);
__device__ void attn_merge_warp(const sp_cuda_attn &a, const float *pp, int64_t t, int64_t h, int64_t S,
                                const attn_out &o);

/* What an attention block keeps in shared memory: the token's query head,
 * and each warp's max, sum and weighted values (heads up to HD). */
template <int HD>
struct attn_smem {
    float q[HD];
    float wm[ATT_WARPS], wl[ATT_WARPS];
    float wacc[ATT_WARPS][HD];
};

/* A warp's share of a chunk for query q (HD = 32 DPL dimensions, a 16-bit
 * cache): cnt positions (<= 0: none), the lane's key row at krow (lane <
 * cnt), the warp's value rows from vrow, vstep elements apart. Each lane
 * scores its position (its key row read whole, 16 bytes at a time, every
 * read in flight at once), the warp takes their softmax against its max m
 * (sum l), then each lane adds its DPL dimensions of the value rows
 * weighted so, in position order, into v (every row's load in flight
 * together: from memory, the round trips bound this, not the bytes). */
template <int DT, int DPL>
__device__ __forceinline__ void attn_warp(const float *q, const uint16_t *krow, const uint16_t *vrow, int64_t vstep,
                                          int64_t cnt, float scale, float &m, float &l, float (&v)[DPL]) {
    int lane = threadIdx.x % WARP;
    float sc = -INFINITY;
    if (lane < cnt) {
        constexpr int U = DPL * WARP / 8;  // 16-byte units of a key row
        uint4 raw[U];
        const uint4 *kp = reinterpret_cast<const uint4 *>(krow);
#pragma unroll
        for (int u = 0; u < U; u++) raw[u] = __ldg(kp + u);
        float dot = 0.0f;
#pragma unroll
        for (int u = 0; u < U; u++) {
            float k8[8];
            unpack8<DT>(raw[u], k8);
#pragma unroll
            for (int j = 0; j < 8; j++) dot = fmaf(q[u * 8 + j], k8[j], dot);
        }
        sc = __fmul_rn(dot, scale);
    }
    m = warp_max(sc);  // -inf where the warp has no position
    float e = lane < cnt ? expf(__fsub_rn(sc, m)) : 0.0f;
    l = warp_sum(e);
    using row_t = typename std::conditional<DPL == 2, uint32_t, typename std::conditional<DPL == 4, uint2, uint4>::type>::type;
    row_t raw[WARP];
    const uint16_t *vp = vrow + lane * DPL;
#pragma unroll
    for (int j = 0; j < WARP; j++)
        if (j < cnt) raw[j] = __ldg(reinterpret_cast<const row_t *>(vp + j * vstep));
#pragma unroll
    for (int k = 0; k < DPL; k++) v[k] = 0.0f;
#pragma unroll
    for (int j = 0; j < WARP; j++) {
        float ej = __shfl_sync(0xffffffffu, e, j);
        if (j >= cnt) continue;
        float f[DPL];
        unpack<DT, DPL>(raw[j], f);
#pragma unroll
        for (int k = 0; k < DPL; k++) v[k] = fmaf(ej, f[k], v[k]);
    }
}

/* The weights of a chunk's ATT_WARPS parts (their maxima wm, sums wl) in
 * their merge: their max bm, the merged sum bl, and each part's factor wf
 * (a part that saw no position adds nothing). */
__device__ __forceinline__ void attn_weights(const float *wm, const float *wl, float &bm, float &bl, float *wf) {
    bm = wm[0], bl = 0.0f;
    for (int w = 1; w < ATT_WARPS; w++) bm = fmaxf(bm, wm[w]);
    for (int w = 0; w < ATT_WARPS; w++) {
        wf[w] = wm[w] == -INFINITY ? 0.0f : expf(__fsub_rn(wm[w], bm));
        bl = __fadd_rn(bl, __fmul_rn(wl[w], wf[w]));
    }
}

/* The first cached position a token at pos sees (its window's first). */
__device__ __forceinline__ int64_t attn_lo(const sp_cuda_attn &a, int64_t pos) {
    return a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
}

/* Where chunk z's part of token t's head h goes (zmax chunks a row). */
__device__ __forceinline__ float *attn_part_of(const sp_cuda_attn &a, const attn_out &o, int64_t t, int64_t h, int64_t z,
                                               int64_t zmax) {
    return o.part + ((t * a.n_heads + h) * zmax + z) * (a.head_dim + 2);
}

/* The block's warps (their max, sum and values in sm) merged in order into
 * chunk z's part of token t's head h (zmax chunks a row); the last of the
 * head's S chunks to be done merges them all (attn_merge). */
template <int HD>
__device__ void attn_chunk(const sp_cuda_attn &a, const attn_out &o, const attn_smem<HD> &sm, int64_t t, int64_t h,
                           int64_t z, int64_t zmax, int64_t S) {
    int64_t hd = a.head_dim;
    __syncthreads();
    float bm, bl, wf[ATT_WARPS];
    attn_weights(sm.wm, sm.wl, bm, bl, wf);
    const float *pp = attn_part_of(a, o, t, h, 0, zmax);
    float *out = attn_part_of(a, o, t, h, z, zmax);
    if (threadIdx.x == 0) out[0] = bm, out[1] = bl;
    for (int64_t d = threadIdx.x; d < hd; d += ATT_WARPS * WARP) {
        float v = 0.0f;
        for (int w = 0; w < ATT_WARPS; w++) v = fmaf(sm.wacc[w][d], wf[w], v);
        out[2 + d] = v;
    }
    __shared__ bool last;
    __threadfence();
    __syncthreads();
    if (threadIdx.x == 0) {
        unsigned *done = o.done + t * a.n_heads + h;
        last = atomicAdd(done, 1u) == (unsigned)(S - 1);
        if (last) *done = 0u;
    }
    __syncthreads();
    if (!last) return;
    __threadfence();
    attn_merge(a, pp, t, h, S, o);
}

/* A block a (token, query head, chunk of ATT_CHUNK of its visible
 * positions), a warp 32 of them: each lane scores one position, the warp
 * takes their softmax against its max, then its lanes (over the
 * dimensions) add the values weighted so in position order (attn_warp
 * where DPL > 0: a 16-bit cache, head_dim = 32 DPL); then attn_chunk.
 * Chunks are fixed spans of the token's own positions, merged in order,
 * so what a token gets does not depend on the batch. */
template <int DT, int DPL>
__global__ void __launch_bounds__(ATT_WARPS * WARP)
    k_attn(sp_cuda_attn a, sp_cuda_kv kv, const float *qkv, int64_t ldq, attn_out o) {
    dep_start();
    constexpr int HD = DPL > 0 ? DPL * WARP : SP_CUDA_MAX_HEAD_DIM;
    __shared__ attn_smem<HD> sm;
    int64_t t = blockIdx.x, h = blockIdx.y, hd = a.head_dim;
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    int64_t kvh = h / (a.n_heads / a.n_kv_heads), s = a.seq[t], pos = a.pos[t];
    int64_t lo = attn_lo(a, pos), c0 = lo + (int64_t)blockIdx.z * ATT_CHUNK;
    if (c0 > pos) return;  // past the token's positions: neither counted nor merged
    for (int64_t i = threadIdx.x; i < hd; i += ATT_WARPS * WARP) sm.q[i] = qkv[t * ldq + h * hd + i];
    __syncthreads();
    int64_t p0 = c0 + wid * WARP, p = p0 + lane;
    int64_t cnt = pos - p0 + 1 < WARP ? pos - p0 + 1 : WARP;  // the warp's positions (<= 0: none)
    int64_t vo = kv_at(kv, a, 1, s, p0 > pos ? pos : p0, kvh), vstep = a.n_kv_heads * hd;
    const float scale = 1.0f / sqrtf((float)hd);
    float m, l;
    if constexpr (DPL > 0) {
        const uint16_t *data = static_cast<const uint16_t *>(kv.data);
        float v[DPL];
        attn_warp<DT, DPL>(sm.q, data + kv_at(kv, a, 0, s, p <= pos ? p : pos, kvh), data + vo, vstep, cnt, scale,
                           m, l, v);
#pragma unroll
        for (int k = 0; k < DPL; k++) sm.wacc[wid][lane * DPL + k] = v[k];
    } else {
        float sc = -INFINITY;
        if (p <= pos) {
            int64_t ko = kv_at(kv, a, 0, s, p, kvh);
            float dot = 0.0f;
            if (hd % 8 == 0) {
                for (int64_t e = 0; e < hd; e += 8) {
                    float k8[8];
                    kv_load8<DT>(kv.data, ko + e, k8);
#pragma unroll
                    for (int j = 0; j < 8; j++) dot = fmaf(sm.q[e + j], k8[j], dot);
                }
            } else {
                for (int64_t e = 0; e < hd; e++) dot = fmaf(sm.q[e], ldf<DT>(kv.data, ko + e), dot);
            }
            sc = __fmul_rn(dot, scale);
        }
        m = warp_max(sc);  // -inf where the warp has no position
        float e = p <= pos ? expf(__fsub_rn(sc, m)) : 0.0f;
        l = warp_sum(e);
        for (int64_t d0 = 0; d0 < hd; d0 += WARP) {  // every lane in every pass: the shuffles take the whole warp
            int64_t d = d0 + lane;
            float v = 0.0f;
#pragma unroll 8
            for (int j = 0; j < WARP; j++) {
                float ej = __shfl_sync(0xffffffffu, e, j);
                if (j < cnt && d < hd) v = fmaf(ej, ldf<DT>(kv.data, vo + j * vstep + d), v);
            }
            if (d < hd) sm.wacc[wid][d] = v;
        }
    }
    if (lane == 0) sm.wm[wid] = m, sm.wl[wid] = l;
    attn_chunk(a, o, sm, t, h, blockIdx.z, gridDim.z, (pos - lo + ATT_CHUNK) / ATT_CHUNK);
}

/* ---- attention on tensor cores (heads of 64 or 128, a 16-bit cache) ----
 * A part (32 positions of a chunk, as a k_attn warp takes them) for up to
 * 16 query rows at once: scores by mma.sync m16n8k16 (f32 sums), each
 * row's softmax against its own max, then the values weighted so by
 * mma.sync again. The query and the weights are split each into two
 * 16-bit halves (x = hi + lo, both in the cache's type) and both halves
 * multiplied, so that the products keep about 16 bits of either (against
 * the 8 or 11 of one half). A row's results depend on its own query
 * alone: one token (k_attn_mma, a row of 16) gets the bits it gets among
 * 16 (k_attn_tile). Chunks are spans of ATT_CHUNK positions from a
 * multiple of ATT_CHUNK (the same for every token, also under a window),
 * positions a token does not see weighing nothing. */

template <int DT>
__device__ __forceinline__ void mma16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    if constexpr (DT == SP_CUDA_BF16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
#else
    __trap();
#endif
}

/* x and y as a pair of DT (x in the low half), rounded to nearest: hi;
 * what that leaves of each, likewise: lo. */
template <int DT>
__device__ __forceinline__ void split2(float x, float y, uint32_t &hi, uint32_t &lo) {
    if constexpr (DT == SP_CUDA_BF16) {
        __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        float2 f = __bfloat1622float2(h);
        __nv_bfloat162 l = __floats2bfloat162_rn(__fsub_rn(x, f.x), __fsub_rn(y, f.y));
        hi = *reinterpret_cast<uint32_t *>(&h), lo = *reinterpret_cast<uint32_t *>(&l);
    } else {
        __half2 h = __floats2half2_rn(x, y);
        float2 f = __half22float2(h);
        __half2 l = __floats2half2_rn(__fsub_rn(x, f.x), __fsub_rn(y, f.y));
        hi = *reinterpret_cast<uint32_t *>(&h), lo = *reinterpret_cast<uint32_t *>(&l);
    }
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"((unsigned)__cvta_generic_to_shared(p)));
#else
    __trap();
#endif
}

/* The A fragments of query rows q0 (row g) and q1 (row g + 8; NULL: a row
 * of zeros) over k steps of 16 dimensions, hi and lo halves. The
 * dimensions go in an order of their own, the same for the keys
 * (attn_part_mma): k step 2 j + s takes lane (g, tq) dimensions 32 j + 8
 * tq + 4 s .. + 3, so that a lane's key fragments of a row are whole
 * 16-byte loads. Rows of floats, 16-byte aligned (shared memory). */
template <int DT, int HD>
__device__ __forceinline__ void attn_q_frags(const float *q0, const float *q1, uint32_t (&qh)[HD / 16][4],
                                             uint32_t (&ql)[HD / 16][4]) {
    int tq = threadIdx.x % 4;
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        int d = 32 * (kk / 2) + 8 * tq + 4 * (kk % 2);
        float4 a = q0 ? *reinterpret_cast<const float4 *>(q0 + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        float4 b = q1 ? *reinterpret_cast<const float4 *>(q1 + d) : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        split2<DT>(a.x, a.y, qh[kk][0], ql[kk][0]);
        split2<DT>(b.x, b.y, qh[kk][1], ql[kk][1]);
        split2<DT>(a.z, a.w, qh[kk][2], ql[kk][2]);
        split2<DT>(b.z, b.w, qh[kk][3], ql[kk][3]);
    }
}

/* What a part gives each of a lane's two rows (g and g + 8): the max m of
 * its scores, the sum l of their exponentials against it, and the values
 * weighted so, o[dn][0, 1] (row g) and o[dn][2, 3] (row g + 8) at
 * dimensions 8 dn + 2 tq + {0, 1}. A row that sees no position of the part
 * gets m = -inf, l = 0 and zeros. */
template <int HD>
struct attn_part {
    float m[2], l[2], o[HD / 8][4];
    /* what a part no row sees gives (the same as computing it) */
    __device__ void none() {
        m[0] = m[1] = -INFINITY, l[0] = l[1] = 0.0f;
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
            for (int e = 0; e < 4; e++) o[dn][e] = 0.0f;
    }
};

/* The positions of the part from p0 (WARP of them) that the token at pos
 * sees, as the part's rows [vlo, vhi] (vlo > vhi: none). */
__device__ __forceinline__ void attn_span(const sp_cuda_attn &a, int64_t pos, int64_t p0, int &vlo, int &vhi) {
    int64_t l = attn_lo(a, pos), e = pos < p0 + WARP - 1 ? pos : p0 + WARP - 1;
    vlo = (int)((l > p0 ? l : p0) - p0), vhi = (int)(e - p0);
}

/* Position p, or the nearest of [lo, hi] (the row read for a position not
 * seen: its weight is zero, and a seen row's values are finite). */
__device__ __forceinline__ int64_t attn_nearest(int64_t p, int64_t lo, int64_t hi) {
    return p < lo ? lo : p > hi ? hi : p;
}

/* One part for a warp: query fragments qh, ql; key row i of the part at
 * krow(i) (16-byte loads; G: from global memory); value rows vs[i * RS]
 * in shared memory; row r (0: g, 1: g + 8) sees positions [vlo[r], vhi[r]]
 * of the part's 32. */
template <int DT, int HD, int RS, bool G, class KR>
__device__ __forceinline__ void attn_part_mma(const uint32_t (&qh)[HD / 16][4], const uint32_t (&ql)[HD / 16][4],
                                              const KR &krow, const uint16_t *vs, const int (&vlo)[2],
                                              const int (&vhi)[2], float scale, attn_part<HD> &r) {
    int lane = threadIdx.x % WARP, g = lane >> 2, tq = lane & 3;
    float c[4][4];
#pragma unroll
    for (int nt = 0; nt < 4; nt++) {
#pragma unroll
        for (int e = 0; e < 4; e++) c[nt][e] = 0.0f;
        const uint4 *kp = reinterpret_cast<const uint4 *>(krow(8 * nt + g));
#pragma unroll
        for (int j = 0; j < HD / 32; j++) {
            uint4 k = G ? __ldg(kp + 4 * j + tq) : kp[4 * j + tq];
            mma16<DT>(c[nt], qh[2 * j], k.x, k.y);
            mma16<DT>(c[nt], ql[2 * j], k.x, k.y);
            mma16<DT>(c[nt], qh[2 * j + 1], k.z, k.w);
            mma16<DT>(c[nt], ql[2 * j + 1], k.z, k.w);
        }
    }
    /* each row's softmax over the part: the lane's 8 of it, then its quad's */
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float mx = -INFINITY;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                int i = 8 * nt + 2 * tq + e;
                float sc = i >= vlo[h] && i <= vhi[h] ? __fmul_rn(c[nt][2 * h + e], scale) : -INFINITY;
                c[nt][2 * h + e] = sc;
                mx = fmaxf(mx, sc);
            }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        float sum = 0.0f;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float sc = c[nt][2 * h + e];
                float ex = sc == -INFINITY ? 0.0f : expf(__fsub_rn(sc, mx));
                c[nt][2 * h + e] = ex;
                sum = __fadd_rn(sum, ex);
            }
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
        sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
        r.m[h] = mx, r.l[h] = sum;
    }
    /* the weights as A fragments (k: positions), hi and lo */
    uint32_t ph[2][4], pl[2][4];
#pragma unroll
    for (int kk = 0; kk < 2; kk++) {
        split2<DT>(c[2 * kk][0], c[2 * kk][1], ph[kk][0], pl[kk][0]);
        split2<DT>(c[2 * kk][2], c[2 * kk][3], ph[kk][1], pl[kk][1]);
        split2<DT>(c[2 * kk + 1][0], c[2 * kk + 1][1], ph[kk][2], pl[kk][2]);
        split2<DT>(c[2 * kk + 1][2], c[2 * kk + 1][3], ph[kk][3], pl[kk][3]);
    }
#pragma unroll
    for (int dn = 0; dn < HD / 8; dn++)
#pragma unroll
        for (int e = 0; e < 4; e++) r.o[dn][e] = 0.0f;
    /* lane L addresses row 16 kk + 8 (L / 8 % 2) + L % 8 at dimensions 8 (dn + L / 16): the B fragments
     * of n tiles dn and dn + 1 */
    const uint16_t *va = vs + (8 * (lane / 8 % 2) + lane % 8) * RS + 8 * (lane / 16);
#pragma unroll
    for (int kk = 0; kk < 2; kk++)
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn += 2) {
            uint32_t b[4];
            ldmatrix_x4_trans(b, va + 16 * kk * RS + 8 * dn);
            mma16<DT>(r.o[dn], ph[kk], b[0], b[1]);
            mma16<DT>(r.o[dn], pl[kk], b[0], b[1]);
            mma16<DT>(r.o[dn + 1], ph[kk], b[2], b[3]);
            mma16<DT>(r.o[dn + 1], pl[kk], b[2], b[3]);
        }
}

/* k_attn on tensor cores (a 16-bit cache, heads of HD = 64 or 128): a
 * block a (token, query head, chunk), its warps the chunk's four parts,
 * the token one row of 16; each warp stages its part's value rows in
 * shared memory (the rows a token does not see are those nearest it that
 * it does: a weight of zero times a finite value), reads its key rows
 * from the cache; then attn_chunk. */
template <int DT, int HD>
__global__ void __launch_bounds__(ATT_WARPS * WARP)
    k_attn_mma(sp_cuda_attn a, sp_cuda_kv kv, const float *qkv, int64_t ldq, attn_out o) {
    dep_start();
    /* a value row's stride (16 bytes past its data: ldmatrix's 8 rows on different banks), its 16-byte units */
    constexpr int RS = HD + 8, U = HD / 8;
    __shared__ __align__(16) attn_smem<HD> sm;
    __shared__ __align__(16) uint16_t vs[ATT_WARPS][WARP * RS];
    int64_t t = blockIdx.x, h = blockIdx.y;
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP;
    int64_t kvh = h / (a.n_heads / a.n_kv_heads), s = a.seq[t], pos = a.pos[t];
    int64_t lo = attn_lo(a, pos), z0 = lo / ATT_CHUNK, c0 = (z0 + (int64_t)blockIdx.z) * ATT_CHUNK;
    if (c0 > pos) return;  // past the token's positions: neither counted nor merged
    for (int64_t i = threadIdx.x; i < HD; i += ATT_WARPS * WARP) sm.q[i] = qkv[t * ldq + h * HD + i];
    int64_t p0 = c0 + wid * WARP;
    const uint16_t *data = static_cast<const uint16_t *>(kv.data);
    __syncthreads();  // the query
    attn_part<HD> r;
    if (p0 <= pos && p0 + WARP - 1 >= lo) {
        uint16_t *v = vs[wid];
#pragma unroll
        for (int k = 0; k < U; k++) {
            int u = lane + WARP * k, i = u / U;
            int64_t p = attn_nearest(p0 + i, lo, pos);
            const uint4 *src = reinterpret_cast<const uint4 *>(data + kv_at(kv, a, 1, s, p, kvh)) + u % U;
            *reinterpret_cast<uint4 *>(v + i * RS + 8 * (u % U)) = __ldg(src);
        }
        __syncwarp();
        int vlo[2] = {1, 1}, vhi[2] = {0, 0};  // rows 1 .. 15: no token
        if (lane < 4) attn_span(a, pos, p0, vlo[0], vhi[0]);
        uint32_t qh[HD / 16][4], ql[HD / 16][4];
        attn_q_frags<DT, HD>(lane < 4 ? sm.q : nullptr, nullptr, qh, ql);
        auto krow = [&](int i) { return data + kv_at(kv, a, 0, s, attn_nearest(p0 + i, lo, pos), kvh); };
        attn_part_mma<DT, HD, RS, true>(qh, ql, krow, v, vlo, vhi, 1.0f / sqrtf((float)HD), r);
    } else {
        r.none();
    }
    if (lane < 4) {
#pragma unroll
        for (int dn = 0; dn < HD / 8; dn++) {
            sm.wacc[wid][8 * dn + 2 * lane] = r.o[dn][0];
            sm.wacc[wid][8 * dn + 2 * lane + 1] = r.o[dn][1];
        }
        if (lane == 0) sm.wm[wid] = r.m[0], sm.wl[wid] = r.l[0];
    }
    attn_chunk(a, o, sm, t, h, blockIdx.z, gridDim.z, pos / ATT_CHUNK - z0 + 1);
}

constexpr int ATT_TILE = 16;  // tokens of k_attn_tile's block: the rows of a tensor-core tile

/* Shared memory of k_attn_tile for heads of HD, HPB heads a block: a
 * chunk's key rows, then its value rows (RS elements apart), then the
 * heads' tokens' queries; once the parts are done, each head's parts'
 * results (attn_tile_merge) where the rows were. */
template <int HD, int HPB>
struct attn_tile_sizes {
    static constexpr int RS = HD + 8;
    static constexpr size_t ROWS = 2 * ATT_CHUNK * RS * sizeof(uint16_t), Q = HPB * ATT_TILE * HD * sizeof(float),
                            BYTES = ROWS + Q;
};

/* The parts' results of a head's tokens in k_attn_tile. */
template <int HD>
struct attn_tile_merge {
    float wacc[ATT_WARPS][ATT_TILE][HD];
    float wm[ATT_TILE][ATT_WARPS], wl[ATT_TILE][ATT_WARPS], wf[ATT_TILE][ATT_WARPS], bm[ATT_TILE], bl[ATT_TILE];
};

/* k_attn_mma for a launch whose tokens are one run of consecutive
 * positions of one sequence (a prompt): a block a (ATT_TILE tokens, HPB
 * query heads of one KV head, chunk: the z-th from the first token's
 * first) reads the chunk's rows into shared memory once, and each warp
 * takes a part of a head for the 16 tokens at once (their rows), merged
 * for each token as k_attn_mma's block merges them: the same bits as a
 * token alone. The tokens' chunks are counted together at the end; the
 * last chunk of a (token, head) merges it, a warp a (token, head)
 * (attn_merge_warp). */
template <int DT, int HD, int HPB>
__global__ void __launch_bounds__(ATT_WARPS * WARP * HPB)
    k_attn_tile(sp_cuda_attn a, sp_cuda_kv kv, const float *qkv, int64_t ldq, attn_out o, int64_t n) {
    dep_start();
    using Z = attn_tile_sizes<HD, HPB>;
    constexpr int RS = Z::RS, U = HD / 8, THREADS = ATT_WARPS * WARP * HPB;
    static_assert(HPB * sizeof(attn_tile_merge<HD>) <= Z::ROWS, "the merges where the rows were");
    static_assert(HPB * ATT_TILE <= WARP, "a lane a (token, head)");
    extern __shared__ uint4 tile_mem[];
    uint16_t *keys = reinterpret_cast<uint16_t *>(tile_mem), *vals = keys + ATT_CHUNK * RS;
    float *qs = reinterpret_cast<float *>(reinterpret_cast<char *>(tile_mem) + Z::ROWS);
    int64_t t0 = (int64_t)blockIdx.x * ATT_TILE, h0 = (int64_t)blockIdx.y * HPB;
    int nt = n - t0 < ATT_TILE ? (int)(n - t0) : ATT_TILE;
    int lane = threadIdx.x % WARP, wid = threadIdx.x / WARP, g = lane >> 2, hh = wid / ATT_WARPS;
    int64_t kvh = h0 / (a.n_heads / a.n_kv_heads), s = a.seq[t0];
    int64_t first = a.pos[t0], last = a.pos[t0 + nt - 1], lo = attn_lo(a, first);
    int64_t z = lo / ATT_CHUNK + (int64_t)blockIdx.z, c0 = z * ATT_CHUNK;
    if (c0 > last) return;  // past every token's positions
    const uint16_t *data = static_cast<const uint16_t *>(kv.data);
    for (int u = threadIdx.x; u < ATT_CHUNK * U; u += THREADS) {  // all in flight at once
        int i = u / U;
        int64_t p = attn_nearest(c0 + i, lo, last);
        cp_async16(keys + i * RS + 8 * (u % U), data + kv_at(kv, a, 0, s, p, kvh) + 8 * (u % U));
        cp_async16(vals + i * RS + 8 * (u % U), data + kv_at(kv, a, 1, s, p, kvh) + 8 * (u % U));
    }
    cp_async_commit();
    for (int i = threadIdx.x; i < HPB * ATT_TILE * HD; i += THREADS) {
        int k = i / HD % ATT_TILE;
        qs[i] = k < nt ? qkv[(t0 + k) * ldq + (h0 + i / (ATT_TILE * HD)) * HD + i % HD] : 0.0f;
    }
    cp_async_wait<0>();
    __syncthreads();
    int64_t p0 = c0 + wid % ATT_WARPS * WARP;
    attn_part<HD> r;
    if (p0 <= last && p0 + WARP - 1 >= lo) {
        int vlo[2], vhi[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int row = g + 8 * k;
            vlo[k] = 1, vhi[k] = 0;
            if (row < nt) attn_span(a, first + row, p0, vlo[k], vhi[k]);
        }
        uint32_t qh[HD / 16][4], ql[HD / 16][4];
        const float *q = qs + hh * ATT_TILE * HD;
        attn_q_frags<DT, HD>(q + g * HD, q + (g + 8) * HD, qh, ql);
        const uint16_t *kp = keys + (p0 - c0) * RS;
        auto krow = [&](int i) { return kp + i * RS; };
        attn_part_mma<DT, HD, RS, false>(qh, ql, krow, vals + (p0 - c0) * RS, vlo, vhi, 1.0f / sqrtf((float)HD), r);
    } else {
        r.none();
    }
    __syncthreads();  // every warp done with the rows
    attn_tile_merge<HD> *mgs = reinterpret_cast<attn_tile_merge<HD> *>(tile_mem);
    {
        attn_tile_merge<HD> &mg = mgs[hh];
        int tq = lane & 3, w = wid % ATT_WARPS;
#pragma unroll
        for (int k = 0; k < 2; k++) {
            int row = g + 8 * k;
#pragma unroll
            for (int dn = 0; dn < HD / 8; dn++) {
                mg.wacc[w][row][8 * dn + 2 * tq] = r.o[dn][2 * k];
                mg.wacc[w][row][8 * dn + 2 * tq + 1] = r.o[dn][2 * k + 1];
            }
            if (tq == 0) mg.wm[row][w] = r.m[k], mg.wl[row][w] = r.l[k];
        }
    }
    __syncthreads();
    /* a token's chunk index among its own (-1: not one of its chunks) */
    auto rel = [&](int i) {
        int64_t pos = first + i, z0 = attn_lo(a, pos) / ATT_CHUNK;
        return i < nt && z >= z0 && z <= pos / ATT_CHUNK ? z - z0 : (int64_t)-1;
    };
    if (threadIdx.x < HPB * ATT_TILE) {
        attn_tile_merge<HD> &mg = mgs[threadIdx.x / ATT_TILE];
        int i = threadIdx.x % ATT_TILE;
        attn_weights(mg.wm[i], mg.wl[i], mg.bm[i], mg.bl[i], mg.wf[i]);
    }
    __syncthreads();
    for (int u = threadIdx.x; u < HPB * ATT_TILE * HD; u += THREADS) {
        int k = u / (ATT_TILE * HD), i = u / HD % ATT_TILE, d = u % HD;
        int64_t zi = rel(i);
        if (zi < 0) continue;
        const attn_tile_merge<HD> &mg = mgs[k];
        float *out = attn_part_of(a, o, t0 + i, h0 + k, zi, gridDim.z);
        if (d == 0) out[0] = mg.bm[i], out[1] = mg.bl[i];
        float v = 0.0f;
#pragma unroll
        for (int w = 0; w < ATT_WARPS; w++) v = fmaf(mg.wacc[w][i][d], mg.wf[i][w], v);
        out[2 + d] = v;
    }
    /* the (token, head)s' counts at once (lane k ATT_TILE + i: token i, head h0 + k), then the merges
     * of those whose last chunk this was */
    __shared__ unsigned lasts;
    __threadfence();
    __syncthreads();
    if (wid == 0) {
        bool fin = false;
        int i = lane % ATT_TILE;
        if (lane < HPB * ATT_TILE && rel(i) >= 0) {
            int64_t pos = first + i;
            unsigned *done = o.done + (t0 + i) * a.n_heads + h0 + lane / ATT_TILE;
            fin = atomicAdd(done, 1u) == (unsigned)(pos / ATT_CHUNK - attn_lo(a, pos) / ATT_CHUNK);
            if (fin) *done = 0u;
        }
        unsigned m = __ballot_sync(0xffffffffu, fin);
        if (lane == 0) lasts = m;
    }
    __syncthreads();
    if (!lasts) return;
    __threadfence();
    int k = 0;  // the merges a warp each, in turn
    for (unsigned m = lasts; m; m &= m - 1, k++) {
        if (k % (ATT_WARPS * HPB) != wid) continue;
        int b = __ffs((int)m) - 1, i = b % ATT_TILE;
        int64_t pos = first + i, h = h0 + b / ATT_TILE;
        attn_merge_warp(a, attn_part_of(a, o, t0 + i, h, 0, gridDim.z), t0 + i, h,
                        pos / ATT_CHUNK - attn_lo(a, pos) / ATT_CHUNK + 1, o);
    }
}

/* Token t's head h from its S chunks' parts pp (read past L1: other
 * blocks wrote them), by a whole block: merged in order, then divided by
 * the softmax's sum (with the sink logit's share); with q (a head a whole
 * number of QB blocks), the head also rounded to int8 as k_quantize
 * rounds it. */
/* The merge's max m over token t's head h's S chunks' parts pp and the
 * factor inv its sums are divided by (with the sink logit's share). */
__device__ __forceinline__ void attn_merge_scale(const sp_cuda_attn &a, const float *pp, int64_t h, int64_t S,
                                                 float &m, float &inv) {
    int64_t hd = a.head_dim;
    float l = 0.0f;
    m = -INFINITY;
    for (int64_t i = 0; i < S; i++) m = fmaxf(m, __ldcg(pp + i * (hd + 2)));
    for (int64_t i = 0; i < S; i++)
        l = __fadd_rn(l, __fmul_rn(__ldcg(pp + i * (hd + 2) + 1), expf(__fsub_rn(__ldcg(pp + i * (hd + 2)), m))));
    inv = (float)(1.0 / ((double)l + (a.sinks ? exp((double)a.sinks[h] - (double)m) : 0.0)));
}

/* Dimension d of the merged head. */
__device__ __forceinline__ float attn_merge_dim(const float *pp, int64_t hd, int64_t S, float m, float inv, int64_t d) {
    float v = 0.0f;
    for (int64_t i = 0; i < S; i++)
        v = fmaf(__ldcg(pp + i * (hd + 2) + 2 + d), expf(__fsub_rn(__ldcg(pp + i * (hd + 2)), m)), v);
    return __fmul_rn(v, inv);
}

__device__ void attn_merge(const sp_cuda_attn &a, const float *pp, int64_t t, int64_t h, int64_t S, const attn_out &o) {
    __shared__ __align__(16) float head[SP_CUDA_MAX_HEAD_DIM];
    int64_t hd = a.head_dim;
    float m, inv;
    attn_merge_scale(a, pp, h, S, m, inv);
    for (int64_t d = threadIdx.x; d < hd; d += blockDim.x) {
        float v = attn_merge_dim(pp, hd, S, m, inv, d);
        o.att[t * o.lda + h * hd + d] = v;
        head[d] = v;
    }
    const sp_cuda_qx &q = o.q;
    if (!q.q) return;
    __syncthreads();
    int8_t *qr = q.q + t * q.ldq + h * hd;
    float2 *dr = reinterpret_cast<float2 *>(q.d) + t * q.ldd + h * hd / QB;
    for (int64_t c0 = 0; c0 < hd; c0 += 4 * blockDim.x) {  // whole warps: the blocks' lanes shuffle
        int64_t c = c0 + 4 * threadIdx.x;
        bool in = c < hd;
        quantize4(in ? *reinterpret_cast<const float4 *>(head + c) : make_float4(0.0f, 0.0f, 0.0f, 0.0f), in,
                  qr + c / QB * QB, dr + c / QB);
    }
}

/* attn_merge by one warp (heads of at most 128, a lane 4 dimensions): the
 * same values, and the same rounding (a lane's 4 values as attn_merge's
 * thread 4 c holds them). */
__device__ void attn_merge_warp(const sp_cuda_attn &a, const float *pp, int64_t t, int64_t h, int64_t S,
                                const attn_out &o) {
    int64_t hd = a.head_dim, c = 4 * (threadIdx.x % WARP);
    float m, inv;
    attn_merge_scale(a, pp, h, S, m, inv);
    bool in = c < hd;
    float v[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    if (in)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            v[k] = attn_merge_dim(pp, hd, S, m, inv, c + k);
            o.att[t * o.lda + h * hd + c + k] = v[k];
        }
    const sp_cuda_qx &q = o.q;
    if (!q.q) return;
    quantize4(make_float4(v[0], v[1], v[2], v[3]), in, q.q + t * q.ldq + h * hd + c / QB * QB,
              reinterpret_cast<float2 *>(q.d) + t * q.ldd + h * hd / QB + c / QB);
}

}  // namespace

/* ---- launchers ---- */

extern "C" int sp_cuda_linear(const struct sp_cuda_weight *w, const float *x, int64_t ldx, float *y, int64_t ldy,
                              int64_t n, void *stream) {
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (w->rows <= 0 || n <= 0) return 0;
    for (int64_t t0 = 0; t0 < n; t0 += (int64_t)MAX_GRID_Y * TOKENS) {
        int64_t m = n - t0 < (int64_t)MAX_GRID_Y * TOKENS ? n - t0 : (int64_t)MAX_GRID_Y * TOKENS;
        const float *xs = x + t0 * ldx;
        float *ys = y + t0 * ldy;
        int err;
        if (w->transposed) {
            dim3 grid((unsigned)((w->rows + COL_THREADS - 1) / COL_THREADS), (unsigned)((m + TOKENS - 1) / TOKENS));
            if (w->elem == SP_CUDA_F32) launch(k_cols<SP_CUDA_F32>, grid, COL_THREADS, s, *w, xs, ldx, ys, ldy, m);
            else if (w->elem == SP_CUDA_F16) launch(k_cols<SP_CUDA_F16>, grid, COL_THREADS, s, *w, xs, ldx, ys, ldy, m);
            else launch(k_cols<SP_CUDA_BF16>, grid, COL_THREADS, s, *w, xs, ldx, ys, ldy, m);
            err = (int)cudaGetLastError();
        } else if (sp_cuda_vec_ok(w)) {
            int nt = vec_tokens(m);
            bool xvec = aligned16(xs) && ldx % 4 == 0;
            err = vdispatch(*w, nt, vrows_launch<facts>{w, {xs, ldx, xvec}, ys, ldy, m, s});
        } else {
            err = dispatch(*w, rows_launch{w, xs, ldx, ys, ldy, m, s});
        }
        if (err) return err;
    }
    return 0;
}

extern "C" bool sp_cuda_vec_ok(const struct sp_cuda_weight *w) {
    if (w->transposed || !aligned16(w->codes)) return false;
    switch (w->fmt) {
    case SP_CUDA_FMT_FLOAT: return (w->elem == SP_CUDA_F16 || w->elem == SP_CUDA_BF16) && w->cols % 8 == 0;
    case SP_CUDA_FMT_MXFP4: return w->group > 0 && w->group % 32 == 0 && w->cols % w->group == 0;
    case SP_CUDA_FMT_AFFINE:
        return (w->bits == 4 || w->bits == 8) && w->group > 0 && w->group % (128 / w->bits) == 0 &&
               w->cols % w->group == 0;
    default: return false;
    }
}

extern "C" bool sp_cuda_q_ok(const struct sp_cuda_weight *w) {
    return sp_cuda_vec_ok(w) && (w->fmt == SP_CUDA_FMT_MXFP4 || (w->fmt == SP_CUDA_FMT_AFFINE && w->bits == 4));
}

extern "C" int sp_cuda_quantize(const float *x, int64_t ldx, int64_t n, int64_t cols, const struct sp_cuda_qx *q,
                                void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    if (cols % SP_CUDA_QBLOCK || q->ldq % 16 || q->ldq < cols || q->ldd < cols / SP_CUDA_QBLOCK)
        return (int)cudaErrorInvalidValue;
    int64_t lanes = n * (cols / QB) * QLANES;
    launch(k_quantize, (unsigned)((lanes + QUANT_WARPS * WARP - 1) / (QUANT_WARPS * WARP)), QUANT_WARPS * WARP,
           static_cast<cudaStream_t>(stream), x, ldx, n, cols, q->q, reinterpret_cast<float2 *>(q->d), q->ldq, q->ldd);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_linear_q(const struct sp_cuda_weight *w, const struct sp_cuda_qx *x, float *y, int64_t ldy,
                                int64_t n, void *stream) {
    if (w->rows <= 0 || n <= 0) return 0;
    if (!sp_cuda_q_ok(w)) return (int)cudaErrorInvalidValue;
    for (int64_t t0 = 0; t0 < n; t0 += (int64_t)MAX_GRID_Y * TOKENS) {
        int64_t m = n - t0 < (int64_t)MAX_GRID_Y * TOKENS ? n - t0 : (int64_t)MAX_GRID_Y * TOKENS;
        qacts a = qacts_of(*x);
        a.q += t0 * a.ldq, a.d += t0 * a.ldd;
        int err = vdispatch(*w, sp_cuda_mlp_tokens(m, sp_cuda_mma_ok(w)),
                            vrows_launch<qacts>{w, a, y + t0 * ldy, ldy, m, static_cast<cudaStream_t>(stream)});
        if (err) return err;
    }
    return 0;
}

extern "C" int sp_cuda_mlp_tokens(int64_t n, bool mma) { return mma && n >= MMA_TOKENS ? MMA_TOKENS : vec_tokens(n); }

extern "C" int64_t sp_cuda_mlp_blocks(bool down, int64_t outputs, int64_t n, int nt) {
    int64_t per = nt == MMA_TOKENS ? (down ? MMA_ROWS : MMA_ROWS / 2) : down ? VR * VWARPS : VR / 2 * VWARPS;
    return (outputs + per - 1) / per * ((n + nt - 1) / nt);
}

extern "C" int sp_cuda_mlp_gate_up(const struct sp_cuda_weight *w, bool fused, const struct sp_cuda_mlp_item *items,
                                   int n_items, int64_t blocks, int nt, bool xvec, const struct sp_cuda_qx *xq, float *h,
                                   int64_t ldh, float alpha, float limit, float u_offset, void *stream) {
    if (n_items <= 0 || blocks <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (xq)
        return sp_cuda_q_ok(w) ? vdispatch(*w, nt,
                                           gate_up_launch<qacts>{w, items, n_items, blocks, fused, qacts_of(*xq), h,
                                                                 ldh, alpha, limit, u_offset, s})
                               : (int)cudaErrorInvalidValue;
    return vdispatch(*w, nt,
                     gate_up_launch<facts>{w, items, n_items, blocks, fused, {nullptr, 0, xvec}, h, ldh, alpha, limit,
                                           u_offset, s});
}

extern "C" int sp_cuda_mlp_down(const struct sp_cuda_weight *w, const struct sp_cuda_mlp_item *items, int n_items,
                                int64_t blocks, int nt, const float *h, int64_t ldh, const struct sp_cuda_qx *hq,
                                float *out, int64_t ldo, void *stream) {
    if (n_items <= 0 || blocks <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (hq)
        return sp_cuda_q_ok(w) ? vdispatch(*w, nt, down_launch<qacts>{w, items, n_items, blocks, qacts_of(*hq), out, ldo, s})
                               : (int)cudaErrorInvalidValue;
    bool xvec = aligned16(h) && ldh % 4 == 0;
    return vdispatch(*w, nt, down_launch<facts>{w, items, n_items, blocks, {h, ldh, xvec}, out, ldo, s});
}

extern "C" int sp_cuda_embed(const struct sp_cuda_weight *w, const int32_t *tokens, int64_t n, float *x, int64_t ldx,
                             void *stream) {
    if (n <= 0) return 0;
    return dispatch(*w, embed_launch{w, tokens, n, x, ldx, static_cast<cudaStream_t>(stream)});
}

extern "C" int sp_cuda_rope_table(const int32_t *pos, int64_t n, const float *inv_freq, int64_t rot, float scale,
                                  float *cs, void *stream) {
    int64_t k = n * (rot / 2);
    if (k <= 0) return 0;
    launch(k_rope_table, (unsigned)((k + 255) / 256), 256, static_cast<cudaStream_t>(stream), pos, n, inv_freq, rot / 2,
           scale, cs);
    return (int)cudaGetLastError();
}

/* The rounding's buffers for k_rmsnorm (q.q NULL: none); false where its rows are not whole blocks. */
static bool norm_q(const struct sp_cuda_qx *q, int64_t cols, sp_cuda_qx *out) {
    *out = q ? *q : sp_cuda_qx{nullptr, nullptr, 0, 0};
    return !q || (cols % QB == 0 && q->ldq % 16 == 0 && q->ldq >= cols && q->ldd >= cols / QB);
}

extern "C" int sp_cuda_rmsnorm(const float *x, int64_t ldx, const int32_t *rows, const float *w, float eps, float *out,
                               int64_t ldo, int64_t n, int64_t cols, const struct sp_cuda_qx *q, void *stream) {
    if (n <= 0) return 0;
    sp_cuda_qx qx;
    if (!norm_q(q, cols, &qx)) return (int)cudaErrorInvalidValue;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    /* x is only read without a residual */
    launch(k_rmsnorm, (unsigned)n, NORM_THREADS, s, const_cast<float *>(x), ldx, rows, nullptr, 0, false, w, eps, out,
           ldo, cols, qx);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_add_rmsnorm(float *x, int64_t ldx, float *r, int64_t ldr, bool zero_r, const float *w,
                                   float eps, float *out, int64_t ldo, int64_t n, int64_t cols,
                                   const struct sp_cuda_qx *q, void *stream) {
    if (n <= 0) return 0;
    sp_cuda_qx qx;
    if (!norm_q(q, cols, &qx)) return (int)cudaErrorInvalidValue;
    launch(k_rmsnorm, (unsigned)n, NORM_THREADS, static_cast<cudaStream_t>(stream), x, ldx, nullptr, r, ldr, zero_r, w,
           eps, out, ldo, cols, qx);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_gather_q(const struct sp_cuda_qx *dst, const struct sp_cuda_qx *src, const int32_t *rows,
                                int64_t n, int64_t cols, void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    if (cols % QB || dst->ldq % 16 || src->ldq % 16) return (int)cudaErrorInvalidValue;
    launch(k_gather_q, (unsigned)n, 128, static_cast<cudaStream_t>(stream), *dst, *src, rows, cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_sum_parts(float *out, int64_t ldo, const struct sp_cuda_parts *p, int64_t n, int64_t cols,
                                 void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    if (p->n < 1 || p->n > SP_CUDA_PARTS_MAX) return (int)cudaErrorInvalidValue;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        sp_cuda_parts q = *p;
        for (int j = 0; j < q.n; j++) q.part[j] += r0 * cols;
        dim3 grid((unsigned)((cols + 255) / 256), (unsigned)m);
        launch(k_sum_parts, grid, 256, static_cast<cudaStream_t>(stream), out + r0 * ldo, ldo, q, cols);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

extern "C" int sp_cuda_add(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t cols,
                           void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        dim3 grid((unsigned)((cols + 255) / 256), (unsigned)m);
        launch(k_add, grid, 256, static_cast<cudaStream_t>(stream), dst + r0 * ldd, ldd, src + r0 * lds, lds, cols);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

extern "C" int sp_cuda_glu(float *out, int64_t ldo, const float *g, const float *u, int64_t lds, int64_t n, int64_t w,
                           float alpha, float limit, float u_offset, void *stream) {
    if (n <= 0 || w <= 0) return 0;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        dim3 grid((unsigned)((w + 255) / 256), (unsigned)m);
        launch(k_glu, grid, 256, static_cast<cudaStream_t>(stream), out + r0 * ldo, ldo, g + r0 * lds,
               u ? u + r0 * lds : nullptr, lds, w, alpha, limit, u_offset);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

extern "C" int sp_cuda_gather(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int64_t n,
                              int64_t cols, void *stream) {
    if (n <= 0) return 0;
    if (cols <= 0) return 0;
    dim3 grid((unsigned)n, (unsigned)((cols + MOVE_THREADS - 1) / MOVE_THREADS));
    launch(k_gather, grid, MOVE_THREADS, static_cast<cudaStream_t>(stream), dst, ldd, src, lds, rows, cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_scatter_add(float *out, int64_t ldo, const float *src, int64_t lds, const int32_t *off,
                                   const int32_t *list, const float *w, int64_t n, int64_t cols, void *stream) {
    if (n <= 0) return 0;
    if (cols <= 0) return 0;
    dim3 grid((unsigned)n, (unsigned)((cols + MOVE_THREADS - 1) / MOVE_THREADS));
    launch(k_scatter_add, grid, MOVE_THREADS, static_cast<cudaStream_t>(stream), out, ldo, src, lds, off, list, w,
           cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_attn_prologue(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, float *qkv,
                                     int64_t ldq, int64_t n, void *stream) {
    if (n <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    dim3 grid((unsigned)n, (unsigned)((a->n_heads + a->n_kv_heads + PRO_WARPS - 1) / PRO_WARPS));
    if (kv->dt == SP_CUDA_F32) launch(k_prologue<SP_CUDA_F32>, grid, PRO_WARPS * WARP, s, *a, *kv, qkv, ldq);
    else if (kv->dt == SP_CUDA_F16) launch(k_prologue<SP_CUDA_F16>, grid, PRO_WARPS * WARP, s, *a, *kv, qkv, ldq);
    else launch(k_prologue<SP_CUDA_BF16>, grid, PRO_WARPS * WARP, s, *a, *kv, qkv, ldq);
    return (int)cudaGetLastError();
}

namespace {
template <class A>
struct heads_launch {
    const sp_cuda_weight *w;
    qkv_parts qp;
    A a;
    float *y;
    int64_t ldy, n;
    sp_cuda_attn at;
    sp_cuda_kv kv;
    unsigned *done;
    cudaStream_t s;
    template <int K, int BITS, int SDT, int NT>
    int go() const {
        if constexpr (NT == MMA_TOKENS || !reads<K, BITS, A>()) return (int)cudaErrorInvalidValue;
        else {
            dim3 grid((unsigned)((at.n_heads + 2 * at.n_kv_heads) * at.head_dim / VR), (unsigned)((n + NT - 1) / NT));
            if (kv.dt == SP_CUDA_F32)
                launch(k_vrows_heads<K, BITS, SDT, NT, A, SP_CUDA_F32>, grid, VWARPS * WARP, s, *w, qp, a, y, ldy, n,
                       at, kv, done);
            else if (kv.dt == SP_CUDA_F16)
                launch(k_vrows_heads<K, BITS, SDT, NT, A, SP_CUDA_F16>, grid, VWARPS * WARP, s, *w, qp, a, y, ldy, n,
                       at, kv, done);
            else
                launch(k_vrows_heads<K, BITS, SDT, NT, A, SP_CUDA_BF16>, grid, VWARPS * WARP, s, *w, qp, a, y, ldy, n,
                       at, kv, done);
            return (int)cudaGetLastError();
        }
    }
};

struct split_ok {
    const sp_cuda_weight *w;
    template <int K, int BITS, int SDT, int NT>
    int go() const { return vsplit<K, BITS>(*w); }
};
}  // namespace

extern "C" bool sp_cuda_same_format(const struct sp_cuda_weight *a, const struct sp_cuda_weight *b) {
    return a->fmt == b->fmt && a->elem == b->elem && a->bits == b->bits && a->group == b->group &&
           (a->fmt != SP_CUDA_FMT_AFFINE || a->scale_dt == b->scale_dt) && !a->bias == !b->bias &&
           (!a->bias || a->bias_dt == b->bias_dt) && a->cols == b->cols;
}

extern "C" bool sp_cuda_linear_heads_ok(const struct sp_cuda_weight *w, int parts, bool int8,
                                        const struct sp_cuda_attn *a, int64_t n) {
    int64_t hd = a->head_dim, q = a->n_heads * hd, kv = a->n_kv_heads * hd;
    if (n < 1 || n >= MMA_TOKENS || hd > HEADS_MAX_DIM || hd % VR || a->rot > hd || (parts != 1 && parts != 3))
        return false;
    if (parts == 1 ? w[0].rows != q + 2 * kv : w[0].rows != q || w[1].rows != kv || w[2].rows != kv) return false;
    for (int i = 0; i < parts; i++) {
        const sp_cuda_weight &p = w[i];
        if (!sp_cuda_same_format(&p, &w[0]) || !sp_cuda_vec_ok(&p) || (int8 && !sp_cuda_q_ok(&p)) ||
            vdispatch(p, 1, split_ok{&p}) != 1)
            return false;
    }
    return true;
}

extern "C" int sp_cuda_linear_heads(const struct sp_cuda_weight *w, int parts, const float *x, int64_t ldx,
                                    const struct sp_cuda_qx *xq, float *qkv, int64_t ldq, int64_t n,
                                    const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, unsigned *done,
                                    void *stream) {
    if (!sp_cuda_linear_heads_ok(w, parts, xq != NULL, a, n)) return (int)cudaErrorInvalidValue;
    qkv_parts qp = {};
    qp.n = parts;
    for (int i = 0; i < parts; i++) {
        qp.codes[i] = w[i].codes, qp.scales[i] = w[i].scales, qp.biases[i] = w[i].biases, qp.bias[i] = w[i].bias;
        qp.rows[i] = w[i].rows;
    }
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int nt = vec_tokens(n);
    if (xq) return vdispatch(*w, nt, heads_launch<qacts>{w, qp, qacts_of(*xq), qkv, ldq, n, *a, *kv, done, s});
    return vdispatch(*w, nt,
                     heads_launch<facts>{w, qp, {x, ldx, aligned16(x) && ldx % 4 == 0}, qkv, ldq, n, *a, *kv, done, s});
}

extern "C" int sp_cuda_argmax(const float *x, int64_t ldx, int64_t n, int64_t cols, uint64_t *best, void *stream) {
    if (n <= 0) return 0;
    if (cols <= 0 || cols > (int64_t)UINT32_MAX || n > MAX_GRID_Y) return (int)cudaErrorInvalidValue;
    static_assert(sizeof(uint64_t) == sizeof(unsigned long long), "the packed candidates are 64-bit words");
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    cudaError_t e = cudaMemsetAsync(best, 0, (size_t)n * sizeof *best, s);
    if (e != cudaSuccess) return (int)e;
    dim3 grid((unsigned)((cols + ARGMAX_SPAN - 1) / ARGMAX_SPAN), (unsigned)n);
    launch(k_argmax, grid, ARGMAX_THREADS, s, x, ldx, cols, reinterpret_cast<unsigned long long *>(best));
    return (int)cudaGetLastError();
}

extern "C" int64_t sp_cuda_top_k_scratch(int64_t cols) {
    return 2 * ((cols + TOPK_SPAN - 1) / TOPK_SPAN) * SP_CUDA_TOP_K_MAX;
}

extern "C" int sp_cuda_top_k(const float *x, int64_t ldx, int64_t n, int64_t cols, int k, uint64_t *scratch,
                             uint64_t *best, void *stream) {
    if (n <= 0) return 0;
    if (k < 1 || k > SP_CUDA_TOP_K_MAX || k > cols || cols > (int64_t)UINT32_MAX || n > MAX_GRID_Y)
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int lists = (int)((cols + TOPK_SPAN - 1) / TOPK_SPAN), per = TOPK_SPAN / k;
    /* ping-pong halves of scratch, n rows of at most `lists` lists each; the last round into best */
    unsigned long long *a = reinterpret_cast<unsigned long long *>(scratch), *b = a + n * (int64_t)lists * k;
    unsigned long long *to = lists == 1 ? reinterpret_cast<unsigned long long *>(best) : a;
    int e = launch(k_topk_span, dim3((unsigned)lists, (unsigned)n), TOPK_THREADS, s, x, ldx, cols, k, to);
    while (e == 0 && lists > 1) {
        int groups = (lists + per - 1) / per;
        unsigned long long *from = to;
        to = groups == 1 ? reinterpret_cast<unsigned long long *>(best) : from == a ? b : a;
        e = launch(k_topk_merge, dim3((unsigned)groups, (unsigned)n), TOPK_THREADS, s, from, lists, per, k, to);
        lists = groups;
    }
    return e ? e : (int)cudaGetLastError();
}

namespace {
/* f.template go<V>() with V the experts a lane of the routing holds. */
template <class F>
int by_experts(int64_t n_experts, const F &f) {
    int64_t per_lane = (n_experts + WARP - 1) / WARP;
    if (per_lane <= 1) return f.template go<1>();
    if (per_lane <= 2) return f.template go<2>();
    if (per_lane <= 4) return f.template go<4>();
    if (per_lane <= 8) return f.template go<8>();
    if (per_lane <= 16) return f.template go<16>();
    return f.template go<32>();
}

struct moe_group_launch {
    const sp_cuda_route *r;
    const float *logits;
    int64_t ldl;
    int32_t *sel;
    float *w;
    int64_t n;
    const sp_cuda_mlp_item *table;
    const uint8_t *own;
    bool shared;
    const float *gath;
    int64_t ldx;
    bool one_row;
    int nt;
    int64_t jblocks, rblocks, max_items;
    sp_cuda_mlp_item *items;
    int32_t *rows;
    float *ew;
    int32_t *toff, *tlist;
    cudaStream_t s;
    template <int V>
    int go() const {
        bool here = n <= GROUP_ROUTE_MAX && V <= GROUP_ROUTE_V;
        if (!here)
            launch(k_route<V>, (unsigned)((n + ROUTE_WARPS - 1) / ROUTE_WARPS), ROUTE_WARPS * WARP, s, *r, logits, ldl,
                   n, sel, w);
        launch(k_moe_group<V>, 1, GROUP_THREADS, s, *r, logits, ldl, here, sel, w, (int)n, table, own, shared, gath,
               ldx, one_row, nt, jblocks, rblocks, (int)max_items, items, rows, ew, toff, tlist);
        return (int)cudaGetLastError();
    }
};
}  // namespace

extern "C" int sp_cuda_moe_group(const struct sp_cuda_route *r, const float *logits, int64_t ldl, int32_t *sel,
                                 float *w, int64_t n, const struct sp_cuda_mlp_item *table, const uint8_t *own,
                                 bool shared, const float *gath, int64_t ldx, bool one_row, int nt, int64_t jblocks,
                                 int64_t rblocks, int64_t max_items, struct sp_cuda_mlp_item *items, int32_t *rows,
                                 float *ew, int32_t *toff, int32_t *tlist, void *stream) {
    if (n <= 0) return 0;
    if (r->n_experts > SP_CUDA_ROUTE_MAX_EXPERTS || r->k > SP_CUDA_ROUTE_MAX_K || r->k > r->n_experts ||
        r->n_group > r->n_experts || n * (r->k + (shared ? 1 : 0)) > SP_CUDA_MOE_MAX_PAIRS || (one_row && n != 1))
        return (int)cudaErrorInvalidValue;
    if (n == 1 && one_row) {
        unsigned threads = (unsigned)((r->n_experts + WARP - 1) / WARP * WARP);
        launch(k_moe_one, 1, threads, static_cast<cudaStream_t>(stream), *r, logits, sel, w, table, own, shared, gath,
               ldx, jblocks, rblocks, (int)max_items, items, rows, ew, toff, tlist);
        return (int)cudaGetLastError();
    }
    moe_group_launch l = {r, logits, ldl, sel, w, n, table, own, shared, gath, ldx, one_row, nt, jblocks, rblocks,
                          max_items, items, rows, ew, toff, tlist, static_cast<cudaStream_t>(stream)};
    return by_experts(r->n_experts, l);
}

extern "C" void sp_cuda_set_device(int major, bool overlap_on) {
    overlap = overlap_on && major >= 9;
    tensor_cores = major >= 8;
}

extern "C" bool sp_cuda_mma_ok(const struct sp_cuda_weight *w) { return tensor_cores && sp_cuda_q_ok(w); }

extern "C" int64_t sp_cuda_attn_chunks(int64_t positions) { return (positions + ATT_CHUNK - 1) / ATT_CHUNK; }

namespace {
/* k_attn's path for a 16-bit cache and head_dim 64, 128 or 256 (64 and 128: without tensor cores). */
template <int DT>
int attn_fast(int hd, dim3 grid, cudaStream_t s, const sp_cuda_attn &a, const sp_cuda_kv &kv, const float *q,
              int64_t ldq, const attn_out &o) {
    if (hd == 64) launch(k_attn<DT, 2>, grid, ATT_WARPS * WARP, s, a, kv, q, ldq, o);
    else if (hd == 128) launch(k_attn<DT, 4>, grid, ATT_WARPS * WARP, s, a, kv, q, ldq, o);
    else launch(k_attn<DT, 8>, grid, ATT_WARPS * WARP, s, a, kv, q, ldq, o);
    return (int)cudaGetLastError();
}

/* k_attn_mma, heads of 64 or 128. */
template <int DT>
int attn_mma(int hd, dim3 grid, cudaStream_t s, const sp_cuda_attn &a, const sp_cuda_kv &kv, const float *q,
             int64_t ldq, const attn_out &o) {
    if (hd == 64) launch(k_attn_mma<DT, 64>, grid, ATT_WARPS * WARP, s, a, kv, q, ldq, o);
    else launch(k_attn_mma<DT, 128>, grid, ATT_WARPS * WARP, s, a, kv, q, ldq, o);
    return (int)cudaGetLastError();
}

/* k_attn_tile for m tokens (grid.x: ATT_TILE a block; grid.y: the heads), heads of HD: two heads a block
 * where a KV head's group of query heads is even. */
template <int DT, int HD, int HPB>
int attn_tiled(dim3 grid, cudaStream_t s, const sp_cuda_attn &a, const sp_cuda_kv &kv, const float *q, int64_t ldq,
               const attn_out &o, int64_t m) {
    constexpr size_t bytes = attn_tile_sizes<HD, HPB>::BYTES;
    if (int e = raise_smem<k_attn_tile<DT, HD, HPB>>(bytes)) return e;
    grid.y /= HPB;
    launch_smem(k_attn_tile<DT, HD, HPB>, grid, ATT_WARPS * WARP * HPB, bytes, s, a, kv, q, ldq, o, m);
    return (int)cudaGetLastError();
}

template <int DT, int HD>
int attn_tiled(dim3 grid, cudaStream_t s, const sp_cuda_attn &a, const sp_cuda_kv &kv, const float *q, int64_t ldq,
               const attn_out &o, int64_t m) {
    return (a.n_heads / a.n_kv_heads) % 2 == 0 ? attn_tiled<DT, HD, 2>(grid, s, a, kv, q, ldq, o, m)
                                                : attn_tiled<DT, HD, 1>(grid, s, a, kv, q, ldq, o, m);
}

template <int DT>
int attn_tiled(int hd, dim3 grid, cudaStream_t s, const sp_cuda_attn &a, const sp_cuda_kv &kv, const float *q,
               int64_t ldq, const attn_out &o, int64_t m) {
    return hd == 64 ? attn_tiled<DT, 64>(grid, s, a, kv, q, ldq, o, m)
                    : attn_tiled<DT, 128>(grid, s, a, kv, q, ldq, o, m);
}
}  // namespace

extern "C" int sp_cuda_attention(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, const float *qkv,
                                 int64_t ldq, float *att, int64_t lda, int64_t n, int64_t max_visible, float *part,
                                 int64_t part_floats, unsigned *done, const struct sp_cuda_qx *qo, bool one_run,
                                 void *stream) {
    if (n <= 0) return 0;
    int hd = (int)a->head_dim;
    bool fast = kv->dt != SP_CUDA_F32 && (hd == 64 || hd == 128 || hd == 256);
    bool mma = fast && hd != 256 && tensor_cores;
    /* chunks a token spans: on tensor cores they start at multiples of ATT_CHUNK, so a window's
     * positions may reach into one chunk more, and a tile's tokens' windows start up to ATT_TILE - 1
     * apart */
    int64_t zmax = sp_cuda_attn_chunks(max_visible);
    if (mma && a->window > 0) zmax = sp_cuda_attn_chunks(max_visible + ATT_TILE - 1) + 1;
    int64_t row = a->n_heads * zmax * (a->head_dim + 2);
    if (a->head_dim > SP_CUDA_MAX_HEAD_DIM || zmax <= 0 || zmax > 65535 || row > part_floats ||
        (qo && a->head_dim % QB))
        return (int)cudaErrorInvalidValue;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int64_t slice = part_floats / row;  // tokens whose chunks fit part at once
    for (int64_t t0 = 0; t0 < n; t0 += slice) {
        int err = 0;
        int64_t m = n - t0 < slice ? n - t0 : slice;
        sp_cuda_attn as = *a;
        as.pos += t0, as.seq += t0;
        const float *q = qkv + t0 * ldq;
        dim3 grid((unsigned)m, (unsigned)a->n_heads, (unsigned)zmax);
        bool tiled = one_run && m >= ATT_TILE && mma;
        attn_out o = {part, done, att + t0 * lda, lda, {}};
        if (qo) {  // its rows from t0 on
            o.q = *qo;
            o.q.q += t0 * o.q.ldq;
            o.q.d += 2 * t0 * o.q.ldd;
        }
        if (tiled) {
            dim3 tgrid((unsigned)((m + ATT_TILE - 1) / ATT_TILE), grid.y, grid.z);
            err = kv->dt == SP_CUDA_F16 ? attn_tiled<SP_CUDA_F16>(hd, tgrid, s, as, *kv, q, ldq, o, m)
                                        : attn_tiled<SP_CUDA_BF16>(hd, tgrid, s, as, *kv, q, ldq, o, m);
        } else if (kv->dt == SP_CUDA_F32)
            launch(k_attn<SP_CUDA_F32, 0>, grid, ATT_WARPS * WARP, s, as, *kv, q, ldq, o);
        else if (!fast && kv->dt == SP_CUDA_F16)
            launch(k_attn<SP_CUDA_F16, 0>, grid, ATT_WARPS * WARP, s, as, *kv, q, ldq, o);
        else if (!fast) launch(k_attn<SP_CUDA_BF16, 0>, grid, ATT_WARPS * WARP, s, as, *kv, q, ldq, o);
        else if (mma)
            err = kv->dt == SP_CUDA_F16 ? attn_mma<SP_CUDA_F16>(hd, grid, s, as, *kv, q, ldq, o)
                                        : attn_mma<SP_CUDA_BF16>(hd, grid, s, as, *kv, q, ldq, o);
        else if (kv->dt == SP_CUDA_F16) err = attn_fast<SP_CUDA_F16>(hd, grid, s, as, *kv, q, ldq, o);
        else err = attn_fast<SP_CUDA_BF16>(hd, grid, s, as, *kv, q, ldq, o);
        if (!err) err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

/* ---- gates and Gated DeltaNet ---- */

__global__ void k_gate(float *x, int64_t ldx, const float *g, int64_t ldg, int64_t cols, bool one) {
    dep_start();
    int64_t r = blockIdx.y, i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= cols) return;
    float gv = g[r * ldg + (one ? 0 : i)];
    x[r * ldx + i] *= 1.0f / (1.0f + expf(-gv));
}

extern "C" int sp_cuda_gate(float *x, int64_t ldx, const float *g, int64_t ldg, int64_t n, int64_t cols, bool one,
                            void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        dim3 grid((unsigned)((cols + 255) / 256), (unsigned)m);
        launch(k_gate, grid, 256, static_cast<cudaStream_t>(stream), x + r0 * ldx, ldx, g + r0 * ldg, ldg, cols, one);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

__device__ __forceinline__ float silu_f(float x) { return x / (1.0f + expf(-x)); }

/* A sequence's state of this layer in slot `slot` (snapshots after the sequences'). */
__device__ __forceinline__ float *state_slot(const sp_cuda_states &st, int64_t slot) {
    return st.state + slot * st.state_floats;
}

/* The causal conv and SiLU, a thread per channel, tokens in batch order. */
__global__ void k_delta_conv(sp_cuda_delta d, float *qkv, int64_t ldq, int64_t n) {
    dep_start();
    int64_t C = 2 * d.k_heads * d.k_dim + d.v_heads * d.v_dim, ch = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (ch >= C) return;
    int K = (int)d.conv;
    const float *w = d.conv_w + ch * K;
    for (int64_t t = 0; t < n; t++) {
        float *st = state_slot(d.st, d.st.seq[t]);
        bool fresh = d.st.pos[t] == 0;
        float in = qkv[t * ldq + ch], acc = w[K - 1] * in;
        for (int i = 0; i < K - 1; i++) {
            float prev = fresh ? 0.0f : st[i * C + ch];
            acc += w[i] * prev;
            st[i * C + ch] = i + 1 < K - 1 ? (fresh ? 0.0f : st[(i + 1) * C + ch]) : in;
        }
        qkv[t * ldq + ch] = silu_f(acc);
        if (d.st.snapshot && d.st.snapshot[t]) {
            float *snap = state_slot(d.st, d.st.n_seq + d.st.seq[t]);
            for (int i = 0; i < K - 1; i++) snap[i * C + ch] = st[i * C + ch];
        }
    }
}

/* Sum over the block (a multiple of WARP threads) in a fixed order; every thread gets it. */
__device__ float block_sum_f(float v, float *red) {
    v = warp_sum(v);
    __syncthreads();  // red is free again
    if ((threadIdx.x & (WARP - 1)) == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    float s = 0;
    for (int i = 0; i < (int)(blockDim.x / WARP); i++) s += red[i];
    return s;
}

/* The delta rule of one value head (a block; thread j keeps column j of
 * the state), tokens in batch order, then the gated norm into out. From
 * the old state S: u = beta (v - decay S^T k), o = decay S^T q + u (k.q),
 * then S = decay S + k u^T. */
__global__ void k_delta_heads(sp_cuda_delta d, const float *qkv, int64_t ldq, const float *z, int64_t ldz,
                              const float *ba, int64_t ldba, float *out, int64_t ldo, int64_t n) {
    dep_start();
    extern __shared__ float sh[];
    float *sq = sh, *sk = sh + d.k_dim, *red = sh + 2 * d.k_dim;
    int64_t h = blockIdx.x, Dk = d.k_dim, Dv = d.v_dim, kh = h / (d.v_heads / d.k_heads), j = threadIdx.x;
    int64_t C = 2 * d.k_heads * Dk + d.v_heads * Dv, conv_floats = (d.conv - 1) * C;
    float qscale = rsqrtf((float)Dk);
    for (int64_t t = 0; t < n; t++) {
        const float *x = qkv + t * ldq;
        for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
            sq[i] = x[kh * Dk + i];
            sk[i] = x[d.k_heads * Dk + kh * Dk + i];
        }
        __syncthreads();
        float pq = 0, pk = 0, pkq = 0;
        for (int64_t i = threadIdx.x; i < Dk; i += blockDim.x) {
            pq += sq[i] * sq[i];
            pk += sk[i] * sk[i];
            pkq += sk[i] * sq[i];
        }
        float ssq = block_sum_f(pq, red), ssk = block_sum_f(pk, red), skq = block_sum_f(pkq, red);
        float rq = qscale / sqrtf(ssq + 1e-6f), rk = 1.0f / sqrtf(ssk + 1e-6f), kq = skq * rq * rk;
        float beta = 1.0f / (1.0f + expf(-ba[t * ldba + h]));
        float a = ba[t * ldba + d.v_heads + h] + d.dt_bias[h];
        float decay = expf(-expf(d.a_log[h]) * (a > 20.0f ? a : log1pf(expf(a))));
        float *S = state_slot(d.st, d.st.seq[t]) + conv_floats + h * Dk * Dv;
        float o = 0;
        if (j < Dv) {
            if (d.st.pos[t] == 0)
                for (int64_t i = 0; i < Dk; i++) S[i * Dv + j] = 0.0f;
            float ak = 0, aq = 0;
            for (int64_t i = 0; i < Dk; i++) {
                float s = S[i * Dv + j];
                ak += s * sk[i];
                aq += s * sq[i];
            }
            float u = (x[2 * d.k_heads * Dk + h * Dv + j] - decay * ak * rk) * beta;
            o = decay * aq * rq + u * kq;
            for (int64_t i = 0; i < Dk; i++) S[i * Dv + j] = decay * S[i * Dv + j] + sk[i] * rk * u;
            if (d.st.snapshot && d.st.snapshot[t]) {
                float *snap = state_slot(d.st, d.st.n_seq + d.st.seq[t]) + conv_floats + h * Dk * Dv;
                for (int64_t i = 0; i < Dk; i++) snap[i * Dv + j] = S[i * Dv + j];
            }
        }
        float ss = block_sum_f(j < Dv ? o * o : 0.0f, red);
        if (j < Dv) {
            float r = 1.0f / sqrtf(ss / (float)Dv + d.eps);
            out[t * ldo + h * Dv + j] = d.norm[j] * (o * r) * silu_f(z[t * ldz + h * Dv + j]);
        }
        __syncthreads();  // sq / sk are read again for the next token
    }
}

extern "C" int sp_cuda_gated_delta(const struct sp_cuda_delta *d, float *qkv, int64_t ldq, const float *z, int64_t ldz,
                                   const float *ba, int64_t ldba, float *out, int64_t ldo, int64_t n, void *stream) {
    if (n <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int64_t C = 2 * d->k_heads * d->k_dim + d->v_heads * d->v_dim;
    launch(k_delta_conv, (unsigned)((C + 127) / 128), 128, s, *d, qkv, ldq, n);
    int err = (int)cudaGetLastError();
    if (err) return err;
    int threads = (int)((d->v_dim + WARP - 1) / WARP * WARP);
    size_t smem = (size_t)(2 * d->k_dim + WARP) * sizeof(float);
    launch_smem(k_delta_heads, (unsigned)d->v_heads, threads, smem, s, *d, qkv, ldq, z, ldz, ba, ldba, out, ldo, n);
    return (int)cudaGetLastError();
}

/* ---- Lightning attention ---- */

/* One head (a block; thread j keeps column j of its state), tokens in batch
 * order: q and k RMS-normed and rotated, S = decay S + k^T v, o = scale q S. */
__global__ void k_lightning(struct sp_cuda_lightning l, const float *qkv, int64_t ldq, float *out, int64_t ldo, int64_t n) {
    dep_start();
    extern __shared__ float sh[];
    int64_t H = l.heads, D = l.dim, h = blockIdx.x, j = threadIdx.x, half = l.rot / 2;
    float *sq = sh, *sk = sh + D, *red = sh + 2 * D;
    float scale = rsqrtf((float)D), decay = l.decay[h];
    for (int64_t t = 0; t < n; t++) {
        const float *x = qkv + t * ldq;
        for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
            sq[i] = x[h * D + i];
            sk[i] = x[(H + h) * D + i];
        }
        __syncthreads();
        if (l.q_norm) {
            float pq = 0, pk = 0;
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
                pq += sq[i] * sq[i];
                pk += sk[i] * sk[i];
            }
            float rq = 1.0f / sqrtf(block_sum_f(pq, red) / (float)D + l.eps);
            float rk = 1.0f / sqrtf(block_sum_f(pk, red) / (float)D + l.eps);
            for (int64_t i = threadIdx.x; i < D; i += blockDim.x) {
                sq[i] = sq[i] * rq * l.q_norm[i];
                sk[i] = sk[i] * rk * l.k_norm[i];
            }
            __syncthreads();
        }
        /* rotate the first rot dims, halves paired (thread i < half takes pair i) */
        const float *cs = l.rope_cs + t * 2 * half;
        float q1 = 0, q2 = 0, k1 = 0, k2 = 0;
        if (j < half) q1 = sq[j], q2 = sq[j + half], k1 = sk[j], k2 = sk[j + half];
        __syncthreads();
        if (j < half) {
            float c = cs[j], s = cs[half + j];
            sq[j] = q1 * c - q2 * s;
            sq[j + half] = q2 * c + q1 * s;
            sk[j] = k1 * c - k2 * s;
            sk[j + half] = k2 * c + k1 * s;
        }
        __syncthreads();
        if (j < D) {
            float *S = state_slot(l.st, l.st.seq[t]) + h * D * D;
            float v = x[(2 * H + h) * D + j], o = 0;
            bool fresh = l.st.pos[t] == 0;
            for (int64_t i = 0; i < D; i++) {
                float s = (fresh ? 0.0f : decay * S[i * D + j]) + sk[i] * v;
                S[i * D + j] = s;
                o += sq[i] * s;
            }
            out[t * ldo + h * D + j] = o * scale;
            if (l.st.snapshot && l.st.snapshot[t]) {
                float *snap = state_slot(l.st, l.st.n_seq + l.st.seq[t]) + h * D * D;
                for (int64_t i = 0; i < D; i++) snap[i * D + j] = S[i * D + j];
            }
        }
        __syncthreads();  // sq / sk are written again for the next token
    }
}

/* RMS over each run of `per` outputs of a token, times the weight. */
__global__ void k_group_rmsnorm(float *x, int64_t ldx, const float *w, int64_t per, float eps) {
    dep_start();
    __shared__ float red[32];
    float *g = x + (int64_t)blockIdx.x * ldx + (int64_t)blockIdx.y * per;
    const float *wg = w + (int64_t)blockIdx.y * per;
    float p = 0;
    for (int64_t i = threadIdx.x; i < per; i += blockDim.x) p += g[i] * g[i];
    float r = 1.0f / sqrtf(block_sum_f(p, red) / (float)per + eps);
    for (int64_t i = threadIdx.x; i < per; i += blockDim.x) g[i] = g[i] * r * wg[i];
}

extern "C" int sp_cuda_lightning(const struct sp_cuda_lightning *l, const float *qkv, int64_t ldq, float *out,
                                 int64_t ldo, int64_t n, void *stream) {
    if (n <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    int threads = (int)((l->dim + WARP - 1) / WARP * WARP);
    size_t smem = (size_t)(2 * l->dim + WARP) * sizeof(float);
    launch_smem(k_lightning, (unsigned)l->heads, threads, smem, s, *l, qkv, ldq, out, ldo, n);
    int err = (int)cudaGetLastError();
    if (err) return err;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {  // x: tokens, y: groups
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        dim3 grid((unsigned)m, (unsigned)l->groups);
        launch(k_group_rmsnorm, grid, 256, s, out + r0 * ldo, ldo, l->norm, l->heads * l->dim / l->groups, l->eps);
        if ((err = (int)cudaGetLastError())) return err;
    }
    return 0;
}
