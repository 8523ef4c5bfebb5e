/* CUDA matmul for the weights and modes the FP8 tensor-core paths do not
 * cover (architecture.md §2): BF16 and F32 weights, and FP8 / MXFP4 weights
 * with unquantized activations (BF16 numerics, the grouped wo_a).
 *
 * F32 weights: the CPU backend's order, one fused multiply-add chain per
 * output in increasing k (kernels.h), and its bits. From 3 rows of x up,
 * tiled so the chain order survives: a block owns 256 outputs (a thread
 * each) and 4 or 8 rows of x (MR accumulators per thread); per step it
 * stages a 256 x 32 weight tile in shared memory with coalesced loads and
 * the rows' 32 inputs, then each thread runs its chains over the 32 k in
 * order. For one or two rows each thread reads its own weight row.
 *
 * BF16 / FP8 / MXFP4 weights: the tensor-core kernel further down (its
 * comment gives the order and the error bound against the chain). */
#include "backend/cuda/cuda_ops_common.cuh"

#include <cublas_v2.h>

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

/* ---- decode-speed products on the tensor cores ----------------------------
 *
 * BF16 weights and FP8 / MXFP4 weights with unquantized activations (the
 * head, routers, compressor, indexer, the grouped wo_a) at any m. The
 * sequential chain above needs one thread per output walking K with a
 * 4-cycle dependency per element; at decode the whole head then takes ms.
 * Here the weights are read once, 16 bytes per load, by warps that each own
 * 16 or 32 outputs and a fixed share of K, and the products run on
 * mma.sync m16n8k16 (bf16 in, fp32 accumulation).
 *
 * Arithmetic. Every weight is exact in bf16 (bf16 itself; e4m3·2^e and
 * e2m1·2^e have at most 4 significant bits; not so only for fp32-subnormal
 * products, a scale below 2^-120). x is split exactly into three bf16
 * terms x = h + m + l (8 + 8 + 8 significant bits; the residues are exact
 * fp32 differences), so every product w·h, w·m, w·l is exact and only the
 * summation differs from the CPU's chain: per 32-wide chunk of K two k16
 * steps of three mma each, the chunks of K spread over the block's 8 warps
 * (chunk c to warp c mod 8, each warp in increasing c), then the 8 warp
 * sums added by a fixed tree (w + w+4, then + w+2, then + w+1). The split
 * and the tree depend on K only, never on m, N or where a row sits in the
 * batch, so a row's bits do not depend on the rows beside it. Bound (the
 * tests' check): each mma adds 16 exact products to its accumulator and
 * rounds once (the tensor cores align to the largest term and drop the
 * bits below, up to ~18 units of 2^-24 of the sum of magnitudes), so
 * |y - exact| <= (18·n_mma + 3)·2^-23·Σ|w·x| with n_mma = 6·ceil(K/256) the
 * mma per warp; the CPU's chain is within K·2^-24·Σ|w·x|.
 * A split term that is zero in all 8 rows of a warp's tile is skipped
 * (activations are often bf16 already): the products it would add are
 * exact zeros. x must be finite below 2^128·(1 - 2^-9) to split (a larger
 * finite value rounds to inf in bf16); inf / NaN in x give NaN or inf as
 * the chain does. */

#include "backend/cuda/cuda_mma.cuh"

enum { TC_KW = 8, TC_CH = 32 };

/* The 8 weights W[row, k0 .. k0+7] as four bf16 pairs (0 past K or for a
 * row past the matrix). vec: 16-byte (BF16) / 8-byte (FP8) loads allowed. */
template <int FMT>
__device__ __forceinline__ void load_w8(uint32_t (&a)[4], const void *w, const uint8_t *s, int64_t K,
                                        int64_t kb, int64_t row, bool row_ok, int64_t k0, int vec) {
    if (!row_ok || k0 >= K) {
        a[0] = a[1] = a[2] = a[3] = 0u;
        return;
    }
    if (vec && k0 + 8 <= K) {
        if (FMT == DI_WFMT_BF16) {
            uint4 v = __ldcs((const uint4 *)((const uint16_t *)w + row * K + k0));
            a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
            return;
        }
        if (FMT == DI_WFMT_FP8) {
            uint2 v = __ldcs((const uint2 *)((const uint8_t *)w + row * K + k0));
            e4m3x8_bf16x2(v, e8m0_to_f32(s[(row / 32) * kb + k0 / 32]), a);
            return;
        }
    }
#pragma unroll
    for (int p = 0; p < 4; p++) {
        int64_t k = k0 + 2 * p;
        float v0 = k < K ? w_at<FMT>(w, s, K, kb, row, k) : 0.f;
        float v1 = k + 1 < K ? w_at<FMT>(w, s, K, kb, row, k + 1) : 0.f;
        a[p] = pack_bf16x2(v0, v1);
    }
}

/* Eight values of x split into three bf16 terms, as pairs. */
__device__ __forceinline__ void split_x8(uint32_t (&h)[4], uint32_t (&md)[4], uint32_t (&l)[4],
                                         const float (&v)[8]) {
#pragma unroll
    for (int p = 0; p < 4; p++) {
        float a = v[2 * p], b = v[2 * p + 1];
        __nv_bfloat162 hv = __floats2bfloat162_rn(a, b);
        float2 hf = __bfloat1622float2(hv);
        /* exact residues; a non-finite x keeps only its first term */
        float ra = isfinite(a) ? a - hf.x : 0.f, rb = isfinite(b) ? b - hf.y : 0.f;
        __nv_bfloat162 mv = __floats2bfloat162_rn(ra, rb);
        float2 mf = __bfloat1622float2(mv);
        h[p] = *reinterpret_cast<uint32_t *>(&hv);
        md[p] = *reinterpret_cast<uint32_t *>(&mv);
        l[p] = pack_bf16x2(ra - mf.x, rb - mf.y);
    }
}

/* One chunk's products for a 16-output tile (the weight rows g and g + 8
 * of the lane as bf16 pairs r0 / r1) and an n8 tile of x's three terms:
 * two k16 steps a term, the terms in order, the second / third left out
 * where they are zero in the whole warp's tile (use_m / use_l). */
__device__ __forceinline__ void mma_terms(float (&acc)[4], const uint32_t (&r0)[4], const uint32_t (&r1)[4],
                                          const uint32_t (&xh)[4], const uint32_t (&xm)[4],
                                          const uint32_t (&xl)[4], bool use_m, bool use_l) {
    const uint32_t a0[4] = {r0[0], r1[0], r0[1], r1[1]}, a1[4] = {r0[2], r1[2], r0[3], r1[3]};
    mma_bf16_16816(acc, a0, xh[0], xh[1]);
    mma_bf16_16816(acc, a1, xh[2], xh[3]);
    if (use_m) {
        mma_bf16_16816(acc, a0, xm[0], xm[1]);
        mma_bf16_16816(acc, a1, xm[2], xm[3]);
    }
    if (use_l) {
        mma_bf16_16816(acc, a0, xl[0], xl[1]);
        mma_bf16_16816(acc, a1, xl[2], xl[3]);
    }
}

/* x[k0 .. k0+7] of one row (0 past K or for a row past m), split. */
__device__ __forceinline__ void load_x_split(uint32_t (&h)[4], uint32_t (&md)[4], uint32_t (&l)[4],
                                             const float *xr, bool row_ok, int64_t K, int64_t k0,
                                             int vec) {
    float v[8];
    if (row_ok && vec && k0 + 8 <= K) {
        float4 p = __ldg((const float4 *)(xr + k0)), q = __ldg((const float4 *)(xr + k0 + 4));
        v[0] = p.x, v[1] = p.y, v[2] = p.z, v[3] = p.w, v[4] = q.x, v[5] = q.y, v[6] = q.z, v[7] = q.w;
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++) v[e] = row_ok && k0 + e < K ? xr[k0 + e] : 0.f;
    }
    split_x8(h, md, l, v);
}

/* Block: TC_KW warps sharing 16·T outputs (T m16 tiles per warp) and 8·NT
 * rows of x, K split over the warps by 32-wide chunks. Lane (g, t) =
 * (lane / 4, lane % 4) holds k = 8t .. 8t+7 of each chunk for weight rows
 * g and g + 8 of each tile and for x row g of each n8 tile: the mma's k
 * positions are a permutation of the chunk's, the same for both operands. */
template <int FMT, int NT, int T>
__global__ void __launch_bounds__(TC_KW * 32) k_mm_tc(const void *w, const uint8_t *s, int64_t K,
                                                      const float *x, int64_t ldx, int64_t m,
                                                      int64_t nr, float *y, int64_t ldy,
                                                      int out_bf16, int vec) {
    pdl_enter();
    __shared__ float red[TC_KW / 2][T * NT * 4][32];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int gz = blockIdx.z;
    const int64_t kb = (K + 31) / 32, nch = (K + TC_CH - 1) / TC_CH;
    const int64_t j0 = (int64_t)blockIdx.x * 16 * T, i0 = (int64_t)blockIdx.y * 8 * NT;
    int64_t wrow[T][2];
    bool wok[T][2];
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int h = 0; h < 2; h++) {
            int64_t j = j0 + tt * 16 + g + 8 * h;
            wok[tt][h] = j < nr;
            wrow[tt][h] = (int64_t)gz * nr + j;
        }
    const float *xr[NT];
    bool xok[NT];
#pragma unroll
    for (int nt = 0; nt < NT; nt++) {
        int64_t i = i0 + nt * 8 + g;
        xok[nt] = i < m;
        xr[nt] = x + (xok[nt] ? i : 0) * ldx + (int64_t)gz * K;
    }
    float acc[T][NT][4];
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++) acc[tt][nt][0] = acc[tt][nt][1] = acc[tt][nt][2] = acc[tt][nt][3] = 0.f;

    /* The whole-chunk fast loads (BF16, FP8; vector loads allowed and the
     * chunk inside K): row pointers formed once, and for FP8 one scale a
     * chunk when the block's 16·T rows lie in one 32-row scale block (then
     * every row of the lane has the scale of its first row). The same
     * loads and conversions as load_w8, without its per-chunk 64-bit row
     * arithmetic and its 2T scale loads (b1 run 4: ~300 instructions a
     * chunk on wo_a). */
    constexpr bool FASTW = FMT == DI_WFMT_BF16 || FMT == DI_WFMT_FP8;
    constexpr int ESZ = FMT == DI_WFMT_BF16 ? 2 : 1;
    const uint8_t *wp[T][2];
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int h = 0; h < 2; h++) wp[tt][h] = (const uint8_t *)w + (wok[tt][h] ? wrow[tt][h] : 0) * K * ESZ;
    const int64_t r0 = (int64_t)gz * nr + j0;
    const bool fast = FASTW && vec && (FMT != DI_WFMT_FP8 || r0 / 32 == (r0 + 16 * T - 1) / 32);
    const uint8_t *srow = FMT == DI_WFMT_FP8 && wok[0][0] ? s + (wrow[0][0] / 32) * kb : nullptr;
    uint32_t wa[2][T][2][4]; /* two chunks in flight */
    auto load_chunk = [&](int b, int64_t c) {
        int64_t k0 = c * TC_CH + 8 * t;
        if (FASTW && fast && c < nch && k0 + 8 <= K) {
            float sc = 0.f;
            if (FMT == DI_WFMT_FP8 && srow) sc = e8m0_to_f32(srow[c]);
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    uint32_t(&a)[4] = wa[b][tt][h];
                    if (!wok[tt][h]) {
                        a[0] = a[1] = a[2] = a[3] = 0u;
                    } else if (FMT == DI_WFMT_BF16) {
                        uint4 v = __ldcs((const uint4 *)(wp[tt][h] + 2 * k0));
                        a[0] = v.x, a[1] = v.y, a[2] = v.z, a[3] = v.w;
                    } else {
                        e4m3x8_bf16x2(__ldcs((const uint2 *)(wp[tt][h] + k0)), sc, a);
                    }
                }
            return;
        }
#pragma unroll
        for (int tt = 0; tt < T; tt++)
#pragma unroll
            for (int h = 0; h < 2; h++)
                load_w8<FMT>(wa[b][tt][h], w, s, K, kb, wrow[tt][h], wok[tt][h] && c < nch, k0, vec);
    };
    auto mma_chunk = [&](int b, int64_t c) {
        int64_t k0 = c * TC_CH + 8 * t;
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
            uint32_t xh[4], xm[4], xl[4];
            load_x_split(xh, xm, xl, xr[nt], xok[nt], K, k0, vec);
            bool use_m = __any_sync(0xffffffffu, (xm[0] | xm[1] | xm[2] | xm[3]) != 0u);
            bool use_l = __any_sync(0xffffffffu, (xl[0] | xl[1] | xl[2] | xl[3]) != 0u);
#pragma unroll
            for (int tt = 0; tt < T; tt++) mma_terms(acc[tt][nt], wa[b][tt][0], wa[b][tt][1], xh, xm, xl, use_m, use_l);
        }
    };
    int64_t c = warp;
    load_chunk(0, c);
    load_chunk(1, c + TC_KW);
    for (; c < nch; c += 2 * TC_KW) {
        mma_chunk(0, c);
        load_chunk(0, c + 2 * TC_KW);
        if (c + TC_KW < nch) mma_chunk(1, c + TC_KW);
        load_chunk(1, c + 3 * TC_KW);
    }

    /* the warps' sums by a fixed tree */
#pragma unroll
    for (int half = TC_KW / 2; half >= 1; half >>= 1) {
        if (warp >= half && warp < 2 * half) {
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) red[warp - half][(tt * NT + nt) * 4 + e][lane] = acc[tt][nt][e];
        }
        __syncthreads();
        if (warp < half) {
#pragma unroll
            for (int tt = 0; tt < T; tt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) acc[tt][nt][e] += red[warp][(tt * NT + nt) * 4 + e][lane];
        }
        __syncthreads();
    }
    if (warp) return;
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int64_t j = j0 + tt * 16 + g + 8 * (e >> 1), i = i0 + nt * 8 + 2 * t + (e & 1);
                if (j < nr && i < m) {
                    float v = acc[tt][nt][e];
                    y[i * ldy + (int64_t)gz * nr + j] = out_bf16 ? round_bf16(v) : v;
                }
            }
}

template <int FMT, int NT>
static void launch_tc(int T, dim3 grid, const void *w, const uint8_t *s, int64_t K, const float *x,
                      int64_t ldx, int64_t m, int64_t nr, float *y, int64_t ldy, int out_bf16, int vec) {
    if (T == 2) cuda_launch_pdl(k_mm_tc<FMT, NT, 2>, grid, TC_KW * 32, 0, 0, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec);
    else cuda_launch_pdl(k_mm_tc<FMT, NT, 1>, grid, TC_KW * 32, 0, 0, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec);
}

template <int FMT>
static void launch_tc_fmt(int nt, int T, dim3 grid, const void *w, const uint8_t *s, int64_t K,
                          const float *x, int64_t ldx, int64_t m, int64_t nr, float *y, int64_t ldy,
                          int out_bf16, int vec) {
    switch (nt) {
    case 1: launch_tc<FMT, 1>(T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    case 2: launch_tc<FMT, 2>(T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    case 4: launch_tc<FMT, 4>(T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    default: launch_tc<FMT, 8>(T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    }
}

static int tc_forced_tiles = 0; /* measuring and test aid: 16-output tiles per warp, 0 = choose */
extern "C" void cuda_matmul_set_tiles(int t) { tc_forced_tiles = t; }

/* ---- the decode form (m <= 8): the same arithmetic, fed from shared memory
 *
 * At decode k_mm_tc is bound neither by DRAM nor by the tensor cores but by
 * what each warp does around a chunk (docs/gpu-notes.md, b1 runs 1-5: wo_a
 * 50 µs for 33.5 MB, the router 19 µs for 3.9 MB): x loaded from global
 * memory and split into its three bf16 terms inside the loop, by all 32
 * lanes whatever m is, one dependent round trip a chunk; and at most two
 * chunks of weights in flight a warp, which on the few blocks of the small
 * products (24 for the router, 2 for the indexer's) leaves most SMs idle
 * and the rest waiting. This form keeps every operation of k_mm_tc and
 * their order — warp-chain e (e < 8) adds chunks e, e+8, ... of K in
 * increasing order with the same two k16 steps of the same three terms, the
 * eight chains then added by the same tree — and changes only where the
 * operands come from:
 * - the weights stream into a per-lane ring in shared memory by cp.async,
 *   RD chunks ahead (each lane copies exactly the fragment it later reads,
 *   so a lane waits only for its own copies: no barrier in the loop), the
 *   first RD issued before the wait on the kernel ahead (weights are
 *   constants);
 * - x is split once per block into shared memory, for live rows only,
 *   in phases of ps rounds (one chunk per chain a round) when m·K is large;
 *   a second or third term that is zero in a whole phase (x bf16-valued,
 *   as at decode) is then neither loaded nor voted on (run 114 in
 *   docs/gpu-notes.md: the bf16 products at one row −7 to −9 %);
 * - a round's shared loads and E4M3 conversion are issued while the round
 *   before it runs its mma (two operand sets used in turn);
 * - the eight chains of a row tile may sit in up to 8 blocks of a cluster
 *   (cl of them, 8 / cl chain-warps each) so that small products fill the
 *   GPU; every chain's sums go to rank 0's shared memory, which adds them
 *   by the tree.
 * So every output has k_mm_tc's bits (checked bit for bit against it by
 * test_cuda_ops). Needs K % 32 == 0, aligned rows and x, BF16 or FP8 with
 * each row tile inside one 32-row scale block. */

enum { DEC_XBUDGET = 32 * 1024, DEC_RINGBUDGET = 64 * 1024 };

__device__ __forceinline__ void cp_async_w(uint32_t dst, const void *src, bool ok, int bytes) {
    /* src-size 0 fills zeros: rows past the matrix, rounds past K */
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 16 : 0)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(dst), "l"(src), "r"(ok ? 8 : 0)
                     : "memory");
}
/* the same with an L2 policy (l2_weight_policy): the decode form's weights */
__device__ __forceinline__ void cp_async_wpol(uint32_t dst, const void *src, bool ok, int bytes, uint64_t pol) {
    if (bytes == 16)
        asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(dst), "l"(src),
                     "r"(ok ? 16 : 0), "l"(pol)
                     : "memory");
    else
        asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 8, %2, %3;\n" ::"r"(dst), "l"(src),
                     "r"(ok ? 8 : 0), "l"(pol)
                     : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* Shared memory of one block, in bytes: the chains' sums (rank 0 adds
 * them), the FP8 scales of the tile's row block, the weight ring, x's
 * terms. */
struct DecSmem {
    int red, scl, ring, xs, total;
    __host__ __device__ DecSmem(int fmt, int T, int rd, int cw, int m, int ps, int64_t K) {
        const int pb = fmt == DI_WFMT_BF16 ? 16 : 8;
        red = 0;
        scl = red + 8 * T * 4 * 32 * 4;
        ring = scl + (int)((K / 32 * 4 + 15) / 16 * 16);
        xs = ring + cw * rd * 2 * T * 32 * pb;
        total = xs + ps * cw * m * 4 * 48;
    }
};

template <int FMT, int T, int RD>
__global__ void __launch_bounds__(TC_KW * 32, 2) k_mm_dec(const void *w, const uint8_t *s, int64_t K,
                                                       const float *x, int64_t ldx, int m, int64_t nr,
                                                       float *y, int64_t ldy, int out_bf16, int cl, int ps,
                                                       const void *w2, const uint8_t *s2, float *y2, int xskip) {
    extern __shared__ __align__(16) uint8_t dsm[];
    constexpr int ESZ = FMT == DI_WFMT_BF16 ? 2 : 1, PB = 8 * ESZ, NP = 2 * T, XB = T == 2 ? 2 : 4;
    if (blockIdx.z) { /* a pair's second matrix: same shape, same x, its own output */
        w = w2;
        s = s2;
        y = y2;
    }
    /* No division by a run-time value (~20 instructions each, and a
     * one-warp block runs every one in series): cl and cw are powers of two
     * (shifts), and m <= 8 divides a phase's item numbers (below
     * DEC_XBUDGET / 48) exactly as a product with ceil(2^32 / m), shifted. */
    const int lcl = __ffs(cl) - 1, lcw = 3 - lcl, cw = TC_KW >> lcl, nthr = 32 * cw;
    const uint64_t inv_m = (uint64_t)(0xffffffffu / (uint32_t)m) + 1u; /* ceil(2^32 / m); 2^32 at m = 1 */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int rank = (int)(blockIdx.x & (unsigned)(cl - 1)), e = rank * cw + warp;
    const int64_t tile = blockIdx.x >> lcl, gz = blockIdx.y, j0 = tile * 16 * T;
    const int nch = (int)(K / 32), R = (nch + TC_KW - 1) / TC_KW;
    const DecSmem L(FMT, T, RD, cw, m, ps, K);
    float *scl = (float *)(dsm + L.scl);
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(dsm + L.ring) + (uint32_t)(warp * RD * NP * 32 * PB);
    const uint8_t *ringp = dsm + L.ring + warp * RD * NP * 32 * PB + lane * PB;
    const uint4 *xs = (const uint4 *)(dsm + L.xs);

    /* weights first: constants, so before the wait on the kernel ahead */
    const uint8_t *wp[NP];
    bool wok[NP];
#pragma unroll
    for (int p = 0; p < NP; p++) {
        int64_t j = j0 + (p >> 1) * 16 + g + 8 * (p & 1);
        wok[p] = j < nr;
        wp[p] = (const uint8_t *)w + ((gz * nr + (wok[p] ? j : 0)) * K + 8 * t + e * TC_CH) * ESZ;
    }
    /* every weight is read by one warp of the launch, once */
    const uint64_t wpol = l2_weight_policy(true);
    /* one copy group a round, empty past this chain's last chunk (that
     * round's products are skipped, so its slot is never read as an
     * operand): the waits count groups, and most rounds of a short K are
     * past the end (RD 32 against 20 rounds at K 5,120) */
    auto issue = [&](int q, int slot) {
        if (q * TC_KW + e < nch) { /* warp-uniform */
            const int64_t off = (int64_t)q * (TC_KW * TC_CH * ESZ);
#pragma unroll
            for (int p = 0; p < NP; p++)
                cp_async_wpol(ring + (uint32_t)(((slot * NP + p) * 32 + lane) * PB), wp[p] + off, wok[p], PB, wpol);
        }
        cp_async_commit();
    };
#pragma unroll 1
    for (int q = 0; q < RD; q++) issue(q, q);
    if (FMT == DI_WFMT_FP8) {
        const uint8_t *srow = s + ((gz * nr + j0) / 32) * nch;
        for (int i = threadIdx.x; i < nch; i += nthr) scl[i] = e8m0_to_f32(srow[i]);
    }
    grid_dep_wait();
    grid_dep_launch();
    if (cl > 1) asm volatile("barrier.cluster.arrive.relaxed.aligned;\n" ::: "memory");

    /* a round's operands: x's three terms (bit 0 / 1 of fl: the second /
     * third is needed somewhere in the warp), the weights as bf16 pairs */
    struct Ops {
        uint4 xh, xm, xl;
        uint32_t wa[NP][4];
        int fl;
    };
    int xt = 3; /* the phase's x terms that are nonzero somewhere in the block: bit 0 the second, bit 1 the third */
    auto load = [&](Ops &o, int q, int q0, int slot) {
        o.xh = o.xm = o.xl = make_uint4(0, 0, 0, 0);
        if (g < m) {
            const uint4 *xp = xs + ((((q - q0) * cw + warp) * m + g) * 4 + t) * 3;
            o.xh = xp[0];
            if (xt & 1) o.xm = xp[1];
            if (xt & 2) o.xl = xp[2];
        }
        /* xt is block-uniform: every lane of the warp votes or none does */
        o.fl = ((xt & 1) && __any_sync(0xffffffffu, (o.xm.x | o.xm.y | o.xm.z | o.xm.w) != 0u) ? 1 : 0) |
               ((xt & 2) && __any_sync(0xffffffffu, (o.xl.x | o.xl.y | o.xl.z | o.xl.w) != 0u) ? 2 : 0);
        const int c = q * TC_KW + e;
        if (FMT == DI_WFMT_BF16) {
#pragma unroll
            for (int p = 0; p < NP; p++) {
                uint4 v = *(const uint4 *)(ringp + (slot * NP + p) * 32 * PB);
                o.wa[p][0] = v.x, o.wa[p][1] = v.y, o.wa[p][2] = v.z, o.wa[p][3] = v.w;
            }
        } else {
            /* the round's codes share one scale: the four-instruction
             * conversion (cuda_mma.cuh), the same bits as k_mm_tc's */
            uint2 v[NP];
#pragma unroll
            for (int p = 0; p < NP; p++) v[p] = *(const uint2 *)(ringp + (slot * NP + p) * 32 * PB);
            e4m3x8n_bf16x2<NP>(v, c < nch ? scl[c] : 0.f, o.wa);
        }
    };

    float acc[T][4];
#pragma unroll
    for (int tt = 0; tt < T; tt++) acc[tt][0] = acc[tt][1] = acc[tt][2] = acc[tt][3] = 0.f;
    const float *xg = x + gz * K;
    int slot = 0;
    for (int q0 = 0; q0 < R; q0 += ps) {
        const int q1 = q0 + ps < R ? q0 + ps : R;
        /* x's terms for this phase: (round, chain-warp, row, t) items of 8
         * values, XB items' loads in flight a thread */
        __syncthreads(); /* the last phase's terms are read */
        const int items = (q1 - q0) * cw * m * 4;
        int ff = 0; /* this thread's items: a second / third term nonzero (bits 0 / 1) */
        for (int base = threadIdx.x; base < items; base += XB * nthr) {
            float v[XB][8];
#pragma unroll
            for (int u = 0; u < XB; u++) {
                const int it = base + u * nthr;
                const int tq = it & 3, rest = it >> 2, rm = (int)(((uint64_t)rest * inv_m) >> 32);
                const int i = rest - rm * m, ww = rm & (cw - 1);
                const int c = (q0 + (rm >> lcw)) * TC_KW + rank * cw + ww;
                if (it < items && c < nch) {
                    const float *xr = xg + (int64_t)i * ldx + c * TC_CH + 8 * tq;
                    float4 a = __ldg((const float4 *)xr), b = __ldg((const float4 *)(xr + 4));
                    v[u][0] = a.x, v[u][1] = a.y, v[u][2] = a.z, v[u][3] = a.w;
                    v[u][4] = b.x, v[u][5] = b.y, v[u][6] = b.z, v[u][7] = b.w;
                } else {
#pragma unroll
                    for (int z = 0; z < 8; z++) v[u][z] = 0.f;
                }
            }
#pragma unroll
            for (int u = 0; u < XB; u++) {
                const int it = base + u * nthr;
                if (it >= items) break;
                uint32_t h[4], md[4], l[4];
                split_x8(h, md, l, v[u]);
                ff |= ((md[0] | md[1] | md[2] | md[3]) != 0u ? 1 : 0) | ((l[0] | l[1] | l[2] | l[3]) != 0u ? 2 : 0);
                uint4 *d = (uint4 *)(dsm + L.xs) + it * 3;
                d[0] = make_uint4(h[0], h[1], h[2], h[3]);
                d[1] = make_uint4(md[0], md[1], md[2], md[3]);
                d[2] = make_uint4(l[0], l[1], l[2], l[3]);
            }
        }
        /* the block's terms, with the barrier the rounds wait for anyway: a
         * term that is zero in the whole phase is neither loaded nor voted
         * on (the votes would find it zero in every warp: the same mma) */
        xt = xskip ? (__syncthreads_or(ff & 1) ? 1 : 0) | (__syncthreads_or(ff & 2) ? 2 : 0) : (__syncthreads(), 3);
        /* one round ahead: the next round's loads and conversions go out
         * while this round's products run (two operand sets used in turn,
         * so nothing is copied between them) */
        auto step = [&](Ops &cur, Ops &nxt, int q) {
            const int nslot = slot + 1 == RD ? 0 : slot + 1;
            if (q + 1 < q1) {
                cp_async_wait<RD - 2>(); /* this lane's copies of round q + 1 have landed */
                load(nxt, q + 1, q0, nslot);
            }
            if (q * TC_KW + e < nch) { /* warp-uniform */
#pragma unroll
                for (int tt = 0; tt < T; tt++) {
                    const uint32_t(&r0)[4] = cur.wa[2 * tt], (&r1)[4] = cur.wa[2 * tt + 1];
                    const uint32_t a0[4] = {r0[0], r1[0], r0[1], r1[1]}, a1[4] = {r0[2], r1[2], r0[3], r1[3]};
                    mma_bf16_16816(acc[tt], a0, cur.xh.x, cur.xh.y);
                    mma_bf16_16816(acc[tt], a1, cur.xh.z, cur.xh.w);
                    if (cur.fl & 1) {
                        mma_bf16_16816(acc[tt], a0, cur.xm.x, cur.xm.y);
                        mma_bf16_16816(acc[tt], a1, cur.xm.z, cur.xm.w);
                    }
                    if (cur.fl & 2) {
                        mma_bf16_16816(acc[tt], a0, cur.xl.x, cur.xl.y);
                        mma_bf16_16816(acc[tt], a1, cur.xl.z, cur.xl.w);
                    }
                }
            }
            issue(q + RD, slot); /* the slot's values are in registers and used */
            slot = nslot;
        };
        Ops oa, ob;
        cp_async_wait<RD - 1>(); /* this lane's copies of round q0 have landed */
        load(oa, q0, q0, slot);
#pragma unroll 1
        for (int q = q0; q < q1; q += 2) {
            step(oa, ob, q);
            if (q + 1 < q1) step(ob, oa, q + 1);
        }
    }
    cp_async_wait<0>();

    /* every chain's sums to rank 0, which adds them by k_mm_tc's tree */
    float *red = (float *)(dsm + L.red);
    if (cl > 1) {
        asm volatile("barrier.cluster.wait.aligned;\n" ::: "memory"); /* rank 0 is running */
#pragma unroll
        for (int tt = 0; tt < T; tt++)
#pragma unroll
            for (int k = 0; k < 4; k++) {
                uint32_t local = (uint32_t)__cvta_generic_to_shared(red + ((e * T + tt) * 4 + k) * 32 + lane), remote;
                asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(0));
                asm volatile("st.shared::cluster.f32 [%0], %1;\n" ::"r"(remote), "f"(acc[tt][k]) : "memory");
            }
        asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
    } else {
#pragma unroll
        for (int tt = 0; tt < T; tt++)
#pragma unroll
            for (int k = 0; k < 4; k++) red[((e * T + tt) * 4 + k) * 32 + lane] = acc[tt][k];
        __syncthreads();
    }
    if (rank || warp) return;
#pragma unroll
    for (int tt = 0; tt < T; tt++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            float a[TC_KW];
#pragma unroll
            for (int c = 0; c < TC_KW; c++) a[c] = red[((c * T + tt) * 4 + k) * 32 + lane];
            const float v = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
            const int64_t j = j0 + tt * 16 + g + 8 * (k >> 1), i = 2 * t + (k & 1);
            if (j < nr && i < m) y[i * ldy + gz * nr + j] = out_bf16 ? round_bf16(v) : v;
        }
}

/* Test aid (test_cuda_ops: every code at every scale): item i is four
 * groups of eight E4M3 codes sharing the scale byte sb[i]; out gets 52
 * words an item: the four-instruction form alone (16; meaningful only for
 * a scale in its range), the guarded form as k_mm_dec runs it (16), the
 * reference form (16) and each group's NaN marks (4). */
__global__ void k_e4m3_forms(const uint2 *codes, const uint8_t *sb, int n, uint32_t *out) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float s = e8m0_to_f32(sb[i]);
    uint2 v[4];
    uint32_t fast[4][4], guarded[4][4], ref[4][4];
    uint32_t *o = out + (size_t)i * 52;
#pragma unroll
    for (int p = 0; p < 4; p++) v[p] = codes[4 * i + p];
#pragma unroll
    for (int p = 0; p < 4; p++) o[48 + p] = e4m3x8_bf16x2_mul(v[p], e4m3_bf16_mul(s), fast[p]);
    e4m3x8n_bf16x2<4>(v, s, guarded);
#pragma unroll
    for (int p = 0; p < 4; p++) e4m3x8_bf16x2(v[p], s, ref[p]);
#pragma unroll
    for (int p = 0; p < 4; p++)
#pragma unroll
        for (int k = 0; k < 4; k++) {
            o[p * 4 + k] = fast[p][k];
            o[16 + p * 4 + k] = guarded[p][k];
            o[32 + p * 4 + k] = ref[p][k];
        }
}

extern "C" di_status cuda_e4m3_forms(const void *codes, const void *sb, int n, void *out, di_err *err) {
    if (n <= 0) return DI_OK;
    k_e4m3_forms<<<(unsigned)((n + 127) / 128), 128>>>((const uint2 *)codes, (const uint8_t *)sb, n, (uint32_t *)out);
    return cuda_check_launch(err, "e4m3 forms");
}

static int dec_mode = 1;    /* measuring and test aid: 0 = k_mm_tc at every m */
static int dec_forced_cl = 0; /* measuring and test aid: blocks a row tile's chains spread over */
extern "C" void cuda_matmul_set_decode(int on, int cl) {
    dec_mode = on;
    dec_forced_cl = cl;
}

/* Whether k_mm_dec skips x's terms that are zero in a whole phase (on;
 * DI_CUDA_MM_XSKIP=0 or cuda_matmul_set_xskip(0), measuring aids, load and
 * vote on all three in every round as before; the same bits either way) */
static int dec_xskip_forced = -1;
extern "C" void cuda_matmul_set_xskip(int on) { dec_xskip_forced = on == 0 || on == 1 ? on : -1; }
static int dec_xskip(void) {
    static int env = -1;
    return dec_xskip_forced >= 0 ? dec_xskip_forced : cuda_env_switch("DI_CUDA_MM_XSKIP", &env);
}

template <int FMT, int T, int RD>
static cudaError_t dec_launch(dim3 grid, int cl, int smem, const void *w, const uint8_t *s, int64_t K,
                              const float *x, int64_t ldx, int m, int64_t nr, float *y, int64_t ldy,
                              int out_bf16, int ps, const void *w2, const uint8_t *s2, float *y2) {
    static int attr = 0;
    if (smem > 48 * 1024 && smem > attr) {
        cudaError_t e = cudaFuncSetAttribute(k_mm_dec<FMT, T, RD>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        attr = smem;
    }
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    cfg.gridDim = grid;
    cfg.blockDim = dim3((unsigned)(32 * TC_KW / cl));
    cfg.dynamicSmemBytes = (size_t)smem;
    cfg.attrs = at;
    if (cl > 1) {
        at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
        at[cfg.numAttrs].val.clusterDim.x = (unsigned)cl;
        at[cfg.numAttrs].val.clusterDim.y = 1;
        at[cfg.numAttrs].val.clusterDim.z = 1;
        cfg.numAttrs++;
    }
    const int pdl = cuda_pdl_on();
    if (pdl) {
        at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
        cfg.numAttrs++;
    }
    cudaError_t e = cudaLaunchKernelEx(&cfg, k_mm_dec<FMT, T, RD>, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, cl, ps,
                                       w2, s2, y2, dec_xskip());
    if (e != cudaSuccess && pdl) { /* a runtime that refuses the attribute: the plain launch */
        (void)cudaGetLastError();
        cfg.numAttrs--;
        e = cudaLaunchKernelEx(&cfg, k_mm_dec<FMT, T, RD>, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, cl, ps, w2,
                               s2, y2, dec_xskip());
        if (e == cudaSuccess) cuda_pdl_refused();
    }
    return e;
}

template <int FMT, int T>
static cudaError_t dec_launch_rd(int rd, dim3 grid, int cl, int smem, const void *w, const uint8_t *s, int64_t K,
                                 const float *x, int64_t ldx, int m, int64_t nr, float *y, int64_t ldy,
                                 int out_bf16, int ps, const void *w2, const uint8_t *s2, float *y2) {
    switch (rd) {
    case 4: return dec_launch<FMT, T, 4>(grid, cl, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, ps, w2, s2, y2);
    case 8: return dec_launch<FMT, T, 8>(grid, cl, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, ps, w2, s2, y2);
    case 16: return dec_launch<FMT, T, 16>(grid, cl, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, ps, w2, s2, y2);
    default: return dec_launch<FMT, T, 32>(grid, cl, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, ps, w2, s2, y2);
    }
}

/* The decode form where it applies (*done = 0 otherwise, nothing launched).
 * With w2 (a second matrix of the same format and shape on the same x, its
 * output y2; groups 1) both in one launch, blockIdx.z picking the matrix:
 * every block does what it would for its matrix alone, so each output has
 * the bits of the single product (the spread cl and the tiles a warp T
 * never change them), and the pair pays one launch's latency, which is
 * most of these products' time at decode. */
static di_status matmul_dec(int fmt, const void *w, const uint8_t *s, int64_t K, const float *x, int64_t ldx,
                            int64_t m, int groups, int64_t nr, float *y, int64_t ldy, int out_bf16, int *done,
                            di_err *err, const void *w2 = NULL, const uint8_t *s2 = NULL, float *y2 = NULL) {
    *done = 0;
    static int env_on = -1; /* DI_CUDA_MM_DEC=0: k_mm_tc at every m (measuring aid for the model bench) */
    cuda_env_switch("DI_CUDA_MM_DEC", &env_on);
    if (!dec_mode || !env_on || m > 8 || (fmt != DI_WFMT_BF16 && fmt != DI_WFMT_FP8) || K % TC_CH || K > (1 << 20) ||
        ldx % 4 || ((uintptr_t)x & 15) || ((uintptr_t)w & 15) || groups > 65535 ||
        (w2 && (groups != 1 || ((uintptr_t)w2 & 15))))
        return DI_OK;
    const int sms = cuda_sm_count(), mats = w2 ? 2 : 1; /* matrices in the launch: placement only */
    int T = (nr + 31) / 32 * groups * mats >= sms ? 2 : 1;
    if (tc_forced_tiles == 1 || tc_forced_tiles == 2) T = tc_forced_tiles;
    if (fmt == DI_WFMT_FP8 && T == 2 && nr % 32) T = 1; /* a 32-row tile inside one scale block */
    if (fmt == DI_WFMT_FP8 && groups > 1 && nr % 16) return DI_OK; /* a 16-row one too */
    const int64_t tiles = (nr + 16 * T - 1) / (16 * T);
    /* many waves (the head: 4,040 row tiles): at m = 8 k_mm_tc, this form
     * splitting x in phases with a barrier each (products run 2: 597 µs
     * against 433); at m <= 2 this form unless DI_CUDA_HEAD_DEC=0:
     * 334 / 344 µs against 407 at m = 1 / 2, b1 step -0.08 ms (products
     * run 4, docs/gpu-notes.md) */
    static int waves_on = -1;
    cuda_env_switch("DI_CUDA_HEAD_DEC", &waves_on);
    if (tiles * groups > 8 * sms && !(m <= 2 && waves_on)) return DI_OK;
    int cl = 1;
    while (cl < TC_KW && tiles * groups * mats * cl < sms) cl *= 2;
    if (dec_forced_cl == 1 || dec_forced_cl == 2 || dec_forced_cl == 4 || dec_forced_cl == 8) cl = dec_forced_cl;
    if (tiles * cl > 0x7fffffff) return DI_OK;
    const int cw = TC_KW / cl, pb = fmt == DI_WFMT_BF16 ? 16 : 8;
    const int64_t R = (K / TC_CH + TC_KW - 1) / TC_KW;
    int rd = 4;
    while (rd < 32 && rd < R && cw * (2 * rd) * 2 * T * 32 * pb <= DEC_RINGBUDGET) rd *= 2;
    int64_t ps = DEC_XBUDGET / (cw * m * 4 * 48);
    if (ps < 1) ps = 1;
    if (ps > R) ps = R;
    const DecSmem L(fmt, T, rd, cw, (int)m, (int)ps, K);
    if (L.total > 200 * 1024) return DI_OK;
    dim3 grid((unsigned)(tiles * cl), (unsigned)groups, (unsigned)mats);
    cudaError_t e;
    if (fmt == DI_WFMT_BF16)
        e = T == 2 ? dec_launch_rd<DI_WFMT_BF16, 2>(rd, grid, cl, L.total, w, s, K, x, ldx, (int)m, nr, y, ldy, out_bf16, (int)ps, w2, s2, y2)
                   : dec_launch_rd<DI_WFMT_BF16, 1>(rd, grid, cl, L.total, w, s, K, x, ldx, (int)m, nr, y, ldy, out_bf16, (int)ps, w2, s2, y2);
    else
        e = T == 2 ? dec_launch_rd<DI_WFMT_FP8, 2>(rd, grid, cl, L.total, w, s, K, x, ldx, (int)m, nr, y, ldy, out_bf16, (int)ps, w2, s2, y2)
                   : dec_launch_rd<DI_WFMT_FP8, 1>(rd, grid, cl, L.total, w, s, K, x, ldx, (int)m, nr, y, ldy, out_bf16, (int)ps, w2, s2, y2);
    *done = 1;
    return cuda_check(e, err, "matmul (decode form)");
}

/* ---- the prefill form (many rows): the same arithmetic on 64 x 64 tiles
 *
 * At prefill k_mm_tc runs its decode-sized tiles (32 outputs x 64 rows a
 * block) over thousands of rows: every block loads its 64 rows of x from
 * L2 and splits them again for every 32 outputs, with two chunks in flight
 * a warp and one dependent round trip a chunk; the 8,192-row wo_a took
 * 39 ms, 14 TFLOP/s (docs/gpu-notes.md, prefill run 1). This form keeps
 * every operation of k_mm_tc and their order -- warp e adds chunks e, e+8,
 * ... of K in increasing order, per chunk the same two k16 steps of the
 * same three terms in the same fragments, the eight chains then added by
 * the same tree -- and changes where the operands come from and how much
 * a block covers:
 * - a block owns 64 outputs x 64 rows (twice k_mm_tc's outputs: x is read
 *   from L2 and split half as often; 128 accumulators a thread, one block
 *   of 8 warps an SM);
 * - each warp streams its chunks' operands (x as fp32, the weights in
 *   their format) by cp.async into its own two-slot ring in shared memory
 *   (no block barrier in the loop: a warp waits for its own copies), so
 *   the next chunk's 11-13 KB are in flight while this one's mma run; the
 *   weights' lanes copy the fragments they read (whole sectors already),
 *   x's lanes whole 32-byte sectors (the first form copied each lane's own
 *   fragment, half sectors: every sector of x crossed from L2 twice, and
 *   wo_a took 9.5 ms at 8,192 rows, L2-bound);
 * - the eight chains' sums meet in shared memory (the ring's bytes) at the
 *   end, and every thread adds some of the tile's outputs by the tree.
 * So every output has k_mm_tc's bits (test_cuda_ops checks it bit for bit,
 * and the bound of the exact sum). Needs K % 32 == 0, x 16-byte aligned
 * with ldx % 4 == 0, BF16 weights 16-byte / FP8 8-byte aligned, and FP8
 * weights in groups with nr % 32 == 0 (each half tile of 32 outputs inside
 * one scale block). */

enum { PF_T = 4, PF_NT = 8, PF_RD = 2, PF_O = 16 * PF_T, PF_R = 8 * PF_NT };

/* bytes of one warp's ring slot: x's 64 rows of a chunk (128 bytes, rows
 * padded to 144 so that the fragment loads are free of bank conflicts; the
 * bf16 form's 64 bytes a row, lane (g, t) reading bytes 16t.. of row g: a
 * quarter warp reads 128 consecutive bytes), then the weights' fragments (8
 * codes or 8 bf16 per row and lane) */
enum { PF_XROW = 144, PF_XROW16 = 64 };
__host__ __device__ constexpr int pf_xbytes(bool x16 = false) { return PF_R * (x16 ? PF_XROW16 : PF_XROW); }
__host__ __device__ constexpr int pf_slot_bytes(int esz, bool x16 = false) {
    return pf_xbytes(x16) + 2 * PF_T * 32 * 8 * esz;
}

/* The bf16 form (X16): when every value of x is bf16 already (its split's
 * second and third terms are zero everywhere, which x_split16 below finds
 * and records in *xflag), the fp32 form runs each chunk's mma on the first
 * term alone, the terms' fragments split in every block again: ~600
 * instructions a chunk and warp, ~a tenth of them mma, and 4 bytes a value
 * of x from L2 once per 64 outputs (wo_a at 8,192 rows: 6.5 ms, issue- and
 * L2-bound; docs/gpu-notes.md, prefill runs 2-4). The X16 form reads x16,
 * that first term written once per product as bf16, and runs the very same
 * mma on the very same fragments in the same order: the same bits. Both
 * forms are launched; each reads *xflag first and one of them leaves at
 * once (the choice needs no wait for the device). xflag NULL: the fp32 form
 * alone, as before. */
template <int FMT, bool X16>
__global__ void __launch_bounds__(TC_KW * 32, 1) k_mm_pf(const void *w, const uint8_t *s, int64_t K,
                                                      const float *x, int64_t ldx, int64_t m, int64_t nr,
                                                      float *y, int64_t ldy, int out_bf16,
                                                      const uint16_t *__restrict__ x16, const int *xflag) {
    extern __shared__ __align__(16) uint8_t psm[];
    if (xflag && (*xflag == 0) != X16) return; /* the other form's case: the whole grid alike */
    constexpr int ESZ = FMT == DI_WFMT_BF16 ? 2 : 1, PB = 8 * ESZ, NP = 2 * PF_T, XB = pf_xbytes(X16),
                  SB = pf_slot_bytes(ESZ, X16);
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t gz = blockIdx.z, j0 = (int64_t)blockIdx.x * PF_O, i0 = (int64_t)blockIdx.y * PF_R;
    const int nch = (int)(K / TC_CH);
    /* FP8: the scales of the tile's two 32-row blocks, per chunk */
    float *scl = (float *)(psm + TC_KW * PF_RD * SB);
    if (FMT == DI_WFMT_FP8) {
        const int64_t sb0 = (gz * nr + j0) / 32;
        for (int i = threadIdx.x; i < 2 * nch; i += TC_KW * 32) {
            const int h = i / nch, c = i - h * nch;
            scl[i] = j0 + 32 * h < nr ? e8m0_to_f32(s[(sb0 + h) * nch + c]) : 0.f;
        }
        __syncthreads();
    }
    const uint32_t ring = (uint32_t)__cvta_generic_to_shared(psm) + (uint32_t)(warp * PF_RD * SB);
    const float *xb = x + (i0 + g) * ldx + gz * K + 4 * t;
    const int64_t ld16 = (int64_t)gridDim.z * K; /* x16's rows: the groups' K values */
    const uint16_t *xb16 = X16 ? x16 + (i0 + g) * ld16 + gz * K + 8 * t : NULL;
    const uint8_t *wb = (const uint8_t *)w + ((gz * nr + j0 + g) * K + 8 * t) * ESZ;
    auto issue = [&](int q, int slot) {
        const int c = q * TC_KW + warp;
        const bool okc = c < nch;
        const int64_t k0 = okc ? (int64_t)c * TC_CH : 0;
        const uint32_t base = ring + (uint32_t)(slot * SB);
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++) {
            const bool ok = okc && i0 + nt * 8 + g < m;
            if (X16) { /* lane (g, t): bytes 16t.. of row g, its own fragment */
                const uint16_t *src = ok ? xb16 + nt * 8 * ld16 + k0 : x16;
                cp_async_w(base + (uint32_t)((nt * 8 + g) * PF_XROW16 + 16 * t), src, ok, 16);
                continue;
            }
            /* whole 32-byte sectors: lane t copies bytes 16t.. of each half
             * of its row (the fragment of lane t spans bytes 32t..32t+31,
             * so lanes of one row read each other's copies) */
            const float *src = ok ? xb + nt * 8 * ldx + k0 : x;
            const uint32_t d = base + (uint32_t)((nt * 8 + g) * PF_XROW + 16 * t);
            cp_async_w(d, src, ok, 16);
            cp_async_w(d + 64, ok ? src + 16 : x, ok, 16);
        }
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int jr = (p >> 1) * 16 + 8 * (p & 1);
            const bool ok = okc && j0 + jr + g < nr;
            const uint8_t *src = ok ? wb + ((int64_t)jr * K + k0) * ESZ : (const uint8_t *)w;
            cp_async_w(base + (uint32_t)(XB + (p * 32 + lane) * PB), src, ok, PB);
        }
        cp_async_commit();
    };
    issue(0, 0);
    issue(1, 1);
    float acc[PF_T][PF_NT][4];
#pragma unroll
    for (int tt = 0; tt < PF_T; tt++)
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++) acc[tt][nt][0] = acc[tt][nt][1] = acc[tt][nt][2] = acc[tt][nt][3] = 0.f;
    const int nq = warp < nch ? (nch - warp + TC_KW - 1) / TC_KW : 0;
#pragma unroll 1
    for (int q = 0; q < nq; q++) {
        const int slot = q & 1, c = q * TC_KW + warp;
        cp_async_wait<1>(); /* this lane's copies of chunk q have landed */
        __syncwarp();       /* and those of the other lanes of its rows */
        const uint8_t *sp = psm + (warp * PF_RD + slot) * SB;
        uint32_t wa[NP][4];
        if (FMT == DI_WFMT_BF16) {
#pragma unroll
            for (int p = 0; p < NP; p++) {
                const uint4 v = *(const uint4 *)(sp + XB + (p * 32 + lane) * 16);
                wa[p][0] = v.x, wa[p][1] = v.y, wa[p][2] = v.z, wa[p][3] = v.w;
            }
        } else {
            /* tiles 0-1 in the first scale block, 2-3 in the second */
            uint2 v0[NP / 2], v1[NP / 2];
            uint32_t a0[NP / 2][4], a1[NP / 2][4];
#pragma unroll
            for (int p = 0; p < NP / 2; p++) {
                v0[p] = *(const uint2 *)(sp + XB + (p * 32 + lane) * 8);
                v1[p] = *(const uint2 *)(sp + XB + ((p + NP / 2) * 32 + lane) * 8);
            }
            e4m3x8n_bf16x2<NP / 2>(v0, scl[c], a0);
            e4m3x8n_bf16x2<NP / 2>(v1, scl[nch + c], a1);
#pragma unroll
            for (int p = 0; p < NP / 2; p++)
#pragma unroll
                for (int k = 0; k < 4; k++) wa[p][k] = a0[p][k], wa[p + NP / 2][k] = a1[p][k];
        }
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++) {
            if (X16) { /* the first term as the fp32 form splits it; the others are zero */
                const uint4 p = *(const uint4 *)(sp + (nt * 8 + g) * PF_XROW16 + 16 * t);
                const uint32_t xh[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
                for (int tt = 0; tt < PF_T; tt++) mma_terms(acc[tt][nt], wa[2 * tt], wa[2 * tt + 1], xh, xh, xh, false, false);
                continue;
            }
            const uint4 p0 = *(const uint4 *)(sp + (nt * 8 + g) * PF_XROW + 32 * t);
            const uint4 p1 = *(const uint4 *)(sp + (nt * 8 + g) * PF_XROW + 32 * t + 16);
            const float v[8] = {__uint_as_float(p0.x), __uint_as_float(p0.y), __uint_as_float(p0.z),
                                __uint_as_float(p0.w), __uint_as_float(p1.x), __uint_as_float(p1.y),
                                __uint_as_float(p1.z), __uint_as_float(p1.w)};
            uint32_t xh[4], xm[4], xl[4];
            split_x8(xh, xm, xl, v);
            const bool use_m = __any_sync(0xffffffffu, (xm[0] | xm[1] | xm[2] | xm[3]) != 0u);
            const bool use_l = __any_sync(0xffffffffu, (xl[0] | xl[1] | xl[2] | xl[3]) != 0u);
#pragma unroll
            for (int tt = 0; tt < PF_T; tt++) mma_terms(acc[tt][nt], wa[2 * tt], wa[2 * tt + 1], xh, xm, xl, use_m, use_l);
        }
        __syncwarp();       /* every lane's values of the slot are in registers and used */
        issue(q + 2, slot);
    }
    cp_async_wait<0>();
    __syncthreads(); /* every warp's ring is idle: its bytes take the chains' sums */

    constexpr int NI = PF_T * PF_NT * 4;
    float *red = (float *)psm; /* [chain][NI][lane] */
#pragma unroll
    for (int tt = 0; tt < PF_T; tt++)
#pragma unroll
        for (int nt = 0; nt < PF_NT; nt++)
#pragma unroll
            for (int k = 0; k < 4; k++) red[(warp * NI + (tt * PF_NT + nt) * 4 + k) * 32 + lane] = acc[tt][nt][k];
    __syncthreads();
    for (int p = threadIdx.x; p < NI * 32; p += TC_KW * 32) {
        const int idx = p >> 5, ln = p & 31;
        float a[TC_KW];
#pragma unroll
        for (int e = 0; e < TC_KW; e++) a[e] = red[(e * NI + idx) * 32 + ln];
        const float v = ((a[0] + a[4]) + (a[2] + a[6])) + ((a[1] + a[5]) + (a[3] + a[7]));
        const int tt = idx / (PF_NT * 4), nt = (idx >> 2) % PF_NT, k = idx & 3;
        const int64_t j = j0 + tt * 16 + (ln >> 2) + 8 * (k >> 1), i = i0 + nt * 8 + 2 * (ln & 3) + (k & 1);
        if (j < nr && i < m) y[i * ldy + gz * nr + j] = out_bf16 ? round_bf16(v) : v;
    }
}

static int pf_min_rows = 512; /* measuring and test aid: rows from which the prefill form runs, 0 = never */
extern "C" void cuda_matmul_set_prefill(int min_rows) { pf_min_rows = min_rows; }

/* Decode batches past the decode form (m > 8) ran k_mm_tc, whose blocks of
 * 32 outputs each read and split all m rows of x: the head at m = 64 took
 * 2.7 ms for 1.3 GB of weights (torch's bf16 product 0.36), wo_a 0.19 ms.
 * The prefill form has the same bits and reads x once per 64 outputs (as
 * bf16 where x is bf16-valued). Measured (docs/gpu-notes.md, mid run 1,
 * `bench_cuda_ops --midm`), it wins from 9 rows on where its blocks cover
 * half the SMs (head m = 64 2,705 -> 557 µs, wo_a 195 -> 38) and from 32
 * rows on for the narrow products too (the router at m = 64 81 -> 39;
 * below 32 rows k_mm_tc's more, smaller blocks win there: 25 against 39).
 * DI_CUDA_MM_MID=0 turns this off, DI_CUDA_MM_MID=r starts it at r rows
 * (the narrow ones at r or 32, whichever is more): measuring aids. */
static int pf_mid_rows = -1; /* -1: DI_CUDA_MM_MID not read yet */
extern "C" void cuda_matmul_set_mid(int min_rows) { pf_mid_rows = min_rows; }

static bool pf_applies(int64_t m, int64_t nr, int groups) {
    if (!pf_min_rows) return false;
    if (m >= pf_min_rows) return true;
    if (pf_mid_rows < 0) {
        const char *v = getenv("DI_CUDA_MM_MID");
        pf_mid_rows = v && *v ? atoi(v) : 9;
        if (pf_mid_rows < 0) pf_mid_rows = 0;
    }
    if (pf_mid_rows <= 0 || m < pf_mid_rows) return false;
    return m >= 32 || ((nr + PF_O - 1) / PF_O) * groups >= cuda_sm_count() / 2;
}
static int pf_x16_on = 1; /* measuring and test aid: 0 leaves the bf16 form out (the fp32 form alone) */
extern "C" void cuda_matmul_set_x16(int on) { pf_x16_on = on; }

template <int FMT, bool X16>
static cudaError_t pf_launch(dim3 grid, int smem, const void *w, const uint8_t *s, int64_t K, const float *x,
                             int64_t ldx, int64_t m, int64_t nr, float *y, int64_t ldy, int out_bf16,
                             const uint16_t *x16, const int *xflag) {
    static int attr = 0;
    if (smem > 48 * 1024 && smem > attr) {
        cudaError_t e = cudaFuncSetAttribute(k_mm_pf<FMT, X16>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        attr = smem;
    }
    k_mm_pf<FMT, X16><<<grid, TC_KW * 32, (size_t)smem>>>(w, s, K, x, ldx, m, nr, y, ldy, out_bf16, x16, xflag);
    return cudaGetLastError();
}

template <bool X16>
static cudaError_t pf_launch_fmt(int fmt, dim3 grid, int smem, const void *w, const uint8_t *s, int64_t K,
                                 const float *x, int64_t ldx, int64_t m, int64_t nr, float *y, int64_t ldy,
                                 int out_bf16, const uint16_t *x16, const int *xflag) {
    return fmt == DI_WFMT_BF16
               ? pf_launch<DI_WFMT_BF16, X16>(grid, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, x16, xflag)
               : pf_launch<DI_WFMT_FP8, X16>(grid, smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, x16, xflag);
}

/* ---- x16: x's first bf16 term, once per product, for the bf16 form ----
 *
 * x16 [m, groups·K] = bf16_rn(x) (what split_x8 takes as the first term,
 * non-finite values included), and per block whether some x left a
 * residue (x - x16 nonzero, x finite: a second or third term); then one
 * block folds the blocks' answers into *xflag (plain stores: no zeroing
 * ahead). A residue the split would round to zero in bf16 still counts:
 * the fp32 form then runs, exact as ever. */
enum { XS_THREADS = 256, XS_BLOCKS = 1024 };

__global__ void __launch_bounds__(XS_THREADS) k_x_split16(const float *__restrict__ x, int64_t ldx, int64_t m,
                                                          int64_t cols, uint16_t *__restrict__ x16, int *blk) {
    const int64_t per = cols / 4, n = m * per; /* 4 values an item (cols % 32 == 0) */
    int any = 0;
    for (int64_t i = (int64_t)blockIdx.x * XS_THREADS + threadIdx.x; i < n; i += (int64_t)gridDim.x * XS_THREADS) {
        const int64_t r = i / per, c = (i - r * per) * 4;
        const float4 v = *(const float4 *)(x + r * ldx + c);
        const __nv_bfloat162 a = __floats2bfloat162_rn(v.x, v.y), b = __floats2bfloat162_rn(v.z, v.w);
        const float2 fa = __bfloat1622float2(a), fb = __bfloat1622float2(b);
        any |= (isfinite(v.x) && v.x != fa.x) | (isfinite(v.y) && v.y != fa.y) | (isfinite(v.z) && v.z != fb.x) |
               (isfinite(v.w) && v.w != fb.y);
        uint2 o;
        o.x = *reinterpret_cast<const uint32_t *>(&a);
        o.y = *reinterpret_cast<const uint32_t *>(&b);
        *(uint2 *)(x16 + r * cols + c) = o;
    }
    any = __syncthreads_or(any);
    if (threadIdx.x == 0) blk[blockIdx.x] = any;
}

__global__ void __launch_bounds__(XS_THREADS) k_x_split16_flag(const int *blk, int nb, int *xflag) {
    int any = 0;
    for (int i = threadIdx.x; i < nb; i += XS_THREADS) any |= blk[i];
    any = __syncthreads_or(any);
    if (threadIdx.x == 0) *xflag = any;
}

/* A block's shared memory: the warps' rings and the FP8 scales, and at
 * least the chains' sums that reuse them at the end ([8][128][32] f32,
 * more than the bf16 form's rings of FP8 weights) */
static int64_t pf_smem(int esz, bool x16, bool fp8, int64_t K) {
    const int64_t ring = (int64_t)TC_KW * PF_RD * pf_slot_bytes(esz, x16) + (fp8 ? 2 * (K / TC_CH) * 4 : 0);
    const int64_t red = (int64_t)TC_KW * PF_T * PF_NT * 4 * 32 * 4;
    return ring > red ? ring : red;
}

/* x16's bytes, then the blocks' answers and the flag */
static size_t x16_bytes(int64_t m, int64_t cols) { return ((size_t)(m * cols) * 2 + 15) / 16 * 16; }

extern "C" size_t cuda_op_matmul_scratch_bytes(int fmt, int64_t n_in, int64_t m, int groups, int64_t nr) {
    if (!pf_x16_on || groups <= 0 || n_in <= 0 || nr <= 0 || !pf_applies(m, nr, groups) || n_in % TC_CH ||
        (fmt != DI_WFMT_BF16 && fmt != DI_WFMT_FP8))
        return 0;
    return x16_bytes(m, (int64_t)groups * n_in) + (XS_BLOCKS + 1) * sizeof(int);
}

/* The prefill form where it applies (*done = 0 otherwise, nothing launched). */
static di_status matmul_pf(int fmt, const void *w, const uint8_t *s, int64_t K, const float *x, int64_t ldx,
                           int64_t m, int groups, int64_t nr, float *y, int64_t ldy, int out_bf16, void *scratch,
                           size_t scratch_bytes, int *done, di_err *err) {
    *done = 0;
    static int env_on = -1; /* DI_CUDA_MM_PF=0: k_mm_tc at every m (measuring aid for the model bench) */
    cuda_env_switch("DI_CUDA_MM_PF", &env_on);
    const int esz = fmt == DI_WFMT_BF16 ? 2 : 1;
    if (!env_on || !pf_applies(m, nr, groups) || (fmt != DI_WFMT_BF16 && fmt != DI_WFMT_FP8) || K % TC_CH ||
        K > (1 << 20) || ldx % 4 || ((uintptr_t)x & 15) || ((uintptr_t)w % (8 * esz)) || groups > 65535)
        return DI_OK;
    if (fmt == DI_WFMT_FP8 && groups > 1 && nr % 32) return DI_OK;
    const int64_t smem = pf_smem(esz, false, fmt == DI_WFMT_FP8, K);
    const int64_t gx = (nr + PF_O - 1) / PF_O, gy = (m + PF_R - 1) / PF_R;
    if (smem > 220 * 1024 || gx > 0x7fffffff || gy > 65535) return DI_OK;
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)groups);
    /* the bf16 form beside it where the scratch holds x16 */
    const int64_t cols = (int64_t)groups * K;
    const size_t need = cuda_op_matmul_scratch_bytes(fmt, K, m, groups, nr);
    const bool x16 = scratch && need && scratch_bytes >= need;
    uint16_t *xs = x16 ? (uint16_t *)scratch : NULL;
    int *blk = x16 ? (int *)((uint8_t *)scratch + x16_bytes(m, cols)) : NULL, *flag = x16 ? blk + XS_BLOCKS : NULL;
    cudaError_t e = cudaSuccess;
    if (x16) {
        k_x_split16<<<XS_BLOCKS, XS_THREADS>>>(x, ldx, m, cols, xs, blk);
        k_x_split16_flag<<<1, XS_THREADS>>>(blk, XS_BLOCKS, flag);
        e = cudaGetLastError();
        const int64_t smem16 = pf_smem(esz, true, fmt == DI_WFMT_FP8, K);
        if (e == cudaSuccess)
            e = pf_launch_fmt<true>(fmt, grid, (int)smem16, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, xs, flag);
    }
    if (e == cudaSuccess)
        e = pf_launch_fmt<false>(fmt, grid, (int)smem, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, NULL, flag);
    *done = 1;
    return cuda_check(e, err, "matmul (prefill form)");
}

static di_status matmul_tc(int fmt, const void *w, const uint8_t *s, int64_t K, const float *x,
                           int64_t ldx, int64_t m, int groups, int64_t nr, float *y, int64_t ldy,
                           int out_bf16, void *scratch, size_t scratch_bytes, di_err *err) {
    /* n8 tiles of x rows per block: one block row covers all of m up to 64 */
    int nt = m <= 8 ? 1 : m <= 16 ? 2 : m <= 32 ? 4 : 8;
    /* 32 outputs per block (two tiles a warp: x split once for both) when
     * that still gives every SM a block, else 16 (the router's 384 outputs:
     * 24 blocks, not 12). The tiles share nothing but x, so the bits do not
     * depend on T. The grouped wo_a (8 × 1024 outputs) takes 2 since b1 run
     * 4: at 1 its 512 blocks were 1.3 waves of 3 per SM, issue-bound on the
     * split and the FP8 decode (58 µs for 33.5 MB). */
    int T = (nr + 31) / 32 * groups >= cuda_sm_count() ? 2 : 1;
    if (tc_forced_tiles == 1 || tc_forced_tiles == 2) T = tc_forced_tiles;
    int64_t gx = (nr + 16 * T - 1) / (16 * T), gy = (m + 8 * nt - 1) / (8 * nt);
    if (gx > 0x7fffffff || gy > 65535 || groups > 65535)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "matmul: %lld x %lld outputs in %d groups exceed one launch",
                          (long long)m, (long long)nr, groups);
    int done = 0;
    di_status st = matmul_dec(fmt, w, s, K, x, ldx, m, groups, nr, y, ldy, out_bf16, &done, err);
    if (st || done) return st;
    st = matmul_pf(fmt, w, s, K, x, ldx, m, groups, nr, y, ldy, out_bf16, scratch, scratch_bytes, &done, err);
    if (st || done) return st;
    int align = fmt == DI_WFMT_BF16 ? 16 : 8;
    int vec = K % 8 == 0 && ldx % 4 == 0 && ((uintptr_t)x & 15) == 0 && ((uintptr_t)w % align) == 0;
    dim3 grid((unsigned)gx, (unsigned)gy, (unsigned)groups);
    switch (fmt) {
    case DI_WFMT_BF16: launch_tc_fmt<DI_WFMT_BF16>(nt, T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    case DI_WFMT_FP8: launch_tc_fmt<DI_WFMT_FP8>(nt, T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    default: launch_tc_fmt<DI_WFMT_FP4>(nt, T, grid, w, s, K, x, ldx, m, nr, y, ldy, out_bf16, vec); break;
    }
    return cuda_check_launch(err, "matmul");
}

extern "C" di_status cuda_op_matmul_plain_s(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                                            int64_t n_in, const float *x, int64_t ldx, int64_t m,
                                            int groups, int64_t nr, float *y, int64_t ldy, int out_bf16,
                                            void *scratch, size_t scratch_bytes, di_err *err) {
    (void)n_out;
    if (m * nr <= 0 || groups <= 0) return DI_OK;
    if (fmt != DI_WFMT_F32)
        return matmul_tc(fmt, w, s, n_in, x, ldx, m, groups, nr, y, ldy, out_bf16, scratch, scratch_bytes, err);
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

extern "C" di_status cuda_op_matmul_plain_pair(int fmt, const void *w, const uint8_t *s, const void *w2,
                                               const uint8_t *s2, int64_t n_in, const float *x, int64_t m,
                                               int64_t nr, float *y, float *y2, int out_bf16, int *done,
                                               di_err *err) {
    *done = 0;
    if (m * nr <= 0 || fmt == DI_WFMT_F32) return DI_OK;
    return matmul_dec(fmt, w, s, n_in, x, n_in, m, 1, nr, y, nr, out_bf16, done, err, w2, s2, y2);
}

extern "C" di_status cuda_op_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                                          int64_t n_in, const float *x, int64_t ldx, int64_t m,
                                          int groups, int64_t nr, float *y, int64_t ldy,
                                          int out_bf16, di_err *err) {
    return cuda_op_matmul_plain_s(fmt, w, s, n_out, n_in, x, ldx, m, groups, nr, y, ldy, out_bf16, NULL, 0, err);
}

/* ---- many rows of a BF16 product on bf16 inputs: cuBLAS ----------------
 *
 * The head at a large decode batch (129,280 x 5,120 BF16 weights, x the
 * final norm's bf16 rows) ran the prefill form above at ~165 TFLOP/s
 * (its fixed-order mma.sync tiles, 8.3 ms a step at 1,024 rows: 12 % of
 * it). Its inputs are bf16 already, so a bf16 copy of x loses nothing and a
 * library GEMM on the tensor cores does the same products; only the order
 * of the fp32 sums changes (and with it the last bits, which is why
 * batch-invariant mode keeps the prefill form). */

__global__ void k_f32_to_bf16(const float *__restrict__ x, int64_t n, uint16_t *__restrict__ y) {
    GRID_STRIDE(i, n) y[i] = __bfloat16_as_ushort(__float2bfloat16_rn(x[i]));
}

static long blas_calls = 0;
extern "C" long cuda_blas_calls(void) { return __atomic_load_n(&blas_calls, __ATOMIC_RELAXED); }

extern "C" void cuda_blas_free(void *blas) {
    if (blas) cublasDestroy((cublasHandle_t)blas);
}

extern "C" di_status cuda_op_matmul_bf16_blas(void **blas, const void *w, int64_t n, int64_t k, const float *x,
                                              int64_t m, float *y, int out_bf16, uint16_t *x16, di_err *err) {
    if (m <= 0 || n <= 0) return DI_OK;
    if (n > 0x7fffffff || m > 0x7fffffff || k > 0x7fffffff || k <= 0)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "matmul (cuBLAS): %lld x %lld x %lld", (long long)m,
                          (long long)n, (long long)k);
    if (!*blas) {
        cublasHandle_t h = NULL;
        const cublasStatus_t cs = cublasCreate(&h);
        if (cs != CUBLAS_STATUS_SUCCESS)
            return di_err_set(err, DI_ERR_BACKEND, "cuBLAS: cublasCreate failed (status %d)", (int)cs);
        *blas = h;
    }
    k_f32_to_bf16<<<grid_for(m * k), 256>>>(x, m * k, x16);
    di_status st = cuda_check_launch(err, "matmul (cuBLAS): x to bf16");
    if (st) return st;
    const float one = 1.0f, zero = 0.0f;
    /* column-major: y^T [n, m] = W [k, n]^T x16^T [k, m] */
    const cublasStatus_t cs =
        cublasGemmEx((cublasHandle_t)*blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, (int)m, (int)k, &one, w, CUDA_R_16BF,
                     (int)k, x16, CUDA_R_16BF, (int)k, &zero, y, CUDA_R_32F, (int)n, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
    if (cs != CUBLAS_STATUS_SUCCESS)
        return di_err_set(err, DI_ERR_BACKEND, "cuBLAS: GEMM of %lld x %lld x %lld failed (status %d)", (long long)m,
                          (long long)n, (long long)k, (int)cs);
    __atomic_fetch_add(&blas_calls, 1, __ATOMIC_RELAXED);
    return out_bf16 ? cuda_op_scale_bf16(y, m * n, 1.0f, err) : DI_OK;
}
