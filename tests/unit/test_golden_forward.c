/* End-to-end forward against the golden fixtures (golden README levels 3–5):
 * prefill logits of every prompt position, decode logits fed with the
 * golden decode inputs, free-running greedy tokens up to the first near-tie,
 * and the DSpark rounds (logits with Markov bias, confidence, drafted ids),
 * for v41-tiny (FP8 activation numerics) and v41-tiny-bf16. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_util.h"
#include "backend/cpu/kernels.h"
#include "test.h"
#include "golden_bounds.h"

static int64_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return b;
}

/* One DSpark round from the state's last position against golden <p>.<round>.*:
 * Markov bias (1e-4), logits and confidence (logit bounds), drafted ids up to
 * the first slot with a near-tie. */
static void check_draft(gold_model *g, di_seqstate *st, const char *p, const char *round,
                        const gold_bounds *b) {
    if (!g->lm.has_dspark) return;
    char name[128];
    int64_t V = g->cfg.vocab_size;
    int B = g->cfg.dspark_block_size;
    snprintf(name, sizeof name, "%s.%s.input_id", p, round);
    const int32_t *in0 = gold_i32(g, name, NULL);
    snprintf(name, sizeof name, "%s.%s.start_pos", p, round);
    const int32_t *sp = gold_i32(g, name, NULL);
    snprintf(name, sizeof name, "%s.%s.logits", p, round);
    const float *glog = gold_f32(g, name, NULL);
    snprintf(name, sizeof name, "%s.%s.markov_bias", p, round);
    const float *gmb = gold_f32(g, name, NULL);
    snprintf(name, sizeof name, "%s.%s.confidence", p, round);
    const float *gconf = gold_f32(g, name, NULL);
    snprintf(name, sizeof name, "%s.%s.ids", p, round);
    const int32_t *gids = gold_i32(g, name, NULL);
    if (!in0 || !sp || !glog || !gmb || !gconf || !gids || B > 8) {
        CHECK(0);
        return;
    }
    CHECK_EQ_INT(sp[0], st->n_tokens - 1);
    float *dlg = malloc((size_t)(B * V) * sizeof(float)), *mb = malloc((size_t)(B * V) * sizeof(float));
    float conf[8];
    int32_t did[8];
    di_err err = {0};
    di_status rc = di_dspark_draft(&g->lm, st, in0[0], dlg, mb, conf, did, &err);
    CHECKF(rc == DI_OK, "draft: %s", err.msg);
    double mbmax = 0, cmax = 0;
    for (int64_t i = 0; i < B * V; i++) {
        double d = fabs((double)mb[i] - gmb[i]);
        if (d > mbmax) mbmax = d;
    }
    for (int i = 0; i < B; i++) cmax = fmax(cmax, fabs((double)conf[i] - gconf[i]));
    snprintf(name, sizeof name, "%s %s", p, round);
    gold_check_logits(name, dlg, glog, B, V, b);
    fprintf(stderr, "  %s %s: markov bias max |diff| %.2e, confidence max |diff| %.4f, ids", p, round,
            mbmax, cmax);
    for (int i = 0; i < B; i++) fprintf(stderr, " %d/%d", did[i], gids[i]);
    fputc('\n', stderr);
    CHECKF(mbmax <= 1e-4, "markov bias %.3e", mbmax);
    CHECKF(cmax <= b->max, "confidence diff %.3f", cmax);
    for (int i = 0; i < B; i++) { /* ids up to the first near-tie slot */
        const float *r = glog + (int64_t)i * V;
        int64_t a1 = argmax(r, V);
        float m2 = -1e30f;
        for (int64_t k = 0; k < V; k++)
            if (k != a1 && r[k] > m2) m2 = r[k];
        if (r[a1] - m2 < b->margin) break;
        CHECK_EQ_INT(did[i], gids[i]);
    }
    free(dlg);
    free(mb);
}

static void run_prompt(gold_model *g, const char *p, const gold_bounds *b, int with_draft) {
    char name[128];
    gold_prompt gp;
    int have = gold_prompt_get(g, p, &gp);
    CHECK(have);
    if (!have) return;
    int64_t S = gp.S, V = g->cfg.vocab_size, n = gp.n;
    const int32_t *ids = gp.ids, *din = gp.decode_ids, *dnext = gp.next_ids;
    const float *gl = gp.prefill_logits, *dl = gp.decode_logits, *dmargin = gp.margin;

    di_err err = {0};
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &g->lm, S + n + 8, 8, &err) == DI_OK);
    float *lg = malloc((size_t)((S > n ? S : n) * V) * sizeof(float));
    di_fwd_seq q = {&st, ids, S};
    di_status rc = di_forward(&g->lm, &q, 1, lg, 1, &err);
    CHECKF(rc == DI_OK, "prefill: %s", err.msg);
    snprintf(name, sizeof name, "%s prefill", p);
    if (rc == DI_OK) gold_check_logits(name, lg, gl, S, V, b);

    /* DSpark round 0 right after the prefill */
    if (with_draft) check_draft(g, &st, p, "draft0", b);

    /* decode fed with the golden inputs */
    for (int64_t i = 0; i < n && rc == DI_OK; i++) {
        di_fwd_seq d = {&st, din + i, 1};
        rc = di_forward(&g->lm, &d, 1, lg + i * V, 0, &err);
        CHECKF(rc == DI_OK, "decode %lld: %s", (long long)i, err.msg);
        /* DSpark round 1 after decode step 0, as the reference's loop does */
        if (i == 0 && with_draft) check_draft(g, &st, p, "draft1", b);
    }
    snprintf(name, sizeof name, "%s decode", p);
    if (rc == DI_OK) gold_check_logits(name, lg, dl, n, V, b);

    /* free-running greedy from the prompt, up to the first near-tie */
    di_seqstate_reset(&st);
    rc = di_forward(&g->lm, &q, 1, lg, 0, &err);
    int32_t tok = (int32_t)argmax(lg, V);
    CHECK_EQ_INT(tok, din[0]);
    int matched = 0;
    for (int64_t i = 0; i < n && rc == DI_OK; i++) {
        di_fwd_seq d = {&st, &tok, 1};
        rc = di_forward(&g->lm, &d, 1, lg, 0, &err);
        tok = (int32_t)argmax(lg, V);
        if (dmargin[i] < b->margin) break;
        CHECKF(tok == dnext[i], "%s greedy step %lld: %d vs %d", p, (long long)i, tok, dnext[i]);
        if (tok != dnext[i]) break;
        matched++;
    }
    fprintf(stderr, "  %s greedy: %d steps identical before the first near-tie\n", p, matched);
    free(lg);
    di_seqstate_free(&st);
}

static void fixture(const char *fx, const gold_bounds *b) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    gold_model g;
    if (gold_open(&g, shared, fx)) {
        CHECK(0);
        return;
    }
    fprintf(stderr, "%s:\n", fx);
    run_prompt(&g, "short", b, 1);
    if (quick_mode()) fprintf(stderr, "  long prompt skipped (sanitizer build or DEEPINFER_TEST_QUICK; DEEPINFER_TEST_FULL=1 runs it)\n");
    else run_prompt(&g, "long", b, 1);
    gold_close(&g);
}

static void test_fp8(void) { fixture("v41-tiny", &GOLD_BOUNDS_FP8); }
static void test_bf16(void) { fixture("v41-tiny-bf16", &GOLD_BOUNDS_BF16); }

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    RUN(test_fp8);
    RUN(test_bf16);
    return test_summary();
}
