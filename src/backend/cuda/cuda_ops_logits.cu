/* Greedy summaries of logits rows on the device (backend.h logits_greedy,
 * core/row_exp.h di_row_greedy_of): the row's first maximum under a search
 * bound and a ban, its maximum and Σ exp(x - max) in the host's very
 * operations, so that a greedy draw needs 24 bytes of a row instead of its
 * 129,280 floats, and the host's sampler passes over them (~0.3 ms a row on
 * one core) are gone.
 *
 * Bit for bit the host's: a maximum and a first place do not depend on the
 * order they are found in (NaN skipped; a zero maximum reported as +0 on
 * both sides); the exponential is core/route_score.h's, whose every step is
 * a correctly rounded operation on both sides; the sum is the host's
 * exactly: DI_ROW_SUM_LANES (32) chains of double additions, element i
 * into chain i mod 32 in increasing i, then the chains' tree of neighbours,
 * which a warp's xor shuffles 1, 2, .., 16 form. A chain cannot be split
 * without changing its roundings, so each runs on one lane of warp 0, 4,040
 * dependent additions at the model's vocabulary; the block's other warps
 * turn the next chunk into exponentials (as doubles, so a chain's step is a
 * shared load and an add) meanwhile. One block a row: a step's rows run
 * side by side on as many SMs. Measured on an H200: ~120 us whatever the
 * rows up to 64, against 13 us (one row) to 600 us (64) to download the
 * rows; what holds a block to that time is not yet known (docs/gpu-notes.md,
 * "Greedy rows on the device"). */
#include "backend/cuda/cuda_ops_common.cuh"
#include "core/route_score.h"

enum {
    LG_THREADS = 256, /* a block (LG_A_WIDE: 512) */
    LG_CHUNK = 2048,  /* a chunk: 64 elements a chain */
    LG_UNROLL = 8     /* loads in flight a thread, first pass */
};
/* producer threads (warps 1..) and a producer's elements of a chunk, for
 * blocks of NT threads */
template <int NT> struct lg_dims {
    static constexpr int PROD = NT - 32, PER = (LG_CHUNK + PROD - 1) / PROD;
};

/* a term of the sum as the host forms it (row_exp.c exp_sum1): a NaN
 * difference (+inf - +inf) as e^0; NaN inputs make the sum NaN below.
 * The exponential has no branch, so a producer's ten terms a chunk run as
 * ten independent chains. */
__device__ __forceinline__ float lg_term(float a) { return di_rs_exp_nonpos(a < 0.0f ? a : 0.0f); }

__device__ __forceinline__ float lg_max(float a, float b) { return b > a ? b : a; } /* NaN b: a */

/* a shared double, issued where written (the compiler otherwise sinks the
 * chain's loads next to their adds, one round trip a term) */
__device__ __forceinline__ double lg_lds(uint32_t a) {
    double v;
    asm volatile("ld.shared.f64 %0, [%1];\n" : "=d"(v) : "r"(a) : "memory");
    return v;
}

/* A producer's elements of chunk c (0 past the row), loaded ahead of use:
 * one block reads a whole row, so its loads must be many in flight. */
template <int NT>
__device__ __forceinline__ void lg_fetch(const float *row, int64_t V, int64_t c, int j0, float v[lg_dims<NT>::PER]) {
#pragma unroll
    for (int u = 0; u < lg_dims<NT>::PER; u++) {
        const int j = j0 + lg_dims<NT>::PROD * u;
        const int64_t i = c * LG_CHUNK + j;
        v[u] = j < LG_CHUNK && i < V ? __ldg(row + i) : 0.0f; /* 0: a term computed, never added */
    }
}

/* Measuring aids (bench_cuda_ops --greedy): LG_A_WIDE, blocks of 512
 * threads (15 producer warps instead of 7; the same bits); the others give
 * wrong results: LG_A_NOCHAIN,
 * each lane's terms go to 8 independent accumulators (the same loads and
 * adds without one long dependent chain); LG_A_NOTERM,
 * the producers store the logits as they are (no exponential);
 * LG_A_NOSUM, no second phase at all (the first pass alone). */
enum { LG_A_NOCHAIN = 1, LG_A_NOTERM = 2, LG_A_NOSUM = 4, LG_A_WIDE = 8 };

template <int AID, int NT>
__global__ void __launch_bounds__(NT) k_logits_greedy(const float *__restrict__ x, int64_t V, int64_t lim,
                                                              const int32_t *__restrict__ ban,
                                                              di_row_greedy *__restrict__ out) {
    static_assert(DI_ROW_SUM_LANES == 32, "one warp of chains");
    constexpr int PROD = lg_dims<NT>::PROD, PER = lg_dims<NT>::PER;
    __shared__ double e[2][PER * PROD]; /* a chunk, and room for the producers' last stores */
    __shared__ float red_m[NT / 32], red_a[NT / 32];
    __shared__ long long red_i[NT / 32];
    __shared__ int red_nan;
    const float *row = x + (int64_t)blockIdx.x * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t b = ban ? ban[blockIdx.x] : -1;
    if (b < 0 || b >= lim) b = lim; /* no ban inside the search */
    if (tid == 0) red_nan = 0;

    /* One pass: the search's maximum with the first place this thread sees
     * it (its elements come in increasing order, so only a strictly larger
     * value moves it), the row's maximum, whether any value is NaN. */
    float mt = -INFINITY, at = -INFINITY;
    long long it = V;
    int nan = 0;
    for (int64_t i0 = tid; i0 < V; i0 += (int64_t)LG_UNROLL * NT) {
        float v[LG_UNROLL];
#pragma unroll
        for (int u = 0; u < LG_UNROLL; u++) {
            const int64_t i = i0 + (int64_t)u * NT;
            v[u] = i < V ? __ldg(row + i) : -INFINITY;
        }
#pragma unroll
        for (int u = 0; u < LG_UNROLL; u++) {
            const int64_t i = i0 + (int64_t)u * NT;
            nan |= v[u] != v[u];
            at = lg_max(at, v[u]);
            if (i < lim && i != b && v[u] > mt) mt = v[u], it = i;
        }
    }
    /* the block's maxima, then the least first place among the threads
     * whose own maximum is the block's (a zero of either sign is the same
     * maximum) */
    float m = mt, all = at;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m = lg_max(m, __shfl_xor_sync(0xffffffffu, m, o));
        all = lg_max(all, __shfl_xor_sync(0xffffffffu, all, o));
    }
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) red_m[warp] = m, red_a[warp] = all;
    __syncthreads();
    if (nan && lane == 0) red_nan = 1;
    m = red_m[0], all = red_a[0];
    for (int w = 1; w < NT / 32; w++) m = lg_max(m, red_m[w]), all = lg_max(all, red_a[w]);
    long long first = m != -INFINITY && mt == m ? it : V;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const long long f = __shfl_xor_sync(0xffffffffu, first, o);
        first = f < first ? f : first;
    }
    if (lane == 0) red_i[warp] = first;
    m = ADD(m, 0.0f), all = ADD(all, 0.0f); /* a zero as +0, as the host */

    /* The sum: warps 1.. turn chunk c into terms (its values loaded while
     * chunk c - 1 was turned) while warp 0 adds chunk c - 1 into its 32
     * chains. */
    const int64_t nch = (AID & LG_A_NOSUM) ? 0 : (V + LG_CHUNK - 1) / LG_CHUNK;
    float v[PER];
    if (warp > 0) lg_fetch<NT>(row, V, 0, tid - 32, v);
    __syncthreads(); /* red_nan, red_i complete; e free */
    double acc = 0.0;
    for (int64_t c = 0; c <= nch; c++) {
        if (warp > 0 && c < nch) {
            float w[PER];
            lg_fetch<NT>(row, V, c + 1, tid - 32, w); /* the next chunk's, in flight meanwhile */
            double *d = e[c & 1];
            double t[PER]; /* every term computed (past the row on v = 0, unused): no branch */
#pragma unroll
            for (int u = 0; u < PER; u++) t[u] = (AID & LG_A_NOTERM) ? (double)v[u] : (double)lg_term(SUB(v[u], all));
#pragma unroll
            for (int u = 0; u < PER; u++) { /* e's rows have room past the chunk: no branch */
                const int j = tid - 32 + PROD * u;
                d[j] = c * LG_CHUNK + j < V ? t[u] : 0.0;
            }
#pragma unroll
            for (int u = 0; u < PER; u++) v[u] = w[u];
        } else if (warp == 0 && c > 0 && (AID & LG_A_NOCHAIN)) {
            const double *sh = e[(c - 1) & 1];
            double a8[8] = {0, 0, 0, 0, 0, 0, 0, 0};
#pragma unroll 16
            for (int u = 0; u < LG_CHUNK / 32; u++) a8[u & 7] = __dadd_rn(a8[u & 7], sh[lane + 32 * u]);
#pragma unroll
            for (int u = 0; u < 8; u++) acc = __dadd_rn(acc, a8[u]);
        } else if (warp == 0 && c > 0) {
            const double *sh = e[(c - 1) & 1];
            const int64_t base = (c - 1) * LG_CHUNK;
            const int n = (int)(V - base < LG_CHUNK ? V - base : LG_CHUNK); /* elements of the chunk */
            if (n == LG_CHUNK) {
                /* a chain's 64 terms of the chunk in four groups of 16, each
                 * group's loads issued before the previous group's adds:
                 * the adds wait on each other, not on shared memory */
                const uint32_t a0 = (uint32_t)__cvta_generic_to_shared(sh) + 8u * (uint32_t)lane;
                double t[2][16];
#pragma unroll
                for (int u = 0; u < 16; u++) t[0][u] = lg_lds(a0 + 256u * u);
#pragma unroll
                for (int g = 0; g < LG_CHUNK / 512; g++) {
                    if (g + 1 < LG_CHUNK / 512)
#pragma unroll
                        for (int u = 0; u < 16; u++) t[(g + 1) & 1][u] = lg_lds(a0 + 256u * (16 * (g + 1) + u));
#pragma unroll
                    for (int u = 0; u < 16; u++) acc = __dadd_rn(acc, t[g & 1][u]);
                }
            } else {
                for (int j = lane; j < n; j += 32) acc = __dadd_rn(acc, sh[j]);
            }
        }
        __syncthreads();
    }
    if (warp == 0) {
        /* the chains' tree: (0+1), (2+3), .. then their pairs (a + b and
         * b + a are the same sum) */
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) acc = __dadd_rn(acc, __shfl_xor_sync(0xffffffffu, acc, o));
        if (lane == 0) {
            long long f = red_i[0];
            for (int w = 1; w < NT / 32; w++) f = red_i[w] < f ? red_i[w] : f;
            di_row_greedy g;
            g.max = m;
            g.token = m != -INFINITY && f < lim ? (int32_t)f : -1;
            g.max_all = all;
            g.pad = 0;
            g.sum = red_nan ? __longlong_as_double(0x7ff8000000000000ll) : acc;
            out[blockIdx.x] = g;
        }
    }
}

static int lg_aid = 0;

extern "C" di_status cuda_op_logits_greedy(const float *x, int64_t m, int64_t V, int64_t lim, const int32_t *ban,
                                           di_row_greedy *out, di_err *err) {
    if (m <= 0) return DI_OK;
    if (lim > V) lim = V;
    if (lim < 0) lim = 0;
    const unsigned g = (unsigned)m;
    switch (lg_aid) {
    case 0: k_logits_greedy<0, LG_THREADS><<<g, LG_THREADS>>>(x, V, lim, ban, out); break;
    case LG_A_WIDE: k_logits_greedy<0, 512><<<g, 512>>>(x, V, lim, ban, out); break;
    case LG_A_NOCHAIN: k_logits_greedy<LG_A_NOCHAIN, LG_THREADS><<<g, LG_THREADS>>>(x, V, lim, ban, out); break;
    case LG_A_NOTERM: k_logits_greedy<LG_A_NOTERM, LG_THREADS><<<g, LG_THREADS>>>(x, V, lim, ban, out); break;
    case LG_A_NOCHAIN | LG_A_NOTERM:
        k_logits_greedy<LG_A_NOCHAIN | LG_A_NOTERM, LG_THREADS><<<g, LG_THREADS>>>(x, V, lim, ban, out);
        break;
    default: k_logits_greedy<LG_A_NOSUM, LG_THREADS><<<g, LG_THREADS>>>(x, V, lim, ban, out); break;
    }
    return cuda_check_launch(err, "logits_greedy");
}

/* measuring aid: LG_A_* flags for the next launches (0: the real kernel) */
extern "C" void cuda_logits_greedy_set_aid(int flags) { lg_aid = flags; }
