/* Charging this process's ledger slot: the one door every memory hook uses
 * (DESIGN.md "Memory"). A request that does not fit first makes this process
 * give back what its stream-ordered pools and graph memory cache on that
 * device ("trim before deny", pool.c and graph_mem.c), then is tried once
 * more; only then is it refused and counted as an OOM denial. */
#ifndef VCUDA_QUOTA_H
#define VCUDA_QUOTA_H

#include <stdbool.h>
#include <stdint.h>

/* Charges `bytes` on ledger device `dev` if they fit under `limit`. */
bool vcuda_quota_take(int dev, uint64_t bytes, uint64_t limit);
/* Returns bytes charged earlier. */
void vcuda_quota_give(int dev, uint64_t bytes);
/* Charges what the driver already holds, whatever the limit says: the ledger
 * must never show less than the device holds. */
void vcuda_quota_force(int dev, uint64_t bytes);

/* For an owner of cached memory (a pool, the graph reserve), whose lock the
 * caller holds: charges what missing(owner) says it lacks. When that does not
 * fit, the owner is trimmed first (trim(owner)), then this process's others;
 * *charged says how much was charged. false: refused, nothing charged. */
bool vcuda_quota_cover(int dev, uint64_t limit, void *owner, uint64_t (*missing)(const void *owner),
                       void (*trim)(void *owner), uint64_t *charged);
/* The owner this thread is covering, trimmed already: the trims skip it. */
extern __thread const void *vcuda_quota_covering;

#endif
