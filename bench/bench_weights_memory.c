/* A checkpoint's weights mapped from its files or copied into memory
 * (model/weights_memory.h), end to end on the CPU: one sequence's greedy
 * decode through the engine, on a dummy-weight checkpoint written in the
 * official layout (safetensors shards + index, FP8 / MXFP4 / BF16 / F32),
 * whose data sections start off a cache line as a real checkpoint's do.
 *
 *   bench_weights_memory [CONFIG] [TOKENIZER] [THREADS] [ROUNDS]
 *   defaults: bench/configs/dummy-1g.json ../shared/golden/v41-tiny/tokenizer.json 0 3
 *
 * The checkpoint goes to $WM_DIR (default /tmp/deepinfer_bench_wm), written
 * once and kept. Each round opens the engine twice, with
 * DI_WEIGHTS_IN_MEMORY=0 (the weights stay mapped) and =1 (copied), and
 * decodes 32 tokens of one sequence after a 16-token prompt; it reports
 * decode tokens/s (output tokens / the engine's forward time), the open
 * time, and checks that both give the same tokens. The peer is the mapped
 * run of the same round. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "deepinfer.h"
#include "io/safetensors_writer.h"
#include "model/config.h"
#include "model/dummy.h"
#include "model/manifest.h"

#include "bench_util.h"

enum { PROMPT = 16, OUT = 32, MAX_ROUNDS = 15 };

static void fill_cb(void *ctx, size_t index, uint64_t off, void *dst, size_t n) {
    di_dummy *d = ctx;
    di_dummy_fill(d->seed, &d->manifest.v[index], off, dst, n);
}

static int copy_file(const char *from, const char *to) {
    FILE *a = fopen(from, "rb"), *b = a ? fopen(to, "wb") : NULL;
    char buf[1 << 16];
    size_t n;
    int ok = a && b;
    while (ok && (n = fread(buf, 1, sizeof buf, a)) > 0) ok = fwrite(buf, 1, n, b) == n;
    if (a) fclose(a);
    if (b && fclose(b)) ok = 0;
    return ok ? 0 : -1;
}

/* The dummy model of `config` as a checkpoint in dir (nothing held in
 * memory: every tensor made by the generator while it is written). */
static int write_checkpoint(const char *config, const char *dir) {
    di_config cfg;
    di_err e = {0};
    if (di_config_load(config, &cfg, &e)) {
        fprintf(stderr, "bench_weights_memory: %s\n", e.msg);
        return -1;
    }
    di_dummy_options o;
    di_dummy_options_default(&o);
    o.block_begin = cfg.n_blocks; /* none materialised */
    o.block_end = 0;
    o.globals = 0;
    o.engram_tables = 0;
    di_dummy d;
    if (di_dummy_build(&d, &cfg, &o, &e)) {
        fprintf(stderr, "bench_weights_memory: %s\n", e.msg);
        return -1;
    }
    di_st_named *v = calloc(d.manifest.n, sizeof *v);
    for (size_t i = 0; v && i < d.manifest.n; i++) v[i] = (di_st_named){d.manifest.v[i].name, d.manifest.v[i].slot};
    char path[4300];
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = v && mkdir(dir, 0755) == 0 && copy_file(config, path) == 0 &&
                     di_safetensors_write_sharded(dir, v, d.manifest.n, 2, fill_cb, &d, &e) == DI_OK
                 ? 0
                 : -1;
    if (rc) fprintf(stderr, "bench_weights_memory: writing %s failed%s%s\n", dir, e.msg[0] ? ": " : "", e.msg);
    free(v);
    di_dummy_free(&d);
    return rc;
}

typedef struct run {
    double tps, open_s;
    uint64_t in_memory;
    int32_t ids[OUT];
    size_t n;
} run;

static int decode_once(const char *dir, const char *tok, int threads, int in_memory, run *r) {
    setenv("DI_WEIGHTS_IN_MEMORY", in_memory ? "1" : "0", 1);
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = dir;
    o.tokenizer = tok;
    o.accelerator = DI_ACCEL_CPU;
    o.n_threads = threads;
    di_engine *e = NULL;
    double t0 = bench_now_s();
    if (di_engine_open(&o, &e)) {
        fprintf(stderr, "bench_weights_memory: %s\n", di_last_error());
        return -1;
    }
    r->open_s = bench_now_s() - t0;
    di_engine_info info;
    di_engine_get_info(e, &info);
    r->in_memory = info.weights_in_memory;
    int32_t prompt[PROMPT];
    for (int i = 0; i < PROMPT; i++) prompt[i] = 10 + 7 * i;
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0;
    p.max_tokens = OUT;
    p.ignore_eos = 1;
    uint64_t id;
    di_engine_stats s0, s1;
    di_engine_get_stats(e, &s0);
    if (di_engine_submit_tokens(e, prompt, PROMPT, &p, &id) || di_engine_run(e, NULL, NULL)) {
        fprintf(stderr, "bench_weights_memory: %s\n", di_last_error());
        di_engine_close(e);
        return -1;
    }
    di_engine_get_stats(e, &s1);
    di_completion c;
    r->n = 0;
    if (!di_engine_get_completion(e, id, 0, &c)) {
        r->n = c.n_tokens < OUT ? c.n_tokens : OUT;
        memcpy(r->ids, c.token_ids, r->n * sizeof *r->ids);
    }
    r->tps = (double)(s1.output_tokens - s0.output_tokens) / (s1.forward_s - s0.forward_s);
    di_engine_close(e);
    return 0;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

int main(int argc, char **argv) {
    const char *config = argc > 1 ? argv[1] : "bench/configs/dummy-1g.json";
    const char *tok = argc > 2 ? argv[2] : "../shared/golden/v41-tiny/tokenizer.json";
    const int threads = argc > 3 ? atoi(argv[3]) : 0;
    int rounds = argc > 4 ? atoi(argv[4]) : 3;
    if (rounds < 1 || rounds > MAX_ROUNDS) rounds = 3;
    const char *dir = getenv("WM_DIR") ? getenv("WM_DIR") : "/tmp/deepinfer_bench_wm";
    char index[4300];
    snprintf(index, sizeof index, "%s/model.safetensors.index.json", dir);
    struct stat sb;
    if (stat(index, &sb) != 0) {
        printf("# writing the dummy checkpoint of %s into %s\n", config, dir);
        fflush(stdout);
        if (write_checkpoint(config, dir)) return 1;
    }
    double tps[2][MAX_ROUNDS], open_s[2][MAX_ROUNDS];
    run r[2];
    int same = 1;
    uint64_t in_mem = 0;
    for (int k = 0; k < rounds; k++) {
        for (int m = 0; m < 2; m++) {
            if (decode_once(dir, tok, threads, m, &r[m])) return 1;
            tps[m][k] = r[m].tps;
            open_s[m][k] = r[m].open_s;
        }
        same &= r[0].n == r[1].n && r[0].n == OUT && !memcmp(r[0].ids, r[1].ids, r[0].n * sizeof *r[0].ids) &&
                r[0].in_memory == 0 && r[1].in_memory > 0;
        in_mem = r[1].in_memory;
        printf("round %d: mapped %.2f tokens/s (open %.2f s), in memory %.2f tokens/s (open %.2f s)\n", k + 1,
               tps[0][k], open_s[0][k], tps[1][k], open_s[1][k]);
        fflush(stdout);
    }
    double ratio[MAX_ROUNDS];
    for (int k = 0; k < rounds; k++) ratio[k] = tps[1][k] / tps[0][k];
    printf("# %s, %d threads (0: all), %d rounds, decode of %d tokens after %d; weights copied: %.1f MB\n", config,
           threads, rounds, OUT, PROMPT, (double)in_mem / 1e6);
    printf("RESULT mapped %.2f tokens/s, in memory %.2f tokens/s, ratio (median of the rounds) %.3f, same tokens: %s\n",
           median(tps[0], rounds), median(tps[1], rounds), median(ratio, rounds), same ? "yes" : "NO");
    return same ? 0 : 1;
}
