/* A small fixed-size thread pool with one operation: a parallel for over an
 * index range (or over several jobs' ranges laid end to end, one hand-off
 * for all of them). The calling thread takes part in the work, so a pool of n
 * threads starts n-1 workers. Kernels use it to split output columns across
 * cores; the split never changes any result (see backend/cpu/kernels.h).
 *
 * The pool never prints and never exits; creation reports failures through
 * di_err. A pool may be used by one caller at a time per parallel-for (calls
 * from several threads are serialised); a callback that itself calls
 * di_threadpool_for on the same pool runs that inner loop on its own thread. */
#ifndef DI_CORE_THREADPOOL_H
#define DI_CORE_THREADPOOL_H

#include <stdint.h>

#include "core/error.h"

typedef struct di_threadpool di_threadpool;

/* Body of a parallel for: handles indices [begin, end). `thread` is in
 * [0, di_threadpool_size()) and is unique among the threads running at once
 * (0 = the calling thread), so it can index per-thread scratch. */
typedef void (*di_parallel_fn)(void *ctx, int64_t begin, int64_t end, int thread);

/* Creates a pool of n_threads threads in all (the caller counts as one);
 * n_threads == 0 means one per online core (di_cpu_count()). Fails with
 * DI_ERR_INVALID_ARG for n_threads < 0 or > 1024, DI_ERR_NOMEM / DI_ERR_INTERNAL
 * when memory or threads cannot be had. */
di_status di_threadpool_create(int n_threads, di_threadpool **out, di_err *err);
/* Joins the workers and frees the pool. NULL is accepted. */
void di_threadpool_destroy(di_threadpool *tp);
/* Threads in the pool, caller included; 1 for NULL. */
int di_threadpool_size(const di_threadpool *tp);

/* Runs fn over [0, n) in chunks of `grain` indices (grain < 1 means 1),
 * handed out dynamically, and returns when all are done. tp == NULL runs
 * everything on the calling thread as one call fn(ctx, 0, n, 0). */
void di_threadpool_for(di_threadpool *tp, int64_t n, int64_t grain, di_parallel_fn fn, void *ctx);
/* One parallel for over the indices of n jobs laid end to end: job j owns
 * [first[j], first[j + 1]) (first[0] = 0, first[n] the total) and its body
 * gets them in its own numbering, as
 * fn(ctxs + j·ctx_size, begin - first[j], end - first[j], thread); a chunk
 * that spans jobs is split at their borders. Several small loops share one
 * hand-off to the pool and one wait for its last thread this way. */
void di_threadpool_for_parts(di_threadpool *tp, int n, const int64_t *first, int64_t grain, di_parallel_fn fn,
                             void *ctxs, size_t ctx_size);

/* di_threadpool_for_parts with a stretch of the range for each thread:
 * thread i starts on the i-th of n equal stretches (cut at multiples of
 * span) and takes it from its front, span indices a chunk; a thread whose
 * stretch is done takes chunks from the end of the one with the most
 * left. Where fewer than two spans are left in a stretch its chunks get
 * shorter (span/2, span/4, .. never below least) so the threads finish
 * together. For bodies that read memory in long runs: each thread's chunks
 * follow one another in memory and the threads' streams lie far apart (on
 * the 2-vCPU Xeon VM two threads reading an MXFP4 expert's rows from DRAM
 * ran 4-9 % faster than with chunks dealt in turn from one cursor,
 * bench/RESULTS.md 2026-12-05). Which thread takes which chunk varies from
 * call to call, as with di_threadpool_for; one thread (tp NULL or a pool
 * of one) runs each job's whole range in one call. */
void di_threadpool_for_stretches(di_threadpool *tp, int n, const int64_t *first, int64_t span, int64_t least,
                                 di_parallel_fn fn, void *ctxs, size_t ctx_size);

#endif
