/* The norms between a layer's products, for bfloat16 or float32 activations (`es` = 2 or 4: the element
 * size; specgen/native/__init__.py loads it).
 *
 * Each output row is a fixed function of its input row (no dependence on the number of rows), so these keep a
 * forward width-invariant like the attention kernel. Sums run in 16 lanes summed by a fixed tree; rounding follows
 * the torch expressions they replace (float32 math, results rounded to the dtype where torch rounds), though the sums
 * may differ from torch's in the last bits. Built with -ffp-contract=off.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define LANES 16

/* sum of x[0..n) in 16 lanes (lane l adds l, l + 16, ... in order), the lanes summed by a fixed tree */
static float lane_sum(const float *x, int n) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= n; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] = acc[l] + x[i + l];
    for (int l = 0; i + l < n; l++) acc[l] = acc[l] + x[i + l];
    for (int w = LANES / 2; w > 0; w /= 2)
        for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
    return acc[0];
}

/* weight * rnd(x * rsqrt(mean(x^2) + eps)), as RMSNorm.forward (rnd: rounding to bfloat16 when es = 2, as its
 * `.to(x.dtype)`): one row of `dim`; sq: float32 scratch [dim] */
static void norm_row(const float *x, const void *w, int dim, float eps, void *out, float *sq, int es) {
    for (int e = 0; e < dim; e++) sq[e] = x[e] * x[e];
    float r = 1.0f / sqrtf(lane_sum(sq, dim) / (float)dim + eps);
    for (int e = 0; e < dim; e++) store(out, e, load1(w, e, es) * rnd(x[e] * r, es), es);
}

/* out [rows, dim] = RMSNorm(x [rows, dim]) with weight w [dim]; all bfloat16 (es = 2) or float32 (es = 4). Returns 0,
 * or -1 without scratch memory. */
int specgen_rms_norm(const void *x, const void *w, void *out, int rows, int dim, float eps, int es) {
    float *scratch = malloc(sizeof(float) * 2 * (size_t)dim);
    if (!scratch) return -1;
    for (int i = 0; i < rows; i++) {
        const void *xi = AT(x, (int64_t)i * dim);
        for (int e = 0; e < dim; e++) scratch[e] = load1(xi, e, es);
        norm_row(scratch, w, dim, eps, (char *)out + (int64_t)i * dim * es, scratch + dim, es);
    }
    free(scratch);
    return 0;
}

/* sum = x + a (rounded to the dtype, as `x + a`), out = RMSNorm(sum): a residual add and the next pre-norm */
int specgen_add_rms_norm(const void *x, const void *a, const void *w, void *sum, void *out, int rows, int dim,
                         float eps, int es) {
    float *scratch = malloc(sizeof(float) * 2 * (size_t)dim);
    if (!scratch) return -1;
    for (int i = 0; i < rows; i++) {
        const void *xi = AT(x, (int64_t)i * dim), *ai = AT(a, (int64_t)i * dim);
        void *si = (char *)sum + (int64_t)i * dim * es;
        for (int e = 0; e < dim; e++) {
            store(si, e, load1(xi, e, es) + load1(ai, e, es), es);
            scratch[e] = load1(si, e, es);
        }
        norm_row(scratch, w, dim, eps, (char *)out + (int64_t)i * dim * es, scratch + dim, es);
    }
    free(scratch);
    return 0;
}
