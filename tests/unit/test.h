/* Minimal unit-test harness: each test file is one binary whose main() runs
 * TEST functions through RUN(); failures print file:line and the test exits
 * non-zero. The last line a test binary prints is "N passed, N failed"
 * (counted per check), which scripts/test adds up. */
#ifndef DI_TEST_H
#define DI_TEST_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int t_passed, t_failed, t_skipped;
static const char *t_current = "";

#define CHECK(cond)                                                                  \
    do {                                                                             \
        if (cond) t_passed++;                                                        \
        else {                                                                       \
            t_failed++;                                                              \
            fprintf(stderr, "%s:%d: %s: check failed: %s\n", __FILE__, __LINE__,    \
                    t_current, #cond);                                               \
        }                                                                            \
    } while (0)

#define CHECKF(cond, ...)                                                            \
    do {                                                                             \
        if (cond) t_passed++;                                                        \
        else {                                                                       \
            t_failed++;                                                              \
            fprintf(stderr, "%s:%d: %s: check failed: %s: ", __FILE__, __LINE__,     \
                    t_current, #cond);                                               \
            fprintf(stderr, __VA_ARGS__);                                            \
            fputc('\n', stderr);                                                     \
        }                                                                            \
    } while (0)

#define CHECK_EQ_INT(a, b) CHECKF((long long)(a) == (long long)(b), "%lld != %lld", \
                                  (long long)(a), (long long)(b))
#define CHECK_STR_CONTAINS(hay, needle) \
    CHECKF((hay) && strstr((hay), (needle)) != NULL, "\"%s\" does not contain \"%s\"", \
           (hay) ? (hay) : "(null)", (needle))

/* Marks the current test as skipped with a reason (e.g. ../shared missing). */
#define SKIP(...)                                                                    \
    do {                                                                             \
        t_skipped++;                                                                 \
        fprintf(stderr, "skip %s: ", t_current);                                     \
        fprintf(stderr, __VA_ARGS__);                                                \
        fputc('\n', stderr);                                                         \
        return;                                                                      \
    } while (0)

/* DI_TEST_ONLY=text in the environment: only the tests whose names hold it */
#define RUN(fn)                                                                      \
    do {                                                                             \
        const char *t_only_ = getenv("DI_TEST_ONLY");                                \
        if (t_only_ && *t_only_ && !strstr(#fn, t_only_)) break;                     \
        t_current = #fn;                                                             \
        fn();                                                                        \
    } while (0)

static inline int test_summary(void) {
    printf("%d passed, %d failed, %d skipped\n", t_passed, t_failed, t_skipped);
    return t_failed ? 1 : 0;
}

/* Path to ../shared (or $DEEPINFER_SHARED_DIR), or NULL when absent. */
static inline const char *test_shared_dir(void) {
    static char buf[4096];
    const char *env = getenv("DEEPINFER_SHARED_DIR");
    const char *cands[] = {env, "../shared", "../../shared"};
    for (size_t i = 0; i < sizeof cands / sizeof *cands; i++) {
        if (!cands[i]) continue;
        snprintf(buf, sizeof buf, "%s/golden/README.md", cands[i]);
        FILE *f = fopen(buf, "rb");
        if (f) {
            fclose(f);
            snprintf(buf, sizeof buf, "%s", cands[i]);
            return buf;
        }
    }
    return NULL;
}

#endif
