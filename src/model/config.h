/* The V4.1 model configuration: every value of config.json the engine needs
 * (architecture.md §1.1, HF layout: keys under `text_config` or at the top
 * level, `quantization_config` at the top level), validated, plus the
 * per-layer roles derived from the config's lists (§1.3).
 *
 * Roles are always derived from compress_ratios / kv_source_layer_ids /
 * index_source_layer_ids / candidate_source_layer_id / engram_layer_ids /
 * dspark_target_layer_ids, never from the released model's numbers, so the
 * tiny golden model and the real one go through the same code.
 *
 * Block numbering: blocks 0..n_layers-1 are the backbone, blocks
 * n_layers..n_layers+n_mtp-1 are the DSpark stages (checkpoint prefix
 * `mtp.<block - n_layers>.`). compress_ratios has one entry per block. */
#ifndef DI_MODEL_CONFIG_H
#define DI_MODEL_CONFIG_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

#define DI_CFG_MAX_BLOCKS 256  /* backbone layers + DSpark stages */
#define DI_CFG_MAX_ENGRAM 16   /* Engram layers */
#define DI_CFG_MAX_TAPS 16     /* DSpark target layers */
#define DI_CFG_MAX_NGRAM 8     /* engram_max_ngram_size */

/* How a layer chooses its compressed entries (§5.4). */
typedef enum di_indexer_kind {
    DI_INDEXER_NONE = 0, /* reuses the selection of `isrc` (or has no compressed KV) */
    DI_INDEXER_FULL = 1, /* scores every visible compressed entry of its kv source */
    DI_INDEXER_POOL = 2  /* scores only inside the candidate source's pool ("Reindex") */
} di_indexer_kind;

/* Derived role of one block (architecture.md §1.3). */
typedef struct di_layer_role {
    int ratio;               /* compress ratio: 0 window only, 1 or 2 */
    int owns_compressor;     /* listed in kv_source_layer_ids */
    int is_index_source;     /* listed in index_source_layer_ids: has an indexer */
    di_indexer_kind indexer; /* FULL / POOL for index sources, NONE otherwise */
    int kv_src;              /* block whose compressed KV + index keys it reads; -1 if ratio 0 */
    int isrc;                /* block whose top-k selection it uses; -1 if ratio 0 */
    int is_candidate_source; /* builds the candidate pool */
    int engram;              /* index into engram_* arrays, -1 if no Engram */
    int dspark_tap;          /* index into dspark_target_layer_ids, -1 if not a tap */
    int is_dspark_stage;     /* block >= n_layers */
    int n_experts;           /* routed experts of this block's MoE */
    int n_active;            /* top-k of this block's MoE */
    double rope_base;        /* rope_theta (ratio 0) or compress_rope_theta */
    int yarn;                /* 1 when YaRN frequency scaling applies (ratio > 0) */
} di_layer_role;

typedef struct di_config {
    /* ---- text_config, as in the file ---- */
    int64_t vocab_size;          /* V */
    int64_t dim;                 /* hidden_size D */
    int64_t moe_inter;           /* moe_intermediate_size I */
    int n_layers;                /* num_hidden_layers (backbone) */
    int n_heads;                 /* num_attention_heads H */
    int n_kv_heads;              /* num_key_value_heads: must be 1 */
    int64_t head_dim;            /* Dh (= latent KV dim) */
    int64_t rope_dim;            /* qk_rope_head_dim Dr (last Dr dims of a head) */
    int64_t q_lora_rank;         /* Rq */
    int64_t o_lora_rank;         /* Ro */
    int o_groups;                /* G */
    double swiglu_limit;
    double eps;                  /* rms_norm_eps */
    int64_t max_position;        /* max_position_embeddings */
    double rope_theta;
    int yarn_enabled;            /* rope_scaling.rope_type == "yarn" */
    double yarn_factor;
    double yarn_beta_fast;
    double yarn_beta_slow;
    int64_t yarn_original_max_pos;
    int n_routed_experts;
    int n_shared_experts;        /* must be 1 */
    int n_active_experts;        /* num_experts_per_tok */
    int norm_topk_prob;
    double route_scale;          /* routed_scaling_factor */
    double gate_temp;            /* not in the file: 1.0 */
    int window;                  /* sliding_window */
    int n_blocks;                /* n_layers + n_mtp = entries of compress_ratios */
    int compress_ratios[DI_CFG_MAX_BLOCKS];
    double compress_rope_theta;
    int n_kv_sources;
    int kv_sources[DI_CFG_MAX_BLOCKS];
    int n_index_sources;
    int index_sources[DI_CFG_MAX_BLOCKS];
    int index_n_heads;           /* Hi */
    int64_t index_head_dim;      /* Di */
    int index_topk;
    int candidate_source;        /* -1 when absent / disabled */
    int candidate_topk_blocks;
    int candidate_block_size;
    int hc_mult;                 /* HC */
    int hc_sinkhorn_iters;
    double hc_eps;
    int n_engram;
    int engram_layers[DI_CFG_MAX_ENGRAM];
    int64_t engram_rows[DI_CFG_MAX_ENGRAM]; /* engram_num_embeddings */
    int engram_max_ngram;
    int64_t engram_vocab_size;   /* prime-search start */
    int engram_n_heads;
    int64_t engram_head_dim;
    int engram_pad_id;
    int64_t engram_compressed_vocab;
    int n_mtp;                   /* num_nextn_predict_layers (DSpark stages) */
    int dspark_block_size;
    int dspark_noise_id;
    int n_dspark_taps;
    int dspark_taps[DI_CFG_MAX_TAPS];
    int64_t dspark_markov_rank;
    int dspark_n_experts;
    int dspark_n_active;
    /* ---- top level ---- */
    int bos_id, eos_id, pad_id;  /* pad_id -1 when absent */
    int image_token_id;          /* -1 when absent */
    int vision_layers;           /* vision_config.num_hidden_layers (0: text only) */
    /* ---- quantization_config ---- */
    int quant_fp8;               /* quant_method == "fp8" (else bf16 weights: unsupported) */
    int quant_block[2];          /* weight_block_size: must be {32, 32} */
    int expert_fp4;              /* expert_dtype == "fp4" */
    /* ---- derived ---- */
    di_layer_role roles[DI_CFG_MAX_BLOCKS]; /* one per block */
} di_config;

/* Parses and validates a config.json document of n bytes (not NUL-terminated
 * necessarily). On failure the message names the key and the supported range.
 * Unknown keys are ignored. */
di_status di_config_parse(const char *json, size_t n, di_config *out, di_err *err);

/* Reads `path` (a config.json file) and parses it; errors are prefixed with
 * the path. */
di_status di_config_load(const char *path, di_config *out, di_err *err);

/* Recomputes cfg->roles from the lists (called by parse; exposed for callers
 * that edit a config, e.g. dummy models with fewer layers). Validates the
 * lists against each other. */
di_status di_config_derive(di_config *cfg, di_err *err);

/* Checkpoint prefix of a block: "layers.N." or "mtp.K." (buf >= 24 bytes). */
void di_config_block_prefix(const di_config *cfg, int block, char *buf, size_t n);

/* One-line role summary of a block for `run` / `plan` ("ratio 2, kv source,
 * indexer full, engram"...), written into buf. */
void di_config_role_str(const di_config *cfg, int block, char *buf, size_t n);

#endif
