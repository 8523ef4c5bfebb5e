/* The DEEPINFER_* environment variables of the original release
 * (deepinfer.md §1.4), read once and validated: a value outside the accepted
 * set is an error naming the variable, its value and what is accepted.
 *
 * DSpark (ENABLE_MTP_VARLEN, USE_NEXTN_DECODE) and SWA bounded replay
 * (YOCO_PREFILL_*) settings are validated and recorded; they take effect
 * when those features are enabled in the engine. */
#ifndef DI_ENGINE_ENV_H
#define DI_ENGINE_ENV_H

#include <stdint.h>

#include "core/error.h"

typedef struct di_env {
    char *hf_model_dir;        /* DEEPINFER_HF_MODEL_DIR, NULL when unset */
    int accelerator;           /* DEEPINFER_ACCELERATOR: 0 unset, 1 cpu, 2 nvidia */
    int batch_invariant;       /* DEEPINFER_BATCH_INVARIANT: -1 unset, 0, 1 */
    int mtp_varlen;            /* DEEPINFER_ENABLE_MTP_VARLEN: 0 (default), 1 */
    int nextn_decode;          /* DEEPINFER_USE_NEXTN_DECODE: max draft length 1..16, default 5 */
    int yoco_mode;             /* DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE: 0 off (default), 1 compact */
    int64_t yoco_keep_tokens;  /* DEEPINFER_YOCO_PREFILL_KEEP_TOKENS: default 140, 1..1<<20 */
} di_env;

/* Reads the environment through getenv (get == NULL) or a lookup function
 * (tests). On failure *env is left empty. */
typedef const char *(*di_env_get_fn)(void *ctx, const char *name);
di_status di_env_read(di_env *env, di_env_get_fn get, void *ctx, di_err *err);
void di_env_free(di_env *env);

/* One line per variable: name = value (meaning), in a new string. */
char *di_env_describe(const di_env *env);

#endif
