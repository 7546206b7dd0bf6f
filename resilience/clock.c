/*
 * clock.c - the monotonic clock the server reads and passes to the
 * resilience primitives (clock.h). Kept apart so that nothing else in
 * resilience/ can read time behind a test's back.
 */
#include "resilience/clock.h"

#include <time.h>

int64_t cinfer_clock_now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
