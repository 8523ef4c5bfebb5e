/* The Hopper warpgroup product of the FP8 GEMMs (not a public header): one
 * wgmma step of a 64 x 128 result over one 32-block of k, and the
 * promotion of such a block sum into fp32 accumulators (cuda_gemm_tiled.cu,
 * cuda_gemm_grouped_wg.cu). Result layout of a step, per thread (lane l, g =
 * l / 4, t = l % 4, warp w of the warpgroup): p[4i], p[4i+1] are row 16w + g,
 * columns 8i + 2t and 8i + 2t + 1; p[4i+2], p[4i+3] the same columns of row
 * 16w + g + 8. */
#ifndef DI_BACKEND_CUDA_WGMMA_CUH
#define DI_BACKEND_CUDA_WGMMA_CUH

#include <stdint.h>

/* Tells the compiler the registers change here (the tensor core writes them
 * asynchronously between issue and wait). */
__device__ __forceinline__ void fence_regs(float d[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) asm volatile("" : "+f"(d[i])::"memory");
}

__device__ __forceinline__ void wgmma_m64n128k32(float d[64], uint64_t da, uint64_t db,
                                                 int accumulate = 0) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31,"
        "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47,"
        "%48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]),
          "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]),
          "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
          "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]),
          "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
        : "l"(da), "l"(db), "r"(accumulate));
}

/* acc += p * f: rows r0 (p[4i], p[4i+1], factor f0) and r0+8 (p[4i+2],
 * p[4i+3], f1) of a 64 x 128 result; column block 32 changes every 4 i. */
__device__ __forceinline__ void fma_rows(float acc[64], const float p[64], const float f0[4],
                                         const float f1[4]) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        acc[4 * i + 0] = fmaf(p[4 * i + 0], f0[i / 4], acc[4 * i + 0]);
        acc[4 * i + 1] = fmaf(p[4 * i + 1], f0[i / 4], acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(p[4 * i + 2], f1[i / 4], acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(p[4 * i + 3], f1[i / 4], acc[4 * i + 3]);
    }
}

/* One step into p from a zero start, issued and waited for: the form with a
 * single result set, where the other math warpgroup keeps the tensor cores
 * busy meanwhile. */
__device__ __forceinline__ void wg_step_waited(float p[64], uint64_t da, uint64_t db) {
    fence_regs(p);
    wg_fence();
    wgmma_m64n128k32(p, da, db);
    wg_commit();
    wg_wait<0>();
    fence_regs(p);
}

/* The four k32 steps of a stage with two result sets: step j goes to set
 * j % 2, so one set's wgmma runs while the other is promoted (the pipeline
 * drains at the end of each stage: keeping a wgmma in flight across a
 * stage loop's back edge made the compiler spill and serialize the
 * wgmmas). desc_a(j), desc_b(j): step j's descriptors; scales(j): what
 * step j's promotion reads from the stage; promote(p, sc) adds a step's
 * block sums into the accumulators; release() runs once every wgmma
 * reading the stage is complete (it hands the stage back), after the last
 * step's scales are read and before its promotion. */
template <class DescA, class DescB, class Scales, class Promote, class Release>
__device__ __forceinline__ void wg_stage_two_sets(float p0[64], float p1[64], DescA desc_a, DescB desc_b,
                                                  Scales scales, Promote promote, Release release) {
    /* issue step ji into set pi, then promote step jp from set pp once all
     * but the newest wgmma are done */
    auto issue_promote = [&](float *pi, int ji, float *pp, int jp) {
        fence_regs(pi);
        wg_fence();
        wgmma_m64n128k32(pi, desc_a(ji), desc_b(ji));
        wg_commit();
        wg_wait<1>();
        fence_regs(pp);
        promote(pp, scales(jp));
    };
    fence_regs(p0);
    wg_fence();
    wgmma_m64n128k32(p0, desc_a(0), desc_b(0));
    wg_commit();
    issue_promote(p1, 1, p0, 0);
    issue_promote(p0, 2, p1, 1);
    issue_promote(p1, 3, p0, 2);
    const auto last = scales(3);
    wg_wait<0>();
    release();
    fence_regs(p1);
    promote(p1, last);
}

#endif
