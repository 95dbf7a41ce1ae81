/*
 * Attention straight from the paged KV cache, for CPUs: decodes and prefill chunks alike.
 *
 * Every query token attends to its own sequence's cached tokens 0..position (its own K/V were
 * written before the call). The arithmetic for one query row never depends on what else is in
 * the call: keys are visited in blocks of KEYS in position order, and every sum (a score over
 * head_dim, the softmax's running maximum and total, the output over tokens) runs in an order
 * fixed by the code and by the row's own context length. So a token's attention output is the
 * same bits whether it is a decode, part of a prefill chunk of any size, or recomputed after a
 * preemption: with row-invariant matmuls, the engine's output does not depend on the batch.
 *
 * One unit of work is one sequence's tile of up to TILE query tokens and one KV head: the rows
 * are the tile's queries times the query heads sharing that KV head (GQA), so each block of K
 * and V is read once for all of them. The softmax is online (flash attention's): a running
 * maximum and total per row, the output rescaled when the maximum grows, so nothing the size of
 * the context is ever written out. K blocks are stored transposed: the scores of KEYS
 * consecutive keys are one vector, accumulated over head_dim by FMAs with no horizontal sums.
 * Scores, softmax and accumulation are float32. Vector code uses GCC/Clang vector extensions
 * of the target's own register width (KEYS lanes: 16 with AVX-512, 8 with AVX, 4 elsewhere):
 * a wider vector type has no machine mode there, and the compiler kept every one in memory
 * (prefill attention ran at 13 GFLOP/s on an AVX2 EPYC). KEYS is fixed per build, so a row's
 * arithmetic still never depends on the batch; across instruction sets it differs by rounding.
 *
 * Layouts (row-major):
 *   q, out           [num_tokens, num_heads, head_dim] (rows q_stride / out_stride apart)
 *   k cache          [num_blocks, num_kv_heads, head_dim, block_size]  (transposed blocks)
 *   v cache          [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables     [num_seqs, max_blocks] int64
 *   query_starts     [num_seqs + 1] int64: sequence s owns query tokens [starts[s], starts[s+1])
 *   first_positions  [num_seqs] int64: position of the sequence's first query token
 *
 * Units run on the pool (threads.c) in any order on any thread. Compiled without fast-math
 * flags: the summation order is the code's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "vec.h"

#define TILE 16
#define MAX_HEADS 128
#define MAX_HEAD_DIM 256
/* Rows computed together, as many as the registers hold: 8 score chains keep both FMA pipes
 * busy (a chain waits 4 cycles for its previous FMA); VALUE_ROWS rows of VALUE_SLICES output
 * slices, plus the values loaded, fill the registers when accumulating values (32 registers
 * with AVX-512 and NEON, 16 with AVX and SSE). */
#if defined(__AVX512F__)
#define KEYS 16
#define VALUE_ROWS 4
#elif defined(__AVX__)
#define KEYS 8
#define VALUE_ROWS 3
#else
#define KEYS 4
#define VALUE_ROWS 3
#endif
#define SCORE_ROWS 8
#define VALUE_SLICES 4

typedef float vk __attribute__((vector_size(4 * KEYS)));
typedef float vku __attribute__((vector_size(4 * KEYS), aligned(4)));
typedef int32_t vki __attribute__((vector_size(4 * KEYS)));

static inline vk load_k(const float *p) { return *(const vku *)p; }
static inline void store_k(float *p, vk v) { *(vku *)p = v; }
static inline vk splat_k(float value) { return (vk){0} + value; }
static inline vk vmax_k(vk a, vk b) {
    const vki take_a = a > b;
    return (vk)(((vki)a & take_a) | ((vki)b & ~take_a));
}

/* KEYS 16-bit values as floats (exact conversions): one vcvtph2ps (F16C, AVX-512) or NEON vcvt
 * where the target has it at this width, a value at a time elsewhere. */
static inline vk load_f16_k(const _Float16 *p) {
    vk out;
#if KEYS == 16
    const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &wide, sizeof out);
#elif KEYS == 8 && defined(__F16C__)
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &wide, sizeof out);
#elif KEYS == 4 && defined(__aarch64__)
    const float32x4_t four = vcvt_f32_f16(vld1_f16((const float16_t *)p));
    memcpy(&out, &four, sizeof out);
#else
    for (int i = 0; i < KEYS; i++) out[i] = (float)p[i];
#endif
    return out;
}

typedef uint16_t vk16u __attribute__((vector_size(2 * KEYS), aligned(2)));
static inline vk load_bf16_k(const uint16_t *p) {
    return (vk)(__builtin_convertvector(*(const vk16u *)p, vki) << 16);
}

/* exp(x) for x <= 0: vec.h's exp_nonpositive, the same operations at this width. */
DEFINE_EXP_NONPOSITIVE(exp_k, vk, vki, vmax_k, splat_k)

/* Lane i paired with lane i ^ distance. */
static inline vk swap_k(vk v, int distance) {
#if KEYS == 16
    switch (distance) {
    case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    }
#elif KEYS == 8
    switch (distance) {
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
    }
#else
    return distance == 2 ? __builtin_shufflevector(v, v, 2, 3, 0, 1)
                         : __builtin_shufflevector(v, v, 1, 0, 3, 2);
#endif
}

/* The maximum, and the sum, of the lanes, by a fixed tree. */
static inline float max_k(vk v) {
    for (int distance = KEYS / 2; distance >= 1; distance /= 2) v = vmax_k(v, swap_k(v, distance));
    return v[0];
}

static inline float sum_k(vk v) {
    for (int distance = KEYS / 2; distance >= 1; distance /= 2) v = v + swap_k(v, distance);
    return v[0];
}

/* One thread's scratch for a unit of at most `rows` rows. */
typedef struct {
    float *q;   /* [rows][head_dim], scaled */
    float *acc; /* [rows][head_dim] */
    float *p;   /* [rows][KEYS]: this block's probabilities */
    float *k;   /* [head_dim][KEYS]: this block's keys (16-bit caches: converted) */
    float *v;   /* [KEYS][head_dim]: this block's values (16-bit caches: converted) */
    float *total;                 /* [rows][KEYS]: the softmax's running total, per lane */
    float *max, *rescale;         /* [rows] */
} scratch;

typedef struct {
    const attention_args *a;
    const int64_t *unit_seq, *unit_first, *unit_head; /* per unit */
    scratch *scratches;                               /* per thread */
} attention_job;

/* Ask for the keys and values of the next positions while these are computed: cache
 * blocks are scattered in memory, so the hardware prefetchers cannot guess them. */
static inline void prefetch_rows(const void *start, int64_t row_bytes, int64_t stride_bytes,
                                 int64_t num_rows) {
    for (int64_t r = 0; r < num_rows; r++)
        for (int64_t offset = 0; offset < row_bytes; offset += 64)
            __builtin_prefetch((const char *)start + r * stride_bytes + offset, 0, 1);
}

/* Scores of KEYS keys for R rows: dimension d of the keys is KEYS floats at k + d * stride.
 * One FMA chain per row, in d order. */
static inline __attribute__((always_inline)) void scores_for(const float *q, int64_t head_dim,
                                                            const float *k, int64_t stride,
                                                            vk *out, const int R) {
    vk s[SCORE_ROWS];
    for (int r = 0; r < R; r++) s[r] = splat_k(0.f);
    for (int64_t d = 0; d < head_dim; d++) {
        const vk key = load_k(k + d * stride);
        for (int r = 0; r < R; r++) s[r] += q[r * head_dim + d] * key;
    }
    for (int r = 0; r < R; r++) out[r] = s[r];
}

static inline __attribute__((always_inline)) void scores_any(const float *q, int64_t head_dim,
                                                            const float *k, int64_t stride,
                                                            vk *out, int R) {
    switch (R) { /* each row count its own unrolled loops */
    case 1: scores_for(q, head_dim, k, stride, out, 1); break;
    case 2: scores_for(q, head_dim, k, stride, out, 2); break;
    case 3: scores_for(q, head_dim, k, stride, out, 3); break;
    case 4: scores_for(q, head_dim, k, stride, out, 4); break;
    case 5: scores_for(q, head_dim, k, stride, out, 5); break;
    case 6: scores_for(q, head_dim, k, stride, out, 6); break;
    case 7: scores_for(q, head_dim, k, stride, out, 7); break;
    default: scores_for(q, head_dim, k, stride, out, SCORE_ROWS); break;
    }
}

/* For R rows and S slices of KEYS dimensions from d0: acc[r] = acc[r] * rescale[r] +
 * sum_j p[r][j] * v[j * stride], j < most in order, each slice of each row its own chain (one
 * load of v serves every row). */
static inline __attribute__((always_inline)) void accumulate_slices(
    float *acc, const float *rescale, const float *p, int64_t most, const float *v,
    int64_t stride, int64_t head_dim, int64_t d0, const int R, const int S) {
    vk a[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) a[r][c] = load_k(acc + r * head_dim + d0 + c * KEYS) * rescale[r];
    for (int64_t j = 0; j < most; j++) {
        for (int c = 0; c < S; c++) {
            const vk value = load_k(v + j * stride + d0 + c * KEYS);
            for (int r = 0; r < R; r++) a[r][c] += p[r * KEYS + j] * value;
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) store_k(acc + r * head_dim + d0 + c * KEYS, a[r][c]);
}

/* accumulate_slices over the head. count[r]: the keys row r sees, at most KEYS. */
static inline __attribute__((always_inline)) void accumulate_rows(
    float *acc, const float *rescale, const float *p, const int64_t *count, const float *v,
    int64_t stride, int64_t head_dim, const int R) {
    int64_t most = 0; /* a row's probabilities past its own count are zero: adding them is exact */
    for (int r = 0; r < R; r++) most = count[r] > most ? count[r] : most;
    int64_t d0 = 0;
    for (; d0 + VALUE_SLICES * KEYS <= head_dim; d0 += VALUE_SLICES * KEYS)
        accumulate_slices(acc, rescale, p, most, v, stride, head_dim, d0, R, VALUE_SLICES);
    for (; d0 < head_dim; d0 += KEYS)
        accumulate_slices(acc, rescale, p, most, v, stride, head_dim, d0, R, 1);
}

static inline __attribute__((always_inline)) void accumulate_any(
    float *acc, const float *rescale, const float *p, const int64_t *count, const float *v,
    int64_t stride, int64_t head_dim, int R) {
    switch (R) {
    case 1: accumulate_rows(acc, rescale, p, count, v, stride, head_dim, 1); break;
    case 2: accumulate_rows(acc, rescale, p, count, v, stride, head_dim, 2); break;
#if VALUE_ROWS > 3
    case 3: accumulate_rows(acc, rescale, p, count, v, stride, head_dim, 3); break;
#endif
    default: accumulate_rows(acc, rescale, p, count, v, stride, head_dim, VALUE_ROWS); break;
    }
}

/* Lanes j >= visible set to `fill` (the last block a row sees is cut at its position). */
static inline vk cut(vk x, int64_t visible, float fill) {
    if (visible >= KEYS) return x;
    vki lane;
    for (int j = 0; j < KEYS; j++) lane[j] = j;
    const vki keep = lane < (vki){0} + (int32_t)visible;
    return (vk)(((vki)x & keep) | ((vki)splat_k(fill) & ~keep));
}

/* T: the type of q and out; C: of the caches (LOAD_VEC converts KEYS values of it). */
#define DEFINE_UNIT(NAME, T, LOAD, STORE, C, LOAD_VEC)                                  \
static void NAME(const attention_args *a, int64_t s, int64_t tile, int64_t kh,                  \
                 const scratch *w) {                                                            \
    const T *q = a->q;                                                                          \
    const C *k_cache = a->k_cache, *v_cache = a->v_cache;                                       \
    T *out = a->out;                                                                            \
    const int64_t hd = a->head_dim, bs = a->block_size, kv = a->num_kv_heads;                   \
    const int64_t group = a->num_heads / kv;                                                    \
    const int64_t *table = a->block_tables + s * a->max_blocks;                                 \
    const int64_t seq_end = a->query_starts[s + 1];                                             \
    const int64_t n = seq_end - tile < TILE ? seq_end - tile : TILE;                            \
    const int64_t first_ctx = a->first_positions[s] + (tile - a->query_starts[s]) + 1;          \
    const int64_t last_ctx = first_ctx + n - 1;                                                 \
    const int64_t rows = n * group; /* row i * group + g: query i, head kh * group + g */       \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t g = 0; g < group; g++)                                                     \
            for (int64_t d = 0; d < hd; d++)                                                    \
                w->q[(i * group + g) * hd + d] =                                                \
                    LOAD(q[(tile + i) * a->q_stride + (kh * group + g) * hd + d]) * a->scale;   \
    memset(w->acc, 0, sizeof(float) * (size_t)(rows * hd));                                     \
    for (int64_t r = 0; r < rows; r++) {                                                        \
        w->max[r] = -INFINITY;                                                                  \
        store_k(w->total + r * KEYS, splat_k(0.f));                                             \
    }                                                                                           \
    for (int64_t t0 = 0; t0 < last_ctx; t0 += KEYS) {                                           \
        const int64_t block = table[t0 / bs], offset = t0 % bs;                                 \
        if (n == 1 && offset == 0 && t0 + bs < last_ctx) { /* decodes: the next cache block */\
            const int64_t next = table[t0 / bs + 1];                                            \
            prefetch_rows(k_cache + (next * kv + kh) * hd * bs, hd * bs * sizeof(C), 0, 1);     \
            prefetch_rows(v_cache + (next * bs * kv + kh) * hd, hd * sizeof(C),                 \
                          kv * hd * sizeof(C), bs);                                             \
        }                                                                                       \
        const C *kb = k_cache + (block * kv + kh) * hd * bs + offset;                           \
        const int64_t count = last_ctx - t0 < KEYS ? last_ctx - t0 : KEYS;                      \
        const C *vb = v_cache + ((block * bs + offset) * kv + kh) * hd;                         \
        const float *keys = (const float *)kb, *values = (const float *)vb; /* f32: in place */ \
        int64_t key_stride = bs, stride = kv * hd;                                              \
        if (sizeof(C) != sizeof(float)) { /* 16-bit: converted once for every row */            \
            for (int64_t d = 0; d < hd; d++) store_k(w->k + d * KEYS, LOAD_VEC(kb + d * bs));   \
            for (int64_t j = 0; j < count; j++)                                                 \
                for (int64_t d = 0; d < hd; d += KEYS)                                          \
                    store_k(w->v + j * hd + d, LOAD_VEC(vb + j * kv * hd + d));                 \
            keys = w->k, values = w->v;                                                         \
            key_stride = KEYS, stride = hd;                                                     \
        }                                                                                       \
        /* rows of queries that see none of these keys skip the block */                        \
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;           \
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {                            \
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;               \
            vk sc[SCORE_ROWS];                                                                  \
            scores_any(w->q + r0 * hd, hd, keys, key_stride, sc, R);                            \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t row = r0 + r;                                                     \
                const int64_t visible = first_ctx + row / group - t0; /* keys of this block */ \
                const vk scores = cut(sc[r], visible, -INFINITY);                               \
                const float top = fmaxf(w->max[row], max_k(scores));                           \
                const vk prob = cut(exp_k(scores - top), visible, 0.f);                         \
                const float rescale = top == w->max[row] ? 1.f : expf(w->max[row] - top);       \
                /* per lane; summed across lanes once, at the end */                            \
                store_k(w->total + row * KEYS, load_k(w->total + row * KEYS) * rescale + prob); \
                w->max[row] = top;                                                              \
                w->rescale[row] = rescale;                                                      \
                store_k(w->p + row * KEYS, prob);                                               \
            }                                                                                   \
        }                                                                                       \
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {                            \
            const int R = rows - r0 < VALUE_ROWS ? (int)(rows - r0) : VALUE_ROWS;               \
            int64_t seen[VALUE_ROWS];                                                           \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t visible = first_ctx + (r0 + r) / group - t0;                      \
                seen[r] = visible < count ? visible : count;                                    \
            }                                                                                   \
            accumulate_any(w->acc + r0 * hd, w->rescale + r0, w->p + r0 * KEYS, seen, values,   \
                           stride, hd, R);                                                      \
        }                                                                                       \
    }                                                                                           \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t g = 0; g < group; g++) {                                                   \
            const int64_t row = i * group + g;                                                  \
            const float inverse = 1.f / sum_k(load_k(w->total + row * KEYS));                  \
            T *o = out + (tile + i) * a->out_stride + (kh * group + g) * hd;                    \
            for (int64_t d = 0; d < hd; d++) o[d] = STORE(w->acc[row * hd + d] * inverse);     \
        }                                                                                       \
}

#define IDENTITY(x) (x)
DEFINE_UNIT(unit_f32, float, IDENTITY, IDENTITY, float, load_k)
DEFINE_UNIT(unit_bf16, uint16_t, bf16_to_f32, f32_to_bf16, uint16_t, load_bf16_k)
DEFINE_UNIT(unit_f16_cache, float, IDENTITY, IDENTITY, _Float16, load_f16_k)

static void attention_item(void *ctx, int64_t item, int thread) {
    const attention_job *job = ctx;
    const scratch *w = &job->scratches[thread];
    const int64_t s = job->unit_seq[item], tile = job->unit_first[item];
    if (job->a->dtype == ATTENTION_BF16)
        unit_bf16(job->a, s, tile, job->unit_head[item], w);
    else if (job->a->dtype == ATTENTION_F32_F16_CACHE)
        unit_f16_cache(job->a, s, tile, job->unit_head[item], w);
    else
        unit_f32(job->a, s, tile, job->unit_head[item], w);
}

int attention(pool *p, const attention_args *a) {
    if (a->num_heads > MAX_HEADS || a->head_dim > MAX_HEAD_DIM || a->head_dim % LANES ||
        a->num_heads % a->num_kv_heads || a->block_size % LANES ||
        a->q_stride < a->num_heads * a->head_dim || a->out_stride < a->num_heads * a->head_dim)
        return -1;
    int64_t num_tiles = 0;
    for (int64_t s = 0; s < a->num_seqs; s++)
        num_tiles += (a->query_starts[s + 1] - a->query_starts[s] + TILE - 1) / TILE;
    const int64_t num_units = num_tiles * a->num_kv_heads;
    const int num_threads = pool_size(p);
    const int64_t hd = a->head_dim, rows = TILE * (a->num_heads / a->num_kv_heads);
    const int64_t per_thread = 2 * rows * hd + 2 * rows * KEYS + 2 * KEYS * hd + 2 * rows;
    float *memory = malloc(sizeof(float) * (size_t)(per_thread * num_threads));
    int64_t *units = malloc(sizeof(int64_t) * (size_t)(3 * num_units + 1));
    scratch *scratches = malloc(sizeof(scratch) * (size_t)num_threads);
    if (memory == NULL || units == NULL || scratches == NULL) {
        free(memory); free(units); free(scratches);
        return -2;
    }
    for (int t = 0; t < num_threads; t++) {
        float *m = memory + t * per_thread;
        scratches[t] = (scratch){.q = m, .acc = m + rows * hd};
        scratches[t].p = scratches[t].acc + rows * hd;
        scratches[t].k = scratches[t].p + rows * KEYS;
        scratches[t].v = scratches[t].k + hd * KEYS;
        scratches[t].total = scratches[t].v + KEYS * hd;
        scratches[t].max = scratches[t].total + rows * KEYS;
        scratches[t].rescale = scratches[t].max + rows;
    }
    int64_t u = 0;
    for (int64_t s = 0; s < a->num_seqs; s++)
        for (int64_t first = a->query_starts[s]; first < a->query_starts[s + 1]; first += TILE)
            for (int64_t kh = 0; kh < a->num_kv_heads; kh++, u++) {
                units[u] = s;
                units[num_units + u] = first;
                units[2 * num_units + u] = kh;
            }
    attention_job job = {a, units, units + num_units, units + 2 * num_units, scratches};
    pool_run(p, attention_item, &job, num_units);
    free(memory); free(units); free(scratches);
    return 0;
}
