/*
 * grammar_cache.c - the LRU of compiled grammars (grammar_cache.h): a
 * chained hash table over (kind, text) and a doubly linked list in use
 * order, most recent first. Entries are refcounted; the cache holds one
 * reference to each entry it keeps and drops it on eviction, so a held
 * grammar outlives both its eviction and the cache.
 */
#include "grammar_cache.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

struct cinfer_grammar_entry {
    atomic_int refs;
    int kind;
    char *text;
    size_t len;
    uint64_t hash;
    size_t bytes;
    cinfer_grammar *g;
    struct cinfer_grammar_entry *chain; /* the bucket's next */
    struct cinfer_grammar_entry *prev, *next; /* use order */
};

struct cinfer_grammar_cache {
    pthread_mutex_t mu;
    cinfer_grammar_entry **bucket;
    size_t n_buckets; /* a power of two */
    cinfer_grammar_entry *head, *tail; /* most, least recently used */
    size_t max_bytes, max_entries;
    cinfer_grammar_cache_stats st;
};

cinfer_grammar_cache_params cinfer_grammar_cache_default_params(void)
{
    cinfer_grammar_cache_params p = {0};
    return p;
}

cinfer_status cinfer_grammar_cache_create(const cinfer_grammar_cache_params *p,
                                          cinfer_grammar_cache **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_cache_create: out is NULL");
    *out = NULL;
    cinfer_grammar_cache_params d = cinfer_grammar_cache_default_params();
    if (!p)
        p = &d;
    cinfer_grammar_cache *c = calloc(1, sizeof *c);
    if (!c)
        return cinfer_set_error(CINFER_E_NOMEM, "grammar_cache: out of memory");
    c->max_bytes = p->max_bytes ? p->max_bytes : (size_t)64 << 20;
    c->max_entries = p->max_entries ? p->max_entries : 256;
    c->n_buckets = 64;
    while (c->n_buckets < c->max_entries && c->n_buckets < (1u << 20))
        c->n_buckets *= 2;
    c->bucket = calloc(c->n_buckets, sizeof *c->bucket);
    if (!c->bucket || pthread_mutex_init(&c->mu, NULL) != 0) {
        free(c->bucket);
        free(c);
        return cinfer_set_error(CINFER_E_NOMEM, "grammar_cache: out of memory");
    }
    *out = c;
    return CINFER_OK;
}

static void entry_free(cinfer_grammar_entry *e)
{
    cinfer_grammar_destroy(e->g);
    free(e->text);
    free(e);
}

void cinfer_grammar_entry_release(cinfer_grammar_entry *e)
{
    if (e && atomic_fetch_sub(&e->refs, 1) == 1)
        entry_free(e);
}

const cinfer_grammar *cinfer_grammar_entry_grammar(
    const cinfer_grammar_entry *e)
{
    return e->g;
}

static uint64_t key_hash(int kind, const char *text, size_t len)
{
    uint64_t h = 1469598103934665603ull ^ (uint64_t)kind;
    for (size_t i = 0; i < len; i++)
        h = (h ^ (unsigned char)text[i]) * 1099511628211ull;
    return h;
}

/* Under the lock. */
static cinfer_grammar_entry *find(cinfer_grammar_cache *c, int kind,
                                  const char *text, size_t len, uint64_t h)
{
    for (cinfer_grammar_entry *e = c->bucket[h & (c->n_buckets - 1)]; e;
         e = e->chain)
        if (e->hash == h && e->kind == kind && e->len == len &&
            (len == 0 || memcmp(e->text, text, len) == 0))
            return e;
    return NULL;
}

static void unlink_use(cinfer_grammar_cache *c, cinfer_grammar_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        c->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        c->tail = e->prev;
    e->prev = e->next = NULL;
}

static void push_front(cinfer_grammar_cache *c, cinfer_grammar_entry *e)
{
    e->prev = NULL;
    e->next = c->head;
    if (c->head)
        c->head->prev = e;
    c->head = e;
    if (!c->tail)
        c->tail = e;
}

/* Drops e from the table and the list, and the cache's reference. */
static void drop(cinfer_grammar_cache *c, cinfer_grammar_entry *e)
{
    cinfer_grammar_entry **pp = &c->bucket[e->hash & (c->n_buckets - 1)];
    while (*pp != e)
        pp = &(*pp)->chain;
    *pp = e->chain;
    unlink_use(c, e);
    c->st.entries--;
    c->st.bytes -= e->bytes;
    cinfer_grammar_entry_release(e);
}

static cinfer_status compile_kind(int kind, const char *text, size_t len,
                                  cinfer_grammar **out)
{
    if (kind == CINFER_GRAMMAR_KIND_GBNF)
        return cinfer_grammar_compile(text, len, "root", out);
    if (kind == CINFER_GRAMMAR_KIND_REGEX)
        return cinfer_grammar_compile_regex(text, len, out);
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "grammar_cache: kind %d needs a compile function",
                            kind);
}

cinfer_status cinfer_grammar_cache_get(cinfer_grammar_cache *c, int kind,
                                       const char *text, size_t len,
                                       cinfer_grammar_compile_fn compile,
                                       void *ctx, cinfer_grammar_entry **out)
{
    if (!out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_cache_get: out is NULL");
    *out = NULL;
    if (!c || (!text && len))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "grammar_cache_get: bad arguments");
    uint64_t h = key_hash(kind, text, len);
    pthread_mutex_lock(&c->mu);
    cinfer_grammar_entry *e = find(c, kind, text, len, h);
    if (e) {
        atomic_fetch_add(&e->refs, 1);
        unlink_use(c, e);
        push_front(c, e);
        c->st.hits++;
        /* its mask tables grew since: count them, and keep the bound */
        size_t now = sizeof *e + e->len + cinfer_grammar_bytes(e->g);
        c->st.bytes = c->st.bytes - e->bytes + now;
        e->bytes = now;
        while (c->tail != e && c->st.bytes > c->max_bytes) {
            drop(c, c->tail);
            c->st.evictions++;
        }
        pthread_mutex_unlock(&c->mu);
        *out = e;
        return CINFER_OK;
    }
    c->st.misses++;
    pthread_mutex_unlock(&c->mu);

    cinfer_grammar *g = NULL;
    cinfer_status st = compile ? compile(ctx, text, len, &g)
                               : compile_kind(kind, text, len, &g);
    if (st != CINFER_OK)
        return st;
    e = calloc(1, sizeof *e);
    char *copy = malloc(len ? len : 1);
    if (!e || !copy) {
        free(e);
        free(copy);
        cinfer_grammar_destroy(g);
        return cinfer_set_error(CINFER_E_NOMEM, "grammar_cache: out of memory");
    }
    if (len)
        memcpy(copy, text, len);
    atomic_init(&e->refs, 1); /* the caller's */
    e->kind = kind;
    e->text = copy;
    e->len = len;
    e->hash = h;
    e->g = g;
    e->bytes = sizeof *e + len + cinfer_grammar_bytes(g);

    pthread_mutex_lock(&c->mu);
    cinfer_grammar_entry *other = find(c, kind, text, len, h);
    if (other) { /* compiled meanwhile by another thread: share it */
        atomic_fetch_add(&other->refs, 1);
        pthread_mutex_unlock(&c->mu);
        entry_free(e);
        *out = other;
        return CINFER_OK;
    }
    if (e->bytes <= c->max_bytes) {
        while (c->tail && (c->st.entries + 1 > c->max_entries ||
                           c->st.bytes + e->bytes > c->max_bytes)) {
            drop(c, c->tail);
            c->st.evictions++;
        }
        atomic_fetch_add(&e->refs, 1); /* the cache's */
        size_t b = h & (c->n_buckets - 1);
        e->chain = c->bucket[b];
        c->bucket[b] = e;
        push_front(c, e);
        c->st.entries++;
        c->st.bytes += e->bytes;
    }
    pthread_mutex_unlock(&c->mu);
    *out = e;
    return CINFER_OK;
}

void cinfer_grammar_cache_stats_get(cinfer_grammar_cache *c,
                                    cinfer_grammar_cache_stats *out)
{
    pthread_mutex_lock(&c->mu);
    *out = c->st;
    pthread_mutex_unlock(&c->mu);
}

void cinfer_grammar_cache_destroy(cinfer_grammar_cache *c)
{
    if (!c)
        return;
    while (c->head)
        drop(c, c->head);
    pthread_mutex_destroy(&c->mu);
    free(c->bucket);
    free(c);
}
