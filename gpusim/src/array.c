/* CUDA arrays. Charged bytes (the shim charges exactly the same; also in
 * include/vcudasim.h):
 *   array:      Width * max(Height,1) * max(Depth,1) * NumChannels * element size
 *   mipmapped:  the sum of that over levels 0..numMipmapLevels-1, each
 *               dimension at level l being max(1, d >> l) (0 stays 0)
 * element size: 1 for (UN)SIGNED_INT8, UNORM/SNORM_INT8X*, UNORM_INT_101010_2;
 *               2 for (UN)SIGNED_INT16, HALF, UNORM/SNORM_INT16X*;
 *               4 for (UN)SIGNED_INT32, FLOAT.
 * Block-compressed and YUV formats: CUDA_ERROR_NOT_SUPPORTED. */
#define _GNU_SOURCE
#include "api.h"
#include "sim.h"

static unsigned element_size(CUarray_format f)
{
    switch ((unsigned)f) {
    case CU_AD_FORMAT_UNSIGNED_INT8:
    case CU_AD_FORMAT_SIGNED_INT8:
    case CU_AD_FORMAT_UNORM_INT_101010_2:
        return 1;
    case CU_AD_FORMAT_UNSIGNED_INT16:
    case CU_AD_FORMAT_SIGNED_INT16:
    case CU_AD_FORMAT_HALF:
        return 2;
    case CU_AD_FORMAT_UNSIGNED_INT32:
    case CU_AD_FORMAT_SIGNED_INT32:
    case CU_AD_FORMAT_FLOAT:
        return 4;
    default:
        if (f >= 0xc0 && f <= 0xcb) /* UNORM/SNORM_INT8X1 .. SNORM_INT16X4 */
            return (f - 0xc0) % 6 < 3 ? 1 : 2;
        return 0;
    }
}

static uint64_t level_dim(uint64_t d, unsigned level)
{
    if (d == 0)
        return 0;
    d >>= level;
    return d ? d : 1;
}

/* 0 with *rc set when the descriptor is refused. */
static uint64_t array_bytes(size_t w, size_t h, size_t d, CUarray_format f, unsigned ch,
                            unsigned levels, CUresult *rc)
{
    unsigned es = element_size(f);
    *rc = CUDA_SUCCESS;
    if (w == 0 || (ch != 1 && ch != 2 && ch != 4) || levels == 0) {
        *rc = CUDA_ERROR_INVALID_VALUE;
        return 0;
    }
    if (es == 0) {
        *rc = CUDA_ERROR_NOT_SUPPORTED;
        return 0;
    }
    uint64_t total = 0;
    for (unsigned l = 0; l < levels; l++) {
        uint64_t lw = level_dim(w, l), lh = level_dim(h, l), ld = level_dim(d, l);
        __uint128_t b = (__uint128_t)lw * (lh ? lh : 1) * (ld ? ld : 1) * ch * es;
        if (b > UINT64_MAX - total) {
            *rc = CUDA_ERROR_OUT_OF_MEMORY;
            return 0;
        }
        total += (uint64_t)b;
    }
    return total;
}

static CUresult create(uint64_t *handle, uint64_t bytes, enum sim_alloc_kind kind)
{
    struct sim_ctx *c;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    if ((rc = sim_charge(c->phys, bytes)) != CUDA_SUCCESS)
        return rc;
    uint64_t id = sim_new_address(bytes, 512);
    if ((rc = sim_alloc_record(id, bytes, c, kind)) != CUDA_SUCCESS) {
        sim_uncharge(c->phys, bytes);
        return rc;
    }
    *handle = id;
    return CUDA_SUCCESS;
}

static CUresult destroy(uint64_t handle, enum sim_alloc_kind kind)
{
    uint64_t bytes;
    unsigned phys;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_alloc_forget(handle, kind, &bytes, &phys);
    if (rc == CUDA_SUCCESS)
        sim_uncharge(phys, bytes);
    return rc == CUDA_SUCCESS ? rc : CUDA_ERROR_INVALID_HANDLE;
}

SIM_EXPORT CUresult cuArrayCreate_v2(CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray)
{
    CUresult rc;
    if (!pHandle || !pAllocateArray)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY_DESCRIPTOR *a = pAllocateArray;
    uint64_t bytes = array_bytes(a->Width, a->Height, 0, a->Format, a->NumChannels, 1, &rc);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS && (rc = create(&id, bytes, SIM_ALLOC_ARRAY)) == CUDA_SUCCESS)
        *pHandle = (CUarray)(uintptr_t)id;
    return rc;
}

SIM_EXPORT CUresult cuArray3DCreate_v2(CUarray *pHandle,
                                       const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray)
{
    CUresult rc;
    if (!pHandle || !pAllocateArray)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pAllocateArray;
    uint64_t bytes =
        array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels, 1, &rc);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS && (rc = create(&id, bytes, SIM_ALLOC_ARRAY)) == CUDA_SUCCESS)
        *pHandle = (CUarray)(uintptr_t)id;
    return rc;
}

SIM_EXPORT CUresult cuArrayDestroy(CUarray hArray)
{
    return destroy((uint64_t)(uintptr_t)hArray, SIM_ALLOC_ARRAY);
}

SIM_EXPORT CUresult cuMipmappedArrayCreate(CUmipmappedArray *pHandle,
                                           const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,
                                           unsigned int numMipmapLevels)
{
    CUresult rc;
    if (!pHandle || !pMipmappedArrayDesc)
        return CUDA_ERROR_INVALID_VALUE;
    const CUDA_ARRAY3D_DESCRIPTOR *a = pMipmappedArrayDesc;
    uint64_t bytes = array_bytes(a->Width, a->Height, a->Depth, a->Format, a->NumChannels,
                                 numMipmapLevels, &rc);
    uint64_t id = 0;
    if (rc == CUDA_SUCCESS && (rc = create(&id, bytes, SIM_ALLOC_MIPMAPPED)) == CUDA_SUCCESS)
        *pHandle = (CUmipmappedArray)(uintptr_t)id;
    return rc;
}

SIM_EXPORT CUresult cuMipmappedArrayDestroy(CUmipmappedArray hMipmappedArray)
{
    return destroy((uint64_t)(uintptr_t)hMipmappedArray, SIM_ALLOC_MIPMAPPED);
}
