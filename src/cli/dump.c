/* deepinfer dump: runs the forward pass over the prompts of an inputs file
 * and writes what the golden fixtures hold, for checking any fixture of
 * this layout (architecture.md §3–§10; golden README "What the goldens
 * contain"). For every prompt P (a tensor P.prompt_ids):
 *   P.prefill.logits [S, V]   one prefill of the prompt, every position
 *   P.decode.logits  [N, V]   decode fed with P.decode.input_ids
 *   P.decode.next_ids [N]     free-running greedy decode from the prompt
 *   P.draft0.logits [B, V], P.draft0.confidence [B], P.draft0.ids [B]
 *                             one DSpark round right after the prefill
 *                             (input P.draft0.input_id, else the argmax)
 * The Engram token map comes from the model's tokenizer.json, else from the
 * inputs' tokenizer.compressed_map. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "api/api_model.h"
#include "cli/cli.h"
#include "cli/engine_args.h"
#include "deepinfer.h"
#include "io/safetensors.h"
#include "io/safetensors_writer.h"
#include "model/forward.h"

typedef struct out_list {
    di_st_named *v;
    di_tensor *t;
    char **names;
    size_t n, cap;
} out_list;

static int out_add(out_list *o, const char *prefix, const char *suffix, di_dtype dt, void *data,
                   int64_t d0, int64_t d1) {
    if (o->n == o->cap) {
        size_t cap = o->cap ? o->cap * 2 : 32;
        di_st_named *v = realloc(o->v, cap * sizeof *v);
        if (v) o->v = v;
        di_tensor *t = realloc(o->t, cap * sizeof *t);
        if (t) o->t = t;
        char **nm = realloc(o->names, cap * sizeof *nm);
        if (nm) o->names = nm;
        if (!v || !t || !nm) return 1;
        o->cap = cap;
    }
    size_t len = strlen(prefix) + strlen(suffix) + 2;
    char *name = malloc(len);
    if (!name) return 1;
    snprintf(name, len, "%s.%s", prefix, suffix);
    di_tensor *t = &o->t[o->n];
    memset(t, 0, sizeof *t);
    t->dtype = dt;
    t->ndim = d1 > 0 ? 2 : 1;
    t->shape[0] = d0;
    t->shape[1] = d1;
    t->data = data;
    t->nbytes = (size_t)(d0 * (d1 > 0 ? d1 : 1)) * 4;
    o->names[o->n] = name;
    o->n++;
    return 0;
}

static const di_tensor *find(const di_safetensors *st, const char *name, di_tensor *buf) {
    for (size_t i = 0; i < st->n_entries; i++)
        if (!strcmp(st->entries[i].name, name)) {
            di_safetensors_tensor(st, i, buf);
            return buf->dtype == DI_DTYPE_I32 ? buf : NULL;
        }
    return NULL;
}

static int32_t argmax(const float *x, int64_t n) {
    int64_t b = 0;
    for (int64_t i = 1; i < n; i++)
        if (x[i] > x[b]) b = i;
    return (int32_t)b;
}

static void usage(FILE *f) {
    fprintf(f, "usage: deepinfer dump --model DIR --inputs FILE.safetensors --out OUT.safetensors\n"
               "                      [--bf16] [--threads N]\n"
               "  --bf16      no FP8 activation quantization (the reference's dtype=\"bf16\" mode)\n");
}

/* One prompt: prefill, DSpark round 0, decode with the given inputs, and a
 * free-running greedy decode. */
static di_status dump_prompt(const di_lm *lm, const di_safetensors *in, const char *p,
                             out_list *o, di_err *err) {
    const di_config *c = lm->cfg;
    int64_t V = c->vocab_size;
    char name[512];
    di_tensor tb, tdec, tin;
    snprintf(name, sizeof name, "%s.prompt_ids", p);
    const di_tensor *tp = find(in, name, &tb);
    snprintf(name, sizeof name, "%s.decode.input_ids", p);
    const di_tensor *td = find(in, name, &tdec);
    snprintf(name, sizeof name, "%s.draft0.input_id", p);
    const di_tensor *t0 = find(in, name, &tin);
    int64_t S = tp ? di_tensor_numel(tp) : 0, N = td ? di_tensor_numel(td) : 0;
    if (S < 1) return di_err_set(err, DI_ERR_FORMAT, "%s.prompt_ids: empty or not I32", p);
    const int32_t *ids = tp->data, *dec = td ? td->data : NULL;
    di_seqstate st;
    di_status rc = di_seqstate_init(&st, lm, S + N + 1, 0, err);
    if (rc) return rc;
    float *pl = malloc((size_t)(S * V) * sizeof(float));
    float *dl = malloc((size_t)((N > 0 ? N : 1) * V) * sizeof(float));
    int32_t *next = malloc((size_t)(N > 0 ? N : 1) * sizeof(int32_t));
    float *lg = malloc((size_t)V * sizeof(float));
    int B = c->dspark_block_size > 0 ? c->dspark_block_size : 1;
    float *xl = malloc((size_t)(B * V) * sizeof(float));
    float *xc = malloc((size_t)B * sizeof(float));
    int32_t *xi = malloc((size_t)B * sizeof(int32_t));
    if (!pl || !dl || !next || !lg || !xl || !xc || !xi) {
        rc = di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", p);
        goto fail;
    }
    di_fwd_seq q = {&st, ids, S};
    if ((rc = di_forward(lm, &q, 1, pl, 1, err))) goto fail;
    int32_t g0 = argmax(pl + (S - 1) * V, V);
    int drafted = 0;
    if (lm->has_dspark) {
        int32_t in0 = t0 && di_tensor_numel(t0) == 1 ? ((const int32_t *)t0->data)[0] : g0;
        if ((rc = di_dspark_draft(lm, &st, in0, xl, NULL, xc, xi, err))) goto fail;
        drafted = 1;
    }
    for (int64_t i = 0; i < N; i++) {
        di_fwd_seq d = {&st, dec + i, 1};
        if ((rc = di_forward(lm, &d, 1, dl + i * V, 0, err))) goto fail;
    }
    /* free-running greedy from the prompt */
    di_seqstate_reset(&st);
    if ((rc = di_forward(lm, &q, 1, NULL, 1, err))) goto fail;
    int32_t tok = g0;
    for (int64_t i = 0; i < N; i++) {
        di_fwd_seq d = {&st, &tok, 1};
        if ((rc = di_forward(lm, &d, 1, lg, 0, err))) goto fail;
        tok = next[i] = argmax(lg, V);
    }
    di_seqstate_free(&st);
    free(lg);
    if (out_add(o, p, "prefill.logits", DI_DTYPE_F32, pl, S, V)) goto nomem;
    if (N > 0) {
        if (out_add(o, p, "decode.logits", DI_DTYPE_F32, dl, N, V) ||
            out_add(o, p, "decode.next_ids", DI_DTYPE_I32, next, N, 0))
            goto nomem;
    } else {
        free(dl);
        free(next);
    }
    if (drafted) {
        if (out_add(o, p, "draft0.logits", DI_DTYPE_F32, xl, B, V) ||
            out_add(o, p, "draft0.confidence", DI_DTYPE_F32, xc, B, 0) ||
            out_add(o, p, "draft0.ids", DI_DTYPE_I32, xi, B, 0))
            goto nomem;
    } else {
        free(xl);
        free(xc);
        free(xi);
    }
    return DI_OK;
nomem:
    return di_err_set(err, DI_ERR_NOMEM, "%s: out of memory", p);
fail:
    di_seqstate_free(&st);
    free(pl);
    free(dl);
    free(next);
    free(lg);
    free(xl);
    free(xc);
    free(xi);
    return di_err_prefix(err, "%s: ", p);
}

/* Engram map: tokenizer.json of the model, else the inputs' copy. */
static int32_t *load_map(const char *dir, const di_config *c, const di_safetensors *in, di_err *err) {
    int32_t *map = calloc((size_t)c->vocab_size, sizeof(int32_t));
    if (!map) return NULL;
    char path[4096];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    di_tokenizer *tok = NULL;
    FILE *f = fopen(path, "rb");
    if (f) {
        fclose(f);
        if (di_tokenizer_load(path, &tok) == DI_OK &&
            di_tokenizer_vocab_size(tok) == (size_t)c->vocab_size) {
            int n = 0;
            di_status rc = di_tokenizer_engram_map(tok, map, &n);
            di_tokenizer_free(tok);
            if (rc == DI_OK && n == c->engram_compressed_vocab) return map;
            di_err_set(err, DI_ERR_FORMAT, "%s: Engram map has %d classes, config says %lld", path,
                       n, (long long)c->engram_compressed_vocab);
            free(map);
            return NULL;
        }
        if (tok) di_tokenizer_free(tok);
    }
    di_tensor t;
    const di_tensor *m = find(in, "tokenizer.compressed_map", &t);
    if (m && di_tensor_numel(m) == c->vocab_size) {
        memcpy(map, m->data, (size_t)c->vocab_size * sizeof(int32_t));
        return map;
    }
    di_err_set(err, DI_ERR_NOT_FOUND,
               "no Engram token map: %s/tokenizer.json unusable and no tokenizer.compressed_map in the inputs", dir);
    free(map);
    return NULL;
}

int cli_dump(int argc, char **argv) {
    const char *model = NULL, *inputs = NULL, *out = NULL;
    int bf16 = 0, threads = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) model = argv[++i];
        else if (!strcmp(argv[i], "--inputs") && i + 1 < argc) inputs = argv[++i];
        else if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--threads") && i + 1 < argc) {
            int64_t v;
            if (cli_parse_i64("dump", "--threads", argv[++i], 0, 1024, &v)) return 2;
            threads = (int)v;
        }
        else if (!strcmp(argv[i], "--bf16")) bf16 = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "deepinfer dump: unknown argument '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
    }
    if (!model || !inputs || !out) {
        usage(stderr);
        return 2;
    }
    di_err err = {0};
    di_model_options opts;
    di_model_options_default(&opts);
    di_model *m = NULL;
    di_backend *be = NULL;
    di_lm lm;
    memset(&lm, 0, sizeof lm);
    di_safetensors in;
    memset(&in, 0, sizeof in);
    out_list o = {0};
    int32_t *map = NULL;
    int rc = 1;
    if (di_model_open(model, &opts, &m) != DI_OK) {
        fprintf(stderr, "deepinfer dump: %s\n", di_last_error());
        return 1;
    }
    if (di_safetensors_open(inputs, &in, &err)) goto fail;
    if (m->cfg.n_engram > 0 && !(map = load_map(model, &m->cfg, &in, &err))) goto fail;
    if (di_backend_cpu_create(threads, &be, &err)) goto fail;
    if (di_lm_init(&lm, &m->cfg, &m->weights, be, bf16 ? DI_NUMERICS_BF16 : DI_NUMERICS_FP8, map, &err))
        goto fail;
    for (size_t i = 0; i < in.n_entries; i++) {
        const char *nm = in.entries[i].name;
        size_t len = strlen(nm), sl = strlen(".prompt_ids");
        if (len <= sl || strcmp(nm + len - sl, ".prompt_ids")) continue;
        char p[256];
        if (len - sl >= sizeof p) continue;
        memcpy(p, nm, len - sl);
        p[len - sl] = 0;
        if (dump_prompt(&lm, &in, p, &o, &err)) goto fail;
    }
    if (o.n == 0) {
        di_err_set(&err, DI_ERR_NOT_FOUND, "%s: no tensor named <prompt>.prompt_ids", inputs);
        goto fail;
    }
    for (size_t i = 0; i < o.n; i++) o.v[i] = (di_st_named){o.names[i], &o.t[i]};
    if (di_safetensors_write(out, o.v, o.n, NULL, NULL, &err)) goto fail;
    rc = 0;
    goto done;
fail:
    fprintf(stderr, "deepinfer dump: %s\n", err.msg);
done:
    for (size_t i = 0; i < o.n; i++) {
        free(o.names[i]);
        free(o.t[i].data);
    }
    free(o.v);
    free(o.t);
    free(o.names);
    free(map);
    if (lm.blocks) di_lm_free(&lm);
    if (be) di_backend_destroy(be);
    if (in.entries) di_safetensors_close(&in);
    di_model_close(m);
    return rc;
}
