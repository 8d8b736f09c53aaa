"""vcuda: GPU sharing with enforced memory and compute quotas.

This package is the core every part builds on (``native``, ``_native``,
``quantity``, ``ledger``, ``nvml``, ``sim``, ``gpu``, ``probe``), the
bare-machine commands (``launch`` for `vcuda run`, ``top``, ``demo``,
``doctor``), and ``cli``, the `vcuda` dispatcher: the only module that imports
every part. The layers are in README.md ("Layout") and tests/test_layering.py.
"""

__version__ = "0.1.0"
