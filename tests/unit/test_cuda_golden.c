/* End to end on the CUDA backend (golden README level 5, prefill): the
 * v41-tiny fixtures (FP8 activation numerics, and BF16) run through the whole forward
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

/* the bounds of test_golden_forward.c for each fixture */
typedef struct bounds {
    double mean, p99, p999, max, row_mean, margin, agree;
} bounds;
static const bounds B_FP8 = {0.25, 1.2, 2.0, 3.9, 0.98, 1.2, 0.85};
static const bounds B_BF16 = {0.14, 1.2, 2.2, 4.9, 1.3, 1.0, 0.85};

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

static void golden_prompt(gold_model *g, di_backend *gpu, const char *p, const bounds *b) {
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
        logit_stats s = logit_compare(lgpu, gl, S, V, b->margin);
        fprintf(stderr, "  %s gpu vs golden: mean %.4f p99 %.3f p999 %.3f max %.3f row-mean %.3f argmax %.3f\n",
                p, s.mean, s.p99, s.p999, s.max, s.worst_row_mean, s.argmax_agree);
        CHECKF(s.mean <= b->mean, "mean %.4f", s.mean);
        CHECKF(s.p99 <= b->p99, "p99 %.3f", s.p99);
        CHECKF(s.p999 <= b->p999, "p999 %.3f", s.p999);
        CHECKF(s.max <= b->max, "max %.3f", s.max);
        CHECKF(s.worst_row_mean <= b->row_mean, "row mean %.3f", s.worst_row_mean);
        CHECKF(s.argmax_agree >= b->agree, "argmax agreement %.3f", s.argmax_agree);
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

static void fixture(const char *fx, const bounds *b) {
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
static void test_golden_prefill_fp8(void) { fixture("v41-tiny", &B_FP8); }
/* BF16 numerics: every linear is the plain FMA-chain kernel, bit-identical
 * to the CPU's, so the GPU/CPU distance shows the other ops alone */
static void test_golden_prefill_bf16(void) { fixture("v41-tiny-bf16", &B_BF16); }

int main(void) {
    RUN(test_golden_prefill_fp8);
    RUN(test_golden_prefill_bf16);
    return test_summary();
}
