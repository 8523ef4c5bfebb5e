/* Engine throughput on the CPU backend (docs/engine.md).
 *
 *   build/bench/bench_engine [SHARED_DIR] [REPS]
 *
 * Models: the golden tiny V4.1 checkpoint and a ~130M-parameter dummy
 * config (the tiny config widened: hidden 512, 10 routed experts of 512).
 * For batch sizes 1, 4, 16 it runs as many requests (prompts of 40-90
 * tokens, 32 greedy tokens each) and reports prompt and generated tokens/s;
 * the peer is the same requests run one at a time (max_batch 1).
 * Async scheduling: 16 requests with a JSON-object constraint (mask
 * filling is host work) with async on and off; it reports the host time,
 * the part of it overlapped with forwards, and the wall-time ratio. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "deepinfer.h"

#include "bench_util.h"

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

typedef struct model_spec {
    const char *name, *path, *tokenizer;
    int dummy;
} model_spec;

typedef struct result {
    double wall, prompt_tps, out_tps, host, overlap, fwd;
} result;

static int run_once(const model_spec *m, int n_req, int max_batch, int async, int constrained, result *r) {
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = m->path;
    o.tokenizer = m->tokenizer;
    o.load_format = m->dummy ? DI_LOAD_DUMMY : DI_LOAD_AUTO;
    o.max_batch = max_batch;
    o.async_scheduling = async;
    di_engine *e;
    if (di_engine_open(&o, &e)) {
        fprintf(stderr, "bench_engine: %s: %s\n", m->name, di_last_error());
        return -1;
    }
    const di_tokenizer *tok = di_engine_tokenizer(e);
    static const char *text =
        "The quick brown fox jumps over the lazy dog while the river runs past the old mill and the "
        "children count the boats, one by one, until the evening light fades over the hills and the "
        "town goes quiet for the night.";
    int32_t *ids = NULL;
    size_t n_ids = 0;
    di_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n_ids);
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0;
    p.max_tokens = 32;
    p.ignore_eos = !constrained;
    p.json_object = constrained;
    double t0 = bench_now_s();
    for (int i = 0; i < n_req; i++) {
        uint64_t id;
        size_t len = 40 + (size_t)(i * 13) % 50;
        if (len > n_ids) len = n_ids;
        if (di_engine_submit_tokens(e, ids + (n_ids - len), len, &p, &id)) {
            fprintf(stderr, "bench_engine: %s\n", di_last_error());
            return -1;
        }
    }
    if (di_engine_run(e, NULL, NULL)) {
        fprintf(stderr, "bench_engine: %s\n", di_last_error());
        return -1;
    }
    r->wall = bench_now_s() - t0;
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    r->prompt_tps = (double)st.prompt_tokens / r->wall;
    r->out_tps = (double)st.output_tokens / r->wall;
    r->host = st.host_s;
    r->overlap = st.overlap_s;
    r->fwd = st.forward_s;
    di_free(ids);
    di_engine_close(e);
    return 0;
}

/* The tiny config widened to about 130M parameters (89 MB in the official formats). */
static int write_big_config(const char *shared, const char *out) {
    char path[4200];
    snprintf(path, sizeof path, "%s/golden/v41-tiny/config.json", shared);
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    static char buf[1 << 16];
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    cJSON *root = cJSON_Parse(buf);
    cJSON *tc = root ? cJSON_GetObjectItem(root, "text_config") : NULL;
    if (!tc) return -1;
    cJSON_ReplaceItemInObject(tc, "hidden_size", cJSON_CreateNumber(512));
    cJSON_ReplaceItemInObject(tc, "moe_intermediate_size", cJSON_CreateNumber(512));
    cJSON_ReplaceItemInObject(tc, "n_routed_experts", cJSON_CreateNumber(10));
    cJSON_ReplaceItemInObject(tc, "num_attention_heads", cJSON_CreateNumber(8));
    cJSON_ReplaceItemInObject(tc, "q_lora_rank", cJSON_CreateNumber(256));
    cJSON_ReplaceItemInObject(tc, "o_lora_rank", cJSON_CreateNumber(256));
    char *s = cJSON_Print(root);
    cJSON_Delete(root);
    f = fopen(out, "wb");
    if (!f || !s) return -1;
    fputs(s, f);
    fclose(f);
    free(s);
    return 0;
}

int main(int argc, char **argv) {
    const char *shared = argc > 1 ? argv[1] : "../shared";
    int reps = argc > 2 ? atoi(argv[2]) : 3;
    if (reps < 1) reps = 1;
    char tiny[4200], tokp[4200], big[] = "/tmp/deepinfer_bench_engine_config.json";
    snprintf(tiny, sizeof tiny, "%s/golden/v41-tiny", shared);
    snprintf(tokp, sizeof tokp, "%s/golden/v41-tiny/tokenizer.json", shared);
    if (write_big_config(shared, big)) {
        fprintf(stderr, "bench_engine: cannot read %s/golden/v41-tiny/config.json\n", shared);
        return 1;
    }
    model_spec models[2] = {{"v41-tiny (4.9 MB)", tiny, NULL, 0}, {"dummy ~130M params", big, tokp, 1}};
    printf("| model | batch | prompt tok/s | generated tok/s | peer (one at a time) generated tok/s | ratio |\n");
    printf("|---|---:|---:|---:|---:|---:|\n");
    for (int mi = 0; mi < 2; mi++) {
        int batches[3] = {1, 4, 16};
        for (int b = 0; b < 3; b++) {
            double pt[16], ot[16], peer[16];
            for (int r = 0; r < reps; r++) {
                result x, y;
                if (run_once(&models[mi], batches[b], batches[b], 1, 0, &x)) return 1;
                if (run_once(&models[mi], batches[b], 1, 1, 0, &y)) return 1;
                pt[r] = x.prompt_tps;
                ot[r] = x.out_tps;
                peer[r] = y.out_tps;
            }
            double o = median(ot, reps), pe = median(peer, reps);
            printf("| %s | %d | %.1f | %.1f | %.1f | %.2f |\n", models[mi].name, batches[b], median(pt, reps), o, pe,
                   o / pe);
            fflush(stdout);
        }
    }
    printf("\nasync scheduling, 16 JSON-object-constrained requests, batch 16:\n\n");
    printf("| model | sync wall s | async wall s | sync/async | host s | host overlapped s | forward s |\n");
    printf("|---|---:|---:|---:|---:|---:|---:|\n");
    for (int mi = 0; mi < 2; mi++) {
        double ws[16], wa[16], h[16], ov[16], fw[16];
        for (int r = 0; r < reps; r++) {
            result s, a;
            if (run_once(&models[mi], 16, 16, 0, 1, &s)) return 1;
            if (run_once(&models[mi], 16, 16, 1, 1, &a)) return 1;
            ws[r] = s.wall, wa[r] = a.wall, h[r] = a.host, ov[r] = a.overlap, fw[r] = a.fwd;
        }
        double mws = median(ws, reps), mwa = median(wa, reps);
        printf("| %s | %.3f | %.3f | %.3f | %.3f | %.3f | %.3f |\n", models[mi].name, mws, mwa, mws / mwa,
               median(h, reps), median(ov, reps), median(fw, reps));
        fflush(stdout);
    }
    remove(big);
    return 0;
}
