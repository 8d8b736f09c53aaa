/* The NVML side (libvcuda-sim-nvml.so): the same shared state, seen as
 * nvidia-smi sees a GPU. Device-wide, physical view: CUDA_VISIBLE_DEVICES is
 * ignored, as by the real NVML. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include <vcuda/nvml_abi.h>

#include "sim.h"

#define NVML_EXPORT __attribute__((visibility("default")))
#define NVML_NO_INSTANCE 0xFFFFFFFFu /* gpuInstanceId/computeInstanceId without MIG */

#define SIM_NVML_API(X)                                                                        \
    X(nvmlInit, (void))                                                                        \
    X(nvmlInit_v2, (void))                                                                     \
    X(nvmlInitWithFlags, (unsigned int flags))                                                 \
    X(nvmlShutdown, (void))                                                                    \
    X(nvmlSystemGetDriverVersion, (char *version, unsigned int length))                        \
    X(nvmlSystemGetCudaDriverVersion, (int *cudaDriverVersion))                                \
    X(nvmlSystemGetCudaDriverVersion_v2, (int *cudaDriverVersion))                             \
    X(nvmlDeviceGetCount, (unsigned int *deviceCount))                                         \
    X(nvmlDeviceGetCount_v2, (unsigned int *deviceCount))                                      \
    X(nvmlDeviceGetHandleByIndex, (unsigned int index, nvmlDevice_t *device))                  \
    X(nvmlDeviceGetHandleByIndex_v2, (unsigned int index, nvmlDevice_t *device))               \
    X(nvmlDeviceGetHandleByUUID, (const char *uuid, nvmlDevice_t *device))                     \
    X(nvmlDeviceGetUUID, (nvmlDevice_t device, char *uuid, unsigned int length))               \
    X(nvmlDeviceGetName, (nvmlDevice_t device, char *name, unsigned int length))               \
    X(nvmlDeviceGetIndex, (nvmlDevice_t device, unsigned int *index))                          \
    X(nvmlDeviceGetMinorNumber, (nvmlDevice_t device, unsigned int *minorNumber))              \
    X(nvmlDeviceGetMemoryInfo, (nvmlDevice_t device, nvmlMemory_t *memory))                    \
    X(nvmlDeviceGetMemoryInfo_v2, (nvmlDevice_t device, nvmlMemory_v2_t *memory))              \
    X(nvmlDeviceGetUtilizationRates, (nvmlDevice_t device, nvmlUtilization_t *utilization))    \
    X(nvmlDeviceGetComputeRunningProcesses,                                                    \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_v1_t *infos))             \
    X(nvmlDeviceGetComputeRunningProcesses_v2,                                                 \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))                \
    X(nvmlDeviceGetComputeRunningProcesses_v3,                                                 \
      (nvmlDevice_t device, unsigned int *infoCount, nvmlProcessInfo_t *infos))                \
    X(nvmlDeviceGetTemperature,                                                                \
      (nvmlDevice_t device, nvmlTemperatureSensors_t sensorType, unsigned int *temp))          \
    X(nvmlDeviceGetPowerUsage, (nvmlDevice_t device, unsigned int *power))

#define NVML_DECLARE(name, params) NVML_EXPORT nvmlReturn_t name params;
SIM_NVML_API(NVML_DECLARE)
#undef NVML_DECLARE
NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result);

static pthread_mutex_t nmu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_shared *nsh;
static unsigned init_count;

struct nvml_device {
    uint32_t magic;
    unsigned index;
};
#define NVML_DEV_MAGIC 0x4e564d4cu
static struct nvml_device devices[SIM_MAX_DEVICES];

NVML_EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags)
{
    (void)flags;
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&nmu);
    if (!nsh) {
        char path[4096], err[1024];
        nsh = sim_state_open(sim_state_path(path, sizeof path), true, err, sizeof err);
        if (!nsh) {
            fprintf(stderr, "vcuda-sim (nvml): %s\n", err);
            rc = NVML_ERROR_DRIVER_NOT_LOADED;
        } else {
            for (unsigned i = 0; i < SIM_MAX_DEVICES; i++)
                devices[i] = (struct nvml_device){NVML_DEV_MAGIC, i};
        }
    }
    if (rc == NVML_SUCCESS)
        init_count++;
    pthread_mutex_unlock(&nmu);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }
NVML_EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

NVML_EXPORT nvmlReturn_t nvmlShutdown(void)
{
    nvmlReturn_t rc = NVML_SUCCESS;
    pthread_mutex_lock(&nmu);
    if (!init_count)
        rc = NVML_ERROR_UNINITIALIZED;
    else if (--init_count == 0) {
        sim_state_close(nsh);
        nsh = NULL;
    }
    pthread_mutex_unlock(&nmu);
    return rc;
}

NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result)
{
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

/* The state pointer, or NULL before nvmlInit. */
static struct sim_shared *state(void)
{
    return __atomic_load_n(&nsh, __ATOMIC_ACQUIRE);
}

static nvmlReturn_t device_of(nvmlDevice_t h, struct sim_shared **sh, unsigned *index)
{
    const struct nvml_device *d = (const struct nvml_device *)h;
    if (!(*sh = state()))
        return NVML_ERROR_UNINITIALIZED;
    if (!d || d < devices || d >= devices + SIM_MAX_DEVICES || d->magic != NVML_DEV_MAGIC ||
        d->index >= (*sh)->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *index = d->index;
    return NVML_SUCCESS;
}

static nvmlReturn_t copy_string(const char *s, char *out, unsigned int length)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(s) + 1 > length)
        return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, s, strlen(s) + 1);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length)
{
    if (!state())
        return NVML_ERROR_UNINITIALIZED;
    return copy_string("580.65.06", version, length); /* a driver that ships CUDA 13.0 */
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *cudaDriverVersion)
{
    struct sim_shared *sh = state();
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    if (!cudaDriverVersion)
        return NVML_ERROR_INVALID_ARGUMENT;
    *cudaDriverVersion = sh->driver_version;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *cudaDriverVersion)
{
    return nvmlSystemGetCudaDriverVersion(cudaDriverVersion);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *deviceCount)
{
    struct sim_shared *sh = state();
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    if (!deviceCount)
        return NVML_ERROR_INVALID_ARGUMENT;
    *deviceCount = sh->ndev;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *deviceCount)
{
    return nvmlDeviceGetCount_v2(deviceCount);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device)
{
    struct sim_shared *sh = state();
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= sh->ndev)
        return NVML_ERROR_INVALID_ARGUMENT;
    *device = (nvmlDevice_t)&devices[index];
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device)
{
    struct sim_shared *sh = state();
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < sh->ndev; i++) {
        if (strcmp(sh->dev[i].uuid, uuid) == 0) {
            *device = (nvmlDevice_t)&devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    return rc ? rc : copy_string(sh->dev[i].uuid, uuid, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    return rc ? rc : copy_string(sh->dev[i].name, name, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t device, unsigned int *index)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS && !index)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *index = i;
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t device, unsigned int *minorNumber)
{
    return nvmlDeviceGetIndex(device, minorNumber); /* /dev/nvidia<i> */
}

static nvmlReturn_t memory(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    sim_reap_dead(sh);
    *total = sh->dev[i].capacity;
    *used = sim_device_used(sh, i);
    sim_unlock(sh);
    if (*used > *total)
        *used = *total;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *m)
{
    uint64_t total, used;
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = memory(device, &total, &used);
    if (rc == NVML_SUCCESS)
        *m = (nvmlMemory_t){.total = total, .free = total - used, .used = used};
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t device, nvmlMemory_v2_t *m)
{
    uint64_t total, used;
    if (!m)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (m->version != nvmlMemory_v2)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = memory(device, &total, &used);
    if (rc == NVML_SUCCESS)
        *m = (nvmlMemory_v2_t){.version = nvmlMemory_v2, .total = total, .reserved = 0,
                               .free = total - used, .used = used};
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device,
                                                       nvmlUtilization_t *utilization)
{
    struct sim_shared *sh;
    unsigned i;
    if (!utilization)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    uint64_t busy = sim_utilization_window(sh, i, sim_now_ns(), 1000000000ull);
    sim_unlock(sh);
    unsigned pct = (unsigned)((busy + 5000000ull) / 10000000ull); /* of 1 s, rounded */
    utilization->gpu = pct > 100 ? 100 : pct;
    utilization->memory = utilization->gpu / 2; /* plausible: kernels touch memory */
    return NVML_SUCCESS;
}

/* Fills up to *count entries with the processes holding a context or memory
 * on the device; NVML's sizing protocol: too small -> INSUFFICIENT_SIZE and
 * the needed count. */
static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, bool v1)
{
    struct sim_shared *sh;
    unsigned i;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = 0;
    sim_lock(sh);
    sim_reap_dead(sh);
    for (uint32_t k = 0; k < sh->nproc_hw; k++) {
        const struct sim_proc *p = &sh->proc[k];
        if (!p->pid || (!p->used[i] && !p->contexts[i]))
            continue;
        if (n < *count && infos) {
            if (v1)
                ((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){
                    .pid = (unsigned)p->pid, .usedGpuMemory = p->used[i]};
            else
                ((nvmlProcessInfo_t *)infos)[n] = (nvmlProcessInfo_t){
                    .pid = (unsigned)p->pid, .usedGpuMemory = p->used[i],
                    .gpuInstanceId = NVML_NO_INSTANCE, .computeInstanceId = NVML_NO_INSTANCE};
        }
        n++;
    }
    sim_unlock(sh);
    rc = n > *count || (n && !infos) ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    *count = n;
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device,
                                                              unsigned int *infoCount,
                                                              nvmlProcessInfo_v1_t *infos)
{
    return running(device, infoCount, infos, true);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, false);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                                 unsigned int *infoCount,
                                                                 nvmlProcessInfo_t *infos)
{
    return running(device, infoCount, infos, false);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device,
                                                  nvmlTemperatureSensors_t sensorType,
                                                  unsigned int *temp)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS && (!temp || sensorType != NVML_TEMPERATURE_GPU))
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *temp = 42;
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS && !power)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *power = 75000; /* milliwatts */
    return rc;
}
