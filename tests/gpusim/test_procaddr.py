"""cuGetProcAddress(_v2): the version- and per-thread-aware symbol table."""

from __future__ import annotations

import os
import subprocess

import pytest

from py_vcuda.sim import SimConfig

PTDS = "2"
NOT_FOUND = 500

CASES = [
    # symbol, cudaVersion, flags, CUresult, status, resolved symbol
    ("cuMemAlloc", "3020", "0", 0, 0, "cuMemAlloc_v2"),
    ("cuMemAlloc", "13000", PTDS, 0, 0, "cuMemAlloc_v2"),  # no per-thread form
    ("cuMemAlloc", "3000", "0", NOT_FOUND, 2, "NULL"),
    ("cuLaunchKernel", "12000", "0", 0, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", "12000", "1", 0, 0, "cuLaunchKernel"),
    ("cuLaunchKernel", "12000", PTDS, 0, 0, "cuLaunchKernel_ptsz"),
    ("cuStreamSynchronize", "13000", PTDS, 0, 0, "cuStreamSynchronize_ptsz"),
    ("cuCtxCreate", "12080", "0", 0, 0, "cuCtxCreate_v2"),
    ("cuCtxCreate", "13000", "0", 0, 0, "cuCtxCreate_v4"),
    ("cuGetProcAddress", "11030", "0", 0, 0, "cuGetProcAddress"),
    ("cuGetProcAddress", "12000", "0", 0, 0, "cuGetProcAddress_v2"),
    ("cuGetProcAddress", "11020", "0", NOT_FOUND, 2, "NULL"),
    ("cuDeviceGetUuid", "11030", "0", 0, 0, "cuDeviceGetUuid"),
    ("cuDeviceGetUuid", "11040", "0", 0, 0, "cuDeviceGetUuid_v2"),
    ("cuDevicePrimaryCtxRelease", "10020", "0", 0, 0, "cuDevicePrimaryCtxRelease"),
    ("cuDevicePrimaryCtxRelease", "11000", "0", 0, 0, "cuDevicePrimaryCtxRelease_v2"),
    ("cuEventElapsedTime", "12080", "0", 0, 0, "cuEventElapsedTime_v2"),
    ("cuGraphInstantiate", "12000", "0", 0, 0, "cuGraphInstantiateWithFlags"),
    # Below the version their _v2 appeared in, the legacy (unsuffixed) ABIs.
    ("cuDevicePrimaryCtxRelease", "10020", "4arg", 0, 99, "cuDevicePrimaryCtxRelease"),
    ("cuDevicePrimaryCtxReset", "10020", "0", 0, 0, "cuDevicePrimaryCtxReset"),
    ("cuDevicePrimaryCtxReset", "11000", "0", 0, 0, "cuDevicePrimaryCtxReset_v2"),
    ("cuStreamBeginCapture", "10000", "0", 0, 0, "cuStreamBeginCapture"),
    ("cuStreamBeginCapture", "10000", PTDS, 0, 0, "cuStreamBeginCapture_ptsz"),
    ("cuStreamBeginCapture", "10000", "4arg", 0, 99, "cuStreamBeginCapture"),
    ("cuStreamBeginCapture", "10010", "0", 0, 0, "cuStreamBeginCapture_v2"),
    ("cuStreamBeginCapture", "13000", PTDS, 0, 0, "cuStreamBeginCapture_v2_ptsz"),
    ("cuGraphInstantiate", "10000", "0", 0, 0, "cuGraphInstantiate"),
    ("cuGraphInstantiate", "10020", "4arg", 0, 99, "cuGraphInstantiate"),
    ("cuGraphInstantiate", "11000", "0", 0, 0, "cuGraphInstantiate_v2"),
    ("cuGraphInstantiate", "11080", "0", 0, 0, "cuGraphInstantiate_v2"),
    ("cuGraphInstantiate", "9020", "0", NOT_FOUND, 2, "NULL"),
    ("cuInit", "13000", "0", 0, 0, "cuInit"),
    ("cuNoSuchThing", "13000", "0", NOT_FOUND, 1, "NULL"),
    ("", "13000", "0", NOT_FOUND, 1, "NULL"),
    ("cuMemAlloc_v2", "13000", "0", NOT_FOUND, 1, "NULL"),  # base names only
    ("cuLaunchKernel", "12000", "4arg", 0, 99, "cuLaunchKernel"),
    ("cuNoSuchThing", "12000", "4arg", NOT_FOUND, 99, "NULL"),
]


@pytest.fixture(scope="module")
def resolved(build_c, lib_dir, tmp_path_factory) -> dict[tuple[str, str, str], list[str]]:
    exe = build_c(["sim_procaddr.c"])
    env = SimConfig(state_path=tmp_path_factory.mktemp("pa") / "state").env()
    args = [x for case in CASES for x in case[:3]]
    out = subprocess.run([str(exe), *args], env={**os.environ, **env}, capture_output=True,
                         text=True, timeout=30, check=True).stdout
    rows = [line.split(" ") for line in out.splitlines()]  # "" prints as an empty field
    return {(r[0], r[1], r[2]): r[3:] for r in rows}


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0] or 'empty'}-{c[1]}-{c[2]}")
def test_get_proc_address(resolved, case) -> None:
    symbol, version, flags, rc, status, name = case
    assert resolved[(symbol, version, flags)] == [str(rc), str(status), name]
