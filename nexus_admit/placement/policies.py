"""Every placement policy by name: one explicit table, so adding a policy is one line here
and nothing registers itself on import.

Who calls it: `plan`, `bench`, `simulate` and the controller (`nexus-admit run --policy`).
"""

from __future__ import annotations

from nexus_admit.placement.base import PlacementPolicy, PolicyFactory
from nexus_admit.placement.baselines.fgd import fgd_policy
from nexus_admit.placement.baselines.kube import binpack_policy, default_policy
from nexus_admit.placement.baselines.paper import (
    dotprod_policy,
    gpu_clustering_policy,
    gpu_packing_policy,
    paper_bestfit_policy,
    paper_random_policy,
)
from nexus_admit.placement.baselines.simple import bestfit_policy, random_policy
from nexus_admit.placement.baselines.tas import tas_bestfit_policy
from nexus_admit.placement.engine import nexus_policy

__all__ = ["POLICIES", "make_policy", "policy_names"]

POLICIES: dict[str, PolicyFactory] = {
    "nexus": nexus_policy,
    "default": default_policy,
    "binpack": binpack_policy,
    "bestfit": bestfit_policy,
    "random": random_policy,
    "tas-bestfit": tas_bestfit_policy,
    "fgd": fgd_policy,
    "dotprod": dotprod_policy,
    "gpu-clustering": gpu_clustering_policy,
    "gpu-packing": gpu_packing_policy,
    "paper-bestfit": paper_bestfit_policy,
    "paper-random": paper_random_policy,
}


def policy_names() -> list[str]:
    return sorted(POLICIES)


def make_policy(name: str, seed: int = 0) -> PlacementPolicy:
    """Build a policy by name ("nexus", "default", "binpack", "fgd", ...)."""
    try:
        factory = POLICIES[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {policy_names()}") from None
    return factory(seed)
