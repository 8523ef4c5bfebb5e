/* Fixtures of the model-description tests. */
#include "model_fixtures.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/file_read.h"

static char *read_file(const char *path, size_t *n) {
    char *buf = NULL;
    return di_file_read(path, 0, &buf, n, NULL) == DI_OK ? buf : NULL;
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
