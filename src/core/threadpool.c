/* Fixed-size pthread pool with a dynamic-chunk parallel for (threadpool.h).
 *
 * Workers sleep on a condition variable between jobs; each job bumps a
 * generation counter. Work is handed out in chunks from an atomic cursor, so
 * a core slowed by other processes simply takes fewer chunks. Workers spin
 * before sleeping because decode issues many short jobs back to back and a
 * futex wake-up costs more than one of them; and since a job returns only
 * when every worker has checked in, one worker that fell asleep makes the
 * whole job wait for its wake-up (tens of microseconds in a VM, paid by
 * every job of a many-core pool). The spin is therefore measured in time,
 * not in iterations: `pause` takes ~10 cycles on some cores and ~140 on
 * others, so a count of them spun anywhere from 20 us to 0.3 ms. */
#include "core/threadpool.h"

#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <time.h>

#include "core/cpu_features.h"

/* How long a worker waits for the next job, and the caller for the last
 * workers, spinning before they sleep. A forward's jobs follow each other
 * within microseconds; between decode steps the host's own work takes
 * tenths of a millisecond. */
#define SPIN_NS 2000000
#define SPIN_CHECK 32 /* pauses between two reads of the clock */
/* After this long a spinning thread yields its core at every check: where
 * the pool has more threads than free cores, the thread holding the work
 * then gets the core at once instead of after the spinner's time slice. */
#define SPIN_YIELD_NS 50000

typedef struct worker {
    di_threadpool *tp;
    int index; /* 1 .. n-1 (0 is the caller) */
} worker;

struct di_threadpool {
    int n;                 /* threads in all, caller included */
    pthread_t *threads;    /* [n-1] */
    worker *workers;       /* [n-1] */
    int started;           /* workers actually running */
    pthread_mutex_t run;   /* one parallel-for at a time */
    pthread_mutex_t mu;    /* guards stop and the sleeps below */
    pthread_cond_t wake;   /* a new generation or stop */
    pthread_cond_t done;   /* pending reached 0 */
    atomic_ulong gen;
    atomic_int stop;
    atomic_int pending;    /* workers still inside the current job */
    /* the current job */
    di_parallel_fn fn;
    void *ctx;
    int64_t n_items, grain;
    atomic_llong next;
    /* stretched jobs (di_threadpool_for_stretches): thread i's stretch as
     * front << 32 | end, its owner taking chunks from the front and the
     * others, once their own is done, from the end */
    int stretched;
    int64_t span, least;
    atomic_ullong *stretch; /* [n] */
};

/* The pool this thread is executing a job for, and its index in it: lets a
 * nested call on the same pool run inline instead of deadlocking. */
static _Thread_local di_threadpool *tl_pool;
static _Thread_local int tl_index;

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Every SPIN_CHECK pauses of a spin that started at t0: whether to give up
 * (past SPIN_NS), yielding the core on the way once past SPIN_YIELD_NS. */
static int spin_expired(uint64_t t0) {
    const uint64_t dt = now_ns() - t0;
    if (dt > SPIN_YIELD_NS) sched_yield();
    return dt > SPIN_NS;
}

/* Items left in stretch i. */
static int64_t stretch_left(di_threadpool *tp, int i) {
    const unsigned long long v = atomic_load_explicit(&tp->stretch[i], memory_order_relaxed);
    return (int64_t)(v & 0xffffffffu) - (int64_t)(v >> 32);
}

/* Claims a chunk of stretch i into [*b, *e): from its front (own) or its
 * end; 0 when the stretch is done. The chunk is `span` items, or where
 * fewer than two spans are left the largest of span/2, span/4, .. least of
 * which two are left (or what is left): the threads' last chunks get
 * short, so they finish together. */
static int stretch_claim(di_threadpool *tp, int i, int own, int64_t *b, int64_t *e) {
    unsigned long long v = atomic_load_explicit(&tp->stretch[i], memory_order_relaxed);
    for (;;) {
        const int64_t f = (int64_t)(v >> 32), end = (int64_t)(v & 0xffffffffu), left = end - f;
        if (left <= 0) return 0;
        int64_t size = tp->span;
        while (size > tp->least && left < 2 * size) size = size / 2 > tp->least ? size / 2 : tp->least;
        if (size > left) size = left;
        const unsigned long long nv = own ? v + ((unsigned long long)size << 32) : v - (unsigned long long)size;
        if (atomic_compare_exchange_weak_explicit(&tp->stretch[i], &v, nv, memory_order_relaxed,
                                                  memory_order_relaxed)) {
            *b = own ? f : end - size;
            *e = *b + size;
            return 1;
        }
    }
}

/* Thread index's chunks of a stretched job: its own stretch, then the ends
 * of whichever has the most left. */
static void run_stretches(di_threadpool *tp, int index) {
    for (;;) {
        int64_t b, e;
        if (!stretch_claim(tp, index, 1, &b, &e)) {
            int most = -1;
            int64_t left = 0;
            for (int i = 0; i < tp->n; i++) {
                const int64_t l = stretch_left(tp, i);
                if (l > left) left = l, most = i;
            }
            if (most < 0) return;
            if (!stretch_claim(tp, most, 0, &b, &e)) continue;
        }
        tp->fn(tp->ctx, b, e, index);
    }
}

static void run_chunks(di_threadpool *tp, int index) {
    di_threadpool *outer = tl_pool;
    int outer_index = tl_index;
    tl_pool = tp;
    tl_index = index;
    if (tp->stretched) run_stretches(tp, index);
    else for (;;) {
        int64_t b = atomic_fetch_add_explicit(&tp->next, tp->grain, memory_order_relaxed);
        if (b >= tp->n_items) break;
        int64_t e = b + tp->grain < tp->n_items ? b + tp->grain : tp->n_items;
        tp->fn(tp->ctx, b, e, index);
    }
    tl_pool = outer;
    tl_index = outer_index;
}

/* Spins while the generation is `until` (and the pool is not stopping),
 * for at most SPIN_NS; returns the last generation read. */
static unsigned long spin_while_gen(di_threadpool *tp, unsigned long until) {
    unsigned long g = atomic_load_explicit(&tp->gen, memory_order_acquire);
    if (g != until) return g;
    const uint64_t t0 = now_ns();
    for (int i = 1; g == until && !atomic_load_explicit(&tp->stop, memory_order_relaxed); i++) {
        cpu_relax();
        g = atomic_load_explicit(&tp->gen, memory_order_acquire);
        if (i % SPIN_CHECK == 0 && spin_expired(t0)) break;
    }
    return g;
}

static void *worker_main(void *arg) {
    worker *w = arg;
    di_threadpool *tp = w->tp;
    unsigned long seen = 0;
    for (;;) {
        unsigned long g = spin_while_gen(tp, seen);
        if (g == seen) {
            pthread_mutex_lock(&tp->mu);
            while ((g = atomic_load(&tp->gen)) == seen && !atomic_load(&tp->stop))
                pthread_cond_wait(&tp->wake, &tp->mu);
            pthread_mutex_unlock(&tp->mu);
        }
        if (atomic_load(&tp->stop)) return NULL;
        seen = g;
        run_chunks(tp, w->index);
        if (atomic_fetch_sub_explicit(&tp->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&tp->mu);
            pthread_cond_signal(&tp->done);
            pthread_mutex_unlock(&tp->mu);
        }
    }
}

di_status di_threadpool_create(int n_threads, di_threadpool **out, di_err *err) {
    *out = NULL;
    if (n_threads < 0 || n_threads > 1024)
        return di_err_set(err, DI_ERR_INVALID_ARG,
                          "thread count %d out of range (0 = one per core, or 1..1024)", n_threads);
    if (n_threads == 0) n_threads = di_cpu_count();
    di_threadpool *tp = calloc(1, sizeof *tp);
    if (!tp) return di_err_set(err, DI_ERR_NOMEM, "thread pool: out of memory");
    tp->n = n_threads;
    pthread_mutex_init(&tp->run, NULL);
    pthread_mutex_init(&tp->mu, NULL);
    pthread_cond_init(&tp->wake, NULL);
    pthread_cond_init(&tp->done, NULL);
    if (n_threads > 1) {
        tp->threads = calloc((size_t)n_threads - 1, sizeof *tp->threads);
        tp->workers = calloc((size_t)n_threads - 1, sizeof *tp->workers);
        tp->stretch = calloc((size_t)n_threads, sizeof *tp->stretch);
        if (!tp->threads || !tp->workers || !tp->stretch) {
            di_threadpool_destroy(tp);
            return di_err_set(err, DI_ERR_NOMEM, "thread pool of %d threads: out of memory",
                              n_threads);
        }
        for (int i = 0; i < n_threads - 1; i++) {
            tp->workers[i].tp = tp;
            tp->workers[i].index = i + 1;
            int rc = pthread_create(&tp->threads[i], NULL, worker_main, &tp->workers[i]);
            if (rc != 0) {
                di_threadpool_destroy(tp);
                return di_err_set(err, DI_ERR_INTERNAL,
                                  "thread pool: could not start thread %d of %d (error %d)", i + 1,
                                  n_threads, rc);
            }
            tp->started++;
        }
    }
    *out = tp;
    return DI_OK;
}

void di_threadpool_destroy(di_threadpool *tp) {
    if (!tp) return;
    pthread_mutex_lock(&tp->mu);
    atomic_store(&tp->stop, 1);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);
    for (int i = 0; i < tp->started; i++) pthread_join(tp->threads[i], NULL);
    pthread_cond_destroy(&tp->done);
    pthread_cond_destroy(&tp->wake);
    pthread_mutex_destroy(&tp->mu);
    pthread_mutex_destroy(&tp->run);
    free(tp->stretch);
    free(tp->workers);
    free(tp->threads);
    free(tp);
}

int di_threadpool_size(const di_threadpool *tp) { return tp ? tp->n : 1; }

/* di_threadpool_for, or with span > 0 stretched (di_threadpool_for_stretches) */
static void pool_for(di_threadpool *tp, int64_t n, int64_t grain, int64_t span, int64_t least, di_parallel_fn fn,
                     void *ctx) {
    if (n <= 0) return;
    if (grain < 1) grain = 1;
    if (!tp) {
        fn(ctx, 0, n, 0);
        return;
    }
    if (tl_pool == tp) { /* nested call from one of our own jobs */
        fn(ctx, 0, n, tl_index);
        return;
    }
    pthread_mutex_lock(&tp->run);
    if (tp->started == 0 || (span ? n <= least : n <= grain)) {
        fn(ctx, 0, n, 0);
        pthread_mutex_unlock(&tp->run);
        return;
    }
    tp->fn = fn;
    tp->ctx = ctx;
    tp->n_items = n;
    tp->grain = grain;
    tp->stretched = span > 0;
    tp->span = span;
    tp->least = least;
    if (span) /* thread i's stretch: the i-th n-th of the range, cut at multiples of span */
        for (int i = 0; i < tp->n; i++) {
            const int64_t lo = i ? n * i / tp->n / span * span : 0;
            const int64_t hi = i + 1 < tp->n ? n * (i + 1) / tp->n / span * span : n;
            atomic_store_explicit(&tp->stretch[i], (unsigned long long)lo << 32 | (unsigned long long)hi,
                                  memory_order_relaxed);
        }
    atomic_store_explicit(&tp->next, 0, memory_order_relaxed);
    atomic_store_explicit(&tp->pending, tp->started, memory_order_relaxed);
    pthread_mutex_lock(&tp->mu);
    atomic_fetch_add_explicit(&tp->gen, 1, memory_order_release);
    pthread_cond_broadcast(&tp->wake);
    pthread_mutex_unlock(&tp->mu);

    run_chunks(tp, 0);

    if (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        const uint64_t t0 = now_ns();
        for (int i = 1; atomic_load_explicit(&tp->pending, memory_order_acquire) > 0; i++) {
            cpu_relax();
            if (i % SPIN_CHECK == 0 && spin_expired(t0)) break;
        }
    }
    if (atomic_load_explicit(&tp->pending, memory_order_acquire) > 0) {
        pthread_mutex_lock(&tp->mu);
        while (atomic_load(&tp->pending) > 0) pthread_cond_wait(&tp->done, &tp->mu);
        pthread_mutex_unlock(&tp->mu);
    }
    pthread_mutex_unlock(&tp->run);
}

void di_threadpool_for(di_threadpool *tp, int64_t n, int64_t grain, di_parallel_fn fn, void *ctx) {
    pool_for(tp, n, grain, 0, 0, fn, ctx);
}

/* di_threadpool_for_parts: the jobs' ranges, and the chunk's split by job */
typedef struct parts_ctx {
    int n;
    const int64_t *first;
    di_parallel_fn fn;
    char *ctxs;
    size_t ctx_size;
} parts_ctx;

static void parts_body(void *ctx, int64_t begin, int64_t end, int thread) {
    const parts_ctx *c = ctx;
    int j = 0;
    while (begin < end) {
        while (j < c->n - 1 && c->first[j + 1] <= begin) j++;
        const int64_t stop = end < c->first[j + 1] ? end : c->first[j + 1];
        c->fn(c->ctxs + (size_t)j * c->ctx_size, begin - c->first[j], stop - c->first[j], thread);
        begin = stop;
    }
}

void di_threadpool_for_parts(di_threadpool *tp, int n, const int64_t *first, int64_t grain, di_parallel_fn fn,
                             void *ctxs, size_t ctx_size) {
    if (n <= 0 || first[n] <= 0) return;
    parts_ctx c = {n, first, fn, (char *)ctxs, ctx_size};
    di_threadpool_for(tp, first[n], grain, parts_body, &c);
}

void di_threadpool_for_stretches(di_threadpool *tp, int n, const int64_t *first, int64_t span, int64_t least,
                                 di_parallel_fn fn, void *ctxs, size_t ctx_size) {
    if (n <= 0 || first[n] <= 0) return;
    if (least < 1) least = 1;
    if (span < least) span = least;
    parts_ctx c = {n, first, fn, (char *)ctxs, ctx_size};
    /* the stretches' bounds travel in 32 bits; a longer range (never a
     * kernel's) takes plain chunks of span */
    pool_for(tp, first[n], span, first[n] < ((int64_t)1 << 31) ? span : 0, least, parts_body, &c);
}
