/* A checkpoint's weights copied into memory (model/weights_memory.h,
 * di_model_options.weights_in_memory): the same bytes at 64-byte aligned
 * addresses of the model's own block, the mapped path untouched, the
 * automatic rule and its environment switch, clear errors for bad values;
 * di_huge_alloc's alignments; an engine on the CPU copies. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "api/api_model.h"
#include "core/huge_alloc.h"
#include "core/mem_avail.h"
#include "deepinfer.h"
#include "model/manifest.h"
#include "model/weights_memory.h"
#include "test.h"

static char tiny[4200];

/* ---- di_mem_available_at on fake /proc and /sys/fs/cgroup trees ---- */

static char root[64];

static void put(const char *rel, const char *text) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", root, rel);
    for (char *s = p + strlen(root) + 1; (s = strchr(s, '/')); s++) { /* the folders on the way */
        *s = 0;
        mkdir(p, 0755);
        *s = '/';
    }
    FILE *f = fopen(p, "w");
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static uint64_t avail(void) {
    char proc[128], cg[128];
    snprintf(proc, sizeof proc, "%s/proc", root);
    snprintf(cg, sizeof cg, "%s/cg", root);
    return di_mem_available_at(proc, cg);
}

static void test_mem_available(void) {
    snprintf(root, sizeof root, "/tmp/di-memavail-XXXXXX");
    if (!mkdtemp(root)) SKIP("mkdtemp failed");
    const uint64_t G = 1ull << 30;
    CHECK_EQ_INT(avail(), 0); /* nothing readable: unknown */
    put("proc/meminfo", "MemTotal:       33554432 kB\nMemFree:         1000 kB\nMemAvailable:   16777216 kB\n");
    CHECK_EQ_INT(avail(), 16 * G); /* no cgroup file: the system's */
    /* v2: a limit on the leaf, then a lower one on its parent */
    put("proc/self/cgroup", "0::/a/b\n");
    put("cg/a/b/memory.max", "max\n");
    put("cg/a/b/memory.current", "123\n");
    CHECK_EQ_INT(avail(), 16 * G);
    put("cg/a/b/memory.max", "8589934592\n");
    put("cg/a/b/memory.current", "1073741824\n");
    CHECK_EQ_INT(avail(), 7 * G);
    put("cg/a/memory.max", "4294967296\n");
    put("cg/a/memory.current", "3221225472\n");
    CHECK_EQ_INT(avail(), 1 * G);
    put("cg/a/memory.current", "5368709120\n"); /* over its limit: no room */
    CHECK_EQ_INT(avail(), 0);
    /* v1: the memory controller's line; "no limit" is a number near 2^63 */
    put("proc/self/cgroup", "9:name=systemd:/\n4:memory:/job/x\n3:cpu,cpuacct:/\n0::/\n");
    put("cg/memory/job/x/memory.limit_in_bytes", "9223372036854771712\n");
    put("cg/memory/job/x/memory.usage_in_bytes", "100\n");
    put("cg/memory/memory.limit_in_bytes", "9223372036854771712\n");
    CHECK_EQ_INT(avail(), 16 * G);
    put("cg/memory/job/memory.limit_in_bytes", "2147483648\n");
    put("cg/memory/job/memory.usage_in_bytes", "1073741824\n");
    CHECK_EQ_INT(avail(), 1 * G);
    put("proc/self/cgroup", "4:cpuset,memory:/job/x\n");
    CHECK_EQ_INT(avail(), 1 * G); /* memory among several controllers */
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    CHECK(system(cmd) == 0);
    /* this machine: something, never more than MemAvailable */
    CHECK(di_mem_available() > 0);
}

static void test_huge_alloc(void) {
    const size_t sizes[] = {1, 63, 64, 100, 4096, (size_t)DI_HUGE_PAGE - 1, DI_HUGE_PAGE,
                            (size_t)DI_HUGE_PAGE + 1, (size_t)5 << 20};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++) {
        uint8_t *p = di_huge_alloc(sizes[i]);
        CHECKF(p != NULL, "size %zu", sizes[i]);
        if (!p) continue;
        const uintptr_t a = sizes[i] >= DI_HUGE_PAGE ? DI_HUGE_PAGE : 64;
        CHECKF((uintptr_t)p % a == 0, "size %zu at %p", sizes[i], (void *)p);
        memset(p, 0x5a, sizes[i]); /* every byte asked for is there (ASan) */
        free(p);
    }
    CHECK(di_huge_alloc(0) == NULL);
    CHECK(di_huge_alloc(SIZE_MAX) == NULL);
}

static di_model *open_with(int in_memory, di_status *st) {
    di_model_options o;
    di_model_options_default(&o);
    o.weights_in_memory = in_memory;
    di_model *m = NULL;
    *st = di_model_open(tiny, &o, &m);
    return m;
}

/* every bound tensor of a equals b's, byte for byte; copies in a's block,
 * 64-byte aligned, when a holds one */
static void compare_models(di_model *a, di_model *b) {
    di_manifest ma, mb;
    di_err e = {0};
    CHECK(di_manifest_build(&ma, &a->cfg, &a->weights, &e) == DI_OK);
    CHECK(di_manifest_build(&mb, &b->cfg, &b->weights, &e) == DI_OK);
    CHECK_EQ_INT(ma.n, mb.n);
    size_t bound = 0, bad = 0, off_block = 0, misaligned = 0;
    const uint8_t *lo = a->weights_mem, *hi = lo ? lo + a->weights_mem_bytes : NULL;
    for (size_t i = 0; i < ma.n && i < mb.n; i++) {
        const di_tensor *x = ma.v[i].slot, *y = mb.v[i].slot;
        if (!x || !x->data) continue;
        bound++;
        if (!y->data || x->nbytes != y->nbytes || x->dtype != y->dtype || x->ndim != y->ndim ||
            memcmp(x->shape, y->shape, sizeof x->shape) || memcmp(x->data, y->data, x->nbytes))
            bad++;
        if (lo) {
            const uint8_t *p = x->data;
            if (p < lo || p + x->nbytes > hi) off_block++;
            if ((uintptr_t)p % 64) misaligned++;
        }
    }
    CHECK(bound > 100);
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(off_block, 0);
    CHECK_EQ_INT(misaligned, 0);
    di_manifest_free(&ma);
    di_manifest_free(&mb);
}

static void test_copy_equals_mapped(void) {
    if (!*tiny) SKIP("../shared/golden/v41-tiny not available");
    di_status s1, s2;
    di_model *mapped = open_with(0, &s1), *copied = open_with(1, &s2);
    CHECKF(s1 == DI_OK && s2 == DI_OK, "%s", di_last_error());
    if (!mapped || !copied) goto out;
    CHECK(mapped->weights_mem == NULL);
    CHECK(copied->weights_mem != NULL);
    CHECK_EQ_INT(copied->weights_mem_bytes, di_weights_memory_bytes(&copied->weights, &copied->cfg));
    CHECK(copied->weights_mem_bytes >= copied->weight_bytes);
    /* the mapped model's rows sit where the files put them: most of them
     * off a 64-byte line (the fixtures' data sections start 16 and 56
     * bytes past one), which is what the copy is for */
    di_manifest m;
    di_err e = {0};
    CHECK(di_manifest_build(&m, &mapped->cfg, &mapped->weights, &e) == DI_OK);
    size_t off_line = 0;
    for (size_t i = 0; i < m.n; i++)
        if (m.v[i].slot && m.v[i].slot->data && (uintptr_t)m.v[i].slot->data % 64) off_line++;
    CHECK(off_line > 100);
    di_manifest_free(&m);
    compare_models(copied, mapped);
    di_model_info ia, ib;
    CHECK(di_model_get_info(mapped, &ia) == DI_OK && di_model_get_info(copied, &ib) == DI_OK);
    CHECK_EQ_INT(ia.in_memory_bytes, 0);
    CHECK_EQ_INT(ib.in_memory_bytes, copied->weights_mem_bytes);
    CHECK_EQ_INT(ia.weight_bytes, ib.weight_bytes);
    char *d = NULL;
    CHECK(di_model_describe(copied, &d) == DI_OK);
    CHECK_STR_CONTAINS(d, "copied into memory");
    di_free(d);
out:
    di_model_close(mapped);
    di_model_close(copied);
}

static void test_auto_rule_and_env(void) {
    if (!*tiny) SKIP("../shared/golden/v41-tiny not available");
    const char *old = getenv("DI_WEIGHTS_IN_MEMORY");
    char *saved = old ? strdup(old) : NULL;
    di_status st;
    /* the tiny model takes a few MB: far under half of any machine's
     * available memory, so -1 copies */
    unsetenv("DI_WEIGHTS_IN_MEMORY");
    di_model *m = open_with(-1, &st);
    CHECKF(st == DI_OK, "%s", di_last_error());
    if (m) CHECK(m->weights_mem != NULL);
    di_model_close(m);
    setenv("DI_WEIGHTS_IN_MEMORY", "0", 1);
    m = open_with(-1, &st);
    CHECK(st == DI_OK);
    if (m) CHECK(m->weights_mem == NULL);
    di_model_close(m);
    /* the switch decides only the automatic choice */
    m = open_with(1, &st);
    CHECK(st == DI_OK);
    if (m) CHECK(m->weights_mem != NULL);
    di_model_close(m);
    setenv("DI_WEIGHTS_IN_MEMORY", "1", 1);
    m = open_with(-1, &st);
    CHECK(st == DI_OK);
    if (m) CHECK(m->weights_mem != NULL);
    di_model_close(m);
    m = open_with(0, &st);
    CHECK(st == DI_OK);
    if (m) CHECK(m->weights_mem == NULL);
    di_model_close(m);
    setenv("DI_WEIGHTS_IN_MEMORY", "yes", 1);
    m = open_with(-1, &st);
    CHECK(st == DI_ERR_INVALID_ARG && m == NULL);
    CHECK_STR_CONTAINS(di_last_error(), "DI_WEIGHTS_IN_MEMORY=\"yes\": expected 0 or 1");
    unsetenv("DI_WEIGHTS_IN_MEMORY");
    m = open_with(2, &st);
    CHECK(st == DI_ERR_INVALID_ARG && m == NULL);
    CHECK_STR_CONTAINS(di_last_error(), "weights_in_memory 2");
    if (saved) setenv("DI_WEIGHTS_IN_MEMORY", saved, 1);
    free(saved);
}

/* an engine on the CPU asks for -1: the tiny model's weights end up copied,
 * and it generates what the mapped weights give (the golden engine tests
 * check the tokens themselves) */
static void test_engine_copies(void) {
    if (!*tiny) SKIP("../shared/golden/v41-tiny not available");
    unsetenv("DI_WEIGHTS_IN_MEMORY");
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = tiny;
    o.accelerator = DI_ACCEL_CPU;
    o.n_threads = 2;
    di_engine *e = NULL;
    CHECKF(di_engine_open(&o, &e) == DI_OK, "%s", di_last_error());
    if (!e) return;
    di_engine_info info;
    CHECK(di_engine_get_info(e, &info) == DI_OK);
    CHECK(info.weights_in_memory > 0);
    di_engine_close(e);
    /* on the switch's word, mapped */
    setenv("DI_WEIGHTS_IN_MEMORY", "0", 1);
    e = NULL;
    CHECKF(di_engine_open(&o, &e) == DI_OK, "%s", di_last_error());
    if (e) {
        CHECK(di_engine_get_info(e, &info) == DI_OK);
        CHECK_EQ_INT(info.weights_in_memory, 0);
        di_engine_close(e);
    }
    unsetenv("DI_WEIGHTS_IN_MEMORY");
}

int main(void) {
    const char *shared = test_shared_dir();
    if (shared) snprintf(tiny, sizeof tiny, "%s/golden/v41-tiny", shared);
    RUN(test_huge_alloc);
    RUN(test_mem_available);
    RUN(test_copy_equals_mapped);
    RUN(test_auto_rule_and_env);
    RUN(test_engine_copies);
    return test_summary();
}
