/* End to end on the CUDA backend (golden README level 5, prefill): the
 * v41-tiny fixture (FP8 activation numerics) run through the whole forward
 * pass with every op on the GPU, its prefill logits checked against the
 * golden file with the CPU forward's bounds (tests/unit/test_golden_forward.c)
 * and against the CPU backend's own logits on the same prompt: every
 * position where the CPU's top two logits are more than 0.5 apart must have
 * the same greedy token on the GPU. Skips without a GPU or without
 * ../shared. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "golden_util.h"
#include "test.h"

/* the FP8 fixture's bounds of test_golden_forward.c */
static const double B_MEAN = 0.25, B_P99 = 1.2, B_P999 = 2.0, B_MAX = 3.9, B_ROW = 0.98,
                    B_MARGIN = 1.2, B_AGREE = 0.85;

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

static void golden_prompt(gold_model *g, di_backend *gpu, const char *p) {
    char name[128];
    int64_t S = 0, V = g->cfg.vocab_size;
    snprintf(name, sizeof name, "%s.prompt_ids", p);
    const int32_t *ids = gold_i32(g, name, &S);
    snprintf(name, sizeof name, "%s.prefill.logits", p);
    const float *gl = gold_f32(g, name, NULL);
    CHECK(ids && gl);
    if (!ids || !gl) return;
    di_err err = {0};
    float *lc = prefill(g, ids, S, &err); /* g->lm is on the CPU here */
    CHECKF(lc != NULL, "cpu prefill: %s", err.msg);
    /* the same model on the GPU */
    int64_t nc = V;
    int32_t *cmap = malloc((size_t)nc * sizeof(int32_t));
    memcpy(cmap, g->lm.cmap, (size_t)nc * sizeof(int32_t));
    di_numerics num = g->lm.numerics;
    di_lm_free(&g->lm);
    memset(&g->lm, 0, sizeof g->lm);
    di_status rc = di_lm_init(&g->lm, &g->cfg, &g->w, gpu, num, cmap, &err);
    free(cmap);
    CHECKF(rc == DI_OK, "lm on the GPU: %s", err.msg);
    if (rc) {
        free(lc);
        return;
    }
    float *lgpu = prefill(g, ids, S, &err);
    CHECKF(lgpu != NULL, "gpu prefill: %s", err.msg);
    di_err be_err = {0};
    CHECKF(di_backend_cuda_status(gpu, &be_err) == DI_OK, "gpu backend: %s", be_err.msg);
    if (lgpu && lc) {
        logit_stats s = logit_compare(lgpu, gl, S, V, B_MARGIN);
        fprintf(stderr, "  %s gpu vs golden: mean %.4f p99 %.3f p999 %.3f max %.3f row-mean %.3f argmax %.3f\n",
                p, s.mean, s.p99, s.p999, s.max, s.worst_row_mean, s.argmax_agree);
        CHECKF(s.mean <= B_MEAN, "mean %.4f", s.mean);
        CHECKF(s.p99 <= B_P99, "p99 %.3f", s.p99);
        CHECKF(s.p999 <= B_P999, "p999 %.3f", s.p999);
        CHECKF(s.max <= B_MAX, "max %.3f", s.max);
        CHECKF(s.worst_row_mean <= B_ROW, "row mean %.3f", s.worst_row_mean);
        CHECKF(s.argmax_agree >= B_AGREE, "argmax agreement %.3f", s.argmax_agree);
        CHECKF(s.must_match_fail == 0, "%d rows with a clear golden argmax differ", s.must_match_fail);
        logit_stats c = logit_compare(lgpu, lc, S, V, 0.5);
        fprintf(stderr, "  %s gpu vs cpu:    mean %.4f max %.3f argmax %.3f\n", p, c.mean, c.max,
                c.argmax_agree);
        CHECKF(c.must_match_fail == 0, "%d rows with a clear cpu argmax differ on the gpu",
               c.must_match_fail);
    }
    free(lc);
    free(lgpu);
}

static void test_golden_prefill_gpu(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_backend *gpu = NULL;
    if (di_backend_cuda_create(0, &gpu, &err)) SKIP("%s", err.msg);
    gold_model g;
    if (gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        di_backend_destroy(gpu);
        return;
    }
    golden_prompt(&g, gpu, "short");
    gold_close(&g);
    di_backend_destroy(gpu);
}

int main(void) {
    RUN(test_golden_prefill_gpu);
    return test_summary();
}
