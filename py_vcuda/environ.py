"""Setting process environment variables for one block: for libraries that
read their configuration with getenv when called (the GPU simulator, NVML
through it), opened in this process as a child with that environment would."""

from __future__ import annotations

import os
from collections.abc import Iterator, Mapping
from contextlib import contextmanager


@contextmanager
def overlay(values: Mapping[str, str], clear_prefix: str = "") -> Iterator[None]:
    """os.environ with `values` set inside the block; with `clear_prefix`, the other
    variables with that prefix are unset there too. Everything is put back after."""
    keys = set(values) | ({k for k in os.environ if k.startswith(clear_prefix)} if clear_prefix else set())
    saved = {k: os.environ.get(k) for k in keys}
    for k in keys:
        os.environ.pop(k, None)
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
