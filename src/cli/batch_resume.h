/* The output file of a batch job, written so that a job killed at any
 * moment (kill -9 included) can be rerun: every finished request is one
 * complete line written with a single write() (then fdatasync, by policy);
 * on start the file is scanned, complete lines are kept, a torn last line
 * (no newline: the write was cut) is truncated away, and the custom_ids of
 * the kept lines are reported as done. */
#ifndef DI_CLI_BATCH_RESUME_H
#define DI_CLI_BATCH_RESUME_H

#include <stddef.h>

typedef struct batch_out {
    int fd;
    int sync_each;       /* fdatasync after every line */
    const char *path;
    size_t n_kept;       /* complete lines found at open */
    size_t torn_bytes;   /* bytes of a torn last line removed at open */
} batch_out;

/* Called for each complete line found at open, with its custom_id; a
 * nonzero return (after printing why) fails the open. */
typedef int (*batch_seen_fn)(void *user, const char *custom_id, size_t line_no);

/* Opens (creating) the output, locks it against a second job, scans it.
 * Prints the reason and returns -1 on failure. */
int batch_out_open(batch_out *o, const char *path, int sync_each, batch_seen_fn seen, void *user);

/* Appends one line (text without its newline): one write() of line + "\n".
 * Returns -1 (after printing) when the write failed. */
int batch_out_append(batch_out *o, const char *line, size_t len);

void batch_out_close(batch_out *o);

#endif
