/* CUDA kernels of the mHC ops (architecture.md §4: mixing weights with
 * Sinkhorn normalisation, collapse, expand, mean) and the Engram gate
 * (§6.3). Collapse, expand and mean follow the CPU's sums term by term and
 * give its bits; the mix and the gate reduce over the row in a different
 * order and go through expf / the sigmoid, so they agree to a few fp32 ulps. */
#include "backend/cuda/cuda_ops_common.cuh"

enum { HC_MAX = 16 };

/* One block per row: the RMS and the (2 + hc)·hc projections as block
 * reductions, then thread 0 runs the small softmax + Sinkhorn in the CPU's
 * order. */
/* The mixing coefficients from the projections mix [(2 + hc) * hc] (§4):
 * pre, post and the Sinkhorn-normalised comb of row i (one thread). */
__device__ void hc_mix_finish(const float *mix, int hc, const float *base, const float *scale,
                              float eps, int iters, float *pr, float *po, float *c) {
    for (int k = 0; k < hc; k++) {
        pr[k] = ADD(sigmoid_f(ADD(MUL(mix[k], scale[0]), base[k])), eps);
        po[k] = MUL(2.0f, sigmoid_f(ADD(MUL(mix[hc + k], scale[1]), base[hc + k])));
    }
    for (int k = 0; k < hc * hc; k++) c[k] = ADD(MUL(mix[2 * hc + k], scale[2]), base[2 * hc + k]);
    for (int a = 0; a < hc; a++) {
        float mx = c[a * hc];
        for (int b = 1; b < hc; b++) mx = fmaxf(mx, c[a * hc + b]);
        float sum = 0.f;
        for (int b = 0; b < hc; b++) {
            c[a * hc + b] = expf(SUB(c[a * hc + b], mx));
            sum = ADD(sum, c[a * hc + b]);
        }
        for (int b = 0; b < hc; b++) c[a * hc + b] = ADD(c[a * hc + b] / sum, eps);
    }
    for (int it = 0; it < iters; it++) {
        if (it > 0)
            for (int a = 0; a < hc; a++) {
                float sum = 0.f;
                for (int b = 0; b < hc; b++) sum = ADD(sum, c[a * hc + b]);
                for (int b = 0; b < hc; b++) c[a * hc + b] /= ADD(sum, eps);
            }
        for (int b = 0; b < hc; b++) {
            float sum = 0.f;
            for (int a = 0; a < hc; a++) sum = ADD(sum, c[a * hc + b]);
            for (int a = 0; a < hc; a++) c[a * hc + b] /= ADD(sum, eps);
        }
    }
}

/* Any hc: one block per row, one block-wide reduction per projection. */
__global__ void k_hc_mix(const float *s, int hc, int64_t d, const float *fn, const float *base,
                         const float *scale, float norm_eps, float eps, int iters, float *pre,
                         float *post, float *comb) {
    __shared__ float red[32];
    __shared__ float mix[(2 + HC_MAX) * HC_MAX];
    int64_t i = blockIdx.x, n = (int64_t)hc * d;
    int nmix = (2 + hc) * hc;
    const float *u = s + i * n;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) ss = ADD(ss, MUL(u[k], u[k]));
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ADD(ss / (float)n, norm_eps));
    for (int o = 0; o < nmix; o++) {
        const float *f = fn + (int64_t)o * n;
        float acc = 0.f;
        for (int64_t k = threadIdx.x; k < n; k += blockDim.x) acc = ADD(acc, MUL(u[k], f[k]));
        acc = block_sum(acc, red);
        if (threadIdx.x == 0) mix[o] = MUL(acc, r);
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    hc_mix_finish(mix, hc, base, scale, eps, iters, pre + i * hc, post + i * hc, comb + i * hc * hc);
}

/* hc known at compile time: every thread keeps the partial sums of all
 * (2 + HC) * HC projections and the sum of squares in registers, so one
 * pass over its slice of the row issues all the loads at once; the first
 * version (a block reduction per projection, 24 passes) was latency-bound
 * at ~840 us per call for one row. */
template <int HC>
__global__ void k_hc_mix_fixed(const float *s, int64_t d, const float *fn, const float *base,
                               const float *scale, float norm_eps, float eps, int iters, float *pre,
                               float *post, float *comb) {
    constexpr int NM = (2 + HC) * HC;
    __shared__ float part[NM + 1][32];
    __shared__ float mix[NM];
    int64_t i = blockIdx.x, n = (int64_t)HC * d;
    const float *u = s + i * n;
    float acc[NM + 1];
#pragma unroll
    for (int o = 0; o <= NM; o++) acc[o] = 0.f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) {
        float uk = u[k];
        acc[NM] = ADD(acc[NM], MUL(uk, uk));
#pragma unroll
        for (int o = 0; o < NM; o++) acc[o] = ADD(acc[o], MUL(uk, fn[(int64_t)o * n + k]));
    }
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
#pragma unroll
    for (int o = 0; o <= NM; o++) {
        float v = acc[o];
        for (int off = 16; off > 0; off >>= 1) v = ADD(v, __shfl_xor_sync(0xffffffffu, v, off));
        if (lane == 0) part[o][warp] = v;
    }
    __syncthreads();
    if (threadIdx.x <= NM) {
        float t = 0.f;
        for (int w = 0; w < nw; w++) t = ADD(t, part[threadIdx.x][w]);
        part[threadIdx.x][0] = t;
    }
    __syncthreads();
    if (threadIdx.x != 0) return;
    float r = 1.0f / sqrtf(ADD(part[NM][0] / (float)n, norm_eps));
    for (int o = 0; o < NM; o++) mix[o] = MUL(part[o][0], r);
    hc_mix_finish(mix, HC, base, scale, eps, iters, pre + i * HC, post + i * HC, comb + i * HC * HC);
}

extern "C" di_status cuda_op_hc_mix(const float *s, int64_t m, int hc, int64_t d, const float *fn,
                                    const float *base, const float *scale, float norm_eps,
                                    float hc_eps, int iters, float *pre, float *post, float *comb,
                                    di_err *err) {
    if (hc < 1 || hc > HC_MAX)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "hc_mix: hc_mult %d (supported 1..%d)", hc,
                          HC_MAX);
    if (m <= 0) return DI_OK;
    if (hc == 4)
        k_hc_mix_fixed<4><<<(unsigned)m, 512>>>(s, d, fn, base, scale, norm_eps, hc_eps, iters, pre,
                                                post, comb);
    else
        k_hc_mix<<<(unsigned)m, 256>>>(s, hc, d, fn, base, scale, norm_eps, hc_eps, iters, pre,
                                       post, comb);
    return cuda_check_launch(err, "hc_mix");
}

__global__ void k_hc_collapse(const float *s, const float *w, int64_t m, int hc, int64_t d,
                              float *y) {
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float acc = 0.f;
        for (int c = 0; c < hc; c++) acc = ADD(acc, MUL(w[i * hc + c], s[(i * hc + c) * d + k]));
        y[t] = round_bf16(acc);
    }
}

extern "C" di_status cuda_op_hc_collapse(const float *s, const float *w, int64_t m, int hc,
                                         int64_t d, float *y, di_err *err) {
    if (m * d <= 0) return DI_OK;
    k_hc_collapse<<<grid_for(m * d), 256>>>(s, w, m, hc, d, y);
    return cuda_check_launch(err, "hc_collapse");
}

/* Each thread reads the hc values of s at (i, k) before writing the hc
 * outputs at the same places, so out may alias s. */
__global__ void k_hc_expand(const float *y, const float *s, const float *post, const float *comb,
                            int64_t m, int hc, int64_t d, float *out) {
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float sv[HC_MAX];
        for (int a = 0; a < hc; a++) sv[a] = s[(i * hc + a) * d + k];
        const float *c = comb + i * hc * hc;
        float yv = y[t];
        for (int b = 0; b < hc; b++) {
            float acc = 0.f;
            for (int a = 0; a < hc; a++) acc = ADD(acc, MUL(c[a * hc + b], sv[a]));
            out[(i * hc + b) * d + k] = round_bf16(ADD(MUL(post[i * hc + b], yv), acc));
        }
    }
}

extern "C" di_status cuda_op_hc_expand(const float *y, const float *s, const float *post,
                                       const float *comb, int64_t m, int hc, int64_t d,
                                       float *out, di_err *err) {
    if (hc < 1 || hc > HC_MAX)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "hc_expand: hc_mult %d (supported 1..%d)", hc,
                          HC_MAX);
    if (m * d <= 0) return DI_OK;
    k_hc_expand<<<grid_for(m * d), 256>>>(y, s, post, comb, m, hc, d, out);
    return cuda_check_launch(err, "hc_expand");
}

__global__ void k_hc_mean(const float *s, int64_t m, int hc, int64_t d, float *out,
                          int64_t out_stride) {
    GRID_STRIDE(t, m * d) {
        int64_t i = t / d, k = t % d;
        float acc = 0.f;
        for (int c = 0; c < hc; c++) acc = ADD(acc, s[(i * hc + c) * d + k]);
        out[i * out_stride + k] = round_bf16(acc / (float)hc);
    }
}

extern "C" di_status cuda_op_hc_mean(const float *s, int64_t m, int hc, int64_t d, float *out,
                                     int64_t out_stride, di_err *err) {
    if (m * d <= 0) return DI_OK;
    k_hc_mean<<<grid_for(m * d), 256>>>(s, m, hc, d, out, out_stride);
    return cuda_check_launch(err, "hc_mean");
}

/* One block per (row, copy): the three sums as block reductions, then the
 * gated update of the copy. */
__global__ void k_engram_gate(float *s, const float *kv, const void *qw, const void *kw,
                              int w_bf16, int hc, int64_t d, float eps, float inv_sqrt_d) {
    __shared__ float red[32];
    int64_t i = blockIdx.x / hc;
    int c = (int)(blockIdx.x % hc);
    const float *value = kv + (i * (hc + 1) + hc) * d;
    float *h = s + (i * hc + c) * d;
    const float *key = kv + (i * (hc + 1) + c) * d;
    float sh = 0.f, sk = 0.f, dot = 0.f;
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) {
        sh = ADD(sh, MUL(h[k], h[k]));
        sk = ADD(sk, MUL(key[k], key[k]));
        float wgt = MUL(vec_at(qw, w_bf16, c * d + k), vec_at(kw, w_bf16, c * d + k));
        dot = ADD(dot, MUL(MUL(h[k], wgt), key[k]));
    }
    sh = block_sum(sh, red);
    sk = block_sum(sk, red);
    dot = block_sum(dot, red);
    float rstd = MUL(1.0f / sqrtf(ADD(sh / (float)d, eps)), 1.0f / sqrtf(ADD(sk / (float)d, eps)));
    dot = MUL(MUL(dot, rstd), inv_sqrt_d);
    float a = sqrtf(fmaxf(fabsf(dot), 1e-6f));
    float gate = sigmoid_f(copysignf(a, dot));
    __syncthreads(); /* every thread has read h before any writes it */
    for (int64_t k = threadIdx.x; k < d; k += blockDim.x) h[k] = round_bf16(ADD(h[k], MUL(gate, value[k])));
}

extern "C" di_status cuda_op_engram_gate(float *s, const float *kv, const void *qw,
                                         const void *kw, int w_bf16, int64_t m, int hc,
                                         int64_t d, float eps, di_err *err) {
    if (m * hc <= 0) return DI_OK;
    float inv_sqrt_d = (float)(1.0 / sqrt((double)d));
    k_engram_gate<<<(unsigned)(m * hc), 256>>>(s, kv, qw, kw, w_bf16, hc, d, eps, inv_sqrt_d);
    return cuda_check_launch(err, "engram_gate");
}
