/* Live contexts of this process and the overhead charged for each. */
#ifndef VCUDA_CONTEXT_H
#define VCUDA_CONTEXT_H

#include <stdbool.h>

#include "hooks.h"

bool vcuda_context_lookup(CUcontext ctx, CUdevice *ordinal);
void vcuda_context_reset_after_fork(void);
/* Live contexts of this process (at most max); returns how many. */
int vcuda_contexts_snapshot(CUcontext *out, int max);

#endif
