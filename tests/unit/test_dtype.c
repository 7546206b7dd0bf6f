/*
 * test_dtype.c - the K-quant and IQ4 block formats and their scalar
 * conversions (kernels/dtype.h).
 *
 *   - sizes, block sizes and names match GGML's (GGUF type ids);
 *   - Q8_K quantization: hand-worked blocks (negative maximum, ties to
 *     even, the all-zero block, bsums);
 *   - Q2_K .. Q6_K, IQ4_NL, IQ4_XS: the round-to-nearest quantizer writes
 *     blocks that decode close to the input, and decoding equals the
 *     format's formula evaluated here from the raw bytes;
 *   - the packed 6-bit scales and mins of Q4_K, and the packed 6-bit
 *     scales of Q3_K (against GGML's word-wise unpacking), read back for
 *     every value.
 */
#include <math.h>
#include <string.h>

#include "harness.h"
#include "kernels/dtype.h"

static void test_sizes_and_names(void)
{
    CHECK_EQ_INT((int)sizeof(cinfer_block_q4_k), 144);
    CHECK_EQ_INT((int)sizeof(cinfer_block_q5_k), 176);
    CHECK_EQ_INT((int)sizeof(cinfer_block_q6_k), 210);
    CHECK_EQ_INT((int)sizeof(cinfer_block_q8_k), 292);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_Q4_K), 256);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_Q6_K), 256);
    CHECK_EQ_INT((int)cinfer_dtype_row_bytes(CINFER_DTYPE_Q6_K, 768), 630);
    CHECK_EQ_INT((int)cinfer_dtype_row_bytes(CINFER_DTYPE_Q4_K, 300), 0);
    CHECK(cinfer_dtype_valid(CINFER_DTYPE_Q4_K));
    CHECK(cinfer_dtype_valid(CINFER_DTYPE_Q6_K));
    CHECK(cinfer_dtype_valid(CINFER_DTYPE_Q8_K));
    CHECK(cinfer_dtype_valid(CINFER_DTYPE_Q5_K));
    CHECK_EQ_STR(cinfer_dtype_name(CINFER_DTYPE_Q5_K), "Q5_K");
    CHECK((int)sizeof(cinfer_block_q2_k) == 84);
    CHECK((int)sizeof(cinfer_block_q3_k) == 110);
    CHECK((int)sizeof(cinfer_block_iq4_nl) == 18);
    CHECK((int)sizeof(cinfer_block_iq4_xs) == 136);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_Q2_K), 256);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_Q3_K), 256);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_IQ4_XS), 256);
    CHECK_EQ_INT(cinfer_dtype_block_elems(CINFER_DTYPE_IQ4_NL), 32);
    CHECK_EQ_INT((int)cinfer_dtype_row_bytes(CINFER_DTYPE_IQ4_NL, 96), 54);
    CHECK_EQ_INT((int)cinfer_dtype_row_bytes(CINFER_DTYPE_IQ4_XS, 96), 0);
    CHECK_EQ_INT((int)cinfer_dtype_row_bytes(CINFER_DTYPE_Q3_K, 512), 220);
    const uint32_t ids[] = {10, 11, 20, 23};
    const char *names[] = {"Q2_K", "Q3_K", "IQ4_NL", "IQ4_XS"};
    for (int i = 0; i < 4; i++) {
        CHECK(cinfer_dtype_valid(ids[i]));
        CHECK_EQ_STR(cinfer_dtype_name((cinfer_dtype)ids[i]), names[i]);
        CHECK_EQ_STR(cinfer_dtype_ggml_name(ids[i]), names[i]);
    }
    CHECK(!cinfer_dtype_valid(16)); /* IQ2_XXS */
    CHECK(!cinfer_dtype_valid(4));
    CHECK_EQ_STR(cinfer_dtype_name(CINFER_DTYPE_Q4_K), "Q4_K");
    CHECK_EQ_STR(cinfer_dtype_name(CINFER_DTYPE_Q6_K), "Q6_K");
    CHECK_EQ_STR(cinfer_dtype_ggml_name(10), "Q2_K");
    CHECK_EQ_STR(cinfer_dtype_ggml_name(23), "IQ4_XS");
    CHECK_EQ_STR(cinfer_dtype_ggml_name(30), "BF16");
    CHECK_EQ_STR(cinfer_dtype_ggml_name(39), "MXFP4");
    CHECK_EQ_STR(cinfer_dtype_ggml_name(1000), "?");
}

static void test_q8_k(void)
{
    float x[512];
    for (int i = 0; i < 256; i++)
        x[i] = (float)(i % 7) * 0.25f;
    x[9] = -127.0f; /* the maximum magnitude, negative: iscale = 1 */
    x[10] = 0.5f;   /* ties to even */
    x[11] = 1.5f;
    x[12] = 2.5f;
    x[13] = -3.5f;
    memset(x + 256, 0, sizeof(float) * 256);
    cinfer_block_q8_k b[2];
    cinfer_quantize_row(CINFER_DTYPE_Q8_K, x, b, 512);
    CHECK(b[0].d == 1.0f);
    CHECK_EQ_INT(b[0].qs[9], -127);
    CHECK_EQ_INT(b[0].qs[10], 0);
    CHECK_EQ_INT(b[0].qs[11], 2);
    CHECK_EQ_INT(b[0].qs[12], 2);
    CHECK_EQ_INT(b[0].qs[13], -4);
    CHECK_EQ_INT(b[0].qs[3], 1);  /* 0.75 */
    CHECK_EQ_INT(b[0].qs[5], 1);  /* 1.25 */
    CHECK_EQ_INT(b[0].qs[20], 2); /* 1.5 */
    /* a positive maximum: iscale = -127 / max, so the values flip sign
     * and d is negative */
    float p[256];
    for (int i = 0; i < 256; i++)
        p[i] = (float)i / 255.0f;
    cinfer_block_q8_k bp;
    cinfer_quantize_row(CINFER_DTYPE_Q8_K, p, &bp, 256);
    CHECK(bp.d < 0.0f);
    CHECK_EQ_INT(bp.qs[255], -127);
    CHECK_EQ_INT(bp.qs[0], 0);
    for (int k = 0; k < 16; k++) {
        int s = 0;
        for (int j = 0; j < 16; j++)
            s += b[0].qs[16 * k + j];
        CHECK_EQ_INT(b[0].bsums[k], s);
    }
    CHECK(b[1].d == 0.0f);
    int zero = 1;
    for (int j = 0; j < 256; j++)
        zero &= b[1].qs[j] == 0;
    CHECK(zero);
}

static const int k_iq4[16] = {-127, -104, -83, -65, -49, -35, -22, -10,
                              1,    13,   25,  38,  53,  69,  89,  113};

/* The 16 Q3_K scales unpacked as GGML's dequantize_row_q3_K does (word
 * masks over the 12 bytes), minus 32. */
static void q3k_scales_ggml(const uint8_t *scales, int out[16])
{
    uint32_t aux[4];
    memcpy(aux, scales, 12);
    uint32_t tmp = aux[2];
    aux[2] = ((aux[0] >> 4) & 0x0f0f0f0f) | (((tmp >> 4) & 0x03030303) << 4);
    aux[3] = ((aux[1] >> 4) & 0x0f0f0f0f) | (((tmp >> 6) & 0x03030303) << 4);
    aux[0] = (aux[0] & 0x0f0f0f0f) | (((tmp >> 0) & 0x03030303) << 4);
    aux[1] = (aux[1] & 0x0f0f0f0f) | (((tmp >> 2) & 0x03030303) << 4);
    const int8_t *s8 = (const int8_t *)aux;
    for (int j = 0; j < 16; j++)
        out[j] = s8[j] - 32;
}

/* Element e of a block decoded by the format's definition (dtype.h). */
static double k_value(cinfer_dtype t, const void *blk, int e)
{
    if (t == CINFER_DTYPE_IQ4_NL) {
        const cinfer_block_iq4_nl *b = (const cinfer_block_iq4_nl *)blk + e / 32;
        int i = e % 32, byte = b->qs[i % 16];
        return (double)cinfer_fp16_to_fp32(b->d) * k_iq4[i < 16 ? byte & 15 : byte >> 4];
    }
    if (t == CINFER_DTYPE_IQ4_XS) {
        const cinfer_block_iq4_xs *b = blk;
        int j = e / 32, i = e % 32, byte = b->qs[16 * j + i % 16];
        int ls = ((b->scales_l[j / 2] >> (4 * (j % 2))) & 15) |
                 (((b->scales_h >> (2 * j)) & 3) << 4);
        return (double)cinfer_fp16_to_fp32(b->d) * (ls - 32) *
               k_iq4[i < 16 ? byte & 15 : byte >> 4];
    }
    if (t == CINFER_DTYPE_Q2_K || t == CINFER_DTYPE_Q3_K) {
        /* e = 128h + 32s + i: 2 bits at shift 2s of qs[32h + i] */
        const uint8_t *qs = t == CINFER_DTYPE_Q2_K ? ((const cinfer_block_q2_k *)blk)->qs
                                                    : ((const cinfer_block_q3_k *)blk)->qs;
        int q = (qs[32 * (e / 128) + e % 32] >> (2 * ((e % 128) / 32))) & 3;
        if (t == CINFER_DTYPE_Q2_K) {
            const cinfer_block_q2_k *b = blk;
            int sc = b->scales[e / 16];
            return (double)cinfer_fp16_to_fp32(b->d) * (sc & 15) * q -
                   (double)cinfer_fp16_to_fp32(b->dmin) * (sc >> 4);
        }
        const cinfer_block_q3_k *b = blk;
        int s[16];
        q3k_scales_ggml(b->scales, s);
        int hi = (b->hmask[e % 32] >> (e / 32)) & 1;
        return (double)cinfer_fp16_to_fp32(b->d) * s[e / 16] * (q + 4 * hi - 4);
    }
    if (t == CINFER_DTYPE_Q6_K) {
        const cinfer_block_q6_k *b = blk;
        int h = e / 128, i = e % 128;
        int q = ((b->ql[64 * h + i % 64] >> (4 * (i / 64))) & 15) |
                (((b->qh[32 * h + i % 32] >> (2 * (i / 32))) & 3) << 4);
        return (double)cinfer_fp16_to_fp32(b->d) * b->scales[e / 16] * (q - 32);
    }
    const uint8_t *scales, *qs;
    uint16_t d, dmin;
    int q5 = 0;
    if (t == CINFER_DTYPE_Q4_K) {
        const cinfer_block_q4_k *b = blk;
        scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
    } else {
        const cinfer_block_q5_k *b = blk;
        scales = b->scales, qs = b->qs, d = b->d, dmin = b->dmin;
        q5 = ((b->qh[e % 32] >> (e / 32)) & 1) << 4;
    }
    int byte = qs[32 * (e / 64) + e % 32];
    int q = (e % 64 < 32 ? byte & 15 : byte >> 4) | q5;
    /* scales: j < 4 in the low 6 bits of bytes j / j + 4; j >= 4 split
     * between the nibbles of byte j + 4 and the top bits of j - 4 / j */
    int j = e / 32, sc, m;
    if (j < 4) {
        sc = scales[j] & 63;
        m = scales[j + 4] & 63;
    } else {
        sc = (scales[j + 4] & 15) | ((scales[j - 4] >> 6) << 4);
        m = (scales[j + 4] >> 4) | ((scales[j] >> 6) << 4);
    }
    return (double)cinfer_fp16_to_fp32(d) * sc * q -
           (double)cinfer_fp16_to_fp32(dmin) * m;
}

static void check_k_type(cinfer_dtype t, double rel_err)
{
    enum { N = 768 };
    float x[N], y[N];
    uint8_t blk[3 * 210];
    uint64_t seed = 7 + (uint64_t)t;
    for (int i = 0; i < N; i++)
        x[i] = harness_randf(&seed) * (i < 256 ? 1.0f : i < 512 ? 30.0f : 0.01f);
    for (int i = 300; i < 340; i++)
        x[i] = fabsf(x[i]) + 5.0f; /* a sub-block with no negative values */
    cinfer_quantize_row(t, x, blk, N);
    cinfer_dequantize_row(t, blk, y, N);
    /* bytes of 256 elements (8 blocks of IQ4_NL) */
    const size_t bb = cinfer_dtype_row_bytes(t, 256);
    int formula_bad = 0;
    for (int b = 0; b < 3; b++) {
        double err = 0, mag = 0;
        for (int e = 0; e < 256; e++) {
            int i = 256 * b + e;
            double want = k_value(t, blk + bb * (size_t)b, e);
            formula_bad += fabs(want - y[i]) > 1e-6 * fabs(want) + 1e-30;
            err += (y[i] - x[i]) * (double)(y[i] - x[i]);
            mag += (double)x[i] * x[i];
        }
        double rel = sqrt(err / mag);
        if (!(rel < rel_err))
            fprintf(stderr, "%s block %d: rel rms error %.3g\n",
                    cinfer_dtype_name(t), b, rel);
        CHECK(rel < rel_err);
    }
    CHECK_EQ_INT(formula_bad, 0);
    /* zeros give zeros */
    float z[256] = {0}, zy[256];
    cinfer_quantize_row(t, z, blk, 256);
    cinfer_dequantize_row(t, blk, zy, 256);
    int zero = 1;
    for (int i = 0; i < 256; i++)
        zero &= zy[i] == 0.0f;
    CHECK(zero);
}

static void test_q4_k(void) { check_k_type(CINFER_DTYPE_Q4_K, 0.12); }
static void test_q5_k(void) { check_k_type(CINFER_DTYPE_Q5_K, 0.06); }
static void test_q6_k(void) { check_k_type(CINFER_DTYPE_Q6_K, 0.04); }
static void test_q2_k(void) { check_k_type(CINFER_DTYPE_Q2_K, 0.35); }
static void test_q3_k(void) { check_k_type(CINFER_DTYPE_Q3_K, 0.18); }
static void test_iq4_nl(void) { check_k_type(CINFER_DTYPE_IQ4_NL, 0.10); }
static void test_iq4_xs(void) { check_k_type(CINFER_DTYPE_IQ4_XS, 0.10); }

/* Every 6-bit Q3_K scale in every position survives the 12-byte packing,
 * read back as GGML reads it and as cinfer_dtype_q3k_scales does (the
 * quantizer's packing is checked through k_value above). */
static void test_q3k_scale_packing(void)
{
    int bad = 0;
    for (int v = 0; v < 64; v++) {
        uint8_t sc[12] = {0}, want[16], lib[16];
        int gg[16];
        for (int j = 0; j < 16; j++) {
            want[j] = (uint8_t)((v + 5 * j) % 64);
            sc[j % 8] |= (uint8_t)((want[j] & 15) << (4 * (j / 8)));
            sc[8 + j % 4] |= (uint8_t)((want[j] >> 4) << (2 * (j / 4)));
        }
        cinfer_dtype_q3k_scales(sc, lib);
        q3k_scales_ggml(sc, gg);
        for (int j = 0; j < 16; j++)
            bad += lib[j] != want[j] || gg[j] != want[j] - 32;
    }
    CHECK_EQ_INT(bad, 0);
}

/* Every 6-bit scale and min value survives the 12-byte packing. */
static void test_k4_scale_packing(void)
{
    int bad = 0;
    for (int v = 0; v < 64; v++) {
        cinfer_block_q4_k b;
        memset(&b, 0, sizeof b);
        for (int j = 0; j < 4; j++) {
            int s = (v + 9 * j) % 64, m = (63 - v + 5 * j) % 64;
            int s2 = (v * 3 + j) % 64, m2 = (v * 7 + j) % 64;
            b.scales[j] = (uint8_t)(s | ((s2 >> 4) << 6));
            b.scales[j + 4] = (uint8_t)(m | ((m2 >> 4) << 6));
            b.scales[j + 8] = (uint8_t)((s2 & 15) | ((m2 & 15) << 4));
            uint8_t sc, mn;
            cinfer_dtype_k4_scale_min(b.scales, j, &sc, &mn);
            bad += sc != s || mn != m;
            cinfer_dtype_k4_scale_min(b.scales, j + 4, &sc, &mn);
            bad += sc != s2 || mn != m2;
        }
    }
    CHECK_EQ_INT(bad, 0);
}

int main(void)
{
    RUN(test_sizes_and_names);
    RUN(test_q8_k);
    RUN(test_q4_k);
    RUN(test_q5_k);
    RUN(test_q6_k);
    RUN(test_q2_k);
    RUN(test_q3_k);
    RUN(test_iq4_nl);
    RUN(test_iq4_xs);
    RUN(test_q3k_scale_packing);
    RUN(test_k4_scale_packing);
    return harness_done();
}
