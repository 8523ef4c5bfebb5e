/* End to end on the CUDA backend (golden README levels 3 and 4): the
 * v41-tiny fixtures (FP8 activation numerics, and BF16) run through the whole forward
 * pass with every op on the GPU, its prefill logits checked against the
 * golden file with the CPU forward's bounds (tests/unit/golden_bounds.h)
 * and against the CPU backend's own logits on the same prompt: every
 * position where the CPU's top two logits are more than 0.5 apart must have
 * the same greedy token on the GPU. Then decode: 32 steps fed with the
 * golden inputs, logits against the golden decode logits with the same
 * bounds, and free-running greedy generation, whose tokens must equal the
 * CPU backend's up to the first step where the CPU's top two logits are
 * within 0.5 (a near-tie either side may break differently) and the
 * golden greedy ids up to the first golden near-tie. Skips without a GPU or
 * without ../shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "golden_util.h"
#include "test.h"
#include "golden_bounds.h"
#include "draw_ref.h"

/* Rebuilds g's runtime model (opened on the CPU) on the GPU backend: the
 * same weights, numerics and Engram token map. */
static di_status lm_to_gpu(gold_model *g, di_backend *gpu, di_err *err) {
    const int64_t V = g->cfg.vocab_size;
    int32_t *cmap = malloc((size_t)V * sizeof(int32_t));
    if (!cmap) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    memcpy(cmap, g->lm.cmap, (size_t)V * sizeof(int32_t));
    di_numerics num = g->lm.numerics;
    di_lm_free(&g->lm);
    memset(&g->lm, 0, sizeof g->lm);
    di_status rc = di_lm_init(&g->lm, &g->cfg, &g->w, gpu, num, cmap, err);
    free(cmap);
    return rc;
}

static float *prefill(gold_model *g, const int32_t *ids, int64_t S, di_err *err) {
    int64_t V = g->cfg.vocab_size;
    di_seqstate st;
    if (di_seqstate_init(&st, &g->lm, S + 8, 8, err)) return NULL;
    float *lg = malloc((size_t)(S * V) * sizeof(float));
    di_fwd_seq q = {&st, ids, S};
    di_status rc = di_forward(&g->lm, &q, 1, lg, 1, err);
    di_seqstate_free(&st);
    if (rc) {
        free(lg);
        return NULL;
    }
    return lg;
}

static int64_t argmax_margin(const float *l, int64_t V, double *margin) {
    int64_t a = 0, b = -1;
    for (int64_t v = 1; v < V; v++)
        if (l[v] > l[a]) {
            b = a;
            a = v;
        } else if (b < 0 || l[v] > l[b]) {
            b = v;
        }
    *margin = b >= 0 ? (double)l[a] - (double)l[b] : 1e30;
    return a;
}

/* Free-running greedy: n tokens after the prompt, each with its top-two
 * margin. Returns the steps done. */
static int64_t greedy(gold_model *g, const int32_t *ids, int64_t S, int64_t n, int32_t *tok,
                      double *margin, di_err *err) {
    int64_t V = g->cfg.vocab_size, done = 0;
    di_seqstate st;
    if (di_seqstate_init(&st, &g->lm, S + n + 8, 8, err)) return 0;
    float *lg = malloc((size_t)V * sizeof(float));
    di_fwd_seq q = {&st, ids, S};
    di_status rc = lg ? di_forward(&g->lm, &q, 1, lg, 0, err) : DI_ERR_NOMEM;
    for (int64_t i = 0; i < n && rc == DI_OK; i++, done++) {
        tok[i] = (int32_t)argmax_margin(lg, V, &margin[i]);
        di_fwd_seq d = {&st, &tok[i], 1};
        rc = di_forward(&g->lm, &d, 1, lg, 0, err);
    }
    free(lg);
    di_seqstate_free(&st);
    return done;
}

/* Decode fed with the golden inputs after the prompt: logits [n, V]. */
static float *decode_forced(gold_model *g, const int32_t *ids, int64_t S, const int32_t *din, int64_t n,
                            di_err *err) {
    int64_t V = g->cfg.vocab_size;
    di_seqstate st;
    if (di_seqstate_init(&st, &g->lm, S + n + 8, 8, err)) return NULL;
    float *lg = malloc((size_t)(n * V) * sizeof(float));
    di_fwd_seq q = {&st, ids, S};
    di_status rc = lg ? di_forward(&g->lm, &q, 1, lg, 0, err) : DI_ERR_NOMEM;
    for (int64_t i = 0; i < n && rc == DI_OK; i++) {
        di_fwd_seq d = {&st, din + i, 1};
        rc = di_forward(&g->lm, &d, 1, lg + i * V, 0, err);
    }
    di_seqstate_free(&st);
    if (rc) {
        free(lg);
        return NULL;
    }
    return lg;
}

static void golden_prompt(gold_model *g, di_backend *gpu, const char *p, const gold_bounds *b) {
    char name[128];
    gold_prompt gp;
    int have = gold_prompt_get(g, p, &gp);
    CHECK(have);
    if (!have) return;
    int64_t S = gp.S, V = g->cfg.vocab_size, n = gp.n;
    const int32_t *ids = gp.ids, *din = gp.decode_ids, *dnext = gp.next_ids;
    const float *gl = gp.prefill_logits, *dl = gp.decode_logits, *dmargin = gp.margin;
    di_err err = {0};
    float *lc = prefill(g, ids, S, &err); /* g->lm is on the CPU here */
    CHECKF(lc != NULL, "cpu prefill: %s", err.msg);
    int32_t *tc = calloc((size_t)n, sizeof(int32_t)), *tg = calloc((size_t)n, sizeof(int32_t));
    double *mc = calloc((size_t)n, sizeof(double)), *mg = calloc((size_t)n, sizeof(double));
    CHECK(tc && tg && mc && mg);
    int64_t nc = tc && mc ? greedy(g, ids, S, n, tc, mc, &err) : 0;
    CHECKF(nc == n, "cpu greedy: %s", err.msg);
    /* the same model on the GPU */
    di_status rc = lm_to_gpu(g, gpu, &err);
    CHECKF(rc == DI_OK, "lm on the GPU: %s", err.msg);
    float *lgpu = rc ? NULL : prefill(g, ids, S, &err);
    CHECKF(lgpu != NULL, "gpu prefill: %s", err.msg);
    di_err be_err = {0};
    CHECKF(di_backend_cuda_status(gpu, &be_err) == DI_OK, "gpu backend: %s", be_err.msg);
    if (lgpu && lc) {
        snprintf(name, sizeof name, "%s gpu vs golden:", p);
        gold_check_logits(name, lgpu, gl, S, V, b);
        logit_stats c = logit_compare(lgpu, lc, S, V, 0.5);
        fprintf(stderr, "  %s gpu vs cpu:    mean %.4f max %.3f argmax %.3f\n", p, c.mean, c.max,
                c.argmax_agree);
        CHECKF(c.must_match_fail == 0, "%d rows with a clear cpu argmax differ on the gpu",
               c.must_match_fail);
    }
    /* decode fed with the golden inputs */
    float *ld = rc ? NULL : decode_forced(g, ids, S, din, n, &err);
    CHECKF(ld != NULL, "gpu decode: %s", err.msg);
    if (ld) {
        snprintf(name, sizeof name, "%s decode gpu vs golden:", p);
        gold_check_logits(name, ld, dl, n, V, b);
    }
    /* free-running greedy: the CPU's tokens up to the CPU's first near-tie,
     * the golden ones up to the golden first near-tie */
    int64_t ng = rc || !tg || !mg ? 0 : greedy(g, ids, S, n, tg, mg, &err);
    CHECKF(ng == n, "gpu greedy: %s", err.msg);
    int64_t same_cpu = 0, same_gold = 0;
    while (same_cpu < ng && same_cpu < nc && tg[same_cpu] == tc[same_cpu]) same_cpu++;
    int64_t tie_cpu = 0;
    while (tie_cpu < nc && mc[tie_cpu] >= 0.5) tie_cpu++;
    CHECKF(same_cpu >= tie_cpu, "%s greedy: gpu and cpu part at step %lld, before the cpu's first near-tie (%lld)", p,
           (long long)same_cpu, (long long)tie_cpu);
    /* golden step i feeds next_ids[i-1]: token i of the greedy run is next_ids[i-1] */
    while (same_gold + 1 < ng && same_gold < n && tg[same_gold + 1] == dnext[same_gold]) same_gold++;
    int64_t tie_gold = 0;
    while (tie_gold + 1 < n && dmargin[tie_gold] >= b->margin) tie_gold++;
    CHECKF(ng > 0 && tg[0] == din[0], "%s greedy: first token %d, golden %d", p, ng ? tg[0] : -1, din[0]);
    CHECKF(same_gold >= tie_gold, "%s greedy: gpu leaves the golden ids at step %lld, before its first near-tie (%lld)",
           p, (long long)same_gold, (long long)tie_gold);
    fprintf(stderr, "  %s greedy: %lld/%lld tokens equal to the cpu's (cpu near-tie at %lld), %lld golden steps "
            "(golden near-tie at %lld)\n", p, (long long)same_cpu, (long long)n, (long long)tie_cpu,
            (long long)same_gold, (long long)tie_gold);
    CHECKF(di_backend_cuda_status(gpu, &be_err) == DI_OK, "gpu backend: %s", be_err.msg);
    free(lc);
    free(lgpu);
    free(ld);
    free(tc);
    free(tg);
    free(mc);
    free(mg);
}

static void fixture(const char *fx, const gold_bounds *b) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_backend *gpu = NULL;
    if (di_backend_cuda_create(0, &gpu, &err)) SKIP("%s", err.msg);
    gold_model g;
    if (gold_open(&g, shared, fx)) {
        CHECK(0);
        di_backend_destroy(gpu);
        return;
    }
    fprintf(stderr, "%s:\n", fx);
    golden_prompt(&g, gpu, "short", b);
    gold_close(&g);
    di_backend_destroy(gpu);
}

/* FP8 numerics: the prefill linears take the wgmma path */
static void test_golden_prefill_fp8(void) { fixture("v41-tiny", &GOLD_BOUNDS_FP8); }
/* BF16 numerics: every linear is the plain FMA-chain kernel, bit-identical
 * to the CPU's, so the GPU/CPU distance shows the other ops alone */
static void test_golden_prefill_bf16(void) { fixture("v41-tiny-bf16", &GOLD_BOUNDS_BF16); }

/* di_forward_rows on the GPU with temperature draws among the other modes
 * (model/forward.c's delivery): five sequences of the long prompt, each
 * mix of modes against the plain forward of the same chunks — logits rows
 * equal, greedy summaries di_row_greedy_of's, draws the plain reference's
 * (draw_ref.h) with a near-set limit lowered to 6 (DI_CUDA_DRAW_NEAR) and
 * the wider ones left to the host (DI_CUDA_DRAW_WIDE=0), so that such
 * draws come too: their rows must arrive as the logits, runs of them in
 * one copy. */
static void test_rows_draw(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    setenv("DI_CUDA_DRAW_NEAR", "6", 1); /* read at the backend's first draw */
    setenv("DI_CUDA_DRAW_WIDE", "0", 1);
    di_err err = {0};
    di_backend *gpu = NULL;
    if (di_backend_cuda_create(0, &gpu, &err)) SKIP("%s", err.msg);
    gold_model g;
    if (gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        di_backend_destroy(gpu);
        return;
    }
    di_status rc = lm_to_gpu(&g, gpu, &err);
    CHECKF(rc == DI_OK, "lm on the GPU: %s", err.msg);
    int64_t S = 0;
    const int32_t *ids = gold_i32(&g, "long.prompt_ids", &S);
    enum { NS = 6 };
    const int64_t V = g.cfg.vocab_size, lens[NS] = {64, 100, 37, 80, 1, 50};
    const int32_t modes[3][NS] = {{DI_ROW_DRAW, DI_ROW_DRAW, DI_ROW_LOGITS, DI_ROW_GREEDY, DI_ROW_DRAW, DI_ROW_DRAW},
                                  {DI_ROW_DRAW, DI_ROW_NONE, DI_ROW_DRAW, DI_ROW_DRAW, DI_ROW_GREEDY, DI_ROW_LOGITS},
                                  {DI_ROW_GREEDY, DI_ROW_DRAW, DI_ROW_DRAW, DI_ROW_DRAW, DI_ROW_DRAW, DI_ROW_NONE}};
    /* plain temperature (never left), top-k 2 / top-p 0.5 (narrow near sets),
     * a flat top-p (wide ones: left to the host) */
    const di_row_draw draws[4] = {{.inv_t = 1.25f, .top_p = 1.0, .u = 0.37, .ban = -1},
                                  {.inv_t = 1.0f, .top_p = 1.0, .u = 0.81, .top_k = 2, .ban = 5},
                                  {.inv_t = 2.0f, .top_p = 0.5, .u = 0.55, .ban = -1},
                                  {.inv_t = 0.05f, .top_p = 0.99, .u = 0.12, .ban = -1}};
    float *ref = malloc((size_t)(NS * V) * sizeof(float)), *got = malloc((size_t)(NS * V) * sizeof(float));
    int n_drawn = 0, n_left = 0;
    for (int c = -1; c < 3 && !rc && ids && S >= 150; c++) {
        di_seqstate sts[NS];
        di_fwd_seq qs[NS];
        for (int q = 0; q < NS; q++) {
            CHECK(di_seqstate_init(&sts[q], &g.lm, S + 16, 0, &err) == DI_OK);
            qs[q] = (di_fwd_seq){&sts[q], ids + 3 * q, lens[q]};
        }
        if (c < 0) {
            CHECKF(di_forward(&g.lm, qs, NS, ref, 0, &err) == DI_OK, "%s", err.msg);
        } else {
            di_row_want w[NS];
            di_row_greedy gs[NS];
            for (int q = 0; q < NS; q++)
                w[q] = (di_row_want){.mode = modes[c][q], .ban = q == 3 ? 2 : -1, .draw = draws[(q + c) % 4]};
            for (int64_t i = 0; i < NS * V; i++) got[i] = -12345.0f;
            di_fwd_out o = {w, V, gs, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
            CHECKF(di_forward_rows(&g.lm, qs, NS, got, &o, &err) == DI_OK, "%s", err.msg);
            for (int q = 0; q < NS; q++) {
                int64_t bad = 0;
                const int row = w[q].mode == DI_ROW_LOGITS || (w[q].mode == DI_ROW_DRAW && gs[q].pad);
                for (int64_t i = 0; i < V; i++)
                    bad += row ? got[q * V + i] != ref[q * V + i] : got[q * V + i] != -12345.0f;
                di_row_greedy h;
                if (w[q].mode == DI_ROW_GREEDY) {
                    di_row_greedy_of(ref + q * V, V, V, w[q].ban, &h);
                    bad += memcmp(&gs[q], &h, sizeof h) != 0;
                } else if (w[q].mode == DI_ROW_DRAW) {
                    CHECK(draw_ref(ref + q * V, V, V, &w[q].draw, NULL, 6, &h));
                    bad += gs[q].pad != h.pad || (!h.pad && (gs[q].token != h.token || memcmp(&gs[q].max, &h.max, 4) ||
                                                             memcmp(&gs[q].sum, &h.sum, 8) ||
                                                             memcmp(&gs[q].max_all, &h.max_all, 4)));
                    n_drawn += !h.pad, n_left += h.pad;
                }
                CHECKF(bad == 0, "mix %d, sequence %d (mode %d, pad %d): %lld values wrong", c, q, w[q].mode,
                       w[q].mode == DI_ROW_DRAW ? gs[q].pad : -1, (long long)bad);
            }
        }
        for (int q = 0; q < NS; q++) di_seqstate_free(&sts[q]);
    }
    CHECKF(n_drawn >= 3 && n_left >= 2, "%d draws made on the device, %d left to the host", n_drawn, n_left);
    di_err be_err = {0};
    CHECKF(di_backend_cuda_status(gpu, &be_err) == DI_OK, "gpu backend: %s", be_err.msg);
    free(ref);
    free(got);
    gold_close(&g);
    di_backend_destroy(gpu);
    unsetenv("DI_CUDA_DRAW_NEAR");
    unsetenv("DI_CUDA_DRAW_WIDE");
}

int main(void) {
    RUN(test_golden_prefill_fp8);
    RUN(test_golden_prefill_bf16);
    RUN(test_rows_draw);
    return test_summary();
}
