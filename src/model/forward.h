/* The V4.1 forward pass over a batch of sequences (architecture.md §3–§10).
 *
 * A batch is several sequences, each with a chunk of new tokens that starts
 * at its own position (a whole prompt, a prefill chunk, or one decode
 * token). The chunks are stacked into m rows; row-wise work (linears, norms,
 * MoE, mHC) runs over all rows at once, and the few sequence-aware steps
 * (window, compressor, indexer, Engram history) look rows up by sequence.
 *
 * A query's attention list has a fixed, chunk-independent layout (window
 * slots for positions max(0, t-W+1) .. in order, then the selected
 * compressed entries), so a sequence gives bit-identical results whether it
 * is prefilled in one chunk or many, alone or batched with others. */
#ifndef DI_MODEL_FORWARD_H
#define DI_MODEL_FORWARD_H

#include <stdint.h>

#include "model/model.h"
#include "model/seqstate.h"

typedef struct di_fwd_seq {
    di_seqstate *st;     /* its state; the chunk starts at st->n_tokens */
    const int32_t *ids;  /* [n] token ids */
    int64_t n;
} di_fwd_seq;

/* Optional host copies of intermediate values, for tests and dumps. */
typedef struct di_fwd_trace {
    float *attn_out;     /* [m, D] attention sublayer output of the traced block */
    float *ffn_out;      /* [m, D] MoE output of the traced block */
} di_fwd_trace;

/* What a pass hands back for one sequence's last row (di_forward_rows). */
enum { DI_ROW_NONE = 0, DI_ROW_LOGITS = 1, DI_ROW_GREEDY = 2, DI_ROW_DRAW = 3, DI_ROW_MODES = 4 };
typedef struct di_row_want {
    int32_t mode;        /* DI_ROW_*: nothing, the logits, the greedy summary, or a draw */
    int32_t ban;         /* DI_ROW_GREEDY: the id its search skips, -1 none */
    di_row_draw draw;    /* DI_ROW_DRAW: the temperature draw (core/row_exp.h) */
    int32_t top;         /* DI_ROW_GREEDY / _DRAW: the row's top list of this length too (top
                            logprobs: di_row_top_of), 0 none; at most the delivery's top_k */
    int32_t pad_;        /* 0 */
} di_row_want;

/* Where di_forward_rows delivers the rows. */
typedef struct di_fwd_out {
    const di_row_want *want; /* [n_seqs] */
    int64_t lim;             /* the greedy search covers ids [0, lim) */
    di_row_greedy *greedy;   /* [n_seqs] host: the DI_ROW_GREEDY and DI_ROW_DRAW rows' summaries */
    const di_row_edit *edits; /* [n_edits] host: the draws' edited ids (want[i].draw.e0 ..) */
    int64_t n_edits;
    di_row_top *top;          /* [n_seqs, top_k] host: the rows' top lists (want[i].top of them) */
    int32_t top_k;            /* 0: no row wants one */
    /* all_rows = 1: the head runs over every row of the pass (prompt
     * logprobs); the sequences' last rows come as above, and each row r
     * (in the pass's order) with target[r] >= 0 as its summary (row_sum[r]
     * = di_row_greedy_of(row, V, V, -1): its log-sum-exp), its value at
     * the target (row_x[r]) and, with row_k > 0, its top list
     * (row_top[r·row_k ..], di_row_top_of). Nothing else comes back. */
    int32_t all_rows;
    int32_t row_k;
    const int32_t *target;    /* [m] ids, -1: the row is not wanted */
    di_row_greedy *row_sum;   /* [m] host */
    float *row_x;             /* [m] host */
    di_row_top *row_top;      /* [m, row_k] host */
} di_fwd_out;

/* One forward in progress. */
typedef struct di_fwd {
    const di_lm *lm;
    const di_fwd_seq *seqs;
    int n_seqs;
    int64_t m;           /* rows = sum of chunk lengths */
    int32_t *pos;        /* [m] absolute position of each row */
    int32_t *seq;        /* [m] sequence of each row */
    int64_t *row0;       /* [n_seqs] first row of each sequence */
    int32_t *ids;        /* [m] */
    int32_t *hash;       /* [m, n_engram, (N-1)*Ne] Engram rows */
    int32_t **sel;       /* [n_blocks] -> [m, index_topk] selections of index sources
                            (backend memory when meta is set, else host) */
    int32_t *cand;       /* [m, candidate_topk_blocks] candidate blocks of this forward
                            (backend memory when meta is set, else host) */
    float *taps;         /* [m, n_taps*D] DSpark main hidden (bf16 values) */
    /* Step metadata: what the host decides for the whole pass (window slots,
     * visible entries, cache addresses), built once in di_fwd_begin. With a
     * backend that has the backend-memory selection forms it is uploaded
     * once into `meta` and the selections (sel, cand) stay in backend
     * memory, so nothing is read back on the host until the logits. */
    void *meta_host;     /* the block on the host (the tables below point into it or into meta) */
    void *meta;          /* the block in backend memory, or NULL: host forms */
    size_t meta_bytes;   /* its size */
    int recording;       /* the backend records this step (graph_record_begin) */
    const uint8_t *const *m_ring; /* [n_blocks, m] window ring of row i for block b */
    const uint8_t *const *m_ckv;  /* [n_blocks, m] compressed-KV cache (kv source's) */
    const uint8_t *const *m_ikey; /* [n_blocks, m] index-key cache (kv source's) */
    const int32_t *m_win;         /* [m, W] window slot codes (backend.h di_attn_rows) */
    const int32_t *m_nvis;        /* [n_blocks, m] visible compressed entries */
    const int32_t *m_ids;         /* [m] token ids */
    const int32_t *m_rows_last;   /* [n_seqs] last row of each sequence (the head's rows) */
    const int32_t *m_rows_all;    /* [m] 0 .. m-1 */
    const float *m_onehot;        /* [m, hc] the embedding's pre: one-hot copy 0 */
    const int32_t *m_spread;      /* [m · hc] row i / hc: the embedding spread to the copies */
    const float **m_cs;           /* [n_blocks] (host array) -> [m, rope_dim/2, 2] cos, sin of
                                     each row's position with block b's frequencies, or NULL */
    const float **m_cs_ent;       /* [n_blocks] (host array) -> [n_new, rope_dim/2, 2] the same
                                     for the entries block b's compressor completes, or NULL */
    /* Destinations of the pass's writes into the sequence states (backend.h
     * scatter_rows_to), so no copy of a step has a per-step address: */
    const uint8_t *const *m_ctok;   /* [n_blocks, m] per-token compressor ring (ratio > 1) */
    const uint8_t *const *m_dsring; /* [n_mtp, m] DSpark rings (with DSpark) */
    const int32_t *m_wslot;         /* [m] window / DSpark ring slot of the row, -1: not written */
    const int32_t *m_tslot;         /* [m] per-token compressor ring slot, -1: not written */
    const uint8_t *const **m_ent_ckv;  /* [n_blocks] (host array) -> [n_new] compressed-KV cache
                                          of each new entry's sequence */
    const uint8_t *const **m_ent_ikey; /* [n_blocks] (host array) -> [n_new] index-key cache */
    const int32_t **m_ent_slot;        /* [n_blocks] (host array) -> [n_new] the entry's index */
    const uint8_t *const **m_grp_base; /* [n_blocks] (host array) -> [n_new, ratio] per-token ring
                                          of each group token's sequence (ratio > 1), or NULL:
                                          a group older than the ring (host copies) */
    const int32_t **m_grp_slot;        /* [n_blocks] (host array) -> [n_new, ratio] its ring slot */
    const uint8_t **m_eng_rows;   /* [n_blocks] (host array) -> [m, ncols, Eh] the FP8 rows
                                     Engram block b looks up, gathered on the host, or NULL */
    const uint8_t **m_eng_scales; /* [n_blocks] (host array) -> [m, ncols, Eh/32] their scales */
    uint64_t step_key;   /* with the step metadata: a hash of what fixes the pass's ops,
                            shapes and buffer sizes (rows per sequence, the metadata's
                            layout, each compressor's new entries and group path, the
                            score widths); passes of one key issue the same op stream,
                            only the metadata's contents differ (test_forward_strict.c) */
    int dspark_p;        /* DSpark draft: main position p, else -1 */
    const di_fwd_out *out; /* NULL: every logits row to the host */
    int32_t *out_ban;      /* [n_seqs] with out: want[i].ban (host) */
    di_row_draw *out_draw; /* [n_seqs] with out: want[i].draw (host) */
    di_row_greedy *out_dev; /* [n_seqs] with out: the summaries (backend memory) */
    di_row_top *out_top;    /* [n_seqs, top_k] with out's top lists (backend memory) */
    int64_t *out_row;      /* [n_seqs] with out: the head's row of each sequence's last row */
    int32_t *out_seq;      /* [n_seqs] with out: logits_to_host's list of delivered sequences */
    di_row_greedy *out_rsum; /* [m] with out->all_rows: the target rows' summaries (backend memory) */
    float *out_rx;         /* [m] with out->all_rows: their targets' values (backend memory) */
    di_row_top *out_rtop;  /* [m, row_k] with out->all_rows: their top lists (backend memory) */
    int out_compact;       /* the head left out rows nobody reads (out_row says which it kept) */
    di_fwd_trace *trace; /* NULL or where the next block writes its sublayer outputs */
} di_fwd;

di_status di_fwd_begin(di_fwd *f, const di_lm *lm, const di_fwd_seq *seqs, int n_seqs,
                       di_err *err);
/* Records the chunk in each sequence's state (Engram history, length) and
 * releases the forward. */
void di_fwd_end(di_fwd *f);
/* Releases a begun forward without recording anything (the sequences stay
 * where they were): for looking at a pass's metadata and key. */
void di_fwd_abort(di_fwd *f);

/* s [m, HC, D] = HC copies of the embedding of ids [m]; pre [m, HC] = one-hot. */
di_status di_fwd_embed(di_fwd *f, const int32_t *ids, float *s, float *pre);
/* Logits [n, V] (host) of the given rows of the final streams s / pre;
 * drows: the same rows in backend memory (the step metadata's) or NULL. */
di_status di_fwd_head(di_fwd *f, const float *s, const float *pre, const int32_t *rows,
                      const int32_t *drows, int64_t n, float *logits, di_err *err);
/* The score width of a pass with the step metadata: the widest row's
 * visible entries rounded up (indexer.c; the same bits as the exact width). */
int64_t di_fwd_width_bucket(int64_t w);
/* RoPE of m rows of x at positions pos with block b's frequencies (the
 * rope op's arguments); when pos is the pass's row positions and the
 * backend has rope_cs, from the step metadata's table instead. */
void di_fwd_rope(di_fwd *f, int block, float *x, int64_t m, int64_t stride, int heads,
                 int64_t hd, const int32_t *pos, int inverse);
/* ya = x · waᵀ and yb = x · wbᵀ for two matrices of one format and input
 * size on one x: the backend's matmul_pair where it has one (one pass),
 * else two matmul calls. */
void di_fwd_matmul_pair(di_backend *be, const di_wmat *wa, const di_wmat *wb, const float *x, int64_t m,
                        float *ya, float *yb, unsigned flags);
/* The step metadata's angle table of block b that di_fwd_rope would use
 * for positions pos (backend memory), or NULL when it would not. */
const float *di_fwd_rope_cs(const di_fwd *f, int block, const int32_t *pos);

/* One block: s [m, HC, D] streams and pre [m, HC] collapse weights in, the
 * block's outputs and its FFN `pre` out (§4). */
di_status di_fwd_block(di_fwd *f, int block, float *s, float *pre, di_err *err);
/* Engram module of a block applied to s (§6.3). */
di_status di_engram_apply(di_fwd *f, int block, float *s, di_err *err);
/* Attention sublayer: x [m, D] normalised input → y [m, D] (§5). */
di_status di_attention(di_fwd *f, int block, const float *x, float *y, di_err *err);
/* Compressor of a kv-source block: appends the entries completed by this
 * chunk to the compressed-KV and index-key caches (§5.3). */
di_status di_compressor(di_fwd *f, int block, const float *x, di_err *err);
/* Indexer of an index-source block: fills f->sel[block] (§5.4). */
di_status di_indexer(di_fwd *f, int block, const float *x, const float *qr, di_err *err);
/* MoE sublayer: x [m, D] → y [m, D] (§7). */
di_status di_moe(di_fwd *f, int block, const float *x, float *y, di_err *err);
/* Writes the DSpark rings from f->taps for every row (§10.2). */
di_status di_dspark_seed(di_fwd *f, di_err *err);

/* Engram rows of n tokens starting at pos0 (history from st). */
void di_engram_hash(const di_lm *lm, const di_seqstate *st, const int32_t *ids, int64_t n,
                    int64_t pos0, int32_t *rows /*[n, n_engram, (N-1)*Ne]*/);
void di_engram_record(const di_lm *lm, di_seqstate *st, const int32_t *ids, int64_t n,
                      int64_t pos0);

/* Whole forward: logits of every row ([m, V], all_rows = 1) or of the last
 * row of each sequence ([n_seqs, V]); logits may be NULL. Advances every
 * sequence by its chunk. */
di_status di_forward(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits,
                     int all_rows, di_err *err);

/* di_forward with all_rows = 0, each sequence's last row delivered as
 * out->want[i] says: its logits at logits + i·V, its greedy summary
 * (di_row_greedy_of over ids [0, out->lim) without want[i].ban) at
 * out->greedy[i], its temperature draw (want[i].draw, backend.h
 * logits_draw) at out->greedy[i] — with pad 1 and the logits at logits +
 * i·V where the backend left the draw to the host — or nothing (a prefill
 * chunk that samples no token). On a device the summaries and draws are
 * formed next to the logits and only they cross the bus. DI_ERR_UNSUPPORTED
 * when the backend has no logits_greedy, or no logits_draw and a draw is
 * asked for (nothing run). */
di_status di_forward_rows(const di_lm *lm, const di_fwd_seq *seqs, int n_seqs, float *logits,
                          const di_fwd_out *out, di_err *err);

/* One DSpark round (§10.3) for a sequence whose last processed position is
 * p = st->n_tokens - 1, with x_{p+1} = input_id. Greedy drafting. Outputs:
 * logits [B, V] (Markov bias included), markov_bias [B, V] (may be NULL),
 * confidence [B], ids [B] with B = dspark_block_size. The sequence state is
 * not changed. */
di_status di_dspark_draft(const di_lm *lm, di_seqstate *st, int32_t input_id, float *logits,
                          float *markov_bias, float *confidence, int32_t *ids, di_err *err);
/* The same round with sampled drafting, as the reference samples: slot k's
 * token is argmax(softmax(logits_k / T) / noise_k) with the caller's Exp(1)
 * noise [B, V]; noise NULL or T = 0 is greedy. */
di_status di_dspark_draft_sampled(const di_lm *lm, di_seqstate *st, int32_t input_id,
                                  float temperature, const float *noise, float *logits,
                                  float *markov_bias, float *confidence, int32_t *ids,
                                  di_err *err);

/* The reference sampler (§3.8) given its Exp(1) noise e [V]: temperature 0
 * is argmax; otherwise argmax(softmax(logits / T) / e), the Gumbel-max form
 * of multinomial sampling. Ties go to the lower id. */
void di_sample_exp_noise(const float *logits, const float *e, int64_t V, float temperature,
                         int32_t *out);

#endif
