/* Sampler: the counter-based generator, greedy and the exponential race
 * against exact softmax frequencies, top-k / top-p / min-p supports,
 * penalties, bias, min_tokens, masks, forced tokens, logprobs. */
#include <math.h>
#include <stdint.h>

#include "engine/sampler.h"
#include "test.h"

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
    int32_t ids[5];
    float lp[5];
    di_logprob_top(lg, V, 0, 5, ids, lp, NULL);
    for (int i = 0; i < 5; i++) CHECK_EQ_INT(ids[i], ord[i]);
    di_sampler_free(&s);
}

int main(void) {
    RUN(test_rng);
    RUN(test_distribution);
    RUN(test_greedy_and_processing);
    RUN(test_logprob_top);
    RUN(test_wide_vocab);
    return test_summary();
}
