/* Portable scalar CPU kernels (kernels.h). They run on any CPU and state the
 * summation order of kernels.h in its plainest form; the AVX2 kernels must
 * reproduce them bit for bit. Output columns are split across the pool's
 * threads; every output element is computed by one thread, start to end. */
#include <math.h>

#include "backend/cpu/kernels.h"
#include "core/dtype.h"

#ifdef __clang__
/* The order statement relies on separate multiply and add roundings where
 * kernels.h says so: no silent fusion. */
#pragma STDC FP_CONTRACT OFF
#endif

/* Columns per parallel-for chunk: enough work to amortise the hand-out. */
#define COL_GRAIN 32

static inline float clamp448(float v) { return v < -448.0f ? -448.0f : (v > 448.0f ? 448.0f : v); }

void di_act_quant_fp8_scalar(const float *x, int64_t M, int64_t K, uint8_t *q, float *s) {
    for (int64_t m = 0; m < M; m++) {
        for (int64_t kb = 0; kb < K / 32; kb++) {
            const float *xb = x + m * K + kb * 32;
            float sc = di_act_scale_fp8(xb);
            s[m * (K / 32) + kb] = sc;
            for (int i = 0; i < 32; i++) q[m * K + kb * 32 + i] = di_f32_to_e4m3(clamp448(xb[i] / sc));
        }
    }
}

void di_act_qdq_fp8_scalar(const float *x, int64_t n, float *out) {
    const float *e4m3 = di_cpu_e4m3_table();
    for (int64_t b = 0; b < n; b += 32) {
        float sc = di_act_scale_fp8(x + b);
        for (int i = 0; i < 32; i++) out[b + i] = e4m3[di_f32_to_e4m3(clamp448(x[b + i] / sc))] * sc;
    }
}

typedef struct gemm_job {
    const void *a;      /* qa (uint8 codes) or x (float) [M, K] */
    const float *sa;    /* [M, K/32] or NULL */
    const void *w;      /* weights in their format */
    const uint8_t *ws;  /* weight scales or NULL */
    int64_t M, K, N;
    float *out;         /* [M, N] */
} gemm_job;

/* FP8: the lane chains of kernels.h, one fused step per code. */
static float fp8_output(const uint8_t *qa, const float *sa, int64_t K, const uint8_t *w,
                        const uint8_t *ws, int64_t n) {
    const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
    const int64_t KB = K / 32;
    float lane[8] = {0};
    for (int64_t k = 0; k < K; k++) {
        float a = e4m3[qa[k]] * sa[k / 32];
        float v = e4m3[w[n * K + k]] * e8m0[ws[(n / 32) * KB + k / 32]];
        int j = (int)((k % 32) / 4);
        lane[j] = fmaf(a, v, lane[j]);
    }
    return ((lane[0] + lane[1]) + (lane[2] + lane[3])) + ((lane[4] + lane[5]) + (lane[6] + lane[7]));
}

/* MXFP4: per 32-code block, the two exact partial sums of kernels.h (codes
 * of activations at or above 2^-3 and below it), each joined to the chain
 * of the block's parity with one fused step. */
static float mxfp4_output(const uint8_t *qa, const float *sa, int64_t K, const uint8_t *w,
                          const uint8_t *ws, int64_t n) {
    const float *e4m3 = di_cpu_e4m3_table(), *e8m0 = di_cpu_e8m0_table();
    const int64_t KB = K / 32;
    float chain[2] = {0.0f, 0.0f};
    for (int64_t kb = 0; kb < KB; kb++) {
        float big = 0.0f, small = 0.0f; /* exact: see kernels.h */
        for (int64_t k = kb * 32; k < kb * 32 + 32; k++) {
            const float a = e4m3[qa[k]];
            const float v = a * di_e2m1_to_f32((uint8_t)(w[n * (K / 2) + k / 2] >> (4 * (k & 1))));
            if (fabsf(a) >= 0.125f) big += v;
            else small += v;
        }
        const float s = sa[kb] * e8m0[ws[n * KB + kb]];
        float *c = &chain[kb % 2];
        *c = fmaf(big, s, *c);
        *c = fmaf(small, s, *c);
    }
    return chain[0] + chain[1];
}

/* The order of kernels.h for outputs [n0, n1) of every row. */
void di_gemm_block_rows_scalar(int fp4, const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                               const uint8_t *w, const uint8_t *ws, int64_t N, int64_t n0,
                               int64_t n1, float *out) {
    const int64_t KB = K / 32;
    for (int64_t m = 0; m < M; m++)
        for (int64_t n = n0; n < n1; n++)
            out[m * N + n] = fp4 ? mxfp4_output(qa + m * K, sa + m * KB, K, w, ws, n)
                                 : fp8_output(qa + m * K, sa + m * KB, K, w, ws, n);
}

static void fp8_cols(void *ctx, int64_t n0, int64_t n1, int thread) {
    const gemm_job *j = ctx;
    di_gemm_block_rows_scalar(0, j->a, j->sa, j->M, j->K, j->w, j->ws, j->N, n0, n1, j->out);
}

static void mxfp4_cols(void *ctx, int64_t n0, int64_t n1, int thread) {
    const gemm_job *j = ctx;
    di_gemm_block_rows_scalar(1, j->a, j->sa, j->M, j->K, j->w, j->ws, j->N, n0, n1, j->out);
}

static void bf16_cols(void *ctx, int64_t n0, int64_t n1, int thread) {
    const gemm_job *j = ctx;
    const float *x = j->a;
    const uint16_t *w = j->w;
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t n = n0; n < n1; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < j->K; k++) acc = fmaf(x[m * j->K + k], di_bf16_to_f32(w[n * j->K + k]), acc);
            j->out[m * j->N + n] = acc;
        }
}

static void f32_cols(void *ctx, int64_t n0, int64_t n1, int thread) {
    const gemm_job *j = ctx;
    const float *x = j->a, *w = j->w;
    for (int64_t m = 0; m < j->M; m++)
        for (int64_t n = n0; n < n1; n++) {
            float acc = 0.0f;
            for (int64_t k = 0; k < j->K; k++) acc = fmaf(x[m * j->K + k], w[n * j->K + k], acc);
            j->out[m * j->N + n] = acc;
        }
}

void di_gemm_fp8_scalar(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                        const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    gemm_job j = {qa, sa, w, ws, M, K, N, out};
    di_threadpool_for(tp, N, COL_GRAIN, fp8_cols, &j);
}

void di_gemm_mxfp4_scalar(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                          const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                          di_threadpool *tp) {
    gemm_job j = {qa, sa, w, ws, M, K, N, out};
    di_threadpool_for(tp, N, COL_GRAIN, mxfp4_cols, &j);
}

void di_gemm_bf16_scalar(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                         float *out, di_threadpool *tp) {
    gemm_job j = {x, NULL, w, NULL, M, K, N, out};
    di_threadpool_for(tp, N, COL_GRAIN, bf16_cols, &j);
}

void di_gemm_f32_scalar(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                        float *out, di_threadpool *tp) {
    gemm_job j = {x, NULL, w, NULL, M, K, N, out};
    di_threadpool_for(tp, N, COL_GRAIN, f32_cols, &j);
}
