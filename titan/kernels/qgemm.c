/*
 * out = x . W^T for int8 activations (quant.c) and Q4_1 / Q8_0 weight panels.
 *
 * Per output element and block b of 32: isum = the exact integer dot product of the block, then
 *     acc = fma(d_w * d_x, isum, acc); acc = fma(m_w, s_x, acc)     (the m term: Q4_1 only)
 * in block order, in float32. Integer sums are exact whatever the instructions, and every path
 * (AVX512-VNNI, AVX2, NEON dot product, portable C) does the same float operations in the same
 * order, so an element's value depends on neither the ISA, the tile it was computed in, nor the
 * other rows of the call. Each path is chosen at compile time (-march=native), so the library a
 * machine builds for itself uses the best one it has; qgemm_isa() names it.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"

#define ROW_TILE 4 /* activation rows sharing each load of weights */

#if defined(__AVX512VNNI__) && defined(__AVX512BW__) && defined(__AVX512F__)
#define PATH_AVX512_VNNI 1
#include <immintrin.h>
#elif defined(__AVX2__) && defined(__F16C__) && defined(__FMA__)
#define PATH_AVX2 1
#include <immintrin.h>
#elif defined(__aarch64__) && defined(__ARM_FEATURE_DOTPROD) && defined(__ARM_FEATURE_FMA)
#define PATH_NEON_DOTPROD 1
#include <arm_neon.h>
#endif

float titan_f16_to_f32(uint16_t h);

const char *qgemm_isa(void) {
#if defined(PATH_AVX512_VNNI)
    return "avx512-vnni";
#elif defined(PATH_AVX2)
    return "avx2";
#elif defined(PATH_NEON_DOTPROD)
    return "neon-dotprod";
#else
    return "portable";
#endif
}

typedef struct {
    const int8_t *qs[ROW_TILE]; /* each row's 32 values of the current block: qs[r] + b * QK */
    const float *d[ROW_TILE];
    const float *s[ROW_TILE];
} rows_view;

/* acc[r][c] for nrows rows and the 16 columns of one panel. */
typedef float tile_acc[ROW_TILE][PANEL];

#if defined(PATH_AVX512_VNNI)

static inline __attribute__((always_inline)) void tile_q4_1_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    const __m512i low = _mm512_set1_epi8(0x0F);
    __m512 sums[ROW_TILE];
    for (int r = 0; r < R; r++) sums[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 320;
        __m512i isum[ROW_TILE];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 4; s++) {
            const __m512i v = _mm512_loadu_si512((const void *)(block + 64 * s));
            const __m512i lo = _mm512_and_si512(v, low);
            const __m512i hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
            for (int r = 0; r < R; r++) {
                int32_t xl, xh;
                memcpy(&xl, x->qs[r] + b * QK + 4 * s, 4);
                memcpy(&xh, x->qs[r] + b * QK + 16 + 4 * s, 4);
                isum[r] = _mm512_dpbusd_epi32(isum[r], lo, _mm512_set1_epi32(xl));
                isum[r] = _mm512_dpbusd_epi32(isum[r], hi, _mm512_set1_epi32(xh));
            }
        }
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 256)));
        const __m512 mw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 288)));
        for (int r = 0; r < R; r++) {
            const __m512 t = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[r][b]));
            sums[r] = _mm512_fmadd_ps(t, _mm512_cvtepi32_ps(isum[r]), sums[r]);
            sums[r] = _mm512_fmadd_ps(mw, _mm512_set1_ps(x->s[r][b]), sums[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc[r], sums[r]);
}

static inline __attribute__((always_inline)) void tile_q8_0_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    const __m512i flip = _mm512_set1_epi8((char)0x80);
    __m512 sums[ROW_TILE];
    for (int r = 0; r < R; r++) sums[r] = _mm512_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 608;
        __m512i isum[ROW_TILE];
        for (int r = 0; r < R; r++) isum[r] = _mm512_setzero_si512();
        for (int s = 0; s < 8; s++) {
            const __m512i w = _mm512_loadu_si512((const void *)(block + 64 * s));
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x->qs[r] + b * QK + 4 * s, 4);
                const __m512i xu = _mm512_xor_si512(_mm512_set1_epi32(xv), flip); /* x + 128 */
                isum[r] = _mm512_dpbusd_epi32(isum[r], xu, w);
            }
        }
        const __m512i correction =
            _mm512_slli_epi32(_mm512_loadu_si512((const void *)(block + 544)), 7);
        const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(block + 512)));
        for (int r = 0; r < R; r++) {
            const __m512i exact = _mm512_sub_epi32(isum[r], correction);
            const __m512 t = _mm512_mul_ps(dw, _mm512_set1_ps(x->d[r][b]));
            sums[r] = _mm512_fmadd_ps(t, _mm512_cvtepi32_ps(exact), sums[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm512_storeu_ps(acc[r], sums[r]);
}

#elif defined(PATH_AVX2)

/* Eight columns (one half of a panel) at a time: sixteen ymm registers hold four rows. */
static inline __attribute__((always_inline)) void half_q4_1_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, int half, const int R) {
    const __m256i low = _mm256_set1_epi8(0x0F);
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 sums[ROW_TILE];
    for (int r = 0; r < R; r++) sums[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 320;
        __m256i isum[ROW_TILE];
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int s = 0; s < 4; s++) {
            const __m256i v = _mm256_loadu_si256((const __m256i *)(block + 64 * s + 32 * half));
            const __m256i lo = _mm256_and_si256(v, low);
            const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
            for (int r = 0; r < R; r++) {
                int32_t xl, xh;
                memcpy(&xl, x->qs[r] + b * QK + 4 * s, 4);
                memcpy(&xh, x->qs[r] + b * QK + 16 + 4 * s, 4);
                /* pairs of 15 * 127 products: no 16-bit saturation, even two steps added */
                const __m256i pairs = _mm256_add_epi16(
                    _mm256_maddubs_epi16(lo, _mm256_set1_epi32(xl)),
                    _mm256_maddubs_epi16(hi, _mm256_set1_epi32(xh)));
                isum[r] = _mm256_add_epi32(isum[r], _mm256_madd_epi16(pairs, ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 256 + 16 * half)));
        const __m256 mw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 288 + 16 * half)));
        for (int r = 0; r < R; r++) {
            const __m256 t = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[r][b]));
            sums[r] = _mm256_fmadd_ps(t, _mm256_cvtepi32_ps(isum[r]), sums[r]);
            sums[r] = _mm256_fmadd_ps(mw, _mm256_set1_ps(x->s[r][b]), sums[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(acc[r] + 8 * half, sums[r]);
}

static inline __attribute__((always_inline)) void half_q8_0_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, int half, const int R) {
    const __m256i ones = _mm256_set1_epi16(1);
    __m256 sums[ROW_TILE];
    for (int r = 0; r < R; r++) sums[r] = _mm256_setzero_ps();
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 608;
        __m256i isum[ROW_TILE];
        for (int r = 0; r < R; r++) isum[r] = _mm256_setzero_si256();
        for (int s = 0; s < 8; s++) {
            const __m256i w = _mm256_loadu_si256((const __m256i *)(block + 64 * s + 32 * half));
            const __m256i magnitude = _mm256_sign_epi8(w, w);
            for (int r = 0; r < R; r++) {
                int32_t xv;
                memcpy(&xv, x->qs[r] + b * QK + 4 * s, 4);
                /* |w| * (x with w's sign): pairs of at most 127 * 127, no saturation */
                const __m256i signed_x = _mm256_sign_epi8(_mm256_set1_epi32(xv), w);
                isum[r] = _mm256_add_epi32(
                    isum[r], _mm256_madd_epi16(_mm256_maddubs_epi16(magnitude, signed_x), ones));
            }
        }
        const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(block + 512 + 16 * half)));
        for (int r = 0; r < R; r++) {
            const __m256 t = _mm256_mul_ps(dw, _mm256_set1_ps(x->d[r][b]));
            sums[r] = _mm256_fmadd_ps(t, _mm256_cvtepi32_ps(isum[r]), sums[r]);
        }
    }
    for (int r = 0; r < R; r++) _mm256_storeu_ps(acc[r] + 8 * half, sums[r]);
}

static inline __attribute__((always_inline)) void tile_q4_1_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    half_q4_1_impl(panel, nb, x, acc, 0, R);
    half_q4_1_impl(panel, nb, x, acc, 1, R);
}

static inline __attribute__((always_inline)) void tile_q8_0_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    half_q8_0_impl(panel, nb, x, acc, 0, R);
    half_q8_0_impl(panel, nb, x, acc, 1, R);
}

#elif defined(PATH_NEON_DOTPROD)

static inline float32x4_t load_f16x4(const uint8_t *p) {
    return vcvt_f32_f16(vreinterpret_f16_u16(vld1_u16((const uint16_t *)p)));
}

/* Four columns (a quarter of a panel) at a time. */
static inline __attribute__((always_inline)) void tile_q4_1_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    const uint8x16_t low = vdupq_n_u8(0x0F);
    for (int quarter = 0; quarter < 4; quarter++) {
        float32x4_t sums[ROW_TILE];
        for (int r = 0; r < R; r++) sums[r] = vdupq_n_f32(0.f);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = panel + b * 320;
            int32x4_t isum[ROW_TILE];
            for (int r = 0; r < R; r++) isum[r] = vdupq_n_s32(0);
            for (int s = 0; s < 4; s++) {
                const uint8x16_t v = vld1q_u8(block + 64 * s + 16 * quarter);
                const int8x16_t lo = vreinterpretq_s8_u8(vandq_u8(v, low)); /* 0..15 */
                const int8x16_t hi = vreinterpretq_s8_u8(vshrq_n_u8(v, 4));
                for (int r = 0; r < R; r++) {
                    int32_t xl, xh;
                    memcpy(&xl, x->qs[r] + b * QK + 4 * s, 4);
                    memcpy(&xh, x->qs[r] + b * QK + 16 + 4 * s, 4);
                    isum[r] = vdotq_s32(isum[r], lo, vreinterpretq_s8_s32(vdupq_n_s32(xl)));
                    isum[r] = vdotq_s32(isum[r], hi, vreinterpretq_s8_s32(vdupq_n_s32(xh)));
                }
            }
            const float32x4_t dw = load_f16x4(block + 256 + 8 * quarter);
            const float32x4_t mw = load_f16x4(block + 288 + 8 * quarter);
            for (int r = 0; r < R; r++) {
                const float32x4_t t = vmulq_f32(dw, vdupq_n_f32(x->d[r][b]));
                sums[r] = vfmaq_f32(sums[r], t, vcvtq_f32_s32(isum[r]));
                sums[r] = vfmaq_f32(sums[r], mw, vdupq_n_f32(x->s[r][b]));
            }
        }
        for (int r = 0; r < R; r++) vst1q_f32(acc[r] + 4 * quarter, sums[r]);
    }
}

static inline __attribute__((always_inline)) void tile_q8_0_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    for (int quarter = 0; quarter < 4; quarter++) {
        float32x4_t sums[ROW_TILE];
        for (int r = 0; r < R; r++) sums[r] = vdupq_n_f32(0.f);
        for (int64_t b = 0; b < nb; b++) {
            const uint8_t *block = panel + b * 608;
            int32x4_t isum[ROW_TILE];
            for (int r = 0; r < R; r++) isum[r] = vdupq_n_s32(0);
            for (int s = 0; s < 8; s++) {
                const int8x16_t w = vld1q_s8((const int8_t *)(block + 64 * s + 16 * quarter));
                for (int r = 0; r < R; r++) {
                    int32_t xv;
                    memcpy(&xv, x->qs[r] + b * QK + 4 * s, 4);
                    isum[r] = vdotq_s32(isum[r], w, vreinterpretq_s8_s32(vdupq_n_s32(xv)));
                }
            }
            const float32x4_t dw = load_f16x4(block + 512 + 8 * quarter);
            for (int r = 0; r < R; r++) {
                const float32x4_t t = vmulq_f32(dw, vdupq_n_f32(x->d[r][b]));
                sums[r] = vfmaq_f32(sums[r], t, vcvtq_f32_s32(isum[r]));
            }
        }
        for (int r = 0; r < R; r++) vst1q_f32(acc[r] + 4 * quarter, sums[r]);
    }
}

#else /* portable C: the same operations, one element at a time */

static inline float half_at(const uint8_t *p, int c) {
    uint16_t h;
    memcpy(&h, p + 2 * c, 2);
    return titan_f16_to_f32(h);
}

static inline __attribute__((always_inline)) void tile_q4_1_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < PANEL; c++) acc[r][c] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 320;
        for (int c = 0; c < PANEL; c++) {
            const float dw = half_at(block + 256, c), mw = half_at(block + 288, c);
            for (int r = 0; r < R; r++) {
                const int8_t *xq = x->qs[r] + b * QK;
                int32_t isum = 0;
                for (int k = 0; k < 16; k++) {
                    const uint8_t byte = block[(k / 4) * 64 + 4 * c + k % 4];
                    isum += (int32_t)(byte & 0x0F) * xq[k] + (int32_t)(byte >> 4) * xq[k + 16];
                }
                const float t = dw * x->d[r][b];
                acc[r][c] = fmaf(t, (float)isum, acc[r][c]);
                acc[r][c] = fmaf(mw, x->s[r][b], acc[r][c]);
            }
        }
    }
}

static inline __attribute__((always_inline)) void tile_q8_0_impl(
    const uint8_t *panel, int64_t nb, const rows_view *x, tile_acc acc, const int R) {
    for (int r = 0; r < R; r++)
        for (int c = 0; c < PANEL; c++) acc[r][c] = 0.f;
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * 608;
        for (int c = 0; c < PANEL; c++) {
            const float dw = half_at(block + 512, c);
            for (int r = 0; r < R; r++) {
                const int8_t *xq = x->qs[r] + b * QK;
                int32_t isum = 0;
                for (int k = 0; k < QK; k++)
                    isum += (int32_t)(int8_t)block[(k / 4) * 64 + 4 * c + k % 4] * xq[k];
                const float t = dw * x->d[r][b];
                acc[r][c] = fmaf(t, (float)isum, acc[r][c]);
            }
        }
    }
}

#endif

static void tile(int32_t format, const uint8_t *panel, int64_t nb, const rows_view *x,
                 tile_acc acc, int nrows) {
#define DISPATCH(IMPL)                                                                   \
    switch (nrows) {                                                                    \
    case 1: IMPL(panel, nb, x, acc, 1); break;                                          \
    case 2: IMPL(panel, nb, x, acc, 2); break;                                          \
    case 3: IMPL(panel, nb, x, acc, 3); break;                                          \
    default: IMPL(panel, nb, x, acc, 4); break;                                         \
    }
    if (format == FORMAT_Q4_1) {
        DISPATCH(tile_q4_1_impl)
    } else {
        DISPATCH(tile_q8_0_impl)
    }
#undef DISPATCH
}

typedef struct {
    const qacts *x;
    const qweight *w;
    float *out;
    int64_t out_stride, num_rows, rows_per_item, panels_per_item, num_panel_items;
    int accumulate;
} gemm_job;

static void gemm_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const gemm_job *g = ctx;
    const qweight *w = g->w;
    const int64_t nb = w->cols / QK;
    const int64_t bytes = panel_block_bytes(w->format);
    const int64_t num_panels = (w->rows + PANEL - 1) / PANEL;
    const int64_t panel_begin = (item % g->num_panel_items) * g->panels_per_item;
    const int64_t panel_end = panel_begin + g->panels_per_item < num_panels
                                  ? panel_begin + g->panels_per_item : num_panels;
    const int64_t row_begin = (item / g->num_panel_items) * g->rows_per_item;
    const int64_t row_end = row_begin + g->rows_per_item < g->num_rows
                                ? row_begin + g->rows_per_item : g->num_rows;
    tile_acc acc;
    for (int64_t p = panel_begin; p < panel_end; p++) {
        const uint8_t *panel = w->data + p * nb * bytes;
        const int64_t col0 = p * PANEL;
        const int ncols = w->rows - col0 < PANEL ? (int)(w->rows - col0) : PANEL;
        for (int64_t t = row_begin; t < row_end; t += ROW_TILE) {
            const int nrows = row_end - t < ROW_TILE ? (int)(row_end - t) : ROW_TILE;
            rows_view view;
            for (int r = 0; r < nrows; r++) {
                view.qs[r] = g->x->qs + (t + r) * g->x->cols;
                view.d[r] = g->x->d + (t + r) * nb;
                view.s[r] = g->x->s + (t + r) * nb;
            }
            tile(w->format, panel, nb, &view, acc, nrows);
            for (int r = 0; r < nrows; r++) {
                float *o = g->out + (t + r) * g->out_stride + col0;
                for (int c = 0; c < ncols; c++) {
                    float v = acc[r][c];
                    if (w->bias != NULL) v = v + w->bias[col0 + c];
                    o[c] = g->accumulate ? o[c] + v : v;
                }
            }
        }
    }
}

void qgemm(pool *p, const qacts *x, int64_t num_rows, const qweight *w, float *out,
           int64_t out_stride, int accumulate) {
    if (num_rows <= 0) return;
    const int64_t num_panels = (w->rows + PANEL - 1) / PANEL;
    /* Enough items for every thread to take several (a late thread costs one item), each
     * keeping a few panels of weights in cache while it runs over up to 64 rows. */
    const int64_t rows_per_item = num_rows < 64 ? num_rows : 64;
    const int64_t row_items = (num_rows + rows_per_item - 1) / rows_per_item;
    int64_t panel_items = (8 * (int64_t)pool_size(p) + row_items - 1) / row_items;
    if (panel_items > num_panels) panel_items = num_panels;
    if (panel_items < 1) panel_items = 1;
    const int64_t panels_per_item = (num_panels + panel_items - 1) / panel_items;
    gemm_job job = {
        .x = x, .w = w, .out = out, .out_stride = out_stride, .num_rows = num_rows,
        .rows_per_item = rows_per_item, .panels_per_item = panels_per_item,
        .num_panel_items = (num_panels + panels_per_item - 1) / panels_per_item,
        .accumulate = accumulate,
    };
    pool_run(p, gemm_item, &job, job.num_panel_items * row_items);
}
