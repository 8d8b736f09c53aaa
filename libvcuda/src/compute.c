/* The token clients (token_scheduler/PROTOCOL.md, "Client state machine").
 *
 * One client per visible device with a scheduler, each with its own thread,
 * connection and gate: a process using two GPUs holds two independent tokens.
 * Launchers that find their gate closed wait on that client's condition
 * variable (compute.h); the thread asks for
 * the token, opens the gate on GRANT and, while holding, wakes every
 * idle-check interval: a process that launched nothing since the last check
 * and has no work left gives the token back at once; at the end of the
 * quantum the gate closes, the thread waits for the process's own GPU work
 * and releases with the real hold time (overrun included), asking again at
 * once (MORE) when launchers are waiting. A process blocked in a synchronize
 * launches nothing but is not idle: the idle check closes the gate, lets the
 * process's work finish and keeps the token if a launcher arrives within a
 * short grace (it is woken the moment one does). */
#include "compute.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "config.h"
#include "context.h"
#include "log.h"
#include "real_driver.h"
#include "zmtp.h"

struct vcuda_gate vcuda_gates[VCUDA_MAX_DEVICES];
__thread struct vcuda_gate *vcuda_thread_gate __attribute__((tls_model("initial-exec"))) = &vcuda_gates[0];

enum { MSG_REQUEST = 1, MSG_GRANT = 2, MSG_RELEASE = 3, MSG_ERROR = 5 };
enum { FLAG_MORE = 1 };
enum { ERR_STALE_LEASE = 5, ERR_LEASE_EXPIRED = 6, ERR_TENANT_REMOVED = 9 };
#define HEADER_LEN 16
#define IDLE_CHECK_MIN_NS 1000000ull /* 1 ms */
#define IDLE_GRACE_NS 1000000ull     /* after its work completed, a busy process launches within this */
#define CONNECT_TIMEOUT_MS 1000

struct token_client {
    int device;             /* visible device index; its gate is vcuda_gates[device] */
    struct vcuda_gate *gate;
    const char *endpoint;   /* VCUDA_SCHEDULER_<device> or VCUDA_SCHEDULER */
    pthread_mutex_t lock;
    pthread_cond_t opened;  /* launchers wait here */
    pthread_cond_t wanted;  /* the client thread waits here while idle */
    bool started;
    int waiters;            /* launchers blocked on the gate */
    bool unthrottled;       /* scheduler lost under VCUDA_ON_SCHEDULER_LOSS=run */
    struct vcuda_zmtp conn;
    uint32_t seq;
    uint64_t burst_ns;      /* EWMA of hold times, sent as the predicted burst */
    uint64_t drain_ns;      /* EWMA of how long the process's queued work takes to finish */
};
static struct token_client clients[VCUDA_MAX_DEVICES];

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void sleep_until(uint64_t t) {
    struct timespec ts = {.tv_sec = (time_t)(t / 1000000000ull), .tv_nsec = (long)(t % 1000000000ull)};
    while (clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL) != 0) {
    }
}

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint32_t get32(const unsigned char *p) { uint32_t v = 0; for (int i = 3; i >= 0; i--) v = v << 8 | p[i]; return v; }
static uint64_t get64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static int send_msg(struct token_client *c, int type, int flags, uint64_t a, uint64_t b) {
    unsigned char frame[HEADER_LEN + 16];
    memcpy(frame, "VCTS", 4);
    frame[4] = 1;
    frame[5] = (unsigned char)type;
    frame[6] = (unsigned char)flags;
    frame[7] = 0;
    put32(frame + 8, ++c->seq);
    put32(frame + 12, 16);
    if (type == MSG_REQUEST) {
        put32(frame + 16, (uint32_t)getpid());
        put32(frame + 20, 0);
        put64(frame + 24, b);
    } else {
        put64(frame + 16, a);
        put64(frame + 24, b);
    }
    return vcuda_zmtp_send(&c->conn, frame, sizeof frame);
}

/* Connects if needed; false when the scheduler cannot be reached now. */
static bool connected(struct token_client *c) {
    if (c->conn.fd >= 0) return true;
    return vcuda_zmtp_connect(&c->conn, c->endpoint, CONNECT_TIMEOUT_MS) == 0;
}

/* Waits for a GRANT; returns false when the connection is lost or the wait
 * exceeded `timeout_ms`. */
static bool wait_grant(struct token_client *c, uint64_t *lease, uint64_t *quantum_ns, int timeout_ms) {
    uint64_t deadline = now_ns() + (uint64_t)timeout_ms * 1000000ull;
    for (;;) {
        unsigned char buf[256];
        size_t len = 0;
        int left = (int)((deadline - now_ns()) / 1000000ull);
        if (now_ns() >= deadline) return false;
        int r = vcuda_zmtp_recv(&c->conn, buf, sizeof buf, &len, left > 0 ? left : 1);
        if (r != 0) return false;
        if (len < HEADER_LEN || memcmp(buf, "VCTS", 4) != 0) continue;
        if (buf[5] == MSG_GRANT && len >= HEADER_LEN + 16) {
            *lease = get64(buf + 16);
            *quantum_ns = (uint64_t)get32(buf + 24) * 1000ull;
            return true;
        }
        if (buf[5] == MSG_ERROR && len >= HEADER_LEN + 16) {
            unsigned code = (unsigned)buf[16] | (unsigned)buf[17] << 8;
            if (code == ERR_TENANT_REMOVED) vcuda_warn("the token scheduler removed this tenant");
            else vcuda_debug("token scheduler error %u", code);
            /* A lost or stale request: ask again. */
            if (code == ERR_STALE_LEASE || code == ERR_LEASE_EXPIRED)
                send_msg(c, MSG_REQUEST, 0, 0, c->burst_ns / 1000);
        }
    }
}

/* Waits until every context of this process on the client's device has finished its work. */
static void drain_own_work(struct token_client *c) {
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
    if (open) pthread_cond_broadcast(&c->opened);
    pthread_mutex_unlock(&c->lock);
}

/* Whether a launcher waits at the gate, or arrives within `grace_ns`. */
static bool launcher_arrives(struct token_client *c, uint64_t grace_ns) {
    struct timespec deadline;
    clock_gettime(CLOCK_REALTIME, &deadline); /* the condition variable's clock */
    uint64_t ns = (uint64_t)deadline.tv_nsec + grace_ns;
    deadline.tv_sec += (time_t)(ns / 1000000000ull);
    deadline.tv_nsec = (long)(ns % 1000000000ull);
    pthread_mutex_lock(&c->lock);
    while (c->waiters == 0 && pthread_cond_timedwait(&c->wanted, &c->lock, &deadline) == 0) {
    }
    bool arrived = c->waiters > 0;
    pthread_mutex_unlock(&c->lock);
    return arrived;
}

/* Holds the token until the quantum ends or the process goes idle; returns
 * whether launchers are waiting for it again. */
static bool hold(struct token_client *c, uint64_t lease, uint64_t quantum_ns) {
    uint64_t receipt = now_ns();
    /* Close the gate early by the time the process's queued work usually takes
     * to drain, so the hold, overrun included, stays within the quantum. */
    uint64_t early = c->drain_ns < quantum_ns / 2 ? c->drain_ns : quantum_ns / 2;
    uint64_t end = receipt + quantum_ns - early;
    uint64_t check = quantum_ns / 4 > IDLE_CHECK_MIN_NS ? quantum_ns / 4 : IDLE_CHECK_MIN_NS;
    atomic_store_explicit(&c->gate->launched, 0, memory_order_relaxed);
    set_gate(c, 1);
    for (;;) {
        uint64_t t = now_ns();
        uint64_t next = t + check < end ? t + check : end;
        sleep_until(next);
        if (next >= end) break;
        if (atomic_exchange_explicit(&c->gate->launched, 0, memory_order_relaxed)) continue;
        /* No launch since the last check: idle, or blocked in a synchronize on
         * its own work. Close the gate, let that work finish, and see whether
         * the process wants to launch again right away. */
        set_gate(c, 0);
        drain_own_work(c);
        if (!launcher_arrives(c, IDLE_GRACE_NS)) break; /* idle: give the token back */
        if (now_ns() >= end) break;
        set_gate(c, 1);
    }
    set_gate(c, 0);
    uint64_t closed = now_ns();
    drain_own_work(c);
    uint64_t done = now_ns();
    uint64_t held = done - receipt;
    c->burst_ns = c->burst_ns ? (c->burst_ns * 3 + held) / 4 : held;
    c->drain_ns = (c->drain_ns * 3 + (done - closed)) / 4;
    /* A process that was waiting on its own work launches again as soon as it
     * completed: ask again at once (MORE) rather than queue behind others. */
    bool more = launcher_arrives(c, IDLE_GRACE_NS);
    vcuda_debug("device %d lease %llx: quantum %llu us, held %llu us (drain %llu us), %s",
                c->device, (unsigned long long)lease, (unsigned long long)(quantum_ns / 1000),
                (unsigned long long)(held / 1000), (unsigned long long)((done - closed) / 1000),
                more ? "more" : "done");
    send_msg(c, MSG_RELEASE, more ? FLAG_MORE : 0, lease, held);
    return more;
}

/* Scheduler unreachable past VCUDA_SCHEDULER_TIMEOUT_MS. */
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

static void *client_main(void *arg) {
    struct token_client *c = arg;
    bool requested = false;
    uint64_t lost_since = 0, backoff_ms = 10;
    for (;;) {
        pthread_mutex_lock(&c->lock);
        /* Unthrottled after a loss, keep trying to reach the scheduler even with nobody waiting. */
        while (c->waiters == 0 && !requested && !c->unthrottled)
            pthread_cond_wait(&c->wanted, &c->lock);
        pthread_mutex_unlock(&c->lock);
        if (!connected(c) || (!requested && send_msg(c, MSG_REQUEST, 0, 0, c->burst_ns / 1000) != 0)) {
            requested = false;
            if (lost_since == 0) lost_since = now_ns();
            if (now_ns() - lost_since >= (uint64_t)vcuda_config.scheduler_timeout_ms * 1000000ull) on_loss(c);
            sleep_until(now_ns() + backoff_ms * 1000000ull);
            backoff_ms = backoff_ms * 2 > 500 ? 500 : backoff_ms * 2;
            continue;
        }
        requested = true;
        uint64_t lease = 0, quantum = 0;
        if (!wait_grant(c, &lease, &quantum, 100)) {
            if (c->conn.fd < 0) requested = false; /* connection lost: reconnect and ask again */
            else if (lost_since == 0) lost_since = now_ns();
            if (lost_since && now_ns() - lost_since >= (uint64_t)vcuda_config.scheduler_timeout_ms * 1000000ull)
                on_loss(c);
            continue;
        }
        if (c->unthrottled) {
            vcuda_info("token scheduler %s is back", c->endpoint);
            c->unthrottled = false;
        }
        lost_since = 0;
        backoff_ms = 10;
        /* With MORE the scheduler queues us again itself. */
        requested = hold(c, lease, quantum);
    }
    return NULL;
}

CUresult vcuda_gate_wait(struct vcuda_gate *gate) {
    CUresult rc = vcuda_driver_load();
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.error[0]) return CUDA_ERROR_NOT_INITIALIZED;
    struct token_client *c = &clients[gate - vcuda_gates];
    pthread_mutex_lock(&c->lock);
    if (!c->started) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        if (pthread_create(&thread, &attr, client_main, c) != 0) {
            pthread_mutex_unlock(&c->lock);
            vcuda_error("cannot start the token client thread of device %d; launching unthrottled", c->device);
            atomic_store(&gate->open, 1);
            return CUDA_SUCCESS;
        }
        pthread_attr_destroy(&attr);
        c->started = true;
    }
    c->waiters++;
    pthread_cond_signal(&c->wanted);
    while (!atomic_load_explicit(&gate->open, memory_order_acquire))
        pthread_cond_wait(&c->opened, &c->lock);
    c->waiters--;
    pthread_mutex_unlock(&c->lock);
    return CUDA_SUCCESS;
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
        memset(c, 0, sizeof *c);
        c->device = d;
        c->gate = &vcuda_gates[d];
        c->endpoint = vcuda_config.scheduler_dev[d];
        c->conn.fd = -1;
        pthread_mutex_init(&c->lock, NULL);
        pthread_cond_init(&c->opened, NULL);
        pthread_cond_init(&c->wanted, NULL);
        /* Without a scheduler nothing is limited: the gate stays open. */
        bool limited = c->endpoint[0] != '\0' && !vcuda_config.disabled;
        atomic_store(&c->gate->open, limited ? 0 : 1);
    }
}

static void after_fork_child(void) { clients_reset(); }

void vcuda_compute_init(void) {
    static bool atfork_registered;
    if (!atfork_registered) {
        pthread_atfork(NULL, NULL, after_fork_child);
        atfork_registered = true;
        for (int d = 0; d < VCUDA_MAX_DEVICES; d++) clients[d].conn.fd = -1;
    }
    clients_reset();
    if (vcuda_config.scheduler_dev[0][0] == '\0' && !vcuda_config.disabled && vcuda_config.core_limit < 100)
        vcuda_warn("VCUDA_CORE_LIMIT=%d but no VCUDA_SCHEDULER: compute is not limited", vcuda_config.core_limit);
}
