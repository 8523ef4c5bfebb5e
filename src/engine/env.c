/* DEEPINFER_* environment variables (deepinfer.md §1.4): parsing and
 * validation. Booleans accept 1/0, true/false, yes/no, on/off. */
#include "engine/env.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const char *get_default(void *ctx, const char *name) {
    (void)ctx;
    return getenv(name);
}

static int parse_bool(const char *s, int *out) {
    static const char *yes[] = {"1", "true", "yes", "on"}, *no[] = {"0", "false", "no", "off"};
    for (int i = 0; i < 4; i++) {
        if (!strcasecmp(s, yes[i])) { *out = 1; return 0; }
        if (!strcasecmp(s, no[i])) { *out = 0; return 0; }
    }
    return -1;
}

static int parse_int(const char *s, int64_t lo, int64_t hi, int64_t *out) {
    if (!*s) return -1;
    char *end;
    long long v = strtoll(s, &end, 10);
    if (*end || v < lo || v > hi) return -1;
    *out = v;
    return 0;
}

static di_status read_bool(const char *name, const char *v, int *out, di_err *err) {
    if (v && *v && parse_bool(v, out))
        return di_err_set(err, DI_ERR_INVALID_ARG, "%s=\"%s\": expected 1 or 0 (also true/false, yes/no, on/off)",
                          name, v);
    return DI_OK;
}

di_status di_env_read(di_env *env, di_env_get_fn get, void *ctx, di_err *err) {
    memset(env, 0, sizeof *env);
    env->batch_invariant = -1;
    env->nextn_decode = 5;
    env->yoco_keep_tokens = 140;
    if (!get) get = get_default;
    const char *v = get(ctx, "DEEPINFER_HF_MODEL_DIR");
    if (v && *v) {
        env->hf_model_dir = strdup(v);
        if (!env->hf_model_dir) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    di_status st = DI_OK;
    v = get(ctx, "DEEPINFER_ACCELERATOR");
    if (v && *v) {
        if (!strcasecmp(v, "cpu")) env->accelerator = 1;
        else if (!strcasecmp(v, "nvidia")) env->accelerator = 2;
        else if (!strcasecmp(v, "ascend"))
            st = di_err_set(err, DI_ERR_UNSUPPORTED,
                            "DEEPINFER_ACCELERATOR=ascend: Ascend NPUs are not supported in this build "
                            "(supported: cpu, nvidia)");
        else
            st = di_err_set(err, DI_ERR_INVALID_ARG, "DEEPINFER_ACCELERATOR=\"%s\": expected cpu or nvidia", v);
    }
    int b = 0;
    v = get(ctx, "DEEPINFER_BATCH_INVARIANT");
    if (!st && v && *v && !(st = read_bool("DEEPINFER_BATCH_INVARIANT", v, &b, err))) env->batch_invariant = b;
    v = get(ctx, "DEEPINFER_ENABLE_MTP_VARLEN");
    if (!st) st = read_bool("DEEPINFER_ENABLE_MTP_VARLEN", v, &env->mtp_varlen, err);
    int64_t n;
    v = get(ctx, "DEEPINFER_USE_NEXTN_DECODE");
    if (!st && v && *v) {
        if (parse_int(v, 1, 16, &n))
            st = di_err_set(err, DI_ERR_INVALID_ARG,
                            "DEEPINFER_USE_NEXTN_DECODE=\"%s\": expected the maximum draft length, an integer in 1..16",
                            v);
        else env->nextn_decode = (int)n;
    }
    v = get(ctx, "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE");
    if (!st && v && *v) {
        if (!strcasecmp(v, "compact")) env->yoco_mode = 1;
        else if (!strcasecmp(v, "none") || !strcasecmp(v, "off") || !strcmp(v, "0")) env->yoco_mode = 0;
        else
            st = di_err_set(err, DI_ERR_INVALID_ARG,
                            "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE=\"%s\": expected compact or none", v);
    }
    v = get(ctx, "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS");
    if (!st && v && *v) {
        if (parse_int(v, 1, 1 << 20, &n))
            st = di_err_set(err, DI_ERR_INVALID_ARG,
                            "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS=\"%s\": expected an integer in 1..1048576 "
                            "(the SWA window plus the maximum backtracking length, 140 for V4.1)",
                            v);
        else env->yoco_keep_tokens = n;
    }
    if (st) di_env_free(env);
    return st;
}

void di_env_free(di_env *env) {
    free(env->hf_model_dir);
    env->hf_model_dir = NULL;
}

char *di_env_describe(const di_env *e) {
    static const char *acc[] = {"(unset: cpu)", "cpu", "nvidia"};
    char *s = NULL;
    size_t n = 0;
    FILE *f = open_memstream(&s, &n);
    if (!f) return NULL;
    fprintf(f, "DEEPINFER_HF_MODEL_DIR = %s (model folder when none is given)\n",
            e->hf_model_dir ? e->hf_model_dir : "(unset: embedded default model)");
    fprintf(f, "DEEPINFER_ACCELERATOR = %s (cpu or nvidia)\n", acc[e->accelerator]);
    fprintf(f, "DEEPINFER_BATCH_INVARIANT = %s (logits independent of the batch)\n",
            e->batch_invariant < 0 ? "(unset: 0)" : e->batch_invariant ? "1" : "0");
    fprintf(f, "DEEPINFER_ENABLE_MTP_VARLEN = %d (DSpark confidence-scheduled verification)\n", e->mtp_varlen);
    fprintf(f, "DEEPINFER_USE_NEXTN_DECODE = %d (maximum DSpark draft length)\n", e->nextn_decode);
    fprintf(f, "DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE = %s (SWA bounded replay)\n",
            e->yoco_mode ? "compact" : "none");
    fprintf(f, "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS = %lld (replayed suffix)\n", (long long)e->yoco_keep_tokens);
    fclose(f);
    return s;
}
