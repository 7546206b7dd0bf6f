/*
 * cinfer-kbench - micro-benchmark of the CPU matrix-product kernels
 * (kernels/cpu/matmul.h) against the machine's own floors.
 *
 * Floors, measured in the same run:
 *   - read bandwidth: a plain vector sum over a 256 MB buffer, 1 and 2
 *     threads, and the same sum prefetching ahead non-temporally (as the
 *     decode kernels do); a decode step streams every weight once, so the
 *     better of the two is what it can approach;
 *   - peak fp32 FMA: independent fused multiply-adds in registers, per ISA;
 *   - peak int8 dot: the instructions the int8-block kernels multiply with
 *     (vpdpbusd on AVX-512 VNNI, vpmaddubsw + vpmaddwd + vpaddd on AVX2),
 *     independent, in registers;
 *   - int8 block mix (AVX-512): what the reduction order of matmul_impl.h
 *     asks per 64 int8 multiply-adds, vpdpbusd + vcvtdq2ps + vfmadd231ps,
 *     independent, in registers: the ceiling of any kernel that keeps
 *     GGML's bits (on Zen 5 the FMA shares vpdpbusd's two pipes);
 *   - peak bf16 dot (AVX512-BF16): vdpbf16ps, independent, in registers.
 * Kernels, per ISA and weight type, at 1 and 2 threads:
 *   - decode (n = 1): one pass over distinct matrices totalling about the
 *     default model's weight bytes (93 MB), so the weights come from DRAM,
 *     not cache; reported as GB/s of weights and % of the bandwidth floor;
 *   - decode of the default model's own matmul shapes for one token (30
 *     layers of Q4_1 projections and the 49152 x 576 Q8_0 output);
 *   - prefill (n = 128, 512): GFLOP/s (2 n n_out n_in / time) including the
 *     activation prepare, and % of the int8 dot peak (block types) or of
 *     the FMA floor (float types);
 *   - batched products at 16 .. 512 rows, each timing followed by the
 *     peak of its instructions measured again (int8 dot and block mix for
 *     the int8-block types, bf16 dot for BF16 on AVX-512, fp32 FMA for
 *     F16 and for BF16 on AVX2), medians of the rounds: the ratio pairs
 *     measurements taken moments apart, so another process on a shared
 *     machine slows both sides of it.
 * --cpu-time times the batched cells and the floors by each thread's CPU
 * time (CLOCK_THREAD_CPUTIME_ID, the slowest thread's), so time slices
 * another process takes do not count: on a busy shared machine the
 * figures an idle one would give, where wall time gives noise.
 * --json FILE also writes the floors and the batched cells as JSON, for
 * the benchmark scripts.
 * Threads are plain pthreads, each taking a contiguous range of output
 * columns (rows of the activation for prepare), with a spinning barrier
 * between phases, as the backend's pool does.
 *
 *     cinfer-kbench                      all ISAs, all types
 *     cinfer-kbench --isa avx512 --types q4_1,q8_0 --threads 2
 *     cinfer-kbench --no-decode --no-prefill --json floors.json
 *     cinfer-kbench --no-decode --no-prefill --cpu-time --types q4_1,bf16
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "common/huge_pages.h"
#include "kernels/cpu/matmul.h"

#if defined(__x86_64__)
#include <immintrin.h>
#define KB_X86 1
#endif

#define MAX_THREADS 2

static double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* --cpu-time: time by the calling thread's CPU time. */
static int g_cpu_time;

static double thread_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double max_of(const double *v, int n)
{
    double m = 0.0;
    for (int i = 0; i < n; i++)
        m = v[i] > m ? v[i] : m;
    return m;
}

/* ---------------------------------------------------------------------- */
/* a tiny spinning thread team                                            */
/* ---------------------------------------------------------------------- */

typedef void (*team_fn)(void *ctx, int ith, int nth);

typedef struct {
    int nth;
    pthread_t th[MAX_THREADS];
    _Atomic unsigned gen;       /* bumped to start a job */
    _Atomic int done;           /* workers finished the current job */
    _Atomic int quit;
    team_fn fn;
    void *ctx;
    _Atomic int bar_count;      /* barrier inside a job */
    _Atomic unsigned bar_gen;
} team;

typedef struct {
    team *tm;
    int ith;
} worker_arg;

static worker_arg g_wargs[MAX_THREADS];

static void team_barrier(team *tm)
{
    if (tm->nth == 1)
        return;
    unsigned g = atomic_load(&tm->bar_gen);
    if (atomic_fetch_add(&tm->bar_count, 1) == tm->nth - 1) {
        atomic_store(&tm->bar_count, 0);
        atomic_fetch_add(&tm->bar_gen, 1);
    } else {
        while (atomic_load(&tm->bar_gen) == g)
            ;
    }
}

static void *worker_main(void *p)
{
    worker_arg *wa = p;
    team *tm = wa->tm;
    unsigned seen = 0;
    for (;;) {
        unsigned g;
        long spins = 0;
        /* Spin while jobs come back to back; sleep when idle so a waiting
         * team does not hold a core. */
        while ((g = atomic_load(&tm->gen)) == seen && !atomic_load(&tm->quit)) {
            if (++spins > 2000000) {
                struct timespec ts = {0, 50000};
                nanosleep(&ts, NULL);
            }
        }
        if (atomic_load(&tm->quit))
            return NULL;
        seen = g;
        tm->fn(tm->ctx, wa->ith, tm->nth);
        atomic_fetch_add(&tm->done, 1);
    }
}

static void team_start(team *tm, int nth)
{
    memset(tm, 0, sizeof(*tm));
    tm->nth = nth;
    for (int i = 1; i < nth; i++) {
        g_wargs[i].tm = tm;
        g_wargs[i].ith = i;
        pthread_create(&tm->th[i], NULL, worker_main, &g_wargs[i]);
    }
}

/* Runs fn on every thread (the caller is thread 0) and waits. */
static void team_run(team *tm, team_fn fn, void *ctx)
{
    tm->fn = fn;
    tm->ctx = ctx;
    atomic_store(&tm->done, 0);
    atomic_fetch_add(&tm->gen, 1);
    fn(ctx, 0, tm->nth);
    while (atomic_load(&tm->done) != tm->nth - 1)
        ;
}

static void team_stop(team *tm)
{
    atomic_store(&tm->quit, 1);
    for (int i = 1; i < tm->nth; i++)
        pthread_join(tm->th[i], NULL);
}

/* ---------------------------------------------------------------------- */
/* floors                                                                 */
/* ---------------------------------------------------------------------- */

typedef struct {
    const float *buf;
    size_t n;           /* floats */
    int nta;            /* prefetch ahead with prefetchnta */
    float sums[MAX_THREADS];
} bw_ctx;

#ifdef KB_X86
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n, int nta)
{
    __m256 s0 = _mm256_setzero_ps(), s1 = s0, s2 = s0, s3 = s0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        if (nta)
            _mm_prefetch((const char *)(p + i + 1024), _MM_HINT_NTA);
        s0 = _mm256_add_ps(s0, _mm256_loadu_ps(p + i));
        s1 = _mm256_add_ps(s1, _mm256_loadu_ps(p + i + 8));
        s2 = _mm256_add_ps(s2, _mm256_loadu_ps(p + i + 16));
        s3 = _mm256_add_ps(s3, _mm256_loadu_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(s0, s1), _mm256_add_ps(s2, s3));
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[1] + t[2] + t[3] + t[4] + t[5] + t[6] + t[7];
}
#endif

static float sum_plain(const float *p, size_t n)
{
    float s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++)
            s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static void bw_job(void *p, int ith, int nth)
{
    bw_ctx *c = p;
    size_t per = c->n / (size_t)nth / 32 * 32;
    const float *b = c->buf + per * (size_t)ith;
#ifdef KB_X86
    if (cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX2)) {
        c->sums[ith] = sum_avx2(b, per, c->nta);
        return;
    }
#endif
    c->sums[ith] = sum_plain(b, per);
}

static double measure_bw(team *tm, const float *buf, size_t bytes, int nta)
{
    bw_ctx c = {.buf = buf, .n = bytes / 4, .nta = nta};
    double best = 1e30;
    for (int rep = 0; rep < 8; rep++) {
        double t0 = now_s();
        team_run(tm, bw_job, &c);
        double t = now_s() - t0;
        best = t < best ? t : best;
    }
    return (double)bytes / best / 1e9;
}

/* Which peak: fp32 FMA, int8 dot, the int8 block mix, bf16 dot. */
enum { PK_FMA, PK_DOT, PK_MIX, PK_BF16 };

typedef struct {
    cinfer_cpu_isa isa;
    int dot; /* PK_* */
    long iters;
    float sink[MAX_THREADS];
    double cpu_s[MAX_THREADS]; /* each thread's CPU time */
} fma_ctx;

#ifdef KB_X86
__attribute__((target("avx512f"))) static float fma_avx512(long iters)
{
    __m512 a[12];
    __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_fmadd_ps(a[i], m, c);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}

__attribute__((target("avx2,fma"))) static float fma_avx2(long iters)
{
    __m256 a[12];
    __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-7f);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm256_fmadd_ps(a[i], m, c);
    __m256 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_ps(s, a[i]);
    float t[8];
    _mm256_storeu_ps(t, s);
    return t[0] + t[7];
}
#endif

static float fma_plain(long iters)
{
    float a[16];
    for (int i = 0; i < 16; i++)
        a[i] = (float)i;
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 16
        for (int i = 0; i < 16; i++)
            a[i] = a[i] * 0.999999f + 1e-7f;
    return a[0] + a[15];
}

/* Peak int8 dot-product rate (vpdpbusd: 64 u8 x s8 multiply-adds per
 * instruction), the ceiling of the int8-block kernels' products. */
#ifdef KB_X86
__attribute__((target("avx512f,avx512vnni"))) static float dot_vnni(long iters)
{
    __m512i a[12];
    const __m512i u = _mm512_set1_epi8(3), v = _mm512_set1_epi8(-2);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_epi32(i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_dpbusd_epi32(a[i], u, v);
    __m512i s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_epi32(s, a[i]);
    return (float)_mm512_reduce_add_epi32(s);
}
#endif

/* The int8 block mix: per 64 multiply-adds one vpdpbusd from a fresh
 * start, its conversion and one FMA into a float accumulator, as the
 * int8-block kernels must do per block and pair of rows to keep the
 * reduction order. Eight weight registers, so no product is reused. */
#ifdef KB_X86
__attribute__((target("avx512f,avx512vnni"))) static float mix_vnni(long iters)
{
    __m512 acc[8];
    __m512i w[8];
    __m512i u = _mm512_set1_epi8(3);
    const __m512i z = _mm512_setzero_si512();
    const __m512 d = _mm512_set1_ps(1e-9f);
    for (int i = 0; i < 8; i++) {
        acc[i] = _mm512_setzero_ps();
        w[i] = _mm512_set1_epi8((char)(i - 4));
    }
    for (long k = 0; k < iters; k++) {
        __asm__ volatile("" : "+v"(u));
#pragma GCC unroll 8
        for (int i = 0; i < 8; i++)
            acc[i] = _mm512_fmadd_ps(d, _mm512_cvtepi32_ps(_mm512_dpbusd_epi32(z, u, w[i])),
                                     acc[i]);
    }
    __m512 s = acc[0];
    for (int i = 1; i < 8; i++)
        s = _mm512_add_ps(s, acc[i]);
    return _mm512_reduce_add_ps(s);
}

/* Peak bf16 dot rate (vdpbf16ps: 32 bf16 multiply-adds per instruction). */
__attribute__((target("avx512f,avx512bf16"))) static float dot_bf16(long iters)
{
    __m512 a[12];
    const __m512i u = _mm512_set1_epi16(0x3f80), v = _mm512_set1_epi16(0x3c00);
    for (int i = 0; i < 12; i++)
        a[i] = _mm512_set1_ps((float)i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++)
            a[i] = _mm512_dpbf16_ps(a[i], (__m512bh)u, (__m512bh)v);
    __m512 s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm512_add_ps(s, a[i]);
    return _mm512_reduce_add_ps(s);
}
#endif

/* The same products on AVX2, as its int8-block kernels compute them:
 * vpmaddubsw (32 u8 x s8 products, summed in pairs), vpmaddwd by ones (the
 * pairs into the int32 sums of four that vpdpbusd makes) and vpaddd. The
 * empty asm makes every step use a "new" u, so no product is reused. */
#ifdef KB_X86
__attribute__((target("avx2"))) static float dot_avx2(long iters)
{
    __m256i a[12];
    __m256i u = _mm256_set1_epi8(3);
    const __m256i v = _mm256_set1_epi8(-2), ones = _mm256_set1_epi16(1);
    for (int i = 0; i < 12; i++)
        a[i] = _mm256_set1_epi32(i);
    for (long k = 0; k < iters; k++)
#pragma GCC unroll 12
        for (int i = 0; i < 12; i++) {
            __asm__ volatile("" : "+x"(u));
            a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(_mm256_maddubs_epi16(u, v), ones));
        }
    __m256i s = a[0];
    for (int i = 1; i < 12; i++)
        s = _mm256_add_epi32(s, a[i]);
    return (float)_mm256_extract_epi32(s, 0);
}
#endif

/* FLOPs of one inner step of each variant. */
static double fma_flops_per_iter(cinfer_cpu_isa isa)
{
    switch (isa) {
    case CINFER_CPU_ISA_AVX512: return 12.0 * 16 * 2;
    case CINFER_CPU_ISA_AVX2: return 12.0 * 8 * 2;
    default: return 16.0 * 2;
    }
}

static float peak_kernel(const fma_ctx *c)
{
#ifdef KB_X86
    const int z = c->isa == CINFER_CPU_ISA_AVX512;
    switch (c->dot) {
    case PK_DOT: return z ? dot_vnni(c->iters) : dot_avx2(c->iters);
    case PK_MIX: return mix_vnni(c->iters);
    case PK_BF16: return dot_bf16(c->iters);
    default: break;
    }
    switch (c->isa) {
    case CINFER_CPU_ISA_AVX512: return fma_avx512(c->iters);
    case CINFER_CPU_ISA_AVX2: return fma_avx2(c->iters);
    default: break;
    }
#endif
    return fma_plain(c->iters);
}

static void fma_job(void *p, int ith, int nth)
{
    fma_ctx *c = p;
    (void)nth;
    double t0 = thread_s();
    c->sink[ith] = peak_kernel(c);
    c->cpu_s[ith] = thread_s() - t0;
}

/* Aggregate rate (GFLOP/s, or int8 GOP/s: a multiply-add counts two) of
 * all the team's threads for peak kind `dot` (PK_*). */
static double measure_peak_n(team *tm, cinfer_cpu_isa isa, int dot, long iters, int reps)
{
    fma_ctx c = {.isa = isa, .dot = dot, .iters = iters};
    double best = 1e30;
    for (int rep = 0; rep < reps; rep++) {
        double t0 = now_s();
        team_run(tm, fma_job, &c);
        double t = g_cpu_time ? max_of(c.cpu_s, tm->nth) : now_s() - t0;
        best = t < best ? t : best;
    }
    double per_iter = dot == PK_FMA    ? fma_flops_per_iter(isa)
                      : dot == PK_MIX  ? 8.0 * 64 * 2
                      : dot == PK_BF16 ? 12.0 * 32 * 2
                      : isa == CINFER_CPU_ISA_AVX512 ? 12.0 * 64 * 2
                                                     : 12.0 * 32 * 2;
    return per_iter * (double)c.iters * tm->nth / best / 1e9;
}

static double measure_peak(team *tm, cinfer_cpu_isa isa, int dot)
{
    return measure_peak_n(tm, isa, dot, 20000000, 5);
}

static double measure_fma(team *tm, cinfer_cpu_isa isa)
{
    return measure_peak(tm, isa, PK_FMA);
}

/* The int8 dot-product peak of an ISA's int8-block kernels (vpdpbusd on
 * AVX-512 VNNI, vpmaddubsw + vpmaddwd on AVX2); 0 where the ISA is absent
 * or has no such instructions. */
static int has_dot(cinfer_cpu_isa isa)
{
#ifdef KB_X86
    return (isa == CINFER_CPU_ISA_AVX512 || isa == CINFER_CPU_ISA_AVX2) &&
           cinfer_cpu_isa_supported(isa);
#else
    (void)isa;
    return 0;
#endif
}

static const char *dot_name(cinfer_cpu_isa isa)
{
    return isa == CINFER_CPU_ISA_AVX512 ? "vpdpbusd" : "vpmaddubsw+vpmaddwd";
}

static double measure_dot(team *tm, cinfer_cpu_isa isa)
{
    return has_dot(isa) ? measure_peak(tm, isa, PK_DOT) : 0.0;
}

/* The AVX-512 block mix and bf16 dot exist where AVX-512 does (the
 * backend's AVX-512 level includes VNNI and BF16). */
static int has_avx512_peaks(cinfer_cpu_isa isa)
{
    return isa == CINFER_CPU_ISA_AVX512 && has_dot(isa);
}

/* ---------------------------------------------------------------------- */
/* kernels                                                                */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_cpu_isa isa;
    cinfer_dtype wt;
    int n_mats;
    const uint8_t *const *w; /* n_mats weight matrices */
    size_t w_row_bytes;
    int64_t n_out, n_in, n;
    const float *x;          /* [n, n_in] */
    void *act;               /* prepared activations */
    float *out;              /* [n, n_out] */
    team *tm;
    /* Optional per-matrix shapes and types (the model mix); when set they
     * override wt, n_out, n_in and w_row_bytes. */
    const cinfer_dtype *m_wt;
    const int64_t *m_out, *m_in;
    int packed; /* w packed (matmul.h), as the backend holds them */
    double prep_s[MAX_THREADS], comp_s[MAX_THREADS]; /* each thread's CPU time */
} mm_ctx;

/* Column range of thread ith, in multiples of 16 columns. */
static void split_cols(int64_t n_out, int ith, int nth, int64_t *o0, int64_t *o1)
{
    int64_t units = (n_out + 15) / 16;
    int64_t a = units * ith / nth * 16, b = units * (ith + 1) / nth * 16;
    *o0 = a < n_out ? a : n_out;
    *o1 = b < n_out ? b : n_out;
}

static void mm_job(void *p, int ith, int nth)
{
    mm_ctx *c = p;
    int64_t r0 = c->n * ith / nth, r1 = c->n * (ith + 1) / nth;
    for (int m = 0; m < c->n_mats; m++) {
        cinfer_dtype wt = c->m_wt ? c->m_wt[m] : c->wt;
        int64_t n_out = c->m_out ? c->m_out[m] : c->n_out;
        int64_t n_in = c->m_in ? c->m_in[m] : c->n_in;
        size_t wrb = c->m_wt ? cinfer_dtype_row_bytes(wt, n_in) : c->w_row_bytes;
        cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
        int64_t o0, o1;
        split_cols(n_out, ith, nth, &o0, &o1);
        /* Each matrix prepares its input, as the model does per op (a few
         * hundred bytes at decode). */
        double t0 = thread_s();
        cinfer_cpu_matmul_prepare(c->isa, at, c->x, n_in, r0, r1, c->act);
        double t1 = thread_s();
        c->prep_s[ith] = t1 - t0;
        team_barrier(c->tm);
        t0 = thread_s();
#ifdef KB_X86
        if (c->packed)
            cinfer_cpu_matmul_compute_packed_avx512(wt, c->w[m], n_out, c->act,
                                                    c->n, n_in, c->out, n_out,
                                                    o0, o1);
        else
#endif
            cinfer_cpu_matmul_compute(c->isa, wt, c->w[m], wrb, c->act, c->n,
                                      n_in, c->out, n_out, o0, o1);
        c->comp_s[ith] = thread_s() - t0;
        team_barrier(c->tm);
    }
}

static uint8_t *make_matrix(cinfer_dtype wt, int64_t n_out, int64_t n_in,
                            uint64_t *seed)
{
    size_t rb = cinfer_dtype_row_bytes(wt, n_in);
    uint8_t *w = malloc(rb * (size_t)n_out);
    float *row = malloc(sizeof(float) * (size_t)n_in);
    if (!w || !row) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++) {
            *seed ^= *seed << 13;
            *seed ^= *seed >> 7;
            *seed ^= *seed << 17;
            row[i] = (float)((*seed >> 40) * (1.0 / 8388608.0)) - 1.0f;
        }
        cinfer_quantize_row(wt, row, w + rb * (size_t)o, n_in);
    }
    free(row);
    return w;
}

/* Packed copies of n matrices (type wt[m] or wt[0], shape out[m] x in[m]
 * or out[0] x in[0]) in one huge-page block, as the CPU backend holds its
 * weights; NULL when a type has no packed layout. *len gets the block's
 * length for cinfer_huge_free(ret[0], len). */
static uint8_t **pack_all(uint8_t *const *w, int n, const cinfer_dtype *wt,
                          const int64_t *out, const int64_t *in, int per_mat,
                          size_t *len)
{
    size_t total = 0;
    for (int m = 0; m < n; m++) {
        int k = per_mat ? m : 0;
        if (!cinfer_cpu_pack_rows(wt[k]))
            return NULL;
        total += (cinfer_dtype_row_bytes(wt[k], in[k]) * (size_t)out[k] + 63) / 64 * 64;
    }
    uint8_t *block = cinfer_huge_alloc(total, len);
    uint8_t **p = malloc(sizeof(*p) * (size_t)n);
    if (!block || !p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    size_t at = 0;
    for (int m = 0; m < n; m++) {
        int k = per_mat ? m : 0;
        p[m] = block + at;
        cinfer_cpu_pack(wt[k], w[m], out[k], in[k], p[m]);
        at += (cinfer_dtype_row_bytes(wt[k], in[k]) * (size_t)out[k] + 63) / 64 * 64;
    }
    return p;
}

/* The kernel variants measured: the ISAs over the file's layout, then
 * AVX-512 over packed weights ("avx512p"). */
#define VARIANT_PACKED (CINFER_CPU_ISA_AVX512 + 1)
static int variant_isa(int v) { return v == VARIANT_PACKED ? CINFER_CPU_ISA_AVX512 : v; }
static const char *variant_name(int v)
{
    return v == VARIANT_PACKED ? "avx512p" : cinfer_cpu_isa_name((cinfer_cpu_isa)v);
}

/* ---------------------------------------------------------------------- */
/* batched int8 products against the int8 dot peak                       */
/* ---------------------------------------------------------------------- */

/* One batched cell: median over BT_REPS rounds, each timing the kernel
 * (prepare + compute, best of a few runs) and then the int8 dot peak
 * again, so the ratio pairs two measurements taken moments apart: on a
 * shared machine another process slows both. */
#define BT_REPS 5

typedef struct {
    double gops, peak, ratio; /* medians */
    double mix, mix_ratio;    /* int8 block mix (AVX-512 int8 types), else 0 */
} bt_cell;

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof(*v), cmp_double);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* pk: the peak the cell is read against (PK_*); mix: also against the
 * int8 block mix. */
static bt_cell batched_cell(mm_ctx *c, team *tm, cinfer_cpu_isa isa, int pk_kind, int mix)
{
    double g[BT_REPS], pk[BT_REPS], ra[BT_REPS], mx[BT_REPS], mr[BT_REPS];
    const double ops = 2.0 * (double)c->n * (double)c->n_out * (double)c->n_in;
    team_run(tm, mm_job, c); /* warm the caches and the scratch */
    for (int rep = 0; rep < BT_REPS; rep++) {
        double best = 1e30, total = 0.0;
        for (int k = 0; k < 3 || (total < 0.04 && k < 100); k++) {
            double t0 = now_s();
            team_run(tm, mm_job, c);
            double dt = now_s() - t0;
            total += dt;
            if (g_cpu_time)
                dt = max_of(c->prep_s, tm->nth) + max_of(c->comp_s, tm->nth);
            best = dt < best ? dt : best;
        }
        g[rep] = ops / best / 1e9;
        pk[rep] = measure_peak_n(tm, isa, pk_kind, 1000000, 3);
        ra[rep] = g[rep] / pk[rep];
        mx[rep] = mix ? measure_peak_n(tm, isa, PK_MIX, 1000000, 3) : 0.0;
        mr[rep] = mix ? g[rep] / mx[rep] : 0.0;
    }
    bt_cell r = {median(g, BT_REPS), median(pk, BT_REPS), median(ra, BT_REPS),
                 median(mx, BT_REPS), median(mr, BT_REPS)};
    return r;
}

/* ---------------------------------------------------------------------- */
/* main                                                                   */
/* ---------------------------------------------------------------------- */

static const cinfer_dtype k_types[] = {
    CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0,
    CINFER_DTYPE_F16,  CINFER_DTYPE_BF16, CINFER_DTYPE_F32,
    CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q6_K,
    CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K, CINFER_DTYPE_IQ4_XS, CINFER_DTYPE_IQ4_NL,
};
#define N_TYPES (int)(sizeof(k_types) / sizeof(k_types[0]))

/* The inner size for a type: d_in rounded up to its block (576 -> 768 for
 * the 256-element K-quant super-blocks). */
static int64_t type_in(cinfer_dtype wt, int64_t d_in)
{
    const int64_t be = cinfer_dtype_block_elems(wt);
    return (d_in + be - 1) / be * be;
}

static void cpu_model(char *buf, size_t n)
{
    snprintf(buf, n, "unknown");
    FILE *f = fopen("/proc/cpuinfo", "r");
    if (!f)
        return;
    char line[512];
    while (fgets(line, sizeof(line), f)) {
        if (strncmp(line, "model name", 10) == 0) {
            char *c = strchr(line, ':');
            if (c) {
                c++;
                while (*c == ' ')
                    c++;
                c[strcspn(c, "\n")] = 0;
                snprintf(buf, n, "%s", c);
            }
            break;
        }
    }
    fclose(f);
}

static int parse_isa(const char *s, cinfer_cpu_isa *out)
{
    if (!strcmp(s, "portable"))
        *out = CINFER_CPU_ISA_PORTABLE;
    else if (!strcmp(s, "avx2"))
        *out = CINFER_CPU_ISA_AVX2;
    else if (!strcmp(s, "avx512"))
        *out = CINFER_CPU_ISA_AVX512;
    else
        return 0;
    return 1;
}

static void usage(void)
{
    fprintf(stderr,
            "usage: cinfer-kbench [--isa all|portable|avx2|avx512] "
            "[--types q4_1,q8_0,q4_0,f16,bf16,f32,q4_k,q5_k,q6_k,q2_k,q3_k,iq4_xs,iq4_nl]\n"
            "                     [--threads 1|2|1,2]\n"
            "                     [--decode-mb MB] [--no-prefill] [--no-decode] [--no-model]\n"
            "                     [--no-batched] [--cpu-time] [--json FILE]\n");
}

int main(int argc, char **argv)
{
    int isa_on[4] = {0, 1, 1, 1}; /* indexed by cinfer_cpu_isa */
    int type_on[N_TYPES];
    for (int i = 0; i < N_TYPES; i++)
        type_on[i] = 1;
    int thr_on[MAX_THREADS + 1] = {0, 1, 1};
    double decode_mb = 93.0;
    int do_prefill = 1, do_decode = 1, do_model = 1, do_batched = 1;
    const char *json_path = NULL;

    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--isa") && v) {
            i++;
            if (strcmp(v, "all") != 0) {
                cinfer_cpu_isa isa;
                if (!parse_isa(v, &isa)) {
                    usage();
                    return 2;
                }
                memset(isa_on, 0, sizeof(isa_on));
                isa_on[isa] = 1;
            }
        } else if (!strcmp(a, "--types") && v) {
            i++;
            for (int t = 0; t < N_TYPES; t++) {
                char name[16];
                snprintf(name, sizeof(name), "%s", cinfer_dtype_name(k_types[t]));
                for (char *c = name; *c; c++)
                    *c = (char)(*c >= 'A' && *c <= 'Z' ? *c - 'A' + 'a' : *c);
                type_on[t] = strstr(v, name) != NULL;
            }
        } else if (!strcmp(a, "--threads") && v) {
            i++;
            thr_on[1] = strchr(v, '1') != NULL;
            thr_on[2] = strchr(v, '2') != NULL;
        } else if (!strcmp(a, "--decode-mb") && v) {
            i++;
            decode_mb = atof(v);
        } else if (!strcmp(a, "--no-prefill")) {
            do_prefill = 0;
        } else if (!strcmp(a, "--no-decode")) {
            do_decode = 0;
        } else if (!strcmp(a, "--no-model")) {
            do_model = 0;
        } else if (!strcmp(a, "--no-batched")) {
            do_batched = 0;
        } else if (!strcmp(a, "--cpu-time")) {
            g_cpu_time = 1;
        } else if (!strcmp(a, "--json") && v) {
            i++;
            json_path = v;
        } else {
            usage();
            return 2;
        }
    }

    char model[256];
    cpu_model(model, sizeof(model));
    const char *coretype = getenv("OPENBLAS_CORETYPE");
    time_t tnow = time(NULL);
    char date[64];
    strftime(date, sizeof(date), "%Y-%m-%d %H:%M", localtime(&tnow));
    printf("cinfer-kbench  %s%s\n", date,
           g_cpu_time ? "  (floors and batched cells in thread CPU time)" : "");
    printf("cpu: %s, %ld online\n", model, (long)sysconf(_SC_NPROCESSORS_ONLN));
    printf("OPENBLAS_CORETYPE: %s\n", coretype ? coretype : "(unset)");

    team teams[MAX_THREADS + 1];
    for (int nt = 1; nt <= MAX_THREADS; nt++)
        team_start(&teams[nt], nt);

    /* floors */
    double bw[MAX_THREADS + 1] = {0};
    {
        /* In huge pages, as the CPU backend holds weights: with 4 KiB
         * pages the sum misses the TLB every page and reads slower than
         * the kernels stream packed weights. */
        size_t bytes = (size_t)256 << 20, blen = 0;
        float *buf = cinfer_huge_alloc(bytes, &blen);
        if (!buf) {
            fprintf(stderr, "out of memory\n");
            return 1;
        }
        for (size_t i = 0; i < bytes / 4; i++)
            buf[i] = (float)(i & 1023);
        printf("\nfloors (%% of bw below is against the better of the two sums; "
               "buffer in huge pages)\n");
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            double plain = measure_bw(&teams[nt], buf, bytes, 0);
            double nta = measure_bw(&teams[nt], buf, bytes, 1);
            bw[nt] = plain > nta ? plain : nta;
            printf("  read bandwidth, 256 MB sum                %d thr  %7.1f GB/s\n", nt, plain);
            printf("  read bandwidth, 256 MB sum + nta prefetch %d thr  %7.1f GB/s\n", nt, nta);
        }
        cinfer_huge_free(buf, blen);
    }
    double peak[4][MAX_THREADS + 1] = {{0}};
    for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++) {
        if (!isa_on[isa] || !cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
            continue;
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            peak[isa][nt] = measure_fma(&teams[nt], (cinfer_cpu_isa)isa);
            printf("  peak fp32 FMA, %-8s                   %d thr  %7.1f GFLOP/s\n",
                   cinfer_cpu_isa_name((cinfer_cpu_isa)isa), nt, peak[isa][nt]);
        }
    }
    double peak_dot[4][MAX_THREADS + 1] = {{0}};
    for (int isa = CINFER_CPU_ISA_AVX2; isa <= CINFER_CPU_ISA_AVX512; isa++) {
        if (!isa_on[isa] || !has_dot((cinfer_cpu_isa)isa))
            continue;
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            peak_dot[isa][nt] = measure_dot(&teams[nt], (cinfer_cpu_isa)isa);
            char label[64];
            snprintf(label, sizeof label, "peak int8 dot, %s (%s)",
                     cinfer_cpu_isa_name((cinfer_cpu_isa)isa), dot_name((cinfer_cpu_isa)isa));
            printf("  %-41s %d thr  %7.1f GOP/s\n", label, nt, peak_dot[isa][nt]);
        }
    }
    double peak_mix[MAX_THREADS + 1] = {0}, peak_bf16[MAX_THREADS + 1] = {0};
    if (isa_on[CINFER_CPU_ISA_AVX512] && has_avx512_peaks(CINFER_CPU_ISA_AVX512)) {
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            peak_mix[nt] = measure_peak(&teams[nt], CINFER_CPU_ISA_AVX512, PK_MIX);
            printf("  %-41s %d thr  %7.1f GOP/s\n",
                   "int8 block mix, avx512 (dpbusd+cvt+fma)", nt, peak_mix[nt]);
        }
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            peak_bf16[nt] = measure_peak(&teams[nt], CINFER_CPU_ISA_AVX512, PK_BF16);
            printf("  %-41s %d thr  %7.1f GFLOP/s\n", "peak bf16 dot, avx512 (vdpbf16ps)", nt,
                   peak_bf16[nt]);
        }
    }

    /* Another process on the cores makes every 2-thread number
     * meaningless; the FMA floor shows it. */
    for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++) {
        if (peak[isa][1] > 0.0 && peak[isa][2] < 1.7 * peak[isa][1]) {
            printf("  WARNING: 2-thread FMA floor is %.2fx the 1-thread one: another "
                   "process holds a core; 2-thread results are unreliable\n",
                   peak[isa][2] / peak[isa][1]);
            break;
        }
    }

    uint64_t seed = 0x12345678abcdefull;
    const int64_t d_out = 1536, d_in = 576; /* the default model's FFN */

    if (do_decode) {
        printf("\ndecode: n = 1, one pass over distinct [%lld x %lld] matrices "
               "totalling ~%.0f MB\n",
               (long long)d_out, (long long)d_in, decode_mb);
        printf("  %-8s %-5s %3s %9s %8s %10s\n", "isa", "type", "thr", "GB/s",
               "% of bw", "us/pass");
        for (int t = 0; t < N_TYPES; t++) {
            if (!type_on[t])
                continue;
            cinfer_dtype wt = k_types[t];
            const int64_t t_in = type_in(wt, d_in);
            size_t rb = cinfer_dtype_row_bytes(wt, t_in);
            size_t mat_bytes = rb * (size_t)d_out;
            int n_mats = (int)(decode_mb * 1e6 / (double)mat_bytes + 0.5);
            if (n_mats < 1)
                n_mats = 1;
            uint8_t **w = malloc(sizeof(*w) * (size_t)n_mats);
            for (int m = 0; m < n_mats; m++)
                w[m] = make_matrix(wt, d_out, t_in, &seed);
            float *x = malloc(sizeof(float) * (size_t)t_in);
            for (int64_t i = 0; i < t_in; i++)
                x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            void *act = malloc(cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), t_in));
            float *out = malloc(sizeof(float) * (size_t)d_out);
            size_t plen = 0;
            uint8_t **wp = pack_all(w, n_mats, &wt, &d_out, &t_in, 0, &plen);
            for (int v = CINFER_CPU_ISA_PORTABLE; v <= VARIANT_PACKED; v++) {
                int isa = variant_isa(v);
                if (!isa_on[isa] || !cinfer_cpu_isa_supported((cinfer_cpu_isa)isa) ||
                    (v == VARIANT_PACKED && !wp))
                    continue;
                for (int nt = 1; nt <= MAX_THREADS; nt++) {
                    if (!thr_on[nt])
                        continue;
                    mm_ctx c = {.isa = (cinfer_cpu_isa)isa, .wt = wt, .n_mats = n_mats,
                                .w = (const uint8_t *const *)(v == VARIANT_PACKED ? wp : w),
                                .w_row_bytes = rb, .n_out = d_out, .n_in = t_in, .n = 1,
                                .x = x, .act = act, .out = out, .tm = &teams[nt],
                                .packed = v == VARIANT_PACKED};
                    int reps = isa == CINFER_CPU_ISA_PORTABLE ? 2 : 8;
                    double best = 1e30;
                    for (int rep = 0; rep < reps; rep++) {
                        double t0 = now_s();
                        team_run(&teams[nt], mm_job, &c);
                        double dt = now_s() - t0;
                        best = dt < best ? dt : best;
                    }
                    double gbs = (double)mat_bytes * n_mats / best / 1e9;
                    printf("  %-8s %-5s %3d %9.1f %7.0f%% %10.0f\n",
                           variant_name(v),
                           cinfer_dtype_name(wt), nt, gbs, 100.0 * gbs / bw[nt],
                           best * 1e6);
                    fflush(stdout);
                }
            }
            for (int m = 0; m < n_mats; m++)
                free(w[m]);
            free(w);
            if (wp)
                cinfer_huge_free(wp[0], plen);
            free(wp);
            free(x);
            free(act);
            free(out);
        }
    }

    if (do_decode && do_model) {
        /* The default model's matmuls for one decode token: per layer
         * q, k, v, o, gate, up, down (Q4_1), then the tied Q8_0 output. */
        static const int64_t lay_out[7] = {576, 192, 192, 576, 1536, 1536, 576};
        static const int64_t lay_in[7] = {576, 576, 576, 576, 576, 576, 1536};
        enum { N_LAYERS = 30, N_M = N_LAYERS * 7 + 1 };
        cinfer_dtype *m_wt = malloc(sizeof(*m_wt) * N_M);
        int64_t *m_out = malloc(sizeof(int64_t) * N_M), *m_in = malloc(sizeof(int64_t) * N_M);
        uint8_t **w = malloc(sizeof(*w) * N_M);
        double bytes = 0.0;
        for (int m = 0; m < N_M; m++) {
            int last = m == N_M - 1;
            m_wt[m] = last ? CINFER_DTYPE_Q8_0 : CINFER_DTYPE_Q4_1;
            m_out[m] = last ? 49152 : lay_out[m % 7];
            m_in[m] = last ? 576 : lay_in[m % 7];
            w[m] = make_matrix(m_wt[m], m_out[m], m_in[m], &seed);
            bytes += (double)cinfer_dtype_row_bytes(m_wt[m], m_in[m]) * (double)m_out[m];
        }
        float *x = malloc(sizeof(float) * 1536);
        for (int i = 0; i < 1536; i++)
            x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
        void *act = malloc(cinfer_dtype_row_bytes(CINFER_DTYPE_Q8_1, 1536));
        float *out = malloc(sizeof(float) * 49152);
        printf("\ndecode, default model shapes: 30 x (q k v o gate up down) Q4_1 + "
               "49152 x 576 Q8_0 output = %.1f MB per token\n", bytes / 1e6);
        printf("  %-8s %3s %9s %8s %12s\n", "isa", "thr", "GB/s", "% of bw", "ms/token");
        size_t plen = 0;
        uint8_t **wp = pack_all(w, N_M, m_wt, m_out, m_in, 1, &plen);
        for (int v = CINFER_CPU_ISA_PORTABLE; v <= VARIANT_PACKED; v++) {
            int isa = variant_isa(v);
            if (!isa_on[isa] || !cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
                continue;
            for (int nt = 1; nt <= MAX_THREADS; nt++) {
                if (!thr_on[nt])
                    continue;
                mm_ctx c = {.isa = (cinfer_cpu_isa)isa, .n_mats = N_M,
                            .w = (const uint8_t *const *)(v == VARIANT_PACKED ? wp : w),
                            .n = 1, .x = x, .act = act, .out = out, .tm = &teams[nt],
                            .m_wt = m_wt, .m_out = m_out, .m_in = m_in,
                            .packed = v == VARIANT_PACKED};
                int reps = isa == CINFER_CPU_ISA_PORTABLE ? 2 : 10;
                double best = 1e30;
                for (int rep = 0; rep < reps; rep++) {
                    double t0 = now_s();
                    team_run(&teams[nt], mm_job, &c);
                    double dt = now_s() - t0;
                    best = dt < best ? dt : best;
                }
                double gbs = bytes / best / 1e9;
                printf("  %-8s %3d %9.1f %7.0f%% %12.2f\n",
                       variant_name(v), nt, gbs,
                       100.0 * gbs / bw[nt], best * 1e3);
                fflush(stdout);
            }
        }
        for (int m = 0; m < N_M; m++)
            free(w[m]);
        free(w);
        cinfer_huge_free(wp[0], plen);
        free(wp);
        free(m_wt);
        free(m_out);
        free(m_in);
        free(x);
        free(act);
        free(out);
    }

    if (do_prefill) {
        printf("\nprefill: w [%lld x %lld], n rows, prepare + compute (%% peak: of the "
               "int8 dot rate for block types, else of the fp32 FMA rate)\n",
               (long long)d_out, (long long)d_in);
        printf("  %-8s %-5s %3s %4s %9s %8s %10s\n", "isa", "type", "thr", "n",
               "GFLOP/s", "% peak", "ms");
        const int64_t ns[2] = {128, 512};
        for (int t = 0; t < N_TYPES; t++) {
            if (!type_on[t])
                continue;
            cinfer_dtype wt = k_types[t];
            const int64_t t_in = type_in(wt, d_in);
            size_t rb = cinfer_dtype_row_bytes(wt, t_in);
            uint8_t *w = make_matrix(wt, d_out, t_in, &seed);
            size_t plen = 0;
            uint8_t **wp = pack_all(&w, 1, &wt, &d_out, &t_in, 0, &plen);
            for (int ni = 0; ni < 2; ni++) {
                int64_t n = ns[ni];
                float *x = malloc(sizeof(float) * (size_t)(n * t_in));
                for (int64_t i = 0; i < n * t_in; i++)
                    x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
                void *act = malloc(cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), t_in) *
                                   (size_t)n);
                float *out = malloc(sizeof(float) * (size_t)(n * d_out));
                for (int v = CINFER_CPU_ISA_PORTABLE; v <= VARIANT_PACKED; v++) {
                    int isa = variant_isa(v);
                    if (!isa_on[isa] || !cinfer_cpu_isa_supported((cinfer_cpu_isa)isa) ||
                        (v == VARIANT_PACKED && !wp))
                        continue;
                    if (isa == CINFER_CPU_ISA_PORTABLE && n > 128)
                        continue; /* seconds per run; n = 128 says enough */
                    for (int nt = 1; nt <= MAX_THREADS; nt++) {
                        if (!thr_on[nt])
                            continue;
                        const uint8_t *wl[1] = {v == VARIANT_PACKED ? wp[0] : w};
                        mm_ctx c = {.isa = (cinfer_cpu_isa)isa, .wt = wt, .n_mats = 1,
                                    .w = wl, .w_row_bytes = rb, .n_out = d_out,
                                    .n_in = t_in, .n = n, .x = x, .act = act,
                                    .out = out, .tm = &teams[nt],
                                    .packed = v == VARIANT_PACKED};
                        double best = 1e30, total = 0.0;
                        int reps = 0;
                        while (reps < 3 || (total < 0.3 && reps < 200)) {
                            double t0 = now_s();
                            team_run(&teams[nt], mm_job, &c);
                            double dt = now_s() - t0;
                            best = dt < best ? dt : best;
                            total += dt;
                            reps++;
                        }
                        double gf = 2.0 * (double)n * (double)d_out * (double)t_in / best / 1e9;
                        /* int8-block products run on the int8 dot
                         * instructions, the float types on FMAs */
                        double pk = cinfer_dtype_block_elems(wt) > 1 && peak_dot[isa][nt] > 0.0
                                        ? peak_dot[isa][nt]
                                        : peak[isa][nt];
                        printf("  %-8s %-5s %3d %4lld %9.1f %7.0f%% %10.3f\n",
                               variant_name(v),
                               cinfer_dtype_name(wt), nt, (long long)n, gf,
                               100.0 * gf / pk, best * 1e3);
                        fflush(stdout);
                    }
                }
                free(x);
                free(act);
                free(out);
            }
            free(w);
            if (wp)
                cinfer_huge_free(wp[0], plen);
            free(wp);
        }
    }

    /* Batched products (prefill, many decode streams) against the peak of
     * their instructions, rows 16 .. 512. */
    enum { BT_NS = 6, BT_MAX = 4 * 12 * BT_NS * MAX_THREADS };
    static const int64_t bt_ns[BT_NS] = {16, 32, 64, 128, 256, 512};
    struct {
        const char *variant;
        cinfer_dtype wt;
        int nt;
        int64_t n;
        int64_t n_in;
        const char *peak; /* what ratio is against */
        bt_cell c;
    } bt[BT_MAX];
    int n_bt = 0;
    if (do_batched) {
        printf("\nbatched: w [%lld x %lld], n rows, prepare + compute against the peak of "
               "its instructions measured after each timing (int8 dot, and the int8 block mix "
               "for avx512's Q8_0 / Q4_0 / Q4_1; bf16 dot for avx512 BF16; fp32 FMA for F16 "
               "and avx2 BF16; medians of %d rounds)\n",
               (long long)d_out, (long long)d_in, BT_REPS);
        printf("  %-8s %-6s %3s %4s %9s %11s %8s %11s %8s\n", "isa", "type", "thr", "n",
               "GOP/s", "peak GOP/s", "% peak", "mix GOP/s", "% mix");
        static const cinfer_dtype bt_types[] = {
            CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_K,
            CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q6_K, CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K,
            CINFER_DTYPE_IQ4_XS, CINFER_DTYPE_IQ4_NL, CINFER_DTYPE_F16, CINFER_DTYPE_BF16};
        for (int t = 0; t < (int)(sizeof(bt_types) / sizeof(bt_types[0])); t++) {
            cinfer_dtype wt = bt_types[t];
            const int64_t t_in = type_in(wt, d_in);
            int on = 0;
            for (int k = 0; k < N_TYPES; k++)
                on |= k_types[k] == wt && type_on[k];
            if (!on)
                continue;
            size_t rb = cinfer_dtype_row_bytes(wt, t_in);
            uint8_t *w = make_matrix(wt, d_out, t_in, &seed);
            size_t plen = 0;
            uint8_t **wp = pack_all(&w, 1, &wt, &d_out, &t_in, 0, &plen);
            const int64_t n_max = bt_ns[BT_NS - 1];
            float *x = malloc(sizeof(float) * (size_t)(n_max * t_in));
            void *act = malloc(cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), t_in) *
                               (size_t)n_max);
            float *out = malloc(sizeof(float) * (size_t)(n_max * d_out));
            if (!x || !act || !out) {
                fprintf(stderr, "out of memory\n");
                return 1;
            }
            for (int64_t i = 0; i < n_max * t_in; i++)
                x[i] = (float)((i * 37) % 101) / 50.0f - 1.0f;
            const int is_float = cinfer_dtype_block_elems(wt) == 1;
            /* the int8 block mix is what the Q8_0 / Q4_0 / Q4_1 kernels run */
            const int int8_block = cinfer_cpu_pack_rows(wt) > 0;
            for (int v = CINFER_CPU_ISA_AVX2; v <= VARIANT_PACKED; v++) {
                int isa = variant_isa(v);
                if (!isa_on[isa] || !has_dot((cinfer_cpu_isa)isa) || (v == VARIANT_PACKED && !wp))
                    continue;
                const int z = has_avx512_peaks((cinfer_cpu_isa)isa);
                const int pk_kind = !is_float                       ? PK_DOT
                                    : wt == CINFER_DTYPE_BF16 && z ? PK_BF16
                                                                   : PK_FMA;
                for (int ni = 0; ni < BT_NS; ni++) {
                    for (int nt = 1; nt <= MAX_THREADS; nt++) {
                        if (!thr_on[nt] || n_bt == BT_MAX)
                            continue;
                        const uint8_t *wl[1] = {v == VARIANT_PACKED ? wp[0] : w};
                        mm_ctx c = {.isa = (cinfer_cpu_isa)isa, .wt = wt, .n_mats = 1,
                                    .w = wl, .w_row_bytes = rb, .n_out = d_out,
                                    .n_in = t_in, .n = bt_ns[ni], .x = x, .act = act,
                                    .out = out, .tm = &teams[nt],
                                    .packed = v == VARIANT_PACKED};
                        bt_cell cell = batched_cell(&c, &teams[nt], (cinfer_cpu_isa)isa, pk_kind,
                                                    int8_block && z);
                        bt[n_bt].variant = variant_name(v);
                        bt[n_bt].wt = wt;
                        bt[n_bt].nt = nt;
                        bt[n_bt].n = bt_ns[ni];
                        bt[n_bt].n_in = t_in;
                        bt[n_bt].c = cell;
                        bt[n_bt].peak = pk_kind == PK_DOT    ? "int8_dot"
                                        : pk_kind == PK_BF16 ? "bf16_dot"
                                                             : "fma";
                        n_bt++;
                        printf("  %-8s %-6s %3d %4lld %9.1f %11.1f %7.0f%%", variant_name(v),
                               cinfer_dtype_name(wt), nt, (long long)bt_ns[ni], cell.gops,
                               cell.peak, 100.0 * cell.ratio);
                        if (cell.mix > 0.0)
                            printf(" %11.1f %7.0f%%", cell.mix, 100.0 * cell.mix_ratio);
                        printf("\n");
                        fflush(stdout);
                    }
                }
            }
            free(x);
            free(act);
            free(out);
            free(w);
            if (wp)
                cinfer_huge_free(wp[0], plen);
            free(wp);
        }
    }

    if (json_path) {
        FILE *f = fopen(json_path, "w");
        if (!f) {
            fprintf(stderr, "cannot write %s\n", json_path);
            return 1;
        }
        fprintf(f, "{\n  \"cpu\": \"%s\",\n  \"online_cpus\": %ld,\n", model,
                (long)sysconf(_SC_NPROCESSORS_ONLN));
        fprintf(f, "  \"isas\": [");
        int first = 1;
        for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++)
            if (cinfer_cpu_isa_supported((cinfer_cpu_isa)isa)) {
                fprintf(f, "%s\"%s\"", first ? "" : ", ", cinfer_cpu_isa_name((cinfer_cpu_isa)isa));
                first = 0;
            }
        fprintf(f, "],\n  \"openblas_coretype\": %s%s%s,\n", coretype ? "\"" : "",
                coretype ? coretype : "null", coretype ? "\"" : "");
        fprintf(f, "  \"clock\": \"%s\",\n", g_cpu_time ? "thread_cpu" : "wall");
        fprintf(f, "  \"floors\": [\n");
        first = 1;
        for (int nt = 1; nt <= MAX_THREADS; nt++) {
            fprintf(f, "%s    {\"threads\": %d, \"read_gbs\": %.2f", first ? "" : ",\n", nt,
                    bw[nt]);
            first = 0;
            for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++) {
                if (peak[isa][nt] > 0.0)
                    fprintf(f, ", \"fma_gflops_%s\": %.2f", cinfer_cpu_isa_name((cinfer_cpu_isa)isa),
                            peak[isa][nt]);
                if (peak_dot[isa][nt] > 0.0)
                    fprintf(f, ", \"int8_dot_gops_%s\": %.2f",
                            cinfer_cpu_isa_name((cinfer_cpu_isa)isa), peak_dot[isa][nt]);
            }
            if (peak_mix[nt] > 0.0)
                fprintf(f, ", \"int8_mix_gops_avx512\": %.2f", peak_mix[nt]);
            if (peak_bf16[nt] > 0.0)
                fprintf(f, ", \"bf16_dot_gflops_avx512\": %.2f", peak_bf16[nt]);
            fprintf(f, "}");
        }
        fprintf(f, "\n  ],\n  \"batched\": [\n");
        for (int i = 0; i < n_bt; i++)
            fprintf(f,
                    "    {\"isa\": \"%s\", \"type\": \"%s\", \"threads\": %d, \"n\": %lld, "
                    "\"n_out\": %lld, \"n_in\": %lld, \"gops\": %.2f, \"peak\": \"%s\", "
                    "\"peak_gops\": %.2f, \"ratio\": %.4f, \"mix_gops\": %.2f, "
                    "\"mix_ratio\": %.4f}%s\n",
                    bt[i].variant, cinfer_dtype_name(bt[i].wt), bt[i].nt, (long long)bt[i].n,
                    (long long)d_out, (long long)bt[i].n_in, bt[i].c.gops, bt[i].peak,
                    bt[i].c.peak, bt[i].c.ratio, bt[i].c.mix, bt[i].c.mix_ratio,
                    i + 1 < n_bt ? "," : "");
        fprintf(f, "  ]\n}\n");
        fclose(f);
    }

    for (int nt = 1; nt <= MAX_THREADS; nt++)
        team_stop(&teams[nt]);
    return 0;
}
