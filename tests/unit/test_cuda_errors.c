/* Errors inside the CUDA backend reach the caller: an op that fails (here an
 * upload to an address that is no device memory) is kept by the backend,
 * its status op answers with DI_ERR_BACKEND and a message naming the op,
 * and the next forward pass returns that status instead of logits, leaving
 * the sequence where it was. Skips without a GPU or without ../shared. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cuda/cuda_backend.h"
#include "golden_util.h"
#include "test.h"

static void test_op_error_reaches_forward(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    di_err err = {0};
    di_backend *gpu = NULL;
    if (di_backend_cuda_create(0, &gpu, &err)) SKIP("%s", err.msg);
    CHECK(gpu->ops->status != NULL);
    CHECK_EQ_INT(gpu->ops->status(gpu, &err), DI_OK);
    gold_model g;
    if (gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        di_backend_destroy(gpu);
        return;
    }
    int64_t V = g.cfg.vocab_size;
    int32_t *cmap = malloc((size_t)V * sizeof(int32_t));
    memcpy(cmap, g.lm.cmap, (size_t)V * sizeof(int32_t));
    di_lm_free(&g.lm);
    memset(&g.lm, 0, sizeof g.lm);
    di_status rc = di_lm_init(&g.lm, &g.cfg, &g.w, gpu, DI_NUMERICS_FP8, cmap, &err);
    free(cmap);
    CHECKF(rc == DI_OK, "lm on the GPU: %s", err.msg);
    di_seqstate st;
    CHECK(rc == DI_OK && di_seqstate_init(&st, &g.lm, 64, 0, &err) == DI_OK);
    float *lg = malloc((size_t)V * sizeof(float));
    int32_t ids[3] = {5, 17, 300};
    di_fwd_seq q = {&st, ids, 2};
    CHECKF(di_forward(&g.lm, &q, 1, lg, 0, &err) == DI_OK, "good pass: %s", err.msg);
    CHECK_EQ_INT(st.n_tokens, 2);
    /* a failing op: the runtime refuses a copy to an address it does not
     * know (large enough not to go through the backend's staging buffer,
     * so the copy is checked at once and the device stays usable) */
    size_t nj = (size_t)48 << 20;
    char *junk = calloc(nj, 1);
    CHECK(junk != NULL);
    if (junk) gpu->ops->upload(gpu, (void *)(uintptr_t)64, junk, nj);
    free(junk);
    memset(&err, 0, sizeof err);
    di_status bs = gpu->ops->status(gpu, &err);
    CHECK_EQ_INT(bs, DI_ERR_BACKEND);
    CHECKF(strstr(err.msg, "upload") != NULL, "message names the op: %s", err.msg);
    fprintf(stderr, "  backend: %s\n", err.msg);
    /* the next pass says so and does not advance the sequence */
    di_fwd_seq q2 = {&st, ids + 2, 1};
    memset(&err, 0, sizeof err);
    rc = di_forward(&g.lm, &q2, 1, lg, 0, &err);
    CHECK_EQ_INT(rc, DI_ERR_BACKEND);
    CHECKF(strstr(err.msg, "cuda") != NULL && strstr(err.msg, "upload") != NULL, "forward: %s", err.msg);
    fprintf(stderr, "  forward: %s\n", err.msg);
    CHECK_EQ_INT(st.n_tokens, 2);
    free(lg);
    di_seqstate_free(&st);
    gold_close(&g);
    di_backend_destroy(gpu);
}

int main(void) {
    RUN(test_op_error_reaches_forward);
    return test_summary();
}
