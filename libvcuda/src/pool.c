/* Stream-ordered allocation charged by what the pools reserve (DESIGN.md
 * "Memory"; issue 12).
 *
 * The device holds what a pool reserves (CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT),
 * not what it hands out: freed blocks stay reserved up to the pool's release
 * threshold, and a fragmented pool grows although its free bytes add up to
 * more than the request. So a pool's charge in the ledger follows its
 * reservation, never the pointers:
 *
 *  - Before an allocation of n bytes the charge must cover the reservation,
 *    the allowances of allocations in flight in other threads, and this one's
 *    allowance: the most one allocation can grow a pool, n rounded up to
 *    POOL_GROWTH. What is missing is charged first; if it does not fit (after
 *    trim before deny) the allocation fails with CUDA_ERROR_OUT_OF_MEMORY and
 *    the driver is never called.
 *  - After it the reservation is read back and the charge trued to it, plus
 *    one growth unit of headroom kept while the pool reserves anything, so the
 *    next small allocation needs no ledger update.
 *  - Frees change nothing. The reservation is read again where the pool may
 *    have released memory: cuMemPoolTrimTo, a release-threshold change, a
 *    synchronize call (only for pools reserving more than their threshold),
 *    pool destruction, context teardown.
 *
 * The pools tracked: each device's default and current pool (cuDeviceSetMemPool),
 * and every cuMemPoolCreate pool located on a device (host pools hold no
 * device memory). Allocations made while their stream is being captured are
 * graph memory (graph_mem.c), not pool growth.
 *
 * Cost budget, cuMemAllocAsync + cuMemFreeAsync while the pool has headroom,
 * beyond the driver: the stream's device (as for every allocation), two
 * uncontended pool locks and one attribute read after the allocation; the free
 * is one relaxed load and a branch. About 50 ns for the pair on the simulator
 * (bench/shim_bench.py; the goal is 300). */
#include "pool.h"

#include <pthread.h>
#include <sched.h>
#include <stdbool.h>

#include "compute.h"
#include "config.h"
#include "graph_mem.h"
#include "log.h"
#include "process.h"
#include "quota.h"
#include "real_driver.h"

/* The most one allocation of n bytes can grow a pool: n rounded up to this.
 * Pools reserve physical memory in chunks of 32 MiB by default (public
 * reports); to verify on hardware. */
#define POOL_GROWTH (32ull << 20)
#define MAX_POOLS 256

struct pool {
    _Atomic(CUmemoryPool) handle; /* NULL: free entry */
    pthread_mutex_t lock;         /* guards everything below */
    CUdevice ordinal;
    int dev;          /* ledger device */
    bool zombie;      /* destroyed with allocations outstanding: keeps its charge */
    bool releasable;  /* reserves more than its threshold: a synchronize may shrink it */
    uint64_t threshold;
    uint64_t reserved; /* last reservation read */
    uint64_t inflight; /* allowances of allocations under way */
    uint64_t charged;  /* what the ledger holds for this pool */
};

static struct pool pools[MAX_POOLS] = {[0 ... MAX_POOLS - 1] = {.lock = PTHREAD_MUTEX_INITIALIZER}};
static _Atomic int pool_high; /* entries [0, high) may be in use */
static pthread_mutex_t registry_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic(struct pool *) current_pools[VCUDA_MAX_DEVICES]; /* by ordinal; NULL: not asked yet */
static _Atomic int releasable_pools;

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

static void warn_once(_Atomic int *flag, const char *what) {
    if (atomic_exchange(flag, 1) == 0) vcuda_warn("%s", what);
}

/* A reservation the driver will not report: its upper bound, said once. */
static void warn_unreported(void) {
    static _Atomic int warned;
    warn_once(&warned, "the driver does not report a memory pool's reservation; charging each allocation's "
                       "largest possible growth, and never less than that");
}

/* A cuuint64_t attribute of pool h; false when the driver will not tell. */
static bool pool_attr(CUmemoryPool h, CUmemPool_attribute attr, uint64_t *out) {
    cuuint64_t v = 0;
    if (vcuda_real.cuMemPoolGetAttribute == NULL || vcuda_real.cuMemPoolGetAttribute(h, attr, &v) != CUDA_SUCCESS)
        return false;
    *out = v;
    return true;
}

/* Caller holds p->lock. */
static void update_releasable(struct pool *p) {
    bool releasable = !p->zombie && p->reserved > p->threshold;
    if (releasable == p->releasable) return;
    p->releasable = releasable;
    atomic_fetch_add(&releasable_pools, releasable ? 1 : -1);
}

/* Trues p's charge down to its reservation and in-flight allowances, keeping
 * up to `headroom` more while it reserves anything. Caller holds p->lock.
 * Returns the bytes given back.
 *
 * Allowances were charged before their allocations, so the charge covers the
 * reservation read whatever has grown meanwhile; reservation + allowances
 * can exceed it only by counting twice a growth that is read already but
 * whose allocation has not settled yet. Only a reservation beyond the charge
 * itself is more than the allowances foresaw. */
static uint64_t settle(struct pool *p, uint64_t headroom) {
    static _Atomic int warned;
    if (p->charged < p->reserved) {
        warn_once(&warned, "a memory pool grew beyond the allowance vcuda charged before the allocation; "
                           "charging what it holds");
        vcuda_quota_force(p->dev, p->reserved - p->charged);
        p->charged = p->reserved;
    }
    uint64_t keep = p->reserved + p->inflight + (p->reserved ? headroom : 0), given = 0;
    if (p->charged > keep) {
        given = p->charged - keep;
        vcuda_quota_give(p->dev, given);
        p->charged = keep;
    }
    update_releasable(p);
    return given;
}

/* Reads p's reservation again and trues its charge. Caller holds p->lock. */
static uint64_t refresh_locked(struct pool *p, uint64_t headroom) {
    if (p->zombie) return 0;
    uint64_t reserved;
    if (pool_attr(atomic_load(&p->handle), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved))
        p->reserved = reserved;
    else /* keep the last figure: a charge never drops on a guess */
        warn_unreported();
    return settle(p, headroom);
}

/* ---- the registry ---------------------------------------------------------- */

static struct pool *find(CUmemoryPool h) {
    int high = atomic_load_explicit(&pool_high, memory_order_acquire);
    for (int i = 0; i < high; i++)
        if (atomic_load_explicit(&pools[i].handle, memory_order_acquire) == h) return &pools[i];
    return NULL;
}

/* Registers pool h of device `ordinal`; NULL when the table is full. */
static struct pool *add(CUmemoryPool h, CUdevice ordinal, int dev) {
    pthread_mutex_lock(&registry_lock);
    struct pool *p = find(h);
    int high = atomic_load(&pool_high);
    for (int i = 0; p == NULL && i < MAX_POOLS; i++) {
        if (i < high && atomic_load(&pools[i].handle) != NULL) continue;
        p = &pools[i];
        pthread_mutex_lock(&p->lock);
        p->ordinal = ordinal;
        p->dev = dev;
        p->zombie = p->releasable = false;
        p->inflight = p->charged = 0;
        if (!pool_attr(h, CU_MEMPOOL_ATTR_RELEASE_THRESHOLD, &p->threshold)) p->threshold = 0;
        if (!pool_attr(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &p->reserved)) p->reserved = 0;
        atomic_store_explicit(&p->handle, h, memory_order_release);
        if (i >= high) atomic_store_explicit(&pool_high, i + 1, memory_order_release);
        settle(p, 0); /* whatever it held before we met it */
        pthread_mutex_unlock(&p->lock);
    }
    pthread_mutex_unlock(&registry_lock);
    if (p == NULL) vcuda_warn("more than %d memory pools; allocations from another one are refused", MAX_POOLS);
    return p;
}

/* Gives entry p back (its pool is gone and charges nothing). Caller holds p->lock. */
static void forget_locked(struct pool *p) {
    p->reserved = p->inflight = 0;
    settle(p, 0);
    for (int d = 0; d < VCUDA_MAX_DEVICES; d++) {
        struct pool *expected = p;
        atomic_compare_exchange_strong(&current_pools[d], &expected, NULL);
    }
    atomic_store_explicit(&p->handle, NULL, memory_order_release);
}

/* The device whose default or current pool h is. */
static bool identify(CUmemoryPool h, CUdevice *ordinal) {
    for (CUdevice d = 0; d < VCUDA_MAX_DEVICES; d++) {
        CUmemoryPool q = NULL;
        if (vcuda_real.cuDeviceGetDefaultMemPool == NULL || vcuda_real.cuDeviceGetDefaultMemPool(&q, d) != CUDA_SUCCESS)
            return false; /* past the last device */
        if (q == h || (vcuda_real.cuDeviceGetMemPool && vcuda_real.cuDeviceGetMemPool(&q, d) == CUDA_SUCCESS && q == h)) {
            *ordinal = d;
            return true;
        }
    }
    return false;
}

/* The record of pool h, registered when this process meets it first. */
static struct pool *pool_of(CUmemoryPool h, CUdevice stream_ordinal) {
    static _Atomic int warned;
    struct pool *p = find(h);
    if (p) return p;
    CUdevice ordinal = stream_ordinal;
    if (!identify(h, &ordinal))
        warn_once(&warned, "allocation from a memory pool vcuda did not see created: charged to the stream's device");
    uint64_t limit;
    CUresult rc;
    int dev = vcuda_device_index(ordinal, &limit, &rc);
    return dev < 0 ? NULL : add(h, ordinal, dev);
}

/* The pool cuMemAllocAsync uses on device `ordinal`. */
static struct pool *current_pool(CUdevice ordinal) {
    struct pool *p = atomic_load_explicit(&current_pools[ordinal], memory_order_acquire);
    if (p) return p;
    CUmemoryPool h;
    if (vcuda_real.cuDeviceGetMemPool == NULL || vcuda_real.cuDeviceGetMemPool(&h, ordinal) != CUDA_SUCCESS)
        return NULL;
    p = pool_of(h, ordinal);
    struct pool *expected = NULL;
    /* A concurrent cuDeviceSetMemPool wins. */
    if (p && !atomic_compare_exchange_strong(&current_pools[ordinal], &expected, p)) p = expected;
    return p;
}

/* ---- charging an allocation ------------------------------------------------ */

/* What p's charge lacks to cover its reservation and allowances. Caller holds p->lock. */
static uint64_t shortfall(const void *owner) {
    const struct pool *p = owner;
    uint64_t need = p->reserved + p->inflight;
    return need > p->charged ? need - p->charged : 0;
}

/* Trim before deny, this pool first. Caller holds p->lock. */
static void trim_own(void *owner) {
    struct pool *p = owner;
    CUmemoryPool h = atomic_load(&p->handle);
    uint64_t reserved;
    if (p->reserved && vcuda_real.cuMemPoolTrimTo && vcuda_real.cuMemPoolTrimTo(h, 0) == CUDA_SUCCESS &&
        pool_attr(h, CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved))
        p->reserved = reserved;
}

/* Books an allowance of `grow` for one allocation from p and charges what p then lacks. */
static CUresult claim(struct pool *p, uint64_t grow, uint64_t limit) {
    pthread_mutex_lock(&p->lock);
    p->inflight += grow;
    uint64_t charged;
    bool ok = vcuda_quota_cover(p->dev, limit, p, shortfall, trim_own, &charged);
    if (ok) p->charged += charged;
    else p->inflight -= grow;
    pthread_mutex_unlock(&p->lock);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
}

static void after_alloc(struct pool *p, uint64_t grow) {
    pthread_mutex_lock(&p->lock);
    p->inflight -= grow;
    uint64_t reserved;
    if (pool_attr(atomic_load(&p->handle), CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT, &reserved)) {
        p->reserved = reserved;
    } else { /* the conservative upper bound: the whole allowance became reservation */
        warn_unreported();
        p->reserved += grow;
    }
    settle(p, POOL_GROWTH);
    pthread_mutex_unlock(&p->lock);
}

typedef CUresult (*alloc_async_fn)(CUdeviceptr *, size_t, CUstream);
typedef CUresult (*alloc_pool_fn)(CUdeviceptr *, size_t, CUmemoryPool, CUstream);
typedef CUresult (*free_async_fn)(CUdeviceptr, CUstream);

/* One stream-ordered allocation entry point: from the current pool (`from`
 * NULL) or from pool `pool`. */
struct async_alloc {
    alloc_async_fn current;
    alloc_pool_fn from;
    CUmemoryPool pool;
    bool ptsz;
};

static CUresult call(const struct async_alloc *a, CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    return a->from ? a->from(dptr, bytes, a->pool, stream) : a->current(dptr, bytes, stream);
}

static CUresult alloc_async(const struct async_alloc *a, CUdeviceptr *dptr, size_t bytes, CUstream stream) {
    if (vcuda_config.disabled || dptr == NULL || bytes == 0) return call(a, dptr, bytes, stream);
    CUresult rc = vcuda_process_ready();
    if (rc != CUDA_SUCCESS) return rc;
    CUcontext ctx;
    CUdevice ordinal;
    uint64_t limit;
    if (vcuda_stream_device(stream, &ctx, &ordinal) != CUDA_SUCCESS ||
        vcuda_device_index(ordinal, &limit, &rc) < 0)
        return call(a, dptr, bytes, stream); /* the driver reports the bad argument */
    if (vcuda_graph_mem_capturing(stream, a->ptsz)) {
        rc = call(a, dptr, bytes, stream);
        if (rc == CUDA_SUCCESS) vcuda_graph_mem_captured_alloc(stream, a->ptsz, *dptr, bytes);
        return rc;
    }
    struct pool *p = a->from ? pool_of(a->pool, ordinal) : current_pool(ordinal);
    if (p == NULL) return CUDA_ERROR_OUT_OF_MEMORY; /* a pool we cannot charge stays unused */
    if (p->ordinal != ordinal && vcuda_device_index(p->ordinal, &limit, &rc) < 0) return rc;
    uint64_t grow = round_up(bytes, POOL_GROWTH);
    if (claim(p, grow, limit) != CUDA_SUCCESS) {
        vcuda_info("stream-ordered allocation of %llu bytes on device %d refused: the pool may grow by %llu "
                   "bytes, over the quota of %llu bytes",
                   (unsigned long long)bytes, p->ordinal, (unsigned long long)grow, (unsigned long long)limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    rc = call(a, dptr, bytes, stream);
    after_alloc(p, grow);
    return rc;
}

static CUresult free_async(free_async_fn real, CUdeviceptr dptr, CUstream stream, bool ptsz) {
    /* Outside a capture a free changes nothing the device holds. */
    bool captured = !vcuda_config.disabled && vcuda_graph_mem_capturing(stream, ptsz);
    CUresult rc = real(dptr, stream);
    if (captured && rc == CUDA_SUCCESS) vcuda_graph_mem_captured_free(stream, ptsz, dptr);
    return rc;
}

CUresult vc_cuMemAllocAsync(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocAsync, "cuMemAllocAsync");
    struct async_alloc a = {.current = vcuda_real.cuMemAllocAsync};
    return rc != CUDA_SUCCESS ? rc : alloc_async(&a, dptr, bytesize, stream);
}

CUresult vc_cuMemAllocAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocAsync_ptsz, "cuMemAllocAsync_ptsz");
    struct async_alloc a = {.current = vcuda_real.cuMemAllocAsync_ptsz, .ptsz = true};
    return rc != CUDA_SUCCESS ? rc : alloc_async(&a, dptr, bytesize, stream);
}

CUresult vc_cuMemAllocFromPoolAsync(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocFromPoolAsync, "cuMemAllocFromPoolAsync");
    struct async_alloc a = {.from = vcuda_real.cuMemAllocFromPoolAsync, .pool = pool};
    if (rc != CUDA_SUCCESS) return rc;
    return pool ? alloc_async(&a, dptr, bytesize, stream) : call(&a, dptr, bytesize, stream);
}

CUresult vc_cuMemAllocFromPoolAsync_ptsz(CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool,
                                         CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocFromPoolAsync_ptsz,
                                   "cuMemAllocFromPoolAsync_ptsz");
    struct async_alloc a = {.from = vcuda_real.cuMemAllocFromPoolAsync_ptsz, .pool = pool, .ptsz = true};
    if (rc != CUDA_SUCCESS) return rc;
    return pool ? alloc_async(&a, dptr, bytesize, stream) : call(&a, dptr, bytesize, stream);
}

CUresult vc_cuMemFreeAsync(CUdeviceptr dptr, CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemFreeAsync, "cuMemFreeAsync");
    return rc != CUDA_SUCCESS ? rc : free_async(vcuda_real.cuMemFreeAsync, dptr, stream, false);
}

CUresult vc_cuMemFreeAsync_ptsz(CUdeviceptr dptr, CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemFreeAsync_ptsz, "cuMemFreeAsync_ptsz");
    return rc != CUDA_SUCCESS ? rc : free_async(vcuda_real.cuMemFreeAsync_ptsz, dptr, stream, true);
}

/* ---- pool lifetime and settings -------------------------------------------- */

CUresult vc_cuMemPoolCreate(CUmemoryPool *pool, const CUmemPoolProps *props) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemPoolCreate, "cuMemPoolCreate");
    if (rc != CUDA_SUCCESS) return rc;
    /* Host-located pools hold no device memory. */
    if (vcuda_config.disabled || pool == NULL || props == NULL || props->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vcuda_real.cuMemPoolCreate(pool, props);
    rc = vcuda_process_ready();
    if (rc == CUDA_SUCCESS) rc = vcuda_device_admit(props->location.id); /* names a device, not a context */
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t limit;
    int dev = vcuda_device_index(props->location.id, &limit, &rc);
    rc = vcuda_real.cuMemPoolCreate(pool, props);
    if (rc != CUDA_SUCCESS || dev < 0) return rc;
    if (add(*pool, props->location.id, dev) == NULL) { /* fail closed: a pool we cannot charge must not exist */
        if (vcuda_real.cuMemPoolDestroy) vcuda_real.cuMemPoolDestroy(*pool);
        *pool = NULL;
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    return CUDA_SUCCESS;
}

CUresult vc_cuMemPoolDestroy(CUmemoryPool pool) {
    static _Atomic int warned;
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemPoolDestroy, "cuMemPoolDestroy");
    if (rc != CUDA_SUCCESS) return rc;
    struct pool *p = vcuda_config.disabled ? NULL : find(pool);
    if (p == NULL) return vcuda_real.cuMemPoolDestroy(pool);
    pthread_mutex_lock(&p->lock);
    uint64_t used = 0;
    /* Unknown use counts as use: the pool then keeps its charge. */
    bool idle = pool_attr(pool, CU_MEMPOOL_ATTR_USED_MEM_CURRENT, &used) && used == 0;
    rc = vcuda_real.cuMemPoolDestroy(pool);
    if (rc == CUDA_SUCCESS) {
        if (idle) {
            forget_locked(p);
        } else {
            /* Its memory goes back as its allocations are freed, which the
             * driver no longer tells about: keep charging the last reservation. */
            warn_once(&warned, "a memory pool destroyed with allocations outstanding stays charged until "
                               "the process exits");
            p->zombie = true;
            update_releasable(p);
        }
    }
    pthread_mutex_unlock(&p->lock);
    return rc;
}

CUresult vc_cuMemPoolTrimTo(CUmemoryPool pool, size_t minBytesToKeep) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemPoolTrimTo, "cuMemPoolTrimTo");
    if (rc != CUDA_SUCCESS) return rc;
    struct pool *p = vcuda_config.disabled ? NULL : find(pool);
    if (p) pthread_mutex_lock(&p->lock);
    rc = vcuda_real.cuMemPoolTrimTo(pool, minBytesToKeep);
    if (p) {
        if (rc == CUDA_SUCCESS) refresh_locked(p, 0); /* asked to give back: no headroom kept */
        pthread_mutex_unlock(&p->lock);
    }
    return rc;
}

CUresult vc_cuMemPoolSetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemPoolSetAttribute, "cuMemPoolSetAttribute");
    if (rc != CUDA_SUCCESS) return rc;
    struct pool *p = vcuda_config.disabled || attr != CU_MEMPOOL_ATTR_RELEASE_THRESHOLD ? NULL : find(pool);
    if (p) pthread_mutex_lock(&p->lock);
    rc = vcuda_real.cuMemPoolSetAttribute(pool, attr, value);
    if (p) {
        if (rc == CUDA_SUCCESS) {
            p->threshold = *(const cuuint64_t *)value;
            refresh_locked(p, POOL_GROWTH);
        }
        pthread_mutex_unlock(&p->lock);
    }
    return rc;
}

CUresult vc_cuDeviceSetMemPool(CUdevice dev, CUmemoryPool pool) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuDeviceSetMemPool, "cuDeviceSetMemPool");
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) rc = vcuda_device_admit(dev); /* only this container's GPUs */
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuDeviceSetMemPool(dev, pool);
    if (rc != CUDA_SUCCESS || vcuda_config.disabled || dev < 0 || dev >= VCUDA_MAX_DEVICES ||
        vcuda_process_ready() != CUDA_SUCCESS)
        return rc;
    /* NULL: asked again at the next allocation. */
    atomic_store_explicit(&current_pools[dev], pool_of(pool, dev), memory_order_release);
    return rc;
}

/* ---- where pools release memory ------------------------------------------- */

/* Locks p unless another thread holds it for long; trim before deny skips a
 * pool it cannot have, rather than wait on a thread that may wait on us. */
static bool lock_briefly(struct pool *p) {
    for (int tries = 0; tries < 64; tries++) {
        if (pthread_mutex_trylock(&p->lock) == 0) return true;
        sched_yield();
    }
    return false;
}

uint64_t vcuda_pools_trim(int dev) {
    uint64_t given = 0;
    int high = atomic_load_explicit(&pool_high, memory_order_acquire);
    for (int i = 0; i < high; i++) {
        struct pool *p = &pools[i];
        CUmemoryPool h = atomic_load_explicit(&p->handle, memory_order_acquire);
        if (h == NULL || p == vcuda_quota_covering || !lock_briefly(p)) continue;
        if (atomic_load(&p->handle) == h && p->dev == dev && !p->zombie && p->reserved > 0 &&
            vcuda_real.cuMemPoolTrimTo && vcuda_real.cuMemPoolTrimTo(h, 0) == CUDA_SUCCESS)
            given += refresh_locked(p, 0);
        pthread_mutex_unlock(&p->lock);
    }
    return given;
}

/* Every pool reserving more than its threshold is read again (`ordinal` -1),
 * or every pool of one device. */
static void refresh_pools(CUdevice ordinal, uint64_t headroom) {
    int high = atomic_load_explicit(&pool_high, memory_order_acquire);
    for (int i = 0; i < high; i++) {
        struct pool *p = &pools[i];
        if (atomic_load_explicit(&p->handle, memory_order_acquire) == NULL) continue;
        pthread_mutex_lock(&p->lock);
        if (atomic_load(&p->handle) != NULL && (ordinal < 0 ? p->releasable : p->ordinal == ordinal))
            refresh_locked(p, headroom);
        pthread_mutex_unlock(&p->lock);
    }
}

void vcuda_pools_refresh_device(CUdevice ordinal) { refresh_pools(ordinal, 0); }

/* A synchronize call returned `rc`: the token client may find the process
 * quiet (compute.c), and pools above their release threshold give memory back. */
static CUresult after_sync(CUresult rc) {
    if (rc == CUDA_SUCCESS) vcuda_compute_synchronized();
    if (rc == CUDA_SUCCESS && atomic_load_explicit(&releasable_pools, memory_order_relaxed) > 0 &&
        !vcuda_config.disabled)
        refresh_pools(-1, POOL_GROWTH);
    return rc;
}

CUresult vc_cuStreamSynchronize(CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamSynchronize, "cuStreamSynchronize");
    return rc != CUDA_SUCCESS ? rc : after_sync(vcuda_real.cuStreamSynchronize(stream));
}

CUresult vc_cuStreamSynchronize_ptsz(CUstream stream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamSynchronize_ptsz, "cuStreamSynchronize_ptsz");
    return rc != CUDA_SUCCESS ? rc : after_sync(vcuda_real.cuStreamSynchronize_ptsz(stream));
}

CUresult vc_cuCtxSynchronize(void) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxSynchronize, "cuCtxSynchronize");
    return rc != CUDA_SUCCESS ? rc : after_sync(vcuda_real.cuCtxSynchronize());
}

CUresult vc_cuCtxSynchronize_v2(CUcontext ctx) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxSynchronize_v2, "cuCtxSynchronize_v2");
    return rc != CUDA_SUCCESS ? rc : after_sync(vcuda_real.cuCtxSynchronize_v2(ctx));
}

CUresult vc_cuEventSynchronize(CUevent event) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuEventSynchronize, "cuEventSynchronize");
    return rc != CUDA_SUCCESS ? rc : after_sync(vcuda_real.cuEventSynchronize(event));
}

void vcuda_pools_reset_after_fork(void) {
    pthread_mutex_init(&registry_lock, NULL);
    for (int i = 0; i < MAX_POOLS; i++) {
        pthread_mutex_init(&pools[i].lock, NULL);
        atomic_store(&pools[i].handle, NULL);
    }
    for (int d = 0; d < VCUDA_MAX_DEVICES; d++) atomic_store(&current_pools[d], NULL);
    atomic_store(&pool_high, 0);
    atomic_store(&releasable_pools, 0);
}
