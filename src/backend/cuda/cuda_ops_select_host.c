/* The launchers of cuda_ops_select.h in builds without CUDA, failing with
 * DI_ERR_UNSUPPORTED as cuda_stub.c does, so the tests link either way. */
#ifndef DI_HAVE_CUDA

#include "backend/cuda/cuda_ops_select.h"

int cuda_index_tc_fits(int hi, int64_t di, const float *q) {
    (void)hi;
    (void)di;
    (void)q;
    return 0;
}

void cuda_index_tc_set(int on) { (void)on; }

di_status cuda_op_index_scores_kv_fast(const float *q, const float *w, int64_t m, int hi,
                                       int64_t di, const uint8_t *const *keys,
                                       const int32_t *n_vis, int64_t width, float *out,
                                       di_err *err) {
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "this build has no CUDA backend (nvcc was not found or DI_NO_CUDA=1)");
}

#endif
