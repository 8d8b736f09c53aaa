/* Local memory and context limits (DESIGN.md "Memory"; issue 12).
 *
 * A context reserves local memory, each thread's stack, for every thread its
 * device can hold at once:
 *
 *     bytes = per-thread size x CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT
 *                             x CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR
 *
 * (to verify on hardware: the driver may round the per-thread size or the
 * thread count up). The per-thread size is the larger of the stack limit
 * (CU_LIMIT_STACK_SIZE) and the CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES of the
 * largest-frame function launched in the context; the driver raises it at
 * such a launch and never lowers it by itself. What the context reserved
 * when we first met it is part of its overhead (context.c); what lies above
 * is charged here, off the launch path, when a function is obtained
 * (cuModuleGetFunction, cuKernelGetFunction, cuLibraryGetKernel with a
 * current context): the context's charge rises to the high-water mark, and a
 * function whose frame does not fit the quota is refused with
 * CUDA_ERROR_OUT_OF_MEMORY, so it is never launched.
 *
 * cuCtxSetLimit is charged before the call when it raises a limit (refused
 * when that does not fit) and refunded after it when it lowers one: the
 * stack size as above, never below the largest frame seen (the next launch
 * would take that again); the malloc heap and printf FIFO by their size above
 * the value the context had before its first change; the device-runtime
 * limits by the drop in the device's free memory around the call, since no
 * formula for them is published. Other limits hold no device memory.
 *
 * A function or device attribute the driver will not report is taken at its
 * upper bound (a 512 KiB frame, 256 SMs of 2048 threads), with one warning. */
#include "local_mem.h"

#include <pthread.h>
#include <stdbool.h>

#include "config.h"
#include "context.h"
#include "log.h"
#include "process.h"
#include "quota.h"
#include "real_driver.h"

#define MAX_CONTEXTS 256
#define FRAME_MAX (512ull << 10) /* local memory one thread can have (compute capability >= 2.0) */
#define SMS_MAX 256ull
#define THREADS_PER_SM_MAX 2048ull
#define SIZED_LIMITS 3 /* CU_LIMIT_STACK_SIZE, _PRINTF_FIFO_SIZE, _MALLOC_HEAP_SIZE */
#define LIMITS 5       /* ... and the two device-runtime limits */

struct ctx_local {
    CUcontext ctx; /* NULL: free entry */
    CUdevice ordinal;
    int dev;               /* ledger device */
    uint64_t threads;      /* threads its device holds at once */
    uint64_t base_stack;   /* per-thread stack when first met: in the context overhead */
    uint64_t stack;        /* the stack limit now */
    uint64_t frame;        /* the largest function frame obtained in it */
    uint64_t local_charged;
    bool limit_known[SIZED_LIMITS];
    uint64_t limit_base[SIZED_LIMITS]; /* FIFO and heap before their first change */
    uint64_t limit_charged[LIMITS];    /* FIFO, heap and the device-runtime limits */
};

static struct ctx_local locals[MAX_CONTEXTS];
static pthread_mutex_t local_lock = PTHREAD_MUTEX_INITIALIZER; /* guards locals and device_threads */
static uint64_t device_threads[VCUDA_MAX_DEVICES];            /* by ordinal, 0: not asked yet */

static void warn_once(_Atomic int *flag, const char *what) {
    if (atomic_exchange(flag, 1) == 0) vcuda_warn("%s", what);
}

static uint64_t device_attr(CUdevice ordinal, int attr, uint64_t upper) {
    static _Atomic int warned;
    int v = 0;
    if (vcuda_real.cuDeviceGetAttribute && vcuda_real.cuDeviceGetAttribute(&v, (CUdevice_attribute)attr, ordinal) == CUDA_SUCCESS && v > 0)
        return (uint64_t)v;
    warn_once(&warned, "the driver does not report a device's SM count or threads per SM; local memory is "
                       "charged for 256 SMs of 2048 threads");
    return upper;
}

/* Threads device `ordinal` holds at once. Caller holds local_lock. */
static uint64_t threads_of(CUdevice ordinal) {
    if (device_threads[ordinal] == 0)
        device_threads[ordinal] = device_attr(ordinal, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, SMS_MAX) *
                                  device_attr(ordinal, CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR,
                                              THREADS_PER_SM_MAX);
    return device_threads[ordinal];
}

/* A limit of the current context, or `fallback` when the driver will not say. */
static uint64_t current_limit(CUlimit limit, uint64_t fallback) {
    size_t v = 0;
    if (vcuda_real.cuCtxGetLimit && vcuda_real.cuCtxGetLimit(&v, limit) == CUDA_SUCCESS) return v;
    return fallback;
}

/* The record of `ctx`, the current context, made when first met. Caller holds local_lock. */
static struct ctx_local *local_of(CUcontext ctx) {
    static _Atomic int warned_full, warned_stack;
    struct ctx_local *free_entry = NULL;
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (locals[i].ctx == ctx) return &locals[i];
        if (locals[i].ctx == NULL && free_entry == NULL) free_entry = &locals[i];
    }
    CUdevice ordinal;
    uint64_t limit;
    CUresult rc;
    if (!vcuda_context_lookup(ctx, &ordinal) && vcuda_real.cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return NULL;
    int dev = vcuda_device_index(ordinal, &limit, &rc);
    if (dev < 0) return NULL;
    if (free_entry == NULL) {
        warn_once(&warned_full, "more than 256 contexts with local memory; functions in another are refused");
        return NULL;
    }
    *free_entry = (struct ctx_local){.ctx = ctx, .ordinal = ordinal, .dev = dev, .threads = threads_of(ordinal)};
    /* Unknown: charge the whole stack from zero. */
    free_entry->base_stack = current_limit(CU_LIMIT_STACK_SIZE, 0);
    if (free_entry->base_stack == 0)
        warn_once(&warned_stack, "the driver does not report a context's stack size; its whole local memory is charged");
    free_entry->stack = free_entry->base_stack;
    return free_entry;
}

static uint64_t device_limit(const struct ctx_local *r) {
    uint64_t limit = VCUDA_UNLIMITED;
    CUresult rc;
    vcuda_device_index(r->ordinal, &limit, &rc);
    return limit;
}

/* Moves a charge of r from `*charged` to `want` bytes. Caller holds local_lock. */
static CUresult recharge(const struct ctx_local *r, uint64_t *charged, uint64_t want) {
    if (want > *charged) {
        if (!vcuda_quota_take(r->dev, want - *charged, device_limit(r))) return CUDA_ERROR_OUT_OF_MEMORY;
    } else {
        vcuda_quota_give(r->dev, *charged - want);
    }
    *charged = want;
    return CUDA_SUCCESS;
}

/* Charges r's local memory for a stack limit and a largest frame. */
static CUresult set_local(struct ctx_local *r, uint64_t stack, uint64_t frame) {
    uint64_t per_thread = stack > frame ? stack : frame;
    uint64_t want = per_thread > r->base_stack ? (per_thread - r->base_stack) * r->threads : 0;
    CUresult rc = recharge(r, &r->local_charged, want);
    if (rc == CUDA_SUCCESS) {
        r->stack = stack;
        r->frame = frame;
    }
    return rc;
}

/* ---- functions -------------------------------------------------------------- */

/* A function of `frame` bytes per thread is now obtainable in the current context. */
static CUresult frame_obtained(CUcontext ctx, uint64_t frame) {
    pthread_mutex_lock(&local_lock);
    struct ctx_local *r = local_of(ctx);
    CUresult rc = r == NULL ? CUDA_ERROR_OUT_OF_MEMORY : frame > r->frame ? set_local(r, r->stack, frame) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS)
        vcuda_info("function with %llu bytes of local memory per thread refused: its context's local memory "
                   "would exceed the quota", (unsigned long long)frame);
    pthread_mutex_unlock(&local_lock);
    return rc;
}

static uint64_t frame_or_bound(CUresult rc, int value) {
    static _Atomic int warned;
    if (rc == CUDA_SUCCESS && value >= 0) return (uint64_t)value;
    warn_once(&warned, "the driver does not report a function's local memory size; charging the 512 KiB "
                       "per thread a function can have");
    return FRAME_MAX;
}

/* The current context, or NULL when there is none or memory is not limited here. */
static CUcontext tracked_context(void) {
    CUcontext ctx = NULL;
    if (vcuda_config.disabled || vcuda_process_ready() != CUDA_SUCCESS ||
        vcuda_real.cuCtxGetCurrent(&ctx) != CUDA_SUCCESS)
        return NULL;
    return ctx;
}

static CUresult function_obtained(CUfunction *f) {
    CUcontext ctx = tracked_context();
    if (ctx == NULL) return CUDA_SUCCESS;
    int value = -1;
    CUresult rc = vcuda_real.cuFuncGetAttribute
                      ? vcuda_real.cuFuncGetAttribute(&value, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, *f)
                      : CUDA_ERROR_NOT_FOUND;
    rc = frame_obtained(ctx, frame_or_bound(rc, value));
    if (rc != CUDA_SUCCESS) *f = NULL;
    return rc;
}

CUresult vc_cuModuleGetFunction(CUfunction *hfunc, CUmodule hmod, const char *name) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuModuleGetFunction, "cuModuleGetFunction");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuModuleGetFunction(hfunc, hmod, name);
    return rc == CUDA_SUCCESS && hfunc ? function_obtained(hfunc) : rc;
}

CUresult vc_cuKernelGetFunction(CUfunction *pFunc, CUkernel kernel) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuKernelGetFunction, "cuKernelGetFunction");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuKernelGetFunction(pFunc, kernel);
    return rc == CUDA_SUCCESS && pFunc ? function_obtained(pFunc) : rc;
}

/* A kernel is context-independent, but launched as it is (cudart does) it
 * runs in the current context: charged there. */
CUresult vc_cuLibraryGetKernel(CUkernel *pKernel, CUlibrary library, const char *name) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuLibraryGetKernel, "cuLibraryGetKernel");
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuLibraryGetKernel(pKernel, library, name);
    CUcontext ctx = rc == CUDA_SUCCESS && pKernel ? tracked_context() : NULL;
    CUdevice ordinal;
    if (ctx == NULL || vcuda_real.cuCtxGetDevice(&ordinal) != CUDA_SUCCESS) return rc;
    int value = -1;
    CUresult attr_rc = vcuda_real.cuKernelGetAttribute
                           ? vcuda_real.cuKernelGetAttribute(&value, CU_FUNC_ATTRIBUTE_LOCAL_SIZE_BYTES, *pKernel, ordinal)
                           : CUDA_ERROR_NOT_FOUND;
    rc = frame_obtained(ctx, frame_or_bound(attr_rc, value));
    if (rc != CUDA_SUCCESS) *pKernel = NULL;
    return rc;
}

/* ---- cuCtxSetLimit ------------------------------------------------------------ */

/* Stack, FIFO or heap: a size the driver reserves in full. Caller holds local_lock. */
static CUresult set_sized_limit(struct ctx_local *r, CUlimit limit, size_t value) {
    if (limit == CU_LIMIT_STACK_SIZE) {
        uint64_t old = r->stack;
        /* Raise the charge before the driver raises the memory; lower it after. */
        CUresult rc = value > old ? set_local(r, value, r->frame) : CUDA_SUCCESS;
        if (rc != CUDA_SUCCESS) return rc;
        rc = vcuda_real.cuCtxSetLimit(limit, value);
        set_local(r, rc == CUDA_SUCCESS ? value : old, r->frame); /* only ever gives back here */
        return rc;
    }
    if (!r->limit_known[limit]) {
        /* Unknown: charge the whole size. */
        r->limit_base[limit] = current_limit(limit, 0);
        r->limit_known[limit] = true;
    }
    uint64_t old = r->limit_charged[limit];
    uint64_t want = value > r->limit_base[limit] ? value - r->limit_base[limit] : 0;
    CUresult rc = want > old ? recharge(r, &r->limit_charged[limit], want) : CUDA_SUCCESS;
    if (rc != CUDA_SUCCESS) return rc;
    rc = vcuda_real.cuCtxSetLimit(limit, value);
    recharge(r, &r->limit_charged[limit], rc == CUDA_SUCCESS ? want : old);
    return rc;
}

/* A device-runtime limit: charged by the drop in free device memory the
 * driver shows around the call. Caller holds local_lock. */
static CUresult set_measured_limit(struct ctx_local *r, CUlimit limit, size_t value) {
    size_t free0 = 0, free1 = 0, total = 0, old = current_limit(limit, 0);
    bool measured = vcuda_real.cuMemGetInfo_v2 && vcuda_real.cuMemGetInfo_v2(&free0, &total) == CUDA_SUCCESS;
    if (!measured && value > old) {
        vcuda_warn("cannot measure what raising a device-runtime limit costs (no free-memory view); refused");
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    CUresult rc = vcuda_real.cuCtxSetLimit(limit, value);
    if (rc != CUDA_SUCCESS || !measured || vcuda_real.cuMemGetInfo_v2(&free1, &total) != CUDA_SUCCESS) return rc;
    uint64_t *charged = &r->limit_charged[limit];
    if (free1 < free0) {
        if (!vcuda_quota_take(r->dev, free0 - free1, device_limit(r))) {
            vcuda_real.cuCtxSetLimit(limit, old); /* undo: nothing stays reserved */
            return CUDA_ERROR_OUT_OF_MEMORY;
        }
        *charged += free0 - free1;
    } else {
        uint64_t back = free1 - free0 < *charged ? free1 - free0 : *charged;
        vcuda_quota_give(r->dev, back);
        *charged -= back;
    }
    return rc;
}

CUresult vc_cuCtxSetLimit(CUlimit limit, size_t value) {
    CUresult rc = vcuda_real_ready((void **)&vcuda_real.cuCtxSetLimit, "cuCtxSetLimit");
    if (rc != CUDA_SUCCESS) return rc;
    CUcontext ctx = limit < LIMITS ? tracked_context() : NULL;
    if (ctx == NULL) return vcuda_real.cuCtxSetLimit(limit, value);
    pthread_mutex_lock(&local_lock);
    struct ctx_local *r = local_of(ctx);
    if (r == NULL) rc = CUDA_ERROR_OUT_OF_MEMORY;
    else if (limit < SIZED_LIMITS) rc = set_sized_limit(r, limit, value);
    else rc = set_measured_limit(r, limit, value);
    pthread_mutex_unlock(&local_lock);
    if (rc == CUDA_ERROR_OUT_OF_MEMORY)
        vcuda_info("cuCtxSetLimit(%d, %zu) refused: over the memory quota", (int)limit, value);
    return rc;
}

/* ---- lifetime ------------------------------------------------------------------ */

void vcuda_local_context_gone(CUcontext ctx) {
    pthread_mutex_lock(&local_lock);
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        struct ctx_local *r = &locals[i];
        if (r->ctx != ctx || ctx == NULL) continue;
        uint64_t total = r->local_charged;
        for (int l = 0; l < LIMITS; l++) total += r->limit_charged[l];
        vcuda_quota_give(r->dev, total);
        r->ctx = NULL;
    }
    pthread_mutex_unlock(&local_lock);
}

void vcuda_local_reset_after_fork(void) {
    pthread_mutex_init(&local_lock, NULL);
    for (int i = 0; i < MAX_CONTEXTS; i++) locals[i].ctx = NULL;
}
