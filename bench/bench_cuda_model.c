/* Whole-model forward passes on the CUDA backend with dummy weights of a
 * real-shape config (bench/v41_flash_trunc.py writes one: V4.1-Flash cut to
 * one layer per role), the engine's own forward (model/forward.h) as the
 * scheduler calls it: prefill throughput of one sequence, then decode steps
 * of B sequences at once (one token each, logits of every sequence back on
 * the host, as the sampler needs them). Prints time per step, tokens/s, and
 * per-op profiles (cuda backend's DI_CUDA_PROFILE mode, one profiled pass
 * after the timed ones) so the overheads show. With -l LIST, decode steps
 * at those batch sizes split per layer (the device drained between layers)
 * next to each layer's floor: the bytes one step must read — every weight
 * of the layer but the routed experts, plus the expected number of distinct
 * routed experts the batch touches, 384 (1 - (1 - 6/384)^B) of them — over
 * the device-to-device copy bandwidth measured here.
 *
 * With -n LIST, for each batch size in LIST one decode step (the profiled
 * one) and one per-layer pass are bracketed by cudaProfilerStart / Stop, so
 * a profiler started with its capture off (ncu --profile-from-start off)
 * records those two passes alone; empty mark kernels whose grid size is
 * the tag separate them: 200 before the step, 201 after it, l + 1 before
 * layer l of the per-layer pass and 100 after its last layer. Run with
 * DI_CUDA_PROFILE=events so the step's kernels are those of an unprofiled
 * one (the drained form runs the copy queue at every allocation).
 *
 * With -g 1 the decode steps take the engine's greedy path instead
 * (di_forward_rows with every row DI_ROW_GREEDY: the argmax formed on the
 * device, only the summaries back; the engine does this for requests of
 * plain greedy decoding): the step without the logits' download. -g 2 /
 * -g 3 draw every row at temperature 0.8 / with top-p 0.95 the same way
 * (DI_ROW_DRAW: the engine's temperature draws; a row the backend leaves
 * to the host continues greedily here).
 *
 * With -lp P also a prefill of P tokens split per layer, against its FLOP
 * floor at the FP8 GEMM rate of the backend's tiled kernel measured here
 * (scripts/gpu-e2e sets it beside torch's best FP8 GEMM).
 *
 *   bench_cuda_model CONFIG [-p PROMPT] [-b LIST] [-c CONTEXT] [-s STEPS] [-l LIST] [-lc CONTEXT] [-lp PROMPT]
 *                    [-n LIST] [-g 1|2|3]
 *
 * DEEPINFER_BATCH_INVARIANT=1 times the backend in batch-invariant mode.
 *
 * Lines starting with RESULT are the machine-readable numbers. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_model.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_graph.h"
#include "model/forward.h"

#include "bench_util.h"

static const char *ncu_list = ""; /* -n: batch sizes whose passes a profiler records */
static int greedy_rows = 0;       /* -g 1: decode through di_forward_rows' greedy summaries; 2, 3: draws */

static int list_has(const char *list, int B) {
    for (const char *p = list; *p;) {
        if (atoi(p) == B) return 1;
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    return 0;
}

static void die(const char *what, const di_err *err) {
    fprintf(stderr, "bench_cuda_model: %s: %s\n", what, err ? err->msg : di_last_error());
    exit(1);
}

static void check_backend(di_backend *be, const char *what) {
    di_err err = {0};
    if (di_backend_cuda_status(be, &err)) die(what, &err);
}

static void print_profile(di_backend *be, const char *title) {
    size_t n = di_backend_cuda_profile(be, NULL, 0);
    char *buf = malloc(n + 1);
    if (!buf) return;
    di_backend_cuda_profile(be, buf, n + 1);
    printf("-- profile: %s\n%s", title, buf);
    free(buf);
}

/* ids of a synthetic prompt: deterministic, spread over the vocabulary */
static void fill_ids(int32_t *ids, int64_t n, int64_t vocab, uint64_t seed) {
    for (int64_t i = 0; i < n; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        ids[i] = (int32_t)((seed >> 33) % (uint64_t)(vocab - 16)) + 16;
    }
}

/* The logits buffer: page-locked as the engine's (BENCH_PAGEABLE=1: malloc,
 * to time the download into pageable memory against it). */
static float *logits_alloc(di_backend *be, size_t floats) {
    const char *e = getenv("BENCH_PAGEABLE");
    return e && *e == '1' ? malloc(floats * sizeof(float)) : di_host_alloc(be, floats * sizeof(float));
}
static void logits_free(di_backend *be, float *p) {
    const char *e = getenv("BENCH_PAGEABLE");
    if (e && *e == '1') free(p);
    else di_host_free(be, p);
}

static void bench_prefill(di_lm *lm, di_backend *be, int64_t P) {
    di_err err = {0};
    int64_t V = lm->cfg->vocab_size;
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    float *logits = logits_alloc(be, (size_t)V);
    if (!ids || !logits) die("out of memory", NULL);
    fill_ids(ids, P, V, 7);
    for (int rep = 0; rep < 3; rep++) {
        di_seqstate st;
        if (di_seqstate_init(&st, lm, P + 8, 0, &err)) die("sequence state", &err);
        int prof = rep == 2;
        if (prof) di_backend_cuda_profile_start(be, 1);
        double t0 = bench_now_s();
        di_fwd_seq q = {&st, ids, P};
        if (di_forward(lm, &q, 1, logits, 0, &err)) die("prefill", &err);
        check_backend(be, "prefill");
        double t = bench_now_s() - t0;
        printf("RESULT prefill_p%lld%s %.3f s  %.0f tokens/s%s\n", (long long)P, prof ? "_profiled" : "", t,
               (double)P / t, rep == 0 ? " (first pass: weights uploaded)" : "");
        if (prof) {
            print_profile(be, "prefill");
            di_backend_cuda_profile_start(be, 0);
        }
        di_seqstate_free(&st);
    }
    free(ids);
    logits_free(be, logits);
}

static void bench_decode(di_lm *lm, di_backend *be, int B, int64_t ctx, int steps) {
    di_err err = {0};
    int64_t V = lm->cfg->vocab_size;
    di_seqstate *st = calloc((size_t)B, sizeof *st);
    di_fwd_seq *q = calloc((size_t)B, sizeof *q);
    int32_t *ids = malloc((size_t)(B * ctx) * sizeof *ids);
    int32_t *next = malloc((size_t)B * sizeof *next);
    float *logits = logits_alloc(be, (size_t)(B * V));
    di_row_want *want = malloc((size_t)B * sizeof *want);
    di_row_greedy *summ = calloc((size_t)B, sizeof *summ);
    if (!st || !q || !ids || !next || !logits || !want || !summ) die("out of memory", NULL);
    for (int b = 0; b < B; b++) {
        want[b] = (di_row_want){.mode = greedy_rows > 1 ? DI_ROW_DRAW : DI_ROW_GREEDY, .ban = -1};
        want[b].draw = (di_row_draw){.inv_t = 1.25f, .top_p = greedy_rows == 3 ? 0.95 : 1.0, .ban = -1,
                                     .u = (double)((uint64_t)(b * 2654435761u + 12345u) % 1000003u) / 1000003.0};
    }
    const di_fwd_out rows_out = {want, V, summ, NULL, 0, NULL, 0, 0, 0, NULL, NULL, NULL, NULL};
    fill_ids(ids, B * ctx, V, 11);
    for (int b = 0; b < B; b++) {
        if (di_seqstate_init(&st[b], lm, ctx + steps + 8, 0, &err)) die("sequence state", &err);
        q[b] = (di_fwd_seq){&st[b], ids + b * ctx, ctx};
    }
    /* the context: the B prompts in prefill passes of up to 16K tokens (the
     * scheduler's budget bounds a step's tokens the same way; one pass of
     * 2,048 x 64 tokens asked the MoE for 50 GB of scratch) */
    const int per = ctx >= 16384 ? 1 : (int)(16384 / (ctx > 0 ? ctx : 1));
    for (int b0 = 0; b0 < B; b0 += per)
        if (di_forward(lm, q + b0, B - b0 < per ? B - b0 : per, logits + (int64_t)b0 * V, 0, &err))
            die("context prefill", &err);
    double best = 1e30, sum = 0;
    int timed = 0;
    for (int s = 0; s < steps + 1; s++) {
        int prof = s == steps;
        for (int b = 0; b < B; b++) {
            int32_t arg = 0;
            if (greedy_rows && s > 0 && !summ[b].pad) {
                arg = summ[b].token < 0 ? 0 : summ[b].token;
            } else {
                const float *l = logits + (int64_t)b * V; /* greedy, as a sampler would (a row left to the host too) */
                for (int64_t v = 1; v < V; v++)
                    if (l[v] > l[arg]) arg = (int32_t)v;
            }
            next[b] = arg;
            q[b] = (di_fwd_seq){&st[b], &next[b], 1};
        }
        int ncu = prof && list_has(ncu_list, B);
        if (prof) di_backend_cuda_profile_start(be, 1);
        if (ncu) {
            di_cuda_profiler_range(1);
            di_cuda_mark(200);
        }
        double t0 = bench_now_s();
        if (greedy_rows ? di_forward_rows(lm, q, B, logits, &rows_out, &err) : di_forward(lm, q, B, logits, 0, &err))
            die("decode", &err);
        double t = bench_now_s() - t0;
        if (ncu) {
            di_cuda_mark(201);
            di_cuda_profiler_range(0);
        }
        if (prof) {
            char title[64];
            snprintf(title, sizeof title, "decode step, batch %d", B);
            print_profile(be, title);
            di_backend_cuda_profile_start(be, 0);
        } else if (s > 0) { /* step 0 warms up shapes new to the pool */
            best = t < best ? t : best;
            sum += t;
            timed++;
        }
    }
    check_backend(be, "decode");
    if (timed)
        printf("RESULT decode%s_b%d_ctx%lld %.3f ms/step (best %.3f)  %.0f tokens/s\n",
               greedy_rows == 1 ? "_greedy" : greedy_rows == 2 ? "_draw" : greedy_rows == 3 ? "_draw_top_p" : "", B,
               (long long)ctx, 1e3 * sum / timed, 1e3 * best, B / (sum / timed));
    if (be->ops->graph_replay) { /* DI_CUDA_GRAPH=1: how the steps ran, all batches so far */
        long rec = 0, rep = 0, fail = 0;
        di_backend_cuda_graph_stats(be, &rec, &rep, &fail);
        printf("graphs: %ld steps recorded, %ld replayed, %ld keys given up\n", rec, rep, fail);
    }
    for (int b = 0; b < B; b++) di_seqstate_free(&st[b]);
    free(st);
    free(q);
    free(ids);
    free(next);
    free(want);
    free(summ);
    logits_free(be, logits);
}

/* Device-to-device copy bandwidth (bytes read + written per second) of a
 * 2 GiB buffer, the best of five. */
static double copy_bandwidth(di_backend *be) {
    size_t bytes = (size_t)1 << 30;
    void *a = be->ops->alloc(be, bytes), *b = be->ops->alloc(be, bytes);
    double best = 0;
    if (!a || !b) die("copy buffers", NULL);
    for (int r = 0; r < 6; r++) {
        check_backend(be, "copy");
        double t0 = bench_now_s();
        be->ops->copy(be, b, a, bytes);
        check_backend(be, "copy");
        double bw = 2.0 * (double)bytes / (bench_now_s() - t0);
        if (r > 0 && bw > best) best = bw;
    }
    be->ops->free(be, a);
    be->ops->free(be, b);
    return best;
}

/* Bytes of block b's weights that every step reads (all but routed experts
 * and the Engram table) and bytes of one routed expert. */
static void layer_bytes(const di_model *model, int b, double *fixed, double *expert) {
    const di_manifest *mf = &model->dummy->manifest;
    double routed = 0;
    *fixed = 0;
    for (size_t i = 0; i < mf->n; i++) {
        const di_manifest_entry *e = &mf->v[i];
        if (e->block != b || !e->slot) continue;
        double by = (double)di_tensor_numel(e->slot) * (double)di_dtype_size(e->dtype);
        if (strstr(e->name, "ffn.experts.")) routed += by;
        else if (!strstr(e->name, "engram.embed")) *fixed += by;
    }
    *expert = routed / model->cfg.n_routed_experts;
}

/* One pass of B sequences of ntok new tokens each (ids [B, ntok]) with the
 * device drained around each layer; ms per layer added into t [n_layers]
 * times `weight`. */
static void layers_pass(di_lm *lm, di_backend *be, di_seqstate *st, int B, int64_t ntok, const int32_t *ids,
                        double weight, double *t, int mark) {
    di_err err = {0};
    const di_config *c = lm->cfg;
    di_fwd_seq *q = malloc((size_t)B * sizeof *q);
    if (!q) die("out of memory", NULL);
    for (int b = 0; b < B; b++) q[b] = (di_fwd_seq){&st[b], ids + b * ntok, ntok};
    di_fwd f;
    if (di_fwd_begin(&f, lm, q, B, &err)) die("layers", &err);
    int64_t m = f.m;
    float *s = be->ops->alloc(be, (size_t)(m * c->hc_mult * c->dim) * sizeof(float));
    float *pre = be->ops->alloc(be, (size_t)(m * c->hc_mult) * sizeof(float));
    if (!s || !pre || di_fwd_embed(&f, f.ids, s, pre)) die("layers: out of memory", NULL);
    for (int l = 0; l < c->n_layers; l++) {
        check_backend(be, "layers");
        double t0 = bench_now_s();
        if (mark) di_cuda_mark(l + 1);
        if (c->roles[l].engram >= 0 && di_engram_apply(&f, l, s, &err)) die("engram", &err);
        if (di_fwd_block(&f, l, s, pre, &err)) die("block", &err);
        check_backend(be, "layers");
        t[l] += weight * 1e3 * (bench_now_s() - t0);
    }
    if (mark) di_cuda_mark(100);
    be->ops->free(be, s);
    be->ops->free(be, pre);
    di_fwd_end(&f);
    free(q);
}

/* One decode step of B sequences, split per layer: the mean of `reps`
 * steps after one warm-up step. */
static void decode_layers(di_lm *lm, di_backend *be, di_seqstate *st, int B, int reps, double *t) {
    int32_t *ids = malloc((size_t)B * sizeof *ids);
    double *junk = calloc((size_t)lm->cfg->n_layers, sizeof *junk);
    if (!ids || !junk) die("out of memory", NULL);
    for (int l = 0; l < lm->cfg->n_layers; l++) t[l] = 0;
    for (int r = 0; r < reps + 1; r++) {
        int ncu = r == reps && list_has(ncu_list, B);
        for (int b = 0; b < B; b++) ids[b] = 100 + 37 * b + r;
        if (ncu) di_cuda_profiler_range(1);
        layers_pass(lm, be, st, B, 1, ids, r ? 1.0 / reps : 1.0, r ? t : junk, ncu);
        if (ncu) di_cuda_profiler_range(0);
    }
    free(ids);
    free(junk);
}

/* Parameters (weights, not scales) of block b every token uses — all but
 * the routed experts and the Engram table — and of one routed expert. */
static void layer_params(const di_model *model, int b, double *fixed, double *expert) {
    const di_manifest *mf = &model->dummy->manifest;
    double routed = 0;
    *fixed = 0;
    for (size_t i = 0; i < mf->n; i++) {
        const di_manifest_entry *e = &mf->v[i];
        if (e->block != b || !e->slot || e->dtype == DI_DTYPE_F8_E8M0) continue;
        double n = (double)di_tensor_numel(e->slot) * (e->dtype == DI_DTYPE_I8 ? 2.0 : 1.0); /* I8 = 2 FP4 */
        if (strstr(e->name, "ffn.experts.")) routed += n;
        else if (!strstr(e->name, "engram.embed")) *fixed += n;
    }
    *expert = routed / model->cfg.n_routed_experts;
}

/* FP8 GEMM rate of the backend's own tiled kernel at 8192^3 (FLOP/s). */
static double gemm_rate(di_backend *be) {
    di_err err = {0};
    int64_t n = 8192;
    size_t nb = (size_t)(n * n);
    uint8_t *h = malloc(nb);
    void *a = be->ops->alloc(be, nb), *w = be->ops->alloc(be, nb);
    void *sa = be->ops->alloc(be, (size_t)(n * n / 32) * sizeof(float)), *sw = be->ops->alloc(be, nb / 1024);
    void *out = be->ops->alloc(be, nb * 2);
    if (!h || !a || !w || !sa || !sw || !out) die("gemm buffers", NULL);
    for (size_t i = 0; i < nb; i++) h[i] = (uint8_t)((i * 2654435761u >> 13) % 112 + 8); /* finite, nonzero */
    be->ops->upload(be, a, h, nb);
    be->ops->upload(be, w, h, nb);
    float *hs = (float *)h;
    for (size_t i = 0; i < (size_t)(n * n / 32); i++) hs[i] = 0.0625f;
    be->ops->upload(be, sa, hs, (size_t)(n * n / 32) * sizeof(float));
    memset(h, 120, nb / 1024);
    be->ops->upload(be, sw, h, nb / 1024);
    double best = 0;
    for (int r = 0; r < 4; r++) {
        check_backend(be, "gemm");
        double t0 = bench_now_s();
        if (di_cuda_gemm_fp8(a, sa, n, n, w, sw, n, out, DI_DTYPE_BF16, DI_CUDA_GEMM_AUTO, NULL, &err))
            die("gemm", &err);
        check_backend(be, "gemm");
        double rate = 2.0 * (double)n * n * n / (bench_now_s() - t0);
        if (r > 0 && rate > best) best = rate;
    }
    be->ops->free(be, a);
    be->ops->free(be, w);
    be->ops->free(be, sa);
    be->ops->free(be, sw);
    be->ops->free(be, out);
    free(h);
    return best;
}

static const char *layer_role(const di_config *c, int l) {
    const di_layer_role *r = &c->roles[l];
    static char buf[96];
    int ratio = c->compress_ratios[l];
    int kv_src = 0, idx_src = 0;
    for (int i = 0; i < c->n_kv_sources; i++) kv_src |= c->kv_sources[i] == l;
    for (int i = 0; i < c->n_index_sources; i++) idx_src |= c->index_sources[i] == l;
    snprintf(buf, sizeof buf, "%s%s%s%s", ratio == 0 ? "window only" : ratio == 2 ? "ratio 2" : "ratio 1",
             ratio == 0 ? "" : kv_src ? " source" : idx_src ? " reindex" : " reuse",
             c->candidate_source == l ? " + candidates" : "", r->engram >= 0 ? " + Engram" : "");
    return buf;
}

/* Prefill of one sequence of P tokens split per layer, against the FLOP
 * floor: 2 x (parameters every token uses + n_active routed experts) per
 * token plus the attention's q.k and p.v over its slots (window + the
 * index_topk selected entries where the layer has compressed KV) and the
 * indexer's scores over the causally visible compressed entries. */
static void prefill_layers(di_model *model, di_lm *lm, di_backend *be, int64_t P, double rate) {
    di_err err = {0};
    const di_config *c = lm->cfg;
    di_seqstate st;
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    double *t = calloc((size_t)c->n_layers, sizeof *t);
    if (!ids || !t) die("out of memory", NULL);
    fill_ids(ids, P, c->vocab_size, 17);
    if (di_seqstate_init(&st, lm, P + 8, 0, &err)) die("sequence state", &err);
    double t0 = bench_now_s();
    layers_pass(lm, be, &st, 1, P, ids, 1.0, t, 0);
    printf("-- prefill of %lld tokens per layer (%.2f s in all)\n", (long long)P, bench_now_s() - t0);
    printf("%-5s %-36s %10s %10s %8s %10s\n", "layer", "role", "ms", "floor ms", "x floor", "tokens/s");
    for (int l = 0; l < c->n_layers; l++) {
        double fixed, expert;
        layer_params(model, l, &fixed, &expert);
        int ratio = c->compress_ratios[l];
        double slots = (double)c->window + (ratio ? (double)c->index_topk : 0);
        int idx_src = 0;
        for (int i = 0; i < c->n_index_sources; i++) idx_src |= c->index_sources[i] == l;
        double flops = (double)P * (2.0 * (fixed + c->n_active_experts * expert) +
                                    4.0 * c->n_heads * (double)c->head_dim * slots);
        if (idx_src && ratio) /* P queries x on average P / (2 ratio) visible entries */
            flops += 2.0 * c->index_n_heads * (double)c->index_head_dim * (double)P * (double)P / (2.0 * ratio);
        double floor_ms = 1e3 * flops / rate;
        printf("%-5d %-36s %10.1f %10.2f %8.1f %10.0f\n", l, layer_role(c, l), t[l], floor_ms, t[l] / floor_ms,
               (double)P / (t[l] * 1e-3));
        printf("RESULT layer%d_prefill%lld %.3f ms floor %.3f ms flops %.4g\n", l, (long long)P, t[l], floor_ms, flops);
    }
    di_seqstate_free(&st);
    free(ids);
    free(t);
}

static void bench_layers(di_model *model, di_lm *lm, di_backend *be, const char *list, int64_t ctx, int64_t P) {
    di_err err = {0};
    const di_config *c = lm->cfg;
    double bw = copy_bandwidth(be);
    printf("copy bandwidth (read + write): %.0f GB/s\n", bw / 1e9);
    printf("RESULT copy_bw %.1f GB/s\n", bw / 1e9);
    double rate = gemm_rate(be);
    printf("FP8 GEMM 8192^3 (our tiled kernel): %.0f TFLOP/s\n", rate / 1e12);
    printf("RESULT gemm_fp8_8192 %.1f TFLOP/s\n", rate / 1e12);
    if (P > 0) prefill_layers(model, lm, be, P, rate);
    double *t = malloc((size_t)c->n_layers * sizeof *t);
    if (!t) die("out of memory", NULL);
    for (const char *p = list; *p;) {
        int B = atoi(p);
        if (B > 0) {
            di_seqstate *st = calloc((size_t)B, sizeof *st);
            di_fwd_seq *q = calloc((size_t)B, sizeof *q);
            int32_t *ids = malloc((size_t)(B * ctx) * sizeof *ids);
            if (!st || !q || !ids) die("out of memory", NULL);
            fill_ids(ids, B * ctx, c->vocab_size, 13);
            for (int b = 0; b < B; b++) {
                if (di_seqstate_init(&st[b], lm, ctx + 16, 0, &err)) die("sequence state", &err);
                q[b] = (di_fwd_seq){&st[b], ids + b * ctx, ctx};
            }
            if (di_forward(lm, q, B, NULL, 0, &err)) die("context prefill", &err);
            decode_layers(lm, be, st, B, 3, t);
            double touched = c->n_routed_experts * (1.0 - pow(1.0 - (double)c->n_active_experts / c->n_routed_experts, B));
            printf("-- decode step per layer, batch %d, context %lld\n", B, (long long)ctx);
            printf("%-5s %-36s %10s %10s %8s\n", "layer", "role", "ms", "floor ms", "x floor");
            for (int l = 0; l < c->n_layers; l++) {
                double fixed, expert;
                layer_bytes(model, l, &fixed, &expert);
                /* bw counts a copy's reads and writes together: the rate the
                 * memory moves bytes in either direction, which a read-only
                 * stream can use whole. (Until 2026-11-30 this divided by
                 * bw / 2, the copy's read rate alone: floors twice too long.) */
                double floor_ms = 1e3 * (fixed + touched * expert) / bw;
                printf("%-5d %-36s %10.3f %10.3f %8.1f\n", l, layer_role(c, l), t[l], floor_ms, t[l] / floor_ms);
                printf("RESULT layer%d_b%d %.3f ms floor %.3f ms\n", l, B, t[l], floor_ms);
            }
            for (int b = 0; b < B; b++) di_seqstate_free(&st[b]);
            free(st);
            free(q);
            free(ids);
        }
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    free(t);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cuda_model CONFIG [-p PROMPT] [-b LIST] [-c CONTEXT] [-s STEPS] [-l LIST] [-lc CONTEXT] "
                        "[-lp PROMPT] [-n LIST] [-g 1|2|3]\n");
        return 2;
    }
    const char *cfg_path = argv[1], *blist = "1,8", *llist = NULL;
    int64_t P = 2048, ctx = 64, lctx = 32, lP = 0;
    int steps = 8;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) P = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) blist = argv[i + 1];
        else if (!strcmp(argv[i], "-c")) ctx = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "-l")) llist = argv[i + 1];
        else if (!strcmp(argv[i], "-lc")) lctx = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-lp")) lP = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-n")) ncu_list = argv[i + 1];
        else if (!strcmp(argv[i], "-g")) greedy_rows = atoi(argv[i + 1]);
    }
    if (greedy_rows < 0 || greedy_rows > 3) die("-g: expected 0, 1 (greedy), 2 (draws) or 3 (draws with top-p)", NULL);
    di_err err = {0};
    di_model_options mo;
    di_model_options_default(&mo);
    mo.load_format = DI_LOAD_DUMMY;
    double t0 = bench_now_s();
    di_model *model = NULL;
    if (di_model_open(cfg_path, &mo, &model)) die("dummy model", NULL);
    printf("dummy weights: %.1f GB in %.1f s\n", (double)model->weight_bytes / 1e9, bench_now_s() - t0);
    di_backend *be = NULL;
    if (di_backend_cuda_create(0, &be, &err)) die("cuda backend", &err);
    /* DEEPINFER_BATCH_INVARIANT=1: the engine's batch-invariant mode, timed */
    const char *bi = getenv("DEEPINFER_BATCH_INVARIANT");
    if (bi && !strcmp(bi, "1")) {
        be->ops->set_batch_invariant(be, 1);
        printf("batch-invariant mode (DEEPINFER_BATCH_INVARIANT=1)\n");
    }
    const di_config *c = &model->cfg;
    /* a synthetic Engram token map (the real one comes from tokenizer.json) */
    int32_t *cmap = malloc((size_t)c->vocab_size * sizeof *cmap);
    if (!cmap) die("out of memory", NULL);
    for (int64_t v = 0; v < c->vocab_size; v++)
        cmap[v] = (int32_t)(v % (c->engram_compressed_vocab > 0 ? c->engram_compressed_vocab : 1));
    di_lm lm;
    if (di_lm_init(&lm, c, &model->weights, be, DI_NUMERICS_FP8, c->n_engram > 0 ? cmap : NULL, &err))
        die("model on the GPU", &err);
    printf("config %s: %d layers, dim %lld, %d experts (top %d)\n", cfg_path, c->n_layers, (long long)c->dim,
           c->n_routed_experts, c->n_active_experts);
    if (P > 0) bench_prefill(&lm, be, P);
    printf("weights on the device: %.1f GB\n", (double)di_backend_cuda_weights_bytes(be) / 1e9);
    for (const char *p = blist; *p;) {
        int B = atoi(p);
        if (B > 0) bench_decode(&lm, be, B, ctx, steps);
        p = strchr(p, ',');
        if (!p) break;
        p++;
    }
    if (llist) bench_layers(model, &lm, be, llist, lctx, lP);
    di_lm_free(&lm);
    free(cmap);
    di_backend_destroy(be);
    di_model_close(model);
    return 0;
}
