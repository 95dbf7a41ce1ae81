/*
 * Attention over a float16 KV cache with reduced-precision dot products, for CPUs with AVX-512
 * VNNI and BF16 but no AMX (the quantized model's default where the CPU has them; attention_amx.c
 * where it has AMX; attention.c's float32 unit everywhere else and whenever asked for).
 *
 * Long prompts over long contexts spend most of their time here: at float32 FMA rates a 650-token
 * turn over 3,300 cached tokens costs more than the turn's matmuls (docs/ARCHITECTURE.md). So:
 *   - scores: the query row is rounded to int8 with a scale of its own (max |q| / 127), each key
 *     to int8 with its own scale, and the dot products run on VNNI (vpdpbusd: 64 byte products a
 *     instruction, four times float32's FMAs); the int32 sums are exact, then scaled back;
 *   - values: on AMD's cores the step's probabilities and values rounded to bfloat16 and summed in
 *     float32 by vdpbf16ps (pairs of keys a lane, twice float32's FMAs there); on Intel's, where
 *     vdpbf16ps runs at a quarter of the FMAs' rate (measured on a Xeon, family 6 model 207: 1.3
 *     against 5.3 billion a second), in float32 FMAs, values converted exactly from float16
 *     (enum reduced_values in cpu.h; the tests run both);
 *   - the softmax (maximum, exp, totals) stays float32, as in attention.c, but its exponential is
 *     exact to 1e-4 only (exp_coarse_k): far below the int8 scores' error, and the bfloat16
 *     rounding of the probabilities where values are summed in bfloat16.
 * Keys come from the K cache's int8 codes where the engine keeps them (key_codes.h: rounded once,
 * when written), else are rounded here, step by step; a prefill chunk's steps are staged once for
 * all its tiles (attention.c's stage_once), a decode's by its one tile.
 * The step order is attention.c's (tiles are REDUCED_TILE queries: the staged keys serve more
 * rows), and every quantity a row uses (its own scale, a key's scale, the step's order) is fixed
 * by the row and the key alone: a row's output is still the same bits whatever else is in the
 * call, so the engine stays batch-invariant. The error against float32 is measured in the
 * quality benchmark.
 *
 * vpdpbusd multiplies unsigned by signed bytes: keys are stored +128 (0..255) and each row's
 * sum gets 128 * (the sum of its int8 values) taken back.
 */
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "key_codes.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
/* attention_amx.c's unit serves: faster on every CPU that has AMX */
#elif defined(__AVX512VNNI__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define SCORE_ROWS 8 /* 8 rows x 2 vectors of int32 sums */
#define VALUE_ROWS 6 /* 6 rows x 4 slices of float sums, plus 4 value slices */
#define VALUE_SLICES 4
#define PAIRS (STEP / 2)
#define ALIGN(n) (((n) + 63) & ~(int64_t)63)

typedef struct {
    uint32_t *q;      /* [head_dim / 4][rows]: a row's four dims as bytes, scaled by the softmax
                         scale, then rounded (one row's groups `rows` apart: each step of
                         scores_for reads its rows' groups from one line) */
    int64_t rows;
    float *q_scale;   /* [rows] */
    int32_t *q_bias;  /* [rows]: 128 * the sum of the row's int8 values */
    /* the step's keys and values, staged (stage_step) in `own` or once per call (attention.c);
     * keys from the cache's codes where it has them (key_codes.h) */
    const uint32_t *k0, *k1; /* [head_dim / 4][k_stride]: the step's two vectors of keys, four
                                dims as bytes (+128) a lane */
    int64_t k_stride;
    const float *k_scale0, *k_scale1; /* [KEYS] each */
    const uint32_t *v;    /* [PAIRS][head_dim]: two keys' bfloat16 values of one dim a lane */
    const float *vf;      /* [STEP][head_dim]: or the step's values as float32 */
    void *own;            /* step_bytes(head_dim, 1, 1): the most a step takes */
    float *p;         /* [rows][STEP]: the step's probabilities */
    uint32_t *pairs;  /* [rows][PAIRS]: the same as bfloat16 pairs */
    float *acc;       /* [rows][head_dim] */
    float *total;     /* [rows][KEYS] */
    float *max, *rescale; /* [rows] */
} reduced_scratch;

/* Whether values are summed in float32 FMAs (else vdpbf16ps): see the top of this file. */
static int values_in_float32(int32_t asked) {
    if (asked != REDUCED_VALUES_AUTO) return asked == REDUCED_VALUES_F32;
    __builtin_cpu_init();
    return __builtin_cpu_is("intel");
}

const char *attention_reduced_kind(void) {
    return values_in_float32(REDUCED_VALUES_AUTO) ? "int8 scores, float32 values"
                                                  : "int8 scores, bfloat16 values";
}

int attention_reduced_available(void) { return 1; }

/* A staged step's keys ([head_dim / 4][STEP] lanes, then [STEP] scales; none where the cache
 * has codes) and values (as pairs, or f32: as float32), in bytes. */
static int64_t keys_bytes(int64_t hd, int keys) {
    return keys ? ALIGN(hd * STEP) + ALIGN(4 * STEP) : 0;
}

static int64_t step_bytes(int64_t hd, int f32, int keys) {
    return keys_bytes(hd, keys) + 4 * (f32 ? STEP : PAIRS) * hd;
}

static void point_at_step(reduced_scratch *w, const char *step, int64_t hd, int keys) {
    if (keys) {
        w->k0 = (const uint32_t *)step, w->k1 = w->k0 + KEYS, w->k_stride = STEP;
        w->k_scale0 = (const float *)(step + ALIGN(hd * STEP)), w->k_scale1 = w->k_scale0 + KEYS;
    }
    w->v = (const uint32_t *)(step + keys_bytes(hd, keys));
    w->vf = (const float *)w->v; /* one or the other, as the unit sums values */
}

/* The step's keys read in place from the cache's codes: each vector's block. */
static void point_at_codes(reduced_scratch *w, const attention_args *a, int64_t s, int64_t kh,
                           int64_t t0, int64_t count) {
    const int64_t hd = a->head_dim, bs = a->block_size;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    for (int c = 0; c < VECTORS; c++) { /* past the context: t0's, its scores are cut */
        const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
        const uint32_t *block = key_codes_block((uint32_t *)a->k_codes, table[t / bs], kh,
                                                a->num_kv_heads, hd, bs);
        const uint32_t *lanes = block + t % bs;
        const float *scales = (const float *)(block + (hd / 4) * bs) + t % bs;
        *(c ? &w->k1 : &w->k0) = lanes;
        *(c ? &w->k_scale1 : &w->k_scale0) = scales;
    }
    w->k_stride = bs;
}

static int64_t carve(reduced_scratch *w, char *base, int64_t rows, int64_t hd) {
    int64_t at = 0;
#define TAKE(field, bytes) (w->field = (void *)(base + at), at += ALIGN(bytes))
    TAKE(q, rows * hd);
    TAKE(q_scale, 4 * rows);
    TAKE(q_bias, 4 * rows);
    TAKE(own, step_bytes(hd, 1, 1));
    TAKE(p, 4 * rows * STEP);
    TAKE(pairs, 4 * rows * PAIRS);
    TAKE(acc, 4 * rows * hd);
    TAKE(total, 4 * rows * KEYS);
    TAKE(max, 4 * rows);
    TAKE(rescale, 4 * rows);
#undef TAKE
    return at;
}

int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    reduced_scratch w;
    return carve(&w, NULL, rows, head_dim) + 64;
}

/* A float query row as int8 with its scale; 0 stays 0. */
static void quantize_row_int8(const float *x, int64_t n, int8_t *out, float *scale, int32_t *bias) {
    float top = 0.f;
    for (int64_t d = 0; d < n; d++) top = fabsf(x[d]) > top ? fabsf(x[d]) : top;
    const float inverse = top > 0.f ? 127.f / top : 0.f;
    int32_t sum = 0;
    for (int64_t d = 0; d < n; d++) {
        out[d] = (int8_t)lrintf(x[d] * inverse);
        sum += out[d];
    }
    *scale = top / 127.f;
    *bias = 128 * sum;
}

/* 16 keys (one vector, dims `stride` apart in a transposed cache block) as bytes +128, four dims
 * a lane, with each key's scale. Keys past the context hold whatever the cache holds: their
 * scores are cut before the softmax, whatever they are. */
static inline void stage_keys(const _Float16 *kb, int64_t stride, int64_t hd, uint32_t *k,
                              float *k_scale) {
    __m512 top = _mm512_setzero_ps();
    for (int64_t d = 0; d < hd; d++)
        top = _mm512_max_ps(top, _mm512_abs_ps(_mm512_cvtph_ps(
                                     _mm256_loadu_si256((const __m256i *)(kb + d * stride)))));
    const __mmask16 nonzero = _mm512_cmp_ps_mask(top, _mm512_setzero_ps(), _CMP_GT_OQ);
    const __m512 inverse = _mm512_maskz_div_ps(nonzero, _mm512_set1_ps(127.f), top);
    _mm512_storeu_ps(k_scale, _mm512_mul_ps(top, _mm512_set1_ps(1.f / 127.f)));
    const __m512i offset = _mm512_set1_epi32(128);
    for (int64_t d = 0; d < hd; d += 4) {
        __m512i lane = _mm512_setzero_si512();
        for (int i = 0; i < 4; i++) {
            const __m512 x = _mm512_cvtph_ps(
                _mm256_loadu_si256((const __m256i *)(kb + (d + i) * stride)));
            const __m512i byte = _mm512_add_epi32(
                _mm512_cvtps_epi32(_mm512_mul_ps(x, inverse)), offset);
            lane = _mm512_or_si512(lane, _mm512_slli_epi32(byte, 8 * i));
        }
        _mm512_storeu_si512(k + (d / 4) * STEP, lane);
    }
}

/* Keys [t0, t0 + count) of sequence s's KV head kh staged as the unit reads them (point_at_step's
 * layout, from `step`): keys as bytes (unless `keys` is 0: the cache has codes), values as
 * bfloat16 pairs or (f32) float32. */
static void stage_step(const attention_args *a, int64_t s, int64_t kh, int64_t t0, int64_t count,
                       int f32, int keys, char *step) {
    const _Float16 *k_cache = a->k_cache, *v_cache = a->v_cache;
    const int64_t hd = a->head_dim, bs = a->block_size, kv = a->num_kv_heads;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    uint32_t *k = (uint32_t *)step;
    float *k_scale = (float *)(step + ALIGN(hd * STEP));
    char *values = step + keys_bytes(hd, keys);
    for (int c = 0; c < VECTORS; c++) { /* a vector never crosses a cache block */
        const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
        const int64_t block = table[t / bs], offset = t % bs;
        if (keys)
            stage_keys(k_cache + (block * kv + kh) * hd * bs + offset, bs, hd, k + c * KEYS,
                       k_scale + c * KEYS);
        const _Float16 *vb = v_cache + ((block * bs + offset) * kv + kh) * hd;
        if (f32) {
            float *vf = (float *)values;
            for (int64_t j = c * KEYS; j < count && j < (c + 1) * KEYS; j++)
                for (int64_t d = 0; d < hd; d += 16)
                    _mm512_storeu_ps(vf + j * hd + d, f16_vector(vb + (j - c * KEYS) * kv * hd + d));
            continue;
        }
        for (int64_t j = c * KEYS; j < count && j < (c + 1) * KEYS; j += 2) {
            const int64_t at = j - c * KEYS;
            stage_value_pair(vb + at * kv * hd, j + 1 < count ? vb + (at + 1) * kv * hd : NULL, hd,
                             (uint32_t *)values + (j / 2) * hd);
        }
    }
}

int64_t attention_reduced_step_bytes(const attention_args *a) {
    return step_bytes(a->head_dim, values_in_float32(a->reduced_values), a->k_codes == NULL);
}

void attention_reduced_stage(const attention_args *a, int64_t s, int64_t kh, int64_t first,
                             int64_t last, void *staged) {
    const int f32 = values_in_float32(a->reduced_values), keys = a->k_codes == NULL;
    const int64_t bytes = step_bytes(a->head_dim, f32, keys);
    for (int64_t i = first; i < last; i++)
        stage_step(a, s, kh, i * STEP, STEP, f32, keys, (char *)staged + i * bytes);
}

/* acc + the byte products of u (unsigned) and s (signed), four a lane: vpdpbusd, written out
 * because GCC 12 copies the accumulator of _mm512_dpbusd_epi32 in and out of another register
 * around every one (a dozen moves and spills per loop of scores_for: 3x its time). */
static inline __m512i dot_bytes(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

/* Scores of the step's keys for R rows from r0, in float. */
static inline __attribute__((always_inline)) void scores_for(const reduced_scratch *w, int64_t r0,
                                                            int64_t hd, __m512 *out, const int R) {
    __m512i s[SCORE_ROWS][2];
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_si512();
    const uint32_t *q = w->q + r0;
    const uint32_t *k0p = w->k0, *k1p = w->k1;
    for (int64_t g = 0; g < hd / 4; g++, q += w->rows, k0p += w->k_stride, k1p += w->k_stride) {
        const __m512i k0 = _mm512_loadu_si512(k0p);
        const __m512i k1 = _mm512_loadu_si512(k1p);
        for (int r = 0; r < R; r++) {
            const __m512i four = _mm512_set1_epi32((int32_t)q[r]);
            s[r][0] = dot_bytes(s[r][0], k0, four);
            s[r][1] = dot_bytes(s[r][1], k1, four);
        }
    }
    const __m512 k_scale0 = _mm512_loadu_ps(w->k_scale0), k_scale1 = _mm512_loadu_ps(w->k_scale1);
    for (int r = 0; r < R; r++) {
        const __m512i bias = _mm512_set1_epi32(w->q_bias[r0 + r]);
        const __m512 q_scale = _mm512_set1_ps(w->q_scale[r0 + r]);
        out[2 * r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[r][0], bias)),
                                   _mm512_mul_ps(k_scale0, q_scale));
        out[2 * r + 1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[r][1], bias)),
                                       _mm512_mul_ps(k_scale1, q_scale));
    }
}

static inline void scores_any(const reduced_scratch *w, int64_t r0, int64_t hd, __m512 *out, int R) {
    switch (R) {
    case 1: scores_for(w, r0, hd, out, 1); break;
    case 2: scores_for(w, r0, hd, out, 2); break;
    case 3: scores_for(w, r0, hd, out, 3); break;
    case 4: scores_for(w, r0, hd, out, 4); break;
    case 5: scores_for(w, r0, hd, out, 5); break;
    case 6: scores_for(w, r0, hd, out, 6); break;
    case 7: scores_for(w, r0, hd, out, 7); break;
    default: scores_for(w, r0, hd, out, SCORE_ROWS); break;
    }
}

/* acc = acc * rescale + the step's first `count` keys' values weighted by their probabilities,
 * for R rows from r0 and S slices of 16 dims from d0: in float32 FMAs (f32: vf, p) or by
 * vdpbf16ps over pairs of keys (v, pairs). */
static inline __attribute__((always_inline)) void values_for(const reduced_scratch *w, int64_t r0,
                                                            int64_t hd, int64_t d0, int64_t count,
                                                            const int R, const int S,
                                                            const int f32) {
    __m512 a[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++)
            a[r][c] = _mm512_mul_ps(_mm512_loadu_ps(w->acc + (r0 + r) * hd + d0 + 16 * c),
                                    _mm512_set1_ps(w->rescale[r0 + r]));
    const int64_t n = f32 ? count : (count + 1) / 2;
    for (int64_t j = 0; j < n; j++) {
        __m512 value[VALUE_SLICES];
        for (int c = 0; c < S; c++) {
            value[c] = f32 ? _mm512_loadu_ps(w->vf + j * hd + d0 + 16 * c)
                           : _mm512_castsi512_ps(_mm512_loadu_si512(w->v + j * hd + d0 + 16 * c));
            PIN(value[c]);
        }
        for (int r = 0; r < R; r++) {
            if (f32) {
                const __m512 p = _mm512_set1_ps(w->p[(r0 + r) * STEP + j]);
                for (int c = 0; c < S; c++) a[r][c] = _mm512_fmadd_ps(value[c], p, a[r][c]);
            } else {
                const __m512 p = _mm512_castsi512_ps(
                    _mm512_set1_epi32((int32_t)w->pairs[(r0 + r) * PAIRS + j]));
                for (int c = 0; c < S; c++)
                    a[r][c] = _mm512_dpbf16_ps(a[r][c], (__m512bh)value[c], (__m512bh)p);
            }
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) _mm512_storeu_ps(w->acc + (r0 + r) * hd + d0 + 16 * c, a[r][c]);
}

static inline __attribute__((always_inline)) void values_rows(const reduced_scratch *w, int64_t r0,
                                                             int64_t hd, int64_t count, const int R,
                                                             const int f32) {
    int64_t d0 = 0;
    for (; d0 + 16 * VALUE_SLICES <= hd; d0 += 16 * VALUE_SLICES)
        values_for(w, r0, hd, d0, count, R, VALUE_SLICES, f32);
    for (; d0 < hd; d0 += 16) values_for(w, r0, hd, d0, count, R, 1, f32);
}

static inline __attribute__((always_inline)) void values_any(const reduced_scratch *w, int64_t r0,
                                                            int64_t hd, int64_t count, int R,
                                                            const int f32) {
    switch (R) {
    case 1: values_rows(w, r0, hd, count, 1, f32); break;
    case 2: values_rows(w, r0, hd, count, 2, f32); break;
    case 3: values_rows(w, r0, hd, count, 3, f32); break;
    case 4: values_rows(w, r0, hd, count, 4, f32); break;
    case 5: values_rows(w, r0, hd, count, 5, f32); break;
    default: values_rows(w, r0, hd, count, VALUE_ROWS, f32); break;
    }
}

void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            const void *staged, void *memory) {
    const float *q = a->q;
    const int64_t hd = a->head_dim;
    const reduced_shape u = reduced_shape_of(a, s, tile);
    const int64_t n = u.n, group = u.group, rows = u.rows;
    const int64_t first_ctx = u.first_ctx, last_ctx = u.last_ctx;
    const int f32_values = values_in_float32(a->reduced_values), keys = a->k_codes == NULL;
    reduced_scratch w;
    carve(&w, (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63), rows, hd);
    w.rows = rows;
    float scaled[MAX_HEAD_DIM];
    int8_t row_q[MAX_HEAD_DIM];
    for (int64_t i = 0; i < n; i++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t row = i * group + g;
            const float *x = q + (tile + i) * a->q_stride + (kh * group + g) * hd;
            for (int64_t d = 0; d < hd; d++) scaled[d] = x[d] * a->scale;
            quantize_row_int8(scaled, hd, row_q, w.q_scale + row, w.q_bias + row);
            for (int64_t four = 0; four < hd / 4; four++)
                memcpy(w.q + four * rows + row, row_q + 4 * four, 4);
            w.max[row] = -INFINITY;
            store_k(w.total + row * KEYS, splat_k(0.f));
        }
    memset(w.acc, 0, sizeof(float) * (size_t)(rows * hd));
    for (int64_t t0 = 0; t0 < last_ctx; t0 += STEP) {
        const int64_t count = last_ctx - t0 < STEP ? last_ctx - t0 : STEP;
        /* a whole step is the same bytes staged here or once for all the sequence's tiles; a
         * tile's last, partial step is staged here (its value pairs end in zeros at count) */
        if (staged != NULL && count == STEP) {
            point_at_step(&w, (const char *)staged + (t0 / STEP) * step_bytes(hd, f32_values, keys),
                          hd, keys);
        } else {
            stage_step(a, s, kh, t0, count, f32_values, keys, w.own);
            point_at_step(&w, w.own, hd, keys);
        }
        if (!keys) point_at_codes(&w, a, s, kh, t0, count);
        /* rows of queries that see none of these keys skip the step */
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;
            __m512 sc[SCORE_ROWS * VECTORS];
            scores_any(&w, r0, hd, sc, R);
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r;
                vk total = load_k(w.total + row * KEYS);
                float *p = w.p + row * STEP;
                softmax_step((const vk *)(sc + r * VECTORS), VECTORS, first_ctx + row / group - t0,
                             w.max + row, &total, p, w.rescale + row, 1);
                store_k(w.total + row * KEYS, total);
                if (!f32_values)
                    _mm512_storeu_si512(w.pairs + row * PAIRS, (__m512i)_mm512_cvtne2ps_pbh(
                                        _mm512_loadu_ps(p + 16), _mm512_loadu_ps(p)));
            }
        }
        /* a row's probabilities past its own context are zero: one count for every row */
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {
            const int R = rows - r0 < VALUE_ROWS ? (int)(rows - r0) : VALUE_ROWS;
            if (f32_values) /* a constant in each call: the two ways are compiled apart */
                values_any(&w, r0, hd, count, R, 1);
            else
                values_any(&w, r0, hd, count, R, 0);
        }
    }
    reduced_write_out(a, &u, tile, kh, w.acc, w.total);
}

#else /* no AMX, VNNI or BF16: attention.c's float32 unit serves */

const char *attention_reduced_kind(void) { return "float32"; }
int attention_reduced_available(void) { return 0; }
int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    (void)rows, (void)head_dim;
    return 0;
}
void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            const void *staged, void *memory) {
    (void)a, (void)s, (void)tile, (void)kh, (void)staged, (void)memory;
}

#endif

#if !(defined(__AVX512VNNI__) && defined(__AVX512BF16__)) || \
    (defined(__AMX_TILE__) && defined(__AMX_BF16__))
/* No int8 unit in this build: nothing is staged once per call (the AMX unit stages its own, per
 * tile; the float32 unit serves the rest). */
int64_t attention_reduced_step_bytes(const attention_args *a) {
    (void)a;
    return 0;
}
void attention_reduced_stage(const attention_args *a, int64_t s, int64_t kh, int64_t first,
                             int64_t last, void *staged) {
    (void)a, (void)s, (void)kh, (void)first, (void)last, (void)staged;
}
#endif
