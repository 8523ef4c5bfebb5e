/* Sparse attention with sink on the tensor cores (architecture.md §5.5),
 * the form of cuda_attn_tc.h (prefill chunks and decode steps alike).
 *
 * Shape of the work: every head of a query row attends over the same slots
 * (one kv head, K = V), so one block takes one query row and 64 heads: per
 * block of 64 slots it decodes the packed rows once into shared memory as
 * bf16, and the heads form the m side of the products, S = Q·Kᵀ [64 heads ×
 * 64 slots] and O += P·V [64 heads × d]. Queries of a row differ in their
 * slots (window bounds, the indexer's selection), so keys are shared across
 * heads, not across rows; the CPU op's 64-slot blocks per row are kept so
 * the running maximum, and with it every rounding of p to bf16, follows the
 * CPU's order.
 *
 * Eight warps: warp w owns heads 16·(w mod 4) .. +15 and half w / 4 of the
 * slots for S and of the d columns for O (its O tile, 16 × d/2 fp32, lives
 * in registers); decode steps take blocks of 16 heads instead, the warps
 * splitting slots and columns eight ways (k_sparse_attn_tc). S goes through shared memory so that each warp sees its
 * heads' 64 scores, then does the block's softmax step exactly as the CPU:
 * block max over the non-empty slots, new max, rescale = exp(old - new),
 * p = exp(s - new) in fp32 for the denominator, bf16(p) as the A operand of
 * P·V.
 *
 * Numerics against the CPU op: every product is exact (q is bf16, a decoded
 * value is code·scale with at most 6 significant bits, p is rounded to bf16
 * first, as the CPU rounds it); what differs is the order of the fp32 sums
 * (q·k over d, p·v over the slots, the denominator) and CUDA's expf. Those
 * move s and p by a few fp32 ulps, which can flip a bf16 rounding of p (one
 * bf16 ulp of that p) or of the output; tests/unit/test_cuda_backend.c
 * derives its bound from exactly these terms.
 *
 * Speed: a block is bound by latency and instruction issue, not by the
 * tensor cores (one 64-slot block takes ~12 µs where its 2,048 mma take
 * ~2 µs; docs/gpu-notes.md), so the decode, which runs once per query for
 * all heads, is written for few instructions per value and all of a warp's
 * loads in flight at once (1.5x the first version's speed, same bits).
 * With few query rows the split-slot form spreads a row's slot blocks over
 * a cluster of up to 16 blocks and combines them (sparse_attn_tc_combine):
 * one row of 640 slots 110 → 51 µs (docs/gpu-notes.md, run 26) with 5
 * blocks of two slot blocks each, 23.4 → 16.1 µs with 10 blocks of one
 * each (attention runs 1-2). */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cooperative_groups.h>

#include "backend/cuda/cuda_attn_tc.h"
#include "backend/cuda/cuda_mma.cuh"
#include "backend/cuda/cuda_ops_common.cuh"

namespace cg = cooperative_groups;

enum {
    TC_HEADS = 64,   /* heads per block of the 64-head form: the m side of both products */
    TC_SLOTS = 64,   /* slots per softmax step, the CPU op's block */
    TC_THREADS = 256,
    TC_MAX_D = 512,
    TC_PAD = 8,      /* bf16 of padding per shared row: ldmatrix rows hit distinct banks */
    TC_SLD = TC_SLOTS + 8, /* floats per score row: the fragment stores hit distinct banks */
    TC_MAX_SPLIT = 16      /* blocks per row in the split form: past 8 a non-portable cluster */
};

/* shared bytes: q [hb, d + 8] and kv [64, d + 8] bf16, scores [hb, TC_SLD]
 * fp32, the block's 64 row pointers (hb: heads per block) */
static size_t tc_smem_bytes(int64_t d, int hb) {
    return (size_t)((hb + TC_SLOTS) * (d + TC_PAD)) * 2 + (size_t)(hb * TC_SLD) * 4 +
           TC_SLOTS * sizeof(void *);
}

__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

__device__ __forceinline__ void ldsm_x4(uint32_t a, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x2(uint32_t a, uint32_t r[2]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(a));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t a, uint32_t r[4]) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(a));
}

/* E2M1 nibble -> the E4M3 byte of value·2⁻⁶ (sign to bit 7, exponent and
 * mantissa two places up: normal and subnormal codes both map exactly) */
__device__ __forceinline__ uint32_t e2m1_as_e4m3(uint32_t n) {
    return ((n & 8u) << 4) | ((n & 7u) << 2);
}

__device__ __forceinline__ uint32_t ld_bytes(const uint8_t *p, int n) {
    uint32_t v = 0;
    for (int b = 0; b < n; b++) v |= (uint32_t)p[b] << (8 * b);
    return v;
}

/* Values 16u .. 16u + 15 of a packed row of d values, in two steps so that
 * a warp's loads of several rows are in flight together: the raw bytes
 * (one 16- or 8-byte load and the scale byte), then 16 bf16 (32 bytes).
 * Window rows are DI_KVQ_FP8 (codes [d], E8M0 per 32 after them), the
 * others DI_KVQ_FP4_E4M3 (two codes a byte, low nibble first, E4M3 per 16
 * after the d/2 code bytes). Rows of the model's d = 512 are 16-byte
 * aligned; other sizes may not be, hence the byte path. */
struct raw16 {
    uint32_t a, b, c, d, sb;
};

__device__ __forceinline__ raw16 chunk16_load(const uint8_t *r, int d, int u, bool win) {
    raw16 w;
    if (win) {
        const uint8_t *c = r + 16 * u;
        if (((uintptr_t)c & 15u) == 0) {
            uint4 v = *reinterpret_cast<const uint4 *>(c);
            w.a = v.x;
            w.b = v.y;
            w.c = v.z;
            w.d = v.w;
        } else {
            w.a = ld_bytes(c, 4);
            w.b = ld_bytes(c + 4, 4);
            w.c = ld_bytes(c + 8, 4);
            w.d = ld_bytes(c + 12, 4);
        }
        w.sb = r[d + u / 2];
    } else {
        const uint8_t *c = r + 8 * u;
        if (((uintptr_t)c & 7u) == 0) {
            uint2 v = *reinterpret_cast<const uint2 *>(c);
            w.a = v.x;
            w.b = v.y;
        } else {
            w.a = ld_bytes(c, 4);
            w.b = ld_bytes(c + 4, 4);
        }
        w.c = w.d = 0;
        w.sb = r[d / 2 + u];
    }
    return w;
}

/* 8 E2M1 codes (4 bytes, low nibble first) -> their E4M3 bytes of value·2⁻⁶
 * in value order, 4 a word, four at a time within the word */
__device__ __forceinline__ void e2m1x8_as_e4m3(uint32_t x, uint32_t &p0, uint32_t &p1) {
    uint32_t lo = x & 0x0f0f0f0fu, hi = (x >> 4) & 0x0f0f0f0fu;
    uint32_t el = ((lo & 0x08080808u) << 4) | ((lo & 0x07070707u) << 2);
    uint32_t eh = ((hi & 0x08080808u) << 4) | ((hi & 0x07070707u) << 2);
    p0 = __byte_perm(el, eh, 0x5140); /* values 0 1 2 3 */
    p1 = __byte_perm(el, eh, 0x7362); /* values 4 5 6 7 */
}

__device__ __forceinline__ void chunk16_decode(raw16 w, bool win, uint4 &o0, uint4 &o1) {
    uint32_t e[4];
    float s;
    if (win) {
        e[0] = w.a;
        e[1] = w.b;
        e[2] = w.c;
        e[3] = w.d;
        s = e8m0_to_f32(w.sb);
    } else {
        e2m1x8_as_e4m3(w.a, e[0], e[1]);
        e2m1x8_as_e4m3(w.b, e[2], e[3]);
        s = MUL(e4m3_val(w.sb), 64.0f);
    }
    o0 = make_uint4(e4m3x2_bf16x2(e[0] & 0xffffu, s), e4m3x2_bf16x2(e[0] >> 16, s),
                    e4m3x2_bf16x2(e[1] & 0xffffu, s), e4m3x2_bf16x2(e[1] >> 16, s));
    o1 = make_uint4(e4m3x2_bf16x2(e[2] & 0xffffu, s), e4m3x2_bf16x2(e[2] >> 16, s),
                    e4m3x2_bf16x2(e[3] & 0xffffu, s), e4m3x2_bf16x2(e[3] >> 16, s));
}

/* A lane's 16 values of the eight rows w, w + 8, ... of a slot block where
 * every row is of one kind (WIN: window rows, else compressed) and 16-byte
 * (window) or 8-byte (compressed) aligned: the loads of all eight rows
 * first, then each row through e4m3x2_bf16x2_mul (cuda_mma.cuh) with the
 * multiplier taken from the scale byte directly, no branch between the
 * rows, so their loads and conversions overlap (the general path above
 * takes a branch per row for its kind and alignment: ~110 instructions a
 * row against ~35 here; attention run 5).
 *
 * The multiplier is scale·2^120 as a bf16 pair; the code's bits moved into
 * a bf16 are code·2^-120 exactly, so the product is the exact code·scale
 * rounded once to bf16, which is what chunk16_decode gives (the same exact
 * product in fp32, then rounded): the same bits wherever the multiplier is
 * exact and the product a bf16 normal. That holds for window scales 2^(E -
 * 127) with E in [10, 134] (E8M0) and for compressed scales e4m3·64 with
 * the e4m3 a normal of exponent field 1..8 and sign 0 (e4m3·64 in [2^0, 2^8),
 * four significant bits); E4M3 codes 0x7f / 0xff (NaN) are not. Empty
 * slots (NULL rows) decode as zeros with a neutral scale. Returns false
 * where any of the lane's rows falls outside: the caller then decodes all
 * eight again by the general path (the stores here are overwritten). */
template <bool WIN>
__device__ __forceinline__ bool chunk16_rows_fast(const uint8_t *const (&r)[TC_SLOTS / 8], int d, int u,
                                                  uint16_t *dst, int stride) {
    constexpr int R = TC_SLOTS / 8;
    uint4 v[R];
    uint32_t sb[R];
#pragma unroll
    for (int t = 0; t < R; t++) {
        v[t] = make_uint4(0u, 0u, 0u, 0u);
        sb[t] = WIN ? 127u : 0x38u; /* 2^0, e4m3 1.0 */
        if (r[t]) {
            if (WIN) {
                v[t] = *reinterpret_cast<const uint4 *>(r[t] + 16 * u);
                sb[t] = r[t][d + u / 2];
            } else {
                uint2 x = *reinterpret_cast<const uint2 *>(r[t] + 8 * u);
                v[t].x = x.x;
                v[t].y = x.y;
                sb[t] = r[t][d / 2 + u];
            }
        }
    }
    uint32_t bad = 0;
#pragma unroll
    for (int t = 0; t < R; t++) {
        uint32_t mul, e[4], a[2][4];
        if (WIN) {
            bad |= (sb[t] - 10u) > 124u ? 0x80u : 0u;
            mul = ((sb[t] + 120u) << 7) * 0x10001u;
            e[0] = v[t].x, e[1] = v[t].y, e[2] = v[t].z, e[3] = v[t].w;
        } else {
            const uint32_t ex = sb[t] >> 3; /* 16 and up where the sign is set */
            bad |= ex - 1u > 7u ? 0x80u : 0u;
            mul = (((ex + 246u) << 7) | ((sb[t] & 7u) << 4)) * 0x10001u;
            e2m1x8_as_e4m3(v[t].x, e[0], e[1]);
            e2m1x8_as_e4m3(v[t].y, e[2], e[3]);
        }
        const uint32_t nan = e4m3x8_bf16x2_mul(make_uint2(e[0], e[1]), mul, a[0]) |
                             e4m3x8_bf16x2_mul(make_uint2(e[2], e[3]), mul, a[1]);
        if (WIN) bad |= nan; /* E2M1 codes never map to 0x7f / 0xff */
        uint4 *o = reinterpret_cast<uint4 *>(dst + t * stride);
        o[0] = make_uint4(a[0][0], a[0][1], a[0][2], a[0][3]);
        o[1] = make_uint4(a[1][0], a[1][1], a[1][2], a[1][3]);
    }
    return !(bad & 0x80808080u);
}

/* The general key decode of a lane's eight rows (any mix of window and
 * compressed rows, any alignment): the form before chunk16_rows_fast,
 * which now runs only for slot blocks that straddle n_win, rows of odd
 * alignment or scales outside the fast form's range. Out of line
 * (ATTN_GENERAL_INLINE=0, the default) so that the kernel's own code stays
 * small: at batch 1 every call fetches the kernel's instructions cold, and
 * with both forms inline the general path's blocks paid 3-5 µs of
 * instruction-fetch stalls (docs/gpu-notes.md run 95). */
#ifndef ATTN_GENERAL_INLINE
#define ATTN_GENERAL_INLINE 0
#endif
#if ATTN_GENERAL_INLINE
__device__ __forceinline__
#else
__device__ __noinline__
#endif
void chunk16_rows_general(const uint8_t *const *rp, int d, int lane, int warp, int b0, int n_win, uint16_t *ks,
                          int ld) {
    raw16 w[TC_SLOTS / 8];
#pragma unroll
    for (int t = 0; t < TC_SLOTS / 8; t++) {
        int j = warp + 8 * t;
        const uint8_t *r = rp[j];
        w[t] = r ? chunk16_load(r, d, lane, b0 + j < n_win) : raw16{0u, 0u, 0u, 0u, 0u};
    }
#if ATTN_GENERAL_INLINE
#pragma unroll 1
#else
#pragma unroll
#endif
    for (int t = 0; t < TC_SLOTS / 8; t++) {
        int j = warp + 8 * t;
        uint4 v0 = make_uint4(0u, 0u, 0u, 0u), v1 = v0;
        if (rp[j]) chunk16_decode(w[t], b0 + j < n_win, v0, v1);
        uint4 *dst = reinterpret_cast<uint4 *>(ks + j * ld + 16 * lane);
        dst[0] = v0;
        dst[1] = v1;
    }
}

/* The combine of a split row, in every block of the cluster: each block
 * leaves its (running max M_c, denominator l_c, unnormalized O_c) per head
 * in its own shared memory (O_c over the q and kv tiles, free by now), and
 * block r then forms output elements r·4, (r + S)·4, ... of the [64 heads,
 * d] tile from all S blocks in rank order:
 *   M = max_c M_c, w_c = exp(M_c − M),
 *   out = bf16(Σ_c O_c·w_c / (Σ_c l_c·w_c + exp(sink − M))),
 * the sink folded in once, the sums in rank order, so the bits depend on
 * the slot count (which fixes S and the spans) and not on timing. One
 * block (S = 1) gives w = 1 exactly: the unsplit kernel's bits. */
template <int HG>
__device__ __forceinline__ void sparse_attn_tc_combine(const float (*o)[4], const float *mx,
                                                       const float *sum, uint8_t *smraw, float *ss,
                                                       int h, int d, int h0, int64_t i,
                                                       const float *sink, float *out) {
    constexpr int HB = 16 * HG, NPART = 8 / HG;
    cg::cluster_group cl = cg::this_cluster();
    const int nsplit = (int)cl.num_blocks(), rank = (int)cl.block_rank();
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3, hg = warp % HG, part = warp / HG, dp = d / NPART;
    float *os = reinterpret_cast<float *>(smraw); /* [HB, d] fp32 */
    float *ms = ss, *ls = ss + HB;                /* [HB] each */
    float *wv = ss + 2 * HB;                      /* [HB, TC_MAX_SPLIT] */
    float *tt = wv + HB * TC_MAX_SPLIT;           /* [HB] */
    __syncthreads(); /* every warp's P·V reads of ks are done */
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int hr = 16 * hg + g + 8 * r;
        float *orow = os + (int64_t)hr * d + part * dp + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < TC_MAX_D / (8 * NPART); nt++)
            if (nt < dp / 8)
                *reinterpret_cast<float2 *>(orow + 8 * nt) = make_float2(o[nt][2 * r], o[nt][2 * r + 1]);
        if (part == 0 && t4 == 0) { /* every part holds the same max and sum */
            ms[hr] = mx[r];
            ls[hr] = sum[r];
        }
    }
    cl.sync();
    /* The sums start from their first term (not from +0), so that S = 1
     * keeps even a -0 of the unsplit kernel. */
    if (tid < HB) {
        float mc[TC_MAX_SPLIT], lc[TC_MAX_SPLIT];
#pragma unroll
        for (int c = 0; c < TC_MAX_SPLIT; c++)
            if (c < nsplit) {
                mc[c] = *cl.map_shared_rank(ms + tid, c);
                lc[c] = *cl.map_shared_rank(ls + tid, c);
            }
        float M = mc[0];
#pragma unroll
        for (int c = 1; c < TC_MAX_SPLIT; c++)
            if (c < nsplit) M = fmaxf(M, mc[c]);
        float tot = 0.f;
#pragma unroll
        for (int c = 0; c < TC_MAX_SPLIT; c++)
            if (c < nsplit) {
                float w = expf(SUB(mc[c], M));
                wv[tid * TC_MAX_SPLIT + c] = w;
                tot = c ? ADD(tot, MUL(lc[c], w)) : MUL(lc[c], w);
            }
        tt[tid] = h0 + tid < h ? ADD(tot, expf(SUB(sink[h0 + tid], M))) : 1.f;
    }
    __syncthreads();
    const int n4 = HB * d / 4;
    for (int f = rank * TC_THREADS + tid; f < n4; f += nsplit * TC_THREADS) {
        int e = 4 * f, hr = e / d, k = e - hr * d;
        if (h0 + hr >= h) continue;
        float4 v[TC_MAX_SPLIT]; /* every block's value in flight at once */
#pragma unroll
        for (int c = 0; c < TC_MAX_SPLIT; c++)
            if (c < nsplit) v[c] = *cl.map_shared_rank(reinterpret_cast<float4 *>(os + e), c);
        float w = wv[hr * TC_MAX_SPLIT];
        float4 a = make_float4(MUL(v[0].x, w), MUL(v[0].y, w), MUL(v[0].z, w), MUL(v[0].w, w));
#pragma unroll
        for (int c = 1; c < TC_MAX_SPLIT; c++)
            if (c < nsplit) {
                w = wv[hr * TC_MAX_SPLIT + c];
                a.x = ADD(a.x, MUL(v[c].x, w));
                a.y = ADD(a.y, MUL(v[c].y, w));
                a.z = ADD(a.z, MUL(v[c].z, w));
                a.w = ADD(a.w, MUL(v[c].w, w));
            }
        float t = tt[hr];
        *reinterpret_cast<float4 *>(out + (i * h + h0 + hr) * d + k) =
            make_float4(round_bf16(a.x / t), round_bf16(a.y / t), round_bf16(a.z / t), round_bf16(a.w / t));
    }
    cl.sync(); /* the other blocks' shared memory stays until every block has read it */
}

/* out = bf16(O / (sum + exp(sink - max))) from a warp's fragments */
template <int HG>
__device__ __forceinline__ void sparse_attn_tc_store(const float (*o)[4], const float *mx, const float *sum,
                                                     int h, int d, int h0, int64_t i, const float *sink,
                                                     float *out) {
    constexpr int NPART = 8 / HG;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, t4 = lane & 3, hg = warp % HG, part = warp / HG;
    const int dp = d / NPART, ntn = dp / 8;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        int hh = h0 + 16 * hg + g + 8 * r;
        if (hh >= h) continue;
        float tot = ADD(sum[r], expf(SUB(sink[hh], mx[r])));
        float *orow = out + (i * h + hh) * d + part * dp + 2 * t4;
#pragma unroll
        for (int nt = 0; nt < TC_MAX_D / (8 * NPART); nt++)
            if (nt < ntn)
                *reinterpret_cast<float2 *>(orow + 8 * nt) =
                    make_float2(round_bf16(o[nt][2 * r] / tot), round_bf16(o[nt][2 * r + 1] / tot));
    }
}

/* SPLIT = false: one block per (query row, HB heads) walks all the row's
 * slot blocks. SPLIT = true: a cluster of gridDim.x / m blocks per (row,
 * HB heads), block `rank` walks the slots rank·span .. +span (span a
 * multiple of 64, so the CPU's 64-slot blocks are kept) with its own
 * running maximum, then the cluster combines (below).
 *
 * HG head groups of 16 per block (HB = 16·HG heads): warp w owns the heads
 * 16·(w mod HG) .. +15 and part w / HG of the 8 / HG parts of the slots (for
 * S) and of the d columns (for O). HG = 4 is the first form (64 heads, two
 * parts); HG = 1 (16 heads, eight parts, d % 128 == 0) puts four times the
 * blocks on a decode step's few rows, each with a quarter of the q loads,
 * products, output tile and combine, the key decode repeated per block.
 * Each value's operations and their order do not depend on HG (an S
 * element is the same chain of mma over d, each warp does the softmax step
 * of its 16 heads over all 64 slots from the shared scores, an O element
 * the same chain over the slot blocks), so neither do the bits. */
template <bool SPLIT, int HG>
__global__ void __launch_bounds__(TC_THREADS, HG == 1 ? 2 : 1)
k_sparse_attn_tc(const float *q, int h, int d, const uint8_t *const *rows, int n_slots, int n_win,
                 const float *sink, float scale, int span, int fast_ok, float *out) {
    constexpr int HB = 16 * HG, NPART = 8 / HG, SPW = TC_SLOTS / NPART; /* slots of S per warp */
    extern __shared__ __align__(16) uint8_t smraw[];
    const int ld = d + TC_PAD;
    uint16_t *qs = reinterpret_cast<uint16_t *>(smraw);      /* [HB, ld] bf16 */
    uint16_t *ks = qs + HB * ld;                              /* [64, ld] bf16 */
    float *ss = reinterpret_cast<float *>(ks + TC_SLOTS * ld); /* [HB, TC_SLD] */
    const uint8_t **rp = reinterpret_cast<const uint8_t **>(ss + HB * TC_SLD); /* [64] */

    const int nsplit = SPLIT ? (int)cg::this_cluster().num_blocks() : 1;
    const int rank = SPLIT ? (int)cg::this_cluster().block_rank() : 0;
    const int64_t i = blockIdx.x / nsplit;
    const int h0 = blockIdx.y * HB;
    /* this block's slots s0 .. s1 - 1 */
    const int s0 = SPLIT ? rank * span : 0;
    const int s1 = SPLIT ? min(n_slots, s0 + span) : n_slots;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t4 = lane & 3;
    const int hg = warp % HG, part = warp / HG;
    const int dp = d / NPART;  /* this warp's O columns: part·dp .. +dp */
    const int ntn = d / 16;    /* S k-steps of 16 */
    const int nto = dp / 8;    /* O n-tiles of 8 per warp */

    /* the first block's row pointers, then q, so that their loads are in
     * flight together: the keys' loads wait for the pointers, not for q */
    const uint8_t *const *ri = rows + i * n_slots;
    const uint8_t *nxt = s0 + tid < s1 && tid < TC_SLOTS ? ri[s0 + tid] : nullptr;
    /* q rows of this block's heads as bf16 (exact: q holds bf16 values);
     * a thread's 8 loads (16 heads of 512) in one round trip */
    const int q4 = d / 4; /* float4 a row; (r, k4) of element c = tid + n·TC_THREADS stepped, not divided */
    const int dr = TC_THREADS / q4, dk = TC_THREADS - dr * q4;
    int r = tid / q4, k4 = tid - r * q4;
#pragma unroll 8
    for (int c = tid; c < HB * q4; c += TC_THREADS) {
        float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
        if (h0 + r < h) v = *reinterpret_cast<const float4 *>(q + (i * h + h0 + r) * d + 4 * k4);
        *reinterpret_cast<uint2 *>(qs + r * ld + 4 * k4) = make_uint2(pack_bf16x2(v.x, v.y), pack_bf16x2(v.z, v.w));
        r += dr, k4 += dk;
        if (k4 >= q4) k4 -= q4, r++;
    }

    float o[TC_MAX_D / (8 * NPART)][4];
#pragma unroll
    for (int nt = 0; nt < TC_MAX_D / (8 * NPART); nt++) o[nt][0] = o[nt][1] = o[nt][2] = o[nt][3] = 0.f;
    /* rows g and g + 8 of the warp's 16 heads (the quad's four lanes agree) */
    float mx[2] = {-1e30f, -1e30f}, sum[2] = {0.f, 0.f};
    const uint32_t qs_a = smem_addr(qs), ks_a = smem_addr(ks);

    for (int b0 = s0; b0 < s1; b0 += TC_SLOTS) {
        __syncthreads(); /* the last block's readers of ks, ss and rp are done */
        if (tid < TC_SLOTS) { /* the next block's row pointers load during this block */
            rp[tid] = nxt; /* NULL past the last slot */
            nxt = b0 + TC_SLOTS + tid < s1 ? ri[b0 + TC_SLOTS + tid] : nullptr;
        }
        __syncthreads();
        /* decode: warp w takes rows w, w + 8, ..., lane u the values 16u ..
         * 16u + 15 of each; empty slots become zeros, so their p = 0 meets
         * finite values in P·V */
        /* a block wholly in the window or wholly past it (so at decode
         * with a full window: 128 is two slot blocks), with aligned rows,
         * takes the fast form; a block that straddles n_win, rows of odd
         * alignment or scales outside the fast form's range the general one */
        bool fast = false;
        if (fast_ok && lane < d / 16) {
            const uint8_t *r8[TC_SLOTS / 8];
            uintptr_t mis = 0;
#pragma unroll
            for (int t = 0; t < TC_SLOTS / 8; t++) {
                r8[t] = rp[warp + 8 * t];
                mis |= (uintptr_t)r8[t];
            }
            uint16_t *dst = ks + warp * ld + 16 * lane;
            if ((fast_ok & 1) && b0 + TC_SLOTS <= n_win && !(mis & 15u))
                fast = chunk16_rows_fast<true>(r8, d, lane, dst, 8 * ld);
            else if ((fast_ok & 2) && b0 >= n_win && !(mis & 7u))
                fast = chunk16_rows_fast<false>(r8, d, lane, dst, 8 * ld);
        }
        if (lane < d / 16 && !fast) chunk16_rows_general(rp, d, lane, warp, b0, n_win, ks, ld);
        __syncthreads();

        /* S [16 heads × SPW slots] of this warp over all d */
        constexpr int NTS = SPW / 8;
        float s[NTS][4];
#pragma unroll
        for (int nt = 0; nt < NTS; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
        {
            const int arow = 16 * hg + (lane & 7) + 8 * ((lane >> 3) & 1), acol = 8 * (lane >> 4);
            const int bcol = 8 * ((lane >> 3) & 1);
            const int brow = SPW * part + (NTS >= 2 ? 8 * (lane >> 4) : 0) + (lane & 7);
            for (int kk = 0; kk < ntn; kk++) {
                uint32_t a[4];
                ldsm_x4(qs_a + 2u * (uint32_t)(arow * ld + 16 * kk + acol), a);
                if constexpr (NTS >= 2) {
#pragma unroll
                    for (int p = 0; p < NTS / 2; p++) {
                        uint32_t b[4];
                        ldsm_x4(ks_a + 2u * (uint32_t)((brow + 16 * p) * ld + 16 * kk + bcol), b);
                        mma_bf16_16816(s[2 * p], a, b[0], b[1]);
                        mma_bf16_16816(s[2 * p + 1], a, b[2], b[3]);
                    }
                } else {
                    uint32_t b[2];
                    ldsm_x2(ks_a + 2u * (uint32_t)(brow * ld + 16 * kk + bcol), b);
                    mma_bf16_16816(s[0], a, b[0], b[1]);
                }
            }
        }
#pragma unroll
        for (int nt = 0; nt < NTS; nt++) {
            int col = SPW * part + 8 * nt + 2 * t4;
            bool v0 = rp[col] != nullptr, v1 = rp[col + 1] != nullptr;
            float *r0 = ss + (16 * hg + g) * TC_SLD + col, *r1 = r0 + 8 * TC_SLD;
            *reinterpret_cast<float2 *>(r0) =
                make_float2(v0 ? MUL(s[nt][0], scale) : -INFINITY, v1 ? MUL(s[nt][1], scale) : -INFINITY);
            *reinterpret_cast<float2 *>(r1) =
                make_float2(v0 ? MUL(s[nt][2], scale) : -INFINITY, v1 ? MUL(s[nt][3], scale) : -INFINITY);
        }
        __syncthreads();

        /* the block's softmax step for rows g, g + 8 over all 64 slots */
        float p[8][4];
        float bm[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int nt = 0; nt < 8; nt++) {
            const float *r0 = ss + (16 * hg + g) * TC_SLD + 8 * nt + 2 * t4, *r1 = r0 + 8 * TC_SLD;
            float2 a = *reinterpret_cast<const float2 *>(r0), b = *reinterpret_cast<const float2 *>(r1);
            p[nt][0] = a.x;
            p[nt][1] = a.y;
            p[nt][2] = b.x;
            p[nt][3] = b.y;
            bm[0] = fmaxf(bm[0], fmaxf(a.x, a.y));
            bm[1] = fmaxf(bm[1], fmaxf(b.x, b.y));
        }
        float resc[2], psum[2] = {0.f, 0.f};
#pragma unroll
        for (int r = 0; r < 2; r++) {
            bm[r] = fmaxf(bm[r], __shfl_xor_sync(0xffffffffu, bm[r], 1));
            bm[r] = fmaxf(bm[r], __shfl_xor_sync(0xffffffffu, bm[r], 2));
            float nmx = fmaxf(mx[r], bm[r]);
            resc[r] = expf(SUB(mx[r], nmx));
            mx[r] = nmx;
        }
#pragma unroll
        for (int nt = 0; nt < 8; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                p[nt][e] = expf(SUB(p[nt][e], mx[e >> 1])); /* empty slot: exp(-inf) = 0 */
                psum[e >> 1] = ADD(psum[e >> 1], p[nt][e]);
            }
#pragma unroll
        for (int r = 0; r < 2; r++) {
            psum[r] = ADD(psum[r], __shfl_xor_sync(0xffffffffu, psum[r], 1));
            psum[r] = ADD(psum[r], __shfl_xor_sync(0xffffffffu, psum[r], 2));
            sum[r] = ADD(MUL(sum[r], resc[r]), psum[r]);
        }
#pragma unroll
        for (int nt = 0; nt < TC_MAX_D / (8 * NPART); nt++) {
            o[nt][0] = MUL(o[nt][0], resc[0]);
            o[nt][1] = MUL(o[nt][1], resc[0]);
            o[nt][2] = MUL(o[nt][2], resc[1]);
            o[nt][3] = MUL(o[nt][3], resc[1]);
        }

        /* O [16 heads × dp] += bf16(P) [16 × 64] · V [64 × dp] */
        {
            const int vrow = 8 * ((lane >> 3) & 1) + (lane & 7), vcol = part * dp + 8 * (lane >> 4);
#pragma unroll
            for (int kk = 0; kk < 4; kk++) {
                uint32_t a[4] = {pack_bf16x2(p[2 * kk][0], p[2 * kk][1]), pack_bf16x2(p[2 * kk][2], p[2 * kk][3]),
                                 pack_bf16x2(p[2 * kk + 1][0], p[2 * kk + 1][1]),
                                 pack_bf16x2(p[2 * kk + 1][2], p[2 * kk + 1][3])};
#pragma unroll
                for (int np = 0; np < TC_MAX_D / (16 * NPART); np++)
                    if (2 * np < nto) {
                        uint32_t b[4];
                        ldsm_x4_t(ks_a + 2u * (uint32_t)((16 * kk + vrow) * ld + vcol + 16 * np), b);
                        mma_bf16_16816(o[2 * np], a, b[0], b[1]);
                        mma_bf16_16816(o[2 * np + 1], a, b[2], b[3]);
                    }
            }
        }
    }

    if constexpr (SPLIT) {
        sparse_attn_tc_combine<HG>(o, mx, sum, smraw, ss, h, d, h0, i, sink, out);
    } else {
        sparse_attn_tc_store<HG>(o, mx, sum, h, d, h0, i, sink, out);
    }
}

extern "C" int cuda_attn_tc_fits(int64_t d) { return d >= 32 && d <= TC_MAX_D && d % 32 == 0; }

static int tc_forced_hg = 0; /* measuring / test aid: 1 or 4 head groups a block, 0 = choose */
extern "C" void cuda_attn_tc_set_head_groups(int hg) { tc_forced_hg = hg; }
/* which slot blocks may take the fast key decode: bit 0 window blocks, bit
 * 1 compressed ones; -1 until the first launch reads DI_CUDA_ATTN_FAST (a
 * measuring aid: 0..3, default 3) */
static int tc_fast_decode = -1;
extern "C" void cuda_attn_tc_set_fast_decode(int mask) { tc_fast_decode = mask & 3; }
static int tc_fast_mask(void) {
    if (tc_fast_decode < 0) {
        const char *e = getenv("DI_CUDA_ATTN_FAST");
        tc_fast_decode = e && *e >= '0' && *e <= '3' && !e[1] ? *e - '0' : 3;
    }
    return tc_fast_decode;
}

/* Head groups of 16 per block: 1 (16 heads) while four times the blocks of
 * the 64-head form still fit on the GPU at two blocks per SM (decode steps:
 * b1 runs 2 to 5 blocks of 64 heads, ~12 µs of one block's latency each),
 * else 4. Bits do not depend on it (see k_sparse_attn_tc). */
static int tc_pick_hg(int64_t blocks64, int64_t d) {
    if (tc_forced_hg == 1 || tc_forced_hg == 4) return d % 128 == 0 || tc_forced_hg == 4 ? tc_forced_hg : 4;
    return d % 128 == 0 && blocks64 * 4 <= 2 * (int64_t)cuda_sm_count() ? 1 : 4;
}

template <bool SPLIT, int HG> static di_status tc_smem_attr(int64_t d, size_t *smem, di_err *err) {
    *smem = tc_smem_bytes(d, 16 * HG);
    di_status st = cuda_check(cudaFuncSetAttribute(k_sparse_attn_tc<SPLIT, HG>,
                                                   cudaFuncAttributeMaxDynamicSharedMemorySize, (int)*smem),
                              err, "sparse_attn_kv (tensor cores): shared memory");
    if (!st && SPLIT) /* clusters of 9 to 16 blocks (Hopper takes up to 16) */
        st = cuda_check(cudaFuncSetAttribute(k_sparse_attn_tc<SPLIT, HG>,
                                             cudaFuncAttributeNonPortableClusterSizeAllowed, 1),
                        err, "sparse_attn_kv (tensor cores): cluster size");
    return st;
}

extern "C" di_status cuda_op_sparse_attn_kv_tc(const float *q, int64_t m, int h, int64_t d,
                                               const uint8_t *const *rows, int n_slots, int n_win,
                                               const float *sink, float scale, float *out,
                                               di_err *err) {
    if (m <= 0 || h <= 0) return DI_OK;
    if (!cuda_attn_tc_fits(d))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "sparse_attn_kv (tensor cores): head_dim %lld (a multiple of 32, at most %d)",
                          (long long)d, TC_MAX_D);
    if (m > 0x7fffffff)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "sparse_attn_kv (tensor cores): %lld rows",
                          (long long)m);
    const int hg = tc_pick_hg(m * ((h + TC_HEADS - 1) / TC_HEADS), d), hb = 16 * hg;
    size_t smem = 0;
    di_status st = hg == 1 ? tc_smem_attr<false, 1>(d, &smem, err) : tc_smem_attr<false, 4>(d, &smem, err);
    if (st) return st;
    dim3 grid((unsigned)m, (unsigned)((h + hb - 1) / hb));
    if (hg == 1)
        k_sparse_attn_tc<false, 1><<<grid, TC_THREADS, smem>>>(q, h, (int)d, rows, n_slots, n_win, sink, scale,
                                                                n_slots, tc_fast_mask(), out);
    else
        k_sparse_attn_tc<false, 4><<<grid, TC_THREADS, smem>>>(q, h, (int)d, rows, n_slots, n_win, sink, scale,
                                                                n_slots, tc_fast_mask(), out);
    return cuda_check_launch(err, "sparse_attn_kv (tensor cores)");
}

/* Blocks of 64 slots per split block: the fewest that keep S <= splits
 * (at most TC_MAX_SPLIT). */
static int tc_split_span_blocks(int n_slots, int splits) {
    int nblk = (n_slots + TC_SLOTS - 1) / TC_SLOTS;
    if (splits > TC_MAX_SPLIT) splits = TC_MAX_SPLIT;
    if (splits < 1 || nblk < 1) return nblk > 1 ? nblk : 1;
    return (nblk + splits - 1) / splits;
}

extern "C" int cuda_attn_tc_splits(int n_slots, int max_splits) {
    int nblk = (n_slots + TC_SLOTS - 1) / TC_SLOTS;
    if (nblk <= 1 || max_splits <= 1) return 1;
    int bps = tc_split_span_blocks(n_slots, max_splits);
    return (nblk + bps - 1) / bps;
}

extern "C" di_status cuda_op_sparse_attn_kv_tc_split(const float *q, int64_t m, int h, int64_t d,
                                                     const uint8_t *const *rows, int n_slots, int n_win,
                                                     const float *sink, float scale, int splits,
                                                     float *out, di_err *err) {
    if (m <= 0 || h <= 0) return DI_OK;
    if (!cuda_attn_tc_fits(d))
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "sparse_attn_kv (tensor cores, split): head_dim %lld (a multiple of 32, at most %d)",
                          (long long)d, TC_MAX_D);
    int bps = tc_split_span_blocks(n_slots, splits);
    int nblk = (n_slots + TC_SLOTS - 1) / TC_SLOTS;
    int ns = nblk > 0 ? (nblk + bps - 1) / bps : 1; /* the blocks actually used, at most 16 */
    if (m * ns > 0x7fffffff)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "sparse_attn_kv (tensor cores, split): %lld rows",
                          (long long)m);
    const int hg = tc_pick_hg(m * ns * ((h + TC_HEADS - 1) / TC_HEADS), d), hb = 16 * hg;
    size_t smem = 0;
    di_status st = hg == 1 ? tc_smem_attr<true, 1>(d, &smem, err) : tc_smem_attr<true, 4>(d, &smem, err);
    if (st) return st;
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute at[1];
    cfg.gridDim = dim3((unsigned)(m * ns), (unsigned)((h + hb - 1) / hb), 1);
    cfg.blockDim = dim3(TC_THREADS, 1, 1);
    cfg.dynamicSmemBytes = smem;
    cfg.stream = 0;
    at[0].id = cudaLaunchAttributeClusterDimension;
    at[0].val.clusterDim.x = (unsigned)ns;
    at[0].val.clusterDim.y = 1;
    at[0].val.clusterDim.z = 1;
    cfg.attrs = at;
    cfg.numAttrs = 1;
    st = cuda_check(hg == 1 ? cudaLaunchKernelEx(&cfg, k_sparse_attn_tc<true, 1>, q, h, (int)d, rows, n_slots,
                                                 n_win, sink, scale, bps * (int)TC_SLOTS, tc_fast_mask(), out)
                            : cudaLaunchKernelEx(&cfg, k_sparse_attn_tc<true, 4>, q, h, (int)d, rows, n_slots,
                                                 n_win, sink, scale, bps * (int)TC_SLOTS, tc_fast_mask(), out),
                    err, "sparse_attn_kv (tensor cores, split)");
    if (st) return st;
    return cuda_check_launch(err, "sparse_attn_kv (tensor cores, split)");
}
