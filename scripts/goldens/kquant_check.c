/*
 * kquant_check.c - cinfer's K-quant and IQ4 kernels against llama.cpp's
 * ggml, bit for bit (built and run by kquant-check.sh; not part of the
 * build).
 *
 * 1. Through ggml's CPU type traits, for Q2_K, Q3_K, Q4_K, Q5_K, Q6_K,
 *    IQ4_NL and IQ4_XS: dequantization of rows (ggml's own quantizer's
 *    blocks and cinfer's), the activation quantization of the type's
 *    vec_dot_type (Q8_K; Q8_0 for IQ4_NL), and ggml_vec_dot_<type>_<act>
 *    against cinfer_cpu_matmul_compute on every ISA this processor has;
 *    for Q4_K, IQ4_NL and Q2_K (16 rows) the reference is instead a
 *    mul_mat on the CPU_REPACK buffer at 3 activation rows, all of which
 *    take ggml_gemv_q4_K_8x8_q8_K / _iq4_nl_8x8_q8_0 / _q2_K_8x8_q8_K
 *    (gemm takes rows four at a time), the order llama.cpp computes such a
 *    weight of rows % 8 == 0 in (on AVX2; Q2_K on AVX-512). Any
 *    difference fails.
 * 2. Through a ggml graph (mul_mat on the CPU backend): the plain buffer
 *    (the vec_dot path; for IQ4_NL at 2 rows or more llamafile's tinyBLAS,
 *    which sums all blocks in one accumulator, unlike vec_dot's two) and,
 *    where ggml repacks the type on this
 *    processor (Q4_K and IQ4_NL on AVX2, Q2_K on AVX-512), the CPU_REPACK
 *    buffer that llama.cpp puts weights in by default (a different float
 *    order). Differences are reported, not failed: cinfer follows the
 *    vec_dot order except for Q4_K, IQ4_NL and Q2_K, where it follows the
 *    repacked gemv (at n=5 the repacked path's first four rows take gemm).
 */
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"
#include "ggml.h"
#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t st = 88172645463325252ull;
static uint64_t rnd(void)
{
    st ^= st << 13;
    st ^= st >> 7;
    st ^= st << 17;
    return st;
}
static ggml_backend_t g_be;
static ggml_backend_buffer_type_t g_repack; /* CPU_REPACK, or NULL */

static float rf(void)
{
    return ((float)(rnd() % 2000001) / 1000000.0f - 1.0f);
}

/* out[r][o] through a ggml graph; weights in buft (NULL: plain CPU) */
static void ggml_mm(ggml_backend_t be, ggml_backend_buffer_type_t buft, int t, const void *wq,
                    int n_in, int n_out, const float *x, int n, float *out)
{
    struct ggml_init_params ip = {ggml_tensor_overhead() * 8 + ggml_graph_overhead(), NULL, true};
    struct ggml_context *ctx = ggml_init(ip);
    struct ggml_tensor *w = ggml_new_tensor_2d(ctx, t, n_in, n_out);
    struct ggml_tensor *a = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, n_in, n);
    struct ggml_tensor *y = ggml_mul_mat(ctx, w, a);
    struct ggml_cgraph *g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, y);
    ggml_backend_buffer_type_t cpu = ggml_backend_get_default_buffer_type(be);
    ggml_backend_buffer_t wb = ggml_backend_buft_alloc_buffer(
        buft ? buft : cpu, ggml_backend_buft_get_alloc_size(buft ? buft : cpu, w) + 64);
    ggml_backend_buffer_set_usage(wb, GGML_BACKEND_BUFFER_USAGE_WEIGHTS);
    struct ggml_tallocr ta = ggml_tallocr_new(wb);
    ggml_tallocr_alloc(&ta, w);
    ggml_backend_tensor_set(w, wq, 0, ggml_nbytes(w));
    ggml_backend_buffer_t ab = ggml_backend_alloc_ctx_tensors_from_buft(ctx, cpu); /* a and y */
    ggml_backend_tensor_set(a, x, 0, ggml_nbytes(a));
    ggml_backend_graph_compute(be, g);
    ggml_backend_tensor_get(y, out, 0, ggml_nbytes(y));
    ggml_backend_buffer_free(ab);
    ggml_backend_buffer_free(wb);
    ggml_free(ctx);
}

static int check_kernels(void)
{
    const int types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q6_K,  GGML_TYPE_Q5_K,  GGML_TYPE_Q2_K,
                         GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_NL};
    /* IQ4_NL (blocks of 32) also at odd block counts: its pairs and tail */
    const int ns[] = {256, 768, 2816, 4096, 32, 96, 800};
    int fails = 0, checks = 0;
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        int t = types[ti];
        const int at = ggml_get_type_traits_cpu(t)->vec_dot_type;
        for (int ni = 0; ni < (t == GGML_TYPE_IQ4_NL ? 7 : 4); ni++) {
            int n = ns[ni];
            /* the types cinfer computes in ggml's repacked gemv order */
            const int q4k = t == GGML_TYPE_Q4_K || t == GGML_TYPE_IQ4_NL ||
                            (t == GGML_TYPE_Q2_K && ggml_cpu_has_avx512());
            if (q4k && !g_repack) {
                printf("%s: no CPU_REPACK buffer here, not checked\n", ggml_type_name(t));
                fails++;
                break;
            }
            int rows = q4k ? 16 : 9;
            float *w = malloc(sizeof(float) * n * rows), *x = malloc(sizeof(float) * n * 3);
            for (int i = 0; i < n * rows; i++)
                w[i] = rf() * (i % 97 == 0 ? 8 : 1) + (i / n == 2 ? 0.7f : 0.0f);
            for (int i = 0; i < n * 3; i++)
                x[i] = rf() * (1 + (i / n) * 10) * (i % 41 == 0 ? 30 : 1);
            size_t wrb = ggml_row_size(t, n);
            uint8_t *wq = malloc(wrb * rows), *wq2 = malloc(wrb * rows);
            ggml_quantize_chunk(t, w, wq, 0, rows, n, NULL); /* llama-quantize's blocks */
            for (int r = 0; r < rows; r++) {
                cinfer_quantize_row((cinfer_dtype)t, w + r * n, wq2 + r * wrb, n);
            }
            /* dequant equality */
            float *d1 = malloc(sizeof(float) * n), *d2 = malloc(sizeof(float) * n);
            for (int r = 0; r < rows; r++) {
                ggml_get_type_traits(t)->to_float(wq + r * wrb, d1, n);
                cinfer_dequantize_row((cinfer_dtype)t, wq + r * wrb, d2, n);
                checks++;
                if (memcmp(d1, d2, sizeof(float) * n)) {
                    fails++;
                    printf("dequant differs %s n %d r %d\n", ggml_type_name(t), n, r);
                }
                ggml_get_type_traits(t)->to_float(wq2 + r * wrb, d1, n);
                cinfer_dequantize_row((cinfer_dtype)t, wq2 + r * wrb, d2, n);
                checks++;
                if (memcmp(d1, d2, sizeof(float) * n)) {
                    fails++;
                    printf("dequant(cinfer blocks) differs %s n %d r %d\n", ggml_type_name(t), n, r);
                }
            }
            /* the activation type (Q8_K or Q8_0) */
            if ((int)cinfer_cpu_matmul_act_type((cinfer_dtype)t) != at) {
                fails++;
                printf("activation type differs t %d: ggml %d\n", t, at);
            }
            size_t arb = ggml_row_size(at, n);
            uint8_t *a1 = malloc(arb * 3), *a2 = malloc(arb * 3);
            for (int r = 0; r < 3; r++) {
                ggml_get_type_traits_cpu(at)->from_float(x + r * n, a1 + r * arb, n);
                cinfer_quantize_row((cinfer_dtype)at, x + r * n, a2 + r * arb, n);
            }
            checks++;
            if (memcmp(a1, a2, arb * 3)) {
                fails++;
                printf("%s differs n %d\n", ggml_type_name(at), n);
            }
            /* dots */
            for (int pass = 0; pass < 2; pass++) {
                uint8_t *W = pass ? wq2 : wq;
                float ref[48], got[48];
                if (q4k)
                    ggml_mm(g_be, g_repack, t, W, n, rows, x, 3, ref);
                else
                    for (int r = 0; r < 3; r++)
                        for (int o = 0; o < rows; o++)
                            ggml_get_type_traits_cpu(t)->vec_dot(n, &ref[r * rows + o], 0,
                                                                 W + o * wrb, 0, a1 + r * arb, 0, 1);
                for (int isa = CINFER_CPU_ISA_PORTABLE; isa <= CINFER_CPU_ISA_AVX512; isa++) {
                    if (!cinfer_cpu_isa_supported((cinfer_cpu_isa)isa))
                        continue;
                    cinfer_cpu_matmul_compute((cinfer_cpu_isa)isa, (cinfer_dtype)t, W, wrb, a1, 3,
                                              n, got, rows, 0, rows);
                    checks++;
                    if (memcmp(ref, got, sizeof(float) * 3 * rows)) {
                        fails++;
                        printf("dot differs %s n %d pass %d isa %s: %.9g vs %.9g\n", ggml_type_name(t), n, pass,
                               cinfer_cpu_isa_name((cinfer_cpu_isa)isa), ref[0], got[0]);
                    }
                }
            }
            free(w);
            free(x);
            free(wq);
            free(wq2);
            free(d1);
            free(d2);
            free(a1);
            free(a2);
        }
    }
    printf("kernels: %d checks against ggml, %d failed\n", checks, fails);
    return fails;
}

static void check_graph(void)
{
    ggml_backend_t be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(be, 1);
    ggml_backend_dev_t dev = ggml_backend_get_device(be);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    ggml_backend_dev_get_extra_bufts_t get =
        (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
            reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t *extra = get ? get(dev) : NULL;
    const int types[] = {GGML_TYPE_Q4_K, GGML_TYPE_Q5_K, GGML_TYPE_Q6_K,  GGML_TYPE_Q2_K,
                         GGML_TYPE_Q3_K, GGML_TYPE_IQ4_XS, GGML_TYPE_IQ4_NL};
    const int n_in = 768, n_out = 16, ns[] = {1, 5};
    for (int ti = 0; ti < (int)(sizeof types / sizeof types[0]); ti++) {
        int t = types[ti];
        const cinfer_dtype at = cinfer_cpu_matmul_act_type((cinfer_dtype)t);
        float *w = malloc(sizeof(float) * n_in * n_out), *x = malloc(sizeof(float) * n_in * 5);
        for (int i = 0; i < n_in * n_out; i++)
            w[i] = rf();
        for (int i = 0; i < n_in * 5; i++)
            x[i] = rf() * (i % 37 == 0 ? 20 : 1);
        size_t wrb = ggml_row_size(t, n_in), arb = cinfer_dtype_row_bytes(at, n_in);
        uint8_t *wq = malloc(wrb * n_out), *act = malloc(arb * 5);
        ggml_quantize_chunk(t, w, wq, 0, n_out, n_in, NULL);
        for (int ni = 0; ni < 2; ni++) {
            int n = ns[ni];
            float plain[80], rep[80], ours[80];
            ggml_mm(be, NULL, t, wq, n_in, n_out, x, n, plain);
            /* x86 repacks Q4_K (q4_K_8x8) and IQ4_NL (iq4_nl_8x8) on AVX2,
             * Q2_K (q2_K_8x8) on AVX-512; rows % 8 == 0 */
            int repacked = extra && extra[0] &&
                           (((t == GGML_TYPE_Q4_K || t == GGML_TYPE_IQ4_NL) && ggml_cpu_has_avx2()) ||
                            (t == GGML_TYPE_Q2_K && ggml_cpu_has_avx512()));
            if (repacked)
                ggml_mm(be, extra[0], t, wq, n_in, n_out, x, n, rep);
            else
                memcpy(rep, plain, sizeof rep);
            /* the best ISA here (each equals portable: part 1) */
            cinfer_cpu_matmul_prepare(CINFER_CPU_ISA_AUTO, at, x, n_in, 0, n, act);
            cinfer_cpu_matmul_compute(CINFER_CPU_ISA_AUTO, (cinfer_dtype)t, wq, wrb, act, n, n_in,
                                      ours, n_out, 0, n_out);
            int dp = 0, dr = 0;
            for (int i = 0; i < n * n_out; i++) {
                dp += plain[i] != ours[i];
                dr += rep[i] != ours[i];
            }
            printf("graph %s n=%d: vs the plain-buffer path %d/%d differ", ggml_type_name(t), n, dp,
                   n * n_out);
            if (repacked)
                printf("; vs the repacked (CPU_REPACK) path %d/%d differ", dr, n * n_out);
            printf("\n");
        }
        free(w);
        free(x);
        free(wq);
        free(act);
    }
    ggml_backend_free(be);
}

int main(void)
{
    setvbuf(stdout, NULL, _IONBF, 0);
    ggml_cpu_init();
    g_be = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(g_be, 1);
    {
        ggml_backend_dev_t dev = ggml_backend_get_device(g_be);
        ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
        ggml_backend_dev_get_extra_bufts_t get =
            (ggml_backend_dev_get_extra_bufts_t)ggml_backend_reg_get_proc_address(
                reg, "ggml_backend_dev_get_extra_bufts");
        ggml_backend_buffer_type_t *extra = get ? get(dev) : NULL;
        g_repack = extra && extra[0] && ggml_cpu_has_avx2() ? extra[0] : NULL;
    }
    int fails = check_kernels();
    check_graph();
    ggml_backend_free(g_be);
    return fails != 0;
}
