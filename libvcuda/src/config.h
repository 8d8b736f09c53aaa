/* Effective configuration, read once when the library is loaded: from the
 * container quota file when its directory exists (quota_file.h), else from the
 * environment (DESIGN.md "Environment read by libvcuda"). Nothing on a hot
 * path reads either. */
#ifndef VCUDA_CONFIG_H
#define VCUDA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

#include "quota_file.h"

#define VCUDA_MAX_DEVICES 16
#define VCUDA_UNLIMITED UINT64_MAX

enum vcuda_loss_policy { VCUDA_LOSS_BLOCK = 0, VCUDA_LOSS_RUN = 1 };

struct vcuda_config {
    bool disabled;                                  /* VCUDA_DISABLE=1: pure pass-through */
    uint64_t memory_limit[VCUDA_MAX_DEVICES];       /* per visible device index, bytes */
    int core_request;                               /* percent */
    int core_limit;                                 /* percent */
    char scheduler[256];                            /* every visible device without its own: */
    char scheduler_dev[VCUDA_MAX_DEVICES][256];     /* VCUDA_SCHEDULER_<i>, visible device i */
    char ledger[4096];                              /* empty: process-private ledger */
    int scheduler_timeout_ms;
    enum vcuda_loss_policy on_scheduler_loss;
    char real_libcuda[4096];
    char real_libnvml[4096];
    bool cuda_visible_devices_set;                  /* CUDA_VISIBLE_DEVICES renumbers devices */
    /* The quota file is in force: the quota is `file`'s, by GPU UUID, and the
     * per-index memory_limit/scheduler_dev above are unused. */
    bool from_file;
    struct vcuda_quota_file file;
    char ignored[1536];                             /* quota variables the file overrode, comma-separated */
    /* First configuration error, reported once and returned by every CUDA call. */
    char error[512];
};

extern struct vcuda_config vcuda_config;

/* Read the quota file or the environment into vcuda_config (called by the
 * library constructor). */
void vcuda_config_load(void);

/* The one lookup of a device's quota: CUDA device `ordinal`, whose UUID is
 * `uuid` (NULL when not read yet). With the quota file in force, the file's
 * entry for that UUID; otherwise the environment's for visible index
 * `ordinal`. Returns false when the file is in force and does not name the
 * device (or its UUID is not known): not this container's GPU. Either output
 * may be NULL; *scheduler is "" for a GPU that is not time-limited. */
bool vcuda_config_device(int ordinal, const char *uuid, uint64_t *memory_limit, const char **scheduler);

/* Logs, once per process tree, the quota variables the file overrode (at the
 * first CUDA call, not at load: every process of a container loads us). */
void vcuda_config_warn_ignored(void);

/* Parse a byte quantity: plain bytes, or a number (decimal fraction allowed) with
 * a binary (Ki Mi Gi Ti Pi) or decimal (k K M G T P) suffix. Returns 0 on success,
 * -1 with a reason in `why` otherwise. */
int vcuda_quantity_parse(const char *text, uint64_t *bytes, const char **why);

/* Write every effective option as `NAME=value` lines into buf. */
int vcuda_config_describe(char *buf, unsigned long len);

#endif
