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

#include <limits.h>

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

/* ---- temperature draws (backend.h logits_draw, engine/sampler.c) ----
 *
 * One block a row draws what di_sampler_sample draws for a row whose
 * processing is at most one banned id (core/row_exp.h di_row_draw), bit for
 * bit: the same exponentials (core/route_score.h), sums of fixed-point
 * terms added as integers (any order gives them), the same comparisons in
 * double. Four passes over the row, each warp over a range of its own in
 * steps of 32: the maxima; the terms, their sums (all kept, each cut's
 * near set, each warp's) and the log-sum-exp's; then either the inverse
 * CDF in id order (no top-k / top-p: the warp whose range holds the
 * crossing walks it again with a running sum) or the near set of the first
 * cut that holds the top k or the nucleus (every kept candidate when none
 * does), gathered into shared memory, sorted by (value descending, id
 * ascending) and walked there. A near set larger than LD_NEAR (a flat row's
 * nucleus) goes by radix passes instead (ld_descend): the top k's last
 * key, the nucleus's and the draw's crossing, each found a digit at a time
 * from histograms of counts and integer masses, so no sort is needed and
 * every sum is the one the sorted walk makes. (DI_CUDA_DRAW_NEAR lowers the
 * limit and DI_CUDA_DRAW_WIDE=0 leaves the wider sets to the host, which
 * then reads the row: test aids.) */
enum { LD_THREADS = 1024, LD_WARPS = LD_THREADS / 32, LD_NEAR = 4096, LD_PER = LD_NEAR / LD_THREADS };

/* e^min(a, 0) with NaN kept: row_exp.c's exp1 */
__device__ __forceinline__ float ld_exp(float a) { return a != a ? a : di_rs_exp_nonpos(a < 0.0f ? a : 0.0f); }

/* (value descending, id ascending) as an ascending 64-bit key; a zero as +0 */
__device__ __forceinline__ unsigned long long ld_key(float w, long long t) {
    unsigned u = __float_as_uint(w == 0.0f ? 0.0f : w);
    u = (u >> 31) ? ~u : (u | 0x80000000u); /* ascending with the value */
    return ((unsigned long long)~u << 32) | (unsigned long long)(unsigned)t;
}

__device__ __forceinline__ unsigned long long ld_warp_sum(unsigned long long v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* The block's total of v (every thread gets it); red: [LD_WARPS] shared. */
__device__ unsigned long long ld_block_sum(unsigned long long v, unsigned long long *red) {
    v = ld_warp_sum(v);
    __syncthreads(); /* red may still be read from a previous call */
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = v;
    __syncthreads();
    unsigned long long t = 0;
    for (int w = 0; w < LD_WARPS; w++) t += red[w];
    return t;
}

/* The block's least of v (every thread gets it). */
__device__ long long ld_block_min(long long v, unsigned long long *red) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const long long u = __shfl_xor_sync(0xffffffffu, v, o);
        v = u < v ? u : v;
    }
    __syncthreads();
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = (unsigned long long)v;
    __syncthreads();
    long long t = v;
    for (int w = 0; w < LD_WARPS; w++) t = (long long)red[w] < t ? (long long)red[w] : t;
    return t;
}

/* The wide form: over the kept candidates in key order (ld_key: the
 * sampler's sorted order), the first one at which a running statistic
 * crosses — the count (LD_COUNT: >= target), or the terms' mass ((double)
 * mass >= lim, LD_GE; > lim, LD_GT) — among keys <= bound; by radix passes
 * over the row, 8 bits of the key a pass from the top, each a histogram of
 * the next digit's counts and masses within the bucket chosen so far
 * (integers: any order), until the chosen bucket holds one key; then a
 * pass finds it. Gives its key and the mass up to it, inclusive; *key =
 * ~0 when nothing crosses. hc / hm: shared [256]. */
enum { LD_COUNT = 0, LD_GE = 1, LD_GT = 2 };

/* A row's edited ids (core/row_exp.h di_row_edit: bias, stop-id bans,
 * penalties), ascending. A lane walks its warp's range in steps of 32, so
 * it meets the ids in ascending order: one cursor a thread, started at the
 * range's first edit, passes each edit once, and a chunk without one costs
 * a comparison with the next id (kept in a register). */
struct ld_edits {
    const di_row_edit *e;
    int n;
    float rep;
};
struct ld_walk {
    const di_row_edit *p, *end;
    long long nid; /* the next edit's id (LLONG_MAX past the last) */
};
__device__ __forceinline__ ld_walk ld_walk_at(const ld_edits &E, int64_t from) {
    int lo = 0, hi = E.n;
    while (lo < hi) {
        const int mid = (lo + hi) >> 1;
        if (__ldg(&E.e[mid].id) < from) lo = mid + 1;
        else hi = mid;
    }
    return ld_walk{E.e + lo, E.e + E.n, lo < E.n ? (long long)__ldg(&E.e[lo].id) : LLONG_MAX};
}
/* the sampler's processing of an edited id (row_exp.h di_row_edit_value:
 * each operation rounded, none contracted) */
__device__ __forceinline__ float ld_edit_value(const di_row_edit *ep, float rep, float v) {
    const int4 raw = __ldg((const int4 *)ep);
    const unsigned f = (unsigned)raw.y;
    float w = v;
    if (f & DI_EDIT_BIAS) w = __fadd_rn(w, __int_as_float(raw.z));
    if (f & DI_EDIT_BAN) w = -INFINITY;
    if (f & DI_EDIT_SEEN) w = w > 0.0f ? __fdiv_rn(w, rep) : __fmul_rn(w, rep);
    if (f & DI_EDIT_SUB) w = __fsub_rn(w, __int_as_float(raw.w));
    return w;
}
/* the edited value of id t (raw v): the edits of t's chunk of 32 passed */
__device__ __forceinline__ float ld_edit(ld_walk &k, float rep, int64_t t, float v) {
    const long long end = (long long)(t | 31) + 1;
    float r = v;
    while (k.nid < end) {
        if (k.nid == t) r = ld_edit_value(k.p, rep, v);
        ++k.p;
        k.nid = k.p < k.end ? (long long)__ldg(&k.p->id) : LLONG_MAX;
    }
    return r;
}

struct ld_row_ctx {
    const float *row;
    int64_t w0, w1, lim, ban;
    float wm, inv_t, min_p, scale;
    ld_edits E;
};

/* The processed logit of id t (raw v): the edits, then the ban and the
 * search bound (the sampler's order: every later step keeps a -inf) */
__device__ __forceinline__ float ld_w(const ld_row_ctx &c, ld_walk &k, int64_t t, float v) {
    const float w = c.E.n ? ld_edit(k, c.E.rep, t, v) : v;
    return t < c.lim && t != c.ban ? w : -INFINITY;
}

__device__ __forceinline__ int ld_kept(const ld_row_ctx &c, ld_walk &k, int64_t t, float *w, float *e) {
    const float v = __ldg(c.row + t);
    *w = ld_w(c, k, t, v);
    *e = ld_exp(MUL(SUB(*w, c.wm), c.inv_t));
    return *e >= c.min_p && *e > 0.0f;
}

/* the value a key was made of (ld_key's inverse; a zero comes back +0) */
__device__ __forceinline__ float ld_key_value(unsigned long long key) {
    const unsigned u = ~(unsigned)(key >> 32);
    return __uint_as_float((u >> 31) ? (u & 0x7fffffffu) : ~u);
}

__device__ void ld_descend(const ld_row_ctx &c, int mode, unsigned long long target, double lim,
                           unsigned long long bound, unsigned int *hc, unsigned long long *hm,
                           unsigned long long *key, unsigned long long *mass) {
    __shared__ unsigned long long s_pre, s_acc_m, s_acc_c, s_found, s_found_q;
    __shared__ int s_one, s_none;
    const int tid = threadIdx.x, lane = tid & 31;
    if (tid == 0) s_pre = 0, s_acc_m = 0, s_acc_c = 0, s_one = 0, s_none = 0;
    int sh = 56;
    for (;; sh -= 8) {
        if (tid < 256) hc[tid] = 0, hm[tid] = 0;
        __syncthreads();
        const unsigned long long pre = s_pre;
        /* a flat row puts most keys in a few digits: the lanes of a warp
         * with the same digit add theirs first (a term is at most 2^50, so
         * its low 26 bits and the rest, at most 2^24, each sum in 32 bits
         * over 32 lanes) */
        ld_walk wk = ld_walk_at(c.E, c.w0);
        for (int64_t b = c.w0; b < c.w1; b += 32) {
            const int64_t t = b + lane;
            int dg = -1;
            unsigned long long qt = 0;
            float w, e;
            if (t < c.w1 && ld_kept(c, wk, t, &w, &e)) {
                const unsigned long long k = ld_key(w, t);
                if (k <= bound && (sh == 56 || (k >> (sh + 8)) == (pre >> (sh + 8))))
                    dg = (int)((k >> sh) & 255u), qt = (unsigned long long)__float2ll_rn(MUL(e, c.scale));
            }
            const unsigned peers = __match_any_sync(0xffffffffu, dg);
            if (dg >= 0) {
                const unsigned lo = __reduce_add_sync(peers, (unsigned)(qt & 0x3ffffffu));
                const unsigned hi = __reduce_add_sync(peers, (unsigned)(qt >> 26));
                if (lane == __ffs(peers) - 1) {
                    atomicAdd(&hc[dg], (unsigned)__popc(peers));
                    atomicAdd(&hm[dg], ((unsigned long long)hi << 26) + lo);
                }
            }
        }
        __syncthreads();
        if (tid == 0) {
            unsigned long long ac = s_acc_c, am = s_acc_m;
            int dg = 0;
            for (; dg < 256; dg++) {
                const unsigned long long c2 = ac + hc[dg], m2 = am + hm[dg];
                if (mode == LD_COUNT ? c2 >= target
                                     : mode == LD_GE ? __ull2double_rn(m2) >= lim : __ull2double_rn(m2) > lim)
                    break;
                ac = c2, am = m2;
            }
            if (dg == 256) s_none = 1;
            else s_pre = pre | ((unsigned long long)dg << sh), s_acc_c = ac, s_acc_m = am, s_one = hc[dg] == 1;
        }
        __syncthreads();
        if (s_none) {
            *key = ~0ull, *mass = 0;
            return;
        }
        if (s_one || sh == 0) break; /* one key in the bucket (keys are distinct: at the last digit always) */
    }
    /* the bucket's one key: digits sh and up are pre's */
    const unsigned long long pre = s_pre;
    ld_walk wk = ld_walk_at(c.E, c.w0);
    for (int64_t t = c.w0 + lane; t < c.w1; t += 32) {
        float w, e;
        if (!ld_kept(c, wk, t, &w, &e)) continue;
        const unsigned long long k = ld_key(w, t);
        if (k <= bound && (k >> sh) == (pre >> sh))
            s_found = k, s_found_q = (unsigned long long)__float2ll_rn(MUL(e, c.scale));
    }
    __syncthreads();
    *key = s_found, *mass = s_acc_m + s_found_q;
    __syncthreads(); /* the shared values are read before the next call resets them */
}

__global__ void __launch_bounds__(LD_THREADS) k_lg_draw(const float *__restrict__ x, int64_t V, int64_t lim,
                                                        int frac, int cap, int wide,
                                                        const di_row_draw *__restrict__ draws,
                                                        const di_row_edit *__restrict__ edits, long long edit_base,
                                                        di_row_greedy *__restrict__ out) {
    __shared__ unsigned long long s_key[LD_NEAR];
    __shared__ unsigned long long s_red[LD_WARPS], s_wq[LD_WARPS];
    __shared__ float s_m[2][LD_WARPS];
    __shared__ int s_nan[LD_WARPS];
    __shared__ int s_n;
    __shared__ long long s_tok;
    const int64_t r = blockIdx.x;
    const float *row = x + r * V;
    const di_row_draw d = draws[r];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int64_t W = ((V + LD_WARPS - 1) / LD_WARPS + 31) & ~(int64_t)31; /* a warp's ids */
    const int64_t w0 = warp * W, w1 = w0 + W < V ? w0 + W : V;
    const int64_t ban = d.ban >= 0 && d.ban < lim ? d.ban : -1;
    const ld_edits E = {d.n_edit > 0 && edits ? edits + (d.e0 - edit_base) : NULL, d.n_edit > 0 && edits ? d.n_edit : 0,
                        d.rep};
    ld_row_ctx cx = {row, w0, w1, lim, ban, -INFINITY, d.inv_t, d.min_p, 0.0f, E}; /* wm and scale below */
    /* pass 1: the processed row's maximum, the raw row's, any NaN */
    float wm = -INFINITY, am = -INFINITY;
    int nan = 0;
    {
        ld_walk wk = ld_walk_at(E, w0);
        for (int64_t t = w0 + lane; t < w1; t += 32) {
            const float v = __ldg(row + t);
            nan |= v != v;
            am = lg_max(am, v);
            wm = lg_max(wm, ld_w(cx, wk, t, v));
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        wm = lg_max(wm, __shfl_xor_sync(0xffffffffu, wm, o));
        am = lg_max(am, __shfl_xor_sync(0xffffffffu, am, o));
    }
    nan = __any_sync(0xffffffffu, nan);
    if (lane == 0) s_m[0][warp] = wm, s_m[1][warp] = am, s_nan[warp] = nan;
    __syncthreads();
    wm = s_m[0][0], am = s_m[1][0], nan = s_nan[0];
    for (int w = 1; w < LD_WARPS; w++) wm = lg_max(wm, s_m[0][w]), am = lg_max(am, s_m[1][w]), nan |= s_nan[w];
    am = ADD(am, 0.0f); /* a zero as +0, as the host */
    di_row_greedy g;
    g.max_all = am;
    g.pad = 0;
    g.token = -1;
    g.max = -INFINITY;
    if (wm == -INFINITY) { /* nothing to draw */
        if (tid == 0) g.sum = 0.0, out[r] = g;
        return;
    }
    const float scale = __int_as_float((127 + frac) << 23);
    cx.wm = wm, cx.scale = scale;
    if (d.greedy) {
        /* the processed row's first maximum (the sampler's di_row_find) and
         * the raw row's log-sum-exp terms */
        long long first = LLONG_MAX;
        unsigned long long ql = 0;
        ld_walk wk = ld_walk_at(E, w0);
        for (int64_t t = w0 + lane; t < w1; t += 32) {
            const float v = __ldg(row + t);
            if (ld_w(cx, wk, t, v) == wm && t < first) first = t;
            ql += (unsigned long long)__float2ll_rn(MUL(lg_term(SUB(v, am)), scale));
        }
        const unsigned long long QL = ld_block_sum(ql, s_red);
        first = ld_block_min(first, s_red);
        if (tid == 0) {
            g.sum = nan ? __longlong_as_double(0x7ff8000000000000ll) : ldexp(__ull2double_rn(QL), -frac);
            g.token = (int32_t)first, g.max = row[first], out[r] = g;
        }
        return;
    }
    /* pass 2: the terms and their sums */
    const float cuts[DI_SAMPLER_CUTS] = {DI_SAMPLER_CUT0, DI_SAMPLER_CUT1, DI_SAMPLER_CUT2};
    const int filt = d.top_k > 0 || d.top_p < 1.0;
    unsigned long long q = 0, ql = 0, nq[DI_SAMPLER_CUTS] = {0, 0, 0}, nn[DI_SAMPLER_CUTS] = {0, 0, 0}, kc = 0;
    long long last = -1;
    ld_walk wk2 = ld_walk_at(E, w0);
    for (int64_t t = w0 + lane; t < w1; t += 32) {
        const float v = __ldg(row + t);
        const float e = ld_exp(MUL(SUB(ld_w(cx, wk2, t, v), wm), d.inv_t));
        const int kept = e >= d.min_p && e > 0.0f;
        const unsigned long long qt = kept ? (unsigned long long)__float2ll_rn(MUL(e, scale)) : 0ull;
        q += qt;
        kc += kept;
        last = kept ? t : last;
        ql += (unsigned long long)__float2ll_rn(MUL(lg_term(SUB(v, am)), scale));
        if (filt)
#pragma unroll
            for (int c = 0; c < DI_SAMPLER_CUTS; c++)
                if (kept && e > cuts[c]) nn[c]++, nq[c] += qt;
    }
    const unsigned long long wq = ld_warp_sum(q);
    if (lane == 0) s_wq[warp] = wq;
    const unsigned long long Q = ld_block_sum(q, s_red), keep = ld_block_sum(kc, s_red);
    const unsigned long long QL = ld_block_sum(ql, s_red);
    long long lastk = -ld_block_min(-last, s_red);
    g.sum = nan ? __longlong_as_double(0x7ff8000000000000ll) : ldexp(__ull2double_rn(QL), -frac);
    if (keep == 0) {
        if (tid == 0) out[r] = g;
        return;
    }
    const int topk_on = d.top_k > 0 && (unsigned long long)d.top_k < keep;
    if (!topk_on && !(d.top_p < 1.0)) {
        /* pass 3: the first kept id whose running sum passes u · Q */
        const double lim_d = d.u * __ull2double_rn(Q);
        unsigned long long ex = 0;
        for (int w = 0; w < warp; w++) ex += s_wq[w];
        if (tid == 0) s_tok = lastk; /* no crossing (u · Q rounded up to Q): the last, as the host */
        __syncthreads();
        if (__ull2double_rn(ex + wq) > lim_d && !(__ull2double_rn(ex) > lim_d)) {
            unsigned long long run = ex;
            ld_walk wk = ld_walk_at(E, w0);
            for (int64_t b = w0; b < w1; b += 32) {
                const int64_t t = b + lane;
                unsigned long long qt = 0;
                float w, e;
                if (t < w1 && ld_kept(cx, wk, t, &w, &e)) qt = (unsigned long long)__float2ll_rn(MUL(e, scale));
                unsigned long long inc = qt;
#pragma unroll
                for (int o = 1; o < 32; o <<= 1) {
                    const unsigned long long u = __shfl_up_sync(0xffffffffu, inc, o);
                    if (lane >= o) inc += u;
                }
                const unsigned hit = __ballot_sync(0xffffffffu, __ull2double_rn(run + inc) > lim_d);
                if (hit) {
                    if (lane == 0) s_tok = b + __ffs(hit) - 1;
                    break;
                }
                run += __shfl_sync(0xffffffffu, inc, 31);
            }
        }
        __syncthreads();
        if (tid == 0) g.token = (int32_t)s_tok, g.max = row[s_tok], out[r] = g;
        return;
    }
    /* the near set of the first cut that holds the top k or the nucleus */
    unsigned long long NN[DI_SAMPLER_CUTS], NQ[DI_SAMPLER_CUTS];
#pragma unroll
    for (int k = 0; k < DI_SAMPLER_CUTS; k++) NN[k] = ld_block_sum(nn[k], s_red), NQ[k] = ld_block_sum(nq[k], s_red);
    int c = 0;
    for (; c < DI_SAMPLER_CUTS; c++)
        if (topk_on ? (unsigned long long)d.top_k <= NN[c] : __ull2double_rn(NQ[c]) >= d.top_p * __ull2double_rn(Q)) break;
    /* no cut holds them: every kept candidate (e > 0 is part of kept) */
    const unsigned long long near = c < DI_SAMPLER_CUTS ? NN[c] : keep;
    if (near > (unsigned long long)cap) { /* too wide to sort here */
        if (!wide) { /* the host draws it */
            if (tid == 0) g.pad = 1, out[r] = g;
            return;
        }
        /* the top k's last key, the nucleus's, then the draw's crossing, by
         * radix passes (the running sums over the sorted order are those of
         * the sort above: the same integers) */
        unsigned int *hc = (unsigned int *)s_key;
        unsigned long long *hm = s_key + 128;
        unsigned long long end = ~0ull, tot = Q, k, mk;
        if (topk_on) {
            ld_descend(cx, LD_COUNT, (unsigned long long)d.top_k, 0.0, end, hc, hm, &k, &mk);
            end = k, tot = mk;
        }
        if (d.top_p < 1.0) {
            ld_descend(cx, LD_GE, 0, d.top_p * __ull2double_rn(tot), end, hc, hm, &k, &mk);
            end = k, tot = mk;
        }
        ld_descend(cx, LD_GT, 0, d.u * __ull2double_rn(tot), end, hc, hm, &k, &mk);
        if (k == ~0ull) k = end; /* no crossing (u · total rounded up to it): the list's last */
        if (tid == 0) {
            const unsigned t = (unsigned)k;
            g.token = (int32_t)t, g.max = row[t], out[r] = g;
        }
        return;
    }
    const float cut = c < DI_SAMPLER_CUTS ? cuts[c] : 0.0f;
    if (tid == 0) s_n = 0;
    __syncthreads();
    /* pass 4: gather the near set */
    {
        ld_walk wk = ld_walk_at(E, w0);
        for (int64_t t = w0 + lane; t < w1; t += 32) {
            float w, e;
            if (ld_kept(cx, wk, t, &w, &e) && e > cut) s_key[atomicAdd(&s_n, 1)] = ld_key(w, t);
        }
    }
    __syncthreads();
    const int n = s_n;
    int n2 = 1;
    while (n2 < n) n2 <<= 1;
    for (int i = n + tid; i < n2; i += LD_THREADS) s_key[i] = ~0ull;
    __syncthreads();
    for (int k = 2; k <= n2; k <<= 1) /* bitonic sort, ascending */
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = tid; i < n2; i += LD_THREADS) {
                const int p = i ^ j;
                if (p > i) {
                    const unsigned long long a = s_key[i], b = s_key[p];
                    if ((a > b) == ((i & k) == 0)) s_key[i] = b, s_key[p] = a;
                }
            }
            __syncthreads();
        }
    /* the kept list: the first L of the sorted set; thread tid holds
     * places LD_PER·tid .. LD_PER·tid + LD_PER - 1 and their running sums */
    const int L = topk_on ? d.top_k : n;
    unsigned long long inc[LD_PER], own = 0;
#pragma unroll
    for (int k = 0; k < LD_PER; k++) {
        const int j = tid * LD_PER + k;
        unsigned long long qt = 0;
        if (j < L) {
            const float e = ld_exp(MUL(SUB(ld_key_value(s_key[j]), wm), d.inv_t)); /* the processed logit */
            qt = (unsigned long long)__float2ll_rn(MUL(e, scale));
        }
        own += qt;
        inc[k] = own;
    }
    /* exclusive prefix of the threads' sums */
    unsigned long long pre = own;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const unsigned long long u = __shfl_up_sync(0xffffffffu, pre, o);
        if (lane >= o) pre += u;
    }
    __syncthreads();
    if (lane == 31) s_red[warp] = pre;
    __syncthreads();
    unsigned long long base = pre - own;
    for (int w = 0; w < warp; w++) base += s_red[w];
    unsigned long long listsum = 0;
    for (int w = 0; w < LD_WARPS; w++) listsum += s_red[w];
#pragma unroll
    for (int k = 0; k < LD_PER; k++) inc[k] += base;
    int keepn = L;
    if (d.top_p < 1.0) { /* the nucleus: up to the first place whose running sum reaches top_p of the list's */
        const double lim_p = d.top_p * __ull2double_rn(topk_on ? listsum : Q);
        long long first = LD_NEAR;
#pragma unroll
        for (int k = LD_PER - 1; k >= 0; k--) {
            const int j = tid * LD_PER + k;
            if (j < L && __ull2double_rn(inc[k]) >= lim_p) first = j;
        }
        first = ld_block_min(first, s_red);
        if (first < L) keepn = (int)first + 1;
    }
    /* the draw over the kept list: its total is the running sum at its end */
    __syncthreads();
    if (tid == (keepn - 1) / LD_PER) s_red[0] = inc[(keepn - 1) % LD_PER];
    __syncthreads();
    const double lim_d = d.u * __ull2double_rn(s_red[0]);
    long long hit = LD_NEAR;
#pragma unroll
    for (int k = LD_PER - 1; k >= 0; k--) {
        const int j = tid * LD_PER + k;
        if (j < keepn && __ull2double_rn(inc[k]) > lim_d) hit = j;
    }
    hit = ld_block_min(hit, s_red);
    if (tid == 0) {
        const int j = hit < keepn ? (int)hit : keepn - 1;
        const unsigned t = (unsigned)s_key[j];
        g.token = (int32_t)t, g.max = row[t], out[r] = g;
    }
}

extern "C" di_status cuda_op_logits_draw(const float *x, int64_t m, int64_t V, int64_t lim, const di_row_draw *draws,
                                         const di_row_edit *edits, int64_t edit_base, di_row_greedy *out,
                                         di_err *err) {
    if (m <= 0) return DI_OK;
    if (V <= 0 || V > INT32_MAX) return di_err_set(err, DI_ERR_INVALID_ARG, "logits_draw: rows of %lld logits", (long long)V);
    if (lim > V) lim = V;
    if (lim < 0) lim = 0;
    /* test aids: DI_CUDA_DRAW_NEAR=n sorts near sets of up to n (<= LD_NEAR)
     * in shared memory and takes wider ones by radix passes, so small
     * vocabularies take that form too; DI_CUDA_DRAW_WIDE=0 leaves the wider
     * ones to the host instead */
    static long near_env = LONG_MIN, wide_env = LONG_MIN;
    long cap = cuda_env_long("DI_CUDA_DRAW_NEAR", LD_NEAR, &near_env);
    cap = cap < 1 ? 1 : cap > LD_NEAR ? LD_NEAR : cap;
    const int wide = cuda_env_long("DI_CUDA_DRAW_WIDE", 1, &wide_env) != 0;
    k_lg_draw<<<(unsigned)m, LD_THREADS>>>(x, V, lim, di_row_sum_frac_bits(V), (int)cap, wide, draws, edits,
                                           (long long)edit_base, out);
    return cuda_check_launch(err, "logits_draw");
}

/* ---- top lists (backend.h logits_top, core/row_exp.h di_row_top_of) ----
 *
 * One block a row. An entry's key is its value's order bits (NaN 0, below
 * every number; -0 as +0; negative values' bits complemented, positive ones'
 * sign set) above its id's complement, so one unsigned comparison gives
 * di_row_top_of's order and no two keys are equal. Each thread keeps the k
 * largest keys of the ids it reads (stride LT_THREADS) in registers, sorted
 * (an insertion only for a key above its k-th, rare once the list is full);
 * then k rounds of a block-wide maximum over the threads' heads, the
 * winner popping its head. Key 0 (an unfilled place) is below every entry's
 * key, and the row holds at least k entries. */
enum { LT_THREADS = 256, LT_WARPS = LT_THREADS / 32 };

__device__ __forceinline__ unsigned long long lt_key(float v, int64_t id) {
    const uint32_t u = __float_as_uint(v == 0.0f ? 0.0f : v);
    const uint32_t o = isnan(v) ? 0u : (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    return ((unsigned long long)o << 32) | (uint32_t)~(uint32_t)id;
}

__device__ __forceinline__ unsigned long long lt_max(unsigned long long a, unsigned long long b) { return a > b ? a : b; }

/* KMAX >= k: the lists' room (a power of two up to DI_ROW_TOP_MAX: the
 * smaller, the fewer registers) */
template <int KMAX>
__global__ void __launch_bounds__(LT_THREADS) k_lg_top(const float *__restrict__ x, int64_t V, int k, di_row_top *out) {
    __shared__ unsigned long long wm[2][LT_WARPS];
    const float *row = x + (int64_t)blockIdx.x * V;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    unsigned long long l[KMAX];
#pragma unroll
    for (int j = 0; j < KMAX; j++) l[j] = 0ull;
    unsigned long long kth = 0ull; /* l[k - 1] */
    for (int64_t i = tid; i < V; i += LT_THREADS) {
        const unsigned long long c = lt_key(__ldg(row + i), i);
        if (c <= kth) continue;
        /* insert c into the sorted l[0 .. k), the last one dropping out */
#pragma unroll
        for (int j = KMAX - 1; j > 0; j--)
            if (j < k) l[j] = c > l[j - 1] ? l[j - 1] : (c > l[j] ? c : l[j]);
        l[0] = lt_max(c, l[0]);
        /* l[k - 1], the least of the first k: as a minimum, since an
         * index by k would put the list in local memory */
        kth = ~0ull;
#pragma unroll
        for (int j = 0; j < KMAX; j++)
            if (j < k) kth = l[j] < kth ? l[j] : kth;
    }
    for (int r = 0; r < k; r++) {
        unsigned long long m = l[0];
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) m = lt_max(m, __shfl_xor_sync(0xffffffffu, m, o));
        if (lane == 0) wm[r & 1][warp] = m;
        __syncthreads(); /* one barrier a round: the other half of wm was read a round ago */
        m = wm[r & 1][0];
#pragma unroll
        for (int w = 1; w < LT_WARPS; w++) m = lt_max(m, wm[r & 1][w]);
        if (l[0] == m) { /* the winner (keys are unique): its next entry comes up */
#pragma unroll
            for (int j = 0; j < KMAX - 1; j++) l[j] = l[j + 1];
            l[KMAX - 1] = 0ull;
            const int64_t id = (int64_t)(uint32_t)~(uint32_t)m;
            out[(int64_t)blockIdx.x * k + r] = di_row_top{(int32_t)id, row[id]};
        }
    }
}

extern "C" di_status cuda_op_logits_top(const float *x, int64_t m, int64_t V, int32_t k, di_row_top *out, di_err *err) {
    if (m <= 0) return DI_OK;
    if (k < 1 || k > DI_ROW_TOP_MAX || k > V || V > INT32_MAX)
        return di_err_set(err, DI_ERR_INVALID_ARG, "logits_top: lists of %d over rows of %lld (1 .. %d, at most the row)",
                          (int)k, (long long)V, DI_ROW_TOP_MAX);
    if (m > INT32_MAX) return di_err_set(err, DI_ERR_LIMIT, "logits_top: %lld rows", (long long)m);
    if (k <= 4) k_lg_top<4><<<(unsigned)m, LT_THREADS>>>(x, V, (int)k, out);
    else if (k <= 8) k_lg_top<8><<<(unsigned)m, LT_THREADS>>>(x, V, (int)k, out);
    else if (k <= 16) k_lg_top<16><<<(unsigned)m, LT_THREADS>>>(x, V, (int)k, out);
    else k_lg_top<DI_ROW_TOP_MAX><<<(unsigned)m, LT_THREADS>>>(x, V, (int)k, out);
    return cuda_check_launch(err, "logits_top");
}

/* out[i] = x[i·V + cols[i]] (backend.h logits_pick) */
__global__ void k_lg_pick(const float *__restrict__ x, int64_t m, int64_t V, const int32_t *__restrict__ cols,
                          float *__restrict__ out) {
    const int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i < m) out[i] = x[i * V + cols[i]];
}

extern "C" di_status cuda_op_logits_pick(const float *x, int64_t m, int64_t V, const int32_t *cols, float *out,
                                         di_err *err) {
    if (m <= 0) return DI_OK;
    if (m > INT32_MAX / 2) return di_err_set(err, DI_ERR_LIMIT, "logits_pick: %lld rows", (long long)m);
    k_lg_pick<<<(unsigned)((m + 255) / 256), 256>>>(x, m, V, cols, out);
    return cuda_check_launch(err, "logits_pick");
}
