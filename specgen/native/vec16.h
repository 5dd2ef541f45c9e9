/* 16-lane float32 vectors for specgen's native kernels: GCC/Clang vector types, one fused multiply-add kind per
 * build (AVX-512, else two AVX2 halves, else two roundings), and an unaligned load. */
#ifndef SPECGEN_VEC16_H
#define SPECGEN_VEC16_H

#include <stdint.h>
#include <string.h>

#define LANES 16
typedef float v16f __attribute__((vector_size(64)));  /* GCC/Clang vectors: lane-wise IEEE ops on any x86 */
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));

#if defined(__AVX512F__)
#include <immintrin.h>
/* a * b + c rounded once (one instruction kind per build: the same arithmetic for every lane, key and query) */
static inline v16f fma16(v16f a, v16f b, v16f c) { return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#elif defined(__FMA__)
#include <immintrin.h>
static inline v16f fma16(v16f a, v16f b, v16f c) {
    __m256 x[2], y[2], z[2], r[2];
    memcpy(x, &a, sizeof x), memcpy(y, &b, sizeof y), memcpy(z, &c, sizeof z);
    for (int i = 0; i < 2; i++) r[i] = _mm256_fmadd_ps(x[i], y[i], z[i]);
    v16f out;
    memcpy(&out, r, sizeof out);
    return out;
}
#else
static inline v16f fma16(v16f a, v16f b, v16f c) { return a * b + c; }  /* -ffp-contract=off: two roundings */
#endif

/* An unaligned 16-float load */
static inline v16f ld(const float *p) {
    v16f x;
    memcpy(&x, p, sizeof x);
    return x;
}

#endif
