/* The grouped routed-experts op (backend.h moe_experts, architecture.md §7)
 * against the per-expert loop the model runs without it, and the MoE
 * sublayer with and without the op on the golden tiny model: bit for bit.
 * The router's arithmetic (core/route_score.h) against exact values in
 * double precision, its pick rule against the plain scan under any split
 * of the candidates, and the routing op against a double-precision router.
 *
 * The loop (moe_ref.c) runs the backend's single ops (gather_rows, matmul,
 * swiglu, matmul, scatter_add_rows per expert, experts ascending), which
 * is the op's definition. Routings are random: several tokens on one
 * expert, experts with no token, every token on the same experts, one
 * token, and weights of every format the model can hand over. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "core/dtype.h"
#include "core/route_score.h"
#include "golden_util.h"
#include "moe_ref.h"
#include "backend/cpu/kernels.h"
#include "test.h"
#include "test_rng.h"

static di_backend *cpu;

typedef struct mat {
    di_wmat w;
    uint8_t *wb, *sb;
} mat;

/* A random [n, k] weight of format fmt with moderate values. */
static mat mat_rand(di_wfmt fmt, int64_t n, int64_t k) {
    mat m = {{fmt, n, k, NULL, NULL}, NULL, NULL};
    size_t wb = 0, sb = 0;
    switch (fmt) {
    case DI_WFMT_FP8: wb = (size_t)(n * k); sb = (size_t)(((n + 31) / 32) * (k / 32)); break;
    case DI_WFMT_FP4: wb = (size_t)(n * k / 2); sb = (size_t)(n * (k / 32)); break;
    case DI_WFMT_BF16: wb = (size_t)(n * k) * 2; break;
    default: wb = (size_t)(n * k) * 4;
    }
    m.wb = malloc(wb);
    for (size_t i = 0; i < wb; i++) m.wb[i] = (uint8_t)rng_next();
    if (fmt == DI_WFMT_FP8)
        for (size_t i = 0; i < wb; i++)
            if ((m.wb[i] & 0x7f) == 0x7f) m.wb[i] ^= 1; /* no NaN codes */
    if (fmt == DI_WFMT_BF16)
        for (int64_t i = 0; i < n * k; i++) ((uint16_t *)m.wb)[i] = di_f32_to_bf16(0.1f * rng_normal());
    if (fmt == DI_WFMT_F32)
        for (int64_t i = 0; i < n * k; i++) ((float *)m.wb)[i] = 0.1f * rng_normal();
    if (sb) {
        m.sb = malloc(sb);
        for (size_t i = 0; i < sb; i++) m.sb[i] = (uint8_t)(121 + rng_int(6));
    }
    m.w.w = m.wb;
    m.w.s = m.sb;
    return m;
}

typedef struct expert {
    di_wmat w1, w2, w3; /* the model's layout (model.h di_lm_expert) */
} expert;

/* Distinct experts per row; `mode` 0: uniform, 1: all rows on experts
 * {0..k-1} (one expert, many rows), 2: only the upper half of the experts
 * (the lower half idle), 3: rows take experts in descending order. */
static void routing(int64_t m, int E, int k, int mode, int32_t *idx, float *w) {
    for (int64_t i = 0; i < m; i++)
        for (int r = 0; r < k; r++) {
            int e, dup;
            do {
                e = mode == 1 ? r : mode == 2 ? E / 2 + rng_int(E - E / 2) : rng_int(E);
                if (mode == 3) e = E - 1 - r;
                dup = 0;
                for (int t = 0; t < r; t++) dup |= idx[i * k + t] == e;
            } while (dup);
            idx[i * k + r] = e;
            w[i * k + r] = (float)(0.1 + rng_unit());
        }
}

static int same_bits(const float *a, const float *b, int64_t n, int64_t *first) {
    for (int64_t i = 0; i < n; i++)
        if (memcmp(&a[i], &b[i], 4)) {
            *first = i;
            return 0;
        }
    return 1;
}

static void test_op_vs_loop(void) {
    const struct { di_wfmt fmt; unsigned mm; int64_t m, D, I; int E, k, mode; } cs[] = {
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 1, 64, 32, 8, 2, 0},
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 17, 96, 64, 12, 3, 0},
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 40, 64, 32, 33, 6, 2},
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 23, 64, 96, 9, 4, 1},
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 9, 128, 32, 16, 6, 3},
        {DI_WFMT_FP4, DI_MM_OUT_BF16, 13, 64, 32, 7, 2, 0},  /* bf16 numerics */
        {DI_WFMT_FP8, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 11, 64, 64, 5, 2, 0},
        {DI_WFMT_BF16, DI_MM_OUT_BF16, 6, 48, 40, 4, 2, 2},
        {DI_WFMT_FP4, DI_MM_ACT_FP8 | DI_MM_OUT_BF16, 70, 64, 32, 6, 1, 0},
    };
    for (size_t t = 0; t < sizeof cs / sizeof *cs; t++) {
        int64_t m = cs[t].m, D = cs[t].D, I = cs[t].I;
        int E = cs[t].E, k = cs[t].k;
        expert *ex = calloc((size_t)E, sizeof *ex);
        mat *mats = calloc((size_t)E * 3, sizeof *mats);
        for (int e = 0; e < E; e++) {
            mats[3 * e] = mat_rand(cs[t].fmt, I, D);
            mats[3 * e + 1] = mat_rand(cs[t].fmt, D, I);
            mats[3 * e + 2] = mat_rand(cs[t].fmt, I, D);
            ex[e].w1 = mats[3 * e].w;
            ex[e].w2 = mats[3 * e + 1].w;
            ex[e].w3 = mats[3 * e + 2].w;
        }
        float *x = malloc((size_t)(m * D) * 4);
        for (int64_t i = 0; i < m * D; i++) x[i] = di_round_bf16(2.0f * rng_normal());
        int32_t *idx = malloc((size_t)(m * k) * 4);
        float *w = malloc((size_t)(m * k) * 4);
        routing(m, E, k, cs[t].mode, idx, w);
        float *ref = malloc((size_t)(m * D) * 4), *got = malloc((size_t)(m * D) * 4);
        float limit = t % 2 ? 10.0f : 0.5f; /* 0.5: the clamps act on most values */
        di_moe_experts me = {E, &ex[0].w1, &ex[0].w3, &ex[0].w2, sizeof *ex};
        moe_loop_ref(cpu, &me, x, m, idx, w, k, cs[t].mm, limit, ref);
        for (int64_t i = 0; i < m * D; i++) got[i] = NAN; /* the op must write every value */
        cpu->ops->moe_experts(cpu, &me, x, m, idx, w, k, cs[t].mm, limit, got);
        int64_t first = -1;
        int nonzero = 0;
        for (int64_t i = 0; i < m * D; i++) nonzero |= ref[i] != 0.f;
        CHECK(nonzero);
        CHECKF(same_bits(got, ref, m * D, &first),
               "case %zu (fmt %d, m %lld, E %d, k %d): first difference at %lld: op %.9g loop %.9g",
               t, (int)cs[t].fmt, (long long)m, E, k, (long long)first,
               first >= 0 ? got[first] : 0.0, first >= 0 ? ref[first] : 0.0);
        for (int e = 0; e < 3 * E; e++) {
            free(mats[e].wb);
            free(mats[e].sb);
        }
        free(mats); free(ex); free(x); free(idx); free(w); free(ref); free(got);
    }
}

/* The MoE sublayer of the golden tiny model with the grouped op and with
 * the loop (the same CPU backend, its moe_experts taken out): same bits, in
 * every block, for a decode row, a small batch and a prefill-sized chunk. */
static void moe_model(const char *fx) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    gold_model g;
    if (gold_open(&g, shared, fx)) {
        CHECK(0);
        return;
    }
    di_backend_ops loop_ops = *g.be->ops;
    loop_ops.moe_experts = NULL;
    loop_ops.moe_route_buf = NULL;
    di_backend loop_be = *g.be;
    loop_be.ops = &loop_ops;
    CHECK(g.be->ops->moe_experts != NULL);
    int64_t D = g.cfg.dim;
    const int64_t ms[] = {1, 5, 64};
    for (int b = 0; b < g.cfg.n_blocks; b++)
        for (size_t t = 0; t < 3; t++) {
            int64_t m = ms[t];
            float *x = malloc((size_t)(m * D) * 4), *y0 = malloc((size_t)(m * D) * 4),
                  *y1 = malloc((size_t)(m * D) * 4);
            for (int64_t i = 0; i < m * D; i++) x[i] = di_round_bf16(rng_normal());
            di_fwd f = {0};
            f.lm = &g.lm;
            f.m = m;
            di_err err = {0};
            di_status s0 = di_moe(&f, b, x, y0, &err);
            g.lm.be = &loop_be;
            di_status s1 = di_moe(&f, b, x, y1, &err);
            g.lm.be = g.be;
            int64_t first = -1;
            CHECKF(s0 == DI_OK && s1 == DI_OK && same_bits(y0, y1, m * D, &first),
                   "%s block %d m %lld: status %d/%d, first difference at %lld", fx, b,
                   (long long)m, (int)s0, (int)s1, (long long)first);
            free(x); free(y0); free(y1);
        }
    gold_close(&g);
}

static void test_moe_model_fp8(void) { moe_model("v41-tiny"); }
static void test_moe_model_bf16(void) { moe_model("v41-tiny-bf16"); }

static uint32_t bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

/* error of v against the exact value in ulps of the fp32 result */
static double ulps(float v, double exact) {
    double u = 0x1p-149;
    if (fabs(exact) >= 0x1p-126) {
        int e;
        frexp(exact, &e);
        u = ldexp(1.0, e - 24);
    }
    return fabs((double)v - exact) / u;
}

/* The score on a strided sample of every fp32 input in (-87.34, 20] (the
 * normal range of softplus) within the exhaustive bound of docs/numerics.md,
 * the subnormal tail within one ulp of softplus before the sqrt, and the
 * special inputs exactly. */
static void test_route_score(void) {
    double worst = 0, worst_tail = 0;
    float at = 0;
    const uint32_t pos_end = 0x41a00000u, sub = bits(87.3365479f), neg_end = 0x42d00000u;
    for (uint32_t u = (uint32_t)rng_int(1009); u <= pos_end + sub; u += 1009) {
        uint32_t b = u <= pos_end ? u : 0x80000000u | (u - pos_end - 1);
        float x;
        memcpy(&x, &b, 4);
        double xd = x, exact = sqrt(xd > 0 ? xd + log1p(exp(-xd)) : log1p(exp(xd)));
        double e = ulps(di_route_score(x), exact);
        if (e > worst) {
            worst = e;
            at = x;
        }
    }
    for (uint32_t u = sub; u <= neg_end; u += 7) {
        uint32_t b = 0x80000000u | u;
        float x;
        memcpy(&x, &b, 4);
        double e = ulps(di_rs_log1p_unit(di_rs_exp_nonpos(x)), log1p(exp((double)x)));
        if (e > worst_tail) worst_tail = e;
    }
    CHECKF(worst <= 1.3, "score: %.3f ulp at x = %.9g", worst, (double)at);
    CHECKF(worst_tail <= 1.0, "softplus below -87.34: %.3f ulp", worst_tail);
    CHECK(bits(di_route_score(NAN)) == 0x7fc00000u);
    CHECK(bits(di_route_score(-NAN)) == 0x7fc00000u);
    CHECK(di_route_score(INFINITY) == INFINITY);
    CHECK(bits(di_route_score(-INFINITY)) == 0);
    CHECK(bits(di_route_score(-200.0f)) == 0);
    CHECK(di_route_score(20.5f) == sqrtf(20.5f));
    CHECK(di_route_score(0.0f) == di_route_score(-0.0f));
    CHECK(fabsf(di_route_score(0.0f) - 0.832554611f) <= 0x1p-23f); /* sqrt(ln 2) */
    CHECK(di_route_score(20.0f) == sqrtf(20.0f)); /* log1p(e^-20) is below half an ulp of 20 */
}

/* The pick state under any split: candidates dealt to 32 "threads" by
 * j mod 32 (each folding in ascending j), merged in a random tree, equal
 * the plain scan that replaces the best on a strictly greater score; scores
 * on a coarse grid (ties), with NaN, ±0 and -inf among them. */
static void test_route_pick(void) {
    int bad = 0;
    for (int t = 0; t < 2000; t++) {
        int n = 1 + rng_int(t % 3 ? 80 : 6);
        float v[80];
        for (int j = 0; j < n; j++) {
            int r = rng_int(100);
            v[j] = r < 8 ? NAN : r < 14 ? -0.0f : r < 20 ? 0.0f : r < 26 ? -INFINITY
                                                                          : (float)(rng_int(9) - 4) * 0.5f;
        }
        int used = rng_int(n); /* one candidate already taken */
        int best = -1;
        for (int j = 0; j < n; j++) {
            if (j == used && n > 1) continue;
            if (best < 0 || v[j] > v[best]) best = j;
        }
        di_route_pick lane[32];
        for (int l = 0; l < 32; l++) {
            lane[l] = di_route_pick_empty();
            for (int j = l; j < n; j += 32)
                if (!(j == used && n > 1)) di_route_pick_add(&lane[l], j, v[j]);
        }
        for (int w = 32; w > 1; w /= 2) /* tree merges, a random side first */
            for (int l = 0; l < w / 2; l++)
                lane[l] = rng_int(2) ? di_route_pick_merge(lane[l], lane[l + w / 2])
                                     : di_route_pick_merge(lane[l + w / 2], lane[l]);
        bad += di_route_pick_id(lane[0]) != best;
    }
    CHECKF(bad == 0, "%d of 2000 picks differ from the scan", bad);
    CHECK(di_route_pick_id(di_route_pick_empty()) == -1);
}

/* The routing op against a router in double precision: the same experts
 * wherever the exact biased scores of the k-th and the next pick differ by
 * more than 1e-5, and weights within the bound their arithmetic allows.
 * With u = 2^-24: a score is within 1.3 ulp (test_route_score), and an ulp
 * of a float y is at most 2u·|y|, so a score is within 2.6u relative. An
 * unnormalised weight adds the rounding of × route_scale: 3.6u. A normalised
 * one is s_r / Σ s × route_scale: s_r's 2.6u, the sum's 2.6u from its terms
 * (all positive) plus k − 1 roundings of u each (the first add, to 0, is
 * exact; + 1e-20 leaves a sum of this size unchanged), then the division
 * and the multiply: (2·2.6 + k − 1 + 2)u = 12.2u at k = 6, to first order
 * (0.1u covers the rest). The weights' observed worst is ~4u. */
static void test_route_op(void) {
    int64_t m = 200;
    int e = 96, k = 6, near = 0, bad_ids = 0;
    double werr = 0;
    float *lg = malloc((size_t)(m * e) * 4), *bias = malloc((size_t)e * 4), *w = malloc((size_t)(m * k) * 4);
    int32_t *idx = malloc((size_t)(m * k) * 4);
    for (int64_t i = 0; i < m * e; i++) lg[i] = 3.0f * rng_normal();
    for (int j = 0; j < e; j++) bias[j] = 0.1f * rng_normal();
    for (int norm = 0; norm < 2; norm++) {
        cpu->ops->moe_route(cpu, lg, bias, m, e, k, norm, 1.5f, idx, w);
        for (int64_t i = 0; i < m; i++) {
            double sc[96], bs[96], sum = 0;
            int pick[6];
            for (int j = 0; j < e; j++) {
                double x = lg[i * e + j];
                sc[j] = sqrt(x > 20 ? x : log1p(exp(x)));
                bs[j] = sc[j] + bias[j];
            }
            for (int r = 0; r <= k; r++) { /* k picks and the runner-up */
                int b = -1;
                for (int j = 0; j < e; j++) {
                    int u = 0;
                    for (int t = 0; t < r; t++) u |= pick[t] == j;
                    if (!u && (b < 0 || bs[j] > bs[b])) b = j;
                }
                if (r < k) pick[r] = b;
                else if (bs[pick[k - 1]] - bs[b] < 1e-5) near++;
                else
                    for (int t = 0; t < k; t++) {
                        int found = 0;
                        for (int q = 0; q < k; q++) found |= idx[i * k + q] == pick[t];
                        bad_ids += !found;
                    }
            }
            for (int r = 0; r < k; r++) sum += sc[pick[r]];
            for (int r = 0; r < k; r++) {
                double ex = (norm ? sc[pick[r]] / sum : sc[pick[r]]) * 1.5;
                if (idx[i * k + r] == pick[r]) {
                    double bound = (norm ? 2 * 2.6 + (k - 1) + 2 + 0.1 : 2.6 + 1 + 0.1) * 0x1p-24;
                    double d = fabs(w[i * k + r] - ex) / ex / bound;
                    if (d > werr) werr = d;
                }
            }
        }
    }
    /* the op (its scores compiled for FMA where the CPU has it) against the
     * header's functions compiled here for baseline x86-64: same bits */
    int same = 1;
    for (int64_t i = 0; i < m; i++) {
        float sc[96], bs[96], v[6];
        int32_t pk[6];
        for (int j = 0; j < e; j++) {
            sc[j] = di_route_score(lg[i * e + j]);
            bs[j] = sc[j] + bias[j];
        }
        for (int r = 0; r < k; r++) {
            di_route_pick p = di_route_pick_empty();
            for (int j = 0; j < e; j++) {
                int u = 0;
                for (int t = 0; t < r; t++) u |= pk[t] == j;
                if (!u) di_route_pick_add(&p, j, bs[j]);
            }
            pk[r] = di_route_pick_id(p);
            v[r] = sc[pk[r]];
        }
        di_route_weights(v, k, 1, 1.5f); /* the last call above normalised */
        same &= !memcmp(pk, idx + i * k, sizeof pk) && !memcmp(v, w + i * k, sizeof v);
    }
    CHECK(same);
    CHECKF(bad_ids == 0, "%d experts differ from the exact router (%d near-ties skipped)", bad_ids, near);
    CHECKF(werr <= 1.0, "weights: %.3g of the derived bound", werr);
    free(lg); free(bias); free(w); free(idx);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    const char *seed = getenv("DI_TEST_SEED");
    rng_state = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u; /* empty: the clock */
    printf("seed %llu\n", (unsigned long long)rng_state);
    di_err err = {0};
    if (di_backend_cpu_create(2, &cpu, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    RUN(test_route_score);
    RUN(test_route_pick);
    RUN(test_route_op);
    RUN(test_op_vs_loop);
    RUN(test_moe_model_fp8);
    RUN(test_moe_model_bf16);
    di_backend_destroy(cpu);
    return test_summary();
}
