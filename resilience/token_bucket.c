/*
 * token_bucket.c - lazy token bucket with exact integer refill
 * (resilience.h).
 *
 * The level is held in 1e-12 token units ("units"): with the rate in
 * milli-tokens per second, one nanosecond adds exactly rate_mtps units
 * (rate_mtps * 1e-3 tokens / 1e9 ns = rate_mtps * 1e-12 tokens per ns), so
 * refilling is one multiplication with no rounding, no matter how often or
 * how rarely it happens, and the wait for n tokens is a ceiling division.
 * 128-bit intermediates cover every product: elapsed (< 2^64 ns) times the
 * largest rate (1e18 mtps < 2^60), and the largest level (2^64 tokens *
 * 1e12 < 2^104).
 *
 * The stored level is whole + frac so that the struct holds only 64-bit
 * fields; a full bucket has frac == 0.
 */
#include "resilience/resilience.h"

#include <math.h>

typedef unsigned __int128 u128;

#define UNITS_PER_TOKEN 1000000000000ull /* 1e12 */

cinfer_tb_params cinfer_tb_default_params(void)
{
    cinfer_tb_params p = {.rate_per_s = 0, .burst = 0};
    return p;
}

cinfer_status cinfer_tb_init(cinfer_tb *tb, const cinfer_tb_params *p)
{
    if (!tb || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "token bucket: NULL");
    double r = p->rate_per_s;
    if (!isfinite(r) || r < 0 || r > CINFER_TB_MAX_RATE_PER_S)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "token bucket: rate_per_s %g is not in "
                                "[0, %g]",
                                r, CINFER_TB_MAX_RATE_PER_S);
    uint64_t mtps = (uint64_t)llround(r * 1000.0);
    if (r > 0 && mtps == 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "token bucket: rate_per_s %g is below the "
                                "resolution 0.001",
                                r);
    uint64_t burst = p->burst;
    if (burst == 0) {
        burst = mtps / 1000 + (mtps % 1000 != 0);
        if (burst == 0)
            burst = 1;
    }
    tb->rate_mtps = mtps;
    tb->burst = burst;
    tb->whole = burst;
    tb->frac = 0;
    tb->last_ns = 0;
    tb->started = 0;
    return CINFER_OK;
}

int cinfer_tb_enabled(const cinfer_tb *tb) { return tb->rate_mtps != 0; }

uint64_t cinfer_tb_capacity(const cinfer_tb *tb)
{
    return tb->rate_mtps ? tb->burst : UINT64_MAX;
}

static u128 level_units(const cinfer_tb *tb)
{
    return (u128)tb->whole * UNITS_PER_TOKEN + tb->frac;
}

static void set_level(cinfer_tb *tb, u128 units)
{
    tb->whole = (uint64_t)(units / UNITS_PER_TOKEN);
    tb->frac = (uint64_t)(units % UNITS_PER_TOKEN);
}

/* Brings the level up to now_ns. A time at or before the last one adds
 * nothing and leaves last_ns where it is, so a clock that steps back and
 * forth never refills the same interval twice. */
static void refill(cinfer_tb *tb, int64_t now_ns)
{
    if (!tb->started) {
        tb->started = 1;
        tb->last_ns = now_ns;
        return;
    }
    if (now_ns <= tb->last_ns)
        return;
    /* exact: the true difference is below 2^64 */
    uint64_t elapsed = (uint64_t)now_ns - (uint64_t)tb->last_ns;
    tb->last_ns = now_ns;
    if (tb->whole >= tb->burst)
        return;
    u128 cap = (u128)tb->burst * UNITS_PER_TOKEN;
    u128 level = level_units(tb) + (u128)elapsed * tb->rate_mtps;
    if (level >= cap) {
        tb->whole = tb->burst;
        tb->frac = 0;
    } else {
        set_level(tb, level);
    }
}

uint64_t cinfer_tb_available(cinfer_tb *tb, int64_t now_ns)
{
    if (!tb->rate_mtps)
        return UINT64_MAX;
    refill(tb, now_ns);
    return tb->whole;
}

/* The wait for n tokens at the current level (refill already done). */
static int64_t wait_for(const cinfer_tb *tb, uint64_t n)
{
    if (!tb->rate_mtps || n == 0)
        return 0;
    if (n > tb->burst)
        return INT64_MAX;
    u128 need = (u128)n * UNITS_PER_TOKEN;
    u128 have = level_units(tb);
    if (have >= need)
        return 0;
    u128 deficit = need - have;
    u128 ns = (deficit + tb->rate_mtps - 1) / tb->rate_mtps;
    return ns > (u128)INT64_MAX ? INT64_MAX : (int64_t)ns;
}

int64_t cinfer_tb_wait_ns(cinfer_tb *tb, uint64_t n, int64_t now_ns)
{
    if (!tb->rate_mtps)
        return 0;
    refill(tb, now_ns);
    return wait_for(tb, n);
}

int cinfer_tb_take(cinfer_tb *tb, uint64_t n, int64_t now_ns, int64_t *wait_ns)
{
    int64_t w = cinfer_tb_wait_ns(tb, n, now_ns);
    if (wait_ns)
        *wait_ns = w;
    if (w != 0)
        return 0;
    if (tb->rate_mtps && n)
        set_level(tb, level_units(tb) - (u128)n * UNITS_PER_TOKEN);
    return 1;
}
