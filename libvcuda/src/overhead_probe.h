/* What NVML shows of one device around a context creation, and the context
 * overhead that follows from two such views (context.c). */
#ifndef VCUDA_OVERHEAD_PROBE_H
#define VCUDA_OVERHEAD_PROBE_H

#include <stdbool.h>
#include <stdint.h>

#include "hooks.h"

#define VCUDA_PROBE_PROCS 64

struct vcuda_overhead_probe {
    uint64_t free; /* device-wide free bytes; UINT64_MAX: NVML cannot tell */
    int nprocs;    /* processes on the device; -1: no list (too many, or NVML cannot) */
    unsigned pid[VCUDA_PROBE_PROCS];
    uint64_t used[VCUDA_PROBE_PROCS]; /* NVML_VALUE_NOT_AVAILABLE where NVML hides it */
    bool settled;  /* the list read just after the free memory was the same */
};

/* A view that measures nothing (the overhead is already known). */
void vcuda_probe_clear(struct vcuda_overhead_probe *p);
void vcuda_probe_take(CUdevice ordinal, struct vcuda_overhead_probe *p);

/* The bytes one context creation between `before` and `after` took, or false
 * when the views cannot tell. *exact is false when other processes created
 * contexts meanwhile (the figure is then their average), or when a view never
 * settled: good to charge but not to record for later processes. */
bool vcuda_probe_overhead(const struct vcuda_overhead_probe *before,
                          const struct vcuda_overhead_probe *after, uint64_t *bytes, bool *exact);

#endif
