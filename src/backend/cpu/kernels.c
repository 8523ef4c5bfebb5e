/* Run-time choice between the AVX2 and scalar CPU kernels (kernels.h), and
 * the decoding tables both share. */
#include "backend/cpu/kernels.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <stdatomic.h>

#include "core/cpu_features.h"
#include "core/dtype.h"
#include "core/huge_alloc.h"

static float e4m3_table[256], e8m0_table[256];
static pthread_once_t tables_once = PTHREAD_ONCE_INIT;

static void tables_init(void) {
    for (int b = 0; b < 256; b++) {
        e4m3_table[b] = di_e4m3_to_f32((uint8_t)b);
        e8m0_table[b] = di_e8m0_to_f32((uint8_t)b);
    }
}

const float *di_cpu_e4m3_table(void) {
    pthread_once(&tables_once, tables_init);
    return e4m3_table;
}

const float *di_cpu_e8m0_table(void) {
    pthread_once(&tables_once, tables_init);
    return e8m0_table;
}

/* ---- buffers kept by the calling thread ----
 * A prefill product needs about twice its activations in fp32 (21 MB at
 * 512 × 5120 for the FP8 lane form). Allocations that large are fresh
 * mappings whose every page faults on first touch (~3.5 µs a page on the
 * VMs measured: 5-40 ms of a 90 ms product in bench_gemm, none with the
 * buffer reused), so the calling thread keeps its buffer, up to KEEP_MAX
 * bytes, for its next call, and a thread-specific destructor frees it when
 * the thread ends. */
enum { KEEP_MAX = 64 << 20 };

/* The buffers come from di_huge_alloc: from 2 MB on 2 MB pages. The prefill
 * products walk several MB of lanes and decoded weights in steps 2 KB
 * apart: on 4 KB pages that is more pages than the second-level TLB holds,
 * and the micro-kernel stalled on page walks (a `perf` profile had 4-7 % of
 * its samples on one prefetch or load that starts a call). On the 2-vCPU
 * Xeon VM the FP8 products of 512 rows went from 0.87-0.93 to 0.93-1.02 of
 * OpenBLAS on one thread, MXFP4 from 0.78-0.84 to 0.82-0.91
 * (bench/RESULTS.md, 2026-12-05). */

typedef struct kept {
    float *p;
    size_t bytes;
} kept;

static pthread_key_t kept_key;
static pthread_once_t kept_once = PTHREAD_ONCE_INIT;
static int kept_key_made;

static void kept_free(void *v) {
    kept *k = v;
    free(k->p);
    free(k);
}
static void kept_key_make(void) { kept_key_made = pthread_key_create(&kept_key, kept_free) == 0; }

static atomic_int poison_kept;
void di_cpu_kernels_poison_buffers(int on) { atomic_store(&poison_kept, on != 0); }

static float *kept_buffer(size_t bytes, int *own);
float *di_cpu_kept_buffer(size_t bytes, int *own) {
    float *p = kept_buffer(bytes, own);
    if (p && atomic_load_explicit(&poison_kept, memory_order_relaxed)) memset(p, 0xff, bytes);
    return p;
}

static float *kept_buffer(size_t bytes, int *own) {
    bytes = bytes ? (bytes + 63) & ~(size_t)63 : 64; /* whole lines, as di_huge_alloc hands them out */
    *own = 1;
    pthread_once(&kept_once, kept_key_make);
    if (!kept_key_made || bytes > KEEP_MAX) return di_huge_alloc(bytes);
    kept *k = pthread_getspecific(kept_key);
    if (!k) {
        if (!(k = calloc(1, sizeof *k)) || pthread_setspecific(kept_key, k)) {
            free(k);
            return di_huge_alloc(bytes);
        }
    }
    if (k->bytes < bytes || !k->p) {
        free(k->p);
        k->p = di_huge_alloc(bytes);
        k->bytes = k->p ? bytes : 0;
    }
    if (k->p) *own = 0;
    return k->p;
}

float di_act_scale_fp8(const float *x32) {
    float amax = 0.0f;
    for (int i = 0; i < 32; i++) {
        float a = x32[i] < 0 ? -x32[i] : x32[i];
        if (a > amax) amax = a;
    }
    return di_act_scale_fp8_amax(amax);
}

float di_act_scale_fp8_amax(float amax) {
    if (amax < 1e-4f) amax = 1e-4f;
    /* The reference multiplies by the fp32 reciprocal of 448, then takes
     * ceil(log2) from the exponent bits: exponent, plus one when any mantissa
     * bit is set. */
    float t = amax * (float)(1.0 / 448.0);
    uint32_t b = di_f32_bits(t);
    int32_t e = (int32_t)((b >> 23) & 0xffu) - 127 + ((b & 0x7fffffu) != 0);
    if (e > 128) e = 128; /* NaN block: keep the shift in range (result unspecified) */
    return di_bits_f32((uint32_t)(e + 127) << 23);
}

/* -1: not yet decided; 0: scalar; 1: AVX2 */
static atomic_int use_avx2 = -1;
static atomic_int forced_scalar;

static int pick_avx2(void) {
    int v = atomic_load_explicit(&use_avx2, memory_order_relaxed);
    if (v < 0) {
#ifdef DI_HAVE_AVX2_KERNELS
        v = di_cpu_has_avx2();
#else
        v = 0;
#endif
        atomic_store(&use_avx2, v);
    }
    return v && !atomic_load_explicit(&forced_scalar, memory_order_relaxed);
}

void di_cpu_kernels_force_scalar(int on) { atomic_store(&forced_scalar, on != 0); }

const char *di_cpu_kernels_path(void) { return pick_avx2() ? "avx2" : "scalar"; }

/* A CPU feature the kernels may use: *cache is -1 until the first call,
 * then whether the CPU has it (has()) and the environment variable env is
 * not 0. */
static int feature_on(atomic_int *cache, int (*has)(void), const char *env) {
    int v = atomic_load_explicit(cache, memory_order_relaxed);
    if (v < 0) {
#ifdef DI_HAVE_AVX2_KERNELS
        const char *e = getenv(env);
        v = !(e && !strcmp(e, "0")) && has(); /* the switch first: has() may ask the OS for state (AMX) */
#else
        (void)has;
        (void)env;
        v = 0;
#endif
        atomic_store(cache, v);
    }
    return v;
}

/* feature_on, unless a test or benchmark forced it off (*forced) */
static int feature_gate(atomic_int *cache, int (*has)(void), const char *env, atomic_int *forced) {
    return feature_on(cache, has, env) && !atomic_load_explicit(forced, memory_order_relaxed);
}

/* AVX-512 F/DQ/BW/VL. DI_CPU_AVX512=0 keeps such a CPU on the 256-bit
 * kernels (the same bits; for comparisons, and for older cores that lower
 * their clock under 512-bit work). */
static atomic_int has_avx512 = -1;
static atomic_int forced_no_avx512;

int di_cpu_kernels_wide(void) {
    return feature_gate(&has_avx512, di_cpu_has_avx512, "DI_CPU_AVX512", &forced_no_avx512) && pick_avx2();
}

void di_cpu_kernels_force_no_avx512(int on) { atomic_store(&forced_no_avx512, on != 0); }

/* AVX-512 VNNI (DI_CPU_VNNI=0: off) */
static atomic_int has_vnni = -1;
static atomic_int forced_no_vnni;

int di_cpu_kernels_vnni(void) {
    return feature_gate(&has_vnni, di_cpu_has_avx512_vnni, "DI_CPU_VNNI", &forced_no_vnni) && di_cpu_kernels_wide();
}

void di_cpu_kernels_force_no_vnni(int on) { atomic_store(&forced_no_vnni, on != 0); }

/* AVX-VNNI (DI_CPU_AVX_VNNI=0: off): the 256-bit kernels' MXFP4 rows of
 * one activation row in the byte form */
static atomic_int has_avx_vnni = -1;
static atomic_int forced_no_avx_vnni;

int di_cpu_kernels_avx_vnni(void) {
    return feature_gate(&has_avx_vnni, di_cpu_has_avx_vnni, "DI_CPU_AVX_VNNI", &forced_no_avx_vnni) && pick_avx2();
}

void di_cpu_kernels_force_no_avx_vnni(int on) { atomic_store(&forced_no_avx_vnni, on != 0); }

/* AVX-512 VBMI (DI_CPU_VBMI=0: off) */
static atomic_int has_vbmi = -1;
static atomic_int forced_no_vbmi;

int di_cpu_kernels_vbmi(void) {
    return feature_gate(&has_vbmi, di_cpu_has_avx512_vbmi, "DI_CPU_VBMI", &forced_no_vbmi) && di_cpu_kernels_wide();
}

void di_cpu_kernels_force_no_vbmi(int on) { atomic_store(&forced_no_vbmi, on != 0); }

/* AMX-BF16 (DI_CPU_AMX=0: off) */
static atomic_int has_amx = -1;
static atomic_int forced_no_amx;

int di_cpu_kernels_amx(void) {
    return feature_gate(&has_amx, di_cpu_has_amx_bf16, "DI_CPU_AMX", &forced_no_amx) && di_cpu_kernels_wide();
}

void di_cpu_kernels_force_no_amx(int on) { atomic_store(&forced_no_amx, on != 0); }

/* the FP8 prefill of few rows in one pass (DI_CPU_LG_FUSED=0: off); not a
 * CPU feature, so every CPU "has" it */
static int always(void) { return 1; }
static atomic_int lg_fused = -1;
static atomic_int forced_no_lg_fused;

int di_cpu_kernels_lg_fused(void) {
    return feature_gate(&lg_fused, always, "DI_CPU_LG_FUSED", &forced_no_lg_fused);
}

void di_cpu_kernels_force_no_lg_fused(int on) { atomic_store(&forced_no_lg_fused, on != 0); }

/* the FP8 decode rows' software prefetches: DI_CPU_PREFETCH=1 / 0 fix
 * them, otherwise measured (kernels.h; why: kernels_avx2_block.c,
 * dec_group) */
static atomic_int dec_prefetch = -2;   /* -2 not read yet, else what the environment says */
static atomic_int forced_dec_prefetch; /* 1 on, -1 off, 0 as above */

int di_cpu_kernels_dec_prefetch(void) {
    const int f = atomic_load_explicit(&forced_dec_prefetch, memory_order_relaxed);
    if (f) return f > 0;
    int v = atomic_load_explicit(&dec_prefetch, memory_order_relaxed);
    if (v == -2) {
#ifdef DI_HAVE_AVX2_KERNELS
        const char *e = getenv("DI_CPU_PREFETCH");
        v = e && !strcmp(e, "0") ? 0 : e && !strcmp(e, "1") ? 1 : -1;
#else
        v = 0; /* the scalar kernels prefetch nothing */
#endif
        atomic_store(&dec_prefetch, v);
    }
    return v;
}

/* The median of n values (n <= 64; v is left sorted). */
static double median_of(double *v, int n) {
    for (int i = 1; i < n; i++) /* insertion sort: n is small */
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            const double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* The measured choice: per class (kernels.h), the first PF_TRIALS timed
 * calls of each kind, alternated (the kind with fewer samples runs next),
 * then di_cpu_pf_decide once. A mutex: several engines may decode at once. */
enum { PF_CLASSES = DI_PF_CLASSES, PF_TRIALS = 12 };
typedef struct pf_class {
    int n[2];                /* timed calls without / with */
    double t[2][PF_TRIALS];  /* their ns per weight byte */
} pf_class;
static pthread_mutex_t pf_mu = PTHREAD_MUTEX_INITIALIZER;
static pf_class pf_classes[PF_CLASSES];
static atomic_int pf_decided[PF_CLASSES] = {-1, -1, -1, -1, -1, -1};
_Static_assert(PF_CLASSES == 6, "pf_decided starts every class at -1");

int di_cpu_kernels_dec_prefetch_measured(int c) {
    return c >= 0 && c < PF_CLASSES ? atomic_load(&pf_decided[c]) : -1;
}

void di_cpu_kernels_reset_dec_prefetch(void) {
    pthread_mutex_lock(&pf_mu);
    memset(pf_classes, 0, sizeof pf_classes);
    for (int c = 0; c < PF_CLASSES; c++) atomic_store(&pf_decided[c], -1);
    pthread_mutex_unlock(&pf_mu);
}

int di_cpu_pf_for_call(int c, int large, int *timed) {
    *timed = 0;
    const int fixed = di_cpu_kernels_dec_prefetch();
    if (fixed >= 0 || c < 0 || c >= PF_CLASSES) return fixed != 0;
    const int d = atomic_load(&pf_decided[c]);
    if (d >= 0) return d;
    if (!large) return 1;
    pthread_mutex_lock(&pf_mu);
    const pf_class *k = &pf_classes[c];
    const int pf = k->n[1] <= k->n[0];
    pthread_mutex_unlock(&pf_mu);
    *timed = 1;
    return pf;
}

void di_cpu_pf_record(int c, int pf, double ns_per_byte) {
    if (c < 0 || c >= PF_CLASSES || !(ns_per_byte > 0)) return;
    pthread_mutex_lock(&pf_mu);
    pf_class *k = &pf_classes[c];
    pf = pf != 0;
    if (atomic_load(&pf_decided[c]) < 0 && k->n[pf] < PF_TRIALS) {
        k->t[pf][k->n[pf]++] = ns_per_byte;
        if (k->n[0] == PF_TRIALS && k->n[1] == PF_TRIALS)
            atomic_store(&pf_decided[c], di_cpu_pf_decide(k->t[0], k->t[1], PF_TRIALS));
    }
    pthread_mutex_unlock(&pf_mu);
}

int di_cpu_pf_decide(const double *off, const double *on, int n) {
    double a[64], b[64];
    if (n < 1) return 1;
    if (n > 64) n = 64;
    memcpy(a, off, sizeof(double) * (size_t)n);
    memcpy(b, on, sizeof(double) * (size_t)n);
    const double m_off = median_of(a, n), m_on = median_of(b, n);
    return !(m_off < m_on * (1.0 - DI_PF_MARGIN));
}

void di_cpu_kernels_force_dec_prefetch(int on) { atomic_store(&forced_dec_prefetch, on > 0 ? 1 : on < 0 ? -1 : 0); }

int64_t di_cpu_span_units(int64_t u, int64_t u1, int64_t whole, int64_t most) {
    const int64_t end = u1 < whole ? u1 : whole;
    int64_t x = most;
    while (x > 0 && u + x > end) x /= 2;
    return x;
}

#ifdef DI_HAVE_AVX2_KERNELS
#define DISPATCH(name, ...)                     \
    do {                                        \
        if (pick_avx2()) name##_avx2(__VA_ARGS__); \
        else name##_scalar(__VA_ARGS__);        \
    } while (0)
#else
#define DISPATCH(name, ...) name##_scalar(__VA_ARGS__)
#endif

void di_act_quant_fp8(const float *x, int64_t M, int64_t K, uint8_t *q, float *s) {
    DISPATCH(di_act_quant_fp8, x, M, K, q, s);
}

void di_act_qdq_fp8(const float *x, int64_t n, float *out) { DISPATCH(di_act_qdq_fp8, x, n, out); }

void di_gemm_fp8(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                 const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    DISPATCH(di_gemm_fp8, qa, sa, M, K, w, ws, N, out, tp);
}

void di_gemm_mxfp4(const uint8_t *qa, const float *sa, int64_t M, int64_t K, const uint8_t *w,
                   const uint8_t *ws, int64_t N, float *out, di_threadpool *tp) {
    DISPATCH(di_gemm_mxfp4, qa, sa, M, K, w, ws, N, out, tp);
}

/* The scalar path of the _many calls: one call a part. */
static void gemm_many_scalar(int fp4, const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
    for (int i = 0; i < n; i++)
        (fp4 ? di_gemm_mxfp4_scalar : di_gemm_fp8_scalar)(parts[i].qa, parts[i].sa, parts[i].M, K, parts[i].w,
                                                          parts[i].ws, parts[i].N, parts[i].out, tp);
}

void di_gemm_mxfp4_many(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (pick_avx2()) {
        di_gemm_mxfp4_many_avx2(parts, n, K, tp);
        return;
    }
#endif
    gemm_many_scalar(1, parts, n, K, tp);
}

void di_gemm_fp8_many(const di_gemm_part *parts, int n, int64_t K, di_threadpool *tp) {
#ifdef DI_HAVE_AVX2_KERNELS
    if (pick_avx2()) {
        di_gemm_fp8_many_avx2(parts, n, K, tp);
        return;
    }
#endif
    gemm_many_scalar(0, parts, n, K, tp);
}

void di_gemm_bf16(const float *x, int64_t M, int64_t K, const uint16_t *w, int64_t N, float *out,
                  di_threadpool *tp) {
    DISPATCH(di_gemm_bf16, x, M, K, w, N, out, tp);
}

void di_gemm_f32(const float *x, int64_t M, int64_t K, const float *w, int64_t N, float *out,
                 di_threadpool *tp) {
    DISPATCH(di_gemm_f32, x, M, K, w, N, out, tp);
}
