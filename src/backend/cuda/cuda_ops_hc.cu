/* CUDA kernels of the mHC ops (architecture.md §4: mixing weights with
 * Sinkhorn normalisation, collapse, expand, mean) and the Engram gate
 * (§6.3). Collapse, expand and mean follow the CPU's sums term by term and
 * give its bits; the mix and the gate reduce over the row in a different
 * order and go through expf / the sigmoid, so they agree to a few fp32 ulps. */
#include <cooperative_groups.h>

#include "backend/cuda/cuda_ops_common.cuh"

namespace cg = cooperative_groups;

enum { HC_MAX = 16 };

/* One block per row: the RMS and the (2 + hc)·hc projections as block
 * reductions, then thread 0 runs the small softmax + Sinkhorn in the CPU's
 * order. */
/* The mixing coefficients from the projections mix [(2 + hc) * hc] (§4):
 * pre, post and the Sinkhorn-normalised comb of row i (one thread). */
__device__ void hc_mix_finish(const float *mix, int hc, const float *base, const float *scale,
                              float eps, int iters, float *pr, float *po, float *c) {
    for (int k = 0; k < hc; k++) {
        pr[k] = ADD(sigmoid_f(ADD(MUL(mix[k], scale[0]), base[k])), eps);
        po[k] = MUL(2.0f, sigmoid_f(ADD(MUL(mix[hc + k], scale[1]), base[hc + k])));
    }
    for (int k = 0; k < hc * hc; k++) c[k] = ADD(MUL(mix[2 * hc + k], scale[2]), base[2 * hc + k]);
    for (int a = 0; a < hc; a++) {
        float mx = c[a * hc];
        for (int b = 1; b < hc; b++) mx = fmaxf(mx, c[a * hc + b]);
        float sum = 0.f;
        for (int b = 0; b < hc; b++) {
            c[a * hc + b] = expf(SUB(c[a * hc + b], mx));
            sum = ADD(sum, c[a * hc + b]);
        }
        for (int b = 0; b < hc; b++) c[a * hc + b] = ADD(c[a * hc + b] / sum, eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int a = 0; a < hc; a++) {
                float sum = 0.f;
                for (int b = 0; b < hc; b++) sum = ADD(sum, c[a * hc + b]);
                for (int b = 0; b < hc; b++) c[a * hc + b] /= ADD(sum, eps);
            }
        for (int b = 0; b < hc; b++) {
            float sum = 0.f;
            for (int a = 0; a < hc; a++) sum = ADD(sum, c[a * hc + b]);
            for (int a = 0; a < hc; a++) c[a * hc + b] /= ADD(sum, eps);
        }
    }
}

/* Any hc: one block per row, one block-wide reduction per projection. */
__global__ void k_hc_mix(const float *s, int hc, int64_t d, const float *fn, const float *base,
                         const float *scale, float norm_eps, float eps, int iters, float *pre,
                         float *post, float *comb) {
    __shared__ float red[32];
    __shared__ float mix[(2 + HC_MAX) * HC_MAX];
    int64_t i = blockIdx.x, n = (int64_t)hc * d;
    int nmix = (2 + hc) * hc;
    const float *u = s + i * n;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) ss = ADD(ss, MUL(u[k], u[k]));
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ADD(ss / (float)n, norm_eps));
    for (int o = 0; o < nmix; o++) {
        const float *f = fn + (int64_t)o * n;
        float acc = 0.f;
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) acc = ADD(acc, MUL(u[k], f[k]));
        acc = block_sum(acc, red);
        if (threadIdx.x == 0) mix[o] = MUL(acc, r);
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    hc_mix_finish(mix, hc, base, scale, eps, iters, pre + i * hc, post + i * hc, comb + i * hc * hc);
}

/* The gates and the row softmax that starts the Sinkhorn (lanes < hc, one
 * row each), into pr, po and c [hc, hc]. */
__device__ __forceinline__ void hc_mix_start_lanes(const float *mix, int hc, const float *base, const float *scale,
                                                   float eps, float *pr, float *po, float *c) {
    int a = threadIdx.x & 31;
    if (a < hc) {
        pr[a] = ADD(sigmoid_f(ADD(MUL(mix[a], scale[0]), base[a])), eps);
        po[a] = MUL(2.0f, sigmoid_f(ADD(MUL(mix[hc + a], scale[1]), base[hc + a])));
        float *r = c + a * hc;
        for (int b = 0; b < hc; b++) r[b] = ADD(MUL(mix[2 * hc + a * hc + b], scale[2]), base[2 * hc + a * hc + b]);
        float mx = r[0];
        for (int b = 1; b < hc; b++) mx = fmaxf(mx, r[b]);
        float sum = 0.f;
        for (int b = 0; b < hc; b++) {
            r[b] = expf(SUB(r[b], mx));
            sum = ADD(sum, r[b]);
        }
        for (int b = 0; b < hc; b++) r[b] = ADD(r[b] / sum, eps);
    }
    __syncwarp();
}

/* The same coefficients computed by lanes 0 .. hc-1 of one warp, c in
 * shared memory: lane a owns row a for pre / post, the softmax and the row
 * sums, lane b column b for the column sums. Every element sees the serial
 * version's operations in its order, so the bits are hc_mix_finish's; the
 * serial one spent ~hc times as long in dependent divisions. */
__device__ void hc_mix_finish_lanes(const float *mix, int hc, const float *base, const float *scale,
                                    float eps, int iters, float *pr, float *po, float *c, float *comb) {
    int a = threadIdx.x & 31;
    hc_mix_start_lanes(mix, hc, base, scale, eps, pr, po, c);
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            if (a < hc) {
                float sum = 0.f;
                for (int b = 0; b < hc; b++) sum = ADD(sum, c[a * hc + b]);
                for (int b = 0; b < hc; b++) c[a * hc + b] /= ADD(sum, eps);
            }
            __syncwarp();
        }
        if (a < hc) {
            float sum = 0.f;
            for (int r = 0; r < hc; r++) sum = ADD(sum, c[r * hc + a]);
            for (int r = 0; r < hc; r++) c[r * hc + a] /= ADD(sum, eps);
        }
        __syncwarp();
    }
    for (int e = a; e < hc * hc; e += 32) comb[e] = c[e];
}

/* hc_mix_finish_lanes for hc·hc <= 32 with the Sinkhorn iterations in
 * registers: lane l holds c[l / hc][l % hc] and reads its row's or
 * column's hc values by shuffles, adding them in the same order from the
 * same +0 and dividing as the shared-memory form does, so the bits are
 * that form's. There each iteration was two rounds of shared loads and
 * four serial divisions on hc lanes behind warp barriers (~12 µs a call
 * with the reduce, b1 runs 1–2 in docs/gpu-notes.md). */
template <int HC>
__device__ void hc_mix_finish_reg(const float *mix, const float *base, const float *scale, float eps,
                                  int iters, float *pr, float *po, float *c, float *comb) {
    static_assert(HC * HC <= 32, "one lane per mixing entry");
    const int a = threadIdx.x & 31;
    hc_mix_start_lanes(mix, HC, base, scale, eps, pr, po, c);
    const int ra = a / HC, cb = a % HC; /* lanes past hc·hc shadow real ones */
    float v = c[a < HC * HC ? a : 0];
    for (int it = 0; it < iters; it++) {
        if (it > 0) {
            float sum = 0.f;
#pragma unroll
            for (int b = 0; b < HC; b++) sum = ADD(sum, __shfl_sync(0xffffffffu, v, (ra * HC + b) & 31));
            v /= ADD(sum, eps);
        }
        float sum = 0.f;
#pragma unroll
        for (int r = 0; r < HC; r++) sum = ADD(sum, __shfl_sync(0xffffffffu, v, r * HC + cb));
        v /= ADD(sum, eps);
    }
    if (a < HC * HC) comb[a] = v;
}

/* One warp: the row's sums tot[0 .. NM] (tot[NM] the sum of squares over
 * the row's n values) times the RMS factor, then the coefficients by
 * hc_mix_finish_reg. What the split's reduce and the rows form's finish
 * both end with. */
template <int HC>
__device__ __forceinline__ void hc_mix_norm_finish(float *tot, int64_t n, float norm_eps, const float *base,
                                                   const float *scale, float eps, int iters, float *pre,
                                                   float *post, float *cm, float *comb) {
    constexpr int NM = (2 + HC) * HC;
    const int lane = threadIdx.x & 31;
    __syncwarp();
    const float r = 1.0f / sqrtf(ADD(tot[NM] / (float)n, norm_eps));
    __syncwarp();
    if (lane < NM) tot[lane] = MUL(tot[lane], r);
    __syncwarp();
    hc_mix_finish_reg<HC>(tot, base, scale, eps, iters, pre, post, cm, comb);
}

/* The (2 + HC)·HC projections u·fn_o and the sum of squares u·u over
 * columns k0 .. k1 - 1 by one block of NT threads: each thread all of them
 * for its columns (its loads in flight together), a warp by a fixed xor
 * tree, the block's warps in order. Thread o <= NM returns sum o. */
template <int HC, int NT>
__device__ __forceinline__ float hc_range_sums(const float *u, const float *fn, int64_t n, int64_t k0, int64_t k1,
                                               float (*part)[NT / 32]) {
    constexpr int NM = (2 + HC) * HC;
    float acc[NM + 1];
#pragma unroll
    for (int o = 0; o <= NM; o++) acc[o] = 0.f;
    /* two columns at a time, all their loads issued before the sums: with
     * the loads inside the sums the compiler kept only the first column's
     * in flight and waited one round trip per product after it (14 µs a
     * call at d 5120, b1 run 3). The sums run in the same order. */
    int64_t k = k0 + threadIdx.x;
    for (; k + NT < k1; k += 2 * NT) {
        float ua = u[k], ub = u[k + NT], fa[NM], fb[NM];
#pragma unroll
        for (int o = 0; o < NM; o++) {
            fa[o] = __ldg(fn + (int64_t)o * n + k);
            fb[o] = __ldg(fn + (int64_t)o * n + k + NT);
        }
        acc[NM] = ADD(acc[NM], MUL(ua, ua));
#pragma unroll
        for (int o = 0; o < NM; o++) acc[o] = ADD(acc[o], MUL(ua, fa[o]));
        acc[NM] = ADD(acc[NM], MUL(ub, ub));
#pragma unroll
        for (int o = 0; o < NM; o++) acc[o] = ADD(acc[o], MUL(ub, fb[o]));
    }
    for (; k < k1; k += NT) {
        float uk = u[k], f[NM];
#pragma unroll
        for (int o = 0; o < NM; o++) f[o] = __ldg(fn + (int64_t)o * n + k);
        acc[NM] = ADD(acc[NM], MUL(uk, uk));
#pragma unroll
        for (int o = 0; o < NM; o++) acc[o] = ADD(acc[o], MUL(uk, f[o]));
    }
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 0; o <= NM; o++) {
        float v = acc[o];
        for (int off = 16; off > 0; off >>= 1) v = ADD(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) part[o][warp] = v;
    }
    __syncthreads();
    float t = 0.f;
    if (threadIdx.x <= NM)
        for (int w = 0; w < NT / 32; w++) t = ADD(t, part[threadIdx.x][w]);
    return t;
}

/* hc = 4 (V4.1): a cluster of HC_CL blocks per row. Each block sums the
 * (2 + HC)·HC projections and the sum of squares over its 1/HC_CL of the
 * row (every thread all of them, so its loads are in flight together), a
 * warp by a fixed xor tree, the block's warps in order; block 0 then adds
 * the blocks' sums in rank order through distributed shared memory and
 * one warp finishes. One block per row (the version before) read the 2 MB
 * of fn through one SM per row: ~13 µs of L2 traffic at one SM's rate
 * before the serial Sinkhorn. */
enum { HC_CL = 8, HC_CL_THREADS = 256 };

template <int HC>
__global__ void __cluster_dims__(HC_CL, 1, 1) __launch_bounds__(HC_CL_THREADS)
    k_hc_mix_cluster(const float *s, int64_t d, const float *fn, const float *base, const float *scale,
                     float norm_eps, float eps, int iters, float *pre, float *post, float *comb) {
    constexpr int NM = (2 + HC) * HC, NW = HC_CL_THREADS / 32;
    __shared__ float part[NM + 1][NW];
    __shared__ float blk[NM + 1];
    __shared__ float tot[NM + 1];
    __shared__ float cm[HC * HC];
    cg::cluster_group cl = cg::this_cluster();
    const int rank = (int)cl.block_rank();
    const int64_t i = blockIdx.y, n = (int64_t)HC * d;
    const int64_t per = (n + HC_CL - 1) / HC_CL, k0 = rank * per, k1 = k0 + per < n ? k0 + per : n;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    float t = hc_range_sums<HC, HC_CL_THREADS>(s + i * n, fn, n, k0, k1, part);
    if (threadIdx.x <= NM) blk[threadIdx.x] = t;
    cl.sync();
    if (rank == 0 && threadIdx.x <= NM) {
        float t = 0.f;
        for (int r = 0; r < HC_CL; r++) t = ADD(t, *cl.map_shared_rank(&blk[threadIdx.x], r));
        tot[threadIdx.x] = t;
    }
    cl.sync(); /* the other blocks' shared memory stays until block 0 has read it */
    if (rank != 0 || warp != 0) return;
    float r = 1.0f / sqrtf(ADD(tot[NM] / (float)n, norm_eps));
    if (lane < NM) tot[lane] = MUL(tot[lane], r);
    __syncwarp();
    hc_mix_finish_lanes(tot, HC, base, scale, eps, iters, pre + i * HC, post + i * HC, cm, comb + i * HC * HC);
}

/* hc = 4 at few rows: the product split over many more blocks. A cluster
 * of 8 per row left the 2 MB of fn to 8 SMs at one row (~31 µs, the loads
 * of 24 partial sums per thread not all in flight). Here block b of row i
 * takes the K range b·chunk .. +chunk (chunk = HC_SP_THREADS·(a few), so
 * every thread has at most a few elements and all their 24 fn loads in
 * flight), sums it as the cluster kernel sums a block (a warp by a fixed
 * xor tree, the warps in order) into part [i, b, NM + 1]; a second kernel
 * then adds the blocks' sums in block order and one warp finishes, as the
 * cluster kernel's block 0 does. The blocks and their order follow from n
 * alone, so the bits repeat and do not depend on m or on timing. The
 * partial sums live in a static device buffer: kernels of one device run in
 * stream order, and the backend issues its ops on one stream. */
enum { HC_SP_THREADS = 128, HC_SP_MAX_BLOCKS = 128, HC_SP_MAX_ROWS = 64 };
__device__ float hc_sp_part[HC_SP_MAX_ROWS * HC_SP_MAX_BLOCKS * ((2 + 4) * 4 + 1)];

/* the K range of one block: a multiple of the block's threads, at most
 * HC_SP_MAX_BLOCKS blocks for the row */
static int64_t hc_sp_chunk(int64_t n) {
    int64_t per = (n + HC_SP_MAX_BLOCKS - 1) / HC_SP_MAX_BLOCKS;
    int64_t c = (per + 2 * HC_SP_THREADS - 1) / (2 * HC_SP_THREADS) * (2 * HC_SP_THREADS);
    return c > 0 ? c : 2 * HC_SP_THREADS;
}

template <int HC>
__global__ void __launch_bounds__(HC_SP_THREADS)
    k_hc_mix_part(const float *s, int64_t d, const float *fn, int64_t chunk) {
    pdl_enter();
    constexpr int NM = (2 + HC) * HC, NW = HC_SP_THREADS / 32;
    __shared__ float wp[NM + 1][NW];
    const int64_t i = blockIdx.y, n = (int64_t)HC * d;
    const int b = blockIdx.x, nb = gridDim.x;
    const int64_t k0 = b * chunk, k1 = k0 + chunk < n ? k0 + chunk : n;
    float t = hc_range_sums<HC, HC_SP_THREADS>(s + i * n, fn, n, k0, k1, wp);
    if (threadIdx.x <= NM) hc_sp_part[(i * nb + b) * (NM + 1) + threadIdx.x] = t;
}

/* rmsnorm(hc_collapse(s, w)) of one row (s [HC, d], w [HC] the row's
 * collapse weights) by a block of NT threads, with the bits of k_hc_collapse
 * followed by k_rmsnorm_reg (HCN_VT = 256 threads; its loop form past 24
 * values a thread sums in the same order). The collapsed values go to
 * shared memory, formed as k_hc_collapse forms them (from +0, copies in
 * order, rounded to bf16), B values a thread with all their loads issued
 * together; then the norm's threads t < 256 each add their squares in that
 * kernel's order (k = t, t + 256, ...), the sums reduced by block_sum's
 * xor tree and warp order. The norm's weights are loaded with the values.
 * d <= HCN_R·256.
 * One block reads the row's HC·d values through one SM: as one more block
 * of hc_mix's split product (128 threads) that took ~20 µs at d 5120
 * (27 µs with a load loop; b1 runs 10–11 in docs/gpu-notes.md), longer
 * than the product, so the collapse runs after the mix, 1024 threads. */
enum { HCN_VT = 256, HCN_R = 24 };

template <int HC, int NT>
__device__ __forceinline__ void hc_collapse_norm_row(const float *s, const float *w, int64_t d, const void *nw,
                                                     int nw_bf16, float eps, float *y) {
    constexpr int E = HCN_R * HCN_VT / NT, B = E < 8 ? E : 8;
    static_assert(NT % 32 == 0 && E * NT == HCN_R * HCN_VT && E % B == 0, "NT divides 6144");
    __shared__ float yv[HCN_R * HCN_VT];
    __shared__ float red[HCN_VT / 32];
    float wr[HC], wv[E];
#pragma unroll
    for (int c = 0; c < HC; c++) wr[c] = w[c];
#pragma unroll
    for (int e0 = 0; e0 < E; e0 += B) {
        float sv[B][HC];
#pragma unroll
        for (int b = 0; b < B; b++) { /* past d: column d - 1 again, unused (no predicated loads) */
            int64_t k = threadIdx.x + (int64_t)(e0 + b) * NT;
            k = k < d ? k : d - 1;
#pragma unroll
            for (int c = 0; c < HC; c++) sv[b][c] = s[c * d + k];
            wv[e0 + b] = vec_at(nw, nw_bf16, k);
        }
#pragma unroll
        for (int b = 0; b < B; b++) {
            const int64_t k = threadIdx.x + (int64_t)(e0 + b) * NT;
            float acc = 0.f;
#pragma unroll
            for (int c = 0; c < HC; c++) acc = ADD(acc, MUL(wr[c], sv[b][c]));
            if (k < d) yv[k] = round_bf16(acc);
        }
    }
    __syncthreads();
    for (int vt = threadIdx.x; vt < HCN_VT; vt += NT) { /* whole warps */
        float ss = 0.f;
        for (int64_t k = vt; k < d; k += HCN_VT) ss = ADD(ss, MUL(yv[k], yv[k]));
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if ((vt & 31) == 0) red[vt >> 5] = ss;
    }
    __syncthreads();
    float tot = 0.f;
    for (int i = 0; i < HCN_VT / 32; i++) tot += red[i];
    const float r = 1.0f / sqrtf(ADD(tot / (float)d, eps));
#pragma unroll
    for (int e = 0; e < E; e++) {
        const int64_t k = threadIdx.x + (int64_t)e * NT;
        if (k < d) y[k] = round_bf16(MUL(wv[e], MUL(yv[k], r)));
    }
}

/* hc_collapse then rmsnorm, a block of HCN_THREADS threads per row. */
enum { HCN_THREADS = 1024 };

template <int HC>
__global__ void __launch_bounds__(HCN_THREADS)
    k_hc_collapse_norm(const float *s, const float *w, int64_t d, const void *nw, int nw_bf16, float eps, float *y) {
    pdl_enter();
    const int64_t i = blockIdx.x;
    hc_collapse_norm_row<HC, HCN_THREADS>(s + i * HC * d, w + i * HC, d, nw, nw_bf16, eps, y + i * d);
}

/* hc_collapse then rmsnorm at few rows: a cluster of HCC_CL blocks a row,
 * with the one-block kernel's bits. The norm's sum of squares is 256
 * chains (chain t: k = t, t + 256, ... in that order, as k_rmsnorm_reg's
 * threads add them), a warp's 32 chains by block_sum's xor tree, then the
 * 8 warps' sums from +0 in warp order. Block b of the cluster takes warp
 * b's chains whole: it collapses its values k = 32b + l + 256u (l < 32) as
 * k_hc_collapse forms them, lane l of its first warp adds chain 32b + l,
 * and the blocks read the 8 warp sums in rank order through distributed
 * shared memory; so every chain, the tree and the order are the one-block
 * kernel's. Each SM then reads 1/8 of the row (10 KB at d 5120) instead
 * of all of it (one block: ~5 µs a call at b1, docs/gpu-notes.md run 93). */
enum { HCC_CL = 8, HCC_THREADS = 256, HCC_MAX_ROWS = 16 };

template <int HC>
__global__ void __cluster_dims__(HCC_CL, 1, 1) __launch_bounds__(HCC_THREADS)
    k_hc_collapse_norm_cl(const float *s, const float *w, int64_t d, const void *nw, int nw_bf16, float eps,
                          float *y) {
    pdl_enter();
    constexpr int Q = HCN_R * 32 / HCC_THREADS; /* values a thread */
    static_assert(Q * HCC_THREADS == HCN_R * 32, "whole chains");
    __shared__ float yv[HCN_R][32]; /* [u][l]: value k = 32b + l + 256u */
    __shared__ float wsum;
    cg::cluster_group cl = cg::this_cluster();
    const int b = (int)cl.block_rank(), tid = threadIdx.x;
    const int64_t i = blockIdx.x / HCC_CL;
    const float *si = s + i * HC * d;
    float wr[HC], sv[Q][HC], nv[Q];
#pragma unroll
    for (int c = 0; c < HC; c++) wr[c] = w[i * HC + c];
#pragma unroll
    for (int q = 0; q < Q; q++) { /* every load issued before the sums */
        const int e = tid + HCC_THREADS * q;
        int64_t k = 32 * b + (e & 31) + (int64_t)HCN_VT * (e >> 5);
        k = k < d ? k : d - 1; /* past d: column d - 1 again, unused */
#pragma unroll
        for (int c = 0; c < HC; c++) sv[q][c] = si[c * d + k];
        nv[q] = vec_at(nw, nw_bf16, k);
    }
#pragma unroll
    for (int q = 0; q < Q; q++) {
        const int e = tid + HCC_THREADS * q;
        float acc = 0.f;
#pragma unroll
        for (int c = 0; c < HC; c++) acc = ADD(acc, MUL(wr[c], sv[q][c]));
        yv[e >> 5][e & 31] = round_bf16(acc);
    }
    __syncthreads();
    if (tid < 32) {
        float ss = 0.f;
        for (int u = 0; u < HCN_R; u++) {
            const int64_t k = 32 * b + tid + (int64_t)HCN_VT * u;
            if (k < d) ss = ADD(ss, MUL(yv[u][tid], yv[u][tid]));
        }
        for (int o = 16; o > 0; o >>= 1) ss += __shfl_xor_sync(0xffffffffu, ss, o);
        if (tid == 0) wsum = ss;
    }
    cl.sync();
    float tot = 0.f;
    for (int r = 0; r < HCC_CL; r++) tot += *cl.map_shared_rank(&wsum, r);
    const float rr = 1.0f / sqrtf(ADD(tot / (float)d, eps));
#pragma unroll
    for (int q = 0; q < Q; q++) {
        const int e = tid + HCC_THREADS * q;
        const int64_t k = 32 * b + (e & 31) + (int64_t)HCN_VT * (e >> 5);
        if (k < d) y[i * d + k] = round_bf16(MUL(nv[q], MUL(yv[e >> 5][e & 31], rr)));
    }
    cl.sync(); /* every block's wsum stays until the others have read it */
}

/* The row's nb·(NM + 1) partial sums are staged into shared memory by
 * the whole block at once (one warp reading them 8 at a time waited ~10
 * round trips, most of the kernel's 12 µs; b1 run 1), then one warp adds
 * them in block order and finishes. */
enum { HC_RD_THREADS = 256 };

template <int HC>
__global__ void __launch_bounds__(HC_RD_THREADS)
    k_hc_mix_reduce(int nb, int64_t d, const float *base, const float *scale, float norm_eps, float eps,
                    int iters, float *pre, float *post, float *comb) {
    pdl_enter();
    constexpr int NM = (2 + HC) * HC;
    __shared__ float stage[HC_SP_MAX_BLOCKS * (NM + 1)];
    __shared__ float tot[NM + 1];
    __shared__ float cm[HC * HC];
    const int64_t i = blockIdx.x, n = (int64_t)HC * d;
    const float *src = hc_sp_part + i * nb * (NM + 1);
    for (int e = threadIdx.x; e < nb * (NM + 1); e += HC_RD_THREADS) stage[e] = src[e];
    __syncthreads();
    if (threadIdx.x >= 32) return;
    const int lane = threadIdx.x;
    for (int o = lane; o <= NM; o += 32) {
        const float *p = stage + o;
        float t = 0.f;
        for (int b = 0; b < nb; b++) t = ADD(t, p[b * (NM + 1)]);
        tot[o] = t;
    }
    hc_mix_norm_finish<HC>(tot, n, norm_eps, base, scale, eps, iters, pre + i * HC, post + i * HC, cm,
                           comb + i * HC * HC);
}

/* hc = 4 at many rows (prefill): the rows form. The cluster kernel above
 * reads all of fn (2 MB at d 5120) through the SMs once per row, 16 GB at
 * 8,192 rows (1.9 ms a call, ~5 % of a prefill; docs/gpu-notes.md). Here
 * block (b, g) takes the HCR_COLS columns b·HCR_COLS .. of rows 16g .. 16g
 * + 15: each thread loads fn at its HCR_J columns into registers once and
 * streams the rows through them (the next row's values loaded while this
 * one is summed). A row's 25 sums over the block's columns: per thread its
 * HCR_J columns in order (fmaf from +0), per warp a fixed halving tree
 * (warp_sum32), the warps in order; each block writes them to part [m,
 * blocks, 25], and k_hc_mix_finish_rows adds the blocks in order, one warp
 * a row, and finishes as k_hc_mix_reduce does. The order depends on n
 * alone (never on m or on the row's place): not the split's or the
 * cluster's order, within the same tolerance of the CPU's sequential sums
 * (test_hc_split). */
enum { HCR_THREADS = 128, HCR_J = 4, HCR_COLS = HCR_THREADS * HCR_J, HCR_RB = 16, HCR_MIN_ROWS = 256 };

/* v[0..31] of each lane summed over the warp by recursive halving: at
 * offset h a lane with bit h set keeps its upper h values and sends the
 * lower, the others the reverse; after five steps lane l holds value l's
 * sum over the 32 lanes (31 shuffles for 32 sums instead of 160). */
template <int H> __device__ __forceinline__ void warp_halve(float (&v)[32], int lane) {
    const bool up = (lane & H) != 0;
#pragma unroll
    for (int i = 0; i < H; i++) {
        const float keep = up ? v[i + H] : v[i], send = up ? v[i] : v[i + H];
        v[i] = ADD(keep, __shfl_xor_sync(0xffffffffu, send, H));
    }
}
__device__ __forceinline__ float warp_sum32(float (&v)[32]) {
    const int lane = threadIdx.x & 31;
    warp_halve<16>(v, lane);
    warp_halve<8>(v, lane);
    warp_halve<4>(v, lane);
    warp_halve<2>(v, lane);
    warp_halve<1>(v, lane);
    return v[0];
}

template <int HC>
__global__ void __launch_bounds__(HCR_THREADS)
    k_hc_mix_rows(const float *__restrict__ s, int64_t m, int64_t d, const float *__restrict__ fn,
                  float *__restrict__ part) {
    constexpr int NM = (2 + HC) * HC, NV = NM + 1, NW = HCR_THREADS / 32;
    static_assert(NV <= 32, "one lane per sum");
    __shared__ float ws[2][NW][32]; /* two rows' warp sums: one barrier a row */
    const int64_t n = (int64_t)HC * d;
    const int rank = blockIdx.x, ranks = gridDim.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t kc[HCR_J];
    float f[HCR_J][NM];
#pragma unroll
    for (int j = 0; j < HCR_J; j++) {
        kc[j] = (int64_t)rank * HCR_COLS + tid + j * HCR_THREADS;
#pragma unroll
        for (int o = 0; o < NM; o++) f[j][o] = kc[j] < n ? __ldg(fn + (int64_t)o * n + kc[j]) : 0.f;
    }
    const int64_t r0 = (int64_t)blockIdx.y * HCR_RB, r1 = r0 + HCR_RB < m ? r0 + HCR_RB : m;
    float un[HCR_J];
    auto load = [&](int64_t i) {
#pragma unroll
        for (int j = 0; j < HCR_J; j++) un[j] = kc[j] < n ? __ldg(s + i * n + kc[j]) : 0.f;
    };
    if (r0 < r1) load(r0);
    for (int64_t i = r0; i < r1; i++) {
        float uv[HCR_J];
#pragma unroll
        for (int j = 0; j < HCR_J; j++) uv[j] = un[j];
        if (i + 1 < r1) load(i + 1);
        float v[32];
#pragma unroll
        for (int o = 0; o < 32; o++) v[o] = 0.f;
#pragma unroll
        for (int j = 0; j < HCR_J; j++) {
            v[NM] = fmaf(uv[j], uv[j], v[NM]);
#pragma unroll
            for (int o = 0; o < NM; o++) v[o] = fmaf(uv[j], f[j][o], v[o]);
        }
        const float t = warp_sum32(v);
        const int b = (int)((i - r0) & 1);
        ws[b][warp][lane] = t;
        __syncthreads();
        if (tid < NV) {
            float a = 0.f;
#pragma unroll
            for (int w = 0; w < NW; w++) a = ADD(a, ws[b][w][tid]);
            part[(i * ranks + rank) * NV + tid] = a;
        }
    }
}

enum { HCF_ROWS = 4 };

template <int HC>
__global__ void __launch_bounds__(HCF_ROWS * 32)
    k_hc_mix_finish_rows(const float *__restrict__ part, int ranks, int64_t m, int64_t d, const float *base,
                         const float *scale, float norm_eps, float eps, int iters, float *pre, float *post,
                         float *comb) {
    constexpr int NM = (2 + HC) * HC, NV = NM + 1;
    __shared__ float tot[HCF_ROWS][32];
    __shared__ float cm[HCF_ROWS][HC * HC];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t i = (int64_t)blockIdx.x * HCF_ROWS + warp, n = (int64_t)HC * d;
    if (i >= m) return; /* the whole warp: nothing below waits for the block */
    float t = 0.f;
    if (lane < NV) {
        const float *p = part + i * ranks * NV + lane;
#pragma unroll 8
        for (int r = 0; r < ranks; r++) t = ADD(t, __ldg(p + (int64_t)r * NV));
    }
    tot[warp][lane] = t;
    hc_mix_norm_finish<HC>(tot[warp], n, norm_eps, base, scale, eps, iters, pre + i * HC, post + i * HC, cm[warp],
                           comb + i * HC * HC);
}

static int hc_rows_ranks(int64_t n) { return (int)((n + HCR_COLS - 1) / HCR_COLS); }

/* Rows of one launch of the rows form in batch-invariant mode (its grid's
 * y extent); larger m runs in several, over the same partial sums. */
enum { HCR_BI_ROWS = HCR_RB * 65535 };

extern "C" size_t cuda_op_hc_mix_scratch_bytes(int64_t m, int hc, int64_t d) {
    if (hc != 4 || d <= 0) return 0;
    if (cuda_batch_invariant()) /* the rows form at every m */
        return (size_t)(m < HCR_BI_ROWS ? m : HCR_BI_ROWS) * (size_t)hc_rows_ranks(4 * d) * ((2 + 4) * 4 + 1) *
               sizeof(float);
    if (m < HCR_MIN_ROWS || (m + HCR_RB - 1) / HCR_RB > 65535 || (m + HCF_ROWS - 1) / HCF_ROWS > 0x7fffffffLL)
        return 0;
    return (size_t)m * (size_t)hc_rows_ranks(4 * d) * ((2 + 4) * 4 + 1) * sizeof(float);
}

extern "C" di_status cuda_op_hc_mix(const float *s, int64_t m, int hc, int64_t d, const float *fn,
                                    const float *base, const float *scale, float norm_eps,
                                    float hc_eps, int iters, float *pre, float *post, float *comb,
                                    di_err *err) {
    return cuda_op_hc_mix_s(s, m, hc, d, fn, base, scale, norm_eps, hc_eps, iters, pre, post, comb, NULL, 0, err);
}

/* The rows form (hc = 4) over m rows: the partial sums into part, then
 * each row's finish (m within one launch's grid, HCR_RB * 65535 rows) */
static di_status hc_mix_rows(const float *s, int64_t m, int64_t d, const float *fn, float *part, const float *base,
                             const float *scale, float norm_eps, float hc_eps, int iters, float *pre, float *post,
                             float *comb, di_err *err) {
    const int ranks = hc_rows_ranks(4 * d);
    k_hc_mix_rows<4><<<dim3((unsigned)ranks, (unsigned)((m + HCR_RB - 1) / HCR_RB)), HCR_THREADS>>>(s, m, d, fn,
                                                                                                  part);
    di_status st = cuda_check_launch(err, "hc_mix (rows form)");
    if (st) return st;
    k_hc_mix_finish_rows<4><<<(unsigned)((m + HCF_ROWS - 1) / HCF_ROWS), HCF_ROWS * 32>>>(
        part, ranks, m, d, base, scale, norm_eps, hc_eps, iters, pre, post, comb);
    return cuda_check_launch(err, "hc_mix (rows form)");
}

/* The split form (hc = 4, m <= HC_SP_MAX_ROWS) on stream st: the product
 * launched programmatically after the kernel ahead of it on st, or plainly
 * (pdl_part 0) where an event, not a kernel, is what it waits for; the
 * reduction programmatically after the product. */
static di_status hc_mix_split(const float *s, int64_t m, int64_t d, const float *fn, const float *base,
                              const float *scale, float norm_eps, float hc_eps, int iters, float *pre, float *post,
                              float *comb, cudaStream_t st, int pdl_part, di_err *err) {
    const int64_t n = 4 * d, chunk = hc_sp_chunk(n);
    const unsigned nb = (unsigned)((n + chunk - 1) / chunk);
    if (pdl_part) cuda_launch_pdl(k_hc_mix_part<4>, dim3(nb, (unsigned)m), HC_SP_THREADS, 0, st, s, d, fn, chunk);
    else k_hc_mix_part<4><<<dim3(nb, (unsigned)m), HC_SP_THREADS, 0, st>>>(s, d, fn, chunk);
    di_status r = cuda_check_launch(err, "hc_mix (split product)");
    if (r) return r;
    cuda_launch_pdl(k_hc_mix_reduce<4>, (unsigned)m, HC_RD_THREADS, 0, st, (int)nb, d, base, scale, norm_eps, hc_eps,
                    iters, pre, post, comb);
    return cuda_check_launch(err, "hc_mix");
}

extern "C" di_status cuda_op_hc_mix_s(const float *s, int64_t m, int hc, int64_t d, const float *fn,
                                      const float *base, const float *scale, float norm_eps,
                                      float hc_eps, int iters, float *pre, float *post, float *comb,
                                      void *scratch, size_t scratch_bytes, di_err *err) {
    if (hc < 1 || hc > HC_MAX)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "hc_mix: hc_mult %d (supported 1..%d)", hc,
                          HC_MAX);
    if (m <= 0) return DI_OK;
    /* The forms reduce a row in different orders. Batch-invariant mode:
     * the rows form at every m (hc = 4; its order depends on n alone),
     * whose partial sums the caller's scratch holds (without it, an error:
     * another form would give other bits); the block per row for other hc,
     * as always. Measured (docs/gpu-notes.md, invariant runs 2 and 3): at
     * batch 1 14 µs a call, as the split product; the split product at
     * every m instead (launches of 64 rows) cost a prefill of 8K tokens 45
     * ms against 8, its blocks reading the 2 MB of fn once per row. */
    if (cuda_batch_invariant() && hc == 4) {
        const size_t need = cuda_op_hc_mix_scratch_bytes(m, hc, d);
        if (!scratch || scratch_bytes < need)
            return di_err_set(err, DI_ERR_NOMEM, "hc_mix: no scratch for the batch-invariant form (%zu bytes)",
                              need);
        const int64_t n = 4 * d;
        for (int64_t i0 = 0; i0 < m; i0 += HCR_BI_ROWS) {
            const int64_t r = m - i0 < HCR_BI_ROWS ? m - i0 : HCR_BI_ROWS;
            di_status st = hc_mix_rows(s + i0 * n, r, d, fn, (float *)scratch, base, scale, norm_eps, hc_eps, iters,
                                       pre + i0 * 4, post + i0 * 4, comb + i0 * 16, err);
            if (st) return st;
        }
        return DI_OK;
    }
    const size_t need = scratch ? cuda_op_hc_mix_scratch_bytes(m, hc, d) : 0;
    if (need && scratch_bytes >= need)
        return hc_mix_rows(s, m, d, fn, (float *)scratch, base, scale, norm_eps, hc_eps, iters, pre, post, comb, err);
    if (hc == 4 && m <= HC_SP_MAX_ROWS)
        return hc_mix_split(s, m, d, fn, base, scale, norm_eps, hc_eps, iters, pre, post, comb, 0, 1, err);
    if (hc == 4 && m <= 65535)
        k_hc_mix_cluster<4><<<dim3(HC_CL, (unsigned)m), HC_CL_THREADS>>>(s, d, fn, base, scale, norm_eps,
                                                                          hc_eps, iters, pre, post, comb);
    else
        k_hc_mix<<<(unsigned)m, 256>>>(s, hc, d, fn, base, scale, norm_eps, hc_eps, iters, pre,
                                       post, comb);
    return cuda_check_launch(err, "hc_mix");
}

extern "C" di_status cuda_side_create(void **stream, void **ev_fork, void **ev_join, di_err *err) {
    cudaStream_t st = NULL;
    cudaEvent_t a = NULL, b = NULL;
    di_status r = cuda_check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), err, "side stream");
    if (!r) r = cuda_check(cudaEventCreateWithFlags(&a, cudaEventDisableTiming), err, "side stream fork event");
    if (!r) r = cuda_check(cudaEventCreateWithFlags(&b, cudaEventDisableTiming), err, "side stream join event");
    if (r) {
        cuda_side_destroy(st, a, b);
        st = NULL, a = b = NULL;
    }
    *stream = st, *ev_fork = a, *ev_join = b;
    return r;
}

extern "C" void cuda_side_destroy(void *stream, void *ev_fork, void *ev_join) {
    if (ev_fork) cudaEventDestroy((cudaEvent_t)ev_fork);
    if (ev_join) cudaEventDestroy((cudaEvent_t)ev_join);
    if (stream) cudaStreamDestroy((cudaStream_t)stream);
}

extern "C" int64_t cuda_op_hc_mix_side_rows(void) { return HC_SP_MAX_ROWS; }

/* The split form on the side stream (hc_mix_split): its product waits for
 * the fork event (the stream s was written on), so it is launched plainly.
 * hc_sp_part is only this op's, and two hc_mix never overlap (the backend
 * joins before the next). */
extern "C" di_status cuda_op_hc_mix_side(const float *s, int64_t m, int64_t d, const float *fn, const float *base,
                                         const float *scale, float norm_eps, float hc_eps, int iters, float *pre,
                                         float *post, float *comb, void *stream, void *ev_fork, void *ev_join,
                                         di_err *err) {
    if (m <= 0 || m > HC_SP_MAX_ROWS || cuda_batch_invariant())
        return di_err_set(err, DI_ERR_UNSUPPORTED, "hc_mix on the side stream: %lld rows", (long long)m);
    cudaStream_t st = (cudaStream_t)stream;
    di_status r = cuda_check(cudaEventRecord((cudaEvent_t)ev_fork, 0), err, "hc_mix: fork");
    if (!r) r = cuda_check(cudaStreamWaitEvent(st, (cudaEvent_t)ev_fork, 0), err, "hc_mix: fork");
    if (r) return r;
    if ((r = hc_mix_split(s, m, d, fn, base, scale, norm_eps, hc_eps, iters, pre, post, comb, st, 0, err))) return r;
    return cuda_check(cudaEventRecord((cudaEvent_t)ev_join, st), err, "hc_mix: join event");
}

extern "C" di_status cuda_side_join(void *ev_join, di_err *err) {
    return cuda_check(cudaStreamWaitEvent(0, (cudaEvent_t)ev_join, 0), err, "side stream join");
}

/* The cluster form at up to HCC_MAX_ROWS rows (16 rows: 128 blocks, one
 * wave); DI_CUDA_HC_CLUSTER=0 keeps the one-block form everywhere (a
 * measuring aid, read at the first call). */
static int hcc_state = -1;

extern "C" di_status cuda_op_hc_collapse_norm(const float *s, const float *w, int64_t m, int hc, int64_t d,
                                              const void *nw, int nw_bf16, float eps, float *y, di_err *err) {
    if (m <= 0) return DI_OK;
    if (hc == 4 && m <= HCC_MAX_ROWS && d <= (int64_t)HCN_R * HCN_VT &&
        cuda_env_switch("DI_CUDA_HC_CLUSTER", &hcc_state)) {
        cuda_launch_pdl(k_hc_collapse_norm_cl<4>, (unsigned)(m * HCC_CL), HCC_THREADS, 0, 0, s, w, d, nw, nw_bf16,
                        eps, y);
        return cuda_check_launch(err, "hc_collapse_norm");
    }
    if (hc == 4 && m <= 0x7fffffffLL && d <= (int64_t)HCN_R * HCN_VT) {
        cuda_launch_pdl(k_hc_collapse_norm<4>, (unsigned)m, HCN_THREADS, 0, 0, s, w, d, nw, nw_bf16, eps, y);
        return cuda_check_launch(err, "hc_collapse_norm");
    }
    di_status st = cuda_op_hc_collapse(s, w, m, hc, d, y, err);
    if (!st) st = cuda_op_rmsnorm(y, nw, nw_bf16, m, d, eps, y, err);
    return st;
}

__global__ void k_hc_collapse(const float *s, const float *w, int64_t m, int hc, int64_t d,
                              float *y) {
    pdl_enter();
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float acc = 0.f;
        for (int c = 0; c < hc; c++) acc = ADD(acc, MUL(w[i * hc + c], s[(i * hc + c) * d + k]));
        y[t] = round_bf16(acc);
    }
}

extern "C" di_status cuda_op_hc_collapse(const float *s, const float *w, int64_t m, int hc,
                                         int64_t d, float *y, di_err *err) {
    if (m * d <= 0) return DI_OK;
    cuda_launch_pdl(k_hc_collapse, grid_for(m * d), 256, 0, 0, s, w, m, hc, d, y);
    return cuda_check_launch(err, "hc_collapse");
}

/* Each thread reads the hc values of s at (i, k) before writing the hc
 * outputs at the same places, so out may alias s. */
__global__ void k_hc_expand(const float *y, const float *s, const float *post, const float *comb,
                            int64_t m, int hc, int64_t d, float *out) {
    pdl_enter();
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float sv[HC_MAX];
        for (int a = 0; a < hc; a++) sv[a] = s[(i * hc + a) * d + k];
        const float *c = comb + i * hc * hc;
        float yv = y[t];
        for (int b = 0; b < hc; b++) {
            float acc = 0.f;
            for (int a = 0; a < hc; a++) acc = ADD(acc, MUL(c[a * hc + b], sv[a]));
            out[(i * hc + b) * d + k] = round_bf16(ADD(MUL(post[i * hc + b], yv), acc));
        }
    }
}

/* The same for hc = 4 and d % 4 == 0, four columns a thread by 16-byte
 * loads and stores, one row a grid row (no 64-bit division an element):
 * each output the same operations in the same order. At 8,192 rows the
 * element form ran at ~55 % of the copy bandwidth (0.72 ms a call). */
template <int HC>
__global__ void k_hc_expand4(const float *y, const float *s, const float *post, const float *comb, int64_t d,
                             float *out) {
    pdl_enter();
    const int64_t i = blockIdx.y, q = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (4 * q >= d) return;
    float c[HC * HC], po[HC];
#pragma unroll
    for (int e = 0; e < HC * HC; e++) c[e] = comb[i * HC * HC + e];
#pragma unroll
    for (int b = 0; b < HC; b++) po[b] = post[i * HC + b];
    float4 sv[HC];
#pragma unroll
    for (int a = 0; a < HC; a++) sv[a] = ((const float4 *)(s + (i * HC + a) * d))[q];
    const float4 yv = ((const float4 *)(y + i * d))[q];
#pragma unroll
    for (int b = 0; b < HC; b++) {
        float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
        for (int a = 0; a < HC; a++) {
            const float w = c[a * HC + b];
            acc.x = ADD(acc.x, MUL(w, sv[a].x));
            acc.y = ADD(acc.y, MUL(w, sv[a].y));
            acc.z = ADD(acc.z, MUL(w, sv[a].z));
            acc.w = ADD(acc.w, MUL(w, sv[a].w));
        }
        const float4 o = make_float4(round_bf16(ADD(MUL(po[b], yv.x), acc.x)), round_bf16(ADD(MUL(po[b], yv.y), acc.y)),
                                     round_bf16(ADD(MUL(po[b], yv.z), acc.z)), round_bf16(ADD(MUL(po[b], yv.w), acc.w)));
        ((float4 *)(out + (i * HC + b) * d))[q] = o;
    }
}

extern "C" di_status cuda_op_hc_expand(const float *y, const float *s, const float *post,
                                       const float *comb, int64_t m, int hc, int64_t d,
                                       float *out, di_err *err) {
    if (hc < 1 || hc > HC_MAX)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "hc_expand: hc_mult %d (supported 1..%d)", hc,
                          HC_MAX);
    if (m * d <= 0) return DI_OK;
    if (hc == 4 && d % 4 == 0 && m <= 65535 && ((uintptr_t)y | (uintptr_t)s | (uintptr_t)out) % 16 == 0) {
        const int64_t cols = d / 4;
        cuda_launch_pdl(k_hc_expand4<4>, dim3((unsigned)((cols + 127) / 128), (unsigned)m), 128, 0, 0, y, s, post,
                        comb, d, out);
    } else {
        cuda_launch_pdl(k_hc_expand, grid_for(m * d), 256, 0, 0, y, s, post, comb, m, hc, d, out);
    }
    return cuda_check_launch(err, "hc_expand");
}

__global__ void k_hc_mean(const float *s, int64_t m, int hc, int64_t d, float *out,
                          int64_t out_stride) {
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float acc = 0.f;
        for (int c = 0; c < hc; c++) acc = ADD(acc, s[(i * hc + c) * d + k]);
        out[i * out_stride + k] = round_bf16(acc / (float)hc);
    }
}

extern "C" di_status cuda_op_hc_mean(const float *s, int64_t m, int hc, int64_t d, float *out,
                                     int64_t out_stride, di_err *err) {
    if (m * d <= 0) return DI_OK;
    k_hc_mean<<<grid_for(m * d), 256>>>(s, m, hc, d, out, out_stride);
    return cuda_check_launch(err, "hc_mean");
}

/* One block per (row, copy): the three sums as block reductions, then the
 * gated update of the copy, a thread's terms in increasing k. The general
 * form (any d and alignment); k_engram_gate4 below takes the model's rows. */
__global__ void k_engram_gate(float *s, const float *kv, const void *qw, const void *kw,
                              int w_bf16, int hc, int64_t d, float eps, float inv_sqrt_d) {
    __shared__ float red[32];
    int64_t i = blockIdx.x / hc;
    int c = (int)(blockIdx.x % hc);
    const float *value = kv + (i * (hc + 1) + hc) * d;
    float *h = s + (i * hc + c) * d;
    const float *key = kv + (i * (hc + 1) + c) * d;
    float sh = 0.f, sk = 0.f, dot = 0.f;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        sh = ADD(sh, MUL(h[k], h[k]));
        sk = ADD(sk, MUL(key[k], key[k]));
        float wgt = MUL(vec_at(qw, w_bf16, c * d + k), vec_at(kw, w_bf16, c * d + k));
        dot = ADD(dot, MUL(MUL(h[k], wgt), key[k]));
    }
    sh = block_sum(sh, red);
    sk = block_sum(sk, red);
    dot = block_sum(dot, red);
    float rstd = MUL(1.0f / sqrtf(ADD(sh / (float)d, eps)), 1.0f / sqrtf(ADD(sk / (float)d, eps)));
    dot = MUL(MUL(dot, rstd), inv_sqrt_d);
    float a = sqrtf(fmaxf(fabsf(dot), 1e-6f));
    float gate = sigmoid_f(copysignf(a, dot));
    __syncthreads(); /* every thread has read h before any writes it */
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) h[k] = round_bf16(ADD(h[k], MUL(gate, value[k])));
}

/* Four values a load (d % 4 == 0, 16-byte rows, 8- or 16-byte weights):
 * at one row and d 5120 the form above is ~17 us a call, its 4 blocks on
 * 4 SMs issuing ~2,000 instructions a warp of 64-bit indices, the weights'
 * dtype branch and one value a load (docs/gpu-notes.md, runs 57-62); here each
 * thread takes whole float4 chunks j, j + 256, ... (its terms in
 * increasing k), the dtype is a template parameter and the indices 32-bit
 * within a row. The same three sums and the same update; the terms are
 * grouped differently over the threads, so the bits are not the other
 * form's (both within the CPU's tolerance). */
enum { EG4_B = 8 };

template <bool BF16W>
__device__ __forceinline__ float4 eg_w4(const void *w, int64_t base, int j) {
    if (BF16W) {
        const uint2 u = ((const uint2 *)((const uint16_t *)w + base))[j];
        return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                           __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
    }
    return ((const float4 *)((const float *)w + base))[j];
}

template <bool BF16W>
__global__ void k_engram_gate4(float *s, const float *kv, const void *qw, const void *kw, int hc, int64_t d,
                               float eps, float inv_sqrt_d) {
    __shared__ float red[32];
    const int64_t i = blockIdx.x / hc;
    const int c = (int)(blockIdx.x % hc), n4 = (int)(d / 4);
    const float4 *value = (const float4 *)(kv + (i * (hc + 1) + hc) * d);
    const float4 *key = (const float4 *)(kv + (i * (hc + 1) + c) * d);
    float4 *h = (float4 *)(s + (i * hc + c) * d);
    const int64_t wb = (int64_t)c * d;
    float sh = 0.f, sk = 0.f, dot = 0.f;
    for (int j0 = threadIdx.x; j0 < n4; j0 += EG4_B * (int)blockDim.x) {
        float4 hv[EG4_B], kv4[EG4_B], qv[EG4_B], wv[EG4_B];
#pragma unroll
        for (int u = 0; u < EG4_B; u++) {
            const int j = j0 + u * (int)blockDim.x, jj = j < n4 ? j : j0; /* past the row: j0 again, unused */
            hv[u] = h[jj], kv4[u] = key[jj], qv[u] = eg_w4<BF16W>(qw, wb, jj), wv[u] = eg_w4<BF16W>(kw, wb, jj);
        }
#pragma unroll
        for (int u = 0; u < EG4_B; u++) {
            if (j0 + u * (int)blockDim.x >= n4) break;
            const float hh[4] = {hv[u].x, hv[u].y, hv[u].z, hv[u].w}, kk[4] = {kv4[u].x, kv4[u].y, kv4[u].z, kv4[u].w};
            const float qq[4] = {qv[u].x, qv[u].y, qv[u].z, qv[u].w}, ww[4] = {wv[u].x, wv[u].y, wv[u].z, wv[u].w};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                sh = ADD(sh, MUL(hh[e], hh[e]));
                sk = ADD(sk, MUL(kk[e], kk[e]));
                dot = ADD(dot, MUL(MUL(hh[e], MUL(qq[e], ww[e])), kk[e]));
            }
        }
    }
    sh = block_sum(sh, red);
    sk = block_sum(sk, red);
    dot = block_sum(dot, red);
    float rstd = MUL(1.0f / sqrtf(ADD(sh / (float)d, eps)), 1.0f / sqrtf(ADD(sk / (float)d, eps)));
    dot = MUL(MUL(dot, rstd), inv_sqrt_d);
    const float a = sqrtf(fmaxf(fabsf(dot), 1e-6f)), gate = sigmoid_f(copysignf(a, dot));
    __syncthreads(); /* every thread has read h before any writes it */
    for (int j0 = threadIdx.x; j0 < n4; j0 += EG4_B * (int)blockDim.x) {
        float4 hv[EG4_B], vv[EG4_B];
#pragma unroll
        for (int u = 0; u < EG4_B; u++) {
            const int j = j0 + u * (int)blockDim.x, jj = j < n4 ? j : j0;
            hv[u] = h[jj], vv[u] = value[jj];
        }
#pragma unroll
        for (int u = 0; u < EG4_B; u++) {
            const int j = j0 + u * (int)blockDim.x;
            if (j < n4)
                h[j] = make_float4(round_bf16(ADD(hv[u].x, MUL(gate, vv[u].x))), round_bf16(ADD(hv[u].y, MUL(gate, vv[u].y))),
                                   round_bf16(ADD(hv[u].z, MUL(gate, vv[u].z))), round_bf16(ADD(hv[u].w, MUL(gate, vv[u].w))));
        }
    }
}

extern "C" di_status cuda_op_engram_gate(float *s, const float *kv, const void *qw,
                                         const void *kw, int w_bf16, int64_t m, int hc,
                                         int64_t d, float eps, di_err *err) {
    if (m * hc <= 0) return DI_OK;
    float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
    const uintptr_t wal = w_bf16 ? 7 : 15;
    if (d % 4 == 0 && d / 4 <= 0x7fffffff && ((uintptr_t)s | (uintptr_t)kv) % 16 == 0 &&
        ((uintptr_t)qw & wal) == 0 && ((uintptr_t)kw & wal) == 0) {
        if (w_bf16) k_engram_gate4<true><<<(unsigned)(m * hc), 256>>>(s, kv, qw, kw, hc, d, eps, inv_sqrt_d);
        else k_engram_gate4<false><<<(unsigned)(m * hc), 256>>>(s, kv, qw, kw, hc, d, eps, inv_sqrt_d);
    } else {
        k_engram_gate<<<(unsigned)(m * hc), 256>>>(s, kv, qw, kw, w_bf16, hc, d, eps, inv_sqrt_d);
    }
    return cuda_check_launch(err, "engram_gate");
}
