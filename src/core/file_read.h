/* Whole-file reads into one heap buffer.
 *
 * Configs, tokenizers and CLI inputs are read in one piece before parsing;
 * this is the one reader they share, so size limits, NUL termination and the
 * error messages are the same everywhere. */
#ifndef DI_CORE_FILE_READ_H
#define DI_CORE_FILE_READ_H

#include <stddef.h>
#include <stdio.h>

#include "core/error.h"

/* Reads f to its end into a fresh buffer (*buf, freed by the caller) that
 * holds *len bytes plus a terminating NUL. name labels the messages. A
 * max_bytes of 0 means no limit; a stream longer than max_bytes fails with
 * DI_ERR_LIMIT. f is left open. */
di_status di_file_read_stream(FILE *f, const char *name, size_t max_bytes, char **buf, size_t *len, di_err *err);

/* The same for the file at path, opened and closed here. */
di_status di_file_read(const char *path, size_t max_bytes, char **buf, size_t *len, di_err *err);

#endif
