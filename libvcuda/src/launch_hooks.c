/* Launch hooks. Fast path budget (token held): one thread-local load of the
 * current device's gate, one relaxed load of it, one predictable branch, one
 * relaxed store marking the device busy, then the real launch: no lock, no
 * syscall, no clock read, no read-modify-write, no driver query.
 * Everything else is in vcuda_gate_wait (compute.c). */
#include "compute.h"
#include "hooks.h"

#define GATE_OPEN(g) __builtin_expect(atomic_load_explicit(&(g)->open, memory_order_relaxed), 1)
#define MARK_BUSY(g) atomic_store_explicit(&(g)->launched, 1, memory_order_relaxed)

#define VCUDA_LAUNCH_HOOK(name, params, args)                                                      \
    CUresult vc_##name params {                                                                    \
        struct vcuda_gate *gate = vcuda_thread_gate;                                               \
        if (!GATE_OPEN(gate)) {                                                                    \
            CUresult rc = vcuda_gate_wait(gate);                                                   \
            if (rc != CUDA_SUCCESS) return rc;                                                     \
        }                                                                                          \
        MARK_BUSY(gate);                                                                           \
        return vcuda_real.name args;                                                               \
    }

VCUDA_LAUNCH_HOOK(cuLaunchKernel, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS)
VCUDA_LAUNCH_HOOK(cuLaunchKernel_ptsz, VCUDA_LAUNCH_PARAMS, VCUDA_LAUNCH_ARGS)
VCUDA_LAUNCH_HOOK(cuLaunchKernelEx, (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
                  (config, f, params, extra))
VCUDA_LAUNCH_HOOK(cuLaunchKernelEx_ptsz,
                  (const CUlaunchConfig *config, CUfunction f, void **params, void **extra),
                  (config, f, params, extra))
VCUDA_LAUNCH_HOOK(cuLaunchCooperativeKernel, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS)
VCUDA_LAUNCH_HOOK(cuLaunchCooperativeKernel_ptsz, VCUDA_COOP_PARAMS, VCUDA_COOP_ARGS)
VCUDA_LAUNCH_HOOK(cuGraphLaunch, (CUgraphExec exec, CUstream stream), (exec, stream))
VCUDA_LAUNCH_HOOK(cuGraphLaunch_ptsz, (CUgraphExec exec, CUstream stream), (exec, stream))
