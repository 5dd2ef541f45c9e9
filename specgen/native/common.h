/* Scalar helpers shared by specgen's native kernels: bfloat16 <-> float32 as torch converts, element access for
 * either dtype. */
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

#endif
