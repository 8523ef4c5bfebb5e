/* `deepinfer grammar check --tokenizer FILE (--json-schema FILE | --regex STR
 * | --ebnf FILE | --choices FILE) [--lenient] [--compact]`: compiles the
 * constraint against the tokenizer's vocabulary, then reads candidate
 * outputs from stdin, one JSON-encoded string per line, splits each into
 * tokens as the tokenizer encodes it, feeds them through the matcher and
 * prints `accept` or `reject` per line (accept = every token allowed and
 * the matcher accepting at the end). Exit 0; 2 when the constraint does not
 * compile (with the message) or on a usage / input error.
 * Spec: ecosystem.md §1.4. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli/cli.h"
#include "core/file_read.h"
#include "deepinfer.h"

static void grammar_usage(FILE *out) {
    fprintf(out,
            "usage: deepinfer grammar check --tokenizer FILE (--json-schema FILE | --regex STR | --ebnf FILE |\n"
            "                               --choices FILE) [--lenient] [--compact] [--forbid-additional]\n"
            "                               [--format-mode checked|annotation|assert]\n"
            "  reads one JSON-encoded string per line from stdin and prints accept / reject for each,\n"
            "  feeding the string token by token as the tokenizer splits it\n"
            "  --format-mode: JSON Schema `format` asserted where checked (default), never\n"
            "                (annotation, draft 2020-12's default), or always (an unchecked format fails)\n");
}

/* The mask vocabulary: every id's bytes, except special tokens and the
 * "<｜...｜>" control spellings, which are never text. */
static di_status build_vocab(const di_tokenizer *tok, di_vocab **out) {
    size_t n = di_tokenizer_vocab_size(tok);
    const uint8_t **bytes = calloc(n, sizeof *bytes);
    size_t *lens = calloc(n, sizeof *lens);
    if (!bytes || !lens) { free(bytes); free(lens); return DI_ERR_NOMEM; }
    static const char bar[] = "\xef\xbd\x9c"; /* U+FF5C */
    for (size_t i = 0; i < n; i++) {
        const char *b;
        size_t l;
        if (di_tokenizer_token_bytes(tok, (int32_t)i, &b, &l) != DI_OK || di_tokenizer_is_special(tok, (int32_t)i))
            continue;
        if (l >= 8 && b[0] == '<' && !memcmp(b + 1, bar, 3) && b[l - 1] == '>' && !memcmp(b + l - 4, bar, 3))
            continue;
        bytes[i] = (const uint8_t *)b;
        lens[i] = l;
    }
    int32_t eos = -1;
    if (di_tokenizer_token_id(tok, "<\xef\xbd\x9c" "end\xe2\x96\x81of\xe2\x96\x81sentence\xef\xbd\x9c>", &eos) != DI_OK) eos = -1;
    di_status st = di_vocab_create(n, bytes, lens, eos, out);
    free(bytes);
    free(lens);
    return st;
}

static int check_lines(const di_tokenizer *tok, const di_grammar *g) {
    char *line = NULL;
    size_t cap = 0;
    ssize_t got;
    long lineno = 0;
    int rc = 0;
    while ((got = getline(&line, &cap, stdin)) >= 0) {
        lineno++;
        while (got > 0 && (line[got - 1] == '\n' || line[got - 1] == '\r')) line[--got] = 0;
        cJSON *s = cJSON_ParseWithLength(line, (size_t)got);
        if (!s || !cJSON_IsString(s)) {
            fprintf(stderr, "deepinfer grammar: stdin line %ld is not a JSON string\n", lineno);
            cJSON_Delete(s);
            rc = 2;
            break;
        }
        const char *text = s->valuestring;
        int32_t *ids = NULL;
        size_t n_ids = 0;
        if (di_tokenizer_encode(tok, text, strlen(text), 0, &ids, &n_ids) != DI_OK) {
            fprintf(stderr, "deepinfer grammar: line %ld: %s\n", lineno, di_last_error());
            cJSON_Delete(s);
            rc = 2;
            break;
        }
        di_matcher *m = NULL;
        if (di_matcher_create(g, &m) != DI_OK) {
            fprintf(stderr, "deepinfer grammar: %s\n", di_last_error());
            di_free(ids);
            cJSON_Delete(s);
            rc = 1;
            break;
        }
        int ok = 1;
        for (size_t i = 0; i < n_ids && ok; i++) ok = di_matcher_advance(m, ids[i]) == DI_OK;
        ok = ok && di_matcher_is_accepting(m);
        printf("%s\n", ok ? "accept" : "reject");
        di_matcher_free(m);
        di_free(ids);
        cJSON_Delete(s);
    }
    free(line);
    fflush(stdout);
    return rc;
}

int cli_grammar(int argc, char **argv) {
    if (argc < 2 || strcmp(argv[1], "check")) {
        int help = argc >= 2 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"));
        grammar_usage(help ? stdout : stderr);
        return help ? 0 : 2;
    }
    const char *tok_path = NULL, *src = NULL;
    int kind = -1, from_file = 1;
    di_grammar_options opts;
    di_grammar_options_default(&opts);
    for (int i = 2; i < argc; i++) {
        const char *a = argv[i];
        int has_val = i + 1 < argc;
        if (!strcmp(a, "--tokenizer") && has_val) tok_path = argv[++i];
        else if (!strcmp(a, "--json-schema") && has_val) { kind = DI_CONSTRAINT_JSON_SCHEMA; src = argv[++i]; }
        else if (!strcmp(a, "--ebnf") && has_val) { kind = DI_CONSTRAINT_EBNF; src = argv[++i]; }
        else if (!strcmp(a, "--choices") && has_val) { kind = DI_CONSTRAINT_CHOICE; src = argv[++i]; }
        else if (!strcmp(a, "--regex") && has_val) { kind = DI_CONSTRAINT_REGEX; src = argv[++i]; from_file = 0; }
        else if (!strcmp(a, "--lenient")) opts.lenient = 1;
        else if (!strcmp(a, "--compact")) opts.whitespace = DI_WS_COMPACT;
        else if (!strcmp(a, "--forbid-additional")) opts.forbid_additional_properties = 1;
        else if (!strcmp(a, "--format-mode") && has_val) {
            const char *m = argv[++i];
            if (!strcmp(m, "checked")) opts.format_mode = DI_FORMAT_CHECKED;
            else if (!strcmp(m, "annotation")) opts.format_mode = DI_FORMAT_ANNOTATION;
            else if (!strcmp(m, "assert")) opts.format_mode = DI_FORMAT_ASSERT;
            else {
                fprintf(stderr, "deepinfer grammar: --format-mode '%s' (expected checked, annotation or assert)\n", m);
                return 2;
            }
        }
        else if (!strcmp(a, "--help") || !strcmp(a, "-h")) { grammar_usage(stdout); return 0; }
        else {
            fprintf(stderr, "deepinfer grammar: unknown or incomplete option '%s'\n", a);
            grammar_usage(stderr);
            return 2;
        }
    }
    if (!tok_path || kind < 0) {
        grammar_usage(stderr);
        return 2;
    }
    char *text = NULL;
    size_t len = 0;
    if (from_file) {
        di_err err = {0};
        if (di_file_read(src, 0, &text, &len, &err)) {
            fprintf(stderr, "deepinfer grammar: %s\n", err.msg);
            return 2;
        }
    } else {
        text = strdup(src);
        len = strlen(src);
        if (!text) {
            fprintf(stderr, "deepinfer grammar: out of memory\n");
            return 2;
        }
    }
    di_tokenizer *tok = NULL;
    if (di_tokenizer_load(tok_path, &tok) != DI_OK) {
        fprintf(stderr, "deepinfer grammar: %s\n", di_last_error());
        free(text);
        return 2;
    }
    di_vocab *v = NULL;
    di_grammar *g = NULL;
    int rc = 0;
    if (build_vocab(tok, &v) != DI_OK) {
        fprintf(stderr, "deepinfer grammar: vocabulary: %s\n", di_last_error());
        rc = 2;
    } else if (di_grammar_compile(v, (di_constraint_kind)kind, text, len, &opts, &g) != DI_OK) {
        fprintf(stderr, "deepinfer grammar: %s%s%s\n", from_file ? src : "", from_file ? ": " : "", di_last_error());
        rc = 2;
    } else rc = check_lines(tok, g);
    di_grammar_free(g);
    di_vocab_free(v);
    di_tokenizer_free(tok);
    free(text);
    return rc;
}
