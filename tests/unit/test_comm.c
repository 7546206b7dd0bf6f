/*
 * test_comm.c - the tensor-parallel communicator (kernels/comm.h).
 *
 *   - LOCAL all-reduce and all-gather at N = 1..4 over awkward sizes,
 *     bit-identical to a sequential sum in rank order across runs with
 *     random thread delays; a rank that never comes (CINFER_E_TIMEOUT
 *     naming it), disagreeing ranks, an abort; the same through
 *     cinfer_backend_all_reduce_sum / all_gather on N CPU backends.
 *   - The rendezvous on loopback, no GPU: processes (fork) exchange an id;
 *     a node that never comes, a node 0 that is not there, a wrong world
 *     size or n_nodes and a node rank taken twice are refused or time out
 *     with clear errors on both sides. Where the CUDA backend is linked
 *     (CINFER_TEST_CUDA: the real libnccl; CINFER_TEST_CUDASIM: the
 *     harness), the id is ncclGetUniqueId's.
 *   - Under the CUDA harness (CINFER_TEST_CUDASIM, CUDASIM_DEVICES=2): two
 *     CUDA backends with NCCL communicators from ncclCommInitAll, and from
 *     the two-node path (rendezvous + ncclCommInitRank), all-reduce and
 *     all-gather equal to the sums.
 */
#include <errno.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "harness.h"
#include "kernels/backend.h"
#include "kernels/comm.h"

#if (defined(CINFER_TEST_CUDA) || defined(CINFER_TEST_CUDASIM)) &&             \
    __has_include(<nccl.h>)
#include <nccl.h>
#define HAVE_NCCL_ID 1
#endif

static long long now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Up to max_us of random delay, to shuffle which rank comes first. */
static void jitter(uint64_t *rng, int max_us)
{
    struct timespec ts = {0, (long)(harness_rand(rng) % (uint64_t)max_us) * 1000};
    nanosleep(&ts, NULL);
}

/* ---------------------------------------------------------------------- */
/* LOCAL                                                                   */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_comm *comm;
    int op;          /* 0 all-reduce, 1 all-gather, 2 gather in place */
    float *buf;      /* reduce: in place; gather: send */
    float *recv;
    size_t n;
    int runs;
    uint64_t seed;
    const float *(*fill)(int rank, int run); /* unused */
    cinfer_status st;
    char err[512];
} rank_job;

static const size_t g_sizes[] = {0, 1, 7, 769, 5125};

static float input(int rank, size_t i, int run)
{
    uint64_t s = 0x9e3779b97f4a7c15ull ^ ((uint64_t)rank << 40) ^
                 ((uint64_t)run << 20) ^ i;
    harness_rand(&s);
    /* Mixed magnitudes, so a different order of additions would show. */
    return harness_randf(&s) * (float)(1 << (harness_rand(&s) % 20));
}

static void *rank_main(void *p)
{
    rank_job *j = p;
    int rank = cinfer_comm_rank(j->comm), size = cinfer_comm_size(j->comm);
    uint64_t rng = j->seed;
    j->st = CINFER_OK;
    for (int run = 0; run < j->runs && j->st == CINFER_OK; run++) {
        float *send = j->op == 2 ? j->recv + (size_t)rank * j->n : j->buf;
        for (size_t i = 0; i < j->n; i++)
            send[i] = input(rank, i, run);
        jitter(&rng, 300);
        if (j->op == 0)
            j->st = cinfer_comm_all_reduce_sum(j->comm, j->buf, j->n);
        else
            j->st = cinfer_comm_all_gather(j->comm, send, j->n, j->recv);
        if (j->st != CINFER_OK) {
            snprintf(j->err, sizeof j->err, "%s", cinfer_last_error());
            break;
        }
        /* Check each run against the reference, on the rank's thread. */
        if (j->op == 0) {
            for (size_t i = 0; i < j->n; i++) {
                float want = input(0, i, run);
                for (int k = 1; k < size; k++)
                    want += input(k, i, run);
                if (memcmp(&want, &j->buf[i], sizeof want) != 0) {
                    j->st = CINFER_E_INTERNAL;
                    snprintf(j->err, sizeof j->err,
                             "run %d rank %d elem %zu: %.9g, sequential %.9g",
                             run, rank, i, (double)j->buf[i], (double)want);
                    break;
                }
            }
        } else {
            for (int k = 0; k < size && j->st == CINFER_OK; k++)
                for (size_t i = 0; i < j->n; i++)
                    if (j->recv[(size_t)k * j->n + i] != input(k, i, run)) {
                        j->st = CINFER_E_INTERNAL;
                        snprintf(j->err, sizeof j->err,
                                 "run %d rank %d: recv[%d][%zu] wrong", run,
                                 rank, k, i);
                        break;
                    }
        }
    }
    return NULL;
}

/* Runs op on n ranks, `runs` times, every size; every rank checks. */
static void run_local(int op, int runs)
{
    for (int n_ranks = 1; n_ranks <= 4; n_ranks++) {
        for (size_t si = 0; si < sizeof g_sizes / sizeof g_sizes[0]; si++) {
            size_t n = g_sizes[si];
            cinfer_comm *comms[4];
            cinfer_comm_local_params cp = cinfer_comm_local_default_params();
            cp.n_ranks = n_ranks;
            cp.timeout_ms = 30000;
            CHECK_OK(cinfer_comm_create_local(&cp, comms));
            rank_job jobs[4];
            pthread_t th[4];
            memset(jobs, 0, sizeof jobs);
            for (int r = 0; r < n_ranks; r++) {
                jobs[r].comm = comms[r];
                jobs[r].op = op;
                jobs[r].n = n;
                jobs[r].runs = runs;
                jobs[r].seed = 0x1234567ull + (uint64_t)r * 77 + n;
                jobs[r].buf = malloc((n + 1) * sizeof(float));
                jobs[r].recv = malloc((n * (size_t)n_ranks + 1) * sizeof(float));
                CHECK_EQ_INT(cinfer_comm_rank(comms[r]), r);
                CHECK_EQ_INT(cinfer_comm_size(comms[r]), n_ranks);
                CHECK_EQ_INT(cinfer_comm_get_kind(comms[r]), CINFER_COMM_LOCAL);
                pthread_create(&th[r], NULL, rank_main, &jobs[r]);
            }
            for (int r = 0; r < n_ranks; r++) {
                pthread_join(th[r], NULL);
                if (jobs[r].st != CINFER_OK)
                    fprintf(stderr, "op %d N=%d n=%zu rank %d: %s\n", op,
                            n_ranks, n, r, jobs[r].err);
                CHECK_EQ_INT(jobs[r].st, CINFER_OK);
                free(jobs[r].buf);
                free(jobs[r].recv);
            }
            for (int r = 0; r < n_ranks; r++)
                cinfer_comm_destroy(comms[r]);
        }
    }
}

static void test_local_all_reduce_deterministic(void)
{
    run_local(0, 12);
}

static void test_local_all_gather(void)
{
    run_local(1, 6);
    run_local(2, 3); /* send at recv + rank * n */
}

typedef struct {
    cinfer_comm *comm;
    size_t n;
    int abort_instead;
    cinfer_status st;
    long long ms;
    char err[512];
} one_call;

static void *one_call_main(void *p)
{
    one_call *o = p;
    float buf[8] = {0};
    long long t0 = now_ms();
    if (o->abort_instead) {
        struct timespec ts = {0, 50 * 1000000L};
        nanosleep(&ts, NULL); /* let the others wait first */
        cinfer_comm_abort(o->comm, "rank 1 failed its matmul");
        o->st = CINFER_OK;
    } else {
        o->st = cinfer_comm_all_reduce_sum(o->comm, buf, o->n);
    }
    o->ms = now_ms() - t0;
    snprintf(o->err, sizeof o->err, "%s", cinfer_last_error());
    return NULL;
}

/* Rank 2 of 3 never calls: 0 and 1 fail within about the timeout, naming
 * it; rank 2 calling late fails at once; so does every later call. */
static void test_local_timeout_names_missing_rank(void)
{
    cinfer_comm *comms[3];
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = 3;
    cp.timeout_ms = 200;
    CHECK_OK(cinfer_comm_create_local(&cp, comms));
    one_call o[2];
    pthread_t th[2];
    memset(o, 0, sizeof o);
    for (int r = 0; r < 2; r++) {
        o[r].comm = comms[r];
        o[r].n = 8;
        pthread_create(&th[r], NULL, one_call_main, &o[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        CHECK_EQ_INT(o[r].st, CINFER_E_TIMEOUT);
        CHECK(strstr(o[r].err, "rank 2 of 3 did not arrive within 200 ms"));
        CHECK(o[r].ms >= 150 && o[r].ms < 2000);
    }
    float buf[8] = {0};
    long long t0 = now_ms();
    CHECK_EQ_INT(cinfer_comm_all_reduce_sum(comms[2], buf, 8), CINFER_E_TIMEOUT);
    CHECK(strstr(cinfer_last_error(), "rank 2 of 3"));
    CHECK_EQ_INT(cinfer_comm_all_reduce_sum(comms[0], buf, 8), CINFER_E_TIMEOUT);
    CHECK(now_ms() - t0 < 100);
    for (int r = 0; r < 3; r++)
        cinfer_comm_destroy(comms[r]);
}

/* Two missing of four: both named. */
static void test_local_timeout_two_missing(void)
{
    cinfer_comm *comms[4];
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = 4;
    cp.timeout_ms = 150;
    CHECK_OK(cinfer_comm_create_local(&cp, comms));
    one_call o[2];
    pthread_t th[2];
    memset(o, 0, sizeof o);
    int ranks[2] = {0, 2};
    for (int i = 0; i < 2; i++) {
        o[i].comm = comms[ranks[i]];
        o[i].n = 3;
        pthread_create(&th[i], NULL, one_call_main, &o[i]);
    }
    for (int i = 0; i < 2; i++) {
        pthread_join(th[i], NULL);
        CHECK_EQ_INT(o[i].st, CINFER_E_TIMEOUT);
        CHECK(strstr(o[i].err, "ranks 1, 3 of 4"));
    }
    for (int r = 0; r < 4; r++)
        cinfer_comm_destroy(comms[r]);
}

/* Ranks that disagree on the count all fail, quickly, naming both. */
static void test_local_mismatch(void)
{
    cinfer_comm *comms[2];
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = 2;
    cp.timeout_ms = 5000;
    CHECK_OK(cinfer_comm_create_local(&cp, comms));
    one_call o[2];
    pthread_t th[2];
    memset(o, 0, sizeof o);
    for (int r = 0; r < 2; r++) {
        o[r].comm = comms[r];
        o[r].n = r ? 6 : 5;
        pthread_create(&th[r], NULL, one_call_main, &o[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        CHECK_EQ_INT(o[r].st, CINFER_E_INVALID_ARG);
        CHECK(strstr(o[r].err, "rank 1 calls all_reduce_sum of 6 floats "
                               "while rank 0 calls all_reduce_sum of 5"));
        CHECK(o[r].ms < 2000);
    }
    /* A disagreement breaks nothing: the next collective works. */
    for (int r = 0; r < 2; r++) {
        o[r].n = 4;
        pthread_create(&th[r], NULL, one_call_main, &o[r]);
    }
    for (int r = 0; r < 2; r++) {
        pthread_join(th[r], NULL);
        CHECK_EQ_INT(o[r].st, CINFER_OK);
    }
    for (int r = 0; r < 2; r++)
        cinfer_comm_destroy(comms[r]);
    /* Bad arguments: send overlapping recv off its own place. */
    cinfer_comm *one = NULL;
    cp.n_ranks = 1;
    CHECK_OK(cinfer_comm_create_local(&cp, &one));
    float buf[8];
    CHECK_EQ_INT(cinfer_comm_all_gather(one, buf, 4, buf + 1), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "send overlaps recv"));
    CHECK_OK(cinfer_comm_all_gather(one, buf, 4, buf)); /* in place */
    cinfer_comm_destroy(one);
}

/* A rank that aborts ends the others' wait long before the timeout. */
static void test_local_abort(void)
{
    cinfer_comm *comms[2];
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = 2;
    cp.timeout_ms = 20000;
    CHECK_OK(cinfer_comm_create_local(&cp, comms));
    one_call o[2];
    pthread_t th[2];
    memset(o, 0, sizeof o);
    for (int r = 0; r < 2; r++) {
        o[r].comm = comms[r];
        o[r].n = 8;
        o[r].abort_instead = r == 1;
        pthread_create(&th[r], NULL, one_call_main, &o[r]);
    }
    for (int r = 0; r < 2; r++)
        pthread_join(th[r], NULL);
    CHECK_EQ_INT(o[0].st, CINFER_E_CANCELLED);
    CHECK(strstr(o[0].err, "rank 1 of 2 aborted the communicator: rank 1 "
                           "failed its matmul"));
    CHECK(o[0].ms < 5000);
    for (int r = 0; r < 2; r++)
        cinfer_comm_destroy(comms[r]);
}

static void test_local_params(void)
{
    cinfer_comm *comms[2] = {NULL, NULL};
    cinfer_comm_local_params cp = cinfer_comm_local_default_params();
    cp.n_ranks = CINFER_COMM_MAX_RANKS + 1;
    CHECK_EQ_INT(cinfer_comm_create_local(&cp, comms), CINFER_E_INVALID_ARG);
    CHECK(comms[0] == NULL);
    cp.n_ranks = -1;
    CHECK_EQ_INT(cinfer_comm_create_local(&cp, comms), CINFER_E_INVALID_ARG);
    cp.n_ranks = 1;
    cp.timeout_ms = -5;
    CHECK_EQ_INT(cinfer_comm_create_local(&cp, comms), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_comm_size(NULL), 1);
    CHECK_EQ_INT(cinfer_comm_rank(NULL), 0);
    cinfer_comm_destroy(NULL);
    /* A LOCAL communicator has no device memory path. */
    cinfer_backend_cuda_params gp = cinfer_backend_cuda_default_params();
    CHECK(gp.comm == NULL);
}

/* ---------------------------------------------------------------------- */
/* through the backend op                                                  */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_backend *be;
    int rank, size;
    int64_t rows, cols;
    float *reduced;  /* [rows * cols] */
    float *gathered; /* [size * rows * cols] */
    cinfer_status st;
    char err[512];
} be_job;

static float be_input(int rank, int64_t i)
{
    return input(rank + 11, (size_t)i, 3);
}

static cinfer_status be_run(be_job *j)
{
    int64_t shape[2] = {j->rows, j->cols}, gshape[2] = {j->size * j->rows, j->cols};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, shape);
    cinfer_tensor_desc gd = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, gshape);
    cinfer_tensor *t = NULL, *g = NULL;
    size_t n = (size_t)(j->rows * j->cols);
    float *host = malloc(n * sizeof(float));
    cinfer_status st = host ? CINFER_OK : CINFER_E_NOMEM;
    for (size_t i = 0; host && i < n; i++)
        host[i] = be_input(j->rank, (int64_t)i);
    if (st == CINFER_OK)
        st = cinfer_backend_tensor_create(j->be, &d, &t);
    if (st == CINFER_OK)
        st = cinfer_backend_tensor_create(j->be, &gd, &g);
    if (st == CINFER_OK)
        st = cinfer_backend_upload(j->be, t, 0, host, n * sizeof(float));
    if (st == CINFER_OK)
        st = cinfer_backend_all_gather(j->be, t, g);
    if (st == CINFER_OK)
        st = cinfer_backend_all_reduce_sum(j->be, t);
    if (st == CINFER_OK)
        st = cinfer_backend_synchronize(j->be);
    if (st == CINFER_OK)
        st = cinfer_backend_download(j->be, t, 0, j->reduced, n * sizeof(float));
    if (st == CINFER_OK)
        st = cinfer_backend_download(j->be, g, 0, j->gathered,
                                     n * (size_t)j->size * sizeof(float));
    cinfer_backend_tensor_destroy(j->be, g);
    cinfer_backend_tensor_destroy(j->be, t);
    free(host);
    return st;
}

static void *be_main(void *p)
{
    be_job *j = p;
    j->st = be_run(j);
    if (j->st != CINFER_OK)
        snprintf(j->err, sizeof j->err, "%s", cinfer_last_error());
    return NULL;
}

/* The reduced and gathered tensors of every rank against the sequential
 * sum and the concatenation. exact: bit-identical (the CPU's order). */
static void check_be_jobs(be_job *jobs, int size, int exact)
{
    int64_t n = jobs[0].rows * jobs[0].cols;
    for (int r = 0; r < size; r++) {
        if (jobs[r].st != CINFER_OK)
            fprintf(stderr, "rank %d: %s\n", r, jobs[r].err);
        CHECK_EQ_INT(jobs[r].st, CINFER_OK);
        if (jobs[r].st != CINFER_OK)
            continue;
        int bad = 0;
        for (int64_t i = 0; i < n && !bad; i++) {
            float want = be_input(0, i);
            for (int k = 1; k < size; k++)
                want += be_input(k, i);
            float got = jobs[r].reduced[i];
            if (exact ? memcmp(&got, &want, 4) != 0
                      : !(fabsf(got - want) <= 1e-5f * (1 + fabsf(want)))) {
                fprintf(stderr, "rank %d elem %lld: %.9g vs %.9g\n", r,
                        (long long)i, (double)got, (double)want);
                bad = 1;
            }
            for (int k = 0; k < size && !bad; k++)
                if (jobs[r].gathered[(int64_t)k * n + i] != be_input(k, i))
                    bad = 1;
        }
        CHECK(!bad);
    }
}

static void run_cpu_backends(int size, int64_t rows, int64_t cols, int use_comm)
{
    cinfer_comm *comms[4] = {NULL};
    if (use_comm) {
        cinfer_comm_local_params cp = cinfer_comm_local_default_params();
        cp.n_ranks = size;
        cp.timeout_ms = 30000;
        CHECK_OK(cinfer_comm_create_local(&cp, comms));
    }
    be_job jobs[4];
    pthread_t th[4];
    memset(jobs, 0, sizeof jobs);
    for (int r = 0; r < size; r++) {
        cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
        bp.n_threads = 1;
        bp.comm = comms[r];
        CHECK_OK(cinfer_backend_cpu_create(&bp, &jobs[r].be));
        CHECK(cinfer_backend_comm(jobs[r].be) == comms[r]);
        jobs[r].rank = r;
        jobs[r].size = size;
        jobs[r].rows = rows;
        jobs[r].cols = cols;
        jobs[r].reduced = malloc((size_t)(rows * cols) * sizeof(float));
        jobs[r].gathered = malloc((size_t)(size * rows * cols) * sizeof(float));
    }
    for (int r = 0; r < size; r++)
        pthread_create(&th[r], NULL, be_main, &jobs[r]);
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    check_be_jobs(jobs, size, 1);
    for (int r = 0; r < size; r++) {
        cinfer_backend_destroy(jobs[r].be);
        free(jobs[r].reduced);
        free(jobs[r].gathered);
        cinfer_comm_destroy(comms[r]);
    }
}

static void test_backend_collectives_cpu(void)
{
    run_cpu_backends(1, 3, 769, 0); /* no communicator: no-op, copy */
    for (int size = 1; size <= 4; size++)
        run_cpu_backends(size, 3, 769, 1);
    run_cpu_backends(3, 7, 5125, 1);
}

static void test_backend_collective_checks(void)
{
    cinfer_backend *be = NULL;
    cinfer_backend_cpu_params bp = cinfer_backend_cpu_default_params();
    bp.n_threads = 1;
    CHECK_OK(cinfer_backend_cpu_create(&bp, &be));
    int64_t s2[2] = {2, 5}, s3[2] = {3, 5};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, s2);
    cinfer_tensor_desc d3 = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, s3);
    cinfer_tensor_desc h = cinfer_tensor_desc_make(CINFER_DTYPE_F16, 2, s2);
    cinfer_tensor *t = NULL, *t3 = NULL, *th = NULL;
    CHECK_OK(cinfer_backend_tensor_create(be, &d, &t));
    CHECK_OK(cinfer_backend_tensor_create(be, &d3, &t3));
    CHECK_OK(cinfer_backend_tensor_create(be, &h, &th));
    CHECK_EQ_INT(cinfer_backend_all_reduce_sum(be, NULL), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_all_reduce_sum(be, th), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "must be F32"));
    CHECK_OK(cinfer_backend_all_reduce_sum(be, t)); /* one rank: no-op */
    CHECK_EQ_INT(cinfer_backend_all_gather(be, t, t3), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_all_gather(be, t, t), CINFER_E_INVALID_ARG);
    cinfer_backend_tensor_destroy(be, th);
    cinfer_backend_tensor_destroy(be, t3);
    cinfer_backend_tensor_destroy(be, t);
    cinfer_backend_destroy(be);
}

/* ---------------------------------------------------------------------- */
/* the rendezvous                                                          */
/* ---------------------------------------------------------------------- */

/* Node 0 on 127.0.0.1, any free port. */
static cinfer_rendezvous *node0(int n_nodes, int world, int timeout_ms,
                                char *addr, size_t addr_size)
{
    cinfer_rendezvous_params p = cinfer_rendezvous_default_params();
    p.addr = "127.0.0.1:0";
    p.n_nodes = n_nodes;
    p.node_rank = 0;
    p.world_size = world;
    p.timeout_ms = timeout_ms;
    cinfer_rendezvous *r = NULL;
    CHECK_OK(cinfer_rendezvous_create(&p, &r));
    if (r) {
        CHECK(cinfer_rendezvous_port(r) > 0);
        snprintf(addr, addr_size, "127.0.0.1:%d", cinfer_rendezvous_port(r));
    }
    return r;
}

/* The child's side: joins as node_rank and writes its status, message and
 * the id it got to fd; exits. */
static void child_join(int fd, const char *addr, int n_nodes, int node_rank,
                       int world, int timeout_ms)
{
    cinfer_rendezvous_params p = cinfer_rendezvous_default_params();
    p.addr = addr;
    p.n_nodes = n_nodes;
    p.node_rank = node_rank;
    p.world_size = world;
    p.timeout_ms = timeout_ms;
    cinfer_rendezvous *r = NULL;
    unsigned char id[128];
    memset(id, 0, sizeof id);
    int st = cinfer_rendezvous_create(&p, &r);
    if (st == CINFER_OK)
        st = cinfer_rendezvous_run(r, id, sizeof id);
    cinfer_rendezvous_destroy(r);
    char msg[512];
    memset(msg, 0, sizeof msg);
    snprintf(msg, sizeof msg, "%s", st ? cinfer_last_error() : "");
    ssize_t w = write(fd, &st, sizeof st);
    w += write(fd, id, sizeof id);
    w += write(fd, msg, sizeof msg);
    _exit(w == (ssize_t)(sizeof st + sizeof id + sizeof msg) ? 0 : 3);
}

typedef struct {
    pid_t pid;
    int fd;
    int st;
    unsigned char id[128];
    char msg[512];
} child;

static void spawn(child *c, const char *addr, int n_nodes, int node_rank,
                  int world, int timeout_ms)
{
    int fds[2];
    CHECK(pipe(fds) == 0);
    fflush(stderr);
    c->pid = fork();
    if (c->pid == 0) {
        close(fds[0]);
        child_join(fds[1], addr, n_nodes, node_rank, world, timeout_ms);
    }
    close(fds[1]);
    c->fd = fds[0];
}

static void reap(child *c)
{
    size_t got = 0, want = sizeof c->st + sizeof c->id + sizeof c->msg;
    char buf[sizeof c->st + sizeof c->id + sizeof c->msg];
    while (got < want) {
        ssize_t k = read(c->fd, buf + got, want - got);
        if (k <= 0)
            break;
        got += (size_t)k;
    }
    close(c->fd);
    int ws = 0;
    waitpid(c->pid, &ws, 0);
    CHECK(WIFEXITED(ws) && WEXITSTATUS(ws) == 0);
    CHECK_EQ_INT(got, want);
    memcpy(&c->st, buf, sizeof c->st);
    memcpy(c->id, buf + sizeof c->st, sizeof c->id);
    memcpy(c->msg, buf + sizeof c->st + sizeof c->id, sizeof c->msg);
    c->msg[sizeof c->msg - 1] = '\0';
}

/* A 128-byte id: NCCL's where the CUDA backend is linked. */
static void make_id(unsigned char *id)
{
#ifdef HAVE_NCCL_ID
    ncclUniqueId u;
    CHECK_EQ_INT(ncclGetUniqueId(&u), ncclSuccess);
    CHECK_EQ_INT(sizeof u, 128);
    memcpy(id, &u, 128);
#else
    for (int i = 0; i < 128; i++)
        id[i] = (unsigned char)(i * 37 + 5);
#endif
}

static void test_rendezvous_exchange(void)
{
    for (int n_nodes = 2; n_nodes <= 3; n_nodes++) {
        char addr[64];
        cinfer_rendezvous *r = node0(n_nodes, 2 * n_nodes, 10000, addr, sizeof addr);
        if (!r)
            return;
        unsigned char id[128];
        make_id(id);
        child c[2];
        for (int k = 1; k < n_nodes; k++)
            spawn(&c[k - 1], addr, n_nodes, k, 2 * n_nodes, 10000);
        CHECK_OK(cinfer_rendezvous_run(r, id, sizeof id));
        cinfer_rendezvous_destroy(r);
        for (int k = 1; k < n_nodes; k++) {
            reap(&c[k - 1]);
            CHECK_EQ_INT(c[k - 1].st, CINFER_OK);
            CHECK(memcmp(c[k - 1].id, id, sizeof id) == 0);
        }
    }
}

/* Node 2 of 3 never comes: node 0 times out naming it, node 1 hears that
 * node 0 gave up; both within the bound. */
static void test_rendezvous_missing_node(void)
{
    char addr[64];
    cinfer_rendezvous *r = node0(3, 3, 300, addr, sizeof addr);
    if (!r)
        return;
    child c;
    spawn(&c, addr, 3, 1, 3, 5000);
    unsigned char id[128];
    make_id(id);
    long long t0 = now_ms();
    CHECK_EQ_INT(cinfer_rendezvous_run(r, id, sizeof id), CINFER_E_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECK(strstr(cinfer_last_error(), "node 2 of 3 did not check in within "
                                      "300 ms"));
    CHECK(ms >= 250 && ms < 3000);
    cinfer_rendezvous_destroy(r);
    reap(&c);
    CHECK_EQ_INT(c.st, CINFER_E_UNAVAILABLE);
    CHECK(strstr(c.msg, "node 0 gave up"));
    CHECK(strstr(c.msg, "node 2 of 3"));
}

/* A free loopback port nobody listens on (bound, then closed). */
static int dead_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    int port = 0;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    close(fd);
    return port;
}

/* Node 0 is not there: node 1 retries until its deadline, then says so. */
static void test_rendezvous_no_node0(void)
{
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", dead_port());
    cinfer_rendezvous_params p = cinfer_rendezvous_default_params();
    p.addr = addr;
    p.n_nodes = 2;
    p.node_rank = 1;
    p.world_size = 2;
    p.timeout_ms = 300;
    cinfer_rendezvous *r = NULL;
    CHECK_OK(cinfer_rendezvous_create(&p, &r));
    unsigned char id[128];
    long long t0 = now_ms();
    CHECK_EQ_INT(cinfer_rendezvous_run(r, id, sizeof id), CINFER_E_TIMEOUT);
    long long ms = now_ms() - t0;
    CHECK(strstr(cinfer_last_error(), "could not reach node 0 at"));
    if (!strstr(cinfer_last_error(), "Connection refused"))
        fprintf(stderr, "  %s\n", cinfer_last_error());
    CHECK(strstr(cinfer_last_error(), "Connection refused"));
    CHECK(ms >= 250 && ms < 3000);
    cinfer_rendezvous_destroy(r);
}

/* A node with another world size, or another n_nodes, is refused: it is
 * told why, and node 0 fails with both sides' numbers. */
static void test_rendezvous_mismatch_refused(void)
{
    for (int which = 0; which < 2; which++) {
        char addr[64];
        cinfer_rendezvous *r = node0(2, 4, 5000, addr, sizeof addr);
        if (!r)
            return;
        child c;
        if (which == 0)
            spawn(&c, addr, 2, 1, 6, 5000); /* world size 6, not 4 */
        else
            spawn(&c, addr, 3, 1, 6, 5000); /* n_nodes 3, not 2 */
        unsigned char id[128];
        make_id(id);
        CHECK_EQ_INT(cinfer_rendezvous_run(r, id, sizeof id), CINFER_E_INVALID_ARG);
        const char *want = which == 0
                               ? "node 1 has n_nodes 2 and world size 6, node "
                                 "0 has n_nodes 2 and world size 4"
                               : "node 1 has n_nodes 3 and world size 6, node "
                                 "0 has n_nodes 2 and world size 4";
        CHECK(strstr(cinfer_last_error(), want));
        CHECK(strstr(cinfer_last_error(), "refused a peer"));
        cinfer_rendezvous_destroy(r);
        reap(&c);
        CHECK_EQ_INT(c.st, CINFER_E_INVALID_ARG);
        CHECK(strstr(c.msg, "refused by node 0 at"));
        CHECK(strstr(c.msg, want));
    }
}

/* Two nodes both claim node rank 1 of 3: the second is refused, and the
 * first hears that the rendezvous failed. */
static void test_rendezvous_node_rank_taken(void)
{
    char addr[64];
    cinfer_rendezvous *r = node0(3, 3, 5000, addr, sizeof addr);
    if (!r)
        return;
    child c[2];
    spawn(&c[0], addr, 3, 1, 3, 5000);
    spawn(&c[1], addr, 3, 1, 3, 5000);
    unsigned char id[128];
    make_id(id);
    CHECK_EQ_INT(cinfer_rendezvous_run(r, id, sizeof id), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "node rank 1 has checked in already"));
    cinfer_rendezvous_destroy(r);
    reap(&c[0]);
    reap(&c[1]);
    int refused = (c[0].st == CINFER_E_INVALID_ARG) + (c[1].st == CINFER_E_INVALID_ARG);
    int told = (c[0].st == CINFER_E_UNAVAILABLE) + (c[1].st == CINFER_E_UNAVAILABLE);
    CHECK_EQ_INT(refused, 1);
    CHECK_EQ_INT(told, 1);
    for (int k = 0; k < 2; k++)
        CHECK(strstr(c[k].msg, "node rank 1 has checked in already"));
}

/* A connection that does not speak the protocol (garbage, or silence) is
 * dropped without holding up the real peer. */
static void test_rendezvous_ignores_strangers(void)
{
    char addr[64];
    cinfer_rendezvous *r = node0(2, 2, 5000, addr, sizeof addr);
    if (!r)
        return;
    int port = cinfer_rendezvous_port(r);
    int fds[2];
    for (int k = 0; k < 2; k++) {
        fds[k] = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        a.sin_port = htons((uint16_t)port);
        CHECK(connect(fds[k], (struct sockaddr *)&a, sizeof a) == 0);
    }
    const char junk[40] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    CHECK(write(fds[0], junk, sizeof junk) == (ssize_t)sizeof junk);
    /* fds[1] stays silent. */
    child c;
    spawn(&c, addr, 2, 1, 2, 5000);
    unsigned char id[128];
    make_id(id);
    long long t0 = now_ms();
    CHECK_OK(cinfer_rendezvous_run(r, id, sizeof id));
    CHECK(now_ms() - t0 < 4000);
    cinfer_rendezvous_destroy(r);
    reap(&c);
    CHECK_EQ_INT(c.st, CINFER_OK);
    CHECK(memcmp(c.id, id, sizeof id) == 0);
    close(fds[0]);
    close(fds[1]);
}

static void test_rendezvous_params(void)
{
    cinfer_rendezvous_params p = cinfer_rendezvous_default_params();
    cinfer_rendezvous *r = NULL;
    p.world_size = 2;
    const char *bad[] = {NULL, "", "host", "host:", ":80", "h:99999", "h:1x",
                         "[::1:80"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        p.addr = bad[i];
        p.node_rank = 1;
        CHECK_EQ_INT(cinfer_rendezvous_create(&p, &r), CINFER_E_INVALID_ARG);
        CHECK(r == NULL);
    }
    p.addr = "127.0.0.1:0"; /* port 0 only for node 0 */
    CHECK_EQ_INT(cinfer_rendezvous_create(&p, &r), CINFER_E_INVALID_ARG);
    p.addr = "127.0.0.1:5000";
    p.node_rank = 2;
    CHECK_EQ_INT(cinfer_rendezvous_create(&p, &r), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "node rank 2 is outside 0..1"));
    p.node_rank = 1;
    p.world_size = 3;
    CHECK_EQ_INT(cinfer_rendezvous_create(&p, &r), CINFER_E_INVALID_ARG);
    p.world_size = 2;
    p.n_nodes = 1;
    CHECK_EQ_INT(cinfer_rendezvous_create(&p, &r), CINFER_E_INVALID_ARG);
    p.n_nodes = 2;
    p.addr = "[::1]:5000";
    CHECK_OK(cinfer_rendezvous_create(&p, &r));
    unsigned char id[4];
    CHECK_EQ_INT(cinfer_rendezvous_run(r, id, 0), CINFER_E_INVALID_ARG);
    cinfer_rendezvous_destroy(r);
    cinfer_rendezvous_destroy(NULL);
}

/* ---------------------------------------------------------------------- */
/* NCCL communicators                                                      */
/* ---------------------------------------------------------------------- */

static void test_nccl_params(void)
{
    cinfer_comm *comms[2];
    cinfer_comm_nccl_params p = cinfer_comm_nccl_default_params();
    p.world_size = 3;
    p.n_nodes = 2;
    cinfer_status st = cinfer_comm_create_nccl(&p, comms);
#if defined(CINFER_TEST_CUDA) || defined(CINFER_TEST_CUDASIM)
    CHECK_EQ_INT(st, CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "world size 3 is not a positive "
                                      "multiple of n_nodes 2"));
    p.world_size = 2;
    st = cinfer_comm_create_nccl(&p, comms); /* no init_addr */
    CHECK_EQ_INT(st, CINFER_E_INVALID_ARG);
#else
    CHECK_EQ_INT(st, CINFER_E_UNSUPPORTED);
#endif
    /* An NCCL-less (CPU) backend refuses nothing but a wrong kind. */
}

#ifdef CINFER_TEST_CUDASIM

typedef struct {
    cinfer_comm_nccl_params np; /* two-node path: each thread makes its own */
    cinfer_comm *comm;          /* else given */
    int device;
    be_job job;
    cinfer_status st;
    char err[512];
} gpu_rank;

static void *gpu_rank_main(void *p)
{
    gpu_rank *g = p;
    g->st = CINFER_OK;
    if (!g->comm) {
        g->st = cinfer_comm_create_nccl(&g->np, &g->comm);
        if (g->st != CINFER_OK) {
            snprintf(g->err, sizeof g->err, "%s", cinfer_last_error());
            g->job.st = g->st;
            return NULL;
        }
    }
    cinfer_backend_cuda_params bp = cinfer_backend_cuda_default_params();
    bp.device = g->device;
    bp.comm = g->comm;
    g->st = cinfer_backend_cuda_create(&bp, &g->job.be);
    if (g->st != CINFER_OK) {
        snprintf(g->job.err, sizeof g->job.err, "%s", cinfer_last_error());
        g->job.st = g->st;
        return NULL;
    }
    be_main(&g->job);
    cinfer_backend_destroy(g->job.be);
    g->job.be = NULL;
    return NULL;
}

static void run_gpu_ranks(gpu_rank *g, int size)
{
    pthread_t th[2];
    for (int r = 0; r < size; r++) {
        g[r].device = r;
        g[r].job.rank = r;
        g[r].job.size = size;
        g[r].job.rows = 3;
        g[r].job.cols = 769;
        g[r].job.reduced = malloc(3 * 769 * sizeof(float));
        g[r].job.gathered = malloc((size_t)size * 3 * 769 * sizeof(float));
        pthread_create(&th[r], NULL, gpu_rank_main, &g[r]);
    }
    for (int r = 0; r < size; r++)
        pthread_join(th[r], NULL);
    be_job jobs[2];
    for (int r = 0; r < size; r++)
        jobs[r] = g[r].job;
    check_be_jobs(jobs, size, 0);
    for (int r = 0; r < size; r++) {
        if (g[r].st != CINFER_OK)
            fprintf(stderr, "rank %d: %s\n", r, g[r].err);
        free(g[r].job.reduced);
        free(g[r].job.gathered);
        cinfer_comm_destroy(g[r].comm);
    }
}

/* TP over two simulated GPUs: ncclCommInitAll, one thread per rank. */
static void test_cudasim_nccl_init_all(void)
{
    if (cinfer_cuda_device_count() < 2) {
        fprintf(stderr, "  (CUDASIM_DEVICES < 2: skipped)\n");
        return;
    }
    cinfer_comm *comms[2] = {NULL, NULL};
    cinfer_comm_nccl_params p = cinfer_comm_nccl_default_params();
    p.world_size = 2;
    CHECK_OK(cinfer_comm_create_nccl(&p, comms));
    if (!comms[0])
        return;
    for (int r = 0; r < 2; r++) {
        CHECK_EQ_INT(cinfer_comm_get_kind(comms[r]), CINFER_COMM_NCCL);
        CHECK_EQ_INT(cinfer_comm_rank(comms[r]), r);
        CHECK_EQ_INT(cinfer_comm_size(comms[r]), 2);
    }
    float x = 0;
    CHECK_EQ_INT(cinfer_comm_all_reduce_sum(comms[0], &x, 1), CINFER_E_UNSUPPORTED);
    /* The wrong device, and the wrong kind, are refused. */
    cinfer_backend *be = NULL;
    cinfer_backend_cuda_params bp = cinfer_backend_cuda_default_params();
    bp.device = 0;
    bp.comm = comms[1];
    CHECK_EQ_INT(cinfer_backend_cuda_create(&bp, &be), CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "is on device 1"));
    cinfer_backend_cpu_params cp = cinfer_backend_cpu_default_params();
    cp.comm = comms[0];
    CHECK_EQ_INT(cinfer_backend_cpu_create(&cp, &be), CINFER_E_INVALID_ARG);

    gpu_rank g[2];
    memset(g, 0, sizeof g);
    g[0].comm = comms[0];
    g[1].comm = comms[1];
    run_gpu_ranks(g, 2);
}

/* The two-node path in one process: each "node" thread creates its rank
 * with the rendezvous on loopback, then NCCL joins them by the id. */
static void test_cudasim_nccl_two_nodes(void)
{
    if (cinfer_cuda_device_count() < 2)
        return;
    char addr[64];
    snprintf(addr, sizeof addr, "127.0.0.1:%d", dead_port());
    static const int devs[2] = {0, 1};
    gpu_rank g[2];
    memset(g, 0, sizeof g);
    for (int k = 0; k < 2; k++) {
        g[k].np = cinfer_comm_nccl_default_params();
        g[k].np.world_size = 2;
        g[k].np.n_nodes = 2;
        g[k].np.node_rank = k;
        g[k].np.devices = &devs[k];
        g[k].np.init_addr = addr;
        g[k].np.timeout_ms = 20000;
    }
    run_gpu_ranks(g, 2);
    for (int k = 0; k < 2; k++)
        CHECK_OK(g[k].st);
}

/* Node 1 checks in at the rendezvous (it gets the id) and never joins
 * NCCL: node 0's non-blocking ncclCommInitRankConfig is polled until its
 * timeout, aborted, and creation fails with CINFER_E_TIMEOUT naming the
 * rank, instead of hanging in the init. */
typedef struct {
    char addr[64];
    cinfer_status st;
} silent_node;

static void *silent_node_main(void *arg)
{
    silent_node *n = arg;
    cinfer_rendezvous_params rp = cinfer_rendezvous_default_params();
    rp.addr = n->addr;
    rp.n_nodes = 2;
    rp.node_rank = 1;
    rp.world_size = 2;
    rp.timeout_ms = 20000;
    cinfer_rendezvous *r = NULL;
    n->st = cinfer_rendezvous_create(&rp, &r);
    if (n->st == CINFER_OK) {
        char id[128]; /* sizeof(ncclUniqueId) */
        n->st = cinfer_rendezvous_run(r, id, sizeof id);
    }
    cinfer_rendezvous_destroy(r);
    return NULL;
}

static void test_cudasim_nccl_peer_never_joins(void)
{
    if (cinfer_cuda_device_count() < 1)
        return;
    silent_node n;
    memset(&n, 0, sizeof n);
    snprintf(n.addr, sizeof n.addr, "127.0.0.1:%d", dead_port());
    pthread_t th;
    CHECK_EQ_INT(pthread_create(&th, NULL, silent_node_main, &n), 0);
    static const int dev0 = 0;
    cinfer_comm_nccl_params p = cinfer_comm_nccl_default_params();
    p.world_size = 2;
    p.n_nodes = 2;
    p.node_rank = 0;
    p.devices = &dev0;
    p.init_addr = n.addr;
    p.timeout_ms = 700;
    cinfer_comm *c = NULL;
    CHECK_EQ_INT(cinfer_comm_create_nccl(&p, &c), CINFER_E_TIMEOUT);
    CHECK(strstr(cinfer_last_error(), "ncclCommInitRankConfig (rank 0 of 2)"));
    CHECK(strstr(cinfer_last_error(), "within 700 ms"));
    fprintf(stderr, "  %s\n", cinfer_last_error());
    CHECK(!c);
    pthread_join(th, NULL);
    CHECK_OK(n.st); /* it got the id: the wait that timed out was NCCL's */
}

#endif /* CINFER_TEST_CUDASIM */

int main(void)
{
    /* The forking tests first, while this process has one thread. */
    RUN(test_rendezvous_params);
    RUN(test_rendezvous_exchange);
    RUN(test_rendezvous_missing_node);
    RUN(test_rendezvous_no_node0);
    RUN(test_rendezvous_mismatch_refused);
    RUN(test_rendezvous_node_rank_taken);
    RUN(test_rendezvous_ignores_strangers);
    RUN(test_local_params);
    RUN(test_local_all_reduce_deterministic);
    RUN(test_local_all_gather);
    RUN(test_local_timeout_names_missing_rank);
    RUN(test_local_timeout_two_missing);
    RUN(test_local_mismatch);
    RUN(test_local_abort);
    RUN(test_backend_collectives_cpu);
    RUN(test_backend_collective_checks);
    RUN(test_nccl_params);
#ifdef CINFER_TEST_CUDASIM
    RUN(test_cudasim_nccl_init_all);
    RUN(test_cudasim_nccl_two_nodes);
    RUN(test_cudasim_nccl_peer_never_joins);
#endif
    return harness_done();
}
