/*
 * matmul.c - dispatch of the CPU matrix-product kernels, and their portable
 * C implementation.
 *
 * The portable code is the executable definition of the reduction order
 * described in matmul_impl.h: every SIMD path must produce the same bits.
 * It is written for clarity (one output element at a time) rather than
 * speed; the AVX2 and AVX-512 files hold the fast paths. It is compiled for
 * baseline x86-64 (or any other target), so fused multiply-adds go through
 * fmaf(), which rounds once as the SIMD instructions do.
 *
 * Weight / activation pairs (as GGML pairs them): Q4_1 x Q8_1, Q8_0 x Q8_0,
 * Q4_0 x Q8_0, F16 x F16, BF16 x BF16, F32 x F32.
 */
#include "matmul.h"

#include <math.h>
#include <string.h>

#include "matmul_impl.h"

/* ---------------------------------------------------------------------- */
/* dispatch                                                               */
/* ---------------------------------------------------------------------- */

int cinfer_cpu_matmul_supported(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_F32:
    case CINFER_DTYPE_F16:
    case CINFER_DTYPE_BF16:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
        return 1;
    default:
        return 0;
    }
}

cinfer_dtype cinfer_cpu_matmul_act_type(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_Q4_1:
        return CINFER_DTYPE_Q8_1;
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
        return CINFER_DTYPE_Q8_0;
    case CINFER_DTYPE_F16:
        return CINFER_DTYPE_F16;
    case CINFER_DTYPE_BF16:
        return CINFER_DTYPE_BF16;
    default:
        return CINFER_DTYPE_F32;
    }
}

/* AUTO is resolved here only as a convenience for direct callers; the
 * backend passes a concrete ISA it has checked. */
static cinfer_cpu_isa resolve_isa(cinfer_cpu_isa isa)
{
    if (isa != CINFER_CPU_ISA_AUTO)
        return isa;
    if (cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX512))
        return CINFER_CPU_ISA_AVX512;
    if (cinfer_cpu_isa_supported(CINFER_CPU_ISA_AVX2))
        return CINFER_CPU_ISA_AVX2;
    return CINFER_CPU_ISA_PORTABLE;
}

void cinfer_cpu_matmul_prepare(cinfer_cpu_isa isa, cinfer_dtype act_type,
                               const float *x, int64_t n_in, int64_t r0,
                               int64_t r1, void *act)
{
    if (r1 <= r0)
        return;
    switch (resolve_isa(isa)) {
#ifdef CINFER_MATMUL_HAVE_AVX512
    case CINFER_CPU_ISA_AVX512:
        cinfer_cpu_matmul_prepare_avx512(act_type, x, n_in, r0, r1, act);
        return;
#endif
#ifdef CINFER_MATMUL_HAVE_AVX2
    case CINFER_CPU_ISA_AVX2:
        cinfer_cpu_matmul_prepare_avx2(act_type, x, n_in, r0, r1, act);
        return;
#endif
    default:
        cinfer_cpu_matmul_prepare_portable(act_type, x, n_in, r0, r1, act);
        return;
    }
}

void cinfer_cpu_matmul_compute(cinfer_cpu_isa isa, cinfer_dtype wt,
                               const void *w, size_t w_row_bytes,
                               const void *act, int64_t n, int64_t n_in,
                               float *out, int64_t out_stride, int64_t o0,
                               int64_t o1)
{
    if (n <= 0 || o1 <= o0)
        return;
    switch (resolve_isa(isa)) {
#ifdef CINFER_MATMUL_HAVE_AVX512
    case CINFER_CPU_ISA_AVX512:
        cinfer_cpu_matmul_compute_avx512(wt, w, w_row_bytes, act, n, n_in, out,
                                         out_stride, o0, o1);
        return;
#endif
#ifdef CINFER_MATMUL_HAVE_AVX2
    case CINFER_CPU_ISA_AVX2:
        cinfer_cpu_matmul_compute_avx2(wt, w, w_row_bytes, act, n, n_in, out,
                                       out_stride, o0, o1);
        return;
#endif
    default:
        cinfer_cpu_matmul_compute_portable(wt, w, w_row_bytes, act, n, n_in,
                                           out, out_stride, o0, o1);
        return;
    }
}

/* ---------------------------------------------------------------------- */
/* portable: prepare                                                      */
/* ---------------------------------------------------------------------- */

void cinfer_cpu_matmul_prepare_portable(cinfer_dtype act_type, const float *x,
                                        int64_t n_in, int64_t r0, int64_t r1,
                                        void *act)
{
    size_t rb = cinfer_dtype_row_bytes(act_type, n_in);
    for (int64_t r = r0; r < r1; r++)
        cinfer_quantize_row(act_type, x + r * n_in, (uint8_t *)act + r * rb,
                            n_in);
}

/* ---------------------------------------------------------------------- */
/* portable: compute                                                      */
/* ---------------------------------------------------------------------- */

/* ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)) */
static float hsum8(const float *l)
{
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6],
          a3 = l[3] + l[7];
    return (a0 + a2) + (a1 + a3);
}

static float hsum16(const float *l)
{
    float h8[8];
    for (int i = 0; i < 8; i++)
        h8[i] = l[i] + l[i + 8];
    float h4[4];
    for (int i = 0; i < 4; i++)
        h4[i] = h8[i] + h8[i + 4];
    float h2a = h4[0] + h4[2], h2b = h4[1] + h4[3];
    return h2a + h2b;
}

static float f16(uint16_t h) { return cinfer_fp16_to_fp32(h); }

/* The weight block's 32 quants as signed ints (Q4_0 offset by -8). */
static void unpack_q4(const uint8_t *qs, int offset, int *q)
{
    for (int j = 0; j < CINFER_QK / 2; j++) {
        q[j] = (qs[j] & 15) - offset;
        q[j + 16] = (qs[j] >> 4) - offset;
    }
}

static float dot_q(cinfer_dtype wt, const void *wrow, const void *arow,
                   int64_t nb)
{
    float acc[8] = {0};
    float summs = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        int qw[CINFER_QK];
        const int8_t *qa;
        float dd;
        if (wt == CINFER_DTYPE_Q4_1) {
            const cinfer_block_q4_1 *wb = (const cinfer_block_q4_1 *)wrow + b;
            const cinfer_block_q8_1 *ab = (const cinfer_block_q8_1 *)arow + b;
            unpack_q4(wb->qs, 0, qw);
            qa = ab->qs;
            dd = f16(wb->d) * f16(ab->d);
            float ms = f16(wb->m) * f16(ab->s);
            summs = summs + ms;
        } else {
            const cinfer_block_q8_0 *ab = (const cinfer_block_q8_0 *)arow + b;
            qa = ab->qs;
            if (wt == CINFER_DTYPE_Q4_0) {
                const cinfer_block_q4_0 *wb =
                    (const cinfer_block_q4_0 *)wrow + b;
                unpack_q4(wb->qs, 8, qw);
                dd = f16(wb->d) * f16(ab->d);
            } else {
                const cinfer_block_q8_0 *wb =
                    (const cinfer_block_q8_0 *)wrow + b;
                for (int j = 0; j < CINFER_QK; j++)
                    qw[j] = wb->qs[j];
                dd = f16(wb->d) * f16(ab->d);
            }
        }
        for (int l = 0; l < 8; l++) {
            int isum = 0;
            for (int j = 4 * l; j < 4 * l + 4; j++)
                isum += qw[j] * qa[j];
            acc[l] = fmaf(dd, (float)isum, acc[l]);
        }
    }
    float s = hsum8(acc);
    if (wt == CINFER_DTYPE_Q4_1)
        s = s + summs;
    return s;
}

/* Element i of a float-type row widened to fp32. */
static float load_elem(cinfer_dtype t, const void *row, int64_t i)
{
    switch (t) {
    case CINFER_DTYPE_F16:
        return cinfer_fp16_to_fp32(((const uint16_t *)row)[i]);
    case CINFER_DTYPE_BF16:
        return cinfer_bf16_to_fp32(((const uint16_t *)row)[i]);
    default:
        return ((const float *)row)[i];
    }
}

static float dot_f(cinfer_dtype wt, const void *wrow, const void *arow,
                   int64_t n_in)
{
    float acc[16] = {0};
    if (wt == CINFER_DTYPE_BF16) {
        for (int64_t c = 0; c < n_in; c += 32) {
            for (int l = 0; l < 16; l++) {
                int64_t e = c + 2 * l, o = e + 1;
                float we = e < n_in ? load_elem(wt, wrow, e) : 0.0f;
                float ae = e < n_in ? load_elem(wt, arow, e) : 0.0f;
                float wo = o < n_in ? load_elem(wt, wrow, o) : 0.0f;
                float ao = o < n_in ? load_elem(wt, arow, o) : 0.0f;
                acc[l] = fmaf(wo, ao, acc[l]);
                acc[l] = fmaf(we, ae, acc[l]);
            }
        }
    } else {
        for (int64_t c = 0; c < n_in; c += 16) {
            for (int l = 0; l < 16; l++) {
                int64_t e = c + l;
                float we = e < n_in ? load_elem(wt, wrow, e) : 0.0f;
                float ae = e < n_in ? load_elem(wt, arow, e) : 0.0f;
                acc[l] = fmaf(we, ae, acc[l]);
            }
        }
    }
    return hsum16(acc);
}

void cinfer_cpu_matmul_compute_portable(cinfer_dtype wt, const void *w,
                                        size_t w_row_bytes, const void *act,
                                        int64_t n, int64_t n_in, float *out,
                                        int64_t out_stride, int64_t o0,
                                        int64_t o1)
{
    cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    size_t arb = cinfer_dtype_row_bytes(at, n_in);
    int quant = cinfer_dtype_block_elems(wt) > 1;
    for (int64_t o = o0; o < o1; o++) {
        const uint8_t *wrow = (const uint8_t *)w + (size_t)o * w_row_bytes;
        for (int64_t r = 0; r < n; r++) {
            const uint8_t *arow = (const uint8_t *)act + (size_t)r * arb;
            out[r * out_stride + o] =
                quant ? dot_q(wt, wrow, arow, n_in / CINFER_QK)
                      : dot_f(wt, wrow, arow, n_in);
        }
    }
}
