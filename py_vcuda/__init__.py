"""vcuda: GPU sharing with enforced memory and compute quotas."""

__version__ = "0.1.0"
