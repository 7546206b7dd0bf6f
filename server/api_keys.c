/*
 * api_keys.c - the key file, constant-time lookup, per-key buckets
 * (api_keys.h).
 */
#include "server/api_keys.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

struct cinfer_api_keys {
    atomic_int refs;
    size_t n;
    cinfer_api_key *keys;
    cinfer_tb *buckets;        /* [n], under mu */
    pthread_mutex_t mu;
};

/* ---------------------------------------------------------------------- */
/* The file                                                               */
/* ---------------------------------------------------------------------- */

static int hexval(int c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    c = tolower(c);
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int parse_digest(const char *s, uint8_t out[32])
{
    if (strlen(s) != 64)
        return 0;
    for (int i = 0; i < 32; i++) {
        int hi = hexval((unsigned char)s[2 * i]);
        int lo = hexval((unsigned char)s[2 * i + 1]);
        if (hi < 0 || lo < 0)
            return 0;
        out[i] = (uint8_t)(hi << 4 | lo);
    }
    return 1;
}

static int name_ok(const char *s)
{
    size_t n = strlen(s);
    if (n == 0 || n > CINFER_API_KEY_MAX_NAME)
        return 0;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (!isalnum(c) && c != '-' && c != '_' && c != '.')
            return 0;
    }
    return 1;
}

/* One "name=value" option of a line into k. */
static int parse_option(const char *opt, cinfer_api_key *k)
{
    char *end;
    errno = 0;
    if (strncmp(opt, "qps=", 4) == 0) {
        double v = strtod(opt + 4, &end);
        if (errno || end == opt + 4 || *end || !(v > 0) ||
            v > CINFER_TB_MAX_RATE_PER_S)
            return 0;
        k->rate_per_s = v;
        return 1;
    }
    if (strncmp(opt, "burst=", 6) == 0) {
        unsigned long long v = strtoull(opt + 6, &end, 10);
        if (errno || end == opt + 6 || *end || v == 0 || opt[6] == '-')
            return 0;
        k->burst = v;
        return 1;
    }
    if (strncmp(opt, "max_priority=", 13) == 0) {
        long v = strtol(opt + 13, &end, 10);
        if (errno || end == opt + 13 || *end || v < -100 || v > 100)
            return 0;
        k->has_max_priority = 1;
        k->max_priority = (int32_t)v;
        return 1;
    }
    return 0;
}

static cinfer_status parse_line(const char *path, int lineno, char *line,
                                cinfer_api_key *k, int *empty)
{
    *empty = 0;
    char *hash = strchr(line, '#');
    if (hash)
        *hash = '\0';
    char *save = NULL;
    char *digest = strtok_r(line, " \t\r\n", &save);
    if (!digest) {
        *empty = 1;
        return CINFER_OK;
    }
    memset(k, 0, sizeof *k);
    if (!parse_digest(digest, k->digest))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "%s:%d: the first field must be a key's "
                                "SHA-256 in hex (64 digits)",
                                path, lineno);
    char *name = strtok_r(NULL, " \t\r\n", &save);
    if (!name || !name_ok(name))
        return cinfer_set_error(CINFER_E_FORMAT,
                                "%s:%d: the second field must be a name of "
                                "1..%d letters, digits, '-', '_' or '.'",
                                path, lineno, CINFER_API_KEY_MAX_NAME);
    snprintf(k->name, sizeof k->name, "%s", name);
    for (char *o = strtok_r(NULL, " \t\r\n", &save); o;
         o = strtok_r(NULL, " \t\r\n", &save))
        if (!parse_option(o, k))
            return cinfer_set_error(CINFER_E_FORMAT,
                                    "%s:%d: bad option '%.64s' (qps=R > 0, "
                                    "burst=N > 0, max_priority=P in "
                                    "[-100, 100])",
                                    path, lineno, o);
    return CINFER_OK;
}

static void keys_free(cinfer_api_keys *k)
{
    if (!k)
        return;
    pthread_mutex_destroy(&k->mu);
    free(k->keys);
    free(k->buckets);
    free(k);
}

/* Checks the set and makes its buckets; carries prev's states over. */
static cinfer_status finish_set(const char *path, cinfer_api_keys *k,
                                const cinfer_api_keys *prev)
{
    if (k->n == 0)
        return cinfer_set_error(CINFER_E_FORMAT, "%s: no key", path);
    for (size_t i = 0; i < k->n; i++)
        for (size_t j = i + 1; j < k->n; j++) {
            if (strcmp(k->keys[i].name, k->keys[j].name) == 0)
                return cinfer_set_error(CINFER_E_FORMAT,
                                        "%s: the name %s is used twice",
                                        path, k->keys[i].name);
            if (memcmp(k->keys[i].digest, k->keys[j].digest, 32) == 0)
                return cinfer_set_error(CINFER_E_FORMAT,
                                        "%s: %s and %s have the same key",
                                        path, k->keys[i].name,
                                        k->keys[j].name);
        }
    k->buckets = calloc(k->n, sizeof *k->buckets);
    if (!k->buckets)
        return cinfer_set_error(CINFER_E_NOMEM, "api keys: no memory");
    for (size_t i = 0; i < k->n; i++) {
        cinfer_tb_params tp = {k->keys[i].rate_per_s, k->keys[i].burst};
        cinfer_status st = cinfer_tb_init(&k->buckets[i], &tp);
        if (st != CINFER_OK)
            return cinfer_set_error(st, "%s: key %s: %s", path,
                                    k->keys[i].name, cinfer_last_error());
        if (!prev)
            continue;
        for (size_t j = 0; j < prev->n; j++) {
            const cinfer_api_key *o = &prev->keys[j];
            if (memcmp(o->digest, k->keys[i].digest, 32) == 0 &&
                o->rate_per_s == k->keys[i].rate_per_s &&
                o->burst == k->keys[i].burst) {
                pthread_mutex_lock((pthread_mutex_t *)&prev->mu);
                k->buckets[i] = prev->buckets[j];
                pthread_mutex_unlock((pthread_mutex_t *)&prev->mu);
            }
        }
    }
    return CINFER_OK;
}

cinfer_status cinfer_api_keys_load(const char *path,
                                   const cinfer_api_keys *prev,
                                   cinfer_api_keys **out)
{
    *out = NULL;
    FILE *f = fopen(path, "r");
    if (!f)
        return cinfer_set_error(CINFER_E_IO, "--api-keys %s: %s", path,
                                strerror(errno));
    cinfer_api_keys *k = calloc(1, sizeof *k);
    if (!k) {
        fclose(f);
        return cinfer_set_error(CINFER_E_NOMEM, "api keys: no memory");
    }
    atomic_init(&k->refs, 1);
    pthread_mutex_init(&k->mu, NULL);
    size_t cap = 0;
    char line[1024];
    int lineno = 0;
    cinfer_status st = CINFER_OK;
    while (st == CINFER_OK && fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            st = cinfer_set_error(CINFER_E_FORMAT, "%s:%d: line too long",
                                  path, lineno);
            break;
        }
        cinfer_api_key key;
        int empty;
        st = parse_line(path, lineno, line, &key, &empty);
        if (st != CINFER_OK || empty)
            continue;
        if (k->n == CINFER_API_KEY_MAX_KEYS) {
            st = cinfer_set_error(CINFER_E_FORMAT, "%s: more than %d keys",
                                  path, CINFER_API_KEY_MAX_KEYS);
            break;
        }
        if (k->n == cap) {
            size_t nc = cap ? cap * 2 : 16;
            cinfer_api_key *q = realloc(k->keys, nc * sizeof *q);
            if (!q) {
                st = cinfer_set_error(CINFER_E_NOMEM, "api keys: no memory");
                break;
            }
            k->keys = q;
            cap = nc;
        }
        k->keys[k->n++] = key;
    }
    if (st == CINFER_OK && ferror(f))
        st = cinfer_set_error(CINFER_E_IO, "--api-keys %s: read error", path);
    fclose(f);
    if (st == CINFER_OK)
        st = finish_set(path, k, prev);
    if (st != CINFER_OK) {
        keys_free(k);
        return st;
    }
    *out = k;
    return CINFER_OK;
}

void cinfer_api_keys_ref(cinfer_api_keys *k)
{
    atomic_fetch_add(&k->refs, 1);
}

void cinfer_api_keys_unref(cinfer_api_keys *k)
{
    if (k && atomic_fetch_sub(&k->refs, 1) == 1)
        keys_free(k);
}

size_t cinfer_api_keys_count(const cinfer_api_keys *k)
{
    return k->n;
}

const cinfer_api_key *cinfer_api_keys_get(const cinfer_api_keys *k, int i)
{
    return i >= 0 && (size_t)i < k->n ? &k->keys[i] : NULL;
}

/* ---------------------------------------------------------------------- */
/* Lookup                                                                 */
/* ---------------------------------------------------------------------- */

/* SHA-256 fetched from OpenSSL's provider once: EVP_sha256() makes
 * EVP_Digest look it up again on every call (OpenSSL 3's implicit fetch),
 * which took three times the digest itself, on every call with a key. */
static pthread_once_t sha256_once = PTHREAD_ONCE_INIT;
static EVP_MD *sha256_fetched;

static void fetch_sha256(void)
{
    sha256_fetched = EVP_MD_fetch(NULL, "SHA256", NULL);
}

int cinfer_api_keys_find(const cinfer_api_keys *k, const char *key,
                         size_t len)
{
    uint8_t d[32];
    unsigned int dl = 0;
    pthread_once(&sha256_once, fetch_sha256);
    const EVP_MD *md = sha256_fetched ? sha256_fetched : EVP_sha256();
    if (!EVP_Digest(key, len, d, &dl, md, NULL) || dl != 32)
        return -1;
    /* Every digest is compared, whatever matches. */
    int found = -1;
    for (size_t i = 0; i < k->n; i++) {
        int eq = CRYPTO_memcmp(d, k->keys[i].digest, 32) == 0;
        int mask = -eq; /* all ones when equal */
        found = (found & ~mask) | ((int)i & mask);
    }
    return found;
}

int cinfer_api_keys_take(cinfer_api_keys *k, int i, int64_t now_ns,
                         int64_t *retry_ms)
{
    *retry_ms = 0;
    if (i < 0 || (size_t)i >= k->n)
        return 0;
    int64_t wait_ns = 0;
    pthread_mutex_lock(&k->mu);
    int ok = cinfer_tb_take(&k->buckets[i], 1, now_ns, &wait_ns);
    pthread_mutex_unlock(&k->mu);
    if (!ok) {
        int64_t ms = wait_ns / 1000000 + 1;
        *retry_ms = ms > 0 ? ms : 1;
    }
    return ok;
}

int cinfer_api_key_from_header(const char *name, size_t name_len,
                               const char *value, size_t value_len,
                               const char **key, size_t *key_len)
{
    if (name_len == 13 && strncasecmp(name, "authorization", 13) == 0) {
        if (value_len < 8 || strncasecmp(value, "bearer ", 7) != 0)
            return 0;
        size_t off = 7;
        while (off < value_len && value[off] == ' ')
            off++;
        *key = value + off;
        *key_len = value_len - off;
        return *key_len > 0;
    }
    if (name_len == 9 && strncasecmp(name, "x-api-key", 9) == 0) {
        *key = value;
        *key_len = value_len;
        return value_len > 0;
    }
    return 0;
}
