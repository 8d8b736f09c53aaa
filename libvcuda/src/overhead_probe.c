/* Context overhead from NVML. The device's free memory drops by our
 * context's overhead while it is created, but also by whatever other
 * processes take meanwhile: their allocations, and their own contexts when
 * several containers start at once. The process list before and after tells
 * those apart: a process that was there and grew took its growth, and new
 * processes beside ours are contexts like ours. Where the list cannot be read,
 * the drop alone counts, as the reconciler corrects what it misses. */
#include "overhead_probe.h"

#include "process.h"
#include "real_driver.h"

#define SANITY_MAX (16ull << 30)

/* Reads of the process list and the free memory until a list read before the free memory
 * agrees with one read after it. */
#define PROBE_TRIES 8

void vcuda_probe_clear(struct vcuda_overhead_probe *p) {
    p->free = UINT64_MAX;
    p->nprocs = -1;
    p->settled = false;
}

static bool device_handle(CUdevice ordinal, nvmlDevice_t *dev) {
    const char *uuid = vcuda_device_uuid(ordinal);
    return uuid != NULL && vcuda_nvml_load() == 0 && vcuda_real_nvml.nvmlDeviceGetHandleByUUID &&
           vcuda_real_nvml.nvmlDeviceGetHandleByUUID(uuid, dev) == NVML_SUCCESS;
}

static int process_list(nvmlDevice_t dev, struct vcuda_overhead_probe *p) {
    nvmlProcessInfo_t info[VCUDA_PROBE_PROCS];
    unsigned int n = VCUDA_PROBE_PROCS;
    nvmlReturn_t rc;
    if (vcuda_real_nvml.nvmlDeviceGetComputeRunningProcesses_v3)
        rc = vcuda_real_nvml.nvmlDeviceGetComputeRunningProcesses_v3(dev, &n, info);
    else if (vcuda_real_nvml.nvmlDeviceGetComputeRunningProcesses_v2)
        rc = vcuda_real_nvml.nvmlDeviceGetComputeRunningProcesses_v2(dev, &n, info);
    else
        return -1;
    if (rc != NVML_SUCCESS || n > VCUDA_PROBE_PROCS) return -1;
    for (unsigned int i = 0; i < n; i++) {
        p->pid[i] = info[i].pid;
        p->used[i] = info[i].usedGpuMemory;
    }
    return (int)n;
}

static int find(const struct vcuda_overhead_probe *p, unsigned pid) {
    for (int i = 0; i < p->nprocs; i++)
        if (p->pid[i] == pid) return i;
    return -1;
}

/* The same processes holding the same memory (in any order). */
static bool same_list(const struct vcuda_overhead_probe *a, const struct vcuda_overhead_probe *b) {
    if (a->nprocs != b->nprocs) return false;
    for (int i = 0; i < a->nprocs; i++) {
        int j = find(b, a->pid[i]);
        if (j < 0 || b->used[j] != a->used[i]) return false;
    }
    return true;
}

void vcuda_probe_take(CUdevice ordinal, struct vcuda_overhead_probe *p) {
    vcuda_probe_clear(p);
    nvmlDevice_t dev;
    nvmlMemory_t mem;
    if (!device_handle(ordinal, &dev) || !vcuda_real_nvml.nvmlDeviceGetMemoryInfo) return;
    /* The free memory between two reads of the list that agree. A process that took memory
     * between a list and the free memory would be in the one and not in the other: after our
     * creation, its context taken for ours (both charged to us, and recorded for every later
     * process of the container); before it, left out of the drop but counted new. The list
     * first when they never agree: a process that comes after it is then counted new after,
     * rather than its context taken for ours. */
    struct vcuda_overhead_probe again;
    for (int tries = 0; tries < PROBE_TRIES; tries++) {
        int n = process_list(dev, p);
        if (vcuda_real_nvml.nvmlDeviceGetMemoryInfo(dev, &mem) != NVML_SUCCESS) {
            vcuda_probe_clear(p);
            return;
        }
        p->free = mem.free;
        p->nprocs = n;
        again.nprocs = process_list(dev, &again);
        if (n < 0 || same_list(p, &again)) {
            p->settled = true;
            return;
        }
    }
}

/* What the processes other than the new ones took meanwhile (negative: gave
 * back), or false when NVML hides a figure that matters. */
static bool others_delta(const struct vcuda_overhead_probe *before,
                         const struct vcuda_overhead_probe *after, int64_t *delta, int *fresh) {
    *delta = 0;
    *fresh = 0;
    for (int i = 0; i < after->nprocs; i++) {
        int j = find(before, after->pid[i]);
        if (j < 0) {
            (*fresh)++;
            continue;
        }
        if (after->used[i] == NVML_VALUE_NOT_AVAILABLE || before->used[j] == NVML_VALUE_NOT_AVAILABLE)
            return false;
        *delta += (int64_t)after->used[i] - (int64_t)before->used[j];
    }
    for (int j = 0; j < before->nprocs; j++) { /* gone: all it held is free again */
        if (find(after, before->pid[j]) >= 0) continue;
        if (before->used[j] == NVML_VALUE_NOT_AVAILABLE) return false;
        *delta -= (int64_t)before->used[j];
    }
    return true;
}

bool vcuda_probe_overhead(const struct vcuda_overhead_probe *before,
                          const struct vcuda_overhead_probe *after, uint64_t *bytes, bool *exact) {
    *exact = true;
    if (before->free == UINT64_MAX || after->free == UINT64_MAX || after->free >= before->free ||
        before->free - after->free > SANITY_MAX)
        return false;
    int64_t taken = (int64_t)(before->free - after->free);
    int64_t delta;
    int fresh;
    if (before->nprocs < 0 || after->nprocs < 0 || !others_delta(before, after, &delta, &fresh)) {
        *bytes = (uint64_t)taken; /* no list: the drop alone */
        return true;
    }
    /* No new process at all: ours was listed before (an earlier context) or
     * NVML lists nobody here; the others' change is then ours too. */
    if (fresh > 0) taken -= delta;
    if (fresh > 1) {
        taken /= fresh;
        *exact = false;
    }
    if (!before->settled || !after->settled) *exact = false; /* others kept changing: not for later */
    if (taken <= 0 || (uint64_t)taken > SANITY_MAX) return false;
    *bytes = (uint64_t)taken;
    return true;
}
