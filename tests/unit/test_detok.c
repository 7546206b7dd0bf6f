/*
 * test_detok.c - the output text stream: stop strings split across tokens,
 * multi-byte characters split across tokens, a stop string at the very
 * start, overlapping stop strings, withheld text released when ruled out or
 * at the end, min_tokens (check_stop = 0), and a random test showing that
 * the output does not depend on how the text is split into pushes. The last
 * test runs real tokens of a tiny model's tokenizer.
 */
#include "engine/detok.h"
#include "engine/gguf.h"
#include "engine/tinymodel.h"
#include "engine/tokenizer.h"
#include "harness.h"

#include <stdlib.h>

typedef struct {
    char buf[4096];
    size_t len;
    int stopped;
} sink;

static cinfer_textstream *make(const char *const *stops, size_t n)
{
    cinfer_textstream_params p = cinfer_textstream_default_params();
    p.stop = stops;
    p.n_stop = n;
    cinfer_textstream *ts = NULL;
    CHECK_OK(cinfer_textstream_create(&p, &ts));
    return ts;
}

/* Pushes `s` and appends the emitted text to `k`; returns what this push
 * emitted as a NUL-terminated string in a static buffer. */
static const char *push(cinfer_textstream *ts, sink *k, const char *s,
                        int check_stop)
{
    static char last[4096];
    const char *t;
    size_t n;
    int stopped = 0;
    CHECK_OK(cinfer_textstream_push_bytes(ts, s, strlen(s), check_stop, 0, &t,
                                          &n, &stopped));
    memcpy(k->buf + k->len, t, n);
    k->len += n;
    k->buf[k->len] = 0;
    k->stopped = stopped;
    memcpy(last, t, n);
    last[n] = 0;
    return last;
}

static const char *finish(cinfer_textstream *ts, sink *k)
{
    static char last[4096];
    const char *t;
    size_t n;
    CHECK_OK(cinfer_textstream_finish(ts, &t, &n));
    memcpy(k->buf + k->len, t, n);
    k->len += n;
    k->buf[k->len] = 0;
    memcpy(last, t, n);
    last[n] = 0;
    return last;
}

static void test_no_stops(void)
{
    cinfer_textstream *ts = make(NULL, 0);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "Hello", 1), "Hello");
    CHECK_EQ_STR(push(ts, &k, " world", 1), " world");
    CHECK_EQ_STR(finish(ts, &k), "");
    CHECK_EQ_STR(k.buf, "Hello world");
    CHECK(!cinfer_textstream_stopped(ts));
    cinfer_textstream_destroy(ts);
}

static void test_multibyte_split(void)
{
    cinfer_textstream *ts = make(NULL, 0);
    sink k = {0};
    /* "é" = C3 A9, "€" = E2 82 AC, "😀" = F0 9F 98 80, each split */
    CHECK_EQ_STR(push(ts, &k, "caf\xC3", 1), "caf");
    CHECK_EQ_STR(push(ts, &k, "\xA9 \xE2", 1), "\xC3\xA9 ");
    CHECK_EQ_STR(push(ts, &k, "\x82", 1), "");
    CHECK_EQ_STR(push(ts, &k, "\xAC\xF0\x9F", 1), "\xE2\x82\xAC");
    CHECK_EQ_STR(push(ts, &k, "\x98", 1), "");
    CHECK_EQ_STR(push(ts, &k, "\x80", 1), "\xF0\x9F\x98\x80");
    /* a character cut off by the end of the stream becomes U+FFFD */
    CHECK_EQ_STR(push(ts, &k, "x\xE2\x82", 1), "x");
    CHECK_EQ_STR(finish(ts, &k), "\xEF\xBF\xBD");
    cinfer_textstream_destroy(ts);
}

static void test_stop_split_across_tokens(void)
{
    const char *stops[] = {"###"};
    cinfer_textstream *ts = make(stops, 1);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "ab#", 1), "ab");
    CHECK_EQ_STR(push(ts, &k, "#", 1), "");
    CHECK(!k.stopped);
    CHECK_EQ_STR(push(ts, &k, "#cd", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_INT(cinfer_textstream_stop_index(ts), 0);
    CHECK_EQ_STR(push(ts, &k, "more", 1), ""); /* ignored after the stop */
    CHECK_EQ_STR(finish(ts, &k), "");
    CHECK_EQ_STR(k.buf, "ab");
    cinfer_textstream_destroy(ts);
}

static void test_withheld_then_released(void)
{
    const char *stops[] = {"abc"};
    cinfer_textstream *ts = make(stops, 1);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "xa", 1), "x");
    CHECK_EQ_STR(push(ts, &k, "b", 1), "");
    CHECK_EQ_STR(push(ts, &k, "d", 1), "abd"); /* ruled out */
    CHECK_EQ_STR(push(ts, &k, "ab", 1), "");
    CHECK_EQ_STR(finish(ts, &k), "ab"); /* the end releases it */
    CHECK_EQ_STR(k.buf, "xabdab");
    CHECK(!cinfer_textstream_stopped(ts));
    cinfer_textstream_destroy(ts);
}

static void test_stop_at_start(void)
{
    const char *stops[] = {"STOP"};
    cinfer_textstream *ts = make(stops, 1);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "ST", 1), "");
    CHECK_EQ_STR(push(ts, &k, "OPxyz", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_INT(k.len, 0);
    cinfer_textstream_destroy(ts);

    ts = make(stops, 1);
    memset(&k, 0, sizeof k);
    CHECK_EQ_STR(push(ts, &k, "STOP", 1), "");
    CHECK(k.stopped);
    cinfer_textstream_destroy(ts);
}

static void test_overlapping_stops(void)
{
    /* "bc" completes before "abcd" could: the earliest end wins */
    const char *s1[] = {"abcd", "bc"};
    cinfer_textstream *ts = make(s1, 2);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "xab", 1), "x");
    CHECK_EQ_STR(push(ts, &k, "cd", 1), "a");
    CHECK(k.stopped);
    CHECK_EQ_INT(cinfer_textstream_stop_index(ts), 1);
    cinfer_textstream_destroy(ts);

    /* both end at the same byte: the longer one is cut */
    const char *s2[] = {"b", "ab"};
    ts = make(s2, 2);
    memset(&k, 0, sizeof k);
    CHECK_EQ_STR(push(ts, &k, "xa", 1), "x");
    CHECK_EQ_STR(push(ts, &k, "b", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_INT(cinfer_textstream_stop_index(ts), 1);
    CHECK_EQ_STR(k.buf, "x");
    cinfer_textstream_destroy(ts);

    /* a stop string that overlaps itself: "aab" inside "aaab" */
    const char *s3[] = {"aab"};
    ts = make(s3, 1);
    memset(&k, 0, sizeof k);
    CHECK_EQ_STR(push(ts, &k, "a", 1), "");
    CHECK_EQ_STR(push(ts, &k, "a", 1), "");
    CHECK_EQ_STR(push(ts, &k, "a", 1), "a");
    CHECK_EQ_STR(push(ts, &k, "b", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_STR(k.buf, "a");
    cinfer_textstream_destroy(ts);
}

static void test_multibyte_stop(void)
{
    const char *stops[] = {"\xC3\xA9!"}; /* "é!" */
    cinfer_textstream *ts = make(stops, 1);
    sink k = {0};
    CHECK_EQ_STR(push(ts, &k, "caf\xC3", 1), "caf");
    CHECK_EQ_STR(push(ts, &k, "\xA9", 1), ""); /* could start "é!" */
    CHECK_EQ_STR(push(ts, &k, "!?", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_STR(k.buf, "caf");
    cinfer_textstream_destroy(ts);

    /* a stop string starting with a continuation byte never splits a
     * character in what is emitted */
    const char *cont[] = {"\xA9z"};
    ts = make(cont, 1);
    memset(&k, 0, sizeof k);
    CHECK_EQ_STR(push(ts, &k, "\xC3\xA9", 1), ""); /* whole char withheld */
    CHECK_EQ_STR(push(ts, &k, "y", 1), "\xC3\xA9y");
    CHECK_EQ_STR(push(ts, &k, "\xC3\xA9z", 1), "");
    CHECK(k.stopped);
    cinfer_textstream_destroy(ts);
}

static void test_check_stop_off(void)
{
    const char *stops[] = {"xx"};
    cinfer_textstream *ts = make(stops, 1);
    sink k = {0};
    /* a whole match inside an unchecked push does not stop */
    CHECK_EQ_STR(push(ts, &k, "axxb", 0), "axxb");
    /* withheld under check_stop = 0, completed by a checked push */
    CHECK_EQ_STR(push(ts, &k, "x", 0), "");
    CHECK_EQ_STR(push(ts, &k, "x", 1), "");
    CHECK(k.stopped);
    CHECK_EQ_STR(k.buf, "axxb");
    cinfer_textstream_destroy(ts);
}

static void test_final_push(void)
{
    const char *stops[] = {"end"};
    cinfer_textstream *ts = make(stops, 1);
    const char *t;
    size_t n;
    int stopped;
    CHECK_OK(cinfer_textstream_push_bytes(ts, "the e", 5, 1, 0, &t, &n,
                                          &stopped));
    CHECK_EQ_INT(n, 4);
    CHECK_OK(cinfer_textstream_push_bytes(ts, "n\xC3", 2, 1, 1, &t, &n,
                                          &stopped));
    CHECK_EQ_INT(n, 5); /* "en" + U+FFFD */
    CHECK(memcmp(t, "en\xEF\xBF\xBD", 5) == 0);
    CHECK(!stopped);
    CHECK_OK(cinfer_textstream_finish(ts, &t, &n));
    CHECK_EQ_INT(n, 0);
    /* a match in the final push still cuts */
    cinfer_textstream_destroy(ts);
    ts = make(stops, 1);
    CHECK_OK(cinfer_textstream_push_bytes(ts, "at the end!", 11, 1, 1, &t, &n,
                                          &stopped));
    CHECK(stopped);
    CHECK_EQ_INT(n, 7);
    cinfer_textstream_destroy(ts);
}

static void test_bad_params(void)
{
    const char *stops[] = {"ok", ""};
    cinfer_textstream_params p = cinfer_textstream_default_params();
    p.stop = stops;
    p.n_stop = 2;
    cinfer_textstream *ts = (cinfer_textstream *)1;
    CHECK_EQ_INT(cinfer_textstream_create(&p, &ts), CINFER_E_INVALID_ARG);
    CHECK(ts == NULL);
    CHECK(strstr(cinfer_last_error(), "stop[1]") != NULL);
    /* push of a token without a tokenizer */
    ts = make(NULL, 0);
    const char *t;
    size_t n;
    int s;
    CHECK_EQ_INT(cinfer_textstream_push(ts, 5, 1, 0, &t, &n, &s),
                 CINFER_E_INVALID_ARG);
    cinfer_textstream_destroy(ts);
}

/* Reference: the text before the first position where any stop string
 * ends (longest on ties), or all of it. */
static size_t reference(const char *text, size_t len, const char *const *st,
                        size_t n_st, int *stopped)
{
    for (size_t e = 1; e <= len; e++) {
        size_t best = 0;
        for (size_t i = 0; i < n_st; i++) {
            size_t l = strlen(st[i]);
            if (l <= e && l > best && memcmp(text + e - l, st[i], l) == 0)
                best = l;
        }
        if (best) {
            *stopped = 1;
            return e - best;
        }
    }
    *stopped = 0;
    return len;
}

static void test_random_splits(void)
{
    /* An alphabet of a few ASCII letters and a 2-byte character makes
     * matches and near-matches frequent. */
    const char *alpha[] = {"a", "b", "c", "\xC3\xA9"};
    const char *stops[] = {"ab", "bca", "\xC3\xA9\x63", "cc\xC3\xA9", "abcab"};
    uint64_t rng = 99;
    int bad = 0;
    for (int it = 0; it < 3000 && !bad; it++) {
        char text[256];
        size_t len = 0;
        int n_chars = 1 + (int)(harness_rand(&rng) % 40);
        for (int c = 0; c < n_chars; c++) {
            const char *a = alpha[harness_rand(&rng) % 4];
            memcpy(text + len, a, strlen(a));
            len += strlen(a);
        }
        size_t n_st = 1 + harness_rand(&rng) % 5;
        const char *st[5];
        for (size_t i = 0; i < n_st; i++)
            st[i] = stops[harness_rand(&rng) % 5];
        int want_stop;
        size_t want = reference(text, len, st, n_st, &want_stop);

        cinfer_textstream *ts = make(st, n_st);
        char out[512];
        size_t got = 0;
        int stopped = 0;
        for (size_t pos = 0; pos < len;) {
            size_t chunk = 1 + harness_rand(&rng) % 4; /* splits chars too */
            if (chunk > len - pos)
                chunk = len - pos;
            const char *t;
            size_t n;
            CHECK_OK(cinfer_textstream_push_bytes(ts, text + pos, chunk, 1, 0,
                                                  &t, &n, &stopped));
            /* every emitted piece ends on a character boundary */
            if (n && ((unsigned char)t[n - 1] & 0xC0) == 0xC0)
                bad = 1;
            memcpy(out + got, t, n);
            got += n;
            pos += chunk;
        }
        const char *t;
        size_t n;
        CHECK_OK(cinfer_textstream_finish(ts, &t, &n));
        memcpy(out + got, t, n);
        got += n;
        if (got != want || memcmp(out, text, want) != 0 ||
            stopped != want_stop) {
            fprintf(stderr, "iteration %d: got %zu bytes (stop %d), want %zu "
                    "(stop %d)\n", it, got, stopped, want, want_stop);
            bad = 1;
        }
        cinfer_textstream_destroy(ts);
    }
    CHECK(!bad);
}

/* Real tokens: the tiny model's byte-level BPE splits text into tokens; the
 * stream's output equals the decoded text cut before the stop string. */
static void test_tokens(void)
{
    cinfer_tinymodel_params mp = cinfer_tinymodel_default_params();
    void *buf = NULL;
    size_t size = 0;
    CHECK_OK(cinfer_tinymodel_write_mem(&mp, &buf, &size));
    cinfer_gguf_params gp = cinfer_gguf_default_params();
    gp.data = buf;
    gp.size = size;
    cinfer_gguf *g = NULL;
    CHECK_OK(cinfer_gguf_create(&gp, &g));
    cinfer_tokenizer_params tp = cinfer_tokenizer_default_params();
    tp.gguf = g;
    cinfer_tokenizer *tk = NULL;
    CHECK_OK(cinfer_tokenizer_create(&tp, &tk));
    if (!tk) {
        cinfer_gguf_destroy(g);
        free(buf);
        return;
    }
    const char *text = "The cat sat on the mat. The dog, caf\xC3\xA9 \xE2\x82\xAC"
                       "5, sat on the log. END of story";
    int32_t ids[256];
    size_t n_ids = 0;
    CHECK_OK(cinfer_tokenizer_encode(tk, text, strlen(text), 0, 0, ids, 256,
                                     &n_ids));
    CHECK(n_ids > 5);

    const char *stops[] = {"on the log", "zzz"};
    cinfer_textstream_params p = cinfer_textstream_default_params();
    p.tokenizer = tk;
    p.stop = stops;
    p.n_stop = 2;
    cinfer_textstream *ts = NULL;
    CHECK_OK(cinfer_textstream_create(&p, &ts));
    char out[512];
    size_t got = 0;
    int stopped = 0;
    size_t i;
    for (i = 0; i < n_ids && !stopped; i++) {
        const char *t;
        size_t n;
        CHECK_OK(cinfer_textstream_push(ts, ids[i], 1, 0, &t, &n, &stopped));
        memcpy(out + got, t, n);
        got += n;
    }
    CHECK(stopped);
    CHECK(i < n_ids); /* stopped before the end of the text */
    out[got] = 0;
    CHECK_EQ_STR(out, "The cat sat on the mat. The dog, caf\xC3\xA9 \xE2\x82\xAC"
                      "5, sat ");
    const char *t;
    size_t n;
    int s;
    CHECK_EQ_INT(cinfer_textstream_push(ts, 1 << 30, 1, 0, &t, &n, &s),
                 CINFER_OK); /* ignored after the stop */
    cinfer_textstream_destroy(ts);

    /* an id outside the vocabulary is an error and changes nothing */
    p.n_stop = 0;
    CHECK_OK(cinfer_textstream_create(&p, &ts));
    CHECK_EQ_INT(cinfer_textstream_push(ts, 1 << 30, 1, 0, &t, &n, &s),
                 CINFER_E_RANGE);
    got = 0;
    for (i = 0; i < n_ids; i++) {
        CHECK_OK(cinfer_textstream_push(ts, ids[i], 1, i + 1 == n_ids, &t, &n,
                                        &s));
        memcpy(out + got, t, n);
        got += n;
    }
    out[got] = 0;
    CHECK_EQ_STR(out, text);
    cinfer_textstream_destroy(ts);
    cinfer_tokenizer_destroy(tk);
    cinfer_gguf_destroy(g);
    free(buf);
}

int main(void)
{
    RUN(test_no_stops);
    RUN(test_multibyte_split);
    RUN(test_stop_split_across_tokens);
    RUN(test_withheld_then_released);
    RUN(test_stop_at_start);
    RUN(test_overlapping_stops);
    RUN(test_multibyte_stop);
    RUN(test_check_stop_off);
    RUN(test_final_push);
    RUN(test_bad_params);
    RUN(test_random_splits);
    RUN(test_tokens);
    return harness_done();
}
