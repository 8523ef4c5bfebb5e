/* libFuzzer target: arbitrary bytes as a safetensors file (ecosystem.md
 * §3.1). Whatever the reader accepts must satisfy the format's invariants,
 * and every byte of every accepted tensor must be readable (ASan checks that
 * the views stay inside the input). */
#include <stdint.h>
#include <stdlib.h>

#include "io/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_safetensors st;
    di_err err = {0};
    if (di_safetensors_parse(data, size, "fuzz", &st, &err) != DI_OK) {
        if (err.code == DI_OK || !err.msg[0]) abort(); /* a failure always says why */
        return 0;
    }
    uint64_t pos = 0, sum = 0;
    for (size_t i = 0; i < st.n_entries; i++) {
        di_tensor t;
        di_safetensors_tensor(&st, i, &t);
        if (st.entries[i].begin != pos) abort(); /* sorted, contiguous */
        pos = st.entries[i].end;
        uint64_t numel = 1;
        for (int d = 0; d < t.ndim; d++) numel *= (uint64_t)t.shape[d];
        if (numel * di_dtype_size(t.dtype) != t.nbytes) abort();
        for (size_t k = 0; k < t.nbytes; k++) sum += ((const uint8_t *)t.data)[k];
    }
    if (pos != st.data_size || 8 + st.header_len + st.data_size != size) abort();
    di_safetensors_close(&st);
    return sum == 0xFFFFFFFFFFFFFFFFull; /* keeps the reads */
}
