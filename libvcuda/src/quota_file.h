/* The container quota file ("the node's word"): in Kubernetes modes the node
 * agent writes each container's quota to a file the container sees read-only
 * at a fixed path; when its directory exists it is the only source of the
 * quota (README "Environment read by libvcuda"). The path is compiled in, with
 * no environment override: an override would let a tenant point it elsewhere.
 *
 * Format, version 1 (the same as py_vcuda/quota_file.py writes): one key=value
 * per line, `#` comment and blank lines ignored, `version=1` the first key,
 * `end` the last line (a truncated file is corrupt):
 *
 *     version=1
 *     ledger=/run/vcuda/ledger
 *     core_request=30
 *     core_limit=60
 *     priority=normal
 *     scheduler_timeout_ms=5000          (optional)
 *     on_scheduler_loss=block            (optional: block or run)
 *     gpu=GPU-<uuid> memory=<bytes|unlimited> scheduler=<endpoint or empty>
 *     end
 *
 * Anything else (an unknown key, a repeated one, a bad value, a missing
 * required key) is corrupt; the caller then fails closed. */
#ifndef VCUDA_QUOTA_FILE_H
#define VCUDA_QUOTA_FILE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VCUDA_QUOTA_DIR "/run/vcuda-quota"
#define VCUDA_QUOTA_FILE VCUDA_QUOTA_DIR "/quota.conf"
#define VCUDA_QUOTA_VERSION 1
#define VCUDA_QUOTA_MAX_GPUS 16
#define VCUDA_QUOTA_MAX_BYTES 65536 /* a larger file is not one the node agent wrote */

struct vcuda_quota_gpu {
    char uuid[48];       /* "GPU-..." or "MIG-..." */
    uint64_t memory;     /* bytes; UINT64_MAX: unlimited */
    char scheduler[256]; /* empty: not time-limited */
};

struct vcuda_quota_file {
    char ledger[4096];
    int core_request;
    int core_limit;
    bool priority_high;
    int scheduler_timeout_ms;
    bool on_loss_run; /* on_scheduler_loss=run */
    int ngpus;
    struct vcuda_quota_gpu gpus[VCUDA_QUOTA_MAX_GPUS];
};

/* Parses `len` bytes of file text. 0 on success; -1 with the reason (naming
 * the line) in `why` otherwise. Allocation-free. */
int vcuda_quota_file_parse(const char *text, size_t len, struct vcuda_quota_file *q, char *why, size_t whylen);

/* Reads and parses the file at `path` (open/read, no stdio: this runs in the
 * library constructor). 0 on success; -1 with the reason in `why`. */
int vcuda_quota_file_read(const char *path, struct vcuda_quota_file *q, char *why, size_t whylen);

/* One gpu line as the file writes it ("gpu=<uuid> memory=<bytes|unlimited>
 * scheduler=<endpoint>", no newline); snprintf's return. */
int vcuda_quota_gpu_line(const struct vcuda_quota_gpu *g, char *out, size_t len);

/* The whole file as the node agent writes it (every optional key included);
 * snprintf's return. Parsing it gives `q` back. */
int vcuda_quota_file_format(const struct vcuda_quota_file *q, char *out, size_t len);

/* The entry of `uuid` ("GPU-<hex>" as libvcuda formats a CUuuid, or NVML's
 * "GPU-"/"MIG-" string), or NULL when the file does not name it. Matched on
 * the part after the prefix: the driver hands out the same 16 bytes for a MIG
 * instance that NVML writes as "MIG-...". */
const struct vcuda_quota_gpu *vcuda_quota_file_gpu(const struct vcuda_quota_file *q, const char *uuid);

#endif
