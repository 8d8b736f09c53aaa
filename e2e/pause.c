/* The pod sandbox's process, as Kubernetes' own pause: it holds the pod's namespaces, reaps the
 * zombies it inherits, and exits on SIGINT/SIGTERM. Built static by e2e/images.py. */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static void on_term(int sig) { _exit(128 + sig); }

static void on_child(int sig) {
    (void)sig;
    while (waitpid(-1, NULL, WNOHANG) > 0) {
    }
}

int main(int argc, char **argv) {
    if (argc > 1 && strcmp(argv[1], "-v") == 0) {
        puts("pause (vcuda e2e)");
        return 0;
    }
    if (getpid() != 1) fprintf(stderr, "pause: warning: not pid 1\n");
    struct sigaction term = {.sa_handler = on_term};
    struct sigaction child = {.sa_handler = on_child, .sa_flags = SA_NOCLDSTOP};
    if (sigaction(SIGINT, &term, NULL) || sigaction(SIGTERM, &term, NULL) || sigaction(SIGCHLD, &child, NULL))
        return 1;
    for (;;) pause();
}
