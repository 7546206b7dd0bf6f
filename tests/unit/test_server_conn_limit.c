/*
 * test_server_conn_limit.c - connection caps and the descriptor reserve
 * (server/conn_limit.c), through the calls the HTTP front end makes:
 * per-peer and total caps, IPv4-mapped IPv6 as IPv4, thousands of peers
 * opened and closed in a shuffled order (the peer table's growth and
 * deletes), the reserve against a lowered RLIMIT_NOFILE, and the gRPC
 * channel argument's references.
 */
#include "harness.h"

#ifndef CINFER_HAVE_SERVER
int main(void)
{
    return harness_skip("built without gRPC / protobuf-c");
}
#else

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "server/conn_limit.h"

static struct sockaddr_in v4(uint32_t host_order)
{
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(host_order);
    a.sin_port = htons(40000);
    return a;
}

#define SA(a) ((const struct sockaddr *)&(a)), (socklen_t)sizeof(a)

static cinfer_conn_limit *make(int total, int per_peer, int reserve)
{
    cinfer_conn_limit_params p = {total, per_peer, reserve};
    cinfer_conn_limit *l = NULL;
    CHECK_OK(cinfer_conn_limit_create(&p, &l));
    return l;
}

static void test_caps(void)
{
    cinfer_conn_limit *l = make(5, 3, 0);
    struct sockaddr_in a = v4(0x7f000001), b = v4(0x7f000002),
                       c = v4(0x7f000003);
    for (int i = 0; i < 3; i++) {
        CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)),
                     CINFER_CONN_ADMIT);
        cinfer_conn_limit_open_addr(l, SA(a));
    }
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)),
                 CINFER_CONN_REFUSED_PEER);
    cinfer_conn_limit_open_addr(l, SA(b));
    cinfer_conn_limit_open_addr(l, SA(b));
    /* Five open: the total refuses every address. */
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(c)),
                 CINFER_CONN_REFUSED_TOTAL);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(b)),
                 CINFER_CONN_REFUSED_TOTAL);
    cinfer_conn_limit_close_addr(l, SA(a));
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(c)), CINFER_CONN_ADMIT);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)), CINFER_CONN_ADMIT);
    /* A close of a peer with nothing open changes nothing. */
    cinfer_conn_limit_close_addr(l, SA(c));
    cinfer_conn_limit_stats st;
    cinfer_conn_limit_get_stats(l, &st);
    CHECK_EQ_INT(st.open[CINFER_FRONTEND_OPENAI], 4);
    CHECK_EQ_INT(st.open[CINFER_FRONTEND_GRPC], 0);
    CHECK_EQ_INT(st.refused[CINFER_FRONTEND_OPENAI][CINFER_CONN_REFUSED_PEER],
                 1);
    CHECK_EQ_INT(
        st.refused[CINFER_FRONTEND_OPENAI][CINFER_CONN_REFUSED_TOTAL], 2);
    CHECK_EQ_INT(st.starved, 0);
    CHECK_EQ_STR(cinfer_conn_verdict_name(CINFER_CONN_REFUSED_PEER),
                 "max_connections_per_peer");
    cinfer_conn_limit_release(l);
}

/* ::ffff:10.0.0.1 is 10.0.0.1; another IPv6 address is its own peer. */
static void test_v4_mapped(void)
{
    cinfer_conn_limit *l = make(0, 1, 0);
    struct sockaddr_in6 m;
    memset(&m, 0, sizeof m);
    m.sin6_family = AF_INET6;
    inet_pton(AF_INET6, "::ffff:10.0.0.1", &m.sin6_addr);
    cinfer_conn_limit_open_addr(l, SA(m));
    struct sockaddr_in a = v4(0x0a000001);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)),
                 CINFER_CONN_REFUSED_PEER);
    struct sockaddr_in6 o = m;
    inet_pton(AF_INET6, "2001:db8::1", &o.sin6_addr);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(o)), CINFER_CONN_ADMIT);
    cinfer_conn_limit_close_addr(l, SA(a));
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(m)), CINFER_CONN_ADMIT);
    cinfer_conn_limit_release(l);
}

/* 5000 peers at their cap of one, closed in a shuffled order: after each
 * close that peer is admitted again and the others still at their cap. */
static void test_many_peers(void)
{
    enum { N = 5000 };
    cinfer_conn_limit *l = make(0, 1, 0);
    uint32_t *addr = malloc(N * sizeof *addr);
    int *open = malloc(N * sizeof *open);
    for (int i = 0; i < N; i++) {
        addr[i] = 0x0a000000u + (uint32_t)i * 7919u;
        struct sockaddr_in a = v4(addr[i]);
        cinfer_conn_limit_open_addr(l, SA(a));
        open[i] = 1;
    }
    uint64_t r = 88172645463325252ull;
    int order[N];
    for (int i = 0; i < N; i++)
        order[i] = i;
    for (int i = N - 1; i > 0; i--) {
        r ^= r << 13;
        r ^= r >> 7;
        r ^= r << 17;
        int j = (int)(r % (uint64_t)(i + 1));
        int t = order[i];
        order[i] = order[j];
        order[j] = t;
    }
    int bad = 0;
    for (int k = 0; k < N; k++) {
        int i = order[k];
        struct sockaddr_in a = v4(addr[i]);
        cinfer_conn_limit_close_addr(l, SA(a));
        open[i] = 0;
        if (cinfer_conn_limit_check_addr(l, SA(a)) != CINFER_CONN_ADMIT)
            bad++;
        int probe = order[(k * 31 + 17) % N];
        struct sockaddr_in p = v4(addr[probe]);
        cinfer_conn_verdict want =
            open[probe] ? CINFER_CONN_REFUSED_PEER : CINFER_CONN_ADMIT;
        if (cinfer_conn_limit_check_addr(l, SA(p)) != want)
            bad++;
    }
    CHECK_EQ_INT(bad, 0);
    cinfer_conn_limit_stats st;
    cinfer_conn_limit_get_stats(l, &st);
    CHECK_EQ_INT(st.open[CINFER_FRONTEND_OPENAI], 0);
    free(addr);
    free(open);
    cinfer_conn_limit_release(l);
}

/* RLIMIT_NOFILE lowered: with the descriptors filled up to the reserve a
 * connection is refused (fd_reserve); once they close it is admitted. */
static void test_reserve(void)
{
    struct rlimit saved;
    CHECK(getrlimit(RLIMIT_NOFILE, &saved) == 0);
    int lowest = fcntl(0, F_DUPFD_CLOEXEC, 0);
    CHECK(lowest >= 0);
    close(lowest);
    struct rlimit rl = saved;
    rl.rlim_cur = (rlim_t)lowest + 64;
    if (rl.rlim_cur > saved.rlim_max) {
        harness_tests_passed++; /* cannot lower: nothing to check */
        return;
    }
    CHECK(setrlimit(RLIMIT_NOFILE, &rl) == 0);
    /* 64 + lowest descriptors, a quarter at most reserved. */
    cinfer_conn_limit *l = make(0, 0, 1000);
    struct sockaddr_in a = v4(0x7f000001);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)), CINFER_CONN_ADMIT);
    int fds[128], n = 0;
    while (n < 128) {
        int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
        if (fd < 0)
            break;
        fds[n++] = fd;
        if (cinfer_conn_limit_check_addr(l, SA(a)) != CINFER_CONN_ADMIT)
            break;
    }
    CHECK(n > 0 && n < 128);
    /* Refused while a descriptor is left for the listeners. */
    CHECK(fds[n - 1] < (int)rl.rlim_cur - 1);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)),
                 CINFER_CONN_REFUSED_FDS);
    for (int i = 0; i < n; i++)
        close(fds[i]);
    CHECK_EQ_INT(cinfer_conn_limit_check_addr(l, SA(a)), CINFER_CONN_ADMIT);
    cinfer_conn_limit_release(l);
    CHECK(setrlimit(RLIMIT_NOFILE, &saved) == 0);
}

/* The channel argument: gRPC core copies and destroys it; the limiter
 * lives until the last holder lets go (ASan sees a leak or a double
 * free otherwise). */
static void test_grpc_arg(void)
{
    cinfer_conn_limit *l = make(10, 5, 0);
    grpc_arg a;
    memset(&a, 0, sizeof a);
    if (!cinfer_conn_limit_grpc_arg(l, &a)) {
        cinfer_conn_limit_release(l); /* another gRPC core: caps off */
        return;
    }
    CHECK_EQ_INT(a.type, GRPC_ARG_POINTER);
    CHECK_EQ_STR(a.key, GRPC_ARG_SOCKET_MUTATOR);
    void *copy = a.value.pointer.vtable->copy(a.value.pointer.p);
    CHECK(copy == a.value.pointer.p);
    CHECK_EQ_INT(a.value.pointer.vtable->cmp(copy, a.value.pointer.p), 0);
    cinfer_conn_limit_release(l); /* the core's copy keeps it */
    a.value.pointer.vtable->destroy(copy);
}

int main(void)
{
    RUN(test_caps);
    RUN(test_v4_mapped);
    RUN(test_many_peers);
    RUN(test_reserve);
    RUN(test_grpc_arg);
    return harness_done();
}
#endif
