/* Stream-ordered allocation (cuMemAllocAsync & co.) and memory pools, as
 * the driver's pools behave where it matters for quotas (vcudasim.h):
 *
 *  - every device has a default pool; cuMemPoolCreate makes more;
 *    cuDeviceSetMemPool picks the one cuMemAllocAsync uses;
 *  - a pool reserves physical memory in chunks: a multiple of
 *    VCUDA_SIM_POOL_CHUNK (32 MiB) that fits the allocation that needed it;
 *    the reservation, not the allocations, is what the device holds;
 *  - an allocation (rounded up to 512 bytes) takes the first free extent
 *    that fits inside one chunk; freed extents merge with their free
 *    neighbours in the same chunk, never across chunks, so a pool can hold
 *    far more than it hands out (fragmentation);
 *  - freed memory stays reserved. A chunk with nothing allocated in it goes
 *    back to the device only when the pool trims: cuMemPoolTrimTo, a
 *    synchronize call (cuStreamSynchronize, cuCtxSynchronize,
 *    cuEventSynchronize: every pool of the process trims down to its
 *    CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, default 0), a growth the device
 *    cannot hold (the pool trims itself to 0 and tries once more), and
 *    cuMemPoolDestroy.
 * Frees take effect at once (no stream-ordered deferral). While a stream is
 * being captured its allocations become graph memory nodes (graph_mem.c).
 * Lock order: sim.mu, then pmu, then the shared lock. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

#define SIM_POOL_MAGIC 0x504f4f4cu
#define POOL_ALIGN 512ull

struct pool_block { /* an extent of a chunk, allocated or free */
    uint64_t off, size;
    bool used;
    struct pool_chunk *chunk;
    struct pool_block *prev, *next; /* by offset */
};

struct pool_chunk {
    struct sim_pool *pool;
    uint64_t base, size, used;
    struct pool_block *blocks;
    struct pool_chunk *next;
};

struct sim_pool {
    uint32_t magic;
    uint32_t gen; /* sim.gen at creation: a fork makes older pools invalid */
    bool alive;
    bool is_default;
    CUdevice ordinal;
    unsigned phys;
    uint64_t threshold, max_size;
    uint64_t reserved, used, reserved_high, used_high;
    int reuse[3]; /* CU_MEMPOOL_ATTR_REUSE_* (1..3): stored, no effect here */
    unsigned handle_types;
    struct pool_chunk *chunks;
    struct sim_pool *next_all;
};

static pthread_mutex_t pmu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_pool *all_pools;                    /* every pool ever made, under pmu */
static struct sim_pool *default_pool[SIM_MAX_PHYS]; /* by ordinal, made on first use */
static struct sim_pool *current_pool[SIM_MAX_PHYS]; /* NULL: the default */

static bool pool_valid(const struct sim_pool *p)
{
    return p && p->magic == SIM_POOL_MAGIC && p->alive && p->gen == sim.gen;
}

static uint64_t round_up(uint64_t v, uint64_t to)
{
    return (v + to - 1) / to * to;
}

/* Caller holds pmu. */
static struct sim_pool *pool_new(CUdevice ordinal, unsigned phys, bool is_default)
{
    struct sim_pool *p = calloc(1, sizeof *p);
    if (!p)
        return NULL;
    *p = (struct sim_pool){.magic = SIM_POOL_MAGIC, .gen = sim.gen, .alive = true,
                           .is_default = is_default, .ordinal = ordinal, .phys = phys,
                           .reuse = {1, 1, 1}, .next_all = all_pools};
    all_pools = p;
    return p;
}

/* The device's default pool (made on first use); caller holds pmu. */
static struct sim_pool *default_of(CUdevice ordinal, unsigned phys)
{
    struct sim_pool *p = default_pool[ordinal];
    if (!p || p->gen != sim.gen)
        p = default_pool[ordinal] = pool_new(ordinal, phys, true);
    return p;
}

/* Caller holds pmu. */
static struct sim_pool *current_of(CUdevice ordinal, unsigned phys)
{
    struct sim_pool *p = current_pool[ordinal];
    return pool_valid(p) ? p : default_of(ordinal, phys);
}

/* Caller holds pmu. Gives a chunk back to the device. */
static void chunk_release(struct sim_pool *p, struct pool_chunk *c)
{
    for (struct pool_chunk **pp = &p->chunks; *pp; pp = &(*pp)->next) {
        if (*pp == c) {
            *pp = c->next;
            break;
        }
    }
    for (struct pool_block *b = c->blocks, *n; b; b = n) {
        n = b->next;
        free(b);
    }
    p->reserved -= c->size;
    sim_uncharge_as(p->phys, SIM_MEM_POOL, c->size);
    free(c);
}

/* Caller holds pmu. Releases chunks with nothing allocated while the pool
 * reserves more than keep bytes. */
static void pool_trim(struct sim_pool *p, uint64_t keep)
{
    for (struct pool_chunk *c = p->chunks, *n; c && p->reserved > keep; c = n) {
        n = c->next;
        if (c->used == 0)
            chunk_release(p, c);
    }
}

/* Caller holds pmu. Splits b so that it is exactly size bytes and used. */
static void block_take(struct sim_pool *p, struct pool_block *b, uint64_t size)
{
    if (b->size > size) {
        struct pool_block *rest = calloc(1, sizeof *rest);
        if (rest) { /* without memory for the split the block stays whole: still correct */
            *rest = (struct pool_block){.off = b->off + size, .size = b->size - size,
                                        .chunk = b->chunk, .prev = b, .next = b->next};
            if (b->next)
                b->next->prev = rest;
            b->next = rest;
            b->size = size;
        }
    }
    b->used = true;
    b->chunk->used += b->size;
    p->used += b->size;
    if (p->used > p->used_high)
        p->used_high = p->used;
}

/* Caller holds pmu. A new chunk that fits size, charged to the device. */
static CUresult chunk_grow(struct sim_pool *p, uint64_t size, struct pool_block **out)
{
    uint64_t csize = round_up(size, sim.sh->pool_chunk);
    if (p->max_size && (csize > p->max_size || p->reserved > p->max_size - csize))
        return CUDA_ERROR_OUT_OF_MEMORY;
    struct pool_chunk *c = calloc(1, sizeof *c);
    struct pool_block *b = calloc(1, sizeof *b);
    if (!c || !b) {
        free(c);
        free(b);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = sim_charge_as(p->phys, SIM_MEM_POOL, csize);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY) { /* the pool's own free chunks first */
        pool_trim(p, 0);
        rc = sim_charge_as(p->phys, SIM_MEM_POOL, csize);
    }
    if (rc != CUDA_SUCCESS) {
        free(c);
        free(b);
        return rc;
    }
    *b = (struct pool_block){.size = csize, .chunk = c};
    *c = (struct pool_chunk){.pool = p, .base = sim_new_address(csize, 0), .size = csize,
                             .blocks = b};
    /* Appended: first fit looks at older chunks first, as they fill up. */
    struct pool_chunk **pp = &p->chunks;
    while (*pp)
        pp = &(*pp)->next;
    *pp = c;
    p->reserved += csize;
    if (p->reserved > p->reserved_high)
        p->reserved_high = p->reserved;
    *out = b;
    return CUDA_SUCCESS;
}

static CUresult pool_alloc(struct sim_pool *p, uint64_t bytes, struct sim_ctx *ctx,
                           CUdeviceptr *dptr)
{
    uint64_t size = round_up(bytes, POOL_ALIGN);
    struct pool_block *b = NULL;
    CUresult rc = CUDA_SUCCESS;
    pthread_mutex_lock(&pmu);
    for (struct pool_chunk *c = p->chunks; c && !b; c = c->next)
        for (struct pool_block *k = c->blocks; k && !b; k = k->next)
            if (!k->used && k->size >= size)
                b = k;
    if (!b)
        rc = chunk_grow(p, size, &b);
    CUdeviceptr addr = 0;
    if (rc == CUDA_SUCCESS) {
        block_take(p, b, size);
        addr = b->chunk->base + b->off;
    }
    pthread_mutex_unlock(&pmu);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_alloc_record_owned(addr, 0, ctx, SIM_ALLOC_POOL, b);
    if (rc != CUDA_SUCCESS) {
        sim_pool_block_free(b);
        return rc;
    }
    *dptr = addr;
    return CUDA_SUCCESS;
}

void sim_pool_block_free(void *block)
{
    struct pool_block *b = block;
    pthread_mutex_lock(&pmu);
    struct pool_chunk *c = b->chunk;
    struct sim_pool *p = c->pool;
    b->used = false;
    c->used -= b->size;
    p->used -= b->size;
    /* Merge with free neighbours inside the chunk (never across chunks). */
    if (b->next && !b->next->used) {
        struct pool_block *n = b->next;
        b->size += n->size;
        b->next = n->next;
        if (n->next)
            n->next->prev = b;
        free(n);
    }
    if (b->prev && !b->prev->used) {
        struct pool_block *q = b->prev;
        q->size += b->size;
        q->next = b->next;
        if (b->next)
            b->next->prev = q;
        free(b);
    }
    if (!p->alive && c->used == 0) /* a destroyed pool lets go as its blocks come back */
        chunk_release(p, c);
    pthread_mutex_unlock(&pmu);
}

void sim_pools_release_on_sync(void)
{
    pthread_mutex_lock(&pmu);
    for (struct sim_pool *p = all_pools; p; p = p->next_all)
        if (pool_valid(p) && p->reserved > p->threshold)
            pool_trim(p, p->threshold);
    pthread_mutex_unlock(&pmu);
}

/* ---- stream-ordered allocation ---- */

static CUresult alloc_async(CUdeviceptr *dptr, size_t bytes, struct sim_pool *pool,
                            CUstream hStream, bool ptsz)
{
    struct sim_stream *s;
    struct sim_ctx *c;
    if (!dptr || bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = sim_stream_resolve(hStream, ptsz, &s)) != CUDA_SUCCESS)
        return rc;
    if (s->ctx)
        c = s->ctx;
    pthread_mutex_lock(&pmu);
    if (pool && (!pool_valid(pool) || pool->ordinal != c->ordinal))
        rc = CUDA_ERROR_INVALID_VALUE;
    else if (!pool && !(pool = current_of(c->ordinal, c->phys)))
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_unlock(&pmu);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    bool capturing = s->capture != NULL;
    if (capturing) /* a graph memory node, mapped when the graph runs */
        rc = sim_graph_mem_capture_alloc(s->capture, c, bytes, dptr);
    pthread_mutex_unlock(&sim.mu);
    return capturing ? rc : pool_alloc(pool, bytes, c, dptr);
}

SIM_EXPORT CUresult cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, false);
}

SIM_EXPORT CUresult cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream hStream)
{
    return alloc_async(dptr, bytesize, NULL, hStream, true);
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize,
                                            CUmemoryPool pool, CUstream hStream)
{
    return pool ? alloc_async(dptr, bytesize, (struct sim_pool *)pool, hStream, false)
                : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize,
                                                 CUmemoryPool pool, CUstream hStream)
{
    return pool ? alloc_async(dptr, bytesize, (struct sim_pool *)pool, hStream, true)
                : CUDA_ERROR_INVALID_VALUE;
}

static CUresult free_async(CUdeviceptr dptr, CUstream hStream, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = sim_stream_resolve(hStream, ptsz, &s)) != CUDA_SUCCESS)
        return rc;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim.mu);
    bool capturing = s->capture != NULL;
    if (capturing) /* a graph memory free node */
        rc = sim_graph_mem_capture_free(s->capture, dptr);
    pthread_mutex_unlock(&sim.mu);
    return capturing ? rc : sim_free_pointer(dptr);
}

SIM_EXPORT CUresult cuMemFreeAsync(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, false);
}

SIM_EXPORT CUresult cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream hStream)
{
    return free_async(dptr, hStream, true);
}

/* ---- pools ---- */

static CUresult get_pool(CUmemoryPool *pool_out, CUdevice dev, bool current)
{
    unsigned phys;
    if (!pool_out)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&pmu);
    struct sim_pool *p = current ? current_of(dev, phys) : default_of(dev, phys);
    pthread_mutex_unlock(&pmu);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool_out = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetDefaultMemPool(CUmemoryPool *pool_out, CUdevice dev)
{
    return get_pool(pool_out, dev, false);
}

SIM_EXPORT CUresult cuDeviceGetMemPool(CUmemoryPool *pool, CUdevice dev)
{
    return get_pool(pool, dev, true);
}

SIM_EXPORT CUresult cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool)
{
    unsigned phys;
    struct sim_pool *p = (struct sim_pool *)pool;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&pmu);
    if (!pool_valid(p) || p->ordinal != dev)
        rc = CUDA_ERROR_INVALID_VALUE;
    else
        current_pool[dev] = p;
    pthread_mutex_unlock(&pmu);
    return rc;
}

SIM_EXPORT CUresult cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *poolProps)
{
    unsigned phys;
    if (!pool || !poolProps || poolProps->allocType != CU_MEM_ALLOCATION_TYPE_PINNED ||
        poolProps->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(poolProps->location.id, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&pmu);
    struct sim_pool *p = pool_new(poolProps->location.id, phys, false);
    if (p) {
        p->handle_types = (unsigned)poolProps->handleTypes;
        p->max_size = poolProps->maxSize;
    }
    pthread_mutex_unlock(&pmu);
    if (!p)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *pool = (CUmemoryPool)p;
    return CUDA_SUCCESS;
}

/* Memory still allocated from the pool stays valid; the pool lets its
 * chunks go as they empty. The device's current pool becomes its default. */
SIM_EXPORT CUresult cuMemPoolDestroy(CUmemoryPool pool)
{
    struct sim_pool *p = (struct sim_pool *)pool;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&pmu);
    if (!pool_valid(p) || p->is_default) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        p->alive = false; /* kept allocated: see the handle note in sim.h */
        pool_trim(p, 0);
        if (current_pool[p->ordinal] == p)
            current_pool[p->ordinal] = NULL;
    }
    pthread_mutex_unlock(&pmu);
    return rc;
}

SIM_EXPORT CUresult cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep)
{
    struct sim_pool *p = (struct sim_pool *)pool;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&pmu);
    if (pool_valid(p))
        pool_trim(p, minBytesToKeep);
    else
        rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pmu);
    return rc;
}

/* A high-water mark can only be reset, to the current value, by writing 0. */
static CUresult reset_high(uint64_t *high, uint64_t current, const void *value)
{
    if (*(const cuuint64_t *)value != 0)
        return CUDA_ERROR_INVALID_VALUE;
    *high = current;
    return CUDA_SUCCESS;
}

/* Caller holds pmu; p is valid. */
static CUresult attribute(struct sim_pool *p, CUmemPool_attribute attr, void *value, bool set)
{
    switch (attr) {
    case CU_MEMPOOL_ATTR_REUSE_FOLLOW_EVENT_DEPENDENCIES:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_OPPORTUNISTIC:
    case CU_MEMPOOL_ATTR_REUSE_ALLOW_INTERNAL_DEPENDENCIES:
        if (set)
            p->reuse[attr - 1] = *(int *)value != 0;
        else
            *(int *)value = p->reuse[attr - 1];
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RELEASE_THRESHOLD:
        if (set)
            p->threshold = *(cuuint64_t *)value;
        else
            *(cuuint64_t *)value = p->threshold;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_HIGH:
        if (set)
            return reset_high(&p->reserved_high, p->reserved, value);
        *(cuuint64_t *)value = p->reserved_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_USED_MEM_HIGH:
        if (set)
            return reset_high(&p->used_high, p->used, value);
        *(cuuint64_t *)value = p->used_high;
        return CUDA_SUCCESS;
    case CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT:
    case CU_MEMPOOL_ATTR_USED_MEM_CURRENT:
        if (set)
            return CUDA_ERROR_INVALID_VALUE; /* read only */
        *(cuuint64_t *)value = attr == CU_MEMPOOL_ATTR_USED_MEM_CURRENT ? p->used : p->reserved;
        return CUDA_SUCCESS;
    default:
        return CUDA_ERROR_INVALID_VALUE;
    }
}

static CUresult pool_attribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value, bool set)
{
    struct sim_pool *p = (struct sim_pool *)pool;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!value)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&pmu);
    rc = pool_valid(p) ? attribute(p, attr, value, set) : CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_unlock(&pmu);
    return rc;
}

SIM_EXPORT CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, false);
}

SIM_EXPORT CUresult cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value)
{
    return pool_attribute(pool, attr, value, true);
}
