"""The node's vcuda state, alike for every part that sets up a container: `vcuda run`
on a bare machine, the device plugin, the DRA driver; and what the exporter and
`vcuda top` read back. Nothing here imports those parts or the Kubernetes
contract's users; the token scheduler is driven through its admin client.

Modules, one job each:

- ``layout``     the state directory: per-GPU scheduler and per-container directories, ContainerRecord
- ``containers`` create and remove a container's directory: its record, its ledger with the limits set,
                 its quota file (libvcuda's only source in the container), ld.so.preload; the paths
                 the container sees them at
- ``tenancy``    a shared-GPU container's set-up (directory and tenant, all or nothing) and the env and
                 mounts that put it into the container (vgpu Allocate and DRA prepare alike)
- ``schedulers`` one token scheduler per GPU as a supervised child; add, update and remove tenants
- ``supervisor`` keep helper processes (token schedulers, MPS daemons) running, restarting with backoff
- ``metrics_snapshot`` one reading of the node's GPUs and tenants (NVML, records, ledgers, schedulers),
                 for the exporter and `vcuda top`
- ``lifeline``   run a child module that ends with its parent (PR_SET_PDEATHSIG)
- ``gpus``       the node's GPU inventory (identities, NVLink) and which GPUs are unhealthy
- ``health``     the XID / probe health monitor that keeps ``gpus.Health`` current
- ``metrics``, ``metrics_text``  the Prometheus exporter over metrics_snapshot (METRICS.md)
- ``options``    the node daemons' option tables: flag > env > file > default, validated
- ``daemon``     a node daemon's life: logging, NVML, health, its agent, until SIGTERM
- ``gpu_driver`` what the driver puts in every GPU container: nothing of ours on a real node, the GPU
                 simulator's libraries and state in the e2e tier (test only, ``--simulator``)
- ``testing``    test doubles: GPUs with the simulator's UUIDs, wait_for
"""
