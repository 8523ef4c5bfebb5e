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

/* ---- the same bits in four instructions a pair (k_mm_dec's weight loads)
 *
 * The form above spends six instructions on a pair (the E4M3 -> f16 unpack,
 * two f16 -> f32, two multiplies, the bf16 pack) and two-thirds of a wo_a
 * round on them (docs/gpu-notes.md, products run 3). Here a code's bits are
 * moved into a bf16 as they are: sign to bit 15, its exponent and mantissa
 * (7 bits) to bits 4..10. Read as bf16 that is the code's value times
 * 2^-120 exactly: a normal code (exponent field E >= 1) becomes 1.m·2^(E-127)
 * against 1.m·2^(E-7); a subnormal one (E = 0) the bf16 subnormal
 * 0.m·2^-126 against 0.m·2^-6; zeros keep their sign. One bf16 multiply by
 * 2^(120 + es) then gives code·2^es, exact while that is a bf16 normal: es
 * in [-117, 7] (the multiplier itself must be a bf16 normal, and the
 * smallest code 2^-9 must stay above 2^-126). For such a scale the old form
 * is exact too (code·2^es is an fp32 normal with at most 4 significant
 * bits), so both give the same bits. What differs: the NaN codes 0x7f /
 * 0xff (here the finite 1.875·2^(8+es)) and scales outside the range; the
 * caller takes the form above for a group that holds either. */

/* The bf16 pair 2^(120+es) in both halves for s = 2^es, or 0 where the
 * four-instruction form is not exact (es outside [-117, 7], or s not a
 * normal power of two: the E8M0 codes 0 and 255). */
__device__ __forceinline__ uint32_t e4m3_bf16_mul(float s) {
    const uint32_t b = __float_as_uint(s), code = b >> 23;
    if ((b & 0x807fffffu) || code < 10u || code > 134u) return 0u;
    return ((code + 120u) << 7) * 0x10001u;
}

/* Two codes of v (bytes sel's: 0x9180 the low two, 0xb3a2 the high two) as
 * a bf16 pair: each byte with its sign replicated into the byte above it
 * (prmt's sign mode), shifted to bits 4..11, the sign kept at bit 15 and
 * the replicas masked off, then the multiply. */
__device__ __forceinline__ uint32_t e4m3x2_bf16x2_mul(uint32_t v, uint32_t sel, uint32_t mul) {
    uint32_t x, r;
    asm("prmt.b32 %0, %1, 0, %2;" : "=r"(x) : "r"(v), "r"(sel));
    x = (x << 4) & 0x87f087f0u;
    asm("mul.rn.bf16x2 %0, %1, %2;" : "=r"(r) : "r"(x), "r"(mul));
    return r;
}

/* Eight codes through the four-instruction form; returns the NaN marks:
 * bit 7 of a byte of (v + 0x01010101) ^ v flips exactly where that byte is
 * 0x7f or 0xff (no carry enters a byte unless the byte below is 0xff), so
 * the marks & 0x80808080 are nonzero iff a code is a NaN. */
__device__ __forceinline__ uint32_t e4m3x8_bf16x2_mul(uint2 v, uint32_t mul, uint32_t (&a)[4]) {
    a[0] = e4m3x2_bf16x2_mul(v.x, 0x9180u, mul);
    a[1] = e4m3x2_bf16x2_mul(v.x, 0xb3a2u, mul);
    a[2] = e4m3x2_bf16x2_mul(v.y, 0x9180u, mul);
    a[3] = e4m3x2_bf16x2_mul(v.y, 0xb3a2u, mul);
    return ((v.x + 0x01010101u) ^ v.x) | ((v.y + 0x01010101u) ^ v.y);
}

/* N groups of eight codes sharing the scale s (one round of a lane):
 * e4m3x8_bf16x2's bits, through the four-instruction form unless the scale
 * is outside its range or a code is a NaN. */
template <int N>
__device__ __forceinline__ void e4m3x8n_bf16x2(const uint2 (&v)[N], float s, uint32_t (&a)[N][4]) {
    const uint32_t mul = e4m3_bf16_mul(s);
    uint32_t nan = 0;
#pragma unroll
    for (int p = 0; p < N; p++) nan |= e4m3x8_bf16x2_mul(v[p], mul, a[p]);
    if (__builtin_expect(!mul || (nan & 0x80808080u), 0)) {
#pragma unroll
        for (int p = 0; p < N; p++) e4m3x8_bf16x2(v[p], s, a[p]);
    }
}

#endif
