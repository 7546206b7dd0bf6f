/*
 * kv_cache.c - KV block allocator with refcounts and an LRU prefix cache.
 *
 * Everything is an array indexed by block id, so the allocator costs a few
 * bytes per block and never allocates after create:
 *
 *   ref[b]          refcount
 *   next[b],prev[b] links of the list the block is on: the free list (a
 *                   stack, next only) or the LRU list of cached blocks
 *                   (head = least recently used, doubly linked)
 *   hash/parent[b]  key of a registered block; hnext[b] chains blocks of
 *                   one bucket of the open hash table `buckets`
 *   tokens[b]       the block's tokens, compared on lookup
 *
 * All operations are O(1) apart from the bucket walk (the table has at least
 * twice as many buckets as blocks) and the token comparison on a lookup.
 */
#include "kv_cache.h"

#include <stdlib.h>
#include <string.h>

#define NIL (-1)

enum { ST_FREE = 0, ST_USED = 1, ST_CACHED = 2 };

struct cinfer_kv_cache {
    int n_blocks;
    int block_size;
    int prefix_cache;

    int32_t *ref;
    int32_t *next;
    int32_t *prev;
    uint8_t *state;
    uint8_t *registered;

    int32_t free_head;
    int n_free;
    int32_t lru_head, lru_tail; /* cached blocks, head = oldest */
    int n_cached;
    int n_used;

    /* prefix cache (only when prefix_cache) */
    uint64_t *hash;
    uint64_t *parent;
    int32_t *hnext;
    int32_t *buckets;
    uint64_t bucket_mask;
    int32_t *tokens; /* [n_blocks, block_size] */

    uint64_t hits, misses, evictions;
};

cinfer_kv_cache_params cinfer_kv_cache_default_params(void)
{
    cinfer_kv_cache_params p;
    memset(&p, 0, sizeof p);
    p.block_size = 16;
    return p;
}

void cinfer_kv_cache_destroy(cinfer_kv_cache *kv)
{
    if (!kv)
        return;
    free(kv->ref);
    free(kv->next);
    free(kv->prev);
    free(kv->state);
    free(kv->registered);
    free(kv->hash);
    free(kv->parent);
    free(kv->hnext);
    free(kv->buckets);
    free(kv->tokens);
    free(kv);
}

cinfer_status cinfer_kv_cache_create(const cinfer_kv_cache_params *p,
                                     cinfer_kv_cache **out)
{
    *out = NULL;
    if (!p)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_cache: params is NULL");
    if (p->n_blocks < 1 || p->n_blocks > (1 << 26))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_cache: n_blocks %d outside 1..%d",
                                p->n_blocks, 1 << 26);
    if (p->block_size < 1 || p->block_size > 65536)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "kv_cache: block_size %d outside 1..65536",
                                p->block_size);
    cinfer_kv_cache *kv = calloc(1, sizeof *kv);
    if (!kv)
        goto fail_nomem;
    size_t n = (size_t)p->n_blocks;
    kv->n_blocks = p->n_blocks;
    kv->block_size = p->block_size;
    kv->prefix_cache = p->prefix_cache ? 1 : 0;
    kv->ref = calloc(n, sizeof *kv->ref);
    kv->next = malloc(n * sizeof *kv->next);
    kv->prev = malloc(n * sizeof *kv->prev);
    kv->state = calloc(n, sizeof *kv->state);
    kv->registered = calloc(n, sizeof *kv->registered);
    if (!kv->ref || !kv->next || !kv->prev || !kv->state || !kv->registered)
        goto fail_nomem;
    if (kv->prefix_cache) {
        size_t nb = 16;
        while (nb < 2 * n)
            nb <<= 1;
        kv->bucket_mask = nb - 1;
        kv->hash = calloc(n, sizeof *kv->hash);
        kv->parent = calloc(n, sizeof *kv->parent);
        kv->hnext = malloc(n * sizeof *kv->hnext);
        kv->buckets = malloc(nb * sizeof *kv->buckets);
        kv->tokens = calloc(n * (size_t)p->block_size, sizeof *kv->tokens);
        if (!kv->hash || !kv->parent || !kv->hnext || !kv->buckets ||
            !kv->tokens)
            goto fail_nomem;
        for (size_t i = 0; i < nb; i++)
            kv->buckets[i] = NIL;
        for (size_t i = 0; i < n; i++)
            kv->hnext[i] = NIL;
    }
    /* Free list in ascending id order: block 0 is handed out first. */
    for (int32_t b = 0; b < kv->n_blocks; b++) {
        kv->next[b] = b + 1 < kv->n_blocks ? b + 1 : NIL;
        kv->prev[b] = NIL;
    }
    kv->free_head = 0;
    kv->n_free = kv->n_blocks;
    kv->lru_head = kv->lru_tail = NIL;
    *out = kv;
    return CINFER_OK;

fail_nomem:
    cinfer_kv_cache_destroy(kv);
    return cinfer_set_error(CINFER_E_NOMEM, "kv_cache: out of memory");
}

/* ---------------------------------------------------------------------- */
/* lists                                                                  */
/* ---------------------------------------------------------------------- */

static void lru_remove(cinfer_kv_cache *kv, int32_t b)
{
    int32_t p = kv->prev[b], n = kv->next[b];
    if (p != NIL)
        kv->next[p] = n;
    else
        kv->lru_head = n;
    if (n != NIL)
        kv->prev[n] = p;
    else
        kv->lru_tail = p;
    kv->prev[b] = kv->next[b] = NIL;
    kv->n_cached--;
}

static void lru_push_tail(cinfer_kv_cache *kv, int32_t b)
{
    kv->prev[b] = kv->lru_tail;
    kv->next[b] = NIL;
    if (kv->lru_tail != NIL)
        kv->next[kv->lru_tail] = b;
    else
        kv->lru_head = b;
    kv->lru_tail = b;
    kv->n_cached++;
}

static void free_push(cinfer_kv_cache *kv, int32_t b)
{
    kv->next[b] = kv->free_head;
    kv->prev[b] = NIL;
    kv->free_head = b;
    kv->n_free++;
}

static void unregister(cinfer_kv_cache *kv, int32_t b)
{
    int32_t *pp = &kv->buckets[kv->hash[b] & kv->bucket_mask];
    while (*pp != NIL && *pp != b)
        pp = &kv->hnext[*pp];
    CINFER_ASSERT(*pp == b);
    *pp = kv->hnext[b];
    kv->hnext[b] = NIL;
    kv->registered[b] = 0;
}

/* ---------------------------------------------------------------------- */
/* allocation                                                             */
/* ---------------------------------------------------------------------- */

int32_t cinfer_kv_cache_alloc(cinfer_kv_cache *kv)
{
    int32_t b;
    if (kv->free_head != NIL) {
        b = kv->free_head;
        kv->free_head = kv->next[b];
        kv->next[b] = NIL;
        kv->n_free--;
    } else if (kv->lru_head != NIL) {
        b = kv->lru_head;
        lru_remove(kv, b);
        unregister(kv, b);
        kv->evictions++;
    } else {
        return NIL;
    }
    kv->state[b] = ST_USED;
    kv->ref[b] = 1;
    kv->n_used++;
    return b;
}

void cinfer_kv_cache_retain(cinfer_kv_cache *kv, int32_t b)
{
    CINFER_ASSERT(b >= 0 && b < kv->n_blocks && kv->state[b] == ST_USED);
    kv->ref[b]++;
}

void cinfer_kv_cache_release(cinfer_kv_cache *kv, int32_t b)
{
    CINFER_ASSERT(b >= 0 && b < kv->n_blocks && kv->state[b] == ST_USED &&
                  kv->ref[b] > 0);
    if (--kv->ref[b] > 0)
        return;
    kv->n_used--;
    if (kv->registered[b]) {
        kv->state[b] = ST_CACHED;
        lru_push_tail(kv, b);
    } else {
        kv->state[b] = ST_FREE;
        free_push(kv, b);
    }
}

/* ---------------------------------------------------------------------- */
/* prefix cache                                                           */
/* ---------------------------------------------------------------------- */

static inline uint64_t mix64(uint64_t x)
{
    /* splitmix64's finalizer */
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return x;
}

uint64_t cinfer_kv_cache_hash(uint64_t parent, const int32_t *tokens, int n)
{
    uint64_t h = mix64(parent ^ ((uint64_t)(uint32_t)n << 32));
    for (int i = 0; i < n; i++)
        h = mix64(h + (uint64_t)(uint32_t)tokens[i] + 0x9e3779b97f4a7c15ull);
    return h;
}

static int32_t find(const cinfer_kv_cache *kv, uint64_t parent, uint64_t hash,
                    const int32_t *tokens)
{
    size_t bs = (size_t)kv->block_size;
    for (int32_t b = kv->buckets[hash & kv->bucket_mask]; b != NIL;
         b = kv->hnext[b]) {
        if (kv->hash[b] == hash && kv->parent[b] == parent &&
            memcmp(kv->tokens + (size_t)b * bs, tokens,
                   bs * sizeof *tokens) == 0)
            return b;
    }
    return NIL;
}

int32_t cinfer_kv_cache_lookup(cinfer_kv_cache *kv, uint64_t parent,
                               uint64_t hash, const int32_t *tokens)
{
    if (!kv->prefix_cache)
        return NIL;
    int32_t b = find(kv, parent, hash, tokens);
    if (b == NIL) {
        kv->misses++;
        return NIL;
    }
    kv->hits++;
    if (kv->state[b] == ST_CACHED) {
        lru_remove(kv, b);
        kv->state[b] = ST_USED;
        kv->ref[b] = 1;
        kv->n_used++;
    } else {
        kv->ref[b]++;
    }
    return b;
}

int32_t cinfer_kv_cache_peek(const cinfer_kv_cache *kv, uint64_t parent,
                             uint64_t hash, const int32_t *tokens)
{
    return kv->prefix_cache ? find(kv, parent, hash, tokens) : NIL;
}

int cinfer_kv_cache_publish(cinfer_kv_cache *kv, int32_t b, uint64_t parent,
                            uint64_t hash, const int32_t *tokens)
{
    CINFER_ASSERT(b >= 0 && b < kv->n_blocks && kv->state[b] == ST_USED);
    if (!kv->prefix_cache || kv->registered[b])
        return 0;
    if (find(kv, parent, hash, tokens) != NIL)
        return 0;
    size_t bs = (size_t)kv->block_size;
    kv->hash[b] = hash;
    kv->parent[b] = parent;
    memcpy(kv->tokens + (size_t)b * bs, tokens, bs * sizeof *tokens);
    int32_t *head = &kv->buckets[hash & kv->bucket_mask];
    kv->hnext[b] = *head;
    *head = b;
    kv->registered[b] = 1;
    return 1;
}

/* ---------------------------------------------------------------------- */
/* introspection                                                          */
/* ---------------------------------------------------------------------- */

void cinfer_kv_cache_get_stats(const cinfer_kv_cache *kv,
                               cinfer_kv_cache_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_blocks = kv->n_blocks;
    out->n_used = kv->n_used;
    out->n_cached = kv->n_cached;
    out->n_free = kv->n_free;
    out->hits = kv->hits;
    out->misses = kv->misses;
    out->evictions = kv->evictions;
}

int cinfer_kv_cache_available(const cinfer_kv_cache *kv)
{
    return kv->n_free + kv->n_cached;
}

int cinfer_kv_cache_refcount(const cinfer_kv_cache *kv, int32_t b)
{
    if (b < 0 || b >= kv->n_blocks)
        return 0;
    return kv->ref[b];
}

int cinfer_kv_cache_is_registered(const cinfer_kv_cache *kv, int32_t b)
{
    if (b < 0 || b >= kv->n_blocks)
        return 0;
    return kv->registered[b];
}

int cinfer_kv_cache_check(const cinfer_kv_cache *kv)
{
    int n_used = 0, n_cached = 0, n_free = 0, n_reg = 0;
    for (int32_t b = 0; b < kv->n_blocks; b++) {
        switch (kv->state[b]) {
        case ST_USED:
            if (kv->ref[b] < 1)
                return 0;
            n_used++;
            break;
        case ST_CACHED:
            if (kv->ref[b] != 0 || !kv->registered[b])
                return 0;
            n_cached++;
            break;
        case ST_FREE:
            if (kv->ref[b] != 0 || kv->registered[b])
                return 0;
            n_free++;
            break;
        default:
            return 0;
        }
        if (kv->registered[b]) {
            n_reg++;
            if (find(kv, kv->parent[b], kv->hash[b],
                     kv->tokens + (size_t)b * (size_t)kv->block_size) != b)
                return 0;
        }
    }
    if (n_used != kv->n_used || n_cached != kv->n_cached ||
        n_free != kv->n_free || n_used + n_cached + n_free != kv->n_blocks)
        return 0;
    int walked = 0;
    for (int32_t b = kv->free_head; b != NIL; b = kv->next[b]) {
        if (kv->state[b] != ST_FREE || ++walked > kv->n_blocks)
            return 0;
    }
    if (walked != n_free)
        return 0;
    walked = 0;
    int32_t prev = NIL;
    for (int32_t b = kv->lru_head; b != NIL; b = kv->next[b]) {
        if (kv->state[b] != ST_CACHED || kv->prev[b] != prev ||
            ++walked > kv->n_blocks)
            return 0;
        prev = b;
    }
    if (walked != n_cached || prev != kv->lru_tail)
        return 0;
    if (kv->prefix_cache) {
        int chained = 0;
        for (uint64_t i = 0; i <= kv->bucket_mask; i++) {
            for (int32_t b = kv->buckets[i]; b != NIL; b = kv->hnext[b]) {
                if (!kv->registered[b] ||
                    (kv->hash[b] & kv->bucket_mask) != i ||
                    ++chained > kv->n_blocks)
                    return 0;
            }
        }
        if (chained != n_reg)
            return 0;
    }
    return 1;
}
