"""kube-scheduler's count of a pod's request for one resource, written from its source
(k8s.io/component-helpers resource.PodRequests, with sidecars: KEP-753), as an oracle for the
extender's own count (scheduler_extender.placement.PodUse)."""

from __future__ import annotations

from typing import Any


def kube_scheduler_request(pod: dict[str, Any], resource: str) -> int:
    """max(sum of app containers and sidecars, for each init container: itself plus the sidecars
    before it), a sidecar being an init container with restartPolicy Always."""
    def req(c: dict[str, Any]) -> int:
        res = c.get("resources") or {}
        return int((res.get("limits") or {}).get(resource, (res.get("requests") or {}).get(resource, 0)))
    total = sum(req(c) for c in pod["spec"]["containers"])
    sidecars = init_max = 0
    for c in pod["spec"].get("initContainers") or []:
        if c.get("restartPolicy") == "Always":
            total += req(c)
            sidecars += req(c)
            init_max = max(init_max, sidecars)
        else:
            init_max = max(init_max, req(c) + sidecars)
    return max(total, init_max)
