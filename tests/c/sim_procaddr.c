/* cuGetProcAddress(_v2) as cudart uses it: dlopen the driver by path
 * (VCUDA_REAL_LIBCUDA), dlsym one name, resolve the rest through it.
 * Each case prints "<symbol> <version> <flags> <CUresult> <status> <resolved name>". */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>

#include <vcuda/cuda_abi.h>

typedef CUresult (*gpa_v2_t)(const char *, void **, int, cuuint64_t,
                             CUdriverProcAddressQueryResult *);
typedef CUresult (*gpa_t)(const char *, void **, int, cuuint64_t);

int main(int argc, char **argv)
{
    void *lib = dlopen(getenv("VCUDA_REAL_LIBCUDA"), RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 2;
    }
    gpa_v2_t gpa = (gpa_v2_t)dlsym(lib, "cuGetProcAddress_v2");
    gpa_t gpa4 = (gpa_t)dlsym(lib, "cuGetProcAddress");
    /* argv: triples symbol version flags; flags "4arg" uses the 4-argument entry. */
    for (int i = 1; i + 2 < argc; i += 3) {
        void *pfn = (void *)0x1;
        CUdriverProcAddressQueryResult status = 99;
        int version = atoi(argv[i + 1]);
        CUresult rc;
        if (argv[i + 2][0] == '4') {
            rc = gpa4(argv[i], &pfn, version, 0);
        } else {
            rc = gpa(argv[i], &pfn, version, strtoull(argv[i + 2], NULL, 0), &status);
        }
        Dl_info info = {0};
        const char *name = pfn == NULL ? "NULL" : dladdr(pfn, &info) && info.dli_sname ? info.dli_sname : "?";
        printf("%s %s %s %d %d %s\n", argv[i], argv[i + 1], argv[i + 2], rc, (int)status, name);
    }
    return 0;
}
