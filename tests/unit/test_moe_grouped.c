/* The grouped routed-experts op (backend.h moe_experts, architecture.md §7)
 * against the per-expert loop the model runs without it, and the MoE
 * sublayer with and without the op on the golden tiny model: bit for bit.
 *
 * The loop here is written from the backend's single ops (gather_rows,
 * matmul, swiglu, matmul, scatter_add_rows per expert, experts ascending),
 * which is the op's definition. Routings are random: several tokens on one
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
#include "golden_util.h"
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

/* The per-expert loop: what moe.c runs when the backend has no grouped op. */
static void loop_ref(di_backend *be, const expert *ex, int E, const float *x, int64_t m,
                     int64_t D, const int32_t *idx, const float *w, int k, unsigned mm,
                     float limit, float *out) {
    memset(out, 0, (size_t)(m * D) * sizeof(float));
    int32_t *rows = malloc((size_t)m * sizeof(int32_t));
    float *rw = malloc((size_t)m * sizeof(float));
    for (int e = 0; e < E; e++) {
        int64_t n = 0;
        for (int64_t i = 0; i < m; i++)
            for (int r = 0; r < k; r++)
                if (idx[i * k + r] == e) {
                    rows[n] = (int32_t)i;
                    rw[n++] = w[i * k + r];
                }
        if (!n) continue;
        int64_t I = ex[e].w1.n_out;
        float *xe = malloc((size_t)(n * D) * 4), *ye = malloc((size_t)(n * D) * 4);
        float *g = malloc((size_t)(n * I) * 4), *u = malloc((size_t)(n * I) * 4);
        be->ops->gather_rows(be, x, rows, n, D, xe);
        be->ops->matmul(be, &ex[e].w1, xe, n, g, mm);
        be->ops->matmul(be, &ex[e].w3, xe, n, u, mm);
        be->ops->swiglu(be, g, u, rw, n, I, limit, g);
        be->ops->matmul(be, &ex[e].w2, g, n, ye, mm);
        be->ops->scatter_add_rows(be, out, rows, ye, n, D);
        free(xe); free(ye); free(g); free(u);
    }
    free(rows);
    free(rw);
}

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
        loop_ref(cpu, ex, E, x, m, D, idx, w, k, cs[t].mm, limit, ref);
        for (int64_t i = 0; i < m * D; i++) got[i] = NAN; /* the op must write every value */
        di_moe_experts me = {E, &ex[0].w1, &ex[0].w3, &ex[0].w2, sizeof *ex};
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

int main(void) {
    const char *seed = getenv("DI_TEST_SEED");
    rng_state = seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u;
    printf("seed %llu\n", (unsigned long long)rng_state);
    di_err err = {0};
    if (di_backend_cpu_create(2, &cpu, &err)) {
        fprintf(stderr, "cpu backend: %s\n", err.msg);
        return 1;
    }
    RUN(test_op_vs_loop);
    RUN(test_moe_model_fp8);
    RUN(test_moe_model_bf16);
    di_backend_destroy(cpu);
    return test_summary();
}
