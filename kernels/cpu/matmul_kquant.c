/*
 * matmul_kquant.c - portable C products of the K-quant weights (Q2_K, Q3_K,
 * Q4_K, Q5_K, Q6_K) and IQ4_XS with Q8_K activations, and of IQ4_NL with
 * Q8_0 activations.
 *
 * The reduction order, which every ISA follows (it is the order of GGML's
 * AVX2 ggml_vec_dot_<type>_q8_K / ggml_vec_dot_iq4_nl_q8_0, so results
 * match llama.cpp's CPU backend where it takes those paths). For a super-block b
 * of 256 elements with activation scale da (fp32) and weight scale dw:
 *
 *   Q4_K: the order of GGML's ggml_gemv_q4_K_8x8_q8_K (x86), which
 *     llama.cpp's CPU buffers take for every Q4_K weight whose row count
 *     is a multiple of 8 (repack.cpp's q4_K_8x8_q8_K) and for every
 *     token it generates: one exact int per super-block and two scalar
 *     accumulators
 *     dd = f(dw) * da; dm = f(dmin_w) * da (plain products)
 *     isum = sum_k sc[k] * sum_{e<32} q[32k + e] * a[32k + e]
 *     imin = sum_k m[k] * (bs[2k] + bs[2k + 1])
 *     acc  = fma((float)isum, dd, acc); accm = fma((float)imin, dm, accm)
 *   out = acc - accm
 *     (cinfer takes this order for every Q4_K weight; llama.cpp keeps
 *     ggml_vec_dot_q4_K_q8_K's for a weight of rows % 8 != 0)
 *
 *   Q5_K: d = da * f(dw); dmin = -da * f(dmin_w)
 *     isum[l] (l = 0..7, exact int32) = sum over chunks c = 0..3 of
 *         sc[2c]     * sum_{t<4} q[64c + 4l + t]      * a[64c + 4l + t]
 *       + sc[2c + 1] * sum_{t<4} q[64c + 32 + 4l + t] * a[64c + 32 + 4l + t]
 *     with q in 0..31, acc[l] = fma(d, (float)isum[l], acc[l]), and the
 *     mins reduced to one integer per super-block and one accumulator:
 *     msum[k] (k = 0..3) = m[2k] * (bs[4k] + bs[4k+1])
 *                        + m[2k+1] * (bs[4k+2] + bs[4k+3])
 *     summs = fma(dmin, (float)(msum0 + msum1 + msum2 + msum3), summs)
 *     (GGML's source writes summs += dmin * msum; GCC fuses it, as GNU C's
 *     default -ffp-contract=fast allows, and the llama.cpp build the
 *     goldens use computes the fused form: checked bit for bit)
 *   out = hsum8(acc) + summs
 *
 *   Q6_K: d = da * f(dw); q in 0..63 (unsigned, the "- 32" comes last)
 *     isum[l] = sum over the eight 32-element parts p (elements 32p ..)
 *         scales[2p + (l >= 4)] * sum_{t<4} q[32p + 4l + t] * a[32p + 4l + t]
 *       - 32 * (bs[2l] * scales[2l] + bs[2l+1] * scales[2l+1])
 *     acc[l]  = fma(d, (float)isum[l], acc[l])
 *   out = hsum8(acc)
 *
 *   Q2_K: the order of GGML's ggml_gemv_q2_K_8x8_q8_K (x86), which
 *     llama.cpp's CPU buffers take on AVX-512 for every Q2_K weight whose
 *     row count is a multiple of 8 (repack.cpp's q2_K_8x8_q8_K), with
 *     sc = scales & 15 and m = scales >> 4 per 16-element sub-block j:
 *     dd = f(dw) * da; dm = f(dmin_w) * da (plain products)
 *     isum = sum_j sc[j] * sum_{e<16} q[16j + e] * a[16j + e]
 *     imin = sum_j m[j] * bs[j]
 *     acc  = fma((float)isum, dd, acc); accm = fma((float)imin, dm, accm)
 *   out = acc - accm
 *     (cinfer takes this order for every Q2_K weight; llama.cpp keeps
 *     ggml_vec_dot_q2_K_q8_K's on AVX2 machines and for rows % 8 != 0)
 *
 *   Q3_K: d = da * f(dw); q - 4 in -4..3, s - 32 the signed scales
 *     isum[l] = as Q2_K's with (s - 32) for sc and (q - 4) for q
 *     acc[l]  = fma(d, (float)isum[l], acc[l])
 *   out = hsum8(acc)
 *
 *   IQ4_XS: d = f(dw) * da; v = kvalues_iq4nl[q], ls - 32 the scales
 *     isum[l] = sum over sub-blocks j of
 *         (ls[j] - 32) * sum_{t<4} v[32j + 4l + t] * a[32j + 4l + t]
 *     acc[l]  = fma(d, (float)isum[l], acc[l])
 *   out = hsum8(acc)
 *
 *   IQ4_NL x Q8_0 (blocks of 32): the order of GGML's x86
 *     ggml_gemv_iq4_nl_8x8_q8_0 (gemv_q4_b32_8x8_q8_0_lut_avx), which
 *     llama.cpp's CPU buffers take on AVX2 for every IQ4_NL weight whose
 *     row count is a multiple of 8 (repack.cpp's iq4_nl_8x8_q8_0): one
 *     exact int and one scalar accumulator, blocks in order
 *     isum = sum_{e<32} v[e] * a[e]
 *     out  = fma((float)isum, f(dw) * f(da), out)
 *     (cinfer takes this order for every IQ4_NL weight, as for Q4_K;
 *     llama.cpp keeps ggml_vec_dot_iq4_nl_q8_0's for rows % 8 != 0)
 *
 * with bs the activation's bsums, f() fp16 -> fp32, and hsum8 the tree of
 * matmul_impl.h. The integer sums are exact, so only the float steps fix
 * the bits; every path performs exactly these.
 */
#include <math.h>
#include <string.h>

#include "matmul_impl.h"

static float hsum8(const float *l)
{
    float a0 = l[0] + l[4], a1 = l[1] + l[5], a2 = l[2] + l[6],
          a3 = l[3] + l[7];
    return (a0 + a2) + (a1 + a3);
}

static float dot_q4_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q4_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float dd = cinfer_fp16_to_fp32(x[b].d) * y[b].d;
        const float dm = cinfer_fp16_to_fp32(x[b].dmin) * y[b].d;
        uint8_t sc[8], m[8];
        for (int k = 0; k < 8; k++)
            cinfer_dtype_k4_scale_min(x[b].scales, k, &sc[k], &m[k]);
        const uint8_t *q = x[b].qs;
        const int8_t *a = y[b].qs;
        const int16_t *bs = y[b].bsums;
        int32_t isum = 0, imin = 0;
        for (int c = 0; c < 4; c++) {
            int lo = 0, hi = 0;
            for (int i = 0; i < 32; i++) {
                int byte = q[32 * c + i];
                lo += (byte & 15) * a[64 * c + i];
                hi += (byte >> 4) * a[64 * c + 32 + i];
            }
            isum += sc[2 * c] * lo + sc[2 * c + 1] * hi;
        }
        for (int k = 0; k < 8; k++)
            imin += m[k] * (bs[2 * k] + bs[2 * k + 1]);
        acc = fmaf((float)isum, dd, acc);
        accm = fmaf((float)imin, dm, accm);
    }
    return acc - accm;
}

static float dot_q5_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q5_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc[8] = {0}, summs = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * cinfer_fp16_to_fp32(x[b].d);
        const float dmin = -y[b].d * cinfer_fp16_to_fp32(x[b].dmin);
        uint8_t sc[8], m[8];
        for (int k = 0; k < 8; k++)
            cinfer_dtype_k4_scale_min(x[b].scales, k, &sc[k], &m[k]);
        const uint8_t *q = x[b].qs, *qh = x[b].qh;
        const int8_t *a = y[b].qs;
        int32_t isum[8] = {0};
        for (int c = 0; c < 4; c++) {
            for (int l = 0; l < 8; l++) {
                int lo = 0, hi = 0;
                for (int t = 0; t < 4; t++) {
                    int i = 4 * l + t, byte = q[32 * c + i];
                    int ql = (byte & 15) | (((qh[i] >> (2 * c)) & 1) << 4);
                    int qhi = (byte >> 4) | (((qh[i] >> (2 * c + 1)) & 1) << 4);
                    lo += ql * a[64 * c + i];
                    hi += qhi * a[64 * c + 32 + i];
                }
                isum[l] += sc[2 * c] * lo + sc[2 * c + 1] * hi;
            }
        }
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(d, (float)isum[l], acc[l]);
        const int16_t *bs = y[b].bsums;
        int ms = 0;
        for (int k = 0; k < 8; k++)
            ms += m[k] * (bs[2 * k] + bs[2 * k + 1]);
        summs = fmaf(dmin, (float)ms, summs);
    }
    return hsum8(acc) + summs;
}

static float dot_q6_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q6_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * cinfer_fp16_to_fp32(x[b].d);
        const int8_t *sc = x[b].scales;
        const int8_t *a = y[b].qs;
        int32_t isum[8] = {0};
        for (int p = 0; p < 8; p++) {
            const int h = p / 4, i0 = 32 * (p % 4);
            for (int l = 0; l < 8; l++) {
                int s = 0;
                for (int t = 0; t < 4; t++) {
                    int i = i0 + 4 * l + t;
                    int lo = (x[b].ql[64 * h + i % 64] >> (4 * (i / 64))) & 15;
                    int hi = (x[b].qh[32 * h + i % 32] >> (2 * (i / 32))) & 3;
                    s += (lo | (hi << 4)) * a[128 * h + i];
                }
                isum[l] += sc[2 * p + (l >= 4)] * s;
            }
        }
        const int16_t *bs = y[b].bsums;
        for (int l = 0; l < 8; l++) {
            isum[l] -= 32 * (bs[2 * l] * sc[2 * l] + bs[2 * l + 1] * sc[2 * l + 1]);
            acc[l] = fmaf(d, (float)isum[l], acc[l]);
        }
    }
    return hsum8(acc);
}

/* Q2_K and Q3_K: 2-bit quant e of a super-block's 64 qs bytes. */
static inline int q2_bits(const uint8_t *qs, int e)
{
    return (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
}

static float dot_q2_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q2_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc = 0.0f, accm = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float dd = cinfer_fp16_to_fp32(x[b].d) * y[b].d;
        const float dm = cinfer_fp16_to_fp32(x[b].dmin) * y[b].d;
        const uint8_t *sc = x[b].scales;
        const int16_t *bs = y[b].bsums;
        const int8_t *a = y[b].qs;
        int32_t isum = 0, imin = 0;
        for (int j = 0; j < 16; j++) {
            imin += (sc[j] >> 4) * bs[j];
            int s = 0;
            for (int e = 16 * j; e < 16 * j + 16; e++)
                s += q2_bits(x[b].qs, e) * a[e];
            isum += (sc[j] & 15) * s;
        }
        acc = fmaf((float)isum, dd, acc);
        accm = fmaf((float)imin, dm, accm);
    }
    return acc - accm;
}

static float dot_q3_k(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_q3_k *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const float d = y[b].d * cinfer_fp16_to_fp32(x[b].d);
        uint8_t sc[16];
        cinfer_dtype_q3k_scales(x[b].scales, sc);
        const int8_t *a = y[b].qs;
        int32_t isum[8] = {0};
        for (int p = 0; p < 8; p++) {
            for (int l = 0; l < 8; l++) {
                int s = 0;
                for (int t = 0; t < 4; t++) {
                    int e = 32 * p + 4 * l + t;
                    int q = q2_bits(x[b].qs, e) | (((x[b].hmask[e % 32] >> (e / 32)) & 1) << 2);
                    s += (q - 4) * a[e];
                }
                isum[l] += (sc[2 * p + (l >= 4)] - 32) * s;
            }
        }
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(d, (float)isum[l], acc[l]);
    }
    return hsum8(acc);
}

/* IQ4 level of element e (0..31) of 16 nibble bytes (Q4_0's order). */
static inline int iq4_value(const uint8_t *qs, int e)
{
    return cinfer_iq4nl_values[e < 16 ? qs[e] & 15 : qs[e - 16] >> 4];
}

static float dot_iq4_xs(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_iq4_xs *x = vx;
    const cinfer_block_q8_k *y = vy;
    float acc[8] = {0};
    for (int64_t b = 0; b < nb; b++) {
        const float d = cinfer_fp16_to_fp32(x[b].d) * y[b].d;
        int32_t isum[8] = {0};
        for (int j = 0; j < 8; j++) {
            const int ls = ((x[b].scales_l[j / 2] >> (4 * (j % 2))) & 15) |
                           (((x[b].scales_h >> (2 * j)) & 3) << 4);
            const int8_t *a = y[b].qs + 32 * j;
            for (int l = 0; l < 8; l++) {
                int s = 0;
                for (int t = 0; t < 4; t++)
                    s += iq4_value(x[b].qs + 16 * j, 4 * l + t) * a[4 * l + t];
                isum[l] += (ls - 32) * s;
            }
        }
        for (int l = 0; l < 8; l++)
            acc[l] = fmaf(d, (float)isum[l], acc[l]);
    }
    return hsum8(acc);
}

static float dot_iq4_nl(const void *vx, const void *vy, int64_t nb)
{
    const cinfer_block_iq4_nl *x = vx;
    const cinfer_block_q8_0 *y = vy;
    float out = 0.0f;
    for (int64_t b = 0; b < nb; b++) {
        const float d = cinfer_fp16_to_fp32(x[b].d) * cinfer_fp16_to_fp32(y[b].d);
        int s = 0;
        for (int e = 0; e < 32; e++)
            s += iq4_value(x[b].qs, e) * y[b].qs[e];
        out = fmaf((float)s, d, out);
    }
    return out;
}

typedef float (*dot_fn)(const void *x, const void *y, int64_t nb);

static dot_fn pick(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_Q2_K: return dot_q2_k;
    case CINFER_DTYPE_Q3_K: return dot_q3_k;
    case CINFER_DTYPE_Q4_K: return dot_q4_k;
    case CINFER_DTYPE_Q5_K: return dot_q5_k;
    case CINFER_DTYPE_IQ4_XS: return dot_iq4_xs;
    case CINFER_DTYPE_IQ4_NL: return dot_iq4_nl;
    default: return dot_q6_k;
    }
}

void cinfer_cpu_matmul_compute_kquant_portable(cinfer_dtype wt, const void *w,
                                               size_t w_row_bytes,
                                               const void *act, int64_t n,
                                               int64_t n_in, float *out,
                                               int64_t out_stride, int64_t o0,
                                               int64_t o1)
{
    const size_t arb = cinfer_dtype_row_bytes(cinfer_cpu_matmul_act_type(wt), n_in);
    const int64_t nb = n_in / cinfer_dtype_block_elems(wt);
    const dot_fn dot = pick(wt);
    for (int64_t o = o0; o < o1; o++) {
        const void *wrow = (const uint8_t *)w + (size_t)o * w_row_bytes;
        for (int64_t r = 0; r < n; r++)
            out[r * out_stride + o] = dot(wrow, (const uint8_t *)act + (size_t)r * arb, nb);
    }
}

/* The ISA's kernels; every one computes the bits above, so the choice may
 * change with the row count without breaking batch invariance. */
void cinfer_cpu_matmul_compute_kquant(cinfer_cpu_isa isa, cinfer_dtype wt,
                                      const void *w, size_t w_row_bytes,
                                      const void *act, int64_t n, int64_t n_in,
                                      float *out, int64_t out_stride,
                                      int64_t o0, int64_t o1)
{
    switch (isa) {
#ifdef CINFER_MATMUL_HAVE_AVX512
    case CINFER_CPU_ISA_AVX512:
        cinfer_cpu_matmul_compute_kquant_avx512(wt, w, w_row_bytes, act, n, n_in,
                                                out, out_stride, o0, o1);
        return;
#endif
#ifdef CINFER_MATMUL_HAVE_AVX2
    case CINFER_CPU_ISA_AVX2:
        cinfer_cpu_matmul_compute_kquant_avx2(wt, w, w_row_bytes, act, n, n_in,
                                              out, out_stride, o0, o1);
        return;
#endif
    default:
        cinfer_cpu_matmul_compute_kquant_portable(wt, w, w_row_bytes, act, n,
                                                  n_in, out, out_stride, o0, o1);
        return;
    }
}
