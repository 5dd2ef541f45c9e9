/* Float32 linear products over a tiled copy of the weight (specgen/native/__init__.py loads it; the torch side is
 * specgen/native/ops.py: the tiled_linear op and `tile`, the layout).
 *
 * out[M, N] = x[M, K] @ W^T (+ bias), W [N, K] stored as tiles [N_pad / TILE][K][TILE] (zeros past N): the TILE
 * columns of one tile sit side by side for each k, so a product streams the weight once, front to back, with no
 * stride for the prefetcher to miss. Rows go in register blocks of up to MR; a block holds MR x NV vector
 * accumulators and reads one tile row per k for all its rows (the weight is read from memory once per product,
 * later blocks of rows find the tile in the L2 cache).
 *
 * Why: at one to a few rows a decode step is a pass over all weights, and MKL's GEMV over the column-major weight
 * and oneDNN's packed GEMM reached half this core's memory bandwidth on the 2026-11-27 VM; this loop reaches most
 * of it (models/kernel_choice.py measures all three per machine and row count and picks).
 *
 * Arithmetic: out[m, n] = (sum over k = 0, 1, ..., K - 1 in order of x[m, k] * W[n, k], each step one fused
 * multiply-add (two roundings on a CPU without FMA), from 0) + bias[n]. The same sequence for every row whatever the
 * row count or the row's place in a block: a row's result does not depend on which other rows share the product (bit
 * for bit), so a token scored in a verify forward gets the numbers of its AR step wherever both products run here.
 */
#include <stdint.h>
#include <string.h>

/* The machine's own vector width, not vec16.h's 16 lanes: GCC split every 16-lane operation into two AVX2 halves
 * through memory and kept the accumulators there, and this loop ran at a tenth of MKL's speed on an AVX2-only EPYC.
 * The width changes no sum (each output is its own fma chain over k): only the tile width and the speed. */
#if defined(__AVX512F__)
#include <immintrin.h>
typedef __m512 vf;
#define VL 16
#define NV 3                /* 48 columns x 8 rows: 24 accumulators + 3 weight vectors + 1 broadcast of 32 zmm */
#define MR 8
static inline vf vfma(vf a, vf b, vf c) { return _mm512_fmadd_ps(a, b, c); }
static inline vf vset(float x) { return _mm512_set1_ps(x); }
static inline vf vload(const float *p) { return _mm512_loadu_ps(p); }
#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
typedef __m256 vf;
#define VL 8
#define NV 2                /* 16 columns x 6 rows: 12 accumulators + 2 weight vectors + 1 broadcast of 16 ymm */
#define MR 6
static inline vf vfma(vf a, vf b, vf c) { return _mm256_fmadd_ps(a, b, c); }
static inline vf vset(float x) { return _mm256_set1_ps(x); }
static inline vf vload(const float *p) { return _mm256_loadu_ps(p); }
#else
typedef float vf __attribute__((vector_size(16)));  /* no FMA: a * b + c rounded twice (-ffp-contract=off) */
#define VL 4
#define NV 2                /* 8 columns x 4 rows: 8 accumulators + 2 weight vectors + 1 broadcast of 16 xmm */
#define MR 4
static inline vf vfma(vf a, vf b, vf c) { return a * b + c; }
static inline vf vset(float x) { return (vf){0} + x; }
static inline vf vload(const float *p) {
    vf v;
    memcpy(&v, p, sizeof v);
    return v;
}
#endif
#define TILE (VL * NV)

/* rows [0, R) of x (row stride ldx) times one tile (K rows of TILE floats) into out (row stride ldo), the first
 * `cols` columns (a last, partial tile writes only the columns that exist). R is a constant at every call site
 * (the switch below) and the loops over rows and vectors unroll fully, so the accumulators stay in registers
 * (without the pragmas GCC kept them in memory and a pass cost ~R times one row's). */
static inline __attribute__((always_inline)) void block(const float *x, int64_t ldx, const float *tile, int K,
                                                        const float *bias, float *out, int64_t ldo, int cols, int R) {
    vf acc[MR][NV];
#pragma GCC unroll 8
    for (int r = 0; r < R; r++)
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++) acc[r][j] = vset(0.0f);
    for (int k = 0; k < K; k++) {
        vf w[NV];
#pragma GCC unroll 3
        for (int j = 0; j < NV; j++) w[j] = vload(tile + (int64_t)k * TILE + VL * j);
#pragma GCC unroll 8
        for (int r = 0; r < R; r++) {
            vf b = vset(x[r * ldx + k]);
#pragma GCC unroll 3
            for (int j = 0; j < NV; j++) acc[r][j] = vfma(b, w[j], acc[r][j]);
        }
    }
    for (int r = 0; r < R; r++) {
        float row[TILE];
        for (int j = 0; j < NV; j++) {
            vf y = acc[r][j];
            if (bias) y = y + vload(bias + VL * j);
            memcpy(row + VL * j, &y, sizeof y);
        }
        memcpy(out + r * ldo, row, (size_t)cols * sizeof(float));
    }
}

/* out [M, N] = x [M, K] @ W^T + bias over tiles [ceil(N / TILE)][K][TILE]; bias: NULL or [ceil(N / TILE) * TILE]
 * (zero-padded like the tiles). Returns 0.
 *
 * Threads: built with OpenMP (only where the process's OpenMP runtime is torch's libgomp, so both share one pool),
 * the tiles are split among `threads` threads (the caller passes torch.get_num_threads(): OpenMP's own default on a
 * thread torch never set up is every core), each tile computed whole by one of them: the sums above do not depend
 * on the thread count either. Products under PARALLEL_MIN multiply-adds stay on the calling thread (waking the pool
 * would cost more than it saves). */
#define PARALLEL_MIN (1 << 16)
int specgen_tiled_linear(const float *x, const float *tiles, const float *bias, float *out, int M, int K, int N,
                         int threads) {
    int n_tiles = (N + TILE - 1) / TILE;
#pragma omp parallel for num_threads(threads) schedule(static) \
    if ((int64_t)M * K * N >= PARALLEL_MIN && n_tiles > 1 && threads > 1)
    for (int t = 0; t < n_tiles; t++) {
        int n = t * TILE;
        const float *tile = tiles + (int64_t)t * K * TILE;
        const float *b = bias ? bias + n : NULL;
        int cols = N - n < TILE ? N - n : TILE;
        for (int m = 0; m < M; m += MR) {
            const float *xm = x + (int64_t)m * K;
            float *om = out + (int64_t)m * N + n;
            switch (M - m < MR ? M - m : MR) {  /* R a constant in each case (see block) */
                case 1: block(xm, K, tile, K, b, om, N, cols, 1); break;
                case 2: block(xm, K, tile, K, b, om, N, cols, 2); break;
                case 3: block(xm, K, tile, K, b, om, N, cols, 3); break;
                case 4: block(xm, K, tile, K, b, om, N, cols, 4); break;
#if MR > 4
                case 5: block(xm, K, tile, K, b, om, N, cols, 5); break;
                case 6: block(xm, K, tile, K, b, om, N, cols, 6); break;
#endif
#if MR > 6
                case 7: block(xm, K, tile, K, b, om, N, cols, 7); break;
                case 8: block(xm, K, tile, K, b, om, N, cols, 8); break;
#endif
                default: break;  /* unreachable: a block has 1 .. MR rows */
            }
        }
    }
    return 0;
}

/* The tile width, for the torch side to lay the weight out. */
int specgen_tiled_width(void) { return TILE; }

/* 1 in a build with OpenMP (specgen_tiled_linear uses its `threads`), 0 without (it runs on the calling thread). */
int specgen_tiled_openmp(void) {
#ifdef _OPENMP
    return 1;
#else
    return 0;
#endif
}
