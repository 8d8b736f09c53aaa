"""The webhook's decision (scheduler_extender.webhook.mutate), table-driven: which pods it sends to
vcuda's scheduler, which it leaves alone, and how it answers what is not a Pod AdmissionReview."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from scheduler_extender.webhook.mutate import API_VERSION, BadReview, Rules, decide, parse

RULES = Rules(frozenset({"tencent.com/vcuda-core", "tencent.com/vcuda-memory"}), "vcuda-scheduler")
POD_KIND = {"group": "", "version": "v1", "kind": "Pod"}
PODS = {"group": "", "version": "v1", "resource": "pods"}
SET_SCHEDULER = [{"op": "add", "path": "/spec/schedulerName", "value": "vcuda-scheduler"}]


def container(name: str = "c", limits: dict[str, Any] | None = None, requests: dict[str, Any] | None = None,
              **extra: Any) -> dict[str, Any]:
    resources = {k: v for k, v in (("limits", limits), ("requests", requests)) if v is not None}
    return {"name": name, "image": "busybox", "resources": resources, **extra}


GPU = {"tencent.com/vcuda-core": "30", "tencent.com/vcuda-memory": "4"}
CPU = {"cpu": "1", "memory": "1Gi"}


def pod(containers: list[dict[str, Any]], init: list[dict[str, Any]] | None = None, scheduler: str | None = None,
        **meta: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": containers}
    if init is not None:
        spec["initContainers"] = init
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"namespace": "team", **meta}, "spec": spec}


def review(obj: Any, operation: str = "CREATE", **request: Any) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview",
            "request": {"uid": "req-1", "kind": POD_KIND, "resource": PODS, "namespace": "team",
                        "operation": operation, "object": obj, **request}}


def patch_of(response: dict[str, Any]) -> list[dict[str, Any]] | None:
    if "patch" not in response:
        return None
    assert response["patchType"] == "JSONPatch"
    return json.loads(base64.b64decode(response["patch"]))


CASES = [
    # (description, pod, operation, patched)
    ("limits on an app container, no schedulerName", pod([container(limits=GPU)]), "CREATE", True),
    ("requests only", pod([container(requests={"tencent.com/vcuda-core": "50"})]), "CREATE", True),
    ("memory units only", pod([container(limits={"tencent.com/vcuda-memory": 2})]), "CREATE", True),
    ("empty schedulerName", pod([container(limits=GPU)], scheduler=""), "CREATE", True),
    ("default-scheduler", pod([container(limits=GPU)], scheduler="default-scheduler"), "CREATE", True),
    ("init container only", pod([container(limits=CPU)], init=[container("i", limits=GPU)]), "CREATE", True),
    ("sidecar only", pod([container(limits=CPU)], init=[container("s", limits=GPU, restartPolicy="Always")]),
     "CREATE", True),
    ("second of several containers", pod([container("a", limits=CPU), container("b", limits=GPU)]), "CREATE", True),
    ("already vcuda-scheduler", pod([container(limits=GPU)], scheduler="vcuda-scheduler"), "CREATE", False),
    ("no vcuda resources", pod([container(limits=CPU)], init=[container("i", limits=CPU)]), "CREATE", False),
    ("no resources at all", pod([{"name": "c", "image": "busybox"}]), "CREATE", False),
    ("a zero request", pod([container(limits={"tencent.com/vcuda-core": "0"})]), "CREATE", False),
    ("a resource the webhook does not watch", pod([container(limits={"nvidia.com/gpu": "1"})]), "CREATE", False),
    ("UPDATE of a GPU pod", pod([container(limits=GPU)]), "UPDATE", False),
]


@pytest.mark.parametrize(("pod_obj", "operation", "patched"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_which_pods_are_sent_to_vcuda(pod_obj: dict[str, Any], operation: str, patched: bool) -> None:
    verdict = decide(review(pod_obj, operation), RULES)
    assert verdict.review["apiVersion"] == API_VERSION and verdict.review["kind"] == "AdmissionReview"
    response = verdict.review["response"]
    assert response["uid"] == "req-1" and response["allowed"] is True
    assert patch_of(response) == (SET_SCHEDULER if patched else None)
    assert verdict.notice is None and "warnings" not in response and "status" not in response


def test_the_watched_resources_are_configurable() -> None:
    rules = Rules(frozenset({"nvidia.com/gpu", "nvidia.com/mps-core"}), "gpu-sched")
    verdict = decide(review(pod([container(limits={"nvidia.com/mps-core": "25"})])), rules)
    assert patch_of(verdict.review["response"]) == [{"op": "add", "path": "/spec/schedulerName",
                                                     "value": "gpu-sched"}]
    assert patch_of(decide(review(pod([container(limits=GPU)])), rules).review["response"]) is None


@pytest.mark.parametrize("where", ["containers", "init", "sidecar"])
def test_another_scheduler_is_left_alone_with_a_warning_and_a_notice(where: str) -> None:
    c = container(limits=GPU, **({"restartPolicy": "Always"} if where == "sidecar" else {}))
    obj = pod([c] if where == "containers" else [container(limits=CPU)], init=None if where == "containers" else [c],
              scheduler="volcano", name="trainer")
    verdict = decide(review(obj), RULES)
    response = verdict.review["response"]
    assert response["allowed"] is True and patch_of(response) is None
    assert len(response["warnings"]) == 1 and "'volcano'" in response["warnings"][0]
    assert "tencent.com/vcuda-core" in response["warnings"][0]
    notice = verdict.notice
    assert notice is not None and (notice.namespace, notice.name, notice.scheduler) == ("team", "trainer", "volcano")
    assert notice.owner is None and not verdict.dry_run


def test_a_notice_for_a_generated_name_carries_the_controller() -> None:
    owner = {"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "web-5d8f", "uid": "rs-uid", "controller": True}
    other = {"apiVersion": "v1", "kind": "ConfigMap", "name": "x", "uid": "cm-uid"}
    obj = pod([container(limits=GPU)], scheduler="volcano", generateName="web-5d8f-", ownerReferences=[other, owner])
    verdict = decide(review(obj, dryRun=True), RULES)
    assert verdict.dry_run and verdict.notice is not None
    assert verdict.notice.name == "" and verdict.notice.generate_name == "web-5d8f-" and verdict.notice.owner == owner


BAD_WITH_UID = [
    ("a Deployment", dict(kind={"group": "apps", "version": "v1", "kind": "Deployment"},
                          resource={"group": "apps", "version": "v1", "resource": "deployments"}),
     "apps/v1/Deployment"),
    ("a pod subresource", dict(subResource="ephemeralcontainers"), "pods/ephemeralcontainers"),
    ("a Pod kind on another resource", dict(resource={"group": "", "version": "v1", "resource": "podtemplates"}),
     "v1/podtemplates"),
    ("an unknown operation", dict(operation="EXPLODE"), "'EXPLODE'"),
    ("no object on a CREATE", dict(object=None), "no Pod object"),
    ("an object that is a string", dict(object="pod"), "no Pod object"),
]


@pytest.mark.parametrize(("request_fields", "said"), [c[1:] for c in BAD_WITH_UID], ids=[c[0] for c in BAD_WITH_UID])
def test_a_request_it_does_not_serve_is_allowed_with_a_status(request_fields: dict[str, Any], said: str) -> None:
    body = review(pod([container(limits=GPU)]))
    body["request"].update(request_fields)
    response = decide(body, RULES).review["response"]
    assert response["uid"] == "req-1" and response["allowed"] is True and "patch" not in response
    assert response["status"]["code"] == 400 and said in response["status"]["message"]
    assert said in response["warnings"][0]


BAD = [
    ("a list", [1, 2], "got list"),
    ("wrong apiVersion", {"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview", "request": {"uid": "u"}},
     "v1beta1"),
    ("wrong kind", {"apiVersion": API_VERSION, "kind": "Pod", "request": {"uid": "u"}}, "'Pod'"),
    ("no request", {"apiVersion": API_VERSION, "kind": "AdmissionReview"}, "no request"),
    ("no uid", {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": {"kind": POD_KIND}}, "no uid"),
    ("a numeric uid", {"apiVersion": API_VERSION, "kind": "AdmissionReview", "request": {"uid": 7}}, "no uid"),
]


@pytest.mark.parametrize(("body", "said"), [c[1:] for c in BAD], ids=[c[0] for c in BAD])
def test_no_uid_no_answer(body: Any, said: str) -> None:
    with pytest.raises(BadReview, match=said):
        decide(body, RULES)


def test_parse_rejects_what_is_not_json() -> None:
    with pytest.raises(BadReview, match="not JSON"):
        parse(b"{nope")
    with pytest.raises(BadReview, match="not JSON"):
        parse(b"\xff\xfe")


def test_malformed_pod_fields_do_not_crash() -> None:
    odd = {"metadata": [], "spec": {"containers": [None, {"resources": []}, {"resources": {"limits": [1]}}],
                                    "initContainers": "x", "schedulerName": 5}}
    response = decide(review(odd), RULES).review["response"]
    assert response["allowed"] is True and "patch" not in response
