/*
 * client_table.c - bounded LRU table of per-client token buckets
 * (resilience.h).
 *
 * Client ids arrive from the network (x-client-id metadata, peer
 * addresses), so the table must stay small and fast whatever a client
 * sends: every entry, key byte and hash head is allocated at create, ids
 * are hashed with SipHash-1-3 under a secret seed (ids crafted to share a
 * chain need the seed), and the least recently used entry is recycled when
 * a new id arrives at a full table. Indices are int32 so an entry is a few
 * dozen bytes; keys live in one slab of max_clients * max_id_bytes.
 *
 * Layout: heads[hash & mask] starts a singly linked chain through
 * entry.chain_next; entry.lru_prev/lru_next form the recency list from
 * mru (most recent) to lru (least). -1 ends every list.
 */
#include "resilience/resilience.h"

#include <string.h>

#define DEFAULT_MAX_CLIENTS 10000
#define DEFAULT_MAX_ID_BYTES 128
#define MAX_CLIENTS_LIMIT (1u << 26)
#define MAX_ID_BYTES_LIMIT 65536

typedef struct {
    uint64_t hash;
    uint32_t key_len;
    int32_t chain_next;
    int32_t lru_prev; /* towards mru */
    int32_t lru_next; /* towards lru */
    cinfer_tb tb;
} entry;

struct cinfer_client_table {
    cinfer_tb_params bucket;
    size_t cap;
    size_t max_id;
    uint64_t k0, k1;
    entry *e;
    char *keys; /* cap * max_id bytes */
    int32_t *heads;
    size_t mask;
    size_t size;
    int32_t mru, lru;
    uint64_t evictions;
};

cinfer_client_table_params cinfer_client_table_default_params(void)
{
    cinfer_client_table_params p = {
        .max_clients = DEFAULT_MAX_CLIENTS,
        .max_id_bytes = DEFAULT_MAX_ID_BYTES,
        .hash_seed = {0, 0},
        .bucket = cinfer_tb_default_params(),
    };
    return p;
}

/* ---------------------------------------------------------------------- */
/* SipHash-1-3                                                            */
/* ---------------------------------------------------------------------- */

static inline uint64_t rotl(uint64_t x, int b)
{
    return (x << b) | (x >> (64 - b));
}

static inline void sipround(uint64_t v[4])
{
    v[0] += v[1];
    v[1] = rotl(v[1], 13);
    v[1] ^= v[0];
    v[0] = rotl(v[0], 32);
    v[2] += v[3];
    v[3] = rotl(v[3], 16);
    v[3] ^= v[2];
    v[0] += v[3];
    v[3] = rotl(v[3], 21);
    v[3] ^= v[0];
    v[2] += v[1];
    v[1] = rotl(v[1], 17);
    v[1] ^= v[2];
    v[2] = rotl(v[2], 32);
}

static uint64_t siphash13(uint64_t k0, uint64_t k1, const unsigned char *in,
                          size_t len)
{
    uint64_t v[4] = {0x736f6d6570736575ull ^ k0, 0x646f72616e646f6dull ^ k1,
                     0x6c7967656e657261ull ^ k0, 0x7465646279746573ull ^ k1};
    size_t i = 0;
    for (; i + 8 <= len; i += 8) {
        uint64_t m = 0;
        for (int j = 0; j < 8; j++)
            m |= (uint64_t)in[i + j] << (8 * j);
        v[3] ^= m;
        sipround(v);
        v[0] ^= m;
    }
    uint64_t b = (uint64_t)len << 56;
    for (size_t j = 0; i + j < len; j++)
        b |= (uint64_t)in[i + j] << (8 * j);
    v[3] ^= b;
    sipround(v);
    v[0] ^= b;
    v[2] ^= 0xff;
    sipround(v);
    sipround(v);
    sipround(v);
    return v[0] ^ v[1] ^ v[2] ^ v[3];
}

/* ---------------------------------------------------------------------- */
/* Create, destroy                                                        */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_client_table_create(const cinfer_client_table_params *p,
                                         cinfer_client_table **out)
{
    if (!p || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "client table: NULL");
    size_t cap = p->max_clients ? p->max_clients : DEFAULT_MAX_CLIENTS;
    size_t max_id = p->max_id_bytes ? p->max_id_bytes : DEFAULT_MAX_ID_BYTES;
    if (cap > MAX_CLIENTS_LIMIT)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "client table: max_clients %zu exceeds %u", cap,
                                MAX_CLIENTS_LIMIT);
    if (max_id > MAX_ID_BYTES_LIMIT)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "client table: max_id_bytes %zu exceeds %d",
                                max_id, MAX_ID_BYTES_LIMIT);
    cinfer_tb probe;
    cinfer_status st = cinfer_tb_init(&probe, &p->bucket);
    if (st != CINFER_OK)
        return st;

    size_t nheads = 1;
    while (nheads < 2 * cap)
        nheads <<= 1;

    cinfer_client_table *t = calloc(1, sizeof *t);
    if (!t)
        goto fail_nomem;
    t->e = malloc(cap * sizeof *t->e);
    if (!t->e)
        goto fail_table;
    t->keys = malloc(cap * max_id);
    if (!t->keys)
        goto fail_entries;
    t->heads = malloc(nheads * sizeof *t->heads);
    if (!t->heads)
        goto fail_keys;
    for (size_t i = 0; i < nheads; i++)
        t->heads[i] = -1;
    t->bucket = p->bucket;
    t->cap = cap;
    t->max_id = max_id;
    if (p->hash_seed[0] == 0 && p->hash_seed[1] == 0) {
        t->k0 = 0x0706050403020100ull;
        t->k1 = 0x0f0e0d0c0b0a0908ull;
    } else {
        t->k0 = p->hash_seed[0];
        t->k1 = p->hash_seed[1];
    }
    t->mask = nheads - 1;
    t->mru = t->lru = -1;
    *out = t;
    return CINFER_OK;

fail_keys:
    free(t->keys);
fail_entries:
    free(t->e);
fail_table:
    free(t);
fail_nomem:
    return cinfer_set_error(CINFER_E_NOMEM,
                            "client table: no memory for %zu clients of %zu "
                            "bytes",
                            cap, max_id);
}

void cinfer_client_table_destroy(cinfer_client_table *t)
{
    if (!t)
        return;
    free(t->heads);
    free(t->keys);
    free(t->e);
    free(t);
}

/* ---------------------------------------------------------------------- */
/* Lists                                                                  */
/* ---------------------------------------------------------------------- */

static char *key_of(cinfer_client_table *t, int32_t i)
{
    return t->keys + (size_t)i * t->max_id;
}

static int32_t lookup(cinfer_client_table *t, uint64_t h, const char *id,
                      size_t len)
{
    for (int32_t i = t->heads[h & t->mask]; i >= 0; i = t->e[i].chain_next) {
        const entry *x = &t->e[i];
        if (x->hash == h && x->key_len == len &&
            memcmp(key_of(t, i), id, len) == 0)
            return i;
    }
    return -1;
}

static void lru_unlink(cinfer_client_table *t, int32_t i)
{
    entry *x = &t->e[i];
    if (x->lru_prev >= 0)
        t->e[x->lru_prev].lru_next = x->lru_next;
    else
        t->mru = x->lru_next;
    if (x->lru_next >= 0)
        t->e[x->lru_next].lru_prev = x->lru_prev;
    else
        t->lru = x->lru_prev;
}

static void lru_push_front(cinfer_client_table *t, int32_t i)
{
    entry *x = &t->e[i];
    x->lru_prev = -1;
    x->lru_next = t->mru;
    if (t->mru >= 0)
        t->e[t->mru].lru_prev = i;
    t->mru = i;
    if (t->lru < 0)
        t->lru = i;
}

static void chain_unlink(cinfer_client_table *t, int32_t i)
{
    int32_t *link = &t->heads[t->e[i].hash & t->mask];
    while (*link != i) {
        CINFER_ASSERT(*link >= 0);
        link = &t->e[*link].chain_next;
    }
    *link = t->e[i].chain_next;
}

/* ---------------------------------------------------------------------- */
/* Lookups                                                                */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_client_table_get(cinfer_client_table *t, const char *id,
                                      size_t len, cinfer_tb **out)
{
    if (len > t->max_id)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "client id of %zu bytes exceeds %zu", len,
                                t->max_id);
    if (len && !id)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "client id: NULL");
    if (!id)
        id = ""; /* the empty id is an id too */
    uint64_t h = siphash13(t->k0, t->k1, (const unsigned char *)id, len);
    int32_t i = lookup(t, h, id, len);
    if (i >= 0) {
        if (t->mru != i) {
            lru_unlink(t, i);
            lru_push_front(t, i);
        }
        *out = &t->e[i].tb;
        return CINFER_OK;
    }
    if (t->size < t->cap) {
        i = (int32_t)t->size++;
    } else {
        i = t->lru;
        lru_unlink(t, i);
        chain_unlink(t, i);
        t->evictions++;
    }
    entry *x = &t->e[i];
    x->hash = h;
    x->key_len = (uint32_t)len;
    if (len)
        memcpy(key_of(t, i), id, len);
    cinfer_status st = cinfer_tb_init(&x->tb, &t->bucket);
    CINFER_ASSERT(st == CINFER_OK); /* validated at create */
    size_t head = h & t->mask;
    x->chain_next = t->heads[head];
    t->heads[head] = i;
    lru_push_front(t, i);
    *out = &x->tb;
    return CINFER_OK;
}

cinfer_tb *cinfer_client_table_find(cinfer_client_table *t, const char *id,
                                    size_t len)
{
    if (len > t->max_id || (len && !id))
        return NULL;
    if (!id)
        id = "";
    uint64_t h = siphash13(t->k0, t->k1, (const unsigned char *)id, len);
    int32_t i = lookup(t, h, id, len);
    return i >= 0 ? &t->e[i].tb : NULL;
}

size_t cinfer_client_table_size(const cinfer_client_table *t)
{
    return t->size;
}

size_t cinfer_client_table_capacity(const cinfer_client_table *t)
{
    return t->cap;
}

uint64_t cinfer_client_table_evictions(const cinfer_client_table *t)
{
    return t->evictions;
}
