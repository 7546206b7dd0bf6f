/*
 * test_client_table.c - the bounded per-client bucket table: a new client
 * starts full, clients are separate, least recently used eviction, a
 * million distinct ids through a small table stay bounded, ids that are too
 * long are refused without a change, and random operations agree with a
 * plain reference LRU.
 */
#include "resilience/resilience.h"
#include "tests/unit/harness.h"

static cinfer_client_table *make(size_t cap, double rate, uint64_t burst)
{
    cinfer_client_table_params p = cinfer_client_table_default_params();
    p.max_clients = cap;
    p.bucket.rate_per_s = rate;
    p.bucket.burst = burst;
    p.hash_seed[0] = 0x1234;
    p.hash_seed[1] = 0x5678;
    cinfer_client_table *t = NULL;
    CHECK_OK(cinfer_client_table_create(&p, &t));
    return t;
}

static cinfer_tb *get(cinfer_client_table *t, const char *id)
{
    cinfer_tb *tb = NULL;
    CHECK_OK(cinfer_client_table_get(t, id, strlen(id), &tb));
    return tb;
}

static void test_new_client_starts_full_and_separate(void)
{
    cinfer_client_table *t = make(8, 1, 3);
    cinfer_tb *a = get(t, "alice");
    CHECK_EQ_INT(cinfer_tb_take(a, 3, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_take(a, 1, 0, NULL), 0);
    cinfer_tb *b = get(t, "bob");
    CHECK_EQ_INT(cinfer_tb_available(b, 0), 3);
    /* alice's bucket is the same object next time, still empty */
    CHECK_EQ_INT(cinfer_tb_available(get(t, "alice"), 0), 0);
    CHECK_EQ_INT(cinfer_client_table_size(t), 2);
    /* ids are bytes: embedded NULs and the empty id are ids */
    cinfer_tb *x = NULL, *y = NULL, *e = NULL;
    CHECK_OK(cinfer_client_table_get(t, "a\0b", 3, &x));
    CHECK_EQ_INT(cinfer_tb_take(x, 3, 0, NULL), 1);
    CHECK_OK(cinfer_client_table_get(t, "a\0c", 3, &y));
    CHECK_EQ_INT(cinfer_tb_available(y, 0), 3);
    CHECK_OK(cinfer_client_table_get(t, NULL, 0, &e));
    CHECK_EQ_INT(cinfer_tb_available(e, 0), 3);
    CHECK_EQ_INT(cinfer_client_table_size(t), 5);
    cinfer_client_table_destroy(t);
}

static void test_lru_eviction_order(void)
{
    cinfer_client_table *t = make(3, 1, 1);
    get(t, "a");
    get(t, "b");
    get(t, "c");
    get(t, "a"); /* a is now the most recent; b the least */
    /* find neither creates nor reorders */
    CHECK(cinfer_client_table_find(t, "b", 1) != NULL);
    CHECK(cinfer_client_table_find(t, "zz", 2) == NULL);
    CHECK_EQ_INT(cinfer_client_table_size(t), 3);
    get(t, "d");
    CHECK(cinfer_client_table_find(t, "b", 1) == NULL);
    CHECK(cinfer_client_table_find(t, "a", 1) != NULL);
    CHECK(cinfer_client_table_find(t, "c", 1) != NULL);
    CHECK(cinfer_client_table_find(t, "d", 1) != NULL);
    CHECK_EQ_INT(cinfer_client_table_evictions(t), 1);
    get(t, "e"); /* evicts c */
    CHECK(cinfer_client_table_find(t, "c", 1) == NULL);
    CHECK_EQ_INT(cinfer_client_table_size(t), 3);
    /* empty a's bucket, push a out, bring it back: a fresh, full bucket */
    cinfer_tb *a = get(t, "a");
    CHECK_EQ_INT(cinfer_tb_take(a, 1, 0, NULL), 1);
    CHECK_EQ_INT(cinfer_tb_available(get(t, "a"), 0), 0);
    get(t, "b");
    get(t, "c");
    get(t, "f"); /* a was touched before b and c: a goes */
    CHECK(cinfer_client_table_find(t, "a", 1) == NULL);
    CHECK_EQ_INT(cinfer_tb_available(get(t, "a"), 0), 1);
    cinfer_client_table_destroy(t);
}

static void test_bounded_table_million_ids(void)
{
    const size_t cap = 1024;
    const int n = 1000000;
    cinfer_client_table *t = make(cap, 5, 2);
    char id[32];
    for (int i = 0; i < n; i++) {
        int len = snprintf(id, sizeof id, "client-%d", i);
        cinfer_tb *tb = NULL;
        CHECK_OK(cinfer_client_table_get(t, id, (size_t)len, &tb));
        if (tb && i % 1000 == 0)
            CHECK_EQ_INT(cinfer_tb_take(tb, 2, i, NULL), 1); /* fresh */
        if (cinfer_client_table_size(t) > cap) {
            CHECK(cinfer_client_table_size(t) <= cap);
            break;
        }
    }
    CHECK_EQ_INT(cinfer_client_table_size(t), cap);
    CHECK_EQ_INT(cinfer_client_table_capacity(t), cap);
    CHECK_EQ_INT(cinfer_client_table_evictions(t), n - (int)cap);
    /* the last cap ids are there, the one before them is not */
    for (int i = n - (int)cap; i < n; i++) {
        int len = snprintf(id, sizeof id, "client-%d", i);
        CHECK(cinfer_client_table_find(t, id, (size_t)len) != NULL);
    }
    int len = snprintf(id, sizeof id, "client-%d", n - (int)cap - 1);
    CHECK(cinfer_client_table_find(t, id, (size_t)len) == NULL);
    CHECK(cinfer_client_table_find(t, "client-0", 8) == NULL);
    cinfer_client_table_destroy(t);
}

static void test_id_too_long_refused(void)
{
    cinfer_client_table_params p = cinfer_client_table_default_params();
    p.max_clients = 4;
    p.max_id_bytes = 8;
    p.bucket.rate_per_s = 1;
    cinfer_client_table *t = NULL;
    CHECK_OK(cinfer_client_table_create(&p, &t));
    cinfer_tb *tb = NULL;
    CHECK_OK(cinfer_client_table_get(t, "12345678", 8, &tb));
    tb = NULL;
    CHECK_EQ_INT(cinfer_client_table_get(t, "123456789", 9, &tb),
                 CINFER_E_INVALID_ARG);
    CHECK(tb == NULL);
    CHECK(strstr(cinfer_last_error(), "9 bytes") != NULL);
    CHECK_EQ_INT(cinfer_client_table_size(t), 1);
    CHECK(cinfer_client_table_find(t, "123456789", 9) == NULL);
    cinfer_client_table_destroy(t);

    /* bad params */
    p.max_clients = (size_t)1 << 40;
    CHECK_EQ_INT(cinfer_client_table_create(&p, &t), CINFER_E_INVALID_ARG);
    p.max_clients = 4;
    p.bucket.rate_per_s = -1;
    CHECK_EQ_INT(cinfer_client_table_create(&p, &t), CINFER_E_INVALID_ARG);
    cinfer_client_table_destroy(NULL);
}

/* A plain O(n) LRU as the reference for random operations. */
typedef struct {
    int ids[16]; /* most recent first */
    int n;
} ref_lru;

static int ref_touch(ref_lru *r, int id, int cap, int *evicted)
{
    *evicted = -1;
    int at = -1;
    for (int i = 0; i < r->n; i++)
        if (r->ids[i] == id)
            at = i;
    if (at < 0) {
        if (r->n == cap)
            *evicted = r->ids[--r->n];
        at = r->n++;
    }
    for (int i = at; i > 0; i--)
        r->ids[i] = r->ids[i - 1];
    r->ids[0] = id;
    return at;
}

static void test_random_ops_match_reference(void)
{
    const int cap = 16, universe = 40;
    cinfer_client_table_params p = cinfer_client_table_default_params();
    p.max_clients = (size_t)cap;
    p.bucket.rate_per_s = 1;
    p.bucket.burst = 1000;
    p.hash_seed[0] = 7; /* the table has 32 chains: many collisions */
    cinfer_client_table *t = NULL;
    CHECK_OK(cinfer_client_table_create(&p, &t));
    ref_lru ref = {.n = 0};
    uint64_t taken[40] = {0};
    uint64_t seed = 12345;
    char id[16];
    for (int op = 0; op < 50000; op++) {
        int k = (int)(harness_rand(&seed) % universe);
        int len = snprintf(id, sizeof id, "id%d", k);
        if (harness_rand(&seed) % 4 == 0) {
            int in_ref = 0;
            for (int i = 0; i < ref.n; i++)
                in_ref |= ref.ids[i] == k;
            CHECK_EQ_INT(cinfer_client_table_find(t, id, (size_t)len) != NULL,
                         in_ref);
            continue;
        }
        int evicted;
        ref_touch(&ref, k, cap, &evicted);
        if (evicted >= 0)
            taken[evicted] = 0;
        cinfer_tb *tb = NULL;
        CHECK_OK(cinfer_client_table_get(t, id, (size_t)len, &tb));
        if (!tb)
            break;
        /* each id's bucket keeps its own count while it stays */
        CHECK_EQ_INT(cinfer_tb_available(tb, 0), 1000 - taken[k]);
        if (taken[k] < 1000 && cinfer_tb_take(tb, 1, 0, NULL))
            taken[k]++;
        CHECK_EQ_INT(cinfer_client_table_size(t), ref.n);
    }
    cinfer_client_table_destroy(t);
}

int main(void)
{
    RUN(test_new_client_starts_full_and_separate);
    RUN(test_lru_eviction_order);
    RUN(test_bounded_table_million_ids);
    RUN(test_id_too_long_refused);
    RUN(test_random_ops_match_reference);
    return harness_done();
}
