/* Small helpers shared by the benchmark programs: a monotonic clock in
 * seconds and a comparison of doubles for qsort (medians, percentiles). */
#ifndef DI_BENCH_UTIL_H
#define DI_BENCH_UTIL_H

#include <time.h>

static inline double bench_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

static inline int bench_cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

#endif
