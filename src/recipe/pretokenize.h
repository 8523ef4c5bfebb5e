/* The DeepSeek V3/V4 pre-tokenizer (ecosystem.md §2.1): three `Split`
 * steps with behavior "Isolated", applied one after another to the pieces
 * the previous step produced, then ByteLevel (a byte-to-symbol mapping that
 * the BPE stage works on directly).
 *
 *   1. \p{N}{1,3}
 *   2. [一-龥぀-ゟ゠-ヿ]+
 *   3. [!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+|
 *       ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
 *
 * The regexes are implemented as hand-written matchers with Oniguruma's
 * leftmost-first alternation and backtracking semantics; each step sees only
 * its own piece (so `(?!\S)` looks no further than the piece's end). The
 * tokenizer loader checks that a tokenizer.json names exactly these patterns
 * (di_pretokenize_pattern). */
#ifndef DI_RECIPE_PRETOKENIZE_H
#define DI_RECIPE_PRETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* The three regex strings as they appear in tokenizer.json (JSON-unescaped),
 * index 0..2 in pipeline order. */
const char *di_pretokenize_pattern(int step);
#define DI_PRETOKENIZE_STEPS 3

/* Called for each piece [start, end) (byte offsets into the text), in order.
 * A non-zero return stops the walk and is passed back. */
typedef int (*di_piece_fn)(void *ctx, size_t start, size_t end);

/* Scratch arrays reused across calls (per character: class and offset). */
typedef struct di_pretok_scratch {
    uint16_t *cls;  /* [cap] DI_UC_* bits per character */
    uint32_t *off;  /* [cap + 1] byte offset of each character */
    size_t cap;
} di_pretok_scratch;

void di_pretok_scratch_free(di_pretok_scratch *s);

/* Splits text[0..n) into pre-tokens. Invalid UTF-8 bytes are single
 * characters of class "symbol" (see unicode.h). Returns DI_OK, or DI_ERR_LIMIT
 * for texts of 4 GiB or more, DI_ERR_NOMEM, or DI_ERR_STATE when fn stopped
 * the walk (*stopped then holds fn's value). */
di_status di_pretokenize(const uint8_t *text, size_t n, di_pretok_scratch *scratch,
                         di_piece_fn fn, void *ctx, int *stopped, di_err *err);

#endif
