/* The bound weights of a V4.1 model: one di_tensor view per checkpoint
 * tensor, grouped the way the forward pass uses them (architecture.md §4–§8).
 * Views point into whatever holds the bytes (checkpoint mappings, a dummy
 * arena); di_weights owns only its arrays of per-block/per-expert structs.
 *
 * Shape comments use the config's names: D dim, V vocab, H heads, Dh head_dim,
 * Rq q_lora_rank, G o_groups, Ro o_lora_rank, I moe_inter, E experts of the
 * block, HC hc_mult, Hi index heads, Di index head dim, Eh engram head dim,
 * Ne engram heads, N engram max n-gram, R engram rows, Rm markov rank,
 * T dspark taps. A tensor absent for a block (e.g. compressor of a non-source
 * layer) has dtype DI_DTYPE_INVALID and data NULL. In the dummy "lazy" mode a
 * tensor may have its shape and dtype but data NULL (not materialised). */
#ifndef DI_MODEL_WEIGHTS_H
#define DI_MODEL_WEIGHTS_H

#include "core/error.h"
#include "core/tensor.h"
#include "model/config.h"

/* FP8 E4M3 Linear with one UE8M0 scale per 32x32 tile. */
typedef struct di_w_fp8 {
    di_tensor weight; /* [out, in] F8_E4M3 */
    di_tensor scale;  /* [ceil(out/32), ceil(in/32)] F8_E8M0 */
} di_w_fp8;

/* MXFP4 Linear: two E2M1 codes per byte (low nibble = even element) and one
 * UE8M0 scale per 32 inputs of a row. */
typedef struct di_w_fp4 {
    di_tensor weight; /* [out, in/2] I8 */
    di_tensor scale;  /* [out, in/32] F8_E8M0 */
} di_w_fp4;

typedef struct di_w_expert {
    di_w_fp4 w1; /* gate [I, D] */
    di_w_fp4 w2; /* down [D, I] */
    di_w_fp4 w3; /* up   [I, D] */
} di_w_expert;

typedef struct di_w_shared_expert {
    di_w_fp8 w1; /* [I, D] */
    di_w_fp8 w2; /* [D, I] */
    di_w_fp8 w3; /* [I, D] */
} di_w_shared_expert;

typedef struct di_w_attn {
    di_w_fp8 wq_a;     /* [Rq, D] */
    di_tensor q_norm;  /* [Rq] BF16 */
    di_w_fp8 wq_b;     /* [H*Dh, Rq] */
    di_w_fp8 wkv;      /* [Dh, D] */
    di_tensor kv_norm; /* [Dh] BF16 */
    di_w_fp8 wo_a;     /* [G*Ro, H*Dh/G] (used as bf16, per group) */
    di_w_fp8 wo_b;     /* [D, G*Ro] */
    di_tensor sink;    /* attn_sink [H] F32 */
    /* compressor: kv sources only */
    di_tensor cmp_wkv;   /* compressor.wkv.weight [Dh, D] BF16 */
    di_tensor cmp_wgate; /* compressor.wgate.weight [Dh, D] BF16, ratio > 1 only */
    di_tensor cmp_norm;  /* compressor.norm.weight [Dh] BF16 */
    /* indexer: index sources (wq_b, weights_proj); wk, k_norm on kv sources */
    di_w_fp8 idx_wq_b;      /* indexer.wq_b [Hi*Di, Rq] */
    di_tensor idx_wk;       /* indexer.wk.weight [Di, Dh] BF16 */
    di_tensor idx_k_norm;   /* indexer.k_norm.weight [Di] BF16 */
    di_tensor idx_weights;  /* indexer.weights_proj.weight [Hi, D] BF16 */
} di_w_attn;

typedef struct di_w_hc {
    di_tensor fn;    /* [(2+HC)*HC, HC*D] F32 */
    di_tensor base;  /* [(2+HC)*HC] F32 */
    di_tensor scale; /* [3] F32 */
} di_w_hc;

typedef struct di_w_moe {
    di_tensor gate;         /* ffn.gate.weight [E, D] BF16 */
    di_tensor gate_bias;    /* ffn.gate.bias [E] F32 */
    di_tensor gate_bias_vl; /* ffn.gate.bias_vl [E] F32 (image spans; optional) */
    int n_experts;          /* E */
    di_w_expert *experts;   /* [E], owned */
    di_w_shared_expert shared;
} di_w_moe;

typedef struct di_w_engram {
    di_tensor embed;       /* engram.embed.weight [R, Eh] F8_E4M3 */
    di_tensor embed_scale; /* engram.embed.scale [R, Eh/32] F8_E8M0 */
    di_w_fp8 wkv;          /* engram.wkv [(HC+1)*D, (N-1)*Ne*Eh] */
    di_tensor q_weight;    /* [HC, D] BF16 */
    di_tensor k_weight;    /* [HC, D] BF16 */
} di_w_engram;

/* DSpark extras, present on one stage each (stage 0: main_proj/main_norm;
 * last stage: norm, Markov head, confidence head). */
typedef struct di_w_dspark {
    di_w_fp8 main_proj;     /* mtp.0.main_proj [D, T*D] */
    di_tensor main_norm;    /* mtp.0.main_norm.weight [D] BF16 */
    di_tensor norm;         /* mtp.<last>.norm.weight [D] BF16 */
    di_tensor markov_embed; /* mtp.<last>.markov_head.embed.weight [V, Rm] BF16 */
    di_tensor markov_head;  /* mtp.<last>.markov_head.head.weight [V, Rm] BF16 */
    di_tensor confidence;   /* mtp.<last>.confidence_head.proj.weight [1, D+Rm] BF16 */
} di_w_dspark;

typedef struct di_w_block {
    di_w_attn attn;
    di_w_hc hc_attn;
    di_w_hc hc_ffn;
    di_tensor attn_norm; /* [D] BF16 */
    di_tensor ffn_norm;  /* [D] BF16 */
    di_w_moe ffn;
    int has_engram;
    di_w_engram engram;  /* blocks listed in engram_layer_ids */
} di_w_block;

typedef struct di_weights {
    di_tensor embed;   /* embed.weight [V, D] BF16 */
    di_tensor head;    /* head.weight [V, D] BF16 */
    di_tensor norm;    /* norm.weight [D] BF16 */
    int n_blocks;      /* n_layers + n_mtp */
    di_w_block *blocks; /* [n_blocks], owned */
    di_w_dspark dspark;
} di_weights;

/* Allocates the per-block and per-expert arrays for cfg (every view empty). */
di_status di_weights_init(di_weights *w, const di_config *cfg, di_err *err);
void di_weights_free(di_weights *w);

/* A tensor source: returns the tensor called `name`, or NULL when absent.
 * `file` (optional) receives the file it lives in, for error messages. */
typedef const di_tensor *(*di_tensor_lookup_fn)(void *ctx, const char *name,
                                                 const char **file);
/* Calls fn(ctx, i, name) for every tensor the source holds, so binding can
 * report tensors it does not know. */
typedef struct di_tensor_source {
    void *ctx;
    di_tensor_lookup_fn find;
    size_t (*count)(void *ctx);
    /* name and file of the i-th tensor (file may be NULL). */
    const char *(*name_at)(void *ctx, size_t i, const char **file);
} di_tensor_source;

/* Binds every tensor of cfg's manifest from src into w (which must be
 * di_weights_init'ed): missing, mis-shaped or mis-typed tensors, and extra
 * tensors that are neither expected nor tolerated (vision.*, aligner.*,
 * image_*), fail with a message naming the tensor and its file. */
di_status di_weights_bind(di_weights *w, const di_config *cfg, const di_tensor_source *src,
                          di_err *err);

struct di_checkpoint;
/* The tensor source of an opened checkpoint (src/io/checkpoint.h). */
void di_weights_source_checkpoint(di_tensor_source *src, struct di_checkpoint *ck);

#endif
