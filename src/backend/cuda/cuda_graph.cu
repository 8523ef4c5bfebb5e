/* Stream capture into CUDA graphs (cuda_graph.h). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_graph.h"

extern "C" di_status cuda_graph_begin(di_err *err) {
#ifndef CUDA_API_PER_THREAD_DEFAULT_STREAM
    return di_err_set(err, DI_ERR_UNSUPPORTED,
                      "graph capture: the kernels run on the legacy default stream (build them "
                      "with nvcc --default-stream per-thread)");
#else
    return cuda_check(cudaStreamBeginCapture(cudaStreamPerThread, cudaStreamCaptureModeRelaxed),
                      err, "graph capture begin");
#endif
}

extern "C" di_status cuda_graph_end(void **exec, di_err *err) {
    cudaGraph_t g = NULL;
    cudaGraphExec_t x = NULL;
    *exec = NULL;
    di_status st = cuda_check(cudaStreamEndCapture(cudaStreamPerThread, &g), err, "graph capture end");
    if (!st) st = cuda_check(cudaGraphInstantiate(&x, g, 0), err, "graph instantiate");
    if (g) cudaGraphDestroy(g);
    if (!st) *exec = (void *)x;
    return st;
}

extern "C" di_status cuda_graph_launch(void *exec, di_err *err) {
    return cuda_check(cudaGraphLaunch((cudaGraphExec_t)exec, cudaStreamPerThread), err,
                      "graph launch");
}

extern "C" void cuda_graph_free(void *exec) {
    if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
