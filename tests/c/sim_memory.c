/* Every allocation API charges the simulated device exactly as documented in
 * gpusim/include/vcudasim.h. Prints failed checks; exits with their number. */
#define _GNU_SOURCE
#include <stdio.h>

#include "api.h"

static int failures;
#define CHECK(cond)                                                                    \
    do {                                                                               \
        if (!(cond)) {                                                                 \
            printf("FAIL %s:%d %s\n", __FILE__, __LINE__, #cond);                      \
            failures++;                                                                \
        }                                                                              \
    } while (0)

#define MiB (1ull << 20)

static size_t used(void)
{
    size_t fr = 0, tot = 0;
    CHECK(cuMemGetInfo_v2(&fr, &tot) == CUDA_SUCCESS);
    return tot - fr;
}

int main(void)
{
    CUcontext ctx, other;
    CHECK(cuInit(0) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRetain(&ctx, 0) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    size_t base = used();
    CHECK(base == 64 * MiB);

    CUdeviceptr p, q;
    size_t pitch;
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 4) == CUDA_SUCCESS);
    CHECK(pitch == 1024 && used() == base + 10240);
    CHECK(cuMemFree_v2(p) == CUDA_SUCCESS && used() == base);
    CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE); /* double free */
    CHECK(cuMemAllocPitch_v2(&p, &pitch, 1000, 10, 3) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemAlloc_v2(&p, 0) == CUDA_ERROR_INVALID_VALUE);

    CHECK(cuMemAllocManaged(&p, 3 * MiB, CU_MEM_ATTACH_GLOBAL) == CUDA_SUCCESS);
    CHECK(used() == base + 3 * MiB);
    CHECK(cuMemcpyHtoD_v2(p, &pitch, sizeof pitch) == CUDA_SUCCESS);
    CHECK(cuMemcpyDtoH_v2(&pitch, p, sizeof pitch) == CUDA_SUCCESS);
    CHECK(cuMemsetD32_v2(p, 0, 16) == CUDA_SUCCESS);
    CHECK(cuMemcpyHtoD_v2(0x42, &pitch, sizeof pitch) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemFree_v2(p) == CUDA_SUCCESS);

    /* Stream-ordered allocations, default and explicit pools: each pool
     * reserves a 32 MiB chunk and keeps it after the frees, until trimmed. */
    CUmemoryPool pool, mine;
    CUmemPoolProps props = {.allocType = CU_MEM_ALLOCATION_TYPE_PINNED,
                            .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    CHECK(cuDeviceGetDefaultMemPool(&pool, 0) == CUDA_SUCCESS);
    CHECK(cuMemPoolCreate(&mine, &props) == CUDA_SUCCESS);
    CHECK(cuMemAllocAsync(&p, 5 * MiB, NULL) == CUDA_SUCCESS);
    CHECK(cuMemAllocFromPoolAsync_ptsz(&q, 7 * MiB, mine, NULL) == CUDA_SUCCESS);
    CHECK(used() == base + 64 * MiB);
    CHECK(cuMemFreeAsync(p, NULL) == CUDA_SUCCESS);
    CHECK(cuMemFreeAsync_ptsz(q, NULL) == CUDA_SUCCESS);
    CHECK(used() == base + 64 * MiB);
    CHECK(cuMemPoolTrimTo(pool, 0) == CUDA_SUCCESS);
    CHECK(used() == base + 32 * MiB);
    CHECK(cuMemPoolDestroy(mine) == CUDA_SUCCESS);
    CHECK(used() == base);
    CHECK(cuMemAllocFromPoolAsync(&q, MiB, mine, NULL) == CUDA_ERROR_INVALID_VALUE);

    /* VMM: 2 MiB granularity; memory returns once released and unmapped. */
    CUmemAllocationProp prop = {.type = CU_MEM_ALLOCATION_TYPE_PINNED,
                                .location = {CU_MEM_LOCATION_TYPE_DEVICE, 0}};
    size_t gran = 0;
    CHECK(cuMemGetAllocationGranularity(&gran, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == 0);
    CHECK(gran == 2 * MiB);
    CUmemGenericAllocationHandle h;
    CHECK(cuMemCreate(&h, 3 * MiB, &prop, 0) == CUDA_ERROR_INVALID_VALUE);
    CHECK(cuMemCreate(&h, 4 * MiB, &prop, 0) == CUDA_SUCCESS);
    CHECK(used() == base + 4 * MiB);
    CUdeviceptr va;
    CHECK(cuMemAddressReserve(&va, 8 * MiB, 0, 0, 0) == CUDA_SUCCESS);
    CHECK(cuMemMap(va, 4 * MiB, 0, h, 0) == CUDA_SUCCESS);
    CUmemAccessDesc acc = {.location = {CU_MEM_LOCATION_TYPE_DEVICE, 0},
                           .flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE};
    CHECK(cuMemSetAccess(va, 4 * MiB, &acc, 1) == CUDA_SUCCESS);
    CHECK(cuMemFree_v2(va) == CUDA_ERROR_INVALID_VALUE); /* not a cuMemAlloc pointer */
    CHECK(cuMemRelease(h) == CUDA_SUCCESS);
    CHECK(used() == base + 4 * MiB); /* still mapped */
    CHECK(cuMemUnmap(va, 4 * MiB) == CUDA_SUCCESS);
    CHECK(used() == base);
    CHECK(cuMemAddressFree(va, 8 * MiB) == CUDA_SUCCESS);
    CHECK(cuMemRelease(h) == CUDA_ERROR_INVALID_VALUE);

    /* Arrays: width * height * depth * channels * element size. */
    CUarray arr, arr3;
    CUmipmappedArray mip;
    CUDA_ARRAY_DESCRIPTOR d2 = {.Width = 100, .Height = 10, .Format = CU_AD_FORMAT_FLOAT,
                                .NumChannels = 4};
    CHECK(cuArrayCreate_v2(&arr, &d2) == CUDA_SUCCESS && used() == base + 16000);
    CUDA_ARRAY3D_DESCRIPTOR d3 = {.Width = 64, .Height = 0, .Depth = 0,
                                  .Format = CU_AD_FORMAT_HALF, .NumChannels = 2};
    CHECK(cuArray3DCreate_v2(&arr3, &d3) == CUDA_SUCCESS && used() == base + 16000 + 256);
    CUDA_ARRAY3D_DESCRIPTOR dm = {.Width = 8, .Height = 4, .Depth = 0,
                                  .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1};
    /* levels: 8x4 + 4x2 + 2x1 + 1x1 = 43 bytes */
    CHECK(cuMipmappedArrayCreate(&mip, &dm, 4) == CUDA_SUCCESS);
    CHECK(used() == base + 16000 + 256 + 43);
    CHECK(cuArrayDestroy(arr) == CUDA_SUCCESS && cuArrayDestroy(arr3) == CUDA_SUCCESS);
    CHECK(cuMipmappedArrayDestroy(mip) == CUDA_SUCCESS && used() == base);
    CHECK(cuArrayDestroy(arr) == CUDA_ERROR_INVALID_HANDLE);
    d2.Format = CU_AD_FORMAT_BC1_UNORM;
    CHECK(cuArrayCreate_v2(&arr, &d2) == CUDA_ERROR_NOT_SUPPORTED);

    /* Destroying a context frees what was allocated in it. */
    CHECK(cuCtxCreate_v2(&other, 0, 0) == CUDA_SUCCESS);
    CHECK(used() == base + 64 * MiB);
    CHECK(cuMemAlloc_v2(&p, 10 * MiB) == CUDA_SUCCESS);
    CHECK(cuArrayCreate_v2(&arr, &(CUDA_ARRAY_DESCRIPTOR){.Width = 1024, .Height = 1,
                           .Format = CU_AD_FORMAT_UNSIGNED_INT8, .NumChannels = 1}) == 0);
    for (int i = 0; i < 1000; i++)
        CHECK(cuMemAlloc_v2(&q, 4096) == CUDA_SUCCESS);
    CHECK(cuCtxDestroy_v2(other) == CUDA_SUCCESS);
    CHECK(cuCtxSetCurrent(ctx) == CUDA_SUCCESS);
    CHECK(used() == base);
    CHECK(cuMemFree_v2(p) == CUDA_ERROR_INVALID_VALUE);

    /* The primary context's last release frees it and its overhead. */
    CHECK(cuMemAlloc_v2(&p, MiB) == CUDA_SUCCESS);
    CHECK(cuDevicePrimaryCtxRelease_v2(0) == CUDA_SUCCESS);
    int active = 1;
    unsigned flags;
    CHECK(cuDevicePrimaryCtxGetState(0, &flags, &active) == CUDA_SUCCESS && !active);
    CHECK(cuMemAlloc_v2(&p, MiB) == CUDA_ERROR_INVALID_CONTEXT);
    printf("done %d\n", failures);
    return failures;
}
