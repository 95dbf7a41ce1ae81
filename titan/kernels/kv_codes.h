/*
 * The int8 attention units' codes of the float16 KV cache (attention_reduced.c, _avx2.c):
 * each key and each value as int8 with a scale of its own. The unit used to round every key and
 * value of the context again for each tile of queries and each decode step (a decode step over
 * 6,000 cached tokens spent most of its attention there); now they are rounded once, where they
 * are written (forward.c's KV write, kv_move.c's context shift), from the float16 numbers as
 * stored (AVX-512 or AVX2 loops where the CPU has them, plain C elsewhere: the same bytes). Where
 * a caller keeps no codes, the units write a step's with these same functions
 * (attention.h's int8_step_at): the tests compare the outputs both ways.
 *
 * Layout per cache block and KV head:
 *   keys:   [head_dim / 4][block_size] uint32, a key's four dims as bytes + 128 in a lane (what
 *           vpdpbusd reads as its unsigned side), then [block_size] float scales;
 *   values: [block_size / 4][head_dim] uint32, four values' bytes (signed) of one dim in a lane
 *           (the signed side, against four probabilities), then [block_size] float scales.
 */
#ifndef TITAN_KV_CODES_H
#define TITAN_KV_CODES_H

#include <math.h>
#include <stdint.h>
#include <string.h>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif

#define KV_CODE_WORDS(head_dim) (2 * ((head_dim) / 4 + 1)) /* 32-bit words a token takes */
#define KV_CODE_MAX_DIM 256 /* head dims with codes: a multiple of 16 up to this */

/* One cache block's codes of KV head kh. */
static inline uint32_t *kv_codes_block(uint32_t *codes, int64_t block, int64_t kh, int64_t kv,
                                        int64_t hd, int64_t bs) {
    return codes + (block * kv + kh) * KV_CODE_WORDS(hd) * bs;
}

/* The codes of one key into its block's codes at `offset`, from its dims as stored (float16
 * values, as floats, contiguous): the scale is max |x| / 127 (0 stays 0), each dim
 * x * 127 / max rounded to nearest even, + 128. */
static inline void write_key_code(const float *key, int64_t hd, uint32_t *block_codes, int64_t bs,
                                  int64_t offset) {
    float top = 0.f;
#if defined(__AVX2__) && !defined(__AVX512F__)
    __m256 tops = _mm256_setzero_ps(); /* max |x|, exact in any order */
    for (int64_t d = 0; d < hd; d += 8)
        tops = _mm256_max_ps(tops, _mm256_andnot_ps(_mm256_set1_ps(-0.f), _mm256_loadu_ps(key + d)));
    float lanes8[8];
    _mm256_storeu_ps(lanes8, tops);
    for (int i = 0; i < 8; i++) top = fmaxf(top, lanes8[i]);
#else
    for (int64_t d = 0; d < hd; d++) top = fmaxf(top, fabsf(key[d]));
#endif
    const float inverse = top > 0.f ? 127.f / top : 0.f;
#if defined(__AVX512F__)
    for (int64_t d = 0; d < hd; d += 16) { /* 16 dims: four lanes of four bytes */
        const __m512i codes = _mm512_add_epi32(
            _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(key + d), _mm512_set1_ps(inverse))),
            _mm512_set1_epi32(128));
        uint32_t lanes[4];
        _mm_storeu_si128((__m128i *)lanes, _mm512_cvtepi32_epi8(codes));
        for (int i = 0; i < 4; i++) block_codes[(d / 4 + i) * bs + offset] = lanes[i];
    }
#elif defined(__AVX2__)
    /* 8 dims: the low byte of each code, four to a 128-bit half, one lane each (the scalar
     * loop below, byte for byte: cvtps rounds as nearbyintf does, to nearest even); a context
     * shift writes a code per moved token, and this took most of the move on AVX2 CPUs */
    const __m256i low_bytes = _mm256_setr_epi8(0, 4, 8, 12, -1, -1, -1, -1, -1, -1, -1, -1, -1,
                                               -1, -1, -1, 0, 4, 8, 12, -1, -1, -1, -1, -1, -1,
                                               -1, -1, -1, -1, -1, -1);
    for (int64_t d = 0; d < hd; d += 8) {
        const __m256i codes = _mm256_add_epi32(
            _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(key + d), _mm256_set1_ps(inverse))),
            _mm256_set1_epi32(128));
        const __m256i bytes = _mm256_shuffle_epi8(codes, low_bytes);
        block_codes[(d / 4) * bs + offset] = (uint32_t)_mm256_extract_epi32(bytes, 0);
        block_codes[(d / 4 + 1) * bs + offset] = (uint32_t)_mm256_extract_epi32(bytes, 4);
    }
#else
    for (int64_t g = 0; g < hd / 4; g++) {
        uint32_t lane = 0;
        for (int i = 0; i < 4; i++) /* nearbyintf: the current rounding, to nearest even */
            lane |= (uint32_t)((int32_t)nearbyintf(key[4 * g + i] * inverse) + 128) << 8 * i;
        block_codes[g * bs + offset] = lane;
    }
#endif
    const float scale = top * (1.f / 127.f);
    memcpy(block_codes + (hd / 4) * bs + offset, &scale, sizeof scale);
}

/* The same from a key of the K cache (dims `stride` apart, float16). */
static inline void write_key_code_f16(const _Float16 *key, int64_t stride, int64_t hd,
                                      uint32_t *block_codes, int64_t bs, int64_t offset) {
    float dims[KV_CODE_MAX_DIM];
    for (int64_t d = 0; d < hd; d++) dims[d] = (float)key[d * stride];
    write_key_code(dims, hd, block_codes, bs, offset);
}

/* A block's value codes: after its keys' lanes and scales. */
static inline uint32_t *value_codes_of(uint32_t *block_codes, int64_t hd, int64_t bs) {
    return block_codes + (hd / 4 + 1) * bs;
}

/* The codes of one value (float16 numbers, as floats, contiguous) into its block's codes at
 * `offset`: the scale is max |x| / 127 (0 stays 0), each dim x * 127 / max rounded to nearest
 * even, as a signed byte. */
static inline void write_value_code(const float *value, int64_t hd, uint32_t *block_codes,
                                    int64_t bs, int64_t offset) {
    float top = 0.f;
    for (int64_t d = 0; d < hd; d++) top = fmaxf(top, fabsf(value[d]));
    const float inverse = top > 0.f ? 127.f / top : 0.f;
    /* byte offset % 4 of each lane (little-endian: bits 8 * (offset % 4) up), stored alone: the
     * lane's other tokens may be written at the same time by other threads */
    uint8_t *bytes = (uint8_t *)(value_codes_of(block_codes, hd, bs) + (offset / 4) * hd);
    for (int64_t d = 0; d < hd; d++) /* nearbyintf: the current rounding, to nearest even */
        bytes[4 * d + offset % 4] = (uint8_t)(int32_t)nearbyintf(value[d] * inverse);
    const float scale = top * (1.f / 127.f);
    memcpy(value_codes_of(block_codes, hd, bs) + (bs / 4) * hd + offset, &scale, sizeof scale);
}

/* One value's codes copied from one block's codes at `from` to another's at `to`. */
static inline void copy_value_code(uint32_t *from_block, int64_t from, uint32_t *to_block,
                                   int64_t to, int64_t hd, int64_t bs) {
    const uint8_t *source = (const uint8_t *)(value_codes_of(from_block, hd, bs) + (from / 4) * hd);
    uint8_t *destination = (uint8_t *)(value_codes_of(to_block, hd, bs) + (to / 4) * hd);
    for (int64_t d = 0; d < hd; d++) destination[4 * d + to % 4] = source[4 * d + from % 4];
    memcpy(value_codes_of(to_block, hd, bs) + (bs / 4) * hd + to,
           value_codes_of(from_block, hd, bs) + (bs / 4) * hd + from, sizeof(float));
}

/* The same from a value of the V cache (float16, contiguous). */
static inline void write_value_code_f16(const _Float16 *value, int64_t hd, uint32_t *block_codes,
                                        int64_t bs, int64_t offset) {
    float dims[KV_CODE_MAX_DIM];
    for (int64_t d = 0; d < hd; d++) dims[d] = (float)value[d];
    write_value_code(dims, hd, block_codes, bs, offset);
}

#endif
