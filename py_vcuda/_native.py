"""cffi binding of libvcuda's control API (libvcuda/include/vcuda.h).

Private: raw ``ffi``/``lib`` stay here; the typed wrappers live in
:mod:`py_vcuda.quantity` and :mod:`py_vcuda.ledger`. The library's version is
checked against the package's on first use, so a stale ``.so`` fails loudly.
"""

from __future__ import annotations

import functools
from typing import Any

from cffi import FFI

from py_vcuda import __version__, native

CDEF = """
const char *vcuda_version(void);
int vcuda_parse_quantity(const char *text, uint64_t *bytes, char *err, size_t errlen);
int vcuda_config_text(char *buf, size_t len);
int vcuda_quota_parse(const char *text, size_t len, char *out, size_t outlen);

typedef struct vcuda_ledger_map vcuda_ledger_map;
typedef struct {
    char uuid[48];
    int32_t index;
    int32_t reserved;
    uint64_t limit;
    uint64_t used;
    uint64_t peak;
    uint64_t oom_denials;
    uint64_t context_overhead;
    uint64_t unattributed;
} vcuda_device_usage;
typedef struct {
    int32_t pid;
    int32_t alive;
    uint64_t start_time;
    uint64_t used[16];
} vcuda_process_usage;
vcuda_ledger_map *vcuda_ledger_open_file(const char *path, int create, char *err, size_t errlen);
void vcuda_ledger_close_file(vcuda_ledger_map *ledger);
int vcuda_ledger_read_devices(vcuda_ledger_map *ledger, vcuda_device_usage *out, int max);
int vcuda_ledger_read_processes(vcuda_ledger_map *ledger, vcuda_process_usage *out, int max);
int vcuda_ledger_reclaim_dead(vcuda_ledger_map *ledger);
int vcuda_ledger_set_limit(vcuda_ledger_map *ledger, const char *uuid, uint64_t limit);
int vcuda_ledger_set_unattributed(vcuda_ledger_map *ledger, const char *uuid, uint64_t bytes);
"""

ffi = FFI()
ffi.cdef(CDEF)


class NativeVersionMismatch(RuntimeError):
    """libvcuda.so was built from another version than this package."""


@functools.cache
def lib() -> Any:
    path = native.lib_path(native.SHIM)
    loaded = ffi.dlopen(str(path))
    version = ffi.string(loaded.vcuda_version()).decode()
    if version != __version__:
        raise NativeVersionMismatch(
            f"{path} is version {version}, py_vcuda is {__version__}: reinstall vcuda"
        )
    return loaded
