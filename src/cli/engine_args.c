/* Options shared by the engine commands (see engine_args.h). */
#include "cli/engine_args.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/file_read.h"

const char cli_engine_args_usage[] =
    "model:\n"
    "  --model DIR            checkpoint folder (default: $DEEPINFER_HF_MODEL_DIR, else the\n"
    "                         embedded default tiny model)\n"
    "  --load-format dummy --config FILE\n"
    "                         random weights in the official formats for config.json FILE\n"
    "  --tokenizer FILE       tokenizer.json (default: the model folder's)\n"
    "  -t, --threads N        backend threads (default: all cores)\n"
    "  --max-model-len N      prompt + output cap (default: the model's, at most 65536)\n"
    "  --max-batch N          sequences per step (default: the backend's, 64 on the CPU,\n"
    "                         1024 on a GPU)\n"
    "  --step-tokens N        token budget of one step (default: 512 on the CPU, 16384 on a GPU)\n"
    "  --memory-limit N[KMG]  bytes of per-sequence state (default: 2G on the CPU, half of the\n"
    "                         GPU memory the weights leave)\n"
    "  --engine-seed N        seed of requests that set none (default 0)\n";

int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (!*s || *end || errno || v < lo || v > hi) {
        fprintf(stderr, "deepinfer %s: %s: expected an integer in %lld..%lld, got '%s'\n", cmd, flag, (long long)lo,
                (long long)hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_parse_bytes(const char *cmd, const char *flag, const char *s, uint64_t *out) {
    char *end;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    int shift = 0;
    if (*end == 'K' || *end == 'k') shift = 10, end++;
    else if (*end == 'M' || *end == 'm') shift = 20, end++;
    else if (*end == 'G' || *end == 'g') shift = 30, end++;
    if (*s < '0' || *s > '9' || *end || errno || v == 0 || v > (UINT64_MAX >> shift)) {
        fprintf(stderr, "deepinfer %s: %s: expected a positive byte count (suffix K, M or G: powers of 1024), got '%s'\n",
                cmd, flag, s);
        return -1;
    }
    *out = (uint64_t)v << shift;
    return 0;
}

int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (!*s || *end || errno || isnan(v) || v < lo || v > hi) {
        fprintf(stderr, "deepinfer %s: %s: expected a number in [%g, %g], got '%s'\n", cmd, flag, lo, hi, s);
        return -1;
    }
    *out = v;
    return 0;
}

int cli_engine_arg(const char *cmd, int argc, char **argv, int *i, cli_engine_args *a) {
    const char *f = argv[*i];
    int has = *i + 1 < argc;
    int64_t v;
    if (!strcmp(f, "--model") || !strcmp(f, "-m")) {
        if (!has) goto missing;
        a->model = argv[++*i];
    } else if (!strcmp(f, "--config")) {
        if (!has) goto missing;
        a->config = argv[++*i];
        a->dummy = 1;
    } else if (!strcmp(f, "--tokenizer")) {
        if (!has) goto missing;
        a->tokenizer = argv[++*i];
    } else if (!strcmp(f, "--load-format")) {
        if (!has) goto missing;
        const char *lf = argv[++*i];
        if (!strcmp(lf, "dummy")) a->dummy = 1;
        else if (!strcmp(lf, "auto") || !strcmp(lf, "safetensors")) a->dummy = 0;
        else {
            fprintf(stderr, "deepinfer %s: --load-format: expected auto, safetensors or dummy, got '%s'\n", cmd, lf);
            return -1;
        }
    } else if (!strcmp(f, "--threads") || !strcmp(f, "-t")) {
        if (!has) goto missing;
        if (cli_parse_i64(cmd, f, argv[++*i], 0, 1024, &v)) return -1;
        a->n_threads = (int)v;
    } else if (!strcmp(f, "--max-model-len")) {
        if (!has) goto missing;
        if (cli_parse_i64(cmd, f, argv[++*i], 2, INT64_C(1) << 40, &a->max_model_len)) return -1;
    } else if (!strcmp(f, "--max-batch")) {
        if (!has) goto missing;
        if (cli_parse_i64(cmd, f, argv[++*i], 1, 4096, &v)) return -1;
        a->max_batch = (int)v;
    } else if (!strcmp(f, "--step-tokens")) {
        if (!has) goto missing;
        if (cli_parse_i64(cmd, f, argv[++*i], 1, INT64_C(1) << 30, &a->step_tokens)) return -1;
    } else if (!strcmp(f, "--memory-limit")) {
        if (!has) goto missing;
        if (cli_parse_bytes(cmd, f, argv[++*i], &a->memory_limit)) return -1;
    } else if (!strcmp(f, "--engine-seed")) {
        if (!has) goto missing;
        if (cli_parse_i64(cmd, f, argv[++*i], 0, INT64_MAX, &v)) return -1;
        a->engine_seed = (uint64_t)v;
    } else {
        return 0;
    }
    return 1;
missing:
    fprintf(stderr, "deepinfer %s: %s needs a value\n", cmd, f);
    return -1;
}

di_engine *cli_engine_open(const char *cmd, const cli_engine_args *a) {
    di_engine_options o;
    di_engine_options_default(&o);
    if (a->dummy) {
        o.load_format = DI_LOAD_DUMMY;
        o.model = a->config ? a->config : a->model;
        if (!o.model) {
            fprintf(stderr, "deepinfer %s: --load-format dummy needs --config FILE\n", cmd);
            return NULL;
        }
    } else {
        o.model = a->model;
    }
    o.tokenizer = a->tokenizer;
    o.n_threads = a->n_threads;
    o.max_model_len = a->max_model_len;
    if (a->max_batch) o.max_batch = a->max_batch;
    if (a->step_tokens) o.max_tokens_per_step = a->step_tokens;
    o.memory_limit = a->memory_limit;
    o.seed = a->engine_seed;
    di_engine *e = NULL;
    if (di_engine_open(&o, &e)) {
        fprintf(stderr, "deepinfer %s: %s\n", cmd, di_last_error());
        return NULL;
    }
    return e;
}

char *cli_read_file(const char *cmd, const char *path, size_t *len) {
    di_err err = {0};
    char *buf = NULL;
    if (strcmp(path, "-"))
        di_file_read(path, 0, &buf, len, &err);
    else
        di_file_read_stream(stdin, path, 0, &buf, len, &err);
    if (err.code) fprintf(stderr, "deepinfer %s: %s\n", cmd, err.msg);
    return buf;
}

double cli_now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void cli_progress_init(cli_progress *p, const char *label) {
    memset(p, 0, sizeof *p);
    p->label = label;
    p->t_start = cli_now_s();
    p->tty = isatty(STDERR_FILENO);
}

void cli_progress_draw(cli_progress *p, uint64_t done, uint64_t total, uint64_t in_tokens, uint64_t out_tokens,
                       int final) {
    double now = cli_now_s();
    if (!final && (!p->tty || now - p->t_last < 0.2)) return;
    p->t_last = now;
    double dt = now - p->t_start;
    enum { W = 30 };
    char bar[W + 1];
    int fill = total ? (int)(W * done / total) : W;
    for (int k = 0; k < W; k++) bar[k] = k < fill ? '#' : '.';
    bar[W] = '\0';
    fprintf(stderr, "%s%s [%s] %llu/%llu requests | %.1f s | in %.1f tok/s, out %.1f tok/s%s", p->tty ? "\r" : "",
            p->label, bar, (unsigned long long)done, (unsigned long long)total, dt,
            dt > 0 ? (double)in_tokens / dt : 0.0, dt > 0 ? (double)out_tokens / dt : 0.0,
            final || !p->tty ? "\n" : "");
    p->drawn = 1;
}
