"""gRPC stubs of the kubelet APIs a DRA driver serves (plugin registration v1, DRA v1 and v1beta1),
generated from the .proto files here by `python -m dra_driver.api.generate`."""
