/* Engine parts without a model: DEEPINFER_* variables (accepted values,
 * errors naming the variable), stop-string search over growing text. */
#include <string.h>

#include "engine/env.h"
#include "engine/stop.h"
#include "backend/cpu/kernels.h"
#include "test.h"

typedef struct kv {
    const char *k, *v;
} kv;

static const char *lookup(void *ctx, const char *name) {
    for (const kv *p = ctx; p->k; p++)
        if (!strcmp(p->k, name)) return p->v;
    return NULL;
}

static di_status env_of(kv *vars, di_env *env, di_err *err) { return di_env_read(env, lookup, vars, err); }

static void test_env(void) {
    di_env env;
    di_err err = {0};
    kv none[] = {{NULL, NULL}};
    CHECK(env_of(none, &env, &err) == DI_OK);
    CHECK(env.hf_model_dir == NULL);
    CHECK_EQ_INT(env.accelerator, 0);
    CHECK_EQ_INT(env.batch_invariant, -1);
    CHECK_EQ_INT(env.nextn_decode, 5);
    CHECK_EQ_INT(env.yoco_keep_tokens, 140);
    di_env_free(&env);
    kv good[] = {{"DEEPINFER_HF_MODEL_DIR", "/models/v41"},
                 {"DEEPINFER_ACCELERATOR", "nvidia"},
                 {"DEEPINFER_BATCH_INVARIANT", "1"},
                 {"DEEPINFER_ENABLE_MTP_VARLEN", "true"},
                 {"DEEPINFER_USE_NEXTN_DECODE", "3"},
                 {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "compact"},
                 {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "140"},
                 {NULL, NULL}};
    CHECK(env_of(good, &env, &err) == DI_OK);
    CHECK(env.hf_model_dir && !strcmp(env.hf_model_dir, "/models/v41"));
    CHECK_EQ_INT(env.accelerator, 2);
    CHECK_EQ_INT(env.batch_invariant, 1);
    CHECK_EQ_INT(env.mtp_varlen, 1);
    CHECK_EQ_INT(env.nextn_decode, 3);
    CHECK_EQ_INT(env.yoco_mode, 1);
    char *d = di_env_describe(&env);
    CHECK_STR_CONTAINS(d, "DEEPINFER_USE_NEXTN_DECODE = 3");
    free(d);
    di_env_free(&env);
    struct {
        const char *k, *v, *msg;
        di_status code;
    } bad[] = {
        {"DEEPINFER_ACCELERATOR", "ascend", "not supported in this build", DI_ERR_UNSUPPORTED},
        {"DEEPINFER_ACCELERATOR", "tpu", "expected cpu or nvidia", DI_ERR_INVALID_ARG},
        {"DEEPINFER_BATCH_INVARIANT", "2", "DEEPINFER_BATCH_INVARIANT=\"2\"", DI_ERR_INVALID_ARG},
        {"DEEPINFER_ENABLE_MTP_VARLEN", "maybe", "DEEPINFER_ENABLE_MTP_VARLEN", DI_ERR_INVALID_ARG},
        {"DEEPINFER_USE_NEXTN_DECODE", "0", "1..16", DI_ERR_INVALID_ARG},
        {"DEEPINFER_USE_NEXTN_DECODE", "5x", "DEEPINFER_USE_NEXTN_DECODE", DI_ERR_INVALID_ARG},
        {"DEEPINFER_YOCO_PREFILL_TRUNCATION_MODE", "full", "compact or none", DI_ERR_INVALID_ARG},
        {"DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", "-4", "DEEPINFER_YOCO_PREFILL_KEEP_TOKENS", DI_ERR_INVALID_ARG},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kv one[] = {{bad[i].k, bad[i].v}, {NULL, NULL}};
        di_err e2 = {0};
        di_status st = env_of(one, &env, &e2);
        CHECKF(st == bad[i].code, "%s=%s: status %d", bad[i].k, bad[i].v, st);
        CHECK_STR_CONTAINS(e2.msg, bad[i].msg);
    }
}

static void test_stop(void) {
    di_stop s;
    const char *strs[] = {"END", "\n\n", "xyzw"};
    CHECK(di_stop_init(&s, strs, 3) == 0);
    CHECK_EQ_INT(s.max_len, 4);
    size_t pos = 0;
    /* grown piece by piece: "abc E" then "N" then "D..." — found only when complete */
    const char *text = "abc END and more\n\n";
    CHECK_EQ_INT(di_stop_find(&s, text, 5, 0, &pos), -1);
    CHECK_EQ_INT(di_stop_find(&s, text, 6, 5, &pos), -1);
    CHECK_EQ_INT(di_stop_find(&s, text, 9, 6, &pos), 0);
    CHECK_EQ_INT(pos, 4);
    /* a match wholly before `from` is not reported again */
    CHECK_EQ_INT(di_stop_find(&s, text, 12, 9, &pos), -1);
    CHECK_EQ_INT(di_stop_find(&s, text, strlen(text), 12, &pos), 1);
    CHECK_EQ_INT(pos, 16);
    /* the earliest start wins */
    CHECK_EQ_INT(di_stop_find(&s, "q\n\nEND", 6, 0, &pos), 1);
    di_stop_free(&s);
    const char *empty[] = {""};
    CHECK_EQ_INT(di_stop_init(&s, empty, 1), -2);
}

/* The nvidia accelerator opens the CUDA backend: on a machine without a GPU
 * (or a build without CUDA) that is a clear error naming CUDA, never a
 * silent fallback to the CPU. */
static void test_accelerator_nvidia(void) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.accelerator = DI_ACCEL_NVIDIA;
    di_engine *e = NULL;
    di_status st = di_engine_open(&o, &e);
    if (st == DI_OK) {
        CHECK(e != NULL);
        di_engine_close(e);
        return;
    }
    CHECK(e == NULL);
    CHECK(st == DI_ERR_UNSUPPORTED || st == DI_ERR_BACKEND);
    CHECK_STR_CONTAINS(di_last_error(), "CUDA");
}

int main(void) {
    /* the CPU kernels' kept scratch filled with NaN before every use: a read
     * of a part a call did not write shows as NaN, not as a previous call's
     * values */
    di_cpu_kernels_poison_buffers(1);
    RUN(test_env);
    RUN(test_accelerator_nvidia);
    RUN(test_stop);
    return test_summary();
}
