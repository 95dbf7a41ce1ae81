/*
 * Attention straight from the paged KV cache, for CPUs: decodes and prefill chunks alike.
 *
 * Every query token attends to its own sequence's cached tokens 0..position (its own K/V were
 * written before the call). The arithmetic for one query row never depends on what else is in
 * the call: every sum (scores over head_dim, the softmax's max and total, the output over tokens)
 * runs in an order fixed by the code and by the row's own context length. So a token's attention
 * output is the same bits whether it is a decode, part of a prefill chunk of any size, or
 * recomputed after a preemption: with row-invariant matmuls, the engine's output does not depend
 * on the batch. Vector code uses GCC/Clang vector extensions (GCC 12+ for shufflevector).
 *
 * Queries are processed in tiles of up to TILE tokens of one sequence, so that cached K/V is read
 * once per tile rather than once per query. K blocks are stored transposed: the scores of LANES
 * consecutive tokens are one vector, accumulated over head_dim with one FMA per dimension and no
 * horizontal sums. Scores and softmax are float32.
 *
 * Layouts (row-major):
 *   q, out           [num_tokens, num_heads, head_dim]
 *   k cache          [num_blocks, num_kv_heads, head_dim, block_size]  (transposed blocks)
 *   v cache          [num_blocks, block_size, num_kv_heads, head_dim]
 *   block_tables     [num_seqs, max_blocks] int64
 *   query_starts     [num_seqs + 1] int64: sequence s owns query tokens [starts[s], starts[s+1])
 *   first_positions  [num_seqs] int64: position of the sequence's first query token
 *
 * Work is split into units of one sequence's query tile, run by the pool (threads.c) in any
 * order on any thread: a unit's arithmetic is the same wherever it runs. Compiled without
 * fast-math flags: the summation order is the code's.
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

/* In place: x[t] = exp(x[t] - max) over x[0..ctx) (zero beyond, up to a multiple of LANES);
 * returns 1 / sum, applied to the output once instead of to every probability. */
static inline float softmax_unnormalized(float *x, int64_t ctx) {
    const int64_t padded = (ctx + LANES - 1) / LANES * LANES;
    for (int64_t t = ctx; t < padded; t++) x[t] = -INFINITY;
    vf m = load_f32(x);
    for (int64_t t = LANES; t < padded; t += LANES) m = vmax(load_f32(x + t), m);
    const float max = hmax(m);
    vf sum = splat(0.f);
    for (int64_t t = 0; t < padded; t += LANES) {
        vf e = exp_nonpositive(load_f32(x + t) - max);
        for (int i = 0; i < LANES; i++) e[i] = t + i < ctx ? e[i] : 0.f;
        *(vfu *)(x + t) = e;
        sum += e;
    }
    return 1.f / hsum(sum);
}

/* acc[0..SLICES * LANES) += sum_j p[j] * v[j * stride ..], j in order; every LANES-wide slice
 * is its own FMA chain, held in a register across the tokens. */
#define DEFINE_ACCUMULATE(SLICES)                                                                  \
static inline void accumulate_##SLICES(float *acc, const float *p, const float *v,                \
                                       int64_t count, int64_t stride) {                           \
    vf r[SLICES];                                                                                 \
    for (int c = 0; c < SLICES; c++) r[c] = load_f32(acc + c * LANES);                            \
    for (int64_t j = 0; j < count; j++) {                                                         \
        const float pj = p[j];                                                                    \
        const float *vj = v + j * stride;                                                         \
        for (int c = 0; c < SLICES; c++) r[c] += pj * load_f32(vj + c * LANES);                   \
    }                                                                                             \
    for (int c = 0; c < SLICES; c++) *(vfu *)(acc + c * LANES) = r[c];                            \
}
DEFINE_ACCUMULATE(1)
DEFINE_ACCUMULATE(2)
DEFINE_ACCUMULATE(4)

static inline void accumulate(float *acc, const float *p, const float *v, int64_t count,
                              int64_t stride, int64_t head_dim) {
    int64_t d = 0;
    for (; d + 4 * LANES <= head_dim; d += 4 * LANES) accumulate_4(acc + d, p, v + d, count, stride);
    for (; d + 2 * LANES <= head_dim; d += 2 * LANES) accumulate_2(acc + d, p, v + d, count, stride);
    for (; d < head_dim; d += LANES) accumulate_1(acc + d, p, v + d, count, stride);
}

/* The scores of LANES keys for one query head: kf[d] holds dimension d of the keys. Four
 * partial sums over d (d mod 4) keep four FMA chains in flight; they are added in a fixed order. */
static inline vf key_scores(const float *q, const vf *kf, int64_t head_dim) {
    vf a0 = q[0] * kf[0], a1 = q[1] * kf[1], a2 = q[2] * kf[2], a3 = q[3] * kf[3];
    for (int64_t d = 4; d < head_dim; d += 4) {
        a0 += q[d] * kf[d];
        a1 += q[d + 1] * kf[d + 1];
        a2 += q[d + 2] * kf[d + 2];
        a3 += q[d + 3] * kf[d + 3];
    }
    return (a0 + a1) + (a2 + a3);
}

/* Ask for the next cache block while this one is computed: blocks are scattered in memory, so
 * the hardware prefetchers cannot guess them. */
static inline void prefetch_block(const void *start, int64_t bytes) {
    const char *p = (const char *)start;
    for (int64_t offset = 0; offset < bytes; offset += 64) __builtin_prefetch(p + offset, 0, 1);
}

static inline void load_row_f32(float *dst, const float *src, int64_t n) {
    memcpy(dst, src, sizeof(float) * (size_t)n);
}

static inline void load_row_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t c = 0; c < n; c += LANES) *(vfu *)(dst + c) = load_bf16(src + c);
}


/* Scratch of one thread, for a unit of at most TILE queries over at most `longest` tokens. */
typedef struct {
    float *scores, *qf, *acc, *vbuf, *inv_sums;
} scratch;

typedef struct {
    const attention_args *a;
    int64_t longest;        /* the longest context of any unit, a multiple of LANES */
    const int64_t *unit_seq;   /* per unit: its sequence */
    const int64_t *unit_first; /* per unit: its first query token */
    scratch *scratches;     /* per thread */
} attention_job;

#define DEFINE_UNIT(NAME, T, LOAD, STORE, LOAD_ROW, LOAD_VEC)                                   \
static void NAME(const attention_args *a, int64_t s, int64_t tile, int64_t longest,             \
                 const scratch *w) {                                                            \
    const T *q = a->q, *k_cache = a->k_cache, *v_cache = a->v_cache;                            \
    T *out = a->out;                                                                            \
    const int64_t num_heads = a->num_heads, num_kv_heads = a->num_kv_heads;                     \
    const int64_t head_dim = a->head_dim, block_size = a->block_size;                           \
    const int64_t group = num_heads / num_kv_heads;                                             \
    const int64_t row = num_kv_heads * head_dim;                                                \
    const int64_t width = num_heads * head_dim;                                                 \
    float *scores = w->scores, *qf = w->qf, *acc = w->acc, *vbuf = w->vbuf;                     \
    float *inv_sums = w->inv_sums;                                                              \
    vf kf[MAX_HEAD_DIM];                                                                        \
    const int64_t *table = a->block_tables + s * a->max_blocks;                                 \
    const int64_t seq_end = a->query_starts[s + 1];                                             \
    const int64_t n = seq_end - tile < TILE ? seq_end - tile : TILE;                            \
    const int64_t first_ctx = a->first_positions[s] + (tile - a->query_starts[s]) + 1;          \
    const int64_t last_ctx = first_ctx + n - 1;                                                 \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t c = 0; c < width; c++)                                                     \
            qf[i * width + c] = LOAD(q[(tile + i) * a->q_stride + c]) * a->scale;               \
    /* scores of LANES keys at a time: kf[d] holds dimension d of those keys */                 \
    for (int64_t t0 = 0; t0 < last_ctx; t0 += LANES) {                                          \
        const T *kb = k_cache + table[t0 / block_size] * row * block_size + t0 % block_size;    \
        const int64_t first_i = t0 < first_ctx ? 0 : t0 - first_ctx + 1;                        \
        if (t0 % block_size == 0 && t0 + block_size < last_ctx)                                 \
            prefetch_block(k_cache + table[t0 / block_size + 1] * row * block_size,             \
                           row * block_size * (int64_t)sizeof(T));                              \
        for (int64_t kh = 0; kh < num_kv_heads; kh++) {                                         \
            for (int64_t d = 0; d < head_dim; d++)                                              \
                kf[d] = LOAD_VEC(kb + (kh * head_dim + d) * block_size);                        \
            for (int64_t i = first_i; i < n; i++)                                               \
                for (int64_t h = kh * group; h < (kh + 1) * group; h++)                         \
                    *(vfu *)(scores + (i * num_heads + h) * longest + t0) =                     \
                        key_scores(qf + i * width + h * head_dim, kf, head_dim);                \
        }                                                                                       \
    }                                                                                           \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t h = 0; h < num_heads; h++)                                                 \
            inv_sums[i * num_heads + h] =                                                       \
                softmax_unnormalized(scores + (i * num_heads + h) * longest, first_ctx + i);   \
    /* acc_ih = sum_t p_iht v_t in token order, LANES tokens of V converted at a time */        \
    memset(acc, 0, sizeof(float) * (size_t)(n * width));                                        \
    for (int64_t t0 = 0; t0 < last_ctx; t0 += LANES) {                                          \
        const int64_t count = last_ctx - t0 < LANES ? last_ctx - t0 : LANES;                    \
        if (t0 % block_size == 0 && t0 + block_size < last_ctx)                                 \
            prefetch_block(v_cache + table[t0 / block_size + 1] * row * block_size,             \
                           row * block_size * (int64_t)sizeof(T));                              \
        for (int64_t j = 0; j < count; j++) {                                                   \
            const int64_t t = t0 + j;                                                           \
            LOAD_ROW(vbuf + j * row,                                                            \
                     v_cache + (table[t / block_size] * block_size + t % block_size) * row, row); \
        }                                                                                       \
        const int64_t first_i = t0 < first_ctx ? 0 : t0 - first_ctx + 1;                        \
        for (int64_t i = first_i; i < n; i++) {                                                 \
            const int64_t visible = first_ctx + i - t0 < count ? first_ctx + i - t0 : count;    \
            for (int64_t h = 0; h < num_heads; h++)                                             \
                accumulate(acc + i * width + h * head_dim,                                      \
                           scores + (i * num_heads + h) * longest + t0,                         \
                           vbuf + (h / group) * head_dim, visible, row, head_dim);              \
        }                                                                                       \
    }                                                                                           \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t h = 0; h < num_heads; h++) {                                               \
            const float inv = inv_sums[i * num_heads + h];                                      \
            for (int64_t d = 0; d < head_dim; d++) acc[i * width + h * head_dim + d] *= inv;    \
        }                                                                                       \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t c = 0; c < width; c++)                                                     \
            out[(tile + i) * a->out_stride + c] = STORE(acc[i * width + c]);                    \
}

#define IDENTITY(x) (x)
DEFINE_UNIT(unit_f32, float, IDENTITY, IDENTITY, load_row_f32, load_f32)
DEFINE_UNIT(unit_bf16, uint16_t, bf16_to_f32, f32_to_bf16, load_row_bf16, load_bf16)

static void attention_item(void *ctx, int64_t item, int thread) {
    const attention_job *job = ctx;
    const scratch *w = &job->scratches[thread];
    if (job->a->dtype == ATTENTION_BF16)
        unit_bf16(job->a, job->unit_seq[item], job->unit_first[item], job->longest, w);
    else
        unit_f32(job->a, job->unit_seq[item], job->unit_first[item], job->longest, w);
}

int attention(pool *p, const attention_args *a) {
    if (a->num_heads > MAX_HEADS || a->head_dim > MAX_HEAD_DIM || a->head_dim % LANES ||
        a->num_heads % a->num_kv_heads || a->block_size % LANES ||
        a->q_stride < a->num_heads * a->head_dim || a->out_stride < a->num_heads * a->head_dim)
        return -1;
    int64_t longest = 1, num_units = 0;
    for (int64_t s = 0; s < a->num_seqs; s++) {
        const int64_t n = a->query_starts[s + 1] - a->query_starts[s];
        if (a->first_positions[s] + n > longest) longest = a->first_positions[s] + n;
        num_units += (n + TILE - 1) / TILE;
    }
    longest = (longest + LANES - 1) / LANES * LANES;
    const int num_threads = pool_size(p);
    const int64_t width = a->num_heads * a->head_dim, row = a->num_kv_heads * a->head_dim;
    const int64_t per_thread = TILE * a->num_heads * longest + 2 * TILE * width + LANES * row
                               + TILE * a->num_heads;
    float *memory = malloc(sizeof(float) * (size_t)(per_thread * num_threads));
    int64_t *units = malloc(sizeof(int64_t) * (size_t)(2 * num_units + 1));
    scratch *scratches = malloc(sizeof(scratch) * (size_t)num_threads);
    if (memory == NULL || units == NULL || scratches == NULL) {
        free(memory); free(units); free(scratches);
        return -2;
    }
    for (int t = 0; t < num_threads; t++) {
        float *m = memory + t * per_thread;
        scratches[t] = (scratch){.scores = m, .qf = m + TILE * a->num_heads * longest};
        scratches[t].acc = scratches[t].qf + TILE * width;
        scratches[t].vbuf = scratches[t].acc + TILE * width;
        scratches[t].inv_sums = scratches[t].vbuf + LANES * row;
    }
    int64_t u = 0;
    for (int64_t s = 0; s < a->num_seqs; s++)
        for (int64_t first = a->query_starts[s]; first < a->query_starts[s + 1]; first += TILE) {
            units[u] = s;
            units[num_units + u] = first;
            u++;
        }
    attention_job job = {a, longest, units, units + num_units, scratches};
    pool_run(p, attention_item, &job, num_units);
    free(memory); free(units); free(scratches);
    return 0;
}
