/* Native CPU kernels for the largest tensors of a DWSNet training step (AVX2 + FMA, OpenMP).
 *
 * Built and loaded by dws/nn/native.py, which documents why they exist. Two operations:
 *   - a hidden weight's channel-mixing product and its row and column max pools
 *     (dws.nn.identity.MatmulAndMaxPools), forward and backward, one network at a time so that
 *     the network's [H, W, C] block stays in the core's L2 cache between the pools, the product
 *     and (backward) the input gradient, the weight gradient and the pools' scatter;
 *   - batch norm (training mode, batch statistics) followed by ReLU over [N, C]
 *     (dws.nn.bn_relu), forward and backward, two passes each way, with the DWS layer's row and
 *     column broadcast terms of a hidden weight added on the fly.
 * Layout: float32, C-contiguous, channels last. Requirement (checked by the caller): every
 * channel count a multiple of 8. Loops are parallel with OpenMP; loaded into a PyTorch process the
 * library resolves libgomp to PyTorch's copy, so it runs on PyTorch's own thread pool.
 */
#include <immintrin.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define ROW_BLOCK 64     /* rows per block of the backward's two products (x and dy blocks in L1) */
#define STATS_BLOCK 256  /* rows per float partial sum before it is added into a double */
#define MAX_VECTORS 6    /* channel vectors held in registers by the pools and the per-channel sums */

/* ---- y [rows, n] = x [rows, kd] @ w [kd, n], row-major, n a multiple of 8: 4 x 24 register tiles
 * (12 sums for 4 broadcasts and 3 loads per k), then 16 and 8 columns, then single rows */
INLINE void mm_tile(int nr, int nv, int kd, int n, const float *x, const float *w, float *y) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) acc[r][v] = _mm256_setzero_ps();
    for (int k = 0; k < kd; k++) {
        __m256 b[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) b[v] = _mm256_loadu_ps(w + (ptrdiff_t)k * n + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < nr; r++) {
            __m256 a = _mm256_broadcast_ss(x + (ptrdiff_t)r * kd + k);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) acc[r][v] = _mm256_fmadd_ps(a, b[v], acc[r][v]);
        }
    }
#pragma GCC unroll 4
    for (int r = 0; r < nr; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) _mm256_storeu_ps(y + (ptrdiff_t)r * n + 8 * v, acc[r][v]);
}

INLINE void mm_row_group(int nr, int kd, int n, const float *x, const float *w, float *y) {
    int j = 0;
    for (; j + 24 <= n; j += 24) mm_tile(nr, 3, kd, n, x, w + j, y + j);
    if (j + 16 <= n) {
        mm_tile(nr, 2, kd, n, x, w + j, y + j);
        j += 16;
    }
    if (j + 8 <= n) mm_tile(nr, 1, kd, n, x, w + j, y + j);
}

static void matmul(int rows, int kd, int n, const float *x, const float *w, float *y) {
    int r = 0;
    for (; r + 4 <= rows; r += 4) mm_row_group(4, kd, n, x + (ptrdiff_t)r * kd, w, y + (ptrdiff_t)r * n);
    for (; r < rows; r++) mm_row_group(1, kd, n, x + (ptrdiff_t)r * kd, w, y + (ptrdiff_t)r * n);
}

/* ---- out [kd, n] += x [rows, kd]^T @ g [rows, n]: 4 x 24 tiles of sums over the rows */
INLINE void gram_tile(int nk, int nv, int rows, int kd, int n, const float *x, const float *g, float *out) {
    __m256 acc[4][3];
#pragma GCC unroll 4
    for (int i = 0; i < 4; i++)
#pragma GCC unroll 3
        for (int v = 0; v < 3; v++) acc[i][v] = _mm256_setzero_ps();
    for (int r = 0; r < rows; r++) {
        __m256 b[3];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) b[v] = _mm256_loadu_ps(g + (ptrdiff_t)r * n + 8 * v);
#pragma GCC unroll 4
        for (int i = 0; i < nk; i++) {
            __m256 a = _mm256_broadcast_ss(x + (ptrdiff_t)r * kd + i);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
        }
    }
#pragma GCC unroll 4
    for (int i = 0; i < nk; i++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            float *o = out + (ptrdiff_t)i * n + 8 * v;
            _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), acc[i][v]));
        }
}

INLINE void gram_row_group(int nk, int rows, int kd, int n, const float *x, const float *g, float *out) {
    int j = 0;
    for (; j + 24 <= n; j += 24) gram_tile(nk, 3, rows, kd, n, x, g + j, out + j);
    if (j + 16 <= n) {
        gram_tile(nk, 2, rows, kd, n, x, g + j, out + j);
        j += 16;
    }
    if (j + 8 <= n) gram_tile(nk, 1, rows, kd, n, x, g + j, out + j);
}

static void gram(int rows, int kd, int n, const float *x, const float *g, float *out) {
    int k = 0;
    for (; k + 4 <= kd; k += 4) gram_row_group(4, rows, kd, n, x + k, g, out + (ptrdiff_t)k * n);
    for (; k < kd; k++) gram_row_group(1, rows, kd, n, x + k, g, out + (ptrdiff_t)k * n);
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

/* forward: for each network b, the pools of x[b] ([h, w, ci]; either pool may be skipped with NULL)
 * and y[b] = x[b] @ weight ([ci, co]; skipped when y is NULL: the pools alone) */
void dws_pools_product(int networks, int h, int w, int ci, int co, const float *x, const float *weight,
                       float *y, float *row_max, int32_t *row_arg, float *col_max, int32_t *col_arg, int threads) {
    const ptrdiff_t cells = (ptrdiff_t)h * w;
#pragma omp parallel for num_threads(threads) schedule(static)
    for (int b = 0; b < networks; b++) {
        const float *xb = x + b * cells * ci;
        if (row_max) /* over w, for each row i */
            pools(h, (ptrdiff_t)w * ci, w, ci, ci, xb, row_max + (ptrdiff_t)b * h * ci, row_arg + (ptrdiff_t)b * h * ci);
        if (col_max) /* over h, for each column j */
            pools(w, ci, h, (ptrdiff_t)w * ci, ci, xb, col_max + (ptrdiff_t)b * w * ci, col_arg + (ptrdiff_t)b * w * ci);
        if (y) matmul((int)cells, ci, co, xb, weight, y + b * cells * co);
    }
}

/* backward: grad_x[b] = grad_y[b] @ weight^T (weight_t is [co, ci]) plus each pool's gradient at
 * its maximum; grad_weight = sum_b x[b]^T @ grad_y[b] (float sums per network, double across
 * networks). grad_y may be NULL (only the pools received gradients; then weight_t and x may be
 * NULL too); grad_x or grad_weight may be NULL (not wanted). */
void dws_pools_product_backward(int networks, int h, int w, int ci, int co, const float *x, const float *weight_t,
                                const float *grad_y, const float *grad_row, const int32_t *row_arg,
                                const float *grad_col, const int32_t *col_arg, float *grad_x, float *grad_weight,
                                int threads) {
    const ptrdiff_t cells = (ptrdiff_t)h * w, size = (ptrdiff_t)ci * co;
    const int want_weight = grad_weight != NULL && grad_y != NULL;
    double *total = want_weight ? calloc(size, sizeof(double)) : NULL;
#pragma omp parallel num_threads(threads)
    {
        float *local = want_weight ? malloc(sizeof(float) * size) : NULL;
        double *sum = want_weight ? calloc(size, sizeof(double)) : NULL;
#pragma omp for schedule(static)
        for (int b = 0; b < networks; b++) {
            const float *xb = x ? x + b * cells * ci : NULL, *gb = grad_y ? grad_y + b * cells * co : NULL;
            float *gxb = grad_x ? grad_x + b * cells * ci : NULL;
            if (local) memset(local, 0, sizeof(float) * size);
            if (gb) {
                for (ptrdiff_t r = 0; r < cells; r += ROW_BLOCK) {
                    int rows = cells - r < ROW_BLOCK ? (int)(cells - r) : ROW_BLOCK;
                    if (gxb) matmul(rows, co, ci, gb + r * co, weight_t, gxb + r * ci);
                    if (local) gram(rows, ci, co, xb + r * ci, gb + r * co, local);
                }
            } else if (gxb) {
                memset(gxb, 0, sizeof(float) * cells * ci);
            }
            if (gxb && grad_row) {
                const float *g = grad_row + (ptrdiff_t)b * h * ci;
                const int32_t *a = row_arg + (ptrdiff_t)b * h * ci;
                for (int i = 0; i < h; i++)
                    for (int k = 0; k < ci; k++) gxb[((ptrdiff_t)i * w + a[i * ci + k]) * ci + k] += g[i * ci + k];
            }
            if (gxb && grad_col) {
                const float *g = grad_col + (ptrdiff_t)b * w * ci;
                const int32_t *a = col_arg + (ptrdiff_t)b * w * ci;
                for (int j = 0; j < w; j++)
                    for (int k = 0; k < ci; k++) gxb[((ptrdiff_t)a[j * ci + k] * w + j) * ci + k] += g[j * ci + k];
            }
            if (local)
                for (ptrdiff_t k = 0; k < size; k++) sum[k] += local[k];
        }
        if (sum) {
#pragma omp critical
            for (ptrdiff_t k = 0; k < size; k++) total[k] += sum[k];
        }
        free(local);
        free(sum);
    }
    if (want_weight) {
        for (ptrdiff_t k = 0; k < size; k++) grad_weight[k] = (float)total[k];
        free(total);
    }
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
                                              _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_GT_OQ));
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

/* out [2c] = the two per-channel sums of `kind` over the whole input (see channel_sums) */
static void all_channel_sums(int kind, const Input *in, const float *gz, const float *ref, const float *scale,
                             const float *shift, double *out, int threads) {
    const int c = in->c;
    const ptrdiff_t groups = (ptrdiff_t)in->networks * in->h, block = groups_per_block(in);
    memset(out, 0, sizeof(double) * 2 * c);
#pragma omp parallel num_threads(threads)
    {
        double *part = calloc(2 * (size_t)c, sizeof(double));
#pragma omp for schedule(static)
        for (ptrdiff_t g0 = 0; g0 < groups; g0 += block) {
            ptrdiff_t g1 = g0 + block < groups ? g0 + block : groups;
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
#pragma omp critical
        for (int k = 0; k < 2 * c; k++) out[k] += part[k];
        free(part);
    }
}

/* forward: batch statistics of the input (at least 2 rows), z [rows, c] = relu(batch_norm(v));
 * mean and invstd are returned per channel for the backward. Where running_mean is not NULL, the
 * running statistics are updated as nn.BatchNorm1d does: r = (1 - factor) r + factor s, with the
 * unbiased variance. */
void dws_bn_relu_forward(int networks, int h, int w, int c, const float *y, const float *row, const float *col,
                         const float *gamma, const float *beta, float eps, float *z, float *mean, float *invstd,
                         float *running_mean, float *running_var, float factor, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const ptrdiff_t n = input_rows(&in), groups = (ptrdiff_t)networks * h, block = groups_per_block(&in);
    double *sums = malloc(sizeof(double) * 2 * c);
    float *ref = malloc(sizeof(float) * c), *scale = malloc(sizeof(float) * c), *shift = malloc(sizeof(float) * c);
    for (int ch = 0; ch < c; ch += 8) _mm256_storeu_ps(ref + ch, input_value(&in, 0, 0, ch));
    all_channel_sums(SUMS_MOMENTS, &in, NULL, ref, NULL, NULL, sums, threads); /* centred on the first row */
    for (int k = 0; k < c; k++) {
        double m = sums[k] / n, v = sums[c + k] / n - m * m;
        v = v > 0 ? v : 0;
        mean[k] = (float)(ref[k] + m);
        invstd[k] = (float)(1.0 / __builtin_sqrt(v + eps));
        scale[k] = gamma[k] * invstd[k];
        shift[k] = beta[k] - mean[k] * scale[k];
        if (running_mean) {
            running_mean[k] = (1 - factor) * running_mean[k] + factor * mean[k];
            running_var[k] = (1 - factor) * running_var[k] + factor * (float)(v * n / (n - 1));
        }
    }
#pragma omp parallel for num_threads(threads) schedule(static)
    for (ptrdiff_t g0 = 0; g0 < groups; g0 += block) {
        ptrdiff_t g1 = g0 + block < groups ? g0 + block : groups;
        for (ptrdiff_t g = g0; g < g1; g++)
            for (int j = 0; j < w; j++)
                for (int ch = 0; ch < c; ch += 8) {
                    __m256 u = _mm256_fmadd_ps(input_value(&in, g, j, ch), _mm256_loadu_ps(scale + ch),
                                               _mm256_loadu_ps(shift + ch));
                    _mm256_storeu_ps(z + (g * w + j) * c + ch, _mm256_max_ps(u, _mm256_setzero_ps()));
                }
    }
    free(sums);
    free(ref);
    free(scale);
    free(shift);
}

/* backward of the forward above, given its mean and invstd: grad_y [rows, c] (the gradient of v),
 * grad_gamma, grad_beta, and grad_row [networks, h, c] / grad_col [networks, w, c] where the
 * forward had those terms (NULL otherwise) */
void dws_bn_relu_backward(int networks, int h, int w, int c, const float *y, const float *row, const float *col,
                          const float *grad_z, const float *gamma, const float *beta, const float *mean,
                          const float *invstd, float *grad_y, float *grad_row, float *grad_col, float *grad_gamma,
                          float *grad_beta, int threads) {
    const Input in = {networks, h, w, c, y, row, col};
    const ptrdiff_t n = input_rows(&in), groups = (ptrdiff_t)networks * h, block = groups_per_block(&in);
    double *sums = malloc(sizeof(double) * 2 * c);
    float *scale = malloc(sizeof(float) * c), *shift = malloc(sizeof(float) * c);
    float *a = malloc(sizeof(float) * c), *b = malloc(sizeof(float) * c);
    for (int k = 0; k < c; k++) {
        scale[k] = gamma[k] * invstd[k];
        shift[k] = beta[k] - mean[k] * scale[k];
    }
    all_channel_sums(SUMS_BACKWARD, &in, grad_z, mean, scale, shift, sums, threads);
    for (int k = 0; k < c; k++) {  /* grad_v = scale gu - scale mean(gu) - scale vhat mean(gu vhat) */
        grad_beta[k] = (float)sums[k];
        grad_gamma[k] = (float)(sums[c + k] * invstd[k]);
        a[k] = (float)(scale[k] * sums[k] / n);
        b[k] = (float)(scale[k] * (double)invstd[k] * invstd[k] * sums[c + k] / n);
    }
    if (grad_col) memset(grad_col, 0, sizeof(float) * networks * w * c);
#pragma omp parallel for num_threads(threads) schedule(static)
    for (ptrdiff_t g0 = 0; g0 < groups; g0 += block) {
        ptrdiff_t g1 = g0 + block < groups ? g0 + block : groups;
        for (ptrdiff_t g = g0; g < g1; g++) {
            if (grad_row) memset(grad_row + g * c, 0, sizeof(float) * c);
            for (int j = 0; j < w; j++)
                for (int ch = 0; ch < c; ch += 8) {
                    __m256 x = input_value(&in, g, j, ch), sc = _mm256_loadu_ps(scale + ch);
                    __m256 u = _mm256_fmadd_ps(x, sc, _mm256_loadu_ps(shift + ch));
                    ptrdiff_t at = (g * w + j) * c + ch;
                    __m256 gu = _mm256_and_ps(_mm256_loadu_ps(grad_z + at),
                                              _mm256_cmp_ps(u, _mm256_setzero_ps(), _CMP_GT_OQ));
                    __m256 d = _mm256_sub_ps(x, _mm256_loadu_ps(mean + ch));
                    __m256 gv = _mm256_fnmadd_ps(d, _mm256_loadu_ps(b + ch), _mm256_fmsub_ps(gu, sc, _mm256_loadu_ps(a + ch)));
                    _mm256_storeu_ps(grad_y + at, gv);
                    if (grad_row) {
                        float *o = grad_row + g * c + ch;
                        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), gv));
                    }
                    if (grad_col) {
                        float *o = grad_col + ((g / h) * w + j) * c + ch;
                        _mm256_storeu_ps(o, _mm256_add_ps(_mm256_loadu_ps(o), gv));
                    }
                }
        }
    }
    free(sums);
    free(scale);
    free(shift);
    free(a);
    free(b);
}
