/* The embedded default tiny model and its cache folder. */
#include "model/default_model.h"

#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deepinfer.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/dummy.h"

/* The asset bytes are assembled into .rodata straight from the files (paths
 * relative to the repository root, where the build runs), each followed by a
 * NUL so the JSON can also be read as a C string. */
#define DI_ASSET(sym, file)                                                      \
    __asm__(".section .rodata\n"                                                 \
            ".balign 16\n"                                                       \
            ".globl " #sym "\n"                                                  \
            ".hidden " #sym "\n"                                                 \
            #sym ":\n"                                                           \
            ".incbin \"" file "\"\n"                                             \
            ".globl " #sym "_end\n"                                              \
            ".hidden " #sym "_end\n"                                             \
            #sym "_end:\n"                                                       \
            ".byte 0\n"                                                          \
            ".previous\n");                                                      \
    extern const unsigned char sym[] __attribute__((visibility("hidden")));      \
    extern const unsigned char sym##_end[] __attribute__((visibility("hidden")))

DI_ASSET(di_asset_config, "assets/default-model/config.json");
DI_ASSET(di_asset_tokenizer, "assets/default-model/tokenizer.json");
DI_ASSET(di_asset_tokenizer_config, "assets/default-model/tokenizer_config.json");

static di_asset assets[3];

static void assets_init(void) {
    assets[0] = (di_asset){"config.json", di_asset_config, (size_t)(di_asset_config_end - di_asset_config)};
    assets[1] = (di_asset){"tokenizer.json", di_asset_tokenizer, (size_t)(di_asset_tokenizer_end - di_asset_tokenizer)};
    assets[2] = (di_asset){"tokenizer_config.json", di_asset_tokenizer_config,
                           (size_t)(di_asset_tokenizer_config_end - di_asset_tokenizer_config)};
}

size_t di_default_model_asset_count(void) { return sizeof assets / sizeof *assets; }

const di_asset *di_default_model_asset(size_t i) {
    if (!assets[0].name) assets_init();
    return i < di_default_model_asset_count() ? &assets[i] : NULL;
}

di_status di_cache_dir(char *buf, size_t n, di_err *err) {
    const char *env = getenv("DEEPINFER_CACHE_DIR");
    int k;
    if (env && *env) k = snprintf(buf, n, "%s", env);
    else if ((env = getenv("XDG_CACHE_HOME")) && *env) k = snprintf(buf, n, "%s/deepinfer", env);
    else if ((env = getenv("HOME")) && *env) k = snprintf(buf, n, "%s/.cache/deepinfer", env);
    else
        return di_err_set(err, DI_ERR_NOT_FOUND,
                          "no cache folder: set DEEPINFER_CACHE_DIR (or XDG_CACHE_HOME or HOME)");
    if (k < 0 || (size_t)k >= n) return di_err_set(err, DI_ERR_LIMIT, "cache folder path too long");
    return DI_OK;
}

/* The cache folder's name carries a fingerprint of what the model is made
 * from (the embedded files and the weights' seed), not only the library
 * version: a build whose assets changed without a version bump must not
 * pick up a folder generated from the old ones. FNV-1a over the names,
 * sizes and bytes, computed once per process. */
static uint32_t fingerprint;
static pthread_once_t fingerprint_once = PTHREAD_ONCE_INIT;

static void fingerprint_init(void) {
    uint64_t h = 0xcbf29ce484222325ull;
#define FNV_BYTES(p, len)                                      \
    for (size_t j_ = 0; j_ < (len); j_++) {                    \
        h ^= ((const unsigned char *)(p))[j_];                 \
        h *= 0x100000001b3ull;                                 \
    }
    for (size_t i = 0; i < di_default_model_asset_count(); i++) {
        const di_asset *a = di_default_model_asset(i);
        uint64_t size = a->size;
        FNV_BYTES(a->name, strlen(a->name) + 1)
        FNV_BYTES(&size, sizeof size)
        FNV_BYTES(a->data, a->size)
    }
    uint64_t seed = DI_DEFAULT_MODEL_SEED;
    FNV_BYTES(&seed, sizeof seed)
#undef FNV_BYTES
    fingerprint = (uint32_t)(h ^ (h >> 32));
}

di_status di_default_model_dir(char *buf, size_t n, di_err *err) {
    char root[3072];
    di_status st = di_cache_dir(root, sizeof root, err);
    if (st) return st;
    pthread_once(&fingerprint_once, fingerprint_init);
    int k = snprintf(buf, n, "%s/default-v41-tiny-%s-%08x", root, di_version(), (unsigned)fingerprint);
    if (k < 0 || (size_t)k >= n) return di_err_set(err, DI_ERR_LIMIT, "default model path too long");
    return DI_OK;
}

int di_default_model_ready(const char *dir) {
    char p[4200];
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    return stat(p, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* mkdir -p */
static di_status make_dirs(const char *path, di_err *err) {
    char tmp[4096];
    if (snprintf(tmp, sizeof tmp, "%s", path) >= (int)sizeof tmp)
        return di_err_set(err, DI_ERR_LIMIT, "%s: path too long", path);
    for (char *p = tmp + 1;; p++) {
        if (*p == '/' || !*p) {
            char c = *p;
            *p = 0;
            if (mkdir(tmp, 0755) && errno != EEXIST)
                return di_err_set(err, DI_ERR_IO, "%s: cannot create folder: %s", tmp, strerror(errno));
            *p = c;
            if (!c) break;
        }
    }
    return DI_OK;
}

static const char *const shard_files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                                          "model.safetensors.index.json"};

/* Removes a temporary folder of ours: only the files we write in it. */
static void remove_tmp(const char *dir) {
    char p[4200];
    for (size_t i = 0; i < di_default_model_asset_count(); i++) {
        snprintf(p, sizeof p, "%s/%s", dir, di_default_model_asset(i)->name);
        unlink(p);
    }
    for (size_t i = 0; i < sizeof shard_files / sizeof *shard_files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, shard_files[i]);
        unlink(p);
    }
    rmdir(dir);
}

static di_status write_file(const char *dir, const char *name, const void *data, size_t n, di_err *err) {
    char p[4200];
    if (snprintf(p, sizeof p, "%s/%s", dir, name) >= (int)sizeof p)
        return di_err_set(err, DI_ERR_LIMIT, "%s: path too long", dir);
    FILE *f = fopen(p, "wb");
    if (!f) return di_err_set(err, DI_ERR_IO, "%s: cannot create: %s", p, strerror(errno));
    int ok = fwrite(data, 1, n, f) == n;
    if (fclose(f)) ok = 0;
    return ok ? DI_OK : di_err_set(err, DI_ERR_IO, "%s: write failed", p);
}

/* Writes the whole model into dir (which exists and is empty). */
static di_status generate(const char *dir, di_err *err) {
    for (size_t i = 0; i < di_default_model_asset_count(); i++) {
        const di_asset *a = di_default_model_asset(i);
        di_status st = write_file(dir, a->name, a->data, a->size, err);
        if (st) return st;
    }
    di_config cfg;
    const di_asset *c = di_default_model_asset(0);
    di_status st = di_config_parse((const char *)c->data, c->size, &cfg, err);
    if (st) return di_err_prefix(err, "embedded config.json: ");
    di_dummy_options o;
    di_dummy_options_default(&o);
    o.seed = DI_DEFAULT_MODEL_SEED;
    di_dummy d;
    st = di_dummy_build(&d, &cfg, &o, err);
    if (st) return st;
    di_st_named *v = malloc(d.manifest.n * sizeof *v);
    if (!v) {
        di_dummy_free(&d);
        return di_err_set(err, DI_ERR_NOMEM, "default model: out of memory");
    }
    for (size_t i = 0; i < d.manifest.n; i++) {
        v[i].name = d.manifest.v[i].name;
        v[i].t = d.manifest.v[i].slot;
    }
    st = di_safetensors_write_sharded(dir, v, d.manifest.n, 2, NULL, NULL, err);
    free(v);
    di_dummy_free(&d);
    return st;
}

di_status di_default_model_ensure(char *buf, size_t n, int *generated, di_err *err) {
    if (generated) *generated = 0;
    di_status st = di_default_model_dir(buf, n, err);
    if (st) return st;
    if (di_default_model_ready(buf)) return DI_OK;
    char root[3072];
    st = di_cache_dir(root, sizeof root, err);
    if (st) return st;
    st = make_dirs(root, err);
    if (st) return st;
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s/.default-v41-tiny-tmp-XXXXXX", root);
    if (!mkdtemp(tmp)) return di_err_set(err, DI_ERR_IO, "%s: cannot create a temporary folder: %s", root, strerror(errno));
    st = generate(tmp, err);
    if (st) {
        remove_tmp(tmp);
        return di_err_prefix(err, "generating the default model in %s: ", root);
    }
    chmod(tmp, 0755); /* mkdtemp made it private; the model is not secret */
    if (rename(tmp, buf)) {
        int e = errno;
        remove_tmp(tmp);
        /* Another process finished first: its folder is as good as ours. */
        if ((e == EEXIST || e == ENOTEMPTY) && di_default_model_ready(buf)) return DI_OK;
        return di_err_set(err, DI_ERR_IO, "%s: cannot move the generated model into place: %s", buf, strerror(e));
    }
    if (generated) *generated = 1;
    return DI_OK;
}
