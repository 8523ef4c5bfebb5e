/* Random test inputs: splitmix64 with a seed the test sets (and prints, so a
 * failing run can be replayed), uniform and normal draws. */
#ifndef DI_TEST_RNG_H
#define DI_TEST_RNG_H

#include <math.h>
#include <stdint.h>

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

#endif
