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
 * a correctly rounded operation on both sides; the sum is of fixed-point
 * terms added as 64-bit integers (di_row_sum_exp), which any order gives
 * exactly, so a row is spread over as many blocks as it has parts.
 *
 * Two launches over a grid of (parts, rows): the first finds each part's
 * maxima and first place; the second reads the row's parts for its
 * maximum, turns its own part into terms and adds their integer sum into
 * the row's total, and the row's last block to finish writes the summary.
 * An earlier form ran a row in one block (one warp of 32 chains of double
 * additions, the host's order then): ~120 us whatever the rows up to 64,
 * a single SM's loads and a chain's latencies (docs/gpu-notes.md). */
#include "backend/cuda/cuda_ops_common.cuh"
#include "core/route_score.h"

enum {
    LG_THREADS = 256,
    LG_PER = 8,                        /* elements a thread, loaded at once */
    LG_PART = LG_THREADS * LG_PER      /* elements a block */
};

/* a part's search and row maxima; it = the first place of mt in the part
 * (V when none) */
struct lg_part {
    float mt, at;
    int32_t nan, pad;
    long long it;
};

/* A row's running total of the sum and how many of its parts have added
 * theirs; zeroed by the first launch. */
struct lg_row {
    unsigned long long q;
    unsigned int done, pad;
};

__device__ __forceinline__ float lg_max(float a, float b) { return b > a ? b : a; } /* NaN b: a */

/* a term of the sum as the host forms it (row_exp.c exp_sum1): a NaN
 * difference (+inf - +inf) as e^0; NaN inputs make the sum NaN by the flag */
__device__ __forceinline__ float lg_term(float a) { return di_rs_exp_nonpos(a < 0.0f ? a : 0.0f); }

/* The part's maxima and first place, in increasing order within a thread
 * (its elements LG_THREADS apart), so only a strictly larger value moves
 * it; the block's then: the largest, the least first place among the
 * threads that hold it (a zero of either sign is the same maximum). */
__global__ void __launch_bounds__(LG_THREADS) k_lg_scan(const float *__restrict__ x, int64_t V, int64_t lim,
                                                        const int32_t *__restrict__ ban, int parts,
                                                        lg_part *__restrict__ part, lg_row *__restrict__ rows) {
    __shared__ float red_m[LG_THREADS / 32], red_a[LG_THREADS / 32];
    __shared__ long long red_i[LG_THREADS / 32];
    __shared__ int red_nan[LG_THREADS / 32];
    const int64_t r = blockIdx.y, p = blockIdx.x;
    const float *row = x + r * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int64_t b = ban ? ban[r] : -1;
    if (b < 0 || b >= lim) b = lim; /* no ban inside the search */
    float v[LG_PER];
#pragma unroll
    for (int u = 0; u < LG_PER; u++) {
        const int64_t i = p * LG_PART + u * LG_THREADS + tid;
        v[u] = i < V ? __ldg(row + i) : -INFINITY;
    }
    float mt = -INFINITY, at = -INFINITY;
    long long it = V;
    int nan = 0;
#pragma unroll
    for (int u = 0; u < LG_PER; u++) {
        const int64_t i = p * LG_PART + u * LG_THREADS + tid;
        nan |= v[u] != v[u];
        at = lg_max(at, v[u]);
        if (i < lim && i != b && v[u] > mt) mt = v[u], it = i;
    }
    float m = mt, all = at;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m = lg_max(m, __shfl_xor_sync(0xffffffffu, m, o));
        all = lg_max(all, __shfl_xor_sync(0xffffffffu, all, o));
    }
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) red_m[warp] = m, red_a[warp] = all, red_nan[warp] = nan;
    __syncthreads();
    m = red_m[0], all = red_a[0], nan = red_nan[0];
    for (int w = 1; w < LG_THREADS / 32; w++) m = lg_max(m, red_m[w]), all = lg_max(all, red_a[w]), nan |= red_nan[w];
    long long first = m != -INFINITY && mt == m ? it : V;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const long long f = __shfl_xor_sync(0xffffffffu, first, o);
        first = f < first ? f : first;
    }
    if (lane == 0) red_i[warp] = first;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < LG_THREADS / 32; w++) first = red_i[w] < first ? red_i[w] : first;
        lg_part o;
        o.mt = m, o.at = all, o.nan = nan, o.pad = 0, o.it = first;
        part[r * parts + p] = o;
        if (p == 0) rows[r].q = 0, rows[r].done = 0, rows[r].pad = 0;
    }
}

/* The row's maxima from its parts (every block of the row forms them the
 * same way; a warp reads up to 32 parts a round). */
struct lg_sum_of_parts {
    float m, all;
    long long first;
    int nan;
};

__device__ lg_sum_of_parts lg_parts(const lg_part *pp, int parts, int64_t V) {
    float m = -INFINITY, all = -INFINITY;
    int nan = 0;
    const int lane = threadIdx.x & 31;
    for (int j = lane; j < parts; j += 32) m = lg_max(m, pp[j].mt), all = lg_max(all, pp[j].at), nan |= pp[j].nan;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        m = lg_max(m, __shfl_xor_sync(0xffffffffu, m, o));
        all = lg_max(all, __shfl_xor_sync(0xffffffffu, all, o));
    }
    nan = __any_sync(0xffffffffu, nan);
    long long first = V;
    for (int j = lane; j < parts; j += 32)
        if (m != -INFINITY && pp[j].mt == m && pp[j].it < first) first = pp[j].it;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const long long f = __shfl_xor_sync(0xffffffffu, first, o);
        first = f < first ? f : first;
    }
    lg_sum_of_parts s;
    s.m = ADD(m, 0.0f), s.all = ADD(all, 0.0f), s.first = first, s.nan = nan; /* a zero as +0, as the host */
    return s;
}

__global__ void __launch_bounds__(LG_THREADS) k_lg_sum(const float *__restrict__ x, int64_t V, int64_t lim,
                                                       int parts, int frac, const lg_part *__restrict__ part,
                                                       lg_row *__restrict__ rows, di_row_greedy *__restrict__ out) {
    __shared__ float s_all;
    __shared__ unsigned long long red_q[LG_THREADS / 32];
    __shared__ unsigned int ticket;
    const int64_t r = blockIdx.y, p = blockIdx.x;
    const float *row = x + r * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    float v[LG_PER];
#pragma unroll
    for (int u = 0; u < LG_PER; u++) { /* in flight while warp 0 reads the parts */
        const int64_t i = p * LG_PART + u * LG_THREADS + tid;
        v[u] = i < V ? __ldg(row + i) : 0.0f;
    }
    if (warp == 0) {
        const lg_sum_of_parts s = lg_parts(part + r * parts, parts, V);
        if (lane == 0) s_all = s.all;
    }
    __syncthreads();
    const float all = s_all, scale = __int_as_float((127 + frac) << 23);
    unsigned long long q = 0;
#pragma unroll
    for (int u = 0; u < LG_PER; u++) {
        const int64_t i = p * LG_PART + u * LG_THREADS + tid;
        /* t · 2^F is exact and below 2^51: rounded to the nearest integer,
         * ties to even, as the host's double addition of 1.5 · 2^52 does */
        const long long t = __float2ll_rn(MUL(lg_term(SUB(v[u], all)), scale));
        q += i < V ? (unsigned long long)t : 0ull;
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) q += __shfl_xor_sync(0xffffffffu, q, o);
    if (lane == 0) red_q[warp] = q;
    __syncthreads();
    if (tid == 0) {
        for (int w = 1; w < LG_THREADS / 32; w++) q += red_q[w];
        atomicAdd(&rows[r].q, q);
        __threadfence(); /* the total before the ticket */
        ticket = atomicAdd(&rows[r].done, 1u);
    }
    __syncthreads();
    if (ticket != (unsigned)parts - 1 || warp != 0) return;
    /* the row's last block: every part's sum is in the total */
    __threadfence();
    const lg_sum_of_parts s = lg_parts(part + r * parts, parts, V);
    if (lane == 0) {
        const unsigned long long tot = atomicAdd(&rows[r].q, 0ull);
        di_row_greedy g;
        g.max = s.m;
        g.token = s.m != -INFINITY && s.first < lim ? (int32_t)s.first : -1;
        g.max_all = s.all;
        g.pad = 0;
        /* Q · 2^-F: one rounding of Q to double, then an exact scaling */
        g.sum = s.nan ? __longlong_as_double(0x7ff8000000000000ll) : ldexp(__ll2double_rn((long long)tot), -frac);
        out[r] = g;
    }
}

static int lg_parts_of(int64_t V) { return (int)((V + LG_PART - 1) / LG_PART); }

extern "C" size_t cuda_op_logits_greedy_scratch_bytes(int64_t m, int64_t V) {
    if (m <= 0 || V <= 0) return 0;
    return (size_t)m * ((size_t)lg_parts_of(V) * sizeof(lg_part) + sizeof(lg_row));
}

extern "C" di_status cuda_op_logits_greedy(const float *x, int64_t m, int64_t V, int64_t lim, const int32_t *ban,
                                           di_row_greedy *out, void *scratch, di_err *err) {
    if (m <= 0) return DI_OK;
    if (V <= 0) return di_err_set(err, DI_ERR_INVALID_ARG, "logits_greedy: rows of %lld logits", (long long)V);
    if (!scratch) return di_err_set(err, DI_ERR_INVALID_ARG, "logits_greedy: no scratch");
    if (lim > V) lim = V;
    if (lim < 0) lim = 0;
    const int parts = lg_parts_of(V);
    lg_row *rows = (lg_row *)scratch;
    lg_part *part = (lg_part *)(rows + m);
    for (int64_t r0 = 0; r0 < m; r0 += 65535) { /* a grid's rows */
        const int64_t n = m - r0 < 65535 ? m - r0 : 65535;
        const dim3 grid((unsigned)parts, (unsigned)n);
        const int32_t *b = ban ? ban + r0 : NULL;
        k_lg_scan<<<grid, LG_THREADS>>>(x + r0 * V, V, lim, b, parts, part + r0 * parts, rows + r0);
        k_lg_sum<<<grid, LG_THREADS>>>(x + r0 * V, V, lim, parts, di_row_sum_frac_bits(V), part + r0 * parts,
                                       rows + r0, out + r0);
    }
    return cuda_check_launch(err, "logits_greedy");
}
