/* A driver whose cuGetProcAddress hands out, for base names vcuda hooks,
 * entry points vcuda does not know: for cuStreamBeginCapture a function it
 * does not export, for cuDevicePrimaryCtxReset an export of a variant vcuda
 * does not hook (_v3), for cuCtxCreate its bare legacy export. It has none of
 * the legacy entry points vcuda hooks (cuStreamBeginCapture(_ptsz),
 * cuGraphInstantiate, cuDevicePrimaryCtxRelease/Reset). Use it as
 * VCUDA_REAL_LIBCUDA. */
#include <string.h>

#include "vcuda/cuda_abi.h"

#define ODD __attribute__((visibility("default")))

ODD CUresult cuInit(unsigned int flags);
ODD CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags);
ODD CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                                 CUdriverProcAddressQueryResult *symbolStatus);
ODD CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode);
ODD CUresult cuDevicePrimaryCtxReset_v3(CUdevice dev);
ODD CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev);

CUresult cuInit(unsigned int flags) {
    (void)flags;
    return CUDA_SUCCESS;
}

CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    (void)hStream, (void)mode;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuDevicePrimaryCtxReset_v3(CUdevice dev) {
    (void)dev;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuCtxCreate(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    (void)pctx, (void)flags, (void)dev;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Not exported. */
static CUresult internal_begin_capture(CUstream hStream) {
    (void)hStream;
    return CUDA_ERROR_NOT_SUPPORTED;
}

/* Both cuGetProcAddress entry points answer here: a call from one to the
 * other by its exported name would go through the shim's export. */
static CUresult lookup(const char *symbol, void **pfn) {
    if (!symbol || !pfn) return CUDA_ERROR_INVALID_VALUE;
    *pfn = NULL;
    if (strcmp(symbol, "cuStreamBeginCapture") == 0) *pfn = (void *)internal_begin_capture;
    else if (strcmp(symbol, "cuDevicePrimaryCtxReset") == 0) *pfn = (void *)cuDevicePrimaryCtxReset_v3;
    else if (strcmp(symbol, "cuCtxCreate") == 0) *pfn = (void *)cuCtxCreate;
    return *pfn ? CUDA_SUCCESS : CUDA_ERROR_NOT_FOUND;
}

CUresult cuGetProcAddress(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags) {
    (void)cudaVersion, (void)flags;
    return lookup(symbol, pfn);
}

CUresult cuGetProcAddress_v2(const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,
                             CUdriverProcAddressQueryResult *symbolStatus) {
    (void)cudaVersion, (void)flags;
    CUresult rc = lookup(symbol, pfn);
    if (symbolStatus)
        *symbolStatus = rc == CUDA_SUCCESS ? CU_GET_PROC_ADDRESS_SUCCESS : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND;
    return rc;
}
