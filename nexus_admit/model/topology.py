"""Fabric paths: a node's domain at each topology level, qualified by the levels above it
(rack "r1" of block "b1" is a different domain from rack "r1" of block "b2")."""

from __future__ import annotations

from collections.abc import Sequence

from nexus_admit.model.cluster import Node

__all__ = ["Domain", "domain_at", "domain_path"]

Domain = tuple[str, ...]


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
