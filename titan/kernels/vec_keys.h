/*
 * Float vectors of the target's own register width, KEYS lanes (16 with AVX-512, 8 with AVX, 4
 * elsewhere), for attention.c: a wider vector type has no machine mode on a narrower target, and
 * the compiler keeps every one in memory (prefill attention ran at 13 GFLOP/s on an AVX2 EPYC
 * with 16-lane vectors). Element-wise IEEE arithmetic and fixed reduction trees, like vec.h.
 */
#ifndef TITAN_VEC_KEYS_H
#define TITAN_VEC_KEYS_H

#include <stdint.h>
#include <string.h>

#include "vec.h"

#if defined(__AVX512F__)
#define KEYS 16
#elif defined(__AVX__)
#define KEYS 8
#else
#define KEYS 4
#endif

/* Keeps x in a register: without it the compiler folds a value row's load into every FMA that
 * uses it (one load per row instead of one per key), and the loads, not the FMAs, set the pace. */
#if defined(__AVX512F__) || defined(__AVX__)
#define PIN(x) __asm__("" : "+v"(x))
#elif defined(__aarch64__)
#define PIN(x) __asm__("" : "+w"(x))
#else
#define PIN(x) ((void)0)
#endif

typedef float vk __attribute__((vector_size(4 * KEYS)));
typedef float vku __attribute__((vector_size(4 * KEYS), aligned(4)));
typedef int32_t vki __attribute__((vector_size(4 * KEYS)));

static inline vk load_k(const float *p) { return *(const vku *)p; }
static inline void store_k(float *p, vk v) { *(vku *)p = v; }
static inline vk splat_k(float value) { return (vk){0} + value; }
/* a > b ? a : b per lane: exactly what vmaxps computes (b when either is NaN or both are zeros),
 * so the x86 builds use it (one instruction; GCC does not find it in the masks) and the others
 * the masks. */
static inline vk vmax_k(vk a, vk b) {
#if KEYS == 16 && defined(__AVX512F__)
    return (vk)_mm512_max_ps((__m512)a, (__m512)b);
#elif KEYS == 8 && defined(__AVX__)
    return (vk)_mm256_max_ps((__m256)a, (__m256)b);
#else
    const vki take_a = a > b;
    return (vk)(((vki)a & take_a) | ((vki)b & ~take_a));
#endif
}

/* KEYS 16-bit values as floats (exact conversions): one vcvtph2ps (F16C, AVX-512) or NEON vcvt
 * where the target has it at this width, a value at a time elsewhere. */
static inline vk load_f16_k(const _Float16 *p) {
    vk out;
#if KEYS == 16
    const __m512 wide = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)p));
    memcpy(&out, &wide, sizeof out);
#elif KEYS == 8 && defined(__F16C__)
    const __m256 wide = _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)p));
    memcpy(&out, &wide, sizeof out);
#elif KEYS == 4 && defined(__aarch64__)
    const float32x4_t four = vcvt_f32_f16(vld1_f16((const float16_t *)p));
    memcpy(&out, &four, sizeof out);
#else
    for (int i = 0; i < KEYS; i++) out[i] = (float)p[i];
#endif
    return out;
}

typedef uint16_t vk16u __attribute__((vector_size(2 * KEYS), aligned(2)));
static inline vk load_bf16_k(const uint16_t *p) {
    return (vk)(__builtin_convertvector(*(const vk16u *)p, vki) << 16);
}

/* exp(x) for x <= 0: vec.h's exp_nonpositive, the same operations at this width. */
DEFINE_EXP_NONPOSITIVE(exp_k, vk, vki, vmax_k, splat_k)

/* Lane i paired with lane i ^ distance. */
static inline vk swap_k(vk v, int distance) {
#if KEYS == 16
    switch (distance) {
    case 8: return __builtin_shufflevector(v, v, 8, 9, 10, 11, 12, 13, 14, 15, 0, 1, 2, 3, 4, 5, 6, 7);
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3, 12, 13, 14, 15, 8, 9, 10, 11);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5, 10, 11, 8, 9, 14, 15, 12, 13);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6, 9, 8, 11, 10, 13, 12, 15, 14);
    }
#elif KEYS == 8
    switch (distance) {
    case 4: return __builtin_shufflevector(v, v, 4, 5, 6, 7, 0, 1, 2, 3);
    case 2: return __builtin_shufflevector(v, v, 2, 3, 0, 1, 6, 7, 4, 5);
    default: return __builtin_shufflevector(v, v, 1, 0, 3, 2, 5, 4, 7, 6);
    }
#else
    return distance == 2 ? __builtin_shufflevector(v, v, 2, 3, 0, 1)
                         : __builtin_shufflevector(v, v, 1, 0, 3, 2);
#endif
}

/* The maximum, and the sum, of the lanes, by a fixed tree. */
static inline float max_k(vk v) {
    for (int distance = KEYS / 2; distance >= 1; distance /= 2) v = vmax_k(v, swap_k(v, distance));
    return v[0];
}

/* Whether any lane is greater than m (NaN is not). */
static inline int any_above(vk v, float m) {
#if KEYS == 16 && defined(__AVX512F__)
    __m512 x;
    memcpy(&x, &v, sizeof x);
    return _mm512_cmp_ps_mask(x, _mm512_set1_ps(m), _CMP_GT_OQ) != 0;
#elif KEYS == 8 && defined(__AVX__)
    __m256 x;
    memcpy(&x, &v, sizeof x);
    return _mm256_movemask_ps(_mm256_cmp_ps(x, _mm256_set1_ps(m), _CMP_GT_OQ)) != 0;
#else
    return max_k(v) > m;
#endif
}

static inline float sum_k(vk v) {
    for (int distance = KEYS / 2; distance >= 1; distance /= 2) v = v + swap_k(v, distance);
    return v[0];
}

/* Lanes j >= visible set to `fill` (the last keys a row sees are cut at its position). */
static inline vk cut(vk x, int64_t visible, float fill) {
    if (visible >= KEYS) return x;
    vki lane;
    for (int j = 0; j < KEYS; j++) lane[j] = j;
    const vki keep = lane < (vki){0} + (int32_t)visible;
    return (vk)(((vki)x & keep) | ((vki)splat_k(fill) & ~keep));
}

#endif
