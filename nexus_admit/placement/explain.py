"""Human-readable lines that say why a placement looks the way it does; the first line is
short enough for the Workload's admission check message."""

from __future__ import annotations

from collections import Counter

from nexus_admit.model import Placement
from nexus_admit.placement.problem import Problem

__all__ = ["explain", "pod_sets_line", "summary_line"]


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


def pod_sets_line(problem: Problem, placement: Placement) -> str:
    """Where each pod set went ("driver: 1 pod on a CPU node; workers: 4 pods in rack r0"),
    or "" when the gang has one pod set or every pod set went to the same place."""
    if len(problem.gang.pod_sets) < 2:
        return ""
    wheres = [(ps.name, _where(problem, placement, ps.name)) for ps in problem.gang.pod_sets]
    if len({where for _, (_, where) in wheres}) < 2:
        return ""
    return "; ".join(f"{name}: {pods} {where}" for name, (pods, where) in wheres)


def _where(problem: Problem, placement: Placement, pod_set: str) -> tuple[str, str]:
    """(how many pods, where) for one pod set: its CPU nodes, its one node, or the lowest
    topology domain holding all its pods."""
    nodes = sorted({s.node for s in placement.slots if s.pod_set == pod_set})
    count = sum(1 for s in placement.slots if s.pod_set == pod_set)
    pods = f"{count} pod{'' if count == 1 else 's'}"
    if not any(problem.node(n).gpu_count for n in nodes):
        return pods, "on a CPU node" if len(nodes) == 1 else f"on {len(nodes)} CPU nodes"
    if len(nodes) == 1:
        return pods, f"on node {nodes[0]}"
    for li in range(len(problem.levels) - 2, -1, -1):
        domains = {problem.paths[n][li] for n in nodes}
        domain = next(iter(domains))
        if len(domains) == 1 and domain is not None:
            return pods, f"in {_short(problem.levels[li])} {domain[-1]}"
    top = {problem.paths[n][0] for n in nodes}
    return pods, f"on {len(nodes)} nodes across {len(top)} {_short(problem.levels[0])}s"


def _short(level: str) -> str:
    """A level's label key without its prefix ("topology.kubernetes.io/zone" → "zone")."""
    return level.rsplit("/", 1)[-1]


def explain(problem: Problem, placement: Placement) -> list[str]:
    lines = [summary_line(problem, placement)]
    if not placement.feasible:
        return lines
    per_pod_set = pod_sets_line(problem, placement)
    if per_pod_set:
        lines.append(per_pod_set)
    gang = problem.gang
    lines.append(
        f"workload type {gang.workload_type}: "
        + (
            "packed onto few nodes and domains"
            if gang.workload_type.packs
            else "spread across nodes for availability"
        )
    )
    partial = problem.partial_domains()
    for li, names in partial:
        lines.append(
            f"pod sets {', '.join(sorted(names))} inside one {problem.levels[li]} domain (required)"
        )
    if gang.required_level and not partial:
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
