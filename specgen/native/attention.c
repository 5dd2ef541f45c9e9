/* Width-invariant softmax attention over bfloat16 or float32 queries, keys and values (specgen/native/__init__.py
 * loads it).
 *
 * A query's visible slots come as a list in ascending slot order (`idx`, `count`), which is the order AR stores
 * the same keys in: its committed prefix, then its ancestors. Every number a query gets is a fixed function of its
 * own q, that list's keys and values, and the list's length: nothing depends on the other queries, the forward's
 * width, the batch, or where in the cache the keys sit. So a token scored in a verify forward or a draft tree gets
 * exactly its AR step's result, bit for bit (tests/models/test_attention.py).
 *
 * Work goes one (batch row, kv head) at a time, with all its queries' G heads as rows: the list entries every query
 * shares (the committed prefix) are read once, 16 keys or values at a time, for all rows, and the rest of each
 * list once for its query's G heads. Sharing a read changes no number: a score depends on its q and key alone, and
 * each row's sums run in its own list order.
 *
 * Arithmetic (all float32): q is scaled by 1/sqrt(D) first; a score is a dot product over D in 16 lanes (lane l
 * adds d = l, l + 16, ... in order, with fma16) summed by a fixed tree; p = exp(score - max) with a polynomial exp
 * (libm's may differ between its vector and scalar forms); the softmax sum is 16 lanes over the list index, summed
 * by the same tree; the values are accumulated in list order. Built with -ffp-contract=off so the compiler fuses
 * nothing this text does not say. A query that sees no key gets zeros.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common.h"
#include "vec16.h"

/* a row of d values (es = 2: bfloat16, 4: float32) as float32 vectors, zero past d (zeros add exact zeros to every
 * sum below) */
static inline void load_row(const void *src, int es, int d, v16f *dst) {
    int e = 0;
    if (es == 4) {
        for (; e + LANES <= d; e += LANES) memcpy(&dst[e / LANES], (const float *)src + e, sizeof(v16f));
    } else {
        for (; e + LANES <= d; e += LANES) dst[e / LANES] = ld_bf16((const uint16_t *)src + e);
    }
    if (e < d) {
        float tail[LANES] = {0};
        for (int l = 0; e + l < d; l++) tail[l] = load1(src, e + l, es);
        memcpy(&dst[e / LANES], tail, sizeof tail);
    }
}

/* e^x for x <= 0 (a score minus its row max), EXP_LANES at a time: Cody-Waite reduction to r in [-ln2/2, ln2/2],
 * degree-6 Taylor, scaled by 2^k through the exponent bits. Only basic float operations, lane by lane (libm's exp may
 * differ between its vector and scalar forms; this gives one value per input in any lane and any build). Below -87
 * it returns e^-87 (~1.6e-38): negligible beside the max's 1. GCC vectors of the register width (zmm with AVX-512,
 * else ymm): GCC left a scalar loop of this unvectorized on AVX2, where it was ~45% of a 17-query tree's attention
 * (perf). */
#if defined(__AVX512F__)
#define EXP_LANES 16
#else
#define EXP_LANES 8
#endif
typedef float vexpf __attribute__((vector_size(4 * EXP_LANES)));
typedef int32_t vexpi __attribute__((vector_size(4 * EXP_LANES)));
static inline vexpf exp_nonpositive(vexpf x) {
    const vexpf floor87 = (vexpf){0} - 87.0f;
    vexpi below = x < floor87;  /* all ones where x < -87 */
    x = (vexpf)(((vexpi)x & ~below) | ((vexpi)floor87 & below));
    vexpf kf = x * 1.44269504f + 12582912.0f;  /* round to nearest by the 1.5 * 2^23 trick */
    kf = kf - 12582912.0f;
    vexpf r = x - kf * 0.693145751953125f;
    r = r - kf * 1.428606765330187e-06f;
    vexpf p = (vexpf){0} + 1.0f / 720.0f;
    p = p * r + 1.0f / 120.0f;
    p = p * r + 1.0f / 24.0f;
    p = p * r + 1.0f / 6.0f;
    p = p * r + 0.5f;
    p = p * r + 1.0f;
    p = p * r + 1.0f;
    vexpi bits = (__builtin_convertvector(kf, vexpi) + 127) << 23;  /* kf is an integer in [-126, 0] here */
    return p * (vexpf)bits;
}

/* s[i] = e^(s[i] - top) for i < n (s[i] <= top); a last partial vector through a zero-padded copy */
static inline void exp_shifted(float *s, int n, float top) {
    vexpf x;
    int i = 0;
    for (; i + EXP_LANES <= n; i += EXP_LANES) {
        memcpy(&x, s + i, sizeof x);
        x = exp_nonpositive(x - top);
        memcpy(s + i, &x, sizeof x);
    }
    if (i < n) {
        float lanes[EXP_LANES] = {0};
        memcpy(lanes, s + i, sizeof(float) * (n - i));
        memcpy(&x, lanes, sizeof x);
        x = exp_nonpositive(x - top);
        memcpy(s + i, &x, sizeof(float) * (n - i));
    }
}

#if VEC16_HALVES
static inline float lane_sum(v16f a) { return tree_sum(a); }  /* transpose_sum's tree (vec16.h) */
#else
/* Lane i of the result: the 16 lanes of a[i] summed by a fixed tree (l + 8, then + 4, then (0 + 2) + (1 + 3)). In
 * ymm halves the same tree is vec16.h's tree_sum (one vector) and tree_sum8 below (eight keys' scores). */
static inline v16f transpose_sum(const v16f *a) {
    v16f t[8], u[4], w[2];
    for (int p = 0; p < 8; p++)
        t[p] = __builtin_shufflevector(a[2 * p], a[2 * p + 1], 0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23)
             + __builtin_shufflevector(a[2 * p], a[2 * p + 1], 8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29,
                                       30, 31);
    for (int p = 0; p < 4; p++)
        u[p] = __builtin_shufflevector(t[2 * p], t[2 * p + 1], 0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27)
             + __builtin_shufflevector(t[2 * p], t[2 * p + 1], 4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30,
                                       31);
    for (int p = 0; p < 2; p++)
        w[p] = __builtin_shufflevector(u[2 * p], u[2 * p + 1], 0, 1, 4, 5, 8, 9, 12, 13, 16, 17, 20, 21, 24, 25, 28, 29)
             + __builtin_shufflevector(u[2 * p], u[2 * p + 1], 2, 3, 6, 7, 10, 11, 14, 15, 18, 19, 22, 23, 26, 27, 30,
                                       31);
    return __builtin_shufflevector(w[0], w[1], 0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30)
         + __builtin_shufflevector(w[0], w[1], 1, 3, 5, 7, 9, 11, 13, 15, 17, 19, 21, 23, 25, 27, 29, 31);
}

static inline float lane_sum(v16f a) {
    v16f one[LANES] = {a};
    return transpose_sum(one)[0];
}
#endif

/* Rows slots[0 .. m) of a cache layer (slot stride `slot`) as float32 row pointers: straight into the cache when it
 * is float32 and D a multiple of 16 (nothing to convert or pad), else converted into buf [16][blocks]. */
static inline void rows_of(const void *base, int64_t slot, const int32_t *slots, int m, int es, int d, int blocks,
                           v16f *buf, const float **rows) {
    for (int i = 0; i < m; i++) {
        if (es == 4 && d % LANES == 0) {
            rows[i] = (const float *)base + slots[i] * slot;
        } else {
            load_row(AT(base, slots[i] * slot), es, d, buf + i * blocks);
            rows[i] = (const float *)(buf + i * blocks);
        }
    }
}

/* Scores of one query row (its scaled q: qr) against the m <= 16 keys `krows`, stored at dst (16 lanes; past m:
 * scratch). Lane l of a key's dot product adds d = l, l + 16, ... in order and its 16 lanes are summed by
 * transpose_sum's tree, so a score is the same wherever its key sits in a block. */
#if VEC16_HALVES
/* Lane k of the result: tree_sum's last three levels of key k, given s8[k] = its two halves added (the tree's first
 * level): + 4 (the 128-bit halves, two keys a permute), then (0 + 2) + (1 + 3), eight keys at once. The sums and
 * their grouping are tree_sum's; only the order of the operands of an addition moves (exact: a + b == b + a). */
static inline __m256 tree_sum8(const __m256 *s8) {
    __m256 p[4];  /* p[j] = [key j's four partial sums | key j + 4's] */
    for (int j = 0; j < 4; j++)
        p[j] = _mm256_add_ps(_mm256_permute2f128_ps(s8[j], s8[j + 4], 0x20),
                             _mm256_permute2f128_ps(s8[j], s8[j + 4], 0x31));
    /* z01 = [k0: 0+2, 1+3, k1: 0+2, 1+3 | the same of k4, k5]; z23 the same of k2, k3 | k6, k7 */
    __m256 z01 = _mm256_add_ps(_mm256_shuffle_ps(p[0], p[1], 0x44), _mm256_shuffle_ps(p[0], p[1], 0xEE));
    __m256 z23 = _mm256_add_ps(_mm256_shuffle_ps(p[2], p[3], 0x44), _mm256_shuffle_ps(p[2], p[3], 0xEE));
    return _mm256_add_ps(_mm256_shuffle_ps(z01, z23, 0x88), _mm256_shuffle_ps(z01, z23, 0xDD));
}

/* score_row in ymm halves: eight keys at a time, each key's two-half accumulator folded to one ymm as soon as its
 * dot product ends (16 keys of two-half accumulators are 32 registers, twice what AVX2 has: they went through the
 * stack). Each score is tree_sum of the same accumulator, so the bits equal the 16-lane form's. */
static inline __attribute__((always_inline)) void score_row(const v16f *qr, const float **krows, const int m,
                                                            const int blocks, float *dst) {
    for (int k0 = 0; k0 < m; k0 += 8) {  /* lanes past m are scratch: a group with no key is skipped */
        __m256 s8[8];
        for (int i = 0; i < 8; i++) {
            if (k0 + i < m) {
                v16f acc = vmul(qr[0], ld(krows[k0 + i]));
                for (int c = 1; c < blocks; c++) acc = fma16(qr[c], ld(krows[k0 + i] + c * LANES), acc);
                s8[i] = _mm256_add_ps(acc.lo, acc.hi);
            } else {
                s8[i] = _mm256_setzero_ps();
            }
        }
        _mm256_storeu_ps(dst + k0, tree_sum8(s8));
    }
}
#else
static inline __attribute__((always_inline)) void score_row(const v16f *qr, const float **krows, const int m,
                                                            const int blocks, float *dst) {
    v16f acc[LANES];
    for (int i = 0; i < LANES; i++) {
        if (i < m) {
            acc[i] = vmul(qr[0], ld(krows[i]));
            for (int c = 1; c < blocks; c++) acc[i] = fma16(qr[c], ld(krows[i] + c * LANES), acc[i]);
        } else {
            acc[i] = vzero();
        }
    }
    v16f sums = transpose_sum(acc);
    memcpy(dst, &sums, sizeof sums);
}
#endif

/* score_row for rows [r0, r1); a whole block of 16 keys takes a copy with no per-key test */
static inline __attribute__((always_inline)) void score_block(const v16f *qf, int r0, int r1, const float **krows,
                                                              int m, const int blocks, float *sc, int64_t stride,
                                                              int64_t at) {
    if (m == LANES)
        for (int r = r0; r < r1; r++) score_row(qf + r * blocks, krows, LANES, blocks, sc + r * stride + at);
    else
        for (int r = r0; r < r1; r++) score_row(qf + r * blocks, krows, m, blocks, sc + r * stride + at);
}

#if VEC16_HALVES
/* R rows' o[r][c] += p[r][at + i] * v_i[c], i in order, for one 16-lane block c: 2R independent ymm chains held in
 * registers (R = 4: 8 accumulators, the value and 4 broadcasts in AVX2's 16) */
static inline __attribute__((always_inline)) void value_rows(v16f *o, int r, const int R, const float **vrows, int m,
                                                             const int blocks, int c, const float *sc, int64_t stride,
                                                             int64_t at) {
    v16f a[4];
    for (int j = 0; j < R; j++) a[j] = o[(r + j) * blocks + c];
    for (int i = 0; i < m; i++) {
        v16f x = ld(vrows[i] + c * LANES);
        for (int j = 0; j < R; j++) a[j] = fma16(vzplus(sc[(r + j) * stride + at + i]), x, a[j]);
    }
    for (int j = 0; j < R; j++) o[(r + j) * blocks + c] = a[j];
}

/* value_block in ymm halves: one 16-lane block of up to four rows at a time. The arrays of whole rows the form
 * below keeps (2 rows x blocks) lived on the stack here: each FMA waited for a store and a load. Every lane's sum
 * still runs over i in list order, so the bits are the same. */
static inline __attribute__((always_inline)) void value_block(v16f *o, int r0, int r1, const float **vrows, int m,
                                                              const int blocks, const float *sc, int64_t stride,
                                                              int64_t at) {
    int r = r0;
    for (; r + 3 < r1; r += 4)
        for (int c = 0; c < blocks; c++) value_rows(o, r, 4, vrows, m, blocks, c, sc, stride, at);
    for (; r + 1 < r1; r += 2)
        for (int c = 0; c < blocks; c++) value_rows(o, r, 2, vrows, m, blocks, c, sc, stride, at);
    for (; r < r1; r++)
        for (int c = 0; c < blocks; c++) value_rows(o, r, 1, vrows, m, blocks, c, sc, stride, at);
}
#else
/* o[r] += p[r][at + i] * v_i for the m <= 16 value rows `vrows`, i in order, for rows [r0, r1) (one rounding per
 * FMA: each row's sum runs in its list order, whichever rows share the block). Two rows at a time: twice the
 * independent FMA chains, so the FMA latency does not set the pace. */
static inline __attribute__((always_inline)) void value_block(v16f *o, int r0, int r1, const float **vrows, int m,
                                                              const int blocks, const float *sc, int64_t stride,
                                                              int64_t at) {
    int r = r0;
    for (; r + 1 < r1; r += 2) {
        v16f a[blocks], b[blocks];
        for (int c = 0; c < blocks; c++) a[c] = o[r * blocks + c], b[c] = o[(r + 1) * blocks + c];
        const float *pa = sc + r * stride + at, *pb = pa + stride;
        for (int i = 0; i < m; i++)
            for (int c = 0; c < blocks; c++) {
                v16f x = ld(vrows[i] + c * LANES);
                a[c] = fma16(vzplus(pa[i]), x, a[c]);
                b[c] = fma16(vzplus(pb[i]), x, b[c]);
            }
        for (int c = 0; c < blocks; c++) o[r * blocks + c] = a[c], o[(r + 1) * blocks + c] = b[c];
    }
    for (; r < r1; r++) {
        v16f a[blocks];
        for (int c = 0; c < blocks; c++) a[c] = o[r * blocks + c];
        const float *pr = sc + r * stride + at;
        for (int i = 0; i < m; i++)
            for (int c = 0; c < blocks; c++) a[c] = fma16(vzplus(pr[i]), ld(vrows[i] + c * LANES), a[c]);
        for (int c = 0; c < blocks; c++) o[r * blocks + c] = a[c];
    }
}
#endif

/* The row max of s[0 .. n), n >= 1 (exact in any order: a max rounds nothing) */
static inline float row_max(const float *s, int n) {
    v16f top = vzplus(s[0]);
    int i = 0;
    for (; i + LANES <= n; i += LANES) {
        top = vmaxkeep(top, ld(s + i));
    }
    float lanes[LANES], best;
    memcpy(lanes, &top, sizeof lanes);
    best = lanes[0];
    for (int l = 1; l < LANES; l++) best = lanes[l] > best ? lanes[l] : best;
    for (; i < n; i++) best = s[i] > best ? s[i] : best;
    return best;
}

/* The lists' entries 16 at a time, keys (values = 0: score_block) or values (1: value_block): the `shared` leading
 * entries once for all S * G rows, then each query's own rest for its G rows. */
static inline __attribute__((always_inline)) void each_block(
        const int values, const void *base, int64_t slot, const int32_t *idx, const int32_t *count, int s, int t,
        int shared, int g, int es, int d, const int blocks, v16f *kbuf, const v16f *qf, v16f *o, float *sc,
        int64_t stride) {
    const float *kv[LANES];
    for (int si = -1; si < s; si++) {  /* -1: the shared entries */
        int r0 = si < 0 ? 0 : si * g, r1 = si < 0 ? s * g : r0 + g, from = si < 0 ? 0 : shared;
        int to = si < 0 ? shared : count[si];
        const int32_t *list = idx + (si < 0 ? 0 : (int64_t)si * t);
        for (int i0 = from; i0 < to; i0 += LANES) {
            int m = to - i0 < LANES ? to - i0 : LANES;
            rows_of(base, slot, list + i0, m, es, d, blocks, kbuf, kv);
            if (values) value_block(o, r0, r1, kv, m, blocks, sc, stride, i0);
            else score_block(qf, r0, r1, kv, m, blocks, sc, stride, i0);
        }
    }
}

/* One (batch row, kv head): its S queries' G heads (rows r = query * G + head), each over its `count` visible slots
 * listed ascending in `idx` [S][T]. The first `shared` entries of every list are the slots 0 .. shared - 1 (the
 * committed prefix): those keys and values are read once for all rows; each query's rest of its list is its own.
 * Every row's numbers are what it would get alone (the score of a key, the order of every sum), so sharing the
 * reads changes no bit. Scratch: qf, o [S*G][blocks], kbuf [16][blocks] vectors; sc [S*G][stride], sums [S*G]. */
static inline __attribute__((always_inline)) void attend_group(
        const void *q, int64_t q_head, int64_t q_step, const void *k, int64_t k_slot, const void *v, int64_t v_slot,
        const int32_t *idx, const int32_t *count, int s, int t, int shared, void *out, int64_t out_step, int es,
        int g, int d, const int blocks, float scale, v16f *qf, v16f *kbuf, v16f *o, float *sc, int64_t stride,
        float *sums) {
    const int rows = s * g;
    for (int si = 0; si < s; si++)
        for (int j = 0; j < g; j++) {
            v16f *qr = qf + (si * g + j) * blocks;
            load_row(AT(q, si * q_step + j * q_head), es, d, qr);
            for (int c = 0; c < blocks; c++) qr[c] = vscale(qr[c], scale);
        }
    /* 1. scores: the shared slots for every row, 16 keys at a time; then each query's own rest */
    each_block(0, k, k_slot, idx, count, s, t, shared, g, es, d, blocks, kbuf, qf, o, sc, stride);
    /* 2. p = exp(score - max) in place; the softmax sums in 16 lanes over the list index */
    for (int r = 0; r < rows; r++) {
        int n = count[r / g];
        float *sr = sc + r * stride;
        if (n == 0) continue;
        float top = row_max(sr, n);
        exp_shifted(sr, n, top);
        int end = (n + LANES - 1) / LANES * LANES;
        for (int i = n; i < end; i++) sr[i] = 0.0f;
        v16f acc = vzero();
        for (int i = 0; i < end; i += LANES) acc = vadd(acc, ld(sr + i));
        sums[r] = lane_sum(acc);
    }
    /* 3. values, accumulated in list order: the shared rows once for every row, then each query's own */
    for (int c = 0; c < rows * blocks; c++) o[c] = vzero();
    each_block(1, v, v_slot, idx, count, s, t, shared, g, es, d, blocks, kbuf, qf, o, sc, stride);
    /* 4. divide (rounded once to bfloat16 when es = 2); a query that sees nothing gets zeros */
    for (int r = 0; r < rows; r++) {
        char *dst = (char *)out + ((r / g) * out_step + (r % g) * d) * es;
        if (count[r / g] == 0) {
            memset(dst, 0, (size_t)es * d);
            continue;
        }
        float row[LANES];
        for (int c = 0; c < blocks; c++) {
            v16f x = vdiv1(o[r * blocks + c], sums[r]);
            memcpy(row, &x, sizeof row);
            for (int l = 0; l < LANES && c * LANES + l < d; l++) store(dst, c * LANES + l, row[l], es);
        }
    }
}

#define QUERY_BLOCK 64 /* queries of a (row, kv head) computed together: bounds the scratch at 64 G x T scores */

/* q [B, H, S, D] (strides qs[0..2] in elements, D contiguous); k, v [B, Hkv, T, D] (strides ks[0..2], vs[0..2]);
 * idx [B, S, T] int32, count [B, S] int32 (contiguous) and shared [B] int32: how many leading entries of every list
 * of row b are the slots 0, 1, ... (models/attention.py:native_plan); out [B, S, H, D] contiguous; every tensor
 * bfloat16 (es = 2) or float32 (es = 4). One thread: a second one on this work gained ~14% at 16 rows and lost
 * on 3 groups (docs/LOG.md, session 28). Returns 0, or -1 when scratch memory cannot be had. */
int specgen_attend(const void *q, const int64_t *qs, const void *k, const int64_t *ks, const void *v,
                   const int64_t *vs, const int32_t *idx, const int32_t *count, const int32_t *shared, void *out,
                   int es, int b, int h, int hkv, int s, int d, int t, float scale) {
    int g = h / hkv;
    int blocks = (d + LANES - 1) / LANES, qb = s < QUERY_BLOCK ? s : QUERY_BLOCK;
    int64_t rows = (int64_t)qb * g, stride = ((int64_t)t + LANES - 1) / LANES * LANES + LANES;
    size_t vecs = (size_t)(2 * rows + LANES) * blocks + (size_t)(rows * stride + rows) / LANES + 1;
    v16f *scratch = aligned_alloc(64, sizeof(v16f) * vecs);
    if (!scratch) return -1;
    v16f *qf = scratch, *o = qf + rows * blocks, *kbuf = o + rows * blocks;
    float *sc = (float *)(kbuf + LANES * blocks), *sums = sc + rows * stride;
    /* a block of a row's queries shares at least the row's `shared` entries */
#define LOOP(BLOCKS)                                                                                               \
    for (int bi = 0; bi < b; bi++)                                                                                 \
        for (int kh = 0; kh < hkv; kh++)                                                                           \
            for (int s0 = 0; s0 < s; s0 += qb) {                                                                   \
                int64_t bs = (int64_t)bi * s + s0;                                                                 \
                attend_group(AT(q, bi * qs[0] + (int64_t)kh * g * qs[1] + s0 * qs[2]), qs[1], qs[2],               \
                             AT(k, bi * ks[0] + kh * ks[1]), ks[2], AT(v, bi * vs[0] + kh * vs[1]), vs[2],         \
                             idx + bs * t, count + bs, s - s0 < qb ? s - s0 : qb, t, shared[bi],                   \
                             (char *)out + ((bs * h + (int64_t)kh * g) * d) * es, (int64_t)h * d, es, g, d, BLOCKS, \
                             scale, qf, kbuf, o, sc, stride, sums);                                                \
            }
    switch (blocks) {  /* one inlined copy per head size in 16s: its loops over D fully unrolled */
        case 1: LOOP(1); break;
        case 2: LOOP(2); break;
        case 4: LOOP(4); break;
        case 8: LOOP(8); break;
        default: LOOP(blocks); break;
    }
#undef LOOP
    free(scratch);
    return 0;
}

/* A forward's plan from its bool mask seen [B, S, T] (1 = query (b, s) sees slot t; contiguous): idx [B, S, T] each
 * query's visible slots ascending, then its hidden ones ascending (the order of a stable sort of !seen); count [B, S]
 * its visible slots; shared [B] the leading slots 0, 1, ... that every query of row b sees (the entries
 * specgen_attend reads once for all of them). One pass over the mask, in place of a stable sort and four
 * reductions in torch (docs/results/batching.md, "A block in one call; the attention plan in C"). Returns 0. */
int specgen_plan(const uint8_t *seen, int b, int s, int t, int32_t *idx, int32_t *count, int32_t *shared) {
    for (int bi = 0; bi < b; bi++) {
        int32_t least = t;
        for (int si = 0; si < s; si++) {
            int64_t q = (int64_t)bi * s + si;
            const uint8_t *row = seen + q * t;
            int32_t *out = idx + q * t, n = 0, lead = 0;
            while (lead < t && row[lead]) lead++;
            for (int j = 0; j < t; j++)
                if (row[j]) out[n++] = j;
            count[q] = n;
            for (int j = 0; j < t; j++)
                if (!row[j]) out[n++] = j;
            if (lead < least) least = lead;
        }
        shared[bi] = s > 0 ? least : 0;
    }
    return 0;
}

/* x [D] rotated by RoPE exactly as torch's `rope.rotate` computes it in the tensors' dtype: x * cos and
 * partner(x) * sin each rounded to it, their sum rounded again. partner(e) = e + D/2 mod D ("half") or e ^ 1
 * ("interleaved"); cos and sin [D] carry their layout's signs (rope.rotation). */
static void rotate_row(const void *x, const void *cs, const void *sn, int es, int d, int half, void *dst) {
    for (int e = 0; e < d; e++) {
        int p = half ? (e + d / 2) % d : e ^ 1;
        float a = rnd(load1(x, e, es) * load1(cs, e, es), es);
        float b = rnd(load1(x, p, es) * load1(sn, e, es), es);
        store(dst, e, a + b, es);
    }
}

/* A self-attention layer's work between its two products, in one call: the fused projection's output qkv
 * [B, S, H + 2 Hkv, D] (contiguous) has its q and k rotated (cos, sin [B, S, D]), k and v are written to the cache
 * layer (kc, vc [B, Hkv, T_max, D], strides ks, vs) at slot slots[b, s], and the queries (staged in qbuf
 * [B, H, S, D]) attend as in specgen_attend, into out [B, S, H, D]; es as there. */
int specgen_rope_write_attend(const void *qkv, const void *cs, const void *sn, int half, void *kc, const int64_t *ks,
                              void *vc, const int64_t *vs, const int32_t *slots, void *qbuf, const int32_t *idx,
                              const int32_t *count, const int32_t *shared, void *out, int es, int b, int h, int hkv,
                              int s, int d, int t, float scale) {
    int w = h + 2 * hkv;
    for (int bi = 0; bi < b; bi++)
        for (int si = 0; si < s; si++) {
            int64_t bs = (int64_t)bi * s + si;
            const void *row = AT(qkv, bs * w * d), *c = AT(cs, bs * d), *sn_row = AT(sn, bs * d);
            int64_t slot = slots[bs];
            for (int hh = 0; hh < h; hh++)
                rotate_row(AT(row, (int64_t)hh * d), c, sn_row, es, d, half,
                           (char *)qbuf + (((int64_t)bi * h + hh) * s + si) * d * es);
            for (int g = 0; g < hkv; g++) {
                rotate_row(AT(row, (int64_t)(h + g) * d), c, sn_row, es, d, half,
                           (char *)kc + (bi * ks[0] + g * ks[1] + slot * ks[2]) * es);
                memcpy((char *)vc + (bi * vs[0] + g * vs[1] + slot * vs[2]) * es, AT(row, (int64_t)(h + hkv + g) * d),
                       (size_t)es * d);
            }
        }
    int64_t qs[3] = {(int64_t)h * s * d, (int64_t)s * d, d};
    return specgen_attend(qbuf, qs, kc, ks, vc, vs, idx, count, shared, out, es, b, h, hkv, s, d, t, scale);
}
