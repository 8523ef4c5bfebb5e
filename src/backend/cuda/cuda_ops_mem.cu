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

extern "C" di_status cuda_mem_fill_async(void *p, int byte, size_t bytes, di_err *err) {
    return cuda_check(cudaMemsetAsync(p, byte, bytes, 0), err, "cudaMemsetAsync");
}

/* One block per copy: 16-byte moves when both ends and the size allow
 * (rows of floats always do), bytes otherwise. */
__global__ void k_copy_batch(const cuda_copy_batch b) {
    cuda_copy_desc d = b.d[blockIdx.x];
    if ((((uintptr_t)d.dst | (uintptr_t)d.src | d.bytes) & 15) == 0) {
        uint4 *o = (uint4 *)d.dst;
        const uint4 *i = (const uint4 *)d.src;
        for (size_t k = threadIdx.x; k < d.bytes / 16; k += blockDim.x) o[k] = i[k];
    } else {
        for (size_t k = threadIdx.x; k < d.bytes; k += blockDim.x) d.dst[k] = d.src[k];
    }
}

extern "C" di_status cuda_mem_copy_batch(const cuda_copy_batch *b, di_err *err) {
    if (b->n <= 0) return DI_OK;
    k_copy_batch<<<b->n, 256>>>(*b);
    return cuda_check_launch(err, "batched copy");
}
