/*
 * http.h - the OpenAI-compatible HTTP front end (http.c): a
 * libmicrohttpd daemon on its own port beside the gRPC one, over the
 * server's request path.
 *
 *     cinfer_http *h;
 *     cinfer_http_create(srv, "127.0.0.1:8000", &h);  // listening
 *     ...                                            // SIGTERM: drain
 *     cinfer_http_abort_all(h);   // destroy: engine requests cancelled
 *     cinfer_http_destroy(h);     // joins the connection threads
 *
 * The server owns it (cinfer_server_params.http_listen); created with the
 * server, destroyed before the server lets the engine go.
 */
#ifndef CINFER_SERVER_HTTP_H
#define CINFER_SERVER_HTTP_H

#include <stdint.h>

#include "server/server.h"

typedef struct cinfer_http cinfer_http;

/* CINFER_E_IO (the address cannot be bound), CINFER_E_INVALID_ARG (a bad
 * address), CINFER_E_NOMEM. */
cinfer_status cinfer_http_create(cinfer_server *s, const char *listen,
                                 cinfer_http **out);
int cinfer_http_port(const cinfer_http *h);
/* Cancels the engine request of every request in flight (they answer 503
 * or end their stream). Thread-safe. */
void cinfer_http_abort_all(cinfer_http *h);
/* Re-checks the queued requests against the shedder (the watchdog's
 * hook, as for gRPC's Generate); a shed one ends with 503 (or an error
 * event in its stream). */
void cinfer_http_check_queued(cinfer_http *h, int64_t now_ns);
/* Stops the daemon. NULL is fine. */
void cinfer_http_destroy(cinfer_http *h);

#endif /* CINFER_SERVER_HTTP_H */
