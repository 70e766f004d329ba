// The same graphs ggml_py's benchmarks build, run natively on the same ggml libraries: the
// baseline for Python-side overhead. Built by benchmarks/_native.py.
//
//   native_graph DEVICE TEST SIZE REPS THREADS [TYPE]
//     TEST matmul : SIZE x SIZE x SIZE mul_mat, weights of TYPE (f32 or f16)
//     TEST chain  : SIZE elementwise adds on 4096 floats, one after another
//   prints the best and the mean seconds of one graph compute
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static void fill(struct ggml_tensor * t) {
    size_t n = ggml_nelements(t);
    float * f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) f[i] = (float)((i * 7919u) % 1000) / 1000.0f - 0.5f;
    if (t->type == GGML_TYPE_F16) {
        ggml_fp16_t * h = malloc(n * sizeof(ggml_fp16_t));
        ggml_fp32_to_fp16_row(f, h, (int64_t)n);
        ggml_backend_tensor_set(t, h, 0, n * sizeof(ggml_fp16_t));
        free(h);
    } else {
        ggml_backend_tensor_set(t, f, 0, n * sizeof(float));
    }
    free(f);
}

int main(int argc, char ** argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s DEVICE matmul|chain SIZE REPS THREADS [f32|f16]\n", argv[0]);
        return 2;
    }
    const char * test = argv[2];
    int size = atoi(argv[3]), reps = atoi(argv[4]), threads = atoi(argv[5]);
    enum ggml_type wtype = argc > 6 && strcmp(argv[6], "f16") == 0 ? GGML_TYPE_F16 : GGML_TYPE_F32;

    ggml_backend_dev_t dev = ggml_backend_dev_by_name(argv[1]);
    if (!dev) { fprintf(stderr, "no device %s\n", argv[1]); return 1; }
    ggml_backend_t be = ggml_backend_dev_init(dev, NULL);
    ggml_backend_reg_t reg = ggml_backend_dev_backend_reg(dev);
    void (*set_threads)(ggml_backend_t, int) =
        (void (*)(ggml_backend_t, int)) ggml_backend_reg_get_proc_address(reg, "ggml_backend_set_n_threads");
    if (set_threads) set_threads(be, threads);

    int n_nodes = strcmp(test, "chain") == 0 ? size : 1;
    struct ggml_init_params p = { ggml_tensor_overhead() * (n_nodes + 16), NULL, true };
    struct ggml_context * ctx = ggml_init(p);
    struct ggml_tensor * out;
    if (strcmp(test, "matmul") == 0) {
        struct ggml_tensor * a = ggml_new_tensor_2d(ctx, wtype, size, size);
        struct ggml_tensor * b = ggml_new_tensor_2d(ctx, GGML_TYPE_F32, size, size);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        (void) buf;
        fill(a); fill(b);
        out = ggml_mul_mat(ctx, a, b);
    } else {
        struct ggml_tensor * x = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4096);
        struct ggml_tensor * y = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 4096);
        ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, be);
        (void) buf;
        fill(x); fill(y);
        out = x;
        for (int i = 0; i < size; i++) out = ggml_add(ctx, out, y);
    }
    struct ggml_init_params gp = { ggml_graph_overhead_custom(2 * n_nodes + 16, false) + 1024, NULL, true };
    struct ggml_context * gctx = ggml_init(gp);
    struct ggml_cgraph * g = ggml_new_graph_custom(gctx, 2 * n_nodes + 16, false);
    ggml_build_forward_expand(g, out);
    ggml_gallocr_t alloc = ggml_gallocr_new(ggml_backend_get_default_buffer_type(be));
    if (!ggml_gallocr_alloc_graph(alloc, g)) { fprintf(stderr, "alloc failed\n"); return 1; }

    for (int i = 0; i < 2; i++) ggml_backend_graph_compute(be, g);
    double best = 1e30, total = 0;
    for (int i = 0; i < reps; i++) {
        double t = now();
        ggml_backend_graph_compute(be, g);
        t = now() - t;
        total += t;
        if (t < best) best = t;
    }
    printf("%.9f %.9f\n", best, total / reps);
    ggml_gallocr_free(alloc);
    ggml_free(gctx);
    ggml_free(ctx);
    ggml_backend_free(be);
    return 0;
}
