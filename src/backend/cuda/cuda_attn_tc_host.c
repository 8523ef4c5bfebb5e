/* The launchers of cuda_attn_tc.h in builds without CUDA, each failing with
 * DI_ERR_UNSUPPORTED as cuda_stub.c does, so the tests link either way. */
#ifndef DI_HAVE_CUDA

#include "backend/cuda/cuda_attn_tc.h"

static di_status no_cuda(di_err *err) {
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "this build has no CUDA backend (nvcc was not found or DI_NO_CUDA=1)");
}

int cuda_attn_tc_fits(int64_t d) { return 0; }

di_status cuda_op_sparse_attn_kv_tc(const float *q, int64_t m, int h, int64_t d,
                                    const uint8_t *const *rows, int n_slots, int n_win,
                                    const float *sink, float scale, float *out, di_err *err) {
    return no_cuda(err);
}

di_status cuda_op_sparse_attn_kv_tc_split(const float *q, int64_t m, int h, int64_t d,
                                          const uint8_t *const *rows, int n_slots, int n_win,
                                          const float *sink, float scale, int splits, float *out,
                                          di_err *err) {
    return no_cuda(err);
}

int cuda_attn_tc_splits(int n_slots, int max_splits) { return 1; }

void cuda_attn_tc_set_head_groups(int hg) { (void)hg; }

void cuda_attn_tc_set_fast_decode(int mask) { (void)mask; }

di_status cuda_op_sparse_attn_kv_rowwise(const float *q, int64_t m, int h, int64_t d,
                                         const uint8_t *const *rows, int n_slots, int n_win,
                                         const float *sink, float scale, float *out,
                                         di_err *err) {
    return no_cuda(err);
}

#endif
