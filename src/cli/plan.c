/* `deepinfer plan --config FILE | --model DIR [--json] [--context N]
 * [--batch B] [--gpu-mem-gib G]`: memory plan of a model (architecture.md
 * §13): weights per dtype and part, compressed KV + index bytes per token,
 * fixed per-sequence state, devices needed for the context and batch.
 *
 * --config plans from the config alone (dummy weights, nothing
 * materialised); --model also validates and binds the checkpoint. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"
#include "deepinfer.h"

static void plan_usage(FILE *out) {
    fprintf(out, "usage: deepinfer plan (--config FILE | --model DIR) [--json] [--context N] [--batch B]\n"
                 "                      [--gpu-mem-gib G]\n"
                 "  --config FILE    a config.json (HF layout); no weights needed\n"
                 "  --model DIR      a checkpoint folder (validated and bound first)\n"
                 "  --json           machine-readable output\n"
                 "  --context N      tokens per sequence (default 131072)\n"
                 "  --batch B        sequences held at once (default 1)\n"
                 "  --gpu-mem-gib G  memory of one device in GiB (default 140, an H200)\n");
}

int cli_plan(int argc, char **argv) {
    const char *config = NULL, *model = NULL;
    int json = 0;
    int64_t context = 131072, batch = 1;
    double gib = 140;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            plan_usage(stdout);
            return 0;
        } else if (!strcmp(a, "--json")) {
            json = 1;
        } else if (!strcmp(a, "--config") && v) {
            config = v, i++;
        } else if (!strcmp(a, "--model") && v) {
            model = v, i++;
        } else if (!strcmp(a, "--context") && v) {
            if (cli_parse_i64("plan", a, v, 1, INT64_C(1) << 40, &context)) return 2;
            i++;
        } else if (!strcmp(a, "--batch") && v) {
            if (cli_parse_i64("plan", a, v, 1, 1 << 30, &batch)) return 2;
            i++;
        } else if (!strcmp(a, "--gpu-mem-gib") && v) {
            char *end;
            gib = strtod(v, &end);
            if (end == v || *end || !(gib > 0 && gib <= 1e6)) {
                fprintf(stderr, "deepinfer plan: --gpu-mem-gib: expected a size in (0, 1e6] GiB, got '%s'\n", v);
                return 2;
            }
            i++;
        } else {
            fprintf(stderr, "deepinfer plan: unexpected argument '%s'\n", a);
            plan_usage(stderr);
            return 2;
        }
    }
    if (!config == !model) {
        fprintf(stderr, "deepinfer plan: give exactly one of --config FILE or --model DIR\n");
        plan_usage(stderr);
        return 2;
    }
    di_model_options o;
    di_model_options_default(&o);
    if (config) {
        o.load_format = DI_LOAD_DUMMY;
        o.dummy_lazy = 1; /* shapes only: the real config is 510 GB */
    }
    di_model *m;
    if (di_model_open(config ? config : model, &o, &m)) {
        fprintf(stderr, "deepinfer plan: %s\n", di_last_error());
        return 1;
    }
    char *text;
    di_status st = di_model_plan(m, json, context, (uint32_t)batch, gib, &text);
    if (st) {
        fprintf(stderr, "deepinfer plan: %s\n", di_last_error());
        di_model_close(m);
        return 1;
    }
    fputs(text, stdout);
    if (json) fputc('\n', stdout);
    di_free(text);
    di_model_close(m);
    return 0;
}
