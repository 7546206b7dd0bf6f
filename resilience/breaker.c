/*
 * breaker.c - circuit breaker with resilience4j's semantics (resilience.h).
 *
 * The window is a ring of time buckets, each bucket_ns wide; the bucket of
 * time t is epoch(t) % n where epoch(t) = floor(t / bucket_ns) (shifted to
 * unsigned, so negative times order correctly). Moving to a later epoch
 * clears the buckets passed over and subtracts them from the running
 * totals, at most n buckets per move, so recording is O(1) amortised and
 * memory is fixed. The window thus covers the current bucket and the n - 1
 * before it.
 *
 * Generations: every transition bumps `gen`; a permit carries the gen it was
 * issued in, and an outcome whose permit is of another generation is
 * counted as stale and otherwise ignored. That keeps the window of a
 * freshly closed breaker free of failures from before it opened, and keeps
 * half-open probe accounting exact when ordinary calls finish late.
 */
#include "resilience/resilience.h"

#include <string.h>

typedef unsigned __int128 u128;

cinfer_breaker_params cinfer_breaker_default_params(void)
{
    cinfer_breaker_params p = {
        .failure_rate_pct = 50,
        .min_calls = 20,
        .window_ms = 10000,
        .window_buckets = 10,
        .wait_ms = 5000,
        .max_wait_ms = 60000,
        .wait_multiplier = 2,
        .half_open_probes = 3,
    };
    return p;
}

const char *cinfer_breaker_state_name(cinfer_breaker_state s)
{
    switch (s) {
    case CINFER_BREAKER_CLOSED:
        return "closed";
    case CINFER_BREAKER_OPEN:
        return "open";
    case CINFER_BREAKER_HALF_OPEN:
        return "half_open";
    case CINFER_BREAKER_STATE_COUNT:
        break;
    }
    return "unknown";
}

cinfer_status cinfer_breaker_init(cinfer_breaker *b,
                                  const cinfer_breaker_params *p)
{
    if (!b || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG, "breaker: NULL");
    if (p->failure_rate_pct > 100)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "breaker: failure_rate_pct %u exceeds 100",
                                p->failure_rate_pct);
    if (p->window_ms < 0 || p->wait_ms < 0 || p->max_wait_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "breaker: window_ms, wait_ms and max_wait_ms "
                                "must not be negative");
    if (p->window_buckets > CINFER_BREAKER_MAX_BUCKETS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "breaker: window_buckets %u exceeds %d",
                                p->window_buckets, CINFER_BREAKER_MAX_BUCKETS);
    cinfer_breaker_params r = *p;
    if (!r.min_calls)
        r.min_calls = 1;
    if (!r.window_ms)
        r.window_ms = 10000;
    if (!r.window_buckets)
        r.window_buckets = 10;
    if (!r.wait_ms)
        r.wait_ms = 5000;
    if (!r.max_wait_ms)
        r.max_wait_ms = 60000;
    if (r.max_wait_ms < r.wait_ms)
        r.max_wait_ms = r.wait_ms;
    if (!r.wait_multiplier)
        r.wait_multiplier = 2;
    if (!r.half_open_probes)
        r.half_open_probes = 3;

    memset(b, 0, sizeof *b);
    b->p = r;
    b->bucket_ns = cinfer_ms_to_ns(r.window_ms) / r.window_buckets;
    if (b->bucket_ns < 1)
        b->bucket_ns = 1;
    b->state = CINFER_BREAKER_CLOSED;
    b->gen = 1;
    return CINFER_OK;
}

/* ---------------------------------------------------------------------- */
/* Time and window                                                        */
/* ---------------------------------------------------------------------- */

/* floor(t / bucket_ns), shifted to unsigned so that order is kept and
 * bucket boundaries fall on multiples of bucket_ns. */
static uint64_t epoch_of(const cinfer_breaker *b, int64_t t)
{
    int64_t q = t / b->bucket_ns;
    if (t % b->bucket_ns < 0)
        q--;
    return (uint64_t)q ^ (1ull << 63);
}

/* The effective time: never earlier than one already seen. */
static int64_t see(cinfer_breaker *b, int64_t now_ns)
{
    if (!b->started) {
        b->started = 1;
        b->last_ns = now_ns;
        b->head_epoch = epoch_of(b, now_ns);
    } else if (now_ns > b->last_ns) {
        b->last_ns = now_ns;
    }
    return b->last_ns;
}

static void clear_window(cinfer_breaker *b)
{
    memset(b->buckets, 0, sizeof b->buckets);
    b->calls = b->failures = 0;
}

/* Moves the window's head to the epoch of t, clearing what falls out. */
static void advance(cinfer_breaker *b, int64_t t)
{
    uint64_t e = epoch_of(b, t);
    if (e <= b->head_epoch)
        return;
    uint32_t n = b->p.window_buckets;
    if (e - b->head_epoch >= n) {
        clear_window(b);
    } else {
        for (uint64_t x = b->head_epoch + 1; x <= e; x++) {
            cinfer_breaker_bucket *k = &b->buckets[x % n];
            b->calls -= k->calls;
            b->failures -= k->failures;
            k->calls = k->failures = 0;
            k->epoch = x;
        }
    }
    b->head_epoch = e;
    b->buckets[e % n].epoch = e;
}

/* ---------------------------------------------------------------------- */
/* Transitions                                                            */
/* ---------------------------------------------------------------------- */

static int64_t open_wait_ns(const cinfer_breaker *b)
{
    int64_t w = cinfer_ms_to_ns(b->p.wait_ms);
    int64_t cap = cinfer_ms_to_ns(b->p.max_wait_ms);
    int64_t m = b->p.wait_multiplier;
    for (uint32_t i = 1; i < b->trips && m > 1 && w < cap; i++) {
        if (w > cap / m) {
            w = cap;
            break;
        }
        w *= m;
    }
    return w < cap ? w : cap;
}

static void to_state(cinfer_breaker *b, cinfer_breaker_state s)
{
    b->state = s;
    b->gen++;
    b->transitions[s]++;
}

static void trip(cinfer_breaker *b, int64_t t)
{
    if (b->trips < UINT32_MAX)
        b->trips++;
    b->open_until_ns = cinfer_ns_add_sat(t, open_wait_ns(b));
    b->probes_out = b->probes_ok = 0;
    clear_window(b);
    to_state(b, CINFER_BREAKER_OPEN);
}

static void close_breaker(cinfer_breaker *b)
{
    b->trips = 0;
    b->probes_out = b->probes_ok = 0;
    clear_window(b);
    to_state(b, CINFER_BREAKER_CLOSED);
}

/* ---------------------------------------------------------------------- */
/* Acquire, record                                                        */
/* ---------------------------------------------------------------------- */

int cinfer_breaker_acquire(cinfer_breaker *b, int64_t now_ns,
                           cinfer_breaker_permit *permit,
                           int64_t *retry_after_ns)
{
    int64_t t = see(b, now_ns);
    permit->gen = b->gen;
    permit->probe = 0;
    permit->valid = 0;
    if (retry_after_ns)
        *retry_after_ns = 0;
    if (b->p.failure_rate_pct == 0 || b->state == CINFER_BREAKER_CLOSED) {
        permit->valid = 1;
        return 1;
    }
    if (b->state == CINFER_BREAKER_OPEN) {
        if (t < b->open_until_ns) {
            if (retry_after_ns)
                *retry_after_ns = b->open_until_ns - t;
            return 0;
        }
        b->probes_out = b->probes_ok = 0;
        to_state(b, CINFER_BREAKER_HALF_OPEN);
    }
    /* HALF_OPEN */
    if (b->probes_out + b->probes_ok >= b->p.half_open_probes) {
        if (retry_after_ns)
            *retry_after_ns = cinfer_ms_to_ns(b->p.wait_ms);
        return 0;
    }
    b->probes_out++;
    permit->gen = b->gen;
    permit->probe = 1;
    permit->valid = 1;
    return 1;
}

void cinfer_breaker_record(cinfer_breaker *b, cinfer_breaker_permit *permit,
                           cinfer_outcome o, int64_t now_ns)
{
    if (!permit->valid)
        return;
    permit->valid = 0;
    int64_t t = see(b, now_ns);
    if (b->p.failure_rate_pct == 0)
        return;
    if (permit->gen != b->gen) {
        b->stale_outcomes++;
        return;
    }
    if (b->state == CINFER_BREAKER_CLOSED) {
        if (o == CINFER_OUTCOME_IGNORED)
            return;
        advance(b, t);
        cinfer_breaker_bucket *k =
            &b->buckets[b->head_epoch % b->p.window_buckets];
        k->calls++;
        b->calls++;
        if (o == CINFER_OUTCOME_FAILURE) {
            k->failures++;
            b->failures++;
        }
        if (b->calls >= b->p.min_calls &&
            (u128)b->failures * 100 >= (u128)b->p.failure_rate_pct * b->calls)
            trip(b, t);
        return;
    }
    if (b->state == CINFER_BREAKER_HALF_OPEN && permit->probe) {
        CINFER_ASSERT(b->probes_out > 0);
        b->probes_out--;
        if (o == CINFER_OUTCOME_IGNORED)
            return;
        if (o == CINFER_OUTCOME_FAILURE) {
            trip(b, t);
            return;
        }
        b->probes_ok++;
        if (b->probes_ok >= b->p.half_open_probes)
            close_breaker(b);
    }
}

cinfer_breaker_state cinfer_breaker_get_state(const cinfer_breaker *b)
{
    return b->state;
}

void cinfer_breaker_window(cinfer_breaker *b, int64_t now_ns, uint64_t *calls,
                           uint64_t *failures)
{
    int64_t t = see(b, now_ns);
    advance(b, t);
    if (calls)
        *calls = b->calls;
    if (failures)
        *failures = b->failures;
}
