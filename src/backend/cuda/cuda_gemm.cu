/* GEMM entry points: argument checks and the choice of kernel by shape
 * (architecture.md §2 numerics). Decode (m <= 16) runs the matrix-vector
 * kernels, bound by weight bytes (wgmma with the copy engine when k % 128 ==
 * 0 and the operands are 16-byte aligned, mma.sync otherwise); prefill runs
 * the wgmma tiles when k allows, else the mma.sync matrix-vector kernel over
 * token slices. */
#include "backend/cuda/cuda_common.cuh"

#include "backend/backend.h"

static di_status check_args(const char *op, const uint8_t *qa, const float *sa, int64_t m,
                            int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                            const void *out, di_dtype out_dtype, di_err *err) {
    if (m < 0 || k < 0 || n < 0)
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: bad shape m=%lld k=%lld n=%lld", op,
                          (long long)m, (long long)k, (long long)n);
    if (out_dtype != DI_DTYPE_F32 && out_dtype != DI_DTYPE_BF16)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "%s: output dtype %s (supported: F32, BF16)",
                          op, di_dtype_name(out_dtype));
    if (m && n && (!out || (k && (!qa || !sa || !w || !ws))))
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: NULL buffer", op);
    return DI_OK;
}

/* Whether the wgmma tiles (128 x 128, each walking all of k) beat the
 * matrix-vector kernels at m rows. Past 16 rows they do, except for a few
 * rows of a narrow matrix: at m <= 64 the tiles number n / 128 and a block's
 * k stages run one after another (k = 5,120: ~35 µs whatever n), where the
 * matrix-vector kernels spread k over the SMs (wkv 512 x 5,120 at m = 64:
 * 10 µs; wq_a 22 against 35; docs/gpu-notes.md, mid run 2). Both paths are
 * deterministic, and a row's bits depend on m only through which one runs
 * (past 16 rows the matrix-vector path is the mma.sync kernel, not the
 * wgmma one of m <= 16). DI_CUDA_FP8_NARROW=0: the tiles past 16 rows
 * always (measuring aid). Batch-invariant mode: where k and the alignment
 * let the tiles run, the tiles past 16 rows and the wgmma matrix-vector
 * kernel in one cluster rank up to 16 (the tiles' bits: a row's 32-blocks
 * promoted in one chain in k order, whatever the other rows); the mma.sync
 * kernel at every m otherwise. */
static int fp8_narrow = -1;
static bool fp8_tiles_pay(int64_t m, int64_t n) {
    if (cuda_batch_invariant()) return true; /* di_cuda_gemm_fp8 then takes its few rows */
    if (m <= 16) return false;
    if (m > 64 || !cuda_env_switch("DI_CUDA_FP8_NARROW", &fp8_narrow)) return true;
    return (n + 127) / 128 >= 20;
}

extern "C" di_status di_cuda_gemm_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                      const uint8_t *w, const uint8_t *w_scale, int64_t n,
                                      void *out, di_dtype out_dtype, di_cuda_gemm_path path,
                                      void *stream, di_err *err) {
    di_status st = check_args("gemm_fp8", qa, sa, m, k, w, w_scale, n, out, out_dtype, err);
    if (st || m == 0 || n == 0) return st;
    int bf16 = out_dtype == DI_DTYPE_BF16;
    cudaStream_t s = (cudaStream_t)stream;
    if (k == 0) /* empty sum */
        return cuda_check(cudaMemsetAsync(out, 0, (size_t)(m * n) * (bf16 ? 2 : 4), s), err,
                          "gemm_fp8: clearing the output");
    bool tiled_ok = k % 128 == 0 && (uintptr_t)qa % 16 == 0 && (uintptr_t)w % 16 == 0 &&
                    (uintptr_t)sa % 16 == 0 && (uintptr_t)w_scale % 4 == 0;
    if (path == DI_CUDA_GEMM_AUTO && tiled_ok && m <= 16 && cuda_batch_invariant()) {
        int done = 0;
        st = cuda_launch_matvec_fp8_tiles_bits(qa, sa, m, k, w, w_scale, n, out, bf16, s, &done, err);
        if (st || done) return st;
    }
    if (path == DI_CUDA_GEMM_TILED || (path == DI_CUDA_GEMM_AUTO && fp8_tiles_pay(m, n) && tiled_ok))
        return cuda_launch_gemm_fp8_tiled(qa, sa, m, k, w, w_scale, n, out, bf16, s, err);
    return cuda_launch_matvec_fp8(qa, sa, m, k, w, w_scale, n, out, bf16, s, err);
}

extern "C" di_status cuda_op_gemm_q_rounded(int fmt, const uint8_t *qa, const float *sa, int64_t m,
                                           int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                                           float *y, int *done, di_err *err) {
    *done = 0;
    const bool fp8 = fmt == DI_WFMT_FP8;
    di_status st = check_args(fp8 ? "gemm_fp8" : "gemm_mxfp4", qa, sa, m, k, w, ws, n, y, DI_DTYPE_F32, err);
    if (st || k == 0 || (!fp8 && k % 2)) return st; /* the plain entry points handle these */
    if (m == 0 || n == 0) {
        *done = 1;
        return DI_OK;
    }
    bool tiled_ok = k % 128 == 0 && (uintptr_t)qa % 16 == 0 && (uintptr_t)w % 16 == 0 &&
                    (uintptr_t)sa % 16 == 0 && (uintptr_t)ws % 4 == 0;
    if (fp8 && fp8_tiles_pay(m, n) && tiled_ok) return DI_OK;
    *done = 1;
    return fp8 ? cuda_launch_matvec_fp8(qa, sa, m, k, w, ws, n, y, OUT_F32_BF16, 0, err)
               : cuda_launch_matvec_mxfp4(qa, sa, m, k, w, ws, n, y, OUT_F32_BF16, 0, err);
}

extern "C" di_status cuda_op_gemm_fp8_x(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                      const uint8_t *ws, int64_t n, float *y, int out_bf16,
                                      int *done, di_err *err) {
    *done = 0;
    if (m <= 0 || n <= 0 || k <= 0 || !x || !w || !ws || !y) return DI_OK; /* the caller's path */
    /* batch-invariant mode: only where the tiles would run (its one cluster
     * rank gives their bits; the codes are act_quant's) */
    if (cuda_batch_invariant() && ((uintptr_t)w % 16 || (uintptr_t)ws % 4)) return DI_OK;
    return cuda_launch_matvec_fp8_x(x, m, k, w, ws, n, y, out_bf16 ? OUT_F32_BF16 : 0, 0, done,
                                    err);
}

extern "C" di_status cuda_op_gemm_fp8_x_swiglu_add(const float *g, const float *u, float limit, const float *add,
                                                  int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                                                  int64_t n, float *y, int out_bf16, int *done, di_err *err) {
    *done = 0;
    if (m <= 0 || n <= 0 || k <= 0 || !g || !u || !add || !w || !ws || !y) return DI_OK;
    if (cuda_batch_invariant() && ((uintptr_t)w % 16 || (uintptr_t)ws % 4)) return DI_OK;
    return cuda_launch_matvec_fp8_x_swiglu_add(g, u, limit, add, m, k, w, ws, n, y, out_bf16 ? OUT_F32_BF16 : 0, 0,
                                              done, err);
}

extern "C" di_status cuda_op_gemm_fp8_x_pair(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                           const uint8_t *ws, const uint8_t *w2, const uint8_t *ws2, int64_t n,
                                           int64_t n2, float *y, float *y2, int out_bf16, int *done, di_err *err) {
    *done = 0;
    if (m <= 0 || n <= 0 || n2 <= 0 || k <= 0 || !x || !w || !ws || !w2 || !ws2 || !y || !y2) return DI_OK;
    if (cuda_batch_invariant() && ((uintptr_t)w % 16 || (uintptr_t)ws % 4 || (uintptr_t)w2 % 16 ||
                                   (uintptr_t)ws2 % 4))
        return DI_OK;
    return cuda_launch_matvec_fp8_x_pair(x, m, k, w, ws, w2, ws2, n, n2, y, y2, out_bf16 ? OUT_F32_BF16 : 0, 0,
                                         done, err);
}

extern "C" di_status di_cuda_gemm_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                        const uint8_t *w, const uint8_t *w_scale, int64_t n,
                                        void *out, di_dtype out_dtype, di_cuda_gemm_path path,
                                        void *stream, di_err *err) {
    di_status st = check_args("gemm_mxfp4", qa, sa, m, k, w, w_scale, n, out, out_dtype, err);
    if (st) return st;
    if (k % 2)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "gemm_mxfp4: k = %lld is odd (two E2M1 codes per byte)", (long long)k);
    if (path == DI_CUDA_GEMM_TILED)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "gemm_mxfp4: no tiled kernel yet");
    if (m == 0 || n == 0) return DI_OK;
    int bf16 = out_dtype == DI_DTYPE_BF16;
    cudaStream_t s = (cudaStream_t)stream;
    if (k == 0)
        return cuda_check(cudaMemsetAsync(out, 0, (size_t)(m * n) * (bf16 ? 2 : 4), s), err,
                          "gemm_mxfp4: clearing the output");
    return cuda_launch_matvec_mxfp4(qa, sa, m, k, w, w_scale, n, out, bf16, s, err);
}

/* The grouped products' checks past check_args: *run = 0 where there is
 * nothing to compute. */
static di_status check_grouped(const char *op, int64_t k, int64_t n, const int32_t *ids, const int32_t *off,
                               int32_t ngroups, const int32_t *rows, int32_t max_rows, int *run, di_err *err) {
    *run = 0;
    if (ngroups < 0 || max_rows < 0)
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: %d groups, %d rows", op, (int)ngroups, (int)max_rows);
    if (ngroups == 0 || max_rows == 0 || n == 0) return DI_OK;
    if (!ids || !off || !rows) return di_err_set(err, DI_ERR_INVALID_ARG, "%s: NULL routing array", op);
    if (k == 0 || k % 32)
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s: k = %lld is not a positive multiple of 32", op,
                          (long long)k);
    *run = 1;
    return DI_OK;
}

extern "C" di_status di_cuda_gemm_mxfp4_grouped(const uint8_t *qa, const float *sa, int64_t k,
                                                const uint8_t *w, const uint8_t *w_scale,
                                                int64_t n, const int32_t *ids, const int32_t *off,
                                                int32_t ngroups, const int32_t *rows,
                                                int32_t max_rows, void *out, di_dtype out_dtype,
                                                void *stream, di_err *err) {
    const char *op = "gemm_mxfp4_grouped";
    int run = 0;
    di_status st = check_args(op, qa, sa, max_rows, k, w, w_scale, n, out, out_dtype, err);
    if (!st) st = check_grouped(op, k, n, ids, off, ngroups, rows, max_rows, &run, err);
    if (st || !run) return st;
    return cuda_launch_matvec_mxfp4_grouped(qa, sa, k, w, w_scale, n, ids, off, ngroups, rows,
                                            max_rows, out, out_dtype == DI_DTYPE_BF16,
                                            (cudaStream_t)stream, err);
}

extern "C" di_status di_cuda_gemm_mxfp4_grouped_pair(const uint8_t *qa, const float *sa, int64_t k,
                                                     const uint8_t *w, const uint8_t *w_scale,
                                                     const uint8_t *w_b, const uint8_t *w_scale_b,
                                                     int64_t n, const int32_t *ids, const int32_t *off,
                                                     int32_t ngroups, const int32_t *rows,
                                                     int32_t max_rows, void *out, void *out_b,
                                                     di_dtype out_dtype, void *stream, di_err *err) {
    const char *op = "gemm_mxfp4_grouped_pair";
    int run = 0;
    di_status st = check_args(op, qa, sa, max_rows, k, w, w_scale, n, out, out_dtype, err);
    if (!st) st = check_args(op, qa, sa, max_rows, k, w_b, w_scale_b, n, out_b, out_dtype, err);
    if (!st) st = check_grouped(op, k, n, ids, off, ngroups, rows, max_rows, &run, err);
    if (st || !run) return st;
    return cuda_launch_matvec_mxfp4_grouped_pair(qa, sa, k, w, w_scale, w_b, w_scale_b, n, ids, off,
                                                 ngroups, rows, max_rows, out, out_b,
                                                 out_dtype == DI_DTYPE_BF16, (cudaStream_t)stream, err);
}
