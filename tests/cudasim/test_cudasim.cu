/*
 * test_cudasim.cu - tests of cudasim, the CPU test double for CUDA
 * (tests/cudasim/cudasim.h), compiled under the harness itself.
 *
 * Positive tests check that CUDA code gives CUDA's answers: shared memory
 * and barriers, every shuffle form and width, votes, atomics across
 * blocks, dp4a, fp16/bf16, dynamic shared memory, copies, streams, events,
 * graphs (replay equals eager), cuBLAS against a float64 reference, limits.
 * Planted bugs check that the harness fails the way cudasim.h documents:
 * a missing barrier gives a wrong result under some schedule, a write past
 * an allocation is reported and sticky, a barrier only some threads reach is
 * reported (no hang), unwritten shared memory reads as NaN, a shuffle mask
 * that leaves out a participating lane is reported, a launch over the
 * limits does not run, and injected faults fail the chosen call.
 *
 * ctest runs it under each schedule (CUDASIM_SCHEDULE=forward, reverse,
 * random:7); the timing lines it prints are information, not checks.
 */
#include <cublas_v2.h>
#include <nccl.h>

#include <stdlib.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#define TEST_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define TEST_ASAN 1
#endif
#endif

#include "tests/cudasim/cudasim_ctl.h"
#include "tests/unit/harness.h"

/* ---------------------------------------------------------------------- */
/* Helpers                                                                 */
/* ---------------------------------------------------------------------- */

template <typename T> static T *dev_alloc(size_t n)
{
    void *p = nullptr;
    CHECK_EQ_INT(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    return static_cast<T *>(p);
}

template <typename T> static void to_dev(T *d, const std::vector<T> &h)
{
    CHECK_EQ_INT(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice),
                 cudaSuccess);
}

template <typename T> static std::vector<T> from_dev(const T *d, size_t n)
{
    std::vector<T> h(n);
    CHECK_EQ_INT(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
}

static bool report_has(const char *s) { return strstr(cudasim_last_report(), s) != nullptr; }

/* CPU time of the process: CI machines are shared, wall time says little. */
static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* Back to a fresh process after a test that leaves a sticky error. */
static void fresh(void)
{
    cudasim_reset();
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
}

/* ---------------------------------------------------------------------- */
/* Kernels                                                                 */
/* ---------------------------------------------------------------------- */

__global__ void k_add(float *x, float v, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] += v;
}

__global__ void k_scale(float *x, float s, int n)
{
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        x[i] *= s;
}

/* Every thread writes its coordinates: checks the built-in variables. */
__global__ void k_coords(int *out)
{
    int t = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
    int b = blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    int n = blockDim.x * blockDim.y * blockDim.z;
    int *o = out + 6 * (b * n + t);
    o[0] = threadIdx.x;
    o[1] = threadIdx.y;
    o[2] = threadIdx.z;
    o[3] = blockIdx.x;
    o[4] = blockIdx.y;
    o[5] = blockIdx.z;
}

/* Tree reduction in shared memory. */
__global__ void k_reduce(const float *x, float *out, int n)
{
    CINFER_SHARED(float, s, [256]);
    int t = threadIdx.x;
    float v = 0;
    for (int i = blockIdx.x * 256 + t; i < n; i += gridDim.x * 256)
        v += x[i];
    s[t] = v;
    __syncthreads();
    for (int w = 128; w > 0; w >>= 1) {
        if (t < w)
            s[t] += s[t + w];
        __syncthreads();
    }
    if (t == 0)
        atomicAdd(out, s[0]);
}

/* Warp reductions through shuffles, then across warps in shared memory. */
__global__ void k_warp_reduce(const float *x, float *out)
{
    CINFER_SHARED(float, part, [32]);
    int t = threadIdx.x;
    float v = x[blockIdx.x * blockDim.x + t];
    for (int o = 16; o > 0; o >>= 1)
        v += __shfl_xor_sync(0xffffffffu, v, o);
    if ((t & 31) == 0)
        part[t >> 5] = v;
    __syncthreads();
    if (t < 32) {
        float w = t < (int)blockDim.x / 32 ? part[t] : 0.0f;
        for (int o = 16; o > 0; o >>= 1)
            w += __shfl_down_sync(0xffffffffu, w, o);
        if (t == 0)
            out[blockIdx.x] = w;
    }
}

__global__ void k_sync_votes(const int *p, int *out)
{
    int t = threadIdx.x;
    int c = __syncthreads_count(p[t]);
    int a = __syncthreads_and(p[t]);
    int o = __syncthreads_or(p[t]);
    if (t == 0) {
        out[0] = c;
        out[1] = a;
        out[2] = o;
    }
}

enum { SH_IDX, SH_UP, SH_DOWN, SH_XOR };

template <typename T> __global__ void k_shfl(const T *in, T *out, int op, int arg, int width)
{
    int l = threadIdx.x;
    T v = in[l], r;
    switch (op) {
    case SH_IDX: r = __shfl_sync(0xffffffffu, v, arg, width); break;
    case SH_UP: r = __shfl_up_sync(0xffffffffu, v, (unsigned)arg, width); break;
    case SH_DOWN: r = __shfl_down_sync(0xffffffffu, v, (unsigned)arg, width); break;
    default: r = __shfl_xor_sync(0xffffffffu, v, arg, width); break;
    }
    out[l] = r;
}

__global__ void k_votes(const int *p, unsigned *out)
{
    int l = threadIdx.x;
    out[4 * l + 0] = __ballot_sync(0xffffffffu, p[l]);
    out[4 * l + 1] = (unsigned)__any_sync(0xffffffffu, p[l]);
    out[4 * l + 2] = (unsigned)__all_sync(0xffffffffu, p[l]);
    out[4 * l + 3] = __activemask();
    /* A subset of the warp votes among itself; the others do not take part. */
    if (l < 16) {
        __syncwarp(0x0000ffffu);
        out[128 + l] = __ballot_sync(0x0000ffffu, p[l]);
    }
}

__global__ void k_atomics(int *i, unsigned *u, unsigned long long *ull, float *f, double *d,
                          int *mx, int *mn, int *cas, unsigned *bits_or, unsigned *bits_and,
                          int *exch)
{
    int g = blockIdx.x * blockDim.x + threadIdx.x;
    atomicAdd(i, 1);
    atomicAdd(u, 2u);
    atomicAdd(ull, 3ull);
    atomicAdd(f, 1.0f);
    atomicAdd(d, 0.5);
    atomicMax(mx, g);
    atomicMin(mn, -g);
    int old = *cas, assumed;
    do {
        assumed = old;
        old = atomicCAS(cas, assumed, assumed + 1);
    } while (old != assumed);
    atomicOr(bits_or, 1u << (g % 32));
    atomicAnd(bits_and, ~(1u << (g % 32)));
    atomicExch(exch, g);
}

__global__ void k_dp4a(const int *a, const int *b, const int *c, int *out, unsigned *uout, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        out[i] = __dp4a(a[i], b[i], c[i]);
        uout[i] = __dp4a((unsigned)a[i], (unsigned)b[i], (unsigned)c[i]);
    }
}

__global__ void k_half(const float *a, const float *b, float *out)
{
    int i = threadIdx.x;
    __half ha = __float2half(a[i]), hb = __float2half(b[i]);
    __nv_bfloat16 ba = __float2bfloat16(a[i]), bb = __float2bfloat16(b[i]);
    out[8 * i + 0] = __half2float(ha + hb);
    out[8 * i + 1] = __half2float(__hmul(ha, hb));
    out[8 * i + 2] = __bfloat162float(ba * bb);
    out[8 * i + 3] = __bfloat162float(__hadd(ba, bb));
    out[8 * i + 4] = __half2float(__hfma(ha, hb, ha));
    __half2 h2 = __floats2half2_rn(a[i], b[i]);
    h2 = __hadd2(h2, h2);
    out[8 * i + 5] = __low2float(h2) + __high2float(h2);
    out[8 * i + 6] = __half2float(hexp(__float2half(0.5f)));
    out[8 * i + 7] = (float)(ha < hb);
}

__global__ void k_dyn(float *out, int n)
{
    CINFER_DYN_SHARED(float, s);
    int t = threadIdx.x;
    for (int i = t; i < n; i += blockDim.x)
        s[i] = (float)i;
    __syncthreads();
    for (int i = t; i < n; i += blockDim.x)
        out[i] = s[n - 1 - i];
}

__global__ void k_mark(int *flag) { *flag = 1; }

/* Planted bug: thread 0 sums what the others wrote, with or without the
 * barrier between. */
__global__ void k_sum_shared(const float *x, float *out, int barrier)
{
    CINFER_SHARED(float, s, [64]);
    int t = threadIdx.x;
    s[t] = x[t];
    if (barrier)
        __syncthreads();
    if (t == 0) {
        float sum = 0;
        for (int i = 0; i < 64; i++)
            sum += s[i];
        *out = sum;
    }
}

/* Planted bug: one element past the end. */
__global__ void k_oob(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i <= n)
        x[i] = 1.0f;
}

/* Planted bug: a barrier only threads < 16 reach. */
__global__ void k_branch_barrier(float *x)
{
    if (threadIdx.x < 16) {
        x[threadIdx.x] = 1.0f;
        __syncthreads();
    }
}

/* Planted bug: two halves wait at different barriers. */
__global__ void k_two_barriers(float *x)
{
    if (threadIdx.x < 16)
        __syncthreads();
    else
        __syncthreads();
    x[threadIdx.x] = 1.0f;
}

/* Planted bug: reads shared memory nothing wrote. */
__global__ void k_unwritten(float *out)
{
    CINFER_SHARED(float, s, [128]);
    out[threadIdx.x] = s[threadIdx.x];
}

/* Planted bugs in shuffles: kind 0, the mask leaves out the last lane,
 * which still takes part; kind 1, lanes 16.. exit while 0..15 shuffle with
 * the full mask; kind 2, the source lane is outside the mask; kind 3, half
 * the warp shuffles while the other half waits at a barrier. */
__global__ void k_bad_shfl(float *x, int kind)
{
    int l = threadIdx.x;
    float v = x[l];
    switch (kind) {
    case 0: v = __shfl_sync(0x7fffffffu, v, 0); break;
    case 1:
        if (l >= 16)
            return;
        v = __shfl_xor_sync(0xffffffffu, v, 1);
        break;
    case 2:
        if (l < 16)
            v = __shfl_xor_sync(0x0000ffffu, v, 16);
        break;
    default:
        if (l < 16)
            v = __shfl_sync(0xffffffffu, v, 0);
        __syncthreads();
        break;
    }
    x[l] = v;
}

/* Timing kernels. */
__global__ void k_elementwise(float *x, int n)
{
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n)
        x[i] = x[i] * 2.0f + 1.0f;
}

__global__ void k_barriers(float *x, int rounds)
{
    CINFER_SHARED(float, s, [256]);
    int t = threadIdx.x;
    float v = (float)t;
    for (int r = 0; r < rounds; r++) {
        s[t] = v;
        __syncthreads();
        v = s[(t + 1) & 255];
        __syncthreads();
    }
    x[blockIdx.x * 256 + t] = v;
}

/* ---------------------------------------------------------------------- */
/* Positive tests                                                          */
/* ---------------------------------------------------------------------- */

static void test_launch_and_coords(void)
{
    const int n = 100003;
    float *d = dev_alloc<float>(n);
    CHECK_EQ_INT(cudaMemset(d, 0, n * sizeof(float)), cudaSuccess);
    CINFER_LAUNCH(k_add, dim3((n + 255) / 256), dim3(256), 0, 0, d, 1.5f, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> h = from_dev(d, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != 1.5f;
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(cudaFree(d), cudaSuccess);

    dim3 grid(3, 2, 2), block(5, 4, 3);
    int total = 12 * 60;
    int *c = dev_alloc<int>(6 * total);
    CINFER_LAUNCH(k_coords, grid, block, 0, 0, c);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<int> hc = from_dev(c, 6 * total);
    bad = 0;
    for (int b = 0; b < 12; b++)
        for (int t = 0; t < 60; t++) {
            const int *o = &hc[6 * (b * 60 + t)];
            int want[6] = {t % 5, (t / 5) % 4, t / 20, b % 3, (b / 3) % 2, b / 6};
            for (int q = 0; q < 6; q++)
                bad += o[q] != want[q];
        }
    CHECK_EQ_INT(bad, 0);
    CHECK_EQ_INT(cudaFree(c), cudaSuccess);
}

static void test_block_reduce(void)
{
    const int n = 5125;
    std::vector<float> h(n);
    double want = 0;
    for (int i = 0; i < n; i++) {
        h[i] = (float)(i % 17) - 8.0f;
        want += h[i];
    }
    float *x = dev_alloc<float>(n), *out = dev_alloc<float>(1);
    to_dev(x, h);
    CHECK_EQ_INT(cudaMemset(out, 0, 4), cudaSuccess);
    CINFER_LAUNCH(k_reduce, dim3(7), dim3(256), 0, 0, x, out, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_NEAR(from_dev(out, 1)[0], want, 0);

    /* Warp shuffles + shared memory, 8 blocks of 256. */
    std::vector<float> hw(2048);
    for (int i = 0; i < 2048; i++)
        hw[i] = (float)(i % 13);
    float *xw = dev_alloc<float>(2048), *ow = dev_alloc<float>(8);
    to_dev(xw, hw);
    CINFER_LAUNCH(k_warp_reduce, dim3(8), dim3(256), 0, 0, xw, ow);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> r = from_dev(ow, 8);
    for (int b = 0; b < 8; b++) {
        double s = 0;
        for (int i = 0; i < 256; i++)
            s += hw[b * 256 + i];
        CHECK_NEAR(r[b], s, 0);
    }

    std::vector<int> p(100);
    for (int i = 0; i < 100; i++)
        p[i] = i % 3 == 0;
    int *dp = dev_alloc<int>(100), *dv = dev_alloc<int>(3);
    to_dev(dp, p);
    CINFER_LAUNCH(k_sync_votes, dim3(1), dim3(100), 0, 0, dp, dv);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<int> v = from_dev(dv, 3);
    CHECK_EQ_INT(v[0], 34);
    CHECK_EQ_INT(v[1], 0);
    CHECK_EQ_INT(v[2], 1);
    cudaFree(x);
    cudaFree(out);
    cudaFree(xw);
    cudaFree(ow);
    cudaFree(dp);
    cudaFree(dv);
}

/* CUDA's documented semantics, written independently of the harness. */
static int shfl_ref(int op, int lane, int arg, int w)
{
    int base = lane / w * w;
    switch (op) {
    case SH_IDX: return base + ((arg % w) + w) % w;
    case SH_UP: return lane % w >= arg ? lane - arg : lane;
    case SH_DOWN: return lane % w + arg < w ? lane + arg : lane;
    default: {
        int s = lane ^ arg;
        return s < base + w ? s : lane;
    }
    }
}

template <typename T> static int check_shfl_type(T (*make)(int))
{
    std::vector<T> in(32);
    for (int l = 0; l < 32; l++)
        in[l] = make(l);
    T *din = dev_alloc<T>(32), *dout = dev_alloc<T>(32);
    CHECK_EQ_INT(cudaMemcpy(din, in.data(), 32 * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    int bad = 0;
    for (int op = SH_IDX; op <= SH_XOR; op++)
        for (int w = 1; w <= 32; w *= 2)
            for (int arg : {0, 1, 3, 5, 16, 31, -1}) {
                if (op != SH_IDX && arg < 0)
                    continue;
                if (op == SH_XOR && arg >= 32)
                    continue;
                CINFER_LAUNCH(k_shfl<T>, dim3(1), dim3(32), 0, 0, din, dout, op, arg, w);
                if (cudaGetLastError() != cudaSuccess) {
                    bad++;
                    continue;
                }
                std::vector<T> out(32);
                CHECK_EQ_INT(cudaMemcpy(out.data(), dout, 32 * sizeof(T), cudaMemcpyDeviceToHost),
                             cudaSuccess);
                for (int l = 0; l < 32; l++) {
                    int s = shfl_ref(op, l, arg, w);
                    if (memcmp(static_cast<const void *>(&out[l]), static_cast<const void *>(&in[s]),
                               sizeof(T)) != 0) {
                        if (bad < 5)
                            fprintf(stderr, "shuffle op %d width %d arg %d lane %d: wrong source\n",
                                    op, w, arg, l);
                        bad++;
                    }
                }
            }
    cudaFree(din);
    cudaFree(dout);
    return bad;
}

static void test_shuffles(void)
{
    CHECK_EQ_INT(check_shfl_type<int>([](int l) { return l * 7 - 100; }), 0);
    CHECK_EQ_INT(check_shfl_type<unsigned>([](int l) { return 0x80000000u + (unsigned)l; }), 0);
    CHECK_EQ_INT(check_shfl_type<float>([](int l) { return l * 0.5f - 3.0f; }), 0);
    CHECK_EQ_INT(check_shfl_type<long long>([](int l) { return (1ll << 40) * l + 5; }), 0);
    CHECK_EQ_INT(check_shfl_type<double>([](int l) { return l / 3.0; }), 0);
    CHECK_EQ_INT(check_shfl_type<__half>([](int l) { return __float2half((float)l); }), 0);
    CHECK_EQ_INT(check_shfl_type<__half2>([](int l) { return __floats2half2_rn((float)l, -(float)l); }),
                 0);
    CHECK_EQ_INT(check_shfl_type<__nv_bfloat16>([](int l) { return __float2bfloat16((float)l); }), 0);
    CHECK_EQ_INT(cudasim_live_allocations(), 0);
}

static void test_votes(void)
{
    std::vector<int> p(32);
    unsigned want = 0;
    for (int l = 0; l < 32; l++) {
        p[l] = (l * 5) % 3 == 0;
        want |= (unsigned)p[l] << l;
    }
    int *dp = dev_alloc<int>(32);
    unsigned *dout = dev_alloc<unsigned>(160);
    to_dev(dp, p);
    CINFER_LAUNCH(k_votes, dim3(1), dim3(32), 0, 0, dp, dout);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<unsigned> o = from_dev(dout, 160);
    for (int l = 0; l < 32; l++) {
        CHECK_EQ_INT(o[4 * l + 0], want);
        CHECK_EQ_INT(o[4 * l + 1], 1);
        CHECK_EQ_INT(o[4 * l + 2], 0);
        /* No synchronisation: lanes that already exited are left out. */
        CHECK_EQ_INT((o[4 * l + 3] >> l) & 1, 1);
    }
    for (int l = 0; l < 16; l++)
        CHECK_EQ_INT(o[128 + l], want & 0xffffu);
    cudaFree(dp);
    cudaFree(dout);
}

static void test_atomics(void)
{
    int *i = dev_alloc<int>(1), *mx = dev_alloc<int>(1), *mn = dev_alloc<int>(1),
        *cas = dev_alloc<int>(1), *exch = dev_alloc<int>(1);
    unsigned *u = dev_alloc<unsigned>(1), *bo = dev_alloc<unsigned>(1), *ba = dev_alloc<unsigned>(1);
    unsigned long long *ull = dev_alloc<unsigned long long>(1);
    float *f = dev_alloc<float>(1);
    double *d = dev_alloc<double>(1);
    for (void *p : {(void *)i, (void *)mx, (void *)mn, (void *)cas, (void *)u, (void *)bo,
                    (void *)ull, (void *)f, (void *)d})
        CHECK_EQ_INT(cudaMemset(p, 0, 4), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(ull, 0, 8), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(d, 0, 8), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(ba, 0xff, 4), cudaSuccess);
    const int blocks = 64, threads = 256, n = blocks * threads;
    CINFER_LAUNCH(k_atomics, dim3(blocks), dim3(threads), 0, 0, i, u, ull, f, d, mx, mn, cas, bo, ba,
                  exch);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(from_dev(i, 1)[0], n);
    CHECK_EQ_INT(from_dev(u, 1)[0], 2 * n);
    CHECK_EQ_INT(from_dev(ull, 1)[0], 3ull * n);
    CHECK_NEAR(from_dev(f, 1)[0], n, 0);
    CHECK_NEAR(from_dev(d, 1)[0], n * 0.5, 0);
    CHECK_EQ_INT(from_dev(mx, 1)[0], n - 1);
    CHECK_EQ_INT(from_dev(mn, 1)[0], -(n - 1));
    CHECK_EQ_INT(from_dev(cas, 1)[0], n);
    CHECK_EQ_INT(from_dev(bo, 1)[0], 0xffffffffu);
    CHECK_EQ_INT(from_dev(ba, 1)[0], 0);
    int e = from_dev(exch, 1)[0];
    CHECK(e >= 0 && e < n);
    for (void *p : {(void *)i, (void *)mx, (void *)mn, (void *)cas, (void *)exch, (void *)u,
                    (void *)bo, (void *)ba, (void *)ull, (void *)f, (void *)d})
        CHECK_EQ_INT(cudaFree(p), cudaSuccess);
}

static void test_dp4a(void)
{
    const int n = 1000;
    uint64_t seed = 99;
    std::vector<int> a(n), b(n), c(n);
    for (int k = 0; k < n; k++) {
        a[k] = (int)harness_rand(&seed);
        b[k] = (int)harness_rand(&seed);
        c[k] = (int)(harness_rand(&seed) % 100000) - 50000;
    }
    int *da = dev_alloc<int>(n), *db = dev_alloc<int>(n), *dc = dev_alloc<int>(n),
        *dout = dev_alloc<int>(n);
    unsigned *du = dev_alloc<unsigned>(n);
    to_dev(da, a);
    to_dev(db, b);
    to_dev(dc, c);
    CINFER_LAUNCH(k_dp4a, dim3(4), dim3(256), 0, 0, da, db, dc, dout, du, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<int> o = from_dev(dout, n);
    std::vector<unsigned> uo = from_dev(du, n);
    int bad = 0;
    for (int k = 0; k < n; k++) {
        int s = c[k];
        unsigned us = (unsigned)c[k];
        for (int q = 0; q < 4; q++) {
            s += (int)(signed char)(a[k] >> (8 * q)) * (int)(signed char)(b[k] >> (8 * q));
            us += ((unsigned)a[k] >> (8 * q) & 255u) * ((unsigned)b[k] >> (8 * q) & 255u);
        }
        bad += o[k] != s || uo[k] != us;
    }
    CHECK_EQ_INT(bad, 0);
    for (void *p : {(void *)da, (void *)db, (void *)dc, (void *)dout, (void *)du})
        cudaFree(p);
}

static void test_half_bf16(void)
{
    std::vector<float> a = {1.5f, 2049.0f, 65520.0f, 1.00390625f, -0.25f};
    std::vector<float> b = {2.25f, 1.0f, 1.0f, 1.0f, 4.0f};
    const int n = (int)a.size();
    float *da = dev_alloc<float>(n), *db = dev_alloc<float>(n), *dout = dev_alloc<float>(8 * n);
    to_dev(da, a);
    to_dev(db, b);
    CINFER_LAUNCH(k_half, dim3(1), dim3(n), 0, 0, da, db, dout);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> o = from_dev(dout, 8 * n);
    CHECK_NEAR(o[0], 3.75, 0);          /* 1.5h + 2.25h */
    CHECK_NEAR(o[1], 3.375, 0);         /* 1.5h * 2.25h */
    CHECK_NEAR(o[2], 3.375, 0);         /* bf16 product, exact */
    CHECK_NEAR(o[4], 1.5 * 2.25 + 1.5, 0);
    CHECK_NEAR(o[5], 2 * (1.5 + 2.25), 0);
    CHECK_NEAR(o[6], 1.6484375, 0);     /* expf(0.5) rounded to half */
    CHECK_NEAR(o[7], 1, 0);
    CHECK_NEAR(o[8 + 0], 2048, 0);      /* 2049 -> 2048 (ties to even); + 1 -> 2048 again */
    CHECK(std::isinf(o[16 + 0]));       /* 65520 rounds to infinity in half */
    CHECK_NEAR(o[24 + 3], 2.0, 0);      /* bf16(1 + 2^-8) ties to even: 1.0, + 1 */
    CHECK_NEAR(o[32 + 1], -1.0, 0);
    for (void *p : {(void *)da, (void *)db, (void *)dout})
        cudaFree(p);
}

static void test_dynamic_shared(void)
{
    const int n = 16384; /* 64 KB */
    float *out = dev_alloc<float>(n);
    CHECK_EQ_INT(cudaMemset(out, 0, n * 4), cudaSuccess);
    /* Over 48 KB without the opt-in: a launch error, the kernel does not run. */
    CINFER_LAUNCH(k_dyn, dim3(1), dim3(256), n * sizeof(float), 0, out, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess); /* not sticky */
    CHECK_NEAR(from_dev(out, n)[5], 0, 0);
    CHECK_EQ_INT(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      n * (int)sizeof(float)),
                 cudaSuccess);
    CHECK_EQ_INT(cudaFuncSetAttribute(k_dyn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      228 * 1024),
                 cudaErrorInvalidValue);
    cudaGetLastError();
    CINFER_LAUNCH(k_dyn, dim3(1), dim3(256), n * sizeof(float), 0, out, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> h = from_dev(out, n);
    int bad = 0;
    for (int i = 0; i < n; i++)
        bad += h[i] != (float)(n - 1 - i);
    CHECK_EQ_INT(bad, 0);
    cudaFree(out);
}

static void test_memory(void)
{
    const int n = 1000;
    std::vector<float> h(n);
    for (int i = 0; i < n; i++)
        h[i] = (float)i;
    float *a = dev_alloc<float>(n), *b = dev_alloc<float>(n);
    /* Fresh memory is 0xFF bytes: NaN. */
    CHECK(std::isnan(from_dev(a, 1)[0]));
    to_dev(a, h);
    CHECK_EQ_INT(cudaMemcpy(b, a + 10, 500 * sizeof(float), cudaMemcpyDeviceToDevice), cudaSuccess);
    CHECK_NEAR(from_dev(b, 3)[2], 12, 0);
    CHECK_EQ_INT(cudaMemset(b, 0, 4 * sizeof(float)), cudaSuccess);
    CHECK_NEAR(from_dev(b, 5)[3], 0, 0);
    CHECK_NEAR(from_dev(b, 5)[4], 14, 0);
    cudaStream_t s;
    CHECK_EQ_INT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
    float *pinned = nullptr;
    CHECK_EQ_INT(cudaMallocHost((void **)&pinned, n * sizeof(float)), cudaSuccess);
    CHECK_EQ_INT(cudaMemsetAsync(a, 0x40, n * sizeof(float), s), cudaSuccess);
    CHECK_EQ_INT(cudaMemcpyAsync(pinned, a, n * sizeof(float), cudaMemcpyDeviceToHost, s),
                 cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaSuccess);
    CHECK_NEAR(pinned[999], 3.0039215, 1e-6); /* 0x40404040 */
    CHECK_EQ_INT(cudaMemcpy(pinned, a, 4, cudaMemcpyDefault), cudaSuccess);

    /* Ranges outside an allocation: reported, cudaErrorInvalidValue, not sticky. */
    CHECK_EQ_INT(cudaMemcpy(b + 990, h.data(), 20 * sizeof(float), cudaMemcpyHostToDevice),
                 cudaErrorInvalidValue);
    CHECK(report_has("run 40 bytes past its end"));
    CHECK_EQ_INT(cudaMemset(h.data(), 0, 4), cudaErrorInvalidValue);
    CHECK(report_has("not in a live allocation"));
    CHECK_EQ_INT(cudaFree(h.data()), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaFree(b + 1), cudaErrorInvalidValue);
    CHECK(report_has("points 4 bytes into an allocation"));
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorInvalidValue);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);

    /* The memory limit: an allocation over it fails, not sticky. */
    size_t free_b = 0, total = 0;
    CHECK_EQ_INT(cudaMemGetInfo(&free_b, &total), cudaSuccess);
    CHECK(free_b + 2 * n * sizeof(float) == total);
    void *big = nullptr;
    CHECK_EQ_INT(cudaMalloc(&big, total), cudaErrorMemoryAllocation);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ_INT(cudaMalloc(&big, 16), cudaSuccess);
    CHECK_EQ_INT(cudaFree(big), cudaSuccess);

    CHECK_EQ_INT(cudaFreeHost(pinned), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ_INT(cudaFree(a), cudaSuccess);
    CHECK_EQ_INT(cudaFree(b), cudaSuccess);
    CHECK_EQ_INT(cudasim_live_allocations(), 0);
    CHECK_EQ_INT(cudasim_live_bytes(), 0);
}

static void test_device(void)
{
    int count = 0, d = -1, v = 0;
    CHECK_EQ_INT(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK_EQ_INT(count, 1);
    CHECK_EQ_INT(cudaGetDevice(&d), cudaSuccess);
    CHECK_EQ_INT(d, 0);
    CHECK_EQ_INT(cudaSetDevice(1), cudaErrorInvalidDevice);
    cudaGetLastError();
    cudaDeviceProp p;
    CHECK_EQ_INT(cudaGetDeviceProperties(&p, 0), cudaSuccess);
    CHECK_EQ_STR(p.name, "cudasim (CPU harness)");
    CHECK_EQ_INT(p.multiProcessorCount, 132);
    CHECK_EQ_INT(p.major * 10 + p.minor, 90);
    CHECK_EQ_INT(p.sharedMemPerBlockOptin, 227 * 1024);
    CHECK_EQ_INT(cudaDeviceGetAttribute(&v, cudaDevAttrMaxSharedMemoryPerBlockOptin, 0), cudaSuccess);
    CHECK_EQ_INT(v, 227 * 1024);
    CHECK_EQ_INT(cudaRuntimeGetVersion(&v), cudaSuccess);
    CHECK_EQ_INT(v, CUDART_VERSION);
    CHECK_EQ_STR(cudaGetErrorName(cudaErrorIllegalAddress), "cudaErrorIllegalAddress");
    CHECK_EQ_STR(cudaGetErrorString(cudaErrorMemoryAllocation), "out of memory");
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaSuccess);
}

static void test_streams_events(void)
{
    cudaStream_t s;
    cudaEvent_t e0, e1, et;
    CHECK_EQ_INT(cudaStreamCreate(&s), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreate(&e0), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreate(&e1), cudaSuccess);
    CHECK_EQ_INT(cudaEventCreateWithFlags(&et, cudaEventDisableTiming), cudaSuccess);
    const int n = 1 << 16;
    float *x = dev_alloc<float>(n);
    CHECK_EQ_INT(cudaEventRecord(e0, s), cudaSuccess);
    CHECK_EQ_INT(cudaMemsetAsync(x, 0, n * 4, s), cudaSuccess);
    CINFER_LAUNCH(k_add, dim3(n / 256), dim3(256), 0, s, x, 2.0f, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(cudaEventRecord(e1, s), cudaSuccess);
    CHECK_EQ_INT(cudaEventRecord(et, s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamWaitEvent(0, e1, 0), cudaSuccess);
    CHECK_EQ_INT(cudaEventSynchronize(e1), cudaSuccess);
    CHECK_EQ_INT(cudaEventQuery(e1), cudaSuccess);
    CHECK_EQ_INT(cudaStreamQuery(s), cudaSuccess);
    float ms = -1;
    CHECK_EQ_INT(cudaEventElapsedTime(&ms, e0, e1), cudaSuccess);
    CHECK(ms >= 0);
    CHECK_EQ_INT(cudaEventElapsedTime(&ms, e0, et), cudaErrorInvalidResourceHandle);
    CHECK_NEAR(from_dev(x, n)[n - 1], 2, 0);
    CHECK_EQ_INT(cudaEventDestroy(e0), cudaSuccess);
    CHECK_EQ_INT(cudaEventDestroy(e1), cudaSuccess);
    CHECK_EQ_INT(cudaEventDestroy(et), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaErrorInvalidResourceHandle);
    cudaGetLastError();
    cudaFree(x);
}

static void test_graphs(void)
{
    const int n = 3000;
    float *x = dev_alloc<float>(n), *y = dev_alloc<float>(n);
    std::vector<float> h(n, 7.0f);
    cudaStream_t s;
    CHECK_EQ_INT(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);

    /* Eager: three rounds of x = (x + 1) * 2 from 0, copied to y. */
    CHECK_EQ_INT(cudaMemset(x, 0, n * 4), cudaSuccess);
    for (int r = 0; r < 3; r++) {
        CINFER_LAUNCH(k_add, dim3((n + 127) / 128), dim3(128), 0, s, x, 1.0f, n);
        CINFER_LAUNCH(k_scale, dim3(4), dim3(256), 0, s, x, 2.0f, n);
    }
    CHECK_EQ_INT(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    std::vector<float> eager = from_dev(y, n);
    CHECK_NEAR(eager[n - 1], 14, 0);

    /* Captured: one round, replayed three times. */
    CHECK_EQ_INT(cudaMemset(x, 0, n * 4), cudaSuccess);
    to_dev(y, h);
    cudaGraph_t g = nullptr;
    CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    cudaStreamCaptureStatus st;
    CHECK_EQ_INT(cudaStreamIsCapturing(s, &st), cudaSuccess);
    CHECK_EQ_INT(st, cudaStreamCaptureStatusActive);
    CINFER_LAUNCH(k_add, dim3((n + 127) / 128), dim3(128), 0, s, x, 1.0f, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CINFER_LAUNCH(k_scale, dim3(4), dim3(256), 0, s, x, 2.0f, n);
    CHECK_EQ_INT(cudaMemcpyAsync(y, x, n * 4, cudaMemcpyDeviceToDevice, s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK(g != nullptr);
    /* Recording ran nothing. */
    CHECK_NEAR(from_dev(y, n)[0], 7, 0);
    cudaGraphExec_t ge = nullptr;
    CHECK_EQ_INT(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    for (int r = 0; r < 3; r++)
        CHECK_EQ_INT(cudaGraphLaunch(ge, s), cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaSuccess);
    std::vector<float> replay = from_dev(y, n);
    CHECK(memcmp(eager.data(), replay.data(), n * 4) == 0);

    /* Synchronising a capturing stream fails and invalidates the capture;
     * so does cudaMalloc under a global capture. */
    cudaGraph_t g2 = nullptr;
    CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ_INT(cudaStreamSynchronize(s), cudaErrorStreamCaptureUnsupported);
    CHECK_EQ_INT(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
    CHECK(g2 == nullptr);
    CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    void *p = nullptr;
    CHECK_EQ_INT(cudaMalloc(&p, 64), cudaErrorStreamCaptureUnsupported);
    CHECK_EQ_INT(cudaMemcpy(y, x, 4, cudaMemcpyDeviceToDevice), cudaErrorStreamCaptureImplicit);
    CHECK_EQ_INT(cudaStreamEndCapture(s, &g2), cudaErrorStreamCaptureInvalidated);
    CHECK_EQ_INT(cudaStreamBeginCapture(0, cudaStreamCaptureModeGlobal),
                 cudaErrorStreamCaptureUnsupported);
    cudaGetLastError();

    CHECK_EQ_INT(cudaGraphExecDestroy(ge), cudaSuccess);
    CHECK_EQ_INT(cudaGraphDestroy(g), cudaSuccess);
    CHECK_EQ_INT(cudaStreamDestroy(s), cudaSuccess);
    cudaFree(x);
    cudaFree(y);
}

/* ---------------------------------------------------------------------- */
/* cuBLAS                                                                  */
/* ---------------------------------------------------------------------- */

static float round_to(cudaDataType t, float v)
{
    if (t == CUDA_R_16F)
        return __half2float(__float2half_rn(v));
    if (t == CUDA_R_16BF)
        return __bfloat162float(__float2bfloat16_rn(v));
    return v;
}

static void put(std::vector<unsigned char> &buf, cudaDataType t, size_t i, float v)
{
    if (t == CUDA_R_32F)
        memcpy(&buf[4 * i], &v, 4);
    else if (t == CUDA_R_16F) {
        __half h = __float2half_rn(v);
        memcpy(&buf[2 * i], static_cast<const void *>(&h), 2);
    } else {
        __nv_bfloat16 h = __float2bfloat16_rn(v);
        memcpy(&buf[2 * i], static_cast<const void *>(&h), 2);
    }
}

static float get(const std::vector<unsigned char> &buf, cudaDataType t, size_t i)
{
    if (t == CUDA_R_32F) {
        float v;
        memcpy(&v, &buf[4 * i], 4);
        return v;
    }
    uint16_t u;
    memcpy(&u, &buf[2 * i], 2);
    if (t == CUDA_R_16F) {
        __half_raw r;
        r.x = u;
        return __half2float(__half(r));
    }
    uint32_t w = (uint32_t)u << 16;
    float v;
    memcpy(&v, &w, 4);
    return v;
}

/* One GemmEx (or strided batched) against a float64 reference; returns
 * the largest error relative to the result's scale. */
static double gemm_case(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n,
                        int k, cudaDataType ab, cudaDataType ct, int batch, float beta)
{
    int lda = (ta == CUBLAS_OP_N ? m : k) + 3, ldb = (tb == CUBLAS_OP_N ? k : n) + 1, ldc = m + 2;
    size_t ea = (size_t)lda * (ta == CUBLAS_OP_N ? k : m), eb = (size_t)ldb * (tb == CUBLAS_OP_N ? n : k),
           ec = (size_t)ldc * n;
    size_t sz = ab == CUDA_R_32F ? 4 : 2, szc = ct == CUDA_R_32F ? 4 : 2;
    std::vector<unsigned char> A(ea * batch * sz), B(eb * batch * sz), C(ec * batch * szc);
    uint64_t seed = 1234 + m * 7 + n * 13 + k;
    for (size_t i = 0; i < ea * batch; i++)
        put(A, ab, i, harness_randf(&seed));
    for (size_t i = 0; i < eb * batch; i++)
        put(B, ab, i, harness_randf(&seed));
    for (size_t i = 0; i < ec * batch; i++)
        put(C, ct, i, harness_randf(&seed));
    void *dA, *dB, *dC;
    CHECK_EQ_INT(cudaMalloc(&dA, A.size()), cudaSuccess);
    CHECK_EQ_INT(cudaMalloc(&dB, B.size()), cudaSuccess);
    CHECK_EQ_INT(cudaMalloc(&dC, C.size()), cudaSuccess);
    cudaMemcpy(dA, A.data(), A.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dB, B.data(), B.size(), cudaMemcpyHostToDevice);
    cudaMemcpy(dC, C.data(), C.size(), cudaMemcpyHostToDevice);
    float alpha = 0.75f;
    cublasStatus_t st;
    if (batch == 1)
        st = cublasGemmEx(h, ta, tb, m, n, k, &alpha, dA, ab, lda, dB, ab, ldb, &beta, dC, ct, ldc,
                          CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
    else
        st = cublasGemmStridedBatchedEx(h, ta, tb, m, n, k, &alpha, dA, ab, lda, (long long)ea, dB,
                                        ab, ldb, (long long)eb, &beta, dC, ct, ldc, (long long)ec,
                                        batch, CUBLAS_COMPUTE_32F_FAST_16F, CUBLAS_GEMM_DEFAULT);
    CHECK_EQ_INT(st, CUBLAS_STATUS_SUCCESS);
    std::vector<unsigned char> R(C.size());
    cudaMemcpy(R.data(), dC, R.size(), cudaMemcpyDeviceToHost);
    double worst = 0;
    for (int b = 0; b < batch; b++)
        for (int j = 0; j < n; j++)
            for (int i = 0; i < m; i++) {
                double s = 0, scale = 0;
                for (int p = 0; p < k; p++) {
                    size_t ai = b * ea + (ta == CUBLAS_OP_N ? i + (size_t)p * lda : p + (size_t)i * lda);
                    size_t bi = b * eb + (tb == CUBLAS_OP_N ? p + (size_t)j * ldb : j + (size_t)p * ldb);
                    double pr = (double)get(A, ab, ai) * get(B, ab, bi);
                    s += pr;
                    scale += fabs(pr);
                }
                size_t ci = b * ec + i + (size_t)j * ldc;
                double want = alpha * s + (double)beta * get(C, ct, ci);
                double err = fabs(get(R, ct, ci) - want) / (scale + 1.0);
                worst = std::max(worst, err);
            }
    /* Padding between columns is untouched. */
    if (ldc > m)
        CHECK(memcmp(&R[(size_t)m * szc], &C[(size_t)m * szc], szc) == 0);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
    return worst;
}

static void test_cublas(void)
{
    cublasHandle_t h;
    CHECK_EQ_INT(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    cudaStream_t s;
    CHECK_EQ_INT(cudaStreamCreate(&s), cudaSuccess);
    CHECK_EQ_INT(cublasSetStream(h, s), CUBLAS_STATUS_SUCCESS);
    cudaStream_t got = nullptr;
    CHECK_EQ_INT(cublasGetStream(h, &got), CUBLAS_STATUS_SUCCESS);
    CHECK(got == s);
    CHECK_EQ_INT(cublasSetMathMode(h, CUBLAS_DEFAULT_MATH), CUBLAS_STATUS_SUCCESS);
    const cudaDataType types[3] = {CUDA_R_32F, CUDA_R_16F, CUDA_R_16BF};
    const cublasOperation_t ops[2] = {CUBLAS_OP_N, CUBLAS_OP_T};
    for (cudaDataType ab : types)
        for (int same = 0; same < 2; same++) {
            cudaDataType ct = same ? ab : CUDA_R_32F;
            if (same && ab == CUDA_R_32F)
                continue;
            /* Output rounding dominates for 16-bit C. */
            double tol = ct == CUDA_R_32F ? 1e-5 : ct == CUDA_R_16F ? 2e-3 : 1.6e-2;
            for (cublasOperation_t ta : ops)
                for (cublasOperation_t tb : ops) {
                    double e1 = gemm_case(h, ta, tb, 37, 5, 70, ab, ct, 1, 0.0f);
                    double e2 = gemm_case(h, ta, tb, 129, 67, 100, ab, ct, 1, 0.5f);
                    double e3 = gemm_case(h, ta, tb, 9, 3, 17, ab, ct, 3, 1.0f);
                    if (!(e1 <= tol && e2 <= tol && e3 <= tol))
                        fprintf(stderr, "gemm types %d/%d ops %d%d: errors %g %g %g\n", (int)ab,
                                (int)ct, (int)ta, (int)tb, e1, e2, e3);
                    CHECK(e1 <= tol && e2 <= tol && e3 <= tol);
                }
        }
    (void)round_to;

    /* cublasSgemm, and beta = 0 never reading C (NaN there stays out). */
    const int m = 4, n = 3, k = 2;
    std::vector<float> A = {1, 2, 3, 4, 5, 6, 7, 8}, B = {1, 0, 0, 1, 1, 1};
    float *dA = dev_alloc<float>(8), *dB = dev_alloc<float>(6), *dC = dev_alloc<float>(12);
    to_dev(dA, A);
    to_dev(dB, B);
    float one = 1, zero = 0;
    CHECK_EQ_INT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &zero, dC, m),
                 CUBLAS_STATUS_SUCCESS);
    std::vector<float> C = from_dev(dC, 12);
    CHECK_NEAR(C[0], 1, 0);
    CHECK_NEAR(C[4], 5, 0);
    CHECK_NEAR(C[11], 4 + 8, 0);

    /* Unsupported combinations and bad arguments. */
    CHECK_EQ_INT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m, dB,
                              CUDA_R_16F, k, &zero, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_32F,
                              CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ_INT(cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, CUDA_R_32F, m, dB,
                              CUDA_R_32F, k, &zero, dC, CUDA_R_32F, m, CUBLAS_COMPUTE_64F,
                              CUBLAS_GEMM_DEFAULT),
                 CUBLAS_STATUS_NOT_SUPPORTED);
    CHECK_EQ_INT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m - 1, dB, k, &zero, dC,
                             m),
                 CUBLAS_STATUS_INVALID_VALUE);
    CHECK_EQ_STR(cublasGetStatusName(CUBLAS_STATUS_NOT_SUPPORTED), "CUBLAS_STATUS_NOT_SUPPORTED");

    /* Captured GEMM replays like the eager one. */
    CHECK_EQ_INT(cudaMemset(dC, 0, 48), cudaSuccess);
    cudaGraph_t g;
    cudaGraphExec_t ge;
    CHECK_EQ_INT(cudaStreamBeginCapture(s, cudaStreamCaptureModeGlobal), cudaSuccess);
    CHECK_EQ_INT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, m, n, k, &one, dA, m, dB, k, &one, dC, m),
                 CUBLAS_STATUS_SUCCESS);
    CHECK_EQ_INT(cudaStreamEndCapture(s, &g), cudaSuccess);
    CHECK_NEAR(from_dev(dC, 1)[0], 0, 0);
    CHECK_EQ_INT(cudaGraphInstantiate(&ge, g, 0), cudaSuccess);
    CHECK_EQ_INT(cudaGraphLaunch(ge, s), cudaSuccess);
    CHECK_EQ_INT(cudaGraphLaunch(ge, s), cudaSuccess);
    CHECK_NEAR(from_dev(dC, 12)[11], 24, 0);
    cudaGraphExecDestroy(ge);
    cudaGraphDestroy(g);

    CHECK_EQ_INT(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);
    cudaStreamDestroy(s);
    cudaFree(dA);
    cudaFree(dB);
    cudaFree(dC);
}

/* ---------------------------------------------------------------------- */
/* Limits                                                                  */
/* ---------------------------------------------------------------------- */

static void test_limits(void)
{
    int *flag = dev_alloc<int>(1);
    CHECK_EQ_INT(cudaMemset(flag, 0, 4), cudaSuccess);
    struct {
        dim3 g, b;
        size_t smem;
        int err;
    } cases[] = {
        {dim3(1), dim3(1025), 0, cudaErrorInvalidConfiguration},
        {dim3(1), dim3(32, 33), 0, cudaErrorInvalidConfiguration},
        {dim3(1), dim3(1, 1, 65), 0, cudaErrorInvalidConfiguration},
        {dim3(1), dim3(0), 0, cudaErrorInvalidConfiguration},
        {dim3(0), dim3(32), 0, cudaErrorInvalidConfiguration},
        {dim3(1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration},
        {dim3(1, 1, 65536), dim3(32), 0, cudaErrorInvalidConfiguration},
        {dim3(1), dim3(32), 48 * 1024 + 1, cudaErrorInvalidValue},
    };
    for (const auto &c : cases) {
        CINFER_LAUNCH(k_mark, c.g, c.b, c.smem, 0, flag);
        CHECK_EQ_INT(cudaGetLastError(), c.err);
    }
    CHECK_EQ_INT(from_dev(flag, 1)[0], 0); /* none ran */
    /* At the limits it runs. */
    CINFER_LAUNCH(k_mark, dim3(1, 65535), dim3(1), 0, 0, flag);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CINFER_LAUNCH(k_mark, dim3(1), dim3(1024), 48 * 1024, 0, flag);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CINFER_LAUNCH(k_mark, dim3(1), dim3(16, 1, 64), 0, 0, flag);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    CHECK_EQ_INT(from_dev(flag, 1)[0], 1);
    cudaFree(flag);
}

/* ---------------------------------------------------------------------- */
/* Planted bugs                                                            */
/* ---------------------------------------------------------------------- */

static void test_missing_barrier(void)
{
    unsigned long long seed0;
    int kind0 = cudasim_get_schedule(&seed0);
    std::vector<float> h(64);
    for (int i = 0; i < 64; i++)
        h[i] = (float)(i + 1);
    float *x = dev_alloc<float>(64), *out = dev_alloc<float>(1);
    to_dev(x, h);
    const float want = 64 * 65 / 2;
    int wrong_without = 0, wrong_with = 0;
    for (int kind = CUDASIM_SCHEDULE_FORWARD; kind <= CUDASIM_SCHEDULE_RANDOM; kind++) {
        cudasim_set_schedule(kind, 7);
        for (int barrier = 0; barrier < 2; barrier++) {
            CINFER_LAUNCH(k_sum_shared, dim3(1), dim3(64), 0, 0, x, out, barrier);
            CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
            float got = from_dev(out, 1)[0];
            if (got != want)
                (barrier ? wrong_with : wrong_without)++;
        }
    }
    CHECK(wrong_without >= 1); /* forward runs thread 0 first: it sums poison */
    CHECK_EQ_INT(wrong_with, 0);
    cudasim_set_schedule(kind0, seed0);
    cudaFree(x);
    cudaFree(out);
}

static void test_out_of_bounds(void)
{
    cudasim_set_asan_guards(0); /* the harness's own check, not ASan's */
    const int n = 100;
    float *x = dev_alloc<float>(n);
    CINFER_LAUNCH(k_oob, dim3(1), dim3(128), 0, 0, x, n);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK(report_has("write past the end of an allocation of 400 bytes"));
    CHECK(report_has("offsets 400..403"));
    CHECK(report_has("after kernel k_oob"));
    /* Sticky: later calls fail with it, cudaGetLastError does not clear it. */
    void *p = nullptr;
    CHECK_EQ_INT(cudaMalloc(&p, 16), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorIllegalAddress);
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaErrorIllegalAddress);
    fresh();
    CHECK_EQ_INT(cudasim_live_allocations(), 0);
}

/* Under ASan the guard zones are poisoned: the faulting write itself stops
 * the process with ASan's report (checked in a child process). */
static void test_asan_guards(void)
{
#ifdef TEST_ASAN
    int fd[2];
    CHECK_EQ_INT(pipe(fd), 0);
    fflush(stderr);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fd[1], 2);
        close(fd[0]);
        float *x = nullptr;
        cudaMalloc((void **)&x, 400);
        CINFER_LAUNCH(k_oob, dim3(1), dim3(128), 0, 0, x, 100); /* one block: this thread */
        _exit(0);
    }
    close(fd[1]);
    std::string out;
    char buf[4096];
    ssize_t k;
    while ((k = read(fd[0], buf, sizeof buf)) > 0)
        out.append(buf, (size_t)k);
    close(fd[0]);
    int status = 0;
    waitpid(pid, &status, 0);
    CHECK(!(WIFEXITED(status) && WEXITSTATUS(status) == 0));
    CHECK(out.find("AddressSanitizer: use-after-poison") != std::string::npos);
    CHECK(out.find("k_oob") != std::string::npos);
#endif
}

static void test_branch_barrier(void)
{
    float *x = dev_alloc<float>(64);
    long before = cudasim_report_count();
    CINFER_LAUNCH(k_branch_barrier, dim3(8), dim3(64), 0, 0, x);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorLaunchFailure);
    CHECK(report_has("not reached by thread ("));
    CHECK(report_has(": it exited"));
    CHECK(report_has("kernel k_branch_barrier block ("));
    /* No block starts after the failure: at most the blocks already running
     * on the CUDASIM_THREADS (2) OS threads report. */
    CHECK(cudasim_report_count() - before <= 2);
    CHECK_EQ_INT(cudaMemset(x, 0, 4), cudaErrorLaunchFailure);
    fresh();

    x = dev_alloc<float>(64);
    CINFER_LAUNCH(k_two_barriers, dim3(1), dim3(64), 0, 0, x);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorLaunchFailure);
    CHECK(report_has("waits at barrier at tests/cudasim/test_cudasim.cu:"));
    fresh();
}

static void test_unwritten_shared(void)
{
    float *out = dev_alloc<float>(128);
    CINFER_LAUNCH(k_unwritten, dim3(3), dim3(128), 0, 0, out);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    std::vector<float> h = from_dev(out, 128);
    int nan = 0;
    for (float v : h)
        nan += std::isnan(v);
    CHECK_EQ_INT(nan, 128);
    cudaFree(out);
}

static void test_bad_shuffles(void)
{
    const char *want[4] = {"mask 0x7fffffff leaves out the calling lane 31",
                           "of mask 0xffffffff exited", "source lane 16 is outside mask 0x0000ffff",
                           "of mask 0xffffffff never arrived (it waits at barrier at"};
    for (int kind = 0; kind < 4; kind++) {
        float *x = dev_alloc<float>(32);
        CHECK_EQ_INT(cudaMemset(x, 0, 128), cudaSuccess);
        CINFER_LAUNCH(k_bad_shfl, dim3(1), dim3(32), 0, 0, x, kind);
        CHECK_EQ_INT(cudaGetLastError(), cudaErrorIllegalInstruction);
        if (!report_has(want[kind]))
            fprintf(stderr, "bad shuffle %d: report \"%s\"\n", kind, cudasim_last_report());
        CHECK(report_has(want[kind]));
        fresh();
    }
}

static void test_faults(void)
{
    void *p[4] = {nullptr, nullptr, nullptr, nullptr};
    cudasim_inject_fault(2, cudaErrorMemoryAllocation, 0);
    CHECK_EQ_INT(cudaMalloc(&p[0], 16), cudaSuccess);
    CHECK_EQ_INT(cudaMalloc(&p[1], 16), cudaSuccess);
    CHECK_EQ_INT(cudaMalloc(&p[2], 16), cudaErrorMemoryAllocation);
    CHECK_EQ_INT(cudaMalloc(&p[3], 16), cudaSuccess);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorMemoryAllocation);
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    for (void *q : p)
        cudaFree(q);
    CHECK_EQ_INT(cudasim_live_allocations(), 0);

    /* A launch is a counted call too. */
    int *flag = dev_alloc<int>(1);
    cudaMemset(flag, 0, 4);
    cudasim_inject_fault(0, cudaErrorLaunchOutOfResources, 0);
    CINFER_LAUNCH(k_mark, dim3(1), dim3(1), 0, 0, flag);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorLaunchOutOfResources);
    CHECK_EQ_INT(from_dev(flag, 1)[0], 0);

    /* cuBLAS calls fail with EXECUTION_FAILED. */
    cublasHandle_t h;
    CHECK_EQ_INT(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
    float one = 1;
    cudasim_inject_fault(0, cudaErrorLaunchFailure, 0);
    CHECK_EQ_INT(cublasSgemm(h, CUBLAS_OP_N, CUBLAS_OP_N, 1, 1, 1, &one, (float *)flag, 1,
                             (float *)flag, 1, &one, (float *)flag, 1),
                 CUBLAS_STATUS_EXECUTION_FAILED);
    CHECK_EQ_INT(cublasDestroy(h), CUBLAS_STATUS_SUCCESS);

    /* Sticky: every later call returns it until the reset. */
    cudasim_inject_fault(1, cudaErrorECCUncorrectable, 1);
    CHECK_EQ_INT(cudaMemset(flag, 0, 4), cudaSuccess);
    CHECK_EQ_INT(cudaMemset(flag, 0, 4), cudaErrorECCUncorrectable);
    CHECK_EQ_INT(cudaMemset(flag, 0, 4), cudaErrorECCUncorrectable);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorECCUncorrectable);
    CHECK_EQ_INT(cudaGetLastError(), cudaErrorECCUncorrectable);
    CHECK_EQ_INT(cudaFree(flag), cudaErrorECCUncorrectable);
    CHECK_EQ_INT(cudasim_live_allocations(), 0); /* released all the same */
    fresh();
    CHECK_EQ_INT(cudaMalloc(&p[0], 16), cudaSuccess);
    CHECK_EQ_INT(cudaFree(p[0]), cudaSuccess);

    /* From the environment, as a whole server process would be tested
     * (cudasim_reset re-reads it; fresh's cudaGetLastError is call 0). */
    setenv("CUDASIM_FAULT", "1:cudaErrorMemoryAllocation", 1);
    fresh();
    CHECK_EQ_INT(cudaMalloc(&p[0], 16), cudaErrorMemoryAllocation);
    CHECK_EQ_INT(cudaMalloc(&p[0], 16), cudaSuccess);
    CHECK_EQ_INT(cudaFree(p[0]), cudaSuccess);
    setenv("CUDASIM_FAULT", "0:719:sticky", 1); /* cudaErrorLaunchFailure */
    cudasim_reset();
    CHECK_EQ_INT(cudaMalloc(&p[0], 16), cudaErrorLaunchFailure);
    CHECK_EQ_INT(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
    unsetenv("CUDASIM_FAULT");
    fresh();
}

/* CUDASIM_DEVICES=0: the no-GPU path. */
static void test_no_device(void)
{
    setenv("CUDASIM_DEVICES", "0", 1);
    cudasim_reset();
    int count = -1;
    CHECK_EQ_INT(cudaGetDeviceCount(&count), cudaErrorNoDevice);
    CHECK_EQ_INT(count, 0);
    void *p = nullptr;
    CHECK_EQ_INT(cudaMalloc(&p, 16), cudaErrorNoDevice);
    cudaStream_t s;
    CHECK_EQ_INT(cudaStreamCreate(&s), cudaErrorNoDevice);
    unsetenv("CUDASIM_DEVICES");
    fresh();
    CHECK_EQ_INT(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK_EQ_INT(count, 1);
}

/* ---------------------------------------------------------------------- */
/* NCCL                                                                    */
/* ---------------------------------------------------------------------- */

static void test_nccl(void)
{
    setenv("CUDASIM_DEVICES", "2", 1);
    fresh();
    int count = 0;
    CHECK_EQ_INT(cudaGetDeviceCount(&count), cudaSuccess);
    CHECK_EQ_INT(count, 2);
    const int n = 777;

    /* One thread drives both ranks through a group. */
    ncclComm_t comms[2];
    int devs[2] = {0, 1};
    CHECK_EQ_INT(ncclCommInitAll(comms, 2, devs), ncclSuccess);
    float *send[2], *recv[2];
    for (int r = 0; r < 2; r++) {
        CHECK_EQ_INT(cudaSetDevice(r), cudaSuccess);
        send[r] = dev_alloc<float>(n);
        recv[r] = dev_alloc<float>(2 * n);
        std::vector<float> h(n);
        for (int i = 0; i < n; i++)
            h[i] = (float)(i * (r + 1));
        to_dev(send[r], h);
    }
    CHECK_EQ_INT(ncclGroupStart(), ncclSuccess);
    for (int r = 0; r < 2; r++)
        CHECK_EQ_INT(ncclAllReduce(send[r], recv[r], n, ncclFloat, ncclSum, comms[r], 0), ncclSuccess);
    CHECK_EQ_INT(ncclGroupEnd(), ncclSuccess);
    for (int r = 0; r < 2; r++)
        CHECK_NEAR(from_dev(recv[r], n)[n - 1], 3.0 * (n - 1), 0);
    int rank = -1, nr = 0;
    CHECK_EQ_INT(ncclCommUserRank(comms[1], &rank), ncclSuccess);
    CHECK_EQ_INT(ncclCommCount(comms[1], &nr), ncclSuccess);
    CHECK_EQ_INT(rank, 1);
    CHECK_EQ_INT(nr, 2);
    for (int r = 0; r < 2; r++)
        CHECK_EQ_INT(ncclCommDestroy(comms[r]), ncclSuccess);

    /* A thread per rank: half and bf16 sums, all-gather, a mismatch. */
    ncclUniqueId id;
    CHECK_EQ_INT(ncclGetUniqueId(&id), ncclSuccess);
    int results[2][4] = {{-1, -1, -1, -1}, {-1, -1, -1, -1}};
    float got[2][3] = {{0}};
    auto rank_main = [&](int r) {
        cudaSetDevice(r);
        ncclComm_t c;
        results[r][0] = ncclCommInitRank(&c, 2, id, r);
        __half *h = nullptr;
        __nv_bfloat16 *b = nullptr;
        cudaMalloc((void **)&h, 4 * sizeof(__half));
        cudaMalloc((void **)&b, 4 * sizeof(__nv_bfloat16));
        std::vector<__half> hh(4, __float2half(0.5f + r));
        std::vector<__nv_bfloat16> hb(4, __float2bfloat16(1.5f * (r + 1)));
        cudaMemcpy(h, hh.data(), 8, cudaMemcpyHostToDevice);
        cudaMemcpy(b, hb.data(), 8, cudaMemcpyHostToDevice);
        results[r][1] = ncclAllReduce(h, h, 4, ncclHalf, ncclSum, c, 0); /* in place */
        results[r][2] = ncclAllReduce(b, b, 4, ncclBfloat16, ncclSum, c, 0);
        cudaMemcpy(hh.data(), h, 8, cudaMemcpyDeviceToHost);
        cudaMemcpy(hb.data(), b, 8, cudaMemcpyDeviceToHost);
        got[r][0] = __half2float(hh[3]);
        got[r][1] = __bfloat162float(hb[3]);
        results[r][3] = ncclAllGather(send[r], recv[r], n, ncclFloat, c, 0);
        got[r][2] = from_dev(recv[r] + n, n)[5]; /* rank 1's part */
        /* Counts disagree: both ranks fail. */
        if (ncclAllReduce(send[r], recv[r], r ? n : n - 1, ncclFloat, ncclSum, c, 0) != ncclSuccess)
            results[r][0] += 100;
        ncclCommDestroy(c);
        cudaFree(h);
        cudaFree(b);
    };
    std::thread t0(rank_main, 0), t1(rank_main, 1);
    t0.join();
    t1.join();
    for (int r = 0; r < 2; r++) {
        CHECK_EQ_INT(results[r][0], 100); /* init ok, then the mismatch failed */
        CHECK_EQ_INT(results[r][1], ncclSuccess);
        CHECK_EQ_INT(results[r][2], ncclSuccess);
        CHECK_EQ_INT(results[r][3], ncclSuccess);
        CHECK_NEAR(got[r][0], 2.0, 0);
        CHECK_NEAR(got[r][1], 4.5, 0);
        CHECK_NEAR(got[r][2], 10.0, 0);
    }
    CHECK(report_has("ncclInvalidUsage"));
    for (int r = 0; r < 2; r++) {
        cudaFree(send[r]);
        cudaFree(recv[r]);
    }
    CHECK_EQ_INT(cudasim_live_allocations(), 0);
    unsetenv("CUDASIM_DEVICES");
    fresh();
}

/* ---------------------------------------------------------------------- */
/* Timing (printed, not checked)                                           */
/* ---------------------------------------------------------------------- */

static void test_timing(void)
{
    const int n = 4096 * 4096;
    float *x = dev_alloc<float>(n);
    CHECK_EQ_INT(cudaMemset(x, 0, (size_t)n * 4), cudaSuccess);
    cudasim_stats s0 = cudasim_get_stats();
    double t0 = now_s();
    CINFER_LAUNCH(k_elementwise, dim3(n / 256), dim3(256), 0, 0, x, n);
    double t1 = now_s();
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    cudasim_stats s1 = cudasim_get_stats();
    CHECK_NEAR(from_dev(x + n - 1, 1)[0], 1, 0);
    fprintf(stderr, "timing (CPU time): 4096x4096 elementwise kernel %.3f s, %.1f ns per thread, %lld switches\n",
            t1 - t0, (t1 - t0) * 1e9 / n, s1.switches - s0.switches);
    cudaFree(x);

    const int blocks = 64, rounds = 20;
    float *y = dev_alloc<float>(blocks * 256);
    s0 = cudasim_get_stats();
    t0 = now_s();
    CINFER_LAUNCH(k_barriers, dim3(blocks), dim3(256), 0, 0, y, rounds);
    t1 = now_s();
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    s1 = cudasim_get_stats();
    long long sw = s1.switches - s0.switches;
    fprintf(stderr, "timing: %d barriers x 256 threads x %d blocks: %.3f s, %lld switches, %.1f ns "
                    "per switch (all costs included)\n",
            2 * rounds, blocks, t1 - t0, sw, (t1 - t0) * 1e9 / (double)sw);
    std::vector<float> hy = from_dev(y, 256);
    CHECK_NEAR(hy[0], (float)((0 + rounds) % 256), 0);
    cudaFree(y);

    std::vector<float> hw(256 * 1024, 1.0f);
    float *xw = dev_alloc<float>(hw.size()), *ow = dev_alloc<float>(1024);
    to_dev(xw, hw);
    t0 = now_s();
    CINFER_LAUNCH(k_warp_reduce, dim3(1024), dim3(256), 0, 0, xw, ow);
    t1 = now_s();
    CHECK_EQ_INT(cudaGetLastError(), cudaSuccess);
    fprintf(stderr, "timing: warp-shuffle reduction, 1024 blocks of 256: %.3f s (%.1f ns per thread)\n",
            t1 - t0, (t1 - t0) * 1e9 / (256.0 * 1024));
    cudaFree(xw);
    cudaFree(ow);

    cublasHandle_t h;
    cublasCreate(&h);
    const int m = 512, nn = 512, k = 512;
    float *A = dev_alloc<float>(m * k), *B = dev_alloc<float>(k * nn), *C = dev_alloc<float>(m * nn);
    cudaMemset(A, 0, m * k * 4);
    cudaMemset(B, 0, k * nn * 4);
    float one = 1, zero = 0;
    t0 = now_s();
    cublasSgemm(h, CUBLAS_OP_T, CUBLAS_OP_N, m, nn, k, &one, A, k, B, k, &zero, C, m);
    t1 = now_s();
    fprintf(stderr, "timing: 512^3 SGEMM %.3f s (%.2f GFLOP/s)\n", t1 - t0,
            2.0 * m * nn * k / (t1 - t0) * 1e-9);
    cublasDestroy(h);
    cudaFree(A);
    cudaFree(B);
    cudaFree(C);
}

int main(void)
{
    RUN(test_launch_and_coords);
    RUN(test_block_reduce);
    RUN(test_shuffles);
    RUN(test_votes);
    RUN(test_atomics);
    RUN(test_dp4a);
    RUN(test_half_bf16);
    RUN(test_dynamic_shared);
    RUN(test_memory);
    RUN(test_device);
    RUN(test_streams_events);
    RUN(test_graphs);
    RUN(test_cublas);
    RUN(test_limits);
    RUN(test_missing_barrier);
    RUN(test_out_of_bounds);
    RUN(test_asan_guards);
    RUN(test_branch_barrier);
    RUN(test_unwritten_shared);
    RUN(test_bad_shuffles);
    RUN(test_faults);
    RUN(test_no_device);
    RUN(test_nccl);
    RUN(test_timing);
    CHECK_EQ_INT(cudasim_live_allocations(), 0);
    return harness_done();
}
