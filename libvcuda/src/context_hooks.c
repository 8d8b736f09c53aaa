/* Context hooks: each new context is charged the per-context overhead
 * (context.c), and destroying one returns its overhead and the allocations
 * the driver freed with it. Whatever changes the calling thread's current
 * context also repoints its launch gate (compute.h). */
#include "compute.h"
#include "config.h"
#include "context.h"
#include "hooks.h"
#include "process.h"
#include "real_driver.h"

CUresult vc_cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuDevicePrimaryCtxRetain(pctx, dev);
    uint64_t charged;
    struct vcuda_overhead_probe before;
    rc = vcuda_context_before_create(dev, true, &charged, &before);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuDevicePrimaryCtxRetain(pctx, dev);
    return vcuda_context_after_create(rc, rc == CUDA_SUCCESS ? *pctx : NULL, dev, true, charged, &before);
}

/* Release and reset, in every ABI the driver hands out (the legacy unsuffixed
 * ones below 11000 take the same argument): the same accounting. */
static CUresult primary_release(CUresult (**real)(CUdevice), const char *name, CUdevice dev, bool reset) {
    CUresult rc = vcuda_real_ready((void **)real, name);
    if (rc != CUDA_SUCCESS) return rc;
    rc = (*real)(dev);
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) vcuda_primary_released(dev, reset);
    return rc;
}

CUresult vc_cuDevicePrimaryCtxRelease_v2(CUdevice dev) {
    return primary_release(&vcuda_real.cuDevicePrimaryCtxRelease_v2, "cuDevicePrimaryCtxRelease_v2", dev, false);
}

CUresult vc_cuDevicePrimaryCtxRelease(CUdevice dev) {
    return primary_release(&vcuda_real.cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease", dev, false);
}

CUresult vc_cuDevicePrimaryCtxReset_v2(CUdevice dev) {
    return primary_release(&vcuda_real.cuDevicePrimaryCtxReset_v2, "cuDevicePrimaryCtxReset_v2", dev, true);
}

CUresult vc_cuDevicePrimaryCtxReset(CUdevice dev) {
    return primary_release(&vcuda_real.cuDevicePrimaryCtxReset, "cuDevicePrimaryCtxReset", dev, true);
}

CUresult vc_cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxCreate_v2, "cuCtxCreate_v2");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuCtxCreate_v2(pctx, flags, dev);
    uint64_t charged;
    struct vcuda_overhead_probe before;
    rc = vcuda_context_before_create(dev, false, &charged, &before);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxCreate_v2(pctx, flags, dev);
    if (rc == CUDA_SUCCESS) vcuda_compute_context_changed(); /* the new context is current */
    return vcuda_context_after_create(rc, rc == CUDA_SUCCESS ? *pctx : NULL, dev, false, charged, &before);
}

CUresult vc_cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *params, int numParams,
                           unsigned int flags, CUdevice dev) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxCreate_v3, "cuCtxCreate_v3");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuCtxCreate_v3(pctx, params, numParams, flags, dev);
    uint64_t charged;
    struct vcuda_overhead_probe before;
    rc = vcuda_context_before_create(dev, false, &charged, &before);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxCreate_v3(pctx, params, numParams, flags, dev);
    if (rc == CUDA_SUCCESS) vcuda_compute_context_changed();
    return vcuda_context_after_create(rc, rc == CUDA_SUCCESS ? *pctx : NULL, dev, false, charged, &before);
}

CUresult vc_cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *params, unsigned int flags, CUdevice dev) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxCreate_v4, "cuCtxCreate_v4");
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_config.disabled) return vcuda_real.cuCtxCreate_v4(pctx, params, flags, dev);
    uint64_t charged;
    struct vcuda_overhead_probe before;
    rc = vcuda_context_before_create(dev, false, &charged, &before);
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxCreate_v4(pctx, params, flags, dev);
    if (rc == CUDA_SUCCESS) vcuda_compute_context_changed();
    return vcuda_context_after_create(rc, rc == CUDA_SUCCESS ? *pctx : NULL, dev, false, charged, &before);
}

CUresult vc_cuCtxDestroy_v2(CUcontext ctx) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxDestroy_v2, "cuCtxDestroy_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxDestroy_v2(ctx);
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) {
        vcuda_context_destroyed(ctx);
        vcuda_compute_context_changed(); /* it may have been current */
    }
    return rc;
}

CUresult vc_cuCtxSetCurrent(CUcontext ctx) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxSetCurrent, "cuCtxSetCurrent");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxSetCurrent(ctx);
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) vcuda_compute_context_changed();
    return rc;
}

CUresult vc_cuCtxPushCurrent_v2(CUcontext ctx) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxPushCurrent_v2, "cuCtxPushCurrent_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxPushCurrent_v2(ctx);
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) vcuda_compute_context_changed();
    return rc;
}

CUresult vc_cuCtxPopCurrent_v2(CUcontext *pctx) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxPopCurrent_v2, "cuCtxPopCurrent_v2");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxPopCurrent_v2(pctx);
    if (rc == CUDA_SUCCESS && !vcuda_config.disabled) vcuda_compute_context_changed();
    return rc;
}
