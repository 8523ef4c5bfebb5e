/* Grouped MXFP4 GEMM for many rows per group (cuda_gemm_grouped.cu; the MoE
 * experts at prefill, architecture.md §7 and §2 "FP4 expert linear"). */
#ifndef DI_BACKEND_CUDA_GEMM_GROUPED_H
#define DI_BACKEND_CUDA_GEMM_GROUPED_H

#include <stdint.h>

#include <cuda_runtime.h>

#include "core/error.h"

/* The groups this kernel takes at most (its tile table lives in shared
 * memory). */
enum { CUDA_GG_MAX_GROUPS = 1024 };

/* di_cuda_gemm_mxfp4_grouped's product (cuda_backend.h) in 64-row x
 * 128-output tiles: out[off[z] + s] = W[ids[z]] q(x[rows[off[z] + s]]) for
 * the slots s of group z. Needs k % 32 == 0, ngroups <= CUDA_GG_MAX_GROUPS
 * and 16-byte aligned qa and w rows (k % 32 == 0 gives the row strides). */
di_status cuda_launch_gemm_mxfp4_grouped_tiled(const uint8_t *qa, const float *sa, int64_t k,
                                              const uint8_t *w, const uint8_t *ws, int64_t n,
                                              const int32_t *ids, const int32_t *off,
                                              int32_t ngroups, const int32_t *rows, void *out,
                                              int out_bf16, cudaStream_t stream, di_err *err);

/* The wgmma form (cuda_gemm_grouped_wg.cu): the same product in 128-row x
 * 128-output tiles on the warpgroup tensor cores; needs k % 128 == 0, 16-byte
 * aligned codes and activation scales, 4-byte aligned weight scales
 * (cuda_gemm_grouped_wg_applies). variant: the kernel's form flags
 * (GW_F_* in the .cu; CUDA_GW_VARIANT_DEFAULT the default, which takes the
 * weights by the bulk copy engine where whole output tiles allow it and is
 * variant 1 elsewhere; 2, 4, ... measuring aids). */
enum { CUDA_GW_VARIANT_DEFAULT = 129 }; /* GW_F_ROWS | GW_F_TMAW */
bool cuda_gemm_grouped_wg_applies(const uint8_t *qa, const float *sa, int64_t k, const uint8_t *w,
                                  const uint8_t *ws, int64_t n);
di_status cuda_launch_gemm_mxfp4_grouped_wg(const uint8_t *qa, const float *sa, int64_t k,
                                            const uint8_t *w, const uint8_t *ws, int64_t n,
                                            const int32_t *ids, const int32_t *off, int32_t ngroups,
                                            const int32_t *rows, void *out, int out_bf16,
                                            int variant, cudaStream_t stream, di_err *err);

#endif
