#include "real_driver.h"

#include <dlfcn.h>
#include <pthread.h>
#include <string.h>

#include "config.h"
#include "log.h"

struct vcuda_real_cuda vcuda_real;
struct vcuda_real_nvml vcuda_real_nvml;
vcuda_dlsym_fn vcuda_real_dlsym;
void *vcuda_libcuda_handle;
void *vcuda_libnvml_handle;

static pthread_once_t cuda_once = PTHREAD_ONCE_INIT;
static CUresult cuda_status = CUDA_ERROR_NOT_INITIALIZED;
static pthread_once_t nvml_once = PTHREAD_ONCE_INIT;
static int nvml_status = -1;

VCUDA_NO_SANITIZE void vcuda_real_dlsym_init(void) {
    if (vcuda_real_dlsym) return;
    /* dlvsym is not overridden, so it reaches glibc's dlsym; the version moved
     * to GLIBC_2.34 when libdl merged into libc. */
    static const char *const versions[] = {"GLIBC_2.34", "GLIBC_2.17", "GLIBC_2.2.5", "GLIBC_2.0"};
    for (size_t i = 0; i < sizeof versions / sizeof versions[0] && !vcuda_real_dlsym; i++)
        vcuda_real_dlsym = (vcuda_dlsym_fn)dlvsym(RTLD_NEXT, "dlsym", versions[i]);
}

static void load_cuda(void) {
    vcuda_real_dlsym_init();
    const char *path = vcuda_config.real_libcuda;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        vcuda_error("cannot load the CUDA driver %s: %s", path, dlerror());
        cuda_status = CUDA_ERROR_NO_DEVICE;
        return;
    }
    vcuda_libcuda_handle = handle;
#define RESOLVE(name, ...) vcuda_real.name = (__typeof__(vcuda_real.name))vcuda_real_dlsym(handle, #name);
    VCUDA_CUDA_HOOKS(RESOLVE)
    VCUDA_CUDA_USED(RESOLVE)
#undef RESOLVE
    if (vcuda_real.cuInit == NULL) {
        vcuda_error("%s does not look like a CUDA driver (no cuInit)", path);
        cuda_status = CUDA_ERROR_SHARED_OBJECT_INIT_FAILED;
        return;
    }
    cuda_status = CUDA_SUCCESS;
}

CUresult vcuda_driver_load(void) {
    pthread_once(&cuda_once, load_cuda);
    return cuda_status;
}

static void load_nvml(void) {
    vcuda_real_dlsym_init();
    const char *path = vcuda_config.real_libnvml;
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (handle == NULL) {
        vcuda_debug("NVML %s not available: %s", path, dlerror());
        return;
    }
    vcuda_libnvml_handle = handle;
#define RESOLVE(name, ...) \
    vcuda_real_nvml.name = (__typeof__(vcuda_real_nvml.name))vcuda_real_dlsym(handle, #name);
    VCUDA_NVML_HOOKS(RESOLVE)
    VCUDA_NVML_USED(RESOLVE)
#undef RESOLVE
    if (vcuda_real_nvml.nvmlInit_v2 == NULL || vcuda_real_nvml.nvmlInit_v2() != NVML_SUCCESS) {
        vcuda_debug("NVML %s did not initialise", path);
        return;
    }
    nvml_status = 0;
}

int vcuda_nvml_load(void) {
    pthread_once(&nvml_once, load_nvml);
    return nvml_status;
}

CUresult vcuda_real_ready(void **slot, const char *name) {
    CUresult rc = vcuda_driver_load();
    if (rc != CUDA_SUCCESS) return rc;
    if (*slot) return CUDA_SUCCESS;
    vcuda_error("the CUDA driver %s has no %s", vcuda_config.real_libcuda, name);
    return CUDA_ERROR_NOT_FOUND;
}
