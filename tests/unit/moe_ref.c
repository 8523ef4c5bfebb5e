/* The per-expert MoE loop over a backend's single ops (moe_ref.h). */
#include "moe_ref.h"

#include <stdlib.h>

void moe_loop_ref(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                  const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                  float *out) {
    const di_backend_ops *o = be->ops;
    int64_t D = ex->w1->n_in;
    float *acc = o->alloc(be, (size_t)(m * D) * sizeof(float)); /* zeroed */
    int32_t *rows = malloc((size_t)m * sizeof(int32_t));
    float *rw = malloc((size_t)m * sizeof(float));
    for (int e = 0; e < ex->n; e++) {
        int64_t n = 0;
        for (int64_t i = 0; i < m; i++)
            for (int r = 0; r < k; r++)
                if (idx[i * k + r] == e) {
                    rows[n] = (int32_t)i;
                    rw[n++] = w[i * k + r];
                }
        if (!n) continue;
        const di_wmat *w1 = di_moe_wmat(ex->w1, ex->stride, e);
        int64_t I = w1->n_out;
        float *xe = o->alloc(be, (size_t)(n * D) * 4), *ye = o->alloc(be, (size_t)(n * D) * 4);
        float *g = o->alloc(be, (size_t)(n * I) * 4), *u = o->alloc(be, (size_t)(n * I) * 4);
        float *dw = o->alloc(be, (size_t)n * 4);
        o->upload(be, dw, rw, (size_t)n * 4);
        o->gather_rows(be, x, rows, n, D, xe);
        o->matmul(be, w1, xe, n, g, mm);
        o->matmul(be, di_moe_wmat(ex->w3, ex->stride, e), xe, n, u, mm);
        o->swiglu(be, g, u, dw, n, I, limit, g);
        o->matmul(be, di_moe_wmat(ex->w2, ex->stride, e), g, n, ye, mm);
        o->scatter_add_rows(be, acc, rows, ye, n, D);
        o->free(be, xe);
        o->free(be, ye);
        o->free(be, g);
        o->free(be, u);
        o->free(be, dw);
    }
    o->copy(be, out, acc, (size_t)(m * D) * sizeof(float));
    o->free(be, acc);
    free(rows);
    free(rw);
}
