/*
 * The int8 attention unit for CPUs with AVX2 and FMA but no AVX-512 VNNI (most laptops, CI
 * runners and servers before Ice Lake and Zen 4): attention_reduced.c's arithmetic with what AVX2
 * has. Over long contexts attention is most of a turn, and its float32 FMAs were the time there
 * (docs/ARCHITECTURE.md); this unit reads the same int8 codes of the KV cache (kv_codes.h) and
 * sums byte products instead:
 *   - vpmaddubsw multiplies unsigned by signed bytes and adds pairs into int16, which saturates
 *     past 32,767: so one side of each product has 7 bits. Scores: keys as stored (+128, 0..255)
 *     against the query row rounded to -63..63 (its scale max |q| / 63); values: signed bytes
 *     against the step's weights (probabilities times the values' scales) rounded to 0..127
 *     (the row's most of the step / 127). vpmaddwd against ones then sums the pairs into int32,
 *     exactly; each int32 sum is scaled back once, as in attention_reduced.c;
 *   - the softmax, the step order and every quantity a row uses are fixed by the row and its keys
 *     alone: a row's output is the same bits whatever else is in the call (batch-invariant).
 * Where a caller keeps no codes (the tests), a step's codes are written first, by kv_codes.h
 * itself (attention.h's int8_step_at): the same bytes.
 */
#include <stdint.h>
#include <string.h>

#include "attention.h"
#include "kv_codes.h"

/* AVX-512 builds have attention_amx.c's unit, attention_reduced.c's, or (AVX-512 without VNNI
 * and BF16: Skylake-SP to Cascade Lake) the float32 unit */
#if !defined(__AVX512F__) && defined(__AVX2__) && defined(__FMA__) && defined(__F16C__)
#include <immintrin.h>

#define SCORE_ROWS 4   /* 4 rows x 2 vectors of int32 sums a pass */
#define VALUE_ROWS 2   /* 2 rows x 4 slices of int32 sums, plus 4 value slices */
#define VALUE_SLICES 4 /* of 8 dims */

const char *attention_reduced_kind(void) { return "int8 scores, int8 values (AVX2)"; }

int attention_reduced_available(void) { return 1; }

int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    int8_scratch w;
    return int8_carve(&w, NULL, rows, head_dim) + 64;
}

/* acc + the byte products of u (unsigned) and s (signed, or u of 7 bits), four a lane summed in
 * int32: vpmaddubsw (pairs, int16) then vpmaddwd against ones. */
static inline __m256i dot_bytes(__m256i acc, __m256i u, __m256i s) {
    return _mm256_add_epi32(
        acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}

/* Scores of the step's vectors c0, c0 + 1 for R rows from r0, in float, into out[r][c0..]. */
static inline __attribute__((always_inline)) void scores_for(const int8_scratch *w, int64_t r0,
                                                            int64_t hd, int c0,
                                                            __m256 out[][VECTORS], const int R) {
    __m256i sums[SCORE_ROWS][2];
    for (int r = 0; r < R; r++) sums[r][0] = sums[r][1] = _mm256_setzero_si256();
    const int64_t stride = w->step.k_stride;
    for (int64_t g = 0; g < hd / 4; g++) {
        const __m256i k0 = _mm256_loadu_si256((const __m256i *)(w->step.k[c0] + g * stride));
        const __m256i k1 = _mm256_loadu_si256((const __m256i *)(w->step.k[c0 + 1] + g * stride));
        for (int r = 0; r < R; r++) {
            const __m256i four = _mm256_set1_epi32((int32_t)w->q[g * w->rows + r0 + r]);
            sums[r][0] = dot_bytes(sums[r][0], k0, four);
            sums[r][1] = dot_bytes(sums[r][1], k1, four);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256i bias = _mm256_set1_epi32(w->q_bias[r0 + r]);
        const __m256 q_scale = _mm256_set1_ps(w->q_scale[r0 + r]);
        for (int c = 0; c < 2; c++)
            out[r][c0 + c] = _mm256_mul_ps(
                _mm256_cvtepi32_ps(_mm256_sub_epi32(sums[r][c], bias)),
                _mm256_mul_ps(_mm256_loadu_ps(w->step.k_scale[c0 + c]), q_scale));
    }
}

static inline void scores_any(const int8_scratch *w, int64_t r0, int64_t hd, int c0,
                              __m256 out[][VECTORS], int R) {
    switch (R) {
    case 1: scores_for(w, r0, hd, c0, out, 1); break;
    case 2: scores_for(w, r0, hd, c0, out, 2); break;
    case 3: scores_for(w, r0, hd, c0, out, 3); break;
    default: scores_for(w, r0, hd, c0, out, SCORE_ROWS); break;
    }
}

/* A row's step probabilities times each key's value scale as 7-bit bytes (0..127, four keys a
 * lane), and the scale that takes them back: their most / 127. Keys past the context (their
 * probability 0) may have any scale the cache holds: left out. */
static inline void quantize_weights(int8_scratch *w, int64_t row) {
    __m256 weights[VECTORS];
    vk top = splat_k(0.f);
    for (int c = 0; c < VECTORS; c++) {
        const __m256 prob = _mm256_loadu_ps(w->p + row * STEP + c * KEYS);
        const __m256 positive = _mm256_cmp_ps(prob, _mm256_setzero_ps(), _CMP_GT_OQ);
        const __m256 v_scale = _mm256_loadu_ps(w->step.v_scale[c]);
        weights[c] = _mm256_and_ps(positive, _mm256_mul_ps(prob, v_scale));
        top = vmax_k(top, (vk)weights[c]);
    }
    const float most = max_k(top);
    const __m256 inverse = _mm256_set1_ps(most > 0.f ? 127.f / most : 0.f);
    __m256i codes[VECTORS];
    for (int c = 0; c < VECTORS; c++)
        codes[c] = _mm256_cvtps_epi32(_mm256_mul_ps(weights[c], inverse));
    /* 32 int32 as 32 bytes: the packs interleave 128-bit halves, the permute puts them back */
    const __m256i bytes = _mm256_packus_epi16(_mm256_packs_epi32(codes[0], codes[1]),
                                              _mm256_packs_epi32(codes[2], codes[3]));
    const __m256i in_order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
    _mm256_storeu_si256((__m256i *)(w->weights + row * GROUPS),
                        _mm256_permutevar8x32_epi32(bytes, in_order));
    w->weight_scale[row] = most * (1.f / 127.f);
}

/* acc = acc * rescale + the step's first `count` keys' values weighted by their probabilities,
 * for R rows from r0 and S slices of 8 dims from d0. */
static inline __attribute__((always_inline)) void values_for(const int8_scratch *w, int64_t r0,
                                                            int64_t hd, int64_t d0, int64_t count,
                                                            const int R, const int S) {
    __m256i sums[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) sums[r][c] = _mm256_setzero_si256();
    for (int64_t g = 0; g < (count + 3) / 4; g++) {
        const uint32_t *lanes = w->step.v[g / (KEYS / 4)] + (g % (KEYS / 4)) * hd + d0;
        __m256i value[VALUE_SLICES];
        for (int c = 0; c < S; c++) value[c] = _mm256_loadu_si256((const __m256i *)(lanes + 8 * c));
        for (int r = 0; r < R; r++) {
            const __m256i four = _mm256_set1_epi32((int32_t)w->weights[(r0 + r) * GROUPS + g]);
            for (int c = 0; c < S; c++) sums[r][c] = dot_bytes(sums[r][c], four, value[c]);
        }
    }
    for (int r = 0; r < R; r++) {
        const __m256 rescale = _mm256_set1_ps(w->rescale[r0 + r]);
        const __m256 scale = _mm256_set1_ps(w->weight_scale[r0 + r]);
        for (int c = 0; c < S; c++) {
            float *acc = w->acc + (r0 + r) * hd + d0 + 8 * c;
            _mm256_storeu_ps(acc, _mm256_fmadd_ps(_mm256_cvtepi32_ps(sums[r][c]), scale,
                                                  _mm256_mul_ps(_mm256_loadu_ps(acc), rescale)));
        }
    }
}

static inline __attribute__((always_inline)) void values_rows(const int8_scratch *w, int64_t r0,
                                                             int64_t hd, int64_t count,
                                                             const int R) {
    int64_t d0 = 0;
    for (; d0 + 8 * VALUE_SLICES <= hd; d0 += 8 * VALUE_SLICES)
        values_for(w, r0, hd, d0, count, R, VALUE_SLICES);
    for (; d0 < hd; d0 += 8) values_for(w, r0, hd, d0, count, R, 1);
}

void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            void *memory) {
    const int64_t hd = a->head_dim;
    const reduced_shape u = reduced_shape_of(a, s, tile);
    const int64_t group = u.group, rows = u.rows;
    const int64_t first_ctx = u.first_ctx, last_ctx = u.last_ctx;
    int8_scratch w;
    int8_carve(&w, (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63), rows, hd);
    /* 7 bits: a key's byte (up to 255) times the query's, in pairs, must fit vpmaddubsw's int16 */
    reduced_prepare_queries(a, &u, tile, kh, 63.f, w.q, w.q_scale, w.q_bias, w.max, w.total);
    memset(w.acc, 0, sizeof(float) * (size_t)(rows * hd));
    for (int64_t t0 = 0; t0 < last_ctx; t0 += STEP) {
        const int64_t count = last_ctx - t0 < STEP ? last_ctx - t0 : STEP;
        int8_step_at(&w.step, a, s, kh, t0, count, w.own);
        /* rows of queries that see none of these keys skip the step */
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;
            __m256 sc[SCORE_ROWS][VECTORS];
            for (int c0 = 0; c0 < VECTORS; c0 += 2) scores_any(&w, r0, hd, c0, sc, R);
            for (int r = 0; r < R; r++) {
                const int64_t row = r0 + r;
                vk total = load_k(w.total + row * KEYS);
                softmax_step((const vk *)sc[r], VECTORS, first_ctx + row / group - t0,
                             w.max + row, &total, w.p + row * STEP, w.rescale + row, 1);
                store_k(w.total + row * KEYS, total);
                quantize_weights(&w, row);
            }
        }
        /* a row's probabilities past its own context are zero: one count for every row */
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {
            if (rows - r0 < VALUE_ROWS)
                values_rows(&w, r0, hd, count, 1);
            else
                values_rows(&w, r0, hd, count, VALUE_ROWS);
        }
    }
    reduced_write_out(a, &u, tile, kh, w.acc, w.total);
}

#endif
