/* NVML hooks: nvmlDeviceGetMemoryInfo(_v2) report the container's quota view,
 * so nvidia-smi and monitoring inside the container show the limit and the
 * container's own usage rather than the whole card. */
#include <string.h>

#include "config.h"
#include "hooks.h"
#include "ledger.h"
#include "log.h"
#include "process.h"
#include "real_driver.h"

/* The limit this process applies to an NVML device (false: not this
 * container's GPU, shown as the driver shows it). NVML numbers devices
 * physically; with CUDA_VISIBLE_DEVICES unset that equals the CUDA ordinal
 * VCUDA_MEMORY_LIMIT_<i> refers to, otherwise the all-devices limit applies.
 * The quota file names GPUs by UUID. */
static bool limit_for(nvmlDevice_t device, const char *uuid, uint64_t *limit) {
    unsigned int index = 0;
    if (!vcuda_config.cuda_visible_devices_set && vcuda_real_nvml.nvmlDeviceGetIndex &&
        vcuda_real_nvml.nvmlDeviceGetIndex(device, &index) == NVML_SUCCESS && index < VCUDA_MAX_DEVICES)
        return vcuda_config_device((int)index, uuid, limit, NULL);
    return vcuda_config_device(0, uuid, limit, NULL);
}

/* Ledger device for an NVML device, creating its record when this process is
 * the first of the container to look at it. -1 when it cannot be named or is
 * not this container's. */
static int ledger_device_for(nvmlDevice_t device, uint64_t *limit) {
    char uuid[NVML_DEVICE_UUID_V2_BUFFER_SIZE];
    if (!vcuda_real_nvml.nvmlDeviceGetUUID ||
        vcuda_real_nvml.nvmlDeviceGetUUID(device, uuid, sizeof uuid) != NVML_SUCCESS)
        return -1;
    if (!limit_for(device, uuid, limit)) return -1;
    int dev = vcuda_ledger_find_device(&vcuda_proc.ledger, uuid);
    if (dev < 0) {
        dev = vcuda_ledger_device(&vcuda_proc.ledger, uuid);
        if (dev >= 0) atomic_store(&vcuda_proc.ledger.file->devices[dev].limit, *limit);
    }
    return dev;
}

/* nvidia-smi need not touch CUDA: attach the ledger without the driver. */
static nvmlReturn_t view(nvmlDevice_t device, unsigned long long *free_bytes,
                         unsigned long long *total_bytes, unsigned long long *used_bytes) {
    if (vcuda_config.disabled) return NVML_SUCCESS;
    if (vcuda_config.error[0]) {
        vcuda_error("%s", vcuda_config.error);
        return NVML_ERROR_UNKNOWN;
    }
    if (vcuda_process_ready() != CUDA_SUCCESS) return NVML_SUCCESS; /* no driver: the real view */
    uint64_t limit;
    int dev = ledger_device_for(device, &limit);
    if (dev < 0 || limit == VCUDA_UNLIMITED) return NVML_SUCCESS;
    uint64_t f = *free_bytes, t = *total_bytes;
    vcuda_quota_view(dev, limit, &f, &t);
    *free_bytes = f;
    *total_bytes = t;
    *used_bytes = t - f;
    return NVML_SUCCESS;
}

nvmlReturn_t vc_nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    vcuda_nvml_load();
    if (!vcuda_real_nvml.nvmlDeviceGetMemoryInfo) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = vcuda_real_nvml.nvmlDeviceGetMemoryInfo(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    return view(device, &memory->free, &memory->total, &memory->used);
}

nvmlReturn_t vc_nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *memory) {
    vcuda_nvml_load();
    if (!vcuda_real_nvml.nvmlDeviceGetMemoryInfo_v2) return NVML_ERROR_FUNCTION_NOT_FOUND;
    nvmlReturn_t rc = vcuda_real_nvml.nvmlDeviceGetMemoryInfo_v2(device, memory);
    if (rc != NVML_SUCCESS || memory == NULL) return rc;
    nvmlReturn_t vr = view(device, &memory->free, &memory->total, &memory->used);
    if (vr == NVML_SUCCESS && !vcuda_config.disabled) memory->reserved = 0;
    return vr;
}
