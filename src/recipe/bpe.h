/* Byte-level BPE merging (ecosystem.md §2.1, §2.3): merges are applied
 * lowest rank first, leftmost first among equal ranks, exactly as HF
 * tokenizers' BPE model does. Symbols are token ids; a word starts as one
 * symbol per byte. Short words use a linear scan over pair ranks, long ones
 * a binary heap, so a huge single piece stays O(n log n). */
#ifndef DI_RECIPE_BPE_H
#define DI_RECIPE_BPE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Largest token id and merge count the packed merge table can hold. */
#define DI_BPE_MAX_ID ((1 << 20) - 2)
#define DI_BPE_MAX_MERGES (1 << 24)

typedef struct di_bpe {
    int32_t byte_id[256];    /* [256] id of the single-byte token, -1 when absent */
    uint64_t *slots;         /* [cap] open addressing: left (20 bits) | right (20) | rank (24);
                                8 bytes a slot keep the table at 2 MiB for 128k merges */
    int32_t *merged;         /* [n_ranks] id each merge produces, by rank */
    uint64_t *filter;        /* [FILTER_BITS / 64] one bit per hashed pair: most pairs a
                                word asks about have no merge, and this 256 KiB answer
                                stays in cache where the 2 MiB table does not */
    size_t cap;              /* power of two */
    size_t n_ranks;
    uint32_t *byte_rank;     /* [256 * 256] rank of merging two single-byte tokens, by
                                their bytes (UINT32_MAX = none): the first merges of
                                every word from a dense table instead of hash probes */
} di_bpe;

/* Sizes the merge table for n_merges entries (<= DI_BPE_MAX_MERGES); byte_id
 * starts all -1. */
di_status di_bpe_init(di_bpe *bpe, size_t n_merges, di_err *err);
void di_bpe_free(di_bpe *bpe);

/* Adds (left, right) -> merged (ids <= DI_BPE_MAX_ID) with the given rank
 * (< n_merges). A pair listed twice keeps the later entry, as HF's loader
 * does. */
void di_bpe_add(di_bpe *bpe, int32_t left, int32_t right, int32_t merged, uint32_t rank);

/* Fills byte_rank once byte_id and every merge are in. */
di_status di_bpe_finish(di_bpe *bpe, di_err *err);

/* Scratch for long words; reused across calls. */
typedef struct di_bpe_scratch {
    void *mem;
    size_t cap;
} di_bpe_scratch;
void di_bpe_scratch_free(di_bpe_scratch *s);

/* Tokenizes one word of n bytes into out[] (room for n ids); returns the
 * number of ids, or (size_t)-1 when scratch memory could not be allocated.
 * Bytes without a single-byte token are dropped, as HF does without an unk
 * token. */
size_t di_bpe_word(const di_bpe *bpe, const uint8_t *bytes, size_t n, int32_t *out,
                   di_bpe_scratch *scratch);

#endif
