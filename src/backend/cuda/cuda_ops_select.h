/* Index scores on the tensor cores (cuda_ops_select.cu; architecture.md
 * §5.4 step 3), the private interface to backend_cuda.c. */
#ifndef DI_BACKEND_CUDA_OPS_SELECT_H
#define DI_BACKEND_CUDA_OPS_SELECT_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"

/* index_scores_kv (backend.h) with the CPU op's rounding points: q [m, hi,
 * di], w [m, hi], keys [m] device pointers to DI_KVQ_FP4_E8M0 rows, n_vis
 * [m] device, out [m, width]. Takes the tensor-core kernel where the shape
 * fits (di 32 / 64 / 128, hi <= 64, 8-byte aligned q), else the warp per
 * (row, key) of cuda_ops_attn.cu. */
di_status cuda_op_index_scores_kv_fast(const float *q, const float *w, int64_t m, int hi,
                                       int64_t di, const uint8_t *const *keys,
                                       const int32_t *n_vis, int64_t width, float *out,
                                       di_err *err);
/* 1 when cuda_op_index_scores_kv_fast takes the tensor-core kernel */
int cuda_index_tc_fits(int hi, int64_t di, const float *q);
/* measuring aid (bench, tests): 0 = always the warp per (row, key) */
void cuda_index_tc_set(int on);

#ifdef __cplusplus
}
#endif

#endif
