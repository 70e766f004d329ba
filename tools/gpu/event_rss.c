/* Where does memory go when CUDA events are created and freed in a loop? (issue 17)
 *
 * The suite's create/close cycle test saw RSS grow by ~6.4 MiB over 100,000 Event objects on
 * CUDA0. This program repeats the cycle without Python, twice: through ggml
 * (ggml_backend_event_new / ggml_backend_event_free on CUDA0) and through the CUDA runtime
 * directly (cudaEventCreateWithFlags(cudaEventDisableTiming) / cudaEventDestroy, what ggml-cuda
 * does). RSS is printed after each block of cycles: growth in both means the driver keeps it,
 * growth that levels off is a pool, not a leak.
 *
 *   nvcc -O2 tools/gpu/event_rss.c -I<tree>/include -L<build> -lggml -lggml-base -lcudart \
 *        -Xlinker -rpath=<build> -o event_rss && ./event_rss 200000
 */
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
#include <cuda_runtime_api.h>
#include "ggml-backend.h"

static long rss_kib(void) {
    long pages = 0, resident = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (!f || fscanf(f, "%ld %ld", &pages, &resident) != 2) { if (f) fclose(f); return -1; }
    fclose(f);
    return resident * (sysconf(_SC_PAGESIZE) / 1024);
}

int main(int argc, char **argv) {
    long n = argc > 1 ? atol(argv[1]) : 200000;
    long block = n / 8 > 0 ? n / 8 : 1;
    ggml_backend_load_all();
    ggml_backend_dev_t dev = ggml_backend_dev_by_name("CUDA0");
    if (!dev) { fprintf(stderr, "no CUDA0\n"); return 1; }
    /* warm up: the first events initialise the context and pools */
    for (int i = 0; i < 1000; i++) ggml_backend_event_free(ggml_backend_event_new(dev));
    long base = rss_kib();
    printf("ggml_backend_event_new/free on CUDA0 (RSS KiB, growth since warm-up)\n");
    for (long i = 1; i <= n; i++) {
        ggml_backend_event_free(ggml_backend_event_new(dev));
        if (i % block == 0) printf("  %8ld cycles: %ld (+%ld)\n", i, rss_kib(), rss_kib() - base);
    }
    cudaEvent_t ev;
    for (int i = 0; i < 1000; i++) { cudaEventCreateWithFlags(&ev, cudaEventDisableTiming); cudaEventDestroy(ev); }
    base = rss_kib();
    printf("cudaEventCreateWithFlags/cudaEventDestroy (RSS KiB, growth since warm-up)\n");
    for (long i = 1; i <= n; i++) {
        if (cudaEventCreateWithFlags(&ev, cudaEventDisableTiming) != cudaSuccess) return 2;
        cudaEventDestroy(ev);
        if (i % block == 0) printf("  %8ld cycles: %ld (+%ld)\n", i, rss_kib(), rss_kib() - base);
    }
    return 0;
}
