/*
 * test_backend_ops.c - the CPU backend's ops table (kernels/backend.h).
 *
 * Every op is run for each ISA this processor supports (portable, AVX2,
 * AVX-512) with 1 and 3 threads, on random data of awkward sizes, and
 * compared with a float64 reference written here from the op's definition:
 *   - embed for F32, F16, BF16, Q8_0, Q4_0, Q4_1 tables (the reference
 *     decodes the block layouts itself);
 *   - rms_norm, add, add_bias, silu_mul, gather_rows, rope (NORM and NEOX,
 *     full and partial rotation), kv_store into F16 and F32 caches;
 *   - matmul with weights of several types in one call (float64 reference
 *     over the dequantized weights and activations);
 *   - paged attention over several sequences in one step with their own
 *     non-contiguous block tables and lengths, prefill and decode rows
 *     interleaved, GQA ratios 1, 3 and 4, F16 and F32 caches.
 * Batch invariance: a small transformer layer built from the ops gives a
 * row bit-identical results alone or in a batch of 7, and with 1 or 3
 * threads. Bad arguments (dtype, shape, step indices, read-only outputs)
 * return CINFER_E_INVALID_ARG naming the op, and leave the backend usable.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/backend.h"

/* ---------------------------------------------------------------------- */
/* helpers                                                                 */
/* ---------------------------------------------------------------------- */

typedef struct {
    cinfer_cpu_isa isa;
    int n_threads;
} config;

static config g_configs[6];
static int g_n_configs;

static void init_configs(void)
{
    static const cinfer_cpu_isa isas[] = {CINFER_CPU_ISA_PORTABLE,
                                          CINFER_CPU_ISA_AVX2,
                                          CINFER_CPU_ISA_AVX512};
    for (int i = 0; i < 3; i++) {
        if (!cinfer_cpu_isa_supported(isas[i]))
            continue;
        g_configs[g_n_configs++] = (config){isas[i], 1};
        g_configs[g_n_configs++] = (config){isas[i], 3};
    }
}

static cinfer_backend *make_backend(config c)
{
    cinfer_backend_cpu_params p = cinfer_backend_cpu_default_params();
    p.isa = c.isa;
    p.n_threads = c.n_threads;
    cinfer_backend *be = NULL;
    CHECK_OK(cinfer_backend_cpu_create(&p, &be));
    CINFER_ASSERT(be != NULL);
    return be;
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

static float *randv(int64_t n, uint64_t *seed, float scale)
{
    float *v = malloc(sizeof(float) * (size_t)(n > 0 ? n : 1));
    CINFER_ASSERT(v);
    for (int64_t i = 0; i < n; i++)
        v[i] = harness_randf(seed) * scale;
    return v;
}

/* Largest |got - want| over n values, and a failure message if > tol. */
static void check_close(const char *what, config c, const float *got,
                        const double *want, int64_t n, double tol)
{
    double worst = 0.0;
    int64_t at = 0;
    for (int64_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - want[i]);
        if (!(e <= worst)) {
            worst = e;
            at = i;
        }
    }
    if (!(worst <= tol)) {
        fprintf(stderr, "%s [%s, %d threads]: element %lld is %.9g, want %.9g "
                        "(error %.3g > tol %.3g)\n",
                what, cinfer_cpu_isa_name(c.isa), c.n_threads, (long long)at,
                (double)got[at], want[at], worst, tol);
        harness_failed_checks++;
    }
}

/* A step under construction: arrays sized for the tests here. */
#define MAX_ROWS 256
#define MAX_SEQS 4
#define MAX_BLOCKS 32

typedef struct {
    int32_t tokens[MAX_ROWS], positions[MAX_ROWS], row_seq[MAX_ROWS];
    int32_t slots[MAX_ROWS], out_rows[MAX_ROWS];
    int32_t tables[MAX_SEQS * MAX_BLOCKS];
    cinfer_step s;
} step_buf;

static void step_init(step_buf *b, int n_seqs, int block_size)
{
    memset(b, 0, sizeof *b);
    for (int i = 0; i < MAX_SEQS * MAX_BLOCKS; i++)
        b->tables[i] = -1; /* unused entries: must never be read */
    b->s.n_seqs = n_seqs;
    b->s.block_size = block_size;
    b->s.max_blocks = MAX_BLOCKS;
    b->s.tokens = b->tokens;
    b->s.positions = b->positions;
    b->s.row_seq = b->row_seq;
    b->s.slots = b->slots;
    b->s.block_tables = b->tables;
    b->s.out_rows = b->out_rows;
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

    for (int i = 0; i < g_n_configs; i++) {
        be = make_backend(g_configs[i]);
        char want[64];
        snprintf(want, sizeof want, "cpu: %d thread%s, %s",
                 g_configs[i].n_threads, g_configs[i].n_threads == 1 ? "" : "s",
                 cinfer_cpu_isa_name(g_configs[i].isa));
        CHECK_EQ_STR(cinfer_backend_device_desc(be), want);
        CHECK_EQ_INT(cinfer_backend_cpu_isa(be), g_configs[i].isa);
        cinfer_backend_destroy(be);
    }

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
        cinfer_status st = cinfer_backend_cpu_create(&p, &be);
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
    cinfer_backend *be = make_backend(g_configs[0]);
    int64_t shape[3] = {3, 5, 64};
    cinfer_tensor_desc d = cinfer_tensor_desc_make(CINFER_DTYPE_Q8_0, 3, shape);
    CHECK_EQ_INT(cinfer_tensor_desc_nelems(&d), 3 * 5 * 64);
    CHECK_EQ_INT(cinfer_tensor_desc_nbytes(&d), 15 * 2 * 34);
    d.shape[2] = 33;
    CHECK_EQ_INT(cinfer_tensor_desc_nbytes(&d), 0);

    cinfer_tensor *t = tnew(be, CINFER_DTYPE_F32, 2, 7, 769, 0, 0);
    CHECK_EQ_INT(tbytes(t), 7 * 769 * 4);
    CHECK_EQ_INT(cinfer_tensor_get_desc(t)->shape[1], 769);
    uint64_t seed = 1;
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

    /* a weight reads the caller's memory in place and is read-only */
    cinfer_tensor *w = wnew(be, CINFER_DTYPE_F32, 2, 7, 769, x);
    x[5] = 42.0f;
    float got5;
    CHECK_OK(cinfer_backend_download(be, w, 5 * 4, &got5, 4));
    CHECK(got5 == 42.0f);
    CHECK_EQ_INT(cinfer_backend_upload(be, w, 0, part, 4), CINFER_E_INVALID_ARG);
    CHECK_EQ_INT(cinfer_backend_fill_zero(be, w), CINFER_E_INVALID_ARG);
    cinfer_backend_tensor_destroy(be, w);

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

/* Embeds toks[0..n) (one sequence) into a new [n, d] tensor *out; returns
 * its contents (malloc'd). sb keeps the step for the caller. */
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
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        for (int ti = 0; ti < 6; ti++) {
            cinfer_dtype dt = types[ti];
            int64_t vocab = 37;
            int64_t d = cinfer_dtype_block_elems(dt) > 1 ? 800 : 769;
            size_t rb = cinfer_dtype_row_bytes(dt, d);
            uint64_t seed = 7 + (uint64_t)ti;
            float *src = randv(vocab * d, &seed, 2.0f);
            uint8_t *table = malloc(rb * (size_t)vocab);
            for (int64_t v = 0; v < vocab; v++)
                cinfer_quantize_row(dt, src + v * d, table + v * rb, d);
            cinfer_tensor *tt = wnew(be, dt, 2, vocab, d, table);

            step_buf sb;
            static const int toks[] = {36, 0, 5, 5, 17, 1, 36, 2, 30};
            cinfer_tensor *out = NULL;
            float *got = embed_tokens(be, tt, &sb, toks, 9, &out);
            double *want = malloc(sizeof(double) * 9 * (size_t)d);
            for (int r = 0; r < 9; r++)
                for (int64_t i = 0; i < d; i++)
                    want[r * d + i] = ref_elem(dt, table + toks[r] * rb, i);
            char what[32];
            snprintf(what, sizeof what, "embed %s", cinfer_dtype_name(dt));
            check_close(what, c, got, want, 9 * d, 1e-6);

            /* a token past the table is an error */
            sb.tokens[4] = (int32_t)vocab;
            CHECK_OK(cinfer_backend_set_step(be, &sb.s));
            CHECK_EQ_INT(cinfer_backend_embed(be, tt, out), CINFER_E_INVALID_ARG);
            CHECK(strstr(cinfer_last_error(), "embed") != NULL);

            cinfer_backend_tensor_destroy(be, out);
            cinfer_backend_tensor_destroy(be, tt);
            free(got);
            free(want);
            free(table);
            free(src);
        }
        cinfer_backend_destroy(be);
    }
}

/* Q8_0 / Q4_0 / Q4_1 matrices are packed into the backend's own memory on
 * the AVX-512 path (weight_borrows 0): they read back as the bytes they
 * were created from, and keep working after the caller's copy is
 * overwritten. Other weights are used in place (weight_borrows 1). */
static void check_weight_copies(cinfer_dtype wt)
{
    const int64_t rows = 37, d = 800;
    const size_t rb = cinfer_dtype_row_bytes(wt, d);
    const size_t nbytes = rb * (size_t)rows;
    uint64_t seed = 5;
    float *src = randv(rows * d, &seed, 2.0f);
    uint8_t *table = malloc(nbytes), *copy = malloc(nbytes), *back = malloc(nbytes);
    CINFER_ASSERT(table && copy && back);
    for (int64_t v = 0; v < rows; v++)
        cinfer_quantize_row(wt, src + v * d, table + v * rb, d);
    memcpy(copy, table, nbytes);
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tt = wnew(be, wt, 2, rows, d, table);
        cinfer_tensor *tf = wnew(be, CINFER_DTYPE_F32, 2, 2, 16, src);
        int packed = c.isa == CINFER_CPU_ISA_AVX512;
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
        step_buf sb;
        static const int toks[] = {36, 0, 9, 31, 32};
        cinfer_tensor *out = NULL;
        float *got = embed_tokens(be, tt, &sb, toks, 5, &out);
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
    free(back);
    free(copy);
    free(table);
    free(src);
}

static void test_weight_copies(void)
{
    check_weight_copies(CINFER_DTYPE_Q8_0);
    check_weight_copies(CINFER_DTYPE_Q4_0);
    check_weight_copies(CINFER_DTYPE_Q4_1);
}

/* ---------------------------------------------------------------------- */
/* rms_norm, add, add_bias, silu_mul, gather_rows                          */
/* ---------------------------------------------------------------------- */

static void test_rowwise(void)
{
    const int64_t n = 5, d = 769;
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        uint64_t seed = 99;
        float *x = randv(n * d, &seed, 3.0f);
        float *y = randv(n * d, &seed, 3.0f);
        float *w = randv(d, &seed, 1.5f);
        float *got = malloc(sizeof(float) * (size_t)(n * d));
        double *want = malloc(sizeof(double) * (size_t)(n * d));
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *ty = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, d, 0, 0);
        cinfer_tensor *tw = wnew(be, CINFER_DTYPE_F32, 1, d, 0, w);

        /* rms_norm, into a new tensor and in place */
        for (int r = 0; r < n; r++) {
            double ss = 0;
            for (int i = 0; i < d; i++)
                ss += (double)x[r * d + i] * x[r * d + i];
            double s = 1.0 / sqrt(ss / (double)d + 1e-5);
            for (int i = 0; i < d; i++)
                want[r * d + i] = x[r * d + i] * s * w[i];
        }
        put(be, tx, x);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-5f, to));
        get(be, to, got);
        check_close("rms_norm", c, got, want, n * d, 2e-6 * 8);
        CHECK_OK(cinfer_backend_rms_norm(be, tx, tw, 1e-5f, tx));
        get(be, tx, got);
        check_close("rms_norm in place", c, got, want, n * d, 2e-6 * 8);

        /* add (out aliasing b), add_bias */
        put(be, tx, x);
        put(be, ty, y);
        CHECK_OK(cinfer_backend_add(be, tx, ty, ty));
        get(be, ty, got);
        for (int i = 0; i < n * d; i++)
            want[i] = (double)x[i] + y[i];
        check_close("add", c, got, want, n * d, 1e-6);
        CHECK_OK(cinfer_backend_add_bias(be, tx, tw));
        get(be, tx, got);
        for (int i = 0; i < n * d; i++)
            want[i] = (double)x[i] + w[i % d];
        check_close("add_bias", c, got, want, n * d, 1e-6);

        /* silu_mul, out aliasing gate */
        put(be, tx, x);
        put(be, ty, y);
        CHECK_OK(cinfer_backend_silu_mul(be, tx, ty, tx));
        get(be, tx, got);
        for (int i = 0; i < n * d; i++)
            want[i] = (double)x[i] / (1.0 + exp(-(double)x[i])) * y[i];
        check_close("silu_mul", c, got, want, n * d, 1e-5);

        /* gather_rows */
        step_buf sb;
        step_init(&sb, 1, 16);
        sb.tables[0] = 0;
        for (int r = 0; r < n; r++)
            step_row(&sb, 0, r, 1);
        sb.s.n_out = 3;
        sb.out_rows[0] = 0;
        sb.out_rows[1] = 2;
        sb.out_rows[2] = 4;
        CHECK_OK(cinfer_backend_set_step(be, &sb.s));
        put(be, tx, x);
        cinfer_tensor *tg = tnew(be, CINFER_DTYPE_F32, 2, 3, d, 0, 0);
        CHECK_OK(cinfer_backend_gather_rows(be, tx, tg));
        get(be, tg, got);
        for (int j = 0; j < 3; j++)
            for (int i = 0; i < d; i++)
                want[j * d + i] = x[sb.out_rows[j] * d + i];
        check_close("gather_rows", c, got, want, 3 * d, 0.0);

        cinfer_backend_tensor_destroy(be, tg);
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, ty);
        cinfer_backend_tensor_destroy(be, to);
        cinfer_backend_tensor_destroy(be, tw);
        free(x);
        free(y);
        free(w);
        free(got);
        free(want);
        cinfer_backend_destroy(be);
    }
}

/* Large batches take the threaded paths of the elementwise ops; 1 and 3
 * threads give the same bits. */
static void test_rowwise_large(void)
{
    const int64_t n = 67, d = 1031;
    uint64_t seed = 5;
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
    for (int ci = 0; ci < g_n_configs; ci++) {
        cinfer_backend *be = make_backend(g_configs[ci]);
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
        check_close("elementwise chain", g_configs[ci], got, want, n * d, 1e-5);
        if (ci > 0 && g_configs[ci].isa == g_configs[ci - 1].isa)
            CHECK(memcmp(prev, got, sizeof(float) * (size_t)(n * d)) == 0);
        free(prev);
        prev = got;
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_tensor_destroy(be, ty);
        cinfer_backend_tensor_destroy(be, tw);
        cinfer_backend_destroy(be);
    }
    free(prev);
    free(want);
    free(x);
    free(y);
    free(w);
}

/* silu over the whole float range: the vector exp stays within a few ulp,
 * saturates without NaN and keeps NaN. */
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
    for (int ci = 0; ci < g_n_configs; ci++) {
        cinfer_backend *be = make_backend(g_configs[ci]);
        cinfer_tensor *tg = tnew(be, CINFER_DTYPE_F32, 2, 1, N, 0, 0);
        cinfer_tensor *tu = tnew(be, CINFER_DTYPE_F32, 2, 1, N, 0, 0);
        put(be, tg, g);
        put(be, tu, u);
        CHECK_OK(cinfer_backend_silu_mul(be, tg, tu, tg));
        get(be, tg, got);
        int bad = 0;
        for (int i = 0; i < N; i++) {
            double tol = 4e-7 * fabs(want[i]) + 1e-36;
            if (!(fabs(got[i] - want[i]) <= tol)) {
                if (bad++ < 3)
                    fprintf(stderr, "silu(%g) [%s] = %.9g, want %.9g\n",
                            (double)g[i], cinfer_cpu_isa_name(g_configs[ci].isa),
                            (double)got[i], want[i]);
            }
        }
        CHECK_EQ_INT(bad, 0);
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
}

/* The step ops on a batch big enough to be split over the threads. */
static void test_step_ops_large(void)
{
    enum { N = 67, NH = 8, HD = 128, W = NH * HD, VOCAB = 40, BS = 4 };
    enum { NBLK = 30, NOUT = 40 };
    uint64_t seed = 8;
    float *src = randv(VOCAB * W, &seed, 1.0f);
    size_t rb = cinfer_dtype_row_bytes(CINFER_DTYPE_Q4_1, W);
    uint8_t *table = malloc(rb * VOCAB);
    for (int v = 0; v < VOCAB; v++)
        cinfer_quantize_row(CINFER_DTYPE_Q4_1, src + v * W, table + v * rb, W);
    float *vv = randv(N * W, &seed, 1.0f);
    step_buf sb;
    step_init(&sb, 3, BS);
    for (int s = 0; s < 3; s++)
        for (int b = 0; b < 9; b++)
            sb.tables[s * MAX_BLOCKS + b] = (s * 9 + b) * 7 % NBLK;
    for (int r = 0; r < N; r++)
        step_row(&sb, r % 3, r / 3 + 5 * (r % 3), (r * 13) % VOCAB);
    sb.s.n_out = NOUT;
    for (int j = 0; j < NOUT; j++)
        sb.out_rows[j] = j + (j * 27) / NOUT;

    /* references */
    double *want_embed = malloc(sizeof(double) * N * W);
    double *want_rope = malloc(sizeof(double) * N * W);
    for (int r = 0; r < N; r++)
        for (int i = 0; i < W; i++)
            want_embed[r * W + i] = ref_elem(CINFER_DTYPE_Q4_1,
                                             table + sb.tokens[r] * rb, i);
    float *emb_f = malloc(sizeof(float) * N * W);
    for (int r = 0; r < N; r++)
        for (int h = 0; h < NH; h++)
            for (int i = 0; i < HD / 2; i++) {
                const double *x = want_embed + r * W + h * HD;
                double th = sb.positions[r] * pow(10000.0, -2.0 * i / HD);
                want_rope[r * W + h * HD + i] =
                    x[i] * cos(th) - x[i + HD / 2] * sin(th);
                want_rope[r * W + h * HD + i + HD / 2] =
                    x[i] * sin(th) + x[i + HD / 2] * cos(th);
            }

    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        CHECK_OK(cinfer_backend_set_step(be, &sb.s));
        cinfer_tensor *tt = wnew(be, CINFER_DTYPE_Q4_1, 2, VOCAB, W, table);
        cinfer_tensor *x = tnew(be, CINFER_DTYPE_F32, 2, N, W, 0, 0);
        cinfer_tensor *v = tnew(be, CINFER_DTYPE_F32, 2, N, W, 0, 0);
        cinfer_tensor *g = tnew(be, CINFER_DTYPE_F32, 2, NOUT, W, 0, 0);
        cinfer_tensor *kc = tnew(be, CINFER_DTYPE_F16, 4, NBLK, BS, NH, HD);
        cinfer_tensor *vc = tnew(be, CINFER_DTYPE_F32, 4, NBLK, BS, NH, HD);
        float *got = malloc(sizeof(float) * N * W);
        CHECK_OK(cinfer_backend_embed(be, tt, x));
        get(be, x, got);
        check_close("embed large", c, got, want_embed, N * W, 1e-6);
        memcpy(emb_f, got, sizeof(float) * N * W);
        CHECK_OK(cinfer_backend_rope(be, x, NH, HD, HD, 10000.0f, CINFER_ROPE_NEOX));
        get(be, x, got);
        for (int r = 0; r < N; r++)
            check_close("rope large", c, got + r * W, want_rope + r * W, W,
                        1e-5 + sb.positions[r] * 4e-7);
        put(be, v, vv);
        CHECK_OK(cinfer_backend_kv_store(be, x, v, kc, vc));
        uint16_t *kh = malloc(tbytes(kc));
        float *vh = malloc(tbytes(vc));
        get(be, kc, kh);
        get(be, vc, vh);
        int bad = 0;
        for (int r = 0; r < N; r++)
            for (int i = 0; i < W; i++) {
                bad += kh[(int64_t)sb.slots[r] * W + i] !=
                       cinfer_fp32_to_fp16(got[r * W + i]);
                bad += vh[(int64_t)sb.slots[r] * W + i] != vv[r * W + i];
            }
        CHECK_EQ_INT(bad, 0);
        put(be, x, emb_f);
        CHECK_OK(cinfer_backend_gather_rows(be, x, g));
        float *gg = malloc(sizeof(float) * NOUT * W);
        get(be, g, gg);
        bad = 0;
        for (int j = 0; j < NOUT; j++)
            bad += memcmp(gg + j * W, emb_f + sb.out_rows[j] * W,
                          sizeof(float) * W) != 0;
        CHECK_EQ_INT(bad, 0);
        free(gg);
        free(kh);
        free(vh);
        free(got);
        cinfer_tensor *ts[] = {tt, x, v, g, kc, vc};
        for (size_t i = 0; i < sizeof ts / sizeof ts[0]; i++)
            cinfer_backend_tensor_destroy(be, ts[i]);
        cinfer_backend_destroy(be);
    }
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
    } cases[] = {
        {64, 64, CINFER_ROPE_NORM, 10000.0f},
        {64, 64, CINFER_ROPE_NEOX, 1000000.0f},
        {40, 24, CINFER_ROPE_NORM, 10000.0f},
        {40, 24, CINFER_ROPE_NEOX, 500000.0f},
    };
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        step_buf sb;
        step_init(&sb, 1, 512);
        for (int b = 0; b < 9; b++)
            sb.tables[b] = b;
        for (int r = 0; r < n; r++)
            step_row(&sb, 0, pos[r], 0);
        CHECK_OK(cinfer_backend_set_step(be, &sb.s));
        for (int k = 0; k < 4; k++) {
            int hd = cases[k].head_dim, rd = cases[k].rot_dim;
            int64_t width = (int64_t)n_heads * hd;
            uint64_t seed = 31 + (uint64_t)k;
            float *x = randv(n * width, &seed, 1.0f);
            float *got = malloc(sizeof(float) * (size_t)(n * width));
            double *want = malloc(sizeof(double) * (size_t)(n * width));
            for (int r = 0; r < n; r++) {
                for (int h = 0; h < n_heads; h++) {
                    const float *xs = x + r * width + h * hd;
                    double *o = want + r * width + h * hd;
                    for (int i = 0; i < hd; i++)
                        o[i] = xs[i];
                    for (int i = 0; i < rd / 2; i++) {
                        double th = pos[r] * pow((double)cases[k].theta,
                                                 -2.0 * i / rd);
                        int i0 = cases[k].mode == CINFER_ROPE_NORM ? 2 * i : i;
                        int i1 = cases[k].mode == CINFER_ROPE_NORM ? 2 * i + 1
                                                                   : i + rd / 2;
                        o[i0] = xs[i0] * cos(th) - xs[i1] * sin(th);
                        o[i1] = xs[i0] * sin(th) + xs[i1] * cos(th);
                    }
                }
            }
            cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            put(be, tx, x);
            CHECK_OK(cinfer_backend_rope(be, tx, n_heads, hd, rd, cases[k].theta,
                                   cases[k].mode));
            get(be, tx, got);
            /* a second rope in the step reuses the cos/sin table */
            float *again = malloc(sizeof(float) * (size_t)(n * width));
            put(be, tx, x);
            CHECK_OK(cinfer_backend_rope(be, tx, n_heads, hd, rd, cases[k].theta,
                                   cases[k].mode));
            get(be, tx, again);
            CHECK(memcmp(again, got, sizeof(float) * (size_t)(n * width)) == 0);
            free(again);
            /* The angle is built by repeated float products (as GGML does),
             * so its error grows with the position: about pos * 2^-23. */
            for (int r = 0; r < n; r++) {
                char what[48];
                snprintf(what, sizeof what, "rope case %d row %d", k, r);
                check_close(what, c, got + r * width, want + r * width, width,
                            2e-6 + pos[r] * 4e-7);
                /* the unrotated tail is untouched */
                for (int h = 0; h < n_heads; h++)
                    CHECK(memcmp(got + r * width + h * hd + rd,
                                 x + r * width + h * hd + rd,
                                 sizeof(float) * (size_t)(hd - rd)) == 0);
            }
            cinfer_backend_tensor_destroy(be, tx);
            free(x);
            free(got);
            free(want);
        }
        cinfer_backend_destroy(be);
    }
}

/* ---------------------------------------------------------------------- */
/* kv_store                                                                */
/* ---------------------------------------------------------------------- */

static void test_kv_store(void)
{
    const int bs = 4, n_blocks = 6, n_kv = 3, hd = 20, n = 6;
    const int64_t width = n_kv * hd, n_slots = n_blocks * bs;
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        for (int f16 = 0; f16 < 2; f16++) {
            cinfer_dtype dt = f16 ? CINFER_DTYPE_F16 : CINFER_DTYPE_F32;
            size_t es = f16 ? 2 : 4;
            cinfer_tensor *kc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
            cinfer_tensor *vc = tnew(be, dt, 4, n_blocks, bs, n_kv, hd);
            uint8_t *sentinel = malloc(tbytes(kc));
            memset(sentinel, 0x5a, tbytes(kc));
            put(be, kc, sentinel);
            put(be, vc, sentinel);

            step_buf sb;
            step_init(&sb, 2, bs);
            sb.tables[0] = 4; /* seq 0: blocks 4, 1 */
            sb.tables[1] = 1;
            sb.tables[MAX_BLOCKS] = 3; /* seq 1: block 3 */
            step_row(&sb, 0, 2, 0);
            step_row(&sb, 1, 0, 0);
            step_row(&sb, 0, 3, 0);
            step_row(&sb, 0, 4, 0);
            step_row(&sb, 1, 1, 0);
            step_row(&sb, 0, 7, 0);
            CHECK_OK(cinfer_backend_set_step(be, &sb.s));
            uint64_t seed = 3;
            float *k = randv(n * width, &seed, 100.0f);
            float *v = randv(n * width, &seed, 0.01f);
            k[0] = 65519.0f; /* rounds to the largest half */
            k[1] = 1e-7f;    /* a half subnormal */
            cinfer_tensor *tk = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            cinfer_tensor *tv = tnew(be, CINFER_DTYPE_F32, 2, n, width, 0, 0);
            put(be, tk, k);
            put(be, tv, v);
            CHECK_OK(cinfer_backend_kv_store(be, tk, tv, kc, vc));
            uint8_t *gk = malloc(tbytes(kc)), *gv = malloc(tbytes(vc));
            get(be, kc, gk);
            get(be, vc, gv);
            int bad = 0;
            for (int64_t s = 0; s < n_slots; s++) {
                int row = -1;
                for (int r = 0; r < n; r++)
                    if (sb.slots[r] == s)
                        row = r;
                for (int64_t i = 0; i < width; i++) {
                    size_t off = (size_t)(s * width + i) * es;
                    for (int kv = 0; kv < 2; kv++) {
                        const uint8_t *cache = kv ? gv : gk;
                        if (row < 0) { /* untouched */
                            bad += memcmp(cache + off, sentinel, es) != 0;
                            continue;
                        }
                        float src = (kv ? v : k)[row * width + i];
                        if (f16) {
                            uint16_t h;
                            memcpy(&h, cache + off, 2);
                            /* round to nearest: within half a unit */
                            double e = fabs(cinfer_fp16_to_fp32(h) - (double)src);
                            double ulp = fmax(fabs(src) * pow(2, -10),
                                              pow(2, -24));
                            bad += !(e <= ulp / 2);
                            bad += h != cinfer_fp32_to_fp16(src);
                        } else {
                            bad += memcmp(cache + off, &src, 4) != 0;
                        }
                    }
                }
            }
            CHECK_EQ_INT(bad, 0);

            /* a slot past the cache is an error */
            sb.slots[3] = (int32_t)n_slots;
            CHECK_OK(cinfer_backend_set_step(be, &sb.s));
            CHECK_EQ_INT(cinfer_backend_kv_store(be, tk, tv, kc, vc),
                         CINFER_E_INVALID_ARG);
            CHECK(strstr(cinfer_last_error(), "kv_store") != NULL);

            free(gk);
            free(gv);
            free(k);
            free(v);
            free(sentinel);
            cinfer_backend_tensor_destroy(be, tk);
            cinfer_backend_tensor_destroy(be, tv);
            cinfer_backend_tensor_destroy(be, kc);
            cinfer_backend_tensor_destroy(be, vc);
        }
        cinfer_backend_destroy(be);
    }
}

/* ---------------------------------------------------------------------- */
/* matmul                                                                  */
/* ---------------------------------------------------------------------- */

static void test_matmul(void)
{
    const int64_t n = 7, n_in = 800;
    static const cinfer_dtype wts[] = {CINFER_DTYPE_Q4_1, CINFER_DTYPE_Q8_0,
                                       CINFER_DTYPE_F32, CINFER_DTYPE_F16,
                                       CINFER_DTYPE_BF16, CINFER_DTYPE_Q4_0};
    static const int64_t n_outs[] = {50, 33, 17, 1, 96, 130};
    uint64_t seed = 11;
    float *x = randv(n * n_in, &seed, 2.0f);
    uint8_t *w[6];
    for (int i = 0; i < 6; i++) {
        float *src = randv(n_outs[i] * n_in, &seed, 0.5f);
        size_t rb = cinfer_dtype_row_bytes(wts[i], n_in);
        w[i] = malloc(rb * (size_t)n_outs[i]);
        for (int64_t o = 0; o < n_outs[i]; o++)
            cinfer_quantize_row(wts[i], src + o * n_in, w[i] + o * rb, n_in);
        free(src);
    }
    for (int ci = 0; ci < g_n_configs; ci++) {
        config c = g_configs[ci];
        cinfer_backend *be = make_backend(c);
        cinfer_tensor *tx = tnew(be, CINFER_DTYPE_F32, 2, n, n_in, 0, 0);
        put(be, tx, x);
        cinfer_tensor *tw[6], *to[6], *tsolo[6];
        for (int i = 0; i < 6; i++) {
            tw[i] = wnew(be, wts[i], 2, n_outs[i], n_in, w[i]);
            to[i] = tnew(be, CINFER_DTYPE_F32, 2, n, n_outs[i], 0, 0);
            tsolo[i] = tnew(be, CINFER_DTYPE_F32, 2, n, n_outs[i], 0, 0);
        }
        /* two calls of up to 4 weights, mixing activation formats */
        const cinfer_tensor *wa[4] = {tw[0], tw[1], tw[2], tw[3]};
        cinfer_tensor *oa[4] = {to[0], to[1], to[2], to[3]};
        CHECK_OK(cinfer_backend_matmul(be, 4, wa, tx, oa));
        const cinfer_tensor *wb[2] = {tw[4], tw[5]};
        cinfer_tensor *ob[2] = {to[4], to[5]};
        CHECK_OK(cinfer_backend_matmul(be, 2, wb, tx, ob));

        for (int i = 0; i < 6; i++) {
            /* reference: dequantized weights times the activations in the
             * format paired with the weight type (as the kernels see them) */
            cinfer_dtype at = wts[i] == CINFER_DTYPE_Q4_1   ? CINFER_DTYPE_Q8_1
                              : wts[i] == CINFER_DTYPE_Q8_0 ? CINFER_DTYPE_Q8_0
                              : wts[i] == CINFER_DTYPE_Q4_0 ? CINFER_DTYPE_Q8_0
                                                            : wts[i];
            size_t arb = cinfer_dtype_row_bytes(at, n_in);
            size_t wrb = cinfer_dtype_row_bytes(wts[i], n_in);
            uint8_t *arow = malloc(arb * (size_t)n);
            float *xa = malloc(sizeof(float) * (size_t)(n * n_in));
            for (int r = 0; r < n; r++) {
                cinfer_quantize_row(at, x + r * n_in, arow + r * arb, n_in);
                cinfer_dequantize_row(at, arow + r * arb, xa + r * n_in, n_in);
            }
            double *want = malloc(sizeof(double) * (size_t)(n * n_outs[i]));
            double mag = 0;
            for (int r = 0; r < n; r++)
                for (int64_t o = 0; o < n_outs[i]; o++) {
                    const uint8_t *wrow = w[i] + o * wrb;
                    double s = 0, m = 0;
                    for (int64_t k = 0; k < n_in; k++) {
                        double wk = ref_elem(wts[i], wrow, k);
                        if (wts[i] == CINFER_DTYPE_Q4_1) {
                            /* x = d q + m: the m part pairs with the
                             * activation block's stored sum s (fp16) */
                            uint16_t mh;
                            memcpy(&mh, wrow + (k / 32) * 20 + 2, 2);
                            wk -= cinfer_fp16_to_fp32(mh);
                        }
                        double t = wk * xa[r * n_in + k];
                        s += t;
                        m += fabs(t);
                    }
                    if (wts[i] == CINFER_DTYPE_Q4_1) {
                        for (int64_t b = 0; b < n_in / 32; b++) {
                            const cinfer_block_q8_1 *ab =
                                (const cinfer_block_q8_1 *)(arow + r * arb) + b;
                            uint16_t mh;
                            memcpy(&mh, wrow + b * 20 + 2, 2);
                            double t = (double)cinfer_fp16_to_fp32(mh) *
                                       cinfer_fp16_to_fp32(ab->s);
                            s += t;
                            m += fabs(t);
                        }
                    }
                    want[r * n_outs[i] + o] = s;
                    mag = m > mag ? m : mag;
                }
            float *got = malloc(sizeof(float) * (size_t)(n * n_outs[i]));
            get(be, to[i], got);
            char what[32];
            snprintf(what, sizeof what, "matmul %s", cinfer_dtype_name(wts[i]));
            check_close(what, c, got, want, n * n_outs[i], mag * 1e-6);

            /* one weight at a time gives the same bits */
            const cinfer_tensor *w1[1] = {tw[i]};
            cinfer_tensor *o1[1] = {tsolo[i]};
            CHECK_OK(cinfer_backend_matmul(be, 1, w1, tx, o1));
            float *solo = malloc(sizeof(float) * (size_t)(n * n_outs[i]));
            get(be, tsolo[i], solo);
            CHECK(memcmp(solo, got, sizeof(float) * (size_t)(n * n_outs[i])) ==
                  0);
            free(solo);
            free(got);
            free(want);
            free(xa);
            free(arow);
        }
        for (int i = 0; i < 6; i++) {
            cinfer_backend_tensor_destroy(be, tw[i]);
            cinfer_backend_tensor_destroy(be, to[i]);
            cinfer_backend_tensor_destroy(be, tsolo[i]);
        }
        cinfer_backend_tensor_destroy(be, tx);
        cinfer_backend_destroy(be);
    }
    for (int i = 0; i < 6; i++)
        free(w[i]);
    free(x);
}

/* ---------------------------------------------------------------------- */
/* attention                                                               */
/* ---------------------------------------------------------------------- */

typedef struct {
    int n_heads, n_kv, hd, bs;
    cinfer_dtype kdt, vdt;
    float scale;
} attn_case;

/* The cache value a float becomes. */
static float as_stored(cinfer_dtype dt, float f)
{
    return dt == CINFER_DTYPE_F16 ? cinfer_fp16_to_fp32(cinfer_fp32_to_fp16(f))
                                  : f;
}

/* Returns the attention output (caller frees) for the bit comparison
 * across instruction sets. */
static float *attention_case(config c, const attn_case *ac)
{
    const int n_heads = ac->n_heads, n_kv = ac->n_kv, hd = ac->hd;
    const int bs = ac->bs, n_blocks = 40, n_seqs = 3;
    const int64_t kvw = (int64_t)n_kv * hd, qw = (int64_t)n_heads * hd;
    /* history lengths: seq 0 spans many blocks, seq 1 starts empty */
    const int hist[3] = {9 * bs + 3, 0, 2 * bs + 1};
    enum { MAXPOS = 160 };
    cinfer_backend *be = make_backend(c);
    uint64_t seed = 1234 + (uint64_t)(n_heads * 31 + hd + bs);

    /* Host K/V for every (seq, position) the test uses. */
    float *kh = randv(n_seqs * MAXPOS * kvw, &seed, 1.0f);
    float *vh = randv(n_seqs * MAXPOS * kvw, &seed, 1.0f);

    step_buf hb, sb;
    step_init(&hb, n_seqs, bs);
    /* Block tables: a scrambled, non-contiguous assignment of blocks. */
    int next = 0;
    for (int s = 0; s < n_seqs; s++)
        for (int b = 0; b < 12; b++)
            hb.tables[s * MAX_BLOCKS + b] = (next++ * 17 + 5) % n_blocks;
    for (int s = 0; s < n_seqs; s++)
        for (int p = 0; p < hist[s]; p++)
            step_row(&hb, s, p, 0);

    cinfer_tensor *kc = tnew(be, ac->kdt, 4, n_blocks, bs, n_kv, hd);
    cinfer_tensor *vc = tnew(be, ac->vdt, 4, n_blocks, bs, n_kv, hd);
    CHECK_OK(cinfer_backend_fill_zero(be, kc));
    CHECK_OK(cinfer_backend_fill_zero(be, vc));

    /* Step 1: history rows go into the cache. */
    {
        int n = hb.s.n_rows;
        float *k = malloc(sizeof(float) * (size_t)(n * kvw));
        float *v = malloc(sizeof(float) * (size_t)(n * kvw));
        for (int r = 0; r < n; r++) {
            int64_t src = (hb.row_seq[r] * MAXPOS + hb.positions[r]) * kvw;
            memcpy(k + r * kvw, kh + src, sizeof(float) * (size_t)kvw);
            memcpy(v + r * kvw, vh + src, sizeof(float) * (size_t)kvw);
        }
        CHECK_OK(cinfer_backend_set_step(be, &hb.s));
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

    /* Step 2: prefill rows of seq 1 interleaved with decode rows of 0, 2. */
    step_init(&sb, n_seqs, bs);
    memcpy(sb.tables, hb.tables, sizeof sb.tables);
    step_row(&sb, 1, 0, 0);
    step_row(&sb, 0, hist[0], 0);
    step_row(&sb, 1, 1, 0);
    step_row(&sb, 2, hist[2], 0);
    step_row(&sb, 1, 2, 0);
    step_row(&sb, 1, 3, 0);
    step_row(&sb, 2, hist[2] + 1, 0);
    step_row(&sb, 1, 4, 0);
    step_row(&sb, 1, 5, 0);
    const int n = sb.s.n_rows;
    /* every other row takes the single-token ("dot") arithmetic */
    uint8_t gen[64];
    for (int r = 0; r < n; r++)
        gen[r] = (uint8_t)(r & 1);
    sb.s.row_gen = gen;
    CHECK_OK(cinfer_backend_set_step(be, &sb.s));
    float *k = malloc(sizeof(float) * (size_t)(n * kvw));
    float *v = malloc(sizeof(float) * (size_t)(n * kvw));
    for (int r = 0; r < n; r++) {
        int64_t src = (sb.row_seq[r] * MAXPOS + sb.positions[r]) * kvw;
        memcpy(k + r * kvw, kh + src, sizeof(float) * (size_t)kvw);
        memcpy(v + r * kvw, vh + src, sizeof(float) * (size_t)kvw);
    }
    float *q = randv(n * qw, &seed, 1.0f);
    cinfer_tensor *tk = tnew(be, CINFER_DTYPE_F32, 2, n, kvw, 0, 0);
    cinfer_tensor *tv = tnew(be, CINFER_DTYPE_F32, 2, n, kvw, 0, 0);
    cinfer_tensor *tq = tnew(be, CINFER_DTYPE_F32, 2, n, qw, 0, 0);
    cinfer_tensor *to = tnew(be, CINFER_DTYPE_F32, 2, n, qw, 0, 0);
    put(be, tk, k);
    put(be, tv, v);
    put(be, tq, q);
    CHECK_OK(cinfer_backend_kv_store(be, tk, tv, kc, vc));
    CHECK_OK(cinfer_backend_attention(be, tq, kc, vc, n_heads, n_kv, hd, ac->scale,
                                to));
    float *got = malloc(sizeof(float) * (size_t)(n * qw));
    get(be, to, got);

    /* float64 reference over the values as the cache stores them */
    double *want = malloc(sizeof(double) * (size_t)(n * qw));
    double sc[MAXPOS];
    for (int r = 0; r < n; r++) {
        int s = sb.row_seq[r], len = sb.positions[r] + 1;
        for (int h = 0; h < n_heads; h++) {
            int g = h / (n_heads / n_kv);
            const float *qh = q + r * qw + h * hd;
            double mx = -INFINITY, sum = 0;
            for (int p = 0; p < len; p++) {
                const float *kp = kh + (s * MAXPOS + p) * kvw + g * hd;
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
                    a += sc[p] * as_stored(ac->vdt,
                                           vh[(s * MAXPOS + p) * kvw + g * hd + i]);
                o[i] = a;
            }
        }
    }
    char what[96];
    snprintf(what, sizeof what, "attention h%d kv%d hd%d bs%d %s/%s", n_heads,
             n_kv, hd, bs, cinfer_dtype_name(ac->kdt),
             cinfer_dtype_name(ac->vdt));
    /* float error here is ~1e-7; peaky softmaxes (scale 2) amplify score
     * errors, which keeps this bound meaningful. Against an F16 V a
     * probability computed in float may round to the neighbouring F16 value
     * of the reference's: one half-ulp of F16 (2^-11) of a |v| <= 1 term. */
    check_close(what, c, got, want, n * qw,
                ac->vdt == CINFER_DTYPE_F16 ? 5e-4 : 3e-6);

    /* block ids outside the cache are caught by attention */
    step_buf bad;
    memcpy(&bad, &sb, sizeof bad);
    bad.s.tokens = bad.tokens;
    bad.s.positions = bad.positions;
    bad.s.row_seq = bad.row_seq;
    bad.s.slots = bad.slots;
    bad.s.block_tables = bad.tables;
    bad.s.out_rows = bad.out_rows;
    bad.tables[0 * MAX_BLOCKS + 3] = n_blocks;
    CHECK_OK(cinfer_backend_set_step(be, &bad.s));
    CHECK_EQ_INT(cinfer_backend_attention(be, tq, kc, vc, n_heads, n_kv, hd,
                                    ac->scale, to),
                 CINFER_E_INVALID_ARG);
    CHECK(strstr(cinfer_last_error(), "attention") != NULL);
    bad.tables[0 * MAX_BLOCKS + 3] = -1;
    CHECK_OK(cinfer_backend_set_step(be, &bad.s));
    CHECK_EQ_INT(cinfer_backend_attention(be, tq, kc, vc, n_heads, n_kv, hd,
                                    ac->scale, to),
                 CINFER_E_INVALID_ARG);

    cinfer_backend_tensor_destroy(be, tk);
    cinfer_backend_tensor_destroy(be, tv);
    cinfer_backend_tensor_destroy(be, tq);
    cinfer_backend_tensor_destroy(be, to);
    cinfer_backend_tensor_destroy(be, kc);
    cinfer_backend_tensor_destroy(be, vc);
    free(want);
    free(q);
    free(k);
    free(v);
    free(kh);
    free(vh);
    cinfer_backend_destroy(be);
    return got;
}

static void test_attention(void)
{
    const attn_case cases[] = {
        {2, 2, 64, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f},
        {6, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.125f},
        {8, 2, 64, 3, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.125f},
        {3, 3, 20, 4, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 0.7f},
        {9, 3, 20, 5, CINFER_DTYPE_F16, CINFER_DTYPE_F32, 0.3f},
        {4, 1, 72, 4, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 0.2f},
        {3, 1, 136, 2, CINFER_DTYPE_F32, CINFER_DTYPE_F16, 0.1f},
        {6, 2, 64, 16, CINFER_DTYPE_F16, CINFER_DTYPE_F16, 2.0f},
        {4, 1, 40, 16, CINFER_DTYPE_F32, CINFER_DTYPE_F32, 2.0f},
    };
    /* Every instruction set and thread count gives the portable code's
     * bits (the outputs of one case all have the same size: 9 rows). */
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        const size_t bytes =
            sizeof(float) * 9 * (size_t)cases[k].n_heads * (size_t)cases[k].hd;
        float *ref = NULL;
        for (int ci = 0; ci < g_n_configs; ci++) {
            float *got = attention_case(g_configs[ci], &cases[k]);
            if (!ref) {
                ref = got;
                continue;
            }
            if (memcmp(ref, got, bytes) != 0)
                fprintf(stderr, "attention case %zu: %s, %d threads differs "
                                "from %s\n",
                        k, cinfer_cpu_isa_name(g_configs[ci].isa),
                        g_configs[ci].n_threads,
                        cinfer_cpu_isa_name(g_configs[0].isa));
            CHECK(memcmp(ref, got, bytes) == 0);
            free(got);
        }
        free(ref);
    }
}

/* ---------------------------------------------------------------------- */
/* batch invariance: a small layer, one row alone vs inside a batch        */
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
    uint64_t seed = 77;
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

static void layer_model_init(layer_model *m, config c, const layer_weights *lw)
{
    cinfer_backend *be = m->be = make_backend(c);
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
            config c = {(cinfer_cpu_isa)isa, run == 2 ? 3 : 1};
            layer_model m;
            layer_model_init(&m, c, &lw);
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

static void test_validation(void)
{
    cinfer_backend *be = make_backend(g_configs[g_n_configs - 1]);
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

int main(void)
{
    init_configs();
    RUN(test_create);
    RUN(test_tensors);
    RUN(test_embed);
    RUN(test_weight_copies);
    RUN(test_rowwise);
    RUN(test_rowwise_large);
    RUN(test_silu_range);
    RUN(test_step_ops_large);
    RUN(test_rope);
    RUN(test_kv_store);
    RUN(test_matmul);
    RUN(test_attention);
    RUN(test_batch_invariance);
    RUN(test_validation);
    return harness_done();
}
