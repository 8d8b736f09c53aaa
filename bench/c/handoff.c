/* Token handoff latency with C clients speaking ZMTP the way libvcuda does
 * (libvcuda/src/zmtp.c): two clients, one per tenant endpoint, each with its
 * own connection, pass the token back and forth with RELEASE(MORE). A sample
 * is CLOCK_MONOTONIC just before the holder sends RELEASE(MORE) to the moment
 * the next GRANT has been received and decoded (by the other client, or by the
 * same one if the scheduler re-grants it: counted as self_grants; other_p50_us
 * and other_p99_us cover only the handoffs to the other client).
 *
 *   handoff ENDPOINT_A ENDPOINT_B [HANDOFFS] [--poll] [--hold-us N]
 *
 * Default: one thread per client, each blocking in vcuda_zmtp_recv() like
 * libvcuda's wait_grant(). --poll: one thread poll()s both connections (the
 * shape of bench/scheduler_bench.py's Python clients). --hold-us N: each holder
 * keeps the token N us before it releases, as a tenant that runs work does, so
 * that every process in the chain has gone to sleep when the handoff comes
 * (back to back, they stay warm). The first 200 handoffs
 * are warm-up and not counted. Prints one JSON object on stdout.
 *
 * cc -std=gnu11 -O2 -Wall -Wextra -Ilibvcuda/include -Ilibvcuda/src \
 *    bench/c/handoff.c libvcuda/src/zmtp.c -o handoff -lpthread
 */
#define _GNU_SOURCE
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "zmtp.h"

enum { HEADER_LEN = 16, MSG_REQUEST = 1, MSG_GRANT = 2, MSG_RELEASE = 3, MSG_ERROR = 5, MSG_PING = 6,
       MSG_PONG = 7, FLAG_MORE = 1, WARMUP = 200, RECV_TIMEOUT_MS = 2000 };

struct client {
    const char *name;
    struct vcuda_zmtp conn;
    uint32_t seq;
    uint64_t lease; /* valid while holding */
};

static struct client clients[2];
static int total;          /* warm-up + measured handoffs */
static uint64_t *samples;  /* ns, one per handoff (warm-up included) */
static bool *to_self;      /* per handoff: the GRANT went back to the releaser */
static int handoffs_done;  /* written only by the token holder */
static int self_grants;    /* measured handoffs that went back to the releaser */
static int last_releaser = -1;
static _Atomic uint64_t t_release; /* ns, stamped just before RELEASE(MORE) */
static atomic_bool stop;
static uint64_t hold_ns;           /* how long a holder keeps the token (--hold-us) */
#define MAX_HOLD_US 40000          /* within the scheduler's largest quantum (50 ms): never reclaimed */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void put32(unsigned char *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static void put64(unsigned char *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i)); }
static uint64_t get64(const unsigned char *p) { uint64_t v = 0; for (int i = 7; i >= 0; i--) v = v << 8 | p[i]; return v; }

static void die(const char *what, const struct client *c) {
    fprintf(stderr, "handoff: %s%s%s\n", what, c ? ": client " : "", c ? c->name : "");
    exit(1);
}

/* Same frame layout as libvcuda/src/compute.c send_msg(). */
static void send_msg(struct client *c, int type, int flags, uint64_t a, uint64_t b) {
    unsigned char frame[HEADER_LEN + 16];
    size_t body = type == MSG_PING ? 8 : 16;
    memcpy(frame, "VCTS", 4);
    frame[4] = 1;
    frame[5] = (unsigned char)type;
    frame[6] = (unsigned char)flags;
    frame[7] = 0;
    put32(frame + 8, ++c->seq);
    put32(frame + 12, (uint32_t)body);
    if (type == MSG_REQUEST) {
        put32(frame + 16, (uint32_t)getpid());
        put32(frame + 20, 0);
        put64(frame + 24, b);
    } else {
        put64(frame + 16, a);
        put64(frame + 24, b);
    }
    if (vcuda_zmtp_send(&c->conn, frame, HEADER_LEN + body) != 0) die("send failed", c);
}

/* Receives one scheduler frame of `type`; an error or another known reply (or a
 * timeout) is fatal. Types a client needs not act on (BUDGET, before a first
 * GRANT; REVOKE; any added later) are skipped, as PROTOCOL.md asks of clients. */
static void recv_msg(struct client *c, int type, unsigned char *buf, size_t cap) {
    size_t len = 0;
    int r;
    do r = vcuda_zmtp_recv(&c->conn, buf, cap, &len, RECV_TIMEOUT_MS);
    while (r == 0 && len >= HEADER_LEN && memcmp(buf, "VCTS", 4) == 0 && buf[5] != type && buf[5] != MSG_ERROR &&
           buf[5] > MSG_PONG);
    if (r == 1) die("timed out waiting for the scheduler", c);
    if (r != 0) die("connection lost", c);
    if (len < HEADER_LEN || memcmp(buf, "VCTS", 4) != 0) die("not a scheduler frame", c);
    if (buf[5] == MSG_ERROR && len >= HEADER_LEN + 16) {
        unsigned code = (unsigned)buf[16] | (unsigned)buf[17] << 8;
        unsigned text_len = (unsigned)buf[18] | (unsigned)buf[19] << 8;
        if (HEADER_LEN + 16 + (size_t)text_len > len) text_len = 0;
        fprintf(stderr, "handoff: client %s: scheduler error %u: %.*s\n", c->name, code, (int)text_len,
                (const char *)buf + HEADER_LEN + 16);
        exit(1);
    }
    if (buf[5] != type) die("unexpected message type", c);
}

/* Called by the client that just received a GRANT at `got`; returns false when
 * the run is over (the token is then released without MORE). */
static bool on_grant(int me, uint64_t got) {
    struct client *c = &clients[me];
    uint64_t released = atomic_load_explicit(&t_release, memory_order_acquire);
    if (last_releaser >= 0 && handoffs_done < total) {
        samples[handoffs_done] = got - released;
        to_self[handoffs_done] = last_releaser == me;
        if (last_releaser == me && handoffs_done >= WARMUP) self_grants++;
        handoffs_done++;
    }
    if (atomic_load(&stop) || handoffs_done >= total) {
        /* The other client is queued (it released with MORE): this GRANT-less
         * RELEASE hands it one last token, which wakes it to see `stop`. */
        atomic_store(&stop, true);
        send_msg(c, MSG_RELEASE, 0, c->lease, 1000);
        return false;
    }
    last_releaser = me;
    if (hold_ns) {
        struct timespec ts = {.tv_sec = (time_t)(hold_ns / 1000000000ull), .tv_nsec = (long)(hold_ns % 1000000000ull)};
        while (nanosleep(&ts, &ts) != 0) {
        }
    }
    uint64_t now = now_ns();
    atomic_store_explicit(&t_release, now, memory_order_release);
    /* The real hold when there is one, so that the scheduler's quantum fits it. */
    send_msg(c, MSG_RELEASE, FLAG_MORE, c->lease, hold_ns ? now - got : 1000);
    return true;
}

static void grant(int me, const unsigned char *buf) { clients[me].lease = get64(buf + HEADER_LEN); }

static void *thread_main(void *arg) {
    int me = (int)(intptr_t)arg;
    struct client *c = &clients[me];
    unsigned char buf[256];
    if (me == 0 && !on_grant(0, now_ns())) return NULL; /* A starts out holding */
    for (;;) {
        recv_msg(c, MSG_GRANT, buf, sizeof buf);
        uint64_t got = now_ns();
        grant(me, buf);
        if (!on_grant(me, got)) return NULL;
    }
}

static void run_poll(void) {
    unsigned char buf[256];
    struct pollfd fds[2] = {{.fd = clients[0].conn.fd, .events = POLLIN}, {.fd = clients[1].conn.fd, .events = POLLIN}};
    if (!on_grant(0, now_ns())) return;
    int finished = 0;
    while (finished < 2) {
        int n = poll(fds, 2, RECV_TIMEOUT_MS);
        if (n == 0) die("timed out waiting for the scheduler", NULL);
        if (n < 0) die("poll failed", NULL);
        for (int i = 0; i < 2; i++) {
            if (!(fds[i].revents & (POLLIN | POLLERR | POLLHUP))) continue;
            recv_msg(&clients[i], MSG_GRANT, buf, sizeof buf);
            uint64_t got = now_ns();
            grant(i, buf);
            if (!on_grant(i, got)) finished++, fds[i].fd = -1;
        }
    }
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank, as token_scheduler.policy.percentile. */
static uint64_t percentile(const uint64_t *sorted, int n, double fraction) {
    long rank = (long)(fraction * n + 0.5 + 0.5) - 1; /* round(f*n + 0.5) - 1 */
    if (rank < 0) rank = 0;
    if (rank > n - 1) rank = n - 1;
    return sorted[rank];
}

int main(int argc, char **argv) {
    const char *endpoints[2] = {NULL, NULL};
    int measured = 5000, positional = 0;
    bool poll_mode = false;
    long hold_us = 0;
    char *end = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--poll") == 0) poll_mode = true;
        else if (strcmp(argv[i], "--hold-us") == 0) hold_us = i + 1 < argc ? strtol(argv[++i], &end, 10) : -1;
        else if (positional < 2) endpoints[positional++] = argv[i];
        else if (positional++ == 2) measured = atoi(argv[i]);
        else positional = 99;
    }
    if (positional < 2 || positional > 3 || measured <= 0 || hold_us < 0 || hold_us > MAX_HOLD_US ||
        (end != NULL && *end != '\0')) {
        fprintf(stderr, "usage: %s ENDPOINT_A ENDPOINT_B [HANDOFFS] [--poll] [--hold-us 0..%d]\n", argv[0],
                MAX_HOLD_US);
        return 2;
    }
    hold_ns = (uint64_t)hold_us * 1000ull;
    total = WARMUP + measured;
    samples = calloc((size_t)total, sizeof *samples);
    to_self = calloc((size_t)total, sizeof *to_self);
    if (!samples || !to_self) die("out of memory", NULL);

    unsigned char buf[256];
    for (int i = 0; i < 2; i++) {
        clients[i].name = i ? "B" : "A";
        if (vcuda_zmtp_connect(&clients[i].conn, endpoints[i], RECV_TIMEOUT_MS) != 0)
            die("cannot connect", &clients[i]);
    }
    /* A takes the token; then B queues, confirmed by a PONG saying WAITING, so
     * that A's first RELEASE(MORE) already has someone to hand over to. */
    send_msg(&clients[0], MSG_REQUEST, 0, 0, 0);
    recv_msg(&clients[0], MSG_GRANT, buf, sizeof buf);
    grant(0, buf);
    send_msg(&clients[1], MSG_REQUEST, 0, 0, 0);
    send_msg(&clients[1], MSG_PING, 0, 42, 0);
    recv_msg(&clients[1], MSG_PONG, buf, sizeof buf);
    if (buf[HEADER_LEN + 12] != 1) die("B is not WAITING after its REQUEST", &clients[1]);

    if (poll_mode) {
        run_poll();
    } else {
        pthread_t threads[2];
        for (int i = 0; i < 2; i++)
            if (pthread_create(&threads[i], NULL, thread_main, (void *)(intptr_t)i) != 0)
                die("pthread_create failed", NULL);
        for (int i = 0; i < 2; i++) pthread_join(threads[i], NULL);
    }
    for (int i = 0; i < 2; i++) vcuda_zmtp_close(&clients[i].conn);

    /* Handoffs to the other client only (the policy may re-grant the releaser). */
    uint64_t *m = samples + WARMUP, *other = calloc((size_t)measured, sizeof *other);
    if (!other) die("out of memory", NULL);
    int n_other = 0;
    double sum = 0;
    for (int i = 0; i < measured; i++) {
        sum += (double)m[i];
        if (!to_self[WARMUP + i]) other[n_other++] = m[i];
    }
    qsort(m, (size_t)measured, sizeof *m, cmp_u64);
    qsort(other, (size_t)n_other, sizeof *other, cmp_u64);
    printf("{\"mode\": \"%s\", \"handoffs\": %d, \"p50_us\": %.1f, \"p99_us\": %.1f, \"mean_us\": %.1f, "
           "\"min_us\": %.1f, \"max_us\": %.1f, \"self_grants\": %d, \"other_p50_us\": %.1f, "
           "\"other_p99_us\": %.1f}\n",
           poll_mode ? "poll" : "threads", measured, percentile(m, measured, 0.5) / 1e3,
           percentile(m, measured, 0.99) / 1e3, sum / measured / 1e3, m[0] / 1e3, m[measured - 1] / 1e3,
           self_grants, n_other ? percentile(other, n_other, 0.5) / 1e3 : 0.0,
           n_other ? percentile(other, n_other, 0.99) / 1e3 : 0.0);
    free(other);
    free(to_self);
    free(samples);
    return 0;
}
