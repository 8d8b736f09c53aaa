"""The DRA driver's public names (**contract**: DESIGN.md "DRA driver")."""

from __future__ import annotations

from pathlib import Path

DRIVER = "gpu.vcuda.io"

# Where the kubelet and the container runtime look (flags' defaults, DESIGN.md `vcuda dra-driver`).
DEFAULT_PLUGIN_DIR = Path("/var/lib/kubelet/plugins")
DEFAULT_REGISTRY_DIR = Path("/var/lib/kubelet/plugins_registry")
DEFAULT_CDI_DIR = Path("/var/run/cdi")

# The kubelet's plugin watcher: the registration socket's name and what GetInfo answers.
PLUGIN_TYPE = "DRAPlugin"
REGISTRATION_SOCKET = f"{DRIVER}-reg.sock"
SERVICE_SOCKET = "dra.sock"                           # in <plugin-dir>/<driver>/
SUPPORTED_VERSIONS = ("v1.DRAPlugin", "v1beta1.DRAPlugin")   # the kubelet takes the first it supports

# Device capacity, consumed by claims (consumable capacity).
CORES = "cores"        # percent of the GPU's time, 100 per GPU
MEMORY = "memory"      # bytes

# Opaque configuration in a DeviceClass or ResourceClaim.
CONFIG_API_VERSION = f"{DRIVER}/v1alpha1"
CONFIG_KIND = "GpuShareConfig"

# CDI: one spec file per prepared claim, one device per claim request.
CDI_VENDOR = DRIVER
CDI_CLASS = "claim"
CDI_KIND = f"{CDI_VENDOR}/{CDI_CLASS}"
