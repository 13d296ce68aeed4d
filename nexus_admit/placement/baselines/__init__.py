"""Baseline policies, each written from its published definition. Importing this package
registers them with `nexus_admit.placement.base`."""

from nexus_admit.placement.baselines import kube, simple, tas

__all__ = ["kube", "simple", "tas"]
