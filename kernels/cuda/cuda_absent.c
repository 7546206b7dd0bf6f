/*
 * cuda_absent.c - the CUDA backend's entry points in a build without it
 * (no nvcc, or CINFER_CUDA=OFF): no devices, and creation says why. The
 * same for the NCCL communicator (comm.h), which lives in the CUDA
 * backend's library.
 */
#include <string.h>

#include "../backend.h"

cinfer_backend_cuda_params cinfer_backend_cuda_default_params(void)
{
    cinfer_backend_cuda_params p;
    memset(&p, 0, sizeof p);
    p.memory_fraction = 0.9;
    return p;
}

int cinfer_cuda_device_count(void)
{
    return 0;
}

cinfer_status cinfer_backend_cuda_create(const cinfer_backend_cuda_params *p,
                                         cinfer_backend **out)
{
    if (out)
        *out = NULL;
    return cinfer_set_error(CINFER_E_UNSUPPORTED,
                            "this build of cinfer has no CUDA backend "
                            "(configure with nvcc found and CINFER_CUDA=AUTO "
                            "or ON)");
}

cinfer_status cinfer_comm_create_nccl(const cinfer_comm_nccl_params *p,
                                      cinfer_comm **comms)
{
    return cinfer_set_error(CINFER_E_UNSUPPORTED,
                            "this build of cinfer has no CUDA backend, so no "
                            "NCCL communicator (configure with nvcc found and "
                            "CINFER_CUDA=AUTO or ON)");
}
