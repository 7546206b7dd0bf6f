/*
 * api_keys.h - API keys: who may call, under which name, at what rate.
 *
 * --api-keys FILE holds one key per line, as the SHA-256 of the key in hex
 * (the file never holds a key itself), a name, and optional limits:
 *
 *     # sha256(key)                                                  name
 *     5e884898da28047151d0e56f8dc6292773603d0d6aabbdd62a11ef721d1542d8 alice qps=10 burst=20 max_priority=10
 *     6b86b273ff34fce19ab5b44c8ac4af9eb86fd5ea73bb1b4bf7bc6e4e7f8b95aa batch
 *
 *   qps=R           the key's own token bucket, R requests per second
 *                   (its calls no longer use the per-client buckets)
 *   burst=N         the bucket's size (default one second's worth)
 *   max_priority=P  requests above this priority are PERMISSION_DENIED
 *
 * A call presents its key as `authorization: Bearer KEY` or `x-api-key:
 * KEY`; its SHA-256 is compared with every digest of the file in constant
 * time. Names (never keys) go to logs and metrics.
 *
 * A key set is immutable once loaded, except for the buckets, which its
 * own lock guards; the server swaps a whole new set in on SIGHUP, and a
 * key's bucket state carries over when its digest and limits are the
 * same. Sets are reference-counted: a call holds the set it was admitted
 * under until it ends.
 *
 * Thread safety: find and take from any thread; ref/unref are atomic.
 */
#ifndef CINFER_SERVER_API_KEYS_H
#define CINFER_SERVER_API_KEYS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "resilience/resilience.h"

#ifdef __cplusplus
extern "C" {
#endif

#define CINFER_API_KEY_MAX_NAME 64
#define CINFER_API_KEY_MAX_KEYS 65536
#define CINFER_API_KEY_MAX_BYTES 4096 /* longest key a call may present */

typedef struct {
    char name[CINFER_API_KEY_MAX_NAME + 1];
    uint8_t digest[32];       /* SHA-256 of the key */
    double rate_per_s;        /* the key's bucket; 0 = none */
    uint64_t burst;           /* its size; 0 = one second's worth */
    int has_max_priority;
    int32_t max_priority;     /* when has_max_priority */
} cinfer_api_key;

typedef struct cinfer_api_keys cinfer_api_keys;

/* Reads a key file. prev (may be NULL): the set it replaces, whose bucket
 * states carry over. Errors name the file and line: CINFER_E_IO,
 * CINFER_E_FORMAT (a bad line, a repeated name or digest, no key),
 * CINFER_E_NOMEM. The new set has one reference. */
cinfer_status cinfer_api_keys_load(const char *path,
                                   const cinfer_api_keys *prev,
                                   cinfer_api_keys **out);

void cinfer_api_keys_ref(cinfer_api_keys *k);
/* Drops a reference; the last frees the set. NULL is fine. */
void cinfer_api_keys_unref(cinfer_api_keys *k);

size_t cinfer_api_keys_count(const cinfer_api_keys *k);

/* The index of the key whose digest is SHA-256(key[0..len)), or -1. The
 * time taken does not depend on which digest matches, or whether one
 * does. */
int cinfer_api_keys_find(const cinfer_api_keys *k, const char *key,
                         size_t len);

const cinfer_api_key *cinfer_api_keys_get(const cinfer_api_keys *k, int i);

/* Takes one token from key i's bucket at now_ns: 1, or 0 with *retry_ms
 * (>= 1) when the key is over its rate. A key without qps always
 * passes. */
int cinfer_api_keys_take(cinfer_api_keys *k, int i, int64_t now_ns,
                         int64_t *retry_ms);

/* The key a call presents in its metadata: the value of `authorization:
 * Bearer KEY` (the scheme case-insensitive) or of `x-api-key`. Returns 0
 * when there is none. */
int cinfer_api_key_from_header(const char *name, size_t name_len,
                               const char *value, size_t value_len,
                               const char **key, size_t *key_len);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_API_KEYS_H */
