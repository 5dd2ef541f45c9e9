/* Scalar helpers shared by specgen's native kernels: bfloat16 <-> float32 as torch converts, element access for
 * either dtype, and a fixed exp. */
#ifndef SPECGEN_COMMON_H
#define SPECGEN_COMMON_H

#include <stdint.h>
#include <string.h>

static inline float bf16_to_f32(uint16_t x) {
    uint32_t u = (uint32_t)x << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* round to nearest even, as torch converts float32 to bfloat16 (NaN -> 0x7FC0) */
static inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0x7fc0;
    return (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}

static inline float round_bf16(float x) { return bf16_to_f32(f32_to_bf16(x)); }

/* Element i of a bfloat16 (es = 2) or float32 (es = 4) array; storing rounds to the array's dtype, as torch does. */
#define AT(ptr, i) ((const char *)(ptr) + (int64_t)(i) * es)
static inline float load1(const void *src, int64_t i, int es) {
    return es == 4 ? ((const float *)src)[i] : bf16_to_f32(((const uint16_t *)src)[i]);
}
static inline void store(void *dst, int64_t i, float x, int es) {
    if (es == 4) ((float *)dst)[i] = x;
    else ((uint16_t *)dst)[i] = f32_to_bf16(x);
}
/* x rounded to the dtype (a torch op's result in it) */
static inline float rnd(float x, int es) { return es == 4 ? x : round_bf16(x); }

/* e^x for x <= 0 (a score minus its row max, or -|x| for SiLU): Cody-Waite reduction to r in [-ln2/2, ln2/2],
 * degree-6 Taylor, scaled by 2^k through the exponent bits. Only basic float operations: libm's exp may differ
 * between its vector and scalar forms, and this must give one value per input wherever the compiler vectorizes. Below -87 it returns e^-87 (~1.6e-38): negligible beside the max's 1. */
static inline float exp_nonpositive(float x) {
    x = x < -87.0f ? -87.0f : x;
    float kf = x * 1.44269504f + 12582912.0f;  /* round to nearest by the 1.5 * 2^23 trick */
    kf = kf - 12582912.0f;
    float r = x - kf * 0.693145751953125f;
    r = r - kf * 1.428606765330187e-06f;
    float p = 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    int32_t k = (int32_t)kf;
    uint32_t bits = (uint32_t)(k + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return p * scale;
}

#endif
