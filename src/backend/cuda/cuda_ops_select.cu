/* Selections on the device (architecture.md §5.4), and at the end of the
 * file the index scores they select from (tensor cores): the indexer's top-k and
 * the candidate pool's block choice, with the CPU backend's exact semantics
 * (backend_cpu.c, select_topk): among the finite-or-+inf scores of a row
 * (-inf and NaN never count), the k largest, ties going to the lower index,
 * written in ascending index order and padded with -1. Only the k indices
 * travel back to the host instead of the whole score row, and no host
 * thread walks [m, width] scores (0.33 s per call for a 2048-token prefill
 * before; docs/gpu-notes.md).
 *
 * One block per row, by radix selection on order-preserving keys: four
 * passes of 8 bits find the key T of the k-th largest score and how many
 * of the scores equal to T are still needed; a last pass in index order
 * keeps every key above T and the first `need` keys equal to T (block-wide
 * prefix sums give each kept entry its output slot), so the order of the
 * output and the tie rule are those of the CPU by construction. -0 is keyed
 * as +0: the CPU compares floats, to which the two are equal. */
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_ops_select.h"

enum { SEL_THREADS = 512 };

__device__ __forceinline__ bool sel_valid(float v) { return v == v && v != -INFINITY; }

/* larger float -> larger unsigned key */
__device__ __forceinline__ uint32_t sel_key(float v) {
    uint32_t u = __float_as_uint(v);
    if (u == 0x80000000u) u = 0;
    return u & 0x80000000u ? ~u : u | 0x80000000u;
}

/* Exclusive prefix sum of v over the block (in thread order) and the total. */
__device__ int block_scan(int v, int *total, int *warp_tot) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    int x = v;
    for (int off = 1; off < 32; off <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, off);
        if (lane >= off) x += y;
    }
    if (lane == 31) warp_tot[warp] = x;
    __syncthreads();
    int before = 0, all = 0;
    for (int w = 0; w < nw; w++) {
        int t = warp_tot[w];
        before += w < warp ? t : 0;
        all += t;
    }
    __syncthreads(); /* warp_tot is reused by the next scan */
    *total = all;
    return before + x - v;
}

/* The digit of the rem-th largest key among the histogram's 256 bins (the
 * highest d whose suffix sum hist[d] + ... + hist[255] reaches rem; 0 if
 * none above it does) and how many keys of that digit are still needed:
 * rem less the keys in the bins above d. The block's threads 0..255 take
 * bin 255 - t each, so an inclusive prefix sum in thread order is the
 * suffix sum of that bin; the first thread whose sum reaches rem holds the
 * digit. The same answer as walking the bins down from 255 in one thread
 * (~255 dependent shared-memory reads and adds a pass: most of a 1,000-
 * score row's 23 µs at b1, docs/gpu-notes.md run 93). Every thread of the
 * block calls it; *pick holds (digit, need) when it returns. */
__device__ void topk_digit_pick(const unsigned *hist, int rem, int *warp_tot, int *first, int *pick) {
    const int t = threadIdx.x, lane = t & 31, w = t >> 5;
    int x = 0, incl = 0;
    if (t == 0) *first = 255;
    if (t < 256) {
        x = (int)hist[255 - t];
        incl = x;
        for (int off = 1; off < 32; off <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, incl, off);
            if (lane >= off) incl += y;
        }
        if (lane == 31) warp_tot[w] = incl;
    }
    __syncthreads();
    if (t < 256) {
        for (int v = 0; v < w; v++) incl += warp_tot[v];
        /* bin 0 is the walk's last stop whatever its sum */
        const unsigned hit = __ballot_sync(0xffffffffu, t == 255 || incl >= rem);
        if (hit && lane == __ffs(hit) - 1) atomicMin(first, t);
    }
    __syncthreads();
    if (t == *first) {
        pick[0] = 255 - t;
        pick[1] = rem - (incl - x);
    }
    __syncthreads();
}

/* sc [m, width]; n_vis [m] (device) or NULL = width; picks up to ksel per
 * row into idx [m, kout], -1 padding. The histogram's increments are
 * aggregated per warp (lanes with the same digit add once): a row's scores
 * mostly share their top bits, so without it the first passes' atomics
 * queue on a few bins. */
__global__ void k_topk(const float *sc, const int32_t *n_vis, int64_t width, int ksel, int kout,
                       int32_t *idx) {
    pdl_enter();
    __shared__ unsigned hist[256];
    __shared__ int warp_tot[SEL_THREADS / 32];
    __shared__ int s_first, s_pick[2];
    int64_t i = blockIdx.x;
    const float *s = sc + i * width;
    int64_t n = n_vis ? n_vis[i] : width;
    n = n < 0 ? 0 : n > width ? width : n;
    int32_t *o = idx + i * (int64_t)kout;
    int cnt = 0, mine = 0;
    for (int64_t j = threadIdx.x; j < n; j += blockDim.x) mine += sel_valid(s[j]);
    block_scan(mine, &cnt, warp_tot);
    int all = cnt <= ksel;
    uint32_t T = 0;
    int need = 0;
    if (!all) {
        uint32_t prefix = 0, mask = 0;
        int rem = ksel;
        const int lane = threadIdx.x & 31;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int64_t j0 = 0; j0 < n; j0 += blockDim.x) { /* whole warps each round */
                const int64_t j = j0 + threadIdx.x;
                int dg = 256; /* no count */
                if (j < n) {
                    float v = s[j];
                    uint32_t key = sel_key(v);
                    if (sel_valid(v) && (key & mask) == prefix) dg = (int)((key >> shift) & 255u);
                }
                const unsigned peers = __match_any_sync(0xffffffffu, dg);
                if (dg < 256 && lane == __ffs(peers) - 1) atomicAdd(&hist[dg], (unsigned)__popc(peers));
            }
            __syncthreads();
            topk_digit_pick(hist, rem, warp_tot, &s_first, s_pick);
            prefix |= (uint32_t)s_pick[0] << shift;
            rem = s_pick[1];
            mask |= 255u << shift;
        }
        T = prefix;
        need = rem;
    }
    int out = 0, ties = 0;
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
        int64_t j = c0 + threadIdx.x;
        int valid = j < n && sel_valid(s[j]);
        uint32_t key = valid ? sel_key(s[j]) : 0;
        int gt = all ? valid : valid && key > T, eq = !all && valid && key == T;
        int eq_tot = 0, sel_tot = 0;
        int eq_before = block_scan(eq, &eq_tot, warp_tot);
        int sel = gt || (eq && ties + eq_before < need);
        int at = block_scan(sel, &sel_tot, warp_tot);
        if (sel) o[out + at] = (int32_t)j;
        out += sel_tot;
        ties += eq_tot;
    }
    for (int t = out + threadIdx.x; t < kout; t += blockDim.x) o[t] = -1;
}

/* bsc [m, nb] = max of each block of bs scores (fmaxf: NaN ignored, -inf
 * when empty), the block of the row's newest visible entry set to +inf. */
__global__ void k_block_max(const float *sc, const int32_t *n_vis, int64_t m, int64_t width, int bs,
                            int64_t nb, float *bsc) {
    pdl_enter();
    GRID_STRIDE(t, m * nb) {
        int64_t i = t / nb, b = t % nb;
        const float *s = sc + i * width;
        float mx = -INFINITY;
        for (int64_t j = b * bs; j < (b + 1) * bs && j < width; j++) mx = fmaxf(mx, s[j]);
        int64_t last = n_vis[i] > 0 ? (n_vis[i] - 1) / bs : -1;
        bsc[t] = b == last ? INFINITY : mx;
    }
}

extern "C" di_status cuda_op_topk_select(const float *scores, const int32_t *n_vis, int64_t m,
                                         int64_t width, int ksel, int kout, int32_t *idx,
                                         di_err *err) {
    if (m <= 0 || kout <= 0) return DI_OK;
    if (m > 0x7fffffff) return di_err_set(err, DI_ERR_UNSUPPORTED, "topk: %lld rows", (long long)m);
    cuda_launch_pdl(k_topk, (unsigned)m, SEL_THREADS, 0, 0, scores, n_vis, width, ksel < 0 ? 0 : ksel, kout, idx);
    return cuda_check_launch(err, "topk");
}

extern "C" di_status cuda_op_block_max(const float *scores, const int32_t *n_vis, int64_t m,
                                       int64_t width, int bs, float *bsc, di_err *err) {
    int64_t nb = (width + bs - 1) / bs;
    if (m * nb <= 0) return DI_OK;
    cuda_launch_pdl(k_block_max, grid_for(m * nb), 256, 0, 0, scores, n_vis, m, width, bs, nb, bsc);
    return cuda_check_launch(err, "candidate block scores");
}

/* ---- index scores on the tensor cores (architecture.md §5.4 step 3) ----
 *
 * score[i, j] = bf16(Σ_h bf16(bf16(ReLU(bf16(q_ih · k_j))) · w_ih)), the
 * heads summed in order from +0 in fp32: the CPU op's rounding points
 * (backend_cpu.c idx_score). The dots are the only part that changes form:
 * instead of a warp per (row, key), a block takes 64 keys and up to 64
 * query rows, the keys decoded once into bf16 mma fragments (an E2M1 code
 * times an E8M0 scale is exact in bf16) that stay in registers while the
 * rows pass, and q_ih · k_j for all heads as bf16 mma.sync m16n8k16 (heads
 * = m, keys = n, the key dimension = k) with fp32 accumulation. q is split
 * exactly into up to three bf16 terms (h + m + l, each the rounding of what
 * is left); a term that is zero in all the fragments a warp holds is
 * skipped, so the model's q (FP4-QDQ'd, §5.4 step 1: already bf16) takes
 * one mma per tile. Products of bf16 terms are exact; for the model's FP4
 * q and keys every partial sum of a 32-block is a multiple of a power of
 * two below 2^13 of it, so the dots are exact in any order unless the
 * 32-block scales of a row span more than ~11 octaves — then, as for
 * general fp32 q, the dot differs from the CPU's fp32 chain by a few fp32
 * ulps, which the bf16 rounding after it hides except at near-ties. Each
 * warp writes its heads' weighted terms for its 16 keys to shared memory;
 * one thread per key then adds them in head order. */
enum { IX_KEYS = 64, IX_ROWS = 64, IX_THREADS = 128, IX_MAXH = 64, IX_LD = IX_KEYS + 8 };

/* two floats that are bf16 values -> one register (lo in the low half) */
__device__ __forceinline__ uint32_t ix_pack(float lo, float hi) {
    return (__float_as_uint(lo) >> 16) | (__float_as_uint(hi) & 0xffff0000u);
}

/* E2M1 code -> value from the bits (e2m1_val's values, -0 for code 8,
 * without its table: a local array indexed at run time sits in memory) */
__device__ __forceinline__ float ix_e2m1(uint32_t c) {
    const float v = c & 6u ? __uint_as_float(((((c >> 1) & 3u) + 126u) << 23) | ((c & 1u) << 22))
                           : (float)(c & 1u) * 0.5f;
    return __uint_as_float(__float_as_uint(v) | ((c & 8u) << 28));
}

/* a packed byte (element 2c in the low nibble) times its block's scale */
__device__ __forceinline__ uint32_t ix_key2(uint32_t byte, float s) {
    return ix_pack(MUL(ix_e2m1(byte & 15u), s), MUL(ix_e2m1(byte >> 4), s));
}

template <int KS> /* di = 16 KS */
__global__ void __launch_bounds__(IX_THREADS)
    k_index_scores_tc(const float *__restrict__ q, const float *__restrict__ w, int64_t m, int hi,
                      int64_t width, const uint8_t *const *keys, const int32_t *n_vis,
                      float *out, int rows) {
    pdl_enter();
    constexpr int DI = KS * 16, KB = DI / 2 + DI / 32; /* bytes of a packed key */
    __shared__ __align__(16) float part[2][IX_MAXH * IX_LD];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int64_t j0 = (int64_t)blockIdx.x * IX_KEYS, r0 = (int64_t)blockIdx.y * rows;
    const int64_t r1 = r0 + rows < m ? r0 + rows : m;
    const int nk = width - j0 < IX_KEYS ? (int)(width - j0) : IX_KEYS;
    const int mt_n = (hi + 15) / 16;
    uint32_t bf[2][KS][2];
    const uint8_t *loaded = NULL;
    int cnt_loaded = 0, buf = 0;
    /* rows downwards: in a prefill the later rows see the most keys, so the
     * fragments are usually loaded once per block */
    for (int64_t i = r1 - 1; i >= r0; i--) {
        int64_t nv = n_vis[i];
        nv = nv < 0 ? 0 : nv > width ? width : nv;
        const int c = nv - j0 <= 0 ? 0 : nv - j0 >= nk ? nk : (int)(nv - j0);
        float *o = out + i * width + j0;
        if (c == 0) { /* nothing visible in this tile (uniform over the block) */
            for (int jj = threadIdx.x; jj < nk; jj += IX_THREADS) o[jj] = -INFINITY;
            continue;
        }
        const uint8_t *kp = keys[i];
        if (kp != loaded || c > cnt_loaded) {
            /* keys past the row's visible count read as zeros, never memory */
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                const int lj = 16 * warp + nt * 8 + g;
                const bool ok = lj < c;
                const uint8_t *kr = kp + (ok ? (size_t)(j0 + lj) * KB : 0);
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    const float s = e8m0_to_f32(ok ? kr[DI / 2 + ks / 2] : 0u);
                    bf[nt][ks][0] = ix_key2(ok ? kr[ks * 8 + t] : 0u, s);
                    bf[nt][ks][1] = ix_key2(ok ? kr[ks * 8 + t + 4] : 0u, s);
                }
            }
            loaded = kp;
            cnt_loaded = c;
        }
        float *S = part[buf];
        for (int mt = 0; mt < mt_n; mt++) {
            float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
            const int h0 = mt * 16 + g, h1 = h0 + 8;
            const bool v0 = h0 < hi, v1 = h1 < hi;
            const float *q0 = q + (i * hi + (v0 ? h0 : 0)) * DI, *q1 = q + (i * hi + (v1 ? h1 : 0)) * DI;
#pragma unroll
            for (int ks = 0; ks < KS; ks++) {
                const int c0 = ks * 16 + 2 * t;
                const float2 z = make_float2(0.f, 0.f);
                const float2 x00 = v0 ? __ldg((const float2 *)(q0 + c0)) : z;
                const float2 x10 = v1 ? __ldg((const float2 *)(q1 + c0)) : z;
                const float2 x01 = v0 ? __ldg((const float2 *)(q0 + c0 + 8)) : z;
                const float2 x11 = v1 ? __ldg((const float2 *)(q1 + c0 + 8)) : z;
                float e[8] = {x00.x, x00.y, x10.x, x10.y, x01.x, x01.y, x11.x, x11.y};
                /* fragment order a0..a3: (h0, c0), (h1, c0), (h0, c0 + 8), (h1, c0 + 8) */
                for (int term = 0; term < 3; term++) {
                    float hv[8];
                    bool rest = false;
#pragma unroll
                    for (int u = 0; u < 8; u++) {
                        hv[u] = term < 2 ? round_bf16(e[u]) : e[u]; /* the last term is bf16 */
                        e[u] = SUB(e[u], hv[u]);                    /* exact */
                        rest |= e[u] != 0.f;
                    }
                    const uint32_t a[4] = {ix_pack(hv[0], hv[1]), ix_pack(hv[2], hv[3]),
                                           ix_pack(hv[4], hv[5]), ix_pack(hv[6], hv[7])};
                    mma_bf16_16816(acc[0], a, bf[0][ks][0], bf[0][ks][1]);
                    mma_bf16_16816(acc[1], a, bf[1][ks][0], bf[1][ks][1]);
                    if (!__any_sync(0xffffffffu, rest)) break;
                }
            }
            const float wa = v0 ? w[i * hi + h0] : 0.f, wb = v1 ? w[i * hi + h1] : 0.f;
#pragma unroll
            for (int nt = 0; nt < 2; nt++) {
                float r[4];
#pragma unroll
                for (int u = 0; u < 4; u++) {
                    float d = round_bf16(acc[nt][u]);
                    if (d < 0.f) d = 0.f;
                    r[u] = round_bf16(MUL(d, u < 2 ? wa : wb));
                }
                const int col = 16 * warp + nt * 8 + 2 * t;
                if (v0) *(float2 *)(S + h0 * IX_LD + col) = make_float2(r[0], r[1]);
                if (v1) *(float2 *)(S + h1 * IX_LD + col) = make_float2(r[2], r[3]);
            }
        }
        __syncthreads(); /* S complete; the other buffer is free for the next row */
        if (threadIdx.x < nk) {
            const int jj = threadIdx.x;
            float r = -INFINITY;
            if (jj < c) {
                float total = 0.f;
                for (int h = 0; h < hi; h++) total = ADD(total, S[h * IX_LD + jj]);
                r = round_bf16(total);
            }
            o[jj] = r;
        }
        buf ^= 1;
    }
}

static int index_tc_off = 0; /* measuring aid (bench, tests): the warp per (row, key) */
extern "C" void cuda_index_tc_set(int on) { index_tc_off = !on; }

extern "C" int cuda_index_tc_fits(int hi, int64_t di, const float *q) {
    return !index_tc_off && hi >= 1 && hi <= IX_MAXH && (di == 32 || di == 64 || di == 128) &&
           (uintptr_t)q % 8 == 0;
}

extern "C" di_status cuda_op_index_scores_kv_fast(const float *q, const float *w, int64_t m,
                                                  int hi, int64_t di,
                                                  const uint8_t *const *keys,
                                                  const int32_t *n_vis, int64_t width, float *out,
                                                  di_err *err) {
    if (m <= 0 || width <= 0) return DI_OK;
    const int64_t gx = (width + IX_KEYS - 1) / IX_KEYS;
    /* Rows a block: IX_ROWS share their key fragments in a prefill (the
     * same sequence's keys); a decode batch's rows each have keys of their
     * own, so there the rows go to more blocks, fewer a block, until the
     * grid covers the GPU twice (a batch of 64 at a short context was one
     * block walking 64 rows: 0.43 ms, docs/gpu-notes.md). A row's scores
     * are the same computation in any block. */
    int rows = IX_ROWS;
    while (rows > 1 && gx * ((m + rows - 1) / rows) < 2 * cuda_sm_count()) rows /= 2;
    const int64_t gy = (m + rows - 1) / rows;
    if (!cuda_index_tc_fits(hi, di, q) || gy > 65535 || gx > 0x7fffffffLL)
        return cuda_op_index_scores_kv(q, w, m, hi, di, keys, n_vis, width, out, err);
    const dim3 grid((unsigned)gx, (unsigned)gy);
    switch (di) {
    case 32: cuda_launch_pdl(k_index_scores_tc<2>, grid, IX_THREADS, 0, 0, q, w, m, hi, width, keys, n_vis, out, rows); break;
    case 64: cuda_launch_pdl(k_index_scores_tc<4>, grid, IX_THREADS, 0, 0, q, w, m, hi, width, keys, n_vis, out, rows); break;
    default: cuda_launch_pdl(k_index_scores_tc<8>, grid, IX_THREADS, 0, 0, q, w, m, hi, width, keys, n_vis, out, rows); break;
    }
    return cuda_check_launch(err, "index_scores_kv (tensor cores)");
}
