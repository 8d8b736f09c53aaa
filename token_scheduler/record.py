"""Record a policy's inputs and replay them: every call the daemon makes into the
policy and every clock reading the policy takes, as JSON lines, so that a fresh
policy fed the same calls and readings takes the same decisions, step by step.

What for: a share that falls short on a real node (the token left free while
tenants waited, a tenant under its request) depends on timing that a fake clock
does not reproduce. `vcuda scheduler --record FILE` keeps that timing;
`python -m token_scheduler.replay FILE` shows each tenant's charged share and the
token's free time per second, and a replay can be stepped to inspect the policy's
state at any decision (`Replay`). The file holds tenant names and client ids,
nothing else of the tenants; about 20 KB a second for two busy tenants.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from .policy import Policy, PolicyConfig

FORMAT = "vcuda-policy-record/1"
FLUSH_EVERY = 256  # lines: a killed daemon loses at most this many steps
# The decisions a replay checks against the record; other results follow from them.
DECISIONS = ("dispatch", "preempt", "renew")


class ReplayMismatch(Exception):
    """The replayed policy decided otherwise than the recorded one (another policy, or
    a record that is not this policy's)."""


def _encode(value: Any) -> Any:
    if isinstance(value, bytes):
        return {"hex": value.hex()}
    if isinstance(value, tuple):  # Grant, Revoke and plain tuples alike
        return [_encode(v) for v in value]
    if isinstance(value, dict):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(value: Any) -> Any:
    if isinstance(value, dict):
        if set(value) == {"hex"}:
            return bytes.fromhex(value["hex"])
        return {k: _decode(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_decode(v) for v in value]
    return value


def _public_methods(policy: Policy) -> list[str]:
    return [name for name, member in vars(type(policy)).items()
            if not name.startswith("_") and callable(member)]


class Recorder:
    """Writes `policy`'s calls and clock readings to `path` from now on; `close()` it at
    the end. Made before the policy's first call: a replay starts from an empty policy."""

    def __init__(self, path: Path, policy: Policy) -> None:
        if policy.tenants or policy.lease is not None:
            raise ValueError("record a policy from its creation: it already has tenants")
        # Never over an earlier record: a scheduler restarted with the same FILE would
        # erase the run that went wrong.
        self._file: IO[str] = open(path, "x", encoding="utf-8")  # noqa: SIM115 (closed in close())
        self._lines = 0
        self._clocks: list[int] = []
        self._depth = 0
        self._write({"format": FORMAT, "config": dataclasses.asdict(policy.config), "epoch": policy.epoch})
        clock = policy.clock

        def recorded_clock() -> int:
            now = clock()
            self._clocks.append(now)
            return now

        policy.clock = recorded_clock
        for name in _public_methods(policy):
            setattr(policy, name, self._wrap(name, getattr(policy, name)))

    def _wrap(self, name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(method)
        def recorded(*args: Any, **kwargs: Any) -> Any:
            if self._depth:  # a call from within the policy: the outer call is the step
                return method(*args, **kwargs)
            self._depth += 1
            self._clocks = []
            step: dict[str, Any] = {"m": name, "a": _encode(args), "k": _encode(kwargs)}
            try:
                result = method(*args, **kwargs)
            except Exception as exc:
                step["error"] = type(exc).__name__
                raise
            else:
                if name in DECISIONS:
                    step["r"] = _encode(result)
                return result
            finally:
                self._depth -= 1
                step["c"] = self._clocks
                self._write(step)
        return recorded

    def _write(self, line: dict[str, Any]) -> None:
        if self._file.closed:
            return
        self._file.write(json.dumps(line, separators=(",", ":")) + "\n")
        self._lines += 1
        if self._lines % FLUSH_EVERY == 0:
            self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


@dataclasses.dataclass
class Step:
    index: int
    method: str
    args: list[Any]
    kwargs: dict[str, Any]
    clocks: list[int]
    result: Any  # as recorded, decoded: a list for a Grant or Revoke; None when not kept
    error: str | None


def read(path: Path) -> tuple[PolicyConfig, int, Iterator[Step]]:
    """The record's policy configuration, epoch and steps (a last line cut short by a
    killed daemon is dropped)."""
    file = open(path, encoding="utf-8")  # noqa: SIM115 (closed by the generator)
    try:
        header = json.loads(file.readline())
    except json.JSONDecodeError as exc:
        file.close()
        raise ValueError(f"{path}: not a policy record") from exc
    if not isinstance(header, dict) or header.get("format") != FORMAT:
        file.close()
        raise ValueError(f"{path}: not a policy record of format {FORMAT}")
    fields = {f.name for f in dataclasses.fields(PolicyConfig)}
    config = PolicyConfig(**{k: tuple(v) if isinstance(v, list) else v  # JSON has no tuples
                             for k, v in header["config"].items() if k in fields})

    def steps() -> Iterator[Step]:
        with file:
            for index, text in enumerate(file):
                try:
                    line = json.loads(text)
                except json.JSONDecodeError:
                    return  # the daemon was killed mid-line
                yield Step(index, line["m"], _decode(line["a"]), _decode(line["k"]), line["c"],
                           _decode(line.get("r")), line.get("error"))

    return config, int(header["epoch"]), steps()


class Replay:
    """A fresh policy driven by a record's steps, one `step()` at a time: between steps
    `policy` is in the state the recorded one was in. `on_charge(tenant, start, end,
    filler)` and `on_held_back(since, until, tenant names)` see each hold charged and
    each span the token sat free with every waiting tenant held back."""

    def __init__(self, path: Path,
                 on_charge: Callable[[str, int, int, bool], None] | None = None,
                 on_held_back: Callable[[int, int, tuple[str, ...]], None] | None = None) -> None:
        config, epoch, self._steps = read(path)
        self._clocks: list[int] = []
        self._extra_reads = 0
        self.now = 0
        self.policy = Policy(config, self._clock, epoch)
        self.last: Step | None = None
        if on_charge is not None:
            charge = self.policy._charge

            def charged(tenant: Any, start: int, end: int, filler: bool = False) -> None:
                on_charge(tenant.name, start, end, filler)
                charge(tenant, start, end, filler)
            self.policy._charge = charged  # type: ignore[method-assign]
        if on_held_back is not None:
            note = self.policy._note_held_back

            def noted(now: int) -> None:
                since = self.policy._held_back_since
                assert since is not None
                on_held_back(since, now, tuple(t.name for t in self.policy._held_back))
                note(now)
            self.policy._note_held_back = noted  # type: ignore[method-assign]

    def _clock(self) -> int:
        if self._clocks:
            self.now = self._clocks.pop(0)
        else:
            self._extra_reads += 1  # the recorded policy read it fewer times: it went another way
        return self.now

    def step(self) -> Step | None:
        """Replay the next step (None at the end). Raises ReplayMismatch where the
        policy decides otherwise than the record says."""
        step = next(self._steps, None)
        if step is None:
            return None
        self._clocks = list(step.clocks)
        self._extra_reads = 0
        error: str | None = None
        result: Any = None
        try:
            result = getattr(self.policy, step.method)(*step.args, **step.kwargs)
        except Exception as exc:  # the recorded policy raised too, or the step says otherwise
            error = type(exc).__name__
        if error != step.error:
            raise ReplayMismatch(f"step {step.index} {step.method}: raised {error}, recorded {step.error}")
        if step.method in DECISIONS and error is None and _decode(_encode(result)) != step.result:
            raise ReplayMismatch(f"step {step.index} {step.method}: {result}, recorded {step.result}")
        if self._clocks or self._extra_reads:
            raise ReplayMismatch(f"step {step.index} {step.method}: the clock read "
                                 f"{len(step.clocks) - len(self._clocks) + self._extra_reads} times, "
                                 f"recorded {len(step.clocks)}")
        self.last = step
        return step

    def run(self) -> int:
        """Replay every step; how many."""
        count = 0
        while self.step() is not None:
            count += 1
        return count

