/* Decode form of the MXFP4 products (architecture.md §2 "FP4 expert
 * linear": packed E2M1 weights with one E8M0 scale per row and 32 inputs,
 * FP8 E4M3 activations with one f32 scale per 32 inputs): the routed
 * experts at decode, a few tokens per expert.
 *
 * Why CUDA cores: at one or two tokens per weight row the product is a
 * stream of weight bytes, and the wgmma kernel (cuda_matvec.cu) spends
 * each 4 KB stage on barriers, a conversion into shared memory and a
 * promotion: with the few blocks a decode step gives, its SMs issue
 * rather than wait on DRAM (docs/gpu-notes.md, runs 24, 27 and products
 * run 2: 33 % of copy). Here every lane loads whole 32-blocks (16 bytes of
 * codes and their scale byte) straight into registers, four blocks in
 * flight at a time, and decodes them itself; nothing is staged but the
 * activations, converted to f32 once per block of rows. Measured (MXFP4
 * run 1, docs/gpu-notes.md): ~40 % of copy, about the wgmma kernel's rate
 * at b1 and below it at b8, so by default it takes only the grouped
 * products past 16 rows a group, where the alternative was the mma.sync
 * kernel (b64 moe_experts 5.55 -> 3.61 ms a layer); cuda_matvec.cu picks.
 *
 * Arithmetic, per (token, weight row): block b's 32 products
 * (w · 2^-6) · a are exact in f32 (2 + 4 significant bits, at least
 * 2^-16), summed from zero by an FMA chain in a fixed element order; the
 * sum times 64 (exact) is promoted by fmaf(d, s_a · s_w, acc). The row's
 * blocks are dealt to L lanes (b = lane, lane + L, ...; L from k alone),
 * each lane promoting its blocks in ascending order, and the L lanes' sums
 * are added by a butterfly. The wgmma form adds a block's products on the
 * FP8 tensor cores' short adder instead: the bits differ, and both are
 * within the test's bound of the exact sum (2^-8 max|p| per block for the
 * adder, here at most 31 · 32 · 2^-24 max|p| < 2^-14 max|p|; the
 * promotions' kbn · 2^-24 Σ|p| for either order). Nothing depends on the
 * other rows, the token tile or the grouping, so a grouped row equals the
 * plain product of that row alone bit for bit. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp4_dec.h"

enum {
    FD_THREADS = 256,
    FD_WARPS = FD_THREADS / 32,
    FD_PASSES = 2, /* row groups a warp takes in turn */
    FD_BATCH = 4,  /* 32-blocks a lane has in flight */
    FD_SMEM_MAX = 200 * 1024,
};

/* four E4M3 codes -> four f32 (exact) */
__device__ __forceinline__ float4 fd_e4m3x4(uint32_t v) {
    const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3)));
    const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3)));
    return make_float4(a.x, a.y, b.x, b.y);
}

/* E2M1 nibbles -> E4M3 bytes of value * 2^-6 (the E2M1 bits at the bottom
 * of the exponent and the top of the mantissa; subnormals included): the
 * low nibbles of w's bytes (elements 0, 2, 4, 6 of the word's eight) and
 * the high ones (1, 3, 5, 7) */
__device__ __forceinline__ uint32_t fd_lo(uint32_t w) {
    return ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t fd_hi(uint32_t w) {
    return ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
}

/* Shared memory of a token tile: xs[t] holds token t's k activation codes
 * as f32, each 32-block as 8 chunks of 4: chunk 2q the block's elements
 * 8q + 0, 2, 4, 6, chunk 2q + 1 elements 8q + 1, 3, 5, 7 (the order the
 * weights decode in), chunk c stored at c ^ (b % 8) so that the 8 lanes of a
 * quarter warp, reading 8 consecutive blocks, hit different banks; then
 * sas[t] the token's kbn scales. */
template <int TT>
__global__ void __launch_bounds__(FD_THREADS, 3)
    k_fp4_dec(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int64_t m, int64_t k,
              const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws, int64_t n,
              const int32_t *__restrict__ ids, const int32_t *__restrict__ off,
              const int32_t *__restrict__ rows, int lanes, void *__restrict__ out, int out_mode) {
    extern __shared__ float4 fd_raw[];
    pdl_enter();
    const int64_t kbn = k / 32, rowb = k / 2;
    float4 *xs = fd_raw;                          /* [TT, kbn, 8] float4 */
    float *sas = (float *)(fd_raw + TT * kbn * 8); /* [TT, kbn] */
    int64_t e = 0, base = 0, count = m;
    if (ids) {
        const int z = blockIdx.y;
        e = ids[z];
        base = off[z];
        count = off[z + 1] - base;
    }
    if (count <= 0) return; /* the whole block alike */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int L = lanes, per = 32 / L, li = lane & (L - 1), sub = lane / L;
    const int64_t r0 = (int64_t)blockIdx.x * FD_PASSES * FD_WARPS * per;
    const uint8_t *we = w + e * n * rowb, *wse = ws + e * n * kbn;

    for (int64_t t0 = 0; t0 < count; t0 += TT) {
        const int tn = count - t0 < TT ? (int)(count - t0) : TT;
        if (t0 > 0) __syncthreads(); /* the last tile is read */
        for (int64_t i = tid; i < (int64_t)tn * (k / 8); i += FD_THREADS) {
            const int t = (int)(i / (k / 8));
            const int64_t j = i - (int64_t)t * (k / 8), b = j >> 2; /* 8 codes: block b, q = j % 4 */
            const int q = (int)(j & 3);
            const int64_t arow = rows ? rows[base + t0 + t] : t0 + t;
            const uint2 v = __ldg((const uint2 *)(qa + arow * k) + j);
            float4 *dst = xs + ((int64_t)t * kbn + b) * 8;
            dst[(2 * q) ^ (int)(b & 7)] = fd_e4m3x4(__byte_perm(v.x, v.y, 0x6420));
            dst[(2 * q + 1) ^ (int)(b & 7)] = fd_e4m3x4(__byte_perm(v.x, v.y, 0x7531));
        }
        for (int64_t i = tid; i < (int64_t)tn * kbn; i += FD_THREADS) {
            const int t = (int)(i / kbn);
            const int64_t arow = rows ? rows[base + t0 + t] : t0 + t;
            sas[i] = __ldg(sa + arow * kbn + (i - (int64_t)t * kbn));
        }
        __syncthreads();

        for (int p = 0; p < FD_PASSES; p++) {
            const int64_t r = r0 + (int64_t)(p * FD_WARPS + warp) * per + sub;
            const bool rv = r < n;
            const uint8_t *wr = we + (rv ? r : 0) * rowb, *sr = wse + (rv ? r : 0) * kbn;
            float acc[TT];
#pragma unroll
            for (int t = 0; t < TT; t++) acc[t] = 0.0f;
            for (int64_t b0 = li; b0 < kbn; b0 += FD_BATCH * L) {
                uint4 qv[FD_BATCH];
                uint32_t sb[FD_BATCH];
#pragma unroll
                for (int j = 0; j < FD_BATCH; j++) { /* the loads first: bytes in flight */
                    const int64_t b = b0 + (int64_t)j * L;
                    const bool ok = rv && b < kbn;
                    qv[j] = ok ? __ldg((const uint4 *)(wr + b * 16)) : make_uint4(0u, 0u, 0u, 0u);
                    sb[j] = ok ? __ldg(sr + b) : 0u;
                }
#pragma unroll
                for (int j = 0; j < FD_BATCH; j++) {
                    const int64_t b = b0 + (int64_t)j * L;
                    if (b >= kbn) break;
                    const uint32_t wq[4] = {qv[j].x, qv[j].y, qv[j].z, qv[j].w};
                    const int sw8 = (int)(b & 7);
                    float d[TT];
#pragma unroll
                    for (int t = 0; t < TT; t++) d[t] = 0.0f;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 lo0 = fd_e4m3x4(fd_lo(wq[q])), hi0 = fd_e4m3x4(fd_hi(wq[q]));
#pragma unroll
                        for (int t = 0; t < TT; t++) {
                            if (t >= tn) break;
                            const float4 *xb = xs + ((int64_t)t * kbn + b) * 8;
                            const float4 xe = xb[(2 * q) ^ sw8], xo = xb[(2 * q + 1) ^ sw8];
                            float s = d[t];
                            s = fmaf(lo0.x, xe.x, s);
                            s = fmaf(lo0.y, xe.y, s);
                            s = fmaf(lo0.z, xe.z, s);
                            s = fmaf(lo0.w, xe.w, s);
                            s = fmaf(hi0.x, xo.x, s);
                            s = fmaf(hi0.y, xo.y, s);
                            s = fmaf(hi0.z, xo.z, s);
                            s = fmaf(hi0.w, xo.w, s);
                            d[t] = s;
                        }
                    }
                    const float fw = e8m0_to_f32(sb[j]);
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        if (t < tn) acc[t] = fmaf(d[t] * 64.0f, sas[(int64_t)t * kbn + b] * fw, acc[t]);
                }
            }
#pragma unroll
            for (int t = 0; t < TT; t++)
                for (int o = L >> 1; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
            if (rv && li == 0)
#pragma unroll
                for (int t = 0; t < TT; t++)
                    if (t < tn) store_out1(out, out_mode, (base + t0 + t) * n + r, acc[t]);
        }
    }
}

/* Lanes per weight row: the most (up to 32) that divide the row's blocks,
 * so no lane idles at the row's end; 32 with a few idle where that would be
 * under 8 on a long row. Depends on k alone (the bits do). */
static int fd_lanes(int64_t kbn) {
    int L = 32;
    while (L > 1 && kbn % L) L >>= 1;
    if (L < 8 && kbn >= 64) L = 32;
    return L;
}

static size_t fd_smem(int tt, int64_t k) { return (size_t)tt * (size_t)(k / 32) * (8 * 16 + 4); }

int cuda_fp4_dec_applies(const uint8_t *qa, const uint8_t *w, int64_t k) {
    return k > 0 && k % 32 == 0 && (uintptr_t)qa % 16 == 0 && (uintptr_t)w % 16 == 0 &&
           fd_smem(2, k) <= FD_SMEM_MAX;
}

template <int TT>
static cudaError_t fd_go(dim3 grid, int64_t k, const uint8_t *qa, const float *sa, int64_t m,
                         const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                         const int32_t *off, const int32_t *rows, int lanes, void *out,
                         int out_mode, cudaStream_t stream) {
    static size_t attr = 0; /* the shared memory the kernel is allowed so far */
    const size_t smem = fd_smem(TT, k);
    if (smem > 48 * 1024 && smem > attr) {
        cudaError_t e = cudaFuncSetAttribute(k_fp4_dec<TT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return e;
        attr = smem;
    }
    cuda_launch_pdl(k_fp4_dec<TT>, grid, dim3(FD_THREADS), smem, stream, qa, sa, m, k, w, ws, n, ids,
                    off, rows, lanes, out, out_mode);
    return cudaGetLastError();
}

di_status cuda_launch_fp4_dec(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                              const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                              const int32_t *off, int32_t ngroups, const int32_t *rows,
                              int32_t max_rows, void *out, int out_mode, cudaStream_t stream,
                              di_err *err) {
    if (!cuda_fp4_dec_applies(qa, w, k))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4 (decode form): k = %lld (a multiple of 32 up to %d) and "
                          "16-byte aligned codes and weights needed",
                          (long long)k, (int)(FD_SMEM_MAX / (2 * (8 * 16 + 4)) * 32));
    const int groups = ids ? ngroups : 1;
    if (groups <= 0 || n <= 0 || (!ids && m <= 0)) return DI_OK;
    if (groups > 65535)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 (decode form): %d groups (at most 65535)",
                          (int)groups);
    const int lanes = fd_lanes(k / 32);
    const int64_t per_block = (int64_t)FD_PASSES * FD_WARPS * (32 / lanes);
    const int64_t bx = (n + per_block - 1) / per_block;
    if (bx > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 (decode form): n = %lld rows", (long long)n);
    const dim3 grid((unsigned)bx, (unsigned)groups);
    const int64_t most = ids ? max_rows : m;
    cudaError_t e = most >= 2
                        ? fd_go<2>(grid, k, qa, sa, m, w, ws, n, ids, off, rows, lanes, out, out_mode, stream)
                        : fd_go<1>(grid, k, qa, sa, m, w, ws, n, ids, off, rows, lanes, out, out_mode, stream);
    return cuda_check(e, err, "gemm_mxfp4 (decode form)");
}
