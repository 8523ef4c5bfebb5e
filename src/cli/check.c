/* `deepinfer check --model DIR [--list]`: opens a checkpoint with every
 * validity check (architecture.md §8, ecosystem.md §3.1), reads every byte
 * once and prints a summary; exit 0 when loadable, 1 with a message naming
 * the problem otherwise, 2 on a usage error.
 *
 * When the directory has a config.json, every tensor is also bound to the
 * model it describes (names, dtypes and shapes; missing and unknown tensors
 * are errors); without one only the files are checked.
 *
 * --list adds one line per tensor (name, dtype, shape, file, CRC-32 of its
 * bytes) so that other readers can be compared with this one tensor by
 * tensor. */
#include <stdio.h>
#include <string.h>

#include <sys/stat.h>

#include "cli/cli.h"
#include "io/checkpoint.h"
#include "model/config.h"
#include "model/weights.h"

static void check_usage(FILE *out) {
    fprintf(out, "usage: deepinfer check --model DIR [--list]\n"
                 "  validates every file and tensor of a checkpoint and reads every byte once\n"
                 "  --list   also print name, dtype, shape, file and CRC-32 of every tensor\n");
}

/* CRC-32 (IEEE 802.3, reflected), the checksum zlib and Python's zlib.crc32
 * compute, so that the listing can be checked without this program. */
static uint32_t crc32_update(uint32_t crc, const uint8_t *p, size_t n) {
    static uint32_t table[256];
    if (!table[1])
        for (uint32_t i = 0; i < 256; i++) {
            uint32_t c = i;
            for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
            table[i] = c;
        }
    crc = ~crc;
    for (size_t i = 0; i < n; i++) crc = (crc >> 8) ^ table[(crc ^ p[i]) & 0xFFu];
    return ~crc;
}

static void print_list(const di_checkpoint *ck) {
    for (size_t i = 0; i < di_checkpoint_count(ck); i++) {
        const di_ckpt_tensor *t = di_checkpoint_at(ck, i);
        printf("tensor\t%s\t%s\t[", t->name, di_dtype_name(t->t.dtype));
        for (int d = 0; d < t->t.ndim; d++)
            printf("%s%lld", d ? "," : "", (long long)t->t.shape[d]);
        printf("]\t%s\t%08x\n", t->file, crc32_update(0, t->t.data, t->t.nbytes));
    }
}

static void print_summary(const char *dir, const di_checkpoint *ck, const di_ckpt_read_stats *rs) {
    uint64_t file_bytes = 0;
    for (size_t i = 0; i < di_checkpoint_file_count(ck); i++)
        file_bytes += di_checkpoint_file_size(ck, i);
    printf("model    %s\n", dir);
    printf("files    %zu (%llu bytes)\n", di_checkpoint_file_count(ck),
           (unsigned long long)file_bytes);
    for (size_t i = 0; i < di_checkpoint_file_count(ck); i++)
        printf("  %-40s %14llu bytes\n", di_checkpoint_file_name(ck, i),
               (unsigned long long)di_checkpoint_file_size(ck, i));
    uint64_t total = di_checkpoint_total_bytes(ck);
    printf("tensors  %zu (%llu bytes, %.3f GB)\n", di_checkpoint_count(ck),
           (unsigned long long)total, (double)total / 1e9);
    for (int d = DI_DTYPE_INVALID + 1; d < DI_DTYPE_COUNT; d++) {
        uint64_t b = di_checkpoint_dtype_bytes(ck, (di_dtype)d);
        if (b)
            printf("  %-8s %14llu bytes  %5.1f%%\n", di_dtype_name((di_dtype)d),
                   (unsigned long long)b, 100.0 * (double)b / (double)total);
    }
    double gbs = rs->seconds > 0 ? (double)rs->bytes / rs->seconds / 1e9 : 0.0;
    printf("read     %llu bytes in %.4f s: %.2f GB/s (checksum %016llx)\n",
           (unsigned long long)rs->bytes, rs->seconds, gbs, (unsigned long long)rs->checksum);
}

/* Binds the checkpoint's tensors to DIR/config.json. 0: bound, 1: no config
 * (file-level check only), -1: failed (err set). */
static int bind_to_config(const char *dir, di_checkpoint *ck, di_config *cfg, di_err *err) {
    char path[4096];
    struct stat sb;
    if (snprintf(path, sizeof path, "%s/config.json", dir) >= (int)sizeof path) {
        di_err_set(err, DI_ERR_INVALID_ARG, "%s: path too long", dir);
        return -1;
    }
    if (stat(path, &sb) != 0) return 1;
    if (di_config_load(path, cfg, err)) return -1;
    di_weights w;
    if (di_weights_init(&w, cfg, err)) return -1;
    di_tensor_source src;
    di_weights_source_checkpoint(&src, ck);
    di_status s = di_weights_bind(&w, cfg, &src, err);
    di_weights_free(&w);
    return s ? -1 : 0;
}

int cli_check(int argc, char **argv) {
    const char *dir = NULL;
    int list = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--model") && i + 1 < argc) dir = argv[++i];
        else if (!strcmp(argv[i], "--list")) list = 1;
        else if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            check_usage(stdout);
            return 0;
        } else {
            fprintf(stderr, "deepinfer check: unexpected argument '%s'\n", argv[i]);
            check_usage(stderr);
            return 2;
        }
    }
    if (!dir) {
        fprintf(stderr, "deepinfer check: --model DIR is required\n");
        check_usage(stderr);
        return 2;
    }

    di_err err = {0};
    di_checkpoint *ck = NULL;
    if (di_checkpoint_open(dir, &ck, &err)) {
        fprintf(stderr, "deepinfer check: %s\n", err.msg);
        return 1;
    }
    di_config cfg;
    int bound = bind_to_config(dir, ck, &cfg, &err);
    if (bound < 0) {
        fprintf(stderr, "deepinfer check: %s\n", err.msg);
        di_checkpoint_close(ck);
        return 1;
    }
    di_ckpt_read_stats rs;
    if (di_checkpoint_read_all(ck, &rs, &err)) {
        fprintf(stderr, "deepinfer check: %s\n", err.msg);
        di_checkpoint_close(ck);
        return 1;
    }
    print_summary(dir, ck, &rs);
    if (bound == 0)
        printf("binding  every tensor matches config.json (%d layers + %d DSpark stages)\n",
               cfg.n_layers, cfg.n_mtp);
    else printf("binding  skipped: no config.json (file-level check only)\n");
    if (list) print_list(ck);
    printf("ok: %s is loadable\n", dir);
    di_checkpoint_close(ck);
    return 0;
}
