/*
 * attention.cu - causal paged attention kernels (see attention.cuh).
 *
 * Four kernels, launched on one stream:
 *
 *   prefill_mma_kernel  F16 caches: 64 (row, head) vectors of a tile of
 *                   one KV group, 16 a warp, scores and P V on tensor
 *                   cores (below).
 *   prefill_kernel  otherwise: a tile of consecutive rows of one sequence
 *                   times the query heads of one KV group (up to 32 (row,
 *                   head) "items"), 8 lanes per item; KV tiles of KT tokens
 *                   are gathered through the block table into shared
 *                   memory (fp32), scores and an online softmax stay in
 *                   registers.
 *   decode_kernel   one decode row, one KV head (up to 8 of its query
 *                   heads), one partition of 512 context tokens: scores
 *                   into shared memory (an 8-lane group per token), the
 *                   partition's softmax (a warp per head), then P V (a lane
 *                   group per token, lanes over head_dim).
 *   reduce_kernel   rows with more than one partition: the partitions'
 *                   results weighted by sum_p * exp(max_p - max).
 *
 * Dims are spread over lanes in float4 chunks (lane l of a group of 8 owns
 * dims 32 c + 4 l .. 32 c + 4 l + 3), which is why head_dim is a multiple
 * of 4; a kernel is instantiated for a capacity CAP >= head_dim (32, 64,
 * 96, 128, 192, 256) and masks the dims past head_dim.
 */
#include "kernels/cuda/attention.cuh"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/cuda_compat.cuh"
#include "kernels/cuda/mma.cuh"

/* ---------------------------------------------------------------------- */
/* shared pieces                                                           */
/* ---------------------------------------------------------------------- */

namespace {

constexpr int kWarp = 32;
constexpr unsigned kFull = 0xffffffffu;
constexpr int kPart = CINFER_CUDA_ATTN_PART_TOKENS;
constexpr int kDecodeThreads = 128;
constexpr int kDecodeWarps = kDecodeThreads / kWarp;
constexpr int kDecodeHeads = 8; /* query heads per decode block */
constexpr int kReduceThreads = 128;
constexpr int kPrefillThreads = 256;
constexpr int kItemLanes = 8;
constexpr int kItems = kPrefillThreads / kItemLanes; /* (row, head) pairs */

/* Scalars every kernel takes. */
struct attn_shape {
    int k_f16, v_f16;     /* cache element types: 1 = F16, 0 = F32 */
    int max_blocks;       /* row stride of block_tables */
    int block_size;       /* tokens per KV block */
    int n_heads;          /* query heads */
    int n_kv_heads;       /* KV heads */
    int head_dim;         /* <= CAP, a multiple of 4 */
    int group;            /* query heads per KV head */
    int heads_per_block;  /* query heads of one group a block takes */
    int head_chunks;      /* blocks per KV group: ceil(group / heads_per_block) */
    int rows_per_block;   /* prefill: tile rows a block takes */
    int subs;             /* prefill: blocks per plan tile */
    int max_parts;        /* decode: partition stride of the scratch */
    float scale;          /* score scale */
};

__device__ __forceinline__ float4 zero4()
{
    return make_float4(0.0f, 0.0f, 0.0f, 0.0f);
}

/* Four consecutive cache elements from element idx (a multiple of 4). */
__device__ __forceinline__ float4 load4(const void *__restrict__ base,
                                        int64_t idx, int f16)
{
    if (f16) {
        const __half2 *p = reinterpret_cast<const __half2 *>(
            static_cast<const __half *>(base) + idx);
        float2 a = __half22float2(p[0]);
        float2 b = __half22float2(p[1]);
        return make_float4(a.x, a.y, b.x, b.y);
    }
    return *reinterpret_cast<const float4 *>(static_cast<const float *>(base) +
                                             idx);
}

/* A query against an F16 K cache is rounded to F16 first (GGML). */
__device__ __forceinline__ float round_f16(float x)
{
    return __half2float(__float2half_rn(x));
}

__device__ __forceinline__ float4 load_q4(const float *__restrict__ q,
                                          int64_t idx, int k_f16)
{
    float4 v = *reinterpret_cast<const float4 *>(q + idx);
    if (k_f16) {
        v.x = round_f16(v.x);
        v.y = round_f16(v.y);
        v.z = round_f16(v.z);
        v.w = round_f16(v.w);
    }
    return v;
}

__device__ __forceinline__ float dot4(float4 a, float4 b, float acc)
{
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
    acc = fmaf(a.z, b.z, acc);
    return fmaf(a.w, b.w, acc);
}

/* acc + p * v */
__device__ __forceinline__ float4 axpy4(float p, float4 v, float4 acc)
{
    return make_float4(fmaf(p, v.x, acc.x), fmaf(p, v.y, acc.y),
                       fmaf(p, v.z, acc.z), fmaf(p, v.w, acc.w));
}

__device__ __forceinline__ float4 scale4(float4 v, float s)
{
    return make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
}

__device__ __forceinline__ float4 add4(float4 a, float4 b)
{
    return make_float4(a.x + b.x, a.y + b.y, a.z + b.z, a.w + b.w);
}

__device__ __forceinline__ float4 shfl_xor4(float4 v, int mask)
{
    v.x = __shfl_xor_sync(kFull, v.x, mask);
    v.y = __shfl_xor_sync(kFull, v.y, mask);
    v.z = __shfl_xor_sync(kFull, v.z, mask);
    v.w = __shfl_xor_sync(kFull, v.w, mask);
    return v;
}

/* Sum over the 8 lanes of an item group (every lane of the warp calls). */
__device__ __forceinline__ float group8_sum(float v)
{
    v += __shfl_xor_sync(kFull, v, 4);
    v += __shfl_xor_sync(kFull, v, 2);
    v += __shfl_xor_sync(kFull, v, 1);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
    for (int o = kWarp / 2; o > 0; o /= 2)
        v = fmaxf(v, __shfl_xor_sync(kFull, v, o));
    return v;
}

__device__ __forceinline__ float warp_sum(float v)
{
    for (int o = kWarp / 2; o > 0; o /= 2)
        v += __shfl_xor_sync(kFull, v, o);
    return v;
}

/* Element offset of position t's row of KV head g. */
__device__ __forceinline__ int64_t kv_offset(const int32_t *__restrict__ bt,
                                             int t, int g,
                                             const attn_shape &p)
{
    int64_t slot = (int64_t)bt[t / p.block_size] * p.block_size +
                   t % p.block_size;
    return (slot * p.n_kv_heads + g) * p.head_dim;
}

/* ---------------------------------------------------------------------- */
/* prefill tiles                                                           */
/* ---------------------------------------------------------------------- */

/*
 * Items are (row t, head hh) pairs, item = t * heads_per_block + hh, so a
 * KV tile in shared memory serves rows_per_block rows times the group's
 * heads. Items past the tile's rows or the group's heads compute item 0's
 * values and store nothing, so every warp stays whole for the shuffles.
 * The KV walk ends at the tile's last position; keys past an item's own
 * position get score -inf. Key 0 is in the first KV tile and visible to
 * every row, so the running max is finite from the first tile on.
 */
// Grid: (n_tiles * subs, n_kv_heads * head_chunks); block: kPrefillThreads.
template <int CAP>
__global__ void __launch_bounds__(kPrefillThreads)
    prefill_kernel(float *__restrict__ out,      // [n_rows, n_heads, head_dim]
                   const float *__restrict__ q,  // [n_rows, n_heads, head_dim]
                   const void *__restrict__ k_cache, // [n_blocks, block_size,
                                                     //  n_kv_heads, head_dim]
                   const void *__restrict__ v_cache, // [n_blocks, block_size,
                                                     //  n_kv_heads, head_dim]
                   const int32_t *__restrict__ positions,    // [n_rows]
                   const int32_t *__restrict__ row_seq,      // [n_rows]
                   const int32_t *__restrict__ block_tables, // [n_seqs,
                                                             //  max_blocks]
                   const int32_t *__restrict__ tiles, // [n_tiles, 2] first
                                                      // row, rows
                   attn_shape p)
{
    constexpr int KT = CAP <= 128 ? 32 : 16; /* keys per KV tile */
    constexpr int C4 = CAP / 4;              /* float4s of a head row */
    constexpr int NCH = CAP / 32;            /* float4s per lane */
    CINFER_SHARED(float4, ks, [KT][C4]);
    CINFER_SHARED(float4, vs, [KT][C4]);
    CINFER_SHARED(long long, kbase, [KT]);

    const int tile = blockIdx.x / p.subs, sub = blockIdx.x % p.subs;
    const int row0 = tiles[2 * tile], tile_rows = tiles[2 * tile + 1];
    const int srow = sub * p.rows_per_block;
    if (srow >= tile_rows)
        return; /* the whole block, before any barrier */
    const int sn = min(p.rows_per_block, tile_rows - srow);
    const int g = blockIdx.y / p.head_chunks;
    const int hbase = (blockIdx.y % p.head_chunks) * p.heads_per_block;
    const int nh = min(p.heads_per_block, p.group - hbase);
    const int first = row0 + srow;
    const int pos0 = positions[first];
    const int pos_last = pos0 + sn - 1;
    const int32_t *bt = block_tables + (int64_t)row_seq[first] * p.max_blocks;
    const int hd = p.head_dim;
    const int tid = threadIdx.x;
    const int l8 = tid % kItemLanes;

    int t = (tid / kItemLanes) / p.heads_per_block;
    int hh = (tid / kItemLanes) % p.heads_per_block;
    const bool valid = t < sn && hh < nh;
    if (!valid)
        t = hh = 0;
    const int my_pos = pos0 + t;
    const int64_t qo =
        ((int64_t)(first + t) * p.n_heads + g * p.group + hbase + hh) * hd;

    float4 qr[NCH], o[NCH];
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        const int d = 32 * c + 4 * l8;
        qr[c] = d < hd ? load_q4(q, qo + d, p.k_f16) : zero4();
        o[c] = zero4();
    }
    float m = -INFINITY, l = 0.0f;

    for (int kt0 = 0; kt0 <= pos_last; kt0 += KT) {
        __syncthreads(); /* the previous KV tile is consumed */
        if (tid < KT) {
            const int kt = kt0 + tid;
            kbase[tid] = kt <= pos_last ? (long long)kv_offset(bt, kt, g, p)
                                        : -1LL;
        }
        __syncthreads();
        for (int e = tid; e < KT * C4; e += kPrefillThreads) {
            const int j = e / C4, c = e % C4;
            const long long b = kbase[j];
            float4 kv = zero4(), vv = zero4();
            if (b >= 0 && 4 * c < hd) {
                kv = load4(k_cache, b + 4 * c, p.k_f16);
                vv = load4(v_cache, b + 4 * c, p.v_f16);
            }
            ks[j][c] = kv;
            vs[j][c] = vv;
        }
        __syncthreads();

        float s[KT];
        float mt = m;
#pragma unroll
        for (int j = 0; j < KT; j++) {
            float x = 0.0f;
#pragma unroll
            for (int c = 0; c < NCH; c++)
                x = dot4(qr[c], ks[j][8 * c + l8], x);
            x = group8_sum(x);
            s[j] = kt0 + j <= my_pos ? x * p.scale : -INFINITY;
            mt = fmaxf(mt, s[j]);
        }
        const float corr = expf(m - mt); /* 0 on the first tile */
        l *= corr;
#pragma unroll
        for (int c = 0; c < NCH; c++)
            o[c] = scale4(o[c], corr);
#pragma unroll
        for (int j = 0; j < KT; j++) {
            const float pr = expf(s[j] - mt);
            l += pr;
#pragma unroll
            for (int c = 0; c < NCH; c++)
                o[c] = axpy4(pr, vs[j][8 * c + l8], o[c]);
        }
        m = mt;
    }

    if (!valid)
        return; /* no barrier follows */
    const float inv = 1.0f / l;
#pragma unroll
    for (int c = 0; c < NCH; c++) {
        const int d = 32 * c + 4 * l8;
        if (d < hd)
            *reinterpret_cast<float4 *>(out + qo + d) = scale4(o[c], inv);
    }
}

/* ---------------------------------------------------------------------- */
/* prefill tiles on tensor cores (F16 caches)                              */
/* ---------------------------------------------------------------------- */

/*
 * Flash-attention 2's loop on mma.sync m16n8k16 (f16 inputs, f32
 * accumulators; mma.cuh). A block takes 64 query vectors (row, head) of
 * one tile and KV group, 16 per warp, vector v = row * group + head. Each
 * KV tile of kMmaKeys keys is staged as F16: K as it is, V transposed,
 * so both are B fragments of 32-bit reads. Per KV tile a warp computes
 * its 16 x kMmaKeys scores (Q rounded to F16, as for the cores kernel),
 * masks the keys past each vector's position, updates the running max
 * and sum, rounds the weights to F16 (the sum is of the rounded weights,
 * so they normalise exactly) and adds P V. The KV tiles start at
 * multiples of kMmaKeys, and a tile wholly past a vector's position
 * leaves its max, sum and output exactly as they were (its weights are
 * 0, its correction exp(0) = 1), so a vector's bits depend on its own
 * row, head and context only, never on the tile around it.
 *
 * Vectors past the tile compute vector 0's values and store nothing, so
 * every warp stays whole for the instructions.
 */
constexpr int kMmaThreads = 128;
constexpr int kMmaVectors = 64; /* query vectors per block: 16 a warp */
constexpr int kMmaKeys = 32;    /* keys per KV tile */

__device__ __forceinline__ unsigned pack_half2(float lo, float hi)
{
    const unsigned a = __half_as_ushort(__float2half_rn(lo));
    const unsigned b = __half_as_ushort(__float2half_rn(hi));
    return a | b << 16;
}

__device__ __forceinline__ float half_lo(unsigned x)
{
    return __half2float(__ushort_as_half((unsigned short)(x & 0xffffu)));
}

__device__ __forceinline__ float half_hi(unsigned x)
{
    return __half2float(__ushort_as_half((unsigned short)(x >> 16)));
}

// Grid: (n_tiles * subs, n_kv_heads); block: kMmaThreads.
template <int CAP>
__global__ void __launch_bounds__(kMmaThreads, 1)
    prefill_mma_kernel(float *__restrict__ out,     // [n_rows, n_heads, hd]
                       const float *__restrict__ q, // [n_rows, n_heads, hd]
                       const __half *__restrict__ k_cache,
                       const __half *__restrict__ v_cache,
                       const int32_t *__restrict__ positions,
                       const int32_t *__restrict__ row_seq,
                       const int32_t *__restrict__ block_tables,
                       const int32_t *__restrict__ tiles, attn_shape p)
{
    constexpr int KLD = CAP + 8;       /* a staged K row, padded */
    constexpr int VLD = kMmaKeys + 8;  /* a staged V^T row, padded */
    constexpr int KS = CAP / 16;       /* mma steps over head_dim */
    constexpr int DN = CAP / 8;        /* output fragments over head_dim */
    CINFER_SHARED(uint4, ks4, [kMmaKeys * KLD / 8]);
    CINFER_SHARED(uint4, vs4, [CAP * VLD / 8]);
    CINFER_SHARED(long long, kbase, [kMmaKeys]);
    unsigned short *ks = reinterpret_cast<unsigned short *>(ks4);
    unsigned short *vs = reinterpret_cast<unsigned short *>(vs4);

    const int tile = blockIdx.x / p.subs, sub = blockIdx.x % p.subs;
    const int row0 = tiles[2 * tile], tile_rows = tiles[2 * tile + 1];
    const int nvec = tile_rows * p.group;
    const int vbase = sub * kMmaVectors;
    if (vbase >= nvec)
        return; /* the whole block, before any barrier */
    const int g = blockIdx.y;
    const int hd = p.head_dim;
    const int t = threadIdx.x, warp = t / kWarp, lane = t % kWarp;
    const int gid = lane / 4, tq = lane % 4;
    const int pos0 = positions[row0];
    const int vlast = min(vbase + kMmaVectors, nvec) - 1;
    const int pos_last = pos0 + vlast / p.group;
    const int32_t *bt = block_tables + (int64_t)row_seq[row0] * p.max_blocks;

    /* this lane's two vectors: rows gid and gid + 8 of its warp's 16 */
    int vpos[2], vidx[2]; /* position; row * n_heads + head */
    bool vok[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const int v = vbase + warp * 16 + gid + 8 * h;
        vok[h] = v < nvec;
        const int vv = vok[h] ? v : 0;
        vpos[h] = pos0 + vv / p.group;
        vidx[h] = (row0 + vv / p.group) * p.n_heads + g * p.group +
                  vv % p.group;
    }
    unsigned qa[KS][4];
#pragma unroll
    for (int s = 0; s < KS; s++) {
        const int d0 = s * 16 + 2 * tq, d1 = d0 + 8;
#pragma unroll
        for (int h = 0; h < 2; h++) {
            const float *qr = q + (int64_t)vidx[h] * hd;
            qa[s][h] = d0 < hd ? pack_half2(qr[d0], qr[d0 + 1]) : 0u;
            qa[s][2 + h] = d1 < hd ? pack_half2(qr[d1], qr[d1 + 1]) : 0u;
        }
    }
    float o[DN][4];
#pragma unroll
    for (int j = 0; j < DN; j++)
        o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};

    for (int kt0 = 0; kt0 <= pos_last; kt0 += kMmaKeys) {
        __syncthreads(); /* the previous KV tile is consumed */
        if (t < kMmaKeys) {
            const int kt = kt0 + t;
            kbase[t] = kt <= pos_last ? (long long)kv_offset(bt, kt, g, p)
                                      : -1LL;
        }
        __syncthreads();
        for (int e = t; e < kMmaKeys * (CAP / 8); e += kMmaThreads) {
            const int j = e / (CAP / 8), c8 = (e % (CAP / 8)) * 8;
            const long long b = kbase[j];
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (b >= 0 && c8 < hd) {
                kv = *reinterpret_cast<const uint4 *>(k_cache + b + c8);
                vv = *reinterpret_cast<const uint4 *>(v_cache + b + c8);
            }
            *reinterpret_cast<uint4 *>(ks + j * KLD + c8) = kv;
            const unsigned w4[4] = {vv.x, vv.y, vv.z, vv.w};
#pragma unroll
            for (int i = 0; i < 8; i++) /* by value: no aliasing */
                vs[(c8 + i) * VLD + j] =
                    (unsigned short)(w4[i / 2] >> (16 * (i % 2)));
        }
        __syncthreads();

        /* scores: 16 vectors x kMmaKeys keys, 8 keys a fragment */
        float sc[kMmaKeys / 8][4];
#pragma unroll
        for (int n = 0; n < kMmaKeys / 8; n++) {
            sc[n][0] = sc[n][1] = sc[n][2] = sc[n][3] = 0.0f;
#pragma unroll
            for (int s = 0; s < KS; s++) {
                const unsigned short *kr =
                    ks + (n * 8 + gid) * KLD + s * 16 + 2 * tq;
                const unsigned b[2] = {*reinterpret_cast<const unsigned *>(kr),
                                       *reinterpret_cast<const unsigned *>(kr + 8)};
                cinfer_mma_f16_16816(sc[n], qa[s], b);
            }
        }
        float mt[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < kMmaKeys / 8; n++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int h = i >> 1, key = kt0 + n * 8 + 2 * tq + (i & 1);
                sc[n][i] = key <= vpos[h] ? sc[n][i] * p.scale : -INFINITY;
                mt[h] = fmaxf(mt[h], sc[n][i]);
            }
#pragma unroll
        for (int h = 0; h < 2; h++) { /* over the 4 lanes of a row */
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(kFull, mt[h], 1));
            mt[h] = fmaxf(mt[h], __shfl_xor_sync(kFull, mt[h], 2));
        }
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            corr[h] = expf(m[h] - mt[h]); /* 0 on the first tile */
            l[h] *= corr[h];
            m[h] = mt[h];
        }
#pragma unroll
        for (int j = 0; j < DN; j++)
#pragma unroll
            for (int i = 0; i < 4; i++)
                o[j][i] *= corr[i >> 1];
        /* weights as F16 A fragments: keys 16 s .. 16 s + 15 */
        unsigned pa[kMmaKeys / 16][4];
#pragma unroll
        for (int s = 0; s < kMmaKeys / 16; s++)
#pragma unroll
            for (int half = 0; half < 2; half++) {
                const int n = 2 * s + half;
#pragma unroll
                for (int h = 0; h < 2; h++) {
                    const unsigned w = pack_half2(expf(sc[n][2 * h] - mt[h]),
                                                  expf(sc[n][2 * h + 1] - mt[h]));
                    pa[s][2 * half + h] = w;
                    l[h] += half_lo(w) + half_hi(w);
                }
            }
#pragma unroll
        for (int s = 0; s < kMmaKeys / 16; s++)
#pragma unroll
            for (int j = 0; j < DN; j++) {
                const unsigned short *vr =
                    vs + (j * 8 + gid) * VLD + s * 16 + 2 * tq;
                const unsigned b[2] = {*reinterpret_cast<const unsigned *>(vr),
                                       *reinterpret_cast<const unsigned *>(vr + 8)};
                cinfer_mma_f16_16816(o[j], pa[s], b);
            }
    }

    float inv[2];
#pragma unroll
    for (int h = 0; h < 2; h++) {
        float sum = l[h];
        sum += __shfl_xor_sync(kFull, sum, 1);
        sum += __shfl_xor_sync(kFull, sum, 2);
        inv[h] = 1.0f / sum;
    }
#pragma unroll
    for (int j = 0; j < DN; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            const int h = i >> 1, d = j * 8 + 2 * tq + (i & 1);
            if (vok[h] && d < hd)
                out[(int64_t)vidx[h] * hd + d] = o[j][i] * inv[h];
        }
}

/* ---------------------------------------------------------------------- */
/* decode rows                                                             */
/* ---------------------------------------------------------------------- */

/* P V: lanes per token and float4 chunks per lane for a head row of CAP. */
template <int CAP> struct pv_layout {
    static constexpr int W = CAP >= 96 ? 32 : CAP / 4;
    static constexpr int TPW = kWarp / W; /* tokens per warp per step */
    static constexpr int NPV = (CAP / 4 + W - 1) / W;
};

/*
 * Scratch of a row with several partitions, decode row i, head h,
 * partition k: part_ml[((i * n_heads + h) * max_parts + k) * 2 + {0, 1}] =
 * the partition's max score and sum of exp(score - max); part_out[(same
 * index) * head_dim + d] = its output normalised by that sum.
 */
// Grid: (n_decode, n_kv_heads * head_chunks, max_parts); block:
// kDecodeThreads.
template <int CAP>
__global__ void __launch_bounds__(kDecodeThreads, 4)
    decode_kernel(float *__restrict__ out,      // [n_rows, n_heads, head_dim]
                  float *__restrict__ part_ml,  // [n_decode, n_heads,
                                                //  max_parts, 2]
                  float *__restrict__ part_out, // [n_decode, n_heads,
                                                //  max_parts, head_dim]
                  const float *__restrict__ q,  // [n_rows, n_heads, head_dim]
                  const void *__restrict__ k_cache, // [n_blocks, block_size,
                                                    //  n_kv_heads, head_dim]
                  const void *__restrict__ v_cache, // [n_blocks, block_size,
                                                    //  n_kv_heads, head_dim]
                  const int32_t *__restrict__ positions,    // [n_rows]
                  const int32_t *__restrict__ row_seq,      // [n_rows]
                  const int32_t *__restrict__ block_tables, // [n_seqs,
                                                            //  max_blocks]
                  const int32_t *__restrict__ decode_rows,  // [n_decode]
                  attn_shape p)
{
    constexpr int C4 = CAP / 4;
    constexpr int NCH = CAP / 32;
    using L = pv_layout<CAP>;
    CINFER_SHARED(float4, qs, [kDecodeHeads][C4]);
    CINFER_SHARED(float, logits, [kDecodeHeads][kPart]);
    CINFER_SHARED(float4, red, [kDecodeHeads][C4]);
    CINFER_SHARED(float, stat, [kDecodeHeads][2]);

    const int i = blockIdx.x;
    const int r = decode_rows[i];
    const int len = positions[r] + 1;
    const int n_parts = (len + kPart - 1) / kPart;
    const int part = blockIdx.z;
    if (part >= n_parts)
        return; /* the whole block, before any barrier */
    const int g = blockIdx.y / p.head_chunks;
    const int hbase = (blockIdx.y % p.head_chunks) * p.heads_per_block;
    const int nh = min(p.heads_per_block, p.group - hbase);
    const int h0 = g * p.group + hbase;
    const int t0 = part * kPart;
    const int n = min(len - t0, kPart);
    const int hd = p.head_dim;
    const int tid = threadIdx.x, lane = tid % kWarp, warp = tid / kWarp;
    const int32_t *bt = block_tables + (int64_t)row_seq[r] * p.max_blocks;

    for (int e = tid; e < kDecodeHeads * C4; e += kDecodeThreads) {
        const int h = e / C4, c = e % C4;
        float4 v = zero4();
        if (h < nh && 4 * c < hd)
            v = load_q4(q, ((int64_t)r * p.n_heads + h0 + h) * hd + 4 * c,
                        p.k_f16);
        qs[h][c] = v;
    }
    __syncthreads();

    /* Scores: an 8-lane group per token, 4 tokens per warp a step. */
    {
        const int sub = lane / kItemLanes, l8 = lane % kItemLanes;
        for (int jb = warp * 4; jb < n; jb += kDecodeWarps * 4) {
            const int j = jb + sub;
            float4 k[NCH];
            const int64_t b = j < n ? kv_offset(bt, t0 + j, g, p) : 0;
#pragma unroll
            for (int c = 0; c < NCH; c++) {
                const int d = 32 * c + 4 * l8;
                k[c] = j < n && d < hd ? load4(k_cache, b + d, p.k_f16)
                                       : zero4();
            }
#pragma unroll
            for (int h = 0; h < kDecodeHeads; h++) {
                if (h < nh) { /* uniform across the block */
                    float x = 0.0f;
#pragma unroll
                    for (int c = 0; c < NCH; c++)
                        x = dot4(k[c], qs[h][8 * c + l8], x);
                    x = group8_sum(x);
                    if (l8 == 0 && j < n)
                        logits[h][j] = x * p.scale;
                }
            }
        }
    }
    __syncthreads();

    /* The partition's softmax, a warp per head. */
    for (int h = warp; h < nh; h += kDecodeWarps) {
        float mx = -INFINITY;
        for (int j = lane; j < n; j += kWarp)
            mx = fmaxf(mx, logits[h][j]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int j = lane; j < n; j += kWarp) {
            const float e = expf(logits[h][j] - mx);
            logits[h][j] = e;
            sum += e;
        }
        sum = warp_sum(sum);
        if (lane == 0) {
            stat[h][0] = mx;
            stat[h][1] = sum;
        }
    }
    __syncthreads();

    /* P V: a group of L::W lanes per token, lanes over head_dim. */
    const int ws = lane / L::W, lw = lane % L::W;
    float4 acc[kDecodeHeads][L::NPV];
#pragma unroll
    for (int h = 0; h < kDecodeHeads; h++)
#pragma unroll
        for (int c = 0; c < L::NPV; c++)
            acc[h][c] = zero4();
    for (int jb = warp * L::TPW; jb < n; jb += kDecodeWarps * L::TPW) {
        const int j = jb + ws;
        if (j < n) {
            const int64_t b = kv_offset(bt, t0 + j, g, p);
#pragma unroll
            for (int c = 0; c < L::NPV; c++) {
                const int d = 4 * (lw + L::W * c);
                const float4 v =
                    d < hd ? load4(v_cache, b + d, p.v_f16) : zero4();
#pragma unroll
                for (int h = 0; h < kDecodeHeads; h++)
                    if (h < nh)
                        acc[h][c] = axpy4(logits[h][j], v, acc[h][c]);
            }
        }
    }
    /* the warp's token groups, then the warps in order (deterministic) */
#pragma unroll
    for (int o = L::W; o < kWarp; o *= 2)
#pragma unroll
        for (int h = 0; h < kDecodeHeads; h++)
#pragma unroll
            for (int c = 0; c < L::NPV; c++)
                acc[h][c] = add4(acc[h][c], shfl_xor4(acc[h][c], o));
    for (int w = 0; w < kDecodeWarps; w++) {
        if (warp == w && ws == 0) {
#pragma unroll
            for (int h = 0; h < kDecodeHeads; h++) {
#pragma unroll
                for (int c = 0; c < L::NPV; c++) {
                    const int c4 = lw + L::W * c;
                    if (h < nh && 4 * c4 < hd)
                        red[h][c4] =
                            w == 0 ? acc[h][c] : add4(red[h][c4], acc[h][c]);
                }
            }
        }
        __syncthreads();
    }

    const int hd4 = hd / 4;
    for (int e = tid; e < nh * hd4; e += kDecodeThreads) {
        const int h = e / hd4, c = e % hd4;
        const float4 v = scale4(red[h][c], 1.0f / stat[h][1]);
        float *dst;
        if (n_parts == 1)
            dst = out + ((int64_t)r * p.n_heads + h0 + h) * hd;
        else
            dst = part_out +
                  (((int64_t)i * p.n_heads + h0 + h) * p.max_parts + part) * hd;
        *reinterpret_cast<float4 *>(dst + 4 * c) = v;
    }
    if (n_parts > 1 && tid < nh) {
        float *ml =
            part_ml + (((int64_t)i * p.n_heads + h0 + tid) * p.max_parts + part) * 2;
        ml[0] = stat[tid][0];
        ml[1] = stat[tid][1];
    }
}

/* Combines the partitions of decode rows that have more than one. */
// Grid: (n_decode, n_heads); block: kReduceThreads; dynamic shared memory:
// max_parts floats.
__global__ void __launch_bounds__(kReduceThreads)
    reduce_kernel(float *__restrict__ out,            // [n_rows, n_heads,
                                                      //  head_dim]
                  const float *__restrict__ part_ml,  // [n_decode, n_heads,
                                                      //  max_parts, 2]
                  const float *__restrict__ part_out, // [n_decode, n_heads,
                                                      //  max_parts, head_dim]
                  const int32_t *__restrict__ positions,   // [n_rows]
                  const int32_t *__restrict__ decode_rows, // [n_decode]
                  int n_heads, int head_dim, int max_parts)
{
    CINFER_DYN_SHARED(float, weight); /* [max_parts] */
    CINFER_SHARED(float, total, [1]);

    const int i = blockIdx.x, h = blockIdx.y;
    const int r = decode_rows[i];
    const int n_parts = (positions[r] + 1 + kPart - 1) / kPart;
    if (n_parts <= 1)
        return; /* decode_kernel wrote it; the whole block exits */
    const int64_t at = ((int64_t)i * n_heads + h) * max_parts;
    const float *ml = part_ml + at * 2;
    const int tid = threadIdx.x;
    if (tid < kWarp) {
        float mx = -INFINITY;
        for (int k = tid; k < n_parts; k += kWarp)
            mx = fmaxf(mx, ml[2 * k]);
        mx = warp_max(mx);
        float sum = 0.0f;
        for (int k = tid; k < n_parts; k += kWarp) {
            const float w = ml[2 * k + 1] * expf(ml[2 * k] - mx);
            weight[k] = w;
            sum += w;
        }
        sum = warp_sum(sum);
        if (tid == 0)
            total[0] = sum;
    }
    __syncthreads();

    const float inv = 1.0f / total[0];
    const float *po = part_out + at * head_dim;
    for (int d = 4 * tid; d < head_dim; d += 4 * kReduceThreads) {
        float4 acc = zero4();
        for (int k = 0; k < n_parts; k++)
            acc = axpy4(weight[k],
                        *reinterpret_cast<const float4 *>(po + (int64_t)k *
                                                                   head_dim +
                                                          d),
                        acc);
        *reinterpret_cast<float4 *>(out + ((int64_t)r * n_heads + h) * head_dim +
                                    d) = scale4(acc, inv);
    }
}

/* ---------------------------------------------------------------------- */
/* host side                                                               */
/* ---------------------------------------------------------------------- */

int64_t ceil_div(int64_t a, int64_t b)
{
    return (a + b - 1) / b;
}

/* Floats of part_ml, rounded up so part_out starts 16-byte aligned. */
int64_t ml_floats(int64_t n_decode, int64_t n_heads, int64_t max_parts)
{
    return (n_decode * n_heads * max_parts * 2 + 3) & ~(int64_t)3;
}

/* Which kernel prefill tiles take: CINFER_CUDA_PREFILL=cores or =mma in
 * the environment (read once), or cinfer_cuda_attention_force_prefill;
 * by default tensor cores where they apply (both caches F16, head_dim a
 * multiple of 8 up to 128). */
int g_prefill_forced = -1; /* -1 unread, 0 auto, 1 cores, 2 mma */

int prefill_choice()
{
    int f = __atomic_load_n(&g_prefill_forced, __ATOMIC_RELAXED);
    if (f < 0) {
        const char *e = getenv("CINFER_CUDA_PREFILL");
        f = !e                        ? 0
            : strcmp(e, "cores") == 0 ? 1
            : strcmp(e, "mma") == 0   ? 2
                                      : 0;
        int unread = -1;
        __atomic_compare_exchange_n(&g_prefill_forced, &unread, f, false,
                                    __ATOMIC_RELAXED, __ATOMIC_RELAXED);
        f = __atomic_load_n(&g_prefill_forced, __ATOMIC_RELAXED);
    }
    return f;
}

template <int MCAP>
cinfer_status launch_prefill_mma(const cinfer_cuda_attn_args *a,
                                 attn_shape sh)
{
    attn_shape p = sh;
    p.subs = (int)ceil_div((int64_t)CINFER_CUDA_ATTN_TILE_ROWS * sh.group,
                           kMmaVectors);
    dim3 grid((unsigned)(a->plan.n_tiles * p.subs), (unsigned)a->n_kv_heads);
    CINFER_LAUNCH(prefill_mma_kernel<MCAP>, grid, dim3(kMmaThreads), 0,
                  a->stream, a->out, a->q,
                  static_cast<const __half *>(a->k_cache),
                  static_cast<const __half *>(a->v_cache), a->positions,
                  a->row_seq, a->block_tables, a->plan_ints, p);
    CINFER_CUDA_TRY_LAUNCH("attention prefill_mma_kernel");
    return CINFER_OK;
}

/* The tensor-core kernel's capacity for the prefill tiles of a call, or
 * 0 for the cores kernel. */
int prefill_mma_cap(const cinfer_cuda_attn_args *a)
{
    const int choice = prefill_choice();
    if (choice == 1 || a->k_dtype != CINFER_DTYPE_F16 ||
        a->v_dtype != CINFER_DTYPE_F16 || a->head_dim % 8 != 0 ||
        a->head_dim > 128)
        return 0;
    return a->head_dim <= 16 ? 16 : a->head_dim <= 32 ? 32
           : a->head_dim <= 64 ? 64 : 128;
}

template <int CAP>
cinfer_status launch(const cinfer_cuda_attn_args *a, attn_shape sh)
{
    const cinfer_cuda_attn_plan_info *pi = &a->plan;
    const int mcap = pi->n_tiles > 0 ? prefill_mma_cap(a) : 0;
    if (mcap > 0) {
        cinfer_status st =
            mcap == 16   ? launch_prefill_mma<16>(a, sh)
            : mcap == 32 ? launch_prefill_mma<32>(a, sh)
            : mcap == 64 ? launch_prefill_mma<64>(a, sh)
                         : launch_prefill_mma<128>(a, sh);
        if (st != CINFER_OK)
            return st;
    } else if (pi->n_tiles > 0) {
        attn_shape p = sh;
        p.heads_per_block = sh.group < kItems ? sh.group : kItems;
        p.head_chunks = (int)ceil_div(sh.group, p.heads_per_block);
        p.rows_per_block = sh.group < kItems ? kItems / sh.group : 1;
        p.subs = (int)ceil_div(CINFER_CUDA_ATTN_TILE_ROWS, p.rows_per_block);
        dim3 grid((unsigned)(pi->n_tiles * p.subs),
                  (unsigned)(a->n_kv_heads * p.head_chunks));
        CINFER_LAUNCH(prefill_kernel<CAP>, grid, dim3(kPrefillThreads), 0,
                      a->stream, a->out, a->q, a->k_cache, a->v_cache,
                      a->positions, a->row_seq, a->block_tables, a->plan_ints,
                      p);
        CINFER_CUDA_TRY_LAUNCH("attention prefill_kernel");
    }
    if (pi->n_decode > 0) {
        attn_shape p = sh;
        p.heads_per_block = sh.group < kDecodeHeads ? sh.group : kDecodeHeads;
        p.head_chunks = (int)ceil_div(sh.group, p.heads_per_block);
        p.max_parts = pi->max_parts;
        float *ml = static_cast<float *>(a->scratch);
        float *po = pi->max_parts > 1
                        ? ml + ml_floats(pi->n_decode, a->n_heads, pi->max_parts)
                        : NULL;
        const int32_t *rows = a->plan_ints + 2 * (int64_t)pi->n_tiles;
        dim3 grid((unsigned)pi->n_decode,
                  (unsigned)(a->n_kv_heads * p.head_chunks),
                  (unsigned)pi->max_parts);
        CINFER_LAUNCH(decode_kernel<CAP>, grid, dim3(kDecodeThreads), 0,
                      a->stream, a->out, ml, po, a->q, a->k_cache, a->v_cache,
                      a->positions, a->row_seq, a->block_tables, rows, p);
        CINFER_CUDA_TRY_LAUNCH("attention decode_kernel");
        if (pi->max_parts > 1) {
            dim3 rgrid((unsigned)pi->n_decode, (unsigned)a->n_heads);
            size_t smem = sizeof(float) * (size_t)pi->max_parts;
            CINFER_LAUNCH(reduce_kernel, rgrid, dim3(kReduceThreads), smem,
                          a->stream, a->out, ml, po, a->positions, rows,
                          a->n_heads, a->head_dim, pi->max_parts);
            CINFER_CUDA_TRY_LAUNCH("attention reduce_kernel");
        }
    }
    return CINFER_OK;
}

/* The kernel capacity for a head_dim (0 = unsupported). */
int head_cap(int head_dim)
{
    if (head_dim < 4 || head_dim % 4 != 0)
        return 0;
    switch ((head_dim + 31) / 32) {
    case 1: return 32;
    case 2: return 64;
    case 3: return 96;
    case 4: return 128;
    case 5:
    case 6: return 192;
    case 7:
    case 8: return 256;
    default: return 0;
    }
}

bool aligned(const void *p, size_t to)
{
    return ((uintptr_t)p & (to - 1)) == 0;
}

size_t dtype_bytes(cinfer_dtype dt)
{
    return dt == CINFER_DTYPE_F16 ? 2 : 4;
}

} // namespace

/* ---------------------------------------------------------------------- */
/* plan and launcher                                                       */
/* ---------------------------------------------------------------------- */

extern "C" void cinfer_cuda_attention_force_prefill(int kind)
{
    __atomic_store_n(&g_prefill_forced, kind < 0 || kind > 2 ? 0 : kind,
                     __ATOMIC_RELAXED);
}

extern "C" size_t cinfer_cuda_attention_plan_ints(const cinfer_step *s)
{
    return s && s->n_rows > 0 ? 2 * (size_t)s->n_rows : 0;
}

/* Tiles are maximal runs (capped at CINFER_CUDA_ATTN_TILE_ROWS) of rows of
 * one sequence at consecutive positions; a run of one is a decode row. A
 * first pass counts the tiles so the decode rows can follow them. */
extern "C" cinfer_status cinfer_cuda_attention_plan(
    const cinfer_step *s, int32_t *plan, size_t n_ints,
    cinfer_cuda_attn_plan_info *info)
{
    if (!s || !plan || !info || s->n_rows < 1 || !s->positions || !s->row_seq)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention plan: no step or no output");
    if (n_ints < cinfer_cuda_attention_plan_ints(s))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention plan: %zu ints, need %zu", n_ints,
                                cinfer_cuda_attention_plan_ints(s));
    const int32_t n = s->n_rows;
    const int32_t *pos = s->positions, *seq = s->row_seq;
    cinfer_cuda_attn_plan_info in = {0, 0, 0, 0};
    for (int pass = 0; pass < 2; pass++) {
        int32_t tiles = 0, decode = 0;
        for (int32_t r = 0; r < n;) {
            int32_t e = r + 1;
            while (e < n && e - r < CINFER_CUDA_ATTN_TILE_ROWS &&
                   seq[e] == seq[r] && pos[e] == pos[e - 1] + 1)
                e++;
            if (e - r == 1) {
                if (pass == 1)
                    plan[2 * in.n_tiles + decode] = r;
                decode++;
                int32_t parts = (int32_t)ceil_div((int64_t)pos[r] + 1, kPart);
                if (parts > in.max_parts)
                    in.max_parts = parts;
            } else {
                if (pass == 1) {
                    plan[2 * tiles] = r;
                    plan[2 * tiles + 1] = e - r;
                }
                tiles++;
            }
            for (int32_t k = r; k < e; k++)
                if (pos[k] + 1 > in.max_context)
                    in.max_context = pos[k] + 1;
            r = e;
        }
        in.n_tiles = tiles;
        in.n_decode = decode;
    }
    *info = in;
    return CINFER_OK;
}

extern "C" size_t cinfer_cuda_attention_scratch_bytes(int32_t n_rows,
                                                      int n_heads,
                                                      int head_dim,
                                                      int32_t max_context)
{
    const int64_t parts = ceil_div(max_context, kPart);
    if (n_rows < 1 || n_heads < 1 || head_dim < 1 || parts <= 1)
        return 0;
    const int64_t ml = ml_floats(n_rows, n_heads, parts);
    return sizeof(float) *
           (size_t)(ml + (int64_t)n_rows * n_heads * parts * head_dim);
}

extern "C" cinfer_status cinfer_cuda_attention(const cinfer_cuda_attn_args *a)
{
    if (!a || !a->q || !a->k_cache || !a->v_cache || !a->out ||
        !a->positions || !a->row_seq || !a->block_tables || !a->plan_ints)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: a pointer argument is NULL");
    if (a->n_rows < 1 || a->n_seqs < 1 || a->max_blocks < 1 ||
        a->block_size < 1 || a->n_kv_heads < 1 || a->n_heads < 1 ||
        a->n_heads % a->n_kv_heads != 0 || !isfinite(a->scale))
        return cinfer_set_error(
            CINFER_E_INVALID_ARG,
            "attention: bad shape (rows %d, seqs %d, max_blocks %d, "
            "block_size %d, heads %d / %d)",
            (int)a->n_rows, (int)a->n_seqs, (int)a->max_blocks,
            (int)a->block_size, a->n_heads, a->n_kv_heads);
    const int cap = head_cap(a->head_dim);
    if (cap == 0)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "attention: head_dim %d (want a multiple of "
                                "4 up to %d)",
                                a->head_dim, CINFER_CUDA_ATTN_MAX_HEAD_DIM);
    if ((a->k_dtype != CINFER_DTYPE_F16 && a->k_dtype != CINFER_DTYPE_F32) ||
        (a->v_dtype != CINFER_DTYPE_F16 && a->v_dtype != CINFER_DTYPE_F32))
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "attention: cache dtypes %d / %d (want F16 "
                                "or F32)",
                                (int)a->k_dtype, (int)a->v_dtype);
    if (a->out == a->q)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: out aliases q");
    if (!aligned(a->q, 16) || !aligned(a->out, 16) ||
        !aligned(a->k_cache, 4 * dtype_bytes(a->k_dtype)) ||
        !aligned(a->v_cache, 4 * dtype_bytes(a->v_dtype)))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: q, out or a cache is not aligned "
                                "to 4 elements");
    const cinfer_cuda_attn_plan_info *pi = &a->plan;
    if (pi->n_tiles < 0 || pi->n_decode < 0 ||
        2 * (int64_t)pi->n_tiles + pi->n_decode > 2 * (int64_t)a->n_rows ||
        (pi->n_decode > 0 && (pi->max_parts < 1 || pi->max_parts > 65535)))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "attention: bad plan counts (tiles %d, "
                                "decode rows %d, partitions %d)",
                                (int)pi->n_tiles, (int)pi->n_decode,
                                (int)pi->max_parts);
    const int group = a->n_heads / a->n_kv_heads;
    const int chunks = (int)ceil_div(group, group < kDecodeHeads ? group
                                                                 : kDecodeHeads);
    if ((int64_t)a->n_kv_heads * chunks > 65535)
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "attention: %d KV heads of %d query heads",
                                a->n_kv_heads, group);
    if (pi->n_decode > 0 && pi->max_parts > 1) {
        const size_t need = cinfer_cuda_attention_scratch_bytes(
            pi->n_decode, a->n_heads, a->head_dim, pi->max_parts * kPart);
        if (!a->scratch || a->scratch_bytes < need || !aligned(a->scratch, 16))
            return cinfer_set_error(CINFER_E_INVALID_ARG,
                                    "attention: scratch of %zu bytes, need "
                                    "%zu (16-byte aligned)",
                                    a->scratch_bytes, need);
        if (sizeof(float) * (size_t)pi->max_parts > 48 * 1024)
            return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                    "attention: %d partitions",
                                    (int)pi->max_parts);
    }
    if (pi->n_tiles == 0 && pi->n_decode == 0)
        return CINFER_OK;

    attn_shape sh;
    sh.k_f16 = a->k_dtype == CINFER_DTYPE_F16;
    sh.v_f16 = a->v_dtype == CINFER_DTYPE_F16;
    sh.max_blocks = a->max_blocks;
    sh.block_size = a->block_size;
    sh.n_heads = a->n_heads;
    sh.n_kv_heads = a->n_kv_heads;
    sh.head_dim = a->head_dim;
    sh.group = group;
    sh.heads_per_block = sh.head_chunks = sh.rows_per_block = sh.subs = 1;
    sh.max_parts = 1;
    sh.scale = a->scale;
    switch (cap) {
    case 32: return launch<32>(a, sh);
    case 64: return launch<64>(a, sh);
    case 96: return launch<96>(a, sh);
    case 128: return launch<128>(a, sh);
    case 192: return launch<192>(a, sh);
    case 256: return launch<256>(a, sh);
    default:
        return cinfer_set_error(CINFER_E_UNSUPPORTED,
                                "attention: head_dim %d", a->head_dim);
    }
}
