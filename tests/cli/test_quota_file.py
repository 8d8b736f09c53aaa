"""The container quota file (py_vcuda.quota_file): what the node agent renders parses back to the
same quota, and every kind of corrupt file is refused with a message naming the file and the fault."""

from __future__ import annotations

from pathlib import Path

import pytest

from py_vcuda.quota_file import (
    CONTAINER_QUOTA_FILE,
    EXAMPLE,
    GPUQuota,
    QuotaFile,
    QuotaFileError,
    bare_metal_env,
    ignored_env,
    parse,
    read,
    render,
)

GPU0 = "GPU-5157a0c0-0000-4000-8000-000000000000"
GPU1 = "GPU-5157a0c0-0001-4000-8000-000000000001"
SOURCE = "/run/vcuda-quota/quota.conf"

GOOD = EXAMPLE   # the interface's example (GPU0 and GPU1)


def test_the_interface_example_parses_to_its_values() -> None:
    q = parse(GOOD)
    assert q == QuotaFile(ledger="/run/vcuda/ledger", core_request=30, core_limit=60, priority="normal",
                          gpus=(GPUQuota(GPU0, 1 << 30, "ipc:///run/vcuda/sched/sched.sock"),
                                GPUQuota(GPU1, None, "")))
    assert q.gpu(GPU1) == GPUQuota(GPU1, None, "") and q.gpu("GPU-other") is None


@pytest.mark.parametrize("quota", [
    QuotaFile("/run/vcuda/ledger", 30, 60, "normal", (GPUQuota(GPU0, 1 << 30, "ipc:///s.sock"),)),
    QuotaFile("/l", 100, 100, "normal", (GPUQuota(GPU0, None), GPUQuota("MIG-1234-5678", 0)),
              scheduler_timeout_ms=0, on_scheduler_loss="run"),
    QuotaFile("/l", 1, 100, "high", tuple(GPUQuota(f"GPU-{i:04d}-x", i) for i in range(16))),
])
def test_a_rendered_quota_parses_back_to_itself(quota: QuotaFile) -> None:
    text = render(quota)
    assert text.endswith("end\n") and text.splitlines()[1] == "version=1"
    assert parse(text) == quota


def test_optional_keys_take_their_defaults() -> None:
    text = "\n".join(line for line in GOOD.splitlines() if not line.startswith(("scheduler_timeout", "on_sched")))
    q = parse(text)
    assert (q.scheduler_timeout_ms, q.on_scheduler_loss) == (5000, "block")


def test_comments_and_blank_lines_are_ignored() -> None:
    text = GOOD.replace("ledger=", "\n# a comment\n\nledger=")
    assert parse(text) == parse(GOOD)


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new, 1)


CORRUPT = {
    "wrong version": (_replace("version=1", "version=2"), "version 2, this vcuda reads 1"),
    "version not first": (_replace("version=1\nledger=/run/vcuda/ledger", "ledger=/run/vcuda/ledger\nversion=1"),
                          "the first key must be version"),
    "truncated (no end)": (GOOD[:GOOD.index("end\n")], "no 'end' line"),
    "cut mid-file": (GOOD[:GOOD.index("gpu=")], "no 'end' line"),
    "empty": ("", "empty"),
    "unknown key": (_replace("priority=normal", "priority=normal\nmemory_limit=1"), "unknown key 'memory_limit'"),
    "repeated key": (_replace("core_limit=60", "core_limit=60\ncore_limit=100"), "core_limit given twice"),
    "missing ledger": (_replace("ledger=/run/vcuda/ledger\n", ""), "missing ledger"),
    "relative ledger": (_replace("ledger=/run/vcuda/ledger", "ledger=run/ledger"), "absolute path"),
    "empty ledger": (_replace("ledger=/run/vcuda/ledger", "ledger="), "absolute path"),
    "core request 0": (_replace("core_request=30", "core_request=0"), "core_request 0 must be 1-100"),
    "core request text": (_replace("core_request=30", "core_request=thirty"), "not a non-negative integer"),
    "limit below request": (_replace("core_limit=60", "core_limit=20"), "core_limit 20 must be between"),
    "limit above 100": (_replace("core_limit=60", "core_limit=101"), "core_limit 101"),
    "bad priority": (_replace("priority=normal", "priority=low"), "priority 'low'"),
    "bad loss": (_replace("on_scheduler_loss=block", "on_scheduler_loss=ignore"), "on_scheduler_loss 'ignore'"),
    "negative timeout": (_replace("scheduler_timeout_ms=5000", "scheduler_timeout_ms=-1"),
                         "not a non-negative integer"),
    "no gpu": ("\n".join(line for line in GOOD.splitlines() if not line.startswith("gpu=")), "no gpu line"),
    "gpu without scheduler": (_replace(" scheduler=\n", "\n"), "must be '<uuid> memory="),
    "gpu fields swapped": (_replace(f"{GPU1} memory=unlimited scheduler=", f"{GPU1} scheduler= memory=unlimited"),
                           "must be '<uuid> memory="),
    "gpu double space": (_replace(f"{GPU1} memory", f"{GPU1}  memory"), "must be '<uuid> memory="),
    "gpu bad memory": (_replace("memory=unlimited", "memory=1Gi"), "neither a number of bytes nor 'unlimited'"),
    "not a uuid": (_replace(f"gpu={GPU1}", "gpu=0"), "'0' is not a GPU or MIG UUID"),
    "gpu twice": (_replace(f"gpu={GPU1}", f"gpu={GPU0}"), "a GPU is named twice"),
    "17 gpus": (_replace("end\n", "".join(f"gpu=GPU-{i:04d}-x memory=1 scheduler=\n" for i in range(15)) + "end\n"),
                "17 GPUs"),
    "line after end": (GOOD + "core_limit=100\n", "after 'end'"),
    "not key=value": (_replace("priority=normal", "priority normal"), "is not key=value"),
}


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_file_is_refused_naming_the_file_and_the_fault(case: str) -> None:
    text, why = CORRUPT[case]
    with pytest.raises(QuotaFileError) as info:
        parse(text, SOURCE)
    message = str(info.value)
    assert message.startswith(f"{SOURCE}:") and why in message, message
    assert "\n" not in message


def test_an_unreadable_file_is_an_error_naming_it(tmp_path: Path) -> None:
    with pytest.raises(QuotaFileError, match=f"{tmp_path / 'quota.conf'}: cannot read"):
        read(tmp_path / "quota.conf")
    (tmp_path / "quota.conf").write_bytes(b"version=1\n\xff\n")
    with pytest.raises(QuotaFileError, match="cannot read"):
        read(tmp_path / "quota.conf")


def test_a_quota_that_cannot_be_written_is_refused_before_it_is() -> None:
    with pytest.raises(QuotaFileError, match="core_limit 20"):
        QuotaFile("/l", 30, 20, "normal", (GPUQuota(GPU0, None),))


def test_the_container_path_is_fixed() -> None:
    assert str(CONTAINER_QUOTA_FILE) == SOURCE


def test_the_ignored_variables_are_those_of_the_interface() -> None:
    env = {"VCUDA_MEMORY_LIMIT": "8Gi", "VCUDA_MEMORY_LIMIT_1": "1", "VCUDA_SCHEDULER_0": "", "VCUDA_DISABLE": "1",
           "VCUDA_LOG_LEVEL": "debug", "VCUDA_REAL_LIBCUDA": "/x", "VCUDA_CORE_LIMIT": "100", "PATH": "/bin",
           "VCUDA_MEMORY_LIMIT_X": "1"}
    assert ignored_env(env) == ["VCUDA_CORE_LIMIT", "VCUDA_DISABLE", "VCUDA_MEMORY_LIMIT", "VCUDA_MEMORY_LIMIT_1",
                                "VCUDA_SCHEDULER_0"]


@pytest.mark.parametrize(("gpus", "per_gpu"), [
    ((GPUQuota(GPU0, 1 << 30, "ipc:///s.sock"), GPUQuota(GPU1, None, "")),
     {"VCUDA_MEMORY_LIMIT_0": str(1 << 30), "VCUDA_SCHEDULER_0": "ipc:///s.sock"}),
    ((GPUQuota(GPU0, 1 << 30, "ipc:///s.sock"), GPUQuota(GPU1, 1 << 30, "ipc:///s.sock")),
     {"VCUDA_MEMORY_LIMIT": str(1 << 30), "VCUDA_SCHEDULER": "ipc:///s.sock"}),
    ((GPUQuota(GPU0, None, ""), GPUQuota(GPU1, 2 << 30, "")), {"VCUDA_MEMORY_LIMIT_1": str(2 << 30)}),
    ((GPUQuota(GPU0, None, ""),), {}),
], ids=["mixed", "same", "second-limited", "unlimited"])
def test_bare_metal_env_says_the_quota_in_libvcudas_variables(gpus: tuple[GPUQuota, ...],
                                                              per_gpu: dict[str, str]) -> None:
    q = QuotaFile("/run/vcuda/ledger", 30, 60, "high", gpus, scheduler_timeout_ms=0, on_scheduler_loss="run")
    assert bare_metal_env(q) == {"VCUDA_LEDGER": "/run/vcuda/ledger", "VCUDA_CORE_REQUEST": "30",
                                 "VCUDA_CORE_LIMIT": "60", "VCUDA_SCHEDULER_TIMEOUT_MS": "0",
                                 "VCUDA_ON_SCHEDULER_LOSS": "run", **per_gpu}
    assert set(ignored_env(bare_metal_env(q))) == set(bare_metal_env(q))   # all of it is what the file overrides
