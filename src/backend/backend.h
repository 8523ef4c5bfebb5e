/* The backend interface: the table of ops the V4.1 forward pass calls
 * (architecture.md §2–§10). The model code never touches activation memory
 * itself; it asks the backend for buffers, fills them through ops, and reads
 * back only small integer results it needs for bookkeeping. A CUDA backend
 * plugs in by providing another table; the model does not change.
 *
 * Conventions shared by every op:
 * - Activations are fp32 buffers owned by the backend (alloc/free). Where the
 *   reference keeps a tensor in bf16, the op rounds its result to the nearest
 *   bf16 value and stores it as fp32, so every rounding point of §2 is one
 *   explicit flag or op below (see docs/numerics.md).
 * - Rows are independent tokens; `m` is the number of rows of the call.
 * - Weights are di_tensor views in checkpoint formats; ops dequantize on the
 *   fly and never keep converted copies.
 * - Small integer metadata lives on the host and is passed as host arrays
 *   (except in the optional backend-memory forms below, which take the
 *   selection path's tables in backend memory):
 *   positions, token ids, row indices of gathers/scatters, the per-query
 *   attention row tables (host arrays of pointers into backend buffers),
 *   visible counts, top-k selections and expert routing results (which
 *   moe_route_buf can instead leave in backend memory for moe_experts). A
 *   device backend uploads or downloads these itself; float tensors never
 *   leave backend memory except through download.
 * - Ops cannot fail once their inputs are validated by the model (shapes are
 *   checked when the model is built), so they return nothing; a backend
 *   whose ops can still fail (device errors) reports through `status`. */
#ifndef DI_BACKEND_BACKEND_H
#define DI_BACKEND_BACKEND_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>

#include "backend/kvstore.h"
#include "core/error.h"
#include "core/row_exp.h"
#include "core/tensor.h"

/* A weight matrix [n_out, n_in] in one of the checkpoint formats. */
typedef enum di_wfmt {
    DI_WFMT_NONE = 0,
    DI_WFMT_FP8,  /* F8_E4M3 weight + F8_E8M0 scale per 32x32 tile */
    DI_WFMT_FP4,  /* I8 packed E2M1 (low nibble = even) + F8_E8M0 per 32 inputs */
    DI_WFMT_BF16, /* BF16 weight */
    DI_WFMT_F32   /* F32 weight */
} di_wfmt;

typedef struct di_wmat {
    di_wfmt fmt;
    int64_t n_out, n_in;
    const void *w;     /* [n_out, n_in] (FP4: [n_out, n_in/2] bytes) */
    const uint8_t *s;  /* FP8: [ceil(n_out/32), ceil(n_in/32)]; FP4: [n_out, n_in/32] */
} di_wmat;

/* matmul flags */
#define DI_MM_ACT_FP8 1u  /* quantize each row per 32 inputs to FP8 first (§2) */
#define DI_MM_OUT_BF16 2u /* round the fp32 result to bf16 */
/* x holds bf16 values (a norm's output, as the head's input is): a
 * backend may read x in bf16 without a loss. Without DI_MM_ACT_FP8 only;
 * outside batch-invariant mode a backend may then sum in another order at
 * many rows (the CUDA backend: cuBLAS), within fp32's bound. */
#define DI_MM_ACT_BF16 4u

/* One entry of a query's attention list: a pointer to a [head_dim] K=V row,
 * or NULL for an empty slot (empty slots still count for the 64-slot blocks
 * of the online softmax). */
typedef const float *di_kvrow;

/* The routed experts of one MoE layer for the grouped op: expert e's
 * matrices are w1[e], w3[e], w2[e] where x[e] sits `stride` bytes after
 * x[e-1] (so an array of per-expert structs is passed without a copy). */
typedef struct di_moe_experts {
    int n;                        /* experts */
    const di_wmat *w1, *w3, *w2;  /* expert 0's gate [I, D], up [I, D], down [D, I] */
    size_t stride;                /* bytes from one expert's entry to the next */
} di_moe_experts;

static inline const di_wmat *di_moe_wmat(const di_wmat *w0, size_t stride, int e) {
    return (const di_wmat *)(const void *)((const char *)w0 + (size_t)e * stride);
}

/* The attention list of every query row of a call, addressed through
 * tables in backend memory, so a device backend builds the row addresses
 * itself and nothing of a step's selection passes through the host. Slot j
 * of row i is
 *   j < n_win:  win[i, j] >= 0: window ring slot win[i, j] of ring[i]
 *               (ring[i] + win[i, j]·win_bytes, DI_KVQ_FP8);
 *               win[i, j] <= -2: row -2 - win[i, j] of this call's own
 *               window KV `chunk` (chunk + r·win_bytes, DI_KVQ_FP8);
 *               -1: empty;
 *   j >= n_win: sel[i, j - n_win] >= 0: compressed entry of cache[i]
 *               (cache[i] + e·cache_bytes, DI_KVQ_FP4_E4M3); -1: empty.
 * Empty slots count for the 64-slot blocks as in sparse_attn. */
typedef struct di_attn_rows {
    int n_win;                     /* window slots */
    const int32_t *win;            /* [m, n_win] backend memory */
    const uint8_t *const *ring;    /* [m] backend memory: each row's window ring */
    const uint8_t *chunk;          /* [rows, win_bytes] this call's window KV */
    size_t win_bytes;
    int n_sel;                     /* compressed slots (0: none) */
    const int32_t *sel;            /* [m, n_sel] backend memory (a topk_select_buf result) */
    const uint8_t *const *cache;   /* [m] backend memory: each row's compressed cache */
    size_t cache_bytes;
} di_attn_rows;

typedef struct di_backend di_backend;

/* What an engine takes when its options leave these at 0 (engine_defaults). */
typedef struct di_backend_defaults {
    int max_batch;        /* sequences a step */
    int64_t step_tokens;  /* token budget of a step */
    uint64_t state_bytes; /* per-sequence state (the memory manager's limit) */
} di_backend_defaults;

typedef struct di_backend_ops {
    const char *name;

    /* ---- memory ---- */
    void *(*alloc)(di_backend *be, size_t bytes); /* zeroed; NULL on failure */
    /* A buffer whose contents are undefined, for one the next op writes
     * whole (saves a device backend the zero fill). Optional (NULL: alloc);
     * the model calls it through di_alloc_raw. */
    void *(*alloc_raw)(di_backend *be, size_t bytes);
    void (*free)(di_backend *be, void *p);
    void (*upload)(di_backend *be, void *dst, const void *src, size_t bytes);
    void (*download)(di_backend *be, void *dst, const void *src, size_t bytes);
    void (*copy)(di_backend *be, void *dst, const void *src, size_t bytes);
    /* Host memory for what a download fills often (the logits): page-locked
     * on a device backend, so the download is one transfer at the bus's
     * speed instead of the driver's pageable staging. Optional (NULL: use
     * malloc / free, as di_host_alloc does); NULL on failure. */
    void *(*host_alloc)(di_backend *be, size_t bytes);
    void (*host_free)(di_backend *be, void *p);

    /* ---- linear algebra ---- */
    /* y[m, n_out] = x[m, n_in] · Wᵀ, fp32 accumulation per 32-input block
     * (quantized formats: block partials scaled and summed in K order). */
    void (*matmul)(di_backend *be, const di_wmat *w, const float *x, int64_t m, float *y,
                   unsigned flags);
    /* ya = x · waᵀ and yb = x · wbᵀ, two matrices of one format and input
     * size on one x (an expert's w1 and w3, attention's wq_a and wkv, the
     * gated compressor's wkv and wgate; their outputs may differ in size),
     * each with matmul's arithmetic and bound; a backend may order
     * the 32-block partials of a pair as it would for a larger product
     * (the CUDA decode kernel that quantizes x splits k by the blocks of
     * both matrices), so the bits can differ from matmul alone except in
     * batch-invariant mode. Optional (NULL: the model calls matmul twice);
     * a backend runs both in one pass where that saves the second's start. */
    void (*matmul_pair)(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                        float *ya, float *yb, unsigned flags);
    /* Grouped bf16 projection: x [m, g, k] with weight [g*r, k] → y [m, g*r], bf16 out. */
    void (*matmul_grouped)(di_backend *be, const di_wmat *w, int groups, const float *x,
                           int64_t m, float *y);

    /* ---- elementwise / normalisation ---- */
    /* y = bf16(w ⊙ x / sqrt(mean(x²) + eps)) per row of n (w BF16 [n]). */
    void (*rmsnorm)(di_backend *be, const float *x, const di_tensor *w, int64_t m, int64_t n,
                    double eps, float *y);
    /* Rotates the last rd dims of each of `heads` vectors of width hd per row,
     * interleaved pairs, angle pos[row]·freq[j]; inverse conjugates. The rows
     * have stride `stride` floats. Results rounded to bf16. */
    void (*rope)(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                 int64_t rd, const int32_t *pos, const float *freq, int inverse);
    /* In-place quantize-dequantize of n values (n a multiple of the block). */
    void (*qdq_fp8)(di_backend *be, float *x, int64_t n);       /* FP8 per 32, e8m0 */
    void (*qdq_fp4_e8m0)(di_backend *be, float *x, int64_t n);  /* FP4 per 32, e8m0 */
    void (*qdq_fp4_e4m3)(di_backend *be, float *x, int64_t n);  /* FP4 per 16, e4m3 */
    void (*round_bf16)(di_backend *be, float *x, int64_t n);
    /* x = bf16(x·c) over n values (a bf16 tensor times a scalar). */
    void (*scale_bf16)(di_backend *be, float *x, int64_t n, float c);

    /* ---- gathers ---- */
    /* out[i] = bf16 table row ids[i] ([V, n] BF16). */
    void (*embed)(di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m,
                  float *out);
    /* out[i, c] = dequantized FP8 row ids[i, c] of an Engram table, rounded to bf16. */
    void (*engram_gather)(di_backend *be, const di_tensor *rows, const di_tensor *scales,
                          const int32_t *ids, int64_t m, int ncols, float *out);

    /* ---- mHC (§4) ---- */
    void (*hc_mix)(di_backend *be, const float *s, int64_t m, int hc, int64_t d,
                   const float *fn, const float *base, const float *scale, double norm_eps,
                   double hc_eps, int iters, float *pre, float *post, float *comb);
    /* y[i] = bf16(Σ_k w[i,k]·s[i,k,:]) */
    void (*hc_collapse)(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                        int64_t d, float *y);
    /* out[i,b] = bf16(post[i,b]·y[i] + Σ_a comb[i,a,b]·s[i,a]); out may alias s. */
    void (*hc_expand)(di_backend *be, const float *y, const float *s, const float *post,
                      const float *comb, int64_t m, int hc, int64_t d, float *out);
    /* out[i] = bf16(mean over copies of s[i]) (DSpark taps) */
    void (*hc_mean)(di_backend *be, const float *s, int64_t m, int hc, int64_t d, float *out,
                    int64_t out_stride);
    /* y = rmsnorm(hc_collapse(s, w)) with norm weight nw (an mHC site's
     * sublayer input, the head's): the same bits as the two ops. Optional
     * (NULL: the two ops). */
    void (*hc_collapse_norm)(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                             int64_t d, const di_tensor *nw, double eps, float *y);

    /* ---- Engram gate (§6.3) ---- s ← bf16(s + gate·value), kv [m, (hc+1)·d] */
    void (*engram_gate)(di_backend *be, float *s, const float *kv, const di_tensor *qw,
                        const di_tensor *kw, int64_t m, int hc, int64_t d, double eps);

    /* ---- attention (§5) ---- */
    /* Ratio-r gated pooling: a, g [m, r, n] fp32 → out [m, n] bf16 (softmax over r). */
    void (*compress_pool)(di_backend *be, const float *a, const float *g, int64_t m, int r,
                          int64_t n, float *out);
    /* Sparse attention with sink: q [m, h, d] bf16, rows [m, n_slots], out [m, h, d]. */
    void (*sparse_attn)(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                        const di_kvrow *rows, int n_slots, const float *sink, float scale,
                        float *out);
    /* Index scores with the reference's bf16 rounding points: q [m, hi, di],
     * w [m, hi], keys[i] → [n_vis[i], di]; out [m, width], -inf beyond n_vis. */
    void (*index_scores)(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                         int64_t di, const float *const *keys, const int32_t *n_vis,
                         int64_t width, float *out);

    /* ---- packed per-sequence caches (backend/kvstore.h) ----
     * The sequence state keeps window KV, compressed KV and index keys in
     * their packed quantized forms. The model quantizes new rows with
     * kv_pack and copies the packed rows into the caches (copy); the two
     * readers take tables of packed rows and decode them on the fly, giving
     * the results sparse_attn / index_scores give on the decoded fp32 rows,
     * bit for bit on the CPU. The model calls only these three for the
     * caches (sparse_attn / index_scores over fp32 rows stay as the plain
     * forms the _kv ones are defined by); a backend that leaves them NULL
     * cannot run the model, and the forward says so instead of crashing. */
    /* out [m, di_kvq_row_bytes(fmt, n)] = the packed rows of x [m, n]. */
    void (*kv_pack)(di_backend *be, di_kvq fmt, const float *x, int64_t m, int64_t n,
                    uint8_t *out);
    /* sparse_attn over packed rows: rows [m, n_slots] of pointers to packed
     * [d] rows (NULL = empty slot); slots j < n_win are DI_KVQ_FP8 (window
     * KV), slots j >= n_win DI_KVQ_FP4_E4M3 (compressed KV). */
    void (*sparse_attn_kv)(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                           const uint8_t *const *rows, int n_slots, int n_win, const float *sink,
                           float scale, float *out);
    /* index_scores over packed keys: keys[i] → n_vis[i] consecutive
     * DI_KVQ_FP4_E8M0 rows of di values. */
    void (*index_scores_kv)(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                            int64_t di, const uint8_t *const *keys, const int32_t *n_vis,
                            int64_t width, float *out);
    /* Candidate pool (§5.4.4): per row, the `topk_blocks` best blocks of `bs`
     * positions (block score = max of its positions, the block of the newest
     * visible entry pinned, unreachable blocks dropped), ascending, -1
     * padding, into blocks [m, topk_blocks] (host). */
    void (*candidate_blocks)(di_backend *be, const float *scores, const int32_t *n_vis,
                             int64_t m, int64_t width, int topk_blocks, int bs,
                             int32_t *blocks);
    /* Sets to -inf every score [m, width] outside the row's kept blocks. */
    void (*restrict_blocks)(di_backend *be, float *scores, const int32_t *blocks, int64_t m,
                            int64_t width, int topk_blocks, int bs);
    /* Top-k selection per row among the first n_vis[i] finite scores; indices
     * ascending, -1 padding; ties go to the lower index. */
    void (*topk_select)(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                        int64_t width, int k, int32_t *idx);

    /* ---- backend-memory forms (optional, all or none) ----
     * The selection path with every table in backend memory, so a decode
     * step runs without the host reading anything back between ops (and a
     * device backend can capture it): the same semantics, bit for bit, as
     * the forms above, with these arguments in backend memory instead of on
     * the host: n_vis, keys (index_scores_kv_buf: [m] pointers), blocks
     * (candidate_blocks_buf's result, restrict_blocks_buf's input), idx
     * (topk_select_buf's result) and the row tables of sparse_attn_rows.
     * Rows past m of a table are never read; pointers into these tables
     * (n_vis + i0) address rows i0... as on the host. NULL: the model uses
     * the host forms above. */
    void (*index_scores_kv_buf)(di_backend *be, const float *q, const float *w, int64_t m,
                                int hi, int64_t di, const uint8_t *const *keys,
                                const int32_t *n_vis, int64_t width, float *out);
    void (*candidate_blocks_buf)(di_backend *be, const float *scores, const int32_t *n_vis,
                                 int64_t m, int64_t width, int topk_blocks, int bs,
                                 int32_t *blocks);
    void (*restrict_blocks_buf)(di_backend *be, float *scores, const int32_t *blocks, int64_t m,
                                int64_t width, int topk_blocks, int bs);
    void (*topk_select_buf)(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                            int64_t width, int k, int32_t *idx);
    /* sparse_attn_kv over the slots of `rows` (n_win + n_sel slots per row). */
    void (*sparse_attn_rows)(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                             const di_attn_rows *rows, const float *sink, float scale,
                             float *out);

    /* ---- step forms (optional, each on its own) ----
     * A pass's per-row metadata in backend memory (the forward's step
     * metadata, uploaded once per pass), so the ops of a decode step take
     * no host array a device backend would have to stage per call. The same
     * bits as the host forms. NULL: the model uses the host forms. */
    /* rope with cs [m, rd/2, 2] in backend memory: the cosine and sine of
     * each row's angles as rope computes them (cosf / sinf of
     * (float)pos[i]·freq[j], in fp32); inverse negates the sine. */
    void (*rope_cs)(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                    int64_t rd, const float *cs, int inverse);
    /* The tail of attention's query and window-KV paths with the step's
     * angles cs [m, rd/2, 2] (backend memory, as rope_cs takes them):
     * kv [m, hd] ← rmsnorm(kv, nw); q [m, heads·hd] and kv rotated by
     * rope_cs (stride heads·hd and hd); out = kv_pack(DI_KVQ_FP8, kv). The
     * same bits as those four ops. Optional (NULL: the model calls them). */
    void (*qkv_rope_pack)(di_backend *be, float *q, int heads, float *kv, int64_t m, int64_t hd,
                          int64_t rd, const di_tensor *nw, double eps, const float *cs,
                          uint8_t *out);
    /* embed with ids [m] in backend memory */
    void (*embed_buf)(di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m,
                      float *out);
    /* gather_rows with rows [m] in backend memory */
    void (*gather_rows_buf)(di_backend *be, const float *src, const int32_t *rows, int64_t m,
                            int64_t n, float *dst);
    /* engram_gather with the looked-up rows already in backend memory (the
     * step metadata; the table itself stays on the host): rows [n, eh]
     * FP8 codes and scales [n, nb] E8M0 → out [n, eh] dequantized and
     * rounded to bf16, as engram_gather gives them. */
    void (*engram_rows)(di_backend *be, const uint8_t *rows, const uint8_t *scales, int64_t n,
                        int64_t eh, int64_t nb, float *out);
    /* Row scatter to destinations in backend memory (the writes into the
     * sequences' rings and caches): for i < m with slot[i] >= 0, `bytes`
     * from src + i·src_stride to base[i] + dst_off + slot[i]·dst_stride;
     * base [m] and slot [m] in backend memory. The same as those copies. */
    void (*scatter_rows_to)(di_backend *be, const void *src, size_t src_stride, int64_t m,
                            const uint8_t *const *base, const int32_t *slot, size_t dst_off,
                            size_t dst_stride, size_t bytes);
    /* The gather the other way (the compressor's groups from the
     * per-token rings): for i < m, `bytes` from base[i] + src_off +
     * slot[i]·src_stride to dst + i·dst_stride. */
    void (*gather_rows_from)(di_backend *be, void *dst, size_t dst_stride, int64_t m,
                             const uint8_t *const *base, const int32_t *slot, size_t src_off,
                             size_t src_stride, size_t bytes);

    /* ---- decode step graphs (optional, all or none) ----
     * A backend that records the ops of a decode step once per step key
     * (forward.h step_key: steps of one key issue the same op stream, only
     * the step metadata's contents differ) and replays them. graph_replay:
     * when a recording of `key` exists, copies the step metadata (meta,
     * host, `bytes`) into the recording's own metadata buffer, replays it
     * and returns the backend buffer the recording left the logits in;
     * NULL when there is none (the model then runs the step itself).
     * graph_record_begin: NULL, or (when the backend records this key now)
     * the backend buffer of `bytes` holding the metadata that the step must
     * use; the ops up to graph_record_end are then recorded (and not run),
     * and every buffer they allocate belongs to the recording. graph_record_end:
     * ends the recording (`logits`: where the step leaves them; NULL:
     * abandon it), runs it once; nonzero when it could not be recorded
     * (nothing ran: the step is to be run again without recording). */
    const float *(*graph_replay)(di_backend *be, uint64_t key, const void *meta, size_t bytes);
    void *(*graph_record_begin)(di_backend *be, uint64_t key, const void *meta, size_t bytes);
    int (*graph_record_end)(di_backend *be, const float *logits);

    /* ---- MoE (§7) ---- */
    /* logits [m, e] fp32 → selected experts [m, k] and weights [m, k] (both host):
     * sqrt(softplus), top-k of score + bias (ties: lower expert), weights from
     * the unbiased scores, renormalised when `normalize`, × route_scale. */
    void (*moe_route)(di_backend *be, const float *logits, const float *bias, int64_t m, int e,
                      int k, int normalize, float route_scale, int32_t *idx, float *w);
    /* moe_route with idx [m, k] and w [m, k] in backend memory (alloc), so
     * the routing can stay on the device for moe_experts. Optional (NULL:
     * the model routes on the host and uploads). */
    void (*moe_route_buf)(di_backend *be, const float *logits, const float *bias, int64_t m,
                          int e, int k, int normalize, float route_scale, int32_t *idx,
                          float *w);
    /* The routed experts of one layer in one call. Optional (NULL: the model
     * runs gather_rows / matmul / swiglu / matmul / scatter_add_rows per
     * expert). x [m, D]; idx [m, k], w [m, k] routing in backend memory
     * (distinct experts per row, ids in [0, ex->n)); out [m, D] =
     *   Σ over row i's experts e in ascending id order, from +0 in fp32, of
     *   W2_e · swiglu(W1_e·x_i, W3_e·x_i; w_i,e, limit),
     * every product with matmul flags `mm`: exactly what the per-expert loop
     * gives, bit for bit (each expert's rows in ascending row order). */
    void (*moe_experts)(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                        const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                        float *out);
    /* out = bf16(w·silu(min(g, lim))·clamp(u, ±lim)) for gate/up [m, n]; w may be NULL. */
    void (*swiglu)(di_backend *be, const float *g, const float *u, const float *w, int64_t m,
                   int64_t n, float limit, float *out);
    /* Row gather / scatter-add of [n]-wide rows. */
    void (*gather_rows)(di_backend *be, const float *src, const int32_t *rows, int64_t m,
                        int64_t n, float *dst);
    void (*scatter_add_rows)(di_backend *be, float *dst, const int32_t *rows, const float *src,
                             int64_t m, int64_t n);
    /* y += x (fp32), n values */
    void (*add)(di_backend *be, float *y, const float *x, int64_t n);
    /* y = bf16(a + b) over n values (y may alias a or b): add then
     * round_bf16, the same bits. Optional (NULL: add, round_bf16, copy). */
    void (*add_bf16)(di_backend *be, float *y, const float *a, const float *b, int64_t n);
    /* y = bf16(a + z) with z = x·Wᵀ as matmul(flags) gives it and x =
     * swiglu(g, u; w NULL, limit) [m, W.n_in]: the shared expert's down
     * product and the MoE's final sum (swiglu, matmul, add_bf16) in one,
     * their bits; y may alias a. Optional (NULL: the three ops). */
    void (*swiglu_matmul_add)(di_backend *be, const di_wmat *w, const float *g, const float *u, int64_t m,
                              float limit, const float *a, float *y, unsigned flags);

    /* Greedy summaries of the rows x [m, V] (core/row_exp.h): out[i] =
     * di_row_greedy_of(row i, V, lim, ban ? ban[i] : -1), bit for bit; ban a
     * host array, out in backend memory (download it). What a greedy draw
     * needs of a row in 24 bytes, so a device backend's rows need not cross
     * the bus. Optional (NULL: di_forward_rows is unsupported and the
     * engine reads every row itself). */
    void (*logits_greedy)(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim,
                          const int32_t *ban, di_row_greedy *out);
    /* Top lists of the rows x [m, V]: out[i·k .. i·k + k) = di_row_top_of(row
     * i, V, k), bit for bit, k in 1 .. DI_ROW_TOP_MAX (and <= V); out in
     * backend memory. A row's top logprobs without the row crossing the
     * bus. Optional (NULL: rows with top logprobs come to the host). */
    void (*logits_top)(di_backend *be, const float *x, int64_t m, int64_t V, int32_t k, di_row_top *out);
    /* out[i] = x[i·V + cols[i]] for the rows x [m, V] (cols a host array of
     * ids in [0, V)), out in backend memory: a row's value at one id (a
     * prompt logprob's target). Optional (NULL: those rows come whole). */
    void (*logits_pick)(di_backend *be, const float *x, int64_t m, int64_t V, const int32_t *cols, float *out);
    /* Draws next to the logits: out[i] (backend memory) for row x + i·V
     * under draws[i] (host; core/row_exp.h di_row_draw) and its edited ids
     * edits[draws[i].e0 ..] (host; n_edit of them, ascending ids below V;
     * edits may be NULL where no row has any; read until out is
     * downloaded, the device's copy may be queued) over ids [0, lim): token =
     * what di_sampler_sample draws for the row, or its greedy token (-1: none),
     * max = the row's value at token, max_all and sum = its log-sum-exp's
     * (as logits_greedy), pad = 0; or pad = 1 where the backend leaves the
     * draw to the host (the caller then reads the row; the CUDA backend
     * only under its DI_CUDA_DRAW_WIDE=0 test aid).
     * Optional (NULL: such rows come to the host). */
    void (*logits_draw)(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim,
                        const di_row_draw *draws, const di_row_edit *edits, di_row_greedy *out);

    /* Releases a backend with resources of its own (device memory, a
     * weight cache); NULL for the CPU backend. Called by di_backend_destroy. */
    void (*destroy)(di_backend *be);

    /* The first failure of any op since the backend was created, with its
     * message; DI_OK when all went well. Ops return nothing, so a device
     * backend keeps what went wrong (a launch error, a fault found when it
     * waits for the device, an allocation of scratch memory) and answers
     * here; the forward pass asks after each pass so the error reaches the
     * caller as a di_status. NULL when no op can fail (the CPU backend). */
    di_status (*status)(di_backend *be, di_err *err);

    /* Batch invariance (DEEPINFER_BATCH_INVARIANT). on: every op gives a
     * row the same bits whatever the other rows of the call and their
     * number, so a sequence's logits do not depend on its batch or its
     * prefill chunks; the backend then chooses no kernel by the number of
     * rows, at some cost in speed (docs/engine.md). NULL: the backend
     * always is (the CPU's fixed per-row reduction orders). */
    void (*set_batch_invariant)(di_backend *be, int on);

    /* The engine's defaults on this backend, asked once when an engine
     * opens: sequences a step, tokens a step, bytes of per-sequence state.
     * weight_bytes: what the model's weights will take in backend memory
     * (a device backend may upload them only at first use). The op changes
     * only what it has a better value for; NULL: the CPU's values
     * (di_backend_engine_defaults). */
    void (*engine_defaults)(di_backend *be, uint64_t weight_bytes, di_backend_defaults *d);
} di_backend_ops;

struct di_backend {
    const di_backend_ops *ops;
    int n_threads;
    void *impl; /* backend private */
};

/* The CPU's: 64 sequences and 512 tokens a step, 2 GiB of per-sequence
 * state; then the backend's own op, if any. */
static inline void di_backend_engine_defaults(di_backend *be, uint64_t weight_bytes, di_backend_defaults *d) {
    d->max_batch = 64;
    d->step_tokens = 512;
    d->state_bytes = 2ull << 30;
    if (be && be->ops->engine_defaults) be->ops->engine_defaults(be, weight_bytes, d);
}

/* alloc_raw where the backend has it, else alloc. */
static inline void *di_alloc_raw(di_backend *be, size_t bytes) {
    return be->ops->alloc_raw ? be->ops->alloc_raw(be, bytes) : be->ops->alloc(be, bytes);
}

/* host_alloc / host_free where the backend has them, else malloc / free. */
static inline void *di_host_alloc(di_backend *be, size_t bytes) {
    return be && be->ops->host_alloc ? be->ops->host_alloc(be, bytes) : malloc(bytes ? bytes : 1);
}
static inline void di_host_free(di_backend *be, void *p) {
    if (be && be->ops->host_free) be->ops->host_free(be, p);
    else free(p);
}

/* CPU backend: the linears on the kernels of backend/cpu/kernels.h (AVX2 or
 * scalar), the other ops in portable C, row-parallel on one thread pool.
 * n_threads <= 0: one per online core. */
di_status di_backend_cpu_create(int n_threads, di_backend **out, di_err *err);
/* Measuring aid: 1 keeps the CPU backend's routed experts on their
 * per-expert loop at decode too (moe_experts; the same bits), 0 restores. */
void di_backend_cpu_force_moe_loop(int on);
/* Measuring aid: 1 keeps the CPU backend's FP8 products on fp32
 * activations (wo_a) on their decoded panels at decode too, rather than
 * the units straight from the codes (the same bits), 0 restores. */
void di_backend_cpu_force_no_f32rows(int on);
void di_backend_destroy(di_backend *be);

/* Views a weight tensor pair as a di_wmat (FP8 needs its scale, FP4 too). */
di_status di_wmat_from(di_wmat *out, const di_tensor *w, const di_tensor *s, di_err *err);

#endif
