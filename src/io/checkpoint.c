/* Checkpoint directory: shards + index (architecture.md §8.1, ecosystem.md
 * §3.1). Every shard is mapped once; its tensors are views into the mapping
 * and the index is cross-checked against what the shards really hold, both
 * ways, so that a tensor can never silently come from the wrong file. */
#include "io/checkpoint.h"

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

#include "core/cpu_features.h"
#include "core/threadpool.h"
#include "io/checkpoint_index.h"
#include "io/name_table.h"
#include "io/safetensors.h"

#define NAME_FMT "'%.160s'"
#define SINGLE_FILE_NAME "model.safetensors"

struct di_checkpoint {
    char *dir;
    char **file_names;          /* [n_files] shard names without directory */
    di_safetensors *files;      /* [n_files] */
    size_t n_files;
    di_ckpt_tensor *tensors;    /* [n_tensors], file order then offset order */
    size_t n_tensors;
    di_name_table by_name;      /* name -> index into tensors */
    uint64_t dtype_bytes[DI_DTYPE_COUNT];
    uint64_t total_bytes;
};

static char *path_join(const char *dir, const char *name) {
    size_t a = strlen(dir), b = strlen(name);
    char *p = malloc(a + b + 2);
    if (!p) return NULL;
    memcpy(p, dir, a);
    p[a] = '/';
    memcpy(p + a + 1, name, b + 1);
    return p;
}

static int file_exists(const char *dir, const char *name) {
    char *p = path_join(dir, name);
    struct stat sb;
    int ok = p && stat(p, &sb) == 0;
    free(p);
    return ok;
}

/* Reads a whole small file (the index) into a malloc'd buffer. */
static di_status read_text(const char *path, char **out, size_t *n, di_err *err) {
    *out = NULL;
    /* O_NONBLOCK: a FIFO or device in place of a file must fail the
     * regular-file check below, not block the open. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return di_err_set(err, DI_ERR_IO, "cannot open: %s", strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        close(fd);
        return di_err_set(err, DI_ERR_IO, "not a readable regular file");
    }
    if ((uint64_t)sb.st_size > DI_ST_HEADER_MAX) {
        close(fd);
        return di_err_set(err, DI_ERR_LIMIT, "%lld bytes exceeds the limit of %llu bytes",
                          (long long)sb.st_size, DI_ST_HEADER_MAX);
    }
    size_t size = (size_t)sb.st_size, got = 0;
    char *buf = malloc(size ? size : 1);
    if (!buf) {
        close(fd);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory for %zu bytes", size);
    }
    while (got < size) {
        ssize_t r = read(fd, buf + got, size - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            int e = r < 0 ? errno : 0;
            close(fd);
            free(buf);
            return di_err_set(err, DI_ERR_IO, "read failed: %s", e ? strerror(e) : "file shrank");
        }
        got += (size_t)r;
    }
    close(fd);
    *out = buf;
    *n = size;
    return DI_OK;
}

static int cmp_str(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Without an index or model.safetensors: every *.safetensors, sorted. */
static di_status list_safetensors(const char *dir, char ***names, size_t *n, di_err *err) {
    DIR *d = opendir(dir);
    if (!d) return di_err_set(err, DI_ERR_IO, "%s: cannot list: %s", dir, strerror(errno));
    size_t cap = 0;
    di_status s = DI_OK;
    *names = NULL;
    *n = 0;
    for (struct dirent *e; (e = readdir(d)) && !s;) {
        size_t len = strlen(e->d_name);
        const char *ext = ".safetensors";
        if (len <= strlen(ext) || strcmp(e->d_name + len - strlen(ext), ext)) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            char **grown = realloc(*names, cap * sizeof *grown);
            if (!grown) {
                s = di_err_set(err, DI_ERR_NOMEM, "out of memory");
                break;
            }
            *names = grown;
        }
        if (!((*names)[*n] = strdup(e->d_name))) s = di_err_set(err, DI_ERR_NOMEM, "out of memory");
        else (*n)++;
    }
    closedir(d);
    if (!s && *n == 0)
        s = di_err_set(err, DI_ERR_NOT_FOUND,
                       "%s: no " DI_CKPT_INDEX_NAME ", " SINGLE_FILE_NAME " or *.safetensors file",
                       dir);
    if (!s) qsort(*names, *n, sizeof **names, cmp_str);
    return s;
}

/* Opens every shard once and builds the tensor table. */
static di_status open_files(di_checkpoint *ck, di_err *err) {
    ck->files = calloc(ck->n_files ? ck->n_files : 1, sizeof *ck->files);
    if (!ck->files) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    size_t total = 0;
    for (size_t i = 0; i < ck->n_files; i++) {
        char *path = path_join(ck->dir, ck->file_names[i]);
        if (!path) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
        di_status s = di_safetensors_open(path, &ck->files[i], err);
        free(path);
        if (s) return s;
        total += ck->files[i].n_entries;
    }
    ck->tensors = calloc(total ? total : 1, sizeof *ck->tensors);
    if (!ck->tensors) return di_err_set(err, DI_ERR_NOMEM, "out of memory for %zu tensors", total);
    if (total > UINT32_MAX) return di_err_set(err, DI_ERR_LIMIT, "too many tensors: %zu", total);
    di_status s = di_name_table_init(&ck->by_name, total, err);
    if (s) return s;
    for (size_t f = 0; f < ck->n_files; f++) {
        const di_safetensors *st = &ck->files[f];
        for (size_t i = 0; i < st->n_entries; i++) {
            di_ckpt_tensor *t = &ck->tensors[ck->n_tensors];
            t->name = st->entries[i].name;
            t->file = ck->file_names[f];
            di_safetensors_tensor(st, i, &t->t);
            uint32_t prev = 0;
            if (di_name_table_insert(&ck->by_name, t->name, (uint32_t)ck->n_tensors, &prev) != 1)
                return di_err_set(err, DI_ERR_FORMAT, "tensor " NAME_FMT " is in both %s and %s",
                                  t->name, ck->tensors[prev].file, t->file);
            ck->n_tensors++;
            ck->dtype_bytes[t->t.dtype] += t->t.nbytes;
            ck->total_bytes += t->t.nbytes;
        }
    }
    return DI_OK;
}

/* The index and the shards must agree exactly: same names, same files. */
static di_status check_index(const di_checkpoint *ck, const di_ckpt_index *ix, di_err *err) {
    for (size_t i = 0; i < ck->n_tensors; i++) {
        const di_ckpt_tensor *t = &ck->tensors[i];
        uint32_t k;
        if (!di_name_table_find(&ix->lookup, t->name, &k))
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT " in %s is not listed in " DI_CKPT_INDEX_NAME,
                              t->name, t->file);
        const char *want = ck->file_names[ix->file_of[k]];
        if (strcmp(want, t->file))
            return di_err_set(err, DI_ERR_FORMAT,
                              "tensor " NAME_FMT " is in %s but " DI_CKPT_INDEX_NAME " maps it to %s",
                              t->name, t->file, want);
    }
    for (size_t k = 0; k < ix->n_names; k++)
        if (!di_name_table_find(&ck->by_name, ix->names[k], NULL))
            return di_err_set(err, DI_ERR_FORMAT,
                              DI_CKPT_INDEX_NAME " lists tensor " NAME_FMT
                              " in %s, which does not contain it",
                              ix->names[k], ck->file_names[ix->file_of[k]]);
    if (ix->has_total_size && ix->total_size != ck->total_bytes)
        return di_err_set(err, DI_ERR_FORMAT,
                          DI_CKPT_INDEX_NAME ": metadata.total_size is %llu but the shards hold "
                          "%llu tensor bytes",
                          (unsigned long long)ix->total_size, (unsigned long long)ck->total_bytes);
    return DI_OK;
}

static di_status open_indexed(di_checkpoint *ck, di_err *err) {
    char *path = path_join(ck->dir, DI_CKPT_INDEX_NAME), *text = NULL;
    if (!path) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    size_t n = 0;
    di_ckpt_index ix;
    di_status s = read_text(path, &text, &n, err);
    if (!s) s = di_ckpt_index_parse(text, n, &ix, err);
    free(text);
    if (s) {
        di_err_prefix(err, "%s: ", path);
        free(path);
        return s;
    }
    free(path);
    /* The shard list moves from the index to the checkpoint (ix.file_of
     * keeps indexing it). */
    ck->file_names = ix.files;
    ck->n_files = ix.n_files;
    ix.files = NULL;
    ix.n_files = 0;
    for (size_t i = 0; i < ck->n_files && !s; i++)
        if (!file_exists(ck->dir, ck->file_names[i]))
            s = di_err_set(err, DI_ERR_NOT_FOUND,
                           "%s/" DI_CKPT_INDEX_NAME " names shard %s, which does not exist",
                           ck->dir, ck->file_names[i]);
    if (!s) s = open_files(ck, err);
    if (!s) {
        s = check_index(ck, &ix, err);
        if (s) di_err_prefix(err, "%s: ", ck->dir);
    }
    di_ckpt_index_free(&ix);
    return s;
}

di_status di_checkpoint_open(const char *dir, di_checkpoint **out, di_err *err) {
    *out = NULL;
    struct stat sb;
    if (stat(dir, &sb) != 0)
        return di_err_set(err, DI_ERR_NOT_FOUND, "%s: %s", dir, strerror(errno));
    if (!S_ISDIR(sb.st_mode)) return di_err_set(err, DI_ERR_INVALID_ARG, "%s: not a directory", dir);
    di_checkpoint *ck = calloc(1, sizeof *ck);
    if (!ck || !(ck->dir = strdup(dir))) {
        free(ck);
        return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    }
    di_status s;
    if (file_exists(dir, DI_CKPT_INDEX_NAME)) s = open_indexed(ck, err);
    else {
        if (file_exists(dir, SINGLE_FILE_NAME)) {
            ck->file_names = calloc(1, sizeof *ck->file_names);
            s = ck->file_names && (ck->file_names[0] = strdup(SINGLE_FILE_NAME))
                    ? DI_OK
                    : di_err_set(err, DI_ERR_NOMEM, "out of memory");
            if (!s) ck->n_files = 1;
        } else s = list_safetensors(dir, &ck->file_names, &ck->n_files, err);
        if (!s) s = open_files(ck, err);
    }
    if (s) {
        di_checkpoint_close(ck);
        return s;
    }
    *out = ck;
    return DI_OK;
}

void di_checkpoint_close(di_checkpoint *ck) {
    if (!ck) return;
    for (size_t i = 0; i < ck->n_files; i++) {
        if (ck->files) di_safetensors_close(&ck->files[i]);
        free(ck->file_names[i]);
    }
    free(ck->files);
    free(ck->file_names);
    free(ck->tensors);
    di_name_table_free(&ck->by_name);
    free(ck->dir);
    free(ck);
}

size_t di_checkpoint_count(const di_checkpoint *ck) { return ck->n_tensors; }

const di_ckpt_tensor *di_checkpoint_at(const di_checkpoint *ck, size_t i) {
    return i < ck->n_tensors ? &ck->tensors[i] : NULL;
}

const di_ckpt_tensor *di_checkpoint_find(const di_checkpoint *ck, const char *name) {
    uint32_t i;
    return di_name_table_find(&ck->by_name, name, &i) ? &ck->tensors[i] : NULL;
}

void di_checkpoint_drop_pages(const di_checkpoint *ck) {
    for (size_t i = 0; ck && i < ck->n_files; i++) {
        const di_safetensors *st = &ck->files[i];
        if (st->mapped && st->size) (void)madvise((void *)st->bytes, st->size, MADV_DONTNEED);
    }
}

size_t di_checkpoint_file_count(const di_checkpoint *ck) { return ck->n_files; }

const char *di_checkpoint_file_name(const di_checkpoint *ck, size_t i) {
    return i < ck->n_files ? ck->file_names[i] : NULL;
}

uint64_t di_checkpoint_file_size(const di_checkpoint *ck, size_t i) {
    return i < ck->n_files ? ck->files[i].size : 0;
}

uint64_t di_checkpoint_dtype_bytes(const di_checkpoint *ck, di_dtype dtype) {
    return (dtype > DI_DTYPE_INVALID && dtype < DI_DTYPE_COUNT) ? ck->dtype_bytes[dtype] : 0;
}

uint64_t di_checkpoint_total_bytes(const di_checkpoint *ck) { return ck->total_bytes; }

/* ---- reading every byte ---- */

/* Reading works in chunks handed to a few threads in file order. Each
 * thread asks the disk for the chunk `threads` places ahead of its own
 * (MADV_WILLNEED, asynchronous) and then maps its chunk in one call
 * (MADV_POPULATE_READ) and sums it, so several chunks are in flight and the
 * page-cache and page-table work is shared between cores. The sum is a
 * wrapping add of 64-bit words, so the split never changes the checksum.
 * Chunks start at multiples of 8 inside each data section. */
#define READ_CHUNK_BYTES ((size_t)32 << 20)
#define READ_MAX_THREADS 4

typedef struct read_chunk {
    const di_safetensors *st;
    size_t off, len;
} read_chunk;

typedef struct read_job {
    read_chunk *chunks;
    int64_t n_chunks;
    int ahead;            /* chunks between a chunk and the one it prefetches */
    uint64_t sums[64];    /* per thread */
} read_job;

static uint64_t sum_words(const uint8_t *p, size_t n) {
    uint64_t a = 0, b = 0, c = 0, d = 0;
    size_t i = 0;
    for (; i + 32 <= n; i += 32) {
        uint64_t w[4];
        memcpy(w, p + i, 32);
        a += w[0];
        b += w[1];
        c += w[2];
        d += w[3];
    }
    for (; i + 8 <= n; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        a += w;
    }
    if (i < n) {
        uint64_t w = 0;
        memcpy(&w, p + i, n - i);
        a += w;
    }
    return a + b + c + d;
}

static void advise(const di_safetensors *st, const uint8_t *from, size_t len, int how) {
    if (!st->mapped || !len) return;
    uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t lo = (uintptr_t)from & ~(page - 1);
    uintptr_t hi = (uintptr_t)st->bytes + st->size;
    if ((uintptr_t)from + len < hi) hi = (uintptr_t)from + len;
    if (hi > lo) (void)madvise((void *)lo, hi - lo, how); /* a hint: failure is harmless */
}

static void read_chunks(void *ctx, int64_t begin, int64_t end, int thread) {
    read_job *job = ctx;
    for (int64_t i = begin; i < end; i++) {
        if (i + job->ahead < job->n_chunks) {
            const read_chunk *a = &job->chunks[i + job->ahead];
            advise(a->st, a->st->data + a->off, a->len, MADV_WILLNEED);
        }
        const read_chunk *c = &job->chunks[i];
#ifdef MADV_POPULATE_READ
        advise(c->st, c->st->data + c->off, c->len, MADV_POPULATE_READ);
#endif
        job->sums[thread & 63] += sum_words(c->st->data + c->off, c->len);
    }
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

di_status di_checkpoint_read_all(const di_checkpoint *ck, di_ckpt_read_stats *out, di_err *err) {
    return di_checkpoint_read_all_threads(ck, 0, out, err);
}

di_status di_checkpoint_read_all_threads(const di_checkpoint *ck, int n_threads,
                                         di_ckpt_read_stats *out, di_err *err) {
    memset(out, 0, sizeof *out);
    if (!ck) return di_err_set(err, DI_ERR_INVALID_ARG, "NULL checkpoint");
    if (n_threads < 0 || n_threads > 64)
        return di_err_set(err, DI_ERR_INVALID_ARG, "read threads %d out of range [0, 64]", n_threads);
    if (n_threads == 0) {
        n_threads = di_cpu_count();
        if (n_threads > READ_MAX_THREADS) n_threads = READ_MAX_THREADS;
        if (n_threads < 1) n_threads = 1;
    }
    double t0 = now_seconds();
    read_job job;
    memset(&job, 0, sizeof job);
    size_t n = 0;
    for (size_t f = 0; f < ck->n_files; f++)
        n += (ck->files[f].data_size + READ_CHUNK_BYTES - 1) / READ_CHUNK_BYTES;
    job.chunks = calloc(n ? n : 1, sizeof *job.chunks);
    if (!job.chunks) return di_err_set(err, DI_ERR_NOMEM, "out of memory");
    uint64_t bytes = 0;
    for (size_t f = 0; f < ck->n_files; f++) {
        const di_safetensors *st = &ck->files[f];
        advise(st, st->data, st->data_size, MADV_SEQUENTIAL);
        for (size_t off = 0; off < st->data_size; off += READ_CHUNK_BYTES) {
            size_t left = st->data_size - off;
            job.chunks[job.n_chunks++] =
                (read_chunk){st, off, left < READ_CHUNK_BYTES ? left : READ_CHUNK_BYTES};
        }
        bytes += st->data_size;
    }
    job.ahead = n_threads;
    for (int64_t i = 0; i < job.ahead && i < job.n_chunks; i++)
        advise(job.chunks[i].st, job.chunks[i].st->data + job.chunks[i].off, job.chunks[i].len,
               MADV_WILLNEED);
    di_threadpool *tp = NULL;
    /* Without threads (creation failed) the pass still runs, on this thread. */
    if (n_threads > 1 && job.n_chunks > 1) {
        di_err ignored = {0};
        if (di_threadpool_create(n_threads, &tp, &ignored)) tp = NULL;
    }
    di_threadpool_for(tp, job.n_chunks, 1, read_chunks, &job);
    di_threadpool_destroy(tp);
    free(job.chunks);
    uint64_t sum = 0;
    for (int t = 0; t < 64; t++) sum += job.sums[t];
    out->bytes = bytes;
    out->checksum = sum;
    out->seconds = now_seconds() - t0;
    return DI_OK;
}
