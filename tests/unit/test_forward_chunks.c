/* Sequence handling of the forward pass: prefilling a prompt in one chunk or
 * in chunks of 1, 7 and 64 tokens (and 13 and 7 through the forms without
 * step metadata) gives bit-identical logits; a sequence
 * gives the same logits alone or batched with other sequences at other
 * positions (and the same DSpark draft after a chunked prefill); rolling back and replaying restores the exact state. Uses the
 * golden tiny model and the long prompt (523 tokens, 160 in sanitizer builds:
 * the window wraps, ratio-2 groups straddle chunk borders, the candidate pool
 * restricts the re-index layers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_util.h"
#include "backend/cpu/kernels.h"
#include "test.h"

static gold_model G;
static int64_t S, V;
static const int32_t *IDS;
static float *REF; /* [S, V] one-chunk prefill */
static float REF_DRAFT[8 * 1024]; /* DSpark round after the one-chunk prefill */
static int32_t REF_IDS[8];
static int64_t LEN; /* tokens used (DEEPINFER_TEST_QUICK shortens the prompt) */

static int setup(void) {
    const char *shared = test_shared_dir();
    if (!shared) return 0;
    if (gold_open(&G, shared, "v41-tiny")) return -1;
    IDS = gold_i32(&G, "long.prompt_ids", &S);
    V = G.cfg.vocab_size;
    LEN = quick_mode() ? 160 : S;
    REF = malloc((size_t)(LEN * V) * sizeof(float));
    di_err err = {0};
    di_seqstate st;
    if (di_seqstate_init(&st, &G.lm, S + 16, 8, &err)) return -1;
    di_fwd_seq q = {&st, IDS, LEN};
    int rc = di_forward(&G.lm, &q, 1, REF, 1, &err) != DI_OK;
    float conf[8];
    if (!rc && G.lm.has_dspark && G.cfg.dspark_block_size <= 8 && V <= 1024)
        rc = di_dspark_draft(&G.lm, &st, 7, REF_DRAFT, NULL, conf, REF_IDS, &err) != DI_OK;
    di_seqstate_free(&st);
    return rc ? -1 : 1;
}

static void check_chunks(int chunk) {
    di_err err = {0};
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &G.lm, S + 16, 8, &err) == DI_OK);
    float *lg = malloc((size_t)(LEN * V) * sizeof(float));
    for (int64_t t = 0; t < LEN; t += chunk) {
        int64_t n = LEN - t < chunk ? LEN - t : chunk;
        di_fwd_seq q = {&st, IDS + t, n};
        CHECK(di_forward(&G.lm, &q, 1, lg + t * V, 1, &err) == DI_OK);
    }
    int64_t diff = 0;
    for (int64_t i = 0; i < LEN * V; i++) diff += lg[i] != REF[i];
    CHECKF(diff == 0, "chunks of %d: %lld logits differ from the one-chunk prefill", chunk, (long long)diff);
    /* the DSpark rings were filled chunk by chunk: same draft */
    if (G.lm.has_dspark && G.cfg.dspark_block_size <= 8 && V <= 1024) {
        float conf[8];
        int32_t ids[8];
        CHECK(di_dspark_draft(&G.lm, &st, 7, lg, NULL, conf, ids, &err) == DI_OK);
        int64_t dd = 0;
        for (int64_t i = 0; i < G.cfg.dspark_block_size * V; i++) dd += lg[i] != REF_DRAFT[i];
        CHECKF(dd == 0, "chunks of %d: %lld draft logits differ", chunk, (long long)dd);
        if (chunk == 64) {
            /* sampled drafting: noise that singles out token 3 in every slot
             * picks it (the Markov bias then follows the sampled tokens) */
            int B = G.cfg.dspark_block_size;
            float *noise = malloc((size_t)(B * V) * sizeof(float));
            for (int64_t i = 0; i < B * V; i++) noise[i] = (i % V == 3) ? 1e-30f : 1e30f;
            CHECK(di_dspark_draft_sampled(&G.lm, &st, 7, 1.0f, noise, lg, NULL, conf, ids, &err) == DI_OK);
            for (int i = 0; i < B; i++) CHECK_EQ_INT(ids[i], 3);
            free(noise);
        }
    }
    free(lg);
    di_seqstate_free(&st);
}

/* The same through the forms without the step metadata (a backend with no
 * buffer forms): the compressor gathers its groups row by row from the
 * chunk and the per-token ring, then writes the ring. Chunks of 13 tokens
 * (longer than that ring, odd, so ratio-2 groups straddle chunk borders)
 * make a chunk overwrite ring slots its first group still reads. */
static void check_chunks_host_forms(int chunk) {
    di_backend *saved = G.lm.be;
    di_backend_ops o = *saved->ops;
    o.index_scores_kv_buf = NULL; /* forward.c's has_buf_forms: no metadata */
    di_backend be = *saved;
    be.ops = &o;
    G.lm.be = &be;
    check_chunks(chunk);
    G.lm.be = saved;
}

static void test_chunks(void) {
    if (!REF) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    check_chunks(64);
    check_chunks(7);
    check_chunks(1);
    check_chunks_host_forms(13);
    check_chunks_host_forms(7);
}

/* di_forward_rows through a chunked prefill: chunks that draw nothing
 * (DI_ROW_NONE) skip the head and leave the buffers alone, the state
 * advances as with di_forward; the last chunk's row as logits equals the
 * one-chunk prefill's last row, its greedy summary di_row_greedy_of of
 * it; two sequences, one wanting nothing, one a summary with a ban. */
static void test_rows(void) {
    if (!REF) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    if (!G.lm.be->ops->logits_greedy) SKIP("backend without logits_greedy");
    di_err err = {0};
    const int64_t chunk = 37;
    float *lg = malloc((size_t)(2 * V) * sizeof(float));
    for (int form = 0; form < 2; form++) { /* the last row as logits, then as a summary */
        di_seqstate st;
        CHECK(di_seqstate_init(&st, &G.lm, S + 16, 8, &err) == DI_OK);
        int untouched = 1;
        di_row_greedy g = {0};
        for (int64_t t = 0; t < LEN; t += chunk) {
            const int64_t n = LEN - t < chunk ? LEN - t : chunk;
            const int last = t + n == LEN;
            di_fwd_seq q = {&st, IDS + t, n};
            di_row_want w = {.mode = last ? (form ? DI_ROW_GREEDY : DI_ROW_LOGITS) : DI_ROW_NONE, .ban = -1};
            memset(&g, 0xff, sizeof g);
            for (int64_t i = 0; i < V; i++) lg[i] = -12345.0f;
            di_fwd_out o = {&w, V, &g, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
            CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_OK);
            if (!last || form) /* nothing written but what was asked */
                for (int64_t i = 0; i < V; i++) untouched &= lg[i] == -12345.0f;
            if (!last) {
                uint8_t ff[sizeof g];
                memset(ff, 0xff, sizeof ff);
                untouched &= !memcmp(&g, ff, sizeof g);
            }
        }
        CHECKF(untouched, "form %d: a row not asked for was written", form);
        const float *ref = REF + (LEN - 1) * V;
        if (form == 0) {
            int64_t diff = 0;
            for (int64_t i = 0; i < V; i++) diff += lg[i] != ref[i];
            CHECKF(diff == 0, "the last row's logits: %lld differ from the one-chunk prefill", (long long)diff);
        } else {
            di_row_greedy h;
            di_row_greedy_of(ref, V, V, -1, &h);
            CHECK(!memcmp(&g, &h, sizeof g));
        }
        di_seqstate_free(&st);
    }
    /* two sequences: one draws nothing, the other a summary banning its
     * first maximum (the search's next best) */
    di_seqstate a, b;
    CHECK(di_seqstate_init(&a, &G.lm, S + 16, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&b, &G.lm, S + 16, 0, &err) == DI_OK);
    di_row_greedy h0;
    di_row_greedy_of(REF + 99 * V, V, V, -1, &h0);
    di_fwd_seq two[2] = {{&a, IDS, 64}, {&b, IDS, 100}};
    di_row_want w2[2] = {{.mode = DI_ROW_NONE, .ban = -1}, {.mode = DI_ROW_GREEDY, .ban = h0.token}};
    di_row_greedy g2[2];
    memset(g2, 0xff, sizeof g2);
    di_fwd_out o2 = {w2, V, g2, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
    CHECK(di_forward_rows(&G.lm, two, 2, lg, &o2, &err) == DI_OK);
    di_row_greedy h;
    di_row_greedy_of(REF + 99 * V, V, V, h0.token, &h);
    CHECK(!memcmp(&g2[1], &h, sizeof h) && h.token != h0.token);
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    /* five sequences, the head's rows left out where nothing is read: every
     * mix of modes delivers each row as the plain forward's */
    enum { NS = 5 };
    const int64_t lens[NS] = {64, 100, 37, 80, 1};
    const int32_t modes[3][NS] = {{DI_ROW_GREEDY, DI_ROW_NONE, DI_ROW_LOGITS, DI_ROW_GREEDY, DI_ROW_NONE},
                                  {DI_ROW_LOGITS, DI_ROW_LOGITS, DI_ROW_NONE, DI_ROW_GREEDY, DI_ROW_GREEDY},
                                  {DI_ROW_NONE, DI_ROW_GREEDY, DI_ROW_GREEDY, DI_ROW_NONE, DI_ROW_LOGITS}};
    float *ref = malloc((size_t)(NS * V) * sizeof(float)), *got = malloc((size_t)(NS * V) * sizeof(float));
    for (int c = -1; c < 3; c++) {
        di_seqstate sts[NS];
        di_fwd_seq qs[NS];
        for (int q = 0; q < NS; q++) {
            CHECK(di_seqstate_init(&sts[q], &G.lm, S + 16, 0, &err) == DI_OK);
            qs[q] = (di_fwd_seq){&sts[q], IDS + 3 * q, lens[q]};
        }
        if (c < 0) {
            CHECK(di_forward(&G.lm, qs, NS, ref, 0, &err) == DI_OK);
        } else {
            di_row_want w[NS];
            di_row_greedy gs[NS];
            for (int q = 0; q < NS; q++) w[q] = (di_row_want){.mode = modes[c][q], .ban = q == 3 ? 2 : -1};
            for (int64_t i = 0; i < NS * V; i++) got[i] = -12345.0f;
            di_fwd_out o = {w, V, gs, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
            CHECK(di_forward_rows(&G.lm, qs, NS, got, &o, &err) == DI_OK);
            for (int q = 0; q < NS; q++) {
                int64_t bad = 0;
                for (int64_t i = 0; i < V; i++)
                    bad += w[q].mode == DI_ROW_LOGITS ? got[q * V + i] != ref[q * V + i] : got[q * V + i] != -12345.0f;
                if (w[q].mode == DI_ROW_GREEDY) {
                    di_row_greedy h;
                    di_row_greedy_of(ref + q * V, V, V, w[q].ban, &h);
                    bad += memcmp(&gs[q], &h, sizeof h) != 0;
                }
                CHECKF(bad == 0, "mix %d, sequence %d (mode %d): %lld values wrong", c, q, w[q].mode, (long long)bad);
            }
        }
        for (int q = 0; q < NS; q++) di_seqstate_free(&sts[q]);
    }
    free(ref);
    free(got);
    free(lg);
}

/* Sequence A (short prompt then decode) batched with B (the long prompt, in
 * chunks, at other positions): A's logits equal A alone; B's equal REF. */
static void test_batch(void) {
    if (!REF) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    int64_t sa = 0;
    const int32_t *a_ids = gold_i32(&G, "short.prompt_ids", &sa);
    const int32_t *a_dec = gold_i32(&G, "short.decode.input_ids", NULL);
    di_seqstate a, b, solo;
    CHECK(di_seqstate_init(&a, &G.lm, S + 16, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&b, &G.lm, S + 16, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&solo, &G.lm, S + 16, 0, &err) == DI_OK);
    float *alone = malloc((size_t)((sa + 4) * V) * sizeof(float));
    float *lg = malloc((size_t)((sa + LEN) * V) * sizeof(float));
    /* A alone: prefill, then 4 decode steps */
    di_fwd_seq q = {&solo, a_ids, sa};
    CHECK(di_forward(&G.lm, &q, 1, alone, 1, &err) == DI_OK);
    for (int i = 0; i < 4; i++) {
        di_fwd_seq d = {&solo, a_dec + i, 1};
        CHECK(di_forward(&G.lm, &d, 1, alone + (sa + i) * V, 1, &err) == DI_OK);
    }
    /* B gets a head start of 100 tokens */
    di_fwd_seq qb = {&b, IDS, 100};
    CHECK(di_forward(&G.lm, &qb, 1, lg, 1, &err) == DI_OK);
    int64_t diff = 0;
    for (int64_t i = 0; i < 100 * V; i++) diff += lg[i] != REF[i];
    /* batch 1: A's whole prompt with B's next 37 tokens */
    di_fwd_seq two[2] = {{&a, a_ids, sa}, {&b, IDS + 100, 37}};
    CHECK(di_forward(&G.lm, two, 2, lg, 1, &err) == DI_OK);
    int64_t da = 0;
    for (int64_t i = 0; i < sa * V; i++) da += lg[i] != alone[i];
    for (int64_t i = 0; i < 37 * V; i++) diff += lg[sa * V + i] != REF[100 * V + i];
    /* then 4 steps: A decodes one token while B prefills 5 */
    for (int s = 0; s < 4; s++) {
        di_fwd_seq pair[2] = {{&b, IDS + 137 + 5 * s, 5}, {&a, a_dec + s, 1}};
        CHECK(di_forward(&G.lm, pair, 2, lg, 1, &err) == DI_OK);
        for (int64_t i = 0; i < 5 * V; i++) diff += lg[i] != REF[(137 + 5 * s) * V + i];
        for (int64_t i = 0; i < V; i++) da += lg[5 * V + i] != alone[(sa + s) * V + i];
    }
    CHECKF(da == 0, "%lld logits of A differ between alone and batched", (long long)da);
    CHECKF(diff == 0, "%lld logits of B differ from the one-chunk prefill", (long long)diff);
    free(alone);
    free(lg);
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    di_seqstate_free(&solo);
}

/* Prefill 131 tokens (the window has wrapped), feed 5 wrong tokens, roll
 * back 5, continue with the right ones: the logits equal the straight
 * prefill's. */
static void test_rollback(void) {
    if (!REF) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &G.lm, S + 16, 8, &err) == DI_OK);
    float *lg = malloc((size_t)(32 * V) * sizeof(float));
    di_fwd_seq q = {&st, IDS, 131};
    CHECK(di_forward(&G.lm, &q, 1, NULL, 1, &err) == DI_OK);
    int32_t wrong[5] = {5, 6, 7, 8, 9};
    di_fwd_seq w = {&st, wrong, 5};
    CHECK(di_forward(&G.lm, &w, 1, NULL, 1, &err) == DI_OK);
    CHECK(di_seqstate_rollback(&st, 131, &err) == DI_OK);
    CHECK(di_seqstate_rollback(&st, 100, &err) != DI_OK); /* beyond max_rollback */
    di_fwd_seq r = {&st, IDS + 131, 20};
    CHECK(di_forward(&G.lm, &r, 1, lg, 1, &err) == DI_OK);
    int64_t diff = 0;
    for (int64_t i = 0; i < 20 * V; i++) diff += lg[i] != REF[131 * V + i];
    CHECKF(diff == 0, "%lld logits differ after rollback", (long long)diff);
    free(lg);
    di_seqstate_free(&st);
}

/* Bad input gives errors, not crashes. */
static void test_errors(void) {
    if (!REF) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &G.lm, 10, 0, &err) == DI_OK);
    int32_t bad = (int32_t)V;
    di_fwd_seq q = {&st, &bad, 1};
    CHECK(di_forward(&G.lm, &q, 1, NULL, 1, &err) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(err.msg, "outside");
    di_fwd_seq big = {&st, IDS, 11};
    CHECK(di_forward(&G.lm, &big, 1, NULL, 1, &err) == DI_ERR_LIMIT);
    di_fwd_seq twice[2] = {{&st, IDS, 1}, {&st, IDS, 1}};
    CHECK(di_forward(&G.lm, twice, 2, NULL, 1, &err) == DI_ERR_INVALID_ARG);
    /* draws need a backend that makes them (the CPU's leaves them to the
     * sampler); an unknown mode is refused; nothing runs either way */
    float *lg = malloc((size_t)V * sizeof *lg);
    di_row_greedy g;
    di_row_want w = {.mode = DI_ROW_DRAW, .ban = -1, .draw = {.inv_t = 1.0f, .top_p = 1.0, .ban = -1}};
    di_fwd_out o = {&w, V, &g, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
    const di_status want = G.lm.be->ops->logits_draw ? DI_ERR_INVALID_ARG : DI_ERR_UNSUPPORTED;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == want);
    if (!G.lm.be->ops->logits_draw) CHECK_STR_CONTAINS(err.msg, "logits_draw");
    /* a draw's edited ids: within the list, ascending, below V */
    di_row_edit ed[3] = {{.id = 4, .flags = DI_EDIT_BAN}, {.id = 2, .flags = DI_EDIT_BAN}, {.id = (int32_t)V}};
    w.draw.n_edit = 2, w.draw.e0 = 0;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* no list */
    CHECK_STR_CONTAINS(err.msg, "edits");
    o.edits = ed, o.n_edits = 1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* past its end */
    CHECK_STR_CONTAINS(err.msg, "outside a list of 1");
    o.n_edits = 3;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* descending */
    CHECK_STR_CONTAINS(err.msg, "edited id 2");
    w.draw.e0 = 2, w.draw.n_edit = 1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* id V */
    w.draw.e0 = -1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    w.draw.e0 = 1, w.draw.n_edit = 1; /* {2}: a good list, the backend decides */
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == want);
    w.mode = DI_ROW_MODES;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(err.msg, "row mode");
    /* top lists: a greedy or drawn row's, within the step's length and
     * DI_ROW_TOP_MAX, into a buffer, on a backend that forms them */
    di_row_top tops[4];
    w = (di_row_want){.mode = DI_ROW_GREEDY, .ban = -1, .top = 3};
    o = (di_fwd_out){&w, V, &g, NULL, 0, NULL, 3, 0, 0, NULL, NULL, NULL, NULL};
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* no buffer */
    CHECK_STR_CONTAINS(err.msg, "top list");
    o.top = tops;
    if (!G.lm.be->ops->logits_top) { /* the CPU's rows are where the sampler reads them */
        CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.msg, "logits_top");
    }
    w.top = 4; /* past the step's length */
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    w.top = 1, w.mode = DI_ROW_LOGITS; /* a row that comes whole */
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    w.mode = DI_ROW_GREEDY, o.top_k = DI_ROW_TOP_MAX + 1, w.top = 1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(err.msg, "top lists of 33");
    /* all rows by targets: ids or -1 below V, their buffers, a list length
     * within DI_ROW_TOP_MAX, on a backend that picks values */
    w.top = 0, o.top_k = 0;
    int32_t tg[1] = {3};
    di_row_greedy rs[1];
    float rx[1];
    o.all_rows = 1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* no targets */
    o.target = tg, o.row_sum = rs, o.row_x = rx, o.row_k = 2;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG); /* a list without its buffer */
    o.row_top = tops, o.row_k = DI_ROW_TOP_MAX + 1;
    CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
    o.row_k = 2, tg[0] = (int32_t)V;
    if (G.lm.be->ops->logits_pick) {
        CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_INVALID_ARG);
        CHECK_STR_CONTAINS(err.msg, "outside the vocabulary");
    } else { /* the CPU's rows are where the sampler reads them */
        CHECK(di_forward_rows(&G.lm, &q, 1, lg, &o, &err) == DI_ERR_UNSUPPORTED);
        CHECK_STR_CONTAINS(err.msg, "logits_pick");
    }
    free(lg);
    CHECK_EQ_INT(st.n_tokens, 0);
    di_seqstate_free(&st);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    int ok = setup();
    if (ok < 0) {
        CHECK(0);
        return test_summary();
    }
    RUN(test_chunks);
    RUN(test_rows);
    RUN(test_batch);
    RUN(test_rollback);
    RUN(test_errors);
    free(REF);
    if (ok > 0) gold_close(&G);
    return test_summary();
}
