/*
 * conn_limit.h - connection caps (total and per peer) and the descriptor
 * reserve, over the gRPC port and the HTTP API together.
 *
 * gRPC core 1.51 has no connection limit of its own, and its listener
 * stops accepting for good the first time accept4 fails with EMFILE. So
 * the server hands gRPC core a socket mutator (the channel argument
 * GRPC_ARG_SOCKET_MUTATOR), which the core calls with every connection it
 * accepted, before any byte of the HTTP/2 or TLS handshake. The limiter
 * counts the connection there, or refuses it: a refused socket is shut
 * down (the client sees the connection closed before any handshake) and
 * the core closes it once its first read sees the end.
 *
 *   - Total and per peer (its IP address; IPv4-mapped IPv6 as IPv4):
 *     past max_connections, or past max_per_peer from one address, a new
 *     connection is refused while those already open go on.
 *   - The descriptor reserve: the kernel hands out the lowest free
 *     descriptor, so an accepted one numbered within fd_reserve of
 *     RLIMIT_NOFILE means the table is that full. It is refused, and the
 *     listening sockets' queues are emptied (each connection accepted and
 *     closed at once), so a burst of connections cannot take the last
 *     descriptors before the core's own accept fails. While that holds
 *     the limiter is "starved": health answers NOT_SERVING until a
 *     descriptor below the reserve is free again.
 *
 * A connection's end is learnt without a hook in the core: each counted
 * connection is kept as (descriptor, socket inode); the number handed out
 * again, or a sweep (fstat of each, now and then and before a refusal)
 * finding another inode or none, ends it.
 *
 * The HTTP API's connections (libmicrohttpd) are counted through its
 * accept-policy and connection callbacks (cinfer_conn_limit_check_addr,
 * _open_addr, _close_addr).
 *
 * The mutator's layout is gRPC core's internal one (not installed): it is
 * declared once, in conn_limit.c, for gRPC core 29.x (gRPC 1.51). With
 * another core the caps are off and the server says so in its log.
 *
 * Thread safety: every function may be called from any thread.
 */
#ifndef CINFER_SERVER_CONN_LIMIT_H
#define CINFER_SERVER_CONN_LIMIT_H

#include <grpc/grpc.h>
#include <stdint.h>
#include <sys/socket.h>

#include "common/status.h"
#include "server/metrics.h"

typedef struct cinfer_conn_limit cinfer_conn_limit;

typedef enum {
    CINFER_CONN_ADMIT = 0,
    CINFER_CONN_REFUSED_TOTAL, /* "max_connections" */
    CINFER_CONN_REFUSED_PEER,  /* "max_connections_per_peer" */
    CINFER_CONN_REFUSED_FDS,   /* "fd_reserve" */
    CINFER_CONN_VERDICT_COUNT_
} cinfer_conn_verdict;

typedef struct {
    int max_connections; /* open at once, gRPC and HTTP together; 0 = no
                            limit */
    int max_per_peer;    /* open at once from one IP address; 0 = no
                            limit */
    int fd_reserve;      /* descriptors below RLIMIT_NOFILE that accepted
                            connections never take; 0 = none */
} cinfer_conn_limit_params;

typedef struct {
    int open[CINFER_FRONTEND_COUNT_]; /* counted connections now */
    uint64_t refused[CINFER_FRONTEND_COUNT_][CINFER_CONN_VERDICT_COUNT_];
    int starved;         /* refusing for the descriptor reserve */
    int active;          /* the gRPC port's caps are on */
} cinfer_conn_limit_stats;

/* The metrics label of a refusal ("max_connections", ...). */
const char *cinfer_conn_verdict_name(cinfer_conn_verdict v);

/* Errors: CINFER_E_INVALID_ARG (a negative limit), CINFER_E_NOMEM. */
cinfer_status cinfer_conn_limit_create(const cinfer_conn_limit_params *p,
                                       cinfer_conn_limit **out);
/* Lets the creator's hold go; gRPC core may hold the mutator longer (its
 * channel arguments), the last holder frees it. NULL is fine. */
void cinfer_conn_limit_release(cinfer_conn_limit *l);

/* The channel argument to create the gRPC server with; 0 (and *arg
 * untouched) when the running gRPC core is not the one whose layout this
 * file mirrors (logged once). The argument holds no reference of its own:
 * gRPC core copies it. */
int cinfer_conn_limit_grpc_arg(cinfer_conn_limit *l, grpc_arg *arg);

/* HTTP: may a connection from addr be accepted now? (Counts a refusal.) */
cinfer_conn_verdict cinfer_conn_limit_check_addr(cinfer_conn_limit *l,
                                                 const struct sockaddr *addr,
                                                 socklen_t len);
/* HTTP: a connection from addr opened / closed. */
void cinfer_conn_limit_open_addr(cinfer_conn_limit *l,
                                 const struct sockaddr *addr, socklen_t len);
void cinfer_conn_limit_close_addr(cinfer_conn_limit *l,
                                  const struct sockaddr *addr, socklen_t len);

/* Periodic work (the watchdog's tick): ends the connections that closed
 * and clears "starved" once a descriptor below the reserve is free. At
 * most every few hundred milliseconds does it cost more than a clock
 * read. */
void cinfer_conn_limit_tick(cinfer_conn_limit *l, int64_t now_ns);

/* 1 while new connections are refused for the descriptor reserve. */
int cinfer_conn_limit_starved(const cinfer_conn_limit *l);

void cinfer_conn_limit_get_stats(cinfer_conn_limit *l,
                                 cinfer_conn_limit_stats *out);

#endif /* CINFER_SERVER_CONN_LIMIT_H */
