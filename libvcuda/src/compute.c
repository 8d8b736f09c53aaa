/* The token clients (token_scheduler/PROTOCOL.md, "Client state machine")
 * and the in-flight budget.
 *
 * One client per visible device with a scheduler, each with its own thread,
 * connection and gate: a process using two GPUs holds two independent tokens.
 * Launchers that find their gate closed wait on that client's condition
 * variable and wake its thread (an eventfd); the thread asks for the token,
 * opens the gate on GRANT and, while holding, waits on the scheduler's socket
 * until the next look at the process: one that launched nothing since the
 * last look may be idle or blocked in a synchronize, so the thread waits for
 * its work and gives it a short grace to launch again, the gate open all
 * along (a launch meanwhile runs at once and the hold goes on); if none came,
 * it closes the gate and gives the token back (the grace is learnt from the
 * process's pauses, within the scheduler's: learn_grace). A holder whose
 * grace is shorter than its looks are apart (a high tenant's) also looks as
 * soon as a synchronize of the process returns. Shortly before the end of
 * the quantum the thread asks to keep the lease (RENEW); granted when the
 * scheduler would lend the token straight back, the hold goes on with a new
 * quantum. At the end of the quantum, or at once on REVOKE, the gate closes, the thread waits for the process's own
 * GPU work and releases with the real hold time (overrun included), asking
 * again at once (MORE) when launchers are waiting. When every launcher waits
 * (at the gate, where each first seals its launches with a checkpoint, or for
 * room) the checkpoints tell what is left, and the release goes out about two
 * handoffs before that work ends (await_tail): the next holder's grant and
 * wake-up overlap it, and held_ns covers it. While it waits for its turn, the
 * thread PINGs a scheduler it has not heard from for a while: only silence,
 * never a long wait in line, makes a scheduler lost (client_main).
 *
 * In-flight budget ("flight"): while a lease is held, every K-th launch of a
 * thread records a checkpoint event on its stream. Checkpoints complete in
 * order; the GPU time of one launch is measured between two of them
 * (cuEventElapsedTime) when the later one was queued behind the earlier, so
 * the GPU ran them back to back; across an idle gap the figure is only an
 * upper bound, used for K until a back-to-back one comes (and to lower a
 * measured figure that is above it). Back to back means the earlier was still
 * pending when the segment's first launch was made. The launcher then
 * waits while the work still in flight, estimated from the pending
 * checkpoints and how long the oldest has been running, leaves no room for
 * its next K launches under the budget: blocking on the oldest checkpoint
 * when even without it there would be too much, else sleeping until the
 * oldest is about to finish (a lead learnt between FLIGHT_LEAD_MIN_NS and
 * FLIGHT_LEAD_MAX_NS from whether it woke too late), so the GPU never runs
 * dry waiting for us. The bound is max(budget, K launches + the lead): a
 * single kernel longer than the budget cannot be cut. */
#include "compute.h"

#include <errno.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "context.h"
#include "graph_mem.h"
#include "log.h"
#include "process.h"
#include "real_driver.h"
#include "zmtp.h"

struct vcuda_gate vcuda_gates[VCUDA_MAX_DEVICES];
__thread struct vcuda_gate *vcuda_thread_gate __attribute__((tls_model("initial-exec"))) = &vcuda_gates[0];
__thread int vcuda_thread_countdown __attribute__((tls_model("initial-exec")));
/* The launches of the thread's current segment are counted from this K: its
 * countdown started at K - 1. K may have changed since (a new measurement, a
 * new budget), so a segment is never counted with the K of the moment: a
 * segment counted long makes its launches look short, K grow, and more work
 * than the budget go in flight. Slow path only. */
static __thread int thread_segment __attribute__((tls_model("initial-exec")));

enum {
    MSG_REQUEST = 1, MSG_GRANT = 2, MSG_RELEASE = 3, MSG_RENEW = 4, MSG_ERROR = 5, MSG_PING = 6, MSG_PONG = 7,
    MSG_REVOKE = 8, MSG_BUDGET = 9, MSG_REPORT = 10
};
enum { PONG_IDLE = 0 }; /* PONG's state of this client: the scheduler has no request of it */
enum { FLAG_MORE = 1, FLAG_NO_RENEW = 2 };
enum { ERR_STALE_LEASE = 5, ERR_LEASE_EXPIRED = 6, ERR_RENEW_DENIED = 7, ERR_TENANT_REMOVED = 9 };
#define HEADER_LEN 16
#define IDLE_CHECK_MIN_NS 1000000ull /* 1 ms */
#define IDLE_GRACE_NS 1000000ull     /* after its work completed, a busy process launches within this
                                      * (until the scheduler says otherwise: BUDGET idle_us) */
#define IDLE_GRACE_RANGE 8           /* the learnt idle grace stays within 1/8 of the scheduler's and all of it */
#define IDLE_GRACE_DECAY 16          /* ... and shrinks by 1/16 at each idle release that was not followed soon */
#define CONNECT_TIMEOUT_MS 1000
#define PING_EVERY_MAX_MS 100        /* a waiting client that heard nothing this long PINGs (PROTOCOL.md), */
#define PING_EVERY_PARTS 4           /* ... or sooner: at least this many PINGs before a short timeout ends */
#define DEFAULT_BUDGET_NS 4000000ull /* until the scheduler sends one (its default) */
#define UNCHECKED (INT_MAX / 2)       /* countdown where no budget applies: no scheduler, no lease */
#define FLIGHT_RING 16                /* checkpoints tracked at once */
#define FLIGHT_MAX_K 256              /* launches between checkpoints at most: budget changes apply soon */
#define FLIGHT_MAX_K_UNSURE 64        /* ... while only upper bounds of the time per launch are known */
#define FLIGHT_LEAD_NS 100000ull      /* issue the next launch this long before the GPU would run dry, */
#define FLIGHT_LEAD_MIN_NS 20000ull   /* ... learnt within these bounds: longer each time the GPU ran */
#define FLIGHT_LEAD_MAX_NS 200000ull  /* dry while a launcher waited, a little shorter each time not */
#define FLIGHT_LEAD_STEP_NS 20000ull
#define HANDOFF_LEAD_NS 400000ull     /* a lease ends this long before its work does: the next holder's
                                      * grant and wake-up overlap the last of it (a handoff is 4 process
                                      * wake-ups, up to 100 us each on a busy or virtual machine; ending
                                      * early costs nothing, the next work queues behind the tail) */
#define RENEW_LEAD_NS 1000000ull      /* a holder asks to keep its lease this long before it ends */
#define RENEW_WAIT_NS 1000000ull      /* ... and waits at most this long past the end for the answer */
#define FLIGHT_POLL_NS 500000ull      /* a wait on an estimate looks at the checkpoints again this often */
#define CLIENT_TIMER_SLACK_NS 1000    /* the client thread's sleeps end within 1 us, not the default 50 */

/* A completion checkpoint: an event recorded after a segment of launches. */
struct checkpoint {
    CUevent event;
    uint32_t launches;    /* launches of the segment it ends */
    bool backlogged;      /* the previous one was pending when the segment's first launch was
                           * made: it ran back to back, so the time between the two is GPU time */
    uint64_t recorded_ns; /* when: a segment not backlogged may have started as late as this */
};

/* In-flight state of one device, shared by the launching threads (flight.lock). */
struct flight {
    pthread_mutex_t lock;
    bool active;                           /* a lease is held: the budget applies */
    uint32_t gen;                          /* bumped at every lease start and end */
    uint64_t budget_ns;
    CUcontext ctx;                         /* the events' context */
    CUevent spare[FLIGHT_RING + 2];
    int nspare;
    struct checkpoint ring[FLIGHT_RING];   /* pending (not seen complete), oldest first */
    int head, count;
    struct checkpoint done;                /* the newest completed checkpoint of this lease */
    bool have_done;
    uint64_t done_seen_ns;                 /* when we saw it complete (its successor started after) */
    uint64_t launch_ns;                    /* measured GPU time per launch; 0: not yet */
    uint64_t launch_bound_ns;              /* an upper bound of it, from segments with idle gaps; 0: none */
    uint64_t lead_ns;                      /* how early a waiting launcher launches (FLIGHT_LEAD_*) */
    bool behind;                           /* the newest checkpoint was pending at the last launch
                                            * through checkpoint(): the segment it began is queued
                                            * behind it (a late launch would time the GPU's idle gap) */
    _Atomic int k;                         /* launches between checkpoints */
    _Atomic int waiting;                   /* threads waiting for room: the process is busy, not idle */
    uint32_t hits;                         /* checkpoints that had to wait, since the last REPORT */
    uint64_t wait_ns;
};

struct token_client {
    int device;             /* visible device index; its gate is vcuda_gates[device] */
    struct vcuda_gate *gate;
    const char *endpoint;   /* the device's scheduler (vcuda_config_device); "" for none */
    bool resolved;          /* endpoint known: false until the quota file's GPU is named by UUID */
    pthread_mutex_t lock;
    pthread_cond_t opened;  /* launchers wait here */
    int wake_fd;            /* eventfd: a launcher started waiting (wakes the client thread) */
    bool started;
    int waiters;            /* launchers blocked on the gate */
    bool unthrottled;       /* scheduler lost under VCUDA_ON_SCHEDULER_LOSS=run */
    uint64_t heard_ns;      /* client thread only: the scheduler's last sign of life (a frame, a
                             * connection), or when the client began waiting on it if later */
    struct vcuda_zmtp conn;
    uint32_t seq;
    uint64_t burst_ns;      /* EWMA of hold times, sent as the predicted burst */
    uint64_t drain_ns;      /* EWMA of how long the process's queued work takes to finish */
    uint64_t idle_grace_ns; /* the scheduler's idle grace (BUDGET idle_us): the most it waits; client thread only */
    uint64_t grace_ns;      /* the idle grace in use, learnt (learn_grace) */
    uint64_t idle_at;       /* when its work was seen complete before its last idle release; 0: none pending */
    _Atomic int sync_looks; /* holding, with a grace shorter than its periodic looks: synchronizes wake it */
    _Atomic unsigned syncs; /* synchronizes ended meanwhile (vcuda_compute_synchronized) */
    unsigned syncs_seen;    /* client thread only */
    uint64_t renewed_ns;    /* the quantum of the renewal just granted (WAKE_RENEWED) */
    bool renewed_final;     /* ... and whether the scheduler would deny renewing it again */
    uint64_t unanswered;    /* a lease released before the answer to its RENEW came: ignore that answer */
    uint32_t asked_seq;     /* client thread only: seq of the last REQUEST or RELEASE(MORE) */
    struct flight flight;
};
static struct token_client clients[VCUDA_MAX_DEVICES];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static struct timespec to_timespec(uint64_t ns) {
    return (struct timespec){.tv_sec = (time_t)(ns / 1000000000ull), .tv_nsec = (long)(ns % 1000000000ull)};
}

static void sleep_until(uint64_t t) {
    struct timespec ts = to_timespec(t);
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

/* A launcher waiting for room under the budget must wake on time, or the GPU
 * runs dry: its thread's timer slack (50 us by default) is lowered for the
 * sleep and restored after. */
static void sleep_until_precisely(uint64_t t) {
    int slack = prctl(PR_GET_TIMERSLACK, 0, 0, 0, 0);
    if (slack > CLIENT_TIMER_SLACK_NS) prctl(PR_SET_TIMERSLACK, CLIENT_TIMER_SLACK_NS, 0, 0, 0);
    sleep_until(t);
    if (slack > CLIENT_TIMER_SLACK_NS) prctl(PR_SET_TIMERSLACK, (unsigned long)slack, 0, 0, 0);
}

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint16_t get16(const unsigned char *p) { return (uint16_t)(p[0] | p[1] << 8); }
static uint32_t get32(const unsigned char *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

/* The 16-byte header of a client frame, numbered with the next seq. */
static void put_header(struct token_client *c, unsigned char *frame, int type, int flags, uint32_t body_len) {
    memcpy(frame, "VCTS", 4);
    frame[4] = 1;
    frame[5] = (unsigned char)type;
    frame[6] = (unsigned char)flags;
    frame[7] = 0;
    put32(frame + 8, ++c->seq);
    put32(frame + 12, body_len);
}

/* Every client frame but PING has a 16-byte body: REQUEST and REPORT start with
 * two 32-bit fields (`a`, 0), the others with a 64-bit one; `b` is the last 8 bytes. */
static int send_msg(struct token_client *c, int type, int flags, uint64_t a, uint64_t b) {
    unsigned char frame[HEADER_LEN + 16];
    put_header(c, frame, type, flags, 16);
    if (type == MSG_REQUEST || type == MSG_REPORT) {
        put32(frame + 16, (uint32_t)a);
        put32(frame + 20, 0);
    } else {
        put64(frame + 16, a);
    }
    put64(frame + 24, b);
    return vcuda_zmtp_send(&c->conn, frame, sizeof frame);
}

static int send_request(struct token_client *c) {
    int rc = send_msg(c, MSG_REQUEST, 0, (uint64_t)getpid(), c->burst_ns / 1000);
    c->asked_seq = c->seq;
    return rc;
}

/* PING has an 8-byte body (the nonce: here the frame's own seq). */
static int send_ping(struct token_client *c) {
    unsigned char frame[HEADER_LEN + 8];
    put_header(c, frame, MSG_PING, 0, 8);
    put64(frame + 16, c->seq);
    return vcuda_zmtp_send(&c->conn, frame, sizeof frame);
}

/* Connects if needed; false when the scheduler cannot be reached now. A new
 * connection is a sign of life: the scheduler itself answered the greeting. */
static bool connected(struct token_client *c) {
    if (c->conn.fd >= 0) return true;
    if (vcuda_zmtp_connect(&c->conn, c->endpoint, CONNECT_TIMEOUT_MS) != 0) return false;
    c->heard_ns = now_ns();
    return true;
}

/* While an application captures a stream into a graph, a synchronize or an
 * event query from another thread (or its own) invalidates a capture begun in
 * the default GLOBAL mode, as PyTorch begins them. The shim's own calls opt out
 * for their duration (RELAXED): returns the mode to restore, or -1 when there
 * was nothing to do (no capture under way, or a driver without the call). */
static int relax_captures(void) {
    CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (atomic_load_explicit(&vcuda_captures_active, memory_order_relaxed) == 0 ||
        vcuda_real.cuThreadExchangeStreamCaptureMode == NULL ||
        vcuda_real.cuThreadExchangeStreamCaptureMode(&mode) != CUDA_SUCCESS)
        return -1;
    return (int)mode;
}

static void restore_captures(int saved) {
    CUstreamCaptureMode mode = (CUstreamCaptureMode)saved;
    if (saved >= 0) vcuda_real.cuThreadExchangeStreamCaptureMode(&mode);
}

/* ---- in-flight budget ------------------------------------------------------------------------ */

/* Caller holds f->lock. Launches between checkpoints: half the budget's worth, from the
 * measured time per launch, else (fewer) from an upper bound of it, else one. */
static void flight_update_k(struct flight *f) {
    uint64_t t = f->launch_ns ? f->launch_ns : f->launch_bound_ns;
    uint64_t most = f->launch_ns ? FLIGHT_MAX_K : FLIGHT_MAX_K_UNSURE;
    uint64_t k = t ? f->budget_ns / (2 * t) : 1;
    atomic_store_explicit(&f->k, k < 1 ? 1 : k > most ? (int)most : (int)k, memory_order_relaxed);
}

static void flight_set_budget(struct token_client *c, uint64_t budget_ns) {
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    f->budget_ns = budget_ns;
    flight_update_k(f);
    pthread_mutex_unlock(&f->lock);
}

/* Caller holds f->lock. Keeps `ev` for reuse, or destroys it when enough are kept. */
static void spare_put(struct flight *f, CUevent ev) {
    if (f->nspare < (int)(sizeof f->spare / sizeof f->spare[0])) f->spare[f->nspare++] = ev;
    else vcuda_real.cuEventDestroy_v2(ev);
}

/* Caller holds f->lock. The oldest pending checkpoint completed (seen at `seen_ns`):
 * it becomes `done`, and the segment it ends measures the GPU time per launch. */
static void flight_complete_front(struct flight *f, uint64_t seen_ns) {
    struct checkpoint cp = f->ring[f->head];
    f->head = (f->head + 1) % FLIGHT_RING;
    f->count--;
    if (f->have_done && f->done.event != NULL) {
        float ms = 0;
        if (cp.launches > 0 && vcuda_real.cuEventElapsedTime(&ms, f->done.event, cp.event) == CUDA_SUCCESS &&
            ms >= 0) {
            uint64_t per = (uint64_t)((double)ms * 1e6) / cp.launches + 1;
            if (cp.backlogged) /* GPU time: an average of the last few */
                f->launch_ns = f->launch_ns ? (f->launch_ns + per) / 2 : per;
            else { /* idle gaps included: only ever an upper bound, but one below the
                    * measured figure proves that figure too high (launching late makes
                    * gaps, which would otherwise keep it high) */
                f->launch_bound_ns = f->launch_bound_ns && f->launch_bound_ns < per ? f->launch_bound_ns : per;
                if (f->launch_ns > per) f->launch_ns = per;
            }
            flight_update_k(f);
        }
        spare_put(f, f->done.event);
    }
    f->done = cp;
    f->have_done = true;
    f->done_seen_ns = seen_ns;
}

/* Caller holds f->lock. Takes the checkpoints that completed by now off the front. */
static void flight_settle(struct flight *f) {
    while (f->count > 0) {
        CUresult q = vcuda_real.cuEventQuery(f->ring[f->head].event);
        if (q == CUDA_ERROR_NOT_READY) return;
        flight_complete_front(f, now_ns()); /* an error (context gone) counts as complete */
    }
}

/* Caller holds f->lock, f->have_done, f->count > 0. When the oldest pending
 * segment started running, at the latest: when its predecessor was seen to
 * complete, if it was queued behind it; else it may have waited for its own
 * launches, so no earlier than its checkpoint (an idle GPU is never counted as
 * its progress: estimates err towards more work left). */
static uint64_t oldest_started(const struct flight *f) {
    const struct checkpoint *cp = &f->ring[f->head];
    return !cp->backlogged && cp->recorded_ns > f->done_seen_ns ? cp->recorded_ns : f->done_seen_ns;
}

enum room { ROOM, BLOCK, SLEEP };

/* Caller holds f->lock. Whether the next `k` launches fit under the budget now
 * (ROOM); if not, whether to wait for the oldest checkpoint (BLOCK) or only
 * until the oldest segment is about to finish (SLEEP until *until). */
static enum room flight_room(const struct flight *f, int k, uint64_t now, uint64_t *until) {
    if (f->count == 0) return ROOM;
    if (f->count > FLIGHT_RING / 2) return BLOCK;
    uint64_t t = f->launch_ns;
    if (t == 0) return f->count > 1 ? BLOCK : ROOM; /* not measured yet: one segment in flight */
    uint64_t next = (uint64_t)k * t;
    uint64_t lead = f->lead_ns;
    uint64_t room = f->budget_ns > next + lead ? f->budget_ns - next : lead;
    uint64_t oldest = (uint64_t)f->ring[f->head].launches * t, rest = 0;
    for (int i = 1; i < f->count; i++) rest += (uint64_t)f->ring[(f->head + i) % FLIGHT_RING].launches * t;
    if (rest > room) return BLOCK;
    /* The oldest segment runs since oldest_started(). Without a completed checkpoint in
     * this lease when it started is unknown: wait for it to complete, woken the moment it does. */
    if (!f->have_done) return oldest + rest > room ? BLOCK : ROOM;
    uint64_t started = oldest_started(f);
    uint64_t ran = now > started ? now - started : 0;
    uint64_t left = ran < oldest ? oldest - ran : 0;
    if (left + rest <= room) return ROOM;
    uint64_t wait = left + rest - room;
    *until = now + (wait < FLIGHT_POLL_NS ? wait : FLIGHT_POLL_NS);
    return SLEEP;
}

/* Caller holds f->lock; `ctx` is the calling thread's current context. The
 * events live in one context: another one is only adopted when nothing of the
 * current one is tracked. */
static bool flight_use_context(struct flight *f, CUcontext ctx) {
    if (ctx == f->ctx) return true;
    if (f->count > 0 || (f->have_done && f->done.event != NULL)) return false;
    CUdevice dev;
    bool alive = f->ctx != NULL && vcuda_context_lookup(f->ctx, &dev);
    while (f->nspare > 0) {
        CUevent ev = f->spare[--f->nspare];
        if (alive) vcuda_real.cuEventDestroy_v2(ev); /* a destroyed context took its events along */
    }
    f->ctx = ctx;
    return true;
}

/* Caller holds f->lock. Records a checkpoint ending a segment of `launches` on `stream`. */
static void record(struct token_client *c, CUstream stream, int ptsz, int launches) {
    struct flight *f = &c->flight;
    if (f->count >= FLIGHT_RING) return;
    CUevent ev = NULL;
    if (f->nspare > 0) ev = f->spare[--f->nspare];
    else if (vcuda_real.cuEventCreate(&ev, CU_EVENT_DEFAULT) != CUDA_SUCCESS) ev = NULL;
    /* A NULL stream through a _ptsz entry point is this thread's per-thread stream. */
    CUstream s = stream == NULL && ptsz ? CU_STREAM_PER_THREAD : stream;
    if (ev != NULL && vcuda_real.cuEventRecord(ev, s) == CUDA_SUCCESS) {
        f->ring[(f->head + f->count) % FLIGHT_RING] =
            (struct checkpoint){.event = ev, .launches = (uint32_t)launches, .backlogged = f->count > 0 && f->behind,
                                .recorded_ns = now_ns()};
        f->count++;
    } else if (ev != NULL) {
        /* Likely a stream of another context: no checkpoint this time. */
        vcuda_debug("device %d: no in-flight checkpoint on stream %p", c->device, (void *)s);
        spare_put(f, ev);
    }
}

/* The thread's next segment starts with this launch, `k` launches long. */
static void start_segment(int k) {
    vcuda_thread_countdown = k - 1;
    thread_segment = k;
}

/* The launches the thread made in its current segment before this one (whose
 * decrement of the countdown already happened). */
static int segment_launched(void) { return thread_segment - 1 - vcuda_thread_countdown; }

/* A launch found the gate closed: the thread's launches since its last
 * checkpoint get one of their own, so that the end of the lease knows all its
 * work in flight (await_tail). */
static void seal(struct token_client *c, CUstream stream, int ptsz) {
    struct flight *f = &c->flight;
    if (vcuda_graph_mem_capturing(stream, ptsz != 0)) return; /* captured: it runs with its graph */
    int saved = relax_captures();
    pthread_mutex_lock(&f->lock);
    int launched = segment_launched();
    CUcontext ctx = NULL;
    if (f->active && launched >= 1 && launched <= thread_segment && vcuda_real.cuCtxGetCurrent(&ctx) == CUDA_SUCCESS &&
        ctx != NULL && flight_use_context(f, ctx)) {
        flight_settle(f);
        record(c, stream, ptsz, launched);
        start_segment(atomic_load_explicit(&f->k, memory_order_relaxed));
    }
    pthread_mutex_unlock(&f->lock);
    restore_captures(saved);
}

/* The countdown ran out (gate open): record a checkpoint on the launch's
 * stream and wait for room under the budget. */
static void flight_checkpoint(struct token_client *c, CUstream stream, int ptsz) {
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    if (!f->active) {
        vcuda_thread_countdown = UNCHECKED; /* the next closed gate resets it */
        pthread_mutex_unlock(&f->lock);
        return;
    }
    int k = atomic_load_explicit(&f->k, memory_order_relaxed);
    int launched = segment_launched(); /* the segment this checkpoint ends */
    start_segment(k); /* this launch and k - 1 more make the next segment */
    CUcontext ctx = NULL;
    if (vcuda_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS || ctx == NULL || !flight_use_context(f, ctx)) {
        pthread_mutex_unlock(&f->lock);
        return;
    }
    flight_settle(f);
    if (!f->have_done && f->count == 0) {
        /* The lease's first checkpoint. Its segment's work started in this lease
         * (the last one drained), before now: taking now as its start errs
         * towards launching late, never towards more than the budget. */
        f->have_done = true;
        f->done = (struct checkpoint){.event = NULL};
        f->done_seen_ns = now_ns();
    }
    record(c, stream, ptsz, launched);
    uint64_t start = now_ns(), until = 0;
    bool hit = false, slept = false;
    for (;;) {
        enum room room = flight_room(f, k, now_ns(), &until);
        if (room == ROOM) break;
        hit = true;
        uint32_t gen = f->gen;
        CUevent oldest = f->ring[f->head].event;
        atomic_fetch_add_explicit(&f->waiting, 1, memory_order_relaxed);
        pthread_mutex_unlock(&f->lock);
        if (room == BLOCK) vcuda_real.cuEventSynchronize(oldest);
        else sleep_until_precisely(until);
        slept |= room == SLEEP;
        pthread_mutex_lock(&f->lock);
        atomic_fetch_sub_explicit(&f->waiting, 1, memory_order_relaxed);
        if (f->gen != gen) break; /* the lease ended meanwhile: its work was drained */
        if (room == BLOCK && f->count > 0 && f->ring[f->head].event == oldest) flight_complete_front(f, now_ns());
        flight_settle(f);
    }
    if (hit) {
        f->hits++;
        f->wait_ns += now_ns() - start;
    }
    f->behind = f->count > 0 &&
                vcuda_real.cuEventQuery(f->ring[(f->head + f->count - 1) % FLIGHT_RING].event) == CUDA_ERROR_NOT_READY;
    if (slept && f->active) {
        /* Woken to launch just before the GPU runs out of this process's work:
         * if it already ran out (the newest checkpoint completed), wake earlier
         * from now on; else a little later. The lead settles where the thread's
         * wake-ups are rarely late, whatever the machine. */
        bool dry = !f->behind;
        uint64_t lead = dry ? f->lead_ns + FLIGHT_LEAD_STEP_NS : f->lead_ns - FLIGHT_LEAD_STEP_NS / 10;
        f->lead_ns = lead < FLIGHT_LEAD_MIN_NS ? FLIGHT_LEAD_MIN_NS : lead > FLIGHT_LEAD_MAX_NS ? FLIGHT_LEAD_MAX_NS : lead;
    }
    pthread_mutex_unlock(&f->lock);
}

/* The countdown ran out: a checkpoint, unless the launch is captured into a
 * graph (nothing of it runs now; the countdown starts over). */
static void checkpoint(struct token_client *c, CUstream stream, int ptsz) {
    if (vcuda_graph_mem_capturing(stream, ptsz != 0)) {
        start_segment(atomic_load_explicit(&c->flight.k, memory_order_relaxed));
        return;
    }
    int saved = relax_captures();
    flight_checkpoint(c, stream, ptsz);
    restore_captures(saved);
}

static int waiting_launchers(struct token_client *c) {
    pthread_mutex_lock(&c->lock);
    int n = c->waiters;
    pthread_mutex_unlock(&c->lock);
    return n;
}

/* Caller holds f->lock, checkpoints settled. The process's work on the GPU not
 * yet run, estimated: the segments after the newest completed checkpoint, plus
 * the launches since the newest pending one (at most K; none when `sealed`:
 * every launcher waits, for room or at the gate, and sealed its segment), less
 * what ran since that completed. An idle gap on the way
 * makes it low. UINT64_MAX: no estimate (nothing measured, or no checkpoint in
 * this lease). */
static uint64_t flight_left(const struct flight *f, uint64_t now, bool sealed) {
    uint64_t t = f->launch_ns;
    if (t == 0 || !f->have_done) return UINT64_MAX;
    uint64_t total = 0;
    for (int i = 0; i < f->count; i++) total += (uint64_t)f->ring[(f->head + i) % FLIGHT_RING].launches * t;
    if (!sealed) total += (uint64_t)atomic_load_explicit(&f->k, memory_order_relaxed) * t;
    uint64_t started = f->count > 0 ? oldest_started(f) : f->done_seen_ns;
    uint64_t ran = now > started ? now - started : 0;
    return total > ran ? total - ran : 0;
}

/* The gate is closed: waits until what is left of the process's work would
 * finish within HANDOFF_LEAD_NS, and returns that estimate (UINT64_MAX:
 * none, the caller drains). */
static uint64_t await_tail(struct token_client *c) {
    struct flight *f = &c->flight;
    for (;;) {
        bool sealed = waiting_launchers(c) > 0;
        pthread_mutex_lock(&f->lock);
        flight_settle(f);
        sealed |= atomic_load_explicit(&f->waiting, memory_order_relaxed) > 0;
        /* Only while every launcher waits is all the work in flight on checkpoints;
         * otherwise the estimate is a guess: drain. */
        uint64_t now = now_ns(), left = sealed ? flight_left(f, now, true) : UINT64_MAX;
        /* Wait for the older segments on their events: when the last one started is then known
         * to the wake-up, where an estimate would drift. */
        uint64_t newest = f->count > 0 ? (uint64_t)f->ring[(f->head + f->count - 1) % FLIGHT_RING].launches * f->launch_ns : 0;
        CUevent oldest = f->count > 1 && left != UINT64_MAX && left > newest + HANDOFF_LEAD_NS ? f->ring[f->head].event : NULL;
        pthread_mutex_unlock(&f->lock);
        if (left == UINT64_MAX || left <= HANDOFF_LEAD_NS) return left;
        if (oldest != NULL) {
            vcuda_real.cuEventSynchronize(oldest);
            pthread_mutex_lock(&f->lock);
            if (f->count > 0 && f->ring[f->head].event == oldest) flight_complete_front(f, now_ns());
            pthread_mutex_unlock(&f->lock);
            continue;
        }
        uint64_t wait = left - HANDOFF_LEAD_NS;
        sleep_until(now + (wait < FLIGHT_POLL_NS ? wait : FLIGHT_POLL_NS));
    }
}

/* A lease starts (the budget applies) or ended (its work was drained, so every
 * checkpoint completed). */
static void flight_lease(struct token_client *c, bool active) {
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    f->active = active;
    f->gen++;
    while (f->count > 0) {
        spare_put(f, f->ring[f->head].event);
        f->head = (f->head + 1) % FLIGHT_RING;
        f->count--;
    }
    if (f->have_done && f->done.event != NULL) spare_put(f, f->done.event);
    f->have_done = false;
    pthread_mutex_unlock(&f->lock);
}

/* ---- the client thread ------------------------------------------------------------------------- */


/* Launchers blocked at the gate, waiting for room under the budget, or launching
 * since the last look: the process has more work for the GPU. */
static bool busy(struct token_client *c) {
    return atomic_exchange_explicit(&c->gate->launched, 0, memory_order_relaxed) ||
           atomic_load_explicit(&c->flight.waiting, memory_order_relaxed) > 0 || waiting_launchers(c) > 0;
}

enum wake { WAKE_TIMEOUT, WAKE_LAUNCHER, WAKE_REVOKED, WAKE_LOST, WAKE_SYNC, WAKE_RENEWED, WAKE_DENIED };

/* One scheduler frame that arrived while holding `lease` (0: none): BUDGET
 * applies at once; a REVOKE of that lease, or the answer to its RENEW (a GRANT
 * of the same lease, *renewed_ns its new quantum, or an ERROR about it), is
 * returned; anything else is WAKE_TIMEOUT (nothing to act on). */
static enum wake take_message(struct token_client *c, const unsigned char *buf, size_t len, uint64_t lease) {
    if (len < HEADER_LEN || memcmp(buf, "VCTS", 4) != 0) return WAKE_TIMEOUT;
    if (buf[5] == MSG_BUDGET && len >= HEADER_LEN + 8) {
        flight_set_budget(c, (uint64_t)get32(buf + 16) * 1000ull);
        uint64_t grace = (uint64_t)get32(buf + 20) * 1000ull;
        if (grace != c->idle_grace_ns) c->grace_ns = grace; /* a new bound: start from it */
        c->idle_grace_ns = grace;
        return WAKE_TIMEOUT;
    }
    if (lease == 0 || len < HEADER_LEN + 16) return WAKE_TIMEOUT;
    if (buf[5] == MSG_REVOKE && get64(buf + 16) == lease) return WAKE_REVOKED;
    if (lease == c->unanswered) return WAKE_TIMEOUT; /* the answer to a RENEW it stopped waiting for */
    if (buf[5] == MSG_GRANT && get64(buf + 16) == lease) {
        c->renewed_ns = (uint64_t)get32(buf + 24) * 1000ull;
        c->renewed_final = (get16(buf + 6) & FLAG_NO_RENEW) != 0;
        return WAKE_RENEWED;
    }
    if (buf[5] == MSG_ERROR && get64(buf + 24) == lease) return WAKE_DENIED; /* RENEW_DENIED, LEASE_EXPIRED */
    return WAKE_TIMEOUT;
}

/* Waits until `deadline` (UINT64_MAX: no limit) for a message from the
 * scheduler or, when `for_launcher`, a launcher at the gate; otherwise, while
 * holding `lease`, a thread of the process whose synchronize returned
 * (WAKE_SYNC, after any message that came with it). It looks at least once,
 * even past its deadline: an answer that came while this thread waited for the
 * process's work (drain_own_work, up to the in-flight budget) is taken, not
 * left behind while the term it would have renewed runs out. */
static enum wake wait_event(struct token_client *c, uint64_t lease, uint64_t deadline, bool for_launcher) {
    for (bool looked = false;; looked = true) {
        if (for_launcher && waiting_launchers(c) > 0) return WAKE_LAUNCHER;
        uint64_t t = now_ns();
        if (t >= deadline && looked) return WAKE_TIMEOUT;
        struct pollfd fds[2] = {{.fd = c->conn.fd, .events = POLLIN}, {.fd = c->wake_fd, .events = POLLIN}};
        struct timespec left = to_timespec(t >= deadline ? 0 : deadline - t);
        int r = ppoll(fds, 2, deadline == UINT64_MAX ? NULL : &left, NULL);
        if (r <= 0) continue; /* timeout (checked above) or a signal */
        bool synced = false;
        if (fds[1].revents & POLLIN) {
            eventfd_t ignored;
            (void)eventfd_read(c->wake_fd, &ignored);
            unsigned syncs = atomic_load_explicit(&c->syncs, memory_order_relaxed);
            synced = lease != 0 && !for_launcher && syncs != c->syncs_seen;
            c->syncs_seen = syncs;
        }
        if (fds[0].revents) {
            unsigned char buf[256];
            size_t len = 0;
            int got = vcuda_zmtp_recv(&c->conn, buf, sizeof buf, &len, 0);
            if (got < 0) return WAKE_LOST;
            enum wake said = got == 0 ? take_message(c, buf, len, lease) : WAKE_TIMEOUT;
            if (said != WAKE_TIMEOUT) return said;
        }
        if (synced) return WAKE_SYNC;
    }
}

/* Waits for a GRANT; returns false when the connection is lost or the wait
 * exceeded `timeout_ms`. Every frame is a sign of life (c->heard_ns); a PONG
 * saying the scheduler has no request of ours (it lost it) asks again. */
static bool wait_grant(struct token_client *c, uint64_t *lease, uint64_t *quantum_ns, bool *final, int timeout_ms) {
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        unsigned char buf[256];
        size_t len = 0;
        int left = (int)((deadline - now_ns()) / 1000000ull);
        if (now_ns() >= deadline) return false;
        int r = vcuda_zmtp_recv(&c->conn, buf, sizeof buf, &len, left > 0 ? left : 1);
        if (r != 0) return false;
        c->heard_ns = now_ns();
        if (len < HEADER_LEN || memcmp(buf, "VCTS", 4) != 0) continue;
        if (buf[5] == MSG_PONG && len >= HEADER_LEN + 24) {
            /* Only the answer to a PING sent after the request tells it was
             * lost: an older one (queued when a GRANT or ERROR ended the last
             * wait) says IDLE of before, and asking again would make a second
             * request, refused once the first is granted. Nonces are seqs. */
            uint32_t nonce = (uint32_t)get64(buf + HEADER_LEN);
            if (buf[HEADER_LEN + 12] == PONG_IDLE && (int32_t)(nonce - c->asked_seq) > 0) send_request(c);
            continue;
        }
        if (buf[5] == MSG_GRANT && len >= HEADER_LEN + 16) {
            if (get64(buf + 16) == c->unanswered) continue; /* a renewal of a lease already given back */
            *lease = get64(buf + 16);
            *quantum_ns = (uint64_t)get32(buf + 24) * 1000ull;
            *final = (get16(buf + 6) & FLAG_NO_RENEW) != 0;
            return true;
        }
        if (buf[5] == MSG_ERROR && len >= HEADER_LEN + 16) {
            unsigned code = (unsigned)buf[16] | (unsigned)buf[17] << 8;
            if (code == ERR_TENANT_REMOVED) vcuda_warn("the token scheduler removed this tenant");
            if (code == ERR_TENANT_REMOVED || code == ERR_RENEW_DENIED || get64(buf + 24) == c->unanswered)
                continue; /* not about this request (the answer to a RENEW of a lease given back) */
            vcuda_debug("token scheduler error %u", code);
            /* A lost or stale request: ask again. */
            if (code == ERR_STALE_LEASE || code == ERR_LEASE_EXPIRED) send_request(c);
            continue;
        }
        take_message(c, buf, len, 0); /* BUDGET; a REVOKE of an ended lease is moot */
    }
}

/* While the application captures a stream, synchronizing its context is
 * invalid in every capture mode (it would invalidate the capture): wait for the
 * newest in-flight checkpoint instead, which covers the work up to the last one
 * (a few launches after it may still run). */
static void drain_checkpoints(struct token_client *c) {
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    CUevent newest = f->count > 0 ? f->ring[(f->head + f->count - 1) % FLIGHT_RING].event : NULL;
    uint32_t gen = f->gen;
    pthread_mutex_unlock(&f->lock);
    if (newest == NULL) return;
    vcuda_real.cuEventSynchronize(newest);
    pthread_mutex_lock(&f->lock);
    if (f->gen == gen) flight_settle(f);
    pthread_mutex_unlock(&f->lock);
}

/* Waits until every context of this process on the client's device has finished its work. */
static void drain_own_work(struct token_client *c) {
    if (atomic_load_explicit(&vcuda_captures_active, memory_order_relaxed) != 0) {
        drain_checkpoints(c);
        return;
    }
    CUcontext ctxs[64];
    int n = vcuda_contexts_snapshot(ctxs, 64);
    for (int i = 0; i < n; i++) {
        CUdevice dev;
        if (!vcuda_context_lookup(ctxs[i], &dev) || dev != c->device) continue;
        CUcontext popped;
        if (vcuda_real.cuCtxPushCurrent_v2(ctxs[i]) != CUDA_SUCCESS) continue;
        vcuda_real.cuCtxSynchronize();
        vcuda_real.cuCtxPopCurrent_v2(&popped);
    }
}

static void set_gate(struct token_client *c, int open) {
    pthread_mutex_lock(&c->lock);
    atomic_store_explicit(&c->gate->open, open, memory_order_release);
    pthread_mutex_unlock(&c->lock);
    /* After the unlock: a launcher woken while this thread still held the lock
     * would block on it once more, a second wake-up before its launch. Waiters
     * test the gate under the lock, so none misses this broadcast. */
    if (open) pthread_cond_broadcast(&c->opened);
}

/* An idle release was followed by the process's next launch `resume` after its
 * work completed. Back within the scheduler's grace: the grace in use was too
 * short for this process's own pauses (a synchronize, a little host work, more
 * launches), and it paid a whole handoff for one: at least double it, and
 * cover that pause. Later: the pause was idle time, which a shorter grace gives
 * to others sooner: shrink it a little. So the grace settles just above the
 * pauses the process makes within its work, between an eighth of the
 * scheduler's grace and all of it. */
static void learn_grace(struct token_client *c, uint64_t resume) {
    uint64_t most = c->idle_grace_ns, least = most / IDLE_GRACE_RANGE, g = c->grace_ns;
    if (resume <= most) {
        uint64_t cover = resume + resume / 4;
        g = 2 * g > cover ? 2 * g : cover;
    } else {
        g -= g / IDLE_GRACE_DECAY;
    }
    c->grace_ns = g < least ? least : g > most ? most : g;
    c->idle_at = 0;
}

/* The terms of a lease while it is held: its quantum, when the gate closes, and
 * when to ask for a renewal (RENEW_LEAD_NS before that, at most a quarter quantum;
 * never when the GRANT said the scheduler would deny it: a message each way and a
 * wake-up for nothing, on every lease of a capped tenant). */
struct term {
    uint64_t quantum_ns, lead_ns, end, renew_at;
    bool asked; /* a RENEW is unanswered */
};

/* Closes the gate early by the time the process's queued work usually takes to
 * drain, so the hold, overrun included, stays within the quantum. */
static void term_start(struct token_client *c, struct term *t, uint64_t from, uint64_t quantum_ns, bool final) {
    t->quantum_ns = quantum_ns;
    t->lead_ns = c->drain_ns < quantum_ns / 2 ? c->drain_ns : quantum_ns / 2;
    t->end = from + quantum_ns - t->lead_ns;
    t->renew_at = final ? UINT64_MAX : t->end - (quantum_ns / 4 < RENEW_LEAD_NS ? quantum_ns / 4 : RENEW_LEAD_NS);
    t->asked = false;
}

/* The scheduler answered the RENEW (WAKE_RENEWED: a new quantum from now). */
static void term_answered(struct token_client *c, struct term *t, enum wake why) {
    if (why == WAKE_RENEWED) term_start(c, t, now_ns(), c->renewed_ns, c->renewed_final);
    t->asked = false;
}

/* Asks the scheduler to renew the lease, once. */
static void ask_renewal(struct token_client *c, struct term *t, uint64_t lease, uint64_t receipt) {
    t->renew_at = UINT64_MAX;
    t->asked = send_msg(c, MSG_RENEW, 0, lease, now_ns() - receipt) == 0;
}

/* How long waiting for the process's work (drain_own_work) may keep this
 * thread: its work in flight, estimated, else the in-flight budget. */
static uint64_t drain_bound(struct token_client *c) {
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    flight_settle(f);
    uint64_t left = flight_left(f, now_ns(), false);
    if (left == UINT64_MAX) left = f->budget_ns;
    pthread_mutex_unlock(&f->lock);
    return left;
}

/* Holds the token until the quantum ends, the process goes idle, the lease is
 * revoked or the scheduler is lost; returns whether it asked for the token
 * again (RELEASE with MORE). */
static bool hold(struct token_client *c, uint64_t lease, uint64_t quantum_ns, bool final) {
    uint64_t receipt = now_ns();
    struct term term;
    term_start(c, &term, receipt, quantum_ns, final);
    /* Idle checks a quarter quantum apart, but at most a few idle graces: a tenant told to
     * give the token back quickly (a high one) must also notice quickly that it is idle. */
    uint64_t check = quantum_ns / 4 < 4 * c->idle_grace_ns ? quantum_ns / 4 : 4 * c->idle_grace_ns;
    if (check < IDLE_CHECK_MIN_NS) check = IDLE_CHECK_MIN_NS;
    enum wake why = WAKE_TIMEOUT;
    bool idle = false; /* its work completed and no launch came within the idle grace */
    atomic_store_explicit(&c->gate->launched, 0, memory_order_relaxed);
    flight_lease(c, true);
    /* Looks a check apart would notice a quiet process only long after the grace
     * it is given (a high tenant's): a synchronize that returned, its work done,
     * says when to look. (Looking as it begins would make this thread wait for
     * the same work, and a real driver's wait spins a core.) */
    c->syncs_seen = atomic_load_explicit(&c->syncs, memory_order_relaxed);
    atomic_store_explicit(&c->sync_looks, c->idle_grace_ns < check, memory_order_relaxed);
    set_gate(c, 1);
    uint64_t look = check; /* until the next look at the process */
    bool look_now = false;  /* a synchronize returned: look at once */
    /* Renewal: the holder asks a little before its end to keep the lease. The
     * scheduler grants it when it would lend the token straight back anyway, which
     * saves a drain and a handoff to itself; denied, the lease ends as it would
     * have, the answer awaited at most RENEW_WAIT_NS past the end. */
    for (;;) {
        /* Asked whatever the process does: one waiting on its own work may have
         * more, and a quiet one still gives the token back within its idle
         * grace. Checked on every pass, not only at a timeout: a look may have
         * run past renew_at. */
        if (now_ns() >= term.renew_at) ask_renewal(c, &term, lease, receipt);
        uint64_t stop = term.asked ? term.end + RENEW_WAIT_NS : term.end;
        if (!look_now) {
            uint64_t t = now_ns(), until = t + look < stop ? t + look : stop;
            if (term.renew_at < until) until = term.renew_at;
            why = wait_event(c, lease, until, false);
            if (why == WAKE_RENEWED || why == WAKE_DENIED) {
                term_answered(c, &term, why);
                why = WAKE_TIMEOUT;
                continue;
            }
            if (why == WAKE_TIMEOUT && now_ns() >= term.renew_at) continue; /* time to ask: above */
            look_now = why == WAKE_SYNC;
        }
        if (look_now) {
            /* Its launches so far were waited for by that synchronize (the drain
             * below covers the rest): only a launch after the look means busy. */
            look_now = false;
            why = WAKE_TIMEOUT;
            if (now_ns() >= stop) break;
            (void)busy(c);
        } else {
            if (why != WAKE_TIMEOUT || now_ns() >= stop) break;
            if (now_ns() >= term.end) continue; /* waiting for the answer to its RENEW */
            look = check;
            if (busy(c)) continue;
        }
        /* No launch since the last look: idle, or blocked in a synchronize on
         * its own work. Let that work finish and give the process its grace to
         * launch again, the gate open all along: a launch meanwhile runs at
         * once, and the hold goes on. A process that launched meanwhile is
         * looked at again after a grace, not a whole check: its new work may
         * be short. The wait may outlast the term (a high tenant's request,
         * synchronized on): ask for the renewal before it, and the answer is
         * read as it ends, rather than the term running out with work left. */
        if (term.renew_at != UINT64_MAX && now_ns() + drain_bound(c) >= term.end)
            ask_renewal(c, &term, lease, receipt);
        drain_own_work(c);
        uint64_t drained = now_ns();
        look = c->idle_grace_ns;
        if (busy(c)) continue;
        do { /* a renewal time that passes meanwhile is asked at the loop's top */
            why = wait_event(c, lease, drained + c->grace_ns, false);
            if (why == WAKE_RENEWED || why == WAKE_DENIED) term_answered(c, &term, why);
        } while (why == WAKE_RENEWED || why == WAKE_DENIED);
        if (why == WAKE_SYNC) { /* it launched and waited for that work again */
            look_now = true;
            continue;
        }
        if (why != WAKE_TIMEOUT) break; /* revoked, or lost */
        if (busy(c)) continue;
        /* Idle: close the gate and give the token back, unless a launch slipped
         * in as it closed (it is on the GPU: hold on). */
        set_gate(c, 0);
        if (busy(c)) {
            set_gate(c, 1);
            continue;
        }
        idle = true;
        c->idle_at = drained;
        break;
    }
    atomic_store_explicit(&c->sync_looks, 0, memory_order_relaxed);
    set_gate(c, 0);
    if (term.asked) c->unanswered = lease;
    uint64_t closed = now_ns();
    if (why == WAKE_LOST) { /* the scheduler ended the lease with the connection */
        drain_own_work(c);
        flight_lease(c, false);
        return false;
    }
    /* Revoked or at the quantum's end, the lease ends HANDOFF_LEAD_NS before
     * its work does: the next holder's grant and wake-up overlap the last of
     * it instead of leaving the GPU idle. An idle process's work is done. */
    uint64_t left = idle ? UINT64_MAX : await_tail(c);
    bool early = left != UINT64_MAX;
    if (!early) drain_own_work(c); /* at most the in-flight budget */
    uint64_t done = now_ns() + (early ? left : 0);
    uint64_t held = done - receipt;
    c->burst_ns = c->burst_ns ? (c->burst_ns * 3 + held) / 4 : held;
    c->drain_ns = (c->drain_ns * 3 + (now_ns() - closed)) / 4;
    bool more;
    if (why == WAKE_REVOKED || idle || early) {
        /* Revoked: answer at once, the revoking tenant waits. Idle: a launch
         * that came as the gate closed. At the quantum's end: launchers wait. */
        more = busy(c);
        if (idle && more) learn_grace(c, 0); /* it launched as the gate closed */
    } else {
        /* A process that was waiting on its own work launches again as soon as
         * it completed: ask again at once (MORE) rather than queue behind others. */
        why = wait_event(c, lease, now_ns() + c->idle_grace_ns, true);
        more = why == WAKE_LAUNCHER || (why == WAKE_REVOKED && busy(c));
        if (why == WAKE_LOST) {
            flight_lease(c, false);
            return false;
        }
    }
    struct flight *f = &c->flight;
    pthread_mutex_lock(&f->lock);
    uint64_t launch_ns = f->launch_ns;
    int k = atomic_load_explicit(&f->k, memory_order_relaxed);
    pthread_mutex_unlock(&f->lock);
    vcuda_debug("device %d lease %llx: quantum %llu us, held %llu us (drain %llu us%s), %s%s; a launch %llu us, K %d",
                c->device, (unsigned long long)lease, (unsigned long long)(quantum_ns / 1000),
                (unsigned long long)(held / 1000), (unsigned long long)((done - closed) / 1000),
                early ? ", released before its end" : "", why == WAKE_REVOKED ? "revoked, " : "",
                more ? "more" : "done", (unsigned long long)(launch_ns / 1000), k);
    send_msg(c, MSG_RELEASE, more ? FLAG_MORE : 0, lease, held);
    if (more) c->asked_seq = c->seq;
    if (early) drain_own_work(c); /* before the next lease: it starts with nothing in flight */
    flight_lease(c, false);
    pthread_mutex_lock(&f->lock);
    uint32_t hits = f->hits;
    uint64_t wait_ns = f->wait_ns;
    f->hits = 0;
    f->wait_ns = 0;
    pthread_mutex_unlock(&f->lock);
    if (hits > 0) send_msg(c, MSG_REPORT, 0, hits, wait_ns);
    return more;
}

/* The scheduler silent past VCUDA_SCHEDULER_TIMEOUT_MS. */
static void on_loss(struct token_client *c) {
    if (vcuda_config.on_scheduler_loss == VCUDA_LOSS_RUN) {
        if (!c->unthrottled) vcuda_warn("token scheduler %s lost: launching unthrottled until it returns",
                                        c->endpoint);
        c->unthrottled = true;
        set_gate(c, 1);
    } else if (!c->unthrottled) {
        vcuda_warn("token scheduler %s lost: launches wait for it (VCUDA_ON_SCHEDULER_LOSS=block)", c->endpoint);
        c->unthrottled = true; /* only to log once */
    }
}

/* The scheduler answers again after a loss. Under `run` the gate closes at
 * once: the limit holds again from now, not from the next grant (which a
 * tenant at its limit may wait for long). */
static void on_back(struct token_client *c) {
    vcuda_info("token scheduler %s is back", c->endpoint);
    c->unthrottled = false;
    if (vcuda_config.on_scheduler_loss == VCUDA_LOSS_RUN) set_gate(c, 0);
}

/* Liveness is not lease time (PROTOCOL.md, "Client state machine"): a client
 * waiting for its turn is answered by its scheduler, not granted, for as long
 * as the scheduler keeps it waiting (at its limit, behind others). Only
 * silence counts toward VCUDA_SCHEDULER_TIMEOUT_MS: no connection, or no frame
 * of any kind, while the client needs the scheduler. A waiting client that
 * heard nothing for ping_every PINGs; the PONG is an answer. A stopped or
 * hung scheduler answers nothing and is lost after the timeout, as one that
 * is gone. */
static void *client_main(void *arg) {
    struct token_client *c = arg;
    bool requested = false;
    bool needed = false; /* the process waits on the scheduler (since c->heard_ns at the latest) */
    uint64_t backoff_ms = 10;
    const uint64_t timeout_ns = (uint64_t)vcuda_config.scheduler_timeout_ms * 1000000ull;
    int ping_every_ms = vcuda_config.scheduler_timeout_ms / PING_EVERY_PARTS;
    ping_every_ms = ping_every_ms < 1 ? 1 : ping_every_ms > PING_EVERY_MAX_MS ? PING_EVERY_MAX_MS : ping_every_ms;
    prctl(PR_SET_TIMERSLACK, CLIENT_TIMER_SLACK_NS, 0, 0, 0);
    /* It synchronizes and queries events whenever a lease ends: never let that
     * invalidate the application's stream captures (relax_captures). */
    CUstreamCaptureMode relaxed = CU_STREAM_CAPTURE_MODE_RELAXED;
    if (vcuda_real.cuThreadExchangeStreamCaptureMode != NULL)
        vcuda_real.cuThreadExchangeStreamCaptureMode(&relaxed);
    for (;;) {
        /* Unthrottled after a loss, keep trying to reach the scheduler even with nobody waiting. */
        if (!requested && !c->unthrottled && wait_event(c, 0, UINT64_MAX, true) == WAKE_LOST) continue;
        if (!needed) { /* silence counts from here: an idle client expects nothing */
            needed = true;
            c->heard_ns = now_ns();
        }
        if (c->idle_at != 0) learn_grace(c, now_ns() - c->idle_at);
        if (!connected(c) || (!requested && send_request(c) != 0)) {
            requested = false;
            if (now_ns() - c->heard_ns >= timeout_ns) on_loss(c);
            sleep_until(now_ns() + backoff_ms * 1000000ull);
            backoff_ms = backoff_ms * 2 > 500 ? 500 : backoff_ms * 2;
            continue;
        }
        requested = true;
        uint64_t lease = 0, quantum = 0;
        bool final = false;
        if (!wait_grant(c, &lease, &quantum, &final, ping_every_ms)) {
            if (c->conn.fd < 0) { /* connection lost: reconnect and ask again */
                requested = false;
                continue;
            }
            uint64_t silent = now_ns() - c->heard_ns;
            if (silent >= timeout_ns) on_loss(c);
            else if (c->unthrottled) on_back(c);
            if (silent >= (uint64_t)ping_every_ms * 1000000ull) send_ping(c);
            continue;
        }
        if (c->unthrottled) on_back(c);
        needed = false;
        backoff_ms = 10;
        /* With MORE the scheduler queues us again itself. */
        requested = hold(c, lease, quantum, final);
    }
    return NULL;
}

/* With the quota file, a device's scheduler is known once its UUID is: its
 * gate stays closed until its first launch names it here. A device the file
 * does not name is refused. Called with c->lock held. */
static CUresult resolve_locked(struct token_client *c) {
    CUresult rc = vcuda_device_admit(c->device);
    if (rc != CUDA_SUCCESS) return rc;
    const char *endpoint = "";
    if (!vcuda_config_device(c->device, vcuda_device_uuid(c->device), NULL, &endpoint)) return CUDA_ERROR_INVALID_DEVICE;
    c->endpoint = endpoint;
    c->resolved = true;
    if (endpoint[0] == '\0') atomic_store(&c->gate->open, 1); /* not time-limited */
    return CUDA_SUCCESS;
}

/* Blocks until the client's gate opens, starting its thread on first use. */
static CUresult gate_wait(struct token_client *c) {
    CUresult rc = vcuda_driver_load();
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.error[0]) return CUDA_ERROR_NOT_INITIALIZED;
    struct vcuda_gate *gate = c->gate;
    pthread_mutex_lock(&c->lock);
    if (!c->resolved && ((rc = resolve_locked(c)) != CUDA_SUCCESS || c->endpoint[0] == '\0')) {
        pthread_mutex_unlock(&c->lock);
        return rc;
    }
    if (!c->started) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        c->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
        if (c->wake_fd < 0 || pthread_create(&thread, &attr, client_main, c) != 0) {
            pthread_attr_destroy(&attr);
            pthread_mutex_unlock(&c->lock);
            vcuda_error("cannot start the token client thread of device %d; launching unthrottled", c->device);
            atomic_store(&gate->open, 1);
            return CUDA_SUCCESS;
        }
        pthread_attr_destroy(&attr);
        c->started = true;
    }
    c->waiters++;
    (void)eventfd_write(c->wake_fd, 1);
    while (!atomic_load_explicit(&gate->open, memory_order_acquire))
        pthread_cond_wait(&c->opened, &c->lock);
    c->waiters--;
    pthread_mutex_unlock(&c->lock);
    return CUDA_SUCCESS;
}

CUresult vcuda_launch_slow(struct vcuda_gate *gate, CUstream stream, int ptsz) {
    struct token_client *c = &clients[gate - vcuda_gates];
    for (;;) {
        if (!atomic_load_explicit(&gate->open, memory_order_acquire)) {
            seal(c, stream, ptsz);
            CUresult rc = gate_wait(c);
            if (rc != CUDA_SUCCESS) return rc;
            int k = atomic_load_explicit(&c->flight.k, memory_order_relaxed);
            if (vcuda_thread_countdown >= k) start_segment(k); /* a new lease, maybe a new budget */
        }
        if (vcuda_thread_countdown >= 0) return CUDA_SUCCESS;
        checkpoint(c, stream, ptsz);
        /* Waiting for room may have outlasted the lease: never launch through a closed gate. */
        if (atomic_load_explicit(&gate->open, memory_order_acquire)) return CUDA_SUCCESS;
    }
}

void vcuda_compute_synchronized(void) {
    struct token_client *c = &clients[vcuda_thread_gate - vcuda_gates];
    if (!atomic_load_explicit(&c->sync_looks, memory_order_relaxed)) return;
    atomic_fetch_add_explicit(&c->syncs, 1, memory_order_relaxed);
    (void)eventfd_write(c->wake_fd, 1);
}

void vcuda_compute_context_changed(void) {
    CUcontext current = NULL;
    CUdevice dev = 0;
    if (vcuda_real.cuCtxGetCurrent == NULL || vcuda_real.cuCtxGetCurrent(&current) != CUDA_SUCCESS ||
        current == NULL || vcuda_real.cuCtxGetDevice(&dev) != CUDA_SUCCESS || dev < 0 || dev >= VCUDA_MAX_DEVICES)
        dev = 0;
    vcuda_thread_gate = &vcuda_gates[dev];
}

/* Fresh client state (at load, and in a forked child, where no client thread exists). */
static void clients_reset(void) {
    for (int d = 0; d < VCUDA_MAX_DEVICES; d++) {
        struct token_client *c = &clients[d];
        if (c->conn.fd >= 0) vcuda_zmtp_close(&c->conn);
        if (c->wake_fd >= 0) close(c->wake_fd);
        memset(c, 0, sizeof *c);
        c->device = d;
        c->gate = &vcuda_gates[d];
        /* Without the quota file, the environment's endpoint by index; with
         * it, unknown until the device is named (resolve_locked). */
        c->endpoint = "";
        c->resolved = vcuda_config_device(d, NULL, NULL, &c->endpoint);
        c->conn.fd = -1;
        c->wake_fd = -1;
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->opened, NULL);
        pthread_mutex_init(&c->flight.lock, NULL);
        c->flight.budget_ns = DEFAULT_BUDGET_NS; /* and launch_ns = 0: measured on the first leases */
        c->flight.lead_ns = FLIGHT_LEAD_NS;
        c->idle_grace_ns = IDLE_GRACE_NS;
        c->grace_ns = IDLE_GRACE_NS;
        atomic_store(&c->flight.k, 1);
        /* Without a scheduler nothing is limited: the gate stays open. */
        bool limited = (!c->resolved || c->endpoint[0] != '\0') && !vcuda_config.disabled;
        atomic_store(&c->gate->open, limited ? 0 : 1);
    }
    vcuda_thread_countdown = 0;
    thread_segment = 0;
}

static void after_fork_child(void) { clients_reset(); }

void vcuda_compute_init(void) {
    static bool atfork_registered;
    if (!atfork_registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_registered = true;
        for (int d = 0; d < VCUDA_MAX_DEVICES; d++) {
            clients[d].conn.fd = -1;
            clients[d].wake_fd = -1;
        }
    }
    clients_reset();
    if (!vcuda_config.from_file && vcuda_config.scheduler_dev[0][0] == '\0' && !vcuda_config.disabled &&
        vcuda_config.core_limit < 100)
        vcuda_warn("VCUDA_CORE_LIMIT=%d but no VCUDA_SCHEDULER: compute is not limited", vcuda_config.core_limit);
}
