#include "config.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "log.h"

struct vcuda_config vcuda_config;

/* One options table: the environment variable is "VCUDA_" + name. */
enum option_kind { OPT_QUANTITY, OPT_PERCENT, OPT_INT, OPT_STRING, OPT_BOOL, OPT_LOSS, OPT_LOG_LEVEL };

struct option {
    const char *name;
    enum option_kind kind;
    const char *fallback;   /* used when the variable is unset or empty */
    bool quota;             /* part of the quota: ignored while the quota file is in force */
    const char *description;
};

static const struct option options[] = {
    {"MEMORY_LIMIT", OPT_QUANTITY, "", true, "device memory limit per visible GPU (unset: unlimited)"},
    {"CORE_REQUEST", OPT_PERCENT, "100", true, "guaranteed share of GPU time, percent"},
    {"CORE_LIMIT", OPT_PERCENT, "", true, "cap on the share of GPU time, percent (default: request)"},
    {"SCHEDULER", OPT_STRING, "", true, "ZeroMQ endpoint of the GPU's token scheduler"},
    {"LEDGER", OPT_STRING, "", true, "the container's ledger file (unset: process-private)"},
    {"SCHEDULER_TIMEOUT_MS", OPT_INT, "5000", true,
     "how long the scheduler may stay silent before it counts as lost (a wait for the token is not)"},
    {"ON_SCHEDULER_LOSS", OPT_LOSS, "block", true, "block or run when the scheduler stays lost"},
    {"REAL_LIBCUDA", OPT_STRING, "libcuda.so.1", false, "path of the real CUDA driver library"},
    {"REAL_LIBNVML", OPT_STRING, "libnvidia-ml.so.1", false, "path of the real NVML library"},
    {"LOG_LEVEL", OPT_LOG_LEVEL, "warn", false, "error, warn, info or debug"},
    {"DISABLE", OPT_BOOL, "", true, "1: pure pass-through"},
};
#define OPTION_COUNT (sizeof options / sizeof options[0])

static void config_fail(const char *fmt, const char *a, const char *b) {
    if (vcuda_config.error[0]) return; /* keep the first error */
    snprintf(vcuda_config.error, sizeof vcuda_config.error, fmt, a, b);
}

int vcuda_quantity_parse(const char *text, uint64_t *bytes, const char **why) {
    static const struct { const char *suffix; double factor; } units[] = {
        {"Ki", 1024.0}, {"Mi", 1048576.0}, {"Gi", 1073741824.0}, {"Ti", 1099511627776.0},
        {"Pi", 1125899906842624.0}, {"k", 1e3}, {"K", 1e3}, {"M", 1e6}, {"G", 1e9},
        {"T", 1e12}, {"P", 1e15}, {"", 1.0},
    };
    const char *p = text;
    while (isspace((unsigned char)*p)) p++;
    if (*p == '\0') { *why = "empty value"; return -1; }
    if (*p == '-') { *why = "negative quantity"; return -1; }
    if (!isdigit((unsigned char)*p) && *p != '.') { *why = "not a number"; return -1; }
    /* Digits and at most one decimal point; strtod alone would accept hex and exponents. */
    const char *num_end = p;
    int dots = 0;
    while (isdigit((unsigned char)*num_end) || *num_end == '.') dots += *num_end++ == '.';
    if (dots > 1 || num_end == p || (num_end == p + 1 && *p == '.')) {
        *why = "not a number"; return -1;
    }
    const char *unit = num_end;
    const char *unit_end = unit;
    while (isalpha((unsigned char)*unit_end)) unit_end++;
    const char *rest = unit_end;
    while (isspace((unsigned char)*rest)) rest++;
    if (*rest != '\0') { *why = "unexpected characters after the unit"; return -1; }
    size_t unit_len = (size_t)(unit_end - unit);
    double factor = 0.0;
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (strlen(units[i].suffix) == unit_len && strncmp(units[i].suffix, unit, unit_len) == 0) {
            factor = units[i].factor;
            break;
        }
    }
    if (factor == 0.0) { *why = "unknown unit (use Ki, Mi, Gi, Ti, k, M, G, T or plain bytes)"; return -1; }
    if (dots == 0 && factor == 1.0) {
        errno = 0;
        unsigned long long v = strtoull(p, NULL, 10);
        if (errno == ERANGE) { *why = "too large"; return -1; }
        *bytes = v;
        return 0;
    }
    double v = strtod(p, NULL) * factor;
    if (!(v < 18446744073709549568.0)) { *why = "too large"; return -1; }
    double whole = floor(v);
    if (v - whole > 1e-6 * (v > 1 ? v : 1)) { *why = "not a whole number of bytes"; return -1; }
    *bytes = (uint64_t)whole;
    return 0;
}

static void set_option(const struct option *opt, const char *value, const char *env_name) {
    const char *why = NULL;
    switch (opt->kind) {
    case OPT_QUANTITY: {
        uint64_t bytes = VCUDA_UNLIMITED;
        if (*value && vcuda_quantity_parse(value, &bytes, &why) != 0) {
            char detail[256];
            snprintf(detail, sizeof detail, "%s (\"%s\")", why, value);
            config_fail("%s is invalid: %s; memory quotas cannot be enforced", env_name, detail);
        }
        for (int i = 0; i < VCUDA_MAX_DEVICES; i++) vcuda_config.memory_limit[i] = bytes;
        break;
    }
    case OPT_PERCENT:
    case OPT_INT: {
        if (!*value) break;
        char *end = NULL;
        errno = 0;
        long v = strtol(value, &end, 10);
        bool bad = errno != 0 || end == value || *end != '\0';
        if (opt->kind == OPT_PERCENT && (v < 1 || v > 100)) bad = true;
        if (opt->kind == OPT_INT && v < 0) bad = true;
        if (bad) {
            config_fail("%s is invalid (\"%s\"): expected a whole number in range", env_name, value);
            break;
        }
        if (strcmp(opt->name, "CORE_REQUEST") == 0) vcuda_config.core_request = (int)v;
        else if (strcmp(opt->name, "CORE_LIMIT") == 0) vcuda_config.core_limit = (int)v;
        else vcuda_config.scheduler_timeout_ms = (int)v;
        break;
    }
    case OPT_STRING: {
        char *dst = NULL;
        size_t cap = 0;
        if (strcmp(opt->name, "SCHEDULER") == 0) { dst = vcuda_config.scheduler; cap = sizeof vcuda_config.scheduler; }
        else if (strcmp(opt->name, "LEDGER") == 0) { dst = vcuda_config.ledger; cap = sizeof vcuda_config.ledger; }
        else if (strcmp(opt->name, "REAL_LIBCUDA") == 0) { dst = vcuda_config.real_libcuda; cap = sizeof vcuda_config.real_libcuda; }
        else { dst = vcuda_config.real_libnvml; cap = sizeof vcuda_config.real_libnvml; }
        if (strlen(value) >= cap) config_fail("%s is too long (\"%s\")", env_name, value);
        else strcpy(dst, value);
        break;
    }
    case OPT_BOOL:
        vcuda_config.disabled = strcmp(value, "1") == 0 || strcmp(value, "true") == 0;
        break;
    case OPT_LOSS:
        if (strcmp(value, "block") == 0) vcuda_config.on_scheduler_loss = VCUDA_LOSS_BLOCK;
        else if (strcmp(value, "run") == 0) vcuda_config.on_scheduler_loss = VCUDA_LOSS_RUN;
        else config_fail("%s is invalid (\"%s\"): expected block or run", env_name, value);
        break;
    case OPT_LOG_LEVEL: {
        static const char *const levels[] = {"error", "warn", "info", "debug"};
        int found = -1;
        for (int i = 0; i < 4; i++) if (strcmp(value, levels[i]) == 0) found = i;
        if (found < 0) vcuda_warn("%s=\"%s\" is not error, warn, info or debug; using warn", env_name, value);
        else vcuda_log_threshold = found;
        break;
    }
    }
}

/* The quota file is in force when its directory exists. Anything but "no such
 * directory" counts as existing: the file read then says what is wrong. */
static bool quota_dir_exists(void) {
    struct stat st;
    return stat(VCUDA_QUOTA_DIR, &st) == 0 || (errno != ENOENT && errno != ENOTDIR);
}

/* A quota variable set while the file is in force: named in one warning. */
static void note_ignored(const char *env_name) {
    size_t used = strlen(vcuda_config.ignored);
    snprintf(vcuda_config.ignored + used, sizeof vcuda_config.ignored - used, "%s%s", used ? "," : "", env_name);
}

/* The node's word: the file is the only source of the quota. Any problem
 * fails closed (vcuda_config.error): never unlimited. */
static void load_quota_file(void) {
    struct vcuda_quota_file *q = &vcuda_config.file;
    char why[384];
    if (vcuda_quota_file_read(VCUDA_QUOTA_FILE, q, why, sizeof why) != 0) {
        config_fail("quota file %s: %s; CUDA is refused rather than run without this container's quota",
                    VCUDA_QUOTA_FILE, why);
        return;
    }
    snprintf(vcuda_config.ledger, sizeof vcuda_config.ledger, "%s", q->ledger);
    vcuda_config.core_request = q->core_request;
    vcuda_config.core_limit = q->core_limit;
    vcuda_config.scheduler_timeout_ms = q->scheduler_timeout_ms;
    vcuda_config.on_scheduler_loss = q->on_loss_run ? VCUDA_LOSS_RUN : VCUDA_LOSS_BLOCK;
}

/* VCUDA_SCHEDULER_<i> and VCUDA_MEMORY_LIMIT_<i>: overrides for visible device i. */
static void load_device_env(int i) {
    char sched_name[64], limit_name[64];
    snprintf(sched_name, sizeof sched_name, "VCUDA_SCHEDULER_%d", i);
    snprintf(limit_name, sizeof limit_name, "VCUDA_MEMORY_LIMIT_%d", i);
    const char *endpoint = getenv(sched_name);
    const char *value = getenv(limit_name);
    if (vcuda_config.from_file) {
        if (endpoint) note_ignored(sched_name);
        if (value) note_ignored(limit_name);
        return;
    }
    if (endpoint == NULL || *endpoint == '\0') endpoint = vcuda_config.scheduler;
    if (strlen(endpoint) >= sizeof vcuda_config.scheduler_dev[i]) config_fail("%s is too long (\"%s\")", sched_name, endpoint);
    else strcpy(vcuda_config.scheduler_dev[i], endpoint);
    if (value == NULL || *value == '\0') return;
    const char *why = NULL;
    uint64_t bytes = 0;
    if (vcuda_quantity_parse(value, &bytes, &why) != 0) {
        char detail[256];
        snprintf(detail, sizeof detail, "%s (\"%s\")", why, value);
        config_fail("%s is invalid: %s; memory quotas cannot be enforced", limit_name, detail);
    } else {
        vcuda_config.memory_limit[i] = bytes;
    }
}

void vcuda_config_load(void) {
    memset(&vcuda_config, 0, sizeof vcuda_config);
    vcuda_config.core_request = 100;
    for (int i = 0; i < VCUDA_MAX_DEVICES; i++) vcuda_config.memory_limit[i] = VCUDA_UNLIMITED;
    vcuda_config.from_file = quota_dir_exists();
    for (size_t i = 0; i < OPTION_COUNT; i++) {
        char env_name[64];
        snprintf(env_name, sizeof env_name, "VCUDA_%s", options[i].name);
        const char *value = getenv(env_name);
        if (vcuda_config.from_file && options[i].quota) {
            if (value) note_ignored(env_name);
            continue;
        }
        if (value == NULL || *value == '\0') value = options[i].fallback;
        set_option(&options[i], value, env_name);
    }
    if (vcuda_config.from_file) {
        load_quota_file();
    } else {
        if (vcuda_config.core_limit == 0) vcuda_config.core_limit = vcuda_config.core_request;
        if (vcuda_config.core_limit < vcuda_config.core_request)
            config_fail("VCUDA_CORE_LIMIT must be at least VCUDA_CORE_REQUEST%s%s", "", "");
    }
    const char *visible = getenv("CUDA_VISIBLE_DEVICES");
    vcuda_config.cuda_visible_devices_set = visible != NULL && *visible != '\0';
    for (int i = 0; i < VCUDA_MAX_DEVICES; i++) load_device_env(i);
}

bool vcuda_config_device(int ordinal, const char *uuid, uint64_t *memory_limit, const char **scheduler) {
    if (vcuda_config.from_file) {
        const struct vcuda_quota_gpu *g = vcuda_quota_file_gpu(&vcuda_config.file, uuid);
        if (g == NULL) return false;
        if (memory_limit) *memory_limit = g->memory;
        if (scheduler) *scheduler = g->scheduler;
        return true;
    }
    int i = ordinal >= 0 && ordinal < VCUDA_MAX_DEVICES ? ordinal : 0;
    if (memory_limit) *memory_limit = vcuda_config.memory_limit[i];
    if (scheduler) *scheduler = vcuda_config.scheduler_dev[i];
    return true;
}

void vcuda_config_warn_ignored(void) {
    static _Atomic int warned; /* kept across fork: a child of a warned process does not repeat it */
    if (vcuda_config.ignored[0] == '\0' || atomic_exchange(&warned, 1)) return;
    vcuda_warn("ignoring %s: this container's quota comes from %s", vcuda_config.ignored, VCUDA_QUOTA_FILE);
}

/* snprintf at buf + *used, keeping *used the length the full text needs. */
static void append(char *buf, unsigned long len, int *used, const char *fmt, ...) __attribute__((format(printf, 4, 5)));
static void append(char *buf, unsigned long len, int *used, const char *fmt, ...) {
    unsigned long at = (unsigned long)*used < len ? (unsigned long)*used : len;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(len > at ? buf + at : NULL, len > at ? len - at : 0, fmt, ap);
    va_end(ap);
    if (n > 0) *used += n;
}

int vcuda_config_describe(char *buf, unsigned long len) {
    char limit[32];
    if (vcuda_config.memory_limit[0] == VCUDA_UNLIMITED) snprintf(limit, sizeof limit, "unlimited");
    else snprintf(limit, sizeof limit, "%llu", (unsigned long long)vcuda_config.memory_limit[0]);
    bool file = vcuda_config.from_file;
    int used = 0;
    if (len) buf[0] = '\0';
    append(buf, len, &used,
           "VCUDA_DISABLE=%d\nVCUDA_MEMORY_LIMIT=%s\nVCUDA_CORE_REQUEST=%d\nVCUDA_CORE_LIMIT=%d\n"
           "VCUDA_SCHEDULER=%s\nVCUDA_LEDGER=%s\nVCUDA_SCHEDULER_TIMEOUT_MS=%d\n"
           "VCUDA_ON_SCHEDULER_LOSS=%s\nVCUDA_REAL_LIBCUDA=%s\nVCUDA_REAL_LIBNVML=%s\n"
           "VCUDA_LOG_LEVEL=%d\nerror=%s\n",
           vcuda_config.disabled, file ? "per-gpu" : limit, vcuda_config.core_request, vcuda_config.core_limit,
           file ? "per-gpu" : vcuda_config.scheduler, vcuda_config.ledger, vcuda_config.scheduler_timeout_ms,
           vcuda_config.on_scheduler_loss == VCUDA_LOSS_RUN ? "run" : "block",
           vcuda_config.real_libcuda, vcuda_config.real_libnvml, vcuda_log_threshold,
           vcuda_config.error);
    /* Where the quota comes from, for `vcuda doctor`. */
    append(buf, len, &used, "source=%s\nignored=%s\n", file ? VCUDA_QUOTA_FILE : "environment",
           vcuda_config.ignored);
    if (!file) return used;
    append(buf, len, &used, "priority=%s\n", vcuda_config.file.priority_high ? "high" : "normal");
    for (int i = 0; i < vcuda_config.file.ngpus; i++) {
        char line[sizeof vcuda_config.file.gpus[i].uuid + sizeof vcuda_config.file.gpus[i].scheduler + 64];
        vcuda_quota_gpu_line(&vcuda_config.file.gpus[i], line, sizeof line);
        append(buf, len, &used, "%s\n", line);
    }
    return used;
}
