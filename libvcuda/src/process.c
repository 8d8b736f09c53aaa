#include "process.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "alloc_map.h"
#include "config.h"
#include "context.h"
#include "graph_mem.h"
#include "local_mem.h"
#include "pool.h"
#include "log.h"
#include "prim.h"
#include "real_driver.h"

struct vcuda_process vcuda_proc = {.slot = -1};

static pthread_mutex_t proc_lock = PTHREAD_MUTEX_INITIALIZER;
static _Atomic int proc_ready;
static CUresult proc_status; /* sticky failure: config and driver do not change */

/* Per CUDA ordinal: ledger device index + 1 (0 = not yet named), or refused:
 * not this container's GPU (the quota file does not name it). */
static struct {
    _Atomic int index_plus_one;
    _Atomic int refused;
    char uuid[VCUDA_LEDGER_UUID_LEN];
} ordinals[VCUDA_MAX_DEVICES];

static CUresult attach_slow(void) {
    pthread_mutex_lock(&proc_lock);
    CUresult rc = CUDA_SUCCESS;
    if (atomic_load(&proc_ready)) goto out;
    if (proc_status != CUDA_SUCCESS) { rc = proc_status; goto out; }
    if (vcuda_config.error[0]) {
        vcuda_error("%s", vcuda_config.error);
        rc = CUDA_ERROR_NOT_INITIALIZED;
        goto fail;
    }
    vcuda_config_warn_ignored();
    rc = vcuda_driver_load();
    if (rc != CUDA_SUCCESS) goto fail;
    if (vcuda_proc.ledger.file == NULL) {
        char err[4096 + 256];
        if (vcuda_ledger_open(&vcuda_proc.ledger, vcuda_config.ledger, true, err, sizeof err) != 0) {
            vcuda_error("%s; memory quotas cannot be enforced", err);
            rc = CUDA_ERROR_NOT_INITIALIZED;
            goto fail;
        }
    }
    pid_t pid = getpid();
    vcuda_proc.slot = vcuda_ledger_attach(&vcuda_proc.ledger, pid, vcuda_prim_start_time(pid));
    if (vcuda_proc.slot < 0) {
        vcuda_error("ledger %s has no free process slot (%d live processes)",
                    vcuda_config.ledger[0] ? vcuda_config.ledger : "(private)", VCUDA_LEDGER_MAX_PROCS);
        rc = CUDA_ERROR_OPERATING_SYSTEM;
        goto fail;
    }
    atomic_store_explicit(&proc_ready, 1, memory_order_release);
    goto out;
fail:
    proc_status = rc;
out:
    pthread_mutex_unlock(&proc_lock);
    return rc;
}

CUresult vcuda_process_ready(void) {
    if (atomic_load_explicit(&proc_ready, memory_order_acquire)) return CUDA_SUCCESS;
    return attach_slow();
}

static void format_uuid(const CUuuid *u, char *out, size_t len) {
    const unsigned char *b = (const unsigned char *)u->bytes;
    snprintf(out, len,
             "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
             b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

static int name_device(CUdevice ordinal, CUresult *rc) {
    CUuuid uuid;
    memset(&uuid, 0, sizeof uuid);
    if (vcuda_real.cuDeviceGetUuid_v2) *rc = vcuda_real.cuDeviceGetUuid_v2(&uuid, ordinal);
    else if (vcuda_real.cuDeviceGetUuid) *rc = vcuda_real.cuDeviceGetUuid(&uuid, ordinal);
    else *rc = CUDA_ERROR_NOT_SUPPORTED;
    if (*rc != CUDA_SUCCESS) return -1;
    char text[VCUDA_LEDGER_UUID_LEN];
    format_uuid(&uuid, text, sizeof text);
    uint64_t limit;
    if (!vcuda_config_device(ordinal, text, &limit, NULL)) {
        /* Refused, not hidden: hiding would renumber every CUdevice-taking
         * entry point of the driver and NVML; refusing its contexts (the only
         * door to running work) and the allocations that name it is enough. */
        vcuda_error("device %d (%s) is not this container's GPU (%s does not name it): refused", ordinal, text,
                    VCUDA_QUOTA_FILE);
        atomic_store(&ordinals[ordinal].refused, 1);
        *rc = CUDA_ERROR_INVALID_DEVICE;
        return -1;
    }
    int index = vcuda_ledger_device(&vcuda_proc.ledger, text);
    if (index < 0) {
        vcuda_error("ledger holds %d devices already; cannot account for %s", VCUDA_MAX_DEVICES, text);
        *rc = CUDA_ERROR_OPERATING_SYSTEM;
        return -1;
    }
    /* The ledger's limit is the container's: this process's quota (the file's
     * or VCUDA_MEMORY_LIMIT) sets it unless the device plugin pinned one (a
     * live quota change). */
    struct vcuda_ledger_device *d = &vcuda_proc.ledger.file->devices[index];
    if (!atomic_load(&d->limit_pinned)) atomic_store(&d->limit, limit);
    memcpy(ordinals[ordinal].uuid, text, sizeof text);
    atomic_store_explicit(&ordinals[ordinal].index_plus_one, index + 1, memory_order_release);
    return index;
}

int vcuda_device_index(CUdevice ordinal, uint64_t *limit, CUresult *rc) {
    if (ordinal < 0 || ordinal >= VCUDA_MAX_DEVICES) {
        *rc = CUDA_ERROR_INVALID_DEVICE;
        return -1;
    }
    int index = atomic_load_explicit(&ordinals[ordinal].index_plus_one, memory_order_acquire) - 1;
    if (index < 0) {
        pthread_mutex_lock(&proc_lock);
        index = atomic_load(&ordinals[ordinal].index_plus_one) - 1;
        if (index < 0 && atomic_load(&ordinals[ordinal].refused)) *rc = CUDA_ERROR_INVALID_DEVICE;
        else if (index < 0) index = name_device(ordinal, rc);
        pthread_mutex_unlock(&proc_lock);
        if (index < 0) return -1;
    }
    /* Read at every allocation, so a limit changed in the ledger applies at once. */
    *limit = atomic_load_explicit(&vcuda_proc.ledger.file->devices[index].limit, memory_order_relaxed);
    *rc = CUDA_SUCCESS;
    return index;
}

CUresult vcuda_device_admit(CUdevice ordinal) {
    if (!vcuda_config.from_file) return CUDA_SUCCESS;
    CUresult rc = vcuda_process_ready();
    if (rc != CUDA_SUCCESS) return rc;
    uint64_t limit;
    return vcuda_device_index(ordinal, &limit, &rc) < 0 ? rc : CUDA_SUCCESS;
}

const char *vcuda_device_uuid(CUdevice ordinal) {
    if (ordinal < 0 || ordinal >= VCUDA_MAX_DEVICES) return NULL;
    if (atomic_load_explicit(&ordinals[ordinal].index_plus_one, memory_order_acquire) == 0) return NULL;
    return ordinals[ordinal].uuid;
}

CUresult vcuda_current_device(CUcontext *ctx, CUdevice *ordinal) {
    CUresult rc = vcuda_real.cuCtxGetCurrent(ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (*ctx == NULL) return CUDA_ERROR_INVALID_CONTEXT;
    if (vcuda_context_lookup(*ctx, ordinal)) return CUDA_SUCCESS;
    return vcuda_real.cuCtxGetDevice(ordinal);
}

CUresult vcuda_stream_device(CUstream stream, CUcontext *ctx, CUdevice *ordinal) {
    /* The NULL, legacy and per-thread streams belong to the current context. */
    if (stream == NULL || stream == CU_STREAM_LEGACY || stream == CU_STREAM_PER_THREAD ||
        vcuda_real.cuStreamGetCtx == NULL)
        return vcuda_current_device(ctx, ordinal);
    CUresult rc = vcuda_real.cuStreamGetCtx(stream, ctx);
    if (rc != CUDA_SUCCESS) return rc;
    if (vcuda_context_lookup(*ctx, ordinal)) return CUDA_SUCCESS;
    return vcuda_current_device(ctx, ordinal);
}

/* fork: the child owns none of the parent's CUDA state; it takes a slot of its
 * own in the same ledger at its first CUDA call. */
static void after_fork_child(void) {
    pthread_mutex_init(&proc_lock, NULL);
    atomic_store(&proc_ready, 0);
    vcuda_proc.slot = -1;
    vcuda_alloc_reset_after_fork();
    vcuda_context_reset_after_fork();
    vcuda_pools_reset_after_fork();
    vcuda_local_reset_after_fork();
    vcuda_graph_mem_reset_after_fork();
}

/* Process exit: the driver frees everything, so the slot's usage goes back. */
__attribute__((destructor)) static void process_exit(void) {
    if (atomic_load(&proc_ready)) {
        atomic_store(&proc_ready, 0);
        vcuda_ledger_detach(&vcuda_proc.ledger, vcuda_proc.slot);
        vcuda_proc.slot = -1;
        proc_status = CUDA_ERROR_DEINITIALIZED; /* no re-attach while exiting */
    }
}

void vcuda_process_init(void) { pthread_atfork(NULL, NULL, after_fork_child); }
