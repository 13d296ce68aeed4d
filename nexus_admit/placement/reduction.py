"""Which nodes enter the model: the candidates with room for the gang, then the exact
symmetry reduction (interchangeable nodes kept only as many times as the gang could use
them). The heuristic domain-first pruning that may follow is placement/pruning.py.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from nexus_admit.model import GPU_WHOLE, Domain, Node, NumaPolicy, PodSet, pod_capacity
from nexus_admit.placement.columns import pod_capacities
from nexus_admit.placement.memo import NodeMemo, node_state, pod_shape
from nexus_admit.placement.problem import Problem

__all__ = [
    "LoneStates",
    "Reduction",
    "candidates",
    "class_key",
    "domain_shortfall",
    "holds",
    "keeps_every_candidate",
    "keeps_off_gpus",
    "lone_class_key",
    "lone_entries",
    "lone_entry",
    "lone_signature",
    "node_state",
    "per_node_limit",
    "reduce_symmetry",
    "restrict",
    "room_for_one",
    "room_shortfall",
    "shortfall",
    "with_twins",
]


@dataclass(slots=True)
class Reduction:
    """Which nodes enter the model and whether the reduction kept optimality."""

    nodes: list[str]
    caps: dict[tuple[str, str], int]  # (pod set, node) -> max pods
    exact: bool = True
    notes: list[str] = field(default_factory=list)
    # groups of interchangeable nodes: the model orders their loads to break symmetry
    twins: list[list[str]] = field(default_factory=list)
    # a greedy placement inside the kept nodes, found while pruning (the solver's hint)
    hint: dict[tuple[str, str], int] | None = None


def candidates(problem: Problem, memo: NodeMemo) -> Reduction:
    """Every node with room for at least one pod of some pod set, with its caps. A free
    GPU-less pod set beside GPU pod sets (see `keeps_off_gpus`) keeps to the nodes without
    GPUs when those have room for all its pods."""
    caps: dict[tuple[str, str], int] = {}
    nodes: dict[str, None] = {}
    notes: list[str] = []
    policy = problem.gang.numa_policy
    all_nodes = problem.snapshot.nodes
    per_node = per_node_limit(problem)
    for ps in problem.gang.pod_sets:
        names = problem.candidates[ps.name]
        if ps.count == 1 and per_node is None:  # room for one pod is all a cap of one reads
            room = [(name, 1) for name in names if room_for_one(all_nodes[name], ps, policy)]
        else:
            room = []
            fits = _capacities(problem, memo, ps, names)
            for name, fit in zip(names, fits, strict=True):
                cap = min(fit, ps.count)
                if per_node is not None:  # a spread rule per node, net of the siblings there
                    cap = min(cap, per_node - problem.gang.siblings.get(name, 0))
                if cap > 0:
                    room.append((name, cap))
        if keeps_off_gpus(problem, ps):
            cpu_only = [(name, cap) for name, cap in room if not all_nodes[name].gpu_count]
            if sum(cap for _, cap in cpu_only) >= ps.count:
                room = cpu_only
                notes.append(f"pod set {ps.name}: no GPUs, kept to {len(room)} CPU nodes")
        caps.update({(ps.name, name): cap for name, cap in room})
        nodes.update(dict.fromkeys([name for name, _ in room]))
    return Reduction(list(nodes), caps, notes=notes)


def _capacities(problem: Problem, memo: NodeMemo, ps: PodSet, names: Sequence[str]) -> list[int]:
    """`pod_capacity` of each of `names`: kept per node state on a tracked snapshot (the
    memo), else on columns where they serve (a fresh snapshot's every candidate)."""
    policy = problem.gang.numa_policy
    if not memo.remembers:
        whole = problem.gpu_columns().whole
        fits = pod_capacities(problem.snapshot, names, whole, ps, policy)
        if fits is not None:
            return cast(list[int], fits.tolist())
    nodes = problem.snapshot.nodes
    return memo.capacities([nodes[n] for n in names], ps, policy)


def room_for_one(node: Node, ps: PodSet, policy: NumaPolicy) -> int:
    """`min(pod_capacity(node, ps, policy), 1)`: a few comparisons for whole GPUs (or
    none) placed without a strict NUMA zone, what a one-pod decision asks of every node."""
    if ps.fractional or (policy is NumaPolicy.SINGLE_NUMA_NODE and node.numa_zones):
        return min(pod_capacity(node, ps, policy), 1)
    fits = (
        node.free_pods > 0
        and (not ps.cpu_milli or node.free_cpu_milli >= ps.cpu_milli)
        and (not ps.memory_mib or node.free_memory_mib >= ps.memory_mib)
        and (not ps.gpus or node.gpu_free.count(GPU_WHOLE) >= ps.gpus)
    )
    return int(fits)


def keeps_off_gpus(problem: Problem, ps: PodSet) -> bool:
    """A pod set without GPUs, not bound to any required domain, in a gang with GPU pod sets
    (a JobSet driver, a Ray head): it should not take a GPU node's room when nodes without
    GPUs have it."""
    gang = problem.gang
    return not ps.gpus and gang.uses_gpus and gang.level_of(ps) is None


def per_node_limit(problem: Problem) -> int | None:
    """The fewest pods of the service a node may hold by the gang's spread rules."""
    host = problem.levels[-1]
    limits = [
        r.max_per_domain
        for r in problem.gang.spread_rules
        if r.level == host and r.max_per_domain is not None
    ]
    return min(limits) if limits else None


def shortfall(problem: Problem, red: Reduction) -> str:
    """Why the candidates cannot hold the gang now (a pod set without room, or no domain of
    the required level with room for a one-pod-set gang), or "" when they may."""
    for ps in problem.gang.pod_sets:
        room = sum(c for (p, _), c in red.caps.items() if p == ps.name)
        if room < ps.count:
            return room_shortfall(problem, ps, room)
    required = problem.gang.required_level
    if required is not None:
        level = problem.levels.index(required)
        per_domain: dict[Domain | None, int] = defaultdict(int)
        for (_, n), c in red.caps.items():
            per_domain[problem.paths[n][level]] += c
        return domain_shortfall(problem, per_domain)
    return ""


def room_shortfall(problem: Problem, ps: PodSet, room: int) -> str:
    """`shortfall`'s answer for a pod set whose candidates have room for `room` pods."""
    what = f"{ps.gpus} GPU" if ps.gpus else "CPU-only"
    return (
        f"pod set {ps.name!r}: {ps.count} pods ({what} each) requested, "
        f"free capacity for {room} now{problem.closed_note()}; will retry"
    )


def domain_shortfall(problem: Problem, per_domain: dict[Domain | None, int]) -> str:
    """`shortfall`'s answer from the pods the candidates have room for per domain of the
    gang's required level ("" when one domain has room for all, or several pod sets)."""
    required = problem.gang.required_level
    largest = max(per_domain.values(), default=0)
    if largest < problem.gang.pod_count and len(problem.gang.pod_sets) == 1:
        return (
            f"no single {required} domain has room for all {problem.gang.pod_count} pods "
            f"now (largest: {largest}){problem.closed_note()}; "
            "will retry"
        )
    return ""


def reduce_symmetry(problem: Problem, red: Reduction, memo: NodeMemo) -> Reduction:
    """Keep each class of interchangeable nodes only as many times as the gang has pods
    (exact); the kept members of a class become twins the model may merge."""
    need = problem.gang.pod_count
    kept: list[str] = []
    seen: dict[tuple[object, ...], int] = defaultdict(int)
    groups: dict[tuple[object, ...], list[str]] = defaultdict(list)
    signature = lone_signature(problem)
    for name in red.nodes:
        key = class_key(problem, red, name, memo, signature)
        if key is None:
            kept.append(name)  # filling a clique needs every member in the model
            continue
        if seen[key] < need:
            seen[key] += 1
            kept.append(name)
            groups[key].append(name)
    keep = set(kept)
    caps = {k: v for k, v in red.caps.items() if k[1] in keep}
    notes = list(red.notes)
    if len(kept) < len(red.nodes):
        notes.append(f"{len(red.nodes)} candidate nodes, {len(kept)} after symmetry")
    twins = [members for members in groups.values() if len(members) > 1]
    return Reduction(kept, caps, red.exact, notes, twins)


def keeps_every_candidate(problem: Problem, red: Reduction) -> bool:
    """Whether `reduce_symmetry` keeps every candidate of `red`: a class's key holds the
    node's path above the host, so no class has more members than its parent domain has
    candidates, and none is cut while no parent domain has more than the gang's pods."""
    need = problem.gang.pod_count
    if len(red.nodes) <= need:
        return True
    if len(problem.levels) < 2:
        return False  # every node has the same (empty) path above the host
    # a domain names the levels above it (model/topology.py), so the level just above
    # the host tells the parent path; nodes without it are counted together (too many,
    # never too few)
    paths = problem.paths
    per_parent: dict[Domain | None, int] = defaultdict(int)
    for name in red.nodes:
        parent = paths[name][-2]
        per_parent[parent] += 1
        if per_parent[parent] > need:
            return False
    return True


def with_twins(
    problem: Problem, red: Reduction, memo: NodeMemo, candidate_order: Sequence[str]
) -> Reduction:
    """`red`, cut from candidates `reduce_symmetry` keeps whole (`keeps_every_candidate`),
    with the twins that reduction finds among its nodes: the groups of the reduction
    before the cut, restricted to the kept nodes (members in `candidate_order`, the
    candidates' order), so pruning first need not derive every candidate's class key."""
    keep = set(red.nodes)
    kept = [n for n in candidate_order if n in keep]
    twins = reduce_symmetry(problem, Reduction(kept, red.caps), memo).twins
    return Reduction(red.nodes, red.caps, red.exact, list(red.notes), twins, red.hint)


def class_key(
    problem: Problem,
    red: Reduction,
    name: str,
    memo: NodeMemo,
    signature: tuple[object, ...] | None,
) -> tuple[object, ...] | None:
    """The class of interchangeable candidates `name` belongs to in `reduce_symmetry`
    (`signature`: `lone_signature(problem)`), or None for a member of a pristine NVLink
    clique, which is never merged with another node."""
    node = problem.node(name)
    if node.clique is not None and node.clique in problem.pristine_cliques:
        return None

    def compute() -> tuple[object, ...]:
        return (*symmetry_key(problem, red, name, memo), *_frag_key(problem, name, memo))

    key = memo.derived(node, signature, compute) if signature is not None else compute()
    siblings = problem.gang.siblings
    if siblings:  # siblings make nodes of one shape differ
        key = (*key, siblings.get(name, 0))
    return key


def lone_signature(problem: Problem) -> tuple[object, ...] | None:
    """A lone pod set's symmetry key reads only the node, the config and these (its caps
    are min(pod_capacity, count)), so it is remembered per node state between solves."""
    gang = problem.gang
    if len(gang.pod_sets) != 1:
        return None
    ps = gang.pod_sets[0]
    return (*pod_shape(ps), ps.count, gang.numa_policy, problem.levels)


def lone_class_key(problem: Problem, name: str, cap: int, memo: NodeMemo) -> tuple[object, ...]:
    """The key `reduce_symmetry` gives a candidate node with room for `cap` pods of a
    gang of one pod set and no siblings (from the same memo entry)."""
    signature = lone_signature(problem)
    assert signature is not None and not problem.gang.siblings

    def compute() -> tuple[object, ...]:
        return (*node_key(problem, (cap,), name, memo), *_frag_key(problem, name, memo))

    return memo.derived(problem.node(name), signature, compute)


def _frag_key(problem: Problem, name: str, memo: NodeMemo) -> tuple[object, ...]:
    """With the fragmentation gradient on, nodes are twins only if the gradient is equal."""
    if not problem.config.weights.frag_gradient:
        return ()
    node = problem.node(name)
    return (memo.view(node).sorted_gpu_free, node.free_cpu_milli, node.gpu_product)


def symmetry_key(problem: Problem, red: Reduction, name: str, memo: NodeMemo) -> tuple[object, ...]:
    """Everything the model reads of a node: equal keys mean interchangeable nodes."""
    caps = tuple(red.caps.get((ps.name, name), 0) for ps in problem.gang.pod_sets)
    return node_key(problem, caps, name, memo)


def node_key(
    problem: Problem, caps: tuple[int, ...], name: str, memo: NodeMemo
) -> tuple[object, ...]:
    """`symmetry_key` of a node whose caps per pod set are `caps`."""
    node = problem.node(name)
    return _named(problem, name, node, _state_key(problem, node, caps, memo))


def _named(
    problem: Problem, name: str, node: Node, state: tuple[object, ...]
) -> tuple[object, ...]:
    """A node's symmetry key from its state's part (`_state_key`) and what its name and
    labels fix (its domains above the host, its class, its clique)."""
    return (problem.paths[name][:-1], problem.node_class[name], *state, node.clique)


def _state_key(
    problem: Problem, node: Node, caps: tuple[int, ...], memo: NodeMemo
) -> tuple[object, ...]:
    """The part of `node_key` that reads only the node's state (`node_state`), not its
    name or labels."""
    view = memo.view(node)
    aligned = tuple(
        memo.capacity(node, ps, NumaPolicy.SINGLE_NUMA_NODE) if node.numa_zones else -1
        for ps in problem.gang.pod_sets
    )
    zones = (
        tuple((z.gpu_indices, z.free_cpu_milli) for z in node.numa_zones)
        if problem.gang.numa_policy is NumaPolicy.SINGLE_NUMA_NODE
        and len(problem.gang.pod_sets) > 1
        else ()
    )
    return (
        node.gpu_memory_mib,
        caps,
        aligned,
        zones,
        node.free_cpu_milli if len(caps) > 1 else 0,
        node.free_memory_mib if len(caps) > 1 else 0,
        node.free_pods if len(caps) > 1 else 0,
        view.free_whole_gpus,
        view.free_gpu_milli,
        view.pristine and problem.is_island(node),
    )


# a lone pod set's room and the state part of its class key per node state
# (`lone_entries`): (room, `_state_key`, `_frag_key`), the keys empty without room
LoneStates = dict[tuple[object, ...], tuple[int, tuple[object, ...], tuple[object, ...]]]


def lone_entries(
    problem: Problem, names: Sequence[str], memo: NodeMemo, states: LoneStates | None = None
) -> list[tuple[str, int, tuple[object, ...] | None]]:
    """For a gang of one pod set and no siblings: each of `names` with room, its room
    (min(pod_capacity, count)) and its `lone_class_key` (None for a member of a pristine
    NVLink clique, which is kept whole rather than classed), in `names`' order. Worked
    out once per node state (a fleet has far fewer states than nodes); `states` keeps
    them for the next call of the same gang shape, config and levels."""
    assert lone_signature(problem) is not None and not problem.gang.siblings
    by_state: LoneStates = {} if states is None else states
    out: list[tuple[str, int, tuple[object, ...] | None]] = []
    for name in names:
        entry = lone_entry(problem, name, memo, by_state)
        if entry is not None:
            out.append((name, *entry))
    return out


def lone_entry(
    problem: Problem, name: str, memo: NodeMemo, states: LoneStates
) -> tuple[int, tuple[object, ...] | None] | None:
    """One node's `lone_entries` entry (room, key) or None without room, its state's part
    read from or kept in `states`."""
    node = problem.node(name)
    state = memo.state(node)
    shared = states.get(state)
    if shared is None:
        ps, policy = problem.gang.pod_sets[0], problem.gang.numa_policy
        cap = (room_for_one(node, ps, policy) if ps.count == 1
               else min(memo.capacity(node, ps, policy), ps.count))
        if cap > 0:
            shared = (cap, _state_key(problem, node, (cap,), memo),
                      _frag_key(problem, name, memo))
        else:
            shared = (cap, (), ())
        states[state] = shared
    cap, state_part, frag = shared
    if cap <= 0:
        return None
    if node.clique is not None and node.clique in problem.pristine_cliques:
        return cap, None
    return cap, (*_named(problem, name, node, state_part), *frag)


def holds(problem: Problem, caps: dict[tuple[str, str], int], members: list[str]) -> bool:
    """Whether `members` together have room for every pod set of the gang."""
    return all(
        sum(caps.get((ps.name, m), 0) for m in members) >= ps.count
        for ps in problem.gang.pod_sets
    )


def restrict(red: Reduction, kept: Sequence[str], note: str, exact: bool = False) -> Reduction:
    """`red` cut down to the `kept` nodes (exact only if both the cut and `red` are)."""
    keep = set(kept)
    caps = {k: v for k, v in red.caps.items() if k[1] in keep}
    twins = [[n for n in group if n in keep] for group in red.twins]
    return Reduction(
        list(kept),
        caps,
        exact and red.exact,
        [*red.notes, note],
        [g for g in twins if len(g) > 1],
    )
