/*
 * nccl.cc - cudasim's NCCL: communicators over the simulated devices of one
 * process (ncclCommInitAll, ncclCommInitRank, and ncclCommInitRankConfig
 * non-blocking) and the two collectives tensor parallelism needs (ncclAllReduce,
 * ncclAllGather), defined with the toolkit's declarations (nccl.h).
 *
 * TEST DOUBLE (cudasim.h has the model). The ranks of a communicator are
 * simulated devices, each driven by its own host thread (or all by one
 * thread between ncclGroupStart and ncclGroupEnd). A collective is an
 * in-process rendezvous: each rank deposits its buffers and waits; the last
 * to arrive computes every rank's result, in rank order (sums in float for
 * half and bf16, rounded once), so results do not depend on which thread
 * came last. Ranks that disagree on the count, type or operation fail with
 * ncclInvalidUsage; a rank that never arrives fails the others after
 * CUDASIM_NCCL_TIMEOUT_S seconds (default 120) with ncclSystemError, where
 * real NCCL would hang. A collective on a capturing stream is recorded and
 * meets the other ranks at each replay; collectives between ncclGroupStart
 * and ncclGroupEnd run at ncclGroupEnd and are not recorded.
 */
#include <nccl.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/cudasim/cudasim_impl.h"

namespace cudasim {
namespace {

struct contribution {
    const void *send = nullptr;
    void *recv = nullptr;
    size_t count = 0;
    ncclDataType_t type = ncclFloat32;
    int op = 0;      /* ncclRedOp_t, or -1 for all-gather */
};

/* The ranks of one communicator. */
struct clique {
    int nranks;
    std::mutex m;
    std::condition_variable cv;
    std::vector<contribution> slots;
    int arrived = 0;
    unsigned long long generation = 0; /* completed collectives */
    ncclResult_t outcome = ncclSuccess;
    bool aborted = false;
    int joined = 0;                    /* ncclCommInitRank */
    explicit clique(int n) : nranks(n), slots((size_t)n) {}
};

std::mutex g_m;
std::map<std::string, std::shared_ptr<clique>> *g_pending = new std::map<std::string, std::shared_ptr<clique>>;
std::atomic<unsigned long long> g_ids{0};

int timeout_s()
{
    const char *v = getenv("CUDASIM_NCCL_TIMEOUT_S");
    int t = v ? atoi(v) : 0;
    return t > 0 ? t : 120;
}

size_t type_size(ncclDataType_t t)
{
    switch (t) {
    case ncclInt8:
    case ncclUint8: return 1;
    case ncclFloat16:
    case ncclBfloat16: return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32: return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64: return 8;
    default: return 0;
    }
}

bool reducible(ncclDataType_t t)
{
    return t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32 || t == ncclFloat64 ||
           t == ncclInt32;
}

double load(const void *p, ncclDataType_t t, size_t i)
{
    switch (t) {
    case ncclFloat16: return __half2float(static_cast<const __half *>(p)[i]);
    case ncclBfloat16: return __bfloat162float(static_cast<const __nv_bfloat16 *>(p)[i]);
    case ncclFloat32: return static_cast<const float *>(p)[i];
    case ncclFloat64: return static_cast<const double *>(p)[i];
    default: return static_cast<const int32_t *>(p)[i];
    }
}

/* Accumulates in the type's working precision: float for the 16-bit and
 * 32-bit float types, double for double, exact for int32. */
double combine(double a, double b, int op, ncclDataType_t t)
{
    double r;
    switch (op) {
    case ncclProd: r = a * b; break;
    case ncclMax: r = a > b ? a : b; break;
    case ncclMin: r = a < b ? a : b; break;
    default: r = a + b; break;
    }
    if (t == ncclFloat16 || t == ncclBfloat16 || t == ncclFloat32)
        r = (float)r;
    return r;
}

void store(void *p, ncclDataType_t t, size_t i, double v)
{
    switch (t) {
    case ncclFloat16: static_cast<__half *>(p)[i] = __float2half_rn((float)v); break;
    case ncclBfloat16: static_cast<__nv_bfloat16 *>(p)[i] = __float2bfloat16_rn((float)v); break;
    case ncclFloat32: static_cast<float *>(p)[i] = (float)v; break;
    case ncclFloat64: static_cast<double *>(p)[i] = v; break;
    default: static_cast<int32_t *>(p)[i] = (int32_t)v; break;
    }
}

/* The last rank in: every rank's result (clique lock held). */
ncclResult_t compute(clique &c)
{
    const contribution &c0 = c.slots[0];
    for (int r = 1; r < c.nranks; r++) {
        const contribution &x = c.slots[(size_t)r];
        if (x.count != c0.count || x.type != c0.type || x.op != c0.op) {
            report("NCCL: rank %d calls %s with count %zu type %d, rank 0 %s with count %zu type "
                   "%d -> ncclInvalidUsage",
                   r, x.op < 0 ? "ncclAllGather" : "ncclAllReduce", x.count, (int)x.type,
                   c0.op < 0 ? "ncclAllGather" : "ncclAllReduce", c0.count, (int)c0.type);
            return ncclInvalidUsage;
        }
    }
    size_t n = c0.count, es = type_size(c0.type);
    if (c0.op < 0) {
        std::vector<char> all(n * es * (size_t)c.nranks);
        for (int r = 0; r < c.nranks; r++)
            memcpy(&all[(size_t)r * n * es], c.slots[(size_t)r].send, n * es);
        for (int r = 0; r < c.nranks; r++)
            memcpy(c.slots[(size_t)r].recv, all.data(), all.size());
        return ncclSuccess;
    }
    std::vector<char> out(n * es);
    for (size_t i = 0; i < n; i++) {
        double acc = load(c.slots[0].send, c0.type, i);
        for (int r = 1; r < c.nranks; r++)
            acc = combine(acc, load(c.slots[(size_t)r].send, c0.type, i), c0.op, c0.type);
        if (c0.op == ncclAvg)
            acc = combine(acc / c.nranks, 0, ncclSum, c0.type);
        store(out.data(), c0.type, i, acc);
    }
    for (int r = 0; r < c.nranks; r++)
        memcpy(c.slots[(size_t)r].recv, out.data(), out.size());
    return ncclSuccess;
}

} // namespace
} // namespace cudasim

struct ncclComm {
    int nranks;
    int rank;
    int device;
    std::shared_ptr<cudasim::clique> c;
    bool nonblocking = false; /* ncclCommInitRankConfig, config.blocking 0 */
};

namespace cudasim {
namespace {

/* One rank's part of a collective: deposit, then wait for the others. */
struct collective final : stream_op {
    ncclComm *comm;
    contribution mine;
    unsigned long long gen = 0;
    ncclResult_t result = ncclSuccess;

    void deposit()
    {
        clique &c = *comm->c;
        std::lock_guard<std::mutex> lk(c.m);
        gen = c.generation;
        c.slots[(size_t)comm->rank] = mine;
        if (++c.arrived == c.nranks) {
            c.outcome = compute(c);
            c.arrived = 0;
            c.generation++;
            c.cv.notify_all();
        }
    }

    ncclResult_t wait()
    {
        clique &c = *comm->c;
        std::unique_lock<std::mutex> lk(c.m);
        bool done = c.cv.wait_for(lk, std::chrono::seconds(timeout_s()),
                                  [&] { return c.generation != gen || c.aborted; });
        if (c.aborted)
            return ncclRemoteError;
        if (!done) {
            report("NCCL: rank %d of %d waited %d s in %s for ranks that never came -> "
                   "ncclSystemError (real NCCL would hang)",
                   comm->rank, c.nranks, timeout_s(), mine.op < 0 ? "ncclAllGather" : "ncclAllReduce");
            return ncclSystemError;
        }
        return c.outcome;
    }

    cudaError_t run() override
    {
        deposit();
        result = wait();
        return result == ncclSuccess ? cudaSuccess : cudaErrorLaunchFailure;
    }
};

thread_local int t_group_depth = 0;
thread_local std::vector<std::unique_ptr<collective>> t_group; /* parts queued in a group */

bool nccl_call_fails()
{
    int code;
    return fault_fires(&code);
}

ncclResult_t issue(const void *send, void *recv, size_t count, ncclDataType_t type, int op,
                   ncclComm_t comm, cudaStream_t stream)
{
    if (nccl_call_fails())
        return ncclUnhandledCudaError;
    if (!comm)
        return ncclInvalidArgument;
    if (type_size(type) == 0 || (op >= 0 && (!reducible(type) || op < ncclSum || op > ncclAvg)))
        return ncclInvalidArgument;
    if (device_sticky() != cudaSuccess)
        return ncclUnhandledCudaError;
    size_t bytes = count * type_size(type);
    size_t rbytes = op < 0 ? bytes * (size_t)comm->nranks : bytes;
    if (!check_range(send, bytes, op < 0 ? "ncclAllGather send buffer" : "ncclAllReduce send buffer") ||
        !check_range(recv, rbytes, op < 0 ? "ncclAllGather receive buffer" : "ncclAllReduce receive buffer"))
        return ncclInvalidArgument;
    auto op_ = std::make_unique<collective>();
    op_->comm = comm;
    op_->mine.send = send;
    op_->mine.recv = recv;
    op_->mine.count = count;
    op_->mine.type = type;
    op_->mine.op = op;
    if (t_group_depth > 0) {
        t_group.push_back(std::move(op_));
        return ncclSuccess;
    }
    collective *raw = op_.release();
    cudaError_t e = submit(stream, raw); /* runs it now, or records it */
    if (e == cudaSuccess)
        return ncclSuccess;
    return e == cudaErrorLaunchFailure ? ncclSystemError : ncclUnhandledCudaError;
}

} // namespace

void nccl_reset(void)
{
    std::lock_guard<std::mutex> lk(g_m);
    g_pending->clear();
    t_group_depth = 0;
    t_group.clear();
}

} // namespace cudasim

using namespace cudasim;

extern "C" {

ncclResult_t ncclGetVersion(int *version)
{
    if (!version)
        return ncclInvalidArgument;
    *version = NCCL_VERSION_CODE;
    return ncclSuccess;
}

ncclResult_t ncclGetUniqueId(ncclUniqueId *id)
{
    if (nccl_call_fails())
        return ncclUnhandledCudaError;
    if (!id)
        return ncclInvalidArgument;
    memset(id, 0, sizeof *id);
    snprintf(id->internal, sizeof id->internal, "cudasim-nccl-%d-%llu", (int)getpid(),
             ++g_ids);
    return ncclSuccess;
}

ncclResult_t ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank)
{
    if (nccl_call_fails())
        return ncclUnhandledCudaError;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
    std::shared_ptr<clique> c;
    {
        std::lock_guard<std::mutex> lk(g_m);
        auto &slot = (*g_pending)[key];
        if (!slot)
            slot = std::make_shared<clique>(nranks);
        c = slot;
        if (c->nranks != nranks)
            return ncclInvalidUsage;
    }
    /* As NCCL: returns once every rank has joined. */
    {
        std::unique_lock<std::mutex> lk(c->m);
        c->joined++;
        c->cv.notify_all();
        if (!c->cv.wait_for(lk, std::chrono::seconds(timeout_s()),
                            [&] { return c->joined >= c->nranks; })) {
            report("NCCL: ncclCommInitRank rank %d of %d: the other ranks never joined -> "
                   "ncclSystemError",
                   rank, nranks);
            c->joined--;
            return ncclSystemError;
        }
    }
    {
        std::lock_guard<std::mutex> lk(g_m);
        auto it = g_pending->find(key);
        if (it != g_pending->end() && it->second == c)
            g_pending->erase(it);
    }
    *comm = new ncclComm{nranks, rank, current_device(), c};
    return ncclSuccess;
}

/* config.blocking 0: joins and returns ncclInProgress at once; the
 * communicator's ncclCommGetAsyncError says ncclInProgress until every
 * rank has joined (or ncclRemoteError once one aborted), as NCCL's
 * non-blocking init does. Blocking, or no config: ncclCommInitRank. */
ncclResult_t ncclCommInitRankConfig(ncclComm_t *comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t *config)
{
    if (!config || config->blocking)
        return ncclCommInitRank(comm, nranks, id, rank);
    if (nccl_call_fails())
        return ncclUnhandledCudaError;
    if (!comm || nranks < 1 || rank < 0 || rank >= nranks)
        return ncclInvalidArgument;
    std::string key(id.internal, strnlen(id.internal, sizeof id.internal));
    std::shared_ptr<clique> c;
    {
        std::lock_guard<std::mutex> lk(g_m);
        auto &slot = (*g_pending)[key];
        if (!slot)
            slot = std::make_shared<clique>(nranks);
        c = slot;
        if (c->nranks != nranks)
            return ncclInvalidUsage;
        bool last;
        {
            std::lock_guard<std::mutex> lk2(c->m);
            last = ++c->joined >= c->nranks;
            c->cv.notify_all();
        }
        if (last)
            g_pending->erase(key);
    }
    *comm = new ncclComm{nranks, rank, current_device(), c, true};
    return ncclInProgress;
}

ncclResult_t ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist)
{
    if (nccl_call_fails())
        return ncclUnhandledCudaError;
    if (!comms || ndev < 1)
        return ncclInvalidArgument;
    auto c = std::make_shared<clique>(ndev);
    c->joined = ndev;
    for (int r = 0; r < ndev; r++)
        comms[r] = new ncclComm{ndev, r, devlist ? devlist[r] : r, c};
    return ncclSuccess;
}

ncclResult_t ncclCommDestroy(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    delete comm;
    return nccl_call_fails() ? ncclUnhandledCudaError : ncclSuccess;
}

ncclResult_t ncclCommAbort(ncclComm_t comm)
{
    if (!comm)
        return ncclInvalidArgument;
    {
        std::lock_guard<std::mutex> lk(comm->c->m);
        comm->c->aborted = true;
        comm->c->cv.notify_all();
    }
    delete comm;
    return ncclSuccess;
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) { return comm ? ncclSuccess : ncclInvalidArgument; }

ncclResult_t ncclCommCount(const ncclComm_t comm, int *count)
{
    if (!comm || !count)
        return ncclInvalidArgument;
    *count = comm->nranks;
    return ncclSuccess;
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int *rank)
{
    if (!comm || !rank)
        return ncclInvalidArgument;
    *rank = comm->rank;
    return ncclSuccess;
}

ncclResult_t ncclCommCuDevice(const ncclComm_t comm, int *device)
{
    if (!comm || !device)
        return ncclInvalidArgument;
    *device = comm->device;
    return ncclSuccess;
}

const char *ncclGetErrorString(ncclResult_t result)
{
    switch (result) {
    case ncclSuccess: return "no error";
    case ncclUnhandledCudaError: return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError: return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError: return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument: return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage: return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError: return "remote process exited or there was a network error";
    case ncclInProgress: return "NCCL operation in progress";
    default: return "unknown result code";
    }
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t *async_error)
{
    if (!comm || !async_error)
        return ncclInvalidArgument;
    std::lock_guard<std::mutex> lk(comm->c->m);
    *async_error = comm->c->aborted ? ncclRemoteError
                   : comm->nonblocking && comm->c->joined < comm->c->nranks
                       ? ncclInProgress
                       : ncclSuccess;
    return ncclSuccess;
}

ncclResult_t ncclGroupStart(void)
{
    t_group_depth++;
    return ncclSuccess;
}

ncclResult_t ncclGroupEnd(void)
{
    if (t_group_depth == 0)
        return ncclInvalidUsage;
    if (--t_group_depth > 0)
        return ncclSuccess;
    /* Deposit every queued part first, so one thread can drive all ranks.
     * Grouped parts run here, on no stream: they are not recorded into a
     * capture. */
    for (auto &op : t_group)
        op->deposit();
    ncclResult_t r = ncclSuccess;
    for (auto &op : t_group) {
        ncclResult_t e = op->wait();
        if (r == ncclSuccess)
            r = e;
    }
    t_group.clear();
    return r;
}

ncclResult_t ncclAllReduce(const void *sendbuff, void *recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream)
{
    return issue(sendbuff, recvbuff, count, datatype, (int)op, comm, stream);
}

ncclResult_t ncclAllGather(const void *sendbuff, void *recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream)
{
    return issue(sendbuff, recvbuff, sendcount, datatype, -1, comm, stream);
}

} // extern "C"
