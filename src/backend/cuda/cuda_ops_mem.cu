/* Memory helpers the C side of the CUDA backend needs beyond cuda_device.cu:
 * telling device buffers from host pointers, and an overlap-safe copy. */
#include "backend/cuda/cuda_ops_common.cuh"

extern "C" int cuda_mem_is_device(const void *p) {
    cudaPointerAttributes a;
    if (!p) return 0;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        cudaGetLastError(); /* an unknown host pointer is not an error here */
        return 0;
    }
    return a.type == cudaMemoryTypeDevice || a.type == cudaMemoryTypeManaged;
}

extern "C" di_status cuda_mem_move(void *dst, const void *src, size_t bytes, di_err *err) {
    if (!bytes || dst == src) return DI_OK;
    const char *d = (const char *)dst, *s = (const char *)src;
    if (d + bytes <= s || s + bytes <= d)
        return cuda_check(cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    /* overlapping ranges: cudaMemcpy leaves the result undefined, go through a temporary */
    void *tmp = NULL;
    di_status st = cuda_check(cudaMalloc(&tmp, bytes), err, "copy: temporary");
    if (st) return st;
    st = cuda_check(cudaMemcpy(tmp, src, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    if (!st) st = cuda_check(cudaMemcpy(dst, tmp, bytes, cudaMemcpyDeviceToDevice), err, "copy");
    cudaFree(tmp);
    return st;
}
