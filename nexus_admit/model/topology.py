"""Fabric paths: a node's domain at each topology level, qualified by the levels above it
(rack "r1" of block "b1" is a different domain from rack "r1" of block "b2"), and the
NVLink clique as a level of its own for gangs that must stay inside one."""

from __future__ import annotations

from collections.abc import Sequence

from nexus_admit.model.cluster import Node

__all__ = ["NVLINK_CLIQUE_LEVEL", "Domain", "domain_at", "domain_path", "with_clique_level"]

Domain = tuple[str, ...]

# The node label naming a node's multi-node NVLink domain (GPU feature discovery writes it:
# "<cluster uuid>.<clique id>", unique across the fleet)
NVLINK_CLIQUE_LEVEL = "nvidia.com/gpu.clique"


def with_clique_level(levels: Sequence[str], needed: bool) -> tuple[str, ...]:
    """The topology levels a gang is placed with: the configured ones, and when the gang
    must stay inside one NVLink clique (`needed`) and they do not name the clique, the clique
    first. Its values are unique across the fleet, so it heads the path; every level below
    is then qualified by it, so one domain of any level lies inside one clique."""
    if not needed or NVLINK_CLIQUE_LEVEL in levels:
        return tuple(levels)
    return (NVLINK_CLIQUE_LEVEL, *levels)


def domain_path(node: Node, levels: Sequence[str]) -> tuple[Domain | None, ...]:
    """One domain per level, highest first; None from the first level the node lacks."""
    out: list[Domain | None] = []
    prefix: list[str] = []
    missing = False
    for level in levels:
        value = node.name if level == "kubernetes.io/hostname" else node.labels.get(level)
        if value is None or missing:
            missing = True
            out.append(None)
            continue
        prefix.append(value)
        out.append(tuple(prefix))
    return tuple(out)


def domain_at(node: Node, levels: Sequence[str], level: str) -> Domain | None:
    return domain_path(node, levels)[list(levels).index(level)]
