/* CUDA backend: the op table of backend.h on one device (architecture.md
 * §2–§10; the CPU backend, backend_cpu.c, is the reference semantics of
 * every op, rounding points included).
 *
 * Memory. Every kernel and copy runs on the default stream, so the copy
 * that uploads the next call's metadata or downloads a result is ordered
 * after the kernels before it, and scratch buffers can be reused from call
 * to call without events (one exception, joined back by an event before
 * its buffers are touched: hc_mix at decode, "hc_mix on a second stream"). Uploads (the model's and each op's metadata:
 * positions, ids, row-pointer tables) go through a pinned staging buffer
 * as asynchronous copies, so the host does not wait for the device until
 * it downloads a result. alloc / free go through a pool: a freed buffer is
 * kept by size class and handed out again (zeroed by an asynchronous
 * memset), because cudaMalloc costs tens of microseconds and cudaFree waits
 * for the whole device, and the forward allocates its activations afresh
 * for every block of every pass. The pool gives its memory back to the
 * device only when an allocation fails, and at destroy.
 *
 * Copies. The model copies rows one at a time (the embedding's mHC copies,
 * the compressor's groups; with the host forms also the window rings and
 * the compressor state, which otherwise go through scatter_rows_to). copy only queues them; the queue
 * runs as one kernel (one thread block per copy) before the next op of any
 * other kind, or earlier when a new copy touches memory a queued one reads
 * or writes, so the order the model asked for is kept.
 *
 * Weights. The model hands weights over as host pointers into the
 * checkpoint mapping (di_wmat.w / .s, di_tensor.data). Each one is uploaded
 * the first time an op reads it, in its checkpoint format (FP8 + E8M0,
 * packed MXFP4 + E8M0, BF16, F32: never dequantized), and kept in a table
 * keyed by host address and size for the backend's lifetime. A pointer that
 * already is device memory (a backend buffer) is used as it is. This is the
 * simplest correct scheme until the model gets an explicit "load weights to
 * the device" step; di_backend_cuda_weights_drop forgets the copies (the
 * stacked experts of the MoE layers included).
 *
 * Engram tables (≈100 GB each at real size) never go to the device: the
 * FP8 rows and scales a call needs are gathered on the host and only those
 * are uploaded, then dequantized by a kernel.
 *
 * Host results. topk_select and candidate_blocks select on the device
 * (cuda_ops_select.cu, the CPU's semantics bit for bit) and download only
 * the indices. The table also has backend.h's backend-memory forms
 * (selections, candidate blocks and attention row tables stay on the
 * device; the forward then reads nothing back until the logits) and step
 * forms (RoPE tables, ids, the head's rows, Engram rows, the ring and cache
 * writes and the compressor's group reads from the forward's step metadata:
 * a decode step uploads once and queues no per-call host array), which the
 * forward takes; DI_CUDA_DEVICE_SELECT=0 leaves them out (the host forms,
 * the same bits: for comparisons). moe_route (host results) downloads its
 * logits and runs the CPU backend's op.
 *
 * MoE. moe_route_buf routes into device arrays (cuda_ops_moe.cu, the CPU's
 * router arithmetic bit for bit) and moe_experts runs a layer's routed
 * experts as grouped products in a fixed number of launches, on one
 * stacked device copy of the layer's experts (moe_stack: built on first
 * use, keyed by the host addresses of every expert's matrices, counted in
 * the weight bytes; the weight table's entries of those matrices point
 * into it, so an expert is never on the device twice). Layers the grouped
 * kernels do not take (other formats, bf16 numerics) run the per-expert
 * loop inside the op. DI_CUDA_MOE_GROUPED=0 leaves both ops out (the
 * model's loop with host routing), for comparisons.
 *
 * Step graphs. With DI_CUDA_GRAPH=1 decode steps are recorded per step key
 * by stream capture and replayed with new metadata (backend.h's graph ops;
 * "step graphs" below); it needs the kernels built with nvcc
 * --default-stream per-thread, else every step runs eagerly.
 *
 * Errors. Ops return nothing (backend.h); the first failure is kept, with
 * the op's name in front of the message, and reported by the `status` op
 * (di_backend_cuda_status).
 *
 * Profile. With DI_CUDA_PROFILE=1 in the environment every op waits for the
 * device on entry, and the time from one op's entry to the next op's entry
 * is charged to the first (host work of the model between two ops included),
 * so a pass splits into per-op times (di_backend_cuda_profile). */
#ifdef DI_HAVE_CUDA

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cuda/cuda_backend.h"
#include "backend/cuda/cuda_ops.h"
#include "backend/cuda/cuda_ops_moe.h"
#include "backend/cuda/cuda_ops_select.h"
#include "backend/cuda/cuda_ops_step.h"
#include "backend/cuda/cuda_graph.h"
#include "backend/rope_angles.h"
#include "core/cpu_features.h"
#include "core/threadpool.h"

enum { SCR_A, SCR_B, SCR_C, SCR_D, N_SCRATCH };

/* A buffer of the pool: live (handed out) or free (kept for reuse). */
typedef struct pblock {
    void *p;
    size_t cap; /* bytes of its size class */
} pblock;

enum { PROF_MAX = 48, PROF_EVENTS = 8192 };

typedef struct prof_entry {
    const char *op;
    double s;
    long calls;
} prof_entry;

typedef struct wentry {
    const void *host; /* NULL = empty slot */
    size_t bytes;
    void *dev;
    int view;         /* dev lies in a stacked MoE layer (moe_stack), freed with it */
} wentry;

typedef struct moe_stack moe_stack;

typedef struct cuda_impl {
    di_backend_ops ops; /* this backend's table: cuda_ops less what the environment turns off */
    int device;
    di_status status; /* first failure of any op */
    di_err err;
    wentry *wtab; /* open addressing, cap a power of two */
    size_t wcap, wcount, wbytes;
    moe_stack *stacks; /* [n_stacks] stacked routed experts, one per MoE layer */
    int n_stacks, cap_stacks;
    /* decode step graphs (DI_CUDA_GRAPH=1) */
    struct gentry *graphs; /* [n_graphs] */
    int n_graphs, cap_graphs;
    struct gentry *rec;    /* the recording in progress, or NULL */
    di_status cap_st;      /* first failure while recording (not the backend's) */
    di_err cap_err;
    long gen;              /* bumped when a buffer a recording may use moves */
    long n_recorded, n_replayed, n_failed;
    int no_capture;        /* this build cannot capture (legacy default stream) */
    void *scr[N_SCRATCH]; /* device scratch, grown on demand */
    size_t scr_cap[N_SCRATCH];
    void *host_buf; /* host staging (downloads, Engram rows) */
    size_t host_cap;
    di_backend *cpu; /* runs the host-result ops on downloaded inputs */
    cuda_stage *stage; /* pinned staging of metadata uploads */
    cuda_pinned *pinned;  /* pinned buffer of the big row uploads (Engram at prefill) */
    di_threadpool *gather_pool; /* host threads of those gathers, made at the first */
    int gather_pool_failed;
    const char *op;  /* the op running now (error messages, profile) */
    /* pool: live blocks (open addressing by pointer) and free blocks */
    int use_pool;
    int batch_invariant; /* set_batch_invariant: no kernel chosen by the number of rows */
    void *blas;          /* cuBLAS handle of the bf16-input products (cu_matmul), made at the first */
    int alloc_raw;               /* cu_alloc hands the block out without its zero fill */
    pblock *live;
    size_t live_cap, live_count;
    pblock *freel;
    size_t free_count, free_cap;
    size_t pool_bytes;           /* bytes held by the pool, live or free */
    void *zero_src;              /* [POOL_ZERO_SRC] zero bytes, the source of queued fills */
    long n_malloc;               /* cudaMalloc calls made for buffers */
    /* queued copies */
    cuda_copy_batch *cq;         /* cq->n queued */
    const char *qd_lo, *qd_hi;   /* while cq->n > 0: every queued destination lies in [qd_lo, qd_hi) */
    const char *qs_lo, *qs_hi;   /* and every queued source in [qs_lo, qs_hi) */
    long n_copy_batches, n_copies;
    /* hc_mix on a second stream (see "hc_mix on a second stream"): the
     * stream, its fork and join events, whether its work is not yet joined,
     * the calls so far, and the buffers that work reads or writes ([lo, hi)
     * each: s, pre, post, comb) */
    void *side, *side_fork, *side_join;
    int side_pending;
    long n_side;
    const char *side_lo[4], *side_hi[4];
    /* profile: 0 off, 1 drained per op, 2 events per op (DI_CUDA_PROFILE=events) */
    int prof;
    int prof_events;                /* profile_start picks the event form */
    di_cuda_timeline *tl;           /* the event form's events */
    const char **tl_op;             /* [PROF_EVENTS] the op whose entry each event marks */
    double ev_dev, ev_host;         /* the last read-back: device and host time of the pass */
    int ev_n;                       /* and its events */
    double prof_t;
    const char *prof_op;
    prof_entry prof_tab[PROF_MAX];
    int prof_n;
} cuda_impl;

static cuda_impl *IM(di_backend *be) { return be->impl; }

static void note(di_backend *be, di_status st, const di_err *err) {
    cuda_impl *c = IM(be);
    if (st && c->rec) { /* recording: the step will be run again without */
        if (!c->cap_st) {
            c->cap_st = st;
            c->cap_err = *err;
        }
        return;
    }
    if (st && !c->status) {
        c->status = st;
        c->err = *err;
        if (c->op) di_err_prefix(&c->err, "cuda backend, %s: ", c->op);
    }
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* ------------------------------------------------------------ op entry */

static void copies_flush(di_backend *be);
static const char OP_COPY[] = "copy";

/* Every op starts here: queued copies run first (unless this is one more
 * copy), the op's name is recorded for error messages, and in profile mode
 * the device is drained and the time since the last op's entry charged to
 * that op. */
static void prof_charge(cuda_impl *c, const char *op, double s) {
    int i = 0;
    while (i < c->prof_n && c->prof_tab[i].op != op) i++;
    if (i == c->prof_n && i < PROF_MAX) c->prof_tab[c->prof_n++] = (prof_entry){op, 0, 0};
    if (i < c->prof_n) {
        c->prof_tab[i].s += s;
        c->prof_tab[i].calls++;
    }
}

/* The event form's read-back: waits for the recorded events, charges the
 * time between consecutive ones to the op of the first, and empties the
 * timeline; returns the op of the last event (its time runs on), or NULL. */
static const char *prof_events_charge(di_backend *be) {
    cuda_impl *c = IM(be);
    int n = 0;
    while (n < PROF_EVENTS && c->tl_op[n]) n++;
    if (!n) return NULL;
    const char *last = c->tl_op[n - 1];
    float *ms = calloc((size_t)n, sizeof *ms);
    di_err err = {0};
    di_status st = ms ? di_cuda_timeline_read(c->tl, ms, &err) : DI_ERR_NOMEM;
    if (ms) note(be, st, &err);
    for (int i = 0; !st && i + 1 < n; i++) {
        prof_charge(c, c->tl_op[i], 1e-3 * ms[i]);
        c->ev_dev += 1e-3 * ms[i];
    }
    c->ev_n += n - 1;
    free(ms);
    di_cuda_timeline_reset(c->tl);
    memset(c->tl_op, 0, PROF_EVENTS * sizeof *c->tl_op);
    return last;
}

/* The event form: an event in stream order, labelled with the op whose
 * work follows it. A full timeline is read back first (the one wait of
 * the form: the time from the last op's event to the wait is lost, its
 * call still counted). */
static void prof_event(di_backend *be, const char *op) {
    cuda_impl *c = IM(be);
    if (!c->tl) return;
    if (!c->ev_n && c->tl_op[0] == NULL) c->prof_t = now_s(); /* host time of the pass's first op */
    int i = di_cuda_timeline_mark(c->tl);
    if (i < 0) {
        const char *last = prof_events_charge(be);
        if (last && (i = di_cuda_timeline_mark(c->tl)) >= 0) c->tl_op[i] = last;
        i = di_cuda_timeline_mark(c->tl);
    }
    if (i >= 0) c->tl_op[i] = op;
}

static const char OP_QUEUE[] = "(copy queue)";

/* ---- hc_mix on a second stream ----
 * In a single-pass mHC site (model/mhc.c) hc_mix's outputs (the next
 * site's pre, this site's post and comb) are first read by hc_expand at
 * the end of the sublayer, and the collapse beside it takes the previous
 * site's pre: at a decode step hc_mix (a product over 2 MB of fn, one
 * block's reduction and the Sinkhorn iterations, ~13 µs at one row) need
 * not hold up the sublayer. The backend runs its split form on a second
 * stream, forked from the main one, and joins it (the main stream waits
 * for its event) before any op other than the first ones of a sublayer
 * (side_may_run), before any of those that touches the buffers hc_mix
 * reads or writes (side_touch), and before such a buffer is freed, a
 * recording ends or the backend is destroyed. The kernels are the main
 * stream's (the same bits).
 * Rows up to which hc_mix takes the second stream: measured (run 69,
 * docs/gpu-notes.md, eager steps of the dummy 6-layer model): batch 1
 * −29 / −62 µs a step, batch 8 within the spread, batch 64 +0.1 ms (its
 * product's 8,192 blocks then compete with the sublayer's); in recorded
 * steps (graphs) +0.1–0.15 ms at batches 1 and 8, so a recording keeps
 * hc_mix on the main stream. */
enum { SIDE_ROWS = 8 };

static void side_join(di_backend *be) {
    cuda_impl *c = IM(be);
    if (!c->side_pending) return;
    c->side_pending = 0;
    di_err err = {0};
    note(be, cuda_side_join(c->side_join, &err), &err);
}

/* Ops that may run while hc_mix's work is pending, their buffers checked
 * by side_touch: the sublayer's first ones (the collapse and norm, the
 * first products and norms). Any other op joins first. */
static int side_may_run(const char *op) {
    return !strncmp(op, "matmul (", 8) || !strcmp(op, "rmsnorm") || !strcmp(op, "hc_collapse_norm");
}

/* Joins when p lies in a buffer the pending hc_mix reads or writes. */
static void side_touch(di_backend *be, const void *p) {
    cuda_impl *c = IM(be);
    if (!c->side_pending || !p) return;
    for (int i = 0; i < 4; i++)
        if ((const char *)p >= c->side_lo[i] && (const char *)p < c->side_hi[i]) {
            side_join(be);
            return;
        }
}

static void op_enter(di_backend *be, const char *op) {
    cuda_impl *c = IM(be);
    if (c->side_pending && !side_may_run(op)) side_join(be);
    int flush = c->cq->n && op != OP_COPY;
    if (c->prof == 2) prof_event(be, flush ? OP_QUEUE : op);
    if (flush) {
        copies_flush(be);
        if (c->prof == 2) prof_event(be, op);
    }
    c->op = op;
    di_cuda_set_batch_invariant(c->batch_invariant);
    if (c->prof != 1) return;
    di_err err = {0};
    note(be, di_cuda_synchronize(&err), &err);
    double t = now_s();
    if (c->prof_op) prof_charge(c, c->prof_op, t - c->prof_t);
    c->prof_op = op;
    c->prof_t = t;
}

/* ------------------------------------------------------------ scratch */

static void *scratch(di_backend *be, int slot, size_t bytes) {
    cuda_impl *c = IM(be);
    if (bytes == 0) bytes = 16;
    if (c->scr_cap[slot] < bytes) {
        di_cuda_free(c->scr[slot]);
        c->scr[slot] = NULL;
        c->scr_cap[slot] = 0;
        c->gen++; /* recordings that read the old slot are stale */
        size_t cap = bytes + bytes / 2;
        di_err err = {0};
        di_status st = di_cuda_alloc(&c->scr[slot], cap, &err);
        if (st) {
            note(be, st, &err);
            return NULL;
        }
        c->scr_cap[slot] = cap;
    }
    return c->scr[slot];
}

/* Uploads a host array into scratch slot `slot` without waiting for the
 * device (through the pinned staging buffer); NULL on failure. The copy is
 * queued after the kernels that still read the slot's last contents. */
static void *scratch_up(di_backend *be, int slot, const void *host, size_t bytes) {
    if (IM(be)->rec) { /* a replay would copy whatever staging then holds */
        di_err err = {0};
        note(be, di_err_set(&err, DI_ERR_UNSUPPORTED, "a staged upload in a recorded step"), &err);
        return NULL;
    }
    void *d = scratch(be, slot, bytes);
    if (!d) return NULL;
    di_err err = {0};
    di_status st = bytes ? cuda_stage_upload(IM(be)->stage, d, host, bytes, &err) : DI_OK;
    if (st) {
        note(be, st, &err);
        return NULL;
    }
    return d;
}

static void *host_buf(di_backend *be, size_t bytes) {
    cuda_impl *c = IM(be);
    if (c->host_cap < bytes) {
        free(c->host_buf);
        c->host_cap = 0;
        c->host_buf = malloc(bytes);
        if (!c->host_buf) {
            di_err err = {0};
            note(be, di_err_set(&err, DI_ERR_NOMEM, "cuda backend: %zu bytes of host staging", bytes),
                 &err);
            return NULL;
        }
        c->host_cap = bytes;
    }
    return c->host_buf;
}

/* ------------------------------------------------------------ weights */

static size_t wslot(const cuda_impl *c, const void *p) {
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 17;
    h *= (uintptr_t)0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 7) & (c->wcap - 1);
}

static int wgrow(cuda_impl *c) {
    size_t ncap = c->wcap ? c->wcap * 2 : 256;
    wentry *nt = calloc(ncap, sizeof *nt), *old = c->wtab;
    if (!nt) return -1;
    size_t ocap = c->wcap;
    c->wtab = nt;
    c->wcap = ncap;
    for (size_t i = 0; i < ocap; i++)
        if (old[i].host) {
            size_t s = wslot(c, old[i].host);
            while (nt[s].host) s = (s + 1) & (ncap - 1);
            nt[s] = old[i];
        }
    free(old);
    return 0;
}

/* Room for one more entry; -1 when the table cannot grow. */
static int wreserve(cuda_impl *c) {
    return (c->wcount + 1) * 2 > c->wcap && wgrow(c) ? -1 : 0;
}

/* Enters the device copy of host weight p (a copy of its own, or a view
 * into a stack of experts) in place of any entry of the same address,
 * whose own copy is freed: a smaller copy superseded, or an expert's
 * single copy replaced by its place in the layer's stack, so no weight is
 * on the device twice. Needs wreserve first. */
static void wput(cuda_impl *c, const void *p, size_t bytes, void *dev, int view) {
    size_t s = wslot(c, p);
    while (c->wtab[s].host && c->wtab[s].host != p) s = (s + 1) & (c->wcap - 1);
    if (c->wtab[s].host) {
        if (!c->wtab[s].view) {
            c->wbytes -= c->wtab[s].bytes;
            di_cuda_free(c->wtab[s].dev);
        }
    } else {
        c->wcount++;
    }
    c->wtab[s] = (wentry){p, bytes, dev, view};
    if (!view) c->wbytes += bytes;
}

/* The device copy of `bytes` of host weight data at p (p itself when it is
 * already device memory); NULL on failure (kept for status). */
static const void *wdev(di_backend *be, const void *p, size_t bytes) {
    cuda_impl *c = IM(be);
    di_err err = {0};
    if (!p) return NULL;
    if (c->wcap) {
        size_t s = wslot(c, p);
        while (c->wtab[s].host) {
            if (c->wtab[s].host == p && c->wtab[s].bytes >= bytes) return c->wtab[s].dev;
            s = (s + 1) & (c->wcap - 1);
        }
    }
    if (cuda_mem_is_device(p)) return p;
    if (wreserve(c)) {
        note(be, di_err_set(&err, DI_ERR_NOMEM, "cuda backend: weight table"), &err);
        return NULL;
    }
    void *d = NULL;
    di_status st = di_cuda_alloc(&d, bytes ? bytes : 1, &err);
    if (!st && bytes) st = di_cuda_upload(d, p, bytes, &err);
    if (st) {
        di_err_prefix(&err, "uploading a weight of %zu bytes", bytes);
        note(be, st, &err);
        di_cuda_free(d);
        return NULL;
    }
    wput(c, p, bytes, d, 0);
    return d;
}

static const void *tdev(di_backend *be, const di_tensor *t) {
    return wdev(be, t->data, (size_t)di_tensor_numel(t) * di_dtype_size(t->dtype));
}

static void moe_stacks_free(cuda_impl *c);
static void graphs_free(cuda_impl *c);

void di_backend_cuda_weights_drop(di_backend *be) {
    cuda_impl *c = IM(be);
    for (size_t i = 0; i < c->wcap; i++)
        if (c->wtab[i].host && !c->wtab[i].view) di_cuda_free(c->wtab[i].dev);
    free(c->wtab);
    c->wtab = NULL;
    c->wcap = c->wcount = c->wbytes = 0;
    moe_stacks_free(c);
    graphs_free(c); /* they read the dropped copies */
    c->gen++;
}

size_t di_backend_cuda_weights_bytes(const di_backend *be) {
    return ((const cuda_impl *)be->impl)->wbytes;
}

/* ------------------------------------------------------------ memory */

/* Size classes: powers of two up to 1 MiB, then multiples of 1 MiB, so a
 * buffer is reused for any request of its class (at most 2x waste below
 * 1 MiB, one MiB above). */
static size_t pool_class(size_t bytes) {
    if (bytes <= 256) return 256;
    if (bytes <= ((size_t)1 << 20)) {
        size_t c = 512;
        while (c < bytes) c <<= 1;
        return c;
    }
    return (bytes + ((size_t)1 << 20) - 1) & ~(((size_t)1 << 20) - 1);
}

static size_t live_slot(const cuda_impl *c, const void *p) {
    uintptr_t h = (uintptr_t)p;
    h ^= h >> 21;
    h *= (uintptr_t)0x9e3779b97f4a7c15ull;
    return (size_t)(h >> 11) & (c->live_cap - 1);
}

static int live_put(cuda_impl *c, void *p, size_t cap) {
    if ((c->live_count + 1) * 2 > c->live_cap) {
        size_t ncap = c->live_cap ? c->live_cap * 2 : 1024, ocap = c->live_cap;
        pblock *nt = calloc(ncap, sizeof *nt), *old = c->live;
        if (!nt) return -1;
        c->live = nt;
        c->live_cap = ncap;
        for (size_t i = 0; i < ocap; i++)
            if (old[i].p) {
                size_t s = live_slot(c, old[i].p);
                while (nt[s].p) s = (s + 1) & (ncap - 1);
                nt[s] = old[i];
            }
        free(old);
    }
    size_t s = live_slot(c, p);
    while (c->live[s].p) s = (s + 1) & (c->live_cap - 1);
    c->live[s] = (pblock){p, cap};
    c->live_count++;
    return 0;
}

/* Removes p from the live table; its class size, or 0 when unknown. */
static size_t live_take(cuda_impl *c, void *p) {
    if (!c->live_cap) return 0;
    size_t s = live_slot(c, p);
    while (c->live[s].p && c->live[s].p != p) s = (s + 1) & (c->live_cap - 1);
    if (!c->live[s].p) return 0;
    size_t cap = c->live[s].cap;
    c->live[s].p = NULL;
    c->live_count--;
    /* re-insert the rest of the cluster (deletion in linear probing) */
    for (size_t j = (s + 1) & (c->live_cap - 1); c->live[j].p; j = (j + 1) & (c->live_cap - 1)) {
        pblock b = c->live[j];
        c->live[j].p = NULL;
        size_t t = live_slot(c, b.p);
        while (c->live[t].p) t = (t + 1) & (c->live_cap - 1);
        c->live[t] = b;
    }
    return cap;
}

/* Gives every free block back to the device. */
static void pool_trim(cuda_impl *c) {
    for (size_t i = 0; i < c->free_count; i++) {
        di_cuda_free(c->freel[i].p);
        c->pool_bytes -= c->freel[i].cap;
    }
    c->free_count = 0;
}

/* Zero fills of pool blocks ride in the copy queue as copies from a zeroed
 * source: a decode step allocates ~700 buffers, and a cudaMemsetAsync each
 * cost a few microseconds of host time (the API call) and a node each on
 * the device; queued, the fills of a burst of allocations run in the
 * queue's one launch before the next op (op_enter runs the queue first, and
 * copies read or written by a queued fill are ordered by the queue's own
 * overlap rule, repeated here for the fill's destination). The source is
 * held as a live block of the pool, never handed out, so destroy returns it
 * with the rest. Fills above 64 KiB stay a memset: the queue copies with one
 * thread block per entry, and one block zeroing 640 KB (a batch-8 mHC state)
 * took ~13 µs of device time where a memset uses the whole GPU (measured,
 * docs/gpu-notes.md; the first version queued fills up to 1 MiB). alloc and
 * free do not run the queue themselves (except in profile mode, where
 * op_enter does); memory the pool hands back to the device is queued for
 * nothing. */
enum { POOL_ZERO_SRC = 1 << 16 };

/* Appends a copy to the queue and widens the queue's hulls (cu_copy's
 * quick test: a copy that meets neither hull meets no queued copy). */
static void queue_push(cuda_impl *c, char *dst, const char *src, size_t bytes) {
    if (!c->cq->n) {
        c->qd_lo = dst, c->qd_hi = dst + bytes, c->qs_lo = src, c->qs_hi = src + bytes;
    } else {
        if (dst < c->qd_lo) c->qd_lo = dst;
        if (dst + bytes > c->qd_hi) c->qd_hi = dst + bytes;
        if (src < c->qs_lo) c->qs_lo = src;
        if (src + bytes > c->qs_hi) c->qs_hi = src + bytes;
    }
    c->cq->d[c->cq->n++] = (cuda_copy_desc){dst, src, bytes};
}

/* How the queue meets [p, p + bytes): 0 not at all, 1 only through queued
 * fills that already cover it (a block freed and handed out again before
 * any op ran: nothing can have written it since, or the queue would have
 * run), 2 otherwise (run the queue first). */
static int pool_queue_meets(const cuda_impl *c, const char *p, size_t bytes) {
    int r = 0;
    for (int i = 0; i < c->cq->n; i++) {
        const cuda_copy_desc *q = &c->cq->d[i];
        if (!(p < q->dst + q->bytes && q->dst < p + bytes) && !(p < q->src + q->bytes && q->src < p + bytes))
            continue;
        if (q->src == (const char *)c->zero_src && q->dst <= p && p + bytes <= q->dst + q->bytes) r = 1;
        else return 2;
    }
    return r;
}

static di_status pool_zero(di_backend *be, void *p, size_t bytes, di_err *err) {
    cuda_impl *c = IM(be);
    if (!c->zero_src && bytes <= POOL_ZERO_SRC) {
        void *z = NULL;
        di_status st = di_cuda_alloc(&z, POOL_ZERO_SRC, err);
        if (!st) st = cuda_mem_fill_async(z, 0, POOL_ZERO_SRC, err);
        if (!st && live_put(c, z, POOL_ZERO_SRC))
            st = di_err_set(err, DI_ERR_NOMEM, "buffer pool: zero source");
        if (st) {
            di_cuda_free(z);
            return st;
        }
        c->zero_src = z;
        c->pool_bytes += POOL_ZERO_SRC;
    }
    int meets = pool_queue_meets(c, p, bytes);
    if (meets == 1) return DI_OK;
    if (meets == 2 || (c->cq->n == CUDA_COPY_BATCH && bytes <= POOL_ZERO_SRC)) copies_flush(be);
    if (bytes > POOL_ZERO_SRC) return cuda_mem_fill_async(p, 0, bytes, err);
    queue_push(c, (char *)p, (const char *)c->zero_src, bytes);
    return DI_OK;
}

/* op_enter's bookkeeping without running the copy queue (see pool_zero),
 * but with it in profile mode so the profile charges the time as before. */
static void pool_enter(di_backend *be, const char *op) {
    cuda_impl *c = IM(be);
    if (c->prof == 1) op_enter(be, op);
    else c->op = op;
}

static void *cu_alloc(di_backend *be, size_t bytes) {
    cuda_impl *c = IM(be);
    pool_enter(be, "alloc");
    void *p = NULL;
    di_err err = {0};
    if (bytes == 0) bytes = 1;
    if (!c->use_pool) {
        di_status st = di_cuda_alloc(&p, bytes, &err);
        if (!st) st = di_cuda_fill(p, 0, bytes, &err);
        c->n_malloc++;
        if (st) {
            di_cuda_free(p);
            return NULL; /* the caller reports out of memory */
        }
        return p;
    }
    size_t cap = pool_class(bytes);
    /* the most recently freed block of the class: likely still in L2 */
    for (size_t i = c->free_count; i-- > 0;)
        if (c->freel[i].cap == cap) {
            p = c->freel[i].p;
            c->freel[i] = c->freel[--c->free_count];
            break;
        }
    if (!p) {
        di_status st = di_cuda_alloc(&p, cap, &err);
        if (st && c->free_count) { /* the pool holds memory of other classes */
            copies_flush(be); /* queued copies may still read a free block */
            di_cuda_synchronize(&err);
            pool_trim(c);
            st = di_cuda_alloc(&p, cap, &err);
        }
        if (st) return NULL;
        c->n_malloc++;
        c->pool_bytes += cap;
    }
    if (live_put(c, p, cap)) {
        di_cuda_free(p);
        c->pool_bytes -= cap;
        return NULL;
    }
    if (!c->alloc_raw && pool_zero(be, p, bytes, &err)) {
        live_take(c, p);
        copies_flush(be);
        di_cuda_free(p);
        c->pool_bytes -= cap;
        return NULL;
    }
    return p;
}

/* backend.h's alloc_raw: a pool block without its zero fill. The fills
 * were most of the copy queue's launches in a decode step (one before
 * each burst of allocations, ~6 a layer at b1, and a memset each for the
 * attention's 128 KB buffers), while the buffers they zeroed are written
 * whole by the op that follows. Ordering needs no fill either: a queued
 * copy that still reads or writes a recycled block runs, with the queue,
 * before the next op. Recordings and the pool-less mode keep alloc. */
static void *cu_alloc_raw(di_backend *be, size_t bytes) {
    cuda_impl *c = IM(be);
    if (c->rec || !c->use_pool) return c->ops.alloc(be, bytes);
    c->alloc_raw = 1;
    void *p = cu_alloc(be, bytes);
    c->alloc_raw = 0;
    return p;
}

static void cu_free(di_backend *be, void *p) {
    cuda_impl *c = IM(be);
    if (!p) return;
    side_touch(be, p);
    pool_enter(be, "free");
    if (!c->use_pool) {
        copies_flush(be);
        di_cuda_free(p);
        return;
    }
    size_t cap = live_take(c, p);
    if (!cap) { /* not ours: memory the pool never handed out */
        copies_flush(be);
        di_cuda_free(p);
        return;
    }
    if (c->free_count == c->free_cap) {
        size_t ncap = c->free_cap ? c->free_cap * 2 : 256;
        pblock *nf = realloc(c->freel, ncap * sizeof *nf);
        if (!nf) {
            copies_flush(be);
            di_cuda_free(p);
            c->pool_bytes -= cap;
            return;
        }
        c->freel = nf;
        c->free_cap = ncap;
    }
    /* stream order makes immediate reuse safe: every later use of the
     * block is queued after the kernels that still read it */
    c->freel[c->free_count++] = (pblock){p, cap};
}

static void cu_upload(di_backend *be, void *dst, const void *src, size_t bytes) {
    di_err err = {0};
    op_enter(be, "upload");
    if (bytes) note(be, cuda_stage_upload(IM(be)->stage, dst, src, bytes, &err), &err);
}

static void cu_download(di_backend *be, void *dst, const void *src, size_t bytes) {
    di_err err = {0};
    op_enter(be, "download");
    if (bytes) note(be, di_cuda_download(dst, src, bytes, &err), &err);
}

static void *cu_host_alloc(di_backend *be, size_t bytes) {
    (void)be;
    return di_cuda_host_alloc(bytes);
}

static void cu_host_free(di_backend *be, void *p) {
    (void)be;
    di_cuda_host_free(p);
}

static int ranges_meet(const char *a, size_t na, const char *b, size_t nb) {
    return a < b + nb && b < a + na;
}

/* Runs the queued copies as one kernel. */
static void copies_flush(di_backend *be) {
    cuda_impl *c = IM(be);
    if (!c->cq->n) return;
    di_err err = {0};
    const char *op = c->op;
    c->op = OP_COPY;
    note(be, cuda_mem_copy_batch(c->cq, &err), &err);
    c->cq->n = 0;
    c->op = op;
    c->n_copy_batches++;
}

/* Queues a device-to-device copy. A copy whose own ranges overlap, or of a
 * MiB or more, runs at once (memmove); one that reads or writes what a queued copy writes, or
 * writes what a queued copy reads, first runs the queue.
 *
 * A prefill calls this per row by the ten thousand (the embedding's mHC
 * copies: 32,768 at 8,192 tokens; the compressor's groups when they come
 * from the chunk itself): the entry-by-entry test runs only when the copy
 * meets the queue's hulls, and a copy that continues one of the last two
 * queued ones at both ends (the compressor's rows, two arrays in turn) is
 * merged into it, up to COPY_MERGE bytes (the queue's kernel copies an
 * entry with one block). Merging keeps the queue's rule: the new piece
 * meets no queued copy, so the merged copy's ends do not overlap either,
 * and queued copies never meet, so their order within a launch is free. */
enum { COPY_MERGE = 256 << 10 };
static void cu_copy(di_backend *be, void *dst, const void *src, size_t bytes) {
    cuda_impl *c = IM(be);
    di_err err = {0};
    op_enter(be, OP_COPY);
    if (!bytes || dst == src) return;
    c->n_copies++;
    const char *d = dst, *s = src;
    /* a large copy gets the whole device, not one block of the queue's kernel */
    if (ranges_meet(d, bytes, s, bytes) || bytes >= ((size_t)1 << 20)) {
        copies_flush(be);
        note(be, cuda_mem_move(dst, src, bytes, &err), &err);
        return;
    }
    if (c->cq->n && (ranges_meet(d, bytes, c->qd_lo, (size_t)(c->qd_hi - c->qd_lo)) ||
                     ranges_meet(d, bytes, c->qs_lo, (size_t)(c->qs_hi - c->qs_lo)) ||
                     ranges_meet(s, bytes, c->qd_lo, (size_t)(c->qd_hi - c->qd_lo))))
        for (int i = 0; i < c->cq->n; i++) {
            const cuda_copy_desc *q = &c->cq->d[i];
            if (ranges_meet(d, bytes, q->dst, q->bytes) || ranges_meet(d, bytes, q->src, q->bytes) ||
                ranges_meet(s, bytes, q->dst, q->bytes)) {
                copies_flush(be);
                break;
            }
        }
    for (int i = c->cq->n - 1; i >= 0 && i >= c->cq->n - 2; i--) {
        cuda_copy_desc *q = &c->cq->d[i];
        if (q->dst + q->bytes == d && q->src + q->bytes == s && q->bytes + bytes <= COPY_MERGE &&
            q->src != (const char *)c->zero_src) {
            q->bytes += bytes;
            if (d + bytes > c->qd_hi) c->qd_hi = d + bytes;
            if (s + bytes > c->qs_hi) c->qs_hi = s + bytes;
            return;
        }
    }
    if (c->cq->n == CUDA_COPY_BATCH) copies_flush(be);
    queue_push(c, (char *)dst, src, bytes);
}

/* ------------------------------------------------------------ matmul */

static size_t wmat_bytes(const di_wmat *w, size_t *sbytes) {
    int64_t N = w->n_out, K = w->n_in;
    *sbytes = 0;
    switch (w->fmt) {
    case DI_WFMT_FP8:
        *sbytes = (size_t)(((N + 31) / 32) * ((K + 31) / 32));
        return (size_t)(N * K);
    case DI_WFMT_FP4:
        *sbytes = (size_t)(N * (K / 32));
        return (size_t)(N * K / 2);
    case DI_WFMT_BF16: return (size_t)(N * K) * 2;
    case DI_WFMT_F32: return (size_t)(N * K) * 4;
    default: return 0;
    }
}

/* Rows from which a BF16 product on bf16 inputs (DI_MM_ACT_BF16: the head)
 * goes to cuBLAS outside batch-invariant mode and recordings:
 * DI_CUDA_MM_BLAS=r (0: never; a measuring aid), by default 64, where the
 * head's prefill form took 557 µs against torch's 360 (docs/gpu-notes.md,
 * mid run 1); run 153: a greedy step of 1,024 rows 57.9 -> 52.0-52.8 ms,
 * 256 rows 23.1 -> 21.5-21.8, 64 rows 12.9-13.1 -> 12.7-12.8. */
static int64_t blas_rows(void) {
    static int64_t rows = -2;
    if (rows == -2) {
        const char *v = getenv("DI_CUDA_MM_BLAS");
        rows = v && *v ? strtol(v, NULL, 10) : 64;
        if (rows <= 0) rows = -1;
    }
    return rows;
}

static void cu_matmul(di_backend *be, const di_wmat *w, const float *x, int64_t m, float *y,
                      unsigned flags) {
    int quant = (flags & DI_MM_ACT_FP8) && (w->fmt == DI_WFMT_FP8 || w->fmt == DI_WFMT_FP4);
    cuda_impl *c = IM(be);
    const int64_t br = blas_rows();
    /* not with step graphs on (DI_CUDA_GRAPH=1): their steps record the
     * prefill form, and a step's logits should not depend on whether it
     * replayed */
    if (!quant && (flags & DI_MM_ACT_BF16) && w->fmt == DI_WFMT_BF16 && br > 0 && m >= br && !c->batch_invariant &&
        !c->rec && !c->ops.graph_replay) {
        op_enter(be, "matmul (plain, cuBLAS)");
        side_touch(be, x);
        side_touch(be, y);
        const int64_t K = w->n_in, N = w->n_out;
        size_t sb = 0, wb = wmat_bytes(w, &sb);
        const void *dw = wdev(be, w->w, wb);
        uint16_t *x16 = cu_alloc_raw(be, (size_t)(m * K) * sizeof(uint16_t));
        di_err err = {0};
        if (dw && x16)
            note(be, cuda_op_matmul_bf16_blas(&c->blas, dw, N, K, x, m, y, (flags & DI_MM_OUT_BF16) != 0, x16, &err),
                 &err);
        else if (dw)
            note(be, di_err_set(&err, DI_ERR_NOMEM, "bf16 copy of x [%lld, %lld]", (long long)m, (long long)K), &err);
        cu_free(be, x16);
        return;
    }
    int64_t K = w->n_in, N = w->n_out;
    /* a plain product's bf16 copy of x, as for wo_a (cu_matmul_grouped) */
    size_t xb = !quant && m > 0 && N > 0 ? cuda_op_matmul_scratch_bytes((int)w->fmt, K, m, 1, N) : 0;
    void *scr = xb ? cu_alloc_raw(be, xb) : NULL;
    op_enter(be, !quant ? "matmul (plain)" : w->fmt == DI_WFMT_FP8 ? "matmul (fp8)" : "matmul (mxfp4)");
    side_touch(be, x);
    side_touch(be, y);
    di_err err = {0};
    di_status st = DI_OK;
    if (m <= 0 || N <= 0) return;
    size_t sb = 0, wb = wmat_bytes(w, &sb);
    const void *dw = wdev(be, w->w, wb);
    const uint8_t *ds = sb ? wdev(be, w->s, sb) : NULL;
    if (!dw || (sb && !ds)) {
        cu_free(be, scr);
        return;
    }
    if (quant && w->fmt == DI_WFMT_FP8) { /* decode rows: quantized inside the product */
        int done = 0;
        st = cuda_op_gemm_fp8_x(x, m, K, dw, ds, N, y, (flags & DI_MM_OUT_BF16) != 0, &done, &err);
        if (st || done) {
            note(be, st, &err);
            return;
        }
    }
    if (quant) {
        uint8_t *q = scratch(be, SCR_A, (size_t)(m * K));
        float *s = scratch(be, SCR_B, (size_t)(m * ((K + 31) / 32)) * sizeof(float));
        if (!q || !s) return;
        st = di_cuda_act_quant_fp8(x, DI_DTYPE_F32, m, K, q, s, NULL, &err);
        int done = 0; /* bf16 outputs of a decode product: rounded in its store */
        if (!st && (flags & DI_MM_OUT_BF16))
            st = cuda_op_gemm_q_rounded((int)w->fmt, q, s, m, K, dw, ds, N, y, &done, &err);
        if (st || done) {
            note(be, st, &err);
            return;
        }
        if (w->fmt == DI_WFMT_FP8)
            st = di_cuda_gemm_fp8(q, s, m, K, dw, ds, N, y, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO, NULL,
                                  &err);
        else if (!st)
            st = di_cuda_gemm_mxfp4(q, s, m, K, dw, ds, N, y, DI_DTYPE_F32, DI_CUDA_GEMM_AUTO,
                                    NULL, &err);
        if (!st && (flags & DI_MM_OUT_BF16)) st = cuda_op_scale_bf16(y, m * N, 1.0f, &err);
    } else {
        st = cuda_op_matmul_plain_s((int)w->fmt, dw, ds, N, K, x, K, m, 1, N, y, N,
                                    (flags & DI_MM_OUT_BF16) != 0, scr, scr ? xb : 0, &err);
    }
    cu_free(be, scr);
    note(be, st, &err);
}

/* Both matrices' device copies (codes and scales); 0 where one is missing
 * (noted by wdev). */
static int pair_weights(di_backend *be, const di_wmat *wa, const di_wmat *wb, const void **da,
                        const uint8_t **sa, const void **db, const uint8_t **sbp) {
    size_t sb = 0, wbytes = wmat_bytes(wa, &sb), sb2 = 0, wbytes2 = wmat_bytes(wb, &sb2);
    *da = wdev(be, wa->w, wbytes);
    *db = wdev(be, wb->w, wbytes2);
    *sa = sb ? wdev(be, wa->s, sb) : NULL;
    *sbp = sb2 ? wdev(be, wb->s, sb2) : NULL;
    return *da && *db && (!sb || *sa) && (!sb2 || *sbp);
}

/* Two products of one x in one launch where a decode kernel takes both:
 * FP8 matrices with x quantized inside (cuda_op_gemm_fp8_x_pair: an
 * expert's w1 and w3, attention's wq_a and wkv; the pair's own k split),
 * or two plain products of one shape such as the compressor's wkv and
 * wgate (cuda_op_matmul_plain_pair, the bits of each alone); else the two
 * products as matmul runs them. */
static void cu_matmul_pair(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                           float *ya, float *yb, unsigned flags) {
    const int64_t K = wa->n_in, N = wa->n_out, N2 = wb->n_out;
    const int quant = (flags & DI_MM_ACT_FP8) && (wa->fmt == DI_WFMT_FP8 || wa->fmt == DI_WFMT_FP4);
    const int out_bf16 = (flags & DI_MM_OUT_BF16) != 0;
    side_touch(be, x);
    side_touch(be, ya);
    side_touch(be, yb);
    if (wa->fmt == wb->fmt && wb->n_in == K && m > 0 && N > 0 && N2 > 0) {
        const void *da, *db;
        const uint8_t *sa, *sbp;
        di_err err = {0};
        int done = 0;
        di_status st = DI_OK;
        if (!quant && N2 == N && (wa->fmt == DI_WFMT_BF16 || wa->fmt == DI_WFMT_FP8)) {
            op_enter(be, "matmul (plain pair)");
            if (!pair_weights(be, wa, wb, &da, &sa, &db, &sbp)) return;
            st = cuda_op_matmul_plain_pair((int)wa->fmt, da, sa, db, sbp, K, x, m, N, ya, yb, out_bf16, &done, &err);
        } else if (quant && wa->fmt == DI_WFMT_FP8) {
            op_enter(be, "matmul (fp8 pair)");
            if (!pair_weights(be, wa, wb, &da, &sa, &db, &sbp)) return;
            if (sa && sbp)
                st = cuda_op_gemm_fp8_x_pair(x, m, K, da, sa, db, sbp, N, N2, ya, yb, out_bf16, &done, &err);
        }
        if (st || done) {
            note(be, st, &err);
            return;
        }
    }
    cu_matmul(be, wa, x, m, ya, flags);
    cu_matmul(be, wb, x, m, yb, flags);
}

/* wo_a at prefill: the pool lends the product's bf16 copy of x (what
 * cuda_op_matmul_plain_s asks for; a pool that cannot lend it leaves the
 * product to its fp32 form, the same bits). Taken before the op starts, so
 * that a profile counts the product's kernels to the op. */
static void cu_matmul_grouped(di_backend *be, const di_wmat *w, int groups, const float *x,
                              int64_t m, float *y) {
    int64_t K = w->n_in, N = w->n_out;
    size_t xb = m > 0 && groups > 0 ? cuda_op_matmul_scratch_bytes((int)w->fmt, K, m, groups, N / groups) : 0;
    void *scr = xb ? cu_alloc_raw(be, xb) : NULL;
    op_enter(be, "matmul_grouped");
    di_err err = {0};
    size_t sb = 0, wb = wmat_bytes(w, &sb);
    const void *dw = m > 0 && groups > 0 ? wdev(be, w->w, wb) : NULL;
    const uint8_t *ds = dw && sb ? wdev(be, w->s, sb) : NULL;
    if (dw && (!sb || ds))
        note(be,
             cuda_op_matmul_plain_s((int)w->fmt, dw, ds, N, K, x, (int64_t)groups * K, m, groups,
                                    N / groups, y, N, 1, scr, scr ? xb : 0, &err),
             &err);
    cu_free(be, scr);
}

/* ------------------------------------------------------------ elementwise */

static int is_bf16(const di_tensor *t) { return t->dtype == DI_DTYPE_BF16; }

static void cu_rmsnorm(di_backend *be, const float *x, const di_tensor *w, int64_t m, int64_t n,
                       double eps, float *y) {
    op_enter(be, "rmsnorm");
    side_touch(be, x);
    side_touch(be, y);
    di_err err = {0};
    const void *dw = tdev(be, w);
    if (!dw) return;
    note(be, cuda_op_rmsnorm(x, dw, is_bf16(w), m, n, (float)eps, y, &err), &err);
}

/* The angles' cosines and sines come from the host's libm, the very values
 * the CPU op uses, so the rotation on the device is bit-identical. */
static void cu_rope(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                    int64_t rd, const int32_t *pos, const float *freq, int inverse) {
    op_enter(be, "rope");
    di_err err = {0};
    int64_t half = rd / 2;
    if (m <= 0 || half <= 0 || heads <= 0) return;
    size_t bytes = (size_t)(m * half * 2) * sizeof(float);
    float *cs = host_buf(be, bytes);
    if (!cs) return;
    di_rope_angles(pos, m, freq, half, cs);
    const float *dcs = scratch_up(be, SCR_A, cs, bytes);
    if (!dcs) return;
    note(be, cuda_op_rope_cs(x, m, stride, heads, hd, rd, dcs, inverse, &err), &err);
}

/* rope with the angles' values already in device memory (the step
 * metadata: the host's cosf / sinf, as above), nothing staged per call. */
static void cu_rope_cs(di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd,
                       int64_t rd, const float *cs, int inverse) {
    op_enter(be, "rope_cs");
    di_err err = {0};
    if (m <= 0 || rd / 2 <= 0 || heads <= 0) return;
    note(be, cuda_op_rope_cs(x, m, stride, heads, hd, rd, cs, inverse, &err), &err);
}

static void cu_qkv_rope_pack(di_backend *be, float *q, int heads, float *kv, int64_t m, int64_t hd,
                             int64_t rd, const di_tensor *nw, double eps, const float *cs, uint8_t *out) {
    op_enter(be, "qkv_rope_pack");
    di_err err = {0};
    const void *dnw = tdev(be, nw);
    if (!dnw) return;
    note(be, cuda_op_qkv_rope_pack(q, heads, kv, m, hd, rd, dnw, is_bf16(nw), (float)eps, cs, out, &err), &err);
}

static void cu_qdq_fp8(di_backend *be, float *x, int64_t n) {
    op_enter(be, "qdq_fp8");
    di_err err = {0};
    note(be, cuda_op_qdq_fp8(x, n, &err), &err);
}

static void cu_qdq_fp4_e8m0(di_backend *be, float *x, int64_t n) {
    op_enter(be, "qdq_fp4_e8m0");
    di_err err = {0};
    note(be, cuda_op_qdq_fp4(x, n, 0, &err), &err);
}

static void cu_qdq_fp4_e4m3(di_backend *be, float *x, int64_t n) {
    op_enter(be, "qdq_fp4_e4m3");
    di_err err = {0};
    note(be, cuda_op_qdq_fp4(x, n, 1, &err), &err);
}

static void cu_round_bf16(di_backend *be, float *x, int64_t n) {
    op_enter(be, "round_bf16");
    di_err err = {0};
    note(be, cuda_op_scale_bf16(x, n, 1.0f, &err), &err);
}

static void cu_scale_bf16(di_backend *be, float *x, int64_t n, float c) {
    op_enter(be, "scale_bf16");
    di_err err = {0};
    note(be, cuda_op_scale_bf16(x, n, c, &err), &err);
}

/* ------------------------------------------------------------ gathers */

static void cu_embed(di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m,
                     float *out) {
    op_enter(be, "embed");
    di_err err = {0};
    if (m <= 0) return;
    const void *dt = tdev(be, table);
    const int32_t *did = scratch_up(be, SCR_A, ids, (size_t)m * sizeof(int32_t));
    if (!dt || !did) return;
    note(be, cuda_op_embed(dt, is_bf16(table), table->shape[1], did, m, out, &err), &err);
}

static void cu_embed_buf(di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m,
                         float *out) {
    op_enter(be, "embed_buf");
    di_err err = {0};
    if (m <= 0) return;
    const void *dt = tdev(be, table);
    if (!dt) return;
    note(be, cuda_op_embed(dt, is_bf16(table), table->shape[1], ids, m, out, &err), &err);
}

/* The needed FP8 rows and their scales are gathered on the host (the table
 * stays in the host mapping) and only they travel. A decode step's few rows
 * go through the staging halves; a prefill's (8,192 tokens x the n-gram
 * heads: ~120 MB in the dummy V4.1-Flash) are gathered straight into a
 * pinned buffer by a few host threads and copied asynchronously, so the
 * host does not wait for the device (before: one thread into pageable
 * memory, then a copy that drained the stream, 23.6 ms a layer at 8K). */
enum { GATHER_POOL_THREADS = 8, GATHER_PAR_ROWS = 2048 };
typedef struct {
    uint8_t *h;
    const uint8_t *r, *s;
    const int32_t *ids;
    int64_t eh, nb;
    size_t rb;
} gather_ctx;

static void gather_rows(void *p, int64_t b, int64_t e, int thread) {
    const gather_ctx *g = p;
    for (int64_t t = b; t < e; t++) {
        const int64_t row = g->ids[t];
        memcpy(g->h + t * g->eh, g->r + row * g->eh, (size_t)g->eh);
        memcpy(g->h + g->rb + t * g->nb, g->s + row * g->nb, (size_t)g->nb);
    }
}

static void cu_engram_gather(di_backend *be, const di_tensor *rows, const di_tensor *scales,
                             const int32_t *ids, int64_t m, int ncols, float *out) {
    op_enter(be, "engram_gather");
    cuda_impl *c = IM(be);
    di_err err = {0};
    int64_t eh = rows->shape[1], nb = scales->shape[1], nr = m * ncols;
    if (nr <= 0) return;
    size_t rb = (size_t)(nr * eh), sbytes = (size_t)(nr * nb);
    gather_ctx g = {NULL, rows->data, scales->data, ids, eh, nb, rb};
    void *h = NULL;
    /* small gathers, recordings (which fail in scratch_up, as before) and a
     * pinned buffer that cannot be had take the staged path */
    if (nr < GATHER_PAR_ROWS || c->rec || cuda_pinned_take(&c->pinned, rb + sbytes, &h, &err)) {
        err = (di_err){0};
        g.h = host_buf(be, rb + sbytes);
        if (!g.h) return;
        gather_rows(&g, 0, nr, 0);
        uint8_t *d = scratch_up(be, SCR_A, g.h, rb + sbytes);
        if (!d) return;
        note(be, cuda_op_fp8_rows(d, d + rb, nr, eh, nb, out, &err), &err);
        return;
    }
    if (!c->gather_pool && !c->gather_pool_failed) {
        int n = di_cpu_count();
        n = n < 1 ? 1 : n > GATHER_POOL_THREADS ? GATHER_POOL_THREADS : n;
        if (n > 1 && di_threadpool_create(n, &c->gather_pool, &err)) {
            c->gather_pool = NULL; /* one thread, then */
            c->gather_pool_failed = 1;
            err = (di_err){0};
        }
    }
    g.h = h;
    di_threadpool_for(c->gather_pool, nr, 256, gather_rows, &g);
    uint8_t *d = scratch(be, SCR_A, rb + sbytes);
    if (!d) return;
    di_status st = cuda_pinned_upload(c->pinned, d, rb + sbytes, &err);
    if (!st) st = cuda_op_fp8_rows(d, d + rb, nr, eh, nb, out, &err);
    note(be, st, &err);
}

/* The rows already gathered into device memory (the step metadata). */
static void cu_engram_rows(di_backend *be, const uint8_t *rows, const uint8_t *scales, int64_t n,
                           int64_t eh, int64_t nb, float *out) {
    op_enter(be, "engram_rows");
    di_err err = {0};
    if (n <= 0) return;
    note(be, cuda_op_fp8_rows(rows, scales, n, eh, nb, out, &err), &err);
}

/* ------------------------------------------------------------ mHC, Engram gate */

/* At many rows the pool lends the rows form its partial sums (a pool that
 * cannot leaves the op to the cluster form), taken before the op starts as
 * in cu_matmul_grouped; in batch-invariant mode at every m (the rows form
 * always runs there: without them the op fails). */
static void cu_hc_mix(di_backend *be, const float *s, int64_t m, int hc, int64_t d,
                      const float *fn, const float *base, const float *scale, double norm_eps,
                      double hc_eps, int iters, float *pre, float *post, float *comb) {
    cuda_impl *c = IM(be);
    di_cuda_set_batch_invariant(c->batch_invariant); /* the scratch depends on it */
    size_t pb = cuda_op_hc_mix_scratch_bytes(m, hc, d);
    void *scr = pb ? cu_alloc_raw(be, pb) : NULL;
    op_enter(be, "hc_mix");
    di_err err = {0};
    size_t nmix = (size_t)(2 + hc) * (size_t)hc;
    const float *dfn = wdev(be, fn, nmix * (size_t)(hc * d) * sizeof(float));
    const float *dbase = wdev(be, base, nmix * sizeof(float));
    const float *dscale = wdev(be, scale, 3 * sizeof(float));
    if (dfn && dbase && dscale && c->side && !scr && !c->batch_invariant && !c->prof && !c->prof_events && !c->rec &&
        hc == 4 && m <= SIDE_ROWS && m <= cuda_op_hc_mix_side_rows()) {
        di_status st = cuda_op_hc_mix_side(s, m, d, dfn, dbase, dscale, (float)norm_eps, (float)hc_eps, iters, pre,
                                           post, comb, c->side, c->side_fork, c->side_join, &err);
        note(be, st, &err);
        if (!st) {
            const void *p[4] = {s, pre, post, comb};
            const size_t n[4] = {(size_t)(m * hc * d), (size_t)(m * hc), (size_t)(m * hc), (size_t)(m * hc * hc)};
            for (int i = 0; i < 4; i++) {
                c->side_lo[i] = p[i];
                c->side_hi[i] = (const char *)p[i] + n[i] * sizeof(float);
            }
            c->side_pending = 1;
            c->n_side++;
        }
        return;
    }
    if (dfn && dbase && dscale)
        note(be,
             cuda_op_hc_mix_s(s, m, hc, d, dfn, dbase, dscale, (float)norm_eps, (float)hc_eps, iters,
                              pre, post, comb, scr, scr ? pb : 0, &err),
             &err);
    cu_free(be, scr);
}

static void cu_hc_collapse(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                           int64_t d, float *y) {
    op_enter(be, "hc_collapse");
    di_err err = {0};
    note(be, cuda_op_hc_collapse(s, w, m, hc, d, y, &err), &err);
}

static void cu_hc_collapse_norm(di_backend *be, const float *s, const float *w, int64_t m, int hc,
                                int64_t d, const di_tensor *nw, double eps, float *y) {
    op_enter(be, "hc_collapse_norm");
    side_touch(be, w); /* s is only read, here and by hc_mix */
    side_touch(be, y);
    di_err err = {0};
    const void *dnw = tdev(be, nw);
    if (!dnw) return;
    note(be, cuda_op_hc_collapse_norm(s, w, m, hc, d, dnw, is_bf16(nw), (float)eps, y, &err), &err);
}

static void cu_hc_expand(di_backend *be, const float *y, const float *s, const float *post,
                         const float *comb, int64_t m, int hc, int64_t d, float *out) {
    op_enter(be, "hc_expand");
    di_err err = {0};
    note(be, cuda_op_hc_expand(y, s, post, comb, m, hc, d, out, &err), &err);
}

static void cu_hc_mean(di_backend *be, const float *s, int64_t m, int hc, int64_t d, float *out,
                       int64_t out_stride) {
    op_enter(be, "hc_mean");
    di_err err = {0};
    note(be, cuda_op_hc_mean(s, m, hc, d, out, out_stride, &err), &err);
}

static void cu_engram_gate(di_backend *be, float *s, const float *kv, const di_tensor *qw,
                           const di_tensor *kw, int64_t m, int hc, int64_t d, double eps) {
    op_enter(be, "engram_gate");
    di_err err = {0};
    const void *dq = tdev(be, qw), *dk = tdev(be, kw);
    if (!dq || !dk) return;
    if (qw->dtype != kw->dtype) {
        note(be, di_err_set(&err, DI_ERR_UNSUPPORTED, "engram_gate: weights of two dtypes"), &err);
        return;
    }
    note(be, cuda_op_engram_gate(s, kv, dq, dk, is_bf16(qw), m, hc, d, (float)eps, &err), &err);
}

/* ------------------------------------------------------------ attention */

static void cu_compress_pool(di_backend *be, const float *a, const float *g, int64_t m, int r,
                             int64_t n, float *out) {
    op_enter(be, "compress_pool");
    di_err err = {0};
    note(be, cuda_op_compress_pool(a, g, m, r, n, out, &err), &err);
}

static void cu_sparse_attn(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                           const di_kvrow *rows, int n_slots, const float *sink, float scale,
                           float *out) {
    op_enter(be, "sparse_attn");
    di_err err = {0};
    if (m <= 0 || h <= 0) return;
    const float *dsink = wdev(be, sink, (size_t)h * sizeof(float));
    const float *const *drows =
        scratch_up(be, SCR_A, rows, (size_t)(m * n_slots) * sizeof(di_kvrow));
    if (!dsink || !drows) return;
    note(be, cuda_op_sparse_attn(q, m, h, d, drows, n_slots, dsink, scale, out, &err), &err);
}

static void cu_index_scores(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                            int64_t di, const float *const *keys, const int32_t *n_vis,
                            int64_t width, float *out) {
    op_enter(be, "index_scores");
    di_err err = {0};
    if (m <= 0) return;
    const float *const *dkeys = scratch_up(be, SCR_A, keys, (size_t)m * sizeof(float *));
    const int32_t *dvis = scratch_up(be, SCR_B, n_vis, (size_t)m * sizeof(int32_t));
    if (!dkeys || !dvis) return;
    note(be, cuda_op_index_scores(q, w, m, hi, di, dkeys, dvis, width, out, &err), &err);
}

/* The packed-cache forms: the same kernels reading packed rows
 * (backend/kvstore.h) through the uploaded pointer tables. */
static void cu_kv_pack(di_backend *be, di_kvq fmt, const float *x, int64_t m, int64_t n,
                       uint8_t *out) {
    op_enter(be, "kv_pack");
    di_err err = {0};
    note(be, cuda_op_kv_pack((int)fmt, x, m, n, out, &err), &err);
}

static void cu_sparse_attn_kv(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                              const uint8_t *const *rows, int n_slots, int n_win,
                              const float *sink, float scale, float *out) {
    op_enter(be, "sparse_attn_kv");
    di_err err = {0};
    if (m <= 0 || h <= 0) return;
    const float *dsink = wdev(be, sink, (size_t)h * sizeof(float));
    const uint8_t *const *drows =
        scratch_up(be, SCR_A, rows, (size_t)(m * n_slots) * sizeof(const uint8_t *));
    if (!dsink || !drows) return;
    note(be, cuda_op_sparse_attn_kv(q, m, h, d, drows, n_slots, n_win, dsink, scale, out, &err),
         &err);
}

static void cu_index_scores_kv(di_backend *be, const float *q, const float *w, int64_t m, int hi,
                               int64_t di, const uint8_t *const *keys, const int32_t *n_vis,
                               int64_t width, float *out) {
    op_enter(be, "index_scores_kv");
    di_err err = {0};
    if (m <= 0) return;
    const uint8_t *const *dkeys = scratch_up(be, SCR_A, keys, (size_t)m * sizeof(const uint8_t *));
    const int32_t *dvis = scratch_up(be, SCR_B, n_vis, (size_t)m * sizeof(int32_t));
    if (!dkeys || !dvis) return;
    note(be, cuda_op_index_scores_kv_fast(q, w, m, hi, di, dkeys, dvis, width, out, &err), &err);
}

/* Downloads [m, width] scores into host staging for a host-result op. */
static float *scores_down(di_backend *be, const float *scores, int64_t m, int64_t width) {
    size_t bytes = (size_t)(m * width) * sizeof(float);
    float *h = host_buf(be, bytes ? bytes : 4);
    if (!h) return NULL;
    di_err err = {0};
    di_status st = bytes ? di_cuda_download(h, scores, bytes, &err) : DI_OK;
    if (st) {
        note(be, st, &err);
        return NULL;
    }
    return h;
}

/* Downloads the [m, k] indices a device selection left in scratch. */
static void idx_down(di_backend *be, const int32_t *d, int32_t *host, int64_t m, int k) {
    di_err err = {0};
    di_status st = m * k > 0 ? di_cuda_download(host, d, (size_t)(m * k) * sizeof(int32_t), &err) : DI_OK;
    if (st) {
        note(be, st, &err);
        for (int64_t i = 0; i < m * k; i++) host[i] = -1;
    }
}

static void cu_candidate_blocks(di_backend *be, const float *scores, const int32_t *n_vis,
                                int64_t m, int64_t width, int topk_blocks, int bs,
                                int32_t *blocks) {
    op_enter(be, "candidate_blocks");
    di_err err = {0};
    if (m <= 0 || topk_blocks <= 0) return;
    int64_t nb = (width + bs - 1) / bs;
    int kk = topk_blocks < nb ? topk_blocks : (int)nb;
    const int32_t *dvis = scratch_up(be, SCR_B, n_vis, (size_t)m * sizeof(int32_t));
    int32_t *didx = scratch(be, SCR_C, (size_t)(m * topk_blocks) * sizeof(int32_t));
    float *bsc = scratch(be, SCR_D, (size_t)(m * (nb > 0 ? nb : 1)) * sizeof(float));
    di_status st = !dvis || !didx || !bsc ? DI_ERR_NOMEM : DI_OK;
    if (!st) st = cuda_op_block_max(scores, dvis, m, width, bs, bsc, &err);
    if (!st) st = cuda_op_topk_select(bsc, NULL, m, nb, kk, topk_blocks, didx, &err);
    note(be, st, &err);
    if (st) {
        for (int64_t i = 0; i < m * topk_blocks; i++) blocks[i] = -1;
        return;
    }
    idx_down(be, didx, blocks, m, topk_blocks);
}

static void cu_restrict_blocks(di_backend *be, float *scores, const int32_t *blocks, int64_t m,
                               int64_t width, int topk_blocks, int bs) {
    op_enter(be, "restrict_blocks");
    di_err err = {0};
    if (m <= 0) return;
    const int32_t *db =
        scratch_up(be, SCR_A, blocks, (size_t)(m * topk_blocks) * sizeof(int32_t));
    if (!db) return;
    note(be, cuda_op_restrict_blocks(scores, db, m, width, topk_blocks, bs, &err), &err);
}

static void cu_topk_select(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                           int64_t width, int k, int32_t *idx) {
    op_enter(be, "topk_select");
    di_err err = {0};
    if (m <= 0 || k <= 0) return;
    const int32_t *dvis = scratch_up(be, SCR_B, n_vis, (size_t)m * sizeof(int32_t));
    int32_t *didx = scratch(be, SCR_C, (size_t)(m * k) * sizeof(int32_t));
    di_status st = !dvis || !didx ? DI_ERR_NOMEM : DI_OK;
    if (!st) st = cuda_op_topk_select(scores, dvis, m, width, k, k, didx, &err);
    note(be, st, &err);
    if (st) {
        for (int64_t i = 0; i < m * k; i++) idx[i] = -1;
        return;
    }
    idx_down(be, didx, idx, m, k);
}

/* The backend-memory forms (backend.h): the same kernels on tables that
 * already are device memory (the forward's step metadata, the selections
 * of earlier calls), so nothing is uploaded or downloaded per call and the
 * selection path of a step has no host round trip (run 23 checked them
 * against the host forms: the same logits bits). */
static void cu_index_scores_kv_buf(di_backend *be, const float *q, const float *w, int64_t m,
                                   int hi, int64_t di, const uint8_t *const *keys,
                                   const int32_t *n_vis, int64_t width, float *out) {
    op_enter(be, "index_scores_kv_buf");
    di_err err = {0};
    if (m <= 0) return;
    note(be, cuda_op_index_scores_kv_fast(q, w, m, hi, di, keys, n_vis, width, out, &err), &err);
}

static void cu_candidate_blocks_buf(di_backend *be, const float *scores, const int32_t *n_vis,
                                    int64_t m, int64_t width, int topk_blocks, int bs,
                                    int32_t *blocks) {
    op_enter(be, "candidate_blocks_buf");
    di_err err = {0};
    if (m <= 0 || topk_blocks <= 0) return;
    int64_t nb = (width + bs - 1) / bs;
    int kk = topk_blocks < nb ? topk_blocks : (int)nb;
    float *bsc = scratch(be, SCR_D, (size_t)(m * (nb > 0 ? nb : 1)) * sizeof(float));
    di_status st = !bsc ? DI_ERR_NOMEM : DI_OK;
    if (!st) st = cuda_op_block_max(scores, n_vis, m, width, bs, bsc, &err);
    if (!st) st = cuda_op_topk_select(bsc, NULL, m, nb, kk, topk_blocks, blocks, &err);
    note(be, st, &err);
}

static void cu_restrict_blocks_buf(di_backend *be, float *scores, const int32_t *blocks, int64_t m,
                                   int64_t width, int topk_blocks, int bs) {
    op_enter(be, "restrict_blocks_buf");
    di_err err = {0};
    if (m <= 0) return;
    note(be, cuda_op_restrict_blocks(scores, blocks, m, width, topk_blocks, bs, &err), &err);
}

static void cu_topk_select_buf(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                               int64_t width, int k, int32_t *idx) {
    op_enter(be, "topk_select_buf");
    di_err err = {0};
    if (m <= 0 || k <= 0) return;
    note(be, cuda_op_topk_select(scores, n_vis, m, width, k, k, idx, &err), &err);
}

static void cu_sparse_attn_rows(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                                const di_attn_rows *t, const float *sink, float scale,
                                float *out) {
    op_enter(be, "sparse_attn_rows");
    di_err err = {0};
    if (m <= 0 || h <= 0) return;
    int64_t n_slots = (int64_t)t->n_win + t->n_sel;
    const float *dsink = wdev(be, sink, (size_t)h * sizeof(float));
    const uint8_t **tab = scratch(be, SCR_A, (size_t)(m * n_slots) * sizeof(const uint8_t *));
    if (!dsink || !tab) return;
    note(be,
         cuda_op_sparse_attn_rows(q, m, h, d, t->n_win, t->win, t->ring, t->chunk, t->win_bytes,
                                  t->n_sel, t->sel, t->cache, t->cache_bytes, tab, dsink, scale,
                                  out, &err),
         &err);
}

/* ------------------------------------------------------------ MoE */

static void cu_moe_route(di_backend *be, const float *logits, const float *bias, int64_t m, int e,
                         int k, int normalize, float route_scale, int32_t *idx, float *w) {
    op_enter(be, "moe_route");
    float *h = scores_down(be, logits, m, e);
    if (!h) {
        for (int64_t i = 0; i < m * k; i++) {
            idx[i] = 0;
            w[i] = 0.f;
        }
        return;
    }
    di_backend *cpu = IM(be)->cpu;
    cpu->ops->moe_route(cpu, h, bias, m, e, k, normalize, route_scale, idx, w);
}

static void cu_swiglu(di_backend *be, const float *g, const float *u, const float *w, int64_t m,
                      int64_t n, float limit, float *out) {
    op_enter(be, "swiglu");
    di_err err = {0};
    note(be, cuda_op_swiglu(g, u, w, m, n, limit, out, &err), &err);
}

static void cu_gather_rows(di_backend *be, const float *src, const int32_t *rows, int64_t m,
                           int64_t n, float *dst) {
    op_enter(be, "gather_rows");
    di_err err = {0};
    if (m <= 0) return;
    const int32_t *dr = scratch_up(be, SCR_A, rows, (size_t)m * sizeof(int32_t));
    if (!dr) return;
    note(be, cuda_op_gather_rows(src, dr, m, n, dst, &err), &err);
}

static void cu_gather_rows_buf(di_backend *be, const float *src, const int32_t *rows, int64_t m,
                               int64_t n, float *dst) {
    op_enter(be, "gather_rows_buf");
    di_err err = {0};
    if (m <= 0) return;
    note(be, cuda_op_gather_rows(src, rows, m, n, dst, &err), &err);
}

/* The writes into the sequences' rings and caches, to the step metadata's
 * slots: one launch instead of one queued copy per row, its addresses in
 * device memory. */
static void cu_scatter_rows_to(di_backend *be, const void *src, size_t src_stride, int64_t m,
                               const uint8_t *const *base, const int32_t *slot, size_t dst_off,
                               size_t dst_stride, size_t bytes) {
    op_enter(be, "scatter_rows_to");
    di_err err = {0};
    note(be,
         cuda_op_scatter_rows_to(src, src_stride, m, base, slot, dst_off, dst_stride, bytes, &err),
         &err);
}

static void cu_gather_rows_from(di_backend *be, void *dst, size_t dst_stride, int64_t m,
                                const uint8_t *const *base, const int32_t *slot, size_t src_off,
                                size_t src_stride, size_t bytes) {
    op_enter(be, "gather_rows_from");
    di_err err = {0};
    note(be,
         cuda_op_gather_rows_from(dst, dst_stride, m, base, slot, src_off, src_stride, bytes, &err),
         &err);
}

static void cu_scatter_add_rows(di_backend *be, float *dst, const int32_t *rows, const float *src,
                                int64_t m, int64_t n) {
    op_enter(be, "scatter_add_rows");
    di_err err = {0};
    if (m <= 0) return;
    const int32_t *dr = scratch_up(be, SCR_A, rows, (size_t)m * sizeof(int32_t));
    if (!dr) return;
    note(be, cuda_op_scatter_add_rows(dst, dr, src, m, n, &err), &err);
}

static void cu_add(di_backend *be, float *y, const float *x, int64_t n) {
    op_enter(be, "add");
    di_err err = {0};
    note(be, cuda_op_add(y, x, n, &err), &err);
}

static void cu_add_bf16(di_backend *be, float *y, const float *a, const float *b, int64_t n) {
    op_enter(be, "add_bf16");
    di_err err = {0};
    note(be, cuda_op_add_bf16(y, a, b, n, &err), &err);
}

/* The shared expert's tail: one launch of the quantizing decode kernel
 * where it applies (FP8 weights, activations quantized, up to 8 rows),
 * else the three ops as the model would run them. */
static void cu_swiglu_matmul_add(di_backend *be, const di_wmat *w, const float *g, const float *u, int64_t m,
                                 float limit, const float *a, float *y, unsigned flags) {
    const int64_t K = w->n_in, N = w->n_out;
    if (m <= 0 || N <= 0) return;
    if ((flags & DI_MM_ACT_FP8) && w->fmt == DI_WFMT_FP8) {
        op_enter(be, "matmul (fp8, swiglu + add)");
        side_touch(be, g);
        side_touch(be, u);
        side_touch(be, a);
        side_touch(be, y);
        size_t sb = 0, wb = wmat_bytes(w, &sb);
        const uint8_t *dw = wdev(be, w->w, wb), *ds = wdev(be, w->s, sb);
        if (!dw || !ds) return;
        di_err err = {0};
        int done = 0;
        di_status st = cuda_op_gemm_fp8_x_swiglu_add(g, u, limit, a, m, K, dw, ds, N, y,
                                                     (flags & DI_MM_OUT_BF16) != 0, &done, &err);
        if (st || done) {
            note(be, st, &err);
            return;
        }
    }
    float *x = cu_alloc_raw(be, (size_t)(m * K) * sizeof(float));
    float *z = cu_alloc_raw(be, (size_t)(m * N) * sizeof(float));
    if (x && z) {
        cu_swiglu(be, g, u, NULL, m, K, limit, x);
        cu_matmul(be, w, x, m, z, flags);
        cu_add_bf16(be, y, a, z, m * N);
    } else {
        di_err err = {0};
        note(be, di_err_set(&err, DI_ERR_NOMEM, "swiglu_matmul_add: buffers of %lld rows", (long long)m), &err);
    }
    cu_free(be, x);
    cu_free(be, z);
}

/* The rows' greedy summaries on the device (cuda_ops_logits.cu): the bans
 * go up with the call (a step's rows: a few hundred bytes). */
static void cu_logits_greedy(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim,
                             const int32_t *ban, di_row_greedy *out) {
    op_enter(be, "logits_greedy");
    di_err err = {0};
    if (m <= 0) return;
    const int32_t *db = ban ? scratch_up(be, SCR_A, ban, (size_t)m * sizeof(int32_t)) : NULL;
    if (ban && !db) return;
    void *scr = scratch(be, SCR_B, cuda_op_logits_greedy_scratch_bytes(m, V));
    if (!scr) return;
    note(be, cuda_op_logits_greedy(x, m, V, lim, db, out, scr, &err), &err);
}

/* The rows' top lists on the device (cuda_ops_logits.cu). */
static void cu_logits_top(di_backend *be, const float *x, int64_t m, int64_t V, int32_t k, di_row_top *out) {
    op_enter(be, "logits_top");
    di_err err = {0};
    note(be, cuda_op_logits_top(x, m, V, k, out, &err), &err);
}

/* The rows' values at one id each (cuda_ops_logits.cu): the ids go up with
 * the call, as the greedy bans do; an id outside the row is refused. */
static void cu_logits_pick(di_backend *be, const float *x, int64_t m, int64_t V, const int32_t *cols, float *out) {
    op_enter(be, "logits_pick");
    di_err err = {0};
    if (m <= 0) return;
    for (int64_t i = 0; i < m; i++)
        if (cols[i] < 0 || cols[i] >= V) {
            note(be, di_err_set(&err, DI_ERR_INVALID_ARG, "logits_pick: row %lld: id %d outside [0, %lld)", (long long)i,
                                (int)cols[i], (long long)V),
                 &err);
            return;
        }
    const int32_t *dc = scratch_up(be, SCR_A, cols, (size_t)m * sizeof *cols);
    if (!dc) return;
    note(be, cuda_op_logits_pick(x, m, V, dc, out, &err), &err);
}

enum { EDITS_STAGED = 256 << 10 }; /* a longer edit list goes up from where it is (cu_logits_draw) */

static void cu_logits_draw(di_backend *be, const float *x, int64_t m, int64_t V, int64_t lim,
                           const di_row_draw *draws, const di_row_edit *edits, di_row_greedy *out) {
    op_enter(be, "logits_draw");
    di_err err = {0};
    if (m <= 0) return;
    const di_row_draw *dd = scratch_up(be, SCR_A, draws, (size_t)m * sizeof *draws);
    if (!dd) return;
    /* the rows' edits: the span of the list they index, uploaded once */
    int64_t lo = INT64_MAX, hi = 0;
    for (int64_t i = 0; i < m; i++)
        if (draws[i].n_edit > 0) {
            lo = draws[i].e0 < lo ? draws[i].e0 : lo;
            hi = draws[i].e0 + draws[i].n_edit > hi ? draws[i].e0 + draws[i].n_edit : hi;
        }
    const di_row_edit *de = NULL;
    if (hi > 0) {
        if (!edits) {
            note(be, di_err_set(&err, DI_ERR_INVALID_ARG, "logits_draw: rows with edits and no list"), &err);
            return;
        }
        /* a long list (a prompt's ids under a repetition penalty: ~16 MB for
         * 1,024 rows of 1,000 ids) straight from the caller's memory, which
         * the engine keeps page-locked: staging it would copy it once more,
         * and a list past the staging buffer's half was a waiting copy */
        const size_t bytes = (size_t)(hi - lo) * sizeof *edits;
        static int direct = -1; /* test aid: DI_CUDA_EDITS_DIRECT=1 sends every list the long way */
        if (direct < 0) {
            const char *v = getenv("DI_CUDA_EDITS_DIRECT");
            direct = v && !strcmp(v, "1");
        }
        if (bytes <= EDITS_STAGED && !direct) {
            de = scratch_up(be, SCR_B, edits + lo, bytes);
        } else if (IM(be)->rec) {
            note(be, di_err_set(&err, DI_ERR_UNSUPPORTED, "an edits upload in a recorded step"), &err);
            return;
        } else if ((de = scratch(be, SCR_B, bytes)) != NULL) {
            di_status st = cuda_mem_upload_async((void *)de, edits + lo, bytes, &err);
            if (st) {
                note(be, st, &err);
                return;
            }
        }
        if (!de) return;
    } else {
        lo = 0;
    }
    static int use = -1; /* measuring aid: DI_CUDA_DRAW_EDITS=0 uploads the lists and draws without them (wrong draws) */
    if (use < 0) {
        const char *v = getenv("DI_CUDA_DRAW_EDITS");
        use = !(v && !strcmp(v, "0"));
    }
    note(be, cuda_op_logits_draw(x, m, V, lim, dd, use ? de : NULL, lo, out, &err), &err);
}

/* moe_route with its results left in device memory: the route kernel
 * (cuda_ops_moe.cu, the CPU op's arithmetic bit for bit); with more
 * active experts than experts (ranks past e pick -1) the host form's
 * results, uploaded. Both take up to 1024 experts, top-64. */
static void cu_moe_route_buf(di_backend *be, const float *logits, const float *bias, int64_t m,
                             int e, int k, int normalize, float route_scale, int32_t *idx,
                             float *w) {
    op_enter(be, "moe_route_buf");
    di_err err = {0};
    if (m <= 0 || k <= 0) return;
    if (e <= 0 || e > 1024 || k > 64 || !bias) {
        note(be, di_err_set(&err, DI_ERR_UNSUPPORTED,
                            "moe_route_buf: %d experts, top-%d%s (supported: 1 to 1024 experts, "
                            "top-64, with a bias)", e, k, bias ? "" : ", no bias"), &err);
        return;
    }
    if (k <= e) {
        const float *db = wdev(be, bias, (size_t)e * sizeof(float));
        if (!db) return;
        note(be, cuda_op_moe_route(logits, db, m, e, k, normalize, route_scale, idx, w, NULL, &err),
             &err);
        return;
    }
    size_t n = (size_t)(m * k);
    int32_t *hi = malloc(n * sizeof *hi);
    float *hw = malloc(n * sizeof *hw);
    if (!hi || !hw) {
        note(be, di_err_set(&err, DI_ERR_NOMEM, "moe_route_buf: %zu routing entries", n), &err);
    } else {
        cu_moe_route(be, logits, bias, m, e, k, normalize, route_scale, hi, hw);
        cuda_stage *sg = IM(be)->stage;
        di_status st = cuda_stage_upload(sg, idx, hi, n * sizeof *hi, &err);
        if (!st) st = cuda_stage_upload(sg, w, hw, n * sizeof *hw, &err);
        note(be, st, &err);
    }
    free(hi);
    free(hw);
}

/* A layer's routed experts stacked on the device in the grouped product's
 * layout (cuda_moe_weights: [E, n, k/2] codes and [E, n, k/32] scales per
 * matrix), keyed by the host addresses of every expert's matrices. The
 * weight table's entries for those addresses become views into the stack
 * (an expert's own copy, if one was made before, is freed), so an expert is
 * on the device once and the single-matrix ops read the stacked copy. */
struct moe_stack {
    int n;              /* experts */
    const void **host;  /* [6, n]: w1, s1, w3, s3, w2, s2 host pointers of each expert */
    size_t bytes[6];    /* of one expert's codes / scales, same order */
    void *dev;          /* one allocation, the six parts 256-byte aligned */
    size_t data;        /* bytes of weights in it (counted in wbytes) */
    cuda_moe_weights W;
};

static void moe_stacks_free(cuda_impl *c) {
    for (int i = 0; i < c->n_stacks; i++) {
        di_cuda_free(c->stacks[i].dev);
        free(c->stacks[i].host);
    }
    free(c->stacks);
    c->stacks = NULL;
    c->n_stacks = c->cap_stacks = 0;
}

/* Host pointer q (0..5: w1, s1, w3, s3, w2, s2) of expert e. */
static const void *moe_part(const di_moe_experts *ex, int q, int e) {
    const di_wmat *mt = di_moe_wmat(q < 2 ? ex->w1 : q < 4 ? ex->w3 : ex->w2, ex->stride, e);
    return q & 1 ? (const void *)mt->s : mt->w;
}

/* Whether the grouped kernels take this layer: MXFP4 experts of one shape
 * with dims multiples of 32, FP8 activations (the shipped numerics), up to
 * 1024 experts and top-64. Anything else runs the per-expert loop. */
static int moe_grouped_fits(const di_moe_experts *ex, int k, unsigned mm) {
    int64_t I = ex->w1->n_out, D = ex->w1->n_in;
    if (!(mm & DI_MM_ACT_FP8) || (mm & ~(DI_MM_ACT_FP8 | DI_MM_OUT_BF16)) || ex->n <= 0 ||
        ex->n > 1024 || k <= 0 || k > 64 || I <= 0 || D <= 0 || I % 32 || D % 32)
        return 0;
    for (int e = 0; e < ex->n; e++) {
        const di_wmat *a = di_moe_wmat(ex->w1, ex->stride, e), *b = di_moe_wmat(ex->w3, ex->stride, e),
                      *d = di_moe_wmat(ex->w2, ex->stride, e);
        if (a->fmt != DI_WFMT_FP4 || b->fmt != DI_WFMT_FP4 || d->fmt != DI_WFMT_FP4 ||
            a->n_out != I || a->n_in != D || b->n_out != I || b->n_in != D || d->n_out != D ||
            d->n_in != I || !a->w || !a->s || !b->w || !b->s || !d->w || !d->s)
            return 0;
    }
    return 1;
}

/* The stacked copy of a layer's experts, built on first use; NULL when the
 * experts already are device memory (the loop then reads them as they are)
 * or on failure (kept for status). */
static const cuda_moe_weights *moe_stacked(di_backend *be, const di_moe_experts *ex) {
    cuda_impl *c = IM(be);
    int E = ex->n;
    size_t bytes[6];
    bytes[0] = wmat_bytes(ex->w1, &bytes[1]);
    bytes[2] = wmat_bytes(ex->w3, &bytes[3]);
    bytes[4] = wmat_bytes(ex->w2, &bytes[5]);
    for (int i = 0; i < c->n_stacks; i++) {
        moe_stack *sk = &c->stacks[i];
        if (sk->n != E || memcmp(sk->bytes, bytes, sizeof bytes)) continue;
        int same = 1;
        for (int q = 0; q < 6 && same; q++)
            for (int e = 0; e < E && same; e++) same = sk->host[q * E + e] == moe_part(ex, q, e);
        if (same) return &sk->W;
    }
    if (cuda_mem_is_device(ex->w1->w)) return NULL;
    di_err err = {0};
    if (c->n_stacks == c->cap_stacks) {
        int ncap = c->cap_stacks ? 2 * c->cap_stacks : 16;
        moe_stack *ns = realloc(c->stacks, (size_t)ncap * sizeof *ns);
        if (!ns) {
            note(be, di_err_set(&err, DI_ERR_NOMEM, "moe_experts: stack table"), &err);
            return NULL;
        }
        c->stacks = ns;
        c->cap_stacks = ncap;
    }
    moe_stack sk = {.n = E};
    memcpy(sk.bytes, bytes, sizeof bytes);
    size_t off[7] = {0};
    for (int q = 0; q < 6; q++) {
        off[q + 1] = off[q] + ((bytes[q] * (size_t)E + 255) & ~(size_t)255);
        sk.data += bytes[q] * (size_t)E;
    }
    sk.host = malloc((size_t)(6 * E) * sizeof *sk.host);
    di_status st = sk.host ? DI_OK : di_err_set(&err, DI_ERR_NOMEM, "moe_experts: stack table");
    if (!st) {
        for (int q = 0; q < 6; q++)
            for (int e = 0; e < E; e++) sk.host[q * E + e] = moe_part(ex, q, e);
        st = di_cuda_alloc(&sk.dev, off[6], &err);
    }
    for (int q = 0; q < 6 && !st; q += 2)
        st = cuda_moe_stack(E, sk.host + q * E, sk.host + (q + 1) * E, bytes[q], bytes[q + 1],
                            (char *)sk.dev + off[q], (char *)sk.dev + off[q + 1], &err);
    for (int q = 0; q < 6 && !st; q++)
        for (int e = 0; e < E && !st; e++) {
            if (wreserve(c)) {
                st = di_err_set(&err, DI_ERR_NOMEM, "moe_experts: weight table");
                break;
            }
            wput(c, sk.host[q * E + e], bytes[q], (char *)sk.dev + off[q] + (size_t)e * bytes[q], 1);
        }
    if (st) {
        /* views already entered point into the stack: forget them all */
        for (size_t i = 0; i < c->wcap; i++)
            if (c->wtab[i].host && c->wtab[i].view && (char *)c->wtab[i].dev >= (char *)sk.dev &&
                (char *)c->wtab[i].dev < (char *)sk.dev + off[6])
                c->wtab[i].bytes = 0; /* never matches a lookup again */
        di_err_prefix(&err, "stacking %d experts of %lld x %lld", E, (long long)ex->w1->n_out,
                      (long long)ex->w1->n_in);
        note(be, st, &err);
        di_cuda_free(sk.dev);
        free(sk.host);
        return NULL;
    }
    const uint8_t *b = sk.dev;
    sk.W = (cuda_moe_weights){E,          ex->w1->n_in, ex->w1->n_out, b + off[0], b + off[1],
                              b + off[2], b + off[3],   b + off[4],    b + off[5]};
    c->wbytes += sk.data;
    c->stacks[c->n_stacks] = sk;
    return &c->stacks[c->n_stacks++].W;
}

/* The routed experts one at a time through this table's own ops (the
 * model's loop, rows from the downloaded routing): layers the grouped
 * kernels do not take. */
static void moe_experts_loop(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                             const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                             float *out) {
    int E = ex->n;
    int64_t D = ex->w1->n_in, P = m * k, nmax = 0, imax = 0;
    di_err err = {0};
    di_status st = cuda_mem_fill_async(out, 0, (size_t)(m * D) * sizeof(float), &err);
    if (st || k <= 0 || E <= 0) {
        note(be, st, &err);
        return;
    }
    int32_t *hidx = malloc((size_t)P * sizeof *hidx), *rows = malloc((size_t)P * sizeof *rows);
    float *hw = malloc((size_t)P * sizeof *hw), *rw = malloc((size_t)P * sizeof *rw);
    int64_t *off = calloc((size_t)E + 1, sizeof *off), *cur = malloc((size_t)E * sizeof *cur);
    float *xe = NULL, *ye = NULL, *g = NULL, *u = NULL, *dw = NULL;
    if (!hidx || !rows || !hw || !rw || !off || !cur) {
        note(be, di_err_set(&err, DI_ERR_NOMEM, "moe_experts: routing of %lld rows", (long long)m), &err);
        goto out;
    }
    st = di_cuda_download(hidx, idx, (size_t)P * sizeof *hidx, &err);
    if (!st) st = di_cuda_download(hw, w, (size_t)P * sizeof *hw, &err);
    if (st) {
        note(be, st, &err);
        goto out;
    }
    for (int64_t p = 0; p < P; p++)
        if (hidx[p] >= 0 && hidx[p] < E) off[hidx[p] + 1]++;
    for (int e = 0; e < E; e++) {
        int64_t I = di_moe_wmat(ex->w1, ex->stride, e)->n_out;
        if (off[e + 1] > nmax) nmax = off[e + 1];
        if (off[e + 1] && I > imax) imax = I;
        off[e + 1] += off[e];
        cur[e] = off[e];
    }
    for (int64_t p = 0; p < P; p++) /* p = i·k + r: rows ascending per expert */
        if (hidx[p] >= 0 && hidx[p] < E) {
            int64_t q = cur[hidx[p]]++;
            rows[q] = (int32_t)(p / k);
            rw[q] = hw[p];
        }
    if (!nmax) goto out;
    xe = cu_alloc(be, (size_t)(nmax * D) * sizeof(float));
    ye = cu_alloc(be, (size_t)(nmax * D) * sizeof(float));
    g = cu_alloc(be, (size_t)(nmax * imax) * sizeof(float));
    u = cu_alloc(be, (size_t)(nmax * imax) * sizeof(float));
    dw = cu_alloc(be, (size_t)nmax * sizeof(float));
    if (!xe || !ye || !g || !u || !dw) {
        note(be, di_err_set(&err, DI_ERR_NOMEM, "moe_experts: buffers of %lld rows", (long long)nmax),
             &err);
        goto out;
    }
    for (int e = 0; e < E; e++) {
        int64_t n = off[e + 1] - off[e];
        if (n == 0) continue;
        const di_wmat *w1 = di_moe_wmat(ex->w1, ex->stride, e);
        cu_gather_rows(be, x, rows + off[e], n, D, xe);
        cu_upload(be, dw, rw + off[e], (size_t)n * sizeof(float));
        cu_matmul(be, w1, xe, n, g, mm);
        cu_matmul(be, di_moe_wmat(ex->w3, ex->stride, e), xe, n, u, mm);
        cu_swiglu(be, g, u, dw, n, w1->n_out, limit, g);
        cu_matmul(be, di_moe_wmat(ex->w2, ex->stride, e), g, n, ye, mm);
        cu_scatter_add_rows(be, out, rows + off[e], ye, n, D);
    }
out:
    cu_free(be, xe);
    cu_free(be, ye);
    cu_free(be, g);
    cu_free(be, u);
    cu_free(be, dw);
    free(hidx);
    free(rows);
    free(hw);
    free(rw);
    free(off);
    free(cur);
}

/* backend.h's moe_experts: the grouped kernels (cuda_op_moe_experts, eight
 * launches whatever the routing, nothing read back) on the layer's stacked
 * experts, the scratch from the backend's slots; other formats, numerics or
 * shapes through the per-expert loop. */
static void cu_moe_experts(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                           const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                           float *out) {
    op_enter(be, "moe_experts");
    di_err err = {0};
    if (m <= 0) return;
    const cuda_moe_weights *W = moe_grouped_fits(ex, k, mm) ? moe_stacked(be, ex) : NULL;
    if (!W) {
        if (!IM(be)->status) moe_experts_loop(be, ex, x, m, idx, w, k, mm, limit, out);
        return;
    }
    size_t bytes = cuda_moe_experts_scratch(m, k, W->n_experts, W->dim, W->inter);
    void *scr = scratch(be, SCR_C, bytes);
    if (!scr) return;
    note(be,
         cuda_op_moe_experts(W, x, m, idx, w, k, (mm & DI_MM_OUT_BF16) != 0, limit, scr, bytes,
                             out, NULL, &err),
         &err);
}

/* ------------------------------------------------------------ step graphs */

/* A decode step recorded as a CUDA graph (backend.h graph_replay, on with
 * DI_CUDA_GRAPH=1): its key, its metadata buffer and every buffer the step
 * allocated while recorded — an arena of chunks the graph owns and nobody
 * else is handed, since each replay writes into those addresses again —
 * and the buffer it leaves the logits in. The first step of a key runs
 * eagerly (weights, stacked experts and scratch reach their sizes), the
 * second is recorded and run, later ones replay. A scratch slot that moves
 * (c->gen) or dropped weights make the recordings stale. */
typedef struct gentry {
    uint64_t key;
    size_t meta_bytes;
    int seen, failed;
    long gen;
    void *exec;             /* cudaGraphExec_t */
    void *meta;             /* [meta_bytes] in the arena */
    const float *logits;
    void **chunk;           /* [n_chunk] the arena */
    size_t *chunk_cap;
    int n_chunk, cap_chunk;
    size_t used;            /* bytes taken of the last chunk */
} gentry;

enum { GRAPH_MAX = 64, GRAPH_CHUNK = 8 << 20 };

static void *arena_alloc(di_backend *be, gentry *e, size_t bytes) {
    di_err err = {0};
    size_t need = (bytes + 255) & ~(size_t)255;
    if (!need) need = 256;
    if (!e->n_chunk || e->used + need > e->chunk_cap[e->n_chunk - 1]) {
        if (e->n_chunk == e->cap_chunk) {
            int nc = e->cap_chunk ? 2 * e->cap_chunk : 8;
            void **ch = realloc(e->chunk, (size_t)nc * sizeof *ch);
            if (ch) e->chunk = ch;
            size_t *cc = ch ? realloc(e->chunk_cap, (size_t)nc * sizeof *cc) : NULL;
            if (!ch || !cc) return NULL;
            e->chunk_cap = cc;
            e->cap_chunk = nc;
        }
        size_t cap = need > GRAPH_CHUNK ? need : GRAPH_CHUNK;
        void *p = NULL;
        if (di_cuda_alloc(&p, cap, &err)) return NULL;
        e->chunk[e->n_chunk] = p;
        e->chunk_cap[e->n_chunk++] = cap;
        e->used = 0;
    }
    void *p = (char *)e->chunk[e->n_chunk - 1] + e->used;
    e->used += need;
    note(be, cuda_mem_fill_async(p, 0, bytes, &err), &err); /* zeroed, as alloc's */
    return p;
}

static int in_graphs(const cuda_impl *c, const void *p) {
    for (int i = 0; i < c->n_graphs; i++)
        for (int k = 0; k < c->graphs[i].n_chunk; k++) {
            const char *b = c->graphs[i].chunk[k];
            if ((const char *)p >= b && (const char *)p < b + c->graphs[i].chunk_cap[k]) return 1;
        }
    return 0;
}

static void graph_drop(gentry *e) {
    cuda_graph_free(e->exec);
    for (int k = 0; k < e->n_chunk; k++) di_cuda_free(e->chunk[k]);
    free(e->chunk);
    free(e->chunk_cap);
    *e = (gentry){.key = e->key};
}

static void graphs_free(cuda_impl *c) {
    for (int i = 0; i < c->n_graphs; i++) graph_drop(&c->graphs[i]);
    free(c->graphs);
    c->graphs = NULL;
    c->n_graphs = c->cap_graphs = 0;
    c->rec = NULL;
}

/* alloc while recording: from the recording's arena */
static void *cu_alloc_rec(di_backend *be, size_t bytes) {
    cuda_impl *c = IM(be);
    op_enter(be, "alloc");
    return c->rec ? arena_alloc(be, c->rec, bytes) : cu_alloc(be, bytes);
}

/* free with recordings: arena buffers stay with their recording */
static void cu_free_rec(di_backend *be, void *p) {
    if (p && in_graphs(IM(be), p)) return;
    cu_free(be, p);
}

/* upload while recording: a replay would copy stale staging data */
static void cu_upload_rec(di_backend *be, void *dst, const void *src, size_t bytes) {
    if (IM(be)->rec) {
        di_err err = {0};
        note(be, di_err_set(&err, DI_ERR_UNSUPPORTED, "an upload in a recorded step"), &err);
        return;
    }
    cu_upload(be, dst, src, bytes);
}

static gentry *graph_find(cuda_impl *c, uint64_t key, int add) {
    for (int i = 0; i < c->n_graphs; i++)
        if (c->graphs[i].key == key) return &c->graphs[i];
    if (!add || c->n_graphs >= GRAPH_MAX) return NULL;
    if (c->n_graphs == c->cap_graphs) {
        int nc = c->cap_graphs ? 2 * c->cap_graphs : 8;
        gentry *g = realloc(c->graphs, (size_t)nc * sizeof *g);
        if (!g) return NULL;
        c->graphs = g;
        c->cap_graphs = nc;
    }
    c->graphs[c->n_graphs] = (gentry){.key = key};
    return &c->graphs[c->n_graphs++];
}

static const float *cu_graph_replay(di_backend *be, uint64_t key, const void *meta, size_t bytes) {
    cuda_impl *c = IM(be);
    op_enter(be, "graph_replay");
    gentry *e = graph_find(c, key, 0);
    if (!e || !e->exec || c->status) return NULL;
    if (e->gen != c->gen || e->meta_bytes != bytes) { /* stale: record it again */
        graph_drop(e);
        return NULL;
    }
    di_err err = {0};
    di_status st = cuda_stage_upload(c->stage, e->meta, meta, bytes, &err);
    if (!st) st = cuda_graph_launch(e->exec, &err);
    note(be, st, &err);
    if (st) return NULL;
    c->n_replayed++;
    return e->logits;
}

static void *cu_graph_record_begin(di_backend *be, uint64_t key, const void *meta, size_t bytes) {
    cuda_impl *c = IM(be);
    op_enter(be, "graph_record");
    if (c->prof || c->status || c->rec || c->no_capture) return NULL;
    gentry *e = graph_find(c, key, 1);
    if (!e || e->failed || e->seen++ == 0) return NULL; /* the first step of a key runs eagerly */
    if (e->exec) graph_drop(e); /* stale (graph_replay said so) */
    e->seen = 2;
    di_err err = {0};
    e->meta = arena_alloc(be, e, bytes);
    di_status st = e->meta ? cuda_stage_upload(c->stage, e->meta, meta, bytes, &err) : DI_ERR_NOMEM;
    if (!st) st = cuda_graph_begin(&err);
    if (st) { /* not recordable (kernels on the legacy stream: none is) */
        graph_drop(e);
        e->failed = 1;
        c->n_failed++;
        if (st == DI_ERR_UNSUPPORTED) c->no_capture = 1;
        return NULL;
    }
    e->meta_bytes = bytes;
    e->gen = c->gen;
    c->rec = e;
    c->cap_st = DI_OK;
    c->ops.alloc = cu_alloc_rec;
    return e->meta;
}

static int cu_graph_record_end(di_backend *be, const float *logits) {
    cuda_impl *c = IM(be);
    gentry *e = c->rec;
    if (!e) return 1;
    side_join(be);    /* a capture ends with every fork joined */
    copies_flush(be); /* the queued copies belong to the step */
    c->ops.alloc = cu_alloc;
    di_err err = {0};
    void *exec = NULL;
    di_status st = cuda_graph_end(&exec, &err);
    c->rec = NULL;
    if (!st && c->cap_st) {
        st = c->cap_st;
        err = c->cap_err;
    }
    if (!st && e->gen != c->gen) st = DI_ERR_STATE; /* a scratch slot moved while recording */
    if (!st && !logits) st = DI_ERR_STATE;          /* the step was abandoned */
    if (st) {
        /* keep the arena: the step's buffers are still to be freed into it */
        cuda_graph_free(exec);
        e->failed = 1;
        c->n_failed++;
        return 1;
    }
    e->exec = exec;
    e->logits = logits;
    st = cuda_graph_launch(exec, &err);
    note(be, st, &err);
    c->n_recorded++;
    return 0;
}

long di_backend_cuda_side_count(const di_backend *be) { return ((const cuda_impl *)be->impl)->n_side; }

void di_backend_cuda_graph_stats(const di_backend *be, long *recorded, long *replayed,
                                 long *failed) {
    const cuda_impl *c = be->impl;
    *recorded = c->n_recorded;
    *replayed = c->n_replayed;
    *failed = c->n_failed;
}

/* ------------------------------------------------------------ lifetime */

static void cu_destroy(di_backend *be) {
    cuda_impl *c = IM(be);
    if (c) {
        side_join(be);
        copies_flush(be);
        di_err err = {0};
        if (c->side) di_cuda_synchronize(&err); /* its work done before the stream goes */
        cuda_side_destroy(c->side, c->side_fork, c->side_join);
        c->side = NULL;
        di_backend_cuda_weights_drop(be);
        graphs_free(c);
        cuda_blas_free(c->blas);
        for (int i = 0; i < N_SCRATCH; i++) di_cuda_free(c->scr[i]);
        pool_trim(c);
        for (size_t i = 0; i < c->live_cap; i++) di_cuda_free(c->live[i].p);
        free(c->live);
        free(c->freel);
        free(c->cq);
        free(c->host_buf);
        di_cuda_timeline_free(c->tl);
        free(c->tl_op);
        di_err e = {0};
        di_cuda_synchronize(&e); /* queued staged copies still read the staging buffer */
        cuda_stage_free(c->stage);
        cuda_pinned_free(c->pinned);
        di_threadpool_destroy(c->gather_pool);
        if (c->cpu) di_backend_destroy(c->cpu);
        free(c);
    }
    free(be);
}

static di_status cu_status(di_backend *be, di_err *err) { return di_backend_cuda_status(be, err); }

/* The setting is the backend's; the kernel launchers read it from the
 * thread that runs the op (op_enter hands it over). */
static void cu_set_batch_invariant(di_backend *be, int on) {
    IM(be)->batch_invariant = on != 0;
    di_cuda_set_batch_invariant(on);
}

/* An offline job on a GPU wants large steps: the products stream their
 * weights once a step whatever its rows, so a step of 1,024 sequences
 * takes ~4x one of 64 on an H200 and makes 3.8x the tokens a second
 * (bench/RESULTS.md, run 154: the engine at 64 and 1,024 sequences), and prefill
 * chunks of 16,384 tokens run the FP8 products near their large-shape
 * rate. Per-sequence state gets half of the device memory the weights
 * leave; the other half is for the step's scratch, which grows with its
 * tokens. */
static void cu_engine_defaults(di_backend *be, uint64_t weight_bytes, di_backend_defaults *d) {
    cuda_impl *c = IM(be);
    di_cuda_device_info info;
    di_err err = {0};
    d->max_batch = 1024;
    d->step_tokens = 16384;
    if (di_cuda_device_info_get(c->device, &info, &err) || !info.free_mem) return; /* keep the CPU's */
    uint64_t pending = weight_bytes > c->wbytes ? weight_bytes - c->wbytes : 0;
    uint64_t avail = info.free_mem > pending ? info.free_mem - pending : 0;
    d->state_bytes = avail / 2 > (256ull << 20) ? avail / 2 : 256ull << 20;
}

static const di_backend_ops cuda_ops = {
    .name = "cuda",
    .alloc = cu_alloc,
    .alloc_raw = cu_alloc_raw,
    .free = cu_free,
    .upload = cu_upload,
    .download = cu_download,
    .host_alloc = cu_host_alloc,
    .host_free = cu_host_free,
    .copy = cu_copy,
    .matmul = cu_matmul,
    .matmul_pair = cu_matmul_pair,
    .swiglu_matmul_add = cu_swiglu_matmul_add,
    .matmul_grouped = cu_matmul_grouped,
    .rmsnorm = cu_rmsnorm,
    .rope = cu_rope,
    .rope_cs = cu_rope_cs,
    .qkv_rope_pack = cu_qkv_rope_pack,
    .qdq_fp8 = cu_qdq_fp8,
    .qdq_fp4_e8m0 = cu_qdq_fp4_e8m0,
    .qdq_fp4_e4m3 = cu_qdq_fp4_e4m3,
    .round_bf16 = cu_round_bf16,
    .scale_bf16 = cu_scale_bf16,
    .embed = cu_embed,
    .embed_buf = cu_embed_buf,
    .engram_gather = cu_engram_gather,
    .hc_mix = cu_hc_mix,
    .hc_collapse = cu_hc_collapse,
    .hc_collapse_norm = cu_hc_collapse_norm,
    .hc_expand = cu_hc_expand,
    .hc_mean = cu_hc_mean,
    .engram_gate = cu_engram_gate,
    .compress_pool = cu_compress_pool,
    .sparse_attn = cu_sparse_attn,
    .index_scores = cu_index_scores,
    .kv_pack = cu_kv_pack,
    .sparse_attn_kv = cu_sparse_attn_kv,
    .index_scores_kv = cu_index_scores_kv,
    .candidate_blocks = cu_candidate_blocks,
    .restrict_blocks = cu_restrict_blocks,
    .topk_select = cu_topk_select,
    .index_scores_kv_buf = cu_index_scores_kv_buf,
    .candidate_blocks_buf = cu_candidate_blocks_buf,
    .restrict_blocks_buf = cu_restrict_blocks_buf,
    .topk_select_buf = cu_topk_select_buf,
    .sparse_attn_rows = cu_sparse_attn_rows,
    .moe_route = cu_moe_route,
    .moe_route_buf = cu_moe_route_buf,
    .moe_experts = cu_moe_experts,
    .swiglu = cu_swiglu,
    .gather_rows = cu_gather_rows,
    .gather_rows_buf = cu_gather_rows_buf,
    .engram_rows = cu_engram_rows,
    .scatter_rows_to = cu_scatter_rows_to,
    .gather_rows_from = cu_gather_rows_from,
    .scatter_add_rows = cu_scatter_add_rows,
    .add = cu_add,
    .add_bf16 = cu_add_bf16,
    .logits_greedy = cu_logits_greedy,
    .logits_top = cu_logits_top,
    .logits_pick = cu_logits_pick,
    .logits_draw = cu_logits_draw,
    .destroy = cu_destroy,
    .status = cu_status,
    .set_batch_invariant = cu_set_batch_invariant,
    .engine_defaults = cu_engine_defaults,
};

/* Whether the environment variable name is set to exactly val (the
 * backend's switches below). */
static int env_is(const char *name, const char *val) {
    const char *v = getenv(name);
    return v && !strcmp(v, val);
}

di_status di_backend_cuda_create(int device, di_backend **out, di_err *err) {
    *out = NULL;
    di_status st = di_cuda_init(device, err);
    if (st) return st;
    di_backend *be = calloc(1, sizeof *be);
    cuda_impl *c = calloc(1, sizeof *c);
    if (!be || !c) {
        free(be);
        free(c);
        return di_err_set(err, DI_ERR_NOMEM, "cuda backend: out of memory");
    }
    c->device = device;
    c->use_pool = !env_is("DI_CUDA_POOL", "0");
    const char *v = getenv("DI_CUDA_PROFILE");
    c->prof_events = v && !strcmp(v, "events");
    c->prof = v && *v && strcmp(v, "0") && !c->prof_events;
    c->cq = calloc(1, sizeof *c->cq);
    if (!c->cq) {
        free(be);
        free(c);
        return di_err_set(err, DI_ERR_NOMEM, "cuda backend: out of memory");
    }
    c->ops = cuda_ops;
    /* DI_CUDA_DEVICE_SELECT=0: the host forms of the selection path and
     * of the step's per-row metadata */
    if (env_is("DI_CUDA_DEVICE_SELECT", "0")) {
        c->ops.index_scores_kv_buf = NULL;
        c->ops.candidate_blocks_buf = NULL;
        c->ops.restrict_blocks_buf = NULL;
        c->ops.topk_select_buf = NULL;
        c->ops.sparse_attn_rows = NULL;
        c->ops.rope_cs = NULL;
        c->ops.qkv_rope_pack = NULL;
        c->ops.embed_buf = NULL;
        c->ops.gather_rows_buf = NULL;
        c->ops.scatter_rows_to = NULL;
        c->ops.gather_rows_from = NULL;
        c->ops.engram_rows = NULL;
    }
    /* DI_CUDA_GRAPH=1: decode steps recorded as CUDA graphs and replayed
     * (needs the kernels built with --default-stream per-thread; without,
     * every key's recording fails once and its steps run eagerly) */
    if (env_is("DI_CUDA_GRAPH", "1")) {
        c->ops.graph_replay = cu_graph_replay;
        c->ops.graph_record_begin = cu_graph_record_begin;
        c->ops.graph_record_end = cu_graph_record_end;
        c->ops.free = cu_free_rec;
        c->ops.upload = cu_upload_rec;
    }
    /* DI_CUDA_MOE_GROUPED=0: the model's per-expert loop with host routing
     * (for comparisons; the grouped op gives the loop's bits) */
    if (env_is("DI_CUDA_MOE_GROUPED", "0")) {
        c->ops.moe_route_buf = NULL;
        c->ops.moe_experts = NULL;
    }
    /* DI_CUDA_PAIR=0: every pair (an expert's w1 and w3, attention's wq_a
     * and wkv, the compressor's wkv and wgate) as two products (timing; a
     * quantizing FP8 pair's outputs may then differ in their last bits:
     * its k split counts both matrices) */
    if (env_is("DI_CUDA_PAIR", "0")) c->ops.matmul_pair = NULL;
    /* DI_CUDA_FUSE=0: the model's unfused op sequences in place of the
     * fused ops (matmul_pair, hc_collapse_norm, qkv_rope_pack, add_bf16, swiglu_matmul_add), the MoE's separate
     * launches (cuda_moe_set_fused) and zero-filled buffers in place of
     * alloc_raw: for timing; the same bits but where a quantizing FP8
     * pair's two products then split k differently (DI_CUDA_PAIR above) */
    if (env_is("DI_CUDA_FUSE", "0")) {
        c->ops.matmul_pair = NULL;
        c->ops.swiglu_matmul_add = NULL;
        c->ops.hc_collapse_norm = NULL;
        c->ops.add_bf16 = NULL;
        c->ops.qkv_rope_pack = NULL;
        c->ops.alloc_raw = NULL;
        cuda_moe_set_fused(0);
    }
    /* DI_CUDA_HC_SIDE=0: hc_mix on the main stream (timing); a side stream
     * that cannot be made leaves it there too */
    if (!env_is("DI_CUDA_HC_SIDE", "0")) {
        di_err serr = {0};
        if (cuda_side_create(&c->side, &c->side_fork, &c->side_join, &serr)) c->side = NULL;
    }
    be->ops = &c->ops;
    be->n_threads = 1;
    be->impl = c;
    /* one thread: the host-result ops work on small downloaded inputs */
    if ((st = cuda_stage_init(&c->stage, (size_t)64 << 20, err))) {
        cu_destroy(be);
        return di_err_prefix(err, "cuda backend");
    }
    if ((st = di_backend_cpu_create(1, &c->cpu, err))) {
        cu_destroy(be);
        return di_err_prefix(err, "cuda backend");
    }
    *out = be;
    return DI_OK;
}

di_status di_backend_cuda_status(di_backend *be, di_err *err) {
    cuda_impl *c = IM(be);
    copies_flush(be);
    if (!c->status) {
        di_err e = {0};
        di_status st = di_cuda_synchronize(&e);
        const char *op = c->op;
        c->op = "a kernel queued before this check";
        note(be, st, &e);
        c->op = op;
    }
    if (c->status && err) *err = c->err;
    return c->status;
}

static int prof_cmp(const void *a, const void *b) {
    double x = ((const prof_entry *)a)->s, y = ((const prof_entry *)b)->s;
    return (x < y) - (x > y);
}

size_t di_backend_cuda_profile(di_backend *be, char *buf, size_t cap) {
    cuda_impl *c = IM(be);
    if (c->prof == 2) { /* a second call (the length first, then the text) finds no events */
        copies_flush(be);
        if (c->tl && c->tl_op[0]) {
            prof_event(be, "(profile)");
            c->ev_host = now_s() - c->prof_t; /* issuing the pass, before waiting for it */
            prof_events_charge(be);
        }
    } else {
        op_enter(be, "(profile)"); /* charges the last op */
    }
    prof_entry t[PROF_MAX];
    int n = 0;
    double total = 0;
    for (int i = 0; i < c->prof_n; i++)
        if (c->prof_tab[i].calls && strcmp(c->prof_tab[i].op, "(profile)")) {
            t[n++] = c->prof_tab[i];
            total += c->prof_tab[i].s;
        }
    qsort(t, (size_t)n, sizeof *t, prof_cmp);
    size_t len = 0;
#define PUT(...)                                                                   \
    do {                                                                           \
        int k_ = snprintf(buf ? buf + len : NULL, len < cap ? cap - len : 0, __VA_ARGS__); \
        if (k_ > 0) len += (size_t)k_;                                             \
    } while (0)
    PUT("%-22s %10s %8s %10s %6s\n", "op", "ms", "calls", "us/call", "%");
    for (int i = 0; i < n; i++)
        PUT("%-22s %10.3f %8ld %10.2f %6.1f\n", t[i].op, 1e3 * t[i].s, t[i].calls,
            1e6 * t[i].s / (double)t[i].calls, total > 0 ? 100 * t[i].s / total : 0);
    PUT("%-22s %10.3f\n", "total", 1e3 * total);
    if (c->prof == 2)
        PUT("events: %d op entries; device time from the first to the last %.3f ms, host time to issue them %.3f ms\n", c->ev_n,
            1e3 * c->ev_dev, 1e3 * c->ev_host);
    PUT("buffers: %ld cudaMalloc, pool %s, %.1f MiB held; copies: %ld in %ld launches; weights %.1f MiB\n",
        c->n_malloc, c->use_pool ? "on" : "off", (double)c->pool_bytes / 1048576.0, c->n_copies,
        c->n_copy_batches, (double)c->wbytes / 1048576.0);
#undef PUT
    return len;
}

void di_backend_cuda_profile_start(di_backend *be, int on) {
    cuda_impl *c = IM(be);
    c->prof = on ? 1 : 0;
    if (on && c->prof_events) {
        di_err err = {0};
        if (!c->tl && !di_cuda_timeline_create(&c->tl, PROF_EVENTS, &err)) {
            c->tl_op = calloc(PROF_EVENTS, sizeof *c->tl_op);
            if (!c->tl_op) {
                di_cuda_timeline_free(c->tl);
                c->tl = NULL;
            }
        }
        if (c->tl) {
            c->prof = 2;
            di_cuda_timeline_reset(c->tl);
            memset(c->tl_op, 0, PROF_EVENTS * sizeof *c->tl_op);
            c->ev_dev = c->ev_host = 0;
            c->ev_n = 0;
        }
    }
    c->prof_n = 0;
    c->prof_op = NULL;
    c->n_malloc = c->n_copies = c->n_copy_batches = 0;
}

#else
typedef int di_backend_cuda_unused; /* ISO C wants a non-empty translation unit */
#endif
