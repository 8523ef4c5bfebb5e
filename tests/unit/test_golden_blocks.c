/* Teacher-forced blocks against the golden fixtures (golden README levels 1
 * and 2), short prompt: exact Engram row ids, every block fed with the
 * golden streams and pre-mix and compared (streams, pre-mix, attention and
 * MoE outputs), the compressed-KV and index-key caches of the sources, the
 * candidate blocks, the indexer selections (identical except at recorded near-ties), each Engram
 * module on its golden input, and the final norm + head. Both fixtures. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_util.h"
#include "backend/cpu/kernels.h"
#include "test.h"

typedef struct tol {
    double stream, attn, ffn, pre, engram, ckv, ik, head;
} tol;
static const tol T_FP8 = {0.012, 0.14, 0.05, 0.039, 1e-3, 0.02, 0.02, 1e-3};
static const tol T_BF16 = {0.0028, 0.029, 0.01, 0.0059, 1e-3, 0.02, 0.02, 1e-3};

/* Near-tie margin below which a selection may differ (bf16 score units). */
#define SEL_TIE 1e-2

static double max_abs(const float *a, const float *b, int64_t n) {
    double m = 0;
    for (int64_t i = 0; i < n; i++) m = fmax(m, fabs((double)a[i] - b[i]));
    return m;
}

static int same_set(const int32_t *a, const int32_t *b, int k) {
    for (int i = 0; i < k; i++) {
        if (a[i] < 0) continue;
        int found = 0;
        for (int j = 0; j < k; j++) found |= b[j] == a[i];
        if (!found) return 0;
    }
    for (int i = 0; i < k; i++) {
        if (b[i] < 0) continue;
        int found = 0;
        for (int j = 0; j < k; j++) found |= a[j] == b[i];
        if (!found) return 0;
    }
    return 1;
}

static void fixture(const char *fx, const tol *T) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    gold_model g;
    if (gold_open(&g, shared, fx)) {
        CHECK(0);
        return;
    }
    const di_config *c = &g.cfg;
    int64_t S = 0, D = c->dim, V = c->vocab_size;
    int hc = c->hc_mult, L = c->n_layers;
    const int32_t *ids = gold_i32(&g, "short.prompt_ids", &S);
    const float *layer_in = gold_f32(&g, "short.prefill.layer_in", NULL);
    const float *pre_in = gold_f32(&g, "short.prefill.layer_pre_in", NULL);
    const float *engram_in = gold_f32(&g, "short.prefill.engram_in", NULL);
    const float *attn_out = gold_f32(&g, "short.prefill.attn_out", NULL);
    const float *ffn_out = gold_f32(&g, "short.prefill.ffn_out", NULL);
    const float *final_out = gold_f32(&g, "short.prefill.final_out", NULL);
    const float *final_pre = gold_f32(&g, "short.prefill.final_pre", NULL);
    const float *logits = gold_f32(&g, "short.prefill.logits", NULL);
    const int32_t *hash = gold_i32(&g, "short.prefill.engram_hash_ids", NULL);
    if (!ids || !layer_in || !pre_in || !engram_in || !attn_out || !ffn_out || !final_out ||
        !final_pre || !logits || !hash) {
        CHECK(0);
        gold_close(&g);
        return;
    }
    fprintf(stderr, "%s (short prompt, teacher forced):\n", fx);
    di_err err = {0};
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &g.lm, S + 8, 0, &err) == DI_OK);
    di_fwd_seq q = {&st, ids, S};
    di_fwd f;
    CHECK(di_fwd_begin(&f, &g.lm, &q, 1, &err) == DI_OK);

    /* level 1: Engram row ids */
    int ncols = (c->engram_max_ngram - 1) * c->engram_n_heads;
    int64_t nh = S * c->n_engram * ncols, bad = 0;
    for (int64_t i = 0; i < nh; i++) bad += f.hash[i] != hash[i];
    CHECKF(bad == 0, "%lld Engram row ids differ", (long long)bad);

    int64_t ns = S * hc * D;
    float *s = malloc((size_t)ns * sizeof(float));
    float *pre = malloc((size_t)(S * hc) * sizeof(float));
    float *ao = malloc((size_t)(S * D) * sizeof(float));
    float *fo = malloc((size_t)(S * D) * sizeof(float));
    di_fwd_trace tr = {ao, fo};
    f.trace = &tr;
    for (int l = 0; l < L; l++) {
        const di_layer_role *r = &c->roles[l];
        memcpy(s, layer_in + l * ns, (size_t)ns * sizeof(float));
        memcpy(pre, pre_in + (int64_t)l * S * hc, (size_t)(S * hc) * sizeof(float));
        di_status rc = di_fwd_block(&f, l, s, pre, &err);
        CHECKF(rc == DI_OK, "block %d: %s", l, err.msg);
        if (rc) break;
        const float *next, *next_pre;
        if (l + 1 < L) {
            int e = c->roles[l + 1].engram;
            next = e >= 0 ? engram_in + (int64_t)e * ns : layer_in + (l + 1) * ns;
            next_pre = pre_in + (int64_t)(l + 1) * S * hc;
        } else {
            next = final_out;
            next_pre = final_pre;
        }
        double es = rel_l2(s, next, ns), ep = max_abs(pre, next_pre, S * hc);
        double ea = rel_l2(ao, attn_out + l * S * D, S * D), ef = rel_l2(fo, ffn_out + l * S * D, S * D);
        fprintf(stderr, "  block %2d: stream %.2e pre %.2e attn %.2e ffn %.2e", l, es, ep, ea, ef);
        CHECKF(es <= T->stream, "block %d stream %.3e", l, es);
        CHECKF(ep <= T->pre, "block %d pre %.3e", l, ep);
        CHECKF(ea <= T->attn, "block %d attn %.3e", l, ea);
        CHECKF(ef <= T->ffn, "block %d ffn %.3e", l, ef);
        char name[96];
        if (r->owns_compressor) {
            int64_t ne = S / r->ratio, n1 = 0, n2 = 0;
            snprintf(name, sizeof name, "short.prefill.compress_kv.L%d", l);
            const float *gk = gold_f32(&g, name, &n1);
            snprintf(name, sizeof name, "short.prefill.index_k.L%d", l);
            const float *gi = gold_f32(&g, name, &n2);
            if (gk && gi && n1 == ne * c->head_dim && n2 == ne * c->index_head_dim) {
                float *ck = malloc((size_t)n1 * sizeof(float)), *ik = malloc((size_t)n2 * sizeof(float));
                CHECK(ck && ik && di_seqstate_read_ckv(&st, l, 0, ne, ck, &err) == DI_OK &&
                      di_seqstate_read_ikey(&st, l, 0, ne, ik, &err) == DI_OK);
                double e1 = rel_l2(ck, gk, n1), e2 = rel_l2(ik, gi, n2);
                free(ck);
                free(ik);
                fprintf(stderr, " ckv %.2e ik %.2e", e1, e2);
                CHECKF(e1 <= T->ckv, "block %d compressed kv %.3e", l, e1);
                CHECKF(e2 <= T->ik, "block %d index keys %.3e", l, e2);
            } else {
                CHECK(0);
            }
        }
        if (r->is_index_source) {
            int64_t n = 0;
            snprintf(name, sizeof name, "short.prefill.sel.L%d", l);
            const int32_t *gs = gold_i32(&g, name, &n);
            snprintf(name, sizeof name, "short.prefill.margin.L%d", l);
            const float *gm = gold_f32(&g, name, NULL);
            int k = gs ? (int)(n / S) : 0, diff = 0, tied = 0;
            double tie_max = 0;
            for (int64_t i = 0; gs && gm && i < S; i++) {
                int32_t mine[1024];
                for (int j = 0; j < k; j++)
                    mine[j] = j < c->index_topk ? f.sel[l][i * c->index_topk + j] : -1;
                if (!same_set(mine, gs + i * k, k)) {
                    if (gm[i] < SEL_TIE) {
                        tied++;
                        tie_max = fmax(tie_max, gm[i]);
                    }
                    else diff++;
                }
            }
            fprintf(stderr, " sel: %d rows differ (+%d at near-ties, margin <= %.2g)", diff, tied, tie_max);
            CHECKF(gs && gm && diff == 0, "block %d: %d selections differ away from ties", l, diff);
        }
        if (r->is_candidate_source) {
            int64_t n = 0;
            int nb = c->candidate_topk_blocks, diff = 0, tied = 0;
            snprintf(name, sizeof name, "short.prefill.cand_blocks.L%d", l);
            const int32_t *gb = gold_i32(&g, name, &n);
            snprintf(name, sizeof name, "short.prefill.cand_margin.L%d", l);
            const float *gm = gold_f32(&g, name, NULL);
            for (int64_t i = 0; gb && gm && n == S * nb && i < S; i++)
                if (memcmp(f.cand + i * nb, gb + i * nb, (size_t)nb * sizeof(int32_t))) {
                    if (gm[i] < SEL_TIE) tied++;
                    else diff++;
                }
            fprintf(stderr, " candidate blocks: %d rows differ (+%d at near-ties)", diff, tied);
            CHECKF(gb && gm && n == S * nb && diff == 0, "block %d: %d candidate rows differ", l, diff);
        }
        fputc('\n', stderr);
    }
    /* each Engram module on its golden input */
    for (int e = 0; e < c->n_engram; e++) {
        int l = c->engram_layers[e];
        memcpy(s, engram_in + (int64_t)e * ns, (size_t)ns * sizeof(float));
        CHECK(di_engram_apply(&f, l, s, &err) == DI_OK);
        double ee = rel_l2(s, layer_in + l * ns, ns);
        fprintf(stderr, "  engram of block %d: %.2e\n", l, ee);
        CHECKF(ee <= T->engram, "engram %d: %.3e", l, ee);
    }
    /* final collapse and norm (within one bf16 step: the fp32 sum of squares
     * may round differently once in a while), then the fp32 head on the
     * golden normalised hidden */
    const float *fno = gold_f32(&g, "short.prefill.final_norm_out", NULL);
    float *lg = malloc((size_t)(S * V) * sizeof(float));
    float *h = malloc((size_t)(S * D) * sizeof(float));
    int64_t off_ulp = 0;
    g.be->ops->hc_collapse(g.be, final_out, final_pre, S, hc, D, h);
    g.be->ops->rmsnorm(g.be, h, &g.w.norm, S, D, c->eps, h);
    for (int64_t i = 0; fno && i < S * D; i++) {
        double ulp = fabs((double)fno[i]) * 0x1p-7 + 1e-30;
        off_ulp += fabs((double)h[i] - fno[i]) > ulp;
    }
    CHECKF(fno && off_ulp == 0, "%lld final-norm values off by more than one bf16 step", (long long)off_ulp);
    g.be->ops->matmul(g.be, &g.lm.head, fno ? fno : h, S, lg, 0);
    double eh = max_abs(lg, logits, S * V);
    fprintf(stderr, "  final norm: all within one bf16 step; head on the golden norm: max |diff| %.2e\n", eh);
    CHECKF(eh <= T->head, "head %.3e", eh);
    free(h);
    di_fwd_end(&f);
    free(lg);
    free(s);
    free(pre);
    free(ao);
    free(fo);
    di_seqstate_free(&st);
    gold_close(&g);
}

static void test_fp8(void) { fixture("v41-tiny", &T_FP8); }
static void test_bf16(void) { fixture("v41-tiny-bf16", &T_BF16); }

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    RUN(test_fp8);
    RUN(test_bf16);
    return test_summary();
}
