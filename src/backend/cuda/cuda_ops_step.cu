/* Device forms of the decode step's per-row work (cuda_ops_step.h). */
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_ops_step.h"

__global__ void k_rope_cs(float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd,
                          const float *cs, int inverse) {
    int64_t half = rd / 2, total = m * heads * half;
    GRID_STRIDE(t, total) {
        int64_t j = t % half, ih = t / half;
        int64_t i = ih / heads, h = ih % heads;
        float *v = x + i * stride + h * hd + (hd - rd);
        float c = cs[(i * half + j) * 2], s = cs[(i * half + j) * 2 + 1];
        if (inverse) s = -s;
        float re = v[2 * j], im = v[2 * j + 1];
        v[2 * j] = round_bf16(SUB(MUL(re, c), MUL(im, s)));
        v[2 * j + 1] = round_bf16(ADD(MUL(re, s), MUL(im, c)));
    }
}

extern "C" di_status cuda_op_rope_cs(float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                                     int64_t rd, const float *cs, int inverse, di_err *err) {
    int64_t total = m * heads * (rd / 2);
    if (total <= 0) return DI_OK;
    k_rope_cs<<<grid_for(total), 256>>>(x, m, stride, heads, hd, rd, cs, inverse);
    return cuda_check_launch(err, "rope_cs");
}
