/* One SIREN fitting step for K networks, one network at a time, on a CPU with AVX2 and FMA.
 *
 * Built and loaded by zoo/fit/native.py (which documents why it exists); the math is that of
 * zoo.fit.siren.mse_and_grads: per-network MSE and the gradients of their sum. A network's whole
 * step (forward, loss, backward) runs before the next network's, so its activations (~100 KB per
 * hidden layer for a 28x28 image) stay in the core's L2 cache instead of streaming through memory
 * between stages, and every matmul ends in its elementwise stage (bias + sine + cosine in the
 * forward, times w0 * cosine in the backward) while its tile is still in registers.
 *
 * Layout (all float32, C-contiguous): weights[m] [K, d_{m+1}, d_m] (PyTorch out x in),
 * biases[m] [K, d_{m+1}], targets [K, P, d_L]; gradients as their parameters. Requirements
 * (checked by the caller): hidden widths d_1..d_{L-1} multiples of 4, P a multiple of 8.
 */
#include <immintrin.h>
#include <stddef.h>
#include <string.h>

#define INLINE static inline __attribute__((always_inline))
#define MAX_COLUMN_VECTORS 3 /* a matmul tile is 4 rows x up to 24 columns: 12 accumulators */

/* ---- sine and cosine of 8 floats: the Cody-Waite reduction by pi/2 and Cephes' single-precision
 * minimax polynomials, as zoo/fit/triton_step.py computes them on a GPU (max error ~1e-7 for a SIREN's
 * pre-activations). */
INLINE void sincos8(__m256 x, __m256 *sin_out, __m256 *cos_out) {
    const __m256 half = _mm256_set1_ps(0.5f), one = _mm256_set1_ps(1.0f);
    const __m256 sign_bit = _mm256_set1_ps(-0.0f), shifter = _mm256_set1_ps(12582912.0f); /* 1.5 * 2^23 */
    /* q = round(x * 2/pi): adding 1.5 * 2^23 rounds to an integer, held in the low mantissa bits */
    __m256 shifted = _mm256_fmadd_ps(x, _mm256_set1_ps(0.6366197723675814f), shifter);
    __m256 q = _mm256_sub_ps(shifted, shifter);
    __m256i quadrant = _mm256_castps_si256(shifted);
    __m256 r = _mm256_fnmadd_ps(q, _mm256_set1_ps(1.5703125f), x);
    r = _mm256_fnmadd_ps(q, _mm256_set1_ps(4.837512969970703125e-4f), r);
    r = _mm256_fnmadd_ps(q, _mm256_set1_ps(7.54978995489188216e-8f), r);
    __m256 z = _mm256_mul_ps(r, r);
    __m256 ps = _mm256_fmadd_ps(z, _mm256_set1_ps(-1.9515295891e-4f), _mm256_set1_ps(8.3321608736e-3f));
    ps = _mm256_fmadd_ps(z, ps, _mm256_set1_ps(-1.6666654611e-1f));
    __m256 s = _mm256_fmadd_ps(_mm256_mul_ps(r, z), ps, r);
    __m256 pc = _mm256_fmadd_ps(z, _mm256_set1_ps(2.443315711809948e-5f), _mm256_set1_ps(-1.388731625493765e-3f));
    pc = _mm256_fmadd_ps(z, pc, _mm256_set1_ps(4.166664568298827e-2f));
    __m256 c = _mm256_fmadd_ps(_mm256_mul_ps(z, z), pc, _mm256_fnmadd_ps(half, z, one));
    /* odd quadrants swap sine and cosine (blendv reads only bit 31, so bit 0 moves there); bit 1
     * of the quadrant (of quadrant + 1 for the cosine) is the sign */
    __m256 swap = _mm256_castsi256_ps(_mm256_slli_epi32(quadrant, 31));
    __m256 sin_x = _mm256_blendv_ps(s, c, swap), cos_x = _mm256_blendv_ps(c, s, swap);
    __m256 sin_sign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(quadrant, 30)), sign_bit);
    __m256i next = _mm256_add_epi32(quadrant, _mm256_set1_epi32(1));
    __m256 cos_sign = _mm256_and_ps(_mm256_castsi256_ps(_mm256_slli_epi32(next, 30)), sign_bit);
    *sin_out = _mm256_xor_ps(sin_x, sin_sign);
    *cos_out = _mm256_xor_ps(cos_x, cos_sign);
}

INLINE __m256i first_lanes(int n) { /* mask of the first n (0..8) lanes */
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

INLINE float hsum8(__m256 v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

/* sin and cos of n floats (any n) */
static void sincos_array(const float *x, int n, float *sin_out, float *cos_out) {
    __m256 s, c;
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        sincos8(_mm256_loadu_ps(x + i), &s, &c);
        _mm256_storeu_ps(sin_out + i, s);
        _mm256_storeu_ps(cos_out + i, c);
    }
    if (i < n) {
        __m256i mask = first_lanes(n - i);
        sincos8(_mm256_maskload_ps(x + i, mask), &s, &c);
        _mm256_maskstore_ps(sin_out + i, mask, s);
        _mm256_maskstore_ps(cos_out + i, mask, c);
    }
}

/* ---- matmul tiles: acc[4][nv] = A[4 rows, kd] @ B[kd, 8 * nv columns], where A's element (r, k)
 * is a[r * a_row + k * a_k] (a row-major matrix or its transpose) and B's rows are ldb apart. */
INLINE void matmul_tile(int nv, const float *a, ptrdiff_t a_row, ptrdiff_t a_k, const float *b, ptrdiff_t ldb,
                        int kd, __m256 acc[4][MAX_COLUMN_VECTORS]) {
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++)
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) acc[r][v] = _mm256_setzero_ps();
    for (int k = 0; k < kd; k++) {
        const float *row = b + k * ldb;
        __m256 bv[MAX_COLUMN_VECTORS];
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) bv[v] = _mm256_loadu_ps(row + 8 * v);
#pragma GCC unroll 4
        for (int r = 0; r < 4; r++) {
            __m256 av = _mm256_broadcast_ss(a + r * a_row + k * a_k);
#pragma GCC unroll 3
            for (int v = 0; v < nv; v++) acc[r][v] = _mm256_fmadd_ps(av, bv[v], acc[r][v]);
        }
    }
}

/* ---- a layer's product and its elementwise stage, tile by tile while the tile is in registers:
 *   SINE:     out, out_cos = sin, cos of w0 * (A @ B + bias)        (a forward sine layer)
 *   BACKPROP: out = (A @ B) * w0 * cos, or A @ B where cos is NULL  (a backward step, A = W^T) */
enum { EPILOGUE_SINE, EPILOGUE_BACKPROP };

typedef struct {
    const float *a;        /* A's element (r, k) is a[r * a_row + k * a_k] */
    ptrdiff_t a_row, a_k;
    int kd, n;             /* B is [kd, n], row-major */
    const float *b, *bias, *cos;
    float w0;
    float *out, *out_cos;  /* [m, n] */
} Product;

INLINE void product_tile(int epilogue, int nv, const Product *p, int i, int j) {
    __m256 acc[4][MAX_COLUMN_VECTORS], s, c;
    matmul_tile(nv, p->a + i * p->a_row, p->a_row, p->a_k, p->b + j, p->n, p->kd, acc);
    __m256 w0v = _mm256_set1_ps(p->w0);
#pragma GCC unroll 4
    for (int r = 0; r < 4; r++) {
        ptrdiff_t at = (ptrdiff_t)(i + r) * p->n + j;
        __m256 b = epilogue == EPILOGUE_SINE ? _mm256_set1_ps(p->bias[i + r]) : _mm256_setzero_ps();
#pragma GCC unroll 3
        for (int v = 0; v < nv; v++) {
            if (epilogue == EPILOGUE_SINE) {
                sincos8(_mm256_mul_ps(w0v, _mm256_add_ps(acc[r][v], b)), &s, &c);
                _mm256_storeu_ps(p->out + at + 8 * v, s);
                _mm256_storeu_ps(p->out_cos + at + 8 * v, c);
            } else {
                __m256 value = acc[r][v];
                if (p->cos) value = _mm256_mul_ps(value, _mm256_mul_ps(w0v, _mm256_loadu_ps(p->cos + at + 8 * v)));
                _mm256_storeu_ps(p->out + at + 8 * v, value);
            }
        }
    }
}

/* all m rows (a multiple of 4) and n columns (a multiple of 8): 24-column tiles, then 16 and 8 */
INLINE void product(int epilogue, int m, const Product *p) {
    int j = 0;
    for (; j + 24 <= p->n; j += 24)
        for (int i = 0; i < m; i += 4) product_tile(epilogue, 3, p, i, j);
    if (j + 16 <= p->n) {
        for (int i = 0; i < m; i += 4) product_tile(epilogue, 2, p, i, j);
        j += 16;
    }
    if (j + 8 <= p->n)
        for (int i = 0; i < m; i += 4) product_tile(epilogue, 1, p, i, j);
}

/* s_out, c_out [m, n] = sin, cos(w0 * (w [m, kd] @ x [kd, n] + bias)) */
static void sine_layer(int m, int kd, int n, const float *w, const float *bias, float w0, const float *x,
                       float *s_out, float *c_out) {
    Product p = {.a = w, .a_row = kd, .a_k = 1, .kd = kd, .n = n, .b = x, .bias = bias, .w0 = w0,
                 .out = s_out, .out_cos = c_out};
    product(EPILOGUE_SINE, m, &p);
}

/* out [m, n] = (w [kd, m])^T @ g [kd, n], times w0 * cos [m, n] unless cos is NULL */
static void backprop_layer(int m, int kd, int n, const float *w, const float *g, const float *cos, float w0,
                           float *out) {
    Product p = {.a = w, .a_row = 1, .a_k = m, .kd = kd, .n = n, .b = g, .cos = cos, .w0 = w0, .out = out};
    product(EPILOGUE_BACKPROP, m, &p);
}

/* out[r, c] = sum_p g[r, p] x[c, p] for an rm x rc block (a long reduction: rm * rc accumulators;
 * 4 x 3 keeps 12 sums going for 7 loads, where 4 x 2 streamed 6 loads per 8 from L2) */
INLINE void gram_tile(int rm, int rc, const float *g, const float *x, int p_count, float *out, int ldo) {
    __m256 acc[4][4];
#pragma GCC unroll 4
    for (int r = 0; r < rm; r++)
#pragma GCC unroll 4
        for (int c = 0; c < rc; c++) acc[r][c] = _mm256_setzero_ps();
    for (int p = 0; p < p_count; p += 8) {
        __m256 xv[4];
#pragma GCC unroll 4
        for (int c = 0; c < rc; c++) xv[c] = _mm256_loadu_ps(x + (ptrdiff_t)c * p_count + p);
#pragma GCC unroll 4
        for (int r = 0; r < rm; r++) {
            __m256 gv = _mm256_loadu_ps(g + (ptrdiff_t)r * p_count + p);
#pragma GCC unroll 4
            for (int c = 0; c < rc; c++) acc[r][c] = _mm256_fmadd_ps(gv, xv[c], acc[r][c]);
        }
    }
    for (int r = 0; r < rm; r++)
        for (int c = 0; c < rc; c++) out[r * ldo + c] = hsum8(acc[r][c]);
}

/* rows i..i+rm-1 of out [m, mc]: rm x rc tiles, then pairs and single columns */
INLINE void gram_rows(int rm, int rc, const float *g, const float *x, int p_count, int mc, int i, float *out) {
    const float *gi = g + (ptrdiff_t)i * p_count;
    int c = 0;
    for (; c + rc <= mc; c += rc) gram_tile(rm, rc, gi, x + (ptrdiff_t)c * p_count, p_count, out + i * mc + c, mc);
    for (; rc > 2 && c + 2 <= mc; c += 2) gram_tile(rm, 2, gi, x + (ptrdiff_t)c * p_count, p_count, out + i * mc + c, mc);
    for (; c < mc; c++) gram_tile(rm, 1, gi, x + (ptrdiff_t)c * p_count, p_count, out + i * mc + c, mc);
}

/* out [m, mc] = g [m, p] @ x [mc, p]^T (a weight gradient) */
static void gram(int m, int mc, int p_count, const float *g, const float *x, float *out) {
    int i = 0;
    for (; i + 4 <= m; i += 4) gram_rows(4, 3, g, x, p_count, mc, i, out);
    switch (m - i) { /* the last 1-3 rows (an output layer's): wider column tiles keep 6-8 sums going */
        case 3: gram_rows(3, 2, g, x, p_count, mc, i, out); break;
        case 2: gram_rows(2, 4, g, x, p_count, mc, i, out); break;
        case 1: gram_rows(1, 4, g, x, p_count, mc, i, out); break;
    }
}

static void row_sums(int m, int p_count, const float *g, float *out) {
    for (int r = 0; r < m; r++) {
        __m256 acc = _mm256_setzero_ps();
        for (int p = 0; p < p_count; p += 8) acc = _mm256_add_ps(acc, _mm256_loadu_ps(g + (ptrdiff_t)r * p_count + p));
        out[r] = hsum8(acc);
    }
}

/* ---- the first layer on a row-major H x W grid: sin(r_i + c_j) = sin r_i cos c_j + cos r_i sin c_j,
 * with r_i = w0 (W[d, 0] y_i + b_d) and c_j = w0 W[d, 1] x_j; the row and column tables are kept
 * for the backward, so the first layer's cosines are never materialized. */
typedef struct {
    float *sin_row, *cos_row; /* [d_1, H] */
    float *sin_col, *cos_col; /* [d_1, W] */
    float *args;              /* d_1 * max(H, W) */
} GridTables;

static void grid_layer(int d1, int h, int wd, const float *ys, const float *xs, const float *w, const float *bias,
                       float w0, float *act, GridTables *t) {
    /* every unit's column and row arguments, then their sines and cosines in one pass each */
    for (int d = 0; d < d1; d++)
        for (int j = 0; j < wd; j++) t->args[d * wd + j] = (w0 * w[2 * d + 1]) * xs[j];
    sincos_array(t->args, d1 * wd, t->sin_col, t->cos_col);
    for (int d = 0; d < d1; d++)
        for (int i = 0; i < h; i++) t->args[d * h + i] = (w0 * w[2 * d]) * ys[i] + w0 * bias[d];
    sincos_array(t->args, d1 * h, t->sin_row, t->cos_row);
    int p_count = h * wd;
    __m256i tail = first_lanes(wd % 8);
    for (int d = 0; d < d1; d++) {
        const float *sc = t->sin_col + d * wd, *cc = t->cos_col + d * wd, *sr = t->sin_row + d * h, *cr = t->cos_row + d * h;
        for (int i = 0; i < h; i++) {
            __m256 s = _mm256_set1_ps(sr[i]), c = _mm256_set1_ps(cr[i]);
            float *row = act + (ptrdiff_t)d * p_count + i * wd;
            int j = 0;
            for (; j + 8 <= wd; j += 8)
                _mm256_storeu_ps(row + j, _mm256_fmadd_ps(s, _mm256_loadu_ps(cc + j), _mm256_mul_ps(c, _mm256_loadu_ps(sc + j))));
            if (j < wd) /* a full-width store (masked stores are slow on some CPUs): its spill into the
                         * next row is overwritten next, and the activations are followed by padding */
                _mm256_storeu_ps(row + j, _mm256_fmadd_ps(s, _mm256_maskload_ps(cc + j, tail),
                                                          _mm256_mul_ps(c, _mm256_maskload_ps(sc + j, tail))));
        }
    }
}

/* First-layer gradients on a grid from u = dLoss/d(activation) [d_1, H*W]. The cosine of pixel
 * (i, j) is cos r_i cos c_j - sin r_i sin c_j, so with the column sums
 *   B_c[j] = sum_i u_ij cos r_i, B_s[j] = sum_i u_ij sin r_i  (and A_c, A_s: the same times y_i)
 * the bias gradient is sum_j (B_c cos c_j - B_s sin c_j), the y weight's the same with A, and the x
 * weight's the bias sum weighted by x_j: four column accumulators, no per-pixel cosine. */
/* Column vectors v0 .. v0+nv-1 (nv = 1 or 2: 8 accumulators in registers) of one unit's sums. */
INLINE void grid_grad_columns(int nv, int v0, int h, int wd, const float *ys, const float *xs, const float *plane,
                              const float *sr, const float *cr, const float *sc, const float *cc,
                              __m256 *gy, __m256 *gx, __m256 *gb) {
    __m256i mask[2];
    __m256 bc[2], bs[2], ac[2], as[2];
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++) {
        mask[v] = first_lanes(wd - 8 * (v0 + v));
        bc[v] = bs[v] = ac[v] = as[v] = _mm256_setzero_ps();
    }
    for (int i = 0; i < h; i++) {
        __m256 c = _mm256_set1_ps(cr[i]), s = _mm256_set1_ps(sr[i]), y = _mm256_set1_ps(ys[i]);
        __m256 cy = _mm256_mul_ps(c, y), sy = _mm256_mul_ps(s, y);
        const float *row = plane + i * wd + 8 * v0;
#pragma GCC unroll 2
        for (int v = 0; v < nv; v++) {
            __m256 g = _mm256_maskload_ps(row + 8 * v, mask[v]);
            bc[v] = _mm256_fmadd_ps(g, c, bc[v]);
            bs[v] = _mm256_fmadd_ps(g, s, bs[v]);
            ac[v] = _mm256_fmadd_ps(g, cy, ac[v]);
            as[v] = _mm256_fmadd_ps(g, sy, as[v]);
        }
    }
#pragma GCC unroll 2
    for (int v = 0; v < nv; v++) {
        int j = 8 * (v0 + v);
        __m256 cosc = _mm256_maskload_ps(cc + j, mask[v]), sinc = _mm256_maskload_ps(sc + j, mask[v]);
        __m256 per_col = _mm256_fmsub_ps(bc[v], cosc, _mm256_mul_ps(bs[v], sinc));
        *gb = _mm256_add_ps(*gb, per_col);
        *gx = _mm256_fmadd_ps(per_col, _mm256_maskload_ps(xs + j, mask[v]), *gx);
        *gy = _mm256_add_ps(*gy, _mm256_fmsub_ps(ac[v], cosc, _mm256_mul_ps(as[v], sinc)));
    }
}

/* First-layer gradients on a grid from u = dLoss/d(activation) [d_1, H*W]. The cosine of pixel
 * (i, j) is cos r_i cos c_j - sin r_i sin c_j, so with the column sums
 *   B_c[j] = sum_i u_ij cos r_i, B_s[j] = sum_i u_ij sin r_i  (and A_c, A_s: the same times y_i)
 * the bias gradient is sum_j (B_c cos c_j - B_s sin c_j), the y weight's the same with A, and the x
 * weight's the bias sum weighted by x_j: four column accumulators, no per-pixel cosine. */
static void grid_layer_grads(int d1, int h, int wd, const float *ys, const float *xs, float w0, const float *u,
                             const GridTables *t, float *grad_w, float *grad_b) {
    int p_count = h * wd, vectors = (wd + 7) / 8;
    for (int d = 0; d < d1; d++) {
        const float *sc = t->sin_col + d * wd, *cc = t->cos_col + d * wd, *sr = t->sin_row + d * h, *cr = t->cos_row + d * h;
        const float *plane = u + (ptrdiff_t)d * p_count;
        __m256 gy = _mm256_setzero_ps(), gb = _mm256_setzero_ps(), gx = _mm256_setzero_ps();
        int v0 = 0;
        for (; v0 + 2 <= vectors; v0 += 2) grid_grad_columns(2, v0, h, wd, ys, xs, plane, sr, cr, sc, cc, &gy, &gx, &gb);
        if (v0 < vectors) grid_grad_columns(1, v0, h, wd, ys, xs, plane, sr, cr, sc, cc, &gy, &gx, &gb);
        grad_w[2 * d] = w0 * hsum8(gy);
        grad_w[2 * d + 1] = w0 * hsum8(gx);
        grad_b[d] = w0 * hsum8(gb);
    }
}

/* One output channel over 8 * nv points from p: y = wo . act + bias, err = y - target; adds err^2
 * to *sq and stores scale * err (nv independent accumulators: the d_last-long sum is a chain). */
INLINE void output_block(int nv, const float *wo, float bias, const float *act, int d_last, int p_count, int p,
                         const float *target, float scale, float *g_out, __m256 *sq) {
    __m256 y[4];
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) y[v] = _mm256_set1_ps(bias);
    for (int i = 0; i < d_last; i++) {
        __m256 wi = _mm256_set1_ps(wo[i]);
#pragma GCC unroll 4
        for (int v = 0; v < nv; v++) y[v] = _mm256_fmadd_ps(wi, _mm256_loadu_ps(act + (ptrdiff_t)i * p_count + p + 8 * v), y[v]);
    }
#pragma GCC unroll 4
    for (int v = 0; v < nv; v++) {
        __m256 err = _mm256_sub_ps(y[v], _mm256_loadu_ps(target + p + 8 * v));
        *sq = _mm256_fmadd_ps(err, err, *sq);
        _mm256_storeu_ps(g_out + p + 8 * v, _mm256_mul_ps(err, _mm256_set1_ps(scale)));
    }
}

/* ---- the whole step */
typedef struct {
    int layers;           /* L >= 2 */
    const int *widths;    /* L + 1 */
    int points;           /* P */
    int grid_h, grid_w;   /* > 0: the coordinates are a row-major grid (P = H * W) */
    const float *ys, *xs; /* the grid's axes */
    const float *coords;  /* [d_0, P] when not on a grid */
    float w0_first, w0_hidden, output_offset;
} SirenShape;

#define MAX_LAYERS 64
#define PADDING 8 /* floats after each activation buffer (see grid_layer) */

static int max_hidden(const SirenShape *s) {
    int widest = 0;
    for (int m = 1; m < s->layers; m++)
        if (s->widths[m] > widest) widest = s->widths[m];
    return widest;
}

/* Floats of scratch memory zoo_siren_step needs (for one network: it is reused). */
long zoo_siren_scratch_floats(const SirenShape *s) {
    long p = s->points, total = 0;
    for (int m = 1; m < s->layers; m++) total += 2 * (long)s->widths[m] * p + PADDING; /* activations, cosines */
    total += 2 * (long)s->widths[s->layers] * p;                             /* output gradient, targets */
    total += 2 * (long)max_hidden(s) * p;                                    /* two backward buffers */
    total += 2 * (long)s->widths[1] * (s->grid_h + s->grid_w);               /* grid tables */
    total += (long)s->widths[1] * (s->grid_h > s->grid_w ? s->grid_h : s->grid_w) + 64; /* their arguments */
    return total;
}

int zoo_siren_step(const SirenShape *s, int networks, float *const *weights, float *const *biases,
                   const float *targets, float *mse, float *const *grad_w, float *const *grad_b, float *scratch) {
    const int L = s->layers, P = s->points, *d = s->widths, d_out = s->widths[s->layers];
    const int grid = s->grid_h > 0;
    if (L < 2 || L > MAX_LAYERS || P % 8 != 0 || (grid && (d[0] != 2 || s->grid_h * s->grid_w != P))) return -1;
    for (int m = 1; m < L; m++)
        if (d[m] % 4 != 0) return -1;

    float *act[MAX_LAYERS], *cos[MAX_LAYERS]; /* output of sine layer m (width d_{m+1}) and its cosine */
    float *cursor = scratch;
    for (int m = 0; m < L - 1; m++) {
        act[m] = cursor, cursor += (ptrdiff_t)d[m + 1] * P + PADDING;
        cos[m] = cursor, cursor += (ptrdiff_t)d[m + 1] * P;
    }
    float *g_out = cursor; cursor += (ptrdiff_t)d_out * P;
    float *target = cursor; cursor += (ptrdiff_t)d_out * P;
    float *back[2]; back[0] = cursor; cursor += (ptrdiff_t)max_hidden(s) * P;
    back[1] = cursor; cursor += (ptrdiff_t)max_hidden(s) * P;
    GridTables t = {0};
    if (grid) {
        t.sin_row = cursor, cursor += d[1] * s->grid_h;
        t.cos_row = cursor, cursor += d[1] * s->grid_h;
        t.sin_col = cursor, cursor += d[1] * s->grid_w;
        t.cos_col = cursor, cursor += d[1] * s->grid_w;
        t.args = cursor, cursor += d[1] * (s->grid_h > s->grid_w ? s->grid_h : s->grid_w);
    }
    const float scale = 2.0f / ((float)P * (float)d_out); /* d(sum_k mse_k)/dy = scale * err */

    for (int k = 0; k < networks; k++) {
        const float *w[MAX_LAYERS], *b[MAX_LAYERS];
        float *gw[MAX_LAYERS], *gb[MAX_LAYERS];
        for (int m = 0; m < L; m++) {
            w[m] = weights[m] + (ptrdiff_t)k * d[m + 1] * d[m];
            b[m] = biases[m] + (ptrdiff_t)k * d[m + 1];
            gw[m] = grad_w[m] + (ptrdiff_t)k * d[m + 1] * d[m];
            gb[m] = grad_b[m] + (ptrdiff_t)k * d[m + 1];
        }
        /* forward: the first layer */
        if (grid) {
            grid_layer(d[1], s->grid_h, s->grid_w, s->ys, s->xs, w[0], b[0], s->w0_first, act[0], &t);
        } else {
            __m256 w0v = _mm256_set1_ps(s->w0_first), sv, cv;
            for (int r = 0; r < d[1]; r++)
                for (int p = 0; p < P; p += 8) {
                    __m256 z = _mm256_setzero_ps();
                    for (int i = 0; i < d[0]; i++)
                        z = _mm256_fmadd_ps(_mm256_set1_ps(w[0][r * d[0] + i]), _mm256_loadu_ps(s->coords + (ptrdiff_t)i * P + p), z);
                    sincos8(_mm256_mul_ps(w0v, _mm256_add_ps(z, _mm256_set1_ps(b[0][r]))), &sv, &cv);
                    _mm256_storeu_ps(act[0] + (ptrdiff_t)r * P + p, sv);
                    _mm256_storeu_ps(cos[0] + (ptrdiff_t)r * P + p, cv);
                }
        }
        /* hidden sine layers */
        for (int m = 1; m < L - 1; m++) sine_layer(d[m + 1], d[m], P, w[m], b[m], s->w0_hidden, act[m - 1], act[m], cos[m]);
        /* linear output layer, error, loss */
        const float *last = act[L - 2];
        const int d_last = d[L - 1];
        const float *t_k = targets + (ptrdiff_t)k * P * d_out;
        for (int p = 0; p < P; p++)
            for (int o = 0; o < d_out; o++) target[(ptrdiff_t)o * P + p] = t_k[(ptrdiff_t)p * d_out + o];
        double squares = 0.0;
        for (int o = 0; o < d_out; o++) {
            const float *wo = w[L - 1] + o * d_last;
            float bias = b[L - 1][o] + s->output_offset;
            __m256 sq = _mm256_setzero_ps();
            int p = 0;
            for (; p + 32 <= P; p += 32)
                output_block(4, wo, bias, last, d_last, P, p, target + (ptrdiff_t)o * P, scale, g_out + (ptrdiff_t)o * P, &sq);
            for (; p < P; p += 8)
                output_block(1, wo, bias, last, d_last, P, p, target + (ptrdiff_t)o * P, scale, g_out + (ptrdiff_t)o * P, &sq);
            squares += hsum8(sq);
        }
        mse[k] = (float)(squares / ((double)P * d_out));
        /* backward: the output layer */
        gram(d_out, d_last, P, g_out, last, gw[L - 1]);
        row_sums(d_out, P, g_out, gb[L - 1]);
        /* dLoss/d(pre-activation of sine layer L-2): w0 * cos * (W_out^T g_out); on a grid's first
         * layer, dLoss/d(activation) (the grid gradient applies its own cosines) */
        int first_on_grid = grid && L == 2;
        float *g = back[0];
        {
            __m256 w0v = _mm256_set1_ps(L == 2 ? s->w0_first : s->w0_hidden);
            for (int r = 0; r < d_last; r++)
                for (int p = 0; p < P; p += 8) {
                    __m256 acc = _mm256_setzero_ps();
                    for (int o = 0; o < d_out; o++)
                        acc = _mm256_fmadd_ps(_mm256_set1_ps(w[L - 1][o * d_last + r]), _mm256_loadu_ps(g_out + (ptrdiff_t)o * P + p), acc);
                    if (!first_on_grid) acc = _mm256_mul_ps(acc, _mm256_mul_ps(w0v, _mm256_loadu_ps(cos[L - 2] + (ptrdiff_t)r * P + p)));
                    _mm256_storeu_ps(g + (ptrdiff_t)r * P + p, acc);
                }
        }
        /* hidden sine layers, last to second */
        for (int m = L - 2; m >= 1; m--) {
            gram(d[m + 1], d[m], P, g, act[m - 1], gw[m]);
            row_sums(d[m + 1], P, g, gb[m]);
            float *next = g == back[0] ? back[1] : back[0];
            int below_on_grid = grid && m == 1;
            backprop_layer(d[m], d[m + 1], P, w[m], g, below_on_grid ? NULL : cos[m - 1],
                           m == 1 ? s->w0_first : s->w0_hidden, next);
            g = next;
        }
        /* the first layer */
        if (grid) {
            grid_layer_grads(d[1], s->grid_h, s->grid_w, s->ys, s->xs, s->w0_first, g, &t, gw[0], gb[0]);
        } else {
            gram(d[1], d[0], P, g, s->coords, gw[0]);
            row_sums(d[1], P, g, gb[0]);
        }
    }
    return 0;
}

/* ---- Adam over one stacked parameter [K, n] with a per-network "may move" mask (NULL: all move),
 * as torch.optim.Adam computes it: m = lerp(m, g, 1 - beta1), v = beta2 v + (1 - beta2) g^2,
 * p -= step_size * m / (sqrt(v) / sqrt(bias_correction2) + eps). Networks that may not move keep
 * their parameters and moments. */
void zoo_adam(int networks, long n, float *param, const float *grad, float *exp_avg, float *exp_avg_sq,
              const unsigned char *active, float beta1, float beta2, float step_size, float bias_correction2_sqrt,
              float eps) {
    const float weight = 1.0f - beta1, value = 1.0f - beta2;
    for (int k = 0; k < networks; k++) {
        if (active && !active[k]) continue;
        float *p = param + (ptrdiff_t)k * n, *m = exp_avg + (ptrdiff_t)k * n, *v = exp_avg_sq + (ptrdiff_t)k * n;
        const float *g = grad + (ptrdiff_t)k * n;
        for (long i = 0; i < n; i++) {
            float mi = m[i] + weight * (g[i] - m[i]);
            float vi = v[i] * beta2 + value * g[i] * g[i];
            m[i] = mi;
            v[i] = vi;
            p[i] -= step_size * (mi / (__builtin_sqrtf(vi) / bias_correction2_sqrt + eps));
        }
    }
}
