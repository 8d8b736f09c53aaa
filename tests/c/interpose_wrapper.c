/* An interposer preloaded after libvcuda: adds one to the next definition. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdint.h>

int vcudatest_value(void);
int vcudatest_value(void) {
    int (*next)(void) = (int (*)(void))(uintptr_t)dlsym(RTLD_NEXT, "vcudatest_value");
    return next && next != vcudatest_value ? next() + 1 : -1;
}
