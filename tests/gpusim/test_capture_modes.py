"""Stream capture interaction modes (gpusim/src/launch.c): a potentially unsafe
call (a synchronize, an event or stream query) made while a capture is under
way fails and invalidates the capture, as the driver documents for
cuThreadExchangeStreamCaptureMode; synchronizing the whole context does in
every mode. PyTorch begins its captures GLOBAL, so a
shim thread that synchronizes during one breaks the application's graph unless
it opts out (RELAXED)."""

from __future__ import annotations

import pytest
from simtool import lines

GLOBAL, THREAD_LOCAL, RELAXED = "0", "1", "2"
UNSUPPORTED, INVALIDATED = 900, 901


def rcs(out, cmd: str) -> list[int]:  # type: ignore[no-untyped-def]
    return [ln.rc for ln in lines(out, cmd)]


@pytest.mark.parametrize(("mode", "other_fails"), [(GLOBAL, True), (THREAD_LOCAL, False), (RELAXED, False)])
def test_another_threads_synchronize_during_a_capture(tool, mode: str, other_fails: bool) -> None:
    out = tool("init", "primary", "0", "stream", "mcapture", mode, "othersync", GLOBAL, "endcapture")
    assert rcs(out, "mcapture") == [0]
    assert rcs(out, "othersync") == [UNSUPPORTED if other_fails else 0]
    assert rcs(out, "endcapture") == [INVALIDATED if other_fails else 0]


def test_a_relaxed_thread_may_synchronize_during_a_global_capture(tool) -> None:
    out = tool("init", "primary", "0", "stream", "mcapture", GLOBAL, "othersync", RELAXED, "endcapture")
    assert rcs(out, "othersync") == [0] and rcs(out, "endcapture") == [0]


@pytest.mark.parametrize("mode", [GLOBAL, THREAD_LOCAL, RELAXED])
def test_synchronizing_the_whole_context_during_any_capture(tool, mode: str) -> None:
    """A broader handle than the capture: invalid in every mode, from any thread."""
    out = tool("init", "primary", "0", "stream", "mcapture", mode, "capmode", RELAXED, "ctxsync", "endcapture")
    assert rcs(out, "ctxsync") == [UNSUPPORTED]
    assert rcs(out, "endcapture") == [INVALIDATED]


def test_exchange_returns_the_previous_mode_and_a_violation_before_the_capture_does_not_count(tool) -> None:
    out = tool("init", "primary", "0", "capmode", RELAXED, "capmode", GLOBAL, "capmode", "7",
               "stream", "mcapture", GLOBAL, "endcapture", "mcapture", GLOBAL, "endcapture")
    assert [(ln.rc, ln.rest[0]) for ln in lines(out, "capmode")] == [(0, GLOBAL), (0, RELAXED), (1, "7")]
    assert rcs(out, "endcapture") == [0, 0]
