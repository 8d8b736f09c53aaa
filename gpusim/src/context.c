/* Contexts: the primary context per device, created contexts, and each
 * thread's stack of current contexts. Every context is charged the
 * configured overhead (VCUDA_SIM_CONTEXT_OVERHEAD) on the device while it lives. */
#define _GNU_SOURCE
#include <stdlib.h>
#include <string.h>

#include "api.h"
#include "sim.h"

#define SIM_CTX_STACK 64

static _Thread_local struct sim_ctx *ctx_stack[SIM_CTX_STACK];
static _Thread_local int ctx_depth;

bool sim_ctx_valid(const struct sim_ctx *c)
{
    return c && c->magic == SIM_CTX_MAGIC && c->alive && c->gen == sim.gen;
}

struct sim_ctx *sim_current_ctx(void)
{
    struct sim_ctx *c = ctx_depth ? ctx_stack[ctx_depth - 1] : NULL;
    return sim_ctx_valid(c) ? c : NULL;
}

CUresult sim_require_ctx(struct sim_ctx **out)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    *out = sim_current_ctx();
    return *out ? CUDA_SUCCESS : CUDA_ERROR_INVALID_CONTEXT;
}

static void set_contexts(unsigned phys, int delta)
{
    sim_lock(sim.sh);
    sim.sh->proc[sim.slot].contexts[phys] += (uint32_t)delta;
    sim_unlock(sim.sh);
}

/* Caller holds sim.mu. */
static CUresult ctx_new(CUdevice ordinal, unsigned phys, bool primary, unsigned flags,
                        struct sim_ctx **out)
{
    struct sim_ctx *c = calloc(1, sizeof *c);
    if (!c)
        return CUDA_ERROR_OUT_OF_MEMORY;
    CUresult rc = sim_charge_as(phys, SIM_MEM_CONTEXT, sim.sh->ctx_overhead);
    if (rc != CUDA_SUCCESS) {
        free(c);
        return rc;
    }
    /* A real driver takes 0.1-1 s to create a context, its memory taken
     * early; other processes run meanwhile (VCUDA_SIM_CTX_CREATE_US, default 0). */
    if (sim.ctx_create_ns)
        sim_sleep_until(sim_now_ns() + sim.ctx_create_ns, 0);
    set_contexts(phys, 1);
    c->magic = SIM_CTX_MAGIC;
    c->gen = sim.gen;
    c->alive = true;
    c->primary = primary;
    c->ordinal = ordinal;
    c->phys = phys;
    c->flags = flags;
    c->id = ++sim.next_ctx_id;
    *out = c;
    return CUDA_SUCCESS;
}

/* Caller holds sim.mu. The struct stays allocated (see sim.h). */
static void ctx_destroy(struct sim_ctx *c)
{
    c->alive = false;
    sim_alloc_free_ctx(c);
    sim_uncharge_as(c->phys, SIM_MEM_CONTEXT, sim.sh->ctx_overhead);
    set_contexts(c->phys, -1);
    for (int i = ctx_depth - 1; i >= 0; i--) {
        if (ctx_stack[i] == c) {
            memmove(&ctx_stack[i], &ctx_stack[i + 1],
                    (size_t)(ctx_depth - i - 1) * sizeof ctx_stack[0]);
            ctx_depth--;
        }
    }
}

void sim_local_reset(void)
{
    sim.gen++;
    if (sim.sh)
        sim_state_close(sim.sh);
    sim.sh = NULL;
    sim.slot = -1;
    sim.initialized = false;
    sim.init_err = CUDA_SUCCESS;
    memset(sim.primary, 0, sizeof sim.primary);
    memset(sim.primary_refs, 0, sizeof sim.primary_refs);
    ctx_depth = 0;
}

/* ---- primary contexts ---- */

SIM_EXPORT CUresult cuDevicePrimaryCtxRetain(CUcontext *pctx, CUdevice dev)
{
    unsigned phys;
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    if (!sim_ctx_valid(sim.primary[dev]))
        rc = ctx_new(dev, phys, true, sim.primary_flags[dev], &sim.primary[dev]);
    if (rc == CUDA_SUCCESS) {
        sim.primary_refs[dev]++;
        *pctx = (CUcontext)sim.primary[dev];
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease_v2(CUdevice dev)
{
    unsigned phys;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    if (sim.primary_refs[dev] == 0 || !sim_ctx_valid(sim.primary[dev])) {
        rc = CUDA_ERROR_INVALID_CONTEXT;
    } else if (--sim.primary_refs[dev] == 0) {
        ctx_destroy(sim.primary[dev]);
        sim.primary[dev] = NULL;
    }
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxRelease(CUdevice dev)
{
    return cuDevicePrimaryCtxRelease_v2(dev);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxReset_v2(CUdevice dev)
{
    unsigned phys;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    if (sim_ctx_valid(sim.primary[dev]))
        ctx_destroy(sim.primary[dev]);
    sim.primary[dev] = NULL;
    sim.primary_refs[dev] = 0;
    sim.primary_flags[dev] = 0;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxReset(CUdevice dev)
{
    return cuDevicePrimaryCtxReset_v2(dev);
}

SIM_EXPORT CUresult cuDevicePrimaryCtxGetState(CUdevice dev, unsigned int *flags, int *active)
{
    unsigned phys;
    if (!flags || !active)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    *flags = sim.primary_flags[dev];
    *active = sim_ctx_valid(sim.primary[dev]);
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags_v2(CUdevice dev, unsigned int flags)
{
    unsigned phys;
    if (flags & ~(unsigned)CU_CTX_FLAGS_MASK)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    pthread_mutex_lock(&sim.mu);
    sim.primary_flags[dev] = flags;
    if (sim_ctx_valid(sim.primary[dev]))
        sim.primary[dev]->flags = flags;
    pthread_mutex_unlock(&sim.mu);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDevicePrimaryCtxSetFlags(CUdevice dev, unsigned int flags)
{
    return cuDevicePrimaryCtxSetFlags_v2(dev, flags);
}

/* ---- created contexts ---- */

SIM_EXPORT CUresult cuCtxCreate_v2(CUcontext *pctx, unsigned int flags, CUdevice dev)
{
    unsigned phys;
    if (!pctx || (flags & ~(unsigned)CU_CTX_FLAGS_MASK))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth >= SIM_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    struct sim_ctx *c;
    pthread_mutex_lock(&sim.mu);
    rc = ctx_new(dev, phys, false, flags, &c);
    pthread_mutex_unlock(&sim.mu);
    if (rc != CUDA_SUCCESS)
        return rc;
    ctx_stack[ctx_depth++] = c; /* a new context is made current */
    *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxCreate_v3(CUcontext *pctx, CUexecAffinityParam *paramsArray,
                                   int numParams, unsigned int flags, CUdevice dev)
{
    (void)paramsArray;
    (void)numParams;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SIM_EXPORT CUresult cuCtxCreate_v4(CUcontext *pctx, CUctxCreateParams *ctxCreateParams,
                                   unsigned int flags, CUdevice dev)
{
    (void)ctxCreateParams;
    return cuCtxCreate_v2(pctx, flags, dev);
}

SIM_EXPORT CUresult cuCtxDestroy_v2(CUcontext ctx)
{
    struct sim_ctx *c = (struct sim_ctx *)ctx;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!c)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim.mu);
    if (!sim_ctx_valid(c) || c->primary)
        rc = CUDA_ERROR_INVALID_CONTEXT;
    else
        ctx_destroy(c);
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

SIM_EXPORT CUresult cuCtxSetCurrent(CUcontext ctx)
{
    struct sim_ctx *c = (struct sim_ctx *)ctx;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!c) {
        if (ctx_depth)
            ctx_depth--;
        return CUDA_SUCCESS;
    }
    if (!sim_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth == 0)
        ctx_depth = 1;
    ctx_stack[ctx_depth - 1] = c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetCurrent(CUcontext *pctx)
{
    if (!pctx)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    *pctx = (CUcontext)sim_current_ctx();
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPushCurrent_v2(CUcontext ctx)
{
    struct sim_ctx *c = (struct sim_ctx *)ctx;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!sim_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    if (ctx_depth >= SIM_CTX_STACK)
        return CUDA_ERROR_INVALID_VALUE;
    ctx_stack[ctx_depth++] = c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxPopCurrent_v2(CUcontext *pctx)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (ctx_depth == 0)
        return CUDA_ERROR_INVALID_CONTEXT;
    struct sim_ctx *c = ctx_stack[--ctx_depth];
    if (pctx)
        *pctx = (CUcontext)c;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetDevice(CUdevice *device)
{
    struct sim_ctx *c;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc == CUDA_SUCCESS)
        *device = c->ordinal;
    return rc;
}

SIM_EXPORT CUresult cuCtxGetFlags(unsigned int *flags)
{
    struct sim_ctx *c;
    if (!flags)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc == CUDA_SUCCESS)
        *flags = c->flags;
    return rc;
}

SIM_EXPORT CUresult cuCtxGetApiVersion(CUcontext ctx, unsigned int *version)
{
    struct sim_ctx *c = ctx ? (struct sim_ctx *)ctx : sim_current_ctx();
    if (!version)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!sim_ctx_valid(c))
        return CUDA_ERROR_INVALID_CONTEXT;
    *version = 3020;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuCtxGetStreamPriorityRange(int *leastPriority, int *greatestPriority)
{
    if (leastPriority)
        *leastPriority = 0;
    if (greatestPriority)
        *greatestPriority = -5;
    return sim_check_init();
}

SIM_EXPORT CUresult cuCtxSynchronize(void)
{
    struct sim_ctx *c;
    CUresult rc = sim_require_ctx(&c);
    if (rc == CUDA_SUCCESS)
        rc = sim_capture_context_sync();
    if (rc != CUDA_SUCCESS)
        return rc;
    sim_ctx_drain(c);
    sim_pools_release_on_sync();
    return CUDA_SUCCESS;
}
