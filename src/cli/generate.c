/* deepinfer generate: one prompt (plain text or chat) through the engine,
 * with llama.cpp-style long flags for sampling (ecosystem.md §4.4). The
 * text goes to stdout; timing and tokens/s to stderr.
 *
 *   deepinfer generate -p TEXT [--chat] [-sys TEXT] [sampling flags]
 *   deepinfer generate --messages FILE [sampling flags]   (messages array or request body) */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"

#define CMD "generate"
#define MAX_STOP 16

static void usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer generate (-p TEXT | -f FILE | --messages FILE) [options]\n"
            "prompt:\n"
            "  -p, --prompt TEXT      prompt text (plain completion unless --chat)\n"
            "  -f, --file FILE        prompt text from a file ('-' = standard input)\n"
            "  --chat, -cnv           the prompt is a user message of a V4.1 chat\n"
            "  -sys, --system TEXT    system message (implies --chat)\n"
            "  --messages FILE        a chat: OpenAI messages array or Chat Completions body\n"
            "  --thinking, --no-thinking, --reasoning-effort E\n"
            "                         chat thinking mode (default: on) and effort (none, minimal, low,\n"
            "                         medium, high, xhigh, max)\n"
            "  --thinking-budget N    at most N reasoning tokens, then </think> is forced\n"
            "sampling (defaults as vLLM's SamplingParams):\n"
            "  -n, --n-predict N      tokens to generate (default 256; -1 = up to the model length)\n"
            "  --temp T               temperature (default 1.0; 0 = greedy)\n"
            "  --top-p P              nucleus (default 1.0)\n"
            "  --top-k K              (default 0 = off)\n"
            "  --min-p P              (default 0)\n"
            "  --repeat-penalty R     repetition penalty (default 1.0 = off)\n"
            "  --presence-penalty P, --frequency-penalty F   (default 0)\n"
            "  -s, --seed N           per-request seed (draws depend only on seed and position)\n"
            "  --stop STR             stop string (repeatable)\n"
            "  --ignore-eos           keep going after the end-of-sequence token\n"
            "structured output (at most one):\n"
            "  -j, --json-schema FILE JSON Schema the output must satisfy\n"
            "  --json-object          any JSON object\n"
            "  --regex RE             regex the whole output must match\n"
            "  --grammar-file FILE    GBNF grammar (start symbol root)\n"
            "  --grammar TEXT         GBNF grammar given inline\n"
            "output:\n"
            "  --show-reasoning       print a chat's reasoning (between <think> tags) before the answer\n"
            "  --json                 print the completion as one JSON object\n"
            "  --logprobs K           with --json: each generated token's logprob and the top K (K <= 20)\n"
            "%s",
            cli_engine_args_usage);
}

typedef struct gen_args {
    const char *prompt, *prompt_file, *messages_file, *system;
    const char *schema_file, *regex, *grammar_file, *grammar;
    int chat, thinking, json_object, show_reasoning, as_json;
    const char *effort;
    const char *stop[MAX_STOP];
    size_t n_stop;
} gen_args;

/* Sampling flags into p; 1 consumed, 0 not one of them, -1 error. */
static int sampling_arg(int argc, char **argv, int *i, di_sampling_params *p) {
    const char *f = argv[*i];
    if (*i + 1 >= argc) return 0;
    const char *v = argv[*i + 1];
    int64_t n;
    int r = 1;
    if (!strcmp(f, "-n") || !strcmp(f, "--n-predict") || !strcmp(f, "--max-tokens")) {
        r = cli_parse_i64(CMD, f, v, -1, INT64_C(1) << 40, &n) ? -1 : 1;
        if (r > 0 && n == 0) { /* 0 is the "up to the model length" mark below, not a count */
            fprintf(stderr, "deepinfer %s: %s: expected -1 (up to the model length) or at least 1, got '0'\n", CMD, f);
            r = -1;
        }
        if (r > 0) p->max_tokens = n == -1 ? 0 : n; /* 0: up to the model length, set once the engine is open */
    } else if (!strcmp(f, "--temp") || !strcmp(f, "--temperature")) {
        r = cli_parse_f64(CMD, f, v, 0, 100, &p->temperature) ? -1 : 1;
    } else if (!strcmp(f, "--top-p")) {
        r = cli_parse_f64(CMD, f, v, 1e-9, 1, &p->top_p) ? -1 : 1;
    } else if (!strcmp(f, "--top-k")) {
        r = cli_parse_i64(CMD, f, v, -1, INT32_MAX, &n) ? -1 : 1;
        p->top_k = (int32_t)n;
    } else if (!strcmp(f, "--min-p")) {
        r = cli_parse_f64(CMD, f, v, 0, 1, &p->min_p) ? -1 : 1;
    } else if (!strcmp(f, "--repeat-penalty")) {
        r = cli_parse_f64(CMD, f, v, 1e-9, 2, &p->repetition_penalty) ? -1 : 1;
    } else if (!strcmp(f, "--presence-penalty")) {
        r = cli_parse_f64(CMD, f, v, -2, 2, &p->presence_penalty) ? -1 : 1;
    } else if (!strcmp(f, "--frequency-penalty")) {
        r = cli_parse_f64(CMD, f, v, -2, 2, &p->frequency_penalty) ? -1 : 1;
    } else if (!strcmp(f, "-s") || !strcmp(f, "--seed")) {
        r = cli_parse_i64(CMD, f, v, 0, INT64_MAX, &n) ? -1 : 1;
        p->has_seq_seed = 1;
        p->seq_seed = (uint64_t)n;
    } else if (!strcmp(f, "--logprobs")) {
        r = cli_parse_i64(CMD, f, v, 0, 20, &n) ? -1 : 1;
        p->logprobs = (int32_t)n;
    } else if (!strcmp(f, "--thinking-budget")) {
        r = cli_parse_i64(CMD, f, v, 0, INT64_C(1) << 40, &p->thinking_token_budget) ? -1 : 1;
    } else {
        return 0;
    }
    ++*i;
    return r;
}

static int parse_args(int argc, char **argv, gen_args *g, di_sampling_params *p, cli_engine_args *ea) {
    for (int i = 1; i < argc; i++) {
        const char *f = argv[i];
        int has = i + 1 < argc;
        int r = cli_engine_arg(CMD, argc, argv, &i, ea);
        if (r < 0) return 2;
        if (r) continue;
        r = sampling_arg(argc, argv, &i, p);
        if (r < 0) return 2;
        if (r) continue;
        if (!strcmp(f, "-h") || !strcmp(f, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(f, "--chat") || !strcmp(f, "-cnv")) g->chat = 1;
        else if (!strcmp(f, "--thinking")) g->thinking = 1;
        else if (!strcmp(f, "--no-thinking")) g->thinking = 0;
        else if (!strcmp(f, "--ignore-eos")) p->ignore_eos = 1;
        else if (!strcmp(f, "--json-object")) g->json_object = 1;
        else if (!strcmp(f, "--show-reasoning")) g->show_reasoning = 1;
        else if (!strcmp(f, "--json")) g->as_json = 1;
        else if (has && (!strcmp(f, "-p") || !strcmp(f, "--prompt"))) g->prompt = argv[++i];
        else if (has && (!strcmp(f, "-f") || !strcmp(f, "--file"))) g->prompt_file = argv[++i];
        else if (has && !strcmp(f, "--messages")) g->messages_file = argv[++i];
        else if (has && (!strcmp(f, "-sys") || !strcmp(f, "--system"))) g->system = argv[++i], g->chat = 1;
        else if (has && !strcmp(f, "--reasoning-effort")) g->effort = argv[++i];
        else if (has && (!strcmp(f, "-j") || !strcmp(f, "--json-schema"))) g->schema_file = argv[++i];
        else if (has && !strcmp(f, "--regex")) g->regex = argv[++i];
        else if (has && !strcmp(f, "--grammar-file")) g->grammar_file = argv[++i];
        else if (has && !strcmp(f, "--grammar")) g->grammar = argv[++i];
        else if (has && !strcmp(f, "--stop")) {
            if (g->n_stop == MAX_STOP) {
                fprintf(stderr, "deepinfer " CMD ": at most %d --stop strings\n", MAX_STOP);
                return 2;
            }
            g->stop[g->n_stop++] = argv[++i];
        } else {
            fprintf(stderr, "deepinfer " CMD ": unexpected argument '%s'%s\n", f,
                    f[0] == '-' && !has ? " (missing value?)" : "");
            usage(stderr);
            return 2;
        }
    }
    int n_src = !!g->prompt + !!g->prompt_file + !!g->messages_file;
    if (n_src != 1) {
        fprintf(stderr, "deepinfer " CMD ": give exactly one of -p TEXT, -f FILE, --messages FILE\n");
        return 2;
    }
    int n_con = !!g->schema_file + !!g->regex + !!g->grammar_file + !!g->grammar + g->json_object;
    if (n_con > 1) {
        fprintf(stderr, "deepinfer " CMD ": only one structured-output constraint may be set "
                        "(--json-schema, --json-object, --regex, --grammar-file, --grammar)\n");
        return 2;
    }
    return -1; /* go on */
}

/* A chat body {"messages": [system?, user]} for -p / -f with --chat. */
static char *chat_body(const char *system, const char *user) {
    cJSON *msgs = cJSON_CreateArray();
    if (system) {
        cJSON *m = cJSON_CreateObject();
        cJSON_AddStringToObject(m, "role", "system");
        cJSON_AddStringToObject(m, "content", system);
        cJSON_AddItemToArray(msgs, m);
    }
    cJSON *m = cJSON_CreateObject();
    cJSON_AddStringToObject(m, "role", "user");
    cJSON_AddStringToObject(m, "content", user);
    cJSON_AddItemToArray(msgs, m);
    char *s = cJSON_PrintUnformatted(msgs);
    cJSON_Delete(msgs);
    return s;
}

static void print_json(const di_request_output *ro, const di_completion *c, double secs) {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "text", c->text);
    if (c->message_json) {
        cJSON *m = cJSON_Parse(c->message_json);
        if (m) cJSON_AddItemToObject(o, "message", m);
    }
    cJSON *ids = cJSON_CreateArray();
    for (size_t i = 0; i < c->n_tokens; i++) cJSON_AddItemToArray(ids, cJSON_CreateNumber(c->token_ids[i]));
    cJSON_AddItemToObject(o, "token_ids", ids);
    if (c->logprobs) { /* [{"id", "logprob", "top": [[id, logprob], ...]}] per generated token */
        cJSON *lps = cJSON_AddArrayToObject(o, "logprobs");
        for (size_t i = 0; i < c->n_tokens; i++) {
            cJSON *t = cJSON_CreateObject();
            cJSON_AddNumberToObject(t, "id", c->token_ids[i]);
            cJSON_AddNumberToObject(t, "logprob", c->logprobs[i]);
            cJSON *top = cJSON_AddArrayToObject(t, "top");
            for (int32_t k = 0; k < c->n_top; k++) {
                size_t at = i * (size_t)c->n_top + (size_t)k;
                cJSON *pair = cJSON_CreateArray();
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(c->top_ids[at]));
                cJSON_AddItemToArray(pair, cJSON_CreateNumber(c->top_logprobs[at]));
                cJSON_AddItemToArray(top, pair);
            }
            cJSON_AddItemToArray(lps, t);
        }
    }
    cJSON_AddStringToObject(o, "finish_reason", di_finish_reason_name(c->finish_reason));
    if (c->stop_str) cJSON_AddStringToObject(o, "stop_reason", c->stop_str);
    cJSON_AddNumberToObject(o, "prompt_tokens", (double)ro->n_prompt);
    cJSON_AddNumberToObject(o, "completion_tokens", (double)c->n_tokens);
    cJSON_AddNumberToObject(o, "seconds", secs);
    char *s = cJSON_PrintUnformatted(o);
    puts(s);
    free(s);
    cJSON_Delete(o);
}

int cli_generate(int argc, char **argv) {
    gen_args g = {.thinking = -1};
    cli_engine_args ea = {0};
    di_sampling_params p;
    di_sampling_params_default(&p);
    p.max_tokens = 256;
    int rc = parse_args(argc, argv, &g, &p, &ea);
    if (rc >= 0) return rc;
    p.stop = g.stop;
    p.n_stop = g.n_stop;

    char *prompt = NULL, *schema = NULL, *grammar = NULL, *body = NULL;
    size_t prompt_len = 0;
    di_engine *e = NULL;
    rc = 1;
    if (g.prompt_file && !(prompt = cli_read_file(CMD, g.prompt_file, &prompt_len))) goto out;
    if (g.prompt) {
        prompt = strdup(g.prompt);
        prompt_len = strlen(g.prompt);
    }
    if (g.messages_file && !(body = cli_read_file(CMD, g.messages_file, NULL))) goto out;
    if (g.schema_file && !(schema = cli_read_file(CMD, g.schema_file, NULL))) goto out;
    if (g.grammar_file && !(grammar = cli_read_file(CMD, g.grammar_file, NULL))) goto out;
    p.json_schema = schema;
    p.regex = g.regex;
    p.ebnf = grammar ? grammar : g.grammar;
    p.json_object = g.json_object;
    if (prompt && g.chat && !(body = chat_body(g.system, prompt))) goto out;

    if (!(e = cli_engine_open(CMD, &ea))) goto out;
    di_engine_info info;
    di_engine_get_info(e, &info);
    di_chat_options co;
    di_chat_options_default(&co);
    co.thinking = g.thinking;
    co.reasoning_effort = g.effort;
    /* the engine ends a sequence at max_model_len with a length finish */
    if (p.max_tokens == 0) p.max_tokens = info.max_model_len;
    uint64_t id;
    di_status st = body ? di_engine_submit_chat(e, body, strlen(body), &co, &p, &id)
                        : di_engine_submit_text(e, prompt, prompt_len, &p, &id);
    if (st) {
        fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
        goto out;
    }
    double t0 = cli_now_s();
    if (di_engine_run(e, NULL, NULL)) {
        fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
        goto out;
    }
    double secs = cli_now_s() - t0;
    di_request_output ro;
    di_completion c;
    if (di_engine_get_output(e, id, &ro) || di_engine_get_completion(e, id, 0, &c)) {
        fprintf(stderr, "deepinfer " CMD ": %s\n", di_last_error());
        goto out;
    }
    if (c.finish_reason == DI_FINISH_ERROR) {
        fprintf(stderr, "deepinfer " CMD ": %s\n", c.error ? c.error : "generation failed");
        goto out;
    }
    if (g.as_json) {
        print_json(&ro, &c, secs);
    } else if (c.message_json) {
        if (g.show_reasoning && c.reasoning_content) printf("<think>%s</think>\n", c.reasoning_content);
        if (c.content) fputs(c.content, stdout);
        if (c.tool_calls_json) printf("\n%s", c.tool_calls_json);
        putchar('\n');
    } else {
        fwrite(c.text, 1, c.text_len, stdout);
        putchar('\n');
    }
    fflush(stdout);
    di_engine_stats stats;
    di_engine_get_stats(e, &stats);
    fprintf(stderr, "[%zu prompt tokens, %zu generated in %.3f s: %.1f tokens/s generated, %.1f tokens/s prompt; "
                    "finish: %s]\n",
            ro.n_prompt, c.n_tokens, secs, secs > 0 ? (double)c.n_tokens / secs : 0.0,
            secs > 0 ? (double)ro.n_prompt / secs : 0.0, di_finish_reason_name(c.finish_reason));
    rc = 0;
out:
    di_engine_close(e);
    free(prompt);
    free(schema);
    free(grammar);
    free(body);
    return rc;
}
