/* Large blocks of memory on 2 MB transparent huge pages.
 *
 * Data that a kernel streams through, or walks in strides across many
 * megabytes, pays a page walk for every 4 KB page its loads touch once the
 * second-level TLB is exhausted; on 2 MB pages there are 512 times fewer.
 * Linux gives anonymous memory huge pages where it is advised
 * (MADV_HUGEPAGE) in its default "madvise" mode, and everywhere in
 * "always" mode; in "never" mode, or on other systems, the block simply
 * stays on small pages: the advice is a hint, never a requirement. */
#ifndef DI_CORE_HUGE_ALLOC_H
#define DI_CORE_HUGE_ALLOC_H

#include <stddef.h>

enum { DI_HUGE_PAGE = 2 << 20 };

/* bytes (> 0) of uninitialised memory, 64-byte aligned; from DI_HUGE_PAGE
 * up, 2 MB aligned, a whole number of 2 MB pages, and advised as huge
 * pages. Released with free(). NULL when the memory is not there. */
void *di_huge_alloc(size_t bytes);

#endif
