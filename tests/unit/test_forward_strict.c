/* Decode steps that read nothing back on the host between ops (issue 7's
 * condition for capturing a step in a CUDA graph): the forward runs through
 * a "strict" wrapper of the CPU backend whose buffers are mapped pages that
 * stay inaccessible (PROT_NONE) between ops. Every host access the model
 * makes to backend memory faults; the handler counts it and opens that
 * buffer, so the pass goes on and the test reports how many there were. The
 * wrapper also counts downloads, uploads and calls of the ops that return
 * host arrays (topk_select, candidate_blocks, moe_route), take host tables
 * (sparse_attn_kv, index_scores_kv, restrict_blocks) or per-row host arrays
 * a device backend stages per call (rope's positions, embed's ids,
 * gather_rows' rows).
 *
 * Checked on the golden tiny model (window 128, ratio-2 and ratio-1 kv
 * sources, the candidate pool, Engram layers): a prefill, then decode steps
 * (alone and two sequences batched) past the window's wrap: no fault, no
 * host-result, host-table or host-array op, one upload per pass (the step
 * metadata), no Engram host gather (the rows come with the metadata), no
 * copy into or out of the sequences' state (ring and cache writes and the
 * compressor's group reads go through scatter_rows_to / gather_rows_from
 * with the metadata's slots), score widths in buckets, one download per
 * pass (the logits); the logits equal, bit for bit, those of the host
 * forms (the same wrapper without the backend-memory ops), which in turn
 * must show the calls and copies counted (so the counters can fail), and a
 * deliberate host read of a buffer is caught. */
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "golden_util.h"
#include "backend/cpu/kernels.h"
#include "test.h"

typedef struct sbuf {
    uint8_t *p;
    size_t len;
    int persistent; /* alive when the counted passes began: the sequences' state */
    int64_t id;     /* allocation number */
    int owned;      /* belongs to a recorded step (kept until the end) */
} sbuf;

/* A recording backend on the CPU (backend.h's graph ops, as the CUDA
 * backend's DI_CUDA_GRAPH=1 implements them with CUDA graphs): a recorded
 * step's calls are kept (op and arguments, not run, as a captured launch
 * is not), with every buffer the step allocated; a replay copies the new
 * step metadata into the recorded metadata buffer and runs the calls
 * again. Equal logits prove that nothing a step needs reaches the ops by
 * another way than the metadata. */
struct rcall;
typedef struct rgraph {
    uint64_t key;
    int seen, failed;
    struct rcall *calls;
    int n;
    void *meta;
    size_t bytes;
    const float *logits;
} rgraph;

static struct {
    int enabled;         /* the strict backend has the graph ops */
    int on, failed;      /* recording now; something kept it from being replayable */
    struct rcall *calls; /* of the recording in progress */
    int n, cap;
    rgraph g[32];
    int ng, cur;
    long recorded, replayed, failures;
} REC;

static void rec_alloc(void *p, size_t bytes);
static void rec_copy(void *dst, const void *src, size_t bytes);

/* What the strict backend counts over the decode passes of a run. */
typedef struct strict_counts {
    long downloads, download_bytes, host_results, host_tables, uploads, host_arrays, engram;
    long state_writes, state_reads; /* copies into / out of the sequences' state */
    int64_t widths[64];             /* distinct score widths of the counted passes */
    int n_widths;
} strict_counts;

static struct {
    di_backend be;
    di_backend_ops ops;
    di_backend *cpu;
    sbuf *bufs;
    int n, cap;
    int guard;                   /* buffers closed between ops */
    volatile sig_atomic_t faults; /* host accesses caught */
    strict_counts c;             /* what the counted passes did */
    int count_widths;            /* record score widths (unguarded runs) */
    int record;                  /* hash the op stream of this pass into oph */
    uint64_t oph;
    int64_t next_id, pass_first_id;
} ST;

static size_t page_round(size_t n) {
    size_t pg = (size_t)sysconf(_SC_PAGESIZE);
    return (n + pg - 1) / pg * pg;
}

static void protect_all(int prot) {
    for (int i = 0; i < ST.n; i++) mprotect(ST.bufs[i].p, ST.bufs[i].len, prot);
}

static void on_segv(int sig, siginfo_t *si, void *uc) {
    (void)uc;
    uint8_t *a = si->si_addr;
    for (int i = 0; i < ST.n; i++)
        if (a >= ST.bufs[i].p && a < ST.bufs[i].p + ST.bufs[i].len) {
            ST.faults++;
            mprotect(ST.bufs[i].p, ST.bufs[i].len, PROT_READ | PROT_WRITE);
            return; /* the access is retried and now succeeds */
        }
    signal(sig, SIG_DFL); /* not ours: fault again, for real */
}

static const char *const HOST_RESULT[] = {"topk_select", "candidate_blocks", "moe_route"};
static const char *const HOST_TABLE[] = {"sparse_attn_kv", "index_scores_kv", "restrict_blocks"};
static const char *const HOST_ARRAY[] = {"rope", "embed", "gather_rows"};

static void op_in(const char *name) {
    for (size_t i = 0; i < sizeof HOST_RESULT / sizeof *HOST_RESULT; i++)
        ST.c.host_results += !strcmp(name, HOST_RESULT[i]);
    for (size_t i = 0; i < sizeof HOST_TABLE / sizeof *HOST_TABLE; i++)
        ST.c.host_tables += !strcmp(name, HOST_TABLE[i]);
    for (size_t i = 0; i < sizeof HOST_ARRAY / sizeof *HOST_ARRAY; i++)
        ST.c.host_arrays += !strcmp(name, HOST_ARRAY[i]);
    ST.c.engram += !strcmp(name, "engram_gather");
    ST.c.uploads += !strcmp(name, "upload");
    if (ST.guard) protect_all(PROT_READ | PROT_WRITE);
}

static void op_out(void) {
    if (ST.guard) protect_all(PROT_NONE);
}

/* ---- the op stream of a pass, canonical: op names, their scalar
 * arguments, and pointers as (buffer, offset) where the buffer is the
 * sequences' state (by allocation number) or this pass's own (by its
 * allocation number counted from the pass's first); other pointers (host
 * structs, weights) count as one value. Passes whose streams hash equal
 * issue the same ops on the same shapes and buffers: a graph captured for
 * one replays the other with its step metadata. */
static void oh_u64(uint64_t v) {
    for (int i = 0; i < 8; i++) {
        ST.oph ^= (v >> (8 * i)) & 0xffu;
        ST.oph *= 0x100000001b3ull;
    }
}
static void oh_str(const char *t) {
    while (*t) oh_u64((unsigned char)*t++);
    oh_u64(0);
}
static void oh_p(const void *p) {
    for (int i = 0; i < ST.n; i++)
        if ((const uint8_t *)p >= ST.bufs[i].p && (const uint8_t *)p < ST.bufs[i].p + ST.bufs[i].len) {
            oh_u64(ST.bufs[i].persistent ? 'P' : 'T');
            oh_u64((uint64_t)(ST.bufs[i].persistent ? ST.bufs[i].id : ST.bufs[i].id - ST.pass_first_id));
            oh_u64((uint64_t)((const uint8_t *)p - ST.bufs[i].p));
            return;
        }
    oh_u64(p ? 'H' : 0);
}
static void oh_i(long long v) { oh_u64((uint64_t)v); }
static void oh_d(double v) {
    uint64_t b;
    memcpy(&b, &v, sizeof b);
    oh_u64(b);
}
#define OH_ARG(x)                                                                          \
    _Generic((x), float: oh_d, double: oh_d, int: oh_i, unsigned: oh_i, long: oh_i,        \
             unsigned long: oh_i, long long: oh_i, default: oh_p)(x);
#define OH_1(x) OH_ARG(x)
#define OH_2(x, ...) OH_ARG(x) OH_1(__VA_ARGS__)
#define OH_3(x, ...) OH_ARG(x) OH_2(__VA_ARGS__)
#define OH_4(x, ...) OH_ARG(x) OH_3(__VA_ARGS__)
#define OH_5(x, ...) OH_ARG(x) OH_4(__VA_ARGS__)
#define OH_6(x, ...) OH_ARG(x) OH_5(__VA_ARGS__)
#define OH_7(x, ...) OH_ARG(x) OH_6(__VA_ARGS__)
#define OH_8(x, ...) OH_ARG(x) OH_7(__VA_ARGS__)
#define OH_9(x, ...) OH_ARG(x) OH_8(__VA_ARGS__)
#define OH_10(x, ...) OH_ARG(x) OH_9(__VA_ARGS__)
#define OH_11(x, ...) OH_ARG(x) OH_10(__VA_ARGS__)
#define OH_12(x, ...) OH_ARG(x) OH_11(__VA_ARGS__)
#define OH_13(x, ...) OH_ARG(x) OH_12(__VA_ARGS__)
#define OH_14(x, ...) OH_ARG(x) OH_13(__VA_ARGS__)
#define OH_15(x, ...) OH_ARG(x) OH_14(__VA_ARGS__)
#define OH_PICK(_1, _2, _3, _4, _5, _6, _7, _8, _9, _10, _11, _12, _13, _14, _15, NAME, ...) NAME
#define OH_ARGS(...)                                                                        \
    OH_PICK(__VA_ARGS__, OH_15, OH_14, OH_13, OH_12, OH_11, OH_10, OH_9, OH_8, OH_7, OH_6,  \
            OH_5, OH_4, OH_3, OH_2, OH_1)(__VA_ARGS__)

static void *s_alloc(di_backend *be, size_t bytes) {
    (void)be;
    if (ST.n == ST.cap) {
        int nc = ST.cap ? 2 * ST.cap : 256;
        sbuf *nb = realloc(ST.bufs, (size_t)nc * sizeof *nb);
        if (!nb) return NULL;
        ST.bufs = nb;
        ST.cap = nc;
    }
    size_t len = page_round(bytes ? bytes : 1);
    void *p = mmap(NULL, len, ST.guard ? PROT_NONE : PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return NULL;
    ST.bufs[ST.n++] = (sbuf){p, len, 0, ST.next_id++, REC.on};
    if (REC.on) rec_alloc(p, bytes);
    if (ST.record) {
        oh_str("alloc");
        oh_u64(bytes);
    }
    return p;
}

static void s_free(di_backend *be, void *p) {
    (void)be;
    if (ST.record) {
        oh_str("free");
        oh_p(p);
    }
    for (int i = 0; i < ST.n; i++)
        if (ST.bufs[i].p == p) {
            if (ST.bufs[i].owned) return; /* the recording's */
            munmap(p, ST.bufs[i].len);
            ST.bufs[i] = ST.bufs[--ST.n];
            return;
        }
}

static void s_upload(di_backend *be, void *dst, const void *src, size_t bytes) {
    if (ST.record) {
        oh_str("upload");
        OH_ARGS(dst, bytes)
    }
    if (REC.on) { /* a replay would not have these bytes */
        REC.failed = 1;
        return;
    }
    op_in("upload");
    ST.cpu->ops->upload(ST.cpu, dst, src, bytes);
    op_out();
}

static void s_download(di_backend *be, void *dst, const void *src, size_t bytes) {
    if (ST.record) {
        oh_str("download");
        OH_ARGS(src, bytes)
    }
    if (REC.on) { /* nothing has run while recording */
        REC.failed = 1;
        return;
    }
    op_in("download");
    ST.c.downloads++;
    ST.c.download_bytes += (long)bytes;
    ST.cpu->ops->download(ST.cpu, dst, src, bytes);
    op_out();
}

/* Whether p lies in a buffer of the sequences' state. */
static int in_state(const void *p) {
    for (int i = 0; i < ST.n; i++)
        if ((const uint8_t *)p >= ST.bufs[i].p && (const uint8_t *)p < ST.bufs[i].p + ST.bufs[i].len)
            return ST.bufs[i].persistent;
    return 0;
}

static void s_copy(di_backend *be, void *dst, const void *src, size_t bytes) {
    if (in_state(dst)) ST.c.state_writes++;
    else if (in_state(src)) ST.c.state_reads++;
    if (ST.record) {
        oh_str("copy");
        OH_ARGS(dst, src, bytes)
    }
    if (REC.on) {
        rec_copy(dst, src, bytes);
        return;
    }
    op_in("copy");
    ST.cpu->ops->copy(ST.cpu, dst, src, bytes);
    op_out();
}

/* Every op of the table but memory, as W(name, params, args). */
#define STRICT_OPS(W) \
    W(matmul, (di_backend *be, const di_wmat *w, const float *x, int64_t m, float *y, unsigned flags), (ST.cpu, w, x, m, y, flags)) \
    W(matmul_grouped, (di_backend *be, const di_wmat *w, int groups, const float *x, int64_t m, float *y), (ST.cpu, w, groups, x, m, y)) \
    W(rmsnorm, (di_backend *be, const float *x, const di_tensor *w, int64_t m, int64_t n, double eps, float *y), (ST.cpu, x, w, m, n, eps, y)) \
    W(rope, (di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd, const int32_t *pos, const float *freq, int inverse), (ST.cpu, x, m, stride, heads, hd, rd, pos, freq, inverse)) \
    W(qdq_fp8, (di_backend *be, float *x, int64_t n), (ST.cpu, x, n)) \
    W(qdq_fp4_e8m0, (di_backend *be, float *x, int64_t n), (ST.cpu, x, n)) \
    W(qdq_fp4_e4m3, (di_backend *be, float *x, int64_t n), (ST.cpu, x, n)) \
    W(round_bf16, (di_backend *be, float *x, int64_t n), (ST.cpu, x, n)) \
    W(scale_bf16, (di_backend *be, float *x, int64_t n, float c), (ST.cpu, x, n, c)) \
    W(embed, (di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m, float *out), (ST.cpu, table, ids, m, out)) \
    W(engram_gather, (di_backend *be, const di_tensor *rows, const di_tensor *scales, const int32_t *ids, int64_t m, int ncols, float *out), (ST.cpu, rows, scales, ids, m, ncols, out)) \
    W(hc_mix, (di_backend *be, const float *s, int64_t m, int hc, int64_t d, const float *fn, const float *base, const float *scale, double norm_eps, double hc_eps, int iters, float *pre, float *post, float *comb), (ST.cpu, s, m, hc, d, fn, base, scale, norm_eps, hc_eps, iters, pre, post, comb)) \
    W(hc_collapse, (di_backend *be, const float *s, const float *w, int64_t m, int hc, int64_t d, float *y), (ST.cpu, s, w, m, hc, d, y)) \
    W(hc_expand, (di_backend *be, const float *y, const float *s, const float *post, const float *comb, int64_t m, int hc, int64_t d, float *out), (ST.cpu, y, s, post, comb, m, hc, d, out)) \
    W(hc_mean, (di_backend *be, const float *s, int64_t m, int hc, int64_t d, float *out, int64_t out_stride), (ST.cpu, s, m, hc, d, out, out_stride)) \
    W(engram_gate, (di_backend *be, float *s, const float *kv, const di_tensor *qw, const di_tensor *kw, int64_t m, int hc, int64_t d, double eps), (ST.cpu, s, kv, qw, kw, m, hc, d, eps)) \
    W(compress_pool, (di_backend *be, const float *a, const float *g, int64_t m, int r, int64_t n, float *out), (ST.cpu, a, g, m, r, n, out)) \
    W(sparse_attn, (di_backend *be, const float *q, int64_t m, int h, int64_t d, const di_kvrow *rows, int n_slots, const float *sink, float scale, float *out), (ST.cpu, q, m, h, d, rows, n_slots, sink, scale, out)) \
    W(index_scores, (di_backend *be, const float *q, const float *w, int64_t m, int hi, int64_t di, const float *const *keys, const int32_t *n_vis, int64_t width, float *out), (ST.cpu, q, w, m, hi, di, keys, n_vis, width, out)) \
    W(kv_pack, (di_backend *be, di_kvq fmt, const float *x, int64_t m, int64_t n, uint8_t *out), (ST.cpu, fmt, x, m, n, out)) \
    W(sparse_attn_kv, (di_backend *be, const float *q, int64_t m, int h, int64_t d, const uint8_t *const *rows, int n_slots, int n_win, const float *sink, float scale, float *out), (ST.cpu, q, m, h, d, rows, n_slots, n_win, sink, scale, out)) \
    W(index_scores_kv, (di_backend *be, const float *q, const float *w, int64_t m, int hi, int64_t di, const uint8_t *const *keys, const int32_t *n_vis, int64_t width, float *out), (ST.cpu, q, w, m, hi, di, keys, n_vis, width, out)) \
    W(candidate_blocks, (di_backend *be, const float *scores, const int32_t *n_vis, int64_t m, int64_t width, int topk_blocks, int bs, int32_t *blocks), (ST.cpu, scores, n_vis, m, width, topk_blocks, bs, blocks)) \
    W(restrict_blocks, (di_backend *be, float *scores, const int32_t *blocks, int64_t m, int64_t width, int topk_blocks, int bs), (ST.cpu, scores, blocks, m, width, topk_blocks, bs)) \
    W(index_scores_kv_buf, (di_backend *be, const float *q, const float *w, int64_t m, int hi, int64_t di, const uint8_t *const *keys, const int32_t *n_vis, int64_t width, float *out), (ST.cpu, q, w, m, hi, di, keys, n_vis, width, out)) \
    W(candidate_blocks_buf, (di_backend *be, const float *scores, const int32_t *n_vis, int64_t m, int64_t width, int topk_blocks, int bs, int32_t *blocks), (ST.cpu, scores, n_vis, m, width, topk_blocks, bs, blocks)) \
    W(restrict_blocks_buf, (di_backend *be, float *scores, const int32_t *blocks, int64_t m, int64_t width, int topk_blocks, int bs), (ST.cpu, scores, blocks, m, width, topk_blocks, bs)) \
    W(rope_cs, (di_backend *be, float *x, int64_t m, int64_t stride, int heads, int64_t hd, int64_t rd, const float *cs, int inverse), (ST.cpu, x, m, stride, heads, hd, rd, cs, inverse)) \
    W(embed_buf, (di_backend *be, const di_tensor *table, const int32_t *ids, int64_t m, float *out), (ST.cpu, table, ids, m, out)) \
    W(gather_rows_buf, (di_backend *be, const float *src, const int32_t *rows, int64_t m, int64_t n, float *dst), (ST.cpu, src, rows, m, n, dst)) \
    W(scatter_rows_to, (di_backend *be, const void *src, size_t src_stride, int64_t m, const uint8_t *const *base, const int32_t *slot, size_t dst_off, size_t dst_stride, size_t bytes), (ST.cpu, src, src_stride, m, base, slot, dst_off, dst_stride, bytes)) \
    W(engram_rows, (di_backend *be, const uint8_t *rows, const uint8_t *scales, int64_t n, int64_t eh, int64_t nb, float *out), (ST.cpu, rows, scales, n, eh, nb, out)) \
    W(gather_rows_from, (di_backend *be, void *dst, size_t dst_stride, int64_t m, const uint8_t *const *base, const int32_t *slot, size_t src_off, size_t src_stride, size_t bytes), (ST.cpu, dst, dst_stride, m, base, slot, src_off, src_stride, bytes)) \
    W(moe_route, (di_backend *be, const float *logits, const float *bias, int64_t m, int e, int k, int normalize, float route_scale, int32_t *idx, float *w), (ST.cpu, logits, bias, m, e, k, normalize, route_scale, idx, w)) \
    W(moe_route_buf, (di_backend *be, const float *logits, const float *bias, int64_t m, int e, int k, int normalize, float route_scale, int32_t *idx, float *w), (ST.cpu, logits, bias, m, e, k, normalize, route_scale, idx, w)) \
    W(swiglu, (di_backend *be, const float *g, const float *u, const float *w, int64_t m, int64_t n, float limit, float *out), (ST.cpu, g, u, w, m, n, limit, out)) \
    W(gather_rows, (di_backend *be, const float *src, const int32_t *rows, int64_t m, int64_t n, float *dst), (ST.cpu, src, rows, m, n, dst)) \
    W(scatter_add_rows, (di_backend *be, float *dst, const int32_t *rows, const float *src, int64_t m, int64_t n), (ST.cpu, dst, rows, src, m, n)) \
    W(add, (di_backend *be, float *y, const float *x, int64_t n), (ST.cpu, y, x, n))

/* ---- the recorded calls: per op of STRICT_OPS an argument struct (its
 * parameters as fields) and a function running the call again from it */
#define SM_1(x) x;
#define SM_2(x, ...) x; SM_1(__VA_ARGS__)
#define SM_3(x, ...) x; SM_2(__VA_ARGS__)
#define SM_4(x, ...) x; SM_3(__VA_ARGS__)
#define SM_5(x, ...) x; SM_4(__VA_ARGS__)
#define SM_6(x, ...) x; SM_5(__VA_ARGS__)
#define SM_7(x, ...) x; SM_6(__VA_ARGS__)
#define SM_8(x, ...) x; SM_7(__VA_ARGS__)
#define SM_9(x, ...) x; SM_8(__VA_ARGS__)
#define SM_10(x, ...) x; SM_9(__VA_ARGS__)
#define SM_11(x, ...) x; SM_10(__VA_ARGS__)
#define SM_12(x, ...) x; SM_11(__VA_ARGS__)
#define SM_13(x, ...) x; SM_12(__VA_ARGS__)
#define SM_14(x, ...) x; SM_13(__VA_ARGS__)
#define SM_15(x, ...) x; SM_14(__VA_ARGS__)
#define SM(...) OH_PICK(__VA_ARGS__, SM_15, SM_14, SM_13, SM_12, SM_11, SM_10, SM_9, SM_8, SM_7, \
                        SM_6, SM_5, SM_4, SM_3, SM_2, SM_1)(__VA_ARGS__)
#define PF_1(x) p->x
#define PF_2(x, ...) p->x, PF_1(__VA_ARGS__)
#define PF_3(x, ...) p->x, PF_2(__VA_ARGS__)
#define PF_4(x, ...) p->x, PF_3(__VA_ARGS__)
#define PF_5(x, ...) p->x, PF_4(__VA_ARGS__)
#define PF_6(x, ...) p->x, PF_5(__VA_ARGS__)
#define PF_7(x, ...) p->x, PF_6(__VA_ARGS__)
#define PF_8(x, ...) p->x, PF_7(__VA_ARGS__)
#define PF_9(x, ...) p->x, PF_8(__VA_ARGS__)
#define PF_10(x, ...) p->x, PF_9(__VA_ARGS__)
#define PF_11(x, ...) p->x, PF_10(__VA_ARGS__)
#define PF_12(x, ...) p->x, PF_11(__VA_ARGS__)
#define PF_13(x, ...) p->x, PF_12(__VA_ARGS__)
#define PF_14(x, ...) p->x, PF_13(__VA_ARGS__)
#define PF(...) OH_PICK(__VA_ARGS__, PF_15, PF_14, PF_13, PF_12, PF_11, PF_10, PF_9, PF_8, PF_7, \
                        PF_6, PF_5, PF_4, PF_3, PF_2, PF_1)(__VA_ARGS__)
#define UNP(...) __VA_ARGS__
#define REST(first, ...) __VA_ARGS__

#define ARGS_T(name, params, args) typedef struct { SM params } a_##name;
STRICT_OPS(ARGS_T)
#undef ARGS_T
#define RUN_F(name, params, args) \
    static void rp_##name(const a_##name *p) { ST.cpu->ops->name(ST.cpu, PF(REST args)); }
STRICT_OPS(RUN_F)
#undef RUN_F

typedef struct a_rows { /* sparse_attn_rows, its tables by value */
    const float *q, *sink;
    int64_t m, d;
    int h;
    di_attn_rows t;
    float scale, *out;
} a_rows;
typedef struct a_moe { /* moe_experts, its experts by value */
    di_moe_experts ex;
    const float *x, *w;
    int64_t m;
    const int32_t *idx;
    int k;
    unsigned mm;
    float limit, *out;
} a_moe;
typedef struct a_topk {
    const float *scores;
    const int32_t *n_vis;
    int64_t m, width;
    int k, buf;
    int32_t *idx;
} a_topk;
typedef struct a_mem {
    void *dst;
    const void *src;
    size_t bytes;
} a_mem;

#define OPID(name, params, args) OP_##name,
enum { STRICT_OPS(OPID) OP_ROWS, OP_MOE, OP_TOPK, OP_ALLOC, OP_COPY };
#undef OPID

typedef struct rcall {
    int op;
    union {
#define UF(name, params, args) a_##name name;
        STRICT_OPS(UF)
#undef UF
        a_rows rows;
        a_moe moe;
        a_topk topk;
        a_mem mem;
    } u;
} rcall;

static rcall *rec_push(int op) {
    if (REC.n == REC.cap) {
        int nc = REC.cap ? 2 * REC.cap : 1024;
        rcall *c = realloc(REC.calls, (size_t)nc * sizeof *c);
        if (!c) {
            REC.failed = 1;
            return NULL;
        }
        REC.calls = c;
        REC.cap = nc;
    }
    rcall *r = &REC.calls[REC.n++];
    r->op = op;
    return r;
}

/* An op taking or giving host arrays cannot be replayed (they are gone). */
static int rec_host_op(const char *name) {
    for (size_t i = 0; i < sizeof HOST_RESULT / sizeof *HOST_RESULT; i++)
        if (!strcmp(name, HOST_RESULT[i])) return 1;
    for (size_t i = 0; i < sizeof HOST_TABLE / sizeof *HOST_TABLE; i++)
        if (!strcmp(name, HOST_TABLE[i])) return 1;
    for (size_t i = 0; i < sizeof HOST_ARRAY / sizeof *HOST_ARRAY; i++)
        if (!strcmp(name, HOST_ARRAY[i])) return 1;
    return !strcmp(name, "engram_gather");
}

static void rec_alloc(void *p, size_t bytes) {
    rcall *r = rec_push(OP_ALLOC);
    if (r) r->u.mem = (a_mem){p, NULL, bytes};
}

static void rec_copy(void *dst, const void *src, size_t bytes) {
    rcall *r = rec_push(OP_COPY);
    if (r) r->u.mem = (a_mem){dst, src, bytes};
}

static void rec_run(const rcall *c, int n) {
    for (int i = 0; i < n; i++) {
        const rcall *r = &c[i];
        switch (r->op) {
#define CASE(name, params, args) \
    case OP_##name: rp_##name(&r->u.name); break;
            STRICT_OPS(CASE)
#undef CASE
        case OP_ROWS:
            ST.cpu->ops->sparse_attn_rows(ST.cpu, r->u.rows.q, r->u.rows.m, r->u.rows.h, r->u.rows.d,
                                          &r->u.rows.t, r->u.rows.sink, r->u.rows.scale, r->u.rows.out);
            break;
        case OP_MOE:
            ST.cpu->ops->moe_experts(ST.cpu, &r->u.moe.ex, r->u.moe.x, r->u.moe.m, r->u.moe.idx,
                                     r->u.moe.w, r->u.moe.k, r->u.moe.mm, r->u.moe.limit, r->u.moe.out);
            break;
        case OP_TOPK:
            (r->u.topk.buf ? ST.cpu->ops->topk_select_buf : ST.cpu->ops->topk_select)(
                ST.cpu, r->u.topk.scores, r->u.topk.n_vis, r->u.topk.m, r->u.topk.width, r->u.topk.k,
                r->u.topk.idx);
            break;
        case OP_ALLOC: memset(r->u.mem.dst, 0, r->u.mem.bytes); break; /* zeroed, as alloc's */
        case OP_COPY: memmove(r->u.mem.dst, r->u.mem.src, r->u.mem.bytes); break;
        }
    }
}

/* The selection ops record the score widths of the counted passes. */
static void width_seen(int64_t width) {
    if (!ST.guard && !ST.count_widths) return;
    for (int i = 0; i < ST.c.n_widths; i++)
        if (ST.c.widths[i] == width) return;
    if (ST.c.n_widths < (int)(sizeof ST.c.widths / sizeof *ST.c.widths)) ST.c.widths[ST.c.n_widths++] = width;
}

static void s_topk_select(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                          int64_t width, int k, int32_t *idx) {
    width_seen(width);
    if (ST.record) {
        oh_str("topk_select");
        OH_ARGS(scores, n_vis, m, width, k, idx)
    }
    if (REC.on) {
        REC.failed = 1; /* a host result */
        return;
    }
    op_in("topk_select");
    ST.cpu->ops->topk_select(ST.cpu, scores, n_vis, m, width, k, idx);
    op_out();
}

static void s_topk_select_buf(di_backend *be, const float *scores, const int32_t *n_vis, int64_t m,
                              int64_t width, int k, int32_t *idx) {
    width_seen(width);
    if (ST.record) {
        oh_str("topk_select_buf");
        OH_ARGS(scores, n_vis, m, width, k, idx)
    }
    if (REC.on) {
        rcall *r = rec_push(OP_TOPK);
        if (r) r->u.topk = (a_topk){scores, n_vis, m, width, k, 1, idx};
        return;
    }
    op_in("topk_select_buf");
    ST.cpu->ops->topk_select_buf(ST.cpu, scores, n_vis, m, width, k, idx);
    op_out();
}

/* The row tables' addresses count too (not just the struct's). */
static void s_sparse_attn_rows(di_backend *be, const float *q, int64_t m, int h, int64_t d,
                               const di_attn_rows *t, const float *sink, float scale, float *out) {
    if (ST.record) {
        oh_str("sparse_attn_rows");
        OH_ARGS(q, m, h, d, sink, scale, out)
        OH_ARGS(t->n_win, t->win, t->ring, t->chunk, t->win_bytes, t->n_sel, t->sel, t->cache,
                t->cache_bytes)
    }
    if (REC.on) {
        rcall *r = rec_push(OP_ROWS);
        if (r) r->u.rows = (a_rows){q, sink, m, d, h, *t, scale, out};
        return;
    }
    op_in("sparse_attn_rows");
    ST.cpu->ops->sparse_attn_rows(ST.cpu, q, m, h, d, t, sink, scale, out);
    op_out();
}

/* moe_experts: its experts struct is the model's local */
static void s_moe_experts(di_backend *be, const di_moe_experts *ex, const float *x, int64_t m,
                          const int32_t *idx, const float *w, int k, unsigned mm, float limit,
                          float *out) {
    if (ST.record) {
        oh_str("moe_experts");
        OH_ARGS(ex->w1, ex->n, x, m, idx, w, k, mm, limit, out)
    }
    if (REC.on) {
        rcall *r = rec_push(OP_MOE);
        if (r) r->u.moe = (a_moe){*ex, x, w, m, idx, k, mm, limit, out};
        return;
    }
    op_in("moe_experts");
    ST.cpu->ops->moe_experts(ST.cpu, ex, x, m, idx, w, k, mm, limit, out);
    op_out();
}

#define DEF(name, params, args)        \
    static void s_##name params {      \
        if (ST.record) {               \
            oh_str(#name);             \
            OH_ARGS args               \
        }                              \
        if (REC.on) {                  \
            rcall *r_;                 \
            if (rec_host_op(#name)) REC.failed = 1; \
            if ((r_ = rec_push(OP_##name))) {       \
                a_##name a_ = {UNP args};           \
                r_->u.name = a_;       \
            }                          \
            return;                    \
        }                              \
        op_in(#name);                  \
        ST.cpu->ops->name args;        \
        op_out();                      \
    }
STRICT_OPS(DEF)
#undef DEF

static rgraph *rgraph_find(uint64_t key, int add) {
    for (int i = 0; i < REC.ng; i++)
        if (REC.g[i].key == key) return &REC.g[i];
    if (!add || REC.ng == (int)(sizeof REC.g / sizeof *REC.g)) return NULL;
    REC.g[REC.ng] = (rgraph){.key = key};
    return &REC.g[REC.ng++];
}

static const float *s_graph_replay(di_backend *be, uint64_t key, const void *meta, size_t bytes) {
    rgraph *g = rgraph_find(key, 0);
    if (!g || !g->calls || g->bytes != bytes) return NULL;
    memcpy(g->meta, meta, bytes);
    rec_run(g->calls, g->n);
    REC.replayed++;
    return g->logits;
}

static void *s_graph_record_begin(di_backend *be, uint64_t key, const void *meta, size_t bytes) {
    rgraph *g = rgraph_find(key, 1);
    if (!g || g->failed || g->seen++ == 0) return NULL; /* a key's first step runs as usual */
    g->meta = s_alloc(be, bytes);
    if (!g->meta) return NULL;
    ST.bufs[ST.n - 1].owned = 1;
    memcpy(g->meta, meta, bytes);
    g->bytes = bytes;
    REC.cur = (int)(g - REC.g);
    REC.on = 1;
    REC.failed = 0;
    REC.n = 0;
    return g->meta;
}

static int s_graph_record_end(di_backend *be, const float *logits) {
    rgraph *g = &REC.g[REC.cur];
    REC.on = 0;
    if (!logits || REC.failed) {
        g->failed = 1;
        REC.failures++;
        return 1;
    }
    g->calls = malloc((size_t)(REC.n ? REC.n : 1) * sizeof *g->calls);
    if (!g->calls) {
        g->failed = 1;
        return 1;
    }
    memcpy(g->calls, REC.calls, (size_t)REC.n * sizeof *g->calls);
    g->n = REC.n;
    g->logits = logits;
    rec_run(g->calls, g->n); /* nothing ran while recording */
    REC.recorded++;
    return 0;
}

/* Ends the recordings: their buffers go back, their calls are forgotten. */
static void rec_reset(void) {
    for (int i = 0; i < REC.ng; i++) free(REC.g[i].calls);
    for (int i = 0; i < ST.n;)
        if (ST.bufs[i].owned) {
            munmap(ST.bufs[i].p, ST.bufs[i].len);
            ST.bufs[i] = ST.bufs[--ST.n];
        } else {
            i++;
        }
    free(REC.calls);
    memset(&REC, 0, sizeof REC);
}

/* The strict backend: every op of the CPU table through the wrapper; with
 * buf_forms = 0 the backend-memory selection and step forms are left out,
 * so the model takes the host forms. */
static void strict_init(di_backend *cpu, int buf_forms) {
    ST.cpu = cpu;
    di_backend_ops o = {.name = "strict-cpu",
                        .alloc = s_alloc,
                        .free = s_free,
                        .upload = s_upload,
                        .download = s_download,
                        .copy = s_copy};
#define SET(name, params, args) o.name = cpu->ops->name ? s_##name : NULL;
    STRICT_OPS(SET)
#undef SET
    o.topk_select = s_topk_select;
    o.topk_select_buf = s_topk_select_buf;
    o.sparse_attn_rows = s_sparse_attn_rows;
    o.moe_experts = cpu->ops->moe_experts ? s_moe_experts : NULL;
    if (REC.enabled) {
        o.graph_replay = s_graph_replay;
        o.graph_record_begin = s_graph_record_begin;
        o.graph_record_end = s_graph_record_end;
    }
    if (!buf_forms) {
        o.index_scores_kv_buf = NULL;
        o.candidate_blocks_buf = NULL;
        o.restrict_blocks_buf = NULL;
        o.topk_select_buf = NULL;
        o.sparse_attn_rows = NULL;
        o.rope_cs = NULL;
        o.embed_buf = NULL;
        o.gather_rows_buf = NULL;
        o.scatter_rows_to = NULL;
        o.gather_rows_from = NULL;
        o.engram_rows = NULL;
    }
    ST.ops = o;
    ST.be = (di_backend){&ST.ops, cpu->n_threads, NULL};
}

static void counters_reset(void) {
    ST.faults = 0;
    memset(&ST.c, 0, sizeof ST.c);
    for (int i = 0; i < ST.n; i++) ST.bufs[i].persistent = 1;
}

static gold_model G;
static int64_t S, V;
static const int32_t *IDS;
static int READY;

static int setup(void) {
    const char *shared = test_shared_dir();
    if (!shared) return 0;
    if (gold_open(&G, shared, "v41-tiny")) return -1;
    IDS = gold_i32(&G, "long.prompt_ids", &S);
    V = G.cfg.vocab_size;
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_sigaction = on_segv;
    sa.sa_flags = SA_SIGINFO;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGSEGV, &sa, NULL)) return -1;
    READY = 1;
    return 1;
}

/* Prefill P tokens of the long prompt into a, then `steps` single-token
 * decode steps of a, and as many steps of a and b batched (b prefilled with
 * Q tokens first). Logits of every pass into lg (rows stacked). Returns the
 * rows written; counters cover the decode steps only (guarded from the
 * first decode step on when `guard`). */
typedef struct run_out {
    long faults, passes;
    strict_counts c;
} run_out;

/* The strict backend (buf_forms as strict_init) in place of the model's,
 * and sequences a, b prefilled with P and Q tokens of the long prompt (b's
 * from token 7), their last logits into lg[0], lg[V]. Returns the model's
 * backend, for strict_end. */
static di_backend *strict_begin(int buf_forms, di_seqstate *a, di_seqstate *b, int64_t P,
                                int64_t Q, float *lg) {
    di_err err = {0};
    strict_init(G.be, buf_forms);
    di_backend *saved = G.lm.be;
    G.lm.be = &ST.be;
    ST.guard = 0;
    CHECK(di_seqstate_init(a, &G.lm, S + 16, 0, &err) == DI_OK);
    CHECK(di_seqstate_init(b, &G.lm, S + 16, 0, &err) == DI_OK);
    di_fwd_seq qa = {a, IDS, P}, qb = {b, IDS + 7, Q};
    CHECK(di_forward(&G.lm, &qa, 1, lg, 0, &err) == DI_OK);
    CHECK(di_forward(&G.lm, &qb, 1, lg + V, 0, &err) == DI_OK);
    return saved;
}

static int64_t run(int buf_forms, int guard, int64_t P, int64_t Q, int steps, float *lg,
                   run_out *ro) {
    di_err err = {0};
    di_seqstate a, b;
    int64_t rows = 0;
    di_backend *saved = strict_begin(buf_forms, &a, &b, P, Q, lg);
    rows = 2;
    counters_reset();
    ST.count_widths = 1;
    if (guard) {
        ST.guard = 1;
        protect_all(PROT_NONE);
    }
    memset(ro, 0, sizeof *ro);
    for (int s = 0; s < steps; s++) { /* a alone */
        di_fwd_seq d = {&a, IDS + P + s, 1};
        CHECKF(di_forward(&G.lm, &d, 1, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows++;
        ro->passes++;
    }
    for (int s = 0; s < steps; s++) { /* a and b batched, at other positions */
        di_fwd_seq two[2] = {{&a, IDS + P + steps + s, 1}, {&b, IDS + 7 + Q + s, 1}};
        CHECKF(di_forward(&G.lm, two, 2, lg + rows * V, 0, &err) == DI_OK, "%s", err.msg);
        rows += 2;
        ro->passes++;
    }
    ro->faults = ST.faults;
    ro->c = ST.c;
    ST.guard = 0;
    ST.count_widths = 0;
    protect_all(PROT_READ | PROT_WRITE);
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    G.lm.be = saved;
    return rows;
}

static void test_decode_no_host_reads(void) {
    if (!READY) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    /* a's decode steps cross position 128 (the window ring wraps), with
     * ratio-2 groups completing every other step and the candidate pool
     * restricting the re-index layers (> 32 ratio-1 entries) */
    int64_t P = quick_mode() ? 124 : 120, Q = 40;
    int steps = quick_mode() ? 4 : 8;
    size_t cap = (size_t)(2 + 3 * steps) * (size_t)V;
    float *strict = malloc(cap * sizeof(float)), *host = malloc(cap * sizeof(float));
    run_out rs, rh;
    int64_t n1 = run(1, 1, P, Q, steps, strict, &rs);
    int64_t n2 = run(0, 0, P, Q, steps, host, &rh);
    CHECK_EQ_INT(n1, n2);
    CHECKF(rs.faults == 0, "%ld host accesses to backend memory during decode steps", rs.faults);
    CHECKF(rs.c.host_results == 0, "%ld calls of ops returning host arrays", rs.c.host_results);
    CHECKF(rs.c.host_tables == 0, "%ld calls of ops taking host tables", rs.c.host_tables);
    CHECKF(rs.c.host_arrays == 0, "%ld calls of ops taking per-row host arrays", rs.c.host_arrays);
    /* score widths in buckets (c·2^k, c in 4..7, from 64: indexer.c), the
     * host forms' exact widths elsewhere: the same bits (checked below) */
    int exact = 0;
    for (int i = 0; i < rs.c.n_widths; i++) {
        int64_t w = rs.c.widths[i], u = w;
        while (u > 7 && u % 2 == 0) u /= 2;
        CHECKF(w >= 64 && u >= 4 && u <= 7, "score width %lld is not a bucket", (long long)w);
    }
    for (int i = 0; i < rh.c.n_widths; i++) exact += rh.c.widths[i] % 16 != 0;
    CHECKF(rs.c.n_widths > 0 && exact > 0, "%d bucket widths, %d host-form widths off the buckets",
           rs.c.n_widths, exact);
    /* one upload per pass: the step metadata */
    CHECK_EQ_INT(rs.c.uploads, rs.passes);
    /* Engram rows come with the step metadata (gathered from the host table
     * when it is built), not from a host gather per layer */
    int n_engram_layers = 0;
    for (int b = 0; b < G.cfg.n_layers; b++) n_engram_layers += G.cfg.roles[b].engram >= 0;
    CHECK(n_engram_layers > 0);
    CHECKF(rs.c.engram == 0 && rh.c.engram == rh.passes * n_engram_layers,
           "engram_gather calls: %ld with the metadata, %ld without", rs.c.engram, rh.c.engram);
    /* no copy into or out of the sequences' state (rings, caches): the
     * writes and the ratio-2 groups' reads of the per-token rings go
     * through the step metadata's slots */
    CHECKF(rs.c.state_writes == 0, "%ld copies into the sequences' state", rs.c.state_writes);
    CHECKF(rs.c.state_reads == 0, "%ld copies out of the sequences' state", rs.c.state_reads);
    /* one download per pass: the logits of its last rows */
    CHECK_EQ_INT(rs.c.downloads, rs.passes);
    CHECK_EQ_INT(rs.c.download_bytes, (long)((n1 - 2) * V * (int64_t)sizeof(float)));
    /* the host forms are what the counters catch ... */
    CHECKF(rh.c.host_results > 0 && rh.c.host_tables > 0 && rh.c.host_arrays > 0 && rh.c.state_writes > 0 &&
               rh.c.state_reads > 0,
           "host forms: %ld host-result, %ld host-table, %ld host-array calls, %ld state writes, "
           "%ld state reads",
           rh.c.host_results, rh.c.host_tables, rh.c.host_arrays, rh.c.state_writes, rh.c.state_reads);
    /* ... and give the same bits */
    int64_t diff = 0;
    for (int64_t i = 0; i < n1 * V; i++) diff += memcmp(&strict[i], &host[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "%lld logits differ between the backend-memory and the host forms", (long long)diff);
    free(strict);
    free(host);
}

/* The key of a decode step (forward.h step_key) against its op stream:
 * steps of one key issue the same ops on the same shapes and buffers (only
 * the step metadata's contents differ), which is what replaying a graph
 * captured for the key needs. Decode steps of a alone, then of a and b
 * batched, crossing score-width buckets, with the ratio-2 groups completing
 * every other step. The comparison can fail: with the host forms the
 * streams of same-key steps differ (their copies address the rings by
 * position, their ops take per-row host arrays). Returns each step's key
 * and stream hash. */
static void step_streams(int buf_forms, uint64_t *key, uint64_t *oph, int n_steps) {
    di_err err = {0};
    di_seqstate a, b;
    int64_t P = 120, Q = 40;
    float *lg = malloc((size_t)(2 * V) * sizeof(float));
    di_backend *saved = strict_begin(buf_forms, &a, &b, P, Q, lg);
    counters_reset(); /* the states' buffers are the persistent ones */
    for (int s = 0; s < n_steps; s++) {
        int two = s >= n_steps / 2;
        int64_t t = two ? s - n_steps / 2 : s;
        di_fwd_seq d[2] = {{&a, IDS + P + s, 1}, {&b, IDS + 7 + Q + t, 1}};
        di_fwd probe;
        CHECK(di_fwd_begin(&probe, &G.lm, d, 1 + two, &err) == DI_OK);
        key[s] = probe.step_key;
        di_fwd_abort(&probe);
        ST.oph = 0xcbf29ce484222325ull;
        ST.pass_first_id = ST.next_id;
        ST.record = 1;
        CHECKF(di_forward(&G.lm, d, 1 + two, lg, 0, &err) == DI_OK, "%s", err.msg);
        ST.record = 0;
        oph[s] = ST.oph;
    }
    di_seqstate_free(&a);
    di_seqstate_free(&b);
    free(lg);
    G.lm.be = saved;
}

static void test_step_keys(void) {
    if (!READY) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    enum { N = 16 };
    uint64_t key[N], oph[N], hkey[N], hoph[N];
    step_streams(1, key, oph, N);
    step_streams(0, hkey, hoph, N);
    int same_key = 0, differ = 0, distinct = 0, host_differ = 0;
    for (int i = 0; i < N; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) {
            seen |= key[j] == key[i];
            if (key[j] == key[i]) {
                same_key++;
                differ += oph[j] != oph[i];
                host_differ += hoph[j] != hoph[i];
            }
        }
        distinct += !seen;
    }
    CHECKF(differ == 0, "%d of %d step pairs with one key issue different op streams", differ, same_key);
    CHECKF(same_key >= N / 2 && distinct >= 3, "%d step pairs share a key, %d distinct keys", same_key,
           distinct);
    /* the host forms address rings and caches by position: their streams
     * differ where the key is the same (so the comparison can fail) */
    CHECKF(host_differ > 0, "host forms: %d of %d same-key pairs differ", host_differ, same_key);
    if (getenv("DI_TEST_VERBOSE"))
        fprintf(stderr, "%d steps, %d distinct keys, %d same-key pairs\n", N, distinct, same_key);
}

/* Decode steps through the recording backend (forward.c's record / replay
 * protocol, backend.h's graph ops) against the same steps run op by op:
 * the same logits bits, with steps recorded and replayed (a key's first
 * step runs as usual, the second is recorded, later ones replay; the
 * ratio-2 groups alternate two keys and the batched steps add more). A
 * replay runs the recorded calls on the recorded buffers with only the
 * metadata buffer rewritten, so anything a step took from elsewhere (a
 * host array, a buffer of an earlier step, a pointer not moved to the
 * recording's metadata) gives other logits or a fault. */
static void test_graph_protocol(void) {
    if (!READY) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    int64_t P = 120, Q = 40;
    int steps = 8;
    size_t cap = (size_t)(2 + 3 * steps) * (size_t)V;
    float *eager = malloc(cap * sizeof(float)), *graph = malloc(cap * sizeof(float));
    run_out r0, r1;
    int64_t n0 = run(1, 0, P, Q, steps, eager, &r0);
    REC.enabled = 1;
    int64_t n1 = run(1, 0, P, Q, steps, graph, &r1);
    long recorded = REC.recorded, replayed = REC.replayed, failures = REC.failures;
    rec_reset();
    CHECK_EQ_INT(n0, n1);
    int64_t diff = 0;
    for (int64_t i = 0; i < n0 * V; i++) diff += memcmp(&eager[i], &graph[i], sizeof(float)) != 0;
    CHECKF(diff == 0, "%lld logits differ between replayed and eager steps", (long long)diff);
    CHECKF(recorded >= 2 && replayed >= 4 && failures == 0, "%ld recorded, %ld replayed, %ld failed",
           recorded, replayed, failures);
    if (getenv("DI_TEST_VERBOSE"))
        fprintf(stderr, "%d + %d steps: %ld recorded, %ld replayed\n", steps, steps, recorded, replayed);
    free(eager);
    free(graph);
}

/* The detector itself: a host read of a guarded buffer is counted. */
static void test_detector(void) {
    if (!READY) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    strict_init(G.be, 1);
    counters_reset();
    float *p = ST.ops.alloc(&ST.be, 64 * sizeof(float));
    CHECK(p != NULL);
    if (!p) return;
    ST.guard = 1;
    protect_all(PROT_NONE);
    volatile float v = p[3]; /* a host read between ops */
    (void)v;
    CHECK_EQ_INT(ST.faults, 1);
    float one = 1.f;
    ST.ops.upload(&ST.be, p + 5, &one, sizeof one); /* an op: no fault */
    CHECK_EQ_INT(ST.faults, 1);
    ST.guard = 0;
    protect_all(PROT_READ | PROT_WRITE);
    CHECK(p[5] == 1.f);
    ST.ops.free(&ST.be, p);
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    int rc = setup();
    if (rc < 0) return 1;
    RUN(test_detector);
    RUN(test_decode_no_host_reads);
    RUN(test_step_keys);
    RUN(test_graph_protocol);
    if (rc > 0) gold_close(&G);
    return test_summary();
}
