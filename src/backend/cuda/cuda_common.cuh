/* Helpers shared by the CUDA backend's translation units (not a public
 * header): error conversion, E8M0 decoding, bf16 output, and the launchers
 * each kernel file provides to the dispatch in cuda_gemm.cu. */
#ifndef DI_BACKEND_CUDA_COMMON_CUH
#define DI_BACKEND_CUDA_COMMON_CUH

#include <cuda_runtime.h>
#include <limits.h>
#include <stdlib.h>
#include <stdint.h>

#include "backend/cuda/cuda_backend.h"

/* Turns a CUDA error into a di_status with the operation named. */
static inline di_status cuda_check(cudaError_t e, di_err *err, const char *what) {
    if (e == cudaSuccess) return DI_OK;
    return di_err_set(err, DI_ERR_BACKEND, "%s: %s (%s)", what, cudaGetErrorString(e),
                      cudaGetErrorName(e));
}

/* After a launch: a bad configuration shows up here, a fault in the kernel
 * only at the next synchronizing call. */
static inline di_status cuda_check_launch(di_err *err, const char *what) {
    return cuda_check(cudaGetLastError(), err, what);
}

/* Programmatic dependent launch (a kernel launched with
 * cudaLaunchAttributeProgrammaticStreamSerialization may start before the
 * kernel ahead of it in the stream ends): grid_dep_wait blocks until that
 * kernel has completed and its writes are visible, so everything a kernel
 * reads that an earlier kernel may write must come after it; before it, only
 * constants such as the model's weights. grid_dep_launch lets the next such
 * kernel start. Both are no-ops for a kernel launched without the attribute. */
__device__ __forceinline__ void grid_dep_wait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void grid_dep_launch() {
    asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

/* First statement of a kernel launched by cuda_launch_pdl: wait for the
 * kernel ahead (its writes visible; before this, a kernel may touch no
 * memory another kernel writes or reads), then let the next one be
 * scheduled. */
__device__ __forceinline__ void pdl_enter() {
    grid_dep_wait();
    grid_dep_launch();
}

/* L2 policy of a weight stream. At decode a product reads each weight
 * once and a layer streams ~290 MB through a 50 MB L2, so with the default
 * policy the weights push out what the next kernels need again: their own
 * code (each kernel runs once a layer; at batch 1 its instructions were
 * fetched cold every call, docs/gpu-notes.md run 95), the activations and
 * the caches. Copies of weights read once per launch take evict_first, so
 * that the weights make room for each other instead; where another block
 * of the launch reads the same weights again (a second token tile) they
 * keep the normal policy. A hint only: no value changes. Built with
 * -DDI_CUDA_L2_HINT=0 every weight copy takes the normal policy (a
 * measuring aid). */
#ifndef DI_CUDA_L2_HINT
#define DI_CUDA_L2_HINT 1
#endif
__device__ __forceinline__ uint64_t l2_weight_policy(bool once) {
    uint64_t p;
    if (DI_CUDA_L2_HINT && once)
        asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(p));
    else
        asm volatile("createpolicy.fractional.L2::evict_normal.b64 %0, 1.0;\n" : "=l"(p));
    return p;
}

/* Whether the decode step's small kernels are launched programmatically
 * (cuda_device.cu: DI_CUDA_PDL=0 turns it off, a measuring aid; a runtime
 * that refuses the attribute turns it off for good). */
extern "C" int cuda_pdl_on(void);
extern "C" void cuda_pdl_refused(void);

/* Batch-invariant mode of the calling thread (cuda_device.cu; the backend
 * sets it from its own setting as each op begins). On, every kernel choice
 * that the number of rows would otherwise make is made by the other
 * shapes alone (docs/engine.md, "Batch invariance"). */
extern "C" int cuda_batch_invariant(void);

/* Launches kern with programmatic stream serialization: its blocks may be
 * scheduled while the kernel ahead of it finishes (that kernel's own
 * blocks all running or done), so they wait resident instead of being
 * launched when it ends: what each of the ~300 small launches of a decode
 * step pays between kernels (b1 run 7: 0.66 µs a boundary). The kernel must
 * begin with pdl_enter(). Where the attributed launch fails and the plain
 * one succeeds, the attribute is dropped from then on; a launch error
 * stays for cuda_check_launch, as with <<<>>>. */
template <typename... P, typename... A>
static inline void cuda_launch_pdl(void (*kern)(P...), dim3 grid, dim3 block, size_t smem, cudaStream_t st,
                                   A... args) {
    if (cuda_pdl_on()) {
        cudaLaunchConfig_t cfg = {};
        cudaLaunchAttribute at[1];
        cfg.gridDim = grid;
        cfg.blockDim = block;
        cfg.dynamicSmemBytes = smem;
        cfg.stream = st;
        at[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        at[0].val.programmaticStreamSerializationAllowed = 1;
        cfg.attrs = at;
        cfg.numAttrs = 1;
        if (cudaLaunchKernelEx(&cfg, kern, args...) == cudaSuccess) return;
        (void)cudaGetLastError();
        kern<<<grid, block, smem, st>>>(args...);
        if (cudaPeekAtLastError() == cudaSuccess) cuda_pdl_refused();
        return;
    }
    kern<<<grid, block, smem, st>>>(args...);
}

/* An attribute of the current device, `fallback` if it cannot be read. */
static inline int cuda_device_attr(cudaDeviceAttr attr, int fallback) {
    int dev = 0, v = 0;
    const bool ok = cudaGetDevice(&dev) == cudaSuccess && cudaDeviceGetAttribute(&v, attr, dev) == cudaSuccess &&
                    v > 0;
    (void)cudaGetLastError();
    return ok ? v : fallback;
}

/* Multiprocessors of the current device (132 if it cannot be read), read
 * once per translation unit: launch shapes follow it. */
static inline int cuda_sm_count(void) {
    static int sms = 0;
    if (sms == 0) sms = cuda_device_attr(cudaDevAttrMultiProcessorCount, 132);
    return sms;
}

/* Shared memory an SM holds, bytes (228 KB, Hopper's, if it cannot be
 * read), read once per translation unit. */
static inline size_t cuda_sm_smem(void) {
    static size_t v = 0;
    if (v == 0) v = (size_t)cuda_device_attr(cudaDevAttrMaxSharedMemoryPerMultiprocessor, 228 * 1024);
    return v;
}

/* A measuring switch: on unless the environment variable is "0", read
 * once into *cache (-1 until then). */
static inline int cuda_env_switch(const char *name, int *cache) {
    if (*cache < 0) {
        const char *v = getenv(name);
        *cache = !(v && v[0] == '0');
    }
    return *cache;
}

/* A measuring aid's number: the environment variable's value as strtol
 * reads it (0 for text that is no number), dflt where it is unset or
 * empty; read once into *cache (LONG_MIN until then). */
static inline long cuda_env_long(const char *name, long dflt, long *cache) {
    if (*cache == LONG_MIN) {
        const char *v = getenv(name);
        *cache = v && *v ? strtol(v, NULL, 10) : dflt;
    }
    return *cache;
}

/* E8M0 byte -> fp32 power of two 2^(b-127); 0xFF is NaN. Built from bits
 * with selects, no branches (it sits in the kernels' inner loops): b = 0 is
 * the one subnormal (2^-127). */
__device__ __forceinline__ float e8m0_to_f32(uint32_t b) {
    uint32_t v = b << 23;
    v = b == 0 ? 0x00400000u : v;
    v = b == 0xffu ? 0x7fc00000u : v;
    return __uint_as_float(v);
}

/* fp32 -> bf16 bits, round to nearest even (NaN stays a quiet NaN), the same
 * rule as di_f32_to_bf16. */
__device__ __forceinline__ uint16_t f32_to_bf16_bits(float f) {
    uint32_t u = __float_as_uint(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* Output modes of the product kernels (their out_bf16 argument): 0 f32,
 * 1 bf16, OUT_F32_BF16 f32 holding the bf16-rounded value (the backend's
 * matmul with DI_MM_OUT_BF16 on a decode product: the rounding pass that
 * followed it as a kernel of its own, done in the store). */
enum { OUT_F32_BF16 = 2 };

/* One output in mode `mode` at out[o]. */
__device__ __forceinline__ void store_out1(void *out, int mode, int64_t o, float v) {
    if (mode == 1) ((uint16_t *)out)[o] = f32_to_bf16_bits(v);
    else ((float *)out)[o] = mode == OUT_F32_BF16 ? __uint_as_float((uint32_t)f32_to_bf16_bits(v) << 16) : v;
}

/* Stores a pair of adjacent outputs (col, col+1) of row `row`, either of
 * which may lie past n. */
__device__ __forceinline__ void store_out2(void *out, int out_bf16, int64_t n, int64_t row,
                                           int64_t col, float v0, float v1) {
    int64_t idx = row * n + col;
    if (out_bf16 == OUT_F32_BF16) {
        v0 = __uint_as_float((uint32_t)f32_to_bf16_bits(v0) << 16);
        v1 = __uint_as_float((uint32_t)f32_to_bf16_bits(v1) << 16);
    }
    if (out_bf16 == 1) {
        uint16_t *o = (uint16_t *)out;
        if (col < n) o[idx] = f32_to_bf16_bits(v0);
        if (col + 1 < n) o[idx + 1] = f32_to_bf16_bits(v1);
    } else {
        float *o = (float *)out;
        if (col + 1 < n && (idx & 1) == 0) {
            *(float2 *)(o + idx) = make_float2(v0, v1);
        } else {
            if (col < n) o[idx] = v0;
            if (col + 1 < n) o[idx + 1] = v1;
        }
    }
}

/* Launchers (each in its kernel's file). Arguments are checked by the caller. */
di_status cuda_launch_matvec_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                 const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                 int out_bf16, cudaStream_t stream, di_err *err);
/* Batch-invariant mode's product of up to 16 rows where the tiles would
 * run: the wgmma matrix-vector kernel in one cluster rank, which gives the
 * tiles' bits (*done = 0 and nothing launched where it does not apply) */
di_status cuda_launch_matvec_fp8_tiles_bits(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                            const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                            int out_bf16, cudaStream_t stream, int *done, di_err *err);
/* the same from f32 activations x [m, k] quantized inside the kernel
 * (*done = 0 and nothing launched where that form does not apply) */
di_status cuda_launch_matvec_fp8_x(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                   const uint8_t *ws, int64_t n, void *out, int out_bf16,
                                   cudaStream_t stream, int *done, di_err *err);
/* two of them on the same x (w [n x k], w2 [n2 x k]) in one launch, the
 * bits of two with the pair's k split (cuda_matvec_pair_ks) */
di_status cuda_launch_matvec_fp8_x_pair(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                        const uint8_t *ws, const uint8_t *w2, const uint8_t *ws2, int64_t n,
                                        int64_t n2, void *out, void *out2, int out_bf16, cudaStream_t stream,
                                        int *done, di_err *err);
/* cuda_launch_matvec_fp8_x on x = swiglu(g, u; limit) (k_swiglu's values,
 * w = NULL) with out = bf16(add + the product as out_bf16 stores it)
 * (k_add_bf16's), out f32 [m, n]: the shared expert's tail in one launch,
 * the bits of the three kernels. *done = 0 and nothing launched where the
 * kernel does not apply. */
di_status cuda_launch_matvec_fp8_x_swiglu_add(const float *g, const float *u, float limit, const float *add,
                                              int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                                              float *out, int out_bf16, cudaStream_t stream, int *done, di_err *err);
di_status cuda_launch_matvec_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                   const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                   int out_bf16, cudaStream_t stream, di_err *err);
di_status cuda_launch_matvec_mxfp4_grouped(const uint8_t *qa, const float *sa, int64_t k,
                                           const uint8_t *w, const uint8_t *ws, int64_t n,
                                           const int32_t *ids, const int32_t *off,
                                           int32_t ngroups, const int32_t *rows,
                                           int32_t max_rows, void *out, int out_bf16,
                                           cudaStream_t stream, di_err *err);
/* two grouped products over the same activations and routing (out for w,
 * out_b for w_b), each bit for bit as cuda_launch_matvec_mxfp4_grouped
 * gives it: one launch where both take the decode form's tensor-core
 * kernel, else one after the other */
di_status cuda_launch_matvec_mxfp4_grouped_pair(const uint8_t *qa, const float *sa, int64_t k,
                                                const uint8_t *w, const uint8_t *ws, const uint8_t *w_b,
                                                const uint8_t *ws_b, int64_t n, const int32_t *ids,
                                                const int32_t *off, int32_t ngroups, const int32_t *rows,
                                                int32_t max_rows, void *out, void *out_b, int out_bf16,
                                                cudaStream_t stream, di_err *err);
/* The MoE's down product on its SwiGLU input (cuda_launch_fp4_dec_swiglu,
 * cuda_fp4_dec.h): launched, *done = 1, where cuda_launch_matvec_mxfp4_grouped
 * would run the decode form's tensor-core kernel on the quantized SwiGLU
 * (its bits, one launch fewer) and the pair before it (pair_k inputs) was
 * one wave (cuda_fp4_dec_swiglu_pays); else *done = 0 and nothing
 * launched. The kernel choice reads the alignment of g where the separate
 * launches read their quantized buffer's: both are scratch parts,
 * 256-byte aligned. */
di_status cuda_launch_matvec_mxfp4_grouped_swiglu(const float *g, const float *u, const float *pw, int in_bf16,
                                                  float limit, int64_t pair_k, int64_t k, const uint8_t *w,
                                                  const uint8_t *ws, int64_t n, const int32_t *ids, const int32_t *off,
                                                  int32_t ngroups, const int32_t *rows, int32_t max_rows, void *out,
                                                  int out_bf16, cudaStream_t stream, int *done, di_err *err);
di_status cuda_launch_gemm_fp8_tiled(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                     const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                     int out_bf16, cudaStream_t stream, di_err *err);

#endif
