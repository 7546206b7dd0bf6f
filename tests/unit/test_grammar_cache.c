/*
 * test_grammar_cache.c - the LRU of compiled grammars
 * (engine/grammar_cache.c): hits return the kept grammar, (kind, text)
 * is the key, failures are not kept, the entry and byte bounds evict the
 * least recently used, a held grammar survives its eviction and the
 * cache's destruction, a caller's compile function is used, and threads
 * sharing the cache keep its counts whole.
 */
#include "engine/grammar_cache.h"
#include "harness.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

static cinfer_grammar_entry *get(cinfer_grammar_cache *c, int kind,
                                 const char *text)
{
    cinfer_grammar_entry *e = NULL;
    CHECK_OK(cinfer_grammar_cache_get(c, kind, text, strlen(text), NULL, NULL,
                                      &e));
    return e;
}

static int accepts(const cinfer_grammar_entry *e, const char *s)
{
    cinfer_grammar_state *st = NULL;
    if (!e || cinfer_grammar_state_create(cinfer_grammar_entry_grammar(e),
                                          &st) != CINFER_OK)
        return 0;
    int ok = cinfer_grammar_accept(st, s, strlen(s)) == CINFER_OK &&
             cinfer_grammar_complete(st);
    cinfer_grammar_state_destroy(st);
    return ok;
}

static void test_hits_and_keys(void)
{
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(NULL, &c));
    cinfer_grammar_entry *a = get(c, CINFER_GRAMMAR_KIND_GBNF,
                                  "root ::= \"ab\"\n");
    cinfer_grammar_entry *b = get(c, CINFER_GRAMMAR_KIND_GBNF,
                                  "root ::= \"ab\"\n");
    CHECK(a && a == b);
    CHECK(accepts(a, "ab"));
    /* the same text as a regex is another entry */
    cinfer_grammar_entry *r = get(c, CINFER_GRAMMAR_KIND_REGEX, "a+b");
    cinfer_grammar_entry *r2 = get(c, CINFER_GRAMMAR_KIND_GBNF,
                                   "root ::= \"a+b\"\n");
    CHECK(r && r != r2 && accepts(r, "aaab") && accepts(r2, "a+b"));
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.hits, 1);
    CHECK_EQ_INT(st.misses, 3);
    CHECK_EQ_INT(st.entries, 3);
    CHECK(st.bytes > 0);
    /* failures are reported each time and never kept */
    for (int i = 0; i < 2; i++) {
        cinfer_grammar_entry *bad = (cinfer_grammar_entry *)1;
        CHECK_EQ_INT(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_GBNF,
                                              "root ::= (", 10, NULL, NULL,
                                              &bad),
                     CINFER_E_INVALID_ARG);
        CHECK(bad == NULL);
        CHECK(strstr(cinfer_last_error(), "grammar: line 1") != NULL);
    }
    cinfer_grammar_entry *none = NULL;
    CHECK_EQ_INT(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                          "{}", 2, NULL, NULL, &none),
                 CINFER_E_INVALID_ARG);
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.entries, 3);
    cinfer_grammar_entry_release(a);
    cinfer_grammar_entry_release(b);
    cinfer_grammar_entry_release(r);
    cinfer_grammar_entry_release(r2);
    cinfer_grammar_entry_release(NULL);
    cinfer_grammar_cache_destroy(c);
    cinfer_grammar_cache_destroy(NULL);
}

static void test_lru_by_entries_and_bytes(void)
{
    cinfer_grammar_cache_params p = cinfer_grammar_cache_default_params();
    p.max_entries = 3;
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(&p, &c));
    const char *t[4] = {"root ::= \"a\"\n", "root ::= \"b\"\n",
                        "root ::= \"c\"\n", "root ::= \"d\"\n"};
    for (int i = 0; i < 3; i++)
        cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[i]));
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[0]));
    /* a was used last: d evicts b, the least recently used */
    cinfer_grammar_entry *held_c = get(c, CINFER_GRAMMAR_KIND_GBNF, t[2]);
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[3]));
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.entries, 3);
    CHECK_EQ_INT(st.evictions, 1);
    CHECK_EQ_INT(st.hits, 2);
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[0]));
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.hits, 3); /* a kept */
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[1]));
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.misses, 5); /* b was gone */
    CHECK_EQ_INT(st.evictions, 2);
    /* c was evicted by b's return (d, a were newer) while held: usable */
    CHECK(accepts(held_c, "c"));
    cinfer_grammar_entry_release(held_c);
    cinfer_grammar_cache_destroy(c);

    /* bytes: each of these grammars is some hundreds of bytes */
    cinfer_grammar_entry *one = NULL;
    CHECK_OK(cinfer_grammar_cache_create(NULL, &c));
    one = get(c, CINFER_GRAMMAR_KIND_GBNF, t[0]);
    cinfer_grammar_cache_stats_get(c, &st);
    size_t per = st.bytes;
    cinfer_grammar_entry_release(one);
    cinfer_grammar_cache_destroy(c);
    p.max_entries = 0;
    p.max_bytes = 2 * per + per / 2;
    CHECK_OK(cinfer_grammar_cache_create(&p, &c));
    for (int i = 0; i < 4; i++) {
        cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, t[i]));
        cinfer_grammar_cache_stats_get(c, &st);
        CHECK(st.bytes <= p.max_bytes);
    }
    CHECK_EQ_INT(st.entries, 2);
    CHECK_EQ_INT(st.evictions, 2);
    /* larger than the whole bound: compiled, returned, not kept */
    char big[4096];
    int n = snprintf(big, sizeof big, "root ::= \"");
    for (int i = 0; i < 600; i++)
        big[n++] = 'x';
    snprintf(big + n, sizeof big - (size_t)n, "\"\n");
    cinfer_grammar_entry *b = get(c, CINFER_GRAMMAR_KIND_GBNF, big);
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.entries, 2);
    CHECK(b && cinfer_grammar_entry_grammar(b) != NULL);
    /* a held entry outlives the cache */
    cinfer_grammar_entry *keep = get(c, CINFER_GRAMMAR_KIND_GBNF, t[3]);
    cinfer_grammar_cache_destroy(c);
    CHECK(accepts(keep, "d"));
    cinfer_grammar_entry_release(keep);
    cinfer_grammar_entry_release(b);
}

static cinfer_status upper_compile(void *ctx, const char *text, size_t len,
                                   cinfer_grammar **out)
{
    (*(int *)ctx)++;
    char src[128];
    int n = snprintf(src, sizeof src, "root ::= \"%.*s\"\n", (int)len, text);
    for (int i = 10; i < n; i++)
        src[i] = (char)(src[i] >= 'a' && src[i] <= 'z' ? src[i] - 32 : src[i]);
    return cinfer_grammar_compile(src, (size_t)n, "root", out);
}

static void test_compile_function(void)
{
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(NULL, &c));
    int calls = 0;
    cinfer_grammar_entry *e1 = NULL, *e2 = NULL;
    CHECK_OK(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                      "abc", 3, upper_compile, &calls, &e1));
    CHECK_OK(cinfer_grammar_cache_get(c, CINFER_GRAMMAR_KIND_JSON_SCHEMA,
                                      "abc", 3, upper_compile, &calls, &e2));
    CHECK_EQ_INT(calls, 1);
    CHECK(e1 == e2 && accepts(e1, "ABC") && !accepts(e1, "abc"));
    cinfer_grammar_entry_release(e1);
    cinfer_grammar_entry_release(e2);
    cinfer_grammar_cache_destroy(c);
}

struct worker {
    cinfer_grammar_cache *c;
    int id, failures, gets;
};

static void *work(void *arg)
{
    struct worker *w = arg;
    uint64_t x = 88172645463325252ull + (uint64_t)w->id;
    for (int i = 0; i < 400; i++) {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        char re[32];
        int k = (int)(x % 20);
        snprintf(re, sizeof re, "x{%d}y", k);
        cinfer_grammar_entry *e = NULL;
        if (cinfer_grammar_cache_get(w->c, CINFER_GRAMMAR_KIND_REGEX, re,
                                     strlen(re), NULL, NULL, &e) != CINFER_OK) {
            w->failures++;
            continue;
        }
        char s[32];
        memset(s, 'x', (size_t)k);
        s[k] = 'y';
        s[k + 1] = '\0';
        w->failures += !accepts(e, s);
        w->gets++;
        cinfer_grammar_entry_release(e);
    }
    return NULL;
}

static void test_threads_share_it(void)
{
    cinfer_grammar_cache_params p = cinfer_grammar_cache_default_params();
    p.max_entries = 8;
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(&p, &c));
    struct worker w[4];
    pthread_t th[4];
    for (int i = 0; i < 4; i++) {
        w[i] = (struct worker){c, i, 0, 0};
        pthread_create(&th[i], NULL, work, &w[i]);
    }
    int gets = 0, failures = 0;
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        gets += w[i].gets;
        failures += w[i].failures;
    }
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(failures, 0);
    CHECK_EQ_INT(gets, 1600);
    CHECK_EQ_INT(st.hits + st.misses, 1600);
    CHECK(st.entries <= 8);
    fprintf(stderr, "  4 threads, 1600 lookups: %llu hits, %llu evictions\n",
            (unsigned long long)st.hits, (unsigned long long)st.evictions);
    cinfer_grammar_cache_destroy(c);
}

/* A grammar's mask tables count in its entry: they grow as it masks, and
 * the next hit measures them and evicts others to keep the bound. */
static void test_mask_tables_counted(void)
{
    const char *g1 = "root ::= \"[\" [a-z]* \"]\"\n";
    cinfer_grammar_cache *c = NULL;
    CHECK_OK(cinfer_grammar_cache_create(NULL, &c));
    cinfer_grammar_entry *e = get(c, CINFER_GRAMMAR_KIND_GBNF, g1);
    cinfer_grammar_cache_stats st;
    cinfer_grammar_cache_stats_get(c, &st);
    size_t before = st.bytes;
    char bytes[26 * 2];
    uint32_t off[53];
    for (int i = 0; i < 26; i++) {
        bytes[2 * i] = (char)('a' + i);
        bytes[2 * i + 1] = ']';
        off[2 * i] = (uint32_t)(2 * i);
        off[2 * i + 1] = (uint32_t)(2 * i + 1);
    }
    off[52] = 52;
    cinfer_grammar_vocab *v = NULL;
    CHECK_OK(cinfer_grammar_vocab_create(bytes, off, 52, &v));
    cinfer_grammar_state *s = NULL;
    CHECK_OK(cinfer_grammar_state_create(cinfer_grammar_entry_grammar(e), &s));
    uint8_t mask[52];
    CHECK_OK(cinfer_grammar_accept(s, "[", 1));
    CHECK(cinfer_grammar_mask(s, v, mask) > 0);
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_entry *again = get(c, CINFER_GRAMMAR_KIND_GBNF, g1);
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK(again == e);
    CHECK(st.bytes > before + 1024); /* a position's transitions at least */
    fprintf(stderr, "  entry %zu bytes, %zu after one mask\n", before,
            st.bytes);
    cinfer_grammar_entry_release(e);
    cinfer_grammar_entry_release(again);
    cinfer_grammar_cache_destroy(c);

    /* with room for two fresh entries, the grown one evicts the other */
    cinfer_grammar_cache_params p = cinfer_grammar_cache_default_params();
    p.max_bytes = 2 * before + 64;
    CHECK_OK(cinfer_grammar_cache_create(&p, &c));
    e = get(c, CINFER_GRAMMAR_KIND_GBNF, g1);
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF,
                                     "root ::= \"[\" [a-y]* \"]\"\n"));
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.entries, 2);
    CHECK_OK(cinfer_grammar_state_create(cinfer_grammar_entry_grammar(e), &s));
    CHECK_OK(cinfer_grammar_accept(s, "[", 1));
    CHECK(cinfer_grammar_mask(s, v, mask) > 0);
    cinfer_grammar_state_destroy(s);
    cinfer_grammar_entry_release(get(c, CINFER_GRAMMAR_KIND_GBNF, g1));
    cinfer_grammar_cache_stats_get(c, &st);
    CHECK_EQ_INT(st.entries, 1);
    CHECK_EQ_INT(st.evictions, 1);
    cinfer_grammar_entry_release(e);
    cinfer_grammar_cache_destroy(c);
    cinfer_grammar_vocab_destroy(v);
}

int main(void)
{
    RUN(test_hits_and_keys);
    RUN(test_lru_by_entries_and_bytes);
    RUN(test_compile_function);
    RUN(test_threads_share_it);
    RUN(test_mask_tables_counted);
    return harness_done();
}
