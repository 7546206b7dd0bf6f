/*
 * test_server_api_keys.c - the API key file, lookup by digest, the
 * metadata a key comes in, and per-key buckets (server/api_keys.c), with
 * the time passed in.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <stdlib.h>
#include <unistd.h>

#include "server/api_keys.h"

static char path[64];

static void write_file(const char *text)
{
    FILE *f = fopen(path, "w");
    CHECK(f != NULL);
    if (f) {
        fputs(text, f);
        fclose(f);
    }
}

static void test_parse(void)
{
    cinfer_api_keys *k = NULL;
    write_file("# comment\n"
               "\n"
               "0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376"
               " alice qps=2 burst=2 max_priority=10\n"
               "   9f03ef1533a68d2f506f81ef463c1183a82a6bd40e45613f36e6fe1889cf1b99"
               "   batch   # trailing comment\n");
    CHECK_OK(cinfer_api_keys_load(path, NULL, &k));
    if (k) {
        CHECK_EQ_INT(cinfer_api_keys_count(k), 2);
        const cinfer_api_key *a = cinfer_api_keys_get(k, 0);
        CHECK_EQ_STR(a->name, "alice");
        CHECK_NEAR(a->rate_per_s, 2.0, 0);
        CHECK_EQ_INT(a->burst, 2);
        CHECK_EQ_INT(a->has_max_priority, 1);
        CHECK_EQ_INT(a->max_priority, 10);
        CHECK_EQ_INT(cinfer_api_keys_get(k, 1)->has_max_priority, 0);
        CHECK(cinfer_api_keys_get(k, 2) == NULL);
        cinfer_api_keys_unref(k);
    }
    struct {
        const char *text, *words;
    } bad[] = {
        {"abc alice\n", ":1: the first field"},
        {"\n0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376\n",
         ":2: the second field"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 "
         "al/ice\n",
         ":1: the second field"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 "
         "alice qps=0\n",
         "bad option 'qps=0'"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 "
         "alice max_priority=101\n",
         "bad option"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 "
         "alice colour=red\n",
         "bad option 'colour=red'"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 a\n"
         "9f03ef1533a68d2f506f81ef463c1183a82a6bd40e45613f36e6fe1889cf1b99 a\n",
         "the name a is used twice"},
        {"0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376 a\n"
         "0C848ABB03307B06CF70CD4E29C157DC81AF5E94AB3EB1D0C59A120269572376 b\n",
         "have the same key"},
        {"# nothing\n", "no key"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(bad[i].text);
        cinfer_status st = cinfer_api_keys_load(path, NULL, &k);
        CHECK_EQ_INT(st, CINFER_E_FORMAT);
        CHECK(k == NULL);
        if (!strstr(cinfer_last_error(), bad[i].words)) {
            fprintf(stderr, "case %zu: \"%s\" does not say \"%s\"\n", i,
                    cinfer_last_error(), bad[i].words);
            harness_failed_checks++;
        }
    }
    CHECK_EQ_INT(cinfer_api_keys_load("/nonexistent/keys", NULL, &k),
                 CINFER_E_IO);
}

static void test_find(void)
{
    /* sha256("alice-secret") and sha256("bob-secret"), from sha256sum:
     * each key finds its own line. */
    write_file("0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376"
               " alice\n"
               "9f03ef1533a68d2f506f81ef463c1183a82a6bd40e45613f36e6fe1889cf1b99"
               " other\n");
    cinfer_api_keys *k = NULL;
    CHECK_OK(cinfer_api_keys_load(path, NULL, &k));
    if (!k)
        return;
    CHECK_EQ_INT(cinfer_api_keys_find(k, "alice-secret", 12), 0);
    CHECK_EQ_INT(cinfer_api_keys_find(k, "bob-secret", 10), 1);
    CHECK_EQ_INT(cinfer_api_keys_find(k, "alice-secreT", 12), -1);
    CHECK_EQ_INT(cinfer_api_keys_find(k, "alice-secret", 11), -1);
    CHECK_EQ_INT(cinfer_api_keys_find(k, "", 0), -1);
    cinfer_api_keys_unref(k);
}

static void test_header(void)
{
    const char *key;
    size_t n;
    CHECK(cinfer_api_key_from_header("authorization", 13, "Bearer abc", 10,
                                     &key, &n));
    CHECK(n == 3 && memcmp(key, "abc", 3) == 0);
    CHECK(cinfer_api_key_from_header("authorization", 13, "bearer  xyz", 11,
                                     &key, &n));
    CHECK(n == 3 && memcmp(key, "xyz", 3) == 0);
    CHECK(!cinfer_api_key_from_header("authorization", 13, "Basic abc", 9,
                                      &key, &n));
    CHECK(!cinfer_api_key_from_header("authorization", 13, "Bearer ", 7,
                                      &key, &n));
    CHECK(cinfer_api_key_from_header("x-api-key", 9, "k1", 2, &key, &n));
    CHECK(n == 2 && memcmp(key, "k1", 2) == 0);
    CHECK(!cinfer_api_key_from_header("x-api-key", 9, "", 0, &key, &n));
    CHECK(!cinfer_api_key_from_header("x-client-id", 11, "k1", 2, &key, &n));
}

static void test_buckets(void)
{
    write_file("0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376"
               " alice qps=2 burst=2\n"
               "9f03ef1533a68d2f506f81ef463c1183a82a6bd40e45613f36e6fe1889cf1b99"
               " free\n");
    cinfer_api_keys *k = NULL;
    CHECK_OK(cinfer_api_keys_load(path, NULL, &k));
    if (!k)
        return;
    int64_t t = 1000000000, retry = -1;
    CHECK_EQ_INT(cinfer_api_keys_take(k, 0, t, &retry), 1);
    CHECK_EQ_INT(cinfer_api_keys_take(k, 0, t, &retry), 1);
    CHECK_EQ_INT(cinfer_api_keys_take(k, 0, t, &retry), 0);
    CHECK(retry >= 1 && retry <= 501);
    /* The key without qps is never limited, whatever alice does. */
    for (int i = 0; i < 100; i++)
        CHECK_EQ_INT(cinfer_api_keys_take(k, 1, t, &retry), 1);
    /* Half a second later, one more for alice. */
    CHECK_EQ_INT(cinfer_api_keys_take(k, 0, t + 500000000, &retry), 1);
    CHECK_EQ_INT(cinfer_api_keys_take(k, 0, t + 500000000, &retry), 0);

    /* A reload with the same key and limits carries the empty bucket
     * over; changed limits start full. */
    cinfer_api_keys *k2 = NULL;
    CHECK_OK(cinfer_api_keys_load(path, k, &k2));
    if (k2)
        CHECK_EQ_INT(cinfer_api_keys_take(k2, 0, t + 500000000, &retry), 0);
    write_file("0c848abb03307b06cf70cd4e29c157dc81af5e94ab3eb1d0c59a120269572376"
               " alice qps=3\n");
    cinfer_api_keys *k3 = NULL;
    CHECK_OK(cinfer_api_keys_load(path, k2, &k3));
    if (k3)
        CHECK_EQ_INT(cinfer_api_keys_take(k3, 0, t + 500000000, &retry), 1);
    /* References: the old sets live while a call holds them. */
    cinfer_api_keys_ref(k);
    cinfer_api_keys_unref(k);
    cinfer_api_keys_unref(k);
    cinfer_api_keys_unref(k2);
    cinfer_api_keys_unref(k3);
    cinfer_api_keys_unref(NULL);
}

int main(void)
{
    snprintf(path, sizeof path, "/tmp/cinfer-keys-%d.txt", (int)getpid());
    RUN(test_parse);
    RUN(test_find);
    RUN(test_header);
    RUN(test_buckets);
    unlink(path);
    return harness_done();
}
#endif
