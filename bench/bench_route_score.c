/* The router's score sqrt(softplus(x)) (core/route_score.h) against libm's
 * sqrtf(log1pf(expf(x))) — the peer, measured in the same run:
 *
 *   accuracy  over every fp32 x of the range that is not a plain sqrt or 0
 *             (-104 <= x <= 20, 2.2e9 inputs; --sample N for a strided
 *             subset; below -87.34, where softplus is subnormal, softplus
 *             itself): the error of each against the exact value
 *             (sqrt(log1p(exp(x))) in double, in fp32 ulps of the result),
 *             and the distance between the two in ulps; also the two parts
 *             e^a (a <= 0) and log1p(t) (0 <= t <= 1) on their own;
 *   speed     ns per score over 4096 logits, ours / libm (medians of 15),
 *             and the CPU backend's moe_route at 64 x 384, top 6, against
 *             the same routing on libm's functions.
 *
 *   build/bench/bench_route_score [--sample N] [--threads T] */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/route_score.h"

#include "bench_util.h"

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* ulp of the fp32 value nearest to v (v >= 0) */
static double ulp_at(double v) {
    if (v < 0x1p-126) return 0x1p-149;
    int e;
    frexp(v, &e); /* v = m·2^e, m in [0.5, 1) */
    return ldexp(1.0, e - 24);
}

/* distance in representable fp32 values between two non-negative floats */
static int64_t ulp_dist(float a, float b) {
    int64_t d = (int64_t)u_of(a) - (int64_t)u_of(b);
    return d < 0 ? -d : d;
}

static float libm_score(float x) { return sqrtf(x > 20.f ? x : log1pf(expf(x))); }

/* The routing op as it was with libm's functions: the peer of the CPU
 * backend's moe_route. */
static void libm_route(const float *logits, const float *bias, int64_t m, int e, int k,
                       float route_scale, int32_t *idx, float *w) {
    float sc[1024], biased[1024];
    int32_t pick[64];
    for (int64_t i = 0; i < m; i++) {
        for (int j = 0; j < e; j++) {
            sc[j] = libm_score(logits[i * e + j]);
            biased[j] = sc[j] + bias[j];
        }
        for (int r = 0; r < k; r++) {
            int best = -1;
            for (int j = 0; j < e; j++) {
                int used = 0;
                for (int t = 0; t < r; t++) used |= pick[t] == j;
                if (!used && (best < 0 || biased[j] > biased[best])) best = j;
            }
            pick[r] = best;
        }
        float sum = 0.f;
        for (int r = 0; r < k; r++) sum += sc[pick[r]];
        for (int r = 0; r < k; r++) {
            idx[i * k + r] = pick[r];
            w[i * k + r] = sc[pick[r]] / (sum + 1e-20f) * route_scale;
        }
    }
}

typedef struct stats {
    double ours_max, libm_max;    /* ulps against the exact value */
    float ours_at, libm_at;
    int64_t dist_max, n, n_diff;  /* ours against libm */
    float dist_at;
    double ours_sum;
} stats;

static void st_add(stats *s, float x, float ours, float lib, double exact) {
    double u = ulp_at(exact);
    double eo = fabs((double)ours - exact) / u, el = fabs((double)lib - exact) / u;
    if (eo > s->ours_max) { s->ours_max = eo; s->ours_at = x; }
    if (el > s->libm_max) { s->libm_max = el; s->libm_at = x; }
    int64_t d = ulp_dist(ours, lib);
    if (d > s->dist_max) { s->dist_max = d; s->dist_at = x; }
    s->n_diff += d != 0;
    s->ours_sum += eo;
    s->n++;
}

static void st_merge(stats *a, const stats *b) {
    if (b->ours_max > a->ours_max) { a->ours_max = b->ours_max; a->ours_at = b->ours_at; }
    if (b->libm_max > a->libm_max) { a->libm_max = b->libm_max; a->libm_at = b->libm_at; }
    if (b->dist_max > a->dist_max) { a->dist_max = b->dist_max; a->dist_at = b->dist_at; }
    a->n += b->n;
    a->n_diff += b->n_diff;
    a->ours_sum += b->ours_sum;
}

/* the inputs: bit patterns of [0, 20] and of [-104, -0], every `step`-th */
static const uint32_t POS_END = 0x41a00000u; /* 20.0 */
static const uint32_t NEG_END = 0x42d00000u; /* 104.0 (magnitude bits) */

typedef struct job {
    int part; /* 0 score, 1 exp, 2 log1p */
    uint64_t lo, hi, step;
    stats s;
} job;

static void *run_job(void *p) {
    job *j = p;
    memset(&j->s, 0, sizeof j->s);
    for (uint64_t i = j->lo; i < j->hi; i += j->step) {
        if (j->part == 0) {
            /* index i: [0, POS_END] positive, then the negatives */
            uint32_t u = i <= POS_END ? (uint32_t)i : 0x80000000u | (uint32_t)(i - POS_END - 1);
            float x = f_of(u);
            double xd = x, exact = sqrt(xd > 0 ? xd + log1p(exp(-xd)) : log1p(exp(xd)));
            st_add(&j->s, x, di_route_score(x), libm_score(x), exact);
        } else if (j->part == 3) {
            /* the tail where softplus is subnormal: its value before the sqrt */
            float x = f_of(0x80000000u | (uint32_t)i);
            st_add(&j->s, x, di_rs_log1p_unit(di_rs_exp_nonpos(x)), log1pf(expf(x)),
                   log1p(exp((double)x)));
        } else if (j->part == 1) {
            float a = f_of(0x80000000u | (uint32_t)i);
            st_add(&j->s, a, di_rs_exp_nonpos(a), expf(a), exp((double)a));
        } else {
            float t = f_of((uint32_t)i);
            st_add(&j->s, t, di_rs_log1p_unit(t), log1pf(t), log1p((double)t));
        }
    }
    return NULL;
}

static stats run_part(int part, uint64_t lo, uint64_t n, uint64_t step, int threads) {
    job js[64];
    pthread_t th[64];
    uint64_t per = ((n - lo) / step + threads - 1) / threads * step;
    for (int t = 0; t < threads; t++) {
        js[t].part = part;
        js[t].step = step;
        js[t].lo = lo + (uint64_t)t * per;
        js[t].hi = js[t].lo + per < n ? js[t].lo + per : n;
        pthread_create(&th[t], NULL, run_job, &js[t]);
    }
    stats s;
    memset(&s, 0, sizeof s);
    for (int t = 0; t < threads; t++) {
        pthread_join(th[t], NULL);
        st_merge(&s, &js[t].s);
    }
    return s;
}

static void report(const char *what, const stats *s) {
    printf("%-22s %11lld inputs: ours max %.3f ulp (x = %.9g), mean %.4f; libm max %.3f ulp "
           "(x = %.9g); ours != libm on %.3f%%, at most %lld ulp (x = %.9g)\n",
           what, (long long)s->n, s->ours_max, (double)s->ours_at, s->ours_sum / (double)s->n,
           s->libm_max, (double)s->libm_at, 100.0 * (double)s->n_diff / (double)s->n,
           (long long)s->dist_max, (double)s->dist_at);
}

int main(int argc, char **argv) {
    uint64_t step = 1;
    int threads = 2;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--sample")) step = strtoull(argv[i + 1], NULL, 10);
        if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
    }
    if (step < 1) step = 1;
    if (threads < 1 || threads > 64) threads = 2;
    printf("router score accuracy (%s, every %llu-th input, %d threads)\n",
           step == 1 ? "exhaustive" : "sampled", (unsigned long long)step, threads);
    /* below -87.34, e^x (so softplus) is subnormal: sqrt magnifies its
     * absolute rounding, for libm as for ours, so that tail is measured
     * before the sqrt */
    const uint32_t sub = u_of(87.3365479f); /* e^-87.3365479 ~ 2^-126 */
    stats e = run_part(1, 0, (uint64_t)NEG_END + 1, step, threads);
    report("e^a, -104 <= a <= 0", &e);
    stats l = run_part(2, 0, (uint64_t)0x3f800000u + 1, step, threads);
    report("log1p(t), 0 <= t <= 1", &l);
    stats s = run_part(0, 0, (uint64_t)POS_END + 1 + sub, step, threads);
    report("score, -87.34 < x <= 20", &s);
    stats t = run_part(3, sub, (uint64_t)NEG_END + 1, step, threads);
    report("softplus, x < -87.34", &t);

    /* speed: 4096 logits of the router's range (normal, sd 2) */
    enum { N = 4096, REPS = 15 };
    static float x[N], y[N];
    uint64_t r = 88172645463325252ull;
    for (int i = 0; i < N; i++) {
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        double u1 = ((double)(r >> 11) + 0.5) / 9007199254740992.0;
        r ^= r << 13; r ^= r >> 7; r ^= r << 17;
        double u2 = (double)(r >> 11) / 9007199254740992.0;
        x[i] = (float)(2.0 * sqrt(-2 * log(u1)) * cos(6.283185307179586 * u2));
    }
    double to[REPS], tl[REPS], sink = 0;
    for (int k = 0; k < REPS; k++) {
        double t0 = bench_now_s();
        for (int rep = 0; rep < 50; rep++)
            for (int i = 0; i < N; i++) y[i] = di_route_score(x[i] + (float)rep * 0.0f);
        double t1 = bench_now_s();
        sink += y[7];
        for (int rep = 0; rep < 50; rep++)
            for (int i = 0; i < N; i++) y[i] = libm_score(x[i] + (float)rep * 0.0f);
        double t2 = bench_now_s();
        sink += y[7];
        to[k] = (t1 - t0) / (50.0 * N) * 1e9;
        tl[k] = (t2 - t1) / (50.0 * N) * 1e9;
    }
    qsort(to, REPS, sizeof *to, bench_cmp_double);
    qsort(tl, REPS, sizeof *tl, bench_cmp_double);
    printf("speed (this file, -march=native): ours %.2f ns/score, libm %.2f ns/score, "
           "ours/libm %.2f (medians of %d; %g)\n",
           to[REPS / 2], tl[REPS / 2], to[REPS / 2] / tl[REPS / 2], REPS, sink * 0);

    /* the library's routing op (built for baseline x86-64, its scores for
     * FMA where the CPU has it) against the libm routing, real shape:
     * 64 rows of 384 experts, top 6 */
    di_backend *be = NULL;
    di_err err = {0};
    if (di_backend_cpu_create(1, &be, &err)) return 1;
    enum { M = 64, E = 384, K = 6 };
    static float lg[M * E], bias[E], wt[M * K];
    static int32_t id[M * K];
    for (int i = 0; i < M * E; i++) lg[i] = x[i % N] + (float)(i / N) * 0.01f;
    for (int j = 0; j < E; j++) bias[j] = 0.01f * (float)(j % 7);
    for (int k = 0; k < REPS; k++) {
        double t0 = bench_now_s();
        for (int rep = 0; rep < 5; rep++) be->ops->moe_route(be, lg, bias, M, E, K, 1, 1.5f, id, wt);
        double t1 = bench_now_s();
        for (int rep = 0; rep < 5; rep++) libm_route(lg, bias, M, E, K, 1.5f, id, wt);
        double t2 = bench_now_s();
        to[k] = (t1 - t0) / 5 * 1e6;
        tl[k] = (t2 - t1) / 5 * 1e6;
    }
    qsort(to, REPS, sizeof *to, bench_cmp_double);
    qsort(tl, REPS, sizeof *tl, bench_cmp_double);
    printf("moe_route 64 x 384, top 6: ours %.1f us, libm routing %.1f us, ours/libm %.2f "
           "(medians of %d)\n", to[REPS / 2], tl[REPS / 2], to[REPS / 2] / tl[REPS / 2], REPS);
    di_backend_destroy(be);
    return 0;
}
