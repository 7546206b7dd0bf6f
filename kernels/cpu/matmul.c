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
 * Q4_0 x Q8_0, IQ4_NL x Q8_0, Q2_K .. Q6_K / IQ4_XS x Q8_K, F16 x F16,
 * BF16 x BF16, F32 x F32. Q8_K activations are quantized by the scalar
 * code on every ISA (GGML's x86 build does the same); the K-quant and IQ4
 * products live in matmul_kquant*.c, which dispatches them by ISA.
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
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_NL:
    case CINFER_DTYPE_IQ4_XS:
        return 1;
    default:
        return 0;
    }
}

int cinfer_cpu_matmul_is_kquant(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_IQ4_NL:
    case CINFER_DTYPE_IQ4_XS:
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
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_XS:
        return CINFER_DTYPE_Q8_K;
    case CINFER_DTYPE_Q8_0:
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_IQ4_NL:
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
    if (act_type == CINFER_DTYPE_Q8_K) {
        cinfer_cpu_matmul_prepare_portable(act_type, x, n_in, r0, r1, act);
        return;
    }
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
    cinfer_cpu_isa use = resolve_isa(isa);
    if (cinfer_cpu_matmul_is_kquant(wt)) {
        cinfer_cpu_matmul_compute_kquant(use, wt, w, w_row_bytes, act, n, n_in,
                                         out, out_stride, o0, o1);
        return;
    }
#if defined(CINFER_MATMUL_HAVE_AVX512) && defined(CINFER_MATMUL_HAVE_AVX2)
    /* F16 and F32 weights stream faster through the AVX2 kernels at one or
     * two rows (decode) on Zen 4 (bench/results/kernels-*.txt); both ISAs
     * compute the same bits, so switching by row count keeps batch
     * invariance. (Not BF16: vdpbf16ps flushes subnormals, AVX2 does not.) */
    if (use == CINFER_CPU_ISA_AVX512 && n <= 2 &&
        (wt == CINFER_DTYPE_F16 || wt == CINFER_DTYPE_F32))
        use = CINFER_CPU_ISA_AVX2;
#endif
    switch (use) {
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

/* fp16 -> fp32 (exact), inline: the portable loops call it per block. */
static inline float f16(uint16_t h)
{
    uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    uint32_t exp = (h >> 10) & 0x1f, man = h & 0x3ff, u;
    if (exp == 0) {
        float f = (float)man * 5.9604644775390625e-8f; /* man * 2^-24 */
        return sign ? -f : f;
    }
    if (exp == 31)
        u = sign | 0x7f800000u | (man << 13);
    else
        u = sign | ((exp + 112) << 23) | (man << 13);
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static inline float bf16(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* Rows computed together, sharing each decoded weight block. */
#define PT_ROWS 4

/* Int8 block types: column o against rows [r0, r0 + rt). */
static void col_q(cinfer_dtype wt, const uint8_t *wrow, const uint8_t *act,
                  size_t arb, int64_t r0, int rt, int64_t nb, float *out,
                  int64_t out_stride, int64_t o)
{
    float acc[PT_ROWS][8] = {{0}};
    float summs[PT_ROWS] = {0};
    for (int64_t b = 0; b < nb; b++) {
        int qw[CINFER_QK];
        float dw, mw = 0.0f;
        if (wt == CINFER_DTYPE_Q4_1 || wt == CINFER_DTYPE_Q4_0) {
            const cinfer_block_q4_1 *b1 = (const cinfer_block_q4_1 *)wrow + b;
            const cinfer_block_q4_0 *b0 = (const cinfer_block_q4_0 *)wrow + b;
            const uint8_t *qs = wt == CINFER_DTYPE_Q4_1 ? b1->qs : b0->qs;
            int off = wt == CINFER_DTYPE_Q4_1 ? 0 : 8;
            for (int j = 0; j < CINFER_QK / 2; j++) {
                qw[j] = (qs[j] & 15) - off;
                qw[j + 16] = (qs[j] >> 4) - off;
            }
            dw = f16(wt == CINFER_DTYPE_Q4_1 ? b1->d : b0->d);
            if (wt == CINFER_DTYPE_Q4_1)
                mw = f16(b1->m);
        } else {
            const cinfer_block_q8_0 *b8 = (const cinfer_block_q8_0 *)wrow + b;
            for (int j = 0; j < CINFER_QK; j++)
                qw[j] = b8->qs[j];
            dw = f16(b8->d);
        }
        for (int r = 0; r < rt; r++) {
            const uint8_t *arow = act + (size_t)(r0 + r) * arb;
            const int8_t *qa;
            float da;
            if (wt == CINFER_DTYPE_Q4_1) {
                const cinfer_block_q8_1 *ab = (const cinfer_block_q8_1 *)arow + b;
                qa = ab->qs;
                da = f16(ab->d);
                float ms = mw * f16(ab->s); /* exact */
                summs[r] = summs[r] + ms;
            } else {
                const cinfer_block_q8_0 *ab = (const cinfer_block_q8_0 *)arow + b;
                qa = ab->qs;
                da = f16(ab->d);
            }
            float dd = dw * da; /* exact */
            for (int l = 0; l < 8; l++) {
                int isum = qw[4 * l] * qa[4 * l] + qw[4 * l + 1] * qa[4 * l + 1] +
                           qw[4 * l + 2] * qa[4 * l + 2] +
                           qw[4 * l + 3] * qa[4 * l + 3];
                acc[r][l] = fmaf(dd, (float)isum, acc[r][l]);
            }
        }
    }
    for (int r = 0; r < rt; r++) {
        float v = hsum8(acc[r]);
        if (wt == CINFER_DTYPE_Q4_1)
            v = v + summs[r];
        out[(r0 + r) * out_stride + o] = v;
    }
}

/* `count` elements of a float-type row from element i, widened to fp32 and
 * zero padded to `chunk`. */
static void load_chunk(cinfer_dtype t, const uint8_t *row, int64_t i,
                       int64_t n_in, int chunk, float *dst)
{
    for (int k = 0; k < chunk; k++) {
        int64_t e = i + k;
        if (e >= n_in) {
            dst[k] = 0.0f;
        } else if (t == CINFER_DTYPE_F16) {
            uint16_t h;
            memcpy(&h, row + 2 * e, 2);
            dst[k] = f16(h);
        } else if (t == CINFER_DTYPE_BF16) {
            uint16_t h;
            memcpy(&h, row + 2 * e, 2);
            dst[k] = bf16(h);
        } else {
            memcpy(&dst[k], row + 4 * e, 4);
        }
    }
}

/* F32 / F16 / BF16: column o against rows [r0, r0 + rt). */
static void col_f(cinfer_dtype wt, const uint8_t *wrow, const uint8_t *act,
                  size_t arb, int64_t r0, int rt, int64_t n_in, float *out,
                  int64_t out_stride, int64_t o)
{
    float acc[PT_ROWS][16] = {{0}};
    const int chunk = wt == CINFER_DTYPE_BF16 ? 32 : 16;
    for (int64_t i = 0; i < n_in; i += chunk) {
        float wv[32], av[32];
        load_chunk(wt, wrow, i, n_in, chunk, wv);
        for (int r = 0; r < rt; r++) {
            load_chunk(wt, act + (size_t)(r0 + r) * arb, i, n_in, chunk, av);
            if (wt == CINFER_DTYPE_BF16) {
                for (int l = 0; l < 16; l++) {
                    acc[r][l] = fmaf(wv[2 * l + 1], av[2 * l + 1], acc[r][l]);
                    acc[r][l] = fmaf(wv[2 * l], av[2 * l], acc[r][l]);
                }
            } else {
                for (int l = 0; l < 16; l++)
                    acc[r][l] = fmaf(wv[l], av[l], acc[r][l]);
            }
        }
    }
    for (int r = 0; r < rt; r++)
        out[(r0 + r) * out_stride + o] = hsum16(acc[r]);
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
        for (int64_t r0 = 0; r0 < n; r0 += PT_ROWS) {
            int rt = n - r0 < PT_ROWS ? (int)(n - r0) : PT_ROWS;
            if (quant)
                col_q(wt, wrow, (const uint8_t *)act, arb, r0, rt,
                      n_in / CINFER_QK, out, out_stride, o);
            else
                col_f(wt, wrow, (const uint8_t *)act, arb, r0, rt, n_in, out,
                      out_stride, o);
        }
    }
}

/* ---------------------------------------------------------------------- */
/* packed int8-block weights (matmul.h)                                   */
/* ---------------------------------------------------------------------- */

int cinfer_cpu_pack_rows(cinfer_dtype wt)
{
    switch (wt) {
    case CINFER_DTYPE_Q8_0:
        return 8;
    case CINFER_DTYPE_Q4_0:
    case CINFER_DTYPE_Q4_1:
    case CINFER_DTYPE_Q4_K:
    case CINFER_DTYPE_Q5_K:
    case CINFER_DTYPE_Q6_K:
    case CINFER_DTYPE_Q2_K:
    case CINFER_DTYPE_Q3_K:
    case CINFER_DTYPE_IQ4_XS:
    case CINFER_DTYPE_IQ4_NL:
        return 16;
    default:
        return 0;
    }
}

/* The K-quants and IQ4 (matmul.h; every type of
 * cinfer_cpu_matmul_is_kquant): block b of a group of G rows is G * bb
 * bytes at (group * nb + b) * G * bb: the rows' 2-byte fields (Q4_K,
 * Q5_K, Q2_K: d, dmin; IQ4_XS: d, scales_h; IQ4_NL: d), each field's G
 * values side by side, then each 4-byte word of the rest, the G rows'
 * word side by side; Q6_K's and Q3_K's d come after their words
 * (kq_layout). */

/* The plane of word i of a block (the order the kernels read them in):
 * Q2_K, Q4_K, Q5_K and IQ4_XS keep the block's order. Q3_K puts its 3
 * scale words first, then hmask word u and qs word u by turns (u = 0..7),
 * then qs words 8..15. Q6_K puts its 4 scale words
 * first, then for h = 0..1, n = 0..1, j = 0..3 (l = 4h + j) the ql words
 * 16n + l and 16n + 8 + l and the qh word 8n + l. */
static size_t kq_plane(cinfer_dtype wt, size_t i)
{
    if (wt == CINFER_DTYPE_Q3_K) { /* hmask 0..7, qs 8..23, scales 24..26 */
        if (i >= 24)
            return i - 24;
        if (i < 8)
            return 3 + 2 * i;
        return i < 16 ? 4 + 2 * (i - 8) : 11 + (i - 8);
    }
    if (wt != CINFER_DTYPE_Q6_K)
        return i;
    if (i >= 48) /* scales */
        return i - 48;
    const size_t n = i < 32 ? i / 16 : (i - 32) / 8;
    const size_t kind = i < 32 ? i % 16 / 8 : 2;
    const size_t l = i < 32 ? i % 8 : (i - 32) % 8;
    return 4 + ((l / 4 * 2 + n) * 4 + l % 4) * 3 + kind;
}

/* Where the pieces of row 0's block go in its packed group block: f16
 * field i from fb[i] of the block to fg[i], 4-byte word i from wb[i] to
 * wg[i]; row k's go 2k (fields) and 4k (words) further. */
typedef struct {
    int nf, nw;
    size_t fb[2], fg[2], wb[64], wg[64];
} kq_map;

static kq_map kq_layout(cinfer_dtype wt, size_t bb, int g)
{
    kq_map m;
    /* the block's f16 fields: before the words, or (Q6_K, Q3_K, Q2_K) after */
    const int d_only = wt == CINFER_DTYPE_Q6_K || wt == CINFER_DTYPE_Q3_K;
    const int after = d_only || wt == CINFER_DTYPE_Q2_K;
    m.nf = d_only || wt == CINFER_DTYPE_IQ4_NL ? 1 : 2;
    m.nw = (int)((bb - 2 * (size_t)m.nf) / 4);
    const size_t G = (size_t)g, nf = (size_t)m.nf, nw = (size_t)m.nw;
    /* the packed planes: Q6_K's and Q3_K's d last, the other types'
     * fields first */
    const size_t pw = d_only ? 0 : 2 * G * nf, pf = d_only ? 4 * G * nw : 0;
    for (size_t i = 0; i < nf; i++) {
        m.fb[i] = (after ? 4 * nw : 0) + 2 * i;
        m.fg[i] = pf + 2 * G * i;
    }
    for (size_t i = 0; i < nw; i++) {
        m.wb[i] = (after ? 0 : 2 * nf) + 4 * i;
        m.wg[i] = pw + 4 * G * kq_plane(wt, i);
    }
    return m;
}

static void kq_pack_range(cinfer_dtype wt, const void *w, int64_t n_out,
                          int64_t n_in, void *dst, int64_t p0, int64_t p1)
{
    const int g = cinfer_cpu_pack_rows(wt);
    const int64_t be = cinfer_dtype_block_elems(wt), nb = n_in / be, n_groups = n_out / g;
    const size_t bb = cinfer_dtype_row_bytes(wt, be), rb = bb * (size_t)nb;
    const int64_t g1 = p1 < n_groups ? p1 : n_groups;
    const kq_map m = kq_layout(wt, bb, g);
    for (int64_t grp = p0; grp < g1; grp++)
        for (int k = 0; k < g; k++) {
            const uint8_t *src = (const uint8_t *)w + (size_t)(grp * g + k) * rb;
            for (int64_t b = 0; b < nb; b++) {
                uint8_t *to = (uint8_t *)dst + ((size_t)(grp * nb + b) * (size_t)g) * bb;
                const uint8_t *from = src + (size_t)b * bb;
                for (int i = 0; i < m.nf; i++)
                    memcpy(to + m.fg[i] + 2 * (size_t)k, from + m.fb[i], 2);
                for (int i = 0; i < m.nw; i++)
                    memcpy(to + m.wg[i] + 4 * (size_t)k, from + m.wb[i], 4);
            }
        }
    if (p1 > n_groups) /* the last part: the tail */
        memcpy((uint8_t *)dst + (size_t)(n_groups * g) * rb,
               (const uint8_t *)w + (size_t)(n_groups * g) * rb,
               (size_t)(n_out - n_groups * g) * rb);
}

static void kq_packed_row(cinfer_dtype wt, const void *p, int64_t n_out,
                          int64_t n_in, int64_t row, int64_t b0, int64_t b1,
                          void *dst)
{
    const int g = cinfer_cpu_pack_rows(wt);
    const int64_t be = cinfer_dtype_block_elems(wt), nb = n_in / be, n_full = n_out / g * g;
    const size_t bb = cinfer_dtype_row_bytes(wt, be), rb = bb * (size_t)nb;
    uint8_t *out = dst;
    if (row >= n_full) {
        memcpy(out, (const uint8_t *)p + (size_t)row * rb + (size_t)b0 * bb,
               (size_t)(b1 - b0) * bb);
        return;
    }
    const kq_map m = kq_layout(wt, bb, g);
    const size_t k = (size_t)(row % g);
    for (int64_t b = b0; b < b1; b++) {
        const uint8_t *from = (const uint8_t *)p + ((size_t)(row / g * nb + b) * (size_t)g) * bb;
        uint8_t *to = out + (size_t)(b - b0) * bb;
        for (int i = 0; i < m.nf; i++)
            memcpy(to + m.fb[i], from + m.fg[i] + 2 * k, 2);
        for (int i = 0; i < m.nw; i++)
            memcpy(to + m.wb[i], from + m.wg[i] + 4 * k, 4);
    }
}

/* Where a packed matrix's pieces are. */
typedef struct {
    int64_t nb, n_full;
    size_t bb, sb, qb; /* block, scale and quant bytes */
    size_t gq, gs;     /* a group's quant and scale bytes */
    int g, flip;
    size_t rb;
    const uint8_t *quants, *scales, *tail;
} pack_geom;

static pack_geom geom(cinfer_dtype wt, const void *p, int64_t n_out,
                      int64_t n_in)
{
    pack_geom m;
    m.g = cinfer_cpu_pack_rows(wt);
    m.nb = n_in / CINFER_QK;
    m.n_full = n_out / m.g * m.g;
    m.bb = cinfer_dtype_row_bytes(wt, CINFER_QK);
    m.sb = wt == CINFER_DTYPE_Q4_1 ? 4 : 2;
    m.qb = m.bb - m.sb;
    m.gq = (size_t)m.nb * (size_t)m.g * m.qb;
    m.gs = (size_t)m.nb * (size_t)m.g * m.sb;
    m.flip = wt == CINFER_DTYPE_Q8_0;
    m.rb = cinfer_dtype_row_bytes(wt, n_in);
    m.quants = p;
    m.scales = m.quants + (size_t)(m.n_full / m.g) * m.gq;
    m.tail = m.scales + (size_t)(m.n_full / m.g) * m.gs;
    return m;
}

/* n bytes from src to dst, flipped to unsigned for Q8_0 (n % 8 == 0). */
static void copy_quants(uint8_t *dst, const uint8_t *src, size_t n, int flip)
{
    if (!flip) {
        memcpy(dst, src, n);
        return;
    }
    for (size_t j = 0; j < n; j += 8) {
        uint64_t v;
        memcpy(&v, src + j, 8);
        v ^= 0x8080808080808080ull;
        memcpy(dst + j, &v, 8);
    }
}

int64_t cinfer_cpu_pack_parts(cinfer_dtype wt, int64_t n_out)
{
    int g = cinfer_cpu_pack_rows(wt);
    return g ? n_out / g + 1 : 0;
}

void cinfer_cpu_pack(cinfer_dtype wt, const void *w, int64_t n_out,
                     int64_t n_in, void *dst)
{
    cinfer_cpu_pack_range(wt, w, n_out, n_in, dst, 0,
                          cinfer_cpu_pack_parts(wt, n_out));
}

void cinfer_cpu_pack_range(cinfer_dtype wt, const void *w, int64_t n_out,
                           int64_t n_in, void *dst, int64_t p0, int64_t p1)
{
    if (cinfer_cpu_matmul_is_kquant(wt)) {
        kq_pack_range(wt, w, n_out, n_in, dst, p0, p1);
        return;
    }
    pack_geom m = geom(wt, dst, n_out, n_in);
    uint8_t *quants = dst, *scales = (uint8_t *)m.scales;
    const int64_t n_groups = m.n_full / m.g;
    const int64_t g1 = p1 < n_groups ? p1 : n_groups;
    for (int64_t row = p0 * m.g; row < g1 * m.g; row++) {
        const uint8_t *src = (const uint8_t *)w + (size_t)row * m.rb;
        uint8_t *q = quants + (size_t)(row / m.g) * m.gq + m.qb * (size_t)(row % m.g);
        uint8_t *s = scales + (size_t)(row / m.g) * m.gs + m.sb * (size_t)(row % m.g);
        for (int64_t b = 0; b < m.nb; b++) {
            const uint8_t *blk = src + (size_t)b * m.bb;
            copy_quants(q + (size_t)b * m.g * m.qb, blk + m.sb, m.qb, m.flip);
            memcpy(s + (size_t)b * m.g * m.sb, blk, m.sb);
        }
    }
    if (p1 > n_groups) /* the last part: the tail */
        memcpy((uint8_t *)m.tail, (const uint8_t *)w + (size_t)m.n_full * m.rb,
               (size_t)(n_out - m.n_full) * m.rb);
}

void cinfer_cpu_packed_row(cinfer_dtype wt, const void *p, int64_t n_out,
                           int64_t n_in, int64_t row, int64_t b0, int64_t b1,
                           void *dst)
{
    if (cinfer_cpu_matmul_is_kquant(wt)) {
        kq_packed_row(wt, p, n_out, n_in, row, b0, b1, dst);
        return;
    }
    pack_geom m = geom(wt, p, n_out, n_in);
    uint8_t *out = dst;
    if (row >= m.n_full) {
        memcpy(out, m.tail + (size_t)(row - m.n_full) * m.rb + (size_t)b0 * m.bb,
               (size_t)(b1 - b0) * m.bb);
        return;
    }
    const uint8_t *q = m.quants + (size_t)(row / m.g) * m.gq + m.qb * (size_t)(row % m.g);
    const uint8_t *s = m.scales + (size_t)(row / m.g) * m.gs + m.sb * (size_t)(row % m.g);
    for (int64_t b = b0; b < b1; b++) {
        uint8_t *blk = out + (size_t)(b - b0) * m.bb;
        memcpy(blk, s + (size_t)b * m.g * m.sb, m.sb);
        copy_quants(blk + m.sb, q + (size_t)b * m.g * m.qb, m.qb, m.flip);
    }
}
