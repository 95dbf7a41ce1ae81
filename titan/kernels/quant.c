/*
 * Block formats of quantized weights, and activations quantized to int8 per block of 32.
 *
 * Weights are repacked at load into panels of PANEL (16) output rows, so that one vector load
 * holds 4 consecutive K values of each of the 16 rows: an int8 dot-product instruction
 * (VNNI's vpdpbusd, AVX2's vpmaddubsw + vpmaddwd, NEON's sdot) then adds 4 products per row
 * into 16 separate sums, one per output column, and no sum ever mixes columns. Per panel and
 * block of 32 K values:
 *
 *   Q4_1 (320 bytes, GGUF's Q4_1 values: w = d * q + m, q in 0..15)
 *     [0, 256)   4 groups s of 64 bytes: byte 4c + j = q[c][4s + j] | q[c][16 + 4s + j] << 4
 *     [256, 288) d[16], float16
 *     [288, 320) m[16], float16
 *   Q8_0 (608 bytes, GGUF's Q8_0 values: w = d * q, q in -127..127)
 *     [0, 512)   8 groups s of 64 bytes: byte 4c + j = q[c][4s + j]
 *     [512, 544) d[16], float16
 *     [544, 608) sum over the block of q[c], int32 (VNNI multiplies unsigned by signed bytes:
 *                it takes x + 128 and subtracts 128 * sum)
 *
 * titan/kernels/packing.py writes these layouts.
 */
#include <math.h>
#include <string.h>

#include "cpu.h"
#include "vec.h"

#if defined(__AVX2__)
#include <immintrin.h>
#endif

int64_t panel_block_bytes(int32_t format) {
    return format == FORMAT_Q4_1 ? 320 : format == FORMAT_Q8_0 ? 608 : 0;
}

static inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16;
    const uint32_t exponent = (h >> 10) & 0x1F;
    uint32_t mantissa = h & 0x3FF;
    uint32_t bits;
    if (exponent == 0x1F) {
        bits = sign | 0x7F800000u | (mantissa << 13);
    } else if (exponent != 0) {
        bits = sign | ((exponent + 112) << 23) | (mantissa << 13);
    } else if (mantissa == 0) {
        bits = sign;
    } else { /* subnormal: normalize */
        int shift = 0;
        while (!(mantissa & 0x400)) {
            mantissa <<= 1;
            shift++;
        }
        bits = sign | ((uint32_t)(113 - shift) << 23) | ((mantissa & 0x3FF) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

float titan_f16_to_f32(uint16_t h) { return f16_to_f32(h); }

void quantize_row(const float *x, int64_t cols, int8_t *qs, float *d, float *s) {
    const vi no_sign = (vi){0} + 0x7FFFFFFF;
    for (int64_t b = 0; b < cols / QK; b++) {
        const float *xb = x + b * QK;
        /* max |x| of the block: exact whatever the order, so vectors are free to find it */
        const vf high = vmax((vf)((vi)load_f32(xb) & no_sign), (vf)((vi)load_f32(xb + 16) & no_sign));
        const float amax = hmax(high);
        const float scale = amax / 127.f;
        const float inverse = scale != 0.f ? 1.f / scale : 0.f;
#if defined(__AVX2__)
        /* the scalar loop's operations, eight lanes at a time: the same product, rounded half
         * to even, and an exact integer sum */
        const __m256 by = _mm256_set1_ps(inverse);
        const int nearest = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
        __m256i q[4];
        for (int k = 0; k < 4; k++) {
            const __m256 scaled = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), by);
            q[k] = _mm256_cvtps_epi32(_mm256_round_ps(scaled, nearest));
        }
        const __m256i all =
            _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
        __m128i part =
            _mm_add_epi32(_mm256_castsi256_si128(all), _mm256_extracti128_si256(all, 1));
        part = _mm_add_epi32(part, _mm_shuffle_epi32(part, 0x4E));
        const int32_t sum = _mm_cvtsi128_si32(_mm_add_epi32(part, _mm_shuffle_epi32(part, 0xB1)));
        /* packs interleave 128-bit lanes: the permutation puts the 32 bytes back in order */
        const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                                 _mm256_packs_epi32(q[2], q[3]));
        const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
        _mm256_storeu_si256((__m256i *)(qs + b * QK), _mm256_permutevar8x32_epi32(bytes, order));
#else
        int32_t sum = 0;
        for (int j = 0; j < QK; j++) {
            const int8_t q = (int8_t)__builtin_rintf(xb[j] * inverse); /* half to even */
            qs[b * QK + j] = q;
            sum += q;
        }
#endif
        d[b] = scale;
        s[b] = scale * (float)sum;
    }
}

/* quantize_row over `rows` consecutive rows: one call from Python instead of one per row (a
 * ctypes call costs a few microseconds, the row itself well under one). */
void quantize_rows(const float *x, int64_t rows, int64_t cols, int8_t *qs, float *d, float *s) {
    const int64_t blocks = cols / QK;
    for (int64_t r = 0; r < rows; r++)
        quantize_row(x + r * cols, cols, qs + r * cols, d + r * blocks, s + r * blocks);
}

void dequantize_row(const qweight *w, int64_t n, float *out) {
    const int64_t nb = w->cols / QK;
    const int64_t bytes = panel_block_bytes(w->format);
    const uint8_t *panel = w->data + (n / PANEL) * nb * bytes;
    const int c = (int)(n % PANEL);
    for (int64_t b = 0; b < nb; b++) {
        const uint8_t *block = panel + b * bytes;
        float *o = out + b * QK;
        if (w->format == FORMAT_Q8_0) {
            uint16_t h;
            memcpy(&h, block + 512 + 2 * c, 2);
            const float scale = f16_to_f32(h);
            for (int k = 0; k < QK; k++)
                o[k] = scale * (float)(int8_t)block[(k / 4) * 64 + 4 * c + k % 4];
        } else {
            uint16_t hd, hm;
            memcpy(&hd, block + 256 + 2 * c, 2);
            memcpy(&hm, block + 288 + 2 * c, 2);
            const float scale = f16_to_f32(hd), min = f16_to_f32(hm);
            for (int k = 0; k < 16; k++) {
                const uint8_t byte = block[(k / 4) * 64 + 4 * c + k % 4];
                o[k] = scale * (float)(byte & 0x0F) + min;
                o[k + 16] = scale * (float)(byte >> 4) + min;
            }
        }
    }
}
