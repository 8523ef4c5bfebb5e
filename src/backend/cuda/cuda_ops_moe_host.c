/* Host side of the device MoE path (cuda_ops_moe.h): stacking a layer's
 * expert matrices on the device, and the launchers' stand-ins in builds
 * without CUDA, each failing with DI_ERR_UNSUPPORTED as cuda_stub.c does. */
#include "backend/cuda/cuda_ops_moe.h"

#include "backend/cuda/cuda_backend.h"

di_status cuda_moe_stack(int n, const void *const *w, const void *const *s, size_t wbytes,
                         size_t sbytes, void *dev_w, void *dev_s, di_err *err) {
    for (int e = 0; e < n; e++) {
        di_status st = di_cuda_upload((char *)dev_w + (size_t)e * wbytes, w[e], wbytes, err);
        if (!st) st = di_cuda_upload((char *)dev_s + (size_t)e * sbytes, s[e], sbytes, err);
        if (st) return di_err_prefix(err, "stacking expert %d of %d: ", e, n);
    }
    return DI_OK;
}

#ifndef DI_HAVE_CUDA

static di_status no_cuda(di_err *err) {
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "this build has no CUDA backend (nvcc was not found or DI_NO_CUDA=1)");
}

di_status cuda_op_route_score(const float *x, int64_t n, float *y, void *stream, di_err *err) {
    return no_cuda(err);
}

di_status cuda_op_moe_route(const float *logits, const float *bias, int64_t m, int e, int k,
                            int normalize, float route_scale, int32_t *idx, float *w,
                            void *stream, di_err *err) {
    return no_cuda(err);
}

void cuda_moe_set_fused(int on) { (void)on; }

long cuda_moe_swiglu_w2_calls(void) { return 0; }

size_t cuda_moe_experts_scratch(int64_t m, int k, int n_experts, int64_t dim, int64_t inter) {
    return 0;
}

di_status cuda_op_moe_experts(const cuda_moe_weights *W, const float *x, int64_t m,
                              const int32_t *idx, const float *w, int k, int out_bf16,
                              float limit, void *scratch, size_t scratch_bytes, float *out,
                              void *stream, di_err *err) {
    return no_cuda(err);
}

#endif
