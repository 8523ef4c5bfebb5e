/* Runtime model construction (see model.h): backend views of every weight
 * matrix, RoPE tables and Engram constants, all derived from the config. */
#include "model/model.h"

#include <stdlib.h>
#include <string.h>

#include "model/forward.h"

static di_status wm(di_wmat *out, const di_tensor *w, const di_tensor *s, const char *what,
                    int block, di_err *err) {
    if (!w->data) {
        memset(out, 0, sizeof *out);
        return DI_OK; /* absent for this block */
    }
    di_status st = di_wmat_from(out, w, s, err);
    if (st) di_err_prefix(err, "block %d %s: ", block, what);
    return st;
}

#define WM(dst, t, what) \
    do { if ((st = wm(dst, &(t).weight, &(t).scale, what, b, err))) goto fail; } while (0)
#define WT(dst, t, what) \
    do { if ((st = wm(dst, &(t), NULL, what, b, err))) goto fail; } while (0)

di_status di_lm_init(di_lm *lm, const di_config *cfg, const di_weights *w, di_backend *be,
                     di_numerics numerics, const int32_t *cmap, di_err *err) {
    memset(lm, 0, sizeof *lm);
    lm->cfg = cfg;
    lm->w = w;
    lm->be = be;
    lm->numerics = numerics;
    lm->mm_q = DI_MM_OUT_BF16 | (numerics == DI_NUMERICS_FP8 ? DI_MM_ACT_FP8 : 0);
    di_status st = DI_OK;
    int b = -1;
    if (cfg->hc_mult > 16 || cfg->n_routed_experts > 1024 || cfg->dspark_n_experts > 1024 ||
        cfg->n_active_experts > 64 || cfg->dspark_n_active > 64)
        return di_err_set(err, DI_ERR_UNSUPPORTED,
                          "hc_mult <= 16, experts <= 1024 and top-k <= 64 are supported");
    lm->blocks = calloc((size_t)cfg->n_blocks, sizeof *lm->blocks);
    if (!lm->blocks) return di_err_set(err, DI_ERR_NOMEM, "model: out of memory");
    for (b = 0; b < cfg->n_blocks; b++) {
        const di_w_block *wb = &w->blocks[b];
        di_lm_block *lb = &lm->blocks[b];
        WM(&lb->wq_a, wb->attn.wq_a, "attn.wq_a");
        WM(&lb->wq_b, wb->attn.wq_b, "attn.wq_b");
        WM(&lb->wkv, wb->attn.wkv, "attn.wkv");
        WM(&lb->wo_a, wb->attn.wo_a, "attn.wo_a");
        WM(&lb->wo_b, wb->attn.wo_b, "attn.wo_b");
        WT(&lb->cmp_wkv, wb->attn.cmp_wkv, "attn.compressor.wkv");
        WT(&lb->cmp_wgate, wb->attn.cmp_wgate, "attn.compressor.wgate");
        WM(&lb->idx_wq_b, wb->attn.idx_wq_b, "attn.indexer.wq_b");
        WT(&lb->idx_wk, wb->attn.idx_wk, "attn.indexer.wk");
        WT(&lb->idx_wp, wb->attn.idx_weights, "attn.indexer.weights_proj");
        WT(&lb->gate, wb->ffn.gate, "ffn.gate");
        WM(&lb->shared.w1, wb->ffn.shared.w1, "ffn.shared_experts.w1");
        WM(&lb->shared.w2, wb->ffn.shared.w2, "ffn.shared_experts.w2");
        WM(&lb->shared.w3, wb->ffn.shared.w3, "ffn.shared_experts.w3");
        lb->experts = calloc((size_t)(wb->ffn.n_experts > 0 ? wb->ffn.n_experts : 1),
                             sizeof *lb->experts);
        if (!lb->experts) goto nomem;
        for (int e = 0; e < wb->ffn.n_experts; e++) {
            WM(&lb->experts[e].w1, wb->ffn.experts[e].w1, "expert w1");
            WM(&lb->experts[e].w2, wb->ffn.experts[e].w2, "expert w2");
            WM(&lb->experts[e].w3, wb->ffn.experts[e].w3, "expert w3");
        }
        if (wb->has_engram) WM(&lb->engram_wkv, wb->engram.wkv, "engram.wkv");
        lb->freq = calloc((size_t)(cfg->rope_dim / 2 + 1), sizeof(float));
        if (!lb->freq) goto nomem;
        di_rope_freqs(cfg, b, lb->freq);
        if (!lb->wq_a.w || !lb->wq_b.w || !lb->wkv.w || !lb->wo_a.w || !lb->wo_b.w || !lb->gate.w) {
            st = di_err_set(err, DI_ERR_NOT_FOUND, "block %d: attention or router weights not bound", b);
            goto fail;
        }
    }
    b = -1;
    WT(&lm->head, w->head, "head");
    if (cfg->n_mtp > 0 && w->dspark.main_proj.weight.data && w->dspark.markov_head.data &&
        w->dspark.confidence.data) {
        WM(&lm->main_proj, w->dspark.main_proj, "mtp main_proj");
        WT(&lm->markov_head, w->dspark.markov_head, "mtp markov head");
        WT(&lm->confidence, w->dspark.confidence, "mtp confidence head");
        lm->has_dspark = 1;
    }
    if (cfg->n_engram > 0) {
        int N = cfg->engram_max_ngram, per = (N - 1) * cfg->engram_n_heads;
        if (!cmap) {
            st = di_err_set(err, DI_ERR_INVALID_ARG, "the model has Engram layers: a compressed token map is needed");
            goto fail;
        }
        if (cfg->engram_pad_id < 0 || cfg->engram_pad_id >= cfg->vocab_size) {
            st = di_err_set(err, DI_ERR_INVALID_ARG, "engram_pad_token_id %d outside the vocabulary [0, %lld)",
                            cfg->engram_pad_id, (long long)cfg->vocab_size);
            goto fail;
        }
        if (cfg->engram_compressed_vocab > (1ll << 30)) {
            st = di_err_set(err, DI_ERR_UNSUPPORTED, "engram_compressed_vocab_size %lld above 2^30",
                            (long long)cfg->engram_compressed_vocab);
            goto fail;
        }
        lm->cmap = malloc((size_t)cfg->vocab_size * sizeof(int32_t));
        lm->eg_mult = calloc((size_t)(cfg->n_engram * N), sizeof(uint64_t));
        lm->eg_prime = calloc((size_t)(cfg->n_engram * per), sizeof(int64_t));
        lm->eg_offset = calloc((size_t)(cfg->n_engram * per), sizeof(int64_t));
        if (!lm->cmap || !lm->eg_mult || !lm->eg_prime || !lm->eg_offset) goto nomem;
        for (int64_t i = 0; i < cfg->vocab_size; i++) {
            if (cmap[i] < 0 || cmap[i] >= cfg->engram_compressed_vocab) {
                st = di_err_set(err, DI_ERR_INVALID_ARG,
                                "compressed token map: id %lld of token %lld outside [0, %lld)",
                                (long long)cmap[i], (long long)i,
                                (long long)cfg->engram_compressed_vocab);
                goto fail;
            }
            lm->cmap[i] = cmap[i];
        }
        lm->cmap_pad = lm->cmap[cfg->engram_pad_id];
        di_engram_primes(cfg, lm->eg_prime);
        for (int l = 0; l < cfg->n_engram; l++) {
            di_engram_multipliers(cfg->engram_layers[l], N, cfg->engram_compressed_vocab,
                                  lm->eg_mult + l * N);
            int64_t off = 0, total = 0;
            for (int k = 0; k < per; k++) {
                lm->eg_offset[l * per + k] = off;
                off += lm->eg_prime[l * per + k];
            }
            total = off;
            if (total != cfg->engram_rows[l]) {
                st = di_err_set(err, DI_ERR_FORMAT,
                                "engram layer %d: the prime search gives %lld rows but "
                                "engram_num_embeddings says %lld",
                                cfg->engram_layers[l], (long long)total,
                                (long long)cfg->engram_rows[l]);
                goto fail;
            }
        }
    }
    return DI_OK;
nomem:
    st = di_err_set(err, DI_ERR_NOMEM, "model: out of memory");
fail:
    di_lm_free(lm);
    return st;
}

void di_lm_free(di_lm *lm) {
    if (lm->blocks)
        for (int b = 0; b < lm->cfg->n_blocks; b++) {
            free(lm->blocks[b].experts);
            free(lm->blocks[b].freq);
        }
    free(lm->blocks);
    free(lm->cmap);
    free(lm->eg_mult);
    free(lm->eg_prime);
    free(lm->eg_offset);
    memset(lm, 0, sizeof *lm);
}
