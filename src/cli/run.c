/* `deepinfer run [--model DIR]`: the main job. Opens the embedded default
 * tiny model (generating it into the cache folder on first use) or DIR,
 * prints its summary and its memory plan, then generates a continuation of
 * a few chat prompts with the engine (batched) and prints tokens/s. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"
#include "deepinfer.h"
#include "model/default_model.h"

static void run_usage(FILE *out) {
    fprintf(out, "usage: deepinfer run [--model DIR] [--max-tokens N]\n"
                 "  without --model: the embedded default tiny model, generated on first use into\n"
                 "  $DEEPINFER_CACHE_DIR, else $XDG_CACHE_HOME/deepinfer, else ~/.cache/deepinfer\n");
}

/* A few chat prompts through the engine, in one batch. */
static int generate(const char *model, long max_tokens, int random_weights) {
    static const char *prompts[] = {
        "What is the capital of France?",
        "Write a haiku about the sea.",
        "Explain what a mixture-of-experts layer does, in one sentence.",
        "List three prime numbers.",
    };
    enum { N = sizeof prompts / sizeof *prompts };
    di_engine_options o;
    di_engine_options_default(&o);
    o.model = model;
    di_engine *e;
    double t0 = cli_now_s();
    if (di_engine_open(&o, &e)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        return 1;
    }
    di_engine_info info;
    di_engine_get_info(e, &info);
    printf("\ngeneration (engine opened in %.3f s on %s: up to %d sequences and %lld tokens a step; %ld tokens per "
           "prompt, temperature 0.7, seed 1)\n",
           cli_now_s() - t0, info.accelerator, info.max_batch, (long long)info.max_tokens_per_step, max_tokens);
    if (info.weights_in_memory)
        printf("(the checkpoint's weights copied into memory, %.1f MB: docs/cli.md, DI_WEIGHTS_IN_MEMORY)\n",
               (double)info.weights_in_memory / 1e6);
    if (random_weights)
        printf("(the default model's weights are random: the text is noise, the speed is real)\n");
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.temperature = 0.7;
    p.max_tokens = max_tokens;
    p.has_seq_seed = 1;
    p.seq_seed = 1;
    di_chat_options co;
    di_chat_options_default(&co);
    co.thinking = 0;
    uint64_t id[N];
    for (int i = 0; i < N; i++) {
        char json[512];
        snprintf(json, sizeof json, "[{\"role\": \"user\", \"content\": \"%s\"}]", prompts[i]);
        if (di_engine_submit_chat(e, json, strlen(json), &co, &p, &id[i])) {
            fprintf(stderr, "deepinfer run: prompt %d: %s\n", i, di_last_error());
            di_engine_close(e);
            return 1;
        }
    }
    t0 = cli_now_s();
    if (di_engine_run(e, NULL, NULL)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        di_engine_close(e);
        return 1;
    }
    double secs = cli_now_s() - t0;
    for (int i = 0; i < N; i++) {
        di_completion c;
        if (di_engine_get_completion(e, id[i], 0, &c)) continue;
        printf("\n> %s\n%s\n[%zu tokens, %s]\n", prompts[i], c.content ? c.content : c.text, c.n_tokens,
               di_finish_reason_name(c.finish_reason));
    }
    di_engine_stats st;
    di_engine_get_stats(e, &st);
    printf("\n%d prompts: %llu prompt tokens, %llu generated tokens in %.3f s: %.1f tokens/s generated, "
           "%.1f tokens/s in all (%llu steps)\n",
           N, (unsigned long long)st.prompt_tokens, (unsigned long long)st.output_tokens, secs,
           secs > 0 ? (double)st.output_tokens / secs : 0.0,
           secs > 0 ? (double)(st.output_tokens + st.prompt_tokens) / secs : 0.0, (unsigned long long)st.steps);
    di_engine_close(e);
    return 0;
}

int cli_run(int argc, char **argv) {
    const char *model = NULL;
    int64_t max_tokens = 32;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            run_usage(stdout);
            return 0;
        } else if (!strcmp(argv[i], "--model") && i + 1 < argc) {
            model = argv[++i];
        } else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc) {
            if (cli_parse_i64("run", "--max-tokens", argv[++i], 1, 1 << 20, &max_tokens)) return 2;
        } else {
            fprintf(stderr, "deepinfer run: unexpected argument '%s'\n", argv[i]);
            run_usage(stderr);
            return 2;
        }
    }
    char dir[4096];
    int default_model = !model;
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
        double t0 = cli_now_s();
        int generated = 0;
        if (di_default_model_ensure(dir, sizeof dir, &generated, &err)) {
            fprintf(stderr, "deepinfer run: %s\n", err.msg);
            return 1;
        }
        if (generated) printf("  done in %.2f s\n", cli_now_s() - t0);
        model = dir;
    }
    di_model_options o;
    di_model_options_default(&o);
    di_model *m;
    double t0 = cli_now_s();
    if (di_model_open(model, &o, &m)) {
        fprintf(stderr, "deepinfer run: %s\n", di_last_error());
        return 1;
    }
    double t_open = cli_now_s() - t0;
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
    return generate(model, max_tokens, default_model);
}
