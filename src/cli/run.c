/* `deepinfer run [--model DIR]`: the main job. Opens the embedded default
 * tiny model (generating it into the cache folder on first use) or DIR,
 * prints its summary and its memory plan. */
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "cli/cli.h"
#include "deepinfer.h"
#include "model/default_model.h"

static void run_usage(FILE *out) {
    fprintf(out, "usage: deepinfer run [--model DIR]\n"
                 "  without --model: the embedded default tiny model, generated on first use into\n"
                 "  $DEEPINFER_CACHE_DIR, else $XDG_CACHE_HOME/deepinfer, else ~/.cache/deepinfer\n");
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int cli_run(int argc, char **argv) {
    const char *model = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else {
            fprintf(stderr, "deepinfer run: unexpected argument '%s'\n", argv[i]);
            run_usage(stderr);
            return 2;
        }
    }
    char dir[4096];
    if (!model) {
        di_err err = {0};
        if (di_default_model_dir(dir, sizeof dir, &err)) {
            fprintf(stderr, "deepinfer run: %s\n", err.msg);
            return 1;
        }
        if (!di_default_model_ready(dir)) {
            printf("generating the default model (v41-tiny, dummy weights, seed %#llx) into %s ...\n",
                   (unsigned long long)DI_DEFAULT_MODEL_SEED, dir);
            fflush(stdout);
        }
        double t0 = now_s();
        int generated = 0;
        if (di_default_model_ensure(dir, sizeof dir, &generated, &err)) {
            fprintf(stderr, "deepinfer run: %s\n", err.msg);
            return 1;
        }
        if (generated) printf("  done in %.2f s\n", now_s() - t0);
        model = dir;
    }
    di_model_options o;
    di_model_options_default(&o);
    di_model *m;
    double t0 = now_s();
    if (di_model_open(model, &o, &m)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        return 1;
    }
    double t_open = now_s() - t0;
    char *s = NULL;
    if (di_model_describe(m, &s)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        di_model_close(m);
        return 1;
    }
    printf("%s(opened and bound in %.3f s)\n\nmemory plan\n", s, t_open);
    di_free(s);
    if (di_model_plan(m, 0, 0, 0, 0, &s)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        di_model_close(m);
        return 1;
    }
    fputs(s, stdout);
    di_free(s);
    di_model_close(m);
    return 0;
}
