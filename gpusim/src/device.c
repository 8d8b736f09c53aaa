/* cuInit, devices and CUDA_VISIBLE_DEVICES; the process's attachment to the
 * shared state (attach at cuInit, detach at exit, start over after fork). */
#define _GNU_SOURCE
#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "api.h"
#include "sim.h"

struct sim_local sim = {.mu = PTHREAD_MUTEX_INITIALIZER, .slot = -1};

/* Adds a simulated device to the visible list; false if it is there already. */
static bool add_visible(unsigned phys)
{
    for (int k = 0; k < sim.nvisible; k++)
        if (sim.visible[k] == phys)
            return false;
    if (sim.nvisible < SIM_MAX_PHYS)
        sim.visible[sim.nvisible++] = phys;
    return true;
}

/* A GPU as CUDA sees it: itself, or in MIG mode its MIG devices (a GPU in
 * MIG mode never runs work as a whole). false: nothing to add. */
static bool add_gpu(const struct sim_shared *sh, unsigned i)
{
    unsigned mig[SIM_MIG_MAX];
    if (!sh->mig[i].mode)
        return add_visible(i);
    unsigned n = sim_mig_devices(sh, i, mig);
    for (unsigned k = 0; k < n; k++)
        if (!add_visible(mig[k]))
            return false;
    return n > 0;
}

/* "MIG-<uuid>" (a unique prefix is enough) or the older
 * "MIG-GPU-<uuid>/<gpu instance>/<compute instance>". -1: none. */
static int find_mig(const struct sim_shared *sh, const char *tok, size_t len)
{
    int found = -1;
    if (strncmp(tok, "MIG-GPU-", 8) == 0) {
        const char *slash = strchr(tok, '/');
        unsigned gi, ci;
        char tail;
        if (!slash || sscanf(slash, "/%u/%u%c", &gi, &ci, &tail) != 2)
            return -1;
        for (unsigned d = 0; d < sh->ndev; d++) {
            if (strncmp(sh->dev[d].uuid, tok + 4, (size_t)(slash - tok - 4)) != 0 ||
                sh->dev[d].uuid[slash - tok - 4] != '\0')
                continue;
            for (unsigned k = 0; k < SIM_MIG_MAX; k++) {
                const struct sim_gi *g = &sh->mig[d].gi[k];
                if (sim_phys_valid(sh, SIM_MIG_PHYS(d, k)) && g->id == gi && g->ci_id == ci)
                    return (int)SIM_MIG_PHYS(d, k);
            }
        }
        return -1;
    }
    for (unsigned p = SIM_MAX_DEVICES; p < SIM_MAX_PHYS; p++) {
        if (sim_phys_valid(sh, p) && strncmp(sh->dev[p].uuid, tok, len) == 0) {
            if (found >= 0)
                return -1; /* ambiguous prefix */
            found = (int)p;
        }
    }
    return found;
}

/* CUDA_VISIBLE_DEVICES as the real driver reads it: indices, GPU UUIDs or
 * MIG device UUIDs (a unique prefix is enough), in order; the list ends at
 * the first invalid, unknown or repeated entry. Unset: every device. A GPU
 * in MIG mode stands for its MIG devices (NVIDIA's MIG user guide, "CUDA
 * device enumeration"). */
static void parse_visible(const struct sim_shared *sh)
{
    const char *env = getenv("CUDA_VISIBLE_DEVICES");
    sim.nvisible = 0;
    if (!env) {
        for (unsigned i = 0; i < sh->ndev; i++)
            add_gpu(sh, i);
        return;
    }
    char buf[4096];
    snprintf(buf, sizeof buf, "%s", env);
    char *save = NULL;
    for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
        while (isspace((unsigned char)*tok))
            tok++;
        size_t len = strlen(tok);
        while (len && isspace((unsigned char)tok[len - 1]))
            tok[--len] = '\0';
        int found = -1;
        if (len && isdigit((unsigned char)tok[0])) {
            char *end;
            long idx = strtol(tok, &end, 10);
            if (*end == '\0' && idx >= 0 && idx < (long)sh->ndev)
                found = (int)idx;
        } else if (len > 4 && strncmp(tok, "MIG-", 4) == 0) {
            int p = find_mig(sh, tok, len);
            if (p < 0 || !add_visible((unsigned)p))
                return;
            continue;
        } else if (len) {
            for (unsigned i = 0; i < sh->ndev; i++) {
                if (strncmp(sh->dev[i].uuid, tok, len) == 0) {
                    if (found >= 0) { /* ambiguous prefix */
                        found = -1;
                        break;
                    }
                    found = (int)i;
                }
            }
        }
        if (found < 0 || !add_gpu(sh, (unsigned)found))
            return;
    }
}

/* VCUDA_SIM_HOST_PID_OFFSET: this process pretends to live in a pid
 * namespace whose pid p is host pid p + offset, which is what NVML reports. */
static int host_pid_offset(long *out)
{
    const char *v = getenv("VCUDA_SIM_HOST_PID_OFFSET");
    char *end;
    *out = 0;
    if (!v || !*v)
        return 0;
    errno = 0;
    long off = strtol(v, &end, 10);
    if (errno || *end || off < 0 || off > 1L << 30) {
        fprintf(stderr, "vcuda-sim: VCUDA_SIM_HOST_PID_OFFSET=%s is not a number 0..2^30\n", v);
        return -1;
    }
    *out = off;
    return 0;
}

static CUresult do_init(void)
{
    char path[4096], err[1024];
    long offset;
    if (host_pid_offset(&offset) != 0)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim_check_pid_namespace("vcuda-sim") != 0)
        return CUDA_ERROR_NOT_SUPPORTED;
    const char *loading = getenv("CUDA_MODULE_LOADING");
    sim.eager_modules = loading && strcmp(loading, "EAGER") == 0; /* LAZY is the default */
    const char *spin = getenv("VCUDA_SIM_SPIN_US");
    char *end = NULL;
    unsigned long long spin_us = spin && *spin ? strtoull(spin, &end, 10) : SIM_SPIN_US;
    if ((end && *end) || spin_us > 1000000) {
        fprintf(stderr, "vcuda-sim: VCUDA_SIM_SPIN_US must be 0..1000000, not %s\n", spin);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim.spin_ns = spin_us * 1000;
    const char *create = getenv("VCUDA_SIM_CTX_CREATE_US");
    end = NULL;
    unsigned long long create_us = create && *create ? strtoull(create, &end, 10) : 0;
    if ((end && *end) || create_us > 10000000) {
        fprintf(stderr, "vcuda-sim: VCUDA_SIM_CTX_CREATE_US must be 0..10000000, not %s\n", create);
        return CUDA_ERROR_INVALID_VALUE;
    }
    sim.ctx_create_ns = create_us * 1000;
    sim_state_path(path, sizeof path);
    struct sim_shared *sh = sim_state_open(path, true, err, sizeof err);
    if (!sh) {
        fprintf(stderr, "vcuda-sim: %s\n", err);
        return strstr(err, "configuration") ? CUDA_ERROR_INVALID_VALUE
                                            : CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    }
    sim_lock(sh);
    int slot = sim_proc_attach(sh, getpid());
    if (slot >= 0)
        sh->proc[slot].host_pid = (int32_t)(getpid() + offset);
    sim_unlock(sh);
    if (slot < 0) {
        fprintf(stderr, "vcuda-sim: %s: all %d process slots are in use\n", path, SIM_MAX_PROCS);
        sim_state_close(sh);
        return CUDA_ERROR_OUT_OF_MEMORY;
    }
    sim.sh = sh;
    sim.slot = slot;
    sim.pid = getpid();
    parse_visible(sh);
    return sim.nvisible ? CUDA_SUCCESS : CUDA_ERROR_NO_DEVICE;
}

static void after_fork_child(void)
{
    /* The child owns no contexts or memory on a real driver: start over. */
    pthread_mutex_init(&sim.mu, NULL);
    sim_local_reset();
}

SIM_EXPORT CUresult cuInit(unsigned int Flags)
{
    if (Flags != 0)
        return CUDA_ERROR_INVALID_VALUE;
    pthread_mutex_lock(&sim.mu);
    if (!sim.initialized) {
        static bool atfork_done;
        if (!atfork_done) {
            pthread_atfork(NULL, NULL, after_fork_child);
            atfork_done = true;
        }
        sim.init_err = do_init();
        __atomic_store_n(&sim.initialized, true, __ATOMIC_RELEASE);
    }
    CUresult rc = sim.init_err;
    pthread_mutex_unlock(&sim.mu);
    return rc;
}

/* Returns the memory of a process that exits normally at once, as the
 * driver does, instead of waiting for a reaper to notice it is gone. */
__attribute__((destructor)) static void sim_detach(void)
{
    if (sim.sh && sim.slot >= 0 && sim.pid == getpid()) {
        sim_lock(sim.sh);
        sim_proc_release(sim.sh, sim.slot);
        sim_unlock(sim.sh);
        sim.slot = -1;
    }
}

CUresult sim_check_init(void)
{
    /* initialized/init_err are written once under sim.mu before any caller
     * can have a device handle; reading them unlocked is the driver's contract. */
    if (!__atomic_load_n(&sim.initialized, __ATOMIC_ACQUIRE))
        return CUDA_ERROR_NOT_INITIALIZED;
    return sim.init_err;
}

CUresult sim_ordinal(CUdevice dev, unsigned *phys)
{
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (dev < 0 || dev >= sim.nvisible)
        return CUDA_ERROR_INVALID_DEVICE;
    *phys = sim.visible[dev];
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDriverGetVersion(int *driverVersion)
{
    if (!driverVersion)
        return CUDA_ERROR_INVALID_VALUE;
    if (sim.sh) {
        *driverVersion = sim.sh->driver_version;
        return CUDA_SUCCESS;
    }
    /* Before cuInit: read the file if there is one, else the config. */
    char path[4096], err[1024];
    struct sim_shared *sh = sim_state_open(sim_state_path(path, sizeof path), true, err,
                                           sizeof err);
    if (!sh)
        return CUDA_ERROR_SYSTEM_DRIVER_MISMATCH;
    *driverVersion = sh->driver_version;
    sim_state_close(sh);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGetCount(int *count)
{
    if (!count)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_check_init();
    if (rc == CUDA_ERROR_NO_DEVICE) {
        *count = 0; /* the real driver reports zero devices, successfully */
        return CUDA_SUCCESS;
    }
    if (rc != CUDA_SUCCESS)
        return rc;
    *count = sim.nvisible;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuDeviceGet(CUdevice *device, int ordinal)
{
    unsigned phys;
    if (!device)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(ordinal, &phys);
    if (rc == CUDA_SUCCESS)
        *device = ordinal;
    return rc;
}

SIM_EXPORT CUresult cuDeviceGetName(char *name, int len, CUdevice dev)
{
    unsigned phys;
    if (!name || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc == CUDA_SUCCESS)
        snprintf(name, (size_t)len, "%s", sim.sh->dev[phys].name);
    return rc;
}

/* "GPU-5157a0c0-0000-4000-8000-000000000000" -> 16 bytes; a UUID that is not
 * hex (a custom VCUDA_SIM_UUIDS entry) gets a stable FNV-1a hash instead. */
static void uuid_bytes(const char *s, CUuuid *out)
{
    const char *p = strncmp(s, "GPU-", 4) == 0 || strncmp(s, "MIG-", 4) == 0 ? s + 4 : s;
    int n = 0;
    for (; *p && n < 32; p++) {
        if (*p == '-')
            continue;
        if (!isxdigit((unsigned char)*p))
            break;
        int v = isdigit((unsigned char)*p) ? *p - '0' : tolower((unsigned char)*p) - 'a' + 10;
        if (n % 2 == 0)
            out->bytes[n / 2] = (char)(v << 4);
        else
            out->bytes[n / 2] = (char)(out->bytes[n / 2] | v);
        n++;
    }
    if (n == 32 && *p == '\0')
        return;
    uint64_t h = 1469598103934665603ull;
    for (int round = 0; round < 2; round++) {
        for (const char *q = s; *q; q++)
            h = (h ^ (unsigned char)*q) * 1099511628211ull;
        memcpy(out->bytes + 8 * round, &h, 8);
    }
}

SIM_EXPORT CUresult cuDeviceGetUuid(CUuuid *uuid, CUdevice dev)
{
    unsigned phys;
    if (!uuid)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc == CUDA_SUCCESS)
        uuid_bytes(sim.sh->dev[phys].uuid, uuid);
    return rc;
}

SIM_EXPORT CUresult cuDeviceGetUuid_v2(CUuuid *uuid, CUdevice dev)
{
    return cuDeviceGetUuid(uuid, dev); /* a MIG device's own UUID in both */
}

SIM_EXPORT CUresult cuDeviceTotalMem_v2(size_t *bytes, CUdevice dev)
{
    unsigned phys;
    if (!bytes)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc == CUDA_SUCCESS)
        *bytes = sim.sh->dev[phys].capacity;
    return rc;
}

SIM_EXPORT CUresult cuDeviceGetPCIBusId(char *pciBusId, int len, CUdevice dev)
{
    unsigned phys;
    if (!pciBusId || len <= 0)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc == CUDA_SUCCESS)
        snprintf(pciBusId, (size_t)len, "0000:%02X:00.0", 0x10 + sim_phys_parent(phys));
    return rc;
}

/* A plausible recent GPU (compute capability 9.0); unknown attributes are 0. */
SIM_EXPORT CUresult cuDeviceGetAttribute(int *pi, CUdevice_attribute attrib, CUdevice dev)
{
    unsigned phys;
    if (!pi)
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_ordinal(dev, &phys);
    if (rc != CUDA_SUCCESS)
        return rc;
    switch ((int)attrib) {
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_BLOCK: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_X: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Y: *pi = 1024; break;
    case CU_DEVICE_ATTRIBUTE_MAX_BLOCK_DIM_Z: *pi = 64; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_X: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Y: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_GRID_DIM_Z: *pi = 65535; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK: *pi = 49152; break;
    case CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: *pi = 232448; break;
    case CU_DEVICE_ATTRIBUTE_TOTAL_CONSTANT_MEMORY: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_WARP_SIZE: *pi = 32; break;
    case CU_DEVICE_ATTRIBUTE_MAX_PITCH: *pi = 2147483647; break;
    case CU_DEVICE_ATTRIBUTE_MAX_REGISTERS_PER_BLOCK: *pi = 65536; break;
    case CU_DEVICE_ATTRIBUTE_CLOCK_RATE: *pi = 1755000; break;
    case CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE: *pi = 2619000; break;
    case CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH: *pi = 5120; break;
    case CU_DEVICE_ATTRIBUTE_L2_CACHE_SIZE: *pi = 52428800; break;
    case CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT: *pi = (int)sim.sh->dev[phys].sms; break;
    case CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR: *pi = (int)sim.sh->threads_per_sm; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: *pi = 9; break;
    case CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_PCI_BUS_ID: *pi = 0x10 + (int)sim_phys_parent(phys); break;
    case CU_DEVICE_ATTRIBUTE_PCI_DEVICE_ID:
    case CU_DEVICE_ATTRIBUTE_PCI_DOMAIN_ID: *pi = 0; break;
    case CU_DEVICE_ATTRIBUTE_ASYNC_ENGINE_COUNT: *pi = 3; break;
    case CU_DEVICE_ATTRIBUTE_ECC_ENABLED:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_KERNELS:
    case CU_DEVICE_ATTRIBUTE_CAN_MAP_HOST_MEMORY:
    case CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING:
    case CU_DEVICE_ATTRIBUTE_MANAGED_MEMORY:
    case CU_DEVICE_ATTRIBUTE_CONCURRENT_MANAGED_ACCESS:
    case CU_DEVICE_ATTRIBUTE_COOPERATIVE_LAUNCH:
    case CU_DEVICE_ATTRIBUTE_MEMORY_POOLS_SUPPORTED:
    case CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: *pi = 1; break;
    default: *pi = 0; break;
    }
    return CUDA_SUCCESS;
}
