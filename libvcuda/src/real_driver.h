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

/* Code on the dlsym path runs while a sanitizer runtime preloaded before us
 * initialises (it looks up its interceptors with dlsym): it must not be
 * instrumented in sanitizer builds. */
#define VCUDA_NO_SANITIZE __attribute__((no_sanitize("address", "thread", "undefined")))
extern vcuda_dlsym_fn vcuda_real_dlsym;

VCUDA_NO_SANITIZE void vcuda_real_dlsym_init(void);
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
