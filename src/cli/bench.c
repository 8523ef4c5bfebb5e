/* deepinfer bench: llama-bench-style throughput of the engine
 * (ecosystem.md §4.4). Tests:
 *   ppP      B sequences of P prompt tokens each, prefilled (one token
 *            sampled); t/s = B*P / time
 *   tgN[@dD] B sequences generating N tokens each after a context of D
 *            tokens (1 when D = 0); t/s counts the tokens decoded after
 *            every sequence finished its prefill, over the time since then
 * for every batch size B of -b, each run once untimed first (the warm-up:
 * a first run pays one-time costs — weights uploaded to a device on first
 * use, pages of mapped weights touched, buffers grown — that are not the
 * engine's speed) and then -r times: mean ± standard deviation. Times are
 * wall-clock through the engine (scheduling and sampling included, which
 * llama-bench leaves out). Output: a markdown
 * table or JSON, and optionally an SVG plot of throughput against batch
 * size and against context length. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"

#define CMD "bench"
#define MAX_LIST 32

static void usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer bench [-p LIST] [-n LIST] [-b LIST] [-d LIST] [-r N] [-o md|json] [--svg FILE]\n"
            "  -p, --n-prompt LIST   prompt lengths of the pp tests (default 512; 0 = none)\n"
            "  -n, --n-gen LIST      generated tokens of the tg tests (default 128; 0 = none)\n"
            "  -b, --batch LIST      concurrent sequences (default 1)\n"
            "  -d, --n-depth LIST    context before the tg tests (default 0)\n"
            "  -r, --repetitions N   runs of each test (default 3)\n"
            "  --no-warmup           leave out the untimed first run of each test\n"
            "  -o, --output md|json  table format (default md)\n"
            "  --svg FILE            plot: t/s against batch size and against context length\n"
            "  --temp T, --top-p P, --top-k K\n"
            "                        sampling of every request (default greedy: --temp 0); seeded\n"
            "  --repetition-penalty R, --presence-penalty P, --frequency-penalty F\n"
            "                        penalties of every request (default none)\n"
            "  --logprobs K          top logprobs of every generated token (default none)\n"
            "  LIST: comma-separated values, or FIRST-LAST[*MULT] (e.g. 1-64*2)\n"
            "%s",
            cli_engine_args_usage);
}

typedef struct bench_list {
    int64_t v[MAX_LIST];
    int n;
} bench_list;

/* "a,b,c" or "first-last*mult" (llama-bench's range form). */
static int parse_list(const char *flag, const char *s, int64_t lo, bench_list *l) {
    l->n = 0;
    long long a, b, m = 2;
    char c;
    if (sscanf(s, "%lld-%lld*%lld%c", &a, &b, &m, &c) == 3 || sscanf(s, "%lld-%lld%c", &a, &b, &c) == 2) {
        if (a < lo || b < a || m < 2) goto bad;
        for (long long v = a; v <= b && l->n < MAX_LIST; v *= m) {
            l->v[l->n++] = v;
            if (v == 0) break;
        }
        return 0;
    }
    char *dup = strdup(s), *save = NULL;
    if (!dup) {
        fprintf(stderr, "deepinfer " CMD ": out of memory\n");
        return -1;
    }
    for (char *t = strtok_r(dup, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
        int64_t v;
        if (l->n == MAX_LIST || cli_parse_i64(CMD, flag, t, lo, INT64_C(1) << 24, &v)) {
            free(dup);
            goto bad;
        }
        l->v[l->n++] = v;
    }
    free(dup);
    if (l->n) return 0;
bad:
    fprintf(stderr, "deepinfer " CMD ": %s: expected a list of integers >= %lld (a,b,c or first-last*mult, at most "
                    "%d values), got '%s'\n", flag, (long long)lo, MAX_LIST, s);
    return -1;
}

typedef struct bench_row {
    char test[48];
    int64_t batch, n_prompt, n_gen, depth;
    double samples[64];
    int n_samples;
    double mean, sd;
    double warmup; /* the warm-up run's t/s; < 0 when left out */
    double fwd_ms, host_ms; /* tg: the last run's decode steps, ms a step in the backend's
                               passes and in host work (di_engine_stats); < 0 for pp */
    int64_t made;           /* tg: the tokens the last run's window counted; < 0 for pp */
} bench_row;

static uint64_t rng_next(uint64_t *s) {
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return *s >> 33;
}

/* The requests' sampling (--temp, --top-p, --top-k; greedy by default). */
static double g_temp = 0.0, g_top_p = 1.0, g_rep = 1.0, g_pres = 0.0, g_freq = 0.0;
static int64_t g_top_k = 0;
static int64_t g_logprobs = -1; /* -1: none */

/* Submits b requests of n_prompt pseudo-random ids; ids into req. */
static int submit(di_engine *e, int64_t vocab, int32_t eos, int64_t b, int64_t n_prompt, int64_t n_gen,
                  uint64_t *req, uint64_t *rng) {
    int32_t *ids = malloc((size_t)n_prompt * sizeof *ids);
    if (!ids) return -1;
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = g_temp;
    p.top_p = g_top_p;
    p.top_k = (int32_t)g_top_k;
    p.repetition_penalty = g_rep;
    p.presence_penalty = g_pres;
    p.frequency_penalty = g_freq;
    p.logprobs = (int32_t)g_logprobs;
    p.has_seq_seed = 1;
    p.ignore_eos = 1;
    p.max_tokens = n_gen;
    for (int64_t k = 0; k < b; k++) {
        for (int64_t i = 0; i < n_prompt; i++) {
            int32_t t = (int32_t)(rng_next(rng) % (uint64_t)vocab);
            ids[i] = t == eos ? (t + 1) % (int32_t)vocab : t;
        }
        p.seq_seed = rng_next(rng);
        if (di_engine_submit_tokens(e, ids, (size_t)n_prompt, &p, &req[k])) {
            fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
            free(ids);
            return -1;
        }
    }
    free(ids);
    return 0;
}

/* Request id's completion into c; 1 (and the error printed) when it failed */
static int get_done(di_engine *e, uint64_t id, di_completion *c) {
    di_engine_get_completion(e, id, 0, c);
    if (c->finish_reason != DI_FINISH_ERROR) return 0;
    fprintf(stderr, "deepinfer " CMD ": a sequence failed: %s\n", c->error ? c->error : "(no message)");
    return 1;
}

/* One run; returns tokens/s, or -1 on failure. A tg run measures the whole
 * batch decoding: every sequence gets room for n_gen tokens past the step
 * in which the last prefill is done (a long prefill of many sequences lets
 * the first ones decode meanwhile: the steps it can take, capped by the
 * model length, are added to their budget), the timed window runs from
 * that step until each sequence has made n_gen more, and the sequences are
 * then ended. Before, the window ran until the sequences finished their
 * n_gen tokens, so a batch whose prefill outlasted them was timed
 * shrinking. */
static double run_once(di_engine *e, const di_engine_info *info, bench_row *r, uint64_t *rng) {
    uint64_t *req = calloc((size_t)r->batch, sizeof *req);
    int64_t *c0 = calloc((size_t)r->batch, sizeof *c0); /* tg: each sequence's tokens when the window opens */
    double tps = -1;
    if (!req || !c0) goto out;
    int is_pp = r->n_gen == 0;
    int64_t n_prompt = is_pp ? r->n_prompt : (r->depth > 0 ? r->depth : 1);
    int64_t n_gen = is_pp ? 1 : r->n_gen, room = n_gen;
    if (!is_pp) {
        const int64_t held = r->batch < info->max_batch ? r->batch : info->max_batch;
        const int64_t per = info->max_tokens_per_step - held > 0 ? info->max_tokens_per_step - held : 1;
        const int64_t slack = (r->batch * n_prompt + per - 1) / per + 8, cap = info->max_model_len - n_prompt - n_gen;
        room = n_gen + (slack < cap ? slack : cap > 0 ? cap : 0);
    }
    if (submit(e, info->vocab_size, info->eos_id, r->batch, n_prompt, room, req, rng)) goto out;
    double t0 = cli_now_s(), t1 = 0, t2 = 0;
    uint64_t made = 0;
    di_engine_stats s1 = {0}, s2 = {0};
    size_t active = 1;
    while (active) {
        if (di_engine_step(e, &active)) {
            fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
            goto out;
        }
        if (is_pp || t2 > 0) continue;
        int all = 1;
        uint64_t got = 0;
        for (int64_t k = 0; k < r->batch; k++) {
            di_completion c;
            if (get_done(e, req[k], &c)) goto out;
            const int64_t n = (int64_t)c.n_tokens;
            if (t1 == 0) {
                all &= n >= 1;
                c0[k] = n;
            } else {
                const int64_t d = n - c0[k] < n_gen ? n - c0[k] : n_gen;
                all &= d >= n_gen || c.finish_reason != DI_FINISH_NONE;
                got += (uint64_t)d;
            }
        }
        if (!all) continue;
        if (t1 == 0) { /* every prefill done: the window opens */
            t1 = cli_now_s();
            di_engine_get_stats(e, &s1);
            continue;
        }
        t2 = cli_now_s(); /* n_gen more tokens each: the window closes, the rest is ended */
        made = got;
        di_engine_get_stats(e, &s2);
        for (int64_t k = 0; k < r->batch; k++) di_engine_abort(e, req[k]);
    }
    if (is_pp) {
        const double t = cli_now_s() - t0;
        for (int64_t k = 0; k < r->batch; k++) { /* a failed sequence fails the run */
            di_completion c;
            if (get_done(e, req[k], &c)) goto out;
        }
        tps = (double)(r->batch * r->n_prompt) / t;
    } else {
        tps = t2 > t1 && t1 > 0 ? (double)made / (t2 - t1) : 0;
    }
    r->made = is_pp ? -1 : (int64_t)made;
    r->fwd_ms = r->host_ms = -1;
    if (!is_pp && s2.steps > s1.steps) {
        r->fwd_ms = 1e3 * (s2.forward_s - s1.forward_s) / (double)(s2.steps - s1.steps);
        r->host_ms = 1e3 * (s2.host_s - s1.host_s) / (double)(s2.steps - s1.steps);
    }
out:
    for (int64_t k = 0; req && k < r->batch; k++)
        if (req[k]) di_engine_release(e, req[k]);
    free(req);
    free(c0);
    return tps;
}

static void stats(bench_row *r) {
    double s = 0, s2 = 0;
    for (int i = 0; i < r->n_samples; i++) s += r->samples[i];
    r->mean = s / r->n_samples;
    for (int i = 0; i < r->n_samples; i++) s2 += (r->samples[i] - r->mean) * (r->samples[i] - r->mean);
    r->sd = r->n_samples > 1 ? sqrt(s2 / (r->n_samples - 1)) : 0;
}

static void print_md(const bench_row *rows, int n, const char *model, int threads) {
    printf("| model | threads | n_batch | test | t/s |\n| --- | ---: | ---: | ---: | ---: |\n");
    for (int i = 0; i < n; i++)
        printf("| %s | %d | %lld | %s | %.2f ± %.2f |\n", model, threads, (long long)rows[i].batch, rows[i].test,
               rows[i].mean, rows[i].sd);
}

static void json_str(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        if (*s == '"' || *s == '\\') fprintf(f, "\\%c", *s);
        else if ((unsigned char)*s < 0x20) fprintf(f, "\\u%04x", *s);
        else fputc(*s, f);
    }
    fputc('"', f);
}

static void print_json(const bench_row *rows, int n, const char *model, int threads) {
    printf("[\n");
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        printf("  {\"model\": ");
        json_str(stdout, model);
        printf(", \"n_threads\": %d, \"n_batch\": %lld, \"n_prompt\": %lld, \"n_gen\": %lld, \"n_depth\": %lld, "
               "\"test\": \"%s\", \"avg_ts\": %.6f, \"stddev_ts\": %.6f, \"samples_ts\": [",
               threads, (long long)r->batch, (long long)r->n_prompt, (long long)r->n_gen, (long long)r->depth,
               r->test, r->mean, r->sd);
        for (int k = 0; k < r->n_samples; k++) printf(k ? ", %.6f" : "%.6f", r->samples[k]);
        printf("]");
        if (r->warmup >= 0) printf(", \"warmup_ts\": %.6f", r->warmup);
        if (r->fwd_ms >= 0) printf(", \"forward_ms_step\": %.4f, \"host_ms_step\": %.4f", r->fwd_ms, r->host_ms);
        if (r->made >= 0) printf(", \"tokens_timed\": %lld", (long long)r->made);
        printf(", \"temperature\": %.17g, \"top_p\": %.17g, \"top_k\": %lld, \"repetition_penalty\": %.17g, "
               "\"presence_penalty\": %.17g, \"frequency_penalty\": %.17g, \"logprobs\": %lld}%s\n",
               g_temp, g_top_p, (long long)g_top_k, g_rep, g_pres, g_freq, (long long)g_logprobs, i + 1 < n ? "," : "");
    }
    printf("]\n");
}

/* ------------------------------------------------------------ SVG plot */

typedef struct svg_series {
    char name[64];
    double x[MAX_LIST * MAX_LIST], y[MAX_LIST * MAX_LIST];
    int n;
} svg_series;

static const char *const palette[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2",
                                      "#17becf"};

/* One panel at (ox, oy) of size w x h: log2 x axis, linear y from 0. */
static void svg_panel(FILE *f, double ox, double oy, double w, double h, const char *title, const char *xlabel,
                      const svg_series *s, int ns) {
    double xmin = INFINITY, xmax = -INFINITY, ymax = 0;
    for (int i = 0; i < ns; i++)
        for (int k = 0; k < s[i].n; k++) {
            double lx = log2(s[i].x[k] > 0 ? s[i].x[k] : 1);
            xmin = fmin(xmin, lx), xmax = fmax(xmax, lx), ymax = fmax(ymax, s[i].y[k]);
        }
    if (!ns || !isfinite(xmin)) xmin = 0, xmax = 1;
    if (xmax - xmin < 1e-9) xmin -= 0.5, xmax += 0.5;
    if (ymax <= 0) ymax = 1;
    ymax *= 1.1;
    double L = ox + 60, R = ox + w - 10, T = oy + 30, B = oy + h - 45;
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"14\" text-anchor=\"middle\">%s</text>\n", (L + R) / 2,
            oy + 18, title);
    fprintf(f, "<rect x=\"%.1f\" y=\"%.1f\" width=\"%.1f\" height=\"%.1f\" fill=\"none\" stroke=\"#444\"/>\n", L, T,
            R - L, B - T);
    for (int k = 0; k <= 4; k++) { /* y grid */
        double v = ymax * k / 4, y = B - (B - T) * k / 4;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.1f\" x2=\"%.1f\" y2=\"%.1f\" stroke=\"#ddd\"/>\n", L, y, R, y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"end\">%.0f</text>\n", L - 4, y + 3, v);
    }
    for (double lx = ceil(xmin); lx <= xmax + 1e-9; lx += 1) { /* x ticks at powers of two */
        double x = L + (R - L) * (lx - xmin) / (xmax - xmin);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" text-anchor=\"middle\">%.0f</text>\n", x, B + 14,
                exp2(lx));
    }
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\">%s</text>\n", (L + R) / 2,
            B + 30, xlabel);
    fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"11\" text-anchor=\"middle\" transform=\"rotate(-90 %.1f "
               "%.1f)\">tokens/s</text>\n", ox + 14, (T + B) / 2, ox + 14, (T + B) / 2);
    for (int i = 0; i < ns; i++) {
        const char *col = palette[i % (int)(sizeof palette / sizeof *palette)];
        fprintf(f, "<polyline class=\"series\" fill=\"none\" stroke=\"%s\" stroke-width=\"2\" points=\"", col);
        for (int k = 0; k < s[i].n; k++)
            fprintf(f, "%s%.1f,%.1f", k ? " " : "",
                    L + (R - L) * (log2(s[i].x[k] > 0 ? s[i].x[k] : 1) - xmin) / (xmax - xmin),
                    B - (B - T) * s[i].y[k] / ymax);
        fprintf(f, "\"/>\n");
        for (int k = 0; k < s[i].n; k++)
            fprintf(f, "<circle cx=\"%.1f\" cy=\"%.1f\" r=\"3\" fill=\"%s\"/>\n",
                    L + (R - L) * (log2(s[i].x[k] > 0 ? s[i].x[k] : 1) - xmin) / (xmax - xmin),
                    B - (B - T) * s[i].y[k] / ymax, col);
        fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" font-size=\"10\" fill=\"%s\">%s</text>\n", L + 6, T + 12 + 12 * i, col,
                s[i].name);
    }
}

static svg_series *series_for(svg_series *s, int *ns, int cap, const char *name) {
    for (int i = 0; i < *ns; i++)
        if (!strcmp(s[i].name, name)) return &s[i];
    if (*ns == cap) return NULL;
    svg_series *n = &s[(*ns)++];
    memset(n, 0, sizeof *n);
    snprintf(n->name, sizeof n->name, "%s", name);
    return n;
}

static int write_svg(const char *path, const bench_row *rows, int n, const char *model) {
    enum { CAP = 16 };
    svg_series *by_batch = calloc(CAP, sizeof *by_batch), *by_ctx = calloc(CAP, sizeof *by_ctx);
    FILE *f = by_batch && by_ctx ? fopen(path, "w") : NULL;
    if (!f) {
        fprintf(stderr, "deepinfer " CMD ": %s: cannot write\n", path);
        free(by_batch);
        free(by_ctx);
        return -1;
    }
    int nb = 0, nc = 0;
    for (int i = 0; i < n; i++) {
        const bench_row *r = &rows[i];
        char name[64];
        svg_series *s = series_for(by_batch, &nb, CAP, r->test); /* x: batch size */
        if (s) s->x[s->n] = (double)r->batch, s->y[s->n++] = r->mean;
        /* x: context length (prompt length for pp, depth for tg) */
        snprintf(name, sizeof name, "%s B=%lld", r->n_gen ? "tg" : "pp", (long long)r->batch);
        s = series_for(by_ctx, &nc, CAP, name);
        if (s) s->x[s->n] = (double)(r->n_gen ? (r->depth > 0 ? r->depth : 1) : r->n_prompt), s->y[s->n++] = r->mean;
    }
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"960\" height=\"380\" "
               "font-family=\"sans-serif\">\n<rect width=\"960\" height=\"380\" fill=\"white\"/>\n");
    fprintf(f, "<text x=\"480\" y=\"16\" font-size=\"12\" text-anchor=\"middle\" fill=\"#555\">deepinfer bench: ");
    for (const char *c = model; *c; c++) (*c == '<' || *c == '&') ? fputc('_', f) : fputc(*c, f);
    fprintf(f, "</text>\n");
    svg_panel(f, 0, 20, 480, 360, "throughput vs batch size", "batch size (sequences)", by_batch, nb);
    svg_panel(f, 480, 20, 480, 360, "throughput vs context length", "context length (tokens)", by_ctx, nc);
    fprintf(f, "</svg>\n");
    int bad = ferror(f);
    bad |= fclose(f) != 0;
    free(by_batch);
    free(by_ctx);
    if (bad) fprintf(stderr, "deepinfer " CMD ": %s: write error\n", path);
    return bad ? -1 : 0;
}

int cli_bench(int argc, char **argv) {
    bench_list pl = {{512}, 1}, nl = {{128}, 1}, bl = {{1}, 1}, dl = {{0}, 1};
    int64_t reps = 3;
    int as_json = 0, warmup = 1;
    const char *svg = NULL;
    cli_engine_args ea = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        int r = cli_engine_arg(CMD, argc, argv, &i, &ea);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        } else if (has && (!strcmp(f, "-p") || !strcmp(f, "--n-prompt"))) {
            if (parse_list(f, argv[++i], 0, &pl)) return 2;
        } else if (has && (!strcmp(f, "-n") || !strcmp(f, "--n-gen"))) {
            if (parse_list(f, argv[++i], 0, &nl)) return 2;
        } else if (has && (!strcmp(f, "-b") || !strcmp(f, "--batch"))) {
            if (parse_list(f, argv[++i], 1, &bl)) return 2;
        } else if (has && (!strcmp(f, "-d") || !strcmp(f, "--n-depth"))) {
            if (parse_list(f, argv[++i], 0, &dl)) return 2;
        } else if (has && (!strcmp(f, "-r") || !strcmp(f, "--repetitions"))) {
            if (cli_parse_i64(CMD, f, argv[++i], 1, 64, &reps)) return 2;
        } else if (has && (!strcmp(f, "-o") || !strcmp(f, "--output"))) {
            const char *o = argv[++i];
            if (!strcmp(o, "json")) as_json = 1;
            else if (!strcmp(o, "md")) as_json = 0;
            else {
                fprintf(stderr, "deepinfer " CMD ": -o: expected md or json, got '%s'\n", o);
                return 2;
            }
        } else if (has && !strcmp(f, "--svg")) {
            svg = argv[++i];
        } else if (has && !strcmp(f, "--temp")) {
            if (cli_parse_f64(CMD, f, argv[++i], 0.0, 100.0, &g_temp)) return 2;
        } else if (has && !strcmp(f, "--top-p")) {
            if (cli_parse_f64(CMD, f, argv[++i], 1e-9, 1.0, &g_top_p)) return 2;
        } else if (has && !strcmp(f, "--top-k")) {
            if (cli_parse_i64(CMD, f, argv[++i], 0, INT32_MAX, &g_top_k)) return 2;
        } else if (has && !strcmp(f, "--repetition-penalty")) {
            if (cli_parse_f64(CMD, f, argv[++i], 1e-9, 2.0, &g_rep)) return 2;
        } else if (has && !strcmp(f, "--presence-penalty")) {
            if (cli_parse_f64(CMD, f, argv[++i], -2.0, 2.0, &g_pres)) return 2;
        } else if (has && !strcmp(f, "--frequency-penalty")) {
            if (cli_parse_f64(CMD, f, argv[++i], -2.0, 2.0, &g_freq)) return 2;
        } else if (has && !strcmp(f, "--logprobs")) {
            if (cli_parse_i64(CMD, f, argv[++i], 0, 20, &g_logprobs)) return 2; /* deepinfer.h: k <= 20 */
        }
        else if (!strcmp(f, "--no-warmup")) warmup = 0;
        else {
            fprintf(stderr, "deepinfer " CMD ": unexpected argument '%s'\n", f);
            usage(stderr);
            return 2;
        }
    }
    bench_row *rows = calloc((size_t)MAX_LIST * MAX_LIST * 2, sizeof *rows);
    if (!rows) return 1;
    int n_rows = 0;
    for (int b = 0; b < bl.n; b++) {
        for (int k = 0; k < pl.n; k++)
            if (pl.v[k] > 0) {
                bench_row *r = &rows[n_rows++];
                r->batch = bl.v[b], r->n_prompt = pl.v[k];
                snprintf(r->test, sizeof r->test, "pp%lld", (long long)pl.v[k]);
            }
        for (int k = 0; k < nl.n; k++)
            for (int d = 0; d < dl.n; d++)
                if (nl.v[k] > 0) {
                    bench_row *r = &rows[n_rows++];
                    r->batch = bl.v[b], r->n_gen = nl.v[k], r->depth = dl.v[d];
                    if (dl.v[d]) snprintf(r->test, sizeof r->test, "tg%lld @ d%lld", (long long)nl.v[k],
                                          (long long)dl.v[d]);
                    else snprintf(r->test, sizeof r->test, "tg%lld", (long long)nl.v[k]);
                }
    }
    if (n_rows == 0) { /* every -p and -n value 0: nothing would be measured */
        fprintf(stderr, "deepinfer " CMD ": nothing to measure: every -p and -n value is 0\n");
        free(rows);
        return 2;
    }
    int rc = 1;
    di_engine *e = cli_engine_open(CMD, &ea);
    if (!e) goto out;
    di_engine_info info;
    di_engine_get_info(e, &info);
    const char *model = strrchr(info.model_path, '/');
    model = model && model[1] ? model + 1 : info.model_path;
    uint64_t rng = 0x5eed;
    for (int i = 0; i < n_rows; i++) {
        bench_row *r = &rows[i];
        if (r->batch > 4096 || (r->n_gen ? (r->depth > 0 ? r->depth : 1) + r->n_gen : r->n_prompt + 1) >
                                   info.max_model_len) {
            fprintf(stderr, "deepinfer " CMD ": %s at batch %lld does not fit the model length %lld\n", r->test,
                    (long long)r->batch, (long long)info.max_model_len);
            goto out;
        }
        r->warmup = -1;
        if (warmup && (r->warmup = run_once(e, &info, r, &rng)) < 0) goto out;
        for (int k = 0; k < reps; k++) {
            double t = run_once(e, &info, r, &rng);
            if (t < 0) goto out;
            r->samples[r->n_samples++] = t;
        }
        stats(r);
        char split[96] = "";
        if (r->fwd_ms >= 0)
            snprintf(split, sizeof split, "; a decode step %.2f ms in the forward, %.2f ms of host work", r->fwd_ms,
                     r->host_ms);
        if (r->warmup >= 0)
            fprintf(stderr, "  %s, batch %lld: %.2f t/s (warm-up run %.2f t/s)%s\n", r->test, (long long)r->batch,
                    r->mean, r->warmup, split);
        else fprintf(stderr, "  %s, batch %lld: %.2f t/s%s\n", r->test, (long long)r->batch, r->mean, split);
    }
    if (as_json) print_json(rows, n_rows, model, info.n_threads);
    else print_md(rows, n_rows, model, info.n_threads);
    rc = svg && write_svg(svg, rows, n_rows, model) ? 1 : 0;
out:
    di_engine_close(e);
    free(rows);
    return rc;
}
