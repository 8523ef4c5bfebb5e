/* Resumable output of `deepinfer batch` (see batch_resume.h). */
#include "cli/batch_resume.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

static int fail(const char *path, const char *what) {
    fprintf(stderr, "deepinfer batch: %s: %s: %s\n", path, what, strerror(errno));
    return -1;
}

/* Reads the whole file at fd (from offset 0). */
static char *read_fd(int fd, size_t *len) {
    struct stat sb;
    if (fstat(fd, &sb)) return NULL;
    size_t n = (size_t)sb.st_size, got = 0;
    char *buf = malloc(n + 1);
    if (!buf) return NULL;
    while (got < n) {
        ssize_t r = pread(fd, buf + got, n - got, (off_t)got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return NULL;
        }
        got += (size_t)r;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

static int scan(batch_out *o, const char *buf, size_t len, batch_seen_fn seen, void *user) {
    size_t line_no = 0, pos = 0;
    while (pos < len) {
        const char *nl = memchr(buf + pos, '\n', len - pos);
        if (!nl) break; /* torn tail, handled by the caller */
        size_t n = (size_t)(nl - (buf + pos));
        line_no++;
        if (n) {
            cJSON *j = cJSON_ParseWithLength(buf + pos, n);
            const cJSON *cid = j ? cJSON_GetObjectItemCaseSensitive(j, "custom_id") : NULL;
            if (!cJSON_IsString(cid)) {
                fprintf(stderr, "deepinfer batch: %s:%zu: not an output line of a batch job (no custom_id); "
                                "refusing to append to it\n", o->path, line_no);
                cJSON_Delete(j);
                return -1;
            }
            int r = seen(user, cid->valuestring, line_no);
            cJSON_Delete(j);
            if (r) return -1;
            o->n_kept++;
        }
        pos += n + 1;
    }
    return 0;
}

int batch_out_open(batch_out *o, const char *path, int sync_each, batch_seen_fn seen, void *user) {
    memset(o, 0, sizeof *o);
    o->path = path;
    o->sync_each = sync_each;
    o->fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (o->fd < 0) return fail(path, "cannot open");
    if (flock(o->fd, LOCK_EX | LOCK_NB)) {
        fprintf(stderr, "deepinfer batch: %s: another batch job is writing this file\n", path);
        close(o->fd);
        o->fd = -1;
        return -1;
    }
    size_t len = 0;
    char *buf = read_fd(o->fd, &len);
    if (!buf) {
        fail(path, "cannot read");
        batch_out_close(o);
        return -1;
    }
    /* Everything after the last newline is a line whose write was cut. */
    size_t keep = len;
    while (keep > 0 && buf[keep - 1] != '\n') keep--;
    int st = scan(o, buf, keep, seen, user);
    free(buf);
    if (st) {
        batch_out_close(o);
        return -1;
    }
    if (keep < len) {
        o->torn_bytes = len - keep;
        if (ftruncate(o->fd, (off_t)keep) || fsync(o->fd)) {
            fail(path, "cannot truncate the torn last line");
            batch_out_close(o);
            return -1;
        }
    }
    if (lseek(o->fd, 0, SEEK_END) < 0) {
        fail(path, "seek");
        batch_out_close(o);
        return -1;
    }
    return 0;
}

int batch_out_append(batch_out *o, const char *line, size_t len) {
    char *buf = malloc(len + 1);
    if (!buf) {
        fprintf(stderr, "deepinfer batch: out of memory\n");
        return -1;
    }
    memcpy(buf, line, len);
    buf[len] = '\n';
    size_t done = 0;
    /* One write() of the whole line; a regular file takes it in one piece
     * unless the disk is full, and a short write is finished here (a kill in
     * between leaves a torn line, which the next open removes). */
    while (done < len + 1) {
        ssize_t r = write(o->fd, buf + done, len + 1 - done);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            free(buf);
            return fail(o->path, "write failed");
        }
        done += (size_t)r;
    }
    free(buf);
    if (o->sync_each && fdatasync(o->fd)) return fail(o->path, "fdatasync failed");
    return 0;
}

void batch_out_close(batch_out *o) {
    if (o->fd >= 0) {
        fsync(o->fd);
        close(o->fd);
    }
    o->fd = -1;
}
