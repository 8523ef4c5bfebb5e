/* Grouped MXFP4 GEMM on Hopper's warpgroup tensor cores (wgmma): the MoE
 * experts at prefill (architecture.md §7; numerics §2 "FP4 expert linear":
 * FP8 activations with one f32 scale per 32 inputs, packed E2M1 weights
 * with one E8M0 scale per row and 32 inputs). The same product as
 * cuda_gemm_grouped.cu's mma.sync forms, in 128-row x 128-output tiles.
 *
 * Why: the mma.sync forms convert every weight code to f16 once per 64 rows
 * and run f16 steps (~115 TFLOP/s at an 8K-token prefill: half the layer's
 * time). Here the tensor cores take FP8 from shared memory, one m64n128k32
 * step per 32-block, as the dense FP8 GEMM (cuda_gemm_tiled.cu) does, and a
 * weight code is converted once per 128 rows, to one byte.
 *
 * Block: three warpgroups. Warpgroup 2 produces: it copies the stage's
 * activation rows (through the group's row table, so no gathered copy of
 * the activations is needed) with cp.async straight into the 128B-swizzled
 * layout the wgmma descriptors read, copies the packed weight codes and
 * their scale bytes into a staging area, and then converts the codes to
 * E4M3 bytes in the swizzled layout. Its copies run GW_LOOK stages ahead of
 * its conversion, in a ring of GW_ST stages guarded by mbarriers (full: the
 * 128 producer threads have written and fenced the stage; empty: the eight
 * math warps are done reading it). Warpgroups 0 and 1 take 64 rows each and
 * issue nothing but wgmma, the promotion and the stores.
 *
 * Scale folding. E2M1 magnitudes (0.5 .. 6) times 2^d are exact E4M3 bytes
 * for d in [-8, 6] (0.5 · 2^-8 is E4M3's smallest subnormal, 6 · 2^6 = 384
 * its largest binade's 1.5). A block of scale 2^e is converted with d = e +
 * GW_C, so every product of the stage carries the weight scale and 2^GW_C,
 * the tensor cores' block sum is d_block · s_w · 2^C exactly (all products
 * scaled by one power of two: the tensor cores' additions see the same
 * values up to that power), and the promotion multiplies by the activation
 * scale alone: fmaf(d · s_w · 2^C, s_a, acc · 2^C) = fmaf(d, s_a · s_w, acc)
 * · 2^C bit for bit; the epilogue takes the 2^C out (exact). A block with e
 * outside [-8 - C, 6 - C] (C = 3: scales 2^-11 .. 2^3; real expert scales
 * sit near 2^-7) is converted at d = 0, and the stage's flag makes both
 * math warpgroups promote the stage with a factor per column, from the
 * scale bytes (slower, the same arithmetic). A block of zero codes is zero
 * at any d and never sets the flag.
 *
 * Arithmetic against the other forms: per 32-block the same products and
 * the same ascending promotion; only the tensor cores' additions inside a
 * block differ (FP8 k32 steps here, f16 k16 pairs there), so the bits can
 * differ from cuda_gemm_grouped.cu's and both stay within kernels.h's bound
 * of the exact sum (test_grouped_many_rows).
 *
 * Measured (docs/gpu-notes.md, wg runs): 2x the mma.sync form at an 8K
 * prefill; the producer alone takes half of the kernel's time and the math
 * warpgroups alone a bit more, and the two barely overlap. */
#include <cuda_fp8.h>
#include <string.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_grouped.h"
#include "backend/cuda/cuda_group_tiles.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_wgmma.cuh"

enum {
    GW_BM = 128,      /* rows (token slots) per tile: 64 per math warpgroup */
    GW_BN = 128,      /* outputs per tile */
    GW_BK = 128,      /* inputs per stage: four 32-blocks */
    GW_ST = 5,        /* ring stages */
    GW_LOOK = 3,      /* stages the producer's copies run ahead of its conversion */
    GW_THREADS = 384, /* two math warpgroups + the producer warpgroup */
    GW_C = 3,         /* the fold's exponent offset (above) */
    /* one stage, byte offsets from its 1024-byte aligned start */
    GW_A = 0,         /* [128 rows][128] E4M3 activation codes, 128B swizzle */
    GW_B = 16384,     /* [128 outputs][128] E4M3 weight codes, 128B swizzle */
    GW_RAW = 32768,   /* [128 outputs][64] packed E2M1 codes as copied */
    GW_SA = 40960,    /* [128 rows][4] activation scales */
    GW_RSW = 43008,   /* [128 outputs][4] E8M0 scale bytes as copied */
    GW_FLAG = 43520,  /* four bytes: producer warp w's blocks kept a scale */
    GW_STAGE = 44032, /* 43 x 1024 */
    GW_MATH_REGS = 224,    /* registers a thread after the hand-over (setmaxnreg) */
    GW_PRODUCER_REGS = 56, /* 2 x 224 + 56 = 3 x 168 */
    GW_TAB = 128,     /* [15][8] E4M3 bytes: magnitude code c times 2^d, d = -8 .. 6 */
};
/* alignment slack, the ring, its barriers (full, empty, weights landed), the
 * tables, the group scan */
#define GW_SMEM (1024 + GW_ST * GW_STAGE + 24 * GW_ST + GW_TAB + 4 * (CUDA_GG_MAX_GROUPS + 1) + 4 * 12)
static_assert(GW_SMEM <= 232448, "shared memory: 227 KB a block");
static_assert(2 * GW_MATH_REGS + GW_PRODUCER_REGS <= 3 * 168, "setmaxnreg: the block's registers");

/* eight E2M1 codes (a packed word, element 2i in byte i's low nibble) ->
 * eight E4M3 bytes in element order, through the table pair t (bytes 0 .. 7
 * = magnitude codes 0 .. 7 at the block's d): prmt looks up four magnitudes
 * an instruction (selector nibbles with bit 3 clear), the signs come over
 * from the codes' top bits */
__device__ __forceinline__ void gw_fp4x8(uint32_t v, uint2 t, uint32_t &o0, uint32_t &o1) {
    const uint32_t m = v & 0x77777777u;
    uint32_t m0, m1;
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(m0) : "r"(t.x), "r"(t.y), "r"(m));
    asm("prmt.b32 %0, %1, %2, %3;\n" : "=r"(m1) : "r"(t.x), "r"(t.y), "r"(m >> 16));
    /* (v << 4) has element 2i's sign at bit 7 of byte i, v element 2i+1's */
    const uint32_t s0 = __byte_perm(v << 4, v, 0x5140), s1 = __byte_perm(v << 4, v, 0x7362);
    o0 = m0 | (s0 & 0x80808080u);
    o1 = m1 | (s1 & 0x80808080u);
}

/* whether a block of scale byte e8 is folded (the producer's rule) */
__device__ __forceinline__ bool gw_folds(uint32_t e8) {
    const int d = (int)e8 - 127 + GW_C;
    return d >= -8 && d <= 6;
}

/* a flagged stage's factor for one block of a column: s_a for a folded
 * block, (s_a · s_w) · 2^C for one that kept its scale (codes at d = 0) */
__device__ __forceinline__ float gw_factor(float sa, uint32_t e8) {
    return gw_folds(e8) ? sa : sa * e8m0_to_f32(e8) * (float)(1 << GW_C);
}

/* acc += p · factor: a flagged stage's step j, the factors from the scale
 * bytes of its 128 columns (rsw, four a column) */
__device__ __forceinline__ void gw_promote_cols(float acc[64], const float p[64], float sa0, float sa1,
                                                const uint8_t *rsw, int j, int t) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        const uint32_t e0 = rsw[(8 * i + 2 * t) * 4 + j], e1 = rsw[(8 * i + 2 * t + 1) * 4 + j];
        const float a0 = gw_factor(sa0, e0), a1 = gw_factor(sa0, e1);
        const float b0 = gw_factor(sa1, e0), b1 = gw_factor(sa1, e1);
        acc[4 * i + 0] = fmaf(p[4 * i + 0], a0, acc[4 * i + 0]);
        acc[4 * i + 1] = fmaf(p[4 * i + 1], a1, acc[4 * i + 1]);
        acc[4 * i + 2] = fmaf(p[4 * i + 2], b0, acc[4 * i + 2]);
        acc[4 * i + 3] = fmaf(p[4 * i + 3], b1, acc[4 * i + 3]);
    }
}

/* acc += p · s_a (a folded step: one factor per row) */
__device__ __forceinline__ void gw_promote_rows(float acc[64], const float p[64], float sa0, float sa1) {
    const float f0[4] = {sa0, sa0, sa0, sa0}, f1[4] = {sa1, sa1, sa1, sa1};
    fma_rows(acc, p, f0, f1);
}

/* one tile of the work list: group z's rows s0 .. s0 + 127, outputs n0 ..
 * n0 + 127 of expert e; the group's rows start at out row base */
struct GwItem {
    int64_t base;
    int cnt, e, n0, s0;
};

/* F: GW_F_ROWS, each producer thread converts one weight row's four blocks
 * (one scale word, the staging rows swizzled so that eight threads' 16-byte
 * reads hit eight different bank groups) instead of four blocks of four
 * rows; measuring aids (wrong results): GW_F_NOCONV, the producer leaves the
 * conversion out; GW_F_NOPROMO, the math warpgroups accumulate every step
 * in the tensor cores' accumulator, no promotion; GW_F_NOA / GW_F_NORAW,
 * the producer leaves the activation / weight copies out; GW_F_NOMMA, the
 * math warpgroups only hand the stages back. GW_F_WARPARR: a producer warp
 * signals a converted stage with one arrival (after __syncwarp) instead of
 * one a thread. GW_F_TMAW (with GW_F_ROWS, n % 128 == 0): one producer
 * thread copies the stage's packed weight codes with the bulk tensor copy
 * engine (a 64-byte box row with the 64B swizzle, which is GW_F_ROWS's
 * staging layout), completing on a barrier of its own, so the producer
 * threads issue only the activation rows and the scales: w1 at an 8K
 * prefill 5.23 -> 4.95 ms, w2 5.48 -> 5.17 (tma run 1, docs/gpu-notes.md).
 * The default (CUDA_GW_VARIANT_DEFAULT) is GW_F_ROWS | GW_F_TMAW, without
 * GW_F_TMAW where whole output tiles do not allow it. In every variant the
 * producer computes its rows' source pointers (eight activation rows a
 * thread, its row's activation scales and weight scales) once an item and
 * adds the stage's offset: the 64-bit address arithmetic and row shuffles
 * it did every stage before were most of its instruction stream while the
 * math warpgroups waited for it ~40 % of their time (ncu run 3); w1 4.95 ->
 * 4.17 ms, w2 5.22 -> 4.54 (rowptr run 1, docs/gpu-notes.md). */
enum { GW_F_ROWS = 1, GW_F_NOCONV = 2, GW_F_NOPROMO = 4, GW_F_NOA = 8, GW_F_NORAW = 16, GW_F_NOMMA = 32,
       GW_F_WARPARR = 64, GW_F_TMAW = 128 };

template <int F>
__global__ void __launch_bounds__(GW_THREADS, 1)
    k_gemm_mxfp4_grouped_wg(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int k,
                            const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws, int n,
                            const int32_t *__restrict__ ids, const int32_t *__restrict__ off, int G,
                            const int32_t *__restrict__ rows, void *__restrict__ out, int out_bf16,
                            const __grid_constant__ CUtensorMap map_w) {
    extern __shared__ uint8_t gw_raw[];
    /* the 128B swizzle repeats every 1024 bytes: stages start on that boundary */
    const uint32_t raw0 = smem_u32(gw_raw), base = (raw0 + 1023u) & ~1023u;
    uint8_t *sm = gw_raw + (base - raw0);
    const uint32_t s_full = base + GW_ST * GW_STAGE, s_empty = s_full + 8 * GW_ST, s_wfull = s_empty + 8 * GW_ST;
    uint8_t *tab = sm + GW_ST * GW_STAGE + 24 * GW_ST;
    int *cum = (int *)(tab + GW_TAB), *wtot = cum + CUDA_GG_MAX_GROUPS + 1;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;

    if (tid < 120) { /* the conversion tables: exact values, so exact bytes */
        const int c = tid & 7, d = tid / 8 - 8;
        const float mag = c == 0 ? 0.f : c == 1 ? 0.5f : (c & 1 ? 1.5f : 1.f) * (float)(1 << ((c >> 1) - 1));
        tab[tid] = (uint8_t)__nv_cvt_float_to_fp8(ldexpf(mag, d), __NV_SATFINITE, __NV_E4M3);
    }
    if (tid == 0) {
        for (int i = 0; i < GW_ST; i++) {
            mbar_init(s_full + 8 * i, F & GW_F_WARPARR ? 4 : 128);
            mbar_init(s_empty + 8 * i, 8); /* one arrival per math warp */
            mbar_init(s_wfull + 8 * i, 1); /* GW_F_TMAW: the weight tile's bytes */
        }
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }
    group_tiles_scan<3>(off, G, GW_BM, cum, wtot); /* thread tid: groups 3 tid .. 3 tid + 2 */
    const int nx = (n + GW_BN - 1) / GW_BN, kt_n = k / GW_BK, kbn = k / 32;
    const int64_t items = (int64_t)cum[G] * nx;
    auto item_of = [&](int64_t it) {
        const group_tile gt = group_tile_of(cum, G, nx, it);
        GwItem I;
        I.base = off[gt.z];
        I.cnt = off[gt.z + 1] - off[gt.z];
        I.e = ids[gt.z];
        I.n0 = (int)gt.nt * GW_BN;
        I.s0 = (int)gt.rt * GW_BM;
        return I;
    };

    if (warp >= 8) {
        /* ---- producer: copies GW_LOOK stages ahead, converts, hands over ----
         * It gives registers to the math warpgroups, whose three 64-float
         * sets do not fit the 168 a thread of a 384-thread block starts with.
         * setmaxnreg only moves registers inside the block: 2 x 128 x
         * GW_MATH_REGS + 128 x GW_PRODUCER_REGS must not pass 384 x 168 (more
         * and the math warpgroups' increase waits forever). */
        asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"((int)GW_PRODUCER_REGS));
        const int p = tid - 256;
        const int64_t nit = items > blockIdx.x ? (items - 1 - blockIdx.x) / gridDim.x + 1 : 0;
        const int64_t total = nit * kt_n;
        int64_t it_i = blockIdx.x;
        int kt_i = 0;
        GwItem I = {0, 0, 0, 0, 0};
        int arow = -1; /* tile row p's activation row, -1 past the group */
        /* an item's source pointers (at kt 0) and their validity */
        const uint8_t *rp[8], *wsp = ws;
        const float *sap = sa;
        uint32_t rvalid = 0;
        auto issue = [&](int64_t g) {
            if (g < total) {
                if (kt_i == 0) {
                    I = item_of(it_i);
                    arow = I.s0 + p < I.cnt ? rows[I.base + I.s0 + p] : -1;
                    rvalid = 0;
#pragma unroll
                    for (int q = 0; q < 8; q++) {
                        const int ar = __shfl_sync(0xffffffffu, arow, 4 * q + (lane >> 3));
                        rp[q] = qa + (int64_t)(ar >= 0 ? ar : 0) * k + (lane & 7) * 16;
                        rvalid |= (uint32_t)(ar >= 0) << q;
                    }
                    sap = sa + (int64_t)(arow >= 0 ? arow : 0) * kbn;
                    const int nr = I.n0 + p;
                    wsp = ws + ((int64_t)I.e * n + (nr < n ? nr : 0)) * kbn;
                }
                const int st = (int)(g % GW_ST);
                if (g >= GW_ST) mbar_wait(s_empty + 8 * st, (uint32_t)((g / GW_ST) & 1) ^ 1u);
                const uint32_t sb = base + st * GW_STAGE;
                /* the warp's 32 tile rows, four an instruction, eight lanes a row:
                 * each instruction reads four whole 128-byte lines (a lane a row
                 * made every instruction touch 32 lines, half a sector each) */
#pragma unroll
                for (int q = 0; q < 8 && !(F & GW_F_NOA); q++) {
                    const int c = lane & 7, row = (warp - 8) * 32 + 4 * q + (lane >> 3);
                    cp_async16(sb + GW_A + row * 128 + ((c ^ (row & 7)) << 4), rp[q] + kt_i * GW_BK,
                               (rvalid >> q) & 1u);
                }
                if (!(F & GW_F_NOA)) cp_async16(sb + GW_SA + p * 16, sap + kt_i * 4, arow >= 0);
                if ((F & GW_F_TMAW) && !(F & GW_F_NORAW) && p == 0) {
                    mbar_arrive_expect_tx(s_wfull + 8 * st, GW_BN * GW_BK / 2);
                    tma_load_2d(sb + GW_RAW, &map_w, kt_i * (GW_BK / 2), I.e * n + I.n0, s_wfull + 8 * st);
                }
#pragma unroll
                for (int q = 0; q < 4 && !(F & (GW_F_NORAW | GW_F_TMAW)); q++) {
                    const int u = p + 128 * q, r = u >> 2, ch = u & 3, nr = I.n0 + r;
                    const bool vb = nr < n;
                    const uint8_t *src = w + ((int64_t)I.e * n + (vb ? nr : 0)) * (k / 2) + kt_i * 64 + ch * 16;
                    const int sc = F & GW_F_ROWS ? ch ^ ((r >> 1) & 3) : ch;
                    cp_async16(sb + GW_RAW + r * 64 + sc * 16, src, vb);
                }
                cp_async4(sb + GW_RSW + p * 4, wsp + kt_i * 4, I.n0 + p < n);
                if (++kt_i == kt_n) kt_i = 0, it_i += gridDim.x;
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        for (int g = 0; g < GW_LOOK; g++) issue(g);
        for (int64_t g = 0; g < total; g++) {
            issue(g + GW_LOOK);
            asm volatile("cp.async.wait_group %0;\n" ::"n"((int)GW_LOOK) : "memory");
            asm volatile("bar.sync 1, 128;\n" ::: "memory"); /* every producer thread's copies of stage g */
            const int st = (int)(g % GW_ST);
            uint8_t *sg = sm + st * GW_STAGE;
            if ((F & GW_F_TMAW) && !(F & GW_F_NORAW)) mbar_wait(s_wfull + 8 * st, (uint32_t)((g / GW_ST) & 1));
            bool slow = false;
            const uint32_t e4 = *(const uint32_t *)(sg + GW_RSW + p * 4); /* GW_F_ROWS: row p's four */
#pragma unroll
            for (int q = 0; q < 4 && !(F & GW_F_NOCONV); q++) {
                const int u = F & GW_F_ROWS ? p * 4 + q : p + 128 * q, r = u >> 2, j = u & 3;
                const int sc = F & GW_F_ROWS ? j ^ ((r >> 1) & 3) : j;
                const uint4 v = *(const uint4 *)(sg + GW_RAW + r * 64 + sc * 16);
                const uint32_t e8 = F & GW_F_ROWS ? (e4 >> (8 * j)) & 0xffu : sg[GW_RSW + r * 4 + j];
                const int d = (int)e8 - 127 + GW_C;
                const bool fold = gw_folds(e8);
                /* zero codes are zero at any d; a NaN scale must still reach the product */
                slow |= !fold && ((v.x | v.y | v.z | v.w) != 0u || e8 == 0xffu);
                const uint2 t = *(const uint2 *)(tab + 8 * (fold ? d + 8 : 8));
                uint4 o0, o1;
                gw_fp4x8(v.x, t, o0.x, o0.y);
                gw_fp4x8(v.y, t, o0.z, o0.w);
                gw_fp4x8(v.z, t, o1.x, o1.y);
                gw_fp4x8(v.w, t, o1.z, o1.w);
                *(uint4 *)(sg + GW_B + r * 128 + (((2 * j) ^ (r & 7)) << 4)) = o0;
                *(uint4 *)(sg + GW_B + r * 128 + (((2 * j + 1) ^ (r & 7)) << 4)) = o1;
            }
            const unsigned any = __any_sync(0xffffffffu, slow);
            if (lane == 0) sg[GW_FLAG + warp - 8] = (uint8_t)(any ? 1 : 0);
            /* the generic-proxy writes (stores, cp.async) become visible to the tensor cores' reads */
            asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
            if (F & GW_F_WARPARR) {
                __syncwarp();
                if (lane == 0) mbar_arrive(s_full + 8 * st);
            } else {
                mbar_arrive(s_full + 8 * st);
            }
        }
        return;
    }

    /* ---- math warpgroups ---- */
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"((int)GW_MATH_REGS));
    const int wg = tid >> 7, wi = (tid >> 5) & 3, g8 = lane >> 2, t = lane & 3;
    const int r0 = wg * 64 + wi * 16 + g8; /* tile row of p[4i], p[4i+1] */
    float acc[64], p0[64], p1[64];
    /* descriptors: one base each, the stage and step only move the start
     * address field (16-byte units, no carry out of its 14 bits) */
    const uint64_t desc_a = make_desc(base + GW_A + wg * 64 * 128, 16, 1024, 1);
    const uint64_t desc_b = make_desc(base + GW_B, 16, 1024, 1);
#define GW_DESC_A(s, j) (desc_a + (uint64_t)(((s) * GW_STAGE + (j) * 32) >> 4))
#define GW_DESC_B(s, j) (desc_b + (uint64_t)(((s) * GW_STAGE + (j) * 32) >> 4))
    int64_t gs = 0; /* stages consumed: the ring's position and phase */
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const GwItem I = item_of(it);
        const bool live = I.s0 + wg * 64 < I.cnt; /* this warpgroup's rows hold any of the group's */
#pragma unroll
        for (int i = 0; i < 64; i++) acc[i] = 0.0f;
        for (int kt = 0; kt < kt_n; kt++, gs++) {
            const int s = (int)(gs % GW_ST);
            mbar_wait(s_full + 8 * s, (uint32_t)((gs / GW_ST) & 1));
            const uint8_t *sg = sm + s * GW_STAGE;
            const float *sat = (const float *)(sg + GW_SA);
            if (F & GW_F_NOMMA) {
                __syncwarp();
                if (lane == 0) mbar_arrive(s_empty + 8 * s);
            } else if (F & GW_F_NOPROMO) {
                if (live) {
                    fence_regs(acc);
                    wg_fence();
#pragma unroll
                    for (int j = 0; j < 4; j++) wgmma_m64n128k32(acc, GW_DESC_A(s, j), GW_DESC_B(s, j), 1);
                    wg_commit();
                    wg_wait<0>();
                    fence_regs(acc);
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(s_empty + 8 * s);
            } else if (live && *(const uint32_t *)(sg + GW_FLAG) == 0u) {
                /* folded: two result sets (wg_stage_two_sets), one factor a row */
                wg_stage_two_sets(
                    p0, p1, [&](int j) { return GW_DESC_A(s, j); }, [&](int j) { return GW_DESC_B(s, j); },
                    [&](int j) { return make_float2(sat[r0 * 4 + j], sat[(r0 + 8) * 4 + j]); },
                    [&](const float *p, float2 sc) { gw_promote_rows(acc, p, sc.x, sc.y); },
                    [&]() { /* every read of stage s is done */
                        __syncwarp();
                        if (lane == 0) mbar_arrive(s_empty + 8 * s);
                    });
            } else if (live) {
                /* a block kept its scale: one step at a time, a factor per column */
#pragma unroll 1
                for (int j = 0; j < 4; j++) {
                    wg_step_waited(p0, GW_DESC_A(s, j), GW_DESC_B(s, j));
                    gw_promote_cols(acc, p0, sat[r0 * 4 + j], sat[(r0 + 8) * 4 + j], sg + GW_RSW, j, t);
                }
                __syncwarp();
                if (lane == 0) mbar_arrive(s_empty + 8 * s);
            } else {
                __syncwarp();
                if (lane == 0) mbar_arrive(s_empty + 8 * s);
            }
        }
        if (!live) continue;
        const float osc = 1.0f / (float)(1 << GW_C);
#pragma unroll
        for (int i = 0; i < 16; i++) {
            const int col = I.n0 + 8 * i + 2 * t, slot = I.s0 + r0;
            if (slot < I.cnt) store_out2(out, out_bf16, n, I.base + slot, col, acc[4 * i] * osc, acc[4 * i + 1] * osc);
            if (slot + 8 < I.cnt)
                store_out2(out, out_bf16, n, I.base + slot + 8, col, acc[4 * i + 2] * osc, acc[4 * i + 3] * osc);
        }
    }
#undef GW_DESC_A
#undef GW_DESC_B
}

bool cuda_gemm_grouped_wg_applies(const uint8_t *qa, const float *sa, int64_t k, const uint8_t *w,
                                  const uint8_t *ws, int64_t n) {
    /* a device whose blocks cannot have the ring's shared memory keeps the
     * mma.sync forms (asked once: one device per process here) */
    static int smem_ok = -1;
    if (smem_ok < 0) {
        int dev = 0, optin = 0;
        smem_ok = cudaGetDevice(&dev) == cudaSuccess &&
                  cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev) == cudaSuccess &&
                  optin >= GW_SMEM;
    }
    return smem_ok && k > 0 && k % GW_BK == 0 && k <= 0x7fffffffLL / 2 && n > 0 && n <= 0x7fffffffLL - GW_BN &&
           (uintptr_t)qa % 16 == 0 && (uintptr_t)sa % 16 == 0 && (uintptr_t)w % 16 == 0 && (uintptr_t)ws % 4 == 0;
}

di_status cuda_launch_gemm_mxfp4_grouped_wg(const uint8_t *qa, const float *sa, int64_t k, const uint8_t *w,
                                            const uint8_t *ws, int64_t n, const int32_t *ids, const int32_t *off,
                                            int32_t ngroups, const int32_t *rows, void *out, int out_bf16,
                                            int variant, cudaStream_t stream, di_err *err) {
    if (ngroups <= 0 || n <= 0) return DI_OK;
    if (ngroups > CUDA_GG_MAX_GROUPS || !cuda_gemm_grouped_wg_applies(qa, sa, k, w, ws, n))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4_grouped (wgmma): %d groups (at most %d), k = %lld (a multiple of %d), "
                          "16-byte aligned codes and activation scales needed",
                          (int)ngroups, CUDA_GG_MAX_GROUPS, (long long)k, GW_BK);
    typedef void (*kern_t)(const uint8_t *, const float *, int, const uint8_t *, const uint8_t *, int,
                           const int32_t *, const int32_t *, int, const int32_t *, void *, int, CUtensorMap);
    /* the variants built: the forms, then the measuring aids */
    static const struct {
        int v;
        kern_t k;
    } kerns[] = {{1, k_gemm_mxfp4_grouped_wg<1>},   {0, k_gemm_mxfp4_grouped_wg<0>},
                 {3, k_gemm_mxfp4_grouped_wg<3>},   {5, k_gemm_mxfp4_grouped_wg<5>},
                 {7, k_gemm_mxfp4_grouped_wg<7>},   {15, k_gemm_mxfp4_grouped_wg<15>},
                 {23, k_gemm_mxfp4_grouped_wg<23>}, {39, k_gemm_mxfp4_grouped_wg<39>},
                 {33, k_gemm_mxfp4_grouped_wg<33>}, {65, k_gemm_mxfp4_grouped_wg<65>},
                 {27, k_gemm_mxfp4_grouped_wg<27>}, {129, k_gemm_mxfp4_grouped_wg<129>}};
    const int NK = (int)(sizeof kerns / sizeof kerns[0]);
    /* GW_F_TMAW: whole output tiles (no expert's tile runs into the next
     * one's rows or past the last), and a tensor map over the weights: as
     * many rows as 65,536 experts could have (ids are below that), k / 2
     * bytes each; else the variant without it */
    CUtensorMap map_w;
    memset(&map_w, 0, sizeof map_w);
    if ((variant & GW_F_TMAW) &&
        !(n % GW_BN == 0 && (uint64_t)n * 65536u <= 0x7fffffffull && /* row coordinates are int32 */
          make_map_swz(&map_w, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, (uint64_t)n * 65536u, (uint64_t)(k / 2),
                       GW_BK / 2, GW_BN, CU_TENSOR_MAP_SWIZZLE_64B)))
        variant &= ~GW_F_TMAW;
    int f = 0;
    while (f < NK && kerns[f].v != variant) f++;
    if (f == NK) f = 0;
    static int blocks = 0, attr[16]; /* one block a multiprocessor (its shared memory) */
    if (!attr[f]) {
        cudaError_t e = cudaFuncSetAttribute(kerns[f].k, cudaFuncAttributeMaxDynamicSharedMemorySize, GW_SMEM);
        int dev = 0, sms = 0;
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return cuda_check(e, err, "gemm_mxfp4_grouped (wgmma) setup");
        blocks = sms > 0 ? sms : 1;
        attr[f] = 1;
    }
    kerns[f].k<<<blocks, GW_THREADS, GW_SMEM, stream>>>(qa, sa, (int)k, w, ws, (int)n, ids, off, ngroups, rows, out,
                                                      out_bf16, map_w);
    return cuda_check(cudaGetLastError(), err, "gemm_mxfp4_grouped (wgmma)");
}
