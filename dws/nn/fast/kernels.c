/* Native CPU kernels for the largest tensors of a DWSNet training step (AVX2 + FMA, OpenMP).
 *
 * Built and loaded by dws/nn/fast/native.py, which documents why they exist. Three operations:
 *   - a hidden weight's channel-mixing product and its row and column max pools
 *     (dws.nn.fast.identity.MatmulAndMaxPools), forward and backward, one network at a time so that
 *     the network's [H, W, C] block stays in the core's L2 cache between the pools, the product
 *     and (backward) the input gradient, the weight gradient and the pools' scatter;
 *   - batch norm (training mode, batch statistics) followed by ReLU over [N, C]
 *     (dws.nn.fast.bn_relu), forward and backward, two passes each way, with the DWS layer's row and
 *     column broadcast terms of a hidden weight added on the fly;
 *   - the two together: batch norm + ReLU of one DWS layer's hidden weight and the next layer's
 *     pools and product of the result, which is never stored (dws.nn.fast.bn_relu.BatchNormReLUProduct).
 * Layout: float32, C-contiguous, channels last. Requirement (checked by the caller): every
 * channel count a multiple of 8. Loops are parallel with OpenMP; loaded into a PyTorch process the
 * library resolves libgomp to PyTorch's copy, so it runs on PyTorch's own thread pool.
 */
#include <immintrin.h>
#include <omp.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define ROW_BLOCK 64     /* rows per block of the backward's two products (x and dy blocks in L1) */
#define STATS_BLOCK 256  /* rows per float partial sum before it is added into a double */
#define MAX_VECTORS 6    /* channel vectors held in registers by the pools and the per-channel sums */

/* ---- products with 4 x 24 register tiles (12 sums for 4 broadcasts and 3 loads per step), then
 * 16 and 8 columns, then single rows. A tile sums, over `steps` steps t, a[i * a_i + t * a_t]
 * (broadcast, i < nr) times b[t * n + 8 v .. + 8] (v < nv) into out[i * n + 8 v], which it
 * overwrites (accumulate = 0) or adds to (accumulate = 1). The product x @ w and the gram x^T @ g
 * are two strides of the same tile. */
INLINE void tile(int accumulate, int nr, int nv, int steps, const float *a, ptrdiff_t a_i, ptrdiff_t a_t,
                 const float *b, int n, float *out) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) acc[i][v] = _mm256_setzero_ps();
    for (int t = 0; t < steps; t++) {
        __m256 bv[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) bv[v] = _mm256_loadu_ps(b + (ptrdiff_t)t * n + 8 * v);
#pragma GCC unroll 4
        for (int i = 0; i < nr; i++) {
            __m256 av = _mm256_broadcast_ss(a + i * a_i + t * a_t);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(av, bv[v], acc[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nr; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            float *o = out + (ptrdiff_t)i * n + 8 * v;
            _mm256_storeu_ps(o, accumulate ? _mm256_add_ps(_mm256_loadu_ps(o), acc[i][v]) : acc[i][v]);
        }
}

/* the tiles of nr output rows across all n columns (a multiple of 8) */
INLINE void tile_row(int accumulate, int nr, int steps, const float *a, ptrdiff_t a_i, ptrdiff_t a_t,
                     const float *b, int n, float *out) {
    int j = 0;
    for (; j + 24 <= n; j += 24) tile(accumulate, nr, 3, steps, a, a_i, a_t, b + j, n, out + j);
    if (j + 16 <= n) {
        tile(accumulate, nr, 2, steps, a, a_i, a_t, b + j, n, out + j);
        j += 16;
    }
    if (j + 8 <= n) tile(accumulate, nr, 1, steps, a, a_i, a_t, b + j, n, out + j);
}

/* y [rows, n] = x [rows, kd] @ w [kd, n], row-major */
static void matmul(int rows, int kd, int n, const float *x, const float *w, float *y) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) tile_row(0, 4, kd, x + (ptrdiff_t)r * kd, kd, 1, w, n, y + (ptrdiff_t)r * n);
    for (; r < rows; r++) tile_row(0, 1, kd, x + (ptrdiff_t)r * kd, kd, 1, w, n, y + (ptrdiff_t)r * n);
}

/* out [kd, n] += x [rows, kd]^T @ g [rows, n] */
static void gram(int rows, int kd, int n, const float *x, const float *g, float *out) {
    int k = 0;
    for (; k + 4 <= kd; k += 4) tile_row(1, 4, rows, x + k, 1, kd, g, n, out + (ptrdiff_t)k * n);
    for (; k < kd; k++) tile_row(1, 1, rows, x + k, 1, kd, g, n, out + (ptrdiff_t)k * n);
}

/* ---- max pools of one network's x [h, w, c]: over w (one per row) and over h (one per column),
 * with the index of the maximum; the first maximum wins and NaN propagates, as in max_pool2d */
INLINE __m256 replaces(__m256 v, __m256 best) {
    return _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
}

INLINE __m256i blend_index(__m256i index, int candidate, __m256 mask) {
    return _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(index), _mm256_castsi256_ps(_mm256_set1_epi32(candidate)), mask));
}

/* out, arg [8 nv] = max and index of max over count blocks of 8 nv floats, `stride` floats apart */
INLINE void pool_run(int nv, int count, ptrdiff_t stride, const float *x, float *out, int32_t *arg) {
    __m256 best[MAX_VECTORS];
    __m256i where[MAX_VECTORS];
#pragma GCC unroll 6
    for (int v = 0; v < nv; v++) {
        best[v] = _mm256_loadu_ps(x + 8 * v);
        where[v] = _mm256_setzero_si256();
    }
    for (int k = 1; k < count; k++) {
#pragma GCC unroll 6
        for (int v = 0; v < nv; v++) {
            __m256 value = _mm256_loadu_ps(x + k * stride + 8 * v), m = replaces(value, best[v]);
            best[v] = _mm256_blendv_ps(best[v], value, m);
            where[v] = blend_index(where[v], k, m);
        }
    }
#pragma GCC unroll 6
    for (int v = 0; v < nv; v++) {
        _mm256_storeu_ps(out + 8 * v, best[v]);
        _mm256_storeu_si256((__m256i *)(arg + 8 * v), where[v]);
    }
}

/* pool_run over `count` blocks for each of `runs` positions (`step` floats apart) and all c channels:
 * the row pools (runs = h, over w) or the column pools (runs = w, over h) of one network */
static void pools(int runs, ptrdiff_t step, int count, ptrdiff_t stride, int c, const float *x, float *out,
                  int32_t *arg) {
    for (int r = 0; r < runs; r++)
        for (int ch = 0; ch < c; ch += 8 * MAX_VECTORS) {
            const float *xr = x + r * step + ch;
            float *o = out + (ptrdiff_t)r * c + ch;
            int32_t *a = arg + (ptrdiff_t)r * c + ch;
            switch ((c - ch) / 8 < MAX_VECTORS ? (c - ch) / 8 : MAX_VECTORS) {
                case 6: pool_run(6, count, stride, xr, o, a); break;
                case 5: pool_run(5, count, stride, xr, o, a); break;
                case 4: pool_run(4, count, stride, xr, o, a); break;
                case 3: pool_run(3, count, stride, xr, o, a); break;
                case 2: pool_run(2, count, stride, xr, o, a); break;
                case 1: pool_run(1, count, stride, xr, o, a); break;
            }
        }
}

/* ---- a hidden weight's pools and product, one network [h, w, ci] at a time */
typedef struct {
    int h, w, ci, co;
} Block;

/* the pools of x ([h, w, ci]; either may be skipped with NULL) and y = x @ weight ([ci, co];
 * skipped when y is NULL: the pools alone) */
static void network_forward(const Block *k, const float *x, const float *weight, float *y, float *row_max,
                            int32_t *row_arg, float *col_max, int32_t *col_arg) {
    const ptrdiff_t line = (ptrdiff_t)k->w * k->ci;
    if (row_max) pools(k->h, line, k->w, k->ci, k->ci, x, row_max, row_arg); /* over w, for each row */
    if (col_max) pools(k->w, k->ci, k->h, line, k->ci, x, col_max, col_arg); /* over h, for each column */
    if (y) matmul(k->h * k->w, k->ci, k->co, x, weight, y);
}

/* each pool's gradient added at its maximum in grad_x (either pool's gradient may be NULL) */
static void scatter_pools(const Block *k, const float *grad_row, const int32_t *row_arg, const float *grad_col,
                          const int32_t *col_arg, float *grad_x) {
    const int ci = k->ci, w = k->w;
    if (grad_row)
        for (int i = 0; i < k->h; i++)
            for (int c = 0; c < ci; c++) grad_x[((ptrdiff_t)i * w + row_arg[i * ci + c]) * ci + c] += grad_row[i * ci + c];
    if (grad_col)
        for (int j = 0; j < w; j++)
            for (int c = 0; c < ci; c++) grad_x[((ptrdiff_t)col_arg[j * ci + c] * w + j) * ci + c] += grad_col[j * ci + c];
}

/* grad_x = grad_y @ weight^T (weight_t [co, ci]) plus each pool's gradient at its maximum, and
 * gram += x^T @ grad_y. grad_y may be NULL (only the pools received gradients: grad_x is their
 * scatter); grad_x or gram may be NULL (not wanted). */
static void network_backward(const Block *k, const float *x, const float *weight_t, const float *grad_y,
                             const float *grad_row, const int32_t *row_arg, const float *grad_col,
                             const int32_t *col_arg, float *grad_x, float *gram_out) {
    const ptrdiff_t cells = (ptrdiff_t)k->h * k->w;
    const int ci = k->ci, co = k->co;
    if (grad_y) {
        for (ptrdiff_t r = 0; r < cells; r += ROW_BLOCK) {
            int rows = cells - r < ROW_BLOCK ? (int)(cells - r) : ROW_BLOCK;
            if (grad_x) matmul(rows, co, ci, grad_y + r * co, weight_t, grad_x + r * ci);
            if (gram_out) gram(rows, ci, co, x + r * ci, grad_y + r * co, gram_out);
        }
    } else if (grad_x) {
        memset(grad_x, 0, sizeof(float) * cells * ci);
    }
    if (grad_x) scatter_pools(k, grad_row, row_arg, grad_col, col_arg, grad_x);
}

/* per-thread double sums (each thread adds into its own row), totalled in thread order afterwards:
 * results depend on the thread count but not on the threads' timing */
typedef struct {
    ptrdiff_t size;
    int threads;
    double *rows;
} Partials;

static Partials partials_new(ptrdiff_t size, int threads) {
    Partials p = {size, threads, calloc((size_t)size * threads, sizeof(double))};
    return p;
}

INLINE double *partials_mine(const Partials *p) { return p->rows + (ptrdiff_t)omp_get_thread_num() * p->size; }

INLINE void partials_add(const Partials *p, const float *values) {
    double *mine = partials_mine(p);
    for (ptrdiff_t k = 0; k < p->size; k++) mine[k] += values[k];
}

/* out [size] = the rows' total; frees them */
static void partials_total(Partials *p, double *out) {
    memset(out, 0, sizeof(double) * p->size);
    for (int t = 0; t < p->threads; t++)
        for (ptrdiff_t k = 0; k < p->size; k++) out[k] += p->rows[t * p->size + k];
    free(p->rows);
}

/* a float copy of the total (a weight gradient summed over networks) */
static void partials_total_float(Partials *p, float *out) {
    double *total = malloc(sizeof(double) * p->size);
    partials_total(p, total);
    for (ptrdiff_t k = 0; k < p->size; k++) out[k] = (float)total[k];
    free(total);
}

/* forward of the pools and product for each network b of x [networks, h, w, ci] */
void dws_pools_product(int networks, int h, int w, int ci, int co, const float *x, const float *weight,
                       float *y, float *row_max, int32_t *row_arg, float *col_max, int32_t *col_arg, int threads) {
    const Block k = {h, w, ci, co};
    const ptrdiff_t cells = (ptrdiff_t)h * w, rows = (ptrdiff_t)h * ci, cols = (ptrdiff_t)w * ci;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < networks; b++)
        network_forward(&k, x + b * cells * ci, weight, y ? y + b * cells * co : NULL,
                        row_max ? row_max + b * rows : NULL, row_max ? row_arg + b * rows : NULL,
                        col_max ? col_max + b * cols : NULL, col_max ? col_arg + b * cols : NULL);
}

/* its backward (see network_backward); grad_weight = sum over networks of x^T @ grad_y. grad_y
 * may be NULL (then x and weight_t may be NULL too); grad_x or grad_weight may be NULL. */
void dws_pools_product_backward(int networks, int h, int w, int ci, int co, const float *x, const float *weight_t,
                                const float *grad_y, const float *grad_row, const int32_t *row_arg,
                                const float *grad_col, const int32_t *col_arg, float *grad_x, float *grad_weight,
                                int threads) {
    const Block k = {h, w, ci, co};
    const ptrdiff_t cells = (ptrdiff_t)h * w, rows = (ptrdiff_t)h * ci, cols = (ptrdiff_t)w * ci;
    const int want_weight = grad_weight != NULL && grad_y != NULL;
    Partials sum = partials_new(want_weight ? (ptrdiff_t)ci * co : 0, threads);
#pragma omp parallel num_threads(threads)
    {
        float *local = want_weight ? malloc(sizeof(float) * sum.size) : NULL;
#pragma omp for schedule(static)
        for (int b = 0; b < networks; b++) {
            if (local) memset(local, 0, sizeof(float) * sum.size);
            network_backward(&k, x ? x + b * cells * ci : NULL, weight_t, grad_y ? grad_y + b * cells * co : NULL,
                             grad_row ? grad_row + b * rows : NULL, grad_row ? row_arg + b * rows : NULL,
                             grad_col ? grad_col + b * cols : NULL, grad_col ? col_arg + b * cols : NULL,
                             grad_x ? grad_x + b * cells * ci : NULL, local);
            if (local) partials_add(&sum, local);
        }
        free(local);
    }
    if (want_weight) partials_total_float(&sum, grad_weight);
    else free(sum.rows);
}

/* ---- batch norm + ReLU: z = max(u, 0), u = v * scale + shift (scale = gamma / std, shift = beta -
 * mean * scale), over the entries v of a [rows, c] input. The input may come as a sum
 * v = y + row term + column term: y [networks, h, w, c] (a hidden weight's product) and the
 * broadcast terms row [networks, h, c] and col [networks, w, c] (either may be NULL) that the DWS
 * layer would otherwise add into y with two more passes; the backward then also returns their
 * gradients (sums of grad_v over w and over h). A plain [n, c] input is networks = n, h = w = 1
 * without terms. Per-channel sums run over blocks in float vectors, then are added into doubles;
 * channels go MAX_VECTORS vectors at a time so the sums stay in registers. */
typedef struct {
    int networks, h, w, c;
    const float *y, *row, *col;
} Input;

INLINE ptrdiff_t input_rows(const Input *in) { return (ptrdiff_t)in->networks * in->h * in->w; }

/* blocks of whole groups of w rows (one network per block when there is a column term, so that
 * its column sums stay in one thread); returns the number of groups ((network, i) pairs) per block */
INLINE ptrdiff_t groups_per_block(const Input *in) {
    if (in->col) return in->h;
    ptrdiff_t g = STATS_BLOCK / in->w;
    return g > 0 ? g : 1;
}

/* v at group g (= network * h + i), column j, channels ch..ch+7 */
INLINE __m256 input_value(const Input *in, ptrdiff_t g, int j, int ch) {
    __m256 v = _mm256_loadu_ps(in->y + (g * in->w + j) * in->c + ch);
    if (in->row) v = _mm256_add_ps(v, _mm256_loadu_ps(in->row + g * in->c + ch));
    if (in->col) v = _mm256_add_ps(v, _mm256_loadu_ps(in->col + ((g / in->h) * in->w + j) * in->c + ch));
    return v;
}

/* ReLU and its gradient's mask with PyTorch's NaN behaviour: relu(NaN) = NaN (max returns its
 * second operand when either is NaN), and the gradient passes where u is NaN (threshold_backward
 * zeroes it only where u <= 0) */
INLINE __m256 relu(__m256 u) { return _mm256_max_ps(_mm256_setzero_ps(), u); }

INLINE __m256 relu_mask(__m256 u) { return _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_NLE_UQ); }

enum { SUMS_MOMENTS, SUMS_BACKWARD };

/* over groups [g0, g1) and channel vectors [ch, ch + 8 nv): MOMENTS adds sum(v - ref) and
 * sum((v - ref)^2); BACKWARD adds sum(gu) and sum(gu (v - ref)), gu = gz where u > 0 else 0 */
INLINE void channel_sums(int kind, int nv, const Input *in, ptrdiff_t g0, ptrdiff_t g1, int ch, const float *gz,
                         const float *ref, const float *scale, const float *shift, double *out) {
    const int c = in->c;
    __m256 s1[MAX_VECTORS], s2[MAX_VECTORS], rv[MAX_VECTORS], sc[MAX_VECTORS], sh[MAX_VECTORS];
#pragma GCC unroll 6
    for (int v = 0; v < nv; v++) {
        s1[v] = s2[v] = _mm256_setzero_ps();
        rv[v] = _mm256_loadu_ps(ref + ch + 8 * v);
        if (kind == SUMS_BACKWARD) {
            sc[v] = _mm256_loadu_ps(scale + ch + 8 * v);
            sh[v] = _mm256_loadu_ps(shift + ch + 8 * v);
        }
    }
    for (ptrdiff_t g = g0; g < g1; g++)
        for (int j = 0; j < in->w; j++) {
#pragma GCC unroll 6
            for (int v = 0; v < nv; v++) {
                __m256 x = input_value(in, g, j, ch + 8 * v), d = _mm256_sub_ps(x, rv[v]);
                if (kind == SUMS_MOMENTS) {
                    s1[v] = _mm256_add_ps(s1[v], d);
                    s2[v] = _mm256_fmadd_ps(d, d, s2[v]);
                } else {
                    __m256 u = _mm256_fmadd_ps(x, sc[v], sh[v]);
                    __m256 gu = _mm256_and_ps(_mm256_loadu_ps(gz + (g * in->w + j) * c + ch + 8 * v),
                                              relu_mask(u));
                    s1[v] = _mm256_add_ps(s1[v], gu);
                    s2[v] = _mm256_fmadd_ps(gu, d, s2[v]);
                }
            }
        }
    for (int v = 0; v < nv; v++) {
        float a[8], b[8];
        _mm256_storeu_ps(a, s1[v]);
        _mm256_storeu_ps(b, s2[v]);
        for (int l = 0; l < 8; l++) {
            out[ch + 8 * v + l] += a[l];
            out[c + ch + 8 * v + l] += b[l];
        }
    }
}

/* part [2c] += the two per-channel sums of `kind` over groups [g0, g1) (see channel_sums) */
static void block_channel_sums(int kind, const Input *in, ptrdiff_t g0, ptrdiff_t g1, const float *gz,
                               const float *ref, const float *scale, const float *shift, double *part) {
    const int c = in->c;
    for (int ch = 0; ch < c; ch += 8 * MAX_VECTORS) {
        switch ((c - ch) / 8 < MAX_VECTORS ? (c - ch) / 8 : MAX_VECTORS) {
#define SUMS_CASE(NV) case NV: \
    if (kind == SUMS_MOMENTS) channel_sums(SUMS_MOMENTS, NV, in, g0, g1, ch, gz, ref, scale, shift, part); \
    else channel_sums(SUMS_BACKWARD, NV, in, g0, g1, ch, gz, ref, scale, shift, part); \
    break;
            SUMS_CASE(6) SUMS_CASE(5) SUMS_CASE(4) SUMS_CASE(3) SUMS_CASE(2) SUMS_CASE(1)
#undef SUMS_CASE
        }
    }
}

/* out [2c] = the two per-channel sums of `kind` over the whole input */
static void all_channel_sums(int kind, const Input *in, const float *gz, const float *ref, const float *scale,
                             const float *shift, double *out, int threads) {
    const ptrdiff_t groups = (ptrdiff_t)in->networks * in->h, block = groups_per_block(in);
    Partials sums = partials_new(2 * (ptrdiff_t)in->c, threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (ptrdiff_t g0 = 0; g0 < groups; g0 += block)
        block_channel_sums(kind, in, g0, g0 + block < groups ? g0 + block : groups, gz, ref, scale, shift,
                           partials_mine(&sums));
    partials_total(&sums, out);
}

/* per-channel scale and shift of the normalization */
typedef struct {
    float *scale, *shift, *a, *b; /* a, b: the backward's coefficients */
} Affine;

static Affine affine_new(int c) {
    Affine f = {malloc(sizeof(float) * c), malloc(sizeof(float) * c), malloc(sizeof(float) * c),
                malloc(sizeof(float) * c)};
    return f;
}

static void affine_free(Affine *f) {
    free(f->scale);
    free(f->shift);
    free(f->a);
    free(f->b);
}

/* batch statistics (at least 2 rows): mean, invstd and the affine map; running statistics updated
 * as nn.BatchNorm1d does where running_mean is not NULL (r = (1 - factor) r + factor s, unbiased
 * variance) */
static void bn_statistics(const Input *in, const float *gamma, const float *beta, float eps, float *mean,
                          float *invstd, Affine *f, float *running_mean, float *running_var, float factor,
                          int threads) {
    const int c = in->c;
    const ptrdiff_t n = input_rows(in);
    double *sums = malloc(sizeof(double) * 2 * c);
    float *ref = malloc(sizeof(float) * c);
    for (int ch = 0; ch < c; ch += 8) _mm256_storeu_ps(ref + ch, input_value(in, 0, 0, ch));
    all_channel_sums(SUMS_MOMENTS, in, NULL, ref, NULL, NULL, sums, threads); /* centred on the first row */
    for (int k = 0; k < c; k++) {
        double m = sums[k] / n, v = sums[c + k] / n - m * m;
        if (v < 0) v = 0; /* (rounding; a NaN stays NaN, as in PyTorch) */
        mean[k] = (float)(ref[k] + m);
        invstd[k] = (float)(1.0 / __builtin_sqrt(v + eps));
        f->scale[k] = gamma[k] * invstd[k];
        f->shift[k] = beta[k] - mean[k] * f->scale[k];
        if (running_mean) {
            running_mean[k] = (1 - factor) * running_mean[k] + factor * mean[k];
            running_var[k] = (1 - factor) * running_var[k] + factor * (float)(v * n / (n - 1));
        }
    }
    free(sums);
    free(ref);
}

/* the affine map from saved statistics (backward) */
static void bn_affine(int c, const float *gamma, const float *beta, const float *mean, const float *invstd,
                      Affine *f) {
    for (int k = 0; k < c; k++) {
        f->scale[k] = gamma[k] * invstd[k];
        f->shift[k] = beta[k] - mean[k] * f->scale[k];
    }
}

/* z = relu(v * scale + shift) for groups [g0, g1), written from z (group g0 at z) */
static void normalize_relu(const Input *in, ptrdiff_t g0, ptrdiff_t g1, const Affine *f, float *z) {
    const int c = in->c, w = in->w;
    for (ptrdiff_t g = g0; g < g1; g++)
        for (int j = 0; j < w; j++)
            for (int ch = 0; ch < c; ch += 8) {
                __m256 u = _mm256_fmadd_ps(input_value(in, g, j, ch), _mm256_loadu_ps(f->scale + ch),
                                           _mm256_loadu_ps(f->shift + ch));
                _mm256_storeu_ps(z + ((g - g0) * w + j) * c + ch, relu(u));
            }
}

/* from sums = (sum gu, sum gu (v - mean)): grad_gamma, grad_beta and the coefficients of
 * grad_v = scale gu - a - b (v - mean), i.e. scale (gu - mean(gu) - vhat mean(gu vhat)) */
static void bn_coefficients(const Input *in, const double *sums, const float *invstd, Affine *f, float *grad_gamma,
                            float *grad_beta) {
    const int c = in->c;
    const ptrdiff_t n = input_rows(in);
    for (int k = 0; k < c; k++) {
        grad_beta[k] = (float)sums[k];
        grad_gamma[k] = (float)(sums[c + k] * invstd[k]);
        f->a[k] = (float)(f->scale[k] * sums[k] / n);
        f->b[k] = (float)(f->scale[k] * (double)invstd[k] * invstd[k] * sums[c + k] / n);
    }
}

/* grad_v for groups [g0, g1) (grad_y may be grad_z: in place), and the terms' gradients: each
 * group's row sum into grad_row (set), each column's sum added into grad_col (zeroed by the caller) */
static void bn_input_grad(const Input *in, ptrdiff_t g0, ptrdiff_t g1, const float *grad_z, const float *mean,
                          const Affine *f, float *grad_y, float *grad_row, float *grad_col) {
    const int c = in->c, w = in->w;
    for (ptrdiff_t g = g0; g < g1; g++) {
        if (grad_row) memset(grad_row + g * c, 0, sizeof(float) * c);
        for (int j = 0; j < w; j++)
            for (int ch = 0; ch < c; ch += 8) {
                __m256 x = input_value(in, g, j, ch), sc = _mm256_loadu_ps(f->scale + ch);
                __m256 u = _mm256_fmadd_ps(x, sc, _mm256_loadu_ps(f->shift + ch));
                ptrdiff_t at = (g * w + j) * c + ch;
                __m256 gu = _mm256_and_ps(_mm256_loadu_ps(grad_z + at), relu_mask(u));
                __m256 d = _mm256_sub_ps(x, _mm256_loadu_ps(mean + ch));
                __m256 gv = _mm256_fnmadd_ps(d, _mm256_loadu_ps(f->b + ch), _mm256_fmsub_ps(gu, sc, _mm256_loadu_ps(f->a + ch)));
                _mm256_storeu_ps(grad_y + at, gv);
                if (grad_row) {
                    float *o = grad_row + g * c + ch;
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), gv));
                }
                if (grad_col) {
                    float *o = grad_col + ((g / in->h) * w + j) * c + ch;
                    _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), gv));
                }
            }
    }
}

/* forward: batch statistics of the input (at least 2 rows), z [rows, c] = relu(batch_norm(v));
 * mean and invstd are returned per channel for the backward; running statistics as bn_statistics */
void dws_bn_relu_forward(int networks, int h, int w, int c, const float *y, const float *row, const float *col,
                         const float *gamma, const float *beta, float eps, float *z, float *mean, float *invstd,
                         float *running_mean, float *running_var, float factor, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const ptrdiff_t groups = (ptrdiff_t)networks * h, block = groups_per_block(&in);
    Affine f = affine_new(c);
    bn_statistics(&in, gamma, beta, eps, mean, invstd, &f, running_mean, running_var, factor, threads);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (ptrdiff_t g0 = 0; g0 < groups; g0 += block)
        normalize_relu(&in, g0, g0 + block < groups ? g0 + block : groups, &f, z + g0 * w * c);
    affine_free(&f);
}

/* backward of the forward above, given its mean and invstd: grad_y [rows, c] (the gradient of v),
 * grad_gamma, grad_beta, and grad_row [networks, h, c] / grad_col [networks, w, c] where the
 * forward had those terms (NULL otherwise) */
void dws_bn_relu_backward(int networks, int h, int w, int c, const float *y, const float *row, const float *col,
                          const float *grad_z, const float *gamma, const float *beta, const float *mean,
                          const float *invstd, float *grad_y, float *grad_row, float *grad_col, float *grad_gamma,
                          float *grad_beta, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const ptrdiff_t groups = (ptrdiff_t)networks * h, block = groups_per_block(&in);
    double *sums = malloc(sizeof(double) * 2 * c);
    Affine f = affine_new(c);
    bn_affine(c, gamma, beta, mean, invstd, &f);
    all_channel_sums(SUMS_BACKWARD, &in, grad_z, mean, f.scale, f.shift, sums, threads);
    bn_coefficients(&in, sums, invstd, &f, grad_gamma, grad_beta);
    if (grad_col) memset(grad_col, 0, sizeof(float) * networks * w * c);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (ptrdiff_t g0 = 0; g0 < groups; g0 += block)
        bn_input_grad(&in, g0, g0 + block < groups ? g0 + block : groups, grad_z, mean, &f, grad_y, grad_row, grad_col);
    free(sums);
    affine_free(&f);
}

/* ---- batch norm + ReLU of one DWS layer's hidden weight, then the next layer's pools and product
 * of the result, as one operation: z = relu(batch_norm(y + row + col)) exists only one network at
 * a time in a per-thread buffer (in L2), from which the pools and y_next = z @ weight are taken;
 * the backward recomputes it the same way. Saves z's write and its reads by the next layer. */
void dws_bn_relu_product_forward(int networks, int h, int w, int c, const float *y, const float *row,
                                 const float *col, const float *gamma, const float *beta, float eps, float *mean,
                                 float *invstd, float *running_mean, float *running_var, float factor, int co,
                                 const float *weight, float *y_next, float *row_max, int32_t *row_arg,
                                 float *col_max, int32_t *col_arg, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const Block k = {h, w, c, co};
    const ptrdiff_t cells = (ptrdiff_t)h * w, rows = (ptrdiff_t)h * c, cols = (ptrdiff_t)w * c;
    Affine f = affine_new(c);
    bn_statistics(&in, gamma, beta, eps, mean, invstd, &f, running_mean, running_var, factor, threads);
#pragma omp parallel num_threads(threads)
    {
        float *z = malloc(sizeof(float) * cells * c);
#pragma omp for schedule(static)
        for (int b = 0; b < networks; b++) {
            normalize_relu(&in, (ptrdiff_t)b * h, (ptrdiff_t)(b + 1) * h, &f, z);
            network_forward(&k, z, weight, y_next + b * cells * co, row_max ? row_max + b * rows : NULL,
                            row_max ? row_arg + b * rows : NULL, col_max ? col_max + b * cols : NULL,
                            col_max ? col_arg + b * cols : NULL);
        }
        free(z);
    }
    affine_free(&f);
}

/* its backward: grad_y (the gradient of v = y + row + col, [networks, h, w, c]; it first holds the
 * gradient of z, network by network), grad_row / grad_col where the forward had those terms,
 * grad_gamma, grad_beta, grad_weight (NULL: not wanted); grad_y_next may be NULL (only the pools
 * received gradients) */
void dws_bn_relu_product_backward(int networks, int h, int w, int c, const float *y, const float *row,
                                  const float *col, const float *gamma, const float *beta, const float *mean,
                                  const float *invstd, int co, const float *weight_t, const float *grad_y_next,
                                  const float *grad_row_max, const int32_t *row_arg, const float *grad_col_max,
                                  const int32_t *col_arg, float *grad_y, float *grad_row, float *grad_col,
                                  float *grad_gamma, float *grad_beta, float *grad_weight, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const Block k = {h, w, c, co};
    const ptrdiff_t cells = (ptrdiff_t)h * w, rows = (ptrdiff_t)h * c, cols = (ptrdiff_t)w * c;
    const int want_weight = grad_weight != NULL && grad_y_next != NULL;
    Partials sum = partials_new(want_weight ? (ptrdiff_t)c * co : 0, threads), moments = partials_new(2 * c, threads);
    double *sums = malloc(sizeof(double) * 2 * c);
    Affine f = affine_new(c);
    bn_affine(c, gamma, beta, mean, invstd, &f);
#pragma omp parallel num_threads(threads)
    {
        /* z is recomputed a block of whole rows at a time (in L1), not for the whole network */
        const ptrdiff_t block = ROW_BLOCK / w > 0 ? ROW_BLOCK / w : 1;
        float *z = malloc(sizeof(float) * block * w * c), *local = want_weight ? malloc(sizeof(float) * sum.size) : NULL;
#pragma omp for schedule(static)
        for (int b = 0; b < networks; b++) { /* the gradient of z, and batch norm's sums over it */
            float *gz = grad_y + b * cells * c;
            const float *gn = grad_y_next ? grad_y_next + b * cells * co : NULL;
            if (local) memset(local, 0, sizeof(float) * sum.size);
            for (ptrdiff_t i0 = 0; i0 < h; i0 += block) {
                ptrdiff_t i1 = i0 + block < h ? i0 + block : h, at = i0 * w;
                int cells_in_block = (int)((i1 - i0) * w);
                if (!gn) {
                    memset(gz + at * c, 0, sizeof(float) * cells_in_block * c);
                    continue;
                }
                normalize_relu(&in, (ptrdiff_t)b * h + i0, (ptrdiff_t)b * h + i1, &f, z);
                matmul(cells_in_block, co, c, gn + at * co, weight_t, gz + at * c);
                if (local) gram(cells_in_block, c, co, z, gn + at * co, local);
            }
            scatter_pools(&k, grad_row_max ? grad_row_max + b * rows : NULL, grad_row_max ? row_arg + b * rows : NULL,
                          grad_col_max ? grad_col_max + b * cols : NULL, grad_col_max ? col_arg + b * cols : NULL, gz);
            if (local) partials_add(&sum, local);
            block_channel_sums(SUMS_BACKWARD, &in, (ptrdiff_t)b * h, (ptrdiff_t)(b + 1) * h, grad_y, mean, f.scale,
                               f.shift, partials_mine(&moments));
        }
        free(z);
        free(local);
    }
    if (want_weight) partials_total_float(&sum, grad_weight);
    else free(sum.rows);
    partials_total(&moments, sums);
    bn_coefficients(&in, sums, invstd, &f, grad_gamma, grad_beta);
    if (grad_col) memset(grad_col, 0, sizeof(float) * networks * w * c);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < networks; b++) /* grad_v, in place over the gradient of z */
        bn_input_grad(&in, (ptrdiff_t)b * h, (ptrdiff_t)(b + 1) * h, grad_y, mean, &f, grad_y, grad_row, grad_col);
    free(sums);
    affine_free(&f);
}
