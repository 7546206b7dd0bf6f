/*
 * kquant_isa_ab.c - one K-quant / IQ4 product timed on one ISA, in thread
 * CPU time (built and run by kquant_isa_ab.py; not part of the build).
 *
 * Thread CPU time, not wall time: on a machine shared with other builds
 * the wall clock counts the time another process holds the core, the CPU
 * clock only this one's (memory stalls included). Best of 5 repetitions
 * of `iters` calls of cinfer_cpu_matmul_compute (the activation prepared
 * once, outside the timing).
 *
 *     kquant_isa_ab TYPE ISA N_ROWS N_IN ITERS N_OUT
 * prints: us per call, GOP/s (2 n n_out n_in / t)
 */
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

#include "kernels/cpu/matmul.h"
#include "kernels/dtype.h"

static double cpu_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    if (argc != 7) {
        fprintf(stderr, "usage: kquant_isa_ab TYPE ISA N_ROWS N_IN ITERS N_OUT\n");
        return 2;
    }
    const cinfer_dtype wt = (cinfer_dtype)atoi(argv[1]);
    const cinfer_cpu_isa isa = (cinfer_cpu_isa)atoi(argv[2]);
    const int64_t n = atoll(argv[3]), n_in = atoll(argv[4]), n_out = atoll(argv[6]);
    const int iters = atoi(argv[5]);
    const cinfer_dtype at = cinfer_cpu_matmul_act_type(wt);
    const size_t wrb = cinfer_dtype_row_bytes(wt, n_in), arb = cinfer_dtype_row_bytes(at, n_in);
    uint8_t *w = malloc(wrb * (size_t)n_out), *act = malloc(arb * (size_t)n);
    float *x = malloc(sizeof(float) * (size_t)(n_in * (n > 1 ? n : 1)));
    float *out = malloc(sizeof(float) * (size_t)(n_out * n));
    if (!w || !act || !x || !out)
        return 1;
    srand(1);
    for (int64_t o = 0; o < n_out; o++) {
        for (int64_t i = 0; i < n_in; i++)
            x[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
        cinfer_quantize_row(wt, x, w + wrb * (size_t)o, n_in);
    }
    for (int64_t i = 0; i < n_in * n; i++)
        x[i] = (float)(rand() % 2001 - 1000) / 1000.0f;
    cinfer_cpu_matmul_prepare(isa, at, x, n_in, 0, n, act);
    double best = 1e30;
    for (int rep = 0; rep < 5; rep++) {
        double t0 = cpu_s();
        for (int k = 0; k < iters; k++)
            cinfer_cpu_matmul_compute(isa, wt, w, wrb, act, n, n_in, out, n_out, 0, n_out);
        double dt = (cpu_s() - t0) / iters;
        best = dt < best ? dt : best;
    }
    printf("%.2f %.2f\n", best * 1e6, 2.0 * (double)n * (double)n_out * (double)n_in / best / 1e9);
    free(w);
    free(act);
    free(x);
    free(out);
    return 0;
}
