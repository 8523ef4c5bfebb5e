/* MXFP4 decode rows of one activation row (kernels_avx2_mxfp4.c): the byte
 * form (dec8_1b, vpdpbusd) against the 16-bit sums it replaced, on a CPU
 * with AVX-512 VNNI. The two differ by a few per cent, less than a shared
 * VM's spread between runs, so one process alternates them many times and
 * keeps each one's best time; same bits either way (test_cpu_kernels).
 *
 *   build/bench/bench_fp4_rows [--rounds R] [--k K --n N]
 *
 * Default shapes: the routed experts' w1 (2,304 x 5,120) and w2 (5,120 x
 * 2,304). hot: the first 192 rows of one copy, called again and again (in
 * L2: the kernel's arithmetic rate); DRAM: 16 rotating copies of the whole
 * matrix (more than the last-level cache), as a decode step reads them.
 * One thread. Activations: normal values quantized per 32 as the model's. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cpu/kernels.h"
#include "bench_util.h"

enum { COPIES = 16, HOT_ROWS = 192 };

static void shape(int64_t K, int64_t N, int rounds) {
    const size_t wb = (size_t)(N * K / 2), sb = (size_t)(N * K / 32);
    uint8_t *w = malloc(wb * COPIES), *ws = malloc(sb * COPIES), *qa = malloc((size_t)K);
    float *x = malloc(sizeof(float) * (size_t)K), *sa = malloc(sizeof(float) * (size_t)(K / 32));
    float *out = malloc(sizeof(float) * (size_t)N);
    if (!w || !ws || !qa || !x || !sa || !out) {
        fprintf(stderr, "bench_fp4_rows: out of memory\n");
        exit(1);
    }
    srand(7);
    for (size_t i = 0; i < wb * COPIES; i++) w[i] = (uint8_t)rand();
    for (size_t i = 0; i < sb * COPIES; i++) ws[i] = (uint8_t)(120 + rand() % 8);
    for (int64_t i = 0; i < K; i++) { /* ~N(0, 1) by twelve uniforms */
        double u = 0;
        for (int j = 0; j < 12; j++) u += rand() / (double)RAND_MAX;
        x[i] = (float)(u - 6.0);
    }
    di_act_quant_fp8_scalar(x, 1, K, qa, sa);
    /* forms: 0 the byte form as the CPU takes it (vpermb with VBMI), 1 the
     * byte form on vpshufb, 2 the 16-bit sums */
    double best[3][2] = {{1e30, 1e30}, {1e30, 1e30}, {1e30, 1e30}}; /* [form][hot, DRAM] */
    for (int r = 0; r < rounds; r++)
        for (int form = 0; form < 3; form++) {
            di_cpu_kernels_force_no_vbmi(form == 1);
            di_cpu_kernels_force_no_vnni_bytes(form == 2);
            double t0 = bench_now_s();
            for (int i = 0; i < 50; i++) di_gemm_mxfp4(qa, sa, 1, K, w, ws, HOT_ROWS, out, NULL);
            double t = (bench_now_s() - t0) / 50;
            best[form][0] = t < best[form][0] ? t : best[form][0];
            t0 = bench_now_s();
            for (int i = 0; i < COPIES; i++) di_gemm_mxfp4(qa, sa, 1, K, w + i * wb, ws + i * sb, N, out, NULL);
            t = (bench_now_s() - t0) / COPIES;
            best[form][1] = t < best[form][1] ? t : best[form][1];
        }
    di_cpu_kernels_force_no_vbmi(0);
    di_cpu_kernels_force_no_vnni_bytes(0);
    const double row = (double)(K / 2 + K / 32);
    for (int c = 0; c < 2; c++) {
        const double bytes = (c == 0 ? HOT_ROWS : (double)N) * row;
        printf("%6lld x %-6lld %-4s %5.1f / %5.1f / %5.1f GB/s (%.3fx, %.3fx)\n", (long long)N, (long long)K,
               c == 0 ? "hot" : "DRAM", bytes / best[0][c] / 1e9, bytes / best[1][c] / 1e9, bytes / best[2][c] / 1e9,
               best[2][c] / best[0][c], best[2][c] / best[1][c]);
    }
    free(w), free(ws), free(qa), free(x), free(sa), free(out);
}

int main(int argc, char **argv) {
    int rounds = 40;
    int64_t k = 0, n = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--rounds") && i + 1 < argc) rounds = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--k") && i + 1 < argc) k = atoll(argv[++i]);
        else if (!strcmp(argv[i], "--n") && i + 1 < argc) n = atoll(argv[++i]);
        else {
            fprintf(stderr, "bench_fp4_rows: unknown argument %s (see the comment at the top of bench/bench_fp4_rows.c)\n",
                    argv[i]);
            return 2;
        }
    }
    if (!di_cpu_kernels_vnni()) {
        printf("bench_fp4_rows: no AVX-512 VNNI on this CPU (or the 512-bit kernels off): nothing to compare\n");
        return 0;
    }
    if (rounds < 1 || (k && (k % 64 || n < HOT_ROWS))) {
        fprintf(stderr, "bench_fp4_rows: --rounds >= 1, --k a multiple of 64 and --n >= %d\n", HOT_ROWS);
        return 2;
    }
    printf("# MXFP4 decode rows, one activation row, one thread: GB/s byte form (vpermb where VBMI) / byte form on\n"
           "# vpshufb / 16-bit sums (speed ratios of the byte forms to the 16-bit sums), best of %d alternations\n",
           rounds);
    if (k) {
        shape(k, n, rounds);
    } else {
        shape(5120, 2304, rounds);
        shape(2304, 5120, rounds);
    }
    return 0;
}
