/* The step-graph entry points (cuda_graph.h) in builds without CUDA: no
 * graph is ever recorded. */
#include "backend/cuda/cuda_graph.h"

#ifndef DI_HAVE_CUDA

static di_status no_cuda(di_err *err) {
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "this build has no CUDA backend (nvcc was not found or DI_NO_CUDA=1)");
}

di_status cuda_graph_begin(di_err *err) { return no_cuda(err); }

di_status cuda_graph_end(void **exec, di_err *err) {
    *exec = NULL;
    return no_cuda(err);
}

di_status cuda_graph_launch(void *exec, di_err *err) {
    (void)exec;
    return no_cuda(err);
}

void cuda_graph_free(void *exec) { (void)exec; }

void di_backend_cuda_graph_stats(const di_backend *be, long *recorded, long *replayed,
                                 long *failed) {
    (void)be;
    *recorded = *replayed = *failed = 0;
}

#else
typedef int di_cuda_graph_host_unused; /* ISO C wants a non-empty translation unit */
#endif
