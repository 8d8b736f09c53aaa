/* vcudasim: introspection of the vcuda GPU simulator's shared state.
 *
 * Exported by libvcuda-sim-cuda.so (py_vcuda/sim.py reads it through cffi).
 * Reading never needs cuInit and never attaches the caller as a GPU process.
 *
 * Simulator conventions other components rely on:
 *  - Kernel duration: a launch runs for the microseconds in the uint64_t that
 *    kernelParams[0] points to, or in the first 8 bytes of the
 *    CU_LAUNCH_PARAM_BUFFER_POINTER buffer when `extra` is used (0 without
 *    parameters). Grid and block sizes do not matter.
 *  - Execution: a device runs one kernel at a time, never two at once. As a
 *    GPU without MPS, it time-slices between processes: round-robin in slot
 *    order, slices of VCUDA_SIM_TIMESLICE_US (default 2000); a process runs
 *    until its slice ends or it has nothing queued, then the next process
 *    with queued work gets a fresh slice (a process alone runs on). Within a
 *    process, all its kernels on a device (every stream and context) run in
 *    launch order; graph launches are their kernels in order. A slice may
 *    end inside a kernel, which resumes in the process's next slice.
 *  - Each process's queue per device is a count of nanoseconds: queued (all
 *    launched work) and served (busy_ns); a kernel completes when served
 *    reaches the queued count just after its launch. Stream, event and
 *    context completion, cuStreamQuery/cuEventQuery and the synchronize
 *    calls follow that. A wait sleeps until the completion predicted if no
 *    process launches more, then looks again (at least every 10 ms while
 *    other processes have work queued). As the driver's, a synchronize
 *    busy-waits unless its context was created with
 *    CU_CTX_SCHED_BLOCKING_SYNC (cuEventSynchronize: unless the event has
 *    CU_EVENT_BLOCKING_SYNC), so it returns within a microsecond of the
 *    completion: it sleeps until VCUDA_SIM_SPIN_US (read by each process at
 *    cuInit; default 100, 0..1000000) before it and spins the rest. A
 *    blocking one wakes when the OS wakes it (1 us timer slack).
 *  - A stream holds at most VCUDA_SIM_MAX_PENDING (default 1024) kernels
 *    not yet complete; a launch beyond that blocks until its oldest completes.
 *  - Busy time (device and process busy_ns, NVML utilization) is charged as
 *    work is served; kernels are counted at launch. A process that exits or
 *    dies has its queued work dropped (a dead one within one slice of the
 *    next look at the device); what it was served stays in device totals.
 *  - cuEventElapsedTime: an event completes when the work before it on its
 *    stream does (at its record time if that was already done), so the
 *    elapsed time includes other processes' slices in between, as on
 *    hardware. Each process keeps its last 64 service stretches per state
 *    file to time completions; an older one is timed at the start of the
 *    oldest kept (no earlier than its record time).
 *  - Memory charged: cuMemAlloc* exactly the bytes asked (pitch: pitch*Height,
 *    pitch = WidthInBytes rounded up to 512); managed and stream-ordered
 *    allocations in full, at once; cuMemCreate its size (multiple of 2 MiB),
 *    returned once released and unmapped; each context the configured
 *    overhead, taken as its creation starts: creating a context then takes
 *    VCUDA_SIM_CTX_CREATE_US (read at cuInit; default 0, at most 10 s), during
 *    which other processes run. Likewise nvmlDeviceGetMemoryInfo (and _v2)
 *    waits VCUDA_SIM_NVML_MEMINFO_US (read at nvmlInit; default 0, at most
 *    10 s) before it reads. CUDA arrays: Width * max(Height,1) * max(Depth,1) *
 *    NumChannels * element size (1: [UN]SIGNED_INT8, UNORM/SNORM_INT8X*,
 *    UNORM_INT_101010_2; 2: [UN]SIGNED_INT16, HALF, UNORM/SNORM_INT16X*;
 *    4: [UN]SIGNED_INT32, FLOAT; other formats are refused with
 *    CUDA_ERROR_NOT_SUPPORTED); mipmapped arrays: the sum over levels
 *    0..n-1 with each nonzero dimension max(1, d >> level).
 *  - cuCtxDestroy (and a primary context's last release or reset) frees
 *    every allocation and array made in that context; VMM handles are
 *    per process and survive it.
 *  - A process's memory is returned when it exits or dies (pid + start time
 *    identify it).
 *  - Topology (NVML): device i is PCI 0000:(0x10+i):00.0; VCUDA_SIM_NUMA
 *    (0,0,1,1) gives NUMA nodes (unset: NVML_ERROR_NOT_SUPPORTED) and CPU
 *    affinity (the machine's CPUs split evenly among the nodes);
 *    VCUDA_SIM_NVLINK (0-1,2-3) one NVLink per pair, link k of a device
 *    leading to its k-th peer by index; VCUDA_SIM_NVLINK=switch: 18 active
 *    links per device, link k to NVSwitch k % 4 (PCI 0000:(0xC0+k%4):00.0,
 *    remote device type SWITCH); common ancestor: SYSTEM across NUMA nodes,
 *    NODE otherwise.
 *  - XID events (nvmlEventTypeXidCriticalError) come only from
 *    vcudasim_inject_xid and reach every event set registered on the device
 *    before the injection, in every process; each device keeps its last 64.
 *  - A lost device (vcudasim_set_lost) answers every NVML query with
 *    NVML_ERROR_GPU_IS_LOST; CUDA is not affected.
 *  - MIG (gpusim/src/mig.c, nvml_mig.c). VCUDA_SIM_MIG, one ';'-separated
 *    entry per device: "" not MIG-capable, "off", "on", or
 *    "on:1g.10gb,1g.10gb,3g.40gb" (GPU instances, each with a compute
 *    instance spanning it, created in order, each at the highest free
 *    valid start, as nvmlDeviceCreateGpuInstance does here: small ones
 *    fill the GPU from the end, so creating larger profiles first always
 *    finds room when the layout fits).
 *    VCUDA_SIM_MIG_MODEL (h100-80gb, default, or a100-40gb) gives the
 *    profiles (NVIDIA's MIG user guide: slices, memory, SMs, engines,
 *    instance counts, placements) and a MIG-capable device's memory, SMs
 *    and name. A GPU has 8 memory slices and 7 compute slices; a GPU
 *    instance fits when its placement is one its profile allows, its memory
 *    slices are free, compute slices stay within 7 and its profile's
 *    instance count (and one OFA) is not exceeded. NVML's MIG calls work as
 *    NVML's; mode changes take effect at once on an idle GPU (busy:
 *    NVML_ERROR_IN_USE). Each MIG device (GPU instance + compute instance)
 *    is a simulated device of its own: index 16 + gpu * 7 + slot for
 *    vcudasim_device_info / vcudasim_processes, its own memory, SMs and
 *    timeline (instances never time-slice with each other), UUID "MIG-" + a
 *    hash of the parent UUID and the instance ids. CUDA sees a GPU in MIG
 *    mode only as its MIG devices; CUDA_VISIBLE_DEVICES=MIG-<uuid> (or a
 *    prefix, or MIG-GPU-<uuid>/<gi>/<ci>) names one.
 *
 * What the device holds beyond the pointers (issue 12). Every figure below is
 * charged to the process on its device at the moment said, shows in
 * cuMemGetInfo, nvmlDeviceGetMemoryInfo and the process's NVML usedGpuMemory,
 * and is broken down by VCUDASIM_MEM_* in vcudasim_process.mem / .mem of
 * vcudasim_device. Configuration (VCUDA_SIM_*, read when the state file is
 * created): SMS (132), THREADS_PER_SM (2048), POOL_CHUNK (32Mi, a multiple of
 * 2Mi), KERNEL_CODE (0: code bytes of a kernel no descriptor describes).
 *
 *  Stream-ordered pools (VCUDASIM_MEM_POOL). Each device has a default pool
 *  (cuDeviceGetDefaultMemPool); cuMemPoolCreate makes more (maxSize honoured,
 *  0 = no cap); cuDeviceSetMemPool / cuDeviceGetMemPool choose the pool
 *  cuMemAllocAsync uses; destroying the current pool makes the default
 *  current again; the default pool cannot be destroyed (INVALID_VALUE).
 *    - A pool reserves device memory in chunks of round_up(size, POOL_CHUNK)
 *      bytes, size being the allocation (rounded up to 512 bytes) that found
 *      no room: a 40 MiB allocation grows the pool by 64 MiB. The charge is
 *      the reservation: CU_MEMPOOL_ATTR_RESERVED_MEM_CURRENT of all the
 *      process's pools on the device, summed.
 *    - An allocation takes the first free extent of at least its size in the
 *      oldest chunk that has one; freed extents merge with free neighbours in
 *      the same chunk only, never across chunks. So reserved - used can be
 *      larger than any allocation that still fits, and an allocation can grow
 *      the pool although reserved - used >= its size (fragmentation).
 *      USED_MEM_CURRENT is the sum of the rounded sizes handed out.
 *    - Freed memory stays reserved (cuMemFreeAsync and cuMemFree take effect
 *      at once; there is no stream-ordered deferral). A chunk with nothing
 *      allocated in it is returned (uncharged) only by: cuMemPoolTrimTo(pool,
 *      keep) (while reserved > keep); a synchronize call - cuStreamSynchronize,
 *      cuCtxSynchronize, cuEventSynchronize - which trims every pool of the
 *      process down to its CU_MEMPOOL_ATTR_RELEASE_THRESHOLD (default 0;
 *      UINT64_MAX: never); a growth the device cannot hold, which first trims
 *      that pool to 0 and tries once more; cuMemPoolDestroy (then each chunk
 *      as it empties). Changing the threshold releases nothing by itself.
 *    - Attributes: RELEASE_THRESHOLD get/set; RESERVED_MEM_CURRENT and
 *      USED_MEM_CURRENT get; *_HIGH get, and set only to 0 (resets to the
 *      current value); REUSE_* get/set (stored, no effect).
 *    - cuMemFree / cuMemFreeAsync accept pool pointers; destroying a context
 *      returns its pool blocks to their pools (still reserved).
 *    - While a stream is captured, cuMemAllocAsync / cuMemAllocFromPoolAsync
 *      make graph allocation nodes and take nothing from the pool;
 *      cuMemFreeAsync of such an allocation makes a free node.
 *
 *  Local memory and limits (VCUDASIM_MEM_LOCAL, VCUDASIM_MEM_LIMITS). A
 *  context reserves local memory for P bytes per thread on every thread the
 *  device can hold. P is CU_LIMIT_STACK_SIZE: 1024 at creation; a launch of
 *  a function with CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES L > P first raises P to
 *  L (the driver raises the stack limit as kernels need; cuCtxGetLimit then
 *  reads L) and it never comes down by itself; cuCtxSetLimit(STACK_SIZE, v)
 *  sets P = v, down too (a later launch raises it again). What a fresh
 *  context holds is inside VCUDA_SIM_CONTEXT_OVERHEAD, so the charge is the
 *  growth:
 *      local = max(0, P - 1024) * SMS * THREADS_PER_SM
 *      limits = max(0, heap - 8 MiB) + max(0, fifo - 1 MiB)
 *               + max(0, pending - 2048) * 2048
 *  (heap: CU_LIMIT_MALLOC_HEAP_SIZE, fifo: CU_LIMIT_PRINTF_FIFO_SIZE,
 *  pending: CU_LIMIT_DEV_RUNTIME_PENDING_LAUNCH_COUNT, charged at
 *  cuCtxSetLimit.) A launch or cuCtxSetLimit whose growth does not fit returns
 *  CUDA_ERROR_OUT_OF_MEMORY and reserves nothing (the kernel is not queued;
 *  code its first launch loaded stays loaded).
 *  CU_LIMIT_DEV_RUNTIME_SYNC_DEPTH: CUDA_ERROR_UNSUPPORTED_LIMIT (compute
 *  capability 9.0); SHMEM_SIZE / CIG_ENABLED: query only. The formula is the
 *  simulator's reading of the documentation: to verify on hardware.
 *
 *  Module descriptors and lazy loading (VCUDASIM_MEM_MODULE). An image
 *  (cuModuleLoadData(Ex), cuLibraryLoadData, or the file of cuModuleLoad)
 *  that is NUL-terminated text starting with "vcudasim-module" describes its
 *  kernels; lines (separated by newlines or ';', '#' starts a comment):
 *      data <bytes>                        module globals, charged at load
 *      default local=<bytes> code=<bytes>  for kernels not listed
 *      kernel <name> local=<bytes> code=<bytes>
 *  Sizes are bytes or quantities (16Ki, 2Mi); a missing field is 0 (code:
 *  that of the last default line before it, else KERNEL_CODE; kernels not
 *  listed take the last default line). A malformed descriptor:
 *  CUDA_ERROR_INVALID_IMAGE. Any other image: every kernel has local 0 and
 *  code KERNEL_CODE. Example: "vcudasim-module;kernel big local=16Ki".
 *  CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (cuFuncGetAttribute,
 *  cuKernelGetAttribute) is the kernel's local size. Code is charged per
 *  context: with CUDA_MODULE_LOADING=LAZY (the default, read at cuInit) at a
 *  kernel's first launch in that context (a launch into a capturing stream
 *  counts); with EAGER at load for every listed kernel (libraries: only if a
 *  context is current). Module data is charged at load to the current
 *  context (a library loaded with none current: never). Unload returns both;
 *  destroying the context returns what was loaded into it.
 *
 *  Stream capture rules. A capture begun GLOBAL or THREAD_LOCAL forbids the
 *  capturing thread potentially unsafe calls (cuCtxSynchronize,
 *  cuStreamSynchronize, cuStreamQuery, cuEventSynchronize, cuEventQuery); a
 *  GLOBAL one forbids them to every other thread in GLOBAL mode too; a thread
 *  opts out with cuThreadExchangeStreamCaptureMode(RELAXED).
 *  cuCtxSynchronize is forbidden to everyone while any stream captures. A
 *  forbidden call returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the
 *  captures it concerns end with CUDA_ERROR_STREAM_CAPTURE_INVALIDATED.
 *
 *  Graph memory (VCUDASIM_MEM_GRAPH). Graph allocation nodes come from
 *  allocations on a capturing stream or cuGraphAddMemAllocNode (on a graph
 *  from cuGraphCreate; such graphs have no kernel nodes); free nodes from
 *  cuMemFreeAsync on the capturing stream or cuGraphAddMemFreeNode, for an
 *  allocation of the same graph only (else INVALID_VALUE). One device per
 *  graph. An executable graph's footprint is the peak of its live
 *  allocations in node order, each rounded up to 2 MiB; captured frees let
 *  later captured allocations reuse memory, explicitly added nodes never do.
 *  The footprint is mapped at cuGraphUpload or at a launch when not mapped
 *  yet, from the process's per-device graph reserve: it grows to the sum of
 *  the mapped footprints when that is larger (a growth that does not fit:
 *  the launch returns CUDA_ERROR_OUT_OF_MEMORY, nothing runs). The reserve
 *  never shrinks by itself - not at synchronize, not when the graph is
 *  destroyed - only cuDeviceGraphMemTrim returns what no graph holds that is
 *  executing or scheduled (its last launch not finished) or has allocations
 *  not freed in the graph still live (until cuMemFree/cuMemFreeAsync). A
 *  trimmed graph maps again at its next launch. cuDeviceGetGraphMemAttribute:
 *  USED_MEM_CURRENT = mapped footprints, RESERVED_MEM_CURRENT = the reserve,
 *  *_HIGH their high-water marks (set only to 0: reset).
 *
 *  Sharing. cuIpcGetMemHandle (a cuMemAlloc base pointer) and
 *  cuMemExportToShareableHandle (CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
 *  requested in cuMemCreate's prop) describe the allocation and its creator;
 *  the exported fd is a memfd another process obtains by any fd passing
 *  (SCM_RIGHTS, pidfd_getfd, or open("/proc/<pid>/fd/<n>")).
 *  cuIpcOpenMemHandle / cuMemImportFromShareableHandle (+ cuMemMap of the
 *  imported handle) charge the importer nothing: the memory stays charged to
 *  its creator, for as long as the creator holds it. Opening one's own IPC
 *  handle: CUDA_ERROR_INVALID_CONTEXT; a creator that is gone:
 *  CUDA_ERROR_INVALID_VALUE.
 *
 *  Host pids. A process whose environment has VCUDA_SIM_HOST_PID_OFFSET=N at
 *  cuInit pretends to live in a pid namespace: NVML
 *  (nvmlDeviceGetComputeRunningProcesses, v1/v2/v3) reports it as pid + N,
 *  the pid the host would see; vcudasim_process has both. */
#ifndef VCUDASIM_H
#define VCUDASIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VCUDASIM_API_VERSION 6 /* 2: topology, XID injection, lost devices; 3: memory breakdown, host pids;
                                  4: time slicing; 5: MIG; 6: service stretches */

/* What device memory is made of: index into vcudasim_process.mem. */
enum {
    VCUDASIM_MEM_ALLOC = 0,   /* cuMemAlloc*, managed, arrays, cuMemCreate handles ("pointers") */
    VCUDASIM_MEM_CONTEXT = 1, /* VCUDA_SIM_CONTEXT_OVERHEAD per context */
    VCUDASIM_MEM_POOL = 2,    /* stream-ordered pools' reservations */
    VCUDASIM_MEM_LOCAL = 3,   /* local memory above a fresh context's */
    VCUDASIM_MEM_LIMITS = 4,  /* malloc heap, printf FIFO, device launch pool above defaults */
    VCUDASIM_MEM_MODULE = 5,  /* module data and kernel code */
    VCUDASIM_MEM_GRAPH = 6,   /* graph-memory reserve */
    VCUDASIM_MEM_KINDS = 8    /* array size (two spare) */
};

typedef struct vcudasim_state vcudasim_state; /* an open state file */

typedef struct vcudasim_config {
    uint32_t devices;
    uint32_t max_pending;    /* queued kernels per stream before a launch blocks */
    int32_t driver_version;  /* e.g. 13000 */
    uint64_t context_overhead; /* bytes charged per context */
    uint32_t nvswitch;       /* 1: VCUDA_SIM_NVLINK=switch */
    uint32_t sms;            /* VCUDA_SIM_SMS */
    uint32_t threads_per_sm; /* VCUDA_SIM_THREADS_PER_SM */
    uint32_t mig_model;      /* VCUDA_SIM_MIG_MODEL: 0 h100-80gb, 1 a100-40gb */
    uint64_t pool_chunk;     /* VCUDA_SIM_POOL_CHUNK */
    uint64_t kernel_code;    /* VCUDA_SIM_KERNEL_CODE */
    uint32_t timeslice_us;   /* round-robin slice between processes */
    uint32_t reserved2;
} vcudasim_config;

typedef struct vcudasim_device {
    uint32_t index;          /* physical index (CUDA_VISIBLE_DEVICES not applied) */
    uint32_t processes;      /* live processes holding memory or a context on it */
    char uuid[96];
    char name[96];
    uint64_t capacity;       /* bytes */
    uint64_t used;           /* bytes, live processes only */
    uint64_t busy_ns;        /* work served so far, dead processes included */
    uint64_t kernels;        /* kernels launched, dead processes included */
    uint64_t busy_until_ns;  /* CLOCK_MONOTONIC when all queued work will have
                              * run if nothing more is launched (now if idle) */
    int32_t numa_node;       /* -1: none configured */
    uint32_t nvlink_peers;   /* bit i: NVLink to device i */
    uint32_t lost;           /* 1 while vcudasim_set_lost(..., 1) */
    uint32_t reserved;
    uint64_t xids;           /* XIDs injected so far */
    uint64_t mem[VCUDASIM_MEM_KINDS]; /* `used` broken down, live processes */
} vcudasim_device;

typedef struct vcudasim_process {
    int32_t pid;             /* as the process sees itself (getpid) */
    uint32_t contexts;
    uint64_t used;           /* bytes on this device: the sum of mem[] */
    uint64_t busy_ns;        /* kernel time served on this device */
    uint64_t kernels;        /* launched */
    int32_t host_pid;        /* what NVML reports: pid + its VCUDA_SIM_HOST_PID_OFFSET */
    uint32_t reserved;
    uint64_t mem[VCUDASIM_MEM_KINDS]; /* physical use by VCUDASIM_MEM_* */
    uint64_t pending_ns;     /* kernel time queued, not yet served */
} vcudasim_process;

/* One GPU instance (and its compute instance, the MIG device). */
typedef struct vcudasim_mig_instance {
    char profile[32];        /* "1g.10gb" */
    uint32_t gi_id;          /* GPU instance id */
    uint32_t ci_id;          /* compute instance id; UINT32_MAX: none */
    uint32_t start, size;    /* placement, in memory slices */
    uint32_t device;         /* the MIG device's index for vcudasim_device_info and
                              * vcudasim_processes (0 without a compute instance) */
    uint32_t processes;      /* live processes holding memory or a context on it */
    char uuid[96];           /* "MIG-..." ("" without a compute instance) */
    uint64_t capacity;       /* bytes */
    uint64_t used;           /* bytes, live processes only */
} vcudasim_mig_instance;

typedef struct vcudasim_mig {
    uint32_t capable;        /* 1: MIG-capable */
    uint32_t mode;           /* 1: MIG mode enabled */
    uint32_t count;          /* instances[0, count), by GPU instance id */
    uint32_t reserved;
    vcudasim_mig_instance instances[7];
} vcudasim_mig;

int vcudasim_api_version(void);

/* Opens the state file at path (NULL: $VCUDA_SIM_STATE or
 * /tmp/vcuda-sim-$UID/state). create != 0 creates it from VCUDA_SIM_* if
 * missing. NULL on failure; vcudasim_last_error() says why. */
vcudasim_state *vcudasim_open(const char *path, int create);
void vcudasim_close(vcudasim_state *st);
const char *vcudasim_last_error(void); /* this thread's last failure */

int vcudasim_get_config(vcudasim_state *st, vcudasim_config *out);

/* Device stats, the schedule advanced to now; -1 for a bad index.
 * Reclaims dead processes first. dev: a GPU (0..devices-1) or a live MIG
 * device (vcudasim_mig_instance.device). */
int vcudasim_device_info(vcudasim_state *st, unsigned dev, vcudasim_device *out);

/* Live processes that hold memory or a context on dev, or ran kernels on it.
 * Fills up to cap entries; returns how many there are (-1: bad index). */
int vcudasim_processes(vcudasim_state *st, unsigned dev, vcudasim_process *out, int cap);

/* A stretch of time during which one process's work ran on a device. */
typedef struct vcudasim_stretch {
    uint64_t start_ns;       /* CLOCK_MONOTONIC, the timeline's clock */
    uint64_t end_ns;
} vcudasim_stretch;

/* When pid's work ran on dev: its last VCUDASIM_STRETCHES service stretches,
 * oldest first, the schedule advanced to now (the newest may still grow).
 * busy_ns of vcudasim_process is their total; these say when. Fills up to cap
 * entries; returns how many there are (0: no such process, -1: bad index). */
#define VCUDASIM_STRETCHES 64
int vcudasim_served(vcudasim_state *st, unsigned dev, int32_t pid, vcudasim_stretch *out, int cap);

/* Busy nanoseconds of dev within (now - window_ns, now]: what NVML's
 * utilization uses, with window_ns = 1 s. */
uint64_t vcudasim_busy_in_window(vcudasim_state *st, unsigned dev, uint64_t window_ns);

uint64_t vcudasim_now_ns(void); /* CLOCK_MONOTONIC, the timeline's clock */

/* GPU dev's MIG mode and instances; -1 for a bad index. */
int vcudasim_mig_info(vcudasim_state *st, unsigned dev, vcudasim_mig *out);

/* Raises XID xid on dev: an nvmlEventTypeXidCriticalError event with
 * eventData = xid for every event set registered on dev. Returns the event's
 * sequence number on the device (1, 2, ...), or -1 for a bad index. */
int64_t vcudasim_inject_xid(vcudasim_state *st, unsigned dev, uint64_t xid);

/* lost != 0: dev "falls off the bus" (NVML_ERROR_GPU_IS_LOST); 0: it is back.
 * 0 on success, -1 for a bad index. */
int vcudasim_set_lost(vcudasim_state *st, unsigned dev, int lost);

#ifdef __cplusplus
}
#endif
#endif /* VCUDASIM_H */
