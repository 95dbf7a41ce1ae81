/*
 * Titan's CPU kernels: declarations shared by the C files of one library (titan_cpu.so).
 *
 * Every kernel computes each output element with the same instruction sequence whatever else is
 * in the call (the batch, the tile an element falls in, the thread that runs it), so that a
 * request's output never depends on what else the engine runs.
 */
#ifndef TITAN_CPU_H
#define TITAN_CPU_H

#include <stdint.h>

/* ---- threads.c: a pool that runs the items of a job on every thread, caller included ---- */

/* thread: which of the pool's threads runs it, 0 (the caller) to pool_size() - 1, for
 * per-thread scratch memory */
typedef void (*task_fn)(void *ctx, int64_t item, int thread);
typedef struct pool pool;

pool *pool_create(int num_threads);
void pool_destroy(pool *p);
/* Runs fn(ctx, i, thread) for i in [0, num_items), items taken dynamically (a descheduled thread never
 * holds the others up: they take its items), and returns when all have run. */
void pool_run(pool *p, task_fn fn, void *ctx, int64_t num_items);
int pool_size(const pool *p);

/* ---- quant.c: weights in blocks of 32 along K, activations quantized per block ---- */

#define QK 32          /* values per block */
#define PANEL 16       /* weight rows (output columns) packed side by side */

enum weight_format { FORMAT_Q4_1 = 1, FORMAT_Q8_0 = 2 };

typedef struct {
    int32_t format;    /* enum weight_format */
    int64_t rows;      /* N: output features */
    int64_t cols;      /* K: input features, a multiple of QK */
    const uint8_t *data; /* panels of PANEL rows, see quant.c for the layout */
    const float *bias; /* [rows] or NULL */
} qweight;

/* Activations: per row, per block, 32 int8 values, their scale d and s = d * sum(values). */
typedef struct {
    int8_t *qs;  /* [rows][cols] */
    float *d;    /* [rows][cols / QK] */
    float *s;    /* [rows][cols / QK] */
    int64_t cols;
} qacts;

/* Row `row` of x as activations of its own (the same cols: rows are cols values apart). */
static inline qacts acts_row(const qacts *x, int64_t row) {
    const int64_t nb = x->cols / QK;
    return (qacts){x->qs + row * x->cols, x->d + row * nb, x->s + row * nb, x->cols};
}

int64_t panel_block_bytes(int32_t format);
void quantize_row(const float *x, int64_t cols, int8_t *qs, float *d, float *s);
void quantize_rows(const float *x, int64_t rows, int64_t cols, int8_t *qs, float *d, float *s);
/* out[t][n] (+= when accumulate) = x[t] . w[n] (+ bias[n]), for rows [0, num_rows). */
void qgemm(pool *p, const qacts *x, int64_t num_rows, const qweight *w, float *out,
           int64_t out_stride, int accumulate);
const char *qgemm_isa(void);
/* The float values of row n of a weight (the embedding lookup of a tied Q8_0 table). */
void dequantize_row(const qweight *w, int64_t n, float *out);

/* ---- attention.c: attention read in place from the paged KV cache ---- */

/* F32: q, caches and out float32; BF16: all bfloat16 (the torch path); F32_F16_CACHE: q and out
 * float32, the caches float16 (the quantized model's); F32_F16_CACHE_REDUCED: the same types,
 * in reduced precision where the CPU has a unit for it (attention_amx.c, attention_reduced.c). */
enum attention_dtype {
    ATTENTION_F32 = 0,
    ATTENTION_BF16 = 1,
    ATTENTION_F32_F16_CACHE = 2,
    ATTENTION_F32_F16_CACHE_REDUCED = 3,
};
typedef struct {
    const void *q;                  /* [T, heads, head_dim] */
    const void *k_cache;            /* [blocks, kv_heads, head_dim, block_size] */
    const void *v_cache;            /* [blocks, block_size, kv_heads, head_dim] */
    const int64_t *block_tables;    /* [S, max_blocks] */
    const int64_t *query_starts;    /* [S + 1] */
    const int64_t *first_positions; /* [S] */
    void *out;                      /* [T, heads, head_dim] */
    int64_t num_seqs, num_heads, num_kv_heads, head_dim, block_size, max_blocks;
    int64_t q_stride, out_stride;   /* elements from one token's row to the next */
    float scale;
    int32_t dtype;                  /* enum attention_dtype */
    const void *kv_codes;           /* NULL, or the caches' int8 codes (kv_codes.h), which the
                                       int8 unit then reads instead of rounding keys and values
                                       itself */
} attention_args;

/* 0, or -1 when the shapes are beyond the kernel, -2 when out of memory. */
int attention(pool *p, const attention_args *a);

/* ---- kv_move.c: context shift's copy between slots of the float16 caches ---- */

typedef struct {
    _Float16 *const *k_caches, *const *v_caches; /* [num_layers], attention_args' layouts */
    const int64_t *source_slots, *destination_slots; /* [num_tokens], never overlapping */
    int64_t num_layers, num_tokens, num_kv_heads, head_dim, block_size;
    const float *cos, *sin; /* [head_dim / 2] of the shift, to rotate keys back; NULL: a copy */
    uint32_t *const *kv_codes; /* NULL, or [num_layers] KV codes (kv_codes.h) to write too */
} kv_move_args;

/* 0, or -1 for an odd head_dim or one over 256 (with KV codes: a head_dim that is no multiple
 * of 16, or a block_size no multiple of 16). */
int kv_move(pool *p, const kv_move_args *a);
/* The codes (kv_codes.h) of every key and value in num_blocks blocks of float16 K and V caches:
 * 0, or -1 for a head_dim that is no multiple of 16 or over 256, or a block_size no multiple of
 * 16. */
int kv_codes(pool *p, const _Float16 *k_cache, const _Float16 *v_cache, int64_t num_blocks,
             int64_t num_kv_heads, int64_t head_dim, int64_t block_size, uint32_t *codes);

#endif
