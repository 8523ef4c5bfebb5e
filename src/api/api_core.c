/* Public API glue that belongs to no single module: version, di_free. */
#include <stdlib.h>

#include "deepinfer.h"

#define DI_VERSION_STRING "0.1.0"

const char *di_version(void) { return DI_VERSION_STRING; }

void di_free(void *p) { free(p); }
