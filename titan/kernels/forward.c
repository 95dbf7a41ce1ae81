/*
 * One engine step of a Llama-family decoder with quantized weights, in one call: embedding,
 * every layer (RMSNorm, QKV, RoPE, the paged KV write, attention, the output projection,
 * RMSNorm, SwiGLU) and the logits of the rows that sample. Python hands over the step's token
 * ids, positions, cache slots and block tables and gets logits back: what used to be about
 * twenty torch operations per layer, each with its own dispatch, is one loop here.
 *
 * Row-wise work (norms, RoPE, SwiGLU, quantizing activations) runs a row per pool item, so a
 * row's arithmetic never depends on the other rows; the GEMMs (qgemm.c) and attention
 * (attention.c) keep the same rule. Activations are float32 between the quantized matmuls;
 * the KV cache is float16 (what llama.cpp keeps too: half the bytes attention reads, which is
 * what decode attention waits for).
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu.h"
#include "kv_codes.h"
#include "vec.h"

typedef struct {
    const float *input_norm; /* [H] */
    qweight qkv;             /* [(heads + 2 kv_heads) head_dim, H], optional bias */
    qweight o_proj;          /* [H, heads head_dim] */
    const float *post_norm;  /* [H] */
    qweight gate_up;         /* [2 I, H]: gate rows, then up rows */
    qweight down;            /* [H, I] */
    _Float16 *k_cache;       /* [blocks, kv_heads, head_dim, block_size] */
    _Float16 *v_cache;       /* [blocks, block_size, kv_heads, head_dim] */
    uint32_t *kv_codes;      /* NULL, or the caches' int8 codes (kv_codes.h) */
} layer_weights;

typedef struct {
    int64_t hidden, intermediate, num_layers, num_heads, num_kv_heads, head_dim, block_size;
    int64_t vocab;
    float eps;
    const layer_weights *layers;
    const float *final_norm;
    qweight lm_head;         /* [V, H] */
    qweight embedding;       /* [V, H]: its rows are dequantized for the input */
    const float *rope_cos;   /* [max_positions, head_dim] */
    const float *rope_sin;
    int32_t attention_dtype; /* ATTENTION_F32_F16_CACHE, or its _REDUCED form */
} model;

typedef struct {
    int64_t num_tokens;
    const int64_t *token_ids, *positions, *slot_mapping;      /* [T] */
    int64_t num_seqs, max_blocks;
    const int64_t *block_tables, *query_starts, *first_positions;
    int64_t num_logits;
    const int64_t *logit_rows; /* [num_logits] token rows whose logits are wanted */
    float *logits;             /* [num_logits, V] */
    double *seconds;           /* NULL, or [3] += time in matmuls, attention, the rest */
} step;

typedef struct {
    const model *m;
    const step *s;
    const layer_weights *layer;
    float *hidden, *qkv, *attn, *gate_up;
    qacts x;
    const float *norm;
    const int64_t *rows; /* row_norm: which rows of hidden (NULL: all) */
    float *normed;       /* NULL, or [rows][H]: norm_item's float output, kept */
} layer_job;

/* Logits of this many best candidates per row are recomputed from float activations: int8
 * activations round a logit near 20 to ~0.1, which decides near-ties between the best tokens
 * (the torch path's bfloat16 refinement, for the same reason). */
#define REFINED_LOGITS 32

/* x[t] = quantize(rmsnorm(hidden[row]) * norm): float32 sums in a fixed order. */
static void norm_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    const int64_t h = j->m->hidden, row = j->rows != NULL ? j->rows[t] : t;
    const float *in = j->hidden + row * h;
    /* the sum of squares in LANES interleaved partial sums, added by a fixed tree */
    vf partial = splat(0.f);
    for (int64_t i = 0; i < h; i += LANES) partial += load_f32(in + i) * load_f32(in + i);
    const float inverse = 1.f / sqrtf(hsum(partial) / (float)h + j->m->eps);
    float normed[h];
    for (int64_t i = 0; i < h; i++) normed[i] = j->norm[i] * (in[i] * inverse);
    const qacts row_x = acts_row(&j->x, t);
    quantize_row(normed, h, row_x.qs, row_x.d, row_x.s);
    if (j->normed != NULL) memcpy(j->normed + t * h, normed, sizeof(float) * (size_t)h);
}

/* The REFINED_LOGITS best logits of row t recomputed with the float activations and the
 * weights' float values, the dot product summed by a fixed tree. */
static void refine_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    const model *m = j->m;
    float *logits = j->s->logits + t * m->vocab;
    int64_t best[REFINED_LOGITS];
    int count = 0;
    for (int64_t v = 0; v < m->vocab; v++) { /* insertion into a short sorted list */
        if (count == REFINED_LOGITS && logits[v] <= logits[best[count - 1]]) continue;
        int at = count < REFINED_LOGITS ? count++ : REFINED_LOGITS - 1;
        while (at > 0 && logits[best[at - 1]] < logits[v]) {
            best[at] = best[at - 1];
            at--;
        }
        best[at] = v;
    }
    const int64_t h = m->hidden;
    const float *x = j->normed + t * h;
    float row[h];
    for (int i = 0; i < count; i++) {
        dequantize_row(&m->lm_head, best[i], row);
        vf partial = splat(0.f);
        for (int64_t d = 0; d < h; d += LANES) partial += load_f32(row + d) * load_f32(x + d);
        logits[best[i]] = hsum(partial);
    }
}

/* RoPE (HF's rotate-half layout) on q and k of token t, then k and v into its cache slot. */
static void rope_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    const model *m = j->m;
    const int64_t hd = m->head_dim, half = hd / 2;
    const int64_t qkv_width = (m->num_heads + 2 * m->num_kv_heads) * hd;
    const float *cos = m->rope_cos + j->s->positions[t] * hd;
    const float *sin = m->rope_sin + j->s->positions[t] * hd;
    float *row = j->qkv + t * qkv_width;
    for (int64_t head = 0; head < m->num_heads + m->num_kv_heads; head++) {
        float *x = row + head * hd;
        for (int64_t i = 0; i < half; i++) {
            const float x1 = x[i], x2 = x[i + half];
            x[i] = x1 * cos[i] - x2 * sin[i];
            x[i + half] = x2 * cos[i + half] + x1 * sin[i + half];
        }
    }
    const int64_t slot = j->s->slot_mapping[t];
    const int64_t block = slot / m->block_size, offset = slot % m->block_size;
    const float *k = row + m->num_heads * hd, *v = k + m->num_kv_heads * hd;
    _Float16 *k_block = j->layer->k_cache + block * m->num_kv_heads * hd * m->block_size;
    _Float16 *v_slot = j->layer->v_cache + slot * m->num_kv_heads * hd;
    for (int64_t i = 0; i < m->num_kv_heads * hd; i++) {
        k_block[i * m->block_size + offset] = (_Float16)k[i];
        v_slot[i] = (_Float16)v[i];
    }
    for (int64_t h = 0; j->layer->kv_codes != NULL && h < m->num_kv_heads; h++) {
        uint32_t *codes = kv_codes_block(j->layer->kv_codes, block, h, m->num_kv_heads, hd,
                                         m->block_size);
        float stored[KV_CODE_MAX_DIM]; /* the key as the cache holds it: float16 */
        for (int64_t d = 0; d < hd; d++) stored[d] = (float)(_Float16)k[h * hd + d];
        write_key_code(stored, hd, codes, m->block_size, offset);
        write_value_code_f16(v_slot + h * hd, hd, codes, m->block_size, offset);
    }
}

static void quantize_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    const int64_t width = j->m->num_heads * j->m->head_dim;
    const qacts row_x = acts_row(&j->x, t);
    quantize_row(j->attn + t * width, width, row_x.qs, row_x.d, row_x.s);
}

/* silu(gate) * up, quantized for the down projection. */
static void swiglu_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    const int64_t inter = j->m->intermediate;
    float *gate = j->gate_up + t * 2 * inter;
    const float *up = gate + inter;
    for (int64_t i = 0; i < inter; i += LANES)
        *(vfu *)(gate + i) = silu(load_f32(gate + i)) * load_f32(up + i);
    const qacts row_x = acts_row(&j->x, t);
    quantize_row(gate, inter, row_x.qs, row_x.d, row_x.s);
}

static void embed_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const layer_job *j = ctx;
    dequantize_row(&j->m->embedding, j->s->token_ids[t], j->hidden + t * j->m->hidden);
}

static void attend(pool *p, const layer_job *j) {
    const model *m = j->m;
    const step *s = j->s;
    attention_args a = {
        .q = j->qkv, .k_cache = j->layer->k_cache, .v_cache = j->layer->v_cache,
        .block_tables = s->block_tables, .query_starts = s->query_starts,
        .first_positions = s->first_positions, .out = j->attn, .num_seqs = s->num_seqs,
        .num_heads = m->num_heads, .num_kv_heads = m->num_kv_heads, .head_dim = m->head_dim,
        .block_size = m->block_size, .max_blocks = s->max_blocks,
        .q_stride = (m->num_heads + 2 * m->num_kv_heads) * m->head_dim,
        .out_stride = m->num_heads * m->head_dim,
        .scale = 1.f / sqrtf((float)m->head_dim), .dtype = m->attention_dtype,
        .kv_codes = j->layer->kv_codes,
    };
    if (attention(p, &a) != 0) abort(); /* shapes were checked when the model loaded */
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

enum { MATMULS, ATTENTION, REST };

/* Time since *mark into seconds[part] (when asked for), and the mark moves on. */
static void lap(const step *s, int part, double *mark) {
    if (s->seconds == NULL) return;
    const double t = now();
    s->seconds[part] += t - *mark;
    *mark = t;
}

int titan_forward(pool *p, const model *m, const step *s) {
    const int64_t T = s->num_tokens, H = m->hidden, I = m->intermediate;
    const int64_t qkv_width = (m->num_heads + 2 * m->num_kv_heads) * m->head_dim;
    const int64_t attn_width = m->num_heads * m->head_dim;
    int64_t widest = H > I ? H : I;
    if (attn_width > widest) widest = attn_width;
    if (H % QK || I % QK || attn_width % QK) return -1; /* QK (32) is a multiple of LANES */
    float *hidden = malloc(sizeof(float) * (size_t)(T * H));
    float *qkv = malloc(sizeof(float) * (size_t)(T * qkv_width));
    float *attn = malloc(sizeof(float) * (size_t)(T * attn_width));
    float *gate_up = malloc(sizeof(float) * (size_t)(T * 2 * I));
    int8_t *qs = malloc((size_t)(T * widest));
    float *scales = malloc(sizeof(float) * (size_t)(2 * T * (widest / QK)));
    if (!hidden || !qkv || !attn || !gate_up || !qs || !scales) {
        free(hidden); free(qkv); free(attn); free(gate_up); free(qs); free(scales);
        return -2;
    }
    layer_job j = {.m = m, .s = s, .hidden = hidden, .qkv = qkv, .attn = attn,
                   .gate_up = gate_up};
    j.x = (qacts){qs, scales, scales + T * (widest / QK), H};
    double mark = s->seconds != NULL ? now() : 0.0;
    pool_run(p, embed_item, &j, T);
    for (int64_t l = 0; l < m->num_layers; l++) {
        const layer_weights *layer = &m->layers[l];
        j.layer = layer;
        j.norm = layer->input_norm;
        j.x.cols = H;
        pool_run(p, norm_item, &j, T);
        lap(s, REST, &mark);
        qgemm(p, &j.x, T, &layer->qkv, qkv, qkv_width, 0);
        lap(s, MATMULS, &mark);
        pool_run(p, rope_item, &j, T);
        lap(s, REST, &mark);
        attend(p, &j);
        lap(s, ATTENTION, &mark);
        j.x.cols = attn_width;
        pool_run(p, quantize_item, &j, T);
        lap(s, REST, &mark);
        qgemm(p, &j.x, T, &layer->o_proj, hidden, H, 1);
        lap(s, MATMULS, &mark);
        j.norm = layer->post_norm;
        j.x.cols = H;
        pool_run(p, norm_item, &j, T);
        lap(s, REST, &mark);
        qgemm(p, &j.x, T, &layer->gate_up, gate_up, 2 * I, 0);
        lap(s, MATMULS, &mark);
        j.x.cols = I;
        pool_run(p, swiglu_item, &j, T);
        lap(s, REST, &mark);
        qgemm(p, &j.x, T, &layer->down, hidden, H, 1);
        lap(s, MATMULS, &mark);
    }
    if (s->num_logits > 0) {
        j.norm = m->final_norm;
        j.rows = s->logit_rows;
        j.x.cols = H;
        j.normed = malloc(sizeof(float) * (size_t)(s->num_logits * H));
        if (j.normed == NULL) abort();
        pool_run(p, norm_item, &j, s->num_logits);
        lap(s, REST, &mark);
        qgemm(p, &j.x, s->num_logits, &m->lm_head, s->logits, m->vocab, 0);
        lap(s, MATMULS, &mark);
        pool_run(p, refine_item, &j, s->num_logits);
        free(j.normed);
        lap(s, REST, &mark);
    }
    free(hidden); free(qkv); free(attn); free(gate_up); free(qs); free(scales);
    return 0;
}
