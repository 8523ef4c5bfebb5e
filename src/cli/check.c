/* `deepinfer check` (placeholder until its module lands). */
#include <stdio.h>

#include "cli/cli.h"

int cli_check(int argc, char **argv) {
    (void)argc; (void)argv;
    fprintf(stderr, "deepinfer check: not available in this build yet\n");
    return 1;
}
