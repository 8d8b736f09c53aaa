"""Duration strings ("10s", "500ms", "250us") to integer nanoseconds."""

from __future__ import annotations

import re

_UNITS_NS = {
    "ns": 1,
    "us": 1_000,
    "µs": 1_000,
    "ms": 1_000_000,
    "s": 1_000_000_000,
    "m": 60_000_000_000,
}
_PATTERN = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ns|us|µs|ms|s|m)?\s*$")


def parse_duration(text: str) -> int:
    """Return nanoseconds; a bare number means seconds. Raises ValueError."""
    match = _PATTERN.match(text)
    if match is None:
        raise ValueError(f"not a duration: {text!r} (examples: 10s, 500ms, 250us)")
    number, unit = match.groups()
    return round(float(number) * _UNITS_NS[unit or "s"])


def format_duration(ns: int) -> str:
    """Shortest exact-ish rendering, for logs and stats."""
    for unit in ("s", "ms", "us"):
        scale = _UNITS_NS[unit]
        if ns >= scale and ns % scale == 0:
            return f"{ns // scale}{unit}"
    return f"{ns}ns"
