/* CUDA matmul for the weights and modes the FP8 tensor-core paths do not
 * cover (architecture.md §2): BF16 and F32 weights, and FP8 / MXFP4 weights
 * with unquantized activations (BF16 numerics, the grouped wo_a). The CPU
 * backend computes these as one fused multiply-add chain per output in
 * increasing k over the exactly decoded weight (kernels.h), so this kernel
 * does the same and gives the same bits: one thread per output, the weight
 * decoded on the fly from its checkpoint format, never copied. A warp covers
 * 32 consecutive outputs of one row of x, which it reads as a broadcast.
 * Correct first; a tiled version is future work. */
#include "backend/cuda/cuda_ops_common.cuh"

#include "backend/backend.h"

__device__ __forceinline__ float w_at(int fmt, const void *w, const uint8_t *s, int64_t K,
                                      int64_t kb, int64_t row, int64_t k) {
    switch (fmt) {
    case DI_WFMT_FP8:
        return e4m3_val(((const uint8_t *)w)[row * K + k]) * e8m0_to_f32(s[(row / 32) * kb + k / 32]);
    case DI_WFMT_FP4: {
        uint32_t b = ((const uint8_t *)w)[row * (K / 2) + k / 2];
        return e2m1_val(k & 1 ? b >> 4 : b & 15u) * e8m0_to_f32(s[row * (K / 32) + k / 32]);
    }
    case DI_WFMT_BF16: return bf16_val(((const uint16_t *)w)[row * K + k]);
    default: return ((const float *)w)[row * K + k];
    }
}

__global__ void k_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t K,
                               const float *x, int64_t ldx, int64_t m, int64_t nr, float *y,
                               int64_t ldy, int out_bf16) {
    int g = blockIdx.y;
    int64_t kb = (K + 31) / 32;
    GRID_STRIDE(t, m * nr) {
        int64_t i = t / nr, j = t % nr;
        const float *xi = x + i * ldx + (int64_t)g * K;
        int64_t row = (int64_t)g * nr + j;
        float acc = 0.f;
        for (int64_t k = 0; k < K; k++) acc = fmaf(xi[k], w_at(fmt, w, s, K, kb, row, k), acc);
        y[i * ldy + row] = out_bf16 ? round_bf16(acc) : acc;
    }
}

extern "C" di_status cuda_op_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                                          int64_t n_in, const float *x, int64_t ldx, int64_t m,
                                          int groups, int64_t nr, float *y, int64_t ldy,
                                          int out_bf16, di_err *err) {
    (void)n_out;
    if (m * nr <= 0 || groups <= 0) return DI_OK;
    dim3 grid(grid_for(m * nr), (unsigned)groups);
    k_matmul_plain<<<grid, 256>>>(fmt, w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16);
    return cuda_check_launch(err, "matmul");
}
