/*
 * test_kv_cache.c - the KV block allocator: allocation and exhaustion,
 * refcounts, prefix-cache hits and misses, LRU eviction order, and a random
 * walk checked against a simple model after every operation.
 */
#include "engine/kv_cache.h"
#include "harness.h"

#include <stdlib.h>

static cinfer_kv_cache *make(int n_blocks, int block_size, int prefix)
{
    cinfer_kv_cache_params p = cinfer_kv_cache_default_params();
    p.n_blocks = n_blocks;
    p.block_size = block_size;
    p.prefix_cache = prefix;
    cinfer_kv_cache *kv = NULL;
    CHECK_OK(cinfer_kv_cache_create(&p, &kv));
    return kv;
}

static void test_bad_params(void)
{
    cinfer_kv_cache_params p = cinfer_kv_cache_default_params();
    cinfer_kv_cache *kv = (cinfer_kv_cache *)1;
    CHECK_EQ_INT(cinfer_kv_cache_create(&p, &kv), CINFER_E_INVALID_ARG);
    CHECK(kv == NULL);
    CHECK(strstr(cinfer_last_error(), "n_blocks") != NULL);
    p.n_blocks = 4;
    p.block_size = 0;
    CHECK_EQ_INT(cinfer_kv_cache_create(&p, &kv), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "block_size") != NULL);
    cinfer_kv_cache_destroy(NULL);
}

static void test_alloc_exhaust_free(void)
{
    cinfer_kv_cache *kv = make(4, 16, 0);
    int32_t b[4];
    for (int i = 0; i < 4; i++) {
        b[i] = cinfer_kv_cache_alloc(kv);
        CHECK_EQ_INT(b[i], i); /* ascending on a fresh cache */
        CHECK_EQ_INT(cinfer_kv_cache_refcount(kv, b[i]), 1);
    }
    CHECK_EQ_INT(cinfer_kv_cache_available(kv), 0);
    CHECK_EQ_INT(cinfer_kv_cache_alloc(kv), -1);
    cinfer_kv_cache_stats st;
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_used, 4);
    CHECK_EQ_INT(st.n_free, 0);
    cinfer_kv_cache_release(kv, b[2]);
    CHECK_EQ_INT(cinfer_kv_cache_available(kv), 1);
    CHECK_EQ_INT(cinfer_kv_cache_alloc(kv), 2);
    for (int i = 0; i < 4; i++)
        cinfer_kv_cache_release(kv, b[i]);
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK_EQ_INT(st.n_free, 4);
    CHECK(cinfer_kv_cache_check(kv));
    cinfer_kv_cache_destroy(kv);
}

static void test_refcount_sharing(void)
{
    cinfer_kv_cache *kv = make(3, 4, 0);
    int32_t a = cinfer_kv_cache_alloc(kv);
    cinfer_kv_cache_retain(kv, a);
    cinfer_kv_cache_retain(kv, a);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(kv, a), 3);
    cinfer_kv_cache_release(kv, a);
    cinfer_kv_cache_release(kv, a);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(kv, a), 1);
    CHECK_EQ_INT(cinfer_kv_cache_available(kv), 2);
    cinfer_kv_cache_release(kv, a);
    CHECK_EQ_INT(cinfer_kv_cache_available(kv), 3);
    CHECK(cinfer_kv_cache_check(kv));
    cinfer_kv_cache_destroy(kv);
}

static void test_hash_chain(void)
{
    int32_t t1[4] = {1, 2, 3, 4}, t2[4] = {1, 2, 3, 5};
    uint64_t r = CINFER_KV_ROOT_HASH;
    uint64_t h1 = cinfer_kv_cache_hash(r, t1, 4);
    CHECK(h1 == cinfer_kv_cache_hash(r, t1, 4));
    CHECK(h1 != cinfer_kv_cache_hash(r, t2, 4));
    /* the same tokens under a different parent are a different prefix */
    CHECK(cinfer_kv_cache_hash(h1, t1, 4) != h1);
    CHECK(cinfer_kv_cache_hash(h1, t1, 4) !=
          cinfer_kv_cache_hash(cinfer_kv_cache_hash(r, t2, 4), t1, 4));
}

static void test_prefix_hit_and_miss(void)
{
    cinfer_kv_cache *kv = make(4, 4, 1);
    int32_t t1[4] = {10, 11, 12, 13}, t2[4] = {20, 21, 22, 23};
    uint64_t r = CINFER_KV_ROOT_HASH;
    uint64_t h1 = cinfer_kv_cache_hash(r, t1, 4);
    uint64_t h2 = cinfer_kv_cache_hash(h1, t2, 4);

    int32_t a = cinfer_kv_cache_alloc(kv), b = cinfer_kv_cache_alloc(kv);
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, a, r, h1, t1), 1);
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, a, r, h1, t1), 0); /* again */
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, b, h1, h2, t2), 1);

    /* a hit on a used block shares it */
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, r, h1, t1), a);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(kv, a), 2);
    cinfer_kv_cache_release(kv, a);

    /* another block with the same content is not registered twice */
    int32_t c = cinfer_kv_cache_alloc(kv);
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, c, r, h1, t1), 0);
    CHECK(!cinfer_kv_cache_is_registered(kv, c));

    /* released registered blocks are cached, not free */
    cinfer_kv_cache_release(kv, a);
    cinfer_kv_cache_release(kv, b);
    cinfer_kv_cache_release(kv, c);
    cinfer_kv_cache_stats st;
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK_EQ_INT(st.n_cached, 2);
    CHECK_EQ_INT(st.n_free, 2);
    CHECK_EQ_INT(cinfer_kv_cache_available(kv), 4);

    /* misses: wrong tokens, wrong parent, unknown hash */
    int32_t t1x[4] = {10, 11, 12, 99};
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, r, h1, t1x), -1);
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, h2, h1, t1), -1);
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, r, h1 ^ 1, t1), -1);

    /* a cached block comes back with refcount 1 */
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, h1, h2, t2), b);
    CHECK_EQ_INT(cinfer_kv_cache_refcount(kv, b), 1);
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_cached, 1);
    CHECK_EQ_INT(st.hits, 2);
    CHECK_EQ_INT(st.misses, 3);
    cinfer_kv_cache_release(kv, b);
    CHECK(cinfer_kv_cache_check(kv));
    cinfer_kv_cache_destroy(kv);
}

static void test_prefix_off(void)
{
    cinfer_kv_cache *kv = make(2, 4, 0);
    int32_t t[4] = {1, 2, 3, 4};
    uint64_t h = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, t, 4);
    int32_t a = cinfer_kv_cache_alloc(kv);
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, a, CINFER_KV_ROOT_HASH, h, t), 0);
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h, t), -1);
    cinfer_kv_cache_release(kv, a);
    cinfer_kv_cache_stats st;
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_cached, 0);
    CHECK_EQ_INT(st.n_free, 2);
    cinfer_kv_cache_destroy(kv);
}

static void test_lru_eviction(void)
{
    /* 3 blocks, all registered and released in the order 1, 0, 2: alloc
     * must evict 1 first, then 0, then 2, and the evicted keys miss. */
    cinfer_kv_cache *kv = make(3, 2, 1);
    int32_t toks[3][2] = {{1, 1}, {2, 2}, {3, 3}};
    uint64_t h[3];
    int32_t b[3];
    for (int i = 0; i < 3; i++) {
        b[i] = cinfer_kv_cache_alloc(kv);
        h[i] = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, toks[i], 2);
        CHECK_EQ_INT(cinfer_kv_cache_publish(kv, b[i], CINFER_KV_ROOT_HASH,
                                             h[i], toks[i]),
                     1);
    }
    cinfer_kv_cache_release(kv, b[1]);
    cinfer_kv_cache_release(kv, b[0]);
    cinfer_kv_cache_release(kv, b[2]);
    /* touching 0 (hit then release) makes it the most recent */
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h[0], toks[0]),
                 b[0]);
    cinfer_kv_cache_release(kv, b[0]);
    /* order now: 1, 2, 0 */
    int32_t x = cinfer_kv_cache_alloc(kv);
    CHECK_EQ_INT(x, b[1]);
    CHECK(!cinfer_kv_cache_is_registered(kv, x));
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h[1], toks[1]),
                 -1);
    int32_t y = cinfer_kv_cache_alloc(kv);
    CHECK_EQ_INT(y, b[2]);
    CHECK_EQ_INT(cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h[0], toks[0]),
                 b[0]); /* still cached */
    CHECK_EQ_INT(cinfer_kv_cache_alloc(kv), -1); /* 0 is used now */
    cinfer_kv_cache_stats st;
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.evictions, 2);
    CHECK_EQ_INT(st.n_used, 3);
    /* the evicted block can be registered under a new key */
    int32_t t4[2] = {4, 4};
    uint64_t h4 = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, t4, 2);
    CHECK_EQ_INT(cinfer_kv_cache_publish(kv, x, CINFER_KV_ROOT_HASH, h4, t4),
                 1);
    cinfer_kv_cache_release(kv, x);
    cinfer_kv_cache_release(kv, y);
    cinfer_kv_cache_release(kv, b[0]);
    CHECK(cinfer_kv_cache_check(kv));
    cinfer_kv_cache_destroy(kv);
}

/* Random operations against a shadow model of refcounts and registrations;
 * the allocator's own consistency check runs after each one. */
static void test_random_walk(void)
{
    enum { NB = 24, BS = 2, KEYS = 40 };
    cinfer_kv_cache *kv = make(NB, BS, 1);
    int ref[NB] = {0};
    int key_of[NB]; /* registered key index or -1 */
    int32_t held[4096];
    int n_held = 0;
    for (int i = 0; i < NB; i++)
        key_of[i] = -1;
    uint64_t rng = 12345;
    int bad = 0;
    for (int it = 0; it < 20000 && !bad; it++) {
        int op = (int)(harness_rand(&rng) % 4);
        if (op == 0) {
            int32_t b = cinfer_kv_cache_alloc(kv);
            int avail = 0;
            for (int i = 0; i < NB; i++)
                avail += ref[i] == 0;
            if (b < 0) {
                bad |= avail != 0;
            } else {
                bad |= ref[b] != 0;
                ref[b] = 1;
                key_of[b] = -1; /* evicted or was free */
                if (n_held < 4096)
                    held[n_held++] = b;
                else
                    cinfer_kv_cache_release(kv, b), ref[b] = 0;
            }
        } else if (op == 1 && n_held > 0) {
            int i = (int)(harness_rand(&rng) % (uint64_t)n_held);
            int32_t b = held[i];
            held[i] = held[--n_held];
            cinfer_kv_cache_release(kv, b);
            ref[b]--;
        } else if (op == 2 && n_held > 0) {
            int32_t b = held[harness_rand(&rng) % (uint64_t)n_held];
            int k = (int)(harness_rand(&rng) % KEYS);
            int32_t t[BS] = {k, k * 7};
            uint64_t h = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, t, BS);
            int owner = -1;
            for (int j = 0; j < NB; j++)
                if (key_of[j] == k)
                    owner = j;
            int r = cinfer_kv_cache_publish(kv, b, CINFER_KV_ROOT_HASH, h, t);
            int expect = key_of[b] < 0 && owner < 0;
            bad |= r != expect;
            if (r)
                key_of[b] = k;
        } else if (op == 3) {
            int k = (int)(harness_rand(&rng) % KEYS);
            int32_t t[BS] = {k, k * 7};
            uint64_t h = cinfer_kv_cache_hash(CINFER_KV_ROOT_HASH, t, BS);
            int owner = -1;
            for (int j = 0; j < NB; j++)
                if (key_of[j] == k)
                    owner = j;
            int32_t b = cinfer_kv_cache_lookup(kv, CINFER_KV_ROOT_HASH, h, t);
            bad |= b != owner;
            if (b >= 0) {
                ref[b]++;
                if (n_held < 4096)
                    held[n_held++] = b;
                else
                    cinfer_kv_cache_release(kv, b), ref[b]--;
            }
        }
        for (int i = 0; i < NB && !bad; i++)
            bad |= cinfer_kv_cache_refcount(kv, i) != ref[i] ||
                   cinfer_kv_cache_is_registered(kv, i) != (key_of[i] >= 0);
        bad |= !cinfer_kv_cache_check(kv);
        if (bad)
            fprintf(stderr, "random walk diverged at op %d\n", it);
    }
    CHECK(!bad);
    while (n_held > 0)
        cinfer_kv_cache_release(kv, held[--n_held]);
    cinfer_kv_cache_stats st;
    cinfer_kv_cache_get_stats(kv, &st);
    CHECK_EQ_INT(st.n_used, 0);
    CHECK(cinfer_kv_cache_check(kv));
    cinfer_kv_cache_destroy(kv);
}

int main(void)
{
    RUN(test_bad_params);
    RUN(test_alloc_exhaust_free);
    RUN(test_refcount_sharing);
    RUN(test_hash_chain);
    RUN(test_prefix_hit_and_miss);
    RUN(test_prefix_off);
    RUN(test_lru_eviction);
    RUN(test_random_walk);
    return harness_done();
}
