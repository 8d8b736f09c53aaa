/* Virtual memory management (cuMemCreate & co.). Physical handles are charged
 * at cuMemCreate and returned when released *and* no longer mapped, as on a
 * real driver. They belong to the process, not to a context: cuCtxDestroy
 * leaves them alone. Granularity is 2 MiB; sizes must be multiples of it.
 * A handle imported from another process (ipc.c) is mapped like any other
 * but never charged: its creator holds the memory. */
#define _GNU_SOURCE
#include <stdlib.h>

#include "api.h"
#include "sim.h"

struct handle {
    uint64_t id, bytes;
    unsigned phys;
    unsigned maps;
    unsigned handle_types; /* CUmemAllocationProp.requestedHandleTypes */
    bool released;
    bool imported; /* cuMemImportFromShareableHandle: its creator is charged, not us */
    struct handle *next;
};

struct range { /* a reservation or a mapping */
    uint64_t va, size;
    struct handle *h; /* mappings only */
    struct range *next;
};

static pthread_mutex_t vmu = PTHREAD_MUTEX_INITIALIZER;
static struct handle *handles;
static struct range *reserved, *mapped;

static struct handle *find_handle(uint64_t id)
{
    for (struct handle *h = handles; h; h = h->next)
        if (h->id == id)
            return h;
    return NULL;
}

/* Caller holds vmu; frees the handle if it is released and unmapped. */
static void maybe_free(struct handle *h)
{
    if (!h->released || h->maps)
        return;
    for (struct handle **pp = &handles; *pp; pp = &(*pp)->next) {
        if (*pp == h) {
            *pp = h->next;
            break;
        }
    }
    if (!h->imported)
        sim_uncharge(h->phys, h->bytes);
    free(h);
}

static CUresult check_prop(const CUmemAllocationProp *prop, unsigned *phys)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!prop || prop->type != CU_MEM_ALLOCATION_TYPE_PINNED ||
        prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return CUDA_ERROR_INVALID_VALUE;
    rc = sim_ordinal(prop->location.id, phys);
    return rc == CUDA_ERROR_INVALID_DEVICE ? CUDA_ERROR_INVALID_VALUE : rc;
}

SIM_EXPORT CUresult cuMemGetAllocationGranularity(size_t *granularity,
                                                  const CUmemAllocationProp *prop,
                                                  CUmemAllocationGranularity_flags option)
{
    unsigned phys;
    if (!granularity || (option != CU_MEM_ALLOC_GRANULARITY_MINIMUM &&
                         option != CU_MEM_ALLOC_GRANULARITY_RECOMMENDED))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_prop(prop, &phys);
    if (rc == CUDA_SUCCESS)
        *granularity = SIM_VMM_GRANULARITY;
    return rc;
}

SIM_EXPORT CUresult cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size,
                                const CUmemAllocationProp *prop, unsigned long long flags)
{
    unsigned phys;
    if (!handle || flags != 0 || size == 0 || size % SIM_VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = check_prop(prop, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    if ((rc = sim_charge(phys, size)) != CUDA_SUCCESS) {
        free(h);
        return rc;
    }
    h->id = sim_new_address(0, 0); /* unique, never 0 */
    h->bytes = size;
    h->phys = phys;
    h->handle_types = (unsigned)prop->requestedHandleTypes;
    pthread_mutex_lock(&vmu);
    h->next = handles;
    handles = h;
    pthread_mutex_unlock(&vmu);
    *handle = h->id;
    return CUDA_SUCCESS;
}

CUresult sim_vmm_describe(uint64_t id, uint64_t *bytes, unsigned *phys, unsigned *handle_types)
{
    CUresult rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmu);
    const struct handle *h = find_handle(id);
    if (h && !h->released && !h->imported) {
        *bytes = h->bytes;
        *phys = h->phys;
        *handle_types = h->handle_types;
        rc = CUDA_SUCCESS;
    }
    pthread_mutex_unlock(&vmu);
    return rc;
}

CUresult sim_vmm_adopt(uint64_t bytes, unsigned phys, uint64_t *id)
{
    struct handle *h = calloc(1, sizeof *h);
    if (!h)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *h = (struct handle){.id = sim_new_address(0, 0), .bytes = bytes, .phys = phys,
                         .imported = true};
    pthread_mutex_lock(&vmu);
    h->next = handles;
    handles = h;
    pthread_mutex_unlock(&vmu);
    *id = h->id;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemRelease(CUmemGenericAllocationHandle handle)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&vmu);
    struct handle *h = find_handle(handle);
    if (!h || h->released) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else {
        h->released = true;
        maybe_free(h);
    }
    pthread_mutex_unlock(&vmu);
    return rc;
}

SIM_EXPORT CUresult cuMemAddressReserve(CUdeviceptr *ptr, size_t size, size_t alignment,
                                        CUdeviceptr addr, unsigned long long flags)
{
    (void)addr; /* a hint; the simulator picks its own */
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!ptr || size == 0 || size % SIM_VMM_GRANULARITY || flags != 0 ||
        (alignment & (alignment - 1)))
        return CUDA_ERROR_INVALID_VALUE;
    struct range *r = calloc(1, sizeof *r);
    if (!r)
        return CUDA_ERROR_OUT_OF_MEMORY;
    r->va = sim_new_address(size, alignment);
    r->size = size;
    pthread_mutex_lock(&vmu);
    r->next = reserved;
    reserved = r;
    pthread_mutex_unlock(&vmu);
    *ptr = r->va;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemAddressFree(CUdeviceptr ptr, size_t size)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmu);
    for (struct range **pp = &reserved; *pp; pp = &(*pp)->next) {
        if ((*pp)->va == ptr && (*pp)->size == size) {
            struct range *r = *pp;
            *pp = r->next;
            free(r);
            rc = CUDA_SUCCESS;
            break;
        }
    }
    pthread_mutex_unlock(&vmu);
    return rc;
}

static bool inside(const struct range *list, uint64_t va, uint64_t size)
{
    for (const struct range *r = list; r; r = r->next)
        if (va >= r->va && size <= r->size && va - r->va <= r->size - size)
            return true;
    return false;
}

SIM_EXPORT CUresult cuMemMap(CUdeviceptr ptr, size_t size, size_t offset,
                             CUmemGenericAllocationHandle handle, unsigned long long flags)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (flags != 0 || size == 0 || size % SIM_VMM_GRANULARITY || offset % SIM_VMM_GRANULARITY)
        return CUDA_ERROR_INVALID_VALUE;
    struct range *m = calloc(1, sizeof *m);
    if (!m)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&vmu);
    struct handle *h = find_handle(handle);
    if (!h || h->released || offset > h->bytes || size > h->bytes - offset ||
        !inside(reserved, ptr, size)) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (inside(mapped, ptr, 1)) {
        rc = CUDA_ERROR_ALREADY_MAPPED;
    } else {
        *m = (struct range){.va = ptr, .size = size, .h = h, .next = mapped};
        mapped = m;
        h->maps++;
        m = NULL;
    }
    pthread_mutex_unlock(&vmu);
    free(m);
    return rc;
}

SIM_EXPORT CUresult cuMemUnmap(CUdeviceptr ptr, size_t size)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmu);
    /* Unmaps every mapping that lies inside [ptr, ptr + size). */
    for (struct range **pp = &mapped; *pp;) {
        struct range *m = *pp;
        if (m->va >= ptr && m->size <= size && m->va - ptr <= size - m->size) {
            *pp = m->next;
            m->h->maps--;
            maybe_free(m->h);
            free(m);
            rc = CUDA_SUCCESS;
        } else {
            pp = &m->next;
        }
    }
    pthread_mutex_unlock(&vmu);
    return rc;
}

SIM_EXPORT CUresult cuMemSetAccess(CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc,
                                   size_t count)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!desc || count == 0 || size == 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&vmu);
    bool ok = inside(mapped, ptr, 1);
    pthread_mutex_unlock(&vmu);
    return ok ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}
