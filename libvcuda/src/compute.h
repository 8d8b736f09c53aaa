/* Compute quotas: the launch gate and the token client.
 *
 * Every launch API runs only while this process holds the GPU's token. The
 * gate is one word: open while the token is held (or when no scheduler is
 * configured, or the scheduler is lost under VCUDA_ON_SCHEDULER_LOSS=run).
 * A client thread owns the scheduler connection: it asks for the token,
 * opens the gate on GRANT, closes it when the lease ends or the process went
 * idle, waits for the process's own GPU work, and reports the real hold time.
 */
#ifndef VCUDA_COMPUTE_H
#define VCUDA_COMPUTE_H

#include <stdatomic.h>

#include "hooks.h"

struct vcuda_gate {
    _Alignas(64) _Atomic int open; /* read by every launch */
    _Alignas(64) _Atomic int launched; /* set by launches; the client thread clears it */
};
extern struct vcuda_gate vcuda_gate;

/* The slow path of a launch: blocks until the gate opens. Returns the
 * CUresult to fail the launch with, or CUDA_SUCCESS. */
CUresult vcuda_gate_wait(void) __attribute__((noinline, cold));

void vcuda_compute_init(void);

#endif
