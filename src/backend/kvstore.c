/* Packed cache rows on the host (see kvstore.h). The scales come from the
 * CPU backend's own QDQ code (kernels.h, cpu_quant.h), so a packed row
 * decodes to the bits of the QDQ step by construction, not by a second copy
 * of its rules. */
#include "backend/kvstore.h"

#include <math.h>

#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/kernels.h"
#include "core/dtype.h"

static void pack_fp8(const float *x, int64_t n, uint8_t *row) {
    uint8_t *sc = row + n;
    for (int64_t b = 0; b < n; b += 32) {
        float s = di_act_scale_fp8(x + b); /* a power of two: x / s is exact */
        sc[b / 32] = (uint8_t)(di_f32_bits(s) >> 23);
        for (int i = 0; i < 32; i++)
            row[b + i] = di_f32_to_e4m3(fminf(fmaxf(x[b + i] / s, -448.f), 448.f));
    }
}

static void pack_fp4(const float *x, int64_t n, int bl, int e4m3, uint8_t *row) {
    uint8_t *sc = row + n / 2;
    for (int64_t b = 0; b < n; b += bl) {
        float s = di_cpu_fp4_scale(x + b, bl, e4m3, &sc[b / bl]);
        for (int i = 0; i < bl; i += 2) {
            uint8_t lo = di_f32_to_e2m1(fminf(fmaxf(x[b + i] / s, -6.f), 6.f));
            uint8_t hi = di_f32_to_e2m1(fminf(fmaxf(x[b + i + 1] / s, -6.f), 6.f));
            row[(b + i) / 2] = (uint8_t)((lo & 15) | (hi << 4));
        }
    }
}

void di_kvq_pack(di_kvq f, const float *x, int64_t n, uint8_t *row) {
    switch (f) {
    case DI_KVQ_FP8: pack_fp8(x, n, row); break;
    case DI_KVQ_FP4_E4M3: pack_fp4(x, n, 16, 1, row); break;
    default: pack_fp4(x, n, 32, 0, row); break;
    }
}

void di_kvq_unpack(di_kvq f, const uint8_t *row, int64_t n, float *x) {
    const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
    if (f == DI_KVQ_FP8) {
        const uint8_t *sc = row + n;
        for (int64_t k = 0; k < n; k++) x[k] = e4m3[row[k]] * e8m0[sc[k / 32]];
        return;
    }
    int64_t bl = di_kvq_block(f);
    const uint8_t *sc = row + n / 2;
    const float *stab = f == DI_KVQ_FP4_E4M3 ? e4m3 : e8m0;
    for (int64_t b = 0; b < n; b += bl) {
        float s = stab[sc[b / bl]];
        for (int64_t k = b; k < b + bl; k += 2) {
            uint8_t c = row[k / 2];
            x[k] = di_e2m1_to_f32(c & 15) * s;
            x[k + 1] = di_e2m1_to_f32(c >> 4) * s;
        }
    }
}
