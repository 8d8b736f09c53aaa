#include "log.h"

#include <errno.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <unistd.h>

int vcuda_log_threshold = VCUDA_LOG_WARN;

/* A process prints at most this many messages; the last one says so. */
#define VCUDA_LOG_CAP 200
static atomic_int log_count;

static const char *const level_names[] = {"error", "warning", "info", "debug"};

void vcuda_log(enum vcuda_log_level level, const char *fmt, ...) {
    if ((int)level > vcuda_log_threshold) return;
    int n = atomic_fetch_add_explicit(&log_count, 1, memory_order_relaxed);
    if (n > VCUDA_LOG_CAP) return;
    int saved_errno = errno;
    char buf[768];
    int len;
    if (n == VCUDA_LOG_CAP) {
        len = snprintf(buf, sizeof buf, "vcuda: warning: log limit reached, further messages dropped\n");
    } else {
        len = snprintf(buf, sizeof buf, "vcuda: %s: ", level_names[level]);
        va_list ap;
        va_start(ap, fmt);
        int body = vsnprintf(buf + len, sizeof buf - (size_t)len - 1, fmt, ap);
        va_end(ap);
        if (body < 0) body = 0;
        len += body;
        if (len > (int)sizeof buf - 2) len = (int)sizeof buf - 2;
        buf[len++] = '\n';
    }
    ssize_t ignored = write(STDERR_FILENO, buf, (size_t)len);
    (void)ignored;
    errno = saved_errno;
}
