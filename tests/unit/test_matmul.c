/*
 * test_matmul.c - the CPU matrix-product kernels (kernels/cpu/matmul.h).
 *
 * For every weight dtype and every ISA this processor supports:
 *   - prepare() output equals cinfer_quantize_row() bit for bit, and a
 *     row range writes only its rows;
 *   - compute() matches a float64 reference built from the dequantized
 *     weights and the dequantized prepared activations (so only the
 *     kernel's accumulation error remains), bounded relative to
 *     sum |w||a|;
 *   - batch invariance: a row computed alone, or inside batches of 1..13
 *     rows over different column ranges, is bit-identical to the same row
 *     inside the full batch; columns outside [o0, o1) are left untouched;
 *   - every ISA produces the same bits as the portable reference order.
 * Sizes are awkward on purpose (n_in 769 and 5125 for float types, 800 and
 * 2560 for block types (odd block counts too: IQ4_NL pairs its blocks),
 * 768 and 2816 for the K-quants and IQ4_XS; n_out 1, 7, 769, 5125; n 1,
 * 3, 13, 64).
 */
#include <stdlib.h>
#include <string.h>

#include "harness.h"
#include "kernels/cpu/matmul.h"

static const cinfer_dtype k_wtypes[] = {
    CINFER_DTYPE_F32,  CINFER_DTYPE_F16,  CINFER_DTYPE_BF16,
    CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0, CINFER_DTYPE_Q4_1,
    CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q6_K,
    CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K, CINFER_DTYPE_IQ4_XS,
    CINFER_DTYPE_IQ4_NL,
};
#define N_WTYPES (int)(sizeof(k_wtypes) / sizeof(k_wtypes[0]))

static const cinfer_cpu_isa k_isas[] = {
    CINFER_CPU_ISA_PORTABLE,
    CINFER_CPU_ISA_AVX2,
    CINFER_CPU_ISA_AVX512,
};
#define N_ISAS (int)(sizeof(k_isas) / sizeof(k_isas[0]))

static int is_block(cinfer_dtype t) { return cinfer_dtype_block_elems(t) > 1; }
static int is_k(cinfer_dtype t) { return cinfer_dtype_block_elems(t) == CINFER_QK_K; }

/* GGML's kvalues_iq4nl, written out here. */
static const int k_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};

/* Q2_K / Q3_K: the 2 low bits of quant e. */
static int low2(const uint8_t *qs, int e)
{
    int h = e / 128, i = e % 128;
    return (qs[32 * h + i % 32] >> (2 * (i / 32))) & 3;
}

/* Quant e (0..255) of a K-quant super-block, as the format defines it
 * (dtype.h), written out independently of the library's decoders. */
static int k_quant(cinfer_dtype wt, const void *blk, int e)
{
    if (wt == CINFER_DTYPE_Q2_K)
        return low2(((const cinfer_block_q2_k *)blk)->qs, e);
    if (wt == CINFER_DTYPE_Q3_K) {
        const cinfer_block_q3_k *b = blk;
        return low2(b->qs, e) | (((b->hmask[e % 32] >> (e / 32)) & 1) << 2);
    }
    if (wt == CINFER_DTYPE_IQ4_XS) {
        const cinfer_block_iq4_xs *b = blk;
        int byte = b->qs[16 * (e / 32) + e % 16];
        return e % 32 < 16 ? byte & 15 : byte >> 4;
    }
    if (wt == CINFER_DTYPE_Q4_K) {
        const cinfer_block_q4_k *b = blk;
        int byte = b->qs[32 * (e / 64) + e % 32];
        return e % 64 < 32 ? byte & 15 : byte >> 4;
    }
    if (wt == CINFER_DTYPE_Q5_K) {
        const cinfer_block_q5_k *b = blk;
        int byte = b->qs[32 * (e / 64) + e % 32];
        int lo = e % 64 < 32 ? byte & 15 : byte >> 4;
        return lo | (((b->qh[e % 32] >> (e / 32)) & 1) << 4);
    }
    const cinfer_block_q6_k *b = blk;
    int h = e / 128, i = e % 128;
    int lo = (b->ql[64 * h + i % 64] >> (4 * (i / 64))) & 15;
    int hi = (b->qh[32 * h + i % 32] >> (2 * (i / 32))) & 3;
    return lo | (hi << 4);
}

/* Float64 K-quant x Q8_K dot; mag sums the scale and min terms apart, as
 * the kernels accumulate them apart. */
static void ref_dot_k(cinfer_dtype wt, const void *wrow, const void *arow,
                      int64_t n_in, double *dot, double *mag)
{
    const cinfer_block_q8_k *ab = arow;
    const size_t bb = cinfer_dtype_block_bytes(wt);
    double s = 0.0, m = 0.0;
    for (int64_t b = 0; b < n_in / CINFER_QK_K; b++) {
        const void *wb = (const uint8_t *)wrow + (size_t)b * bb;
        for (int e = 0; e < CINFER_QK_K; e++) {
            double a = (double)ab[b].d * ab[b].qs[e];
            int q = k_quant(wt, wb, e);
            if (wt == CINFER_DTYPE_Q2_K) {
                const cinfer_block_q2_k *k2 = wb;
                int sc = k2->scales[e / 16];
                double p = cinfer_fp16_to_fp32(k2->d) * (sc & 15) * q * a;
                double pm = cinfer_fp16_to_fp32(k2->dmin) * (sc >> 4) * a;
                s += p - pm;
                m += fabs(p) + fabs(pm);
            } else if (wt == CINFER_DTYPE_Q3_K) {
                const cinfer_block_q3_k *k3 = wb;
                int j = e / 16;
                int sc = ((k3->scales[j % 8] >> (4 * (j / 8))) & 15) |
                         (((k3->scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4);
                double p = cinfer_fp16_to_fp32(k3->d) * (sc - 32) * (q - 4) * a;
                s += p;
                m += fabs(p);
            } else if (wt == CINFER_DTYPE_IQ4_XS) {
                const cinfer_block_iq4_xs *x4 = wb;
                int j = e / 32;
                int ls = ((x4->scales_l[j / 2] >> (4 * (j % 2))) & 15) |
                         (((x4->scales_h >> (2 * j)) & 3) << 4);
                double p = cinfer_fp16_to_fp32(x4->d) * (ls - 32) * k_iq4[q] * a;
                s += p;
                m += fabs(p);
            } else if (wt != CINFER_DTYPE_Q6_K) {
                /* Q4_K and Q5_K share the header layout */
                const cinfer_block_q4_k *k4 = wb;
                uint8_t sc, mn;
                cinfer_dtype_k4_scale_min(k4->scales, e / 32, &sc, &mn);
                double p = cinfer_fp16_to_fp32(k4->d) * sc * q * a;
                double pm = cinfer_fp16_to_fp32(k4->dmin) * mn * a;
                s += p - pm;
                m += fabs(p) + fabs(pm);
            } else {
                const cinfer_block_q6_k *k6 = wb;
                double p = cinfer_fp16_to_fp32(k6->d) * k6->scales[e / 16] *
                           (q - 32) * a;
                s += p;
                m += fabs(p);
            }
        }
    }
    *dot = s;
    *mag = m;
}

/* Random floats with a per-row scale, a few exact zeros, and (for some
 * rows) one large outlier, the way activations look. */
static void fill_rows(float *x, int64_t rows, int64_t cols, uint64_t *seed)
{
    for (int64_t r = 0; r < rows; r++) {
        float scale = 0.05f + 4.0f * (float)(harness_rand(seed) % 1000) / 1000.0f;
        for (int64_t c = 0; c < cols; c++) {
            float v = harness_randf(seed) * scale;
            if (harness_rand(seed) % 37 == 0)
                v = 0.0f;
            x[r * cols + c] = v;
        }
        if (r % 3 == 1)
            x[r * cols + (int64_t)(harness_rand(seed) % (uint64_t)cols)] = 20.0f * scale;
    }
}

/* A weight matrix [n_out, n_in] of type wt; Q8_0 gets a few -128 quants
 * (valid in files though the quantizer never writes them). */
static uint8_t *make_weights(cinfer_dtype wt, int64_t n_out, int64_t n_in,
                             uint64_t *seed)
{
    size_t rb = cinfer_dtype_row_bytes(wt, n_in);
    uint8_t *w = malloc(rb * (size_t)n_out);
    float *tmp = malloc(sizeof(float) * (size_t)n_in);
    CINFER_ASSERT(w && tmp);
    for (int64_t o = 0; o < n_out; o++) {
        fill_rows(tmp, 1, n_in, seed);
        if (wt == CINFER_DTYPE_Q4_1 && o % 4 == 0)
            for (int64_t i = 0; i < n_in; i++)
                tmp[i] += 0.5f; /* non-trivial minimum */
        cinfer_quantize_row(wt, tmp, w + rb * (size_t)o, n_in);
        if (wt == CINFER_DTYPE_Q8_0 && o % 5 == 2) {
            cinfer_block_q8_0 *b = (cinfer_block_q8_0 *)(w + rb * (size_t)o);
            b[0].qs[(harness_rand(seed) % 32)] = -128;
        }
    }
    free(tmp);
    return w;
}

/* Reference dot in float64 and the bound's scale sum |w||a|. Block types
 * use the prepared blocks directly; for Q4_1 x Q8_1 the activation sum
 * term uses the stored s (an fp16 rounding of d * sum q, part of the
 * format, not of the kernel). */
static void ref_dot(cinfer_dtype wt, const void *wrow, const void *arow,
                    int64_t n_in, double *dot, double *mag)
{
    double s = 0.0, m = 0.0;
    if (is_k(wt)) {
        ref_dot_k(wt, wrow, arow, n_in, dot, mag);
        return;
    }
    if (!is_block(wt)) {
        cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
        float *wf = malloc(sizeof(float) * (size_t)n_in);
        float *af = malloc(sizeof(float) * (size_t)n_in);
        CINFER_ASSERT(wf && af);
        cinfer_dequantize_row(wt, wrow, wf, n_in);
        cinfer_dequantize_row(at, arow, af, n_in);
        for (int64_t i = 0; i < n_in; i++) {
            s += (double)wf[i] * af[i];
            m += fabs((double)wf[i] * af[i]);
        }
        free(wf);
        free(af);
    } else {
        int64_t nb = n_in / CINFER_QK;
        for (int64_t b = 0; b < nb; b++) {
            double dw, dmin = 0.0, da, sa = 0.0;
            int qw[CINFER_QK];
            const int8_t *qa;
            if (wt == CINFER_DTYPE_Q4_1) {
                const cinfer_block_q4_1 *wb = (const cinfer_block_q4_1 *)wrow + b;
                const cinfer_block_q8_1 *ab = (const cinfer_block_q8_1 *)arow + b;
                dw = cinfer_fp16_to_fp32(wb->d);
                dmin = cinfer_fp16_to_fp32(wb->m);
                for (int j = 0; j < 16; j++) {
                    qw[j] = wb->qs[j] & 15;
                    qw[j + 16] = wb->qs[j] >> 4;
                }
                da = cinfer_fp16_to_fp32(ab->d);
                sa = cinfer_fp16_to_fp32(ab->s);
                qa = ab->qs;
            } else {
                const cinfer_block_q8_0 *ab = (const cinfer_block_q8_0 *)arow + b;
                da = cinfer_fp16_to_fp32(ab->d);
                qa = ab->qs;
                if (wt == CINFER_DTYPE_Q4_0) {
                    const cinfer_block_q4_0 *wb =
                        (const cinfer_block_q4_0 *)wrow + b;
                    dw = cinfer_fp16_to_fp32(wb->d);
                    for (int j = 0; j < 16; j++) {
                        qw[j] = (wb->qs[j] & 15) - 8;
                        qw[j + 16] = (wb->qs[j] >> 4) - 8;
                    }
                } else if (wt == CINFER_DTYPE_IQ4_NL) {
                    const cinfer_block_iq4_nl *wb =
                        (const cinfer_block_iq4_nl *)wrow + b;
                    dw = cinfer_fp16_to_fp32(wb->d);
                    for (int j = 0; j < 16; j++) {
                        qw[j] = k_iq4[wb->qs[j] & 15];
                        qw[j + 16] = k_iq4[wb->qs[j] >> 4];
                    }
                } else {
                    const cinfer_block_q8_0 *wb =
                        (const cinfer_block_q8_0 *)wrow + b;
                    dw = cinfer_fp16_to_fp32(wb->d);
                    for (int j = 0; j < 32; j++)
                        qw[j] = wb->qs[j];
                }
            }
            for (int j = 0; j < CINFER_QK; j++) {
                double p = dw * qw[j] * da * qa[j];
                s += p;
                m += fabs(p);
            }
            s += dmin * sa;
            m += fabs(dmin * sa);
        }
    }
    *dot = s;
    *mag = m;
}

/* One shape: n rows, n_out columns, n_in inner. Runs every supported ISA,
 * checks prepare, accuracy, batch invariance and cross-ISA identity. */
static void check_shape(cinfer_dtype wt, int64_t n_in, int64_t n_out, int64_t n,
                        uint64_t seed)
{
    cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    size_t wrb = cinfer_dtype_row_bytes(wt, n_in);
    size_t arb = cinfer_dtype_row_bytes(at, n_in);
    CINFER_ASSERT(wrb > 0 && arb > 0);

    uint8_t *w = make_weights(wt, n_out, n_in, &seed);
    float *x = malloc(sizeof(float) * (size_t)(n * n_in));
    uint8_t *act_ref = malloc(arb * (size_t)n);
    uint8_t *act = malloc(arb * (size_t)n);
    int64_t stride = n_out + 3;
    float *out_ref = malloc(sizeof(float) * (size_t)(n * stride));
    float *out = malloc(sizeof(float) * (size_t)(n * stride));
    float *out_sub = malloc(sizeof(float) * (size_t)(n * stride));
    CINFER_ASSERT(x && act_ref && act && out_ref && out && out_sub);

    fill_rows(x, n, n_in, &seed);
    for (int64_t r = 0; r < n; r++)
        cinfer_quantize_row(at, x + r * n_in, act_ref + arb * (size_t)r, n_in);

    /* Float64 reference on the reference activations. */
    double *ref = malloc(sizeof(double) * (size_t)(n * n_out));
    double *mag = malloc(sizeof(double) * (size_t)(n * n_out));
    CINFER_ASSERT(ref && mag);
    for (int64_t r = 0; r < n; r++)
        for (int64_t o = 0; o < n_out; o++)
            ref_dot(wt, w + wrb * (size_t)o, act_ref + arb * (size_t)r, n_in,
                    &ref[r * n_out + o], &mag[r * n_out + o]);
    /* Chain length of one lane plus the reduction tree depth. */
    /* K-quants: the rounded d and dmin and the int32 -> float conversion
     * add a few roundings per super-block. */
    double chain = is_k(wt) ? 4.0 * (double)(n_in / CINFER_QK_K) + 8.0
                   : is_block(wt) ? (double)(n_in / CINFER_QK) + 6.0
                   : wt == CINFER_DTYPE_BF16 ? 2.0 * (double)((n_in + 31) / 32) + 6.0
                                             : (double)((n_in + 15) / 16) + 6.0;
    double rel_tol = chain * 1.2e-7;

    int have_first = 0;
    for (int ii = 0; ii < N_ISAS; ii++) {
        cinfer_cpu_isa isa = k_isas[ii];
        if (!cinfer_cpu_isa_supported(isa))
            continue;

        /* prepare: bit-exact, whole range and a split range. */
        memset(act, 0xA5, arb * (size_t)n);
        cinfer_cpu_matmul_prepare(isa, at, x, n_in, 0, n, act);
        int prep_ok = memcmp(act, act_ref, arb * (size_t)n) == 0;
        if (!prep_ok)
            fprintf(stderr, "prepare mismatch: isa %s wt %s n_in %lld\n",
                    cinfer_cpu_isa_name(isa), cinfer_dtype_name(wt),
                    (long long)n_in);
        CHECK(prep_ok);
        if (n > 1) {
            int64_t mid = n / 2;
            memset(act, 0xA5, arb * (size_t)n);
            cinfer_cpu_matmul_prepare(isa, at, x, n_in, mid, n, act);
            CHECK(memcmp(act + arb * (size_t)mid, act_ref + arb * (size_t)mid,
                         arb * (size_t)(n - mid)) == 0);
            int untouched = 1;
            for (size_t i = 0; i < arb * (size_t)mid; i++)
                untouched &= act[i] == 0xA5;
            CHECK(untouched);
        }

        /* compute: whole batch, all columns. */
        for (int64_t i = 0; i < n * stride; i++)
            out[i] = -777.0f;
        cinfer_cpu_matmul_compute(isa, wt, w, wrb, act_ref, n, n_in, out,
                                  stride, 0, n_out);
        int acc_bad = 0, pad_bad = 0;
        for (int64_t r = 0; r < n; r++) {
            for (int64_t o = 0; o < n_out; o++) {
                double d = fabs((double)out[r * stride + o] - ref[r * n_out + o]);
                double tol = rel_tol * mag[r * n_out + o] + 1e-30;
                if (!(d <= tol)) {
                    if (acc_bad < 5)
                        fprintf(stderr,
                                "accuracy: isa %s wt %s n_in %lld r %lld o %lld: "
                                "%.9g vs %.9g (tol %.3g)\n",
                                cinfer_cpu_isa_name(isa), cinfer_dtype_name(wt),
                                (long long)n_in, (long long)r, (long long)o,
                                out[r * stride + o], ref[r * n_out + o], tol);
                    acc_bad++;
                }
            }
            for (int64_t o = n_out; o < stride; o++)
                pad_bad += out[r * stride + o] != -777.0f;
        }
        CHECK_EQ_INT(acc_bad, 0);
        CHECK_EQ_INT(pad_bad, 0);

        /* Cross-ISA: identical bits to the first (portable) ISA. */
        if (!have_first) {
            memcpy(out_ref, out, sizeof(float) * (size_t)(n * stride));
            have_first = 1;
        } else {
            int same = memcmp(out_ref, out, sizeof(float) * (size_t)(n * stride)) == 0;
            if (!same)
                fprintf(stderr, "isa %s differs from portable: wt %s n_in %lld "
                        "n_out %lld n %lld\n", cinfer_cpu_isa_name(isa),
                        cinfer_dtype_name(wt), (long long)n_in,
                        (long long)n_out, (long long)n);
            CHECK(same);
        }

        /* Batch invariance: sub-batches of 1..13 rows starting anywhere,
         * over random column ranges. */
        int inv_bad = 0, outside_bad = 0;
        uint64_t s2 = seed ^ 0x9e3779b97f4a7c15ull;
        int trials = n == 1 ? 4 : 16;
        for (int t = 0; t < trials; t++) {
            int64_t nb = 1 + (int64_t)(harness_rand(&s2) % 13);
            if (nb > n)
                nb = n;
            if (t == 0)
                nb = 1;
            int64_t r0 = (int64_t)(harness_rand(&s2) % (uint64_t)(n - nb + 1));
            int64_t o0 = (int64_t)(harness_rand(&s2) % (uint64_t)n_out);
            int64_t o1 = o0 + 1 + (int64_t)(harness_rand(&s2) % (uint64_t)(n_out - o0));
            if (t == 1) {
                o0 = 0;
                o1 = n_out;
            }
            for (int64_t i = 0; i < n * stride; i++)
                out_sub[i] = -555.0f;
            cinfer_cpu_matmul_compute(isa, wt, w, wrb, act_ref + arb * (size_t)r0,
                                      nb, n_in, out_sub, stride, o0, o1);
            for (int64_t r = 0; r < nb; r++) {
                inv_bad += memcmp(out_sub + r * stride + o0,
                                  out + (r0 + r) * stride + o0,
                                  sizeof(float) * (size_t)(o1 - o0)) != 0;
                for (int64_t o = 0; o < stride; o++)
                    if (o < o0 || o >= o1)
                        outside_bad += out_sub[r * stride + o] != -555.0f;
            }
            for (int64_t r = nb; r < n; r++)
                for (int64_t o = 0; o < stride; o++)
                    outside_bad += out_sub[r * stride + o] != -555.0f;
        }
        if (inv_bad)
            fprintf(stderr, "batch invariance: isa %s wt %s n_in %lld n_out %lld "
                    "n %lld: %d rows differ\n", cinfer_cpu_isa_name(isa),
                    cinfer_dtype_name(wt), (long long)n_in, (long long)n_out,
                    (long long)n, inv_bad);
        CHECK_EQ_INT(inv_bad, 0);
        CHECK_EQ_INT(outside_bad, 0);
    }

    free(ref);
    free(mag);
    free(out_sub);
    free(out);
    free(out_ref);
    free(act);
    free(act_ref);
    free(x);
    free(w);
}

typedef struct {
    int64_t n_in_block; /* n_in for block types */
    int64_t n_in_float; /* n_in for F32/F16/BF16 */
    int64_t n_in_k;     /* n_in for the K-quants */
    int64_t n_out;
    int64_t n;
} shape;

static const shape k_shapes[] = {
    {32, 17, 256, 5125, 3},  {800, 769, 768, 7, 13},  {2560, 5125, 2816, 7, 3},
    {800, 769, 768, 769, 1}, {800, 800, 1280, 37, 64}, {2560, 5125, 2816, 1, 1},
    {64, 1, 256, 13, 13},    {96, 33, 512, 9, 5},
};
#define N_SHAPES (int)(sizeof(k_shapes) / sizeof(k_shapes[0]))

static void test_supported_and_pairs(void)
{
    CHECK(cinfer_cpu_isa_supported(CINFER_CPU_ISA_PORTABLE));
    for (int i = 0; i < N_WTYPES; i++)
        CHECK(cinfer_cpu_matmul_supported(k_wtypes[i]));
    CHECK(!cinfer_cpu_matmul_supported(CINFER_DTYPE_I32));
    CHECK(!cinfer_cpu_matmul_supported(CINFER_DTYPE_Q8_1));
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q4_1), CINFER_DTYPE_Q8_1);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q8_0), CINFER_DTYPE_Q8_0);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q4_0), CINFER_DTYPE_Q8_0);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_F16), CINFER_DTYPE_F16);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_BF16), CINFER_DTYPE_BF16);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_F32), CINFER_DTYPE_F32);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q4_K), CINFER_DTYPE_Q8_K);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q6_K), CINFER_DTYPE_Q8_K);
    CHECK(!cinfer_cpu_matmul_supported(CINFER_DTYPE_Q8_K));
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q5_K), CINFER_DTYPE_Q8_K);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q2_K), CINFER_DTYPE_Q8_K);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_Q3_K), CINFER_DTYPE_Q8_K);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_IQ4_XS), CINFER_DTYPE_Q8_K);
    CHECK_EQ_INT(cinfer_cpu_matmul_act_type(CINFER_DTYPE_IQ4_NL), CINFER_DTYPE_Q8_0);
    CHECK(!cinfer_cpu_matmul_supported((cinfer_dtype)16)); /* IQ2_XXS */
    for (int ii = 0; ii < N_ISAS; ii++)
        fprintf(stderr, "     isa %-8s %s\n", cinfer_cpu_isa_name(k_isas[ii]),
                cinfer_cpu_isa_supported(k_isas[ii]) ? "supported" : "absent");
}

static void run_type(cinfer_dtype wt)
{
    for (int s = 0; s < N_SHAPES; s++) {
        const shape *sh = &k_shapes[s];
        int64_t n_in = is_k(wt)       ? sh->n_in_k
                       : is_block(wt) ? sh->n_in_block
                                      : sh->n_in_float;
        check_shape(wt, n_in, sh->n_out, sh->n, 1234567ull + (uint64_t)s * 77);
    }
}

static void test_f32(void) { run_type(CINFER_DTYPE_F32); }
static void test_f16(void) { run_type(CINFER_DTYPE_F16); }
static void test_bf16(void) { run_type(CINFER_DTYPE_BF16); }
static void test_q8_0(void) { run_type(CINFER_DTYPE_Q8_0); }
static void test_q4_0(void) { run_type(CINFER_DTYPE_Q4_0); }
static void test_q4_1(void) { run_type(CINFER_DTYPE_Q4_1); }
static void test_q4_k(void) { run_type(CINFER_DTYPE_Q4_K); }
static void test_q5_k(void) { run_type(CINFER_DTYPE_Q5_K); }
static void test_q6_k(void) { run_type(CINFER_DTYPE_Q6_K); }
static void test_q2_k(void) { run_type(CINFER_DTYPE_Q2_K); }
static void test_q3_k(void) { run_type(CINFER_DTYPE_Q3_K); }
static void test_iq4_xs(void) { run_type(CINFER_DTYPE_IQ4_XS); }
static void test_iq4_nl(void) { run_type(CINFER_DTYPE_IQ4_NL); }

/* Activation quantization corner cases: all-zero blocks, exact .5 ties
 * (round half to even), a block whose maximum is negative, huge and tiny
 * magnitudes, and non-finite values, for every ISA and activation type. */
static void test_prepare_edges(void)
{
    enum { N_IN = 256 };
    float x[2 * N_IN];
    uint64_t seed = 42;
    for (int i = 0; i < 2 * N_IN; i++)
        x[i] = harness_randf(&seed);
    for (int i = 0; i < 32; i++)
        x[i] = 0.0f;                      /* block 0: zeros */
    for (int i = 32; i < 64; i++)
        x[i] = (float)(i - 48) * 0.5f;    /* block 1: ties after scaling */
    x[40] = -127.0f * 0.5f;               /* negative maximum */
    for (int i = 64; i < 96; i++)
        x[i] = harness_randf(&seed) * 1e-30f;
    for (int i = 96; i < 128; i++)
        x[i] = harness_randf(&seed) * 6e4f;
    x[260] = 1e-40f; /* subnormal */
    x[300] = 65519.0f;
    x[301] = 65520.0f;
    x[302] = -70000.0f;
    x[303] = 3.0e38f;
    const cinfer_dtype ats[] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q8_1,
                                CINFER_DTYPE_Q8_K, CINFER_DTYPE_F16,
                                CINFER_DTYPE_BF16, CINFER_DTYPE_F32};
    for (int t = 0; t < 6; t++) {
        /* Non-finite values only for the float formats: the block
         * quantizers' result for them is not defined. */
        if (t == 3) {
            x[130] = INFINITY;
            x[170] = NAN;
            x[171] = -NAN;
            x[200] = -INFINITY;
        }
        size_t rb = cinfer_dtype_row_bytes(ats[t], N_IN);
        uint8_t ref[2 * N_IN * 4], got[2 * N_IN * 4];
        cinfer_quantize_row(ats[t], x, ref, N_IN);
        cinfer_quantize_row(ats[t], x + N_IN, ref + rb, N_IN);
        for (int ii = 0; ii < N_ISAS; ii++) {
            if (!cinfer_cpu_isa_supported(k_isas[ii]))
                continue;
            memset(got, 0, sizeof(got));
            cinfer_cpu_matmul_prepare(k_isas[ii], ats[t], x, N_IN, 0, 2, got);
            int same = memcmp(ref, got, 2 * rb) == 0;
            if (!same)
                fprintf(stderr, "prepare edge mismatch: isa %s act %s\n",
                        cinfer_cpu_isa_name(k_isas[ii]),
                        cinfer_dtype_name(ats[t]));
            CHECK(same);
        }
    }
}

/* n_in = 0 is a whole number of blocks: every output is zero. */
static void test_empty_inner(void)
{
    uint8_t w[64] = {0}, act[64] = {0};
    float x[4] = {0};
    for (int ii = 0; ii < N_ISAS; ii++) {
        if (!cinfer_cpu_isa_supported(k_isas[ii]))
            continue;
        for (int t = 0; t < N_WTYPES; t++) {
            float out[2 * 5];
            for (int i = 0; i < 10; i++)
                out[i] = 9.0f;
            cinfer_dtype at = cinfer_cpu_matmul_act_type(k_wtypes[t]);
            cinfer_cpu_matmul_prepare(k_isas[ii], at, x, 0, 0, 2, act);
            cinfer_cpu_matmul_compute(k_isas[ii], k_wtypes[t], w, 0, act, 2, 0,
                                      out, 5, 1, 4);
            for (int r = 0; r < 2; r++)
                for (int o = 0; o < 5; o++)
                    CHECK_EQ_INT(out[r * 5 + o] == 0.0f, o >= 1 && o < 4);
        }
    }
}

/* Int8-block weights packed for the AVX-512 kernels (matmul.h): every
 * block unpacks to the bytes it was packed from, and products over the
 * packed weights equal the portable ones over the rows bit for bit, for
 * column ranges in whole groups and to the end, with a tail of rows past
 * the last whole group. */
static void check_packed(cinfer_dtype wt, int64_t n_in, int64_t n_out, int64_t n,
                         uint64_t seed)
{
    const cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    const size_t wrb = cinfer_dtype_row_bytes(wt, n_in);
    const size_t arb = cinfer_dtype_row_bytes(at, n_in);
    const int64_t be = cinfer_dtype_block_elems(wt);
    const size_t bb = cinfer_dtype_row_bytes(wt, be);
    uint8_t *w = make_weights(wt, n_out, n_in, &seed);
    /* every scale (and min), not only the quantizer's: random scale bytes
     * in a third of the rows */
    const int sc0 = wt == CINFER_DTYPE_Q6_K   ? 192
                    : wt == CINFER_DTYPE_Q3_K   ? 96
                    : wt == CINFER_DTYPE_Q2_K   ? 0
                    : wt == CINFER_DTYPE_IQ4_XS ? 2
                                                : 4;
    const int sc1 = wt == CINFER_DTYPE_Q6_K   ? 208
                    : wt == CINFER_DTYPE_Q3_K   ? 108
                    : wt == CINFER_DTYPE_IQ4_XS ? 8
                                                : 16;
    if (cinfer_cpu_pack_rows(wt) && cinfer_dtype_block_elems(wt) == 256)
        for (int64_t o = 1; o < n_out; o += 3)
            for (int64_t b = 0; b < n_in / be; b++)
                for (int i = sc0; i < sc1; i++)
                    w[wrb * (size_t)o + bb * (size_t)b + (size_t)i] = (uint8_t)harness_rand(&seed);
    uint8_t *packed = aligned_alloc(64, (wrb * (size_t)n_out + 63) / 64 * 64);
    uint8_t *row = malloc(wrb);
    float *x = malloc(sizeof(float) * (size_t)(n * n_in));
    uint8_t *act = malloc(arb * (size_t)n);
    int64_t stride = n_out + 3;
    float *want = malloc(sizeof(float) * (size_t)(n * stride));
    float *got = malloc(sizeof(float) * (size_t)(n * stride));
    CINFER_ASSERT(w && packed && row && x && act && want && got);

    cinfer_cpu_pack(wt, w, n_out, n_in, packed);
    /* in parts, as threads pack it: the same bytes */
    {
        const size_t nbytes = wrb * (size_t)n_out;
        uint8_t *parts = malloc(nbytes);
        CINFER_ASSERT(parts != NULL);
        int64_t np = cinfer_cpu_pack_parts(wt, n_out);
        CHECK_EQ_INT(np, n_out / cinfer_cpu_pack_rows(wt) + 1);
        for (int64_t p0 = 0; p0 < np; p0 += 3)
            cinfer_cpu_pack_range(wt, w, n_out, n_in, parts, p0,
                                  p0 + 3 < np ? p0 + 3 : np);
        CHECK(memcmp(parts, packed, nbytes) == 0);
        free(parts);
    }
    int rows_bad = 0;
    const int64_t nb = n_in / be;
    for (int64_t o = 0; o < n_out; o++) {
        cinfer_cpu_packed_row(wt, packed, n_out, n_in, o, 0, nb, row);
        rows_bad += memcmp(row, w + wrb * (size_t)o, wrb) != 0;
        if (nb > 2) { /* a block range alone */
            cinfer_cpu_packed_row(wt, packed, n_out, n_in, o, 1, 3, row);
            rows_bad += memcmp(row, w + wrb * (size_t)o + bb, 2 * bb) != 0;
        }
    }
    CHECK_EQ_INT(rows_bad, 0);

#if defined(__x86_64__) || defined(_M_X64)
    if (cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX512)) {
        fill_rows(x, n, n_in, &seed);
        for (int64_t r = 0; r < n; r++)
            cinfer_quantize_row(at, x + r * n_in, act + arb * (size_t)r, n_in);
        for (int64_t i = 0; i < n * stride; i++)
            want[i] = -777.0f;
        cinfer_cpu_matmul_compute(CINFER_CPU_ISA_PORTABLE, wt, w, wrb, act, n,
                                  n_in, want, stride, 0, n_out);
        /* whole range, then ranges as the backend splits them (units of
         * 16 columns), and one from the second group (Q8_0: 8 columns) */
        const int64_t g = cinfer_cpu_pack_rows(wt);
        int64_t ranges[5][2] = {{0, n_out}, {16, n_out}, {0, 16}, {16, 48}, {g, n_out}};
        for (int k = 0; k < 5; k++) {
            int64_t o0 = ranges[k][0], o1 = ranges[k][1] < n_out ? ranges[k][1] : n_out;
            if (o0 >= o1)
                continue;
            for (int64_t i = 0; i < n * stride; i++)
                got[i] = -777.0f;
            cinfer_cpu_matmul_compute_packed_avx512(wt, packed, n_out, act, n,
                                                    n_in, got, stride, o0, o1);
            int bad = 0, outside = 0;
            for (int64_t r = 0; r < n; r++)
                for (int64_t o = 0; o < stride; o++) {
                    float g = got[r * stride + o];
                    if (o >= o0 && o < o1)
                        bad += memcmp(&g, &want[r * stride + o], sizeof g) != 0;
                    else
                        outside += g != -777.0f;
                }
            if (bad)
                fprintf(stderr, "packed %s: n_in %lld n_out %lld n %lld "
                        "[%lld, %lld): %d differ\n", cinfer_dtype_name(wt),
                        (long long)n_in, (long long)n_out, (long long)n,
                        (long long)o0, (long long)o1, bad);
            CHECK_EQ_INT(bad, 0);
            CHECK_EQ_INT(outside, 0);
        }
    }
#endif
    free(got);
    free(want);
    free(act);
    free(x);
    free(row);
    free(packed);
    free(w);
}

static void test_packed(void)
{
    static const cinfer_dtype types[] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0,
                                         CINFER_DTYPE_Q4_1};
    for (int i = 0; i < 3; i++) {
        cinfer_dtype wt = types[i];
        CHECK(cinfer_cpu_pack_rows(wt) > 0);
        check_packed(wt, 800, 7, 3, 11);     /* no whole group: all tail */
        check_packed(wt, 800, 16, 1, 12);    /* whole groups, no tail */
        check_packed(wt, 32, 37, 5, 13);     /* one block per row */
        check_packed(wt, 2560, 769, 1, 14);  /* decode */
        check_packed(wt, 800, 5125, 13, 15); /* row tiles and column blocks */
        check_packed(wt, 96, 64, 2, 16);
        /* batches: the decoded panels (24 rows and more), last row
         * tiles of 1 and 2 rows, a last Q8_0 column tile of one group of
         * 8 (n_out 40), 256 blocks (a panel of one group) and 257 (past
         * the scratch); 17 rows stay on the row tiles */
        check_packed(wt, 800, 197, 24, 17);
        check_packed(wt, 800, 197, 26, 18);
        check_packed(wt, 96, 40, 100, 19);
        check_packed(wt, 800, 5125, 25, 20);
        check_packed(wt, 800, 197, 17, 24);
        check_packed(wt, 32, 37, 257, 21);
        check_packed(wt, 32 * 256, 21, 25, 22);
        check_packed(wt, 32 * 257, 21, 25, 23);
    }
    /* Q4_K, Q5_K and Q6_K (one lane per weight row): all tail, whole groups,
     * one super-block, decode, and batches of 1 .. 4 rows a pass with
     * their remainders */
    static const cinfer_dtype kq[] = {CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K, CINFER_DTYPE_Q6_K,
                                      CINFER_DTYPE_Q2_K, CINFER_DTYPE_Q3_K, CINFER_DTYPE_IQ4_XS,
                                      CINFER_DTYPE_IQ4_NL};
    for (int i = 0; i < 7; i++) {
        cinfer_dtype wt = kq[i];
        CHECK_EQ_INT(cinfer_cpu_pack_rows(wt), 16);
        if (wt == CINFER_DTYPE_IQ4_NL) { /* blocks of 32: rows of no whole 256 */
            check_packed(wt, 800, 197, 24, 39);
            check_packed(wt, 640, 37, 1, 40);
            check_packed(wt, 32, 37, 5, 41);
        }
        check_packed(wt, 768, 7, 3, 31);
        check_packed(wt, 768, 16, 1, 32);
        check_packed(wt, 256, 37, 5, 33);
        check_packed(wt, 2560, 769, 1, 34);
        check_packed(wt, 768, 197, 24, 35);
        check_packed(wt, 512, 64, 2, 36);
        check_packed(wt, 1280, 48, 7, 37);
        check_packed(wt, 256, 40, 100, 38);
    }
    CHECK_EQ_INT(cinfer_cpu_pack_rows(CINFER_DTYPE_Q5_0), 0);
    CHECK_EQ_INT(cinfer_cpu_pack_rows(CINFER_DTYPE_F16), 0);
}

/* ---------------------------------------------------------------------- */
/* batched int8 rows: tiled paths against row by row                      */
/* ---------------------------------------------------------------------- */

/* Many rows of the int8-block types take register-tiled paths (the AVX2
 * and AVX-512 decoded panels); a row alone takes another. Every
 * row count from 1 to 600 (sampled), column ranges cut where the backend
 * cuts them (units of 16) and off them, inner sizes of 1, 3, 25 and 1025
 * blocks (the last past the AVX2 panel scratch): each ISA's batch equals
 * the portable code and the same ISA one row at a time, bit for bit. */
static void check_rows(cinfer_dtype wt, int64_t n_in, int64_t n_out, int64_t n,
                       int64_t o0, int64_t o1, uint64_t seed)
{
    const cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    const size_t wrb = cinfer_dtype_row_bytes(wt, n_in);
    const size_t arb = cinfer_dtype_row_bytes(at, n_in);
    uint8_t *w = make_weights(wt, n_out, n_in, &seed);
    float *x = malloc(sizeof(float) * (size_t)(n * n_in));
    uint8_t *act = malloc(arb * (size_t)n);
    const int64_t stride = n_out + 1;
    float *want = malloc(sizeof(float) * (size_t)(n * stride));
    float *got = malloc(sizeof(float) * (size_t)(n * stride));
    float *one = malloc(sizeof(float) * (size_t)(n * stride));
    CINFER_ASSERT(w && x && act && want && got && one);
    fill_rows(x, n, n_in, &seed);
    for (int64_t r = 0; r < n; r++)
        cinfer_quantize_row(at, x + r * n_in, act + arb * (size_t)r, n_in);
    for (int64_t i = 0; i < n * stride; i++)
        want[i] = -777.0f;
    cinfer_cpu_matmul_compute(CINFER_CPU_ISA_PORTABLE, wt, w, wrb, act, n, n_in,
                              want, stride, o0, o1);
    for (int ii = 1; ii < N_ISAS; ii++) {
        const cinfer_cpu_isa isa = k_isas[ii];
        if (!cinfer_cpu_isa_supported(isa))
            continue;
        for (int64_t i = 0; i < n * stride; i++)
            got[i] = one[i] = -777.0f;
        cinfer_cpu_matmul_compute(isa, wt, w, wrb, act, n, n_in, got, stride, o0, o1);
        for (int64_t r = 0; r < n; r++)
            cinfer_cpu_matmul_compute(isa, wt, w, wrb, act + arb * (size_t)r, 1, n_in,
                                      one + r * stride, stride, o0, o1);
        const size_t bytes = sizeof(float) * (size_t)(n * stride);
        const int same = memcmp(got, want, bytes) == 0;
        const int alone = memcmp(one, want, bytes) == 0;
        if (!same || !alone)
            fprintf(stderr, "rows: isa %s wt %s n_in %lld n_out %lld n %lld "
                    "[%lld, %lld): batch %s, row by row %s\n",
                    cinfer_cpu_isa_name(isa), cinfer_dtype_name(wt), (long long)n_in,
                    (long long)n_out, (long long)n, (long long)o0, (long long)o1,
                    same ? "same" : "DIFFERS", alone ? "same" : "DIFFERS");
        CHECK(same);
        CHECK(alone);
    }
    free(one);
    free(got);
    free(want);
    free(act);
    free(x);
    free(w);
}

static void test_batched_rows(void)
{
    static const cinfer_dtype types[] = {CINFER_DTYPE_Q8_0, CINFER_DTYPE_Q4_0,
                                         CINFER_DTYPE_Q4_1};
    static const int64_t ns[] = {1,  2,  3,  4,  5,  6,   7,   8,   9,   15,  16,  17, 31,
                                 33, 63, 64, 65, 100, 127, 129, 255, 257, 511, 600};
    const int n_ns = (int)(sizeof(ns) / sizeof(ns[0]));
    uint64_t seed = 500;
    for (int t = 0; t < 3; t++) {
        const cinfer_dtype wt = types[t];
        for (int i = 0; i < n_ns; i++) {
            /* 3 blocks: one panel holds every column */
            check_rows(wt, 96, 37, ns[i], 0, 37, seed++);
            if (ns[i] <= 65) {
                /* 25 blocks: panels of 80 columns, ranges off them */
                check_rows(wt, 800, 197, ns[i], 0, 197, seed++);
                check_rows(wt, 800, 197, ns[i], 16, 181, seed++);
                check_rows(wt, 800, 197, ns[i], 33, 34, seed++);
            }
        }
        check_rows(wt, 32, 5, 9, 1, 4, seed++);           /* one block */
        check_rows(wt, 32 * 256, 19, 25, 0, 19, seed++);  /* AVX-512: a panel of one group */
        check_rows(wt, 32 * 512, 3, 6, 0, 3, seed++);     /* a panel of one tile */
        check_rows(wt, 32 * 1025, 3, 6, 0, 3, seed++);    /* past the scratch */
    }
}

/* K-quant and IQ4 batches: row counts around the AVX-512 kernels' tile
 * of 8 rows, one to 11 super-blocks (IQ4_NL: odd block counts, so the
 * scalar tail), column ranges. */
static void test_kquant_rows(void)
{
    static const cinfer_dtype types[] = {CINFER_DTYPE_Q4_K, CINFER_DTYPE_Q5_K,
                                         CINFER_DTYPE_Q6_K, CINFER_DTYPE_Q2_K,
                                         CINFER_DTYPE_Q3_K, CINFER_DTYPE_IQ4_XS,
                                         CINFER_DTYPE_IQ4_NL};
    static const int64_t ns[] = {1, 2, 7, 8, 9, 15, 16, 17, 33};
    uint64_t seed = 900;
    for (int t = 0; t < (int)(sizeof(types) / sizeof(types[0])); t++) {
        const cinfer_dtype wt = types[t];
        const int64_t be = cinfer_dtype_block_elems(wt);
        for (int i = 0; i < (int)(sizeof(ns) / sizeof(ns[0])); i++) {
            check_rows(wt, be == 32 ? 32 * 25 : 256 * 3, 37, ns[i], 0, 37, seed++);
            check_rows(wt, be == 32 ? 32 * 3 : 256, 21, ns[i], 5, 19, seed++);
        }
        check_rows(wt, be == 32 ? 32 : 256 * 11, 3, 10, 0, 3, seed++);
    }
}

int main(void)
{
    RUN(test_supported_and_pairs);
    RUN(test_prepare_edges);
    RUN(test_empty_inner);
    RUN(test_f32);
    RUN(test_f16);
    RUN(test_bf16);
    RUN(test_q8_0);
    RUN(test_packed);
    RUN(test_q4_0);
    RUN(test_q4_1);
    RUN(test_q4_k);
    RUN(test_q5_k);
    RUN(test_q6_k);
    RUN(test_q2_k);
    RUN(test_q3_k);
    RUN(test_iq4_xs);
    RUN(test_iq4_nl);
    RUN(test_batched_rows);
    RUN(test_kquant_rows);
    return harness_done();
}
