/* Error plumbing shared by every module.
 *
 * The library never prints and never exits. A function that can fail returns a
 * di_status (0 = success) and, when it fails, writes a human-readable message
 * into the di_err the caller passed. Messages are built innermost-first and
 * outer layers may prefix context ("layers.3.attn.wq_a.weight: ..."), so the
 * final text names the thing that was wrong and where it was found. */
#ifndef DI_CORE_ERROR_H
#define DI_CORE_ERROR_H

#include <stddef.h>
#include "deepinfer.h" /* di_status codes */

#define DI_ERR_MSG_MAX 1024

typedef struct di_err {
    di_status code;             /* DI_OK when nothing failed */
    char msg[DI_ERR_MSG_MAX];   /* NUL-terminated, empty when code == DI_OK */
} di_err;

/* Sets err (if non-NULL) to code + formatted message and returns code, so a
 * failing path can be written `return di_err_set(err, DI_ERR_IO, "...", ...);`. */
di_status di_err_set(di_err *err, di_status code, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Prefixes the existing message with formatted context ("file.safetensors: ")
 * and returns the existing code. */
di_status di_err_prefix(di_err *err, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

void di_err_clear(di_err *err);

/* Name of a status code ("invalid argument", ...). Never NULL. */
const char *di_status_name(di_status code);

/* Copies err into the calling thread's "last error" slot, which the public
 * API exposes through di_last_error(). Returns err->code. */
di_status di_err_publish(const di_err *err);

/* di_err_set on a fresh di_err, then di_err_publish: for public API
 * functions that fail before any inner call filled an error. */
di_status di_err_publish_msg(di_status code, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
