/*
 * A BERT encoder's forward (all-MiniLM-L6-v2: the semantic cache's embedder and pair
 * verifier) in one call: the embeddings' sum and norm, every post-norm layer (QKV, attention
 * over each text's own tokens, the output projection, residual and LayerNorm, the GELU
 * feed-forward) and the result: each text's mean-pooled unit vector, or its first token's
 * ([CLS]) last-layer state for a cross-encoder's head.
 *
 * Why in C: a lookup embeds ~12 tokens and verifies pairs of ~27; the ~15 torch operations per
 * layer between the quantized GEMMs cost about as much as the GEMMs themselves at that size.
 * Row-wise work runs a row per pool item and attention a (text, head) per item, so a text's
 * numbers never depend on the other texts of the batch, as the engine's kernels keep it.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"
#include "vec.h"
/* Attention and GELU in vectors of the target's width (vec_keys.h): with vec.h's 16 lanes on
 * AVX2, GCC kept the values on the stack between iterations and attention took ~16% of a
 * forward instead of ~3%. */
#include "vec_keys.h"

typedef struct {
    qweight qkv;  /* [3 H, H]: query rows, key rows, value rows; with bias */
    qweight out;  /* [H, H] */
    const float *norm1_weight, *norm1_bias;
    qweight up;   /* [I, H] */
    qweight down; /* [H, I] */
    const float *norm2_weight, *norm2_bias;
} bert_layer;

typedef struct {
    int64_t hidden, intermediate, num_layers, num_heads, max_positions;
    float eps;
    const float *word, *position, *type; /* [vocab, H], [max_positions, H], [types, H] */
    const float *norm_weight, *norm_bias;
    const bert_layer *layers;
} bert_model;

enum bert_output { BERT_MEAN_UNIT = 0, BERT_FIRST_STATE = 1 };

typedef struct {
    int64_t num_texts;
    const int64_t *starts;              /* [num_texts + 1]: each text's rows */
    const int64_t *token_ids, *type_ids; /* [T] */
    int32_t output;                     /* enum bert_output */
    float *out;                         /* [num_texts, H] */
} bert_batch;

typedef struct {
    const bert_model *m;
    const bert_batch *batch;
    const bert_layer *layer;
    const int64_t *starts;
    int64_t query_rows;        /* attention: 0 for every row of a text, 1 for its first alone */
    float *hidden, *qkv, *attn, *inner;
    qacts x;
    const float *norm_weight, *norm_bias;
} bert_job;

/* row = (row - mean) / sqrt(var + eps) * weight + bias, sums in a fixed order. */
static void layer_norm(float *row, int64_t h, float eps, const float *weight, const float *bias) {
    vf partial = splat(0.f);
    for (int64_t i = 0; i < h; i += LANES) partial += load_f32(row + i);
    const float mean = hsum(partial) / (float)h;
    partial = splat(0.f);
    for (int64_t i = 0; i < h; i += LANES) {
        const vf centered = load_f32(row + i) - mean;
        partial += centered * centered;
    }
    const float inverse = 1.f / sqrtf(hsum(partial) / (float)h + eps);
    for (int64_t i = 0; i < h; i++) row[i] = (row[i] - mean) * inverse * weight[i] + bias[i];
}

static void quantize_hidden(const bert_job *j, int64_t t) {
    const qacts row = acts_row(&j->x, t);
    quantize_row(j->hidden + t * j->m->hidden, j->m->hidden, row.qs, row.d, row.s);
}

static void embed_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    const bert_model *m = j->m;
    const bert_batch *b = j->batch;
    const int64_t h = m->hidden;
    int64_t text = 0;
    while (b->starts[text + 1] <= t) text++;
    const float *word = m->word + b->token_ids[t] * h;
    const float *position = m->position + (t - b->starts[text]) * h;
    const float *type = m->type + b->type_ids[t] * h;
    float *row = j->hidden + t * h;
    for (int64_t i = 0; i < h; i++) row[i] = word[i] + position[i] + type[i];
    layer_norm(row, h, m->eps, m->norm_weight, m->norm_bias);
    quantize_hidden(j, t);
}

/* One head of one text: softmax(q k^T * scale) v for its query rows (all, or the first). The
 * keys are transposed first, so that the scores of KEYS keys are one vector's lanes. */
static void attention_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    const int64_t heads = j->m->num_heads, h = j->m->hidden, d = h / heads;
    const int64_t text = item / heads, head = item % heads;
    const int64_t start = j->starts[text], n = j->starts[text + 1] - start;
    const int64_t padded = (n + KEYS - 1) / KEYS * KEYS; /* n <= max_positions (512) */
    const int64_t queries = j->query_rows > 0 ? j->query_rows : n;
    const float scale = 1.f / sqrtf((float)d);
    float keys[d * padded], scores[padded];
    for (int64_t k = 0; k < padded; k++) {
        const float *key = j->qkv + (start + k) * 3 * h + h + head * d;
        for (int64_t e = 0; e < d; e++) keys[e * padded + k] = k < n ? key[e] : 0.f;
    }
    for (int64_t i = 0; i < queries; i++) {
        const float *q = j->qkv + (start + i) * 3 * h + head * d;
        for (int64_t k = 0; k < padded; k += KEYS) {
            vk dot = splat_k(0.f);
            for (int64_t e = 0; e < d; e++) dot += q[e] * load_k(keys + e * padded + k);
            store_k(scores + k, dot * scale);
        }
        float best = scores[0], total = 0.f;
        for (int64_t k = 1; k < n; k++) best = scores[k] > best ? scores[k] : best;
        for (int64_t k = 0; k < padded; k += KEYS)
            store_k(scores + k, exp_k(load_k(scores + k) - best));
        for (int64_t k = 0; k < n; k++) total += scores[k];
        for (int64_t k = 0; k < n; k++) scores[k] /= total;
        float *out = j->attn + (start + i) * h + head * d;
        for (int64_t e = 0; e < d; e += KEYS) {
            vk sum = splat_k(0.f);
            for (int64_t k = 0; k < n; k++)
                sum += scores[k] * load_k(j->qkv + (start + k) * 3 * h + 2 * h + head * d + e);
            store_k(out + e, sum);
        }
    }
}

static void quantize_attn_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    const qacts row = acts_row(&j->x, t);
    quantize_row(j->attn + t * j->m->hidden, j->m->hidden, row.qs, row.d, row.s);
}

/* The residual's sum is already in hidden (qgemm accumulates): its norm, then its int8 row. */
static void norm_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    layer_norm(j->hidden + t * j->m->hidden, j->m->hidden, j->m->eps, j->norm_weight,
               j->norm_bias);
    quantize_hidden(j, t);
}

/* erf by Abramowitz and Stegun 7.1.26 (absolute error under 1.5e-7), on whole vectors. */
static vk erf_k(vk x) {
    const vki none = {0};
    const vki sign = (vki)x & (none + INT32_MIN);
    const vk a = (vk)((vki)x & (none + INT32_MAX));
    const vk t = splat_k(1.f) / (splat_k(1.f) + a * 0.3275911f);
    vk p = t * 1.061405429f - 1.453152027f;
    p = p * t + 1.421413741f;
    p = p * t - 0.284496736f;
    p = p * t + 0.254829592f;
    const vk y = splat_k(1.f) - p * t * exp_k(-(a * a));
    return (vk)((vki)y | sign);
}

/* GELU (BERT's exact form, 0.5 x (1 + erf(x / sqrt 2))), then the row's int8 blocks. */
static void gelu_item(void *ctx, int64_t t, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    const int64_t inter = j->m->intermediate;
    float *row = j->inner + t * inter;
    for (int64_t i = 0; i < inter; i += KEYS) {
        const vk x = load_k(row + i);
        store_k(row + i, x * 0.5f * (splat_k(1.f) + erf_k(x * 0.70710678118654752f)));
    }
    const qacts q = acts_row(&j->x, t);
    quantize_row(row, inter, q.qs, q.d, q.s);
}

static void mean_unit_item(void *ctx, int64_t text, int thread) {
    (void)thread;
    const bert_job *j = ctx;
    const bert_batch *b = j->batch;
    const int64_t h = j->m->hidden, start = b->starts[text], n = b->starts[text + 1] - start;
    float *out = b->out + text * h;
    for (int64_t i = 0; i < h; i++) out[i] = 0.f;
    for (int64_t t = start; t < start + n; t++)
        for (int64_t i = 0; i < h; i++) out[i] += j->hidden[t * h + i];
    float norm = 0.f;
    for (int64_t i = 0; i < h; i++) {
        out[i] /= (float)n;
        norm += out[i] * out[i];
    }
    const float inverse = 1.f / fmaxf(sqrtf(norm), 1e-12f); /* torch's normalize */
    for (int64_t i = 0; i < h; i++) out[i] *= inverse;
}

/* 0, or -1 for shapes beyond this code, -2 when out of memory. */
int bert_forward(pool *p, const bert_model *m, const bert_batch *b) {
    const int64_t H = m->hidden, I = m->intermediate, S = b->num_texts;
    int64_t T = b->starts[S];
    if (H % QK || I % QK || H % m->num_heads || (H / m->num_heads) % KEYS || S < 1 || T < S)
        return -1;
    for (int64_t s = 0; s < S; s++) {
        const int64_t length = b->starts[s + 1] - b->starts[s];
        if (length < 1 || length > m->max_positions) return -1;
    }
    float *hidden = malloc(sizeof(float) * (size_t)(T * H));
    float *qkv = malloc(sizeof(float) * (size_t)(T * 3 * H));
    float *attn = malloc(sizeof(float) * (size_t)(T * H));
    float *inner = malloc(sizeof(float) * (size_t)(T * I));
    int8_t *qs = malloc((size_t)(T * I));
    float *scales = malloc(sizeof(float) * (size_t)(2 * T * (I / QK)));
    int64_t *starts = malloc(sizeof(int64_t) * (size_t)(S + 1));
    if (!hidden || !qkv || !attn || !inner || !qs || !scales || !starts) {
        free(hidden); free(qkv); free(attn); free(inner); free(qs); free(scales); free(starts);
        return -2;
    }
    memcpy(starts, b->starts, sizeof(int64_t) * (size_t)(S + 1));
    bert_job j = {.m = m, .batch = b, .starts = starts, .hidden = hidden, .qkv = qkv,
                  .attn = attn, .inner = inner};
    j.x = (qacts){qs, scales, scales + T * (I / QK), H};
    pool_run(p, embed_item, &j, T);
    const int first_only = b->output == BERT_FIRST_STATE;
    for (int64_t l = 0; l < m->num_layers; l++) {
        const bert_layer *layer = &m->layers[l];
        const int last = l == m->num_layers - 1;
        j.layer = layer;
        /* j.x holds hidden's int8 rows: quantized by the embeddings' or the last norm's items */
        qgemm(p, &j.x, T, &layer->qkv, qkv, 3 * H, 0);
        /* A cross-encoder reads [CLS] alone: the last layer's keys and values come from every
         * token, its queries and everything after attention from the first row of each text. */
        j.query_rows = last && first_only ? 1 : 0;
        pool_run(p, attention_item, &j, S * m->num_heads);
        if (j.query_rows) {
            for (int64_t s = 0; s < S; s++) { /* starts[s] >= s: in order, nothing is overwritten */
                memmove(hidden + s * H, hidden + starts[s] * H, sizeof(float) * (size_t)H);
                memmove(attn + s * H, attn + starts[s] * H, sizeof(float) * (size_t)H);
            }
            for (int64_t s = 0; s <= S; s++) starts[s] = s;
            T = S;
        }
        pool_run(p, quantize_attn_item, &j, T);
        qgemm(p, &j.x, T, &layer->out, hidden, H, 1);
        j.norm_weight = layer->norm1_weight;
        j.norm_bias = layer->norm1_bias;
        pool_run(p, norm_item, &j, T);
        qgemm(p, &j.x, T, &layer->up, inner, I, 0);
        j.x.cols = I;
        pool_run(p, gelu_item, &j, T);
        qgemm(p, &j.x, T, &layer->down, hidden, H, 1);
        j.x.cols = H;
        j.norm_weight = layer->norm2_weight;
        j.norm_bias = layer->norm2_bias;
        pool_run(p, norm_item, &j, T);
    }
    if (first_only) {
        for (int64_t s = 0; s < S; s++)
            memcpy(b->out + s * H, hidden + starts[s] * H, sizeof(float) * (size_t)H);
    } else {
        pool_run(p, mean_unit_item, &j, S);
    }
    free(hidden); free(qkv); free(attn); free(inner); free(qs); free(scales); free(starts);
    return 0;
}
