/* Test fixtures: files in tests/data (any test), configs parsed from them
 * and the golden tiny checkpoint's index. */
#ifndef DI_TEST_MODEL_FIXTURES_H
#define DI_TEST_MODEL_FIXTURES_H

#include <stddef.h>
#include <stdint.h>

#include "model/config.h"

/* tests/data/<name>, found from the repository root or a build folder;
 * malloc'd and NUL-terminated, NULL (with a message) when missing; n may
 * be NULL. */
char *fixture_read(const char *name, size_t *n);

/* Parses tests/data/<name> as a config; 1 on success, 0 with a message. */
int fixture_config(const char *name, di_config *out);

/* <shared>/golden/v41-tiny/model.safetensors.index.json as a malloc'd
 * string, NULL when absent. */
char *fixture_golden_index(const char *shared);

#endif
