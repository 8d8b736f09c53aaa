/* Contexts and their overhead (DESIGN.md "Memory": each process's context
 * overhead is charged). The overhead is measured once per device per ledger,
 * from NVML's view of the device around the first context creation
 * (overhead_probe.c), and stored in the ledger so later processes charge it
 * without measuring. */
#include "context.h"

#include <pthread.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "alloc_map.h"
#include "local_mem.h"
#include "log.h"
#include "pool.h"
#include "prim.h"
#include "process.h"
#include "quota.h"
#include "real_driver.h"

#define MAX_CONTEXTS 256
#define OVERHEAD_WAIT_MS 5000
/* Stored when NVML cannot tell, so later processes do not try again. */
#define OVERHEAD_UNMEASURABLE UINT64_MAX

struct context {
    _Atomic(CUcontext) ctx; /* NULL: free entry */
    CUdevice ordinal;
    int dev_index;
    bool primary;
    int refs;          /* primary retains */
    uint64_t overhead; /* bytes charged for it */
};

static struct context contexts[MAX_CONTEXTS];
static _Atomic int context_high; /* entries [0, high) may be in use */
static pthread_mutex_t context_lock = PTHREAD_MUTEX_INITIALIZER;

bool vcuda_context_lookup(CUcontext ctx, CUdevice *ordinal) {
    int high = atomic_load_explicit(&context_high, memory_order_acquire);
    for (int i = 0; i < high; i++) {
        if (atomic_load_explicit(&contexts[i].ctx, memory_order_acquire) == ctx) {
            *ordinal = contexts[i].ordinal;
            return true;
        }
    }
    return false;
}

static struct context *find_locked(CUcontext ctx, CUdevice ordinal, bool primary) {
    int high = atomic_load(&context_high);
    for (int i = 0; i < high; i++) {
        struct context *c = &contexts[i];
        CUcontext cur = atomic_load(&c->ctx);
        if (cur == NULL) continue;
        if (primary ? (c->primary && c->ordinal == ordinal) : cur == ctx) return c;
    }
    return NULL;
}

static struct context *add_locked(CUcontext ctx) {
    int high = atomic_load(&context_high);
    for (int i = 0; i < MAX_CONTEXTS; i++) {
        if (i < high && atomic_load(&contexts[i].ctx) != NULL) continue;
        if (i >= high) atomic_store_explicit(&context_high, i + 1, memory_order_release);
        return &contexts[i];
    }
    (void)ctx;
    return NULL;
}

static void release_alloc(const struct vcuda_alloc *a, void *arg) {
    (void)arg;
    vcuda_quota_give(a->dev, a->bytes);
}

/* The driver frees a context's allocations with it. */
static void drop_locked(struct context *c) {
    CUcontext ctx = atomic_load(&c->ctx);
    vcuda_quota_give(c->dev_index, c->overhead);
    vcuda_alloc_take_context(ctx, release_alloc, NULL);
    vcuda_local_context_gone(ctx);
    atomic_store_explicit(&c->ctx, NULL, memory_order_release);
    /* Pools outlive contexts, but what the driver freed with this one may
     * have changed what they reserve. */
    vcuda_pools_refresh_device(c->ordinal);
}

/* Only one process per ledger measures the overhead (concurrent context
 * creations would blur the free-memory drop); the others wait for its figure.
 * Returns the known overhead, or 0 when this process is to measure it. */
static uint64_t known_overhead(struct vcuda_ledger_device *d) {
    pid_t self = getpid();
    for (int waited_ms = 0;; waited_ms++) {
        uint64_t overhead = atomic_load(&d->context_overhead);
        if (overhead) return overhead;
        uint64_t measurer = atomic_load(&d->overhead_measurer);
        if (measurer == (uint64_t)self) return 0;
        if (measurer == 0 || !vcuda_prim_alive((pid_t)measurer, 0) || waited_ms >= OVERHEAD_WAIT_MS) {
            /* Nobody measures, the measurer died, or it takes too long: we do. */
            if (atomic_compare_exchange_strong(&d->overhead_measurer, &measurer, (uint64_t)self)) return 0;
            continue;
        }
        struct timespec ms = {0, 1000000};
        nanosleep(&ms, NULL);
    }
}

CUresult vcuda_context_before_create(CUdevice ordinal, bool primary, uint64_t *charged,
                                     struct vcuda_overhead_probe *before) {
    *charged = 0;
    vcuda_probe_clear(before);
    CUresult rc = vcuda_process_ready();
    if (rc == CUDA_SUCCESS) rc = vcuda_device_admit(ordinal); /* only this container's GPUs */
    if (rc != CUDA_SUCCESS) return rc;
    if (primary) {
        pthread_mutex_lock(&context_lock);
        bool active = find_locked(NULL, ordinal, true) != NULL;
        pthread_mutex_unlock(&context_lock);
        if (active) return CUDA_SUCCESS; /* another retain of the same context */
    }
    uint64_t limit;
    int dev = vcuda_device_index(ordinal, &limit, &rc);
    if (dev < 0) return CUDA_SUCCESS; /* an invalid ordinal: the driver will say so */
    uint64_t overhead = known_overhead(&vcuda_proc.ledger.file->devices[dev]);
    if (overhead == 0) {
        vcuda_probe_take(ordinal, before);
        return CUDA_SUCCESS;
    }
    if (overhead == OVERHEAD_UNMEASURABLE) return CUDA_SUCCESS;
    if (!vcuda_quota_take(dev, overhead, limit)) {
        vcuda_info("context on device %d refused: its %llu bytes of overhead exceed the quota",
                   ordinal, (unsigned long long)overhead);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    *charged = overhead;
    return CUDA_SUCCESS;
}

/* First context on a device of this ledger: measure and charge the
 * overhead, and publish it unless other contexts blurred the measurement (the
 * next process then measures again). Returns false when the quota cannot
 * hold it. */
static bool charge_measured(CUdevice ordinal, int dev, uint64_t limit,
                            const struct vcuda_overhead_probe *before, uint64_t *charged) {
    struct vcuda_ledger_device *d = &vcuda_proc.ledger.file->devices[dev];
    uint64_t overhead = atomic_load(&d->context_overhead);
    if (overhead == 0) {
        struct vcuda_overhead_probe after;
        vcuda_probe_take(ordinal, &after);
        bool exact;
        if (!vcuda_probe_overhead(before, &after, &overhead, &exact)) {
            vcuda_info("context overhead on device %d not measurable (no NVML view); not charged", ordinal);
            overhead = OVERHEAD_UNMEASURABLE;
        } else {
            vcuda_debug("context overhead on device %d: %llu bytes%s", ordinal, (unsigned long long)overhead,
                        exact ? "" : " (other contexts created meanwhile: not recorded)");
        }
        uint64_t expected = 0;
        if (exact && !atomic_compare_exchange_strong(&d->context_overhead, &expected, overhead))
            overhead = expected;
        atomic_store(&d->overhead_measurer, 0);
    }
    if (overhead == OVERHEAD_UNMEASURABLE) return true;
    if (!vcuda_quota_take(dev, overhead, limit)) return false;
    *charged = overhead;
    return true;
}

/* A would-be measurer whose context was not created hands the job on. */
static void stop_measuring(int dev) {
    uint64_t self = (uint64_t)getpid();
    atomic_compare_exchange_strong(&vcuda_proc.ledger.file->devices[dev].overhead_measurer, &self, 0);
}

CUresult vcuda_context_after_create(CUresult rc, CUcontext ctx, CUdevice ordinal, bool primary,
                                    uint64_t charged, const struct vcuda_overhead_probe *before) {
    uint64_t limit;
    CUresult dev_rc;
    int dev = vcuda_device_index(ordinal, &limit, &dev_rc);
    if (dev >= 0 && (rc != CUDA_SUCCESS || charged)) stop_measuring(dev);
    if (rc != CUDA_SUCCESS || dev < 0) {
        if (dev >= 0) vcuda_quota_give(dev, charged);
        return rc;
    }
    pthread_mutex_lock(&context_lock);
    struct context *c = primary ? find_locked(NULL, ordinal, true) : NULL;
    if (c) {
        /* Another thread's retain created it first; ours added no context. */
        c->refs++;
        pthread_mutex_unlock(&context_lock);
        stop_measuring(dev);
        vcuda_quota_give(dev, charged);
        return CUDA_SUCCESS;
    }
    if (charged == 0 && !charge_measured(ordinal, dev, limit, before, &charged)) {
        pthread_mutex_unlock(&context_lock);
        /* Over quota: undo the context so nothing stays allocated. */
        if (primary) vcuda_real.cuDevicePrimaryCtxRelease_v2(ordinal);
        else vcuda_real.cuCtxDestroy_v2(ctx);
        vcuda_info("context on device %d refused: its overhead exceeds the quota", ordinal);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    c = add_locked(ctx);
    if (c == NULL) {
        vcuda_warn("more than %d live contexts; context overhead no longer tracked", MAX_CONTEXTS);
    } else {
        c->ordinal = ordinal;
        c->dev_index = dev;
        c->primary = primary;
        c->refs = 1;
        c->overhead = charged;
        atomic_store_explicit(&c->ctx, ctx, memory_order_release);
    }
    pthread_mutex_unlock(&context_lock);
    return CUDA_SUCCESS;
}

void vcuda_context_destroyed(CUcontext ctx) {
    pthread_mutex_lock(&context_lock);
    struct context *c = find_locked(ctx, 0, false);
    if (c) drop_locked(c);
    pthread_mutex_unlock(&context_lock);
}

void vcuda_primary_released(CUdevice ordinal, bool reset) {
    pthread_mutex_lock(&context_lock);
    struct context *c = find_locked(NULL, ordinal, true);
    if (c && (reset || --c->refs <= 0)) drop_locked(c);
    pthread_mutex_unlock(&context_lock);
}

void vcuda_context_reset_after_fork(void) {
    pthread_mutex_init(&context_lock, NULL);
    for (int i = 0; i < MAX_CONTEXTS; i++) atomic_store(&contexts[i].ctx, NULL);
    atomic_store(&context_high, 0);
}

int vcuda_contexts_snapshot(CUcontext *out, int max) {
    int n = 0;
    int high = atomic_load_explicit(&context_high, memory_order_acquire);
    for (int i = 0; i < high && n < max; i++) {
        CUcontext ctx = atomic_load_explicit(&contexts[i].ctx, memory_order_acquire);
        if (ctx) out[n++] = ctx;
    }
    return n;
}
