/* Live allocations of this process: key (device pointer, VMM handle or array
 * handle) -> size, ledger device and context. Needed because a free names only
 * the pointer. Sharded open-addressing tables, one mutex per shard, so
 * concurrent threads rarely meet. */
#ifndef VCUDA_ALLOC_MAP_H
#define VCUDA_ALLOC_MAP_H

#include <stdbool.h>
#include <stdint.h>

enum vcuda_alloc_kind {
    VCUDA_ALLOC_PTR = 1,    /* cuMemAlloc*, managed, async: CUdeviceptr */
    VCUDA_ALLOC_HANDLE = 2, /* cuMemCreate: CUmemGenericAllocationHandle */
    VCUDA_ALLOC_ARRAY = 3,  /* cuArray*Create, cuMipmappedArrayCreate */
};

struct vcuda_alloc {
    uint64_t key;
    uint64_t bytes;
    void *ctx;
    int16_t dev; /* ledger device index */
    uint8_t kind;
};

/* Records an allocation; false only when memory for the table ran out. */
bool vcuda_alloc_insert(const struct vcuda_alloc *alloc);
/* Takes the record for (kind, key) out of the map; false if the shim never saw it. */
bool vcuda_alloc_take(uint8_t kind, uint64_t key, struct vcuda_alloc *out);
/* Takes every record of context `ctx` out, handing each to `fn`. */
void vcuda_alloc_take_context(void *ctx, void (*fn)(const struct vcuda_alloc *, void *), void *arg);
/* Forgets everything without freeing locks' owners (the child side of fork). */
void vcuda_alloc_reset_after_fork(void);

#endif
