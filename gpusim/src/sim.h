/* Internal interface of the GPU simulator, shared by its source files.
 *
 * Two layers of state:
 *  - the shared state file (struct sim_shared), mmap'ed by every process on the
 *    simulated GPUs: device config, per-device timeline, per-process slots;
 *  - process-local state (struct sim_local): contexts, streams, events,
 *    the pointer map used to validate frees.
 * Lock order: sim.mu (process) before the shared lock, never the reverse. */
#ifndef VCUDA_GPUSIM_SIM_H
#define VCUDA_GPUSIM_SIM_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include <vcuda/cuda_abi.h>

#define SIM_MAGIC 0x4d49534144554356ULL /* "VCUDASIM" */
#define SIM_VERSION 5u /* 2: NUMA, NVLink, XID events, lost flag; 3: memory breakdown, host pids; 4: time-sliced schedule;
                      * 5: MIG */
#define SIM_MAX_DEVICES 16
/* MIG: each GPU has room for SIM_MIG_MAX GPU instances (slots); the MIG device
 * (compute instance) of slot k of GPU d is simulated device SIM_MIG_PHYS(d, k),
 * with its own memory and timeline. Every per-device array is SIM_MAX_PHYS long. */
#define SIM_MIG_MAX 7
#define SIM_MAX_PHYS (SIM_MAX_DEVICES + SIM_MAX_DEVICES * SIM_MIG_MAX)
#define SIM_MIG_PHYS(d, k) (SIM_MAX_DEVICES + (d) * SIM_MIG_MAX + (k))
#define SIM_MIG_SLICES 8 /* memory slices: placements are in these units */
#define SIM_MIG_GPCS 7   /* compute slices */
#define SIM_MAX_PROCS 1024
#define SIM_RUNS 512 /* busy runs kept per device for utilization */
#define SIM_STR 96
#define SIM_XID_RING 64 /* XID events kept per device for late readers */
#define SIM_SEGS 64 /* service stretches kept per process, to time its events */
#define SIM_NVSWITCHES 4 /* VCUDA_SIM_NVLINK=switch: every GPU's links spread over 4 switches, */
#define SIM_SWITCH_LINKS 18 /* 18 links per GPU, as on an HGX H100 board */
#define SIM_ADDR_BASE 0x100000000000ULL /* fake device addresses start here */
#define SIM_VMM_GRANULARITY (2ull << 20)

/* What a process's device memory is made of (vcudasim.h VCUDASIM_MEM_*):
 * sim_proc.used[d] is always the sum of sim_proc.mem[d][*]. */
enum sim_mem {
    SIM_MEM_ALLOC = 0,   /* cuMemAlloc*, managed, arrays, cuMemCreate handles */
    SIM_MEM_CONTEXT = 1, /* per-context overhead */
    SIM_MEM_POOL = 2,    /* stream-ordered pools: their reservation */
    SIM_MEM_LOCAL = 3,   /* local memory (stack) above the context's initial one */
    SIM_MEM_LIMITS = 4,  /* malloc heap, printf FIFO, device-runtime launch pool above defaults */
    SIM_MEM_MODULE = 5,  /* module data and kernel code */
    SIM_MEM_GRAPH = 6,   /* the device's graph-memory reserve */
    SIM_MEM_KINDS = 8    /* room for two more without a layout change */
};

/* ---- shared state (one file, all processes) ---- */

/* A maximal stretch of back-to-back kernels on a device's timeline. */
struct sim_run {
    uint64_t start_ns, end_ns;
};

/* A stretch during which one process's work on device dev was served:
 * positions (pos, pos + len] of its queue ran at times (t_ns, t_ns + len]. */
struct sim_seg {
    uint64_t t_ns, pos, len;
    uint32_t dev, pad;
};

/* One injected XID; slot seq % SIM_XID_RING of its device's ring. */
struct sim_xid {
    uint64_t seq; /* 1, 2, ... per device */
    uint64_t xid;
};

struct sim_device {
    char uuid[SIM_STR];
    char name[SIM_STR];
    uint64_t capacity;
    int32_t numa_node;     /* -1: no NUMA information (NVML_ERROR_NOT_SUPPORTED) */
    uint32_t nvlink_peers; /* bit i: one NVLink to physical device i */
    uint32_t lost;         /* atomic; 1: NVML queries return NVML_ERROR_GPU_IS_LOST */
    uint32_t sms;          /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    uint64_t xid_seq;      /* sequence number of the last XID injected; under the lock */
    struct sim_xid xids[SIM_XID_RING];
    /* The time-sliced schedule (schedule.c), advanced lazily to sched_ns. */
    uint64_t sched_ns;      /* work is served up to here */
    uint64_t slice_used_ns; /* of rr_slot's current slice */
    uint64_t reap_ns;       /* last check for dead processes with queued work */
    int32_t rr_slot;        /* process whose slice runs or ran last; -1: none yet */
    uint32_t pad2;
    uint64_t busy_ns;       /* work served, dead processes included */
    uint64_t kernels;       /* kernels launched, dead processes included */
    uint32_t run_head, run_count;
    struct sim_run runs[SIM_RUNS];
};

/* A process attached to the simulated GPUs. Device memory in use is the sum
 * of the live slots' used[] (never a separate counter), so a process killed
 * between two stores cannot leave the books unbalanced. */
struct sim_proc {
    int32_t pid; /* 0: free slot */
    int32_t host_pid; /* what NVML reports: pid + the process's VCUDA_SIM_HOST_PID_OFFSET */
    uint64_t start_time; /* /proc/<pid>/stat field 22: survives pid reuse */
    uint64_t used[SIM_MAX_PHYS];
    /* Work queue per device, as cumulative ns: a kernel of d ns launched when
     * queued_ns was q completes when busy_ns (served) reaches q + d. */
    uint64_t queued_ns[SIM_MAX_PHYS];
    uint64_t busy_ns[SIM_MAX_PHYS];
    uint64_t kernels[SIM_MAX_PHYS]; /* launched */
    uint32_t contexts[SIM_MAX_PHYS];
    uint64_t mem[SIM_MAX_PHYS][SIM_MEM_KINDS]; /* used[d] broken down */
    uint32_t seg_head, seg_count; /* ring of its last SIM_SEGS service stretches */
    struct sim_seg segs[SIM_SEGS];
};

/* A GPU instance (mig.c) and its compute instance, which spans it: the MIG
 * device. The slot's simulated device SIM_MIG_PHYS holds the MIG device's
 * uuid, name, memory, SMs and timeline while ci_live. */
struct sim_gi {
    uint32_t live;         /* 1: the GPU instance exists */
    uint32_t profile;      /* index in the model's profile table */
    uint32_t start, size;  /* placement, in memory slices */
    uint32_t id;           /* GPU instance id (from the placement, as NVML numbers them) */
    uint32_t ci_live;      /* 1: its compute instance exists */
    uint32_t ci_id;
    uint32_t pad;
    uint64_t serial;       /* unique per creation: stale NVML handles are refused */
};

struct sim_mig {
    uint32_t capable; /* 1: MIG-capable */
    uint32_t mode;    /* 1: MIG mode enabled */
    struct sim_gi gi[SIM_MIG_MAX];
};

struct sim_shared {
    uint64_t magic; /* written last at creation */
    uint32_t version;
    uint32_t size; /* sizeof(struct sim_shared) */
    pthread_mutex_t lock; /* robust, process-shared */
    uint32_t ndev;
    uint32_t max_pending;
    uint64_t ctx_overhead;
    uint64_t timeslice_ns; /* round-robin slice between processes */
    int32_t driver_version;
    uint32_t nproc_hw; /* slots [0, nproc_hw) may be in use */
    uint64_t next_addr;
    /* Futex word bumped after every XID injection: event waiters in any
     * process sleep on it instead of polling. */
    uint32_t event_gen;
    uint32_t nvswitch; /* 1: all GPUs on an NVSwitch fabric (nvlink_peers unused) */
    uint32_t sms;            /* CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT */
    uint32_t threads_per_sm; /* CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR */
    uint64_t pool_chunk;     /* stream-ordered pools grow by multiples of this */
    uint64_t kernel_code;    /* code bytes of a kernel its image does not describe */
    uint32_t mig_model;      /* index in sim_mig_models */
    uint32_t pad;
    uint64_t mig_serial;     /* last sim_gi.serial handed out */
    struct sim_mig mig[SIM_MAX_DEVICES];
    struct sim_device dev[SIM_MAX_PHYS]; /* [0, ndev): GPUs; then MIG devices */
    struct sim_proc proc[SIM_MAX_PROCS];
};

/* Configuration read from VCUDA_SIM_* when the state file is created. */
struct sim_config {
    uint32_t ndev;
    uint64_t memory;
    uint64_t ctx_overhead;
    int32_t driver_version;
    uint32_t max_pending;
    uint64_t timeslice_ns;
    char uuid[SIM_MAX_DEVICES][SIM_STR];
    char name[SIM_MAX_DEVICES][SIM_STR];
    int32_t numa[SIM_MAX_DEVICES];
    uint32_t nvlink_peers[SIM_MAX_DEVICES];
    bool nvswitch;
    uint32_t sms, threads_per_sm;
    uint64_t pool_chunk, kernel_code;
    bool names_set; /* VCUDA_SIM_NAMES given: MIG-capable devices keep them */
    uint32_t mig_model;
    struct sim_mig mig[SIM_MAX_DEVICES]; /* VCUDA_SIM_MIG, instances placed already */
};

/* mig.c: the MIG model. Profiles as NVIDIA's MIG user guide documents them. */
struct sim_mig_profile {
    const char *name;     /* "1g.10gb" */
    uint32_t nvml_index;  /* NVML_GPU_INSTANCE_PROFILE_* */
    uint32_t id;          /* profile id (nvmlGpuInstanceProfileInfo_t.id, nvidia-smi's) */
    uint32_t slices;      /* compute slices */
    uint32_t mem_slices;  /* placement size */
    uint32_t starts;      /* bit s: placement start s is valid */
    uint32_t max_count;
    uint32_t sms, copy_engines, decoders, encoders, jpegs, ofas;
    uint64_t memory_mb;
};
struct sim_mig_model {
    const char *key;  /* VCUDA_SIM_MIG_MODEL */
    const char *name; /* the GPU's name */
    uint64_t memory;  /* the GPU's memory, bytes */
    uint32_t sms;
    unsigned nprofiles;
    const struct sim_mig_profile *profiles;
};
enum sim_mig_rc { /* mapped to NVML errors by nvml.c */
    SIM_MIG_OK = 0,
    SIM_MIG_INVALID,       /* bad profile or placement */
    SIM_MIG_NO_RESOURCES,  /* does not fit */
    SIM_MIG_IN_USE,        /* a process or an instance is in the way */
    SIM_MIG_NOT_SUPPORTED  /* not MIG-capable, or MIG mode off */
};
extern const struct sim_mig_model sim_mig_models[];
extern const unsigned sim_mig_nmodels;
const struct sim_mig_model *sim_mig_model(const struct sim_shared *sh);
int sim_mig_profile_by_name(const struct sim_mig_model *m, const char *name, size_t len);
/* GPU instances on a MIG table alone (also used on the configuration before
 * the state exists). start < 0: the highest free placement. */
enum sim_mig_rc sim_gi_place(const struct sim_mig *mig, const struct sim_mig_model *m,
                             unsigned profile, int start, unsigned *out_start);
unsigned sim_gi_remaining(const struct sim_mig *mig, const struct sim_mig_model *m,
                          unsigned profile);
unsigned sim_gi_id(unsigned start, unsigned size); /* GPU instance id of a placement */
/* Callers hold the shared lock. */
enum sim_mig_rc sim_gi_create(struct sim_shared *sh, unsigned dev, unsigned profile, int start,
                              unsigned *slot);
enum sim_mig_rc sim_gi_destroy(struct sim_shared *sh, unsigned dev, unsigned slot);
enum sim_mig_rc sim_ci_create(struct sim_shared *sh, unsigned dev, unsigned slot);
enum sim_mig_rc sim_ci_destroy(struct sim_shared *sh, unsigned dev, unsigned slot);
enum sim_mig_rc sim_mig_set_mode(struct sim_shared *sh, unsigned dev, bool on);
void sim_mig_device_init(struct sim_shared *sh, unsigned dev, unsigned slot); /* its MIG device */
bool sim_phys_busy(const struct sim_shared *sh, unsigned phys); /* a live process holds it */
bool sim_phys_valid(const struct sim_shared *sh, unsigned phys); /* a GPU or a live MIG device */
bool sim_phys_usable(const struct sim_shared *sh, unsigned phys); /* ... not a GPU in MIG mode */
unsigned sim_phys_parent(unsigned phys); /* the GPU a MIG device is on (a GPU: itself) */
/* The MIG devices of GPU dev, by GPU instance id (phys: SIM_MIG_MAX entries). */
unsigned sim_mig_devices(const struct sim_shared *sh, unsigned dev, unsigned *phys);
void sim_mig_uuid(const char *parent_uuid, unsigned gi, unsigned ci, char *out, size_t len);

/* config.c */
int sim_parse_quantity(const char *s, uint64_t *out); /* 0 ok, -1 bad */
int sim_config_from_env(struct sim_config *cfg, char *err, size_t errlen);
const char *sim_state_path(char *buf, size_t len); /* VCUDA_SIM_STATE or default */

/* state.c: the state file. */
struct sim_shared *sim_state_open(const char *path, bool create, char *err, size_t errlen);
void sim_state_close(struct sim_shared *sh);
void sim_lock(struct sim_shared *sh);
void sim_unlock(struct sim_shared *sh);
uint64_t sim_now_ns(void);
#define SIM_SPIN_US 100 /* default VCUDA_SIM_SPIN_US: a spinning synchronize sleeps until this long
                         * before its time, then spins */
void sim_sleep_until(uint64_t t_ns, uint64_t spin_ns);
/* Process slots; callers hold the shared lock. */
int sim_proc_attach(struct sim_shared *sh, pid_t pid); /* slot index or -1 */
void sim_proc_release(struct sim_shared *sh, int slot);
void sim_reap_dead(struct sim_shared *sh); /* reclaim dead processes' memory */
uint64_t sim_device_used(const struct sim_shared *sh, unsigned phys);
/* 0, or -1 after a message on stderr (prefixed `who`): this process is not in the pid
 * namespace VCUDA_SIM_PID_NAMESPACE names (unset: no check). */
int sim_check_pid_namespace(const char *who);
bool sim_proc_alive(const struct sim_proc *pr);

/* schedule.c: the time-sliced execution schedule of each device. Callers
 * hold the shared lock. */
void sim_sched_advance(struct sim_shared *sh, unsigned phys, uint64_t now); /* serve up to now */
void sim_sched_advance_all(struct sim_shared *sh, uint64_t now);
/* When slot's served work on phys will reach pos if no process launches
 * more and none dies (later launches can only delay it), or until if that
 * is later; call after advancing. */
uint64_t sim_sched_predict(const struct sim_shared *sh, unsigned phys, int slot, uint64_t pos,
                           uint64_t until);
uint64_t sim_sched_pending(const struct sim_shared *sh, unsigned phys); /* all live processes */
/* The time slot's served work on phys reached pos, from its service ring
 * (before the ring: when its oldest stretch there began, an upper bound);
 * 0: not served yet, or no stretch on phys kept. */
uint64_t sim_sched_served_at(const struct sim_shared *sh, unsigned phys, int slot, uint64_t pos);
uint64_t sim_utilization_window(struct sim_shared *sh, unsigned phys, uint64_t now,
                                uint64_t window_ns); /* advances; busy ns in (now-window, now] */

/* events.c: XID events, shared by every process on the state file. */
uint64_t sim_xid_post(struct sim_shared *sh, unsigned phys, uint64_t xid); /* its seq */
/* The oldest XID of phys after seq *seen that is still in the ring; advances
 * *seen past it. Caller holds the shared lock. false: none newer. */
bool sim_xid_next(const struct sim_shared *sh, unsigned phys, uint64_t *seen, uint64_t *xid);
uint32_t sim_event_gen(struct sim_shared *sh); /* read before looking for events */
/* Sleeps until an XID is posted after gen was read, or until deadline_ns
 * (CLOCK_MONOTONIC); may return early. */
void sim_event_sleep(struct sim_shared *sh, uint32_t gen, uint64_t deadline_ns);

/* ---- process-local state (libvcuda-sim-cuda only) ---- */

#define SIM_CTX_MAGIC 0x43545831u
#define SIM_STREAM_MAGIC 0x5354524du
#define SIM_EVENT_MAGIC 0x45564e54u
#define SIM_FUNC_MAGIC 0x46554e43u
#define SIM_GRAPH_MAGIC 0x47525048u

/* Handles are never freed, only marked dead, so a stale handle is reported
 * as invalid instead of being a use-after-free; each leaks a few bytes. */
struct sim_ctx {
    uint32_t magic;
    uint32_t gen; /* sim.gen at creation: a fork makes older contexts invalid */
    bool alive;
    bool primary;
    int ordinal;    /* visible device index */
    unsigned phys;  /* index in the state file */
    unsigned flags;
    uint64_t last_pos; /* queue position of everything launched in this context */
    struct sim_stream *legacy;
    unsigned long long id;
    struct sim_ctx_mem *mem; /* limits and local memory (local_mem.c); NULL until used */
};

struct sim_graph {
    uint32_t magic;
    bool alive;
    bool exec;
    size_t n, cap;
    uint64_t *dur_us;
    struct sim_graph_mem *mem; /* memory nodes (graph_mem.c); NULL: none */
};

/* A point in this process's work queue on a device (see sim_proc.queued_ns):
 * reached when the device has served pos of it. */
struct sim_mark {
    uint64_t pos;
    unsigned phys;
};

struct sim_stream {
    uint32_t magic;
    uint32_t gen; /* sim.gen when its marks were made (a per-thread stream survives fork) */
    bool alive;
    struct sim_ctx *ctx; /* NULL for a per-thread stream: follows the current context */
    unsigned flags;
    int priority;
    struct sim_mark tail;     /* its last kernel */
    struct sim_mark *pending; /* ring of its queued kernels */
    size_t head, count, cap;
    struct sim_graph *capture; /* non-NULL while capturing */
    CUstreamCaptureMode capture_mode; /* ... begun in this mode */
    pthread_t capture_owner;          /* ... by this thread */
    unsigned capture_snap_global, capture_snap_own, capture_snap_context; /* violation counts when it began */
};

struct sim_event {
    uint32_t magic;
    bool alive;
    bool recorded;
    unsigned flags;
    struct sim_mark mark; /* the work before it */
    uint64_t record_ns;
    uint64_t time_ns; /* when it completed; 0: not seen complete yet */
};

#define SIM_MODULE_MAGIC 0x4d4f444cu

/* A loaded module or library: any image loads, any name resolves. An image
 * that is a vcudasim module descriptor (vcudasim.h) gives its kernels local
 * sizes and code sizes; module.c keeps its text. */
struct sim_module {
    uint32_t magic;
    bool alive;
    bool library;        /* cuLibraryLoad*: context-independent */
    struct sim_func *funcs; /* looked-up functions, so repeated lookups share one */
    char *desc;          /* the descriptor's text, NULL for any other image */
    uint64_t data_key;   /* allocation-map key of its data (module.c), 0: none */
};

/* Where a function's code is loaded: one context each (lazy loading). */
struct sim_code_load {
    struct sim_ctx *ctx;
    uint64_t key; /* allocation-map key of the code bytes */
    struct sim_code_load *next;
};

/* A function or kernel handle (CUkernel and CUfunction are interchangeable
 * at launch, as in CUDA 12+). */
struct sim_func {
    uint32_t magic;
    struct sim_module *mod;
    char *name;
    struct sim_func *next;
    uint64_t local_bytes; /* CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES (per thread) */
    uint64_t code_bytes;  /* charged in each context at its first launch there */
    struct sim_ctx *ready_ctx; /* last context it was made ready in: the launch fast path */
    struct sim_code_load *loads;
};

struct sim_local {
    pthread_mutex_t mu;
    struct sim_shared *sh;
    pid_t pid;
    int slot;
    bool initialized;
    CUresult init_err;
    int nvisible;
    unsigned visible[SIM_MAX_PHYS]; /* ordinal -> physical index */
    struct sim_ctx *primary[SIM_MAX_PHYS];
    unsigned primary_refs[SIM_MAX_PHYS];
    unsigned primary_flags[SIM_MAX_PHYS];
    unsigned long long next_ctx_id;
    uint32_t gen;
    bool eager_modules; /* CUDA_MODULE_LOADING=EAGER at cuInit */
    uint64_t spin_ns;   /* VCUDA_SIM_SPIN_US at cuInit: how much of a spinning wait spins */
    uint64_t ctx_create_ns; /* VCUDA_SIM_CTX_CREATE_US at cuInit: how long creating a context takes */
};

extern struct sim_local sim;

/* device.c */
CUresult sim_check_init(void);
/* A potentially unsafe call during stream capture (synchronize, query): the
 * calling thread's capture interaction mode decides whether it is prohibited;
 * if so it returns CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED and the captures it
 * concerns end invalidated (launch.c). */
CUresult sim_capture_unsafe_call(void);
/* cuCtxSynchronize: also invalid, in every mode, while any stream captures. */
CUresult sim_capture_context_sync(void);
CUresult sim_ordinal(CUdevice dev, unsigned *phys);

/* context.c */
struct sim_ctx *sim_current_ctx(void);
CUresult sim_require_ctx(struct sim_ctx **out); /* current, alive context */
bool sim_ctx_valid(const struct sim_ctx *c);
void sim_local_reset(void); /* after fork: the child starts uninitialised */

/* memory.c: device memory charged to this process; callers hold nothing.
 * sim_charge/sim_uncharge count as SIM_MEM_ALLOC. */
CUresult sim_charge(unsigned phys, uint64_t bytes);
void sim_uncharge(unsigned phys, uint64_t bytes);
CUresult sim_charge_as(unsigned phys, enum sim_mem kind, uint64_t bytes);
void sim_uncharge_as(unsigned phys, enum sim_mem kind, uint64_t bytes);
uint64_t sim_new_address(uint64_t bytes, uint64_t align);
/* What an allocation-map entry is; each kind's bytes count as one enum sim_mem.
 * POOL, GRAPH and IPC entries carry 0 bytes: their memory is counted elsewhere
 * (the pool's reservation, the graph reserve) or not at all (an import). */
enum sim_alloc_kind {
    SIM_ALLOC_LINEAR = 1, SIM_ALLOC_ARRAY, SIM_ALLOC_MIPMAPPED, /* SIM_MEM_ALLOC */
    SIM_ALLOC_MODULE, /* SIM_MEM_MODULE: module data, kernel code */
    SIM_ALLOC_LOCAL,  /* SIM_MEM_LOCAL: a context's local-memory reservation */
    SIM_ALLOC_LIMITS, /* SIM_MEM_LIMITS: a context's heap / FIFO / launch pool growth */
    SIM_ALLOC_POOL,   /* a stream-ordered block; owner: its struct pool_block */
    SIM_ALLOC_IPC     /* a mapping opened with cuIpcOpenMemHandle */
};
#define SIM_ALLOC_BIT(k) (1u << (k))
struct sim_alloc_entry {
    uint64_t bytes;
    unsigned phys;
    enum sim_alloc_kind kind;
    struct sim_ctx *ctx;
    void *owner;
};
CUresult sim_alloc_record(uint64_t key, uint64_t bytes, struct sim_ctx *ctx,
                          enum sim_alloc_kind kind);
CUresult sim_alloc_record_owned(uint64_t key, uint64_t bytes, struct sim_ctx *ctx,
                                enum sim_alloc_kind kind, void *owner);
CUresult sim_alloc_forget(uint64_t key, enum sim_alloc_kind kind, uint64_t *bytes,
                          unsigned *phys);
/* Removes the entry at key if its kind is in kinds (SIM_ALLOC_BIT mask),
 * without uncharging anything. */
CUresult sim_alloc_take(uint64_t key, unsigned kinds, struct sim_alloc_entry *out);
bool sim_alloc_find(uint64_t key, unsigned kinds, struct sim_alloc_entry *out); /* no removal */
/* Records `bytes` of `kind` charged to ctx's device under a fresh key, or
 * replaces the entry at *key (0: none yet) by one of the new size, charging
 * or returning the difference. CUDA_ERROR_OUT_OF_MEMORY leaves it as it was. */
CUresult sim_alloc_resize(uint64_t *key, uint64_t bytes, struct sim_ctx *ctx,
                          enum sim_alloc_kind kind);
bool sim_alloc_lookup(uint64_t addr, uint64_t len); /* addr..addr+len inside one allocation */
CUresult sim_alloc_linear(struct sim_ctx *c, CUdeviceptr *dptr, uint64_t bytes); /* cuMemAlloc */
CUresult sim_free_pointer(CUdeviceptr dptr); /* cuMemFree: linear, pool or graph allocation */
void sim_alloc_free_ctx(struct sim_ctx *ctx); /* everything the context owns */

/* vmm.c: physical handles, for export and import (ipc.c). */
CUresult sim_vmm_describe(uint64_t id, uint64_t *bytes, unsigned *phys, unsigned *handle_types);
CUresult sim_vmm_adopt(uint64_t bytes, unsigned phys, uint64_t *id); /* an imported handle */

/* module.c */
bool sim_func_valid(const struct sim_func *f);
/* Before f runs in ctx: loads its code there (lazy loading) and raises the
 * context's local memory to its needs. Cheap when both are done already. */
CUresult sim_func_ready(struct sim_func *f, struct sim_ctx *ctx);

/* local_mem.c: per-context limits and local memory. */
CUresult sim_local_reserve(struct sim_ctx *ctx, uint64_t per_thread); /* caller holds sim.mu */
uint64_t sim_ctx_stack(const struct sim_ctx *ctx); /* CU_LIMIT_STACK_SIZE now; no lock needed */

/* pool.c: stream-ordered pools. */
void sim_pools_release_on_sync(void); /* a synchronize call: trim above thresholds */
void sim_pool_block_free(void *block); /* an allocation-map POOL entry's owner */

/* graph_mem.c: graph memory nodes; callers hold sim.mu where said. */
CUresult sim_graph_mem_capture_alloc(struct sim_graph *g, struct sim_ctx *ctx, uint64_t bytes,
                                     CUdeviceptr *dptr); /* caller holds sim.mu */
CUresult sim_graph_mem_capture_free(struct sim_graph *g, CUdeviceptr dptr); /* holds sim.mu */
CUresult sim_graph_mem_instantiate(struct sim_graph *g, struct sim_graph *exec); /* holds sim.mu */
CUresult sim_graph_mem_map(struct sim_graph *exec, struct sim_stream *s); /* upload / launch */
void sim_graph_mem_launched(struct sim_graph *exec, struct sim_stream *s); /* its kernels queued */
void sim_graph_mem_destroy(struct sim_graph *g); /* caller holds sim.mu */
bool sim_graph_mem_free_outside(CUdeviceptr dptr); /* a graph allocation freed by cuMemFree* */

/* timeline.c: the per-device timeline and the streams that feed it. */
CUresult sim_stream_resolve(CUstream h, bool ptsz, struct sim_stream **out);
struct sim_ctx *sim_stream_ctx(const struct sim_stream *s); /* per-thread: current */
/* Queues a kernel of dur_us on s (or appends it to the graph s is capturing);
 * blocks while s already has max_pending kernels queued. */
CUresult sim_launch(struct sim_stream *s, uint64_t dur_us);
void sim_stream_drain(struct sim_stream *s); /* sleeps until its work completed */
void sim_ctx_drain(struct sim_ctx *c);       /* likewise, everything in c */
bool sim_mark_done(struct sim_mark m);        /* the device has served up to m */
CUresult sim_graph_append(struct sim_graph *g, uint64_t dur_us); /* caller holds sim.mu */
struct sim_graph *sim_graph_new(bool exec);
struct sim_graph *sim_graph_of(void *h, bool exec); /* a live graph (exec: executable) or NULL */

#endif /* VCUDA_GPUSIM_SIM_H */
