/* libFuzzer target: arbitrary bytes as tokenizer.json (ecosystem.md §2.1).
 * A rejected file must come with a message; an accepted one must encode,
 * decode and build its Engram map without faults, and decode its own
 * encodings back to the input when every byte has a token. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "deepinfer.h"
#include "recipe/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static const char sample[] = "Hello, wörld! 123 <｜User｜>中文\r\n  \t x\xff\xc3";

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_tokenizer *t = NULL;
    di_err err = {0};
    if (di_tokenizer_parse((const char *)data, size, "fuzz", &t, &err) != DI_OK) {
        if (err.code == DI_OK || !err.msg[0] || t) abort();
        return 0;
    }
    int all_bytes = 1;
    for (int b = 0; b < 256; b++)
        if (t->bpe.byte_id[b] < 0) all_bytes = 0;
    for (unsigned flags = 0; flags < 2; flags++) {
        int32_t *ids;
        size_t n;
        if (di_tokenizer_encode(t, sample, sizeof sample - 1, flags, &ids, &n)) abort();
        char *back;
        size_t bl;
        if (di_tokenizer_decode(t, ids, n, &back, &bl)) abort();
        if (all_bytes && (bl != sizeof sample - 1 || memcmp(back, sample, bl))) abort();
        di_free(back);
        di_free(ids);
    }
    size_t v = di_tokenizer_vocab_size(t);
    if (v <= 4096) {
        int32_t *map = malloc(v * sizeof *map);
        int classes = 0;
        if (!map || di_tokenizer_engram_map(t, map, &classes)) abort();
        if (classes < 1 || (size_t)classes > v) abort();
        free(map);
    }
    di_tokenizer_free(t);
    return 0;
}
