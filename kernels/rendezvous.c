/*
 * rendezvous.c - node 0 hands a small opaque id (NCCL's unique id) to the
 * other nodes of a tensor-parallel group over plain TCP (comm.h).
 *
 * The wire, all integers big-endian u32:
 *
 *   hello (node k -> node 0): "CINFRDV1" version n_nodes node_rank
 *                             world_size id_bytes                (28 bytes)
 *   reply (node 0 -> node k): "CINFRDV1" code len payload[len]
 *        code 0: payload is the id; 1: refused, payload says why;
 *        2: the rendezvous failed elsewhere, payload says why.
 *
 * Node 0 polls its listening socket and every connection that has not yet
 * said hello together, so one silent or slow connection holds up no one;
 * it sends the id only when all n_nodes - 1 peers have checked in, so a
 * node that receives it knows the whole group got this far. Everything
 * runs against one deadline: connect (retried every RETRY_MS while node 0
 * is not listening yet), accept, read and write are poll()ed with the time
 * left, never a blocking call without a bound. (Name resolution,
 * getaddrinfo, is the one wait not under the deadline.)
 *
 * With keep_open the connections outlive the exchange as a byte channel
 * between node 0 and each other node (the tensor-parallel group's steps,
 * engine/model_group.c); its reads and writes are bounded the same way,
 * unless the caller asks for no bound.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm.h"

#define MAGIC "CINFRDV1"
#define VERSION 1
#define HELLO_BYTES 28
#define REPLY_HEAD_BYTES 16
#define MAX_ID_BYTES 1024
#define MAX_MSG_BYTES 512
#define MAX_PENDING 64 /* connections not yet through hello */
#define RETRY_MS 50
#define DEFAULT_TIMEOUT_MS 60000

enum { CODE_OK = 0, CODE_REFUSED = 1, CODE_FAILED = 2 };

struct cinfer_rendezvous {
    char addr[272]; /* as given, for messages */
    char host[256];
    int port;
    int n_nodes, node_rank, world_size, timeout_ms;
    int listen_fd; /* node 0 */
    int done;
    int keep_open;
    int *kept; /* keep_open, after a successful run: [n_nodes] connection
                  to each peer (node 0: 1..n_nodes-1; others: [0]), -1 none */
};

/* ---------------------------------------------------------------------- */
/* helpers                                                                 */
/* ---------------------------------------------------------------------- */

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* No deadline: a wait without a bound (the channel's idle reads). */
#define NO_DEADLINE (-1LL)

/* Milliseconds to the deadline for poll(): 0 once it passed, -1 (wait
 * without a bound) for NO_DEADLINE. */
static int left_ms(long long deadline)
{
    if (deadline == NO_DEADLINE)
        return -1;
    long long d = deadline - now_ms();
    return d <= 0 ? 0 : d > 1000000000 ? 1000000000 : (int)d;
}

static void put_u32(uint8_t *p, uint32_t v)
{
    p[0] = (uint8_t)(v >> 24);
    p[1] = (uint8_t)(v >> 16);
    p[2] = (uint8_t)(v >> 8);
    p[3] = (uint8_t)v;
}

static uint32_t get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 |
           p[3];
}

static int set_nonblocking(int fd)
{
    int fl = fcntl(fd, F_GETFL);
    return fl < 0 ? -1 : fcntl(fd, F_SETFL, fl | O_NONBLOCK);
}

/* Writes n bytes before the deadline: 0, or -1 with errno (ETIMEDOUT). */
static int write_all(int fd, const void *buf, size_t n, long long deadline)
{
    const uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        struct pollfd pf = {fd, POLLOUT, 0};
        int ms = left_ms(deadline);
        if (ms == 0 || (poll(&pf, 1, ms) == 0 && left_ms(deadline) == 0)) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
    return 0;
}

/* Reads n bytes before the deadline: 0; -1 with errno (ETIMEDOUT), or
 * with errno 0 when the peer closed first. */
static int read_all(int fd, void *buf, size_t n, long long deadline)
{
    uint8_t *p = buf;
    while (n > 0) {
        ssize_t k = recv(fd, p, n, 0);
        if (k > 0) {
            p += k;
            n -= (size_t)k;
            continue;
        }
        if (k == 0) {
            errno = 0;
            return -1;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return -1;
        struct pollfd pf = {fd, POLLIN, 0};
        int ms = left_ms(deadline);
        if (ms == 0 || (poll(&pf, 1, ms) == 0 && left_ms(deadline) == 0)) {
            errno = ETIMEDOUT;
            return -1;
        }
    }
    return 0;
}

/* "HOST:PORT" or "[V6]:PORT" into host and port. 0 or -1. */
static int parse_addr(const char *addr, char *host, size_t host_size,
                      int *port)
{
    const char *colon = strrchr(addr, ':');
    if (!colon || colon == addr)
        return -1;
    const char *h = addr, *he = colon;
    if (addr[0] == '[') {
        if (colon[-1] != ']')
            return -1;
        h = addr + 1;
        he = colon - 1;
    }
    size_t hl = (size_t)(he - h);
    if (hl == 0 || hl >= host_size)
        return -1;
    memcpy(host, h, hl);
    host[hl] = '\0';
    char *end = NULL;
    long v = strtol(colon + 1, &end, 10);
    if (colon[1] == '\0' || *end != '\0' || v < 0 || v > 65535)
        return -1;
    *port = (int)v;
    return 0;
}

/* A reply: header and payload. */
static int send_reply(int fd, uint32_t code, const void *payload, size_t len,
                      long long deadline)
{
    uint8_t head[REPLY_HEAD_BYTES];
    if (code != CODE_OK && len > MAX_MSG_BYTES)
        len = MAX_MSG_BYTES; /* what a peer accepts */
    memcpy(head, MAGIC, 8);
    put_u32(head + 8, code);
    put_u32(head + 12, (uint32_t)len);
    if (write_all(fd, head, sizeof head, deadline) != 0)
        return -1;
    return write_all(fd, payload, len, deadline);
}

/* ---------------------------------------------------------------------- */
/* create / destroy                                                        */
/* ---------------------------------------------------------------------- */

cinfer_rendezvous_params cinfer_rendezvous_default_params(void)
{
    cinfer_rendezvous_params p;
    memset(&p, 0, sizeof p);
    p.n_nodes = 2;
    p.timeout_ms = DEFAULT_TIMEOUT_MS;
    return p;
}

/* Node 0's socket: the wildcard address of the family host resolves to
 * (IPv4 when it does not resolve), on r->port. */
static cinfer_status listen_on(cinfer_rendezvous *r)
{
    int family = AF_INET;
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(r->host, NULL, &hints, &res) == 0 && res) {
        family = res->ai_family == AF_INET6 ? AF_INET6 : AF_INET;
        freeaddrinfo(res);
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return cinfer_set_error(CINFER_E_IO, "rendezvous: socket: %s",
                                strerror(errno));
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_storage ss;
    socklen_t len;
    memset(&ss, 0, sizeof ss);
    if (family == AF_INET6) {
        struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero);
        a->sin6_family = AF_INET6;
        a->sin6_addr = in6addr_any;
        a->sin6_port = htons((uint16_t)r->port);
        len = sizeof *a;
    } else {
        struct sockaddr_in *a = (struct sockaddr_in *)&ss;
        a->sin_family = AF_INET;
        a->sin_addr.s_addr = htonl(INADDR_ANY);
        a->sin_port = htons((uint16_t)r->port);
        len = sizeof *a;
    }
    if (bind(fd, (struct sockaddr *)&ss, len) != 0 ||
        listen(fd, r->n_nodes + 16) != 0 || set_nonblocking(fd) != 0) {
        int e = errno;
        close(fd);
        return cinfer_set_error(CINFER_E_IO,
                                "rendezvous: node 0 cannot listen on port %d "
                                "(%s): %s",
                                r->port, r->addr, strerror(e));
    }
    len = sizeof ss;
    if (getsockname(fd, (struct sockaddr *)&ss, &len) == 0)
        r->port = ntohs(ss.ss_family == AF_INET6
                            ? ((struct sockaddr_in6 *)&ss)->sin6_port
                            : ((struct sockaddr_in *)&ss)->sin_port);
    r->listen_fd = fd;
    return CINFER_OK;
}

cinfer_status cinfer_rendezvous_create(const cinfer_rendezvous_params *p,
                                       cinfer_rendezvous **out)
{
    if (!out || !p)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous_create: p and out must not be "
                                "NULL");
    *out = NULL;
    if (p->n_nodes < 2 || p->n_nodes > CINFER_COMM_MAX_RANKS)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous: n_nodes %d is outside 2..%d",
                                p->n_nodes, CINFER_COMM_MAX_RANKS);
    if (p->node_rank < 0 || p->node_rank >= p->n_nodes)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous: node rank %d is outside 0..%d "
                                "(n_nodes %d)",
                                p->node_rank, p->n_nodes - 1, p->n_nodes);
    if (p->world_size < p->n_nodes || p->world_size % p->n_nodes != 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous: world size %d is not a positive "
                                "multiple of n_nodes %d",
                                p->world_size, p->n_nodes);
    if (p->timeout_ms < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous: timeout_ms %d is negative",
                                p->timeout_ms);
    cinfer_rendezvous *r = calloc(1, sizeof *r);
    if (!r)
        return cinfer_set_error(CINFER_E_NOMEM, "rendezvous: no memory");
    r->listen_fd = -1;
    if (!p->addr || strlen(p->addr) >= sizeof r->addr ||
        parse_addr(p->addr, r->host, sizeof r->host, &r->port) != 0 ||
        (p->node_rank != 0 && r->port == 0)) {
        cinfer_status st = cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "rendezvous: address \"%s\" is not HOST:PORT (or [IPv6]:PORT, "
            "port 1..65535; 0 only on node 0)",
            p->addr ? p->addr : "(null)");
        free(r);
        return st;
    }
    snprintf(r->addr, sizeof r->addr, "%s", p->addr);
    r->n_nodes = p->n_nodes;
    r->node_rank = p->node_rank;
    r->world_size = p->world_size;
    r->timeout_ms = p->timeout_ms ? p->timeout_ms : DEFAULT_TIMEOUT_MS;
    r->keep_open = p->keep_open;
    if (r->keep_open) {
        r->kept = malloc((size_t)r->n_nodes * sizeof *r->kept);
        if (!r->kept) {
            free(r);
            return cinfer_set_error(CINFER_E_NOMEM, "rendezvous: no memory");
        }
        for (int k = 0; k < r->n_nodes; k++)
            r->kept[k] = -1;
    }
    if (r->node_rank == 0) {
        cinfer_status st = listen_on(r);
        if (st != CINFER_OK) {
            free(r->kept);
            free(r);
            return st;
        }
    }
    *out = r;
    return CINFER_OK;
}

int cinfer_rendezvous_port(const cinfer_rendezvous *r)
{
    return r && r->node_rank == 0 ? r->port : 0;
}

void cinfer_rendezvous_destroy(cinfer_rendezvous *r)
{
    if (!r)
        return;
    if (r->listen_fd >= 0)
        close(r->listen_fd);
    for (int k = 0; r->kept && k < r->n_nodes; k++)
        if (r->kept[k] >= 0)
            close(r->kept[k]);
    free(r->kept);
    free(r);
}

/* ---------------------------------------------------------------------- */
/* node 0                                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    int fd;
    size_t got;
    uint8_t hello[HELLO_BYTES];
} pending;

typedef struct {
    cinfer_rendezvous *r;
    size_t id_bytes;
    pending pend[MAX_PENDING];
    int n_pend;
    int *peer_fd; /* [n_nodes]: checked-in peers, -1 = not yet */
    int n_peers;
} server;

static void drop_pending(server *s, int i)
{
    close(s->pend[i].fd);
    s->pend[i] = s->pend[--s->n_pend];
}

/* Tells every checked-in peer the rendezvous failed, and closes all. */
static void fail_peers(server *s, const char *msg, long long deadline)
{
    long long soon = now_ms() + 1000;
    if (soon > deadline + 1000)
        soon = deadline + 1000;
    for (int k = 0; k < s->r->n_nodes; k++)
        if (s->peer_fd[k] >= 0) {
            send_reply(s->peer_fd[k], CODE_FAILED, msg, strlen(msg), soon);
            close(s->peer_fd[k]);
            s->peer_fd[k] = -1;
        }
    while (s->n_pend > 0)
        drop_pending(s, 0);
}

/* Why node 0 refuses a peer's hello ("" if it does not). */
static void refusal(const server *s, const uint8_t *h, char *why, size_t n)
{
    const cinfer_rendezvous *r = s->r;
    uint32_t ver = get_u32(h + 8), nn = get_u32(h + 12),
             rank = get_u32(h + 16), world = get_u32(h + 20),
             idb = get_u32(h + 24);
    why[0] = '\0';
    if (ver != VERSION)
        snprintf(why, n, "protocol version %u, node 0 speaks %d", ver,
                 VERSION);
    else if (nn != (uint32_t)r->n_nodes || world != (uint32_t)r->world_size)
        snprintf(why, n,
                 "node %u has n_nodes %u and world size %u, node 0 has "
                 "n_nodes %d and world size %d",
                 rank, nn, world, r->n_nodes, r->world_size);
    else if (idb != s->id_bytes)
        snprintf(why, n, "node %u expects a %u-byte id, node 0 sends %zu",
                 rank, idb, s->id_bytes);
    else if (rank == 0 || rank >= (uint32_t)r->n_nodes)
        snprintf(why, n,
                 "node rank %u is not one of 1..%d (n_nodes %d; 0 is the "
                 "listener at %s)",
                 rank, r->n_nodes - 1, r->n_nodes, r->addr);
    else if (s->peer_fd[rank] >= 0)
        snprintf(why, n, "node rank %u has checked in already", rank);
}

/* A complete hello: the peer is checked in, or refused (then the whole
 * rendezvous fails). */
static cinfer_status on_hello(server *s, int i, long long deadline)
{
    pending *p = &s->pend[i];
    if (memcmp(p->hello, MAGIC, 8) != 0) {
        drop_pending(s, i); /* not a cinfer peer */
        return CINFER_OK;
    }
    char why[MAX_MSG_BYTES - 64];
    refusal(s, p->hello, why, sizeof why);
    if (why[0] == '\0') {
        s->peer_fd[get_u32(p->hello + 16)] = p->fd;
        s->n_peers++;
        s->pend[i] = s->pend[--s->n_pend];
        return CINFER_OK;
    }
    char msg[1024];
    snprintf(msg, sizeof msg, "refused by node 0 at %s: %s", s->r->addr, why);
    send_reply(p->fd, CODE_REFUSED, msg, strlen(msg), deadline);
    drop_pending(s, i);
    fail_peers(s, msg, deadline);
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "rendezvous: node 0 at %s refused a peer: %s",
                            s->r->addr, why);
}

static void accept_new(server *s)
{
    for (;;) {
        int fd = accept(s->r->listen_fd, NULL, NULL);
        if (fd < 0)
            return; /* EAGAIN, or a connection that went away */
        if (s->n_pend == MAX_PENDING || set_nonblocking(fd) != 0) {
            close(fd);
            continue;
        }
        s->pend[s->n_pend].fd = fd;
        s->pend[s->n_pend].got = 0;
        s->n_pend++;
    }
}

static cinfer_status timeout_error(server *s, long long deadline)
{
    char who[192];
    size_t at = 0;
    int missing = 0;
    for (int k = 1; k < s->r->n_nodes; k++) {
        if (s->peer_fd[k] >= 0)
            continue;
        if (at < sizeof who) {
            int w = snprintf(who + at, sizeof who - at, "%s%d",
                             missing ? ", " : "", k);
            at += w > 0 ? (size_t)w : 0;
        }
        missing++;
    }
    if (at >= sizeof who)
        snprintf(who + sizeof who - 5, 5, "...");
    char msg[1024];
    snprintf(msg, sizeof msg,
             "rendezvous at %s (port %d): node%s %s of %d did not check in "
             "within %d ms",
             s->r->addr, s->r->port, missing == 1 ? "" : "s", who,
             s->r->n_nodes, s->r->timeout_ms);
    fail_peers(s, msg, deadline);
    return cinfer_set_error(CINFER_E_TIMEOUT, "%s", msg);
}

static cinfer_status serve(cinfer_rendezvous *r, const void *id,
                           size_t id_bytes, long long deadline)
{
    server s;
    memset(&s, 0, sizeof s);
    s.r = r;
    s.id_bytes = id_bytes;
    s.peer_fd = malloc((size_t)r->n_nodes * sizeof *s.peer_fd);
    if (!s.peer_fd)
        return cinfer_set_error(CINFER_E_NOMEM, "rendezvous: no memory");
    for (int k = 0; k < r->n_nodes; k++)
        s.peer_fd[k] = -1;
    cinfer_status st = CINFER_OK;
    while (s.n_peers < r->n_nodes - 1) {
        int ms = left_ms(deadline);
        if (ms == 0) {
            st = timeout_error(&s, deadline);
            goto out;
        }
        struct pollfd pf[1 + MAX_PENDING];
        pf[0].fd = r->listen_fd;
        pf[0].events = POLLIN;
        for (int i = 0; i < s.n_pend; i++) {
            pf[1 + i].fd = s.pend[i].fd;
            pf[1 + i].events = POLLIN;
        }
        int n_pf = 1 + s.n_pend;
        if (poll(pf, (nfds_t)n_pf, ms) <= 0)
            continue;
        /* Connections first, from the last (drop_pending moves the last
         * into the hole), then new ones. */
        for (int i = n_pf - 2; i >= 0; i--) {
            if (!(pf[1 + i].revents & (POLLIN | POLLHUP | POLLERR)))
                continue;
            pending *p = &s.pend[i];
            ssize_t k = recv(p->fd, p->hello + p->got, HELLO_BYTES - p->got, 0);
            if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR)) {
                drop_pending(&s, i);
                continue;
            }
            if (k > 0)
                p->got += (size_t)k;
            if (p->got == HELLO_BYTES) {
                st = on_hello(&s, i, deadline);
                if (st != CINFER_OK)
                    goto out;
            }
        }
        if (pf[0].revents & POLLIN)
            accept_new(&s);
    }
    for (int k = 1; k < r->n_nodes; k++)
        if (send_reply(s.peer_fd[k], CODE_OK, id, id_bytes, deadline) != 0) {
            char msg[1024];
            snprintf(msg, sizeof msg,
                     "rendezvous at %s: sending the id to node %d failed: %s",
                     r->addr, k, strerror(errno));
            fail_peers(&s, msg, deadline);
            st = cinfer_set_error(errno == ETIMEDOUT ? CINFER_E_TIMEOUT
                                                     : CINFER_E_IO,
                                  "%s", msg);
            goto out;
        }
out:
    for (int k = 0; k < r->n_nodes; k++) {
        if (s.peer_fd[k] < 0)
            continue;
        if (st == CINFER_OK && r->keep_open)
            r->kept[k] = s.peer_fd[k]; /* the channel to node k */
        else
            close(s.peer_fd[k]);
    }
    while (s.n_pend > 0)
        drop_pending(&s, 0);
    free(s.peer_fd);
    return st;
}

/* ---------------------------------------------------------------------- */
/* the other nodes                                                         */
/* ---------------------------------------------------------------------- */

/* One non-blocking connect attempt to any of host:port's addresses:
 * the socket, or -1 with the last error in *err. */
static int try_connect(const cinfer_rendezvous *r, long long deadline,
                       int *err)
{
    char port[8];
    snprintf(port, sizeof port, "%d", r->port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_socktype = SOCK_STREAM;
    int gai = getaddrinfo(r->host, port, &hints, &res);
    if (gai != 0) {
        *err = -gai; /* negative: a resolver error */
        return -1;
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) {
            *err = errno;
            continue;
        }
        if (set_nonblocking(fd) == 0 &&
            (connect(fd, a->ai_addr, a->ai_addrlen) == 0 ||
             errno == EINPROGRESS)) {
            struct pollfd pf = {fd, POLLOUT, 0};
            int ms = left_ms(deadline);
            int e = ETIMEDOUT;
            socklen_t el = sizeof e;
            if (ms > 0 && poll(&pf, 1, ms) == 1 &&
                getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &el) == 0 && e == 0)
                break; /* connected */
            if (ms > 0) /* else no try: keep the last real error */
                *err = e;
        } else {
            *err = errno;
        }
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

static const char *err_text(int err)
{
    return err < 0 ? gai_strerror(-err) : strerror(err);
}

static cinfer_status join(cinfer_rendezvous *r, void *id, size_t id_bytes,
                          long long deadline)
{
    int err = ETIMEDOUT, fd = -1;
    while ((fd = try_connect(r, deadline, &err)) < 0) {
        int ms = left_ms(deadline);
        if (ms == 0)
            return cinfer_set_error(CINFER_E_TIMEOUT,
                                    "rendezvous: node %d could not reach node "
                                    "0 at %s within %d ms (last error: %s)",
                                    r->node_rank, r->addr, r->timeout_ms,
                                    err_text(err));
        poll(NULL, 0, ms < RETRY_MS ? ms : RETRY_MS);
    }
    uint8_t hello[HELLO_BYTES], head[REPLY_HEAD_BYTES];
    memcpy(hello, MAGIC, 8);
    put_u32(hello + 8, VERSION);
    put_u32(hello + 12, (uint32_t)r->n_nodes);
    put_u32(hello + 16, (uint32_t)r->node_rank);
    put_u32(hello + 20, (uint32_t)r->world_size);
    put_u32(hello + 24, (uint32_t)id_bytes);
    cinfer_status st = CINFER_OK;
    char msg[MAX_MSG_BYTES + 1];
    if (write_all(fd, hello, sizeof hello, deadline) != 0 ||
        read_all(fd, head, sizeof head, deadline) != 0) {
        int e = errno;
        st = e == ETIMEDOUT
                 ? cinfer_set_error(CINFER_E_TIMEOUT,
                                    "rendezvous: node %d reached node 0 at %s "
                                    "but got no id within %d ms (other nodes "
                                    "missing?)",
                                    r->node_rank, r->addr, r->timeout_ms)
                 : cinfer_set_error(CINFER_E_IO,
                                    "rendezvous: node %d: node 0 at %s closed "
                                    "the connection%s%s",
                                    r->node_rank, r->addr, e ? ": " : "",
                                    e ? strerror(e) : "");
        goto out;
    }
    uint32_t code = get_u32(head + 8), len = get_u32(head + 12);
    if (memcmp(head, MAGIC, 8) != 0 || code > CODE_FAILED ||
        len > (code == CODE_OK ? MAX_ID_BYTES : MAX_MSG_BYTES) ||
        (code == CODE_OK && len != id_bytes)) {
        st = cinfer_set_error(CINFER_E_IO,
                              "rendezvous: node %d: %s did not answer as a "
                              "cinfer node 0 (code %u, %u bytes)",
                              r->node_rank, r->addr, code, len);
        goto out;
    }
    void *dst = code == CODE_OK ? id : (void *)msg;
    if (read_all(fd, dst, len, deadline) != 0) {
        st = cinfer_set_error(errno == ETIMEDOUT ? CINFER_E_TIMEOUT
                                                 : CINFER_E_IO,
                              "rendezvous: node %d: the reply from %s was cut "
                              "short",
                              r->node_rank, r->addr);
        goto out;
    }
    if (code != CODE_OK) {
        msg[len] = '\0';
        st = code == CODE_REFUSED
                 ? cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "rendezvous: node %d %s", r->node_rank,
                                    msg)
                 : cinfer_set_error(CINFER_E_UNAVAILABLE,
                                    "rendezvous: node %d: node 0 gave up: %s",
                                    r->node_rank, msg);
    }
out:
    if (st == CINFER_OK && r->keep_open)
        r->kept[0] = fd; /* the channel to node 0 */
    else
        close(fd);
    return st;
}

cinfer_status cinfer_rendezvous_run(cinfer_rendezvous *r, void *id,
                                    size_t id_bytes)
{
    if (!r || !id || id_bytes < 1 || id_bytes > MAX_ID_BYTES)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous_run: id must be 1..%d bytes",
                                MAX_ID_BYTES);
    if (r->done)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous_run: this handle has run already");
    r->done = 1;
    long long deadline = now_ms() + r->timeout_ms;
    if (r->node_rank == 0)
        return serve(r, id, id_bytes, deadline);
    return join(r, id, id_bytes, deadline);
}

/* ---------------------------------------------------------------------- */
/* the kept channel                                                        */
/* ---------------------------------------------------------------------- */

static int channel(const cinfer_rendezvous *r, int peer)
{
    if (!r || !r->kept || peer < 0 || peer >= r->n_nodes)
        return -1;
    return r->kept[peer];
}

static cinfer_status channel_error(const cinfer_rendezvous *r, int peer,
                                   const char *what, int timeout_ms)
{
    int e = errno;
    if (e == ETIMEDOUT)
        return cinfer_set_error(CINFER_E_TIMEOUT,
                                "rendezvous channel: node %d: %s node %d did "
                                "not finish within %d ms",
                                r->node_rank, what, peer, timeout_ms);
    return cinfer_set_error(CINFER_E_IO,
                            "rendezvous channel: node %d: %s node %d: %s",
                            r->node_rank, what, peer,
                            e ? strerror(e) : "the peer closed the connection");
}

cinfer_status cinfer_rendezvous_send(cinfer_rendezvous *r, int peer,
                                     const void *buf, size_t n,
                                     int timeout_ms)
{
    int fd = channel(r, peer);
    if (fd < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous_send: no open channel to node %d",
                                peer);
    long long deadline = timeout_ms < 0 ? NO_DEADLINE : now_ms() + timeout_ms;
    if (write_all(fd, buf, n, deadline) != 0)
        return channel_error(r, peer, "sending to", timeout_ms);
    return CINFER_OK;
}

cinfer_status cinfer_rendezvous_recv(cinfer_rendezvous *r, int peer,
                                     void *buf, size_t n, int timeout_ms)
{
    int fd = channel(r, peer);
    if (fd < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "rendezvous_recv: no open channel to node %d",
                                peer);
    long long deadline = timeout_ms < 0 ? NO_DEADLINE : now_ms() + timeout_ms;
    if (read_all(fd, buf, n, deadline) != 0)
        return channel_error(r, peer, "receiving from", timeout_ms);
    return CINFER_OK;
}
