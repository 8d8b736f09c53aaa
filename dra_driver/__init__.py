"""vcuda's Kubernetes DRA driver (`vcuda dra-driver`), driver name ``gpu.vcuda.io``.

A kubelet plugin: it registers through the kubelet's plugin watcher
(`registration`), serves the DRA service v1 and v1beta1 (`service`), publishes
this node's GPUs as a ResourceSlice with consumable capacity (`slices`), and
prepares claims (`driver`): it reads each claim's allocation (`claims`), sets
up the container directory and token-scheduler tenant exactly as vgpu Allocate
does, checkpoints the claim (`checkpoint`) and injects it through a CDI spec
(`cdi`). The API server is reached through `kube`; `cli` wires it all.
"""
