/*
 * mma.cuh - the tensor-core building blocks of the batched kernels (the
 * tiled quantized product, mmq.cu, runs on the first; the batch-invariant
 * float product, dense.cu, on the second): int8 mma.sync m16n8k32, f16 /
 * bf16 mma.sync m16n8k16 with f32 accumulators, and ldmatrix x4, as
 * device functions
 * that are the PTX instructions under nvcc (sm_80 and later) and, under
 * the CUDA harness (tests/cudasim/), the same results from the PTX ISA's
 * fragment layouts: each one warp-wide exchange of the harness (it
 * computes the whole instruction from every lane's fragments); on a GPU
 * older than sm_80, warp shuffles. A kernel that uses them is checked in
 * CI like any other.
 *
 * Fragments of mma m16n8k32 .s8 (lane = the warp lane, gid = lane / 4,
 * tid = lane % 4; four int8 in a register, the lowest k in the low byte):
 *   A 16x32, row-major:  a[0] = A[gid][4 tid .. 4 tid + 3]
 *                        a[1] = A[gid + 8][4 tid ..]
 *                        a[2] = A[gid][16 + 4 tid ..]
 *                        a[3] = A[gid + 8][16 + 4 tid ..]
 *   B 32x8, column-major: b[0] = B[4 tid .. 4 tid + 3][gid]
 *                         b[1] = B[16 + 4 tid ..][gid]
 *   C, D 16x8 (int32):   d[0] = D[gid][2 tid], d[1] = D[gid][2 tid + 1],
 *                        d[2] = D[gid + 8][2 tid], d[3] = D[gid + 8][2 tid + 1]
 * Fragments of mma m16n8k16 .f32 over .f16 or .bf16 (two 16-bit floats
 * in a register, the lower k in the low half):
 *   A 16x16, row-major:  a[0] = A[gid][2 tid, 2 tid + 1]
 *                        a[1] = A[gid + 8][2 tid ..]
 *                        a[2] = A[gid][8 + 2 tid ..]
 *                        a[3] = A[gid + 8][8 + 2 tid ..]
 *   B 16x8, column-major: b[0] = B[2 tid, 2 tid + 1][gid]
 *                         b[1] = B[8 + 2 tid ..][gid]
 *   C, D 16x8 (f32):     as for m16n8k32.
 * The products of 16-bit floats are exact in f32; how a device adds the
 * 16 of an element to its accumulator inside the instruction is its own,
 * so the harness (and the shuffle form: one fmaf a product, k = 0..15 in
 * order) may differ from it in the last bits, never in which inputs meet.
 * ldmatrix .x4 .b16: lane l gives the address of row l % 8 of matrix l / 8
 * (16 bytes, in shared memory); r[i] of lane l is then the two 16-bit
 * elements (2 (l % 4), 2 (l % 4) + 1) of row l / 4 of matrix i.
 *
 * Every lane of the warp must call them together (mask 0xffffffff), as
 * the instructions require.
 *
 *     unsigned a[4], b[2];  int d[4] = {0, 0, 0, 0};
 *     cinfer_ldmatrix_x4(a, &tile_a[row_of_this_lane][col0]);
 *     ...b from the activation tile...
 *     cinfer_mma_s8_16832(d, a, b);   // d += A * B
 *
 * cinfer_cuda_mma_check (host) runs both, and their shuffle forms, on a
 * device or the harness for the tests (test_backend_ops): one warp, one
 * product and one load of each.
 */
#ifndef CINFER_CUDA_MMA_CUH
#define CINFER_CUDA_MMA_CUH

#include <cuda_runtime_api.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* One warp on `stream`: d = A * B + C through cinfer_mma_s8_16832, with A
 * [16][32] int8 row-major, B [8][32] int8 (column n, k contiguous), C
 * [16][8] int32; and r = cinfer_ldmatrix_x4 over m [4][8][8] uint16
 * (matrix, row, column) staged in shared memory, lane l pointing at row
 * perm[l % 8] of matrix l / 8 (perm [8]: a permutation), so r[l][i] =
 * m[i][perm[l / 4]][2 (l % 4)] | m[i][perm[l / 4]][2 (l % 4) + 1] << 16.
 * d [2][16][8] and r [2][32][4]: [0] from the instruction (the harness's
 * exchange under the harness), [1] from the shuffle forms. Device
 * pointers; synchronises the stream. */
cinfer_status cinfer_cuda_mma_check(cudaStream_t stream, const int8_t *a,
                                    const int8_t *b, const int32_t *c,
                                    int32_t *d, const uint16_t *m,
                                    const int32_t *perm, uint32_t *r);

/* One warp on `stream`: d = A * B + C through cinfer_mma_bf16_16816
 * (bf16 != 0) or cinfer_mma_f16_16816, with A [16][16] and B [8][16]
 * (column n, k contiguous) the 16-bit floats' bits, C [16][8] f32; d
 * [2][16][8]: [0] from the instruction (the harness's exchange), [1] from
 * the shuffle form. Device pointers; synchronises the stream. */
cinfer_status cinfer_cuda_mma_f_check(cudaStream_t stream, int bf16,
                                      const uint16_t *a, const uint16_t *b,
                                      const float *c, float *d);

#ifdef __cplusplus
}
#endif

#if defined(__cplusplus) && (defined(__CUDACC__) || defined(CINFER_CUDASIM))
#include "kernels/cuda/cuda_compat.cuh"

/* The lane of the calling thread in its warp (linear thread id % 32). */
static __device__ __forceinline__ int cinfer_lane(void) {
  return (int)((threadIdx.x +
                blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z)) %
               32u);
}

/* The instructions where the target has them (nvcc for sm_80 and later:
 * mma m16n8k32 .s8 needs sm_80, ldmatrix sm_75); the shuffles elsewhere,
 * on older targets as under the harness. */
#if defined(__CUDACC__) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define CINFER_MMA_PTX 1
#else
#define CINFER_MMA_PTX 0
#endif

/* The signed dot product of two registers of four int8, added to acc
 * modulo 2^32 as the s32 accumulator does. */
static __device__ __forceinline__ unsigned
cinfer_mma_dot4(unsigned x, unsigned y, unsigned acc) {
  for (int i = 0; i < 4; i++)
    acc +=
        (unsigned)((int)(int8_t)(x >> (8 * i)) * (int)(int8_t)(y >> (8 * i)));
  return acc;
}

/* d += A * B over one warp's fragments (the layouts above), through warp
 * shuffles: what cinfer_mma_s8_16832 is on a GPU older than sm_80; under
 * the harness the check kernel (mma.cu) runs it beside the instruction. */
static __device__ __forceinline__ void
cinfer_mma_s8_16832_shfl(int (&d)[4], const unsigned (&a)[4],
                         const unsigned (&b)[2]) {
  const unsigned full = 0xffffffffu;
  const int lane = cinfer_lane(), gid = lane / 4, tid = lane % 4;
  unsigned acc[4] = {(unsigned)d[0], (unsigned)d[1], (unsigned)d[2],
                     (unsigned)d[3]};
  /* k = 4q..4q+3 and 16+4q..: rows gid, gid + 8 from lane 4 gid + q,
   * columns 2 tid, 2 tid + 1 from lanes 4 (2 tid) + q, 4 (2 tid + 1) + q */
  for (int q = 0; q < 4; q++) {
    unsigned ra[4], rb[2][2];
    for (int i = 0; i < 4; i++)
      ra[i] = __shfl_sync(full, a[i], 4 * gid + q);
    for (int c = 0; c < 2; c++)
      for (int i = 0; i < 2; i++)
        rb[c][i] = __shfl_sync(full, b[i], 4 * (2 * tid + c) + q);
    for (int c = 0; c < 2; c++) {
      acc[c] = cinfer_mma_dot4(ra[0], rb[c][0],
                               cinfer_mma_dot4(ra[2], rb[c][1], acc[c]));
      acc[2 + c] = cinfer_mma_dot4(
          ra[1], rb[c][0], cinfer_mma_dot4(ra[3], rb[c][1], acc[2 + c]));
    }
  }
  for (int i = 0; i < 4; i++)
    d[i] = (int)acc[i];
}

/* A 16-bit float's bits (f16, or bf16 when BF16) as f32. */
template <bool BF16>
static __device__ __forceinline__ float cinfer_mma_half(unsigned h) {
  if (BF16)
    return __uint_as_float((h & 0xffffu) << 16);
  return __half2float(__ushort_as_half((unsigned short)(h & 0xffffu)));
}

/* d += A * B over one warp's m16n8k16 fragments (the layouts above),
 * through warp shuffles: each element from its accumulator, then k =
 * 0..15 in order, one fmaf a product (the harness's order too). */
template <bool BF16>
static __device__ __forceinline__ void
cinfer_mma_f_16816_shfl(float (&d)[4], const unsigned (&a)[4],
                        const unsigned (&b)[2]) {
  const unsigned full = 0xffffffffu;
  const int lane = cinfer_lane(), gid = lane / 4, tid = lane % 4;
  /* rows gid, gid + 8 of A and columns 2 tid, 2 tid + 1 of B, by k */
  float ra[2][16], rb[2][16];
  for (int q = 0; q < 4; q++) {
    unsigned x[4], y[2][2];
    for (int i = 0; i < 4; i++)
      x[i] = __shfl_sync(full, a[i], 4 * gid + q);
    for (int c = 0; c < 2; c++)
      for (int i = 0; i < 2; i++)
        y[c][i] = __shfl_sync(full, b[i], 4 * (2 * tid + c) + q);
    for (int e = 0; e < 2; e++) {
      ra[0][2 * q + e] = cinfer_mma_half<BF16>(x[0] >> (16 * e));
      ra[1][2 * q + e] = cinfer_mma_half<BF16>(x[1] >> (16 * e));
      ra[0][8 + 2 * q + e] = cinfer_mma_half<BF16>(x[2] >> (16 * e));
      ra[1][8 + 2 * q + e] = cinfer_mma_half<BF16>(x[3] >> (16 * e));
      for (int c = 0; c < 2; c++) {
        rb[c][2 * q + e] = cinfer_mma_half<BF16>(y[c][0] >> (16 * e));
        rb[c][8 + 2 * q + e] = cinfer_mma_half<BF16>(y[c][1] >> (16 * e));
      }
    }
  }
  for (int i = 0; i < 4; i++) {
    float acc = d[i];
    for (int k = 0; k < 16; k++)
      acc = fmaf(ra[i >> 1][k], rb[i & 1][k], acc);
    d[i] = acc;
  }
}

/* d += A * B, m16n8k16 .f32 .bf16 (the layouts above): the instruction
 * on sm_80 and later, the harness's exchange, the shuffles elsewhere. */
static __device__ __forceinline__ void
cinfer_mma_bf16_16816(float (&d)[4], const unsigned (&a)[4],
                      const unsigned (&b)[2]) {
#if CINFER_MMA_PTX
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                 "r"(b[1]));
#elif defined(CINFER_CUDASIM)
  cudasim_mma_f_16816(1, d, a, b, __FILE__, __LINE__);
#else
  cinfer_mma_f_16816_shfl<true>(d, a, b);
#endif
}

/* The same over .f16 inputs. */
static __device__ __forceinline__ void
cinfer_mma_f16_16816(float (&d)[4], const unsigned (&a)[4],
                     const unsigned (&b)[2]) {
#if CINFER_MMA_PTX
  asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                 "r"(b[1]));
#elif defined(CINFER_CUDASIM)
  cudasim_mma_f_16816(0, d, a, b, __FILE__, __LINE__);
#else
  cinfer_mma_f_16816_shfl<false>(d, a, b);
#endif
}

/* ldmatrix x4 through shuffles (p: this lane's row), for older GPUs. */
static __device__ __forceinline__ void
cinfer_ldmatrix_x4_shfl(unsigned (&r)[4], const void *p) {
  const int lane = cinfer_lane();
  const unsigned long long mine = (unsigned long long)(uintptr_t)p;
  for (int i = 0; i < 4; i++) {
    const unsigned long long row =
        __shfl_sync(0xffffffffu, mine, 8 * i + lane / 4);
    r[i] = *(const unsigned *)((const char *)(uintptr_t)row + 4 * (lane % 4));
  }
}

/* d += A * B over one warp's fragments (the layouts above): the
 * instruction on sm_80 and later, the harness's warp-wide exchange under
 * the harness (tests/cudasim/cudasim.h), the shuffles elsewhere. */
static __device__ __forceinline__ void
cinfer_mma_s8_16832(int (&d)[4], const unsigned (&a)[4],
                    const unsigned (&b)[2]) {
#if CINFER_MMA_PTX
  asm volatile("mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 "
               "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
               : "+r"(d[0]), "+r"(d[1]), "+r"(d[2]), "+r"(d[3])
               : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]),
                 "r"(b[1]));
#elif defined(CINFER_CUDASIM)
  cudasim_mma_s8_16832(d, a, b, __FILE__, __LINE__);
#else
  cinfer_mma_s8_16832_shfl(d, a, b);
#endif
}

/* Four 8x8 matrices of 16-bit elements from shared memory (p: this lane's
 * row, 16-byte aligned), in the layout above. */
static __device__ __forceinline__ void cinfer_ldmatrix_x4(unsigned (&r)[4],
                                                          const void *p) {
#if CINFER_MMA_PTX
  const unsigned s = (unsigned)__cvta_generic_to_shared(p);
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, "
               "[%4];"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
#elif defined(CINFER_CUDASIM)
  cudasim_ldmatrix_x4(r, p, __FILE__, __LINE__);
#else
  cinfer_ldmatrix_x4_shfl(r, p);
#endif
}
#endif
#endif /* CINFER_CUDA_MMA_CUH */
