/*
 * kv_cache.h - the engine's KV block allocator and prefix cache.
 *
 * The model owns the KV memory (per layer, n_blocks blocks of block_size
 * token slots); this module decides which sequence uses which block. It only
 * deals in block ids: no tensor is touched here.
 *
 * Every block is in exactly one of three states:
 *
 *   used     refcount >= 1: in the block table of one or more sequences
 *            (several when a prefix is shared: n > 1 samples, or a prefix
 *            cache hit). Shared blocks are always full, so nobody writes to
 *            them again.
 *   cached   refcount 0 but registered in the prefix cache: its K/V still
 *            holds a known token prefix and a later request may take it
 *            back with lookup(). Cached blocks sit in an LRU list and are
 *            evicted (forgotten) oldest first when alloc() finds no free one.
 *   free     refcount 0 and not registered: on the free list.
 *
 * Prefix cache keys (vLLM's automatic prefix caching): a full block's key is
 * hash(parent key, the block's block_size tokens), with a fixed root key for
 * the first block, so a key stands for the whole token prefix up to the end
 * of the block. The table stores each registered block's parent key and
 * tokens and lookup() compares them, so a 64-bit hash collision can only
 * confuse two prefixes whose parent keys collide as well.
 *
 *     cinfer_kv_cache_params p = cinfer_kv_cache_default_params();
 *     p.n_blocks = 64; p.block_size = 16; p.prefix_cache = 1;
 *     cinfer_kv_cache *kv;
 *     cinfer_kv_cache_create(&p, &kv);
 *     int32_t b = cinfer_kv_cache_alloc(kv);          // refcount 1
 *     uint64_t h = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, toks, 16);
 *     cinfer_kv_cache_publish(kv, b, CINFER_KV_ROOT_HASH, h, toks);
 *     cinfer_kv_cache_release(kv, b);                 // now cached
 *     int32_t again = cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h, toks);
 *     cinfer_kv_cache_destroy(kv);
 *
 * Thread safety: none; the engine thread owns the allocator.
 */
#ifndef CINFER_KV_CACHE_H
#define CINFER_KV_CACHE_H

#include <stdint.h>

#include "../common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_kv_cache cinfer_kv_cache;

/* Key of the empty prefix: the parent of every sequence's first block. */
#define CINFER_KV_ROOT_HASH 0x6a09e667f3bcc909ull

typedef struct {
    int n_blocks;     /* blocks in the pool, >= 1 */
    int block_size;   /* token slots per block, >= 1 */
    int prefix_cache; /* 1 = keep registered blocks for reuse after their
                         last release; 0 = publish() registers nothing */
} cinfer_kv_cache_params;

/* n_blocks 0 and block_size 16 (the caller sets n_blocks), prefix_cache 0. */
cinfer_kv_cache_params cinfer_kv_cache_default_params(void);

cinfer_status cinfer_kv_cache_create(const cinfer_kv_cache_params *p,
                                     cinfer_kv_cache **out);
/* NULL is fine. */
void cinfer_kv_cache_destroy(cinfer_kv_cache *kv);

/* A block with refcount 1: from the free list, else the least recently
 * used cached block (which is unregistered). -1 when every block is used. */
int32_t cinfer_kv_cache_alloc(cinfer_kv_cache *kv);

/* Refcount + 1 of a used block. */
void cinfer_kv_cache_retain(cinfer_kv_cache *kv, int32_t block);

/* Refcount - 1; at 0 a registered block becomes cached (most recently used
 * end of the LRU list), any other block free. */
void cinfer_kv_cache_release(cinfer_kv_cache *kv, int32_t block);

/* Key of a block: hash of the parent key and its tokens. */
uint64_t cinfer_kv_cache_hash(uint64_t parent, const int32_t *tokens, int n);

/* Finds the block registered under (parent, hash) holding exactly
 * tokens[0..block_size). On a hit the block's refcount goes up by one (a
 * cached block becomes used again) and its id is returned; -1 otherwise. */
int32_t cinfer_kv_cache_lookup(cinfer_kv_cache *kv, uint64_t parent,
                               uint64_t hash, const int32_t *tokens);

/* The block lookup() would find, without taking it or counting a hit or
 * a miss; -1 if none. */
int32_t cinfer_kv_cache_peek(const cinfer_kv_cache *kv, uint64_t parent,
                             uint64_t hash, const int32_t *tokens);

/* Registers a used, full block under (parent, hash) with its tokens
 * [block_size]. Returns 1 if registered, 0 if the prefix cache is off, the
 * block is registered already, or another block holds that key (the
 * existing one is kept; this block stays unregistered and becomes free at
 * its last release). */
int cinfer_kv_cache_publish(cinfer_kv_cache *kv, int32_t block,
                            uint64_t parent, uint64_t hash,
                            const int32_t *tokens);

typedef struct {
    int n_blocks;       /* pool size */
    int n_used;         /* refcount >= 1 */
    int n_cached;       /* refcount 0, registered, evictable */
    int n_free;         /* refcount 0, on the free list */
    uint64_t hits;      /* lookups that found a block */
    uint64_t misses;    /* lookups that found none */
    uint64_t evictions; /* cached blocks reused by alloc() */
} cinfer_kv_cache_stats;

void cinfer_kv_cache_get_stats(const cinfer_kv_cache *kv,
                               cinfer_kv_cache_stats *out);

/* Blocks alloc() can hand out now: free plus cached. */
int cinfer_kv_cache_available(const cinfer_kv_cache *kv);

/* A block's refcount (0 for cached and free blocks). */
int cinfer_kv_cache_refcount(const cinfer_kv_cache *kv, int32_t block);

/* 1 if the block is registered in the prefix cache. */
int cinfer_kv_cache_is_registered(const cinfer_kv_cache *kv, int32_t block);

/* Walks every structure (lists, table, counts) and returns 1 if they agree,
 * for tests and debug checks. O(n_blocks). */
int cinfer_kv_cache_check(const cinfer_kv_cache *kv);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_KV_CACHE_H */
