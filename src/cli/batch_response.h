/* Output lines of `deepinfer batch` in the OpenAI Batch API format:
 *   {"id", "custom_id", "response": {"status_code": 200, "request_id",
 *    "body": chat.completion}, "error": null}
 * or, for a request that could not be served,
 *   {"id", "custom_id", "response": null, "error": {"code", "message"}}.
 * Ids are derived from the custom_id, so a rerun writes the same line. */
#ifndef DI_CLI_BATCH_RESPONSE_H
#define DI_CLI_BATCH_RESPONSE_H

#include <stdint.h>

#include "deepinfer.h"

/* 64-bit FNV-1a of a string: the ids and the default seeds of a job. */
uint64_t batch_hash(const char *s);

/* The line of a finished request (NULL when out of memory); free(). */
char *batch_response_line(const di_engine *e, uint64_t id, const char *custom_id, const char *model);

/* The line of a refused or failed request; free(). */
char *batch_error_line(const char *custom_id, const char *code, const char *message);

#endif
