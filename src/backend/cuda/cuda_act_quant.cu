/* FP8 activation quantization per 32 contiguous elements (architecture.md §2,
 * "FP8 linear"): bit-identical to the CPU op, which tests/unit/test_cuda_ops.c
 * checks byte for byte.
 *
 * Memory-bound (3 bytes per bf16 element): the fast path gives each lane 8
 * consecutive values with 16-byte loads, four lanes per 32-block. */
#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_common.cuh"

__device__ __forceinline__ float bf16_to_f32(uint32_t h) { return __uint_as_float(h << 16); }
__device__ __forceinline__ float load_x(const uint16_t *p, int64_t i) { return bf16_to_f32(p[i]); }
__device__ __forceinline__ float load_x(const float *p, int64_t i) { return p[i]; }

/* Any k and alignment: element by element. */
template <typename T>
__global__ void act_quant_fp8_generic(const T *__restrict__ x, int64_t m, int64_t k,
                                      uint8_t *__restrict__ q, float *__restrict__ scale) {
    pdl_enter();
    int64_t kb_n = (k + 31) / 32;
    int64_t blk = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (blk >= m * kb_n) return;
    int64_t row = blk / kb_n, kb = blk % kb_n;
    int64_t k0 = kb * 32, k1 = k0 + 32 < k ? k0 + 32 : k;
    const T *xr = x + row * k;
    float amax = 0.0f;
    for (int64_t i = k0; i < k1; i++) amax = fmaxf(amax, fabsf(load_x(xr, i)));
    float s = aq_block_scale(amax);
    scale[blk] = s;
    for (int64_t i = k0; i < k1; i++) q[row * k + i] = aq_e4m3(load_x(xr, i), 1.0f / s);
}

/* 8 consecutive values from one 16-byte (bf16) or two 16-byte (f32) loads. */
__device__ __forceinline__ void load8v(const uint16_t *p, float v[8]) {
    uint4 r = __ldg((const uint4 *)p);
    const uint32_t w[4] = {r.x, r.y, r.z, r.w};
#pragma unroll
    for (int i = 0; i < 4; i++) {
        v[2 * i] = bf16_to_f32(w[i] & 0xffffu);
        v[2 * i + 1] = bf16_to_f32(w[i] >> 16);
    }
}
__device__ __forceinline__ void load8v(const float *p, float v[8]) { aq_load8(p, v); }

/* k % 32 == 0 and 16-byte aligned rows: four lanes per 32-block, each with 8
 * consecutive values, so a warp reads 512 (bf16) or 1024 (f32) contiguous
 * bytes; the block's amax is combined with two shuffles. */
template <typename T>
__global__ void act_quant_fp8_vec(const T *__restrict__ x, int64_t nblocks,
                                  uint8_t *__restrict__ q, float *__restrict__ scale) {
    pdl_enter();
    int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    int64_t blk = tid >> 2;
    bool live = blk < nblocks;
    float v[8];
    if (live) load8v(x + tid * 8, v);
    else
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = 0.0f;
    aq_store8(v, live, tid, q, scale); /* every lane: the shuffles */
}

template <typename T>
static void launch(const T *x, int64_t m, int64_t k, uint8_t *q, float *scale, unsigned grid,
                   int threads, cudaStream_t s) {
    int64_t nblocks = m * ((k + 31) / 32);
    if ((uintptr_t)x % 16 == 0 && (uintptr_t)q % 16 == 0 && k % 32 == 0)
        cuda_launch_pdl(act_quant_fp8_vec<T>, (unsigned)((nblocks * 4 + threads - 1) / threads), threads, 0, s, 
            x, nblocks, q, scale);
    else
        cuda_launch_pdl(act_quant_fp8_generic<T>, grid, threads, 0, s, x, m, k, q, scale);
}

extern "C" di_status di_cuda_act_quant_fp8(const void *x, di_dtype x_dtype, int64_t m, int64_t k,
                                           uint8_t *q, float *scale, void *stream, di_err *err) {
    if (m < 0 || k < 0)
        return di_err_set(err, DI_ERR_INVALID_ARG, "act_quant_fp8: bad shape [%lld, %lld]",
                          (long long)m, (long long)k);
    if (x_dtype != DI_DTYPE_BF16 && x_dtype != DI_DTYPE_F32)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "act_quant_fp8: input dtype %s (supported: BF16, F32)",
                          di_dtype_name(x_dtype));
    if (m == 0 || k == 0) return DI_OK;
    if (!x || !q || !scale)
        return di_err_set(err, DI_ERR_INVALID_ARG, "act_quant_fp8: NULL buffer");
    int64_t nblocks = m * ((k + 31) / 32);
    const int threads = 256;
    int64_t grid = (nblocks + threads - 1) / threads;
    if (grid > 0x7fffffff / 4)
        return di_err_set(err, DI_ERR_LIMIT, "act_quant_fp8: [%lld, %lld] is too large",
                          (long long)m, (long long)k);
    cudaStream_t s = (cudaStream_t)stream;
    if (x_dtype == DI_DTYPE_BF16)
        launch((const uint16_t *)x, m, k, q, scale, (unsigned)grid, threads, s);
    else
        launch((const float *)x, m, k, q, scale, (unsigned)grid, threads, s);
    return cuda_check_launch(err, "act_quant_fp8 launch");
}
