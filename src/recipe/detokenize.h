/* Streaming detokenizer (issue: decode while generating): text is emitted
 * only up to the last complete UTF-8 character; an unfinished sequence at
 * the end is held back until a later token completes it or the stream is
 * flushed. Public API in deepinfer.h (di_detokenizer_*). */
#ifndef DI_RECIPE_DETOKENIZE_H
#define DI_RECIPE_DETOKENIZE_H

#include <stddef.h>
#include <stdint.h>

/* Appends s[0..n) to out with every ill-formed sequence replaced by U+FFFD
 * (maximal subparts, as Python's and Rust's lossy decoders do). out needs
 * room for 3 * n bytes. Returns the bytes written. */
size_t di_utf8_lossy(const uint8_t *s, size_t n, uint8_t *out);

#endif
