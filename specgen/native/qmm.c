/* Products over int4 / int8 weight codes with 15-bit activations in two int8 bytes (specgen/native/__init__.py loads
 * it; the torch side is specgen/native/ops.py: the qmm op and `pack_codes`, the layout).
 *
 * out[m, n] = sum_k x[m, k] * w[n, k], w[n, k] = (c[n, k] - o) * s[n, g] + z[n, g] over groups g of `group` inputs:
 * bits 4: codes c in 0..15, o = 8, s and z bfloat16 (models/quantize.py's int4); bits 8: codes in -127..127, o = 0,
 * one s per output, no z (its int8). Each row of x is quantized alone, per block of 32 inputs, to 15 bits in two
 * bytes: d = max|x| / (127 * 128), Q = round-half-even(x / d) = 128 q + r with q in -127..127, r in -64..63 (a grid
 * finer than bfloat16's near the block's largest values; one byte cost NLL on reference code). Then, per output,
 *     acc = 0; per block b in order: acc = fma((float) dot_b, s[g(b)] * d_b, acc), dot_b = sum (c - o) * Q exactly
 *     (int32: 128 * sum c q + sum c r - o * sum Q); after a group's last block (bits 4): acc = fma(z[g], xs_g, acc),
 *     xs_g = the group's x summed in 16 lanes (lane l: inputs l, l + 16, ... in order), the lanes by a fixed tree;
 *     out = acc rounded to x's dtype.
 * Invariant: that sequence is the same for every row count, row position, thread count and instruction set (the
 * integer sums are exact, the float steps the same IEEE operations lane by lane): a row's result depends on its own
 * input only, so a token scored in a verify forward gets the numbers of its AR step, on AVX-512 VNNI, AVX2 or plain C.
 *
 * Why: torch's int4 CPU product converts every weight to float for every row, so a 5-row verify's products cost
 * ~2x an AR step's. Here the codes are unpacked once per 16 outputs x 32 inputs and multiplied for every row (as bytes
 * with AVX-512 VNNI, as int16 with AVX2): a decode step stays a pass over the weight bytes up to several rows.
 *
 * Layout (`pack_codes`): outputs in tiles of 16 (zero codes and scales past N), each tile's blocks in order.
 * bits 4: a block is 4 chunks of 64 bytes; byte 4j + i of chunk h holds, for output j of the tile, the code of input
 *   8h + i in its low nibble and of input 8h + 4 + i in its high one (i < 4).
 * bits 8: a block is 8 chunks of 64 bytes; byte 4j + i of chunk p is output j's code of input 4p + i.
 * So chunk operand p (p < 8) always covers inputs 4p .. 4p + 3 of the block, 4 bytes per output lane.
 * Scales sz [tiles, groups, 2 (s, z) or 1 (s), 16] bfloat16.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"

#define TN 16   /* outputs per tile */
#define BK 32   /* inputs per activation block */
#define QMAX (127 * 128) /* the largest |Q| */
#define LANES 16
/* bytes ahead of the block being read that each block's loads prefetch: the hardware prefetchers alone left a 1-5 row
 * pass over an int4 model's layers 8-20% slower (scripts/quantized_kernels.py) */
#define PREFETCH 4096

typedef struct {
    const int8_t *q;  /* [M, K] activation codes: the high byte q of Q */
    const int8_t *r;  /* [M, K] the low byte r of Q */
    const int16_t *Q; /* [M, K] Q itself (the AVX2 products' operand: `WIDE_Q`) */
    const float *d;   /* [M, K / BK] block scales */
    const int32_t *sq; /* [M, K / BK] sums of the block's Q */
    const float *xs;  /* [M, groups] sums of x per group (bits 4) */
} acts;

static inline int32_t word(const int8_t *p) {
    int32_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* MR: rows computed together (a block's weights are unpacked once for them); as many as the registers hold */
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
#include <immintrin.h>
#define MR 8

static inline __m512 bf16x16(const uint16_t *p) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(_mm256_loadu_si256((const void *)p)), 16));
}

/* rows [0, R) of one tile: see the header for the arithmetic */
static inline __attribute__((always_inline)) void tile_rows(const acts *a, int m0, const uint8_t *codes,
                                                            const uint16_t *sz, int bits, int K, int group,
                                                            float out[MR][TN], int R) {
    int nb = K / BK, per_group = group / BK, ps = bits == 4 ? 2 : 1;
    const __m512i low = _mm512_set1_epi8(0x0F), flip = _mm512_set1_epi8((char)0x80);
    /* vpdpbusd takes unsigned bytes: bits 8 multiplies c + 128, so dot = sum (c + 128) Q - 128 sum Q */
    const int32_t off = bits == 4 ? 8 : 128;
    __m512 acc[MR];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) acc[r] = _mm512_setzero_ps();
    for (int g = 0, b = 0; g < K / group; g++) {
        __m512 s = bf16x16(sz + ((int64_t)g * ps) * TN);
        for (int end = b + per_group; b < end; b++) {
            __m512i w[8];
            if (bits == 4) {
                const uint8_t *blk = codes + (int64_t)b * 256;
#pragma GCC unroll 4
                for (int h = 0; h < 4; h++) {
                    _mm_prefetch((const char *)(blk + 64 * h + PREFETCH), _MM_HINT_T0);
                    __m512i v = _mm512_loadu_si512((const void *)(blk + 64 * h));
                    w[2 * h] = _mm512_and_si512(v, low);
                    w[2 * h + 1] = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
                }
            } else {
                const uint8_t *blk = codes + (int64_t)b * 512;
#pragma GCC unroll 8
                for (int p = 0; p < 8; p++) {
                    _mm_prefetch((const char *)(blk + 64 * p + PREFETCH), _MM_HINT_T0);
                    w[p] = _mm512_xor_si512(_mm512_loadu_si512((const void *)(blk + 64 * p)), flip);
                }
            }
#pragma GCC unroll 8
            for (int r = 0; r < R; r++) {
                int64_t row = (int64_t)(m0 + r);
                const int8_t *q = a->q + row * K + (int64_t)b * BK, *lo = a->r + row * K + (int64_t)b * BK;
                /* four independent chains (exact integer sums: any grouping gives the same dot) */
                __m512i hi0 = _mm512_setzero_si512(), hi1 = hi0, lo1 = hi0;
                __m512i lo0 = _mm512_set1_epi32(-off * a->sq[row * nb + b]);
#pragma GCC unroll 4
                for (int p = 0; p < 8; p += 2) {
                    hi0 = _mm512_dpbusd_epi32(hi0, w[p], _mm512_set1_epi32(word(q + 4 * p)));
                    hi1 = _mm512_dpbusd_epi32(hi1, w[p + 1], _mm512_set1_epi32(word(q + 4 * p + 4)));
                    lo0 = _mm512_dpbusd_epi32(lo0, w[p], _mm512_set1_epi32(word(lo + 4 * p)));
                    lo1 = _mm512_dpbusd_epi32(lo1, w[p + 1], _mm512_set1_epi32(word(lo + 4 * p + 4)));
                }
                __m512i dot = _mm512_add_epi32(_mm512_slli_epi32(_mm512_add_epi32(hi0, hi1), 7),
                                               _mm512_add_epi32(lo0, lo1));
                __m512 u = _mm512_mul_ps(s, _mm512_set1_ps(a->d[row * nb + b]));
                acc[r] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(dot), u, acc[r]);
            }
        }
        if (bits == 4) {
            __m512 z = bf16x16(sz + ((int64_t)g * ps + 1) * TN);
            int groups = K / group;
#pragma GCC unroll 8
            for (int r = 0; r < R; r++)
                acc[r] = _mm512_fmadd_ps(z, _mm512_set1_ps(a->xs[(int64_t)(m0 + r) * groups + g]), acc[r]);
        }
    }
#pragma GCC unroll 8
    for (int r = 0; r < R; r++) _mm512_storeu_ps(out[r], acc[r]);
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define MR 4
#define WIDE_Q

static inline __m256 bf16x8(const uint16_t *p) {
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm_loadu_si128((const void *)p)), 16));
}

/* 8 lanes of outputs o0..o7 to the order a block's pair sums leave them in, o0 o1 o4 o5 o2 o3 o6 o7, and back (it
 * swaps the middle 64-bit pairs); the float steps are lane by lane, so the order changes no bits */
static inline __m256 pair_order(__m256 v) {
    return _mm256_castpd_ps(_mm256_permute4x64_pd(_mm256_castps_pd(v), 0xD8));
}

static inline int64_t qword(const int16_t *p) {
    int64_t v;
    memcpy(&v, p, sizeof v);
    return v;
}

/* rows [0, R): the pair sums of operand p (w0: outputs 0-3, w1: outputs 4-7, each output's codes of inputs
 * 4p .. 4p + 3 as int16) times each row's Q of those inputs (x: row 0's, rows `stride` apart) */
static inline __attribute__((always_inline)) void madd_rows(const int16_t *x, int64_t stride, __m256i w0, __m256i w1,
                                                            __m256i lo[MR], __m256i hi[MR], int R) {
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        __m256i q = _mm256_set1_epi64x(qword(x + r * stride));
        lo[r] = _mm256_add_epi32(lo[r], _mm256_madd_epi16(w0, q));
        hi[r] = _mm256_add_epi32(hi[r], _mm256_madd_epi16(w1, q));
    }
}

/* as the AVX-512 loop in 8-output halves (chunk bytes 0-31: outputs 0-7, 32-63: 8-15), the products as int16 pairs:
 * the codes widened to 16 bits once per block for every row, times Q itself (vpmaddwd: two products summed in
 * int32, exact). One integer multiply per 16 products: Zen 3 issues one a cycle, and the two bytes of Q through
 * maddubs took four (each row past the first 1.6x longer: docs/results/text.md). Lanes: w0's int16 are o0's 4
 * codes, o1's, o2's, o3's; a madd leaves o0 (inputs 0-1), o0 (2-3), o1, o1 | o2, o2, o3, o3, and hadd of the two
 * halves' sums o0 o1 o4 o5 | o2 o3 o6 o7 (`pair_order`). */
static inline __attribute__((always_inline)) void tile_rows(const acts *a, int m0, const uint8_t *codes,
                                                            const uint16_t *sz, int bits, int K, int group,
                                                            float out[MR][TN], int R) {
    int nb = K / BK, per_group = group / BK, ps = bits == 4 ? 2 : 1;
    const __m256i nibble = _mm256_set1_epi16(0x0F);
    const int32_t off = bits == 4 ? 8 : 0;
    __m256 acc[MR][2];
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    /* halves per pass: both for one or two rows, whose Q is then broadcast once for both (docs/results/text.md: the
     * AVX2 kind), one at a time for more rows (four accumulators a row would spill). The lanes' steps are the same */
    const int H = R <= 2 ? 2 : 1;
    for (int g = 0, b0 = 0; g < K / group; g++, b0 += per_group) {
        for (int h0 = 0; h0 < 2; h0 += H) {
            __m256 s[2];
#pragma GCC unroll 2
            for (int j = 0; j < H; j++) s[j] = pair_order(bf16x8(sz + ((int64_t)g * ps) * TN + 8 * (h0 + j)));
            for (int b = b0; b < b0 + per_group; b++) {
                const int16_t *x = a->Q + (int64_t)m0 * K + (int64_t)b * BK;
                __m256i lo[2][MR], hi[2][MR];
#pragma GCC unroll 2
                for (int j = 0; j < H; j++)
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++) lo[j][r] = hi[j][r] = _mm256_setzero_si256();
                if (bits == 4) {
                    const uint8_t *blk = codes + (int64_t)b * 256 + 32 * h0;
#pragma GCC unroll 1  /* unrolled, the four chunks' operands spill: 4 rows 1.37x slower */
                    for (int h = 0; h < 4; h++) {  /* chunk h: operands 2h (low nibbles) and 2h + 1 (high) */
                        _mm_prefetch((const char *)(blk + 64 * h + PREFETCH), _MM_HINT_T0);
#pragma GCC unroll 2
                        for (int j = 0; j < H; j++) {
                            const uint8_t *c = blk + 64 * h + 32 * j;
                            __m256i w0 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)c));
                            __m256i w1 = _mm256_cvtepu8_epi16(_mm_loadu_si128((const void *)(c + 16)));
                            madd_rows(x + 8 * h, K, _mm256_and_si256(w0, nibble), _mm256_and_si256(w1, nibble),
                                      lo[j], hi[j], R);
                            madd_rows(x + 8 * h + 4, K, _mm256_srli_epi16(w0, 4), _mm256_srli_epi16(w1, 4), lo[j],
                                      hi[j], R);
                        }
                    }
                } else {
                    const uint8_t *blk = codes + (int64_t)b * 512 + 32 * h0;
#pragma GCC unroll 8
                    for (int p = 0; p < 8; p++) {
                        _mm_prefetch((const char *)(blk + 64 * p + PREFETCH), _MM_HINT_T0);
#pragma GCC unroll 2
                        for (int j = 0; j < H; j++) {
                            const uint8_t *c = blk + 64 * p + 32 * j;
                            madd_rows(x + 4 * p, K, _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)c)),
                                      _mm256_cvtepi8_epi16(_mm_loadu_si128((const void *)(c + 16))), lo[j], hi[j], R);
                        }
                    }
                }
#pragma GCC unroll 4
                for (int r = 0; r < R; r++) {
                    int64_t row = (int64_t)(m0 + r);
                    __m256i o = _mm256_set1_epi32(-off * a->sq[row * nb + b]);
                    __m256 d = _mm256_set1_ps(a->d[row * nb + b]);
#pragma GCC unroll 2
                    for (int j = 0; j < H; j++) {
                        __m256i dot = _mm256_add_epi32(_mm256_hadd_epi32(lo[j][r], hi[j][r]), o);
                        acc[r][h0 + j] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(dot), _mm256_mul_ps(s[j], d),
                                                         acc[r][h0 + j]);
                    }
                }
            }
            if (bits == 4) {
                int groups = K / group;
#pragma GCC unroll 2
                for (int j = 0; j < H; j++) {
                    __m256 z = pair_order(bf16x8(sz + ((int64_t)g * ps + 1) * TN + 8 * (h0 + j)));
#pragma GCC unroll 4
                    for (int r = 0; r < R; r++)
                        acc[r][h0 + j] = _mm256_fmadd_ps(z, _mm256_set1_ps(a->xs[(int64_t)(m0 + r) * groups + g]),
                                                         acc[r][h0 + j]);
                }
            }
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < R; r++) {
        _mm256_storeu_ps(out[r], pair_order(acc[r][0]));
        _mm256_storeu_ps(out[r] + 8, pair_order(acc[r][1]));
    }
}

#else
#define MR 4

/* the reference form: the same integers and float steps, one output at a time (-ffp-contract=off: fmaf is the only
 * fused step) */
static void tile_rows(const acts *a, int m0, const uint8_t *codes, const uint16_t *sz, int bits, int K, int group,
                      float out[MR][TN], int R) {
    int nb = K / BK, per_group = group / BK, ps = bits == 4 ? 2 : 1, groups = K / group;
    for (int r = 0; r < R; r++) {
        int64_t row = (int64_t)(m0 + r);
        for (int j = 0; j < TN; j++) {
            float acc = 0.0f;
            for (int b = 0; b < nb; b++) {
                int g = b / per_group;
                const int8_t *q = a->q + row * K + (int64_t)b * BK, *lo = a->r + row * K + (int64_t)b * BK;
                int32_t dot = 0;
                for (int p = 0; p < 8; p++)
                    for (int i = 0; i < 4; i++) {
                        int64_t at = bits == 4 ? (int64_t)b * 256 + 64 * (p / 2) + 4 * j + i
                                               : (int64_t)b * 512 + 64 * p + 4 * j + i;
                        int c = bits == 4 ? ((codes[at] >> (4 * (p % 2))) & 15) - 8 : (int8_t)codes[at];
                        dot += c * (128 * q[4 * p + i] + lo[4 * p + i]);
                    }
                float u = bf16_to_f32(sz[((int64_t)g * ps) * TN + j]) * a->d[row * nb + b];
                acc = fmaf((float)dot, u, acc);
                if (bits == 4 && (b + 1) % per_group == 0)
                    acc = fmaf(bf16_to_f32(sz[((int64_t)g * ps + 1) * TN + j]), a->xs[row * groups + g], acc);
            }
            out[r][j] = acc;
        }
    }
}
#endif

/* one block of 32 activations into Q = 128 q + r (the header's rules), its scale d and the sum of its Q: in each
 * path the same exact steps (max, one IEEE product, rounding half to even as nearbyintf, integer splits) */
#if defined(__AVX512F__) && defined(__AVX512BW__)
static inline void quantize_block(const float *v, int8_t *q, int8_t *r, float *d, int32_t *sq) {
    __m512 a0 = _mm512_loadu_ps(v), a1 = _mm512_loadu_ps(v + 16);
    float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(a0), _mm512_abs_ps(a1)));
    __m512 inv = _mm512_set1_ps(amax > 0.0f ? QMAX / amax : 0.0f);
    __m512i top = _mm512_set1_epi32(QMAX), bottom = _mm512_set1_epi32(-QMAX), half = _mm512_set1_epi32(64);
    __m512i c0 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a0, inv)), bottom), top);
    __m512i c1 = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(_mm512_mul_ps(a1, inv)), bottom), top);
    __m512i h0 = _mm512_srai_epi32(_mm512_add_epi32(c0, half), 7);
    __m512i h1 = _mm512_srai_epi32(_mm512_add_epi32(c1, half), 7);
    _mm_storeu_si128((void *)q, _mm512_cvtepi32_epi8(h0));
    _mm_storeu_si128((void *)(q + 16), _mm512_cvtepi32_epi8(h1));
    _mm_storeu_si128((void *)r, _mm512_cvtepi32_epi8(_mm512_sub_epi32(c0, _mm512_slli_epi32(h0, 7))));
    _mm_storeu_si128((void *)(r + 16), _mm512_cvtepi32_epi8(_mm512_sub_epi32(c1, _mm512_slli_epi32(h1, 7))));
    *d = amax / QMAX;
    *sq = _mm512_reduce_add_epi32(_mm512_add_epi32(c0, c1));
}
#elif defined(__AVX2__)
/* 32 int32 in four vectors -> 32 int8 in order (saturating packs interleave 128-bit lanes; the permute restores) */
static inline void store_bytes(int8_t *dst, __m256i a, __m256i b, __m256i c, __m256i e) {
    __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, e));
    _mm256_storeu_si256((void *)dst, _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
}

static inline void quantize_block(const float *v, int8_t *q, int8_t *r, float *d, int32_t *sq) {
    const __m256 sign = _mm256_set1_ps(-0.0f);
    __m256 a[4], m = _mm256_setzero_ps();
    for (int i = 0; i < 4; i++) {
        a[i] = _mm256_loadu_ps(v + 8 * i);
        m = _mm256_max_ps(m, _mm256_andnot_ps(sign, a[i]));
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    __m256 inv = _mm256_set1_ps(amax > 0.0f ? QMAX / amax : 0.0f);
    __m256i top = _mm256_set1_epi32(QMAX), bottom = _mm256_set1_epi32(-QMAX), half = _mm256_set1_epi32(64);
    __m256i c[4], h[4], lo[4], sum = _mm256_setzero_si256();
    for (int i = 0; i < 4; i++) {
        c[i] = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(_mm256_mul_ps(a[i], inv)), bottom), top);
        h[i] = _mm256_srai_epi32(_mm256_add_epi32(c[i], half), 7);
        lo[i] = _mm256_sub_epi32(c[i], _mm256_slli_epi32(h[i], 7));
        sum = _mm256_add_epi32(sum, c[i]);
    }
    store_bytes(q, h[0], h[1], h[2], h[3]);
    store_bytes(r, lo[0], lo[1], lo[2], lo[3]);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    *d = amax / QMAX;
    *sq = _mm_cvtsi128_si32(_mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1)));
}
#else
static inline void quantize_block(const float *v, int8_t *q, int8_t *r, float *d, int32_t *sq) {
    float amax = 0.0f;
    for (int i = 0; i < BK; i++) amax = fmaxf(amax, fabsf(v[i]));
    float inv = amax > 0.0f ? QMAX / amax : 0.0f;
    int32_t sum = 0;
    for (int i = 0; i < BK; i++) {
        float f = fminf(fmaxf(nearbyintf(v[i] * inv), -QMAX), QMAX);
        int c = (int)f, hi = (c + 64) >> 7;  /* floor: c = 128 hi + lo, lo in -64..63 */
        q[i] = (int8_t)hi;
        r[i] = (int8_t)(c - 128 * hi);
        sum += c;
    }
    *d = amax / QMAX;
    *sq = sum;
}
#endif

/* one row of x into its blocks' Q (as q, r), scales d and sums of Q, and per-group sums of x (the header's rules);
 * v: float scratch [K]. xs is summed in 16 independent lanes (its fixed order) so the compiler vectorizes it. Where
 * the products read Q as int16 (`WIDE_Q`) it is made from q and r here, not in `quantize_block`: a build picks its
 * quantizer and its products by different flags (AVX-512 without VNNI: the AVX-512 quantizer, the AVX2 products). */
static void quantize_row(const void *x, int es, int K, int group, int8_t *q, int8_t *r, int16_t *Q, float *d,
                         int32_t *sq, float *xs, float *v) {
    if (es == 4)
        memcpy(v, x, sizeof(float) * (size_t)K);
    else
        for (int k = 0; k < K; k++) v[k] = bf16_to_f32(((const uint16_t *)x)[k]);
    for (int b = 0; b < K / BK; b++) quantize_block(v + (int64_t)b * BK, q + b * BK, r + b * BK, d + b, sq + b);
#ifdef WIDE_Q
    for (int k = 0; k < K; k++) Q[k] = (int16_t)(128 * q[k] + r[k]);
#else
    (void)Q;
#endif
    for (int g = 0; g < K / group; g++) {
        float acc[LANES] = {0};
        for (int i = 0; i < group; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] = acc[l] + v[(int64_t)g * group + i + l];
        for (int w = LANES / 2; w > 0; w /= 2)
            for (int l = 0; l < w; l++) acc[l] = acc[l] + acc[l + w];
        xs[g] = acc[0];
    }
}

#if MR > 4
#define MORE_ROWS(B)                                                         \
    case 4: tile_rows(&a, m, tc, ts, B, K, group, rows, 4); break;          \
    case 5: tile_rows(&a, m, tc, ts, B, K, group, rows, 5); break;          \
    case 6: tile_rows(&a, m, tc, ts, B, K, group, rows, 6); break;          \
    case 7: tile_rows(&a, m, tc, ts, B, K, group, rows, 7); break;
#else
#define MORE_ROWS(B)
#endif

/* out [M, N] (x's dtype: es 2 bfloat16, 4 float32) = x [M, K] @ w^T over `pack_codes`' codes and sz; K a multiple
 * of 32 and of `group`, `group` a multiple of 32 (bits 8: group = K). Returns 0, or -1 without scratch memory.
 * Threads: as tiled.c (OpenMP over tiles where built with it; each output computed whole by one thread). */
#define PARALLEL_MIN (1 << 16)
int specgen_qmm(const void *x, int es, const uint8_t *codes, const uint16_t *sz, int bits, int group, void *out, int M,
                int K, int N, int threads) {
    int nb = K / BK, groups = K / group, n_tiles = (N + TN - 1) / TN;
    int64_t tile_bytes = (int64_t)nb * (bits == 4 ? 256 : 512), tile_sz = (int64_t)groups * (bits == 4 ? 2 : 1) * TN;
    char *scratch = malloc((size_t)K * 4 + (size_t)M * K * 4 + (size_t)M * nb * 8 + (size_t)M * groups * 4 + 64);
    if (!scratch) return -1;
    acts a;
    float *v = (float *)scratch, *d = v + K, *xs = d + (size_t)M * nb;
    int32_t *sq = (int32_t *)(xs + (size_t)M * groups);
    int16_t *Q = (int16_t *)(sq + (size_t)M * nb);
    int8_t *q = (int8_t *)(Q + (size_t)M * K), *r = q + (size_t)M * K;
    for (int m = 0; m < M; m++)
        quantize_row(AT(x, (int64_t)m * K), es, K, group, q + (int64_t)m * K, r + (int64_t)m * K, Q + (int64_t)m * K,
                     d + (int64_t)m * nb, sq + (int64_t)m * nb, xs + (int64_t)m * groups, v);
    a.q = q, a.r = r, a.Q = Q, a.d = d, a.sq = sq, a.xs = xs;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if ((int64_t)M * K * N >= PARALLEL_MIN && n_tiles > 1 && threads > 1)
    for (int t = 0; t < n_tiles; t++) {
        const uint8_t *tc = codes + t * tile_bytes;
        const uint16_t *ts = sz + t * tile_sz;
        int n0 = t * TN, cols = N - n0 < TN ? N - n0 : TN;
        for (int m = 0; m < M; m += MR) {
            float rows[MR][TN];
            int R = M - m < MR ? M - m : MR;
            /* bits and R constants in each call: the loops over rows unroll and the bits tests fold */
#define ROWS(B)                                                              \
    switch (R) {                                                             \
        case 1: tile_rows(&a, m, tc, ts, B, K, group, rows, 1); break;      \
        case 2: tile_rows(&a, m, tc, ts, B, K, group, rows, 2); break;      \
        case 3: tile_rows(&a, m, tc, ts, B, K, group, rows, 3); break;      \
        MORE_ROWS(B)                                                         \
        default: tile_rows(&a, m, tc, ts, B, K, group, rows, MR); break;    \
    }
            if (bits == 4) {
                ROWS(4)
            } else {
                ROWS(8)
            }
            for (int r = 0; r < MR && m + r < M; r++)
                for (int j = 0; j < cols; j++) store(out, (int64_t)(m + r) * N + n0 + j, rows[r][j], es);
        }
    }
    free(scratch);
    return 0;
}

/* which instruction path this build runs: 0 plain C, 1 AVX2, 2 AVX-512 VNNI (for machine labels) */
int specgen_qmm_path(void) {
#if defined(__AVX512VNNI__) && defined(__AVX512BW__)
    return 2;
#elif defined(__AVX2__) && defined(__FMA__)
    return 1;
#else
    return 0;
#endif
}
