"""The node's vcuda state, alike for every part that sets up a container: `vcuda run`
on a bare machine, the device plugin, the DRA driver; and what the exporter and
`vcuda top` read back. Nothing here imports those parts or the Kubernetes
contract's users; the token scheduler is driven through its admin client.

Modules, one job each:

- ``layout``     the state directory: per-GPU scheduler and per-container directories, ContainerRecord
- ``containers`` create and remove a container's directory: its record, its ledger with the limits set,
                 ld.so.preload; the paths the container sees them at
- ``schedulers`` one token scheduler per GPU as a supervised child; add, update and remove tenants
- ``supervisor`` keep helper processes (token schedulers, MPS daemons) running, restarting with backoff
- ``metrics_snapshot`` one reading of the node's GPUs and tenants (NVML, records, ledgers, schedulers),
                 for the exporter and `vcuda top`
- ``lifeline``   run a child module that ends with its parent (PR_SET_PDEATHSIG)
"""
