/* Single-pass mHC site helper (architecture.md §4). */
#ifndef DI_MODEL_MHC_H
#define DI_MODEL_MHC_H

#include "model/forward.h"

/* HcMix of s [m, HC, D] → pre_out/post [m, HC], comb [m, HC, HC]; and the
 * sublayer input x [m, D] = RMSNorm(Collapse(s, pre_in); norm). */
di_status di_mhc_site(di_fwd *f, const di_w_hc *hc, const di_tensor *norm, float *s,
                      const float *pre_in, float *pre_out, float *post, float *comb, float *x,
                      di_err *err);

#endif
