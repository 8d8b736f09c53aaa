/* Local memory and context limits (local_mem.c). */
#ifndef VCUDA_LOCAL_MEM_H
#define VCUDA_LOCAL_MEM_H

#include "hooks.h"

/* Context `ctx` is gone: what its local memory and limits were charged goes back. */
void vcuda_local_context_gone(CUcontext ctx);
void vcuda_local_reset_after_fork(void);

#endif
