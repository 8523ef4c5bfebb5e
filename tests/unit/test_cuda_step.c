/* The CUDA backend's backend-memory selection forms (DI_CUDA_DEVICE_SELECT=1,
 * backend.h): the golden tiny model prefilled, then decode steps alone and
 * two sequences batched past the window's wrap, once on the default op
 * table and once with the device forms. The logits must be the same bits
 * (the forms run the same kernels on tables built on the device instead of
 * uploaded), and the profile of the device-form steps must show the
 * attention over device row tables and no call of the host-result or
 * host-table forms (topk_select, candidate_blocks, restrict_blocks,
 * index_scores_kv, sparse_attn_kv). Skips without a GPU or ../shared. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "golden_util.h"
#include "test.h"

/* Calls of op `name` in a profile table (0 when absent). */
static long prof_calls(const char *tab, const char *name) {
    size_t n = strlen(name);
    for (const char *l = tab; l && *l; l = strchr(l, '\n') ? strchr(l, '\n') + 1 : NULL) {
        if (strncmp(l, name, n) || l[n] != ' ') continue;
        double ms = 0;
        long calls = 0;
        if (sscanf(l + n, "%lf %ld", &ms, &calls) == 2) return calls;
    }
    return 0;
}

/* Prefill P tokens into a and Q into b, then `steps` decode steps of a
 * alone and `steps` of a and b batched; logits of every pass into lg.
 * Profiles the decode steps into tab. Returns the rows written. */
static int64_t run(gold_model *g, di_backend *be, int64_t P, int64_t Q, int steps, float *lg,
                   char *tab, size_t cap) {
    const int32_t *ids = gold_i32(g, "long.prompt_ids", NULL);
    int64_t V = g->cfg.vocab_size, rows = 0;
    di_err err = {0};
    di_backend *saved = g->lm.be;
    g->lm.be = be;
    di_seqstate a, b;
    CHECK(di_seqstate_init(&a, &g->lm, P + 2 * steps + 8, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(&b, &g->lm, Q + steps + 16, 0, &err) == DI_OK);
    di_fwd_seq qa = {&a, ids, P}, qb = {&b, ids + 7, Q};
    CHECKF(di_forward(&g->lm, &qa, 1, lg, 0, &err) == DI_OK, "%s", err.msg);
    CHECKF(di_forward(&g->lm, &qb, 1, lg + V, 0, &err) == DI_OK, "%s", err.msg);
    rows = 2;
    di_backend_cuda_profile_start(be, 1);
    for (int s = 0; s < steps; s++) {
        di_fwd_seq d = {&a, ids + P + s, 1};
        CHECKF(di_forward(&g->lm, &d, 1, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows++;
    }
    for (int s = 0; s < steps; s++) {
        di_fwd_seq two[2] = {{&a, ids + P + steps + s, 1}, {&b, ids + 7 + Q + s, 1}};
        CHECKF(di_forward(&g->lm, two, 2, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows += 2;
    }
    di_backend_cuda_profile(be, tab, cap);
    di_backend_cuda_profile_start(be, 0);
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    g->lm.be = saved;
    return rows;
}

static void test_device_select_same_bits(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_backend *eager = NULL, *dev = NULL;
    unsetenv("DI_CUDA_DEVICE_SELECT");
    if (di_backend_cuda_create(0, &eager, &err)) SKIP("%s", err.msg);
    setenv("DI_CUDA_DEVICE_SELECT", "1", 1);
    di_status st = di_backend_cuda_create(0, &dev, &err);
    unsetenv("DI_CUDA_DEVICE_SELECT");
    CHECKF(st == DI_OK, "%s", err.msg);
    gold_model g;
    if (st || gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        di_backend_destroy(eager);
        if (dev) di_backend_destroy(dev);
        return;
    }
    CHECK(dev->ops->sparse_attn_rows != NULL && eager->ops->sparse_attn_rows == NULL);
    int64_t V = g.cfg.vocab_size, P = 120, Q = 40;
    int steps = 8;
    size_t cap = (size_t)(2 + 3 * steps) * (size_t)V;
    float *l0 = malloc(cap * sizeof(float)), *l1 = malloc(cap * sizeof(float));
    static char t0[8192], t1[8192];
    int64_t n0 = run(&g, eager, P, Q, steps, l0, t0, sizeof t0);
    int64_t n1 = run(&g, dev, P, Q, steps, l1, t1, sizeof t1);
    CHECK_EQ_INT(n0, n1);
    int64_t diff = 0;
    for (int64_t i = 0; i < n0 * V; i++) diff += memcmp(&l0[i], &l1[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "%lld logits differ between the device forms and the host forms", (long long)diff);
    static const char *const host_forms[] = {"topk_select", "candidate_blocks", "restrict_blocks",
                                             "index_scores_kv", "sparse_attn_kv"};
    for (size_t i = 0; i < sizeof host_forms / sizeof *host_forms; i++) {
        CHECKF(prof_calls(t1, host_forms[i]) == 0, "device forms: %ld calls of %s",
               prof_calls(t1, host_forms[i]), host_forms[i]);
        CHECKF(prof_calls(t0, host_forms[i]) > 0 || i == 2, "host forms: no call of %s", host_forms[i]);
    }
    CHECK(prof_calls(t1, "sparse_attn_rows") > 0 && prof_calls(t1, "topk_select_buf") > 0);
    if (getenv("DI_TEST_VERBOSE")) fprintf(stderr, "host forms:\n%s\ndevice forms:\n%s\n", t0, t1);
    free(l0);
    free(l1);
    gold_close(&g);
    di_backend_destroy(eager);
    di_backend_destroy(dev);
}

int main(void) {
    RUN(test_device_select_same_bits);
    return test_summary();
}
