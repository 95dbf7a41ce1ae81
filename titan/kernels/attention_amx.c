/*
 * Attention over a float16 KV cache on AMX tiles (Intel's Sapphire Rapids and later): the
 * reduced-precision unit where the CPU has AMX-BF16, in place of attention_reduced.c's.
 *
 * On those CPUs the AVX-512 dot-product instructions run on one port while float32 FMAs run on
 * two, so int8 scores and bfloat16 values gained nothing there (measured: 27.8 ms against the
 * float32 unit's 25.6 ms); a tile instruction does 16 x 16 x 32 products. So, a step at a time:
 *   - scores: 16 rows of queries (in bfloat16, scaled by the softmax scale) times the step's 64
 *     keys (in bfloat16, dims in pairs as TDPBF16PS reads them), summed in float32 by the tile;
 *   - the softmax in float32 on AVX-512, as attention.c's (softmax_step);
 *   - values: the rows' probabilities (bfloat16) times the step's values (bfloat16, keys in
 *     pairs), added to the rows' float32 sums in tiles.
 * bfloat16 keeps 8 bits of each number's own mantissa (no shared scale: a key's outlier
 * channels cost its other channels nothing, unlike int8). A tile's rows never mix: a row's
 * output depends on its own query and its visible keys only, in the fixed order of the steps,
 * so the engine stays batch-invariant.
 *
 * Linux hands out AMX's register state only on request (arch_prctl); where the request fails the
 * unit is unavailable and attention.c's float32 unit serves.
 */
#include <stdint.h>
#include <string.h>

#include "attention.h"

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__AVX512BF16__)
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18
#define ROWS 16 /* a tile's rows, and the rows of queries taken together */
/* Keys per softmax step: four tiles of 16 keys, so that the step's tile products form four
 * independent chains (one row tile, a decode, would otherwise wait on each product's latency). */
#define AMX_STEP 64
#define AMX_VECTORS (AMX_STEP / KEYS)
#define PAIRS (AMX_STEP / 2)
#define OUT_TILES 4 /* output tiles of 16 dims summed at once */
#define ALIGN(n) (((n) + 63) & ~(int64_t)63)
/* Tiles (the intrinsics paste the number into the register name): C, float sums, 0-3; A, the
 * queries or probabilities, 4; B, the keys or values, 5-6 (one loads while the other is used). */
#define SUM0 0
#define SUM1 1
#define SUM2 2
#define SUM3 3
#define ROWS_IN 4
#define KEYS0 5
#define KEYS1 6

typedef struct {
    uint16_t *q;      /* [padded rows][head_dim] bfloat16 */
    uint32_t *k;      /* [head_dim / 2][AMX_STEP]: a key's two dims as bfloat16 a lane */
    uint32_t *v;      /* [PAIRS][head_dim]: two keys' values of one dim a lane */
    float *scores;    /* [padded rows][AMX_STEP] */
    uint32_t *pairs;  /* [padded rows][PAIRS]: the step's probabilities, bfloat16 */
    float *acc;       /* [padded rows][head_dim] */
    float *total;     /* [padded rows][KEYS] */
    float *max;       /* [padded rows] */
} amx_scratch;

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

const char *attention_reduced_kind(void) { return "bfloat16 on AMX tiles"; }

/* Asked once per process (attention() asks at every call: a syscall there costs microseconds in
 * a sandboxed kernel); the kernel's answer never changes. */
static pthread_once_t amx_asked = PTHREAD_ONCE_INIT;
static int amx_granted;

static void ask_for_amx(void) {
    amx_granted = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
}

int attention_reduced_available(void) {
    pthread_once(&amx_asked, ask_for_amx);
    return amx_granted;
}

static int64_t padded_rows(int64_t rows) { return (rows + ROWS - 1) / ROWS * ROWS; }

static int64_t carve(amx_scratch *w, char *base, int64_t rows, int64_t hd) {
    const int64_t padded = padded_rows(rows);
    int64_t at = 0;
#define TAKE(field, bytes) (w->field = (void *)(base + at), at += ALIGN(bytes))
    TAKE(q, 2 * padded * hd);
    TAKE(k, 2 * hd * AMX_STEP);
    TAKE(v, 4 * PAIRS * hd);
    TAKE(scores, 4 * padded * AMX_STEP);
    TAKE(pairs, 4 * padded * PAIRS);
    TAKE(acc, 4 * padded * hd);
    TAKE(total, 4 * padded * KEYS);
    TAKE(max, 4 * padded);
#undef TAKE
    return at;
}

int64_t attention_reduced_scratch_bytes(int64_t rows, int64_t head_dim) {
    amx_scratch w;
    return carve(&w, NULL, rows, head_dim) + 64;
}

/* 16 keys of a transposed cache block (dims `stride` apart) as dim pairs, keys AMX_STEP apart. */
static inline void stage_keys(const _Float16 *kb, int64_t stride, int64_t hd, uint32_t *k) {
    for (int64_t d = 0; d < hd; d += 2)
        _mm512_storeu_si512(k + (d / 2) * AMX_STEP, bf16_pairs(f16_vector(kb + d * stride),
                                                                f16_vector(kb + (d + 1) * stride)));
}

/* The step's scores for the 16 rows from r0: queries (32 dims a tile) times 4 tiles of keys. */
static inline void tile_scores(const amx_scratch *w, int64_t r0, int64_t hd) {
    _tile_zero(SUM0);
    _tile_zero(SUM1);
    _tile_zero(SUM2);
    _tile_zero(SUM3);
    const int64_t stride = 4 * AMX_STEP;
    for (int64_t d = 0; d < hd; d += 32) {
        const uint32_t *k = w->k + (d / 2) * AMX_STEP;
        _tile_loadd(ROWS_IN, w->q + r0 * hd + d, 2 * hd);
        _tile_loadd(KEYS0, k, stride);
        _tile_dpbf16ps(SUM0, ROWS_IN, KEYS0);
        _tile_loadd(KEYS1, k + 16, stride);
        _tile_dpbf16ps(SUM1, ROWS_IN, KEYS1);
        _tile_loadd(KEYS0, k + 32, stride);
        _tile_dpbf16ps(SUM2, ROWS_IN, KEYS0);
        _tile_loadd(KEYS1, k + 48, stride);
        _tile_dpbf16ps(SUM3, ROWS_IN, KEYS1);
    }
    float *scores = w->scores + r0 * AMX_STEP;
    _tile_stored(SUM0, scores, 4 * AMX_STEP);
    _tile_stored(SUM1, scores + 16, 4 * AMX_STEP);
    _tile_stored(SUM2, scores + 32, 4 * AMX_STEP);
    _tile_stored(SUM3, scores + 48, 4 * AMX_STEP);
}

/* The rows' sums of 64 dims from d plus the step's probabilities times its values: four output
 * tiles, each summing the step's two tiles of 32 keys. */
static inline void tile_values(const amx_scratch *w, int64_t r0, int64_t hd, int64_t d) {
    float *acc = w->acc + r0 * hd + d;
    const int64_t stride = 4 * hd;
    _tile_loadd(SUM0, acc, stride);
    _tile_loadd(SUM1, acc + 16, stride);
    _tile_loadd(SUM2, acc + 32, stride);
    _tile_loadd(SUM3, acc + 48, stride);
    for (int64_t pair = 0; pair < PAIRS; pair += 16) {
        const uint32_t *v = w->v + pair * hd + d;
        _tile_loadd(ROWS_IN, w->pairs + r0 * PAIRS + pair, 4 * PAIRS);
        _tile_loadd(KEYS0, v, stride);
        _tile_dpbf16ps(SUM0, ROWS_IN, KEYS0);
        _tile_loadd(KEYS1, v + 16, stride);
        _tile_dpbf16ps(SUM1, ROWS_IN, KEYS1);
        _tile_loadd(KEYS0, v + 32, stride);
        _tile_dpbf16ps(SUM2, ROWS_IN, KEYS0);
        _tile_loadd(KEYS1, v + 48, stride);
        _tile_dpbf16ps(SUM3, ROWS_IN, KEYS1);
    }
    _tile_stored(SUM0, acc, stride);
    _tile_stored(SUM1, acc + 16, stride);
    _tile_stored(SUM2, acc + 32, stride);
    _tile_stored(SUM3, acc + 48, stride);
}

/* The step's 64 keys and values staged; keys past the context are staged from the step's first
 * vector (their scores are cut before the softmax), values past it are zeros. */
static void stage_step(const attention_args *a, const int64_t *table, int64_t kh, int64_t t0,
                       int64_t count, const amx_scratch *w) {
    const _Float16 *k_cache = a->k_cache, *v_cache = a->v_cache;
    const int64_t hd = a->head_dim, bs = a->block_size, kv = a->num_kv_heads;
    for (int c = 0; c < AMX_VECTORS; c++) { /* a vector never crosses a cache block */
        const int64_t t = c * KEYS < count ? t0 + c * KEYS : t0;
        const int64_t block = table[t / bs], offset = t % bs;
        stage_keys(k_cache + (block * kv + kh) * hd * bs + offset, bs, hd, w->k + c * KEYS);
        const _Float16 *vb = v_cache + ((block * bs + offset) * kv + kh) * hd;
        for (int64_t j = c * KEYS; j < count && j < (c + 1) * KEYS; j += 2) {
            const int64_t at = j - c * KEYS;
            stage_value_pair(vb + at * kv * hd, j + 1 < count ? vb + (at + 1) * kv * hd : NULL,
                             hd, w->v + (j / 2) * hd);
        }
    }
    /* pairs past the step's keys: zero values (a stale or unset one could be NaN) */
    const int64_t staged = (count + 1) / 2;
    memset(w->v + staged * hd, 0, 4 * (size_t)((PAIRS - staged) * hd));
}

/* One row's softmax over the step, its probabilities as bfloat16 pairs, its sums rescaled. */
static inline void row_softmax(const amx_scratch *w, int64_t row, int64_t visible, int64_t hd) {
    vk total = load_k(w->total + row * KEYS);
    float p[AMX_STEP], factor;
    softmax_step((const vk *)(w->scores + row * AMX_STEP), AMX_VECTORS, visible, w->max + row,
                 &total, p, &factor, 0);
    store_k(w->total + row * KEYS, total);
    for (int c = 0; c < AMX_STEP; c += 32)
        _mm512_storeu_si512(w->pairs + row * PAIRS + c / 2,
                            (__m512i)_mm512_cvtne2ps_pbh(_mm512_loadu_ps(p + c + 16),
                                                         _mm512_loadu_ps(p + c)));
    if (factor != 1.f)
        for (int64_t d = 0; d < hd; d += 16)
            _mm512_storeu_ps(w->acc + row * hd + d,
                             _mm512_mul_ps(_mm512_loadu_ps(w->acc + row * hd + d),
                                           _mm512_set1_ps(factor)));
}

void attention_reduced_unit(const attention_args *a, int64_t s, int64_t tile, int64_t kh,
                            void *memory) {
    const float *q = a->q;
    const int64_t hd = a->head_dim;
    const int64_t *table = a->block_tables + s * a->max_blocks;
    const reduced_shape u = reduced_shape_of(a, s, tile);
    const int64_t n = u.n, group = u.group, rows = u.rows, padded = padded_rows(rows);
    const int64_t first_ctx = u.first_ctx, last_ctx = u.last_ctx;
    amx_scratch w;
    carve(&w, (char *)(((uintptr_t)memory + 63) & ~(uintptr_t)63), rows, hd);
    memset(w.q, 0, 2 * (size_t)(padded * hd));
    memset(w.pairs, 0, 4 * (size_t)(padded * PAIRS)); /* padding rows stay zero */
    memset(w.acc, 0, 4 * (size_t)(padded * hd));
    for (int64_t i = 0; i < n; i++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t row = i * group + g;
            const float *x = q + (tile + i) * a->q_stride + (kh * group + g) * hd;
            for (int64_t d = 0; d < hd; d += 16)
                _mm256_storeu_si256((__m256i *)(w.q + row * hd + d),
                                    (__m256i)_mm512_cvtneps_pbh(_mm512_mul_ps(
                                        _mm512_loadu_ps(x + d), _mm512_set1_ps(a->scale))));
            w.max[row] = -INFINITY;
            store_k(w.total + row * KEYS, splat_k(0.f));
        }
    tile_config config = {.palette = 1};
    for (int t = 0; t < 8; t++) config.rows[t] = ROWS, config.colsb[t] = 64;
    _tile_loadconfig(&config);
    for (int64_t t0 = 0; t0 < last_ctx; t0 += AMX_STEP) {
        const int64_t count = last_ctx - t0 < AMX_STEP ? last_ctx - t0 : AMX_STEP;
        stage_step(a, table, kh, t0, count, &w);
        /* rows of queries that see none of these keys skip the step (zero probabilities) */
        const int64_t first_row = (t0 < first_ctx ? 0 : t0 - first_ctx + 1) * group;
        for (int64_t r0 = first_row / ROWS * ROWS; r0 < rows; r0 += ROWS) {
            tile_scores(&w, r0, hd);
            for (int64_t row = r0; row < r0 + ROWS && row < rows; row++) {
                if (row < first_row)
                    memset(w.pairs + row * PAIRS, 0, 4 * PAIRS);
                else
                    row_softmax(&w, row, first_ctx + row / group - t0, hd);
            }
            for (int64_t d = 0; d < hd; d += 16 * OUT_TILES) tile_values(&w, r0, hd, d);
        }
    }
    _tile_release();
    reduced_write_out(a, &u, tile, kh, w.acc, w.total);
}

#endif
