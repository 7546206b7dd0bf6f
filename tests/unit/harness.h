/*
 * harness.h - the unit tests' tiny harness.
 *
 * A test file defines test functions and a main that runs them:
 *
 *     static void test_refill_exact(void) { CHECK_EQ_INT(tb_take(...), 0); }
 *     int main(void) { RUN(test_refill_exact); return harness_done(); }
 *
 * Failed checks print both values with file and line and the test goes on;
 * harness_done() prints "N passed, N failed" and returns the exit code.
 * harness_skip() returns 77 (ctest SKIP_RETURN_CODE) for tests whose
 * precondition (the default model, a GPU) is absent.
 */
#ifndef CINFER_TEST_HARNESS_H
#define CINFER_TEST_HARNESS_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

/* 1 in a build under AddressSanitizer (gcc or clang), where tests that
 * run the CUDA harness trim their largest cases. */
#if defined(__SANITIZE_ADDRESS__)
#define UNDER_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define UNDER_ASAN 1
#endif
#endif
#ifndef UNDER_ASAN
#define UNDER_ASAN 0
#endif

static int harness_failed_checks;
static int harness_tests_passed;
static int harness_tests_failed;

#define CHECK(cond)                                                            \
    do {                                                                       \
        if (!(cond)) {                                                         \
            fprintf(stderr, "%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__,   \
                    #cond);                                                    \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

#define CHECK_EQ_INT(a, b)                                                     \
    do {                                                                       \
        long long va_ = (long long)(a), vb_ = (long long)(b);                  \
        if (va_ != vb_) {                                                      \
            fprintf(stderr, "%s:%d: %s == %s failed: %lld vs %lld\n",         \
                    __FILE__, __LINE__, #a, #b, va_, vb_);                     \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

#define CHECK_EQ_STR(a, b)                                                     \
    do {                                                                       \
        const char *sa_ = (a), *sb_ = (b);                                     \
        if (!sa_ || !sb_ || strcmp(sa_, sb_) != 0) {                           \
            fprintf(stderr, "%s:%d: %s == %s failed: \"%s\" vs \"%s\"\n",     \
                    __FILE__, __LINE__, #a, #b, sa_ ? sa_ : "(null)",          \
                    sb_ ? sb_ : "(null)");                                     \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

/* |a - b| <= tol */
#define CHECK_NEAR(a, b, tol)                                                  \
    do {                                                                       \
        double da_ = (double)(a), db_ = (double)(b);                           \
        if (!(fabs(da_ - db_) <= (double)(tol))) {                             \
            fprintf(stderr, "%s:%d: %s ~= %s failed: %.9g vs %.9g (tol %g)\n", \
                    __FILE__, __LINE__, #a, #b, da_, db_, (double)(tol));      \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

/* Checks a status is CINFER_OK, printing the last error otherwise. */
#define CHECK_OK(expr)                                                         \
    do {                                                                       \
        int st_ = (int)(expr);                                                 \
        if (st_ != 0) {                                                        \
            fprintf(stderr, "%s:%d: %s returned %d: %s\n", __FILE__,          \
                    __LINE__, #expr, st_, cinfer_last_error());                \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

#define RUN(fn)                                                                \
    do {                                                                       \
        int before_ = harness_failed_checks;                                   \
        fn();                                                                  \
        if (harness_failed_checks == before_) {                                \
            harness_tests_passed++;                                            \
            fprintf(stderr, "ok   %s\n", #fn);                                 \
        } else {                                                               \
            harness_tests_failed++;                                            \
            fprintf(stderr, "FAIL %s\n", #fn);                                 \
        }                                                                      \
    } while (0)

static inline int harness_done(void)
{
    fprintf(stderr, "%d passed, %d failed\n", harness_tests_passed,
            harness_tests_failed);
    return harness_tests_failed ? 1 : 0;
}

static inline int harness_skip(const char *why)
{
    fprintf(stderr, "SKIP: %s\n", why);
    return 77;
}

/* Deterministic xorshift random numbers for test data. */
static inline uint64_t harness_rand(uint64_t *s)
{
    uint64_t x = *s;
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return *s = x;
}

/* Uniform float in [-1, 1). */
static inline float harness_randf(uint64_t *s)
{
    return (float)((harness_rand(s) >> 40) * (1.0 / 8388608.0)) - 1.0f;
}

#endif /* CINFER_TEST_HARNESS_H */
