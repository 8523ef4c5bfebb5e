/* FP4 (E2M1) quantize-dequantize of the CPU backend (architecture.md §2):
 * the compressed-KV (per 16, E4M3 scale) and indexer (per 32, power-of-two
 * scale) steps. FP8 activation quantization lives with the kernels
 * (kernels.h: di_act_quant_fp8 / di_act_qdq_fp8). */
#ifndef DI_BACKEND_CPU_QUANT_H
#define DI_BACKEND_CPU_QUANT_H

#include <stdint.h>

/* In-place FP4 quantize-dequantize of one block of n values: e4m3 = 0 gives
 * a power-of-two scale 2^ceil(log2(amax/6)) (amax floored at 6·2^-126),
 * e4m3 = 1 an E4M3 scale e4m3(amax/6) (amax floored at 6·2^-9). Results are
 * exact in bf16. */
void di_cpu_qdq_fp4(float *x, int n, int e4m3);
/* The scale of that step for one block of n values, and its byte (E4M3 or
 * E8M0) in *code. */
float di_cpu_fp4_scale(const float *x, int n, int e4m3, uint8_t *code);
/* The same from the block's max |x| (its NaNs skipped, as fmaxf does). */
float di_cpu_fp4_scale_amax(float amax, int e4m3, uint8_t *code);

#endif
