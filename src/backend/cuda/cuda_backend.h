/* CUDA backend: devices, device buffers and the weight-format kernels
 * (architecture.md §2 numerics, §8.3 formats; performance.md §1.3 for the
 * Hopper build and measuring rules).
 *
 * A plain C interface so that the C side of the engine never sees CUDA
 * types: device pointers are void*, a stream is an opaque void* (NULL = the
 * default stream). Every function returns a di_status and fills `err`; none
 * prints or exits. When the build has no CUDA (nvcc absent or DI_NO_CUDA=1)
 * cuda_stub.c provides the same functions, each failing with
 * DI_ERR_UNSUPPORTED, so callers need no #ifdef.
 *
 * Formats, all row-major, outermost first (as in the checkpoint):
 *   activations       bf16 [m, k]
 *   quantized act.    e4m3 [m, k] + f32 scale [m, ceil(k/32)] (powers of two)
 *   FP8 weight        e4m3 [n, k] + E8M0 scale [ceil(n/32), ceil(k/32)]
 *   MXFP4 weight      I8 [n, k/2] (two E2M1 codes per byte, low nibble = even
 *                     element) + E8M0 scale [n, ceil(k/32)]
 *   GEMM output       f32 or bf16 [m, n] */
#ifndef DI_BACKEND_CUDA_BACKEND_H
#define DI_BACKEND_CUDA_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" { /* the core headers are C: keep their names unmangled in .cu files */
#endif

#include "core/dtype.h"
#include "core/error.h"

/* ---------------------------------------------------------------- devices */

typedef struct di_cuda_device_info {
    int index;
    char name[256];
    int cc_major, cc_minor;     /* compute capability (9.0 = Hopper) */
    int sm_count;
    size_t total_mem;           /* bytes */
    size_t free_mem;            /* bytes, at the time of the query */
    size_t l2_bytes;
    size_t smem_per_block_optin; /* largest dynamic shared memory a block may ask for */
    int clock_khz;              /* peak SM clock as reported (0 if unknown) */
} di_cuda_device_info;

/* Number of visible devices. Fails with DI_ERR_BACKEND and a message that
 * starts with "no CUDA device visible" when there is none (no driver, no
 * GPU, or CUDA_VISIBLE_DEVICES hides them all). */
di_status di_cuda_device_count(int *count, di_err *err);
di_status di_cuda_device_info_get(int dev, di_cuda_device_info *info, di_err *err);
/* Makes `dev` current for the calling thread and creates its context. */
di_status di_cuda_init(int dev, di_err *err);
di_status di_cuda_synchronize(di_err *err);

/* ---------------------------------------------------------------- buffers */

di_status di_cuda_alloc(void **dev_ptr, size_t bytes, di_err *err);
void di_cuda_free(void *dev_ptr); /* NULL is a no-op; errors are ignored */
di_status di_cuda_upload(void *dev_dst, const void *host_src, size_t bytes, di_err *err);
di_status di_cuda_download(void *host_dst, const void *dev_src, size_t bytes, di_err *err);
/* Page-locked host memory (what downloads reach at the bus's speed), or
 * ordinary memory when none can be locked; NULL only when neither can be
 * had. di_cuda_host_free tells the two apart (NULL is a no-op). */
void *di_cuda_host_alloc(size_t bytes);
void di_cuda_host_free(void *host_ptr);
/* Whether host_ptr is page-locked memory of this process's CUDA context. */
int di_cuda_host_pinned(const void *host_ptr);
/* Fills bytes with `byte` (used to poison outputs before a checked run). */
di_status di_cuda_fill(void *dev_ptr, int byte, size_t bytes, di_err *err);

/* -------------------------------------------------------------------- ops */

/* FP8 activation quantization per 32 contiguous elements along k, bit-identical
 * to the CPU's di_act_quant_fp8: amax = max(max|x|, 1e-4), s = 2^ceil(log2(amax
 * * fp32(1/448))) from the exponent bits, q = e4m3_rne(clamp(x / s, -448, 448)).
 * The last block of a row may be short (the CPU op needs k % 32 == 0).
 *   x [m, k] bf16 or f32 (x_dtype) -> q [m, k] e4m3, scale [m, ceil(k/32)] f32 */
di_status di_cuda_act_quant_fp8(const void *x, di_dtype x_dtype, int64_t m, int64_t k,
                                uint8_t *q, float *scale, void *stream, di_err *err);

/* Which kernel a GEMM runs. AUTO picks by shape; the others exist so that
 * tests and benchmarks can cross-check and time every path on one shape. */
typedef enum di_cuda_gemm_path {
    DI_CUDA_GEMM_AUTO = 0,
    DI_CUDA_GEMM_MATVEC = 1, /* mma.sync, 8 rows of a per tile (16 for odd shapes): decode */
    DI_CUDA_GEMM_TILED = 2   /* wgmma tiles (FP8 only): prefill; needs k % 128 == 0 */
} di_cuda_gemm_path;

/* out[i, j] = sum over 32-blocks b of sa[i, b] * sw[j/32, b] * sum_{k in b} qa[i, k] * w[j, k]
 * with fp32 accumulation; out_dtype is DI_DTYPE_F32 or DI_DTYPE_BF16 (RNE). */
di_status di_cuda_gemm_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                           const uint8_t *w, const uint8_t *w_scale, int64_t n, void *out,
                           di_dtype out_dtype, di_cuda_gemm_path path, void *stream,
                           di_err *err);

/* Same with an MXFP4 weight: w [n, k/2] packed E2M1, w_scale [n, ceil(k/32)] E8M0
 * (one scale per row and 32-block). k must be even. Only the MATVEC path. */
di_status di_cuda_gemm_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                             const uint8_t *w, const uint8_t *w_scale, int64_t n, void *out,
                             di_dtype out_dtype, di_cuda_gemm_path path, void *stream,
                             di_err *err);

/* Grouped MXFP4 products for an MoE decode step, one launch for all routed
 * experts: group z multiplies the activation rows rows[off[z] .. off[z+1])
 * by expert ids[z]'s weight, and output row p (a (token, expert) pair) is
 *   out[p, :] = qa[rows[p], :] . W_{ids[z]}^T      for p in [off[z], off[z+1])
 * w [n_experts, n, k/2], w_scale [n_experts, n, k/32]; ids [ngroups], off
 * [ngroups + 1], rows [off[ngroups]] are int32 arrays in device memory (so a
 * captured graph replays with new routing); max_rows bounds every group's
 * size. k % 32 == 0. Same numerics as di_cuda_gemm_mxfp4, row by row. */
di_status di_cuda_gemm_mxfp4_grouped(const uint8_t *qa, const float *sa, int64_t k,
                                     const uint8_t *w, const uint8_t *w_scale, int64_t n,
                                     const int32_t *ids, const int32_t *off, int32_t ngroups,
                                     const int32_t *rows, int32_t max_rows, void *out,
                                     di_dtype out_dtype, void *stream, di_err *err);

/* Two grouped MXFP4 products over the same activations and routing (the
 * MoE's w1 and w3): out as di_cuda_gemm_mxfp4_grouped gives for (w,
 * w_scale), out_b for (w_b, w_scale_b), bit for bit; one launch where the
 * decode form's tensor-core kernel takes both, which saves a launch's
 * start and tail at small batches. */
di_status di_cuda_gemm_mxfp4_grouped_pair(const uint8_t *qa, const float *sa, int64_t k,
                                          const uint8_t *w, const uint8_t *w_scale,
                                          const uint8_t *w_b, const uint8_t *w_scale_b, int64_t n,
                                          const int32_t *ids, const int32_t *off, int32_t ngroups,
                                          const int32_t *rows, int32_t max_rows, void *out,
                                          void *out_b, di_dtype out_dtype, void *stream,
                                          di_err *err);

/* ------------------------------------------------------- backend op table */

/* The op table of backend/backend.h on CUDA device `device`
 * (backend_cuda.c). Buffers from its alloc are device memory; host arrays
 * of metadata (positions, ids, row-pointer tables, blocks) are uploaded per
 * call, small integer results (top-k, routing, candidate blocks) downloaded.
 * Weights arrive as host pointers into the checkpoint mapping: each weight
 * tensor is uploaded once, in its checkpoint format, on first use, and kept
 * keyed by its host address and size (see di_backend_cuda_weights_drop);
 * Engram tables stay on the host and only the rows a call needs are moved.
 * Destroy it with di_backend_destroy. Fails with the device's error when no
 * device is visible. */
typedef struct di_backend di_backend;
di_status di_backend_cuda_create(int device, di_backend **out, di_err *err);
/* Ops cannot report failure: the first error of any op since creation is
 * kept (after a device synchronization, so faults of earlier launches show
 * up) and returned here; DI_OK when all went well. */
di_status di_backend_cuda_status(di_backend *be, di_err *err);
/* Frees the device copies of weights. Call it when host memory that was
 * passed as a weight is freed or rewritten (a later tensor at the same
 * address would otherwise reuse the stale copy). */
void di_backend_cuda_weights_drop(di_backend *be);
/* Bytes of weights held on the device. */
size_t di_backend_cuda_weights_bytes(const di_backend *be);
/* hc_mix calls run on the backend's second stream since creation (none
 * with DI_CUDA_HC_SIDE=0, in profile and batch-invariant modes, while a
 * step is recorded, past a few rows). */
long di_backend_cuda_side_count(const di_backend *be);
/* Profile mode (on from creation with DI_CUDA_PROFILE=1 in the environment,
 * or from di_backend_cuda_profile_start(be, 1), which also clears the
 * table): every op waits for the device on entry and the time until the
 * next op's entry is charged to it. di_backend_cuda_profile writes the
 * table of time per op and the counts of buffer allocations and copies
 * since the start, like snprintf (returns the length it needed). */
size_t di_backend_cuda_profile(di_backend *be, char *buf, size_t cap);
void di_backend_cuda_profile_start(di_backend *be, int on);
/* With DI_CUDA_PROFILE=events in the environment, di_backend_cuda_profile_start
 * switches on the event form instead: every op records a CUDA event on
 * entry without waiting (the stream runs as it would unprofiled), and the
 * device time between one op's event and the next is charged to the first
 * (launch gaps included), read back by di_backend_cuda_profile. */

/* ------------------------------------------------------------ batch invariance */

/* Kernel choice on the calling thread: on, no kernel is chosen by the
 * number of rows (m, a group's rows, the groups), so a row's result is the
 * same bits in any batch (the backend's set_batch_invariant op sets it as
 * each of its ops begins). */
void di_cuda_set_batch_invariant(int on);

/* ------------------------------------------------------------ measuring aids */

/* cudaProfilerStart / Stop: the range a profiler started with its capture
 * off records (one step of a benchmark). */
void di_cuda_profiler_range(int on);
/* Launches an empty kernel of `tag` blocks: a mark in a per-kernel profile. */
void di_cuda_mark(int tag);
/* Up to `cap` CUDA events recorded in stream order without waiting: mark
 * returns the event's index (-1 when full or on failure); read waits for
 * the last one and fills ms[i] = time from event i to event i + 1. */
typedef struct di_cuda_timeline di_cuda_timeline;
di_status di_cuda_timeline_create(di_cuda_timeline **out, int cap, di_err *err);
void di_cuda_timeline_reset(di_cuda_timeline *t);
int di_cuda_timeline_mark(di_cuda_timeline *t);
di_status di_cuda_timeline_read(di_cuda_timeline *t, float *ms, di_err *err);
void di_cuda_timeline_free(di_cuda_timeline *t);

#ifdef __cplusplus
}
#endif

#endif
