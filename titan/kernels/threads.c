/*
 * The thread pool of the CPU kernels: one job at a time, its items taken one by one from an
 * atomic counter by every thread (the caller included), so a thread the OS deschedules (the HTTP
 * loop needs the core) delays nothing but its current item. Which thread runs an item never
 * changes what the item computes.
 *
 * The counter packs the job's generation with the next item, so a late thread can never take
 * an item of one job with the function of another: its compare-and-swap fails once the
 * generation moved on. Jobs alternate between two slots by generation parity. Idle workers spin
 * a little (the next job of a step comes within microseconds), then sleep on a condition
 * variable.
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>

#include "cpu.h"

#define SPIN_ROUNDS 4096
#define YIELD_EVERY 256

typedef struct {
    _Atomic(task_fn) fn;
    _Atomic(void *) ctx;
    _Atomic int64_t num_items;
} job;

struct pool {
    int num_threads; /* the caller included */
    pthread_t *workers;
    job jobs[2];
    _Atomic uint64_t next; /* generation << 32 | next item */
    _Atomic int64_t done;  /* items finished in the current generation */
    _Atomic int stop;
    _Atomic int num_sleeping;
    pthread_mutex_t lock;
    pthread_cond_t wake;
};

static inline void relax(int round) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
    if (round % YIELD_EVERY == YIELD_EVERY - 1) sched_yield();
}

static void run_items(pool *p, int thread) {
    for (;;) {
        uint64_t seen = atomic_load_explicit(&p->next, memory_order_acquire);
        const job *j = &p->jobs[(seen >> 32) & 1];
        const uint32_t item = (uint32_t)seen;
        if ((int64_t)item >= atomic_load_explicit(&j->num_items, memory_order_relaxed)) return;
        task_fn fn = atomic_load_explicit(&j->fn, memory_order_relaxed);
        void *ctx = atomic_load_explicit(&j->ctx, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&p->next, &seen, seen + 1,
                                                   memory_order_acq_rel, memory_order_acquire))
            continue; /* another thread took it, or a new job began: look again */
        fn(ctx, item, thread);
        atomic_fetch_add_explicit(&p->done, 1, memory_order_release);
    }
}

typedef struct {
    pool *p;
    int thread;
} worker_args;

static void *worker_main(void *arg) {
    worker_args args = *(worker_args *)arg;
    free(arg);
    pool *p = args.p;
    uint32_t seen = (uint32_t)(atomic_load(&p->next) >> 32);
    for (;;) {
        uint32_t generation;
        int round = 0;
        while ((generation = (uint32_t)(atomic_load(&p->next) >> 32)) == seen &&
               !atomic_load(&p->stop)) {
            if (++round < SPIN_ROUNDS) {
                relax(round);
                continue;
            }
            pthread_mutex_lock(&p->lock);
            atomic_fetch_add(&p->num_sleeping, 1);
            while ((uint32_t)(atomic_load(&p->next) >> 32) == seen && !atomic_load(&p->stop))
                pthread_cond_wait(&p->wake, &p->lock);
            atomic_fetch_sub(&p->num_sleeping, 1);
            pthread_mutex_unlock(&p->lock);
            round = 0;
        }
        if (atomic_load(&p->stop)) return NULL;
        seen = generation;
        run_items(p, args.thread);
    }
}

pool *pool_create(int num_threads) {
    pool *p = calloc(1, sizeof(pool));
    if (p == NULL) return NULL;
    p->num_threads = num_threads < 1 ? 1 : num_threads;
    pthread_mutex_init(&p->lock, NULL);
    pthread_cond_init(&p->wake, NULL);
    p->workers = calloc((size_t)p->num_threads, sizeof(pthread_t));
    for (int i = 0; i + 1 < p->num_threads; i++) {
        worker_args *args = malloc(sizeof(worker_args));
        if (args != NULL) *args = (worker_args){p, i + 1};
        if (args == NULL || pthread_create(&p->workers[i], NULL, worker_main, args) != 0) {
            free(args);
            p->num_threads = i + 1; /* fewer threads still compute the same results */
            break;
        }
    }
    return p;
}

void pool_destroy(pool *p) {
    if (p == NULL) return;
    pthread_mutex_lock(&p->lock);
    atomic_store(&p->stop, 1);
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->lock);
    for (int i = 0; i + 1 < p->num_threads; i++) pthread_join(p->workers[i], NULL);
    pthread_mutex_destroy(&p->lock);
    pthread_cond_destroy(&p->wake);
    free(p->workers);
    free(p);
}

int pool_size(const pool *p) { return p == NULL ? 1 : p->num_threads; }

void pool_run(pool *p, task_fn fn, void *ctx, int64_t num_items) {
    if (num_items <= 0) return;
    if (p == NULL || p->num_threads == 1 || num_items == 1) {
        for (int64_t i = 0; i < num_items; i++) fn(ctx, i, 0);
        return;
    }
    /* Every item of the previous job has finished (this function waited for them), so no
     * thread reads the slot this job writes. */
    const uint64_t generation = (atomic_load(&p->next) >> 32) + 1;
    job *j = &p->jobs[generation & 1];
    atomic_store_explicit(&j->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&j->ctx, ctx, memory_order_relaxed);
    atomic_store_explicit(&j->num_items, num_items, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store(&p->next, (generation & 0xFFFFFFFFu) << 32); /* seq_cst: publishes the job */
    if (atomic_load(&p->num_sleeping) > 0) {
        pthread_mutex_lock(&p->lock);
        pthread_cond_broadcast(&p->wake);
        pthread_mutex_unlock(&p->lock);
    }
    run_items(p, 0);
    int round = 0;
    while (atomic_load_explicit(&p->done, memory_order_acquire) < num_items) relax(++round);
}
