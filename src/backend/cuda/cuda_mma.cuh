/* The bf16 tensor-core step and the operand packing the mma.sync kernels
 * share (cuda_ops_linear.cu, cuda_attn_tc.cu, cuda_ops_select.cu). */
#ifndef DI_CUDA_MMA_CUH
#define DI_CUDA_MMA_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

/* c [16 × 8] += a [16 × 16] · b [16 × 8]: bf16 in, fp32 accumulate
 * (mma.sync m16n8k16; a in its four fragment registers, b in two). */
__device__ __forceinline__ void mma_bf16_16816(float c[4], const uint32_t a[4], uint32_t b0,
                                               uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two floats -> a bf16 pair (lo in the low half), round to nearest even,
 * one conversion instruction for both */
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

/* two E4M3 codes (low byte first) times a scale, as a bf16 pair: E4M3 ->
 * fp16 is exact (hardware conversion), and so is the product in fp32 for
 * a power-of-two or short-mantissa scale */
__device__ __forceinline__ uint32_t e4m3x2_bf16x2(uint32_t two, float s) {
    __half2_raw hr = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)two, __NV_E4M3);
    float2 f = __half22float2(*reinterpret_cast<__half2 *>(&hr));
    return pack_bf16x2(f.x * s, f.y * s);
}

/* eight E4M3 codes (two words, low byte first) times a scale, as four bf16
 * pairs in k order */
__device__ __forceinline__ void e4m3x8_bf16x2(uint2 v, float s, uint32_t (&a)[4]) {
    a[0] = e4m3x2_bf16x2(v.x & 0xffffu, s);
    a[1] = e4m3x2_bf16x2(v.x >> 16, s);
    a[2] = e4m3x2_bf16x2(v.y & 0xffffu, s);
    a[3] = e4m3x2_bf16x2(v.y >> 16, s);
}

#endif
