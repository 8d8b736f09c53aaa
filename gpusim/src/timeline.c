/* The execution timeline. Each simulated device runs one kernel at a time,
 * for all processes: a kernel starts at max(now, the device's busy-until)
 * and ends dur later, in launch order (the shared lock orders launches).
 * A stream remembers the end times of its queued kernels; waiting on a
 * stream, event or context sleeps until the simulated completion time.
 * Streams and events live here too: they are views onto the timeline. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

static pthread_key_t pts_key;
static pthread_once_t pts_once = PTHREAD_ONCE_INIT;
static _Thread_local struct sim_stream *per_thread;

static void pts_free(void *p)
{
    struct sim_stream *s = p;
    free(s->pending);
    free(s);
}

static void pts_key_init(void)
{
    pthread_key_create(&pts_key, pts_free);
}

static struct sim_stream *stream_new(struct sim_ctx *c, unsigned flags, int priority)
{
    struct sim_stream *s = calloc(1, sizeof *s);
    if (!s)
        return NULL;
    s->magic = SIM_STREAM_MAGIC;
    s->alive = true;
    s->ctx = c;
    s->flags = flags;
    s->priority = priority;
    return s;
}

CUresult sim_stream_resolve(CUstream h, bool ptsz, struct sim_stream **out)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (h == NULL)
        h = ptsz ? CU_STREAM_PER_THREAD : CU_STREAM_LEGACY;
    if (h == CU_STREAM_LEGACY || h == CU_STREAM_PER_THREAD) {
        struct sim_ctx *c = sim_current_ctx();
        if (!c)
            return CUDA_ERROR_INVALID_CONTEXT;
        if (h == CU_STREAM_PER_THREAD) {
            if (!per_thread) {
                pthread_once(&pts_once, pts_key_init);
                if (!(per_thread = stream_new(NULL, 0, 0)))
                    return CUDA_ERROR_OUT_OF_MEMORY;
                pthread_setspecific(pts_key, per_thread);
            }
            *out = per_thread;
            return CUDA_SUCCESS;
        }
        pthread_mutex_lock(&sim.mu);
        if (!c->legacy)
            c->legacy = stream_new(c, 0, 0);
        *out = c->legacy;
        pthread_mutex_unlock(&sim.mu);
        return *out ? CUDA_SUCCESS : CUDA_ERROR_OUT_OF_MEMORY;
    }
    struct sim_stream *s = (struct sim_stream *)h;
    if (s->magic != SIM_STREAM_MAGIC || !s->alive || !sim_ctx_valid(s->ctx))
        return CUDA_ERROR_INVALID_HANDLE;
    *out = s;
    return CUDA_SUCCESS;
}

struct sim_ctx *sim_stream_ctx(const struct sim_stream *s)
{
    return s->ctx ? s->ctx : sim_current_ctx();
}

void sim_wait(uint64_t t_ns)
{
    if (t_ns > sim_now_ns())
        sim_sleep_until(t_ns);
}

/* Caller holds sim.mu. Drops the kernels that have completed by now. */
static void stream_retire(struct sim_stream *s, uint64_t now)
{
    while (s->count && s->pending[s->head] <= now) {
        s->head = (s->head + 1) % s->cap;
        s->count--;
    }
}

/* Caller holds sim.mu. Makes room for one more queued kernel. */
static int stream_reserve(struct sim_stream *s)
{
    if (s->count < s->cap)
        return 0;
    size_t ncap = s->cap ? s->cap * 2 : 16;
    uint64_t *n = malloc(ncap * sizeof *n);
    if (!n)
        return -1;
    for (size_t i = 0; i < s->count; i++)
        n[i] = s->pending[(s->head + i) % s->cap];
    free(s->pending);
    s->pending = n;
    s->head = 0;
    s->cap = ncap;
    return 0;
}

/* Caller holds the shared lock. Records [start, end) as busy on the device. */
static void record_run(struct sim_device *d, uint64_t start, uint64_t end)
{
    struct sim_run *last = d->run_count ? &d->runs[d->run_head] : NULL;
    if (last && last->end_ns == start) {
        last->end_ns = end; /* back to back: one run */
        return;
    }
    d->run_head = d->run_count ? (d->run_head + 1) % SIM_RUNS : 0;
    d->runs[d->run_head] = (struct sim_run){start, end};
    if (d->run_count < SIM_RUNS)
        d->run_count++;
}

CUresult sim_launch(struct sim_stream *s, uint64_t dur_us)
{
    struct sim_shared *sh = sim.sh;
    uint64_t dur = dur_us > UINT64_MAX / 4000 ? UINT64_MAX / 4 : dur_us * 1000;
    pthread_mutex_lock(&sim.mu);
    if (s->capture) {
        CUresult rc = sim_graph_append(s->capture, dur_us);
        pthread_mutex_unlock(&sim.mu);
        return rc;
    }
    struct sim_ctx *c = sim_stream_ctx(s);
    if (!c || !s->alive) {
        pthread_mutex_unlock(&sim.mu);
        return c ? CUDA_ERROR_INVALID_HANDLE : CUDA_ERROR_INVALID_CONTEXT;
    }
    for (;;) {
        stream_retire(s, sim_now_ns());
        if (s->count < sh->max_pending)
            break;
        /* Queue full: block the launcher until the oldest kernel completes. */
        uint64_t t = s->pending[s->head];
        pthread_mutex_unlock(&sim.mu);
        sim_sleep_until(t);
        pthread_mutex_lock(&sim.mu);
        if (!s->alive || !sim_ctx_valid(c)) {
            pthread_mutex_unlock(&sim.mu);
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    if (stream_reserve(s) != 0) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }

    sim_lock(sh);
    struct sim_device *d = &sh->dev[c->phys];
    uint64_t now = sim_now_ns();
    uint64_t start = d->busy_until_ns > now ? d->busy_until_ns : now;
    uint64_t end = start + dur;
    d->busy_until_ns = end;
    d->busy_ns += dur;
    d->kernels++;
    if (dur)
        record_run(d, start, end);
    struct sim_proc *pr = &sh->proc[sim.slot];
    pr->busy_ns[c->phys] += dur;
    pr->kernels[c->phys]++;
    sim_unlock(sh);

    s->pending[(s->head + s->count++) % s->cap] = end;
    s->tail_ns = end;
    if (end > c->last_end_ns)
        c->last_end_ns = end;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

/* ---- streams ---- */

SIM_EXPORT CUresult cuStreamCreateWithPriority(CUstream *phStream, unsigned int flags,
                                               int priority)
{
    struct sim_ctx *c;
    if (!phStream || (flags & ~(unsigned)CU_STREAM_NON_BLOCKING))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Priorities are accepted and clamped; the simulator runs FIFO anyway. */
    priority = priority > 0 ? 0 : priority < -5 ? -5 : priority;
    struct sim_stream *s = stream_new(c, flags, priority);
    if (!s)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *phStream = (CUstream)s;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuStreamCreate(CUstream *phStream, unsigned int Flags)
{
    return cuStreamCreateWithPriority(phStream, Flags, 0);
}

SIM_EXPORT CUresult cuStreamDestroy_v2(CUstream hStream)
{
    struct sim_stream *s;
    if (hStream == NULL || hStream == CU_STREAM_LEGACY || hStream == CU_STREAM_PER_THREAD)
        return CUDA_ERROR_INVALID_HANDLE;
    CUresult rc = sim_stream_resolve(hStream, false, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    /* Queued work still runs (it is on the device timeline already). */
    pthread_mutex_lock(&sim.mu);
    s->alive = false;
    free(s->pending);
    s->pending = NULL;
    s->count = s->cap = s->head = 0;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

static CUresult stream_sync(CUstream h, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    bool capturing = s->capture != NULL;
    uint64_t t = s->tail_ns;
    pthread_mutex_unlock(&sim.mu);
    if (capturing)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    sim_wait(t);
    sim_pools_release_on_sync();
    return CUDA_SUCCESS;
}

static CUresult stream_query(CUstream h, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    uint64_t t = s->tail_ns;
    pthread_mutex_unlock(&sim.mu);
    return t <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuStreamSynchronize(CUstream hStream) { return stream_sync(hStream, false); }
SIM_EXPORT CUresult cuStreamSynchronize_ptsz(CUstream hStream) { return stream_sync(hStream, true); }
SIM_EXPORT CUresult cuStreamQuery(CUstream hStream) { return stream_query(hStream, false); }
SIM_EXPORT CUresult cuStreamQuery_ptsz(CUstream hStream) { return stream_query(hStream, true); }

/* ---- events ---- */

static struct sim_event *event_of(CUevent h)
{
    struct sim_event *e = (struct sim_event *)h;
    return e && e->magic == SIM_EVENT_MAGIC && e->alive ? e : NULL;
}

/* On one serial timeline every earlier kernel precedes every later one, so
 * a cross-stream wait is already satisfied: only the handles are checked. */
static CUresult stream_wait_event(CUstream h, CUevent ev, unsigned flags, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!event_of(ev))
        return CUDA_ERROR_INVALID_HANDLE;
    return flags <= 1 ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

SIM_EXPORT CUresult cuStreamWaitEvent(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags, false);
}

SIM_EXPORT CUresult cuStreamWaitEvent_ptsz(CUstream hStream, CUevent hEvent, unsigned int Flags)
{
    return stream_wait_event(hStream, hEvent, Flags, true);
}

SIM_EXPORT CUresult cuEventCreate(CUevent *phEvent, unsigned int Flags)
{
    struct sim_ctx *c;
    if (!phEvent || (Flags & ~0x7u))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    struct sim_event *e = calloc(1, sizeof *e);
    if (!e)
        return CUDA_ERROR_OUT_OF_MEMORY;
    *e = (struct sim_event){.magic = SIM_EVENT_MAGIC, .alive = true, .flags = Flags};
    *phEvent = (CUevent)e;
    return CUDA_SUCCESS;
}

static CUresult event_record(CUevent ev, CUstream h, bool ptsz)
{
    struct sim_stream *s;
    struct sim_event *e = event_of(ev);
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim.mu);
    if (!s->capture) { /* inside a capture it would be a graph node: ignored */
        uint64_t now = sim_now_ns();
        e->time_ns = s->tail_ns > now ? s->tail_ns : now;
        e->recorded = true;
    }
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventRecord(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream, false);
}

SIM_EXPORT CUresult cuEventRecord_ptsz(CUevent hEvent, CUstream hStream)
{
    return event_record(hEvent, hStream, true);
}

SIM_EXPORT CUresult cuEventQuery(CUevent hEvent)
{
    struct sim_event *e = event_of(hEvent);
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim.mu);
    uint64_t t = e->recorded ? e->time_ns : 0;
    pthread_mutex_unlock(&sim.mu);
    return t <= sim_now_ns() ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    struct sim_event *e = event_of(hEvent);
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim.mu);
    uint64_t t = e->recorded ? e->time_ns : 0;
    pthread_mutex_unlock(&sim.mu);
    sim_wait(t);
    sim_pools_release_on_sync();
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventElapsedTime(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    struct sim_event *a = event_of(hStart), *b = event_of(hEnd);
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pMilliseconds)
        return CUDA_ERROR_INVALID_VALUE;
    if (!a || !b || ((a->flags | b->flags) & CU_EVENT_DISABLE_TIMING))
        return CUDA_ERROR_INVALID_HANDLE;
    pthread_mutex_lock(&sim.mu);
    bool recorded = a->recorded && b->recorded;
    uint64_t ta = a->time_ns, tb = b->time_ns;
    pthread_mutex_unlock(&sim.mu);
    if (!recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    uint64_t now = sim_now_ns();
    if (ta > now || tb > now)
        return CUDA_ERROR_NOT_READY;
    *pMilliseconds = (float)(((double)tb - (double)ta) / 1e6);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuEventElapsedTime_v2(float *pMilliseconds, CUevent hStart, CUevent hEnd)
{
    return cuEventElapsedTime(pMilliseconds, hStart, hEnd);
}

SIM_EXPORT CUresult cuEventDestroy_v2(CUevent hEvent)
{
    struct sim_event *e = event_of(hEvent);
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    e->alive = false; /* kept allocated: see the handle note in sim.h */
    return CUDA_SUCCESS;
}
