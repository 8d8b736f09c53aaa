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
 *    other processes have work queued).
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
 *    overhead. CUDA arrays: Width * max(Height,1) * max(Depth,1) *
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
 *    NVML_ERROR_GPU_IS_LOST; CUDA is not affected. */
#ifndef VCUDASIM_H
#define VCUDASIM_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VCUDASIM_API_VERSION 3 /* 2: topology, XID injection, lost devices; 3: time slicing */

typedef struct vcudasim_state vcudasim_state; /* an open state file */

typedef struct vcudasim_config {
    uint32_t devices;
    uint32_t max_pending;    /* queued kernels per stream before a launch blocks */
    int32_t driver_version;  /* e.g. 13000 */
    uint64_t context_overhead; /* bytes charged per context */
    uint32_t nvswitch;       /* 1: VCUDA_SIM_NVLINK=switch */
    uint32_t timeslice_us;   /* round-robin slice between processes */
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
} vcudasim_device;

typedef struct vcudasim_process {
    int32_t pid;
    uint32_t contexts;
    uint64_t used;           /* bytes on this device, contexts included */
    uint64_t busy_ns;        /* kernel time served on this device */
    uint64_t kernels;        /* launched */
    uint64_t pending_ns;     /* kernel time queued, not yet served */
} vcudasim_process;

int vcudasim_api_version(void);

/* Opens the state file at path (NULL: $VCUDA_SIM_STATE or
 * /tmp/vcuda-sim-$UID/state). create != 0 creates it from VCUDA_SIM_* if
 * missing. NULL on failure; vcudasim_last_error() says why. */
vcudasim_state *vcudasim_open(const char *path, int create);
void vcudasim_close(vcudasim_state *st);
const char *vcudasim_last_error(void); /* this thread's last failure */

int vcudasim_get_config(vcudasim_state *st, vcudasim_config *out);

/* Device stats, the schedule advanced to now; -1 for a bad index.
 * Reclaims dead processes first. */
int vcudasim_device_info(vcudasim_state *st, unsigned dev, vcudasim_device *out);

/* Live processes that hold memory or a context on dev, or ran kernels on it.
 * Fills up to cap entries; returns how many there are (-1: bad index). */
int vcudasim_processes(vcudasim_state *st, unsigned dev, vcudasim_process *out, int cap);

/* Busy nanoseconds of dev within (now - window_ns, now]: what NVML's
 * utilization uses, with window_ns = 1 s. */
uint64_t vcudasim_busy_in_window(vcudasim_state *st, unsigned dev, uint64_t window_ns);

uint64_t vcudasim_now_ns(void); /* CLOCK_MONOTONIC, the timeline's clock */

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
