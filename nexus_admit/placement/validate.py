"""Independent check of every hard constraint of a placement (used by the property tests,
`bench`, and the simulator to prove zero violations)."""

from __future__ import annotations

from collections import defaultdict

from nexus_admit.model import (
    ClusterSnapshot,
    Gang,
    NumaPolicy,
    Placement,
    PlacementConfig,
)
from nexus_admit.placement.problem import Problem, prepare
from nexus_admit.placement.spread import rule_violations

__all__ = ["violations"]


def violations(
    snapshot: ClusterSnapshot, gang: Gang, placement: Placement, config: PlacementConfig
) -> list[str]:
    """Every way `placement` breaks a hard constraint on `snapshot`; empty when it is sound."""
    if not placement.feasible:
        return [] if not placement.slots else ["infeasible placement carries slots"]
    problem = prepare(snapshot, gang, config)
    out: list[str] = []
    pod_sets = {p.name: p for p in gang.pod_sets}
    seen: dict[str, set[int]] = defaultdict(set)
    cpu: dict[str, int] = defaultdict(int)
    mem: dict[str, int] = defaultdict(int)
    pods: dict[str, int] = defaultdict(int)
    gpu_share: dict[tuple[str, int], int] = defaultdict(int)
    zone_cpu: dict[tuple[str, int], int] = defaultdict(int)
    for slot in placement.slots:
        ps = pod_sets.get(slot.pod_set)
        if ps is None:
            out.append(f"slot for unknown pod set {slot.pod_set!r}")
            continue
        node = snapshot.nodes.get(slot.node)
        if node is None:
            out.append(f"slot on unknown node {slot.node!r}")
            continue
        if slot.index in seen[ps.name]:
            out.append(f"{ps.name}[{slot.index}] placed twice")
        seen[ps.name].add(slot.index)
        why = ps.static_fit(node)
        if why:
            out.append(f"{ps.name}[{slot.index}] on {node.name}: {why}")
        cpu[node.name] += ps.cpu_milli
        mem[node.name] += ps.memory_mib
        pods[node.name] += 1
        if len(set(slot.gpu_indices)) != ps.gpus:
            out.append(f"{ps.name}[{slot.index}] has {len(slot.gpu_indices)} GPUs, needs {ps.gpus}")
        for g in slot.gpu_indices:
            if not 0 <= g < node.gpu_count:
                out.append(f"{ps.name}[{slot.index}] on {node.name}: no GPU {g}")
                continue
            gpu_share[(node.name, g)] += ps.gpu_milli
        if slot.numa_zone is not None:
            zone_cpu[(node.name, slot.numa_zone)] += ps.cpu_milli
            zone = next((z for z in node.numa_zones if z.id == slot.numa_zone), None)
            if zone is None:
                out.append(f"{ps.name}[{slot.index}] on {node.name}: no NUMA zone {slot.numa_zone}")
            elif any(g not in zone.gpu_indices for g in slot.gpu_indices):
                out.append(f"{ps.name}[{slot.index}] GPUs not in its NUMA zone {slot.numa_zone}")
        elif gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE and node.numa_zones:
            out.append(f"{ps.name}[{slot.index}] on {node.name}: no single NUMA zone")
    for ps in gang.pod_sets:
        if seen[ps.name] != set(range(ps.count)):
            out.append(f"pod set {ps.name}: placed indices {len(seen[ps.name])} of {ps.count}")
    for name in pods:
        node = snapshot.nodes[name]
        if cpu[name] > node.free_cpu_milli:
            out.append(f"{name}: CPU over-committed ({cpu[name]}m > {node.free_cpu_milli}m free)")
        if mem[name] > node.free_memory_mib:
            out.append(f"{name}: memory over-committed")
        if pods[name] > node.free_pods:
            out.append(f"{name}: pod slots over-committed")
    for (name, g), share in gpu_share.items():
        node = snapshot.nodes[name]
        if 0 <= g < node.gpu_count and share > node.gpu_free[g]:
            out.append(f"{name} GPU {g}: {share} milli asked, {node.gpu_free[g]} free")
    for (name, z), used in zone_cpu.items():
        zone = next((zz for zz in snapshot.nodes[name].numa_zones if zz.id == z), None)
        if (
            zone is not None
            and used > zone.free_cpu_milli
            and (gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE)
        ):
            out.append(f"{name} NUMA zone {z}: CPU over-committed")
    out.extend(rule_violations(problem, placement.pods_per_node()))
    out += _required_domains_broken(problem, placement)
    return out


def _required_domains_broken(problem: Problem, placement: Placement) -> list[str]:
    """Each required level whose bound pod sets span more than one of its domains."""
    out = []
    for li, names in problem.required_domains:
        bound = [s for s in placement.slots if s.pod_set in names and s.node in problem.paths]
        domains = {problem.paths[s.node][li] for s in bound}
        if bound and (len(domains) != 1 or None in domains):
            whose = ""
            if not problem.binds_whole_gang(li):
                whose = f" (pod sets {', '.join(sorted(names))})"
            out.append(f"required {problem.levels[li]}{whose}: spans {len(domains)} domains")
    return out
