/* `deepinfer info`: what this build contains and what it can see. */
#include <stdio.h>
#include <string.h>

#include "cli/cli.h"
#include "deepinfer.h"

int cli_info(int argc, char **argv) {
    if (argc > 1 && (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h"))) {
        printf("usage: deepinfer info\n\nPrints the version, the backends compiled into this build "
               "and the devices they see.\n");
        return 0;
    }
    printf("deepinfer %s\n", di_version());
    printf("backends compiled: cpu%s\n",
#ifdef DI_HAVE_CUDA
           ", cuda"
#else
           ""
#endif
    );
    printf("cpu: avx2 %s, fma %s\n", __builtin_cpu_supports("avx2") ? "yes" : "no",
           __builtin_cpu_supports("fma") ? "yes" : "no");
    return 0;
}
