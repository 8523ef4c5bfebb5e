/* Whole-model forward passes on the CUDA backend with dummy weights of a
 * real-shape config (bench/v41_flash_trunc.py writes one: V4.1-Flash cut to
 * one layer per role), the engine's own forward (model/forward.h) as the
 * scheduler calls it: prefill throughput of one sequence, then decode steps
 * of B sequences at once (one token each, logits of every sequence back on
 * the host, as the sampler needs them). Prints time per step, tokens/s, and
 * per-op profiles (cuda backend's DI_CUDA_PROFILE mode, one profiled pass
 * after the timed ones) so the overheads show.
 *
 *   bench_cuda_model CONFIG [-p PROMPT] [-b LIST] [-c CONTEXT] [-s STEPS]
 *
 * Lines starting with RESULT are the machine-readable numbers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "api/api_model.h"
#include "backend/cuda/cuda_backend.h"
#include "model/forward.h"

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
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

static void bench_prefill(di_lm *lm, di_backend *be, int64_t P) {
    di_err err = {0};
    int64_t V = lm->cfg->vocab_size;
    int32_t *ids = malloc((size_t)P * sizeof *ids);
    float *logits = malloc((size_t)V * sizeof(float));
    if (!ids || !logits) die("out of memory", NULL);
    fill_ids(ids, P, V, 7);
    for (int rep = 0; rep < 3; rep++) {
        di_seqstate st;
        if (di_seqstate_init(&st, lm, P + 8, 0, &err)) die("sequence state", &err);
        int prof = rep == 2;
        if (prof) di_backend_cuda_profile_start(be, 1);
        double t0 = now_s();
        di_fwd_seq q = {&st, ids, P};
        if (di_forward(lm, &q, 1, logits, 0, &err)) die("prefill", &err);
        check_backend(be, "prefill");
        double t = now_s() - t0;
        printf("RESULT prefill_p%lld%s %.3f s  %.0f tokens/s%s\n", (long long)P, prof ? "_profiled" : "", t,
               (double)P / t, rep == 0 ? " (first pass: weights uploaded)" : "");
        if (prof) {
            print_profile(be, "prefill");
            di_backend_cuda_profile_start(be, 0);
        }
        di_seqstate_free(&st);
    }
    free(ids);
    free(logits);
}

static void bench_decode(di_lm *lm, di_backend *be, int B, int64_t ctx, int steps) {
    di_err err = {0};
    int64_t V = lm->cfg->vocab_size;
    di_seqstate *st = calloc((size_t)B, sizeof *st);
    di_fwd_seq *q = calloc((size_t)B, sizeof *q);
    int32_t *ids = malloc((size_t)(B * ctx) * sizeof *ids);
    int32_t *next = malloc((size_t)B * sizeof *next);
    float *logits = malloc((size_t)(B * V) * sizeof(float));
    if (!st || !q || !ids || !next || !logits) die("out of memory", NULL);
    fill_ids(ids, B * ctx, V, 11);
    for (int b = 0; b < B; b++) {
        if (di_seqstate_init(&st[b], lm, ctx + steps + 8, 0, &err)) die("sequence state", &err);
        q[b] = (di_fwd_seq){&st[b], ids + b * ctx, ctx};
    }
    /* the context: all B prompts in one prefill pass */
    if (di_forward(lm, q, B, logits, 0, &err)) die("context prefill", &err);
    double best = 1e30, sum = 0;
    int timed = 0;
    for (int s = 0; s < steps + 1; s++) {
        int prof = s == steps;
        for (int b = 0; b < B; b++) {
            const float *l = logits + (int64_t)b * V; /* greedy, as a sampler would */
            int32_t arg = 0;
            for (int64_t v = 1; v < V; v++)
                if (l[v] > l[arg]) arg = (int32_t)v;
            next[b] = arg;
            q[b] = (di_fwd_seq){&st[b], &next[b], 1};
        }
        if (prof) di_backend_cuda_profile_start(be, 1);
        double t0 = now_s();
        if (di_forward(lm, q, B, logits, 0, &err)) die("decode", &err);
        double t = now_s() - t0;
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
        printf("RESULT decode_b%d_ctx%lld %.3f ms/step (best %.3f)  %.0f tokens/s\n", B, (long long)ctx,
               1e3 * sum / timed, 1e3 * best, B / (sum / timed));
    for (int b = 0; b < B; b++) di_seqstate_free(&st[b]);
    free(st);
    free(q);
    free(ids);
    free(next);
    free(logits);
}

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: bench_cuda_model CONFIG [-p PROMPT] [-b LIST] [-c CONTEXT] [-s STEPS]\n");
        return 2;
    }
    const char *cfg_path = argv[1], *blist = "1,8";
    int64_t P = 2048, ctx = 64;
    int steps = 8;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "-p")) P = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-b")) blist = argv[i + 1];
        else if (!strcmp(argv[i], "-c")) ctx = atoll(argv[i + 1]);
        else if (!strcmp(argv[i], "-s")) steps = atoi(argv[i + 1]);
    }
    di_err err = {0};
    di_model_options mo;
    di_model_options_default(&mo);
    mo.load_format = DI_LOAD_DUMMY;
    double t0 = now_s();
    di_model *model = NULL;
    if (di_model_open(cfg_path, &mo, &model)) die("dummy model", NULL);
    printf("dummy weights: %.1f GB in %.1f s\n", (double)model->weight_bytes / 1e9, now_s() - t0);
    di_backend *be = NULL;
    if (di_backend_cuda_create(0, &be, &err)) die("cuda backend", &err);
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
    di_lm_free(&lm);
    free(cmap);
    di_backend_destroy(be);
    di_model_close(model);
    return 0;
}
