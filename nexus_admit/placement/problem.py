"""A placement problem prepared once and shared by the engine, the baselines, the
validator and the quality metrics: resolved levels, hardware classes, and for every pod set
the nodes it may ever use (static filters) with the reason the others were ruled out."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import compress
from typing import cast

import numpy as np

from nexus_admit.model import (
    NVLINK_CLIQUE_LEVEL,
    ClusterSnapshot,
    Domain,
    Gang,
    Node,
    PlacementConfig,
    PodSet,
    domain_path,
    pod_capacity,
    with_clique_level,
)
from nexus_admit.placement.columns import (
    GpuColumns,
    IntArray,
    gpu_columns,
    level_codes,
    level_free,
    remember_positions,
)
from nexus_admit.placement.live_facts import live_domain_free, live_pristine_cliques
from nexus_admit.placement.node_kinds import (
    clique_codes,
    first_order_codes,
    label_codes,
    node_kinds,
)

__all__ = ["CLOSED_CLIQUE", "NodeClasses", "NodePaths", "Problem", "prepare"]

CLOSED_CLIQUE = "NVLink clique held by another ComputeDomain"  # a candidate filter's reason


Path = tuple[Domain | None, ...]


class NodePaths(dict[str, Path]):
    """Node name -> `domain_path(node, levels)`, each worked out the first time it is read:
    a one-pod decision reads the paths of the few nodes it costs (the fleet-wide steps read
    `columns.level_codes`). A name is in it when the snapshot has the node."""

    def __init__(self, nodes: dict[str, Node], levels: tuple[str, ...]) -> None:
        super().__init__()
        self._nodes = nodes
        self._levels = levels

    def __missing__(self, name: str) -> Path:
        path = self[name] = domain_path(self._nodes[name], self._levels)
        return path

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def get(self, name: str, default: Path | None = None) -> Path | None:  # type: ignore[override]
        return self[name] if name in self._nodes else default


class NodeClasses(dict[str, str | None]):
    """Node name -> its hardware class (None without GPUs), each matched the first time it
    is read, once per GPU product: a one-pod decision reads the classes of the few nodes it
    costs (the fleet-wide steps read one node per `node_kinds` kind). A name is in it when
    the snapshot has the node."""

    def __init__(self, nodes: dict[str, Node], config: PlacementConfig) -> None:
        super().__init__()
        self._nodes = nodes
        self._config = config
        self._of_product: dict[str, str | None] = {}

    def __missing__(self, name: str) -> str | None:
        node = self._nodes[name]
        found: str | None = None
        if node.gpu_free:  # its length never changes: whether it has GPUs is fixed
            product = node.gpu_product
            if product in self._of_product:
                found = self._of_product[product]
            else:
                found = self._of_product[product] = self._config.hardware_class(product)
        self[name] = found
        return found

    def __contains__(self, name: object) -> bool:
        return name in self._nodes

    def get(self, name: str, default: str | None = None) -> str | None:  # type: ignore[override]
        return self[name] if name in self._nodes else default


@dataclass(slots=True)
class Problem:
    snapshot: ClusterSnapshot
    gang: Gang
    config: PlacementConfig
    levels: tuple[str, ...]  # highest first, ends at hostname
    # node name -> domains per level (None where the node lacks the level label)
    paths: dict[str, tuple[Domain | None, ...]]
    node_class: dict[str, str | None]
    # pod set name -> names of nodes passing every static filter, in snapshot order
    candidates: dict[str, list[str]]
    # pod set name -> Counter of reasons nodes were filtered out
    rejections: dict[str, Counter[str]] = field(default_factory=dict)
    impossible: str = ""  # non-empty when no placement can ever exist
    # non-empty when a pod set fits no node now, though nodes of its shape exist: those
    # that could hold it are cordoned, tainted, NotReady, or not there yet (a wait)
    unavailable: str = ""
    # NVLink cliques all of whose nodes are pristine -> their node names
    pristine_cliques: dict[str, list[str]] = field(default_factory=dict)
    # (level index, pod set names): each group of pod sets inside one domain of its level
    # (Gang.required_domains; one entry naming every pod set for a gang that all follows)
    required_domains: list[tuple[int, frozenset[str]]] = field(default_factory=list)
    # level index -> free GPU share per domain (filled on first use; the snapshot is fixed)
    _domain_free: dict[int, dict[Domain, int]] = field(default_factory=dict, init=False, repr=False)
    # every node's free GPUs in snapshot order (read on first use, as `_domain_free`)
    _gpu: GpuColumns | None = field(default=None, init=False, repr=False)

    def level_index(self, level: str) -> int:
        return self.levels.index(level)

    def node(self, name: str) -> Node:
        return self.snapshot.nodes[name]

    def path_key(self, name: str) -> tuple[Domain, ...]:
        """The node's path as a sort key: a missing level sorts first instead of failing to
        compare with a domain (same order as the path itself wherever that compares)."""
        return tuple(() if d is None else d for d in self.paths[name])

    def pod_set(self, name: str) -> PodSet:
        for p in self.gang.pod_sets:
            if p.name == name:
                return p
        raise KeyError(name)

    def binds_whole_gang(self, level_index: int) -> bool:
        """Whether every pod set of the gang must share one domain of this level."""
        every = frozenset(p.name for p in self.gang.pod_sets)
        return any(li == level_index and names == every for li, names in self.required_domains)

    def partial_domains(self) -> list[tuple[int, frozenset[str]]]:
        """The required domains that bind only some of the gang's pod sets."""
        every = frozenset(p.name for p in self.gang.pod_sets)
        return [(li, names) for li, names in self.required_domains if names != every]

    def outside_gang_domain(self) -> list[PodSet]:
        """The pod sets the gang-wide required level does not bind (a GPU-less driver,
        a pod set with a level of its own); none without a gang-wide required level."""
        gang = self.gang
        if gang.required_level is None:
            return []
        return [p for p in gang.pod_sets if gang.level_of(p) != gang.required_level]

    def closed_note(self) -> str:
        """What a shortfall message adds when cliques other ComputeDomains hold kept nodes
        out ("" otherwise)."""
        held = max((why.get(CLOSED_CLIQUE) or 0 for why in self.rejections.values()), default=0)
        if not held:
            return ""
        return (f" ({held} nodes are in NVLink cliques other ComputeDomains hold: at most one "
                f"ComputeDomain per clique)")

    def class_cost(self, node_name: str) -> int:
        return self.config.class_cost(self.gang.tier, self.node_class[node_name])

    def is_island(self, node: Node) -> bool:
        return node.gpu_count >= self.config.island_min_gpus

    def domain_free_gpu_milli(self, level_index: int) -> dict[Domain, int]:
        """Free GPU share per domain of one level, over every node of the snapshot (nodes
        the gang cannot use still count: they are what the domain has left for others).
        Nodes without the level's label belong to no domain."""
        free = self._domain_free.get(level_index)
        if free is not None:
            return free
        # kept from the change log on a TrackedSnapshot, else counted over every node
        free = live_domain_free(self.snapshot, self.paths, self.levels, level_index)
        if free is None:
            codes = level_codes(self.snapshot, self.levels, level_index)
            free = defaultdict(int, level_free(self.snapshot, codes, self.free_gpu_column()))
        self._domain_free[level_index] = free
        return free

    def free_gpu_column(self) -> IntArray:
        """Every node's free GPU share, in snapshot order."""
        return self.gpu_columns().free

    def gpu_columns(self) -> GpuColumns:
        """Every node's free GPUs, in snapshot order (columns.gpu_columns)."""
        if self._gpu is None:
            self._gpu = gpu_columns(self.snapshot)
        return self._gpu

    def idle_room(self, level_index: int) -> dict[Domain, int]:
        """Per domain of one level, how many copies of the whole gang its candidate nodes
        could hold were they idle (each pod set counted alone, so an upper bound for gangs of
        several pod sets). Memoised per snapshot: it reads only static facts."""
        level = self.levels[level_index]
        room: dict[Domain, int] | None = None
        # the pod sets a gang-wide level would bind (a free GPU-less driver need not fit)
        bound = [p for p in self.gang.pod_sets if self.gang.follows_gang(p)]
        for ps in bound or self.gang.pod_sets:
            allowed = self.config.allowed_classes(self.gang.tier) if ps.gpus else None
            key = ("idle-room", self.levels, level,
                   _static_key(ps, self._label_level(ps), _allowed_key(self.config, allowed)),
                   self.gang.numa_policy, *_closed_key(self.gang, ps))
            per_domain = cast(dict[Domain, int] | None, self.snapshot.static_cache.get(key))
            if per_domain is None:
                pods: dict[Domain, int] = defaultdict(int)
                for name in self.candidates[ps.name]:
                    domain = self.paths[name][level_index]
                    if domain is not None:
                        pods[domain] += pod_capacity(
                            self.node(name).emptied(), ps, self.gang.numa_policy
                        )
                per_domain = dict(pods)
                self.snapshot.static_cache[key] = per_domain
            copies = {d: n // ps.count for d, n in per_domain.items()}
            if room is not None:
                copies = {d: min(n, copies.get(d, 0)) for d, n in room.items()}
            room = copies
        return room or {}

    def _label_level(self, ps: PodSet) -> str | None:
        """The level whose label this pod set's nodes must carry (its required level)."""
        level = self.gang.level_of(ps)
        return level if level in self.levels else None


def _check_level(level: str | None, levels: tuple[str, ...], what: str) -> str:
    if level is not None and level not in levels:
        return f"{what} level {level!r} is not a configured topology level {list(levels)}"
    return ""


def _check_pod_set_levels(gang: Gang, levels: tuple[str, ...]) -> str:
    for ps in gang.pod_sets:
        for level, what in ((ps.required_level, "required"), (ps.preferred_level, "preferred")):
            problem = _check_level(level, levels, f"pod set {ps.name!r} {what}-topology")
            if problem:
                return problem
    return ""


def _closed_key(gang: Gang, ps: PodSet) -> tuple[object, ...]:
    """What the cliques other ComputeDomains hold add to a memo key (nothing when unset)."""
    if ps.compute_domain is None or not gang.closed_cliques:
        return ()
    return (tuple(sorted(gang.closed_cliques)),)


def _outside_closed_cliques(
    problem: Problem, ps: PodSet, ok: list[str], why: Counter[str]
) -> tuple[list[str], Counter[str]]:
    """A ComputeDomain pod set's candidates without the nodes of cliques another
    ComputeDomain holds (at most one ComputeDomain per clique)."""
    closed = problem.gang.closed_cliques
    if ps.compute_domain is None or not closed:
        return ok, why
    kept = [n for n in ok if problem.node(n).clique not in closed]
    if len(kept) == len(ok):
        return ok, why
    why = Counter(why)
    why[CLOSED_CLIQUE] += len(ok) - len(kept)
    return kept, why


def _pristine_cliques(problem: Problem) -> dict[str, list[str]]:
    """NVLink clique -> its node names (snapshot order), for the cliques all of whose nodes
    are pristine (`ClusterSnapshot.pristine_cliques`), cliques in order of their first node:
    a clique is broken when one of its nodes is not pristine, counted on columns."""
    cliques = clique_codes(problem.snapshot)
    if not cliques.cliques:
        return {}
    codes = cliques.codes
    broken = np.bincount(codes[(codes >= 0) & ~problem.gpu_columns().pristine()],
                         minlength=len(cliques.cliques)).tolist()
    return {c: members for c, members, b
            in zip(cliques.cliques, cliques.members, broken, strict=True) if not b}


def _allowed_key(config: PlacementConfig, allowed: frozenset[str] | None) -> object:
    """What a tier's allowedClasses add to the eligibility key (nothing when unset)."""
    return None if allowed is None else (tuple(sorted(allowed)), config.hardware_classes)


def _static_key(
    ps: PodSet, required_level: str | None, allowed: object = None
) -> tuple[object, ...]:
    """Everything `PodSet.static_fit` reads, so eligibility can be memoised per snapshot."""
    key: tuple[object, ...] = (
        "eligible",
        ps.gpus,
        ps.vram_mib,
        ps.cpu_milli,
        ps.memory_mib,
        ps.tolerations,
        tuple(sorted(ps.node_selector.items())),
        ps.affinity_terms,
        ps.allowed_nodes,
        required_level,  # the label key: an index would mean another label under other levels
    )
    if ps.compute_domain is not None:  # the clique heads the levels, nodes need its label
        key = (*key, "one-clique")
    # the tier's allowedClasses (GPU pod sets only); unset leaves the key as it always was
    return key if allowed is None else (*key, allowed)


def prepare(snapshot: ClusterSnapshot, gang: Gang, config: PlacementConfig) -> Problem:
    """Resolve the config against the snapshot and filter nodes per pod set. Raises
    ValueError when the config cannot be resolved (e.g. an unknown Kueue Topology).

    Label-derived facts are memoised in `snapshot.static_cache`, so placing many gangs on
    one snapshot (simulator, `plan`) pays for them once."""
    levels = with_clique_level(
        config.resolve_levels(snapshot.kueue_topologies), gang.compute_domain is not None
    )
    cache = snapshot.static_cache
    facts_key = ("facts", levels, config.hardware_classes)
    facts = cache.get(facts_key)
    if facts is None:
        facts = (NodePaths(snapshot.nodes, levels), NodeClasses(snapshot.nodes, config))
        cache[facts_key] = facts
    paths, node_class = cast(
        tuple[dict[str, tuple[Domain | None, ...]], dict[str, str | None]], facts
    )
    problem = Problem(snapshot, gang, config, levels, paths, node_class, {})
    live = live_pristine_cliques(snapshot)  # kept from the change log, when it has one
    if live is not None:
        problem.pristine_cliques = live
    else:
        problem.pristine_cliques = _pristine_cliques(problem)
    problem.impossible = (
        _check_level(gang.required_level, levels, "required-topology")
        or _check_level(gang.preferred_level, levels, "preferred-topology")
        or _check_pod_set_levels(gang, levels)
    )
    for rule in gang.spread_rules:
        problem.impossible = problem.impossible or _check_level(rule.level, levels, "spread rule")
    problem.required_domains = [
        (levels.index(level), frozenset(names))
        for level, names in gang.required_domains()
        if level in levels
    ]
    if gang.tier not in config.tier_names():
        problem.impossible = problem.impossible or (
            f"tier {gang.tier!r} is not defined in the PlacementConfig {list(config.tier_names())}"
        )
    tier_classes = config.allowed_classes(gang.tier)
    for ps in gang.pod_sets:
        label_level = problem._label_level(ps)
        req_idx = levels.index(label_level) if label_level is not None else None
        allowed = tier_classes if ps.gpus else None
        key = _static_key(ps, label_level, _allowed_key(config, allowed))
        cached = cache.get(key)
        if cached is None:
            cached = _filter_nodes(snapshot, ps, paths, node_class, levels, req_idx, allowed)
            cache[key] = cached
        ok, why = cast(tuple[list[str], Counter[str]], cached)
        fits_statically = bool(ok)
        ok, why = _outside_closed_cliques(problem, ps, ok, why)
        problem.candidates[ps.name] = ok
        problem.rejections[ps.name] = why
        # cliques other ComputeDomains hold open again when those finish: a wait, not never
        if not fits_statically and not problem.impossible:
            if _some_node_holds(ps, snapshot):
                problem.unavailable = problem.unavailable or _not_now_message(ps, why)
            else:
                problem.impossible = _never_fits_message(ps, why, snapshot)
    return problem


def _filter_nodes(
    snapshot: ClusterSnapshot,
    ps: PodSet,
    paths: dict[str, tuple[Domain | None, ...]],
    node_class: dict[str, str | None],
    levels: tuple[str, ...],
    req_idx: int | None,
    allowed: frozenset[str] | None,
) -> tuple[list[str], Counter[str]]:
    """The nodes one pod of `ps` may use by what never changes while a node's labels,
    taints and shape stay (static_fit, the clique, the required level's label, the tier's
    classes), and how many were ruled out for which reason. Where the nodes are in
    snapshot order is kept for the list (`columns.remember_positions`)."""
    label_level = levels[req_idx] if req_idx is not None else None

    def rule_out(node: Node) -> str | None:
        reason = ps.static_fit(node)
        if reason is None and ps.compute_domain is not None and node.clique is None:
            reason = f"in no NVLink clique (no {NVLINK_CLIQUE_LEVEL} label)"
        if reason is None and req_idx is not None and paths[node.name][req_idx] is None:
            reason = f"no {label_level} label"
        if reason is None and allowed is not None and node_class[node.name] not in allowed:
            reason = "outside the tier's allowedClasses"
        return reason

    # without a node list it reads no name, and of the labels only those its selector
    # and affinity name: nodes alike in what it reads share the answer (a fleet has few
    # such kinds)
    if ps.allowed_nodes is None:
        return _filter_alike(snapshot, ps, levels, req_idx, rule_out)
    ok: list[str] = []
    why: Counter[str] = Counter()
    where: list[int] = []
    for i, node in enumerate(snapshot):
        reason = rule_out(node)
        if reason is None:
            ok.append(node.name)
            where.append(i)
        else:
            why[reason] += 1
    remember_positions(snapshot, ok, np.array(where, dtype=np.int64))
    return ok, why


def _filter_alike(
    snapshot: ClusterSnapshot,
    ps: PodSet,
    levels: tuple[str, ...],
    req_idx: int | None,
    rule_out: Callable[[Node], str | None],
) -> tuple[list[str], Counter[str]]:
    """`_filter_nodes` when the answer reads only a node's kind (`node_kinds`: its state,
    taints, shape and so class) and, when the pod set asks, whether it has a clique and the
    required level's label: each kind ruled on once, by its first node."""
    kinds = node_kinds(snapshot)
    kind, first = kinds.kind, kinds.first
    selected = _selected_labels(ps)
    if selected:  # kinds split by the values of the labels the pod set selects on
        values = label_codes(snapshot, selected)
        kind, first = first_order_codes(kind * (int(values.max(initial=0)) + 1) + values)
    flags = []
    if ps.compute_domain is not None:
        flags.append(clique_codes(snapshot).codes < 0)
    if req_idx is not None:
        flags.append(level_codes(snapshot, levels, req_idx).codes < 0)
    if flags:  # kinds split by the flags, numbered again in order of their first node
        for flag in flags:
            kind = kind * 2 + flag
        kind, first = first_order_codes(kind)
    names, nodes = kinds.names, snapshot.nodes
    reasons = [rule_out(nodes[names[f]]) for f in first.tolist()]
    passes = np.array([r is None for r in reasons], dtype=np.bool_)[kind]
    ok = list(compress(names, passes.tolist()))
    why: Counter[str] = Counter()
    # kinds in order of their first node: each reason counted in order of its first node
    for reason, count in zip(reasons, np.bincount(kind, minlength=len(first)).tolist(),
                             strict=True):
        if reason is not None:
            why[reason] += count
    remember_positions(snapshot, ok, np.flatnonzero(passes))
    return ok, why


def _selected_labels(ps: PodSet) -> tuple[str, ...]:
    """The labels `ps`'s node selector and affinity read (`PodSet.selects`), sorted."""
    keys = set(ps.node_selector)
    keys.update(req.key for term in ps.affinity_terms for req in term)
    return tuple(sorted(keys))


def _some_node_holds(ps: PodSet, snapshot: ClusterSnapshot) -> bool:
    """Has any node of the fleet, whatever its state, labels or taints, the shape one pod
    of `ps` needs? If not, the request is what is wrong (Rejected); if so, it waits."""
    key = ("shape", ps.gpus, ps.vram_mib, ps.cpu_milli, ps.memory_mib)
    held = snapshot.static_cache.get(key)
    if held is None:
        held = snapshot.static_cache[key] = any(ps.shape_fit(n) is None for n in snapshot)
    return bool(held)


def _not_now_message(ps: PodSet, why: Counter[str]) -> str:
    summary = ", ".join(f"{count} {reason}" for reason, count in why.most_common())
    return (
        f"pod set {ps.name!r} fits no node now ({summary or 'no nodes'}); it waits for a "
        f"node it may use to be uncordoned, untainted, Ready or added"
    )


def _never_fits_message(ps: PodSet, why: Counter[str], snapshot: ClusterSnapshot) -> str:
    if why.get("GPU VRAM too small") and ps.vram_mib:
        biggest = max((n.gpu_memory_mib for n in snapshot if n.gpu_count), default=0)
        return (
            f"pod set {ps.name!r} needs {ps.vram_mib / 1024:.0f} GiB VRAM per GPU but the largest "
            f"GPU in the cluster has {biggest / 1024:.0f} GiB; lower "
            f"scheduling.kubenexus.io/gpu-memory or use a flavor with bigger GPUs"
        )
    summary = ", ".join(f"{count} {reason}" for reason, count in why.most_common())
    return f"pod set {ps.name!r} fits no node in the cluster ({summary or 'no nodes'})"
