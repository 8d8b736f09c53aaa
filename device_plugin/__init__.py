"""kubelet device plugin and node agent (vGPU, pGPU, MPS), metrics exporter, node labels.

What it shares with the extender (names, annotation formats, API clients, the
kubelet gRPC stubs) is in kube_contract; the node state it writes (container
directories and records, ledgers, token-scheduler supervision, the metrics
snapshot) is in node_state, which `vcuda run` and `vcuda top` use too.
"""
