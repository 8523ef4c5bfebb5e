/* Grammar mask benchmark driver (bench/bench_grammar.py prepares its inputs
 * and runs the peer, llguidance, on the same cases in the same run).
 *
 *   bench_grammar VOCAB.bin CASES.jsonl [--cold]
 *
 * VOCAB.bin: u32 n_vocab, i32 eos, then per id u16 length + bytes.
 * CASES.jsonl: one {"schema": {...}, "tokens": [ids]} per line.
 * For each case: compile time, then for each token the time to fill the
 * mask (the token must be allowed) before advancing. Prints one JSON line:
 * {"compile_us": [...], "mask_us": [...], "failed": n}. Single-threaded,
 * like MaskBench. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deepinfer.h"

static double now_us(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec * 1e6 + (double)ts.tv_nsec * 1e-3;
}

static di_vocab *load_vocab(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    uint32_t n;
    int32_t eos;
    if (fread(&n, 4, 1, f) != 1 || fread(&eos, 4, 1, f) != 1 || n == 0 || n > (1u << 24)) { fclose(f); return NULL; }
    uint8_t **bytes = calloc(n, sizeof *bytes);
    size_t *lens = calloc(n, sizeof *lens);
    di_vocab *v = NULL;
    int ok = bytes && lens;
    for (uint32_t i = 0; i < n && ok; i++) {
        uint16_t l;
        ok = fread(&l, 2, 1, f) == 1;
        if (!ok) break;
        lens[i] = l;
        bytes[i] = malloc(l ? l : 1);
        ok = bytes[i] && (l == 0 || fread(bytes[i], 1, l, f) == l);
    }
    fclose(f);
    if (ok) di_vocab_create(n, (const uint8_t *const *)bytes, lens, eos, &v);
    for (uint32_t i = 0; bytes && i < n; i++) free(bytes[i]);
    free(bytes);
    free(lens);
    return v;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: bench_grammar VOCAB.bin CASES.jsonl\n");
        return 2;
    }
    di_vocab *v = load_vocab(argv[1]);
    if (!v) {
        fprintf(stderr, "bench_grammar: cannot load %s\n", argv[1]);
        return 1;
    }
    FILE *f = fopen(argv[2], "rb");
    if (!f) {
        fprintf(stderr, "bench_grammar: cannot open %s\n", argv[2]);
        return 1;
    }
    size_t words = (di_vocab_size(v) + 31) / 32;
    uint32_t *mask = malloc(words * sizeof *mask);
    char *line = NULL;
    size_t cap = 0;
    int failed = 0;
    printf("{\"compile_us\": [");
    int first_c = 1;
    /* mask times go to a second buffer, printed after */
    size_t nm = 0, capm = 1 << 16;
    double *mt = malloc(capm * sizeof *mt);
    while (getline(&line, &cap, f) > 0) {
        cJSON *c = cJSON_Parse(line);
        cJSON *schema = cJSON_GetObjectItem(c, "schema");
        cJSON *toks = cJSON_GetObjectItem(c, "tokens");
        char *st = schema ? cJSON_PrintUnformatted(schema) : NULL;
        if (!st || !cJSON_IsArray(toks)) { cJSON_Delete(c); free(st); failed++; continue; }
        di_grammar *g = NULL;
        double t0 = now_us();
        di_status rc = di_grammar_compile(v, DI_CONSTRAINT_JSON_SCHEMA, st, strlen(st), NULL, &g);
        double t1 = now_us();
        free(st);
        if (rc) { cJSON_Delete(c); failed++; continue; }
        di_matcher *m = NULL;
        di_matcher_create(g, &m);
        printf("%s%.1f", first_c ? "" : ", ", t1 - t0);
        first_c = 0;
        for (cJSON *t = toks->child; t; t = t->next) {
            int id = t->valueint;
            double a = now_us();
            di_matcher_fill_mask(m, mask, words);
            double b = now_us();
            if (nm == capm) { capm *= 2; mt = realloc(mt, capm * sizeof *mt); }
            mt[nm++] = b - a;
            if (!((mask[id >> 5] >> (id & 31)) & 1) || di_matcher_advance(m, id) != DI_OK) { failed++; break; }
        }
        di_matcher_free(m);
        di_grammar_free(g);
        cJSON_Delete(c);
    }
    printf("], \"mask_us\": [");
    for (size_t i = 0; i < nm; i++) printf("%s%.2f", i ? ", " : "", mt[i]);
    printf("], \"failed\": %d}\n", failed);
    free(mt);
    free(line);
    free(mask);
    fclose(f);
    di_vocab_free(v);
    return 0;
}
