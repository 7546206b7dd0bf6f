/*
 * conn_limit.c - connection caps and the descriptor reserve (see
 * conn_limit.h): gRPC core's socket mutator, the table of counted
 * connections by descriptor, the peers' counts, and the sweep that learns
 * which connections ended.
 *
 * Locks: l->mu guards the tables and counts; the refusal counters and
 * "starved" are atomics, read by scrapes without it. Nothing here blocks
 * for long under l->mu: a sweep is one fstat per counted connection (a
 * few milliseconds at 20,000) and runs at most every SWEEP_MIN_MS when a
 * cap is reached, every SWEEP_TICK_MS otherwise.
 */
#define _GNU_SOURCE /* accept4 */
#include "server/conn_limit.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grpc/support/sync.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "server/log.h"

/* A sweep when a cap is reached: at most this often. */
#define SWEEP_MIN_MS 50
/* A sweep from the watchdog's tick: this often. */
#define SWEEP_TICK_MS 1000
/* "Starved" re-checked from the tick this often. */
#define STARVED_CHECK_MS 100
/* Descriptors tracked (the table grows up to this). */
#define MAX_TRACKED_FD (1 << 20)
/* Connections accepted and closed per drain of a listening socket. */
#define MAX_DRAIN 65536
/* Listening sockets remembered. */
#define MAX_LISTENERS 8
/* Refusals logged: lines per second and burst. */
#define REFUSAL_LOG_PER_S 2
#define REFUSAL_LOG_BURST 10

/* ---------------------------------------------------------------------- */
/* gRPC core's socket mutator                                             */
/* ---------------------------------------------------------------------- */

/* Mirrors gRPC 1.51's src/core/lib/iomgr/socket_mutator.h (gRPC core
 * 29.0.0), which is not installed: grpc_fd_usage, grpc_mutate_socket_info,
 * grpc_socket_mutator_vtable and struct grpc_socket_mutator (whose tag
 * grpc_types.h declares). The core (tcp_server_posix.cc: on_read, and
 * grpc_tcp_server_prepare_socket for the listener) calls mutate_fd_2 with
 * each accepted descriptor, before the handshake. The core's refcount
 * functions are C++ symbols; gpr_ref and gpr_unref on the same field are
 * what they do. cinfer_conn_limit_grpc_arg checks the runtime's version
 * before handing this to the core. */
#define MIRRORED_CORE_VERSION "29."
typedef enum {
    CORE_FD_CLIENT_CONNECTION_USAGE,
    CORE_FD_SERVER_LISTENER_USAGE,
    CORE_FD_SERVER_CONNECTION_USAGE,
} core_fd_usage;

typedef struct {
    int fd;
    core_fd_usage usage;
} core_mutate_socket_info;

typedef struct {
    bool (*mutate_fd)(int fd, grpc_socket_mutator *m);
    int (*compare)(grpc_socket_mutator *a, grpc_socket_mutator *b);
    void (*destroy)(grpc_socket_mutator *m);
    bool (*mutate_fd_2)(const core_mutate_socket_info *info,
                        grpc_socket_mutator *m);
} core_socket_mutator_vtable;

struct grpc_socket_mutator {
    const core_socket_mutator_vtable *vtable;
    gpr_refcount refcount;
};

/* ---------------------------------------------------------------------- */
/* State                                                                  */
/* ---------------------------------------------------------------------- */

/* A peer: its address family (4, 6, or 1 for anything else, all one
 * peer) and address. */
typedef struct {
    uint8_t fam;
    uint8_t a[16];
} peer_key;

typedef struct {
    peer_key key;
    int32_t n;  /* connections open; 0 = free slot */
} peer_slot;

/* A counted gRPC connection, by descriptor: ino 0 = none. */
typedef struct {
    uint64_t ino;
    peer_key key;
} conn_slot;

typedef struct {
    int fd;
    uint64_t ino;
} listener;

struct cinfer_conn_limit {
    grpc_socket_mutator base; /* first: the core's pointer is ours */
    cinfer_conn_limit_params p;
    int fd_limit;             /* RLIMIT_NOFILE's soft limit at create */
    int threshold;            /* fd_limit - fd_reserve: a descriptor at or
                                 above it is refused */
    int spare_fd;             /* kept free for a drain out of descriptors */
    uint64_t seed;
    pthread_mutex_t mu;
    conn_slot *conns;         /* [n_conn_slots] (mu) */
    int n_conn_slots;
    int max_fd;               /* highest counted descriptor + 1 (mu) */
    peer_slot *peers;         /* open addressing, [peer_cap] (mu) */
    size_t peer_cap, peer_used;
    int open[CINFER_FRONTEND_COUNT_]; /* (mu) */
    int64_t last_sweep_ns;    /* (mu) */
    int64_t last_tick_sweep_ns;
    int64_t last_starved_check_ns;
    listener listeners[MAX_LISTENERS]; /* (mu) */
    int n_listeners;
    atomic_int starved;
    atomic_ullong refused[CINFER_FRONTEND_COUNT_][CINFER_CONN_VERDICT_COUNT_];
    cinfer_log_limit log_limit; /* (mu) */
    int active;               /* handed to gRPC core */
};

static const char *const verdict_names[CINFER_CONN_VERDICT_COUNT_] = {
    "admitted", "max_connections", "max_connections_per_peer", "fd_reserve"};

const char *cinfer_conn_verdict_name(cinfer_conn_verdict v)
{
    return v >= 0 && v < CINFER_CONN_VERDICT_COUNT_ ? verdict_names[v]
                                                    : "unknown";
}

static int64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}

/* ---------------------------------------------------------------------- */
/* Peers                                                                  */
/* ---------------------------------------------------------------------- */

static void key_of(const struct sockaddr *sa, socklen_t len, peer_key *k)
{
    memset(k, 0, sizeof *k);
    k->fam = 1;
    if (!sa)
        return;
    if (sa->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *s4 = (const struct sockaddr_in *)sa;
        k->fam = 4;
        memcpy(k->a, &s4->sin_addr, 4);
    } else if (sa->sa_family == AF_INET6 &&
               len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        const struct sockaddr_in6 *s6 = (const struct sockaddr_in6 *)sa;
        if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
            k->fam = 4;
            memcpy(k->a, s6->sin6_addr.s6_addr + 12, 4);
        } else {
            k->fam = 6;
            memcpy(k->a, &s6->sin6_addr, 16);
        }
    }
}

static void key_str(const peer_key *k, char *out, size_t n)
{
    if (k->fam == 4)
        inet_ntop(AF_INET, k->a, out, (socklen_t)n);
    else if (k->fam == 6)
        inet_ntop(AF_INET6, k->a, out, (socklen_t)n);
    else
        snprintf(out, n, "local");
}

static size_t key_hash(const cinfer_conn_limit *l, const peer_key *k)
{
    uint64_t h = 1469598103934665603ull ^ l->seed;
    const uint8_t *b = (const uint8_t *)k;
    for (size_t i = 0; i < sizeof *k; i++) {
        h ^= b[i];
        h *= 1099511628211ull;
    }
    return (size_t)(h ^ (h >> 29));
}

/* The slot of k, or of where it would go. mu held. */
static size_t peer_find(const cinfer_conn_limit *l, const peer_key *k)
{
    size_t mask = l->peer_cap - 1;
    size_t i = key_hash(l, k) & mask;
    while (l->peers[i].n && memcmp(&l->peers[i].key, k, sizeof *k) != 0)
        i = (i + 1) & mask;
    return i;
}

static int peer_count(const cinfer_conn_limit *l, const peer_key *k)
{
    return l->peers[peer_find(l, k)].n;
}

static int peers_grow(cinfer_conn_limit *l)
{
    size_t cap = l->peer_cap * 2;
    peer_slot *np = calloc(cap, sizeof *np);
    if (!np)
        return 0;
    peer_slot *old = l->peers;
    size_t oc = l->peer_cap;
    l->peers = np;
    l->peer_cap = cap;
    for (size_t i = 0; i < oc; i++)
        if (old[i].n)
            l->peers[peer_find(l, &old[i].key)] = old[i];
    free(old);
    return 1;
}

/* Adds one connection of k; 0 when out of memory. mu held. */
static int peer_add(cinfer_conn_limit *l, const peer_key *k)
{
    size_t i = peer_find(l, k);
    if (!l->peers[i].n) {
        if ((l->peer_used + 1) * 4 > l->peer_cap * 3) {
            if (!peers_grow(l))
                return 0;
            i = peer_find(l, k);
        }
        l->peers[i].key = *k;
        l->peer_used++;
    }
    l->peers[i].n++;
    return 1;
}

/* Removes one connection of k; a peer with none left leaves the table
 * (linear probing's backward-shift delete). mu held. */
static void peer_remove(cinfer_conn_limit *l, const peer_key *k)
{
    size_t mask = l->peer_cap - 1;
    size_t i = peer_find(l, k);
    if (!l->peers[i].n)
        return;
    if (--l->peers[i].n > 0)
        return;
    l->peer_used--;
    size_t j = i;
    for (;;) {
        j = (j + 1) & mask;
        if (!l->peers[j].n)
            break;
        size_t home = key_hash(l, &l->peers[j].key) & mask;
        /* j's entry may move to i unless its home lies in (i, j]. */
        int in_range = i <= j ? (home > i && home <= j)
                              : (home > i || home <= j);
        if (in_range)
            continue;
        l->peers[i] = l->peers[j];
        i = j;
    }
    memset(&l->peers[i], 0, sizeof l->peers[i]);
}

/* ---------------------------------------------------------------------- */
/* Counted gRPC connections                                               */
/* ---------------------------------------------------------------------- */

/* Ends the connection counted on fd, if any. mu held. */
static void conn_release(cinfer_conn_limit *l, int fd)
{
    if (fd < 0 || fd >= l->n_conn_slots || !l->conns[fd].ino)
        return;
    peer_remove(l, &l->conns[fd].key);
    l->conns[fd].ino = 0;
    l->open[CINFER_FRONTEND_GRPC]--;
}

static int conns_cover(cinfer_conn_limit *l, int fd)
{
    if (fd < l->n_conn_slots)
        return 1;
    int n = l->n_conn_slots ? l->n_conn_slots : 1024;
    while (n <= fd)
        n *= 2;
    if (n > MAX_TRACKED_FD)
        n = MAX_TRACKED_FD;
    if (fd >= n)
        return 0;
    conn_slot *nc = realloc(l->conns, (size_t)n * sizeof *nc);
    if (!nc)
        return 0;
    memset(nc + l->n_conn_slots, 0,
           (size_t)(n - l->n_conn_slots) * sizeof *nc);
    l->conns = nc;
    l->n_conn_slots = n;
    return 1;
}

/* Ends every counted connection whose descriptor now holds another file
 * or none. mu held. */
static void sweep(cinfer_conn_limit *l, int64_t now)
{
    l->last_sweep_ns = now;
    int top = 0;
    for (int fd = 0; fd < l->max_fd; fd++) {
        if (!l->conns[fd].ino)
            continue;
        struct stat st;
        if (fstat(fd, &st) != 0 || (uint64_t)st.st_ino != l->conns[fd].ino)
            conn_release(l, fd);
        else
            top = fd + 1;
    }
    l->max_fd = top;
}

static void sweep_if_due(cinfer_conn_limit *l, int64_t now)
{
    if (now - l->last_sweep_ns >= (int64_t)SWEEP_MIN_MS * 1000000)
        sweep(l, now);
}

static int total_open(const cinfer_conn_limit *l)
{
    int n = 0;
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        n += l->open[f];
    return n;
}

/* The caps' verdict on one more connection from k (the descriptor
 * reserve is the caller's). mu held. */
static cinfer_conn_verdict caps_verdict(cinfer_conn_limit *l,
                                        const peer_key *k, int64_t now)
{
    if (l->p.max_connections > 0 && total_open(l) >= l->p.max_connections) {
        sweep_if_due(l, now);
        if (total_open(l) >= l->p.max_connections)
            return CINFER_CONN_REFUSED_TOTAL;
    }
    if (l->p.max_per_peer > 0 && peer_count(l, k) >= l->p.max_per_peer) {
        sweep_if_due(l, now);
        if (peer_count(l, k) >= l->p.max_per_peer)
            return CINFER_CONN_REFUSED_PEER;
    }
    return CINFER_CONN_ADMIT;
}

static void log_refusal(cinfer_conn_limit *l, cinfer_frontend fe,
                        cinfer_conn_verdict v, const peer_key *k,
                        int64_t now)
{
    uint64_t suppressed = 0;
    pthread_mutex_lock(&l->mu);
    int pass = cinfer_log_limit_take(&l->log_limit, now, &suppressed);
    int open = total_open(l);
    pthread_mutex_unlock(&l->mu);
    if (!pass)
        return;
    char peer[64];
    key_str(k, peer, sizeof peer);
    cinfer_log_line ln;
    if (cinfer_log_begin(&ln, CINFER_LOG_WARN, "connection refused", NULL)) {
        cinfer_log_str(&ln, "frontend", cinfer_frontend_name(fe));
        cinfer_log_str(&ln, "reason", cinfer_conn_verdict_name(v));
        cinfer_log_str(&ln, "peer", peer);
        cinfer_log_int(&ln, "open", open);
        if (suppressed)
            cinfer_log_int(&ln, "suppressed", (int64_t)suppressed);
        cinfer_log_end(&ln);
    }
}

/* 1 when a descriptor below the reserve is free: the kernel's lowest
 * free one (what the next accept gets) is below the threshold. mu held
 * (the spare descriptor). */
static int descriptor_free_below_reserve(const cinfer_conn_limit *l)
{
    if (l->p.fd_reserve <= 0)
        return 1;
    int k = fcntl(l->spare_fd >= 0 ? l->spare_fd : 2, F_DUPFD_CLOEXEC, 0);
    if (k < 0)
        return 0;
    close(k);
    return k < l->threshold;
}

static void set_starved(cinfer_conn_limit *l, int starved)
{
    if (atomic_exchange(&l->starved, starved) == starved)
        return;
    cinfer_log_line ln;
    if (cinfer_log_begin(&ln, starved ? CINFER_LOG_ERROR : CINFER_LOG_INFO,
                         starved ? "descriptors within the reserve: new "
                                   "connections refused, health NOT_SERVING"
                                 : "descriptors free again: connections "
                                   "accepted",
                         NULL)) {
        cinfer_log_int(&ln, "rlimit_nofile", l->fd_limit);
        cinfer_log_int(&ln, "fd_reserve", l->p.fd_reserve);
        cinfer_log_end(&ln);
    }
}

/* Out of descriptors (within the reserve): every connection waiting in
 * the listening sockets' queues is accepted and closed at once, so that
 * gRPC core's next accept finds the queue empty instead of taking one
 * more descriptor (a burst would otherwise take them all, and the core's
 * listener stops for good at EMFILE). If even the drain's accept finds
 * none, the spare descriptor is given up for it and taken back. */
static void drain_listeners(cinfer_conn_limit *l)
{
    listener ls[MAX_LISTENERS];
    pthread_mutex_lock(&l->mu);
    int n = l->n_listeners;
    memcpy(ls, l->listeners, sizeof ls);
    pthread_mutex_unlock(&l->mu);
    uint64_t drained = 0;
    for (int i = 0; i < n; i++) {
        struct stat st;
        int fl = fcntl(ls[i].fd, F_GETFL);
        if (fstat(ls[i].fd, &st) != 0 || (uint64_t)st.st_ino != ls[i].ino ||
            fl < 0 || !(fl & O_NONBLOCK))
            continue; /* not that socket any more, or it would block */
        for (int k = 0; k < MAX_DRAIN; k++) {
            int c = accept4(ls[i].fd, NULL, NULL, SOCK_NONBLOCK | SOCK_CLOEXEC);
            if (c >= 0) {
                close(c);
                drained++;
                continue;
            }
            if (errno == EINTR || errno == ECONNABORTED)
                continue;
            if (errno == EMFILE || errno == ENFILE) {
                pthread_mutex_lock(&l->mu);
                c = -1;
                if (l->spare_fd >= 0) {
                    close(l->spare_fd);
                    c = accept4(ls[i].fd, NULL, NULL,
                                SOCK_NONBLOCK | SOCK_CLOEXEC);
                    if (c >= 0)
                        close(c);
                    l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
                }
                pthread_mutex_unlock(&l->mu);
                if (c >= 0) {
                    drained++;
                    continue;
                }
            }
            break;
        }
    }
    if (drained)
        atomic_fetch_add(&l->refused[CINFER_FRONTEND_GRPC]
                                    [CINFER_CONN_REFUSED_FDS],
                         drained);
}

/* The core accepted fd: count it or refuse it. */
static void on_connection(cinfer_conn_limit *l, int fd)
{
    struct sockaddr_storage ss;
    socklen_t sl = sizeof ss;
    memset(&ss, 0, sizeof ss);
    if (getpeername(fd, (struct sockaddr *)&ss, &sl) != 0)
        sl = 0;
    peer_key k;
    key_of(sl ? (struct sockaddr *)&ss : NULL, sl, &k);
    struct stat st;
    uint64_t ino = fstat(fd, &st) == 0 ? (uint64_t)st.st_ino : 0;
    int64_t now = now_ns();

    cinfer_conn_verdict v = CINFER_CONN_ADMIT;
    pthread_mutex_lock(&l->mu);
    /* The number was handed out again: its last connection ended. */
    conn_release(l, fd);
    if (l->p.fd_reserve > 0 && fd >= l->threshold)
        v = CINFER_CONN_REFUSED_FDS;
    else if (!ino || !conns_cover(l, fd))
        v = CINFER_CONN_REFUSED_FDS; /* beyond what can be tracked */
    else
        v = caps_verdict(l, &k, now);
    if (v == CINFER_CONN_ADMIT && !peer_add(l, &k))
        v = CINFER_CONN_REFUSED_TOTAL; /* out of memory */
    if (v == CINFER_CONN_ADMIT) {
        l->conns[fd].ino = ino;
        l->conns[fd].key = k;
        l->open[CINFER_FRONTEND_GRPC]++;
        if (fd >= l->max_fd)
            l->max_fd = fd + 1;
    }
    pthread_mutex_unlock(&l->mu);

    if (v != CINFER_CONN_REFUSED_FDS && l->p.fd_reserve > 0 && fd < l->threshold)
        set_starved(l, 0);
    if (v == CINFER_CONN_ADMIT)
        return;
    atomic_fetch_add(&l->refused[CINFER_FRONTEND_GRPC][v], 1);
    /* Closed before any handshake: the core's first read sees the end and
     * lets the descriptor go. */
    shutdown(fd, SHUT_RDWR);
    if (v == CINFER_CONN_REFUSED_FDS) {
        set_starved(l, 1);
        drain_listeners(l);
    }
    log_refusal(l, CINFER_FRONTEND_GRPC, v, &k, now);
}

static void on_listener(cinfer_conn_limit *l, int fd)
{
    struct stat st;
    if (fstat(fd, &st) != 0)
        return;
    pthread_mutex_lock(&l->mu);
    int i = 0;
    while (i < l->n_listeners && l->listeners[i].fd != fd)
        i++;
    if (i < MAX_LISTENERS) {
        l->listeners[i].fd = fd;
        l->listeners[i].ino = (uint64_t)st.st_ino;
        if (i == l->n_listeners)
            l->n_listeners++;
    }
    pthread_mutex_unlock(&l->mu);
}

static bool mutate_fd_2(const core_mutate_socket_info *info,
                        grpc_socket_mutator *m)
{
    cinfer_conn_limit *l = (cinfer_conn_limit *)m;
    if (info->usage == CORE_FD_SERVER_CONNECTION_USAGE)
        on_connection(l, info->fd);
    else if (info->usage == CORE_FD_SERVER_LISTENER_USAGE)
        on_listener(l, info->fd);
    /* Always true: the core's on_read treats false as an error and stops
     * listening. */
    return true;
}

static bool mutate_fd(int fd, grpc_socket_mutator *m)
{
    (void)fd;
    (void)m;
    return true;
}

static int mutator_compare(grpc_socket_mutator *a, grpc_socket_mutator *b)
{
    return a < b ? -1 : a > b;
}

static void limit_free(cinfer_conn_limit *l)
{
    if (l->spare_fd >= 0)
        close(l->spare_fd);
    pthread_mutex_destroy(&l->mu);
    free(l->conns);
    free(l->peers);
    free(l);
}

static void mutator_destroy(grpc_socket_mutator *m)
{
    limit_free((cinfer_conn_limit *)m);
}

static const core_socket_mutator_vtable mutator_vtable = {
    mutate_fd, mutator_compare, mutator_destroy, mutate_fd_2};

/* The channel argument's pointer vtable: what grpc_socket_mutator_to_arg
 * gives the core (copy = ref, destroy = unref). */
static void *arg_copy(void *p)
{
    gpr_ref(&((grpc_socket_mutator *)p)->refcount);
    return p;
}

static void arg_destroy(void *p)
{
    grpc_socket_mutator *m = p;
    if (gpr_unref(&m->refcount))
        m->vtable->destroy(m);
}

static int arg_cmp(void *a, void *b)
{
    return mutator_compare(a, b);
}

static const grpc_arg_pointer_vtable arg_vtable = {arg_copy, arg_destroy,
                                                   arg_cmp};

/* ---------------------------------------------------------------------- */
/* Public                                                                 */
/* ---------------------------------------------------------------------- */

cinfer_status cinfer_conn_limit_create(const cinfer_conn_limit_params *p,
                                       cinfer_conn_limit **out)
{
    *out = NULL;
    if (p->max_connections < 0 || p->max_per_peer < 0 || p->fd_reserve < 0)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "connection caps and the descriptor reserve "
                                "must be >= 0");
    struct rlimit rl;
    int fd_limit = 0;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY)
        fd_limit = rl.rlim_cur > (rlim_t)INT32_MAX ? INT32_MAX
                                                   : (int)rl.rlim_cur;
    cinfer_conn_limit *l = calloc(1, sizeof *l);
    if (!l)
        return cinfer_set_error(CINFER_E_NOMEM, "connection limits: no memory");
    l->p = *p;
    /* A small RLIMIT_NOFILE: at most a quarter of it is reserved. */
    if (fd_limit > 0 && p->fd_reserve > fd_limit / 4) {
        l->p.fd_reserve = fd_limit / 4;
        cinfer_log_line ln;
        if (cinfer_log_begin(&ln, CINFER_LOG_INFO,
                             "descriptor reserve lowered to a quarter of "
                             "RLIMIT_NOFILE",
                             NULL)) {
            cinfer_log_int(&ln, "fd_reserve", l->p.fd_reserve);
            cinfer_log_int(&ln, "rlimit_nofile", fd_limit);
            cinfer_log_end(&ln);
        }
    }
    l->fd_limit = fd_limit;
    l->threshold = fd_limit > 0 ? fd_limit - l->p.fd_reserve : INT32_MAX;
    if (fd_limit <= 0)
        l->p.fd_reserve = 0;
    l->peer_cap = 1024;
    l->peers = calloc(l->peer_cap, sizeof *l->peers);
    if (!l->peers) {
        free(l);
        return cinfer_set_error(CINFER_E_NOMEM, "connection limits: no memory");
    }
    if (getrandom(&l->seed, sizeof l->seed, GRND_NONBLOCK) !=
        (ssize_t)sizeof l->seed)
        l->seed = (uint64_t)now_ns() * 0x9E3779B97F4A7C15ull;
    l->spare_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
    pthread_mutex_init(&l->mu, NULL);
    cinfer_log_limit_init(&l->log_limit, REFUSAL_LOG_PER_S, REFUSAL_LOG_BURST);
    l->base.vtable = &mutator_vtable;
    gpr_ref_init(&l->base.refcount, 1);
    *out = l;
    return CINFER_OK;
}

void cinfer_conn_limit_release(cinfer_conn_limit *l)
{
    if (l)
        arg_destroy(&l->base);
}

int cinfer_conn_limit_grpc_arg(cinfer_conn_limit *l, grpc_arg *arg)
{
    const char *v = grpc_version_string();
    if (strncmp(v, MIRRORED_CORE_VERSION, strlen(MIRRORED_CORE_VERSION)) !=
        0) {
        cinfer_log_line ln;
        if (cinfer_log_begin(&ln, CINFER_LOG_WARN,
                             "connection caps off on the gRPC port: they "
                             "need gRPC core 29.x (gRPC 1.51)",
                             NULL)) {
            cinfer_log_str(&ln, "grpc_core", v);
            cinfer_log_end(&ln);
        }
        return 0;
    }
    l->active = 1;
    memset(arg, 0, sizeof *arg);
    arg->type = GRPC_ARG_POINTER;
    arg->key = (char *)GRPC_ARG_SOCKET_MUTATOR;
    arg->value.pointer.p = &l->base;
    arg->value.pointer.vtable = &arg_vtable;
    return 1;
}

cinfer_conn_verdict cinfer_conn_limit_check_addr(cinfer_conn_limit *l,
                                                 const struct sockaddr *addr,
                                                 socklen_t len)
{
    peer_key k;
    key_of(addr, len, &k);
    int64_t now = now_ns();
    pthread_mutex_lock(&l->mu);
    cinfer_conn_verdict v = descriptor_free_below_reserve(l)
                                ? caps_verdict(l, &k, now)
                                : CINFER_CONN_REFUSED_FDS;
    pthread_mutex_unlock(&l->mu);
    if (v != CINFER_CONN_ADMIT) {
        atomic_fetch_add(&l->refused[CINFER_FRONTEND_OPENAI][v], 1);
        log_refusal(l, CINFER_FRONTEND_OPENAI, v, &k, now);
    }
    return v;
}

void cinfer_conn_limit_open_addr(cinfer_conn_limit *l,
                                 const struct sockaddr *addr, socklen_t len)
{
    peer_key k;
    key_of(addr, len, &k);
    pthread_mutex_lock(&l->mu);
    if (peer_add(l, &k))
        l->open[CINFER_FRONTEND_OPENAI]++;
    pthread_mutex_unlock(&l->mu);
}

void cinfer_conn_limit_close_addr(cinfer_conn_limit *l,
                                  const struct sockaddr *addr, socklen_t len)
{
    peer_key k;
    key_of(addr, len, &k);
    pthread_mutex_lock(&l->mu);
    if (peer_count(l, &k) > 0) {
        peer_remove(l, &k);
        l->open[CINFER_FRONTEND_OPENAI]--;
    }
    pthread_mutex_unlock(&l->mu);
}

void cinfer_conn_limit_tick(cinfer_conn_limit *l, int64_t now)
{
    if (now - l->last_tick_sweep_ns >= (int64_t)SWEEP_TICK_MS * 1000000) {
        l->last_tick_sweep_ns = now;
        pthread_mutex_lock(&l->mu);
        sweep(l, now);
        pthread_mutex_unlock(&l->mu);
    }
    if (atomic_load(&l->starved) &&
        now - l->last_starved_check_ns >=
            (int64_t)STARVED_CHECK_MS * 1000000) {
        l->last_starved_check_ns = now;
        pthread_mutex_lock(&l->mu);
        int free_below = descriptor_free_below_reserve(l);
        pthread_mutex_unlock(&l->mu);
        if (free_below)
            set_starved(l, 0);
    }
}

int cinfer_conn_limit_starved(const cinfer_conn_limit *l)
{
    return l && atomic_load(&((cinfer_conn_limit *)l)->starved);
}

void cinfer_conn_limit_get_stats(cinfer_conn_limit *l,
                                 cinfer_conn_limit_stats *out)
{
    memset(out, 0, sizeof *out);
    pthread_mutex_lock(&l->mu);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        out->open[f] = l->open[f];
    pthread_mutex_unlock(&l->mu);
    for (int f = 0; f < CINFER_FRONTEND_COUNT_; f++)
        for (int v = 0; v < CINFER_CONN_VERDICT_COUNT_; v++)
            out->refused[f][v] = atomic_load(&l->refused[f][v]);
    out->starved = atomic_load(&l->starved);
    out->active = l->active;
}
