"""Baseline policies, each written from its published definition. Importing this package
registers them with `nexus_admit.placement.base`."""

from nexus_admit.placement.baselines import fgd, kube, paper, simple, tas

__all__ = ["fgd", "kube", "paper", "simple", "tas"]
