"""gRPC stubs of the kubelet APIs (device plugin v1beta1, pod-resources v1),
generated from the .proto files here by `python -m kube_contract.api.generate`."""
