/*
 * comm_impl.h - the communicator handle's body, shared by comm.c (the
 * LOCAL kind and what every kind has) and kernels/cuda/comm_nccl.c (the
 * NCCL kind), so comm.c never includes or links NCCL: an NCCL handle
 * carries its own destroy and abort.
 */
#ifndef CINFER_COMM_IMPL_H
#define CINFER_COMM_IMPL_H

#include "comm.h"

#ifdef __cplusplus
extern "C" {
#endif

struct comm_local_shared; /* comm.c */

struct cinfer_comm {
    cinfer_comm_kind kind;
    int rank;
    int size;
    int timeout_ms; /* bound on a collective's wait (> 0) */
    /* LOCAL: collectives this rank ran and its time inside them */
    uint64_t n_collectives, collective_ns;

    /* LOCAL: the barrier and buffer table all ranks share. */
    struct comm_local_shared *local;

    /* NCCL: the rank's ncclComm_t, its device, and the kind's own cleanup
     * of this handle (frees it) and abort. */
    void *nccl;
    int device;
    void (*destroy)(cinfer_comm *c);
    void (*abort)(cinfer_comm *c, const char *why);
};

#ifdef __cplusplus
}
#endif
#endif /* CINFER_COMM_IMPL_H */
