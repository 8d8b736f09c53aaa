/* CUresult names and descriptions, generated once from cuda.h (CUDA 13.0):
 * value, name, first sentence of the enumerator's documentation. */
#define SIM_CU_ERRORS(X) \
    X(0, CUDA_SUCCESS, "The API call returned with no errors") \
    X(1, CUDA_ERROR_INVALID_VALUE, "one or more of the parameters passed to the API call is not within an acceptable range of values") \
    X(2, CUDA_ERROR_OUT_OF_MEMORY, "The API call failed because it was unable to allocate enough memory or other resources to perform the requested opera...") \
    X(3, CUDA_ERROR_NOT_INITIALIZED, "the CUDA driver has not been initialized with cuInit() or that initialization has failed") \
    X(4, CUDA_ERROR_DEINITIALIZED, "the CUDA driver is in the process of shutting down") \
    X(5, CUDA_ERROR_PROFILER_DISABLED, "profiler is not initialized for this run") \
    X(6, CUDA_ERROR_PROFILER_NOT_INITIALIZED, "This error return is deprecated as of CUDA 5.0. It is no longer an error to attempt to enable/disable the profiling v...") \
    X(7, CUDA_ERROR_PROFILER_ALREADY_STARTED, "This error return is deprecated as of CUDA 5.0. It is no longer an error to call cuProfilerStart() when profiling is ...") \
    X(8, CUDA_ERROR_PROFILER_ALREADY_STOPPED, "This error return is deprecated as of CUDA 5.0. It is no longer an error to call cuProfilerStop() when profiling is a...") \
    X(34, CUDA_ERROR_STUB_LIBRARY, "the CUDA driver that the application has loaded is a stub library") \
    X(36, CUDA_ERROR_CALL_REQUIRES_NEWER_DRIVER, "the API call requires a newer CUDA driver than the one currently installed") \
    X(46, CUDA_ERROR_DEVICE_UNAVAILABLE, "requested CUDA device is unavailable at the current time") \
    X(100, CUDA_ERROR_NO_DEVICE, "no CUDA-capable devices were detected by the installed CUDA driver") \
    X(101, CUDA_ERROR_INVALID_DEVICE, "the device ordinal supplied by the user does not correspond to a valid CUDA device or that the action requested is in...") \
    X(102, CUDA_ERROR_DEVICE_NOT_LICENSED, "This error indicates that the Grid license is not applied") \
    X(200, CUDA_ERROR_INVALID_IMAGE, "the device kernel image is invalid") \
    X(201, CUDA_ERROR_INVALID_CONTEXT, "This most frequently indicates that there is no context bound to the current thread") \
    X(202, CUDA_ERROR_CONTEXT_ALREADY_CURRENT, "This indicated that the context being supplied as a parameter to the API call was already the active context") \
    X(205, CUDA_ERROR_MAP_FAILED, "a map or register operation has failed") \
    X(206, CUDA_ERROR_UNMAP_FAILED, "an unmap or unregister operation has failed") \
    X(207, CUDA_ERROR_ARRAY_IS_MAPPED, "the specified array is currently mapped and thus cannot be destroyed") \
    X(208, CUDA_ERROR_ALREADY_MAPPED, "the resource is already mapped") \
    X(209, CUDA_ERROR_NO_BINARY_FOR_GPU, "there is no kernel image available that is suitable for the device") \
    X(210, CUDA_ERROR_ALREADY_ACQUIRED, "a resource has already been acquired") \
    X(211, CUDA_ERROR_NOT_MAPPED, "a resource is not mapped") \
    X(212, CUDA_ERROR_NOT_MAPPED_AS_ARRAY, "a mapped resource is not available for access as an array") \
    X(213, CUDA_ERROR_NOT_MAPPED_AS_POINTER, "a mapped resource is not available for access as a pointer") \
    X(214, CUDA_ERROR_ECC_UNCORRECTABLE, "an uncorrectable ECC error was detected during execution") \
    X(215, CUDA_ERROR_UNSUPPORTED_LIMIT, "the CUlimit passed to the API call is not supported by the active device") \
    X(216, CUDA_ERROR_CONTEXT_ALREADY_IN_USE, "the CUcontext passed to the API call can only be bound to a single CPU thread at a time but is already bound to a CPU...") \
    X(217, CUDA_ERROR_PEER_ACCESS_UNSUPPORTED, "peer access is not supported across the given devices") \
    X(218, CUDA_ERROR_INVALID_PTX, "a PTX JIT compilation failed") \
    X(219, CUDA_ERROR_INVALID_GRAPHICS_CONTEXT, "an error with OpenGL or DirectX context") \
    X(220, CUDA_ERROR_NVLINK_UNCORRECTABLE, "an uncorrectable NVLink error was detected during the execution") \
    X(221, CUDA_ERROR_JIT_COMPILER_NOT_FOUND, "the PTX JIT compiler library was not found") \
    X(222, CUDA_ERROR_UNSUPPORTED_PTX_VERSION, "the provided PTX was compiled with an unsupported toolchain") \
    X(223, CUDA_ERROR_JIT_COMPILATION_DISABLED, "the PTX JIT compilation was disabled") \
    X(224, CUDA_ERROR_UNSUPPORTED_EXEC_AFFINITY, "the CUexecAffinityType passed to the API call is not supported by the active device") \
    X(225, CUDA_ERROR_UNSUPPORTED_DEVSIDE_SYNC, "the code to be compiled by the PTX JIT contains unsupported call to cudaDeviceSynchronize") \
    X(226, CUDA_ERROR_CONTAINED, "an exception occurred on the device that is now contained by the GPU's error containment capability") \
    X(300, CUDA_ERROR_INVALID_SOURCE, "the device kernel source is invalid") \
    X(301, CUDA_ERROR_FILE_NOT_FOUND, "the file specified was not found") \
    X(302, CUDA_ERROR_SHARED_OBJECT_SYMBOL_NOT_FOUND, "a link to a shared object failed to resolve") \
    X(303, CUDA_ERROR_SHARED_OBJECT_INIT_FAILED, "initialization of a shared object failed") \
    X(304, CUDA_ERROR_OPERATING_SYSTEM, "an OS call failed") \
    X(400, CUDA_ERROR_INVALID_HANDLE, "a resource handle passed to the API call was not valid") \
    X(401, CUDA_ERROR_ILLEGAL_STATE, "a resource required by the API call is not in a valid state to perform the requested operation") \
    X(402, CUDA_ERROR_LOSSY_QUERY, "an attempt was made to introspect an object in a way that would discard semantically important information") \
    X(500, CUDA_ERROR_NOT_FOUND, "a named symbol was not found") \
    X(600, CUDA_ERROR_NOT_READY, "asynchronous operations issued previously have not completed yet") \
    X(700, CUDA_ERROR_ILLEGAL_ADDRESS, "While executing a kernel, the device encountered a load or store instruction on an invalid memory address") \
    X(701, CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES, "a launch did not occur because it did not have appropriate resources") \
    X(702, CUDA_ERROR_LAUNCH_TIMEOUT, "the device kernel took too long to execute") \
    X(703, CUDA_ERROR_LAUNCH_INCOMPATIBLE_TEXTURING, "This error indicates a kernel launch that uses an incompatible texturing mode") \
    X(704, CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED, "This error indicates that a call to cuCtxEnablePeerAccess() is trying to re-enable peer access to a context which has...") \
    X(705, CUDA_ERROR_PEER_ACCESS_NOT_ENABLED, "This error indicates that cuCtxDisablePeerAccess() is trying to disable peer access which has not been enabled yet vi...") \
    X(708, CUDA_ERROR_PRIMARY_CONTEXT_ACTIVE, "This error indicates that the primary context for the specified device has already been initialized") \
    X(709, CUDA_ERROR_CONTEXT_IS_DESTROYED, "This error indicates that the context current to the calling thread has been destroyed using cuCtxDestroy, or is a pr...") \
    X(710, CUDA_ERROR_ASSERT, "A device-side assert triggered during kernel execution") \
    X(711, CUDA_ERROR_TOO_MANY_PEERS, "This error indicates that the hardware resources required to enable peer access have been exhausted for one or more o...") \
    X(712, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED, "This error indicates that the memory range passed to cuMemHostRegister() has already been registered") \
    X(713, CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED, "This error indicates that the pointer passed to cuMemHostUnregister() does not correspond to any currently registered...") \
    X(714, CUDA_ERROR_HARDWARE_STACK_ERROR, "While executing a kernel, the device encountered a stack error") \
    X(715, CUDA_ERROR_ILLEGAL_INSTRUCTION, "While executing a kernel, the device encountered an illegal instruction") \
    X(716, CUDA_ERROR_MISALIGNED_ADDRESS, "While executing a kernel, the device encountered a load or store instruction on a memory address which is not aligned") \
    X(717, CUDA_ERROR_INVALID_ADDRESS_SPACE, "While executing a kernel, the device encountered an instruction which can only operate on memory locations in certain...") \
    X(718, CUDA_ERROR_INVALID_PC, "While executing a kernel, the device program counter wrapped its address space") \
    X(719, CUDA_ERROR_LAUNCH_FAILED, "An exception occurred on the device while executing a kernel") \
    X(720, CUDA_ERROR_COOPERATIVE_LAUNCH_TOO_LARGE, "This error indicates that the number of blocks launched per grid for a kernel that was launched via either cuLaunchCo...") \
    X(721, CUDA_ERROR_TENSOR_MEMORY_LEAK, "An exception occurred on the device while exiting a kernel using tensor memory: the tensor memory was not completely ...") \
    X(800, CUDA_ERROR_NOT_PERMITTED, "This error indicates that the attempted operation is not permitted") \
    X(801, CUDA_ERROR_NOT_SUPPORTED, "This error indicates that the attempted operation is not supported on the current system or device") \
    X(802, CUDA_ERROR_SYSTEM_NOT_READY, "This error indicates that the system is not yet ready to start any CUDA work") \
    X(803, CUDA_ERROR_SYSTEM_DRIVER_MISMATCH, "This error indicates that there is a mismatch between the versions of the display driver and the CUDA driver") \
    X(804, CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE, "This error indicates that the system was upgraded to run with forward compatibility but the visible hardware detected...") \
    X(805, CUDA_ERROR_MPS_CONNECTION_FAILED, "This error indicates that the MPS client failed to connect to the MPS control daemon or the MPS server") \
    X(806, CUDA_ERROR_MPS_RPC_FAILURE, "This error indicates that the remote procedural call between the MPS server and the MPS client failed") \
    X(807, CUDA_ERROR_MPS_SERVER_NOT_READY, "This error indicates that the MPS server is not ready to accept new MPS client requests") \
    X(808, CUDA_ERROR_MPS_MAX_CLIENTS_REACHED, "This error indicates that the hardware resources required to create MPS client have been exhausted") \
    X(809, CUDA_ERROR_MPS_MAX_CONNECTIONS_REACHED, "This error indicates the the hardware resources required to support device connections have been exhausted") \
    X(810, CUDA_ERROR_MPS_CLIENT_TERMINATED, "This error indicates that the MPS client has been terminated by the server") \
    X(811, CUDA_ERROR_CDP_NOT_SUPPORTED, "This error indicates that the module is using CUDA Dynamic Parallelism, but the current configuration, like MPS, does...") \
    X(812, CUDA_ERROR_CDP_VERSION_MISMATCH, "This error indicates that a module contains an unsupported interaction between different versions of CUDA Dynamic Par...") \
    X(900, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED, "This error indicates that the operation is not permitted when the stream is capturing") \
    X(901, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED, "This error indicates that the current capture sequence on the stream has been invalidated due to a previous error") \
    X(902, CUDA_ERROR_STREAM_CAPTURE_MERGE, "This error indicates that the operation would have resulted in a merge of two independent capture sequences") \
    X(903, CUDA_ERROR_STREAM_CAPTURE_UNMATCHED, "This error indicates that the capture was not initiated in this stream") \
    X(904, CUDA_ERROR_STREAM_CAPTURE_UNJOINED, "This error indicates that the capture sequence contains a fork that was not joined to the primary stream") \
    X(905, CUDA_ERROR_STREAM_CAPTURE_ISOLATION, "This error indicates that a dependency would have been created which crosses the capture sequence boundary") \
    X(906, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "This error indicates a disallowed implicit dependency on a current capture sequence from cudaStreamLegacy") \
    X(907, CUDA_ERROR_CAPTURED_EVENT, "This error indicates that the operation is not permitted on an event which was last recorded in a capturing stream") \
    X(908, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD, "A stream capture sequence not initiated with the CU_STREAM_CAPTURE_MODE_RELAXED argument to cuStreamBeginCapture was ...") \
    X(909, CUDA_ERROR_TIMEOUT, "This error indicates that the timeout specified for the wait operation has lapsed") \
    X(910, CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE, "This error indicates that the graph update was not performed because it included changes which violated constraints s...") \
    X(911, CUDA_ERROR_EXTERNAL_DEVICE, "an async error has occurred in a device outside of CUDA. If CUDA was waiting for an external device's signal before c...") \
    X(912, CUDA_ERROR_INVALID_CLUSTER_SIZE, "Indicates a kernel launch error due to cluster misconfiguration") \
    X(913, CUDA_ERROR_FUNCTION_NOT_LOADED, "Indiciates a function handle is not loaded when calling an API that requires a loaded function") \
    X(914, CUDA_ERROR_INVALID_RESOURCE_TYPE, "This error indicates one or more resources passed in are not valid resource types for the operation") \
    X(915, CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION, "This error indicates one or more resources are insufficient or non-applicable for the operation") \
    X(916, CUDA_ERROR_KEY_ROTATION, "This error indicates that an error happened during the key rotation sequence") \
    X(999, CUDA_ERROR_UNKNOWN, "an unknown internal error has occurred")
