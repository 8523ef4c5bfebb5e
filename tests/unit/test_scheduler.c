/* Scheduler and memory manager against a fake runner whose logits are a
 * deterministic function of each sequence's token history: the outputs of
 * many requests must not depend on batch size, token budget, chunk size,
 * async scheduling or a memory budget so small that sequences are
 * preempted and recomputed; nothing is lost, and the plan respects its
 * limits. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine.h"
#include "test.h"
#include "draw_ref.h"

#define FV 64 /* fake vocabulary */

typedef struct fake_state {
    int64_t cap, n;
    uint64_t h;
} fake_state;

typedef struct fake {
    int64_t max_rows, max_seqs, calls, overflow;
    /* the logits buffer the engine got from logits_alloc: each forward must
     * write into the live one, large enough, and fini must give it back */
    int64_t allocs, frees, foreign;
    void *live;
    size_t live_bytes;
} fake;

static uint64_t fmix(uint64_t h, uint64_t x) { return di_rng_bits(h, x, 17, 23); }

static uint64_t f_bytes(void *ctx, int64_t cap) { return 4096 + 64 * (uint64_t)cap; }
static di_status f_new(void *ctx, int64_t cap, void **st, di_err *err) {
    fake_state *s = calloc(1, sizeof *s);
    if (!s) return di_err_set(err, DI_ERR_NOMEM, "oom");
    s->cap = cap;
    *st = s;
    return DI_OK;
}
static void f_free(void *ctx, void *st) { free(st); }
static di_status f_forward(void *ctx, const di_runner_seq *seqs, int n, float *logits, int all_rows, di_err *err) {
    fake *f = ctx;
    int64_t rows = 0, row = 0;
    for (int i = 0; i < n; i++) rows += seqs[i].n;
    if ((void *)logits != f->live || (size_t)(all_rows ? rows : n) * FV * sizeof(float) > f->live_bytes)
        f->foreign++;
    if (rows > f->max_rows) f->max_rows = rows;
    if (n > f->max_seqs) f->max_seqs = n;
    f->calls++;
    for (int i = 0; i < n; i++) {
        fake_state *s = seqs[i].state;
        for (int64_t j = 0; j < seqs[i].n; j++) {
            s->h = fmix(s->h, (uint64_t)seqs[i].ids[j]);
            if (++s->n > s->cap) f->overflow++;
            if (all_rows || j == seqs[i].n - 1) {
                float *o = logits + (all_rows ? row : i) * FV;
                for (int v = 0; v < FV; v++) o[v] = (float)(fmix(s->h, (uint64_t)v) % 8000) / 1000.0f - 4.0f;
            }
            row++;
        }
    }
    return DI_OK;
}
static void *f_logits_alloc(void *ctx, size_t bytes) {
    fake *f = ctx;
    if (f->live) f->foreign++; /* the old buffer must be given back first */
    f->allocs++;
    f->live = malloc(bytes);
    f->live_bytes = bytes;
    return f->live;
}
static void f_logits_free(void *ctx, void *p) {
    fake *f = ctx;
    if (p != f->live) f->foreign++;
    f->frees++;
    f->live = NULL;
    free(p);
}
static const di_runner_ops fake_ops = {.state_bytes = f_bytes, .state_new = f_new, .state_free = f_free,
                                       .forward = f_forward, .logits_alloc = f_logits_alloc,
                                       .logits_free = f_logits_free};

/* forward_rows over the same logits: the wanted rows' logits or their
 * greedy summaries (core/row_exp.h), every other row NaN, so that an
 * engine reading a row it did not ask for goes wrong visibly. */
static int64_t g_rows_greedy, g_rows_logits, g_rows_none, g_rows_banned, g_rows_drawn, g_rows_left, g_rows_edited,
    g_rows_tops, g_rows_targets;
static di_status f_forward_rows(void *ctx, const di_runner_seq *seqs, int n, float *logits, const di_fwd_out *out,
                                di_err *err) {
    /* the pass's rows: one a sequence, or with all_rows every row (the
     * sequences' last rows at the ends of their chunks) */
    int64_t m = 0;
    for (int i = 0; i < n; i++) m += out->all_rows ? seqs[i].n : 1;
    float *all = malloc((size_t)m * FV * sizeof *all);
    if (!all) return di_err_set(err, DI_ERR_NOMEM, "oom");
    fake *f = ctx;
    void *live = f->live;
    size_t live_bytes = f->live_bytes;
    f->live = all, f->live_bytes = (size_t)m * FV * sizeof *all; /* f_forward checks its buffer */
    di_status st = f_forward(ctx, seqs, n, all, out->all_rows, err);
    f->live = live, f->live_bytes = live_bytes;
    if ((void *)logits != f->live || (size_t)n * FV * sizeof(float) > f->live_bytes) f->foreign++;
    for (int64_t r = 0; out->all_rows && r < m && !st; r++) { /* the target rows */
        const int32_t t = out->target[r];
        if (t < -1 || t >= FV) st = di_err_set(err, DI_ERR_INVALID_ARG, "target %d", (int)t);
        if (t < 0) continue;
        di_row_greedy_of(all + (size_t)r * FV, FV, FV, -1, &out->row_sum[r]);
        out->row_x[r] = all[(size_t)r * FV + (size_t)t];
        if (out->row_k > 0) di_row_top_of(all + (size_t)r * FV, FV, out->row_k, out->row_top + (size_t)r * out->row_k);
        g_rows_targets++;
    }
    for (int i = 0, end = 0; i < n && !st; i++) {
        const di_row_want w = out->want[i];
        float *o = logits + (size_t)i * FV;
        end += out->all_rows ? (int)seqs[i].n : 1;
        const float *x = all + (size_t)(end - 1) * FV; /* the sequence's last row */
        for (int v = 0; v < FV; v++) o[v] = NAN;
        if (w.mode == DI_ROW_LOGITS) {
            memcpy(o, x, FV * sizeof *o);
            g_rows_logits++;
        } else if (w.mode == DI_ROW_GREEDY) {
            di_row_greedy_of(x, FV, out->lim, w.ban, &out->greedy[i]);
            g_rows_greedy++;
            g_rows_banned += w.ban >= 0;
        } else if (w.mode == DI_ROW_DRAW) {
            /* the reference's draw; near sets wider than 6 left to the
             * host, whose row then comes as the logits */
            if (!draw_ref(x, FV, out->lim, &w.draw, out->edits, 6, &out->greedy[i])) st = DI_ERR_NOMEM;
            g_rows_edited += w.draw.n_edit > 0;
            if (out->greedy[i].pad) memcpy(o, x, FV * sizeof *o);
            g_rows_drawn++;
            g_rows_left += out->greedy[i].pad;
        } else {
            g_rows_none++;
        }
        /* a top list: the reference's, at the step's length */
        if (w.top > 0 && (w.mode == DI_ROW_GREEDY || w.mode == DI_ROW_DRAW)) {
            if (w.top > out->top_k || !out->top) st = di_err_set(err, DI_ERR_INVALID_ARG, "top %d of %d", (int)w.top, (int)out->top_k);
            else di_row_top_of(x, FV, out->top_k, out->top + (size_t)i * out->top_k);
            g_rows_tops++;
        } else if (w.top != 0) {
            st = di_err_set(err, DI_ERR_INVALID_ARG, "top %d in mode %d", (int)w.top, (int)w.mode);
        }
    }
    free(all);
    return st;
}
static const di_runner_ops fake_rows_ops = {.state_bytes = f_bytes, .state_new = f_new, .state_free = f_free,
                                            .forward = f_forward, .forward_rows = f_forward_rows,
                                            .logits_alloc = f_logits_alloc, .logits_free = f_logits_free};
static int g_rows; /* run_all's runner offers forward_rows */
static int g_tops; /* and top lists */

#define NREQ 40

static int g_sample_threads; /* the engine's sampling threads (0: its default) */

typedef struct outcome {
    int32_t toks[NREQ][2][256];
    double cum[NREQ][2]; /* cumulative logprob */
    float lp[NREQ][2][256];      /* the sampled tokens' logprobs (requests with logprobs) */
    int32_t top_ids[NREQ][2][256 * 3];
    float top_lp[NREQ][2][256 * 3];
    float plp[NREQ][200];         /* prompt logprobs (requests with prompt_logprobs) */
    int32_t ptop_ids[NREQ][200 * 2];
    float ptop_lp[NREQ][200 * 2];
    int n[NREQ][2];
    int finish[NREQ][2];
} outcome;

static void make_prompt(int r, int32_t *ids, int *n) {
    *n = 1 + (r * 37) % 150;
    for (int i = 0; i < *n; i++) ids[i] = 3 + (int32_t)((r * 7 + i * 13) % (FV - 3));
}

static int run_all(outcome *out, int max_batch, int64_t budget, int64_t chunk, uint64_t mem, int async,
                   fake *f, uint64_t *preempt) {
    di_runner r = {g_rows ? &fake_rows_ops : &fake_ops, f, FV, g_rows, g_rows && g_tops, g_rows && g_tops};
    di_engine_cfg cfg = {.max_model_len = 400, .max_batch = max_batch, .budget = budget, .max_chunk = chunk,
                         .memory_limit = mem, .async = async, .seed = 5, .eos_id = 1, .bos_id = 0,
                         .sample_threads = g_sample_threads};
    di_engine *e = calloc(1, sizeof *e);
    di_err err = {0};
    if (di_engine_init(e, &r, NULL, &cfg, &err)) return -1;
    uint64_t ids[NREQ];
    for (int q = 0; q < NREQ; q++) {
        int32_t p[200];
        int n;
        make_prompt(q, p, &n);
        di_sampling_params sp;
        di_sampling_params_default(&sp);
        sp.max_tokens = 1 + (q * 53) % 250;
        sp.temperature = q % 3 ? 0.8 : 0.0;
        sp.top_p = q % 4 ? 0.9 : 1.0;
        sp.n = q % 5 == 0 ? 2 : 1;
        sp.has_seq_seed = q % 2;
        sp.seq_seed = 1000 + (uint64_t)q;
        sp.ignore_eos = q % 7 == 0 || q % 6 == 3;
        sp.min_tokens = q % 11 == 0 && sp.max_tokens >= 4 ? 4 : 0; /* EOS banned for the first tokens */
        sp.logprobs = q % 13 == 0 ? 3 : -1;  /* top logprobs: the logits row */
        if (q % 7 == 5) sp.prompt_logprobs = q % 2 ? 2 : 0; /* every prompt row: its target's logprob (+ a top list) */
        /* processing that edits ids (drawn with the row's edits where the
         * runner draws): penalties, bias (one id twice now and then: no
         * list form, the host's), stop ids before min_tokens */
        static const int32_t bias_ids[3] = {5, 9, 5}, stop_ids[2] = {7, 11};
        static const float bias_v[3] = {2.5f, -1.5f, 1.0f};
        if (q % 4 == 1) sp.repetition_penalty = 1.3;
        if (q % 6 == 2) sp.presence_penalty = 0.5, sp.frequency_penalty = 0.2;
        if (q % 9 == 4) sp.logit_bias_ids = bias_ids, sp.logit_bias_values = bias_v, sp.n_logit_bias = q % 2 ? 3 : 2;
        if (q % 8 == 3 && sp.max_tokens >= 6) sp.stop_token_ids = stop_ids, sp.n_stop_token_ids = 2, sp.min_tokens = 6;
        if (di_engine_add(e, p, (size_t)n, &sp, 0, 0, &ids[q], &err)) return -2;
    }
    size_t active = 1;
    int guard = 0;
    while (active && guard++ < 100000)
        if (di_engine_do_step(e, &active, &err)) return -3;
    for (int q = 0; q < NREQ; q++) {
        di_request_output ro;
        if (di_engine_get_output(e, ids[q], &ro) || !ro.finished) return -4;
        if (ro.prompt_logprobs) {
            memcpy(out->plp[q], ro.prompt_logprobs, ro.n_prompt * sizeof(float));
            if (ro.n_prompt_top == 2) {
                memcpy(out->ptop_ids[q], ro.prompt_top_ids, ro.n_prompt * 2 * sizeof(int32_t));
                memcpy(out->ptop_lp[q], ro.prompt_top_logprobs, ro.n_prompt * 2 * sizeof(float));
            }
        }
        for (size_t j = 0; j < ro.n_completions; j++) {
            di_completion c;
            di_engine_get_completion(e, ids[q], j, &c);
            out->n[q][j] = (int)c.n_tokens;
            out->finish[q][j] = c.finish_reason;
            out->cum[q][j] = c.cumulative_logprob;
            memcpy(out->toks[q][j], c.token_ids, c.n_tokens * sizeof(int32_t));
            if (c.logprobs) memcpy(out->lp[q][j], c.logprobs, c.n_tokens * sizeof(float));
            if (c.n_top == 3) {
                memcpy(out->top_ids[q][j], c.top_ids, c.n_tokens * 3 * sizeof(int32_t));
                memcpy(out->top_lp[q][j], c.top_logprobs, c.n_tokens * 3 * sizeof(float));
            }
        }
    }
    *preempt = e->stats.preemptions;
    int leak = e->mem.used != 0;
    di_engine_fini(e);
    free(e);
    return leak ? -5 : 0;
}

static void test_invariance(void) {
    static outcome ref, o;
    fake f0 = {0};
    uint64_t pre = 0;
    CHECK_EQ_INT(run_all(&ref, 64, 512, 0, 1ull << 30, 0, &f0, &pre), 0);
    CHECK_EQ_INT(pre, 0);
    CHECK_EQ_INT(f0.overflow, 0);
    int stopped = 0, lengths = 0;
    for (int q = 0; q < NREQ; q++) {
        stopped += ref.finish[q][0] == DI_FINISH_STOP;
        lengths += ref.finish[q][0] == DI_FINISH_LENGTH;
        CHECK(ref.n[q][0] >= 1);
    }
    CHECKF(stopped > 0 && lengths > 0, "stop %d length %d", stopped, lengths);
    struct {
        int mb;
        int64_t budget, chunk;
        uint64_t mem;
        int async;
    } cases[] = {
        {1, 512, 0, 1ull << 30, 1},    /* one at a time */
        {3, 17, 5, 1ull << 30, 0},     /* tiny budget, small chunks */
        {32, 64, 16, 1ull << 30, 1},
        {64, 512, 0, 30000, 1},        /* memory for a few sequences: preemption */
        {8, 40, 7, 32000, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) {
        fake f = {0};
        memset(&o, 0, sizeof o);
        int rc = run_all(&o, cases[c].mb, cases[c].budget, cases[c].chunk, cases[c].mem, cases[c].async, &f, &pre);
        CHECKF(rc == 0, "case %zu: rc %d", c, rc);
        CHECKF(f.max_rows <= cases[c].budget, "case %zu: %lld rows", c, (long long)f.max_rows);
        CHECKF(f.max_seqs <= cases[c].mb, "case %zu: %lld seqs", c, (long long)f.max_seqs);
        CHECK_EQ_INT(f.overflow, 0);
        /* the logits live in the runner's memory, and all of it comes back */
        CHECKF(f.allocs >= 1 && f.allocs == f.frees && f.foreign == 0 && !f.live,
               "case %zu: logits buffers %lld allocated, %lld freed, %lld foreign", c, (long long)f.allocs,
               (long long)f.frees, (long long)f.foreign);
        if (cases[c].mem < 100000) CHECKF(pre > 0, "case %zu: no preemption", c);
        int same = 1;
        for (int q = 0; q < NREQ; q++)
            for (int j = 0; j < (q % 5 == 0 ? 2 : 1); j++)
                if (o.n[q][j] != ref.n[q][j] || o.finish[q][j] != ref.finish[q][j] ||
                    memcmp(o.toks[q][j], ref.toks[q][j], (size_t)ref.n[q][j] * sizeof(int32_t))) {
                    if (same)
                        fprintf(stderr, "  case %zu: request %d.%d: %d tokens (%d) vs %d (%d)\n", c, q, j, o.n[q][j],
                                o.finish[q][j], ref.n[q][j], ref.finish[q][j]);
                    same = 0;
                }
        CHECKF(same, "case %zu: outputs differ from the reference", c);
    }
    /* the rows of a step drawn on 1, 3 or 7 threads: the same outputs */
    for (int nt = 1; nt <= 7; nt += 2) {
        fake f = {0};
        memset(&o, 0, sizeof o);
        g_sample_threads = nt;
        int rc = run_all(&o, 64, 512, 0, 1ull << 30, 0, &f, &pre);
        g_sample_threads = 0;
        CHECKF(rc == 0, "%d sampling threads: rc %d", nt, rc);
        int same = 1;
        for (int q = 0; q < NREQ; q++)
            for (int j = 0; j < (q % 5 == 0 ? 2 : 1); j++)
                same &= o.n[q][j] == ref.n[q][j] && o.finish[q][j] == ref.finish[q][j] &&
                        !memcmp(o.toks[q][j], ref.toks[q][j], (size_t)ref.n[q][j] * sizeof(int32_t));
        CHECKF(same, "%d sampling threads: outputs differ from the reference", nt);
    }
    /* rows by need (forward_rows): the same tokens and logprobs bit for bit,
     * in every case above; the greedy rows came as summaries (EOS banned
     * in some), the other rows' logits as NaN */
    g_rows = 1;
    g_rows_greedy = g_rows_logits = g_rows_none = g_rows_banned = g_rows_drawn = g_rows_left = g_rows_edited = 0;
    g_rows_tops = g_rows_targets = 0;
    for (size_t c = 0; c < sizeof cases / sizeof *cases + 1; c++) {
        fake f = {0};
        memset(&o, 0, sizeof o);
        g_sample_threads = c % 2 ? 3 : 1; /* the edit lists built on one thread or three */
        g_tops = c % 3 != 2; /* the top logprobs' lists by the runner, or their rows' logits */
        int rc = c == 0 ? run_all(&o, 64, 512, 0, 1ull << 30, 0, &f, &pre)
                        : run_all(&o, cases[c - 1].mb, cases[c - 1].budget, cases[c - 1].chunk, cases[c - 1].mem,
                                  cases[c - 1].async, &f, &pre);
        g_sample_threads = 0;
        CHECKF(rc == 0, "rows, case %zu: rc %d", c, rc);
        CHECKF(f.foreign == 0 && f.allocs == f.frees, "rows, case %zu: logits buffer misused", c);
        int same = 1;
        for (int q = 0; q < NREQ; q++)
            for (int j = 0; j < (q % 5 == 0 ? 2 : 1); j++)
                same &= o.n[q][j] == ref.n[q][j] && o.finish[q][j] == ref.finish[q][j] &&
                        !memcmp(o.toks[q][j], ref.toks[q][j], (size_t)ref.n[q][j] * sizeof(int32_t)) &&
                        !memcmp(&o.cum[q][j], &ref.cum[q][j], sizeof(double)) &&
                        !memcmp(o.lp[q][j], ref.lp[q][j], (size_t)ref.n[q][j] * sizeof(float)) &&
                        !memcmp(o.top_ids[q][j], ref.top_ids[q][j], (size_t)ref.n[q][j] * 3 * sizeof(int32_t)) &&
                        !memcmp(o.top_lp[q][j], ref.top_lp[q][j], (size_t)ref.n[q][j] * 3 * sizeof(float));
        /* prompt logprobs (NaN at position 0 in both: compared as bits) */
        same &= !memcmp(o.plp, ref.plp, sizeof o.plp) && !memcmp(o.ptop_ids, ref.ptop_ids, sizeof o.ptop_ids) &&
                !memcmp(o.ptop_lp, ref.ptop_lp, sizeof o.ptop_lp);
        CHECKF(same, "rows, case %zu: outputs differ from the reference", c);
    }
    g_rows = 0;
    g_tops = 0;
    CHECKF(g_rows_greedy > 100 && g_rows_logits > 100 && g_rows_none > 10 && g_rows_banned > 10 &&
               g_rows_drawn > 100 && g_rows_left > 10 && g_rows_left < g_rows_drawn && g_rows_edited > 100 &&
               g_rows_tops > 100 && g_rows_targets > 100,
           "rows: %lld greedy (%lld with a ban), %lld drawn (%lld left to the host, %lld with edited ids), %lld logits, "
           "%lld none, %lld with top lists, %lld target rows",
           (long long)g_rows_greedy, (long long)g_rows_banned, (long long)g_rows_drawn, (long long)g_rows_left,
           (long long)g_rows_edited, (long long)g_rows_logits, (long long)g_rows_none, (long long)g_rows_tops,
           (long long)g_rows_targets);
}

/* A runner whose forward fails without a message still fails the step
 * (with a message of the engine's), once, not a step that spins. */
static di_status f_forward_mute(void *ctx, const di_runner_seq *seqs, int n, float *logits, int all_rows,
                                di_err *err) {
    return DI_ERR_BACKEND;
}
static void test_runner_mute_failure(void) {
    static const di_runner_ops mute_ops = {.state_bytes = f_bytes, .state_new = f_new, .state_free = f_free,
                                           .forward = f_forward_mute};
    di_runner r = {&mute_ops, NULL, FV, 0, 0, 0};
    di_engine_cfg cfg = {.max_model_len = 64, .max_batch = 4, .budget = 64, .memory_limit = 1 << 20, .seed = 1,
                         .eos_id = 1};
    di_engine *e = calloc(1, sizeof *e);
    di_err err = {0};
    CHECK(di_engine_init(e, &r, NULL, &cfg, &err) == DI_OK);
    const int32_t p[3] = {5, 6, 7};
    di_sampling_params sp;
    di_sampling_params_default(&sp);
    sp.max_tokens = 4;
    uint64_t id;
    CHECK(di_engine_add(e, p, 3, &sp, 0, 0, &id, &err) == DI_OK);
    size_t active = 0;
    CHECK(di_engine_do_step(e, &active, &err) == DI_ERR_BACKEND);
    CHECK_STR_CONTAINS(err.msg, "no message");
    di_engine_fini(e);
    free(e);
}

/* A request whose state can never fit fails alone; the others finish. */
static void test_too_big(void) {
    fake f = {0};
    di_runner r = {&fake_ops, &f, FV, 0, 0, 0};
    di_engine_cfg cfg = {.max_model_len = 4000, .max_batch = 8, .budget = 256, .memory_limit = 4096 + 64 * 200,
                         .async = 1, .seed = 1, .eos_id = 1};
    di_engine *e = calloc(1, sizeof *e);
    di_err err = {0};
    CHECK(di_engine_init(e, &r, NULL, &cfg, &err) == DI_OK);
    int32_t big[500], small[4] = {5, 6, 7, 8};
    for (int i = 0; i < 500; i++) big[i] = 3 + i % 50;
    di_sampling_params sp;
    di_sampling_params_default(&sp);
    sp.temperature = 0;
    sp.ignore_eos = 1;
    sp.max_tokens = 5;
    uint64_t a, b, c;
    CHECK(di_engine_add(e, small, 4, &sp, 0, 0, &a, &err) == DI_OK);
    CHECK(di_engine_add(e, big, 500, &sp, 0, 0, &b, &err) == DI_OK);
    CHECK(di_engine_add(e, small, 3, &sp, 0, 0, &c, &err) == DI_OK);
    size_t active = 1;
    for (int g = 0; active && g < 1000; g++) CHECK(di_engine_do_step(e, &active, &err) == DI_OK);
    CHECK_EQ_INT(active, 0);
    di_completion ca, cb, cc;
    di_engine_get_completion(e, a, 0, &ca);
    di_engine_get_completion(e, b, 0, &cb);
    di_engine_get_completion(e, c, 0, &cc);
    CHECK_EQ_INT(ca.finish_reason, DI_FINISH_LENGTH);
    CHECK_EQ_INT(ca.n_tokens, 5);
    CHECK_EQ_INT(cc.finish_reason, DI_FINISH_LENGTH);
    CHECK_EQ_INT(cb.finish_reason, DI_FINISH_ERROR);
    CHECK_STR_CONTAINS(cb.error, "memory budget");
    CHECK_EQ_INT(e->mem.used, 0);
    di_engine_fini(e);
    free(e);
}

int main(void) {
    RUN(test_invariance);
    RUN(test_too_big);
    RUN(test_runner_mute_failure);
    return test_summary();
}
