/* Packed cache rows (backend/kvstore.h) and the sequence state built on
 * them: hand-derived packed bytes of simple blocks (architecture.md §2
 * formulas), pack/unpack against the CPU backend's QDQ steps bit for bit
 * over random and edge-value inputs, the CPU ops over packed rows against
 * the same ops over the decoded rows, and the memory plan's per-token and
 * fixed bytes against what the sequence state allocates (tiny config). */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/cpu/cpu_quant.h"
#include "backend/cpu/kernels.h"
#include "core/cpu_features.h"
#include "core/dtype.h"
#include "model/planner.h"
#include "model/seqstate.h"
#include "model_fixtures.h"
#include "test.h"

static di_config tiny, real;

static uint64_t rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return (uint32_t)(rng >> 16);
}
static float unif(void) { return (float)(rnd() & 0xFFFFFF) / 16777216.f; } /* [0, 1) */

static void test_row_bytes(void) {
    /* §13.2: 256 B + 32 B e4m3 scales, 64 B + 4 B, and the FP8 window row */
    CHECK_EQ_INT(di_kvq_row_bytes(DI_KVQ_FP4_E4M3, 512), 288);
    CHECK_EQ_INT(di_kvq_row_bytes(DI_KVQ_FP4_E8M0, 128), 68);
    CHECK_EQ_INT(di_kvq_row_bytes(DI_KVQ_FP8, 512), 528);
    di_plan p;
    di_err e = {0};
    CHECKF(di_plan_compute(&real, NULL, &p, &e) == DI_OK, "%s", e.msg);
    double per_token = p.kv_entries_per_token * (double)(di_kvq_row_bytes(DI_KVQ_FP4_E4M3, real.head_dim) +
                                                         di_kvq_row_bytes(DI_KVQ_FP4_E8M0, real.index_head_dim));
    CHECKF(per_token == p.kv_bytes_per_token[DI_KV_FP4], "%g vs plan %g", per_token, p.kv_bytes_per_token[DI_KV_FP4]);
    CHECK(p.window_rings_fp8 == (uint64_t)real.n_blocks * real.window * di_kvq_row_bytes(DI_KVQ_FP8, real.head_dim));
}

/* Packed bytes worked out by hand from the §2 formulas. */
static void test_known_bytes(void) {
    float x[32];
    uint8_t row[64];
    /* FP8: amax 1 → 1·fp32(1/448) → s = 2^ceil(log2 0.00223) = 2^-8 (E8M0
     * byte 119); 1/s = 256 = E4M3 0x78, -0.5/s = -128 = 0xF0. */
    for (int i = 0; i < 32; i++) x[i] = 1.f;
    x[1] = -0.5f;
    di_kvq_pack(DI_KVQ_FP8, x, 32, row);
    CHECK_EQ_INT(row[0], 0x78);
    CHECK_EQ_INT(row[1], 0xF0);
    CHECK_EQ_INT(row[31], 0x78);
    CHECK_EQ_INT(row[32], 119);
    /* FP4 E8M0: amax 3 → s = 2^ceil(log2 0.5) = 2^-1 (byte 126); 3/s = 6 =
     * E2M1 code 7; -1/s = -2 = code 4 | sign 8 = 0xC. */
    for (int i = 0; i < 32; i++) x[i] = 3.f;
    x[3] = -1.f;
    di_kvq_pack(DI_KVQ_FP4_E8M0, x, 32, row);
    CHECK_EQ_INT(row[0], 0x77);
    CHECK_EQ_INT(row[1], 0xC7);
    CHECK_EQ_INT(row[15], 0x77);
    CHECK_EQ_INT(row[16], 126);
    /* FP4 E4M3 per 16: amax 1.5 → s = e4m3(0.25) = 0x28; 1.5/s = 6 (code 7),
     * 0.75/s = 3 (code 5); the second block: amax 0.003 → floored at
     * 6·2^-9 → s = 2^-9 (E4M3 subnormal 0x01), 0.003/s = 1.536 → 1.5
     * (code 3). */
    for (int i = 0; i < 16; i++) x[i] = 1.5f;
    x[0] = 0.75f;
    for (int i = 16; i < 32; i++) x[i] = i == 16 ? 0.003f : 0.f;
    di_kvq_pack(DI_KVQ_FP4_E4M3, x, 32, row);
    CHECK_EQ_INT(row[0], 0x75);
    CHECK_EQ_INT(row[7], 0x77);
    CHECK_EQ_INT(row[8], 0x03);
    CHECK_EQ_INT(row[9], 0x00);
    CHECK_EQ_INT(row[16], 0x28);
    CHECK_EQ_INT(row[17], 0x01);
    float y[32];
    di_kvq_unpack(DI_KVQ_FP4_E4M3, row, 32, y);
    CHECK(y[0] == 0.75f && y[1] == 1.5f && y[16] == 1.5f * 0x1p-9f && y[17] == 0.f);
    /* Ties at a subnormal E4M3 scale: amax 9·2^-9 → amax/6 = 1.5·2^-9, a tie
     * that goes to the even code 2 (s = 2^-8); 9·2^-9/s = 4.5, a tie that
     * goes to 4 (code 6): the value 2^-6. Packing 2^-6 again gives the scale
     * 2^-9 and 6·2^-9: QDQ with E4M3 scales is not idempotent. */
    memset(x, 0, sizeof x);
    x[0] = 9 * 0x1p-9f;
    di_kvq_pack(DI_KVQ_FP4_E4M3, x, 16, row);
    CHECK_EQ_INT(row[0], 0x06);
    CHECK_EQ_INT(row[8], 0x02);
    di_kvq_unpack(DI_KVQ_FP4_E4M3, row, 16, y);
    CHECK(y[0] == 0x1p-6f);
    di_kvq_pack(DI_KVQ_FP4_E4M3, y, 16, row);
    di_kvq_unpack(DI_KVQ_FP4_E4M3, row, 16, y);
    CHECK(y[0] == 6 * 0x1p-9f);
}

/* A block of n values of one random kind, edge values included. */
static void fill(float *x, int n, int kind) {
    float mag = ldexpf(1.f, (int)(rnd() % 120) - 60);
    for (int i = 0; i < n; i++) {
        float g = (unif() * 2.f - 1.f) * mag;
        switch (kind) {
        case 0: x[i] = g; break;                                       /* any scale */
        case 1: x[i] = di_round_bf16(g); break;                        /* bf16 values */
        case 2: x[i] = (rnd() & 1 ? 1.f : -1.f) * ldexpf(1.f, -130 + (int)(rnd() % 8)); break; /* subnormal */
        case 3: x[i] = (rnd() & 3) ? (rnd() & 1 ? 0.f : -0.f) : g; break; /* mostly zeros */
        case 4: { /* E2M1 / E4M3 rounding ties at a power-of-two scale */
            static const float t[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.f, 6.f, 7.f, 9.f, 11.f, 13.f};
            x[i] = (rnd() & 1 ? 1.f : -1.f) * t[rnd() % 12] * ldexpf(1.f, (int)(rnd() % 8) - 4);
            break;
        }
        case 5: x[i] = (rnd() & 1 ? 1.f : -1.f) * ldexpf(1.f + unif(), 100 + (int)(rnd() % 24)); break; /* huge */
        default: x[i] = (float)(i % 7) * 1e-6f; /* below the FP8 floor */
        }
    }
}

static int bits_equal(const float *a, const float *b, int64_t n, int64_t *at) {
    for (int64_t i = 0; i < n; i++)
        if (di_f32_bits(a[i]) != di_f32_bits(b[i])) {
            *at = i;
            return 0;
        }
    return 1;
}

/* unpack(pack(x)) is exactly the CPU's QDQ of x. Packing a QDQ'd row again
 * changes nothing for the power-of-two scales (FP8, FP4 E8M0); with E4M3
 * scales it can (a scale in E4M3's subnormal range rounds coarsely), which is
 * why the caches are packed from the values before QDQ. */
static void test_roundtrip(void) {
    enum { N = 512 };
    float x[N], q[N], y[N], y2[N];
    uint8_t row[N + N / 16], row2[N + N / 16];
    int bad = 0;
    for (int iter = 0; iter < 3000 && !bad; iter++) {
        di_kvq f = (di_kvq)(iter % DI_KVQ_COUNT);
        int64_t n = f == DI_KVQ_FP4_E8M0 ? 128 : N, bl = di_kvq_block(f);
        for (int64_t b = 0; b < n; b += bl) fill(x + b, (int)bl, (int)(rnd() % 7));
        memcpy(q, x, sizeof x);
        if (f == DI_KVQ_FP8) {
            di_act_qdq_fp8_scalar(x, n, q);
#ifdef DI_HAVE_AVX2_KERNELS
            if (di_cpu_has_avx2()) {
                float qa[N];
                di_act_qdq_fp8_avx2(x, n, qa);
                int64_t at = 0;
                if (!bits_equal(q, qa, n, &at)) {
                    CHECKF(0, "AVX2 and scalar FP8 QDQ differ at %lld (%g)", (long long)at, x[at]);
                    bad = 1;
                }
            }
#endif
        } else {
            for (int64_t b = 0; b < n; b += bl) di_cpu_qdq_fp4(q + b, (int)bl, f == DI_KVQ_FP4_E4M3);
        }
        di_kvq_pack(f, x, n, row);
        di_kvq_unpack(f, row, n, y);
        int64_t at = 0;
        if (!bits_equal(y, q, n, &at)) {
            CHECKF(0, "format %d: x %a decodes to %a, QDQ gives %a", f, x[at], y[at], q[at]);
            bad = 1;
        }
        di_kvq_pack(f, q, n, row2);
        di_kvq_unpack(f, row2, n, y2);
        if (f != DI_KVQ_FP4_E4M3 && !bits_equal(y2, q, n, &at)) {
            CHECKF(0, "format %d: repacking QDQ value %a gives %a", f, q[at], y2[at]);
            bad = 1;
        }
    }
    CHECK(!bad);
}

/* The CPU ops over packed rows against the fp32 ops over the decoded rows,
 * with empty slots, several threads and enough rows to split. */
static void test_ops(void) {
    di_backend *be = NULL;
    di_err e = {0};
    CHECK(di_backend_cpu_create(2, &be, &e) == DI_OK);
    if (!be) return;
    enum { M = 24, H = 4, D = 64, NW = 70, NC = 30, NS = NW + NC, HI = 4, DI = 32, NK = 90 };
    size_t wb = di_kvq_row_bytes(DI_KVQ_FP8, D), cb = di_kvq_row_bytes(DI_KVQ_FP4_E4M3, D);
    size_t kb = di_kvq_row_bytes(DI_KVQ_FP4_E8M0, DI);
    float *q = malloc(sizeof(float) * M * H * D), *src = malloc(sizeof(float) * NS * D);
    float *dec = malloc(sizeof(float) * NS * D), *o1 = malloc(sizeof(float) * M * H * D);
    float *o2 = malloc(sizeof(float) * M * H * D), sink[H];
    uint8_t *win = malloc(NW * wb), *cmp = malloc(NC * cb), *win2 = malloc(NW * wb);
    const uint8_t **prow = malloc(sizeof(uint8_t *) * M * NS);
    di_kvrow *frow = malloc(sizeof(di_kvrow) * M * NS);
    for (int i = 0; i < M * H * D; i++) q[i] = di_round_bf16(unif() * 2 - 1);
    for (int i = 0; i < NS * D; i++) src[i] = (unif() * 2 - 1) * 3;
    for (int h = 0; h < H; h++) sink[h] = unif();
    be->ops->kv_pack(be, DI_KVQ_FP8, src, NW, D, win);
    be->ops->kv_pack(be, DI_KVQ_FP4_E4M3, src + NW * D, NC, D, cmp);
    for (int j = 0; j < NW; j++) {
        di_kvq_pack(DI_KVQ_FP8, src + j * D, D, win2 + j * wb);
        di_kvq_unpack(DI_KVQ_FP8, win + j * wb, D, dec + j * D);
    }
    CHECK(memcmp(win, win2, NW * wb) == 0); /* the op packs as the host code does */
    for (int j = 0; j < NC; j++) di_kvq_unpack(DI_KVQ_FP4_E4M3, cmp + j * cb, D, dec + (NW + j) * D);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < NS; j++) {
            int empty = (rnd() % 5) == 0;
            int k = (int)(rnd() % (j < NW ? NW : NC)); /* any row, repeats allowed */
            prow[i * NS + j] = empty ? NULL : j < NW ? win + k * wb : cmp + k * cb;
            frow[i * NS + j] = empty ? NULL : j < NW ? dec + k * D : dec + (NW + k) * D;
        }
    be->ops->sparse_attn(be, q, M, H, D, frow, NS, sink, 0.125f, o1);
    be->ops->sparse_attn_kv(be, q, M, H, D, prow, NS, NW, sink, 0.125f, o2);
    int64_t at = 0;
    CHECKF(bits_equal(o1, o2, M * H * D, &at), "sparse_attn_kv differs at %lld", (long long)at);

    /* index scores */
    float *iq = malloc(sizeof(float) * M * HI * DI), w[M * HI], *keys = malloc(sizeof(float) * NK * DI);
    float *s1 = malloc(sizeof(float) * M * NK), *s2 = malloc(sizeof(float) * M * NK);
    uint8_t *pk = malloc(NK * kb);
    int32_t nvis[M];
    for (int i = 0; i < M * HI * DI; i++) iq[i] = unif() * 2 - 1;
    for (int i = 0; i < M * HI; i++) w[i] = di_round_bf16(unif());
    for (int i = 0; i < NK * DI; i++) keys[i] = unif() * 2 - 1;
    be->ops->kv_pack(be, DI_KVQ_FP4_E8M0, keys, NK, DI, pk);
    for (int j = 0; j < NK; j++) di_kvq_unpack(DI_KVQ_FP4_E8M0, pk + j * kb, DI, keys + j * DI);
    const float *fk[M];
    const uint8_t *pks[M];
    for (int i = 0; i < M; i++) {
        nvis[i] = (int32_t)(rnd() % (NK + 1));
        int off = nvis[i] < NK ? (int)(rnd() % (NK - nvis[i] + 1)) : 0;
        fk[i] = keys + off * DI;
        pks[i] = pk + off * kb;
    }
    be->ops->index_scores(be, iq, w, M, HI, DI, fk, nvis, NK, s1);
    be->ops->index_scores_kv(be, iq, w, M, HI, DI, pks, nvis, NK, s2);
    CHECKF(bits_equal(s1, s2, M * NK, &at), "index_scores_kv differs at %lld", (long long)at);
    free(iq), free(keys), free(s1), free(s2), free(pk);
    free(q), free(src), free(dec), free(o1), free(o2), free(win), free(cmp), free(win2), free(prow), free(frow);
    di_backend_destroy(be);
}

/* The memory plan counts what the sequence state allocates: fixed bytes
 * (window + DSpark rings, compressor partial groups) plus T x the FP4
 * per-token bytes, the Engram history on the host. */
static void test_plan_matches_state(void) {
    di_backend *be = NULL;
    di_err e = {0};
    CHECK(di_backend_cpu_create(1, &be, &e) == DI_OK);
    if (!be) return;
    di_lm lm;
    memset(&lm, 0, sizeof lm);
    lm.cfg = &tiny;
    lm.be = be;
    lm.has_dspark = tiny.n_mtp > 0;
    di_plan p;
    CHECKF(di_plan_compute(&tiny, NULL, &p, &e) == DI_OK, "%s", e.msg);
    int maxr = 1;
    for (int b = 0; b < tiny.n_layers; b++)
        if (tiny.roles[b].ratio > maxr) maxr = tiny.roles[b].ratio;
    for (int64_t T = maxr; T <= 64 * maxr; T *= 4) {
        di_seqstate st;
        CHECK(di_seqstate_init(&st, &lm, T, 0, &e) == DI_OK);
        double plan = (double)(p.fixed_per_sequence - p.engram_history) + (double)T * p.kv_bytes_per_token[DI_KV_FP4];
        CHECKF((double)st.bytes == plan, "T=%lld: state %llu bytes, plan %.0f", (long long)T,
               (unsigned long long)st.bytes, plan);
        CHECK(st.bytes == di_seqstate_bytes(&lm, T, 0));
        CHECK_EQ_INT(p.engram_history, (uint64_t)st.hist_cap * sizeof(int32_t));
        di_seqstate_free(&st);
    }
    /* the real config, counted without allocating: 128K tokens of 890 B plus
     * the FP8 window rings of every block (DSpark stages included) */
    di_lm rl = lm;
    rl.cfg = &real;
    rl.has_dspark = real.n_mtp > 0;
    di_plan rp;
    CHECKF(di_plan_compute(&real, NULL, &rp, &e) == DI_OK, "%s", e.msg);
    uint64_t rb = di_seqstate_bytes(&rl, 131072, 0);
    CHECKF(rb == rp.fixed_per_sequence - rp.engram_history + 131072ull * 890, "real: state %llu bytes",
           (unsigned long long)rb);
    /* rollback room: more ring slots, counted the same way */
    di_seqstate st;
    CHECK(di_seqstate_init(&st, &lm, 100, 5, &e) == DI_OK);
    CHECK(st.bytes == di_seqstate_bytes(&lm, 100, 5));
    CHECK(st.bytes > di_seqstate_bytes(&lm, 100, 0));
    di_seqstate_free(&st);
    di_backend_destroy(be);
}

int main(void) {
    if (!fixture_config("v41-tiny-config.json", &tiny) || !fixture_config("v41-flash-config.json", &real)) return 1;
    test_row_bytes();
    test_known_bytes();
    test_roundtrip();
    test_ops();
    test_plan_matches_state();
    return test_summary();
}
