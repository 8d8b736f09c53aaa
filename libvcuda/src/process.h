/* This process's view of quota state: its ledger slot, the mapping from CUDA
 * device ordinals to ledger devices, and its live contexts (each charged the
 * per-context overhead). Everything here is on the slow path of a hook. */
#ifndef VCUDA_PROCESS_H
#define VCUDA_PROCESS_H

#include <stdbool.h>
#include <stdint.h>

#include "hooks.h"
#include "ledger.h"
#include "overhead_probe.h"

struct vcuda_process {
    struct vcuda_ledger ledger;
    int slot; /* ledger process slot, -1 until attached */
};
extern struct vcuda_process vcuda_proc;

/* CUDA_SUCCESS once the driver is loaded, the config valid and the ledger
 * attached; otherwise the CUresult each hook returns (the reason is logged once). */
CUresult vcuda_process_ready(void);

/* Ledger device index of CUDA device ordinal `ordinal` and this process's limit
 * for it. Returns -1 (with *rc set) when the device cannot be named. */
int vcuda_device_index(CUdevice ordinal, uint64_t *limit, CUresult *rc);

/* CUDA_SUCCESS when this process may use device `ordinal`. Without the quota
 * file, any (the driver judges the ordinal); with it, only a GPU the file
 * names: any other, or one whose UUID cannot be read, is refused
 * (CUDA_ERROR_INVALID_DEVICE, logged once per device). Slow path: the first
 * call per device reads its UUID. */
CUresult vcuda_device_admit(CUdevice ordinal);

/* The GPU UUID of a named ordinal ("GPU-..."), or NULL before it was named. */
const char *vcuda_device_uuid(CUdevice ordinal);

/* Clamps a real (free, total) pair to the quota of ledger device `dev`. */
void vcuda_quota_view(int dev, uint64_t limit, uint64_t *free_bytes, uint64_t *total_bytes);

/* Registers the fork handler (library constructor). */
void vcuda_process_init(void);

/* The current context and its device ordinal. */
CUresult vcuda_current_device(CUcontext *ctx, CUdevice *ordinal);
/* The device ordinal of a stream (its context's device), or the current one. */
CUresult vcuda_stream_device(CUstream stream, CUcontext *ctx, CUdevice *ordinal);

/* Context bookkeeping around the real calls; see context.c. */
CUresult vcuda_context_before_create(CUdevice ordinal, bool primary, uint64_t *charged,
                                     struct vcuda_overhead_probe *before);
CUresult vcuda_context_after_create(CUresult rc, CUcontext ctx, CUdevice ordinal, bool primary,
                                    uint64_t charged, const struct vcuda_overhead_probe *before);
void vcuda_context_destroyed(CUcontext ctx);
void vcuda_primary_released(CUdevice ordinal, bool reset);

#endif
