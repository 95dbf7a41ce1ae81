/*
 * Attention straight from the paged KV cache, for CPUs: decodes and prefill chunks alike.
 *
 * Every query token attends to its own sequence's cached tokens 0..position (its own K/V were
 * written before the call). The arithmetic for one query row never depends on what else is in
 * the call: the same dot-product function with a fixed summation order, a softmax summed in
 * token order, and the output accumulated in token order. So a token's attention output is the
 * same bits whether it is a decode, part of a prefill chunk of any size, or recomputed after a
 * preemption: with row-invariant matmuls, the engine's output does not depend on the batch.
 *
 * Queries are processed in tiles of up to TILE tokens of one sequence, so that a cached K/V row
 * is read once per tile rather than once per query. Scores and softmax are float32.
 *
 * Layouts (row-major):
 *   q, out           [num_tokens, num_heads, head_dim]
 *   k/v cache        [num_blocks, block_size, num_kv_heads, head_dim]
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

/* q . k over head_dim (a multiple of LANES): lane-wise FMAs in d order, then the fixed tree. */
static inline float dot(const float *q, const float *k, int64_t head_dim) {
    vf acc = load_f32(q) * load_f32(k);
    for (int64_t d = LANES; d < head_dim; d += LANES) acc += load_f32(q + d) * load_f32(k + d);
    return hsum(acc);
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

/* In place: x[t] = softmax(x[0..ctx))[t]. x has room up to a multiple of LANES. */
static inline void softmax(float *x, int64_t ctx) {
    const int64_t padded = (ctx + LANES - 1) / LANES * LANES;
    for (int64_t t = ctx; t < padded; t++) x[t] = -INFINITY;
    vf m = load_f32(x);
    for (int64_t t = LANES; t < padded; t += LANES) {
        m = vmax(load_f32(x + t), m);
    }
    const float max = hmax(m);
    vf sum = splat(0.f);
    for (int64_t t = 0; t < padded; t += LANES) {
        vf e = exp_nonpositive(load_f32(x + t) - max);
        for (int i = 0; i < LANES; i++) e[i] = t + i < ctx ? e[i] : 0.f;
        *(vfu *)(x + t) = e;
        sum += e;
    }
    const float inv = 1.f / hsum(sum);
    for (int64_t t = 0; t < padded; t += LANES) *(vfu *)(x + t) = load_f32(x + t) * inv;
}

static inline void axpy(float *acc, float p, const float *v, int64_t head_dim) {
    for (int64_t d = 0; d < head_dim; d += LANES)
        *(vfu *)(acc + d) = load_f32(acc + d) + p * load_f32(v + d);
}

static inline void load_row_f32(float *dst, const float *src, int64_t n) {
    memcpy(dst, src, sizeof(float) * (size_t)n);
}

static inline void load_row_bf16(float *dst, const uint16_t *src, int64_t n) {
    for (int64_t c = 0; c < n; c += LANES) *(vfu *)(dst + c) = load_bf16(src + c);
}

#define DEFINE_KERNEL(NAME, T, LOAD, STORE, LOAD_ROW)                                              \
int NAME(const T *q, const T *k_cache, const T *v_cache, const int64_t *block_tables,             \
         const int64_t *query_starts, const int64_t *first_positions, T *out,                     \
         int64_t seq_begin, int64_t seq_end, int64_t num_heads, int64_t num_kv_heads,             \
         int64_t head_dim, int64_t block_size, int64_t max_blocks, float scale) {                 \
    const int64_t group = num_heads / num_kv_heads;                                               \
    const int64_t row = num_kv_heads * head_dim;                                                  \
    const int64_t width = num_heads * head_dim;                                                   \
    if (num_heads > MAX_HEADS || head_dim > MAX_HEAD_DIM || head_dim % LANES ||                   \
        num_heads % num_kv_heads)                                                                 \
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
    float *rowf = malloc(sizeof(float) * (size_t)row);                                           \
    if (!scores || !qf || !acc || !rowf) {                                                        \
        free(scores); free(qf); free(acc); free(rowf);                                            \
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
            for (int64_t t = 0; t < last_ctx; t++) {                                              \
                LOAD_ROW(rowf, k_cache + (table[t / block_size] * block_size + t % block_size)    \
                                             * row, row);                                         \
                for (int64_t i = (t < first_ctx ? 0 : t - first_ctx + 1); i < n; i++)             \
                    for (int64_t h = 0; h < num_heads; h++)                                       \
                        scores[(i * num_heads + h) * longest + t] =                               \
                            dot(qf + i * width + h * head_dim, rowf + (h / group) * head_dim,     \
                                head_dim);                                                        \
            }                                                                                     \
            for (int64_t i = 0; i < n; i++)                                                       \
                for (int64_t h = 0; h < num_heads; h++)                                           \
                    softmax(scores + (i * num_heads + h) * longest, first_ctx + i);               \
            memset(acc, 0, sizeof(float) * (size_t)(n * width));                                  \
            for (int64_t t = 0; t < last_ctx; t++) {                                              \
                LOAD_ROW(rowf, v_cache + (table[t / block_size] * block_size + t % block_size)    \
                                             * row, row);                                         \
                for (int64_t i = (t < first_ctx ? 0 : t - first_ctx + 1); i < n; i++)             \
                    for (int64_t h = 0; h < num_heads; h++)                                       \
                        axpy(acc + i * width + h * head_dim,                                      \
                             scores[(i * num_heads + h) * longest + t],                           \
                             rowf + (h / group) * head_dim, head_dim);                            \
            }                                                                                     \
            for (int64_t i = 0; i < n * width; i++) out[tile * width + i] = STORE(acc[i]);        \
        }                                                                                         \
    }                                                                                             \
    free(scores); free(qf); free(acc); free(rowf);                                                \
    return 0;                                                                                     \
}

#define IDENTITY(x) (x)
DEFINE_KERNEL(paged_attention_f32, float, IDENTITY, IDENTITY, load_row_f32)
DEFINE_KERNEL(paged_attention_bf16, uint16_t, bf16_to_f32, f32_to_bf16, load_row_bf16)
