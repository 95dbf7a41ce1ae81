/*
 * What attention.c and the reduced-precision units (attention_amx.c, attention_reduced.c) share:
 * the units' shapes, the softmax step, the values' bfloat16 staging and the reduced unit's entry
 * points.
 */
#ifndef TITAN_ATTENTION_H
#define TITAN_ATTENTION_H

#include <math.h>
#include <stdint.h>

#include "cpu.h"
#include "kv_codes.h"
#include "vec_keys.h"

#define TILE 16
/* The reduced-precision units' tiles: keys and values are staged (rounded, laid out for the dot
 * product instructions) once per tile, for every row of it. */
#define REDUCED_TILE 64
#define MAX_HEAD_DIM 256
/* Keys per softmax step on every target: the running maximum, the rescale and the totals are
 * updated once per STEP keys, not per vector (the bookkeeping was a quarter of the time with a
 * step of one vector). */
#define STEP 32
#define VECTORS (STEP / KEYS) /* vectors of keys per step */

/* One row's softmax over a step's scores (`vectors` vectors of KEYS, at most MAX_VECTORS):
 * probabilities into p, the running maximum and total updated, the factor for its earlier
 * output into *rescale. */
#define MAX_VECTORS 8

/* exp(x) for x <= 0 to a relative 1.0e-4 (2^f on [-0.5, 0.5] by a degree-3 polynomial, then
 * vscalefps), half the instructions of exp_k: for the reduced units, whose int8 scores (and
 * bfloat16 or byte-rounded probabilities) err far more. Lanes of -inf come out NaN (or -inf
 * with AVX2): the caller cuts them. Without AVX-512 or AVX2, exp_k. */
static inline vk exp_coarse_k(vk x) {
#if KEYS == 16 && defined(__AVX512F__)
    __m512 t;
    memcpy(&t, &x, sizeof t);
    t = _mm512_mul_ps(t, _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_fmadd_ps(_mm512_set1_ps(5.531998351e-2f), f, _mm512_set1_ps(2.429797202e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.932677627e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.999017715e-1f));
    p = _mm512_scalef_ps(p, n);
    vk out;
    memcpy(&out, &p, sizeof out);
    return out;
#elif KEYS == 8 && defined(__AVX2__) && defined(__FMA__)
    /* the same polynomial; 2^n built in the exponent bits (n held at -126 and up: below that
     * the result is under 2^-126, as good as 0 after a softmax) */
    __m256 t;
    memcpy(&t, &x, sizeof t);
    t = _mm256_mul_ps(t, _mm256_set1_ps(1.44269504088896341f));
    const __m256 n = _mm256_max_ps(
        _mm256_round_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC), _mm256_set1_ps(-126.f));
    const __m256 f = _mm256_sub_ps(t, n);
    __m256 p = _mm256_fmadd_ps(_mm256_set1_ps(5.531998351e-2f), f, _mm256_set1_ps(2.429797202e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(6.932677627e-1f));
    p = _mm256_fmadd_ps(p, f, _mm256_set1_ps(9.999017715e-1f));
    const __m256i two_to_n = _mm256_slli_epi32(
        _mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    p = _mm256_mul_ps(p, _mm256_castsi256_ps(two_to_n));
    vk out;
    memcpy(&out, &p, sizeof out);
    return out;
#else
    return exp_k(x);
#endif
}

/* `coarse`: exp_coarse_k (the reduced units), else exp_k. A constant at every call. */
static inline __attribute__((always_inline)) void softmax_step(
    const vk *scores, const int vectors, int64_t visible, float *max, vk *total, float *p,
    float *rescale, const int coarse) {
    vk cut_scores[MAX_VECTORS];
    vk top_lanes = splat_k(-INFINITY);
    for (int c = 0; c < vectors; c++) {
        cut_scores[c] = cut(scores[c], visible - c * KEYS, -INFINITY);
        top_lanes = vmax_k(top_lanes, cut_scores[c]);
    }
    /* Past the first steps the maximum seldom grows: the lanes' reduction, the exponential of
     * the change and the rescale run only when it does (the same bits either way). */
    float top = *max, factor = 1.f;
    vk sum = *total;
    if (any_above(top_lanes, top)) {
        top = max_k(top_lanes);
        factor = expf(*max - top);
        sum = sum * factor;
    }
    for (int c = 0; c < vectors; c++) {
        const vk shifted = cut_scores[c] - top;
        const vk prob = cut(coarse ? exp_coarse_k(shifted) : exp_k(shifted), visible - c * KEYS, 0.f);
        sum += prob; /* per lane; summed across lanes once, at the end */
        store_k(p + c * KEYS, prob);
    }
    *total = sum;
    *max = top;
    *rescale = factor;
}


/* The reduced units' shape: sequence s's queries from `tile` (at most REDUCED_TILE), their rows
 * (query i, head kh * group + g at row i * group + g) and the keys the first and last see. */
typedef struct {
    int64_t n, group, rows, first_ctx, last_ctx;
} reduced_shape;

static inline reduced_shape reduced_shape_of(const attention_args *a, int64_t s, int64_t tile) {
    reduced_shape u;
    const int64_t seq_end = a->query_starts[s + 1];
    u.n = seq_end - tile < REDUCED_TILE ? seq_end - tile : REDUCED_TILE;
    u.group = a->num_heads / a->num_kv_heads;
    u.rows = u.n * u.group;
    u.first_ctx = a->first_positions[s] + (tile - a->query_starts[s]) + 1;
    u.last_ctx = u.first_ctx + u.n - 1;
    return u;
}

/* The int8 units' queries: each row of the tile, times the softmax scale, rounded to integers of
 * -levels..levels with a scale of its own (max |q| / levels; 0 stays 0), laid out as
 * [head_dim / 4][rows] lanes of four dims (one row's groups `rows` apart), with 128 * the sum of
 * its integers (the keys' +128 taken back); each row's softmax state started. */
static inline void reduced_prepare_queries(const attention_args *a, const reduced_shape *u,
                                           int64_t tile, int64_t kh, float levels, uint32_t *q,
                                           float *q_scale, int32_t *q_bias, float *max,
                                           float *total) {
    const int64_t hd = a->head_dim;
    int8_t row_q[MAX_HEAD_DIM];
    for (int64_t i = 0; i < u->n; i++)
        for (int64_t g = 0; g < u->group; g++) {
            const int64_t row = i * u->group + g;
            const float *x =
                (const float *)a->q + (tile + i) * a->q_stride + (kh * u->group + g) * hd;
            float top = 0.f;
            for (int64_t d = 0; d < hd; d++) top = fmaxf(top, fabsf(x[d] * a->scale));
            const float inverse = top > 0.f ? levels / top : 0.f;
            int32_t sum = 0;
            for (int64_t d = 0; d < hd; d++) {
                row_q[d] = (int8_t)lrintf(x[d] * a->scale * inverse);
                sum += row_q[d];
            }
            q_scale[row] = top / levels;
            q_bias[row] = 128 * sum;
            for (int64_t four = 0; four < hd / 4; four++)
                memcpy(q + four * u->rows + row, row_q + 4 * four, 4);
            max[row] = -INFINITY;
            store_k(total + row * KEYS, splat_k(0.f));
        }
}

/* A step's keys and values as the int8 units read them (attention_reduced.c, attention_avx2.c):
 * each vector of KEYS keys in a block of codes (kv_codes.h). */
typedef struct {
    const uint32_t *k[VECTORS];    /* [head_dim / 4][k_stride]: four dims as bytes (+128) a lane */
    const float *k_scale[VECTORS]; /* [KEYS] each */
    const uint32_t *v[VECTORS];    /* [KEYS / 4][head_dim]: four keys' bytes of one dim a lane */
    const float *v_scale[VECTORS]; /* [KEYS] each */
    int64_t k_stride;
} int8_step;

static inline void int8_step_vector(int8_step *step, int c, uint32_t *block, int64_t at,
                                    int64_t hd, int64_t bs) {
    step->k[c] = block + at;
    step->k_scale[c] = (const float *)(block + (hd / 4) * bs) + at;
    const uint32_t *values = value_codes_of(block, hd, bs);
    step->v[c] = values + (at / 4) * hd;
    step->v_scale[c] = (const float *)(values + (bs / 4) * hd) + at;
    step->k_stride = bs;
}

/* Keys [t0, t0 + count) of sequence s's KV head kh: in place in the cache's codes, or, for a
 * caller that keeps none (the tests), their codes written into `own` (KV_CODE_WORDS(head_dim) *
 * STEP words) as one block of STEP keys by kv_codes.h itself: the same bytes. Keys past the
 * context are t0's vector (in the cache) or zeros (in `own`): their weights are 0. */
static inline void int8_step_at(int8_step *step, const attention_args *a, int64_t s, int64_t kh,
                                int64_t t0, int64_t count, uint32_t *own) {
    const int64_t hd = a->head_dim, bs = a->block_size, kv = a->num_kv_heads;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    if (a->kv_codes != NULL) {
        for (int c = 0; c < VECTORS; c++) {
            const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
            int8_step_vector(step, c,
                             kv_codes_block((uint32_t *)a->kv_codes, table[t / bs], kh, kv, hd, bs),
                             t % bs, hd, bs);
        }
        return;
    }
    const _Float16 *k_cache = a->k_cache, *v_cache = a->v_cache;
    const float zeros[KV_CODE_MAX_DIM] = {0};
    for (int64_t j = 0; j < STEP; j++) {
        const int64_t block = table[(j < count ? t0 + j : t0) / bs], at = (t0 + j) % bs;
        if (j < count) {
            write_key_code_f16(k_cache + (block * kv + kh) * hd * bs + at, bs, hd, own, STEP, j);
            write_value_code_f16(v_cache + ((block * bs + at) * kv + kh) * hd, hd, own, STEP, j);
        } else {
            write_key_code(zeros, hd, own, STEP, j);
            write_value_code(zeros, hd, own, STEP, j);
        }
    }
    for (int c = 0; c < VECTORS; c++) int8_step_vector(step, c, own, c * KEYS, hd, STEP);
}

#define GROUPS (STEP / 4) /* a step's lanes of four keys */

/* The int8 units' scratch for one tile, carved from a thread's memory. */
typedef struct {
    uint32_t *q;      /* [head_dim / 4][rows]: a row's four dims as integers, from
                         reduced_prepare_queries (one row's groups `rows` apart: each step of the
                         scores' loop reads its rows' groups from one line) */
    int64_t rows;
    float *q_scale;   /* [rows] */
    int32_t *q_bias;  /* [rows]: 128 * the sum of the row's integers */
    int8_step step;   /* the step's keys and values (int8_step_at) */
    uint32_t *own;    /* a step's codes where the caller keeps none */
    float *p;         /* [rows][STEP]: the step's probabilities */
    uint32_t *weights; /* [rows][GROUPS]: the same times each key's value scale, as bytes, four
                          keys a lane, in units of the row's weight_scale */
    float *weight_scale; /* [rows] */
    float *acc;       /* [rows][head_dim] */
    float *total;     /* [rows][KEYS] */
    float *max, *rescale; /* [rows] */
} int8_scratch;

/* Points w's arrays into `base` (64-byte aligned each, for `rows` rows); the bytes it takes. */
static inline int64_t int8_carve(int8_scratch *w, char *base, int64_t rows, int64_t hd) {
    int64_t at = 0;
#define TAKE(field, bytes) (w->field = (void *)(base + at), at += ((bytes) + 63) & ~(int64_t)63)
    TAKE(q, rows * hd);
    TAKE(q_scale, 4 * rows);
    TAKE(q_bias, 4 * rows);
    TAKE(own, 4 * KV_CODE_WORDS(hd) * STEP);
    TAKE(p, 4 * rows * STEP);
    TAKE(weights, 4 * rows * GROUPS);
    TAKE(weight_scale, 4 * rows);
    TAKE(acc, 4 * rows * hd);
    TAKE(total, 4 * rows * KEYS);
    TAKE(max, 4 * rows);
    TAKE(rescale, 4 * rows);
#undef TAKE
    w->rows = rows;
    return at;
}

/* The unit's outputs: each row's sums over its softmax total. */
static inline void reduced_write_out(const attention_args *a, const reduced_shape *u, int64_t tile,
                                     int64_t kh, const float *acc, const float *total) {
    const int64_t hd = a->head_dim;
    for (int64_t i = 0; i < u->n; i++)
        for (int64_t g = 0; g < u->group; g++) {
            const int64_t row = i * u->group + g;
            const float inverse = 1.f / sum_k(load_k(total + row * KEYS));
            float *o = (float *)a->out + (tile + i) * a->out_stride + (kh * u->group + g) * hd;
            for (int64_t d = 0; d < hd; d++) o[d] = acc[row * hd + d] * inverse;
        }
}

#if defined(__AVX512BF16__) && defined(__AVX512BW__)
#include <immintrin.h>

/* Two float vectors as one vector of bfloat16 pairs, a's value in the low half of each lane:
 * one conversion of both, then the halves interleaved. */
static inline __m512i bf16_pairs(__m512 a, __m512 b) {
    const __m512i interleave = _mm512_set_epi16(
        31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8,
        23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
    return _mm512_permutexvar_epi16(interleave, (__m512i)_mm512_cvtne2ps_pbh(b, a));
}

static inline __m512 f16_vector(const _Float16 *p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
}

/* Values of keys j and j + 1 (row1 NULL past the context: zeros) as one bfloat16 pair per dim,
 * the layout both reduced units sum values from. */
static inline void stage_value_pair(const _Float16 *row0, const _Float16 *row1, int64_t hd,
                                    uint32_t *out) {
    for (int64_t d = 0; d < hd; d += 16)
        _mm512_storeu_si512(out + d, bf16_pairs(f16_vector(row0 + d),
                                                row1 ? f16_vector(row1 + d) : _mm512_setzero_ps()));
}
#endif

/* attention_amx.c (AMX-BF16), attention_reduced.c (AVX-512 VNNI and BF16) or attention_avx2.c
 * (AVX2 and FMA without AVX-512): one of them builds the reduced-precision unit, or none. 1
 * where this build has it and the CPU lets it run (AMX's state is asked of the kernel here),
 * else 0 and the float32 unit serves ATTENTION_F32_F16_CACHE_REDUCED. */
int attention_reduced_available(void);
/* What the unit computes in, for the engine's log line ("float32" where there is none). */
const char *attention_reduced_kind(void);
/* Bytes of scratch one thread needs for units of `rows` rows. */
int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim);
/* One unit: sequence s's tile of queries from `tile`, KV head kh (as attention.c's units). */
void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            void *scratch);

#endif
