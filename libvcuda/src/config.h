/* Effective configuration, read once from the environment when the library is
 * loaded (DESIGN.md "Environment read by libvcuda"). Nothing on a hot path reads
 * the environment. */
#ifndef VCUDA_CONFIG_H
#define VCUDA_CONFIG_H

#include <stdbool.h>
#include <stdint.h>

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
    /* First configuration error, reported once and returned by every CUDA call. */
    char error[512];
};

extern struct vcuda_config vcuda_config;

/* Read the environment into vcuda_config (called by the library constructor). */
void vcuda_config_load(void);

/* Parse a byte quantity: plain bytes, or a number (decimal fraction allowed) with
 * a binary (Ki Mi Gi Ti Pi) or decimal (k K M G T P) suffix. Returns 0 on success,
 * -1 with a reason in `why` otherwise. */
int vcuda_quantity_parse(const char *text, uint64_t *bytes, const char **why);

/* Write every effective option as `NAME=value` lines into buf. */
int vcuda_config_describe(char *buf, unsigned long len);

#endif
