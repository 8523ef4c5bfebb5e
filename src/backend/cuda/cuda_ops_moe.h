/* The MoE path on the device (architecture.md §7), for decode steps that
 * stay on the GPU end to end: routing into device arrays and the routed
 * experts of a layer in a fixed number of launches whatever the routing,
 * so a step can be captured in a CUDA graph. backend_cuda.c's op table
 * takes them as its moe_route_buf and moe_experts ops (DI_CUDA_MOE_GROUPED=0
 * leaves both out, for comparisons).
 *
 * Every pointer is device memory unless its comment says host; launches go
 * to `stream` (NULL: the default stream) and never wait for the device.
 * Without CUDA in the build (cuda_ops_moe_host.c) each fails with
 * DI_ERR_UNSUPPORTED. */
#ifndef DI_BACKEND_CUDA_OPS_MOE_H
#define DI_BACKEND_CUDA_OPS_MOE_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"

/* y[i] = di_route_score(x[i]) (core/route_score.h) for i < n: the host's
 * bits on the device (a check of the shared arithmetic). */
di_status cuda_op_route_score(const float *x, int64_t n, float *y, void *stream, di_err *err);

/* The CPU backend's moe_route, bit for bit, with its outputs in device
 * memory: logits [m, e], bias [e] fp32 → idx [m, k] int32, w [m, k] fp32.
 * One warp per row: scores by the shared arithmetic, each rank's pick by
 * the pick state of core/route_score.h folded per lane and merged across
 * the warp, weights by di_route_weights. e <= 1024, k <= 64. */
di_status cuda_op_moe_route(const float *logits, const float *bias, int64_t m, int e, int k,
                            int normalize, float route_scale, int32_t *idx, float *w,
                            void *stream, di_err *err);

/* A layer's routed experts stacked in device memory, MXFP4 (I8 packed E2M1
 * + E8M0 per 32 inputs), the layout di_cuda_gemm_mxfp4_grouped reads. */
typedef struct cuda_moe_weights {
    int n_experts;                 /* E */
    int64_t dim, inter;            /* D, I (both multiples of 32) */
    const uint8_t *w1, *s1;        /* gate [E, I, D/2], [E, I, D/32] */
    const uint8_t *w3, *s3;        /* up   [E, I, D/2], [E, I, D/32] */
    const uint8_t *w2, *s2;        /* down [E, D, I/2], [E, D, I/32] */
} cuda_moe_weights;

/* Stacks n host matrices on the device: codes w[e] and scales s[e] (host
 * pointers, wbytes / sbytes each) to dev_w + e·wbytes, dev_s + e·sbytes.
 * The checkpoint keeps every expert in its own tensor; this is the one
 * copy per layer the grouped product reads. */
di_status cuda_moe_stack(int n, const void *const *w, const void *const *s, size_t wbytes,
                         size_t sbytes, void *dev_w, void *dev_s, di_err *err);

/* Bytes of device scratch cuda_op_moe_experts needs for m rows, top-k. */
size_t cuda_moe_experts_scratch(int64_t m, int k, int n_experts, int64_t dim, int64_t inter);

/* backend.h's moe_experts for MXFP4 experts with FP8 activations (the
 * model's shipped numerics, matmul flags ACT_FP8 and, with out_bf16,
 * OUT_BF16): out [m, D] = Σ over row i's experts in ascending id order of
 * W2·swiglu(W1·x_i, W3·x_i; w, limit), from +0 in fp32. Launches, all of a
 * size fixed by (m, k, E): a plan kernel (per-expert row lists from idx,
 * rows ascending; the non-empty experts first, in ascending id, then empty
 * groups) with the FP8 quantization of x in the same launch, the grouped
 * w1 and w3 products (min(E, m·k) groups of at most m rows), SwiGLU with
 * the pair weights and the quantization of its output in one launch, the
 * grouped w2 product (where w2 runs on the decode form's tensor-core
 * kernel behind a pair of one wave, that kernel forms and quantizes its
 * SwiGLU input itself: one launch fewer, the same bits), and the combine
 * (per row, its pairs in ascending expert id). Each product row equals the
 * plain di_cuda_gemm_mxfp4 row and SwiGLU is the backend's swiglu op
 * spelled the same way, so the result equals the CUDA backend's own
 * per-expert loop bit for bit. Needs k % 32 == 0 for D and I; e <= 1024. */
di_status cuda_op_moe_experts(const cuda_moe_weights *W, const float *x, int64_t m,
                              const int32_t *idx, const float *w, int k, int out_bf16,
                              float limit, void *scratch, size_t scratch_bytes, float *out,
                              void *stream, di_err *err);

/* on = 0: cuda_op_moe_experts launches the plan, the quantization of x,
 * SwiGLU and the quantization of its output one by one instead of as two
 * fused launches (the same bits; a measuring and test aid, default 1). */
void cuda_moe_set_fused(int on);
/* Calls of cuda_op_moe_experts whose w2 formed its own SwiGLU input (for
 * tests; 0 without CUDA). */
long cuda_moe_swiglu_w2_calls(void);

#ifdef __cplusplus
}
#endif

#endif
