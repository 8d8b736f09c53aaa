/* Kernel launches and graphs made by stream capture.
 *
 * Kernel duration convention: a kernel runs for the number of microseconds
 * in the uint64_t that kernelParams[0] points to, or in the first 8 bytes of
 * the CU_LAUNCH_PARAM_BUFFER_POINTER buffer when `extra` is used. No
 * parameters: 0 us. Grid and block sizes do not change the duration. */
#define _GNU_SOURCE
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

static CUresult duration_of(void **kernelParams, void **extra, uint64_t *us)
{
    *us = 0;
    if (kernelParams && extra)
        return CUDA_ERROR_INVALID_VALUE;
    if (kernelParams) {
        if (kernelParams[0])
            memcpy(us, kernelParams[0], sizeof *us);
        return CUDA_SUCCESS;
    }
    if (!extra)
        return CUDA_SUCCESS;
    const void *buf = NULL;
    size_t size = 0;
    for (size_t i = 0; extra[i] != CU_LAUNCH_PARAM_END; i += 2) {
        if (extra[i] == CU_LAUNCH_PARAM_BUFFER_POINTER)
            buf = extra[i + 1];
        else if (extra[i] == CU_LAUNCH_PARAM_BUFFER_SIZE && extra[i + 1])
            memcpy(&size, extra[i + 1], sizeof size);
        else
            return CUDA_ERROR_INVALID_VALUE;
    }
    if (buf && size >= sizeof *us)
        memcpy(us, buf, sizeof *us);
    return CUDA_SUCCESS;
}

static CUresult launch(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                       unsigned by, unsigned bz, CUstream h, void **params, void **extra,
                       bool ptsz)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!sim_func_valid((const struct sim_func *)f))
        return CUDA_ERROR_INVALID_HANDLE;
    if (!gx || !gy || !gz || !bx || !by || !bz || (uint64_t)bx * by * bz > 1024)
        return CUDA_ERROR_INVALID_VALUE;
    uint64_t us;
    if ((rc = duration_of(params, extra, &us)) != CUDA_SUCCESS)
        return rc;
    struct sim_stream *s;
    if ((rc = sim_stream_resolve(h, ptsz, &s)) != CUDA_SUCCESS)
        return rc;
    struct sim_ctx *c = sim_stream_ctx(s);
    if (c && (rc = sim_func_ready((struct sim_func *)f, c)) != CUDA_SUCCESS)
        return rc; /* lazy code load or local memory growth did not fit */
    return sim_launch(s, us);
}

SIM_EXPORT CUresult cuLaunchKernel SIM_LAUNCH_PARAMS
{
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, false);
}

SIM_EXPORT CUresult cuLaunchKernel_ptsz SIM_LAUNCH_PARAMS
{
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, extra, true);
}

static CUresult launch_ex(const CUlaunchConfig *config, CUfunction f, void **kernelParams,
                          void **extra, bool ptsz)
{
    if (!config)
        return CUDA_ERROR_INVALID_VALUE;
    return launch(f, config->gridDimX, config->gridDimY, config->gridDimZ, config->blockDimX,
                  config->blockDimY, config->blockDimZ, config->hStream, kernelParams, extra,
                  ptsz);
}

SIM_EXPORT CUresult cuLaunchKernelEx(const CUlaunchConfig *config, CUfunction f,
                                     void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, false);
}

SIM_EXPORT CUresult cuLaunchKernelEx_ptsz(const CUlaunchConfig *config, CUfunction f,
                                          void **kernelParams, void **extra)
{
    return launch_ex(config, f, kernelParams, extra, true);
}

SIM_EXPORT CUresult cuLaunchCooperativeKernel SIM_COOP_PARAMS
{
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, NULL, false);
}

SIM_EXPORT CUresult cuLaunchCooperativeKernel_ptsz SIM_COOP_PARAMS
{
    (void)sharedMemBytes;
    return launch(f, gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, hStream,
                  kernelParams, NULL, true);
}

/* ---- graphs: a captured graph is the list of its kernels' durations ---- */

struct sim_graph *sim_graph_new(bool exec)
{
    struct sim_graph *g = calloc(1, sizeof *g);
    if (g)
        *g = (struct sim_graph){.magic = SIM_GRAPH_MAGIC, .alive = true, .exec = exec};
    return g;
}

struct sim_graph *sim_graph_of(void *h, bool exec)
{
    struct sim_graph *g = h;
    return g && g->magic == SIM_GRAPH_MAGIC && g->alive && g->exec == exec ? g : NULL;
}

CUresult sim_graph_append(struct sim_graph *g, uint64_t dur_us)
{
    if (g->n == g->cap) {
        size_t ncap = g->cap ? g->cap * 2 : 16;
        uint64_t *d = realloc(g->dur_us, ncap * sizeof *d);
        if (!d)
            return CUDA_ERROR_OUT_OF_MEMORY;
        g->dur_us = d;
        g->cap = ncap;
    }
    g->dur_us[g->n++] = dur_us;
    return CUDA_SUCCESS;
}

/* Capture interaction modes, as the driver documents them
 * (cuThreadExchangeStreamCaptureMode): a thread in GLOBAL mode (the default)
 * may make no potentially unsafe call while it has a capture of its own not
 * begun RELAXED, or while another thread has one begun GLOBAL; THREAD_LOCAL
 * only minds its own; RELAXED is never prohibited. A prohibited call fails and
 * invalidates the captures that prohibited it: their cuStreamEndCapture
 * returns CUDA_ERROR_STREAM_CAPTURE_INVALIDATED. Real frameworks hit this
 * (PyTorch captures GLOBAL), so a shim thread that synchronizes or queries
 * events during an application's capture must opt out (RELAXED). Whatever the
 * mode, synchronizing a whole context while one of its streams captures is
 * invalid (a broader handle than the capture) and invalidates every capture. */
static __thread CUstreamCaptureMode thread_mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
static __thread unsigned own_strict, own_global; /* this thread's captures not RELAXED, and GLOBAL */
static __thread unsigned own_violations;
static _Atomic unsigned global_captures, global_violations;
static _Atomic unsigned any_captures, context_violations; /* captures of every mode; whole-context syncs */

CUresult sim_capture_context_sync(void)
{
    if (atomic_load(&any_captures)) {
        atomic_fetch_add(&context_violations, 1);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return sim_capture_unsafe_call();
}

CUresult sim_capture_unsafe_call(void)
{
    if (thread_mode == CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_SUCCESS;
    if (own_strict) {
        own_violations++;
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    if (thread_mode == CU_STREAM_CAPTURE_MODE_GLOBAL && atomic_load(&global_captures) > own_global) {
        atomic_fetch_add(&global_violations, 1);
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    }
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode *mode)
{
    if (!mode || (unsigned)*mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    CUstreamCaptureMode old = thread_mode;
    thread_mode = *mode;
    *mode = old;
    return CUDA_SUCCESS;
}

static CUresult begin_capture(CUstream h, CUstreamCaptureMode mode, bool ptsz)
{
    struct sim_stream *s;
    if ((unsigned)mode > CU_STREAM_CAPTURE_MODE_RELAXED)
        return CUDA_ERROR_INVALID_VALUE;
    if (h == CU_STREAM_LEGACY || (h == NULL && !ptsz))
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED; /* the legacy stream cannot be captured */
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_graph *g = sim_graph_new(false);
    if (!g)
        return CUDA_ERROR_OUT_OF_MEMORY;
    pthread_mutex_lock(&sim.mu);
    if (s->capture) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
        free(g);
    } else {
        s->capture = g;
        s->capture_mode = mode;
        s->capture_owner = pthread_self();
        s->capture_snap_global = atomic_load(&global_violations);
        s->capture_snap_own = own_violations;
        s->capture_snap_context = atomic_load(&context_violations);
        atomic_fetch_add(&any_captures, 1);
        own_strict += mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        own_global += mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
            atomic_fetch_add(&global_captures, 1);
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

static CUresult end_capture(CUstream h, CUgraph *phGraph, bool ptsz)
{
    struct sim_stream *s;
    if (!phGraph)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_graph *invalid = NULL;
    pthread_mutex_lock(&sim.mu);
    if (!s->capture) {
        rc = CUDA_ERROR_ILLEGAL_STATE;
    } else if (s->capture_mode != CU_STREAM_CAPTURE_MODE_RELAXED &&
               !pthread_equal(s->capture_owner, pthread_self())) {
        rc = CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD;
    } else {
        CUstreamCaptureMode mode = s->capture_mode;
        own_strict -= mode != CU_STREAM_CAPTURE_MODE_RELAXED;
        own_global -= mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
        if (mode == CU_STREAM_CAPTURE_MODE_GLOBAL)
            atomic_fetch_sub(&global_captures, 1);
        atomic_fetch_sub(&any_captures, 1);
        bool violated = atomic_load(&context_violations) != s->capture_snap_context || (mode == CU_STREAM_CAPTURE_MODE_GLOBAL &&
                         atomic_load(&global_violations) != s->capture_snap_global) ||
                        (mode != CU_STREAM_CAPTURE_MODE_RELAXED && own_violations != s->capture_snap_own);
        if (violated) {
            invalid = s->capture;
            *phGraph = NULL;
            rc = CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
        } else {
            *phGraph = (CUgraph)s->capture;
        }
        s->capture = NULL;
    }
    pthread_mutex_unlock(&sim.mu);
    if (invalid)
        cuGraphDestroy((CUgraph)invalid);
    return rc;
}

static CUresult is_capturing(CUstream h, CUstreamCaptureStatus *st, bool ptsz)
{
    struct sim_stream *s;
    if (!st)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    *st = s->capture ? CU_STREAM_CAPTURE_STATUS_ACTIVE : CU_STREAM_CAPTURE_STATUS_NONE;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamBeginCapture_v2(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, mode, false);
}

SIM_EXPORT CUresult cuStreamBeginCapture_v2_ptsz(CUstream hStream, CUstreamCaptureMode mode)
{
    return begin_capture(hStream, mode, true);
}

/* The legacy ABI (before 10010): always CU_STREAM_CAPTURE_MODE_GLOBAL. */
SIM_EXPORT CUresult cuStreamBeginCapture(CUstream hStream)
{
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, false);
}

SIM_EXPORT CUresult cuStreamBeginCapture_ptsz(CUstream hStream)
{
    return begin_capture(hStream, CU_STREAM_CAPTURE_MODE_GLOBAL, true);
}

SIM_EXPORT CUresult cuStreamEndCapture(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, false);
}

SIM_EXPORT CUresult cuStreamEndCapture_ptsz(CUstream hStream, CUgraph *phGraph)
{
    return end_capture(hStream, phGraph, true);
}

SIM_EXPORT CUresult cuStreamIsCapturing(CUstream hStream, CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, captureStatus, false);
}

SIM_EXPORT CUresult cuStreamIsCapturing_ptsz(CUstream hStream,
                                             CUstreamCaptureStatus *captureStatus)
{
    return is_capturing(hStream, captureStatus, true);
}

SIM_EXPORT CUresult cuGraphInstantiateWithFlags(CUgraphExec *phGraphExec, CUgraph hGraph,
                                                unsigned long long flags)
{
    (void)flags;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!phGraphExec)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim.mu);
    struct sim_graph *g = sim_graph_of(hGraph, false), *x = g ? sim_graph_new(true) : NULL;
    if (!g) {
        rc = CUDA_ERROR_INVALID_VALUE;
    } else if (!x) {
        rc = CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        for (size_t i = 0; i < g->n && rc == CUDA_SUCCESS; i++)
            rc = sim_graph_append(x, g->dur_us[i]);
        if (rc == CUDA_SUCCESS)
            rc = sim_graph_mem_instantiate(g, x);
        if (rc == CUDA_SUCCESS)
            *phGraphExec = (CUgraphExec)x;
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

/* cuGraphInstantiate_v2 (11000) and the legacy cuGraphInstantiate (10000):
 * no flags, and no error node to name; the log stays empty. */
static CUresult instantiate_logged(CUgraphExec *phGraphExec, CUgraph hGraph, CUgraphNode *phErrorNode,
                                   char *logBuffer, size_t bufferSize)
{
    (void)phErrorNode;
    CUresult rc = cuGraphInstantiateWithFlags(phGraphExec, hGraph, 0);
    if (logBuffer && bufferSize)
        logBuffer[0] = '\0';
    return rc;
}

SIM_EXPORT CUresult cuGraphInstantiate_v2(CUgraphExec *phGraphExec, CUgraph hGraph,
                                          CUgraphNode *phErrorNode, char *logBuffer,
                                          size_t bufferSize)
{
    return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

SIM_EXPORT CUresult cuGraphInstantiate(CUgraphExec *phGraphExec, CUgraph hGraph,
                                       CUgraphNode *phErrorNode, char *logBuffer, size_t bufferSize)
{
    return instantiate_logged(phGraphExec, hGraph, phErrorNode, logBuffer, bufferSize);
}

static CUresult graph_launch(CUgraphExec hGraphExec, CUstream h, bool ptsz)
{
    struct sim_stream *s;
    struct sim_graph *x = sim_graph_of(hGraphExec, true);
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!x)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_graph_mem_map(x, s)) != CUDA_SUCCESS)
        return rc; /* its memory nodes did not fit */
    for (size_t i = 0; i < x->n && rc == CUDA_SUCCESS; i++)
        rc = sim_launch(s, x->dur_us[i]);
    sim_graph_mem_launched(x, s);
    return rc;
}

SIM_EXPORT CUresult cuGraphLaunch(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, false);
}

SIM_EXPORT CUresult cuGraphLaunch_ptsz(CUgraphExec hGraphExec, CUstream hStream)
{
    return graph_launch(hGraphExec, hStream, true);
}

static CUresult graph_destroy(void *h, bool exec)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    struct sim_graph *g = sim_graph_of(h, exec);
    if (g) {
        g->alive = false; /* kept allocated: see the handle note in sim.h */
        sim_graph_mem_destroy(g);
        free(g->dur_us);
        g->dur_us = NULL;
        g->n = g->cap = 0;
    }
    pthread_mutex_unlock(&sim.mu);
    return g ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuGraphExecDestroy(CUgraphExec hGraphExec) { return graph_destroy(hGraphExec, true); }
SIM_EXPORT CUresult cuGraphDestroy(CUgraph hGraph) { return graph_destroy(hGraph, false); }
