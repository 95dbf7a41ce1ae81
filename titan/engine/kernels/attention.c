/*
 * Attention straight from the paged KV cache, for CPUs: decodes and prefill chunks alike.
 *
 * Every query token attends to its own sequence's cached tokens 0..position (its own K/V were
 * written before the call). The arithmetic for one query row never depends on what else is in
 * the call: keys are visited in blocks of LANES in position order, and every sum (a score over
 * head_dim, the softmax's running maximum and total, the output over tokens) runs in an order
 * fixed by the code and by the row's own context length. So a token's attention output is the
 * same bits whether it is a decode, part of a prefill chunk of any size, or recomputed after a
 * preemption: with row-invariant matmuls, the engine's output does not depend on the batch.
 *
 * One unit of work is one sequence's tile of up to TILE query tokens and one KV head: the rows
 * are the tile's queries times the query heads sharing that KV head (GQA), so each block of K
 * and V is read once for all of them. The softmax is online (flash attention's): a running
 * maximum and total per row, the output rescaled when the maximum grows, so nothing the size of
 * the context is ever written out. K blocks are stored transposed: the scores of LANES
 * consecutive keys are one vector, accumulated over head_dim by FMAs with no horizontal sums.
 * Scores, softmax and accumulation are float32. Vector code uses GCC/Clang vector extensions.
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
/* Rows computed together: 8 score chains keep both FMA pipes busy (a chain waits 4 cycles for
 * its previous FMA); 4 rows of 4 output slices fill the registers when accumulating values. */
#define SCORE_ROWS 8
#define VALUE_ROWS 4

/* One thread's scratch for a unit of at most `rows` rows. */
typedef struct {
    float *q;   /* [rows][head_dim], scaled */
    float *acc; /* [rows][head_dim] */
    float *p;   /* [rows][LANES]: this block's probabilities */
    float *v;   /* [LANES][head_dim]: this block's values */
    float *total;                 /* [rows][LANES]: the softmax's running total, per lane */
    float *max, *rescale;         /* [rows] */
} scratch;

typedef struct {
    const attention_args *a;
    const int64_t *unit_seq, *unit_first, *unit_head; /* per unit */
    scratch *scratches;                               /* per thread */
} attention_job;

static inline vf load_bf16_vec(const uint16_t *p) { return load_bf16(p); }

/* Ask for the keys and values of the next LANES positions while these are computed: cache
 * blocks are scattered in memory, so the hardware prefetchers cannot guess them. */
static inline void prefetch_rows(const void *start, int64_t row_bytes, int64_t stride_bytes,
                                 int64_t num_rows) {
    for (int64_t r = 0; r < num_rows; r++)
        for (int64_t offset = 0; offset < row_bytes; offset += 64)
            __builtin_prefetch((const char *)start + r * stride_bytes + offset, 0, 1);
}

/* Scores of LANES keys for R rows: kf[d] holds dimension d of the keys. One FMA chain per row,
 * in d order. */
static inline __attribute__((always_inline)) void scores_for(const float *q, int64_t head_dim,
                                                            const vf *kf, vf *out, const int R) {
    vf s[SCORE_ROWS];
    for (int r = 0; r < R; r++) s[r] = splat(0.f);
    for (int64_t d = 0; d < head_dim; d++) {
        const vf k = kf[d];
        for (int r = 0; r < R; r++) s[r] += q[r * head_dim + d] * k;
    }
    for (int r = 0; r < R; r++) out[r] = s[r];
}

/* For R rows: acc[r] = acc[r] * rescale[r] + sum_j p[r][j] * v[j * stride], j in order, each
 * LANES-wide slice of each row its own chain (rows and slices interleaved: one load of v serves
 * every row). count[r]: the keys row r sees, at most LANES. */
static inline __attribute__((always_inline)) void accumulate_rows(
    float *acc, const float *rescale, const float *p, const int64_t *count, const float *v,
    int64_t stride, int64_t head_dim, const int R) {
    int64_t most = 0; /* a row's probabilities past its own count are zero: adding them is exact */
    for (int r = 0; r < R; r++) most = count[r] > most ? count[r] : most;
    for (int64_t d0 = 0; d0 < head_dim; d0 += 4 * LANES) {
        const int slices = head_dim - d0 >= 4 * LANES ? 4 : (int)((head_dim - d0) / LANES);
        vf a[VALUE_ROWS][4];
        for (int r = 0; r < R; r++)
            for (int c = 0; c < slices; c++)
                a[r][c] = load_f32(acc + r * head_dim + d0 + c * LANES) * rescale[r];
        for (int64_t j = 0; j < most; j++) {
            for (int c = 0; c < slices; c++) {
                const vf value = load_f32(v + j * stride + d0 + c * LANES);
                for (int r = 0; r < R; r++) a[r][c] += p[r * LANES + j] * value;
            }
        }
        for (int r = 0; r < R; r++)
            for (int c = 0; c < slices; c++)
                *(vfu *)(acc + r * head_dim + d0 + c * LANES) = a[r][c];
    }
}

/* The maximum of the lanes, by a fixed tree. */
static inline float vector_max(vf v) {
    vf h = vmax(v, __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7));
    h = vmax(h, __builtin_shufflevector(h, h, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11));
    h = vmax(h, __builtin_shufflevector(h, h, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13));
    h = vmax(h, __builtin_shufflevector(h, h, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14));
    return h[0];
}

/* Lanes j >= visible set to `fill` (the last block a row sees is cut at its position). */
static inline vf cut(vf x, int64_t visible, float fill) {
    if (visible >= LANES) return x;
    for (int j = (int)visible; j < LANES; j++) x[j] = fill;
    return x;
}

/* T: the type of q and out; C: of the caches (LOAD_VEC converts LANES values of it). */
#define DEFINE_UNIT(NAME, T, LOAD, STORE, C, LOAD_VEC)                                           \
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
        *(vfu *)(w->total + r * LANES) = splat(0.f);                                            \
    }                                                                                           \
    vf kf[MAX_HEAD_DIM];                                                                        \
    for (int64_t t0 = 0; t0 < last_ctx; t0 += LANES) {                                          \
        const int64_t block = table[t0 / bs], offset = t0 % bs;                                 \
        if (n == 1 && offset == 0 && t0 + bs < last_ctx) { /* decodes: the next cache block */\
            const int64_t next = table[t0 / bs + 1];                                            \
            prefetch_rows(k_cache + (next * kv + kh) * hd * bs, hd * bs * sizeof(C), 0, 1);     \
            prefetch_rows(v_cache + (next * bs * kv + kh) * hd, hd * sizeof(C),                 \
                          kv * hd * sizeof(C), bs);                                             \
        }                                                                                       \
        const C *kb = k_cache + (block * kv + kh) * hd * bs + offset;                           \
        for (int64_t d = 0; d < hd; d++) kf[d] = LOAD_VEC(kb + d * bs);                         \
        const int64_t count = last_ctx - t0 < LANES ? last_ctx - t0 : LANES;                    \
        const C *vb = v_cache + ((block * bs + offset) * kv + kh) * hd;                         \
        const float *values = (const float *)vb; /* float32: read in place */                   \
        int64_t stride = kv * hd;                                                               \
        if (sizeof(C) != sizeof(float)) { /* 16-bit: converted once for every row */            \
            for (int64_t j = 0; j < count; j++)                                                 \
                for (int64_t d = 0; d < hd; d += LANES)                                         \
                    *(vfu *)(w->v + j * hd + d) = LOAD_VEC(vb + j * kv * hd + d);               \
            values = w->v;                                                                      \
            stride = hd;                                                                        \
        }                                                                                       \
        /* rows of queries that see none of these keys skip the block */                        \
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;           \
        for (int64_t r0 = first_row; r0 < rows; r0 += SCORE_ROWS) {                            \
            const int R = rows - r0 < SCORE_ROWS ? (int)(rows - r0) : SCORE_ROWS;               \
            vf sc[SCORE_ROWS];                                                                  \
            const float *qr = w->q + r0 * hd;                                                   \
            switch (R) {                                                                        \
            case 1: scores_for(qr, hd, kf, sc, 1); break;                                       \
            case 2: scores_for(qr, hd, kf, sc, 2); break;                                       \
            case 3: scores_for(qr, hd, kf, sc, 3); break;                                       \
            case 4: scores_for(qr, hd, kf, sc, 4); break;                                       \
            case 5: scores_for(qr, hd, kf, sc, 5); break;                                       \
            case 6: scores_for(qr, hd, kf, sc, 6); break;                                       \
            case 7: scores_for(qr, hd, kf, sc, 7); break;                                       \
            default: scores_for(qr, hd, kf, sc, 8); break;                                      \
            }                                                                                   \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t row = r0 + r;                                                     \
                const int64_t visible = first_ctx + row / group - t0; /* keys of this block */ \
                const vf scores = cut(sc[r], visible, -INFINITY);                               \
                const float top = fmaxf(w->max[row], vector_max(scores));                      \
                const vf prob = cut(exp_nonpositive(scores - top), visible, 0.f);               \
                const float rescale = top == w->max[row] ? 1.f : expf(w->max[row] - top);       \
                /* per lane; summed across lanes once, at the end */                            \
                *(vfu *)(w->total + row * LANES) = load_f32(w->total + row * LANES) * rescale   \
                                                   + prob;                                      \
                w->max[row] = top;                                                              \
                w->rescale[row] = rescale;                                                      \
                *(vfu *)(w->p + row * LANES) = prob;                                            \
            }                                                                                   \
        }                                                                                       \
        for (int64_t r0 = first_row; r0 < rows; r0 += VALUE_ROWS) {                            \
            const int R = rows - r0 < VALUE_ROWS ? (int)(rows - r0) : VALUE_ROWS;               \
            int64_t seen[VALUE_ROWS];                                                           \
            for (int r = 0; r < R; r++) {                                                       \
                const int64_t visible = first_ctx + (r0 + r) / group - t0;                      \
                seen[r] = visible < count ? visible : count;                                    \
            }                                                                                   \
            float *acc = w->acc + r0 * hd;                                                      \
            const float *scale = w->rescale + r0, *prob = w->p + r0 * LANES;                    \
            switch (R) {                                                                        \
            case 1: accumulate_rows(acc, scale, prob, seen, values, stride, hd, 1); break;      \
            case 2: accumulate_rows(acc, scale, prob, seen, values, stride, hd, 2); break;      \
            case 3: accumulate_rows(acc, scale, prob, seen, values, stride, hd, 3); break;      \
            default: accumulate_rows(acc, scale, prob, seen, values, stride, hd, 4); break;     \
            }                                                                                   \
        }                                                                                       \
    }                                                                                           \
    for (int64_t i = 0; i < n; i++)                                                             \
        for (int64_t g = 0; g < group; g++) {                                                   \
            const int64_t row = i * group + g;                                                  \
            const float inverse = 1.f / hsum(load_f32(w->total + row * LANES));                \
            T *o = out + (tile + i) * a->out_stride + (kh * group + g) * hd;                    \
            for (int64_t d = 0; d < hd; d++) o[d] = STORE(w->acc[row * hd + d] * inverse);     \
        }                                                                                       \
}

#define IDENTITY(x) (x)
DEFINE_UNIT(unit_f32, float, IDENTITY, IDENTITY, float, load_f32)
DEFINE_UNIT(unit_bf16, uint16_t, bf16_to_f32, f32_to_bf16, uint16_t, load_bf16_vec)
DEFINE_UNIT(unit_f16_cache, float, IDENTITY, IDENTITY, _Float16, load_f16)

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
    const int64_t per_thread = 2 * rows * hd + 2 * rows * LANES + LANES * hd + 2 * rows;
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
        scratches[t].v = scratches[t].p + rows * LANES;
        scratches[t].total = scratches[t].v + LANES * hd;
        scratches[t].max = scratches[t].total + rows * LANES;
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
