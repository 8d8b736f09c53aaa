"""vcuda kube-scheduler extender: places fractional GPU requests on a concrete GPU.

The names and annotation schemas it shares with the device plugin live in
``kube_contract``. Modules, one job each:

- ``podspec``    pod JSON -> what the pod asks for
- ``placement``  the pure placement core (which GPU, score, human reasons)
- ``state``      cluster usage: pods, in-flight reservations, the decide+reserve lock
- ``extender``   kube-scheduler's filter / prioritize / bind semantics
- ``server``     the HTTP layer
- ``kube``       API-server list+watch and patch+bind with the official client
- ``webhook``    the mutating admission webhook (schedulerName for pods asking for vcuda resources, its TLS)
- ``cli``        flags and wiring
"""

__all__ = ["__version__"]
__version__ = "0.1.0"
