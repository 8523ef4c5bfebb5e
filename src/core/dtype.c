#include "core/dtype.h"

#include <math.h>

static const struct { const char *name; size_t size; } dtype_info[DI_DTYPE_COUNT] = {
    [DI_DTYPE_INVALID] = {"INVALID", 0},
    [DI_DTYPE_BOOL] = {"BOOL", 1},
    [DI_DTYPE_U8] = {"U8", 1},
    [DI_DTYPE_I8] = {"I8", 1},
    [DI_DTYPE_U16] = {"U16", 2},
    [DI_DTYPE_I16] = {"I16", 2},
    [DI_DTYPE_F16] = {"F16", 2},
    [DI_DTYPE_BF16] = {"BF16", 2},
    [DI_DTYPE_U32] = {"U32", 4},
    [DI_DTYPE_I32] = {"I32", 4},
    [DI_DTYPE_F32] = {"F32", 4},
    [DI_DTYPE_U64] = {"U64", 8},
    [DI_DTYPE_I64] = {"I64", 8},
    [DI_DTYPE_F64] = {"F64", 8},
    [DI_DTYPE_F8_E4M3] = {"F8_E4M3", 1},
    [DI_DTYPE_F8_E5M2] = {"F8_E5M2", 1},
    [DI_DTYPE_F8_E8M0] = {"F8_E8M0", 1},
};

size_t di_dtype_size(di_dtype t) {
    return (t > DI_DTYPE_INVALID && t < DI_DTYPE_COUNT) ? dtype_info[t].size : 0;
}

const char *di_dtype_name(di_dtype t) {
    return (t > DI_DTYPE_INVALID && t < DI_DTYPE_COUNT) ? dtype_info[t].name : "INVALID";
}

di_dtype di_dtype_from_name(const char *s, size_t n) {
    for (int t = DI_DTYPE_INVALID + 1; t < DI_DTYPE_COUNT; t++) {
        const char *name = dtype_info[t].name;
        if (strlen(name) == n && memcmp(name, s, n) == 0) return (di_dtype)t;
    }
    return DI_DTYPE_INVALID;
}

float di_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu;
    if (exp == 0x1f) return di_bits_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        float v = ldexpf((float)man, -24);
        return sign ? -v : v;
    }
    return di_bits_f32(sign | ((exp + 112u) << 23) | (man << 13));
}

uint16_t di_f32_to_f16(float f) {
    uint32_t u = di_f32_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);   /* NaN */
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u);  /* rounds to >= 65536: inf */
    if (a < 0x38800000u) {                                    /* below 2^-14: subnormal */
        /* Value in units of 2^-24, rounded to nearest even by the FPU. */
        float v = di_bits_f32(a) * 16777216.0f;
        float r = rintf(v);
        return (uint16_t)(sign | (uint16_t)r);
    }
    uint32_t mant_odd = (a >> 13) & 1u;
    a += 0xfffu + mant_odd;
    a -= 112u << 23;
    return (uint16_t)(sign | (a >> 13));
}

float di_e4m3_to_f32(uint8_t b) {
    uint32_t sign = b & 0x80u, exp = (b >> 3) & 0xfu, man = b & 7u;
    float v;
    if (exp == 0xf && man == 7) return sign ? -NAN : NAN;
    if (exp == 0) v = ldexpf((float)man, -9);            /* m/8 * 2^-6 */
    else v = ldexpf((float)(8 + man), (int)exp - 10);   /* (1+m/8) * 2^(e-7) */
    return sign ? -v : v;
}

uint8_t di_f32_to_e4m3(float f) {
    uint32_t u = di_f32_bits(f);
    uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    uint32_t a = u & 0x7fffffffu;
    if (a >= 0x43f00000u) return (uint8_t)(sign | 0x7f); /* >= 480, inf, NaN */
    if (a < (121u << 23)) {
        /* Below 2^-6: subnormal grid of 2^-9, nearest even via the FPU. */
        float r = rintf(di_bits_f32(a) * 512.0f);
        return (uint8_t)(sign | (uint8_t)r);
    }
    uint32_t mant_odd = (a >> 20) & 1u;
    a += ((uint32_t)(7 - 127) << 23) + 0x7ffffu + mant_odd;
    uint8_t r = (uint8_t)(a >> 20);
    return (uint8_t)(sign | r); /* 464 < |x| < 480 lands on 0x7f = NaN, as in PyTorch */
}

float di_e8m0_to_f32(uint8_t b) {
    if (b == 0xff) return NAN;
    return ldexpf(1.0f, (int)b - 127);
}

uint8_t di_f32_to_e8m0(float f) {
    uint32_t a = di_f32_bits(f) & 0x7fffffffu;
    if (a >= 0x7f800000u) return 0xff;
    if (a == 0) return 0;
    int e;
    float m = frexpf(di_bits_f32(a), &e); /* a = m * 2^e, m in [0.5, 1) */
    int p = (m == 0.5f) ? e - 1 : e;      /* ceil(log2 a) */
    if (p < -127) return 0;
    if (p > 127) return 0xff;
    return (uint8_t)(p + 127);
}

const float di_e2m1_table[16] = {
    0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f,
    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f,
};

uint8_t di_f32_to_e2m1(float f) {
    if (isnan(f)) return 0;
    uint8_t sign = signbit(f) ? 8 : 0;
    float a = fabsf(f);
    uint8_t c;
    /* Midpoints between grid values; ties go to the even code. */
    if (a <= 0.25f) c = 0;
    else if (a < 0.75f) c = 1;
    else if (a <= 1.25f) c = 2;
    else if (a < 1.75f) c = 3;
    else if (a <= 2.5f) c = 4;
    else if (a < 3.5f) c = 5;
    else if (a <= 5.0f) c = 6;
    else c = 7;
    return (uint8_t)(sign | c);
}
