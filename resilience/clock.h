/*
 * clock.h - the resilience library's time source and time arithmetic.
 *
 * Every primitive in resilience/ takes the current time as an argument
 * (`cinfer_tb_take(tb, n, now_ns)`) instead of reading a clock, so tests
 * drive time directly and no primitive ever sleeps or races a clock. Times
 * are int64 nanoseconds on one monotonic clock; production code reads it
 * with cinfer_clock_now_ns() and passes the value down, tests pass numbers.
 *
 * The convention, which every primitive follows:
 *   - a time earlier than one already seen is treated as no time passing
 *     (nothing refills, nothing expires, no state moves backwards);
 *   - sums and products of times saturate at INT64_MAX instead of
 *     overflowing, so "now + wait" near the end of the range stays defined.
 *
 *     int64_t now = cinfer_clock_now_ns();
 *     int64_t until = cinfer_ns_add_sat(now, cinfer_ms_to_ns(wait_ms));
 */
#ifndef CINFER_RESILIENCE_CLOCK_H
#define CINFER_RESILIENCE_CLOCK_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* CLOCK_MONOTONIC in nanoseconds. Thread-safe. The only clock read in
 * resilience/; the primitives never call it themselves. */
int64_t cinfer_clock_now_ns(void);

/* t + d, saturating at INT64_MAX and INT64_MIN. */
static inline int64_t cinfer_ns_add_sat(int64_t t, int64_t d)
{
    int64_t r;
    if (__builtin_add_overflow(t, d, &r))
        return d > 0 ? INT64_MAX : INT64_MIN;
    return r;
}

/* Milliseconds to nanoseconds, saturating at INT64_MAX; negative gives 0. */
static inline int64_t cinfer_ms_to_ns(int64_t ms)
{
    if (ms <= 0)
        return 0;
    if (ms > INT64_MAX / 1000000)
        return INT64_MAX;
    return ms * 1000000;
}

/* Nanoseconds to milliseconds rounded up (a pushback never ends early);
 * negative gives 0. */
static inline int64_t cinfer_ns_to_ms_ceil(int64_t ns)
{
    if (ns <= 0)
        return 0;
    return ns / 1000000 + (ns % 1000000 != 0);
}

#ifdef __cplusplus
}
#endif
#endif /* CINFER_RESILIENCE_CLOCK_H */
