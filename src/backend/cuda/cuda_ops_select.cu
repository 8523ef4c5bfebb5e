/* Selections on the device (architecture.md §5.4): the indexer's top-k and
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
#include "backend/cuda/cuda_ops_common.cuh"

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

/* sc [m, width]; n_vis [m] (device) or NULL = width; picks up to ksel per
 * row into idx [m, kout], -1 padding. */
__global__ void k_topk(const float *sc, const int32_t *n_vis, int64_t width, int ksel, int kout,
                       int32_t *idx) {
    __shared__ unsigned hist[256];
    __shared__ int warp_tot[SEL_THREADS / 32];
    __shared__ uint32_t s_prefix;
    __shared__ int s_need;
    int64_t i = blockIdx.x;
    const float *s = sc + i * width;
    int64_t n = n_vis ? n_vis[i] : width;
    n = n < 0 ? 0 : n > width ? width : n;
    int32_t *o = idx + i * (int64_t)kout;
    int cnt = 0, tot = 0;
    for (int64_t c0 = 0; c0 < n; c0 += blockDim.x) {
        int64_t j = c0 + threadIdx.x;
        block_scan(j < n && sel_valid(s[j]), &tot, warp_tot);
        cnt += tot;
    }
    int all = cnt <= ksel;
    uint32_t T = 0;
    int need = 0;
    if (!all) {
        uint32_t prefix = 0, mask = 0;
        if (threadIdx.x == 0) s_need = ksel;
        for (int shift = 24; shift >= 0; shift -= 8) {
            for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
            __syncthreads();
            for (int64_t j = threadIdx.x; j < n; j += blockDim.x) {
                float v = s[j];
                if (!sel_valid(v)) continue;
                uint32_t key = sel_key(v);
                if ((key & mask) == prefix) atomicAdd(&hist[(key >> shift) & 255u], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) { /* the digit of the need-th largest key */
                int rem = s_need, acc = 0, d = 255;
                for (; d > 0; d--) {
                    if (acc + (int)hist[d] >= rem) break;
                    acc += (int)hist[d];
                }
                s_need = rem - acc;
                s_prefix = prefix | ((uint32_t)d << shift);
            }
            __syncthreads();
            prefix = s_prefix;
            mask |= 255u << shift;
        }
        T = prefix;
        need = s_need;
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
    k_topk<<<(unsigned)m, SEL_THREADS>>>(scores, n_vis, width, ksel < 0 ? 0 : ksel, kout, idx);
    return cuda_check_launch(err, "topk");
}

extern "C" di_status cuda_op_block_max(const float *scores, const int32_t *n_vis, int64_t m,
                                       int64_t width, int bs, float *bsc, di_err *err) {
    int64_t nb = (width + bs - 1) / bs;
    if (m * nb <= 0) return DI_OK;
    k_block_max<<<grid_for(m * nb), 256>>>(scores, n_vis, m, width, bs, nb, bsc);
    return cuda_check_launch(err, "candidate block scores");
}
