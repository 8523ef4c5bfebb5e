/* Prefill FP8 GEMM on Hopper tensor cores (wgmma), in the checkpoint's block
 * format (architecture.md §2 "FP8 linear"; performance.md §1.3, §2.2).
 *
 * out[m, n] = sum_b sa[m, b] * sw[n/32, b] * (qa[m, b-block] . w[n, b-block])
 *
 * Tile 128 x 128 x 128 per block of two math warpgroups (64 rows each). One
 * wgmma m64n128k32 covers exactly one 32-block of k, so every result is
 * promoted into fp32 accumulators with its own scales right away (DeepGEMM
 * promotes per 128; the checkpoint's 32x32 scales force per 32). Two result
 * register sets alternate so that the promotion of step j could overlap the
 * tensor-core work of step j+1; measured, it does not (docs/gpu-notes.md,
 * run 17): on Hopper the promotion's FMAs add to the tensor time, which caps
 * this GEMM near half of torch's per-row FP8 GEMM on large shapes. The
 * promotion also bounds the FP8 adder's reduced precision: no partial sum
 * runs longer than 32 products.
 *
 * Two kernels: the default, warp-specialized one (gemm_fp8_ws_kernel: a
 * producer warpgroup feeds the tiles through the bulk tensor copy engine),
 * and the first one (gemm_fp8_tiled_kernel: all threads stage with cp.async
 * and a block barrier per stage; 0.6x the speed), kept for k beyond the
 * other's scale table (WS_MAX_K) and as the reference its results must equal
 * bit for bit.
 *
 * Needs k % 128 == 0 (whole 32-blocks per stage and 16-byte aligned scale
 * rows); m and n may be anything (rows past the end are zero-filled). */
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

/* NWG math warpgroups of 64 rows each: block tile (64 NWG) x 128 x 128 */
#define TG_BN 128
#define TG_BK 128
#define TG_GROUP_M 8
#define TG_B_BYTES (TG_BN * TG_BK)
#define TG_SW_BYTES 16
#define TG_ROWS(nwg) (64 * (nwg))
#define TG_SMEM(nwg, stages) ((stages) * (TG_ROWS(nwg) * TG_BK + TG_B_BYTES + TG_ROWS(nwg) * 16 + TG_SW_BYTES))

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void fence_regs32(float d[32]) {
#pragma unroll
    for (int i = 0; i < 32; i++) asm volatile("" : "+f"(d[i])::"memory");
}

/* Half-width step: 64 rows x 64 columns x one 32-block. */
__device__ __forceinline__ void wgmma_m64n64k32(float d[32], uint64_t da, uint64_t db) {
    asm volatile(
        "{\n"
        ".reg .pred p;\n"
        "setp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
        "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15,"
        "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1;\n"
        "}\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
          "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]),
          "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
          "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
        : "l"(da), "l"(db), "r"(0));
}

/* acc += p * scale for the column half h (columns 64h .. 64h+63) of a step. */
__device__ __forceinline__ void promote_half(float acc[64], const float p[32], const float *sa_st,
                                             const uint8_t *sw_st, int r0, int j, int h,
                                             int kb_per_stage) {
    float s0 = sa_st[r0 * kb_per_stage + j], s1 = sa_st[(r0 + 8) * kb_per_stage + j];
    float f0[2], f1[2];
#pragma unroll
    for (int b = 0; b < 2; b++) {
        float w = e8m0_to_f32(sw_st[(2 * h + b) * kb_per_stage + j]);
        f0[b] = s0 * w;
        f1[b] = s1 * w;
    }
#pragma unroll
    for (int i = 0; i < 8; i++) {
        const int a = 4 * (8 * h + i);
        acc[a + 0] = fmaf(p[4 * i + 0], f0[i / 4], acc[a + 0]);
        acc[a + 1] = fmaf(p[4 * i + 1], f0[i / 4], acc[a + 1]);
        acc[a + 2] = fmaf(p[4 * i + 2], f1[i / 4], acc[a + 2]);
        acc[a + 3] = fmaf(p[4 * i + 3], f1[i / 4], acc[a + 3]);
    }
}

/* acc += p * scale: rows r0 (p[4i], p[4i+1]) and r0+8 (p[4i+2], p[4i+3]) of
 * the warp's 16, columns 8i + 2t (+1); column block 32 changes every 4 i. */
__device__ __forceinline__ void promote(float acc[64], const float p[64], const float *sa_st,
                                        const uint8_t *sw_st, int r0, int j) {
    float s0 = sa_st[r0 * 4 + j], s1 = sa_st[(r0 + 8) * 4 + j];
    float f0[4], f1[4];
#pragma unroll
    for (int b = 0; b < 4; b++) {
        float w = e8m0_to_f32(sw_st[b * 4 + j]);
        f0[b] = s0 * w;
        f1[b] = s1 * w;
    }
    fma_rows(acc, p, f0, f1);
}

/* SWZ: shared-memory layout, 0 = 8x16-byte core matrices without swizzle,
 * 1 = 128-byte rows with the 128B swizzle (1.7x faster: the no-swizzle
 * layout stalls the copies and the tensor cores). MODE 0: two 64x128 result
 * sets alternate; MODE 2: four 64x64 sets in a ring (more tensor work in
 * flight per register); MODE 1 is a measuring aid: no promotion, one
 * accumulator over all of k (wrong numerics), timing everything else. */
template <int SWZ, int MODE, int NWG, int TG_STAGES>
__global__ void __launch_bounds__(NWG * 128, 1)
    gemm_fp8_tiled_kernel(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int m,
                          int k, const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws,
                          int n, void *__restrict__ out, int out_bf16, uint32_t lbo,
                          uint32_t sbo) {
    constexpr int TG_BM = 64 * NWG, TG_THREADS = 128 * NWG, TG_A_BYTES = TG_BM * TG_BK;
    extern __shared__ __align__(1024) uint8_t smem[];
    uint8_t *sA = smem;
    uint8_t *sB = sA + TG_STAGES * TG_A_BYTES;
    float *sSA = (float *)(sB + TG_STAGES * TG_B_BYTES);
    uint8_t *sSW = (uint8_t *)(sSA + TG_STAGES * TG_BM * 4);

    /* grouped raster: a wave of blocks covers TG_GROUP_M row tiles x many
     * column tiles, so both operands stay in L2 while they are reused */
    const int tiles_m = (m + TG_BM - 1) / TG_BM, tiles_n = (n + TG_BN - 1) / TG_BN;
    const int pid = blockIdx.x, per_group = TG_GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * TG_GROUP_M;
    const int gm = min(tiles_m - first_m, TG_GROUP_M);
    const int tm = first_m + (pid % per_group) % gm, tn = (pid % per_group) / gm;
    const int m0 = tm * TG_BM, n0 = tn * TG_BN;

    const int tid = threadIdx.x;
    const int kbn = k / 32, kt_n = k / TG_BK;
    const int nbn = (n + 31) / 32;

    /* chunk q of a 128x128 tile: row (q>>6)*8 + (q&7), 16-byte column (q>>3)&7,
     * stored at q*16, which is the core-matrix layout and conflict-free */
    auto load_stage = [&](int st, int kt) {
        const uint32_t a_st = smem_u32(sA + st * TG_A_BYTES), b_st = smem_u32(sB + st * TG_B_BYTES);
        /* SWZ 1: row q/8, chunk q%8 at (chunk ^ row%8) in a 128-byte row */
#pragma unroll
        for (int i = 0; i < TG_BM * 8 / TG_THREADS; i++) {
            int q = tid + i * TG_THREADS;
            int r = SWZ ? q >> 3 : (q >> 6) * 8 + (q & 7), c = SWZ ? q & 7 : (q >> 3) & 7;
            uint32_t so = SWZ ? r * 128 + ((c ^ (r & 7)) << 4) : q * 16;
            int ra = m0 + r;
            const uint8_t *ga = qa + (size_t)(ra < m ? ra : 0) * k + kt * TG_BK + c * 16;
            cp_async16(a_st + so, ga, ra < m);
        }
#pragma unroll
        for (int i = 0; i < (TG_BN * 8 + TG_THREADS - 1) / TG_THREADS; i++) {
            int q = tid + i * TG_THREADS;
            if (q >= TG_BN * 8) break;
            int r = SWZ ? q >> 3 : (q >> 6) * 8 + (q & 7), c = SWZ ? q & 7 : (q >> 3) & 7;
            uint32_t so = SWZ ? r * 128 + ((c ^ (r & 7)) << 4) : q * 16;
            int rb = n0 + r;
            const uint8_t *gb = w + (size_t)(rb < n ? rb : 0) * k + kt * TG_BK + c * 16;
            cp_async16(b_st + so, gb, rb < n);
        }
        if (tid < TG_BM) {
            int ra = m0 + tid;
            const float *g = sa + (size_t)(ra < m ? ra : 0) * kbn + kt * 4;
            cp_async16(smem_u32(sSA + st * TG_BM * 4 + tid * 4), g, ra < m);
        } else if (tid < TG_BM + 4) {
            int b = tid - TG_BM, nb = n0 / 32 + b;
            const uint8_t *g = ws + (size_t)(nb < nbn ? nb : 0) * kbn + kt * 4;
            cp_async4(smem_u32(sSW + st * TG_SW_BYTES + b * 4), g, nb < nbn);
        }
    };

    const int wg = tid >> 7, wi = (tid >> 5) & 3, lane = tid & 31;
    const int g = lane >> 2, t = lane & 3;
    const int r0 = wg * 64 + wi * 16 + g; /* tile row of p[4i], p[4i+1] */

    float acc[64], p0[64], p1[64];
    const int swz = SWZ;
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;

#pragma unroll
    for (int s = 0; s < TG_STAGES - 1; s++) {
        if (s < kt_n) load_stage(s, s);
        cp_async_commit();
    }

    for (int kt = 0; kt < kt_n; kt++) {
        cp_async_wait<TG_STAGES - 2>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        {
            int nk = kt + TG_STAGES - 1;
            if (nk < kt_n) load_stage(nk % TG_STAGES, nk);
            cp_async_commit();
        }
        const int st = kt % TG_STAGES;
        /* SWZ 0: 64 rows = 8 core-matrix rows of 1024 bytes, k32 step = 2 core
         * matrices (256 bytes); SWZ 1: 64 rows of 128 bytes, k32 step = 32
         * bytes inside the swizzled row */
        const uint32_t a_base = smem_u32(sA + st * TG_A_BYTES) + wg * 8 * 1024;
        const uint32_t b_base = smem_u32(sB + st * TG_B_BYTES);
        const float *sa_st = sSA + st * TG_BM * 4;
        const uint8_t *sw_st = sSW + st * TG_SW_BYTES;
#define DESC_A(j) make_desc(a_base + (j) * (swz ? 32 : 256), swz ? 16 : lbo, swz ? 1024 : sbo, swz)
#define DESC_B(j) make_desc(b_base + (j) * (swz ? 32 : 256), swz ? 16 : lbo, swz ? 1024 : sbo, swz)
        if (MODE == 1) {
            /* timing aid: accumulate straight into acc, no promotion */
            fence_regs(acc);
            wg_fence();
#pragma unroll
            for (int j = 0; j < 4; j++) wgmma_m64n128k32(acc, DESC_A(j), DESC_B(j), 1);
            wg_commit();
            wg_wait<0>();
            fence_regs(acc);
            continue;
        }
        if (MODE == 2) {
            /* four 64x64 result sets in a ring: half-step x = 2 j + h (k step
             * j, column half h) goes to set x % 4; three stay in flight while
             * the oldest is promoted */
            float q[4][32];
#pragma unroll
            for (int x = 0; x < 11; x++) {
                if (x >= 3) {
                    const int y = x - 3, pend = (x < 8 ? x : 8) - y - 1;
                    if (pend >= 2) wg_wait<2>();
                    else if (pend == 1) wg_wait<1>();
                    else wg_wait<0>();
                    fence_regs32(q[y % 4]);
                    promote_half(acc, q[y % 4], sa_st, sw_st, r0, y / 2, y % 2, 4);
                }
                if (x < 8) {
                    fence_regs32(q[x % 4]);
                    wg_fence();
                    wgmma_m64n64k32(q[x % 4], DESC_A(x / 2),
                                    make_desc(b_base + (x % 2) * 64 * 128 + (x / 2) * 32, 16, 1024, 1));
                    wg_commit();
                }
            }
            continue;
        }
        fence_regs(p0);
        fence_regs(p1);
        wg_fence();
        wgmma_m64n128k32(p0, DESC_A(0), DESC_B(0));
        wg_commit();
        wgmma_m64n128k32(p1, DESC_A(1), DESC_B(1));
        wg_commit();
        wg_wait<1>();
        fence_regs(p0);
        promote(acc, p0, sa_st, sw_st, r0, 0);
        fence_regs(p0);
        wg_fence();
        wgmma_m64n128k32(p0, DESC_A(2), DESC_B(2));
        wg_commit();
        wg_wait<1>();
        fence_regs(p1);
        promote(acc, p1, sa_st, sw_st, r0, 1);
        fence_regs(p1);
        wg_fence();
        wgmma_m64n128k32(p1, DESC_A(3), DESC_B(3));
        wg_commit();
        wg_wait<1>();
        fence_regs(p0);
        promote(acc, p0, sa_st, sw_st, r0, 2);
        wg_wait<0>();
        fence_regs(p1);
        promote(acc, p1, sa_st, sw_st, r0, 3);
#undef DESC_A
#undef DESC_B
    }

#pragma unroll
    for (int i = 0; i < 16; i++) {
        int col = n0 + 8 * i + 2 * t;
        int row = m0 + r0;
        if (row < m) store_out2(out, out_bf16, n, row, col, acc[4 * i], acc[4 * i + 1]);
        if (row + 8 < m) store_out2(out, out_bf16, n, row + 8, col, acc[4 * i + 2], acc[4 * i + 3]);
    }
}

/* ---- warp-specialized version: TMA producer, two math warpgroups ----
 *
 * The kernel above spends each stage's issue slots on cp.async address
 * arithmetic and a block-wide barrier, and the tensor cores wait on both
 * (docs/gpu-notes.md: 750 TFLOP/s without any promotion). Here one thread of
 * a third warpgroup moves every tile with the bulk tensor copy engine
 * (cp.async.bulk.tensor, 128B swizzle written by the engine itself) into a
 * ring of WS_STAGES stages guarded by mbarriers (full: bytes landed; empty:
 * both math warpgroups are done reading), and gives its registers to the
 * math warpgroups (setmaxnreg), which then issue nothing but wgmma, the
 * promotion FFMAs and a few shared loads:
 * - the weight scales of the block's four 32-column blocks are decoded to
 *   fp32 once per block into a [kbn][4] table (16 bytes per 32-block, one
 *   broadcast load per step);
 * - the activation scales of a stage arrive with its tiles (a 128 x 4 f32
 *   box) and each thread keeps its two rows' four values in registers;
 * - the wgmma stream runs across stage boundaries: step (kt+1, 0) is issued
 *   before the last step of stage kt is promoted, so the tensor cores always
 *   hold the other result set's work while one is promoted.
 * Results are bit-identical to the kernel above (same block sums, same
 * promotion order). Needs k % 128 == 0 and the 16-byte aligned operands the
 * tensor maps require; the scale table bounds k (WS_MAX_K). */
#define WS_THREADS 384 /* two math warpgroups + one producer warpgroup */
#define WS_STAGE_BYTES (2 * TG_B_BYTES + 128 * 16) /* A, B, activation scales */
#define WS_MAX_K 32768
/* 2 x 128 x 240 + 128 x 24 <= 65536 */
#define WS_MATH_REGS 240
#define WS_PRODUCER_REGS 24
#define WS_SMEM(st, kbn) (1024 + (st) * WS_STAGE_BYTES + 2 * (st) * 8 + (kbn) * 16)


/* acc += p * sa * sw for one k step: the thread's rows r0 (sa0) and r0+8
 * (sa1), the four column blocks' weight scales w. */
__device__ __forceinline__ void promote_ws(float acc[64], const float p[64], float sa0, float sa1,
                                           float4 w) {
    const float f0[4] = {sa0 * w.x, sa0 * w.y, sa0 * w.z, sa0 * w.w};
    const float f1[4] = {sa1 * w.x, sa1 * w.y, sa1 * w.z, sa1 * w.w};
    fma_rows(acc, p, f0, f1);
}

/* what a step's promotion reads: its rows' activation scales (from the
 * stage) and its 32-block (the weight scales' table is the block's own) */
struct WsScales {
    float a0, a1;
    int j;
};

/* Pair (col, col+1) of row `row`: one 4-byte (bf16) or 8-byte (f32) store
 * when both are inside and aligned. */
__device__ __forceinline__ void store_pair(void *out, int out_bf16, int n, int row, int col,
                                           float v0, float v1) {
    const int64_t idx = (int64_t)row * n + col;
    if (out_bf16 && col + 1 < n && (idx & 1) == 0) {
        const uint32_t b = (uint32_t)f32_to_bf16_bits(v0) | (uint32_t)f32_to_bf16_bits(v1) << 16;
        *(uint32_t *)((uint16_t *)out + idx) = b;
    } else {
        store_out2(out, out_bf16, n, row, col, v0, v1);
    }
}

/* MODE 0: the real kernel; measuring aids (wrong numerics): MODE 1 without
 * the promotion (one accumulator over all of k), MODE 2 the same plus as many
 * FFMAs as the promotion has, independent of the products, issued while the
 * wgmmas run (can the FMA pipes work under the tensor cores?), MODE 3 with
 * half as many. SETS: result
 * register sets per math warpgroup (see the loops). */
template <int ST, int MODE, int SETS>
__global__ void __launch_bounds__(WS_THREADS, 1)
    gemm_fp8_ws_kernel(const __grid_constant__ CUtensorMap map_a,
                       const __grid_constant__ CUtensorMap map_b,
                       const __grid_constant__ CUtensorMap map_sa, int m, int k,
                       const uint8_t *__restrict__ ws, int n, void *__restrict__ out,
                       int out_bf16) {
    extern __shared__ uint8_t ws_smem_raw[];
    /* the 128B swizzle repeats every 1024 bytes: tiles start on that boundary */
    const uint32_t raw = smem_u32(ws_smem_raw), base = (raw + 1023u) & ~1023u;
    uint8_t *smem = ws_smem_raw + (base - raw);
    const uint32_t s_a = base, s_b = base + ST * TG_B_BYTES, s_sa = base + 2 * ST * TG_B_BYTES;
    const uint32_t s_full = base + ST * WS_STAGE_BYTES, s_empty = s_full + ST * 8;
    const float *sa_tab = (const float *)(smem + 2 * ST * TG_B_BYTES);
    float *sw_tab = (float *)(smem + ST * WS_STAGE_BYTES + 2 * ST * 8);

    const int tiles_m = (m + 127) / 128, tiles_n = (n + TG_BN - 1) / TG_BN;
    const int pid = blockIdx.x, per_group = TG_GROUP_M * tiles_n;
    const int first_m = (pid / per_group) * TG_GROUP_M;
    const int gm = min(tiles_m - first_m, TG_GROUP_M);
    const int m0 = (first_m + (pid % per_group) % gm) * 128, n0 = ((pid % per_group) / gm) * TG_BN;
    const int kbn = k / 32, kt_n = k / TG_BK, nbn = (n + 31) / 32;
    const int tid = threadIdx.x;

    /* weight scales of the block's column blocks, [kbn][4], decoded once */
    for (int i = tid; i < kbn * 4; i += WS_THREADS) {
        const int nb = n0 / 32 + (i & 3);
        sw_tab[i] = nb < nbn ? e8m0_to_f32(__ldg(ws + (size_t)nb * kbn + (i >> 2))) : 0.0f;
    }
    if (tid == 0) {
        for (int s = 0; s < ST; s++) {
            mbar_init(s_full + 8 * s, 1);
            mbar_init(s_empty + 8 * s, 8); /* one arrival per math warp */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    __syncthreads();

    const int wg = tid >> 7;
    if (wg == 2) {
        /* producer warpgroup: one thread issues every copy; the others give
         * their registers to the math warpgroups */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(WS_PRODUCER_REGS));
        if (tid == 256) {
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&map_a) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&map_b) : "memory");
            asm volatile("prefetch.tensormap [%0];\n" ::"l"((uint64_t)&map_sa) : "memory");
            for (int kt = 0; kt < kt_n; kt++) {
                const int s = kt % ST;
                if (kt >= ST) mbar_wait(s_empty + 8 * s, ((kt / ST) & 1) ^ 1);
                const uint32_t full = s_full + 8 * s;
                mbar_arrive_expect_tx(full, WS_STAGE_BYTES);
                tma_load_2d(s_a + s * TG_B_BYTES, &map_a, kt * TG_BK, m0, full);
                tma_load_2d(s_b + s * TG_B_BYTES, &map_b, kt * TG_BK, n0, full);
                tma_load_2d(s_sa + s * 2048, &map_sa, kt * 4, m0, full);
            }
        }
        return;
    }

    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(WS_MATH_REGS));
    const int wi = (tid >> 5) & 3, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int r0 = wg * 64 + wi * 16 + g; /* tile row of p[4i], p[4i+1] */
    float acc[64], p0[64], p1[64];
#pragma unroll
    for (int i = 0; i < 64; i++) acc[i] = 0.0f;
    /* descriptors: one base each, the stage and step only move the start
     * address field (16-byte units, no carry out of its 14 bits) */
    const uint64_t desc_a = make_desc(s_a + wg * 64 * 128, 16, 1024, 1);
    const uint64_t desc_b = make_desc(s_b, 16, 1024, 1);
#define WS_DESC_A(s, j) (desc_a + (uint64_t)(((s) * TG_B_BYTES + (j) * 32) >> 4))
#define WS_DESC_B(s, j) (desc_b + (uint64_t)(((s) * TG_B_BYTES + (j) * 32) >> 4))

    /* this thread's rows' activation scale for step j of stage s */
    auto sa_of = [&](int s, int j, int row) { return sa_tab[s * 512 + row * 4 + j]; };
    if (MODE == 1 || MODE == 2 || MODE == 3) {
        if (MODE >= 2)
#pragma unroll
            for (int i = 0; i < 64; i++) p0[i] = p1[i] = 1e-3f * (float)(i + tid);
        for (int kt = 0; kt < kt_n; kt++) {
            const int s = kt % ST;
            mbar_wait(s_full + 8 * s, (kt / ST) & 1);
            fence_regs(acc);
            wg_fence();
#pragma unroll
            for (int j = 0; j < 4; j++) wgmma_m64n128k32(acc, WS_DESC_A(s, j), WS_DESC_B(s, j), 1);
            wg_commit();
            if (MODE >= 2) {
                fence_regs(p0);
#pragma unroll
                for (int r = 0; r < (MODE == 2 ? 4 : 2); r++)
#pragma unroll
                    for (int i = 0; i < 64; i++) p0[i] = fmaf(p0[i], 0.999f, p1[i]);
                fence_regs(p0);
            }
            wg_wait<0>();
            fence_regs(acc);
            __syncwarp();
            if (lane == 0) mbar_arrive(s_empty + 8 * s);
        }
        if (MODE >= 2)
#pragma unroll
            for (int i = 0; i < 64; i++) acc[i] += p0[i];
    } else if (SETS == 1) {
        /* one result set: each step waits for its product and promotes it;
         * the other warpgroup's wgmma keeps the tensor cores busy meanwhile */
        for (int kt = 0; kt < kt_n; kt++) {
            const int s = kt % ST;
            mbar_wait(s_full + 8 * s, (kt / ST) & 1);
            const float4 *wt = (const float4 *)(sw_tab + kt * 16);
#pragma unroll
            for (int j = 0; j < 4; j++) {
                wg_step_waited(p0, WS_DESC_A(s, j), WS_DESC_B(s, j));
                const float s0 = sa_of(s, j, r0), s1 = sa_of(s, j, r0 + 8);
                if (j == 3) {
                    __syncwarp();
                    if (lane == 0) mbar_arrive(s_empty + 8 * s);
                }
                promote_ws(acc, p0, s0, s1, wt[j]);
            }
        }
    } else {
        /* two result sets (wg_stage_two_sets) */
        for (int kt = 0; kt < kt_n; kt++) {
            const int s = kt % ST;
            mbar_wait(s_full + 8 * s, (kt / ST) & 1);
            const float4 *wt = (const float4 *)(sw_tab + kt * 16);
            wg_stage_two_sets(
                p0, p1, [&](int j) { return WS_DESC_A(s, j); }, [&](int j) { return WS_DESC_B(s, j); },
                [&](int j) { return WsScales{sa_of(s, j, r0), sa_of(s, j, r0 + 8), j}; },
                [&](const float *p, WsScales sc) { promote_ws(acc, p, sc.a0, sc.a1, wt[sc.j]); },
                [&]() {
                    /* every wgmma reading stage s is complete: hand it back */
                    __syncwarp();
                    if (lane == 0) mbar_arrive(s_empty + 8 * s);
                });
        }
    }
#undef WS_DESC_A
#undef WS_DESC_B

#pragma unroll
    for (int i = 0; i < 16; i++) {
        const int col = n0 + 8 * i + 2 * t, row = m0 + r0;
        if (row < m) store_pair(out, out_bf16, n, row, col, acc[4 * i], acc[4 * i + 1]);
        if (row + 8 < m) store_pair(out, out_bf16, n, row + 8, col, acc[4 * i + 2], acc[4 * i + 3]);
    }
}


template <int ST, int MODE, int SETS>
static cudaError_t launch_ws(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                             const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                             int out_bf16, cudaStream_t stream, bool *ran) {
    *ran = false;
    if (k > WS_MAX_K) return cudaSuccess;
    CUtensorMap ma, mb, ms;
    if (!make_map(&ma, qa, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, m, k, TG_BK, 128, true) ||
        !make_map(&mb, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, TG_BK, TG_BN, true) ||
        !make_map(&ms, sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, m, k / 32, 4, 128, false))
        return cudaSuccess;
    auto *kern = gemm_fp8_ws_kernel<ST, MODE, SETS>;
    const int smem = WS_SMEM(ST, (int)(k / 32));
    static int attr = 0; /* dynamic shared memory granted so far */
    if (attr < smem) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             WS_SMEM(ST, WS_MAX_K / 32));
        if (e != cudaSuccess) return e;
        attr = WS_SMEM(ST, WS_MAX_K / 32);
    }
    const int64_t blocks = ((m + 127) / 128) * ((n + TG_BN - 1) / TG_BN);
    kern<<<(unsigned)blocks, WS_THREADS, smem, stream>>>(ma, mb, ms, (int)m, (int)k, ws, (int)n,
                                                          out, out_bf16);
    *ran = true;
    return cudaGetLastError();
}

static int tiled_variant = 16;

di_status cuda_launch_gemm_fp8_tiled(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                     const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                     int out_bf16, cudaStream_t stream, di_err *err) {
    if (k % TG_BK != 0)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "gemm_fp8 (tiled): k = %lld is not a multiple of %d",
                          (long long)k, TG_BK);
    if ((uintptr_t)qa % 16 || (uintptr_t)w % 16 || (uintptr_t)sa % 16 || (uintptr_t)ws % 4)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "gemm_fp8 (tiled): operands are not 16-byte aligned");
    if (m > 0x7fffffffLL - 256 || n > 0x7fffffffLL - TG_BN || k > 0x7fffffffLL ||
        ((m + 127) / 128) * ((n + TG_BN - 1) / TG_BN) > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_fp8 (tiled): shape m=%lld n=%lld k=%lld too large",
                          (long long)m, (long long)n, (long long)k);
    uint32_t lbo = 128, sbo = 1024;
    cudaError_t e;
#define TG_CASE(S, M, ST)                                                                    \
    case S * 8 + M + (ST == 6 ? 32 : 0): {                                                   \
        static bool attr = false;                                                            \
        if (!attr) {                                                                         \
            e = cudaFuncSetAttribute(gemm_fp8_tiled_kernel<S, M, 2, ST>,                     \
                                     cudaFuncAttributeMaxDynamicSharedMemorySize,            \
                                     TG_SMEM(2, ST));                                        \
            if (e != cudaSuccess) break;                                                     \
            attr = true;                                                                     \
        }                                                                                    \
        int64_t blocks = ((m + TG_ROWS(2) - 1) / TG_ROWS(2)) * ((n + TG_BN - 1) / TG_BN);    \
        gemm_fp8_tiled_kernel<S, M, 2, ST><<<(unsigned)blocks, 256, TG_SMEM(2, ST), stream>>>( \
            qa, sa, (int)m, (int)k, w, ws, (int)n, out, out_bf16, lbo, sbo);                 \
        e = cudaGetLastError();                                                              \
        break;                                                                               \
    }
    int variant = tiled_variant;
    if (variant >= 16 && variant <= 21) {
        bool ran = false;
        switch (variant) {
        case 20: e = launch_ws<6, 2, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        case 21: e = launch_ws<6, 3, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        case 16: e = launch_ws<6, 0, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        case 17: e = launch_ws<6, 1, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        case 18: e = launch_ws<4, 0, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        default: e = launch_ws<6, 0, 1>(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &ran); break;
        }
        if (e != cudaSuccess || ran) return cuda_check(e, err, "gemm_fp8 (tiled) launch");
        variant = 8; /* k too large for the scale table, or no tensor-map encoder */
    }
    switch (variant) {
        TG_CASE(1, 0, 4) TG_CASE(1, 1, 4) TG_CASE(0, 0, 4) TG_CASE(1, 2, 4) TG_CASE(1, 0, 6)
        TG_CASE(1, 2, 6)
    default: e = cudaErrorInvalidValue;
    }
#undef TG_CASE
    return cuda_check(e, err, "gemm_fp8 (tiled) launch");
}

/* Measuring aid for bench/bench_cuda_ops.cu. 16 (the default): the
 * warp-specialized kernel, 6 stages; 17 the same without the promotion (wrong
 * results, timing only); 18 with 4 stages; 19 one result set per math
 * warpgroup; 20 and 21 time what the promotion's FFMAs cost (MODE 2 and 3
 * of the kernel, wrong results). The cp.async kernel: layout * 8 +
 * mode + 32 for 6 stages instead of 4; 8 (128B swizzle, two result sets), 10
 * the ring of four half-width sets, 9 without the promotion, 0 the
 * unswizzled layout. */
extern "C" void cuda_tiled_set_variant(int v) { tiled_variant = v < 0 ? 16 : v; }
