"""The mutating admission webhook: sends pods that ask for vcuda resources to vcuda's scheduler.

Served by the extender process on its own HTTPS port (``vcuda extender --webhook-listen``).
Modules, one job each:

- ``mutate``    the decision, pure: AdmissionReview in, AdmissionReview out (and a notice to act on)
- ``certs``     the TLS material, pure: what a store must hold at a given time (make, keep, rotate)
- ``stores``    where it lives: a Secret, or a local directory
- ``rotation``  one pass and a periodic loop over a store, and the caBundle of the webhook configuration
- ``notify``    Events for pods left alone because they name another scheduler
- ``server``    the HTTPS server (``POST /mutate-pods``), reloading its certificate in place
- ``app``       wiring from the command's flags
"""
