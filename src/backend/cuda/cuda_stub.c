/* The CUDA backend's C interface in builds without CUDA (nvcc absent or
 * DI_NO_CUDA=1): every call fails with DI_ERR_UNSUPPORTED and says why, so
 * callers link and behave the same way without #ifdefs. */
#ifndef DI_HAVE_CUDA

#include "backend/cuda/cuda_backend.h"

#include <stdlib.h>

static di_status no_cuda(di_err *err) {
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "this build has no CUDA backend (nvcc was not found or DI_NO_CUDA=1)");
}

di_status di_cuda_device_count(int *count, di_err *err) {
    *count = 0;
    return no_cuda(err);
}
di_status di_cuda_device_info_get(int dev, di_cuda_device_info *info, di_err *err) {
    memset(info, 0, sizeof *info);
    return no_cuda(err);
}
di_status di_cuda_init(int dev, di_err *err) { return no_cuda(err); }
di_status di_cuda_synchronize(di_err *err) { return no_cuda(err); }
di_status di_cuda_alloc(void **dev_ptr, size_t bytes, di_err *err) {
    *dev_ptr = NULL;
    return no_cuda(err);
}
void di_cuda_free(void *dev_ptr) { (void)dev_ptr; }
di_status di_cuda_upload(void *dev_dst, const void *host_src, size_t bytes, di_err *err) {
    return no_cuda(err);
}
di_status di_cuda_download(void *host_dst, const void *dev_src, size_t bytes, di_err *err) {
    return no_cuda(err);
}
di_status di_cuda_fill(void *dev_ptr, int byte, size_t bytes, di_err *err) { return no_cuda(err); }
void *di_cuda_host_alloc(size_t bytes) { return malloc(bytes ? bytes : 1); }
void di_cuda_host_free(void *host_ptr) { free(host_ptr); }
int di_cuda_host_pinned(const void *host_ptr) {
    (void)host_ptr;
    return 0;
}
di_status di_cuda_act_quant_fp8(const void *x, di_dtype x_dtype, int64_t m, int64_t k,
                                uint8_t *q, float *scale, void *stream, di_err *err) {
    return no_cuda(err);
}
di_status di_cuda_gemm_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                           const uint8_t *w, const uint8_t *w_scale, int64_t n, void *out,
                           di_dtype out_dtype, di_cuda_gemm_path path, void *stream,
                           di_err *err) {
    return no_cuda(err);
}
di_status di_cuda_gemm_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                             const uint8_t *w, const uint8_t *w_scale, int64_t n, void *out,
                             di_dtype out_dtype, di_cuda_gemm_path path, void *stream,
                             di_err *err) {
    return no_cuda(err);
}

di_status di_cuda_gemm_mxfp4_grouped(const uint8_t *qa, const float *sa, int64_t k,
                                     const uint8_t *w, const uint8_t *w_scale, int64_t n,
                                     const int32_t *ids, const int32_t *off, int32_t ngroups,
                                     const int32_t *rows, int32_t max_rows, void *out,
                                     di_dtype out_dtype, void *stream, di_err *err) {
    return no_cuda(err);
}

di_status di_cuda_gemm_mxfp4_grouped_pair(const uint8_t *qa, const float *sa, int64_t k,
                                          const uint8_t *w, const uint8_t *w_scale,
                                          const uint8_t *w_b, const uint8_t *w_scale_b, int64_t n,
                                          const int32_t *ids, const int32_t *off, int32_t ngroups,
                                          const int32_t *rows, int32_t max_rows, void *out,
                                          void *out_b, di_dtype out_dtype, void *stream,
                                          di_err *err) {
    return no_cuda(err);
}

di_status di_backend_cuda_create(int device, di_backend **out, di_err *err) {
    *out = NULL;
    return no_cuda(err);
}
di_status di_backend_cuda_status(di_backend *be, di_err *err) { return no_cuda(err); }
void di_backend_cuda_weights_drop(di_backend *be) { (void)be; }
size_t di_backend_cuda_weights_bytes(const di_backend *be) {
    (void)be;
    return 0;
}
long di_backend_cuda_side_count(const di_backend *be) {
    (void)be;
    return 0;
}
size_t di_backend_cuda_profile(di_backend *be, char *buf, size_t cap) {
    (void)be;
    if (buf && cap) buf[0] = 0;
    return 0;
}
void di_backend_cuda_profile_start(di_backend *be, int on) {
    (void)be;
    (void)on;
}
void di_cuda_profiler_range(int on) { (void)on; }
void di_cuda_mark(int tag) { (void)tag; }
void di_cuda_set_batch_invariant(int on) { (void)on; }
di_status di_cuda_timeline_create(di_cuda_timeline **out, int cap, di_err *err) {
    *out = NULL;
    (void)cap;
    return no_cuda(err);
}
void di_cuda_timeline_reset(di_cuda_timeline *t) { (void)t; }
int di_cuda_timeline_mark(di_cuda_timeline *t) {
    (void)t;
    return -1;
}
di_status di_cuda_timeline_read(di_cuda_timeline *t, float *ms, di_err *err) {
    (void)t;
    (void)ms;
    return no_cuda(err);
}
void di_cuda_timeline_free(di_cuda_timeline *t) { (void)t; }

#else
typedef int di_cuda_stub_unused; /* ISO C wants a non-empty translation unit */
#endif
