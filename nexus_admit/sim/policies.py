"""The simulators' placement policies: one registered policy, told the workload it will see
when it reads one (the FGD baseline and the engine's fragGradient term do)."""

from __future__ import annotations

from collections.abc import Callable

from nexus_admit.placement.base import PlacementPolicy
from nexus_admit.placement.fragmentation import WorkloadAware, WorkloadDistribution
from nexus_admit.placement.policies import make_policy

__all__ = ["policy_for"]


def policy_for(
    name: str, seed: int, workload: Callable[[], WorkloadDistribution]
) -> PlacementPolicy:
    """`make_policy(name, seed)`, given the target workload if it is workload-aware;
    `workload()` runs only then (building the distribution reads the whole trace)."""
    policy = make_policy(name, seed)
    if isinstance(policy, WorkloadAware):
        policy.set_workload(workload())
    return policy
