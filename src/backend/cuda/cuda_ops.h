/* Launchers of the CUDA backend's non-GEMM ops (architecture.md §2–§7), the
 * private C interface between backend_cuda.c (the op table of backend.h)
 * and the kernels in cuda_ops_*.cu. Every pointer is a device pointer unless
 * its comment says host; shapes and rounding points are those of the CPU
 * backend's op of the same name (backend_cpu.c), which is the reference
 * semantics. All launches go to the default stream, so a later cudaMemcpy
 * (download, upload of the next call's metadata) is ordered after them.
 * Each returns DI_OK or DI_ERR_BACKEND with the launch error named. */
#ifndef DI_BACKEND_CUDA_OPS_H
#define DI_BACKEND_CUDA_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"
#include "core/row_exp.h"

/* Element types of weight vectors the ops read (norm weights, Engram gate
 * weights, embedding tables): 0 = F32, 1 = BF16. */
enum { CUDA_VEC_F32 = 0, CUDA_VEC_BF16 = 1 };

/* ---- cuda_ops_mem.cu ---- */
/* 1 when p is device memory of the current device (a backend buffer), 0 for
 * host memory the runtime does not know. */
int cuda_mem_is_device(const void *p);
/* Device-to-device copy with memmove semantics (overlap allowed). */
di_status cuda_mem_move(void *dst, const void *src, size_t bytes, di_err *err);
/* Sets bytes to `byte` without waiting for the device (default stream). */
di_status cuda_mem_fill_async(void *p, int byte, size_t bytes, di_err *err);
/* Host to device on the default stream without draining it: from
 * page-locked memory the copy is queued (src must stay as it is until the
 * stream reaches it), from pageable memory it returns once the runtime
 * has taken the bytes. */
di_status cuda_mem_upload_async(void *dst, const void *src, size_t bytes, di_err *err);
/* Queued device-to-device copies, run by one launch that takes them as its
 * argument (no upload, so queueing never waits for the device). Within a
 * batch no destination overlaps another copy's source or destination. */
enum { CUDA_COPY_BATCH = 128 };
typedef struct cuda_copy_desc {
    char *dst;
    const char *src;
    size_t bytes;
} cuda_copy_desc;
typedef struct cuda_copy_batch {
    cuda_copy_desc d[CUDA_COPY_BATCH];
    int n;
} cuda_copy_batch;
di_status cuda_mem_copy_batch(const cuda_copy_batch *b, di_err *err);
/* Uploads that do not wait for the device: the bytes go through a pinned
 * staging buffer of `bytes` (two halves used in turn) and an asynchronous
 * copy on the default stream; larger uploads than half of it wait. */
typedef struct cuda_stage cuda_stage;
di_status cuda_stage_init(cuda_stage **st, size_t bytes, di_err *err);
void cuda_stage_free(cuda_stage *st);
di_status cuda_stage_upload(cuda_stage *st, void *dst, const void *src, size_t bytes, di_err *err);
/* A pinned buffer the host fills in place, then uploads from with an
 * asynchronous copy on the default stream: take waits for the last upload
 * from it (if still queued), grows it to `bytes` if needed (created at the
 * first call: *pp NULL) and hands it out; upload queues the copy of its
 * first `bytes`. For uploads too big to stage. */
typedef struct cuda_pinned cuda_pinned;
di_status cuda_pinned_take(cuda_pinned **pp, size_t bytes, void **host, di_err *err);
di_status cuda_pinned_upload(cuda_pinned *p, void *dst, size_t bytes, di_err *err);
void cuda_pinned_free(cuda_pinned *p); /* waits for its last upload; NULL accepted */

/* ---- cuda_ops_elementwise.cu ---- */
di_status cuda_op_rmsnorm(const float *x, const void *w, int w_bf16, int64_t m, int64_t n,
                          float eps, float *y, di_err *err);
/* rope: cuda_ops_step.h (cuda_op_rope_cs) */
di_status cuda_op_qdq_fp8(float *x, int64_t n, di_err *err);
/* block 32 with a power-of-two scale (e4m3 = 0) or 16 with an E4M3 scale */
di_status cuda_op_qdq_fp4(float *x, int64_t n, int e4m3, di_err *err);
/* x = bf16(x·c) (c = 1 rounds only) */
di_status cuda_op_scale_bf16(float *x, int64_t n, float c, di_err *err);
/* The quantized-activation product y = qa·W^T (W FP8 if fmt is
 * DI_WFMT_FP8, else MXFP4) with y stored as f32 holding the bf16-rounded
 * value, the store doing what cuda_op_scale_bf16(y, m·n, 1) would after
 * it, when the decode kernels run it (*done = 1); *done = 0 and nothing
 * launched when the shape takes the prefill tiles (the caller rounds). */
di_status cuda_op_gemm_q_rounded(int fmt, const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                 const uint8_t *w, const uint8_t *ws, int64_t n, float *y, int *done,
                                 di_err *err);
/* y = act_quant_fp8(x)·W^T for FP8 W from f32 x [m, k], the quantization
 * done inside the decode kernel (one launch, the bits of di_cuda_act_quant_fp8
 * followed by the product); y f32, bf16-rounded in its store when
 * out_bf16. *done = 0 and nothing launched where that kernel does not
 * apply (more than 8 rows, k % 128, alignment): the caller quantizes. */
di_status cuda_op_gemm_fp8_x(const float *x, int64_t m, int64_t k, const uint8_t *w,
                             const uint8_t *ws, int64_t n, float *y, int out_bf16, int *done,
                             di_err *err);
/* y = bf16(add + act_quant_fp8(swiglu(g, u; limit))·W^T) for FP8 W, g and u
 * f32 [m, k]: the swiglu op (w = NULL), this product (its output rounded
 * to bf16 first when out_bf16) and add_bf16 in one launch, their bits;
 * *done = 0 and nothing launched where the decode kernel does not apply. */
di_status cuda_op_gemm_fp8_x_swiglu_add(const float *g, const float *u, float limit, const float *add, int64_t m,
                                       int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n, float *y,
                                       int out_bf16, int *done, di_err *err);
/* y = ... for W [n x k] and y2 = ... for W2 [n2 x k] from the same x in one
 * launch, each the bits of cuda_op_gemm_fp8_x with the pair's k split
 * (which counts both matrices' blocks); *done = 0 and nothing launched
 * where that does not apply. */
di_status cuda_op_gemm_fp8_x_pair(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                                  const uint8_t *w2, const uint8_t *ws2, int64_t n, int64_t n2, float *y,
                                  float *y2, int out_bf16, int *done, di_err *err);
/* out [m, n] = table row ids[i] ([V, n], F32 or BF16) */
di_status cuda_op_embed(const void *table, int t_bf16, int64_t n, const int32_t *ids, int64_t m,
                        float *out, di_err *err);
/* out [r, eh] = bf16(e4m3(rows[r, :]) · e8m0(scales[r, k/32])) for r < nrows:
 * the rows an Engram gather needs, already gathered on the host. */
di_status cuda_op_fp8_rows(const uint8_t *rows, const uint8_t *scales, int64_t nrows, int64_t eh,
                           int64_t nb, float *out, di_err *err);
di_status cuda_op_compress_pool(const float *a, const float *g, int64_t m, int r, int64_t n,
                                float *out, di_err *err);
di_status cuda_op_swiglu(const float *g, const float *u, const float *w, int64_t m, int64_t n,
                         float limit, float *out, di_err *err);
di_status cuda_op_gather_rows(const float *src, const int32_t *rows, int64_t m, int64_t n,
                              float *dst, di_err *err);
di_status cuda_op_scatter_add_rows(float *dst, const int32_t *rows, const float *src, int64_t m,
                                   int64_t n, di_err *err);
di_status cuda_op_add(float *y, const float *x, int64_t n, di_err *err);
/* out[i] = di_row_greedy_of(x + i·V, V, lim, ban ? ban[i] : -1) bit for bit
 * (core/row_exp.h) for the m rows; ban, out and scratch (of
 * cuda_op_logits_greedy_scratch_bytes(m, V)) in device memory. */
size_t cuda_op_logits_greedy_scratch_bytes(int64_t m, int64_t V);
di_status cuda_op_logits_greedy(const float *x, int64_t m, int64_t V, int64_t lim, const int32_t *ban,
                                di_row_greedy *out, void *scratch, di_err *err);
/* out[i·k .. i·k + k) = di_row_top_of(x + i·V, V, k) bit for bit for the m
 * rows (k in 1 .. DI_ROW_TOP_MAX, at most V); out in device memory. */
di_status cuda_op_logits_top(const float *x, int64_t m, int64_t V, int32_t k, di_row_top *out, di_err *err);
/* out[i] = x[i·V + cols[i]] for the m rows; cols (ids in [0, V)) and out in
 * device memory. */
di_status cuda_op_logits_pick(const float *x, int64_t m, int64_t V, const int32_t *cols, float *out, di_err *err);
/* out[i]: the temperature draw draws[i] on row x + i·V over ids [0, lim)
 * (backend.h logits_draw: the token di_sampler_sample draws, the drawn
 * token's logit in max, the row's log-sum-exp terms; pad 1 where the row
 * is left to the host); draws and out in device memory. */
di_status cuda_op_logits_draw(const float *x, int64_t m, int64_t V, int64_t lim, const di_row_draw *draws,
                              const di_row_edit *edits, int64_t edit_base,
                              di_row_greedy *out, di_err *err);
/* rope_cs of q [m, heads·hd] (stride heads·hd) and of kv [m, hd] after
 * rmsnorm (weight nw), then kv_pack FP8 of kv into out: the bits of those
 * four launches in one (hd <= 2048); cs [m, rd/2, 2] device. */
di_status cuda_op_qkv_rope_pack(float *q, int heads, float *kv, int64_t m, int64_t hd, int64_t rd,
                                const void *nw, int nw_bf16, float eps, const float *cs,
                                uint8_t *out, di_err *err);
/* y = bf16(a + b) (y may alias a or b): add then round_bf16, one launch */
di_status cuda_op_add_bf16(float *y, const float *a, const float *b, int64_t n, di_err *err);

/* ---- cuda_ops_linear.cu ----
 * y[i, ldy·i + j] = Σ_k x[i·ldx + k]·W[row0 + j, k] for j < nr, weights
 * decoded exactly on the fly; groups > 1 runs group g on x + g·K, rows
 * row0 + g·nr, y + g·nr. fmt: backend.h's di_wfmt. F32 weights: one fused
 * multiply-add chain in increasing k per output (the CPU's order and bits);
 * BF16 / FP8 / MXFP4: tensor cores over an exact split of x, a fixed order
 * that depends on K only (a row's bits do not depend on m), within
 * (18·n_mma + 3)·2^-23·Σ|w·x| of the exact sum, n_mma = 6·ceil(K/256). */
di_status cuda_op_matmul_plain(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                               int64_t n_in, const float *x, int64_t ldx, int64_t m, int groups,
                               int64_t nr, float *y, int64_t ldy, int out_bf16, di_err *err);
/* The same with a scratch buffer of cuda_op_matmul_scratch_bytes() bytes
 * (NULL: none) for the prefill form's bf16 copy of x (many rows, BF16 / FP8
 * weights): where x turns out to be bf16-valued everywhere, the product
 * reads that copy instead of splitting x again in every block; the same
 * bits either way. The size is 0 where that form would not run (nr: the
 * outputs of a group). */
di_status cuda_op_matmul_plain_s(int fmt, const void *w, const uint8_t *s, int64_t n_out,
                                 int64_t n_in, const float *x, int64_t ldx, int64_t m, int groups,
                                 int64_t nr, float *y, int64_t ldy, int out_bf16, void *scratch,
                                 size_t scratch_bytes, di_err *err);
size_t cuda_op_matmul_scratch_bytes(int fmt, int64_t n_in, int64_t m, int groups, int64_t nr);
/* y [m, n] = x·Wᵀ for BF16 W [n, k] and x [m, k] holding bf16 values
 * (DI_MM_ACT_BF16), through cuBLAS (bf16 products, fp32 sums in its own
 * order, within 2k·2^-24·Σ|w·x| of the exact sum): x goes to x16 [m, k]
 * as bf16 (exact), then one GEMM on the default stream. *blas is the
 * caller's cuBLAS handle, made here at the first call (cuda_blas_free).
 * The order of the sums may depend on m: not for batch-invariant mode. */
di_status cuda_op_matmul_bf16_blas(void **blas, const void *w, int64_t n, int64_t k, const float *x, int64_t m,
                                   float *y, int out_bf16, uint16_t *x16, di_err *err);
void cuda_blas_free(void *blas);
long cuda_blas_calls(void); /* GEMMs cuda_op_matmul_bf16_blas ran (tests) */
/* y = x·Wᵀ and y2 = x·W2ᵀ (W, W2 [nr, n_in] of one format; x [m, n_in]) in
 * one launch of the decode form, each with the bits of
 * cuda_op_matmul_plain alone; *done = 0 and nothing launched where that
 * form does not apply (more than 8 rows, F32 weights, alignment): the
 * caller runs the two products. */
di_status cuda_op_matmul_plain_pair(int fmt, const void *w, const uint8_t *s, const void *w2,
                                    const uint8_t *s2, int64_t n_in, const float *x, int64_t m,
                                    int64_t nr, float *y, float *y2, int out_bf16, int *done,
                                    di_err *err);

/* ---- cuda_ops_hc.cu ---- */
di_status cuda_op_hc_mix(const float *s, int64_t m, int hc, int64_t d, const float *fn,
                         const float *base, const float *scale, float norm_eps, float hc_eps,
                         int iters, float *pre, float *post, float *comb, di_err *err);
/* The same with a scratch buffer of cuda_op_hc_mix_scratch_bytes() bytes
 * (NULL: none) for the rows form at many rows (the prefill's), which
 * streams the rows through fn held in registers instead of reading fn
 * once per row; within the same tolerance of the CPU, its own fixed order.
 * The size is 0 where that form does not run. */
di_status cuda_op_hc_mix_s(const float *s, int64_t m, int hc, int64_t d, const float *fn,
                           const float *base, const float *scale, float norm_eps, float hc_eps,
                           int iters, float *pre, float *post, float *comb, void *scratch,
                           size_t scratch_bytes, di_err *err);
size_t cuda_op_hc_mix_scratch_bytes(int64_t m, int hc, int64_t d);
/* A second stream for hc_mix (cuda_op_hc_mix_side): the stream and the
 * two events of its fork and join. */
di_status cuda_side_create(void **stream, void **ev_fork, void **ev_join, di_err *err);
void cuda_side_destroy(void *stream, void *ev_fork, void *ev_join);
/* hc_mix's split form (hc 4, m <= cuda_op_hc_mix_side_rows(), not in
 * batch-invariant mode: the kernels and bits of cuda_op_hc_mix_s there)
 * on the side stream, after everything queued so far on the calling
 * thread's stream; cuda_side_join makes that stream wait for it. */
int64_t cuda_op_hc_mix_side_rows(void);
di_status cuda_op_hc_mix_side(const float *s, int64_t m, int64_t d, const float *fn, const float *base,
                              const float *scale, float norm_eps, float hc_eps, int iters, float *pre,
                              float *post, float *comb, void *stream, void *ev_fork, void *ev_join,
                              di_err *err);
di_status cuda_side_join(void *ev_join, di_err *err);
di_status cuda_op_hc_collapse(const float *s, const float *w, int64_t m, int hc, int64_t d,
                              float *y, di_err *err);
/* y = rmsnorm(hc_collapse(s, w)): the bits of the two ops, one launch at hc 4. */
di_status cuda_op_hc_collapse_norm(const float *s, const float *w, int64_t m, int hc, int64_t d,
                                   const void *nw, int nw_bf16, float eps, float *y, di_err *err);
di_status cuda_op_hc_expand(const float *y, const float *s, const float *post,
                            const float *comb, int64_t m, int hc, int64_t d, float *out,
                            di_err *err);
di_status cuda_op_hc_mean(const float *s, int64_t m, int hc, int64_t d, float *out,
                          int64_t out_stride, di_err *err);
di_status cuda_op_engram_gate(float *s, const float *kv, const void *qw, const void *kw,
                              int w_bf16, int64_t m, int hc, int64_t d, float eps, di_err *err);

/* ---- cuda_ops_attn.cu ---- */
/* rows [m, n_slots] device table of device row pointers (NULL = empty slot) */
di_status cuda_op_sparse_attn(const float *q, int64_t m, int h, int64_t d,
                              const float *const *rows, int n_slots, const float *sink,
                              float scale, float *out, di_err *err);
/* keys [m] device table of device pointers, n_vis [m] device */
di_status cuda_op_index_scores(const float *q, const float *w, int64_t m, int hi, int64_t di,
                               const float *const *keys, const int32_t *n_vis, int64_t width,
                               float *out, di_err *err);
/* The same over packed cache rows (backend/kvstore.h): slots j < n_win are
 * DI_KVQ_FP8 rows, the others DI_KVQ_FP4_E4M3; keys DI_KVQ_FP4_E8M0. */
di_status cuda_op_sparse_attn_kv(const float *q, int64_t m, int h, int64_t d,
                                 const uint8_t *const *rows, int n_slots, int n_win,
                                 const float *sink, float scale, float *out, di_err *err);
di_status cuda_op_index_scores_kv(const float *q, const float *w, int64_t m, int hi, int64_t di,
                                  const uint8_t *const *keys, const int32_t *n_vis,
                                  int64_t width, float *out, di_err *err);
/* sparse_attn_kv over the tables of backend.h's di_attn_rows (win [m, n_win],
 * ring [m], sel [m, n_sel], cache [m]: all device), the row pointers built
 * on the device into tab [m, n_win + n_sel] (device scratch). */
di_status cuda_op_sparse_attn_rows(const float *q, int64_t m, int h, int64_t d, int n_win,
                                   const int32_t *win, const uint8_t *const *ring,
                                   const uint8_t *chunk, size_t win_bytes, int n_sel,
                                   const int32_t *sel, const uint8_t *const *cache,
                                   size_t cache_bytes, const uint8_t **tab, const float *sink,
                                   float scale, float *out, di_err *err);
/* out [m, di_kvq_row_bytes(fmt, n)] = packed rows of x [m, n]; fmt a di_kvq */
di_status cuda_op_kv_pack(int fmt, const float *x, int64_t m, int64_t n, uint8_t *out,
                          di_err *err);
/* blocks [m, topk_blocks] device */
di_status cuda_op_restrict_blocks(float *scores, const int32_t *blocks, int64_t m, int64_t width,
                                  int topk_blocks, int bs, di_err *err);

/* ---- cuda_ops_select.cu ---- */
/* Per row of scores [m, width], the up to ksel best among the first n_vis[i]
 * (n_vis device, or NULL = width) scores that are not -inf or NaN, ties to
 * the lower index, ascending, into idx [m, kout] (device) padded with -1:
 * the CPU backend's topk_select, bit for bit. */
di_status cuda_op_topk_select(const float *scores, const int32_t *n_vis, int64_t m, int64_t width,
                              int ksel, int kout, int32_t *idx, di_err *err);
/* bsc [m, ceil(width/bs)] = per-block max of the scores, the block of entry
 * n_vis[i] - 1 set to +inf (the candidate pool's block scores). */
di_status cuda_op_block_max(const float *scores, const int32_t *n_vis, int64_t m, int64_t width,
                            int bs, float *bsc, di_err *err);

#ifdef __cplusplus
}
#endif

#endif
