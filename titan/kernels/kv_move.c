/*
 * Context shift's KV copy for the quantized model's float16 caches: each token's keys and values
 * moved from one cache slot to another in every layer, keys rotated back by the shift (RoPE is a
 * rotation per position: the key at q + d rotated by -d is the key at q).
 *
 * In torch this was two gathers and two scatters of [tokens, kv_heads, head_dim] per layer plus
 * the rotation in float32: 0.3-0.4 s for a conversation trimmed to 3,300 kept tokens, a third of
 * that turn's time to first token. Here it is one pass over the bytes, a layer's chunk of tokens
 * a pool item. The arithmetic is rope.py's rotated_back: float32, then rounded to float16.
 *
 * Destinations are blocks the engine allocated for the new request and sources are the old
 * sequence's blocks, held until the copy is done: the two never overlap, so tokens can be moved
 * in any order.
 */
#include <stdint.h>
#include <string.h>

#include "cpu.h"
#include "kv_codes.h"

#define MOVE_CHUNK 256 /* tokens of one layer per pool item */

static void move_item(void *ctx, int64_t item, int thread) {
    (void)thread;
    const kv_move_args *a = ctx;
    const int64_t chunks = (a->num_tokens + MOVE_CHUNK - 1) / MOVE_CHUNK;
    const int64_t layer = item / chunks, first = (item % chunks) * MOVE_CHUNK;
    const int64_t last = first + MOVE_CHUNK < a->num_tokens ? first + MOVE_CHUNK : a->num_tokens;
    const int64_t kv = a->num_kv_heads, hd = a->head_dim, bs = a->block_size, half = hd / 2;
    _Float16 *k = a->k_caches[layer], *v = a->v_caches[layer];
    for (int64_t t = first; t < last; t++) {
        const int64_t from = a->source_slots[t], to = a->destination_slots[t];
        memcpy(v + to * kv * hd, v + from * kv * hd, sizeof(_Float16) * (size_t)(kv * hd));
        for (int64_t h = 0; h < kv; h++) {
            /* a key's dims are block_size apart in the transposed layout */
            const _Float16 *src = k + ((from / bs) * kv + h) * hd * bs + from % bs;
            _Float16 *dst = k + ((to / bs) * kv + h) * hd * bs + to % bs;
            float stored[KV_CODE_MAX_DIM]; /* the key as written, for its codes */
            if (a->cos == NULL) {
                for (int64_t d = 0; d < hd; d++) stored[d] = (float)(dst[d * bs] = src[d * bs]);
            } else {
                for (int64_t d = 0; d < half; d++) { /* rotate-half layout: dims d, d + half */
                    const float x1 = (float)src[d * bs], x2 = (float)src[(d + half) * bs];
                    dst[d * bs] = (_Float16)(x1 * a->cos[d] + x2 * a->sin[d]);
                    dst[(d + half) * bs] = (_Float16)(x2 * a->cos[d] - x1 * a->sin[d]);
                    stored[d] = (float)dst[d * bs], stored[d + half] = (float)dst[(d + half) * bs];
                }
            }
            if (a->kv_codes != NULL) { /* the key's new codes; the value's, unchanged, copied */
                uint32_t *codes = kv_codes_block(a->kv_codes[layer], to / bs, h, kv, hd, bs);
                write_key_code(stored, hd, codes, bs, to % bs);
                copy_value_code(kv_codes_block(a->kv_codes[layer], from / bs, h, kv, hd, bs),
                                from % bs, codes, to % bs, hd, bs);
            }
        }
    }
}

typedef struct {
    const _Float16 *k_cache, *v_cache;
    int64_t kv, hd, bs;
    uint32_t *codes;
} codes_job;

static void codes_item(void *ctx, int64_t block, int thread) {
    (void)thread;
    const codes_job *j = ctx;
    for (int64_t h = 0; h < j->kv; h++)
        for (int64_t offset = 0; offset < j->bs; offset++) {
            uint32_t *codes = kv_codes_block(j->codes, block, h, j->kv, j->hd, j->bs);
            write_key_code_f16(j->k_cache + (block * j->kv + h) * j->hd * j->bs + offset, j->bs,
                               j->hd, codes, j->bs, offset);
            write_value_code_f16(j->v_cache + ((block * j->bs + offset) * j->kv + h) * j->hd, j->hd,
                                 codes, j->bs, offset);
        }
}

int kv_codes(pool *p, const _Float16 *k_cache, const _Float16 *v_cache, int64_t num_blocks,
             int64_t num_kv_heads, int64_t head_dim, int64_t block_size, uint32_t *codes) {
    if (head_dim % 16 || head_dim > KV_CODE_MAX_DIM || block_size % 16) return -1;
    codes_job job = {k_cache, v_cache, num_kv_heads, head_dim, block_size, codes};
    pool_run(p, codes_item, &job, num_blocks);
    return 0;
}

int kv_move(pool *p, const kv_move_args *a) {
    if (a->head_dim % 2 || a->head_dim > KV_CODE_MAX_DIM || a->num_tokens < 0) return -1;
    if (a->kv_codes != NULL && (a->head_dim % 16 || a->block_size % 16)) return -1;
    const int64_t chunks = (a->num_tokens + MOVE_CHUNK - 1) / MOVE_CHUNK;
    pool_run(p, move_item, (void *)a, chunks * a->num_layers);
    return 0;
}
