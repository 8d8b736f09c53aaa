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
#define SIM_VERSION 3u /* 2: NUMA, NVLink, XID events, lost flag; 3: time-sliced schedule */
#define SIM_MAX_DEVICES 16
#define SIM_MAX_PROCS 1024
#define SIM_RUNS 512 /* busy runs kept per device for utilization */
#define SIM_STR 96
#define SIM_XID_RING 64 /* XID events kept per device for late readers */
#define SIM_SEGS 64 /* service stretches kept per process, to time its events */
#define SIM_NVSWITCHES 4 /* VCUDA_SIM_NVLINK=switch: every GPU's links spread over 4 switches, */
#define SIM_SWITCH_LINKS 18 /* 18 links per GPU, as on an HGX H100 board */
#define SIM_ADDR_BASE 0x100000000000ULL /* fake device addresses start here */
#define SIM_VMM_GRANULARITY (2ull << 20)

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
    uint32_t pad;
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
    uint32_t pad;
    uint64_t start_time; /* /proc/<pid>/stat field 22: survives pid reuse */
    uint64_t used[SIM_MAX_DEVICES];
    /* Work queue per device, as cumulative ns: a kernel of d ns launched when
     * queued_ns was q completes when busy_ns (served) reaches q + d. */
    uint64_t queued_ns[SIM_MAX_DEVICES];
    uint64_t busy_ns[SIM_MAX_DEVICES];
    uint64_t kernels[SIM_MAX_DEVICES]; /* launched */
    uint32_t contexts[SIM_MAX_DEVICES];
    uint32_t seg_head, seg_count; /* ring of its last SIM_SEGS service stretches */
    struct sim_seg segs[SIM_SEGS];
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
    struct sim_device dev[SIM_MAX_DEVICES];
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
};

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
void sim_sleep_until(uint64_t t_ns);
/* Process slots; callers hold the shared lock. */
int sim_proc_attach(struct sim_shared *sh, pid_t pid); /* slot index or -1 */
void sim_proc_release(struct sim_shared *sh, int slot);
void sim_reap_dead(struct sim_shared *sh); /* reclaim dead processes' memory */
uint64_t sim_device_used(const struct sim_shared *sh, unsigned phys);
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
};

struct sim_graph {
    uint32_t magic;
    bool alive;
    bool exec;
    size_t n, cap;
    uint64_t *dur_us;
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

/* A loaded module or library: any image loads, any name resolves. */
struct sim_module {
    uint32_t magic;
    bool alive;
    struct sim_func *funcs; /* looked-up functions, so repeated lookups share one */
};

/* A function or kernel handle (CUkernel and CUfunction are interchangeable
 * at launch, as in CUDA 12+). */
struct sim_func {
    uint32_t magic;
    struct sim_module *mod;
    char *name;
    struct sim_func *next;
};

struct sim_local {
    pthread_mutex_t mu;
    struct sim_shared *sh;
    pid_t pid;
    int slot;
    bool initialized;
    CUresult init_err;
    int nvisible;
    unsigned visible[SIM_MAX_DEVICES]; /* ordinal -> physical index */
    struct sim_ctx *primary[SIM_MAX_DEVICES];
    unsigned primary_refs[SIM_MAX_DEVICES];
    unsigned primary_flags[SIM_MAX_DEVICES];
    unsigned long long next_ctx_id;
    uint32_t gen;
};

extern struct sim_local sim;

/* device.c */
CUresult sim_check_init(void);
CUresult sim_ordinal(CUdevice dev, unsigned *phys);

/* context.c */
struct sim_ctx *sim_current_ctx(void);
CUresult sim_require_ctx(struct sim_ctx **out); /* current, alive context */
bool sim_ctx_valid(const struct sim_ctx *c);
void sim_local_reset(void); /* after fork: the child starts uninitialised */

/* memory.c: device memory charged to this process; callers hold nothing. */
CUresult sim_charge(unsigned phys, uint64_t bytes);
void sim_uncharge(unsigned phys, uint64_t bytes);
uint64_t sim_new_address(uint64_t bytes, uint64_t align);
enum sim_alloc_kind { SIM_ALLOC_LINEAR = 1, SIM_ALLOC_ARRAY, SIM_ALLOC_MIPMAPPED };
CUresult sim_alloc_record(uint64_t key, uint64_t bytes, struct sim_ctx *ctx,
                          enum sim_alloc_kind kind);
CUresult sim_alloc_forget(uint64_t key, enum sim_alloc_kind kind, uint64_t *bytes,
                          unsigned *phys);
bool sim_alloc_lookup(uint64_t addr, uint64_t len); /* addr..addr+len inside one allocation */
void sim_alloc_free_ctx(struct sim_ctx *ctx); /* everything the context owns */

/* module.c */
bool sim_func_valid(const struct sim_func *f);

/* timeline.c: the per-device timeline and the streams that feed it. */
CUresult sim_stream_resolve(CUstream h, bool ptsz, struct sim_stream **out);
struct sim_ctx *sim_stream_ctx(const struct sim_stream *s); /* per-thread: current */
/* Queues a kernel of dur_us on s (or appends it to the graph s is capturing);
 * blocks while s already has max_pending kernels queued. */
CUresult sim_launch(struct sim_stream *s, uint64_t dur_us);
void sim_stream_drain(struct sim_stream *s); /* sleeps until its work completed */
void sim_ctx_drain(struct sim_ctx *c);       /* likewise, everything in c */
CUresult sim_graph_append(struct sim_graph *g, uint64_t dur_us); /* caller holds sim.mu */

#endif /* VCUDA_GPUSIM_SIM_H */
