/* The RoPE angles' cosines and sines (architecture.md §5.1): the one rule
 * every rope op and the step metadata's tables follow, so a table built on
 * the host and the angles a backend computes itself give the same bits. */
#ifndef DI_ROPE_ANGLES_H
#define DI_ROPE_ANGLES_H

#include <math.h>
#include <stdint.h>

/* cs [n, half, 2] = cosf, sinf of (float)pos[i] · freq[j], in fp32. */
static inline void di_rope_angles(const int32_t *pos, int64_t n, const float *freq, int64_t half,
                                  float *cs) {
    for (int64_t i = 0; i < n; i++) {
        float tpos = (float)pos[i];
        for (int64_t j = 0; j < half; j++) {
            float ang = tpos * freq[j];
            cs[(i * half + j) * 2] = cosf(ang);
            cs[(i * half + j) * 2 + 1] = sinf(ang);
        }
    }
}

#endif
