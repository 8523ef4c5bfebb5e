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
 * the fallback GEMM for shapes the tiled kernel does not take. */
#include "backend/cuda/cuda_common.cuh"

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

__device__ __forceinline__ void cp_async16_zfill(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(valid ? 16 : 0));
}

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
                cp_async16_zfill(st + row * MV_ROW + col, src, ok);
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
                    if (out_bf16) ((uint16_t *)out)[o] = f32_to_bf16_bits(v[i]);
                    else ((float *)out)[o] = v[i];
                }
            }
        } else {
            const int64_t col = n0 + 2 * t;
            if (m0 + g < m) store_out2(out, out_bf16, n, m0 + g, col, acc[0], acc[1]);
            if (m0 + g + 8 < m) store_out2(out, out_bf16, n, m0 + g + 8, col, acc[2], acc[3]);
        }
    }
}

static int sm_count(void) {
    static int sms = 0;
    if (sms == 0) {
        int dev = 0, v = 0;
        if (cudaGetDevice(&dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&v, cudaDevAttrMultiProcessorCount, dev) == cudaSuccess)
            sms = v;
        else
            sms = 132;
        (void)cudaGetLastError();
    }
    return sms;
}

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

di_status cuda_launch_matvec_fp8(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                 const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                 int out_bf16, cudaStream_t stream, di_err *err) {
    return launch_matvec<0>("gemm_fp8 (matvec)", qa, sa, m, k, w, ws, n, out, out_bf16, stream,
                            err);
}

di_status cuda_launch_matvec_mxfp4(const uint8_t *qa, const float *sa, int64_t m, int64_t k,
                                   const uint8_t *w, const uint8_t *ws, int64_t n, void *out,
                                   int out_bf16, cudaStream_t stream, di_err *err) {
    return launch_matvec<1>("gemm_mxfp4 (matvec)", qa, sa, m, k, w, ws, n, out, out_bf16,
                            stream, err);
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
    Groups grp = {ids, off, rows};
    cudaError_t e;
    switch (pick_ksplit(n, MV_ROWS)) {
    case 1: e = launch_one<1, true, 1, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    case 2: e = launch_one<1, true, 2, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    default: e = launch_one<1, true, 4, true>(qa, sa, max_rows, k, w, ws, n, out, out_bf16, stream, grp, ngroups); break;
    }
    return cuda_check(e, err, "gemm_mxfp4_grouped launch");
}
