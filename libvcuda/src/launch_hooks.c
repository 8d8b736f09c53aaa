/* Launch hooks. Fast path budget (token held, in-flight budget not due):
 * one thread-local load of the current device's gate, one relaxed load of
 * it, one decrement of a thread-local countdown, one predictable branch on
 * both, one relaxed store marking the device busy, then the real launch as a
 * tail call: no lock, no syscall, no clock read, no atomic read-modify-write,
 * no driver query (bench/shim_bench.py measures it against no shim).
 * Everything else is in vcuda_launch_slow (compute.c). */
#include "compute.h"
#include "hooks.h"

#define GATE_CLOSED(g) (!atomic_load_explicit(&(g)->open, memory_order_relaxed))
#define MARK_BUSY(g) atomic_store_explicit(&(g)->launched, 1, memory_order_relaxed)

/* `stream` is the launch's stream expression, evaluated only on the slow path.
 * The slow path is a separate function that launches itself, so both paths
 * end in a tail call and the fast one saves no registers. */
#define VCUDA_LAUNCH_HOOK(name, params, args, stream, ptsz)                                        \
    static __attribute__((noinline, cold)) CUresult slow_##name params {                           \
        struct vcuda_gate *gate = vcuda_thread_gate;                                               \
        CUresult rc = vcuda_launch_slow(gate, (stream), (ptsz));                                   \
        if (rc != CUDA_SUCCESS) return rc;                                                         \
        MARK_BUSY(gate);                                                                           \
        return vcuda_real.name args;                                                               \
    }                                                                                              \
    CUresult vc_##name params {                                                                    \
        struct vcuda_gate *gate = vcuda_thread_gate;                                               \
        int left = --vcuda_thread_countdown;                                                       \
        if (__builtin_expect(GATE_CLOSED(gate) | (left < 0), 0)) return slow_##name args;          \
        MARK_BUSY(gate);                                                                           \
        return vcuda_real.name args;                                                               \
    }

#define EX_STREAM (config != NULL ? config->hStream : NULL)

VCUDA_LAUNCH_HOOK(cuLaunchKernel, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS, stream, 0)
VCUDA_LAUNCH_HOOK(cuLaunchKernel_ptsz, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS, stream, 1)
VCUDA_LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
                  (config, f, params, extra), EX_STREAM, 0)
VCUDA_LAUNCH_HOOK(cuLaunchKernelEx_ptsz,
                  (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
                  (config, f, params, extra), EX_STREAM, 1)
VCUDA_LAUNCH_HOOK(cuLaunchCooperativeKernel, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS, stream, 0)
VCUDA_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS, stream, 1)
VCUDA_LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec exec, CUstream stream), (exec, stream), stream, 0)
VCUDA_LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream), (exec, stream), stream, 1)
