/*
 * resilience.h - the resilience library's public header: token buckets, a
 * bounded table of per-client buckets, a circuit breaker, a load shedder
 * with CoDel, and the admission object that composes them.
 *
 * The server decides, before a request reaches the engine, whether to take
 * it; this library makes that decision from numbers and outcomes the server
 * feeds it, and knows neither gRPC nor the engine. The order is fixed:
 *
 *     token bucket (global, then per client) -> breaker -> shedder
 *
 * and a rejection carries a reason (cinfer_reject) and a pushback: how long
 * the client should wait before retrying, in milliseconds, rounded up.
 *
 * The primitives (cinfer_tb, cinfer_breaker, cinfer_codel, cinfer_shedder)
 * are plain value types the caller embeds: no threads, locks, allocations or
 * clock reads inside, the time is passed in (clock.h gives the convention:
 * a clock that goes backwards means no time passed; arithmetic saturates).
 * A caller that shares one between threads locks around it. The client
 * table allocates once, at create. cinfer_admission is the only object with
 * a lock: the server calls it from several gRPC threads.
 *
 *     cinfer_admission_params ap = cinfer_admission_default_params();
 *     ap.global.rate_per_s = 100;            // --rate-limit-qps
 *     cinfer_admission *adm;
 *     if (cinfer_admission_create(&ap, &adm) != CINFER_OK) ...
 *
 *     cinfer_admission_request rq = {.client_id = id, .client_id_len = n,
 *                                    .cost = 1, .tokens = prompt + max_new,
 *                                    .priority = 0, .deadline_ns = dl};
 *     cinfer_admission_decision d;
 *     cinfer_admission_ticket t;
 *     cinfer_admission_admit(adm, &rq, cinfer_clock_now_ns(), &d, &t);
 *     if (d.reason != CINFER_REJECT_NONE)
 *         ...send cinfer_reject_status(d.reason) with d.retry_after_ms
 *     ...when the engine starts it:   cinfer_admission_dequeue(adm, &t, now,
 *                                         waited_for_a_turn_ns);
 *     ...when it ends, however:       cinfer_admission_finish(adm, &t,
 *                                         CINFER_OUTCOME_SUCCESS, now);
 */
#ifndef CINFER_RESILIENCE_H
#define CINFER_RESILIENCE_H

#include "../common/status.h"
#include "clock.h"

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ---------------------------------------------------------------------- */
/* Rejection reasons                                                      */
/* ---------------------------------------------------------------------- */

/* X(name, metric label, status the server maps to a gRPC code) */
#define CINFER_REJECT_LIST(X)                                                  \
    X(CINFER_REJECT_NONE, "none", CINFER_OK)                                   \
    X(CINFER_REJECT_RATE_LIMITED_GLOBAL, "rate_limited_global",                \
      CINFER_E_EXHAUSTED)                                                      \
    X(CINFER_REJECT_RATE_LIMITED_CLIENT, "rate_limited_client",                \
      CINFER_E_EXHAUSTED)                                                      \
    X(CINFER_REJECT_BREAKER_OPEN, "breaker_open", CINFER_E_UNAVAILABLE)        \
    X(CINFER_REJECT_SHED_QUEUE_FULL, "shed_queue_full", CINFER_E_UNAVAILABLE)  \
    X(CINFER_REJECT_SHED_TOKENS, "shed_tokens", CINFER_E_UNAVAILABLE)          \
    X(CINFER_REJECT_SHED_DEADLINE, "shed_deadline", CINFER_E_TIMEOUT)          \
    X(CINFER_REJECT_SHED_CODEL, "shed_codel", CINFER_E_UNAVAILABLE)            \
    X(CINFER_REJECT_SHED_KV_PRESSURE, "shed_kv_pressure",                      \
      CINFER_E_UNAVAILABLE)                                                    \
    X(CINFER_REJECT_SHED_FIRST_TOKEN, "shed_first_token",                      \
      CINFER_E_UNAVAILABLE)                                                    \
    X(CINFER_REJECT_SHED_QUEUE_WAIT, "shed_queue_wait", CINFER_E_UNAVAILABLE)  \
    X(CINFER_REJECT_DRAINING, "draining", CINFER_E_UNAVAILABLE)

typedef enum {
#define CINFER_REJECT_ENUM_(name, label, status) name,
    CINFER_REJECT_LIST(CINFER_REJECT_ENUM_)
#undef CINFER_REJECT_ENUM_
        CINFER_REJECT_COUNT
} cinfer_reject;

/* The reason's metric label ("shed_codel"); "unknown" out of range. */
const char *cinfer_reject_name(cinfer_reject r);
/* The project status a rejection maps to (the server turns it into a gRPC
 * code in its one mapping function): rate limits CINFER_E_EXHAUSTED
 * (RESOURCE_EXHAUSTED), a deadline that cannot be met CINFER_E_TIMEOUT
 * (DEADLINE_EXCEEDED), the rest CINFER_E_UNAVAILABLE; NONE is CINFER_OK. */
cinfer_status cinfer_reject_status(cinfer_reject r);

/* How a request ended, as the caller classifies it for the breaker. */
typedef enum {
    CINFER_OUTCOME_SUCCESS = 0, /* finished, or a client-side end the server
                                   did not cause is better IGNORED */
    CINFER_OUTCOME_FAILURE,     /* a server fault: INTERNAL, a device error,
                                   a deadline that expired while the server
                                   held the request */
    CINFER_OUTCOME_IGNORED,     /* counts for nothing: client cancel, invalid
                                   request, rate limited, shed; releases a
                                   half-open probe permit */
    CINFER_OUTCOME_COUNT
} cinfer_outcome;

/* ---------------------------------------------------------------------- */
/* Token bucket                                                           */
/* ---------------------------------------------------------------------- */
/*
 * A bucket of `burst` tokens that refills at `rate_per_s`, lazily: the
 * level is brought up to date from the elapsed time whenever it is looked
 * at. It starts full. A request may take more than one token. The level is
 * kept exactly, in 1e-12 token units with 128-bit intermediates, so refill
 * never drifts and the wait for n tokens is exact to the nanosecond: at
 * now + wait the tokens are there, one nanosecond earlier they are not.
 *
 *     cinfer_tb_params p = {.rate_per_s = 10, .burst = 5};
 *     cinfer_tb tb;
 *     cinfer_tb_init(&tb, &p);
 *     int64_t wait_ns;
 *     if (!cinfer_tb_take(&tb, 1, now_ns, &wait_ns)) ...retry after wait_ns
 */

#define CINFER_TB_MAX_RATE_PER_S 1e15 /* larger rates are refused */

typedef struct {
    double rate_per_s; /* tokens added per second, resolution 0.001 (the
                          value is rounded to it once, at init);
                          0 = off: every take succeeds */
    uint64_t burst;    /* capacity and starting level, in tokens;
                          0 = one second's worth, at least 1 */
} cinfer_tb_params;

/* rate 0 (off), burst 0. */
cinfer_tb_params cinfer_tb_default_params(void);

/* A bucket. Fields are private; it owns no resources (no cleanup). */
typedef struct {
    uint64_t rate_mtps; /* milli-tokens per second; 0 = off */
    uint64_t burst;     /* capacity in tokens */
    uint64_t whole;     /* level: whole tokens... */
    uint64_t frac;      /* ...plus this many 1e-12 tokens (< 1e12) */
    int64_t last_ns;    /* time of the last refill */
    int started;        /* 0 until the first look at a time */
} cinfer_tb;

/* Sets up a full bucket. CINFER_E_INVALID_ARG (naming the field) for a
 * negative, non-finite or too large rate; the bucket is untouched then. */
cinfer_status cinfer_tb_init(cinfer_tb *tb, const cinfer_tb_params *p);

/* 1 when the bucket limits anything (rate > 0). */
int cinfer_tb_enabled(const cinfer_tb *tb);

/* The capacity in tokens (UINT64_MAX when off). */
uint64_t cinfer_tb_capacity(const cinfer_tb *tb);

/* Refills to now_ns and returns the whole tokens in the bucket
 * (UINT64_MAX when off). */
uint64_t cinfer_tb_available(cinfer_tb *tb, int64_t now_ns);

/* Refills to now_ns and returns the nanoseconds until n tokens are there:
 * 0 when they are now, INT64_MAX when never (n > capacity) or when the
 * wait exceeds the int64 range. Takes nothing. */
int64_t cinfer_tb_wait_ns(cinfer_tb *tb, uint64_t n, int64_t now_ns);

/* Takes n tokens if they are all there (returns 1) or none (returns 0).
 * *wait_ns (may be NULL) gets cinfer_tb_wait_ns() as it was before the
 * take: 0 on success. n = 0 always succeeds. */
int cinfer_tb_take(cinfer_tb *tb, uint64_t n, int64_t now_ns, int64_t *wait_ns);

/* ---------------------------------------------------------------------- */
/* Client table                                                           */
/* ---------------------------------------------------------------------- */
/*
 * A bounded table of per-client token buckets keyed by client id (the
 * x-client-id metadata or the peer address): a hash table with chaining
 * over a fixed array of entries, plus a least-recently-used list. Lookup is
 * O(1); when the table is full a new id evicts the least recently used one,
 * so memory is fixed at create whatever the number of distinct ids. An
 * evicted client that returns gets a fresh, full bucket. The hash is
 * SipHash-1-3 under `hash_seed`, so ids chosen to collide need the seed.
 * Not thread-safe: the caller locks (cinfer_admission does).
 */

typedef struct cinfer_client_table cinfer_client_table;

typedef struct {
    size_t max_clients;      /* entries; the least recently used is evicted
                                beyond it; 0 = 10000 */
    size_t max_id_bytes;     /* longest id accepted; longer ids are refused
                                with CINFER_E_INVALID_ARG; 0 = 128 */
    uint64_t hash_seed[2];   /* SipHash key; pass random bytes in
                                production; {0, 0} = a fixed key */
    cinfer_tb_params bucket; /* each client's bucket; rate 0 = the table
                                still works, every bucket is unlimited */
} cinfer_client_table_params;

cinfer_client_table_params cinfer_client_table_default_params(void);

/* Allocates every entry up front. CINFER_E_INVALID_ARG for bad bucket
 * params, CINFER_E_NOMEM. */
cinfer_status cinfer_client_table_create(const cinfer_client_table_params *p,
                                         cinfer_client_table **out);
void cinfer_client_table_destroy(cinfer_client_table *t);

/* The bucket of `id` (len bytes, need not be NUL-terminated), created full
 * when absent (evicting the least recently used client when the table is
 * full), and marked most recently used. The pointer stays valid until the
 * next call to _get on this table. CINFER_E_INVALID_ARG when len exceeds
 * max_id_bytes (nothing changes then). */
cinfer_status cinfer_client_table_get(cinfer_client_table *t, const char *id,
                                      size_t len, cinfer_tb **out);

/* The bucket of `id` or NULL; neither creates nor reorders. */
cinfer_tb *cinfer_client_table_find(cinfer_client_table *t, const char *id,
                                    size_t len);

size_t cinfer_client_table_size(const cinfer_client_table *t);
size_t cinfer_client_table_capacity(const cinfer_client_table *t);
uint64_t cinfer_client_table_evictions(const cinfer_client_table *t);

/* ---------------------------------------------------------------------- */
/* Circuit breaker                                                        */
/* ---------------------------------------------------------------------- */
/*
 * resilience4j's count-by-time breaker. CLOSED: outcomes go into a sliding
 * window of `window_buckets` time buckets spanning `window_ms`; once the
 * window holds at least min_calls outcomes and failures * 100 >=
 * failure_rate_pct * calls, it trips to OPEN. OPEN: every acquire is
 * refused with the time left; the wait doubles (wait_multiplier) with each
 * trip since the breaker last closed, up to max_wait_ms. The move to
 * HALF_OPEN is lazy: the first acquire after the wait makes it. HALF_OPEN:
 * exactly half_open_probes permits are handed out; when all of them have
 * succeeded the breaker closes (empty window, wait back to wait_ms), the
 * first failure reopens it. An IGNORED outcome counts for nothing and gives
 * its probe permit back, so client cancellations never leak a permit.
 *
 * Every acquire returns a permit naming the state generation it was issued
 * in; an outcome counts only in the generation that admitted the call (a
 * call admitted before a trip and finishing after it counts for nothing).
 *
 *     cinfer_breaker_permit pm;
 *     int64_t retry_ns;
 *     if (!cinfer_breaker_acquire(&b, now, &pm, &retry_ns)) ...refuse
 *     ...run the call...
 *     cinfer_breaker_record(&b, &pm, CINFER_OUTCOME_FAILURE, now);
 */

#define CINFER_BREAKER_MAX_BUCKETS 64

typedef enum {
    CINFER_BREAKER_CLOSED = 0,
    CINFER_BREAKER_OPEN,
    CINFER_BREAKER_HALF_OPEN,
    CINFER_BREAKER_STATE_COUNT
} cinfer_breaker_state;

/* "closed", "open", "half_open". */
const char *cinfer_breaker_state_name(cinfer_breaker_state s);

typedef struct {
    uint32_t failure_rate_pct; /* trips at failures*100 >= pct*calls, 1..100;
                                  0 = breaker off (every acquire passes) */
    uint32_t min_calls;        /* outcomes the window must hold before the
                                  rate is judged; 0 = 1 */
    int64_t window_ms;         /* span of the sliding window; 0 = 10000 */
    uint32_t window_buckets;   /* time buckets in the window, at most
                                  CINFER_BREAKER_MAX_BUCKETS; 0 = 10 */
    int64_t wait_ms;           /* OPEN time after the first trip; 0 = 5000 */
    int64_t max_wait_ms;       /* cap of the growing OPEN time; 0 = 60000;
                                  below wait_ms = wait_ms (no growth) */
    uint32_t wait_multiplier;  /* OPEN time factor per further trip; 0 = 2,
                                  1 = constant */
    uint32_t half_open_probes; /* calls let through in HALF_OPEN; 0 = 3 */
} cinfer_breaker_params;

/* 50 %, 20 calls, 10 s window in 10 buckets, 5 s wait doubling to 60 s,
 * 3 probes. */
cinfer_breaker_params cinfer_breaker_default_params(void);

/* What an acquire hands out; pass it back to cinfer_breaker_record(). */
typedef struct {
    uint64_t gen; /* state generation it was issued in */
    int probe;    /* 1 = a HALF_OPEN probe */
    int valid;    /* 0 = refused, or already recorded */
} cinfer_breaker_permit;

typedef struct {
    uint64_t epoch; /* bucket_ns-wide time slot this bucket counts */
    uint64_t calls;
    uint64_t failures;
} cinfer_breaker_bucket;

/* A breaker. Fields are private; it owns no resources (no cleanup). */
typedef struct {
    cinfer_breaker_params p; /* with the 0 defaults resolved */
    int64_t bucket_ns;
    cinfer_breaker_state state;
    uint64_t gen;    /* bumped on every transition */
    int64_t last_ns; /* latest time seen */
    int started;
    /* CLOSED: the window */
    cinfer_breaker_bucket buckets[CINFER_BREAKER_MAX_BUCKETS];
    uint64_t head_epoch;
    uint64_t calls, failures; /* totals over the live buckets */
    /* OPEN */
    int64_t open_until_ns;
    uint32_t trips; /* trips since the breaker last closed */
    /* HALF_OPEN */
    uint32_t probes_out; /* permits handed out and not yet recorded */
    uint32_t probes_ok;  /* successes so far */
    /* counters */
    uint64_t transitions[CINFER_BREAKER_STATE_COUNT]; /* into each state */
    uint64_t stale_outcomes; /* outcomes of another generation */
} cinfer_breaker;

/* CINFER_E_INVALID_ARG (naming the field) for out-of-range params. */
cinfer_status cinfer_breaker_init(cinfer_breaker *b,
                                  const cinfer_breaker_params *p);

/* Asks to let one call through. Returns 1 with a valid *permit, or 0 with
 * *retry_after_ns (may be NULL): the time left OPEN, or with every probe
 * out, wait_ms. Makes the lazy OPEN -> HALF_OPEN move. */
int cinfer_breaker_acquire(cinfer_breaker *b, int64_t now_ns,
                           cinfer_breaker_permit *permit,
                           int64_t *retry_after_ns);

/* Records the outcome of a permitted call and invalidates *permit (a second
 * record of the same permit does nothing). */
void cinfer_breaker_record(cinfer_breaker *b, cinfer_breaker_permit *permit,
                           cinfer_outcome o, int64_t now_ns);

/* The stored state (lazy: OPEN until an acquire after the wait). */
cinfer_breaker_state cinfer_breaker_get_state(const cinfer_breaker *b);

/* Expires old buckets up to now_ns and returns the window's totals. */
void cinfer_breaker_window(cinfer_breaker *b, int64_t now_ns, uint64_t *calls,
                           uint64_t *failures);

/* ---------------------------------------------------------------------- */
/* CoDel                                                                  */
/* ---------------------------------------------------------------------- */
/*
 * Controlled delay on queue wait, in folly's form (folly/executors/Codel):
 * time is cut into intervals; at the first dequeue after an interval ends,
 * the queue is judged overloaded if the smallest wait seen in that interval
 * exceeded target, and a new interval starts with that request, which is
 * never dropped (so at least two requests are seen in an interval before a
 * drop). While overloaded, a request whose wait exceeds twice the target
 * (the slough timeout) is dropped. Unlike classic CoDel the drop rate does
 * not ramp; unlike folly, an interval with no dequeue at all (an idle
 * queue) ends overload instead of carrying a stale minimum forward.
 */

typedef struct {
    int64_t target_ms;   /* acceptable standing queue wait; 0 = CoDel off */
    int64_t interval_ms; /* judging interval; 0 = 100 */
} cinfer_codel_params;

/* 5 ms target, 100 ms interval. */
cinfer_codel_params cinfer_codel_default_params(void);

/* Fields are private; it owns no resources (no cleanup). */
typedef struct {
    int64_t target_ns; /* 0 = off */
    int64_t interval_ns;
    int64_t interval_end_ns; /* end of the current interval */
    int64_t min_wait_ns;     /* smallest wait seen in it */
    int64_t last_ns;         /* latest time seen */
    int started;
    int overloaded; /* verdict on the last full interval */
    uint64_t drops;
} cinfer_codel;

/* CINFER_E_INVALID_ARG for negative values. */
cinfer_status cinfer_codel_init(cinfer_codel *c, const cinfer_codel_params *p);

/* The shedder applies CoDel's drops only to requests that carry a deadline:
 * a request without one has no caller waiting on a timer, so shedding it
 * turns a slow answer into an error without helping anyone (a closed loop
 * of such requests is bounded by its concurrency, not by the queue).
 *
 * A request leaves the queue after waiting wait_ns: returns 1 when CoDel
 * drops it, 0 to run it. */
int cinfer_codel_on_dequeue(cinfer_codel *c, int64_t wait_ns, int64_t now_ns);

/* 1 when the last judged interval found the queue overloaded and it has not
 * gone a whole interval without a dequeue since. */
int cinfer_codel_overloaded(const cinfer_codel *c, int64_t now_ns);

/* Twice the target: the wait beyond which an overloaded queue drops. */
int64_t cinfer_codel_slough_ns(const cinfer_codel *c);

/* ---------------------------------------------------------------------- */
/* Load shedder                                                           */
/* ---------------------------------------------------------------------- */
/*
 * Accounts the waiting queue (requests and tokens, per priority) and
 * refuses work the server could not serve in time:
 *   - bounded queue: max_queued_requests and max_queued_tokens; a request
 *     with negative priority only gets a share of each bound, shrinking to
 *     (100 - low_priority_spread_pct) % at priority -100, so as the queue
 *     fills the lowest priorities are shed first. A request always enters
 *     an empty queue, whatever its size.
 *   - predicted wait by Little's law: W = (tokens queued ahead of it) /
 *     (service rate). Ahead means queued with a priority >= its own (the
 *     engine runs higher priorities first). The service rate is measured,
 *     not configured: the tokens that leave the queue per second while it
 *     is non-empty, averaged (EWMA) over samples of rate_sample_ms of
 *     backlog. A request is shed when W > the time left to its deadline;
 *     W == time left is admitted (the prediction is a mean; a tie is given
 *     the benefit). No deadline is an infinite one. Until the first sample
 *     the rate is unknown and nothing is shed on prediction.
 *     Departures within batch_gap_ms of a sample's close (a batch leaving
 *     the queue together under continuous batching) are counted in that
 *     sample, so a batch is measured whole. With no departure for
 *     rate_stale_ms the rate is stale: nothing is shed on prediction until
 *     work leaves again, so a low estimate (which sheds everything, so
 *     nothing departs) always recovers.
 *   - stream time: a request admitted while work is queued ahead of it or
 *     running also has to stream gen_tokens at the observed per-token time
 *     of a running sequence before its deadline; predicted wait plus
 *     gen_tokens x per-token time > time left sheds it (SHED_DEADLINE). On
 *     an idle server only the wait counts (a client may want the partial
 *     output it can get).
 *   - deadline passed already: shed at once, and checked again while the
 *     request waits (cinfer_shedder_check) and as it leaves the queue.
 *   - KV-cache pressure: the caller sets the KV usage (permille); when it
 *     is >= kv_shed_permille (scaled down for negative priorities like the
 *     bounds) and a request is already waiting, newcomers are shed.
 *   - CoDel (above) on the queue wait: at dequeue in folly's form, and at
 *     admission and while waiting, a request whose (predicted or actual)
 *     wait exceeds the slough timeout is shed while CoDel says overloaded
 *     and the engine holds requests back (cinfer_shedder_set_engine_waiting
 *     > 0, or never set). A request the engine would start at once is
 *     not part of a standing queue, whatever CoDel's last verdict: shedding
 *     it frees nothing for anyone.
 * Every shed carries a pushback: the predicted time for the work queued
 * ahead to drain, clamped to [pushback_min_ms, pushback_max_ms], or
 * pushback_unknown_ms before the rate is known. A CoDel shed's pushback is
 * never shorter than the CoDel interval: CoDel judges the queue again only
 * after one, so a sooner retry meets the same verdict.
 *
 * "Tokens" are whatever unit the caller gives (prompt + max_tokens is the
 * intended one), used the same way for the bound and the rate.
 */

#define CINFER_PRIORITY_MIN (-100)
#define CINFER_PRIORITY_MAX 100
#define CINFER_PRIORITY_LEVELS (CINFER_PRIORITY_MAX - CINFER_PRIORITY_MIN + 1)

typedef struct {
    uint64_t max_queued_requests;     /* waiting requests; 0 = unbounded */
    uint64_t max_queued_tokens;       /* waiting tokens; 0 = unbounded */
    uint32_t kv_shed_permille;        /* KV usage at which newcomers are
                                         shed while one waits, 1..1000;
                                         0 = off */
    uint32_t low_priority_spread_pct; /* share of each bound taken away
                                         from priority -100 (linear to 0 at
                                         priority 0), 0..100; 0 = priority
                                         does not change the bounds */
    int64_t rate_sample_ms;           /* backlog time per service-rate
                                         sample; 0 = 1000 */
    uint32_t rate_ewma_pct;           /* weight of a new sample, 1..100;
                                         0 = 25 */
    int64_t pushback_min_ms;          /* shortest shed pushback; 0 = 0 */
    int64_t pushback_max_ms;          /* longest; 0 = 30000 */
    int64_t pushback_unknown_ms;      /* before the rate is known;
                                         0 = 1000 */
    cinfer_codel_params codel;        /* target 0 = CoDel off */
    int64_t rate_stale_ms;            /* with no departure for this long
                                         the measured rate is stale and
                                         nothing is shed on prediction;
                                         0 = 8 x rate_sample_ms */
    int64_t batch_gap_ms;             /* departures within this time of a
                                         sample's close count in that
                                         sample (a batch leaving together);
                                         0 = rate_sample_ms / 100, >= 1 */
} cinfer_shedder_params;

/* 1024 requests, tokens unbounded, KV shedding at 990 permille, spread 50,
 * 1 s samples at 25 %, pushback 0..30 s (1 s unknown), CoDel 5 ms/100 ms. */
cinfer_shedder_params cinfer_shedder_default_params(void);

/* A request as the shedder sees it. */
typedef struct {
    uint64_t tokens;     /* its work in tokens (prompt + max_tokens) */
    int priority;        /* higher runs first; clamped to
                            [CINFER_PRIORITY_MIN, CINFER_PRIORITY_MAX] */
    int64_t deadline_ns; /* absolute, on the clock of now_ns; 0 = none */
    uint64_t gen_tokens; /* tokens it streams (max_tokens); 0 = its stream
                            time is not counted against the deadline */
    uint64_t running;    /* requests running now (the batch it joins) */
} cinfer_shed_request;

/* A queued request's record; the caller keeps it (in its call context)
 * from admit to dequeue or remove. */
typedef struct {
    int queued; /* 1 while counted in the queue */
    int level;  /* priority - CINFER_PRIORITY_MIN */
    uint64_t tokens;
    uint64_t ahead_mark; /* tokens enqueued at its level before it */
    int64_t enqueued_ns;
    int64_t deadline_ns; /* 0 = none */
} cinfer_shed_entry;

/* Fields are private; it owns no resources (no cleanup). */
typedef struct {
    cinfer_shedder_params p; /* with the 0 defaults resolved */
    cinfer_codel codel;
    uint64_t queued_requests, queued_tokens;
    uint64_t level_requests[CINFER_PRIORITY_LEVELS];
    uint64_t level_tokens[CINFER_PRIORITY_LEVELS];
    uint64_t level_in[CINFER_PRIORITY_LEVELS];  /* tokens ever enqueued */
    uint64_t level_out[CINFER_PRIORITY_LEVELS]; /* tokens ever left */
    uint32_t kv_permille;
    int64_t engine_waiting; /* requests the engine holds back; -1 unknown */
    /* service rate */
    int64_t last_ns; /* latest time seen */
    int started;
    int64_t backlog_ns;       /* time with a non-empty queue this sample */
    uint64_t departed_tokens; /* tokens dequeued this sample */
    uint64_t rate_mtps;       /* EWMA, milli-tokens per second */
    int rate_known;
    int64_t last_departure_ns; /* time of the latest departure */
    /* the latest closed sample, reopened for departures of its batch */
    int64_t closed_ns;           /* when it closed; 0 = none */
    int64_t closed_backlog_ns;   /* its backlog time */
    uint64_t closed_tokens;      /* its departed tokens */
    uint64_t closed_prev_mtps;   /* the rate before it */
    int closed_prev_known;       /* rate_known before it */
    int64_t token_ns;            /* per-token time of a running sequence
                                    (EWMA); 0 = unknown */
} cinfer_shedder;

/* CINFER_E_INVALID_ARG (naming the field) for out-of-range params. */
cinfer_status cinfer_shedder_init(cinfer_shedder *s,
                                  const cinfer_shedder_params *p);

/* Admits (returns CINFER_REJECT_NONE and fills *entry, now queued) or
 * sheds (returns a SHED_ reason; *entry is left unqueued). *pushback_ns
 * (may be NULL) gets the pushback for a shed, 0 otherwise. Checks, in
 * order: deadline already passed, queue bound, token bound, KV pressure,
 * predicted wait against the deadline, CoDel. */
cinfer_reject cinfer_shedder_admit(cinfer_shedder *s,
                                   const cinfer_shed_request *rq,
                                   int64_t now_ns, cinfer_shed_entry *entry,
                                   int64_t *pushback_ns);

/* Re-checks a waiting request: its deadline has passed or its predicted
 * remaining wait exceeds the time left (SHED_DEADLINE), or CoDel is
 * overloaded and it has waited past the slough timeout (SHED_CODEL).
 * Changes nothing but the clock; the caller removes a shed entry. */
cinfer_reject cinfer_shedder_check(cinfer_shedder *s,
                                   const cinfer_shed_entry *e, int64_t now_ns,
                                   int64_t *pushback_ns);

/* The request leaves the queue to run. wait_ns is the time it waited for
 * its turn as CoDel should judge it (the engine's submit-to-scheduled
 * time), or < 0 for the time since admission. Returns CINFER_REJECT_NONE
 * (it ran: its tokens count as served for the rate), SHED_DEADLINE when its
 * deadline had passed, or SHED_CODEL when CoDel drops it; in every case
 * the entry is out of the queue afterwards. *pushback_ns (may be NULL)
 * gets the pushback for a shed, 0 otherwise. No-op (NONE) on an unqueued
 * entry. */
cinfer_reject cinfer_shedder_dequeue(cinfer_shedder *s, cinfer_shed_entry *e,
                                     int64_t now_ns, int64_t wait_ns,
                                     int64_t *pushback_ns);

/* The request leaves the queue without running (cancelled, shed while
 * waiting). No-op on an unqueued entry. */
void cinfer_shedder_remove(cinfer_shedder *s, cinfer_shed_entry *e,
                           int64_t now_ns);

/* Records the measured time per generated token of a running sequence
 * (an inter-token gap); averaged with weight 1/8. <= 0 is ignored. */
void cinfer_shedder_observe_token_time(cinfer_shedder *s, int64_t ns);

/* KV-cache usage in permille (0..1000; larger is clamped). */
void cinfer_shedder_set_kv_usage(cinfer_shedder *s, uint32_t permille);

/* How many requests the engine holds back for want of a slot, KV blocks or
 * a prefill budget (its waiting queue). 0 means everything submitted has
 * started, and CoDel sheds nothing at admission or while waiting; until
 * the first call it is unknown and CoDel applies. */
void cinfer_shedder_set_engine_waiting(cinfer_shedder *s, int64_t waiting);

/* Predicted wait in ns of a request of this priority arriving now: 0 with
 * nothing ahead, INT64_MAX when the measured rate is 0; -1 while the rate
 * is unknown. */
int64_t cinfer_shedder_predicted_wait_ns(cinfer_shedder *s, int priority,
                                         int64_t now_ns);

/* ---------------------------------------------------------------------- */
/* Admission: the composition                                             */
/* ---------------------------------------------------------------------- */
/*
 * One object per server: global bucket, client table, breaker, shedder and
 * the drain flag behind one pthread mutex. Every function is thread-safe
 * (the server calls it from several gRPC threads and the engine thread);
 * each holds the mutex for a few hundred nanoseconds and never blocks
 * otherwise.
 *
 * cinfer_admission_admit() goes: draining -> global bucket -> client
 * bucket -> breaker -> shedder, and stops at the first refusal, so a rate
 * limited request never reaches the breaker (it neither takes a probe
 * permit nor counts in the window). Tokens are taken only when the request
 * is admitted: a refusal at any stage costs the client nothing, and a
 * request refused by the global bucket does not create a client entry. A
 * request whose cost exceeds a bucket's capacity is charged the whole
 * capacity (it waits for a full bucket instead of never passing). The
 * rate-limit pushback is the exact time until both buckets hold the cost.
 *
 * A ticket follows each admitted request: QUEUED at admit, RUNNING after
 * cinfer_admission_dequeue(), DONE after cinfer_admission_finish() or a
 * shed while queued. Calls on a DONE ticket do nothing, so finishing twice
 * is harmless. A request shed after admission has its breaker permit
 * released (IGNORED), except one whose deadline passed while queued: that
 * counts as a breaker FAILURE (the server held it too long).
 */

typedef struct cinfer_admission cinfer_admission;

typedef struct {
    cinfer_tb_params global;       /* --rate-limit-qps/-burst; rate 0 = off */
    cinfer_tb_params client;       /* --client-rate-limit-qps/-burst, each
                                      client's bucket; rate 0 = off */
    size_t max_clients;            /* client table entries (LRU beyond);
                                      0 = 10000 */
    size_t max_client_id_bytes;    /* longer ids are refused; 0 = 128 */
    uint64_t hash_seed[2];         /* client table SipHash key; random in
                                      production; {0, 0} = fixed */
    cinfer_breaker_params breaker; /* failure_rate_pct 0 = off */
    cinfer_shedder_params shedder; /* bounds 0 = unbounded */
} cinfer_admission_params;

/* Limiters off, the breaker, shedder and CoDel defaults above. */
cinfer_admission_params cinfer_admission_default_params(void);

typedef struct {
    const char *client_id; /* borrowed for the call; NULL = no per-client
                              limit for this request */
    size_t client_id_len;  /* bytes of client_id */
    uint64_t cost;         /* bucket tokens it takes (1, or prompt +
                              max_tokens under --rate-limit-tokens); 0 = 1 */
    uint64_t tokens;       /* queue work: prompt + max_tokens */
    int priority;          /* higher runs first, [-100, 100] */
    int64_t deadline_ns;   /* absolute on the cinfer_clock_now_ns() clock,
                              already capped by --max-request-time;
                              0 = none */
    uint64_t gen_tokens;   /* max_tokens: its stream time (gen_tokens x the
                              observed per-token time) counts against the
                              deadline when it joins a busy server;
                              0 = not counted */
} cinfer_admission_request;

typedef struct {
    cinfer_reject reason;   /* CINFER_REJECT_NONE = admitted */
    int64_t retry_after_ms; /* pushback for a rejection (rounded up), the
                               grpc-retry-pushback-ms value; 0 = retry at
                               once (draining: try another replica) */
} cinfer_admission_decision;

typedef enum {
    CINFER_TICKET_NONE = 0, /* never admitted */
    CINFER_TICKET_QUEUED,
    CINFER_TICKET_RUNNING,
    CINFER_TICKET_DONE
} cinfer_ticket_state;

/* An admitted request's record; the caller embeds it in its call context
 * and passes it to every later call. Fields are private. */
typedef struct {
    cinfer_ticket_state state;
    cinfer_breaker_permit permit;
    cinfer_shed_entry entry;
} cinfer_admission_ticket;

/* Counters for Prometheus, read as one consistent snapshot. */
typedef struct {
    uint64_t admitted;                       /* requests admitted */
    uint64_t rejected[CINFER_REJECT_COUNT];  /* by reason, at admission and
                                                while queued; [NONE] = 0 */
    uint64_t started;                        /* dequeued to run */
    uint64_t finished[CINFER_OUTCOME_COUNT]; /* by outcome */
    uint64_t running;                        /* started, not finished */
    uint64_t queued_requests;                /* waiting now */
    uint64_t queued_tokens;
    cinfer_breaker_state breaker_state; /* stored (lazy) state */
    uint64_t breaker_transitions[CINFER_BREAKER_STATE_COUNT]; /* into each */
    uint64_t breaker_window_calls; /* outcomes in the window */
    uint64_t breaker_window_failures;
    double service_rate_tokens_per_s; /* measured; -1 = unknown */
    int codel_overloaded;             /* 1 while CoDel sheds */
    uint32_t kv_usage_permille;       /* last value set */
    uint64_t clients;                 /* client table entries */
    uint64_t client_evictions;
    int draining;
} cinfer_admission_stats;

/* CINFER_E_INVALID_ARG (naming the field), CINFER_E_NOMEM. */
cinfer_status cinfer_admission_create(const cinfer_admission_params *p,
                                      cinfer_admission **out);
/* NULL ok. Outstanding tickets become meaningless. */
void cinfer_admission_destroy(cinfer_admission *a);

/* Decides on a request. CINFER_OK with *d filled (and *t QUEUED when
 * admitted, NONE otherwise); CINFER_E_INVALID_ARG when the client id is
 * longer than max_client_id_bytes (nothing changes then; the server
 * answers INVALID_ARGUMENT). */
cinfer_status cinfer_admission_admit(cinfer_admission *a,
                                     const cinfer_admission_request *rq,
                                     int64_t now_ns,
                                     cinfer_admission_decision *d,
                                     cinfer_admission_ticket *t);

/* The engine starts the request, which waited wait_ns for its turn (< 0:
 * the time since admission; see cinfer_shedder_dequeue). Returns NONE (now
 * RUNNING), or SHED_DEADLINE / SHED_CODEL (now DONE; the server ends the
 * call with that reason and does not run it). No-op returning NONE unless
 * QUEUED. */
cinfer_admission_decision cinfer_admission_dequeue(cinfer_admission *a,
                                                   cinfer_admission_ticket *t,
                                                   int64_t now_ns,
                                                   int64_t wait_ns);

/* Re-checks a QUEUED request (call it periodically, e.g. every engine
 * step): NONE to keep waiting, or SHED_DEADLINE / SHED_CODEL (now DONE; the
 * server cancels it in the engine and ends the call). NONE unless QUEUED. */
cinfer_admission_decision
cinfer_admission_check_queued(cinfer_admission *a, cinfer_admission_ticket *t,
                              int64_t now_ns);

/* The request ended (from QUEUED or RUNNING) with this outcome, which the
 * breaker records; a queued request leaves the queue. No-op when DONE or
 * NONE. */
void cinfer_admission_finish(cinfer_admission *a, cinfer_admission_ticket *t,
                             cinfer_outcome o, int64_t now_ns);

/* 1 = drain: every admit answers DRAINING (pushback 0) from now on. */
void cinfer_admission_set_draining(cinfer_admission *a, int draining);

/* An observed inter-token gap of a running stream, ns per token. */
void cinfer_admission_observe_token_time(cinfer_admission *a, int64_t ns);

/* KV-cache usage for the shedder, permille (the engine's used / total). */
void cinfer_admission_set_kv_usage(cinfer_admission *a, uint32_t permille);

/* The engine's waiting queue for the shedder (cinfer_shedder_set_engine_
 * waiting). */
void cinfer_admission_set_engine_waiting(cinfer_admission *a,
                                         int64_t waiting);

/* Fills *out; now_ns expires old breaker buckets for the window counts. */
void cinfer_admission_stats_get(cinfer_admission *a, int64_t now_ns,
                                cinfer_admission_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_RESILIENCE_H */
