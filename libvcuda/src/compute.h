/* Compute quotas: the launch gates, the in-flight budget and the token clients.
 *
 * Every launch API runs only while this process holds the token of the GPU it
 * launches on. Each visible device has a gate, one word: open while that
 * device's token is held (or when it has no scheduler, or its scheduler is
 * lost under VCUDA_ON_SCHEDULER_LOSS=run). A launch finds its gate through a
 * thread-local pointer that the context hooks keep pointing at the calling
 * thread's current device, so the fast path reads no driver state. One client
 * thread per limited device owns that scheduler connection: it asks for the
 * token, opens the gate on GRANT, closes it when the lease ends, the device
 * went idle or the scheduler revoked the lease, waits for the process's own
 * work on that device, and reports the real hold time.
 *
 * While the token is held, the process's launched-but-unfinished work stays
 * under the in-flight budget the scheduler sent (token_scheduler/PROTOCOL.md,
 * BUDGET), so that the end of a lease, and a revocation, wait for at most that
 * much work whatever the application's queue depth. A thread-local countdown
 * sends every K-th launch to the slow path, which records a completion
 * checkpoint (a CUevent) on the launch's stream and waits while the work
 * still in flight leaves no room for the next K launches; K follows the
 * per-launch GPU time measured between checkpoints.
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
/* Launches this thread makes before the slow path checks the in-flight budget
 * again. Starts at 0, so a thread's first launch takes the slow path. */
extern __thread int vcuda_thread_countdown __attribute__((tls_model("initial-exec")));

/* The slow path of a launch on `stream` (`ptsz`: through a _ptsz entry point,
 * so a NULL stream is the per-thread default stream): waits until `gate` opens
 * and, when the countdown ran out, records a checkpoint and waits for room
 * under the in-flight budget. Returns the CUresult to fail the launch with, or
 * CUDA_SUCCESS. */
CUresult vcuda_launch_slow(struct vcuda_gate *gate, CUstream stream, int ptsz) __attribute__((noinline, cold));

/* The calling thread's synchronize returned: its work is done. A holder given
 * a short idle grace looks at the process at once, not at its next periodic
 * look: the process may be going quiet. Not on the launch path. */
void vcuda_compute_synchronized(void);

/* The calling thread's current context changed: repoint its gate. */
void vcuda_compute_context_changed(void);

void vcuda_compute_init(void);

#endif
