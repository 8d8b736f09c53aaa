/* Calls the legacy driver entry points vcuda hooks as a program linked
 * against them would, looked up with dlsym(RTLD_DEFAULT) (under the shim:
 * its exports). Prints "<name> <CUresult>" for each, "<name> absent" when
 * nothing has the name. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <string.h>

#include "vcuda/cuda_abi.h"

typedef CUresult (*stream_fn)(CUstream);
typedef CUresult (*device_fn)(CUdevice);
typedef CUresult (*instantiate_fn)(CUgraphExec *, CUgraph, CUgraphNode *, char *, size_t);

static void *lookup(const char *name) {
    void *fn = dlsym(RTLD_DEFAULT, name);
    if (!fn) printf("%s absent\n", name);
    return fn;
}

int main(void) {
    static const char *const streams[] = {"cuStreamBeginCapture", "cuStreamBeginCapture_ptsz"};
    static const char *const devices[] = {"cuDevicePrimaryCtxRelease", "cuDevicePrimaryCtxReset"};
    for (size_t i = 0; i < 2; i++) {
        void *p = lookup(streams[i]);
        stream_fn f;
        memcpy(&f, &p, sizeof p);
        if (f) printf("%s %d\n", streams[i], f(NULL));
        p = lookup(devices[i]);
        device_fn g;
        memcpy(&g, &p, sizeof p);
        if (g) printf("%s %d\n", devices[i], g(0));
    }
    void *p = lookup("cuGraphInstantiate");
    instantiate_fn h;
    memcpy(&h, &p, sizeof p);
    CUgraphExec exec = NULL;
    if (h) printf("cuGraphInstantiate %d\n", h(&exec, NULL, NULL, NULL, 0));
    return 0;
}
