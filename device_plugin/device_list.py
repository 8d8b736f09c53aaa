"""How an Allocate answer names its GPUs to the container runtime: the device-list strategies of
NVIDIA's device plugin (``--device-list-strategy``, a comma list), in every mode.

- ``envvar``: ``NVIDIA_VISIBLE_DEVICES=<uuid>,...``, which the NVIDIA container runtime reads.
  A pod's own ``env`` comes after the plugin's in the container, so unless the toolkit is told
  not to (``accept-nvidia-visible-devices-envvar-when-unprivileged = false``) a pod can ask for
  ``all`` itself.
- ``volume-mounts``: ``NVIDIA_VISIBLE_DEVICES=/var/run/nvidia-container-devices`` and one mount
  per GPU (host ``/dev/null`` at ``/var/run/nvidia-container-devices/<uuid>``); the toolkit reads
  the mounts when ``accept-nvidia-visible-devices-as-volume-mounts = true``. A pod's spec cannot
  add such a mount, so with the envvar switched off it cannot widen its GPUs.
- ``cdi-cri``: the answer's ``cdi_devices`` (Kubernetes >= 1.31; alpha/beta from 1.28), named
  ``nvidia.com/gpu=<uuid>``: the runtime (containerd, CRI-O with CDI enabled) injects the devices
  of the CDI spec the NVIDIA container toolkit generates (``nvidia-ctk cdi generate
  --device-name-strategy=uuid``). NVIDIA's plugin then sets no ``NVIDIA_VISIBLE_DEVICES``; we
  set ``void`` so an image's default (CUDA images say ``all``) selects nothing through a legacy
  NVIDIA runtime either.

With several strategies each adds its part; the variable is the volume-mounts root when that
strategy is on (as in NVIDIA's plugin). Whatever the runtime shows, libvcuda refuses a GPU its
quota file does not name (README, "Security model").
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from kube_contract.api import deviceplugin_v1beta1_pb2 as pb

ENVVAR = "envvar"
VOLUME_MOUNTS = "volume-mounts"
CDI_CRI = "cdi-cri"
STRATEGIES = (ENVVAR, VOLUME_MOUNTS, CDI_CRI)
VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"
VOLUME_MOUNTS_ROOT = Path("/var/run/nvidia-container-devices")
VOLUME_MOUNTS_HOST = Path("/dev/null")
CDI_KIND = "nvidia.com/gpu"   # the NVIDIA container toolkit's spec (nvidia-ctk cdi generate)
NO_DEVICES = "void"           # NVIDIA_VISIBLE_DEVICES that selects no GPU


class Strategies(tuple[str, ...]):
    """The chosen strategies, printed as the comma list they were given as."""

    def __str__(self) -> str:
        return ",".join(self)


DEFAULT = Strategies((ENVVAR,))


def strategy_list(text: str) -> Strategies:
    """The option's value: a comma list of strategies, at least one, each known."""
    chosen = Strategies(dict.fromkeys(p.strip() for p in text.split(",") if p.strip()))
    if not chosen:
        raise ValueError(f"give at least one of {', '.join(STRATEGIES)}")
    unknown = [s for s in chosen if s not in STRATEGIES]
    if unknown:
        raise ValueError(f"unknown strategy {', '.join(map(repr, unknown))}; use {', '.join(STRATEGIES)} "
                         "(a comma list)")
    return chosen


def cdi_name(uuid: str) -> str:
    return f"{CDI_KIND}={uuid}"


def apply(resp: pb.ContainerAllocateResponse, uuids: Sequence[str],
          strategies: Sequence[str] = (ENVVAR,)) -> pb.ContainerAllocateResponse:
    """Name `uuids` in `resp` by each strategy (its NVIDIA_VISIBLE_DEVICES is replaced); returns `resp`."""
    if ENVVAR in strategies:
        resp.envs[VISIBLE_DEVICES] = ",".join(uuids)
    if VOLUME_MOUNTS in strategies:
        resp.envs[VISIBLE_DEVICES] = str(VOLUME_MOUNTS_ROOT)
        resp.mounts.extend(pb.Mount(host_path=str(VOLUME_MOUNTS_HOST), container_path=str(VOLUME_MOUNTS_ROOT / u),
                                    read_only=True) for u in uuids)
    if CDI_CRI in strategies:
        resp.cdi_devices.extend(pb.CDIDevice(name=cdi_name(u)) for u in uuids)
        if ENVVAR not in strategies and VOLUME_MOUNTS not in strategies:
            resp.envs[VISIBLE_DEVICES] = NO_DEVICES
    return resp
