/*
 * kernels.cu - the CUDA backend's kernels (kernels.h). Products decode
 * weights 8 elements at a time (every format's groups are whole multiples
 * of 8 elements, and 8 b-bit codes fill b whole bytes): a warp takes a
 * row, its lanes take units of 8 columns in turn, and up to TOKENS tokens
 * of the batch share each decoded unit. Every sum is spelled out (fmaf,
 * __fadd_rn, __fmul_rn) so that the compiler's contractions cannot make
 * one instantiation round differently from another: a token's result is
 * the same in any batch. Decoding follows quant/qtype.c's reference
 * exactly, scale x code rounded before the bias is added.
 */
#include "backend/cuda/kernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <math.h>

namespace {

constexpr int WARP = 32;
constexpr int TOKENS = 8;     // tokens sharing each decoded unit of a product
constexpr int ROW_WARPS = 4;  // rows (a warp each) per block of a product
constexpr int COL_THREADS = 128;
constexpr int ATT_THREADS = 128;  // cached positions scored at a time by an attention block
constexpr int ATT_DIMS = SP_CUDA_MAX_HEAD_DIM / ATT_THREADS;
constexpr int MAX_GRID_Y = 65535;

/* What a product's kernel decodes: plain floats of one type, affine codes,
 * or one of the microscaling formats. */
enum kind { K_F32, K_F16, K_BF16, K_AFFINE, K_MXFP4, K_NVFP4, K_MXFP8 };

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
        k_rows<K, BITS, SDT><<<grid, ROW_WARPS * WARP, 0, s>>>(*w, x, ldx, y, ldy, n);
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
        k_embed<K, BITS, SDT><<<(unsigned)n, 128, 0, s>>>(*w, tokens, x, ldx);
        return (int)cudaGetLastError();
    }
};

/* ---- per-token steps ---- */

__global__ void k_rope_table(const int32_t *pos, int64_t n, const float *inv_freq, int64_t half, float scale,
                             float *cs) {
    int64_t k = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= n * half) return;
    int64_t t = k / half, i = k % half;
    float ang = __fmul_rn((float)pos[t], inv_freq[i]);
    cs[t * 2 * half + i] = __fmul_rn((float)cos((double)ang), scale);
    cs[t * 2 * half + half + i] = __fmul_rn((float)sin((double)ang), scale);
}

constexpr int NORM_THREADS = 256;

/* Sum over the block (NORM_THREADS) in a fixed order; every thread gets it. */
__device__ double block_sum_d(double v, double *red) {
    v = warp_sum_d(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    double s = 0;
    for (int i = 0; i < NORM_THREADS / WARP; i++) s += red[i];
    return s;
}

__global__ void __launch_bounds__(NORM_THREADS) k_rmsnorm(const float *x, int64_t ldx, const int32_t *rows,
                                                          const float *w, float eps, float *out, int64_t ldo,
                                                          int64_t cols) {
    __shared__ double red[NORM_THREADS / WARP];
    const float *xr = x + (rows ? (int64_t)rows[blockIdx.x] : (int64_t)blockIdx.x) * ldx;
    float *o = out + (int64_t)blockIdx.x * ldo;
    double ss = 0;
    for (int64_t c = threadIdx.x; c < cols; c += NORM_THREADS) ss += (double)xr[c] * (double)xr[c];
    ss = block_sum_d(ss, red);
    float scale = (float)(1.0 / sqrt(ss / (double)cols + (double)eps));
    for (int64_t c = threadIdx.x; c < cols; c += NORM_THREADS) {
        float v = __fmul_rn(xr[c], scale);
        o[c] = w ? __fmul_rn(v, w[c]) : v;
    }
}

__global__ void k_add(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t cols) {
    int64_t c = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, r = blockIdx.y;
    if (c < cols) dst[r * ldd + c] = __fadd_rn(dst[r * ldd + c], src[r * lds + c]);
}

__global__ void k_glu(float *out, int64_t ldo, const float *g, const float *u, int64_t lds, int64_t w, float alpha,
                      float limit, float u_offset) {
    int64_t j = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t = blockIdx.y;
    if (j >= w) return;
    float gi = u ? g[t * lds + j] : g[t * lds + 2 * j], ui = u ? u[t * lds + j] : g[t * lds + 2 * j + 1];
    gi = gi > limit ? limit : gi;
    ui = ui > limit ? limit : ui < -limit ? -limit : ui;
    float sig = __fdiv_rn(gi, __fadd_rn(1.0f, expf(__fmul_rn(-gi, alpha))));
    out[t * ldo + j] = __fmul_rn(__fadd_rn(ui, u_offset), sig);
}

__global__ void k_gather(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int64_t cols) {
    const float *s = src + (int64_t)rows[blockIdx.x] * lds;
    float *d = dst + (int64_t)blockIdx.x * ldd;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) d[c] = s[c];
}

__global__ void k_scatter_add(float *out, int64_t ldo, const float *src, int64_t lds, const int32_t *off,
                              const int32_t *list, const float *w, int64_t cols) {
    int32_t a = off[blockIdx.x], b = off[blockIdx.x + 1];
    if (a == b) return;
    float *o = out + (int64_t)blockIdx.x * ldo;
    for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {
        float v = o[c];
        for (int32_t k = a; k < b; k++) v = fmaf(w[list[k]], src[(int64_t)list[k] * lds + c], v);
        o[c] = v;
    }
}

/* ---- attention ---- */

/* Element 0 of KV head h of position p of sequence s, keys or values. */
__device__ __forceinline__ int64_t kv_at(const sp_cuda_kv &kv, const sp_cuda_attn &a, int which, int64_t s, int64_t p,
                                         int64_t h) {
    return ((((a.layer * 2 + which) * kv.n_seq + s) * kv.n_ctx + p) * a.n_kv_heads + h) * a.head_dim;
}

constexpr int PRO_WARPS = 4;

/* A block a token, a warp a head: norm, then rotate (each lane a pair of
 * elements, once the norm's writes are seen: __syncwarp), then store. */
template <int DT>
__global__ void __launch_bounds__(PRO_WARPS * WARP) k_prologue(sp_cuda_attn a, sp_cuda_kv kv, float *qkv, int64_t ldq) {
    int64_t t = blockIdx.x, hd = a.head_dim, half = a.rot / 2;
    int lane = threadIdx.x % WARP;
    float *row = qkv + t * ldq;
    const float *cs = a.rope_cs + t * a.rot;
    for (int64_t h = threadIdx.x / WARP; h < a.n_heads + a.n_kv_heads; h += PRO_WARPS) {
        float *v = row + h * hd;
        if (a.q_norm) {
            const float *nw = h < a.n_heads ? a.q_norm : a.k_norm;
            double ss = 0;
            for (int64_t i = lane; i < hd; i += WARP) ss += (double)v[i] * (double)v[i];
            ss = warp_sum_d(ss);
            float scale = (float)(1.0 / sqrt(ss / (double)hd + (double)a.eps));
            for (int64_t i = lane; i < hd; i += WARP) v[i] = __fmul_rn(__fmul_rn(v[i], scale), nw[i]);
            __syncwarp();
        }
        for (int64_t i = lane; i < half; i += WARP) {
            float x1 = v[i], x2 = v[i + half], c = cs[i], s = cs[half + i];
            v[i] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, s));
            v[i + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, s));
        }
        __syncwarp();
        if (h < a.n_heads) continue;
        int64_t kvh = h - a.n_heads, s = a.seq[t], p = a.pos[t];
        const float *vv = row + (a.n_heads + a.n_kv_heads + kvh) * hd;
        int64_t ko = kv_at(kv, a, 0, s, p, kvh), vo = kv_at(kv, a, 1, s, p, kvh);
        for (int64_t i = lane; i < hd; i += WARP) {
            stf<DT>(kv.data, ko + i, v[i]);
            stf<DT>(kv.data, vo + i, vv[i]);
        }
    }
}

/* The block's max and sum (ATT_THREADS threads) in a fixed order; every
 * thread gets them. red: ATT_THREADS / WARP floats, free on entry. */
__device__ float att_block_max(float v, float *red) {
    v = warp_max(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    float m = red[0];
    for (int i = 1; i < ATT_THREADS / WARP; i++) m = fmaxf(m, red[i]);
    __syncthreads();
    return m;
}

__device__ float att_block_sum(float v, float *red) {
    v = warp_sum(v);
    if (threadIdx.x % WARP == 0) red[threadIdx.x / WARP] = v;
    __syncthreads();
    float s = red[0];
    for (int i = 1; i < ATT_THREADS / WARP; i++) s = __fadd_rn(s, red[i]);
    __syncthreads();
    return s;
}

/* A block a (token, query head): ATT_THREADS cached positions scored at a
 * time (a thread each), their exps against the running max (the sums so far
 * rescaled where it grew), then each thread adds its dimensions of the
 * values weighted by them. */
template <int DT>
__global__ void __launch_bounds__(ATT_THREADS)
    k_attn(sp_cuda_attn a, sp_cuda_kv kv, const float *qkv, int64_t ldq, float *att, int64_t lda) {
    __shared__ float q[SP_CUDA_MAX_HEAD_DIM];
    __shared__ float pe[ATT_THREADS];
    __shared__ float red[ATT_THREADS / WARP];
    int64_t t = blockIdx.x, h = blockIdx.y, hd = a.head_dim, tid = threadIdx.x;
    int64_t kvh = h / (a.n_heads / a.n_kv_heads), s = a.seq[t], pos = a.pos[t];
    int64_t lo = a.window > 0 && pos - a.window + 1 > 0 ? pos - a.window + 1 : 0;
    for (int64_t i = tid; i < hd; i += ATT_THREADS) q[i] = qkv[t * ldq + h * hd + i];
    __syncthreads();
    const float scale = 1.0f / sqrtf((float)hd);
    float m = -INFINITY, l = 0.0f, acc[ATT_DIMS];
#pragma unroll
    for (int j = 0; j < ATT_DIMS; j++) acc[j] = 0.0f;
    for (int64_t c0 = lo; c0 <= pos; c0 += ATT_THREADS) {
        int64_t p = c0 + tid;
        float sc = -INFINITY;
        if (p <= pos) {
            int64_t ko = kv_at(kv, a, 0, s, p, kvh);
            float d = 0.0f;
            for (int64_t e = 0; e < hd; e++) d = fmaf(q[e], ldf<DT>(kv.data, ko + e), d);
            sc = __fmul_rn(d, scale);
        }
        float mn = fmaxf(m, att_block_max(sc, red));
        float e = p <= pos ? expf(__fsub_rn(sc, mn)) : 0.0f;
        pe[tid] = e;
        float sum = att_block_sum(e, red);  // its barriers publish pe
        float f = expf(__fsub_rn(m, mn));  // 0 on the first chunk
        l = __fadd_rn(__fmul_rn(l, f), sum);
        int64_t cnt = pos - c0 + 1 < ATT_THREADS ? pos - c0 + 1 : ATT_THREADS;
        int64_t vo = kv_at(kv, a, 1, s, c0, kvh), vstep = a.n_kv_heads * hd;
#pragma unroll
        for (int j = 0; j < ATT_DIMS; j++) {
            int64_t d = tid + j * ATT_THREADS;
            if (d >= hd) break;
            float v = __fmul_rn(acc[j], f);
            for (int64_t k = 0; k < cnt; k++) v = fmaf(pe[k], ldf<DT>(kv.data, vo + k * vstep + d), v);
            acc[j] = v;
        }
        m = mn;
        __syncthreads();  // pe is rewritten by the next chunk
    }
    double total = (double)l + (a.sinks ? exp((double)a.sinks[h] - (double)m) : 0.0);
    float inv = (float)(1.0 / total);
#pragma unroll
    for (int j = 0; j < ATT_DIMS; j++) {
        int64_t d = tid + j * ATT_THREADS;
        if (d < hd) att[t * lda + h * hd + d] = __fmul_rn(acc[j], inv);
    }
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
            if (w->elem == SP_CUDA_F32) k_cols<SP_CUDA_F32><<<grid, COL_THREADS, 0, s>>>(*w, xs, ldx, ys, ldy, m);
            else if (w->elem == SP_CUDA_F16) k_cols<SP_CUDA_F16><<<grid, COL_THREADS, 0, s>>>(*w, xs, ldx, ys, ldy, m);
            else k_cols<SP_CUDA_BF16><<<grid, COL_THREADS, 0, s>>>(*w, xs, ldx, ys, ldy, m);
            err = (int)cudaGetLastError();
        } else {
            err = dispatch(*w, rows_launch{w, xs, ldx, ys, ldy, m, s});
        }
        if (err) return err;
    }
    return 0;
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
    k_rope_table<<<(unsigned)((k + 255) / 256), 256, 0, static_cast<cudaStream_t>(stream)>>>(pos, n, inv_freq, rot / 2,
                                                                                             scale, cs);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_rmsnorm(const float *x, int64_t ldx, const int32_t *rows, const float *w, float eps, float *out,
                               int64_t ldo, int64_t n, int64_t cols, void *stream) {
    if (n <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    k_rmsnorm<<<(unsigned)n, NORM_THREADS, 0, s>>>(x, ldx, rows, w, eps, out, ldo, cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_add(float *dst, int64_t ldd, const float *src, int64_t lds, int64_t n, int64_t cols,
                           void *stream) {
    if (n <= 0 || cols <= 0) return 0;
    for (int64_t r0 = 0; r0 < n; r0 += MAX_GRID_Y) {
        int64_t m = n - r0 < MAX_GRID_Y ? n - r0 : MAX_GRID_Y;
        dim3 grid((unsigned)((cols + 255) / 256), (unsigned)m);
        k_add<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst + r0 * ldd, ldd, src + r0 * lds, lds, cols);
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
        k_glu<<<grid, 256, 0, static_cast<cudaStream_t>(stream)>>>(out + r0 * ldo, ldo, g + r0 * lds,
                                                                   u ? u + r0 * lds : nullptr, lds, w, alpha, limit,
                                                                   u_offset);
        int err = (int)cudaGetLastError();
        if (err) return err;
    }
    return 0;
}

extern "C" int sp_cuda_gather(float *dst, int64_t ldd, const float *src, int64_t lds, const int32_t *rows, int64_t n,
                              int64_t cols, void *stream) {
    if (n <= 0) return 0;
    k_gather<<<(unsigned)n, 256, 0, static_cast<cudaStream_t>(stream)>>>(dst, ldd, src, lds, rows, cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_scatter_add(float *out, int64_t ldo, const float *src, int64_t lds, const int32_t *off,
                                   const int32_t *list, const float *w, int64_t n, int64_t cols, void *stream) {
    if (n <= 0) return 0;
    k_scatter_add<<<(unsigned)n, 256, 0, static_cast<cudaStream_t>(stream)>>>(out, ldo, src, lds, off, list, w, cols);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_attn_prologue(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, float *qkv,
                                     int64_t ldq, int64_t n, void *stream) {
    if (n <= 0) return 0;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    if (kv->dt == SP_CUDA_F32) k_prologue<SP_CUDA_F32><<<(unsigned)n, PRO_WARPS * WARP, 0, s>>>(*a, *kv, qkv, ldq);
    else if (kv->dt == SP_CUDA_F16) k_prologue<SP_CUDA_F16><<<(unsigned)n, PRO_WARPS * WARP, 0, s>>>(*a, *kv, qkv, ldq);
    else k_prologue<SP_CUDA_BF16><<<(unsigned)n, PRO_WARPS * WARP, 0, s>>>(*a, *kv, qkv, ldq);
    return (int)cudaGetLastError();
}

extern "C" int sp_cuda_attention(const struct sp_cuda_attn *a, const struct sp_cuda_kv *kv, const float *qkv,
                                 int64_t ldq, float *att, int64_t lda, int64_t n, void *stream) {
    if (n <= 0) return 0;
    if (a->head_dim > SP_CUDA_MAX_HEAD_DIM) return (int)cudaErrorInvalidValue;
    cudaStream_t s = static_cast<cudaStream_t>(stream);
    dim3 grid((unsigned)n, (unsigned)a->n_heads);
    if (kv->dt == SP_CUDA_F32) k_attn<SP_CUDA_F32><<<grid, ATT_THREADS, 0, s>>>(*a, *kv, qkv, ldq, att, lda);
    else if (kv->dt == SP_CUDA_F16) k_attn<SP_CUDA_F16><<<grid, ATT_THREADS, 0, s>>>(*a, *kv, qkv, ldq, att, lda);
    else k_attn<SP_CUDA_BF16><<<grid, ATT_THREADS, 0, s>>>(*a, *kv, qkv, ldq, att, lda);
    return (int)cudaGetLastError();
}
