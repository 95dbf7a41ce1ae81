/*
 * Attention over a float16 KV cache with reduced-precision dot products, for CPUs with AVX-512
 * VNNI and BF16 but no AMX (the quantized model's default where the CPU has them; attention_amx.c
 * where it has AMX, attention_avx2.c's int8 unit with AVX2 alone; attention.c's float32 unit
 * everywhere else and whenever asked for).
 *
 * Long prompts over long contexts spend most of their time here: at float32 FMA rates a 650-token
 * turn over 3,300 cached tokens costs more than the turn's matmuls (docs/ARCHITECTURE.md). So:
 *   - scores: the query row is rounded to int8 with a scale of its own (max |q| / 127), each key
 *     to int8 with its own scale, and the dot products run on VNNI (vpdpbusd: 64 byte products a
 *     instruction, four times float32's FMAs); the int32 sums are exact, then scaled back;
 *   - values: each value to int8 with its own scale, and each row's step of probabilities, times
 *     each key's value scale, to bytes (0..255) with a scale of the row's own for the step (their
 *     most / 255); vpdpbusd sums four keys a lane exactly in int32, scaled into the float32
 *     output once a step. Half the instructions of bfloat16 pairs (vdpbf16ps, which this unit
 *     used: a 640-query layer over 4,000 cached tokens 16.1 -> 13.6 ms on a Zen 4 EPYC) and a
 *     quarter of float32's FMAs (which it used on Intel, where vdpbf16ps runs at a quarter of the
 *     FMAs' rate);
 *   - the softmax (maximum, exp, totals) stays float32, as in attention.c, but its exponential is
 *     exact to 1e-4 only (exp_coarse_k): far below the int8 scores' error.
 * Keys and values come from the cache's int8 codes where the engine keeps them (kv_codes.h:
 * rounded once, when written; the engine always does), else each step's are written by
 * kv_codes.h for the tile (attention.h's int8_step_at: callers without codes, the tests).
 * The step order is attention.c's (tiles are REDUCED_TILE queries: a step's keys serve more
 * rows), and every quantity a row uses (its own scale, a key's scale, the step's order) is fixed
 * by the row and the key alone: a row's output is still the same bits whatever else is in the
 * call, so the engine stays batch-invariant. The error against float32 is measured in the
 * quality benchmark.
 *
 * vpdpbusd multiplies unsigned by signed bytes: keys are stored +128 (0..255) and each row's
 * sum gets 128 * (the sum of its int8 values) taken back; probabilities are unsigned already.
 */
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "kv_codes.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
/* attention_amx.c's unit serves: faster on every CPU that has AMX */
#elif defined(__AVX512VNNI__) && defined(__AVX512BF16__)
#include <immintrin.h>

#define SCORE_ROWS 8 /* 8 rows x 2 vectors of int32 sums */
#define VALUE_ROWS 6 /* 6 rows x 4 slices of int32 sums, plus 4 value slices */
#define VALUE_SLICES 4

const char *attention_reduced_kind(void) { return "int8 scores, int8 values"; }

int attention_reduced_available(void) { return 1; }

int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    int8_scratch w;
    return int8_carve(&w, NULL, rows, head_dim) + 64;
}

/* acc + the byte products of u (unsigned) and s (signed), four a lane: vpdpbusd, written out
 * because GCC 12 copies the accumulator of _mm512_dpbusd_epi32 in and out of another register
 * around every one (a dozen moves and spills per loop of scores_for: 3x its time). */
static inline __m512i dot_bytes(__m512i acc, __m512i u, __m512i s) {
    __asm__("vpdpbusd %2, %1, %0" : "+v"(acc) : "v"(u), "v"(s));
    return acc;
}

/* Scores of the step's keys for R rows from r0, in float. */
static inline __attribute__((always_inline)) void scores_for(const int8_scratch *w, int64_t r0,
                                                            int64_t hd, __m512 *out, const int R) {
    __m512i s[SCORE_ROWS][2];
    for (int r = 0; r < R; r++) s[r][0] = s[r][1] = _mm512_setzero_si512();
    const uint32_t *q = w->q + r0;
    const uint32_t *k0p = w->step.k[0], *k1p = w->step.k[1];
    const int64_t stride = w->step.k_stride;
    for (int64_t g = 0; g < hd / 4; g++, q += w->rows, k0p += stride, k1p += stride) {
        const __m512i k0 = _mm512_loadu_si512(k0p);
        const __m512i k1 = _mm512_loadu_si512(k1p);
        for (int r = 0; r < R; r++) {
            const __m512i four = _mm512_set1_epi32((int32_t)q[r]);
            s[r][0] = dot_bytes(s[r][0], k0, four);
            s[r][1] = dot_bytes(s[r][1], k1, four);
        }
    }
    const __m512 k_scale0 = _mm512_loadu_ps(w->step.k_scale[0]);
    const __m512 k_scale1 = _mm512_loadu_ps(w->step.k_scale[1]);
    for (int r = 0; r < R; r++) {
        const __m512i bias = _mm512_set1_epi32(w->q_bias[r0 + r]);
        const __m512 q_scale = _mm512_set1_ps(w->q_scale[r0 + r]);
        out[2 * r] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[r][0], bias)),
                                   _mm512_mul_ps(k_scale0, q_scale));
        out[2 * r + 1] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_sub_epi32(s[r][1], bias)),
                                       _mm512_mul_ps(k_scale1, q_scale));
    }
}

static inline void scores_any(const int8_scratch *w, int64_t r0, int64_t hd, __m512 *out, int R) {
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

/* The lanes' maximum of each of 4 vectors, in lanes 4i..4i+3 (the vectors' 256- and 128-bit
 * halves folded onto each other: one tree for all four, not four reductions). */
static inline __m512 max_of_four(__m512 a, __m512 b, __m512 c, __m512 d) {
    const __m512 ab =
        _mm512_max_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    const __m512 cd =
        _mm512_max_ps(_mm512_shuffle_f32x4(c, d, 0x44), _mm512_shuffle_f32x4(c, d, 0xEE));
    __m512 m =
        _mm512_max_ps(_mm512_shuffle_f32x4(ab, cd, 0x88), _mm512_shuffle_f32x4(ab, cd, 0xDD));
    m = _mm512_max_ps(m, _mm512_permute_ps(m, 0x4E));
    return _mm512_max_ps(m, _mm512_permute_ps(m, 0xB1));
}

/* R rows' step probabilities (p, from row r0) times each key's value scale as bytes (0..255,
 * four keys a lane), each row with the scale that takes them back: its most / 255. */
static inline void quantize_weights(int8_scratch *w, int64_t r0, int R) {
    __m512 weights[SCORE_ROWS][VECTORS], top[SCORE_ROWS];
    /* a key past the context (its probability 0) may have any scale the cache holds: left out */
    const __m512 v_scale[VECTORS] = {_mm512_loadu_ps(w->step.v_scale[0]),
                                     _mm512_loadu_ps(w->step.v_scale[1])};
    for (int r = 0; r < SCORE_ROWS; r++) { /* rows past R: row r0's again, never stored */
        const float *p = w->p + (r0 + (r < R ? r : 0)) * STEP;
        for (int c = 0; c < VECTORS; c++) {
            const __m512 prob = _mm512_loadu_ps(p + c * KEYS);
            weights[r][c] = _mm512_maskz_mul_ps(
                _mm512_cmp_ps_mask(prob, _mm512_setzero_ps(), _CMP_GT_OQ), prob, v_scale[c]);
        }
        top[r] = _mm512_max_ps(weights[r][0], weights[r][1]);
    }
    float most[2][16], inverse[2][16];
    for (int half = 0; half < 2; half++) {
        const __m512 m = max_of_four(top[4 * half], top[4 * half + 1], top[4 * half + 2],
                                     top[4 * half + 3]);
        _mm512_storeu_ps(most[half], m);
        _mm512_storeu_ps(inverse[half],
                         _mm512_maskz_div_ps(_mm512_cmp_ps_mask(m, _mm512_setzero_ps(), _CMP_GT_OQ),
                                             _mm512_set1_ps(255.f), m));
    }
    for (int r = 0; r < R; r++) {
        const __m512 scale = _mm512_set1_ps(inverse[r / 4][4 * (r % 4)]);
        uint32_t *codes = w->weights + (r0 + r) * GROUPS;
        for (int c = 0; c < VECTORS; c++)
            _mm_storeu_si128((__m128i *)(codes + 4 * c), _mm512_cvtepi32_epi8(_mm512_cvtps_epi32(
                                                             _mm512_mul_ps(weights[r][c], scale))));
        w->weight_scale[r0 + r] = most[r / 4][4 * (r % 4)] * (1.f / 255.f);
    }
}

/* acc = acc * rescale + the step's first `count` keys' values weighted by their probabilities,
 * for R rows from r0 and S slices of 16 dims from d0: the byte products of weights and values
 * summed exactly in int32 (vpdpbusd, four keys a lane), then scaled into acc once. */
static inline __attribute__((always_inline)) void values_for(const int8_scratch *w, int64_t r0,
                                                            int64_t hd, int64_t d0, int64_t count,
                                                            const int R, const int S) {
    __m512i sums[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) sums[r][c] = _mm512_setzero_si512();
    for (int64_t g = 0; g < (count + 3) / 4; g++) {
        const uint32_t *lanes = w->step.v[g / (KEYS / 4)] + (g % (KEYS / 4)) * hd;
        __m512i value[VALUE_SLICES];
        for (int c = 0; c < S; c++) {
            value[c] = _mm512_loadu_si512(lanes + d0 + 16 * c);
            PIN(value[c]);
        }
        for (int r = 0; r < R; r++) {
            const __m512i four = _mm512_set1_epi32((int32_t)w->weights[(r0 + r) * GROUPS + g]);
            for (int c = 0; c < S; c++) sums[r][c] = dot_bytes(sums[r][c], four, value[c]);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m512 rescale = _mm512_set1_ps(w->rescale[r0 + r]);
        const __m512 scale = _mm512_set1_ps(w->weight_scale[r0 + r]);
        for (int c = 0; c < S; c++) {
            float *acc = w->acc + (r0 + r) * hd + d0 + 16 * c;
            _mm512_storeu_ps(acc, _mm512_fmadd_ps(_mm512_cvtepi32_ps(sums[r][c]), scale,
                                                  _mm512_mul_ps(_mm512_loadu_ps(acc), rescale)));
        }
    }
}

static inline __attribute__((always_inline)) void values_rows(const int8_scratch *w, int64_t r0,
                                                             int64_t hd, int64_t count,
                                                             const int R) {
    int64_t d0 = 0;
    for (; d0 + 16 * VALUE_SLICES <= hd; d0 += 16 * VALUE_SLICES)
        values_for(w, r0, hd, d0, count, R, VALUE_SLICES);
    for (; d0 < hd; d0 += 16) values_for(w, r0, hd, d0, count, R, 1);
}

static inline void values_any(const int8_scratch *w, int64_t r0, int64_t hd, int64_t count,
                              int R) {
    switch (R) {
    case 1: values_rows(w, r0, hd, count, 1); break;
    case 2: values_rows(w, r0, hd, count, 2); break;
    case 3: values_rows(w, r0, hd, count, 3); break;
    case 4: values_rows(w, r0, hd, count, 4); break;
    case 5: values_rows(w, r0, hd, count, 5); break;
    default: values_rows(w, r0, hd, count, VALUE_ROWS); break;
    }
}

void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            void *memory) {
    const int64_t hd = a->head_dim;
    const reduced_shape u = reduced_shape_of(a, s, tile);
    const int64_t group = u.group, rows = u.rows;
    const int64_t first_ctx = u.first_ctx, last_ctx = u.last_ctx;
    int8_scratch w;
    int8_carve(&w, (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63), rows, hd);
    reduced_prepare_queries(a, &u, tile, kh, 127.f, w.q, w.q_scale, w.q_bias, w.max, w.total);
    memset(w.acc, 0, sizeof(float) * (size_t)(rows * hd));
    for (int64_t t0 = 0; t0 < last_ctx; t0 += STEP) {
        const int64_t count = last_ctx - t0 < STEP ? last_ctx - t0 : STEP;
        int8_step_at(&w.step, a, s, kh, t0, count, w.own);
        /* rows of queries that see none of these keys skip the step */
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;
            __m512 sc[SCORE_ROWS * VECTORS];
            scores_any(&w, r0, hd, sc, R);
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r;
                vk total = load_k(w.total + row * KEYS);
                softmax_step((const vk *)(sc + r * VECTORS), VECTORS, first_ctx + row / group - t0,
                             w.max + row, &total, w.p + row * STEP, w.rescale + row, 1);
                store_k(w.total + row * KEYS, total);
            }
            quantize_weights(&w, r0, R);
        }
        /* a row's probabilities past its own context are zero: one count for every row */
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {
            const int R = rows - r0 < VALUE_ROWS ? (int)(rows - r0) : VALUE_ROWS;
            values_any(&w, r0, hd, count, R);
        }
    }
    reduced_write_out(a, &u, tile, kh, w.acc, w.total);
}

#elif defined(__AVX512F__) || !(defined(__AVX2__) && defined(__FMA__) && defined(__F16C__))
/* no AMX, AVX-512 VNNI and BF16, or AVX2 (attention_avx2.c): attention.c's float32 unit serves */

const char *attention_reduced_kind(void) { return "float32"; }
int attention_reduced_available(void) { return 0; }
int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    (void)rows, (void)head_dim;
    return 0;
}
void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            void *memory) {
    (void)a, (void)s, (void)tile, (void)kh, (void)memory;
}

#endif
