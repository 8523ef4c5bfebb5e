/* The MoE path on the device (architecture.md §7): routing into device
 * arrays and the routed experts of a layer over the grouped MXFP4 product
 * (cuda_ops_moe.h). The router's arithmetic is core/route_score.h, the
 * very code the CPU backend runs, so routing is the CPU's bit for bit; the
 * experts' SwiGLU is the backend's swiglu kernel spelled the same way
 * (cuda_ops_elementwise.cu), so the grouped op equals the backend's own
 * per-expert loop bit for bit. Every launch has a size fixed by (m, k, E),
 * never by the routing, and nothing waits for the device. */
#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_ops_moe.h"
#include "core/route_score.h"

/* ------------------------------------------------------------ score */

__global__ void k_route_score(const float *x, int64_t n, float *y) {
    GRID_STRIDE(i, n) y[i] = di_route_score(x[i]);
}

extern "C" di_status cuda_op_route_score(const float *x, int64_t n, float *y, void *stream,
                                         di_err *err) {
    if (n <= 0) return DI_OK;
    k_route_score<<<grid_for(n), 256, 0, (cudaStream_t)stream>>>(x, n, y);
    return cuda_check_launch(err, "route_score");
}

/* ------------------------------------------------------------ routing */

enum { ROUTE_WARPS = 4, ROUTE_KMAX = 64, ROUTE_LOADS = 16 };

/* The warp's pick states merged by xor shuffles: every lane ends with the
 * merge of all 32. */
__device__ __forceinline__ di_route_pick route_pick_warp(di_route_pick p) {
    for (int o = 16; o > 0; o >>= 1) {
        di_route_pick q;
        q.first = __shfl_xor_sync(0xffffffffu, p.first, o);
        q.fnan = __shfl_xor_sync(0xffffffffu, p.fnan, o);
        q.best = __shfl_xor_sync(0xffffffffu, p.best, o);
        q.bv = __shfl_xor_sync(0xffffffffu, p.bv, o);
        p = di_route_pick_merge(p, q);
    }
    return p;
}

/* One warp per row. Shared per warp: scores and biased scores [e], the
 * taken flags [e], the picks [k]. Every lane folds its candidates j ≡ lane
 * (mod 32) in ascending j into a pick state; the states merge across the
 * warp by xor shuffles (the merge is commutative and associative, so every
 * lane ends with the whole row's pick, the CPU scan's). */
__global__ void k_moe_route(const float *logits, const float *bias, int64_t m, int e, int k,
                            int normalize, float route_scale, int32_t *idx, float *w) {
    extern __shared__ float route_smem[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int64_t row = (int64_t)blockIdx.x * ROUTE_WARPS + warp;
    float *sc = route_smem + (size_t)warp * (2 * e + e / 4 + 1 + 2 * ROUTE_KMAX);
    float *bs = sc + e;
    uint8_t *taken = (uint8_t *)(bs + e);
    float *v = (float *)(taken + 4 * (e / 4 + 1));
    int32_t *pick = (int32_t *)(v + ROUTE_KMAX);
    if (row >= m) return; /* whole warps: no block barrier below */
    const float *lg = logits + row * e;
    /* ROUTE_LOADS logits and biases a lane loaded at once, then scored: one
     * load after the other cost a round trip each (19 µs at 384 experts,
     * b1 run 1 in docs/gpu-notes.md) */
    for (int j0 = lane; j0 < e; j0 += 32 * ROUTE_LOADS) {
        float lv[ROUTE_LOADS], bv[ROUTE_LOADS];
#pragma unroll
        for (int u = 0; u < ROUTE_LOADS; u++) {
            const int j = j0 + 32 * u;
            lv[u] = j < e ? lg[j] : 0.f;
            bv[u] = j < e ? bias[j] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < ROUTE_LOADS; u++) {
            const int j = j0 + 32 * u;
            if (j >= e) break;
            float s = di_route_score(lv[u]);
            sc[j] = s;
            bs[j] = __fadd_rn(s, bv[u]);
            taken[j] = 0;
        }
    }
    __syncwarp();
    for (int r = 0; r < k; r++) {
        di_route_pick p = di_route_pick_empty();
        for (int j = lane; j < e; j += 32)
            if (!taken[j]) di_route_pick_add(&p, j, bs[j]);
        p = route_pick_warp(p);
        const int32_t id = di_route_pick_id(p);
        if (lane == 0) {
            pick[r] = id;
            if (id >= 0) taken[id] = 1;
        }
        __syncwarp();
    }
    if (lane == 0) {
        for (int r = 0; r < k; r++) v[r] = pick[r] >= 0 ? sc[pick[r]] : 0.0f;
        di_route_weights(v, k, normalize, route_scale);
        for (int r = 0; r < k; r++) {
            idx[row * k + r] = pick[r];
            w[row * k + r] = v[r];
        }
    }
}

/* The same routing with a block of ROUTE_WIDE threads per row, for few
 * rows: each thread folds its candidates j ≡ tid (mod ROUTE_WIDE), the
 * warps merge by shuffles and thread 0 merges the warps' states; the merge
 * being commutative and associative, the pick is the warp form's (and the
 * CPU scan's). One warp walking 12 candidates a round for 6 rounds, then
 * the weights, took 11.5 µs at b1 (b1 run 3). */
enum { ROUTE_WIDE = 128, ROUTE_WIDE_ROWS = 64 };

__global__ void __launch_bounds__(ROUTE_WIDE)
    k_moe_route_wide(const float *logits, const float *bias, int e, int k, int normalize, float route_scale,
                     int32_t *idx, float *w) {
    pdl_enter();
    __shared__ float sc[1024], bs[1024];
    __shared__ uint8_t taken[1024];
    __shared__ di_route_pick wp[ROUTE_WIDE / 32];
    __shared__ int32_t pick[ROUTE_KMAX];
    __shared__ float v[ROUTE_KMAX];
    const int64_t row = blockIdx.x;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const float *lg = logits + row * e;
    {
        constexpr int U = 1024 / ROUTE_WIDE;
        float lv[U], bv[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = tid + ROUTE_WIDE * u;
            lv[u] = j < e ? lg[j] : 0.f;
            bv[u] = j < e ? bias[j] : 0.f;
        }
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = tid + ROUTE_WIDE * u;
            if (j < e) {
                float sv = di_route_score(lv[u]);
                sc[j] = sv;
                bs[j] = __fadd_rn(sv, bv[u]);
                taken[j] = 0;
            }
        }
    }
    bool nan = false;
    for (int j = tid; j < e; j += ROUTE_WIDE) nan |= bs[j] != bs[j];
    if (!__syncthreads_or(nan)) {
        /* No NaN among the row's biased scores: a pick is then the highest
         * score, ties to the lower id (di_route_pick without its NaN rule),
         * so a round is one key maximum and one id minimum by the warps'
         * reductions, the four warps' winners read by every thread after
         * one barrier: ~150 cycles a round against ~600 for the pick
         * states' five shuffle-and-merge steps and a second barrier. The
         * keys order the scores as floats do (sel-style: -0 as +0); 0 is
         * "no candidate" (every finite score and -inf key above it). */
        __shared__ uint32_t wkey[2][ROUTE_WIDE / 32];
        __shared__ int32_t wid[2][ROUTE_WIDE / 32];
        constexpr int U = 1024 / ROUTE_WIDE;
        uint32_t key[U];
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int j = tid + ROUTE_WIDE * u;
            uint32_t b = j < e ? __float_as_uint(bs[j]) : 0u;
            if (b == 0x80000000u) b = 0u;
            key[u] = j >= e ? 0u : b & 0x80000000u ? ~b : b | 0x80000000u;
        }
        for (int r = 0; r < k; r++) {
            uint32_t mk = 0u;
            int32_t mj = INT32_MAX;
#pragma unroll
            for (int u = 0; u < U; u++) /* ascending j: a tie keeps the lower */
                if (key[u] > mk) mk = key[u], mj = tid + ROUTE_WIDE * u;
            const uint32_t wk = __reduce_max_sync(0xffffffffu, mk);
            const int32_t wj = (int32_t)__reduce_min_sync(0xffffffffu, (uint32_t)(mk == wk ? mj : INT32_MAX));
            if (lane == 0) {
                wkey[r & 1][warp] = wk;
                wid[r & 1][warp] = wj;
            }
            __syncthreads();
            uint32_t gk = wkey[r & 1][0];
            int32_t gj = wid[r & 1][0];
#pragma unroll
            for (int q = 1; q < ROUTE_WIDE / 32; q++) {
                const uint32_t qk = wkey[r & 1][q];
                const int32_t qj = wid[r & 1][q];
                if (qk > gk || (qk == gk && qj < gj)) gk = qk, gj = qj;
            }
            const int32_t id = gk ? gj : -1;
            if (id >= 0 && id % ROUTE_WIDE == tid) key[id / ROUTE_WIDE] = 0u; /* taken */
            if (tid == 0) pick[r] = id;
        }
        __syncthreads();
    } else {
        for (int r = 0; r < k; r++) {
            di_route_pick p = di_route_pick_empty();
            for (int j = tid; j < e; j += ROUTE_WIDE)
                if (!taken[j]) di_route_pick_add(&p, j, bs[j]);
            p = route_pick_warp(p);
            if (lane == 0) wp[warp] = p;
            __syncthreads();
            if (tid == 0) {
                for (int q = 1; q < ROUTE_WIDE / 32; q++) p = di_route_pick_merge(p, wp[q]);
                const int32_t id = di_route_pick_id(p);
                pick[r] = id;
                if (id >= 0) taken[id] = 1;
            }
            __syncthreads();
        }
    }
    if (tid < k) v[tid] = pick[tid] >= 0 ? sc[pick[tid]] : 0.0f;
    __syncthreads();
    if (tid == 0) di_route_weights(v, k, normalize, route_scale);
    __syncthreads();
    if (tid < k) {
        idx[row * k + tid] = pick[tid];
        w[row * k + tid] = v[tid];
    }
}

extern "C" di_status cuda_op_moe_route(const float *logits, const float *bias, int64_t m, int e,
                                       int k, int normalize, float route_scale, int32_t *idx,
                                       float *w, void *stream, di_err *err) {
    if (e <= 0 || e > 1024 || k <= 0 || k > ROUTE_KMAX)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "moe_route: %d experts, top-%d (supported: up to 1024 experts, "
                          "top-%d)", e, k, ROUTE_KMAX);
    if (m <= 0) return DI_OK;
    if (m <= ROUTE_WIDE_ROWS) {
        cuda_launch_pdl(k_moe_route_wide, (unsigned)m, ROUTE_WIDE, 0, (cudaStream_t)stream, logits, bias, e, k, normalize,
                                                                              route_scale, idx, w);
        return cuda_check_launch(err, "moe_route");
    }
    const size_t per_warp = (size_t)(2 * e + e / 4 + 1 + 2 * ROUTE_KMAX) * sizeof(float);
    const int64_t blocks = (m + ROUTE_WARPS - 1) / ROUTE_WARPS;
    if (blocks > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "moe_route: %lld rows", (long long)m);
    k_moe_route<<<(unsigned)blocks, 32 * ROUTE_WARPS, ROUTE_WARPS * per_warp,
                  (cudaStream_t)stream>>>(logits, bias, m, e, k, normalize, route_scale, idx, w);
    return cuda_check_launch(err, "moe_route");
}

/* ------------------------------------------------------------ experts */

/* The scratch of cuda_op_moe_experts, each part 256-byte aligned (the
 * grouped product's wgmma path wants 16-byte aligned operands). */
typedef struct moe_scratch {
    int32_t *ids, *off;   /* [G], [G + 1] groups: expert and first pair */
    int32_t *rows;        /* [P] activation row of pair p */
    float *pw;            /* [P] routing weight of pair p */
    int32_t *slot;        /* [P] pair of routing entry i·k + r, -1: dropped */
    int32_t *iota;        /* [P] p (the down product reads pair p's own row) */
    uint8_t *qa;          /* [m, D] FP8 codes of x */
    float *sa;            /* [m, D/32] their scales */
    float *g, *u;         /* [P, I] gate / up products; g then SwiGLU's output */
    uint8_t *qh;          /* [P, I] FP8 codes of the SwiGLU output */
    float *sh;            /* [P, I/32] */
    float *y;             /* [P, D] down products */
    size_t bytes;
} moe_scratch;

static size_t al256(size_t b) { return (b + 255) & ~(size_t)255; }

static moe_scratch scratch_layout(char *base, int64_t m, int k, int E, int64_t D, int64_t I) {
    moe_scratch s;
    const int64_t P = m * k, G = E < P ? E : P;
    size_t o = 0;
#define TAKE(field, type, count)                          \
    s.field = (type *)(base ? base + o : NULL);           \
    o += al256((size_t)(count) * sizeof(type));
    TAKE(ids, int32_t, G)
    TAKE(off, int32_t, G + 1)
    TAKE(rows, int32_t, P)
    TAKE(pw, float, P)
    TAKE(slot, int32_t, P)
    TAKE(iota, int32_t, P)
    TAKE(qa, uint8_t, m * D)
    TAKE(sa, float, m * (D / 32))
    TAKE(g, float, P * I)
    TAKE(u, float, P * I)
    TAKE(qh, uint8_t, P * I)
    TAKE(sh, float, P * (I / 32))
    TAKE(y, float, P * D)
#undef TAKE
    s.bytes = o;
    return s;
}

extern "C" size_t cuda_moe_experts_scratch(int64_t m, int k, int n_experts, int64_t dim,
                                           int64_t inter) {
    return scratch_layout(NULL, m, k, n_experts, dim, inter).bytes;
}

enum { PLAN_THREADS = 1024, PLAN_WARPS = PLAN_THREADS / 32 };

/* One block (E <= 1024 experts, one thread each for the scans). The pairs
 * are counted per expert by shared-memory atomics (a count has no order),
 * the counts become offsets by a scan over the experts, the non-empty
 * experts take the first group slots in ascending id, and a second pass
 * writes each expert's pairs in ascending routing order (rows ascending, as
 * the model's loop gathers them): the pairs go by in rounds of 1024, one a
 * thread; a warp's pairs of one expert find each other with match.any, the
 * lane's rank among them is the count of lower lanes, and the warps before
 * it in the round add their counts of that expert (kept per warp in shared
 * memory). The first form had thread e scan every pair for expert e, twice:
 * ~3 ms a layer at an 8K-token prefill (49,152 pairs), one block.
 * Groups past the non-empty ones are empty (expert 0, no rows) so the
 * product's grid needs no count from the host. Pairs whose expert is
 * outside [0, E) are left out (slot -1). */
__device__ __forceinline__ void moe_plan_block(const int32_t *idx, const float *w, int64_t P, int k, int E,
                                               int G, int32_t *ids, int32_t *off, int32_t *rows, float *pw,
                                               int32_t *slot, int32_t *iota) {
    __shared__ int32_t cnt[1024], start[1024];
    __shared__ uint8_t wcnt[PLAN_WARPS][1024]; /* a round's pairs of expert e in warp w (<= 32) */
    const int t = threadIdx.x;
    for (int e = t; e < E; e += blockDim.x) {
        cnt[e] = 0;
        for (int q = 0; q < PLAN_WARPS; q++) wcnt[q][e] = 0;
    }
    __syncthreads();
    for (int64_t p = t; p < P; p += blockDim.x) {
        const int32_t e = idx[p];
        if (e >= 0 && e < E) atomicAdd(&cnt[e], 1);
    }
    __syncthreads();
    /* the experts' first pairs and group slots: exclusive scans of the
     * counts and of the non-empty flags over e = t (E <= blockDim); one
     * thread walking the 384 experts took ~7 µs (b1 run 1) */
    {
        __shared__ int32_t wc[PLAN_THREADS / 32], wz[PLAN_THREADS / 32];
        const int lane = t & 31, wid = t >> 5;
        const int32_t c = t < E ? cnt[t] : 0, nz = c != 0;
        int32_t ic = c, iz = nz; /* inclusive scans within the warp */
        for (int o = 1; o < 32; o <<= 1) {
            const int32_t a = __shfl_up_sync(0xffffffffu, ic, o), b = __shfl_up_sync(0xffffffffu, iz, o);
            if (lane >= o) {
                ic += a;
                iz += b;
            }
        }
        if (lane == 31) {
            wc[wid] = ic;
            wz[wid] = iz;
        }
        __syncthreads();
        if (wid == 0) { /* the warps' totals, scanned in place (exclusive) */
            int32_t vc = lane < PLAN_THREADS / 32 ? wc[lane] : 0, vz = lane < PLAN_THREADS / 32 ? wz[lane] : 0;
            int32_t sc = vc, sz = vz;
            for (int o = 1; o < 32; o <<= 1) {
                const int32_t a = __shfl_up_sync(0xffffffffu, sc, o), b = __shfl_up_sync(0xffffffffu, sz, o);
                if (lane >= o) {
                    sc += a;
                    sz += b;
                }
            }
            if (lane < PLAN_THREADS / 32) {
                wc[lane] = sc - vc;
                wz[lane] = sz - vz;
            }
        }
        __syncthreads();
        const int32_t acc = wc[wid] + ic - c, z = wz[wid] + iz - nz;
        if (t < E) {
            start[t] = acc;
            if (c) {
                ids[z] = t;
                off[z] = acc;
            }
        }
        if (t == blockDim.x - 1) { /* the last thread's inclusive sums are the totals */
            const int32_t total = acc + c, used = z + nz;
            for (int32_t q = used; q < G; q++) {
                ids[q] = 0;
                off[q] = total;
            }
            off[G] = total;
        }
    }
    for (int64_t p = t; p < P; p += blockDim.x) {
        slot[p] = -1;
        iota[p] = (int32_t)p;
    }
    __syncthreads();
    for (int e = t; e < E; e += blockDim.x) cnt[e] = start[e];
    const int lane = t & 31, wid = t >> 5;
    for (int64_t c0 = 0; c0 < P; c0 += PLAN_THREADS) {
        const int64_t p = c0 + t;
        int32_t e = p < P ? idx[p] : -1;
        if (e >= E) e = -1;
        const uint32_t same = __match_any_sync(0xffffffffu, e);
        const int rank = __popc(same & ((1u << lane) - 1u));
        if (e >= 0 && rank == 0) wcnt[wid][e] = (uint8_t)__popc(same);
        __syncthreads(); /* the round's counts; cnt[] as the last round left it */
        if (e >= 0) {
            int32_t q = cnt[e] + rank;
            for (int v = 0; v < wid; v++) q += wcnt[v][e];
            rows[q] = (int32_t)(p / k);
            pw[q] = w[p];
            slot[p] = q;
        }
        __syncthreads(); /* every read of cnt and wcnt done */
        for (int x = t; x < E; x += blockDim.x) {
            int32_t sum = 0;
            for (int v = 0; v < PLAN_WARPS; v++) {
                sum += wcnt[v][x];
                wcnt[v][x] = 0;
            }
            cnt[x] += sum;
        }
        __syncthreads();
    }
}

__global__ void __launch_bounds__(PLAN_THREADS)
    k_moe_plan(const int32_t *idx, const float *w, int64_t P, int k, int E, int G, int32_t *ids, int32_t *off,
               int32_t *rows, float *pw, int32_t *slot, int32_t *iota) {
    pdl_enter();
    moe_plan_block(idx, w, P, k, E, G, ids, off, rows, pw, slot, iota);
}

/* The plan (block 0) and the FP8 quantization of x (the blocks after it,
 * act_quant_fp8_vec's threads: four per 32-block of x) in one launch: the
 * two read different inputs and write different scratch, and each was a
 * launch of its own ahead of the w1 product (~4.6 + 2.1 µs at b1). */
__global__ void __launch_bounds__(PLAN_THREADS)
    k_moe_plan_quant(const int32_t *idx, const float *w, int64_t P, int k, int E, int G, int32_t *ids,
                     int32_t *off, int32_t *rows, float *pw, int32_t *slot, int32_t *iota, const float *x,
                     int64_t nqb, uint8_t *qa, float *sa) {
    pdl_enter();
    if (blockIdx.x == 0) {
        moe_plan_block(idx, w, P, k, E, G, ids, off, rows, pw, slot, iota);
        return;
    }
    const int64_t tid = (int64_t)(blockIdx.x - 1) * blockDim.x + threadIdx.x;
    const bool live = (tid >> 2) < nqb;
    float v[8];
    if (live) aq_load8(x + tid * 8, v);
    else
#pragma unroll
        for (int i = 0; i < 8; i++) v[i] = 0.0f;
    aq_store8(v, live, tid, qa, sa);
}

__global__ void k_moe_swiglu(float *g, const float *u, const float *pw, const int32_t *total,
                             int64_t I, int in_bf16, float limit) {
    pdl_enter();
    const int64_t n = (int64_t)*total * I;
    GRID_STRIDE(t, n) g[t] = moe_swiglu_val(g[t], u[t], pw[t / I], in_bf16, limit);
}

/* k_moe_swiglu and the FP8 quantization of its output [P, I] that the
 * down product reads, in one launch: act_quant_fp8_vec's threads (four per
 * 32-block), each forming its 8 values as k_moe_swiglu would store them
 * (pairs past the planned count: g as it stands, which act_quant would
 * have read) and quantizing them; g itself is not written, nothing reads
 * it after the quantization. */
__global__ void k_moe_swiglu_quant(const float *g, const float *u, const float *pw, const int32_t *total,
                                   int64_t I, int in_bf16, float limit, int64_t nqb, uint8_t *qh, float *sh) {
    pdl_enter();
    const int64_t tid = (int64_t)blockIdx.x * blockDim.x + threadIdx.x, t0 = tid * 8;
    const bool live = (tid >> 2) < nqb;
    /* every load issued before the first use (8 values of one pair: I % 8 == 0) */
    float v[8], uv[8], pwv = 0.0f;
    if (live) {
        aq_load8(g + t0, v);
        aq_load8(u + t0, uv);
        pwv = pw[t0 / I];
    }
    const int64_t n = (int64_t)*total * I;
#pragma unroll
    for (int i = 0; i < 8; i++) {
        if (!live) v[i] = 0.0f;
        else if (t0 + i < n) v[i] = moe_swiglu_val(v[i], uv[i], pwv, in_bf16, limit);
    }
    aq_store8(v, live, tid, qh, sh);
}

/* Whether moe_experts fuses (the default) or launches each step alone. */
static int moe_fused = 1;

extern "C" void cuda_moe_set_fused(int on) { moe_fused = on != 0; }

static long moe_swiglu_w2; /* calls whose w2 formed its own input (tests) */
extern "C" long cuda_moe_swiglu_w2_calls(void) { return __atomic_load_n(&moe_swiglu_w2, __ATOMIC_RELAXED); }

enum { COMBINE_THREADS = 256, COMBINE_BATCH = 8 };

/* Blocks (row, COMBINE_THREADS columns): the row's pairs ordered by expert
 * id (insertion sort, ties in routing order, as the loop visits them), then
 * every column summed from +0 in that order — the loop's scatter-adds, one
 * rounding each. The routing entries are loaded by k threads at once and
 * each thread owns one column of the block: one block per row walking 20
 * columns a thread after 2k serial loads took 20 µs at b1 (b1 run 1). */
__global__ void k_moe_combine(const float *y, const int32_t *idx, const int32_t *slot, int k,
                              int64_t D, int out_bf16, float *out) {
    pdl_enter();
    __shared__ int32_t se[ROUTE_KMAX], sp[ROUTE_KMAX], rq[ROUTE_KMAX], re[ROUTE_KMAX];
    __shared__ int ns;
    const int64_t i = blockIdx.x;
    if (threadIdx.x < k) {
        rq[threadIdx.x] = slot[i * k + threadIdx.x];
        re[threadIdx.x] = idx[i * k + threadIdx.x];
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        int n = 0;
        for (int r = 0; r < k; r++) {
            const int32_t q = rq[r];
            if (q < 0) continue;
            const int32_t e = re[r];
            int j = n++;
            while (j > 0 && se[j - 1] > e) {
                se[j] = se[j - 1];
                sp[j] = sp[j - 1];
                j--;
            }
            se[j] = e;
            sp[j] = q;
        }
        ns = n;
    }
    __syncthreads();
    for (int64_t c = (int64_t)blockIdx.y * blockDim.x + threadIdx.x; c < D; c += (int64_t)gridDim.y * blockDim.x) {
        /* COMBINE_BATCH loads in flight, then their adds in order: the
         * loop's four-way unrolling left k = 6 two or three dependent
         * round trips to L2 */
        float acc = 0.0f;
        for (int j0 = 0; j0 < ns; j0 += COMBINE_BATCH) {
            float v[COMBINE_BATCH];
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++) v[u] = j0 + u < ns ? y[(int64_t)sp[j0 + u] * D + c] : 0.0f;
#pragma unroll
            for (int u = 0; u < COMBINE_BATCH; u++)
                if (j0 + u < ns) acc = ADD(acc, out_bf16 ? round_bf16(v[u]) : v[u]);
        }
        out[i * D + c] = acc;
    }
}

extern "C" di_status cuda_op_moe_experts(const cuda_moe_weights *W, const float *x, int64_t m,
                                         const int32_t *idx, const float *w, int k, int out_bf16,
                                         float limit, void *scratch, size_t scratch_bytes,
                                         float *out, void *stream, di_err *err) {
    const int E = W->n_experts;
    const int64_t D = W->dim, I = W->inter, P = m * k, G = E < P ? E : P;
    if (m <= 0) return DI_OK;
    if (E <= 0 || E > 1024 || k <= 0 || k > ROUTE_KMAX || D <= 0 || I <= 0 || D % 32 ||
        I % 32)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "moe_experts: %d experts, top-%d, dim %lld, inter %lld (supported: "
                          "up to 1024 experts, top-%d, dims multiples of 32)",
                          E, k, (long long)D, (long long)I, ROUTE_KMAX);
    if (P > 0x7fffffffLL || m > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "moe_experts: %lld routed rows", (long long)P);
    moe_scratch s = scratch_layout((char *)scratch, m, k, E, D, I);
    if (!scratch || scratch_bytes < s.bytes)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "moe_experts: scratch of %zu bytes, %zu needed", scratch_bytes, s.bytes);
    cudaStream_t st = (cudaStream_t)stream;
    const di_dtype F32 = DI_DTYPE_F32;
    di_status rc;
    /* the fused forms need act_quant's vector layout: 16-byte aligned x
     * (the scratch parts are 256-byte aligned; D and I are multiples of 32) */
    const int fuse = moe_fused && (uintptr_t)x % 16 == 0;
    if (fuse) {
        const int64_t nqb = m * (D / 32), nq = (nqb * 4 + PLAN_THREADS - 1) / PLAN_THREADS;
        if (nq + 1 > 0x7fffffffLL) return di_err_set(err, DI_ERR_LIMIT, "moe_experts: [%lld, %lld] x", (long long)m, (long long)D);
        cuda_launch_pdl(k_moe_plan_quant, (unsigned)(nq + 1), PLAN_THREADS, 0, st, idx, w, P, k, E, (int)G, s.ids,
                        s.off, s.rows, s.pw, s.slot, s.iota, x, nqb, s.qa, s.sa);
        if ((rc = cuda_check_launch(err, "moe_experts: plan and quantization"))) return rc;
    } else {
        cuda_launch_pdl(k_moe_plan, 1, PLAN_THREADS, 0, st, idx, w, P, k, E, (int)G, s.ids, s.off, s.rows, s.pw,
                        s.slot, s.iota);
        if ((rc = cuda_check_launch(err, "moe_experts: plan"))) return rc;
        if ((rc = di_cuda_act_quant_fp8(x, F32, m, D, s.qa, s.sa, stream, err))) return rc;
    }
    /* w1 and w3 read the same activations and routing: fused, one launch
     * where the decode form takes both (the same bits as the two launches
     * of the unfused form) */
    if (fuse) {
        if ((rc = di_cuda_gemm_mxfp4_grouped_pair(s.qa, s.sa, D, W->w1, W->s1, W->w3, W->s3, I, s.ids, s.off,
                                                  (int32_t)G, s.rows, (int32_t)m, s.g, s.u, F32, stream, err)))
            return di_err_prefix(err, "moe_experts w1 / w3: ");
    } else {
        if ((rc = di_cuda_gemm_mxfp4_grouped(s.qa, s.sa, D, W->w1, W->s1, I, s.ids, s.off, (int32_t)G, s.rows,
                                             (int32_t)m, s.g, F32, stream, err)))
            return di_err_prefix(err, "moe_experts w1: ");
        if ((rc = di_cuda_gemm_mxfp4_grouped(s.qa, s.sa, D, W->w3, W->s3, I, s.ids, s.off, (int32_t)G, s.rows,
                                             (int32_t)m, s.u, F32, stream, err)))
            return di_err_prefix(err, "moe_experts w3: ");
    }
    /* the fused form's down product forms its own input where its decode
     * form runs behind a pair of one wave (no quantization launch, the
     * same bits) */
    static int sw2_env = -1; /* DI_CUDA_MOE_SW2=0: the quantization's own launch (measuring aid) */
    int w2_done = 0;
    if (fuse && cuda_env_switch("DI_CUDA_MOE_SW2", &sw2_env) &&
        (rc = cuda_launch_matvec_mxfp4_grouped_swiglu(s.g, s.u, s.pw, out_bf16, limit, D, I, W->w2, W->s2, D, s.ids,
                                                      s.off, (int32_t)G, s.iota, (int32_t)m, s.y, 0, st, &w2_done,
                                                      err)))
        return di_err_prefix(err, "moe_experts w2 on SwiGLU: ");
    if (w2_done) __atomic_fetch_add(&moe_swiglu_w2, 1, __ATOMIC_RELAXED);
    if (fuse && !w2_done) {
        const int64_t nqb = P * (I / 32), nb = (nqb * 4 + 255) / 256;
        if (nb > 0x7fffffffLL) return di_err_set(err, DI_ERR_LIMIT, "moe_experts: %lld routed rows", (long long)P);
        cuda_launch_pdl(k_moe_swiglu_quant, (unsigned)nb, 256, 0, st, s.g, s.u, s.pw, s.off + G, I, out_bf16, limit,
                        nqb, s.qh, s.sh);
        if ((rc = cuda_check_launch(err, "moe_experts: swiglu and quantization"))) return rc;
    } else if (!fuse) {
        cuda_launch_pdl(k_moe_swiglu, grid_for(P * I), 256, 0, st, s.g, s.u, s.pw, s.off + G, I, out_bf16, limit);
        if ((rc = cuda_check_launch(err, "moe_experts: swiglu"))) return rc;
        if ((rc = di_cuda_act_quant_fp8(s.g, F32, P, I, s.qh, s.sh, stream, err))) return rc;
    }
    if (!w2_done && (rc = di_cuda_gemm_mxfp4_grouped(s.qh, s.sh, I, W->w2, W->s2, D, s.ids, s.off, (int32_t)G,
                                                     s.iota, (int32_t)m, s.y, F32, stream, err)))
        return di_err_prefix(err, "moe_experts w2: ");
    const int64_t cb = (D + COMBINE_THREADS - 1) / COMBINE_THREADS;
    cuda_launch_pdl(k_moe_combine, dim3((unsigned)m, (unsigned)(cb < 65535 ? cb : 65535)), COMBINE_THREADS, 0, st, s.y, idx, s.slot, k, D, out_bf16, out);
    return cuda_check_launch(err, "moe_experts: combine");
}
