/* The engine end to end on the golden tiny model: greedy continuations
 * equal the reference's up to the first near-tie, batching (1..32
 * sequences, mixed prompt lengths, chunk sizes, budgets, async on/off)
 * never changes a greedy output, seeded sampling is identical across batch
 * compositions, orders and thread counts, logits are bit-identical alone
 * and inside random batches, prompt logprobs match the reference's
 * log-softmax. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "golden_util.h"
#include "io/safetensors.h"
#include "backend/cpu/kernels.h"
#include "test.h"

static char g_model[4200];
static di_safetensors g_gold;
static int g_have;

static const void *gold(const char *name, int64_t *numel) {
    for (size_t i = 0; i < g_gold.n_entries; i++)
        if (!strcmp(g_gold.entries[i].name, name)) {
            di_tensor t;
            di_safetensors_tensor(&g_gold, i, &t);
            if (numel) *numel = (int64_t)(t.nbytes / 4);
            return t.data;
        }
    fprintf(stderr, "golden tensor %s missing\n", name);
    return NULL;
}

static di_engine *open_engine(int max_batch, int64_t budget, int64_t chunk, int async, int threads) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = g_model;
    o.max_batch = max_batch;
    o.max_tokens_per_step = budget;
    o.max_prefill_chunk = chunk;
    o.async_scheduling = async;
    o.n_threads = threads;
    di_engine *e = NULL;
    di_status st = di_engine_open(&o, &e);
    CHECKF(st == DI_OK, "open: %s", di_last_error());
    return e;
}

static di_sampling_params greedy(int64_t n) {
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0;
    p.max_tokens = n;
    p.ignore_eos = 1;
    return p;
}

static const int32_t *ids_of(const char *prompt) {
    char nm[128];
    snprintf(nm, sizeof nm, "%s.prompt_ids", prompt);
    return gold(nm, NULL);
}

static void test_golden_greedy(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(8, 512, 0, 1, 0);
    if (!e) return;
    const char *names[2] = {"short", "long"};
    int np = quick_mode() ? 1 : 2;
    uint64_t id[2];
    di_sampling_params p = greedy(33);
    for (int k = 0; k < np; k++) {
        char nm[128];
        int64_t S = 0;
        snprintf(nm, sizeof nm, "%s.prompt_ids", names[k]);
        const int32_t *ids = gold(nm, &S);
        CHECK(di_engine_submit_tokens(e, ids, (size_t)S, &p, &id[k]) == DI_OK);
    }
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    for (int k = 0; k < np; k++) {
        char nm[128];
        int64_t S = 0, V = 1024;
        snprintf(nm, sizeof nm, "%s.prompt_ids", names[k]);
        gold(nm, &S);
        snprintf(nm, sizeof nm, "%s.decode.input_ids", names[k]);
        const int32_t *din = gold(nm, NULL);
        snprintf(nm, sizeof nm, "%s.decode.next_ids", names[k]);
        const int32_t *dnext = gold(nm, NULL);
        snprintf(nm, sizeof nm, "%s.decode.margin", names[k]);
        const float *dmargin = gold(nm, NULL);
        snprintf(nm, sizeof nm, "%s.prefill.logits", names[k]);
        const float *pl = gold(nm, NULL);
        if (!din || !dnext || !dmargin || !pl) { CHECK(0); continue; }
        di_completion c;
        CHECK(di_engine_get_completion(e, id[k], 0, &c) == DI_OK);
        CHECK_EQ_INT(c.n_tokens, 33);
        CHECK_EQ_INT(c.finish_reason, DI_FINISH_LENGTH);
        /* first token: argmax of the last prefill row (margin from it) */
        const float *last = pl + (S - 1) * V;
        float a = -1e30f, b = -1e30f;
        for (int64_t v = 0; v < V; v++) {
            if (last[v] > a) b = a, a = last[v];
            else if (last[v] > b) b = last[v];
        }
        int matched = 0;
        if (a - b >= 1.2f) {
            CHECK_EQ_INT(c.token_ids[0], din[0]);
            matched = c.token_ids[0] == din[0];
            for (int i = 0; matched && i < 32; i++) {
                if (dmargin[i] < 1.2f) break;
                CHECKF(c.token_ids[i + 1] == dnext[i], "%s step %d: %d vs golden %d", names[k], i + 1,
                       c.token_ids[i + 1], dnext[i]);
                if (c.token_ids[i + 1] != dnext[i]) break;
                matched++;
            }
        }
        fprintf(stderr, "  %s: %d greedy tokens equal to the reference before the first near-tie\n", names[k],
                matched);
        if (a - b >= 1.2f) CHECK(matched >= 1);
        /* teacher-forced through the engine: the prompt followed by the 32
         * golden greedy tokens, read back as prompt logprobs; every
         * prediction whose golden margin is clear must be the golden token */
        int32_t *tf = malloc((size_t)(S + 32) * sizeof(int32_t));
        memcpy(tf, ids_of(names[k]), (size_t)S * sizeof(int32_t));
        memcpy(tf + S, din, 32 * sizeof(int32_t));
        di_sampling_params tp = greedy(0);
        tp.prompt_logprobs = 1;
        uint64_t tid;
        CHECK(di_engine_submit_tokens(e, tf, (size_t)S + 32, &tp, &tid) == DI_OK);
        CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
        di_request_output ro;
        CHECK(di_engine_get_output(e, tid, &ro) == DI_OK);
        int clear = 0, agree = 0;
        for (int i = 1; i < 32 && ro.prompt_top_ids; i++) {
            int32_t top = ro.prompt_top_ids[S + i]; /* predicts token S+i = din[i] = dnext[i-1] */
            agree += top == din[i];
            if (dmargin[i - 1] < 1.2f) continue;
            clear++;
            CHECKF(top == din[i], "%s teacher-forced step %d: %d vs golden %d", names[k], i, top, din[i]);
        }
        fprintf(stderr, "  %s teacher-forced: %d of 31 argmax equal, all %d clear-margin steps checked\n", names[k],
                agree, clear);
        CHECK(clear >= 5);
        free(tf);
        /* and all 33 equal a plain one-sequence greedy loop over the runner */
        const di_runner *r = &e->runner;
        void *st = NULL;
        di_err err = {0};
        float *lg = malloc((size_t)V * sizeof(float));
        CHECK(r->ops->state_new(r->ctx, S + 40, &st, &err) == DI_OK);
        di_runner_seq q = {st, ids_of(names[k]), S};
        int same = 1;
        for (int i = 0; i < 33 && same; i++) {
            CHECK(r->ops->forward(r->ctx, &q, 1, lg, 0, &err) == DI_OK);
            int32_t best = 0;
            for (int32_t v = 1; v < V; v++)
                if (lg[v] > lg[best]) best = v;
            same = best == c.token_ids[i];
            q.ids = &c.token_ids[i];
            q.n = 1;
        }
        CHECKF(same, "%s: engine greedy differs from a one-sequence loop", names[k]);
        r->ops->state_free(r->ctx, st);
        free(lg);
    }
    di_engine_close(e);
}

/* Prompts of mixed lengths cut from the long golden prompt. */
static int make_prompts(int32_t (*pr)[96], int *len, int n) {
    int64_t S = 0;
    const int32_t *ids = gold("long.prompt_ids", &S);
    if (!ids) return 0;
    for (int i = 0; i < n; i++) {
        len[i] = 2 + (i * 29) % 90;
        int off = (i * 41) % (int)(S - 96);
        memcpy(pr[i], ids + off, (size_t)len[i] * sizeof(int32_t));
    }
    return 1;
}

#define NP 32
#define NT 4

static void run_batch(di_engine *e, int32_t (*pr)[96], const int *len, const int *which, int n,
                      const di_sampling_params *p, int32_t (*out)[NT], int *nout) {
    uint64_t id[NP];
    for (int i = 0; i < n; i++)
        CHECKF(di_engine_submit_tokens(e, pr[which[i]], (size_t)len[which[i]], p, &id[i]) == DI_OK, "%s",
               di_last_error());
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    for (int i = 0; i < n; i++) {
        di_completion c;
        CHECK(di_engine_get_completion(e, id[i], 0, &c) == DI_OK);
        nout[which[i]] = (int)c.n_tokens;
        memcpy(out[which[i]], c.token_ids, c.n_tokens * sizeof(int32_t));
        di_engine_release(e, id[i]);
    }
}

static void test_batch_equivalence(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    static int32_t pr[NP][96], ref[NP][NT], got[NP][NT];
    int len[NP], nref[NP], ngot[NP], which[NP];
    /* 32 prompts with DEEPINFER_TEST_FULL, 12 by default, 4 under sanitizers */
    int n = getenv("DEEPINFER_TEST_FULL") ? NP : quick_mode() ? 4 : 12;
    if (!make_prompts(pr, len, NP)) { CHECK(0); return; }
    di_sampling_params p = greedy(NT);
    /* reference: every prompt alone */
    di_engine *e = open_engine(1, 512, 0, 0, 0);
    if (!e) return;
    for (int i = 0; i < n; i++) {
        which[0] = i;
        run_batch(e, pr, len, which, 1, &p, ref, nref);
    }
    di_engine_close(e);
    struct { int mb; int64_t budget, chunk; int async, batch; } cfgs[] = {
        {32, 512, 0, 1, 32}, {7, 50, 9, 0, 16}, {32, 96, 13, 1, 24}, {4, 64, 64, 1, 2},
    };
    int nc = quick_mode() ? 1 : 4;
    for (int c = 0; c < nc; c++) {
        e = open_engine(cfgs[c].mb, cfgs[c].budget, cfgs[c].chunk, cfgs[c].async, 0);
        if (!e) return;
        int bs = cfgs[c].batch < n ? cfgs[c].batch : n;
        for (int s = 0; s < n; s += bs) {
            int k = 0;
            for (int i = s; i < s + bs && i < n; i++) which[k++] = (i * 7 + c) % n; /* shuffled order */
            run_batch(e, pr, len, which, k, &p, got, ngot);
        }
        int same = 1;
        for (int i = 0; i < n; i++)
            if (ngot[i] != nref[i] || memcmp(got[i], ref[i], (size_t)nref[i] * sizeof(int32_t))) {
                if (same) fprintf(stderr, "  config %d: prompt %d (len %d) differs\n", c, i, len[i]);
                same = 0;
            }
        CHECKF(same, "config %d: batched greedy outputs differ from single-sequence ones", c);
        di_engine_close(e);
    }
}

/* Rows by need (the runner's forward_rows: greedy rows as summaries,
 * rows that draw nothing left on the backend) against every row's logits
 * (DI_ENGINE_ROWS=0) on the real model: the same tokens, per-token
 * logprobs and cumulative logprobs, bit for bit, for greedy under
 * ignore_eos (EOS banned in the summary), greedy with min_tokens, greedy
 * with top logprobs (the row) and seeded sampling, in chunked prefill
 * (rows that draw nothing) and async steps. */
static void test_rows_by_need(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    static int32_t pr[NP][96];
    int len[NP];
    if (!make_prompts(pr, len, NP)) { CHECK(0); return; }
    enum { NR = 8, NTOK = 5 };
    int32_t tok[2][NR][NTOK];
    float lp[2][NR][NTOK], tlp[2][NR][2 * NTOK];
    int32_t tid[2][NR][2 * NTOK];
    double cum[2][NR];
    int nt[2][NR], rows_on[2];
    for (int pass = 0; pass < 2; pass++) {
        if (pass) setenv("DI_ENGINE_ROWS", "0", 1);
        di_engine *e = open_engine(8, 40, 9, 1, 0);
        if (pass) unsetenv("DI_ENGINE_ROWS");
        if (!e) return;
        rows_on[pass] = e->rows_on;
        uint64_t id[NR];
        for (int i = 0; i < NR; i++) {
            di_sampling_params p = greedy(NTOK);
            p.logprobs = 0;
            if (i % 4 == 1) p.ignore_eos = 0, p.min_tokens = 3;
            if (i % 4 == 2) p.logprobs = 2;
            if (i % 4 == 3) p.temperature = 0.7, p.has_seq_seed = 1, p.seq_seed = 11 + (uint64_t)i;
            CHECKF(di_engine_submit_tokens(e, pr[i], (size_t)len[i], &p, &id[i]) == DI_OK, "%s", di_last_error());
        }
        CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
        for (int i = 0; i < NR; i++) {
            di_completion c;
            CHECK(di_engine_get_completion(e, id[i], 0, &c) == DI_OK);
            nt[pass][i] = (int)c.n_tokens;
            cum[pass][i] = c.cumulative_logprob;
            for (size_t t = 0; t < c.n_tokens && t < NTOK; t++) {
                tok[pass][i][t] = c.token_ids[t];
                lp[pass][i][t] = c.logprobs ? c.logprobs[t] : NAN;
                for (int k = 0; k < 2; k++) { /* the top two where asked (i % 4 == 2) */
                    tid[pass][i][2 * t + k] = c.n_top == 2 ? c.top_ids[2 * t + k] : -1;
                    tlp[pass][i][2 * t + k] = c.n_top == 2 ? c.top_logprobs[2 * t + k] : 0.0f;
                }
            }
            CHECKF(c.n_top == (i % 4 == 2 ? 2 : 0), "request %d: %d top logprobs", i, (int)c.n_top);
        }
        di_engine_close(e);
    }
    CHECKF(rows_on[0] == 1 && rows_on[1] == 0, "rows by need: on %d / off %d", rows_on[0], rows_on[1]);
    for (int i = 0; i < NR; i++) {
        CHECKF(nt[0][i] == nt[1][i] && nt[0][i] >= 1, "request %d: %d / %d tokens", i, nt[0][i], nt[1][i]);
        CHECKF(!memcmp(tok[0][i], tok[1][i], (size_t)nt[0][i] * sizeof(int32_t)) &&
                   !memcmp(lp[0][i], lp[1][i], (size_t)nt[0][i] * sizeof(float)) &&
                   !memcmp(&cum[0][i], &cum[1][i], sizeof(double)) &&
                   !memcmp(tid[0][i], tid[1][i], (size_t)nt[0][i] * 2 * sizeof(int32_t)) &&
                   !memcmp(tlp[0][i], tlp[1][i], (size_t)nt[0][i] * 2 * sizeof(float)),
               "request %d: tokens or logprobs differ (cumulative %.17g / %.17g)", i, cum[0][i], cum[1][i]);
    }
}

static void test_seeded_sampling(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    static int32_t pr[NP][96], a[NP][NT], b[NP][NT], c2[NP][NT];
    int len[NP], na[NP], nb[NP], nc[NP], which[NP];
    int n = quick_mode() ? 3 : 6, total = 2 * n;
    if (!make_prompts(pr, len, 12)) { CHECK(0); return; }
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0.9;
    p.top_k = 60;
    p.top_p = 0.95;
    p.max_tokens = NT;
    p.ignore_eos = 1;
    p.has_seq_seed = 1;
    p.seq_seed = 424242;
    /* alone, one thread */
    di_engine *e = open_engine(1, 512, 0, 0, 1);
    if (!e) return;
    for (int i = 0; i < n; i++) {
        which[0] = i;
        run_batch(e, pr, len, which, 1, &p, a, na);
    }
    di_engine_close(e);
    /* together in reverse order with as many unrelated requests, two threads */
    e = open_engine(16, 40, 7, 1, 2);
    if (!e) return;
    for (int i = 0; i < total; i++) which[i] = total - 1 - i;
    run_batch(e, pr, len, which, total, &p, b, nb);
    /* again, another order, same engine (a second run) */
    for (int i = 0; i < total; i++) which[i] = (i * 5) % total;
    run_batch(e, pr, len, which, total, &p, c2, nc);
    di_engine_close(e);
    int same = 1, nontrivial = 0;
    for (int i = 0; i < n; i++) {
        same &= na[i] == nb[i] && !memcmp(a[i], b[i], (size_t)na[i] * 4);
        same &= na[i] == nc[i] && !memcmp(a[i], c2[i], (size_t)na[i] * 4);
        nontrivial += na[i] == NT;
    }
    CHECK(same);
    CHECK_EQ_INT(nontrivial, n);
    /* a different seed gives a different continuation somewhere */
    p.seq_seed = 7;
    e = open_engine(16, 512, 0, 1, 0);
    if (!e) return;
    for (int i = 0; i < n; i++) which[i] = i;
    run_batch(e, pr, len, which, n, &p, b, nb);
    di_engine_close(e);
    int differ = 0;
    for (int i = 0; i < n; i++) differ += memcmp(a[i], b[i], (size_t)NT * 4) != 0;
    CHECKF(differ > 0, "seed change had no effect");
}

/* Logits of a "needle" sequence alone vs inside random batches, in random
 * chunks: byte-identical. Drives the runner directly. */
static void test_batch_invariant_logits(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(64, 4096, 0, 0, 0);
    if (!e) return;
    const di_runner *r = &e->runner;
    int64_t S = 0, V = r->vocab;
    const int32_t *ids = gold("long.prompt_ids", &S);
    int need = 48;
    di_err err = {0};
    float *alone = malloc((size_t)(need * V) * sizeof(float));
    float *lg = malloc((size_t)(1024 * V) * sizeof(float));
    void *st = NULL;
    CHECK(r->ops->state_new(r->ctx, 256, &st, &err) == DI_OK);
    di_runner_seq q = {st, ids + 100, need};
    CHECK(r->ops->forward(r->ctx, &q, 1, alone, 1, &err) == DI_OK);
    r->ops->state_free(r->ctx, st);
    uint64_t rng = 12345;
    int trials = quick_mode() ? 2 : 6, identical = 1;
    for (int t = 0; t < trials; t++) {
        int mates = 1 + (int)(di_rng_bits(rng, (uint64_t)t, 1, 0) % 12);
        void *states[16];
        for (int m = 0; m <= mates; m++) CHECK(r->ops->state_new(r->ctx, 256, &states[m], &err) == DI_OK);
        /* needle at a random slot, fed in random chunks; mates prefill first */
        int slot = (int)(di_rng_bits(rng, (uint64_t)t, 2, 0) % (uint64_t)(mates + 1));
        int done = 0;
        while (done < need) {
            di_runner_seq b[16];
            int64_t row = 0, needle_row = -1;
            int chunk = 1 + (int)(di_rng_bits(rng, (uint64_t)t, 3, (uint64_t)done) % 20);
            if (chunk > need - done) chunk = need - done;
            for (int m = 0; m <= mates; m++) {
                if (m == slot) {
                    b[m] = (di_runner_seq){states[m], ids + 100 + done, chunk};
                    needle_row = row;
                } else {
                    int len = 1 + (int)(di_rng_bits(rng, (uint64_t)t, 4, (uint64_t)(m * 100 + done)) % 9);
                    b[m] = (di_runner_seq){states[m], ids + (m * 31 + done) % 400, len};
                }
                row += b[m].n;
            }
            CHECK(r->ops->forward(r->ctx, b, mates + 1, lg, 1, &err) == DI_OK);
            if (memcmp(lg + needle_row * V, alone + (int64_t)done * V, (size_t)(chunk * V) * sizeof(float)))
                identical = 0;
            done += chunk;
        }
        for (int m = 0; m <= mates; m++) r->ops->state_free(r->ctx, states[m]);
    }
    CHECKF(identical, "needle logits changed inside a batch");
    free(alone);
    free(lg);
    di_engine_close(e);
}

static void test_prompt_logprobs(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(8, 512, 16, 1, 0);
    if (!e) return;
    int64_t S = 0, V = 1024;
    const int32_t *ids = gold("short.prompt_ids", &S);
    const float *pl = gold("short.prefill.logits", NULL);
    di_sampling_params p = greedy(0);
    p.prompt_logprobs = 3;
    uint64_t id;
    CHECKF(di_engine_submit_tokens(e, ids, (size_t)S, &p, &id) == DI_OK, "%s", di_last_error());
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    di_request_output o;
    CHECK(di_engine_get_output(e, id, &o) == DI_OK);
    CHECK(o.prompt_logprobs != NULL);
    CHECK(isnan(o.prompt_logprobs[0]));
    double sum = 0, mx = 0;
    int top_ok = 1;
    for (int64_t i = 1; i < S; i++) {
        const float *row = pl + (i - 1) * V;
        double m = -1e30, z = 0;
        for (int64_t v = 0; v < V; v++) m = fmax(m, row[v]);
        for (int64_t v = 0; v < V; v++) z += exp(row[v] - m);
        double ref = row[ids[i]] - m - log(z);
        double d = fabs(ref - o.prompt_logprobs[i]);
        sum += d;
        mx = fmax(mx, d);
        const float *tl = o.prompt_top_logprobs + i * 3;
        top_ok &= tl[0] >= tl[1] && tl[1] >= tl[2] && o.prompt_logprobs[i] <= tl[0] + 1e-6f;
    }
    fprintf(stderr, "  prompt logprobs vs reference: mean |diff| %.4f, max %.4f\n", sum / (double)(S - 1), mx);
    CHECK(sum / (double)(S - 1) < 0.25);
    CHECK(mx < 3.9);
    CHECK(top_ok);
    di_completion c;
    CHECK(di_engine_get_completion(e, id, 0, &c) == DI_OK);
    CHECK_EQ_INT(c.n_tokens, 0);
    di_engine_close(e);
}

/* Recompute preemption on the real model: a small admission margin makes
 * sequences grow (new state, recompute) and a budget of about two states
 * makes them evict each other; the tokens equal an unconstrained run's. */
static void test_preemption_real(void) {
    if (!g_have) SKIP("../shared (golden fixtures) not found");
    di_engine *e = open_engine(8, 512, 0, 1, 0);
    if (!e) return;
    enum { NQ = 4, NOUT_MAX = 24 };
    const int NOUT = quick_mode() ? 12 : NOUT_MAX;
    int32_t pr[NQ][32];
    size_t pl[NQ];
    int64_t S = 0;
    const int32_t *ids = gold("long.prompt_ids", &S);
    for (int i = 0; i < NQ; i++) {
        pl[i] = 5 + (size_t)i * 7;
        memcpy(pr[i], ids + 50 * i, pl[i] * sizeof(int32_t));
    }
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0.8;
    p.max_tokens = NOUT;
    p.ignore_eos = 1;
    p.has_seq_seed = 1;
    p.seq_seed = 99;
    uint64_t id[NQ];
    int32_t ref[NQ][NOUT_MAX];
    for (int i = 0; i < NQ; i++) CHECK(di_engine_submit_tokens(e, pr[i], pl[i], &p, &id[i]) == DI_OK);
    CHECK(di_engine_run(e, NULL, NULL) == DI_OK);
    for (int i = 0; i < NQ; i++) {
        di_completion c;
        CHECK(di_engine_get_completion(e, id[i], 0, &c) == DI_OK);
        CHECK_EQ_INT(c.n_tokens, NOUT);
        memcpy(ref[i], c.token_ids, (size_t)NOUT * sizeof(int32_t));
    }
    const di_runner *r = &e->runner;
    di_engine_cfg cfg = {.max_model_len = 1024, .max_batch = 8, .budget = 64, .max_chunk = 16,
                         .memory_limit = 2 * r->ops->state_bytes(r->ctx, 24), .async = 1, .eos_id = 1, .bos_id = 0};
    di_engine *e2 = calloc(1, sizeof *e2);
    di_err err = {0};
    CHECK(di_engine_init(e2, r, e->tok, &cfg, &err) == DI_OK);
    e2->sched.margin = 4;
    for (int i = 0; i < NQ; i++) CHECK(di_engine_add(e2, pr[i], pl[i], &p, 0, 0, &id[i], &err) == DI_OK);
    size_t active = 1;
    for (int g = 0; active && g < 10000; g++) CHECK(di_engine_do_step(e2, &active, &err) == DI_OK);
    CHECK_EQ_INT(active, 0);
    int same = 1;
    for (int i = 0; i < NQ; i++) {
        di_completion c;
        CHECK(di_engine_get_completion(e2, id[i], 0, &c) == DI_OK);
        same &= (int)c.n_tokens == NOUT && !memcmp(ref[i], c.token_ids, (size_t)NOUT * sizeof(int32_t));
    }
    CHECK(same);
    fprintf(stderr, "  %llu preemptions, peak %llu of %llu bytes\n", (unsigned long long)e2->stats.preemptions,
            (unsigned long long)e2->mem.peak, (unsigned long long)cfg.memory_limit);
    CHECK(e2->stats.preemptions > 0);
    CHECK(e2->mem.peak <= cfg.memory_limit);
    CHECK_EQ_INT(e2->mem.used, 0);
    di_engine_fini(e2);
    free(e2);
    di_engine_close(e);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    const char *shared = test_shared_dir();
    if (shared) {
        snprintf(g_model, sizeof g_model, "%s/golden/v41-tiny", shared);
        char path[4300];
        di_err err = {0};
        snprintf(path, sizeof path, "%s/golden/v41-tiny/golden.safetensors", shared);
        g_have = di_safetensors_open(path, &g_gold, &err) == DI_OK;
    }
    RUN(test_golden_greedy);
    RUN(test_batch_equivalence);
    RUN(test_rows_by_need);
    RUN(test_seeded_sampling);
    RUN(test_batch_invariant_logits);
    RUN(test_prompt_logprobs);
    RUN(test_preemption_real);
    if (g_have) di_safetensors_close(&g_gold);
    return test_summary();
}
