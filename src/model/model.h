/* The runtime model: a parsed config, its bound weights, the backend that
 * runs the ops, and what the forward pass derives once from them: weight
 * matrices in backend form, per-block RoPE frequency tables, the Engram hash
 * constants and the compressed token map (architecture.md §3–§10).
 *
 * Numerics: DI_NUMERICS_FP8 is the shipped mode (FP8 activation quantization
 * before every FP8/FP4 GEMM); DI_NUMERICS_BF16 skips the activation
 * quantization and uses the exact weight values (the reference's
 * dtype="bf16" mode). Both keep the KV/indexer QDQ steps. */
#ifndef DI_MODEL_MODEL_H
#define DI_MODEL_MODEL_H

#include <stdint.h>

#include "backend/backend.h"
#include "model/config.h"
#include "model/weights.h"

typedef enum di_numerics { DI_NUMERICS_FP8 = 0, DI_NUMERICS_BF16 = 1 } di_numerics;

typedef struct di_lm_expert {
    di_wmat w1, w2, w3;
} di_lm_expert;

typedef struct di_lm_block {
    di_wmat wq_a, wq_b, wkv, wo_a, wo_b;
    di_wmat cmp_wkv, cmp_wgate;  /* kv sources (wgate: ratio > 1) */
    di_wmat idx_wq_b, idx_wk, idx_wp;
    di_wmat gate;                /* router [E, D], fp32 product */
    di_lm_expert *experts;       /* [E] */
    di_lm_expert shared;
    di_wmat engram_wkv;
    float *freq;                 /* [rope_dim/2] RoPE frequencies of this block */
} di_lm_block;

typedef struct di_lm {
    const di_config *cfg;
    const di_weights *w;
    di_backend *be;
    di_numerics numerics;
    unsigned mm_q;               /* matmul flags of an FP8/FP4 linear: ACT_FP8 (fp8 mode) | OUT_BF16 */
    di_lm_block *blocks;         /* [n_blocks] */
    di_wmat head;                /* [V, D] fp32 product */
    di_wmat main_proj;           /* DSpark [D, T*D] */
    di_wmat markov_head;         /* [V, Rm] */
    di_wmat confidence;          /* [1, D+Rm] */
    int has_dspark;
    /* Engram hashing (§6.2) */
    int32_t *cmap;               /* [V] compressed id of each token (copy) */
    int64_t cmap_pad;            /* cmap[engram_pad_id] */
    uint64_t *eg_mult;           /* [n_engram, N] odd multipliers */
    int64_t *eg_prime;           /* [n_engram, (N-1)*Ne] */
    int64_t *eg_offset;          /* [n_engram, (N-1)*Ne] */
} di_lm;

/* Builds the runtime model over cfg + w (both must outlive it). `cmap` is
 * the Engram compressed token map [cfg->vocab_size] (may be NULL when the
 * config has no Engram layer); it is copied and validated. */
di_status di_lm_init(di_lm *lm, const di_config *cfg, const di_weights *w, di_backend *be,
                     di_numerics numerics, const int32_t *cmap, di_err *err);
void di_lm_free(di_lm *lm);

/* RoPE frequencies of a block (§5.1): rd/2 values, base rope_theta without
 * YaRN for ratio 0, compress_rope_theta with YaRN otherwise. */
void di_rope_freqs(const di_config *cfg, int block, float *out);

/* Engram constants (§6.2): primes by the reference's successive prime
 * search, multipliers from numpy's default_rng(10007·layer) bounded draws. */
void di_engram_primes(const di_config *cfg, int64_t *primes /*[n_engram, (N-1)*Ne]*/);
void di_engram_multipliers(int layer_id, int n, int64_t compressed_vocab, uint64_t *out);

#endif
