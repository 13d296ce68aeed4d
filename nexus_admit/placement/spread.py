"""Serving spread, defined once: the `spreadPairs` term and the hard spread rules.

A spreading gang (inference, service) belongs to a service: its own pods plus the
siblings already placed (`Gang.siblings`, node -> pods: a Deployment's other replicas, the
pods of a StatefulSet before a scale-up). `spreadPairs` counts the pairs of the service's
pods that this placement makes share a node, or a domain of a level above the host, each
pair weighted by `PlacementConfig.spread` for that level: per domain with `s` siblings and
`x` new pods, `s·x + x(x-1)/2`. It is convex in `x`, so the model encodes it with tangent
lines (cpmodel.py), and for one pod it is a cost of the node alone (onepod.py).

`Gang.spread_rules` are hard (pod anti-affinity, DoNotSchedule topology spread): at most
so many pods of the service per domain, and counts per domain within a skew over the
domains the gang may use.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Mapping

from nexus_admit.model import Domain, SpreadRule
from nexus_admit.placement.problem import Problem

__all__ = [
    "domain_of",
    "eligible_domains",
    "node_pair_cost",
    "one_pod_allowed",
    "pair_cost",
    "rule_violations",
    "sibling_counts",
    "spread_level_weights",
]


def spread_level_weights(problem: Problem) -> list[tuple[int, int]]:
    """(level index, weight per pair) of every level the spread term counts: none for
    packing types (their placements are unchanged by it)."""
    if problem.gang.workload_type.packs:
        return []
    spread, host = problem.config.spread, len(problem.levels) - 1
    out = []
    for li, level in enumerate(problem.levels):
        weight = spread.level_weight(level, li == host)
        if weight:
            out.append((li, weight))
    return out


def domain_of(problem: Problem, node: str, level_index: int) -> Domain | None:
    """The node's domain at one level; at the host level the node itself, even where a
    level above has no label (the path is cut there, a node is still a node)."""
    if level_index == len(problem.levels) - 1:
        return (node,)
    path = problem.paths.get(node)
    return path[level_index] if path is not None else None


def sibling_counts(problem: Problem, level_index: int) -> dict[Domain, int]:
    """The service's pods already placed, per domain of one level (nodes the snapshot does
    not know, or without the level's label, count nowhere)."""
    out: dict[Domain, int] = defaultdict(int)
    for node, pods in problem.gang.siblings.items():
        domain = domain_of(problem, node, level_index) if node in problem.paths else None
        if domain is not None and pods > 0:
            out[domain] += pods
    return out


def pair_cost(problem: Problem, per_node: Mapping[str, int]) -> float:
    """The weighted pairs this placement (pods per node) adds to the service."""
    total = 0
    for li, weight in spread_level_weights(problem):
        siblings = sibling_counts(problem, li)
        placed: dict[Domain, int] = defaultdict(int)
        for node, pods in per_node.items():
            domain = domain_of(problem, node, li)
            if domain is not None:
                placed[domain] += pods
        total += weight * sum(siblings.get(d, 0) * x + x * (x - 1) // 2 for d, x in placed.items())
    return float(total)


def node_pair_cost(problem: Problem, node: str) -> float:
    """`pair_cost` of one pod on `node`: the siblings it joins, weighted per level."""
    return pair_cost(problem, {node: 1})


def eligible_domains(problem: Problem, level_index: int) -> set[Domain]:
    """The domains a skew is taken over: those of the nodes any pod set of the gang may
    ever use (static filters; full nodes included, as kube-scheduler counts them)."""
    out: set[Domain] = set()
    for names in problem.candidates.values():
        for name in names:
            domain = domain_of(problem, name, level_index)
            if domain is not None:
                out.add(domain)
    return out


def rule_violations(problem: Problem, per_node: Mapping[str, int]) -> list[str]:
    """How a placement (pods per node) breaks the gang's spread rules: where it puts pods,
    more of the service in a domain than `max_per_domain`, or a domain more than `max_skew`
    above the least-loaded eligible domain (siblings counted)."""
    out: list[str] = []
    for rule in problem.gang.spread_rules:
        if rule.level not in problem.levels:
            out.append(f"spread rule on {rule.level!r}: not a topology level")
            continue
        li = problem.levels.index(rule.level)
        counts = sibling_counts(problem, li)
        used: set[Domain] = set()
        for node, pods in per_node.items():
            domain = domain_of(problem, node, li)
            if domain is not None and pods > 0:
                counts[domain] += pods
                used.add(domain)
        out.extend(_broken(rule, counts, used, eligible_domains(problem, li)))
    return out


def one_pod_allowed(problem: Problem) -> Callable[[str], bool]:
    """Whether one more pod on a node keeps the gang's spread rules: the counts are taken
    once (a one-pod gang's scan asks it of every candidate node)."""
    checks: list[Callable[[str], bool]] = []
    for rule in problem.gang.spread_rules:
        li = problem.levels.index(rule.level)
        counts = sibling_counts(problem, li)
        eligible = eligible_domains(problem, li)
        checks.append(_one_more(problem, rule, li, counts, eligible))
    return lambda node: all(check(node) for check in checks)


def _one_more(
    problem: Problem, rule: SpreadRule, li: int, counts: Mapping[Domain, int], eligible: set[Domain]
) -> Callable[[str], bool]:
    ordered = sorted(counts.get(d, 0) for d in eligible)

    def allowed(node: str) -> bool:
        domain = domain_of(problem, node, li)
        if domain is None:
            return True
        now = counts.get(domain, 0) + 1
        if rule.max_per_domain is not None and now > rule.max_per_domain:
            return False
        if rule.max_skew is None or not ordered:
            return True
        # the lowest count after the pod: unchanged unless this domain was the only lowest
        low = ordered[0]
        if domain in eligible and now - 1 == low and (len(ordered) == 1 or ordered[1] > low):
            low = min(now, ordered[1]) if len(ordered) > 1 else now
        return now - low <= rule.max_skew

    return allowed


def _broken(
    rule: SpreadRule, counts: Mapping[Domain, int], used: set[Domain], eligible: set[Domain]
) -> list[str]:
    out = []
    busiest = max((counts.get(d, 0) for d in used), default=0)
    if rule.max_per_domain is not None and busiest > rule.max_per_domain:
        out.append(f"{busiest} pods of the service in one {rule.level} domain "
                   f"(at most {rule.max_per_domain})")
    if rule.max_skew is not None and eligible and used:
        low = min(counts.get(d, 0) for d in eligible | used)
        if busiest - low > rule.max_skew:
            out.append(f"{rule.level} skew {busiest - low} (at most {rule.max_skew})")
    return out
