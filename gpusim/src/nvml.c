/* The NVML side (libvcuda-sim-nvml.so): the same shared state, seen as
 * nvidia-smi sees a GPU. Device-wide, physical view: CUDA_VISIBLE_DEVICES is
 * ignored, as by the real NVML. MIG calls are in nvml_mig.c; the device
 * queries here also take MIG device handles (uuid, name, memory, processes). */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "nvml_mig_abi.h"
#include "nvml_topo_abi.h"

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
    X(nvmlDeviceGetPowerUsage, (nvmlDevice_t device, unsigned int *power))                     \
    /* topology (topology section below) */                                                    \
    X(nvmlDeviceGetPciInfo_v3, (nvmlDevice_t device, nvmlPciInfo_t *pci))                      \
    X(nvmlDeviceGetHandleByPciBusId, (const char *pciBusId, nvmlDevice_t *device))             \
    X(nvmlDeviceGetHandleByPciBusId_v2, (const char *pciBusId, nvmlDevice_t *device))          \
    X(nvmlDeviceGetNumaNodeId, (nvmlDevice_t device, unsigned int *node))                      \
    X(nvmlDeviceGetCpuAffinity,                                                                \
      (nvmlDevice_t device, unsigned int cpuSetSize, unsigned long *cpuSet))                   \
    X(nvmlDeviceGetNvLinkState,                                                                \
      (nvmlDevice_t device, unsigned int link, nvmlEnableState_t *isActive))                   \
    X(nvmlDeviceGetNvLinkRemotePciInfo_v2,                                                     \
      (nvmlDevice_t device, unsigned int link, nvmlPciInfo_t *pci))                            \
    X(nvmlDeviceGetNvLinkRemoteDeviceType,                                                     \
      (nvmlDevice_t device, unsigned int link, nvmlIntNvLinkDeviceType_t *pNvLinkDeviceType))  \
    X(nvmlDeviceGetTopologyCommonAncestor,                                                     \
      (nvmlDevice_t device1, nvmlDevice_t device2, nvmlGpuTopologyLevel_t *pathInfo))          \
    /* events (events section below) */                                                        \
    X(nvmlEventSetCreate, (nvmlEventSet_t *set))                                               \
    X(nvmlEventSetFree, (nvmlEventSet_t set))                                                  \
    X(nvmlDeviceGetSupportedEventTypes, (nvmlDevice_t device, unsigned long long *eventTypes)) \
    X(nvmlDeviceRegisterEvents,                                                                \
      (nvmlDevice_t device, unsigned long long eventTypes, nvmlEventSet_t set))                \
    X(nvmlEventSetWait, (nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms))   \
    X(nvmlEventSetWait_v2, (nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeoutms))

#define NVML_DECLARE(name, params) NVML_EXPORT nvmlReturn_t name params;
SIM_NVML_API(NVML_DECLARE)
#undef NVML_DECLARE
NVML_EXPORT const char *nvmlErrorString(nvmlReturn_t result);

static pthread_mutex_t nmu = PTHREAD_MUTEX_INITIALIZER;
static struct sim_shared *nsh;
static unsigned init_count;
/* VCUDA_SIM_NVML_MEMINFO_US at nvmlInit: how long nvmlDeviceGetMemoryInfo takes before it reads
 * (tests put another process's work between a process's NVML reads). */
static uint64_t meminfo_ns;

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
    if (!nsh && sim_check_pid_namespace("vcuda-sim (nvml)") != 0) {
        rc = NVML_ERROR_NOT_SUPPORTED;
    } else if (!nsh) {
        char path[4096], err[1024];
        const char *delay = getenv("VCUDA_SIM_NVML_MEMINFO_US");
        char *end = NULL;
        unsigned long long delay_us = delay && *delay ? strtoull(delay, &end, 10) : 0;
        if ((end && *end) || delay_us > 10000000) {
            fprintf(stderr, "vcuda-sim (nvml): VCUDA_SIM_NVML_MEMINFO_US must be 0..10000000, not %s\n", delay);
            pthread_mutex_unlock(&nmu);
            return NVML_ERROR_INVALID_ARGUMENT;
        }
        meminfo_ns = delay_us * 1000;
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

/* The device behind a handle. Every query on a device goes through here, so
 * a device marked lost (vcudasim_set_lost) fails them all, as a GPU that fell
 * off the bus does; handles themselves stay valid. */
static nvmlReturn_t device_of(nvmlDevice_t h, struct sim_shared **sh, unsigned *index)
{
    const struct nvml_device *d = (const struct nvml_device *)h;
    if (!(*sh = state()))
        return NVML_ERROR_UNINITIALIZED;
    if (!d || d < devices || d >= devices + SIM_MAX_DEVICES || d->magic != NVML_DEV_MAGIC ||
        d->index >= (*sh)->ndev) {
        unsigned phys; /* a MIG device handle: as NVML, most GPU queries do not apply */
        return sim_nvml_mig_device(h, sh, &phys) == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED
                                                                 : NVML_ERROR_INVALID_ARGUMENT;
    }
    if (__atomic_load_n(&(*sh)->dev[d->index].lost, __ATOMIC_ACQUIRE))
        return NVML_ERROR_GPU_IS_LOST;
    *index = d->index;
    return NVML_SUCCESS;
}

struct sim_shared *sim_nvml_state(void)
{
    return state();
}

nvmlReturn_t sim_nvml_gpu(nvmlDevice_t h, struct sim_shared **sh, unsigned *index)
{
    return device_of(h, sh, index);
}

nvmlDevice_t sim_nvml_gpu_handle(unsigned index)
{
    return (nvmlDevice_t)&devices[index];
}

/* A GPU or a MIG device handle: the simulated device it names. */
static nvmlReturn_t target_of(nvmlDevice_t h, struct sim_shared **sh, unsigned *phys)
{
    nvmlReturn_t rc = sim_nvml_mig_device(h, sh, phys);
    return rc == NVML_ERROR_NOT_FOUND ? device_of(h, sh, phys) : rc;
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
    return sim_nvml_mig_by_uuid(uuid, device);
}

/* Copies a device's uuid or name under the lock (a MIG device's may change). */
static nvmlReturn_t copy_field(nvmlDevice_t device, bool uuid, char *out, unsigned int length)
{
    struct sim_shared *sh;
    unsigned i;
    char buf[SIM_STR];
    nvmlReturn_t rc = target_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    memcpy(buf, uuid ? sh->dev[i].uuid : sh->dev[i].name, sizeof buf);
    sim_unlock(sh);
    buf[SIM_STR - 1] = '\0';
    return copy_string(buf, out, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length)
{
    return copy_field(device, true, uuid, length);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length)
{
    return copy_field(device, false, name, length);
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

/* The simulated devices a handle covers: a MIG device; a GPU and, in MIG
 * mode, all its MIG devices. Caller holds the shared lock. */
static unsigned covered(const struct sim_shared *sh, unsigned phys, unsigned *out)
{
    out[0] = phys;
    if (phys >= SIM_MAX_DEVICES)
        return 1;
    return 1 + sim_mig_devices(sh, phys, out + 1);
}

static nvmlReturn_t memory(nvmlDevice_t device, uint64_t *total, uint64_t *used)
{
    if (meminfo_ns)
        sim_sleep_until(sim_now_ns() + meminfo_ns, 0);
    struct sim_shared *sh;
    unsigned i, phys[1 + SIM_MIG_MAX];
    nvmlReturn_t rc = target_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    sim_reap_dead(sh);
    *total = sh->dev[i].capacity;
    *used = 0;
    for (unsigned n = covered(sh, i, phys), k = 0; k < n; k++)
        *used += sim_device_used(sh, phys[k]);
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
    if (__atomic_load_n(&sh->mig[i].mode, __ATOMIC_ACQUIRE))
        return NVML_ERROR_NOT_SUPPORTED; /* as NVML: no GPU-wide utilization in MIG mode */
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
 * the needed count. Each process appears under its host pid (as NVML sees
 * processes from the host's pid namespace) with all the device memory it
 * holds: allocations, contexts, pool reserves, local memory, module code,
 * graph memory. A GPU in MIG mode lists the processes of all its MIG devices,
 * each with its instance ids. */
static nvmlReturn_t running(nvmlDevice_t device, unsigned int *count, void *infos, bool v1)
{
    struct sim_shared *sh;
    unsigned i, phys[1 + SIM_MIG_MAX];
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = target_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = 0;
    sim_lock(sh);
    sim_reap_dead(sh);
    unsigned ndevs = covered(sh, i, phys);
    for (unsigned d = 0; d < ndevs; d++) {
        unsigned at = phys[d], gi = NVML_NO_INSTANCE, ci = NVML_NO_INSTANCE;
        sim_nvml_mig_ids(at, &gi, &ci);
        for (uint32_t k = 0; k < sh->nproc_hw; k++) {
            const struct sim_proc *p = &sh->proc[k];
            if (!p->pid || (!p->used[at] && !p->contexts[at]))
                continue;
            if (n < *count && infos) {
                if (v1)
                    ((nvmlProcessInfo_v1_t *)infos)[n] = (nvmlProcessInfo_v1_t){
                        .pid = (unsigned)p->host_pid, .usedGpuMemory = p->used[at]};
                else
                    ((nvmlProcessInfo_t *)infos)[n] = (nvmlProcessInfo_t){
                        .pid = (unsigned)p->host_pid, .usedGpuMemory = p->used[at],
                        .gpuInstanceId = gi, .computeInstanceId = ci};
            }
            n++;
        }
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

/* ---- topology: PCI addresses, NUMA, NVLink ----
 * Device i sits at PCI 0000:(0x10 + i):00.0, as cuDeviceGetPCIBusId says.
 * With NVLink peers (VCUDA_SIM_NVLINK) a device has NVML_NVLINK_MAX_LINKS
 * links; link k leads to its k-th peer in index order, the rest are down.
 * On an NVSwitch fabric every link is up and leads to switch k % 4, at PCI
 * 0000:(0xC0 + k % 4):00.0. */

#define SIM_SWITCH_BUS 0xC0

static void pci_at(unsigned bus, unsigned device_id, nvmlPciInfo_t *pci)
{
    memset(pci, 0, sizeof *pci);
    pci->domain = 0;
    pci->bus = bus & 0xff;
    pci->device = 0;
    pci->pciDeviceId = device_id << 16 | 0x10DEu; /* NVIDIA's vendor id */
    pci->pciSubSystemId = 0x16C110DEu;
    bus &= 0xff;
    snprintf(pci->busIdLegacy, sizeof pci->busIdLegacy, "0000:%02X:00.0", bus);
    snprintf(pci->busId, sizeof pci->busId, "00000000:%02X:00.0", bus);
}

static void pci_of(unsigned i, nvmlPciInfo_t *pci)
{
    pci_at(0x10 + i, 0x2330, pci); /* an H100's device id */
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t device, nvmlPciInfo_t *pci)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS && !pci)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        pci_of(i, pci);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pciBusId,
                                                          nvmlDevice_t *device)
{
    struct sim_shared *sh = state();
    unsigned domain, bus, dev, fn;
    char tail;
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    if (!pciBusId || !device ||
        sscanf(pciBusId, "%x:%x:%x.%x%c", &domain, &bus, &dev, &fn, &tail) != 4)
        return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < sh->ndev; i++) {
        if (domain == 0 && bus == 0x10 + i && dev == 0 && fn == 0) {
            if (__atomic_load_n(&sh->dev[i].lost, __ATOMIC_ACQUIRE))
                return NVML_ERROR_GPU_IS_LOST;
            *device = (nvmlDevice_t)&devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pciBusId, nvmlDevice_t *device)
{
    return nvmlDeviceGetHandleByPciBusId_v2(pciBusId, device);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNumaNodeId(nvmlDevice_t device, unsigned int *node)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!node)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sh->dev[i].numa_node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    *node = (unsigned)sh->dev[i].numa_node;
    return NVML_SUCCESS;
}

/* The simulated NUMA nodes split this machine's CPUs into equal consecutive
 * ranges (node n of N gets CPUs [n*C/N, (n+1)*C/N)), so affinity masks are
 * plausible and disjoint between nodes. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetCpuAffinity(nvmlDevice_t device, unsigned int cpuSetSize,
                                                  unsigned long *cpuSet)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!cpuSet || cpuSetSize == 0)
        return NVML_ERROR_INVALID_ARGUMENT;
    int32_t node = sh->dev[i].numa_node, nodes = 0;
    if (node < 0)
        return NVML_ERROR_NOT_SUPPORTED;
    for (unsigned k = 0; k < sh->ndev; k++)
        if (sh->dev[k].numa_node >= nodes)
            nodes = sh->dev[k].numa_node + 1;
    long ncpu = sysconf(_SC_NPROCESSORS_CONF);
    if (ncpu < 1)
        ncpu = 1;
    unsigned long lo = (unsigned long)node * (unsigned long)ncpu / (unsigned long)nodes;
    unsigned long hi = ((unsigned long)node + 1) * (unsigned long)ncpu / (unsigned long)nodes;
    if (hi == lo) /* more nodes than CPUs: share one */
        hi = (lo = (unsigned long)node % (unsigned long)ncpu) + 1;
    const unsigned long bits = 8 * sizeof(unsigned long);
    memset(cpuSet, 0, cpuSetSize * sizeof *cpuSet);
    for (unsigned long c = lo; c < hi && c < cpuSetSize * bits; c++)
        cpuSet[c / bits] |= 1ul << (c % bits);
    return NVML_SUCCESS;
}

/* What is at the other end of a device's link: a GPU's index, SIM_PEER_SWITCH
 * + the switch number, or -1 when the link is down. NOT_SUPPORTED for a
 * device without NVLink, INVALID_ARGUMENT past the last link. */
#define SIM_PEER_SWITCH 1000
static nvmlReturn_t link_peer(nvmlDevice_t device, unsigned link, int *peer)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    uint32_t peers = sh->dev[i].nvlink_peers;
    if (!peers && !sh->nvswitch)
        return NVML_ERROR_NOT_SUPPORTED;
    if (link >= NVML_NVLINK_MAX_LINKS)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (sh->nvswitch) {
        *peer = link < SIM_SWITCH_LINKS ? SIM_PEER_SWITCH + (int)(link % SIM_NVSWITCHES) : -1;
        return NVML_SUCCESS;
    }
    *peer = -1;
    for (unsigned k = 0, n = 0; k < sh->ndev; k++)
        if (peers & (1u << k) && n++ == link)
            *peer = (int)k;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t device, unsigned int link,
                                                  nvmlEnableState_t *isActive)
{
    int peer;
    if (!isActive)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = link_peer(device, link, &peer);
    if (rc == NVML_SUCCESS)
        *isActive = peer >= 0 ? NVML_FEATURE_ENABLED : NVML_FEATURE_DISABLED;
    return rc;
}

/* The peer at the other end of an active link; NOT_SUPPORTED for a down link
 * (nothing there), INVALID_ARGUMENT when the caller gave no output. */
static nvmlReturn_t remote_end(nvmlDevice_t device, unsigned link, const void *out, int *peer)
{
    if (!out)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = link_peer(device, link, peer);
    return rc == NVML_SUCCESS && *peer < 0 ? NVML_ERROR_NOT_SUPPORTED : rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device,
                                                             unsigned int link,
                                                             nvmlPciInfo_t *pci)
{
    int peer;
    nvmlReturn_t rc = remote_end(device, link, pci, &peer);
    if (rc == NVML_SUCCESS && peer >= SIM_PEER_SWITCH)
        pci_at(SIM_SWITCH_BUS + (unsigned)(peer - SIM_PEER_SWITCH), 0x22A3, pci); /* NVSwitch */
    else if (rc == NVML_SUCCESS)
        pci_of((unsigned)peer, pci);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device,
                                                             unsigned int link,
                                                             nvmlIntNvLinkDeviceType_t *type)
{
    int peer;
    nvmlReturn_t rc = remote_end(device, link, type, &peer);
    if (rc == NVML_SUCCESS)
        *type = peer >= SIM_PEER_SWITCH ? NVML_NVLINK_DEVICE_TYPE_SWITCH
                                        : NVML_NVLINK_DEVICE_TYPE_GPU;
    return rc;
}

/* PCIe path between two GPUs (NVLink is not a PCIe path, as in NVML): the
 * same device is INTERNAL, GPUs on different NUMA nodes meet at SYSTEM
 * (across the CPU interconnect), all others at NODE (one CPU's host bridges). */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetTopologyCommonAncestor(nvmlDevice_t device1,
                                                             nvmlDevice_t device2,
                                                             nvmlGpuTopologyLevel_t *pathInfo)
{
    struct sim_shared *sh;
    unsigned a, b;
    nvmlReturn_t rc = device_of(device1, &sh, &a);
    if (rc == NVML_SUCCESS)
        rc = device_of(device2, &sh, &b);
    if (rc == NVML_SUCCESS && !pathInfo)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    int32_t na = sh->dev[a].numa_node, nb = sh->dev[b].numa_node;
    if (a == b)
        *pathInfo = NVML_TOPOLOGY_INTERNAL;
    else if (na >= 0 && nb >= 0 && na != nb)
        *pathInfo = NVML_TOPOLOGY_SYSTEM;
    else
        *pathInfo = NVML_TOPOLOGY_NODE;
    return NVML_SUCCESS;
}

/* ---- events: XIDs injected through the shared state (events.c) ----
 * An event set is process-local: per device the event types registered and
 * the sequence number of the last XID it delivered. */

#define NVML_EVENT_SET_MAGIC 0x45565354u
#define SIM_SUPPORTED_EVENTS nvmlEventTypeXidCriticalError

struct nvmlEventSet_st {
    uint32_t magic;
    unsigned next; /* device to look at first: no device starves the others */
    unsigned long long types[SIM_MAX_DEVICES];
    uint64_t seen[SIM_MAX_DEVICES];
};

static nvmlReturn_t event_set_of(nvmlEventSet_t set)
{
    if (!state())
        return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != NVML_EVENT_SET_MAGIC)
        return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set)
{
    if (!state())
        return NVML_ERROR_UNINITIALIZED;
    if (!set)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct nvmlEventSet_st *s = calloc(1, sizeof *s);
    if (!s)
        return NVML_ERROR_UNKNOWN;
    s->magic = NVML_EVENT_SET_MAGIC;
    *set = s;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set)
{
    nvmlReturn_t rc = event_set_of(set);
    if (rc == NVML_SUCCESS) {
        set->magic = 0;
        free(set);
    }
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t device,
                                                          unsigned long long *eventTypes)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS && !eventTypes)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *eventTypes = SIM_SUPPORTED_EVENTS;
    return rc;
}

/* Delivers events injected from now on (as NVML: nothing from before). */
NVML_EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t device,
                                                  unsigned long long eventTypes,
                                                  nvmlEventSet_t set)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = device_of(device, &sh, &i);
    if (rc == NVML_SUCCESS)
        rc = event_set_of(set);
    if (rc != NVML_SUCCESS)
        return rc;
    if (eventTypes & ~SIM_SUPPORTED_EVENTS)
        return NVML_ERROR_NOT_SUPPORTED;
    sim_lock(sh);
    if (!(set->types[i] & nvmlEventTypeXidCriticalError))
        set->seen[i] = sh->dev[i].xid_seq;
    set->types[i] |= eventTypes;
    sim_unlock(sh);
    return NVML_SUCCESS;
}

static bool take_event(struct sim_shared *sh, nvmlEventSet_t set, nvmlEventData_t *data,
                       bool legacy)
{
    bool found = false;
    sim_lock(sh);
    for (unsigned k = 0; k < sh->ndev && !found; k++) {
        unsigned d = (set->next + k) % sh->ndev;
        uint64_t xid;
        if (!(set->types[d] & nvmlEventTypeXidCriticalError) ||
            !sim_xid_next(sh, d, &set->seen[d], &xid))
            continue;
        data->device = (nvmlDevice_t)&devices[d];
        data->eventType = nvmlEventTypeXidCriticalError;
        data->eventData = xid;
        if (!legacy)
            data->gpuInstanceId = data->computeInstanceId = NVML_NO_INSTANCE;
        set->next = d + 1;
        found = true;
    }
    sim_unlock(sh);
    return found;
}

/* One event, or NVML_ERROR_TIMEOUT after timeoutms. Sleeps on the shared
 * futex between looks: no CPU is spent while nothing happens. */
static nvmlReturn_t event_wait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned timeoutms,
                               bool legacy)
{
    nvmlReturn_t rc = event_set_of(set);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!data)
        return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_shared *sh = state();
    uint64_t deadline = sim_now_ns() + (uint64_t)timeoutms * 1000000ull;
    for (;;) {
        uint32_t gen = sim_event_gen(sh);
        if (take_event(sh, set, data, legacy))
            return NVML_SUCCESS;
        if (sim_now_ns() >= deadline)
            return NVML_ERROR_TIMEOUT;
        sim_event_sleep(sh, gen, deadline);
    }
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data,
                                             unsigned int timeoutms)
{
    return event_wait(set, data, timeoutms, false);
}

NVML_EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data,
                                          unsigned int timeoutms)
{
    return event_wait(set, data, timeoutms, true);
}
