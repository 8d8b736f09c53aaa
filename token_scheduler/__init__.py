"""Per-GPU token scheduler of vcuda: a pure policy and the pyzmq daemon around it.

Wire format and admin API: token_scheduler/PROTOCOL.md.
"""

from .policy import Grant, Policy, PolicyConfig
from .wire import VERSION as PROTOCOL_VERSION

__all__ = ["Grant", "Policy", "PolicyConfig", "PROTOCOL_VERSION"]
