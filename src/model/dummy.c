/* Deterministic dummy weights in the official formats (architecture.md §8). */
#include "model/dummy.h"

#include <math.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/dtype.h"
#include "core/huge_alloc.h"
#include "core/threadpool.h"

#define ARENA_ALIGN 64
#define CHUNK_BYTES (1u << 20) /* unit of parallel work */

/* ---- counter-based generator ---- */

static inline uint64_t mix64(uint64_t x) { /* splitmix64 finaliser */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

static uint64_t tensor_key(uint64_t seed, const char *name) {
    uint64_t h = 0xcbf29ce484222325ull; /* FNV-1a over the name */
    for (const unsigned char *p = (const unsigned char *)name; *p; p++) h = (h ^ *p) * 0x100000001b3ull;
    return mix64(seed ^ mix64(h));
}

static inline uint64_t draw(uint64_t key, uint64_t counter) {
    return mix64(key + (counter + 1) * 0x9e3779b97f4a7c15ull);
}

/* Approximately standard normal from one draw: Irwin–Hall sum of four
 * 16-bit uniforms, rescaled to unit variance (range ±3.46). */
static inline float gauss(uint64_t h) {
    float s = (float)(h & 0xffff) + (float)((h >> 16) & 0xffff) + (float)((h >> 32) & 0xffff) + (float)(h >> 48);
    return (s / 65536.0f - 2.0f) * 1.7320508f;
}

/* ---- quantized code tables: a random byte -> a normally distributed code ---- */

static uint8_t fp8_code[256]; /* E4M3 of 16 * Φ⁻¹((u + .5) / 256) */
static uint8_t fp4_code[16];  /* E2M1 of 2 * Φ⁻¹((u + .5) / 16) */
static uint8_t fp4_pair[256]; /* a random byte -> two packed codes (low nibble first) */
static double fp8_std, fp4_std; /* RMS of the decoded tables */
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static double inv_normal_cdf(double p) {
    double lo = -10, hi = 10;
    for (int i = 0; i < 100; i++) {
        double mid = 0.5 * (lo + hi);
        if (0.5 * erfc(-mid / sqrt(2.0)) < p) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

static void tables_init(void) {
    double s = 0;
    for (int u = 0; u < 256; u++) {
        fp8_code[u] = di_f32_to_e4m3((float)(16.0 * inv_normal_cdf((u + 0.5) / 256.0)));
        double v = di_e4m3_to_f32(fp8_code[u]);
        s += v * v;
    }
    fp8_std = sqrt(s / 256);
    s = 0;
    for (int u = 0; u < 16; u++) {
        fp4_code[u] = di_f32_to_e2m1((float)(2.0 * inv_normal_cdf((u + 0.5) / 16.0)));
        double v = di_e2m1_to_f32(fp4_code[u]);
        s += v * v;
    }
    fp4_std = sqrt(s / 16);
    for (int u = 0; u < 256; u++) fp4_pair[u] = (uint8_t)(fp4_code[u & 15] | fp4_code[u >> 4] << 4);
}

/* UE8M0 byte of the power of two nearest (in log) to want / code_std. */
static uint8_t scale_byte(double want, double code_std) {
    long k = lround(log2(want / code_std));
    long b = 127 + k;
    /* one binade of room on each side for the jitter; 255 would be NaN */
    return (uint8_t)(b < 2 ? 2 : b > 253 ? 253 : b);
}

static double fan_in_std(const di_manifest_entry *e) { return e->fan_in > 0 ? 1.0 / sqrt((double)e->fan_in) : 1.0; }

/* mean, std of a real-valued (BF16/F32) tensor by role */
static void real_params(const di_manifest_entry *e, float *mean, float *std) {
    *mean = 0;
    switch (e->role) {
    case DI_TR_NORM:
    case DI_TR_ENGRAM_QK: *mean = 1; *std = 0.02f; break;
    case DI_TR_HC_FN: *std = (float)(0.1 * fan_in_std(e)); break;
    case DI_TR_HC_BASE: *std = 0.1f; break;
    case DI_TR_HC_SCALE: *mean = 1; *std = 0.1f; break;
    case DI_TR_GATE_BIAS: *std = 0.01f; break;
    case DI_TR_EMBED:
    case DI_TR_SINK: *std = 1; break;
    default: *std = (float)fan_in_std(e); break;
    }
}

/* Scales vary per tile / group by a factor 2^{-1, 0, +1} (probabilities 1/4,
 * 1/2, 1/4), so kernels that index the wrong scale give wrong results; the
 * tensor's base exponent absorbs the RMS of that factor, sqrt(1.5625). */
#define SCALE_JITTER_RMS 1.25

static inline uint8_t jitter(uint8_t base, uint8_t rb) {
    static const int8_t d[4] = {-1, 0, 0, 1};
    return (uint8_t)(base + d[rb & 3]);
}

/* One byte-sized element (FP8 / FP4 codes, scales) from its random byte. */
static inline uint8_t code_of(const di_manifest_entry *e, uint8_t scale, uint8_t rb) {
    switch (e->role) {
    case DI_TR_FP4_WEIGHT: return fp4_pair[rb];
    case DI_TR_FP8_SCALE:
    case DI_TR_FP4_SCALE:
    case DI_TR_ENGRAM_SCALE: return jitter(scale, rb);
    default: return fp8_code[rb];
    }
}

static uint8_t entry_scale(const di_manifest_entry *e) {
    switch (e->role) {
    case DI_TR_FP8_SCALE: return scale_byte(fan_in_std(e) / SCALE_JITTER_RMS, fp8_std);
    case DI_TR_FP4_SCALE: return scale_byte(fan_in_std(e) / SCALE_JITTER_RMS, fp4_std);
    case DI_TR_ENGRAM_SCALE: return scale_byte(1.0 / SCALE_JITTER_RMS, fp8_std);
    default: return 0;
    }
}

void di_dummy_fill(uint64_t seed, const di_manifest_entry *e, uint64_t offset, void *dst, size_t n) {
    pthread_once(&tables_once, tables_init);
    uint64_t key = tensor_key(seed, e->name);
    uint8_t *out = dst;
    size_t es = di_dtype_size(e->dtype);
    if (es == 1) {
        uint8_t sc = entry_scale(e);
        uint64_t i = offset;
        /* each draw gives the random bytes of 8 consecutive elements */
        for (; n && (i & 7); n--, i++) *out++ = code_of(e, sc, (uint8_t)(draw(key, i >> 3) >> (8 * (i & 7))));
        for (; n >= 8; n -= 8, i += 8, out += 8) {
            uint64_t h = draw(key, i >> 3);
            for (int k = 0; k < 8; k++) out[k] = code_of(e, sc, (uint8_t)(h >> (8 * k)));
        }
        for (; n; n--, i++) *out++ = code_of(e, sc, (uint8_t)(draw(key, i >> 3) >> (8 * (i & 7))));
        return;
    }
    float mean, std;
    real_params(e, &mean, &std);
    uint64_t first = offset / es, last = (offset + n + es - 1) / es;
    for (uint64_t i = first; i < last; i++) {
        float v = mean + std * gauss(draw(key, i));
        uint8_t tmp[4];
        if (e->dtype == DI_DTYPE_BF16) {
            uint16_t b = di_f32_to_bf16(v);
            memcpy(tmp, &b, 2);
        } else {
            memcpy(tmp, &v, 4);
        }
        uint64_t lo = i * es, hi = lo + es;
        uint64_t a = lo < offset ? offset : lo, z = hi > offset + n ? offset + n : hi;
        memcpy(out + (a - offset), tmp + (a - lo), (size_t)(z - a));
    }
}

/* ---- build ---- */

void di_dummy_options_default(di_dummy_options *o) {
    memset(o, 0, sizeof *o);
    o->seed = 0x5eed;
    o->globals = 1;
    o->engram_tables = 1;
}

typedef struct work {
    const di_dummy *d;
    size_t *chunk_entry;    /* entry index per chunk */
    uint64_t *chunk_offset; /* byte offset within the tensor */
    size_t n_chunks;
} work;

static void fill_chunks(void *ctx, int64_t begin, int64_t end, int thread) {
    const work *w = ctx;
    for (int64_t c = begin; c < end; c++) {
        const di_manifest_entry *e = &w->d->manifest.v[w->chunk_entry[c]];
        uint64_t off = w->chunk_offset[c], len = e->slot->nbytes - off;
        if (len > CHUNK_BYTES) len = CHUNK_BYTES;
        di_dummy_fill(w->d->seed, e, off, (uint8_t *)e->slot->data + off, (size_t)len);
    }
}

static int materialise(const di_manifest_entry *e, const di_dummy_options *o, int n_blocks) {
    if ((e->role == DI_TR_ENGRAM_TABLE || e->role == DI_TR_ENGRAM_SCALE) && !o->engram_tables) return 0;
    if (e->block < 0) return o->globals;
    int end = o->block_end <= 0 ? n_blocks : o->block_end;
    return e->block >= o->block_begin && e->block < end;
}

static di_status run_fill(di_dummy *d, int threads, di_err *err) {
    work w = {d, NULL, NULL, 0};
    size_t n = 0;
    for (size_t i = 0; i < d->manifest.n; i++)
        if (d->manifest.v[i].slot->data) n += (d->manifest.v[i].slot->nbytes + CHUNK_BYTES - 1) / CHUNK_BYTES;
    w.chunk_entry = malloc((n ? n : 1) * sizeof *w.chunk_entry);
    w.chunk_offset = malloc((n ? n : 1) * sizeof *w.chunk_offset);
    if (!w.chunk_entry || !w.chunk_offset) {
        free(w.chunk_entry);
        free(w.chunk_offset);
        return di_err_set(err, DI_ERR_NOMEM, "dummy weights: out of memory");
    }
    for (size_t i = 0; i < d->manifest.n; i++) {
        const di_tensor *t = d->manifest.v[i].slot;
        if (!t->data) continue;
        for (uint64_t off = 0; off < t->nbytes; off += CHUNK_BYTES) {
            w.chunk_entry[w.n_chunks] = i;
            w.chunk_offset[w.n_chunks++] = off;
        }
    }
    di_threadpool *tp = NULL;
    di_status st = DI_OK;
    if (threads != 1 && w.n_chunks > 1) st = di_threadpool_create(threads, &tp, err);
    if (st == DI_OK) di_threadpool_for(tp, (int64_t)w.n_chunks, 1, fill_chunks, &w);
    di_threadpool_destroy(tp);
    free(w.chunk_entry);
    free(w.chunk_offset);
    return st;
}

di_status di_dummy_build(di_dummy *d, const di_config *cfg, const di_dummy_options *opt, di_err *err) {
    di_dummy_options def;
    if (!opt) {
        di_dummy_options_default(&def);
        opt = &def;
    }
    memset(d, 0, sizeof *d);
    d->seed = opt->seed;
    if (opt->block_begin < 0 || opt->block_begin > cfg->n_blocks || opt->block_end > cfg->n_blocks ||
        (opt->block_end > 0 && opt->block_end < opt->block_begin))
        return di_err_set(err, DI_ERR_INVALID_ARG, "dummy weights: block range [%d, %d) outside [0, %d]",
                          opt->block_begin, opt->block_end, cfg->n_blocks);
    pthread_once(&tables_once, tables_init);
    di_status st = di_weights_init(&d->weights, cfg, err);
    if (st) return st;
    st = di_manifest_build(&d->manifest, cfg, &d->weights, err);
    if (st) {
        di_weights_free(&d->weights);
        return st;
    }
    uint64_t total = 0;
    for (size_t i = 0; i < d->manifest.n; i++) {
        const di_manifest_entry *e = &d->manifest.v[i];
        uint64_t b = di_manifest_entry_bytes(e);
        if (materialise(e, opt, cfg->n_blocks)) total += (b + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        else d->lazy_bytes += b;
    }
    if (opt->max_bytes && total > opt->max_bytes) {
        di_dummy_free(d);
        return di_err_set(err, DI_ERR_LIMIT,
                          "dummy weights: %llu bytes to materialise, over the cap of %llu (materialise fewer blocks)",
                          (unsigned long long)total, (unsigned long long)opt->max_bytes);
    }
    /* Overcommit would accept more than the machine holds and the fill would
     * then be killed by the kernel: refuse with a message instead. */
    long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
    if (pages > 0 && page > 0 && total > (uint64_t)pages * (uint64_t)page) {
        di_dummy_free(d);
        return di_err_set(err, DI_ERR_LIMIT,
                          "dummy weights: %.1f GB to materialise, more than this machine's %.1f GB of memory "
                          "(materialise a block range, or none)",
                          (double)total / 1e9, (double)pages * (double)page / 1e9);
    }
    /* on 2 MB pages, as a checkpoint's weights copied into memory are
     * (model/weights_memory.h) */
    if (total && (total > SIZE_MAX || !(d->arena = di_huge_alloc((size_t)total)))) {
        di_dummy_free(d);
        return di_err_set(err, DI_ERR_NOMEM, "dummy weights: cannot allocate %llu bytes",
                          (unsigned long long)total);
    }
    d->arena_bytes = (size_t)total;
    uint64_t off = 0;
    for (size_t i = 0; i < d->manifest.n; i++) {
        const di_manifest_entry *e = &d->manifest.v[i];
        di_tensor *t = e->slot;
        t->dtype = e->dtype;
        t->ndim = e->ndim;
        for (int k = 0; k < e->ndim; k++) t->shape[k] = e->shape[k];
        t->nbytes = (size_t)di_manifest_entry_bytes(e);
        t->data = NULL;
        if (materialise(e, opt, cfg->n_blocks)) {
            t->data = (uint8_t *)d->arena + off;
            off += (t->nbytes + ARENA_ALIGN - 1) / ARENA_ALIGN * ARENA_ALIGN;
        }
    }
    st = run_fill(d, opt->threads, err);
    if (st) di_dummy_free(d);
    return st;
}

void di_dummy_free(di_dummy *d) {
    if (!d) return;
    di_manifest_free(&d->manifest);
    di_weights_free(&d->weights);
    free(d->arena);
    memset(d, 0, sizeof *d);
}

/* ---- as a tensor source ---- */

static const di_tensor *dsrc_find(void *ctx, const char *name, const char **file) {
    const di_manifest_entry *e = di_manifest_find(&((di_dummy *)ctx)->manifest, name);
    if (file) *file = "(dummy weights)";
    return e ? e->slot : NULL;
}

static size_t dsrc_count(void *ctx) { return ((di_dummy *)ctx)->manifest.n; }

static const char *dsrc_name_at(void *ctx, size_t i, const char **file) {
    if (file) *file = "(dummy weights)";
    return ((di_dummy *)ctx)->manifest.v[i].name;
}

void di_dummy_source(di_tensor_source *src, di_dummy *d) {
    src->ctx = d;
    src->find = dsrc_find;
    src->count = dsrc_count;
    src->name_at = dsrc_name_at;
}
