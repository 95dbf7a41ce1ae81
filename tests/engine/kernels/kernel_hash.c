/*
 * The CPU kernels on fixed pseudo-random data, printed as hashes of their output bits: built
 * for every instruction-set path (and under emulation for other CPUs), every build must print
 * the same hashes (tests/engine/test_cpu_kernels_paths.py).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cpu.h"

static uint32_t state = 12345;

static uint32_t next(void) {
    state = state * 1664525u + 1013904223u;
    return state >> 8;
}

static float uniform(void) { return (float)(next() % 20000) / 10000.f - 1.f; }

static unsigned long long hash(const void *p, size_t n) {
    const uint8_t *bytes = p;
    unsigned long long h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ bytes[i]) * 1099511628211ull;
    return h;
}

/* Panels of random bytes with float16 scales in a sane range and Q8_0 sums that match. */
static uint8_t *random_panels(int fmt, int64_t panels, int64_t nb) {
    const int64_t bytes = panel_block_bytes(fmt);
    uint8_t *data = malloc((size_t)(panels * nb * bytes));
    for (int64_t i = 0; i < panels * nb * bytes; i++) data[i] = (uint8_t)next();
    for (int64_t pb = 0; pb < panels * nb; pb++) {
        uint8_t *block = data + pb * bytes;
        for (int c = 0; c < 16; c++) {
            uint16_t scale = (uint16_t)(0x2000 + next() % 0x1000);
            memcpy(block + (fmt == FORMAT_Q4_1 ? 256 : 512) + 2 * c, &scale, 2);
            if (fmt == FORMAT_Q4_1) {
                uint16_t min = (uint16_t)(0x8000 | (0x2000 + next() % 0x1000));
                memcpy(block + 288 + 2 * c, &min, 2);
            } else {
                int32_t sum = 0;
                for (int k = 0; k < 32; k++) {
                    uint8_t *q = block + (k / 4) * 64 + 4 * c + k % 4;
                    if (*q == 0x80) *q = 0x81; /* Q8_0 values are -127..127 */
                    sum += (int8_t)*q;
                }
                memcpy(block + 544 + 4 * c, &sum, 4);
            }
        }
    }
    return data;
}

int main(void) {
    const int64_t N = 50, K = 96, T = 7, nb = K / QK;
    pool *p = pool_create(2);
    float *x = malloc(sizeof(float) * T * K);
    for (int64_t i = 0; i < T * K; i++) x[i] = uniform();
    int8_t *qs = malloc((size_t)(T * K));
    float *d = malloc(sizeof(float) * T * nb), *s = malloc(sizeof(float) * T * nb);
    for (int64_t t = 0; t < T; t++) quantize_row(x + t * K, K, qs + t * K, d + t * nb, s + t * nb);
    printf("quantize %016llx\n", hash(qs, (size_t)(T * K)));
    for (int fmt = FORMAT_Q4_1; fmt <= FORMAT_Q8_0; fmt++) {
        uint8_t *data = random_panels(fmt, (N + 15) / 16, nb);
        qweight w = {fmt, N, K, data, NULL};
        qacts a = {qs, d, s, K};
        float *out = malloc(sizeof(float) * T * N);
        qgemm(p, &a, T, &w, out, N, 0);
        printf("qgemm-%s %016llx\n", fmt == FORMAT_Q4_1 ? "q4_1" : "q8_0",
               hash(out, sizeof(float) * T * N));
        free(out);
        free(data);
    }
    /* attention: one sequence of 40 cached tokens, its last 9 as queries */
    const int64_t heads = 4, kv_heads = 2, head_dim = 32, block_size = 16, blocks = 3;
    float *k = malloc(sizeof(float) * blocks * kv_heads * head_dim * block_size);
    float *v = malloc(sizeof(float) * blocks * kv_heads * head_dim * block_size);
    float *q = malloc(sizeof(float) * 9 * heads * head_dim);
    float *out = malloc(sizeof(float) * 9 * heads * head_dim);
    for (int64_t i = 0; i < blocks * kv_heads * head_dim * block_size; i++) {
        k[i] = uniform();
        v[i] = uniform();
    }
    for (int64_t i = 0; i < 9 * heads * head_dim; i++) q[i] = uniform();
    const int64_t tables[3] = {2, 0, 1}, starts[2] = {0, 9}, firsts[1] = {31};
    attention_args args = {
        .q = q, .k_cache = k, .v_cache = v, .block_tables = tables, .query_starts = starts,
        .first_positions = firsts, .out = out, .num_seqs = 1, .num_heads = heads,
        .num_kv_heads = kv_heads, .head_dim = head_dim, .block_size = block_size,
        .max_blocks = 3, .q_stride = heads * head_dim, .out_stride = heads * head_dim,
        .scale = 0.17f, .dtype = ATTENTION_F32,
    };
    const int status = attention(p, &args);
    double total = 0;
    for (int64_t i = 0; i < 9 * heads * head_dim; i++) total += out[i] * (double)(i % 7 + 1);
    printf("attention-status %d\n", status);
    printf("attention-sum %.9e\n", total);
    printf("path %s\n", qgemm_isa());
    pool_destroy(p);
    return 0;
}
