/* Row statistics and exponentials over a vocabulary row (row_exp.h). The AVX2 loops and the
 * scalar mirror spell out the same operations in the same order, every
 * multiply-add as one fused operation (fmaf / _mm256_fmadd_ps), so the two
 * give the same bits; nothing here depends on how many threads or rows
 * there are. */
#include "core/row_exp.h"

#include <math.h>
#include <stdatomic.h>
#include <string.h>

#include "core/cpu_features.h"
#include "core/route_score.h"

#if defined(__x86_64__) || defined(__i386__)
#define DI_SAMPLER_AVX2 1
#include <immintrin.h>
#endif

/* e^min(a, 0), NaN kept: the router's exponential (core/route_score.h),
 * whose operations the 8-wide form below repeats one for one. */
static float exp1(float a) {
    if (a != a) return a;
    return di_rs_exp_nonpos(a < 0.0f ? a : 0.0f);
}

/* A term of the sum: e^min(a, 0) with NaN taken as 0 (e^0), as the vector
 * form's min against 0 takes it. A NaN input makes the sum NaN by itself
 * (the callers' flag); a NaN difference from finite inputs is +inf - +inf,
 * a +inf logit against a +inf maximum: one, as its share of the row. */
static float exp_sum1(float a) { return di_rs_exp_nonpos(a < 0.0f ? a : 0.0f); }

/* A term as the sum's integer: rint(t · 2^F) with t · 2^F exact (t <= 1, a
 * power-of-two scale) and below 2^51, rounded to an integer, ties to even,
 * by adding 1.5 · 2^52 in double (the vector path's very operation). */
#define DI_ROW_MAGIC 0x1.8p52
static int64_t term_q(float t, float scale) {
    union { double d; int64_t i; } a = {.d = (double)t * (double)scale + DI_ROW_MAGIC}, b = {.d = DI_ROW_MAGIC};
    return a.i - b.i;
}

static double sum_of_q(int64_t q, int f) { return ldexp((double)q, -f); }

static float max_scalar(const float *x, int64_t i, int64_t n, float m) {
    for (; i < n; i++)
        if (x[i] > m) m = x[i];
    return m;
}

/* The first j in [i, n) with x[j] == v (above = 0) or x[j] > v (above =
 * 1), n when none: di_row_find and di_row_next_above. */
static int64_t first_scalar(const float *x, int64_t i, int64_t n, float v, int above) {
    while (i < n && !(above ? x[i] > v : x[i] == v)) i++;
    return i;
}

#if defined(DI_SAMPLER_AVX2)
#define AVX2 __attribute__((target("avx2,fma")))

/* keep_nan: NaN lanes give NaN (e^x per value); 0 where the caller turns
 * any NaN of the row into NaN itself (the sum), which spares the blend.
 * fnmadd(n, c, a) = -(n·c) + a is fma(-n, c, a) bit for bit. Lanes below
 * 2^-125 are rare (a row's values more than ~87 below its maximum), so the
 * second scaling runs only where a vector holds one. */
AVX2 static inline __attribute__((always_inline)) __m256 exp8(__m256 x, const int keep_nan) {
    const __m256 a = _mm256_min_ps(x, _mm256_setzero_ps()); /* +0 for ±0, as exp1 */
    const __m256 low = _mm256_cmp_ps(a, _mm256_set1_ps(DI_RS_EXP_MIN), _CMP_LT_OQ);
    const __m256 n = _mm256_round_ps(_mm256_mul_ps(a, _mm256_set1_ps(DI_RS_LOG2E)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DI_RS_LN2_HI), a);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(DI_RS_LN2_LO), r);
    __m256 p = _mm256_set1_ps(1.0f / 40320.0f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 5040.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 720.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 120.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 24.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f / 6.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.0f));
    /* 2^n, in two steps below 2^-125 (one rounding of a subnormal result) */
    const __m256i ni = _mm256_cvtps_epi32(n);
    const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(127)), 23));
    __m256 v = _mm256_mul_ps(p, s1);
    const __m256 sub = _mm256_castsi256_ps(_mm256_cmpgt_epi32(_mm256_set1_epi32(-125), ni));
    if (!_mm256_testz_ps(sub, sub)) {
        const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(ni, _mm256_set1_epi32(64 + 127)), 23));
        const __m256 lo = _mm256_mul_ps(_mm256_mul_ps(p, s2), _mm256_castsi256_ps(_mm256_set1_epi32((127 - 64) << 23)));
        v = _mm256_blendv_ps(v, lo, sub);
    }
    v = _mm256_andnot_ps(low, v);
    return keep_nan ? _mm256_blendv_ps(v, x, _mm256_cmp_ps(x, x, _CMP_UNORD_Q)) : v;
}

AVX2 static float max_avx2(const float *x, int64_t n) {
    __m256 m = _mm256_set1_ps(-INFINITY);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m); /* a NaN lane keeps m */
    float l[8];
    _mm256_storeu_ps(l, m);
    float r = max_scalar(l, 0, 8, -INFINITY);
    return max_scalar(x, i, n, r);
}

AVX2 static int64_t first_avx2(const float *x, int64_t i, int64_t n, float v, int above) {
    const __m256 vv = _mm256_set1_ps(v);
    for (; i + 8 <= n; i += 8) {
        const __m256 xv = _mm256_loadu_ps(x + i);
        const __m256 hitv = above ? _mm256_cmp_ps(xv, vv, _CMP_GT_OQ) : _mm256_cmp_ps(xv, vv, _CMP_EQ_OQ);
        const int hit = _mm256_movemask_ps(hitv);
        if (hit) return i + __builtin_ctz((unsigned)hit);
    }
    return first_scalar(x, i, n, v, above);
}

AVX2 static void exp_avx2(const float *x, int64_t n, float shift, float scale, float *out) {
    const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(out + i, exp8(_mm256_mul_ps(_mm256_sub_ps(_mm256_loadu_ps(x + i), sh), sc), 1));
    for (; i < n; i++) out[i] = exp1((x[i] - shift) * scale);
}

/* The terms' raw bits (t · 2^F + 1.5 · 2^52 as doubles, one FMA: the
 * product is exact) are added as they are and the offsets taken off once
 * at the end, in unsigned 64-bit arithmetic, whose wrap-around gives the
 * same total. */
AVX2 static double sum_avx2(const float *x, int64_t n, float shift) {
    const int f = di_row_sum_frac_bits(n);
    const float scale = ldexpf(1.0f, f);
    const __m256 sh = _mm256_set1_ps(shift);
    const __m256d magic = _mm256_set1_pd(DI_ROW_MAGIC), sc = _mm256_set1_pd((double)scale);
    __m256i q0 = _mm256_setzero_si256(), q1 = _mm256_setzero_si256();
    __m256 bad = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        const __m256 v = _mm256_loadu_ps(x + i);
        bad = _mm256_or_ps(bad, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
        const __m256 e = exp8(_mm256_sub_ps(v, sh), 0); /* NaN: the row's sum is NaN */
        const __m256d lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(e)), sc, magic);
        const __m256d hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)), sc, magic);
        q0 = _mm256_add_epi64(q0, _mm256_castpd_si256(lo));
        q1 = _mm256_add_epi64(q1, _mm256_castpd_si256(hi));
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, _mm256_add_epi64(q0, q1));
    const union { double d; uint64_t u; } mb = {.d = DI_ROW_MAGIC};
    int64_t q = (int64_t)(l[0] + l[1] + l[2] + l[3] - (uint64_t)i * mb.u);
    int any_nan = _mm256_movemask_ps(bad) != 0;
    for (; i < n; i++) {
        any_nan |= x[i] != x[i];
        q += term_q(exp_sum1(x[i] - shift), scale);
    }
    return any_nan ? NAN : sum_of_q(q, f);
}

/* The kept terms of a sampler's row (e >= cut and e > 0; NaN never): a
 * lane that is not kept is zeroed before it becomes a term (q(0) = 0), so
 * every lane adds its raw bits and the offsets come off at the end. */
AVX2 static inline __attribute__((always_inline)) __m256i kept_q8(__m256 v, __m256 cut, __m256d sc, __m256d magic,
                                                                  int *bits) {
    const __m256 m = _mm256_and_ps(_mm256_cmp_ps(v, cut, _CMP_GE_OQ), _mm256_cmp_ps(v, _mm256_setzero_ps(), _CMP_GT_OQ));
    const __m256 k = _mm256_and_ps(v, m);
    *bits = _mm256_movemask_ps(m);
    const __m256d lo = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(k)), sc, magic);
    const __m256d hi = _mm256_fmadd_pd(_mm256_cvtps_pd(_mm256_extractf128_ps(k, 1)), sc, magic);
    return _mm256_add_epi64(_mm256_castpd_si256(lo), _mm256_castpd_si256(hi)); /* two lanes' raw bits each */
}

AVX2 static uint64_t kept_sum_avx2(const float *e, int64_t n, float cut, int f, int64_t *count, int32_t *idx) {
    const __m256 c = _mm256_set1_ps(cut);
    const __m256d magic = _mm256_set1_pd(DI_ROW_MAGIC), sc = _mm256_set1_pd(ldexp(1.0, f));
    __m256i q = _mm256_setzero_si256();
    int64_t i = 0, k = 0;
    for (; i + 8 <= n; i += 8) {
        int bits;
        q = _mm256_add_epi64(q, kept_q8(_mm256_loadu_ps(e + i), c, sc, magic, &bits));
        if (idx)
            for (unsigned b = (unsigned)bits; b; b &= b - 1) idx[k++] = (int32_t)(i + __builtin_ctz(b));
        else
            k += __builtin_popcount((unsigned)bits);
    }
    uint64_t l[4];
    _mm256_storeu_si256((__m256i *)l, q);
    const union { double d; uint64_t u; } mb = {.d = DI_ROW_MAGIC};
    uint64_t s = l[0] + l[1] + l[2] + l[3] - (uint64_t)i * mb.u;
    for (; i < n; i++)
        if (e[i] >= cut && e[i] > 0.0f) {
            s += (uint64_t)di_row_term_q(e[i], f);
            if (idx) idx[k] = (int32_t)i;
            k++;
        }
    *count = k;
    return s;
}

AVX2 static int64_t kept_cross_avx2(const float *e, int64_t n, float cut, int f, double lim) {
    const __m256 c = _mm256_set1_ps(cut);
    const __m256d magic = _mm256_set1_pd(DI_ROW_MAGIC), sc = _mm256_set1_pd(ldexp(1.0, f));
    const union { double d; uint64_t u; } mb = {.d = DI_ROW_MAGIC};
    uint64_t acc = 0;
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) {
        int bits;
        uint64_t l[4];
        _mm256_storeu_si256((__m256i *)l, kept_q8(_mm256_loadu_ps(e + i), c, sc, magic, &bits));
        const uint64_t b = l[0] + l[1] + l[2] + l[3] - 8 * mb.u;
        if ((double)(acc + b) > lim) break; /* the crossing is in this block: by lanes below */
        acc += b;
    }
    for (; i < n; i++)
        if (e[i] >= cut && e[i] > 0.0f) {
            acc += (uint64_t)di_row_term_q(e[i], f);
            if ((double)acc > lim) return i;
        }
    return -1;
}
#endif

/* read by every sampling thread: atomics, relaxed (any thread may be the
 * first to ask the CPU; they all get the same answer) */
static atomic_int scalar_forced = 0;
void di_row_exp_force_scalar(int on) { atomic_store_explicit(&scalar_forced, on, memory_order_relaxed); }

static int use_avx2(void) {
#if defined(DI_SAMPLER_AVX2)
    static atomic_int have = -1;
    int h = atomic_load_explicit(&have, memory_order_relaxed);
    if (h < 0) {
        h = di_cpu_has_avx2();
        atomic_store_explicit(&have, h, memory_order_relaxed);
    }
    return h && !atomic_load_explicit(&scalar_forced, memory_order_relaxed);
#else
    return 0;
#endif
}

float di_row_max(const float *x, int64_t n) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) return max_avx2(x, n);
#endif
    return max_scalar(x, 0, n, -INFINITY);
}

static int64_t row_first(const float *x, int64_t i, int64_t n, float v, int above) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) return first_avx2(x, i, n, v, above);
#endif
    return first_scalar(x, i, n, v, above);
}

int64_t di_row_find(const float *x, int64_t n, float v) { return row_first(x, 0, n, v, 0); }

int64_t di_row_next_above(const float *x, int64_t i, int64_t n, float t) { return row_first(x, i, n, t, 1); }

void di_row_exp(const float *x, int64_t n, float shift, float scale, float *out) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) {
        exp_avx2(x, n, shift, scale, out);
        return;
    }
#endif
    for (int64_t i = 0; i < n; i++) out[i] = exp1((x[i] - shift) * scale);
}

double di_row_sum_exp(const float *x, int64_t n, float shift) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) return sum_avx2(x, n, shift);
#endif
    const int f = di_row_sum_frac_bits(n);
    const float scale = ldexpf(1.0f, f);
    int64_t q = 0;
    int any_nan = 0;
    for (int64_t i = 0; i < n; i++) {
        any_nan |= x[i] != x[i];
        q += term_q(exp_sum1(x[i] - shift), scale);
    }
    return any_nan ? NAN : sum_of_q(q, f);
}

uint64_t di_row_kept_sum(const float *e, int64_t n, float cut, int frac, int64_t *count, int32_t *idx) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) return kept_sum_avx2(e, n, cut, frac, count, idx);
#endif
    uint64_t s = 0;
    int64_t k = 0;
    for (int64_t i = 0; i < n; i++)
        if (e[i] >= cut && e[i] > 0.0f) {
            s += (uint64_t)di_row_term_q(e[i], frac);
            if (idx) idx[k] = (int32_t)i;
            k++;
        }
    *count = k;
    return s;
}

int64_t di_row_kept_cross(const float *e, int64_t n, float cut, int frac, double lim) {
#if defined(DI_SAMPLER_AVX2)
    if (use_avx2()) return kept_cross_avx2(e, n, cut, frac, lim);
#endif
    uint64_t acc = 0;
    for (int64_t i = 0; i < n; i++)
        if (e[i] >= cut && e[i] > 0.0f) {
            acc += (uint64_t)di_row_term_q(e[i], frac);
            if ((double)acc > lim) return i;
        }
    return -1;
}

/* whether (a, ia) comes before (b, ib) in di_row_top_of's order */
static int top_before(float a, int32_t ia, float b, int32_t ib) {
    if (isnan(a)) return isnan(b) && ia < ib;
    if (isnan(b) || a > b) return 1;
    return a == b && ia < ib;
}

void di_row_top_of(const float *x, int64_t V, int32_t k, di_row_top *out) {
    if (k > V) k = (int32_t)V;
    int32_t n = 0;
    for (int64_t i = 0; i < V; i++) {
        /* ids ascend, so an entry never goes before an equal one in the list */
        if (n == k && !top_before(x[i], (int32_t)i, out[k - 1].x, out[k - 1].id)) continue;
        int32_t j = n < k ? n++ : k - 1;
        while (j > 0 && top_before(x[i], (int32_t)i, out[j - 1].x, out[j - 1].id)) {
            out[j] = out[j - 1];
            j--;
        }
        out[j] = (di_row_top){(int32_t)i, x[i]};
    }
}

void di_row_greedy_of(const float *x, int64_t V, int64_t lim, int32_t ban, di_row_greedy *g) {
    if (lim > V) lim = V;
    if (lim < 0) lim = 0;
    /* the search on the ranges either side of ban; a maximum does not
     * depend on the order it is taken in (but for the sign of a zero, which
     * neither the search nor the differences below see) */
    const int64_t b = ban >= 0 && ban < lim ? ban : lim;
    const float m1 = di_row_max(x, b), m2 = b < lim ? di_row_max(x + b + 1, lim - b - 1) : -INFINITY;
    const float m = m2 > m1 ? m2 : m1;
    g->max = m + 0.0f; /* a zero maximum as +0, whichever zero was found first */
    g->token = -1;
    if (m != -INFINITY) {
        const int64_t i = di_row_find(x, b, m);
        g->token = (int32_t)(i < b ? i : b + 1 + di_row_find(x + b + 1, lim - b - 1, m));
    }
    float all = m;
    if (b < lim && x[b] > all) all = x[b];
    if (lim < V) {
        const float t = di_row_max(x + lim, V - lim);
        if (t > all) all = t;
    }
    g->max_all = all + 0.0f;
    g->pad = 0;
    g->sum = di_row_sum_exp(x, V, g->max_all);
}

double di_row_greedy_lse(const di_row_greedy *g) { return (double)g->max_all + log(g->sum); }
