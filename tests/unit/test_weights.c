/* Binding the golden tiny checkpoint: every tensor found, checked and put
 * in its field; missing / mis-shaped / mis-typed / unknown tensors rejected
 * with a message naming the tensor and its file. */
#include <stdint.h>
#include <stdlib.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"
#include "model/dummy.h"
#include "model/manifest.h"
#include "model/weights.h"
#include "test.h"

/* A tensor source that wraps a checkpoint and can drop, alter or add one
 * tensor, to produce each failure without writing files. */
typedef struct mutant {
    di_checkpoint *ck;
    const char *drop;       /* behaves as absent */
    const char *alter;      /* returned with `altered` instead */
    di_tensor altered;
    const char *extra;      /* an extra name listed by name_at */
} mutant;

static const di_tensor *mut_find(void *ctx, const char *name, const char **file) {
    mutant *m = ctx;
    if (m->drop && !strcmp(name, m->drop)) return NULL;
    const di_ckpt_tensor *t = di_checkpoint_find(m->ck, name);
    if (!t) return NULL;
    if (file) *file = t->file;
    if (m->alter && !strcmp(name, m->alter)) {
        m->altered = t->t;
        return &m->altered;
    }
    return &t->t;
}

static size_t mut_count(void *ctx) {
    mutant *m = ctx;
    return di_checkpoint_count(m->ck) + (m->extra != NULL);
}

static const char *mut_name_at(void *ctx, size_t i, const char **file) {
    mutant *m = ctx;
    if (i == di_checkpoint_count(m->ck)) {
        *file = "model-00002-of-00002.safetensors";
        return m->extra;
    }
    const di_ckpt_tensor *t = di_checkpoint_at(m->ck, i);
    *file = t->file;
    return t->name;
}

static di_checkpoint *ck;
static di_config cfg;

static int open_tiny(void) {
    const char *shared = test_shared_dir();
    if (!shared) return 0;
    char dir[4200], path[4300];
    snprintf(dir, sizeof dir, "%s/golden/v41-tiny", shared);
    snprintf(path, sizeof path, "%s/config.json", dir);
    di_err e = {0};
    CHECKF(di_config_load(path, &cfg, &e) == DI_OK, "%s", e.msg);
    CHECKF(di_checkpoint_open(dir, &ck, &e) == DI_OK, "%s", e.msg);
    return ck != NULL;
}

static void test_bind_tiny(void) {
    if (!ck) SKIP("../shared/golden/v41-tiny not available");
    di_weights w;
    di_err e = {0};
    di_tensor_source src;
    di_weights_source_checkpoint(&src, ck);
    CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
    CHECKF(di_weights_bind(&w, &cfg, &src, &e) == DI_OK, "%s", e.msg);
    CHECK_EQ_INT(di_checkpoint_count(ck), 1005);
    /* every field the manifest knows is bound to the checkpoint's bytes */
    di_manifest m;
    CHECK(di_manifest_build(&m, &cfg, &w, &e) == DI_OK);
    size_t bound = 0;
    for (size_t i = 0; i < m.n; i++) {
        const di_ckpt_tensor *t = di_checkpoint_find(ck, m.v[i].name);
        if (t && m.v[i].slot->data == t->t.data && m.v[i].slot->nbytes == t->t.nbytes) bound++;
    }
    CHECK_EQ_INT(bound, 1005);
    di_manifest_free(&m);
    /* spot checks of the struct layout against the names */
    CHECK(w.blocks[2].attn.cmp_wgate.data == di_checkpoint_find(ck, "layers.2.attn.compressor.wgate.weight")->t.data);
    CHECK(w.blocks[6].attn.cmp_wgate.data == NULL); /* ratio 1: no gate */
    CHECK(w.blocks[8].attn.idx_wk.data == NULL);    /* reindex layer: no own keys */
    CHECK(w.blocks[4].engram.embed.shape[0] == 1054 && w.blocks[4].has_engram);
    CHECK(w.blocks[12].ffn.n_experts == 4);
    CHECK(w.blocks[5].ffn.experts[5].w2.scale.data ==
          di_checkpoint_find(ck, "layers.5.ffn.experts.5.w2.scale")->t.data);
    CHECK(w.dspark.confidence.shape[1] == 160);
    CHECK(w.dspark.main_proj.weight.data == di_checkpoint_find(ck, "mtp.0.main_proj.weight")->t.data);
    di_weights_free(&w);
}

static void expect_fail(mutant *mu, const char *n1, const char *n2) {
    di_weights w;
    di_err e = {0};
    di_tensor_source src = {mu, mut_find, mut_count, mut_name_at};
    CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
    CHECK(di_weights_bind(&w, &cfg, &src, &e) != DI_OK);
    CHECK_STR_CONTAINS(e.msg, n1);
    CHECK_STR_CONTAINS(e.msg, n2);
    di_weights_free(&w);
}

static void test_bind_errors(void) {
    if (!ck) SKIP("../shared/golden/v41-tiny not available");
    mutant mu = {ck, 0, 0, {0}, 0};
    mu.drop = "layers.3.ffn.experts.2.w3.scale";
    expect_fail(&mu, "layers.3.ffn.experts.2.w3.scale", "missing");
    mu.drop = NULL;
    mu.extra = "layers.0.attn.mystery.weight";
    expect_fail(&mu, "layers.0.attn.mystery.weight", "model-00002-of-00002.safetensors");
    mu.extra = "vision.blocks.0.norm.weight"; /* tolerated */
    di_weights w;
    di_err e = {0};
    di_tensor_source src = {&mu, mut_find, mut_count, mut_name_at};
    CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
    CHECKF(di_weights_bind(&w, &cfg, &src, &e) == DI_OK, "%s", e.msg);
    di_weights_free(&w);
    /* bias_vl is optional for a text-only config */
    mu.extra = NULL;
    mu.drop = "layers.4.ffn.gate.bias_vl";
    src.ctx = &mu;
    CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
    CHECKF(di_weights_bind(&w, &cfg, &src, &e) == DI_OK, "%s", e.msg);
    CHECK(w.blocks[4].ffn.gate_bias_vl.data == NULL && w.blocks[5].ffn.gate_bias_vl.data != NULL);
    di_weights_free(&w);
}

/* A wrong dtype or shape in the file: the source hands back a modified view. */
static const di_tensor *bad_find(void *ctx, const char *name, const char **file) {
    mutant *m = ctx;
    const di_tensor *t = mut_find(ctx, name, file);
    if (t && m->alter && !strcmp(name, m->alter)) {
        if (m->altered.ndim == 2 && !strncmp(name, "layers", 6)) m->altered.shape[1] += 1;
        else m->altered.dtype = DI_DTYPE_F16;
    }
    return t;
}

static void test_bind_shape_dtype(void) {
    if (!ck) SKIP("../shared/golden/v41-tiny not available");
    mutant mu = {ck, 0, "layers.7.attn.wq_b.weight", {0}, 0};
    di_weights w;
    di_err e = {0};
    di_tensor_source src = {&mu, bad_find, mut_count, mut_name_at};
    CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
    CHECK(di_weights_bind(&w, &cfg, &src, &e) == DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.msg, "layers.7.attn.wq_b.weight in model-0000");
    CHECK_STR_CONTAINS(e.msg, "shape [256, 65], expected [256, 64]");
    mu.alter = "norm.weight";
    CHECK(di_weights_bind(&w, &cfg, &src, &e) == DI_ERR_FORMAT);
    CHECK_STR_CONTAINS(e.msg, "norm.weight in model-0000");
    CHECK_STR_CONTAINS(e.msg, "dtype F16, expected BF16");
    di_weights_free(&w);
}

static int same_file(const char *a, const char *b) {
    FILE *fa = fopen(a, "rb"), *fb = fopen(b, "rb");
    int same = fa && fb;
    while (same) {
        int ca = fgetc(fa), cb = fgetc(fb);
        if (ca != cb) same = 0;
        if (ca == EOF || cb == EOF) break;
    }
    if (fa) fclose(fa);
    if (fb) fclose(fb);
    return same;
}

static void rm_dir(const char *dir) {
    char cmdpath[4300];
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model-00001-of-00001.safetensors", "model.safetensors.index.json", "one.safetensors"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        snprintf(cmdpath, sizeof cmdpath, "%s/%s", dir, files[i]);
        unlink(cmdpath);
    }
    rmdir(dir);
}

/* Rewriting the golden checkpoint's tensors reproduces its files byte for
 * byte: same data order, header layout, padding, shard split and index. */
static void test_writer_reproduces_golden(void) {
    if (!ck) SKIP("../shared/golden/v41-tiny not available");
    size_t n = di_checkpoint_count(ck);
    di_st_named *v = calloc(n, sizeof *v);
    for (size_t i = 0; i < n; i++) {
        v[i].name = di_checkpoint_at(ck, i)->name;
        v[i].t = &di_checkpoint_at(ck, i)->t;
    }
    char dir[] = "/tmp/di-writer-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    di_err e = {0};
    CHECKF(di_safetensors_write_sharded(dir, v, n, 2, NULL, NULL, &e) == DI_OK, "%s", e.msg);
    const char *shared = test_shared_dir();
    const char *files[] = {"model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                           "model.safetensors.index.json"};
    for (int i = 0; i < 3; i++) {
        char a[4300], b[4300];
        snprintf(a, sizeof a, "%s/%s", dir, files[i]);
        snprintf(b, sizeof b, "%s/golden/v41-tiny/%s", shared, files[i]);
        CHECKF(same_file(a, b), "%s differs from the golden file", files[i]);
    }
    /* duplicates and inconsistent views are refused */
    di_st_named dup[2] = {v[0], v[0]};
    char path[4300];
    snprintf(path, sizeof path, "%s/one.safetensors", dir);
    CHECK(di_safetensors_write(path, dup, 2, NULL, NULL, &e) == DI_ERR_INVALID_ARG);
    CHECK_STR_CONTAINS(e.msg, "twice");
    di_tensor bad = *v[0].t;
    bad.nbytes += 1;
    di_st_named b1 = {"x", &bad};
    CHECK(di_safetensors_write(path, &b1, 1, NULL, NULL, &e) == DI_ERR_INVALID_ARG);
    snprintf(path, sizeof path, "/nonexistent-dir/x.safetensors");
    CHECK(di_safetensors_write(path, v, 1, NULL, NULL, &e) == DI_ERR_IO);
    CHECK_STR_CONTAINS(e.msg, "/nonexistent-dir/x.safetensors");
    free(v);
    rm_dir(dir);
}

/* Lazy dummy tensors are produced by the fill callback while writing; the
 * written checkpoint opens, binds, and holds the generator's bytes. */
static void dummy_fill_cb(void *ctx, size_t index, uint64_t off, void *dst, size_t n) {
    di_dummy *d = ctx;
    di_dummy_fill(d->seed, &d->manifest.v[index], off, dst, n);
}

static void test_writer_dummy_roundtrip(void) {
    if (!ck) SKIP("../shared/golden/v41-tiny not available");
    di_dummy_options o;
    di_dummy_options_default(&o);
    o.block_begin = 3; /* blocks 3..14 and the globals stay lazy */
    o.block_end = 4;
    o.globals = 0;
    di_dummy d;
    di_err e = {0};
    CHECK(di_dummy_build(&d, &cfg, &o, &e) == DI_OK);
    di_st_named *v = calloc(d.manifest.n, sizeof *v);
    for (size_t i = 0; i < d.manifest.n; i++) {
        v[i].name = d.manifest.v[i].name;
        v[i].t = d.manifest.v[i].slot;
    }
    char dir[] = "/tmp/di-writer-XXXXXX";
    CHECK(mkdtemp(dir) != NULL);
    CHECKF(di_safetensors_write_sharded(dir, v, d.manifest.n, 1, dummy_fill_cb, &d, &e) == DI_OK, "%s", e.msg);
    di_checkpoint *c2 = NULL;
    CHECKF(di_checkpoint_open(dir, &c2, &e) == DI_OK, "%s", e.msg);
    if (c2) {
        di_tensor_source src;
        di_weights_source_checkpoint(&src, c2);
        di_weights w;
        CHECK(di_weights_init(&w, &cfg, &e) == DI_OK);
        CHECKF(di_weights_bind(&w, &cfg, &src, &e) == DI_OK, "%s", e.msg);
        int bad = 0;
        uint8_t *buf = malloc(1 << 20);
        for (size_t i = 0; i < d.manifest.n; i++) {
            const di_ckpt_tensor *t = di_checkpoint_find(c2, d.manifest.v[i].name);
            di_dummy_fill(d.seed, &d.manifest.v[i], 0, buf, t->t.nbytes);
            if (memcmp(buf, t->t.data, t->t.nbytes)) bad++;
        }
        CHECK_EQ_INT(bad, 0);
        free(buf);
        di_weights_free(&w);
        di_checkpoint_close(c2);
    }
    free(v);
    di_dummy_free(&d);
    rm_dir(dir);
}

int main(void) {
    open_tiny();
    RUN(test_bind_tiny);
    RUN(test_bind_errors);
    RUN(test_bind_shape_dtype);
    RUN(test_writer_reproduces_golden);
    RUN(test_writer_dummy_roundtrip);
    di_checkpoint_close(ck);
    return test_summary();
}
