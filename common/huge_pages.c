/*
 * huge_pages.c - anonymous memory in 2 MiB-aligned transparent huge pages.
 */
#include "huge_pages.h"

#include <errno.h>
#include <stdint.h>
#include <sys/mman.h>
#include <unistd.h>

void *cinfer_huge_alloc(size_t n, size_t *len)
{
    const size_t H = CINFER_HUGE_PAGE_BYTES;
    if (n == 0 || n > SIZE_MAX - 2 * H) {
        errno = ENOMEM;
        return NULL;
    }
    const size_t want = (n + H - 1) / H * H;
    uint8_t *raw = mmap(NULL, want + H, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (raw == MAP_FAILED)
        return NULL;
    /* keep the aligned part only */
    uint8_t *buf = (uint8_t *)(((uintptr_t)raw + H - 1) / H * H);
    if (buf > raw)
        munmap(raw, (size_t)(buf - raw));
    munmap(buf + want, (size_t)(raw + H - buf)); /* at least one page */
#ifdef MADV_HUGEPAGE
    (void)madvise(buf, want, MADV_HUGEPAGE);
#endif
    *len = want;
    return buf;
}

void cinfer_huge_free(void *p, size_t len)
{
    if (p)
        munmap(p, len);
}

void cinfer_pages_release(const void *p, size_t n)
{
    long ps = sysconf(_SC_PAGESIZE);
    size_t page = ps > 0 ? (size_t)ps : 4096;
    uintptr_t a = ((uintptr_t)p + page - 1) / page * page;
    uintptr_t b = ((uintptr_t)p + n) / page * page;
    if (b > a)
        (void)madvise((void *)a, (size_t)(b - a), MADV_DONTNEED);
}
