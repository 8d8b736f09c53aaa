/* Streams and events: views onto the device schedule (schedule.c).
 * A launch appends its kernel to this process's queue on the device; the
 * kernel, and the stream work and events before it, complete when the
 * schedule has served the process's queue up to that point (a sim_mark).
 * Waiting on a stream, event or context sleeps until the predicted
 * completion, then advances the schedule and looks again. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

/* While other processes have work queued, a wait sleeps at most this long
 * before looking again: one that dies brings completions forward, which no
 * prediction foresees. */
#define SIM_RECHECK_NS 10000000ull

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
    s->gen = sim.gen;
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
            if (per_thread->gen != sim.gen) { /* forked: the parent's queue is not ours */
                pthread_mutex_lock(&sim.mu);
                per_thread->head = per_thread->count = 0;
                per_thread->tail = (struct sim_mark){0};
                per_thread->gen = sim.gen;
                pthread_mutex_unlock(&sim.mu);
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

/* Caller holds the shared lock. Has this process's work on phys reached pos
 * (as of the last advance)? A position it never had counts as reached, and
 * so does everything once its slot was taken from it (its work was dropped). */
static bool reached(const struct sim_shared *sh, unsigned phys, uint64_t pos)
{
    const struct sim_proc *p = &sh->proc[sim.slot];
    return p->busy_ns[phys] >= pos || p->queued_ns[phys] < pos || p->pid != sim.pid;
}

/* Likewise, the schedule advanced to now first. */
static bool reached_locked(struct sim_shared *sh, unsigned phys, uint64_t pos, uint64_t now)
{
    sim_sched_advance(sh, phys, now);
    return reached(sh, phys, pos);
}

bool sim_mark_done(struct sim_mark m)
{
    if (m.pos == 0)
        return true;
    sim_lock(sim.sh);
    bool done = reached_locked(sim.sh, m.phys, m.pos, sim_now_ns());
    sim_unlock(sim.sh);
    return done;
}

/* Whether a synchronize in context c busy-waits, as the driver's does unless
 * the context asked to block (CU_CTX_SCHED_BLOCKING_SYNC). */
static bool ctx_spins(const struct sim_ctx *c)
{
    return !c || (c->flags & CU_CTX_SCHED_MASK) != CU_CTX_SCHED_BLOCKING_SYNC;
}

/* Sleeps until m is reached: until its predicted completion if nothing more
 * is launched (later launches by others only delay it), then looks again;
 * spinning through the end of a predicted completion when `spin`. */
static void mark_wait(struct sim_mark m, bool spin)
{
    struct sim_shared *sh = sim.sh;
    if (m.pos == 0)
        return;
    for (;;) {
        sim_lock(sh);
        uint64_t now = sim_now_ns();
        if (reached_locked(sh, m.phys, m.pos, now)) {
            sim_unlock(sh);
            return;
        }
        const struct sim_proc *p = &sh->proc[sim.slot];
        bool alone = sim_sched_pending(sh, m.phys) == p->queued_ns[m.phys] - p->busy_ns[m.phys];
        uint64_t t = sim_sched_predict(sh, m.phys, sim.slot, m.pos,
                                       alone ? UINT64_MAX : now + SIM_RECHECK_NS);
        sim_unlock(sh);
        sim_sleep_until(t, spin && (alone || t < now + SIM_RECHECK_NS) ? sim.spin_ns : 0);
    }
}

/* Caller holds sim.mu and the shared lock, phys advanced. Drops the kernels
 * that have completed. */
static void stream_retire(struct sim_stream *s)
{
    while (s->count) {
        struct sim_mark m = s->pending[s->head];
        if (!reached(sim.sh, m.phys, m.pos))
            break;
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
    struct sim_mark *n = malloc(ncap * sizeof *n);
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
    if (stream_reserve(s) != 0) {
        pthread_mutex_unlock(&sim.mu);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    unsigned phys = c->phys;
    struct sim_proc *pr = &sh->proc[sim.slot];
    for (;;) {
        sim_lock(sh);
        sim_sched_advance(sh, phys, sim_now_ns()); /* before queueing: see schedule.c */
        stream_retire(s);
        if (s->count < sh->max_pending)
            break;
        /* Queue full: block the launcher until its oldest kernel completes. */
        struct sim_mark oldest = s->pending[s->head];
        sim_unlock(sh);
        pthread_mutex_unlock(&sim.mu);
        mark_wait(oldest, ctx_spins(c));
        pthread_mutex_lock(&sim.mu);
        if (!s->alive || !sim_ctx_valid(c)) {
            pthread_mutex_unlock(&sim.mu);
            return CUDA_ERROR_INVALID_HANDLE;
        }
    }
    pr->queued_ns[phys] += dur;
    pr->kernels[phys]++;
    sh->dev[phys].kernels++;
    struct sim_mark m = {.pos = pr->queued_ns[phys], .phys = phys};
    sim_unlock(sh);

    s->pending[(s->head + s->count++) % s->cap] = m;
    s->tail = m;
    c->last_pos = m.pos;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

void sim_stream_drain(struct sim_stream *s)
{
    pthread_mutex_lock(&sim.mu);
    struct sim_mark m = s->tail;
    struct sim_ctx *c = sim_stream_ctx(s);
    pthread_mutex_unlock(&sim.mu);
    mark_wait(m, ctx_spins(c));
}

void sim_ctx_drain(struct sim_ctx *c)
{
    pthread_mutex_lock(&sim.mu);
    struct sim_mark m = {.pos = c->last_pos, .phys = c->phys};
    pthread_mutex_unlock(&sim.mu);
    mark_wait(m, ctx_spins(c));
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
    /* Priorities are accepted and clamped; a process's kernels run in launch
     * order anyway. */
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
    /* Queued work still runs (it is in the process's queue already). */
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
    pthread_mutex_unlock(&sim.mu);
    if (capturing)
        return CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED;
    rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_stream_drain(s);
    sim_pools_release_on_sync();
    return CUDA_SUCCESS;
}

static CUresult stream_query(CUstream h, bool ptsz)
{
    struct sim_stream *s;
    CUresult rc = sim_stream_resolve(h, ptsz, &s);
    if (rc != CUDA_SUCCESS)
        return rc;
    rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    struct sim_mark m = s->tail;
    pthread_mutex_unlock(&sim.mu);
    return sim_mark_done(m) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
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

/* A process's kernels run in launch order, so a wait on an event of the
 * same process is already satisfied: only the handles are checked. */
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

/* Caller holds sim.mu. Whether e has completed; notes when, the first time
 * it is seen complete: from its process's service history (never before it
 * was recorded), or now if none is kept. */
static bool event_done(struct sim_event *e)
{
    if (!e->recorded || e->time_ns)
        return true;
    struct sim_shared *sh = sim.sh;
    sim_lock(sh);
    uint64_t now = sim_now_ns();
    bool done = reached_locked(sh, e->mark.phys, e->mark.pos, now);
    if (done) {
        uint64_t t = sim_sched_served_at(sh, e->mark.phys, sim.slot, e->mark.pos);
        e->time_ns = !t ? now : t > e->record_ns ? t : e->record_ns;
    }
    sim_unlock(sh);
    return done;
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
        e->mark = s->tail;
        e->record_ns = sim_now_ns();
        e->time_ns = 0;
        e->recorded = true;
        event_done(e); /* nothing before it left: complete at once */
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
    rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    bool done = event_done(e);
    pthread_mutex_unlock(&sim.mu);
    return done ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY;
}

SIM_EXPORT CUresult cuEventSynchronize(CUevent hEvent)
{
    struct sim_event *e = event_of(hEvent);
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!e)
        return CUDA_ERROR_INVALID_HANDLE;
    rc = sim_capture_unsafe_call();
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    bool recorded = e->recorded;
    struct sim_mark m = e->mark;
    pthread_mutex_unlock(&sim.mu);
    if (recorded) {
        mark_wait(m, !(e->flags & CU_EVENT_BLOCKING_SYNC));
        pthread_mutex_lock(&sim.mu);
        event_done(e);
        pthread_mutex_unlock(&sim.mu);
    }
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
    bool done = recorded && event_done(a) && event_done(b);
    uint64_t ta = a->time_ns, tb = b->time_ns;
    pthread_mutex_unlock(&sim.mu);
    if (!recorded)
        return CUDA_ERROR_INVALID_HANDLE;
    if (!done)
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
