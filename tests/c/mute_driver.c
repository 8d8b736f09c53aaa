/* A driver that will not report the attributes vcuda sizes held memory by.
 * Everything else is the simulator's: it is this library's DT_NEEDED, and
 * dlsym on this library's handle searches it next. Use it as
 * VCUDA_REAL_LIBCUDA with the dlsym door (cuGetProcAddress answers with the
 * simulator's own functions). */
#include "vcuda/cuda_abi.h"

#define MUTE __attribute__((visibility("default")))

MUTE CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc);
MUTE CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev);
MUTE CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value);

CUresult cuFuncGetAttribute(int *pi, CUfunction_attribute attrib, CUfunction hfunc) {
    (void)pi, (void)attrib, (void)hfunc;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuKernelGetAttribute(int *pi, CUfunction_attribute attrib, CUkernel kernel, CUdevice dev) {
    (void)pi, (void)attrib, (void)kernel, (void)dev;
    return CUDA_ERROR_NOT_SUPPORTED;
}

CUresult cuMemPoolGetAttribute(CUmemoryPool pool, CUmemPool_attribute attr, void *value) {
    (void)pool, (void)attr, (void)value;
    return CUDA_ERROR_NOT_SUPPORTED;
}
