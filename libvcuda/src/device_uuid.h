/* Naming one device, however it is named. The driver hands out a MIG
 * instance's UUID as the same 16 bytes that NVML and the node agent write as
 * "MIG-<hex>"; libvcuda formats a CUuuid as "GPU-<hex>". So two names are the
 * same device when they are equal, or when both carry a GPU-/MIG- prefix and
 * agree after it. The ledger and the quota file both match names this way. */
#ifndef VCUDA_DEVICE_UUID_H
#define VCUDA_DEVICE_UUID_H

#include <stdbool.h>
#include <stddef.h>
#include <string.h>

static inline bool vcuda_uuid_has_prefix(const char *uuid) {
    return strncmp(uuid, "GPU-", 4) == 0 || strncmp(uuid, "MIG-", 4) == 0;
}

/* Compares at most `len` bytes, as strncmp does. */
static inline bool vcuda_same_device(const char *a, const char *b, size_t len) {
    if (strncmp(a, b, len) == 0) return true;
    return len > 4 && a[0] && vcuda_uuid_has_prefix(a) && vcuda_uuid_has_prefix(b) &&
           strncmp(a + 4, b + 4, len - 4) == 0;
}

#endif
