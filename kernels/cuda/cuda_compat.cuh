/*
 * cuda_compat.cuh - what lets one kernel source compile under nvcc and
 * under the CUDA execution harness (tests/cudasim/).
 *
 * Kernels in kernels/cuda/ are written in ordinary CUDA C++ with three
 * exceptions, each a macro defined here for nvcc and by the harness
 * header (tests/cudasim/cudasim.h, force-included with -DCINFER_CUDASIM
 * when the harness build compiles a .cu file as C++17 with g++ or clang++):
 *
 *   CINFER_LAUNCH(kernel, grid, block, smem_bytes, stream, args...)
 *       kernel<<<grid, block, smem_bytes, stream>>>(args...); a launcher
 *       checks cudaGetLastError() after it (CINFER_CUDA_TRY_LAUNCH).
 *   CINFER_SHARED(type, name, dims)
 *       __shared__ type name dims;   e.g. CINFER_SHARED(float, tile, [32][33])
 *   CINFER_DYN_SHARED(type, name)
 *       extern __shared__ type name[];  (the launch's dynamic shared memory)
 *
 * Everything else (threadIdx, __syncthreads, the _sync warp intrinsics,
 * atomics, __dp4a, cuda_fp16.h / cuda_bf16.h) is the CUDA spelling; the
 * harness supplies it. A kernel never assumes a warp runs in lockstep
 * without __syncwarp or a _sync intrinsic (STYLE.md rule 15a).
 *
 *     __global__ void scale_kernel(float *__restrict__ x, float s, int n) {
 *         int i = blockIdx.x * blockDim.x + threadIdx.x;
 *         if (i < n) x[i] *= s;
 *     }
 *     CINFER_LAUNCH(scale_kernel, dim3((n + 255) / 256), dim3(256), 0,
 *                   stream, x, s, n);
 *     CINFER_CUDA_TRY_LAUNCH("scale_kernel");
 */
#ifndef CINFER_CUDA_COMPAT_CUH
#define CINFER_CUDA_COMPAT_CUH

#if defined(__CUDACC__)

#define CINFER_LAUNCH(kernel, grid, block, smem, stream, ...)                  \
    kernel<<<(grid), (block), (smem), (stream)>>>(__VA_ARGS__)
#define CINFER_SHARED(type, name, dims) __shared__ type name dims
#define CINFER_DYN_SHARED(type, name) extern __shared__ type name[]

#elif defined(CINFER_CUDASIM)
/* tests/cudasim/cudasim.h, force-included, has defined them. */
#ifndef CINFER_LAUNCH
#error "CINFER_CUDASIM is set but tests/cudasim/cudasim.h was not included"
#endif

#else
#error "kernels/cuda/*.cu compile under nvcc or under the harness (CINFER_CUDASIM)"
#endif

#include <cuda_fp16.h>
#include <cuda_bf16.h>

#endif /* CINFER_CUDA_COMPAT_CUH */
