/* Decode form of the MXFP4 products at few tokens per weight row
 * (cuda_fp4_dec.cu; architecture.md §2 "FP4 expert linear"). */
#ifndef DI_BACKEND_CUDA_FP4_DEC_H
#define DI_BACKEND_CUDA_FP4_DEC_H

#include <stdint.h>

#include <cuda_runtime.h>

#include "core/error.h"

/* Whether the form takes a product of k inputs with these operands: 2 the
 * tensor-core form (k % 256 == 0, 16-byte aligned codes and weights, 4-byte
 * aligned scales), 1 only the CUDA-core one (k % 32 == 0, the aligned codes
 * and weights, a token tile's activations within shared memory), 0 none.
 * Which one runs depends on k and the alignment alone, never on the tokens. */
int cuda_fp4_dec_applies(const uint8_t *qa, const uint8_t *w, const uint8_t *ws, int64_t k);

/* out[orow, r] = sum_b sa sw (q_a . q_w) for the weight rows r < n of
 * expert ids[z] and the token slots of group z: the rows of slots
 * off[z] .. off[z+1] (activation row rows[s], output row s). ids == NULL:
 * one plain product of m tokens (activation and output row s for slot s <
 * m). max_rows bounds every group's slots (picks the token tile only).
 * Weights [experts, n, k/2] packed E2M1, scales [experts, n, k/32] E8M0. */
di_status cuda_launch_fp4_dec(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                              const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                              const int32_t *off, int32_t ngroups, const int32_t *rows,
                              int32_t max_rows, void *out, int out_mode, cudaStream_t stream,
                              di_err *err);

/* Two grouped products over the same activations, routing and shape (the
 * MoE's w1 and w3) in one launch of the tensor-core kernel: out as
 * cuda_launch_fp4_dec would give for (w, ws), out_b for (w_b, ws_b), bit
 * for bit. DI_ERR_UNSUPPORTED where that kernel does not take both (the
 * caller then launches them one by one). */
di_status cuda_launch_fp4_dec_pair(const uint8_t *qa, const float *sa, int64_t k, const uint8_t *w,
                                   const uint8_t *ws, const uint8_t *w_b, const uint8_t *ws_b, int64_t n,
                                   const int32_t *ids, const int32_t *off, int32_t ngroups,
                                   const int32_t *rows, int32_t max_rows, void *out, void *out_b,
                                   int out_mode, cudaStream_t stream, di_err *err);

/* The MoE's down product on its SwiGLU input in one launch of the
 * tensor-core kernel: what k_moe_swiglu_quant (cuda_ops_moe.cu) then
 * cuda_launch_fp4_dec give for the activations it would quantize, bit for
 * bit, with each token tile's fill forming and quantizing its pairs'
 * rows: g, u [pairs, k] f32 (16-byte aligned), pw [pairs] (rows[] index
 * them), moe_swiglu_val's in_bf16 and limit. Saves the quantization's
 * launch and its round trip through memory at small batches.
 * DI_ERR_UNSUPPORTED where that kernel does not take the product. */
di_status cuda_launch_fp4_dec_swiglu(const float *g, const float *u, const float *pw, int in_bf16, float limit,
                                     int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                                     const int32_t *off, int32_t ngroups, const int32_t *rows, int32_t max_rows,
                                     void *out, int out_mode, cudaStream_t stream, di_err *err);
/* Whether cuda_launch_fp4_dec_swiglu pays after a pair launch of ngroups
 * groups over pair_k inputs and k outputs (the down product's inputs):
 * where the pair is one wave of blocks. The down product is launched to
 * start as the pair ends (programmatic launch); behind a pair of several
 * waves its blocks would take places from the pair's later waves, which
 * the quantization's small launch between them spared (a b8 step measured
 * 1.7 % slower). max_rows: the pair launch's (its slots, so its blocks an
 * SM, depend on it). */
int cuda_fp4_dec_swiglu_pays(int64_t pair_k, int64_t k, int32_t ngroups, int32_t max_rows);

#endif
