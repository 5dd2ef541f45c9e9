/* The small row-wise ops between a layer's products, for bfloat16 activations (specgen/native/__init__.py loads it).
 *
 * Each output row is a fixed function of its input row (no dependence on the number of rows), so these keep a
 * forward width-invariant like the attention kernel. Sums run in 16 lanes summed by a fixed tree; rounding follows
 * the torch expressions they replace (float32 math, bfloat16 results where torch rounds), though the float32 sums
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

/* weight * bfloat16(x * rsqrt(mean(x^2) + eps)), as RMSNorm.forward: one row of `dim`; sq: float32 scratch [dim] */
static void norm_row(const float *x, const uint16_t *w, int dim, float eps, uint16_t *out, float *sq) {
    for (int e = 0; e < dim; e++) sq[e] = x[e] * x[e];
    float r = 1.0f / sqrtf(lane_sum(sq, dim) / (float)dim + eps);
    for (int e = 0; e < dim; e++) out[e] = f32_to_bf16(bf16_to_f32(w[e]) * round_bf16(x[e] * r));
}

/* out [rows, dim] = RMSNorm(x [rows, dim]) with weight w [dim]. Returns 0, or -1 without scratch memory. */
int specgen_rms_norm_bf16(const uint16_t *x, const uint16_t *w, uint16_t *out, int rows, int dim, float eps) {
    float *scratch = malloc(sizeof(float) * 2 * (size_t)dim);
    if (!scratch) return -1;
    for (int i = 0; i < rows; i++) {
        const uint16_t *xi = x + (int64_t)i * dim;
        for (int e = 0; e < dim; e++) scratch[e] = bf16_to_f32(xi[e]);
        norm_row(scratch, w, dim, eps, out + (int64_t)i * dim, scratch + dim);
    }
    free(scratch);
    return 0;
}

/* sum = x + a (rounded to bfloat16, as `x + a`), out = RMSNorm(sum): a residual add and the next pre-norm */
int specgen_add_rms_norm_bf16(const uint16_t *x, const uint16_t *a, const uint16_t *w, uint16_t *sum, uint16_t *out,
                              int rows, int dim, float eps) {
    float *scratch = malloc(sizeof(float) * 2 * (size_t)dim);
    if (!scratch) return -1;
    for (int i = 0; i < rows; i++) {
        const uint16_t *xi = x + (int64_t)i * dim, *ai = a + (int64_t)i * dim;
        uint16_t *si = sum + (int64_t)i * dim;
        for (int e = 0; e < dim; e++) {
            si[e] = f32_to_bf16(bf16_to_f32(xi[e]) + bf16_to_f32(ai[e]));
            scratch[e] = bf16_to_f32(si[e]);
        }
        norm_row(scratch, w, dim, eps, out + (int64_t)i * dim, scratch + dim);
    }
    free(scratch);
    return 0;
}

/* out [rows, hidden] = bfloat16(bfloat16(silu(gate)) * up), gate and up rows at a row stride (the halves of one
 * fused gate/up product): silu(x) = x / (1 + e^-x), written with e^-|x| so the exp never overflows */
void specgen_silu_mul_bf16(const uint16_t *gate, const uint16_t *up, int64_t stride, uint16_t *out, int rows,
                           int hidden) {
    for (int i = 0; i < rows; i++) {
        const uint16_t *g = gate + i * stride, *u = up + i * stride;
        uint16_t *o = out + (int64_t)i * hidden;
        for (int e = 0; e < hidden; e++) {
            float x = bf16_to_f32(g[e]);
            float z = exp_nonpositive(x < 0.0f ? x : -x);  /* e^-|x| */
            float s = x < 0.0f ? x * z / (1.0f + z) : x / (1.0f + z);
            o[e] = f32_to_bf16(round_bf16(s) * bf16_to_f32(u[e]));
        }
    }
}
