"""The API server calls the DRA driver makes, through the official ``kubernetes`` client.

Raw JSON (``_preload_content=False``), so objects keep the shape the API server
sends, whatever resource.k8s.io fields the installed client has models for.
These are exactly the calls the Helm chart grants the driver
(deploy/helm/vcuda/templates/dra-driver.yaml; a test checks both ways):

    resourceclaims  get                          prepare reads the claim's allocation
    pods            get                          the claim's pod, for its container names (monitoring)
    nodes           get                          the Node's UID, owner of our ResourceSlice
    resourceslices  list, create, update, delete the node's slice (dra_driver.slices)

and GET /version (the layout of counter sets depends on it), which every client may read
(the default ClusterRole system:public-info-viewer).
"""

from __future__ import annotations

from typing import Any

from kubernetes import client
from kubernetes.client.rest import ApiException

from dra_driver.names import DRIVER
from dra_driver.slices import Conflict, Slice
from kube_contract.apiclient import api_message, read_json


class ApiError(RuntimeError):
    """The API server refused or could not be reached; the message says which call and why."""


def describe(exc: BaseException) -> str:
    """A short reason: the API server's own message, or why it could not be reached."""
    if isinstance(exc, ApiException):
        return api_message(exc)
    reason = getattr(exc, "reason", None)   # urllib3's MaxRetryError: the connection error inside
    return f"API server unreachable ({reason or exc})"


class _SliceWrites(client.ResourceV1Api):
    """The slice writes without the client's argument validation (pydantic's validate_call), which turns
    the raw JSON body into its model (V1ResourceSlice) to serialize it back: ~8 ms of GIL-bound work per
    slice in the kubelet plugin's process, where prepares wait behind it (dra_driver.slices). The body
    is the API server's own JSON (dra_driver.slices.resource_slice), sent as it is. A client without that
    wrapper (no ``__wrapped__``) is used as it is."""

    create_resource_slice = getattr(client.ResourceV1Api.create_resource_slice, "__wrapped__",
                                    client.ResourceV1Api.create_resource_slice)
    replace_resource_slice = getattr(client.ResourceV1Api.replace_resource_slice, "__wrapped__",
                                     client.ResourceV1Api.replace_resource_slice)


class KubeAPI:
    def __init__(self, api_client: client.ApiClient, *, timeout: float = 10.0) -> None:
        self._resource = client.ResourceV1Api(api_client)
        self._core = client.CoreV1Api(api_client)
        self._slice_writes = _SliceWrites(api_client)
        self._version = client.VersionApi(api_client)
        self.timeout = timeout

    def server_version(self) -> dict[str, Any]:
        """The API server's /version (VersionInfo: major, minor, gitVersion, ...)."""
        api = self._version
        return self._call("reading the API server's version", lambda: api.get_code(
            _preload_content=False, _request_timeout=self.timeout))

    def read_claim(self, namespace: str, name: str) -> dict[str, Any]:
        api = self._resource
        return self._call(f"reading ResourceClaim {namespace}/{name}", lambda: api.read_namespaced_resource_claim(
            name, namespace, _preload_content=False, _request_timeout=self.timeout))

    def read_pod(self, namespace: str, name: str) -> dict[str, Any]:
        api = self._core
        return self._call(f"reading pod {namespace}/{name}", lambda: api.read_namespaced_pod(
            name, namespace, _preload_content=False, _request_timeout=self.timeout))

    def node_uid(self, node: str) -> str:
        api = self._core
        doc = self._call(f"reading node {node}", lambda: api.read_node(
            node, _preload_content=False, _request_timeout=self.timeout))
        return str(doc["metadata"]["uid"])

    def list_slices(self, node: str) -> list[Slice]:
        api = self._resource
        doc = self._call("listing ResourceSlices", lambda: api.list_resource_slice(
            field_selector=f"spec.nodeName={node},spec.driver={DRIVER}", _preload_content=False,
            _request_timeout=self.timeout))
        return [s for s in doc.get("items") or []
                if s.get("spec", {}).get("nodeName") == node and s.get("spec", {}).get("driver") == DRIVER]

    def create_slice(self, body: Slice) -> Slice:
        api = self._slice_writes
        return self._call(f"creating ResourceSlice {body['metadata']['name']}", lambda: api.create_resource_slice(
            body, _preload_content=False, _request_timeout=self.timeout))

    def replace_slice(self, body: Slice) -> Slice:
        api = self._slice_writes
        name = body["metadata"]["name"]
        return self._call(f"updating ResourceSlice {name}", lambda: api.replace_resource_slice(
            name, body, _preload_content=False, _request_timeout=self.timeout))

    def delete_slice(self, name: str) -> None:
        api = self._resource
        try:
            self._call(f"deleting ResourceSlice {name}", lambda: api.delete_resource_slice(
                name, _preload_content=False, _request_timeout=self.timeout))
        except ApiError as exc:
            if not isinstance(exc.__cause__, ApiException) or exc.__cause__.status != 404:
                raise

    def _call(self, what: str, call: Any) -> Any:
        try:
            return read_json(call())
        except ApiException as exc:
            if exc.status == 409:
                raise Conflict(f"{what}: {api_message(exc)}") from exc
            raise ApiError(f"{what}: {describe(exc)}") from exc
        except Exception as exc:   # urllib3 raises several unrelated types when the server is away
            raise ApiError(f"{what}: {describe(exc)}") from exc

