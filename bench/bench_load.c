/* Load speed of a multi-GB checkpoint (architecture.md §8.1): opening it
 * with every check and reading every tensor byte once (what `deepinfer
 * check` does), against the peer of a plain read() loop over the same files,
 * both from a cold page cache (posix_fadvise DONTNEED after fsync) and warm.
 *
 *   bench_load [GB] [DIR] [REPS]     defaults: 3 /tmp/deepinfer_bench_load 3
 *
 * Writes a dummy checkpoint of about GB gigabytes (FP8 E4M3 weights with
 * UE8M0 scales, BF16 norms; 1 GB shards + index) into DIR, prints medians and
 * the ratio ours / read(), and removes DIR unless KEEP=1. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "io/checkpoint.h"
#include "io/safetensors_writer.h"

#include "bench_util.h"

#define WEIGHT_ROWS 4096
#define WEIGHT_COLS 4096 /* 16 MiB of FP8 per weight */

static uint64_t mix(uint64_t x) {
    x += 0x9e3779b97f4a7c15ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
}

/* Incompressible bytes, a function of (tensor, offset) only. */
static void fill(void *ctx, size_t index, uint64_t offset, void *dst, size_t n) {
    (void)ctx;
    uint8_t *p = dst;
    size_t i = 0;
    for (; i < n && (offset + i) % 8; i++) p[i] = (uint8_t)mix(index * 0x100000000ull + offset + i);
    for (; i + 8 <= n; i += 8) {
        uint64_t w = mix((index << 40) ^ (offset + i));
        memcpy(p + i, &w, 8);
    }
    for (; i < n; i++) p[i] = (uint8_t)mix(index * 0x100000000ull + offset + i);
}

typedef struct file_list {
    char **paths;
    size_t n;
    uint64_t bytes;
} file_list;

static void list_files(const char *dir, file_list *fl) {
    memset(fl, 0, sizeof *fl);
    DIR *d = opendir(dir);
    if (!d) return;
    for (struct dirent *e; (e = readdir(d));) {
        if (e->d_name[0] == '.') continue;
        fl->paths = realloc(fl->paths, (fl->n + 1) * sizeof *fl->paths);
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        fl->paths[fl->n] = malloc(len);
        snprintf(fl->paths[fl->n], len, "%s/%s", dir, e->d_name);
        struct stat sb;
        if (stat(fl->paths[fl->n], &sb) == 0) fl->bytes += (uint64_t)sb.st_size;
        fl->n++;
    }
    closedir(d);
}

/* Removes what a previous run left (checkpoint files only). */
static void clear_checkpoint(const char *dir) {
    file_list fl;
    list_files(dir, &fl);
    for (size_t i = 0; i < fl.n; i++) {
        const char *base = strrchr(fl.paths[i], '/') + 1;
        size_t n = strlen(base);
        if ((n > 12 && !strcmp(base + n - 12, ".safetensors")) ||
            !strcmp(base, "model.safetensors.index.json"))
            unlink(fl.paths[i]);
        free(fl.paths[i]);
    }
    free(fl.paths);
}

static void free_files(file_list *fl) {
    for (size_t i = 0; i < fl->n; i++) free(fl->paths[i]);
    free(fl->paths);
}

/* fsync + DONTNEED: the next read comes from the disk. Returns the fraction
 * of pages still resident afterwards (mincore), to show the drop worked. */
static double drop_cache(const file_list *fl) {
    uint64_t pages = 0, resident = 0;
    long psz = sysconf(_SC_PAGESIZE);
    for (size_t i = 0; i < fl->n; i++) {
        int fd = open(fl->paths[i], O_RDONLY);
        if (fd < 0) continue;
        fsync(fd);
        posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
        struct stat sb;
        if (fstat(fd, &sb) == 0 && sb.st_size > 0) {
            void *m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_SHARED, fd, 0);
            if (m != MAP_FAILED) {
                size_t np = ((size_t)sb.st_size + (size_t)psz - 1) / (size_t)psz;
                unsigned char *vec = malloc(np);
                if (mincore(m, (size_t)sb.st_size, vec) == 0)
                    for (size_t k = 0; k < np; k++) resident += vec[k] & 1;
                pages += np;
                free(vec);
                munmap(m, (size_t)sb.st_size);
            }
        }
        close(fd);
    }
    return pages ? (double)resident / (double)pages : 0.0;
}

/* The peers: sequential read() of every file with an 8 MiB buffer, through
 * the page cache (the plain loop) or around it (O_DIRECT: the device's own
 * sequential bandwidth, with no readahead window limiting the request size). */
static double read_loop(const file_list *fl, int direct, uint64_t *sum_out) {
    size_t cap = 8u << 20;
    void *mem = NULL;
    if (posix_memalign(&mem, 4096, cap)) return 0;
    uint8_t *buf = mem;
    uint64_t sum = 0;
    double t0 = bench_now_s();
    for (size_t i = 0; i < fl->n; i++) {
        int fd = open(fl->paths[i], O_RDONLY | (direct ? O_DIRECT : 0));
        if (fd < 0) continue;
        for (;;) {
            ssize_t r = read(fd, buf, cap);
            if (r < 0 && errno == EINTR) continue;
            if (r <= 0) break;
            sum += buf[0] + buf[r - 1]; /* the bytes are used */
        }
        close(fd);
    }
    double t = bench_now_s() - t0;
    free(buf);
    *sum_out = sum;
    return t;
}

/* Ours: open with every check + read every tensor byte once (threads: 0 =
 * the library's default). */
static double load_all(const char *dir, int threads, uint64_t *bytes) {
    double t0 = bench_now_s();
    di_checkpoint *ck = NULL;
    di_err err = {0};
    di_ckpt_read_stats rs = {0};
    if (di_checkpoint_open(dir, &ck, &err) || di_checkpoint_read_all_threads(ck, threads, &rs, &err)) {
        fprintf(stderr, "bench_load: %s\n", err.msg);
        exit(1);
    }
    di_checkpoint_close(ck);
    *bytes = rs.bytes;
    return bench_now_s() - t0;
}

static double median(double *v, int n) {
    qsort(v, (size_t)n, sizeof *v, bench_cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int write_checkpoint(const char *dir, double gb) {
    size_t n_w = (size_t)(gb * 1e9 / (WEIGHT_ROWS * WEIGHT_COLS + 2.0 * WEIGHT_ROWS));
    if (n_w < 1) n_w = 1;
    size_t n = 3 * n_w;
    di_tensor *ts = calloc(n, sizeof *ts);
    di_st_named *named = calloc(n, sizeof *named);
    char (*names)[64] = calloc(n, sizeof *names);
    for (size_t i = 0; i < n_w; i++) {
        di_tensor *w = &ts[3 * i], *s = &ts[3 * i + 1], *nrm = &ts[3 * i + 2];
        *w = (di_tensor){DI_DTYPE_F8_E4M3, 2, {WEIGHT_ROWS, WEIGHT_COLS}, NULL,
                         (size_t)WEIGHT_ROWS * WEIGHT_COLS};
        *s = (di_tensor){DI_DTYPE_F8_E8M0, 2, {WEIGHT_ROWS / 32, WEIGHT_COLS / 32}, NULL,
                         (size_t)(WEIGHT_ROWS / 32) * (WEIGHT_COLS / 32)};
        *nrm = (di_tensor){DI_DTYPE_BF16, 1, {WEIGHT_ROWS}, NULL, (size_t)WEIGHT_ROWS * 2};
        snprintf(names[3 * i], sizeof *names, "layers.%zu.attn.wq_b.weight", i);
        snprintf(names[3 * i + 1], sizeof *names, "layers.%zu.attn.wq_b.scale", i);
        snprintf(names[3 * i + 2], sizeof *names, "layers.%zu.attn_norm.weight", i);
    }
    for (size_t i = 0; i < n; i++) named[i] = (di_st_named){names[i], &ts[i]};
    int shards = (int)(gb + 0.999);
    if (shards < 1) shards = 1;
    di_err err = {0};
    di_status s = di_safetensors_write_sharded(dir, named, n, shards, fill, NULL, &err);
    if (s) fprintf(stderr, "bench_load: writing %s: %s\n", dir, err.msg);
    free(ts);
    free(named);
    free(names);
    return s ? 1 : 0;
}

int main(int argc, char **argv) {
    double gb = argc > 1 ? atof(argv[1]) : 3.0;
    const char *dir = argc > 2 ? argv[2] : "/tmp/deepinfer_bench_load";
    int reps = argc > 3 ? atoi(argv[3]) : 3;
    if (gb <= 0 || reps < 1 || reps > 50) {
        fprintf(stderr, "usage: bench_load [GB>0] [DIR] [REPS 1..50]\n");
        return 2;
    }
    mkdir(dir, 0755);
    clear_checkpoint(dir);
    double t0 = bench_now_s();
    if (write_checkpoint(dir, gb)) return 1;
    file_list fl;
    list_files(dir, &fl);
    printf("bench_load: wrote %.2f GB in %zu files to %s in %.1f s\n", (double)fl.bytes / 1e9, fl.n,
           dir, bench_now_s() - t0);

    double cold_peer[50], cold_direct[50], cold_ours[50], warm_peer[50], warm_ours[50];
    double cold_one[50], warm_one[50];
    double resident = 0;
    uint64_t sum = 0, tensor_bytes = 0;
    for (int r = 0; r < reps; r++) {
        /* the order alternates so that neither side always follows the other */
        for (int k = 0; k < 4; k++) switch ((k + r) % 4) {
            case 0:
                resident += drop_cache(&fl);
                cold_peer[r] = read_loop(&fl, 0, &sum);
                warm_peer[r] = read_loop(&fl, 0, &sum);
                break;
            case 1:
                resident += drop_cache(&fl);
                cold_direct[r] = read_loop(&fl, 1, &sum);
                break;
            case 2:
                resident += drop_cache(&fl);
                cold_one[r] = load_all(dir, 1, &tensor_bytes);
                warm_one[r] = load_all(dir, 1, &tensor_bytes);
                break;
            default:
                resident += drop_cache(&fl);
                cold_ours[r] = load_all(dir, 0, &tensor_bytes);
                warm_ours[r] = load_all(dir, 0, &tensor_bytes);
            }
    }
    double gbf = (double)fl.bytes / 1e9, gbt = (double)tensor_bytes / 1e9;
    double cp = gbf / median(cold_peer, reps), co = gbt / median(cold_ours, reps);
    double cd = gbf / median(cold_direct, reps);
    double wp = gbf / median(warm_peer, reps), wo = gbt / median(warm_ours, reps);
    printf("pages resident after each drop: %.1f%% (0 = cache really dropped)\n",
           100.0 * resident / (4.0 * reps));
    printf("%-20s %14s %10s %10s\n", "medians", "peer GB/s", "ours GB/s", "ours/peer");
    printf("%-20s %14.2f %10.2f %10.2f\n", "cold, read()", cp, co, co / cp);
    printf("%-20s %14.2f %10.2f %10.2f\n", "cold, O_DIRECT", cd, co, co / cd);
    printf("%-20s %14.2f %10.2f %10.2f\n", "warm, read()", wp, wo, wo / wp);
    double c1 = gbt / median(cold_one, reps), w1 = gbt / median(warm_one, reps);
    printf("ours on one thread: cold %.2f GB/s (%.2f of read(), %.2f of O_DIRECT), warm %.2f GB/s "
           "(%.2f of read())\n", c1, c1 / cp, c1 / cd, w1, w1 / wp);
    printf("(%d reps; read() counts %.2f GB of files, ours %.2f GB of tensors; checksum %llu)\n",
           reps, gbf, gbt, (unsigned long long)sum);

    const char *keep = getenv("KEEP");
    if (!(keep && !strcmp(keep, "1"))) {
        clear_checkpoint(dir);
        rmdir(dir);
    }
    free_files(&fl);
    return 0;
}
