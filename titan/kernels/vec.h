/*
 * 16-lane float vectors (GCC/Clang vector extensions) shared by attention.c and forward.c:
 * element-wise IEEE arithmetic, so a lane's result never depends on the other lanes, and the
 * compiler emits AVX-512, AVX2, SSE or NEON as -march=native allows.
 */
#ifndef TITAN_VEC_H
#define TITAN_VEC_H

#include <stdint.h>
#include <string.h>

#if defined(__AVX512F__) || (defined(__F16C__) && defined(__AVX__))
#include <immintrin.h>
#elif defined(__aarch64__)
#include <arm_neon.h>
#endif

#define LANES 16

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

typedef float vf __attribute__((vector_size(4 * LANES)));
typedef float vfu __attribute__((vector_size(4 * LANES), aligned(4)));
typedef int32_t vi __attribute__((vector_size(4 * LANES)));

static inline vf load_f32(const float *p) { return *(const vfu *)p; }

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
 * polynomial, ~1 ulp, on whole vectors. A macro so that attention.c has the same operations at
 * its own vector width: NAME over vector type V (ints VI), with V's max and splat. */
#define DEFINE_EXP_NONPOSITIVE(NAME, V, VI, VMAX, SPLAT)                                          \
static inline V NAME(V x) {                                                                     \
    x = VMAX(x, SPLAT(-87.0f));                                                                 \
    const VI n = __builtin_convertvector(x * 1.44269504088896341f - 0.5f, VI);                  \
    const V nf = __builtin_convertvector(n, V);                                                 \
    V r = x - nf * 0.693359375f;                                                                \
    r = r - nf * -2.12194440e-4f;                                                               \
    V p = r * 1.9875691500e-4f + 1.3981999507e-3f;                                              \
    p = p * r + 8.3334519073e-3f;                                                               \
    p = p * r + 4.1665795894e-2f;                                                               \
    p = p * r + 1.6666665459e-1f;                                                               \
    p = p * r + 5.0000001201e-1f;                                                               \
    p = p * r * r + r + 1.0f;                                                                   \
    return p * (V)((n + 127) << 23);                                                            \
}

DEFINE_EXP_NONPOSITIVE(exp_nonpositive, vf, vi, vmax, splat)

/* x * sigmoid(x), from exp(-|x|) so that the exponential never overflows. */
static inline vf silu(vf x) {
    const vi negative = x < splat(0.f);
    const vi no_sign = {0};
    const vf magnitude = (vf)((vi)x & (no_sign + 0x7FFFFFFF));
    const vf e = exp_nonpositive(-magnitude);
    const vf one = splat(1.f);
    const vf numerator = (vf)(((vi)e & negative) | ((vi)one & ~negative));
    return x * (numerator / (one + e));
}

#endif
