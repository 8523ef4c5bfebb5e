/* Decode form of the MXFP4 products (architecture.md §2 "FP4 expert
 * linear": packed E2M1 weights with one E8M0 scale per row and 32 inputs,
 * FP8 E4M3 activations with one f32 scale per 32 inputs): the routed
 * experts at decode, a few tokens per expert.
 *
 * Two kernels. The tensor-core one (k_fp4_mma, below) takes k % 256 == 0
 * (the model's expert shapes): each block of 16 weight rows x 32 inputs is
 * two f16 mma.syncs, the weights streamed through shared memory by
 * cp.async several batches ahead, across the row tiles of a thread block;
 * in its WG form one wgmma a block for 64 rows (launches over many experts:
 * fm_wg_pick).
 * The CUDA-core one (k_fp4_dec, first) takes any k % 32 == 0: every lane
 * loads whole 32-blocks (16 bytes of codes and their scale byte) straight
 * into registers, four blocks in flight, decodes them to f32 and runs FMA
 * chains against the activations, converted to f32 once per block of rows;
 * ~124 instructions a lane per block, issue-bound near 40 % of copy (MXFP4
 * run 1, docs/gpu-notes.md). Measured (st run 1, one H200, grouped
 * expert products from DRAM as moe_experts calls them): the tensor-core
 * kernel, w1 and w3 as one pair launch / w2, at 79 / 75-79 % of copy at
 * batch 64, 68-70 / 73-75 % at 256, 73-74 / 69 % at 8 and 59 / 56 % at 1
 * (one wave of blocks: copying alone reached 79 / 70 % there in aid run
 * 1), where the wgmma kernel (cuda_matvec.cu) got 16-26 % at 64, 54-57 %
 * at 8, ~35 % at 1; which form runs at which batch, cuda_matvec.cu picks.
 *
 * The CUDA-core kernel's arithmetic (the tensor-core kernel's is below it):
 * per (token, weight row), block b's 32 products (w · 2^-6) · a are exact
 * in f32 (2 + 4 significant bits, at least 2^-16), summed from zero by an
 * FMA chain in a fixed element order; the
 * sum times 64 (exact) is promoted by fmaf(d, s_a · s_w, acc). The row's
 * blocks are dealt to L lanes (b = lane, lane + L, ...; L from k alone),
 * each lane promoting its blocks in ascending order, and the L lanes' sums
 * are added by a butterfly. The wgmma form adds a block's products on the
 * FP8 tensor cores' short adder instead: the bits differ, and both are
 * within the test's bound of the exact sum (2^-8 max|p| per block for the
 * adder, here at most 31 · 32 · 2^-24 max|p| < 2^-14 max|p|; the
 * promotions' kbn · 2^-24 Σ|p| for either order). Nothing depends on the
 * other rows, the token tile or the grouping, so a grouped row equals the
 * plain product of that row alone bit for bit. */
#include <stdlib.h>

#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_fp4_dec.h"
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_tma.cuh"

enum {
    FD_THREADS = 256,
    FD_WARPS = FD_THREADS / 32,
    FD_PASSES = 2, /* row groups a warp takes in turn */
    FD_BATCH = 4,  /* 32-blocks a lane has in flight */
    FD_SMEM_MAX = 200 * 1024,
};

/* four E4M3 codes -> four f32 (exact) */
__device__ __forceinline__ float4 fd_e4m3x4(uint32_t v) {
    const float2 a = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3)));
    const float2 b = __half22float2(__half2(__nv_cvt_fp8x2_to_halfraw2(
        (__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3)));
    return make_float4(a.x, a.y, b.x, b.y);
}

/* E2M1 nibbles -> E4M3 bytes of value * 2^-6 (the E2M1 bits at the bottom
 * of the exponent and the top of the mantissa; subnormals included): the
 * low nibbles of w's bytes (elements 0, 2, 4, 6 of the word's eight) and
 * the high ones (1, 3, 5, 7) */
__device__ __forceinline__ uint32_t fd_lo(uint32_t w) {
    return ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t fd_hi(uint32_t w) {
    return ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
}

/* Shared memory of a token tile: xs[t] holds token t's k activation codes
 * as f32, each 32-block as 8 chunks of 4: chunk 2q the block's elements
 * 8q + 0, 2, 4, 6, chunk 2q + 1 elements 8q + 1, 3, 5, 7 (the order the
 * weights decode in), chunk c stored at c ^ (b % 8) so that the 8 lanes of a
 * quarter warp, reading 8 consecutive blocks, hit different banks; then
 * sas[t] the token's kbn scales. */
template <int TT>
__global__ void __launch_bounds__(FD_THREADS, 3)
    k_fp4_dec(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int64_t m, int64_t k,
              const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws, int64_t n,
              const int32_t *__restrict__ ids, const int32_t *__restrict__ off,
              const int32_t *__restrict__ rows, int lanes, void *__restrict__ out, int out_mode) {
    extern __shared__ float4 fd_raw[];
    pdl_enter();
    const int64_t kbn = k / 32, rowb = k / 2;
    float4 *xs = fd_raw;                          /* [TT, kbn, 8] float4 */
    float *sas = (float *)(fd_raw + TT * kbn * 8); /* [TT, kbn] */
    int64_t e = 0, base = 0, count = m;
    if (ids) {
        const int z = blockIdx.y;
        e = ids[z];
        base = off[z];
        count = off[z + 1] - base;
    }
    if (count <= 0) return; /* the whole block alike */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
    const int L = lanes, per = 32 / L, li = lane & (L - 1), sub = lane / L;
    const int64_t r0 = (int64_t)blockIdx.x * FD_PASSES * FD_WARPS * per;
    const uint8_t *we = w + e * n * rowb, *wse = ws + e * n * kbn;

    for (int64_t t0 = 0; t0 < count; t0 += TT) {
        const int tn = count - t0 < TT ? (int)(count - t0) : TT;
        if (t0 > 0) __syncthreads(); /* the last tile is read */
        for (int64_t i = tid; i < (int64_t)tn * (k / 8); i += FD_THREADS) {
            const int t = (int)(i / (k / 8));
            const int64_t j = i - (int64_t)t * (k / 8), b = j >> 2; /* 8 codes: block b, q = j % 4 */
            const int q = (int)(j & 3);
            const int64_t arow = rows ? rows[base + t0 + t] : t0 + t;
            const uint2 v = __ldg((const uint2 *)(qa + arow * k) + j);
            float4 *dst = xs + ((int64_t)t * kbn + b) * 8;
            dst[(2 * q) ^ (int)(b & 7)] = fd_e4m3x4(__byte_perm(v.x, v.y, 0x6420));
            dst[(2 * q + 1) ^ (int)(b & 7)] = fd_e4m3x4(__byte_perm(v.x, v.y, 0x7531));
        }
        for (int64_t i = tid; i < (int64_t)tn * kbn; i += FD_THREADS) {
            const int t = (int)(i / kbn);
            const int64_t arow = rows ? rows[base + t0 + t] : t0 + t;
            sas[i] = __ldg(sa + arow * kbn + (i - (int64_t)t * kbn));
        }
        __syncthreads();

        for (int p = 0; p < FD_PASSES; p++) {
            const int64_t r = r0 + (int64_t)(p * FD_WARPS + warp) * per + sub;
            const bool rv = r < n;
            const uint8_t *wr = we + (rv ? r : 0) * rowb, *sr = wse + (rv ? r : 0) * kbn;
            float acc[TT];
#pragma unroll
            for (int t = 0; t < TT; t++) acc[t] = 0.0f;
            for (int64_t b0 = li; b0 < kbn; b0 += FD_BATCH * L) {
                uint4 qv[FD_BATCH];
                uint32_t sb[FD_BATCH];
#pragma unroll
                for (int j = 0; j < FD_BATCH; j++) { /* the loads first: bytes in flight */
                    const int64_t b = b0 + (int64_t)j * L;
                    const bool ok = rv && b < kbn;
                    qv[j] = ok ? __ldg((const uint4 *)(wr + b * 16)) : make_uint4(0u, 0u, 0u, 0u);
                    sb[j] = ok ? __ldg(sr + b) : 0u;
                }
#pragma unroll
                for (int j = 0; j < FD_BATCH; j++) {
                    const int64_t b = b0 + (int64_t)j * L;
                    if (b >= kbn) break;
                    const uint32_t wq[4] = {qv[j].x, qv[j].y, qv[j].z, qv[j].w};
                    const int sw8 = (int)(b & 7);
                    float d[TT];
#pragma unroll
                    for (int t = 0; t < TT; t++) d[t] = 0.0f;
#pragma unroll
                    for (int q = 0; q < 4; q++) {
                        const float4 lo0 = fd_e4m3x4(fd_lo(wq[q])), hi0 = fd_e4m3x4(fd_hi(wq[q]));
#pragma unroll
                        for (int t = 0; t < TT; t++) {
                            if (t >= tn) break;
                            const float4 *xb = xs + ((int64_t)t * kbn + b) * 8;
                            const float4 xe = xb[(2 * q) ^ sw8], xo = xb[(2 * q + 1) ^ sw8];
                            float s = d[t];
                            s = fmaf(lo0.x, xe.x, s);
                            s = fmaf(lo0.y, xe.y, s);
                            s = fmaf(lo0.z, xe.z, s);
                            s = fmaf(lo0.w, xe.w, s);
                            s = fmaf(hi0.x, xo.x, s);
                            s = fmaf(hi0.y, xo.y, s);
                            s = fmaf(hi0.z, xo.z, s);
                            s = fmaf(hi0.w, xo.w, s);
                            d[t] = s;
                        }
                    }
                    const float fw = e8m0_to_f32(sb[j]);
#pragma unroll
                    for (int t = 0; t < TT; t++)
                        if (t < tn) acc[t] = fmaf(d[t] * 64.0f, sas[(int64_t)t * kbn + b] * fw, acc[t]);
                }
            }
#pragma unroll
            for (int t = 0; t < TT; t++)
                for (int o = L >> 1; o > 0; o >>= 1) acc[t] += __shfl_xor_sync(0xffffffffu, acc[t], o);
            if (rv && li == 0)
#pragma unroll
                for (int t = 0; t < TT; t++)
                    if (t < tn) store_out1(out, out_mode, (base + t0 + t) * n + r, acc[t]);
        }
    }
}

/* ---- the tensor-core kernel (k_fp4_mma) ----
 *
 * A warp owns 16 weight rows x a chunk of their 32-blocks and multiplies
 * each block on the tensor cores: thread (g, t) of the warp gets 4 code
 * bytes of rows g and g + 8 (bytes 4t .. 4t+3 of the block, elements 8t ..
 * 8t+7; ldmatrix hands them out of shared memory), turns them into e4m3
 * bytes of value * 2^-6 (two shifts and masks, as above) and into f16 pairs
 * (cvt, exact), and two m16n8k16 f16 mma.syncs with f32 accumulation take
 * the block's 32 products for 16 rows x 8 token slots. The order of k
 * inside a block is free as long as both operands use the same one: the A
 * registers hold elements (8t + {0,2}), (8t + {4,6}) in the first mma and
 * (8t + {1,3}), (8t + {5,7}) in the second, and the activations are stored
 * in the same order, once per thread block, as f16 of value * 2^6 (exact:
 * e4m3 times 64 is at most 28672 and at least 2^-3), so each product is
 * w · a exactly. Up to 8 tokens of a group cost one pass over the weights.
 *
 * Bytes in flight: the weights go through a ring of FM_ST batch slots per
 * warp by cp.async, FM_ST - 1 batches (2.4 KB each) ahead of the one being
 * multiplied, and a thread block walks nt row tiles of its expert in one
 * stream (the next tile's copies start while this one is multiplied). The
 * first copies are issued before the activation fill and, for a plain
 * product, before the wait on the kernel ahead (weights are constants).
 * First versions (MXFP4 runs 2-4): four blocks a thread in registers, then
 * a whole chunk by cp.async, each ~36-48 % of copy at b8 / b64 (latency:
 * one batch in flight a warp; then a block's start and end not
 * overlapped); the SASS of the loop counted ~77 instructions a block of 16
 * rows with per-copy address arithmetic, which the running pointers cut.
 *
 * Arithmetic, per (token, weight row): the block's 32 products are added by
 * the tensor cores (the bound's 2^-8 max|p| per block covers their adder,
 * as for the wgmma kernel); the block sum is promoted by fmaf(d, s_a · s_w,
 * acc) in ascending block order within a chunk of cb blocks, each chunk
 * from zero; the kc chunk sums are then added in chunk order. cb and kc
 * depend on k alone, and nothing depends on the other rows, the row or
 * token tiles or the grouping: a grouped row equals the plain product of
 * that row bit for bit. Roundings on any path: at most cb + kc - 1 <= kbn
 * of at most sum|terms| each (kc chunks of cb blocks, cb kc = kbn), inside
 * the bound's (kbn + 2) 2^-24 sum|p|. */
enum {
    FM_THREADS = 256,
    FM_WARPS = FM_THREADS / 32,
    FM_NB = 8,      /* 32-blocks a batch (one cp.async group, one ring slot) */
    FM_CB_MIN = 24, /* 32-blocks a chunk, at least, where the row is split (fm_cb) */
    FM_TR_MAX = 8,  /* token slots of an mma */
    FM_WG_TR_MAX = 16, /* token slots of the WG form's wgmma (n8, or n16 past 8 slots) */
    FM_NT_MAX = 8,  /* row tiles a block */
    FM_BLOCKS_SM = 2, /* blocks an SM: what the registers allow (126 a thread) */
    FM_A8_ROWS = 32,  /* batch rows per f16 slot past which a grouped product takes the A8 form (fm_slots) */
    FM_WG16_ROWS = 384, /* batch rows from which the WG form takes 16 token slots (fm_slots) */
    FM_ST_WG16 = 2,     /* ring stages a warp in the WG form's 16 slots (fm_slots) */
};

/* d = A x B (+ c): m16n8k16, f16 operands, f32 accumulation */
__device__ __forceinline__ void fm_mma(float d[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                       uint32_t b0, uint32_t b1, float c0, float c1, float c2, float c3) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%10,%11,%12,%13};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}

/* the two e4m3 codes in the low half of v -> an f16 pair (exact) */
__device__ __forceinline__ uint32_t fm_h2(uint32_t v) {
    const __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    return (uint32_t)h.x | ((uint32_t)h.y << 16);
}
/* the two e4m3 codes in the high half of v -> an f16 pair (exact): the
 * conversion reads the register's upper half itself (no shift) */
__device__ __forceinline__ uint32_t fm_h2_hi(uint32_t v) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\nmov.b32 {lo, hi}, %1;\ncvt.rn.f16x2.e4m3x2 %0, hi;\n}\n" : "=r"(r) : "r"(v));
    return r;
}
/* the same times 64 (exact: |e4m3| <= 448, 448 * 64 < 65504; the smallest
 * code 2^-9 becomes 2^-3, normal) */
__device__ __forceinline__ uint32_t fm_h2x64(uint32_t v) {
    const uint32_t h = fm_h2(v);
    uint32_t r;
    asm("mul.rn.f16x2 %0, %1, %2;\n" : "=r"(r) : "r"(h), "r"(0x54005400u));
    return r;
}

/* cp.async (16 bytes, through L2 only), its groups, and ldmatrix */
__device__ __forceinline__ void fm_cp16(uint32_t dst, const void *src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst), "l"(src) : "memory");
}
__device__ __forceinline__ void fm_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* wait until at most `pending` of this thread's groups are in flight (more
 * than 7 allowed waits for 7: only ever too early, never too late) */
__device__ __forceinline__ void fm_wait(int pending) {
    switch (pending) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    }
}
/* shared loads of data written before the loop's barrier (no ordering
 * against the ring's copies needed) */
__device__ __forceinline__ uint4 fm_lds4(uint32_t a) {
    uint4 v;
    asm("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(a));
    return v;
}
__device__ __forceinline__ float4 fm_lds4f(uint32_t a) {
    float4 v;
    asm("ld.shared.v4.f32 {%0,%1,%2,%3}, [%4];\n" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "r"(a));
    return v;
}
/* four 8 x 16-byte matrices (row addresses from lanes 8i .. 8i + 7 for
 * matrix i): thread (g, t) gets bytes 4t .. 4t + 3 of row g of each */
__device__ __forceinline__ void fm_ldsm4(uint32_t r[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr)
                 : "memory");
}

/* Shared memory, in order (FM_WARPS: the block's warps, fm_warps): ring
 * [FM_WARPS][FM_ST] slots of a batch (16
 * rows x 8 blocks of codes, rows FM_ROWB bytes apart: the 16-byte pad puts
 * the 8 rows an ldmatrix phase reads in distinct banks; then the 16 rows'
 * 8 scale bytes); swb [FM_WARPS][16][8] f32, the current batch's weight
 * scales; red [2][FM_WARPS][32] float4, the chunk sums of a row tile (two,
 * so that one barrier a tile suffices); xs [tr][kbn * 4 + 4] uint4 (token
 * slot q's block b, part t at q * xstride + 4b + t: the f16 pairs (0,2),
 * (4,6), (1,3), (5,7) of elements 8t + ..; the 64-byte pad puts slots q and
 * q + 1 in different banks), sas [tr][kbn] the slots' activation scales;
 * a table of the 256 E8M0 scales as f32.
 *
 * The A8 form keeps the activations as their e4m3 codes instead, [tr][kbn
 * * 2 + 2] uint4 (slot q's block b, part t: the 8 bytes of elements 8t +
 * 0, 2, 4, 6 and 8t + 1, 3, 5, 7 at q * xstride * 16 + 32b + 8t; the
 * 32-byte pad spreads a half warp's four slots over the banks), turned into
 * f16 pairs in the loop (four cvt a block, the inputs the f16 form stores)
 * without the factor 64: the mma then sums (w · 2^-6) · a, which the
 * scales stored times 64 put back (powers of two: the same products, the
 * same promotions). Half the bytes a slot: w1 (k = 5120) fits 8 slots for
 * two blocks an SM where the f16 form fits 5 (7 and 4 with a ring of
 * three stages). */
/* The WG form runs each 32-block on the warpgroup tensor cores instead:
 * one wgmma m64n8k32 (e4m3) a block for the 64 rows of a warpgroup (four
 * warps, each still streaming its own 16 rows through its ring), the
 * weights as the A operand straight from registers — the ldmatrix words
 * turned into e4m3 bytes by fd_lo / fd_hi and nothing more: no f16
 * conversion and no activation loads a block — and the activations as B
 * from shared memory. A thread's A registers hold rows g, g + 8 at k slots
 * 4t .. 4t + 3 (the even elements 8t + 0, 2, 4, 6 of word t) and 16 + 4t ..
 * 16 + 4t + 3 (the odd ones), so block b's activations sit as two 8 x 16
 * byte core matrices, the eight token slots' even elements and then their
 * odd ones, at xs + 256 b (no swizzle: LBO 128 between the two). Its
 * result has mma.sync's layout (rows g, g + 8 x slots 2t, 2t + 1), and the
 * promotion is the A8 form's (scales times 64). A block holds two
 * warpgroups, two 64-row tiles over the whole row (fm_cb_of). With 16
 * token slots (large batches, fm_slots) a block is an m64n16k32 wgmma: the
 * second eight slots' two core matrices follow the first's (SBO 256, a
 * block's activations 512 bytes), its results d[4..7] the same layout for
 * slots 8 + 2t, 9 + 2t, and the block has four warpgroups. The
 * tensor cores' FP8 adder sums a block's 32 products, under the bound the
 * tiled kernels' adder has; the bits are not the mma.sync form's
 * (fm_wg_pick says which form a launch takes). Nor always the tiled
 * prefill kernel's, although the adder and the promotion order are the
 * same: 0 of 2.1 M outputs differed in one probe, 2 of 24,000 under
 * another test's seed (runs 140 and 145 in docs/gpu-notes.md). */
enum { FM_ST = 2, FM_ST_MAX = 6, FM_ROWB = FM_NB * 16 + 16, FM_SLOT = 16 * FM_ROWB + 16 * FM_NB, FM_WG_BLK = 256 };
/* the WG form's slots a wgmma: 8, or 16 past 8 token slots (fm_slots);
 * and the warps of a block: 8, or 16 with 16 slots (one block an SM, whose
 * activations then serve four warpgroups) */
static int fm_wn(int tr) { return tr > 8 ? 16 : 8; }
static int fm_warps(bool wg, int tr) { return wg && fm_wn(tr) == 16 ? 2 * FM_WARPS : FM_WARPS; }
static size_t fm_smem(int tr, int64_t kbn, bool a8 = false, int st = FM_ST, bool wg = false) {
    const size_t xs = wg ? (size_t)kbn * FM_WG_BLK * (size_t)(fm_wn(tr) / 8)
                         : (size_t)tr * (size_t)(a8 ? kbn * 32 + 32 : kbn * 64 + 64);
    const size_t nw = (size_t)fm_warps(wg, tr);
    return nw * st * FM_SLOT + nw * 16 * FM_NB * 4 + 2 * nw * 32 * 16 + xs +
           (size_t)tr * (size_t)(kbn * 4) + 256 * 4;
}
__device__ __forceinline__ uint2 fm_lds2(uint32_t a) {
    uint2 v;
    asm("ld.shared.v2.b32 {%0,%1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(a));
    return v;
}
/* d = A x B from zero: m64n8k32 e4m3, A (this thread's four words) from
 * registers, B by its shared-memory descriptor (the WG form) */
__device__ __forceinline__ void fm_wgmma(float d[4], const uint32_t a[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %9, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1;\n}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
}

/* the same with 16 slots: m64n16k32, B two 8-slot halves SBO bytes apart */
__device__ __forceinline__ void fm_wgmma16(float d[8], const uint32_t a[4], uint64_t db) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %13, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 {%0, %1, %2, %3, %4, %5, %6, %7}, {%8, %9, %10, %11}, "
        "%12, p, 1, 1;\n}\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3]), "=f"(d[4]), "=f"(d[5]), "=f"(d[6]), "=f"(d[7])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(0));
}

/* A block: the rows of nt row tiles (a tile: 16 rows x rtn = FM_WARPS / kc,
 * each warp one chunk of a tile's rows) of one group's expert, for all of
 * the group's tokens. A warp streams its chunk of tile 0, then of tile 1,
 * .., one batch (16 rows x 4 blocks) at a time through a ring of FM_ST
 * slots: FM_ST - 1 batches are in flight while it multiplies one, across
 * the tiles, so the block's copies never stop at a tile's end (the block's
 * start, its activation fill and the chunk sums' barrier are paid once per
 * block or hidden behind copies in flight). */
/* Measuring aids (wrong results; bench_cuda_ops --fp4aid): NOCONV, the
 * code words go to the mma as they are, no conversion; NOPROMO, the block
 * sums are added without the scales (no products of scales, no table
 * lookups); NOMATH, the warps only copy and wait (no ldmatrix, mma or
 * promotion). */
enum { FM_F_NOCONV = 1, FM_F_NOPROMO = 2, FM_F_NOMATH = 4 };

/* Which rows a block takes. A launch's work is pieces = groups x halves
 * (the two products of a pair) of tiles row tiles each. bp == 0: a grid of
 * (bx * halves, groups) blocks of nt tiles (the last of a piece fewer),
 * block x = half * bx + i. bp > 0: a 1-D grid of pieces x bp blocks, every
 * piece's tiles dealt into bp runs of base + 1 (the first ex) or base
 * tiles, the longer runs of every piece first in launch order (piece p =
 * group * halves + half): see fm_go for why. */
struct fm_grid {
    int bx, nt;                                /* bp == 0 */
    int bp, base, ex, pieces, halves;          /* bp > 0 */
};

/* The SwiGLU input of a down product (k_fp4_mma's SW form): the pair's
 * outputs g and u [pairs, k] (f32), the routing weights pw [pairs], and
 * moe_swiglu_val's rounding and limit. */
struct fm_swiglu {
    const float *g, *u, *pw;
    int in_bf16;
    float limit;
};

/* SW: the activations are the MoE's SwiGLU of the pair's outputs, formed
 * and quantized in the token tile's fill rather than read as codes (the
 * down product's input; see cuda_launch_fp4_dec_swiglu). */
template <bool A8, int F, bool SW = false, bool WG = false, int WN = 8>
__global__ void __launch_bounds__(WN == 16 ? 2 * FM_THREADS : FM_THREADS, WN == 16 ? 1 : FM_BLOCKS_SM)
    k_fp4_mma(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int64_t m, int64_t k,
              const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws, int64_t n,
              const int32_t *__restrict__ ids, const int32_t *__restrict__ off,
              const int32_t *__restrict__ rows, int tr, int cb, int kc, fm_grid gr, int st, void *__restrict__ out,
              int out_mode, const uint8_t *__restrict__ w_b, const uint8_t *__restrict__ ws_b,
              void *__restrict__ out_b, fm_swiglu sw) {
    extern __shared__ uint4 fm_raw[];
    constexpr int NT = WN == 16 ? 2 * FM_THREADS : FM_THREADS, NW = NT / 32; /* fm_warps */
    /* this block's piece (product of a pair, group) and row tiles; a pair
     * launch's second product has the same activations, routing and shape */
    int half, z, ntb;
    int64_t tile0;
    if (gr.bp == 0) {
        int bxi = (int)blockIdx.x;
        half = bxi >= gr.bx;
        bxi -= half * gr.bx;
        z = (int)blockIdx.y;
        tile0 = (int64_t)bxi * gr.nt;
        ntb = gr.nt;
    } else {
        int L = (int)blockIdx.x, p, j;
        const int big = gr.pieces * gr.ex, small = gr.bp - gr.ex;
        if (L < big) {
            p = L / gr.ex;
            j = L - p * gr.ex;
            tile0 = (int64_t)j * (gr.base + 1);
            ntb = gr.base + 1;
        } else {
            L -= big;
            p = L / small;
            j = L - p * small;
            tile0 = (int64_t)gr.ex * (gr.base + 1) + (int64_t)j * gr.base;
            ntb = gr.base;
        }
        z = p / gr.halves;
        half = p - z * gr.halves;
    }
    if (half) {
        w = w_b;
        ws = ws_b;
        out = out_b;
    }
    const int kbn = (int)(k / 32), xstride = WG ? 0 : A8 ? kbn * 2 + 2 : kbn * 4 + 4; /* uint4 a slot */
    const int64_t rowb = k / 2;
    uint8_t *ring_all = (uint8_t *)fm_raw;
    float *swb_all = (float *)(ring_all + (size_t)NW * st * FM_SLOT);
    float4 *red = (float4 *)(swb_all + NW * 16 * FM_NB);
    uint4 *xs = (uint4 *)(red + 2 * NW * 32);
    constexpr int WBLK = FM_WG_BLK * (WN / 8); /* a 32-block's activations in the WG form */
    float *sas = WG ? (float *)((uint8_t *)xs + (size_t)kbn * WBLK) : (float *)(xs + (size_t)tr * xstride);
    float *e8m0_tab = sas + (size_t)tr * kbn; /* [256] the E8M0 scales as f32 */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    /* units: warps (a 16-row tile each) or, in the WG form, warpgroups (a
     * 64-row tile, each warp 16 of its rows at wrow) */
    constexpr int UNITS = WG ? NW / 4 : NW, TH = WG ? 64 : 16;
    const int unit = WG ? warp >> 2 : warp, wrow = WG ? (warp & 3) * 16 : 0;
    const int rtn = UNITS / kc, rt = unit / kc, c = unit - rt * kc;
    e8m0_tab[tid & 255] = e8m0_to_f32(tid & 255); /* read after the fill's barrier */
    const bool live = rt < rtn; /* warps past rtn * kc only join the barriers */
    const int64_t tiles = (n + TH * rtn - 1) / (TH * rtn);
    const int ntl = (int)(tiles - tile0 < ntb ? tiles - tile0 : ntb); /* this block's tiles */
    const int b0 = c * cb, b1 = b0 + cb < kbn ? b0 + cb : kbn;
    const int nbat = live ? (b1 - b0) / FM_NB : 0, items = nbat * ntl;
    uint8_t *ring = ring_all + (size_t)warp * st * FM_SLOT;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    float *swb = swb_all + warp * 16 * FM_NB;

    /* batch copies: 16 rows x 8 blocks = 128 16-byte copies, four a lane
     * (rows lane / 8 + 4i, block lane % 8), and the 16 rows' 8 scale bytes,
     * 4 a lane (row lane / 2, half lane % 2). Running pointers and slot
     * (instructions, not DRAM, bound the loop: addresses are computed once
     * a tile). */
    const int cr = lane >> 3, cq = lane & 7;
    const uint8_t *wexp = NULL, *sexp = NULL; /* the expert's chunk column */
    const uint8_t *ip = NULL, *ips = NULL;
    uint32_t iv = 0, ivs = 0;    /* row r of the copies valid: bit r / 4 (0 past row n - 1: nothing read) */
    int it_tile = 0, it_bat = 0; /* the next item to issue */
    const uint32_t ring_end = ring_s + st * FM_SLOT, d0 = cr * FM_ROWB + cq * 16;
    const uint32_t ds = 16 * FM_ROWB + 4 * lane;
    const uint32_t row4 = (uint32_t)(4 * rowb);
    uint32_t islot = ring_s;
    /* the weights are read once where the tokens fit one token tile (the
     * plain product's m is known now, a group's count after the wait) */
    uint64_t wpol = l2_weight_policy(m <= tr);
    auto point = [&](int64_t e) {
        wexp = w + e * n * rowb + (int64_t)(b0 + cq) * 16;
        sexp = ws + e * n * kbn + b0 + 4 * (lane & 1);
    };
    auto tile_rows = [&]() { /* the issue pointers of tile it_tile */
        const int64_t r = ((tile0 + it_tile) * rtn + rt) * TH + wrow;
        ip = wexp + (r + cr) * rowb;
        ips = sexp + (r + (lane >> 1)) * kbn;
        iv = (r + cr < n) | (r + cr + 4 < n) << 1 | (r + cr + 8 < n) << 2 | (r + cr + 12 < n) << 3;
        ivs = r + (lane >> 1) < n ? 4 : 0;
    };
    auto issue_next = [&]() {
        if (it_tile < ntl) {
#pragma unroll
            for (int h = 0; h < 4; h++)
                asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(islot + d0 + 4 * h * FM_ROWB),
                             "l"(ip + h * row4), "r"((iv >> h) & 1 ? 16 : 0), "l"(wpol)
                             : "memory");
            asm volatile("cp.async.ca.shared.global.L2::cache_hint [%0], [%1], 4, %2, %3;\n" ::"r"(islot + ds), "l"(ips), "r"(ivs),
                         "l"(wpol) : "memory");
            ip += FM_NB * 16;
            ips += FM_NB;
            if (++it_bat == nbat) {
                it_bat = 0;
                if (++it_tile < ntl) tile_rows();
            }
        }
        fm_commit(); /* one group an item, empty past the last: uniform counts */
        islot = islot + FM_SLOT == ring_end ? ring_s : islot + FM_SLOT;
    };
    auto prologue = [&]() {
        it_tile = 0;
        it_bat = 0;
        islot = ring_s;
        if (nbat) {
            tile_rows();
            for (int s = 0; s < st - 1; s++) issue_next();
        }
    };
    if (!ids) { /* a plain product's weights: constants, before the wait */
        point(0);
        prologue();
    }
    grid_dep_wait();
    int64_t base = 0, count = m;
    if (ids) {
        base = off[z];
        count = off[z + 1] - base;
        wpol = l2_weight_policy(count <= tr);
        if (count > 0 && ntl > 0) {
            point(ids[z]);
            prologue();
        }
    }
    grid_dep_launch();
    if (count <= 0 || ntl <= 0) return; /* the whole block alike */

    /* ldmatrix rows: lanes 8i .. 8i + 7 address matrix i = (rows 0-7 | 8-15)
     * x (block 2j | 2j + 1) */
    const uint32_t lsm = (((lane >> 3) & 1) * 8 + (lane & 7)) * FM_ROWB + (lane >> 4) * 16;

    for (int64_t t0 = 0; t0 < count; t0 += tr) {
        const int tn = count - t0 < tr ? (int)(count - t0) : tr;
        if (t0 > 0) {
            __syncthreads(); /* the last tile's activations are read */
            if (nbat) prologue(); /* the weights again (a second token tile) */
        }
        for (int q = 0; q < tn; q++) {
            const int64_t arow = rows ? rows[base + t0 + q] : t0 + q;
            uint4 *dst = xs + (size_t)q * xstride;
            auto put = [&](int j, uint2 v) { /* elements 8j .. 8j + 7 as codes, byte 0 first */
                const uint32_t ev = __byte_perm(v.x, v.y, 0x6420), od = __byte_perm(v.x, v.y, 0x7531);
                if (WG) { /* block j / 4's two core matrices of slot q's half, its row q % 8, k slots 4 (j % 4) .. */
                    uint8_t *bb = (uint8_t *)xs + (size_t)(j >> 2) * WBLK + (q >> 3) * FM_WG_BLK + (q & 7) * 16 + 4 * (j & 3);
                    *(uint32_t *)bb = ev;
                    *(uint32_t *)(bb + 128) = od;
                } else if (A8)
                    ((uint2 *)dst)[j] = make_uint2(ev, od);
                else
                    dst[j] = make_uint4(fm_h2x64(ev), fm_h2x64(ev >> 16), fm_h2x64(od), fm_h2x64(od >> 16));
            };
            if (SW) {
                /* pair row arow's SwiGLU, quantized per 32 as k_moe_swiglu_quant
                 * does it (the same functions: the same values, codes and
                 * scales): four threads a block, whole warps a round (k % 256
                 * == 0), as aq_quant8's shuffles need */
                const float *gp = sw.g + arow * k, *up = sw.u + arow * k;
                const float pwv = sw.pw[arow];
                /* two rounds' loads issued before either's arithmetic (w2's
                 * k = 2,304 is 288 items: one pass of the loop, one wait) */
                for (int j0 = tid; j0 < kbn * 4; j0 += 2 * NT) {
                    const int j1 = j0 + NT;
                    const bool two = j1 < kbn * 4; /* alike in a warp */
                    float v[2][8], uv[2][8];
                    aq_load8(gp + 8 * j0, v[0]);
                    aq_load8(up + 8 * j0, uv[0]);
                    if (two) {
                        aq_load8(gp + 8 * j1, v[1]);
                        aq_load8(up + 8 * j1, uv[1]);
                    }
#pragma unroll
                    for (int h = 0; h < 2; h++) {
                        if (h && !two) break;
                        const int j = h ? j1 : j0;
#pragma unroll
                        for (int i = 0; i < 8; i++)
                            v[h][i] = moe_swiglu_val(v[h][i], uv[h][i], pwv, sw.in_bf16, sw.limit);
                        uint2 cv;
                        const float s = aq_quant8(v[h], &cv);
                        put(j, cv);
                        if ((j & 3) == 0) sas[q * kbn + (j >> 2)] = A8 || WG ? s * 64.f : s;
                    }
                }
            } else {
                const uint2 *src = (const uint2 *)(qa + arow * k);
                for (int j = tid; j < kbn * 4; j += NT) put(j, __ldg(src + j));
                /* A8 and WG: times 64 (exact; an activation scale is at most FLT_MAX / 448) */
                const float *ss = sa + arow * kbn;
                for (int j = tid; j < kbn; j += NT)
                    sas[q * kbn + j] = A8 || WG ? __ldg(ss + j) * 64.f : __ldg(ss + j);
            }
        }
        if (WG) asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); /* wgmma reads B */
        __syncthreads();

        /* shared addresses of this thread's activations and scales at the
         * chunk's start, advanced a batch at a time (slots past tn read slot
         * tn - 1: their sums are never stored) */
        const uint4 *xq = xs + (size_t)(g < tn ? g : tn - 1) * xstride;
        const uint32_t xa0 = (uint32_t)__cvta_generic_to_shared(
            WG ? (const void *)((const uint8_t *)xs + (size_t)b0 * WBLK)
               : A8 ? (const void *)((const uint2 *)xq + t + 4 * b0) : (const void *)(xq + t + 4 * b0));
        const uint32_t sa00 = (uint32_t)__cvta_generic_to_shared(sas + (2 * t < tn ? 2 * t : tn - 1) * kbn + b0);
        const uint32_t sa10 = (uint32_t)__cvta_generic_to_shared(sas + (2 * t + 1 < tn ? 2 * t + 1 : tn - 1) * kbn + b0);
        /* the second half's slots 8 + 2t, 8 + 2t + 1 (WN = 16) */
        const uint32_t sa20 = (uint32_t)__cvta_generic_to_shared(sas + (8 + 2 * t < tn ? 8 + 2 * t : tn - 1) * kbn + b0);
        const uint32_t sa30 = (uint32_t)__cvta_generic_to_shared(sas + (9 + 2 * t < tn ? 9 + 2 * t : tn - 1) * kbn + b0);
        uint32_t xa = xa0, sa0 = sa00, sa1 = sa10, sa2 = sa20, sa3 = sa30;
        float acc0 = 0.f, acc1 = 0.f, acc2 = 0.f, acc3 = 0.f, acc4 = 0.f, acc5 = 0.f, acc6 = 0.f, acc7 = 0.f;
        int tile = 0, bi = 0;
        uint32_t cslot = 0; /* item j's slot, bytes past ring */
        for (int j = 0; j < items; j++) {
            __syncwarp(); /* every lane is done with the slot refilled next */
            issue_next();
            fm_wait(st - 1); /* this lane's copies of item j */
            __syncwarp();       /* and the other lanes' */
            if (!(F & (FM_F_NOPROMO | FM_F_NOMATH))) { /* the batch's 128 scale bytes -> f32 by the table: lane l bytes 4l .. 4l + 3 */
                const uint32_t sb = *(const uint32_t *)(ring + cslot + 16 * FM_ROWB + 4 * lane);
                *(float4 *)(swb + 4 * lane) = make_float4(e8m0_tab[sb & 0xff], e8m0_tab[(sb >> 8) & 0xff],
                                                          e8m0_tab[(sb >> 16) & 0xff], e8m0_tab[sb >> 24]);
            }
            __syncwarp();
#pragma unroll
            for (int hh = 0; hh < 2 && !(F & FM_F_NOMATH); hh++) { /* blocks 4hh .. 4hh + 3 of the batch */
                uint32_t qv[8];
                fm_ldsm4(qv, ring_s + cslot + lsm + 64 * hh);
                fm_ldsm4(qv + 4, ring_s + cslot + lsm + 64 * hh + 32);
                const float4 fa4 = fm_lds4f(sa0 + 16 * hh), fb4 = fm_lds4f(sa1 + 16 * hh);
                const float4 wa4 = *(const float4 *)(swb + g * FM_NB + 4 * hh);
                const float4 wb4 = *(const float4 *)(swb + (g + 8) * FM_NB + 4 * hh);
                const float fa[4] = {fa4.x, fa4.y, fa4.z, fa4.w}, fb[4] = {fb4.x, fb4.y, fb4.z, fb4.w};
                const float sw0[4] = {wa4.x, wa4.y, wa4.z, wa4.w}, sw1[4] = {wb4.x, wb4.y, wb4.z, wb4.w};
                if constexpr (WG) {
                    /* the blocks on the warpgroup's tensor cores, GB at a time,
                     * then their promotion (the A registers stay untouched, and
                     * live, until the wait); every slot's blocks promoted in
                     * ascending order either way. With 16 slots two at a time:
                     * four blocks' 32 result registers, with the 16 of their A
                     * operands, spilled at the 128 a thread that 16 warps
                     * leave (ptxas: 40 bytes of stack; 0 with two) */
                    constexpr int GB = WN == 16 ? 2 : 4;
#pragma unroll
                    for (int j0 = 0; j0 < 4; j0 += GB) {
                        uint32_t a[GB][4];
                        float d[GB][WN / 2];
#pragma unroll
                        for (int i = 0; i < GB; i++) {
                            const uint32_t wa = qv[2 * (j0 + i)], wb = qv[2 * (j0 + i) + 1];
                            a[i][0] = fd_lo(wa);
                            a[i][1] = fd_lo(wb);
                            a[i][2] = fd_hi(wa);
                            a[i][3] = fd_hi(wb);
                        }
                        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
                        for (int i = 0; i < GB; i++) {
                            /* block 4hh + j0 + i: its core matrices 128 bytes apart
                             * along k, the 16-slot form's two halves 256 apart */
                            const uint64_t db = make_desc(xa + (uint32_t)((4 * hh + j0 + i) * WBLK), 128, 256, 0);
                            if constexpr (WN == 16) fm_wgmma16(d[i], a[i], db);
                            else fm_wgmma(d[i], a[i], db);
                        }
                        asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
                        asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
                        for (int i = 0; i < GB; i++) {
                            asm volatile("" : "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
                                         : "r"(a[i][0]), "r"(a[i][1]), "r"(a[i][2]), "r"(a[i][3])
                                         : "memory");
                            if constexpr (WN == 16)
                                asm volatile("" : "+f"(d[i][4]), "+f"(d[i][5]), "+f"(d[i][6]), "+f"(d[i][7])::"memory");
                        }
#pragma unroll
                        for (int i = 0; i < GB; i++) {
                            const int jj = j0 + i;
                            acc0 = fmaf(d[i][0], fa[jj] * sw0[jj], acc0);
                            acc1 = fmaf(d[i][1], fb[jj] * sw0[jj], acc1);
                            acc2 = fmaf(d[i][2], fa[jj] * sw1[jj], acc2);
                            acc3 = fmaf(d[i][3], fb[jj] * sw1[jj], acc3);
                        }
                        if constexpr (WN == 16) { /* slots 8 + 2t, 9 + 2t: their columns d[4..7] */
                            const float4 fc4 = fm_lds4f(sa2 + 16 * hh), fd4 = fm_lds4f(sa3 + 16 * hh);
                            const float fc[4] = {fc4.x, fc4.y, fc4.z, fc4.w}, fd[4] = {fd4.x, fd4.y, fd4.z, fd4.w};
#pragma unroll
                            for (int i = 0; i < GB; i++) {
                                const int jj = j0 + i;
                                acc4 = fmaf(d[i][4], fc[jj] * sw0[jj], acc4);
                                acc5 = fmaf(d[i][5], fd[jj] * sw0[jj], acc5);
                                acc6 = fmaf(d[i][6], fc[jj] * sw1[jj], acc6);
                                acc7 = fmaf(d[i][7], fd[jj] * sw1[jj], acc7);
                            }
                        }
                    }
                } else {
#pragma unroll
                    for (int jj = 0; jj < 4; jj++) {
                        uint4 x;
                        if (A8) {
                            const uint2 x8 = fm_lds2(xa + (4 * hh + jj) * 32);
                            x = make_uint4(fm_h2(x8.x), fm_h2_hi(x8.x), fm_h2(x8.y), fm_h2_hi(x8.y));
                        } else {
                            x = fm_lds4(xa + (4 * hh + jj) * 64);
                        }
                        const uint32_t wa = qv[2 * jj], wb = qv[2 * jj + 1];
                        float d[4];
                        if (F & FM_F_NOCONV) {
                            fm_mma(d, wa, wb, wa ^ 1u, wb ^ 1u, x.x, x.y, 0.f, 0.f, 0.f, 0.f);
                            fm_mma(d, wa ^ 2u, wb ^ 2u, wa ^ 3u, wb ^ 3u, x.z, x.w, d[0], d[1], d[2], d[3]);
                        } else {
                            const uint32_t la = fd_lo(wa), ha = fd_hi(wa), lb = fd_lo(wb), hb = fd_hi(wb);
                            fm_mma(d, fm_h2(la), fm_h2(lb), fm_h2_hi(la), fm_h2_hi(lb), x.x, x.y, 0.f, 0.f, 0.f,
                                   0.f);
                            fm_mma(d, fm_h2(ha), fm_h2(hb), fm_h2_hi(ha), fm_h2_hi(hb), x.z, x.w, d[0], d[1],
                                   d[2], d[3]);
                        }
                        if (F & FM_F_NOPROMO) {
                            acc0 += d[0];
                            acc1 += d[1];
                            acc2 += d[2];
                            acc3 += d[3];
                        } else {
                            acc0 = fmaf(d[0], fa[jj] * sw0[jj], acc0);
                            acc1 = fmaf(d[1], fb[jj] * sw0[jj], acc1);
                            acc2 = fmaf(d[2], fa[jj] * sw1[jj], acc2);
                            acc3 = fmaf(d[3], fb[jj] * sw1[jj], acc3);
                        }
                    }
                }
            }
            cslot = cslot + FM_SLOT == st * FM_SLOT ? 0 : cslot + FM_SLOT;
            xa += FM_NB * (WG ? WBLK : A8 ? 32 : 64);
            sa0 += FM_NB * 4;
            sa1 += FM_NB * 4;
            sa2 += FM_NB * 4;
            sa3 += FM_NB * 4;
            if (++bi == nbat) { /* the tile's chunk is done */
                bi = 0;
                xa = xa0;
                sa0 = sa00;
                sa1 = sa10;
                sa2 = sa20;
                sa3 = sa30;
                if (kc > 1) { /* the chunk sums to warp c = 0 (kc alike in the whole block) */
                    if (c > 0) red[((tile & 1) * NW + warp) * 32 + lane] = make_float4(acc0, acc1, acc2, acc3);
                    __syncthreads();
                }
                if (c == 0) {
                    for (int h = 1; h < kc; h++) { /* chunk order */
                        const float4 p = red[((tile & 1) * NW + warp + h * (NW / UNITS)) * 32 + lane];
                        acc0 += p.x;
                        acc1 += p.y;
                        acc2 += p.z;
                        acc3 += p.w;
                    }
                    const int64_t r = ((tile0 + tile) * rtn + rt) * TH + wrow + g, o0 = base + t0 + 2 * t;
                    if (2 * t < tn) {
                        if (r < n) store_out1(out, out_mode, o0 * n + r, acc0);
                        if (r + 8 < n) store_out1(out, out_mode, o0 * n + r + 8, acc2);
                    }
                    if (2 * t + 1 < tn) {
                        if (r < n) store_out1(out, out_mode, (o0 + 1) * n + r, acc1);
                        if (r + 8 < n) store_out1(out, out_mode, (o0 + 1) * n + r + 8, acc3);
                    }
                    if (WN == 16 && 8 + 2 * t < tn) {
                        if (r < n) store_out1(out, out_mode, (o0 + 8) * n + r, acc4);
                        if (r + 8 < n) store_out1(out, out_mode, (o0 + 8) * n + r + 8, acc6);
                    }
                    if (WN == 16 && 9 + 2 * t < tn) {
                        if (r < n) store_out1(out, out_mode, (o0 + 9) * n + r, acc5);
                        if (r + 8 < n) store_out1(out, out_mode, (o0 + 9) * n + r + 8, acc7);
                    }
                }
                acc0 = acc1 = acc2 = acc3 = acc4 = acc5 = acc6 = acc7 = 0.f;
                tile++;
            }
        }
        if (!nbat && kc > 1) /* idle warps: one barrier a tile, as the others */
            for (int h = 0; h < ntl; h++) __syncthreads();
    }
}

/* 32-blocks a chunk: the row's batches of FM_NB blocks dealt into kc equal
 * chunks, kc the largest of 8, 4, 2 that divides them leaving at least
 * FM_CB_MIN blocks a chunk, else 1 (the whole row). Every warp of a block
 * then has a chunk (rtn = FM_WARPS / kc row tiles side by side) and all
 * chunks are equally long, so no warp idles or waits at a tile's barrier
 * for a longer one, and kc = 1 needs no barrier at all: w1 (k 5120) 4
 * chunks of 40 blocks, w2 (k 2304) one of 72. Before, chunks of 24 (w1: 7,
 * the last 16 long, the 8th warp idle; w2: 3, two warps idle) left the
 * warps ~38 % of their cycles at that barrier (ncu, aid run 1 in
 * docs/gpu-notes.md). Depends on k alone (the bits do); k % 256 == 0
 * where this kernel runs. */
static int fm_cb_24 = 0; /* measuring aid (cuda_fp4_dec_set_aid 8): the rule before, chunks of 24 blocks */
static int fm_cb(int64_t kbn) {
    if (fm_cb_24) {
        int64_t cb = (kbn + FM_WARPS - 1) / FM_WARPS;
        cb = (cb + FM_NB - 1) / FM_NB * FM_NB;
        return (int)(cb < FM_CB_MIN ? FM_CB_MIN : cb);
    }
    const int64_t nb = kbn / FM_NB;
    for (int kc = FM_WARPS; kc > 1; kc /= 2)
        if (nb % kc == 0 && nb / kc * FM_NB >= FM_CB_MIN) return (int)(kbn / kc);
    return (int)kbn;
}

/* The WG form (cuda_fp4_dec_set_wg; DI_CUDA_FP4_WG=0 in the environment
 * keeps the mma.sync form): whether it may run. Its chunk is the whole
 * row at every k (a row's blocks promoted in ascending order from zero),
 * the form runs 140-146 in docs/gpu-notes.md measured. */
static int fm_wg_forced = -1;
extern "C" void cuda_fp4_dec_set_wg(int on) { fm_wg_forced = on == 0 || on == 1 ? on : -1; }
static bool fm_wg_on(void) {
    static int env = -1;
    return fm_wg_forced >= 0 ? fm_wg_forced != 0 : cuda_env_switch("DI_CUDA_FP4_WG", &env) != 0;
}
static int fm_cb_of(int64_t kbn, bool wg) { return wg ? (int)kbn : fm_cb(kbn); }

/* measuring aid: 0 runs the CUDA-core kernel where the tensor-core one
 * would (cuda_fp4_dec_set_mma; DI_CUDA_FP4_MMA=0 in the environment), -1
 * back to the environment */
static int fm_mma_forced = -1;
extern "C" void cuda_fp4_dec_set_mma(int on) { fm_mma_forced = on; }
static int fm_mma_on(void) {
    static int env = -1;
    return fm_mma_forced >= 0 ? fm_mma_forced : cuda_env_switch("DI_CUDA_FP4_MMA", &env);
}

/* Lanes per weight row: the most (up to 32) that divide the row's blocks,
 * so no lane idles at the row's end; 32 with a few idle where that would be
 * under 8 on a long row. Depends on k alone (the bits do). */
static int fd_lanes(int64_t kbn) {
    int L = 32;
    while (L > 1 && kbn % L) L >>= 1;
    if (L < 8 && kbn >= 64) L = 32;
    return L;
}

static size_t fd_smem(int tt, int64_t k) { return (size_t)tt * (size_t)(k / 32) * (8 * 16 + 4); }


template <int TT>
static cudaError_t fd_go(dim3 grid, int64_t k, const uint8_t *qa, const float *sa, int64_t m,
                         const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                         const int32_t *off, const int32_t *rows, int lanes, void *out,
                         int out_mode, cudaStream_t stream) {
    static size_t attr = 0; /* the shared memory the kernel is allowed so far */
    const size_t smem = fd_smem(TT, k);
    if (smem > 48 * 1024 && smem > attr) {
        cudaError_t e = cudaFuncSetAttribute(k_fp4_dec<TT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)smem);
        if (e != cudaSuccess) return e;
        attr = smem;
    }
    cuda_launch_pdl(k_fp4_dec<TT>, grid, dim3(FD_THREADS), smem, stream, qa, sa, m, k, w, ws, n, ids,
                    off, rows, lanes, out, out_mode);
    return cudaGetLastError();
}

/* Token slots a tile. A group with more tokens than slots streams its
 * weights once per tile, and the mma computes 8 token columns whatever the
 * count, so slots cost nothing but shared memory: only the group's own
 * tokens are filled, slots past them read the last one and are never
 * stored. Two blocks an SM is what the registers allow
 * (__launch_bounds__(FM_THREADS, FM_BLOCKS_SM)), so a tile takes as many slots as the
 * batch could put in one group (max_rows for a grouped product, m for a
 * plain one), up to FM_TR_MAX and as many as keep two blocks' shared memory
 * within an SM's: w1 (k 5120) 5, w2 (k 2304) 8 in the f16 form (with the
 * ring of FM_ST = 2 stages; 4 and 8 with 3). A grouped product whose batch
 * is more than FM_A8_ROWS times the slots its f16 form fits takes the A8
 * form where that fits more (w1: 8; 7 with 3 stages). The model's top-6 of
 * 384 puts batch / 64 tokens in a group on average: a group streams its
 * weights once more for every 5 tokens in w1's f16 form and every 8 in the
 * A8 form, whose conversions cost ~7 % a pass, so the A8 form pays from ~3
 * tokens a group on average. Measured (runs 112-113 in docs/gpu-notes.md,
 * the w1 + w3 pair, uniform routing, f16 / A8): batch 96 -7 %, 128 -3 to
 * -9 %, 160 -3 %, 192 +1-2 %, 224 +10 %, 256 +12 %, 320 +22 %; the model's
 * own routing (less even) had batch 192 3 % faster with the A8 form. So
 * the A8 form past 32 rows a slot (w1: batch > 160); with 16 (before run
 * 113) batches 81-160 took it too. Up to 16 rows the f16 form
 * always, as for the plain products the grouped ones must equal. (Before:
 * ceil(max_rows / 16) slots up to 4, one at batch 8, where a group of two
 * tokens streamed its weights twice; pair run 1: w2 b8 146 -> 126 us, b256
 * 1429 -> 1060.) */
static int fm_nt_forced = 0; /* measuring aid: row tiles a block (the blocks of nt before balancing) */
extern "C" void cuda_fp4_dec_set_nt(int nt) { fm_nt_forced = nt >= 1 && nt <= FM_NT_MAX ? nt : 0; }
static int fm_bal = 1; /* measuring aid: 0 blocks of ceil(tiles / places) tiles at every size (fm_go) */
extern "C" void cuda_fp4_dec_set_bal(int on) { fm_bal = on != 0; }
static int fm_places_forced = 0; /* for tests: SMs the block count plans for (0: the device's) */
extern "C" void cuda_fp4_dec_set_places(int sms) { fm_places_forced = sms > 0 ? sms : 0; }
static int fm_tr_forced = 0; /* measuring aid: 1 .. FM_TR_MAX forces it (up to FM_WG_TR_MAX in the WG form) */
extern "C" void cuda_fp4_dec_set_tr(int tr) { fm_tr_forced = tr >= 1 && tr <= FM_WG_TR_MAX ? tr : 0; }
static int fm_a8_forced = -1; /* measuring aid: 0 the f16 form, 1 the A8 form, -1 chosen */
extern "C" void cuda_fp4_dec_set_a8(int on) { fm_a8_forced = on == 0 || on == 1 ? on : -1; }
static int fm_aid = 0; /* measuring aid: FM_F_* flags (the f16 form; wrong results) */
/* flags 1, 2, 4: FM_F_*; 8: the chunk rule before (right results, other bits) */
extern "C" void cuda_fp4_dec_set_aid(int flags) {
    fm_aid = flags >= 0 && flags < 16 ? flags & 7 : 0;
    fm_cb_24 = flags >= 0 && flags < 16 && (flags & 8);
}
/* the most slots up to want that two blocks an SM fit (each block's
 * dynamic memory plus the 1 KB the runtime reserves a block), at least 1 */
static int fm_fit(int64_t kbn, int64_t want, bool a8, int st, bool wg = false) {
    int64_t tr = want < 1 ? 1 : want > FM_TR_MAX ? FM_TR_MAX : want;
    while (tr > 1 && FM_BLOCKS_SM * (fm_smem((int)tr, kbn, a8, st, wg) + 1024) > cuda_sm_smem()) tr--;
    return (int)tr;
}
/* FM_A8_ROWS, or DI_CUDA_FP4_A8_ROWS (measuring aid: 16 is the rule before
 * run 113; the form changes no bits) */
static int fm_a8_rows(void) {
    static long env = LONG_MIN;
    const long r = cuda_env_long("DI_CUDA_FP4_A8_ROWS", 0, &env);
    return r > 0 ? (int)r : FM_A8_ROWS;
}
static int fm_st_forced = 0; /* measuring aid: ring stages a warp */
extern "C" void cuda_fp4_dec_set_st(int st) { fm_st_forced = st >= 2 && st <= FM_ST_MAX ? st : 0; }
struct fm_plan {
    int tr;
    bool a8;
    int st;
    bool wg;
};
/* FM_WG16_ROWS, or DI_CUDA_FP4_WG16_ROWS (measuring aid; 0 never): the
 * batch rows from which the WG form takes 16 token slots (fm_slots) */
static int64_t fm_wg16_rows(void) {
    static long env = LONG_MIN;
    const long r = cuda_env_long("DI_CUDA_FP4_WG16_ROWS", FM_WG16_ROWS, &env);
    return r > 0 ? r : -1;
}
/* Ring stages a warp: FM_ST = 2, one batch in flight while the warp
 * multiplies the other. Deeper rings measured no faster: at batch 1 the
 * w1 + w3 pair took 36.4 / 36.7 / 37.9 us with 2 / 3 / 4 stages, w2 21.5 /
 * 22.1 / 22.8 (fp4st run 1, docs/gpu-notes.md): one batch in flight a warp
 * already covers the memory's latency, the kernel is bound by its
 * instructions. The shared memory a third stage took holds token slots
 * instead (fm_fit counts the stages): w1's f16 form 5 instead of 4, its A8
 * form 8 instead of 7, so fewer groups of a large batch stream their
 * weights twice (bal run 1 and st run 1 in docs/gpu-notes.md). */
static int fm_stages(void) { return fm_st_forced ? fm_st_forced : FM_ST; }
/* Whether the WG form can run at k: its eight slots leave two blocks an SM */
static bool fm_wg_applies(int64_t kbn) {
    return fm_wg_on() && FM_BLOCKS_SM * (fm_smem(FM_TR_MAX, kbn, true, fm_stages(), true) + 1024) <= cuda_sm_smem();
}
/* Which form a launch over `groups` experts takes. The WG form's work
 * units are four times the mma.sync form's (64 rows over the whole row
 * against 32 rows over a quarter of it at w1), so few pieces (groups x
 * products of a pair) balance worse: measured (fp4wg run 1 in
 * docs/gpu-notes.md, one H200, the w1 + w3 pair, mma.sync / WG) batch 1
 * 33-41 / 32-34 us, 8 197-220 / 256-266 (94 pieces on 264 block places: a
 * second partial wave), 64 987-1022 / 895-899, 256 1841-1853 / 1583-1597;
 * w2 (one product a group) at 64 494-576 / 515-571, the same. So the WG form
 * from as many groups as half the block places (where the pair's pieces
 * fill them), by the group count alone so that a pair launch and its two
 * single launches take the same form (the same bits). Batch-invariant mode
 * keeps the mma.sync form at every batch (one form, whatever the batch: k
 * alone decides there). */
static int64_t fm_places(int bps);
static bool fm_wg_pick(int64_t kbn, int64_t groups) {
    if (!fm_wg_applies(kbn)) return false;
    if (fm_wg_forced == 1) return true;
    return !cuda_batch_invariant() && 2 * groups >= fm_places(FM_BLOCKS_SM);
}
/* The WG form's slots: eight whatever the count (they cost no memory), or
 * 16 from FM_WG16_ROWS batch rows. A group of more tokens than slots
 * streams its expert's weights once a token tile, and the model's top-6 of
 * 384 puts batch / 64 tokens in a group on average: at batch 1,024 most
 * groups took two or three 8-slot tiles. 16 slots are an m64n16k32 wgmma
 * (twice the promotions a block) and 80 KB of activations a block at w1,
 * so one block an SM, of 16 warps (four warpgroups sharing the copy; with
 * 8 warps it was slower than the 8-slot form at 256-512 and ~2 % faster at
 * 1,024: each warp's chain of batches, no other block to hide it). Measured (runs 149-150 in
 * docs/gpu-notes.md, the 6-layer dummy, ms a step, 8 slots / 16): batch
 * 256 25.4-25.6 / 26.9, 384 32.7-32.8 / 32.1, 512 41.4-41.5 / 38.1-39.1,
 * 768 57.3-58.3 / 51.1-52.9, 1,024 73.9-76.0 / 67.3-68.9. Which slots a
 * tile has changes no bits (the tests compare 1, 8, 12 and 16). */
static fm_plan fm_slots(int64_t kbn, int64_t m, int64_t max_rows, int grouped, bool wg) {
    const int64_t want = grouped ? max_rows : m;
    const int st = fm_stages();
    if (wg) {
        const int64_t r16 = fm_wg16_rows();
        const int most = r16 > 0 && want >= r16 ? FM_WG_TR_MAX : FM_TR_MAX;
        fm_plan p = {(int)(want < 1 ? 1 : want > most ? most : want), false, st, true};
        if (fm_tr_forced) p.tr = fm_tr_forced;
        if (p.tr > 8) p.st = fm_st_forced ? fm_st_forced : FM_ST_WG16;
        return p;
    }
    fm_plan p = {fm_fit(kbn, want, false, st), false, st, false};
    const int trf = fm_tr_forced > FM_TR_MAX ? FM_TR_MAX : fm_tr_forced;
    if (fm_a8_forced >= 0) p.a8 = fm_a8_forced == 1;
    else if (grouped && max_rows > 16 && max_rows > (int64_t)fm_a8_rows() * p.tr && p.tr < FM_TR_MAX &&
             fm_fit(kbn, want, true, st) > p.tr)
        p.a8 = true;
    if (p.a8) p.tr = fm_fit(kbn, want, true, st);
    if (trf) p.tr = trf;
    return p;
}

/* Whether the tensor-core form takes k: whole batches of 4 blocks (the
 * scale words and float4 reads), 4-byte aligned scales, at least one token
 * slot within shared memory. */
static bool fm_applies(int64_t k, const uint8_t *ws) {
    return fm_mma_on() && k % 256 == 0 && (uintptr_t)ws % 4 == 0 &&
           fm_smem(1, k / 32) <= FD_SMEM_MAX;
}

int cuda_fp4_dec_applies(const uint8_t *qa, const uint8_t *w, const uint8_t *ws, int64_t k) {
    if (!(k > 0 && k % 32 == 0 && (uintptr_t)qa % 16 == 0 && (uintptr_t)w % 16 == 0)) return 0;
    if (fm_applies(k, ws)) return 2;
    return fd_smem(2, k) <= FD_SMEM_MAX;
}

/* Row tiles of a product of n rows (FM_WARPS / kc tiles of 16 side by side
 * a block; in the WG form two of 64, four with 16 slots: warps / 4), block
 * places of the device (bps blocks an SM), and the waves of blocks a launch
 * of pieces x tiles takes (fm_go). */
static int64_t fm_tiles(int64_t kbn, int64_t n, bool wg, int warps = FM_WARPS) {
    const int cb = fm_cb_of(kbn, wg), kc = (int)((kbn + cb - 1) / cb), rtn = (wg ? warps / 4 : warps) / kc;
    const int th = wg ? 64 : 16;
    return (n + th * rtn - 1) / (th * rtn);
}
static int64_t fm_places(int bps) {
    return (int64_t)bps * (fm_places_forced ? fm_places_forced : cuda_sm_count());
}
static int64_t fm_waves(int64_t tiles, int64_t pieces, int bps = FM_BLOCKS_SM) {
    const int64_t places = fm_places(bps);
    return (tiles * pieces + places * FM_NT_MAX - 1) / (places * FM_NT_MAX);
}

/* Blocks an SM a launch gets: FM_BLOCKS_SM where their memory fits (smem
 * bytes a block plus the 1 KB the runtime reserves a block), else 1; the
 * WG form's 16 slots always 1 (a block of 16 warps). */
static int fm_bps(const fm_plan &pl, size_t smem) {
    if (pl.wg && fm_wn(pl.tr) == 16) return 1;
    return (size_t)FM_BLOCKS_SM * (smem + 1024) <= (size_t)cuda_sm_smem() ? FM_BLOCKS_SM : 1;
}

/* One launch of the tensor-core kernel; w_b != NULL adds the pair's second
 * product (blocks bx .. 2 bx - 1). */
static cudaError_t fm_go(fm_plan pl, const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                         const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                         const int32_t *off, int groups, const int32_t *rows, void *out, int out_mode,
                         const uint8_t *w_b, const uint8_t *ws_b, void *out_b, cudaStream_t stream,
                         const fm_swiglu *sw = NULL) {
    const int64_t kbn = k / 32;
    const int cb = fm_cb_of(kbn, pl.wg), kc = (int)((kbn + cb - 1) / cb);
    int tr = pl.tr, st = pl.st;
    while (st > 2 && fm_smem(tr, kbn, pl.a8, st, pl.wg) > FD_SMEM_MAX) st--;
    while (tr > 1 && fm_smem(tr, kbn, pl.a8, st, pl.wg) > FD_SMEM_MAX) tr--;
    const size_t smem = fm_smem(tr, kbn, pl.a8, st, pl.wg);
    const int bps = fm_bps(fm_plan{tr, pl.a8, st, pl.wg}, smem);
    /* the two forms, the f16 form's measuring aids, the two forms on a
     * SwiGLU input */
    decltype(&k_fp4_mma<false, 0>) const kerns[] = {
        k_fp4_mma<false, 0>,      k_fp4_mma<true, 0>,       k_fp4_mma<false, 1>,
        k_fp4_mma<false, 2>,      k_fp4_mma<false, 3>,      k_fp4_mma<false, 4>,
        k_fp4_mma<false, 0, true>, k_fp4_mma<true, 0, true>, k_fp4_mma<true, 0, false, true>,
        k_fp4_mma<true, 0, true, true>, k_fp4_mma<true, 0, false, true, 16>, k_fp4_mma<true, 0, true, true, 16>};
    static size_t attr[sizeof kerns / sizeof *kerns]; /* the shared memory each is allowed so far */
    const int ki = pl.wg ? 8 + (sw ? 1 : 0) + (fm_wn(tr) == 16 ? 2 : 0)
                   : sw  ? 6 + (int)pl.a8
                   : fm_aid ? (fm_aid & FM_F_NOMATH ? 5 : fm_aid + 1)
                            : (int)pl.a8;
    auto kern = kerns[ki];
    if (smem > 48 * 1024 && smem > attr[ki]) {
        cudaError_t e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
        if (e != cudaSuccess) return e;
        attr[ki] = smem;
    }
    /* Row tiles a block: every block of every piece (group, and product of
     * a pair) resident at once where FM_NT_MAX tiles a block allow,
     * FM_BLOCKS_SM an SM (the empty groups of the op's form end at once). A
     * second partial wave doubled a small product's time: at batch 1 the
     * pair's 1,728 tiles in blocks of 5 were 348 blocks for 264 places.
     * Where one wave cannot hold them all (the pair past batch 1), the
     * launch takes as many whole waves as it needs and deals each piece's
     * tiles evenly over the blocks they hold, the longer blocks first (the
     * block scheduler starts blocks in launch order, so the longest
     * start earliest): at batch 8 the pair's 6,912 tiles go in 1,056
     * blocks of 7 and 6 instead of 864 of 8 (3.3 waves, the last a third
     * full), 213-215 -> 200-207 us, w1 alone 125 -> 106 us (bal runs 1-2
     * in docs/gpu-notes.md). Within one wave the even deal measured slower
     * (batch 1, pair 33.8-35.0 -> 32.9-35.7 us, w1 alone 19.1-20.2 ->
     * 20.4-21.4): more blocks share an SM (264 against 216), and a block's
     * time is its chain of tiles. Which block computes a tile does not
     * change its bits. */
    const int halves = w_b ? 2 : 1;
    const int64_t tiles = fm_tiles(kbn, n, pl.wg, fm_warps(pl.wg, tr));
    const int64_t places = fm_places(bps);
    const int64_t pieces = (int64_t)groups * halves;
    const int64_t waves = fm_waves(tiles, pieces, bps);
    fm_grid gr = {0, 0, 0, 0, 0, (int)pieces, halves};
    dim3 grid;
    if (fm_bal && !fm_nt_forced && waves > 1) {
        int64_t bp = waves * places / pieces;
        const int64_t lo = (tiles + FM_NT_MAX - 1) / FM_NT_MAX;
        bp = bp < lo ? lo : bp > tiles ? tiles : bp;
        if (pieces * bp > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        gr.bp = (int)bp;
        gr.base = (int)(tiles / bp);
        gr.ex = (int)(tiles % bp);
        grid = dim3((unsigned)(pieces * bp), 1u);
    } else {
        int64_t nt = fm_nt_forced ? fm_nt_forced : (tiles * pieces + places - 1) / places;
        nt = nt < 1 ? 1 : nt > FM_NT_MAX ? FM_NT_MAX : nt;
        const int64_t bx = (tiles + nt - 1) / nt;
        if (bx * halves > 0x7fffffffLL) return cudaErrorInvalidConfiguration;
        gr.bx = (int)bx;
        gr.nt = (int)nt;
        grid = dim3((unsigned)(bx * halves), (unsigned)groups);
    }
    const fm_swiglu swv = sw ? *sw : fm_swiglu{NULL, NULL, NULL, 0, 0.f};
    cuda_launch_pdl(kern, grid, dim3(32 * fm_warps(pl.wg, tr)), smem, stream, qa, sa, m, k, w, ws, n, ids, off, rows, tr, cb, kc,
                    gr, st, out, out_mode, w_b, ws_b, out_b, swv);
    return cudaGetLastError();
}

di_status cuda_launch_fp4_dec(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                              const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                              const int32_t *off, int32_t ngroups, const int32_t *rows,
                              int32_t max_rows, void *out, int out_mode, cudaStream_t stream,
                              di_err *err) {
    if (!cuda_fp4_dec_applies(qa, w, ws, k))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4 (decode form): k = %lld (a multiple of 32 up to %d) and "
                          "16-byte aligned codes and weights needed",
                          (long long)k, (int)(FD_SMEM_MAX / (2 * (8 * 16 + 4)) * 32));
    const int groups = ids ? ngroups : 1;
    if (groups <= 0 || n <= 0 || (!ids && m <= 0)) return DI_OK;
    if (groups > 65535)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 (decode form): %d groups (at most 65535)",
                          (int)groups);
    if (fm_applies(k, ws))
        return cuda_check(fm_go(fm_slots(k / 32, m, max_rows, ids != NULL, fm_wg_pick(k / 32, groups)), qa, sa, m, k,
                                w, ws, n, ids, off, groups,
                                rows, out, out_mode, NULL, NULL, NULL, stream),
                          err, "gemm_mxfp4 (decode form)");
    const int lanes = fd_lanes(k / 32);
    const int64_t per_block = (int64_t)FD_PASSES * FD_WARPS * (32 / lanes);
    const int64_t bx = (n + per_block - 1) / per_block;
    if (bx > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 (decode form): n = %lld rows", (long long)n);
    const dim3 grid((unsigned)bx, (unsigned)groups);
    const int64_t most = ids ? max_rows : m;
    cudaError_t e = most >= 2
                        ? fd_go<2>(grid, k, qa, sa, m, w, ws, n, ids, off, rows, lanes, out, out_mode, stream)
                        : fd_go<1>(grid, k, qa, sa, m, w, ws, n, ids, off, rows, lanes, out, out_mode, stream);
    return cuda_check(e, err, "gemm_mxfp4 (decode form)");
}

di_status cuda_launch_fp4_dec_pair(const uint8_t *qa, const float *sa, int64_t k, const uint8_t *w,
                                   const uint8_t *ws, const uint8_t *w_b, const uint8_t *ws_b, int64_t n,
                                   const int32_t *ids, const int32_t *off, int32_t ngroups,
                                   const int32_t *rows, int32_t max_rows, void *out, void *out_b,
                                   int out_mode, cudaStream_t stream, di_err *err) {
    if (!(ids && cuda_fp4_dec_applies(qa, w, ws, k) == 2 && cuda_fp4_dec_applies(qa, w_b, ws_b, k) == 2))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4 pair (decode form): needs the tensor-core kernel (k = %lld a multiple "
                          "of 256, aligned operands) and routing arrays",
                          (long long)k);
    if (ngroups <= 0 || n <= 0) return DI_OK;
    if (ngroups > 65535)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 pair (decode form): %d groups (at most 65535)",
                          (int)ngroups);
    return cuda_check(fm_go(fm_slots(k / 32, 0, max_rows, 1, fm_wg_pick(k / 32, ngroups)), qa, sa, 0, k,
                            w, ws, n, ids, off, ngroups, rows, out, out_mode, w_b, ws_b, out_b, stream),
                      err, "gemm_mxfp4 pair (decode form)");
}

int cuda_fp4_dec_swiglu_pays(int64_t pair_k, int64_t k, int32_t ngroups, int32_t max_rows) {
    if (!(pair_k % 32 == 0 && pair_k > 0 && ngroups > 0)) return 0;
    const int64_t kbn = pair_k / 32;
    const fm_plan pl = fm_slots(kbn, 0, max_rows, 1, fm_wg_pick(kbn, ngroups));
    const int bps = fm_bps(pl, fm_smem(pl.tr, kbn, pl.a8, pl.st, pl.wg));
    return fm_waves(fm_tiles(kbn, k, pl.wg, fm_warps(pl.wg, pl.tr)), 2 * (int64_t)ngroups, bps) == 1;
}

di_status cuda_launch_fp4_dec_swiglu(const float *g, const float *u, const float *pw, int in_bf16, float limit,
                                     int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n, const int32_t *ids,
                                     const int32_t *off, int32_t ngroups, const int32_t *rows, int32_t max_rows,
                                     void *out, int out_mode, cudaStream_t stream, di_err *err) {
    if (!(ids && g && u && pw && (uintptr_t)g % 16 == 0 && (uintptr_t)u % 16 == 0 &&
          cuda_fp4_dec_applies((const uint8_t *)g, w, ws, k) == 2))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4 on SwiGLU (decode form): needs the tensor-core kernel (k = %lld a multiple "
                          "of 256, aligned operands) and routing arrays",
                          (long long)k);
    if (ngroups <= 0 || n <= 0) return DI_OK;
    if (ngroups > 65535)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4 on SwiGLU (decode form): %d groups (at most 65535)",
                          (int)ngroups);
    const fm_swiglu sw = {g, u, pw, in_bf16, limit};
    return cuda_check(fm_go(fm_slots(k / 32, 0, max_rows, 1, fm_wg_pick(k / 32, ngroups)), NULL, NULL, 0, k, w, ws, n,
                            ids, off, ngroups, rows, out, out_mode, NULL, NULL, NULL, stream, &sw),
                      err, "gemm_mxfp4 on SwiGLU (decode form)");
}
