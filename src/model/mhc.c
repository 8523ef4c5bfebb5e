/* Single-pass mHC sites (architecture.md §4): one HcMix of the stream gives
 * the `post`/`comb` of this site and the `pre` the *next* site collapses
 * with; the sublayer input is collapsed with the previous site's `pre`. */
#include "model/mhc.h"

di_status di_mhc_site(di_fwd *f, const di_w_hc *hc, const di_tensor *norm, float *s,
                      const float *pre_in, float *pre_out, float *post, float *comb, float *x,
                      di_err *err) {
    const di_config *c = f->lm->cfg;
    di_backend *be = f->lm->be;
    if (!hc->fn.data || !hc->base.data || !hc->scale.data || hc->fn.dtype != DI_DTYPE_F32)
        return di_err_set(err, DI_ERR_NOT_FOUND, "mHC parameters missing or not F32");
    be->ops->hc_mix(be, s, f->m, c->hc_mult, c->dim, hc->fn.data, hc->base.data, hc->scale.data,
                    c->eps, c->hc_eps, c->hc_sinkhorn_iters, pre_out, post, comb);
    if (be->ops->hc_collapse_norm) {
        be->ops->hc_collapse_norm(be, s, pre_in, f->m, c->hc_mult, c->dim, norm, c->eps, x);
    } else {
        be->ops->hc_collapse(be, s, pre_in, f->m, c->hc_mult, c->dim, x);
        be->ops->rmsnorm(be, x, norm, f->m, c->dim, c->eps, x);
    }
    return DI_OK;
}
