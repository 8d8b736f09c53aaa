/* libvcuda's public control API: the only non-driver names the library
 * exports besides dlsym. py_vcuda binds it with cffi (py_vcuda/_native.py
 * mirrors these declarations). Every function is safe to call in a process
 * that never touches CUDA. */
#ifndef VCUDA_H
#define VCUDA_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define VCUDA_API __attribute__((visibility("default")))

/* Version of the library, e.g. "0.1.0"; py_vcuda refuses a different one. */
VCUDA_API const char *vcuda_version(void);

/* Parses a quantity ("512Mi", "4Gi", "1.5Gi", "4G", "1048576") into bytes.
 * 0 on success; -1 with the reason in err otherwise. */
VCUDA_API int vcuda_parse_quantity(const char *text, uint64_t *bytes, char *err, size_t errlen);

/* The effective configuration of this process as NAME=value lines. */
VCUDA_API int vcuda_config_text(char *buf, size_t len);

/* Parses the text of a container quota file (/run/vcuda-quota/quota.conf,
 * format version 1) as libvcuda reads it. 0 with the file as libvcuda
 * understood it written back in its canonical form in out; -1 with the
 * reason (naming the line) in out otherwise. */
VCUDA_API int vcuda_quota_parse(const char *text, size_t len, char *out, size_t outlen);

/* ---- ledger files (read by metrics and `vcuda top`, written by the plugin) ---- */

typedef struct vcuda_ledger_map vcuda_ledger_map;

#define VCUDA_UUID_LEN 48
#define VCUDA_LEDGER_DEVICES 16

typedef struct {
    char uuid[VCUDA_UUID_LEN];
    int32_t index; /* record index: vcuda_process_usage.used[index] */
    int32_t reserved;
    uint64_t limit; /* UINT64_MAX: unlimited */
    uint64_t used;
    uint64_t peak;
    uint64_t oom_denials;
    uint64_t context_overhead;
    uint64_t unattributed; /* part of used: what the reconciler found that no hook charged */
} vcuda_device_usage;

typedef struct {
    int32_t pid;
    int32_t alive;
    uint64_t start_time;
    uint64_t used[VCUDA_LEDGER_DEVICES]; /* by device record index */
} vcuda_process_usage;

/* Maps a ledger file; NULL with a message naming the path in err on failure. */
VCUDA_API vcuda_ledger_map *vcuda_ledger_open_file(const char *path, int create, char *err, size_t errlen);
VCUDA_API void vcuda_ledger_close_file(vcuda_ledger_map *ledger);
/* Device records in index order; returns the number written (at most max). */
VCUDA_API int vcuda_ledger_read_devices(vcuda_ledger_map *ledger, vcuda_device_usage *out, int max);
/* Process slots in use; returns the number written (at most max). */
VCUDA_API int vcuda_ledger_read_processes(vcuda_ledger_map *ledger, vcuda_process_usage *out, int max);
/* Returns the usage of processes that are gone; the number of slots freed. */
VCUDA_API int vcuda_ledger_reclaim_dead(vcuda_ledger_map *ledger);
/* Sets the limit recorded for a device (creating its record); -1 when full. */
VCUDA_API int vcuda_ledger_set_limit(vcuda_ledger_map *ledger, const char *uuid, uint64_t limit);
/* Sets the bytes of the device (creating its record) that the memory
 * reconciler found in use but no hook charged; `used` moves by the change,
 * so later allocations must fit beneath it. -1 when the ledger is full. */
VCUDA_API int vcuda_ledger_set_unattributed(vcuda_ledger_map *ledger, const char *uuid, uint64_t bytes);

#ifdef __cplusplus
}
#endif
#endif
