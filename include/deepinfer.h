/* deepinfer — offline inference engine for DeepSeek-V4.1-Flash.
 *
 * The public C API. It is deliberately narrow: opaque handles, plain C types,
 * and one rule for failures — every function that can fail returns a
 * di_status (DI_OK == 0 on success) and leaves a human-readable message that
 * the caller reads with di_last_error() on the same thread. The library never
 * prints and never terminates the process.
 *
 * Sections: status & errors, version, models (open / inspect / close),
 * memory plans. Later sections (tokenizer, constraints, engine) follow the
 * same conventions. */
#ifndef DEEPINFER_H
#define DEEPINFER_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define DI_API __attribute__((visibility("default")))
#else
#define DI_API
#endif

/* ---------------------------------------------------------------- status */

typedef enum di_status {
    DI_OK = 0,
    DI_ERR_INVALID_ARG = 1, /* a caller-supplied value is out of range */
    DI_ERR_IO = 2,          /* open / read / mmap / write failed */
    DI_ERR_FORMAT = 3,      /* malformed file or document */
    DI_ERR_UNSUPPORTED = 4, /* valid but not supported by this build/model */
    DI_ERR_NOMEM = 5,       /* allocation failed */
    DI_ERR_LIMIT = 6,       /* a configured cap was exceeded */
    DI_ERR_NOT_FOUND = 7,   /* a named thing does not exist */
    DI_ERR_STATE = 8,       /* call not valid in the object's current state */
    DI_ERR_BACKEND = 9,     /* accelerator / kernel failure */
    DI_ERR_INTERNAL = 10    /* a bug: please report */
} di_status;

/* Message of the last failure on this thread ("" if none). The pointer stays
 * valid until the next failing call on the same thread. */
DI_API const char *di_last_error(void);
DI_API di_status di_last_status(void);

/* --------------------------------------------------------------- version */

DI_API const char *di_version(void);

/* ----------------------------------------------------------------- models */

typedef struct di_model di_model; /* opaque: config + bound weights */

typedef enum di_load_format {
    DI_LOAD_AUTO = 0,  /* safetensors checkpoint from a model directory */
    DI_LOAD_DUMMY = 1  /* random weights in the official formats, no files */
} di_load_format;

typedef struct di_model_options {
    di_load_format load_format;
    uint64_t seed;        /* dummy weights: generator seed */
    int verify_data;      /* 1 = read every byte once while opening (check) */
} di_model_options;

DI_API void di_model_options_default(di_model_options *opts);

/* Opens a model directory (config.json + safetensors shards [+ index]).
 * For DI_LOAD_DUMMY, `path` is a config.json file or a directory holding one. */
DI_API di_status di_model_open(const char *path, const di_model_options *opts,
                               di_model **out);
DI_API void di_model_close(di_model *model);

/* Directory of the embedded default tiny model. It is generated
 * deterministically (dummy weights in the official format) into the cache
 * folder ($DEEPINFER_CACHE_DIR, else $XDG_CACHE_HOME/deepinfer, else
 * ~/.cache/deepinfer) on first use. Writes the path into buf. */
DI_API di_status di_default_model_path(char *buf, size_t buf_size);

/* ------------------------------------------------------------ memory plan */

/* Renders the memory plan of a model (weights per dtype, per-token KV/index
 * bytes, fixed per-sequence state, devices needed) as text or JSON into a
 * newly allocated string the caller releases with di_free(). */
DI_API di_status di_model_plan(const di_model *model, int as_json,
                               uint64_t context_tokens, uint32_t batch,
                               double device_gib, char **out);

/* Releases memory the library allocated for the caller. */
DI_API void di_free(void *p);

#ifdef __cplusplus
}
#endif

#endif /* DEEPINFER_H */
