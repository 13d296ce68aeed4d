"""Human-readable lines that say why a placement looks the way it does; the first line is
short enough for the Workload's admission check message."""

from __future__ import annotations

from collections import Counter

from nexus_admit.model import Placement
from nexus_admit.placement.problem import Problem

__all__ = ["explain", "summary_line"]


def summary_line(problem: Problem, placement: Placement) -> str:
    if not placement.feasible:
        return placement.reason
    nodes = placement.pods_per_node()
    classes = Counter(problem.node_class[n] or "cpu" for n in nodes)
    cls = "/".join(f"{c}" for c, _ in classes.most_common())
    where = []
    for li, level in enumerate(problem.levels[:-1]):
        domains = {problem.paths[n][li] for n in nodes}
        where.append(f"{len(domains)} {level.rsplit('/', 1)[-1]}")
    t = placement.terms
    return (
        f"{len(placement.slots)} pods on {len(nodes)} {cls} nodes ({', '.join(where)}); "
        f"tier {problem.gang.tier}: mismatch {t.get('tierMismatch', 0):g}, "
        f"islands broken {t.get('islandsBroken', 0):g}; {placement.policy} {placement.status}"
    )


def explain(problem: Problem, placement: Placement) -> list[str]:
    lines = [summary_line(problem, placement)]
    if not placement.feasible:
        return lines
    gang = problem.gang
    lines.append(
        f"workload type {gang.workload_type}: "
        + (
            "packed onto few nodes and domains"
            if gang.workload_type.packs
            else "spread across nodes for availability"
        )
    )
    if gang.required_level:
        lines.append(f"all pods inside one {gang.required_level} domain (required)")
    elif gang.preferred_level:
        lines.append(f"as few {gang.preferred_level} domains as possible (preferred)")
    for ps in gang.pod_sets:
        excluded = problem.rejections.get(ps.name)
        if excluded:
            reasons = ", ".join(f"{n} {r}" for r, n in excluded.most_common(3))
            lines.append(
                f"pod set {ps.name}: {len(problem.candidates[ps.name])} eligible "
                f"nodes ({reasons} excluded)"
            )
    weights_line = ", ".join(f"{k}={v:g}" for k, v in placement.terms.items())
    lines.append(f"terms: {weights_line}; objective {placement.objective:g}")
    return lines
