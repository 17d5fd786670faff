/* STREAM-style reference for `gpuwise probe`: read, copy and triad over fp32 arrays.
 *
 * Build: gcc -O3 -march=native -fopenmp triad.c -o triad
 * Run:   OMP_NUM_THREADS=<threads> ./triad <elements per array> <repeats>
 * Prints one JSON line: best GB/s of each kernel, bytes counted the STREAM way
 * (read 1 array, copy 2, triad 3; write-allocate traffic not counted).
 */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

static double best_of(double best, double start) {
    double t = omp_get_wtime() - start;
    return t < best ? t : best;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: %s ELEMENTS REPEATS\n", argv[0]);
        return 2;
    }
    const size_t n = strtoull(argv[1], NULL, 10);
    const int repeats = atoi(argv[2]);
    const float s = 0.5f;
    float *a = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    float *b = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    float *c = aligned_alloc(64, (n * sizeof(float) + 63) / 64 * 64);
    if (!a || !b || !c) {
        fprintf(stderr, "out of memory\n");
        return 1;
    }
    /* First touch by the threads that will use each page. */
#pragma omp parallel for schedule(static)
    for (size_t i = 0; i < n; i++) {
        a[i] = 1.0f;
        b[i] = 2.0f;
        c[i] = 0.5f;
    }
    double best_read = 1e30, best_copy = 1e30, best_triad = 1e30, sink = 0.0;
    for (int r = 0; r <= repeats; r++) { /* pass 0 warms up */
        double t = omp_get_wtime();
        float sum = 0.0f;
#pragma omp parallel for simd schedule(static) reduction(+ : sum)
        for (size_t i = 0; i < n; i++) sum += a[i];
        sink += sum;
        if (r) best_read = best_of(best_read, t);

        t = omp_get_wtime();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) c[i] = a[i];
        if (r) best_copy = best_of(best_copy, t);

        t = omp_get_wtime();
#pragma omp parallel for simd schedule(static)
        for (size_t i = 0; i < n; i++) a[i] = b[i] + s * c[i];
        if (r) best_triad = best_of(best_triad, t);
    }
    const double bytes = (double)n * sizeof(float);
    printf("{\"elements\": %zu, \"threads\": %d, \"repeats\": %d, \"read_gbs\": %.3f, "
           "\"copy_gbs\": %.3f, \"triad_gbs\": %.3f, \"check\": %g}\n",
           n, omp_get_max_threads(), repeats, bytes / best_read / 1e9,
           2 * bytes / best_copy / 1e9, 3 * bytes / best_triad / 1e9, sink + a[n / 2]);
    free(a);
    free(b);
    free(c);
    return 0;
}
