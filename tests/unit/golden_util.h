/* Helpers for the golden-fixture tests: open a fixture model (config,
 * checkpoint, bound weights, CPU backend, runtime model), read golden
 * tensors by name, and the comparison statistics of the golden README. */
#ifndef DI_TEST_GOLDEN_UTIL_H
#define DI_TEST_GOLDEN_UTIL_H

#include <stdint.h>

#include "io/checkpoint.h"
#include "io/safetensors.h"
#include "model/forward.h"

typedef struct gold_model {
    di_config cfg;
    di_checkpoint *ck;
    di_weights w;
    di_backend *be;
    di_lm lm;
    di_safetensors gold; /* golden.safetensors of the chosen fixture */
    int open;
} gold_model;

/* Opens <shared>/golden/v41-tiny as model and <shared>/golden/<fixture> as
 * the golden file; numerics follow the fixture (v41-tiny-bf16 → BF16).
 * Returns 0 on success, prints the error otherwise. */
int gold_open(gold_model *g, const char *shared, const char *fixture);
void gold_close(gold_model *g);

/* F32 / I32 golden tensor by name (NULL + message when absent); numel out. */
const float *gold_f32(const gold_model *g, const char *name, int64_t *numel);
const int32_t *gold_i32(const gold_model *g, const char *name, int64_t *numel);

/* The golden tensors of one prompt P (P.prompt_ids, P.prefill.logits,
 * P.decode.*). gold_prompt_get returns 1 when all are present (0 after a
 * message naming the missing one). */
typedef struct gold_prompt {
    const int32_t *ids;            /* [S] prompt */
    int64_t S;
    const float *prefill_logits;   /* [S, V] */
    const int32_t *decode_ids;     /* [n] teacher-forced decode inputs */
    int64_t n;
    const float *decode_logits;    /* [n, V] */
    const int32_t *next_ids;       /* [n] free-running greedy tokens */
    const float *margin;           /* [n] top-2 margin of each greedy step */
} gold_prompt;
int gold_prompt_get(const gold_model *g, const char *p, gold_prompt *gp);

/* ||a - b|| / ||b|| over n values. */
double rel_l2(const float *a, const float *b, int64_t n);

typedef struct logit_stats {
    double mean, p99, p999, max, worst_row_mean, argmax_agree;
    int must_match_fail; /* rows whose golden margin > thr but argmax differs */
} logit_stats;
/* Statistics of |a - b| over rows × v logits; thr is the argmax margin. */
logit_stats logit_compare(const float *a, const float *b, int64_t rows, int64_t v, double thr);

/* Heavy golden cases (the 523-token prompt end to end) are cut down in
 * sanitizer builds and with DEEPINFER_TEST_QUICK, unless DEEPINFER_TEST_FULL
 * is set. */
int quick_mode(void);

#endif
