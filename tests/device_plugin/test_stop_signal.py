"""A node daemon (the device plugin's agent, the DRA driver: node_state.daemon.serve) stops on SIGTERM
whichever of its threads the kernel hands the signal to. CI once saw the agent ignore a SIGTERM for 30 s:
the signal had gone to a gRPC or NVML thread while the main thread slept in an unbounded wait."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from py_vcuda.sim import GiB, SimConfig

REPO = Path(__file__).resolve().parents[2]

# The agent's start leaves a thread that takes the process's signals and blocks them in the main
# thread, so the kernel must deliver SIGTERM to the other thread, as it may to any of a real agent's.
DAEMON = textwrap.dedent("""
    import signal, sys, threading
    from node_state.daemon import serve

    class Agent:
        def start(self):
            threading.Thread(target=threading.Event().wait, daemon=True).start()
            signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            print("started", flush=True)

        def stop(self):
            print("stopped", flush=True)

    sys.exit(serve("test daemon", "test", "info", None, lambda nvml, health: Agent()))
""")


def test_sigterm_taken_by_another_thread_stops_the_daemon(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VCUDA_")}
    env.update(SimConfig(state_path=tmp_path / "sim", devices=1, memory=GiB).env())
    env["PYTHONPATH"] = str(REPO)
    proc = subprocess.Popen([sys.executable, "-c", DAEMON], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == "started\n"
        proc.terminate()
        out, _ = proc.communicate(timeout=20)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 0, out
    assert "stopped\n" in out
