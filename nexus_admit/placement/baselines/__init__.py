"""Baseline policies, each written from its published definition; `placement/policies.py`
lists them by name."""

from nexus_admit.placement.baselines import fgd, kube, paper, simple, tas

__all__ = ["fgd", "kube", "paper", "simple", "tas"]
