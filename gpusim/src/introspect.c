/* The vcudasim_* introspection API (include/vcudasim.h). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sim.h"
#include "vcudasim.h"

_Static_assert((int)VCUDASIM_MEM_KINDS == (int)SIM_MEM_KINDS, "one breakdown");
_Static_assert((int)VCUDASIM_MEM_GRAPH == (int)SIM_MEM_GRAPH, "same order");
_Static_assert(sizeof(((vcudasim_mig *)0)->instances) / sizeof(vcudasim_mig_instance) ==
                   SIM_MIG_MAX, "one entry per GPU-instance slot");

#define VS_EXPORT __attribute__((visibility("default")))

struct vcudasim_state {
    struct sim_shared *sh;
};

static _Thread_local char last_error[1024];

VS_EXPORT int vcudasim_api_version(void)
{
    return VCUDASIM_API_VERSION;
}

VS_EXPORT const char *vcudasim_last_error(void)
{
    return last_error;
}

VS_EXPORT vcudasim_state *vcudasim_open(const char *path, int create)
{
    char buf[4096];
    if (!path)
        path = sim_state_path(buf, sizeof buf);
    struct sim_shared *sh = sim_state_open(path, create != 0, last_error, sizeof last_error);
    if (!sh)
        return NULL;
    vcudasim_state *st = malloc(sizeof *st);
    if (!st) {
        sim_state_close(sh);
        snprintf(last_error, sizeof last_error, "out of memory");
        return NULL;
    }
    st->sh = sh;
    return st;
}

VS_EXPORT void vcudasim_close(vcudasim_state *st)
{
    if (st) {
        sim_state_close(st->sh);
        free(st);
    }
}

VS_EXPORT int vcudasim_get_config(vcudasim_state *st, vcudasim_config *out)
{
    if (!st || !out)
        return -1;
    *out = (vcudasim_config){.devices = st->sh->ndev,
                             .max_pending = st->sh->max_pending,
                             .driver_version = st->sh->driver_version,
                             .context_overhead = st->sh->ctx_overhead,
                             .nvswitch = st->sh->nvswitch,
                             .sms = st->sh->sms,
                             .threads_per_sm = st->sh->threads_per_sm,
                             .mig_model = st->sh->mig_model,
                             .pool_chunk = st->sh->pool_chunk,
                             .kernel_code = st->sh->kernel_code,
                             .timeslice_us = (uint32_t)(st->sh->timeslice_ns / 1000)};
    return 0;
}

static bool proc_on(const struct sim_proc *p, unsigned d)
{
    return p->pid && (p->used[d] || p->contexts[d] || p->kernels[d]);
}

VS_EXPORT int vcudasim_device_info(vcudasim_state *st, unsigned dev, vcudasim_device *out)
{
    if (!st || !out || !sim_phys_valid(st->sh, dev))
        return -1;
    struct sim_shared *sh = st->sh;
    const struct sim_device *d = &sh->dev[dev];
    memset(out, 0, sizeof *out);
    sim_lock(sh);
    sim_reap_dead(sh);
    uint64_t now = sim_now_ns();
    sim_sched_advance(sh, dev, now);
    out->index = dev;
    memcpy(out->uuid, d->uuid, sizeof out->uuid);
    memcpy(out->name, d->name, sizeof out->name);
    out->capacity = d->capacity;
    out->used = sim_device_used(sh, dev);
    out->busy_ns = d->busy_ns;
    out->kernels = d->kernels;
    out->busy_until_ns = now + sim_sched_pending(sh, dev); /* it never idles with work queued */
    out->numa_node = d->numa_node;
    out->nvlink_peers = d->nvlink_peers;
    out->lost = __atomic_load_n(&d->lost, __ATOMIC_ACQUIRE);
    out->xids = d->xid_seq;
    for (uint32_t i = 0; i < sh->nproc_hw; i++) {
        const struct sim_proc *p = &sh->proc[i];
        if (proc_on(p, dev) && (p->used[dev] || p->contexts[dev]))
            out->processes++;
        for (unsigned k = 0; p->pid && k < VCUDASIM_MEM_KINDS; k++)
            out->mem[k] += p->mem[dev][k];
    }
    sim_unlock(sh);
    return 0;
}

/* The shared state for a query of up to cap entries at out about dev: locked, dead
 * processes reclaimed first (reap), dev's schedule advanced to now. NULL: bad arguments. */
static struct sim_shared *lock_advanced(vcudasim_state *st, unsigned dev, int cap, const void *out,
                                        bool reap)
{
    if (!st || !sim_phys_valid(st->sh, dev) || cap < 0 || (cap > 0 && !out))
        return NULL;
    struct sim_shared *sh = st->sh;
    sim_lock(sh);
    if (reap)
        sim_reap_dead(sh);
    sim_sched_advance(sh, dev, sim_now_ns());
    return sh;
}

VS_EXPORT int vcudasim_processes(vcudasim_state *st, unsigned dev, vcudasim_process *out,
                                 int cap)
{
    struct sim_shared *sh = lock_advanced(st, dev, cap, out, true);
    if (!sh)
        return -1;
    int n = 0;
    for (uint32_t i = 0; i < sh->nproc_hw; i++) {
        const struct sim_proc *p = &sh->proc[i];
        if (!proc_on(p, dev))
            continue;
        if (n < cap) {
            out[n] = (vcudasim_process){.pid = p->pid, .contexts = p->contexts[dev],
                                        .used = p->used[dev], .busy_ns = p->busy_ns[dev],
                                        .kernels = p->kernels[dev], .host_pid = p->host_pid,
                                        .pending_ns = p->queued_ns[dev] - p->busy_ns[dev]};
            memcpy(out[n].mem, p->mem[dev], sizeof out[n].mem);
        }
        n++;
    }
    sim_unlock(sh);
    return n;
}

_Static_assert(SIM_SEGS == VCUDASIM_STRETCHES, "vcudasim_served returns the whole ring");

VS_EXPORT int vcudasim_served(vcudasim_state *st, unsigned dev, int32_t pid, vcudasim_stretch *out,
                              int cap)
{
    struct sim_shared *sh = lock_advanced(st, dev, cap, out, false);
    if (!sh)
        return -1;
    int n = 0;
    for (uint32_t i = 0; i < sh->nproc_hw; i++) {
        const struct sim_proc *p = &sh->proc[i];
        if (p->pid != pid || !proc_on(p, dev))
            continue;
        for (uint32_t k = p->seg_count; k-- > 0;) { /* oldest first */
            const struct sim_seg *g = &p->segs[(p->seg_head + SIM_SEGS - k) % SIM_SEGS];
            if (g->dev != dev)
                continue;
            if (n < cap)
                out[n] = (vcudasim_stretch){.start_ns = g->t_ns, .end_ns = g->t_ns + g->len};
            n++;
        }
        break;
    }
    sim_unlock(sh);
    return n;
}

VS_EXPORT uint64_t vcudasim_busy_in_window(vcudasim_state *st, unsigned dev, uint64_t window_ns)
{
    if (!st || !sim_phys_valid(st->sh, dev))
        return 0;
    sim_lock(st->sh);
    uint64_t busy = sim_utilization_window(st->sh, dev, sim_now_ns(), window_ns);
    sim_unlock(st->sh);
    return busy;
}

VS_EXPORT uint64_t vcudasim_now_ns(void)
{
    return sim_now_ns();
}

VS_EXPORT int64_t vcudasim_inject_xid(vcudasim_state *st, unsigned dev, uint64_t xid)
{
    if (!st || dev >= st->sh->ndev)
        return -1;
    return (int64_t)sim_xid_post(st->sh, dev, xid);
}

VS_EXPORT int vcudasim_set_lost(vcudasim_state *st, unsigned dev, int lost)
{
    if (!st || dev >= st->sh->ndev)
        return -1;
    __atomic_store_n(&st->sh->dev[dev].lost, lost ? 1u : 0u, __ATOMIC_RELEASE);
    return 0;
}

VS_EXPORT int vcudasim_mig_info(vcudasim_state *st, unsigned dev, vcudasim_mig *out)
{
    if (!st || !out || dev >= st->sh->ndev)
        return -1;
    struct sim_shared *sh = st->sh;
    const struct sim_mig *mig = &sh->mig[dev];
    memset(out, 0, sizeof *out);
    sim_lock(sh);
    sim_reap_dead(sh);
    out->capable = mig->capable;
    out->mode = mig->mode;
    for (unsigned id = 0; id < 2 * SIM_MIG_SLICES - 1; id++) {
        for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
            const struct sim_gi *g = &mig->gi[k];
            if (!g->live || g->id != id)
                continue;
            vcudasim_mig_instance *in = &out->instances[out->count++];
            unsigned phys = SIM_MIG_PHYS(dev, k);
            snprintf(in->profile, sizeof in->profile, "%s",
                     sim_mig_model(sh)->profiles[g->profile].name);
            in->gi_id = g->id;
            in->ci_id = g->ci_live ? g->ci_id : UINT32_MAX;
            in->start = g->start;
            in->size = g->size;
            if (!g->ci_live)
                continue;
            in->device = phys;
            memcpy(in->uuid, sh->dev[phys].uuid, sizeof in->uuid);
            in->capacity = sh->dev[phys].capacity;
            in->used = sim_device_used(sh, phys);
            for (uint32_t i = 0; i < sh->nproc_hw; i++)
                in->processes += proc_on(&sh->proc[i], phys) &&
                                 (sh->proc[i].used[phys] || sh->proc[i].contexts[phys]);
        }
    }
    sim_unlock(sh);
    return 0;
}
