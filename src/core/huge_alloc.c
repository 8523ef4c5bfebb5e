/* Large blocks of memory on 2 MB transparent huge pages (huge_alloc.h). */
#include "core/huge_alloc.h"

#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>

void *di_huge_alloc(size_t bytes) {
    if (bytes == 0 || bytes > SIZE_MAX - DI_HUGE_PAGE) return NULL;
    /* aligned_alloc takes a whole number of alignments */
    if (bytes < DI_HUGE_PAGE) return aligned_alloc(64, (bytes + 63) & ~(size_t)63);
    bytes = (bytes + DI_HUGE_PAGE - 1) & ~(size_t)(DI_HUGE_PAGE - 1);
    void *p = aligned_alloc(DI_HUGE_PAGE, bytes);
#ifdef MADV_HUGEPAGE
    if (p) (void)madvise(p, bytes, MADV_HUGEPAGE);
#endif
    return p;
}
