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
 * rounded once, when written; the engine always does), else are rounded here, step by step, to
 * the same bytes (tile by tile: for callers without codes, the tests).
 * The step order is attention.c's (tiles are REDUCED_TILE queries: the staged keys serve more
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
#define GROUPS (STEP / 4) /* a step's lanes of four keys */
#define ALIGN(n) (((n) + 63) & ~(int64_t)63)

typedef struct {
    uint32_t *q;      /* [head_dim / 4][rows]: a row's four dims as bytes, scaled by the softmax
                         scale, then rounded (one row's groups `rows` apart: each step of
                         scores_for reads its rows' groups from one line) */
    int64_t rows;
    float *q_scale;   /* [rows] */
    int32_t *q_bias;  /* [rows]: 128 * the sum of the row's int8 values */
    /* the step's keys and values: from the cache's codes where it has them (kv_codes.h), else
     * staged (stage_step) in `own` */
    const uint32_t *k0, *k1; /* [head_dim / 4][k_stride]: the step's two vectors of keys, four
                                dims as bytes (+128) a lane */
    int64_t k_stride;
    const float *k_scale0, *k_scale1; /* [KEYS] each */
    const uint32_t *v0, *v1; /* [KEYS / 4][head_dim]: the step's two vectors of values, four
                                keys' bytes of one dim a lane */
    const float *v_scale0, *v_scale1; /* [KEYS] each */
    void *own;        /* step_bytes(head_dim): a step staged by its tile */
    float *p;         /* [rows][STEP]: the step's probabilities */
    uint32_t *weights; /* [rows][GROUPS]: the same times each key's value scale, as bytes, four
                          keys a lane, in units of the row's weight_scale */
    float *weight_scale; /* [rows] */
    float *acc;       /* [rows][head_dim] */
    float *total;     /* [rows][KEYS] */
    float *max, *rescale; /* [rows] */
} reduced_scratch;

const char *attention_reduced_kind(void) { return "int8 scores, int8 values"; }

int attention_reduced_available(void) { return 1; }

/* A staged step's bytes: keys ([head_dim / 4][STEP] lanes, then [STEP] scales), then values
 * ([GROUPS][head_dim] lanes, then [STEP] scales). */
static int64_t step_bytes(int64_t hd) {
    return 2 * (ALIGN(hd * STEP) + ALIGN(4 * STEP));
}

static void point_at_step(reduced_scratch *w, const char *step, int64_t hd) {
    w->k0 = (const uint32_t *)step, w->k1 = w->k0 + KEYS, w->k_stride = STEP;
    w->k_scale0 = (const float *)(step + ALIGN(hd * STEP)), w->k_scale1 = w->k_scale0 + KEYS;
    const char *values = step + step_bytes(hd) / 2;
    w->v0 = (const uint32_t *)values, w->v1 = w->v0 + (KEYS / 4) * hd;
    w->v_scale0 = (const float *)(values + ALIGN(hd * STEP)), w->v_scale1 = w->v_scale0 + KEYS;
}

/* The step's keys and values read in place from the cache's codes: each vector's block. */
static void point_at_codes(reduced_scratch *w, const attention_args *a, int64_t s, int64_t kh,
                           int64_t t0, int64_t count) {
    const int64_t hd = a->head_dim, bs = a->block_size;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    for (int c = 0; c < VECTORS; c++) { /* past the context: t0's, its scores are cut */
        const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
        uint32_t *block = kv_codes_block((uint32_t *)a->kv_codes, table[t / bs], kh,
                                         a->num_kv_heads, hd, bs);
        *(c ? &w->k1 : &w->k0) = block + t % bs;
        *(c ? &w->k_scale1 : &w->k_scale0) = (const float *)(block + (hd / 4) * bs) + t % bs;
        const uint32_t *value_codes = value_codes_of(block, hd, bs);
        *(c ? &w->v1 : &w->v0) = value_codes + (t % bs / 4) * hd;
        *(c ? &w->v_scale1 : &w->v_scale0) = (const float *)(value_codes + (bs / 4) * hd) + t % bs;
    }
    w->k_stride = bs;
}

static int64_t carve(reduced_scratch *w, char *base, int64_t rows, int64_t hd) {
    int64_t at = 0;
#define TAKE(field, bytes) (w->field = (void *)(base + at), at += ALIGN(bytes))
    TAKE(q, rows * hd);
    TAKE(q_scale, 4 * rows);
    TAKE(q_bias, 4 * rows);
    TAKE(own, step_bytes(hd));
    TAKE(p, 4 * rows * STEP);
    TAKE(weights, 4 * rows * GROUPS);
    TAKE(weight_scale, 4 * rows);
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

/* n (at most KEYS) values (rows `stride` apart) as int8 with a scale each (max |v| / 127; 0
 * stays 0; kv_codes.h's rounding), four keys' bytes of one dim a lane ([KEYS / 4][hd] lanes);
 * keys from n on are zeros. */
static inline void stage_values(const _Float16 *vb, int64_t stride, int64_t n, int64_t hd,
                                uint32_t *lanes, float *scale) {
    float inverse[KEYS];
    for (int t = 0; t < KEYS; t++) {
        __m512 top = _mm512_setzero_ps();
        for (int64_t d = 0; t < n && d < hd; d += 16)
            top = _mm512_max_ps(top, _mm512_abs_ps(f16_vector(vb + t * stride + d)));
        const float most = _mm512_reduce_max_ps(top);
        scale[t] = most * (1.f / 127.f);
        inverse[t] = most > 0.f ? 127.f / most : 0.f;
    }
    for (int g = 0; g < KEYS / 4; g++)
        for (int64_t d = 0; d < hd; d += 16) {
            __m512i lane = _mm512_setzero_si512();
            for (int i = 0; i < 4 && 4 * g + i < n; i++) {
                const __m512i code = _mm512_cvtps_epi32(_mm512_mul_ps(
                    f16_vector(vb + (4 * g + i) * stride + d), _mm512_set1_ps(inverse[4 * g + i])));
                lane = _mm512_or_si512(
                    lane, _mm512_slli_epi32(_mm512_and_si512(code, _mm512_set1_epi32(255)), 8 * i));
            }
            _mm512_storeu_si512(lanes + g * hd + d, lane);
        }
}

/* Keys [t0, t0 + count) of sequence s's KV head kh staged as the unit reads them (point_at_step's
 * layout, from `step`): keys as bytes +128, values as signed bytes, each with its scale. */
static void stage_step(const attention_args *a, int64_t s, int64_t kh, int64_t t0, int64_t count,
                       char *step) {
    const _Float16 *k_cache = a->k_cache, *v_cache = a->v_cache;
    const int64_t hd = a->head_dim, bs = a->block_size, kv = a->num_kv_heads;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    uint32_t *k = (uint32_t *)step;
    float *k_scale = (float *)(step + ALIGN(hd * STEP));
    char *values = step + step_bytes(hd) / 2;
    for (int c = 0; c < VECTORS; c++) { /* a vector never crosses a cache block */
        const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
        const int64_t block = table[t / bs], offset = t % bs;
        stage_keys(k_cache + (block * kv + kh) * hd * bs + offset, bs, hd, k + c * KEYS,
                   k_scale + c * KEYS);
        const int64_t n = count - c * KEYS;
        stage_values(v_cache + ((block * bs + offset) * kv + kh) * hd, kv * hd,
                     n < 0 ? 0 : n > KEYS ? KEYS : n, hd, (uint32_t *)values + c * (KEYS / 4) * hd,
                     (float *)(values + ALIGN(hd * STEP)) + c * KEYS);
    }
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
static inline void quantize_weights(reduced_scratch *w, int64_t r0, int R) {
    __m512 weights[SCORE_ROWS][VECTORS], top[SCORE_ROWS];
    /* a key past the context (its probability 0) may have any scale the cache holds: left out */
    const __m512 v_scale[VECTORS] = {_mm512_loadu_ps(w->v_scale0), _mm512_loadu_ps(w->v_scale1)};
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
static inline __attribute__((always_inline)) void values_for(const reduced_scratch *w, int64_t r0,
                                                            int64_t hd, int64_t d0, int64_t count,
                                                            const int R, const int S) {
    __m512i sums[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) sums[r][c] = _mm512_setzero_si512();
    for (int64_t g = 0; g < (count + 3) / 4; g++) {
        const uint32_t *lanes = g < KEYS / 4 ? w->v0 + g * hd : w->v1 + (g - KEYS / 4) * hd;
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

static inline __attribute__((always_inline)) void values_rows(const reduced_scratch *w, int64_t r0,
                                                             int64_t hd, int64_t count,
                                                             const int R) {
    int64_t d0 = 0;
    for (; d0 + 16 * VALUE_SLICES <= hd; d0 += 16 * VALUE_SLICES)
        values_for(w, r0, hd, d0, count, R, VALUE_SLICES);
    for (; d0 < hd; d0 += 16) values_for(w, r0, hd, d0, count, R, 1);
}

static inline void values_any(const reduced_scratch *w, int64_t r0, int64_t hd, int64_t count,
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
    reduced_scratch w;
    carve(&w, (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63), rows, hd);
    w.rows = rows;
    reduced_prepare_queries(a, &u, tile, kh, 127.f, w.q, w.q_scale, w.q_bias, w.max, w.total);
    memset(w.acc, 0, sizeof(float) * (size_t)(rows * hd));
    for (int64_t t0 = 0; t0 < last_ctx; t0 += STEP) {
        const int64_t count = last_ctx - t0 < STEP ? last_ctx - t0 : STEP;
        /* without codes, each step is staged here (a partial one's values end in zeros at
         * count): the same bytes as the codes */
        if (a->kv_codes != NULL) {
            point_at_codes(&w, a, s, kh, t0, count);
        } else {
            stage_step(a, s, kh, t0, count, w.own);
            point_at_step(&w, w.own, hd);
        }
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
