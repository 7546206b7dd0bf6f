/*
 * response_cache.h - the exact response cache (--response-cache-mb): the
 * engine's answers to deterministic generation requests, kept by what
 * decides them, and replayed to a request that asks the same again.
 *
 * The model: an exact-match result cache in front of the engine, as the
 * service design asks, with the byte-bounded LRU of the grammar cache
 * (engine/grammar_cache.h). A request is deterministic, and so
 * cacheable, when it is greedy (temperature below
 * CINFER_SAMPLER_GREEDY_EPS) or samples with a seed the client gave;
 * sampling with the server's random seed never reads or writes the cache.
 * Its key is a byte string of everything that decides the output, and
 * nothing else (cinfer_rcache_key_make lists it): the prompt's token ids,
 * the sampler's fields, the stopping fields, n, logprobs, and the
 * grammar, regex or JSON schema's text. The priority, deadlines, time
 * limit, request id and client do not enter it. Entries are found by the
 * key's SHA-256 and then compared byte by byte, so a hash collision is a
 * miss, never another prompt's answer.
 *
 * A value is the engine's event stream of the request, every sample's
 * TOKENS (ids, text, logprobs with their top entries) and FINISH (reason,
 * prompt and completion tokens) in the order the engine sent them.
 * Only a request whose every sample finished by itself (length, EOS, a
 * stop string or stop token) is stored: one that was cancelled, timed
 * out, hit its deadline, failed or was drained never is. A hit replays
 * the stream through the front end's own event handler, so its framing
 * is the front end's and a fresh run's: the same tokens, text, logprobs,
 * finish reasons and usage. A request with a time limit may hit a
 * complete stored answer: a time limit only cuts a generation short,
 * and the stored one is what the request would have got had it finished
 * in time, which a replay does.
 *
 * The bound is in bytes of what an entry holds: the entry and its
 * events' records, the token ids, text and logprobs, and the key bytes
 * (malloc's own overhead aside, and the hash table's 8 to 16 bytes per
 * entry, which is not counted). Inserting past it evicts the least
 * recently used entries; an entry larger than the whole bound is not
 * kept. An entry a replay is reading stays alive (reference counted)
 * after its eviction until the replay releases it.
 *
 *     cinfer_rcache_params p = cinfer_rcache_default_params();
 *     p.max_bytes = 64 << 20;
 *     cinfer_rcache *rc;
 *     cinfer_rcache_create(&p, &rc);
 *     cinfer_rcache_key *k = NULL;
 *     if (cinfer_rcache_cacheable(&desc, &rp))
 *         cinfer_rcache_key_make(&desc, &rp, &k);
 *     cinfer_rcache_entry *e = cinfer_rcache_lookup(rc, k);
 *     if (e) {                       // a hit: no engine
 *         cinfer_rcache_replay(e, on_event, user, now_ns, NULL);
 *         cinfer_rcache_entry_release(e);
 *     } else {                       // a miss: record what the engine says
 *         cinfer_rcache_rec *r;
 *         cinfer_rcache_rec_create(rc, k, &rp, &r);   // takes k; rp hooked
 *         if (cinfer_engine_submit(e, &rp, &id) != CINFER_OK)
 *             cinfer_rcache_rec_destroy(r);
 *     }
 *     cinfer_rcache_destroy(rc);
 *
 * Thread safety: the cache has its own mutex; every function but
 * create/destroy may be called from any thread. A recorder is driven by
 * the engine thread's events; an entry is immutable once stored.
 * tests/unit/test_server_response_cache.c.
 */
#ifndef CINFER_SERVER_RESPONSE_CACHE_H
#define CINFER_SERVER_RESPONSE_CACHE_H

#include <stddef.h>
#include <stdint.h>

#include "engine/engine.h"
#include "server/request.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cinfer_rcache cinfer_rcache;
typedef struct cinfer_rcache_key cinfer_rcache_key;
typedef struct cinfer_rcache_entry cinfer_rcache_entry;
typedef struct cinfer_rcache_rec cinfer_rcache_rec;

typedef struct {
    size_t max_bytes; /* bytes kept, entries and keys (see above); 0 =
                         a cache that stores nothing (every lookup
                         misses) */
} cinfer_rcache_params;

cinfer_rcache_params cinfer_rcache_default_params(void);

cinfer_status cinfer_rcache_create(const cinfer_rcache_params *p,
                                   cinfer_rcache **out);
/* Frees every entry; replays still running must have released theirs and
 * recorders must be done. NULL is fine. */
void cinfer_rcache_destroy(cinfer_rcache *rc);

/* ---- the key ----------------------------------------------------------- */

/* 1 when the request's output is a function of its key: greedy, or
 * sampling with the client's seed (d->has_seed); a grammar the engine
 * gets is one the desc names by its text; and no prompt embeddings
 * (their rows are not in the key: such a request always runs). Pure. */
int cinfer_rcache_cacheable(const cinfer_gen_desc *d,
                            const cinfer_request_params *rp);

/* The key of a cacheable request (*out malloc'd; cinfer_rcache_key_free):
 * from rp, the prompt ids, max_tokens, min_tokens, ignore_eos, stop
 * strings, stop ids, n, logprobs, and every sampler field (n_vocab,
 * penalties, penalty_last_n and its prompt rule, n_logprobs, min_tokens,
 * eog tokens, logit biases; for a sampled request also temperature,
 * top_k, top_p, min_p and the seed, which a greedy one does not use);
 * from d, the grammar, regex, JSON schema and json_object. */
cinfer_status cinfer_rcache_key_make(const cinfer_gen_desc *d,
                                     const cinfer_request_params *rp,
                                     cinfer_rcache_key **out);
void cinfer_rcache_key_free(cinfer_rcache_key *k); /* NULL is fine */

/* The key's bytes and their SHA-256 (borrowed from k). */
const uint8_t *cinfer_rcache_key_bytes(const cinfer_rcache_key *k,
                                       size_t *len);
const uint8_t *cinfer_rcache_key_digest(const cinfer_rcache_key *k);

/* A key from raw bytes with a given digest (for tests of the collision
 * compare; *out malloc'd). */
cinfer_status cinfer_rcache_key_from_bytes(const uint8_t *bytes, size_t len,
                                           const uint8_t digest[32],
                                           cinfer_rcache_key **out);

/* ---- lookup and replay -------------------------------------------------- */

/* The stored answer under k (a reference: release it), or NULL; counts a
 * hit or a miss, and a hit makes it the most recently used. k NULL is
 * NULL, counted as nothing. */
cinfer_rcache_entry *cinfer_rcache_lookup(cinfer_rcache *rc,
                                          const cinfer_rcache_key *k);
void cinfer_rcache_entry_release(cinfer_rcache_entry *e); /* NULL is fine */

/* Samples, events and bytes of an entry. */
int cinfer_rcache_entry_samples(const cinfer_rcache_entry *e);
size_t cinfer_rcache_entry_events(const cinfer_rcache_entry *e);
size_t cinfer_rcache_entry_bytes(const cinfer_rcache_entry *e);

/* Calls on_event(user, ev) for each stored event, in order, on the
 * calling thread, as the engine would have: request_id replay_id (the
 * engine never gives 0, so a cancel of it is ignored), queue_ns and
 * cached_tokens 0 (no queue, no prefix cache), ttft_ns and total_ns the
 * time since the replay began on now_ns's clock, status OK. The last
 * event is the last sample's FINISH. */
void cinfer_rcache_replay(const cinfer_rcache_entry *e,
                          void (*on_event)(void *user,
                                           const cinfer_engine_event *ev),
                          void *user, int64_t (*now_ns)(void),
                          uint64_t replay_id);

/* ---- recording ----------------------------------------------------------- */

/* A recorder of one miss: takes k (freed with the recorder) and hooks
 * rp's on_event/user so that the engine's events pass through it to the
 * caller's handler. When the last sample's FINISH comes, before it is
 * passed on (so that a client that saw its answer finds it stored), the
 * recorder stores the stream if every sample ended by itself, then frees
 * itself after passing the event on. If the engine refuses the request,
 * cinfer_rcache_rec_destroy frees it (no event ever came). On failure
 * (CINFER_E_NOMEM) k is freed and rp untouched. */
cinfer_status cinfer_rcache_rec_create(cinfer_rcache *rc, cinfer_rcache_key *k,
                                       cinfer_request_params *rp,
                                       cinfer_rcache_rec **out);
void cinfer_rcache_rec_destroy(cinfer_rcache_rec *r); /* NULL is fine */

/* ---- numbers ------------------------------------------------------------- */

typedef struct {
    uint64_t hits, misses;  /* lookups that found / did not find */
    uint64_t insertions;    /* answers stored */
    uint64_t evictions;     /* entries dropped for the bound */
    uint64_t bytes;         /* bytes held now (see above) */
    uint64_t entries;       /* entries held now */
    uint64_t max_bytes;     /* the bound */
} cinfer_rcache_stats;

void cinfer_rcache_stats_get(cinfer_rcache *rc, cinfer_rcache_stats *out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_RESPONSE_CACHE_H */
