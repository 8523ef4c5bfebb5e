/* Decode matrix-vector products on the checkpoint's own weight formats
 * (architecture.md §2 "FP8 linear" and "FP4 expert linear", §8.3):
 *   FP8 e4m3 weights with 32x32 E8M0 block scales, and
 *   MXFP4 weights (packed E2M1, one E8M0 scale per row and 32 inputs),
 * both against FP8-quantized activations with one f32 scale per 32 inputs.
 *
 * Why tensor cores for a memory-bound op: at m = 16 a CUDA-core version would
 * need 16 FMAs per weight byte, about twice what the H200's FP32 units can do
 * at full memory speed. On the streamed path (whole 32-blocks, aligned rows)
 * an mma.sync m16n8k32 (e4m3) takes 16 weight rows x 8 tokens x one 32-block;
 * the any-shape path takes 16 tokens x 8 weight rows. Each mma starts from
 * zero and its result is promoted into an fp32 accumulator with the block's
 * two scales (exact powers of two), which is the reference's
 * sum_b s_a s_w (q_a . q_w).
 *
 * The order of k inside a 32-block is free as long as both operands use the
 * same one, so each lane loads 8 contiguous bytes of a row (a whole 32-byte
 * sector per 4 lanes) and the activation fragment is loaded in the matching
 * order. MXFP4 codes become e4m3 bytes with two shifts and masks: placing the
 * E2M1 bits at the bottom of the e4m3 exponent and the top of its mantissa
 * gives exactly value * 2^-6 (subnormals included), and the 2^6 goes back in
 * at the end.
 *
 * The same kernel serves any m (a grid row per 8 or 16 tokens), so it is also
 * the fallback GEMM for shapes the tiled kernel does not take. Decode shapes
 * with k % 128 == 0 and 16-byte aligned operands take the wgmma kernels
 * further down instead (FP8 mma.sync is not native on Hopper: see there). */
#include <stdlib.h>

#include "backend/cuda/cuda_act_quant.cuh"
#include "backend/cuda/cuda_common.cuh"
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_tma.cuh"
#include "backend/cuda/cuda_gemm_grouped.h"
#include "backend/cuda/cuda_fp4_dec.h"

#define MV_THREADS 128
#define MV_WARPS 4

__device__ __forceinline__ void mma_e4m3_16832(float d[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                               uint32_t a3, uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%10,%10,%10,%10};\n"
        : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(0.0f));
}

/* n bytes p[off .. off+n) of a row of `len` bytes, little-endian into one
 * word, zero past the end (the any-shape path: no alignment assumed). */
__device__ __forceinline__ uint32_t load_bytes(const uint8_t *__restrict__ p, int64_t off,
                                               int64_t len, int nbytes) {
    uint32_t v = 0;
    for (int i = 0; i < nbytes; i++)
        if (off + i < len) v |= (uint32_t)__ldg(p + off + i) << (8 * i);
    return v;
}
__device__ __forceinline__ uint2 load8(const uint8_t *__restrict__ p, int64_t off, int64_t len,
                                       bool valid) {
    if (!valid) return make_uint2(0, 0);
    return make_uint2(load_bytes(p, off, len, 4), load_bytes(p, off + 4, len, 4));
}

/* E2M1 nibbles -> e4m3 bytes of value * 2^-6: the low nibbles of w's bytes
 * (even elements) and the high nibbles (odd elements). */
__device__ __forceinline__ uint32_t fp4_lo_to_e4m3(uint32_t w) {
    return ((w << 2) & 0x1c1c1c1cu) | ((w << 4) & 0x80808080u);
}
__device__ __forceinline__ uint32_t fp4_hi_to_e4m3(uint32_t w) {
    return ((w >> 2) & 0x1c1c1c1cu) | (w & 0x80808080u);
}

/* ---- any-shape path (k not a multiple of 32, unaligned buffers) ----
 *
 * One warp: 8 weight rows [n0, n0+8) x 16 activation rows [m0, m0+16) over
 * the 32-blocks [kb0, kb1), one block per step, byte loads guarded against
 * the row ends. Lane (g = lane/4, t = lane%4) accumulates
 * acc[0..1] = out[m0+g][n0+2t .. +1], acc[2..3] = out[m0+g+8][n0+2t .. +1]. */
__device__ __forceinline__ void warp_fp8_any(const uint8_t *__restrict__ qa,
                                             const float *__restrict__ sa, int64_t m, int64_t k,
                                             const uint8_t *__restrict__ w,
                                             const uint8_t *__restrict__ ws, int64_t n,
                                             int64_t m0, int64_t n0, int64_t kb0, int64_t kb1,
                                             int lane, float acc[4]) {
    const int g = lane >> 2, t = lane & 3;
    const int64_t kbn = (k + 31) / 32;
    const int64_t ra = m0 + g, rb = m0 + g + 8, rn = n0 + g;
    const bool va = ra < m, vb = rb < m, vn = rn < n;
    const uint8_t *pa = qa + (va ? ra : 0) * k, *pb = qa + (vb ? rb : 0) * k;
    const uint8_t *pw = w + (vn ? rn : 0) * k;
    const float *psa = sa + (va ? ra : 0) * kbn, *psb = sa + (vb ? rb : 0) * kbn;
    const uint8_t *pws = ws + (n0 / 32) * kbn;
    for (int64_t b = kb0; b < kb1; b++) {
        const int64_t off = b * 32 + 8 * t;
        uint2 bw = load8(pw, off, k, vn), xa = load8(pa, off, k, va), xb = load8(pb, off, k, vb);
        float fw = e8m0_to_f32(__ldg(pws + b));
        float s0 = va ? __ldg(psa + b) * fw : 0.0f, s1 = vb ? __ldg(psb + b) * fw : 0.0f;
        float d[4];
        mma_e4m3_16832(d, xa.x, xb.x, xa.y, xb.y, bw.x, bw.y);
        acc[0] = fmaf(d[0], s0, acc[0]);
        acc[1] = fmaf(d[1], s0, acc[1]);
        acc[2] = fmaf(d[2], s1, acc[2]);
        acc[3] = fmaf(d[3], s1, acc[3]);
    }
}

/* MXFP4 rows are k/2 bytes, a 32-block 16 bytes: lane t holds the codes of
 * elements [8t, 8t+8) (4 bytes), the activation bytes of the same elements
 * are split even/odd to match the two nibble halves, and each lane needs the
 * per-row weight scales of its two output columns. */
__device__ __forceinline__ void warp_fp4_any(const uint8_t *__restrict__ qa,
                                             const float *__restrict__ sa, int64_t m, int64_t k,
                                             const uint8_t *__restrict__ w,
                                             const uint8_t *__restrict__ ws, int64_t n,
                                             int64_t m0, int64_t n0, int64_t kb0, int64_t kb1,
                                             int lane, float acc[4]) {
    const int g = lane >> 2, t = lane & 3;
    const int64_t kbn = (k + 31) / 32, rowb = k / 2;
    const int64_t ra = m0 + g, rb = m0 + g + 8, rn = n0 + g;
    const int64_t c0 = n0 + 2 * t, c1 = c0 + 1;
    const bool va = ra < m, vb = rb < m, vn = rn < n, v0 = c0 < n, v1 = c1 < n;
    const uint8_t *pa = qa + (va ? ra : 0) * k, *pb = qa + (vb ? rb : 0) * k;
    const uint8_t *pw = w + (vn ? rn : 0) * rowb;
    const float *psa = sa + (va ? ra : 0) * kbn, *psb = sa + (vb ? rb : 0) * kbn;
    const uint8_t *pws0 = ws + (v0 ? c0 : 0) * kbn, *pws1 = ws + (v1 ? c1 : 0) * kbn;
    for (int64_t b = kb0; b < kb1; b++) {
        const uint32_t wq = vn ? load_bytes(pw, b * 16 + 4 * t, rowb, 4) : 0u;
        const int64_t off = b * 32 + 8 * t;
        uint2 xa = load8(pa, off, k, va), xb = load8(pb, off, k, vb);
        float fa = va ? __ldg(psa + b) : 0.0f, fb = vb ? __ldg(psb + b) : 0.0f;
        float w0 = v0 ? e8m0_to_f32(__ldg(pws0 + b)) : 0.0f;
        float w1 = v1 ? e8m0_to_f32(__ldg(pws1 + b)) : 0.0f;
        float d[4];
        mma_e4m3_16832(d, __byte_perm(xa.x, xa.y, 0x6420), __byte_perm(xb.x, xb.y, 0x6420),
                       __byte_perm(xa.x, xa.y, 0x7531), __byte_perm(xb.x, xb.y, 0x7531),
                       fp4_lo_to_e4m3(wq), fp4_hi_to_e4m3(wq));
        acc[0] = fmaf(d[0], fa * w0, acc[0]);
        acc[1] = fmaf(d[1], fa * w1, acc[1]);
        acc[2] = fmaf(d[2], fb * w0, acc[2]);
        acc[3] = fmaf(d[3], fb * w1, acc[3]);
    }
#pragma unroll
    for (int i = 0; i < 4; i++) acc[i] *= 64.0f; /* codes were read as value * 2^-6 */
}

/* ---- fast path: weights streamed through a per-warp shared-memory ring ----
 *
 * Each warp copies its 16 weight rows in chunks of MV_CHUNK bytes per row (8
 * FP8 blocks or 16 MXFP4 blocks) with cp.async: a warp instruction moves two
 * whole 256-byte row segments, and the copies in flight cost no registers, so
 * MV_STAGES - 1 chunks (12 KB per warp) stay in flight while the tensor cores
 * work on the current one. (512-byte chunks were faster on the largest
 * matrix and slower on the expert-sized ones, which dominate decode.) Rows
 * are padded by 16 bytes so the fragment reads hit distinct banks. */
#define MV_STAGES 4
#define MV_CHUNK 256              /* bytes of each row per copy step */
#define MV_ROW (MV_CHUNK + 16)   /* padded: row r starts 4 banks after row r-1 */
#define MV_ROWS 16                /* weight rows per warp */
#define MV_STAGE_BYTES (MV_ROWS * MV_ROW)
#define MV_SMEM (MV_WARPS * MV_STAGES * MV_STAGE_BYTES)

/* Which activation row feeds token slot j of a launch and which output row
 * receives it: the identity for a plain product; for a grouped (MoE) one,
 * slot j of group z is pair base + j, reading activation rows[base + j]. */
struct TokMap {
    const int32_t *rows; /* NULL: identity */
    int64_t base, count;
    __device__ __forceinline__ bool valid(int64_t j) const { return j < count; }
    __device__ __forceinline__ int64_t arow(int64_t j) const {
        return rows ? rows[base + j] : j;
    }
    __device__ __forceinline__ int64_t orow(int64_t j) const { return base + j; }
};

/* Operands swapped (weights = the mma's 16-row A operand, activations =
 * its 8-column B operand): an m16n8k32 consumes 16 weight rows per 32-block,
 * twice the bytes of the other orientation, so the instructions per weight
 * byte halve; decode batches up to 8 fill the 8 columns. A warp covers
 * weight rows [n0, n0+16) and tokens [m0, m0+8); lane (g, t) accumulates
 * acc[0..1] = out[m0+2t .. +1][n0+g], acc[2..3] = out[m0+2t .. +1][n0+g+8]. */
template <int FMT>
__device__ __forceinline__ void warp_pipe(const uint8_t *__restrict__ qa,
                                          const float *__restrict__ sa, int64_t m, int64_t k,
                                          const uint8_t *__restrict__ w,
                                          const uint8_t *__restrict__ ws, int64_t n,
                                          const TokMap &tm, int64_t m0, int64_t n0, int64_t kb0,
                                          int64_t kb1, int lane, uint8_t *ring, float acc[4]) {
    constexpr int BPB = FMT == 0 ? 32 : 16; /* weight bytes per row per 32-block */
    constexpr int CH = MV_CHUNK / BPB;      /* blocks per chunk */
    const int g = lane >> 2, t = lane & 3;
    const int64_t kbn = (k + 31) / 32, rowb = FMT == 0 ? k : k / 2;
    /* B operand: token slot m0 + g; scales of the output slots m0 + 2t, m0 + 2t + 1 */
    const int64_t tok = m0 + g, t0 = m0 + 2 * t, t1 = t0 + 1;
    const bool vt = tm.valid(tok), v0 = tm.valid(t0), v1 = tm.valid(t1);
    const uint8_t *pb = qa + (vt ? tm.arow(tok) : 0) * k;
    const float *ps0 = sa + (v0 ? tm.arow(t0) : 0) * kbn, *ps1 = sa + (v1 ? tm.arow(t1) : 0) * kbn;
    /* weight scales: FP8 one row per 32 weight rows (n0 % 16 == 0, so all 16
     * rows share it); MXFP4 one per row, rows n0 + g and n0 + g + 8 */
    const int64_t ra = n0 + g, rb = n0 + g + 8;
    const bool wa = ra < n, wb = rb < n;
    const uint8_t *pwa = FMT == 0 ? ws + (n0 / 32) * kbn : ws + (wa ? ra : 0) * kbn;
    const uint8_t *pwb = ws + (wb ? rb : 0) * kbn;

    /* scales as vectors when every group starts 8-aligned inside aligned rows
     * (the kernel rounds the k ranges to multiples of 8 blocks) */
    const bool vec = kbn % 8 == 0 && kb0 % 8 == 0 && (uintptr_t)sa % 32 == 0 &&
                     (uintptr_t)ws % 8 == 0;
    /* copy plan: piece q = lane + 32 i is row q / P, bytes [16 (q % P), +16) */
    constexpr int P = MV_CHUNK / 16;
    const uint32_t ring_s = (uint32_t)__cvta_generic_to_shared(ring);
    const int64_t end = kb1 * BPB; /* bytes of each row this warp reads */
    const int nch = (int)((kb1 - kb0 + CH - 1) / CH);
    auto issue = [&](int c) {
        if (c < nch) {
            const uint32_t st = ring_s + (c % MV_STAGES) * MV_STAGE_BYTES;
#pragma unroll
            for (int i = 0; i < MV_ROWS * P / 32; i++) {
                int q = lane + 32 * i, row = q / P, col = (q % P) * 16;
                int64_t off = (kb0 + (int64_t)c * CH) * BPB + col;
                bool ok = n0 + row < n && off < end;
                const uint8_t *src = w + (ok ? (n0 + row) * rowb + off : 0);
                cp_async16(st + row * MV_ROW + col, src, ok);
            }
        }
        asm volatile("cp.async.commit_group;\n" ::);
    };
#pragma unroll
    for (int c = 0; c < MV_STAGES - 1; c++) issue(c);
    for (int c = 0; c < nch; c++) {
        asm volatile("cp.async.wait_group %0;\n" ::"n"(MV_STAGES - 2));
        __syncwarp();
        const uint8_t *sta = ring + (c % MV_STAGES) * MV_STAGE_BYTES + g * MV_ROW;
        const uint8_t *stb = sta + 8 * MV_ROW;
        /* groups of 8 blocks, branch-free: loads past kb1 are predicated off
         * (and the copy zero-filled those weight bytes), so the compiler can
         * issue all of a group's loads before the first mma */
#pragma unroll 1
        for (int gb = 0; gb < CH; gb += 8) {
            const int64_t b0 = kb0 + (int64_t)c * CH + gb;
            uint2 x[8];
            float f0[8], f1[8], s0[8], s1[8];
            if (vec) {
                /* the group's 8 scales of a row are 8 aligned consecutive values
                 * inside the row: two 16-byte and one 8-byte load instead of 8 */
                /* a group that starts inside the range ends inside the row
                 * (b0 % 8 == 0, kbn % 8 == 0); one past it reads nothing */
                const bool any = b0 < kb1;
                const float4 z4 = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                const float4 a0 = any && v0 ? __ldg((const float4 *)(ps0 + b0)) : z4;
                const float4 a1 = any && v0 ? __ldg((const float4 *)(ps0 + b0) + 1) : z4;
                const float4 c0 = any && v1 ? __ldg((const float4 *)(ps1 + b0)) : z4;
                const float4 c1 = any && v1 ? __ldg((const float4 *)(ps1 + b0) + 1) : z4;
                const uint2 wsa =
                    any && (FMT == 0 || wa) ? __ldg((const uint2 *)(pwa + b0)) : make_uint2(0, 0);
                const uint2 wsb = FMT == 1 && any && wb ? __ldg((const uint2 *)(pwb + b0)) : wsa;
                const float fa[8] = {a0.x, a0.y, a0.z, a0.w, a1.x, a1.y, a1.z, a1.w};
                const float fc[8] = {c0.x, c0.y, c0.z, c0.w, c1.x, c1.y, c1.z, c1.w};
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int64_t b = b0 + u;
                    const bool in = b < kb1;
                    x[u] = in && vt ? __ldg((const uint2 *)(pb + b * 32 + 8 * t)) : make_uint2(0, 0);
                    f0[u] = in ? fa[u] : 0.0f;
                    f1[u] = in ? fc[u] : 0.0f;
                    const uint32_t ba = (u < 4 ? wsa.x : wsa.y) >> (8 * (u & 3)) & 0xffu;
                    const uint32_t bb2 = (u < 4 ? wsb.x : wsb.y) >> (8 * (u & 3)) & 0xffu;
                    s0[u] = in && (FMT == 0 || wa) ? e8m0_to_f32(ba) : 0.0f;
                    s1[u] = FMT == 1 ? (in && wb ? e8m0_to_f32(bb2) : 0.0f) : s0[u];
                }
            } else {
#pragma unroll
                for (int u = 0; u < 8; u++) {
                    const int64_t b = b0 + u;
                    const bool in = b < kb1;
                    x[u] = in && vt ? __ldg((const uint2 *)(pb + b * 32 + 8 * t)) : make_uint2(0, 0);
                    f0[u] = in && v0 ? __ldg(ps0 + b) : 0.0f;
                    f1[u] = in && v1 ? __ldg(ps1 + b) : 0.0f;
                    s0[u] = in && (FMT == 0 || wa) ? e8m0_to_f32(__ldg(pwa + b)) : 0.0f;
                    s1[u] = FMT == 1 && in && wb ? e8m0_to_f32(__ldg(pwb + b)) : s0[u];
                }
            }
#pragma unroll
            for (int u = 0; u < 8; u++) {
                const int bb = gb + u;
                float d[4];
                if (FMT == 0) {
                    uint2 ea = *(const uint2 *)(sta + bb * 32 + 8 * t);
                    uint2 eb = *(const uint2 *)(stb + bb * 32 + 8 * t);
                    mma_e4m3_16832(d, ea.x, eb.x, ea.y, eb.y, x[u].x, x[u].y);
                } else {
                    uint32_t ea = *(const uint32_t *)(sta + bb * 16 + 4 * t);
                    uint32_t eb = *(const uint32_t *)(stb + bb * 16 + 4 * t);
                    mma_e4m3_16832(d, fp4_lo_to_e4m3(ea), fp4_lo_to_e4m3(eb), fp4_hi_to_e4m3(ea),
                                   fp4_hi_to_e4m3(eb), __byte_perm(x[u].x, x[u].y, 0x6420),
                                   __byte_perm(x[u].x, x[u].y, 0x7531));
                }
                acc[0] = fmaf(d[0], f0[u] * s0[u], acc[0]);
                acc[1] = fmaf(d[1], f1[u] * s0[u], acc[1]);
                acc[2] = fmaf(d[2], f0[u] * s1[u], acc[2]);
                acc[3] = fmaf(d[3], f1[u] * s1[u], acc[3]);
            }
        }
        __syncwarp(); /* every lane is done with this stage before it is refilled */
        issue(c + MV_STAGES - 1);
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    if (FMT == 1)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[i] *= 64.0f; /* codes were read as value * 2^-6 */
}

/* A block of MV_WARPS warps covers RW * (MV_WARPS / KSPLIT) weight rows (RW =
 * 16 on the streamed path, 8 on the any-shape one); the KSPLIT warps of one
 * row group split k into contiguous ranges and their partial sums are added
 * in a fixed order, so results do not depend on timing (and, since the split
 * depends on n only, not on m either). Tokens come in tiles of 8 (streamed)
 * or 16 (any shape): grid.y. */
/* Grouped launch (MoE): blockIdx.z is the group; its expert's weights sit at
 * ids[z] in w [experts, n, .] and its token slots are [off[z], off[z+1]). */
struct Groups {
    const int32_t *ids, *off, *rows;
};

template <int FMT, bool FAST, int KSPLIT, bool GROUPED>
__global__ void __launch_bounds__(MV_THREADS, 3) /* three rings per SM */
    matvec_kernel(const uint8_t *__restrict__ qa, const float *__restrict__ sa, int64_t m,
                  int64_t k, const uint8_t *__restrict__ w, const uint8_t *__restrict__ ws,
                  int64_t n, void *__restrict__ out, int out_bf16, Groups grp_in) {
    constexpr int RW = FAST ? MV_ROWS : 8, TT = FAST ? 8 : 16;
    TokMap tm = {NULL, 0, m};
    if (GROUPED) {
        const int z = blockIdx.z;
        const int64_t e = grp_in.ids[z];
        tm.rows = grp_in.rows;
        tm.base = grp_in.off[z];
        tm.count = grp_in.off[z + 1] - tm.base;
        if ((int64_t)blockIdx.y * TT >= tm.count) return; /* whole block: before any barrier */
        w += e * n * (FMT == 0 ? k : k / 2);
        ws += e * (FMT == 0 ? (n + 31) / 32 : n) * ((k + 31) / 32);
    }
    __shared__ float red[MV_WARPS][32][4];
    extern __shared__ __align__(16) uint8_t mv_ring[];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    const int rg = warp / KSPLIT, ks = warp % KSPLIT;
    const int64_t m0 = (int64_t)blockIdx.y * TT;
    const int64_t kbn = (k + 31) / 32;
    /* streamed path: k ranges in whole groups of 8 blocks (see warp_pipe) */
    const int64_t per = FAST ? ((kbn + KSPLIT - 1) / KSPLIT + 7) / 8 * 8 : (kbn + KSPLIT - 1) / KSPLIT;
    const int64_t kb0 = ks * per, kb1 = kb0 + per < kbn ? kb0 + per : kbn;
    const int g = lane >> 2, t = lane & 3;
    /* a block walks over row groups; the grid holds whole rounds of blocks */
    const int64_t ngroups = ((n + RW - 1) / RW + (MV_WARPS / KSPLIT) - 1) / (MV_WARPS / KSPLIT);
    for (int64_t grp = blockIdx.x; grp < ngroups; grp += gridDim.x) {
        const int64_t n0 = (grp * (MV_WARPS / KSPLIT) + rg) * RW;
        float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
        if (n0 < n && kb0 < kb1) {
            if (FAST)
                warp_pipe<FMT>(qa, sa, m, k, w, ws, n, tm, m0, n0, kb0, kb1, lane,
                               mv_ring + warp * MV_STAGES * MV_STAGE_BYTES, acc);
            else if (FMT == 0)
                warp_fp8_any(qa, sa, m, k, w, ws, n, m0, n0, kb0, kb1, lane, acc);
            else
                warp_fp4_any(qa, sa, m, k, w, ws, n, m0, n0, kb0, kb1, lane, acc);
        }
        if (KSPLIT > 1) {
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][lane][i] = acc[i];
            __syncthreads();
            if (ks == 0) {
#pragma unroll
                for (int j = 1; j < KSPLIT; j++)
#pragma unroll
                    for (int i = 0; i < 4; i++) acc[i] += red[warp + j][lane][i];
            }
            __syncthreads(); /* red is reused by the next group */
            if (ks != 0) continue;
        }
        if (n0 >= n) continue;
        if (FAST) {
            const int64_t t0 = m0 + 2 * t, ra = n0 + g;
            const float v[4] = {acc[0], acc[1], acc[2], acc[3]};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int64_t slot = t0 + (i & 1), row = ra + (i >> 1) * 8;
                if (tm.valid(slot) && row < n) {
                    const int64_t o = tm.orow(slot) * n + row;
                    store_out1(out, out_bf16, o, v[i]);
                }
            }
        } else {
            const int64_t col = n0 + 2 * t;
            if (m0 + g < m) store_out2(out, out_bf16, n, m0 + g, col, acc[0], acc[1]);
            if (m0 + g + 8 < m) store_out2(out, out_bf16, n, m0 + g + 8, col, acc[2], acc[3]);
        }
    }
}

static int sm_count(void) { return cuda_sm_count(); }

/* The split depends on n (and the path) only, never on m (batch invariance).
 * Time goes as (rounds of blocks) x (k range per warp): pick the split with
 * the fewest rounds per unit of k, counting the blocks that fit at once
 * (three streamed rings per SM; the any-shape path is never fast anyway). */
static int pick_ksplit(int64_t n, int rows_per_warp) {
    const int64_t tiles = (n + rows_per_warp - 1) / rows_per_warp, slots = 3 * (int64_t)sm_count();
    int best = 1;
    double best_t = 1e300;
    for (int ks = 1; ks <= MV_WARPS; ks *= 2) {
        int64_t groups = (tiles * ks + MV_WARPS - 1) / MV_WARPS;
        double t = (double)((groups + slots - 1) / slots) / ks;
        if (t < best_t * 0.999) { best_t = t; best = ks; }
    }
    return best;
}

/* m: tokens (plain) or the most token slots of any group (grouped). */
template <int FMT, bool FAST, int KS, bool GROUPED = false>
static cudaError_t launch_one(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                              const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                              int out_bf16, cudaStream_t s, Groups grp = {NULL, NULL, NULL},
                              int ngroups = 1) {
    constexpr int RW = FAST ? MV_ROWS : 8, TT = FAST ? 8 : 16;
    auto *kern = matvec_kernel<FMT, FAST, KS, GROUPED>;
    const int smem = FAST ? MV_SMEM : 0;
    static int resident = 0; /* blocks the whole GPU holds at once, per instantiation */
    if (!resident) {
        cudaError_t e = cudaSuccess;
        if (FAST)
            e = cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        int per_sm = 0;
        if (e == cudaSuccess)
            e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, MV_THREADS, smem);
        if (e != cudaSuccess) return e;
        resident = per_sm * sm_count() > 0 ? per_sm * sm_count() : 1;
    }
    const int64_t tiles = (n + RW - 1) / RW;
    const int64_t groups = (tiles + (MV_WARPS / KS) - 1) / (MV_WARPS / KS);
    /* equal rounds: every block walks the same number of row groups (a
     * partial last round would leave most of the GPU idle) */
    const int64_t rounds = (groups + resident - 1) / resident;
    const int64_t gx = (groups + rounds - 1) / rounds;
    kern<<<dim3((unsigned)gx, (unsigned)((m + TT - 1) / TT), (unsigned)ngroups), MV_THREADS,
           smem, s>>>(qa, sa, m, k, w, ws, n, out, out_bf16, grp);
    return cudaGetLastError();
}

template <int FMT, bool FAST>
static cudaError_t launch_ks(int ks, const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                             const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                             int out_bf16, cudaStream_t s) {
    switch (ks) {
    case 1: return launch_one<FMT, FAST, 1>(qa, sa, m, k, w, ws, n, out, out_bf16, s);
    case 2: return launch_one<FMT, FAST, 2>(qa, sa, m, k, w, ws, n, out, out_bf16, s);
    default: return launch_one<FMT, FAST, 4>(qa, sa, m, k, w, ws, n, out, out_bf16, s);
    }
}

static di_status check_grid(int64_t m, int64_t n, di_err *err, const char *what) {
    if ((m + 7) / 8 > 65535 || (n + 7) / 8 > 0x7fffffffLL)
        return di_err_set(err, DI_ERR_LIMIT, "%s: shape m=%lld n=%lld exceeds the grid", what,
                          (long long)m, (long long)n);
    return DI_OK;
}

/* The streamed path needs whole 32-blocks and 16-byte aligned weight rows. */
static bool fast_ok(const uint8_t *qa, const uint8_t *w, int64_t k) {
    return k % 32 == 0 && (uintptr_t)qa % 8 == 0 && (uintptr_t)w % 16 == 0;
}

template <int FMT>
static di_status launch_matvec(const char *op, const uint8_t *qa, const float *sa, int64_t m,
                               int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                               void *out, int out_bf16, cudaStream_t stream, di_err *err) {
    if (check_grid(m, n, err, op)) return err->code;
    const bool fast = fast_ok(qa, w, k);
    int ks = pick_ksplit(n, fast ? MV_ROWS : 8);
    cudaError_t e = fast
                        ? launch_ks<FMT, true>(ks, qa, sa, m, k, w, ws, n, out, out_bf16, stream)
                        : launch_ks<FMT, false>(ks, qa, sa, m, k, w, ws, n, out, out_bf16, stream);
    return cuda_check(e, err, op);
}

/* ---- FP8 on the FP8 tensor cores: wgmma, weights through the copy engine ----
 *
 * mma.sync has no native FP8 on Hopper: each m16n8k32 e4m3 above is two f16
 * HMMAs plus operand conversions (F2FP), about 80 instructions per 512 weight
 * bytes, so that path is bound by instruction issue, not by DRAM (run 16).
 * Here a block is one warpgroup: 64 weight rows x 8 tokens x a k range. One
 * thread streams 64 x 128-byte weight tiles, the 8 tokens' activations and
 * their scales into a WV_ST-deep ring with the bulk tensor copy engine (128B
 * swizzle, what wgmma reads); every 32-block is one wgmma m64n8k32 into its
 * own 4-register result, promoted with the block's two scales (2 FMUL + 4
 * FFMA per thread and block): ~10 instructions per warp and kilobyte.
 * Long rows are split over the KS blocks of a cluster, whose partial sums are
 * added in rank order through distributed shared memory (deterministic; the
 * split depends on n and k only, never on m). Numerics are the tiled
 * kernel's: the FP8 tensor cores add a 32-block's exact products with a
 * short adder (docs/gpu-notes.md). */
#define WV_ST 4
#define WV_W_BYTES 8192          /* 64 rows x 128 bytes */
#define WV_A_BYTES(nt) ((nt) * 128) /* nt tokens x 128 bytes */
#define WV_SA_BYTES(nt) ((nt) * 16) /* nt tokens x 4 scales */
#define WV_STAGE_TX(nt) (WV_W_BYTES + WV_A_BYTES(nt) + WV_SA_BYTES(nt))
#define WV_SMEM(nt, kst) (1024 + WV_ST * WV_STAGE_TX(nt) + WV_ST * 8 + 2 * (kst) * 16 + (nt) * 256)
/* The form that quantizes its own activations (QX) adds, 1024-aligned after
 * the rest, the block's whole activation panel: kst stages of nt x 128 code
 * bytes (the 128B swizzle the copy engine would write) and nt x 4 scales. */
#define WV_PANEL(nt, kst) ((kst) * (WV_A_BYTES(nt) + WV_SA_BYTES(nt)))
#define WV_SMEM_QX(nt, kst) (WV_SMEM(nt, kst) + 1024 + WV_PANEL(nt, kst))
#define WV_QX_MAX_PANEL (72 * 1024)

/* d = A x B for one 32-block: 64 rows x 8 (NB = 1) or 16 (NB = 2) tokens */
template <int NB>
__device__ __forceinline__ void wgmma_m64nk32(float d[4 * NB], uint64_t da, uint64_t db) {
    if constexpr (NB == 1)
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %6, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n8k32.f32.e4m3.e4m3 {%0, %1, %2, %3}, %4, %5, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "l"(da), "l"(db), "r"(0));
    else
        asm volatile(
            "{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
            "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
            "{%0, %1, %2, %3, %4, %5, %6, %7}, %8, %9, p, 1, 1;\n}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]),
              "+f"(d[7])
            : "l"(da), "l"(db), "r"(0));
}
template <int NB> __device__ __forceinline__ void fence_regs_q(float q[4][4 * NB]) {
#pragma unroll
    for (int j = 0; j < 4; j++)
#pragma unroll
        for (int i = 0; i < 4 * NB; i++) asm volatile("" : "+f"(q[j][i])::"memory");
}
/* The four 32-blocks of a 128-input stage, each into its own result: 64
 * weight rows (128-byte swizzled rows at w) x 8 NB token slots (at a; the
 * second 8 rows 1024 bytes on). */
template <int NB>
__device__ __forceinline__ void wv_mma4(float q[4][4 * NB], uint32_t w, uint32_t a) {
    fence_regs_q<NB>(q);
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; j++)
        wgmma_m64nk32<NB>(q[j], make_desc(w + j * 32, 16, 1024, 1), make_desc(a + j * 32, 16, 1024, 1));
    wg_commit();
}
/* The same from the descriptors of the stage's first 32-block (the next
 * ones are 32 bytes = 2 address units on: make_desc's address field) */
template <int NB>
__device__ __forceinline__ void wv_mma4_desc(float q[4][4 * NB], uint64_t dw, uint64_t da) {
    fence_regs_q<NB>(q);
    wg_fence();
#pragma unroll
    for (int j = 0; j < 4; j++) wgmma_m64nk32<NB>(q[j], dw + 2 * j, da + 2 * j);
    wg_commit();
}
/* acc += q * scale for a stage: the thread's token pairs (8 b + 2t, +1) have
 * activation scales sa[b][0..1][j] (b = n8 block), its rows' weight scales
 * w0[j] (rows ra) and w1[j] (ra + 8). */
template <int NB>
__device__ __forceinline__ void wv_promote(float acc[4 * NB], const float q[4][4 * NB],
                                           const float4 (*sa)[2], const float w0[4],
                                           const float w1[4]) {
#pragma unroll
    for (int b = 0; b < NB; b++) {
        const float fa[4] = {sa[b][0].x, sa[b][0].y, sa[b][0].z, sa[b][0].w};
        const float fb[4] = {sa[b][1].x, sa[b][1].y, sa[b][1].z, sa[b][1].w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            acc[4 * b + 0] = fmaf(q[j][4 * b + 0], fa[j] * w0[j], acc[4 * b + 0]);
            acc[4 * b + 1] = fmaf(q[j][4 * b + 1], fb[j] * w0[j], acc[4 * b + 1]);
            acc[4 * b + 2] = fmaf(q[j][4 * b + 2], fa[j] * w1[j], acc[4 * b + 2]);
            acc[4 * b + 3] = fmaf(q[j][4 * b + 3], fb[j] * w1[j], acc[4 * b + 3]);
        }
    }
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::
                     : "memory");
}

/* acc += cluster rank r's sums at red[b * 128 + tid] (b < NB), read through
 * distributed shared memory (red: the same offset in every rank) */
template <int NB>
__device__ __forceinline__ void cluster_add(float acc[4 * NB], const float4 *red, int tid,
                                            uint32_t r) {
#pragma unroll
    for (int b = 0; b < NB; b++) {
        const uint32_t local = (uint32_t)__cvta_generic_to_shared(red + b * 128 + tid);
        uint32_t remote;
        float4 v;
        asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(remote) : "r"(local), "r"(r));
        asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
                     : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                     : "r"(remote)
                     : "memory");
        acc[4 * b] += v.x;
        acc[4 * b + 1] += v.y;
        acc[4 * b + 2] += v.z;
        acc[4 * b + 3] += v.w;
    }
}

/* The KS blocks of a cluster hold partial sums of the same outputs: rank 0
 * adds the others' in rank order (deterministic) through distributed shared
 * memory; true for the rank that then stores. Every rank must call it. */
template <int KS, int NB>
__device__ __forceinline__ bool cluster_reduce(float acc[4 * NB], float4 *red, int tid,
                                               uint32_t rank) {
#pragma unroll
    for (int b = 0; b < NB; b++)
        red[b * 128 + tid] = make_float4(acc[4 * b], acc[4 * b + 1], acc[4 * b + 2], acc[4 * b + 3]);
    cluster_sync();
    if (rank == 0)
        for (uint32_t r = 1; r < KS; r++) cluster_add<NB>(acc, red, tid, r);
    cluster_sync(); /* the other ranks' shared memory stays until read */
    return rank == 0;
}

/* QX: the activations come as f32 x [m, k] (16-byte aligned rows) and each
 * block quantizes its own k range of its token rows into shared memory, with
 * the very steps of act_quant_fp8_vec (cuda_act_quant.cuh), in place of the
 * copies of a quantized buffer: one kernel launch less per product, and the
 * same codes, scales and sums, so the same bits (map_a, map_sa unused).
 * A grid of depth 2 runs a second matrix of the same k on the same x
 * (map_w2, ws2, out2, n2 rows: a SwiGLU's w1 and w3, or attention's wq_a
 * and wkv, in one launch), each block the single product's work for its
 * matrix at the launch's k split; the grid covers the larger matrix's row
 * tiles, and a cluster past the other's last tile leaves at once. */
/* XF (with QX): the shared expert's tail in the product
 * (cuda_launch_matvec_fp8_x_swiglu_add): each activation is swiglu(x, u;
 * limit) as k_swiglu forms it (clamps, g·sigmoid(g)·u, bf16) before its
 * quantization, and the store is bf16(add + the output) as k_add_bf16
 * forms it: those two kernels' values in this one. Instances of their own,
 * so that the other products' code is unchanged (at decode a kernel's
 * code is fetched cold each call; docs/gpu-notes.md run 95). */
struct WvXf {
    const float *u;
    const float *add;
    float limit;
};

template <int KS, int NB, bool QX, bool XF = false>
__global__ void __launch_bounds__(128)
    matvec_fp8_wg_kernel(const __grid_constant__ CUtensorMap map_w,
                         const __grid_constant__ CUtensorMap map_a,
                         const __grid_constant__ CUtensorMap map_sa,
                         const uint8_t *__restrict__ ws_1, int64_t m, int64_t k, int64_t n_1,
                         void *__restrict__ out_1, int out_bf16, int kst,
                         const float *__restrict__ x,
                         const __grid_constant__ CUtensorMap map_w2,
                         const uint8_t *__restrict__ ws2, void *__restrict__ out2, int64_t n2, WvXf xf) {
    const bool second = blockIdx.z == 1;
    const CUtensorMap *mwp = second ? &map_w2 : &map_w;
    const uint8_t *__restrict__ ws = second ? ws2 : ws_1;
    void *__restrict__ out = second ? out2 : out_1;
    const int64_t n = second ? n2 : n_1;
    if ((int64_t)(blockIdx.x / KS) * 64 >= n) return; /* the whole cluster: one row tile */
    extern __shared__ uint8_t wv_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(wv_raw), base = (raw + 1023u) & ~1023u;
    uint8_t *smem = wv_raw + (base - raw);
    constexpr int NT = 8 * NB;
    const uint32_t s_w = base, s_a = base + WV_ST * WV_W_BYTES;
    const uint32_t s_sa = s_a + WV_ST * WV_A_BYTES(NT), s_full = s_sa + WV_ST * WV_SA_BYTES(NT);
    const float *sa_st = (const float *)(smem + (s_sa - base));
    float *sw_tab = (float *)(smem + (s_full - base) + WV_ST * 8); /* [2][kst * 4] */
    float4 *red = (float4 *)(sw_tab + 2 * kst * 4);                 /* [NB][128] */
    /* QX: the panel, [kst][NT x 128] swizzled codes then [kst][NT][4] scales */
    const uint32_t s_px = (uint32_t)(((uintptr_t)(red + NB * 128) - (uintptr_t)smem + base + 1023u) & ~(uintptr_t)1023u);
    uint8_t *px = smem + (s_px - base);
    float *pxs = (float *)(px + kst * WV_A_BYTES(NT));

    uint32_t rank = 0;
    if (KS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    const int64_t n0 = (int64_t)(blockIdx.x / KS) * 64, m0 = (int64_t)blockIdx.y * NT;
    const int64_t kbn = k / 32, nbn = (n + 31) / 32, nst_all = k / 128;
    const int64_t st0 = (int64_t)rank * kst;
    const int nst = (int)(st0 >= nst_all ? 0 : (nst_all - st0 < kst ? nst_all - st0 : kst));
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;

    /* a weight tile is read once where one block row takes every token */
    const uint64_t wpol = l2_weight_policy(gridDim.y == 1);
    /* a stage's barrier expects the weight tile, the activations and their
     * scales; the weights may arrive first (issue_w before issue_a) */
    auto issue_w = [&](int st) {
        const int slot = st % WV_ST;
        const uint32_t full = s_full + 8 * slot;
        mbar_arrive_expect_tx(full, QX ? WV_W_BYTES : WV_STAGE_TX(NT));
        tma_load_2d_pol(s_w + slot * WV_W_BYTES, mwp, (int)((st0 + st) * 128), (int)n0, full, wpol);
    };
    auto issue_a = [&](int st) {
        if (QX) return;
        const int slot = st % WV_ST;
        const uint32_t full = s_full + 8 * slot;
        const int c = (int)((st0 + st) * 128);
        tma_load_2d(s_a + slot * WV_A_BYTES(NT), &map_a, c, (int)m0, full);
        tma_load_2d(s_sa + slot * WV_SA_BYTES(NT), &map_sa, c / 32, (int)m0, full);
    };
    /* The weight copies first (their DRAM round trip is the long pole), then
     * the weight scales of the tile's two 32-row blocks over this k range:
     * both are model constants, read while the kernel ahead may still run
     * (programmatic launch); the activations only once it has finished. */
    if (tid == 0) {
        for (int s = 0; s < WV_ST; s++) mbar_init(s_full + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        for (int s = 0; s < WV_ST && s < nst; s++) issue_w(s);
    }
    for (int i = tid; i < 2 * nst * 4; i += 128) {
        const int h = i / (nst * 4), b = i - h * nst * 4;
        const int64_t rb = n0 / 32 + h;
        sw_tab[h * kst * 4 + b] = rb < nbn ? e8m0_to_f32(__ldg(ws + rb * kbn + st0 * 4 + b)) : 0.0f;
    }
    grid_dep_wait();
    if (tid == 0)
        for (int s = 0; s < WV_ST && s < nst; s++) issue_a(s);
    if constexpr (QX) {
        /* 8 values a thread, four consecutive threads a 32-block, a token
         * row's range in order: groups gi of the range's 16 * nst per live
         * row (a stage's 128 codes of a row are 16 groups, 2 to a 16-byte
         * chunk, chunk c of row r at chunk c ^ (r & 7): the 128B swizzle).
         * A thread's loads of QX_U groups are issued together (one L2 round
         * trip, not one per group). Rows past m get zero codes and scales,
         * the copy engine's fill, without loads (b1 run 6 walked them too:
         * +2 µs a product at m = 1). */
        constexpr int QX_U = 4;
        const int live = (int)(m - m0 < NT ? m - m0 : NT);
        const int per_row = 16 * nst, total = live * per_row;
        for (int g0 = 0; g0 < total; g0 += 128 * QX_U) {
            float v[QX_U][8];
#pragma unroll
            for (int u = 0; u < QX_U; u++) {
                const int gi = g0 + 128 * u + tid, r = gi / per_row, c8 = gi - r * per_row;
                if (gi < total) {
                    const int64_t off = (m0 + r) * k + (st0 * 128 + 8 * (int64_t)c8);
                    const float *p = x + off;
                    float4 a = __ldg((const float4 *)p), b = __ldg((const float4 *)p + 1);
                    v[u][0] = a.x; v[u][1] = a.y; v[u][2] = a.z; v[u][3] = a.w;
                    v[u][4] = b.x; v[u][5] = b.y; v[u][6] = b.z; v[u][7] = b.w;
                    if constexpr (XF) { /* k_swiglu's steps, w = NULL */
                        const float4 c = __ldg((const float4 *)(xf.u + off)), d = __ldg((const float4 *)(xf.u + off) + 1);
                        const float uv[8] = {c.x, c.y, c.z, c.w, d.x, d.y, d.z, d.w};
#pragma unroll
                        for (int i = 0; i < 8; i++) {
                            float gv = v[u][i], ui = uv[i];
                            if (xf.limit > 0.f) {
                                ui = fminf(fmaxf(ui, -xf.limit), xf.limit);
                                gv = fminf(gv, xf.limit);
                            }
                            v[u][i] = round_bf16(MUL(MUL(gv, sigmoid_f(gv)), ui));
                        }
                    }
                } else {
#pragma unroll
                    for (int i = 0; i < 8; i++) v[u][i] = 0.0f;
                }
            }
#pragma unroll
            for (int u = 0; u < QX_U; u++) {
                const int gi = g0 + 128 * u + tid, r = gi / per_row, c8 = gi - r * per_row;
                uint2 codes;
                const float sc = aq_quant8(v[u], &codes); /* every lane: the shuffles */
                if (gi < total) {
                    const int st = c8 >> 4, w16 = c8 & 15, chunk = w16 >> 1;
                    *(uint2 *)(px + st * WV_A_BYTES(NT) + r * 128 + ((chunk ^ (r & 7)) << 4) + (w16 & 1) * 8) = codes;
                    if ((tid & 3) == 0) pxs[(st * NT + r) * 4 + (w16 >> 2)] = sc;
                }
            }
        }
        const int dead = NT - live; /* rows live .. NT - 1 of every stage */
        for (int i = tid; i < nst * dead * 8; i += 128) {
            const int st = i / (dead * 8), rem = i - st * dead * 8;
            *(uint4 *)(px + st * WV_A_BYTES(NT) + (live + (rem >> 3)) * 128 + (rem & 7) * 16) = make_uint4(0u, 0u, 0u, 0u);
        }
        for (int i = tid; i < nst * dead; i += 128) {
            const int st = i / dead, r = live + (i - st * dead);
            *(float4 *)(pxs + (st * NT + r) * 4) = make_float4(0.f, 0.f, 0.f, 0.f);
        }
        /* ordinary stores, read next by the tensor cores */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    }
    grid_dep_launch();
    __syncthreads(); /* barrier initialisation, the table and the panel, for every thread */

    float acc[4 * NB], q[4][4 * NB];
#pragma unroll
    for (int i = 0; i < 4 * NB; i++) acc[i] = 0.0f;
    const int h = warp >> 1; /* the warp's 16 rows lie in 32-row block n0/32 + h */
    /* One stage at a time: its four wgmmas, wait, promote, hand the slot back
     * to the copy engine. The tensor work is tiny; what keeps DRAM busy is
     * the ring's WV_ST - 1 stages in flight, not overlapping the wgmmas (a
     * wgmma in flight across the loop's back edge makes ptxas serialize). */
    for (int st = 0; st < nst; st++) {
        const int slot = st % WV_ST;
        mbar_wait(s_full + 8 * slot, (st / WV_ST) & 1);
        wv_mma4<NB>(q, s_w + slot * WV_W_BYTES,
                    QX ? s_px + st * WV_A_BYTES(NT) : s_a + slot * WV_A_BYTES(NT));
        const float4 *sa4 = QX ? (const float4 *)pxs + st * NT : (const float4 *)sa_st + slot * NT;
        float4 sab[NB][2];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            sab[b][0] = sa4[8 * b + 2 * t];
            sab[b][1] = sa4[8 * b + 2 * t + 1];
        }
        const float4 w = ((const float4 *)sw_tab)[h * kst + st];
        const float fw[4] = {w.x, w.y, w.z, w.w};
        wg_wait<0>();
        fence_regs_q<NB>(q);
        wv_promote<NB>(acc, q, sab, fw, fw);
        __syncthreads(); /* every warp is done with the slot (wgmma and scales) */
        if (tid == 0 && st + WV_ST < nst) {
            issue_w(st + WV_ST);
            issue_a(st + WV_ST);
        }
    }

    if (KS > 1 && !cluster_reduce<KS, NB>(acc, red, tid, rank)) return;
    /* acc[4b + 0..1]: row n0 + 16 warp + g, tokens m0 + 8b + 2t, +1; acc[4b + 2..3]: row + 8 */
#pragma unroll
    for (int i = 0; i < 4 * NB; i++) {
        const int64_t row = n0 + 16 * warp + g + ((i >> 1) & 1) * 8;
        const int64_t tok = m0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (row < n && tok < m) {
            if (XF) { /* k_add_bf16's sum with the output as it would be stored */
                const int64_t o = tok * n + row;
                const float y = out_bf16 == OUT_F32_BF16 ? round_bf16(acc[i]) : acc[i];
                ((float *)out)[o] = round_bf16(ADD(xf.add[o], y));
            } else {
                store_out1(out, out_bf16, tok * n + row, acc[i]);
            }
        }
    }
}

static int wv_forced_ks = 0; /* measuring aid (bench, tests): 0 = choose */
extern "C" void cuda_matvec_set_ks(int ks) { wv_forced_ks = ks; }

/* The k split (cluster size): the largest power of two up to 8 that
 * keeps all blocks resident at about three per SM, and no more ranks than
 * 128-input stages. Measured (run 19, m = 1): `wo_b` (80 tiles) 22.7 / 16.0 /
 * 14.5 / 17.9 µs for 1 / 2 / 4 / 8, the shared expert's w2 (80 tiles) 8.0 /
 * 6.4 / 6.7 / 9.5, one MXFP4 expert w1 (36 tiles) 21.1 / 12.3 / 9.0 / 8.2:
 * FP8 loses with clusters of 8 where they leave fewer than 3 blocks per SM
 * resident (the rule stops there), MXFP4 (conversion work per block) gains.
 * FP8 with few row tiles (run 27, µs for clusters of 4 / 8 at m = 1 / 8 /
 * 16): `wq_a` (20 tiles) 5.11 / 4.28, 5.17 / 4.38, 5.58 / 5.05; the shared
 * expert's w1 (36 tiles) 6.44 / 5.87, 6.53 / 5.82, 7.16 / 6.92: both up to 8.
 * Depends on n and k only (batch invariance; grouped rows equal
 * the plain product). Batch-invariant mode: 1, where a row's 32-blocks are
 * promoted in one chain in k order, as the tiles promote them: the same
 * bits (invariant run 4 in docs/gpu-notes.md: every output of 5 shapes at
 * 1 and 16 rows; 2, 4 or 8 ranks add their chains' sums after and differ). */
static int wv_pick_ks(int64_t n, int64_t k, int64_t n2 = 0) {
    if (cuda_batch_invariant()) return 1;
    if (wv_forced_ks == 1 || wv_forced_ks == 2 || wv_forced_ks == 4 || wv_forced_ks == 8)
        return wv_forced_ks;
    const int64_t tiles = (n + 63) / 64 + (n2 + 63) / 64, nst = k / 128, slots = 3 * (int64_t)sm_count();
    int ks = 1;
    while (2 * ks <= 8 && tiles * 2 * ks <= slots && 2 * ks <= nst) ks *= 2;
    return ks;
}

/* Programmatic launch of the decode kernels (measuring aid: 0 turns it off):
 * the next kernel's blocks start while this one finishes and fetch their
 * weights early (see grid_dep_wait). Safe as long as no kernel writes the
 * weights of the matrix product launched right after it: the backend uploads
 * weights with synchronous copies. */
static int wv_pdl = 1;
extern "C" void cuda_matvec_set_pdl(int on) { wv_pdl = on; }

/* Launch shape of the wgmma matvec kernels: (64-row tiles x KS) x token tiles
 * of nt x groups, one warpgroup per block, clusters of KS along x. */
struct WvLaunch {
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[2];
    WvLaunch(int64_t n, int64_t m, int nt, int groups, int ks, int smem, cudaStream_t stream) {
        cfg.gridDim = dim3((unsigned)(((n + 63) / 64) * ks), (unsigned)((m + nt - 1) / nt),
                           (unsigned)groups);
        cfg.blockDim = dim3(128, 1, 1);
        cfg.dynamicSmemBytes = (size_t)smem;
        cfg.stream = stream;
        cfg.attrs = at;
        cfg.numAttrs = 0;
        if (ks > 1) {
            at[cfg.numAttrs].id = cudaLaunchAttributeClusterDimension;
            at[cfg.numAttrs].val.clusterDim.x = (unsigned)ks;
            at[cfg.numAttrs].val.clusterDim.y = 1;
            at[cfg.numAttrs].val.clusterDim.z = 1;
            cfg.numAttrs++;
        }
        if (wv_pdl) {
            at[cfg.numAttrs].id = cudaLaunchAttributeProgrammaticStreamSerialization;
            at[cfg.numAttrs].val.programmaticStreamSerializationAllowed = 1;
            cfg.numAttrs++;
        }
    }
    /* launch; a runtime or stream that refuses the programmatic attribute
     * gets the ordinary launch (same kernel: the grid_dep calls are no-ops) */
    template <typename... P, typename... A> cudaError_t launch(void (*kern)(P...), A &&...args) {
        cudaError_t e = cudaLaunchKernelEx(&cfg, kern, args...);
        if (e != cudaSuccess && wv_pdl) {
            (void)cudaGetLastError();
            cfg.numAttrs--;
            e = cudaLaunchKernelEx(&cfg, kern, args...);
            if (e == cudaSuccess) wv_pdl = 0;
        }
        return e;
    }
};

template <int KS, int NB, bool QX = false, bool XF = false>
static cudaError_t wv_launch(const CUtensorMap &mw, const CUtensorMap &ma, const CUtensorMap &ms,
                             const uint8_t *ws, int64_t m, int64_t k, int64_t n, void *out,
                             int out_bf16, cudaStream_t stream, const float *x = NULL,
                             const CUtensorMap *mw2 = NULL, const uint8_t *ws2 = NULL, void *out2 = NULL,
                             int64_t n2 = 0, WvXf xf = WvXf{NULL, NULL, 0.f}) {
    const int kst = (int)((k / 128 + KS - 1) / KS);
    const int smem = QX ? WV_SMEM_QX(8 * NB, kst) : WV_SMEM(8 * NB, kst);
    static int attr = 0;
    if (smem > attr) {
        cudaError_t e = cudaFuncSetAttribute(matvec_fp8_wg_kernel<KS, NB, QX, XF>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        attr = smem;
    }
    WvLaunch l(mw2 && n2 > n ? n2 : n, m, 8 * NB, mw2 ? 2 : 1, KS, smem, stream);
    return l.launch(matvec_fp8_wg_kernel<KS, NB, QX, XF>, mw, ma, ms, ws, m, k, n, out, out_bf16, kst,
                    x, mw2 ? *mw2 : mw, ws2, out2, mw2 ? n2 : n, xf);
}

/* The wgmma path: whole 128-byte stages, the alignment the tensor maps need,
 * decode batches (larger m runs the tiled GEMM or the kernel above). Returns
 * false (nothing launched) when it does not apply. */
static bool wv_try(const uint8_t *qa, const float *sa, int64_t m, int64_t k, const uint8_t *w,
                   const uint8_t *ws, int64_t n, void *out, int out_bf16, cudaStream_t stream,
                   cudaError_t *e) {
    if (k % 128 || m > 16 || (n + 63) / 64 * 8 > 0x7fffffffLL || (uintptr_t)qa % 16 ||
        (uintptr_t)w % 16 || (uintptr_t)sa % 16)
        return false;
    /* up to 16 tokens in one tile (m64n16k32), so the weights are read once */
    const int nt = m > 8 ? 16 : 8;
    CUtensorMap mw, ma, ms;
    if (!make_map(&mw, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, 128, 64, true) ||
        !make_map(&ma, qa, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, m, k, 128, nt, true) ||
        !make_map(&ms, sa, CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 4, m, k / 32, 4, nt, false))
        return false;
#define WV_CASE(KSV)                                                                          \
    case KSV:                                                                                 \
        *e = nt == 16 ? wv_launch<KSV, 2>(mw, ma, ms, ws, m, k, n, out, out_bf16, stream)     \
                      : wv_launch<KSV, 1>(mw, ma, ms, ws, m, k, n, out, out_bf16, stream);    \
        break;
    switch (wv_pick_ks(n, k)) {
        WV_CASE(1) WV_CASE(2) WV_CASE(4) default : WV_CASE(8)
    }
#undef WV_CASE
    return true;
}

static int wv_qx_on = 1; /* measuring aid (bench, tests): 0 = quantize by a kernel of its own */
extern "C" void cuda_matvec_set_fused_quant(int on) { wv_qx_on = on; }

/* The same product from f32 activations, quantized inside (QX): up to 8
 * tokens (one token tile), where the wgmma path applies and the panel fits.
 * The cluster split is wv_try's (n and k only), so the sums are wv_try's and
 * so are the bits. Returns false (nothing launched) when it does not apply. */
static bool wv_try_x(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                     int64_t n, void *out, int out_bf16, cudaStream_t stream, cudaError_t *e,
                     WvXf xf = WvXf{NULL, NULL, 0.f}) {
    if (!wv_qx_on || k % 128 || m < 1 || m > 8 || (n + 63) / 64 * 8 > 0x7fffffffLL ||
        (uintptr_t)x % 16 || (uintptr_t)w % 16 || (uintptr_t)xf.u % 16)
        return false;
    const int ks = wv_pick_ks(n, k);
    const int64_t kst = (k / 128 + ks - 1) / ks;
    if (WV_PANEL(8, kst) > WV_QX_MAX_PANEL) return false;
    CUtensorMap mw;
    if (!make_map(&mw, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, 128, 64, true)) return false;
#define WV_X_CASE(KSV, XFV) \
    *e = wv_launch<KSV, 1, true, XFV>(mw, mw, mw, ws, m, k, n, out, out_bf16, stream, x, NULL, NULL, NULL, 0, xf)
    if (xf.u) { /* its own instances: the plain products' code stays as it was */
        switch (ks) {
        case 1: WV_X_CASE(1, true); break;
        case 2: WV_X_CASE(2, true); break;
        case 4: WV_X_CASE(4, true); break;
        default: WV_X_CASE(8, true); break;
        }
        return true;
    }
    switch (ks) {
    case 1: WV_X_CASE(1, false); break;
    case 2: WV_X_CASE(2, false); break;
    case 4: WV_X_CASE(4, false); break;
    default: WV_X_CASE(8, false); break;
    }
#undef WV_X_CASE
    return true;
}

/* Two products of one x (the same k: w1 and w3 of an expert, n2 = n, or
 * attention's wq_a and wkv) in one launch of wv_try_x's kernel. The k
 * split counts the blocks of both matrices: the shared expert's 2,304 x
 * 5,120 pair takes 4 ranks (288 blocks, one wave) where each matrix alone
 * takes 8 (576 blocks for the two, 1.45 waves): 13.9 -> 10.8 us at m = 1
 * (run 57, docs/gpu-notes.md). So a pair has the bits of two single
 * products with that split, which are not always a lone product's
 * (backend.h); batch-invariant mode splits nothing either way. Returns
 * false (nothing launched) when it does not apply. */
static int wv_pair_ks(int64_t m, int64_t n, int64_t n2, int64_t k) {
    if (!wv_qx_on || k % 128 || m < 1 || m > 8 || n < 1 || n2 < 1 ||
        ((n > n2 ? n : n2) + 63) / 64 * 8 > 0x7fffffffLL)
        return 0;
    const int ks = wv_pick_ks(n, k, n2);
    return WV_PANEL(8, (k / 128 + ks - 1) / ks) > WV_QX_MAX_PANEL ? 0 : ks;
}

/* Test aid: the k split a pair of (m, n, n2, k) runs with in one launch; 0
 * where it runs as two single products (their own split). */
extern "C" int cuda_matvec_pair_ks(int64_t m, int64_t n, int64_t n2, int64_t k) { return wv_pair_ks(m, n, n2, k); }

static bool wv_try_x_pair(const float *x, int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws,
                          const uint8_t *w2, const uint8_t *ws2, int64_t n, int64_t n2, void *out, void *out2,
                          int out_bf16, cudaStream_t stream, cudaError_t *e) {
    const int ks = wv_pair_ks(m, n, n2, k);
    if (!ks || (uintptr_t)x % 16 || (uintptr_t)w % 16 || (uintptr_t)w2 % 16) return false;
    CUtensorMap mw, mw2;
    if (!make_map(&mw, w, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n, k, 128, 64, true) ||
        !make_map(&mw2, w2, CU_TENSOR_MAP_DATA_TYPE_UINT8, 1, n2, k, 128, 64, true))
        return false;
    switch (ks) {
    case 1: *e = wv_launch<1, 1, true>(mw, mw, mw, ws, m, k, n, out, out_bf16, stream, x, &mw2, ws2, out2, n2); break;
    case 2: *e = wv_launch<2, 1, true>(mw, mw, mw, ws, m, k, n, out, out_bf16, stream, x, &mw2, ws2, out2, n2); break;
    case 4: *e = wv_launch<4, 1, true>(mw, mw, mw, ws, m, k, n, out, out_bf16, stream, x, &mw2, ws2, out2, n2); break;
    default: *e = wv_launch<8, 1, true>(mw, mw, mw, ws, m, k, n, out, out_bf16, stream, x, &mw2, ws2, out2, n2); break;
    }
    return true;
}

/* ---- MXFP4 on the FP8 tensor cores ----
 *
 * The same block shape as the FP8 kernel above (one warpgroup, 64 weight rows
 * x 8 token slots x a k range, a cluster of KS blocks over long rows), with
 * three differences: the copy engine brings the packed E2M1 tile (64 rows x
 * 64 bytes per 128 inputs) into a staging slot and the threads turn it into
 * e4m3 bytes of value * 2^-6 (exact, see fp4_lo_to_e4m3) in the 128B swizzle
 * wgmma reads; the activations and their scales are gathered per token slot
 * with cp.async (the MoE form reads arbitrary rows); the weight scales are one
 * per row and 32-block (4 bytes per row and stage, also by cp.async). Per
 * thread and stage: ~70 instructions of conversion, 4 wgmmas, 16 FMUL + 16
 * FFMA of promotion, against ~180 per warp and KB of packed weights for the
 * mma.sync kernel. */
#define W4_ST 6
#define W4_F_BYTES 4096  /* 64 rows x 64 bytes of packed E2M1 */
#define W4_WS_BYTES 256  /* 64 rows x 4 scale bytes */
/* one converted tile: it is written right before its wgmmas, which complete
 * within the stage; the ring holds what the copies bring; then `red` chunk
 * partials of NB x 128 float4 each for the cluster's reduction */
#define W4_SMEM(nt, red) (1024 + WV_W_BYTES + W4_ST * (W4_F_BYTES + WV_A_BYTES(nt) + \
                          WV_SA_BYTES(nt) + W4_WS_BYTES) + W4_ST * 8 + (red) * (nt) * 256)

/* Few instructions per stage (the SM's issue, not DRAM, bounds this kernel:
 * docs/gpu-notes.md runs 24 and 27): the weight scales are decoded once per
 * stage (thread r < 64 decodes row r's four, which it copied itself, into
 * its own already-read part of the packed slot; the others read them as one
 * float4 per row), ring slot, phase and chunk end by counters instead of
 * divisions, the refill's copies from running pointers, the wgmma
 * descriptors from one base per operand.
 *
 * The k range of a row is cut into KS * CPB chunks of kst stages (the last
 * ones shorter or empty); each chunk's products are promoted into their own
 * sum from zero, and the chunk sums are added in chunk order. A block (rank
 * r of a cluster of KS) computes chunks [r CPB, r CPB + CPB) one after the
 * other; rank 0 adds the other ranks' chunk sums, in order, through
 * distributed shared memory. So the bits depend on KS * CPB (chosen from n
 * and k only) and not on how the chunks are spread over blocks: the grouped
 * form, where the experts already give many blocks, runs fewer, longer
 * blocks (CPB > 1) and still equals the plain product (KS = KS * CPB). */
template <int KS, int CPB, int NB, bool GROUPED>
__global__ void __launch_bounds__(128)
    matvec_fp4_wg_kernel(const __grid_constant__ CUtensorMap map_w, const uint8_t *__restrict__ qa,
                         const float *__restrict__ sa, const uint8_t *__restrict__ ws, int64_t m,
                         int64_t k, int64_t n, void *__restrict__ out, int out_bf16, int kst,
                         Groups grp) {
    extern __shared__ uint8_t w4_raw[];
    const uint32_t raw = (uint32_t)__cvta_generic_to_shared(w4_raw), base = (raw + 1023u) & ~1023u;
    uint8_t *smem = w4_raw + (base - raw);
    constexpr int NT = 8 * NB;
    const uint32_t s_a = base, s_w = s_a + W4_ST * WV_A_BYTES(NT), s_f = s_w + WV_W_BYTES;
    const uint32_t s_sa = s_f + W4_ST * W4_F_BYTES, s_ws = s_sa + W4_ST * WV_SA_BYTES(NT);
    const uint32_t s_full = s_ws + W4_ST * W4_WS_BYTES;
    float4 *red = (float4 *)(smem + (s_full - base) + W4_ST * 8); /* [CPB][NB][128] */
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, t = lane & 3;
    if (tid == 0) {
        for (int s = 0; s < W4_ST; s++) mbar_init(s_full + 8 * s, 1);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    }

    uint32_t rank = 0;
    if (KS > 1) asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(rank));
    const int64_t n0 = (int64_t)(blockIdx.x / KS) * 64, m0 = (int64_t)blockIdx.y * NT;
    const int64_t kbn = k / 32, nst_all = k / 128;
    const int64_t st0 = (int64_t)rank * CPB * kst, span = (int64_t)CPB * kst;
    const int nst = (int)(st0 >= nst_all ? 0 : (nst_all - st0 < span ? nst_all - st0 : span));

    /* the weight tile of a stage through the copy engine, on the stage's barrier */
    auto issue_w = [&](int st, int slot, int64_t e) {
        const uint32_t full = s_full + 8 * slot;
        mbar_arrive_expect_tx(full, W4_F_BYTES);
        asm volatile(
            "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes "
            "[%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(s_f + slot * W4_F_BYTES),
            "l"((uint64_t)&map_w), "r"((int)((st0 + st) * 64)), "r"((int)n0), "r"((int)e), "r"(full)
            : "memory");
    };
    /* The plain form's weights are model constants: the first stages' copies
     * start before the kernel ahead has finished (programmatic launch). The
     * grouped form learns its expert from the routing, which an earlier
     * kernel writes. */
    if (!GROUPED && tid == 0)
        for (int s = 0; s < W4_ST && s < nst; s++) issue_w(s, s % W4_ST, 0);
    grid_dep_wait();
    TokMap tm = {NULL, 0, m};
    int64_t e = 0;
    if (GROUPED) {
        const int z = blockIdx.z;
        e = grp.ids[z];
        tm.rows = grp.rows;
        tm.base = grp.off[z];
        tm.count = grp.off[z + 1] - tm.base;
        if ((int64_t)blockIdx.y * NT >= tm.count) return; /* the whole cluster alike */
        if (tid == 0)
            for (int s = 0; s < W4_ST && s < nst; s++) issue_w(s, s % W4_ST, e);
    }
    grid_dep_launch();
    const uint8_t *we = ws + e * n * kbn;

    /* per-thread copy roles: tid < 8 NT one 16-byte activation chunk (slot
     * tid / 8, chunk tid % 8); tid < NT slot tid's four scales; tid < 64 the
     * four scale bytes of weight row tid */
    const int a_slot = (tid >> 3) & (NT - 1), a_chunk = tid & 7;
    const bool a_ok = tid < 8 * NT && tm.valid(m0 + a_slot);
    const uint8_t *a_src = qa + (a_ok ? tm.arow(m0 + a_slot) : 0) * k;
    const bool s_ok = tid < NT && tm.valid(m0 + tid);
    const float *sa_src = sa + (s_ok ? tm.arow(m0 + tid) : 0) * kbn;
    const int64_t w_row = n0 + (tid & 63);
    const bool w_ok = w_row < n;
    const uint8_t *ws_src = we + (w_ok ? w_row : 0) * kbn;
    /* every thread: its copies of the next stage, one group, from running
     * pointers (the 128B swizzle: chunk c of row r at c ^ (r % 8)) */
    const uint8_t *a_cur = a_src + st0 * 128 + a_chunk * 16;
    const float *sa_cur = sa_src + st0 * 4;
    const uint8_t *ws_cur = ws_src + st0 * 4;
    const uint32_t a_dst = s_a + a_slot * 128 + ((a_chunk ^ (a_slot & 7)) << 4);
    auto issue_next = [&](int slot) {
        if (tid < 8 * NT) cp_async16(a_dst + slot * WV_A_BYTES(NT), a_cur, a_ok);
        if (tid < NT) cp_async16(s_sa + slot * WV_SA_BYTES(NT) + tid * 16, sa_cur, s_ok);
        if (tid < 64) cp_async4(s_ws + slot * W4_WS_BYTES + tid * 4, ws_cur, w_ok);
        asm volatile("cp.async.commit_group;\n" ::);
        a_cur += 128;
        sa_cur += 4;
        ws_cur += 4;
    };
    __syncthreads(); /* barrier initialisation, for every thread */
    for (int s = 0; s < W4_ST; s++) {
        if (s < nst) {
            issue_next(s);
        } else {
            asm volatile("cp.async.commit_group;\n" ::);
        }
    }

    /* acc: the current chunk's sum; tot: the finished chunks' sums, added in
     * order (rank 0 of a cluster, or a lone block); other ranks leave each
     * chunk's sum in `red` for rank 0 */
    float acc[4 * NB], tot[4 * NB], q[4][4 * NB];
#pragma unroll
    for (int i = 0; i < 4 * NB; i++) acc[i] = tot[i] = 0.0f;
    int done = 0; /* chunks finished */
    auto fold = [&]() {
#pragma unroll
        for (int i = 0; i < 4 * NB; i++) acc[i] *= 64.0f; /* codes were read as value * 2^-6 */
        if (KS == 1 || rank == 0) {
#pragma unroll
            for (int i = 0; i < 4 * NB; i++) tot[i] = done == 0 ? acc[i] : tot[i] + acc[i];
        } else {
#pragma unroll
            for (int b = 0; b < NB; b++)
                red[(done * NB + b) * 128 + tid] =
                    make_float4(acc[4 * b], acc[4 * b + 1], acc[4 * b + 2], acc[4 * b + 3]);
        }
#pragma unroll
        for (int i = 0; i < 4 * NB; i++) acc[i] = 0.0f;
        done++;
    };
    /* conversion role: 32 of row cr's 64 packed bytes, half ch */
    const int cr = tid >> 1, ch = tid & 1;
    const int ra = 16 * warp + (lane >> 2); /* the thread's result rows ra, ra + 8 */
    const uint64_t dw0 = make_desc(s_w, 16, 1024, 1), da0 = make_desc(s_a, 16, 1024, 1);
    int slot = 0, left = kst; /* ring slot and stages left in the chunk */
    uint32_t phase = 0;
    for (int st = 0; st < nst; st++) {
        mbar_wait(s_full + 8 * slot, phase);
        /* this thread's activation and scale copies of the stage */
        asm volatile("cp.async.wait_group %0;\n" ::"n"(W4_ST - 1));
        {
            uint8_t *own = smem + (s_f - base) + slot * W4_F_BYTES + cr * 64 + ch * 32; /* = tid * 32 */
            const uint4 *src = (const uint4 *)own;
            const uint4 f[2] = {src[0], src[1]};
            if (tid < 64) { /* row tid's four weight scales, over bytes already read */
                const uint32_t wsw = *(const uint32_t *)(smem + (s_ws - base) + slot * W4_WS_BYTES + tid * 4);
                *(float4 *)own = make_float4(e8m0_to_f32(wsw & 0xffu), e8m0_to_f32((wsw >> 8) & 0xffu),
                                             e8m0_to_f32((wsw >> 16) & 0xffu), e8m0_to_f32(wsw >> 24));
            }
            const uint32_t fw[8] = {f[0].x, f[0].y, f[0].z, f[0].w, f[1].x, f[1].y, f[1].z, f[1].w};
            uint8_t *dst_row = smem + (s_w - base) + cr * 128;
#pragma unroll
            for (int c = 0; c < 4; c++) { /* 16 e4m3 bytes from 8 packed bytes */
                uint32_t o[4];
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    const uint32_t lo = fp4_lo_to_e4m3(fw[2 * c + h2]), hi = fp4_hi_to_e4m3(fw[2 * c + h2]);
                    o[2 * h2] = __byte_perm(lo, hi, 0x5140);
                    o[2 * h2 + 1] = __byte_perm(lo, hi, 0x7362);
                }
                const int chunk = 4 * ch + c;
                *(uint4 *)(dst_row + ((chunk ^ (cr & 7)) << 4)) = make_uint4(o[0], o[1], o[2], o[3]);
            }
        }
        /* ordinary stores and cp.async data are read next by the tensor cores */
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        __syncthreads();
        wv_mma4_desc<NB>(q, dw0, da0 + (uint32_t)(slot * WV_A_BYTES(NT) / 16));
        const float4 *sa_st = (const float4 *)(smem + (s_sa - base) + slot * WV_SA_BYTES(NT));
        float4 sab[NB][2];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            sab[b][0] = sa_st[8 * b + 2 * t];
            sab[b][1] = sa_st[8 * b + 2 * t + 1];
        }
        float w0[4], w1[4]; /* the decoded weight scales of rows ra and ra + 8 */
        {
            const uint8_t *pk = smem + (s_f - base) + slot * W4_F_BYTES;
            const float4 fa = *(const float4 *)(pk + ra * 32), fb = *(const float4 *)(pk + (ra + 8) * 32);
            w0[0] = fa.x; w0[1] = fa.y; w0[2] = fa.z; w0[3] = fa.w;
            w1[0] = fb.x; w1[1] = fb.y; w1[2] = fb.z; w1[3] = fb.w;
        }
        wg_wait<0>();
        fence_regs_q<NB>(q);
        wv_promote<NB>(acc, q, sab, w0, w1);
        __syncthreads(); /* the slot is free: refill it */
        if (st + W4_ST < nst) {
            if (tid == 0) issue_w(st + W4_ST, slot, e);
            issue_next(slot);
        } else {
            asm volatile("cp.async.commit_group;\n" ::);
        }
        if (CPB > 1 && --left == 0) {
            left = kst;
            if (st + 1 < nst) fold();
        }
        if (++slot == W4_ST) {
            slot = 0;
            phase ^= 1u;
        }
    }
    asm volatile("cp.async.wait_group 0;\n" ::);
    while (done < CPB) fold(); /* the last chunk, then empty ones (sums of +0) */

    if (KS > 1) {
        cluster_sync(); /* every rank's chunk sums are in its `red` */
        if (rank == 0)
            for (uint32_t r = 1; r < KS; r++)
                for (int j = 0; j < CPB; j++) cluster_add<NB>(tot, red + j * NB * 128, tid, r);
        cluster_sync(); /* the other ranks' shared memory stays until read */
        if (rank != 0) return;
    }
#pragma unroll
    for (int i = 0; i < 4 * NB; i++) {
        const int64_t row = n0 + ra + ((i >> 1) & 1) * 8, slot = m0 + 8 * (i >> 2) + 2 * t + (i & 1);
        if (row < n && tm.valid(slot)) {
            const int64_t o = tm.orow(slot) * n + row;
            store_out1(out, out_bf16, o, tot[i]);
        }
    }
}

template <int KS, int CPB, int NB, bool GROUPED>
static cudaError_t w4_launch(const CUtensorMap &mw, const uint8_t *qa, const float *sa,
                             const uint8_t *ws, int64_t m, int64_t k, int64_t n, void *out,
                             int out_bf16, cudaStream_t stream, Groups grp, int ngroups) {
    const int kst = (int)((k / 128 + KS * CPB - 1) / (KS * CPB));
    const int smem = W4_SMEM(8 * NB, KS > 1 ? CPB : 0);
    static bool attr = false;
    if (!attr) {
        cudaError_t e = cudaFuncSetAttribute(matvec_fp4_wg_kernel<KS, CPB, NB, GROUPED>,
                                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
        if (e != cudaSuccess) return e;
        attr = true;
    }
    WvLaunch l(n, m, 8 * NB, ngroups, KS, smem, stream);
    return l.launch(matvec_fp4_wg_kernel<KS, CPB, NB, GROUPED>, mw, qa, sa, ws, m, k, n, out,
                    out_bf16, kst, grp);
}

static int w4_forced_gks = 0; /* measuring aid (bench, tests): blocks per row of a group */
extern "C" void cuda_matvec_set_grouped_ks(int ks) { w4_forced_gks = ks; }

/* Blocks per 64-row tile in the grouped form (a power of two dividing the
 * chunk count kc): the fewest that still give about three blocks per SM over
 * all groups, so that each block streams long k ranges with its ring full
 * instead of paying a prologue and a DRAM round trip per few stages. */
static int w4_grouped_ks(int kc, int64_t n, int ngroups) {
    if (w4_forced_gks > 0) {
        int ks = 1;
        while (2 * ks <= w4_forced_gks && 2 * ks <= kc) ks *= 2;
        return ks;
    }
    const int64_t blocks = (n + 63) / 64 * ngroups, want = 3 * (int64_t)sm_count();
    int ks = 1;
    while (ks < kc && blocks * ks < want) ks *= 2;
    return ks;
}

/* the token tile for a launch: 16 tokens only in the plain form past 8 */
template <int KS, int CPB, bool GROUPED>
static cudaError_t w4_go(bool nb2, const CUtensorMap &mw, const uint8_t *qa, const float *sa,
                         const uint8_t *ws, int64_t m, int64_t k, int64_t n, void *out,
                         int out_bf16, cudaStream_t stream, Groups grp, int ngroups) {
    if constexpr (GROUPED)
        return w4_launch<KS, CPB, 1, true>(mw, qa, sa, ws, m, k, n, out, out_bf16, stream, grp,
                                           ngroups);
    else if (nb2)
        return w4_launch<KS, CPB, 2, false>(mw, qa, sa, ws, m, k, n, out, out_bf16, stream, grp, 1);
    else
        return w4_launch<KS, CPB, 1, false>(mw, qa, sa, ws, m, k, n, out, out_bf16, stream, grp, 1);
}

/* MXFP4 on wgmma: whole 128-input stages and 16-byte aligned operands; m: the
 * tokens (plain) or the most token slots of a group (grouped, ngroups > 0).
 * The chunk count depends on n and k only, so a grouped row equals the plain
 * product bit for bit. Returns false (nothing launched) when it does not
 * apply. */
static bool w4_try(const uint8_t *qa, const float *sa, int64_t m, int64_t k, const uint8_t *w,
                   const uint8_t *ws, int64_t n, int64_t experts, void *out, int out_bf16,
                   cudaStream_t stream, Groups grp, int ngroups, cudaError_t *e) {
    if (k % 128 || m > 16 || (n + 63) / 64 * 8 > 0x7fffffffLL || (uintptr_t)qa % 16 ||
        (uintptr_t)w % 16 || (uintptr_t)sa % 16 || (uintptr_t)ws % 4)
        return false;
    /* [experts, n, k/2]: rows past n of an expert read as zeros, never the
     * next expert (the grouped form does not know the experts' count: ids
     * are the caller's contract, the bound only has to hold them) */
    PFN_cuTensorMapEncodeTiled_v12000 enc = tensor_map_encoder();
    CUtensorMap mw;
    const cuuint64_t dims[3] = {(cuuint64_t)(k / 2), (cuuint64_t)n, (cuuint64_t)experts};
    const cuuint64_t strides[2] = {(cuuint64_t)(k / 2), (cuuint64_t)(n * (k / 2))};
    const cuuint32_t box[3] = {64, 64, 1}, estr[3] = {1, 1, 1};
    if (!enc || enc(&mw, CU_TENSOR_MAP_DATA_TYPE_UINT8, 3, (void *)w, dims, strides, box, estr,
                    CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_NONE,
                    CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                    CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) != CUDA_SUCCESS)
        return false;
    const int kc = wv_pick_ks(n, k);
    /* The grouped form runs 8-token tiles whatever the capacity: the
     * moe_experts op passes the batch as every group's capacity, and at
     * batch 9-16 nearly every group holds 1-2 rows, so 16-token tiles would
     * copy and promote twice the slots for nothing (run 27: b16 w1 281 ->
     * 236 µs). A group past 8 rows takes a second block, which reads its
     * weights again; 8- and 16-token tiles give the same bits. */
    const bool nb2 = m > 8 && ngroups <= 0;
#define W4_GO(KSV, CPBV, G)                                                                    \
    w4_go<KSV, CPBV, G>(nb2, mw, qa, sa, ws, m, k, n, out, out_bf16, stream, grp, ngroups)
    if (ngroups <= 0) {
        switch (kc) {
        case 1: *e = W4_GO(1, 1, false); break;
        case 2: *e = W4_GO(2, 1, false); break;
        case 4: *e = W4_GO(4, 1, false); break;
        default: *e = W4_GO(8, 1, false); break;
        }
        return true;
    }
    const int gks = w4_grouped_ks(kc, n, ngroups);
    switch (kc * 16 + gks) {
    case 1 * 16 + 1: *e = W4_GO(1, 1, true); break;
    case 2 * 16 + 1: *e = W4_GO(1, 2, true); break;
    case 2 * 16 + 2: *e = W4_GO(2, 1, true); break;
    case 4 * 16 + 1: *e = W4_GO(1, 4, true); break;
    case 4 * 16 + 2: *e = W4_GO(2, 2, true); break;
    case 4 * 16 + 4: *e = W4_GO(4, 1, true); break;
    case 8 * 16 + 1: *e = W4_GO(1, 8, true); break;
    case 8 * 16 + 2: *e = W4_GO(2, 4, true); break;
    case 8 * 16 + 4: *e = W4_GO(4, 2, true); break;
    default: *e = W4_GO(8, 1, true); break;
    }
#undef W4_GO
    return true;
}

di_status cuda_launch_matvec_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                 const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                 int out_bf16, cudaStream_t stream, di_err *err) {
    cudaError_t e = cudaSuccess;
    /* batch-invariant mode (where the tiles cannot run): the mma.sync kernel
     * below at every m (its split depends on n alone), not the wgmma one of
     * up to 16 rows */
    if (!cuda_batch_invariant() && wv_try(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &e))
        return cuda_check(e, err, "gemm_fp8 (matvec, wgmma)");
    return launch_matvec<0>("gemm_fp8 (matvec)", qa, sa, m, k, w, ws, n, out, out_bf16, stream,
                            err);
}

di_status cuda_launch_matvec_fp8_tiles_bits(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                            const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                            int out_bf16, cudaStream_t stream, int *done, di_err *err) {
    cudaError_t e = cudaSuccess;
    *done = 0;
    if (!cuda_batch_invariant()) return DI_OK; /* one rank: the mode's */
    *done = wv_try(qa, sa, m, k, w, ws, n, out, out_bf16, stream, &e);
    return *done ? cuda_check(e, err, "gemm_fp8 (matvec, wgmma, one rank)") : DI_OK;
}

di_status cuda_launch_matvec_fp8_x(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                   const uint8_t *ws, int64_t n, void *out, int out_bf16,
                                   cudaStream_t stream, int *done, di_err *err) {
    cudaError_t e = cudaSuccess;
    *done = wv_try_x(x, m, k, w, ws, n, out, out_bf16, stream, &e);
    return *done ? cuda_check(e, err, "gemm_fp8 (matvec, wgmma, quantizing)") : DI_OK;
}

di_status cuda_launch_matvec_fp8_x_swiglu_add(const float *g, const float *u, float limit, const float *add,
                                              int64_t m, int64_t k, const uint8_t *w, const uint8_t *ws, int64_t n,
                                              float *out, int out_bf16, cudaStream_t stream, int *done, di_err *err) {
    cudaError_t e = cudaSuccess;
    *done = wv_try_x(g, m, k, w, ws, n, out, out_bf16, stream, &e, WvXf{u, add, limit});
    return *done ? cuda_check(e, err, "gemm_fp8 (matvec, wgmma, swiglu and add)") : DI_OK;
}

di_status cuda_launch_matvec_fp8_x_pair(const float *x, int64_t m, int64_t k, const uint8_t *w,
                                        const uint8_t *ws, const uint8_t *w2, const uint8_t *ws2, int64_t n,
                                        int64_t n2, void *out, void *out2, int out_bf16, cudaStream_t stream,
                                        int *done, di_err *err) {
    cudaError_t e = cudaSuccess;
    *done = wv_try_x_pair(x, m, k, w, ws, w2, ws2, n, n2, out, out2, out_bf16, stream, &e);
    return *done ? cuda_check(e, err, "gemm_fp8 pair (matvec, wgmma, quantizing)") : DI_OK;
}

/* Where the MXFP4 decode form (cuda_fp4_dec.cu) runs. Mode 3 (the
 * default): its tensor-core kernel wherever that applies (k % 256 == 0,
 * aligned operands: the model's expert shapes), plain products of up to 16
 * tokens and grouped ones alike; its CUDA-core kernel only for grouped
 * decode batches past 16 rows a group where the tensor-core one does not
 * apply; the wgmma kernel for the rest of up to 16 rows. Measured (pair run
 * 1 in docs/gpu-notes.md, one H200, with w1 and w3 as one launch): decode
 * b8 5.32 -> 4.83 ms/step and b1 2.31 -> 2.22 against mode 2. Mode 2
 * (DI_CUDA_FP4_DEC=2, the default before): the decode form past 16 rows a
 * group only (b64 w1 1540 us in the wgmma kernel, 1293 in the CUDA-core
 * form, 611 in the tensor-core form; MXFP4 runs 4-5). Mode 1
 * (DI_CUDA_FP4_DEC=1): the decode form for plain products of up to 16
 * tokens and every grouped one, CUDA-core kernel included; mode 0
 * (DI_CUDA_FP4_DEC=0): never. Which form a product takes depends on k, the
 * alignment and the group size, so the plain and grouped products of up to
 * 16 rows always take the same form: a grouped row still equals the plain
 * product of that row. cuda_matvec_set_fp4_dec: 0 / 1 / 2 / 3 force a mode
 * (tests, bench), -1 back to the environment. */
static int fp4_dec_forced = -1;
extern "C" void cuda_matvec_set_fp4_dec(int mode) { fp4_dec_forced = mode; }
static int fp4_dec_mode(void) {
    if (fp4_dec_forced >= 0) return fp4_dec_forced;
    static int env_mode = -1;
    if (env_mode < 0) {
        const char *v = getenv("DI_CUDA_FP4_DEC");
        env_mode = v && v[0] >= '0' && v[0] <= '2' && !v[1] ? v[0] - '0' : 3;
    }
    return env_mode;
}
/* whether a product of up to 16 rows (plain: m, grouped: max_rows) or a
 * grouped one past that takes the decode form, given what of it applies.
 * Batch-invariant mode: wherever it applies, at any number of rows (a row's
 * bits depend on nothing but its own inputs there); where it does not, the
 * mma.sync kernel at any number of rows, never the wgmma one of up to 16
 * rows or the grouped tiles. The grouped tiles at every m instead
 * (DI_CUDA_BI_MOE=tiled, a measuring aid) measured (docs/gpu-notes.md,
 * invariant run 3; the model's 6 MoE layers) 86 against 293 ms for a
 * prefill of 8K tokens, but 4.5 against 1.5 ms a layer at batch 64 and
 * 0.89 against 0.34 at batch 8: decode, where offline batches spend their
 * time, keeps the decode form. */
static bool fp4_dec_takes(int64_t rows, int applies) {
    const int mode = fp4_dec_mode();
    if (!applies) return false;
    if (cuda_batch_invariant()) return mode != 0;
    if (mode == 1) return true;
    if (mode == 2) return rows > 16;
    if (mode == 3) return rows > 16 || applies == 2;
    return false;
}

di_status cuda_launch_matvec_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                   const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                   int out_bf16, cudaStream_t stream, di_err *err) {
    cudaError_t e = cudaSuccess;
    const bool bi = cuda_batch_invariant();
    if ((m <= 16 || bi) && fp4_dec_takes(m, cuda_fp4_dec_applies(qa, w, ws, k)))
        return cuda_launch_fp4_dec(qa, sa, m, k, w, ws, n, NULL, NULL, 0, NULL, (int32_t)m, out,
                                   out_bf16, stream, err);
    if (!bi && w4_try(qa, sa, m, k, w, ws, n, 1, out, out_bf16, stream, Groups{NULL, NULL, NULL}, 0, &e))
        return cuda_check(e, err, "gemm_mxfp4 (matvec, wgmma)");
    return launch_matvec<1>("gemm_mxfp4 (matvec)", qa, sa, m, k, w, ws, n, out, out_bf16,
                            stream, err);
}

/* measuring aid (bench, tests): 0 keeps groups of many rows on the 8-token
 * mma.sync kernel below */
static int grouped_tiled_on = 1;
extern "C" void cuda_matvec_set_grouped_tiled(int on) { grouped_tiled_on = on; }

/* many rows per group (a prefill: max_rows is the batch, an upper bound of
 * every group's rows, and at least five per group on average): the tiled
 * GEMM, which reads a weight tile once per 64 rows instead of once per
 * token tile of the decode kernel (cuda_gemm_grouped.cu). Five, not four
 * (the rule before), since the decode kernel's 16-slot tiles: measured
 * (run 152 in docs/gpu-notes.md, the 6-layer dummy, greedy decode steps,
 * the model's 384 experts) tiles / decode form at batch 1,536 (4 rows a
 * group) 88.9-90.3 / 83.8-85.4 ms, 1,792 (4.7) 97.5-99.4 / 96.4-99.0, 2,048
 * (5.3) 103.0-106.3 / 112.1-112.5. DI_CUDA_GG_ROWS=r (measuring aid) moves
 * the average to r rows a group. */
static int64_t grouped_tiled_rows(void) {
    static long env = LONG_MIN;
    const long r = cuda_env_long("DI_CUDA_GG_ROWS", 0, &env);
    return r > 0 ? r : 5;
}
static bool grouped_takes_tiled(const uint8_t *qa, int32_t max_rows, int32_t ngroups) {
    if (cuda_batch_invariant()) { /* DI_CUDA_BI_MOE=tiled: the tiles at every m (measuring aid) */
        static int bi_tiled = -1;
        if (bi_tiled < 0) {
            const char *v = getenv("DI_CUDA_BI_MOE");
            bi_tiled = v && !strcmp(v, "tiled");
        }
        return bi_tiled && grouped_tiled_on && ngroups <= CUDA_GG_MAX_GROUPS && (uintptr_t)qa % 16 == 0;
    }
    return grouped_tiled_on && max_rows > 16 && max_rows >= grouped_tiled_rows() * (int64_t)ngroups &&
           ngroups <= CUDA_GG_MAX_GROUPS && (uintptr_t)qa % 16 == 0;
}

di_status cuda_launch_matvec_mxfp4_grouped(const uint8_t *qa, const float *sa, int64_t k,
                                           const uint8_t *w, const uint8_t *ws, int64_t n,
                                           const int32_t *ids, const int32_t *off,
                                           int32_t ngroups, const int32_t *rows,
                                           int32_t max_rows, void *out, int out_bf16,
                                           cudaStream_t stream, di_err *err) {
    if (check_grid(max_rows, n, err, "gemm_mxfp4_grouped")) return err->code;
    if (ngroups > 65535)
        return di_err_set(err, DI_ERR_LIMIT, "gemm_mxfp4_grouped: %d groups (at most 65535)",
                          (int)ngroups);
    if (!fast_ok(qa, w, k))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "gemm_mxfp4_grouped: needs k %% 32 == 0 (k = %lld) and 16-byte aligned "
                          "weights", (long long)k);
    if (grouped_takes_tiled(qa, max_rows, ngroups))
        return cuda_launch_gemm_mxfp4_grouped_tiled(qa, sa, k, w, ws, n, ids, off, ngroups, rows,
                                                    out, out_bf16, stream, err);
    if (fp4_dec_takes(max_rows, cuda_fp4_dec_applies(qa, w, ws, k)))
        return cuda_launch_fp4_dec(qa, sa, 0, k, w, ws, n, ids, off, ngroups, rows, max_rows, out,
                                   out_bf16, stream, err);
    Groups grp = {ids, off, rows};
    cudaError_t e = cudaSuccess;
    /* the experts' count only bounds the tensor map: ids < 65536 */
    if (max_rows <= 16 && !cuda_batch_invariant() && w4_try(qa, sa, max_rows, k, w, ws, n, 65535, out, out_bf16, stream, grp,
                                 ngroups, &e))
        return cuda_check(e, err, "gemm_mxfp4_grouped (wgmma)");
    switch (pick_ksplit(n, MV_ROWS)) {
    case 1: e = launch_one<1, true, 1, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    case 2: e = launch_one<1, true, 2, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    default: e = launch_one<1, true, 4, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    }
    return cuda_check(e, err, "gemm_mxfp4_grouped launch");
}

di_status cuda_launch_matvec_mxfp4_grouped_swiglu(const float *g, const float *u, const float *pw, int in_bf16,
                                                  float limit, int64_t pair_k, int64_t k, const uint8_t *w,
                                                  const uint8_t *ws, int64_t n, const int32_t *ids, const int32_t *off,
                                                  int32_t ngroups, const int32_t *rows, int32_t max_rows, void *out,
                                                  int out_bf16, cudaStream_t stream, int *done, di_err *err) {
    *done = 0;
    const uint8_t *qa = (const uint8_t *)g; /* for the choice: alignment only */
    if (!(ngroups > 0 && ngroups <= 65535 && max_rows > 0 && n > 0 && fast_ok(qa, w, k) &&
          cuda_fp4_dec_swiglu_pays(pair_k, k, ngroups, max_rows) &&
          !grouped_takes_tiled(qa, max_rows, ngroups) && cuda_fp4_dec_applies(qa, w, ws, k) == 2 &&
          fp4_dec_takes(max_rows, 2)))
        return DI_OK;
    di_status st = cuda_launch_fp4_dec_swiglu(g, u, pw, in_bf16, limit, k, w, ws, n, ids, off, ngroups, rows,
                                              max_rows, out, out_bf16, stream, err);
    if (!st) *done = 1;
    return st;
}

di_status cuda_launch_matvec_mxfp4_grouped_pair(const uint8_t *qa, const float *sa, int64_t k,
                                                const uint8_t *w, const uint8_t *ws, const uint8_t *w_b,
                                                const uint8_t *ws_b, int64_t n, const int32_t *ids,
                                                const int32_t *off, int32_t ngroups, const int32_t *rows,
                                                int32_t max_rows, void *out, void *out_b, int out_bf16,
                                                cudaStream_t stream, di_err *err) {
    if (ngroups > 0 && ngroups <= 65535 && max_rows > 0 && n > 0 && fast_ok(qa, w, k) && fast_ok(qa, w_b, k) &&
        !grouped_takes_tiled(qa, max_rows, ngroups) && cuda_fp4_dec_applies(qa, w, ws, k) == 2 &&
        cuda_fp4_dec_applies(qa, w_b, ws_b, k) == 2 && fp4_dec_takes(max_rows, 2))
        return cuda_launch_fp4_dec_pair(qa, sa, k, w, ws, w_b, ws_b, n, ids, off, ngroups, rows, max_rows, out,
                                        out_b, out_bf16, stream, err);
    di_status st = cuda_launch_matvec_mxfp4_grouped(qa, sa, k, w, ws, n, ids, off, ngroups, rows, max_rows, out,
                                                    out_bf16, stream, err);
    if (st) return st;
    return cuda_launch_matvec_mxfp4_grouped(qa, sa, k, w_b, ws_b, n, ids, off, ngroups, rows, max_rows, out_b,
                                            out_bf16, stream, err);
}
