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
    case CINFER_DTYPE_Q5_0:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q8_1:
    case CINFER_DTYPE_I32:
    case CINFER_DTYPE_BF16:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q8_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_NL:
    case CINFER_DTYPE_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

const char *cinfer_dtype_ggml_name(uint32_t id)
{
    static const char *const names[] = {
        "F32",    "F16",     "Q4_0",    "Q4_1",   "Q4_2",   "Q4_3",
        "Q5_0",   "Q5_1",    "Q8_0",    "Q8_1",   "Q2_K",   "Q3_K",
        "Q4_K",   "Q5_K",    "Q6_K",    "Q8_K",   "IQ2_XXS", "IQ2_XS",
        "IQ3_XXS", "IQ1_S",  "IQ4_NL",  "IQ3_S",  "IQ2_S",  "IQ4_XS",
        "I8",     "I16",     "I32",     "I64",    "F64",    "IQ1_M",
        "BF16",   "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0",
        "IQ4_NL_4_4", "IQ4_NL_4_8", "IQ4_NL_8_8", "MXFP4",
    };
    if (id < sizeof names / sizeof names[0])
        return names[id];
    return "?";
}

const char *cinfer_dtype_name(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_F32: return "F32";
    case CINFER_DTYPE_F16: return "F16";
    case CINFER_DTYPE_Q4_0: return "Q4_0";
    case CINFER_DTYPE_Q4_1: return "Q4_1";
    case CINFER_DTYPE_Q5_0: return "Q5_0";
    case CINFER_DTYPE_Q8_0: return "Q8_0";
    case CINFER_DTYPE_Q8_1: return "Q8_1";
    case CINFER_DTYPE_I32: return "I32";
    case CINFER_DTYPE_BF16: return "BF16";
    case CINFER_DTYPE_Q4_K: return "Q4_K";
    case CINFER_DTYPE_Q5_K: return "Q5_K";
    case CINFER_DTYPE_Q6_K: return "Q6_K";
    case CINFER_DTYPE_Q8_K: return "Q8_K";
    case CINFER_DTYPE_Q2_K: return "Q2_K";
    case CINFER_DTYPE_Q3_K: return "Q3_K";
    case CINFER_DTYPE_IQ4_NL: return "IQ4_NL";
    case CINFER_DTYPE_IQ4_XS: return "IQ4_XS";
    }
    return "?";
}

int cinfer_dtype_block_elems(cinfer_dtype t)
{
    switch (t) {
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q5_0:
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q8_1:
    case CINFER_DTYPE_IQ4_NL:
        return CINFER_QK;
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_XS:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q8_K:
        return CINFER_QK_K;
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
    case CINFER_DTYPE_Q5_0: return sizeof(cinfer_block_q5_0);
    case CINFER_DTYPE_Q8_0: return sizeof(cinfer_block_q8_0);
    case CINFER_DTYPE_Q8_1: return sizeof(cinfer_block_q8_1);
    case CINFER_DTYPE_Q4_K: return sizeof(cinfer_block_q4_k);
    case CINFER_DTYPE_Q5_K: return sizeof(cinfer_block_q5_k);
    case CINFER_DTYPE_Q6_K: return sizeof(cinfer_block_q6_k);
    case CINFER_DTYPE_Q8_K: return sizeof(cinfer_block_q8_k);
    case CINFER_DTYPE_Q2_K: return sizeof(cinfer_block_q2_k);
    case CINFER_DTYPE_Q3_K: return sizeof(cinfer_block_q3_k);
    case CINFER_DTYPE_IQ4_NL: return sizeof(cinfer_block_iq4_nl);
    case CINFER_DTYPE_IQ4_XS: return sizeof(cinfer_block_iq4_xs);
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

/* GGML's nearest_int: round half to even through the float adder. */
static int nearest_int(float f)
{
    float v = f + 12582912.0f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* GGML's quantize_row_q8_K_ref, one super-block. */
static void quant_q8_k(const float *x, cinfer_block_q8_k *y)
{
    float max = 0.0f, amax = 0.0f;
    for (int j = 0; j < CINFER_QK_K; j++) {
        float ax = fabsf(x[j]);
        if (ax > amax) {
            amax = ax;
            max = x[j];
        }
    }
    memset(y, 0, sizeof *y);
    if (amax == 0.0f)
        return;
    const float iscale = -127.0f / max;
    for (int j = 0; j < CINFER_QK_K; j++) {
        int v = nearest_int(iscale * x[j]);
        y->qs[j] = (int8_t)(v < 127 ? v : 127);
    }
    for (int k = 0; k < CINFER_QK_K / 16; k++) {
        int sum = 0;
        for (int j = 0; j < 16; j++)
            sum += y->qs[16 * k + j];
        y->bsums[k] = (int16_t)sum;
    }
    y->d = 1.0f / iscale;
}

void cinfer_dtype_k4_scale_min(const uint8_t *q, int j, uint8_t *sc,
                               uint8_t *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (uint8_t)((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
        *m = (uint8_t)((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
    }
}

static int clampi(int v, int lo, int hi) { return v < lo ? lo : v > hi ? hi : v; }

/* Q4_K (nmax 15) or Q5_K (nmax 31): per sub-block of 32 the range
 * [min(0, lo), hi] in nmax steps; 6-bit scales and mins against the
 * super-block's d and dmin; q to nearest. Writes q[256] and the header. */
static void quant_k_asym(const float *x, int nmax, uint16_t *d_out,
                         uint16_t *dmin_out, uint8_t *scales, uint8_t *q)
{
    float sc[8], mn[8], max_sc = 0.0f, max_mn = 0.0f;
    for (int k = 0; k < 8; k++) {
        float lo = x[32 * k], hi = x[32 * k];
        for (int j = 1; j < 32; j++) {
            lo = x[32 * k + j] < lo ? x[32 * k + j] : lo;
            hi = x[32 * k + j] > hi ? x[32 * k + j] : hi;
        }
        lo = lo < 0.0f ? lo : 0.0f;
        sc[k] = (hi - lo) / (float)nmax;
        mn[k] = -lo;
        max_sc = sc[k] > max_sc ? sc[k] : max_sc;
        max_mn = mn[k] > max_mn ? mn[k] : max_mn;
    }
    uint16_t dh = cinfer_fp32_to_fp16(max_sc / 63.0f);
    uint16_t mh = cinfer_fp32_to_fp16(max_mn / 63.0f);
    float d = cinfer_fp16_to_fp32(dh), dmin = cinfer_fp16_to_fp32(mh);
    uint8_t ls[8], lm[8];
    for (int k = 0; k < 8; k++) {
        ls[k] = (uint8_t)(d > 0.0f ? clampi((int)nearbyintf(sc[k] / d), 0, 63) : 0);
        lm[k] = (uint8_t)(dmin > 0.0f ? clampi((int)nearbyintf(mn[k] / dmin), 0, 63) : 0);
    }
    for (int j = 0; j < 4; j++) {
        scales[j] = (uint8_t)(ls[j] | ((ls[j + 4] >> 4) << 6));
        scales[j + 4] = (uint8_t)(lm[j] | ((lm[j + 4] >> 4) << 6));
        scales[j + 8] = (uint8_t)((ls[j + 4] & 0xF) | ((lm[j + 4] & 0xF) << 4));
    }
    for (int k = 0; k < 8; k++) {
        float step = d * (float)ls[k], off = dmin * (float)lm[k];
        for (int j = 0; j < 32; j++) {
            int v = step > 0.0f ? (int)nearbyintf((x[32 * k + j] + off) / step) : 0;
            q[32 * k + j] = (uint8_t)clampi(v, 0, nmax);
        }
    }
    *d_out = dh;
    *dmin_out = mh;
}

static void quant_q4_k(const float *x, cinfer_block_q4_k *y)
{
    uint8_t q[CINFER_QK_K];
    quant_k_asym(x, 15, &y->d, &y->dmin, y->scales, q);
    for (int c = 0; c < 4; c++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * c + l] = (uint8_t)(q[64 * c + l] | (q[64 * c + 32 + l] << 4));
}

static void quant_q5_k(const float *x, cinfer_block_q5_k *y)
{
    uint8_t q[CINFER_QK_K];
    quant_k_asym(x, 31, &y->d, &y->dmin, y->scales, q);
    memset(y->qh, 0, sizeof y->qh);
    for (int c = 0; c < 4; c++) {
        for (int l = 0; l < 32; l++) {
            int lo = q[64 * c + l], hi = q[64 * c + 32 + l];
            y->qs[32 * c + l] = (uint8_t)((lo & 15) | ((hi & 15) << 4));
            y->qh[l] |= (uint8_t)(((lo >> 4) << (2 * c)) | ((hi >> 4) << (2 * c + 1)));
        }
    }
}

/* Q6_K: per sub-block of 16 a scale amax / 31 as an int8 multiple of the
 * super-block's d; q - 32 to nearest in -32..31. */
static void quant_q6_k(const float *x, cinfer_block_q6_k *y)
{
    float sc[16], max_sc = 0.0f;
    for (int k = 0; k < 16; k++) {
        float amax = 0.0f;
        for (int j = 0; j < 16; j++)
            amax = fabsf(x[16 * k + j]) > amax ? fabsf(x[16 * k + j]) : amax;
        sc[k] = amax / 31.0f;
        max_sc = sc[k] > max_sc ? sc[k] : max_sc;
    }
    y->d = cinfer_fp32_to_fp16(max_sc / 127.0f);
    float d = cinfer_fp16_to_fp32(y->d);
    uint8_t q[CINFER_QK_K];
    for (int k = 0; k < 16; k++) {
        int ls = d > 0.0f ? clampi((int)nearbyintf(sc[k] / d), 0, 127) : 0;
        y->scales[k] = (int8_t)ls;
        float step = d * (float)ls;
        for (int j = 0; j < 16; j++) {
            int v = step > 0.0f ? (int)nearbyintf(x[16 * k + j] / step) : 0;
            q[16 * k + j] = (uint8_t)(clampi(v, -32, 31) + 32);
        }
    }
    memset(y->qh, 0, sizeof y->qh);
    for (int h = 0; h < 2; h++) {
        for (int i = 0; i < 128; i++) {
            int v = q[128 * h + i];
            uint8_t *lo = &y->ql[64 * h + i % 64];
            if (i < 64)
                *lo = (uint8_t)(v & 15);
            else
                *lo = (uint8_t)(*lo | ((v & 15) << 4));
            y->qh[32 * h + i % 32] |= (uint8_t)((v >> 4) << (2 * (i / 32)));
        }
    }
}

/* Q2_K: per sub-block of 16 the range [min(0, lo), hi] in 3 steps, 4-bit
 * scales and mins against the super-block's d and dmin; q to nearest. */
static void quant_q2_k(const float *x, cinfer_block_q2_k *y)
{
    float sc[16], mn[16], max_sc = 0.0f, max_mn = 0.0f;
    for (int k = 0; k < 16; k++) {
        float lo = x[16 * k], hi = x[16 * k];
        for (int j = 1; j < 16; j++) {
            lo = x[16 * k + j] < lo ? x[16 * k + j] : lo;
            hi = x[16 * k + j] > hi ? x[16 * k + j] : hi;
        }
        lo = lo < 0.0f ? lo : 0.0f;
        sc[k] = (hi - lo) / 3.0f;
        mn[k] = -lo;
        max_sc = sc[k] > max_sc ? sc[k] : max_sc;
        max_mn = mn[k] > max_mn ? mn[k] : max_mn;
    }
    y->d = cinfer_fp32_to_fp16(max_sc / 15.0f);
    y->dmin = cinfer_fp32_to_fp16(max_mn / 15.0f);
    float d = cinfer_fp16_to_fp32(y->d), dmin = cinfer_fp16_to_fp32(y->dmin);
    uint8_t q[CINFER_QK_K];
    for (int k = 0; k < 16; k++) {
        int ls = d > 0.0f ? clampi((int)nearbyintf(sc[k] / d), 0, 15) : 0;
        int lm = dmin > 0.0f ? clampi((int)nearbyintf(mn[k] / dmin), 0, 15) : 0;
        y->scales[k] = (uint8_t)(ls | (lm << 4));
        float step = d * (float)ls, off = dmin * (float)lm;
        for (int j = 0; j < 16; j++) {
            int v = step > 0.0f ? (int)nearbyintf((x[16 * k + j] + off) / step) : 0;
            q[16 * k + j] = (uint8_t)clampi(v, 0, 3);
        }
    }
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * h + l] =
                (uint8_t)(q[128 * h + l] | (q[128 * h + 32 + l] << 2) |
                          (q[128 * h + 64 + l] << 4) | (q[128 * h + 96 + l] << 6));
}

/* The signed scale of a group whose extreme value max maps to level
 * -nmax: max / -nmax (0 for an all-zero group). */
static float signed_scale(const float *x, int n, float nmax)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < n; j++) {
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    }
    return max / -nmax;
}

/* Signed per-group scales sc[0..n) as 6-bit multiples ls - 32 (ls in
 * 0..63) of one fp16 d, the largest in magnitude at -32. */
static uint16_t quant_scales6(const float *sc, int n, uint8_t *ls)
{
    float amax = 0.0f, max = 0.0f;
    for (int k = 0; k < n; k++) {
        if (fabsf(sc[k]) > amax) {
            amax = fabsf(sc[k]);
            max = sc[k];
        }
    }
    uint16_t dh = cinfer_fp32_to_fp16(max / -32.0f);
    float d = cinfer_fp16_to_fp32(dh);
    for (int k = 0; k < n; k++)
        ls[k] = (uint8_t)(d != 0.0f ? clampi((int)nearbyintf(sc[k] / d), -32, 31) + 32
                                    : 32);
    return dh;
}

/* Q3_K: per sub-block of 16 a signed scale with the extreme at -4, as a
 * 6-bit multiple of the super-block's d; q - 4 to nearest in -4..3. */
static void quant_q3_k(const float *x, cinfer_block_q3_k *y)
{
    float sc[16];
    uint8_t ls[16];
    for (int k = 0; k < 16; k++)
        sc[k] = signed_scale(x + 16 * k, 16, 4.0f);
    y->d = quant_scales6(sc, 16, ls);
    float d = cinfer_fp16_to_fp32(y->d);
    uint8_t q[CINFER_QK_K];
    for (int k = 0; k < 16; k++) {
        float step = d * (float)(ls[k] - 32);
        for (int j = 0; j < 16; j++) {
            int v = step != 0.0f ? (int)nearbyintf(x[16 * k + j] / step) : 0;
            q[16 * k + j] = (uint8_t)(clampi(v, -4, 3) + 4);
        }
    }
    memset(y->scales, 0, sizeof y->scales);
    for (int j = 0; j < 16; j++) {
        y->scales[j % 8] |= (uint8_t)((ls[j] & 15) << (4 * (j / 8)));
        y->scales[8 + j % 4] |= (uint8_t)((ls[j] >> 4) << (2 * (j / 4)));
    }
    memset(y->hmask, 0, sizeof y->hmask);
    for (int e = 0; e < CINFER_QK_K; e++)
        y->hmask[e % 32] |= (uint8_t)((q[e] >> 2) << (e / 32));
    for (int h = 0; h < 2; h++)
        for (int l = 0; l < 32; l++)
            y->qs[32 * h + l] = (uint8_t)((q[128 * h + l] & 3) |
                                          ((q[128 * h + 32 + l] & 3) << 2) |
                                          ((q[128 * h + 64 + l] & 3) << 4) |
                                          ((q[128 * h + 96 + l] & 3) << 6));
}

const int8_t cinfer_iq4nl_values[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                                        1,    13,   25,  38,  53,  69,  89,  113};

/* The level of cinfer_iq4nl_values nearest v (the lower one on a tie). */
static int iq4_nearest(float v)
{
    int best = 0;
    float err = fabsf(v - (float)cinfer_iq4nl_values[0]);
    for (int i = 1; i < 16; i++) {
        float e = fabsf(v - (float)cinfer_iq4nl_values[i]);
        if (e < err) {
            err = e;
            best = i;
        }
    }
    return best;
}

/* 32 values as IQ4 nibbles of step `step` (Q4_0's nibble order). */
static void quant_iq4_32(const float *x, float step, uint8_t *qs)
{
    for (int j = 0; j < 16; j++) {
        int lo = step != 0.0f ? iq4_nearest(x[j] / step) : 8;
        int hi = step != 0.0f ? iq4_nearest(x[j + 16] / step) : 8;
        qs[j] = (uint8_t)(lo | (hi << 4));
    }
}

/* IQ4_NL: d with the block's extreme value at level -127. */
static void quant_iq4_nl(const float *x, cinfer_block_iq4_nl *y)
{
    y->d = cinfer_fp32_to_fp16(signed_scale(x, 32, 127.0f));
    quant_iq4_32(x, cinfer_fp16_to_fp32(y->d), y->qs);
}

/* IQ4_XS: per sub-block of 32 a signed scale with the extreme at -127, as
 * a 6-bit multiple of the super-block's d. */
static void quant_iq4_xs(const float *x, cinfer_block_iq4_xs *y)
{
    float sc[8];
    uint8_t ls[8];
    for (int k = 0; k < 8; k++)
        sc[k] = signed_scale(x + 32 * k, 32, 127.0f);
    y->d = quant_scales6(sc, 8, ls);
    float d = cinfer_fp16_to_fp32(y->d);
    y->scales_h = 0;
    memset(y->scales_l, 0, sizeof y->scales_l);
    for (int k = 0; k < 8; k++) {
        y->scales_l[k / 2] |= (uint8_t)((ls[k] & 15) << (4 * (k % 2)));
        y->scales_h |= (uint16_t)((ls[k] >> 4) << (2 * k));
        quant_iq4_32(x + 32 * k, d * (float)(ls[k] - 32), y->qs + 16 * k);
    }
}

void cinfer_dtype_q3k_scales(const uint8_t *scales, uint8_t out[16])
{
    for (int j = 0; j < 16; j++)
        out[j] = (uint8_t)(((scales[j % 8] >> (4 * (j / 8))) & 15) |
                           (((scales[8 + j % 4] >> (2 * (j / 4))) & 3) << 4));
}

/* The dequantizers below compute GGML's dequantize_row_* expressions in
 * GGML's order (scale products first), so their bits are GGML's. */
static void dequant_k2(const cinfer_block_q2_k *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d), min = cinfer_fp16_to_fp32(b->dmin);
    for (int e = 0; e < CINFER_QK_K; e++) {
        int sc = b->scales[e / 16];
        float dl = d * (float)(sc & 15), ml = min * (float)(sc >> 4);
        int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        y[e] = dl * (float)q - ml;
    }
}

static void dequant_k3(const cinfer_block_q3_k *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d);
    uint8_t s[16];
    cinfer_dtype_q3k_scales(b->scales, s);
    for (int e = 0; e < CINFER_QK_K; e++) {
        float dl = d * (float)(s[e / 16] - 32);
        int q = (b->qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        int h = (b->hmask[e % 32] >> (e / 32)) & 1;
        y[e] = dl * (float)(q - (h ? 0 : 4));
    }
}

static void dequant_iq4_nl(const cinfer_block_iq4_nl *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)cinfer_iq4nl_values[b->qs[j] & 15];
        y[j + 16] = d * (float)cinfer_iq4nl_values[b->qs[j] >> 4];
    }
}

static void dequant_iq4_xs(const cinfer_block_iq4_xs *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d);
    for (int k = 0; k < 8; k++) {
        int ls = ((b->scales_l[k / 2] >> (4 * (k % 2))) & 15) |
                 (((b->scales_h >> (2 * k)) & 3) << 4);
        float dl = d * (float)(ls - 32);
        const uint8_t *qs = b->qs + 16 * k;
        for (int j = 0; j < 16; j++) {
            y[32 * k + j] = dl * (float)cinfer_iq4nl_values[qs[j] & 15];
            y[32 * k + j + 16] = dl * (float)cinfer_iq4nl_values[qs[j] >> 4];
        }
    }
}

static void dequant_k4(const cinfer_block_q4_k *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d), min = cinfer_fp16_to_fp32(b->dmin);
    for (int c = 0; c < 4; c++) {
        uint8_t sc, m;
        cinfer_dtype_k4_scale_min(b->scales, 2 * c, &sc, &m);
        float d1 = d * (float)sc, m1 = min * (float)m;
        cinfer_dtype_k4_scale_min(b->scales, 2 * c + 1, &sc, &m);
        float d2 = d * (float)sc, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) {
            y[64 * c + l] = d1 * (float)(b->qs[32 * c + l] & 0xF) - m1;
            y[64 * c + 32 + l] = d2 * (float)(b->qs[32 * c + l] >> 4) - m2;
        }
    }
}

static void dequant_k5(const cinfer_block_q5_k *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d), min = cinfer_fp16_to_fp32(b->dmin);
    for (int c = 0; c < 4; c++) {
        uint8_t sc, m;
        cinfer_dtype_k4_scale_min(b->scales, 2 * c, &sc, &m);
        float d1 = d * (float)sc, m1 = min * (float)m;
        cinfer_dtype_k4_scale_min(b->scales, 2 * c + 1, &sc, &m);
        float d2 = d * (float)sc, m2 = min * (float)m;
        for (int l = 0; l < 32; l++) {
            int lo = (b->qs[32 * c + l] & 0xF) | (((b->qh[l] >> (2 * c)) & 1) << 4);
            int hi = (b->qs[32 * c + l] >> 4) | (((b->qh[l] >> (2 * c + 1)) & 1) << 4);
            y[64 * c + l] = d1 * (float)lo - m1;
            y[64 * c + 32 + l] = d2 * (float)hi - m2;
        }
    }
}

static void dequant_k6(const cinfer_block_q6_k *b, float *y)
{
    float d = cinfer_fp16_to_fp32(b->d);
    for (int h = 0; h < 2; h++) {
        for (int i = 0; i < 128; i++) {
            int lo = (b->ql[64 * h + i % 64] >> (4 * (i / 64))) & 15;
            int hi = (b->qh[32 * h + i % 32] >> (2 * (i / 32))) & 3;
            int e = 128 * h + i;
            y[e] = d * (float)b->scales[e / 16] * (float)((lo | (hi << 4)) - 32);
        }
    }
}

void cinfer_dtype_q5_0_to_q8_0(const void *src, void *dst, int64_t n_blocks)
{
    const cinfer_block_q5_0 *b = src;
    cinfer_block_q8_0 *o = dst;
    for (int64_t i = 0; i < n_blocks; i++) {
        uint32_t qh = (uint32_t)b[i].qh[0] | (uint32_t)b[i].qh[1] << 8 |
                      (uint32_t)b[i].qh[2] << 16 | (uint32_t)b[i].qh[3] << 24;
        o[i].d = b[i].d;
        for (int j = 0; j < CINFER_QK / 2; j++) {
            int lo = (b[i].qs[j] & 15) | (int)((qh >> j) << 4 & 16);
            int hi = (b[i].qs[j] >> 4) | (int)((qh >> (j + 12)) & 16);
            o[i].qs[j] = (int8_t)(lo - 16);
            o[i].qs[j + 16] = (int8_t)(hi - 16);
        }
    }
}

/* GGML's quantize_row_q5_0_ref: d = the signed extreme / -16. */
static void quant_q5_0(const float *x, cinfer_block_q5_0 *y)
{
    float amax = 0.0f, max = 0.0f;
    for (int j = 0; j < CINFER_QK; j++)
        if (fabsf(x[j]) > amax) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    const float d = max / -16.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    y->d = cinfer_fp32_to_fp16(d);
    uint32_t qh = 0;
    for (int j = 0; j < CINFER_QK / 2; j++) {
        int a = (int)(int8_t)(x[j] * id + 16.5f);
        int b = (int)(int8_t)(x[j + 16] * id + 16.5f);
        a = a > 31 ? 31 : a;
        b = b > 31 ? 31 : b;
        y->qs[j] = (uint8_t)((a & 15) | (b & 15) << 4);
        qh |= (uint32_t)((a & 16) >> 4) << j;
        qh |= (uint32_t)((b & 16) >> 4) << (j + 16);
    }
    for (int k = 0; k < 4; k++)
        y->qh[k] = (uint8_t)(qh >> (8 * k));
}

void cinfer_quantize_row(cinfer_dtype t, const float *src, void *dst,
                         int64_t n)
{
    int64_t nb = n / CINFER_QK;
    int64_t nbk = n / CINFER_QK_K;
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
    case CINFER_DTYPE_Q4_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q4_k(src + i * CINFER_QK_K, (cinfer_block_q4_k *)dst + i);
        return;
    case CINFER_DTYPE_Q5_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q5_k(src + i * CINFER_QK_K, (cinfer_block_q5_k *)dst + i);
        return;
    case CINFER_DTYPE_Q6_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q6_k(src + i * CINFER_QK_K, (cinfer_block_q6_k *)dst + i);
        return;
    case CINFER_DTYPE_Q8_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q8_k(src + i * CINFER_QK_K, (cinfer_block_q8_k *)dst + i);
        return;
    case CINFER_DTYPE_Q2_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q2_k(src + i * CINFER_QK_K, (cinfer_block_q2_k *)dst + i);
        return;
    case CINFER_DTYPE_Q3_K:
        for (int64_t i = 0; i < nbk; i++)
            quant_q3_k(src + i * CINFER_QK_K, (cinfer_block_q3_k *)dst + i);
        return;
    case CINFER_DTYPE_IQ4_NL:
        for (int64_t i = 0; i < nb; i++)
            quant_iq4_nl(src + i * CINFER_QK, (cinfer_block_iq4_nl *)dst + i);
        return;
    case CINFER_DTYPE_IQ4_XS:
        for (int64_t i = 0; i < nbk; i++)
            quant_iq4_xs(src + i * CINFER_QK_K, (cinfer_block_iq4_xs *)dst + i);
        return;
    case CINFER_DTYPE_Q5_0:
        for (int64_t i = 0; i < nb; i++)
            quant_q5_0(src + i * CINFER_QK, (cinfer_block_q5_0 *)dst + i);
        return;
    case CINFER_DTYPE_I32:
        return;
    }
}

void cinfer_dequantize_row(cinfer_dtype t, const void *src, float *dst,
                           int64_t n)
{
    int64_t nb = n / CINFER_QK;
    int64_t nbk = n / CINFER_QK_K;
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
    case CINFER_DTYPE_Q5_0: {
        const cinfer_block_q5_0 *b = src;
        for (int64_t i = 0; i < nb; i++) {
            cinfer_block_q8_0 q;
            cinfer_dtype_q5_0_to_q8_0(&b[i], &q, 1);
            float d = cinfer_fp16_to_fp32(q.d);
            for (int j = 0; j < CINFER_QK; j++)
                dst[i * CINFER_QK + j] = d * (float)q.qs[j];
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
    case CINFER_DTYPE_Q4_K:
        for (int64_t i = 0; i < nbk; i++)
            dequant_k4((const cinfer_block_q4_k *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_Q5_K:
        for (int64_t i = 0; i < nbk; i++)
            dequant_k5((const cinfer_block_q5_k *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_Q6_K:
        for (int64_t i = 0; i < nbk; i++)
            dequant_k6((const cinfer_block_q6_k *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_Q8_K: {
        const cinfer_block_q8_k *b = src;
        for (int64_t i = 0; i < nbk; i++)
            for (int j = 0; j < CINFER_QK_K; j++)
                dst[i * CINFER_QK_K + j] = b[i].d * (float)b[i].qs[j];
        return;
    }
    case CINFER_DTYPE_Q2_K:
        for (int64_t i = 0; i < nbk; i++)
            dequant_k2((const cinfer_block_q2_k *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_Q3_K:
        for (int64_t i = 0; i < nbk; i++)
            dequant_k3((const cinfer_block_q3_k *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_IQ4_NL:
        for (int64_t i = 0; i < nb; i++)
            dequant_iq4_nl((const cinfer_block_iq4_nl *)src + i, dst + i * CINFER_QK);
        return;
    case CINFER_DTYPE_IQ4_XS:
        for (int64_t i = 0; i < nbk; i++)
            dequant_iq4_xs((const cinfer_block_iq4_xs *)src + i, dst + i * CINFER_QK_K);
        return;
    case CINFER_DTYPE_I32:
        return;
    }
}
