/* The embedded default model: the golden v41-tiny config and tokenizer
 * (assets/default-model/, compiled into the library) with dummy weights from
 * a fixed seed, written once in the official checkpoint layout (two shards +
 * index) into the cache folder and reused afterwards. */
#ifndef DI_MODEL_DEFAULT_MODEL_H
#define DI_MODEL_DEFAULT_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

/* Seed of the default model's dummy weights. Changing it changes the model,
 * so it is part of the folder's version. */
#define DI_DEFAULT_MODEL_SEED 0x7e57c0deull

/* An embedded file. */
typedef struct di_asset {
    const char *name; /* file name inside the model folder */
    const unsigned char *data;
    size_t size;
} di_asset;

/* The embedded files (config.json, tokenizer.json, tokenizer_config.json). */
size_t di_default_model_asset_count(void);
const di_asset *di_default_model_asset(size_t i);

/* Cache root: $DEEPINFER_CACHE_DIR, else $XDG_CACHE_HOME/deepinfer, else
 * $HOME/.cache/deepinfer. */
di_status di_cache_dir(char *buf, size_t n, di_err *err);

/* Folder of the default model (whether or not it exists yet). */
di_status di_default_model_dir(char *buf, size_t n, di_err *err);

/* 1 when the folder is complete (it is only ever created by a rename). */
int di_default_model_ready(const char *dir);

/* Makes sure the folder exists, generating it when absent: written into a
 * temporary folder beside it, then renamed into place, so a reader never
 * sees a half-written model and concurrent first runs are safe. */
di_status di_default_model_ensure(char *buf, size_t n, int *generated, di_err *err);

#endif
