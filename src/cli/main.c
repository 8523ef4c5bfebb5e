/* deepinfer command-line entry: dispatches to one file per subcommand. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "deepinfer.h"

typedef struct cli_command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} cli_command;

static const cli_command commands[] = {
    {"run", cli_run, "main job on the embedded default model (or --model DIR)"},
    {"plan", cli_plan, "memory plan of a config or model (--config FILE | --model DIR) [--json]"},
    {"check", cli_check, "validate a checkpoint: every tensor, every byte (--model DIR)"},
    {"info", cli_info, "build, backends and devices"},
    {"tokenize", cli_tokenize, "text -> token ids, ids -> text (--tokenizer FILE --text STR | --file PATH)"},
    {"dump", cli_dump, "forward-pass outputs of the prompts in an inputs file (--model DIR --inputs F --out F)"},
    {"grammar", cli_grammar, "structured output: grammar check --tokenizer F (--json-schema F | --regex S | --ebnf F)"},
    {"generate", cli_generate, "generate from a prompt or chat, llama.cpp-style sampling flags (-p TEXT | --messages F)"},
    {"batch", cli_batch, "OpenAI Batch API jobs, resumable (--input IN.jsonl --output OUT.jsonl)"},
    {"ppl", cli_ppl, "perplexity of a text file (--file TEXT)"},
    {"bench", cli_bench, "llama-bench-style throughput rows and an SVG plot (-p, -n, -b lists)"},
};

static void usage(FILE *out) {
    fprintf(out, "deepinfer %s — offline inference for DeepSeek-V4.1-Flash\n\n", di_version());
    fprintf(out, "usage: deepinfer <command> [options]   (deepinfer <command> --help)\n\ncommands:\n");
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
}

int main(int argc, char **argv) {
    if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("deepinfer %s\n", di_version());
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof *commands; i++)
        if (!strcmp(argv[1], commands[i].name)) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "deepinfer: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
