/* NVML's MIG functions (libvcuda-sim-nvml.so): MIG mode, GPU-instance
 * profiles and placements, GPU and compute instances, MIG device handles.
 * The instances live in the shared state (mig.c), so every process sees
 * them; handles are process-local, one set per GPU-instance slot, and stay
 * valid while the instance they were handed out for exists (a stale one is
 * refused with INVALID_ARGUMENT; a later instance in the same slot gets the
 * same pointers back, as NVML says handles may be reused).
 *
 * As NVML: profile, placement and instance calls need MIG mode enabled
 * (NVML_ERROR_NOT_SUPPORTED otherwise); profile queries take the
 * NVML_GPU_INSTANCE_PROFILE_* index, creation and instance lists take the
 * profile's id (nvmlGpuInstanceProfileInfo_t.id). Each GPU instance has at
 * most one compute instance, of the profile that spans it. */
#define _GNU_SOURCE
#include <stdio.h>
#include <string.h>

#include "nvml_mig_abi.h"

#define NVML_EXPORT __attribute__((visibility("default")))

#define SIM_NVML_MIG_API(X)                                                                    \
    X(nvmlDeviceGetMigMode, (nvmlDevice_t device, unsigned int *currentMode,                   \
                             unsigned int *pendingMode))                                       \
    X(nvmlDeviceSetMigMode, (nvmlDevice_t device, unsigned int mode,                           \
                             nvmlReturn_t *activationStatus))                                  \
    X(nvmlDeviceGetMaxMigDeviceCount, (nvmlDevice_t device, unsigned int *count))              \
    X(nvmlDeviceGetMigDeviceHandleByIndex,                                                     \
      (nvmlDevice_t device, unsigned int index, nvmlDevice_t *migDevice))                      \
    X(nvmlDeviceGetDeviceHandleFromMigDeviceHandle,                                            \
      (nvmlDevice_t migDevice, nvmlDevice_t *device))                                          \
    X(nvmlDeviceIsMigDeviceHandle, (nvmlDevice_t device, unsigned int *isMigDevice))           \
    X(nvmlDeviceGetGpuInstanceId, (nvmlDevice_t device, unsigned int *id))                     \
    X(nvmlDeviceGetComputeInstanceId, (nvmlDevice_t device, unsigned int *id))                 \
    X(nvmlDeviceGetAttributes_v2, (nvmlDevice_t device, nvmlDeviceAttributes_t *attributes))   \
    X(nvmlDeviceGetAttributes, (nvmlDevice_t device, nvmlDeviceAttributes_t *attributes))      \
    X(nvmlDeviceGetGpuInstanceProfileInfo,                                                     \
      (nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_t *info))         \
    X(nvmlDeviceGetGpuInstanceProfileInfoV,                                                    \
      (nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info))      \
    X(nvmlDeviceGetGpuInstanceProfileInfoByIdV,                                                \
      (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstanceProfileInfo_v2_t *info))    \
    X(nvmlDeviceGetGpuInstancePossiblePlacements_v2,                                           \
      (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,    \
       unsigned int *count))                                                                   \
    X(nvmlDeviceGetGpuInstancePossiblePlacements,                                              \
      (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,    \
       unsigned int *count))                                                                   \
    X(nvmlDeviceGetGpuInstanceRemainingCapacity,                                               \
      (nvmlDevice_t device, unsigned int profileId, unsigned int *count))                      \
    X(nvmlDeviceCreateGpuInstance,                                                             \
      (nvmlDevice_t device, unsigned int profileId, nvmlGpuInstance_t *gpuInstance))           \
    X(nvmlDeviceCreateGpuInstanceWithPlacement,                                                \
      (nvmlDevice_t device, unsigned int profileId,                                            \
       const nvmlGpuInstancePlacement_t *placement, nvmlGpuInstance_t *gpuInstance))           \
    X(nvmlGpuInstanceDestroy, (nvmlGpuInstance_t gpuInstance))                                 \
    X(nvmlDeviceGetGpuInstances, (nvmlDevice_t device, unsigned int profileId,                 \
                                  nvmlGpuInstance_t *gpuInstances, unsigned int *count))       \
    X(nvmlDeviceGetGpuInstanceById,                                                            \
      (nvmlDevice_t device, unsigned int id, nvmlGpuInstance_t *gpuInstance))                  \
    X(nvmlGpuInstanceGetInfo, (nvmlGpuInstance_t gpuInstance, nvmlGpuInstanceInfo_t *info))   \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfo,                                            \
      (nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,           \
       nvmlComputeInstanceProfileInfo_t *info))                                                \
    X(nvmlGpuInstanceGetComputeInstanceProfileInfoV,                                           \
      (nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,           \
       nvmlComputeInstanceProfileInfo_v2_t *info))                                             \
    X(nvmlGpuInstanceGetComputeInstanceRemainingCapacity,                                      \
      (nvmlGpuInstance_t gpuInstance, unsigned int profileId, unsigned int *count))            \
    X(nvmlGpuInstanceCreateComputeInstance,                                                    \
      (nvmlGpuInstance_t gpuInstance, unsigned int profileId,                                  \
       nvmlComputeInstance_t *computeInstance))                                                \
    X(nvmlComputeInstanceDestroy, (nvmlComputeInstance_t computeInstance))                     \
    X(nvmlGpuInstanceGetComputeInstances,                                                      \
      (nvmlGpuInstance_t gpuInstance, unsigned int profileId,                                  \
       nvmlComputeInstance_t *computeInstances, unsigned int *count))                          \
    X(nvmlGpuInstanceGetComputeInstanceById,                                                   \
      (nvmlGpuInstance_t gpuInstance, unsigned int id, nvmlComputeInstance_t *computeInstance))\
    X(nvmlComputeInstanceGetInfo_v2,                                                           \
      (nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info))                \
    X(nvmlComputeInstanceGetInfo,                                                              \
      (nvmlComputeInstance_t computeInstance, nvmlComputeInstanceInfo_t *info))

#define NVML_DECLARE(name, params) NVML_EXPORT nvmlReturn_t name params;
SIM_NVML_MIG_API(NVML_DECLARE)
#undef NVML_DECLARE

/* The handles of one GPU-instance slot: its GPU instance, its compute
 * instance and its MIG device are the addresses of three tags. */
struct slot_handles {
    uint32_t dev_tag, gi_tag, ci_tag;
    uint32_t pad;
    uint64_t serial; /* the instance they were last handed out for */
};
static struct slot_handles slots[SIM_MAX_DEVICES][SIM_MIG_MAX];
#define SLOT_COUNT (SIM_MAX_DEVICES * SIM_MIG_MAX)

enum tag { TAG_DEV, TAG_GI, TAG_CI };

static nvmlReturn_t nvml_rc(enum sim_mig_rc rc)
{
    switch (rc) {
    case SIM_MIG_OK: return NVML_SUCCESS;
    case SIM_MIG_INVALID: return NVML_ERROR_INVALID_ARGUMENT;
    case SIM_MIG_NO_RESOURCES: return NVML_ERROR_INSUFFICIENT_RESOURCES;
    case SIM_MIG_IN_USE: return NVML_ERROR_IN_USE;
    case SIM_MIG_NOT_SUPPORTED: return NVML_ERROR_NOT_SUPPORTED;
    }
    return NVML_ERROR_UNKNOWN;
}

static void *tag_of(unsigned dev, unsigned slot, enum tag t)
{
    struct slot_handles *s = &slots[dev][slot];
    return t == TAG_DEV ? (void *)&s->dev_tag : t == TAG_GI ? (void *)&s->gi_tag : &s->ci_tag;
}

/* A handle for the live instance in slot; caller holds the shared lock. */
static void *hand_out(struct sim_shared *sh, unsigned dev, unsigned slot, enum tag t)
{
    slots[dev][slot].serial = sh->mig[dev].gi[slot].serial;
    return tag_of(dev, slot, t);
}

/* The slot behind a handle of kind t, if that is one; the shared lock is
 * taken on success (the caller releases it). */
static nvmlReturn_t slot_of(const void *h, enum tag t, struct sim_shared **sh, unsigned *dev,
                            unsigned *slot)
{
    if (!(*sh = sim_nvml_state()))
        return NVML_ERROR_UNINITIALIZED;
    const char *p = h, *base = (const char *)slots;
    if (!p || p < base || p >= base + sizeof slots)
        return NVML_ERROR_NOT_FOUND;
    size_t i = (size_t)(p - base) / sizeof(struct slot_handles);
    *dev = (unsigned)(i / SIM_MIG_MAX);
    *slot = (unsigned)(i % SIM_MIG_MAX);
    if (p != tag_of(*dev, *slot, t))
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_lock(*sh);
    const struct sim_gi *g = &(*sh)->mig[*dev].gi[*slot];
    if (*dev >= (*sh)->ndev || !(*sh)->mig[*dev].mode || !g->live ||
        g->serial != slots[*dev][*slot].serial || (t != TAG_GI && !g->ci_live)) {
        sim_unlock(*sh);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    if (__atomic_load_n(&(*sh)->dev[*dev].lost, __ATOMIC_ACQUIRE)) { /* its GPU fell off the bus */
        sim_unlock(*sh);
        return NVML_ERROR_GPU_IS_LOST;
    }
    return NVML_SUCCESS;
}

/* slot_of for GPU- and compute-instance handles: anything else is invalid. */
static nvmlReturn_t instance_of(const void *h, enum tag t, struct sim_shared **sh,
                                unsigned *dev, unsigned *slot)
{
    nvmlReturn_t rc = slot_of(h, t, sh, dev, slot);
    return rc == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : rc;
}

nvmlReturn_t sim_nvml_mig_device(nvmlDevice_t h, struct sim_shared **sh, unsigned *phys)
{
    unsigned dev, slot;
    nvmlReturn_t rc = slot_of(h, TAG_DEV, sh, &dev, &slot);
    if (rc == NVML_SUCCESS) {
        sim_unlock(*sh);
        *phys = SIM_MIG_PHYS(dev, slot);
    }
    return rc;
}

nvmlReturn_t sim_nvml_mig_ids(unsigned phys, unsigned *gi, unsigned *ci)
{
    struct sim_shared *sh = sim_nvml_state();
    if (!sh || phys < SIM_MAX_DEVICES || !sim_phys_valid(sh, phys))
        return NVML_ERROR_NOT_FOUND;
    const struct sim_gi *g =
        &sh->mig[sim_phys_parent(phys)].gi[(phys - SIM_MAX_DEVICES) % SIM_MIG_MAX];
    *gi = g->id;
    *ci = g->ci_id;
    return NVML_SUCCESS;
}

nvmlReturn_t sim_nvml_mig_by_uuid(const char *uuid, nvmlDevice_t *device)
{
    struct sim_shared *sh = sim_nvml_state();
    nvmlReturn_t rc = NVML_ERROR_NOT_FOUND;
    if (!sh)
        return NVML_ERROR_UNINITIALIZED;
    sim_lock(sh);
    for (unsigned p = SIM_MAX_DEVICES; p < SIM_MAX_PHYS && rc; p++) {
        if (sim_phys_valid(sh, p) && strcmp(sh->dev[p].uuid, uuid) == 0) {
            unsigned d = sim_phys_parent(p), k = (p - SIM_MAX_DEVICES) % SIM_MIG_MAX;
            *device = hand_out(sh, d, k, TAG_DEV);
            rc = NVML_SUCCESS;
        }
    }
    sim_unlock(sh);
    return rc;
}

/* ---- MIG mode ---- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t device, unsigned int *currentMode,
                                              unsigned int *pendingMode)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = sim_nvml_gpu(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!currentMode || !pendingMode)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sh->mig[i].capable)
        return NVML_ERROR_NOT_SUPPORTED;
    *currentMode = *pendingMode = __atomic_load_n(&sh->mig[i].mode, __ATOMIC_ACQUIRE);
    return NVML_SUCCESS;
}

/* Takes effect at once (the simulator stands for "set + GPU reset"): only on
 * a GPU with no process on it or its instances, and no GPU instance left to
 * disable; otherwise NVML_ERROR_IN_USE and nothing changes. */
NVML_EXPORT nvmlReturn_t nvmlDeviceSetMigMode(nvmlDevice_t device, unsigned int mode,
                                              nvmlReturn_t *activationStatus)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = sim_nvml_gpu(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!activationStatus || mode > NVML_DEVICE_MIG_ENABLE)
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_lock(sh);
    sim_reap_dead(sh);
    rc = nvml_rc(sim_mig_set_mode(sh, i, mode == NVML_DEVICE_MIG_ENABLE));
    sim_unlock(sh);
    *activationStatus = rc;
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t device, unsigned int *count)
{
    struct sim_shared *sh;
    unsigned i;
    nvmlReturn_t rc = sim_nvml_gpu(device, &sh, &i);
    if (rc == NVML_SUCCESS && !count)
        rc = NVML_ERROR_INVALID_ARGUMENT;
    if (rc == NVML_SUCCESS)
        *count = sh->mig[i].mode ? SIM_MIG_MAX : 0;
    return rc;
}

/* ---- MIG device handles ---- */

NVML_EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t device,
                                                             unsigned int index,
                                                             nvmlDevice_t *migDevice)
{
    struct sim_shared *sh;
    unsigned i, phys[SIM_MIG_MAX];
    nvmlReturn_t rc = sim_nvml_gpu(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    if (!migDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!sh->mig[i].capable)
        return NVML_ERROR_NOT_SUPPORTED;
    sim_lock(sh);
    unsigned n = sim_mig_devices(sh, i, phys);
    rc = index < n ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    if (rc == NVML_SUCCESS)
        *migDevice = hand_out(sh, i, (phys[index] - SIM_MAX_DEVICES) % SIM_MIG_MAX, TAG_DEV);
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t migDevice,
                                                                      nvmlDevice_t *device)
{
    struct sim_shared *sh;
    unsigned phys;
    if (!device)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = sim_nvml_mig_device(migDevice, &sh, &phys);
    if (rc == NVML_SUCCESS)
        *device = sim_nvml_gpu_handle(sim_phys_parent(phys));
    return rc == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t device,
                                                     unsigned int *isMigDevice)
{
    struct sim_shared *sh;
    unsigned phys;
    if (!isMigDevice)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = sim_nvml_mig_device(device, &sh, &phys);
    if (rc == NVML_SUCCESS) {
        *isMigDevice = 1;
        return rc;
    }
    if (rc == NVML_ERROR_NOT_FOUND && (rc = sim_nvml_gpu(device, &sh, &phys)) == NVML_SUCCESS)
        *isMigDevice = 0;
    return rc;
}

static nvmlReturn_t instance_id(nvmlDevice_t device, unsigned int *id, bool ci)
{
    struct sim_shared *sh;
    unsigned phys, gi, cid;
    if (!id)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = sim_nvml_mig_device(device, &sh, &phys);
    if (rc == NVML_ERROR_NOT_FOUND)
        return NVML_ERROR_INVALID_ARGUMENT; /* a GPU, not a MIG device */
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    rc = sim_nvml_mig_ids(phys, &gi, &cid);
    sim_unlock(sh);
    if (rc == NVML_SUCCESS)
        *id = ci ? cid : gi;
    return rc == NVML_ERROR_NOT_FOUND ? NVML_ERROR_INVALID_ARGUMENT : rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, id, false);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t device, unsigned int *id)
{
    return instance_id(device, id, true);
}

/* As NVML: MIG device handles only. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes_v2(nvmlDevice_t device,
                                                    nvmlDeviceAttributes_t *attributes)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    if (!attributes)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = slot_of(device, TAG_DEV, &sh, &dev, &slot);
    if (rc == NVML_ERROR_NOT_FOUND)
        return sim_nvml_gpu(device, &sh, &dev) == NVML_SUCCESS ? NVML_ERROR_NOT_SUPPORTED
                                                               : NVML_ERROR_INVALID_ARGUMENT;
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_mig_profile *p = &sim_mig_model(sh)->profiles[sh->mig[dev].gi[slot].profile];
    *attributes = (nvmlDeviceAttributes_t){
        .multiprocessorCount = p->sms, .sharedCopyEngineCount = p->copy_engines,
        .sharedDecoderCount = p->decoders, .sharedEncoderCount = p->encoders,
        .sharedJpegCount = p->jpegs, .sharedOfaCount = p->ofas,
        .gpuInstanceSliceCount = p->slices, .computeInstanceSliceCount = p->slices,
        .memorySizeMB = p->memory_mb};
    sim_unlock(sh);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetAttributes(nvmlDevice_t device,
                                                 nvmlDeviceAttributes_t *attributes)
{
    return nvmlDeviceGetAttributes_v2(device, attributes);
}

/* ---- GPU-instance profiles and placements ---- */

/* A GPU in MIG mode (instances, profiles and placements need it). */
static nvmlReturn_t mig_gpu(nvmlDevice_t device, struct sim_shared **sh, unsigned *i)
{
    nvmlReturn_t rc = sim_nvml_gpu(device, sh, i);
    if (rc == NVML_SUCCESS && !__atomic_load_n(&(*sh)->mig[*i].mode, __ATOMIC_ACQUIRE))
        rc = NVML_ERROR_NOT_SUPPORTED;
    return rc;
}

/* The model's profile with NVML index `index` (by_id: with id `index`). */
static nvmlReturn_t profile_of(const struct sim_shared *sh, unsigned index, bool by_id,
                               unsigned *profile)
{
    const struct sim_mig_model *m = sim_mig_model(sh);
    for (unsigned k = 0; k < m->nprofiles; k++) {
        if ((by_id ? m->profiles[k].id : m->profiles[k].nvml_index) == index) {
            *profile = k;
            return NVML_SUCCESS;
        }
    }
    return by_id || index >= NVML_GPU_INSTANCE_PROFILE_COUNT ? NVML_ERROR_INVALID_ARGUMENT
                                                             : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t gi_profile(nvmlDevice_t device, unsigned index, bool by_id,
                               const struct sim_mig_profile **out)
{
    struct sim_shared *sh;
    unsigned i, k;
    nvmlReturn_t rc = mig_gpu(device, &sh, &i);
    if (rc == NVML_SUCCESS)
        rc = profile_of(sh, index, by_id, &k);
    if (rc == NVML_SUCCESS)
        *out = &sim_mig_model(sh)->profiles[k];
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfo(nvmlDevice_t device,
                                                             unsigned int profile,
                                                             nvmlGpuInstanceProfileInfo_t *info)
{
    const struct sim_mig_profile *p;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_profile(device, profile, false, &p);
    if (rc == NVML_SUCCESS)
        *info = (nvmlGpuInstanceProfileInfo_t){
            .id = p->id, .isP2pSupported = 0, .sliceCount = p->slices,
            .instanceCount = p->max_count, .multiprocessorCount = p->sms,
            .copyEngineCount = p->copy_engines, .decoderCount = p->decoders,
            .encoderCount = p->encoders, .jpegCount = p->jpegs, .ofaCount = p->ofas,
            .memorySizeMB = p->memory_mb};
    return rc;
}

/* v2 and v3 layouts, told apart by info->version. */
static nvmlReturn_t profile_info_v(nvmlDevice_t device, unsigned index, bool by_id,
                                   nvmlGpuInstanceProfileInfo_v2_t *info)
{
    const struct sim_mig_profile *p;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (info->version != nvmlGpuInstanceProfileInfo_v2 &&
        info->version != nvmlGpuInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = gi_profile(device, index, by_id, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    snprintf(name, sizeof name, "MIG %s", p->name);
    if (info->version == nvmlGpuInstanceProfileInfo_v2) {
        *info = (nvmlGpuInstanceProfileInfo_v2_t){
            .version = nvmlGpuInstanceProfileInfo_v2, .id = p->id, .isP2pSupported = 0,
            .sliceCount = p->slices, .instanceCount = p->max_count,
            .multiprocessorCount = p->sms, .copyEngineCount = p->copy_engines,
            .decoderCount = p->decoders, .encoderCount = p->encoders, .jpegCount = p->jpegs,
            .ofaCount = p->ofas, .memorySizeMB = p->memory_mb};
        memcpy(info->name, name, sizeof name);
    } else {
        nvmlGpuInstanceProfileInfo_v3_t *v3 = (nvmlGpuInstanceProfileInfo_v3_t *)info;
        *v3 = (nvmlGpuInstanceProfileInfo_v3_t){
            .version = nvmlGpuInstanceProfileInfo_v3, .id = p->id, .sliceCount = p->slices,
            .instanceCount = p->max_count, .multiprocessorCount = p->sms,
            .copyEngineCount = p->copy_engines, .decoderCount = p->decoders,
            .encoderCount = p->encoders, .jpegCount = p->jpegs, .ofaCount = p->ofas,
            .memorySizeMB = p->memory_mb, .capabilities = 0};
        memcpy(v3->name, name, sizeof name);
    }
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoV(
    nvmlDevice_t device, unsigned int profile, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    return profile_info_v(device, profile, false, info);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceProfileInfoByIdV(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstanceProfileInfo_v2_t *info)
{
    return profile_info_v(device, profileId, true, info);
}

/* Every placement the profile allows, free or not. placements NULL: *count
 * is set to how many there are. */
NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements_v2(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    const struct sim_mig_profile *p;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_profile(device, profileId, true, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = (unsigned)__builtin_popcount(p->starts);
    if (!placements) {
        *count = n;
        return NVML_SUCCESS;
    }
    if (*count < n) {
        *count = n;
        return NVML_ERROR_INSUFFICIENT_SIZE;
    }
    n = 0;
    for (unsigned s = 0; s < SIM_MIG_SLICES; s++)
        if (p->starts & (1u << s))
            placements[n++] = (nvmlGpuInstancePlacement_t){.start = s, .size = p->mem_slices};
    *count = n;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstancePossiblePlacements(
    nvmlDevice_t device, unsigned int profileId, nvmlGpuInstancePlacement_t *placements,
    unsigned int *count)
{
    return nvmlDeviceGetGpuInstancePossiblePlacements_v2(device, profileId, placements, count);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceRemainingCapacity(nvmlDevice_t device,
                                                                   unsigned int profileId,
                                                                   unsigned int *count)
{
    struct sim_shared *sh;
    unsigned i, k;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = mig_gpu(device, &sh, &i);
    if (rc == NVML_SUCCESS)
        rc = profile_of(sh, profileId, true, &k);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_lock(sh);
    *count = sim_gi_remaining(&sh->mig[i], sim_mig_model(sh), k);
    sim_unlock(sh);
    return NVML_SUCCESS;
}

/* ---- GPU instances ---- */

static nvmlReturn_t create_gi(nvmlDevice_t device, unsigned profileId,
                              const nvmlGpuInstancePlacement_t *placement,
                              nvmlGpuInstance_t *gpuInstance)
{
    struct sim_shared *sh;
    unsigned i, k, slot;
    if (!gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = mig_gpu(device, &sh, &i);
    if (rc == NVML_SUCCESS)
        rc = profile_of(sh, profileId, true, &k);
    if (rc != NVML_SUCCESS)
        return rc;
    if (placement && (placement->size != sim_mig_model(sh)->profiles[k].mem_slices ||
                      placement->start >= SIM_MIG_SLICES))
        return NVML_ERROR_INVALID_ARGUMENT;
    sim_lock(sh);
    rc = nvml_rc(sim_gi_create(sh, i, k, placement ? (int)placement->start : -1, &slot));
    if (rc == NVML_SUCCESS)
        *gpuInstance = hand_out(sh, i, slot, TAG_GI);
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstance(nvmlDevice_t device, unsigned int profileId,
                                                     nvmlGpuInstance_t *gpuInstance)
{
    return create_gi(device, profileId, NULL, gpuInstance);
}

NVML_EXPORT nvmlReturn_t nvmlDeviceCreateGpuInstanceWithPlacement(
    nvmlDevice_t device, unsigned int profileId, const nvmlGpuInstancePlacement_t *placement,
    nvmlGpuInstance_t *gpuInstance)
{
    if (!placement)
        return NVML_ERROR_INVALID_ARGUMENT;
    return create_gi(device, profileId, placement, gpuInstance);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceDestroy(nvmlGpuInstance_t gpuInstance)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    nvmlReturn_t rc = instance_of(gpuInstance, TAG_GI, &sh, &dev, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = nvml_rc(sim_gi_destroy(sh, dev, slot));
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstances(nvmlDevice_t device, unsigned int profileId,
                                                   nvmlGpuInstance_t *gpuInstances,
                                                   unsigned int *count)
{
    struct sim_shared *sh;
    unsigned i, k;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = mig_gpu(device, &sh, &i);
    if (rc == NVML_SUCCESS)
        rc = profile_of(sh, profileId, true, &k);
    if (rc != NVML_SUCCESS)
        return rc;
    unsigned n = 0;
    sim_lock(sh);
    for (unsigned id = 0; id < 2 * SIM_MIG_SLICES - 1; id++) /* by GPU instance id */
        for (unsigned s = 0; s < SIM_MIG_MAX; s++) {
            const struct sim_gi *g = &sh->mig[i].gi[s];
            if (!g->live || g->profile != k || g->id != id)
                continue;
            if (gpuInstances)
                gpuInstances[n] = hand_out(sh, i, s, TAG_GI);
            n++;
        }
    sim_unlock(sh);
    *count = n;
    return n && !gpuInstances ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceById(nvmlDevice_t device, unsigned int id,
                                                      nvmlGpuInstance_t *gpuInstance)
{
    struct sim_shared *sh;
    unsigned i;
    if (!gpuInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = mig_gpu(device, &sh, &i);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = NVML_ERROR_NOT_FOUND;
    sim_lock(sh);
    for (unsigned s = 0; s < SIM_MIG_MAX && rc; s++) {
        if (sh->mig[i].gi[s].live && sh->mig[i].gi[s].id == id) {
            *gpuInstance = hand_out(sh, i, s, TAG_GI);
            rc = NVML_SUCCESS;
        }
    }
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetInfo(nvmlGpuInstance_t gpuInstance,
                                                nvmlGpuInstanceInfo_t *info)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = instance_of(gpuInstance, TAG_GI, &sh, &dev, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_gi *g = &sh->mig[dev].gi[slot];
    *info = (nvmlGpuInstanceInfo_t){
        .device = sim_nvml_gpu_handle(dev), .id = g->id,
        .profileId = sim_mig_model(sh)->profiles[g->profile].id,
        .placement = {.start = g->start, .size = g->size}};
    sim_unlock(sh);
    return NVML_SUCCESS;
}

/* ---- compute instances: one per GPU instance, spanning it ---- */

/* NVML_COMPUTE_INSTANCE_PROFILE_* of a compute instance of `slices`. */
static unsigned ci_profile_index(unsigned slices)
{
    switch (slices) {
    case 1: return 0;
    case 2: return 1;
    case 3: return 2;
    case 4: return 3;
    default: return 4; /* 7 */
    }
}

/* The GPU instance behind a handle and its profile; the shared lock is
 * taken on success. */
static nvmlReturn_t gi_of(nvmlGpuInstance_t gpuInstance, struct sim_shared **sh, unsigned *dev,
                          unsigned *slot, const struct sim_mig_profile **p)
{
    nvmlReturn_t rc = instance_of(gpuInstance, TAG_GI, sh, dev, slot);
    if (rc != NVML_SUCCESS)
        return rc;
    *p = &sim_mig_model(*sh)->profiles[(*sh)->mig[*dev].gi[*slot].profile];
    return NVML_SUCCESS;
}

/* The compute-instance profile `profile` of a GPU instance whose profile is
 * p: only the one that spans it is supported. */
static nvmlReturn_t ci_profile_check(const struct sim_mig_profile *p, unsigned profile)
{
    if (profile >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    return profile == ci_profile_index(p->slices) ? NVML_SUCCESS : NVML_ERROR_NOT_SUPPORTED;
}

static nvmlReturn_t ci_profile_info(nvmlGpuInstance_t gpuInstance, unsigned profile,
                                    unsigned engProfile, nvmlComputeInstanceProfileInfo_t *out,
                                    char *name, size_t namelen)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    const struct sim_mig_profile *p;
    if (engProfile != NVML_COMPUTE_INSTANCE_ENGINE_PROFILE_SHARED)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_of(gpuInstance, &sh, &dev, &slot, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = ci_profile_check(p, profile);
    if (rc == NVML_SUCCESS) {
        *out = (nvmlComputeInstanceProfileInfo_t){
            .id = profile, .sliceCount = p->slices, .instanceCount = 1,
            .multiprocessorCount = p->sms, .sharedCopyEngineCount = p->copy_engines,
            .sharedDecoderCount = p->decoders, .sharedEncoderCount = p->encoders,
            .sharedJpegCount = p->jpegs, .sharedOfaCount = p->ofas};
        snprintf(name, namelen, "MIG %s", p->name);
    }
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfo(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_t *info)
{
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    return ci_profile_info(gpuInstance, profile, engProfile, info, name, sizeof name);
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceProfileInfoV(
    nvmlGpuInstance_t gpuInstance, unsigned int profile, unsigned int engProfile,
    nvmlComputeInstanceProfileInfo_v2_t *info)
{
    nvmlComputeInstanceProfileInfo_t v1;
    char name[NVML_DEVICE_NAME_V2_BUFFER_SIZE];
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    unsigned version = info->version;
    if (version != nvmlComputeInstanceProfileInfo_v2 &&
        version != nvmlComputeInstanceProfileInfo_v3)
        return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    nvmlReturn_t rc = ci_profile_info(gpuInstance, profile, engProfile, &v1, name, sizeof name);
    if (rc != NVML_SUCCESS)
        return rc;
    /* v3 is v2 plus a trailing capabilities word. */
    *info = (nvmlComputeInstanceProfileInfo_v2_t){
        .version = version, .id = v1.id, .sliceCount = v1.sliceCount,
        .instanceCount = v1.instanceCount, .multiprocessorCount = v1.multiprocessorCount,
        .sharedCopyEngineCount = v1.sharedCopyEngineCount,
        .sharedDecoderCount = v1.sharedDecoderCount, .sharedEncoderCount = v1.sharedEncoderCount,
        .sharedJpegCount = v1.sharedJpegCount, .sharedOfaCount = v1.sharedOfaCount};
    memcpy(info->name, name, sizeof name);
    if (version == nvmlComputeInstanceProfileInfo_v3)
        ((nvmlComputeInstanceProfileInfo_v3_t *)info)->capabilities = 0;
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceRemainingCapacity(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, unsigned int *count)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    const struct sim_mig_profile *p;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_of(gpuInstance, &sh, &dev, &slot, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = ci_profile_check(p, profileId);
    if (rc == NVML_SUCCESS)
        *count = sh->mig[dev].gi[slot].ci_live ? 0 : 1;
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceCreateComputeInstance(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId, nvmlComputeInstance_t *computeInstance)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    const struct sim_mig_profile *p;
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_of(gpuInstance, &sh, &dev, &slot, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    rc = ci_profile_check(p, profileId);
    if (rc == NVML_SUCCESS)
        rc = nvml_rc(sim_ci_create(sh, dev, slot));
    if (rc == NVML_SUCCESS)
        *computeInstance = hand_out(sh, dev, slot, TAG_CI);
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceDestroy(nvmlComputeInstance_t computeInstance)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    nvmlReturn_t rc = instance_of(computeInstance, TAG_CI, &sh, &dev, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    sim_reap_dead(sh);
    rc = nvml_rc(sim_ci_destroy(sh, dev, slot));
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstances(
    nvmlGpuInstance_t gpuInstance, unsigned int profileId,
    nvmlComputeInstance_t *computeInstances, unsigned int *count)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    const struct sim_mig_profile *p;
    if (!count)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_of(gpuInstance, &sh, &dev, &slot, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    if (profileId >= NVML_COMPUTE_INSTANCE_PROFILE_COUNT) {
        sim_unlock(sh);
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    unsigned n = profileId == ci_profile_index(p->slices) && sh->mig[dev].gi[slot].ci_live;
    if (n && computeInstances)
        computeInstances[0] = hand_out(sh, dev, slot, TAG_CI);
    sim_unlock(sh);
    *count = n;
    return n && !computeInstances ? NVML_ERROR_INVALID_ARGUMENT : NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlGpuInstanceGetComputeInstanceById(
    nvmlGpuInstance_t gpuInstance, unsigned int id, nvmlComputeInstance_t *computeInstance)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    const struct sim_mig_profile *p;
    if (!computeInstance)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = gi_of(gpuInstance, &sh, &dev, &slot, &p);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_gi *g = &sh->mig[dev].gi[slot];
    rc = g->ci_live && g->ci_id == id ? NVML_SUCCESS : NVML_ERROR_NOT_FOUND;
    if (rc == NVML_SUCCESS)
        *computeInstance = hand_out(sh, dev, slot, TAG_CI);
    sim_unlock(sh);
    return rc;
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo_v2(nvmlComputeInstance_t computeInstance,
                                                       nvmlComputeInstanceInfo_t *info)
{
    struct sim_shared *sh;
    unsigned dev, slot;
    if (!info)
        return NVML_ERROR_INVALID_ARGUMENT;
    nvmlReturn_t rc = instance_of(computeInstance, TAG_CI, &sh, &dev, &slot);
    if (rc != NVML_SUCCESS)
        return rc;
    const struct sim_gi *g = &sh->mig[dev].gi[slot];
    unsigned slices = sim_mig_model(sh)->profiles[g->profile].slices;
    *info = (nvmlComputeInstanceInfo_t){
        .device = sim_nvml_gpu_handle(dev), .gpuInstance = tag_of(dev, slot, TAG_GI),
        .id = g->ci_id, .profileId = ci_profile_index(slices),
        .placement = {.start = 0, .size = slices}};
    sim_unlock(sh);
    return NVML_SUCCESS;
}

NVML_EXPORT nvmlReturn_t nvmlComputeInstanceGetInfo(nvmlComputeInstance_t computeInstance,
                                                    nvmlComputeInstanceInfo_t *info)
{
    return nvmlComputeInstanceGetInfo_v2(computeInstance, info);
}
