/* `deepinfer run` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int cli_run(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deepinfer run: not available in this build yet\n");
    return 1;
}
