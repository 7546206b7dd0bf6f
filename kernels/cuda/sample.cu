/*
 * sample.cu - token choice on the device (sample.cuh).
 *
 * Greedy: a CTA per row. Each thread walks its strided entries keeping the
 * largest value seen (strictly larger replaces it, so the lowest of its
 * indices wins a tie) and its first NaN or +inf; the warps, then the CTA,
 * combine (value, index) pairs, the larger value or on a tie the lower
 * index, and the lowest bad index.
 *
 * Choose: the same first pass, then engine/sampler.c's plans with its
 * bits. Weights from the sampler's own e^x (below: each operation rounded
 * on its own, no FMA, as the sampler's plain IEEE single code). Without
 * top_k, the scan plan: chunk sums of 1024 entries in double with the
 * sampler's four interleaved accumulators (a thread a chunk), then one
 * thread adds them in order and walks them, and the chosen chunk's
 * weights, as the sampler's draw does. With top_k, the candidate plan:
 * the k-th largest key found by a radix select (four 8-bit passes over
 * shared histograms; the sampler's passes differ, the set does not: the
 * k largest keys, ties to the lower index), the set gathered in index
 * order (a thread a contiguous segment), then one thread weighs, keeps,
 * sums and walks it as the sampler does. With top_p, the sampler's bucket
 * masses (draw_top_p says why atomics give its bits), its cut bucket, and
 * the candidates sorted by a bitonic sort, in rounds of 1024 for the whole
 * row, for one thread's cut and walk.
 * Edits: a thread an entry. Logprobs: the greedy pass for the maximum,
 * the chunk sums at inv_t 1, a count of the entries ahead of the token and
 * the radix select for the top entries.
 * Change one and the other with it: test_backend_ops compares their
 * tokens, rows and logprobs.
 */
#include "kernels/cuda/cuda_compat.cuh"

#include <math.h>

#include "kernels/cuda/cuda_check.h"
#include "kernels/cuda/sample.cuh"

#define THREADS 256
#define FULL_MASK 0xffffffffu
#define NONE 0x7fffffff /* no index */

/* (v, i) and (w, j): the larger value, the lower index on a tie; an index
 * of NONE has no value. */
__device__ __forceinline__ void greedy_pick(float &v, int &i, float w, int j)
{
    if (j == NONE)
        return;
    if (i == NONE || w > v || (w == v && j < i)) {
        v = w;
        i = j;
    }
}

/* The first pass over a row, every thread of the CTA: in thread 0 (the
 * others hold partial results) the largest value that is not NaN or +inf
 * and its lowest index (bi NONE: the row is all -inf), and the first NaN
 * or +inf (bad NONE: none). sv, si, sb: shared, a slot per warp. It holds
 * a barrier: every thread of the CTA calls it. */
__device__ __forceinline__ void row_scan(const float *__restrict__ row,
                                         int64_t n, float *sv, int *si,
                                         int *sb, float &best, int &bi,
                                         int &bad)
{
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    best = -INFINITY;
    bi = NONE;
    bad = NONE;
    for (int64_t k = t; k < n; k += THREADS) {
        const float v = row[k];
        if (!(v < INFINITY)) { /* NaN or +inf */
            if (bad == NONE)
                bad = (int)k;
        } else if (v > best) {
            best = v;
            bi = (int)k;
        }
    }
    for (int m = 16; m > 0; m /= 2) {
        const float w = __shfl_xor_sync(FULL_MASK, best, m);
        const int j = __shfl_xor_sync(FULL_MASK, bi, m);
        const int b = __shfl_xor_sync(FULL_MASK, bad, m);
        greedy_pick(best, bi, w, j);
        bad = b < bad ? b : bad;
    }
    if (lane == 0) {
        sv[warp] = best;
        si[warp] = bi;
        sb[warp] = bad;
    }
    __syncthreads();
    if (t == 0)
        for (int w = 1; w < THREADS / 32; w++) {
            greedy_pick(best, bi, sv[w], si[w]);
            bad = sb[w] < bad ? sb[w] : bad;
        }
}

// Grid: (rows), block (THREADS).
__global__ void __launch_bounds__(THREADS)
greedy_kernel(const float *__restrict__ x, // [rows, n]
              int64_t n, int32_t *__restrict__ out) // [rows]
{
    CINFER_SHARED(float, sv, [THREADS / 32]);
    CINFER_SHARED(int, si, [THREADS / 32]);
    CINFER_SHARED(int, sb, [THREADS / 32]);
    const float *row = x + (int64_t)blockIdx.x * n;
    const int t = (int)threadIdx.x;
    float best;
    int bi, bad;
    row_scan(row, n, sv, si, sb, best, bi, bad);
    if (t == 0) {
        int32_t r;
        if (bad != NONE)
            r = -2 - (2 * bad + (row[bad] != row[bad]));
        else
            r = bi == NONE ? -1 : bi; /* NONE: the row is all -inf */
        out[blockIdx.x] = r;
    }
}

/* ---------------------------------------------------------------------- */
/* choose                                                                  */
/* ---------------------------------------------------------------------- */

#define CHUNK 1024
#define MAX_CHUNKS 256

/* engine/sampler.c's exp4_neg, one lane: e^x for x <= 0 (0 below -87). */
__device__ __forceinline__ float sampler_exp_neg(float x)
{
    if (!(x >= -87.0f))
        return 0.0f; /* -inf too */
    float xc = x > 0.0f ? 0.0f : x;
    float n = __fsub_rn(__fadd_rn(__fmul_rn(xc, 1.44269504088896341f),
                                  12582912.0f),
                        12582912.0f);
    float r = __fsub_rn(xc, __fmul_rn(n, 0.693359375f));
    r = __fsub_rn(r, __fmul_rn(n, -2.12194440e-4f));
    float q = __fadd_rn(__fmul_rn(r, 1.9875691500e-4f), 1.3981999507e-3f);
    q = __fadd_rn(__fmul_rn(q, r), 8.3334519073e-3f);
    q = __fadd_rn(__fmul_rn(q, r), 4.1665795894e-2f);
    q = __fadd_rn(__fmul_rn(q, r), 1.6666665459e-1f);
    q = __fadd_rn(__fmul_rn(q, r), 5.0000001201e-1f);
    float e = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(q, r), r), r), 1.0f);
    const int scale = (__float2int_rz(n) + 127) << 23; /* 2^n */
    return __fmul_rn(e, __int_as_float(scale));
}

/* engine/sampler.c's weight(): 0 below min_w. */
__device__ __forceinline__ float sampler_weight(float logit, float max,
                                                float inv_t, float min_w)
{
    const float e = sampler_exp_neg(__fmul_rn(__fsub_rn(logit, max), inv_t));
    return e >= min_w ? e : 0.0f;
}

#define MAX_K 1024 /* CINFER_CHOOSE_MAX_K */

/* engine/sampler.c's float_key: floats ordered as unsigned integers,
 * -0.0 and +0.0 the same key. */
__device__ __forceinline__ unsigned sampler_key(float f)
{
    const unsigned u = __float_as_uint(__fadd_rn(f, 0.0f));
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

/* Shared memory of the candidate plan. */
struct topk_smem {
    unsigned hist[256];
    unsigned sel[3]; /* prefix, mask, need */
    int before_gt[THREADS], before_eq[THREADS];
    int id[MAX_K];
    float logit[MAX_K];
};

/* select_top's predicate that takes every entry. */
struct every_entry {
    __device__ bool operator()(int64_t, unsigned) const { return true; }
};

/* The k entries of row with the largest keys, ties to the lower index,
 * among those `ok` takes (ok(i, key)), into sm.id / sm.logit [0, k) in
 * index order (every thread; 0 < k <= the number ok takes, k <= MAX_K).
 * It holds barriers and ends with one. */
template <class Pred>
__device__ __forceinline__ void select_top(const float *__restrict__ row,
                                           int64_t n, int k, topk_smem &sm,
                                           Pred ok)
{
    const int t = (int)threadIdx.x;
    unsigned prefix = 0, mask = 0;
    int need = k;
    for (int pass = 0; pass < 4; pass++) {
        const int shift = 24 - 8 * pass;
        for (int i = t; i < 256; i += THREADS)
            sm.hist[i] = 0;
        __syncthreads();
        for (int64_t i = t; i < n; i += THREADS) {
            const unsigned key = sampler_key(row[i]);
            if ((key & mask) == prefix && ok(i, key))
                atomicAdd(&sm.hist[(key >> shift) & 255u], 1u);
        }
        __syncthreads();
        if (t == 0) {
            unsigned above = 0;
            int b = 255;
            for (; b > 0; b--) {
                if (above + sm.hist[b] >= (unsigned)need)
                    break;
                above += sm.hist[b];
            }
            sm.sel[0] = prefix | (unsigned)b << shift;
            sm.sel[1] = mask | 255u << shift;
            sm.sel[2] = (unsigned)need - above;
        }
        __syncthreads();
        prefix = sm.sel[0];
        mask = sm.sel[1];
        need = (int)sm.sel[2];
        __syncthreads(); /* sel is read before the next pass writes it */
    }
    /* prefix is the k-th key; take every larger key and the first `need`
     * equal to it, in index order */
    const int64_t seg = (n + THREADS - 1) / THREADS;
    const int64_t lo = (int64_t)t * seg < n ? (int64_t)t * seg : n;
    const int64_t hi = lo + seg < n ? lo + seg : n;
    int gt = 0, eq = 0;
    for (int64_t i = lo; i < hi; i++) {
        const unsigned key = sampler_key(row[i]);
        if (!ok(i, key))
            continue;
        gt += key > prefix;
        eq += key == prefix;
    }
    sm.before_gt[t] = gt;
    sm.before_eq[t] = eq;
    __syncthreads();
    if (t == 0) {
        int a = 0, b = 0;
        for (int u = 0; u < THREADS; u++) {
            const int g = sm.before_gt[u], e = sm.before_eq[u];
            sm.before_gt[u] = a;
            sm.before_eq[u] = b;
            a += g;
            b += e;
        }
    }
    __syncthreads();
    gt = sm.before_gt[t];
    eq = sm.before_eq[t];
    for (int64_t i = lo; i < hi; i++) {
        const unsigned key = sampler_key(row[i]);
        if (!ok(i, key))
            continue;
        if (key > prefix || (key == prefix && eq < need)) {
            const int at = gt + (eq < need ? eq : need);
            sm.id[at] = (int)i;
            sm.logit[at] = row[i];
        }
        gt += key > prefix;
        eq += key == prefix;
    }
    __syncthreads();
}

/* chunk[c] = chunk c's weights summed as sampler.c's sum_weights (every
 * thread; n <= MAX_CHUNKS * CHUNK); the number of chunks. Four threads a
 * chunk, one accumulator each: thread `a` of the four sums entries a, a +
 * 4, ... in order (the first also the tail past the last multiple of 4,
 * as the sampler's a0 does), and the four meet as (a0 + a1) + (a2 + a3)
 * through shuffles: the sampler's sums, with a quarter of the serial
 * adds. Ends with a barrier. */
__device__ __forceinline__ int chunk_sums(const float *__restrict__ row,
                                          int64_t n, float max, float inv_t,
                                          float min_w, double *chunk)
{
    const int n_chunks = (int)((n + CHUNK - 1) / CHUNK);
    const int work = 4 * n_chunks;
    for (int u0 = 0; u0 < work; u0 += THREADS) { /* uniform: shuffles */
        const int u = u0 + (int)threadIdx.x, c = u / 4, a = u % 4;
        double acc = 0.0;
        if (u < work) {
            const int64_t lo = (int64_t)c * CHUNK;
            const int len = (int)(n - lo < CHUNK ? n - lo : CHUNK);
            const int len4 = len - len % 4;
            for (int i = a; i < len4; i += 4)
                acc = __dadd_rn(acc, (double)sampler_weight(row[lo + i], max,
                                                            inv_t, min_w));
            if (a == 0)
                for (int i = len4; i < len; i++)
                    acc = __dadd_rn(acc, (double)sampler_weight(
                                             row[lo + i], max, inv_t, min_w));
        }
        /* a0 + a1 and a2 + a3 on threads 0 and 2 of the four, then their
         * sum on thread 0 */
        const double pair =
            __dadd_rn(acc, __shfl_down_sync(FULL_MASK, acc, 1));
        const double sum =
            __dadd_rn(pair, __shfl_down_sync(FULL_MASK, pair, 2));
        if (u < work && a == 0)
            chunk[c] = sum;
    }
    __syncthreads();
    return n_chunks;
}

/* ---------------------------------------------------------------------- */
/* top_p                                                                   */
/* ---------------------------------------------------------------------- */

#define N_BUCKETS 512 /* sampler.c's top_p histogram */
#define BUCKETS_PER_NAT 8.0f
#define SORT_ALL_MAX 256 /* top_k sets up to this size are sorted whole */

/* sampler.c's bucket_of: 8 buckets a nat below the largest logit. */
__device__ __forceinline__ int sampler_bucket(float logit, float max,
                                              float inv_t)
{
    const float b = __fmul_rn(__fmul_rn(__fsub_rn(max, logit), inv_t),
                              BUCKETS_PER_NAT);
    return b < (float)(N_BUCKETS - 1) ? __float2int_rz(b) : N_BUCKETS - 1;
}

/* Shared memory of top_p. */
struct topp_smem {
    double mass[N_BUCKETS];
    unsigned long long sk[MAX_K]; /* a round's entries, sorted */
    double target;
    int cb;        /* the cut bucket */
    int remaining; /* entries of buckets <= cb not yet in a round */
    int done;
    int any;       /* a cursor is set: entries after (cur_key, cur_id) */
    unsigned cur_key;
    int cur_id;
};

/* sampler.c's cmp_cand order (larger logit, then lower id) as one
 * descending 64-bit key. */
__device__ __forceinline__ unsigned long long cand_key(float logit, int id)
{
    return (unsigned long long)sampler_key(logit) << 32 |
           (0xffffffffu - (unsigned)id);
}

__device__ __forceinline__ int cand_id(unsigned long long k)
{
    return (int)(0xffffffffu - (unsigned)(k & 0xffffffffu));
}

/* sm.sk[0, cnt) from sm.id / the row, sorted descending (every thread;
 * cnt <= MAX_K): a bitonic sort over the next power of two, padded with
 * zeros (below every entry). Ends with a barrier. */
__device__ __forceinline__ void sort_cands(const float *__restrict__ row,
                                           const int *ids, int cnt,
                                           unsigned long long *sk)
{
    int len = 2;
    while (len < cnt)
        len *= 2;
    for (int j = (int)threadIdx.x; j < len; j += THREADS)
        sk[j] = j < cnt ? cand_key(row[ids[j]], ids[j]) : 0ull;
    __syncthreads();
    for (int size = 2; size <= len; size *= 2)
        for (int stride = size / 2; stride > 0; stride /= 2) {
            for (int p = (int)threadIdx.x; p < len / 2; p += THREADS) {
                const int i = 2 * p - (p & (stride - 1));
                const int j = i + stride;
                const bool desc = (i & size) == 0;
                const unsigned long long a = sk[i], b = sk[j];
                if (desc ? a < b : a > b) {
                    sk[i] = b;
                    sk[j] = a;
                }
            }
            __syncthreads();
        }
}

/* sorted_cut and keep_min_w over sorted entries, as far as they go (one
 * thread): the running sum at min_w 0 until it reaches the target, the
 * kept count, and the sum of the kept weights at min_w. */
struct cut_walk {
    double cum, z2, target;
    int kept;
};

__device__ __forceinline__ bool walk_cut(const unsigned long long *sk, int cnt,
                                         const float *__restrict__ row,
                                         float max, const cinfer_draw &d,
                                         cut_walk &w)
{
    for (int j = 0; j < cnt; j++) {
        const float wt =
            sampler_weight(row[cand_id(sk[j])], max, d.inv_t, 0.0f);
        w.cum = __dadd_rn(w.cum, (double)wt);
        w.kept++;
        if (wt > 0.0f && wt >= d.min_w)
            w.z2 = __dadd_rn(w.z2, (double)wt);
        if (w.cum >= w.target)
            return true;
    }
    return false;
}

/* draw()'s walk over the kept entries (one thread): true once it has
 * picked, or walked every kept entry (then `last` is the token). */
struct draw_walk {
    double cum, target;
    int walked, kept;
    int32_t last, pick;
};

__device__ __forceinline__ bool walk_draw(const unsigned long long *sk,
                                          int cnt,
                                          const float *__restrict__ row,
                                          float max, const cinfer_draw &d,
                                          draw_walk &w)
{
    for (int j = 0; j < cnt && w.walked < w.kept; j++) {
        const int id = cand_id(sk[j]);
        const float wt = sampler_weight(row[id], max, d.inv_t, 0.0f);
        w.walked++;
        if (!(wt > 0.0f && wt >= d.min_w))
            continue;
        w.last = id;
        w.cum = __dadd_rn(w.cum, (double)wt);
        if (w.cum > w.target) {
            w.pick = id;
            return true;
        }
    }
    return w.walked >= w.kept;
}

/* select_top's predicate for top_p's rounds: entries of buckets <= cb
 * that come after the cursor in cmp_cand's order. */
struct after_cursor {
    const float *row;
    float max, inv_t;
    int cb, any, id;
    unsigned key;
    __device__ bool operator()(int64_t i, unsigned k) const
    {
        if (sampler_bucket(row[i], max, inv_t) > cb)
            return false;
        return !any || k < key || (k == key && (int)i > id);
    }
};

/* The top_p plan without top_k (every thread; the row has no NaN or +inf,
 * its largest value is max): sampler.c's build_plan and draw, the same
 * bits. The bucket masses are sums of weights within a factor e^(1/8) of
 * each other, exact in double in any order, so atomics give the
 * sampler's; the last bucket's mass never decides the cut. Then the
 * entries of buckets <= cb in sorted order, MAX_K a round (a radix
 * select after the last round's last entry, then a sort): the cut walk,
 * then the draw's walk (again from the first round when the cut took
 * more than one). */
__device__ __forceinline__ void
draw_top_p(const float *__restrict__ row, int64_t n, const cinfer_draw d,
           float max, double *chunk, topk_smem &tk, topp_smem &tp,
           int *s_count, int32_t *__restrict__ out)
{
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    const int n_chunks = chunk_sums(row, n, max, d.inv_t, 0.0f, chunk);
    for (int b = t; b < N_BUCKETS; b += THREADS)
        tp.mass[b] = 0.0;
    __syncthreads();
    for (int64_t i = t; i < n; i += THREADS) {
        const int b = sampler_bucket(row[i], max, d.inv_t);
        const float wt = sampler_weight(row[i], max, d.inv_t, 0.0f);
        if (b < N_BUCKETS - 1 && wt > 0.0f)
            atomicAdd(&tp.mass[b], (double)wt);
    }
    __syncthreads();
    if (t == 0) {
        double z = 0.0;
        for (int c = 0; c < n_chunks; c++)
            z = __dadd_rn(z, chunk[c]);
        tp.target = __dmul_rn((double)d.top_p, z);
        double cum = 0.0;
        int cb = N_BUCKETS - 1;
        for (int b = 0; b < N_BUCKETS - 1; b++) {
            cum = __dadd_rn(cum, tp.mass[b]);
            if (cum >= tp.target) {
                cb = b;
                break;
            }
        }
        tp.cb = cb;
    }
    __syncthreads();
    const int cb = tp.cb;
    int count = 0;
    for (int64_t i = t; i < n; i += THREADS)
        count += sampler_bucket(row[i], max, d.inv_t) <= cb;
    for (int m = 16; m > 0; m /= 2)
        count += __shfl_xor_sync(FULL_MASK, count, m);
    if (lane == 0)
        s_count[warp] = count;
    __syncthreads();
    if (t == 0) {
        int all = 0;
        for (int w = 0; w < THREADS / 32; w++)
            all += s_count[w];
        s_count[0] = all;
    }
    __syncthreads();
    const int eligible = s_count[0];
    cut_walk cw = {0.0, 0.0, tp.target, 0};
    draw_walk dw = {0.0, 0.0, 0, 0, -1, -1};
    int rounds = 0;
    for (int phase = 0; phase < 2; phase++) {
        if (phase == 1 && rounds == 1) {
            /* the kept entries are all in the round still sorted */
            if (t == 0)
                walk_draw(tp.sk, cw.kept, row, max, d, dw);
            break;
        }
        if (t == 0) {
            tp.remaining = eligible;
            tp.done = 0;
            tp.any = 0;
        }
        for (;;) {
            __syncthreads();
            const int rem = tp.remaining;
            if (rem == 0 || tp.done)
                break;
            const int k = rem < MAX_K ? rem : MAX_K;
            const after_cursor ok = {row, max, d.inv_t, cb, tp.any,
                                     tp.cur_id, tp.cur_key};
            __syncthreads(); /* the cursor is read before it moves */
            select_top(row, n, k, tk, ok);
            sort_cands(row, tk.id, k, tp.sk);
            rounds += phase == 0;
            if (t == 0) {
                const bool end = phase == 0
                                     ? walk_cut(tp.sk, k, row, max, d, cw)
                                     : walk_draw(tp.sk, k, row, max, d, dw);
                tp.done = end;
                tp.any = 1;
                tp.cur_key = (unsigned)(tp.sk[k - 1] >> 32);
                tp.cur_id = cand_id(tp.sk[k - 1]);
                tp.remaining = rem - k;
            }
        }
        __syncthreads(); /* every thread has read done before it resets */
        if (t == 0 && phase == 0) {
            /* kept: the cut's prefix, or every entry of buckets <= cb */
            dw.kept = cw.kept;
            dw.target = __dmul_rn(d.u, cw.z2);
        }
    }
    if (t == 0)
        *out = dw.pick >= 0 ? dw.pick : dw.last;
}

/* The candidate plan of row (every thread; 0 < k < n, the row has no NaN
 * or +inf and its largest value is max): the token into *out. */
__device__ __forceinline__ void
draw_top_k(const float *__restrict__ row, int64_t n, const cinfer_draw d,
           float max, topk_smem &sm, topp_smem &tp, int *s_count,
           int32_t *__restrict__ out)
{
    const int k = d.top_k;
    select_top(row, n, k, sm, every_entry());
    if (d.top_p < 1.0f) {
        /* sampler.c: z over the set in index order; past SORT_ALL_MAX the
         * entries of buckets <= the cut bucket of their masses; then
         * sorted_cut, keep_min_w and the walk */
        if (threadIdx.x == 0) {
            double z = 0.0;
            for (int j = 0; j < k; j++)
                z = __dadd_rn(z, (double)sampler_weight(sm.logit[j], max,
                                                        d.inv_t, 0.0f));
            tp.target = __dmul_rn((double)d.top_p, z);
            int cnt = k;
            if (k > SORT_ALL_MAX) {
                for (int b = 0; b < N_BUCKETS; b++)
                    tp.mass[b] = 0.0;
                for (int j = 0; j < k; j++)
                    tp.mass[sampler_bucket(sm.logit[j], max, d.inv_t)] =
                        __dadd_rn(tp.mass[sampler_bucket(sm.logit[j], max,
                                                         d.inv_t)],
                                  (double)sampler_weight(sm.logit[j], max,
                                                         d.inv_t, 0.0f));
                double cum = 0.0;
                int cb = N_BUCKETS - 1;
                for (int b = 0; b < N_BUCKETS; b++) {
                    cum = __dadd_rn(cum, tp.mass[b]);
                    if (cum >= tp.target) {
                        cb = b;
                        break;
                    }
                }
                cnt = 0;
                for (int j = 0; j < k; j++)
                    if (sampler_bucket(sm.logit[j], max, d.inv_t) <= cb)
                        sm.id[cnt++] = sm.id[j];
            }
            s_count[0] = cnt;
        }
        __syncthreads();
        const int cnt = s_count[0];
        sort_cands(row, sm.id, cnt, tp.sk);
        if (threadIdx.x != 0)
            return;
        cut_walk cw = {0.0, 0.0, tp.target, 0};
        walk_cut(tp.sk, cnt, row, max, d, cw);
        draw_walk dw = {0.0, __dmul_rn(d.u, cw.z2), 0, cw.kept, -1, -1};
        walk_draw(tp.sk, cw.kept, row, max, d, dw);
        *out = dw.pick >= 0 ? dw.pick : dw.last;
        return;
    }
    if (threadIdx.x != 0)
        return;
    /* sampler.c: weights at min_w 0, keep_min_w, then draw's walk */
    double z = 0.0;
    for (int j = 0; j < k; j++) {
        const float w = sampler_weight(sm.logit[j], max, d.inv_t, 0.0f);
        if (w > 0.0f && w >= d.min_w)
            z = __dadd_rn(z, (double)w);
    }
    const double target = __dmul_rn(d.u, z);
    double cum = 0.0;
    int32_t last = -1;
    for (int j = 0; j < k; j++) {
        const float w = sampler_weight(sm.logit[j], max, d.inv_t, 0.0f);
        if (!(w > 0.0f && w >= d.min_w))
            continue;
        last = sm.id[j];
        cum = __dadd_rn(cum, (double)w);
        if (cum > target)
            break;
    }
    *out = last;
}

// Grid: (rows), block (THREADS); n <= MAX_CHUNKS * CHUNK.
__global__ void __launch_bounds__(THREADS)
choose_kernel(const float *__restrict__ x,           // [rows, n]
              int64_t n, const cinfer_draw *__restrict__ draws, // [rows]
              int32_t *__restrict__ out)             // [rows]
{
    CINFER_SHARED(float, sv, [THREADS / 32]);
    CINFER_SHARED(int, si, [THREADS / 32]);
    CINFER_SHARED(int, sb, [THREADS / 32]);
    CINFER_SHARED(double, chunk, [MAX_CHUNKS]);
    CINFER_SHARED(int, s_code, [1]);
    CINFER_SHARED(float, s_max, [1]);
    CINFER_SHARED(topk_smem, tk, [1]);
    CINFER_SHARED(topp_smem, tp, [1]);
    CINFER_SHARED(int, s_count, [THREADS / 32]);
    const float *row = x + (int64_t)blockIdx.x * n;
    const cinfer_draw d = draws[blockIdx.x];
    const int t = (int)threadIdx.x;
    float best;
    int bi, bad;
    row_scan(row, n, sv, si, sb, best, bi, bad);
    if (t == 0) {
        int code = NONE; /* NONE: draw */
        if (bad != NONE)
            code = -2 - (2 * bad + (row[bad] != row[bad]));
        else if (bi == NONE)
            code = -1; /* the row is all -inf */
        else if (d.inv_t == 0.0f)
            code = bi;
        s_code[0] = code;
        s_max[0] = best;
    }
    __syncthreads();
    if (s_code[0] != NONE) {
        if (t == 0)
            out[blockIdx.x] = s_code[0];
        return;
    }
    const float max = s_max[0];
    if (d.top_k > 0) {
        draw_top_k(row, n, d, max, tk[0], tp[0], s_count, &out[blockIdx.x]);
        return;
    }
    if (d.top_p < 1.0f) {
        draw_top_p(row, n, d, max, chunk, tk[0], tp[0], s_count,
                   &out[blockIdx.x]);
        return;
    }
    const int n_chunks = chunk_sums(row, n, max, d.inv_t, d.min_w, chunk);
    if (t != 0)
        return;
    /* sampler.c's build_plan (z) and draw (the walk) */
    double z = 0.0;
    for (int c = 0; c < n_chunks; c++)
        z = __dadd_rn(z, chunk[c]);
    const double target = __dmul_rn(d.u, z);
    double cum = 0.0;
    int c = 0, last_nonempty = -1;
    for (; c < n_chunks; c++) {
        if (chunk[c] > 0.0)
            last_nonempty = c;
        if (chunk[c] > 0.0 && __dadd_rn(cum, chunk[c]) > target)
            break;
        cum = __dadd_rn(cum, chunk[c]);
    }
    if (c == n_chunks) {
        c = last_nonempty; /* rounding at the very end */
        cum = -INFINITY;   /* take the chunk's last kept token */
    }
    const int64_t lo = (int64_t)c * CHUNK;
    const int len = (int)(n - lo < CHUNK ? n - lo : CHUNK);
    int32_t last = -1, pick = -1;
    for (int i = 0; i < len && pick < 0; i++) {
        const float w = sampler_weight(row[lo + i], max, d.inv_t, d.min_w);
        if (w > 0.0f) {
            last = (int32_t)(lo + i);
            cum = __dadd_rn(cum, (double)w);
            if (cum > target)
                pick = (int32_t)(lo + i);
        }
    }
    out[blockIdx.x] = pick >= 0 ? pick : last;
}

// Grid (ceil(n / THREADS)), block (THREADS).
__global__ void weights_kernel(const float *__restrict__ x, // [n]
                               int64_t n, float max, float inv_t, float min_w,
                               float *__restrict__ w) // [n]
{
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < n)
        w[i] = sampler_weight(x[i], max, inv_t, min_w);
}

extern "C" cinfer_status cinfer_cuda_sampler_weights(cudaStream_t stream,
                                                     const float *x, int64_t n,
                                                     float max, float inv_t,
                                                     float min_w, float *w)
{
    if (n < 1 || n > ((int64_t)1 << 31) || !x || !w)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda sampler_weights: bad argument");
    CINFER_LAUNCH(weights_kernel, dim3((unsigned)((n + THREADS - 1) / THREADS)),
                  dim3(THREADS), 0, stream, x, n, max, inv_t, min_w, w);
    CINFER_CUDA_TRY_LAUNCH("weights_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_choose(cudaStream_t stream,
                                            const float *x, int64_t rows,
                                            int64_t n,
                                            const cinfer_draw *draws,
                                            int32_t *out)
{
    if (rows < 0 || rows > 2147483647LL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda choose: rows %lld out of range",
                                (long long)rows);
    if (n < 1 || n > (int64_t)MAX_CHUNKS * CHUNK)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda choose: n %lld (1 to %d)", (long long)n,
                                MAX_CHUNKS * CHUNK);
    if (rows == 0)
        return CINFER_OK;
    if (!x || !draws || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda choose: %s is NULL",
                                !x ? "x" : !draws ? "draws" : "out");
    CINFER_LAUNCH(choose_kernel, dim3((unsigned)rows), dim3(THREADS), 0,
                  stream, x, n, draws, out);
    CINFER_CUDA_TRY_LAUNCH("choose_kernel");
    return CINFER_OK;
}

extern "C" cinfer_status cinfer_cuda_greedy(cudaStream_t stream,
                                            const float *x, int64_t rows,
                                            int64_t n, int32_t *out)
{
    if (rows < 0 || rows > 2147483647LL)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: rows %lld out of range",
                                (long long)rows);
    if (n < 1 || n > ((int64_t)1 << 28))
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: n %lld (1 to 2^28)",
                                (long long)n);
    if (rows == 0)
        return CINFER_OK;
    if (!x || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda greedy: %s is NULL", !x ? "x" : "out");
    CINFER_LAUNCH(greedy_kernel, dim3((unsigned)rows), dim3(THREADS), 0,
                  stream, x, n, out);
    CINFER_CUDA_TRY_LAUNCH("greedy_kernel");
    return CINFER_OK;
}

/* (v, i) goes ahead of (w, j) among the top entries: the larger value,
 * the lower index on a tie (sampler.c's fill_logprobs). */
__device__ __forceinline__ bool top_ahead(float v, int i, float w, int j)
{
    return v > w || (v == w && i < j);
}

// Grid: (rows), block (THREADS); n <= MAX_CHUNKS * CHUNK. Rows whose token
// is a code (< 0) or whose n_top is -1 are skipped.
__global__ void __launch_bounds__(THREADS)
logprobs_kernel(const float *__restrict__ x,             // [rows, n]
                int64_t n, const int32_t *__restrict__ tokens, // [rows]
                const int32_t *__restrict__ n_top,        // [rows]
                cinfer_row_logprobs *__restrict__ out)    // [rows]
{
    CINFER_SHARED(float, sv, [THREADS / 32]);
    CINFER_SHARED(int, si, [THREADS / 32]);
    CINFER_SHARED(int, sb, [THREADS / 32]);
    CINFER_SHARED(double, chunk, [MAX_CHUNKS]);
    CINFER_SHARED(float, s_max, [1]);
    CINFER_SHARED(long long, s_better, [THREADS / 32]);
    CINFER_SHARED(topk_smem, tk, [1]);
    const int32_t tok = tokens[blockIdx.x];
    const int nt = n_top[blockIdx.x];
    if (tok < 0 || nt < 0)
        return; // the whole CTA alike
    const float *row = x + (int64_t)blockIdx.x * n;
    const int t = (int)threadIdx.x, lane = t % 32, warp = t / 32;
    float best;
    int bi, bad;
    row_scan(row, n, sv, si, sb, best, bi, bad);
    if (t == 0)
        s_max[0] = best;
    __syncthreads();
    const float max = s_max[0];
    const int n_chunks = chunk_sums(row, n, max, 1.0f, 0.0f, chunk);
    /* the entries ahead of the token */
    const float xt = row[tok];
    long long ahead = 0;
    for (int64_t i = t; i < n; i += THREADS) {
        const float v = row[i];
        ahead += v > xt || (v == xt && i < tok);
    }
    for (int m = 16; m > 0; m /= 2)
        ahead += __shfl_xor_sync(FULL_MASK, ahead, m);
    if (lane == 0)
        s_better[warp] = ahead;
    const int k = (int64_t)nt < n ? nt : (int)n;
    if (k > 0 && k < n)
        select_top(row, n, k, tk[0], every_entry()); /* barriers */
    else
        __syncthreads();
    if (t != 0)
        return;
    cinfer_row_logprobs &r = out[blockIdx.x];
    r.sum = 0.0;
    for (int c = 0; c < n_chunks; c++)
        r.sum = __dadd_rn(r.sum, chunk[c]);
    r.better = 0;
    for (int w = 0; w < THREADS / 32; w++)
        r.better += s_better[w];
    r.max = max;
    r.logit = xt;
    r.n_top = k;
    for (int j = 0; j < k; j++) { /* index order: insertion keeps it */
        const int id = k < n ? tk[0].id[j] : j;
        const float v = k < n ? tk[0].logit[j] : row[j];
        int at = j;
        while (at > 0 && top_ahead(v, id, r.top_logit[at - 1],
                                   r.top_id[at - 1])) {
            r.top_id[at] = r.top_id[at - 1];
            r.top_logit[at] = r.top_logit[at - 1];
            at--;
        }
        r.top_id[at] = id;
        r.top_logit[at] = v;
    }
}

extern "C" cinfer_status cinfer_cuda_logprobs(cudaStream_t stream,
                                              const float *x, int64_t rows,
                                              int64_t n,
                                              const int32_t *tokens,
                                              const int32_t *n_top,
                                              cinfer_row_logprobs *out)
{
    if (rows < 0 || rows > 2147483647LL || n < 1 ||
        n > (int64_t)MAX_CHUNKS * CHUNK)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda logprobs: rows %lld, n %lld out of "
                                "range",
                                (long long)rows, (long long)n);
    if (rows == 0)
        return CINFER_OK;
    if (!x || !tokens || !n_top || !out)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda logprobs: a pointer is NULL");
    CINFER_LAUNCH(logprobs_kernel, dim3((unsigned)rows), dim3(THREADS), 0,
                  stream, x, n, tokens, n_top, out);
    CINFER_CUDA_TRY_LAUNCH("logprobs_kernel");
    return CINFER_OK;
}

// Grid (ceil(count / THREADS)), block (THREADS): a thread an entry, the
// sampler's apply_stages operations for its token in their order, each
// rounded on its own (the _rn intrinsics: nvcc may not fuse them); the
// value it replaces into raw[i].
__global__ void edit_logits_kernel(float *__restrict__ x, // [rows, n]
                                   int64_t n,
                                   const cinfer_logit_edit *__restrict__ e,
                                   int64_t count, float *__restrict__ raw)
{
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i >= count)
        return;
    const cinfer_logit_edit d = e[i];
    float *p = x + (int64_t)d.row * n + d.token;
    const float v0 = *p;
    raw[i] = v0;
    if (!(v0 < INFINITY))
        return; // left for greedy / choose to name, as the sampler does
    float v = v0;
    if (d.flags & CINFER_EDIT_BIAS)
        v = __fadd_rn(v, d.bias);
    if (d.flags & CINFER_EDIT_MASK)
        v = -INFINITY;
    if (d.flags & CINFER_EDIT_REP)
        v = v > 0.0f ? __fdiv_rn(v, d.rp) : __fmul_rn(v, d.rp);
    if (d.flags & CINFER_EDIT_FREQ) {
        v = __fsub_rn(v, d.fn);
        v = __fsub_rn(v, d.pres);
    }
    *p = v;
}

// Grid (ceil(count / THREADS)), block (THREADS): raw[i] back at entry i.
__global__ void unedit_logits_kernel(float *__restrict__ x, // [rows, n]
                                     int64_t n,
                                     const cinfer_logit_edit *__restrict__ e,
                                     int64_t count,
                                     const float *__restrict__ raw)
{
    const int64_t i = (int64_t)blockIdx.x * THREADS + threadIdx.x;
    if (i < count)
        x[(int64_t)e[i].row * n + e[i].token] = raw[i];
}

extern "C" cinfer_status cinfer_cuda_edit_logits(cudaStream_t stream,
                                                 float *x, int64_t rows,
                                                 int64_t n,
                                                 const cinfer_logit_edit *edits,
                                                 int64_t count, float *raw,
                                                 int undo)
{
    if (rows < 0 || n < 1 || count < 0 || count > CINFER_EDIT_MAX)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda edit_logits: rows %lld, n %lld, count "
                                "%lld out of range",
                                (long long)rows, (long long)n,
                                (long long)count);
    if (count == 0)
        return CINFER_OK;
    if (!x || !edits || !raw)
        return cinfer_set_error(CINFER_E_INVALID_ARG,
                                "cuda edit_logits: %s is NULL",
                                !x ? "x" : !edits ? "edits" : "raw");
    const dim3 grid((unsigned)((count + THREADS - 1) / THREADS));
    if (undo) {
        CINFER_LAUNCH(unedit_logits_kernel, grid, dim3(THREADS), 0, stream, x,
                      n, edits, count, (const float *)raw);
        CINFER_CUDA_TRY_LAUNCH("unedit_logits_kernel");
    } else {
        CINFER_LAUNCH(edit_logits_kernel, grid, dim3(THREADS), 0, stream, x, n,
                      edits, count, raw);
        CINFER_CUDA_TRY_LAUNCH("edit_logits_kernel");
    }
    return CINFER_OK;
}
