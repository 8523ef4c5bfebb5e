/* deepinfer tokenize: text -> ids, ids -> text, with a tokenizer.json
 * (ecosystem.md §2; the tokenizer is src/recipe/tokenizer.c).
 *
 *   deepinfer tokenize --tokenizer FILE (--text STR | --file PATH) [--parse-special]
 *       prints the ids as one JSON array on one line
 *   deepinfer tokenize --tokenizer FILE --decode (--text '[1,2]' | --file PATH)
 *       prints the decoded bytes exactly (no newline is added)
 *   deepinfer tokenize --tokenizer FILE --chat FILE [--thinking | --no-thinking]
 *                      [--reasoning-effort E]
 *       renders an OpenAI-style chat JSON to the prompt and its ids */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "cli/engine_args.h"
#include "deepinfer.h"

static void usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer tokenize --tokenizer FILE (--text STR | --file PATH) [--parse-special]\n"
            "       deepinfer tokenize --tokenizer FILE --decode (--text JSON | --file PATH)\n"
            "       deepinfer tokenize --tokenizer FILE --chat FILE [--thinking | --no-thinking]\n"
            "                          [--reasoning-effort E]\n"
            "  --text STR        input given on the command line\n"
            "  --file PATH       input read from a file ('-' = standard input)\n"
            "  --parse-special   match added-token spellings (trusted templates only);\n"
            "                    by default they encode as plain text\n"
            "  --decode          input is a JSON array of token ids; prints the text\n"
            "  --chat FILE       render a chat (OpenAI messages array or request object\n"
            "                    with thinking / reasoning_effort fields) and print the\n"
            "                    prompt (a JSON string) and its ids on two lines\n"
            "  --thinking, --no-thinking, --reasoning-effort E\n"
            "                    override the chat's thinking switches (E: none, low,\n"
            "                    medium, high, xhigh, max)\n");
}

static int print_ids(const int32_t *ids, size_t n) {
    putchar('[');
    for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", ids[i]);
    puts("]");
    return 0;
}

static int encode(const di_tokenizer *tok, const char *text, size_t len, unsigned flags) {
    int32_t *ids;
    size_t n;
    if (di_tokenizer_encode(tok, text, len, flags, &ids, &n)) {
        fprintf(stderr, "deepinfer tokenize: %s\n", di_last_error());
        return 1;
    }
    print_ids(ids, n);
    di_free(ids);
    return 0;
}

static int decode(const di_tokenizer *tok, const char *json, size_t len) {
    cJSON *arr = cJSON_ParseWithLength(json, len);
    if (!cJSON_IsArray(arr)) {
        fprintf(stderr, "deepinfer tokenize --decode: input is not a JSON array of token ids\n");
        cJSON_Delete(arr);
        return 1;
    }
    size_t n = (size_t)cJSON_GetArraySize(arr), i = 0;
    int32_t *ids = malloc((n ? n : 1) * sizeof *ids);
    const cJSON *v;
    int rc = ids ? 0 : 1;
    cJSON_ArrayForEach(v, arr) {
        if (rc) break;
        double d = cJSON_IsNumber(v) ? v->valuedouble : -1;
        if (d < 0 || d > 2147483647.0 || d != (double)(int32_t)d) {
            fprintf(stderr, "deepinfer tokenize --decode: element %zu is not a token id\n", i);
            rc = 1;
            break;
        }
        ids[i++] = (int32_t)d;
    }
    cJSON_Delete(arr);
    char *text;
    size_t tl;
    if (!rc && di_tokenizer_decode(tok, ids, n, &text, &tl)) {
        fprintf(stderr, "deepinfer tokenize --decode: %s\n", di_last_error());
        rc = 1;
    } else if (!rc) {
        fwrite(text, 1, tl, stdout);
        di_free(text);
    }
    free(ids);
    return rc;
}

/* --chat: renders the chat (src/recipe/chat.*) and prints two lines: the
 * prompt as a JSON string, then its ids as a JSON array. */
static int chat(const di_tokenizer *tok, const char *chat_path, const di_chat_options *opts) {
    size_t len = 0;
    char *json = cli_read_file("tokenize", chat_path, &len);
    if (!json) return 1;
    char *prompt = NULL;
    size_t plen = 0;
    int32_t *ids = NULL;
    size_t n = 0;
    int rc = 0;
    if (di_chat_render(json, len, opts, &prompt, &plen) ||
        di_chat_encode(tok, json, len, opts, &ids, &n)) {
        fprintf(stderr, "deepinfer tokenize: %s: %s\n", chat_path, di_last_error());
        rc = 1;
    } else {
        cJSON *s = cJSON_CreateString(prompt);
        char *quoted = s ? cJSON_PrintUnformatted(s) : NULL;
        if (!quoted) {
            fprintf(stderr, "deepinfer tokenize: out of memory\n");
            rc = 1;
        } else {
            printf("%s\n[", quoted);
            for (size_t i = 0; i < n; i++) printf(i ? ",%d" : "%d", (int)ids[i]);
            printf("]\n");
        }
        free(quoted);
        cJSON_Delete(s);
    }
    di_free(prompt);
    di_free(ids);
    free(json);
    return rc;
}

int cli_tokenize(int argc, char **argv) {
    const char *tok_path = NULL, *text = NULL, *file = NULL, *chat_path = NULL;
    unsigned flags = 0;
    int do_decode = 0;
    di_chat_options chat_opts;
    di_chat_options_default(&chat_opts);
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        int has_value = i + 1 < argc;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            usage(stdout);
            return 0;
        } else if (!strcmp(a, "--tokenizer") && has_value) {
            tok_path = argv[++i];
        } else if (!strcmp(a, "--text") && has_value) {
            text = argv[++i];
        } else if (!strcmp(a, "--file") && has_value) {
            file = argv[++i];
        } else if (!strcmp(a, "--chat") && has_value) {
            chat_path = argv[++i];
        } else if (!strcmp(a, "--thinking") || !strcmp(a, "--no-thinking")) {
            chat_opts.thinking = !strcmp(a, "--thinking");
        } else if (!strcmp(a, "--reasoning-effort") && has_value) {
            chat_opts.reasoning_effort = argv[++i];
        } else if (!strcmp(a, "--parse-special")) {
            flags |= DI_TOKENIZE_PARSE_SPECIAL;
        } else if (!strcmp(a, "--decode")) {
            do_decode = 1;
        } else {
            fprintf(stderr, "deepinfer tokenize: unknown or incomplete option '%s'\n", a);
            usage(stderr);
            return 2;
        }
    }
    int inputs = (text != NULL) + (file != NULL) + (chat_path != NULL);
    if (!tok_path || inputs != 1 || (chat_path && (do_decode || flags))) {
        fprintf(stderr, "deepinfer tokenize: need --tokenizer and exactly one of --text, --file, "
                        "--chat\n");
        usage(stderr);
        return 2;
    }
    di_tokenizer *tok;
    if (di_tokenizer_load(tok_path, &tok)) {
        fprintf(stderr, "deepinfer tokenize: %s\n", di_last_error());
        return 1;
    }
    int rc;
    if (chat_path) {
        rc = chat(tok, chat_path, &chat_opts);
    } else {
        size_t len = text ? strlen(text) : 0;
        char *buf = file ? cli_read_file("tokenize", file, &len) : NULL;
        const char *in = file ? buf : text;
        if (!in) rc = 1;
        else rc = do_decode ? decode(tok, in, len) : encode(tok, in, len, flags);
        free(buf);
    }
    di_tokenizer_free(tok);
    return rc;
}
