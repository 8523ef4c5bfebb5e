/* Batch invariance on the GPU (DEEPINFER_BATCH_INVARIANT=1 on the CUDA
 * backend): a row's result must be the same bits whatever else is in the
 * batch.
 *
 * - Per product: FP8 products with quantized activations, MXFP4 expert
 *   products, the plain BF16 / FP8 products and the grouped wo_a, at the
 *   real model's shapes (and an odd one), each row of an m-row call against
 *   the same row computed alone, m from 1 to 300: the kernel ranges the
 *   backend switches between by m (matrix-vector kernels, narrow rule,
 *   tiles, the decode form) all crossed.
 * - Whole model: a "needle" sequence's logits alone and inside random
 *   batches of other sequences, fed in random chunks (decode rows included),
 *   byte for byte, on the golden tiny models (FP8 and BF16 numerics) and,
 *   where DI_TEST_DUMMY_MODEL names a config (scripts/gpu-e2e writes the
 *   real-shape one), on dummy weights at real shapes, whose products, MoE
 *   and attention take the kernels the real model takes.
 * The same runs with the mode off count the rows that differ and print
 * them (the kernels chosen by batch size show there; not a check).
 * Without a GPU (or without CUDA in the build) every test skips. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "core/dtype.h"
#include "engine/engine.h"
#include "engine/sampler.h"
#include "golden_util.h"
#include "test.h"
#include "test_rng.h"

static di_backend *gpu;
static char gpu_why[DI_ERR_MSG_MAX];

/* bf16 weights of scale 2^-6 */
static uint16_t *rnd_bf16(size_t n) {
    uint16_t *b = malloc((n ? n : 1) * 2);
    for (size_t i = 0; i < n; i++) b[i] = di_f32_to_bf16(0.015625f * rng_normal());
    return b;
}

static void *dev_up(const void *h, size_t bytes) {
    void *d = gpu->ops->alloc(gpu, bytes);
    if (d && bytes) gpu->ops->upload(gpu, d, h, bytes);
    return d;
}

static int gpu_ok(const char *what) {
    di_err err = {0};
    if (di_backend_cuda_status(gpu, &err) == DI_OK) return 1;
    CHECKF(0, "%s: %s", what, err.msg);
    return 0;
}

/* ---- products */

typedef struct {
    const char *name;
    di_wfmt fmt;
    int64_t n, k; /* outputs (all groups), inputs a group */
    int groups;   /* > 1: matmul_grouped (wo_a) */
    unsigned flags;
} product_case;

/* Rows of an m-row call that differ from the row alone, over the m list
 * (the weights stay in the backend's cache between the calls). */
static int64_t product_rows_differ(const product_case *pc, const di_wmat *w, const float *dx, const float *ref,
                                   int64_t rows, const int *ms, int nm) {
    const int64_t N = pc->n;
    int64_t bad = 0;
    float *dy = gpu->ops->alloc(gpu, (size_t)(rows * N) * 4);
    float *y = malloc((size_t)(rows * N) * 4);
    for (int j = 0; j < nm && dy && y; j++) {
        int64_t m = ms[j];
        if (pc->groups > 1) gpu->ops->matmul_grouped(gpu, w, pc->groups, dx, m, dy);
        else gpu->ops->matmul(gpu, w, dx, m, dy, pc->flags);
        gpu->ops->download(gpu, y, dy, (size_t)(m * N) * 4);
        for (int64_t i = 0; i < m; i++) bad += memcmp(y + i * N, ref + i * N, (size_t)N * 4) != 0;
    }
    gpu->ops->free(gpu, dy);
    free(y);
    return bad;
}

static void product_case_run(const product_case *pc) {
    const int ms[] = {1, 2, 3, 5, 8, 9, 16, 17, 31, 32, 33, 64, 65, 100, 128, 129, 200, 300};
    const int nm = (int)(sizeof ms / sizeof *ms);
    const int64_t R = 300, N = pc->n, K = (int64_t)pc->k * pc->groups;
    di_wmat w = {.fmt = pc->fmt, .n_out = N, .n_in = pc->groups > 1 ? pc->k : K};
    size_t wb = 0, sb = 0;
    uint8_t *wbuf = NULL, *sbuf = NULL;
    switch (pc->fmt) {
    case DI_WFMT_FP8:
        wb = (size_t)(N * w.n_in);
        sb = (size_t)(((N + 31) / 32) * ((w.n_in + 31) / 32));
        wbuf = rng_e4m3(wb);
        sbuf = rng_e8m0(sb);
        break;
    case DI_WFMT_FP4:
        wb = (size_t)(N * w.n_in / 2);
        sb = (size_t)(N * (w.n_in / 32));
        wbuf = rng_bytes(wb);
        sbuf = rng_e8m0(sb);
        break;
    default: wbuf = (uint8_t *)rnd_bf16((size_t)(N * w.n_in)); break;
    }
    w.w = wbuf;
    w.s = sbuf;
    float *x = malloc((size_t)(R * K) * 4);
    for (int64_t i = 0; i < R * K; i++) x[i] = di_round_bf16(rng_normal());
    float *dx = dev_up(x, (size_t)(R * K) * 4);
    float *dy1 = gpu->ops->alloc(gpu, (size_t)N * 4);
    float *ref[2] = {malloc((size_t)(R * N) * 4), malloc((size_t)(R * N) * 4)};
    int64_t differ[2] = {0, 0};
    /* mode 1 (on) is checked, mode 0 (off) counted */
    for (int mode = 1; mode >= 0 && dx && dy1 && ref[0] && ref[1]; mode--) {
        gpu->ops->set_batch_invariant(gpu, mode);
        for (int64_t i = 0; i < R; i++) {
            if (pc->groups > 1) gpu->ops->matmul_grouped(gpu, &w, pc->groups, dx + i * K, 1, dy1);
            else gpu->ops->matmul(gpu, &w, dx + i * K, 1, dy1, pc->flags);
            gpu->ops->download(gpu, ref[mode] + i * N, dy1, (size_t)N * 4);
        }
        differ[mode] = product_rows_differ(pc, &w, dx, ref[mode], R, ms, nm);
    }
    gpu->ops->set_batch_invariant(gpu, 1);
    if (gpu_ok(pc->name)) {
        int64_t total = 0;
        for (int j = 0; j < nm; j++) total += ms[j];
        fprintf(stderr, "  %-28s rows differing from the row alone: %lld of %lld (mode off: %lld)\n", pc->name,
                (long long)differ[1], (long long)total, (long long)differ[0]);
        CHECKF(differ[1] == 0, "%s: %lld rows depend on the batch in batch-invariant mode", pc->name,
               (long long)differ[1]);
    }
    gpu->ops->free(gpu, dx);
    gpu->ops->free(gpu, dy1);
    free(ref[0]);
    free(ref[1]);
    free(x);
    di_backend_cuda_weights_drop(gpu); /* cached by host address: a later case may reuse it */
    free(wbuf);
    free(sbuf);
}

static void test_products_invariant(void) {
    if (!gpu) SKIP("%s", gpu_why);
    const unsigned Q = DI_MM_ACT_FP8;
    /* V4.1-Flash's: hidden 5,120, q_lora 1,280, 64 heads x 512, o_lora
     * 1,024 in 8 groups, experts 2,304, 384 of them, index 32 x 128 */
    const product_case cases[] = {
        {"fp8 wq_a 1280x5120", DI_WFMT_FP8, 1280, 5120, 1, Q},
        {"fp8 wkv 512x5120", DI_WFMT_FP8, 512, 5120, 1, Q},
        {"fp8 wq_b 32768x1280", DI_WFMT_FP8, 32768, 1280, 1, Q},
        {"fp8 wo_b 5120x8192 (bf16 out)", DI_WFMT_FP8, 5120, 8192, 1, Q | DI_MM_OUT_BF16},
        {"fp8 shared w2 5120x2304", DI_WFMT_FP8, 5120, 2304, 1, Q},
        {"fp8 odd 200x96", DI_WFMT_FP8, 200, 96, 1, Q},
        {"mxfp4 expert w1 2304x5120", DI_WFMT_FP4, 2304, 5120, 1, Q},
        {"mxfp4 expert w2 5120x2304", DI_WFMT_FP4, 5120, 2304, 1, Q},
        {"mxfp4 odd 96x160", DI_WFMT_FP4, 96, 160, 1, Q},
        {"bf16 router 384x5120", DI_WFMT_BF16, 384, 5120, 1, 0},
        {"bf16 wide 8192x5120", DI_WFMT_BF16, 8192, 5120, 1, 0},
        {"fp8 plain 2048x1280", DI_WFMT_FP8, 2048, 1280, 1, 0},
        {"fp8 wo_a 8 x 1024x4096", DI_WFMT_FP8, 8192, 4096, 8, 0},
    };
    for (size_t c = 0; c < sizeof cases / sizeof *cases; c++) product_case_run(&cases[c]);
}

/* ---- whole model */

/* The needle's rows that differ from its run alone: `trials` batches of 1
 * to 12 mates at other positions (each mate's chunks up to `mate_max`
 * tokens), the needle at a random slot in random chunks of 1 to 20. */
static int64_t needle_rows_differ(di_engine *e, const int32_t *ids, int64_t n_ids, int need, int trials,
                                  int mate_max, uint64_t seed, int64_t *rows_seen, int *most_rows) {
    const di_runner *r = &e->runner;
    const int64_t V = r->vocab;
    di_err err = {0};
    float *alone = malloc((size_t)(need * V) * sizeof(float));
    float *lg = malloc((size_t)((int64_t)(20 + 12 * mate_max) * V) * sizeof(float));
    int64_t bad = 0;
    void *st = NULL;
    const int64_t cap = need + (int64_t)need * mate_max + 64; /* a mate's tokens at most */
    if (!alone || !lg || r->ops->state_new(r->ctx, cap, &st, &err)) {
        CHECKF(0, "needle: %s", err.msg);
        free(alone);
        free(lg);
        return -1;
    }
    di_runner_seq q = {st, ids, need};
    CHECKF(r->ops->forward(r->ctx, &q, 1, alone, 1, &err) == DI_OK, "needle alone: %s", err.msg);
    r->ops->state_free(r->ctx, st);
    for (int t = 0; t < trials; t++) {
        const int mates = 1 + (int)(di_rng_bits(seed, (uint64_t)t, 1, 0) % 12);
        void *states[13];
        int ok = 1;
        for (int m = 0; m <= mates; m++) ok &= r->ops->state_new(r->ctx, cap, &states[m], &err) == DI_OK;
        CHECKF(ok, "states: %s", err.msg);
        if (!ok) break;
        const int slot = (int)(di_rng_bits(seed, (uint64_t)t, 2, 0) % (uint64_t)(mates + 1));
        int64_t fed[13] = {0};
        for (int done = 0; done < need;) {
            di_runner_seq b[13];
            int64_t row = 0, needle_row = 0;
            int chunk = 1 + (int)(di_rng_bits(seed, (uint64_t)t, 3, (uint64_t)done) % 20);
            if (chunk > need - done) chunk = need - done;
            for (int m = 0; m <= mates; m++) {
                if (m == slot) {
                    b[m] = (di_runner_seq){states[m], ids + done, chunk};
                    needle_row = row;
                } else {
                    uint64_t draw = di_rng_bits(seed, (uint64_t)t, 4, (uint64_t)(m * 100000 + done));
                    int len = 1 + (int)(draw % (uint64_t)mate_max);
                    const int64_t at = (m * 131 + fed[m]) % (n_ids - len);
                    b[m] = (di_runner_seq){states[m], ids + at, len};
                    fed[m] += len;
                }
                row += b[m].n;
            }
            if (row > *most_rows) *most_rows = (int)row;
            if (r->ops->forward(r->ctx, b, mates + 1, lg, 1, &err) != DI_OK) {
                CHECKF(0, "batch forward: %s", err.msg);
                break;
            }
            for (int i = 0; i < chunk; i++)
                bad += memcmp(lg + (needle_row + i) * V, alone + (int64_t)(done + i) * V, (size_t)V * sizeof(float)) != 0;
            *rows_seen += chunk;
            done += chunk;
        }
        for (int m = 0; m <= mates; m++) r->ops->state_free(r->ctx, states[m]);
    }
    free(alone);
    free(lg);
    return bad;
}

/* The engine on the GPU in batch-invariant mode: the needle, then the
 * same with the mode off (counted). */
static void model_invariant(const char *what, const di_engine_options *o, const int32_t *ids, int64_t n_ids,
                            int mate_max) {
    if (!gpu) SKIP("%s", gpu_why);
    di_engine *e = NULL;
    if (di_engine_open(o, &e) != DI_OK) {
        CHECKF(0, "%s: open: %s", what, di_last_error());
        return;
    }
    di_engine_info info;
    di_engine_get_info(e, &info);
    CHECK_EQ_INT(info.batch_invariant, 1);
    const int need = 48, trials = quick_mode() ? 3 : 6;
    const uint64_t seed = rng_next();
    int64_t seen_on = 0, seen_off = 0;
    int most = 0;
    int64_t bad = needle_rows_differ(e, ids, n_ids, need, trials, mate_max, seed, &seen_on, &most);
    CHECKF(bad == 0, "%s: %lld of %lld needle rows changed inside a batch in batch-invariant mode", what,
           (long long)bad, (long long)seen_on);
    int64_t bad_off = -1;
    if (e->be->ops->set_batch_invariant) {
        e->be->ops->set_batch_invariant(e->be, 0);
        bad_off = needle_rows_differ(e, ids, n_ids, need, trials, mate_max, seed, &seen_off, &most);
    }
    fprintf(stderr, "  %s: needle rows changed by the batch: %lld of %lld (mode off: %lld of %lld), up to %d rows a "
            "pass\n", what, (long long)bad, (long long)seen_on, (long long)bad_off, (long long)seen_off, most);
    di_engine_close(e);
}

static void fixture_options(di_engine_options *o, const char *model) {
    di_engine_options_default(o);
    o->model = model;
    o->accelerator = DI_ACCEL_NVIDIA;
    o->batch_invariant = 1;
    o->max_batch = 16;
}

static int32_t *synthetic_ids(int64_t n, int64_t vocab, uint64_t seed) {
    int32_t *ids = malloc((size_t)n * sizeof *ids);
    for (int64_t i = 0; ids && i < n; i++) ids[i] = (int32_t)(16 + di_rng_bits(seed, (uint64_t)i, 5, 0) % (uint64_t)(vocab - 32));
    return ids;
}

/* The golden tiny model; bf16: its BF16-numerics fixture (the same
 * weights, no activation quantization: the plain products everywhere). */
static void golden_model(const char *what, int bf16) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared (golden fixtures) not found");
    char model[4200];
    snprintf(model, sizeof model, "%s/golden/v41-tiny", shared);
    di_engine_options o;
    fixture_options(&o, model);
    o.bf16_numerics = bf16;
    int32_t *ids = synthetic_ids(600, 1024, 7);
    model_invariant(what, &o, ids, 600, 9);
    free(ids);
}

static void test_golden_fp8_invariant(void) { golden_model("v41-tiny", 0); }
static void test_golden_bf16_invariant(void) { golden_model("v41-tiny, BF16 numerics", 1); }

/* Mates of up to 40 tokens: passes of several hundred rows, past the
 * row counts where the backend's kernels change form (16, 64, 256). */
static void test_dummy_real_shape_invariant(void) {
    const char *cfg = getenv("DI_TEST_DUMMY_MODEL");
    if (!cfg || !*cfg) SKIP("DI_TEST_DUMMY_MODEL (a real-shape config.json) not set");
    const char *tok = getenv("DI_TEST_DUMMY_TOKENIZER");
    di_engine_options o;
    fixture_options(&o, cfg);
    o.load_format = DI_LOAD_DUMMY;
    o.dummy_seed = 1;
    o.tokenizer = tok && *tok ? tok : NULL;
    o.max_tokens_per_step = 1024;
    int32_t *ids = synthetic_ids(4000, 1024, 11);
    model_invariant("real-shape dummy", &o, ids, 4000, 40);
    free(ids);
}

int main(void) {
    di_err err = {0};
    const char *seed = getenv("DI_TEST_SEED");
    rng_state = seed && *seed ? strtoull(seed, NULL, 10) : (uint64_t)time(NULL) * 2654435761u; /* empty: the clock */
    printf("seed %llu\n", (unsigned long long)rng_state);
    if (di_backend_cuda_create(0, &gpu, &err)) {
        snprintf(gpu_why, sizeof gpu_why, "%s", err.msg);
        gpu = NULL;
    } else {
        gpu->ops->set_batch_invariant(gpu, 1);
    }
    RUN(test_products_invariant);
    RUN(test_golden_fp8_invariant);
    RUN(test_golden_bf16_invariant);
    RUN(test_dummy_real_shape_invariant);
    if (gpu) di_backend_destroy(gpu);
    return test_summary();
}
