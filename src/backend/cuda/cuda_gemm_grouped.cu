/* Grouped MXFP4 GEMM on the tensor cores for groups of many rows: the MoE
 * experts at prefill (architecture.md §7; numerics §2 "FP4 expert linear":
 * FP8 activations with one f32 scale per 32 inputs, packed E2M1 weights
 * with one E8M0 scale per row and 32 inputs).
 *
 * Why not the decode kernel: cuda_matvec.cu streams each weight tile once
 * per 8 tokens, so at an 8K-token prefill, where an expert holds ~130 rows,
 * every expert's weights pass 16 times through the SMs and the mma.sync
 * tiles are 8 tokens wide. Here a block takes a 64-row x 128-output tile
 * of one group and reads its weights once per 64 rows.
 *
 * Work list: groups have data-dependent row counts (device memory), so the
 * grid is persistent (two blocks per SM) and each block first turns the
 * groups' offsets into a table of 64-row tiles in shared memory (a block
 * scan over at most CUDA_GG_MAX_GROUPS groups), then walks the items (group,
 * output tile, row tile) with the row tile fastest, so blocks running at
 * the same time read the same expert tile from L2.
 *
 * Arithmetic (the decode kernel's): per 32-block the products start from
 * zero as an f16 mma.sync m16n8k16 pair (E4M3 activation codes and E2M1
 * weight codes are exact in f16: the weights are decoded as value · 2^-6
 * through the E4M3 conversion, the 2^6 goes back in at the end), and the
 * block's sum is promoted into the fp32 accumulator with the two scales,
 * fmaf(d, s_a · s_w, acc), blocks in ascending order. The bits differ from
 * the decode kernel's only through the tensor cores' internal additions
 * inside a 32-block; both stay within kernels.h's bound of the exact sum
 * (tests/unit/test_cuda_ops.c test_grouped_many_rows).
 *
 * What limits it (docs/gpu-notes.md, grouped runs 1-2): issue, at a low rate
 * of instructions per cycle, not one unit: twelve instructions per mma in
 * the first pipelined form, a third of them the promotion's products, plus
 * spills and conflicted shared stores. The default form (PIPE | REMAP |
 * FOLD, below) runs the stage in 612 instructions a warp instead of 765,
 * with no spills: 11.7 -> 10.0 ms for w1 at an 8K-token prefill on an H200. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_gemm_grouped.h"
#include "backend/cuda/cuda_group_tiles.cuh"
#include "backend/cuda/cuda_tma.cuh"

enum {
    GG_BM = 64,               /* rows (token slots) per tile */
    GG_BN = 128,              /* outputs per tile */
    GG_KC = 128,              /* inputs per stage: four 32-blocks */
    GG_THREADS = 256,         /* 8 warps: 2 (rows) x 4 (outputs), 32 x 32 each */
    GG_LDW = GG_KC / 2 + 4,   /* 32-bit words per staged row (f16 pairs), padded */
};

/* One stage as the pipelined form copies it (cp.async), by thread: the
 * activation codes of thread (ta, pa), its block's scale, the packed weights
 * of thread (rb, hb), and the four scale bytes of weight row rb (its thread
 * with hb = 0). A thread converts only what it copied itself. */
struct GgRaw {
    uint4 a[2][GG_THREADS];
    uint4 w[2][GG_THREADS];
    float sa[GG_THREADS];
    uint32_t sw[GG_BN];
};
enum { GG_STAGES = 3 }; /* stages in flight: the one converted and two behind it */

/* The kernel's forms, by flag (measured side by side in bench_cuda_ops
 * --gg): PIPE the pipelined form (below); REMAP, staging roles chosen so
 * that the eight threads of each quarter warp store their converted 16
 * bytes to eight different rows (bank-conflict free; the first roles paired
 * two threads of one row on the same banks: half the shared store
 * wavefronts were conflicts); FOLD, each weight block's scale multiplied
 * into its f16 codes (below), so that the promotion needs no product of
 * the two scales. */
enum {
    GG_F_PIPE = 1,
    GG_F_REMAP = 2,
    GG_F_FOLD = 4,
    GG_F_DEFAULT = GG_F_PIPE | GG_F_REMAP | GG_F_FOLD,
    GG_F_WG = 8, /* cuda_gemm_grouped_wg.cu's form (the default where it applies) */
};

/* FOLD: a weight code's f16 (value · 2^-6, a normal f16 from 2^-7 to 6 ·
 * 2^-6) times 2^p, p = the block's scale exponent + GG_FOLD_C, is exact and
 * normal for p in [-7, 15]; the tensor cores add products that all carry the
 * same power of two, so the block's sum is d · 2^p exactly, and
 * fmaf(d · 2^p, s_a, acc · 2^C) = fmaf(d, s_a · s_w, acc) · 2^C, bit for bit
 * (s_a · s_w is exact: s_w is a power of two; no value here comes near the
 * fp32 range's ends). A block whose exponent lies outside [-7 - C, 15 - C]
 * (scales 2^-16 .. 2^6, E8M0 bytes 111..133) keeps 2^C alone and its scale
 * in the table; a stage with such a block promotes with the product, as the
 * unfolded forms do (the choice is the block's: one flag on the barrier
 * that follows the conversion). */
enum { GG_FOLD_C = 9 };

struct GgSmem {
    uint32_t a[GG_BM * GG_LDW];  /* [64 rows, 128 inputs] f16 activation codes */
    uint32_t b[GG_BN * GG_LDW];  /* [128 outputs, 128 inputs] f16 weight codes · 2^-6 */
    float sa[GG_BM][GG_KC / 32]; /* activation scales of the stage's blocks */
    float sw[GG_BN][GG_KC / 32]; /* weight scales, decoded */
    int cum[CUDA_GG_MAX_GROUPS + 1]; /* row tiles of the groups before z */
    int wtot[GG_THREADS / 32];
};

__device__ __forceinline__ void gg_mma(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

/* the same step from a zero accumulator (+0, as gg_zero leaves it): the
 * zero comes from one register, not four moves per tile and 32-block */
__device__ __forceinline__ void gg_mma0(float d[4], const uint32_t a[4], const uint32_t b[2]) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
        "{%8, %9}, {%10, %10, %10, %10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(0.f));
}

/* four 8 x 8 matrices of 16-bit values from shared memory (lane l gives
 * the address of row l % 8 of matrix l / 8), as the mma fragments */
__device__ __forceinline__ void gg_ldsm4(uint32_t (&r)[4], const uint32_t *p) {
    const uint32_t a = (uint32_t)__cvta_generic_to_shared(p);
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* two E4M3 codes (low byte first) -> f16 pair, exact */
__device__ __forceinline__ uint32_t gg_e4m3x2(uint32_t two) {
    __half2_raw r = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(two & 0xffffu), __NV_E4M3);
    return (uint32_t)r.x | ((uint32_t)r.y << 16);
}

/* four E4M3 bytes -> two f16 pairs */
__device__ __forceinline__ void gg_act4(uint32_t v, uint32_t *o) {
    o[0] = gg_e4m3x2(v);
    o[1] = gg_e4m3x2(v >> 16);
}

/* four packed bytes (eight E2M1 codes, element 2i in byte i's low nibble)
 * -> four f16 pairs of value · 2^-6: the code bits placed at the bottom of
 * an E4M3 exponent and the top of its mantissa (cuda_matvec.cu), even and
 * odd elements interleaved back into order */
__device__ __forceinline__ void gg_fp4x8(uint32_t v, uint32_t *o) {
    const uint32_t lo = ((v << 2) & 0x1c1c1c1cu) | ((v << 4) & 0x80808080u);
    const uint32_t hi = ((v >> 2) & 0x1c1c1c1cu) | (v & 0x80808080u);
    const uint32_t p0 = __byte_perm(lo, hi, 0x5140), p1 = __byte_perm(lo, hi, 0x7362);
    o[0] = gg_e4m3x2(p0);
    o[1] = gg_e4m3x2(p0 >> 16);
    o[2] = gg_e4m3x2(p1);
    o[3] = gg_e4m3x2(p1 >> 16);
}

/* an f16 pair times an f16 pair (FOLD: powers of two, exact) */
__device__ __forceinline__ uint32_t gg_hmul2(uint32_t a, uint32_t b) {
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(a), "r"(b));
    return r;
}

__device__ __forceinline__ void gg_zero(float (&v)[2][4][4]) {
#pragma unroll
    for (int i = 0; i < 2; i++)
#pragma unroll
        for (int j = 0; j < 4; j++)
#pragma unroll
            for (int q = 0; q < 4; q++) v[i][j][q] = 0.f;
}

/* PIPE, the pipelined form (k a multiple of 128): each stage's raw bytes
 * come by cp.async into a ring of GG_STAGES stages behind the shared f16
 * tiles, so two stages are in flight while one is converted and multiplied
 * (the first form holds one stage ahead in registers: 19 registers of a
 * kernel capped at 128, 180 bytes of spills, and one stage of latency to
 * hide); the fragments come by ldmatrix (4 instructions a k16 step instead
 * of 16 scalar loads) and each 32-block's first mma starts from a zero
 * register. The same values reach the same mma in the same order: the same
 * bits as the first form (test_cuda_ops compares them). */
template <int F>
__global__ void __launch_bounds__(GG_THREADS, 2)
    k_gemm_mxfp4_grouped(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int64_t k,
                         const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws, int64_t n,
                         const int32_t *__restrict__ ids, const int32_t *__restrict__ off, int G,
                         const int32_t *__restrict__ rows, void *__restrict__ out, int out_bf16) {
    extern __shared__ __align__(16) uint8_t gg_raw[];
    GgSmem &sm = *reinterpret_cast<GgSmem *>(gg_raw);
    constexpr bool PIPE = F & GG_F_PIPE, REMAP = F & GG_F_REMAP, FOLD = PIPE && (F & GG_F_FOLD);
    /* the weight tiles carry 2^-6 (E2M1 through E4M3), folded ones 2^C more */
    constexpr float OSCALE = FOLD ? 64.0f / (float)(1 << GG_FOLD_C) : 64.0f;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    group_tiles_scan<4>(off, G, GG_BM, sm.cum, sm.wtot); /* thread tid: groups 4 tid .. 4 tid + 3 */
    const int64_t nx = (n + GG_BN - 1) / GG_BN, items = (int64_t)sm.cum[G] * nx;
    const int64_t kbn = k / 32, nch = (k + GG_KC - 1) / GG_KC, rowb = k / 2;
    const int wm = warp >> 2, wn = warp & 3;
    /* staging roles: activation row ta, 32 bytes pa of the stage's 128;
     * weight row rb, 32 packed bytes hb of the stage's 64 */
    const int ta = REMAP ? (tid & 7) | (tid >> 5 << 3) : tid >> 2, pa = REMAP ? (tid >> 3) & 3 : tid & 3;
    const int rb = REMAP ? (tid & 7) | (tid >> 4 << 3) : tid >> 1, hb = REMAP ? (tid >> 3) & 1 : tid & 1;
    const uint4 z4 = make_uint4(0u, 0u, 0u, 0u);
    for (int64_t it = blockIdx.x; it < items; it += gridDim.x) {
        const group_tile gt = group_tile_of(sm.cum, G, nx, it);
        const int z = gt.z;
        const int64_t n0 = gt.nt * GG_BN, s0 = gt.rt * GG_BM;
        const int64_t base = off[z], cnt = off[z + 1] - base, e = ids[z];
        const bool va = s0 + ta < cnt, vb = n0 + rb < n;
        const int64_t arow = va ? rows[base + s0 + ta] : 0;
        const uint8_t *pA = qa + arow * k, *pB = w + (e * n + (vb ? n0 + rb : 0)) * rowb;
        const float *pSA = sa + arow * kbn;
        const uint8_t *pSW = ws + (e * n + (vb ? n0 + rb : 0)) * kbn;
        uint4 ra[2], rw[2];
        float rsa, rsw[2];
        auto load = [&](int64_t c) {
            const int64_t k0 = c * GG_KC;
#pragma unroll
            for (int v = 0; v < 2; v++) {
                const int64_t ea = k0 + pa * 32 + v * 16, eb = k0 / 2 + hb * 32 + v * 16;
                ra[v] = va && ea < k ? __ldg((const uint4 *)(pA + ea)) : z4;
                rw[v] = vb && eb < rowb ? __ldg((const uint4 *)(pB + eb)) : z4;
            }
            const int64_t kba = k0 / 32 + pa, kbw = k0 / 32 + hb * 2;
            rsa = va && kba < kbn ? __ldg(pSA + kba) : 0.f;
            rsw[0] = vb && kbw < kbn ? e8m0_to_f32(__ldg(pSW + kbw)) : 0.f;
            rsw[1] = vb && kbw + 1 < kbn ? e8m0_to_f32(__ldg(pSW + kbw + 1)) : 0.f;
        };
        GgRaw *ring = reinterpret_cast<GgRaw *>(gg_raw + (sizeof(GgSmem) + 15) / 16 * 16);
        /* the pipelined form's sources, advanced one stage per issue (invalid
         * rows keep reading the first bytes, which cp.async does not fetch) */
        const uint8_t *nA = va ? pA + pa * 32 : qa, *nB = vb ? pB + hb * 32 : w, *nSW = vb ? pSW : ws;
        const float *nSA = va ? pSA + pa : sa;
        const int stepA = va ? GG_KC : 0, stepB = vb ? GG_KC / 2 : 0, stepS = va ? GG_KC / 32 : 0,
                  stepW = vb ? GG_KC / 32 : 0;
        int wslot = 0, left = (int)nch; /* the next issue's ring slot, stages still to issue */
        auto issue = [&]() { /* the next stage into its ring slot: one commit group, empty past the end */
            if (left > 0) {
                GgRaw &r = ring[wslot];
#pragma unroll
                for (int v = 0; v < 2; v++) {
                    cp_async16(smem_u32(&r.a[v][tid]), nA + v * 16, va);
                    cp_async16(smem_u32(&r.w[v][tid]), nB + v * 16, vb);
                }
                cp_async4(smem_u32(&r.sa[tid]), nSA, va);
                if (!hb) cp_async4(smem_u32(&r.sw[rb]), nSW, vb);
                nA += stepA, nB += stepB, nSA += stepS, nSW += stepW;
                wslot = wslot == GG_STAGES - 1 ? 0 : wslot + 1;
                left--;
            }
            asm volatile("cp.async.commit_group;\n" ::: "memory");
        };
        int rslot = 0; /* the ring slot of the stage converted next */
        float acc[2][4][4];
        gg_zero(acc);
        if (PIPE) {
#pragma unroll
            for (int q = 0; q < GG_STAGES - 1; q++) issue();
        } else {
            load(0);
        }
        for (int64_t c = 0; c < nch; c++) {
            bool slow = false;  /* FOLD: a block of this thread's kept its scale */
            uint32_t wmul[2];   /* FOLD: its two blocks' multipliers, f16 pairs */
            if (PIPE) {
                issue(); /* stage c + 2 into the slot of stage c - 1, which this thread has converted */
                asm volatile("cp.async.wait_group %0;\n" ::"n"(GG_STAGES - 1) : "memory");
                const GgRaw &r = ring[rslot];
                rslot = rslot == GG_STAGES - 1 ? 0 : rslot + 1;
                ra[0] = r.a[0][tid], ra[1] = r.a[1][tid], rw[0] = r.w[0][tid], rw[1] = r.w[1][tid];
                rsa = r.sa[tid];
                if (FOLD) {
                    /* the row's four scale bytes, copied by its hb = 0 thread (the lane
                     * with bit 3 (REMAP) or bit 0 clear) */
                    const uint32_t b4 = __shfl_sync(0xffffffffu, hb ? 0u : r.sw[rb], REMAP ? lane & ~8 : lane & ~1);
#pragma unroll
                    for (int v = 0; v < 2; v++) {
                        const int e8 = (int)((b4 >> (16 * hb + 8 * v)) & 0xffu);
                        const int p = e8 - 127 + GG_FOLD_C;
                        const bool inr = p >= -7 && p <= 15, fold = inr || !vb; /* past n: zero codes */
                        slow |= !fold;
                        /* 2^p (or 2^C) as an f16 pair */
                        const uint32_t h = (uint32_t)((inr ? p : GG_FOLD_C) + 15) << 10;
                        wmul[v] = h | h << 16;
                        sm.sw[rb][2 * hb + v] = fold ? 1.f : e8m0_to_f32((uint32_t)e8);
                    }
                } else if (!hb) {
                    const uint32_t b4 = r.sw[rb];
#pragma unroll
                    for (int q = 0; q < 4; q++) sm.sw[rb][q] = vb ? e8m0_to_f32((b4 >> (8 * q)) & 0xffu) : 0.f;
                }
            }
            {   /* stage c, converted to f16 */
                uint32_t cv[16];
                const uint32_t av[8] = {ra[0].x, ra[0].y, ra[0].z, ra[0].w,
                                        ra[1].x, ra[1].y, ra[1].z, ra[1].w};
#pragma unroll
                for (int j = 0; j < 8; j++) gg_act4(av[j], cv + 2 * j);
                uint4 *dA = (uint4 *)(sm.a + ta * GG_LDW + pa * 16);
#pragma unroll
                for (int j = 0; j < 4; j++) dA[j] = make_uint4(cv[4 * j], cv[4 * j + 1], cv[4 * j + 2], cv[4 * j + 3]);
                const uint32_t wv[8] = {rw[0].x, rw[0].y, rw[0].z, rw[0].w,
                                        rw[1].x, rw[1].y, rw[1].z, rw[1].w};
                uint4 *dB = (uint4 *)(sm.b + rb * GG_LDW + hb * 32);
#pragma unroll
                for (int j = 0; j < 8; j++) {
                    uint32_t o[4];
                    gg_fp4x8(wv[j], o);
                    if (FOLD) /* words 0..3 are the first block (rw[0]), 4..7 the second */
#pragma unroll
                        for (int q = 0; q < 4; q++) o[q] = gg_hmul2(o[q], wmul[j >> 2]);
                    dB[j] = make_uint4(o[0], o[1], o[2], o[3]);
                }
                sm.sa[ta][pa] = rsa;
                if (!PIPE) {
                    sm.sw[rb][hb * 2] = rsw[0];
                    sm.sw[rb][hb * 2 + 1] = rsw[1];
                }
            }
            /* FOLD: whether any block of the stage kept its scale in the table */
            bool slow_stage = true;
            if (FOLD) slow_stage = __syncthreads_or(slow) != 0;
            else __syncthreads();
            if (!PIPE && c + 1 < nch) load(c + 1); /* in flight while the tensor cores work */
#pragma unroll
            for (int kb = 0; kb < GG_KC / 32; kb++) {
                float d[2][4][4];
                if (!PIPE) gg_zero(d);
#pragma unroll
                for (int s = 0; s < 2; s++) {
                    const int wo = kb * 16 + s * 8 + t;
                    uint32_t af[2][4], bfr[4][2];
                    if (PIPE) {
                        /* A: rows +0 / +8 at k +0 / +8; B: two n8 tiles at k +0 / +8 */
                        const int lr = lane & 7, lj = lane >> 3, w0 = kb * 16 + s * 8;
#pragma unroll
                        for (int mt = 0; mt < 2; mt++)
                            gg_ldsm4(af[mt], sm.a + (wm * 32 + mt * 16 + lr + 8 * (lj & 1)) * GG_LDW + w0 + 4 * (lj >> 1));
#pragma unroll
                        for (int np = 0; np < 2; np++) {
                            uint32_t r[4];
                            gg_ldsm4(r, sm.b + (wn * 32 + (2 * np + (lj >> 1)) * 8 + lr) * GG_LDW + w0 + 4 * (lj & 1));
                            bfr[2 * np][0] = r[0], bfr[2 * np][1] = r[1];
                            bfr[2 * np + 1][0] = r[2], bfr[2 * np + 1][1] = r[3];
                        }
                    } else {
#pragma unroll
                        for (int mt = 0; mt < 2; mt++) {
                            const uint32_t *p = sm.a + (wm * 32 + mt * 16 + g) * GG_LDW + wo;
                            af[mt][0] = p[0];
                            af[mt][1] = p[8 * GG_LDW];
                            af[mt][2] = p[4];
                            af[mt][3] = p[8 * GG_LDW + 4];
                        }
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            const uint32_t *p = sm.b + (wn * 32 + nt * 8 + g) * GG_LDW + wo;
                            bfr[nt][0] = p[0];
                            bfr[nt][1] = p[4];
                        }
                    }
#pragma unroll
                    for (int mt = 0; mt < 2; mt++)
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            if (PIPE && s == 0) gg_mma0(d[mt][nt], af[mt], bfr[nt]);
                            else gg_mma(d[mt][nt], af[mt], bfr[nt]);
                        }
                }
                if (!slow_stage) { /* folded: s_w is in d */
#pragma unroll
                    for (int mt = 0; mt < 2; mt++) {
                        const float f0 = sm.sa[wm * 32 + mt * 16 + g][kb], f1 = sm.sa[wm * 32 + mt * 16 + g + 8][kb];
#pragma unroll
                        for (int nt = 0; nt < 4; nt++) {
                            acc[mt][nt][0] = fmaf(d[mt][nt][0], f0, acc[mt][nt][0]);
                            acc[mt][nt][1] = fmaf(d[mt][nt][1], f0, acc[mt][nt][1]);
                            acc[mt][nt][2] = fmaf(d[mt][nt][2], f1, acc[mt][nt][2]);
                            acc[mt][nt][3] = fmaf(d[mt][nt][3], f1, acc[mt][nt][3]);
                        }
                    }
                    continue;
                }
#pragma unroll
                for (int mt = 0; mt < 2; mt++) {
                    const float f0 = sm.sa[wm * 32 + mt * 16 + g][kb], f1 = sm.sa[wm * 32 + mt * 16 + g + 8][kb];
#pragma unroll
                    for (int nt = 0; nt < 4; nt++) {
                        const float w0 = sm.sw[wn * 32 + nt * 8 + 2 * t][kb];
                        const float w1 = sm.sw[wn * 32 + nt * 8 + 2 * t + 1][kb];
                        acc[mt][nt][0] = fmaf(d[mt][nt][0], f0 * w0, acc[mt][nt][0]);
                        acc[mt][nt][1] = fmaf(d[mt][nt][1], f0 * w1, acc[mt][nt][1]);
                        acc[mt][nt][2] = fmaf(d[mt][nt][2], f1 * w0, acc[mt][nt][2]);
                        acc[mt][nt][3] = fmaf(d[mt][nt][3], f1 * w1, acc[mt][nt][3]);
                    }
                }
            }
            __syncthreads(); /* the stage is read; the next one may be written */
        }
#pragma unroll
        for (int mt = 0; mt < 2; mt++)
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int64_t slot = s0 + wm * 32 + mt * 16 + g + 8 * h;
                if (slot >= cnt) continue;
                const int64_t orow = base + slot;
#pragma unroll
                for (int nt = 0; nt < 4; nt++) {
                    const int64_t col = n0 + wn * 32 + nt * 8 + 2 * t;
                    const float v0 = acc[mt][nt][2 * h] * OSCALE, v1 = acc[mt][nt][2 * h + 1] * OSCALE;
                    if (out_bf16) {
                        uint16_t *o = (uint16_t *)out + orow * n + col;
                        if (col < n) o[0] = f32_to_bf16_bits(v0);
                        if (col + 1 < n) o[1] = f32_to_bf16_bits(v1);
                    } else {
                        float *o = (float *)out + orow * n + col;
                        if (col < n) o[0] = v0;
                        if (col + 1 < n) o[1] = v1;
                    }
                }
            }
    }
}

static int gg_form = -1; /* test and measuring aid: a form's flags (0 the first form), -1 choose */
extern "C" void cuda_gemm_grouped_set_form(int form) { gg_form = form; }

typedef void (*gg_kernel)(const uint8_t *, const float *, int64_t, const uint8_t *, const uint8_t *,
                          int64_t, const int32_t *, const int32_t *, int, const int32_t *, void *, int);

/* the forms built, by flags */
static const struct {
    int flags;
    gg_kernel kern;
} gg_forms[] = {
    {0, k_gemm_mxfp4_grouped<0>},
    {GG_F_PIPE, k_gemm_mxfp4_grouped<GG_F_PIPE>},
    {GG_F_PIPE | GG_F_REMAP, k_gemm_mxfp4_grouped<GG_F_PIPE | GG_F_REMAP>},
    {GG_F_PIPE | GG_F_FOLD, k_gemm_mxfp4_grouped<GG_F_PIPE | GG_F_FOLD>},
    {GG_F_PIPE | GG_F_REMAP | GG_F_FOLD, k_gemm_mxfp4_grouped<GG_F_PIPE | GG_F_REMAP | GG_F_FOLD>},
};
enum { GG_NFORMS = sizeof gg_forms / sizeof *gg_forms };

di_status cuda_launch_gemm_mxfp4_grouped_tiled(const uint8_t *qa, const float *sa,
                                                         int64_t k, const uint8_t *w,
                                                         const uint8_t *ws, int64_t n,
                                                         const int32_t *ids, const int32_t *off,
                                                         int32_t ngroups, const int32_t *rows,
                                                         void *out, int out_bf16,
                                                         cudaStream_t stream, di_err *err) {
    if (ngroups <= 0 || n <= 0) return DI_OK;
    if (ngroups > CUDA_GG_MAX_GROUPS || k <= 0 || k % 32 || (uintptr_t)qa % 16 || (uintptr_t)w % 16)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4_grouped (tiled): %d groups (at most %d), k = %lld (a multiple "
                          "of 32), 16-byte aligned codes needed", (int)ngroups, CUDA_GG_MAX_GROUPS,
                          (long long)k);
    static int pipe_env = -1; /* DI_CUDA_GG_PIPE=0: the first form (a measuring aid) */
    int flags = gg_form >= 0 ? gg_form : cuda_env_switch("DI_CUDA_GG_PIPE", &pipe_env)
                                     ? GG_F_WG + CUDA_GW_VARIANT_DEFAULT
                                     : 0;
    if (flags >= GG_F_WG) { /* forms 8 + v: the wgmma kernel's variant v (137 the default) */
        if (cuda_gemm_grouped_wg_applies(qa, sa, k, w, ws, n))
            return cuda_launch_gemm_mxfp4_grouped_wg(qa, sa, k, w, ws, n, ids, off, ngroups, rows, out,
                                                     out_bf16, flags - GG_F_WG, stream, err);
        flags = GG_F_DEFAULT;
    }
    if (!(k % GG_KC == 0 && (uintptr_t)ws % 4 == 0)) flags = 0; /* the pipelined forms' shapes */
    int f = 0;
    while (f < GG_NFORMS && gg_forms[f].flags != flags) f++;
    if (f == GG_NFORMS)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "gemm_mxfp4_grouped (tiled): no form with flags %d", flags);
    const gg_kernel kern = gg_forms[f].kern;
    const int smem = flags & GG_F_PIPE ? (int)((sizeof(GgSmem) + 15) / 16 * 16 + GG_STAGES * sizeof(GgRaw))
                                       : (int)sizeof(GgSmem);
    static int blocks[GG_NFORMS]; /* resident blocks on the whole device, per form */
    if (!blocks[f]) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        int per_sm = 0, dev = 0, sms = 0;
        if (e == cudaSuccess) e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, GG_THREADS, smem);
        if (e == cudaSuccess) e = cudaGetDevice(&dev);
        if (e == cudaSuccess) e = cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
        if (e != cudaSuccess) return cuda_check(e, err, "gemm_mxfp4_grouped (tiled) setup");
        blocks[f] = per_sm * sms > 0 ? per_sm * sms : 1;
    }
    kern<<<blocks[f], GG_THREADS, (size_t)smem, stream>>>(qa, sa, k, w, ws, n, ids, off, ngroups, rows, out,
                                                          out_bf16);
    return cuda_check(cudaGetLastError(), err, "gemm_mxfp4_grouped (tiled)");
}
