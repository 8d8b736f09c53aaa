/* Memory shared between processes (vcudasim.h "Sharing"): legacy IPC
 * handles (cuIpcGetMemHandle / cuIpcOpenMemHandle) and VMM shareable handles
 * (cuMemExportToShareableHandle / cuMemImportFromShareableHandle, POSIX file
 * descriptors). Physically there is one allocation, charged to the process
 * that created it for as long as it holds it; importers are charged nothing.
 *
 * Both handles describe the allocation and its creator (pid + start time).
 * The IPC handle carries the description in its 64 bytes; an exported VMM
 * handle is a memfd holding it, which another process gets by any fd
 * passing (SCM_RIGHTS, pidfd_getfd, or opening /proc/<pid>/fd/<n>). An
 * import fails with CUDA_ERROR_INVALID_VALUE once the creator is gone. */
#define _GNU_SOURCE
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "api.h"
#include "sim.h"

#define IPC_MAGIC "VCSIMIPC"
#define VMM_MAGIC "VCSIMVMM"

struct shared_desc {
    char magic[8];
    int32_t pid;
    uint32_t phys;
    uint64_t start_time;
    uint64_t addr; /* IPC: the creator's pointer; VMM: the creator's handle id */
    uint64_t bytes;
};
_Static_assert(sizeof(struct shared_desc) <= CU_IPC_HANDLE_SIZE, "fits an IPC handle");

static void describe(struct shared_desc *d, const char *magic, uint64_t addr, uint64_t bytes,
                     unsigned phys)
{
    memset(d, 0, sizeof *d);
    memcpy(d->magic, magic, sizeof d->magic);
    d->pid = (int32_t)sim.pid;
    d->phys = phys;
    sim_lock(sim.sh);
    d->start_time = sim.sh->proc[sim.slot].start_time;
    sim_unlock(sim.sh);
    d->addr = addr;
    d->bytes = bytes;
}

/* CUDA_SUCCESS when d is a description of this kind from a live process on
 * these GPUs. */
static CUresult check_desc(const struct shared_desc *d, const char *magic)
{
    if (memcmp(d->magic, magic, sizeof d->magic) != 0 || !sim_phys_valid(sim.sh, d->phys))
        return CUDA_ERROR_INVALID_VALUE;
    bool alive = false;
    sim_lock(sim.sh);
    sim_reap_dead(sim.sh);
    for (uint32_t i = 0; i < sim.sh->nproc_hw && !alive; i++)
        alive = sim.sh->proc[i].pid == d->pid && sim.sh->proc[i].start_time == d->start_time;
    sim_unlock(sim.sh);
    return alive ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE;
}

/* ---- legacy IPC: cuMemAlloc memory ---- */

SIM_EXPORT CUresult cuIpcGetMemHandle(CUipcMemHandle *pHandle, CUdeviceptr dptr)
{
    struct sim_alloc_entry e;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!pHandle || !sim_alloc_find(dptr, SIM_ALLOC_BIT(SIM_ALLOC_LINEAR), &e))
        return CUDA_ERROR_INVALID_VALUE; /* the base of a cuMemAlloc allocation only */
    struct shared_desc d;
    describe(&d, IPC_MAGIC, dptr, e.bytes, e.phys);
    memset(pHandle, 0, sizeof *pHandle);
    memcpy(pHandle->reserved, &d, sizeof d);
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcOpenMemHandle_v2(CUdeviceptr *pdptr, CUipcMemHandle handle,
                                          unsigned int Flags)
{
    struct sim_ctx *c;
    struct shared_desc d;
    if (!pdptr || (Flags & ~(unsigned)CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS))
        return CUDA_ERROR_INVALID_VALUE;
    CUresult rc = sim_require_ctx(&c);
    if (rc != CUDA_SUCCESS)
        return rc;
    memcpy(&d, handle.reserved, sizeof d);
    if (d.pid == (int32_t)sim.pid)
        return CUDA_ERROR_INVALID_CONTEXT; /* a process cannot open its own handle */
    if ((rc = check_desc(&d, IPC_MAGIC)) != CUDA_SUCCESS)
        return rc;
    uint64_t addr = sim_new_address(d.bytes, 0); /* the importer's own mapping */
    if ((rc = sim_alloc_record(addr, 0, c, SIM_ALLOC_IPC)) != CUDA_SUCCESS)
        return rc;
    *pdptr = addr;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuIpcCloseMemHandle(CUdeviceptr dptr)
{
    struct sim_alloc_entry e;
    CUresult rc = sim_check_init();
    return rc == CUDA_SUCCESS ? sim_alloc_take(dptr, SIM_ALLOC_BIT(SIM_ALLOC_IPC), &e) : rc;
}

/* ---- VMM shareable handles ---- */

SIM_EXPORT CUresult cuMemExportToShareableHandle(void *shareableHandle,
                                                 CUmemGenericAllocationHandle handle,
                                                 CUmemAllocationHandleType handleType,
                                                 unsigned long long flags)
{
    uint64_t bytes;
    unsigned phys, types;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!shareableHandle || flags != 0 || handleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = sim_vmm_describe(handle, &bytes, &phys, &types)) != CUDA_SUCCESS)
        return rc;
    if (!(types & (unsigned)CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR))
        return CUDA_ERROR_INVALID_VALUE; /* not requested at cuMemCreate */
    struct shared_desc d;
    describe(&d, VMM_MAGIC, handle, bytes, phys);
    int fd = memfd_create("vcudasim-export", MFD_CLOEXEC);
    if (fd < 0)
        return CUDA_ERROR_OPERATING_SYSTEM;
    if (pwrite(fd, &d, sizeof d, 0) != (ssize_t)sizeof d) {
        close(fd);
        return CUDA_ERROR_OPERATING_SYSTEM;
    }
    *(int *)shareableHandle = fd;
    return CUDA_SUCCESS;
}

SIM_EXPORT CUresult cuMemImportFromShareableHandle(CUmemGenericAllocationHandle *handle,
                                                   void *osHandle,
                                                   CUmemAllocationHandleType shHandleType)
{
    struct shared_desc d;
    CUresult rc = sim_check_init();
    if (rc != CUDA_SUCCESS)
        return rc;
    if (!handle || shHandleType != CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR)
        return CUDA_ERROR_INVALID_VALUE;
    int fd = (int)(intptr_t)osHandle;
    if (pread(fd, &d, sizeof d, 0) != (ssize_t)sizeof d)
        return CUDA_ERROR_INVALID_VALUE;
    if ((rc = check_desc(&d, VMM_MAGIC)) != CUDA_SUCCESS)
        return rc;
    uint64_t id;
    if ((rc = sim_vmm_adopt(d.bytes, d.phys, &id)) != CUDA_SUCCESS)
        return rc;
    *handle = id;
    return CUDA_SUCCESS;
}
