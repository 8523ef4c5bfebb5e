/* libFuzzer target: arbitrary bytes as model.safetensors.index.json
 * (ecosystem.md §3.1). Accepted indexes must be self-consistent: every name
 * found through the table at its own position, every file id in range, no
 * shard name that leaves the model directory. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "io/checkpoint_index.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    di_ckpt_index ix;
    di_err err = {0};
    if (di_ckpt_index_parse((const char *)data, size, &ix, &err) != DI_OK) {
        if (err.code == DI_OK || !err.msg[0]) abort();
        return 0;
    }
    for (size_t i = 0; i < ix.n_names; i++) {
        uint32_t k;
        if (!di_name_table_find(&ix.lookup, ix.names[i], &k) || k != i) abort();
        if (ix.file_of[i] >= ix.n_files) abort();
    }
    for (size_t f = 0; f < ix.n_files; f++)
        if (!ix.files[f][0] || strchr(ix.files[f], '/') || !strcmp(ix.files[f], "..")) abort();
    di_ckpt_index_free(&ix);
    return 0;
}
