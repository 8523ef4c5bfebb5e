/* `deepinfer plan` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int cli_plan(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deepinfer plan: not available in this build yet\n");
    return 1;
}
