/* Dummy weights: deterministic per seed, independent of thread count and
 * order, slices reproducible on demand, shapes/dtypes that pass binding, and
 * value distributions that match the documented targets. */
#include <stdint.h>

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "deepinfer.h"
#include "model/default_model.h"
#include "model/dummy.h"
#include "model_fixtures.h"
#include "test.h"

static di_config tiny, real;

static void build(di_dummy *d, uint64_t seed, int threads) {
    di_dummy_options o;
    di_dummy_options_default(&o);
    o.seed = seed;
    o.threads = threads;
    di_err e = {0};
    CHECKF(di_dummy_build(d, &tiny, &o, &e) == DI_OK, "%s", e.msg);
}

static void test_determinism(void) {
    di_dummy a, b, c;
    build(&a, 42, 1);
    build(&b, 42, 4);
    build(&c, 43, 2);
    CHECK(a.arena_bytes == b.arena_bytes && a.arena_bytes == c.arena_bytes);
    CHECK(a.arena_bytes >= 4743944);
    CHECK(memcmp(a.arena, b.arena, a.arena_bytes) == 0);
    /* a different seed changes every tensor that is not a constant scale */
    size_t same = 0, random_tensors = 0;
    for (size_t i = 0; i < a.manifest.n; i++) {
        const di_manifest_entry *e = &a.manifest.v[i];
        if (e->role == DI_TR_FP8_SCALE || e->role == DI_TR_FP4_SCALE || e->role == DI_TR_ENGRAM_SCALE) continue;
        random_tensors++;
        if (!memcmp(e->slot->data, c.manifest.v[i].slot->data, e->slot->nbytes)) same++;
    }
    CHECK(random_tensors > 500);
    CHECK_EQ_INT(same, 0);
    di_dummy_free(&a);
    di_dummy_free(&b);
    di_dummy_free(&c);
}

/* Any byte range of any tensor, produced alone, equals the built bytes. */
static void test_fill_slices(void) {
    di_dummy a;
    build(&a, 7, 2);
    uint8_t buf[4096];
    uint64_t r = 1;
    int bad = 0;
    for (int k = 0; k < 2000; k++) {
        r = r * 6364136223846793005ull + 1442695040888963407ull;
        const di_manifest_entry *e = &a.manifest.v[(r >> 33) % a.manifest.n];
        size_t nb = e->slot->nbytes;
        uint64_t off = (r >> 7) % nb;
        size_t len = (size_t)((r >> 40) % 300) + 1;
        if (off + len > nb) len = nb - off;
        di_dummy_fill(7, e, off, buf, len);
        if (memcmp(buf, (uint8_t *)e->slot->data + off, len)) bad++;
    }
    CHECK_EQ_INT(bad, 0);
    di_dummy_free(&a);
}

/* The dummy, seen as a tensor source, binds with the same checks as a
 * checkpoint. */
static void test_binds(void) {
    di_dummy a;
    build(&a, 1, 0);
    di_tensor_source src;
    di_dummy_source(&src, &a);
    di_weights w;
    di_err e = {0};
    CHECK(di_weights_init(&w, &tiny, &e) == DI_OK);
    CHECKF(di_weights_bind(&w, &tiny, &src, &e) == DI_OK, "%s", e.msg);
    CHECK(w.blocks[3].ffn.experts[5].w2.weight.data == a.weights.blocks[3].ffn.experts[5].w2.weight.data);
    CHECK(w.blocks[6].attn.cmp_wkv.shape[0] == 64 && w.blocks[6].attn.cmp_wkv.dtype == DI_DTYPE_BF16);
    di_weights_free(&w);
    di_dummy_free(&a);
}

static double fp8_std(const di_w_fp8 *l) {
    const uint8_t *q = l->weight.data, *s = l->scale.data;
    int64_t out = l->weight.shape[0], in = l->weight.shape[1], sc = l->scale.shape[1];
    double acc = 0;
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < in; j++) {
            double v = di_e4m3_to_f32(q[i * in + j]) * di_e8m0_to_f32(s[(i / 32) * sc + j / 32]);
            acc += v * v;
        }
    return sqrt(acc / (double)(out * in));
}

static double fp4_std(const di_w_fp4 *l) {
    const uint8_t *q = l->weight.data, *s = l->scale.data;
    int64_t out = l->weight.shape[0], half = l->weight.shape[1], sc = l->scale.shape[1];
    double acc = 0;
    for (int64_t i = 0; i < out; i++)
        for (int64_t j = 0; j < 2 * half; j++) {
            uint8_t b = q[i * half + j / 2];
            double v = di_e2m1_to_f32(j & 1 ? b >> 4 : b & 15) * di_e8m0_to_f32(s[i * sc + j / 32]);
            acc += v * v;
        }
    return sqrt(acc / (double)(out * 2 * half));
}

static void bf16_stats(const di_tensor *t, double *mean, double *std) {
    const uint16_t *p = t->data;
    int64_t n = di_tensor_numel(t);
    double s = 0, s2 = 0;
    for (int64_t i = 0; i < n; i++) {
        double v = di_bf16_to_f32(p[i]);
        s += v;
        s2 += v * v;
    }
    *mean = s / (double)n;
    *std = sqrt(s2 / (double)n - *mean * *mean);
}

/* Effective weight std within a factor sqrt(2) of 1/sqrt(fan_in) (a
 * power-of-two base per tensor), norms ~1. */
static void test_distributions(void) {
    di_dummy a;
    build(&a, 3, 0);
    const di_w_block *b = &a.weights.blocks[2];
    double want = 1 / sqrt(128.0);
    double s = fp8_std(&b->attn.wq_a);
    CHECKF(s > want / 1.42 && s < want * 1.42, "wq_a std %g want %g", s, want);
    s = fp8_std(&b->attn.wo_b);
    CHECKF(s > want / 1.42 && s < want * 1.42, "wo_b std %g", s);
    s = fp4_std(&b->ffn.experts[1].w1);
    CHECKF(s > want / 1.42 && s < want * 1.42, "w1 std %g want %g", s, want);
    want = 1 / sqrt(32.0);
    s = fp4_std(&b->ffn.experts[1].w2);
    CHECKF(s > want / 1.42 && s < want * 1.42, "w2 std %g want %g", s, want);
    /* scales vary per group, by one binade either way */
    const uint8_t *sc4 = b->ffn.experts[1].w1.scale.data;
    int lo = 255, hi = 0;
    for (int64_t i = 0; i < di_tensor_numel(&b->ffn.experts[1].w1.scale); i++) {
        if (sc4[i] < lo) lo = sc4[i];
        if (sc4[i] > hi) hi = sc4[i];
    }
    CHECK_EQ_INT(hi - lo, 2);
    double m, sd;
    bf16_stats(&b->attn_norm, &m, &sd);
    CHECKF(fabs(m - 1) < 0.01 && sd < 0.05, "norm mean %g std %g", m, sd);
    bf16_stats(&b->attn.cmp_wkv, &m, &sd);
    CHECKF(fabs(m) < 0.01 && fabs(sd * sqrt(128.0) - 1) < 0.1, "cmp_wkv mean %g std %g", m, sd);
    /* Engram rows dequantize to ~unit std */
    const di_w_engram *g = &a.weights.blocks[1].engram;
    const uint8_t *q = g->embed.data, *sc = g->embed_scale.data;
    double acc = 0;
    int64_t n = g->embed.shape[0] * g->embed.shape[1];
    for (int64_t i = 0; i < n; i++) {
        double v = di_e4m3_to_f32(q[i]) * di_e8m0_to_f32(sc[i / 32]);
        acc += v * v;
    }
    CHECKF(sqrt(acc / (double)n) > 0.7 && sqrt(acc / (double)n) < 1.42, "engram std %g", sqrt(acc / (double)n));
    di_dummy_free(&a);
}

/* Real config, nothing materialised: every view has its official shape and
 * the model binds; slices of a 98 GB Engram table are produced on demand. */
static void test_real_lazy(void) {
    di_dummy_options o;
    di_dummy_options_default(&o);
    o.block_end = 0;
    o.block_begin = real.n_blocks; /* no block */
    o.globals = 0;
    o.engram_tables = 0;
    di_dummy d;
    di_err e = {0};
    CHECKF(di_dummy_build(&d, &real, &o, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(d.arena_bytes, 0);
    CHECKF(fabs((double)d.lazy_bytes / 510.286023e9 - 1) < 0.005, "lazy %llu", (unsigned long long)d.lazy_bytes);
    CHECK(d.weights.blocks[14].engram.embed.shape[0] == 384016682);
    di_tensor_source src;
    di_dummy_source(&src, &d);
    di_weights w;
    CHECK(di_weights_init(&w, &real, &e) == DI_OK);
    CHECKF(di_weights_bind(&w, &real, &src, &e) == DI_OK, "%s", e.msg);
    di_weights_free(&w);
    const di_manifest_entry *t = di_manifest_find(&d.manifest, "layers.14.engram.embed.weight");
    uint8_t row1[256], row2[256];
    di_dummy_fill(o.seed, t, 384016681ull * 256, row1, 256); /* last row */
    di_dummy_fill(o.seed, t, 384016681ull * 256, row2, 256);
    CHECK(memcmp(row1, row2, 256) == 0);
    int zero = 0;
    for (int i = 0; i < 256; i++) zero += row1[i] == 0;
    CHECK(zero < 32);
    di_dummy_free(&d);
    /* a cap refuses a build that would not fit */
    o.block_begin = 0;
    o.block_end = 1;
    o.max_bytes = 1 << 30;
    CHECK(di_dummy_build(&d, &real, &o, &e) == DI_ERR_LIMIT);
    CHECK_STR_CONTAINS(e.msg, "cap");
    o.block_end = 99;
    CHECK(di_dummy_build(&d, &real, &o, &e) == DI_ERR_INVALID_ARG);
    /* the whole real model (510 GB) is refused up front, not left to the OOM killer */
    if ((double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) < 400e9) {
        di_dummy_options_default(&o);
        CHECK(di_dummy_build(&d, &real, &o, &e) == DI_ERR_LIMIT);
        CHECK_STR_CONTAINS(e.msg, "memory");
    }
}

static long file_bytes(const char *path, unsigned char **out) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    *out = malloc((size_t)n + 1);
    if (fread(*out, 1, (size_t)n, f) != (size_t)n) n = -1;
    fclose(f);
    return n;
}

/* The embedded files are the ones in assets/default-model (themselves
 * copies of the golden tiny model's config and tokenizer). */
static void test_assets(void) {
    const char *dirs[] = {"assets/default-model", "../assets/default-model", "../../assets/default-model"};
    CHECK_EQ_INT(di_default_model_asset_count(), 3);
    for (size_t i = 0; i < di_default_model_asset_count(); i++) {
        const di_asset *a = di_default_model_asset(i);
        unsigned char *buf = NULL;
        long n = -1;
        for (int d = 0; d < 3 && n < 0; d++) {
            char p[512];
            snprintf(p, sizeof p, "%s/%s", dirs[d], a->name);
            n = file_bytes(p, &buf);
        }
        CHECKF(n == (long)a->size && !memcmp(buf, a->data, a->size), "%s", a->name);
        CHECK(a->data[a->size] == 0);
        free(buf);
    }
}

static void rm_model(const char *dir) {
    const char *files[] = {"config.json", "tokenizer.json", "tokenizer_config.json", "model.safetensors.index.json",
                           "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"};
    char p[4300];
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, files[i]);
        unlink(p);
    }
    rmdir(dir);
}

/* First use generates the folder, the second reuses it; two generations are
 * byte-identical; the public API opens it (checkpoint) and the config alone
 * (dummy) with the same weights. */
static void test_default_model(void) {
    char root1[] = "/tmp/di-cache-XXXXXX", root2[] = "/tmp/di-cache-XXXXXX";
    CHECK(mkdtemp(root1) && mkdtemp(root2));
    char dir1[4096], dir2[4096];
    di_err e = {0};
    int gen = -1;
    setenv("DEEPINFER_CACHE_DIR", root1, 1);
    CHECKF(di_default_model_ensure(dir1, sizeof dir1, &gen, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(gen, 1);
    CHECK(strncmp(dir1, root1, strlen(root1)) == 0 && strstr(dir1, "default-v41-tiny-") != NULL);
    { /* the folder name ends with the fingerprint of the embedded files and seed */
        const char *dash = strrchr(dir1, '-');
        int hex = dash && strlen(dash + 1) == 8;
        for (int i = 1; hex && i <= 8; i++) hex = strchr("0123456789abcdef", dash[i]) != NULL;
        CHECKF(hex, "%s: no 8-digit fingerprint at the end", dir1);
    }
    CHECK(di_default_model_ensure(dir1, sizeof dir1, &gen, &e) == DI_OK);
    CHECK_EQ_INT(gen, 0);
    char pub[4096];
    CHECK(di_default_model_path(pub, sizeof pub) == DI_OK && !strcmp(pub, dir1));
    setenv("DEEPINFER_CACHE_DIR", root2, 1);
    CHECK(di_default_model_ensure(dir2, sizeof dir2, &gen, &e) == DI_OK && gen == 1);
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json", "config.json"};
    for (int i = 0; i < 4; i++) {
        char a[4300], b[4300];
        unsigned char *x = NULL, *y = NULL;
        snprintf(a, sizeof a, "%s/%s", dir1, files[i]);
        snprintf(b, sizeof b, "%s/%s", dir2, files[i]);
        long na = file_bytes(a, &x), nb = file_bytes(b, &y);
        CHECKF(na > 0 && na == nb && !memcmp(x, y, (size_t)na), "%s", files[i]);
        free(x);
        free(y);
    }
    /* open through the public API: checkpoint, then dummy from the config */
    di_model *m = NULL, *d = NULL;
    di_model_options o;
    di_model_options_default(&o);
    CHECKF(di_model_open(dir1, &o, &m) == DI_OK, "%s", di_last_error());
    o.load_format = DI_LOAD_DUMMY;
    o.seed = DI_DEFAULT_MODEL_SEED;
    char cfgp[4300];
    snprintf(cfgp, sizeof cfgp, "%s/config.json", dir1);
    CHECKF(di_model_open(cfgp, &o, &d) == DI_OK, "%s", di_last_error());
    di_model_info im, idm;
    CHECK(di_model_get_info(m, &im) == DI_OK && di_model_get_info(d, &idm) == DI_OK);
    CHECK_EQ_INT(im.n_tensors, 1005);
    CHECK_EQ_INT(idm.n_tensors, 1005);
    CHECK(im.weight_bytes == idm.weight_bytes && idm.is_dummy && !im.is_dummy);
    char *txt = NULL;
    CHECK(di_model_describe(m, &txt) == DI_OK);
    CHECK_STR_CONTAINS(txt, "indexer in pool of 6");
    di_free(txt);
    CHECK(di_model_plan(m, 1, 1000, 2, 80, &txt) == DI_OK);
    CHECK_STR_CONTAINS(txt, "\"weights_bytes\":\t4743944");
    di_free(txt);
    di_model_close(m);
    di_model_close(d);
    /* errors are published */
    CHECK(di_model_open("/nonexistent-model", NULL, &m) != DI_OK && m == NULL);
    CHECK_STR_CONTAINS(di_last_error(), "/nonexistent-model");
    o.dummy_lazy = 1;
    CHECK(di_model_open("/nonexistent/config.json", &o, &m) == DI_ERR_IO);
    CHECK_STR_CONTAINS(di_last_error(), "/nonexistent/config.json");
    unsetenv("DEEPINFER_CACHE_DIR");
    rm_model(dir1);
    rm_model(dir2);
    rmdir(root1);
    rmdir(root2);
}

int main(void) {
    if (!fixture_config("v41-tiny-config.json", &tiny) || !fixture_config("v41-flash-config.json", &real)) return 1;
    RUN(test_determinism);
    RUN(test_fill_slices);
    RUN(test_binds);
    RUN(test_distributions);
    RUN(test_real_lazy);
    RUN(test_assets);
    RUN(test_default_model);
    return test_summary();
}
