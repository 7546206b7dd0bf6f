/*
 * tls.c - TLS credentials with reloadable certificates (tls.h).
 *
 * The object holds the paths and the config gRPC core has not taken yet
 * (`pending`): create and reload build one from the files, the fetcher
 * hands it over (RELOAD_NEW) once and answers RELOAD_UNCHANGED after.
 */
#include "server/tls.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct cinfer_tls {
    char *cert_path, *key_path, *client_ca_path;
    pthread_mutex_t mu;
    grpc_ssl_server_certificate_config *pending; /* under mu */
};

cinfer_status cinfer_tls_read_pem(const char *what, const char *path,
                                  char **out)
{
    *out = NULL;
    FILE *f = fopen(path, "rb");
    if (!f)
        return cinfer_set_error(CINFER_E_IO, "%s %s: %s", what, path,
                                strerror(errno));
    char *buf = malloc(CINFER_TLS_MAX_PEM_BYTES + 1);
    if (!buf) {
        fclose(f);
        return cinfer_set_error(CINFER_E_NOMEM, "tls: no memory");
    }
    size_t n = fread(buf, 1, CINFER_TLS_MAX_PEM_BYTES + 1, f);
    int err = ferror(f);
    fclose(f);
    if (err) {
        free(buf);
        return cinfer_set_error(CINFER_E_IO, "%s %s: read error", what, path);
    }
    if (n > CINFER_TLS_MAX_PEM_BYTES) {
        free(buf);
        return cinfer_set_error(CINFER_E_FORMAT, "%s %s: larger than %d bytes",
                                what, path, CINFER_TLS_MAX_PEM_BYTES);
    }
    buf[n] = '\0';
    if (memchr(buf, '\0', n) || !strstr(buf, "-----BEGIN ")) {
        free(buf);
        return cinfer_set_error(CINFER_E_FORMAT, "%s %s: not a PEM file", what,
                                path);
    }
    *out = buf;
    return CINFER_OK;
}

/* A config from the files. */
static cinfer_status load(const cinfer_tls *t,
                          grpc_ssl_server_certificate_config **out)
{
    char *cert = NULL, *key = NULL, *ca = NULL;
    cinfer_status st = cinfer_tls_read_pem("--tls-cert", t->cert_path, &cert);
    if (st == CINFER_OK)
        st = cinfer_tls_read_pem("--tls-key", t->key_path, &key);
    if (st == CINFER_OK && t->client_ca_path)
        st = cinfer_tls_read_pem("--tls-client-ca", t->client_ca_path, &ca);
    if (st == CINFER_OK) {
        grpc_ssl_pem_key_cert_pair pair = {key, cert};
        /* The config copies the strings. gRPC core (1.51) asserts that a
         * fetched config has root certificates even when it asks clients
         * for none: without --tls-client-ca the server's own chain stands
         * in, unused (no client certificate is requested). */
        *out = grpc_ssl_server_certificate_config_create(ca ? ca : cert,
                                                         &pair, 1);
        if (!*out)
            st = cinfer_set_error(CINFER_E_NOMEM, "tls: no memory");
    }
    if (key) {
        /* The private key does not linger in freed memory. */
        memset(key, 0, strlen(key));
        free(key);
    }
    free(cert);
    free(ca);
    return st;
}

static grpc_ssl_certificate_config_reload_status
fetch(void *user, grpc_ssl_server_certificate_config **config)
{
    cinfer_tls *t = user;
    pthread_mutex_lock(&t->mu);
    grpc_ssl_server_certificate_config *c = t->pending;
    t->pending = NULL;
    pthread_mutex_unlock(&t->mu);
    if (!c)
        return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_UNCHANGED;
    *config = c;
    return GRPC_SSL_CERTIFICATE_CONFIG_RELOAD_NEW;
}

static char *dup_or_null(const char *s)
{
    return s && s[0] ? strdup(s) : NULL;
}

void cinfer_tls_destroy(cinfer_tls *t)
{
    if (!t)
        return;
    if (t->pending)
        grpc_ssl_server_certificate_config_destroy(t->pending);
    pthread_mutex_destroy(&t->mu);
    free(t->cert_path);
    free(t->key_path);
    free(t->client_ca_path);
    free(t);
}

cinfer_status cinfer_tls_create(const cinfer_tls_params *p, cinfer_tls **out)
{
    *out = NULL;
    if (!p->cert_path || !p->cert_path[0] || !p->key_path || !p->key_path[0])
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "TLS needs both --tls-cert and --tls-key");
    cinfer_tls *t = calloc(1, sizeof *t);
    if (!t)
        return cinfer_set_error(CINFER_E_NOMEM, "tls: no memory");
    pthread_mutex_init(&t->mu, NULL);
    t->cert_path = strdup(p->cert_path);
    t->key_path = strdup(p->key_path);
    t->client_ca_path = dup_or_null(p->client_ca_path);
    if (!t->cert_path || !t->key_path ||
        (p->client_ca_path && p->client_ca_path[0] && !t->client_ca_path)) {
        cinfer_tls_destroy(t);
        return cinfer_set_error(CINFER_E_NOMEM, "tls: no memory");
    }
    cinfer_status st = load(t, &t->pending);
    if (st != CINFER_OK) {
        cinfer_tls_destroy(t);
        return st;
    }
    *out = t;
    return CINFER_OK;
}

grpc_server_credentials *cinfer_tls_credentials(cinfer_tls *t)
{
    grpc_ssl_server_credentials_options *o =
        grpc_ssl_server_credentials_create_options_using_config_fetcher(
            t->client_ca_path
                ? GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY
                : GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE,
            fetch, t);
    if (!o)
        return NULL;
    return grpc_ssl_server_credentials_create_with_options(o);
}

cinfer_status cinfer_tls_reload(cinfer_tls *t)
{
    grpc_ssl_server_certificate_config *c = NULL;
    cinfer_status st = load(t, &c);
    if (st != CINFER_OK)
        return st;
    pthread_mutex_lock(&t->mu);
    grpc_ssl_server_certificate_config *old = t->pending;
    t->pending = c;
    pthread_mutex_unlock(&t->mu);
    if (old)
        grpc_ssl_server_certificate_config_destroy(old);
    return CINFER_OK;
}

int cinfer_tls_mutual(const cinfer_tls *t)
{
    return t->client_ca_path != NULL;
}
