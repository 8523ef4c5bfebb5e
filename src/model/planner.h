/* Memory plan of a V4.1 model (architecture.md §13): bytes of weights per
 * dtype and per part, per-token compressed-KV + index-key bytes for each
 * storage format, the fixed per-sequence state, and the number of devices of
 * a given size needed for a context length and batch.
 *
 * Weights are the manifest's tensors (the text model). For the real config
 * that is 509,315,486,040 bytes in 95,819 tensors, 0.19% under the index's
 * total_size of 510,286,023,000 (96,085 tensors): I8 278.59 GB, F8_E4M3
 * 204.02 GB, F8_E8M0 23.56 GB and F32 0.17 GB match §8.1's dtype totals, and
 * the whole gap is BF16 (2.98 GB here vs 3.95 GB) in 266 tensors. By
 * elimination those are the vision tower (vision.*, aligner.*, image_*; BF16
 * in the reference), which a text engine tolerates in the files but never
 * loads. */
#ifndef DI_MODEL_PLANNER_H
#define DI_MODEL_PLANNER_H

#include <stdint.h>

#include "core/dtype.h"
#include "core/error.h"
#include "model/config.h"

/* Storage formats of the compressed KV / index-key caches (§5.3, §13.2). */
typedef enum di_kv_format {
    DI_KV_FP4 = 0, /* as shipped: KV E2M1 + E4M3 scale per 16, keys E2M1 + E8M0 per 32 */
    DI_KV_FP8 = 1, /* E4M3 + one scale byte per 32 */
    DI_KV_BF16 = 2,
    DI_KV_FORMATS = 3
} di_kv_format;

const char *di_kv_format_name(di_kv_format f); /* "fp4", "fp8", "bf16" */

/* Parts of the weights, for the report. */
enum {
    DI_PART_EXPERTS = 0,  /* routed experts of the backbone */
    DI_PART_ENGRAM,       /* Engram tables (embed + scale) */
    DI_PART_DSPARK,       /* every mtp.* tensor */
    DI_PART_EMBED_HEAD,   /* embed.weight + head.weight */
    DI_PART_OTHER,        /* attention, shared experts, norms, mHC, routers, Engram projections */
    DI_PART_COUNT
};
const char *di_plan_part_name(int part);

typedef struct di_plan_request {
    uint64_t context; /* tokens per sequence */
    uint32_t batch;   /* sequences held at once */
    double device_gib; /* memory of one device, GiB */
    di_kv_format kv_format; /* format the device count assumes */
} di_plan_request;

void di_plan_request_default(di_plan_request *r); /* 131072 tokens, batch 1, 140 GiB, FP4 */

typedef struct di_plan {
    di_plan_request req;
    /* weights */
    uint64_t n_tensors;
    uint64_t weights_bytes;
    uint64_t weights_by_dtype[DI_DTYPE_COUNT];
    uint64_t weights_by_part[DI_PART_COUNT];
    /* per token: compressed entries (Σ over kv sources of 1/ratio) and bytes */
    double kv_entries_per_token;
    double kv_bytes_per_token[DI_KV_FORMATS];   /* compressed KV + index keys */
    double kv_main_per_token[DI_KV_FORMATS];    /* of which compressed KV */
    /* fixed per sequence */
    uint64_t window_rings_fp8;  /* every block (DSpark stages included), E4M3 + scale per 32 */
    uint64_t window_rings_bf16;
    uint64_t compressor_state;  /* partial groups of ratio > 1 sources, fp32 kv + score */
    uint64_t engram_history;    /* last (max_ngram - 1) compressed ids, int32 (host) */
    uint64_t fixed_per_sequence; /* rings (FP8) + compressor + Engram */
    /* totals for req */
    uint64_t kv_bytes_total;    /* batch × (context × per-token in req.kv_format + fixed) */
    uint64_t device_bytes;
    uint64_t device_margin;     /* reserved per device for activations and workspace */
    uint32_t devices_needed;    /* 0 when a single device cannot even hold its margin */
    /* The same with the Engram tables in host memory: a token reads only
     * (N-1)·Ne rows of each, so they need not occupy device memory. */
    uint32_t devices_needed_engram_on_host;
} di_plan;

/* Plans cfg for req (NULL = defaults). */
di_status di_plan_compute(const di_config *cfg, const di_plan_request *req, di_plan *out, di_err *err);

/* Renders the plan as text or JSON into a malloc'd string (NULL on out of
 * memory). */
char *di_plan_render(const di_config *cfg, const di_plan *p, int as_json);

#endif
