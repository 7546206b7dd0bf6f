/*
 * admit.c - the request path both front ends share after decoding: the
 * one place that decides load refusals (server_impl.h, "the request path
 * both front ends share"), and the accounting of a generation call's
 * engine events.
 *
 * Order: a deadline the server could not meet even idle is refused at
 * once (shed_deadline); then the admission layer (with API keys, the key's
 * own bucket replaces the per-client ones), which decides by its numbers;
 * then the engine, whose refusals at submit map to their own reasons
 * (cinfer_request_map_refusal). Every refusal carries its reason, which
 * the front end counts once when it answers.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "server/log.h"
#include "server/server_impl.h"
#include "server/status_map.h"

/* The engine's pushbacks are at most this long. */
#define ENGINE_MAX_PUSHBACK_MS 1000

uint64_t cinfer_server_random_seed(void)
{
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, GRND_NONBLOCK) != (ssize_t)sizeof v)
        v = (uint64_t)cinfer_server_now_ns() * 0x9E3779B97F4A7C15ull;
    return v;
}

static void refuse(cinfer_refusal *out, cinfer_status st, cinfer_reject r,
                   int64_t retry_ms)
{
    out->status = st;
    out->has_pb = 1;
    memset(&out->pb, 0, sizeof out->pb);
    out->pb.reason = r;
    out->pb.retry_after_ms = retry_ms;
}

int cinfer_server_admit(cinfer_server *s, const cinfer_admit_in *in,
                        int64_t now, cinfer_admission_ticket *t,
                        cinfer_refusal *out)
{
    memset(out, 0, sizeof *out);
    /* A deadline shorter than the fastest this server ever served such a
     * request to its first token can not be met even idle. */
    if (in->deadline_ns) {
        int64_t min_ns = cinfer_service_time_min(
            s->svc, s->params.prefix_cache ? 1 : (int64_t)in->n_prompt);
        if (min_ns > 0 && cinfer_ns_add_sat(now, min_ns) > in->deadline_ns) {
            refuse(out, CINFER_E_TIMEOUT, CINFER_REJECT_SHED_DEADLINE, 0);
            snprintf(out->message, sizeof out->message,
                     "the deadline cannot be met: %.1f ms left, the first "
                     "token takes at least %.1f ms on an idle server",
                     (double)(in->deadline_ns - now) * 1e-6,
                     (double)min_ns * 1e-6);
            return 0;
        }
    }
    const char *id = in->client_id;
    size_t id_len = in->client_id_len;
    if (in->key_set) {
        int64_t retry_ms;
        if (!cinfer_api_keys_take(in->key_set, in->key_index, now,
                                  &retry_ms)) {
            const cinfer_api_key *k =
                cinfer_api_keys_get(in->key_set, in->key_index);
            const char *name = k ? k->name : "?";
            refuse(out, CINFER_E_EXHAUSTED, CINFER_REJECT_RATE_LIMITED_CLIENT,
                   retry_ms);
            snprintf(out->subject, sizeof out->subject, "api_key:%s", name);
            out->pb.quota_subject = out->subject;
            out->pb.quota_desc = "the API key's request rate (qps= in the "
                                 "--api-keys file)";
            snprintf(out->message, sizeof out->message,
                     "rate limited: API key %s exceeds its request rate; "
                     "retry in %lld ms",
                     name, (long long)retry_ms);
            return 0;
        }
        id = NULL;
        id_len = 0;
    }
    cinfer_admission_request rq = {
        .client_id = id,
        .client_id_len = id_len,
        .cost = s->params.rate_limit_tokens ? (uint64_t)in->tokens : 1,
        .tokens = (uint64_t)in->tokens,
        .priority = in->priority,
        .deadline_ns = in->deadline_ns,
        .gen_tokens = in->tokens > (int64_t)in->n_prompt
                          ? (uint64_t)(in->tokens - (int64_t)in->n_prompt)
                          : 0,
    };
    cinfer_admission_decision d;
    cinfer_status st = cinfer_admission_admit(s->adm, &rq, now, &d, t);
    if (st != CINFER_OK) {
        out->status = st;
        snprintf(out->message, sizeof out->message, "%s",
                 cinfer_last_error());
        return 0;
    }
    if (d.reason == CINFER_REJECT_NONE)
        return 1;
    refuse(out, cinfer_reject_status(d.reason), d.reason, d.retry_after_ms);
    char client[132];
    snprintf(client, sizeof client, "%.*s", (int)(id_len > 128 ? 128 : id_len),
             id ? id : "");
    if (d.reason == CINFER_REJECT_RATE_LIMITED_GLOBAL) {
        out->pb.quota_subject = "server";
        out->pb.quota_desc =
            "the server's request rate limit (--rate-limit-qps)";
    } else if (d.reason == CINFER_REJECT_RATE_LIMITED_CLIENT) {
        snprintf(out->subject, sizeof out->subject, "client:%s", client);
        out->pb.quota_subject = out->subject;
        out->pb.quota_desc = "the client's request rate limit "
                             "(--client-rate-limit-qps)";
    }
    cinfer_request_reject_message(d.reason, d.retry_after_ms, client,
                                  out->message, sizeof out->message);
    return 0;
}

/* The response cache's part of a submit: a stored answer (*hit), or a
 * recorder hooked into *p for a miss (*rec), or neither (off, not
 * deterministic, or no memory for the key: the request runs uncached). */
static void cache_probe(cinfer_server *s, const cinfer_gen_desc *d,
                        cinfer_request_params *p, cinfer_rcache_entry **hit,
                        cinfer_rcache_rec **rec)
{
    if (!s->rcache || !d || !cinfer_rcache_cacheable(d, p))
        return;
    cinfer_rcache_key *k = NULL;
    if (cinfer_rcache_key_make(d, p, &k) != CINFER_OK)
        return;
    *hit = cinfer_rcache_lookup(s->rcache, k);
    if (*hit) {
        cinfer_rcache_key_free(k);
        return;
    }
    if (cinfer_rcache_rec_create(s->rcache, k, p, rec) != CINFER_OK)
        *rec = NULL;
}

cinfer_status cinfer_server_submit(cinfer_server *s, const cinfer_gen_desc *d,
                                   const cinfer_request_params *rp,
                                   uint64_t *id, cinfer_rcache_entry **hit,
                                   cinfer_refusal *out)
{
    memset(out, 0, sizeof *out);
    *hit = NULL;
    cinfer_request_params p = *rp;
    cinfer_rcache_rec *rec = NULL;
    cache_probe(s, d, &p, hit, &rec);
    if (*hit) {
        *id = 0;
        return CINFER_OK;
    }
    cinfer_status st = cinfer_engine_submit(s->engine, &p, id);
    if (st == CINFER_OK)
        return CINFER_OK;
    cinfer_rcache_rec_destroy(rec); /* no event ever came */
    snprintf(out->message, sizeof out->message, "%s", cinfer_last_error());
    cinfer_engine_refusal_map m = cinfer_request_map_refusal(
        st, cinfer_engine_refusal_kind(), cinfer_engine_refusal_retry_ns(),
        ENGINE_MAX_PUSHBACK_MS);
    out->status = m.status;
    if (m.load)
        refuse(out, m.status, m.reason, m.retry_after_ms);
    return st;
}

void cinfer_server_replay(cinfer_server *s, cinfer_rcache_entry *hit,
                          const cinfer_request_params *rp)
{
    (void)s;
    cinfer_rcache_replay(hit, rp->on_event, rp->user, cinfer_server_now_ns,
                         0);
    cinfer_rcache_entry_release(hit);
}

/* ---------------------------------------------------------------------- */
/* A generation call's engine events                                      */
/* ---------------------------------------------------------------------- */

void cinfer_gen_track_init(cinfer_gen_track *t, cinfer_frontend fe,
                           int64_t start_ns, int n_samples)
{
    memset(t, 0, sizeof *t);
    t->start_ns = start_ns;
    t->frontend = fe;
    t->n_samples = n_samples > 0 ? n_samples : 1;
    t->shed = CINFER_REJECT_NONE;
    t->outcome = CINFER_OUTCOME_IGNORED;
}

void cinfer_gen_track_tokens(cinfer_server *s, cinfer_gen_track *t,
                             const cinfer_engine_event *ev, int64_t now,
                             int *cancel)
{
    if (ev->n_ids == 0 || t->shed != CINFER_REJECT_NONE)
        return;
    if (t->cached) {
        /* A replay: no queue left (the ticket stays QUEUED until its
         * finish takes it out of the shedder) and no engine timing. */
        t->started = 1;
        t->last_token_ns = now;
        return;
    }
    if (!t->started) {
        t->started = 1;
        if (t->admitted) {
            cinfer_admission_decision d =
                cinfer_admission_dequeue(s->adm, &t->ticket, now,
                                         ev->queue_ns);
            if (d.reason != CINFER_REJECT_NONE) {
                t->shed = d.reason;
                t->shed_retry_ms = d.retry_after_ms;
                *cancel = 1;
                return;
            }
        }
        cinfer_metrics_observe(s->metrics, t->frontend, CINFER_HIST_TTFT,
                               (double)(now - t->start_ns) * 1e-9);
    } else {
        double gap = (double)(now - t->last_token_ns) * 1e-9 /
                     (double)ev->n_ids;
        for (size_t i = 0; i < ev->n_ids; i++)
            cinfer_metrics_observe(s->metrics, t->frontend, CINFER_HIST_ITL,
                                   gap);
        if (ev->n_ids == 1)
            cinfer_service_time_record(s->svc, 1, now - t->last_token_ns);
        if (t->admitted)
            cinfer_admission_observe_token_time(
                s->adm, (now - t->last_token_ns) / (int64_t)ev->n_ids);
    }
    t->last_token_ns = now;
}

/* The breaker's view of how a sample ended. */
static cinfer_outcome classify(const cinfer_gen_track *t,
                               const cinfer_engine_event *ev)
{
    switch (ev->finish) {
    case CINFER_FINISH_ERROR:
        return CINFER_OUTCOME_FAILURE;
    case CINFER_FINISH_TIME_LIMIT:
        return t->deadline_is_hard ? CINFER_OUTCOME_FAILURE
                                   : CINFER_OUTCOME_SUCCESS;
    case CINFER_FINISH_CANCELLED:
        /* A client's cancel or the server's shutdown count for nothing; a
         * deadline that the front end enforced is the server's slowness. */
        return t->deadline_passed && !t->aborted ? CINFER_OUTCOME_FAILURE
                                                 : CINFER_OUTCOME_IGNORED;
    default:
        return CINFER_OUTCOME_SUCCESS;
    }
}

int cinfer_gen_track_finish(cinfer_server *s, cinfer_gen_track *t,
                            const cinfer_engine_event *ev, int64_t now)
{
    if (t->cached) {
        /* A replay says nothing of the engine: counted by the cache's
         * own metrics, its outcome IGNORED for the breaker. */
        if (++t->n_finished < t->n_samples)
            return 0;
        if (t->admitted) {
            cinfer_admission_finish(s->adm, &t->ticket,
                                    CINFER_OUTCOME_IGNORED, now);
            t->admitted = 0;
        }
        return 1;
    }
    cinfer_outcome o = classify(t, ev);
    if (o == CINFER_OUTCOME_FAILURE ||
        (o == CINFER_OUTCOME_SUCCESS && t->outcome == CINFER_OUTCOME_IGNORED))
        t->outcome = o;
    cinfer_metrics_add_tokens(
        s->metrics, t->frontend,
        (uint64_t)(t->n_finished == 0 && ev->prompt_tokens > 0
                       ? ev->prompt_tokens
                       : 0),
        (uint64_t)(ev->completion_tokens > 0 ? ev->completion_tokens : 0));
    int fault = ev->finish == CINFER_FINISH_ERROR &&
                ev->status == CINFER_E_DEVICE;
    int ok = ev->completion_tokens > 0 && ev->finish != CINFER_FINISH_ERROR;
    cinfer_watchdog_note_outcome(s->wd, fault, ok);
    if (ok && ev->ttft_ns > ev->queue_ns) {
        int64_t uncached = (int64_t)ev->prompt_tokens - ev->cached_tokens;
        cinfer_service_time_record(s->svc, uncached > 0 ? uncached : 1,
                                   ev->ttft_ns - ev->queue_ns);
    }
    if (++t->n_finished < t->n_samples)
        return 0;
    if (t->admitted) {
        cinfer_admission_finish(s->adm, &t->ticket, t->outcome, now);
        t->admitted = 0;
    }
    if (t->shed == CINFER_REJECT_NONE) {
        cinfer_metrics_observe(s->metrics, t->frontend, CINFER_HIST_E2E,
                               (double)(now - t->start_ns) * 1e-9);
        if (t->started)
            cinfer_metrics_observe(s->metrics, t->frontend, CINFER_HIST_QUEUE,
                                   (double)ev->queue_ns * 1e-9);
    }
    return 1;
}

void cinfer_gen_track_drop(cinfer_server *s, cinfer_gen_track *t)
{
    if (!t->admitted)
        return;
    cinfer_admission_finish(s->adm, &t->ticket, CINFER_OUTCOME_IGNORED,
                            cinfer_server_now_ns());
    t->admitted = 0;
}

/* ---------------------------------------------------------------------- */
/* The idle service-time bound                                            */
/* ---------------------------------------------------------------------- */

/* min_first_ns[k] is the fastest submit-to-first-token minus queue time
 * seen for a request with 2^k .. 2^(k+1)-1 uncached prompt tokens (0 =
 * none seen). */
struct cinfer_service_times {
    pthread_mutex_t mu;
    int64_t min_first_ns[32];
};

cinfer_status cinfer_service_times_create(cinfer_service_times **out)
{
    cinfer_service_times *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "server: no memory");
    pthread_mutex_init(&t->mu, NULL);
    *out = t;
    return CINFER_OK;
}

void cinfer_service_times_destroy(cinfer_service_times *t)
{
    if (!t)
        return;
    pthread_mutex_destroy(&t->mu);
    free(t);
}

static int size_class(int64_t tokens)
{
    int k = 0;
    while (k < 31 && tokens >= ((int64_t)2 << k))
        k++;
    return k;
}

void cinfer_service_time_record(cinfer_service_times *t, int64_t tokens,
                                int64_t first_ns)
{
    if (tokens < 1 || first_ns <= 0)
        return;
    int k = size_class(tokens);
    pthread_mutex_lock(&t->mu);
    if (!t->min_first_ns[k] || first_ns < t->min_first_ns[k])
        t->min_first_ns[k] = first_ns;
    pthread_mutex_unlock(&t->mu);
}

int64_t cinfer_service_time_min(cinfer_service_times *t, int64_t tokens)
{
    /* More prompt tokens never take less time: every class whose largest
     * size is <= tokens bounds it from below. */
    int64_t best = 0;
    pthread_mutex_lock(&t->mu);
    for (int k = 0; k < 31 && ((int64_t)2 << k) - 1 <= tokens; k++)
        if (t->min_first_ns[k] > best)
            best = t->min_first_ns[k];
    pthread_mutex_unlock(&t->mu);
    return best;
}
