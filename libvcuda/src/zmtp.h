/* A minimal ZeroMQ (ZMTP/3.0, NULL mechanism) DEALER client over a unix
 * socket, enough to talk to a token scheduler's ROUTER endpoint (ipc://path).
 *
 * Why not libzmq: inside an LD_PRELOAD shim libzmq would bring its own I/O
 * threads and C++ runtime into every CUDA process and could clash with the
 * application's own libzmq (pyzmq bundles one). Speaking the wire protocol
 * directly needs no library in the container and exports nothing.
 *
 * Contract: one message = one frame of at most 255 bytes (all token-scheduler
 * frames are). vcuda_zmtp_connect() blocks at most timeout_ms; send/recv return
 * 0 on success, -1 when the connection is lost (then reconnect), and recv
 * returns 1 on timeout. ZMTP commands from the peer are skipped.
 */
#ifndef VCUDA_ZMTP_H
#define VCUDA_ZMTP_H

#include <stddef.h>
#include <stdint.h>

struct vcuda_zmtp {
    int fd; /* -1: not connected */
};

int vcuda_zmtp_connect(struct vcuda_zmtp *z, const char *endpoint, int timeout_ms);
void vcuda_zmtp_close(struct vcuda_zmtp *z);
int vcuda_zmtp_send(struct vcuda_zmtp *z, const void *data, size_t len);
/* Receives one message into buf (cap bytes); *len gets its size. */
int vcuda_zmtp_recv(struct vcuda_zmtp *z, void *buf, size_t cap, size_t *len, int timeout_ms);

#endif
