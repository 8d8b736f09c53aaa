"""The admission decision, pure: an AdmissionReview (parsed JSON) in, the AdmissionReview to answer out.

A Pod CREATE whose containers (app, init, sidecar) ask for one of the watched resources, in limits or
requests, and that names no scheduler of its own (``spec.schedulerName`` absent, empty or
``default-scheduler``) gets one JSONPatch operation setting ``spec.schedulerName`` to vcuda's
scheduler. Nothing else is ever changed, and every answer is ``allowed: true``: the webhook steers
pods, it never blocks one.

A pod that asks for a watched resource but names another scheduler is left alone; the verdict
carries a `Notice` (the caller turns it into an Event unless the request is a dry run) and the answer
a ``warnings`` entry, which kubectl prints.

Bad input, decided here once:

- no uid can be read (not JSON, not an object, wrong apiVersion or kind, no ``request``, no
  ``request.uid``): `BadReview`, which the server answers with HTTP 400 and a metav1.Status naming
  the fault (the API server logs it; with ``failurePolicy: Ignore`` the pod is admitted unchanged);
- a uid is known but the request is not one this webhook serves (another kind or resource, a
  subresource, no Pod object): ``allowed: true``, no patch, a ``status`` with code 400 and the
  message, and the same message as a warning, so a misconfigured MutatingWebhookConfiguration is
  visible to whoever created the object.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

API_VERSION = "admission.k8s.io/v1"
DEFAULT_SCHEDULERS = ("", "default-scheduler")


class BadReview(ValueError):
    """The request is no AdmissionReview with a uid; the message says what is wrong."""


@dataclass(frozen=True)
class Rules:
    """What the webhook watches for and where it sends pods."""

    resources: frozenset[str]
    scheduler_name: str


@dataclass(frozen=True)
class Notice:
    """A pod that asks for vcuda resources but names another scheduler (for an Event).

    At admission a pod may have only ``generateName``: no name and no uid yet. `owner` is its
    controller's ownerReference (which carries a uid), when it has one.
    """

    namespace: str
    name: str
    generate_name: str
    owner: dict[str, Any] | None
    scheduler: str
    message: str   # "asks for ... but names ...": what follows "the pod" in the warning and Events


@dataclass(frozen=True)
class Verdict:
    review: dict[str, Any]       # the AdmissionReview to send back
    notice: Notice | None        # a side effect to carry out, unless dry_run
    dry_run: bool


def parse(data: bytes) -> Any:
    try:
        return json.loads(data)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BadReview(f"the body is not JSON: {exc}") from None


def decide(body: Any, rules: Rules) -> Verdict:
    """The answer to one AdmissionReview; raises BadReview when no uid can be read."""
    request = _request(body)
    uid = request["uid"]
    dry_run = request.get("dryRun") is True
    problem = _not_served(request)
    if problem:
        response = {"uid": uid, "allowed": True, "warnings": [f"vcuda webhook: {problem}"],
                    "status": {"code": 400, "reason": "BadRequest", "message": problem}}
        return Verdict(_answer(response), None, dry_run)
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    notice = None
    pod = request["object"]
    if request.get("operation") == "CREATE":
        asked = sorted(set(_asked(pod)) & rules.resources)
        spec = pod.get("spec") if isinstance(pod.get("spec"), dict) else {}
        scheduler = spec.get("schedulerName")
        scheduler = scheduler if isinstance(scheduler, str) else ""
        if asked and scheduler in DEFAULT_SCHEDULERS:
            patch = [{"op": "add", "path": "/spec/schedulerName", "value": rules.scheduler_name}]
            response["patchType"] = "JSONPatch"
            response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
        elif asked and scheduler != rules.scheduler_name:
            notice = _notice(request, pod, scheduler, asked, rules)
            response["warnings"] = [f"vcuda webhook: the pod {notice.message}"]
    return Verdict(_answer(response), notice, dry_run)


def _request(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise BadReview(f"expected an AdmissionReview object, got {type(body).__name__}")
    if body.get("apiVersion") != API_VERSION or body.get("kind") != "AdmissionReview":
        raise BadReview(f"expected kind AdmissionReview, apiVersion {API_VERSION}; got kind "
                        f"{body.get('kind')!r}, apiVersion {body.get('apiVersion')!r} (set "
                        "admissionReviewVersions: [v1] in the MutatingWebhookConfiguration)")
    request = body.get("request")
    if not isinstance(request, dict):
        raise BadReview("the AdmissionReview has no request")
    if not isinstance(request.get("uid"), str) or not request["uid"]:
        raise BadReview("the AdmissionReview's request has no uid")
    return request


def _gvk(value: Any, last: str) -> str:
    """``group/version, Kind``-style text of a request's kind or resource, for messages."""
    value = value if isinstance(value, dict) else {}
    group = value.get("group") or ""
    return f"{group + '/' if group else ''}{value.get('version', '?')}/{value.get(last, '?')}"


def _not_served(request: dict[str, Any]) -> str:
    """Why this request is not one for this webhook, or '' when it is a Pod create or update."""
    kind, resource = request.get("kind"), request.get("resource")
    if kind != {"group": "", "version": "v1", "kind": "Pod"}:
        return (f"got a request for {_gvk(kind, 'kind')}; this webhook serves only v1 Pods "
                "(check the rules of its MutatingWebhookConfiguration)")
    if resource != {"group": "", "version": "v1", "resource": "pods"} or request.get("subResource"):
        sub = f"/{request['subResource']}" if request.get("subResource") else ""
        return (f"got a request for the resource {_gvk(resource, 'resource')}{sub}; this webhook serves "
                "only v1 pods (check the rules of its MutatingWebhookConfiguration)")
    if request.get("operation") not in ("CREATE", "UPDATE", "DELETE", "CONNECT"):
        return f"unknown operation {request.get('operation')!r}"
    if request.get("operation") == "CREATE" and not isinstance(request.get("object"), dict):
        return "the Pod CREATE request carries no Pod object"
    return ""


def _answer(response: dict[str, Any]) -> dict[str, Any]:
    return {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response}


def _containers(pod: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """App containers, init containers and sidecars (init containers with restartPolicy Always)."""
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        return
    for field in ("initContainers", "containers"):
        items = spec.get(field)
        if isinstance(items, list):
            yield from (c for c in items if isinstance(c, dict))


def _asked(pod: dict[str, Any]) -> Iterator[str]:
    """Every resource some container asks for, in limits or requests, with a non-zero amount."""
    for container in _containers(pod):
        resources = container.get("resources")
        if not isinstance(resources, dict):
            continue
        for section in ("limits", "requests"):
            amounts = resources.get(section)
            if isinstance(amounts, dict):
                yield from (name for name, amount in amounts.items() if str(amount).strip() not in ("0", ""))


def _notice(request: dict[str, Any], pod: dict[str, Any], scheduler: str, asked: list[str],
            rules: Rules) -> Notice:
    meta = pod.get("metadata") if isinstance(pod.get("metadata"), dict) else {}
    namespace = str(request.get("namespace") or meta.get("namespace") or "")
    name = str(meta.get("name") or request.get("name") or "")
    owners = meta.get("ownerReferences") if isinstance(meta.get("ownerReferences"), list) else []
    owner = next((o for o in owners if isinstance(o, dict) and o.get("controller") is True), None)
    message = (f"asks for {', '.join(asked)} but names the scheduler {scheduler!r}, so it is "
               f"left alone and gets no vcuda GPU placement; remove spec.schedulerName (or set it to "
               f"{rules.scheduler_name!r}) for vcuda to place it")
    return Notice(namespace, name, str(meta.get("generateName") or ""), owner, scheduler, message)
