"""The Kubernetes contract every Kubernetes-facing part of vcuda shares (the device
plugin, the scheduler extender, the DRA driver): nothing here imports those parts.

Modules, one job each:

- ``names``      resource and annotation names (domain and prefix configurable)
"""
