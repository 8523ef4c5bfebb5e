/* Device helpers shared by the cuda_ops_*.cu kernels (not a public header):
 * bf16 rounding, the FP8 / FP4 element codecs with the CPU's exact rounding
 * rules (core/dtype.c), and launch sizing. Where the CPU op computes a
 * product and a sum as two roundings, the kernels spell them __fmul_rn /
 * __fadd_rn so that nvcc cannot fuse them into one FMA: that keeps those
 * ops bit-identical to the CPU backend. */
#ifndef DI_BACKEND_CUDA_OPS_COMMON_CUH
#define DI_BACKEND_CUDA_OPS_COMMON_CUH

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops.h"

#define MUL(a, b) __fmul_rn((a), (b))
#define ADD(a, b) __fadd_rn((a), (b))
#define SUB(a, b) __fsub_rn((a), (b))

__device__ __forceinline__ float round_bf16(float f) {
    return __uint_as_float((uint32_t)f32_to_bf16_bits(f) << 16);
}

__device__ __forceinline__ float bf16_val(uint16_t h) { return __uint_as_float((uint32_t)h << 16); }

/* element i of a weight vector stored as F32 or BF16 */
__device__ __forceinline__ float vec_at(const void *p, int bf16, int64_t i) {
    return bf16 ? bf16_val(((const uint16_t *)p)[i]) : ((const float *)p)[i];
}

__device__ __forceinline__ float sigmoid_f(float x) { return 1.0f / ADD(1.0f, expf(-x)); }

/* The backend's swiglu (k_swiglu) on the grouped MoE products (k_moe_swiglu,
 * k_moe_swiglu_quant, and the MXFP4 decode kernel's SwiGLU input), with the
 * matmul's bf16 output rounding of g and u done here (the plain matmul
 * rounds its fp32 output in place, k_scale_bf16 with c = 1); pairs past
 * the planned count are left alone. */
__device__ __forceinline__ float moe_swiglu_val(float gv, float uv, float pwv, int in_bf16, float limit) {
    if (in_bf16) {
        gv = round_bf16(gv);
        uv = round_bf16(uv);
    }
    if (limit > 0.f) {
        uv = fminf(fmaxf(uv, -limit), limit);
        gv = fminf(gv, limit);
    }
    float v = MUL(MUL(gv, sigmoid_f(gv)), uv);
    v = MUL(pwv, v);
    return round_bf16(v);
}

/* E4M3 code -> value (exact); 0x7F / 0xFF are NaN. */
__device__ __forceinline__ float e4m3_val(uint32_t b) {
    uint32_t e = (b >> 3) & 15u, mt = b & 7u;
    float v;
    if (e == 0) v = (float)mt * 0x1p-9f;
    else if (e == 15u && mt == 7u) v = __uint_as_float(0x7fc00000u);
    else v = __uint_as_float(((e + 120u) << 23) | (mt << 20));
    return (b & 0x80u) ? -v : v;
}

/* fp32 -> E4M3 code, round to nearest even, as di_f32_to_e4m3. */
__device__ __forceinline__ uint32_t e4m3_code(float f) {
    uint32_t u = __float_as_uint(f);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x43f00000u) return sign | 0x7fu;
    if (a < (121u << 23)) return sign | (uint32_t)rintf(MUL(__uint_as_float(a), 512.0f));
    uint32_t mant_odd = (a >> 20) & 1u;
    a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + mant_odd;
    return sign | ((a >> 20) & 0xffu);
}

/* fp32 -> E2M1 code (sign in bit 3): nearest, ties to the even code, as
 * di_f32_to_e2m1 (NaN gives 0). */
__device__ __forceinline__ uint32_t e2m1_code(float f) {
    if (f != f) return 0;
    float a = fabsf(f);
    uint32_t c;
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (signbit(f) ? 8u : 0u) | c;
}

__device__ __forceinline__ float e2m1_val(uint32_t code) {
    const float t[8] = {0.f, 0.5f, 1.f, 1.5f, 2.f, 3.f, 4.f, 6.f};
    float v = t[code & 7u];
    return (code & 8u) ? -v : v;
}

/* 2^ceil(log2 x) from the bits (x positive normal), as the CPU rounds scales. */
__device__ __forceinline__ float pow2_ceil_bits(float x) {
    uint32_t b = __float_as_uint(x);
    int32_t e = (int32_t)((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0);
    if (e > 128) e = 128;
    return __uint_as_float((uint32_t)(e + 127) << 23);
}

/* One RoPE pair (v[0], v[1]) rotated by the angle whose cosine and sine
 * are c and s (s negated for the inverse), rounded to bf16: the rope ops'
 * arithmetic (the CPU's). */
__device__ __forceinline__ void rope_rotate_pair(float *v, float c, float s) {
    float re = v[0], im = v[1];
    v[0] = round_bf16(SUB(MUL(re, c), MUL(im, s)));
    v[1] = round_bf16(ADD(MUL(re, s), MUL(im, c)));
}

/* grid for a grid-stride loop over n items with 256 threads per block */
static inline unsigned grid_for(int64_t n) {
    int64_t g = (n + 255) / 256;
    if (g < 1) g = 1;
    if (g > 65535 * 8) g = 65535 * 8;
    return (unsigned)g;
}

#define GRID_STRIDE(i, n) \
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n); \
         i += (int64_t)gridDim.x * blockDim.x)

/* Sum of v over the block (blockDim.x a multiple of 32, at most 1024);
 * every thread gets the total. red: shared scratch of 32 floats. */
__device__ __forceinline__ float block_sum(float v, float *red) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    int w = threadIdx.x >> 5, l = threadIdx.x & 31;
    __syncthreads();
    if (l == 0) red[w] = v;
    __syncthreads();
    float t = 0.f;
    int nw = (int)(blockDim.x >> 5);
    for (int i = 0; i < nw; i++) t += red[i];
    return t;
}

#endif
