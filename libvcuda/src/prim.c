#include "prim.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Reads the state letter (field 3) and start time (field 22) of /proc/<pid>/stat. */
static int read_stat(pid_t pid, char *state, uint64_t *start_time) {
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    char buf[1024];
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    if (n <= 0) return -1;
    buf[n] = '\0';
    /* The command name (field 2) may hold spaces and parentheses: count fields
     * from the last ')'. */
    char *p = strrchr(buf, ')');
    if (p == NULL || p[1] != ' ') return -1;
    *state = p[2];
    for (int field = 2; field < 22 && p != NULL; field++) p = strchr(p + 1, ' ');
    if (p == NULL) return -1;
    *start_time = strtoull(p + 1, NULL, 10);
    return 0;
}

uint64_t vcuda_prim_start_time(pid_t pid) {
    char state = 0;
    uint64_t start = 0;
    return read_stat(pid, &state, &start) == 0 ? start : 0;
}

int vcuda_prim_alive(pid_t pid, uint64_t start_time) {
    if (pid <= 0) return 0;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char state = 0;
    uint64_t now = 0;
    /* Unreadable /proc (hidepid, another namespace): trust kill(). */
    if (read_stat(pid, &state, &now) != 0) return 1;
    /* A zombie has already released its GPU memory; only its parent has not reaped it. */
    if (state == 'Z' || state == 'X') return 0;
    return start_time == 0 || now == start_time;
}
