/* Options shared by the commands that run the engine (generate, batch, ppl,
 * bench): which model, how it is loaded, threads and limits; plus the small
 * parsing, file and progress helpers they have in common. */
#ifndef DI_CLI_ENGINE_ARGS_H
#define DI_CLI_ENGINE_ARGS_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "deepinfer.h"

typedef struct cli_engine_args {
    const char *model;       /* --model DIR (NULL: $DEEPINFER_HF_MODEL_DIR, else the default model) */
    const char *config;      /* --config FILE: dummy weights from this config.json */
    const char *tokenizer;   /* --tokenizer FILE */
    int dummy;               /* --load-format dummy */
    int n_threads;           /* --threads N (0 = all cores) */
    int64_t max_model_len;   /* --max-model-len N */
    int max_batch;           /* --max-batch N (0 = engine default) */
    int64_t step_tokens;     /* --step-tokens N: token budget of a step (0 = default) */
    uint64_t memory_limit;   /* --memory-limit N[KMG]: per-sequence state bytes (0 = default) */
    uint64_t engine_seed;    /* --engine-seed N: seeds requests without a seed */
} cli_engine_args;

/* The usage lines of the options above. */
extern const char cli_engine_args_usage[];

/* Consumes argv[*i] (and its value) when it is one of the options above:
 * returns 1 when consumed, 0 when not one of them, -1 after printing an
 * error (cmd names the command in the message). */
int cli_engine_arg(const char *cmd, int argc, char **argv, int *i, cli_engine_args *a);

/* Opens the engine; prints the error and returns NULL on failure. */
di_engine *cli_engine_open(const char *cmd, const cli_engine_args *a);

/* Strict number parsing: the whole string, within [lo, hi]. 0 = ok; prints
 * "<cmd>: <flag>: ..." and returns -1 otherwise. */
int cli_parse_i64(const char *cmd, const char *flag, const char *s, int64_t lo, int64_t hi, int64_t *out);
/* A byte count > 0, optionally with K, M or G (powers of 1024). */
int cli_parse_bytes(const char *cmd, const char *flag, const char *s, uint64_t *out);
int cli_parse_f64(const char *cmd, const char *flag, const char *s, double lo, double hi, double *out);

/* Whole file ('-' = standard input) into a NUL-terminated buffer (free()). */
char *cli_read_file(const char *cmd, const char *path, size_t *len);

double cli_now_s(void);

/* A one-line progress bar on stderr, redrawn at most 5 times a second (and
 * only on a terminal, unless forced: a final line is always printed). */
typedef struct cli_progress {
    const char *label;
    double t_start, t_last;
    int tty, drawn;
} cli_progress;

void cli_progress_init(cli_progress *p, const char *label);
void cli_progress_draw(cli_progress *p, uint64_t done, uint64_t total, uint64_t in_tokens, uint64_t out_tokens,
                       int final);

#endif
