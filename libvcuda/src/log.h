/* Logging to stderr with the `vcuda:` prefix. Allocation-free (formats into a
 * stack buffer, one write(2)), capped so a looping error cannot flood. */
#ifndef VCUDA_LOG_H
#define VCUDA_LOG_H

enum vcuda_log_level { VCUDA_LOG_ERROR = 0, VCUDA_LOG_WARN = 1, VCUDA_LOG_INFO = 2, VCUDA_LOG_DEBUG = 3 };

extern int vcuda_log_threshold;

void vcuda_log(enum vcuda_log_level level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#define vcuda_error(...) vcuda_log(VCUDA_LOG_ERROR, __VA_ARGS__)
#define vcuda_warn(...) vcuda_log(VCUDA_LOG_WARN, __VA_ARGS__)
#define vcuda_info(...) vcuda_log(VCUDA_LOG_INFO, __VA_ARGS__)
#define vcuda_debug(...) vcuda_log(VCUDA_LOG_DEBUG, __VA_ARGS__)

#endif
