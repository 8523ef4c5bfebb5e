#include "core/error.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

di_status di_err_set(di_err *err, di_status code, const char *fmt, ...) {
    if (!err) return code;
    err->code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err->msg, sizeof err->msg, fmt, ap);
    va_end(ap);
    return code;
}

di_status di_err_prefix(di_err *err, const char *fmt, ...) {
    if (!err) return DI_ERR_INTERNAL;
    char prefix[DI_ERR_MSG_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    /* Join by hand: the result is truncated to the buffer on purpose. */
    char joined[DI_ERR_MSG_MAX];
    size_t np = strnlen(prefix, sizeof joined - 1);
    memcpy(joined, prefix, np);
    size_t nm = strnlen(err->msg, sizeof joined - 1 - np);
    memcpy(joined + np, err->msg, nm);
    joined[np + nm] = '\0';
    memcpy(err->msg, joined, sizeof err->msg);
    return err->code;
}

void di_err_clear(di_err *err) {
    if (!err) return;
    err->code = DI_OK;
    err->msg[0] = '\0';
}

const char *di_status_name(di_status code) {
    switch (code) {
    case DI_OK: return "ok";
    case DI_ERR_INVALID_ARG: return "invalid argument";
    case DI_ERR_IO: return "i/o error";
    case DI_ERR_FORMAT: return "malformed input";
    case DI_ERR_UNSUPPORTED: return "unsupported";
    case DI_ERR_NOMEM: return "out of memory";
    case DI_ERR_LIMIT: return "limit exceeded";
    case DI_ERR_NOT_FOUND: return "not found";
    case DI_ERR_STATE: return "invalid state";
    case DI_ERR_BACKEND: return "backend error";
    case DI_ERR_INTERNAL: return "internal error";
    }
    return "unknown error";
}

static _Thread_local di_err tls_last;

di_status di_err_publish(const di_err *err) {
    if (!err) return DI_OK;
    tls_last = *err;
    return err->code;
}

di_status di_err_publish_msg(di_status code, const char *fmt, ...) {
    di_err err = {0};
    err.code = code;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err.msg, sizeof err.msg, fmt, ap);
    va_end(ap);
    return di_err_publish(&err);
}

const char *di_last_error(void) { return tls_last.msg; }

di_status di_last_status(void) { return tls_last.code; }
