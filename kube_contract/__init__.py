"""The Kubernetes contract every Kubernetes-facing part of vcuda shares (the device
plugin, the scheduler extender, the DRA driver): nothing here imports those parts.

Modules, one job each:

- ``names``      resource and annotation names (domain and prefix configurable)
- ``assignment`` the extender's decision annotation on a pod, which the device plugin cross-checks
- ``topology``   the node annotation the device plugin publishes (GPUs and NVLink) for the extender
- ``apiclient``  the API server through the official client: build one, read raw JSON and watch streams
- ``podresources`` which pod and container hold a device, from the kubelet's pod-resources API
- ``api``        gRPC stubs of the kubelet APIs (device plugin v1beta1, pod-resources v1, plugin registration
                 v1, DRA v1 and v1beta1), from their .proto files
- ``kubelet_socket`` gRPC servers on the unix sockets the kubelet dials, and noticing one re-created
- ``testing``    test doubles: a fake API server (pods, nodes, ResourceClaims, ResourceSlices) and
                 pod/node/topology builders (tests and benchmarks)
"""
