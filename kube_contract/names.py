"""Resource and annotation names (**contract**); the domain and prefix are configurable.

The defaults keep GPU-Manager's resource names so its users' manifests keep working.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RESOURCE_DOMAIN = "tencent.com"
DEFAULT_ANNOTATION_PREFIX = "vcuda.io"

CORES_PER_GPU = 100
MEMORY_UNIT_BYTES = 256 * 1024 * 1024  # one tencent.com/vcuda-memory unit


@dataclass(frozen=True)
class Names:
    """Every Kubernetes name the extender, the device plugin and the DRA driver read or write, derived
    from two settings."""

    resource_domain: str = DEFAULT_RESOURCE_DOMAIN
    annotation_prefix: str = DEFAULT_ANNOTATION_PREFIX

    def __post_init__(self) -> None:
        for field, value in (("resource_domain", self.resource_domain),
                             ("annotation_prefix", self.annotation_prefix)):
            if not value or "/" in value or value != value.strip():
                raise ValueError(f"{field}: {value!r} is not a DNS-style domain")

    def _ann(self, name: str) -> str:
        return f"{self.annotation_prefix}/{name}"

    @property
    def core_resource(self) -> str:
        return f"{self.resource_domain}/vcuda-core"

    @property
    def memory_resource(self) -> str:
        return f"{self.resource_domain}/vcuda-memory"

    @property
    def assignment(self) -> str:
        """Pod annotation written at bind: the decision (see ``assignment``)."""
        return self._ann("gpu-assignment")

    @property
    def topology(self) -> str:
        """Node annotation the device plugin publishes (see ``topology``)."""
        return self._ann("gpu-topology")

    @property
    def policy(self) -> str:
        return self._ann("scheduling-policy")

    @property
    def model_include(self) -> str:
        return self._ann("gpu-model-include")

    @property
    def model_exclude(self) -> str:
        return self._ann("gpu-model-exclude")

    @property
    def affinity(self) -> str:
        return self._ann("gpu-affinity")

    @property
    def anti_affinity(self) -> str:
        return self._ann("gpu-anti-affinity")

    @property
    def exclusion(self) -> str:
        return self._ann("gpu-exclusion")
