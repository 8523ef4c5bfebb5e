/* The tensor-core form of sparse attention with sink over packed cache rows
 * (architecture.md §5.5; backend.h's sparse_attn_kv): one block per query
 * row and 64 heads, the row's 64-slot key blocks decoded once into shared
 * memory and shared by the heads (the model has one kv head), q·k and p·v
 * as bf16 mma.sync with fp32 accumulation.
 * cuda_op_sparse_attn_kv (cuda_ops_attn.cu) picks it wherever
 * cuda_attn_tc_fits, decode steps included: measured on an H200 it beats the
 * block per (row, head) at every m, from one query row (129 µs against 629
 * for 640 slots) to a prefill chunk (docs/gpu-notes.md); for few rows it
 * takes the split-slot form below (one row's 10 slot blocks in series were
 * ~110 µs of latency on one SM). The launchers are here so tests and
 * benchmarks can run each form. Device pointers as in cuda_ops.h. */
#ifndef DI_BACKEND_CUDA_ATTN_TC_H
#define DI_BACKEND_CUDA_ATTN_TC_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#include "core/error.h"

/* 1 when the tensor-core form handles head_dim d (a multiple of 32, at
 * most 512: a warp's half of the p·v result stays in registers). */
int cuda_attn_tc_fits(int64_t d);

/* sparse_attn_kv on the tensor cores: q [m, h, d] (bf16 values), rows
 * [m, n_slots] device table of packed rows (slots j < n_win DI_KVQ_FP8, the
 * others DI_KVQ_FP4_E4M3, NULL = empty), sink [h], out [m, h, d]. */
di_status cuda_op_sparse_attn_kv_tc(const float *q, int64_t m, int h, int64_t d,
                                    const uint8_t *const *rows, int n_slots, int n_win,
                                    const float *sink, float scale, float *out, di_err *err);

/* The split-slot form for few query rows over many slots (decode steps):
 * a cluster of S blocks per (row, 64 heads), block c walking the 64-slot
 * blocks of slots c·span .. +span with its own running maximum and leaving
 * (max, denominator, unnormalized output) per head; the cluster then
 * combines them in rank order with the sink folded in once. S and span
 * follow from n_slots and `splits` only (S = ceil(blocks / span), span =
 * ceil(blocks / min(splits, 16)) blocks), never from timing, so a shape's
 * bits repeat. S = 1 gives the unsplit form's bits. Arguments as
 * cuda_op_sparse_attn_kv_tc. */
di_status cuda_op_sparse_attn_kv_tc_split(const float *q, int64_t m, int h, int64_t d,
                                          const uint8_t *const *rows, int n_slots, int n_win,
                                          const float *sink, float scale, int splits, float *out,
                                          di_err *err);

/* The split count for rows of n_slots slots with at most max_splits
 * (<= 16) blocks a row (1: no split): as many blocks as 64-slot blocks, or
 * the fewest spans of equal whole 64-slot blocks within max_splits. */
int cuda_attn_tc_splits(int n_slots, int max_splits);

/* Test and measuring aid: blocks of 16 heads (hg = 1, where d % 128 == 0)
 * or of 64 (hg = 4) for every launch; 0 = the launchers choose (16 heads
 * while four times the 64-head blocks fit on the GPU at two a SM). The
 * bits are the same either way. */
void cuda_attn_tc_set_head_groups(int hg);

/* Test and measuring aid: which aligned slot blocks of one kind take the
 * fast key decode (bit 0 window blocks, bit 1 compressed ones; 3 both, the
 * default; 0 none: the general path throughout). The bits are the same
 * either way. */
void cuda_attn_tc_set_fast_decode(int mask);

/* The one-block-per-(row, head) form (head sizes the tensor-core form does
 * not take). */
di_status cuda_op_sparse_attn_kv_rowwise(const float *q, int64_t m, int h, int64_t d,
                                         const uint8_t *const *rows, int n_slots, int n_win,
                                         const float *sink, float scale, float *out,
                                         di_err *err);

#ifdef __cplusplus
}
#endif

#endif
