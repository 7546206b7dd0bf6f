/*
 * response_cache.c - the exact response cache (response_cache.h).
 *
 * Layout: entries on a doubly linked LRU list (most recent at the head)
 * and in a chained hash table on the first 8 bytes of their key's
 * SHA-256, both under rc->mu. An entry's events are fixed records (rc_ev)
 * over one data block that holds, per event, its token ids, logprobs,
 * top entries and text, each event's part starting 4-byte aligned. The
 * cache holds one reference to each listed entry and a replay another,
 * so an entry evicted during a replay is freed when the replay releases
 * it.
 */
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "server/response_cache.h"
#include "server/grow.h"

/* Bumped when the key's layout changes. */
#define KEY_VERSION 1u

struct cinfer_rcache_key {
    size_t len;
    uint8_t digest[32];
    uint8_t bytes[]; /* [len] */
};

/* One stored event. */
typedef struct {
    uint8_t kind;          /* cinfer_event_kind */
    uint8_t has_lp;        /* logprobs[n_ids] stored */
    uint16_t n_top;        /* top entries per token stored */
    int32_t sample;
    uint32_t n_ids, text_len;
    int32_t finish;        /* FINISH: cinfer_finish_reason */
    int32_t prompt_tokens, completion_tokens;
    size_t off;            /* into data: ids, logprobs, top, text, NUL */
} rc_ev;

struct cinfer_rcache_entry {
    atomic_int refs;
    cinfer_rcache_entry *prev, *next; /* LRU (rc->mu) */
    cinfer_rcache_entry *hnext;       /* hash chain (rc->mu) */
    cinfer_rcache_key *key;
    int n_samples;
    rc_ev *ev;
    size_t n_ev;
    uint8_t *data;
    size_t n_data;
    size_t bytes;                     /* what it counts against the bound */
};

struct cinfer_rcache {
    pthread_mutex_t mu;
    size_t max_bytes;
    cinfer_rcache_entry **buckets;
    size_t n_buckets; /* a power of two */
    cinfer_rcache_entry *head, *tail;
    cinfer_rcache_stats st;
};

struct cinfer_rcache_rec {
    cinfer_rcache *rc;
    cinfer_rcache_key *key;
    void (*on_event)(void *user, const cinfer_engine_event *ev);
    void *user;
    int n_samples, n_finished;
    int keep;       /* every event so far recorded, every FINISH clean */
    size_t max_bytes; /* the cache's bound, read once */
    rc_ev *ev;
    size_t n_ev, cap_ev;
    uint8_t *data;
    size_t n_data, cap_data;
};

cinfer_rcache_params cinfer_rcache_default_params(void)
{
    cinfer_rcache_params p = {.max_bytes = 0};
    return p;
}

cinfer_status cinfer_rcache_create(const cinfer_rcache_params *p,
                                   cinfer_rcache **out)
{
    cinfer_rcache *rc = calloc(1, sizeof *rc);
    if (!rc)
        return cinfer_set_error(CINFER_E_NOMEM, "response cache: no memory");
    rc->n_buckets = 64;
    rc->buckets = calloc(rc->n_buckets, sizeof *rc->buckets);
    if (!rc->buckets) {
        free(rc);
        return cinfer_set_error(CINFER_E_NOMEM, "response cache: no memory");
    }
    rc->max_bytes = p->max_bytes;
    rc->st.max_bytes = p->max_bytes;
    pthread_mutex_init(&rc->mu, NULL);
    *out = rc;
    return CINFER_OK;
}

static void entry_free(cinfer_rcache_entry *e)
{
    cinfer_rcache_key_free(e->key);
    free(e->ev);
    free(e->data);
    free(e);
}

void cinfer_rcache_entry_release(cinfer_rcache_entry *e)
{
    if (e && atomic_fetch_sub(&e->refs, 1) == 1)
        entry_free(e);
}

void cinfer_rcache_destroy(cinfer_rcache *rc)
{
    if (!rc)
        return;
    cinfer_rcache_entry *e = rc->head;
    while (e) {
        cinfer_rcache_entry *next = e->next;
        cinfer_rcache_entry_release(e);
        e = next;
    }
    free(rc->buckets);
    pthread_mutex_destroy(&rc->mu);
    free(rc);
}

/* ---------------------------------------------------------------------- */
/* The key                                                                */
/* ---------------------------------------------------------------------- */

int cinfer_rcache_cacheable(const cinfer_gen_desc *d,
                            const cinfer_request_params *rp)
{
    int greedy = rp->sampling.temperature < CINFER_SAMPLER_GREEDY_EPS;
    if (!greedy && !d->has_seed)
        return 0;
    /* Soft prompts are float rows the key does not hold (up to 16 MiB):
     * such a request always runs. */
    if (rp->prompt_embeds && rp->n_prompt_embeds)
        return 0;
    int named = (d->grammar && d->grammar[0]) || (d->regex && d->regex[0]) ||
                (d->json_schema && d->json_schema[0]) || d->json_object;
    /* A grammar the engine gets must be one the key names by its text. */
    if (rp->grammar && !named)
        return 0;
    return 1;
}

typedef struct {
    uint8_t *p;
    size_t n, cap;
    int oom;
} kbuf;

static void put(kbuf *b, const void *v, size_t n)
{
    if (b->oom)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 256;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *q = realloc(b->p, cap);
        if (!q) {
            b->oom = 1;
            return;
        }
        b->p = q;
        b->cap = cap;
    }
    if (n)
        memcpy(b->p + b->n, v, n);
    b->n += n;
}

static void put_u32(kbuf *b, uint32_t v) { put(b, &v, sizeof v); }
static void put_u64(kbuf *b, uint64_t v) { put(b, &v, sizeof v); }

/* A float by its bits: -0 and 0 differ, as they may in the sampler. */
static void put_f32(kbuf *b, float v)
{
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    put_u32(b, u);
}

/* A length-prefixed string; NULL and "" are the same (none). */
static void put_str(kbuf *b, const char *s)
{
    size_t n = s ? strlen(s) : 0;
    put_u64(b, n);
    put(b, s, n);
}

static void put_ids(kbuf *b, const int32_t *ids, size_t n)
{
    put_u64(b, n);
    put(b, ids, n * sizeof *ids);
}

/* A tag before each field, so that no two layouts of different fields
 * can give the same bytes. */
enum {
    K_PROMPT = 1, K_MAX_TOKENS, K_MIN_TOKENS, K_IGNORE_EOS, K_STOP,
    K_STOP_IDS, K_N, K_LOGPROBS, K_N_VOCAB, K_GREEDY, K_TEMPERATURE,
    K_TOP_K, K_TOP_P, K_MIN_P, K_SEED, K_REPETITION, K_PRESENCE,
    K_FREQUENCY, K_PENALTY_LAST_N, K_PENALTY_PROMPT, K_N_LOGPROBS,
    K_S_MIN_TOKENS, K_EOG, K_LOGIT_BIAS, K_GRAMMAR, K_REGEX, K_SCHEMA,
    K_JSON_OBJECT,
};

static void key_sampling(kbuf *b, const cinfer_sampler_params *sp)
{
    int greedy = sp->temperature < CINFER_SAMPLER_GREEDY_EPS;
    put_u32(b, K_N_VOCAB);
    put_u32(b, (uint32_t)sp->n_vocab);
    put_u32(b, K_GREEDY);
    put_u32(b, (uint32_t)greedy);
    /* Greedy takes the argmax after the penalties: temperature, top_k,
     * top_p, min_p and the draws are skipped (sampler.h, stage 4). */
    if (!greedy) {
        put_u32(b, K_TEMPERATURE);
        put_f32(b, sp->temperature);
        put_u32(b, K_TOP_K);
        put_u32(b, (uint32_t)sp->top_k);
        put_u32(b, K_TOP_P);
        put_f32(b, sp->top_p);
        put_u32(b, K_MIN_P);
        put_f32(b, sp->min_p);
        put_u32(b, K_SEED);
        put_u64(b, sp->seed);
    }
    put_u32(b, K_REPETITION);
    put_f32(b, sp->repetition_penalty);
    put_u32(b, K_PRESENCE);
    put_f32(b, sp->presence_penalty);
    put_u32(b, K_FREQUENCY);
    put_f32(b, sp->frequency_penalty);
    put_u32(b, K_PENALTY_LAST_N);
    put_u32(b, (uint32_t)sp->penalty_last_n);
    put_u32(b, K_PENALTY_PROMPT);
    put_u32(b, (uint32_t)sp->penalty_prompt);
    put_u32(b, K_N_LOGPROBS);
    put_u32(b, (uint32_t)sp->n_logprobs);
    put_u32(b, K_S_MIN_TOKENS);
    put_u32(b, (uint32_t)sp->min_tokens);
    put_u32(b, K_EOG);
    put_ids(b, sp->n_eog_tokens > 0 ? sp->eog_tokens : NULL,
            sp->n_eog_tokens > 0 && sp->eog_tokens
                ? (size_t)sp->n_eog_tokens
                : 0);
    put_u32(b, K_LOGIT_BIAS);
    size_t nb = sp->n_logit_bias > 0 && sp->logit_bias
                    ? (size_t)sp->n_logit_bias
                    : 0;
    put_u64(b, nb);
    for (size_t i = 0; i < nb; i++) {
        put_u32(b, (uint32_t)sp->logit_bias[i].token);
        put_f32(b, sp->logit_bias[i].bias);
    }
}

cinfer_status cinfer_rcache_key_make(const cinfer_gen_desc *d,
                                     const cinfer_request_params *rp,
                                     cinfer_rcache_key **out)
{
    kbuf b = {0};
    put_u32(&b, KEY_VERSION);
    put_u32(&b, K_PROMPT);
    put_ids(&b, rp->prompt, rp->n_prompt);
    put_u32(&b, K_MAX_TOKENS);
    put_u32(&b, (uint32_t)rp->max_tokens);
    put_u32(&b, K_MIN_TOKENS);
    put_u32(&b, (uint32_t)rp->min_tokens);
    put_u32(&b, K_IGNORE_EOS);
    put_u32(&b, (uint32_t)(rp->ignore_eos != 0));
    put_u32(&b, K_STOP);
    size_t ns = rp->stop ? rp->n_stop : 0;
    put_u64(&b, ns);
    for (size_t i = 0; i < ns; i++)
        put_str(&b, rp->stop[i]);
    put_u32(&b, K_STOP_IDS);
    put_ids(&b, rp->stop_ids, rp->stop_ids ? rp->n_stop_ids : 0);
    put_u32(&b, K_N);
    put_u32(&b, (uint32_t)(rp->n_samples > 0 ? rp->n_samples : 1));
    put_u32(&b, K_LOGPROBS);
    put_u32(&b, (uint32_t)(rp->logprobs != 0));
    key_sampling(&b, &rp->sampling);
    put_u32(&b, K_GRAMMAR);
    put_str(&b, d->grammar);
    put_u32(&b, K_REGEX);
    put_str(&b, d->regex);
    put_u32(&b, K_SCHEMA);
    put_str(&b, d->json_schema);
    put_u32(&b, K_JSON_OBJECT);
    put_u32(&b, (uint32_t)(d->json_object != 0));
    if (b.oom) {
        free(b.p);
        return cinfer_set_error(CINFER_E_NOMEM, "response cache: no memory");
    }
    uint8_t digest[32];
    unsigned dl = 0;
    if (!EVP_Digest(b.p, b.n, digest, &dl, EVP_sha256(), NULL) || dl != 32) {
        free(b.p);
        return cinfer_set_error(CINFER_E_INTERNAL,
                                "response cache: SHA-256 failed");
    }
    cinfer_status st = cinfer_rcache_key_from_bytes(b.p, b.n, digest, out);
    free(b.p);
    return st;
}

cinfer_status cinfer_rcache_key_from_bytes(const uint8_t *bytes, size_t len,
                                           const uint8_t digest[32],
                                           cinfer_rcache_key **out)
{
    cinfer_rcache_key *k = malloc(sizeof *k + len);
    if (!k)
        return cinfer_set_error(CINFER_E_NOMEM, "response cache: no memory");
    k->len = len;
    memcpy(k->digest, digest, 32);
    if (len)
        memcpy(k->bytes, bytes, len);
    *out = k;
    return CINFER_OK;
}

void cinfer_rcache_key_free(cinfer_rcache_key *k)
{
    free(k);
}

const uint8_t *cinfer_rcache_key_bytes(const cinfer_rcache_key *k,
                                       size_t *len)
{
    *len = k->len;
    return k->bytes;
}

const uint8_t *cinfer_rcache_key_digest(const cinfer_rcache_key *k)
{
    return k->digest;
}

static int key_eq(const cinfer_rcache_key *a, const cinfer_rcache_key *b)
{
    return a->len == b->len && memcmp(a->digest, b->digest, 32) == 0 &&
           memcmp(a->bytes, b->bytes, a->len) == 0;
}

static size_t key_size(const cinfer_rcache_key *k)
{
    return sizeof *k + k->len;
}

/* ---------------------------------------------------------------------- */
/* The table and the LRU (rc->mu held)                                    */
/* ---------------------------------------------------------------------- */

static size_t bucket_of(const cinfer_rcache *rc, const cinfer_rcache_key *k)
{
    uint64_t h;
    memcpy(&h, k->digest, sizeof h);
    return (size_t)(h & (rc->n_buckets - 1));
}

static cinfer_rcache_entry *find(cinfer_rcache *rc, const cinfer_rcache_key *k)
{
    for (cinfer_rcache_entry *e = rc->buckets[bucket_of(rc, k)]; e;
         e = e->hnext)
        if (key_eq(e->key, k))
            return e;
    return NULL;
}

static void lru_unlink(cinfer_rcache *rc, cinfer_rcache_entry *e)
{
    if (e->prev)
        e->prev->next = e->next;
    else
        rc->head = e->next;
    if (e->next)
        e->next->prev = e->prev;
    else
        rc->tail = e->prev;
    e->prev = e->next = NULL;
}

static void lru_push(cinfer_rcache *rc, cinfer_rcache_entry *e)
{
    e->prev = NULL;
    e->next = rc->head;
    if (rc->head)
        rc->head->prev = e;
    rc->head = e;
    if (!rc->tail)
        rc->tail = e;
}

/* Takes e off the list and the table and drops the cache's reference. */
static void drop(cinfer_rcache *rc, cinfer_rcache_entry *e)
{
    cinfer_rcache_entry **pp = &rc->buckets[bucket_of(rc, e->key)];
    while (*pp != e)
        pp = &(*pp)->hnext;
    *pp = e->hnext;
    lru_unlink(rc, e);
    rc->st.bytes -= e->bytes;
    rc->st.entries--;
    cinfer_rcache_entry_release(e);
}

/* Doubles the table when it holds more entries than buckets; without
 * memory it keeps its size (longer chains, still correct). */
static void maybe_grow(cinfer_rcache *rc)
{
    if (rc->st.entries < rc->n_buckets)
        return;
    size_t n = rc->n_buckets * 2;
    cinfer_rcache_entry **nb = calloc(n, sizeof *nb);
    if (!nb)
        return;
    cinfer_rcache_entry **old = rc->buckets;
    size_t old_n = rc->n_buckets;
    rc->buckets = nb;
    rc->n_buckets = n;
    for (size_t i = 0; i < old_n; i++) {
        cinfer_rcache_entry *e = old[i];
        while (e) {
            cinfer_rcache_entry *next = e->hnext;
            size_t k = bucket_of(rc, e->key);
            e->hnext = nb[k];
            nb[k] = e;
            e = next;
        }
    }
    free(old);
}

cinfer_rcache_entry *cinfer_rcache_lookup(cinfer_rcache *rc,
                                          const cinfer_rcache_key *k)
{
    if (!rc || !k)
        return NULL;
    pthread_mutex_lock(&rc->mu);
    cinfer_rcache_entry *e = find(rc, k);
    if (e) {
        lru_unlink(rc, e);
        lru_push(rc, e);
        atomic_fetch_add(&e->refs, 1);
        rc->st.hits++;
    } else {
        rc->st.misses++;
    }
    pthread_mutex_unlock(&rc->mu);
    return e;
}

/* Stores e (the cache takes its one reference), evicting from the LRU
 * end to stay within the bound. An entry over the whole bound, or one
 * whose key is already stored (two misses of one request at once), is
 * freed instead. */
static void insert(cinfer_rcache *rc, cinfer_rcache_entry *e)
{
    pthread_mutex_lock(&rc->mu);
    if (e->bytes > rc->max_bytes || find(rc, e->key)) {
        pthread_mutex_unlock(&rc->mu);
        cinfer_rcache_entry_release(e);
        return;
    }
    while (rc->tail && rc->st.bytes + e->bytes > rc->max_bytes) {
        drop(rc, rc->tail);
        rc->st.evictions++;
    }
    size_t b = bucket_of(rc, e->key);
    e->hnext = rc->buckets[b];
    rc->buckets[b] = e;
    lru_push(rc, e);
    rc->st.bytes += e->bytes;
    rc->st.entries++;
    rc->st.insertions++;
    maybe_grow(rc);
    pthread_mutex_unlock(&rc->mu);
}

void cinfer_rcache_stats_get(cinfer_rcache *rc, cinfer_rcache_stats *out)
{
    memset(out, 0, sizeof *out);
    if (!rc)
        return;
    pthread_mutex_lock(&rc->mu);
    *out = rc->st;
    pthread_mutex_unlock(&rc->mu);
}

int cinfer_rcache_entry_samples(const cinfer_rcache_entry *e)
{
    return e->n_samples;
}

size_t cinfer_rcache_entry_events(const cinfer_rcache_entry *e)
{
    return e->n_ev;
}

size_t cinfer_rcache_entry_bytes(const cinfer_rcache_entry *e)
{
    return e->bytes;
}

/* ---------------------------------------------------------------------- */
/* Recording (engine thread)                                              */
/* ---------------------------------------------------------------------- */

/* Bytes an entry of the recorded stream would count. */
static size_t rec_bytes(const cinfer_rcache_rec *r)
{
    return sizeof(cinfer_rcache_entry) + r->n_ev * sizeof(rc_ev) +
           r->n_data + key_size(r->key);
}

/* Stops recording: the stream will not be stored. */
static void rec_abandon(cinfer_rcache_rec *r)
{
    r->keep = 0;
    free(r->ev);
    free(r->data);
    r->ev = NULL;
    r->data = NULL;
    r->n_ev = r->cap_ev = r->n_data = r->cap_data = 0;
}

static void rec_event(cinfer_rcache_rec *r, const cinfer_engine_event *ev)
{
    if (!r->keep)
        return;
    if (ev->kind == CINFER_EVENT_FINISH &&
        ev->finish != CINFER_FINISH_LENGTH &&
        ev->finish != CINFER_FINISH_EOS &&
        ev->finish != CINFER_FINISH_STOP_SEQUENCE &&
        ev->finish != CINFER_FINISH_STOP_TOKEN) {
        rec_abandon(r);
        return;
    }
    rc_ev x = {.kind = (uint8_t)ev->kind, .sample = ev->sample_index};
    size_t need = 0;
    if (ev->kind == CINFER_EVENT_TOKENS) {
        x.n_ids = (uint32_t)ev->n_ids;
        x.text_len = (uint32_t)ev->text_len;
        x.has_lp = ev->logprobs != NULL;
        x.n_top = ev->top && ev->n_top > 0 ? (uint16_t)ev->n_top : 0;
        need = ev->n_ids * sizeof(int32_t) +
               (x.has_lp ? ev->n_ids * sizeof(float) : 0) +
               ev->n_ids * x.n_top * sizeof(cinfer_token_logprob) +
               ev->text_len + 1;
    } else {
        x.finish = (int32_t)ev->finish;
        x.prompt_tokens = ev->prompt_tokens;
        x.completion_tokens = ev->completion_tokens;
    }
    size_t off = (r->n_data + 3) & ~(size_t)3;
    x.off = off;
    if (!cinfer_grow((void **)&r->ev, &r->cap_ev, r->n_ev + 1, sizeof *r->ev) ||
        !cinfer_grow((void **)&r->data, &r->cap_data, off + need, 1)) {
        rec_abandon(r);
        return;
    }
    uint8_t *p = r->data + off;
    if (ev->kind == CINFER_EVENT_TOKENS) {
        size_t n = ev->n_ids;
        if (n)
            memcpy(p, ev->ids, n * sizeof(int32_t));
        p += n * sizeof(int32_t);
        if (x.has_lp) {
            memcpy(p, ev->logprobs, n * sizeof(float));
            p += n * sizeof(float);
        }
        if (x.n_top) {
            memcpy(p, ev->top, n * x.n_top * sizeof(cinfer_token_logprob));
            p += n * x.n_top * sizeof(cinfer_token_logprob);
        }
        if (ev->text_len)
            memcpy(p, ev->text, ev->text_len);
        p[ev->text_len] = '\0';
    }
    r->ev[r->n_ev++] = x;
    r->n_data = off + need;
    /* A stream that could not be kept is not recorded further. */
    if (rec_bytes(r) > r->max_bytes)
        rec_abandon(r);
}

/* The recorded stream as an entry (taking the recorder's buffers and
 * key), or NULL when it is not to be kept. */
static cinfer_rcache_entry *rec_entry(cinfer_rcache_rec *r)
{
    if (!r->keep || r->n_finished != r->n_samples)
        return NULL;
    cinfer_rcache_entry *e = calloc(1, sizeof *e);
    if (!e)
        return NULL;
    /* Shrink to what is held, so that the bytes counted are the bytes
     * kept. */
    rc_ev *ev = realloc(r->ev, r->n_ev * sizeof *ev);
    if (ev)
        r->ev = ev;
    uint8_t *data = r->n_data ? realloc(r->data, r->n_data) : NULL;
    if (data)
        r->data = data;
    atomic_init(&e->refs, 1);
    e->n_samples = r->n_samples;
    e->ev = r->ev;
    e->n_ev = r->n_ev;
    e->data = r->data;
    e->n_data = r->n_data;
    e->key = r->key;
    e->bytes = rec_bytes(r);
    r->ev = NULL;
    r->data = NULL;
    r->key = NULL;
    return e;
}

static void rec_on_event(void *user, const cinfer_engine_event *ev)
{
    cinfer_rcache_rec *r = user;
    rec_event(r, ev);
    int last = ev->kind == CINFER_EVENT_FINISH &&
               ++r->n_finished == r->n_samples;
    if (last) {
        cinfer_rcache_entry *e = rec_entry(r);
        if (e)
            insert(r->rc, e);
    }
    r->on_event(r->user, ev);
    if (last)
        cinfer_rcache_rec_destroy(r);
}

cinfer_status cinfer_rcache_rec_create(cinfer_rcache *rc, cinfer_rcache_key *k,
                                       cinfer_request_params *rp,
                                       cinfer_rcache_rec **out)
{
    cinfer_rcache_rec *r = calloc(1, sizeof *r);
    if (!r) {
        cinfer_rcache_key_free(k);
        return cinfer_set_error(CINFER_E_NOMEM, "response cache: no memory");
    }
    r->rc = rc;
    r->max_bytes = rc->max_bytes;
    r->key = k;
    r->on_event = rp->on_event;
    r->user = rp->user;
    r->n_samples = rp->n_samples > 0 ? rp->n_samples : 1;
    r->keep = 1;
    rp->on_event = rec_on_event;
    rp->user = r;
    *out = r;
    return CINFER_OK;
}

void cinfer_rcache_rec_destroy(cinfer_rcache_rec *r)
{
    if (!r)
        return;
    cinfer_rcache_key_free(r->key);
    free(r->ev);
    free(r->data);
    free(r);
}

/* ---------------------------------------------------------------------- */
/* Replay                                                                 */
/* ---------------------------------------------------------------------- */

void cinfer_rcache_replay(const cinfer_rcache_entry *e,
                          void (*on_event)(void *user,
                                           const cinfer_engine_event *ev),
                          void *user, int64_t (*now_ns)(void),
                          uint64_t replay_id)
{
    int64_t start = now_ns();
    int64_t first[CINFER_MAX_SAMPLES] = {0};
    for (size_t i = 0; i < e->n_ev; i++) {
        const rc_ev *x = &e->ev[i];
        const uint8_t *p = e->data + x->off;
        cinfer_engine_event ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = (cinfer_event_kind)x->kind;
        ev.request_id = replay_id;
        ev.sample_index = x->sample;
        ev.status = CINFER_OK;
        ev.message = "";
        int64_t t = now_ns() - start;
        int s = x->sample >= 0 && x->sample < CINFER_MAX_SAMPLES ? x->sample
                                                                 : 0;
        if (x->kind == CINFER_EVENT_TOKENS) {
            size_t n = x->n_ids;
            ev.ids = (const int32_t *)(const void *)p;
            p += n * sizeof(int32_t);
            ev.n_ids = n;
            if (x->has_lp) {
                ev.logprobs = (const float *)(const void *)p;
                p += n * sizeof(float);
            }
            if (x->n_top) {
                ev.top = (const cinfer_token_logprob *)(const void *)p;
                ev.n_top = x->n_top;
                p += n * x->n_top * sizeof(cinfer_token_logprob);
            }
            ev.text = (const char *)p;
            ev.text_len = x->text_len;
            if (n && !first[s])
                first[s] = t > 0 ? t : 1;
            ev.ttft_ns = first[s];
        } else {
            ev.finish = (cinfer_finish_reason)x->finish;
            ev.prompt_tokens = x->prompt_tokens;
            ev.completion_tokens = x->completion_tokens;
            ev.ttft_ns = first[s];
            ev.total_ns = t > 0 ? t : 1;
        }
        on_event(user, &ev);
    }
}
