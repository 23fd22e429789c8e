/*
 * cuda_products.c - how close the CUDA backend's products of a few tokens
 * (decode's matrix-vector products) come to the device's memory bandwidth:
 * for each weight format, a matrix several times the L2 cache, through
 * ops->linear as the forward pass calls it, against the copy bandwidth
 * measured in the same run (sp_backend_copy_gbs).
 *
 *     build/cuda/bench/cuda_products [ROWS COLS]     (default 16384 x 8192)
 *
 * One machine-readable line per format, activations and token count (best
 * of 5 passes of 20 products each; the time includes each product's
 * launches, rounding the activations to int8 where it does): 4-bit formats
 * with int8 activations (the default) and float ones (--precision exact).
 *
 *     product fmt=mxfp4 acts=int8 rows=16384 cols=8192 tokens=1 us=... gbs=... copy_gbs=... pct=...
 *
 * gbs: the weight bytes (codes, scales, biases) a product reads over its
 * time. Without a CUDA build or device it says so and exits 0.
 */
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "core/clock.h"
#include "quant/dtype.h"
#include "quant/qtype.h"

struct fmt {
    const char *name;
    enum sp_qtype type;
    int group;
    enum sp_dtype scale_dtype;
};

/* Random codes (any bits: a product's time does not depend on them) and
 * scales of moderate size, so no value is infinite. */
static void fill(const struct fmt *f, int64_t rows, int64_t cols, struct sp_qmat *m, void **codes, void **scales,
                 void **biases) {
    const struct sp_qtype_traits *tr = sp_qtype_traits(f->type);
    size_t rb = sp_qtype_row_bytes(f->type, cols), n_codes = (size_t)rows * rb;
    uint8_t *c = malloc(n_codes);
    uint32_t s = 12345;
    for (size_t i = 0; i < n_codes; i++) {
        s = s * 1664525u + 1013904223u;
        c[i] = (uint8_t)(s >> 24);
    }
    if (f->type == SP_QTYPE_BF16 || f->type == SP_QTYPE_F16)  /* keep float codes finite: clear exponent's top bit */
        for (size_t i = 1; i < n_codes; i += 2) c[i] &= 0x3f;
    *codes = c;
    *scales = *biases = NULL;
    enum sp_dtype sdt = tr->scale_dtype != SP_DTYPE_COUNT ? tr->scale_dtype : f->scale_dtype;
    if (tr->mode) {
        size_t n = (size_t)rows * (size_t)(cols / f->group), size = sp_dtype_size(sdt);
        uint8_t *sc = malloc(n * size);
        for (size_t i = 0; i < n; i++) {
            if (size == 1)
                sc[i] = 120;  // E8M0 2^-7
            else
                sp_dtype_store_float(sdt, sc, i, 0.01f);
        }
        *scales = sc;
        if (tr->has_biases) {
            uint8_t *bi = malloc(n * size);
            memcpy(bi, sc, n * size);
            *biases = bi;
        }
    }
    *m = (struct sp_qmat){.type = f->type, .group = tr->mode ? f->group : 1, .rows = rows, .cols = cols,
                          .codes = *codes, .scales = *scales, .biases = *biases,
                          .scale_dtype = tr->mode ? sdt : SP_DTYPE_COUNT};
}

/* Each format's products of 1 and 8 tokens on backend b (exact: float
 * activations; then only the 4-bit formats, the others' are the same). */
static int run_formats(struct sp_backend *b, bool exact, const struct fmt *fmts, size_t n_fmts, int64_t rows,
                       int64_t cols, double copy, const float *hx) {
    const int64_t tokens[] = {1, 8};
    struct sp_tensor x, y;
    if (sp_backend_tensor(b, 8, cols, &x) != SP_OK || sp_backend_tensor(b, 8, rows, &y) != SP_OK) {
        printf("cuda_products: %s\n", sp_error_msg());
        return 1;
    }
    b->ops->write(b, x, hx);
    int rc = 0;
    for (size_t f = 0; f < n_fmts && !rc; f++) {
        bool four_bit = fmts[f].type == SP_QTYPE_MXFP4 || fmts[f].type == SP_QTYPE_AFFINE4;
        if (exact && !four_bit) continue;
        void *codes, *scales, *biases;
        struct sp_linear l = {0};
        fill(&fmts[f], rows, cols, &l.w, &codes, &scales, &biases);
        double bytes = sp_linear_bytes(&l);
        if (b->ops->prepare(b, &l) != SP_OK) {
            printf("cuda_products: %s: %s\n", fmts[f].name, sp_error_msg());
            rc = 1;
        }
        for (size_t k = 0; k < sizeof tokens / sizeof *tokens && !rc; k++) {
            struct sp_tensor xs = sp_tensor_rows(x, 0, tokens[k]), ys = sp_tensor_rows(y, 0, tokens[k]);
            double best = 0;
            for (int pass = 0; pass < 6; pass++) {
                b->ops->sync(b);
                double t0 = sp_now_s();
                for (int i = 0; i < 20; i++) b->ops->linear(b, &l, xs, ys);
                b->ops->sync(b);
                double t = (sp_now_s() - t0) / 20;
                if (pass > 0 && (best == 0 || t < best)) best = t;  // the first pass warms up
            }
            if (b->ops->error(b) != SP_OK) {
                printf("cuda_products: %s: %s\n", fmts[f].name, sp_error_msg());
                rc = 1;
                break;
            }
            double gbs = bytes / best / 1e9;
            printf("product fmt=%s acts=%s rows=%lld cols=%lld tokens=%lld us=%.1f gbs=%.1f copy_gbs=%.1f pct=%.1f\n",
                   fmts[f].name, four_bit && !exact ? "int8" : "float", (long long)rows, (long long)cols,
                   (long long)tokens[k], best * 1e6, gbs, copy, copy > 0 ? 100.0 * gbs / copy : 0.0);
        }
        free(codes);
        free(scales);
        free(biases);
    }
    return rc;
}

int main(int argc, char **argv) {
    int64_t rows = argc > 2 ? atoll(argv[1]) : 16384, cols = argc > 2 ? atoll(argv[2]) : 8192;
    const struct fmt fmts[] = {{"mxfp4", SP_QTYPE_MXFP4, 32, SP_DTYPE_COUNT},
                               {"affine4", SP_QTYPE_AFFINE4, 64, SP_DTYPE_BF16},
                               {"affine8", SP_QTYPE_AFFINE8, 64, SP_DTYPE_BF16},
                               {"bf16", SP_QTYPE_BF16, 1, SP_DTYPE_COUNT},
                               {"f16", SP_QTYPE_F16, 1, SP_DTYPE_COUNT}};
    struct sp_backend_params p = {
        .shape = {.n_layers = 1, .n_kv_layers = 1, .d_model = cols, .vocab = 1, .n_heads = 1, .n_kv_heads = 1, .head_dim = 64,
                  .mlp_width = 1},
        .n_ctx = 1, .n_seq = 1, .max_batch = 8};
    struct sp_backend *b, *exact;
    if (sp_backend_create(SP_DEVICE_CUDA, &p, &b) != SP_OK) {
        printf("cuda_products: skipped: %s\n", sp_error_msg());
        return 0;
    }
    p.float_activations = true;
    if (sp_backend_create(SP_DEVICE_CUDA, &p, &exact) != SP_OK) {
        printf("cuda_products: %s\n", sp_error_msg());
        sp_backend_free(b);
        return 1;
    }
    double copy = 0;
    if (sp_backend_copy_gbs(SP_DEVICE_CUDA, (size_t)1 << 30, &copy) != SP_OK) copy = 0;
    float *hx = malloc((size_t)(8 * cols) * sizeof *hx);
    for (int64_t i = 0; i < 8 * cols; i++) hx[i] = (float)((i * 7919) % 1000) / 1000.0f - 0.5f;
    int rc = 0;
    for (int e = 0; e < 2 && !rc; e++) {
        int erc = run_formats(e ? exact : b, e, fmts, sizeof fmts / sizeof *fmts, rows, cols, copy, hx);
        rc = rc ? rc : erc;
    }
    free(hx);
    sp_backend_free(exact);
    sp_backend_free(b);
    return rc;
}
