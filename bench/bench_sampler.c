/* The sampler's cost per vocabulary row (engine/sampler.c), against a peer
 * measured in the same run: the plain scalar pass a logprob needs without
 * the row exponentials of core/row_exp.c — libm's expf over the row
 * (max, then the sum of expf(x - max) in double) plus an argmax, what a
 * greedy row cost before. Rows: V = 129,280 logits like a language model's
 * (a normal tail of sigma 2 and a few tokens 8-14 above it), 64 of them, as
 * one decode step of a batch of 64; medians of 7 passes, one thread. Also
 * the same draws with the scalar mirror forced (CPUs without AVX2), greedy
 * with the top 5 logprobs (the list from the sampler's log-sum-exp against
 * a second pass over the row) and top-p over flat rows (a nucleus of most
 * of the vocabulary).
 *
 *   build/bench/bench_sampler */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include "engine/sampler.h"
#include "core/row_exp.h"

#include "bench_util.h"

enum { V = 129280, ROWS = 64, PASSES = 7 };

/* flat: the logits of a model with little preference (sigma 0.1, no
 * peak), where a top-p nucleus is most of the vocabulary and is sorted */
static float *rows_make(int flat) {
    float *lg = malloc((size_t)ROWS * V * sizeof *lg);
    if (!lg) return NULL;
    for (int r = 0; r < ROWS; r++) {
        float *x = lg + (size_t)r * V;
        for (int i = 0; i < V; i += 2) { /* Box-Muller from the counter-based generator */
            double u = ((double)(di_rng_bits(1, (uint64_t)r, (uint64_t)i, 0) >> 11) + 0.5) * 0x1.0p-53;
            double v = ((double)(di_rng_bits(1, (uint64_t)r, (uint64_t)i, 1) >> 11) + 0.5) * 0x1.0p-53;
            double m = (flat ? 0.1 : 2.0) * sqrt(-2.0 * log(u));
            x[i] = (float)(m * cos(6.283185307179586 * v));
            if (i + 1 < V) x[i + 1] = (float)(m * sin(6.283185307179586 * v));
        }
        for (int j = 0; j < 12 && !flat; j++) x[di_rng_bits(2, (uint64_t)r, (uint64_t)j, 0) % V] += 8.0f + (float)(j % 7);
    }
    return lg;
}

static double median(double *t, int n) {
    qsort(t, (size_t)n, sizeof *t, bench_cmp_double);
    return t[n / 2];
}

/* the peer: one greedy row as a scalar pass with libm */
static int32_t peer_row(const float *x, float *lp) {
    float mx = -INFINITY;
    int32_t best = 0;
    for (int i = 0; i < V; i++)
        if (x[i] > mx) mx = x[i], best = i;
    double sum = 0;
    for (int i = 0; i < V; i++) sum += expf(x[i] - mx);
    *lp = (float)((double)x[best] - (mx + log(sum)));
    return best;
}

static double time_rows(di_sampler *s, const di_sampler_params *p, const float *lg, int64_t *check) {
    double t[PASSES];
    for (int k = 0; k < PASSES; k++) {
        double t0 = bench_now_s();
        for (int r = 0; r < ROWS; r++) {
            di_sample_in in = {.forced = -1, .stream = (uint64_t)r, .n_output = k};
            di_sample_out o;
            di_sampler_sample(s, p, &in, lg + (size_t)r * V, &o);
            *check += o.token;
        }
        t[k] = (bench_now_s() - t0) / ROWS;
    }
    return median(t, PASSES);
}

int main(void) {
    float *lg = rows_make(0), *flat = rows_make(1);
    di_sampler s;
    if (!lg || !flat || di_sampler_init(&s, V)) {
        fprintf(stderr, "bench_sampler: out of memory\n");
        return 1;
    }
    int64_t check = 0;
    double tp[PASSES];
    for (int k = 0; k < PASSES; k++) {
        double t0 = bench_now_s();
        for (int r = 0; r < ROWS; r++) {
            float l;
            check += peer_row(lg + (size_t)r * V, &l);
        }
        tp[k] = (bench_now_s() - t0) / ROWS;
    }
    double peer = median(tp, PASSES);
    printf("RESULT sampler_peer_libm_greedy %.1f us per row (max, sum of expf in double, argmax)\n", peer * 1e6);
    struct { const char *name; double t, top_p; int top_k; } modes[] = {
        {"greedy", 0.0, 1.0, 0}, {"temp0.7", 0.7, 1.0, 0}, {"temp0.7_top_p0.9", 0.7, 0.9, 0},
        {"temp1_top_k50", 1.0, 1.0, 50}};
    for (int scalar = 0; scalar < 2; scalar++) {
        di_row_exp_force_scalar(scalar);
        for (size_t m = 0; m < sizeof modes / sizeof *modes; m++) {
            di_sampler_params p = {.temperature = modes[m].t, .top_p = modes[m].top_p, .top_k = modes[m].top_k,
                                   .repetition_penalty = 1, .eos_id = -1, .seed = 7};
            double t = time_rows(&s, &p, lg, &check);
            printf("RESULT sampler_%s%s %.1f us per row, peer / ours %.2f\n", modes[m].name,
                   scalar ? "_scalar" : "", t * 1e6, peer / t);
        }
    }
    di_row_exp_force_scalar(0);
    /* greedy with the top 5 logprobs, as the engine asks for them: the list
     * from the sampler's lse (di_logprob_topk) against a second
     * di_logprob_top over the row (what the engine did before) */
    for (int second = 1; second >= 0; second--) {
        di_sampler_params pg = {.temperature = 0, .top_p = 1, .repetition_penalty = 1, .eos_id = -1, .seed = 7};
        double tk[PASSES];
        for (int k = 0; k < PASSES; k++) {
            double t0 = bench_now_s();
            for (int r = 0; r < ROWS; r++) {
                di_sample_in in = {.forced = -1, .stream = (uint64_t)r};
                di_sample_out o;
                int32_t ids[5];
                float lp[5];
                di_sampler_sample(&s, &pg, &in, lg + (size_t)r * V, &o);
                if (second) di_logprob_top(lg + (size_t)r * V, V, -1, 5, ids, lp, NULL);
                else di_logprob_topk(lg + (size_t)r * V, V, o.lse, 5, ids, lp);
                check += ids[0];
            }
            tk[k] = (bench_now_s() - t0) / ROWS;
        }
        printf("RESULT sampler_greedy_top5_%s %.1f us per row\n", second ? "second_pass" : "from_lse",
               median(tk, PASSES) * 1e6);
    }
    di_sampler_params pf = {.temperature = 1.0, .top_p = 0.95, .repetition_penalty = 1, .eos_id = -1, .seed = 7};
    printf("RESULT sampler_flat_temp1_top_p0.95 %.1f us per row (the nucleus sorted by radix)\n",
           time_rows(&s, &pf, flat, &check) * 1e6);
    printf("(checksum %lld)\n", (long long)check);
    di_sampler_free(&s);
    free(lg);
    free(flat);
    return 0;
}
