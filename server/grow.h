/*
 * grow.h - the doubling realloc the server's growable arrays share
 * (generate.c's and http.c's per-sample buffers, the response cache's
 * recordings).
 */
#ifndef CINFER_SERVER_GROW_H
#define CINFER_SERVER_GROW_H

#include <stdint.h>
#include <stdlib.h>

/* Makes *p hold at least `need` elements of `elem` bytes, doubling *cap
 * from 16. Returns 1 on success, 0 when out of memory or the size would
 * overflow (*p and *cap are then unchanged). */
static inline int cinfer_grow(void **p, size_t *cap, size_t need, size_t elem)
{
    if (need <= *cap)
        return 1;
    size_t n = *cap ? *cap : 16;
    while (n < need) {
        if (n > SIZE_MAX / 2)
            return 0;
        n *= 2;
    }
    if (elem && n > SIZE_MAX / elem)
        return 0;
    void *q = realloc(*p, n * elem);
    if (!q)
        return 0;
    *p = q;
    *cap = n;
    return 1;
}

#endif
