/* Device forms of the decode step's per-row work that read the forward's
 * step metadata in device memory (backend.h's step forms, architecture.md
 * §5.1 for RoPE), so a step queues no per-call host array. */
#ifndef DI_BACKEND_CUDA_OPS_STEP_H
#define DI_BACKEND_CUDA_OPS_STEP_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"

/* backend.h's rope_cs: x [m, stride] rotated in its last rd dims of each of
 * `heads` vectors of width hd, with cs [m, rd/2, 2] (cos, sin) in device
 * memory; inverse negates the sine. The rope kernel's arithmetic (fp32
 * products and sums without contraction, bf16 rounding), so the result is
 * the rope op's bit for bit when cs holds its angles' values. */
di_status cuda_op_rope_cs(float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd,
                          const float *cs, int inverse, di_err *err);

/* backend.h's scatter_rows_to: for i < m with slot[i] >= 0, `bytes` from
 * src + i·src_stride to base[i] + dst_off + slot[i]·dst_stride; base [m]
 * and slot [m] in device memory. One block per row. */
di_status cuda_op_scatter_rows_to(const void *src, size_t src_stride, int64_t m,
                                  const uint8_t *const *base, const int32_t *slot, size_t dst_off,
                                  size_t dst_stride, size_t bytes, di_err *err);

/* backend.h's gather_rows_from: for i < m, `bytes` from base[i] + src_off +
 * slot[i]·src_stride to dst + i·dst_stride (tables in device memory). */
di_status cuda_op_gather_rows_from(void *dst, size_t dst_stride, int64_t m,
                                   const uint8_t *const *base, const int32_t *slot, size_t src_off,
                                   size_t src_stride, size_t bytes, di_err *err);

#ifdef __cplusplus
}
#endif

#endif
