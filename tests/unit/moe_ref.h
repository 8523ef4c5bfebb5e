/* The model's per-expert MoE loop (moe.c when the backend has no grouped
 * op) through any backend's single ops: the definition the grouped
 * routed-experts op (backend.h moe_experts) is checked against. */
#ifndef DI_TEST_MOE_REF_H
#define DI_TEST_MOE_REF_H

#include <stdint.h>

#include "backend/backend.h"

/* out [m, D] (backend memory) = Σ over experts e ascending of the rows
 * routed to e: gather_rows, matmul w1 and w3 (flags mm), swiglu with the
 * routing weights, matmul w2, scatter_add_rows, from zero. x [m, D] is
 * backend memory; idx, w [m, k] are host arrays. */
void moe_loop_ref(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                  const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                  float *out);

#endif
