/* Sampler: the counter-based generator, greedy and the exponential race
 * against exact softmax frequencies, top-k / top-p / min-p supports,
 * penalties, bias, min_tokens, masks, forced tokens, logprobs. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/sampler.h"
#include "core/row_exp.h"
#include "test.h"
#include "draw_ref.h"

static void test_rng(void) {
    CHECK(di_rng_bits(1, 2, 3, 4) == di_rng_bits(1, 2, 3, 4));
    CHECK(di_rng_bits(1, 2, 3, 4) != di_rng_bits(1, 2, 3, 5));
    CHECK(di_rng_bits(1, 2, 3, 4) != di_rng_bits(2, 2, 3, 4));
    CHECK(di_rng_bits(1, 2, 3, 4) != di_rng_bits(1, 3, 3, 4));
    /* Exp(1): mean 1, variance 1; each output bit set half the time */
    const int N = 200000;
    double s = 0, s2 = 0;
    int bits[64] = {0};
    for (int i = 0; i < N; i++) {
        double e = di_rng_exp(42, 0, (uint64_t)i, 7);
        s += e;
        s2 += e * e;
        uint64_t b = di_rng_bits(42, 1, (uint64_t)i, 7);
        for (int k = 0; k < 64; k++) bits[k] += (int)((b >> k) & 1);
    }
    double mean = s / N, var = s2 / N - mean * mean;
    CHECKF(fabs(mean - 1) < 0.01, "mean %f", mean);
    CHECKF(fabs(var - 1) < 0.03, "var %f", var);
    int worst = 0;
    for (int k = 0; k < 64; k++)
        if (abs(bits[k] - N / 2) > worst) worst = abs(bits[k] - N / 2);
    CHECKF(worst < 2000, "bit bias %d of %d", worst, N);
}

static di_sampler_params plain(double t) {
    di_sampler_params p = {.temperature = t, .top_p = 1, .repetition_penalty = 1, .eos_id = -1, .seed = 99};
    return p;
}

static int32_t draw(di_sampler *s, const di_sampler_params *p, const float *lg, uint64_t stream,
                    const int32_t *out, int64_t n_out, const uint32_t *mask) {
    di_sample_in in = {.output = out, .n_output = n_out, .mask = mask, .forced = -1, .stream = stream};
    di_sample_out o;
    di_sampler_sample(s, p, &in, lg, &o);
    return o.token;
}

/* Empirical frequencies over many independent draws vs expected. */
static double freq_err(di_sampler *s, const di_sampler_params *p, const float *lg, const double *expect, int V) {
    const int N = 40000;
    int cnt[16] = {0};
    for (int i = 0; i < N; i++) {
        int32_t t = draw(s, p, lg, (uint64_t)i, NULL, 0, NULL);
        if (t >= 0 && t < V) cnt[t]++;
    }
    double worst = 0;
    for (int v = 0; v < V; v++) {
        double d = fabs((double)cnt[v] / N - expect[v]);
        if (d > worst) worst = d;
    }
    return worst;
}

static void softmax(const float *lg, int V, double T, double *p) {
    double mx = -1e300, sum = 0;
    for (int i = 0; i < V; i++) mx = fmax(mx, lg[i] / T);
    for (int i = 0; i < V; i++) sum += p[i] = exp(lg[i] / T - mx);
    for (int i = 0; i < V; i++) p[i] /= sum;
}

static void test_distribution(void) {
    di_sampler s;
    CHECK(di_sampler_init(&s, 6) == 0);
    float lg[6] = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f, 0.0f};
    double p[6];
    for (int k = 0; k < 2; k++) {
        double T = k ? 0.5 : 1.0;
        di_sampler_params sp = plain(T);
        softmax(lg, 6, T, p);
        double e = freq_err(&s, &sp, lg, p, 6);
        CHECKF(e < 0.01, "T=%g max frequency error %f", T, e);
    }
    /* top-k 2: only tokens 1 and 4, renormalised */
    di_sampler_params sp = plain(1.0);
    sp.top_k = 2;
    double q[6] = {0};
    q[1] = exp(2.0) / (exp(2.0) + exp(1.5));
    q[4] = 1 - q[1];
    CHECKF(freq_err(&s, &sp, lg, q, 6) < 0.01, "top_k");
    /* top-p: sorted probs; keep the smallest prefix reaching top_p */
    softmax(lg, 6, 1.0, p); /* order: 1, 4, 0, 2, 5, 3 */
    sp = plain(1.0);
    sp.top_p = p[1] + p[4] + 0.5 * p[0];
    double r[6] = {0};
    double z = p[1] + p[4] + p[0];
    r[1] = p[1] / z, r[4] = p[4] / z, r[0] = p[0] / z;
    CHECKF(freq_err(&s, &sp, lg, r, 6) < 0.01, "top_p");
    /* min-p: keep p >= min_p * p_max */
    sp = plain(1.0);
    sp.min_p = exp(-0.75); /* keeps logits >= 1.25: tokens 1, 4 */
    CHECKF(freq_err(&s, &sp, lg, q, 6) < 0.01, "min_p");
    /* same (seed, stream, position) → same token; different seed → a
     * different sequence of draws */
    sp = plain(1.0);
    int same = 1, diff = 0;
    di_sampler_params sp2 = sp;
    sp2.seed = 100;
    for (int i = 0; i < 200; i++) {
        same &= draw(&s, &sp, lg, 3, NULL, 0, NULL) == draw(&s, &sp, lg, 3, NULL, 0, NULL);
        diff += draw(&s, &sp, lg, (uint64_t)i, NULL, 0, NULL) != draw(&s, &sp2, lg, (uint64_t)i, NULL, 0, NULL);
    }
    CHECK(same);
    CHECKF(diff > 60, "%d of 200 draws differ between seeds", diff);
    di_sampler_free(&s);
}

static void test_greedy_and_processing(void) {
    di_sampler s;
    CHECK(di_sampler_init(&s, 5) == 0);
    di_sampler_params p = plain(0);
    float lg[5] = {1.0f, 3.0f, 3.0f, -2.0f, 0.9f};
    CHECK_EQ_INT(draw(&s, &p, lg, 0, NULL, 0, NULL), 1); /* tie → lower id */
    /* repetition penalty 2 on tokens 1 and 3 (in the output): 3 → 1.5 */
    int32_t out[2] = {1, 3};
    p.repetition_penalty = 2;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out, 2, NULL), 2);
    float lg2[5] = {-1.0f, -1.2f, -5, -5, -5};
    int32_t out2[1] = {0};
    CHECK_EQ_INT(draw(&s, &p, lg2, 0, out2, 1, NULL), 1); /* -1 * 2 = -2 < -1.2 */
    /* frequency penalty 0.3 × count 2 on token 1: 3 - 0.6 < 3 */
    p = plain(0);
    int32_t out3[3] = {1, 1, 0};
    p.frequency_penalty = 0.3;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out3, 3, NULL), 2);
    /* presence penalty once per distinct token */
    p = plain(0);
    p.presence_penalty = 0.05;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out3, 3, NULL), 2);
    /* logit bias */
    p = plain(0);
    int32_t bid[1] = {4};
    float bval[1] = {2.5f};
    p.bias_ids = bid, p.bias_values = bval, p.n_bias = 1;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, NULL, 0, NULL), 4);
    /* min_tokens masks EOS and stop ids until reached; ignore_eos always */
    p = plain(0);
    p.eos_id = 1;
    int32_t sid[1] = {2};
    p.stop_ids = sid, p.n_stop_ids = 1, p.min_tokens = 2;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out, 1, NULL), 0);
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out, 2, NULL), 1);
    p.ignore_eos = 1;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, out, 2, NULL), 2);
    /* mask: only token 3; nothing allowed → -1 */
    p = plain(0.7);
    uint32_t m = 1u << 3, none = 0;
    CHECK_EQ_INT(draw(&s, &p, lg, 0, NULL, 0, &m), 3);
    CHECK_EQ_INT(draw(&s, &p, lg, 0, NULL, 0, &none), -1);
    /* forced */
    di_sample_in in = {.forced = 4, .stream = 0};
    di_sample_out o;
    di_sampler_sample(&s, &p, &in, lg, &o);
    CHECK_EQ_INT(o.token, 4);
    double z = 0;
    for (int i = 0; i < 5; i++) z += exp(lg[i]);
    CHECKF(fabs(o.logprob - (0.9 - log(z))) < 1e-5, "forced logprob %f", o.logprob);
    CHECK_EQ_INT(o.rank, 4);
    di_sampler_free(&s);
}

static void test_logprob_top(void) {
    float lg[6] = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f, -3.0f};
    int32_t ids[3];
    float lp[3];
    int32_t rank;
    float l = di_logprob_top(lg, 6, 4, 3, ids, lp, &rank);
    double z = 0;
    for (int i = 0; i < 6; i++) z += exp(lg[i]);
    CHECKF(fabs(l - (1.0 - log(z))) < 1e-6, "%f", l);
    CHECK_EQ_INT(ids[0], 1);
    CHECK_EQ_INT(ids[1], 3);
    CHECK_EQ_INT(ids[2], 4);
    CHECKF(fabs(lp[0] - (2.0 - log(z))) < 1e-6, "%f", lp[0]);
    CHECK_EQ_INT(rank, 3);
}

/* A wide vocabulary with a long tail: top-k / top-p supports equal the
 * ones computed by sorting everything (the sampler sorts only the head
 * when that is provably enough). */
static void test_wide_vocab(void) {
    enum { V = 5000 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float lg[V];
    for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(3, (uint64_t)i, 0, 0) % 100000) / 2500.0f - 30.0f;
    /* reference order: by logit, then id */
    static int32_t ord[V];
    for (int i = 0; i < V; i++) ord[i] = i;
    for (int i = 1; i < V; i++) { /* insertion sort: V is small enough */
        int32_t t = ord[i];
        int j = i;
        while (j > 0 && (lg[ord[j - 1]] < lg[t] || (lg[ord[j - 1]] == lg[t] && ord[j - 1] > t))) {
            ord[j] = ord[j - 1];
            j--;
        }
        ord[j] = t;
    }
    double tot = 0, mx = lg[ord[0]];
    for (int i = 0; i < V; i++) tot += exp(lg[i] - mx);
    double ps[3] = {0.5, 0.9, 0.999999};
    for (int q = 0; q < 3; q++) {
        int nucleus = 0;
        double acc = 0;
        while (nucleus < V) {
            acc += exp(lg[ord[nucleus]] - mx);
            nucleus++;
            if (acc >= ps[q] * tot) break;
        }
        static unsigned char in[V];
        memset(in, 0, sizeof in);
        for (int i = 0; i < nucleus; i++) in[ord[i]] = 1;
        di_sampler_params p = plain(1.0);
        p.top_p = ps[q];
        int outside = 0;
        for (int i = 0; i < 1000; i++) {
            int32_t t = draw(&s, &p, lg, (uint64_t)i, NULL, 0, NULL);
            outside += !in[t];
        }
        CHECKF(outside == 0, "top_p %g: %d draws outside the nucleus of %d", ps[q], outside, nucleus);
    }
    di_sampler_params p = plain(1.0);
    p.top_k = 3;
    int outside = 0;
    for (int i = 0; i < 1000; i++) {
        int32_t t = draw(&s, &p, lg, (uint64_t)i, NULL, 0, NULL);
        outside += t != ord[0] && t != ord[1] && t != ord[2];
    }
    CHECK_EQ_INT(outside, 0);
    /* top-k of 50 over a tie-heavy row: the support is the first 50 by
     * (value descending, id ascending), and most of it gets drawn */
    for (int i = 0; i < V; i++) lg[i] = (float)((i * 7919) % 40) / 4.0f;
    static int32_t ord2[V];
    int n2 = 0;
    for (int v = 39; v >= 0 && n2 < V; v--) /* by value, then id: a counting sort */
        for (int i = 0; i < V; i++)
            if ((i * 7919) % 40 == v) ord2[n2++] = i;
    static unsigned char in50[V], hit[V];
    memset(in50, 0, sizeof in50);
    memset(hit, 0, sizeof hit);
    for (int i = 0; i < 50; i++) in50[ord2[i]] = 1;
    p = plain(5.0);
    p.top_k = 50;
    outside = 0;
    int distinct = 0;
    for (int i = 0; i < 4000; i++) {
        int32_t t = draw(&s, &p, lg, (uint64_t)i, NULL, 0, NULL);
        outside += t < 0 || !in50[t];
        if (t >= 0 && !hit[t]) hit[t] = 1, distinct++;
    }
    CHECKF(outside == 0 && distinct == 50, "top-50 of ties: %d draws outside, %d distinct", outside, distinct);
    for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(3, (uint64_t)i, 0, 0) % 100000) / 2500.0f - 30.0f;
    int32_t ids[5];
    float lp[5];
    di_logprob_top(lg, V, 0, 5, ids, lp, NULL);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(ids[i], ord[i]);
    di_sampler_free(&s);
}

/* The row exponentials (core/row_exp.h): the AVX2 loops and the scalar
 * mirror give the same bits; e^min(a, 0) within 2 ulp of the exact value
 * where the result is normal, 0 below -104 and for -inf, NaN for NaN; the
 * sum in double against an exact sum; the max ignores NaN. Lengths that are
 * not multiples of 8 take the tails. */
static double exp_ref(float a) { return a > 0 ? 1.0 : a < -104.0f ? 0.0 : exp((double)a); }

static float xs_find[40];

static void test_row_exp(void) {
    enum { N = 4099 };
    static float x[N], ea[N], es[N];
    for (int i = 0; i < N; i++)
        x[i] = (float)(di_rng_bits(7, (uint64_t)i, 0, 0) % 1120000) / 10000.0f - 110.0f; /* [-110, 2) */
    x[5] = -INFINITY, x[17] = 0.0f, x[18] = -0.0f, x[33] = -104.0f, x[34] = -104.001f, x[35] = -87.34f;
    x[40] = 88.5f, x[41] = -1e-30f, x[42] = -0.34657f, x[43] = -0.34658f, x[44] = -100.0f;
    di_row_exp(x, N, 0.0f, 1.0f, ea);
    di_row_exp_force_scalar(1);
    di_row_exp(x, N, 0.0f, 1.0f, es);
    double ss = di_row_sum_exp(x, N, 1.5f);
    float ms = di_row_max(x, N);
    di_row_exp_force_scalar(0);
    double sa = di_row_sum_exp(x, N, 1.5f);
    float ma = di_row_max(x, N);
    int differ = 0, off = 0;
    for (int i = 0; i < N; i++) {
        differ += memcmp(&ea[i], &es[i], 4) != 0;
        double ref = exp_ref(x[i]);
        if (ref == 0) off += ea[i] != 0.0f;
        else if (ref >= 0x1p-126 && fabs(ea[i] - ref) > 2 * ref * 0x1p-24) off++;
    }
    CHECKF(differ == 0, "%d of %d exponentials differ between AVX2 and scalar", differ, N);
    CHECKF(off == 0, "%d exponentials off by more than 2 ulp", off);
    CHECK(ea[5] == 0.0f && ea[17] == 1.0f && ea[18] == 1.0f && ea[34] == 0.0f && ea[44] > 0.0f && ea[40] == 1.0f);
    CHECK(memcmp(&sa, &ss, sizeof sa) == 0 && ma == ms);
    double exact = 0;
    float mx = -INFINITY;
    for (int i = 0; i < N; i++) {
        exact += exp_ref(x[i] - 1.5f); /* the difference as the function forms it */
        if (x[i] > mx) mx = x[i];
    }
    CHECKF(fabs(sa - exact) <= 4e-7 * exact, "sum %.17g, exact %.17g", sa, exact);
    CHECK(ma == mx);
    /* NaN: ignored by the max, poisons the sum (the scalar form too) */
    x[100] = NAN;
    CHECK(di_row_max(x, N) == mx);
    CHECK(isnan(di_row_sum_exp(x, N, 0.0f)));
    di_row_exp(x, N, 0.0f, 1.0f, ea);
    CHECK(isnan(ea[100]));
    di_row_exp_force_scalar(1);
    CHECK(isnan(di_row_sum_exp(x, N, 0.0f)) && di_row_max(x, N) == mx);
    di_row_exp_force_scalar(0);
    CHECK(di_row_max(x, 0) == -INFINITY);
    /* +inf logits at a +inf maximum: each a term of 1 (not NaN), in the
     * vector loop and its tail, AVX2 and scalar alike */
    x[100] = 1.0f, x[7] = INFINITY, x[N - 2] = INFINITY;
    const double si = di_row_sum_exp(x, N, INFINITY);
    di_row_exp_force_scalar(1);
    const double ss2 = di_row_sum_exp(x, N, INFINITY);
    di_row_exp_force_scalar(0);
    CHECKF(si == 2.0 && ss2 == 2.0, "+inf terms: %g / %g", si, ss2);
    /* the sum's definition: each term rint(t · 2^F) (ties to even), their
     * integer total times 2^-F; the same bits in any order of the row
     * (reversed, and rotated by 3: every vector sees other neighbours) */
    x[100] = -3.0f, x[7] = -0.5f, x[N - 2] = -7.25f;
    di_row_exp(x, N, 1.5f, 1.0f, ea);
    const int fb = di_row_sum_frac_bits(N);
    CHECK_EQ_INT(fb, 49); /* 4,099 terms: 13 bits */
    CHECK_EQ_INT(di_row_sum_frac_bits(7), 50); /* capped */
    CHECK_EQ_INT(di_row_sum_frac_bits(129280), 45);
    long long qs = 0;
    for (int i = 0; i < N; i++) qs += llrint(ldexp((double)ea[i], fb));
    const double sdef = ldexp((double)qs, -fb);
    for (int scalar = 0; scalar < 2; scalar++) {
        di_row_exp_force_scalar(scalar);
        for (int i = 0; i < N; i++) es[i] = x[N - 1 - i];
        const double s0 = di_row_sum_exp(x, N, 1.5f), s1 = di_row_sum_exp(es, N, 1.5f);
        for (int i = 0; i < N; i++) es[i] = x[(i + 3) % N];
        const double s2 = di_row_sum_exp(es, N, 1.5f);
        CHECKF(s0 == sdef && s1 == sdef && s2 == sdef, "%s sum %.17g, reversed %.17g, rotated %.17g, defined %.17g",
               scalar ? "scalar" : "AVX2", s0, s1, s2, sdef);
    }
    di_row_exp_force_scalar(0);
    /* di_row_find: the first place of a value, AVX2 and scalar alike; at
     * every place of a short row (the 8-wide loop and its tail), a value
     * seen twice, a value absent, -0 found as 0 */
    for (int len = 1; len <= 40; len++)
        for (int at = 0; at < len; at++) {
            for (int i = 0; i < len; i++) xs_find[i] = (float)i;
            xs_find[at] = 1000.0f;
            if (at + 3 < len) xs_find[at + 3] = 1000.0f;
            int64_t fa = di_row_find(xs_find, len, 1000.0f), fb = di_row_find(xs_find, len, 2000.0f);
            di_row_exp_force_scalar(1);
            int64_t fs = di_row_find(xs_find, len, 1000.0f);
            di_row_exp_force_scalar(0);
            CHECKF(fa == at && fs == at && fb == len, "find len %d at %d: %lld / %lld / %lld", len, at,
                   (long long)fa, (long long)fs, (long long)fb);
        }
    xs_find[0] = 1.0f, xs_find[1] = -0.0f, xs_find[2] = 0.0f;
    CHECK(di_row_find(xs_find, 3, 0.0f) == 1);
    /* di_row_next_above: from every start, against every threshold of a
     * short row with ties and a NaN, AVX2 and scalar alike and equal to a
     * plain scan; a NaN threshold: nothing is above it */
    for (int len = 1; len <= 37; len += 3) {
        for (int i = 0; i < len; i++) xs_find[i] = (float)(di_rng_bits(19, (uint64_t)len, (uint64_t)i, 0) % 7);
        if (len > 10) xs_find[len / 2] = NAN;
        for (int st = 0; st <= len; st++)
            for (int th = -1; th <= 7; th++) {
                int64_t ref = st;
                while (ref < len && !(xs_find[ref] > (float)th)) ref++;
                int64_t a = di_row_next_above(xs_find, st, len, (float)th);
                di_row_exp_force_scalar(1);
                int64_t b = di_row_next_above(xs_find, st, len, (float)th);
                di_row_exp_force_scalar(0);
                CHECKF(a == ref && b == ref, "next_above len %d from %d over %d: %lld / %lld, want %lld", len, st,
                       th, (long long)a, (long long)b, (long long)ref);
            }
        CHECK(di_row_next_above(xs_find, 0, len, NAN) == len);
    }
    /* a dense sweep of [-104, 0]: every lane form equal to the scalar one */
    enum { M = 1 << 20 };
    float *xs = malloc(M * sizeof *xs), *va = malloc(M * sizeof *va), *vs = malloc(M * sizeof *vs);
    for (int i = 0; i < M; i++) xs[i] = -104.0f * (float)i / (float)M;
    di_row_exp(xs, M, 0.0f, 1.0f, va);
    di_row_exp_force_scalar(1);
    di_row_exp(xs, M, 0.0f, 1.0f, vs);
    di_row_exp_force_scalar(0);
    CHECKF(memcmp(va, vs, M * sizeof *va) == 0, "the sweep: AVX2 and scalar exponentials differ");
    free(xs);
    free(va);
    free(vs);
}

/* Greedy without a mask (its own pass) against greedy with a mask that
 * allows everything (the candidate list): the same token and logprob on
 * rows with ties, NaNs, -inf and signed zeros; all -inf or NaN: no token.
 * The same for temperature draws (with top-p, top-k, min-p). */
static void test_greedy_fast_path(void) {
    enum { V = 1000 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float lg[V];
    static uint32_t all[(V + 31) / 32];
    for (int i = 0; i < (V + 31) / 32; i++) all[i] = 0xffffffffu;
    di_sampler_params p = plain(0);
    for (int r = 0; r < 40; r++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(11, (uint64_t)r, (uint64_t)i, 0) % 64) / 8.0f - 4.0f;
        if (r % 3 == 0) lg[(r * 37) % V] = NAN;
        if (r % 4 == 0) lg[(r * 53) % V] = -INFINITY;
        if (r == 5) for (int i = 0; i < V; i++) lg[i] = i % 2 ? 0.0f : -0.0f;
        if (r == 6) for (int i = 0; i < V; i++) lg[i] = i == 700 ? 1.0f : NAN;
        di_sample_in a = {.forced = -1}, b = {.mask = all, .forced = -1};
        di_sample_out oa, ob, oc;
        di_sampler_sample(&s, &p, &a, lg, &oa);
        di_sampler_sample(&s, &p, &b, lg, &ob);
        CHECKF(oa.token == ob.token && (memcmp(&oa.logprob, &ob.logprob, 4) == 0),
               "row %d: %d (%g) != %d (%g)", r, oa.token, oa.logprob, ob.token, ob.logprob);
        /* a bias of +0 takes the greedy pass over the processed copy: the same */
        const int32_t bid = 3;
        const float bval = 0.0f;
        di_sampler_params pb = p;
        pb.bias_ids = &bid, pb.bias_values = &bval, pb.n_bias = 1;
        di_sampler_sample(&s, &pb, &a, lg, &oc);
        CHECKF(oa.token == oc.token && (memcmp(&oa.logprob, &oc.logprob, 4) == 0),
               "row %d, +0 bias: %d (%g) != %d (%g)", r, oa.token, oa.logprob, oc.token, oc.logprob);
        if (r == 5) CHECK_EQ_INT(oa.token, 0);
        if (r == 6) CHECK_EQ_INT(oa.token, 700);
        /* banned tokens (EOS under ignore_eos; EOS and a stop id before
         * min_tokens), the first maximum among them or not: the pass over
         * the row against the processed copy (+0 bias) */
        for (int ban = 0; ban < 4; ban++) {
            di_sampler_params q = p;
            const int32_t stop = oa.token >= 0 ? oa.token : 9;
            q.eos_id = ban % 2 ? (oa.token >= 0 ? oa.token : 1) : (r * 7) % V;
            if (ban < 2) q.ignore_eos = 1;
            else q.stop_ids = &stop, q.n_stop_ids = 1, q.min_tokens = 3, q.eos_id = (r * 11) % V;
            di_sampler_params qb = q;
            qb.bias_ids = &bid, qb.bias_values = &bval, qb.n_bias = 1;
            di_sample_in in = {.forced = -1, .n_output = 1};
            di_sample_out od, oe;
            di_sampler_sample(&s, &q, &in, lg, &od);
            di_sampler_sample(&s, &qb, &in, lg, &oe);
            CHECKF(od.token == oe.token && (memcmp(&od.logprob, &oe.logprob, 4) == 0),
                   "row %d, ban %d: %d (%g) != %d (%g)", r, ban, od.token, od.logprob, oe.token, oe.logprob);
            if (ban % 2 && oa.token >= 0) CHECKF(od.token != oa.token, "row %d, ban %d: the banned maximum drawn", r, ban);
        }
    }
    /* temperature draws too: the whole-row pass against the candidate list */
    for (int r = 0; r < 30; r++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(13, (uint64_t)r, (uint64_t)i, 0) % 4096) / 512.0f - 4.0f;
        if (r % 3 == 0) lg[(r * 37) % V] = NAN;
        if (r % 4 == 0) lg[(r * 53) % V] = -INFINITY;
        di_sampler_params q = plain(0.8);
        if (r % 3 == 1) q.top_p = 0.9;
        if (r % 3 == 2) q.top_k = 5;
        if (r % 5 == 0) q.min_p = 0.05;
        for (uint64_t st = 0; st < 8; st++) {
            di_sample_in a = {.forced = -1, .stream = st}, b = {.mask = all, .forced = -1, .stream = st};
            di_sample_out oa, ob;
            di_sampler_sample(&s, &q, &a, lg, &oa);
            di_sampler_sample(&s, &q, &b, lg, &ob);
            CHECKF(oa.token == ob.token && oa.token >= 0, "row %d stream %d: %d != %d", r, (int)st, oa.token,
                   ob.token);
        }
    }
    for (int i = 0; i < V; i++) lg[i] = i % 2 ? -INFINITY : NAN;
    di_sample_in a = {.forced = -1};
    di_sample_out oa;
    di_sampler_sample(&s, &p, &a, lg, &oa);
    CHECK_EQ_INT(oa.token, -1);
    di_sampler_free(&s);
}

/* A row's greedy summary (core/row_exp.h di_row_greedy_of), what a device
 * forms instead of sending the row: every field against plain loops, and
 * the token, logprob and log-sum-exp di_sampler_from_greedy gives against
 * di_sampler_sample on the row itself (bit for bit), for searches bounded
 * by a vocabulary limit, with the ban di_sampler_greedy_ban names (EOS under
 * ignore_eos or before min_tokens) on the first maximum, elsewhere, past
 * the limit or absent; rows with NaN, -inf, both zeros, ties, nothing
 * finite. */
static void test_greedy_summary(void) {
    enum { V = 1003 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float lg[V];
    int checked = 0, banned_first = 0;
    for (int r = 0; r < 48; r++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(17, (uint64_t)r, (uint64_t)i, 0) % 64) / 8.0f - 4.0f;
        if (r % 3 == 0) lg[(r * 37) % V] = NAN;
        if (r % 4 == 0) lg[(r * 53) % V] = -INFINITY;
        if (r % 5 == 0) lg[V - 5] = 9.0f; /* the maximum past a limit */
        if (r == 7) for (int i = 0; i < V; i++) lg[i] = i % 2 ? 0.0f : -0.0f;
        if (r == 8) for (int i = 0; i < V; i++) lg[i] = i == 700 ? 1.0f : NAN;
        if (r == 9) for (int i = 0; i < V; i++) lg[i] = i % 2 ? -INFINITY : NAN;
        if (r == 10) for (int i = 0; i < V; i++) lg[i] = i == 3 ? 2.0f : -INFINITY; /* banned: nothing left */
        for (int l = 0; l < 2; l++) {
            const int64_t lim = l ? V - 37 : V;
            /* the first maximum below the limit: where one ban goes */
            int32_t first = -1;
            for (int64_t i = 0; i < lim; i++)
                if (!isnan(lg[i]) && lg[i] > -INFINITY && (first < 0 || lg[i] > lg[first])) first = (int32_t)i;
            const int32_t bans[5] = {-1, first >= 0 ? first : 3, (r * 7) % (int32_t)lim, (int32_t)V - 2, 3};
            for (int b = 0; b < 5; b++) {
                const int32_t ban = bans[b];
                di_row_greedy g;
                di_row_greedy_of(lg, V, lim, ban, &g);
                /* the fields, by plain loops */
                float m = -INFINITY, all = -INFINITY;
                int32_t tok = -1;
                for (int64_t i = 0; i < V; i++) {
                    if (lg[i] > all) all = lg[i];
                    if (i < lim && i != ban && lg[i] > m) m = lg[i], tok = (int32_t)i;
                }
                if (m == -INFINITY) tok = -1;
                const double sum = di_row_sum_exp(lg, V, all);
                CHECKF(g.max == m && g.token == tok && g.max_all == all && g.pad == 0 &&
                           memcmp(&g.sum, &sum, sizeof sum) == 0,
                       "row %d lim %lld ban %d: max %g/%g token %d/%d max_all %g/%g", r, (long long)lim, ban, g.max,
                       m, g.token, tok, g.max_all, all);
                /* the draw: the sampler's on the row, under the ban */
                for (int how = 0; how < 2; how++) {
                    di_sampler_params p = plain(0);
                    p.eos_id = ban;
                    if (how == 0) p.ignore_eos = 1;
                    else p.min_tokens = 5;
                    di_sample_in in = {.forced = -1, .n_output = 2, .vocab_limit = lim == V ? 0 : lim};
                    CHECK_EQ_INT(di_sampler_greedy_ban(&p, in.n_output), ban >= 0 ? ban : -1);
                    di_sample_out oa, ob;
                    di_sampler_sample(&s, &p, &in, lg, &oa);
                    di_sampler_from_greedy(&g, &ob);
                    CHECKF(oa.token == ob.token && memcmp(&oa.logprob, &ob.logprob, 4) == 0 &&
                               (oa.token < 0 || memcmp(&oa.lse, &ob.lse, sizeof oa.lse) == 0),
                           "row %d lim %lld ban %d how %d: %d (%.9g) vs summary %d (%.9g)", r, (long long)lim, ban,
                           how, oa.token, oa.logprob, ob.token, ob.logprob);
                    checked++;
                    banned_first += ban >= 0 && ban == first;
                }
            }
        }
    }
    CHECK(checked == 48 * 2 * 5 * 2 && banned_first > 100);
    /* which draws a summary can stand for */
    di_sampler_params p = plain(0);
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 0), -1);
    p.eos_id = 4;
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 0), -1);
    p.min_tokens = 3;
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 2), 4);
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 3), -1);
    const int32_t stop = 9;
    p.stop_ids = &stop, p.n_stop_ids = 1;
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 2), -2); /* two bans: the row */
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 3), -1);
    p.ignore_eos = 1;
    CHECK_EQ_INT(di_sampler_greedy_ban(&p, 3), 4);
    di_sampler_params q = plain(0.7);
    CHECK_EQ_INT(di_sampler_greedy_ban(&q, 0), -2);
    q = plain(0), q.presence_penalty = 0.5;
    CHECK_EQ_INT(di_sampler_greedy_ban(&q, 0), -2);
    q = plain(0), q.repetition_penalty = 1.1;
    CHECK_EQ_INT(di_sampler_greedy_ban(&q, 0), -2);
    const int32_t bid = 2;
    const float bv = 1.0f;
    q = plain(0), q.bias_ids = &bid, q.bias_values = &bv, q.n_bias = 1;
    CHECK_EQ_INT(di_sampler_greedy_ban(&q, 0), -2);
    di_sampler_free(&s);
}

/* The top-p path's sort (di_sampler_sort_desc): by value descending, then
 * id ascending, for lists past the radix threshold and below it, ids in any
 * order and a subset of the vocabulary, many ties, both zeros, -inf; the
 * reference: an insertion into a sorted list by the same rule. */
static int ref_before(const float *v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

/* all[0 .. V) = the ids of v sorted by a rule (insertion: the plain
 * reference of the sorted lists below) */
static void ref_sort(const float *v, int V, int (*before)(const float *, int32_t, int32_t), int32_t *all) {
    for (int i = 0; i < V; i++) {
        int j = i;
        while (j > 0 && before(v, i, all[j - 1])) {
            all[j] = all[j - 1];
            j--;
        }
        all[j] = i;
    }
}

static void test_sort_desc(void) {
    enum { V = 20000 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float v[V];
    static int32_t ids[V], ref[V];
    for (int c = 0; c < 4; c++) {
        int n = c == 3 ? 1000 : c == 2 ? V : 6000 + 1000 * c;
        for (int i = 0; i < V; i++) {
            uint64_t r = di_rng_bits(21, (uint64_t)c, (uint64_t)i, 0);
            v[i] = (float)(int)(r % 300) / 8.0f - 20.0f; /* many ties */
            if (r % 97 == 0) v[i] = (r >> 20) % 2 ? 0.0f : -0.0f;
            if (r % 101 == 0) v[i] = -INFINITY;
            if (r % 89 == 0) v[i] = (float)(r % 1000003) * 1e-3f;
        }
        /* n distinct ids of [0, V), in a scrambled order */
        for (int i = 0; i < V; i++) ids[i] = i;
        for (int i = V - 1; i > 0; i--) {
            int j = (int)(di_rng_bits(22, (uint64_t)c, (uint64_t)i, 0) % (uint64_t)(i + 1));
            int32_t t = ids[i];
            ids[i] = ids[j];
            ids[j] = t;
        }
        int m = 0; /* the reference by insertion, O(n^2) but small enough */
        for (int i = 0; i < n; i++) {
            int j = m++;
            while (j > 0 && ref_before(v, ids[i], ref[j - 1])) {
                ref[j] = ref[j - 1];
                j--;
            }
            ref[j] = ids[i];
        }
        di_sampler_sort_desc(&s, v, ids, n);
        CHECKF(memcmp(ids, ref, (size_t)n * sizeof *ids) == 0, "case %d (n %d): order differs", c, n);
        int clean = 1;
        for (int i = 0; i < V; i++) clean &= s.seen[i] == 0;
        CHECK(clean);
    }
    di_sampler_free(&s);
}

/* vocab_limit: ids from the limit on are never drawn, greedy or sampled,
 * masked or not; the logprob stays the model's (over every id). */
static void test_vocab_limit(void) {
    enum { V = 300, LIM = 200 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    float lg[V];
    for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(5, (uint64_t)i, 0, 0) % 100) / 25.0f;
    lg[250] = 9.0f; /* the best id lies past the limit */
    lg[123] = 8.0f;
    uint32_t all[(V + 31) / 32];
    for (int i = 0; i < (V + 31) / 32; i++) all[i] = 0xffffffffu;
    di_sampler_params g = plain(0), t = plain(1.0);
    int past = 0;
    for (int m = 0; m < 2; m++) {
        di_sample_in in = {.forced = -1, .vocab_limit = LIM, .mask = m ? all : NULL};
        di_sample_out o;
        di_sampler_sample(&s, &g, &in, lg, &o);
        CHECK_EQ_INT(o.token, 123);
        CHECKF(fabsf(o.logprob - di_logprob_top(lg, V, 123, 0, NULL, NULL, NULL)) == 0.0f, "%g", o.logprob);
        for (uint64_t st = 0; st < 2000; st++) {
            in.stream = st;
            di_sampler_sample(&s, &t, &in, lg, &o);
            past += o.token < 0 || o.token >= LIM;
        }
    }
    CHECK_EQ_INT(past, 0);
    /* a +inf logit: no draw at temperature > 0 (nothing else to scale
     * against), never an index outside the kept list */
    lg[7] = INFINITY;
    di_sample_in in = {.forced = -1};
    di_sample_out o;
    di_sampler_sample(&s, &t, &in, lg, &o);
    CHECK_EQ_INT(o.token, -1);
    di_sampler_sample(&s, &g, &in, lg, &o);
    CHECK_EQ_INT(o.token, 7);
    di_sampler_free(&s);
}

/* The head search of top-p / top-k (the candidates within a cut of the
 * best). The top-p nucleus is a share of the whole kept mass even where the
 * search for it stops at the candidates near the best: logits 0 and
 * ln 0.9 and 999 more at -7 (each e^-7 of the best, below the first cut
 * of e^-6, together 0.91 of it): at top_p 0.5 the nucleus must hold both
 * leaders (1 < 0.5 * 2.81), so the second is drawn about 0.9 / 1.9 of the
 * time; measured against a half share of the near candidates' mass alone,
 * the nucleus held the first alone. */
static void test_top_p_share(void) {
    enum { V = 1001, N = 4000 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float lg[V];
    for (int i = 0; i < V; i++) lg[i] = -7.0f;
    lg[10] = 0.0f;
    lg[500] = logf(0.9f);
    di_sampler_params p = plain(1.0);
    p.top_p = 0.5;
    int first = 0, second = 0, other = 0;
    for (int i = 0; i < N; i++) {
        const int32_t t = draw(&s, &p, lg, (uint64_t)i, NULL, 0, NULL);
        first += t == 10, second += t == 500, other += t != 10 && t != 500;
    }
    CHECKF(other == 0 && fabs((double)second / N - 0.9 / 1.9) < 0.03,
           "top_p 0.5: first %d, second %d, others %d of %d draws (second expected %.3f)", first, second, other, N,
           0.9 / 1.9);
    /* top_k 50 where the first cut holds one candidate and the middle one
     * (e^-10) a hundred: one leader at 0 and 99 ids at -8 (the rest at
     * -20): the top 50 are the leader and the 49 lowest of those ids (ties
     * by id), each of them drawn ~e^-8 / (1 + 49 e^-8) of the time */
    for (int i = 0; i < V; i++) lg[i] = -20.0f;
    lg[700] = 0.0f;
    int tail_ids[99];
    for (int i = 0; i < 99; i++) tail_ids[i] = 3 + 7 * i, lg[3 + 7 * i] = -8.0f;
    p = plain(1.0);
    p.top_k = 50;
    int outside = 0, tail = 0;
    for (int i = 0; i < N; i++) {
        const int32_t t = draw(&s, &p, lg, (uint64_t)i, NULL, 0, NULL);
        int ok = t == 700;
        for (int j = 0; j < 49 && !ok; j++) ok = t == tail_ids[j];
        outside += !ok;
        tail += ok && t != 700;
    }
    CHECKF(outside == 0 && tail > 20, "top_k 50: %d draws outside the top 50, %d in its tail", outside,
           tail);
    di_sampler_free(&s);
}

/* di_logprob_topk against the order by value descending, then id (the
 * sort test's reference rule, ref_before), on rows of many ties, for k =
 * 1, 5, 40 and k past the row. */
static void test_topk_sorted(void) {
    enum { V = 3001 };
    static float lg[V];
    static int32_t all[V], ids[V];
    static float lp[V];
    for (int r = 0; r < 6; r++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(23, (uint64_t)r, (uint64_t)i, 0) % (r < 3 ? 50 : 5000)) / 10.0f;
        ref_sort(lg, V, ref_before, all);
        const double lse = di_logprob_lse(lg, V);
        const int32_t ks[] = {1, 5, 40, V + 3};
        for (size_t q = 0; q < sizeof ks / sizeof *ks; q++) {
            const int32_t k = ks[q] > V ? V : ks[q];
            di_logprob_topk(lg, V, lse, ks[q], ids, lp);
            CHECKF(!memcmp(ids, all, (size_t)k * sizeof *ids), "row %d k %d: the top list is not the sorted head", r,
                   (int)ks[q]);
            CHECK(lp[0] == (float)((double)lg[all[0]] - lse));
        }
    }
}

/* di_row_top_of (the list a device forms for top logprobs) against a
 * sort of the whole row by its order (NaN below every number, +0 and -0
 * alike, ties by id) on rows of ties, zeros of both signs, infinities and
 * NaN, for k = 1, 7, 32 and the whole row; and di_logprob_topk gives the
 * same ids on every such row (NaN or +inf rows through di_row_top_of),
 * each logprob the list's value less the row's lse. */
static int top_ref_before(const float *x, int32_t a, int32_t b) {
    if (isnan(x[a])) return isnan(x[b]) && a < b;
    if (isnan(x[b])) return 1;
    return x[a] > x[b] || (x[a] == x[b] && a < b);
}
static void test_row_top(void) {
    enum { V = 700 };
    static float lg[V];
    static int32_t all[V], ids[V];
    static float lp[V];
    static di_row_top t[V];
    int nan_rows = 0;
    for (int r = 0; r < 40; r++) {
        for (int i = 0; i < V; i++) {
            const uint64_t b = di_rng_bits(29, (uint64_t)r, (uint64_t)i, 1);
            lg[i] = (float)(b % (r % 4 == 0 ? 7 : 900)) / 8.0f - 40.0f;
            const int special = (int)(b >> 40) % 64;
            if (r % 3 == 1 && special == 0) lg[i] = -0.0f;
            if (r % 3 == 1 && special == 1) lg[i] = 0.0f;
            if (r % 5 == 2 && special == 2) lg[i] = -INFINITY;
            if (r % 7 == 3 && special == 3) lg[i] = INFINITY;
            if (r % 4 == 1 && special < 3) lg[i] = NAN;
        }
        if (r == 39) for (int i = 0; i < V; i++) lg[i] = i % 3 ? NAN : 1.0f; /* fewer numbers than k */
        ref_sort(lg, V, top_ref_before, all);
        const double lse = di_logprob_lse(lg, V);
        nan_rows += isnan(lse);
        const int32_t ks[] = {1, 7, 32, V};
        for (size_t q = 0; q < sizeof ks / sizeof *ks; q++) {
            const int32_t k = ks[q];
            di_row_top_of(lg, V, k, t);
            int ok = 1;
            for (int32_t j = 0; j < k; j++) ok &= t[j].id == all[j] && !memcmp(&t[j].x, &lg[all[j]], 4);
            CHECKF(ok, "row %d k %d: di_row_top_of is not the sorted head", r, (int)k);
            di_logprob_topk(lg, V, lse, k, ids, lp);
            for (int32_t j = 0; j < k; j++) {
                const float want = (float)((double)lg[all[j]] - lse);
                ok &= ids[j] == all[j] && !memcmp(&lp[j], &want, 4);
            }
            CHECKF(ok, "row %d k %d: di_logprob_topk's list is not di_row_top_of's", r, (int)k);
        }
    }
    CHECKF(nan_rows >= 10, "only %d rows with a NaN or +inf", nan_rows);
}

/* A sampled row's lse (di_sample_out.lse) gives di_logprob_topk the top
 * list di_logprob_top forms itself, bit for bit, and the token's logprob
 * is di_logprob_top's: greedy on the row as it came, greedy on the
 * processed copy (a +0 bias), a temperature draw, a forced token (with its
 * rank); no token: lse NaN. */
static void test_topk_from_lse(void) {
    enum { V = 1000, K = 5 };
    di_sampler s;
    CHECK(di_sampler_init(&s, V) == 0);
    static float lg[V];
    for (int r = 0; r < 12; r++) {
        for (int i = 0; i < V; i++) lg[i] = (float)(di_rng_bits(17, (uint64_t)r, (uint64_t)i, 0) % 4096) / 256.0f - 8.0f;
        const int32_t bid = 9;
        const float bval = 0.0f;
        for (int mode = 0; mode < 4; mode++) {
            di_sampler_params p = plain(mode == 2 ? 0.9 : 0.0);
            if (mode == 1) p.bias_ids = &bid, p.bias_values = &bval, p.n_bias = 1;
            di_sample_in in = {.forced = mode == 3 ? (int32_t)(r * 31 % V) : -1, .stream = (uint64_t)r};
            di_sample_out o;
            di_sampler_sample(&s, &p, &in, lg, &o);
            int32_t ia[K], ib[K], rank = 0;
            float la[K], lb[K];
            di_logprob_topk(lg, V, o.lse, K, ia, la);
            const float lt = di_logprob_top(lg, V, o.token, K, ib, lb, &rank);
            CHECKF(o.token >= 0 && !memcmp(ia, ib, sizeof ia) && !memcmp(la, lb, sizeof la) &&
                       !memcmp(&lt, &o.logprob, 4),
                   "row %d mode %d: the top list or logprob from the sampler's lse differs", r, mode);
            if (mode == 3) CHECK_EQ_INT(o.rank, rank);
        }
    }
    for (int i = 0; i < V; i++) lg[i] = -INFINITY;
    di_sampler_params p = plain(0);
    di_sample_in in = {.forced = -1};
    di_sample_out o;
    di_sampler_sample(&s, &p, &in, lg, &o);
    CHECK(o.token == -1 && isnan(o.lse));
    di_sampler_free(&s);
}

/* Draws a backend can make (di_sampler_draw_spec, the row's edits,
 * logits_draw): the sampler's token, logprob and log-sum-exp equal the
 * plain reference's (draw_ref.h, no near-set limit) bit for bit on rows of
 * every shape, greedy and drawn, with and without edited ids (bias, stop
 * ids, penalties); the settings that need more than the row are refused. */
static void test_draw_spec(void) {
    static const int64_t Vs[] = {50, 1000, 129280};
    di_sampler s;
    CHECK(di_sampler_init(&s, 129280) == 0);
    float *x = malloc(129280 * sizeof *x);
    di_row_edit *ed = malloc(128 * sizeof *ed);
    int n_drawn = 0, n_none = 0, n_filtered = 0, n_banned = 0, n_greedy = 0, n_edited = 0, n_moved = 0, n_nolist = 0;
    for (int k = 0; k < 960 && x && ed; k++) {
        if (k % 480 == 0) rng_state = 0xd5a3; /* the same cases on the scalar mirror */
        di_row_exp_force_scalar(k >= 480);
        const int64_t V = Vs[k % 3 == 2 && k % 4 ? 1 : k % 3];
        s.V = V;
        di_sampler_params p;
        di_sample_in in;
        draw_case(k, x, V, &p, &in);
        di_row_draw d;
        const int spec = di_sampler_draw_spec(&p, &in, &d);
        const int early = in.n_output < p.min_tokens;
        CHECK_EQ_INT(spec, 1); /* no mask, no forced token */
        CHECK_EQ_INT(d.ban, p.eos_id >= 0 && (p.ignore_eos || early) ? p.eos_id : -1);
        CHECK_EQ_INT(d.greedy, p.temperature == 0.0);
        CHECK(d.u == di_sampler_uniform(&p, &in) && d.u >= 0 && d.u < 1);
        CHECK(d.n_edit == 0 && d.e0 == 0);
        if (di_sampler_needs_edits(&p, &in)) {
            const int64_t n = draw_edits(&p, &in, ed, 128);
            if (n < 0) { /* one id biased twice */
                n_nolist++;
                continue;
            }
            d.n_edit = (int32_t)n;
            n_edited += n > 0;
        }
        di_sample_out o, r, plain_o;
        di_sampler_sample(&s, &p, &in, x, &o);
        di_row_greedy g;
        const int64_t lim = in.vocab_limit > 0 ? in.vocab_limit : V;
        CHECK(draw_ref(x, V, lim, &d, ed, V, &g));
        CHECK_EQ_INT(g.pad, 0);
        di_sampler_from_greedy(&g, &r);
        const int same = o.token == r.token && !memcmp(&o.lse, &r.lse, sizeof o.lse) &&
                         (o.logprob == r.logprob || (isnan(o.logprob) && isnan(r.logprob)));
        CHECKF(same, "case %d (V %lld, T %g, top-k %d, top-p %g, min-p %g, ban %d, lim %lld, %d edits): sampler %d %.9g "
               "%.17g, reference %d %.9g %.17g", k, (long long)V, p.temperature, p.top_k, p.top_p, p.min_p, d.ban,
               (long long)lim, (int)d.n_edit, o.token, o.logprob, o.lse, r.token, r.logprob, r.lse);
        if (d.n_edit > 0) { /* the edits matter: the row without them draws otherwise, now and then */
            di_row_draw d0 = d;
            d0.n_edit = 0;
            CHECK(draw_ref(x, V, lim, &d0, ed, V, &g));
            di_sampler_from_greedy(&g, &plain_o);
            n_moved += plain_o.token != o.token;
        }
        n_drawn += o.token >= 0, n_none += o.token < 0, n_banned += d.ban >= 0, n_greedy += d.greedy;
        n_filtered += o.token >= 0 && !d.greedy && (p.top_k > 0 || p.top_p < 1);
    }
    di_row_exp_force_scalar(0);
    CHECKF(n_drawn > 600 && n_none > 80 && n_filtered > 250 && n_banned > 200 && n_greedy > 100 && n_edited > 250 &&
               n_moved > 60 && n_nolist > 4,
           "%d drawn, %d none, %d filtered, %d banned, %d greedy, %d edited (%d moved by the edits), %d without a list",
           n_drawn, n_none, n_filtered, n_banned, n_greedy, n_edited, n_moved, n_nolist);
    /* refused: what the row and its edits do not decide */
    di_sampler_params p = plain(0.8);
    di_sample_in in = {.forced = -1};
    di_row_draw d;
    CHECK_EQ_INT(di_sampler_draw_spec(&p, &in, &d), 1);
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 0);
    p.temperature = 0;
    CHECK_EQ_INT(di_sampler_draw_spec(&p, &in, &d), 1);
    CHECK_EQ_INT(d.greedy, 1);
    p = plain(0.8), p.repetition_penalty = 1.1;
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 1);
    p = plain(0.8), p.presence_penalty = 0.5;
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 1);
    int32_t ids[1] = {3};
    float vals[1] = {1};
    p = plain(0.8), p.bias_ids = ids, p.bias_values = vals, p.n_bias = 1;
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 1);
    p = plain(0.8), p.stop_ids = ids, p.n_stop_ids = 1, p.min_tokens = 2;
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 1);
    in.n_output = 2; /* min_tokens reached: the stop ids are not banned any more */
    CHECK_EQ_INT(di_sampler_needs_edits(&p, &in), 0);
    CHECK_EQ_INT(di_sampler_draw_spec(&p, &in, &d), 1);
    uint32_t mask[2] = {0xffffffffu, 0xffffffffu};
    in.mask = mask;
    CHECK_EQ_INT(di_sampler_draw_spec(&p, &in, &d), 0);
    in.mask = NULL, in.forced = 4;
    CHECK_EQ_INT(di_sampler_draw_spec(&p, &in, &d), 0);
    s.V = 129280;
    di_sampler_free(&s);
    free(x);
    free(ed);
}

/* A sequence's edited ids brought up a few outputs at a time, as steps
 * do, equal the list built at once from all of them (the same entries in
 * the same order); fewer outputs than merged rebuild; a stop id stops
 * being banned once min_tokens is reached. */
static void test_row_edits_steps(void) {
    rng_state = 0x5eed;
    int32_t prompt[64], out[200];
    di_row_edit a[300], b[300];
    for (int k = 0; k < 200; k++) {
        const int V = 10 + rng_int(300);
        const int b0 = rng_int(V);
        int32_t bias_ids[3] = {b0, (b0 + 7) % V, (b0 + 3) % V}, stop[2] = {rng_int(V), rng_int(V)};
        const float bias_v[3] = {1.5f, -2.0f, 0.125f};
        di_sampler_params p = plain(0.7);
        p.repetition_penalty = k % 3 ? 1.2 : 1.0;
        p.frequency_penalty = k % 2 ? 0.4 : 0.0;
        p.presence_penalty = k % 5 ? 0.3 : 0.0;
        p.bias_ids = bias_ids, p.bias_values = bias_v, p.n_bias = 3;
        p.stop_ids = stop, p.n_stop_ids = 2, p.min_tokens = 1 + rng_int(60);
        di_sample_in in = {.prompt = prompt, .n_prompt = rng_int(64), .output = out, .forced = -1};
        for (int64_t i = 0; i < in.n_prompt; i++) prompt[i] = rng_int(V);
        const int n_out = rng_int(200);
        for (int i = 0; i < n_out; i++) out[i] = rng_int(V);
        di_seq_edits c = {0};
        int64_t na = 0, nb = 0;
        for (int64_t n = 0; n <= n_out; n += 1 + rng_int(5)) { /* steps of 1 .. 5 tokens */
            in.n_output = n;
            CHECK_EQ_INT(di_seq_edits_update(&c, &p, &in), 1);
            na = di_seq_edits_emit(&c, &p, &in, a);
            nb = draw_edits(&p, &in, b, 300);
            CHECKF(na == nb && !memcmp(a, b, (size_t)na * sizeof *a), "case %d at %lld outputs: %lld against %lld",
                   k, (long long)n, (long long)na, (long long)nb);
            int asc = 1;
            for (int64_t j = 1; j < na; j++) asc &= a[j].id > a[j - 1].id;
            CHECK(asc);
            int stop_banned = 0;
            for (int64_t j = 0; j < na; j++) stop_banned |= (a[j].flags & DI_EDIT_BAN) != 0;
            CHECK_EQ_INT(stop_banned, n < p.min_tokens);
        }
        in.n_output = n_out / 2; /* fewer than merged: built again */
        CHECK_EQ_INT(di_seq_edits_update(&c, &p, &in), 1);
        na = di_seq_edits_emit(&c, &p, &in, a);
        nb = draw_edits(&p, &in, b, 300);
        CHECK(na == nb && !memcmp(a, b, (size_t)na * sizeof *a));
        di_seq_edits_free(&c);
    }
}

/* di_row_kept_sum / di_row_kept_cross against a plain loop, on the vector
 * path and the scalar mirror: every length mod 8, NaN and -inf entries,
 * a cut, crossings in every lane and in the tail, none. */
static void test_kept_sums(void) {
    enum { N = 203 };
    float e[N];
    rng_state = 0x4b1d;
    for (int rep = 0; rep < 400; rep++) {
        const int n = 1 + rng_int(N);
        for (int i = 0; i < n; i++) {
            const int k = rng_int(10);
            e[i] = k == 0 ? NAN : k == 1 ? 0.0f : k == 2 ? 1.0f : (float)rng_unit();
        }
        const float cut = rng_int(2) ? 0.0f : 0.3f;
        const int f = di_row_sum_frac_bits(n);
        uint64_t sum = 0;
        int64_t cnt = 0;
        int32_t ids[N], got[N];
        for (int i = 0; i < n; i++)
            if (e[i] >= cut && e[i] > 0.0f) sum += (uint64_t)di_row_term_q(e[i], f), ids[cnt++] = i;
        const double u = rng_unit(), lim = rep % 7 == 0 ? (double)sum : u * (double)sum;
        int64_t cross = -1;
        uint64_t acc = 0;
        for (int i = 0; i < n && cross < 0; i++)
            if (e[i] >= cut && e[i] > 0.0f && (double)(acc += (uint64_t)di_row_term_q(e[i], f)) > lim) cross = i;
        for (int sc = 0; sc < 2; sc++) {
            di_row_exp_force_scalar(sc);
            int64_t c2 = -7, c3 = -7;
            const uint64_t s2 = di_row_kept_sum(e, n, cut, f, &c2, NULL);
            const uint64_t s3 = di_row_kept_sum(e, n, cut, f, &c3, got);
            const int64_t x2 = di_row_kept_cross(e, n, cut, f, lim);
            CHECKF(s3 == sum && c3 == cnt && !memcmp(got, ids, (size_t)cnt * sizeof *ids), "n %d scalar %d: the list",
                   n, sc);
            CHECKF(s2 == sum && c2 == cnt && x2 == cross, "n %d cut %g scalar %d: sum %llu / %llu, count %lld / %lld, "
                   "crossing %lld / %lld", n, cut, sc, (unsigned long long)s2, (unsigned long long)sum, (long long)c2,
                   (long long)cnt, (long long)x2, (long long)cross);
        }
        di_row_exp_force_scalar(0);
    }
}

int main(void) {
    RUN(test_rng);
    RUN(test_kept_sums);
    RUN(test_draw_spec);
    RUN(test_row_edits_steps);
    RUN(test_distribution);
    RUN(test_greedy_and_processing);
    RUN(test_logprob_top);
    RUN(test_wide_vocab);
    RUN(test_row_exp);
    RUN(test_greedy_fast_path);
    RUN(test_greedy_summary);
    RUN(test_sort_desc);
    RUN(test_vocab_limit);
    RUN(test_topk_from_lse);
    RUN(test_topk_sorted);
    RUN(test_row_top);
    RUN(test_top_p_share);
    return test_summary();
}
