/* Graph memory (DESIGN.md "Memory"; issue 12).
 *
 * An allocation made while its stream is being captured takes nothing from
 * the pool: it becomes a graph allocation node, and the driver maps the
 * graph's memory when the executable graph is uploaded or launched, from the
 * process's per-device graph reserve (CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT).
 * The reserve is kept across launches and after the graph is destroyed;
 * only cuDeviceGraphMemTrim gives it back.
 *
 * So the shim follows each capture (live bytes and their peak in capture
 * order, each allocation rounded up to GRAPH_GRANULE; nodes added with
 * cuGraphAddMemAllocNode count in full, never reusing), gives the graph that
 * footprint, and charges it when the graph is instantiated, before the driver
 * is called (refused with CUDA_ERROR_OUT_OF_MEMORY when it does not fit, after
 * trim before deny). Per device the charge is
 *
 *     max(reserve as last read, sum of the footprints of live executable graphs)
 *
 * which covers every mapping a launch can make without the shim looking (the
 * launch path stays as it is): a launch maps at most its graph's footprint,
 * and the driver reuses the reserve for graphs that do not run at the same
 * time (to verify on hardware). The reserve is read again after
 * cuGraphUpload, cuGraphExecDestroy, cuDeviceGraphMemTrim and instantiation
 * with CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD. */
#include "graph_mem.h"

#include <pthread.h>
#include <stdlib.h>

#include "config.h"
#include "log.h"
#include "process.h"
#include "quota.h"
#include "real_driver.h"

#define GRAPH_GRANULE (2ull << 20) /* graph allocations map whole 2 MiB pages */

_Atomic int vcuda_captures_active;

struct captured {
    CUdeviceptr ptr;
    uint64_t bytes; /* rounded up */
};
struct capture {
    CUstream stream; /* the stream the capture began on */
    uint64_t live, peak;
    struct captured *allocs; /* live captured allocations */
    size_t n, cap;
};
struct graph { CUgraph graph; uint64_t footprint; };
struct exec { CUgraphExec exec; CUdevice ordinal; uint64_t footprint; };
struct graph_dev {
    int dev; /* ledger device, -1: not met yet */
    uint64_t claims;   /* footprints of live executable graphs */
    uint64_t reserved; /* the reserve as last read */
    uint64_t charged;
};

/* One lock for all of it: captures, instantiations and trims are rare. */
static pthread_mutex_t graph_lock = PTHREAD_MUTEX_INITIALIZER;
static struct capture *captures;
static size_t ncaptures, capcaptures;
static struct graph *graphs;
static size_t ngraphs, capgraphs;
static struct exec *execs;
static size_t nexecs, capexecs;
static struct graph_dev devices[VCUDA_MAX_DEVICES] = {[0 ... VCUDA_MAX_DEVICES - 1] = {.dev = -1}};

static uint64_t round_up(uint64_t v, uint64_t to) { return (v + to - 1) / to * to; }

/* Grows *array (of `size`-byte items) to hold one more; false when out of memory. */
static bool room_for_one(void **array, size_t n, size_t *cap, size_t size) {
    if (n < *cap) return true;
    size_t ncap = *cap ? *cap * 2 : 16;
    void *grown = realloc(*array, ncap * size);
    if (grown == NULL) return false;
    *array = grown;
    *cap = ncap;
    return true;
}

static void warn_once(_Atomic int *flag, const char *what) {
    if (atomic_exchange(flag, 1) == 0) vcuda_warn("%s", what);
}

/* ---- captures ---------------------------------------------------------------- */

/* The handle that names the stream a (possibly per-thread) entry point meant. */
static CUstream named_stream(CUstream stream, bool ptsz) {
    return stream == NULL && ptsz ? CU_STREAM_PER_THREAD : stream;
}

bool vcuda_graph_mem_capturing_slow(CUstream stream, bool ptsz) {
    CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
    return vcuda_real.cuStreamIsCapturing &&
           vcuda_real.cuStreamIsCapturing(named_stream(stream, ptsz), &status) == CUDA_SUCCESS &&
           status == CU_STREAM_CAPTURE_STATUS_ACTIVE;
}

/* The capture an operation on `stream` belongs to: the one begun on it, else
 * (a stream joined to a capture) the oldest. Caller holds graph_lock. */
static struct capture *capture_of(CUstream stream) {
    for (size_t i = 0; i < ncaptures; i++)
        if (captures[i].stream == stream) return &captures[i];
    return ncaptures ? &captures[0] : NULL;
}

void vcuda_graph_mem_captured_alloc(CUstream stream, bool ptsz, CUdeviceptr ptr, uint64_t bytes) {
    static _Atomic int warned;
    pthread_mutex_lock(&graph_lock);
    struct capture *c = capture_of(named_stream(stream, ptsz));
    if (c && room_for_one((void **)&c->allocs, c->n, &c->cap, sizeof *c->allocs)) {
        c->allocs[c->n++] = (struct captured){ptr, round_up(bytes, GRAPH_GRANULE)};
        c->live += c->allocs[c->n - 1].bytes;
        if (c->live > c->peak) c->peak = c->live;
    } else if (c) {
        /* Unfreeable then: it stays in the footprint, which only errs high. */
        c->live += round_up(bytes, GRAPH_GRANULE);
        if (c->live > c->peak) c->peak = c->live;
    } else {
        warn_once(&warned, "an allocation was captured into a graph whose capture vcuda did not see begin; "
                           "its graph memory is not charged");
    }
    pthread_mutex_unlock(&graph_lock);
}

void vcuda_graph_mem_captured_free(CUstream stream, bool ptsz, CUdeviceptr ptr) {
    pthread_mutex_lock(&graph_lock);
    struct capture *c = capture_of(named_stream(stream, ptsz));
    for (size_t i = 0; c && i < c->n; i++) {
        if (c->allocs[i].ptr != ptr) continue;
        c->live -= c->allocs[i].bytes; /* later captured allocations may reuse it */
        c->allocs[i] = c->allocs[--c->n];
        break;
    }
    pthread_mutex_unlock(&graph_lock);
}

static void capture_begun(CUstream stream) {
    pthread_mutex_lock(&graph_lock);
    if (room_for_one((void **)&captures, ncaptures, &capcaptures, sizeof *captures)) {
        captures[ncaptures++] = (struct capture){.stream = stream};
        atomic_fetch_add(&vcuda_captures_active, 1);
    } else {
        vcuda_warn("out of host memory: a stream capture's graph memory is not charged");
    }
    pthread_mutex_unlock(&graph_lock);
}

/* Caller holds graph_lock. */
static struct graph *graph_of(CUgraph graph) {
    for (size_t i = 0; i < ngraphs; i++)
        if (graphs[i].graph == graph) return &graphs[i];
    return NULL;
}

/* Adds `bytes` to graph's footprint. Caller holds graph_lock. */
static void add_footprint(CUgraph graph, uint64_t bytes) {
    struct graph *g = graph_of(graph);
    if (g == NULL && room_for_one((void **)&graphs, ngraphs, &capgraphs, sizeof *graphs)) {
        g = &graphs[ngraphs++];
        *g = (struct graph){.graph = graph};
    }
    if (g) g->footprint += bytes;
    else vcuda_warn("out of host memory: a graph's memory is not charged");
}

/* The capture begun on `stream` ended, making `graph` (NULL: it failed). */
static void capture_ended(CUstream stream, CUgraph graph) {
    pthread_mutex_lock(&graph_lock);
    for (size_t i = 0; i < ncaptures; i++) {
        if (captures[i].stream != stream) continue;
        if (graph && captures[i].peak) add_footprint(graph, captures[i].peak);
        free(captures[i].allocs);
        captures[i] = captures[--ncaptures];
        atomic_fetch_sub(&vcuda_captures_active, 1);
        break;
    }
    pthread_mutex_unlock(&graph_lock);
}

/* ---- the per-device charge ----------------------------------------------------- */

/* What d is to be charged: max(reserve, claims). */
static uint64_t wanted(const struct graph_dev *d) { return d->reserved > d->claims ? d->reserved : d->claims; }

/* Moves d's charge to what it wants; what the driver holds beyond what was
 * charged is charged whatever the limit. Caller holds graph_lock. Returns the
 * bytes given back. */
static uint64_t settle(struct graph_dev *d) {
    static _Atomic int warned;
    uint64_t want = wanted(d);
    if (want > d->charged) {
        warn_once(&warned, "the graph memory reserve grew beyond the footprints vcuda charged; charging "
                           "what it holds");
        vcuda_quota_force(d->dev, want - d->charged);
        d->charged = want;
        return 0;
    }
    uint64_t given = d->charged - want;
    vcuda_quota_give(d->dev, given);
    d->charged = want;
    return given;
}

/* What d's charge lacks to cover max(reserve, claims). Caller holds graph_lock. */
static uint64_t shortfall(const void *owner) {
    const struct graph_dev *d = owner;
    return wanted(d) > d->charged ? wanted(d) - d->charged : 0;
}

/* The graph reserve of device `ordinal` as the driver reports it. */
static bool read_reserve(CUdevice ordinal, uint64_t *out) {
    cuuint64_t reserved = 0;
    if (vcuda_real.cuDeviceGetGraphMemAttribute == NULL ||
        vcuda_real.cuDeviceGetGraphMemAttribute(ordinal, CU_GRAPH_MEM_ATTR_RESERVED_MEM_CURRENT, &reserved) !=
            CUDA_SUCCESS)
        return false;
    *out = reserved;
    return true;
}

/* Trim before deny, this device's reserve first. Caller holds graph_lock. */
static void trim_own(void *owner) {
    struct graph_dev *d = owner;
    CUdevice o = (CUdevice)(d - devices);
    if (d->reserved && vcuda_real.cuDeviceGraphMemTrim && vcuda_real.cuDeviceGraphMemTrim(o) == CUDA_SUCCESS)
        read_reserve(o, &d->reserved);
}

/* Reads device `ordinal`'s graph reserve again. Caller holds graph_lock. */
static uint64_t refresh_locked(CUdevice ordinal) {
    static _Atomic int warned;
    struct graph_dev *d = &devices[ordinal];
    if (d->dev < 0) return 0;
    if (!read_reserve(ordinal, &d->reserved)) /* keep the last figure: a charge never drops on a guess */
        warn_once(&warned, "the driver does not report the graph memory reserve; keeping its last charge");
    return settle(d);
}

static void refresh(CUdevice ordinal) {
    if (ordinal < 0 || ordinal >= VCUDA_MAX_DEVICES) return;
    pthread_mutex_lock(&graph_lock);
    refresh_locked(ordinal);
    pthread_mutex_unlock(&graph_lock);
}

uint64_t vcuda_graph_mem_trim(int dev) {
    if (vcuda_quota_covering >= (const void *)devices && vcuda_quota_covering < (const void *)(devices + VCUDA_MAX_DEVICES))
        return 0; /* this thread holds graph_lock, and trimmed already */
    uint64_t given = 0;
    pthread_mutex_lock(&graph_lock);
    for (CUdevice o = 0; o < VCUDA_MAX_DEVICES; o++) {
        if (devices[o].dev != dev || devices[o].reserved == 0 || vcuda_real.cuDeviceGraphMemTrim == NULL ||
            vcuda_real.cuDeviceGraphMemTrim(o) != CUDA_SUCCESS)
            continue;
        given += refresh_locked(o);
    }
    pthread_mutex_unlock(&graph_lock);
    return given;
}

/* ---- executable graphs ----------------------------------------------------------- */

/* Claims graph's footprint on the current context's device before it is
 * instantiated. *ordinal is -1 when nothing was claimed. */
static CUresult claim(CUgraph graph, CUdevice *ordinal, uint64_t *footprint) {
    *ordinal = -1;
    *footprint = 0;
    if (vcuda_config.disabled) return CUDA_SUCCESS;
    CUresult rc = vcuda_process_ready();
    if (rc != CUDA_SUCCESS) return rc;
    pthread_mutex_lock(&graph_lock);
    struct graph *g = graph_of(graph);
    uint64_t bytes = g ? g->footprint : 0;
    pthread_mutex_unlock(&graph_lock);
    CUcontext ctx;
    CUdevice o;
    uint64_t limit;
    int dev;
    if (bytes == 0 || vcuda_current_device(&ctx, &o) != CUDA_SUCCESS || (dev = vcuda_device_index(o, &limit, &rc)) < 0)
        return CUDA_SUCCESS; /* no graph memory, or the driver reports the error */
    pthread_mutex_lock(&graph_lock);
    struct graph_dev *d = &devices[o];
    d->dev = dev;
    d->claims += bytes;
    uint64_t charged;
    if (vcuda_quota_cover(dev, limit, d, shortfall, trim_own, &charged)) {
        d->charged += charged;
    } else {
        d->claims -= bytes;
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    }
    pthread_mutex_unlock(&graph_lock);
    if (rc != CUDA_SUCCESS) {
        vcuda_info("graph instantiation refused: its %llu bytes of graph memory exceed the quota of %llu bytes",
                   (unsigned long long)bytes, (unsigned long long)limit);
        return rc;
    }
    *ordinal = o;
    *footprint = bytes;
    return CUDA_SUCCESS;
}

/* Keeps the claim for `exec` when instantiation succeeded, else gives it back. */
static void instantiated(CUresult rc, CUgraphExec exec, CUdevice ordinal, uint64_t footprint, bool uploaded) {
    if (ordinal < 0) return;
    pthread_mutex_lock(&graph_lock);
    if (rc == CUDA_SUCCESS && room_for_one((void **)&execs, nexecs, &capexecs, sizeof *execs)) {
        execs[nexecs++] = (struct exec){exec, ordinal, footprint};
        if (uploaded) refresh_locked(ordinal);
        else settle(&devices[ordinal]); /* what a trim before deny freed */
    } else {
        if (rc == CUDA_SUCCESS) vcuda_warn("out of host memory: a graph's memory stays charged until exit");
        else devices[ordinal].claims -= footprint;
        settle(&devices[ordinal]);
    }
    pthread_mutex_unlock(&graph_lock);
}

CUresult vc_cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph, unsigned long long flags) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphInstantiateWithFlags, "cuGraphInstantiateWithFlags");
    CUdevice ordinal;
    uint64_t footprint;
    if (rc == CUDA_SUCCESS) rc = claim(hGraph, &ordinal, &footprint);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGraphInstantiateWithFlags(phGraphExec, hGraph, flags);
    instantiated(rc, rc == CUDA_SUCCESS ? *phGraphExec : NULL, ordinal, footprint,
                 flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD);
    return rc;
}

/* cuGraphInstantiate_v2 and the legacy cuGraphInstantiate (below 11000): the same parameters. */
static CUresult instantiate_with_log(CUresult (**real)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t),
                                     const char *name, CUgraphExec *phGraphExec, CUgraph hGraph,
                                     CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize) {
    CUresult rc = vcuda_real_ready((void **)real, name);
    CUdevice ordinal;
    uint64_t footprint;
    if (rc == CUDA_SUCCESS) rc = claim(hGraph, &ordinal, &footprint);
    if (rc != CUDA_SUCCESS) return rc;
    rc = (*real)(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
    instantiated(rc, rc == CUDA_SUCCESS ? *phGraphExec : NULL, ordinal, footprint, false);
    return rc;
}

CUresult vc_cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                  char *logBuffer, size_t bufferSize) {
    return instantiate_with_log(&vcuda_real.cuGraphInstantiate_v2, "cuGraphInstantiate_v2", phGraphExec, hGraph,
                                phErrorNode, logBuffer, bufferSize);
}

CUresult vc_cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode, char *logBuffer,
                               size_t bufferSize) {
    return instantiate_with_log(&vcuda_real.cuGraphInstantiate, "cuGraphInstantiate", phGraphExec, hGraph,
                                phErrorNode, logBuffer, bufferSize);
}

static CUresult instantiate_with_params(CUresult (*real)(CUgraphExec *, CUgraph, CUDA_GRAPH_INSTANTIATE_PARAMS *),
                                        CUgraphExec *phGraphExec, CUgraph hGraph,
                                        CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUdevice ordinal;
    uint64_t footprint;
    CUresult rc = claim(hGraph, &ordinal, &footprint);
    if (rc != CUDA_SUCCESS) return rc;
    rc = real(phGraphExec, hGraph, params);
    instantiated(rc, rc == CUDA_SUCCESS ? *phGraphExec : NULL, ordinal, footprint,
                 params && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD));
    return rc;
}

CUresult vc_cuGraphInstantiateWithParams(CUgraphExec *phGraphExec, CUgraph hGraph,
                                         CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphInstantiateWithParams, "cuGraphInstantiateWithParams");
    if (rc != CUDA_SUCCESS) return rc;
    return instantiate_with_params(vcuda_real.cuGraphInstantiateWithParams, phGraphExec, hGraph, params);
}

CUresult vc_cuGraphInstantiateWithParams_ptsz(CUgraphExec *phGraphExec, CUgraph hGraph,
                                              CUDA_GRAPH_INSTANTIATE_PARAMS *params) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphInstantiateWithParams_ptsz,
                                   "cuGraphInstantiateWithParams_ptsz");
    if (rc != CUDA_SUCCESS) return rc;
    return instantiate_with_params(vcuda_real.cuGraphInstantiateWithParams_ptsz, phGraphExec, hGraph, params);
}

/* The device of a live executable graph, -1 when it holds no graph memory. */
static CUdevice exec_device(CUgraphExec exec, bool forget) {
    CUdevice ordinal = -1;
    pthread_mutex_lock(&graph_lock);
    for (size_t i = 0; i < nexecs; i++) {
        if (execs[i].exec != exec) continue;
        ordinal = execs[i].ordinal;
        if (forget) {
            devices[ordinal].claims -= execs[i].footprint;
            execs[i] = execs[--nexecs];
        }
        break;
    }
    pthread_mutex_unlock(&graph_lock);
    return ordinal;
}

/* An upload returned `rc`: it mapped the graph's memory. */
static CUresult uploaded(CUresult rc, CUgraphExec exec) {
    if (rc == CUDA_SUCCESS) refresh(exec_device(exec, false));
    return rc;
}

CUresult vc_cuGraphUpload(CUgraphExec hGraphExec, CUstream hStream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphUpload, "cuGraphUpload");
    return rc != CUDA_SUCCESS ? rc : uploaded(vcuda_real.cuGraphUpload(hGraphExec, hStream), hGraphExec);
}

CUresult vc_cuGraphUpload_ptsz(CUgraphExec hGraphExec, CUstream hStream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphUpload_ptsz, "cuGraphUpload_ptsz");
    return rc != CUDA_SUCCESS ? rc : uploaded(vcuda_real.cuGraphUpload_ptsz(hGraphExec, hStream), hGraphExec);
}

CUresult vc_cuGraphExecDestroy(CUgraphExec hGraphExec) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphExecDestroy, "cuGraphExecDestroy");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGraphExecDestroy(hGraphExec);
    /* Its memory stays in the reserve (read again) until a trim. */
    if (rc == CUDA_SUCCESS) refresh(exec_device(hGraphExec, true));
    return rc;
}

CUresult vc_cuDeviceGraphMemTrim(CUdevice device) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuDeviceGraphMemTrim, "cuDeviceGraphMemTrim");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuDeviceGraphMemTrim(device);
    if (rc == CUDA_SUCCESS) refresh(device);
    return rc;
}

/* ---- graphs ------------------------------------------------------------------------ */

CUresult vc_cuGraphAddMemAllocNode(CUgraphNode *phGraphNode, CUgraph hGraph, const CUgraphNode *dependencies,
                                   size_t numDependencies, CUDA_MEM_ALLOC_NODE_PARAMS *nodeParams) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphAddMemAllocNode, "cuGraphAddMemAllocNode");
    /* The node allocates on the device its pool properties name, whatever the context. */
    if (rc == CUDA_SUCCESS && nodeParams && !vcuda_config.disabled &&
        nodeParams->poolProps.location.type == CU_MEM_LOCATION_TYPE_DEVICE)
        rc = vcuda_device_admit(nodeParams->poolProps.location.id);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGraphAddMemAllocNode(phGraphNode, hGraph, dependencies, numDependencies, nodeParams);
    if (rc == CUDA_SUCCESS && nodeParams && !vcuda_config.disabled) {
        /* No reuse assumed between nodes added one by one: the footprint only errs high. */
        pthread_mutex_lock(&graph_lock);
        add_footprint(hGraph, round_up(nodeParams->bytesize, GRAPH_GRANULE));
        pthread_mutex_unlock(&graph_lock);
    }
    return rc;
}

CUresult vc_cuGraphDestroy(CUgraph hGraph) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuGraphDestroy, "cuGraphDestroy");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuGraphDestroy(hGraph);
    if (rc == CUDA_SUCCESS) {
        pthread_mutex_lock(&graph_lock);
        struct graph *g = graph_of(hGraph);
        if (g) *g = graphs[--ngraphs];
        pthread_mutex_unlock(&graph_lock);
    }
    return rc;
}

/* A capture begun on `stream` through any ABI (the legacy ones, below 10010,
 * take no mode: CU_STREAM_CAPTURE_MODE_GLOBAL) returned `rc`. */
static CUresult began(CUresult rc, CUstream stream) {
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) capture_begun(stream);
    return rc;
}

CUresult vc_cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamBeginCapture_v2, "cuStreamBeginCapture_v2");
    return rc != CUDA_SUCCESS ? rc : began(vcuda_real.cuStreamBeginCapture_v2(hStream, mode), hStream);
}

CUresult vc_cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamBeginCapture_v2_ptsz, "cuStreamBeginCapture_v2_ptsz");
    if (rc != CUDA_SUCCESS) return rc;
    return began(vcuda_real.cuStreamBeginCapture_v2_ptsz(hStream, mode), named_stream(hStream, true));
}

CUresult vc_cuStreamBeginCapture(CUstream hStream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamBeginCapture, "cuStreamBeginCapture");
    return rc != CUDA_SUCCESS ? rc : began(vcuda_real.cuStreamBeginCapture(hStream), hStream);
}

CUresult vc_cuStreamBeginCapture_ptsz(CUstream hStream) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamBeginCapture_ptsz, "cuStreamBeginCapture_ptsz");
    if (rc != CUDA_SUCCESS) return rc;
    return began(vcuda_real.cuStreamBeginCapture_ptsz(hStream), named_stream(hStream, true));
}

CUresult vc_cuStreamEndCapture(CUstream hStream, CUgraph *phGraph) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamEndCapture, "cuStreamEndCapture");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuStreamEndCapture(hStream, phGraph);
    if (!vcuda_config.disabled) capture_ended(hStream, rc == CUDA_SUCCESS && phGraph ? *phGraph : NULL);
    return rc;
}

CUresult vc_cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuStreamEndCapture_ptsz, "cuStreamEndCapture_ptsz");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuStreamEndCapture_ptsz(hStream, phGraph);
    if (!vcuda_config.disabled)
        capture_ended(named_stream(hStream, true), rc == CUDA_SUCCESS && phGraph ? *phGraph : NULL);
    return rc;
}

void vcuda_graph_mem_reset_after_fork(void) {
    pthread_mutex_init(&graph_lock, NULL);
    /* The parent's buffers stay allocated in the child: never touched again. */
    captures = NULL;
    graphs = NULL;
    execs = NULL;
    ncaptures = capcaptures = ngraphs = capgraphs = nexecs = capexecs = 0;
    atomic_store(&vcuda_captures_active, 0);
    for (int d = 0; d < VCUDA_MAX_DEVICES; d++) devices[d] = (struct graph_dev){.dev = -1};
}
