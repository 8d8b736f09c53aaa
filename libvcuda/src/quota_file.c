#include "quota_file.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "device_uuid.h"

/* Scalar keys, each at most once; gpu repeats. */
enum key { K_VERSION, K_LEDGER, K_CORE_REQUEST, K_CORE_LIMIT, K_PRIORITY, K_TIMEOUT, K_LOSS, K_GPU, K_COUNT };
static const char *const key_names[K_COUNT] = {
    "version", "ledger", "core_request", "core_limit", "priority", "scheduler_timeout_ms", "on_scheduler_loss", "gpu",
};

struct parser {
    struct vcuda_quota_file *q;
    char *why;
    size_t whylen;
    int line;
    bool seen[K_COUNT];
    bool ended;
};

static int fail(struct parser *p, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int fail(struct parser *p, const char *fmt, ...) {
    int n = p->line ? snprintf(p->why, p->whylen, "line %d: ", p->line) : 0;
    if (n < 0 || (size_t)n >= p->whylen) n = 0;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(p->why + n, p->whylen - (size_t)n, fmt, ap);
    va_end(ap);
    return -1;
}

/* A whole number in [min, max] written as plain decimal digits. */
static bool parse_number(const char *s, size_t len, unsigned long long max, unsigned long long *out) {
    if (len == 0 || len > 20) return false;
    unsigned long long v = 0;
    for (size_t i = 0; i < len; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (max - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = v;
    return true;
}

static bool is(const char *s, size_t len, const char *word) { return strlen(word) == len && memcmp(s, word, len) == 0; }

/* Copies a value into a fixed buffer; false when it does not fit. */
static bool copy(char *dst, size_t cap, const char *s, size_t len) {
    if (len >= cap) return false;
    memcpy(dst, s, len);
    dst[len] = '\0';
    return true;
}

static int percent(struct parser *p, const char *key, const char *v, size_t len, int *out) {
    unsigned long long n;
    if (!parse_number(v, len, 100, &n) || n < 1)
        return fail(p, "%s=\"%.*s\" is not a whole number from 1 to 100", key, (int)len, v);
    *out = (int)n;
    return 0;
}

/* gpu=<uuid> memory=<bytes|unlimited> scheduler=<endpoint or empty> */
static int parse_gpu(struct parser *p, const char *v, size_t len) {
    struct vcuda_quota_file *q = p->q;
    if (q->ngpus >= VCUDA_QUOTA_MAX_GPUS) return fail(p, "more than %d gpu lines", VCUDA_QUOTA_MAX_GPUS);
    struct vcuda_quota_gpu *g = &q->gpus[q->ngpus];
    const char *end = v + len;
    const char *sp1 = memchr(v, ' ', len);
    if (sp1 == NULL) return fail(p, "gpu line has no memory= field");
    size_t ulen = (size_t)(sp1 - v);
    if (ulen <= 4 || (memcmp(v, "GPU-", 4) != 0 && memcmp(v, "MIG-", 4) != 0))
        return fail(p, "gpu \"%.*s\" is not a GPU-... or MIG-... UUID", (int)ulen, v);
    if (!copy(g->uuid, sizeof g->uuid, v, ulen)) return fail(p, "gpu UUID \"%.*s\" is too long", (int)ulen, v);
    const char *mem = sp1 + 1;
    if ((size_t)(end - mem) < 7 || memcmp(mem, "memory=", 7) != 0)
        return fail(p, "gpu %s: expected \" memory=\" after the UUID", g->uuid);
    mem += 7;
    const char *sp2 = memchr(mem, ' ', (size_t)(end - mem));
    if (sp2 == NULL) return fail(p, "gpu %s has no scheduler= field", g->uuid);
    size_t mlen = (size_t)(sp2 - mem);
    unsigned long long bytes;
    if (is(mem, mlen, "unlimited")) g->memory = UINT64_MAX;
    else if (parse_number(mem, mlen, UINT64_MAX - 1, &bytes)) g->memory = bytes;
    else return fail(p, "gpu %s: memory=\"%.*s\" is not a number of bytes or unlimited", g->uuid, (int)mlen, mem);
    const char *sched = sp2 + 1;
    if ((size_t)(end - sched) < 10 || memcmp(sched, "scheduler=", 10) != 0)
        return fail(p, "gpu %s: expected \" scheduler=\" after memory", g->uuid);
    sched += 10;
    size_t slen = (size_t)(end - sched);
    if (memchr(sched, ' ', slen) != NULL) return fail(p, "gpu %s: unexpected text after the scheduler", g->uuid);
    if (!copy(g->scheduler, sizeof g->scheduler, sched, slen)) return fail(p, "gpu %s: scheduler too long", g->uuid);
    if (vcuda_quota_file_gpu(q, g->uuid) != NULL) return fail(p, "gpu %s named twice", g->uuid); /* earlier lines */
    q->ngpus++;
    return 0;
}

static int parse_line(struct parser *p, const char *s, size_t len) {
    struct vcuda_quota_file *q = p->q;
    size_t lead = 0;
    while (lead < len && (s[lead] == ' ' || s[lead] == '\t')) lead++;
    if (lead == len || s[lead] == '#') return 0; /* blank or comment */
    if (p->ended) return fail(p, "text after end");
    if (is(s, len, "end")) {
        if (!p->seen[K_VERSION]) return fail(p, "end before version=1");
        p->ended = true;
        return 0;
    }
    const char *eq = memchr(s, '=', len);
    if (eq == NULL) return fail(p, "\"%.*s\" is not key=value", (int)(len > 64 ? 64 : len), s);
    size_t klen = (size_t)(eq - s);
    const char *v = eq + 1;
    size_t vlen = len - klen - 1;
    int key = -1;
    for (int k = 0; k < K_COUNT; k++)
        if (is(s, klen, key_names[k])) key = k;
    if (key < 0) return fail(p, "unknown key \"%.*s\"", (int)(klen > 64 ? 64 : klen), s);
    if (!p->seen[K_VERSION] && key != K_VERSION) return fail(p, "the first key must be version, not %s", key_names[key]);
    if (key != K_GPU && p->seen[key]) return fail(p, "%s given twice", key_names[key]);
    p->seen[key] = true;
    unsigned long long n;
    switch ((enum key)key) {
    case K_VERSION:
        if (!parse_number(v, vlen, INT_MAX, &n)) return fail(p, "version=\"%.*s\" is not a number", (int)vlen, v);
        if (n != VCUDA_QUOTA_VERSION)
            return fail(p, "version %llu, this libvcuda reads %d", n, VCUDA_QUOTA_VERSION);
        return 0;
    case K_LEDGER:
        if (vlen == 0 || v[0] != '/' || memchr(v, ' ', vlen) || memchr(v, '\t', vlen))
            return fail(p, "ledger=\"%.*s\" is not an absolute path without spaces", (int)vlen, v);
        if (!copy(q->ledger, sizeof q->ledger, v, vlen)) return fail(p, "ledger path too long");
        return 0;
    case K_CORE_REQUEST: return percent(p, "core_request", v, vlen, &q->core_request);
    case K_CORE_LIMIT: return percent(p, "core_limit", v, vlen, &q->core_limit);
    case K_PRIORITY:
        if (is(v, vlen, "high")) q->priority_high = true;
        else if (is(v, vlen, "normal")) q->priority_high = false;
        else return fail(p, "priority=\"%.*s\" is not high or normal", (int)vlen, v);
        return 0;
    case K_TIMEOUT:
        if (!parse_number(v, vlen, INT_MAX, &n))
            return fail(p, "scheduler_timeout_ms=\"%.*s\" is not a whole number of milliseconds", (int)vlen, v);
        q->scheduler_timeout_ms = (int)n;
        return 0;
    case K_LOSS:
        if (is(v, vlen, "run")) q->on_loss_run = true;
        else if (is(v, vlen, "block")) q->on_loss_run = false;
        else return fail(p, "on_scheduler_loss=\"%.*s\" is not block or run", (int)vlen, v);
        return 0;
    case K_GPU: return parse_gpu(p, v, vlen);
    case K_COUNT: break;
    }
    return fail(p, "unknown key");
}

int vcuda_quota_file_parse(const char *text, size_t len, struct vcuda_quota_file *q, char *why, size_t whylen) {
    memset(q, 0, sizeof *q);
    q->scheduler_timeout_ms = 5000;
    struct parser p = {.q = q, .why = why, .whylen = whylen};
    if (memchr(text, '\0', len) != NULL) return fail(&p, "not a text file (NUL byte)");
    const char *s = text, *end = text + len;
    while (s < end) {
        const char *nl = memchr(s, '\n', (size_t)(end - s));
        const char *eol = nl ? nl : end;
        if (eol > s && eol[-1] == '\r') eol--; /* CRLF, as py_vcuda/quota_file.py reads it too */
        p.line++;
        if (parse_line(&p, s, (size_t)(eol - s)) != 0) return -1;
        s = nl ? nl + 1 : end;
    }
    p.line = 0;
    if (!p.seen[K_VERSION]) return fail(&p, "no version line (empty file?)");
    if (!p.ended) return fail(&p, "no end line (truncated?)");
    static const enum key required[] = {K_LEDGER, K_CORE_REQUEST, K_CORE_LIMIT, K_PRIORITY, K_GPU};
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!p.seen[required[i]]) return fail(&p, "no %s line", key_names[required[i]]);
    if (q->core_limit < q->core_request)
        return fail(&p, "core_limit %d is below core_request %d", q->core_limit, q->core_request);
    return 0;
}

int vcuda_quota_file_read(const char *path, struct vcuda_quota_file *q, char *why, size_t whylen) {
    static char text[VCUDA_QUOTA_MAX_BYTES + 1]; /* read once, in the constructor */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
        snprintf(why, whylen, "cannot open it: %s", strerror(errno));
        return -1;
    }
    size_t len = 0;
    for (;;) {
        ssize_t n = read(fd, text + len, sizeof text - len);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) {
            snprintf(why, whylen, "cannot read it: %s", strerror(errno));
            close(fd);
            return -1;
        }
        if (n == 0) break;
        len += (size_t)n;
        if (len == sizeof text) {
            snprintf(why, whylen, "larger than %d bytes", VCUDA_QUOTA_MAX_BYTES);
            close(fd);
            return -1;
        }
    }
    close(fd);
    return vcuda_quota_file_parse(text, len, q, why, whylen);
}

const struct vcuda_quota_gpu *vcuda_quota_file_gpu(const struct vcuda_quota_file *q, const char *uuid) {
    if (uuid == NULL) return NULL;
    for (int i = 0; i < q->ngpus; i++)
        if (vcuda_same_device(q->gpus[i].uuid, uuid, sizeof q->gpus[i].uuid)) return &q->gpus[i];
    return NULL;
}

int vcuda_quota_gpu_line(const struct vcuda_quota_gpu *g, char *out, size_t len) {
    char memory[24];
    if (g->memory == UINT64_MAX) snprintf(memory, sizeof memory, "unlimited");
    else snprintf(memory, sizeof memory, "%llu", (unsigned long long)g->memory);
    return snprintf(out, len, "gpu=%s memory=%s scheduler=%s", g->uuid, memory, g->scheduler);
}

int vcuda_quota_file_format(const struct vcuda_quota_file *q, char *out, size_t len) {
    size_t used = 0;
    int n = snprintf(out, len,
                     "version=%d\nledger=%s\ncore_request=%d\ncore_limit=%d\npriority=%s\n"
                     "scheduler_timeout_ms=%d\non_scheduler_loss=%s\n",
                     VCUDA_QUOTA_VERSION, q->ledger, q->core_request, q->core_limit,
                     q->priority_high ? "high" : "normal", q->scheduler_timeout_ms, q->on_loss_run ? "run" : "block");
    if (n < 0) return n;
    used += (size_t)n;
    for (int i = 0; i < q->ngpus; i++) {
        n = vcuda_quota_gpu_line(&q->gpus[i], used < len ? out + used : NULL, used < len ? len - used : 0);
        if (n < 0) return n;
        used += (size_t)n;
        n = snprintf(used < len ? out + used : NULL, used < len ? len - used : 0, "\n");
        used += (size_t)n;
    }
    n = snprintf(used < len ? out + used : NULL, used < len ? len - used : 0, "end\n");
    return (int)(used + (size_t)n);
}
