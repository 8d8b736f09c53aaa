"""Byte quantities as users write them (``512Mi``, ``4Gi``, ``1.5Gi``, ``4G``).

Parsed by libvcuda's own parser, so the CLI accepts exactly what the shim does.
"""

from __future__ import annotations

from py_vcuda._native import ffi, lib

_UNITS = [("Ti", 1 << 40), ("Gi", 1 << 30), ("Mi", 1 << 20), ("Ki", 1 << 10)]


class QuantityError(ValueError):
    """A quantity that cannot be parsed."""


def parse_quantity(text: str) -> int:
    out = ffi.new("uint64_t *")
    err = ffi.new("char[]", 256)
    if lib().vcuda_parse_quantity(text.encode(), out, err, 256) != 0:
        raise QuantityError(f"invalid quantity {text!r}: {ffi.string(err).decode()}")
    return int(out[0])


def format_bytes(n: int) -> str:
    """Shortest exact binary form (``4Gi``), else a rounded one (``1.50Gi``)."""
    for suffix, factor in _UNITS:
        if n >= factor and n % factor == 0:
            return f"{n // factor}{suffix}"
    for suffix, factor in _UNITS:
        if n >= factor:
            return f"{n / factor:.2f}{suffix}"
    return str(n)
