/* Memory quota hooks (DESIGN.md "Memory"): every allocation API is charged in
 * the ledger BEFORE the driver is called and rolled back if the driver fails
 * (stream-ordered pools are charged by their reservation instead: pool.c),
 * so a request over the quota returns CUDA_ERROR_OUT_OF_MEMORY and allocates
 * nothing. Frees take the record out first, so an address the driver hands
 * out again cannot meet a stale record. A pointer the shim never saw passes
 * straight through.
 *
 * Cost budget (the alloc+free pair, beyond the driver): one acquire load for
 * readiness, cuCtxGetCurrent, a scan of the few live contexts, a CAS on the
 * device counter, a relaxed add on the process slot, and one shard mutex for
 * the record; about 60 ns uncontended on the simulator (bench/shim_bench.py). */
#include <stdbool.h>
#include <string.h>

#include "alloc_map.h"
#include "config.h"
#include "hooks.h"
#include "log.h"
#include "process.h"
#include "quota.h"
#include "real_driver.h"

/* A pending charge: reserved before the driver call, kept or undone after. */
struct charge {
    bool tracked; /* false: pass through untouched */
    int dev;
    uint64_t bytes;
    uint64_t limit;
    CUcontext ctx;
};

/* Reserves `bytes` on `ordinal` for context `ctx`. */
static CUresult charge_begin(struct charge *c, CUdevice ordinal, CUcontext ctx, uint64_t bytes) {
    memset(c, 0, sizeof *c);
    CUresult rc;
    int dev = vcuda_device_index(ordinal, &c->limit, &rc);
    if (dev < 0 || bytes == 0) return CUDA_SUCCESS; /* the driver reports the bad argument */
    if (!vcuda_quota_take(dev, bytes, c->limit)) {
        vcuda_info("allocation of %llu bytes on device %d refused: over the quota of %llu bytes",
                   (unsigned long long)bytes, ordinal, (unsigned long long)c->limit);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c->tracked = true;
    c->dev = dev;
    c->bytes = bytes;
    c->ctx = ctx;
    return CUDA_SUCCESS;
}

/* Prepares a charge on the current context's device. */
static CUresult charge_current(struct charge *c, uint64_t bytes) {
    memset(c, 0, sizeof *c);
    CUresult rc = vcuda_process_ready();
    if (rc != CUDA_SUCCESS) return rc;
    CUcontext ctx;
    CUdevice ordinal;
    if (vcuda_current_device(&ctx, &ordinal) != CUDA_SUCCESS) return CUDA_SUCCESS; /* no context: driver fails */
    return charge_begin(c, ordinal, ctx, bytes);
}

/* Keeps the charge under `key` when the driver succeeded, undoes it otherwise. */
static void charge_end(const struct charge *c, CUresult rc, uint8_t kind, uint64_t key) {
    if (!c->tracked) return;
    if (rc != CUDA_SUCCESS) {
        vcuda_quota_give(c->dev, c->bytes);
        return;
    }
    struct vcuda_alloc a = {.key = key, .bytes = c->bytes, .ctx = c->ctx, .dev = (int16_t)c->dev, .kind = kind};
    if (!vcuda_alloc_insert(&a))
        vcuda_warn("out of host memory: allocation %#llx stays charged until exit", (unsigned long long)key);
}

/* Takes the record of `key` before the driver frees it; returns whether found. */
static bool uncharge_begin(uint8_t kind, uint64_t key, struct vcuda_alloc *a) {
    if (vcuda_config.disabled || vcuda_process_ready() != CUDA_SUCCESS) return false;
    return vcuda_alloc_take(kind, key, a);
}

static void uncharge_end(bool found, const struct vcuda_alloc *a, CUresult rc) {
    if (!found) return;
    if (rc == CUDA_SUCCESS) vcuda_quota_give(a->dev, a->bytes);
    else vcuda_alloc_insert(a); /* the driver kept it: so do we */
}

/* ---- linear allocations ------------------------------------------------- */

CUresult vc_cuMemAlloc_v2(CUdeviceptr *dptr, size_t bytesize) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAlloc_v2, "cuMemAlloc_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuMemAlloc_v2(dptr, bytesize);
    struct charge c;
    rc = charge_current(&c, bytesize);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMemAlloc_v2(dptr, bytesize);
    charge_end(&c, rc, VCUDA_ALLOC_PTR, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

CUresult vc_cuMemAllocManaged(CUdeviceptr *dptr, size_t bytesize, unsigned int flags) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocManaged, "cuMemAllocManaged");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuMemAllocManaged(dptr, bytesize, flags);
    /* Managed memory may migrate to the host, but it can all be resident on the
     * device at once, so it counts in full. */
    struct charge c;
    rc = charge_current(&c, bytesize);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMemAllocManaged(dptr, bytesize, flags);
    charge_end(&c, rc, VCUDA_ALLOC_PTR, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

/* The pitch is the driver's choice: reserve for the widest alignment GPUs use,
 * then settle to pitch * height once the driver has answered. */
#define PITCH_ALIGN_MAX 512u

CUresult vc_cuMemAllocPitch_v2(CUdeviceptr *dptr, size_t *pitch, size_t widthBytes, size_t height,
                               unsigned int elementSizeBytes) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemAllocPitch_v2, "cuMemAllocPitch_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled)
        return vcuda_real.cuMemAllocPitch_v2(dptr, pitch, widthBytes, height, elementSizeBytes);
    uint64_t row = ((uint64_t)widthBytes + PITCH_ALIGN_MAX - 1) / PITCH_ALIGN_MAX * PITCH_ALIGN_MAX;
    struct charge c;
    rc = charge_current(&c, row * height);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMemAllocPitch_v2(dptr, pitch, widthBytes, height, elementSizeBytes);
    if (rc == CUDA_SUCCESS && c.tracked) {
        uint64_t actual = (uint64_t)*pitch * height;
        if (actual < c.bytes) {
            vcuda_quota_give(c.dev, c.bytes - actual);
            c.bytes = actual;
        } else if (actual > c.bytes) {
            if (!vcuda_quota_take(c.dev, actual - c.bytes, c.limit)) {
                vcuda_real.cuMemFree_v2(*dptr);
                *dptr = 0;
                charge_end(&c, CUDA_ERROR_OUT_OF_MEMORY, VCUDA_ALLOC_PTR, 0);
                return CUDA_ERROR_OUT_OF_MEMORY;
            }
            c.bytes = actual;
        }
    }
    charge_end(&c, rc, VCUDA_ALLOC_PTR, rc == CUDA_SUCCESS ? *dptr : 0);
    return rc;
}

CUresult vc_cuMemFree_v2(CUdeviceptr dptr) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemFree_v2, "cuMemFree_v2");
    if (rc != CUDA_SUCCESS) return rc;
    struct vcuda_alloc a;
    bool found = uncharge_begin(VCUDA_ALLOC_PTR, dptr, &a);
    rc = vcuda_real.cuMemFree_v2(dptr);
    uncharge_end(found, &a, rc);
    return rc;
}

/* ---- virtual memory management ------------------------------------------ */

CUresult vc_cuMemCreate(CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,
                        unsigned long long flags) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemCreate, "cuMemCreate");
    if (rc != CUDA_SUCCESS) return rc;
    /* Only device-resident physical memory counts; host-located memory is not the GPU's. */
    if (vcuda_config.disabled || prop == NULL || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
        return vcuda_real.cuMemCreate(handle, size, prop, flags);
    rc = vcuda_process_ready();
    if (rc == CUDA_SUCCESS) rc = vcuda_device_admit(prop->location.id); /* names a device, not a context */
    if (rc != CUDA_SUCCESS) return rc;
    struct charge c;
    /* Physical memory is bound to no context: destroying one does not release it. */
    rc = charge_begin(&c, prop->location.id, NULL, size);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMemCreate(handle, size, prop, flags);
    charge_end(&c, rc, VCUDA_ALLOC_HANDLE, rc == CUDA_SUCCESS ? *handle : 0);
    return rc;
}

CUresult vc_cuMemRelease(CUmemGenericAllocationHandle handle) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemRelease, "cuMemRelease");
    if (rc != CUDA_SUCCESS) return rc;
    struct vcuda_alloc a;
    bool found = uncharge_begin(VCUDA_ALLOC_HANDLE, handle, &a);
    rc = vcuda_real.cuMemRelease(handle);
    uncharge_end(found, &a, rc);
    return rc;
}

/* ---- arrays ------------------------------------------------------------- */

/* Bytes per element of one channel; block-compressed and video formats are
 * charged at the 4-byte upper bound of their per-pixel size. */
static uint64_t format_bytes(CUarray_format format) {
    switch ((int)format) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8: return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF: return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT: return 4;
    default: return 4;
    }
}

static uint64_t dim(size_t v) { return v ? (uint64_t)v : 1; }

/* Bytes of a (possibly mipmapped) array: width * height * depth * channels *
 * element size, summed over mip levels that halve each dimension down to 1. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format format, unsigned channels,
                            unsigned levels) {
    uint64_t total = 0;
    uint64_t elem = format_bytes(format) * (channels ? channels : 1);
    for (unsigned l = 0; l < (levels ? levels : 1); l++) {
        uint64_t lw = dim(w) >> l, lh = h ? dim(h) >> l : 1, ld = d ? dim(d) >> l : 1;
        total += (lw ? lw : 1) * (lh ? lh : 1) * (ld ? ld : 1) * elem;
    }
    return total;
}

CUresult vc_cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuArrayCreate_v2, "cuArrayCreate_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled || desc == NULL) return vcuda_real.cuArrayCreate_v2(pHandle, desc);
    struct charge c;
    rc = charge_current(&c, array_bytes(desc->Width, desc->Height, 0, desc->Format, desc->NumChannels, 1));
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuArrayCreate_v2(pHandle, desc);
    charge_end(&c, rc, VCUDA_ALLOC_ARRAY, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0);
    return rc;
}

CUresult vc_cuArray3DCreate_v2(CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuArray3DCreate_v2, "cuArray3DCreate_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled || desc == NULL) return vcuda_real.cuArray3DCreate_v2(pHandle, desc);
    struct charge c;
    rc = charge_current(&c, array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                        desc->NumChannels, 1));
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuArray3DCreate_v2(pHandle, desc);
    charge_end(&c, rc, VCUDA_ALLOC_ARRAY, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0);
    return rc;
}

CUresult vc_cuArrayDestroy(CUarray hArray) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuArrayDestroy, "cuArrayDestroy");
    if (rc != CUDA_SUCCESS) return rc;
    struct vcuda_alloc a;
    bool found = uncharge_begin(VCUDA_ALLOC_ARRAY, (uint64_t)(uintptr_t)hArray, &a);
    rc = vcuda_real.cuArrayDestroy(hArray);
    uncharge_end(found, &a, rc);
    return rc;
}

CUresult vc_cuMipmappedArrayCreate(CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc,
                                   unsigned int levels) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMipmappedArrayCreate, "cuMipmappedArrayCreate");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled || desc == NULL) return vcuda_real.cuMipmappedArrayCreate(pHandle, desc, levels);
    struct charge c;
    rc = charge_current(&c, array_bytes(desc->Width, desc->Height, desc->Depth, desc->Format,
                                        desc->NumChannels, levels));
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMipmappedArrayCreate(pHandle, desc, levels);
    charge_end(&c, rc, VCUDA_ALLOC_ARRAY, rc == CUDA_SUCCESS ? (uint64_t)(uintptr_t)*pHandle : 0);
    return rc;
}

CUresult vc_cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMipmappedArrayDestroy, "cuMipmappedArrayDestroy");
    if (rc != CUDA_SUCCESS) return rc;
    struct vcuda_alloc a;
    bool found = uncharge_begin(VCUDA_ALLOC_ARRAY, (uint64_t)(uintptr_t)hMipmappedArray, &a);
    rc = vcuda_real.cuMipmappedArrayDestroy(hMipmappedArray);
    uncharge_end(found, &a, rc);
    return rc;
}

/* ---- the quota view ----------------------------------------------------- */

void vcuda_quota_view(int dev, uint64_t limit, uint64_t *free_bytes, uint64_t *total_bytes) {
    if (limit == VCUDA_UNLIMITED) return;
    uint64_t used = atomic_load(&vcuda_proc.ledger.file->devices[dev].used);
    uint64_t total = limit < *total_bytes ? limit : *total_bytes;
    uint64_t left = used < total ? total - used : 0;
    *total_bytes = total;
    if (left < *free_bytes) *free_bytes = left;
}

CUresult vc_cuMemGetInfo_v2(size_t *free_bytes, size_t *total_bytes) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuMemGetInfo_v2, "cuMemGetInfo_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuMemGetInfo_v2(free_bytes, total_bytes);
    if (rc != CUDA_SUCCESS || vcuda_config.disabled || free_bytes == NULL || total_bytes == NULL) return rc;
    CUresult ready_rc = vcuda_process_ready();
    if (ready_rc != CUDA_SUCCESS) return ready_rc;
    CUcontext ctx;
    CUdevice ordinal;
    uint64_t limit;
    if (vcuda_current_device(&ctx, &ordinal) != CUDA_SUCCESS) return rc;
    int dev = vcuda_device_index(ordinal, &limit, &ready_rc);
    if (dev < 0) return rc;
    uint64_t f = *free_bytes, t = *total_bytes;
    vcuda_quota_view(dev, limit, &f, &t);
    *free_bytes = (size_t)f;
    *total_bytes = (size_t)t;
    return rc;
}

CUresult vc_cuDeviceTotalMem_v2(size_t *bytes, CUdevice ordinal) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuDeviceTotalMem_v2, "cuDeviceTotalMem_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuDeviceTotalMem_v2(bytes, ordinal);
    if (rc != CUDA_SUCCESS || vcuda_config.disabled || bytes == NULL) return rc;
    CUresult ready_rc = vcuda_process_ready();
    if (ready_rc != CUDA_SUCCESS) return ready_rc;
    uint64_t limit;
    if (vcuda_device_index(ordinal, &limit, &ready_rc) < 0) return rc;
    if (limit < *bytes) *bytes = (size_t)limit;
    return rc;
}
