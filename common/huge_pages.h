/*
 * huge_pages.h - anonymous memory in 2 MiB-aligned transparent huge pages.
 *
 * Weights streamed from memory at every decode step run faster from huge
 * pages (fewer TLB misses: F16 decode at one thread about a fifth faster
 * than from a 4 KiB-page file mapping). Kernels whose transparent huge
 * pages are set to "madvise" give them only to ranges that ask
 * (MADV_HUGEPAGE); where there are none, the pages are ordinary ones.
 *
 *     size_t len;
 *     void *p = cinfer_huge_alloc(n, &len);   // zeroed, NULL if no memory
 *     ...
 *     cinfer_huge_free(p, len);
 */
#ifndef CINFER_HUGE_PAGES_H
#define CINFER_HUGE_PAGES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_HUGE_PAGE_BYTES ((size_t)2 << 20)

/* At least n bytes (n > 0), 2 MiB aligned, zero filled, asked to be in huge
 * pages; *len gets the mapped length (n rounded up to 2 MiB) for
 * cinfer_huge_free. NULL (errno set) when out of memory. */
void *cinfer_huge_alloc(size_t n, size_t *len);

/* Unmaps memory from cinfer_huge_alloc (NULL is fine). */
void cinfer_huge_free(void *p, size_t len);

/* Returns the whole pages inside [p, p + n) to the system: the caller will
 * not read those bytes again (anonymous pages read back as zeros; file
 * mappings re-read the file). Best effort. */
void cinfer_pages_release(const void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_HUGE_PAGES_H */
