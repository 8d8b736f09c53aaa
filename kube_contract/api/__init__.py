"""gRPC stubs of the kubelet APIs (device plugin v1beta1, pod-resources v1, plugin registration v1,
DRA v1 and v1beta1), generated from the .proto files here by `python -m kube_contract.api.generate`."""
