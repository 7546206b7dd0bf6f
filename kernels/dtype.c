/* dtype.c - scalar reference conversions for every supported element type.
 *
 * Activation quantization (Q8_0, Q8_1) follows the form GGML's x86 kernels
 * use: scale 127/amax and round half to even, so that logits computed here
 * agree with llama.cpp's as closely as the arithmetic allows. */
#include "dtype.h"

#include <math.h>
#include <string.h>

int cinfer_dtype_valid(uint32_t id)
{
    switch (id) {
    case CINFER_DTYPE_F32:
    case CINFER_DTYPE_F16:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q8_1:
    case CINFER_DTYPE_I32:
    case CINFER_DTYPE_BF16:
        return 1;
    default:
        return 0;
    }
}

const char *cinfer_dtype_name(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F32: return "F32";
    case CINFER_DTYPE_F16: return "F16";
    case CINFER_DTYPE_Q4_0: return "Q4_0";
    case CINFER_DTYPE_Q4_1: return "Q4_1";
    case CINFER_DTYPE_Q8_0: return "Q8_0";
    case CINFER_DTYPE_Q8_1: return "Q8_1";
    case CINFER_DTYPE_I32: return "I32";
    case CINFER_DTYPE_BF16: return "BF16";
    }
    return "?";
}

int cinfer_dtype_block_elems(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q8_1:
        return CINFER_QK;
    default:
        return 1;
    }
}

size_t cinfer_dtype_block_bytes(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F32: return 4;
    case CINFER_DTYPE_F16: return 2;
    case CINFER_DTYPE_BF16: return 2;
    case CINFER_DTYPE_I32: return 4;
    case CINFER_DTYPE_Q4_0: return sizeof(cinfer_block_q4_0);
    case CINFER_DTYPE_Q4_1: return sizeof(cinfer_block_q4_1);
    case CINFER_DTYPE_Q8_0: return sizeof(cinfer_block_q8_0);
    case CINFER_DTYPE_Q8_1: return sizeof(cinfer_block_q8_1);
    }
    return 0;
}

size_t cinfer_dtype_row_bytes(cinfer_dtype t, int64_t n)
{
    int be = cinfer_dtype_block_elems(t);
    if (n < 0 || n % be != 0)
        return 0;
    return (size_t)(n / be) * cinfer_dtype_block_bytes(t);
}

/* ---------------------------------------------------------------------- */
/* half and bfloat16                                                      */
/* ---------------------------------------------------------------------- */

static uint32_t f2u(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static float u2f(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

float cinfer_fp16_to_fp32(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f;
    uint32_t man = h & 0x3ff;
    if (exp == 0) {
        /* zero or subnormal: man * 2^-24 */
        float f = (float)man * 5.9604644775390625e-8f;
        return sign ? -f : f;
    }
    if (exp == 31)
        return u2f(sign | 0x7f800000u | (man << 13));
    return u2f(sign | ((exp + 112) << 23) | (man << 13));
}

uint16_t cinfer_fp32_to_fp16(float f)
{
    uint32_t u = f2u(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000);
    uint32_t abs = u & 0x7fffffffu;
    if (abs > 0x7f800000u) /* NaN */
        return (uint16_t)(sign | 0x7e00);
    if (abs >= 0x477ff000u) /* rounds to >= 65520: infinity */
        return (uint16_t)(sign | 0x7c00);
    if (abs < 0x38800000u) {
        /* subnormal or zero in half: value / 2^-24, rounded to even */
        float a = u2f(abs) * 16777216.0f;
        return (uint16_t)(sign | (uint16_t)nearbyintf(a));
    }
    uint32_t r = abs + 0x0fffu + ((abs >> 13) & 1u); /* round to nearest even */
    return (uint16_t)(sign | ((r - 0x38000000u) >> 13));
}

float cinfer_bf16_to_fp32(uint16_t h) { return u2f((uint32_t)h << 16); }

uint16_t cinfer_fp32_to_bf16(float f)
{
    uint32_t u = f2u(f);
    if ((u & 0x7fffffffu) > 0x7f800000u)
        return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

/* ---------------------------------------------------------------------- */
/* quantize / dequantize                                                  */
/* ---------------------------------------------------------------------- */

static void quant_q8(const float *x, int8_t *q, float *d_out, int *sum_out)
{
    float amax = 0.0f;
    for (int j = 0; j < CINFER_QK; j++) {
        float a = fabsf(x[j]);
        amax = a > amax ? a : amax;
    }
    float d = amax / 127.0f;
    float id = amax != 0.0f ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < CINFER_QK; j++) {
        int v = (int)nearbyintf(x[j] * id);
        q[j] = (int8_t)v;
        sum += v;
    }
    *d_out = d;
    *sum_out = sum;
}

void cinfer_quantize_row(cinfer_dtype t, const float *src, void *dst,
                         int64_t n)
{
    int64_t nb = n / CINFER_QK;
    switch (t) {
    case CINFER_DTYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return;
    case CINFER_DTYPE_F16: {
        uint16_t *o = dst;
        for (int64_t i = 0; i < n; i++)
            o[i] = cinfer_fp32_to_fp16(src[i]);
        return;
    }
    case CINFER_DTYPE_BF16: {
        uint16_t *o = dst;
        for (int64_t i = 0; i < n; i++)
            o[i] = cinfer_fp32_to_bf16(src[i]);
        return;
    }
    case CINFER_DTYPE_Q8_0: {
        cinfer_block_q8_0 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            float d;
            int sum;
            quant_q8(src + i * CINFER_QK, b[i].qs, &d, &sum);
            b[i].d = cinfer_fp32_to_fp16(d);
        }
        return;
    }
    case CINFER_DTYPE_Q8_1: {
        cinfer_block_q8_1 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            float d;
            int sum;
            quant_q8(src + i * CINFER_QK, b[i].qs, &d, &sum);
            b[i].d = cinfer_fp32_to_fp16(d);
            b[i].s = cinfer_fp32_to_fp16(d * (float)sum);
        }
        return;
    }
    case CINFER_DTYPE_Q4_0: {
        cinfer_block_q4_0 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            const float *x = src + i * CINFER_QK;
            float amax = 0.0f, max = 0.0f;
            for (int j = 0; j < CINFER_QK; j++) {
                if (fabsf(x[j]) > amax) {
                    amax = fabsf(x[j]);
                    max = x[j];
                }
            }
            float d = max / -8.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[i].d = cinfer_fp32_to_fp16(d);
            for (int j = 0; j < CINFER_QK / 2; j++) {
                int q0 = (int)(x[j] * id + 8.5f);
                int q1 = (int)(x[j + 16] * id + 8.5f);
                q0 = q0 > 15 ? 15 : q0;
                q1 = q1 > 15 ? 15 : q1;
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        return;
    }
    case CINFER_DTYPE_Q4_1: {
        cinfer_block_q4_1 *b = dst;
        for (int64_t i = 0; i < nb; i++) {
            const float *x = src + i * CINFER_QK;
            float min = x[0], max = x[0];
            for (int j = 1; j < CINFER_QK; j++) {
                min = x[j] < min ? x[j] : min;
                max = x[j] > max ? x[j] : max;
            }
            float d = (max - min) / 15.0f;
            float id = d != 0.0f ? 1.0f / d : 0.0f;
            b[i].d = cinfer_fp32_to_fp16(d);
            b[i].m = cinfer_fp32_to_fp16(min);
            for (int j = 0; j < CINFER_QK / 2; j++) {
                int q0 = (int)((x[j] - min) * id + 0.5f);
                int q1 = (int)((x[j + 16] - min) * id + 0.5f);
                q0 = q0 > 15 ? 15 : q0;
                q1 = q1 > 15 ? 15 : q1;
                b[i].qs[j] = (uint8_t)(q0 | (q1 << 4));
            }
        }
        return;
    }
    case CINFER_DTYPE_I32:
        return;
    }
}

void cinfer_dequantize_row(cinfer_dtype t, const void *src, float *dst,
                           int64_t n)
{
    int64_t nb = n / CINFER_QK;
    switch (t) {
    case CINFER_DTYPE_F32:
        memcpy(dst, src, (size_t)n * 4);
        return;
    case CINFER_DTYPE_F16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = cinfer_fp16_to_fp32(s[i]);
        return;
    }
    case CINFER_DTYPE_BF16: {
        const uint16_t *s = src;
        for (int64_t i = 0; i < n; i++)
            dst[i] = cinfer_bf16_to_fp32(s[i]);
        return;
    }
    case CINFER_DTYPE_Q8_0: {
        const cinfer_block_q8_0 *b = src;
        for (int64_t i = 0; i < nb; i++) {
            float d = cinfer_fp16_to_fp32(b[i].d);
            for (int j = 0; j < CINFER_QK; j++)
                dst[i * CINFER_QK + j] = d * (float)b[i].qs[j];
        }
        return;
    }
    case CINFER_DTYPE_Q8_1: {
        const cinfer_block_q8_1 *b = src;
        for (int64_t i = 0; i < nb; i++) {
            float d = cinfer_fp16_to_fp32(b[i].d);
            for (int j = 0; j < CINFER_QK; j++)
                dst[i * CINFER_QK + j] = d * (float)b[i].qs[j];
        }
        return;
    }
    case CINFER_DTYPE_Q4_0: {
        const cinfer_block_q4_0 *b = src;
        for (int64_t i = 0; i < nb; i++) {
            float d = cinfer_fp16_to_fp32(b[i].d);
            for (int j = 0; j < CINFER_QK / 2; j++) {
                dst[i * CINFER_QK + j] = d * (float)((b[i].qs[j] & 15) - 8);
                dst[i * CINFER_QK + j + 16] = d * (float)((b[i].qs[j] >> 4) - 8);
            }
        }
        return;
    }
    case CINFER_DTYPE_Q4_1: {
        const cinfer_block_q4_1 *b = src;
        for (int64_t i = 0; i < nb; i++) {
            float d = cinfer_fp16_to_fp32(b[i].d);
            float m = cinfer_fp16_to_fp32(b[i].m);
            for (int j = 0; j < CINFER_QK / 2; j++) {
                dst[i * CINFER_QK + j] = d * (float)(b[i].qs[j] & 15) + m;
                dst[i * CINFER_QK + j + 16] = d * (float)(b[i].qs[j] >> 4) + m;
            }
        }
        return;
    }
    case CINFER_DTYPE_I32:
        return;
    }
}
