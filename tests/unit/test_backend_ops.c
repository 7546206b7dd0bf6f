/*
 * test_backend_ops.c - the backend ops table (kernels/backend.h), over every
 * backend this build can make.
 *
 * The same cases run over a list of backend factories, each with a name that
 * failure messages carry:
 *   - the CPU backend for each ISA this processor supports (portable, AVX2,
 *     AVX-512) with 1 and 3 threads;
 *   - with -DCINFER_TEST_CUDASIM (the test_backend_ops_cudasim executable):
 *     the CUDA backend under the CPU harness (tests/cudasim/), after one
 *     CPU factory (the best ISA, 1 thread) that its results are also
 *     compared with; ctest runs it under the forward, reverse and random
 *     thread schedules, so a kernel that misses a barrier fails;
 *   - with CINFER_TEST_CUDA (nvcc built the backend): the CUDA backend on
 *     device 0 when cinfer_cuda_device_count() > 0, else a line says it is
 *     skipped.
 * Every op is compared with a float64 reference written here from the op's
 * definition. The CPU backend keeps tight absolute bounds (its arithmetic
 * is GGML's, step for step). The CUDA backend is not bit-exact with it, so
 * its error is NMSE = sum((got - want)^2) / sum(want^2) with llama.cpp
 * test-backend-ops' bounds: 1e-7 for the ops that should be nearly exact
 * (embed, rms_norm, add, add_bias, silu_mul, gather_rows, rope, kv_store),
 * 5e-4 for matmul and attention; a NaN or Inf in its output never passes.
 * CUDA is held to the same bound against the CPU backend's output on the
 * same inputs as well (the first factory is always a CPU one).
 *
 * Inputs are fresh each run: a seed from the clock, printed at the start
 * and overridable with CINFER_TEST_SEED=<n> to replay a failure. Every
 * op's output is poisoned (NaN bytes) before the op, so an element it
 * fails to write fails the check.
 *
 * Cases, at awkward sizes for every backend:
 *   - embed for F32, F16, BF16 (widths 769, 5125) and Q8_0, Q4_0, Q4_1
 *     tables (800, 5152: whole blocks), the reference decoding the blocks;
 *   - rms_norm, add, add_bias, silu_mul, gather_rows at widths 769 and 5125,
 *     rms_norm per group (a weight of 128 or 37 over rows of 5 groups: the
 *     per-head Q/K norm), add_rms_norm bit for bit against add then
 *     rms_norm (widths 576, 769, 5120 and per group; out aliasing d or
 *     not: CUDA's one-launch kernel), rope_kv_store bit for bit against
 *     rope of q and k then kv_store (both modes, partial rotation, F16 and
 *     F32 caches), silu over the whole float range,
 *     rope (NORM and
 *     NEOX, full and partial rotation, positions to 4095, with linear
 *     scaling and per-pair frequency factors, the CPU's cached table
 *     rebuilt when they change), kv_store into F16 and F32 caches
 *     (widths 60 and 769), and the step ops on a batch of 67 rows;
 *   - matmul for every weight type (F32, F16, BF16, Q8_0, Q4_0, Q4_1) at
 *     n = 1, 7, 8, 9, 64 rows (decode kernels and tiled ones), several
 *     weights per call: float weights at n_in 769 and 5125, quantized ones
 *     at n_out 769 and 5125 (n_in must be whole blocks), calls mixing
 *     types (activation formats), and runs of one quantized type (one
 *     CUDA launch), each weight's bits equal to its own call's; the
 *     gate-up product with SwiGLU (matmul_silu_mul, one CUDA launch for
 *     decode rows) bit for bit against matmul then silu_mul;
 *   - paged attention, GQA ratios 1, 3 and 4, F16 and F32 caches, head
 *     sizes 20..136, block sizes 2..16 with contexts that are not a multiple
 *     of them, block tables drawn from a shuffled pool (non-contiguous):
 *     3 sequences with prefill rows interleaved with decode rows; one
 *     sequence with a 37-row prefill chunk at context ~570 (more than one
 *     query tile); 257 sequences in one step, decode rows and 3-row prefill
 *     chunks interleaved, one with a 600-token context (decode split into
 *     partitions and reduced).
 * On CUDA factories, the tensor-core building blocks (int8 mma m16n8k32,
 * f16 / bf16 mma m16n8k16, ldmatrix x4: kernels/cuda/mma.cuh) against the
 * PTX ISA's semantics, and the batch-invariant float product on them
 * (dense.cuh) against float64 and row by row.
 * Bad arguments (dtype, shape, step indices, read-only outputs) return
 * CINFER_E_INVALID_ARG naming the op and leave the backend usable, on every
 * backend (the checks live in backend.c). CPU only: the ISAs and thread
 * counts give identical bits, a small transformer layer gives a row
 * bit-identical results alone or in a batch of 7 (batch invariance), and
 * the packed int8-block weights read back as their bytes.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "harness.h"
#include "engine/sampler.h"
#include "kernels/backend.h"
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
#include <cuda_runtime_api.h>

#include "kernels/cuda/attention.cuh"
#include "kernels/cuda/dense.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/mmq.cuh"
#include "kernels/cuda/mmvq.cuh"
#include "kernels/cuda/quantize.cuh"
#include "kernels/cuda/sample.cuh"
#endif

/* ---------------------------------------------------------------------- */
/* backend factories                                                        */
/* ---------------------------------------------------------------------- */

typedef enum { KIND_CPU, KIND_CUDA } backend_kind;

typedef struct {
    char name[48];     /* in failure messages: "cpu avx2 x3", "cuda (cudasim)" */
    backend_kind kind;
    cinfer_cpu_isa isa; /* CPU only */
    int n_threads;      /* CPU only */
} factory;

#ifdef CINFER_TEST_CUDASIM
static const int g_cudasim_build = 1;
#else
static const int g_cudasim_build = 0;
#endif

static factory g_factories[8];
static int g_n_factories;
static uint64_t g_seed;

static void add_cpu_factory(cinfer_cpu_isa isa, int n_threads)
{
    factory *f = &g_factories[g_n_factories++];
    f->kind = KIND_CPU;
    f->isa = isa;
    f->n_threads = n_threads;
    snprintf(f->name, sizeof f->name, "cpu %s x%d", cinfer_cpu_isa_name(isa),
             n_threads);
}

#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
static void add_cuda_factory(const char *name)
{
    factory *f = &g_factories[g_n_factories++];
    memset(f, 0, sizeof *f);
    f->kind = KIND_CUDA;
    snprintf(f->name, sizeof f->name, "%s", name);
}
#endif

/* The first factory is always a CPU one: the CUDA checks compare with its
 * output. */
static void init_factories(void)
{
    static const cinfer_cpu_isa isas[] = {CINFER_CPU_ISA_PORTABLE,
                                          CINFER_CPU_ISA_AVX2,
                                          CINFER_CPU_ISA_AVX512};
#ifdef CINFER_TEST_CUDASIM
    /* The CPU ISAs have their own run (test_backend_ops); here one CPU
     * backend is the reference the simulated device is compared with. */
    cinfer_cpu_isa best = CINFER_CPU_ISA_PORTABLE;
    for (int i = 0; i < 3; i++)
        if (cinfer_cpu_isa_supported(isas[i]))
            best = isas[i];
    add_cpu_factory(best, 1);
    add_cuda_factory("cuda (cudasim)");
#else
    for (int i = 0; i < 3; i++) {
        if (!cinfer_cpu_isa_supported(isas[i]))
            continue;
        add_cpu_factory(isas[i], 1);
        add_cpu_factory(isas[i], 3);
    }
#ifdef CINFER_TEST_CUDA
    if (cinfer_cuda_device_count() > 0)
        add_cuda_factory("cuda:0");
    else
        fprintf(stderr, "factory cuda:0 skipped: no CUDA device\n");
#endif
#endif
}

static int is_cpu(const factory *f) { return f->kind == KIND_CPU; }

static cinfer_backend *make_cpu(cinfer_cpu_isa isa, int n_threads)
{
    cinfer_backend_cpu_params p = cinfer_backend_cpu_default_params();
    p.isa = isa;
    p.n_threads = n_threads;
    cinfer_backend *be = NULL;
    CHECK_OK(cinfer_backend_cpu_create(&p, &be));
    CINFER_ASSERT(be != NULL);
    return be;
}

static cinfer_backend *make_backend(const factory *f)
{
    if (is_cpu(f))
        return make_cpu(f->isa, f->n_threads);
    cinfer_backend_cuda_params p = cinfer_backend_cuda_default_params();
    cinfer_backend *be = NULL;
    CHECK_OK(cinfer_backend_cuda_create(&p, &be));
    CINFER_ASSERT(be != NULL);
    return be;
}

/* ---------------------------------------------------------------------- */
/* seeds, tensors                                                           */
/* ---------------------------------------------------------------------- */

/* The run's seed: CINFER_TEST_SEED, else the clock. */
static void init_seed(void)
{
    const char *e = getenv("CINFER_TEST_SEED");
    if (e && *e) {
        g_seed = strtoull(e, NULL, 0);
    } else {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        g_seed = (uint64_t)ts.tv_sec * 1000003u ^ (uint64_t)ts.tv_nsec;
    }
    fprintf(stderr, "seed %llu (replay with CINFER_TEST_SEED=%llu)\n",
            (unsigned long long)g_seed, (unsigned long long)g_seed);
}

/* A test's own stream of the run's seed (splitmix64; never 0, which would
 * stall xorshift). */
static uint64_t seed_for(uint64_t salt)
{
    uint64_t z = g_seed + salt * 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return z ? z : 1;
}

static int rand_below(uint64_t *seed, int n)
{
    return (int)(harness_rand(seed) % (uint64_t)n);
}

static cinfer_tensor *tnew(cinfer_backend *be, cinfer_dtype dt, int nd,
                           int64_t d0, int64_t d1, int64_t d2, int64_t d3)
{
    int64_t shape[4] = {d0, d1, d2, d3};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(dt, nd, shape);
    cinfer_tensor *t = NULL;
    CHECK_OK(cinfer_backend_tensor_create(be, &d, &t));
    CINFER_ASSERT(t != NULL);
    return t;
}

static cinfer_tensor *wnew(cinfer_backend *be, cinfer_dtype dt, int nd,
                           int64_t d0, int64_t d1, const void *data)
{
    int64_t shape[2] = {d0, d1};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(dt, nd, shape);
    cinfer_tensor *t = NULL;
    CHECK_OK(cinfer_backend_tensor_create_weight(be, &d, data, &t));
    CINFER_ASSERT(t != NULL);
    return t;
}

static size_t tbytes(const cinfer_tensor *t)
{
    return cinfer_tensor_desc_nbytes(cinfer_tensor_get_desc(t));
}

static void put(cinfer_backend *be, cinfer_tensor *t, const void *src)
{
    CHECK_OK(cinfer_backend_upload(be, t, 0, src, tbytes(t)));
}

static void get(cinfer_backend *be, const cinfer_tensor *t, void *dst)
{
    CHECK_OK(cinfer_backend_download(be, t, 0, dst, tbytes(t)));
}

/* Fills t with 0xFF bytes (NaN as F32, F16 and BF16) before an op writes
 * it, so an element the op leaves unwritten fails the comparison. */
static void poison(cinfer_backend *be, cinfer_tensor *t)
{
    size_t n = tbytes(t);
    void *p = malloc(n);
    CINFER_ASSERT(p);
    memset(p, 0xFF, n);
    CHECK_OK(cinfer_backend_upload(be, t, 0, p, n));
    free(p);
}

static float *randv(int64_t n, uint64_t *seed, float scale)
{
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    CINFER_ASSERT(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = harness_randf(seed) * scale;
    return v;
}

static float *fdup(const float *p, int64_t n)
{
    float *c = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    CINFER_ASSERT(c);
    memcpy(c, p, sizeof(float) * (size_t)n);
    return c;
}

/* ---------------------------------------------------------------------- */
/* checks                                                                   */
/* ---------------------------------------------------------------------- */

/* CUDA's NMSE bounds (llama.cpp test-backend-ops). */
#define NMSE_EXACT 1e-7
#define NMSE_MATMUL 5e-4

/* Worst NMSE seen per op on a non-CPU backend, printed at the end. */
static struct {
    char op[16];
    double worst;
} g_worst[16];
static int g_n_worst;

static void note_nmse(const char *what, double e)
{
    char op[16];
    size_t len = strcspn(what, " ");
    if (len >= sizeof op)
        len = sizeof op - 1;
    memcpy(op, what, len);
    op[len] = 0;
    int i = 0;
    while (i < g_n_worst && strcmp(g_worst[i].op, op) != 0)
        i++;
    if (i == g_n_worst) {
        if (g_n_worst == 16)
            return;
        snprintf(g_worst[i].op, sizeof g_worst[i].op, "%s", op);
        g_worst[i].worst = 0;
        g_n_worst++;
    }
    if (e > g_worst[i].worst)
        g_worst[i].worst = e;
}

/* Largest |got - want| over n values, and a failure message if > tol
 * (a NaN fails). */
static void check_close(const char *what, const factory *f, const float *got,
                        const double *want, int64_t n, double tol)
{
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (isnan(e)) { /* a later finite error must not hide it */
            worst = e;
            at = i;
            break;
        }
        if (e > worst) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol)) {
        fprintf(stderr, "%s [%s]: element %lld is %.9g, want %.9g "
                        "(error %.3g > tol %.3g; seed %llu)\n",
                what, f->name, (long long)at, (double)got[at], want[at], worst,
                tol, (unsigned long long)g_seed);
        harness_failed_checks++;
    }
}

/* sum((got - want)^2) / sum(want^2); want_f or want_d. A zero reference
 * with any error is infinitely wrong. */
static double nmse(const float *got, const double *want_d, const float *want_f,
                   int64_t n)
{
    double num = 0, den = 0;
    for (int64_t i = 0; i < n; i++) {
        double w = want_d ? want_d[i] : (double)want_f[i];
        double e = (double)got[i] - w;
        num += e * e;
        den += w * w;
    }
    if (den == 0)
        return num == 0 ? 0 : INFINITY;
    return num / den;
}

/* The check of one op's output. A CPU factory: |got - want| <= cpu_tol
 * everywhere. Any other: every value finite, and NMSE <= bound against the
 * float64 reference and against the CPU backend's output `cpu` (NULL: not
 * compared). */
static void check_out(const char *what, const factory *f, const float *got,
                      const double *want, const float *cpu, int64_t n,
                      double cpu_tol, double bound)
{
    if (is_cpu(f)) {
        check_close(what, f, got, want, n, cpu_tol);
        return;
    }
    int64_t bad = 0, first = -1;
    for (int64_t i = 0; i < n; i++)
        if (!isfinite(got[i])) {
            bad++;
            first = first < 0 ? i : first;
        }
    if (bad) {
        fprintf(stderr, "%s [%s]: %lld of %lld values are not finite (first: "
                        "element %lld = %g, want %.9g; seed %llu)\n",
                what, f->name, (long long)bad, (long long)n, (long long)first,
                (double)got[first], want[first], (unsigned long long)g_seed);
        harness_failed_checks++;
        return;
    }
    double e = nmse(got, want, NULL, n);
    note_nmse(what, e);
    if (!(e <= bound)) {
        fprintf(stderr, "%s [%s]: NMSE %.3g against float64 > %.0e (seed %llu)\n",
                what, f->name, e, bound, (unsigned long long)g_seed);
        harness_failed_checks++;
    }
    if (cpu) {
        double ec = nmse(got, NULL, cpu, n);
        note_nmse(what, ec);
        if (!(ec <= bound)) {
            fprintf(stderr, "%s [%s]: NMSE %.3g against %s > %.0e (seed %llu)\n",
                    what, f->name, ec, g_factories[0].name, bound,
                    (unsigned long long)g_seed);
            harness_failed_checks++;
        }
    }
}

/* The CPU outputs of one case, kept from factory 0 for the others. */
typedef struct {
    float *out[16];
} cpu_keep;

/* Factory 0 stores a copy of got in slot i (and gets NULL); the others get
 * what it stored. */
static const float *keep(cpu_keep *k, int fi, int slot, const float *got,
                         int64_t n)
{
    CINFER_ASSERT(slot < 16);
    if (fi == 0) {
        free(k->out[slot]);
        k->out[slot] = fdup(got, n);
        return NULL;
    }
    return k->out[slot];
}

static void keep_free(cpu_keep *k)
{
    for (int i = 0; i < 16; i++) {
        free(k->out[i]);
        k->out[i] = NULL;
    }
}

/* A step under construction: arrays sized for the tests here. */
#define MAX_ROWS 512
#define MAX_SEQS 260
#define MAX_BLOCKS 160

typedef struct {
    int32_t tokens[MAX_ROWS], positions[MAX_ROWS], row_seq[MAX_ROWS];
    int32_t slots[MAX_ROWS], out_rows[MAX_ROWS];
    uint8_t gen[MAX_ROWS];
    int32_t tables[MAX_SEQS * MAX_BLOCKS];
    cinfer_step s;
} step_buf;

/* Points s's arrays at b's own (after a struct copy). */
static void step_rebase(step_buf *b)
{
    b->s.tokens = b->tokens;
    b->s.positions = b->positions;
    b->s.row_seq = b->row_seq;
    b->s.slots = b->slots;
    b->s.block_tables = b->tables;
    b->s.out_rows = b->out_rows;
    if (b->s.row_gen)
        b->s.row_gen = b->gen;
}

static void step_init(step_buf *b, int n_seqs, int block_size)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < MAX_SEQS * MAX_BLOCKS; i++)
        b->tables[i] = -1; /* unused entries: must never be read */
    b->s.n_seqs = n_seqs;
    b->s.block_size = block_size;
    b->s.max_blocks = MAX_BLOCKS;
    step_rebase(b);
}

/* Appends a row of sequence `seq` at `pos`; its slot follows the table. */
static void step_row(step_buf *b, int seq, int pos, int token)
{
    int r = b->s.n_rows++;
    CINFER_ASSERT(r < MAX_ROWS);
    int bs = b->s.block_size;
    b->tokens[r] = token;
    b->positions[r] = pos;
    b->row_seq[r] = seq;
    b->slots[r] = b->tables[seq * MAX_BLOCKS + pos / bs] * bs + pos % bs;
}

static void step_all_out(step_buf *b)
{
    b->s.n_out = b->s.n_rows;
    for (int r = 0; r < b->s.n_rows; r++)
        b->out_rows[r] = r;
}

static step_buf *step_new(void)
{
    step_buf *b = malloc(sizeof *b);
    CINFER_ASSERT(b);
    return b;
}

/* ---------------------------------------------------------------------- */
/* creation, tensors                                                       */
/* ---------------------------------------------------------------------- */

static void test_create(void)
{
    cinfer_backend *be = NULL;
    CHECK_OK(cinfer_backend_cpu_create(NULL, &be));
    CHECK(be != NULL);
    if (be) {
        CHECK_EQ_STR(cinfer_backend_name(be), "cpu");
        CHECK(strncmp(cinfer_backend_device_desc(be), "cpu: ", 5) == 0);
        CHECK(cinfer_backend_cpu_isa(be) != CINFER_CPU_ISA_AUTO);
        cinfer_backend_destroy(be);
    }
    cinfer_backend_destroy(NULL);

    for (int i = 0; i < g_n_factories; i++) {
        const factory *f = &g_factories[i];
        be = make_backend(f);
        if (is_cpu(f)) {
            char want[64];
            snprintf(want, sizeof want, "cpu: %d thread%s, %s", f->n_threads,
                     f->n_threads == 1 ? "" : "s", cinfer_cpu_isa_name(f->isa));
            CHECK_EQ_STR(cinfer_backend_device_desc(be), want);
            CHECK_EQ_INT(cinfer_backend_cpu_isa(be), f->isa);
        } else {
            CHECK_EQ_STR(cinfer_backend_name(be), "cuda");
            CHECK(strncmp(cinfer_backend_device_desc(be), "cuda:0: ", 8) == 0);
            CHECK(cinfer_backend_healthy(be));
            size_t used = 0, budget = 0;
            CHECK_OK(cinfer_backend_memory(be, &used, &budget));
            CHECK(budget > 0 && used <= budget);
        }
        cinfer_backend_destroy(be);
    }

    /* a device that does not exist, a bad memory fraction */
    cinfer_backend_cuda_params cp = cinfer_backend_cuda_default_params();
    cp.device = cinfer_cuda_device_count();
    be = (cinfer_backend *)&cp;
    cinfer_status st = cinfer_backend_cuda_create(&cp, &be);
    CHECK(be == NULL);
#if defined(CINFER_TEST_CUDA) || defined(CINFER_TEST_CUDASIM)
    CHECK_EQ_INT(st, CINFER_E_NOT_FOUND);
    cp = cinfer_backend_cuda_default_params();
    cp.memory_fraction = 1.5;
    CHECK_EQ_INT(cinfer_backend_cuda_create(&cp, &be), CINFER_E_INVALID_ARG);
#else
    CHECK_EQ_INT(st, CINFER_E_UNSUPPORTED);
    CHECK_EQ_INT(cinfer_cuda_device_count(), 0);
#endif

    cinfer_backend_cpu_params p = cinfer_backend_cpu_default_params();
    p.isa = (cinfer_cpu_isa)99;
    be = NULL;
    CHECK_EQ_INT(cinfer_backend_cpu_create(&p, &be), CINFER_E_INVALID_ARG);
    CHECK(be == NULL);
    p = cinfer_backend_cpu_default_params();
    p.n_threads = -1;
    CHECK_EQ_INT(cinfer_backend_cpu_create(&p, &be), CINFER_E_INVALID_ARG);
    static const cinfer_cpu_isa forced[] = {CINFER_CPU_ISA_AVX2,
                                            CINFER_CPU_ISA_AVX512};
    for (int i = 0; i < 2; i++) {
        p = cinfer_backend_cpu_default_params();
        p.isa = forced[i];
        st = cinfer_backend_cpu_create(&p, &be);
        if (cinfer_cpu_isa_supported(forced[i])) {
            CHECK_OK(st);
            cinfer_backend_destroy(be);
        } else {
            CHECK_EQ_INT(st, CINFER_E_UNSUPPORTED);
        }
    }
    CHECK(cinfer_cpu_isa_supported(CINFER_CPU_ISA_PORTABLE));
    /* AVX-512 as defined here implies AVX2 */
    CHECK(!cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX512) ||
          cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX2));
}

static void test_tensors(void)
{
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        cinfer_backend *be = make_backend(f);
        int64_t shape[3] = {3, 5, 64};
        cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_Q8_0, 3, shape);
        CHECK_EQ_INT(cinfer_tensor_desc_nelems(&d), 3 * 5 * 64);
        CHECK_EQ_INT(cinfer_tensor_desc_nbytes(&d), 15 * 2 * 34);
        d.shape[2] = 33;
        CHECK_EQ_INT(cinfer_tensor_desc_nbytes(&d), 0);

        cinfer_tensor *t = tnew(be, CINFER_DTYPE_F32, 2, 7, 769, 0, 0);
        CHECK_EQ_INT(tbytes(t), 7 * 769 * 4);
        CHECK_EQ_INT(cinfer_tensor_get_desc(t)->shape[1], 769);
        uint64_t seed = seed_for(1);
        float *x = randv(7 * 769, &seed, 1.0f);
        float *y = calloc(7 * 769, sizeof(float));
        put(be, t, x);
        get(be, t, y);
        CHECK(memcmp(x, y, 7 * 769 * 4) == 0);
        /* partial transfers at an offset */
        float part[3] = {1.5f, -2.0f, 3.25f}, back[3];
        CHECK_OK(cinfer_backend_upload(be, t, 100 * 4, part, sizeof part));
        CHECK_OK(cinfer_backend_download(be, t, 100 * 4, back, sizeof back));
        CHECK(memcmp(part, back, sizeof part) == 0);
        /* bounds */
        CHECK_EQ_INT(cinfer_backend_upload(be, t, tbytes(t) - 8, part, 12),
                     CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_download(be, t, tbytes(t) + 1, back, 0),
                     CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_download(be, t, 4, back, SIZE_MAX),
                     CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_upload(be, t, 0, NULL, 4), CINFER_E_INVALID_ARG);
        CHECK_OK(cinfer_backend_upload(be, t, tbytes(t), NULL, 0));
        CHECK_OK(cinfer_backend_fill_zero(be, t));
        get(be, t, y);
        int nonzero = 0;
        for (int i = 0; i < 7 * 769; i++)
            nonzero += y[i] != 0.0f;
        CHECK_EQ_INT(nonzero, 0);
        CHECK_OK(cinfer_backend_synchronize(be));
        cinfer_backend_tensor_destroy(be, t);
        cinfer_backend_tensor_destroy(be, NULL);

        /* A weight is read-only. The CPU reads the caller's memory in
         * place; a device copies it, so the caller may free it at once. */
        float x5 = x[5];
        cinfer_tensor *w = wnew(be, CINFER_DTYPE_F32, 2, 7, 769, x);
        CHECK_EQ_INT(cinfer_backend_weight_borrows(be, w), is_cpu(f));
        x[5] = 42.0f;
        float got5;
        CHECK_OK(cinfer_backend_download(be, w, 5 * 4, &got5, 4));
        CHECK(got5 == (is_cpu(f) ? 42.0f : x5));
        CHECK_EQ_INT(cinfer_backend_upload(be, w, 0, part, 4), CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_fill_zero(be, w), CINFER_E_INVALID_ARG);
        cinfer_backend_tensor_destroy(be, w);
        x[5] = x5;

        /* set_rows: a shorter view of the same rows, up to the creation size */
        t = tnew(be, CINFER_DTYPE_F32, 2, 7, 769, 0, 0);
        cinfer_tensor *tn3 = tnew(be, CINFER_DTYPE_F32, 2, 7, 769, 0, 0);
        cinfer_tensor *wn = wnew(be, CINFER_DTYPE_F32, 1, 769, 0, x);
        put(be, t, x);
        put(be, tn3, y);
        CHECK_OK(cinfer_backend_tensor_set_rows(be, t, 3));
        CHECK_OK(cinfer_backend_tensor_set_rows(be, tn3, 3));
        CHECK_EQ_INT(cinfer_tensor_get_desc(t)->shape[0], 3);
        CHECK_EQ_INT(tbytes(t), 3 * 769 * 4);
        CHECK_EQ_INT(cinfer_backend_download(be, t, 3 * 769 * 4, back, 4),
                     CINFER_E_INVALID_ARG);
        CHECK_OK(cinfer_backend_rms_norm(be, t, wn, 1e-5f, tn3)); /* 3 rows only */
        CHECK_EQ_INT(cinfer_backend_tensor_set_rows(be, t, 8), CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_tensor_set_rows(be, t, 0), CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_tensor_set_rows(be, wn, 1), CINFER_E_INVALID_ARG);
        CHECK_OK(cinfer_backend_tensor_set_rows(be, t, 7));
        CHECK_OK(cinfer_backend_tensor_set_rows(be, tn3, 7));
        float *z = malloc(sizeof(float) * 7 * 769);
        get(be, t, z);
        CHECK(memcmp(z, x, sizeof(float) * 7 * 769) == 0); /* rows kept */
        get(be, tn3, z);
        CHECK(memcmp(z + 3 * 769, y + 3 * 769, sizeof(float) * 4 * 769) == 0);
        CHECK(memcmp(z, y, sizeof(float) * 3 * 769) != 0);
        free(z);
        cinfer_backend_tensor_destroy(be, t);
        cinfer_backend_tensor_destroy(be, tn3);
        cinfer_backend_tensor_destroy(be, wn);

        /* bad descriptors */
        cinfer_tensor *bad = (cinfer_tensor *)&d;
        int64_t s2[2] = {4, 33};
        d = cinfer_tensor_desc_make(CINFER_DTYPE_Q4_1, 2, s2);
        CHECK_EQ_INT(cinfer_backend_tensor_create(be, &d, &bad), CINFER_E_INVALID_ARG);
        CHECK(bad == NULL);
        d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 0, s2);
        CHECK_EQ_INT(cinfer_backend_tensor_create(be, &d, &bad), CINFER_E_INVALID_ARG);
        d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, s2);
        d.shape[0] = 0;
        CHECK_EQ_INT(cinfer_backend_tensor_create(be, &d, &bad), CINFER_E_INVALID_ARG);
        d = cinfer_tensor_desc_make((cinfer_dtype)7, 2, s2);
        CHECK_EQ_INT(cinfer_backend_tensor_create(be, &d, &bad), CINFER_E_INVALID_ARG);
        d = cinfer_tensor_desc_make(CINFER_DTYPE_F32, 2, s2);
        CHECK_EQ_INT(cinfer_backend_tensor_create_weight(be, &d, NULL, &bad),
                     CINFER_E_INVALID_ARG);
        CHECK_EQ_INT(cinfer_backend_tensor_create(be, NULL, &bad), CINFER_E_INVALID_ARG);
        free(x);
        free(y);
        cinfer_backend_destroy(be);
    }
}

/* ---------------------------------------------------------------------- */
/* embed                                                                   */
/* ---------------------------------------------------------------------- */

/* Element i of a row of type t, decoded from the block layout. */
static double ref_elem(cinfer_dtype t, const uint8_t *row, int64_t i)
{
    int64_t b = i / 32, j = i % 32;
    switch (t) {
    case CINFER_DTYPE_F32: {
        float f;
        memcpy(&f, row + 4 * i, 4);
        return f;
    }
    case CINFER_DTYPE_F16: {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        return cinfer_fp16_to_fp32(h);
    }
    case CINFER_DTYPE_BF16: {
        uint16_t h;
        memcpy(&h, row + 2 * i, 2);
        uint32_t u = (uint32_t)h << 16;
        float f;
        memcpy(&f, &u, 4);
        return f;
    }
    case CINFER_DTYPE_Q8_0: {
        const uint8_t *blk = row + b * 34;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        return (double)cinfer_fp16_to_fp32(dh) * (int8_t)blk[2 + j];
    }
    case CINFER_DTYPE_Q4_0: {
        const uint8_t *blk = row + b * 18;
        uint16_t dh;
        memcpy(&dh, blk, 2);
        int q = j < 16 ? (blk[2 + j] & 15) : (blk[2 + j - 16] >> 4);
        return (double)cinfer_fp16_to_fp32(dh) * (q - 8);
    }
    case CINFER_DTYPE_Q4_1: {
        const uint8_t *blk = row + b * 20;
        uint16_t dh, mh;
        memcpy(&dh, blk, 2);
        memcpy(&mh, blk + 2, 2);
        int q = j < 16 ? (blk[4 + j] & 15) : (blk[4 + j - 16] >> 4);
        return (double)cinfer_fp16_to_fp32(dh) * q + cinfer_fp16_to_fp32(mh);
    }
    default:
        CINFER_ASSERT(0);
        return 0;
    }
}

/* Embeds toks[0..n) (one sequence) into a new [n, d] tensor *out, poisoned
 * first; returns its contents (malloc'd). sb keeps the step for the
 * caller. */
static float *embed_tokens(cinfer_backend *be, const cinfer_tensor *table,
                           step_buf *sb, const int *toks, int n,
                           cinfer_tensor **out)
{
    int64_t d = cinfer_tensor_get_desc(table)->shape[1];
    step_init(sb, 1, 16);
    sb->tables[0] = 0;
    for (int r = 0; r < n; r++)
        step_row(sb, 0, r, toks[r]);
    CHECK_OK(cinfer_backend_set_step(be, &sb->s));
    *out = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
    poison(be, *out);
    CHECK_OK(cinfer_backend_embed(be, table, *out));
    float *got = malloc(sizeof(float) * (size_t)n * (size_t)d);
    CINFER_ASSERT(got != NULL);
    get(be, *out, got);
    return got;
}

static void test_embed(void)
{
    static const cinfer_dtype types[] = {CINFER_DTYPE_F32,  CINFER_DTYPE_F16,
                                         CINFER_DTYPE_BF16, CINFER_DTYPE_Q8_0,
                                         CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1};
    step_buf *sb = step_new();
    for (int ti = 0; ti < 6; ti++) {
        for (int wide = 0; wide < 2; wide++) {
            cinfer_dtype dt = types[ti];
            const int64_t vocab = 37;
            const int64_t d = cinfer_dtype_block_elems(dt) > 1
                                  ? (wide ? 5152 : 800)
                                  : (wide ? 5125 : 769);
            size_t rb = cinfer_dtype_row_bytes(dt, d);
            uint64_t seed = seed_for(7 + (uint64_t)ti * 2 + (uint64_t)wide);
            float *src = randv(vocab * d, &seed, 2.0f);
            uint8_t *table = malloc(rb * (size_t)vocab);
            for (int64_t v = 0; v < vocab; v++)
                cinfer_quantize_row(dt, src + v * d, table + v * rb, d);
            int toks[9];
            for (int r = 0; r < 9; r++)
                toks[r] = rand_below(&seed, (int)vocab);
            toks[0] = (int)vocab - 1; /* the table's ends */
            toks[1] = 0;
            toks[3] = toks[2]; /* a token twice */
            double *want = malloc(sizeof(double) * 9 * (size_t)d);
            for (int r = 0; r < 9; r++)
                for (int64_t i = 0; i < d; i++)
                    want[r * d + i] = ref_elem(dt, table + toks[r] * rb, i);
            char what[48];
            snprintf(what, sizeof what, "embed %s d%lld", cinfer_dtype_name(dt),
                     (long long)d);
            cpu_keep k = {{0}};
            for (int fi = 0; fi < g_n_factories; fi++) {
                const factory *f = &g_factories[fi];
                cinfer_backend *be = make_backend(f);
                cinfer_tensor *tt = wnew(be, dt, 2, vocab, d, table);
                cinfer_tensor *out = NULL;
                float *got = embed_tokens(be, tt, sb, toks, 9, &out);
                check_out(what, f, got, want, keep(&k, fi, 0, got, 9 * d),
                          9 * d, 1e-6, NMSE_EXACT);

                /* a token past the table is an error */
                sb->tokens[4] = (int32_t)vocab;
                CHECK_OK(cinfer_backend_set_step(be, &sb->s));
                CHECK_EQ_INT(cinfer_backend_embed(be, tt, out),
                             CINFER_E_INVALID_ARG);
                CHECK(strstr(cinfer_last_error(), "embed") != NULL);

                cinfer_backend_tensor_destroy(be, out);
                cinfer_backend_tensor_destroy(be, tt);
                cinfer_backend_destroy(be);
                free(got);
            }
            keep_free(&k);
            free(want);
            free(table);
            free(src);
        }
    }
    free(sb);
}

/* Q8_0 / Q4_0 / Q4_1 matrices, the K-quants and IQ4 are packed into
 * the backend's own memory on the AVX-512 path (weight_borrows 0): they read
 * back as the bytes they were created from, and keep working after the
 * caller's copy is overwritten. Other weights are used in place
 * (weight_borrows 1). CPU only: the packing is the CPU backend's. */
static void check_weight_copies(cinfer_dtype wt, int64_t d)
{
    const int64_t rows = 37;
    const size_t rb = cinfer_dtype_row_bytes(wt, d);
    const size_t nbytes = rb * (size_t)rows;
    uint64_t seed = seed_for(5);
    float *src = randv(rows * d, &seed, 2.0f);
    uint8_t *table = malloc(nbytes), *copy = malloc(nbytes), *back = malloc(nbytes);
    CINFER_ASSERT(table && copy && back);
    for (int64_t v = 0; v < rows; v++)
        cinfer_quantize_row(wt, src + v * d, table + v * rb, d);
    memcpy(copy, table, nbytes);
    step_buf *sb = step_new();
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        if (!is_cpu(c))
            continue;
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tt = wnew(be, wt, 2, rows, d, table);
        cinfer_tensor *tf = wnew(be, CINFER_DTYPE_F32, 2, 2, 16, src);
        int packed = c->isa == CINFER_CPU_ISA_AVX512;
        CHECK_EQ_INT(cinfer_backend_weight_borrows(be, tt), !packed);
        CHECK_EQ_INT(cinfer_backend_weight_borrows(be, tf), 1);
        if (packed)
            memset(table, 0xEE, nbytes); /* the caller frees its copy */

        memset(back, 0, nbytes);
        get(be, tt, back);
        CHECK(memcmp(back, copy, nbytes) == 0);
        /* a range across rows and blocks, starting inside a block */
        size_t off = rb * 7 + 5, len = rb * 9 + 61;
        memset(back, 0, nbytes);
        CHECK_OK(cinfer_backend_download(be, tt, off, back, len));
        CHECK(memcmp(back, copy + off, len) == 0);

        /* embed reads the packed rows (whole groups and the tail) */
        static const int toks[] = {36, 0, 9, 31, 32};
        cinfer_tensor *out = NULL;
        float *got = embed_tokens(be, tt, sb, toks, 5, &out);
        float *want = malloc(sizeof(float) * (size_t)d);
        int bad = 0;
        for (int r = 0; r < 5; r++) {
            cinfer_dequantize_row(wt, copy + (size_t)toks[r] * rb,
                                  want, d);
            bad += memcmp(got + (size_t)r * d, want, sizeof(float) * (size_t)d) != 0;
        }
        CHECK_EQ_INT(bad, 0);
        free(got);
        free(want);
        cinfer_backend_tensor_destroy(be, out);
        cinfer_backend_tensor_destroy(be, tf);
        cinfer_backend_tensor_destroy(be, tt);
        cinfer_backend_destroy(be);
        memcpy(table, copy, nbytes);
    }
    free(sb);
    free(back);
    free(copy);
    free(table);
    free(src);
}

static void test_weight_copies(void)
{
    check_weight_copies(CINFER_DTYPE_Q8_0, 800);
    check_weight_copies(CINFER_DTYPE_Q4_0, 800);
    check_weight_copies(CINFER_DTYPE_Q4_1, 800);
    /* 29 super-blocks: embed unpacks each row in two runs or more */
    check_weight_copies(CINFER_DTYPE_Q4_K, 29 * 256);
    check_weight_copies(CINFER_DTYPE_Q5_K, 29 * 256);
    check_weight_copies(CINFER_DTYPE_Q6_K, 29 * 256);
    check_weight_copies(CINFER_DTYPE_Q2_K, 29 * 256);
    check_weight_copies(CINFER_DTYPE_Q3_K, 29 * 256);
    check_weight_copies(CINFER_DTYPE_IQ4_XS, 29 * 256);
    check_weight_copies(CINFER_DTYPE_IQ4_NL, 29 * 256 + 32);
}

/* ---------------------------------------------------------------------- */
/* rms_norm, add, add_bias, silu_mul, gather_rows                          */
/* ---------------------------------------------------------------------- */

static void rowwise_case(int64_t d)
{
    const int64_t n = 5;
    uint64_t seed = seed_for(99 + (uint64_t)d);
    float *x = randv(n * d, &seed, 3.0f);
    float *y = randv(n * d, &seed, 3.0f);
    float *w = randv(d, &seed, 1.5f);
    float *got = malloc(sizeof(float) * (size_t)(n * d));
    double *want_norm = malloc(sizeof(double) * (size_t)(n * d));
    double *want_add = malloc(sizeof(double) * (size_t)(n * d));
    double *want_bias = malloc(sizeof(double) * (size_t)(n * d));
    double *want_silu = malloc(sizeof(double) * (size_t)(n * d));
    double *want_gather = malloc(sizeof(double) * (size_t)(3 * d));
    for (int r = 0; r < n; r++) {
        double ss = 0;
        for (int64_t i = 0; i < d; i++)
            ss += (double)x[r * d + i] * x[r * d + i];
        double s = 1.0 / sqrt(ss / (double)d + 1e-5);
        for (int64_t i = 0; i < d; i++)
            want_norm[r * d + i] = x[r * d + i] * s * w[i];
    }
    for (int64_t i = 0; i < n * d; i++) {
        want_add[i] = (double)x[i] + y[i];
        want_bias[i] = (double)x[i] + w[i % d];
        want_silu[i] = (double)x[i] / (1.0 + exp(-(double)x[i])) * y[i];
    }
    step_buf *sb = step_new();
    step_init(sb, 1, 16);
    sb->tables[0] = 0;
    for (int r = 0; r < n; r++)
        step_row(sb, 0, r, 1);
    /* three of the five rows, the last among them */
    sb->s.n_out = 3;
    sb->out_rows[0] = rand_below(&seed, 2);
    sb->out_rows[1] = 2 + rand_below(&seed, 2);
    sb->out_rows[2] = 4;
    for (int j = 0; j < 3; j++)
        for (int64_t i = 0; i < d; i++)
            want_gather[j * d + i] = x[sb->out_rows[j] * d + i];
    char what[6][40];
    static const char *ops[6] = {"rms_norm", "rms_norm",  "add",
                                 "add",      "add_bias",  "silu_mul"};
    static const char *how[6] = {"", " in place", "", " aliasing b", "", " aliasing gate"};
    for (int i = 0; i < 6; i++)
        snprintf(what[i], sizeof what[i], "%s d%lld%s", ops[i], (long long)d, how[i]);
    char gwhat[40];
    snprintf(gwhat, sizeof gwhat, "gather_rows d%lld", (long long)d);

    cpu_keep k = {{0}};
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        cinfer_backend *be = make_backend(f);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *ty = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *tw = wnew(be, CINFER_DTYPE_F32, 1, d, 0, w);
        const int64_t nd = n * d;

        /* rms_norm, into a new tensor and in place */
        put(be, tx, x);
        poison(be, to);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-5f, to));
        get(be, to, got);
        check_out(what[0], f, got, want_norm, keep(&k, fi, 0, got, nd), nd,
                  2e-6 * 8, NMSE_EXACT);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-5f, tx));
        get(be, tx, got);
        check_out(what[1], f, got, want_norm, keep(&k, fi, 1, got, nd), nd,
                  2e-6 * 8, NMSE_EXACT);

        /* add into a new tensor and aliasing b, add_bias */
        put(be, tx, x);
        put(be, ty, y);
        poison(be, to);
        CHECK_OK(cinfer_backend_add(be, tx, ty, to));
        get(be, to, got);
        check_out(what[2], f, got, want_add, keep(&k, fi, 2, got, nd), nd,
                  1e-6, NMSE_EXACT);
        CHECK_OK(cinfer_backend_add(be, tx, ty, ty));
        get(be, ty, got);
        check_out(what[3], f, got, want_add, keep(&k, fi, 3, got, nd), nd,
                  1e-6, NMSE_EXACT);
        CHECK_OK(cinfer_backend_add_bias(be, tx, tw));
        get(be, tx, got);
        check_out(what[4], f, got, want_bias, keep(&k, fi, 4, got, nd), nd,
                  1e-6, NMSE_EXACT);

        /* silu_mul into a new tensor and aliasing gate */
        put(be, tx, x);
        put(be, ty, y);
        poison(be, to);
        CHECK_OK(cinfer_backend_silu_mul(be, tx, ty, to));
        get(be, to, got);
        check_out(what[5], f, got, want_silu, keep(&k, fi, 5, got, nd), nd,
                  1e-5, NMSE_EXACT);
        CHECK_OK(cinfer_backend_silu_mul(be, tx, ty, tx));
        get(be, tx, got);
        check_out(what[5], f, got, want_silu, keep(&k, fi, 6, got, nd), nd,
                  1e-5, NMSE_EXACT);

        /* gather_rows: a copy, exact on the CPU */
        CHECK_OK(cinfer_backend_set_step(be, &sb->s));
        put(be, tx, x);
        cinfer_tensor *tg = tnew(be, CINFER_DTYPE_F32, 2, 3, d, 0, 0);
        poison(be, tg);
        CHECK_OK(cinfer_backend_gather_rows(be, tx, tg));
        get(be, tg, got);
        check_out(gwhat, f, got, want_gather, keep(&k, fi, 7, got, 3 * d),
                  3 * d, 0.0, NMSE_EXACT);

        cinfer_backend_tensor_destroy(be, tg);
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, ty);
        cinfer_backend_tensor_destroy(be, to);
        cinfer_backend_tensor_destroy(be, tw);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
    free(sb);
    free(x);
    free(y);
    free(w);
    free(got);
    free(want_norm);
    free(want_add);
    free(want_bias);
    free(want_silu);
    free(want_gather);
}

/* rms_norm with a weight of g elements over rows of 5 * g: each group of
 * g normalised on its own (the per-head Q/K norm of qwen3). */
static void rms_groups_case(int64_t g)
{
    const int64_t n = 7, groups = 5, d = groups * g, nd = n * d;
    uint64_t seed = seed_for(71 + (uint64_t)g);
    float *x = randv(nd, &seed, 3.0f);
    float *w = randv(g, &seed, 1.5f);
    float *got = malloc(sizeof(float) * (size_t)nd);
    double *want = malloc(sizeof(double) * (size_t)nd);
    for (int64_t r = 0; r < n * groups; r++) {
        double ss = 0;
        for (int64_t i = 0; i < g; i++)
            ss += (double)x[r * g + i] * x[r * g + i];
        double sc = 1.0 / sqrt(ss / (double)g + 1e-6);
        for (int64_t i = 0; i < g; i++)
            want[r * g + i] = x[r * g + i] * sc * w[i];
    }
    char what[2][40];
    snprintf(what[0], sizeof what[0], "rms_norm groups of %lld", (long long)g);
    snprintf(what[1], sizeof what[1], "rms_norm groups of %lld in place",
             (long long)g);
    cpu_keep k = {{0}};
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        cinfer_backend *be = make_backend(f);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *tw = wnew(be, CINFER_DTYPE_F32, 1, g, 0, w);
        put(be, tx, x);
        poison(be, to);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-6f, to));
        get(be, to, got);
        check_out(what[0], f, got, want, keep(&k, fi, 0, got, nd), nd,
                  2e-6 * 8, NMSE_EXACT);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-6f, tx));
        get(be, tx, got);
        check_out(what[1], f, got, want, keep(&k, fi, 1, got, nd), nd,
                  2e-6 * 8, NMSE_EXACT);
        /* a weight whose length does not divide the row is refused */
        float w3[3] = {1, 1, 1};
        cinfer_tensor *t3 = wnew(be, CINFER_DTYPE_F32, 1, 3, 0, w3);
        CHECK_EQ_INT(cinfer_backend_rms_norm(be, tx, t3, 1e-6f, to),
                     CINFER_E_INVALID_ARG);
        CHECK(strstr(cinfer_last_error(), "rms_norm") != NULL);
        cinfer_backend_tensor_destroy(be, t3);
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, to);
        cinfer_backend_tensor_destroy(be, tw);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
    free(x);
    free(w);
    free(got);
    free(want);
}

static void test_rms_norm_groups(void)
{
    rms_groups_case(128);
    rms_groups_case(37);
}

static void test_rowwise(void)
{
    rowwise_case(769);
    rowwise_case(5125);
}

/* add_rms_norm against add then rms_norm on the same backend: the same
 * bits for the sum left in x and for the norm, out aliasing d or not
 * (CUDA runs it as one kernel for a whole-row weight; a weight of g
 * elements, d = 5 * g, takes the two ops); out aliasing x is refused.
 * The two ops themselves are checked against the reference above. */
static void add_norm_case(int64_t d, int64_t g)
{
    const int64_t n = 6, nd = n * d;
    uint64_t seed = seed_for(313 + (uint64_t)d + (uint64_t)g);
    float *x = randv(nd, &seed, 3.0f);
    float *y = randv(nd, &seed, 3.0f);
    float *w = randv(g, &seed, 1.5f);
    float *sum0 = malloc(sizeof(float) * (size_t)nd);
    float *out0 = malloc(sizeof(float) * (size_t)nd);
    float *got = malloc(sizeof(float) * (size_t)nd);
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        cinfer_backend *be = make_backend(f);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *ty = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *tw = wnew(be, CINFER_DTYPE_F32, 1, g, 0, w);
        put(be, tx, x);
        put(be, ty, y);
        CHECK_OK(cinfer_backend_add(be, tx, ty, tx));
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-5f, to));
        get(be, tx, sum0);
        get(be, to, out0);
        for (int alias = 0; alias < 2; alias++) {
            cinfer_tensor *out = alias ? ty : to;
            put(be, tx, x);
            put(be, ty, y);
            poison(be, to);
            CHECK_OK(cinfer_backend_add_rms_norm(be, tx, ty, tw, 1e-5f, out));
            get(be, tx, got);
            int sum_eq = memcmp(got, sum0, sizeof(float) * (size_t)nd) == 0;
            get(be, out, got);
            int out_eq = memcmp(got, out0, sizeof(float) * (size_t)nd) == 0;
            if (!sum_eq || !out_eq)
                fprintf(stderr, "%s: add_rms_norm d%lld g%lld%s: the %s "
                        "differs from the two ops'\n",
                        f->name, (long long)d, (long long)g,
                        alias ? " aliasing d" : "", !sum_eq ? "sum" : "norm");
            CHECK(sum_eq && out_eq);
        }
        CHECK_EQ_INT(cinfer_backend_add_rms_norm(be, tx, ty, tw, 1e-5f, tx),
                     CINFER_E_INVALID_ARG);
        CHECK(strstr(cinfer_last_error(), "add_rms_norm") != NULL);
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, ty);
        cinfer_backend_tensor_destroy(be, to);
        cinfer_backend_tensor_destroy(be, tw);
        cinfer_backend_destroy(be);
    }
    free(x);
    free(y);
    free(w);
    free(sum0);
    free(out0);
    free(got);
}

static void test_add_rms_norm(void)
{
    add_norm_case(576, 576);  /* float4 loads */
    add_norm_case(769, 769);  /* scalar */
    add_norm_case(5120, 5120); /* more than 1024 threads' worth */
    add_norm_case(640, 128);  /* per group: the two ops */
}

/* Large batches take the threaded paths of the elementwise ops; on the
 * CPU 1 and 3 threads give the same bits. */
static void test_rowwise_large(void)
{
    const int64_t n = 67, d = 1031;
    uint64_t seed = seed_for(55);
    float *x = randv(n * d, &seed, 4.0f);
    float *y = randv(n * d, &seed, 4.0f);
    float *w = randv(d, &seed, 1.0f);
    double *want = malloc(sizeof(double) * (size_t)(n * d));
    for (int r = 0; r < n; r++) {
        double ss = 0;
        double *row = want + r * d;
        for (int i = 0; i < d; i++) {
            double a = x[r * d + i];
            row[i] = a + a / (1 + exp(-a)) * y[r * d + i] + w[i];
            ss += row[i] * row[i];
        }
        double s = 1.0 / sqrt(ss / (double)d + 1e-6);
        for (int i = 0; i < d; i++)
            row[i] *= s * w[i];
    }
    float *prev = NULL;
    cpu_keep k = {{0}};
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *f = &g_factories[ci];
        cinfer_backend *be = make_backend(f);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *ty = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *tw = wnew(be, CINFER_DTYPE_F32, 1, d, 0, w);
        put(be, tx, x);
        put(be, ty, y);
        CHECK_OK(cinfer_backend_silu_mul(be, tx, ty, ty));
        CHECK_OK(cinfer_backend_add(be, tx, ty, tx));
        CHECK_OK(cinfer_backend_add_bias(be, tx, tw));
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-6f, tx));
        float *got = malloc(sizeof(float) * (size_t)(n * d));
        get(be, tx, got);
        /* every op of the chain is a nearly exact one */
        check_out("rms_norm chain (silu_mul, add, add_bias, rms_norm)", f, got,
                  want, keep(&k, ci, 0, got, n * d), n * d, 1e-5, NMSE_EXACT);
        if (ci > 0 && is_cpu(f) && g_factories[ci - 1].isa == f->isa)
            CHECK(memcmp(prev, got, sizeof(float) * (size_t)(n * d)) == 0);
        free(prev);
        prev = got;
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, ty);
        cinfer_backend_tensor_destroy(be, tw);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
    free(prev);
    free(want);
    free(x);
    free(y);
    free(w);
}

/* silu over the whole float range: the CPU's vector exp stays within a few
 * ulp; every backend saturates without NaN and keeps NaN. */
static void test_silu_range(void)
{
    enum { N = 1203 };
    float g[N], u[N], got[N];
    double want[N];
    for (int i = 0; i < N - 8; i++)
        g[i] = -95.0f + 190.0f * (float)i / (float)(N - 9);
    const float extremes[8] = {0.0f, -0.0f, 1e-30f, -1e-30f,
                               1e30f, -1e30f, 3.4e38f, -3.4e38f};
    for (int i = 0; i < 8; i++)
        g[N - 8 + i] = extremes[i];
    for (int i = 0; i < N; i++) {
        u[i] = i < N - 8 ? 1.0f + (float)(i % 7) * 0.125f : 1.0f;
        double gd = g[i];
        want[i] = gd / (1.0 + exp(-gd)) * u[i];
        if (isinf(exp(-gd)))
            want[i] = -0.0;
    }
    cpu_keep k = {{0}};
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *f = &g_factories[ci];
        cinfer_backend *be = make_backend(f);
        cinfer_tensor *tg = tnew(be, CINFER_DTYPE_F32, 2, 1, N, 0, 0);
        cinfer_tensor *tu = tnew(be, CINFER_DTYPE_F32, 2, 1, N, 0, 0);
        put(be, tg, g);
        put(be, tu, u);
        CHECK_OK(cinfer_backend_silu_mul(be, tg, tu, tg));
        get(be, tg, got);
        if (is_cpu(f)) {
            int bad = 0;
            for (int i = 0; i < N; i++) {
                double tol = 4e-7 * fabs(want[i]) + 1e-36;
                if (!(fabs(got[i] - want[i]) <= tol)) {
                    if (bad++ < 3)
                        fprintf(stderr, "silu(%g) [%s] = %.9g, want %.9g\n",
                                (double)g[i], f->name, (double)got[i], want[i]);
                }
            }
            CHECK_EQ_INT(bad, 0);
        }
        /* The range part by NMSE (the extremes, x * 1 or -0, would drown
         * it), then the extremes themselves: finite in, finite out. */
        const float *cpu_range = keep(&k, ci, 0, got, N);
        const float *cpu_ext = keep(&k, ci, 1, got + N - 8, 8);
        if (!is_cpu(f)) {
            check_out("silu_mul range", f, got, want, cpu_range, N - 8, 0.0,
                      NMSE_EXACT);
            check_out("silu_mul extremes", f, got + N - 8, want + N - 8,
                      cpu_ext, 8, 0.0, NMSE_EXACT);
        }
        /* NaN in, NaN out */
        float nan_in[2] = {NAN, 1.0f};
        CHECK_OK(cinfer_backend_upload(be, tg, 0, nan_in, sizeof nan_in));
        CHECK_OK(cinfer_backend_silu_mul(be, tg, tu, tg));
        float nan_out;
        CHECK_OK(cinfer_backend_download(be, tg, 0, &nan_out, 4));
        CHECK(isnan(nan_out));
        cinfer_backend_tensor_destroy(be, tg);
        cinfer_backend_tensor_destroy(be, tu);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
}

/* The step ops on a batch big enough to be split over the threads, from a
 * shuffled block pool. */
static void test_step_ops_large(void)
{
    enum { N = 67, NH = 8, HD = 128, W = NH * HD, VOCAB = 40, BS = 4 };
    enum { NBLK = 30, NOUT = 40 };
    uint64_t seed = seed_for(8);
    float *src = randv(VOCAB * W, &seed, 1.0f);
    size_t rb = cinfer_dtype_row_bytes(CINFER_DTYPE_Q4_1, W);
    uint8_t *table = malloc(rb * VOCAB);
    for (int v = 0; v < VOCAB; v++)
        cinfer_quantize_row(CINFER_DTYPE_Q4_1, src + v * W, table + v * rb, W);
    float *vv = randv(N * W, &seed, 1.0f);
    step_buf *sb = step_new();
    step_init(sb, 3, BS);
    int pool[NBLK];
    for (int b = 0; b < NBLK; b++)
        pool[b] = b;
    for (int b = NBLK - 1; b > 0; b--) {
        int j = rand_below(&seed, b + 1), t = pool[b];
        pool[b] = pool[j];
        pool[j] = t;
    }
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 9; b++)
            sb->tables[s * MAX_BLOCKS + b] = pool[s * 9 + b];
    for (int r = 0; r < N; r++)
        step_row(sb, r % 3, r / 3 + 5 * (r % 3), rand_below(&seed, VOCAB));
    sb->s.n_out = NOUT;
    for (int j = 0; j < NOUT; j++)
        sb->out_rows[j] = j + (j * 27) / NOUT;

    /* references */
    double *want_embed = malloc(sizeof(double) * N * W);
    double *want_rope = malloc(sizeof(double) * N * W);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < W; i++)
            want_embed[r * W + i] = ref_elem(CINFER_DTYPE_Q4_1,
                                             table + sb->tokens[r] * rb, i);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                const double *x = want_embed + r * W + h * HD;
                double th = sb->positions[r] * pow(10000.0, -2.0 * i / HD);
                want_rope[r * W + h * HD + i] =
                    x[i] * cos(th) - x[i + HD / 2] * sin(th);
                want_rope[r * W + h * HD + i + HD / 2] =
                    x[i] * sin(th) + x[i + HD / 2] * cos(th);
            }
    double *want_kv = malloc(sizeof(double) * N * W * 2);
    double *want_g = malloc(sizeof(double) * NOUT * W);
    float *emb_f = malloc(sizeof(float) * N * W);
    float *got = malloc(sizeof(float) * N * W);
    float *kvgot = malloc(sizeof(float) * N * W * 2);
    float *gg = malloc(sizeof(float) * NOUT * W);

    cpu_keep k = {{0}};
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        cinfer_backend *be = make_backend(c);
        CHECK_OK(cinfer_backend_set_step(be, &sb->s));
        cinfer_tensor *tt = wnew(be, CINFER_DTYPE_Q4_1, 2, VOCAB, W, table);
        cinfer_tensor *x = tnew(be, CINFER_DTYPE_F32, 2, N, W, 0, 0);
        cinfer_tensor *v = tnew(be, CINFER_DTYPE_F32, 2, N, W, 0, 0);
        cinfer_tensor *g = tnew(be, CINFER_DTYPE_F32, 2, NOUT, W, 0, 0);
        cinfer_tensor *kc = tnew(be, CINFER_DTYPE_F16, 4, NBLK, BS, NH, HD);
        cinfer_tensor *vc = tnew(be, CINFER_DTYPE_F32, 4, NBLK, BS, NH, HD);
        poison(be, x);
        CHECK_OK(cinfer_backend_embed(be, tt, x));
        get(be, x, got);
        check_out("embed Q4_1 large", c, got, want_embed,
                  keep(&k, ci, 0, got, N * W), N * W, 1e-6, NMSE_EXACT);
        memcpy(emb_f, got, sizeof(float) * N * W);
        CHECK_OK(cinfer_backend_rope(be, x, NH, HD, HD, 10000.0f, CINFER_ROPE_NEOX));
        get(be, x, got);
        if (is_cpu(c)) {
            for (int r = 0; r < N; r++)
                check_close("rope large", c, got + r * W, want_rope + r * W, W,
                            1e-5 + sb->positions[r] * 4e-7);
        } else {
            check_out("rope large", c, got, want_rope,
                      keep(&k, ci, 1, got, N * W), N * W, 0.0, NMSE_EXACT);
        }
        put(be, v, vv);
        poison(be, kc);
        poison(be, vc);
        CHECK_OK(cinfer_backend_kv_store(be, x, v, kc, vc));
        uint16_t *kh = malloc(tbytes(kc));
        float *vh = malloc(tbytes(vc));
        get(be, kc, kh);
        get(be, vc, vh);
        /* the cache holds this backend's K (rounded to F16) and V */
        int bad = 0;
        for (int r = 0; r < N; r++)
            for (int i = 0; i < W; i++) {
                uint16_t kw = cinfer_fp32_to_fp16(got[r * W + i]);
                uint16_t kg = kh[(int64_t)sb->slots[r] * W + i];
                float vg = vh[(int64_t)sb->slots[r] * W + i];
                bad += kg != kw;
                bad += memcmp(&vg, &vv[r * W + i], 4) != 0;
                want_kv[r * W + i] = cinfer_fp16_to_fp32(kw);
                want_kv[(N + r) * W + i] = vv[r * W + i];
                kvgot[r * W + i] = cinfer_fp16_to_fp32(kg);
                kvgot[(N + r) * W + i] = vg;
            }
        if (is_cpu(c))
            CHECK_EQ_INT(bad, 0);
        else
            check_out("kv_store large", c, kvgot, want_kv, NULL, 2 * N * W,
                      0.0, NMSE_EXACT);
        put(be, x, emb_f);
        poison(be, g);
        CHECK_OK(cinfer_backend_gather_rows(be, x, g));
        get(be, g, gg);
        for (int j = 0; j < NOUT; j++)
            for (int i = 0; i < W; i++)
                want_g[j * W + i] = emb_f[sb->out_rows[j] * W + i];
        check_out("gather_rows large", c, gg, want_g,
                  keep(&k, ci, 2, gg, NOUT * W), NOUT * W, 0.0, NMSE_EXACT);
        free(kh);
        free(vh);
        cinfer_tensor *ts[] = {tt, x, v, g, kc, vc};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            cinfer_backend_tensor_destroy(be, ts[i]);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
    free(sb);
    free(gg);
    free(kvgot);
    free(got);
    free(want_kv);
    free(want_g);
    free(emb_f);
    free(want_embed);
    free(want_rope);
    free(vv);
    free(table);
    free(src);
}

/* ---------------------------------------------------------------------- */
/* rope                                                                    */
/* ---------------------------------------------------------------------- */

static void test_rope(void)
{
    static const int pos[] = {0, 1, 17, 100, 511, 4095, 3};
    const int n = 7, n_heads = 3;
    struct {
        int head_dim, rot_dim;
        cinfer_rope_mode mode;
        float theta;
        float freq_scale; /* 1: plain rope through cinfer_backend_rope */
        int factors;      /* per-pair frequency factors (Llama 3's) */
    } cases[] = {
        {64, 64, CINFER_ROPE_NORM, 10000.0f, 1.0f, 0},
        {64, 64, CINFER_ROPE_NEOX, 1000000.0f, 1.0f, 0},
        {40, 24, CINFER_ROPE_NORM, 10000.0f, 1.0f, 0},
        {40, 24, CINFER_ROPE_NEOX, 500000.0f, 1.0f, 0},
        {64, 64, CINFER_ROPE_NORM, 500000.0f, 1.0f, 1},
        {40, 24, CINFER_ROPE_NEOX, 10000.0f, 0.25f, 0},
        {64, 64, CINFER_ROPE_NEOX, 1000000.0f, 0.125f, 1},
    };
    const int n_cases = (int)(sizeof cases / sizeof cases[0]);
    float ff[32];
    for (int i = 0; i < 32; i++) /* factors 1 .. 8, in no order */
        ff[i] = 1.0f + (float)((i * 3) % 5) * 1.75f;
    step_buf *sb = step_new();
    step_init(sb, 1, 512);
    for (int b = 0; b < 9; b++)
        sb->tables[b] = b;
    for (int r = 0; r < n; r++)
        step_row(sb, 0, pos[r], 0);
    for (int kc = 0; kc < n_cases; kc++) {
        int hd = cases[kc].head_dim, rd = cases[kc].rot_dim;
        const int scaled = cases[kc].freq_scale != 1.0f || cases[kc].factors;
        const cinfer_rope_params rp = {
            .theta = cases[kc].theta,
            .freq_scale = cases[kc].freq_scale,
            .freq_factors = cases[kc].factors ? ff : NULL,
            .mode = cases[kc].mode};
        int64_t width = (int64_t)n_heads * hd;
        uint64_t seed = seed_for(31 + (uint64_t)kc);
        float *x = randv(n * width, &seed, 1.0f);
        float *got = malloc(sizeof(float) * (size_t)(n * width));
        float *again = malloc(sizeof(float) * (size_t)(n * width));
        double *want = malloc(sizeof(double) * (size_t)(n * width));
        for (int r = 0; r < n; r++) {
            for (int h = 0; h < n_heads; h++) {
                const float *xs = x + r * width + h * hd;
                double *o = want + r * width + h * hd;
                for (int i = 0; i < hd; i++)
                    o[i] = xs[i];
                for (int i = 0; i < rd / 2; i++) {
                    double th = cases[kc].freq_scale * pos[r] *
                                pow((double)cases[kc].theta, -2.0 * i / rd) /
                                (cases[kc].factors ? ff[i] : 1.0);
                    int i0 = cases[kc].mode == CINFER_ROPE_NORM ? 2 * i : i;
                    int i1 = cases[kc].mode == CINFER_ROPE_NORM ? 2 * i + 1
                                                                : i + rd / 2;
                    o[i0] = xs[i0] * cos(th) - xs[i1] * sin(th);
                    o[i1] = xs[i0] * sin(th) + xs[i1] * cos(th);
                }
            }
        }
        cpu_keep k = {{0}};
        for (int ci = 0; ci < g_n_factories; ci++) {
            const factory *c = &g_factories[ci];
            cinfer_backend *be = make_backend(c);
            CHECK_OK(cinfer_backend_set_step(be, &sb->s));
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            if (scaled) {
                /* an unscaled rope first in the step: the scaled one must
                 * not reuse its angles */
                put(be, tx, x);
                CHECK_OK(cinfer_backend_rope(be, tx, n_heads, hd, rd,
                                             cases[kc].theta, cases[kc].mode));
            }
            put(be, tx, x);
            CHECK_OK(cinfer_backend_rope_ext(be, tx, n_heads, hd, rd, &rp));
            get(be, tx, got);
            /* a second rope in the step (a CPU reuses its cos/sin table)
             * gives the same bits */
            put(be, tx, x);
            CHECK_OK(cinfer_backend_rope_ext(be, tx, n_heads, hd, rd, &rp));
            get(be, tx, again);
            CHECK(memcmp(again, got, sizeof(float) * (size_t)(n * width)) == 0);
            char what[48];
            if (is_cpu(c)) {
                /* The angle is built by repeated float products (as GGML
                 * does), so its error grows with the position: about
                 * pos * 2^-23. */
                for (int r = 0; r < n; r++) {
                    snprintf(what, sizeof what, "rope case %d row %d", kc, r);
                    check_close(what, c, got + r * width, want + r * width,
                                width, 2e-6 + pos[r] * 4e-7);
                }
            } else {
                snprintf(what, sizeof what, "rope case %d", kc);
                check_out(what, c, got, want, keep(&k, ci, 0, got, n * width),
                          n * width, 0.0, NMSE_EXACT);
            }
            if (ci == 0)
                keep(&k, ci, 0, got, n * width);
            /* the unrotated tail is untouched */
            for (int r = 0; r < n; r++)
                for (int h = 0; h < n_heads; h++)
                    CHECK(memcmp(got + r * width + h * hd + rd,
                                 x + r * width + h * hd + rd,
                                 sizeof(float) * (size_t)(hd - rd)) == 0);
            cinfer_backend_tensor_destroy(be, tx);
            cinfer_backend_destroy(be);
        }
        keep_free(&k);
        free(x);
        free(got);
        free(again);
        free(want);
    }
    free(sb);
}

/* ---------------------------------------------------------------------- */
/* kv_store                                                                */
/* ---------------------------------------------------------------------- */

/* kv_store's step: 6 rows of two sequences (seq 0 in blocks 4, 1; seq 1 in
 * block 3), out of order, in blocks of bs. */
static void kv_step(step_buf *sb, int bs)
{
    step_init(sb, 2, bs);
    sb->tables[0] = 4;
    sb->tables[1] = 1;
    sb->tables[MAX_BLOCKS] = 3;
    step_row(sb, 0, 2, 0);
    step_row(sb, 1, 0, 0);
    step_row(sb, 0, 3, 0);
    step_row(sb, 0, 4, 0);
    step_row(sb, 1, 1, 0);
    step_row(sb, 0, 7, 0);
}

static void kv_store_case(int n_kv, int hd)
{
    const int bs = 4, n_blocks = 6, n = 6;
    const int64_t width = (int64_t)n_kv * hd, n_slots = n_blocks * bs;
    step_buf *sb = step_new();
    for (int f16 = 0; f16 < 2; f16++) {
        cinfer_dtype dt = f16 ? CINFER_DTYPE_F16 : CINFER_DTYPE_F32;
        size_t es = f16 ? 2 : 4;
        kv_step(sb, bs);
        uint64_t seed = seed_for(3 + (uint64_t)(f16 * 1000 + hd));
        float *k = randv(n * width, &seed, 100.0f);
        float *v = randv(n * width, &seed, 0.01f);
        k[0] = 65519.0f; /* rounds to the largest half */
        k[1] = 1e-7f;    /* a half subnormal */
        uint8_t *sentinel = malloc((size_t)(n_slots * width) * es);
        memset(sentinel, 0x5a, (size_t)(n_slots * width) * es);
        /* reference: the stored values of the written slots */
        double *want = malloc(sizeof(double) * (size_t)(2 * n * width));
        float *got = malloc(sizeof(float) * (size_t)(2 * n * width));
        for (int r = 0; r < n; r++)
            for (int64_t i = 0; i < width; i++)
                for (int kv = 0; kv < 2; kv++) {
                    float s = (kv ? v : k)[r * width + i];
                    want[(kv * n + r) * width + i] =
                        f16 ? cinfer_fp16_to_fp32(cinfer_fp32_to_fp16(s)) : s;
                }
        char what[48];
        snprintf(what, sizeof what, "kv_store %s width %lld",
                 cinfer_dtype_name(dt), (long long)width);
        cpu_keep keepk = {{0}};
        for (int ci = 0; ci < g_n_factories; ci++) {
            const factory *c = &g_factories[ci];
            cinfer_backend *be = make_backend(c);
            cinfer_tensor *kc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
            cinfer_tensor *vc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
            put(be, kc, sentinel);
            put(be, vc, sentinel);
            CHECK_OK(cinfer_backend_set_step(be, &sb->s));
            cinfer_tensor *tk = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            cinfer_tensor *tv = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            put(be, tk, k);
            put(be, tv, v);
            CHECK_OK(cinfer_backend_kv_store(be, tk, tv, kc, vc));
            uint8_t *gk = malloc(tbytes(kc)), *gv = malloc(tbytes(vc));
            get(be, kc, gk);
            get(be, vc, gv);
            /* Slots no row names keep their bytes, on every backend. The
             * written ones: on the CPU the exact rounding (to nearest,
             * within half a unit of F16); elsewhere by NMSE. */
            int bad = 0;
            for (int64_t s = 0; s < n_slots; s++) {
                int row = -1;
                for (int r = 0; r < n; r++)
                    if (sb->slots[r] == s)
                        row = r;
                for (int64_t i = 0; i < width; i++) {
                    size_t off = (size_t)(s * width + i) * es;
                    for (int kv = 0; kv < 2; kv++) {
                        const uint8_t *cache = kv ? gv : gk;
                        if (row < 0) {
                            bad += memcmp(cache + off, sentinel, es) != 0;
                            continue;
                        }
                        float src = (kv ? v : k)[row * width + i];
                        float stored;
                        if (f16) {
                            uint16_t h;
                            memcpy(&h, cache + off, 2);
                            stored = cinfer_fp16_to_fp32(h);
                            if (is_cpu(c)) {
                                double e = fabs(stored - (double)src);
                                double ulp = fmax(fabs(src) * pow(2, -10),
                                                  pow(2, -24));
                                bad += !(e <= ulp / 2);
                                bad += h != cinfer_fp32_to_fp16(src);
                            }
                        } else {
                            memcpy(&stored, cache + off, 4);
                            if (is_cpu(c))
                                bad += memcmp(&stored, &src, 4) != 0;
                        }
                        got[(kv * n + row) * width + i] = stored;
                    }
                }
            }
            CHECK_EQ_INT(bad, 0);
            const float *cpu = keep(&keepk, ci, 0, got, 2 * n * width);
            if (!is_cpu(c))
                check_out(what, c, got, want, cpu, 2 * n * width, 0.0,
                          NMSE_EXACT);

            /* a slot past the cache is an error */
            int32_t slot3 = sb->slots[3];
            sb->slots[3] = (int32_t)n_slots;
            CHECK_OK(cinfer_backend_set_step(be, &sb->s));
            CHECK_EQ_INT(cinfer_backend_kv_store(be, tk, tv, kc, vc),
                         CINFER_E_INVALID_ARG);
            CHECK(strstr(cinfer_last_error(), "kv_store") != NULL);
            sb->slots[3] = slot3;

            free(gk);
            free(gv);
            cinfer_backend_tensor_destroy(be, tk);
            cinfer_backend_tensor_destroy(be, tv);
            cinfer_backend_tensor_destroy(be, kc);
            cinfer_backend_tensor_destroy(be, vc);
            cinfer_backend_destroy(be);
        }
        keep_free(&keepk);
        free(want);
        free(got);
        free(k);
        free(v);
        free(sentinel);
    }
    free(sb);
}

static void test_kv_store(void)
{
    kv_store_case(3, 20);
    kv_store_case(1, 769);
}

/* rope_kv_store against rope_ext(q), rope_ext(k) and kv_store on the same
 * backend: the same bits in q, k and both caches (CUDA runs one kernel). */
static void rope_kv_case(cinfer_rope_mode mode, int n_heads, int n_kv,
                         int hd, int rot, int f16)
{
    const int bs = 4, n_blocks = 6, n = 6;
    const int64_t width = (int64_t)n_kv * hd, qw = (int64_t)n_heads * hd;
    const cinfer_dtype dt = f16 ? CINFER_DTYPE_F16 : CINFER_DTYPE_F32;
    float ff[64];
    for (int i = 0; i < 64; i++)
        ff[i] = 1.0f + (float)((i * 3) % 5) * 1.75f;
    const cinfer_rope_params p = {.theta = 500000.0f, .freq_scale = 0.5f,
                                  .freq_factors = ff, .mode = mode};
    step_buf *sb = step_new();
    kv_step(sb, bs);
    uint64_t seed = seed_for(77 + (uint64_t)(hd * 8 + rot + f16));
    float *q = randv(n * qw, &seed, 4.0f);
    float *k = randv(n * width, &seed, 4.0f);
    float *v = randv(n * width, &seed, 4.0f);
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        cinfer_backend *be = make_backend(c);
        CHECK_OK(cinfer_backend_set_step(be, &sb->s));
        cinfer_tensor *tq = tnew(be, CINFER_DTYPE_F32, 2, n, qw, 0, 0);
        cinfer_tensor *tk = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
        cinfer_tensor *tv = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
        cinfer_tensor *kc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
        cinfer_tensor *vc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
        uint8_t *got[2][4];
        size_t nb[4] = {tbytes(tq), tbytes(tk), tbytes(kc), tbytes(vc)};
        for (int fused = 0; fused < 2; fused++) {
            put(be, tq, q);
            put(be, tk, k);
            put(be, tv, v);
            CHECK_OK(cinfer_backend_fill_zero(be, kc));
            CHECK_OK(cinfer_backend_fill_zero(be, vc));
            if (fused) {
                CHECK_OK(cinfer_backend_rope_kv_store(be, tq, n_heads, tk,
                                                      n_kv, tv, hd, rot, &p,
                                                      kc, vc));
            } else {
                CHECK_OK(cinfer_backend_rope_ext(be, tq, n_heads, hd, rot, &p));
                CHECK_OK(cinfer_backend_rope_ext(be, tk, n_kv, hd, rot, &p));
                CHECK_OK(cinfer_backend_kv_store(be, tk, tv, kc, vc));
            }
            const cinfer_tensor *ts[4] = {tq, tk, kc, vc};
            for (int t = 0; t < 4; t++) {
                got[fused][t] = malloc(nb[t]);
                get(be, ts[t], got[fused][t]);
            }
        }
        static const char *names[4] = {"q", "k", "k_cache", "v_cache"};
        for (int t = 0; t < 4; t++) {
            int eq = memcmp(got[0][t], got[1][t], nb[t]) == 0;
            if (!eq)
                fprintf(stderr, "%s: rope_kv_store %s hd%d rot%d %s: %s "
                        "differs from the three ops'\n",
                        c->name, mode == CINFER_ROPE_NEOX ? "neox" : "norm",
                        hd, rot, cinfer_dtype_name(dt), names[t]);
            CHECK(eq);
            free(got[0][t]);
            free(got[1][t]);
        }
        /* q, k, v must be three tensors */
        CHECK_EQ_INT(cinfer_backend_rope_kv_store(be, tk, n_kv, tk, n_kv, tv,
                                                  hd, rot, &p, kc, vc),
                     CINFER_E_INVALID_ARG);
        CHECK(strstr(cinfer_last_error(), "rope_kv_store") != NULL);
        cinfer_backend_tensor_destroy(be, tq);
        cinfer_backend_tensor_destroy(be, tk);
        cinfer_backend_tensor_destroy(be, tv);
        cinfer_backend_tensor_destroy(be, kc);
        cinfer_backend_tensor_destroy(be, vc);
        cinfer_backend_destroy(be);
    }
    free(q);
    free(k);
    free(v);
    free(sb);
}

/* The tensor-core building blocks (kernels/cuda/mma.cuh) on each CUDA
 * factory, against a scalar reference of the PTX ISA's m16n8k32 .s8 and
 * ldmatrix x4 semantics: under the harness that checks the emulation's
 * fragment layouts, on a device the instructions themselves (and so that
 * the two agree). */
static void test_mma_fragments(void)
{
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
    uint64_t seed = seed_for(909);
    int8_t a[16 * 32], b[8 * 32];
    int32_t c[16 * 8], d[2 * 16 * 8], perm[8];
    uint16_t m[4 * 8 * 8];
    uint32_t r[2 * 32 * 4];
    for (int i = 0; i < 16 * 32; i++)
        a[i] = (int8_t)(rand_below(&seed, 256) - 128);
    for (int i = 0; i < 8 * 32; i++)
        b[i] = (int8_t)(rand_below(&seed, 256) - 128);
    a[0] = b[0] = -128; /* the extremes multiply exactly */
    a[1] = b[1] = 127;
    for (int i = 0; i < 16 * 8; i++)
        c[i] = (int32_t)rand_below(&seed, 2000001) - 1000000;
    for (int i = 0; i < 4 * 8 * 8; i++)
        m[i] = (uint16_t)rand_below(&seed, 65536);
    for (int i = 0; i < 8; i++)
        perm[i] = i;
    for (int i = 7; i > 0; i--) {
        int j = (int)rand_below(&seed, (uint64_t)i + 1), t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        if (f->kind != KIND_CUDA)
            continue;
        cinfer_backend *be = make_backend(f); /* selects the device */
        void *da, *db, *dc, *dd, *dm, *dp, *dr;
        CHECK_EQ_INT(cudaMalloc(&da, sizeof a), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&db, sizeof b), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dc, sizeof c), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dd, sizeof d), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dm, sizeof m), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dp, sizeof perm), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dr, sizeof r), cudaSuccess);
        cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
        cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
        cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
        cudaMemcpy(dm, m, sizeof m, cudaMemcpyHostToDevice);
        cudaMemcpy(dp, perm, sizeof perm, cudaMemcpyHostToDevice);
        CHECK_OK(cinfer_cuda_mma_check(0, da, db, dc, dd, dm, dp, dr));
        memset(d, 0, sizeof d);
        memset(r, 0, sizeof r);
        cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
        cudaMemcpy(r, dr, sizeof r, cudaMemcpyDeviceToHost);
        /* [0]: the instruction (the harness's exchange); [1]: shuffles */
        for (int form = 0; form < 2; form++) {
            int bad_d = 0, bad_r = 0;
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 8; j++) {
                    int64_t want = c[i * 8 + j];
                    for (int k = 0; k < 32; k++)
                        want += (int64_t)a[i * 32 + k] * b[j * 32 + k];
                    bad_d += d[form * 128 + i * 8 + j] != (int32_t)want;
                }
            for (int l = 0; l < 32; l++)
                for (int i = 0; i < 4; i++) {
                    const uint16_t *row = m + (i * 8 + perm[l / 4]) * 8;
                    uint32_t want = (uint32_t)row[2 * (l % 4)] |
                                    (uint32_t)row[2 * (l % 4) + 1] << 16;
                    bad_r += r[form * 128 + l * 4 + i] != want;
                }
            if (bad_d || bad_r)
                fprintf(stderr, "%s (%s): mma m16n8k32 s8: %d of 128 "
                        "outputs wrong; ldmatrix x4: %d of 128 registers "
                        "wrong\n",
                        f->name, form ? "shuffles" : "instruction", bad_d,
                        bad_r);
            CHECK_EQ_INT(bad_d, 0);
            CHECK_EQ_INT(bad_r, 0);
        }
        cudaFree(da);
        cudaFree(db);
        cudaFree(dc);
        cudaFree(dd);
        cudaFree(dm);
        cudaFree(dp);
        cudaFree(dr);
        cinfer_backend_destroy(be);
    }
#endif
}

#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
static float half_val(uint16_t h, int bf16)
{
    return bf16 ? cinfer_bf16_to_fp32(h) : cinfer_fp16_to_fp32(h);
}

/* A random 16-bit float of magnitude about 2^-4 .. 2^3, either sign. */
static uint16_t rand_half(uint64_t *seed, int bf16)
{
    float v = (float)ldexp((double)(rand_below(seed, 1 << 20) + 1) /
                               (1 << 20),
                           rand_below(seed, 8) - 4);
    if (rand_below(seed, 2))
        v = -v;
    return bf16 ? cinfer_fp32_to_bf16(v) : cinfer_fp32_to_fp16(v);
}
#endif

/* The f16 / bf16 mma m16n8k16 (mma.cuh) on each CUDA factory, against a
 * float64 sum of the same products: every product is exact in f32, so
 * each output is within the rounding of 17 f32 additions of the exact
 * sum (a fragment in the wrong place is wrong by whole products). Under
 * the harness the instruction's exchange and the shuffle form add in the
 * same order and must agree bit for bit. */
static void test_mma_f_fragments(void)
{
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
    for (int bf16 = 0; bf16 < 2; bf16++) {
        uint64_t seed = seed_for(919 + (uint64_t)bf16);
        uint16_t a[16 * 16], b[8 * 16];
        float c[16 * 8], d[2 * 16 * 8];
        for (int i = 0; i < 16 * 16; i++)
            a[i] = rand_half(&seed, bf16);
        for (int i = 0; i < 8 * 16; i++)
            b[i] = rand_half(&seed, bf16);
        for (int i = 0; i < 16 * 8; i++)
            c[i] = (float)(rand_below(&seed, 2001) - 1000) / 64.0f;
        for (int fi = 0; fi < g_n_factories; fi++) {
            const factory *f = &g_factories[fi];
            if (f->kind != KIND_CUDA)
                continue;
            cinfer_backend *be = make_backend(f);
            void *da, *db, *dc, *dd;
            CHECK_EQ_INT(cudaMalloc(&da, sizeof a), cudaSuccess);
            CHECK_EQ_INT(cudaMalloc(&db, sizeof b), cudaSuccess);
            CHECK_EQ_INT(cudaMalloc(&dc, sizeof c), cudaSuccess);
            CHECK_EQ_INT(cudaMalloc(&dd, sizeof d), cudaSuccess);
            cudaMemcpy(da, a, sizeof a, cudaMemcpyHostToDevice);
            cudaMemcpy(db, b, sizeof b, cudaMemcpyHostToDevice);
            cudaMemcpy(dc, c, sizeof c, cudaMemcpyHostToDevice);
            CHECK_OK(cinfer_cuda_mma_f_check(0, bf16, da, db, dc, dd));
            memset(d, 0, sizeof d);
            cudaMemcpy(d, dd, sizeof d, cudaMemcpyDeviceToHost);
            int bad[2] = {0, 0}, differ = 0;
            for (int i = 0; i < 16; i++)
                for (int j = 0; j < 8; j++) {
                    double want = c[i * 8 + j], mag = fabs(want);
                    for (int k = 0; k < 16; k++) {
                        double p = (double)half_val(a[i * 16 + k], bf16) *
                                   half_val(b[j * 16 + k], bf16);
                        want += p;
                        mag += fabs(p);
                    }
                    const double tol = 17.0 * ldexp(mag, -24);
                    for (int form = 0; form < 2; form++)
                        bad[form] += !(fabs(d[form * 128 + i * 8 + j] - want) <=
                                       tol);
                    differ += memcmp(&d[i * 8 + j], &d[128 + i * 8 + j],
                                     sizeof(float)) != 0;
                }
            if (bad[0] || bad[1])
                fprintf(stderr, "%s: mma m16n8k16 %s: %d (instruction) and "
                        "%d (shuffles) of 128 outputs wrong\n",
                        f->name, bf16 ? "bf16" : "f16", bad[0], bad[1]);
            CHECK_EQ_INT(bad[0], 0);
            CHECK_EQ_INT(bad[1], 0);
#ifdef CINFER_TEST_CUDASIM
            CHECK_EQ_INT(differ, 0);
#else
            (void)differ;
#endif
            cudaFree(da);
            cudaFree(db);
            cudaFree(dc);
            cudaFree(dd);
            cinfer_backend_destroy(be);
        }
    }
#endif
}

/* The batch-invariant float product on tensor cores (dense.cuh's
 * cinfer_cuda_dense_mma) on each CUDA factory: against a float64 product
 * of the same 16-bit inputs, within the rounding of its f32 sums, for
 * shapes across the kernel's tiles and edges (1 to 200 rows, k a
 * multiple of 8 or not, outputs past a tile); and invariant: every row's
 * bits are those it gets alone (the small tile) and in 7 rows. */
static void test_dense_mma(void)
{
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
    static const struct {
        int n, k, n_out;
    } shapes[] = {{1, 64, 40}, {5, 72, 33}, {17, 40, 70}, {64, 20, 65},
                  {200, 96, 130}};
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        if (f->kind != KIND_CUDA)
            continue;
        cinfer_backend *be = make_backend(f);
        for (int bf16 = 0; bf16 < 2; bf16++)
            for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++) {
                const int n = shapes[si].n, k = shapes[si].k,
                          no = shapes[si].n_out;
                uint64_t seed = seed_for(931 + si * 2 + (uint64_t)bf16);
                uint16_t *w = malloc(sizeof(uint16_t) * (size_t)no * k);
                uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n * k);
                float *got = malloc(sizeof(float) * (size_t)n * no);
                float *one = malloc(sizeof(float) * 7 * (size_t)no);
                for (int i = 0; i < no * k; i++)
                    w[i] = rand_half(&seed, bf16);
                for (int i = 0; i < n * k; i++)
                    x[i] = rand_half(&seed, bf16);
                void *dw, *dx, *dout;
                CHECK_EQ_INT(cudaMalloc(&dw, sizeof(uint16_t) * (size_t)no * k),
                             cudaSuccess);
                CHECK_EQ_INT(cudaMalloc(&dx, sizeof(uint16_t) * (size_t)n * k),
                             cudaSuccess);
                CHECK_EQ_INT(cudaMalloc(&dout, sizeof(float) * (size_t)n * no),
                             cudaSuccess);
                cudaMemcpy(dw, w, sizeof(uint16_t) * (size_t)no * k,
                           cudaMemcpyHostToDevice);
                cudaMemcpy(dx, x, sizeof(uint16_t) * (size_t)n * k,
                           cudaMemcpyHostToDevice);
                const cinfer_dtype dt =
                    bf16 ? CINFER_DTYPE_BF16 : CINFER_DTYPE_F16;
                CHECK_OK(cinfer_cuda_dense_mma(0, dt, dw, no, dx, n, k, dout));
                cudaMemcpy(got, dout, sizeof(float) * (size_t)n * no,
                           cudaMemcpyDeviceToHost);
                int bad = 0;
                for (int r = 0; r < n; r++)
                    for (int o = 0; o < no; o++) {
                        double want = 0, mag = 0;
                        for (int j = 0; j < k; j++) {
                            double p = (double)half_val(x[r * k + j], bf16) *
                                       half_val(w[o * k + j], bf16);
                            want += p;
                            mag += fabs(p);
                        }
                        const double tol = (k + 17.0) * ldexp(mag, -24);
                        bad += !(fabs(got[r * no + o] - want) <= tol);
                    }
                /* rows alone (the first, the last) and 7 from the middle */
                int variant = 0;
                const int firsts[3] = {0, n - 1, n > 7 ? n / 2 - 3 : 0};
                for (int q = 0; q < 3; q++) {
                    const int r0 = firsts[q], m = q < 2 ? 1 : (n < 7 ? n : 7);
                    CHECK_OK(cinfer_cuda_dense_mma(
                        0, dt, dw, no, (const uint16_t *)dx + (size_t)r0 * k,
                        m, k, dout));
                    cudaMemcpy(one, dout, sizeof(float) * (size_t)m * no,
                               cudaMemcpyDeviceToHost);
                    variant += memcmp(one, got + (size_t)r0 * no,
                                      sizeof(float) * (size_t)m * no) != 0;
                }
                if (bad || variant)
                    fprintf(stderr, "%s: dense_mma %s n %d k %d n_out %d: %d "
                            "outputs wrong, %d of 3 sub-batches differ\n",
                            f->name, bf16 ? "bf16" : "f16", n, k, no, bad,
                            variant);
                CHECK_EQ_INT(bad, 0);
                CHECK_EQ_INT(variant, 0);
                cudaFree(dw);
                cudaFree(dx);
                cudaFree(dout);
                free(w);
                free(x);
                free(got);
                free(one);
            }
        cinfer_backend_destroy(be);
    }
#endif
}

/* The tiled quantized product's two kernels (kernels/cuda/mmq.cuh) on
 * each CUDA factory: dp4a and int8 mma give the same bits for every
 * output, and a row's bits are those of the matrix-vector kernel
 * (mmvq.cuh) for the same row. The shapes reach the walk's edges: fewer
 * blocks than slots (nb 1, 8), a count of blocks no multiple of 32 (33,
 * 70), weight rows short of a tile (17, 80, 130, 200 against 64), rows
 * short of one (9, 33, 70, 100 against 32), and sets of 2 and 3 weights. */
static void test_mmq_kernels(void)
{
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
    static const struct {
        int32_t n;
        int64_t k;
        int n_w;
        int64_t n_out[3];
    } shapes[] = {
        {9, 32, 1, {16}},
        {33, 256, 1, {80}},
        {70, 1056, 3, {64, 17, 130}},
        {32, 2240, 1, {200}},
        {100, 2048, 2, {64, 64}},
    };
    static const cinfer_dtype types[] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0,
                                         CINFER_DTYPE_Q4_1};
    uint64_t seed = seed_for(911);
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        if (f->kind != KIND_CUDA)
            continue;
        cinfer_backend *be = make_backend(f); /* selects the device */
        for (size_t si = 0; si < sizeof shapes / sizeof shapes[0]; si++)
            for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
                const cinfer_dtype dt = types[ti];
                const int32_t n = shapes[si].n;
                const int64_t k = shapes[si].k;
                const int n_w = shapes[si].n_w;
                float *x = malloc(sizeof(float) * (size_t)(n * k));
                for (int64_t i = 0; i < n * k; i++)
                    x[i] = (float)((int)(harness_rand(&seed) % 2001) - 1000) /
                           1000.0f;
                void *dx, *dxq, *dw[3];
                float *dout[2][3], *dvec;
                CHECK_EQ_INT(cudaMalloc(&dx, sizeof(float) * (size_t)(n * k)),
                             cudaSuccess);
                CHECK_EQ_INT(cudaMalloc(&dxq, cinfer_cuda_q8_1_bytes(n, k)),
                             cudaSuccess);
                cudaMemcpy(dx, x, sizeof(float) * (size_t)(n * k),
                           cudaMemcpyHostToDevice);
                CHECK_OK(cinfer_cuda_quantize_q8_1(0, dx, dxq, n, k));
                for (int i = 0; i < n_w; i++) {
                    const int64_t no = shapes[si].n_out[i];
                    const size_t rb = cinfer_dtype_row_bytes(dt, k);
                    uint8_t *wq = malloc(rb * (size_t)no);
                    float *row = malloc(sizeof(float) * (size_t)k);
                    for (int64_t o = 0; o < no; o++) {
                        for (int64_t e = 0; e < k; e++)
                            row[e] = (float)((int)(harness_rand(&seed) % 2001) -
                                             1000) /
                                     1000.0f;
                        cinfer_quantize_row(dt, row, wq + rb * (size_t)o, k);
                    }
                    CHECK_EQ_INT(cudaMalloc(&dw[i], rb * (size_t)no),
                                 cudaSuccess);
                    cudaMemcpy(dw[i], wq, rb * (size_t)no,
                               cudaMemcpyHostToDevice);
                    for (int kind = 0; kind < 2; kind++)
                        CHECK_EQ_INT(cudaMalloc((void **)&dout[kind][i],
                                                sizeof(float) *
                                                    (size_t)(n * no)),
                                     cudaSuccess);
                    free(row);
                    free(wq);
                }
                const void *cw[3] = {dw[0], dw[1], dw[2]};
                CHECK_OK(cinfer_cuda_mmq_set_kernel(
                    0, CINFER_CUDA_MMQ_DP4A, dt, n_w, cw, shapes[si].n_out,
                    dxq, n, k, dout[0]));
                CHECK_OK(cinfer_cuda_mmq_set_kernel(
                    0, CINFER_CUDA_MMQ_MMA, dt, n_w, cw, shapes[si].n_out,
                    dxq, n, k, dout[1]));
                /* the first row alone through the matrix-vector kernel */
                const int64_t no0 = shapes[si].n_out[0];
                CHECK_EQ_INT(cudaMalloc((void **)&dvec,
                                        sizeof(float) * (size_t)no0),
                             cudaSuccess);
                CHECK_OK(cinfer_cuda_mmvq(0, dt, dw[0], no0, dxq, 1, k, dvec));
                CHECK_EQ_INT(cudaDeviceSynchronize(), cudaSuccess);
                for (int i = 0; i < n_w; i++) {
                    const int64_t no = shapes[si].n_out[i];
                    uint32_t *a = malloc(sizeof(uint32_t) * (size_t)(n * no));
                    uint32_t *m = malloc(sizeof(uint32_t) * (size_t)(n * no));
                    cudaMemcpy(a, dout[0][i], sizeof(float) * (size_t)(n * no),
                               cudaMemcpyDeviceToHost);
                    cudaMemcpy(m, dout[1][i], sizeof(float) * (size_t)(n * no),
                               cudaMemcpyDeviceToHost);
                    int64_t bad = 0, first = -1;
                    for (int64_t e = 0; e < n * no; e++)
                        if (a[e] != m[e]) {
                            bad++;
                            if (first < 0)
                                first = e;
                        }
                    if (i == 0) {
                        uint32_t *v = malloc(sizeof(uint32_t) * (size_t)no);
                        cudaMemcpy(v, dvec, sizeof(float) * (size_t)no,
                                   cudaMemcpyDeviceToHost);
                        for (int64_t o = 0; o < no; o++)
                            if (v[o] != m[o]) {
                                bad++;
                                if (first < 0)
                                    first = o;
                            }
                        free(v);
                    }
                    if (bad)
                        fprintf(stderr, "%s: mmq %s n %d k %lld weight %d of "
                                "%d (n_out %lld): %lld outputs differ between "
                                "dp4a, mma and mmvq, the first at %lld\n",
                                f->name, cinfer_dtype_name(dt), (int)n,
                                (long long)k, i, n_w, (long long)no,
                                (long long)bad, (long long)first);
                    CHECK_EQ_INT(bad, 0);
                    free(a);
                    free(m);
                    cudaFree(dw[i]);
                    cudaFree(dout[0][i]);
                    cudaFree(dout[1][i]);
                }
                cudaFree(dvec);
                cudaFree(dx);
                cudaFree(dxq);
                free(x);
            }
        cinfer_backend_destroy(be);
    }
#endif
}

static void test_rope_kv_store(void)
{
    rope_kv_case(CINFER_ROPE_NORM, 4, 2, 64, 64, 1);
    rope_kv_case(CINFER_ROPE_NEOX, 6, 2, 40, 24, 0);
    rope_kv_case(CINFER_ROPE_NEOX, 3, 3, 128, 128, 1);
    rope_kv_case(CINFER_ROPE_NORM, 1, 1, 20, 20, 0);
}

/* ---------------------------------------------------------------------- */
/* matmul                                                                  */
/* ---------------------------------------------------------------------- */

/* One weight of a matmul case, quantized from random values. */
typedef struct {
    cinfer_dtype dt;
    int64_t n_out;
    uint8_t *bytes;
} mm_weight;

/* float64 reference of x[n, n_in] * w^T: the dequantized weights times the
 * activations in the format paired with the weight type, as the kernels
 * see them (Q8_1 for Q4_1, Q8_0 for Q8_0 / Q4_0 on the CPU; the CUDA
 * backend's Q8_1 has the same values; F16 / BF16 activations rounded to
 * the weight's type). *mag_out: the largest sum of |terms| of an output. */
static double *ref_matmul(const mm_weight *w, const float *x, int n,
                          int64_t n_in, double *mag_out)
{
    const cinfer_dtype wt = w->dt;
    cinfer_dtype at = wt == CINFER_DTYPE_Q4_1   ? CINFER_DTYPE_Q8_1
                      : wt == CINFER_DTYPE_Q8_0 ? CINFER_DTYPE_Q8_0
                      : wt == CINFER_DTYPE_Q4_0 ? CINFER_DTYPE_Q8_0
                                                : wt;
    size_t arb = cinfer_dtype_row_bytes(at, n_in);
    size_t wrb = cinfer_dtype_row_bytes(wt, n_in);
    uint8_t *arow = malloc(arb * (size_t)n);
    float *xa = malloc(sizeof(float) * (size_t)(n * n_in));
    double *wd = malloc(sizeof(double) * (size_t)(w->n_out * n_in));
    double *mterm = malloc(sizeof(double) * (size_t)(w->n_out * (n_in / 32 + 1)));
    CINFER_ASSERT(arow && xa && wd && mterm);
    for (int r = 0; r < n; r++) {
        cinfer_quantize_row(at, x + r * n_in, arow + r * arb, n_in);
        cinfer_dequantize_row(at, arow + r * arb, xa + r * n_in, n_in);
    }
    for (int64_t o = 0; o < w->n_out; o++) {
        const uint8_t *wrow = w->bytes + o * wrb;
        for (int64_t k = 0; k < n_in; k++) {
            double wk = ref_elem(wt, wrow, k);
            if (wt == CINFER_DTYPE_Q4_1) {
                /* x = d q + m: the m part pairs with the activation
                 * block's stored sum s (fp16) */
                uint16_t mh;
                memcpy(&mh, wrow + (k / 32) * 20 + 2, 2);
                wk -= cinfer_fp16_to_fp32(mh);
            }
            wd[o * n_in + k] = wk;
        }
        if (wt == CINFER_DTYPE_Q4_1)
            for (int64_t b = 0; b < n_in / 32; b++) {
                uint16_t mh;
                memcpy(&mh, wrow + b * 20 + 2, 2);
                mterm[o * (n_in / 32) + b] = cinfer_fp16_to_fp32(mh);
            }
    }
    double *want = malloc(sizeof(double) * (size_t)(n * w->n_out));
    double mag = 0;
    for (int r = 0; r < n; r++)
        for (int64_t o = 0; o < w->n_out; o++) {
            const double *wo = wd + o * n_in;
            const float *xr = xa + r * n_in;
            double s = 0, m = 0;
            for (int64_t k = 0; k < n_in; k++) {
                double t = wo[k] * xr[k];
                s += t;
                m += fabs(t);
            }
            if (wt == CINFER_DTYPE_Q4_1) {
                for (int64_t b = 0; b < n_in / 32; b++) {
                    const cinfer_block_q8_1 *ab =
                        (const cinfer_block_q8_1 *)(arow + r * arb) + b;
                    double t = mterm[o * (n_in / 32) + b] *
                               cinfer_fp16_to_fp32(ab->s);
                    s += t;
                    m += fabs(t);
                }
            }
            want[r * w->n_out + o] = s;
            mag = m > mag ? m : mag;
        }
    free(mterm);
    free(wd);
    free(xa);
    free(arow);
    *mag_out = mag;
    return want;
}

/* One call of n_w weights (same n_in) on n rows; with solo, each weight
 * alone as well, which must give the same bits. */
static void matmul_case(int n, int64_t n_in, int n_w, const cinfer_dtype *dts,
                        const int64_t *n_outs, int solo, uint64_t salt)
{
    uint64_t seed = seed_for(salt);
    float *x = randv(n * n_in, &seed, 2.0f);
    mm_weight w[4];
    double *want[4], mag[4];
    for (int i = 0; i < n_w; i++) {
        w[i].dt = dts[i];
        w[i].n_out = n_outs[i];
        float *src = randv(n_outs[i] * n_in, &seed, 0.5f);
        size_t rb = cinfer_dtype_row_bytes(dts[i], n_in);
        w[i].bytes = malloc(rb * (size_t)n_outs[i]);
        for (int64_t o = 0; o < n_outs[i]; o++)
            cinfer_quantize_row(dts[i], src + o * n_in, w[i].bytes + o * rb, n_in);
        free(src);
        want[i] = ref_matmul(&w[i], x, n, n_in, &mag[i]);
    }
    cpu_keep k = {{0}};
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, n_in, 0, 0);
        put(be, tx, x);
        const cinfer_tensor *tw[4];
        cinfer_tensor *to[4];
        for (int i = 0; i < n_w; i++) {
            tw[i] = wnew(be, dts[i], 2, n_outs[i], n_in, w[i].bytes);
            to[i] = tnew(be, CINFER_DTYPE_F32, 2, n, n_outs[i], 0, 0);
            poison(be, to[i]);
        }
        CHECK_OK(cinfer_backend_matmul(be, n_w, tw, tx, to));
        for (int i = 0; i < n_w; i++) {
            int64_t ne = n * n_outs[i];
            float *got = malloc(sizeof(float) * (size_t)ne);
            get(be, to[i], got);
            char what[80];
            snprintf(what, sizeof what, "matmul %s n%d n_in%lld n_out%lld (w%d of %d)",
                     cinfer_dtype_name(dts[i]), n, (long long)n_in,
                     (long long)n_outs[i], i, n_w);
            check_out(what, c, got, want[i], keep(&k, ci, i, got, ne), ne,
                      mag[i] * 1e-6, NMSE_MATMUL);
            if (solo) {
                /* one weight at a time gives the same bits */
                const cinfer_tensor *w1[1] = {tw[i]};
                cinfer_tensor *o1[1] = {tnew(be, CINFER_DTYPE_F32, 2, n,
                                             n_outs[i], 0, 0)};
                poison(be, o1[0]);
                CHECK_OK(cinfer_backend_matmul(be, 1, w1, tx, o1));
                float *alone = malloc(sizeof(float) * (size_t)ne);
                get(be, o1[0], alone);
                if (memcmp(alone, got, sizeof(float) * (size_t)ne) != 0)
                    fprintf(stderr, "%s [%s]: alone differs from together\n",
                            what, c->name);
                CHECK(memcmp(alone, got, sizeof(float) * (size_t)ne) == 0);
                free(alone);
                cinfer_backend_tensor_destroy(be, o1[0]);
            }
            free(got);
        }
        for (int i = 0; i < n_w; i++) {
            cinfer_backend_tensor_destroy(be, (cinfer_tensor *)tw[i]);
            cinfer_backend_tensor_destroy(be, to[i]);
        }
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_destroy(be);
    }
    keep_free(&k);
    for (int i = 0; i < n_w; i++) {
        free(w[i].bytes);
        free(want[i]);
    }
    free(x);
}

/* matmul_silu_mul against matmul of the two weights then silu_mul, on
 * the same backend: the same bits in gate (CUDA takes one launch for n <=
 * 8 rows of a quantized type). */
static void glu_case(cinfer_dtype dt, int n, int64_t n_in, int64_t n_ff,
                     uint64_t salt)
{
    uint64_t seed = seed_for(salt);
    float *x = randv(n * n_in, &seed, 2.0f);
    size_t rb = cinfer_dtype_row_bytes(dt, n_in);
    uint8_t *wb[2];
    for (int i = 0; i < 2; i++) {
        float *src = randv(n_ff * n_in, &seed, 0.5f);
        wb[i] = malloc(rb * (size_t)n_ff);
        for (int64_t o = 0; o < n_ff; o++)
            cinfer_quantize_row(dt, src + o * n_in, wb[i] + o * rb, n_in);
        free(src);
    }
    const int64_t ne = n * n_ff;
    float *want = malloc(sizeof(float) * (size_t)ne);
    float *got = malloc(sizeof(float) * (size_t)ne);
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, n_in, 0, 0);
        put(be, tx, x);
        const cinfer_tensor *tw[2];
        cinfer_tensor *to[2];
        for (int i = 0; i < 2; i++) {
            tw[i] = wnew(be, dt, 2, n_ff, n_in, wb[i]);
            to[i] = tnew(be, CINFER_DTYPE_F32, 2, n, n_ff, 0, 0);
        }
        CHECK_OK(cinfer_backend_matmul(be, 2, tw, tx, to));
        CHECK_OK(cinfer_backend_silu_mul(be, to[0], to[1], to[0]));
        get(be, to[0], want);
        poison(be, to[0]);
        poison(be, to[1]);
        CHECK_OK(cinfer_backend_matmul_silu_mul(be, tw[0], tw[1], tx, to[0],
                                                to[1]));
        get(be, to[0], got);
        int eq = memcmp(got, want, sizeof(float) * (size_t)ne) == 0;
        if (!eq)
            fprintf(stderr, "%s: matmul_silu_mul %s n%d n_in%lld n_ff%lld "
                    "differs from matmul then silu_mul\n",
                    c->name, cinfer_dtype_name(dt), n, (long long)n_in,
                    (long long)n_ff);
        CHECK(eq);
        /* gate and up of different shapes are refused */
        cinfer_tensor *t1 = tnew(be, CINFER_DTYPE_F32, 2, n, 1, 0, 0);
        const cinfer_tensor *w1 = wnew(be, dt, 2, 1, n_in, wb[0]);
        CHECK_EQ_INT(cinfer_backend_matmul_silu_mul(be, tw[0], w1, tx, to[0],
                                                    t1),
                     CINFER_E_INVALID_ARG);
        CHECK(strstr(cinfer_last_error(), "matmul_silu_mul") != NULL);
        cinfer_backend_tensor_destroy(be, (cinfer_tensor *)w1);
        cinfer_backend_tensor_destroy(be, t1);
        for (int i = 0; i < 2; i++) {
            cinfer_backend_tensor_destroy(be, (cinfer_tensor *)tw[i]);
            cinfer_backend_tensor_destroy(be, to[i]);
        }
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_destroy(be);
    }
    free(want);
    free(got);
    free(wb[0]);
    free(wb[1]);
    free(x);
}

static void test_matmul_silu_mul(void)
{
    static const cinfer_dtype q[3] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0,
                                      CINFER_DTYPE_Q4_1};
    static const int ns[4] = {1, 5, 8, 9};
    uint64_t salt = 4000;
    for (int t = 0; t < 3; t++)
        for (int i = 0; i < 4; i++)
            glu_case(q[t], ns[i], 800, 97, salt++);
    glu_case(CINFER_DTYPE_F16, 3, 96, 40, salt++); /* the two ops */
}

static void test_matmul(void)
{
    static const cinfer_dtype wts[] = {CINFER_DTYPE_F32,  CINFER_DTYPE_F16,
                                       CINFER_DTYPE_BF16, CINFER_DTYPE_Q8_0,
                                       CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1};
    /* decode rows (the CUDA matrix-vector kernels take n <= 8) and tiles */
    static const int ns[] = {1, 7, 8, 9, 64};
    uint64_t salt = 1000;
    for (int ti = 0; ti < 6; ti++) {
        cinfer_dtype dt[4] = {wts[ti], wts[ti], wts[ti], wts[ti]};
        int quant = cinfer_dtype_block_elems(wts[ti]) > 1;
        for (int ni = 0; ni < 5; ni++) {
            if (quant) {
                /* n_in whole blocks: the awkward widths are the outputs;
                 * 96 is not a multiple of a 64- or 128-wide K tile */
                const int64_t wide[2] = {769, 5125}, deep[2] = {33, 1};
                matmul_case(ns[ni], 96, 2, dt, wide, 0, salt++);
                matmul_case(ns[ni], 800, 2, dt, deep, 0, salt++);
            } else {
                const int64_t a[2] = {769, 7}, b[1] = {37};
                matmul_case(ns[ni], 769, 2, dt, a, 0, salt++);
                matmul_case(ns[ni], 5125, 1, dt, b, 0, salt++);
            }
        }
    }
    /* Calls mixing weight types (activation formats) share one input;
     * each weight alone gives the same bits. */
    const cinfer_dtype mix_a[4] = {CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q8_0,
                                   CINFER_DTYPE_F32, CINFER_DTYPE_F16};
    const int64_t out_a[4] = {50, 33, 17, 1};
    const cinfer_dtype mix_b[2] = {CINFER_DTYPE_BF16, CINFER_DTYPE_Q4_0};
    const int64_t out_b[2] = {96, 130};
    for (int ni = 1; ni < 5; ni += 3) { /* n = 7, 64 */
        matmul_case(ns[ni], 800, 4, mix_a, out_a, 1, salt++);
        matmul_case(ns[ni], 800, 2, mix_b, out_b, 1, salt++);
    }
    /* Runs of one quantized type (Q, K, V; gate and up) go to the CUDA
     * matrix-vector or tiled kernel in one launch: each weight gives the
     * bits it gives alone, whatever its place in the run. */
    const cinfer_dtype run4[4] = {CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_1,
                                  CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_1};
    const cinfer_dtype run3[3] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q8_0,
                                  CINFER_DTYPE_Q8_0};
    const cinfer_dtype split[4] = {CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_0,
                                   CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q4_0};
    const int64_t out_q[3] = {96, 32, 32};
    for (int ni = 0; ni < 5; ni += 2) { /* n = 1, 8, 64 */
        matmul_case(ns[ni], 800, 4, run4, out_a, 1, salt++);
        matmul_case(ns[ni], 96, 3, run3, out_q, 1, salt++);
        matmul_case(ns[ni], 800, 4, split, out_a, 1, salt++);
    }
    /* Batches of the int8-block types take the CPU's register-tiled
     * kernels: a row count and output widths off every tile, split over 1
     * and 3 threads, give the same bits on every CPU backend. */
    for (int ti = 3; ti < 6; ti++) {
        const cinfer_dtype dt[2] = {wts[ti], wts[ti]};
        const int64_t outs[2] = {197, 37};
        matmul_case(203, 800, 2, dt, outs, 1, salt++);
    }
}

/* ---------------------------------------------------------------------- */
/* attention                                                               */
/* ---------------------------------------------------------------------- */

typedef enum {
    LAYOUT_MIXED, /* 3 seqs: a prefill from 0 interleaved with 2 decodes */
    LAYOUT_ONE,   /* 1 seq: a 37-row prefill chunk at context ~570 */
    LAYOUT_MANY,  /* 257 seqs: decode rows and 3-row chunks interleaved;
                     seq 0 decodes at context 601 */
} attn_layout;

typedef struct {
    int n_heads, n_kv, hd, bs;
    cinfer_dtype kdt, vdt;
    float scale;
    attn_layout layout;
    int window; /* sliding window (attention_window); 0 = whole context */
} attn_case;

/* The inputs of one case, the same for every factory. */
typedef struct {
    int n_seqs, n_blocks, max_ctx;
    int hist[MAX_SEQS];     /* positions already in the cache */
    int64_t seq_off[MAX_SEQS + 1]; /* first (seq, pos) of a seq in kh / vh */
    step_buf *hb, *sb;      /* the history step, the attention step */
    float *kh, *vh, *q;     /* K/V per (seq, pos); q per row */
} attn_inputs;

/* The cache value a float becomes. */
static float as_stored(cinfer_dtype dt, float f)
{
    return dt == CINFER_DTYPE_F16 ? cinfer_fp16_to_fp32(cinfer_fp32_to_fp16(f))
                                  : f;
}

static void attn_inputs_make(attn_inputs *in, const attn_case *ac,
                             uint64_t *seed)
{
    const int bs = ac->bs;
    const int64_t kvw = (int64_t)ac->n_kv * ac->hd;
    memset(in, 0, sizeof *in);
    in->hb = step_new();
    in->sb = step_new();
    /* rows of the attention step per seq: (first position, count) */
    static int first[MAX_SEQS], count[MAX_SEQS];
    switch (ac->layout) {
    case LAYOUT_MIXED:
        in->n_seqs = 3;
        /* seq 0 spans many blocks, seq 1 starts empty */
        in->hist[0] = 9 * bs + 3;
        in->hist[1] = 0;
        in->hist[2] = 2 * bs + 1;
        count[0] = 1;
        count[1] = 6;
        count[2] = 2;
        break;
    case LAYOUT_ONE:
        in->n_seqs = 1;
        in->hist[0] = 530 + rand_below(seed, 3 * bs) + (bs > 1 ? 1 : 0);
        if (in->hist[0] % bs == 0)
            in->hist[0]++;
        count[0] = 37;
        break;
    case LAYOUT_MANY:
        in->n_seqs = 257;
        for (int s = 0; s < 257; s++) {
            int chunk = s % 16 == 5;
            in->hist[s] = rand_below(seed, 3 * bs + 2);
            count[s] = chunk ? 3 : 1;
        }
        in->hist[0] = 600;
        count[0] = 1;
        break;
    }
    /* A shuffled pool of blocks, a few more than the sequences need. */
    int need = 0;
    for (int s = 0; s < in->n_seqs; s++) {
        first[s] = in->hist[s];
        int len = in->hist[s] + count[s];
        in->max_ctx = len > in->max_ctx ? len : in->max_ctx;
        CINFER_ASSERT((len + bs - 1) / bs <= MAX_BLOCKS);
        need += (len + bs - 1) / bs;
        in->seq_off[s + 1] = in->seq_off[s] + len;
    }
    in->n_blocks = need + 5;
    int *pool = malloc(sizeof(int) * (size_t)in->n_blocks);
    for (int b = 0; b < in->n_blocks; b++)
        pool[b] = b;
    for (int b = in->n_blocks - 1; b > 0; b--) {
        int j = rand_below(seed, b + 1), t = pool[b];
        pool[b] = pool[j];
        pool[j] = t;
    }
    step_init(in->hb, in->n_seqs, bs);
    int next = 0;
    for (int s = 0; s < in->n_seqs; s++) {
        int len = in->hist[s] + count[s];
        for (int b = 0; b < (len + bs - 1) / bs; b++)
            in->hb->tables[s * MAX_BLOCKS + b] = pool[next++];
    }
    free(pool);
    /* The attention step's rows (attention_run stores the history first,
     * in steps of up to MAX_ROWS rows). */
    step_init(in->sb, in->n_seqs, bs);
    memcpy(in->sb->tables, in->hb->tables, sizeof in->sb->tables);
    in->sb->s.row_gen = in->sb->gen;
    if (ac->layout == LAYOUT_MIXED) {
        /* prefill rows of seq 1 interleaved with decode rows of 0 and 2;
         * every other row takes the single-token ("dot") arithmetic */
        static const int order[9][2] = {{1, 0}, {0, 0}, {1, 1}, {2, 0}, {1, 2},
                                        {1, 3}, {2, 1}, {1, 4}, {1, 5}};
        for (int i = 0; i < 9; i++) {
            int s = order[i][0];
            step_row(in->sb, s, in->hist[s] + order[i][1], 0);
            in->sb->gen[i] = (uint8_t)(i & 1);
        }
    } else {
        /* The sequences in a shuffled order, each its rows in a run (a
         * prefill chunk is consecutive rows); decode rows are generated
         * tokens', chunk rows given ones'. */
        int *ord = malloc(sizeof(int) * (size_t)in->n_seqs);
        for (int s = 0; s < in->n_seqs; s++)
            ord[s] = s;
        for (int s = in->n_seqs - 1; s > 0; s--) {
            int j = rand_below(seed, s + 1), t = ord[s];
            ord[s] = ord[j];
            ord[j] = t;
        }
        for (int i = 0; i < in->n_seqs; i++) {
            int s = ord[i];
            for (int j = 0; j < count[s]; j++) {
                int r = in->sb->s.n_rows;
                step_row(in->sb, s, first[s] + j, 0);
                in->sb->gen[r] = (uint8_t)(count[s] == 1);
            }
        }
        free(ord);
    }
    const int64_t n_pos = in->seq_off[in->n_seqs];
    in->kh = randv(n_pos * kvw, seed, 1.0f);
    in->vh = randv(n_pos * kvw, seed, 1.0f);
    in->q = randv(in->sb->s.n_rows * (int64_t)ac->n_heads * ac->hd, seed, 1.0f);
}

static void attn_inputs_free(attn_inputs *in)
{
    free(in->hb);
    free(in->sb);
    free(in->kh);
    free(in->vh);
    free(in->q);
}

/* Sets step b and stores its rows' K/V (from the host arrays). */
static void attn_store(cinfer_backend *be, const attn_inputs *in,
                       const step_buf *b, int64_t kvw, cinfer_tensor *kc,
                       cinfer_tensor *vc)
{
    int n = b->s.n_rows;
    float *k = malloc(sizeof(float) * (size_t)(n * kvw));
    float *v = malloc(sizeof(float) * (size_t)(n * kvw));
    for (int r = 0; r < n; r++) {
        int64_t src = (in->seq_off[b->row_seq[r]] + b->positions[r]) * kvw;
        memcpy(k + r * kvw, in->kh + src, sizeof(float) * (size_t)kvw);
        memcpy(v + r * kvw, in->vh + src, sizeof(float) * (size_t)kvw);
    }
    CHECK_OK(cinfer_backend_set_step(be, &b->s));
    cinfer_tensor *tk = tnew(be, CINFER_DTYPE_F32, 2, n, kvw, 0, 0);
    cinfer_tensor *tv = tnew(be, CINFER_DTYPE_F32, 2, n, kvw, 0, 0);
    put(be, tk, k);
    put(be, tv, v);
    CHECK_OK(cinfer_backend_kv_store(be, tk, tv, kc, vc));
    cinfer_backend_tensor_destroy(be, tk);
    cinfer_backend_tensor_destroy(be, tv);
    free(k);
    free(v);
}

/* float64 reference over the values as the cache stores them. */
static double *attn_reference(const attn_case *ac, const attn_inputs *in)
{
    const int n_heads = ac->n_heads, n_kv = ac->n_kv, hd = ac->hd;
    const int64_t kvw = (int64_t)n_kv * hd, qw = (int64_t)n_heads * hd;
    const step_buf *sb = in->sb;
    const int n = sb->s.n_rows;
    double *want = malloc(sizeof(double) * (size_t)(n * qw));
    double *sc = malloc(sizeof(double) * (size_t)in->max_ctx);
    for (int r = 0; r < n; r++) {
        int s = sb->row_seq[r], len = sb->positions[r] + 1;
        /* a window hides keys at p1 - p0 >= window */
        int lo = ac->window && len > ac->window ? len - ac->window : 0;
        const float *ks = in->kh + in->seq_off[s] * kvw;
        const float *vs = in->vh + in->seq_off[s] * kvw;
        for (int h = 0; h < n_heads; h++) {
            int g = h / (n_heads / n_kv);
            const float *qh = in->q + r * qw + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < lo; p++)
                sc[p] = -INFINITY;
            for (int p = lo; p < len; p++) {
                const float *kp = ks + p * kvw + g * hd;
                double d = 0;
                /* q meets an F16 cache rounded to F16, as in GGML */
                for (int i = 0; i < hd; i++)
                    d += (double)as_stored(ac->kdt, qh[i]) *
                         as_stored(ac->kdt, kp[i]);
                sc[p] = d * ac->scale;
                mx = sc[p] > mx ? sc[p] : mx;
            }
            for (int p = 0; p < len; p++) {
                sc[p] = exp(sc[p] - mx);
                sum += sc[p];
            }
            /* normalised probabilities, rounded to F16 against an F16 V */
            for (int p = 0; p < len; p++)
                sc[p] = as_stored(ac->vdt, (float)(sc[p] / sum));
            double *o = want + r * qw + h * hd;
            for (int i = 0; i < hd; i++) {
                double a = 0;
                for (int p = 0; p < len; p++)
                    a += sc[p] * as_stored(ac->vdt, vs[p * kvw + g * hd + i]);
                o[i] = a;
            }
        }
    }
    free(sc);
    return want;
}

/* Runs the case on one backend: the history, then the step; returns the
 * attention output (caller frees). */
static float *attention_run(const factory *c, const attn_case *ac,
                            const attn_inputs *in)
{
    const int n_heads = ac->n_heads, n_kv = ac->n_kv, hd = ac->hd;
    const int64_t kvw = (int64_t)n_kv * hd, qw = (int64_t)n_heads * hd;
    cinfer_backend *be = make_backend(c);
    cinfer_tensor *kc = tnew(be, ac->kdt, 4, in->n_blocks, ac->bs, n_kv, hd);
    cinfer_tensor *vc = tnew(be, ac->vdt, 4, in->n_blocks, ac->bs, n_kv, hd);
    /* Slots nothing writes stay NaN: a read past a row's context fails. */
    poison(be, kc);
    poison(be, vc);

    /* Step 1: the history rows go into the cache, MAX_ROWS at a time. */
    step_buf *hb = step_new();
    memcpy(hb, in->hb, sizeof *hb);
    step_rebase(hb);
    hb->s.n_rows = 0;
    for (int s = 0; s < in->n_seqs; s++)
        for (int p = 0; p < in->hist[s]; p++) {
            if (hb->s.n_rows == MAX_ROWS) {
                attn_store(be, in, hb, kvw, kc, vc);
                hb->s.n_rows = 0;
            }
            step_row(hb, s, p, 0);
        }
    if (hb->s.n_rows > 0)
        attn_store(be, in, hb, kvw, kc, vc);
    free(hb);

    /* Step 2: the step's own K/V, then attention. */
    const step_buf *sb = in->sb;
    const int n = sb->s.n_rows;
    attn_store(be, in, sb, kvw, kc, vc);
    cinfer_tensor *tq = tnew(be, CINFER_DTYPE_F32, 2, n, qw, 0, 0);
    cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, qw, 0, 0);
    put(be, tq, in->q);
    poison(be, to);
    CHECK_OK(cinfer_backend_attention_window(be, tq, kc, vc, n_heads, n_kv,
                                             hd, ac->scale, ac->window, to));
    float *got = malloc(sizeof(float) * (size_t)(n * qw));
    get(be, to, got);

    /* block ids outside the cache are caught by attention (seq 0 reads
     * its block 3 in every layout) */
    step_buf *bad = step_new();
    memcpy(bad, sb, sizeof *bad);
    step_rebase(bad);
    bad->tables[0 * MAX_BLOCKS + 3] = in->n_blocks;
    CHECK_OK(cinfer_backend_set_step(be, &bad->s));
    CHECK_EQ_INT(cinfer_backend_attention(be, tq, kc, vc, n_heads, n_kv, hd,
                                          ac->scale, to),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "attention") != NULL);
    bad->tables[0 * MAX_BLOCKS + 3] = -1;
    CHECK_OK(cinfer_backend_set_step(be, &bad->s));
    CHECK_EQ_INT(cinfer_backend_attention(be, tq, kc, vc, n_heads, n_kv, hd,
                                          ac->scale, to),
                 CINFER_E_INVALID_ARG);
    free(bad);

    cinfer_backend_tensor_destroy(be, tq);
    cinfer_backend_tensor_destroy(be, to);
    cinfer_backend_tensor_destroy(be, kc);
    cinfer_backend_tensor_destroy(be, vc);
    cinfer_backend_destroy(be);
    return got;
}

static void test_attention(void)
{
    const attn_case cases[] = {
        {2, 2, 64, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_MIXED, 0},
        {6, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_MIXED, 0},
        {8, 2, 64, 3, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.125f, LAYOUT_MIXED, 0},
        {3, 3, 20, 4, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.7f, LAYOUT_MIXED, 0},
        {9, 3, 20, 5, CINFER_DTYPE_F16, CINFER_DTYPE_F32, 0.3f, LAYOUT_MIXED, 0},
        {4, 1, 72, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.2f, LAYOUT_MIXED, 0},
        {3, 1, 136, 2, CINFER_DTYPE_F32, CINFER_DTYPE_F16, 0.1f, LAYOUT_MIXED, 0},
        {6, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 2.0f, LAYOUT_MIXED, 0},
        {4, 1, 40, 16, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 2.0f, LAYOUT_MIXED, 0},
        {8, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_ONE, 0},
        {3, 3, 128, 7, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.09f, LAYOUT_ONE, 0},
        {6, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_MANY, 0},
        {4, 4, 32, 5, CINFER_DTYPE_F32, CINFER_DTYPE_F16, 0.2f, LAYOUT_MANY, 0},
        {8, 2, 40, 16, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.15f, LAYOUT_MANY, 0},
        /* F16 caches at head sizes 16, 40 and 128: prefill tiles on
         * tensor cores (each CUDA factory also runs them on CUDA cores) */
        {8, 2, 128, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.088f, LAYOUT_ONE, 0},
        {4, 1, 128, 8, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 2.0f, LAYOUT_MIXED, 0},
        {6, 3, 16, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.25f, LAYOUT_MANY, 0},
        {4, 2, 40, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.15f, LAYOUT_ONE, 0},
        /* sliding windows (Gemma 3's local layers): shorter than some
         * rows' contexts, not a multiple of the block size */
        {4, 1, 64, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_MIXED, 5},
        {8, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f, LAYOUT_ONE, 512},
        {3, 3, 128, 7, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.09f, LAYOUT_ONE, 21},
        {4, 4, 32, 5, CINFER_DTYPE_F32, CINFER_DTYPE_F16, 0.2f, LAYOUT_MANY, 3},
    };
    for (size_t kc = 0; kc < sizeof cases / sizeof cases[0]; kc++) {
        const attn_case *ac = &cases[kc];
        uint64_t seed = seed_for(1234 + kc);
        attn_inputs in;
        attn_inputs_make(&in, ac, &seed);
        double *want = attn_reference(ac, &in);
        const int64_t ne = in.sb->s.n_rows * (int64_t)ac->n_heads * ac->hd;
        char what[96];
        snprintf(what, sizeof what, "attention h%d kv%d hd%d bs%d %s/%s %d seqs %d rows",
                 ac->n_heads, ac->n_kv, ac->hd, ac->bs,
                 cinfer_dtype_name(ac->kdt), cinfer_dtype_name(ac->vdt),
                 in.n_seqs, in.sb->s.n_rows);
        float *cpu = NULL;
        for (int ci = 0; ci < g_n_factories; ci++) {
            const factory *c = &g_factories[ci];
            if (ac->window && !is_cpu(c)) /* only the CPU has the slot */
                continue;
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
            /* the prefill tiles on CUDA cores too, where tensor cores
             * would take them */
            if (!is_cpu(c) && ac->kdt == CINFER_DTYPE_F16 &&
                ac->vdt == CINFER_DTYPE_F16) {
                cinfer_cuda_attention_force_prefill(1);
                float *cores = attention_run(c, ac, &in);
                cinfer_cuda_attention_force_prefill(0);
                char w2[128];
                snprintf(w2, sizeof w2, "%s (CUDA cores)", what);
                check_out(w2, c, cores, want, cpu, ne, 0, NMSE_MATMUL);
                free(cores);
            }
#endif
            float *got = attention_run(c, ac, &in);
            /* On the CPU float error is ~1e-7; peaky softmaxes (scale 2)
             * amplify score errors, which keeps this bound meaningful.
             * Against an F16 V a probability computed in float may round
             * to the neighbouring F16 value of the reference's: one
             * half-ulp of F16 (2^-11) of a |v| <= 1 term. */
            check_out(what, c, got, want, cpu, ne,
                      ac->vdt == CINFER_DTYPE_F16 ? 5e-4 : 3e-6, NMSE_MATMUL);
            if (!cpu) {
                cpu = got;
                continue;
            }
            /* Every instruction set and thread count gives the first CPU
             * factory's bits. */
            if (is_cpu(c)) {
                if (memcmp(cpu, got, sizeof(float) * (size_t)ne) != 0)
                    fprintf(stderr, "%s: %s differs from %s\n", what, c->name,
                            g_factories[0].name);
                CHECK(memcmp(cpu, got, sizeof(float) * (size_t)ne) == 0);
            }
            free(got);
        }
        free(cpu);
        free(want);
        attn_inputs_free(&in);
    }
}

/* ---------------------------------------------------------------------- */
/* gelu_mul, scale (Gemma 3)                                              */
/* ---------------------------------------------------------------------- */

/* gelu_mul against float64 tanh GELU: the F16 rounding of the gate and of
 * its GELU (GGML's table) bound the error at about 2^-10 relative, plus
 * the cut-offs at -10 (0) and 10 (the identity); scale exactly. Backends
 * without the optional slots answer CINFER_E_UNSUPPORTED. */
/* The greedy choice of each row (cinfer_backend_greedy) on every backend
 * that has it, against a plain loop: ties to the lower index, -0.0 equal
 * to +0.0, the first NaN or +inf reported with its kind, a row of -inf
 * alone as -1; widths below, at and past a CTA's threads (100, 256, 300)
 * and a vocabulary's (49152), and one entry. */
static int32_t greedy_ref(const float *v, int64_t n)
{
    for (int64_t i = 0; i < n; i++)
        if (!(v[i] < INFINITY))
            return (int32_t)(-2 - (2 * i + (v[i] != v[i])));
    int64_t best = -1;
    for (int64_t i = 0; i < n; i++)
        if (v[i] > -INFINITY && (best < 0 || v[i] > v[best]))
            best = i;
    return (int32_t)best;
}

static void test_greedy(void)
{
    static const int64_t widths[] = {1, 100, 256, 300, 49152};
    enum { R = 9 };
    uint64_t seed = seed_for(78);
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t n = widths[wi];
        float *x = randv((int)(R * n), &seed, 8.0f);
        float *r;
        /* row 1: the maximum twice (the later one found first by a thread
         * of lower number when n > 256) */
        r = x + 1 * n;
        r[n - 1] = 100.0f;
        r[n / 2] = 100.0f;
        /* row 2: -0.0 and +0.0 the largest, -0.0 first */
        r = x + 2 * n;
        for (int64_t i = 0; i < n; i++)
            r[i] = -1.0f - (float)(i % 7);
        r[n - 1] = 0.0f;
        r[n / 3] = -0.0f;
        /* row 3: every entry -inf */
        r = x + 3 * n;
        for (int64_t i = 0; i < n; i++)
            r[i] = -INFINITY;
        /* row 4: -inf and one finite entry */
        r = x + 4 * n;
        for (int64_t i = 0; i < n; i++)
            r[i] = -INFINITY;
        r[n - 1] = -1e30f;
        /* row 5: +inf, then NaN */
        r = x + 5 * n;
        r[n - 1] = NAN;
        r[n / 2] = INFINITY;
        /* row 6: NaN first, then +inf */
        r = x + 6 * n;
        r[n - 1] = INFINITY;
        r[n / 4] = NAN;
        /* row 7: the largest finite float */
        r = x + 7 * n;
        r[n / 5] = 3.4028235e38f;
        int32_t want[R], got[R];
        for (int i = 0; i < R; i++)
            want[i] = greedy_ref(x + (int64_t)i * n, n);
        if (n > 1)
            CHECK_EQ_INT(want[2], (int32_t)(n / 3));
        CHECK_EQ_INT(want[3], -1);
        for (int fi = 0; fi < g_n_factories; fi++) {
            const factory *f = &g_factories[fi];
            cinfer_backend *be = make_backend(f);
            if (!cinfer_backend_has_greedy(be)) {
                cinfer_backend_destroy(be);
                continue;
            }
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, R, n, 0, 0);
            cinfer_tensor *to = tnew(be, CINFER_DTYPE_I32, 1, R, 0, 0, 0);
            put(be, tx, x);
            poison(be, to);
            CHECK_OK(cinfer_backend_greedy(be, tx, to));
            get(be, to, got);
            for (int i = 0; i < R; i++)
                if (got[i] != want[i]) {
                    fprintf(stderr, "%s: greedy of row %d of %lld: %d, want "
                            "%d\n",
                            f->name, i, (long long)n, got[i], want[i]);
                    CHECK_EQ_INT(got[i], want[i]);
                }
            /* shapes are checked before the backend sees them */
            cinfer_tensor *bad = tnew(be, CINFER_DTYPE_I32, 1, R - 1, 0, 0, 0);
            CHECK_EQ_INT(cinfer_backend_greedy(be, tx, bad),
                         CINFER_E_INVALID_ARG);
            CHECK_EQ_INT(cinfer_backend_greedy(be, tx, tx),
                         CINFER_E_INVALID_ARG);
            cinfer_backend_tensor_destroy(be, bad);
            cinfer_backend_tensor_destroy(be, tx);
            cinfer_backend_tensor_destroy(be, to);
            cinfer_backend_destroy(be);
        }
        free(x);
    }
}

/* sample() by `a` on a copy of `raw` [n] (in `row`) and take_code(code)
 * by `b`: their tokens (-1 on an error) and statuses. */
typedef struct {
    int32_t ta, tb;
    cinfer_status sa, sb;
} choice_pair;

/* 1 if they agree: the same token, or the same error with the same
 * message. */
static int choice_agrees(cinfer_sampler *a, cinfer_sampler *b,
                         const float *raw, int64_t n, float *row, int32_t code,
                         choice_pair *c)
{
    memcpy(row, raw, sizeof(float) * (size_t)n);
    c->ta = c->tb = -1;
    c->sa = cinfer_sampler_sample(a, row, &c->ta, NULL);
    char ea[256];
    snprintf(ea, sizeof ea, "%s", cinfer_last_error());
    c->sb = cinfer_sampler_take_code(b, code, &c->tb);
    if (c->sa != c->sb)
        return 0;
    return c->sa == CINFER_OK ? c->ta == c->tb
                              : strcmp(ea, cinfer_last_error()) == 0;
}

/* The drawn token of each row (cinfer_backend_choose) on every backend
 * that draws, against engine/sampler.c on the same rows with the same
 * seeds: the same token (the sampler's own selection, weights, sums and
 * walk), the same errors for a NaN and a row of -inf, and the greedy
 * choice for inv_t 0; widths below, at and past a chunk (1024) and a
 * vocabulary's, temperatures below and above 1, min_p off and on, top_k
 * off, 1, 5, 40 and 1024, a row of many equal logits (the top_k ties),
 * several positions. */
static void test_choose(void)
{
    static const int64_t widths[] = {1, 100, 1024, 1500, 49152};
    static const struct {
        float temp, min_p;
        int32_t top_k;
        float top_p;
    } cfg[] = {{0.3f, 0.0f, 0, 1.0f},     {1.0f, 0.0f, 0, 1.0f},
               {2.5f, 0.05f, 0, 1.0f},    {0.7f, 0.0f, 1, 1.0f},
               {1.0f, 0.0f, 5, 1.0f},     {1.3f, 0.05f, 40, 1.0f},
               {2.5f, 0.0f, 1024, 1.0f},  {1.0f, 0.05f, 1024, 1.0f},
               /* top_p: alone (one round of candidates, and many at a
                * high temperature), with min_p, with top_k sorted whole
                * and (past 256) by buckets */
               {1.0f, 0.0f, 0, 0.9f},     {0.7f, 0.05f, 0, 0.5f},
               {2.5f, 0.0f, 0, 0.95f},    {1.3f, 0.0f, 40, 0.9f},
               {1.0f, 0.02f, 300, 0.8f},  {2.5f, 0.0f, 1024, 0.97f}};
    enum { R = 6, POS = 3 };
    uint64_t seed = seed_for(79);
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t n = widths[wi];
        float *x = randv(R * n, &seed, 6.0f);
        /* row 1: half of it -inf; row 2: a NaN; row 3: all -inf; row 4:
         * steps of 0.5 (ties); row 5: greedy (inv_t 0) */
        for (int64_t i = 0; i < n; i += 2)
            x[1 * n + i] = -INFINITY;
        x[2 * n + n / 2] = NAN;
        for (int64_t i = 0; i < n; i++)
            x[3 * n + i] = -INFINITY;
        for (int64_t i = 0; i < n; i++)
            x[4 * n + i] = roundf(x[4 * n + i] * 2.0f) / 2.0f;
        float *row = malloc(sizeof(float) * (size_t)n);
        for (int fi = 0; fi < g_n_factories; fi++) {
            const factory *f = &g_factories[fi];
            cinfer_backend *be = make_backend(f);
            if (!cinfer_backend_has_choose(be)) {
                cinfer_backend_destroy(be);
                continue;
            }
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, R, n, 0, 0);
            cinfer_tensor *to = tnew(be, CINFER_DTYPE_I32, 1, R, 0, 0, 0);
            put(be, tx, x);
            int bad = 0, drawn = 0;
            for (size_t ci = 0; ci < sizeof cfg / sizeof cfg[0]; ci++) {
                    cinfer_sampler *a[R], *b[R];
                    for (int r = 0; r < R; r++) {
                        cinfer_sampler_params p =
                            cinfer_sampler_default_params();
                        p.n_vocab = (int32_t)n;
                        p.temperature = r == 5 ? 0.0f : cfg[ci].temp;
                        p.min_p = cfg[ci].min_p;
                        p.top_k = cfg[ci].top_k;
                        p.top_p = cfg[ci].top_p;
                        p.seed = 1000u + (uint64_t)r * 7u + ci * 3u;
                        a[r] = b[r] = NULL;
                        CHECK_OK(cinfer_sampler_create(&p, &a[r]));
                        CHECK_OK(cinfer_sampler_create(&p, &b[r]));
                    }
                    for (int pos = 0; pos < POS; pos++) {
                        cinfer_draw dr[R];
                        for (int r = 0; r < R; r++) {
                            dr[r] = (cinfer_draw){0.0f, 0.0f, 0.0, 0, 1.0f};
                            if (r != 5)
                                CHECK_OK(cinfer_sampler_draw_params(b[r],
                                                                    &dr[r]));
                        }
                        poison(be, to);
                        CHECK_OK(cinfer_backend_choose(be, tx, dr, to));
                        int32_t codes[R];
                        get(be, to, codes);
                        for (int r = 0; r < R; r++) {
                            choice_pair c;
                            if (!choice_agrees(a[r], b[r], x + r * n, n, row,
                                               codes[r], &c)) {
                                if (bad++ < 5)
                                    fprintf(stderr,
                                            "%s: choose n %lld T %g min_p %g "
                                            "top_k %d top_p %g row %d pos %d: "
                                            "sampler %d (%d), backend code "
                                            "%d -> %d (%d)\n",
                                            f->name, (long long)n,
                                            (double)cfg[ci].temp,
                                            (double)cfg[ci].min_p,
                                            (int)cfg[ci].top_k,
                                            (double)cfg[ci].top_p, r, pos, c.ta,
                                            (int)c.sa, codes[r], c.tb,
                                            (int)c.sb);
                            }
                            if (c.sa == CINFER_OK) {
                                drawn += r != 5;
                                CHECK_OK(cinfer_sampler_accept(a[r], c.ta));
                                CHECK_OK(cinfer_sampler_accept(b[r], c.ta));
                            }
                        }
                    }
                    for (int r = 0; r < R; r++) {
                        cinfer_sampler_destroy(a[r]);
                        cinfer_sampler_destroy(b[r]);
                    }
                }
            CHECK_EQ_INT(bad, 0);
            CHECK(drawn > 0);
            /* a draw out of range is refused before the backend sees it */
            cinfer_draw dr[R];
            for (int r = 0; r < R; r++)
                dr[r] = (cinfer_draw){1.0f, 0.0f, 0.5, 0, 1.0f};
            dr[4].u = 1.0;
            CHECK_EQ_INT(cinfer_backend_choose(be, tx, dr, to),
                         CINFER_E_INVALID_ARG);
            cinfer_backend_tensor_destroy(be, tx);
            cinfer_backend_tensor_destroy(be, to);
            cinfer_backend_destroy(be);
        }
        free(row);
        free(x);
    }
}

/* The samplers' stages 1-3 applied where the logits are
 * (cinfer_backend_edit_logits with cinfer_sampler_edits' entries) on every
 * backend that edits, against engine/sampler.c on the same rows: the
 * edited rows bit for bit as cinfer_sampler_process_logits leaves them,
 * then the token chosen from them (greedy and drawn, top_k off and on) as
 * sample() chooses from the raw row, over several positions so that the
 * penalty counts grow: logit_bias with -inf, min_tokens' mask, all three
 * penalties, a +inf at an edited entry (left for choose to name, as the
 * sampler names it); then the raw rows put back bit for bit
 * (cinfer_backend_unedit_logits); bad entries refused before the backend
 * sees them. */
static void test_edit_logits(void)
{
    static const int64_t widths[] = {100, 1500, 49152};
    enum { R = 5, POS = 4 };
    uint64_t seed = seed_for(83);
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t n = widths[wi];
        float *x = randv(R * n, &seed, 6.0f);
        float *ed_rows = malloc(sizeof(float) * (size_t)(R * n));
        float *row = malloc(sizeof(float) * (size_t)n);
        cinfer_logit_edit *ed = NULL;
        for (int fi = 0; fi < g_n_factories; fi++) {
            const factory *f = &g_factories[fi];
            cinfer_backend *be = make_backend(f);
            if (!cinfer_backend_has_edit_logits(be) ||
                !cinfer_backend_has_choose(be)) {
                cinfer_backend_destroy(be);
                continue;
            }
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, R, n, 0, 0);
            cinfer_tensor *to = tnew(be, CINFER_DTYPE_I32, 1, R, 0, 0, 0);
            const cinfer_logit_bias bias[3] = {
                {3, 2.5f}, {(int32_t)(n / 2), -INFINITY}, {7, -1.25f}};
            const int32_t eog[2] = {(int32_t)(n - 1), 3};
            cinfer_sampler *a[R], *b[R];
            for (int r = 0; r < R; r++) {
                cinfer_sampler_params p = cinfer_sampler_default_params();
                p.n_vocab = (int32_t)n;
                p.temperature = r == 0 ? 0.0f : 0.6f + 0.3f * (float)r;
                p.top_k = r == 2 ? 40 : 0;
                p.min_p = r == 3 ? 0.02f : 0.0f;
                p.repetition_penalty = r == 1 ? 1.0f : 1.1f + 0.1f * (float)r;
                p.frequency_penalty = r % 2 ? 0.7f : -0.3f;
                p.presence_penalty = r == 4 ? 0.0f : 1.5f;
                p.penalty_last_n = r == 3 ? 8 : 0;
                p.penalty_prompt = r == 4 ? CINFER_PENALTY_PROMPT_ALL
                                          : CINFER_PENALTY_PROMPT_REPETITION;
                p.logit_bias = bias;
                p.n_logit_bias = r == 1 ? 0 : 3;
                p.eog_tokens = eog;
                p.n_eog_tokens = 2;
                p.min_tokens = r;
                p.seed = 500u + (uint64_t)r;
                a[r] = b[r] = NULL;
                CHECK_OK(cinfer_sampler_create(&p, &a[r]));
                CHECK_OK(cinfer_sampler_create(&p, &b[r]));
                int32_t prompt[12];
                for (int i = 0; i < 12; i++)
                    prompt[i] = (int32_t)((i * 37 + r) % (n < 64 ? n : 64));
                CHECK_OK(cinfer_sampler_accept_prompt(a[r], prompt, 12));
                CHECK_OK(cinfer_sampler_accept_prompt(b[r], prompt, 12));
            }
            int bad = 0, edited = 0, drawn = 0;
            for (int pos = 0; pos < POS; pos++) {
                /* the rows of this position; at pos 2 row 4 has a +inf
                 * at its (biased) token 3 */
                for (int64_t i = 0; i < R * n; i++)
                    ed_rows[i] = x[(i + pos * 7) % (R * n)];
                if (pos == 2)
                    ed_rows[4 * n + 3] = INFINITY;
                put(be, tx, ed_rows);
                int64_t bound = 0;
                for (int r = 0; r < R; r++)
                    bound += cinfer_sampler_edits_bound(b[r]);
                ed = realloc(ed, sizeof *ed * (size_t)(bound + 1));
                int64_t ne = 0;
                cinfer_draw dr[R];
                for (int r = 0; r < R; r++) {
                    ne += cinfer_sampler_edits(b[r], r, ed + ne);
                    dr[r] = (cinfer_draw){0.0f, 0.0f, 0.0, 0, 1.0f};
                    if (r != 0)
                        CHECK_OK(cinfer_sampler_draw_params(b[r], &dr[r]));
                }
                edited += ne > 0;
                CHECK_OK(cinfer_backend_edit_logits(be, tx, ed, ne));
                float *got = malloc(sizeof(float) * (size_t)(R * n));
                get(be, tx, got);
                for (int r = 0; r < R; r++) {
                    memcpy(row, ed_rows + r * n, sizeof(float) * (size_t)n);
                    CHECK_OK(cinfer_sampler_process_logits(a[r], row));
                    if (pos == 2 && r == 4)
                        row[3] = INFINITY; /* left as it is */
                    if (memcmp(row, got + r * n, sizeof(float) * (size_t)n)) {
                        if (bad++ < 5)
                            fprintf(stderr, "%s: edited row %d of %lld at "
                                    "pos %d differs\n",
                                    f->name, r, (long long)n, pos);
                    }
                }
                free(got);
                poison(be, to);
                CHECK_OK(cinfer_backend_choose(be, tx, dr, to));
                int32_t codes[R];
                get(be, to, codes);
                /* the raw rows back, bit for bit */
                CHECK_OK(cinfer_backend_unedit_logits(be, tx));
                got = malloc(sizeof(float) * (size_t)(R * n));
                get(be, tx, got);
                if (memcmp(got, ed_rows, sizeof(float) * (size_t)(R * n)) &&
                    bad++ < 5)
                    fprintf(stderr, "%s: unedited rows of %lld at pos %d "
                            "differ\n",
                            f->name, (long long)n, pos);
                free(got);
                for (int r = 0; r < R; r++) {
                    choice_pair c;
                    if (!choice_agrees(a[r], b[r], ed_rows + r * n, n, row,
                                       codes[r], &c) &&
                        bad++ < 5)
                        fprintf(stderr, "%s: n %lld row %d pos %d: sampler "
                                "%d (%d), backend code %d -> %d (%d)\n",
                                f->name, (long long)n, r, pos, c.ta,
                                (int)c.sa, codes[r], c.tb, (int)c.sb);
                    if (pos == 2 && r == 4)
                        CHECK_EQ_INT(c.sb, CINFER_E_RANGE);
                    int32_t next = c.sa == CINFER_OK ? c.ta : 3;
                    drawn += c.sa == CINFER_OK && r != 0;
                    CHECK_OK(cinfer_sampler_accept(a[r], next));
                    CHECK_OK(cinfer_sampler_accept(b[r], next));
                }
            }
            CHECK_EQ_INT(bad, 0);
            CHECK_EQ_INT(edited, POS);
            CHECK(drawn > 0);
            /* bad entries, each refused before anything is applied */
            cinfer_logit_edit e1 = {0, 1, CINFER_EDIT_BIAS, 1.0f, 0, 0, 0};
            cinfer_logit_edit bads[6];
            for (int i = 0; i < 6; i++)
                bads[i] = e1;
            bads[0].row = R;
            bads[1].token = (int32_t)n;
            bads[2].flags = 16;
            bads[3].bias = NAN;
            bads[4].flags = CINFER_EDIT_REP; /* rp 0 */
            bads[5].flags = CINFER_EDIT_FREQ;
            bads[5].fn = INFINITY;
            for (int i = 0; i < 6; i++)
                CHECK_EQ_INT(cinfer_backend_edit_logits(be, tx, &bads[i], 1),
                             CINFER_E_INVALID_ARG);
            CHECK_EQ_INT(cinfer_backend_edit_logits(be, tx, NULL, 1),
                         CINFER_E_INVALID_ARG);
            /* no entries: nothing to put back; another tensor: refused */
            CHECK_OK(cinfer_backend_edit_logits(be, tx, NULL, 0));
            CHECK_OK(cinfer_backend_unedit_logits(be, tx));
            cinfer_tensor *other = tnew(be, CINFER_DTYPE_F32, 2, R, n, 0, 0);
            CHECK_EQ_INT(cinfer_backend_unedit_logits(be, other),
                         CINFER_E_INVALID_ARG);
            cinfer_backend_tensor_destroy(be, other);
            for (int r = 0; r < R; r++) {
                cinfer_sampler_destroy(a[r]);
                cinfer_sampler_destroy(b[r]);
            }
            cinfer_backend_tensor_destroy(be, tx);
            cinfer_backend_tensor_destroy(be, to);
            cinfer_backend_destroy(be);
        }
        free(ed);
        free(row);
        free(ed_rows);
        free(x);
    }
}

/* The chosen tokens' logprobs from the parts a backend finds in the row
 * (cinfer_backend_logprobs, finished by cinfer_sampler_take_logprobs) on
 * every backend that finds them, against the host sampler's
 * cinfer_sampler_logprobs on the same raw rows: the same bits for the
 * logprob, the rank and the top entries, and for the parts themselves
 * (cinfer_sampler_logprob_parts: the weights' double sum too); widths
 * below the 20 tops, past a chunk (1024) and a vocabulary's; rows with
 * ties (the tops' order by index), -inf entries, -0.0 beside +0.0, a
 * spread whose sums round; n_top 0 to 20; rows with a code or n_top -1
 * left as they are. */
static void test_logprobs_op(void)
{
    static const int64_t widths[] = {1, 15, 100, 1031, 1500, 49152};
    static const int32_t tops[] = {20, 0, 1, 5, 20, 3, 20};
    enum { R = 7 };
    uint64_t seed = seed_for(84);
    for (size_t wi = 0; wi < sizeof widths / sizeof widths[0]; wi++) {
        const int64_t n = widths[wi];
        float *x = randv(R * n, &seed, 6.0f);
        /* row 1: steps of 0.5 (ties); row 2: half -inf; row 3: zeros of
         * both signs the largest; row 5: spread over 85 nats, so that the
         * weights' double sums round (their order shows); row 6: every
         * entry equal */
        for (int64_t i = 0; i < n; i++) {
            x[1 * n + i] = roundf(x[1 * n + i] * 2.0f) / 2.0f;
            if (i % 2)
                x[2 * n + i] = -INFINITY;
            x[3 * n + i] = i % 3 == 0 ? (i % 2 ? -0.0f : 0.0f) : -1.0f;
            x[5 * n + i] = (x[5 * n + i] - 6.0f) * 7.0f; /* [-84, 0) */
            x[6 * n + i] = 0.25f;
        }
        if (n == 1031) {
            /* row 5: a last chunk of 7 whose sum shows its order: the
             * largest (weight 1) first, quarter-ulp weights at 1 and 4-6
             * (added to 1 one at a time they vanish; summed apart they
             * do not), the first chunk's weights far below */
            for (int64_t i = 0; i < n; i++)
                x[5 * n + i] = -80.0f;
            x[5 * n + 1024] = 0.0f;
            x[5 * n + 1025] = x[5 * n + 1028] = x[5 * n + 1029] =
                x[5 * n + 1030] = -37.43f; /* e^-37.43 ~ 2^-54 */
        }
        int32_t tok[R];
        for (int r = 0; r < R; r++)
            tok[r] = (int32_t)((r * 7919 + 3) % n);
        tok[2] = 0;  /* an even index: finite */
        tok[4] = -1; /* a code: skipped */
        int32_t ask[R]; /* row 0: n_top -1, skipped */
        memcpy(ask, tops, sizeof ask);
        ask[0] = -1;
        cinfer_row_logprobs *got = malloc(sizeof *got * R);
        for (int fi = 0; fi < g_n_factories; fi++) {
            const factory *f = &g_factories[fi];
            cinfer_backend *be = make_backend(f);
            if (!cinfer_backend_has_logprobs(be)) {
                cinfer_backend_destroy(be);
                continue;
            }
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, R, n, 0, 0);
            cinfer_tensor *tt = tnew(be, CINFER_DTYPE_I32, 1, R, 0, 0, 0);
            cinfer_tensor *to = tnew(be, CINFER_DTYPE_I32, 2, R,
                                     CINFER_ROW_LOGPROBS_WORDS, 0, 0);
            put(be, tx, x);
            put(be, tt, tok);
            memset(got, 0x5a, sizeof *got * R);
            put(be, to, got);
            CHECK_OK(cinfer_backend_logprobs(be, tx, tt, ask, to));
            get(be, to, got);
            int bad = 0;
            for (int r = 0; r < R; r++) {
                if (tok[r] < 0 || ask[r] < 0) {
                    unsigned char *b = (unsigned char *)&got[r];
                    for (size_t i = 0; i < sizeof got[r]; i++)
                        bad += b[i] != 0x5a;
                    continue;
                }
                cinfer_sampler_params p = cinfer_sampler_default_params();
                p.n_vocab = (int32_t)n;
                p.n_logprobs = tops[r];
                cinfer_sampler *sm = NULL;
                CHECK_OK(cinfer_sampler_create(&p, &sm));
                if (!sm)
                    continue;
                cinfer_logprobs want, have;
                memset(&want, 0, sizeof want);
                memset(&have, 0, sizeof have);
                CHECK_OK(cinfer_sampler_logprobs(sm, x + r * n, tok[r],
                                                 &want));
                CHECK_OK(cinfer_sampler_take_logprobs(sm, &got[r], tok[r],
                                                      &have));
                /* the parts themselves: the sum bit for bit */
                cinfer_row_logprobs rp;
                CHECK_OK(cinfer_sampler_logprob_parts(sm, x + r * n, tok[r],
                                                      &rp));
                int same = memcmp(&rp.sum, &got[r].sum, sizeof rp.sum) == 0 &&
                           rp.better == got[r].better &&
                           memcmp(&rp.max, &got[r].max, sizeof rp.max) == 0 &&
                           memcmp(&rp.logit, &got[r].logit,
                                  sizeof rp.logit) == 0 &&
                           rp.n_top == got[r].n_top;
                for (int j = 0; same && j < rp.n_top; j++)
                    same = rp.top_id[j] == got[r].top_id[j] &&
                           memcmp(&rp.top_logit[j], &got[r].top_logit[j],
                                  sizeof(float)) == 0;
                if (!same && bad++ < 5)
                    fprintf(stderr,
                            "%s: logprobs parts n %lld row %d: sum %.17g "
                            "better %lld, want %.17g %lld\n",
                            f->name, (long long)n, r, got[r].sum,
                            (long long)got[r].better, rp.sum,
                            (long long)rp.better);
                if (memcmp(&want, &have, sizeof want) != 0 && bad++ < 5)
                    fprintf(stderr,
                            "%s: logprobs n %lld row %d token %d: %.9g rank "
                            "%d top %d, want %.9g rank %d top %d\n",
                            f->name, (long long)n, r, tok[r],
                            (double)have.logprob, have.rank, have.n_top,
                            (double)want.logprob, want.rank, want.n_top);
                cinfer_sampler_destroy(sm);
            }
            CHECK_EQ_INT(bad, 0);
            /* n_top out of range, a tokens tensor of the wrong shape */
            int32_t big[R];
            memcpy(big, ask, sizeof big);
            big[3] = CINFER_LOGPROBS_MAX_TOP + 1;
            CHECK_EQ_INT(cinfer_backend_logprobs(be, tx, tt, big, to),
                         CINFER_E_INVALID_ARG);
            CHECK_EQ_INT(cinfer_backend_logprobs(be, tx, to, ask, to),
                         CINFER_E_INVALID_ARG);
            cinfer_backend_tensor_destroy(be, tx);
            cinfer_backend_tensor_destroy(be, tt);
            cinfer_backend_tensor_destroy(be, to);
            cinfer_backend_destroy(be);
        }
        free(got);
        free(x);
    }
}

/* The weights the CUDA draw takes (kernels/cuda/sample.cu) bit for bit
 * against the sampler's (cinfer_sampler_weight), on every CUDA factory:
 * every float of [-88, 0] at a stride, the edges (-87, just above and
 * below, -0.0, the smallest normals), scaled by temperatures, and min_w
 * at the cut. */
static void test_sampler_weights(void)
{
#if defined(CINFER_TEST_CUDASIM) || defined(CINFER_TEST_CUDA)
    enum { N = 1 << 16 };
    float *x = malloc(sizeof(float) * N), *want = malloc(sizeof(float) * N);
    float *got = malloc(sizeof(float) * N);
    const float edges[] = {-87.0f, -86.99999f, -87.00001f, -0.0f, 0.0f,
                           -1.17549435e-38f, -1e-30f, -88.0f, -INFINITY,
                           -0.6931472f, -0.34657359f, -20.5f};
    for (int i = 0; i < N; i++)
        x[i] = -88.0f * (float)i / (float)(N - 1);
    for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++)
        x[i] = edges[i];
    static const struct {
        float max, inv_t, min_w;
    } cases[] = {{0.0f, 1.0f, 0.0f}, {3.5f, 0.4f, 0.0f},
                 {-2.0f, 3.3333333f, 0.05f}, {0.0f, 1.0f, 0.5f}};
    for (int fi = 0; fi < g_n_factories; fi++) {
        const factory *f = &g_factories[fi];
        if (f->kind != KIND_CUDA)
            continue;
        cinfer_backend *be = make_backend(f); /* selects the device */
        void *dx, *dw;
        CHECK_EQ_INT(cudaMalloc(&dx, sizeof(float) * N), cudaSuccess);
        CHECK_EQ_INT(cudaMalloc(&dw, sizeof(float) * N), cudaSuccess);
        for (size_t ci = 0; ci < sizeof cases / sizeof cases[0]; ci++) {
            float *xs = malloc(sizeof(float) * N);
            for (int i = 0; i < N; i++) /* logit <= max */
                xs[i] = x[i] + cases[ci].max;
            for (int i = 0; i < N; i++)
                want[i] = cinfer_sampler_weight(xs[i], cases[ci].max,
                                                cases[ci].inv_t,
                                                cases[ci].min_w);
            cudaMemcpy(dx, xs, sizeof(float) * N, cudaMemcpyHostToDevice);
            CHECK_OK(cinfer_cuda_sampler_weights(0, dx, N, cases[ci].max,
                                                 cases[ci].inv_t,
                                                 cases[ci].min_w, dw));
            cudaMemcpy(got, dw, sizeof(float) * N, cudaMemcpyDeviceToHost);
            int bad = 0;
            for (int i = 0; i < N; i++)
                if (memcmp(&got[i], &want[i], sizeof(float)) != 0 &&
                    bad++ < 3)
                    fprintf(stderr, "%s: weight of %a (max %g, inv_t %g, "
                            "min_w %g): %a, the sampler's %a\n",
                            f->name, (double)xs[i], (double)cases[ci].max,
                            (double)cases[ci].inv_t, (double)cases[ci].min_w,
                            (double)got[i], (double)want[i]);
            CHECK_EQ_INT(bad, 0);
            free(xs);
        }
        cudaFree(dx);
        cudaFree(dw);
        cinfer_backend_destroy(be);
    }
    free(x);
    free(want);
    free(got);
#endif
}

static void test_gelu_scale(void)
{
    enum { N = 7, D = 769 };
    uint64_t seed = seed_for(77);
    float *g = randv(N * D, &seed, 12.0f), *u = randv(N * D, &seed, 1.0f);
    const float edges[] = {-10.0f, 10.0f, -10.001f, 9.999f, 0.0f, -0.0f,
                           1e-8f, -3.0f, -0x1.ffcp+0f};
    for (int i = 0; i < 9; i++)
        g[i] = edges[i];
    u[8] = 1.0f;
    float *got = malloc(sizeof(float) * N * D);
    float *first = NULL;
    for (int ci = 0; ci < g_n_factories; ci++) {
        const factory *c = &g_factories[ci];
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tg = tnew(be, CINFER_DTYPE_F32, 2, N, D, 0, 0);
        cinfer_tensor *tu = tnew(be, CINFER_DTYPE_F32, 2, N, D, 0, 0);
        put(be, tg, g);
        put(be, tu, u);
        if (!is_cpu(c)) {
            CHECK_EQ_INT(cinfer_backend_gelu_mul(be, tg, tu, tg),
                         CINFER_E_UNSUPPORTED);
            CHECK_EQ_INT(cinfer_backend_scale(be, tg, 2.0f),
                         CINFER_E_UNSUPPORTED);
            CHECK(!cinfer_backend_has_gemma_ops(be));
        } else {
            CHECK(cinfer_backend_has_gemma_ops(be));
            CHECK_OK(cinfer_backend_gelu_mul(be, tg, tu, tg));
            get(be, tg, got);
            int bad = 0;
            for (int i = 0; i < N * D; i++) {
                double x = g[i], want;
                if (x <= -10.0)
                    want = 0.0;
                else if (x >= 10.0)
                    want = x * u[i];
                else
                    want = 0.5 * x *
                           (1.0 + tanh(0.7978845608028654 *
                                       (x + 0.044715 * x * x * x))) *
                           u[i];
                double err = fabs(got[i] - want);
                if (err > 2e-3 * fabs(want) + 2e-3 * fabs(u[i]) * 1e-2 +
                              1e-6) {
                    if (bad < 3)
                        fprintf(stderr, "gelu_mul[%d]: gate %g up %g: %g, "
                                        "want %g\n",
                                i, g[i], u[i], got[i], want);
                    bad++;
                }
            }
            CHECK_EQ_INT(bad, 0);
            CHECK(got[0] == 0.0f);            /* -10: cut to 0 */
            CHECK(got[1] == 10.0f * u[1]);    /* 10: the identity */
            /* GGML's table entry for the F16 gate -1.99902344, built with
             * FMA contraction (ops.c, gelu_f16): one F16 step from what
             * the uncontracted formula rounds to */
            CHECK(got[8] == -0x1.74cp-5f);
            if (!first) {
                first = malloc(sizeof(float) * N * D);
                memcpy(first, got, sizeof(float) * N * D);
            } else {
                CHECK(memcmp(first, got, sizeof(float) * N * D) == 0);
            }
            put(be, tg, g);
            CHECK_OK(cinfer_backend_scale(be, tg, 25.298221f));
            get(be, tg, got);
            bad = 0;
            for (int i = 0; i < N * D; i++)
                bad += got[i] != g[i] * 25.298221f;
            CHECK_EQ_INT(bad, 0);
            CHECK_EQ_INT(cinfer_backend_scale(be, tg, INFINITY),
                         CINFER_E_INVALID_ARG);
        }
        cinfer_backend_tensor_destroy(be, tg);
        cinfer_backend_tensor_destroy(be, tu);
        cinfer_backend_destroy(be);
    }
    free(first);
    free(got);
    free(g);
    free(u);
}

/* ---------------------------------------------------------------------- */
/* batch invariance (CPU): a small layer, one row alone vs in a batch     */
/* ---------------------------------------------------------------------- */

enum { L_D = 96, L_NH = 6, L_NKV = 2, L_HD = 16, L_F = 160, L_VOCAB = 50 };
enum { L_BS = 4, L_NBLOCKS = 64 };

typedef struct {
    uint8_t *embd, *wq, *wk, *wv, *wo, *wg, *wu, *wd;
    float *norm1, *norm2;
} layer_weights;

static uint8_t *qweights(cinfer_dtype dt, int64_t n_out, int64_t n_in,
                         uint64_t *seed)
{
    size_t rb = cinfer_dtype_row_bytes(dt, n_in);
    uint8_t *w = malloc(rb * (size_t)n_out);
    float *src = randv(n_out * n_in, seed, 0.3f);
    for (int64_t o = 0; o < n_out; o++)
        cinfer_quantize_row(dt, src + o * n_in, w + o * rb, n_in);
    free(src);
    return w;
}

static void layer_weights_init(layer_weights *lw)
{
    uint64_t seed = seed_for(77);
    lw->embd = qweights(CINFER_DTYPE_Q8_0, L_VOCAB, L_D, &seed);
    lw->wq = qweights(CINFER_DTYPE_Q4_1, L_NH * L_HD, L_D, &seed);
    lw->wk = qweights(CINFER_DTYPE_Q8_0, L_NKV * L_HD, L_D, &seed);
    lw->wv = qweights(CINFER_DTYPE_F16, L_NKV * L_HD, L_D, &seed);
    lw->wo = qweights(CINFER_DTYPE_F32, L_D, L_NH * L_HD, &seed);
    lw->wg = qweights(CINFER_DTYPE_Q4_0, L_F, L_D, &seed);
    lw->wu = qweights(CINFER_DTYPE_BF16, L_F, L_D, &seed);
    lw->wd = qweights(CINFER_DTYPE_Q4_1, L_D, L_F, &seed);
    lw->norm1 = randv(L_D, &seed, 1.0f);
    lw->norm2 = randv(L_D, &seed, 1.0f);
}

static void layer_weights_free(layer_weights *lw)
{
    free(lw->embd);
    free(lw->wq);
    free(lw->wk);
    free(lw->wv);
    free(lw->wo);
    free(lw->wg);
    free(lw->wu);
    free(lw->wd);
    free(lw->norm1);
    free(lw->norm2);
}

typedef struct {
    cinfer_backend *be;
    cinfer_tensor *embd, *wq, *wk, *wv, *wo, *wg, *wu, *wd, *norm1, *norm2;
    cinfer_tensor *kc, *vc;
} layer_model;

static void layer_model_init(layer_model *m, cinfer_cpu_isa isa, int n_threads,
                             const layer_weights *lw)
{
    cinfer_backend *be = m->be = make_cpu(isa, n_threads);
    m->embd = wnew(be, CINFER_DTYPE_Q8_0, 2, L_VOCAB, L_D, lw->embd);
    m->wq = wnew(be, CINFER_DTYPE_Q4_1, 2, L_NH * L_HD, L_D, lw->wq);
    m->wk = wnew(be, CINFER_DTYPE_Q8_0, 2, L_NKV * L_HD, L_D, lw->wk);
    m->wv = wnew(be, CINFER_DTYPE_F16, 2, L_NKV * L_HD, L_D, lw->wv);
    m->wo = wnew(be, CINFER_DTYPE_F32, 2, L_D, L_NH * L_HD, lw->wo);
    m->wg = wnew(be, CINFER_DTYPE_Q4_0, 2, L_F, L_D, lw->wg);
    m->wu = wnew(be, CINFER_DTYPE_BF16, 2, L_F, L_D, lw->wu);
    m->wd = wnew(be, CINFER_DTYPE_Q4_1, 2, L_D, L_F, lw->wd);
    m->norm1 = wnew(be, CINFER_DTYPE_F32, 1, L_D, 0, lw->norm1);
    m->norm2 = wnew(be, CINFER_DTYPE_F32, 1, L_D, 0, lw->norm2);
    m->kc = tnew(be, CINFER_DTYPE_F16, 4, L_NBLOCKS, L_BS, L_NKV, L_HD);
    m->vc = tnew(be, CINFER_DTYPE_F16, 4, L_NBLOCKS, L_BS, L_NKV, L_HD);
    CHECK_OK(cinfer_backend_fill_zero(be, m->kc));
    CHECK_OK(cinfer_backend_fill_zero(be, m->vc));
}

static void layer_model_free(layer_model *m)
{
    cinfer_tensor *ts[] = {m->embd, m->wq, m->wk, m->wv, m->wo, m->wg,
                           m->wu,   m->wd, m->norm1, m->norm2, m->kc, m->vc};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        cinfer_backend_tensor_destroy(m->be, ts[i]);
    cinfer_backend_destroy(m->be);
}

/* Runs one step through the layer; writes the gathered output rows
 * ([n_out, L_D]) and the attention output of every row ([n, L_NH * L_HD]). */
static void layer_forward(layer_model *m, const cinfer_step *s, float *out,
                          float *attn_out)
{
    cinfer_backend *be = m->be;
    int n = s->n_rows;
    cinfer_tensor *x = tnew(be, CINFER_DTYPE_F32, 2, n, L_D, 0, 0);
    cinfer_tensor *h = tnew(be, CINFER_DTYPE_F32, 2, n, L_D, 0, 0);
    cinfer_tensor *q = tnew(be, CINFER_DTYPE_F32, 2, n, L_NH * L_HD, 0, 0);
    cinfer_tensor *k = tnew(be, CINFER_DTYPE_F32, 2, n, L_NKV * L_HD, 0, 0);
    cinfer_tensor *v = tnew(be, CINFER_DTYPE_F32, 2, n, L_NKV * L_HD, 0, 0);
    cinfer_tensor *a = tnew(be, CINFER_DTYPE_F32, 2, n, L_NH * L_HD, 0, 0);
    cinfer_tensor *g = tnew(be, CINFER_DTYPE_F32, 2, n, L_F, 0, 0);
    cinfer_tensor *u = tnew(be, CINFER_DTYPE_F32, 2, n, L_F, 0, 0);
    cinfer_tensor *y = tnew(be, CINFER_DTYPE_F32, 2, s->n_out, L_D, 0, 0);
    CHECK_OK(cinfer_backend_set_step(be, s));
    CHECK_OK(cinfer_backend_embed(be, m->embd, x));
    CHECK_OK(cinfer_backend_rms_norm(be, x, m->norm1, 1e-5f, h));
    const cinfer_tensor *wqkv[3] = {m->wq, m->wk, m->wv};
    cinfer_tensor *qkv[3] = {q, k, v};
    CHECK_OK(cinfer_backend_matmul(be, 3, wqkv, h, qkv));
    CHECK_OK(cinfer_backend_rope(be, q, L_NH, L_HD, L_HD, 10000.0f, CINFER_ROPE_NORM));
    CHECK_OK(cinfer_backend_rope(be, k, L_NKV, L_HD, L_HD, 10000.0f, CINFER_ROPE_NORM));
    CHECK_OK(cinfer_backend_kv_store(be, k, v, m->kc, m->vc));
    CHECK_OK(cinfer_backend_attention(be, q, m->kc, m->vc, L_NH, L_NKV, L_HD, 0.25f, a));
    const cinfer_tensor *wo[1] = {m->wo};
    cinfer_tensor *ho[1] = {h};
    CHECK_OK(cinfer_backend_matmul(be, 1, wo, a, ho));
    CHECK_OK(cinfer_backend_add(be, x, h, x));
    CHECK_OK(cinfer_backend_rms_norm(be, x, m->norm2, 1e-5f, h));
    const cinfer_tensor *wgu[2] = {m->wg, m->wu};
    cinfer_tensor *gu[2] = {g, u};
    CHECK_OK(cinfer_backend_matmul(be, 2, wgu, h, gu));
    CHECK_OK(cinfer_backend_silu_mul(be, g, u, g));
    const cinfer_tensor *wd[1] = {m->wd};
    ho[0] = h;
    CHECK_OK(cinfer_backend_matmul(be, 1, wd, g, ho));
    CHECK_OK(cinfer_backend_add(be, x, h, x));
    CHECK_OK(cinfer_backend_gather_rows(be, x, y));
    CHECK_OK(cinfer_backend_synchronize(be));
    get(be, y, out);
    get(be, a, attn_out);
    cinfer_tensor *ts[] = {x, h, q, k, v, a, g, u, y};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        cinfer_backend_tensor_destroy(be, ts[i]);
}

static void test_batch_invariance(void)
{
    layer_weights lw;
    layer_weights_init(&lw);
    const int hist = 45; /* seq 0's prompt */
    /* every ISA must give the portable code's bits */
    float ref_alone[L_D], ref_attn[L_NH * L_HD];
    int have_ref = 0;
    for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512;
         isa++) {
        if (!cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
            continue;
        float alone[L_D], alone_attn[L_NH * L_HD];
        float batch[2][7 * L_D], batch_attn[2][7 * L_NH * L_HD];
        float scratch_out[64 * L_D], scratch_attn[64 * L_NH * L_HD];
        for (int run = 0; run < 3; run++) {
            /* run 0: the row alone, 1 thread; runs 1 and 2: in a batch of 7
             * with 1 and 3 threads */
            layer_model m;
            layer_model_init(&m, (cinfer_cpu_isa)isa, run == 2 ? 3 : 1, &lw);
            step_buf sb;
            step_init(&sb, 4, L_BS);
            for (int s = 0; s < 4; s++)
                for (int b = 0; b < 16; b++)
                    sb.tables[s * MAX_BLOCKS + b] = (s * 16 + b) * 5 % L_NBLOCKS;

            /* seq 0's prompt, identical in every run */
            for (int p = 0; p < hist; p++)
                step_row(&sb, 0, p, (p * 7 + 3) % L_VOCAB);
            step_all_out(&sb);
            layer_forward(&m, &sb.s, scratch_out, scratch_attn);
            if (run > 0) {
                /* the other sequences' prompts */
                sb.s.n_rows = 0;
                for (int p = 0; p < 5; p++)
                    step_row(&sb, 1, p, (p * 11 + 1) % L_VOCAB);
                for (int p = 0; p < 30; p++)
                    step_row(&sb, 2, p, (p * 5 + 2) % L_VOCAB);
                step_all_out(&sb);
                layer_forward(&m, &sb.s, scratch_out, scratch_attn);
            }
            /* the decode step of seq 0 */
            sb.s.n_rows = 0;
            if (run == 0) {
                step_row(&sb, 0, hist, 4);
            } else {
                step_row(&sb, 1, 5, 8);
                step_row(&sb, 3, 0, 9); /* seq 3: prefill of 3 rows */
                step_row(&sb, 2, 30, 10);
                step_row(&sb, 0, hist, 4); /* index 3 */
                step_row(&sb, 3, 1, 11);
                step_row(&sb, 3, 2, 12);
                step_row(&sb, 1, 6, 13);
            }
            step_all_out(&sb);
            /* seq 0's decode row is a generated token's; mix the others */
            uint8_t gen[16];
            for (int r = 0; r < sb.s.n_rows; r++)
                gen[r] = (uint8_t)(sb.row_seq[r] == 0 || (r & 1));
            sb.s.row_gen = gen;
            if (run == 0) {
                layer_forward(&m, &sb.s, alone, alone_attn);
            } else {
                layer_forward(&m, &sb.s, batch[run - 1], batch_attn[run - 1]);
            }
            layer_model_free(&m);
        }
        if (memcmp(alone, batch[0] + 3 * L_D, sizeof alone) != 0)
            fprintf(stderr, "batch invariance fails for %s\n",
                    cinfer_cpu_isa_name((cinfer_cpu_isa)isa));
        CHECK(memcmp(alone, batch[0] + 3 * L_D, sizeof alone) == 0);
        CHECK(memcmp(alone_attn, batch_attn[0] + 3 * L_NH * L_HD,
                     sizeof alone_attn) == 0);
        CHECK(memcmp(batch[0], batch[1], sizeof batch[0]) == 0);
        CHECK(memcmp(batch_attn[0], batch_attn[1], sizeof batch_attn[0]) == 0);
        int finite = 1;
        for (int i = 0; i < L_D; i++)
            finite &= isfinite(alone[i]) && alone[i] != 0.0f;
        CHECK(finite);
        if (!have_ref) {
            memcpy(ref_alone, alone, sizeof alone);
            memcpy(ref_attn, alone_attn, sizeof alone_attn);
            have_ref = 1;
        } else {
            if (memcmp(ref_alone, alone, sizeof alone) != 0 ||
                memcmp(ref_attn, alone_attn, sizeof alone_attn) != 0)
                fprintf(stderr, "%s differs from portable\n",
                        cinfer_cpu_isa_name((cinfer_cpu_isa)isa));
            CHECK(memcmp(ref_alone, alone, sizeof alone) == 0);
            CHECK(memcmp(ref_attn, alone_attn, sizeof alone_attn) == 0);
        }
    }
    layer_weights_free(&lw);
}

/* ---------------------------------------------------------------------- */
/* validation                                                              */
/* ---------------------------------------------------------------------- */

#define CHECK_BAD(expr, name)                                                  \
    do {                                                                       \
        CHECK_EQ_INT((expr), CINFER_E_INVALID_ARG);                            \
        if (!strstr(cinfer_last_error(), (name))) {                            \
            fprintf(stderr, "%s:%d: error \"%s\" does not name \"%s\"\n",     \
                    __FILE__, __LINE__, cinfer_last_error(), (name));          \
            harness_failed_checks++;                                           \
        }                                                                      \
    } while (0)

static void validation_on(const factory *f)
{
    cinfer_backend *be = make_backend(f);
    const int n = 3, d = 64;
    cinfer_tensor *x = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
    cinfer_tensor *y = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
    cinfer_tensor *x16 = tnew(be, CINFER_DTYPE_F16, 2, n, d, 0, 0);
    cinfer_tensor *x4 = tnew(be, CINFER_DTYPE_F32, 2, n + 1, d, 0, 0);
    cinfer_tensor *wv = tnew(be, CINFER_DTYPE_F32, 1, d, 0, 0, 0);
    cinfer_tensor *wv2 = tnew(be, CINFER_DTYPE_F32, 1, d + 1, 0, 0, 0);
    float zeros[4 * 64] = {0};
    cinfer_tensor *ro = wnew(be, CINFER_DTYPE_F32, 2, n, d, zeros);
    CHECK_OK(cinfer_backend_fill_zero(be, x));
    CHECK_OK(cinfer_backend_fill_zero(be, y));
    CHECK_OK(cinfer_backend_fill_zero(be, wv));

    /* ops that need a step refuse to run without one */
    CHECK_BAD(cinfer_backend_embed(be, ro, x), "embed");
    CHECK_BAD(cinfer_backend_rope(be, x, 1, 64, 64, 1e4f, CINFER_ROPE_NORM), "rope");
    CHECK_BAD(cinfer_backend_gather_rows(be, x, y), "gather_rows");

    /* elementwise ops */
    CHECK_BAD(cinfer_backend_rms_norm(be, x16, wv, 1e-5f, x), "rms_norm");
    CHECK_BAD(cinfer_backend_rms_norm(be, x, wv2, 1e-5f, y), "rms_norm");
    CHECK_BAD(cinfer_backend_rms_norm(be, x, wv, 1e-5f, x4), "rms_norm");
    CHECK_BAD(cinfer_backend_rms_norm(be, x, wv, -1.0f, y), "rms_norm");
    CHECK_BAD(cinfer_backend_rms_norm(be, x, wv, 1e-5f, ro), "rms_norm");
    CHECK_BAD(cinfer_backend_rms_norm(be, NULL, wv, 1e-5f, y), "rms_norm");
    CHECK_BAD(cinfer_backend_add(be, x, x4, y), "add");
    CHECK_BAD(cinfer_backend_add(be, x16, x, y), "add");
    CHECK_BAD(cinfer_backend_add(be, x, y, ro), "add");
    CHECK_BAD(cinfer_backend_add_bias(be, x, wv2), "add_bias");
    CHECK_BAD(cinfer_backend_add_bias(be, ro, wv), "add_bias");
    CHECK_BAD(cinfer_backend_silu_mul(be, x, x4, y), "silu_mul");
    CHECK_BAD(cinfer_backend_silu_mul(be, x, y, x16), "silu_mul");

    /* matmul */
    const cinfer_tensor *w1[1] = {ro};
    cinfer_tensor *o1[1] = {y};
    CHECK_BAD(cinfer_backend_matmul(be, 1, w1, x, o1), "out[0]"); /* want [3, 3] */
    cinfer_tensor *o33 = tnew(be, CINFER_DTYPE_F32, 2, n, n, 0, 0);
    o1[0] = o33;
    CHECK_OK(cinfer_backend_matmul(be, 1, w1, x, o1));
    cinfer_tensor *w_in = tnew(be, CINFER_DTYPE_F32, 2, 5, d + 32, 0, 0);
    cinfer_tensor *q81 = tnew(be, CINFER_DTYPE_Q8_1, 2, 5, d, 0, 0);
    cinfer_tensor *o35 = tnew(be, CINFER_DTYPE_F32, 2, n, 5, 0, 0);
    const cinfer_tensor *wbad[1] = {w_in};
    cinfer_tensor *obad[1] = {o35};
    CHECK_BAD(cinfer_backend_matmul(be, 1, wbad, x, obad), "matmul");
    wbad[0] = q81;
    CHECK_BAD(cinfer_backend_matmul(be, 1, wbad, x, obad), "matmul");
    CHECK_BAD(cinfer_backend_matmul(be, 0, w1, x, o1), "matmul");
    CHECK_BAD(cinfer_backend_matmul(be, 5, w1, x, o1), "matmul");
    cinfer_tensor *oalias[1] = {x};
    const cinfer_tensor *wsq[1] = {ro};
    CHECK_BAD(cinfer_backend_matmul(be, 1, wsq, x, oalias), "matmul");
    cinfer_tensor *x33 = tnew(be, CINFER_DTYPE_F32, 2, n, n, 0, 0);
    CHECK_OK(cinfer_backend_fill_zero(be, x33));
    CHECK_OK(cinfer_backend_fill_zero(be, o33));
    const cinfer_tensor *wself[1] = {o33};
    cinfer_tensor *oself[1] = {o33};
    CHECK_BAD(cinfer_backend_matmul(be, 1, wself, x33, oself), "aliases w[0]");
    cinfer_backend_tensor_destroy(be, x33);

    /* step metadata */
    step_buf sb;
    step_init(&sb, 2, 4);
    sb.tables[0] = 0;
    sb.tables[1] = 1;
    sb.tables[MAX_BLOCKS] = 2;
    step_row(&sb, 0, 4, 1);
    step_row(&sb, 1, 0, 2);
    step_row(&sb, 0, 5, 3);
    step_all_out(&sb);
    CHECK_OK(cinfer_backend_set_step(be, &sb.s));
    step_buf bad;
#define RESET_BAD()                                                            \
    do {                                                                       \
        bad = sb;                                                              \
        bad.s.tokens = bad.tokens;                                             \
        bad.s.positions = bad.positions;                                       \
        bad.s.row_seq = bad.row_seq;                                           \
        bad.s.slots = bad.slots;                                               \
        bad.s.block_tables = bad.tables;                                       \
        bad.s.out_rows = bad.out_rows;                                         \
    } while (0)
    RESET_BAD();
    bad.s.n_rows = 0;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "n_rows");
    RESET_BAD();
    bad.row_seq[1] = 2;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "row_seq");
    RESET_BAD();
    bad.positions[2] = -1;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "positions");
    RESET_BAD();
    bad.positions[2] = MAX_BLOCKS * 4;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "positions");
    RESET_BAD();
    bad.tokens[0] = -5;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "tokens");
    RESET_BAD();
    bad.out_rows[1] = 2;
    bad.out_rows[2] = 1;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "out_rows");
    RESET_BAD();
    bad.out_rows[1] = 0;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "out_rows");
    RESET_BAD();
    bad.out_rows[2] = 3;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "out_rows");
    RESET_BAD();
    bad.slots[2] = bad.slots[0];
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "slot");
    RESET_BAD();
    bad.slots[1] = -1;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "slots");
    RESET_BAD();
    bad.s.n_seqs = 0;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "n_seqs");
    RESET_BAD();
    bad.s.block_tables = NULL;
    CHECK_BAD(cinfer_backend_set_step(be, &bad.s), "set_step");
    CHECK_BAD(cinfer_backend_set_step(be, NULL), "set_step");

    /* the good step is still in force after the failed ones */
    cinfer_tensor *g = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
    CHECK_OK(cinfer_backend_gather_rows(be, x, g));
    CHECK_BAD(cinfer_backend_gather_rows(be, x, x4), "gather_rows");
    CHECK_BAD(cinfer_backend_gather_rows(be, x, x), "gather_rows");

    /* embed: wrong out shape, dtype */
    uint8_t table[10 * 68];
    memset(table, 0, sizeof table);
    cinfer_tensor *emb = wnew(be, CINFER_DTYPE_Q8_0, 2, 10, d, table);
    CHECK_OK(cinfer_backend_embed(be, emb, x));
    CHECK_BAD(cinfer_backend_embed(be, emb, x4), "embed");
    CHECK_BAD(cinfer_backend_embed(be, emb, x16), "embed");
    CHECK_BAD(cinfer_backend_embed(be, emb, ro), "embed");
    cinfer_tensor *small = wnew(be, CINFER_DTYPE_Q8_0, 2, 3, d, table);
    CHECK_BAD(cinfer_backend_embed(be, small, x), "step.tokens[2]");

    /* rope */
    CHECK_BAD(cinfer_backend_rope(be, x, 2, 32, 33, 1e4f, CINFER_ROPE_NORM), "rope");
    CHECK_BAD(cinfer_backend_rope(be, x, 2, 32, 34, 1e4f, CINFER_ROPE_NORM), "rope");
    CHECK_BAD(cinfer_backend_rope(be, x, 3, 32, 32, 1e4f, CINFER_ROPE_NORM), "rope");
    CHECK_BAD(cinfer_backend_rope(be, x, 2, 32, 32, 1e4f, (cinfer_rope_mode)1), "rope");
    CHECK_BAD(cinfer_backend_rope(be, x, 2, 32, 32, 0.0f, CINFER_ROPE_NEOX), "rope");
    {
        float bad_ff[16];
        for (int i = 0; i < 16; i++)
            bad_ff[i] = 1.0f;
        bad_ff[9] = 0.0f;
        cinfer_rope_params rp = {.theta = 1e4f, .freq_scale = 0.0f,
                                 .freq_factors = NULL,
                                 .mode = CINFER_ROPE_NORM};
        CHECK_BAD(cinfer_backend_rope_ext(be, x, 2, 32, 32, &rp), "freq_scale");
        rp.freq_scale = 1.0f;
        rp.freq_factors = bad_ff;
        CHECK_BAD(cinfer_backend_rope_ext(be, x, 2, 32, 32, &rp),
                  "freq_factors[9]");
        CHECK_BAD(cinfer_backend_rope_ext(be, x, 2, 32, 32, NULL), "rope");
    }
    CHECK_OK(cinfer_backend_rope(be, x, 2, 32, 32, 1e4f, CINFER_ROPE_NEOX));

    /* kv_store and attention */
    cinfer_tensor *kc = tnew(be, CINFER_DTYPE_F16, 4, 3, 4, 2, 32);
    cinfer_tensor *vc = tnew(be, CINFER_DTYPE_F16, 4, 3, 4, 2, 32);
    cinfer_tensor *kc8 = tnew(be, CINFER_DTYPE_F16, 4, 3, 8, 2, 32);
    cinfer_tensor *kcq = tnew(be, CINFER_DTYPE_Q8_0, 4, 3, 4, 2, 32);
    cinfer_tensor *vc1 = tnew(be, CINFER_DTYPE_F16, 4, 3, 4, 1, 64);
    CHECK_OK(cinfer_backend_fill_zero(be, kc));
    CHECK_OK(cinfer_backend_fill_zero(be, vc));
    CHECK_OK(cinfer_backend_kv_store(be, x, y, kc, vc));
    CHECK_BAD(cinfer_backend_kv_store(be, x, y, kc8, vc), "kv_store");
    CHECK_BAD(cinfer_backend_kv_store(be, x, y, kcq, vc), "kv_store");
    CHECK_BAD(cinfer_backend_kv_store(be, x, y, kc, vc1), "kv_store");
    CHECK_BAD(cinfer_backend_kv_store(be, x4, y, kc, vc), "kv_store");
    CHECK_BAD(cinfer_backend_kv_store(be, x16, y, kc, vc), "kv_store");
    CHECK_BAD(cinfer_backend_kv_store(be, x, y, kc, kc), "kv_store");
    CHECK_OK(cinfer_backend_attention(be, x, kc, vc, 2, 2, 32, 0.2f, y));
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc, 2, 1, 32, 0.2f, y), "k_cache");
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc, 3, 2, 32, 0.2f, y), "attention");
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc, 2, 2, 32, 0.2f, x), "attention");
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc1, 2, 2, 32, 0.2f, y), "attention");
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc, 2, 2, 32, NAN, y), "attention");
    CHECK_BAD(cinfer_backend_attention(be, x4, kc, vc, 2, 2, 32, 0.2f, y), "attention");
    CHECK_BAD(cinfer_backend_attention(be, x, kc, vc, 2, 2, 32, 0.2f, ro), "attention");

    /* after all that, the backend still computes */
    CHECK_OK(cinfer_backend_add(be, x, y, y));

    cinfer_tensor *ts[] = {x,   y,     x16, x4,  wv,  wv2, ro,
                           o33, w_in,  q81, o35, g,   emb, small,
                           kc,  vc,    kc8, kcq, vc1};
    for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
        cinfer_backend_tensor_destroy(be, ts[i]);
    cinfer_backend_destroy(be);
}

/* The checks live in backend.c, so every backend gets them. */
static void test_validation(void)
{
    for (int i = 0; i < g_n_factories; i++) {
        int before = harness_failed_checks;
        validation_on(&g_factories[i]);
        if (harness_failed_checks != before)
            fprintf(stderr, "validation failed on %s\n", g_factories[i].name);
    }
}

/* The worst NMSE per op of the backends held to NMSE bounds. */
static void print_worst(void)
{
    for (int i = 0; i < g_n_worst; i++)
        fprintf(stderr, "worst NMSE %-12s %.3g\n", g_worst[i].op,
                g_worst[i].worst);
}

int main(void)
{
    init_seed();
    init_factories();
    for (int i = 0; i < g_n_factories; i++)
        fprintf(stderr, "factory %s\n", g_factories[i].name);
    RUN(test_create);
    RUN(test_tensors);
    RUN(test_embed);
    RUN(test_rowwise);
    RUN(test_add_rms_norm);
    RUN(test_rope_kv_store);
    RUN(test_mma_fragments);
    RUN(test_mma_f_fragments);
    RUN(test_dense_mma);
    RUN(test_mmq_kernels);
    RUN(test_rms_norm_groups);
    RUN(test_rowwise_large);
    RUN(test_silu_range);
    RUN(test_step_ops_large);
    RUN(test_rope);
    RUN(test_kv_store);
    RUN(test_matmul);
    RUN(test_matmul_silu_mul);
    RUN(test_attention);
    RUN(test_gelu_scale);
    RUN(test_greedy);
    RUN(test_choose);
    RUN(test_edit_logits);
    RUN(test_logprobs_op);
    RUN(test_sampler_weights);
    RUN(test_validation);
    /* CPU only: the packing and the bit identities are the CPU backend's
     * promises (the cudasim build runs one CPU factory, as a reference). */
    if (!g_cudasim_build) {
        RUN(test_weight_copies);
        RUN(test_batch_invariance);
    }
    print_worst();
    return harness_done();
}
