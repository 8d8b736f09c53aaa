/* Loading the real driver libraries (contract: prim-style, see prim.h).
 *
 * vcuda_real_dlsym: glibc's own dlsym, resolved once at load; the shim's
 *   exported dlsym override must never be used to look up real functions.
 * vcuda_driver_load(): dlopen the real libcuda (VCUDA_REAL_LIBCUDA) with
 *   RTLD_LOCAL and fill vcuda_real; idempotent and thread-safe. Returns
 *   CUDA_SUCCESS or the CUresult every hook returns while the driver is missing.
 * vcuda_nvml_load(): the same for NVML; returns 0 when usable.
 */
#ifndef VCUDA_REAL_DRIVER_H
#define VCUDA_REAL_DRIVER_H

#include "hooks.h"

typedef void *(*vcuda_dlsym_fn)(void *, const char *);
extern vcuda_dlsym_fn vcuda_real_dlsym;

void vcuda_real_dlsym_init(void);
CUresult vcuda_driver_load(void);
int vcuda_nvml_load(void);
/* Loads the driver; CUDA_SUCCESS when the real function in `slot` (a field of
 * vcuda_real) exists, otherwise the CUresult the hook returns (a missing
 * function is logged with its name). */
CUresult vcuda_real_ready(void **slot, const char *name);

/* Handles of the real libraries (NULL until loaded). */
extern void *vcuda_libcuda_handle;
extern void *vcuda_libnvml_handle;

#endif
