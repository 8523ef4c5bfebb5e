/* Fixtures of the model-description tests. */
#include "model_fixtures.h"

#include <stdio.h>
#include <stdlib.h>

static char *read_file(const char *path, size_t *n) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    char *buf = NULL;
    long sz = fseek(f, 0, SEEK_END) == 0 ? ftell(f) : -1;
    if (sz >= 0 && fseek(f, 0, SEEK_SET) == 0 && (buf = malloc((size_t)sz + 1))) {
        *n = fread(buf, 1, (size_t)sz, f);
        buf[*n] = 0;
    }
    fclose(f);
    return buf;
}

char *fixture_read(const char *name, size_t *n) {
    const char *dirs[] = {"tests/data", "../tests/data", "../../tests/data"};
    for (size_t i = 0; i < sizeof dirs / sizeof *dirs; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/%s", dirs[i], name);
        char *s = read_file(path, n);
        if (s) return s;
    }
    fprintf(stderr, "missing tests/data/%s\n", name);
    return NULL;
}

int fixture_config(const char *name, di_config *out) {
    size_t n;
    char *s = fixture_read(name, &n);
    if (!s) return 0;
    di_err e = {0};
    di_status st = di_config_parse(s, n, out, &e);
    free(s);
    if (st) fprintf(stderr, "tests/data/%s: %s\n", name, e.msg);
    return st == DI_OK;
}

char *fixture_golden_index(const char *shared) {
    char path[4200];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/model.safetensors.index.json", shared);
    size_t n;
    return read_file(path, &n);
}
