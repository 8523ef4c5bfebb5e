/* Engram's compressed-token map (architecture.md §6.2, step 1), derived from
 * the tokenizer: every id is decoded alone; ids whose text normalizes alike
 * share a class. Public entry: di_tokenizer_engram_map (deepinfer.h). */
#ifndef DI_RECIPE_ENGRAM_MAP_H
#define DI_RECIPE_ENGRAM_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* The Engram normalization of valid UTF-8 text s[0..n): NFKC, NFD, marks
 * removed, lowercase, runs of [ \t\r\n] -> one space, outer White_Space
 * stripped (a text that is exactly one space stays one space), U+E000 ->
 * space. Writes a malloc'd string to *out (*out_len bytes; may be empty). */
di_status di_engram_normalize(const uint8_t *s, size_t n, uint8_t **out, size_t *out_len,
                              di_err *err);

#endif
