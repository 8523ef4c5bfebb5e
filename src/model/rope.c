/* RoPE frequency tables (architecture.md §5.1): base^(-2j/rd), with YaRN's
 * linear ramp between the beta_fast and beta_slow corrected dims for layers
 * that read compressed KV. Computed in fp32 as the reference does. */
#include <math.h>

#include "model/model.h"

void di_rope_freqs(const di_config *cfg, int block, float *out) {
    const di_layer_role *r = &cfg->roles[block];
    int64_t rd = cfg->rope_dim;
    double base = r->rope_base;
    for (int64_t j = 0; j < rd / 2; j++) {
        float e = (float)(2 * j) / (float)rd;
        out[j] = 1.0f / powf((float)base, e);
    }
    if (!r->yarn || !cfg->yarn_enabled || cfg->yarn_original_max_pos <= 0) return;
    double orig = (double)cfg->yarn_original_max_pos;
    double lo_d = rd * log(orig / (cfg->yarn_beta_fast * 2 * M_PI)) / (2 * log(base));
    double hi_d = rd * log(orig / (cfg->yarn_beta_slow * 2 * M_PI)) / (2 * log(base));
    double low = floor(lo_d), high = ceil(hi_d);
    if (low < 0) low = 0;
    if (high > rd - 1) high = (double)(rd - 1);
    float span = (float)(high - low > 1e-3 ? high - low : 1e-3);
    float factor = (float)cfg->yarn_factor;
    for (int64_t j = 0; j < rd / 2; j++) {
        float ramp = ((float)j - (float)low) / span;
        if (ramp < 0.f) ramp = 0.f;
        if (ramp > 1.f) ramp = 1.f;
        float smooth = 1.f - ramp;
        out[j] = out[j] / factor * (1.f - smooth) + out[j] * smooth;
    }
}
