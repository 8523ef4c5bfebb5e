/* CUDA matmul for the weights and modes the FP8 tensor-core paths do not
 * cover (architecture.md §2): BF16 and F32 weights, and FP8 / MXFP4 weights
 * with unquantized activations (BF16 numerics, the grouped wo_a). The CPU
 * backend computes these as one fused multiply-add chain per output in
 * increasing k over the exactly decoded weight (kernels.h), so this kernel
 * does the same and gives the same bits: one thread per output, the weight
 * decoded on the fly from its checkpoint format, never copied.
 *
 * From 3 rows of x up, tiled so the chain order survives: a block owns 256
 * outputs (a thread each) and 4 or 8 rows of x (MR accumulators per
 * thread); per step it decodes a 256 x 32 weight tile into shared memory
 * with coalesced loads (a warp reads 32 consecutive k of one weight row)
 * and stages the rows' 32 inputs, then each thread runs its chains over the
 * 32 k in order. Each weight element is read once per 8 rows of x instead
 * of once per row. For one or two rows each thread reads its own weight
 * row: too few outputs per matrix there to fill the GPU with tiles
 * (measurements in docs/gpu-notes.md, "Kernels behind the decode step"). */
#include "backend/cuda/cuda_ops_common.cuh"

#include "backend/backend.h"

template <int FMT>
__device__ __forceinline__ float w_at(const void *w, const uint8_t *s, int64_t K, int64_t kb, int64_t row,
                                      int64_t k) {
    switch (FMT) {
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

enum { PT_N = 256, PT_K = 32, PT_R = 8 };

template <int MR, int FMT>
__global__ void __launch_bounds__(PT_N) k_matmul_plain(const void *w, const uint8_t *s, int64_t K,
                                                        const float *x, int64_t ldx, int64_t m, int64_t nr,
                                                        float *y, int64_t ldy, int out_bf16) {
    __shared__ float ws[PT_N][PT_K + 1]; /* +1: thread j reads row j, no bank conflicts */
    __shared__ float xs[MR][PT_K];
    int g = blockIdx.z;
    int64_t j0 = (int64_t)blockIdx.x * PT_N, i0 = (int64_t)blockIdx.y * MR;
    int tj = threadIdx.x;
    int64_t kb = (K + 31) / 32;
    float acc[MR];
#pragma unroll
    for (int r = 0; r < MR; r++) acc[r] = 0.f;
    for (int64_t k0 = 0; k0 < K; k0 += PT_K) {
        int kt = K - k0 < PT_K ? (int)(K - k0) : PT_K;
        /* batches of 8 independent loads per thread (a warp reads 32
         * consecutive k of one weight row), so loads are in flight together:
         * the first tiled version waited for each before issuing the next,
         * ~14 us per tile */
        int kk = threadIdx.x & 31, r0 = threadIdx.x >> 5;
#pragma unroll 1
        for (int b = 0; b < PT_N / 64; b++) {
            float v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) {
                int64_t j = j0 + r0 + 8 * (b * 8 + u);
                v[u] = j < nr && kk < kt ? w_at<FMT>(w, s, K, kb, (int64_t)g * nr + j, k0 + kk) : 0.f;
            }
#pragma unroll
            for (int u = 0; u < 8; u++) ws[r0 + 8 * (b * 8 + u)][kk] = v[u];
        }
        for (int e = threadIdx.x; e < MR * PT_K; e += PT_N) {
            int r = e / PT_K, kk = e % PT_K;
            int64_t i = i0 + r;
            xs[r][kk] = i < m && kk < kt ? x[i * ldx + (int64_t)g * K + k0 + kk] : 0.f;
        }
        __syncthreads();
        for (int kk = 0; kk < kt; kk++) {
            float wv = ws[tj][kk];
#pragma unroll
            for (int r = 0; r < MR; r++) acc[r] = fmaf(xs[r][kk], wv, acc[r]);
        }
        __syncthreads();
    }
    int64_t j = j0 + tj;
    if (j >= nr) return;
#pragma unroll
    for (int r = 0; r < MR; r++) {
        int64_t i = i0 + r;
        if (i < m) y[i * ldy + (int64_t)g * nr + j] = out_bf16 ? round_bf16(acc[r]) : acc[r];
    }
}

/* One thread per output reading its own weight row: for one or two rows
 * of x it beats the tile (measured on the real-shape decode step: the
 * router, compressor and indexer weights have 32-512 outputs, too few
 * 256-output blocks to hide the per-tile round trips; docs/gpu-notes.md). */
template <int FMT>
__global__ void k_matmul_rows(const void *w, const uint8_t *s, int64_t K, const float *x, int64_t ldx,
                              int64_t m, int64_t nr, float *y, int64_t ldy, int out_bf16) {
    int g = blockIdx.y;
    int64_t kb = (K + 31) / 32;
    GRID_STRIDE(t, m * nr) {
        int64_t i = t / nr, j = t % nr;
        const float *xi = x + i * ldx + (int64_t)g * K;
        int64_t row = (int64_t)g * nr + j;
        float acc = 0.f;
        for (int64_t k = 0; k < K; k++) acc = fmaf(xi[k], w_at<FMT>(w, s, K, kb, row, k), acc);
        y[i * ldy + row] = out_bf16 ? round_bf16(acc) : acc;
    }
}

template <int MR>
static void launch_plain(int fmt, dim3 grid, const void *w, const uint8_t *s, int64_t K, const float *x,
                         int64_t ldx, int64_t m, int64_t nr, float *y, int64_t ldy, int out_bf16) {
    switch (fmt) {
    case DI_WFMT_FP8:
        k_matmul_plain<MR, DI_WFMT_FP8><<<grid, PT_N>>>(w, s, K, x, ldx, m, nr, y, ldy, out_bf16);
        break;
    case DI_WFMT_FP4:
        k_matmul_plain<MR, DI_WFMT_FP4><<<grid, PT_N>>>(w, s, K, x, ldx, m, nr, y, ldy, out_bf16);
        break;
    case DI_WFMT_BF16:
        k_matmul_plain<MR, DI_WFMT_BF16><<<grid, PT_N>>>(w, s, K, x, ldx, m, nr, y, ldy, out_bf16);
        break;
    default:
        k_matmul_plain<MR, DI_WFMT_F32><<<grid, PT_N>>>(w, s, K, x, ldx, m, nr, y, ldy, out_bf16);
        break;
    }
}

extern "C" di_status cuda_op_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                                          int64_t n_in, const float *x, int64_t ldx, int64_t m,
                                          int groups, int64_t nr, float *y, int64_t ldy,
                                          int out_bf16, di_err *err) {
    (void)n_out;
    if (m * nr <= 0 || groups <= 0) return DI_OK;
    if (m <= 2) {
        if (groups > 65535) return di_err_set(err, DI_ERR_UNSUPPORTED, "matmul: %d groups", groups);
        dim3 g2(grid_for(m * nr), (unsigned)groups);
        switch (fmt) {
        case DI_WFMT_FP8: k_matmul_rows<DI_WFMT_FP8><<<g2, 256>>>(w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
        case DI_WFMT_FP4: k_matmul_rows<DI_WFMT_FP4><<<g2, 256>>>(w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
        case DI_WFMT_BF16: k_matmul_rows<DI_WFMT_BF16><<<g2, 256>>>(w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
        default: k_matmul_rows<DI_WFMT_F32><<<g2, 256>>>(w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
        }
        return cuda_check_launch(err, "matmul");
    }
    /* rows per block: 4 or 8 */
    int mr = m >= PT_R ? PT_R : 4;
    int64_t gy = (m + mr - 1) / mr;
    if (gy > 65535 || groups > 65535)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "matmul: %lld rows in %d groups exceed one launch",
                          (long long)m, groups);
    dim3 grid((unsigned)((nr + PT_N - 1) / PT_N), (unsigned)gy, (unsigned)groups);
    switch (mr) {
    case 4: launch_plain<4>(fmt, grid, w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
    default: launch_plain<8>(fmt, grid, w, s, n_in, x, ldx, m, nr, y, ldy, out_bf16); break;
    }
    return cuda_check_launch(err, "matmul");
}
