/* The bound weights copied into one block of memory (weights_memory.h). */
#include "model/weights_memory.h"

#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "core/cpu_features.h"
#include "core/huge_alloc.h"
#include "core/threadpool.h"
#include "model/manifest.h"

enum { COPY_ALIGN = 64, COPY_MAX_THREADS = 8 };
#define COPY_CHUNK ((size_t)16 << 20)

static uint64_t round_up(uint64_t n) { return (n + COPY_ALIGN - 1) / COPY_ALIGN * COPY_ALIGN; }

/* A piece of one tensor's copy: chunks of COPY_CHUNK bytes, the tensors in
 * the manifest's order, handed to the threads in turn, each asking the
 * kernel for the one `ahead` places further on (MADV_WILLNEED: its pages
 * come from the disk while this one is copied, as di_checkpoint_read_all
 * does). */
typedef struct copy_chunk {
    const uint8_t *src;
    uint8_t *dst;
    size_t len;
} copy_chunk;

typedef struct copy_job {
    const copy_chunk *chunks;
    int64_t n, ahead;
} copy_job;

static void will_need(const void *p, size_t len) {
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t lo = (uintptr_t)p & ~(page - 1);
    (void)madvise((void *)lo, (uintptr_t)p + len - lo, MADV_WILLNEED); /* a hint: failure is harmless */
}

static void copy_chunks(void *ctx, int64_t begin, int64_t end, int thread) {
    (void)thread;
    const copy_job *j = ctx;
    for (int64_t i = begin; i < end; i++) {
        if (i + j->ahead < j->n) will_need(j->chunks[i + j->ahead].src, j->chunks[i + j->ahead].len);
        memcpy(j->chunks[i].dst, j->chunks[i].src, j->chunks[i].len);
    }
}

uint64_t di_weights_memory_bytes(di_weights *w, const di_config *cfg) {
    di_manifest man;
    if (di_manifest_build(&man, cfg, w, NULL)) return 0;
    uint64_t total = 0;
    for (size_t i = 0; i < man.n; i++)
        if (man.v[i].slot && man.v[i].slot->data) total += round_up(man.v[i].slot->nbytes);
    di_manifest_free(&man);
    return total;
}

di_status di_weights_copy_to_memory(di_weights *w, const di_config *cfg, int n_threads, void **block, size_t *bytes,
                                    di_err *err) {
    *block = NULL;
    *bytes = 0;
    if (n_threads < 0) return di_err_set(err, DI_ERR_INVALID_ARG, "weights copy: %d threads", n_threads);
    di_manifest man;
    di_status st = di_manifest_build(&man, cfg, w, err);
    if (st) return st;
    uint64_t total = 0, n_chunks = 0;
    for (size_t i = 0; i < man.n; i++) {
        const di_tensor *t = man.v[i].slot;
        if (!t || !t->data) continue;
        total += round_up(t->nbytes);
        n_chunks += (t->nbytes + COPY_CHUNK - 1) / COPY_CHUNK;
    }
    if (total == 0) {
        di_manifest_free(&man);
        return DI_OK;
    }
    uint8_t *base = total <= SIZE_MAX ? di_huge_alloc((size_t)total) : NULL;
    copy_chunk *chunks = base ? calloc((size_t)n_chunks, sizeof *chunks) : NULL;
    if (!chunks) {
        free(base);
        di_manifest_free(&man);
        return di_err_set(err, DI_ERR_NOMEM, "cannot allocate %.2f GB to hold the weights in memory",
                          (double)total / 1e9);
    }
    /* the tensors in manifest order, each on a 64-byte boundary */
    int64_t n = 0;
    uint64_t off = 0;
    for (size_t i = 0; i < man.n; i++) {
        const di_tensor *t = man.v[i].slot;
        if (!t || !t->data) continue;
        for (size_t o = 0; o < t->nbytes; o += COPY_CHUNK)
            chunks[n++] = (copy_chunk){(const uint8_t *)t->data + o, base + off + o,
                                       t->nbytes - o < COPY_CHUNK ? t->nbytes - o : COPY_CHUNK};
        off += round_up(t->nbytes);
    }
    if (n_threads == 0) n_threads = di_cpu_count();
    if (n_threads > COPY_MAX_THREADS) n_threads = COPY_MAX_THREADS;
    if (n_threads < 1) n_threads = 1;
    di_threadpool *tp = NULL;
    /* without threads (creation failed) the copy still runs, on this thread */
    if (n_threads > 1 && n > 1) {
        di_err ignored = {0};
        if (di_threadpool_create(n_threads, &tp, &ignored)) tp = NULL;
    }
    copy_job job = {chunks, n, n_threads};
    for (int64_t i = 0; i < job.ahead && i < n; i++) will_need(chunks[i].src, chunks[i].len);
    di_threadpool_for(tp, n, 1, copy_chunks, &job);
    di_threadpool_destroy(tp);
    /* every copy is done: the views move (in the same order as the layout) */
    off = 0;
    for (size_t i = 0; i < man.n; i++) {
        di_tensor *t = man.v[i].slot;
        if (!t || !t->data) continue;
        t->data = base + off;
        off += round_up(t->nbytes);
    }
    free(chunks);
    di_manifest_free(&man);
    *block = base;
    *bytes = (size_t)total;
    return DI_OK;
}
