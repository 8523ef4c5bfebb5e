/* CUDA kernels of the elementwise, normalisation, quantize-dequantize,
 * gather and pooling ops (architecture.md §2 rounding points, §5.1 RoPE,
 * §5.3 compression pooling, §7 SwiGLU). Each mirrors the CPU op of the same
 * name in backend_cpu.c; the ones without a transcendental function or a
 * reordered reduction give the very same bits (see cuda_ops_common.cuh). */
#include "backend/cuda/cuda_ops_common.cuh"
#include "backend/cuda/cuda_ops_step.h"

/* One block per row: the sum of squares is a block reduction (its order,
 * not its terms, differs from the CPU's sequential loop). */
__global__ void k_rmsnorm(const float *x, const void *w, int w_bf16, int64_t n, float eps,
                          float *y) {
    pdl_enter();
    __shared__ float red[32];
    const float *xi = x + (int64_t)blockIdx.x * n;
    float ss = 0.f;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x) ss = ADD(ss, MUL(xi[k], xi[k]));
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ADD(ss / (float)n, eps));
    float *yi = y + (int64_t)blockIdx.x * n;
    for (int64_t k = threadIdx.x; k < n; k += blockDim.x)
        yi[k] = round_bf16(MUL(vec_at(w, w_bf16, k), MUL(xi[k], r)));
}

/* The same arithmetic for rows of at most R·256 values, each thread's
 * values and weights loaded into registers at once: the loop above waits
 * for one load per step (20 round trips at dim 5120, 14 µs of a one-block
 * kernel; b1 run 1 in docs/gpu-notes.md). Each thread still adds its
 * squares in increasing k, so the bits are the loop's. */
enum { RMS_THREADS = 256 };

template <int R>
__global__ void __launch_bounds__(RMS_THREADS)
    k_rmsnorm_reg(const float *x, const void *w, int w_bf16, int64_t n, float eps, float *y) {
    pdl_enter();
    __shared__ float red[32];
    const float *xi = x + (int64_t)blockIdx.x * n;
    float v[R], wv[R];
#pragma unroll
    for (int u = 0; u < R; u++) {
        int64_t k = threadIdx.x + (int64_t)u * RMS_THREADS;
        v[u] = k < n ? xi[k] : 0.f;
        wv[u] = k < n ? vec_at(w, w_bf16, k) : 0.f;
    }
    float ss = 0.f;
#pragma unroll
    for (int u = 0; u < R; u++)
        if (threadIdx.x + (int64_t)u * RMS_THREADS < n) ss = ADD(ss, MUL(v[u], v[u]));
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ADD(ss / (float)n, eps));
    float *yi = y + (int64_t)blockIdx.x * n;
#pragma unroll
    for (int u = 0; u < R; u++) {
        int64_t k = threadIdx.x + (int64_t)u * RMS_THREADS;
        if (k < n) yi[k] = round_bf16(MUL(wv[u], MUL(v[u], r)));
    }
}

extern "C" di_status cuda_op_rmsnorm(const float *x, const void *w, int w_bf16, int64_t m,
                                     int64_t n, float eps, float *y, di_err *err) {
    if (m <= 0) return DI_OK;
    const int64_t per = (n + RMS_THREADS - 1) / RMS_THREADS;
    if (per <= 4) cuda_launch_pdl(k_rmsnorm_reg<4>, (unsigned)m, RMS_THREADS, 0, 0, x, w, w_bf16, n, eps, y);
    else if (per <= 8) cuda_launch_pdl(k_rmsnorm_reg<8>, (unsigned)m, RMS_THREADS, 0, 0, x, w, w_bf16, n, eps, y);
    else if (per <= 24) cuda_launch_pdl(k_rmsnorm_reg<24>, (unsigned)m, RMS_THREADS, 0, 0, x, w, w_bf16, n, eps, y);
    else cuda_launch_pdl(k_rmsnorm, (unsigned)m, RMS_THREADS, 0, 0, x, w, w_bf16, n, eps, y);
    return cuda_check_launch(err, "rmsnorm");
}

/* The FP8 block scale of 32 values (di_act_scale_fp8): a power of two. */
__device__ __forceinline__ float fp8_block_scale(const float *v) {
    float amax = 0.f;
    for (int i = 0; i < 32; i++) {
        float a = v[i] < 0 ? -v[i] : v[i];
        if (a > amax) amax = a;
    }
    if (amax < 1e-4f) amax = 1e-4f;
    return pow2_ceil_bits(MUL(amax, (float)(1.0 / 448.0)));
}

/* The FP4 block scale from the block's max |v| (NaN values left out, as
 * fmaxf leaves them) and its scale byte. */
__device__ __forceinline__ float fp4_amax_scale(float amax, int e4m3, uint32_t *code) {
    if (e4m3) {
        if (amax < 6.f * 0x1p-9f) amax = 6.f * 0x1p-9f;
        *code = e4m3_code(fminf(amax / 6.f, 448.f));
        return e4m3_val(*code);
    }
    if (amax < 6.f * 0x1p-126f) amax = 6.f * 0x1p-126f;
    float s = pow2_ceil_bits(MUL(amax, (float)(1.0 / 6.0)));
    *code = __float_as_uint(s) >> 23;
    return s;
}

/* The FP4 block scale of bl values (di_cpu_fp4_scale) and its scale byte. */
__device__ __forceinline__ float fp4_block_scale(const float *v, int bl, int e4m3,
                                                 uint32_t *code) {
    float amax = 0.f;
    for (int i = 0; i < bl; i++) amax = fmaxf(amax, fabsf(v[i]));
    return fp4_amax_scale(amax, e4m3, code);
}

/* One thread per 32-block: the CPU's scale rule and RNE cast, then back. */
__global__ void k_qdq_fp8(float *x, int64_t nblk) {
    GRID_STRIDE(b, nblk) {
        float *v = x + b * 32;
        float s = fp8_block_scale(v);
        for (int i = 0; i < 32; i++) {
            float q = fminf(fmaxf(v[i] / s, -448.f), 448.f);
            v[i] = MUL(e4m3_val(e4m3_code(q)), s);
        }
    }
}

extern "C" di_status cuda_op_qdq_fp8(float *x, int64_t n, di_err *err) {
    if (n / 32 <= 0) return DI_OK;
    k_qdq_fp8<<<grid_for(n / 32), 256>>>(x, n / 32);
    return cuda_check_launch(err, "qdq_fp8");
}

/* The block's values are read into registers once, all loads in flight
 * together (read through the pointer twice they waited one round trip per
 * few values: 12.5 µs for 128 blocks, b1 run 1); the same operations. */
template <int BL>
__global__ void k_qdq_fp4(float *x, int64_t nblk, int e4m3) {
    pdl_enter();
    GRID_STRIDE(b, nblk) {
        float *v = x + b * BL, r[BL];
#pragma unroll
        for (int i = 0; i < BL; i++) r[i] = v[i];
        uint32_t code;
        float s = fp4_block_scale(r, BL, e4m3, &code);
#pragma unroll
        for (int i = 0; i < BL; i++) {
            float q = fminf(fmaxf(r[i] / s, -6.f), 6.f);
            v[i] = round_bf16(MUL(e2m1_val(e2m1_code(q)), s));
        }
    }
}

/* The same with a block spread over BL / 4 lanes, four values a lane by
 * 16-byte loads and stores: a thread per block read 128 bytes alone, so
 * each load instruction of a warp touched 32 lines (V4.1's index queries at
 * an 8K prefill: 0.74 ms for 134 MB; 11.9 µs at one token). The block's
 * max |v| by fmaxf over its lanes (max is exact and NaN-blind in any
 * order), then each value the very operations of k_qdq_fp4. */
template <int BL>
__global__ void k_qdq_fp4_lanes(float *x, int64_t n4, int e4m3) {
    pdl_enter();
    constexpr int LB = BL / 4; /* lanes a block */
    const int lane = threadIdx.x & 31;
    const int64_t stride = (int64_t)gridDim.x * blockDim.x;
    for (int64_t i = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; i - lane < n4; i += stride) {
        const bool ok = i < n4; /* whole blocks: a block's lanes agree */
        float4 v = ok ? ((const float4 *)x)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
        float amax = fmaxf(fmaxf(fmaxf(fmaxf(0.f, fabsf(v.x)), fabsf(v.y)), fabsf(v.z)), fabsf(v.w));
#pragma unroll
        for (int o = LB / 2; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        uint32_t code;
        const float s = fp4_amax_scale(amax, e4m3, &code);
        if (!ok) continue;
        float r[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int j = 0; j < 4; j++) {
            const float q = fminf(fmaxf(r[j] / s, -6.f), 6.f);
            r[j] = round_bf16(MUL(e2m1_val(e2m1_code(q)), s));
        }
        ((float4 *)x)[i] = make_float4(r[0], r[1], r[2], r[3]);
    }
}

extern "C" di_status cuda_op_qdq_fp4(float *x, int64_t n, int e4m3, di_err *err) {
    int bl = e4m3 ? 16 : 32;
    if (n / bl <= 0) return DI_OK;
    if ((uintptr_t)x % 16 == 0) {
        const int64_t n4 = n / bl * bl / 4; /* whole blocks only, as below */
        const unsigned g = grid_for(n4);
        if (e4m3) cuda_launch_pdl(k_qdq_fp4_lanes<16>, g, 256, 0, 0, x, n4, 1);
        else cuda_launch_pdl(k_qdq_fp4_lanes<32>, g, 256, 0, 0, x, n4, 0);
    } else if (e4m3) {
        cuda_launch_pdl(k_qdq_fp4<16>, grid_for(n / bl), 256, 0, 0, x, n / bl, 1);
    } else {
        cuda_launch_pdl(k_qdq_fp4<32>, grid_for(n / bl), 256, 0, 0, x, n / bl, 0);
    }
    return cuda_check_launch(err, "qdq_fp4");
}

/* One thread per scale block of one row: the block's codes and its scale
 * byte in the packed layout of backend/kvstore.h (codes of the row, then
 * its scale bytes). fmt: 0 FP8/32, 1 FP4/16 with E4M3, 2 FP4/32 with E8M0. */
template <int FMT>
__global__ void k_kv_pack(const float *x, int64_t m, int64_t n, uint8_t *out) {
    pdl_enter();
    constexpr int BL = FMT == 1 ? 16 : 32;
    int64_t nbr = n / BL, rb = (FMT == 0 ? n : n / 2) + nbr;
    GRID_STRIDE(t, m * nbr) {
        int64_t i = t / nbr, b = t % nbr;
        const float *v = x + i * n + b * BL;
        float r[BL]; /* all loads in flight together, as in k_qdq_fp4 */
#pragma unroll
        for (int k = 0; k < BL; k++) r[k] = v[k];
        uint8_t *row = out + i * rb;
        if (FMT == 0) {
            float s = fp8_block_scale(r);
#pragma unroll
            for (int k = 0; k < 32; k++)
                row[b * 32 + k] = (uint8_t)e4m3_code(fminf(fmaxf(r[k] / s, -448.f), 448.f));
            row[n + b] = (uint8_t)(__float_as_uint(s) >> 23);
        } else {
            uint32_t code;
            float s = fp4_block_scale(r, BL, FMT == 1, &code);
#pragma unroll
            for (int k = 0; k < BL; k += 2) {
                uint32_t lo = e2m1_code(fminf(fmaxf(r[k] / s, -6.f), 6.f));
                uint32_t hi = e2m1_code(fminf(fmaxf(r[k + 1] / s, -6.f), 6.f));
                row[(b * BL + k) / 2] = (uint8_t)((lo & 15u) | (hi << 4));
            }
            row[n / 2 + b] = (uint8_t)code;
        }
    }
}

extern "C" di_status cuda_op_kv_pack(int fmt, const float *x, int64_t m, int64_t n, uint8_t *out,
                                     di_err *err) {
    int64_t nb = m * (n / (fmt == 1 ? 16 : 32));
    if (nb <= 0) return DI_OK;
    switch (fmt) {
    case 0: cuda_launch_pdl(k_kv_pack<0>, grid_for(nb), 256, 0, 0, x, m, n, out); break;
    case 1: cuda_launch_pdl(k_kv_pack<1>, grid_for(nb), 256, 0, 0, x, m, n, out); break;
    default: cuda_launch_pdl(k_kv_pack<2>, grid_for(nb), 256, 0, 0, x, m, n, out); break;
    }
    return cuda_check_launch(err, "kv_pack");
}

/* The tail of attention's query and window-KV paths at a decode step
 * (§5.2–5.3), four launches of the rope_cs / rmsnorm / kv_pack kernels in
 * one: blocks < nq rotate q as k_rope_cs does (its threads over the pairs
 * of every head), block nq + i takes KV row i: k_rmsnorm's sum of squares
 * (thread t adds k = t, t + 256, ... and block_sum reduces), the
 * normalized row in shared memory, its last rd dims rotated pair by pair,
 * the row stored and packed as k_kv_pack<0> packs it (each 32-block's
 * scale from its values, then every code). The same operations on the
 * same values, so the bits of the four kernels. */
enum { QKV_THREADS = 256, QKV_MAX_HD = 2048 };

__global__ void __launch_bounds__(QKV_THREADS)
    k_qkv_rope_pack(float *q, int heads, float *kv, int64_t m, int64_t hd, int64_t rd, const void *nw, int nw_bf16,
                    float eps, const float *cs, uint8_t *out, unsigned nq) {
    pdl_enter();
    const int64_t half = rd / 2;
    if (blockIdx.x < nq) {
        const int64_t total = m * heads * half;
        for (int64_t t = (int64_t)blockIdx.x * QKV_THREADS + threadIdx.x; t < total; t += (int64_t)nq * QKV_THREADS) {
            const int64_t j = t % half, ih = t / half, i = ih / heads, h = ih % heads;
            float *v = q + i * heads * hd + h * hd + (hd - rd);
            rope_rotate_pair(v + 2 * j, cs[(i * half + j) * 2], cs[(i * half + j) * 2 + 1]);
        }
        return;
    }
    __shared__ float yv[QKV_MAX_HD];
    __shared__ float sc[QKV_MAX_HD / 32];
    __shared__ float red[32];
    const int64_t i = blockIdx.x - nq;
    float *xi = kv + i * hd;
    float ss = 0.f;
#pragma unroll 4
    for (int64_t k = threadIdx.x; k < hd; k += QKV_THREADS) {
        const float v = xi[k];
        yv[k] = v;
        ss = ADD(ss, MUL(v, v));
    }
    ss = block_sum(ss, red);
    const float r = 1.0f / sqrtf(ADD(ss / (float)hd, eps));
    for (int64_t k = threadIdx.x; k < hd; k += QKV_THREADS)
        yv[k] = round_bf16(MUL(vec_at(nw, nw_bf16, k), MUL(yv[k], r)));
    __syncthreads();
    for (int64_t j = threadIdx.x; j < half; j += QKV_THREADS)
        rope_rotate_pair(yv + (hd - rd) + 2 * j, cs[(i * half + j) * 2], cs[(i * half + j) * 2 + 1]);
    __syncthreads();
    const int64_t nb = hd / 32;
    uint8_t *row = out + i * (hd + nb);
    for (int64_t b = threadIdx.x; b < nb; b += QKV_THREADS) {
        const float s = fp8_block_scale(yv + b * 32);
        sc[b] = s;
        row[hd + b] = (uint8_t)(__float_as_uint(s) >> 23);
    }
    __syncthreads();
    for (int64_t k = threadIdx.x; k < hd; k += QKV_THREADS) {
        xi[k] = yv[k];
        row[k] = (uint8_t)e4m3_code(fminf(fmaxf(yv[k] / sc[k / 32], -448.f), 448.f));
    }
}

extern "C" di_status cuda_op_qkv_rope_pack(float *q, int heads, float *kv, int64_t m, int64_t hd, int64_t rd,
                                           const void *nw, int nw_bf16, float eps, const float *cs, uint8_t *out,
                                           di_err *err) {
    if (m <= 0) return DI_OK;
    if (hd % 32 || rd % 2 || rd > hd || heads <= 0)
        return di_err_set(err, DI_ERR_UNSUPPORTED, "qkv_rope_pack: head_dim %lld, rope dims %lld (supported: "
                          "head_dim a multiple of 32, even rope dims within it)", (long long)hd, (long long)rd);
    const unsigned nq = rd > 0 ? grid_for(m * heads * (rd / 2)) : 0;
    if (hd <= QKV_MAX_HD && m <= 65535) {
        cuda_launch_pdl(k_qkv_rope_pack, nq + (unsigned)m, QKV_THREADS, 0, 0, q, heads, kv, m, hd, rd, nw, nw_bf16, eps,
                        cs, out, nq);
        return cuda_check_launch(err, "qkv_rope_pack");
    }
    di_status st = cuda_op_rmsnorm(kv, nw, nw_bf16, m, hd, eps, kv, err);
    if (!st && rd > 0) st = cuda_op_rope_cs(q, m, heads * hd, heads, hd, rd, cs, 0, err);
    if (!st && rd > 0) st = cuda_op_rope_cs(kv, m, hd, 1, hd, rd, cs, 0, err);
    if (!st) st = cuda_op_kv_pack(0, kv, m, hd, out, err);
    return st;
}

__global__ void k_scale_bf16(float *x, int64_t n, float c) {
    pdl_enter();
    GRID_STRIDE(i, n) x[i] = round_bf16(c == 1.0f ? x[i] : MUL(x[i], c));
}

extern "C" di_status cuda_op_scale_bf16(float *x, int64_t n, float c, di_err *err) {
    if (n <= 0) return DI_OK;
    cuda_launch_pdl(k_scale_bf16, grid_for(n), 256, 0, 0, x, n, c);
    return cuda_check_launch(err, "scale_bf16");
}

__global__ void k_embed(const void *table, int t_bf16, int64_t n, const int32_t *ids, int64_t m,
                        float *out) {
    GRID_STRIDE(t, m * n) {
        int64_t i = t / n, k = t % n;
        out[t] = vec_at(table, t_bf16, (int64_t)ids[i] * n + k);
    }
}

extern "C" di_status cuda_op_embed(const void *table, int t_bf16, int64_t n, const int32_t *ids,
                                   int64_t m, float *out, di_err *err) {
    if (m * n <= 0) return DI_OK;
    k_embed<<<grid_for(m * n), 256>>>(table, t_bf16, n, ids, m, out);
    return cuda_check_launch(err, "embed");
}

__global__ void k_fp8_rows(const uint8_t *rows, const uint8_t *scales, int64_t nrows, int64_t eh,
                           int64_t nb, float *out) {
    GRID_STRIDE(t, nrows * eh) {
        int64_t r = t / eh, k = t % eh;
        out[t] = round_bf16(MUL(e4m3_val(rows[t]), e8m0_to_f32(scales[r * nb + k / 32])));
    }
}

extern "C" di_status cuda_op_fp8_rows(const uint8_t *rows, const uint8_t *scales, int64_t nrows,
                                      int64_t eh, int64_t nb, float *out, di_err *err) {
    if (nrows * eh <= 0) return DI_OK;
    k_fp8_rows<<<grid_for(nrows * eh), 256>>>(rows, scales, nrows, eh, nb, out);
    return cuda_check_launch(err, "engram_gather");
}

/* Softmax over the r pooled rows, then the weighted sum in the CPU's order. */
__global__ void k_compress_pool(const float *a, const float *g, int64_t m, int r, int64_t n,
                                float *out) {
    GRID_STRIDE(t, m * n) {
        int64_t i = t / n, k = t % n;
        const float *gi = g + i * r * n + k, *ai = a + i * r * n + k;
        float mx = -INFINITY, sum = 0.f, acc = 0.f;
        for (int s = 0; s < r; s++) mx = fmaxf(mx, gi[s * n]);
        for (int s = 0; s < r; s++) sum = ADD(sum, expf(SUB(gi[s * n], mx)));
        for (int s = 0; s < r; s++) acc = ADD(acc, MUL(ai[s * n], expf(SUB(gi[s * n], mx)) / sum));
        out[t] = round_bf16(acc);
    }
}

extern "C" di_status cuda_op_compress_pool(const float *a, const float *g, int64_t m, int r,
                                           int64_t n, float *out, di_err *err) {
    if (m * n <= 0) return DI_OK;
    k_compress_pool<<<grid_for(m * n), 256>>>(a, g, m, r, n, out);
    return cuda_check_launch(err, "compress_pool");
}

__global__ void k_swiglu(const float *g, const float *u, const float *w, int64_t m, int64_t n,
                         float limit, float *out) {
    pdl_enter();
    GRID_STRIDE(t, m * n) {
        float gv = g[t], uv = u[t];
        if (limit > 0.f) {
            uv = fminf(fmaxf(uv, -limit), limit);
            gv = fminf(gv, limit);
        }
        float v = MUL(MUL(gv, sigmoid_f(gv)), uv);
        if (w) v = MUL(w[t / n], v);
        out[t] = round_bf16(v);
    }
}

extern "C" di_status cuda_op_swiglu(const float *g, const float *u, const float *w, int64_t m,
                                    int64_t n, float limit, float *out, di_err *err) {
    if (m * n <= 0) return DI_OK;
    cuda_launch_pdl(k_swiglu, grid_for(m * n), 256, 0, 0, g, u, w, m, n, limit, out);
    return cuda_check_launch(err, "swiglu");
}

__global__ void k_gather_rows(const float *src, const int32_t *rows, int64_t m, int64_t n,
                              float *dst) {
    pdl_enter();
    GRID_STRIDE(t, m * n) dst[t] = src[(int64_t)rows[t / n] * n + t % n];
}

extern "C" di_status cuda_op_gather_rows(const float *src, const int32_t *rows, int64_t m,
                                         int64_t n, float *dst, di_err *err) {
    if (m * n <= 0) return DI_OK;
    cuda_launch_pdl(k_gather_rows, grid_for(m * n), 256, 0, 0, src, rows, m, n, dst);
    return cuda_check_launch(err, "gather_rows");
}

/* One thread per column walks the rows in order, so repeated destination
 * rows add up in the CPU's order and never race. */
__global__ void k_scatter_add_rows(float *dst, const int32_t *rows, const float *src, int64_t m,
                                   int64_t n) {
    GRID_STRIDE(k, n) {
        for (int64_t i = 0; i < m; i++) {
            float *d = dst + (int64_t)rows[i] * n + k;
            *d = ADD(*d, src[i * n + k]);
        }
    }
}

extern "C" di_status cuda_op_scatter_add_rows(float *dst, const int32_t *rows, const float *src,
                                              int64_t m, int64_t n, di_err *err) {
    if (m <= 0 || n <= 0) return DI_OK;
    k_scatter_add_rows<<<grid_for(n), 256>>>(dst, rows, src, m, n);
    return cuda_check_launch(err, "scatter_add_rows");
}

__global__ void k_add(float *y, const float *x, int64_t n) {
    pdl_enter();
    GRID_STRIDE(i, n) y[i] = ADD(y[i], x[i]);
}

extern "C" di_status cuda_op_add(float *y, const float *x, int64_t n, di_err *err) {
    if (n <= 0) return DI_OK;
    cuda_launch_pdl(k_add, grid_for(n), 256, 0, 0, y, x, n);
    return cuda_check_launch(err, "add");
}

/* The MoE's last steps (the shared expert's output added to the routed
 * sum, rounded, copied out) as one pass: the same single fp32 addition and
 * rounding per value. */
__global__ void k_add_bf16(float *y, const float *a, const float *b, int64_t n) {
    pdl_enter();
    GRID_STRIDE(i, n) y[i] = round_bf16(ADD(a[i], b[i]));
}

extern "C" di_status cuda_op_add_bf16(float *y, const float *a, const float *b, int64_t n, di_err *err) {
    if (n <= 0) return DI_OK;
    cuda_launch_pdl(k_add_bf16, grid_for(n), 256, 0, 0, y, a, b, n);
    return cuda_check_launch(err, "add_bf16");
}
