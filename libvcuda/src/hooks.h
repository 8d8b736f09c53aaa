/* The one table of hooked driver functions.
 *
 * Every function libvcuda intercepts is declared exactly once below; the
 * exported wrappers, the real-function pointers, the dlsym/cuGetProcAddress
 * lookup and the prototypes of the vc_* implementations are all generated from
 * it. Adding a hook = one line here + one vc_<name> implementation.
 *
 * X(name, params, args)
 */
#ifndef VCUDA_HOOKS_H
#define VCUDA_HOOKS_H

#include <stdbool.h>

#include "vcuda/cuda_abi.h"
#include "vcuda/nvml_abi.h"

#define VCUDA_CUDA_HOOKS(X)                                                                        \
    X(cuInit, (unsigned int flags), (flags))                                                       \
    X(cuGetProcAddress, (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags),       \
      (symbol, pfn, cudaVersion, flags))                                                           \
    X(cuGetProcAddress_v2,                                                                         \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                          \
       CUdriverProcAddressQueryResult *symbolStatus),                                              \
      (symbol, pfn, cudaVersion, flags, symbolStatus))                                             \
    X(cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev), (bytes, dev))                            \
    X(cuMemGetInfo_v2, (size_t *free_bytes, size_t *total_bytes), (free_bytes, total_bytes))       \
    X(cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev), (pctx, dev))                      \
    X(cuDevicePrimaryCtxRelease_v2, (CUdevice dev), (dev))                                         \
    X(cuDevicePrimaryCtxRelease, (CUdevice dev), (dev)) /* legacy ABI, below 11000 */               \
    X(cuDevicePrimaryCtxReset_v2, (CUdevice dev), (dev))                                           \
    X(cuDevicePrimaryCtxReset, (CUdevice dev), (dev)) /* legacy ABI, below 11000 */                 \
    X(cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev), (pctx, flags, dev))     \
    X(cuCtxCreate_v3,                                                                              \
      (CUcontext *pctx, CUexecAffinityParam *params, int numParams, unsigned int flags,            \
       CUdevice dev),                                                                              \
      (pctx, params, numParams, flags, dev))                                                       \
    X(cuCtxCreate_v4,                                                                              \
      (CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev),              \
      (pctx, params, flags, dev))                                                                  \
    X(cuCtxDestroy_v2, (CUcontext ctx), (ctx))                                                     \
    X(cuCtxSetCurrent, (CUcontext ctx), (ctx))                                                     \
    X(cuCtxPushCurrent_v2, (CUcontext ctx), (ctx))                                                 \
    X(cuCtxPopCurrent_v2, (CUcontext *pctx), (pctx))                                               \
    X(cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize), (dptr, bytesize))                       \
    X(cuMemAllocPitch_v2,                                                                          \
      (CUdeviceptr *dptr, size_t *pitch, size_t widthBytes, size_t height,                         \
       unsigned int elementSizeBytes),                                                             \
      (dptr, pitch, widthBytes, height, elementSizeBytes))                                         \
    X(cuMemFree_v2, (CUdeviceptr dptr), (dptr))                                                    \
    X(cuMemAllocManaged, (CUdeviceptr *dptr, size_t bytesize, unsigned int flags),                 \
      (dptr, bytesize, flags))                                                                     \
    X(cuMemAllocAsync, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),                      \
      (dptr, bytesize, stream))                                                                    \
    X(cuMemAllocAsync_ptsz, (CUdeviceptr *dptr, size_t bytesize, CUstream stream),                 \
      (dptr, bytesize, stream))                                                                    \
    X(cuMemAllocFromPoolAsync,                                                                     \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream),                    \
      (dptr, bytesize, pool, stream))                                                              \
    X(cuMemAllocFromPoolAsync_ptsz,                                                                \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream stream),                    \
      (dptr, bytesize, pool, stream))                                                              \
    X(cuMemFreeAsync, (CUdeviceptr dptr, CUstream stream), (dptr, stream))                         \
    X(cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream stream), (dptr, stream))                    \
    X(cuMemPoolCreate, (CUmemoryPool *pool, const CUmemPoolProps *props), (pool, props))           \
    X(cuMemPoolDestroy, (CUmemoryPool pool), (pool))                                               \
    X(cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep), (pool, minBytesToKeep))         \
    X(cuMemPoolSetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value),           \
      (pool, attr, value))                                                                         \
    X(cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool), (dev, pool))                          \
    X(cuStreamSynchronize, (CUstream stream), (stream))                                            \
    X(cuStreamSynchronize_ptsz, (CUstream stream), (stream))                                       \
    X(cuCtxSynchronize, (void), ())                                                                \
    X(cuCtxSynchronize_v2, (CUcontext ctx), (ctx))                                                 \
    X(cuEventSynchronize, (CUevent event), (event))                                                \
    X(cuModuleGetFunction, (CUfunction *hfunc, CUmodule hmod, const char *name),                   \
      (hfunc, hmod, name))                                                                         \
    X(cuKernelGetFunction, (CUfunction *pFunc, CUkernel kernel), (pFunc, kernel))                  \
    X(cuLibraryGetKernel, (CUkernel *pKernel, CUlibrary library, const char *name),                \
      (pKernel, library, name))                                                                    \
    X(cuCtxSetLimit, (CUlimit limit, size_t value), (limit, value))                                \
    X(cuStreamBeginCapture_v2, (CUstream hStream, CUstreamCaptureMode mode), (hStream, mode))      \
    X(cuStreamBeginCapture_v2_ptsz, (CUstream hStream, CUstreamCaptureMode mode),                  \
      (hStream, mode))                                                                             \
    /* legacy ABI, below 10010: no mode (CU_STREAM_CAPTURE_MODE_GLOBAL) */                         \
    X(cuStreamBeginCapture, (CUstream hStream), (hStream))                                         \
    X(cuStreamBeginCapture_ptsz, (CUstream hStream), (hStream))                                    \
    X(cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph))                \
    X(cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph *phGraph), (hStream, phGraph))           \
    X(cuGraphAddMemAllocNode,                                                                      \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,                  \
       size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams),                            \
      (phGraphNode, hGraph, dependencies, numDependencies, nodeParams))                            \
    X(cuGraphDestroy, (CUgraph hGraph), (hGraph))                                                  \
    X(cuGraphInstantiateWithFlags,                                                                 \
      (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags),                        \
      (phGraphExec, hGraph, flags))                                                                \
    X(cuGraphInstantiate_v2,                                                                       \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
       size_t bufferSize),                                                                         \
      (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                                   \
    X(cuGraphInstantiate, /* legacy ABI, below 11000: the parameters of _v2 */                     \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
       size_t bufferSize),                                                                         \
      (phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize))                                   \
    X(cuGraphInstantiateWithParams,                                                                \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *params),           \
      (phGraphExec, hGraph, params))                                                               \
    X(cuGraphInstantiateWithParams_ptsz,                                                           \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUDA_GRAPH_INSTANTIATE_PARAMS *params),           \
      (phGraphExec, hGraph, params))                                                               \
    X(cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))            \
    X(cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream), (hGraphExec, hStream))       \
    X(cuGraphExecDestroy, (CUgraphExec hGraphExec), (hGraphExec))                                  \
    X(cuDeviceGraphMemTrim, (CUdevice device), (device))                                           \
    X(cuMemCreate,                                                                                 \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,         \
       unsigned long long flags),                                                                  \
      (handle, size, prop, flags))                                                                 \
    X(cuMemRelease, (CUmemGenericAllocationHandle handle), (handle))                               \
    X(cuArrayCreate_v2, (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *desc), (pHandle, desc))    \
    X(cuArray3DCreate_v2, (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc),                 \
      (pHandle, desc))                                                                             \
    X(cuArrayDestroy, (CUarray hArray), (hArray))                                                  \
    X(cuMipmappedArrayCreate,                                                                      \
      (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *desc, unsigned int levels),       \
      (pHandle, desc, levels))                                                                     \
    X(cuMipmappedArrayDestroy, (CUmipmappedArray hMipmappedArray), (hMipmappedArray))               \
    X(cuLaunchKernel, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS)                                       \
    X(cuLaunchKernel_ptsz, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS)                                  \
    X(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra), \
      (config, f, params, extra))                                                                  \
    X(cuLaunchKernelEx_ptsz,                                                                       \
      (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),                   \
      (config, f, params, extra))                                                                  \
    X(cuLaunchCooperativeKernel, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS)                               \
    X(cuLaunchCooperativeKernel_ptsz, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS)                          \
    X(cuGraphLaunch, (CUgraphExec exec, CUstream stream), (exec, stream))                          \
    X(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream), (exec, stream))

#define VCUDA_LAUNCH_PARAMS                                                                        \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params,       \
     void **extra)
#define VCUDA_LAUNCH_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params, extra)
#define VCUDA_COOP_PARAMS                                                                          \
    (CUfunction f, unsigned int gx, unsigned int gy, unsigned int gz, unsigned int bx,             \
     unsigned int by, unsigned int bz, unsigned int shared, CUstream stream, void **params)
#define VCUDA_COOP_ARGS (f, gx, gy, gz, bx, by, bz, shared, stream, params)

#define VCUDA_NVML_HOOKS(X)                                                                        \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory), (device, memory))      \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory),                  \
      (device, memory))

/* Driver functions the shim calls itself but does not intercept. */
#define VCUDA_CUDA_USED(X)                                                                         \
    X(cuCtxGetCurrent, (CUcontext *pctx))                                                          \
    X(cuCtxGetDevice, (CUdevice *dev))                                                             \
    X(cuStreamGetCtx, (CUstream stream, CUcontext *pctx))                                          \
    X(cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev))                                            \
    X(cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev))                                               \
    X(cuDeviceGetAttribute, (int *pi, CUdevice_attribute attrib, CUdevice dev))                    \
    X(cuCtxGetLimit, (size_t *pvalue, CUlimit limit))                                              \
    X(cuFuncGetAttribute, (int *pi, CUfunction_attribute attrib, CUfunction hfunc))                \
    X(cuKernelGetAttribute, (int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev)) \
    X(cuDeviceGetDefaultMemPool, (CUmemoryPool *pool, CUdevice dev))                               \
    X(cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev))                                      \
    X(cuMemPoolGetAttribute, (CUmemoryPool pool, CUmemPool_attribute attr, void *value))           \
    X(cuStreamIsCapturing, (CUstream stream, CUstreamCaptureStatus *status))                       \
    X(cuThreadExchangeStreamCaptureMode, (CUstreamCaptureMode *mode))                              \
    X(cuDeviceGetGraphMemAttribute, (CUdevice device, CUgraphMem_attribute attr, void *value))     \
    X(cuEventCreate, (CUevent *event, unsigned int flags))                                         \
    X(cuEventRecord, (CUevent event, CUstream stream))                                             \
    X(cuEventQuery, (CUevent event))                                                               \
    X(cuEventElapsedTime, (float *ms, CUevent start, CUevent end))                                 \
    X(cuEventDestroy_v2, (CUevent event))

#define VCUDA_NVML_USED(X)                                                                         \
    X(nvmlInit_v2, (void))                                                                         \
    X(nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length))                   \
    X(nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index))                              \
    X(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device))                         \
    X(nvmlDeviceGetComputeRunningProcesses_v3,                                                     \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))                    \
    X(nvmlDeviceGetComputeRunningProcesses_v2,                                                     \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))

/* Pointers to the real functions, filled once by real_driver.c. */
struct vcuda_real_cuda {
#define VCUDA_FIELD(name, params, ...) CUresult (*name) params;
    VCUDA_CUDA_HOOKS(VCUDA_FIELD)
    VCUDA_CUDA_USED(VCUDA_FIELD)
#undef VCUDA_FIELD
};
struct vcuda_real_nvml {
#define VCUDA_FIELD(name, params, ...) nvmlReturn_t (*name) params;
    VCUDA_NVML_HOOKS(VCUDA_FIELD)
    VCUDA_NVML_USED(VCUDA_FIELD)
#undef VCUDA_FIELD
};
extern struct vcuda_real_cuda vcuda_real;
extern struct vcuda_real_nvml vcuda_real_nvml;

/* The implementations behind the exported names (memory.c, pool.c, local_mem.c,
 * graph_mem.c, context_hooks.c, launch_hooks.c, interpose.c, nvml_view.c). */
#define VCUDA_PROTO(name, params, args) CUresult vc_##name params;
VCUDA_CUDA_HOOKS(VCUDA_PROTO)
#undef VCUDA_PROTO
#define VCUDA_PROTO(name, params, args) nvmlReturn_t vc_##name params;
VCUDA_NVML_HOOKS(VCUDA_PROTO)
#undef VCUDA_PROTO

/* One hooked name: what dlsym and cuGetProcAddress hand out instead of the real one. */
struct vcuda_hook {
    const char *name;
    void *wrapper;   /* vc_<name> */
    void **real;     /* slot in vcuda_real / vcuda_real_nvml */
    unsigned base_len; /* length of the name without _vN/_ptsz/_ptds suffixes */
    bool legacy;       /* no _vN suffix, where a sibling of the same base name has one */
};

/* Computes each hook's base-name length and legacy mark (library constructor). */
void vcuda_hooks_init(void);

/* Wrapper for `name` if `real_fn` is the real driver's `name` (or our own export). */
void *vcuda_hook_for_symbol(const char *name, void *real_fn);
/* Wrapper for the ABI variant of base name `symbol` whose real address is
 * `real_fn`, as cuGetProcAddress(symbol, cudaVersion, flags) returned it. */
void *vcuda_hook_for_proc(const char *symbol, void *real_fn, int cudaVersion, cuuint64_t flags);

#endif
