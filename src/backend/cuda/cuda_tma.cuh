/* Hopper building blocks shared by the tensor-core kernels (not a public
 * header): cp.async, shared-memory matrix descriptors and wgmma group
 * control, mbarrier waits, bulk tensor copies (cp.async.bulk.tensor) and the
 * host-side tensor maps they read. */
#ifndef DI_BACKEND_CUDA_TMA_CUH
#define DI_BACKEND_CUDA_TMA_CUH

#include <cuda.h> /* CUtensorMap (the encoder is fetched at run time) */
#include <cudaTypedefs.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* cp.async of 16 (through L2 only) or 4 bytes; an invalid source copies
 * zeros and reads nothing. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 4 : 0));
}

/* Shared-memory matrix descriptor: start address, the byte distance between
 * core matrices adjacent along k (LBO) and along m/n (SBO), and the layout
 * (0: no swizzle, 1: 128B swizzle, where SBO is the 8-row group stride). */
__device__ __forceinline__ uint64_t make_desc(uint32_t addr, uint32_t lbo, uint32_t sbo,
                                              int swz128) {
    return (uint64_t)((addr & 0x3ffffu) >> 4) | ((uint64_t)((lbo >> 4) & 0x3fffu) << 16) |
           ((uint64_t)((sbo >> 4) & 0x3fffu) << 32) | ((uint64_t)(swz128 ? 1 : 0) << 62);
}

__device__ __forceinline__ void wg_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wg_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N> __device__ __forceinline__ void wg_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count));
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
    uint32_t done;
    do {
        asm volatile(
            "{\n.reg .pred p;\n"
            "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(bar), "r"(parity)
            : "memory");
    } while (!done);
}

/* grid_dep_wait / grid_dep_launch: cuda_common.cuh */

/* 2-D tile (c0 = inner coordinate, c1 = row) into shared memory, completing
 * on the barrier with its byte count. */
__device__ __forceinline__ void tma_load_2d(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                            uint32_t bar) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes "
        "[%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar)
        : "memory");
}

/* the same with an L2 policy (l2_weight_policy) */
__device__ __forceinline__ void tma_load_2d_pol(uint32_t dst, const CUtensorMap *map, int c0, int c1,
                                                uint32_t bar, uint64_t pol) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint "
        "[%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(dst),
        "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(bar), "l"(pol)
        : "memory");
}

/* cuTensorMapEncodeTiled through the runtime (no link against the driver
 * library); NULL when the driver does not offer it. */
static inline PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder(void) {
    static PFN_cuTensorMapEncodeTiled_v12000 fn = NULL;
    static bool tried = false;
    if (!tried) {
        tried = true;
        void *p = NULL;
        cudaDriverEntryPointQueryResult q;
        if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault,
                                             &q) == cudaSuccess &&
            q == cudaDriverEntryPointSuccess)
            fn = (PFN_cuTensorMapEncodeTiled_v12000)p;
        (void)cudaGetLastError();
    }
    return fn;
}

/* rows x cols row-major matrix of `esize`-byte elements; box box_c x box_r,
 * written to shared memory with the swizzle `swz`. */
static inline bool make_map_swz(CUtensorMap *map, const void *p, CUtensorMapDataType type, int esize,
                                uint64_t rows, uint64_t cols, uint32_t box_c, uint32_t box_r,
                                CUtensorMapSwizzle swz) {
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    if (!enc) return false;
    const cuuint64_t dims[2] = {cols, rows}, strides[1] = {cols * (uint64_t)esize};
    const cuuint32_t box[2] = {box_c, box_r}, estr[2] = {1, 1};
    return enc(map, type, 2, (void *)p, dims, strides, box, estr, CU_TENSOR_MAP_INTERLEAVE_NONE, swz,
               CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

/* the same, with the 128B swizzle (swz) or none */
static inline bool make_map(CUtensorMap *map, const void *p, CUtensorMapDataType type, int esize,
                            uint64_t rows, uint64_t cols, uint32_t box_c, uint32_t box_r, bool swz) {
    return make_map_swz(map, p, type, esize, rows, cols, box_c, box_r,
                        swz ? CU_TENSOR_MAP_SWIZZLE_128B : CU_TENSOR_MAP_SWIZZLE_NONE);
}

#endif
