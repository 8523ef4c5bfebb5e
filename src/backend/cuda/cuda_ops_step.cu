/* Device forms of the decode step's per-row work (cuda_ops_step.h). */
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_ops_step.h"

__global__ void k_rope_cs(float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd,
                          const float *cs, int inverse) {
    pdl_enter();
    int64_t half = rd / 2, total = m * heads * half;
    GRID_STRIDE(t, total) {
        int64_t j = t % half, ih = t / half;
        int64_t i = ih / heads, h = ih % heads;
        float *v = x + i * stride + h * hd + (hd - rd);
        float c = cs[(i * half + j) * 2], s = cs[(i * half + j) * 2 + 1];
        rope_rotate_pair(v + 2 * j, c, inverse ? -s : s);
    }
}

extern "C" di_status cuda_op_rope_cs(float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                                     int64_t rd, const float *cs, int inverse, di_err *err) {
    int64_t total = m * heads * (rd / 2);
    if (total <= 0) return DI_OK;
    cuda_launch_pdl(k_rope_cs, grid_for(total), 256, 0, 0, x, m, stride, heads, hd, rd, cs, inverse);
    return cuda_check_launch(err, "rope_cs");
}

/* One row by one block, in 4-byte words where both ends and the size allow. */
__device__ __forceinline__ void copy_row(uint8_t *d, const uint8_t *s, size_t bytes) {
    if ((((uintptr_t)d | (uintptr_t)s | bytes) & 3) == 0) {
        for (size_t w = threadIdx.x; w < bytes / 4; w += blockDim.x)
            ((uint32_t *)d)[w] = ((const uint32_t *)s)[w];
    } else {
        for (size_t b = threadIdx.x; b < bytes; b += blockDim.x) d[b] = s[b];
    }
}

__global__ void k_scatter_rows_to(const uint8_t *src, size_t src_stride, const uint8_t *const *base,
                                  const int32_t *slot, size_t dst_off, size_t dst_stride,
                                  size_t bytes) {
    pdl_enter();
    const int64_t i = blockIdx.x;
    const int32_t k = slot[i];
    if (k < 0 || !base[i]) return;
    copy_row((uint8_t *)base[i] + dst_off + (size_t)k * dst_stride, src + (size_t)i * src_stride,
             bytes);
}

__global__ void k_gather_rows_from(uint8_t *dst, size_t dst_stride, const uint8_t *const *base,
                                   const int32_t *slot, size_t src_off, size_t src_stride,
                                   size_t bytes) {
    pdl_enter();
    const int64_t i = blockIdx.x;
    copy_row(dst + (size_t)i * dst_stride, base[i] + src_off + (size_t)slot[i] * src_stride, bytes);
}

extern "C" di_status cuda_op_gather_rows_from(void *dst, size_t dst_stride, int64_t m,
                                              const uint8_t *const *base, const int32_t *slot,
                                              size_t src_off, size_t src_stride, size_t bytes,
                                              di_err *err) {
    if (m <= 0 || bytes == 0) return DI_OK;
    if (m > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "gather_rows_from: %lld rows", (long long)m);
    cuda_launch_pdl(k_gather_rows_from, (unsigned)m, 128, 0, 0, (uint8_t *)dst, dst_stride, base, slot, src_off,
                                             src_stride, bytes);
    return cuda_check_launch(err, "gather_rows_from");
}

extern "C" di_status cuda_op_scatter_rows_to(const void *src, size_t src_stride, int64_t m,
                                             const uint8_t *const *base, const int32_t *slot,
                                             size_t dst_off, size_t dst_stride, size_t bytes,
                                             di_err *err) {
    if (m <= 0 || bytes == 0) return DI_OK;
    if (m > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "scatter_rows_to: %lld rows", (long long)m);
    cuda_launch_pdl(k_scatter_rows_to, (unsigned)m, 128, 0, 0, (const uint8_t *)src, src_stride, base, slot, dst_off,
                                            dst_stride, bytes);
    return cuda_check_launch(err, "scatter_rows_to");
}
