/* Device memory: charging the shared books, fake addresses, this process's
 * map of live allocations, and the linear and managed allocation APIs
 * (stream-ordered ones: pool.c). No data is ever stored: addresses are never dereferenced. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>
#include <sys/types.h>

#include "api.h"
#include "sim.h"

CUresult sim_charge_as(unsigned phys, enum sim_mem kind, uint64_t bytes)
{
    struct sim_shared *sh = sim.sh;
    uint64_t cap = sh->dev[phys].capacity;
    sim_lock(sh);
    if (!sim_phys_usable(sh, phys)) { /* MIG mode changed, or the instance is gone */
        sim_unlock(sh);
        return CUDA_ERROR_INVALID_DEVICE;
    }
    uint64_t used = sim_device_used(sh, phys);
    if (used > cap || bytes > cap - used) {
        sim_reap_dead(sh); /* dead processes' memory first, as a real driver has */
        used = sim_device_used(sh, phys);
    }
    if (used > cap || bytes > cap - used) {
        sim_unlock(sh);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sh->proc[sim.slot].used[phys] += bytes;
    sh->proc[sim.slot].mem[phys][kind] += bytes;
    sim_unlock(sh);
    return CUDA_SUCCESS;
}

void sim_uncharge_as(unsigned phys, enum sim_mem kind, uint64_t bytes)
{
    struct sim_shared *sh = sim.sh;
    sim_lock(sh);
    uint64_t *k = &sh->proc[sim.slot].mem[phys][kind];
    bytes = bytes < *k ? bytes : *k; /* the total stays the sum of the kinds */
    *k -= bytes;
    sh->proc[sim.slot].used[phys] -= bytes;
    sim_unlock(sh);
}

CUresult sim_charge(unsigned phys, uint64_t bytes)
{
    return sim_charge_as(phys, SIM_MEM_ALLOC, bytes);
}

void sim_uncharge(unsigned phys, uint64_t bytes)
{
    sim_uncharge_as(phys, SIM_MEM_ALLOC, bytes);
}

static enum sim_mem mem_of(enum sim_alloc_kind kind)
{
    switch (kind) {
    case SIM_ALLOC_MODULE: return SIM_MEM_MODULE;
    case SIM_ALLOC_LOCAL: return SIM_MEM_LOCAL;
    case SIM_ALLOC_LIMITS: return SIM_MEM_LIMITS;
    default: return SIM_MEM_ALLOC; /* POOL and IPC entries carry no bytes */
    }
}

/* Unique across all processes on the state file; 2 MiB aligned, with a
 * guard granule between neighbours so no two allocations touch. */
uint64_t sim_new_address(uint64_t bytes, uint64_t align)
{
    (void)align; /* every address is SIM_VMM_GRANULARITY aligned */
    uint64_t span = (bytes + 2 * SIM_VMM_GRANULARITY - 1) & ~(SIM_VMM_GRANULARITY - 1);
    return __atomic_fetch_add(&sim.sh->next_addr, span, __ATOMIC_RELAXED);
}

/* ---- the allocation map: open addressing, linear probing ---- */

struct alloc {
    uint64_t key; /* 0: empty */
    uint64_t bytes;
    struct sim_ctx *ctx; /* freed with this context */
    unsigned phys;       /* charged to this device */
    enum sim_alloc_kind kind;
    void *owner;         /* POOL: the block */
};

static pthread_mutex_t amu = PTHREAD_MUTEX_INITIALIZER;
static struct alloc *tab;
static size_t tab_cap, tab_count;

static size_t slot_of(uint64_t key, size_t cap)
{
    key ^= key >> 33;
    key *= 0xff51afd7ed558ccdULL;
    key ^= key >> 33;
    return (size_t)key & (cap - 1);
}

static void put(struct alloc *t, size_t cap, const struct alloc *a)
{
    size_t i = slot_of(a->key, cap);
    while (t[i].key)
        i = (i + 1) & (cap - 1);
    t[i] = *a;
}

static int grow(void)
{
    size_t ncap = tab_cap ? tab_cap * 2 : 1024;
    struct alloc *nt = calloc(ncap, sizeof *nt);
    if (!nt)
        return -1;
    for (size_t i = 0; i < tab_cap; i++)
        if (tab[i].key)
            put(nt, ncap, &tab[i]);
    free(tab);
    tab = nt;
    tab_cap = ncap;
    return 0;
}

static void remove_at(size_t i)
{
    /* Backward-shift deletion keeps probe chains intact without tombstones. */
    size_t j = i;
    for (;;) {
        j = (j + 1) & (tab_cap - 1);
        if (!tab[j].key)
            break;
        size_t home = slot_of(tab[j].key, tab_cap);
        bool movable = i <= j ? (home <= i || home > j) : (home <= i && home > j);
        if (movable) {
            tab[i] = tab[j];
            i = j;
        }
    }
    tab[i].key = 0;
    tab_count--;
}

CUresult sim_alloc_record_owned(uint64_t key, uint64_t bytes, struct sim_ctx *ctx,
                                enum sim_alloc_kind kind, void *owner)
{
    struct alloc a = {.key = key, .bytes = bytes, .ctx = ctx, .phys = ctx->phys, .kind = kind,
                      .owner = owner};
    pthread_mutex_lock(&amu);
    if (2 * (tab_count + 1) > tab_cap && grow() != 0) {
        pthread_mutex_unlock(&amu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    put(tab, tab_cap, &a);
    tab_count++;
    pthread_mutex_unlock(&amu);
    return CUDA_SUCCESS;
}

CUresult sim_alloc_record(uint64_t key, uint64_t bytes, struct sim_ctx *ctx,
                          enum sim_alloc_kind kind)
{
    return sim_alloc_record_owned(key, bytes, ctx, kind, NULL);
}

/* Caller holds amu. The slot holding key, or -1. */
static ssize_t find_slot(uint64_t key)
{
    if (!tab_cap || !key)
        return -1;
    for (size_t i = slot_of(key, tab_cap); tab[i].key; i = (i + 1) & (tab_cap - 1))
        if (tab[i].key == key)
            return (ssize_t)i;
    return -1;
}

/* Caller holds amu. Copies the entry at key into *out if its kind is in kinds. */
static ssize_t find_kind(uint64_t key, unsigned kinds, struct sim_alloc_entry *out)
{
    ssize_t i = find_slot(key);
    if (i < 0 || !(kinds & SIM_ALLOC_BIT(tab[i].kind)))
        return -1;
    *out = (struct sim_alloc_entry){.bytes = tab[i].bytes, .phys = tab[i].phys,
                                    .kind = tab[i].kind, .ctx = tab[i].ctx,
                                    .owner = tab[i].owner};
    return i;
}

CUresult sim_alloc_take(uint64_t key, unsigned kinds, struct sim_alloc_entry *out)
{
    pthread_mutex_lock(&amu);
    ssize_t i = find_kind(key, kinds, out);
    if (i >= 0)
        remove_at((size_t)i);
    pthread_mutex_unlock(&amu);
    /* INVALID_VALUE: what the driver says for a pointer it never gave */
    return i >= 0 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

bool sim_alloc_find(uint64_t key, unsigned kinds, struct sim_alloc_entry *out)
{
    pthread_mutex_lock(&amu);
    ssize_t i = find_kind(key, kinds, out);
    pthread_mutex_unlock(&amu);
    return i >= 0;
}

CUresult sim_alloc_forget(uint64_t key, enum sim_alloc_kind kind, uint64_t *bytes,
                          unsigned *phys)
{
    struct sim_alloc_entry e;
    CUresult rc = sim_alloc_take(key, SIM_ALLOC_BIT(kind), &e);
    if (rc == CUDA_SUCCESS) {
        *bytes = e.bytes;
        *phys = e.phys;
    }
    return rc;
}

CUresult sim_alloc_resize(uint64_t *key, uint64_t bytes, struct sim_ctx *ctx,
                          enum sim_alloc_kind kind)
{
    struct sim_alloc_entry old = {.bytes = 0};
    if (*key && sim_alloc_take(*key, SIM_ALLOC_BIT(kind), &old) != CUDA_SUCCESS)
        old.bytes = 0; /* gone with its context */
    enum sim_mem m = mem_of(kind);
    CUresult rc = CUDA_SUCCESS;
    if (bytes > old.bytes)
        rc = sim_charge_as(ctx->phys, m, bytes - old.bytes);
    uint64_t keep = rc == CUDA_SUCCESS ? bytes : old.bytes;
    if (rc == CUDA_SUCCESS && bytes < old.bytes)
        sim_uncharge_as(ctx->phys, m, old.bytes - bytes);
    if (!keep) {
        *key = 0;
        return rc;
    }
    if (!*key)
        *key = sim_new_address(0, 0);
    CUresult rec = sim_alloc_record(*key, keep, ctx, kind);
    if (rec != CUDA_SUCCESS) { /* no room for the entry: nothing stays charged */
        sim_uncharge_as(ctx->phys, m, keep);
        *key = 0;
        return rec;
    }
    return rc;
}

bool sim_alloc_lookup(uint64_t addr, uint64_t len)
{
    /* Loose by design: any address inside the handed-out fake range passes;
     * copies carry no data, so only garbage pointers need catching. */
    uint64_t hi = __atomic_load_n(&sim.sh->next_addr, __ATOMIC_RELAXED);
    return addr >= SIM_ADDR_BASE && addr < hi && len <= hi - addr;
}

void sim_alloc_free_ctx(struct sim_ctx *ctx)
{
    uint64_t freed[SIM_MEM_KINDS] = {0};
    void **blocks = NULL;
    size_t nblocks = 0, cap = 0;
    bool again = true;
    pthread_mutex_lock(&amu);
    /* A removal shifts later entries back (into i, or past the wrap into a
     * slot already scanned): rescan until a pass removes nothing. */
    while (again) {
        again = false;
        for (size_t i = 0; i < tab_cap;) {
            if (tab[i].key && tab[i].ctx == ctx) {
                freed[mem_of(tab[i].kind)] += tab[i].bytes;
                if (tab[i].kind == SIM_ALLOC_POOL) {
                    if (nblocks == cap) {
                        cap = cap ? 2 * cap : 64;
                        void **n = realloc(blocks, cap * sizeof *n);
                        if (!n) { /* keep it: the block is freed with its pool */
                            i++;
                            continue;
                        }
                        blocks = n;
                    }
                    blocks[nblocks++] = tab[i].owner;
                }
                remove_at(i);
                again = true;
            } else {
                i++;
            }
        }
    }
    pthread_mutex_unlock(&amu);
    /* Stream-ordered blocks go back to their pools, which keep them reserved. */
    for (size_t i = 0; i < nblocks; i++)
        sim_pool_block_free(blocks[i]);
    free(blocks);
    for (unsigned k = 0; k < SIM_MEM_KINDS; k++)
        if (freed[k])
            sim_uncharge_as(ctx->phys, (enum sim_mem)k, freed[k]);
}

/* ---- linear allocations ---- */

CUresult sim_alloc_linear(struct sim_ctx *c, CUdeviceptr *dptr, uint64_t bytes)
{
    CUresult rc = sim_charge(c->phys, bytes);
    if (rc != CUDA_SUCCESS)
        return rc;
    uint64_t addr = sim_new_address(bytes, 512);
    rc = sim_alloc_record(addr, bytes, c, SIM_ALLOC_LINEAR);
    if (rc != CUDA_SUCCESS) {
        sim_uncharge(c->phys, bytes);
        return rc;
    }
    *dptr = addr;
    return CUDA_SUCCESS;
}

static CUresult alloc_current(CUdeviceptr *dptr, uint64_t bytes)
{
    struct sim_ctx *c;
    if (!dptr)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (bytes == 0)
        return CUDA_ERROR_INVALID_VALUE;
    return sim_alloc_linear(c, dptr, bytes);
}

CUresult sim_free_pointer(CUdeviceptr dptr)
{
    struct sim_alloc_entry e;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dptr == 0)
        return CUDA_SUCCESS;
    rc = sim_alloc_take(dptr, SIM_ALLOC_BIT(SIM_ALLOC_LINEAR) | SIM_ALLOC_BIT(SIM_ALLOC_POOL), &e);
    if (rc == CUDA_SUCCESS && e.kind == SIM_ALLOC_POOL)
        sim_pool_block_free(e.owner);
    else if (rc == CUDA_SUCCESS)
        sim_uncharge(e.phys, e.bytes);
    else if (sim_graph_mem_free_outside(dptr))
        rc = CUDA_SUCCESS;
    return rc;
}

SIM_EXPORT CUresult cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize)
{
    return alloc_current(dptr, bytesize);
}

/* Pitch = WidthInBytes rounded up to 512; charged pitch * Height. */
SIM_EXPORT CUresult cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes,
                                       size_t Height, unsigned int ElementSizeBytes)
{
    if (!pPitch || WidthInBytes == 0 || Height == 0 ||
        (ElementSizeBytes != 4 && ElementSizeBytes != 8 && ElementSizeBytes != 16))
        return CUDA_ERROR_INVALID_VALUE;
    size_t pitch = (WidthInBytes + 511) & ~(size_t)511;
    if (Height > SIZE_MAX / pitch)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = alloc_current(dptr, (uint64_t)pitch * Height);
    if (rc == CUDA_SUCCESS)
        *pPitch = pitch;
    return rc;
}

SIM_EXPORT CUresult cuMemFree_v2(CUdeviceptr dptr)
{
    return sim_free_pointer(dptr);
}

SIM_EXPORT CUresult cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags)
{
    if (flags != CU_MEM_ATTACH_GLOBAL && flags != CU_MEM_ATTACH_HOST)
        return CUDA_ERROR_INVALID_VALUE;
    return alloc_current(dptr, bytesize); /* charged to the device in full, at once */
}

SIM_EXPORT CUresult cuMemGetInfo_v2(size_t *free, size_t *total)
{
    struct sim_ctx *c;
    if (!free || !total)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_shared *sh = sim.sh;
    sim_lock(sh);
    sim_reap_dead(sh);
    uint64_t cap = sh->dev[c->phys].capacity, used = sim_device_used(sh, c->phys);
    sim_unlock(sh);
    *total = cap;
    *free = used < cap ? cap - used : 0;
    return CUDA_SUCCESS;
}

/* ---- copies and memsets: validated; they take no time on the timeline ---- */

static CUresult check_dev_range(CUdeviceptr p, size_t n)
{
    struct sim_ctx *c;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    return sim_alloc_lookup(p, n) ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* A synchronous copy runs after the work already queued (legacy stream
 * semantics: after everything in the context; per-thread: that stream). */
static CUresult sync_copy(CUdeviceptr dev_a, CUdeviceptr dev_b, size_t n, const void *host,
                          bool ptds)
{
    CUresult rc = check_dev_range(dev_a, n);
    if (rc == CUDA_SUCCESS && dev_b)
        rc = check_dev_range(dev_b, n);
    if (rc == CUDA_SUCCESS && !dev_b && !host)
        rc = CUDA_ERROR_INVALID_VALUE;
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_stream *s;
    if ((rc = sim_stream_resolve(NULL, ptds, &s)) != CUDA_SUCCESS)
        return rc;
    struct sim_ctx *c = sim_current_ctx();
    if (ptds)
        sim_stream_drain(s);
    else if (c)
        sim_ctx_drain(c);
    return CUDA_SUCCESS;
}

static CUresult async_copy(CUdeviceptr dev_a, CUdeviceptr dev_b, size_t n, const void *host,
                           CUstream hStream, bool ptsz)
{
    CUresult rc = check_dev_range(dev_a, n);
    if (rc == CUDA_SUCCESS && dev_b)
        rc = check_dev_range(dev_b, n);
    if (rc == CUDA_SUCCESS && !dev_b && !host)
        rc = CUDA_ERROR_INVALID_VALUE;
    struct sim_stream *s;
    return rc == CUDA_SUCCESS ? sim_stream_resolve(hStream, ptsz, &s) : rc;
}

SIM_EXPORT CUresult cuMemcpyHtoD_v2(CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount)
{
    return sync_copy(dstDevice, 0, ByteCount, srcHost, false);
}

SIM_EXPORT CUresult cuMemcpyHtoD_v2_ptds(CUdeviceptr dstDevice, const void *srcHost,
                                         size_t ByteCount)
{
    return sync_copy(dstDevice, 0, ByteCount, srcHost, true);
}

SIM_EXPORT CUresult cuMemcpyDtoH_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return sync_copy(srcDevice, 0, ByteCount, dstHost, false);
}

SIM_EXPORT CUresult cuMemcpyDtoH_v2_ptds(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount)
{
    return sync_copy(srcDevice, 0, ByteCount, dstHost, true);
}

SIM_EXPORT CUresult cuMemcpyDtoD_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount)
{
    return sync_copy(dstDevice, srcDevice, ByteCount, NULL, false);
}

SIM_EXPORT CUresult cuMemcpyDtoD_v2_ptds(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                         size_t ByteCount)
{
    return sync_copy(dstDevice, srcDevice, ByteCount, NULL, true);
}

SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dstDevice, const void *srcHost,
                                         size_t ByteCount, CUstream hStream)
{
    return async_copy(dstDevice, 0, ByteCount, srcHost, hStream, false);
}

SIM_EXPORT CUresult cuMemcpyHtoDAsync_v2_ptsz(CUdeviceptr dstDevice, const void *srcHost,
                                              size_t ByteCount, CUstream hStream)
{
    return async_copy(dstDevice, 0, ByteCount, srcHost, hStream, true);
}

SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2(void *dstHost, CUdeviceptr srcDevice, size_t ByteCount,
                                         CUstream hStream)
{
    return async_copy(srcDevice, 0, ByteCount, dstHost, hStream, false);
}

SIM_EXPORT CUresult cuMemcpyDtoHAsync_v2_ptsz(void *dstHost, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream)
{
    return async_copy(srcDevice, 0, ByteCount, dstHost, hStream, true);
}

SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                         size_t ByteCount, CUstream hStream)
{
    return async_copy(dstDevice, srcDevice, ByteCount, NULL, hStream, false);
}

SIM_EXPORT CUresult cuMemcpyDtoDAsync_v2_ptsz(CUdeviceptr dstDevice, CUdeviceptr srcDevice,
                                              size_t ByteCount, CUstream hStream)
{
    return async_copy(dstDevice, srcDevice, ByteCount, NULL, hStream, true);
}

SIM_EXPORT CUresult cuMemsetD8_v2(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    (void)uc;
    return check_dev_range(dstDevice, N);
}

SIM_EXPORT CUresult cuMemsetD8_v2_ptds(CUdeviceptr dstDevice, unsigned char uc, size_t N)
{
    return cuMemsetD8_v2(dstDevice, uc, N);
}

SIM_EXPORT CUresult cuMemsetD32_v2(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    (void)ui;
    if (N > SIZE_MAX / 4)
        return CUDA_ERROR_INVALID_VALUE;
    return check_dev_range(dstDevice, N * 4);
}

SIM_EXPORT CUresult cuMemsetD32_v2_ptds(CUdeviceptr dstDevice, unsigned int ui, size_t N)
{
    return cuMemsetD32_v2(dstDevice, ui, N);
}
