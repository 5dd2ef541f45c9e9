/* 16-lane float32 vectors for specgen's native attention: one fused multiply-add kind per build and a small set of
 * operations, in two representations with the same arithmetic lane by lane:
 * - AVX2 + FMA without AVX-512: a struct of two 8-lane ymm halves. GCC's own 64-byte vectors there were split into
 *   xmm pieces and scalars through the stack on every operation (attention ran 2-10x slower than torch's);
 * - elsewhere GCC/Clang vector types (AVX-512: one zmm register; no FMA: a * b + c rounded twice).
 * Every operation is lane-wise IEEE float32 (0 + x in vzplus keeps its -0 -> +0, as the vector form did). */
#ifndef SPECGEN_VEC16_H
#define SPECGEN_VEC16_H

#include <stdint.h>
#include <string.h>

#define LANES 16

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>
typedef struct {
    __m256 lo, hi;  /* lanes 0-7, 8-15 */
} v16f;
static inline v16f v2(__m256 lo, __m256 hi) {
    v16f r = {lo, hi};
    return r;
}
static inline v16f fma16(v16f a, v16f b, v16f c) {
    return v2(_mm256_fmadd_ps(a.lo, b.lo, c.lo), _mm256_fmadd_ps(a.hi, b.hi, c.hi));
}
static inline v16f vzero(void) { return v2(_mm256_setzero_ps(), _mm256_setzero_ps()); }
static inline v16f vadd(v16f a, v16f b) { return v2(_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)); }
static inline v16f vmul(v16f a, v16f b) { return v2(_mm256_mul_ps(a.lo, b.lo), _mm256_mul_ps(a.hi, b.hi)); }
static inline v16f vscale(v16f a, float s) { return vmul(a, v2(_mm256_set1_ps(s), _mm256_set1_ps(s))); }
static inline v16f vdiv1(v16f a, float s) {
    __m256 k = _mm256_set1_ps(s);
    return v2(_mm256_div_ps(a.lo, k), _mm256_div_ps(a.hi, k));
}
static inline v16f vzplus(float x) {  /* 0 + x in every lane */
    __m256 v = _mm256_add_ps(_mm256_setzero_ps(), _mm256_set1_ps(x));
    return v2(v, v);
}
static inline v16f vmaxkeep(v16f top, v16f x) {  /* x where x > top (ordered), else top */
    return v2(_mm256_blendv_ps(top.lo, x.lo, _mm256_cmp_ps(x.lo, top.lo, _CMP_GT_OQ)),
              _mm256_blendv_ps(top.hi, x.hi, _mm256_cmp_ps(x.hi, top.hi, _CMP_GT_OQ)));
}
static inline v16f ld(const float *p) { return v2(_mm256_loadu_ps(p), _mm256_loadu_ps(p + 8)); }
static inline v16f ld_bf16(const uint16_t *p) {  /* 16 bfloat16 values widened to float32 exactly */
    __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)p)), 16);
    __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const __m128i *)(p + 8))), 16);
    return v2(_mm256_castsi256_ps(lo), _mm256_castsi256_ps(hi));
}
/* a's 16 lanes summed by the tree of transpose_sum (attention.c): l + 8, then + 4, then (0 + 2) + (1 + 3) */
static inline float tree_sum(v16f a) {
    __m256 s8 = _mm256_add_ps(a.lo, a.hi);
    __m128 s4 = _mm_add_ps(_mm256_castps256_ps128(s8), _mm256_extractf128_ps(s8, 1));
    __m128 s2 = _mm_add_ps(s4, _mm_movehl_ps(s4, s4));
    return _mm_cvtss_f32(_mm_add_ss(s2, _mm_shuffle_ps(s2, s2, 1)));
}
#define VEC16_HALVES 1
#else
typedef float v16f __attribute__((vector_size(64)));  /* GCC/Clang vectors: lane-wise IEEE ops on any CPU */
typedef uint16_t v16h __attribute__((vector_size(32)));
typedef uint32_t v16u __attribute__((vector_size(64)));
#if defined(__AVX512F__)
#include <immintrin.h>
/* a * b + c rounded once (one instruction kind per build: the same arithmetic for every lane, key and query) */
static inline v16f fma16(v16f a, v16f b, v16f c) { return (v16f)_mm512_fmadd_ps((__m512)a, (__m512)b, (__m512)c); }
#else
static inline v16f fma16(v16f a, v16f b, v16f c) { return a * b + c; }  /* -ffp-contract=off: two roundings */
#endif
static inline v16f vzero(void) { return (v16f){0}; }
static inline v16f vadd(v16f a, v16f b) { return a + b; }
static inline v16f vmul(v16f a, v16f b) { return a * b; }
static inline v16f vscale(v16f a, float s) { return a * s; }
static inline v16f vdiv1(v16f a, float s) { return a / s; }
static inline v16f vzplus(float x) { return (v16f){0} + x; }
static inline v16f vmaxkeep(v16f top, v16f x) {
    v16u gt = (v16u)(x > top);
    return (v16f)(((v16u)x & gt) | ((v16u)top & ~gt));
}
static inline v16f ld(const float *p) {  /* an unaligned 16-float load */
    v16f x;
    memcpy(&x, p, sizeof x);
    return x;
}
static inline v16f ld_bf16(const uint16_t *p) {
    v16h h;
    memcpy(&h, p, sizeof h);
    v16u u = __builtin_convertvector(h, v16u) << 16;
    v16f f;
    memcpy(&f, &u, sizeof f);
    return f;
}
#define VEC16_HALVES 0
#endif

#endif
