/*
 * tls.h - TLS and mTLS on the gRPC port, through gRPC core's SSL server
 * credentials, with certificates reloaded without a restart.
 *
 * The credentials are made with a certificate-config fetcher
 * (grpc_ssl_server_credentials_create_options_using_config_fetcher): gRPC
 * core asks it for a new config before each handshake. cinfer_tls_reload
 * reads the files again and leaves the new config for the next ask, so new
 * connections get the new certificate while the running ones (their
 * streams) go on with the one they were made with.
 *
 *     cinfer_tls_params tp = {.cert_path = "srv.pem", .key_path = "srv.key",
 *                             .client_ca_path = "ca.pem"};   // mTLS
 *     cinfer_tls *t;
 *     cinfer_tls_create(&tp, &t);
 *     grpc_server_credentials *creds = cinfer_tls_credentials(t);
 *     grpc_server_add_http2_port(server, addr, creds);
 *     grpc_server_credentials_release(creds);
 *     ...SIGHUP: cinfer_tls_reload(t);
 *     ...after grpc_server_destroy: cinfer_tls_destroy(t);
 *
 * Thread safety: the fetcher runs on gRPC's threads; reload on any thread;
 * both take the object's lock. The object must outlive the gRPC server.
 */
#ifndef CINFER_SERVER_TLS_H
#define CINFER_SERVER_TLS_H

#include <grpc/grpc_security.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Largest PEM file read. */
#define CINFER_TLS_MAX_PEM_BYTES (1 << 20)

typedef struct cinfer_tls cinfer_tls;

typedef struct {
    const char *cert_path;      /* the server's certificate chain (PEM);
                                   required */
    const char *key_path;       /* its private key (PEM); required */
    const char *client_ca_path; /* CA certificates (PEM) that client
                                   certificates must chain to: a client
                                   certificate is then required and
                                   verified (mTLS); NULL or "" = none
                                   asked */
} cinfer_tls_params;

/* Reads the files (the paths are copied). Errors: CINFER_E_IO (a file
 * cannot be read), CINFER_E_FORMAT (not PEM), CINFER_E_INVALID_ARG (a
 * path missing), CINFER_E_NOMEM. */
cinfer_status cinfer_tls_create(const cinfer_tls_params *p, cinfer_tls **out);

/* New server credentials over the object (release them with
 * grpc_server_credentials_release once the port is added); NULL when out
 * of memory. */
grpc_server_credentials *cinfer_tls_credentials(cinfer_tls *t);

/* Reads the files again; new connections get them. On error (as create's)
 * nothing changes. */
cinfer_status cinfer_tls_reload(cinfer_tls *t);

/* 1 when client certificates are required (mTLS). */
int cinfer_tls_mutual(const cinfer_tls *t);

void cinfer_tls_destroy(cinfer_tls *t);

/* A PEM file as a NUL-terminated string (*out malloc'd), at most
 * CINFER_TLS_MAX_PEM_BYTES; `what` names it in errors (the flag). Errors
 * as create's. */
cinfer_status cinfer_tls_read_pem(const char *what, const char *path,
                                  char **out);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_SERVER_TLS_H */
