#include "alloc_map.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#define SHARD_BITS 6
#define SHARDS (1u << SHARD_BITS)
#define TOMBSTONE 0xff

struct shard {
    _Alignas(64) pthread_mutex_t lock; /* one cache line per shard */
    struct vcuda_alloc *slots; /* kind 0: empty, TOMBSTONE: deleted */
    uint32_t capacity;         /* power of two or 0 */
    uint32_t count;
    uint32_t dead;
};

static struct shard shards[SHARDS] = {[0 ... SHARDS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};

static inline uint64_t hash(uint8_t kind, uint64_t key) {
    uint64_t h = (key ^ ((uint64_t)kind << 56)) * 0x9E3779B97F4A7C15ull;
    return h ^ (h >> 29);
}

static inline struct shard *shard_of(uint64_t h) { return &shards[h >> (64 - SHARD_BITS)]; }

static bool grow(struct shard *s) {
    uint32_t cap = s->capacity ? s->capacity : 32;
    while (cap < (s->count + 1) * 4) cap *= 2;
    struct vcuda_alloc *slots = calloc(cap, sizeof *slots);
    if (slots == NULL) return false;
    for (uint32_t i = 0; i < s->capacity; i++) {
        struct vcuda_alloc *a = &s->slots[i];
        if (a->kind == 0 || a->kind == TOMBSTONE) continue;
        uint32_t j = (uint32_t)hash(a->kind, a->key) & (cap - 1);
        while (slots[j].kind != 0) j = (j + 1) & (cap - 1);
        slots[j] = *a;
    }
    free(s->slots);
    s->slots = slots;
    s->capacity = cap;
    s->dead = 0;
    return true;
}

bool vcuda_alloc_insert(const struct vcuda_alloc *alloc) {
    uint64_t h = hash(alloc->kind, alloc->key);
    struct shard *s = shard_of(h);
    pthread_mutex_lock(&s->lock);
    bool ok = true;
    if ((s->count + s->dead + 1) * 2 > s->capacity) ok = grow(s);
    if (ok) {
        uint32_t mask = s->capacity - 1;
        uint32_t i = (uint32_t)h & mask;
        /* The driver never hands out a live key twice, so no duplicate check. */
        while (s->slots[i].kind != 0 && s->slots[i].kind != TOMBSTONE) i = (i + 1) & mask;
        if (s->slots[i].kind == TOMBSTONE) s->dead--;
        s->slots[i] = *alloc;
        s->count++;
    }
    pthread_mutex_unlock(&s->lock);
    return ok;
}

bool vcuda_alloc_take(uint8_t kind, uint64_t key, struct vcuda_alloc *out) {
    uint64_t h = hash(kind, key);
    struct shard *s = shard_of(h);
    bool found = false;
    pthread_mutex_lock(&s->lock);
    if (s->capacity) {
        uint32_t mask = s->capacity - 1;
        for (uint32_t i = (uint32_t)h & mask; s->slots[i].kind != 0; i = (i + 1) & mask) {
            struct vcuda_alloc *a = &s->slots[i];
            if (a->kind == kind && a->key == key) {
                *out = *a;
                a->kind = TOMBSTONE;
                s->count--;
                s->dead++;
                found = true;
                break;
            }
        }
    }
    pthread_mutex_unlock(&s->lock);
    return found;
}

void vcuda_alloc_take_context(void *ctx, void (*fn)(const struct vcuda_alloc *, void *), void *arg) {
    for (unsigned n = 0; n < SHARDS; n++) {
        struct shard *s = &shards[n];
        pthread_mutex_lock(&s->lock);
        for (uint32_t i = 0; i < s->capacity; i++) {
            struct vcuda_alloc *a = &s->slots[i];
            if (a->kind == 0 || a->kind == TOMBSTONE || a->ctx != ctx) continue;
            fn(a, arg);
            a->kind = TOMBSTONE;
            s->count--;
            s->dead++;
        }
        pthread_mutex_unlock(&s->lock);
    }
}

void vcuda_alloc_reset_after_fork(void) {
    /* Another thread of the parent may have held a shard lock at fork time:
     * re-create the locks instead of unlocking them. The child owns none of
     * the parent's allocations. */
    for (unsigned n = 0; n < SHARDS; n++) {
        struct shard *s = &shards[n];
        pthread_mutex_init(&s->lock, NULL);
        free(s->slots);
        s->slots = NULL;
        s->capacity = s->count = s->dead = 0;
    }
}
