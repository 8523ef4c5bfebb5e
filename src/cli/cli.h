/* One entry point per subcommand; each lives in src/cli/<name>.c. They get
 * argv with argv[0] = the subcommand name and return the process exit code
 * (0 ok, 1 failure, 2 usage error). */
#ifndef DI_CLI_H
#define DI_CLI_H

int cli_run(int argc, char **argv);
int cli_plan(int argc, char **argv);
int cli_check(int argc, char **argv);
int cli_info(int argc, char **argv);
int cli_tokenize(int argc, char **argv);
int cli_dump(int argc, char **argv);
int cli_grammar(int argc, char **argv);
int cli_generate(int argc, char **argv);
int cli_batch(int argc, char **argv);
int cli_ppl(int argc, char **argv);
int cli_bench(int argc, char **argv);

#endif
