"""The one interface every placement policy implements, and the registry of policies."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from nexus_admit.model import ClusterSnapshot, Gang, Placement, PlacementConfig

__all__ = ["PlacementPolicy", "make_policy", "policy_names", "register"]


@runtime_checkable
class PlacementPolicy(Protocol):
    """`place` never mutates `snapshot`; callers apply the returned slots themselves."""

    name: str

    def place(
        self, snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig
    ) -> Placement: ...


PolicyFactory = Callable[[int], PlacementPolicy]  # seed -> policy
_REGISTRY: dict[str, PolicyFactory] = {}


def register(name: str) -> Callable[[PolicyFactory], PolicyFactory]:
    def wrap(factory: PolicyFactory) -> PolicyFactory:
        _REGISTRY[name] = factory
        return factory

    return wrap


def policy_names() -> list[str]:
    _load_builtin()
    return sorted(_REGISTRY)


def make_policy(name: str, seed: int = 0) -> PlacementPolicy:
    """Build a policy by name ("nexus", "default", "binpack", "fgd", ...)."""
    _load_builtin()
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {sorted(_REGISTRY)}") from None
    return factory(seed)


def _load_builtin() -> None:
    # Importing the modules registers their policies.
    from nexus_admit.placement import baselines, engine  # noqa: F401
