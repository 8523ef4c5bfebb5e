/* CUDA kernels of the attention ops (architecture.md §5.4–§5.5): sparse
 * attention with sink over per-query row tables, the indexer's scores with
 * the reference's bf16 rounding points (both over fp32 rows or over the
 * packed cache rows of backend/kvstore.h, decoded on the fly), and the
 * candidate-pool restriction.
 * The attention follows the CPU's online softmax block by block (64 slots,
 * probabilities rounded to bf16 before P·V, fp32 denominator) and its P·V
 * sums in the same order; only the q·k dot products are reduced in another
 * order and expf is CUDA's, so results agree to about one bf16 ulp. Over
 * packed rows the tensor-core form of cuda_attn_tc.cu takes every head
 * size it can (multiples of 32 up to 512). */
#include <limits.h>

#include "backend/cuda/cuda_attn_tc.h"
#include "backend/cuda/cuda_ops_common.cuh"

enum { ATTN_THREADS = 256, ATTN_BLOCK = 64 };

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Element k of a cache row of d values: fp32 (PACKED = false) or one of the
 * packed forms of backend/kvstore.h (window slots FP8 + E8M0 per 32, the
 * others FP4 + E4M3 per 16). A packed value is code · scale, exact in fp32,
 * so it equals what the CPU's di_kvq_unpack writes. */
template <bool PACKED>
__device__ __forceinline__ float kv_at(const void *row, int64_t d, int64_t k, bool win) {
    if (!PACKED) return ((const float *)row)[k];
    const uint8_t *r = (const uint8_t *)row;
    if (win) return MUL(e4m3_val(r[k]), e8m0_to_f32(r[d + k / 32]));
    uint32_t b = r[k / 2];
    return MUL(e2m1_val(k & 1 ? b >> 4 : b & 15u), e4m3_val(r[d / 2 + k / 16]));
}

/* One block per (query row, head); dynamic shared memory holds q and the
 * accumulator ([d] each). */
template <bool PACKED>
__global__ void __launch_bounds__(ATTN_THREADS)
k_sparse_attn(const float *q, int h, int64_t d, const void *const *rows, int n_slots, int n_win,
              const float *sink, float scale, float *out) {
    extern __shared__ float sm[];
    float *qs = sm, *acc = sm + d;
    __shared__ float sc[ATTN_BLOCK], p[ATTN_BLOCK];
    __shared__ float psum_s;
    int64_t i = blockIdx.x / h;
    int hh = (int)(blockIdx.x % h);
    const float *qi = q + (i * h + hh) * d;
    const void *const *ri = rows + i * n_slots;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        qs[k] = qi[k];
        acc[k] = 0.f;
    }
    __syncthreads();
    int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, nw = blockDim.x >> 5;
    float mx = -1e30f, sum = 0.f;
    for (int b0 = 0; b0 < n_slots; b0 += ATTN_BLOCK) {
        int nb = n_slots - b0 < ATTN_BLOCK ? n_slots - b0 : ATTN_BLOCK;
        for (int j = warp; j < nb; j += nw) {
            const void *r = ri[b0 + j];
            bool win = b0 + j < n_win;
            if (!r) {
                if (lane == 0) sc[j] = -INFINITY;
                continue;
            }
            float dot = 0.f;
            for (int64_t k = lane; k < d; k += 32) dot = ADD(dot, MUL(qs[k], kv_at<PACKED>(r, d, k, win)));
            dot = warp_sum(dot);
            if (lane == 0) sc[j] = MUL(dot, scale);
        }
        __syncthreads();
        float bmax = -INFINITY;
        for (int j = 0; j < nb; j++)
            if (ri[b0 + j]) bmax = fmaxf(bmax, sc[j]);
        float nmx = fmaxf(mx, bmax);
        float rescale = expf(SUB(mx, nmx));
        if (threadIdx.x < nb) p[threadIdx.x] = ri[b0 + threadIdx.x] ? expf(SUB(sc[threadIdx.x], nmx)) : 0.f;
        __syncthreads();
        if (threadIdx.x == 0) {
            float ps = 0.f;
            for (int j = 0; j < nb; j++)
                if (ri[b0 + j]) ps = ADD(ps, p[j]);
            psum_s = ps;
        }
        for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
            float a = MUL(acc[k], rescale);
            for (int j = 0; j < nb; j++) {
                const void *r = ri[b0 + j];
                if (r) a = ADD(a, MUL(round_bf16(p[j]), kv_at<PACKED>(r, d, k, b0 + j < n_win)));
            }
            acc[k] = a;
        }
        __syncthreads();
        sum = ADD(MUL(sum, rescale), psum_s);
        mx = nmx;
        __syncthreads(); /* sc, p and psum_s are rewritten by the next block */
    }
    sum = ADD(sum, expf(SUB(sink[hh], mx)));
    float *o = out + (i * h + hh) * d;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) o[k] = round_bf16(acc[k] / sum);
}

extern "C" di_status cuda_op_sparse_attn(const float *q, int64_t m, int h, int64_t d,
                                         const float *const *rows, int n_slots, const float *sink,
                                         float scale, float *out, di_err *err) {
    if (m * h <= 0) return DI_OK;
    size_t smem = (size_t)(2 * d) * sizeof(float);
    if (smem > 48 * 1024)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "sparse_attn: head_dim %lld (at most 6144)",
                          (long long)d);
    k_sparse_attn<false><<<(unsigned)(m * h), ATTN_THREADS, smem>>>(
        q, h, d, (const void *const *)rows, n_slots, n_slots, sink, scale, out);
    return cuda_check_launch(err, "sparse_attn");
}

extern "C" di_status cuda_op_sparse_attn_kv_rowwise(const float *q, int64_t m, int h, int64_t d,
                                                    const uint8_t *const *rows, int n_slots,
                                                    int n_win, const float *sink, float scale,
                                                    float *out, di_err *err) {
    if (m * h <= 0) return DI_OK;
    size_t smem = (size_t)(2 * d) * sizeof(float);
    if (smem > 48 * 1024)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "sparse_attn_kv: head_dim %lld (at most 6144)",
                          (long long)d);
    k_sparse_attn<true><<<(unsigned)(m * h), ATTN_THREADS, smem>>>(
        q, h, d, (const void *const *)rows, n_slots, n_win, sink, scale, out);
    return cuda_check_launch(err, "sparse_attn_kv");
}

/* Blocks of the unsplit tensor-core form (rows × head tiles) up to which
 * its split-slot form runs instead: one block walks a row's slot blocks in
 * series (~13 µs each, latency-bound), so with few rows most SMs idle and
 * S blocks per row finish ~S times sooner; at S × tiles past ~one block
 * per SM the split only adds its combine. A constant, not the device's SM
 * count, so a shape's dispatch (and bits) is the same on every GPU. */
enum { ATTN_SPLIT_MAX_BLOCKS = 128 };
/* Up to this many split blocks (rows × head tiles × S) a row may spread
 * over 16 blocks instead of 8 (a non-portable cluster): at the model's 640
 * slots one 64-slot block each instead of two, so a decode step of up to 6
 * rows waits for one block's latency, not two; their blocks of 16 heads
 * still fit the GPU in one wave. Measured at one row, 640 full slots: 23.4
 * -> 16.1 µs a call (docs/gpu-notes.md, attention runs 1-2). A constant, as
 * above. DI_CUDA_ATTN_WIDE=0 keeps 8 (a measuring aid). */
enum { ATTN_WIDE_SPLIT_MAX_BLOCKS = 64 };

/* The tensor-core form (cuda_attn_tc.cu) wherever it takes the head size:
 * faster at every m, one query row included, split over slots when few
 * rows leave the SMs idle; the block per (row, head) otherwise.
 * Batch-invariant mode: never split (the split's combine adds a row's
 * partial sums in another order, and whether it runs follows from m).
 * Split at every m instead measured (docs/gpu-notes.md, invariant run 3)
 * 24 against 49 µs a layer at batch 1 but 67 against 29 ms for a prefill
 * of 8K tokens and 87 against 62 µs at batch 64: the unsplit form is the
 * better one for large batches. */
extern "C" di_status cuda_op_sparse_attn_kv(const float *q, int64_t m, int h, int64_t d,
                                            const uint8_t *const *rows, int n_slots, int n_win,
                                            const float *sink, float scale, float *out,
                                            di_err *err) {
    if (cuda_attn_tc_fits(d)) {
        static int wide_on = -1;
        cuda_env_switch("DI_CUDA_ATTN_WIDE", &wide_on);
        int64_t tiles = m * ((h + 63) / 64);
        int s = cuda_attn_tc_splits(n_slots, 16);
        if (!wide_on || tiles * s > ATTN_WIDE_SPLIT_MAX_BLOCKS) s = cuda_attn_tc_splits(n_slots, 8);
        if (s > 1 && tiles * s <= ATTN_SPLIT_MAX_BLOCKS && !cuda_batch_invariant())
            return cuda_op_sparse_attn_kv_tc_split(q, m, h, d, rows, n_slots, n_win, sink, scale, s, out, err);
        return cuda_op_sparse_attn_kv_tc(q, m, h, d, rows, n_slots, n_win, sink, scale, out, err);
    }
    return cuda_op_sparse_attn_kv_rowwise(q, m, h, d, rows, n_slots, n_win, sink, scale, out, err);
}

/* tab [m, n_win + n_sel] = the packed row pointers of backend.h's
 * di_attn_rows (window ring slot, this call's window row, or a selected
 * compressed entry; NULL = empty), built on the device so the selection and
 * the step's tables never pass through the host. */
__global__ void k_attn_rows(int64_t m, int n_win, const int32_t *win, const uint8_t *const *ring,
                            const uint8_t *chunk, size_t win_bytes, int n_sel, const int32_t *sel,
                            const uint8_t *const *cache, size_t cache_bytes, const uint8_t **tab) {
    pdl_enter();
    int64_t n_slots = (int64_t)n_win + n_sel;
    GRID_STRIDE(t, m * n_slots) {
        int64_t i = t / n_slots, j = t % n_slots;
        const uint8_t *r = NULL;
        if (j < n_win) {
            int32_t c = win[i * n_win + j];
            if (c >= 0) r = ring[i] + (size_t)c * win_bytes;
            else if (c <= -2) r = chunk + (size_t)(-2 - (int64_t)c) * win_bytes;
        } else {
            int32_t e = sel[i * n_sel + (j - n_win)];
            if (e >= 0) r = cache[i] + (size_t)e * cache_bytes;
        }
        tab[t] = r;
    }
}

extern "C" di_status cuda_op_sparse_attn_rows(const float *q, int64_t m, int h, int64_t d,
                                              int n_win, const int32_t *win,
                                              const uint8_t *const *ring, const uint8_t *chunk,
                                              size_t win_bytes, int n_sel, const int32_t *sel,
                                              const uint8_t *const *cache, size_t cache_bytes,
                                              const uint8_t **tab, const float *sink, float scale,
                                              float *out, di_err *err) {
    int64_t n_slots = (int64_t)n_win + n_sel;
    if (m * h <= 0) return DI_OK;
    if (m * n_slots > 0) {
        cuda_launch_pdl(k_attn_rows, grid_for(m * n_slots), 256, 0, 0, m, n_win, win, ring, chunk, win_bytes, n_sel,
                                                    sel, cache, cache_bytes, tab);
        di_status st = cuda_check_launch(err, "attention row tables");
        if (st) return st;
    }
    return cuda_op_sparse_attn_kv(q, m, h, d, tab, (int)n_slots, n_win, sink, scale, out, err);
}

/* One warp per (row, key): per indexer head a warp-reduced dot product,
 * rounded and weighted as the CPU does, summed over heads in order. */
template <bool PACKED>
__device__ __forceinline__ float key_at(const void *key, int64_t di, int64_t t) {
    if (!PACKED) return ((const float *)key)[t];
    const uint8_t *r = (const uint8_t *)key; /* FP4 + E8M0 per 32 */
    uint32_t b = r[t / 2];
    return MUL(e2m1_val(t & 1 ? b >> 4 : b & 15u), e8m0_to_f32(r[di / 2 + t / 32]));
}

template <bool PACKED>
__global__ void k_index_scores(const float *q, const float *w, int64_t m, int hi, int64_t di,
                               const void *const *keys, const int32_t *n_vis, int64_t width,
                               float *out) {
    /* bytes of one key: fp32 or a packed FP4 row */
    int64_t kb = PACKED ? di / 2 + di / 32 : di * 4;
    int lane = threadIdx.x & 31;
    int64_t wid = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) >> 5;
    int64_t nwarps = ((int64_t)gridDim.x * blockDim.x) >> 5;
    for (int64_t t = wid; t < m * width; t += nwarps) {
        int64_t i = t / width, j = t % width;
        if (j >= n_vis[i]) {
            if (lane == 0) out[t] = -INFINITY;
            continue;
        }
        const void *k = (const uint8_t *)keys[i] + j * kb;
        float total = 0.f;
        for (int h = 0; h < hi; h++) {
            const float *qh = q + (i * hi + h) * di;
            float dot = 0.f;
            for (int64_t s = lane; s < di; s += 32) dot = ADD(dot, MUL(qh[s], key_at<PACKED>(k, di, s)));
            dot = round_bf16(warp_sum(dot));
            if (dot < 0.f) dot = 0.f;
            total = ADD(total, round_bf16(MUL(dot, w[i * hi + h])));
        }
        if (lane == 0) out[t] = round_bf16(total);
    }
}

extern "C" di_status cuda_op_index_scores(const float *q, const float *w, int64_t m, int hi,
                                          int64_t di, const float *const *keys,
                                          const int32_t *n_vis, int64_t width, float *out,
                                          di_err *err) {
    if (m * width <= 0) return DI_OK;
    k_index_scores<false><<<grid_for(m * width * 32), 256>>>(q, w, m, hi, di,
                                                            (const void *const *)keys, n_vis,
                                                            width, out);
    return cuda_check_launch(err, "index_scores");
}

extern "C" di_status cuda_op_index_scores_kv(const float *q, const float *w, int64_t m, int hi,
                                             int64_t di, const uint8_t *const *keys,
                                             const int32_t *n_vis, int64_t width, float *out,
                                             di_err *err) {
    if (m * width <= 0) return DI_OK;
    k_index_scores<true><<<grid_for(m * width * 32), 256>>>(q, w, m, hi, di,
                                                           (const void *const *)keys, n_vis,
                                                           width, out);
    return cuda_check_launch(err, "index_scores_kv");
}

/* The CPU's walk along the ascending kept blocks, done per position. */
__global__ void k_restrict_blocks(float *scores, const int32_t *blocks, int64_t m, int64_t width,
                                  int topk_blocks, int bs) {
    pdl_enter();
    GRID_STRIDE(t, m * width) {
        int64_t i = t / width, blk = (t % width) / bs;
        const int32_t *b = blocks + i * topk_blocks;
        int c = 0;
        while (c < topk_blocks && b[c] >= 0 && b[c] < blk) c++;
        if (!(c < topk_blocks && b[c] == blk)) scores[t] = -INFINITY;
    }
}

/* The same walk for one row a block, found by a binary search instead of
 * walked: the walk for block blk stops at the first c where b[c] < 0 or
 * b[c] >= blk, i.e. min(neg, the first c whose running maximum of b[0..c]
 * reaches blk) with neg the first negative entry, and the running maximum
 * does not decrease, so whatever the list holds (ascending, as
 * candidate_blocks writes it, or not) the stop is the walk's. The element
 * form walked up to topk_blocks entries for every score (V4.1: 2,048
 * blocks of 8 at the prefill's 8,192 positions, 3.8 ms a call); here each
 * of the row's ceil(width / bs) blocks takes ~11 shared loads. The row's
 * list and its running maximum live in shared memory (topk_blocks <=
 * RB_MAX_LIST). */
enum { RB_THREADS = 256, RB_MAX_LIST = 4096 };

__global__ void __launch_bounds__(RB_THREADS)
    k_restrict_blocks_row(float *scores, const int32_t *blocks, int64_t width, int topk_blocks, int bs) {
    pdl_enter();
    __shared__ int32_t lst[RB_MAX_LIST], mx[RB_MAX_LIST];
    __shared__ int32_t wmax[RB_THREADS / 32];
    __shared__ int neg;
    const int64_t i = blockIdx.x;
    const int32_t *b = blocks + i * topk_blocks;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    if (tid == 0) neg = topk_blocks;
    /* thread tid: entries [tid·per, tid·per + per) */
    const int per = (topk_blocks + RB_THREADS - 1) / RB_THREADS, c0 = tid * per;
    int run = INT_MIN, first_neg = topk_blocks;
    for (int c = c0; c < c0 + per && c < topk_blocks; c++) {
        const int32_t v = b[c];
        lst[c] = v;
        run = v > run ? v : run;
        mx[c] = run; /* this thread's part: the block's prefix added below */
        if (v < 0 && c < first_neg) first_neg = c;
    }
    __syncthreads();
    if (first_neg < topk_blocks) atomicMin(&neg, first_neg);
    /* exclusive prefix maximum of the threads' maxima */
    int incl = run;
    for (int o = 1; o < 32; o <<= 1) {
        const int y = __shfl_up_sync(0xffffffffu, incl, o);
        if (lane >= o) incl = y > incl ? y : incl;
    }
    if (lane == 31) wmax[warp] = incl;
    __syncthreads();
    int pre = __shfl_up_sync(0xffffffffu, incl, 1);
    if (lane == 0) pre = INT_MIN;
    for (int w = 0; w < warp; w++) pre = wmax[w] > pre ? wmax[w] : pre;
    for (int c = c0; c < c0 + per && c < topk_blocks; c++) mx[c] = mx[c] > pre ? mx[c] : pre;
    __syncthreads();
    const int n = neg;
    const int64_t nblk = (width + bs - 1) / bs;
    float *row = scores + i * width;
    for (int64_t blk = tid; blk < nblk; blk += RB_THREADS) {
        int lo = 0, hi = n; /* the first c < n with mx[c] >= blk, else n */
        while (lo < hi) {
            const int mid = (lo + hi) >> 1;
            if ((int64_t)mx[mid] >= blk) hi = mid;
            else lo = mid + 1;
        }
        if (lo < topk_blocks && (int64_t)lst[lo] == blk) continue; /* kept */
        const int64_t e1 = (blk + 1) * bs < width ? (blk + 1) * bs : width;
        for (int64_t t = blk * bs; t < e1; t++) row[t] = -INFINITY;
    }
}

extern "C" di_status cuda_op_restrict_blocks(float *scores, const int32_t *blocks, int64_t m,
                                             int64_t width, int topk_blocks, int bs, di_err *err) {
    if (m * width <= 0) return DI_OK;
    if (topk_blocks >= 1 && topk_blocks <= RB_MAX_LIST && bs >= 1 && m <= 0x7fffffffLL)
        cuda_launch_pdl(k_restrict_blocks_row, (unsigned)m, RB_THREADS, 0, 0, scores, blocks, width, topk_blocks, bs);
    else
        cuda_launch_pdl(k_restrict_blocks, grid_for(m * width), 256, 0, 0, scores, blocks, m, width, topk_blocks, bs);
    return cuda_check_launch(err, "restrict_blocks");
}
