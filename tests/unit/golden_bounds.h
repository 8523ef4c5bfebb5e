/* The end-to-end logit bounds of the golden README (levels 3-5) for each
 * fixture, and the check of a [rows, v] logit block against them. Shared by
 * the CPU and GPU golden tests so both hold the same numbers. Include after
 * test.h: the checks count into the including test's tallies. */
#ifndef DI_TEST_GOLDEN_BOUNDS_H
#define DI_TEST_GOLDEN_BOUNDS_H

#include <stdio.h>

#include "golden_util.h"

typedef struct gold_bounds {
    double mean, p99, p999, max, row_mean, margin, agree;
} gold_bounds;

static const gold_bounds GOLD_BOUNDS_FP8 = {0.25, 1.2, 2.0, 3.9, 0.98, 1.2, 0.85};
static const gold_bounds GOLD_BOUNDS_BF16 = {0.14, 1.2, 2.2, 4.9, 1.3, 1.0, 0.85};

static inline void gold_check_logits(const char *what, const float *mine, const float *gold, int64_t rows,
                                     int64_t v, const gold_bounds *b) {
    logit_stats s = logit_compare(mine, gold, rows, v, b->margin);
    fprintf(stderr, "  %-28s mean %.4f p99 %.3f p999 %.3f max %.3f row-mean %.3f argmax %.3f\n", what,
            s.mean, s.p99, s.p999, s.max, s.worst_row_mean, s.argmax_agree);
    CHECKF(s.mean <= b->mean, "%s mean %.4f", what, s.mean);
    CHECKF(s.p99 <= b->p99, "%s p99 %.3f", what, s.p99);
    CHECKF(s.p999 <= b->p999, "%s p999 %.3f", what, s.p999);
    CHECKF(s.max <= b->max, "%s max %.3f", what, s.max);
    CHECKF(s.worst_row_mean <= b->row_mean, "%s row mean %.3f", what, s.worst_row_mean);
    CHECKF(s.argmax_agree >= b->agree, "%s argmax agreement %.3f", what, s.argmax_agree);
    CHECKF(s.must_match_fail == 0, "%s: %d rows with a clear golden argmax differ", what, s.must_match_fail);
}

#endif
