/*
 * test_server_log.c - JSON-lines logging (server/log.c): escaping, levels,
 * and lines that stay valid JSON when a value is too long.
 *
 * The log writes to file descriptor 2; the test points it at a temporary
 * file for the duration of each check.
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

#include "server/log.h"

static char captured[8192];

/* Runs fn with stderr redirected; the output lands in `captured`. */
static void capture(void (*fn)(void))
{
    fflush(stderr);
    FILE *tmp = tmpfile();
    int saved = dup(2);
    dup2(fileno(tmp), 2);
    fn();
    dup2(saved, 2);
    close(saved);
    rewind(tmp);
    size_t n = fread(captured, 1, sizeof captured - 1, tmp);
    captured[n] = '\0';
    fclose(tmp);
}

static void emit_escapes(void)
{
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_INFO, "say \"hi\"", "r-1")) {
        cinfer_log_str(&l, "text", "a\\b\nc\x01");
        cinfer_log_int(&l, "n", -42);
        cinfer_log_double(&l, "ms", 1.5);
        cinfer_log_end(&l);
    }
}

static void test_escapes(void)
{
    cinfer_log_set_level(CINFER_LOG_INFO);
    capture(emit_escapes);
    CHECK(strncmp(captured, "{\"ts\":\"", 7) == 0);
    CHECK(strstr(captured, "\"level\":\"info\"") != NULL);
    CHECK(strstr(captured, "\"msg\":\"say \\\"hi\\\"\"") != NULL);
    CHECK(strstr(captured, "\"request_id\":\"r-1\"") != NULL);
    CHECK(strstr(captured, "\"text\":\"a\\\\b\\nc\\u0001\"") != NULL);
    CHECK(strstr(captured, "\"n\":-42") != NULL);
    CHECK(strstr(captured, "\"ms\":1.500") != NULL);
    size_t n = strlen(captured);
    CHECK(n > 2 && strcmp(captured + n - 2, "}\n") == 0);
    CHECK(strchr(captured, '\n') == captured + n - 1); /* one line */
}

static void emit_debug(void)
{
    cinfer_log(CINFER_LOG_DEBUG, "hidden", NULL);
    cinfer_log(CINFER_LOG_WARN, "shown", NULL);
}

static void test_levels(void)
{
    cinfer_log_set_level(CINFER_LOG_INFO);
    capture(emit_debug);
    CHECK(strstr(captured, "hidden") == NULL);
    CHECK(strstr(captured, "\"level\":\"warn\",\"msg\":\"shown\"") != NULL);
    CHECK_EQ_INT(cinfer_log_level_parse("debug"), CINFER_LOG_DEBUG);
    CHECK_EQ_INT(cinfer_log_level_parse("WARNING"), CINFER_LOG_WARN);
    CHECK_EQ_INT(cinfer_log_level_parse("off"), CINFER_LOG_OFF);
    CHECK_EQ_INT(cinfer_log_level_parse("loud"), -1);
    cinfer_log_set_level(CINFER_LOG_OFF);
    capture(emit_debug);
    CHECK_EQ_STR(captured, "");
    cinfer_log_set_level(CINFER_LOG_INFO);
}

static void emit_long(void)
{
    static char big[5000];
    memset(big, 'x', sizeof big - 1);
    big[100] = '"';
    cinfer_log_line l;
    if (cinfer_log_begin(&l, CINFER_LOG_ERROR, "long", NULL)) {
        cinfer_log_str(&l, "a", "short");
        cinfer_log_str(&l, "big", big);
        cinfer_log_int(&l, "after", 7);
        cinfer_log_end(&l);
    }
}

static void test_truncation(void)
{
    capture(emit_long);
    size_t n = strlen(captured);
    CHECK(n < 2100);
    CHECK(n > 2 && strcmp(captured + n - 2, "}\n") == 0);
    CHECK(strstr(captured, "\"a\":\"short\"") != NULL);
    /* Quotes balance: every unescaped quote has a partner. */
    int quotes = 0;
    for (size_t i = 0; i < n; i++)
        if (captured[i] == '"' && (i == 0 || captured[i - 1] != '\\'))
            quotes++;
    CHECK_EQ_INT(quotes % 2, 0);
}

/* A flood of lines: the burst, then per_s a second, the dropped ones
 * counted into the next line let through. */
static void test_limit(void)
{
    cinfer_log_limit r;
    cinfer_log_limit_init(&r, 5, 20);
    int64_t t = 1000000000;
    uint64_t sup = 99;
    int passed = 0;
    for (int i = 0; i < 10000; i++)
        passed += cinfer_log_limit_take(&r, t, &sup);
    CHECK_EQ_INT(passed, 20);
    /* 0.2 s later: one more, carrying the 9980 dropped. */
    CHECK_EQ_INT(cinfer_log_limit_take(&r, t + 200000000, &sup), 1);
    CHECK_EQ_INT(sup, 9980);
    CHECK_EQ_INT(cinfer_log_limit_take(&r, t + 200000000, &sup), 0);
    /* A second of flood at 1 line per ms: 5 pass. */
    passed = 0;
    for (int ms = 1; ms <= 1000; ms++)
        passed += cinfer_log_limit_take(&r, t + 200000000 + ms * 1000000LL,
                                        &sup);
    CHECK(passed >= 4 && passed <= 6);
    /* A clock that goes back lets nothing extra through. */
    CHECK_EQ_INT(cinfer_log_limit_take(&r, t, &sup), 0);
}

int main(void)
{
    RUN(test_limit);
    RUN(test_escapes);
    RUN(test_levels);
    RUN(test_truncation);
    return harness_done();
}
#endif
