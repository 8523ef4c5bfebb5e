/* FP8 activation quantization per 32 contiguous elements, the per-element
 * steps (architecture.md §2, "FP8 linear"): shared by the stand-alone kernels
 * (cuda_act_quant.cu) and the FP8 decode product that quantizes its own
 * activations (cuda_matvec.cu), so both give the CPU op's bits. */
#ifndef DI_BACKEND_CUDA_ACT_QUANT_CUH
#define DI_BACKEND_CUDA_ACT_QUANT_CUH

#include <cuda_fp8.h>
#include <stdint.h>

/* Power-of-two scale of a block: 2^ceil(log2(amax / 448)) from the exponent
 * bits of amax * (1/448), the way the reference computes it. amax >= 1e-4, so
 * the ratio is a normal number and the result lies in [2^-22, 2^121]. */
__device__ __forceinline__ float aq_block_scale(float amax) {
    amax = fmaxf(amax, 1e-4f);
    uint32_t r = __float_as_uint(amax * (1.0f / 448.0f));
    uint32_t e = (r >> 23) & 0xffu;
    if (r & 0x7fffffu) e += 1;
    return __uint_as_float(e << 23);
}

/* x / s with s a power of two in [2^-22, 2^121]: multiplying by the exact
 * reciprocal gives the same bits (both round the same exact quotient) at a
 * fraction of a division's cost. */
__device__ __forceinline__ uint8_t aq_e4m3(float x, float inv_s) {
    float v = fminf(fmaxf(x * inv_s, -448.0f), 448.0f);
    return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, __NV_E4M3);
}
/* Two values at once (cvt.rn.satfinite.e4m3x2.f32); byte 0 = a. */
__device__ __forceinline__ uint32_t aq_e4m3x2(float a, float b, float inv_s) {
    float va = fminf(fmaxf(a * inv_s, -448.0f), 448.0f);
    float vb = fminf(fmaxf(b * inv_s, -448.0f), 448.0f);
    return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(va, vb), __NV_SATFINITE, __NV_E4M3);
}

/* One lane's 8 consecutive values of a 32-block whose four lanes are
 * consecutive (lane & 3 = the quarter): the block's scale (the amax combined
 * by two shuffles, so every lane of the warp must call it) and the 8 codes
 * in value order, byte 0 first. */
__device__ __forceinline__ float aq_quant8(const float v[8], uint2 *codes) {
    float amax = 0.0f;
#pragma unroll
    for (int i = 0; i < 8; i++) amax = fmaxf(amax, fabsf(v[i]));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 1));
    amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, 2));
    const float s = aq_block_scale(amax), inv = 1.0f / s;
    codes->x = aq_e4m3x2(v[0], v[1], inv) | (aq_e4m3x2(v[2], v[3], inv) << 16);
    codes->y = aq_e4m3x2(v[4], v[5], inv) | (aq_e4m3x2(v[6], v[7], inv) << 16);
    return s;
}

/* 8 consecutive f32 values from two 16-byte loads (p 16-byte aligned). */
__device__ __forceinline__ void aq_load8(const float *p, float v[8]) {
    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
    v[0] = a.x; v[1] = a.y; v[2] = a.z; v[3] = a.w;
    v[4] = b.x; v[5] = b.y; v[6] = b.z; v[7] = b.w;
}

/* The vector form's step for one thread of a grid with four threads per
 * 32-block of rows with k % 32 == 0 (thread tid takes values tid·8 ..
 * tid·8 + 7 of block tid / 4): its 8 values, the block's scale into
 * scale[tid / 4] (by the block's first lane) and the codes into q + tid·8
 * (8-byte aligned). live = false for lanes past the last block, which still
 * take part in the shuffles; every lane of the warp must call it. Shared by
 * the stand-alone kernel and the kernels that quantize what they compute. */
__device__ __forceinline__ void aq_store8(const float v[8], bool live, int64_t tid, uint8_t *q, float *scale) {
    uint2 codes;
    const float s = aq_quant8(v, &codes);
    if (!live) return;
    if ((tid & 3) == 0) scale[tid >> 2] = s;
    *(uint2 *)(q + tid * 8) = codes;
}

#endif
