/* Engram hash constants and rows (golden README level 1, architecture.md
 * §6.2): the prime search and the numpy-PCG64 multipliers against the
 * values golden.json records for the tiny model and the values the spec
 * records for the real V4.1-Flash config, and the exact Engram row ids of
 * both golden prompts, including a prompt fed in chunks. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "golden_util.h"
#include "test.h"

/* architecture.md §6.2, computed there with the reference algorithm. */
static const uint64_t REAL_MULT[2][4] = {
    {76632096046245ull, 4839876093313ull, 35959672319349ull, 73987337458391ull},
    {67716810739261ull, 51510806800915ull, 30921347202721ull, 82619226485591ull}};
static const int64_t REAL_PRIMES_FIRST[2] = {16000057, 16000477};
static const int64_t REAL_PRIMES_LAST[2] = {16000463, 16000889};

static void test_real_constants(void) {
    uint64_t m[4];
    di_engram_multipliers(1, 4, 99092, m);
    for (int i = 0; i < 4; i++) CHECKF(m[i] == REAL_MULT[0][i], "layer 1 M%d = %llu", i, (unsigned long long)m[i]);
    di_engram_multipliers(14, 4, 99092, m);
    for (int i = 0; i < 4; i++) CHECKF(m[i] == REAL_MULT[1][i], "layer 14 M%d = %llu", i, (unsigned long long)m[i]);
    /* primes of the real config: 2 layers x 3 orders x 8 heads from 16e6 */
    di_config c;
    memset(&c, 0, sizeof c);
    c.n_engram = 2;
    c.engram_max_ngram = 4;
    c.engram_n_heads = 8;
    c.engram_vocab_size = 16000000;
    int64_t p[48], sum[2] = {0, 0};
    di_engram_primes(&c, p);
    for (int i = 0; i < 48; i++) sum[i / 24] += p[i];
    CHECK_EQ_INT(p[0], REAL_PRIMES_FIRST[0]);
    CHECK_EQ_INT(p[23], REAL_PRIMES_LAST[0]);
    CHECK_EQ_INT(p[24], REAL_PRIMES_FIRST[1]);
    CHECK_EQ_INT(p[47], REAL_PRIMES_LAST[1]);
    CHECK_EQ_INT(sum[0], 384006168); /* engram_num_embeddings of the real config */
    CHECK_EQ_INT(sum[1], 384016682);
}

static void test_tiny_constants(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    char path[4096];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/golden.json", shared);
    FILE *fp = fopen(path, "rb");
    if (!fp) SKIP("%s missing", path);
    fseek(fp, 0, SEEK_END);
    long n = ftell(fp);
    fseek(fp, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    CHECK(fread(buf, 1, (size_t)n, fp) == (size_t)n);
    fclose(fp);
    buf[n] = 0;
    cJSON *j = cJSON_Parse(buf);
    free(buf);
    cJSON *eg = cJSON_GetObjectItem(j, "engram");
    cJSON *mult = cJSON_GetObjectItem(eg, "multipliers_decimal");
    cJSON *primes = cJSON_GetObjectItem(eg, "primes");
    gold_model g;
    if (!j || !mult || !primes || gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        cJSON_Delete(j);
        return;
    }
    const di_config *c = &g.cfg;
    int N = c->engram_max_ngram, per = (N - 1) * c->engram_n_heads;
    for (int l = 0; l < c->n_engram; l++) {
        for (int i = 0; i < N; i++) {
            const char *s = cJSON_GetArrayItem(cJSON_GetArrayItem(mult, l), i)->valuestring;
            CHECKF(g.lm.eg_mult[l * N + i] == strtoull(s, NULL, 10), "layer %d M%d: %llu vs %s",
                   c->engram_layers[l], i, (unsigned long long)g.lm.eg_mult[l * N + i], s);
        }
        for (int k = 0; k < per; k++) {
            cJSON *pv = cJSON_GetArrayItem(cJSON_GetArrayItem(cJSON_GetArrayItem(primes, l),
                                                              k / c->engram_n_heads),
                                           k % c->engram_n_heads);
            CHECK_EQ_INT(g.lm.eg_prime[l * per + k], (int64_t)pv->valuedouble);
        }
    }
    cJSON_Delete(j);
    gold_close(&g);
}

/* Row ids of a prompt, hashed in chunks of `chunk` tokens with the history
 * carried by the sequence state. */
static void rows_in_chunks(gold_model *g, const char *p, int chunk) {
    char name[96];
    int64_t S = 0;
    snprintf(name, sizeof name, "%s.prompt_ids", p);
    const int32_t *ids = gold_i32(g, name, &S);
    snprintf(name, sizeof name, "%s.prefill.engram_hash_ids", p);
    const int32_t *gh = gold_i32(g, name, NULL);
    if (!ids || !gh) {
        CHECK(0);
        return;
    }
    const di_config *c = &g->cfg;
    int per = c->n_engram * (c->engram_max_ngram - 1) * c->engram_n_heads;
    di_seqstate st;
    di_err err = {0};
    CHECK(di_seqstate_init(&st, &g->lm, S + 1, 0, &err) == DI_OK);
    int32_t *rows = malloc((size_t)(S * per) * sizeof(int32_t));
    for (int64_t t = 0; t < S; t += chunk) {
        int64_t n = S - t < chunk ? S - t : chunk;
        di_engram_hash(&g->lm, &st, ids + t, n, t, rows + t * per);
        di_engram_record(&g->lm, &st, ids + t, n, t);
        st.n_tokens += n;
    }
    int64_t bad = 0;
    for (int64_t i = 0; i < S * per; i++) bad += rows[i] != gh[i];
    CHECKF(bad == 0, "%s chunks of %d: %lld of %lld row ids differ", p, chunk, (long long)bad,
           (long long)(S * per));
    free(rows);
    di_seqstate_free(&st);
}

static void test_rows(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    gold_model g;
    if (gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        return;
    }
    int chunks[] = {100000, 1, 7, 64};
    for (int i = 0; i < 4; i++) {
        rows_in_chunks(&g, "short", chunks[i]);
        rows_in_chunks(&g, "long", chunks[i]);
    }
    gold_close(&g);
}

/* The reference sampler's relation: token = argmax(softmax(logits/T) / E). */
static void test_sampling_relation(void) {
    const char *shared = test_shared_dir();
    if (!shared) SKIP("../shared not found (set DEEPINFER_SHARED_DIR)");
    gold_model g;
    if (gold_open(&g, shared, "v41-tiny")) {
        CHECK(0);
        return;
    }
    int64_t n = 0, V = g.cfg.vocab_size;
    const int32_t *ids = gold_i32(&g, "sample.ids", &n);
    const float *lg = gold_f32(&g, "sample.logits", NULL), *e = gold_f32(&g, "sample.noise", NULL);
    CHECK(ids && lg && e);
    for (int64_t i = 0; ids && lg && e && i < n; i++) {
        int32_t tok = 0;
        di_sample_exp_noise(lg + i * V, e + i * V, V, 1.0f, &tok);
        CHECK_EQ_INT(tok, ids[i]);
    }
    gold_close(&g);
}

int main(void) {
    RUN(test_real_constants);
    RUN(test_tiny_constants);
    RUN(test_rows);
    RUN(test_sampling_relation);
    return test_summary();
}
