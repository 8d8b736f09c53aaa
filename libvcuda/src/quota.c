#include "quota.h"

#include "graph_mem.h"
#include "pool.h"
#include "process.h"

__thread const void *vcuda_quota_covering;

bool vcuda_quota_take(int dev, uint64_t bytes, uint64_t limit) {
    struct vcuda_ledger *ledger = &vcuda_proc.ledger;
    if (vcuda_ledger_reserve_quiet(ledger, vcuda_proc.slot, dev, bytes, limit)) return true;
    /* Trim before deny: cached pool and graph memory is this process's own. */
    uint64_t freed = vcuda_pools_trim(dev) + vcuda_graph_mem_trim(dev);
    if (freed > 0 && vcuda_ledger_reserve_quiet(ledger, vcuda_proc.slot, dev, bytes, limit)) return true;
    vcuda_ledger_count_denial(ledger, dev);
    return false;
}

void vcuda_quota_give(int dev, uint64_t bytes) {
    if (bytes) vcuda_ledger_release(&vcuda_proc.ledger, vcuda_proc.slot, dev, bytes);
}

void vcuda_quota_force(int dev, uint64_t bytes) {
    if (bytes) vcuda_ledger_reserve_quiet(&vcuda_proc.ledger, vcuda_proc.slot, dev, bytes, VCUDA_UNLIMITED);
}

bool vcuda_quota_cover(int dev, uint64_t limit, void *owner, uint64_t (*missing)(const void *owner),
                       void (*trim)(void *owner), uint64_t *charged) {
    uint64_t bytes = missing(owner);
    *charged = 0;
    if (bytes == 0 || vcuda_ledger_reserve_quiet(&vcuda_proc.ledger, vcuda_proc.slot, dev, bytes, limit)) {
        *charged = bytes;
        return true;
    }
    trim(owner);
    bytes = missing(owner);
    vcuda_quota_covering = owner;
    bool ok = bytes == 0 || vcuda_quota_take(dev, bytes, limit);
    vcuda_quota_covering = NULL;
    if (ok) *charged = bytes;
    return ok;
}
