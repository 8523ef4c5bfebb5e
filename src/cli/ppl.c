/* deepinfer ppl: perplexity of a text under the model, from the engine's
 * prompt logprobs (a prefill-only request: max_tokens 0). The text is
 * tokenized as plain text and cut into consecutive windows of at most the
 * model length (--ctx); in each window every token but the first is scored
 * given the ones before it in the window, so
 *     ppl = exp(-(sum of those logprobs) / (number of scored tokens)). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"

#define CMD "ppl"

static void usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer ppl --file TEXT [--ctx N] [--json] [options]\n"
            "  --file FILE    text to score ('-' = standard input)\n"
            "  --ctx N        window length in tokens (default: the model length - 1)\n"
            "  --json         print {\"ppl\", \"nll\", \"tokens\", \"windows\", \"seconds\"}\n"
            "%s",
            cli_engine_args_usage);
}

int cli_ppl(int argc, char **argv) {
    const char *file = NULL;
    int64_t ctx = 0;
    int as_json = 0;
    cli_engine_args ea = {0};
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int r = cli_engine_arg(CMD, argc, argv, &i, &ea);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        } else if (i + 1 < argc && (!strcmp(f, "--file") || !strcmp(f, "-f"))) file = argv[++i];
        else if (i + 1 < argc && (!strcmp(f, "--ctx") || !strcmp(f, "-c"))) {
            if (cli_parse_i64(CMD, f, argv[++i], 2, INT64_C(1) << 30, &ctx)) return 2;
        } else if (!strcmp(f, "--json")) as_json = 1;
        else {
            fprintf(stderr, "deepinfer " CMD ": unexpected argument '%s'\n", f);
            usage(stderr);
            return 2;
        }
    }
    if (!file) {
        fprintf(stderr, "deepinfer " CMD ": --file is required\n");
        return 2;
    }
    size_t len;
    char *text = cli_read_file(CMD, file, &len);
    if (!text) return 1;
    int rc = 1;
    int32_t *ids = NULL;
    size_t n_ids = 0;
    uint64_t *req = NULL;
    di_engine *e = cli_engine_open(CMD, &ea);
    if (!e) goto out;
    const di_tokenizer *tok = di_engine_tokenizer(e);
    if (!tok) {
        fprintf(stderr, "deepinfer " CMD ": the model has no tokenizer.json (give --tokenizer FILE)\n");
        goto out;
    }
    if (di_tokenizer_encode(tok, text, len, 0, &ids, &n_ids)) {
        fprintf(stderr, "deepinfer " CMD ": %s: %s\n", file, di_last_error());
        goto out;
    }
    if (n_ids < 2) {
        fprintf(stderr, "deepinfer " CMD ": %s: %zu token(s): at least 2 are needed to score one\n", file, n_ids);
        goto out;
    }
    di_engine_info info;
    di_engine_get_info(e, &info);
    /* the engine wants room for one generated token after a prompt */
    int64_t max_win = info.max_model_len - 1;
    if (ctx > max_win) {
        fprintf(stderr, "deepinfer " CMD ": --ctx %lld exceeds the model length - 1 (%lld)\n", (long long)ctx,
                (long long)max_win);
        goto out;
    }
    size_t win = (size_t)(ctx ? ctx : max_win);
    size_t n_win = (n_ids + win - 1) / win;
    /* a last window of one token has nothing to score: fold it into the previous one's count */
    if (n_win > 1 && n_ids - (n_win - 1) * win < 2) n_win--;
    req = calloc(n_win, sizeof *req);
    if (!req) goto out;
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.max_tokens = 0;
    p.prompt_logprobs = 0;
    for (size_t w = 0; w < n_win; w++) {
        size_t b = w * win, n = w + 1 == n_win ? n_ids - b : win;
        if (n > win) n = win; /* the dropped one-token tail */
        if (di_engine_submit_tokens(e, ids + b, n, &p, &req[w])) {
            fprintf(stderr, "deepinfer " CMD ": window %zu: %s\n", w, di_last_error());
            goto out;
        }
    }
    double t0 = cli_now_s();
    if (di_engine_run(e, NULL, NULL)) {
        fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
        goto out;
    }
    double secs = cli_now_s() - t0, nll = 0;
    size_t scored = 0;
    for (size_t w = 0; w < n_win; w++) {
        di_request_output ro;
        if (di_engine_get_output(e, req[w], &ro) || !ro.prompt_logprobs) {
            fprintf(stderr, "deepinfer " CMD ": window %zu: no prompt logprobs (%s)\n", w,
                    ro.error ? ro.error : di_last_error());
            goto out;
        }
        for (size_t i = 1; i < ro.n_prompt; i++) nll -= ro.prompt_logprobs[i];
        scored += ro.n_prompt - 1;
    }
    double ppl = exp(nll / (double)scored);
    if (as_json)
        printf("{\"ppl\": %.17g, \"nll\": %.17g, \"tokens\": %zu, \"scored\": %zu, \"windows\": %zu, \"ctx\": %zu, "
               "\"seconds\": %.6f}\n", ppl, nll, n_ids, scored, n_win, win, secs);
    else
        printf("perplexity %.4f over %zu scored tokens (%zu tokens, %zu window(s) of at most %zu), "
               "mean NLL %.4f nats/token\n", ppl, scored, n_ids, n_win, win, nll / (double)scored);
    fprintf(stderr, "[%zu tokens in %.3f s: %.1f tokens/s]\n", n_ids, secs, secs > 0 ? (double)n_ids / secs : 0.0);
    rc = 0;
out:
    free(req);
    di_free(ids);
    di_engine_close(e);
    free(text);
    return rc;
}
