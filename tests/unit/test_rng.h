/* Random test inputs: splitmix64 with a seed the test sets (and prints, so a
 * failing run can be replayed), uniform and normal draws, weight bytes. */
#ifndef DI_TEST_RNG_H
#define DI_TEST_RNG_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

static uint64_t rng_state;

static inline uint64_t rng_next(void) {
    uint64_t z = (rng_state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}
/* Uniform in [0, 1). */
static inline double rng_unit(void) { return (double)(rng_next() >> 11) / 9007199254740992.0; }
/* Standard normal (Box-Muller). */
static inline float rng_normal(void) {
    double u = rng_unit() + 1e-300, v = rng_unit();
    return (float)(sqrt(-2.0 * log(u)) * cos(6.283185307179586 * v));
}
/* Uniform in [0, n). */
static inline int rng_int(int n) { return (int)(rng_next() % (uint64_t)n); }

/* Weight bytes for the checkpoint's formats (malloc'd; the caller frees):
 * any bytes (MXFP4 codes), E4M3 codes without the NaN codes, E8M0 scales
 * near 2^0. */
static inline uint8_t *rng_bytes(size_t n) {
    uint8_t *b = (uint8_t *)malloc(n ? n : 1);
    for (size_t i = 0; b && i < n; i++) b[i] = (uint8_t)rng_next();
    return b;
}
static inline uint8_t *rng_e4m3(size_t n) {
    uint8_t *b = rng_bytes(n);
    for (size_t i = 0; b && i < n; i++)
        if ((b[i] & 0x7f) == 0x7f) b[i] ^= 1;
    return b;
}
static inline uint8_t *rng_e8m0(size_t n) {
    uint8_t *b = (uint8_t *)malloc(n ? n : 1);
    for (size_t i = 0; b && i < n; i++) b[i] = (uint8_t)(120 + rng_int(12));
    return b;
}

#endif
