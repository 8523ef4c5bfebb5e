/* `deepinfer info`: what this build contains and what it can see. */
#include <stdio.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "backend/cuda/cuda_backend.h"
#include "cli/cli.h"
#include "core/cpu_features.h"
#include "deepinfer.h"

/* One line per visible CUDA device, or the reason there is none. */
static void print_cuda_devices(void) {
    di_err err = {0};
    int n = 0;
    if (di_cuda_device_count(&n, &err) != DI_OK) {
        printf("cuda: %s\n", err.msg);
        return;
    }
    for (int d = 0; d < n; d++) {
        di_cuda_device_info info;
        if (di_cuda_device_info_get(d, &info, &err) != DI_OK) {
            printf("cuda device %d: %s\n", d, err.msg);
            continue;
        }
        printf("cuda device %d: %s, compute capability %d.%d, %d SMs, %.1f GiB (%.1f GiB free), "
               "L2 %.0f MiB\n",
               d, info.name, info.cc_major, info.cc_minor, info.sm_count,
               info.total_mem / 1073741824.0, info.free_mem / 1073741824.0,
               info.l2_bytes / 1048576.0);
    }
}

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
    /* the FP8 decode rows' software prefetches (DI_CPU_PREFETCH=0: off) */
    const int no_prefetch = !strcmp(di_cpu_kernels_path(), "avx2") && !di_cpu_kernels_dec_prefetch();
    /* AVX-VNNI serves the 256-bit kernels only (CPUs without AVX-512) */
    const int avx_vnni = !strcmp(di_cpu_kernels_path(), "avx2") && !di_cpu_kernels_wide() && di_cpu_kernels_avx_vnni();
    printf("cpu: avx2 %s, fma %s, avx512 %s (kernels: %s%s%s%s%s%s%s)\n",
           __builtin_cpu_supports("avx2") ? "yes" : "no", __builtin_cpu_supports("fma") ? "yes" : "no",
           di_cpu_has_avx512() ? "yes" : "no", di_cpu_kernels_path(),
           di_cpu_kernels_wide() ? ", 512-bit vectors" : "", avx_vnni ? ", AVX-VNNI" : "",
           di_cpu_kernels_vnni() ? ", VNNI" : "",
           di_cpu_kernels_vnni() && di_cpu_kernels_vbmi() ? ", VBMI" : "",
           di_cpu_kernels_amx() ? ", AMX tiles" : "", no_prefetch ? ", no prefetch" : "");
    print_cuda_devices(); /* without CUDA the stub says so */
    return 0;
}
