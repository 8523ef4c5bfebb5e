/* Golden-fixture helpers (see golden_util.h). */
#include "golden_util.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int gold_open(gold_model *g, const char *shared, const char *fixture) {
    memset(g, 0, sizeof *g);
    di_err err = {0};
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/config.json", shared);
    if (di_config_load(path, &g->cfg, &err)) goto fail;
    snprintf(path, sizeof path, "%s/golden/v41-tiny", shared);
    if (di_checkpoint_open(path, &g->ck, &err)) goto fail;
    if (di_weights_init(&g->w, &g->cfg, &err)) goto fail;
    di_tensor_source src;
    di_weights_source_checkpoint(&src, g->ck);
    if (di_weights_bind(&g->w, &g->cfg, &src, &err)) goto fail;
    snprintf(path, sizeof path, "%s/golden/%s/golden.safetensors", shared, fixture);
    if (di_safetensors_open(path, &g->gold, &err)) goto fail;
    if (di_backend_cpu_create(0, &g->be, &err)) goto fail;
    int64_t n = 0;
    const int32_t *cmap = gold_i32(g, "tokenizer.compressed_map", &n);
    if (!cmap || n != g->cfg.vocab_size) {
        /* the bf16 fixture has no map: take the fp8 fixture's */
        di_safetensors other;
        snprintf(path, sizeof path, "%s/golden/v41-tiny/golden.safetensors", shared);
        if (di_safetensors_open(path, &other, &err)) goto fail;
        for (size_t i = 0; i < other.n_entries; i++)
            if (!strcmp(other.entries[i].name, "tokenizer.compressed_map")) {
                di_tensor t;
                di_safetensors_tensor(&other, i, &t);
                static int32_t buf[1 << 20];
                memcpy(buf, t.data, t.nbytes < sizeof buf ? t.nbytes : sizeof buf);
                cmap = buf;
            }
        di_safetensors_close(&other);
    }
    di_numerics num = strstr(fixture, "bf16") ? DI_NUMERICS_BF16 : DI_NUMERICS_FP8;
    if (di_lm_init(&g->lm, &g->cfg, &g->w, g->be, num, cmap, &err)) goto fail;
    g->open = 1;
    return 0;
fail:
    fprintf(stderr, "gold_open %s: %s\n", fixture, err.msg);
    gold_close(g);
    return 1;
}

void gold_close(gold_model *g) {
    if (g->lm.blocks) di_lm_free(&g->lm);
    if (g->be) di_backend_destroy(g->be);
    if (g->gold.entries) di_safetensors_close(&g->gold);
    if (g->w.blocks) di_weights_free(&g->w);
    if (g->ck) di_checkpoint_close(g->ck);
    memset(g, 0, sizeof *g);
}

static const void *gold_raw(const gold_model *g, const char *name, di_dtype want, int64_t *numel) {
    for (size_t i = 0; i < g->gold.n_entries; i++)
        if (!strcmp(g->gold.entries[i].name, name)) {
            di_tensor t;
            di_safetensors_tensor(&g->gold, i, &t);
            if (t.dtype != want) return NULL;
            if (numel) *numel = di_tensor_numel(&t);
            return t.data;
        }
    fprintf(stderr, "golden tensor %s missing\n", name);
    return NULL;
}

const float *gold_f32(const gold_model *g, const char *name, int64_t *numel) {
    return gold_raw(g, name, DI_DTYPE_F32, numel);
}
const int32_t *gold_i32(const gold_model *g, const char *name, int64_t *numel) {
    return gold_raw(g, name, DI_DTYPE_I32, numel);
}

int gold_prompt_get(const gold_model *g, const char *p, gold_prompt *gp) {
    char name[160];
    memset(gp, 0, sizeof *gp);
#define GOLD_NAME(suffix) (snprintf(name, sizeof name, "%s." suffix, p), name)
    gp->ids = gold_i32(g, GOLD_NAME("prompt_ids"), &gp->S);
    gp->prefill_logits = gold_f32(g, GOLD_NAME("prefill.logits"), NULL);
    gp->decode_ids = gold_i32(g, GOLD_NAME("decode.input_ids"), &gp->n);
    gp->decode_logits = gold_f32(g, GOLD_NAME("decode.logits"), NULL);
    gp->next_ids = gold_i32(g, GOLD_NAME("decode.next_ids"), NULL);
    gp->margin = gold_f32(g, GOLD_NAME("decode.margin"), NULL);
#undef GOLD_NAME
    return gp->ids && gp->prefill_logits && gp->decode_ids && gp->decode_logits && gp->next_ids &&
           gp->margin;
}

double rel_l2(const float *a, const float *b, int64_t n) {
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double d = (double)a[i] - b[i];
        num += d * d;
        den += (double)b[i] * b[i];
    }
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

logit_stats logit_compare(const float *a, const float *b, int64_t rows, int64_t v, double thr) {
    logit_stats s = {0};
    int64_t n = rows * v;
    double *d = malloc((size_t)n * sizeof(double));
    if (!d) return s;
    int agree = 0;
    for (int64_t r = 0; r < rows; r++) {
        double rm = 0;
        int64_t ia = 0, ib = 0, ib2 = -1;
        for (int64_t k = 0; k < v; k++) {
            double x = fabs((double)a[r * v + k] - b[r * v + k]);
            d[r * v + k] = x;
            rm += x;
            s.mean += x;
            if (x > s.max) s.max = x;
            if (a[r * v + k] > a[r * v + ia]) ia = k;
            if (b[r * v + k] > b[r * v + ib]) ib = k;
        }
        for (int64_t k = 0; k < v; k++)
            if (k != ib && (ib2 < 0 || b[r * v + k] > b[r * v + ib2])) ib2 = k;
        rm /= (double)v;
        if (rm > s.worst_row_mean) s.worst_row_mean = rm;
        if (ia == ib) agree++;
        else if (ib2 >= 0 && b[r * v + ib] - b[r * v + ib2] > thr) s.must_match_fail++;
    }
    s.mean /= (double)n;
    qsort(d, (size_t)n, sizeof(double), cmp_double);
    s.p99 = d[(int64_t)(0.99 * (double)(n - 1))];
    s.p999 = d[(int64_t)(0.999 * (double)(n - 1))];
    s.argmax_agree = (double)agree / (double)rows;
    free(d);
    return s;
}

int quick_mode(void) {
    if (getenv("DEEPINFER_TEST_FULL")) return 0;
#ifdef DI_SANITIZE
    return 1;
#else
    return getenv("DEEPINFER_TEST_QUICK") != NULL;
#endif
}
