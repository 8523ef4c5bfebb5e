/* FP4 quantize-dequantize (see cpu_quant.h). */
#include "backend/cpu/cpu_quant.h"

#include <math.h>

#include "core/dtype.h"

/* 2^ceil(log2(x)) for positive normal x, from the exponent and mantissa
 * bits, as the reference rounds its scales. */
static float pow2_ceil(float x) {
    uint32_t b = di_f32_bits(x);
    int32_t e = (int32_t)((b >> 23) & 0xFF) - 127 + ((b & 0x7FFFFF) != 0);
    return di_bits_f32((uint32_t)(e + 127) << 23);
}

float di_cpu_fp4_scale(const float *x, int n, int e4m3, uint8_t *code) {
    float amax = 0.f;
    for (int k = 0; k < n; k++) amax = fmaxf(amax, fabsf(x[k]));
    return di_cpu_fp4_scale_amax(amax, e4m3, code);
}

float di_cpu_fp4_scale_amax(float amax, int e4m3, uint8_t *code) {
    if (e4m3) {
        if (amax < 6.f * 0x1p-9f) amax = 6.f * 0x1p-9f;
        *code = di_f32_to_e4m3(fminf(amax / 6.f, 448.f));
        return di_e4m3_to_f32(*code);
    }
    if (amax < 6.f * 0x1p-126f) amax = 6.f * 0x1p-126f;
    float s = pow2_ceil(amax * (float)(1.0 / 6.0));
    *code = (uint8_t)(di_f32_bits(s) >> 23); /* the biased exponent: E8M0 */
    return s;
}

void di_cpu_qdq_fp4(float *x, int n, int e4m3) {
    uint8_t code;
    float s = di_cpu_fp4_scale(x, n, e4m3, &code);
    for (int k = 0; k < n; k++) {
        float v = fminf(fmaxf(x[k] / s, -6.f), 6.f);
        x[k] = di_round_bf16(di_e2m1_to_f32(di_f32_to_e2m1(v)) * s);
    }
}
