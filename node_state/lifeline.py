"""Run a Python module as a child process that ends with its parent.

The agent's token schedulers must not outlive it: after a SIGKILL (OOM
killer, ``kubectl delete --force``) nothing stops them, and the next agent
would start a second scheduler on the same directory. Linux delivers a chosen
signal to a process when its parent dies (``prctl(PR_SET_PDEATHSIG)``).

The child asks for it itself, right after exec, instead of in a
``preexec_fn``: that runs between fork and exec inside a process with gRPC
threads, where taking any lock another thread held at fork time hangs the
child. Then it checks that the parent is still the one that started it (it may
have died before the request took effect) and runs the module as ``-m`` would.

    python -m node_state.lifeline PARENT_PID MODULE [ARGS...]

Note that Linux sends the signal when the *thread* that forked the child ends:
start children from threads that live as long as the agent (the main thread,
the supervisor's).
"""

from __future__ import annotations

import ctypes
import os
import runpy
import signal
import sys

PR_SET_PDEATHSIG = 1   # <linux/prctl.h>


def set_parent_death_signal(signum: int) -> bool:
    """Ask Linux to send `signum` when the parent dies; False where that is not available."""
    if not sys.platform.startswith("linux"):
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0) == 0


def command(module: str, *args: str) -> list[str]:
    """The command line that runs `python -m module args` bound to this process's life."""
    return [sys.executable, "-m", __name__, str(os.getpid()), module, *args]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print("usage: python -m node_state.lifeline PARENT_PID MODULE [ARGS...]", file=sys.stderr)
        return 2
    parent, module = int(argv[0]), argv[1]
    if not set_parent_death_signal(signal.SIGTERM):   # SIGTERM: the child still cleans up after itself
        print(f"lifeline: no parent-death signal on this system; {module} may outlive its parent", file=sys.stderr)
    if os.getppid() != parent:
        return 1   # the parent is already gone: nobody wants this child any more
    sys.argv = [module, *argv[2:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
