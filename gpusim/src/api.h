/* Every driver entry point the simulator exports, declared once.
 *
 * One row per exported symbol: X(base name, first cudaVersion that maps the
 * base name to this symbol, per-thread-stream form?, symbol, parameters).
 * The rows give the prototypes (so each definition is type-checked, and
 * -Wmissing-prototypes rejects an export without a row) and the
 * cuGetProcAddress table in procaddr.c. A symbol may appear in several rows
 * (several base names map to it). */
#ifndef VCUDA_GPUSIM_API_H
#define VCUDA_GPUSIM_API_H

#include <vcuda/cuda_abi.h>

#define SIM_EXPORT __attribute__((visibility("default")))

#define SIM_LAUNCH_PARAMS                                                                     \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,       \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                 \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams, void **extra)
#define SIM_COOP_PARAMS                                                                       \
    (CUfunction f, unsigned int gridDimX, unsigned int gridDimY, unsigned int gridDimZ,       \
     unsigned int blockDimX, unsigned int blockDimY, unsigned int blockDimZ,                 \
     unsigned int sharedMemBytes, CUstream hStream, void **kernelParams)

#define SIM_CUDA_API(X)                                                                            \
    X(cuInit, 2000, 0, cuInit, (unsigned int Flags))                                               \
    X(cuDriverGetVersion, 2020, 0, cuDriverGetVersion, (int *driverVersion))                       \
    X(cuGetErrorString, 6000, 0, cuGetErrorString, (CUresult error, const char **pStr))            \
    X(cuGetErrorName, 6000, 0, cuGetErrorName, (CUresult error, const char **pStr))                \
    X(cuGetProcAddress, 11030, 0, cuGetProcAddress,                                                \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags))                         \
    X(cuGetProcAddress, 12000, 0, cuGetProcAddress_v2,                                             \
      (const char *symbol, void **pfn, int cudaVersion, cuuint64_t flags,                          \
       CUdriverProcAddressQueryResult *symbolStatus))                                              \
    /* devices */                                                                                  \
    X(cuDeviceGet, 2000, 0, cuDeviceGet, (CUdevice *device, int ordinal))                          \
    X(cuDeviceGetCount, 2000, 0, cuDeviceGetCount, (int *count))                                   \
    X(cuDeviceGetName, 2000, 0, cuDeviceGetName, (char *name, int len, CUdevice dev))              \
    X(cuDeviceGetUuid, 9020, 0, cuDeviceGetUuid, (CUuuid *uuid, CUdevice dev))                     \
    X(cuDeviceGetUuid, 11040, 0, cuDeviceGetUuid_v2, (CUuuid *uuid, CUdevice dev))                 \
    X(cuDeviceTotalMem, 3020, 0, cuDeviceTotalMem_v2, (size_t *bytes, CUdevice dev))               \
    X(cuDeviceGetAttribute, 2000, 0, cuDeviceGetAttribute,                                         \
      (int *pi, CUdevice_attribute attrib, CUdevice dev))                                          \
    X(cuDeviceGetPCIBusId, 4010, 0, cuDeviceGetPCIBusId, (char *pciBusId, int len, CUdevice dev))  \
    /* contexts */                                                                                 \
    X(cuDevicePrimaryCtxRetain, 7000, 0, cuDevicePrimaryCtxRetain, (CUcontext *pctx, CUdevice dev)) \
    X(cuDevicePrimaryCtxRelease, 7000, 0, cuDevicePrimaryCtxRelease, (CUdevice dev))               \
    X(cuDevicePrimaryCtxRelease, 11000, 0, cuDevicePrimaryCtxRelease_v2, (CUdevice dev))           \
    X(cuDevicePrimaryCtxReset, 7000, 0, cuDevicePrimaryCtxReset, (CUdevice dev))                   \
    X(cuDevicePrimaryCtxReset, 11000, 0, cuDevicePrimaryCtxReset_v2, (CUdevice dev))               \
    X(cuDevicePrimaryCtxGetState, 7000, 0, cuDevicePrimaryCtxGetState,                             \
      (CUdevice dev, unsigned int *flags, int *active))                                            \
    X(cuDevicePrimaryCtxSetFlags, 7000, 0, cuDevicePrimaryCtxSetFlags,                             \
      (CUdevice dev, unsigned int flags))                                                          \
    X(cuDevicePrimaryCtxSetFlags, 11000, 0, cuDevicePrimaryCtxSetFlags_v2,                         \
      (CUdevice dev, unsigned int flags))                                                          \
    X(cuCtxCreate, 3020, 0, cuCtxCreate_v2, (CUcontext *pctx, unsigned int flags, CUdevice dev))   \
    X(cuCtxCreate, 13000, 0, cuCtxCreate_v4,                                                       \
      (CUcontext *pctx, CUctxCreateParams *ctxCreateParams, unsigned int flags, CUdevice dev))     \
    X(cuCtxDestroy, 4000, 0, cuCtxDestroy_v2, (CUcontext ctx))                                     \
    X(cuCtxSetCurrent, 4000, 0, cuCtxSetCurrent, (CUcontext ctx))                                  \
    X(cuCtxGetCurrent, 4000, 0, cuCtxGetCurrent, (CUcontext *pctx))                                \
    X(cuCtxPushCurrent, 4000, 0, cuCtxPushCurrent_v2, (CUcontext ctx))                             \
    X(cuCtxPopCurrent, 4000, 0, cuCtxPopCurrent_v2, (CUcontext *pctx))                             \
    X(cuCtxGetDevice, 2000, 0, cuCtxGetDevice, (CUdevice *device))                                 \
    X(cuCtxGetFlags, 7000, 0, cuCtxGetFlags, (unsigned int *flags))                                \
    X(cuCtxGetApiVersion, 3020, 0, cuCtxGetApiVersion, (CUcontext ctx, unsigned int *version))     \
    X(cuCtxGetStreamPriorityRange, 5050, 0, cuCtxGetStreamPriorityRange,                           \
      (int *leastPriority, int *greatestPriority))                                                 \
    X(cuCtxSynchronize, 2000, 0, cuCtxSynchronize, (void))                                         \
    X(cuCtxSetLimit, 3010, 0, cuCtxSetLimit, (CUlimit limit, size_t value))                        \
    X(cuCtxGetLimit, 3010, 0, cuCtxGetLimit, (size_t *pvalue, CUlimit limit))                      \
    /* modules and libraries: any image loads, any name resolves */                                \
    X(cuModuleLoad, 2000, 0, cuModuleLoad, (CUmodule *module, const char *fname))                  \
    X(cuModuleLoadData, 2000, 0, cuModuleLoadData, (CUmodule *module, const void *image))          \
    X(cuModuleLoadDataEx, 2010, 0, cuModuleLoadDataEx,                                             \
      (CUmodule *module, const void *image, unsigned int numOptions, CUjit_option *options,        \
       void **optionValues))                                                                       \
    X(cuModuleUnload, 2000, 0, cuModuleUnload, (CUmodule hmod))                                    \
    X(cuModuleGetFunction, 2000, 0, cuModuleGetFunction,                                           \
      (CUfunction *hfunc, CUmodule hmod, const char *name))                                        \
    X(cuLibraryLoadData, 12000, 0, cuLibraryLoadData,                                              \
      (CUlibrary *library, const void *code, CUjit_option *jitOptions, void **jitOptionsValues,    \
       unsigned int numJitOptions, CUlibraryOption *libraryOptions, void **libraryOptionValues,    \
       unsigned int numLibraryOptions))                                                            \
    X(cuLibraryGetKernel, 12000, 0, cuLibraryGetKernel,                                            \
      (CUkernel *pKernel, CUlibrary library, const char *name))                                    \
    X(cuLibraryUnload, 12000, 0, cuLibraryUnload, (CUlibrary library))                             \
    X(cuKernelGetFunction, 12000, 0, cuKernelGetFunction, (CUfunction *pFunc, CUkernel kernel))    \
    X(cuFuncGetAttribute, 2020, 0, cuFuncGetAttribute,                                             \
      (int *pi, CUfunction_attribute attrib, CUfunction hfunc))                                    \
    X(cuKernelGetAttribute, 12000, 0, cuKernelGetAttribute,                                        \
      (int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev))                       \
    /* memory */                                                                                   \
    X(cuMemGetInfo, 3020, 0, cuMemGetInfo_v2, (size_t *free, size_t *total))                       \
    X(cuMemAlloc, 3020, 0, cuMemAlloc_v2, (CUdeviceptr *dptr, size_t bytesize))                    \
    X(cuMemAllocPitch, 3020, 0, cuMemAllocPitch_v2,                                                \
      (CUdeviceptr *dptr, size_t *pPitch, size_t WidthInBytes, size_t Height,                      \
       unsigned int ElementSizeBytes))                                                             \
    X(cuMemFree, 3020, 0, cuMemFree_v2, (CUdeviceptr dptr))                                        \
    X(cuMemAllocManaged, 6000, 0, cuMemAllocManaged,                                               \
      (CUdeviceptr *dptr, size_t bytesize, unsigned int flags))                                    \
    X(cuMemAllocAsync, 11020, 0, cuMemAllocAsync,                                                  \
      (CUdeviceptr *dptr, size_t bytesize, CUstream hStream))                                      \
    X(cuMemAllocAsync, 11020, 1, cuMemAllocAsync_ptsz,                                             \
      (CUdeviceptr *dptr, size_t bytesize, CUstream hStream))                                      \
    X(cuMemAllocFromPoolAsync, 11020, 0, cuMemAllocFromPoolAsync,                                  \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                   \
    X(cuMemAllocFromPoolAsync, 11020, 1, cuMemAllocFromPoolAsync_ptsz,                             \
      (CUdeviceptr *dptr, size_t bytesize, CUmemoryPool pool, CUstream hStream))                   \
    X(cuMemFreeAsync, 11020, 0, cuMemFreeAsync, (CUdeviceptr dptr, CUstream hStream))              \
    X(cuMemFreeAsync, 11020, 1, cuMemFreeAsync_ptsz, (CUdeviceptr dptr, CUstream hStream))         \
    X(cuDeviceGetDefaultMemPool, 11020, 0, cuDeviceGetDefaultMemPool,                              \
      (CUmemoryPool *pool_out, CUdevice dev))                                                      \
    X(cuMemPoolCreate, 11020, 0, cuMemPoolCreate,                                                  \
      (CUmemoryPool *pool, const CUmemPoolProps *poolProps))                                       \
    X(cuMemPoolDestroy, 11020, 0, cuMemPoolDestroy, (CUmemoryPool pool))                           \
    X(cuMemPoolTrimTo, 11020, 0, cuMemPoolTrimTo, (CUmemoryPool pool, size_t minBytesToKeep))      \
    X(cuMemPoolGetAttribute, 11020, 0, cuMemPoolGetAttribute,                                      \
      (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                                  \
    X(cuMemPoolSetAttribute, 11020, 0, cuMemPoolSetAttribute,                                      \
      (CUmemoryPool pool, CUmemPool_attribute attr, void *value))                                  \
    X(cuDeviceGetMemPool, 11020, 0, cuDeviceGetMemPool, (CUmemoryPool *pool, CUdevice dev))        \
    X(cuDeviceSetMemPool, 11020, 0, cuDeviceSetMemPool, (CUdevice dev, CUmemoryPool pool))         \
    /* sharing between processes */                                                                \
    X(cuIpcGetMemHandle, 4010, 0, cuIpcGetMemHandle, (CUipcMemHandle *pHandle, CUdeviceptr dptr))  \
    X(cuIpcOpenMemHandle, 11000, 0, cuIpcOpenMemHandle_v2,                                         \
      (CUdeviceptr *pdptr, CUipcMemHandle handle, unsigned int Flags))                             \
    X(cuIpcCloseMemHandle, 4010, 0, cuIpcCloseMemHandle, (CUdeviceptr dptr))                       \
    X(cuMemExportToShareableHandle, 10020, 0, cuMemExportToShareableHandle,                        \
      (void *shareableHandle, CUmemGenericAllocationHandle handle,                                 \
       CUmemAllocationHandleType handleType, unsigned long long flags))                            \
    X(cuMemImportFromShareableHandle, 10020, 0, cuMemImportFromShareableHandle,                    \
      (CUmemGenericAllocationHandle *handle, void *osHandle,                                       \
       CUmemAllocationHandleType shHandleType))                                                    \
    X(cuMemCreate, 10020, 0, cuMemCreate,                                                          \
      (CUmemGenericAllocationHandle *handle, size_t size, const CUmemAllocationProp *prop,         \
       unsigned long long flags))                                                                  \
    X(cuMemRelease, 10020, 0, cuMemRelease, (CUmemGenericAllocationHandle handle))                 \
    X(cuMemAddressReserve, 10020, 0, cuMemAddressReserve,                                          \
      (CUdeviceptr *ptr, size_t size, size_t alignment, CUdeviceptr addr,                          \
       unsigned long long flags))                                                                  \
    X(cuMemAddressFree, 10020, 0, cuMemAddressFree, (CUdeviceptr ptr, size_t size))                \
    X(cuMemMap, 10020, 0, cuMemMap,                                                                \
      (CUdeviceptr ptr, size_t size, size_t offset, CUmemGenericAllocationHandle handle,           \
       unsigned long long flags))                                                                  \
    X(cuMemUnmap, 10020, 0, cuMemUnmap, (CUdeviceptr ptr, size_t size))                            \
    X(cuMemSetAccess, 10020, 0, cuMemSetAccess,                                                    \
      (CUdeviceptr ptr, size_t size, const CUmemAccessDesc *desc, size_t count))                   \
    X(cuMemGetAllocationGranularity, 10020, 0, cuMemGetAllocationGranularity,                      \
      (size_t *granularity, const CUmemAllocationProp *prop,                                       \
       CUmemAllocationGranularity_flags option))                                                   \
    X(cuArrayCreate, 3020, 0, cuArrayCreate_v2,                                                    \
      (CUarray *pHandle, const CUDA_ARRAY_DESCRIPTOR *pAllocateArray))                             \
    X(cuArray3DCreate, 3020, 0, cuArray3DCreate_v2,                                                \
      (CUarray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pAllocateArray))                           \
    X(cuArrayDestroy, 2000, 0, cuArrayDestroy, (CUarray hArray))                                   \
    X(cuMipmappedArrayCreate, 5000, 0, cuMipmappedArrayCreate,                                     \
      (CUmipmappedArray *pHandle, const CUDA_ARRAY3D_DESCRIPTOR *pMipmappedArrayDesc,              \
       unsigned int numMipmapLevels))                                                              \
    X(cuMipmappedArrayDestroy, 5000, 0, cuMipmappedArrayDestroy,                                   \
      (CUmipmappedArray hMipmappedArray))                                                          \
    /* copies and memsets: validated, no data moves */                                             \
    X(cuMemcpyHtoD, 3020, 0, cuMemcpyHtoD_v2,                                                      \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))                              \
    X(cuMemcpyHtoD, 7000, 1, cuMemcpyHtoD_v2_ptds,                                                 \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount))                              \
    X(cuMemcpyDtoH, 3020, 0, cuMemcpyDtoH_v2,                                                      \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))                                    \
    X(cuMemcpyDtoH, 7000, 1, cuMemcpyDtoH_v2_ptds,                                                 \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount))                                    \
    X(cuMemcpyDtoD, 3020, 0, cuMemcpyDtoD_v2,                                                      \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))                            \
    X(cuMemcpyDtoD, 7000, 1, cuMemcpyDtoD_v2_ptds,                                                 \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount))                            \
    X(cuMemcpyHtoDAsync, 3020, 0, cuMemcpyHtoDAsync_v2,                                            \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream))            \
    X(cuMemcpyHtoDAsync, 7000, 1, cuMemcpyHtoDAsync_v2_ptsz,                                       \
      (CUdeviceptr dstDevice, const void *srcHost, size_t ByteCount, CUstream hStream))            \
    X(cuMemcpyDtoHAsync, 3020, 0, cuMemcpyDtoHAsync_v2,                                            \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))                  \
    X(cuMemcpyDtoHAsync, 7000, 1, cuMemcpyDtoHAsync_v2_ptsz,                                       \
      (void *dstHost, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))                  \
    X(cuMemcpyDtoDAsync, 3020, 0, cuMemcpyDtoDAsync_v2,                                            \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))          \
    X(cuMemcpyDtoDAsync, 7000, 1, cuMemcpyDtoDAsync_v2_ptsz,                                       \
      (CUdeviceptr dstDevice, CUdeviceptr srcDevice, size_t ByteCount, CUstream hStream))          \
    X(cuMemsetD8, 3020, 0, cuMemsetD8_v2, (CUdeviceptr dstDevice, unsigned char uc, size_t N))     \
    X(cuMemsetD8, 7000, 1, cuMemsetD8_v2_ptds, (CUdeviceptr dstDevice, unsigned char uc, size_t N)) \
    X(cuMemsetD32, 3020, 0, cuMemsetD32_v2, (CUdeviceptr dstDevice, unsigned int ui, size_t N))    \
    X(cuMemsetD32, 7000, 1, cuMemsetD32_v2_ptds,                                                   \
      (CUdeviceptr dstDevice, unsigned int ui, size_t N))                                          \
    /* streams */                                                                                  \
    X(cuStreamCreate, 2000, 0, cuStreamCreate, (CUstream *phStream, unsigned int Flags))           \
    X(cuStreamCreateWithPriority, 5050, 0, cuStreamCreateWithPriority,                             \
      (CUstream *phStream, unsigned int flags, int priority))                                      \
    X(cuStreamDestroy, 4000, 0, cuStreamDestroy_v2, (CUstream hStream))                            \
    X(cuStreamSynchronize, 2000, 0, cuStreamSynchronize, (CUstream hStream))                       \
    X(cuStreamSynchronize, 7000, 1, cuStreamSynchronize_ptsz, (CUstream hStream))                  \
    X(cuStreamQuery, 2000, 0, cuStreamQuery, (CUstream hStream))                                   \
    X(cuStreamQuery, 7000, 1, cuStreamQuery_ptsz, (CUstream hStream))                              \
    X(cuStreamWaitEvent, 3020, 0, cuStreamWaitEvent,                                               \
      (CUstream hStream, CUevent hEvent, unsigned int Flags))                                      \
    X(cuStreamWaitEvent, 7000, 1, cuStreamWaitEvent_ptsz,                                          \
      (CUstream hStream, CUevent hEvent, unsigned int Flags))                                      \
    /* graphs, by stream capture only; below 10010 the legacy ABI without a mode (GLOBAL) */       \
    X(cuStreamBeginCapture, 10000, 0, cuStreamBeginCapture, (CUstream hStream))                    \
    X(cuStreamBeginCapture, 10000, 1, cuStreamBeginCapture_ptsz, (CUstream hStream))               \
    X(cuStreamBeginCapture, 10010, 0, cuStreamBeginCapture_v2,                                     \
      (CUstream hStream, CUstreamCaptureMode mode))                                                \
    X(cuStreamBeginCapture, 10010, 1, cuStreamBeginCapture_v2_ptsz,                                \
      (CUstream hStream, CUstreamCaptureMode mode))                                                \
    X(cuStreamEndCapture, 10000, 0, cuStreamEndCapture, (CUstream hStream, CUgraph *phGraph))      \
    X(cuStreamEndCapture, 10000, 1, cuStreamEndCapture_ptsz, (CUstream hStream, CUgraph *phGraph)) \
    X(cuStreamIsCapturing, 10000, 0, cuStreamIsCapturing,                                          \
      (CUstream hStream, CUstreamCaptureStatus *captureStatus))                                    \
    X(cuStreamIsCapturing, 10000, 1, cuStreamIsCapturing_ptsz,                                     \
      (CUstream hStream, CUstreamCaptureStatus *captureStatus))                                    \
    X(cuThreadExchangeStreamCaptureMode, 10010, 0, cuThreadExchangeStreamCaptureMode,              \
      (CUstreamCaptureMode *mode))                                                                 \
    X(cuGraphInstantiateWithFlags, 11040, 0, cuGraphInstantiateWithFlags,                          \
      (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags))                        \
    X(cuGraphInstantiate, 10000, 0, cuGraphInstantiate,                                            \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
       size_t bufferSize))                                                                         \
    X(cuGraphInstantiate, 11000, 0, cuGraphInstantiate_v2,                                         \
      (CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,        \
       size_t bufferSize))                                                                         \
    X(cuGraphInstantiate, 12000, 0, cuGraphInstantiateWithFlags,                                   \
      (CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags))                        \
    X(cuGraphLaunch, 10000, 0, cuGraphLaunch, (CUgraphExec hGraphExec, CUstream hStream))          \
    X(cuGraphLaunch, 10000, 1, cuGraphLaunch_ptsz, (CUgraphExec hGraphExec, CUstream hStream))     \
    X(cuGraphExecDestroy, 10000, 0, cuGraphExecDestroy, (CUgraphExec hGraphExec))                  \
    X(cuGraphDestroy, 10000, 0, cuGraphDestroy, (CUgraph hGraph))                                  \
    /* graph memory nodes */                                                                       \
    X(cuGraphCreate, 10000, 0, cuGraphCreate, (CUgraph *phGraph, unsigned int flags))              \
    X(cuGraphAddMemAllocNode, 11040, 0, cuGraphAddMemAllocNode,                                    \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,                  \
       size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams))                            \
    X(cuGraphAddMemFreeNode, 11040, 0, cuGraphAddMemFreeNode,                                      \
      (CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,                  \
       size_t numDependencies, CUdeviceptr dptr))                                                  \
    X(cuGraphUpload, 11010, 0, cuGraphUpload, (CUgraphExec hGraphExec, CUstream hStream))          \
    X(cuGraphUpload, 11010, 1, cuGraphUpload_ptsz, (CUgraphExec hGraphExec, CUstream hStream))     \
    X(cuDeviceGraphMemTrim, 11040, 0, cuDeviceGraphMemTrim, (CUdevice device))                     \
    X(cuDeviceGetGraphMemAttribute, 11040, 0, cuDeviceGetGraphMemAttribute,                        \
      (CUdevice device, CUgraphMem_attribute attr, void *value))                                   \
    X(cuDeviceSetGraphMemAttribute, 11040, 0, cuDeviceSetGraphMemAttribute,                        \
      (CUdevice device, CUgraphMem_attribute attr, void *value))                                   \
    /* events */                                                                                   \
    X(cuEventCreate, 2000, 0, cuEventCreate, (CUevent *phEvent, unsigned int Flags))               \
    X(cuEventRecord, 2000, 0, cuEventRecord, (CUevent hEvent, CUstream hStream))                   \
    X(cuEventRecord, 7000, 1, cuEventRecord_ptsz, (CUevent hEvent, CUstream hStream))              \
    X(cuEventQuery, 2000, 0, cuEventQuery, (CUevent hEvent))                                       \
    X(cuEventSynchronize, 2000, 0, cuEventSynchronize, (CUevent hEvent))                           \
    X(cuEventElapsedTime, 2000, 0, cuEventElapsedTime,                                             \
      (float *pMilliseconds, CUevent hStart, CUevent hEnd))                                        \
    X(cuEventElapsedTime, 12080, 0, cuEventElapsedTime_v2,                                         \
      (float *pMilliseconds, CUevent hStart, CUevent hEnd))                                        \
    X(cuEventDestroy, 4000, 0, cuEventDestroy_v2, (CUevent hEvent))                                \
    /* launches */                                                                                 \
    X(cuLaunchKernel, 4000, 0, cuLaunchKernel, SIM_LAUNCH_PARAMS)                                  \
    X(cuLaunchKernel, 7000, 1, cuLaunchKernel_ptsz, SIM_LAUNCH_PARAMS)                             \
    X(cuLaunchKernelEx, 11060, 0, cuLaunchKernelEx,                                                \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))             \
    X(cuLaunchKernelEx, 11060, 1, cuLaunchKernelEx_ptsz,                                           \
      (const CUlaunchConfig *config, CUfunction f, void **kernelParams, void **extra))             \
    X(cuLaunchCooperativeKernel, 9000, 0, cuLaunchCooperativeKernel, SIM_COOP_PARAMS)              \
    X(cuLaunchCooperativeKernel, 9000, 1, cuLaunchCooperativeKernel_ptsz, SIM_COOP_PARAMS)

/* Exported for programs linked against them, but no base name maps to them:
 * cuCtxCreate_v3 (affinity) was never the default cuCtxCreate. */
#define SIM_CUDA_API_EXPORT_ONLY(X)                                                                \
    X(cuCtxCreate_v3, 11040, 0, cuCtxCreate_v3,                                                    \
      (CUcontext *pctx, CUexecAffinityParam *paramsArray, int numParams, unsigned int flags,       \
       CUdevice dev))

#define SIM_DECLARE(base, ver, ptds, sym, params) SIM_EXPORT CUresult sym params;
SIM_CUDA_API(SIM_DECLARE)
SIM_CUDA_API_EXPORT_ONLY(SIM_DECLARE)
#undef SIM_DECLARE

#endif /* VCUDA_GPUSIM_API_H */
