/* Engram (architecture.md §6): the hash constants, the per-token n-gram
 * hash rows, and the gated write into the residual copies.
 *
 * The multipliers are numpy's `default_rng(10007·layer).integers(0, bound,
 * size=N, dtype=int64)·2 + 1`, reproduced exactly: SeedSequence entropy
 * mixing, PCG64 (XSL-RR 128/64) and the bounded draw of numpy's `integers`
 * for 64-bit ranges (Lemire's multiply-shift with rejection). Computing them
 * keeps the engine config-driven: any layer id and compressed vocabulary
 * size gives the reference's constants. */
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

/* ---------------------------------------------------------- SeedSequence */

#define SS_INIT_A 0x43b0d7e5u
#define SS_MULT_A 0x931e8875u
#define SS_INIT_B 0x8b51f9ddu
#define SS_MULT_B 0x58f38dedu
#define SS_MIX_L 0xca01f9ddu
#define SS_MIX_R 0x4973f715u

static uint32_t ss_hashmix(uint32_t v, uint32_t *hc) {
    v ^= *hc;
    *hc *= SS_MULT_A;
    v *= *hc;
    v ^= v >> 16;
    return v;
}

static uint32_t ss_mix(uint32_t x, uint32_t y) {
    uint32_t r = SS_MIX_L * x - SS_MIX_R * y;
    return r ^ (r >> 16);
}

/* Pool of 4 words from a non-negative integer seed (< 2^64), then n 64-bit
 * state words as numpy's generate_state(n, uint64) yields them. */
static void seed_sequence(uint64_t seed, uint64_t *out, int n) {
    uint32_t ent[2] = {(uint32_t)seed, (uint32_t)(seed >> 32)};
    int n_ent = ent[1] ? 2 : 1;
    uint32_t pool[4], hc = SS_INIT_A;
    for (int i = 0; i < 4; i++) pool[i] = ss_hashmix(i < n_ent ? ent[i] : 0u, &hc);
    for (int s = 0; s < 4; s++)
        for (int d = 0; d < 4; d++)
            if (s != d) pool[d] = ss_mix(pool[d], ss_hashmix(pool[s], &hc));
    uint32_t hb = SS_INIT_B;
    for (int i = 0; i < 2 * n; i++) {
        uint32_t v = pool[i % 4];
        v ^= hb;
        hb *= SS_MULT_B;
        v *= hb;
        v ^= v >> 16;
        if (i % 2 == 0) out[i / 2] = v;
        else out[i / 2] |= (uint64_t)v << 32;
    }
}

/* ---------------------------------------------------------------- PCG64 */

typedef unsigned __int128 u128;

typedef struct pcg64 {
    u128 state, inc;
} pcg64;

#define PCG_MULT (((u128)0x2360ED051FC65DA4ull << 64) | 0x4385DF649FCCF645ull)

static void pcg_step(pcg64 *r) { r->state = r->state * PCG_MULT + r->inc; }

static uint64_t pcg_next(pcg64 *r) {
    pcg_step(r);
    uint64_t x = (uint64_t)(r->state >> 64) ^ (uint64_t)r->state;
    unsigned rot = (unsigned)(r->state >> 122);
    return (x >> rot) | (x << ((64 - rot) & 63));
}

static void pcg_seed(pcg64 *r, uint64_t seed) {
    uint64_t s[4];
    seed_sequence(seed, s, 4);
    u128 initstate = ((u128)s[0] << 64) | s[1];
    u128 initseq = ((u128)s[2] << 64) | s[3];
    r->state = 0;
    r->inc = (initseq << 1) | 1;
    pcg_step(r);
    r->state += initstate;
    pcg_step(r);
}

/* numpy's bounded draw in [0, rng] for a 64-bit range (rng < 2^64 - 1). */
static uint64_t bounded_u64(pcg64 *r, uint64_t rng) {
    uint64_t excl = rng + 1;
    u128 m = (u128)pcg_next(r) * excl;
    uint64_t left = (uint64_t)m;
    if (left < excl) {
        uint64_t threshold = (0 - excl) % excl;
        while (left < threshold) {
            m = (u128)pcg_next(r) * excl;
            left = (uint64_t)m;
        }
    }
    return (uint64_t)(m >> 64);
}

void di_engram_multipliers(int layer_id, int n, int64_t compressed_vocab, uint64_t *out) {
    int64_t bound = (INT64_MAX / (compressed_vocab > 0 ? compressed_vocab : 1)) / 2;
    if (bound < 1) bound = 1;
    pcg64 r;
    pcg_seed(&r, (uint64_t)10007 * (uint64_t)layer_id);
    /* numpy draws 64-bit ranges this way; a range below 2^32 (a compressed
     * vocabulary above 2^30) would take its 32-bit path, which no config of
     * this model reaches (di_lm_init rejects it). */
    for (int i = 0; i < n; i++) out[i] = bounded_u64(&r, (uint64_t)bound - 1) * 2 + 1;
}

/* ---------------------------------------------------------------- primes */

static int is_prime(int64_t n) {
    if (n < 2) return 0;
    if (n % 2 == 0) return n == 2;
    for (int64_t d = 3; d * d <= n; d += 2)
        if (n % d == 0) return 0;
    return 1;
}

void di_engram_primes(const di_config *cfg, int64_t *primes) {
    int per = (cfg->engram_max_ngram - 1) * cfg->engram_n_heads;
    int n_all = cfg->n_engram * per, k = 0;
    for (int l = 0; l < cfg->n_engram; l++)
        for (int o = 0; o < cfg->engram_max_ngram - 1; o++) {
            int64_t cur = cfg->engram_vocab_size - 1;
            for (int h = 0; h < cfg->engram_n_heads; h++) {
                /* the smallest prime above cur not handed out before */
                for (;;) {
                    cur++;
                    if (!is_prime(cur)) continue;
                    int seen = 0;
                    for (int j = 0; j < k && !seen; j++) seen = primes[j] == cur;
                    if (!seen) break;
                }
                primes[k++] = cur;
            }
        }
    (void)n_all;
}

/* ---------------------------------------------------------------- hashing */

void di_engram_hash(const di_lm *lm, const di_seqstate *st, const int32_t *ids, int64_t n,
                    int64_t pos0, int32_t *rows) {
    const di_config *c = lm->cfg;
    int N = c->engram_max_ngram, ne = c->engram_n_heads, per = (N - 1) * ne;
    for (int64_t i = 0; i < n; i++) {
        int64_t t = pos0 + i;
        int64_t tok[DI_CFG_MAX_NGRAM];
        int blocked = 0;
        for (int s = 0; s < N; s++) {
            int64_t p = t - s;
            int64_t v = lm->cmap_pad;
            if (p < 0) blocked = 1;
            if (!blocked) {
                int32_t cid = p >= pos0 ? lm->cmap[ids[p - pos0]] : st->hist[p % st->hist_cap];
                if (cid < 0) blocked = 1; /* a dead (image) token ends the look-back */
                else v = cid;
            }
            tok[s] = blocked ? lm->cmap_pad : v;
        }
        for (int l = 0; l < c->n_engram; l++) {
            const uint64_t *mult = lm->eg_mult + l * N;
            uint64_t roll = (uint64_t)tok[0] * mult[0];
            int32_t *out = rows + (i * c->n_engram + l) * per;
            for (int s = 1; s < N; s++) {
                roll ^= (uint64_t)tok[s] * mult[s];
                for (int h = 0; h < ne; h++) {
                    int k = (s - 1) * ne + h;
                    out[k] = (int32_t)((int64_t)roll % lm->eg_prime[l * per + k] +
                                       lm->eg_offset[l * per + k]);
                }
            }
        }
    }
}

void di_engram_record(const di_lm *lm, di_seqstate *st, const int32_t *ids, int64_t n,
                      int64_t pos0) {
    for (int64_t i = 0; i < n; i++) st->hist[(pos0 + i) % st->hist_cap] = lm->cmap[ids[i]];
}

/* ---------------------------------------------------------------- apply */

di_status di_engram_apply(di_fwd *f, int block, float *s, di_err *err) {
    const di_lm *lm = f->lm;
    const di_config *c = lm->cfg;
    di_backend *be = lm->be;
    const di_w_engram *w = &lm->w->blocks[block].engram;
    int e = c->roles[block].engram;
    int ncols = (c->engram_max_ngram - 1) * c->engram_n_heads;
    int64_t m = f->m, d = c->dim, eh = c->engram_head_dim;
    int32_t *ids = malloc((size_t)(m * ncols) * sizeof(int32_t));
    float *emb = be->ops->alloc(be, (size_t)(m * ncols * eh) * sizeof(float));
    float *kv = be->ops->alloc(be, (size_t)(m * (c->hc_mult + 1) * d) * sizeof(float));
    if (!ids || !emb || !kv) {
        free(ids);
        be->ops->free(be, emb);
        be->ops->free(be, kv);
        return di_err_set(err, DI_ERR_NOMEM, "engram of block %d: out of memory", block);
    }
    for (int64_t i = 0; i < m; i++)
        memcpy(ids + i * ncols, f->hash + (i * c->n_engram + e) * ncols, (size_t)ncols * 4);
    if (f->meta && be->ops->engram_rows && f->m_eng_rows && f->m_eng_rows[block])
        be->ops->engram_rows(be, f->m_eng_rows[block], f->m_eng_scales[block], m * ncols, eh,
                             w->embed_scale.shape[1], emb);
    else
        be->ops->engram_gather(be, &w->embed, &w->embed_scale, ids, m, ncols, emb);
    be->ops->matmul(be, &lm->blocks[block].engram_wkv, emb, m, kv, lm->mm_q);
    be->ops->engram_gate(be, s, kv, &w->q_weight, &w->k_weight, m, c->hc_mult, d, c->eps);
    free(ids);
    be->ops->free(be, emb);
    be->ops->free(be, kv);
    return DI_OK;
}
