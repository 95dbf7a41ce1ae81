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
 * Built at run time with the machine's C compiler and called through ctypes (which releases the
 * GIL for the call). Compiled without fast-math flags: the summation order is the code's.
 */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define TILE 16
#define LANES 16
#define MAX_HEADS 128
#define MAX_HEAD_DIM 256

static inline float bf16_to_f32(uint16_t x) {
    union { uint32_t u; float f; } v;
    v.u = ((uint32_t)x) << 16;
    return v.f;
}

static inline uint16_t f32_to_bf16(float f) {
    union { uint32_t u; float f; } v;
    v.f = f;
    uint32_t rounding = 0x7FFF + ((v.u >> 16) & 1); /* round to nearest even */
    return (uint16_t)((v.u + rounding) >> 16);
}

/* GCC/Clang vector extensions: element-wise IEEE arithmetic, so a lane's result never depends
 * on the other lanes, and the compiler emits AVX-512, AVX2 or SSE as -march=native allows. */
typedef float vf __attribute__((vector_size(4 * LANES)));
typedef float vfu __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));
typedef uint32_t vu32 __attribute__((vector_size(4 * LANES)));
typedef uint16_t vu16u __attribute__((vector_size(2 * LANES), aligned(2)));

static inline vf load_f32(const float *p) { return *(const vfu *)p; }

static inline vf load_bf16(const uint16_t *p) {
    vu32 wide = __builtin_convertvector(*(const vu16u *)p, vu32) << 16;
    return (vf)wide;
}

static inline vf splat(float value) {
    vf v = {0};
    return v + value;
}

static inline vf vmax(vf a, vf b) {
    const vi take_a = a > b;
    return (vf)(((vi)a & take_a) | ((vi)b & ~take_a));
}

/* Fixed reduction tree over the lanes. */
static inline float hsum(vf v) {
    vf h = v + __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    h = h + __builtin_shufflevector(h, h, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    h = h + __builtin_shufflevector(h, h, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    h = h + __builtin_shufflevector(h, h, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    return h[0];
}

static inline float hmax(vf v) {
    float m = v[0];
    for (int i = 1; i < LANES; i++) m = v[i] > m ? v[i] : m;
    return m;
}

/* exp(x) for x <= 0 (softmax after subtracting the max): range reduction and a degree-6
 * polynomial, ~1 ulp, on whole vectors. */
static inline vf exp_nonpositive(vf x) {
    x = vmax(x, splat(-87.0f));
    const vi n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, vi);
    const vf nf = __builtin_convertvector(n, vf);
    vf r = x - nf * 0.693359375f;
    r = r - nf * -2.12194440e-4f;
    vf p = r * 1.9875691500e-4f + 1.3981999507e-3f;
    p = p * r + 8.3334519073e-3f;
    p = p * r + 4.1665795894e-2f;
    p = p * r + 1.6666665459e-1f;
    p = p * r + 5.0000001201e-1f;
    p = p * r * r + r + 1.0f;
    return p * (vf)((n + 127) << 23);
}

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

#define DEFINE_KERNEL(NAME, T, LOAD, STORE, LOAD_ROW, LOAD_VEC)                                              \
int NAME(const T *q, const T *k_cache, const T *v_cache, const int64_t *block_tables,             \
         const int64_t *query_starts, const int64_t *first_positions, T *out,                     \
         int64_t seq_begin, int64_t seq_end, int64_t num_heads, int64_t num_kv_heads,             \
         int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale) {                 \
    const int64_t group = num_heads / num_kv_heads;                                               \
    const int64_t row = num_kv_heads * head_dim;                                                  \
    const int64_t width = num_heads * head_dim;                                                   \
    if (num_heads > MAX_HEADS || head_dim > MAX_HEAD_DIM || head_dim % LANES ||                   \
        num_heads % num_kv_heads || block_size % LANES)                                           \
        return -1;                                                                                \
    int64_t longest = 1;                                                                          \
    for (int64_t s = seq_begin; s < seq_end; s++) {                                               \
        int64_t end = first_positions[s] + query_starts[s + 1] - query_starts[s];                 \
        if (end > longest) longest = end;                                                         \
    }                                                                                             \
    longest = (longest + LANES - 1) / LANES * LANES;                                              \
    float *scores = malloc(sizeof(float) * (size_t)(TILE * num_heads * longest));                \
    float *qf = malloc(sizeof(float) * (size_t)(TILE * width));                                  \
    float *acc = malloc(sizeof(float) * (size_t)(TILE * width));                                 \
    float *vbuf = malloc(sizeof(float) * (size_t)(LANES * row));                                 \
    float *inv_sums = malloc(sizeof(float) * (size_t)(TILE * num_heads));                        \
    vf kf[MAX_HEAD_DIM];                                                                          \
    if (!scores || !qf || !acc || !vbuf || !inv_sums) {                                           \
        free(scores); free(qf); free(acc); free(vbuf); free(inv_sums);                            \
        return -2;                                                                                \
    }                                                                                             \
    for (int64_t s = seq_begin; s < seq_end; s++) {                                               \
        const int64_t *table = block_tables + s * max_blocks;                                     \
        for (int64_t tile = query_starts[s]; tile < query_starts[s + 1]; tile += TILE) {          \
            const int64_t n = query_starts[s + 1] - tile < TILE ? query_starts[s + 1] - tile      \
                                                                : TILE;                           \
            const int64_t first_ctx = first_positions[s] + (tile - query_starts[s]) + 1;          \
            const int64_t last_ctx = first_ctx + n - 1;                                           \
            for (int64_t i = 0; i < n * width; i++) qf[i] = LOAD(q[tile * width + i]) * scale;    \
            /* scores of LANES keys at a time: kf[d] holds dimension d of those keys */           \
            for (int64_t t0 = 0; t0 < last_ctx; t0 += LANES) {                                    \
                const T *kb = k_cache + table[t0 / block_size] * row * block_size                 \
                              + t0 % block_size;                                                  \
                const int64_t first_i = t0 < first_ctx ? 0 : t0 - first_ctx + 1;                  \
                if (t0 % block_size == 0 && t0 + block_size < last_ctx)                           \
                    prefetch_block(k_cache + table[t0 / block_size + 1] * row * block_size,       \
                                   row * block_size * (int64_t)sizeof(T));                        \
                for (int64_t kh = 0; kh < num_kv_heads; kh++) {                                   \
                    for (int64_t d = 0; d < head_dim; d++)                                        \
                        kf[d] = LOAD_VEC(kb + (kh * head_dim + d) * block_size);                  \
                    for (int64_t i = first_i; i < n; i++)                                         \
                        for (int64_t h = kh * group; h < (kh + 1) * group; h++)                   \
                            *(vfu *)(scores + (i * num_heads + h) * longest + t0) =               \
                                key_scores(qf + i * width + h * head_dim, kf, head_dim);          \
                }                                                                                 \
            }                                                                                     \
            for (int64_t i = 0; i < n; i++)                                                       \
                for (int64_t h = 0; h < num_heads; h++)                                           \
                    inv_sums[i * num_heads + h] = softmax_unnormalized(                           \
                        scores + (i * num_heads + h) * longest, first_ctx + i);                   \
            /* acc_ih = sum_t p_iht v_t in token order, LANES tokens of V converted at a time */  \
            memset(acc, 0, sizeof(float) * (size_t)(n * width));                                  \
            for (int64_t t0 = 0; t0 < last_ctx; t0 += LANES) {                                    \
                const int64_t count = last_ctx - t0 < LANES ? last_ctx - t0 : LANES;              \
                if (t0 % block_size == 0 && t0 + block_size < last_ctx)                           \
                    prefetch_block(v_cache + table[t0 / block_size + 1] * row * block_size,       \
                                   row * block_size * (int64_t)sizeof(T));                        \
                for (int64_t j = 0; j < count; j++) {                                             \
                    const int64_t t = t0 + j;                                                     \
                    LOAD_ROW(vbuf + j * row,                                                      \
                             v_cache + (table[t / block_size] * block_size + t % block_size)      \
                                           * row, row);                                           \
                }                                                                                 \
                const int64_t first_i = t0 < first_ctx ? 0 : t0 - first_ctx + 1;                  \
                for (int64_t i = first_i; i < n; i++) {                                           \
                    const int64_t visible = first_ctx + i - t0 < count ? first_ctx + i - t0       \
                                                                       : count;                   \
                    for (int64_t h = 0; h < num_heads; h++)                                       \
                        accumulate(acc + i * width + h * head_dim,                                \
                                   scores + (i * num_heads + h) * longest + t0,                   \
                                   vbuf + (h / group) * head_dim, visible, row, head_dim);        \
                }                                                                                 \
            }                                                                                     \
            for (int64_t i = 0; i < n; i++)                                                       \
                for (int64_t h = 0; h < num_heads; h++) {                                         \
                    const float inv = inv_sums[i * num_heads + h];                                \
                    for (int64_t d = 0; d < head_dim; d++)                                        \
                        acc[i * width + h * head_dim + d] *= inv;                                 \
                }                                                                                 \
            for (int64_t i = 0; i < n * width; i++) out[tile * width + i] = STORE(acc[i]);        \
        }                                                                                         \
    }                                                                                             \
    free(scores); free(qf); free(acc); free(vbuf); free(inv_sums);                                \
    return 0;                                                                                     \
}

#define IDENTITY(x) (x)
DEFINE_KERNEL(paged_attention_f32, float, IDENTITY, IDENTITY, load_row_f32, load_f32)
DEFINE_KERNEL(paged_attention_bf16, uint16_t, bf16_to_f32, f32_to_bf16, load_row_bf16, load_bf16)
