/*
 * comm_nccl.h - what the CUDA backend asks of an NCCL communicator
 * (comm_nccl.c), so cuda_backend.c enqueues collectives without including
 * NCCL itself. Private to kernels/cuda/.
 */
#ifndef CINFER_COMM_NCCL_H
#define CINFER_COMM_NCCL_H

#include <cuda_runtime_api.h>
#include <stddef.h>

#include "../comm.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ncclAllReduce(sum, float) of n floats of device memory in place, on
 * stream. c is an NCCL communicator. */
cinfer_status cinfer_comm_nccl_all_reduce_sum(cinfer_comm *c, float *d_buf,
                                              size_t n, cudaStream_t stream);

/* ncclAllGather of n floats from each rank into d_recv (n * size floats,
 * rank-major), on stream. */
cinfer_status cinfer_comm_nccl_all_gather(cinfer_comm *c, const float *d_send,
                                          size_t n, float *d_recv,
                                          cudaStream_t stream);

/* Waits for stream to drain, polling it and the communicator's async
 * error, for at most the communicator's timeout: a collective whose peer
 * never comes would otherwise hold cudaStreamSynchronize forever. On a
 * timeout or an NCCL error the communicator is aborted (ncclCommAbort,
 * which also ends the stuck kernel) and the call fails: CINFER_E_TIMEOUT
 * or CINFER_E_DEVICE. */
cinfer_status cinfer_comm_nccl_wait(cinfer_comm *c, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif /* CINFER_COMM_NCCL_H */
