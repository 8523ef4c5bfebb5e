/* Element types of checkpoint tensors and the exact scalar conversions
 * between them and fp32 (architecture.md §2, §8.3).
 *
 * Every conversion here is exact where the target can represent the value
 * and rounds to nearest-even otherwise; the tests check all 2^8 / 2^16
 * encodings one by one. Hot kernels use their own vectorised forms of the
 * same rules and are cross-checked against these scalar ones. */
#ifndef DI_CORE_DTYPE_H
#define DI_CORE_DTYPE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

typedef enum di_dtype {
    DI_DTYPE_INVALID = 0,
    DI_DTYPE_BOOL,
    DI_DTYPE_U8,
    DI_DTYPE_I8,      /* also: packed MXFP4, two E2M1 codes per byte */
    DI_DTYPE_U16,
    DI_DTYPE_I16,
    DI_DTYPE_F16,
    DI_DTYPE_BF16,
    DI_DTYPE_U32,
    DI_DTYPE_I32,
    DI_DTYPE_F32,
    DI_DTYPE_U64,
    DI_DTYPE_I64,
    DI_DTYPE_F64,
    DI_DTYPE_F8_E4M3, /* E4M3FN: no inf, 0x7F/0xFF NaN, max 448 */
    DI_DTYPE_F8_E5M2,
    DI_DTYPE_F8_E8M0, /* UE8M0: 2^(b-127), 0xFF NaN */
    DI_DTYPE_COUNT
} di_dtype;

/* Bytes per element (all safetensors dtypes are whole bytes). 0 if invalid. */
size_t di_dtype_size(di_dtype t);
/* safetensors spelling ("F8_E4M3", "BF16", ...). */
const char *di_dtype_name(di_dtype t);
/* Parses a safetensors dtype string of length n; DI_DTYPE_INVALID if unknown. */
di_dtype di_dtype_from_name(const char *s, size_t n);

/* ---- scalar conversions ---- */

static inline uint32_t di_f32_bits(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }
static inline float di_bits_f32(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }

/* BF16 */
static inline float di_bf16_to_f32(uint16_t h) { return di_bits_f32((uint32_t)h << 16); }
/* RNE; NaN stays NaN (quiet). Inline: the CPU backend rounds whole rows
 * through it, which a call per value kept from vectorizing. */
static inline uint16_t di_f32_to_bf16(float f) {
    uint32_t u = di_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
/* Rounds an fp32 value to the nearest bf16 value, returned as fp32. */
static inline float di_round_bf16(float f) { return di_bf16_to_f32(di_f32_to_bf16(f)); }

/* F16 (IEEE half) */
float di_f16_to_f32(uint16_t h);
uint16_t di_f32_to_f16(float f); /* RNE, overflow to inf */

/* F8 E4M3FN */
float di_e4m3_to_f32(uint8_t b);
/* RNE. |x| that rounds above 448 (> 464), inf and NaN all give NaN (0x7F |
 * sign), matching PyTorch's float8_e4m3fn cast; callers clamp first. */
uint8_t di_f32_to_e4m3(float f);

/* F8 E8M0 (unsigned power of two) */
float di_e8m0_to_f32(uint8_t b);
/* Rounds |f| up to the next power of two (exact powers map exactly);
 * 0 / below 2^-127 give 0x00, NaN / inf / above 2^127 give 0xFF. */
uint8_t di_f32_to_e8m0(float f);

/* E2M1 (FP4): code bits s.ee.m -> {0, .5, 1, 1.5, 2, 3, 4, 6} with sign bit 3 */
extern const float di_e2m1_table[16];
static inline float di_e2m1_to_f32(uint8_t code) { return di_e2m1_table[code & 15]; }
/* RNE on the E2M1 grid, saturating at ±6; ties go to the even code
 * (0.25->0, 0.75->1, 1.25->1, 1.75->2, 2.5->2, 3.5->4, 5->4). NaN -> 0. */
uint8_t di_f32_to_e2m1(float f);

#endif
