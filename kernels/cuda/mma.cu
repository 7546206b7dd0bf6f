/*
 * mma.cu - the check kernels of the tensor-core building blocks (mma.cuh):
 * one warp loads its fragments from global memory in the PTX layouts, runs
 * one int8 mma and one ldmatrix x4 (or one f16 / bf16 mma), each also in
 * its shuffle form, and
 * stores what it got, for the tests
 * to compare with a scalar reference (test_backend_ops, on the harness and
 * on a device).
 */
#include "kernels/cuda/mma.cuh"

#include <stdint.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"

/* Four int8 at p (4-byte aligned) as one register. */
static __device__ __forceinline__ unsigned ld_s8x4(const int8_t *p) {
  return *(const unsigned *)p;
}

// Grid (1), block (32).
__global__ void mma_check_kernel(const int8_t *__restrict__ a,     // [16][32]
                                 const int8_t *__restrict__ b,     // [8][32]
                                 const int32_t *__restrict__ c,    // [16][8]
                                 int32_t *__restrict__ d,          // [2][16][8]
                                 const uint16_t *__restrict__ m,   // [4][8][8]
                                 const int32_t *__restrict__ perm, // [8]
                                 uint32_t *__restrict__ r)         // [2][32][4]
{
  CINFER_SHARED(uint4, rows, [32]); /* row j of matrix i at 8 i + j */
  const int lane = (int)threadIdx.x, gid = lane / 4, tid = lane % 4;
  uint16_t *mine = reinterpret_cast<uint16_t *>(&rows[lane]);
  for (int e = 0; e < 8; e++)
    mine[e] = m[lane * 8 + e];
  __syncthreads();
  unsigned got[4], got_shfl[4];
  cinfer_ldmatrix_x4(got, &rows[(lane / 8) * 8 + perm[lane % 8]]);
  cinfer_ldmatrix_x4_shfl(got_shfl, &rows[(lane / 8) * 8 + perm[lane % 8]]);
  for (int i = 0; i < 4; i++) {
    r[lane * 4 + i] = got[i];
    r[128 + lane * 4 + i] = got_shfl[i];
  }

  unsigned fa[4], fb[2];
  fa[0] = ld_s8x4(a + gid * 32 + 4 * tid);
  fa[1] = ld_s8x4(a + (gid + 8) * 32 + 4 * tid);
  fa[2] = ld_s8x4(a + gid * 32 + 16 + 4 * tid);
  fa[3] = ld_s8x4(a + (gid + 8) * 32 + 16 + 4 * tid);
  fb[0] = ld_s8x4(b + gid * 32 + 4 * tid);
  fb[1] = ld_s8x4(b + gid * 32 + 16 + 4 * tid);
  const int at[4] = {gid * 8 + 2 * tid, gid * 8 + 2 * tid + 1,
                     (gid + 8) * 8 + 2 * tid, (gid + 8) * 8 + 2 * tid + 1};
  int fd[4], fd_shfl[4];
  for (int i = 0; i < 4; i++)
    fd[i] = fd_shfl[i] = c[at[i]];
  cinfer_mma_s8_16832(fd, fa, fb);
  cinfer_mma_s8_16832_shfl(fd_shfl, fa, fb);
  for (int i = 0; i < 4; i++) {
    d[at[i]] = fd[i];
    d[128 + at[i]] = fd_shfl[i];
  }
}

extern "C" cinfer_status
cinfer_cuda_mma_check(cudaStream_t stream, const int8_t *a, const int8_t *b,
                      const int32_t *c, int32_t *d, const uint16_t *m,
                      const int32_t *perm, uint32_t *r) {
  if (!a || !b || !c || !d || !m || !perm || !r)
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "cuda mma_check: a pointer is NULL");
  CINFER_LAUNCH(mma_check_kernel, dim3(1), dim3(32), 0, stream, a, b, c, d, m,
                perm, r);
  CINFER_CUDA_TRY_LAUNCH("mma_check_kernel");
  CINFER_CUDA_TRY(cudaStreamSynchronize(stream));
  return CINFER_OK;
}

// Grid (1), block (32).
template <bool BF16>
__global__ void mma_f_check_kernel(const uint16_t *__restrict__ a, // [16][16]
                                   const uint16_t *__restrict__ b, // [8][16]
                                   const float *__restrict__ c,    // [16][8]
                                   float *__restrict__ d)          // [2][16][8]
{
  const int lane = (int)threadIdx.x, gid = lane / 4, tid = lane % 4;
  auto pair = [](const uint16_t *p) {
    return (unsigned)p[0] | (unsigned)p[1] << 16;
  };
  unsigned fa[4], fb[2];
  fa[0] = pair(a + gid * 16 + 2 * tid);
  fa[1] = pair(a + (gid + 8) * 16 + 2 * tid);
  fa[2] = pair(a + gid * 16 + 8 + 2 * tid);
  fa[3] = pair(a + (gid + 8) * 16 + 8 + 2 * tid);
  fb[0] = pair(b + gid * 16 + 2 * tid);
  fb[1] = pair(b + gid * 16 + 8 + 2 * tid);
  const int at[4] = {gid * 8 + 2 * tid, gid * 8 + 2 * tid + 1,
                     (gid + 8) * 8 + 2 * tid, (gid + 8) * 8 + 2 * tid + 1};
  float fd[4], fd_shfl[4];
  for (int i = 0; i < 4; i++)
    fd[i] = fd_shfl[i] = c[at[i]];
  if (BF16)
    cinfer_mma_bf16_16816(fd, fa, fb);
  else
    cinfer_mma_f16_16816(fd, fa, fb);
  cinfer_mma_f_16816_shfl<BF16>(fd_shfl, fa, fb);
  for (int i = 0; i < 4; i++) {
    d[at[i]] = fd[i];
    d[128 + at[i]] = fd_shfl[i];
  }
}

extern "C" cinfer_status cinfer_cuda_mma_f_check(cudaStream_t stream, int bf16,
                                                 const uint16_t *a,
                                                 const uint16_t *b,
                                                 const float *c, float *d) {
  if (!a || !b || !c || !d)
    return cinfer_set_error(CINFER_E_INVALID_ARG,
                            "cuda mma_f_check: a pointer is NULL");
  if (bf16) {
    CINFER_LAUNCH(mma_f_check_kernel<true>, dim3(1), dim3(32), 0, stream, a,
                  b, c, d);
  } else {
    CINFER_LAUNCH(mma_f_check_kernel<false>, dim3(1), dim3(32), 0, stream, a,
                  b, c, d);
  }
  CINFER_CUDA_TRY_LAUNCH("mma_f_check_kernel");
  CINFER_CUDA_TRY(cudaStreamSynchronize(stream));
  return CINFER_OK;
}
