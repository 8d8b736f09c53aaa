/* Stream-ordered pools, charged by what they reserve (pool.c). */
#ifndef VCUDA_POOL_H
#define VCUDA_POOL_H

#include <stdint.h>

#include "hooks.h"

/* Trim before deny: trims this process's pools on ledger device `dev` down to
 * what their live allocations need; returns the bytes given back. */
uint64_t vcuda_pools_trim(int dev);
/* A context of device `ordinal` went away: true the charge of its pools. */
void vcuda_pools_refresh_device(CUdevice ordinal);
/* The child side of fork: the parent's pools are not the child's. */
void vcuda_pools_reset_after_fork(void);

#endif
