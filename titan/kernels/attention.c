/*
 * Attention straight from the paged KV cache, for CPUs: decodes and prefill chunks alike.
 *
 * Every query token attends to its own sequence's cached tokens 0..position (its own K/V were
 * written before the call). The arithmetic for one query row never depends on what else is in
 * the call: keys are visited in steps of STEP in position order, and every sum (a score over
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
 * Each step's keys and values are first copied (16-bit caches: converted) into the thread's
 * scratch, contiguous and in L1, once for all the unit's rows. Scores, softmax and
 * accumulation are float32, in vectors of the target's register width (vec_keys.h). KEYS is
 * fixed per build, so a row's arithmetic still never depends on the batch; across instruction
 * sets it differs by rounding.
 *
 * ATTENTION_F32_F16_CACHE_REDUCED (the quantized model's default) hands every unit to a
 * reduced-precision unit where the build has one and the CPU lets it run (attention_amx.c,
 * attention_reduced.c: bfloat16 or int8 arithmetic, tiles of REDUCED_TILE queries, the same
 * row-only rule); else the float16-cache unit below serves it.
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

#include "attention.h"
#include "cpu.h"
#include "vec.h"
#include "vec_keys.h"

#define MAX_HEADS 128
/* Register blocking, as many rows as the registers hold: SCORE_ROWS rows times the step's
 * vectors of scores; VALUE_ROWS rows times VALUE_SLICES output slices, plus the slices of one
 * value row (32 registers with AVX-512 and NEON, 16 with AVX and SSE). */
#if defined(__AVX512F__)
#define SCORE_ROWS 8
#define VALUE_ROWS 6
#define VALUE_SLICES 4
#elif defined(__AVX__)
#define SCORE_ROWS 3
#define VALUE_ROWS 5
#define VALUE_SLICES 2
#else
#define SCORE_ROWS 2
#define VALUE_ROWS 4
#define VALUE_SLICES 4
#endif
_Static_assert(SCORE_ROWS <= 8 && VALUE_ROWS <= 6, "the row-count switches below stop there");

/* One thread's scratch for a unit of at most `rows` rows. */
typedef struct {
    float *q;   /* [rows][head_dim], scaled */
    float *acc; /* [rows][head_dim] */
    float *p;   /* [rows][STEP]: this step's probabilities */
    float *k;   /* [head_dim][STEP]: this step's keys, as floats */
    float *v;   /* [STEP][head_dim]: this step's values, as floats */
    float *total;                 /* [rows][KEYS]: the softmax's running total, per lane */
    float *max, *rescale;         /* [rows] */
    float *reduced;               /* attention_reduced.c's own */
} scratch;

typedef struct {
    const attention_args *a;
    const int64_t *unit_seq, *unit_first, *unit_head; /* per unit */
    scratch *scratches;                               /* per thread */
    int reduced; /* attention_reduced_unit serves every unit */
} attention_job;

/* Ask for the keys and values of the next positions while these are computed: cache
 * blocks are scattered in memory, so the hardware prefetchers cannot guess them. */
static inline void prefetch_rows(const void *start, int64_t row_bytes, int64_t stride_bytes,
                                 int64_t num_rows) {
    for (int64_t r = 0; r < num_rows; r++)
        for (int64_t offset = 0; offset < row_bytes; offset += 64)
            __builtin_prefetch((const char *)start + r * stride_bytes + offset, 0, 1);
}

/* Scores of the step's STEP keys for R rows (k: [head_dim][STEP]). One FMA chain per row and
 * vector, in d order. */
static inline __attribute__((always_inline)) void scores_for(const float *q, int64_t head_dim,
                                                            const float *k, vk *out, const int R) {
    vk s[SCORE_ROWS][VECTORS];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < VECTORS; c++) s[r][c] = splat_k(0.f);
    for (int64_t d = 0; d < head_dim; d++) {
        vk key[VECTORS];
        for (int c = 0; c < VECTORS; c++) key[c] = load_k(k + d * STEP + c * KEYS);
        for (int r = 0; r < R; r++) {
            const float qd = q[r * head_dim + d];
            for (int c = 0; c < VECTORS; c++) s[r][c] += qd * key[c];
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < VECTORS; c++) out[r * VECTORS + c] = s[r][c];
}

static inline __attribute__((always_inline)) void scores_any(const float *q, int64_t head_dim,
                                                            const float *k, vk *out, int R) {
    switch (R) { /* each row count below SCORE_ROWS its own unrolled loops */
    case 1: scores_for(q, head_dim, k, out, 1); break;
#if SCORE_ROWS > 2
    case 2: scores_for(q, head_dim, k, out, 2); break;
#endif
#if SCORE_ROWS > 3
    case 3: scores_for(q, head_dim, k, out, 3); break;
#endif
#if SCORE_ROWS > 4
    case 4: scores_for(q, head_dim, k, out, 4); break;
#endif
#if SCORE_ROWS > 5
    case 5: scores_for(q, head_dim, k, out, 5); break;
#endif
#if SCORE_ROWS > 6
    case 6: scores_for(q, head_dim, k, out, 6); break;
#endif
#if SCORE_ROWS > 7
    case 7: scores_for(q, head_dim, k, out, 7); break;
#endif
    default: scores_for(q, head_dim, k, out, SCORE_ROWS); break;
    }
}

/* For R rows and S slices of KEYS dimensions from d0: acc[r] = acc[r] * rescale[r] +
 * sum_j p[r][j] * v[j], j < most in order, each slice of each row its own chain (one load of
 * a value slice serves every row). */
static inline __attribute__((always_inline)) void accumulate_slices(
    float *acc, const float *rescale, const float *p, int64_t most, const float *v,
    int64_t head_dim, int64_t d0, const int R, const int S) {
    vk a[VALUE_ROWS][VALUE_SLICES];
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) a[r][c] = load_k(acc + r * head_dim + d0 + c * KEYS) * rescale[r];
    for (int64_t j = 0; j < most; j++) {
        vk value[VALUE_SLICES];
        for (int c = 0; c < S; c++) {
            value[c] = load_k(v + j * head_dim + d0 + c * KEYS);
            PIN(value[c]);
        }
        for (int r = 0; r < R; r++) {
            const float pj = p[r * STEP + j];
            for (int c = 0; c < S; c++) a[r][c] += pj * value[c];
        }
    }
    for (int r = 0; r < R; r++)
        for (int c = 0; c < S; c++) store_k(acc + r * head_dim + d0 + c * KEYS, a[r][c]);
}

/* accumulate_slices over the head. count[r]: the keys row r sees, at most STEP. */
static inline __attribute__((always_inline)) void accumulate_rows(
    float *acc, const float *rescale, const float *p, const int64_t *count, const float *v,
    int64_t head_dim, const int R) {
    int64_t most = 0; /* a row's probabilities past its own count are zero: adding them is exact */
    for (int r = 0; r < R; r++) most = count[r] > most ? count[r] : most;
    int64_t d0 = 0;
    for (; d0 + VALUE_SLICES * KEYS <= head_dim; d0 += VALUE_SLICES * KEYS)
        accumulate_slices(acc, rescale, p, most, v, head_dim, d0, R, VALUE_SLICES);
    for (; d0 < head_dim; d0 += KEYS)
        accumulate_slices(acc, rescale, p, most, v, head_dim, d0, R, 1);
}

static inline __attribute__((always_inline)) void accumulate_any(
    float *acc, const float *rescale, const float *p, const int64_t *count, const float *v,
    int64_t head_dim, int R) {
    switch (R) {
    case 1: accumulate_rows(acc, rescale, p, count, v, head_dim, 1); break;
    case 2: accumulate_rows(acc, rescale, p, count, v, head_dim, 2); break;
#if VALUE_ROWS > 3
    case 3: accumulate_rows(acc, rescale, p, count, v, head_dim, 3); break;
#endif
#if VALUE_ROWS > 4
    case 4: accumulate_rows(acc, rescale, p, count, v, head_dim, 4); break;
#endif
#if VALUE_ROWS > 5
    case 5: accumulate_rows(acc, rescale, p, count, v, head_dim, 5); break;
#endif
    default: accumulate_rows(acc, rescale, p, count, v, head_dim, VALUE_ROWS); break;
    }
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
    for (int64_t t0 = 0; t0 < last_ctx; t0 += STEP) {                                           \
        const int64_t count = last_ctx - t0 < STEP ? last_ctx - t0 : STEP;                      \
        /* the step's keys and values as floats, a vector of keys at a time (a vector never    \
         * crosses a cache block); vectors past the context repeat the first, their scores cut */\
        for (int c = 0; c < VECTORS; c++) {                                                     \
            const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;                            \
            const int64_t block = table[t / bs], offset = t % bs;                               \
            if (n == 1 && offset == 0 && t + bs < last_ctx) { /* decodes: the next block */     \
                const int64_t next = table[t / bs + 1];                                         \
                prefetch_rows(k_cache + (next * kv + kh) * hd * bs, hd * bs * sizeof(C), 0, 1); \
                prefetch_rows(v_cache + (next * bs * kv + kh) * hd, hd * sizeof(C),             \
                              kv * hd * sizeof(C), bs);                                         \
            }                                                                                   \
            const C *kb = k_cache + (block * kv + kh) * hd * bs + offset;                       \
            for (int64_t d = 0; d < hd; d++)                                                    \
                store_k(w->k + d * STEP + c * KEYS, LOAD_VEC(kb + d * bs));                     \
            const C *vb = v_cache + ((block * bs + offset) * kv + kh) * hd;                     \
            for (int64_t j = c * KEYS; j < count && j < (c + 1) * KEYS; j++)                    \
                for (int64_t d = 0; d < hd; d += KEYS)                                          \
                    store_k(w->v + j * hd + d, LOAD_VEC(vb + (j - c * KEYS) * kv * hd + d));    \
        }                                                                                       \
        /* rows of queries that see none of these keys skip the step */                         \
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;           \
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {                            \
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;               \
            vk sc[SCORE_ROWS * VECTORS];                                                        \
            scores_any(w->q + r0 * hd, hd, w->k, sc, R);                                        \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t row = r0 + r;                                                     \
                vk total = load_k(w->total + row * KEYS);                                       \
                softmax_step(sc + r * VECTORS, VECTORS, first_ctx + row / group - t0,           \
                             w->max + row, &total, w->p + row * STEP, w->rescale + row, 0);     \
                store_k(w->total + row * KEYS, total);                                          \
            }                                                                                   \
        }                                                                                       \
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {                            \
            const int R = rows - r0 < VALUE_ROWS ? (int)(rows - r0) : VALUE_ROWS;               \
            int64_t seen[VALUE_ROWS] = {0};                                                     \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t visible = first_ctx + (r0 + r) / group - t0;                      \
                seen[r] = visible < count ? visible : count;                                    \
            }                                                                                   \
            accumulate_any(w->acc + r0 * hd, w->rescale + r0, w->p + r0 * STEP, seen, w->v,     \
                           hd, R);                                                              \
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
    if (job->reduced)
        attention_reduced_unit(job->a, s, tile, job->unit_head[item], w->reduced);
    else if (job->a->dtype == ATTENTION_BF16)
        unit_bf16(job->a, s, tile, job->unit_head[item], w);
    else if (job->a->dtype == ATTENTION_F32_F16_CACHE ||
             job->a->dtype == ATTENTION_F32_F16_CACHE_REDUCED)
        unit_f16_cache(job->a, s, tile, job->unit_head[item], w);
    else
        unit_f32(job->a, s, tile, job->unit_head[item], w);
}

int attention(pool *p, const attention_args *a) {
    if (a->num_heads > MAX_HEADS || a->head_dim > MAX_HEAD_DIM || a->head_dim % LANES ||
        a->num_heads % a->num_kv_heads || a->block_size % LANES ||
        a->q_stride < a->num_heads * a->head_dim || a->out_stride < a->num_heads * a->head_dim)
        return -1;
    /* the reduced units take head dims 64 at a time, and tiles of more queries (their staged
     * keys and values serve more rows); the float32 unit serves any other shape */
    const int64_t hd = a->head_dim, group = a->num_heads / a->num_kv_heads;
    const int use_reduced = a->dtype == ATTENTION_F32_F16_CACHE_REDUCED && hd % 64 == 0 &&
                            attention_reduced_available();
    const int64_t tile_size = use_reduced ? REDUCED_TILE : TILE;
    int64_t num_tiles = 0;
    for (int64_t s = 0; s < a->num_seqs; s++)
        num_tiles += (a->query_starts[s + 1] - a->query_starts[s] + tile_size - 1) / tile_size;
    const int64_t num_units = num_tiles * a->num_kv_heads;
    const int num_threads = pool_size(p);
    const int64_t rows = TILE * group;
    const int64_t reduced =
        use_reduced ? attention_reduced_scratch_bytes(REDUCED_TILE * group, hd) / 4 + 1 : 0;
    const int64_t per_thread =
        2 * rows * hd + rows * STEP + 2 * STEP * hd + rows * KEYS + 2 * rows + reduced;
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
        scratches[t].k = scratches[t].p + rows * STEP;
        scratches[t].v = scratches[t].k + hd * STEP;
        scratches[t].total = scratches[t].v + STEP * hd;
        scratches[t].max = scratches[t].total + rows * KEYS;
        scratches[t].rescale = scratches[t].max + rows;
        scratches[t].reduced = scratches[t].rescale + rows;
    }
    int64_t u = 0;
    for (int64_t s = 0; s < a->num_seqs; s++)
        for (int64_t first = a->query_starts[s]; first < a->query_starts[s + 1]; first += tile_size)
            for (int64_t kh = 0; kh < a->num_kv_heads; kh++, u++) {
                units[u] = s;
                units[num_units + u] = first;
                units[2 * num_units + u] = kh;
            }
    attention_job job = {.a = a, .unit_seq = units, .unit_first = units + num_units,
                         .unit_head = units + 2 * num_units, .scratches = scratches,
                         .reduced = use_reduced};
    pool_run(p, attention_item, &job, num_units);
    free(memory); free(units); free(scratches);
    return 0;
}
