/* Compute quotas: the launch gates and the token clients.
 *
 * Every launch API runs only while this process holds the token of the GPU it
 * launches on. Each visible device has a gate, one word: open while that
 * device's token is held (or when it has no scheduler, or its scheduler is
 * lost under VCUDA_ON_SCHEDULER_LOSS=run). A launch finds its gate through a
 * thread-local pointer that the context hooks keep pointing at the calling
 * thread's current device, so the fast path reads no driver state. One client
 * thread per limited device owns that scheduler connection: it asks for the
 * token, opens the gate on GRANT, closes it when the lease ends or the device
 * went idle, waits for the process's own work on that device, and reports
 * the real hold time.
 */
#ifndef VCUDA_COMPUTE_H
#define VCUDA_COMPUTE_H

#include <stdatomic.h>

#include "config.h"
#include "hooks.h"

struct vcuda_gate {
    _Alignas(64) _Atomic int open; /* read by every launch */
    _Alignas(64) _Atomic int launched; /* set by launches; the client thread clears it */
};
extern struct vcuda_gate vcuda_gates[VCUDA_MAX_DEVICES];
/* The gate of the calling thread's current device (device 0 until it sets a context). */
extern __thread struct vcuda_gate *vcuda_thread_gate __attribute__((tls_model("initial-exec")));

/* The slow path of a launch: blocks until `gate` opens. Returns the CUresult
 * to fail the launch with, or CUDA_SUCCESS. */
CUresult vcuda_gate_wait(struct vcuda_gate *gate) __attribute__((noinline, cold));

/* The calling thread's current context changed: repoint its gate. */
void vcuda_compute_context_changed(void);

void vcuda_compute_init(void);

#endif
