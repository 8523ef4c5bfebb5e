/* AVX2 + FMA CPU kernels (kernels.h). Placeholder until the vector code
 * lands: forwards to the scalar kernels, which define the results. */
#include "backend/cpu/kernels.h"

#ifdef DI_HAVE_AVX2_KERNELS
void di_act_quant_fp8_avx2(const float *x, int64_t M, int64_t K, uint8_t *q, float *s) {
    di_act_quant_fp8_scalar(x, M, K, q, s);
}
void di_act_qdq_fp8_avx2(const float *x, int64_t n, float *out) { di_act_qdq_fp8_scalar(x, n, out); }
void di_gemm_fp8_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                      const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    di_gemm_fp8_scalar(qa, sa, M, K, w, ws, N, out, tp);
}
void di_gemm_mxfp4_avx2(const uint8_t *qa, const float *sa, int64_t M, int64_t K,
                        const uint8_t *w, const uint8_t *ws, int64_t N, float *out,
                        di_threadpool *tp) {
    di_gemm_mxfp4_scalar(qa, sa, M, K, w, ws, N, out, tp);
}
void di_gemm_bf16_avx2(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N,
                       float *out, di_threadpool *tp) {
    di_gemm_bf16_scalar(x, M, K, w, N, out, tp);
}
void di_gemm_f32_avx2(const float *x, int64_t M, int64_t K, const float *w, int64_t N,
                      float *out, di_threadpool *tp) {
    di_gemm_f32_scalar(x, M, K, w, N, out, tp);
}
#endif
