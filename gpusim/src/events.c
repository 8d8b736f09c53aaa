/* XID events in the shared state: injected by vcudasim_inject_xid, read by
 * every process's nvmlEventSetWait. Each device keeps a sequence number and a
 * ring of its last SIM_XID_RING events, so every reader sees every event
 * (each keeps its own "seen" mark), and a reader that fell further behind
 * skips to the oldest one kept. Waiters sleep on a futex word in the shared
 * mapping, which wakes sleepers in all processes (a non-private futex is keyed
 * by the file page, not the address). */
#define _GNU_SOURCE
#include <limits.h>
#include <linux/futex.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "sim.h"

uint64_t sim_xid_post(struct sim_shared *sh, unsigned phys, uint64_t xid)
{
    struct sim_device *d = &sh->dev[phys];
    sim_lock(sh);
    uint64_t seq = d->xid_seq + 1;
    d->xids[seq % SIM_XID_RING] = (struct sim_xid){.seq = seq, .xid = xid};
    d->xid_seq = seq;
    sim_unlock(sh);
    __atomic_add_fetch(&sh->event_gen, 1, __ATOMIC_RELEASE);
    syscall(SYS_futex, &sh->event_gen, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
    return seq;
}

bool sim_xid_next(const struct sim_shared *sh, unsigned phys, uint64_t *seen, uint64_t *xid)
{
    const struct sim_device *d = &sh->dev[phys];
    if (d->xid_seq <= *seen)
        return false;
    uint64_t next = *seen + 1;
    if (d->xid_seq - next >= SIM_XID_RING)
        next = d->xid_seq - SIM_XID_RING + 1; /* overwritten: the oldest kept */
    *xid = d->xids[next % SIM_XID_RING].xid;
    *seen = next;
    return true;
}

uint32_t sim_event_gen(struct sim_shared *sh)
{
    return __atomic_load_n(&sh->event_gen, __ATOMIC_ACQUIRE);
}

void sim_event_sleep(struct sim_shared *sh, uint32_t gen, uint64_t deadline_ns)
{
    uint64_t now = sim_now_ns();
    if (now >= deadline_ns)
        return;
    uint64_t left = deadline_ns - now;
    struct timespec ts = {.tv_sec = (time_t)(left / 1000000000ull),
                          .tv_nsec = (long)(left % 1000000000ull)};
    /* Returns at once if event_gen moved since gen was read (EAGAIN), on a
     * wake, a signal (EINTR) or the timeout: the caller looks again. */
    syscall(SYS_futex, &sh->event_gen, FUTEX_WAIT, gen, &ts, NULL, 0);
}
