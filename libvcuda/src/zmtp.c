#include "zmtp.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#define FLAG_MORE 0x01
#define FLAG_LONG 0x02
#define FLAG_COMMAND 0x04

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Reads exactly len bytes before `deadline` (ms); 0 ok, 1 timeout, -1 lost. */
static int read_full(int fd, void *buf, size_t len, int64_t deadline) {
    size_t got = 0;
    while (got < len) {
        int wait = (int)(deadline - now_ms());
        if (wait < 0) wait = 0;
        struct pollfd p = {.fd = fd, .events = POLLIN};
        int r = poll(&p, 1, wait);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) return -1;
        if (r == 0) return got ? -1 : 1; /* a half-read frame cannot be resumed */
        ssize_t n = recv(fd, (char *)buf + got, len - got, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return -1;
        got += (size_t)n;
    }
    return 0;
}

static int write_full(int fd, const void *buf, size_t len) {
    size_t sent = 0;
    while (sent < len) {
        ssize_t n = send(fd, (const char *)buf + sent, len - sent, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        sent += (size_t)n;
    }
    return 0;
}

void vcuda_zmtp_close(struct vcuda_zmtp *z) {
    if (z->fd >= 0) close(z->fd);
    z->fd = -1;
}

int vcuda_zmtp_connect(struct vcuda_zmtp *z, const char *endpoint, int timeout_ms) {
    z->fd = -1;
    if (strncmp(endpoint, "ipc://", 6) != 0) return -1;
    const char *path = endpoint + 6;
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof addr.sun_path) return -1;
    strcpy(addr.sun_path, path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        close(fd);
        return -1;
    }
    int64_t deadline = now_ms() + timeout_ms;
    /* Greeting: signature, version 3.0, mechanism NULL, as-server 0, filler. */
    unsigned char greeting[64] = {0xFF, 0, 0, 0, 0, 0, 0, 0, 1, 0x7F, 3, 0};
    memcpy(greeting + 12, "NULL", 4);
    /* READY command carrying our socket type. */
    static const char name[] = "Socket-Type", value[] = "DEALER";
    unsigned char ready[64];
    size_t n = 0;
    ready[n++] = FLAG_COMMAND;
    ready[n++] = 0; /* size, filled below */
    ready[n++] = 5;
    memcpy(ready + n, "READY", 5), n += 5;
    ready[n++] = (unsigned char)(sizeof name - 1);
    memcpy(ready + n, name, sizeof name - 1), n += sizeof name - 1;
    ready[n++] = 0, ready[n++] = 0, ready[n++] = 0, ready[n++] = (unsigned char)(sizeof value - 1);
    memcpy(ready + n, value, sizeof value - 1), n += sizeof value - 1;
    ready[1] = (unsigned char)(n - 2);
    unsigned char peer[64];
    if (write_full(fd, greeting, sizeof greeting) != 0 || read_full(fd, peer, sizeof peer, deadline) != 0 ||
        peer[0] != 0xFF || peer[9] != 0x7F || peer[10] < 3 || write_full(fd, ready, n) != 0) {
        close(fd);
        return -1;
    }
    z->fd = fd;
    /* The peer's READY arrives as a command frame; recv skips commands. */
    return 0;
}

int vcuda_zmtp_send(struct vcuda_zmtp *z, const void *data, size_t len) {
    if (z->fd < 0 || len > 255) return -1;
    unsigned char frame[2 + 255];
    frame[0] = 0;
    frame[1] = (unsigned char)len;
    memcpy(frame + 2, data, len);
    if (write_full(z->fd, frame, len + 2) != 0) {
        vcuda_zmtp_close(z);
        return -1;
    }
    return 0;
}

int vcuda_zmtp_recv(struct vcuda_zmtp *z, void *buf, size_t cap, size_t *len, int timeout_ms) {
    if (z->fd < 0) return -1;
    int64_t deadline = now_ms() + timeout_ms;
    for (;;) {
        unsigned char head[2];
        int r = read_full(z->fd, head, 1, deadline);
        if (r == 1) return 1;
        if (r == 0) {
            uint64_t size = 0;
            if (head[0] & FLAG_LONG) {
                unsigned char be[8];
                r = read_full(z->fd, be, 8, deadline + 1000);
                for (int i = 0; i < 8 && r == 0; i++) size = size << 8 | be[i];
            } else {
                r = read_full(z->fd, head + 1, 1, deadline + 1000);
                size = head[1];
            }
            /* Commands, multi-part and oversized messages are read and dropped. */
            unsigned char scratch[512];
            bool keep = r == 0 && !(head[0] & (FLAG_COMMAND | FLAG_MORE)) && size <= cap;
            if (r == 0 && keep) {
                r = read_full(z->fd, buf, (size_t)size, deadline + 1000);
                if (r == 0) {
                    *len = (size_t)size;
                    return 0;
                }
            }
            while (r == 0 && size > 0) {
                size_t chunk = size < sizeof scratch ? (size_t)size : sizeof scratch;
                r = read_full(z->fd, scratch, chunk, deadline + 1000);
                size -= chunk;
            }
            if (r == 0) continue;
        }
        vcuda_zmtp_close(z);
        return -1;
    }
}
