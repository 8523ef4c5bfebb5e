/* The expected tensor list of a config: every checkpoint tensor of the
 * backbone, the Engram modules, the DSpark stages (`mtp.*`) and the global
 * tensors, with official name, dtype and shape (architecture.md §8.2).
 *
 * Each entry can carry the address of the di_weights field it binds to, so
 * binding (weights.c) and dummy generation (dummy.c) both walk this one list
 * and never restate the naming rules. */
#ifndef DI_MODEL_MANIFEST_H
#define DI_MODEL_MANIFEST_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"
#include "core/tensor.h"
#include "model/config.h"
#include "model/weights.h"

#define DI_TENSOR_NAME_MAX 96

/* What a tensor is, for dummy value distributions and for reports. */
typedef enum di_tensor_role {
    DI_TR_FP8_WEIGHT,   /* F8_E4M3 Linear weight (scale is the next entry) */
    DI_TR_FP8_SCALE,    /* F8_E8M0 per 32x32 tile */
    DI_TR_FP4_WEIGHT,   /* I8 packed E2M1 expert weight */
    DI_TR_FP4_SCALE,    /* F8_E8M0 per 32 inputs */
    DI_TR_DENSE,        /* BF16 Linear weight [out, in] */
    DI_TR_NORM,         /* RMSNorm weight (~1) */
    DI_TR_EMBED,        /* token / Markov embedding table */
    DI_TR_ENGRAM_TABLE, /* F8_E4M3 Engram rows */
    DI_TR_ENGRAM_SCALE, /* F8_E8M0 per 32 channels of a row */
    DI_TR_ENGRAM_QK,    /* Engram q_weight / k_weight (~1) */
    DI_TR_HC_FN,        /* mHC projection (small) */
    DI_TR_HC_BASE,
    DI_TR_HC_SCALE,
    DI_TR_SINK,         /* attention sink logits */
    DI_TR_GATE_BIAS     /* router correction bias */
} di_tensor_role;

typedef struct di_manifest_entry {
    char name[DI_TENSOR_NAME_MAX];
    di_dtype dtype;
    int ndim;
    int64_t shape[2];
    int block;             /* owning block, -1 for global tensors */
    int optional;          /* bound when present, no error when absent (bias_vl) */
    di_tensor_role role;
    int64_t fan_in;        /* logical input features of a Linear (for init), else 0 */
    di_tensor *slot;       /* field of the di_weights it binds to, or NULL */
} di_manifest_entry;

typedef struct di_manifest {
    di_manifest_entry *v;
    size_t n, cap;
    const di_manifest_entry **sorted; /* by name, for di_manifest_find */
} di_manifest;

/* Builds the manifest of cfg. When w is non-NULL (di_weights_init'ed for
 * cfg) each entry's slot points at its field in w. */
di_status di_manifest_build(di_manifest *m, const di_config *cfg, di_weights *w, di_err *err);
void di_manifest_free(di_manifest *m);

/* Entry called `name`, NULL when not expected. O(log n). */
const di_manifest_entry *di_manifest_find(const di_manifest *m, const char *name);

/* Bytes of one entry (numel * dtype size). */
uint64_t di_manifest_entry_bytes(const di_manifest_entry *e);

/* 1 for checkpoint tensors this text engine knows it may ignore: the vision
 * tower and its glue (vision.*, aligner.*, image_start/end/newline). */
int di_manifest_tolerated(const char *name);

#endif
