/* The execution schedule of each simulated device: what a GPU without MPS
 * does with the work of several processes. It runs one process at a time,
 * round-robin in time slices (VCUDA_SIM_TIMESLICE_US): the process whose
 * slice it is runs until the slice ends or its queue empties, then the next
 * process (in slot order) with queued work gets a fresh slice; idle time
 * serves nothing. Within a process, kernels run in launch order.
 *
 * Each process has, per device, a cumulative count of the work it queued and
 * of the work it was served (sim_proc.queued_ns, busy_ns): a kernel completes
 * when its process's served count reaches the queue position it got at
 * launch. The schedule is advanced lazily, under the shared lock, from the
 * last advance to now, by whoever looks at the device (a launch, a wait, a
 * query, an NVML or introspection reader); every change to a queue advances
 * first, so work is never served before it was launched. Busy time and the
 * utilization runs are charged as work is served. */
#define _GNU_SOURCE
#include <stdint.h>

#include "sim.h"

static uint64_t pending_of(const struct sim_shared *sh, unsigned phys, const uint64_t *served,
                           uint32_t i)
{
    const struct sim_proc *p = &sh->proc[i];
    uint64_t done = served ? served[i] : p->busy_ns[phys];
    return p->pid && p->queued_ns[phys] > done ? p->queued_ns[phys] - done : 0;
}

/* A position of the round robin: whose slice it is, and how much is used. */
struct rr {
    int cur;
    uint64_t used;
};

/* Who runs next from position r, and for how long (*len, at most span):
 * the current process until its slice ends or its queue empties, then the
 * next process with queued work. A process alone keeps running (its slices
 * follow one another). -1: nobody has work. served: the processes' served
 * counts (NULL: the shared state's). */
static int rr_next(const struct sim_shared *sh, unsigned phys, const uint64_t *served,
                   struct rr *r, uint64_t span, uint64_t *len)
{
    uint64_t slice = sh->timeslice_ns;
    uint32_t n = sh->nproc_hw, waiting = 0;
    uint32_t first = r->cur < 0 ? 0 : (uint32_t)r->cur + 1;
    int next = -1;
    for (uint32_t k = 0; k < n; k++) {
        uint32_t i = (first + k) % n;
        if (pending_of(sh, phys, served, i)) {
            waiting++;
            if (next < 0)
                next = (int)i;
        }
    }
    if (!waiting) {
        r->used = 0;
        return -1;
    }
    if (r->cur < 0 || (uint32_t)r->cur >= n || r->used >= slice ||
        !pending_of(sh, phys, served, (uint32_t)r->cur)) {
        r->cur = next;
        r->used = 0;
    }
    uint64_t l = pending_of(sh, phys, served, (uint32_t)r->cur);
    if (l > span)
        l = span;
    if (waiting > 1 && l > slice - r->used)
        l = slice - r->used;
    r->used = waiting > 1 ? r->used + l : (r->used + l) % slice;
    *len = l;
    return r->cur;
}

/* Records [start, end) as busy on the device (utilization). */
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

/* Serves len of slot's work on phys from time t. */
static void serve(struct sim_shared *sh, unsigned phys, int slot, uint64_t t, uint64_t len)
{
    struct sim_proc *p = &sh->proc[slot];
    struct sim_device *d = &sh->dev[phys];
    uint64_t pos = p->busy_ns[phys];
    struct sim_seg *last = p->seg_count ? &p->segs[p->seg_head] : NULL;
    if (last && last->dev == phys && last->t_ns + last->len == t && last->pos + last->len == pos) {
        last->len += len; /* its previous stretch goes on */
    } else {
        p->seg_head = p->seg_count ? (p->seg_head + 1) % SIM_SEGS : 0;
        p->segs[p->seg_head] = (struct sim_seg){.t_ns = t, .pos = pos, .len = len, .dev = phys};
        if (p->seg_count < SIM_SEGS)
            p->seg_count++;
    }
    p->busy_ns[phys] = pos + len;
    d->busy_ns += len;
    record_run(d, t, t + len);
}

/* A killed process's queued work stops running: it is dropped with the
 * process (which also returns its memory, as sim_reap_dead does). */
static void reap_queued(struct sim_shared *sh, unsigned phys)
{
    for (uint32_t i = 0; i < sh->nproc_hw; i++)
        if (pending_of(sh, phys, NULL, i) && !sim_proc_alive(&sh->proc[i]))
            sh->proc[i].pid = 0;
}

void sim_sched_advance(struct sim_shared *sh, unsigned phys, uint64_t now)
{
    struct sim_device *d = &sh->dev[phys];
    if (now <= d->sched_ns)
        return;
    /* Looking for the dead costs a /proc read each: at most once a slice. */
    if (now - d->reap_ns >= sh->timeslice_ns) {
        reap_queued(sh, phys);
        d->reap_ns = now;
    }
    struct rr r = {d->rr_slot, d->slice_used_ns};
    uint64_t t = d->sched_ns, len;
    int slot;
    while (t < now && (slot = rr_next(sh, phys, NULL, &r, now - t, &len)) >= 0) {
        serve(sh, phys, slot, t, len);
        t += len;
    }
    d->rr_slot = r.cur;
    d->slice_used_ns = r.used;
    d->sched_ns = now;
}

void sim_sched_advance_all(struct sim_shared *sh, uint64_t now)
{
    for (unsigned i = 0; i < SIM_MAX_PHYS; i++)
        if (sim_phys_valid(sh, i))
            sim_sched_advance(sh, i, now);
}

uint64_t sim_sched_predict(const struct sim_shared *sh, unsigned phys, int slot, uint64_t pos,
                           uint64_t until)
{
    const struct sim_device *d = &sh->dev[phys];
    uint64_t served[SIM_MAX_PROCS];
    for (uint32_t i = 0; i < sh->nproc_hw; i++)
        served[i] = sh->proc[i].busy_ns[phys];
    struct rr r = {d->rr_slot, d->slice_used_ns};
    uint64_t t = d->sched_ns, len;
    int s;
    if (served[slot] >= pos || sh->proc[slot].queued_ns[phys] < pos)
        return t; /* reached, or a position this process never had */
    /* The same round robin on a copy of the served counts, ahead in time. */
    while (t < until && (s = rr_next(sh, phys, served, &r, until - t, &len)) >= 0) {
        if (s == slot && served[s] + len >= pos)
            return t + (pos > served[s] ? pos - served[s] : 0);
        served[s] += len;
        t += len;
    }
    return t < until ? t : until;
}

uint64_t sim_sched_pending(const struct sim_shared *sh, unsigned phys)
{
    uint64_t sum = 0;
    for (uint32_t i = 0; i < sh->nproc_hw; i++)
        sum += pending_of(sh, phys, NULL, i);
    return sum;
}

uint64_t sim_sched_served_at(const struct sim_shared *sh, unsigned phys, int slot, uint64_t pos)
{
    const struct sim_proc *p = &sh->proc[slot];
    uint64_t oldest = 0;
    for (uint32_t k = 0; k < p->seg_count; k++) {
        const struct sim_seg *g = &p->segs[(p->seg_head + SIM_SEGS - k) % SIM_SEGS];
        if (g->dev != phys)
            continue;
        if (pos > g->pos + g->len)
            return 0; /* not served yet */
        if (pos > g->pos)
            return g->t_ns + (pos - g->pos);
        oldest = g->t_ns; /* pos == g->pos: reached at the end of an older stretch */
    }
    return oldest; /* older than the ring: no later than its oldest stretch began */
}

uint64_t sim_utilization_window(struct sim_shared *sh, unsigned phys, uint64_t now,
                                uint64_t window_ns)
{
    sim_sched_advance(sh, phys, now);
    const struct sim_device *d = &sh->dev[phys];
    uint64_t lo = now > window_ns ? now - window_ns : 0, busy = 0;
    for (uint32_t k = 0; k < d->run_count; k++) {
        const struct sim_run *r = &d->runs[(d->run_head + SIM_RUNS - k) % SIM_RUNS];
        if (r->end_ns <= lo)
            break; /* runs are in time order, newest first here */
        uint64_t s = r->start_ns > lo ? r->start_ns : lo;
        uint64_t e = r->end_ns < now ? r->end_ns : now;
        if (e > s)
            busy += e - s;
    }
    return busy;
}
